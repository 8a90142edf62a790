//! Batch optimisation: when several jobs want the same cheap free capacity, decide who gets it
//! jointly — a min-cost assignment — rather than first come, first served.
//!
//! Per round, every single-node job is evaluated against the capacity as it stands before
//! anyone takes any. A pool is *contended* when the GPUs of the jobs whose best candidate is
//! free capacity there exceed what it has free. Jobs with a deadline-meeting free-now candidate
//! in a contended pool then go into a min-cost flow, one size class (GPUs per job) at a time,
//! largest first: each job either takes a slot of a contended pool (at its cost there) or its
//! best other option (a pool not contended, waiting, or a launch). Deadlines are hard: a job's
//! option that misses its deadline costs [`MISS_PENALTY`] more, so the flow meets every
//! deadline it can before it saves a dollar. A job's options are every free-now candidate it
//! has and its best other one, found with a scan pruned for that alone; with one contended pool
//! the flow is a sort by saving.
//!
//! The result is a set of pins the per-job loop carries out with its usual checks, so nothing
//! here can break a hard constraint. Urgent services and jobs kept off nodes take no part: the
//! per-job loop places them, first (see `options`). Beyond [`MAX_QUEUE`] jobs, [`MAX_JOBS`] in a class or
//! [`MAX_ARCS`] arcs, the class (or the round) is left to the per-job loop: a size budget, not a
//! clock, so the plan stays deterministic.

use super::CandidateKind;
use super::estimate::JobCtx;
use super::greedy::Round;
use super::index::IdMap;
use crate::domain::{JobId, QueuedJob};
use crate::money::Money;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

/// Queues longer than this are planned per job.
pub(crate) const MAX_QUEUE: usize = 2_000;
/// Most jobs in one size class's flow.
pub(crate) const MAX_JOBS: usize = 1_000;
/// Most job-to-pool arcs in one size class's flow.
pub(crate) const MAX_ARCS: usize = 20_000;
/// What missing a deadline costs in the flow: more than any real difference in cost.
const MISS_PENALTY: i64 = 1 << 50;

/// What the joint assignment decided for one job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Pin {
    /// Take free capacity in this pool.
    Pool(usize),
    /// Leave the free capacity of these pools (sorted) to others.
    Elsewhere(Vec<usize>),
}

/// One job's options against the round's initial capacity.
struct Options {
    job: JobId,
    gpus: u32,
    /// Deadline-meeting free-now candidates: (pool, cost).
    free_now: Vec<(usize, Money)>,
    /// The best candidate overall, if free now: its pool.
    first_choice: Option<usize>,
    /// The best candidate other than those in `free_now` (its flow cost), if any.
    other: Option<i64>,
}

/// The joint assignment's pins for the round's queue (in queue order).
pub(crate) fn pins(round: &mut Round, queue: &[&QueuedJob]) -> IdMap<JobId, Pin> {
    let mut pins = IdMap::default();
    if queue.len() < 2 || queue.len() > MAX_QUEUE {
        return pins;
    }
    let free = free_gpus(round);
    // Per pool, the most GPUs a usable node has free: which pools can offer a job free capacity.
    let most_free: Vec<(usize, u32)> = free
        .iter()
        .enumerate()
        .filter_map(|(p, nodes)| nodes.iter().map(|&(_, f)| f).max().map(|m| (p, m)))
        .filter(|&(_, m)| m > 0)
        .collect();
    let options: Vec<Options> = queue
        .iter()
        .filter(|j| j.spec.resources.nodes <= 1)
        .map(|j| options(round, j, &most_free))
        .collect();
    let mut demand = vec![0u64; round.index.pools.len()];
    for o in &options {
        if let Some(p) = o.first_choice {
            demand[p] += u64::from(o.gpus);
        }
    }
    let contended: Vec<bool> = (0..demand.len())
        .map(|p| demand[p] > free[p].iter().map(|&(_, f)| u64::from(f)).sum())
        .collect();
    if !contended.iter().any(|&c| c) {
        return pins;
    }
    let mut node_free: HashMap<usize, u32> = free.iter().flatten().copied().collect();
    let mut classes: Vec<u32> = options.iter().map(|o| o.gpus).collect();
    classes.sort_unstable_by(|a, b| b.cmp(a));
    classes.dedup();
    for g in classes {
        // Free capacity in pools nobody contends is part of a job's way out.
        let jobs: Vec<Options> = options
            .iter()
            .filter(|o| o.gpus == g && o.free_now.iter().any(|&(p, _)| contended[p]))
            .map(|o| {
                let uncontended = o.free_now.iter().filter(|&&(p, _)| !contended[p]);
                let best = uncontended.map(|&(_, c)| flow_cost(c, false)).min();
                Options {
                    job: o.job,
                    gpus: o.gpus,
                    free_now: o
                        .free_now
                        .iter()
                        .copied()
                        .filter(|&(p, _)| contended[p])
                        .collect(),
                    first_choice: o.first_choice,
                    other: match (o.other, best) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    },
                }
            })
            .collect();
        let jobs: Vec<&Options> = jobs.iter().collect();
        let arcs: usize = jobs.iter().map(|o| o.free_now.len()).sum();
        if jobs.len() < 2 || jobs.len() > MAX_JOBS || arcs > MAX_ARCS {
            continue;
        }
        let pools: Vec<usize> = (0..contended.len()).filter(|&p| contended[p]).collect();
        let slots: Vec<i64> = pools
            .iter()
            .map(|&p| {
                free[p]
                    .iter()
                    .map(|(n, _)| i64::from(node_free[n] / g.max(1)))
                    .sum::<i64>()
                    .min(if g == 0 { i64::MAX / 4 } else { i64::MAX })
            })
            .collect();
        let chosen = solve(&jobs, &pools, &slots);
        for (o, choice) in jobs.iter().zip(chosen) {
            let pin = match choice {
                Some(i) => {
                    let pool = pools[i];
                    // Best fit, as the per-job loop will do.
                    if let Some(&(n, _)) = free[pool]
                        .iter()
                        .filter(|(n, _)| node_free[n] >= g)
                        .min_by_key(|(n, _)| (node_free[n], *n))
                        && let Some(f) = node_free.get_mut(&n)
                    {
                        *f -= g;
                    }
                    Pin::Pool(pool)
                }
                None => Pin::Elsewhere(
                    o.free_now
                        .iter()
                        .map(|&(p, _)| p)
                        .filter(|&p| contended[p])
                        .collect(),
                ),
            };
            pins.insert(o.job, pin);
        }
    }
    pins
}

fn options(round: &mut Round, job: &QueuedJob, most_free: &[(usize, u32)]) -> Options {
    let mut ctx = JobCtx::new(&round.index, &job.spec, job.deadline_runtime_s);
    ctx.avoid = round.index.avoided(job.id);
    if ctx.preempts_before_bursting() || !ctx.avoid.is_empty() {
        // An urgent service (it goes first in the queue and takes GPUs back from batch work)
        // or a job kept off nodes is left to the per-job loop: a flow that weighs cost alone
        // could send it to a new node so that batch work keeps the GPUs it would take.
        return Options {
            job: job.id,
            gpus: ctx.gpus,
            free_now: Vec::new(),
            first_choice: None,
            other: None,
        };
    }
    let pools: Vec<usize> = most_free
        .iter()
        .filter(|&&(_, m)| m >= ctx.gpus)
        .map(|&(p, _)| p)
        .collect();
    // Without a free-now candidate the job has no first choice on free capacity and enters
    // no flow, so its way out is never asked for.
    let (free, other) = round.batch_candidates(&ctx, &pools);
    let best_free = free.iter().min_by_key(|e| e.score);
    let best = match (best_free, other.as_ref()) {
        (Some(a), Some(b)) => Some(if a.score < b.score { a } else { b }),
        (a, b) => a.or(b),
    };
    let first_choice = best
        .filter(|e| e.score.kind == CandidateKind::FreeNow)
        .map(|e| e.score.pool);
    let mut free_now: Vec<(usize, Money)> = free
        .iter()
        .filter(|e| !e.score.misses_deadline)
        .map(|e| (e.score.pool, e.score.cost))
        .collect();
    free_now.sort_unstable();
    Options {
        job: job.id,
        gpus: ctx.gpus,
        free_now,
        first_choice,
        other: other.map(|e| flow_cost(e.score.cost, e.score.misses_deadline)),
    }
}

fn flow_cost(cost: Money, misses_deadline: bool) -> i64 {
    let penalty = if misses_deadline { MISS_PENALTY } else { 0 };
    cost.micros().clamp(0, MISS_PENALTY - 1) + penalty
}

/// Per pool, its usable nodes with the GPUs they have free at the start of the round.
fn free_gpus(round: &Round) -> Vec<Vec<(usize, u32)>> {
    let index = &round.index;
    index
        .pools
        .iter()
        .map(|info| {
            info.nodes
                .iter()
                .filter(|&&n| index.usable(n))
                .map(|&n| (n, index.nodes[n].gpus_free()))
                .collect()
        })
        .collect()
}

/// Min-cost assignment of `jobs` to `pools` (at most `slots[i]` jobs each) or to their way
/// out; a job with neither is left out (`None` too). Successive shortest paths with
/// potentials: exact, integral, and deterministic (ties by vertex number).
fn solve(jobs: &[&Options], pools: &[usize], slots: &[i64]) -> Vec<Option<usize>> {
    if let ([pool], [slots]) = (pools, slots) {
        return solve_one(jobs, *pool, *slots);
    }
    let pool_pos: HashMap<usize, usize> = pools.iter().enumerate().map(|(i, &p)| (p, i)).collect();
    let (n_jobs, n_pools) = (jobs.len(), pools.len());
    let src = 0;
    let out = 1 + n_jobs + n_pools;
    let sink = out + 1;
    let mut g = Graph::new(sink + 1);
    let mut job_arcs = Vec::with_capacity(n_jobs);
    for (j, o) in jobs.iter().enumerate() {
        g.add(src, 1 + j, 1, 0);
        let mut arcs = Vec::new();
        for &(p, cost) in &o.free_now {
            if let Some(&i) = pool_pos.get(&p) {
                arcs.push((
                    g.add(1 + j, 1 + n_jobs + i, 1, flow_cost(cost, false)),
                    Some(i),
                ));
            }
        }
        if let Some(cost) = o.other {
            arcs.push((g.add(1 + j, out, 1, cost), None));
        }
        job_arcs.push(arcs);
    }
    for (i, &s) in slots.iter().enumerate() {
        g.add(1 + n_jobs + i, sink, s, 0);
    }
    g.add(out, sink, i64::try_from(n_jobs).unwrap_or(i64::MAX), 0);
    g.min_cost_flow(src, sink);
    job_arcs
        .iter()
        .map(|arcs| {
            arcs.iter()
                .find(|(e, _)| g.cap[*e] == 0)
                .and_then(|&(_, pool)| pool)
        })
        .collect()
}

/// [`solve`] for one contended pool, in `O(n log n)`: the flow is greatest when the jobs with
/// no way out take slots first (the cheapest of them if slots are short), and cheapest when
/// the slots left go to the jobs that save most by them (saving nothing still takes a slot
/// left over: it starts sooner). Ties by position, so the result is
/// deterministic.
fn solve_one(jobs: &[&Options], pool: usize, slots: i64) -> Vec<Option<usize>> {
    let mut out = vec![None; jobs.len()];
    let mut left = usize::try_from(slots.max(0)).unwrap_or(usize::MAX);
    let cost = |o: &Options| {
        o.free_now
            .iter()
            .find(|&&(p, _)| p == pool)
            .map(|&(_, c)| flow_cost(c, false))
    };
    let mut stuck: Vec<(i64, usize)> = Vec::new();
    let mut saving: Vec<(i64, usize)> = Vec::new();
    for (i, o) in jobs.iter().enumerate() {
        let Some(c) = cost(o) else { continue };
        match o.other {
            None => stuck.push((c, i)),
            Some(other) if other >= c => saving.push((c - other, i)),
            Some(_) => {}
        }
    }
    stuck.sort_unstable();
    saving.sort_unstable();
    for &(_, i) in stuck.iter().chain(&saving) {
        if left == 0 {
            break;
        }
        out[i] = Some(0);
        left -= 1;
    }
    out
}

/// A residual graph for min-cost flow: arcs in pairs (forward, backward).
struct Graph {
    head: Vec<Vec<usize>>,
    to: Vec<usize>,
    cap: Vec<i64>,
    cost: Vec<i64>,
}

impl Graph {
    fn new(n: usize) -> Graph {
        Graph {
            head: vec![Vec::new(); n],
            to: Vec::new(),
            cap: Vec::new(),
            cost: Vec::new(),
        }
    }

    /// Adds an arc and returns its number.
    fn add(&mut self, from: usize, to: usize, cap: i64, cost: i64) -> usize {
        let e = self.to.len();
        self.head[from].push(e);
        self.to.push(to);
        self.cap.push(cap);
        self.cost.push(cost);
        self.head[to].push(e + 1);
        self.to.push(from);
        self.cap.push(0);
        self.cost.push(-cost);
        e
    }

    fn from(&self, e: usize) -> usize {
        self.to[e ^ 1]
    }

    /// Pushes as much flow as possible from `s` to `t` at the least cost. Costs start
    /// non-negative, so Dijkstra with potentials finds each shortest path.
    fn min_cost_flow(&mut self, s: usize, t: usize) {
        let n = self.head.len();
        let mut potential = vec![0i64; n];
        loop {
            let mut dist = vec![i64::MAX; n];
            let mut via = vec![usize::MAX; n];
            dist[s] = 0;
            let mut heap = BinaryHeap::new();
            heap.push(Reverse((0i64, s)));
            while let Some(Reverse((d, v))) = heap.pop() {
                if d > dist[v] {
                    continue;
                }
                for &e in &self.head[v] {
                    if self.cap[e] <= 0 {
                        continue;
                    }
                    let w = self.to[e];
                    let nd = d + self.cost[e] + potential[v] - potential[w];
                    if nd < dist[w] {
                        dist[w] = nd;
                        via[w] = e;
                        heap.push(Reverse((nd, w)));
                    }
                }
            }
            if dist[t] == i64::MAX {
                return;
            }
            for v in 0..n {
                if dist[v] < i64::MAX {
                    potential[v] += dist[v];
                }
            }
            let mut push = i64::MAX;
            let mut v = t;
            while v != s {
                let e = via[v];
                push = push.min(self.cap[e]);
                v = self.from(e);
            }
            let mut v = t;
            while v != s {
                let e = via[v];
                self.cap[e] -= push;
                self.cap[e ^ 1] += push;
                v = self.from(e);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opt(free_now: &[(usize, i64)], other: Option<i64>) -> Options {
        Options {
            job: JobId(uuid::Uuid::nil()),
            gpus: 1,
            free_now: free_now.iter().map(|&(p, c)| (p, Money(c))).collect(),
            first_choice: None,
            other,
        }
    }

    #[test]
    fn the_flow_gives_scarce_slots_to_whom_they_save_most() {
        // One slot in pool 7. Job a saves 1 there (2 vs 3); job b saves 8 (2 vs 10).
        let (a, b) = (opt(&[(7, 2)], Some(3)), opt(&[(7, 2)], Some(10)));
        assert_eq!(solve(&[&a, &b], &[7], &[1]), vec![None, Some(0)]);
        // Two slots: both take one.
        assert_eq!(solve(&[&a, &b], &[7], &[2]), vec![Some(0), Some(0)]);
        // A way out that misses the deadline weighs more than any saving.
        let late = opt(&[(7, 2)], Some(flow_cost(Money(1), true)));
        assert_eq!(solve(&[&b, &late], &[7], &[1]), vec![None, Some(0)]);
        // Chains: c can use either pool, d only pool 1; one slot each.
        let c = opt(&[(0, 5), (1, 4)], Some(100));
        let d = opt(&[(1, 4)], Some(100));
        assert_eq!(solve(&[&c, &d], &[0, 1], &[1, 1]), vec![Some(0), Some(1)]);
        // No option at all: left out.
        assert_eq!(solve(&[&opt(&[], None)], &[0], &[1]), vec![None]);
    }

    #[test]
    fn one_pool_is_solved_as_the_flow_would() {
        // Costs of the assignment, as the flow counts them (a job left out costs nothing).
        let total = |jobs: &[&Options], chosen: &[Option<usize>]| -> (usize, i64) {
            let mut flow = 0;
            let mut cost = 0;
            for (o, c) in jobs.iter().zip(chosen) {
                match (c, o.other) {
                    (Some(_), _) => {
                        flow += 1;
                        cost += o.free_now[0].1.micros();
                    }
                    (None, Some(other)) => {
                        flow += 1;
                        cost += other;
                    }
                    (None, None) => {}
                }
            }
            (flow, cost)
        };
        let mut seed = 7u64;
        for case in 0..300 {
            let n = 1 + case % 9;
            let jobs: Vec<Options> = (0..n)
                .map(|_| {
                    seed = seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let c = (seed >> 33) as i64 % 50;
                    let other = match (seed >> 20) % 4 {
                        0 => None,
                        _ => Some((seed >> 40) as i64 % 80),
                    };
                    opt(&[(3, c)], other)
                })
                .collect();
            let refs: Vec<&Options> = jobs.iter().collect();
            let slots = (case % 5) as i64;
            let fast = solve_one(&refs, 3, slots);
            let general = {
                let pool_pos = [3usize];
                let (n_jobs, src) = (refs.len(), 0);
                let out = 1 + n_jobs + 1;
                let mut g = Graph::new(out + 2);
                let mut arcs = Vec::new();
                for (j, o) in refs.iter().enumerate() {
                    g.add(src, 1 + j, 1, 0);
                    let a = g.add(1 + j, 1 + n_jobs, 1, flow_cost(o.free_now[0].1, false));
                    if let Some(c) = o.other {
                        g.add(1 + j, out, 1, c);
                    }
                    arcs.push(a);
                }
                g.add(1 + n_jobs, out + 1, slots, 0);
                g.add(out, out + 1, n_jobs as i64, 0);
                g.min_cost_flow(src, out + 1);
                let _ = pool_pos;
                arcs.iter()
                    .map(|&a| (g.cap[a] == 0).then_some(0))
                    .collect::<Vec<_>>()
            };
            assert_eq!(total(&refs, &fast), total(&refs, &general), "case {case}");
            assert!(fast.iter().flatten().count() as i64 <= slots);
        }
    }
}

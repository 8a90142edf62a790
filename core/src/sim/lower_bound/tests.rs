//! The bound checked against exact solvers on small random instances (issue 29).
//!
//! - **The greedy against the LP solved another way.** Over unit time slots the LP is a
//!   transportation problem: each job's GPU-seconds go to the seconds of its window, at most `C`
//!   GPUs a second. [`Net`] solves it exactly, in integers, by successive shortest paths (no
//!   polymatroid, no Hall's theorem, no buckets). With bucket edges at every window end the
//!   greedy must find the same saving; with coarse buckets it must find the flow's saving on the
//!   windows widened to the bucket edges, which is never less than on the true windows.
//! - **The bound against the true optimum.** The cheapest integral, non-preemptive schedule
//!   that meets every deadline, in the simulator's money (the company's cash: on-prem at its
//!   marginal cost, the cloud at its price, egress), with on-prem GPUs pooled, the cloud unlimited at its per-GPU
//!   share and no boot time or billing minimum: each is a relaxation of the real problem, so
//!   this optimum is at most the real one's, and a bound above it would be no bound. It is found
//!   by trying every set of jobs to run on-prem and searching their start hours. Whole-hour
//!   starts lose nothing when releases, deadlines and runtimes are whole hours: flooring every
//!   start of a feasible schedule keeps each inside its window and never makes two disjoint runs
//!   overlap, so the jobs running at any instant afterwards ran pairwise together before, hence
//!   (intervals being Helly) all at one instant, within capacity. A job without a deadline can
//!   always run on-prem after everything else, so it costs the cheaper of its two prices there.
//! - **The bound against the simulator.** Every scheduler's run that meets every deadline costs
//!   at least the bound (and at least the exact optimum above).

use super::*;
use crate::domain::*;
use crate::sim::rng::SplitMix64;
use crate::sim::{self, Cheapest, FifoBurst, Scheduler, SimConfig, SimPool, Switchyard};
use crate::time::Timestamp;
use std::collections::BTreeMap;

/// A min-cost flow network over integers (residual edges in pairs: `e ^ 1` is `e`'s reverse).
struct Net {
    out: Vec<Vec<usize>>,
    to: Vec<usize>,
    cap: Vec<i64>,
    cost: Vec<i64>,
}

impl Net {
    fn new(nodes: usize) -> Net {
        Net {
            out: vec![Vec::new(); nodes],
            to: Vec::new(),
            cap: Vec::new(),
            cost: Vec::new(),
        }
    }

    fn edge(&mut self, u: usize, v: usize, cap: i64, cost: i64) {
        for (a, b, c, k) in [(u, v, cap, cost), (v, u, 0, -cost)] {
            self.out[a].push(self.to.len());
            self.to.push(b);
            self.cap.push(c);
            self.cost.push(k);
        }
    }

    /// The least cost of any flow from `s` to `t`: augments along a cheapest path (Bellman-Ford;
    /// the residual graph never has a negative cycle) while that path costs less than nothing.
    fn min_cost(&mut self, s: usize, t: usize) -> i64 {
        let n = self.out.len();
        let mut total = 0;
        loop {
            let mut dist = vec![i64::MAX; n];
            let mut via = vec![usize::MAX; n];
            dist[s] = 0;
            for _ in 0..n {
                let mut changed = false;
                for u in 0..n {
                    if dist[u] == i64::MAX {
                        continue;
                    }
                    for &e in &self.out[u] {
                        let v = self.to[e];
                        if self.cap[e] > 0 && dist[u] + self.cost[e] < dist[v] {
                            dist[v] = dist[u] + self.cost[e];
                            via[v] = e;
                            changed = true;
                        }
                    }
                }
                if !changed {
                    break;
                }
            }
            if dist[t] >= 0 {
                return total;
            }
            let mut f = i64::MAX;
            let mut v = t;
            while v != s {
                f = f.min(self.cap[via[v]]);
                v = self.to[via[v] ^ 1];
            }
            let mut v = t;
            while v != s {
                self.cap[via[v]] -= f;
                self.cap[via[v] ^ 1] += f;
                v = self.to[via[v] ^ 1];
            }
            total += f * dist[t];
        }
    }
}

/// A contested job for the greedy alone: saving per GPU-second, window in whole seconds, demand
/// in GPU-seconds.
#[derive(Clone, Copy, Debug)]
struct Unit {
    w: i64,
    start: i64,
    end: i64,
    demand: i64,
}

/// The time-indexed LP's best saving, exactly: source → job (its demand, −saving per unit) →
/// each second of its window → sink (`gpus` a second).
fn exact_saving(jobs: &[Unit], gpus: i64) -> i64 {
    let horizon = jobs.iter().map(|j| j.end).max().unwrap_or(0).max(0) as usize;
    let (s, t) = (0, 1);
    let slot = |k: usize| 2 + jobs.len() + k;
    let mut net = Net::new(2 + jobs.len() + horizon);
    for (i, j) in jobs.iter().enumerate() {
        net.edge(s, 2 + i, j.demand, -j.w);
        for k in j.start.max(0) as usize..j.end.max(0) as usize {
            net.edge(2 + i, slot(k), j.demand, 0);
        }
    }
    for k in 0..horizon {
        net.edge(slot(k), t, gpus, 0);
    }
    -net.min_cost(s, t)
}

fn greedy(jobs: &[Unit], gpus: i64, buckets: usize) -> f64 {
    greedy_saving(&mut as_tuples(jobs), gpus as f64, buckets)
}

fn as_tuples(jobs: &[Unit]) -> Vec<(f64, usize, i64, i64, f64, f64)> {
    jobs.iter()
        .enumerate()
        .map(|(i, j)| {
            let (w, d) = (j.w as f64, j.demand as f64);
            (w, i, j.start * 1000, j.end * 1000, d, w * d)
        })
        .collect()
}

/// Up to 8 jobs in 24 seconds on 1 to 3 GPUs; demands up to 3 GPUs through the window, so
/// some ask for more than the whole window holds; savings 1 to 9 per GPU-second, ties included.
fn random_units(rng: &mut SplitMix64) -> (Vec<Unit>, i64) {
    let n = 1 + (rng.next_u64() % 8) as usize;
    let gpus = 1 + (rng.next_u64() % 3) as i64;
    let jobs = (0..n)
        .map(|_| {
            let start = (rng.next_u64() % 20) as i64;
            let end = start + 1 + (rng.next_u64() % (24 - start as u64)) as i64;
            Unit {
                w: 1 + (rng.next_u64() % 9) as i64,
                start,
                end,
                demand: 1 + (rng.next_u64() % (3 * (end - start) as u64)) as i64,
            }
        })
        .collect();
    (jobs, gpus)
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-6 * a.abs().max(b.abs()).max(1.0)
}

#[test]
fn the_greedy_solves_the_time_indexed_lp_exactly() {
    let mut rng = SplitMix64::new(29);
    for case in 0..600 {
        let (jobs, gpus) = random_units(&mut rng);
        let exact = exact_saving(&jobs, gpus) as f64;
        // 256 buckets put an edge at every one of at most 16 window ends.
        let fine = greedy(&jobs, gpus, DEFAULT_BUCKETS);
        assert!(
            close(fine, exact),
            "case {case}: greedy {fine} != LP {exact} on {gpus} GPUs: {jobs:?}"
        );
        for buckets in [1, 2, 3, 5] {
            // Coarse buckets widen the windows to bucket edges: the greedy then solves the
            // widened LP exactly, and saves at least as much as the true one allows.
            let coarse = greedy(&jobs, gpus, buckets);
            let edges = bucket_edges(&as_tuples(&jobs), buckets);
            let widened: Vec<Unit> = jobs
                .iter()
                .map(|j| Unit {
                    start: edges[edges.partition_point(|&t| t <= j.start * 1000) - 1] / 1000,
                    end: edges[edges.partition_point(|&t| t < j.end * 1000)] / 1000,
                    ..*j
                })
                .collect();
            let exact_widened = exact_saving(&widened, gpus) as f64;
            assert!(
                close(coarse, exact_widened),
                "case {case}, {buckets} buckets: greedy {coarse} != widened LP {exact_widened}"
            );
            assert!(coarse >= exact - 1e-6, "case {case}: {coarse} < {exact}");
        }
    }
}

#[test]
fn the_flow_solver_agrees_with_hand_solved_cases() {
    // One GPU for 10 s. A (4/s, 6 GPU-s in [0, 6)) and B (3/s, 8 GPU-s in [0, 10)): A takes
    // its 6, B the 4 left: 36.
    let a = Unit {
        w: 4,
        start: 0,
        end: 6,
        demand: 6,
    };
    let b = Unit {
        w: 3,
        start: 0,
        end: 10,
        demand: 8,
    };
    assert_eq!(exact_saving(&[a, b], 1), 36);
    // Two GPUs: both fit whole.
    assert_eq!(exact_saving(&[a, b], 2), 48);
    // B alone in a window of 3 s on one GPU: 3 GPU-s of it.
    assert_eq!(exact_saving(&[Unit { end: 3, ..b }], 1), 9);
}

// --- Worlds, for the bound as a whole ----------------------------------------------------

const HOUR: i64 = 3600;
const USD: i64 = 1_000_000;

fn region(id: &str, egress_per_gb: i64) -> Region {
    let (provider, code) = id.split_once(':').unwrap_or((id, id));
    Region {
        id: RegionId::new(id),
        provider: provider.into(),
        code: code.into(),
        latitude: None,
        longitude: None,
        egress_per_gb: Money(egress_per_gb),
        latency_ms: 10,
        ingress_gbps: 10,
    }
}

/// A pool of nodes of `gpus` GPUs at `share` micro-dollars per GPU-hour (spot at `spot`);
/// on-prem, its marginal cost is its rate.
fn pool(region: &str, gpus: u32, share: i64, spot: Option<i64>, nodes: u32) -> SimPool {
    pool_with_marginal(region, gpus, share, share, spot, nodes)
}

/// [`pool`], on-prem with a marginal (cash) cost of `marginal` per GPU-hour.
fn pool_with_marginal(
    region: &str,
    gpus: u32,
    share: i64,
    marginal: i64,
    spot: Option<i64>,
    nodes: u32,
) -> SimPool {
    let cloud = !region.starts_with("onprem");
    SimPool {
        pool: Pool {
            id: PoolId::new(format!("{region}/g{gpus}")),
            region: RegionId::new(region),
            provider: region.split(':').next().unwrap_or_default().into(),
            instance_type: format!("g{gpus}"),
            gpu_model: "V100".into(),
            gpus_per_node: gpus,
            gpu_memory_gb: 16,
            vcpus: 0,
            memory_gb: 0,
            on_demand_per_hour: Money(share * i64::from(gpus)),
            spot_per_hour: spot.map(|s| Money(s * i64::from(gpus))),
            node_limit: if cloud { 10 } else { nodes },
            launchable: cloud,
            boot_time_s: if cloud { 60 } else { 0 },
            price_updated_at: Timestamp(0),
            recent_capacity_failures: 0,
            marginal_per_hour: (!cloud).then(|| Money(marginal * i64::from(gpus))),
        },
        fixed_nodes: if cloud { 0 } else { nodes },
        interruptions_per_hour: 0.0,
    }
}

fn job(submit_h: i64, runtime_h: i64, gpus: u32, nodes: u32, deadline_h: Option<i64>) -> SimJob {
    SimJob {
        submit: Timestamp::from_secs(submit_h * HOUR),
        runtime_s: runtime_h * HOUR,
        estimate_s: None,
        spec: JobSpec {
            expected_gpu_utilization_pct: None,
            name: "j".into(),
            team: "t".into(),
            project: None,
            command: vec!["true".into()],
            env: BTreeMap::new(),
            resources: Resources {
                gpus,
                gpu_models: vec![],
                accelerator: None,
                min_gpu_memory_gb: 0,
                cpus: 0,
                memory_gb: 0,
                nodes,
            },
            estimated_runtime_s: Some(runtime_h * HOUR),
            deadline: deadline_h.map(|d| Timestamp::from_secs(d * HOUR)),
            priority: Priority::Normal,
            spot: SpotRule::Never,
            max_price_per_hour: None,
            regions: vec![],
            data: None,
            kind: JobKind::Batch,
            max_latency_ms: None,
            callers: Vec::new(),
        },
        measured: true,
    }
}

/// A small random world and trace, in whole hours: on-prem V100s, 1 to 3 GPUs (nodes of 1 or
/// 2; a marginal cost of a fifth to all of its rate), sometimes a node of 2 A100s elsewhere, a 4-V100 cloud pool on demand, an 8-A100 one with an optional spot market; up to
/// `max_jobs` jobs of 1 or 2 GPUs (a few of them gangs of 2 nodes), 1 to 3 hours long,
/// deadlines 0 to 4 hours past the earliest finish (or none), some allowing spot, some with
/// data on-prem that other regions pay egress for, some asking for A100s or limited to two
/// regions (so that some fit on-prem only, or nowhere).
fn random_instance(rng: &mut SplitMix64, max_jobs: u64) -> (World, Vec<SimJob>) {
    let mut pick = |n: u64| rng.next_u64() % n;
    let (per_node, nodes) = [(1, 1), (1, 2), (1, 3), (2, 1)][pick(4) as usize];
    let rate = (1 + pick(3) as i64) * USD;
    let marginal = rate * (1 + pick(5) as i64) / 5;
    let a = (2 + pick(5) as i64) * USD;
    let b = (2 + pick(5) as i64) * USD;
    let spot = (pick(2) == 0).then(|| (1 + pick((b / USD) as u64) as i64) * USD);
    let egress = (pick(3) as i64) * 50_000;
    let mut a100 = pool("gcp:r2", 8, b, spot, 10);
    a100.pool.gpu_model = "A100".into();
    let mut world = World {
        regions: vec![
            region("onprem:a", egress),
            region("onprem:b", 0),
            region("aws:r1", 90_000),
            region("gcp:r2", 90_000),
        ],
        pools: vec![
            pool_with_marginal("onprem:a", per_node, rate, marginal, None, nodes),
            pool("aws:r1", 4, a, None, 10),
            a100,
        ],
    };
    if pick(2) == 0 {
        let rate = (1 + pick(3) as i64) * USD;
        let mut b = pool_with_marginal(
            "onprem:b",
            2,
            rate,
            rate * (1 + pick(5) as i64) / 5,
            None,
            1,
        );
        b.pool.gpu_model = "A100".into();
        world.pools.push(b);
    }
    let n = 1 + pick(max_jobs);
    let jobs = (0..n)
        .map(|_| {
            let submit = pick(8) as i64;
            let runtime = 1 + pick(3) as i64;
            let deadline = (pick(7) != 0).then(|| submit + runtime + pick(5) as i64);
            let gang = if pick(7) == 0 { 2 } else { 1 };
            let mut j = job(submit, runtime, 1 + pick(2) as u32, gang, deadline);
            if pick(2) == 0 {
                j.spec.spot = SpotRule::Allowed;
            }
            if pick(3) == 0 {
                j.spec.data = Some(DataLocation {
                    region: RegionId::new("onprem:a"),
                    size_gb: 1 + pick(40) as u32,
                });
            }
            if pick(4) == 0 {
                j.spec.resources.gpu_models = vec!["A100".into()];
            }
            if pick(6) == 0 {
                j.spec.regions = vec![RegionId::new("onprem:a"), RegionId::new("aws:r1")];
            }
            j
        })
        .collect();
    (world, jobs)
}

/// A job's cheapest price on-prem (`None` where it does not fit a node) and in the cloud, in
/// micro-dollars of the company's cash, priced by hand from the world's rules: the exact per-GPU
/// share of an on-prem node's marginal cost or of a cloud node's price (spot where the job
/// allows it and it is cheaper), plus egress out of the data's region.
fn prices(world: &World, j: &SimJob) -> (Option<f64>, f64) {
    let r = &j.spec.resources;
    let gpu_hours = f64::from(r.gpus * r.nodes.max(1)) * j.runtime_s as f64 / HOUR as f64;
    let price = |p: &SimPool| {
        let node = match (p.pool.launchable, j.spec.spot, p.pool.spot_per_hour) {
            // Every world here states the marginal cost.
            (false, _, _) => p
                .pool
                .marginal_per_hour
                .unwrap_or(p.pool.on_demand_per_hour),
            (true, SpotRule::Allowed | SpotRule::Preferred, Some(s)) => {
                s.min(p.pool.on_demand_per_hour)
            }
            (true, _, _) => p.pool.on_demand_per_hour,
        };
        let egress = match &j.spec.data {
            Some(d) if d.region != p.pool.region => world
                .regions
                .iter()
                .find(|g| g.id == d.region)
                .map_or(0, |g| g.egress_per_gb.micros() * i64::from(d.size_gb)),
            _ => 0,
        };
        node.micros() as f64 / f64::from(p.pool.gpus_per_node) * gpu_hours + egress as f64
    };
    let fits = |p: &&SimPool| crate::placement::hard_constraint(&p.pool, &j.spec).is_none();
    let cheapest = |cloud: bool| {
        world
            .pools
            .iter()
            .filter(|p| p.pool.launchable == cloud)
            .filter(fits)
            .map(price)
            .min_by(f64::total_cmp)
    };
    (cheapest(false), cheapest(true).unwrap_or(NOWHERE))
}

/// The price of a job with no place to go: more than any instance costs, so an optimum this high
/// means no schedule meets every deadline.
const NOWHERE: f64 = 1e15;

/// The exact optimum of the relaxed integral problem (module docs), in micro-dollars; on-prem
/// capacity pooled over every on-prem pool, as the bound pools it.
fn exact_optimum(world: &World, jobs: &[SimJob]) -> f64 {
    let capacity: i64 = world
        .pools
        .iter()
        .filter(|p| !p.pool.launchable)
        .map(|p| i64::from(p.fixed_nodes * p.pool.gpus_per_node))
        .sum();
    let mut fixed = 0.0;
    // (release, last start, runtime, GPUs, saving on-prem), in hours.
    let mut choices: Vec<(i64, i64, i64, i64, f64)> = Vec::new();
    for j in jobs {
        let (onprem, cloud) = prices(world, j);
        let r = &j.spec.resources;
        let gpus = i64::from(r.gpus * r.nodes.max(1));
        let onprem = onprem.filter(|_| gpus <= capacity);
        match (onprem, j.spec.deadline) {
            (Some(p), Some(d)) if p < cloud => {
                let (rel, run) = (j.submit.millis() / 1000 / HOUR, j.runtime_s / HOUR);
                let last = d.millis() / 1000 / HOUR - run;
                fixed += cloud;
                if last >= rel {
                    choices.push((rel, last, run, gpus, cloud - p));
                }
            }
            (Some(p), None) => fixed += p.min(cloud),
            _ => fixed += cloud,
        }
    }
    let horizon = choices.iter().map(|c| c.1 + c.2).max().unwrap_or(0) as usize;
    let mut best = 0.0_f64;
    for set in 0u32..1 << choices.len() {
        let on: Vec<_> = (0..choices.len())
            .filter(|&i| set & (1 << i) != 0)
            .map(|i| choices[i])
            .collect();
        let saving: f64 = on.iter().map(|c| c.4).sum();
        if saving > best && schedulable(&on, &mut vec![0; horizon], capacity) {
            best = saving;
        }
    }
    fixed - best
}

/// Whether every job of `on` gets a whole-hour start in its window with at most `capacity`
/// GPUs busy in any hour.
fn schedulable(on: &[(i64, i64, i64, i64, f64)], load: &mut [i64], capacity: i64) -> bool {
    let Some((&(rel, last, run, gpus, _), rest)) = on.split_first() else {
        return true;
    };
    for s in rel..=last {
        let hours = s as usize..(s + run) as usize;
        if load[hours.clone()].iter().all(|&l| l + gpus <= capacity) {
            load[hours.clone()].iter_mut().for_each(|l| *l += gpus);
            let ok = schedulable(rest, load, capacity);
            load[hours].iter_mut().for_each(|l| *l -= gpus);
            if ok {
                return true;
            }
        }
    }
    false
}

#[test]
fn the_bound_is_at_most_the_exact_integral_optimum() {
    let mut rng = SplitMix64::new(2929);
    let (mut bounds, mut optima, mut tight, mut feasible) = (0.0, 0.0, 0, 0);
    let cases = 400;
    for case in 0..cases {
        let (world, jobs) = random_instance(&mut rng, 5);
        let opt = exact_optimum(&world, &jobs);
        for buckets in [DEFAULT_BUCKETS, 3, 1] {
            let bound = lp_lower_bound(&world, &jobs, buckets).micros() as f64;
            assert!(
                bound <= opt + 1e-9 * opt + 1.0,
                "case {case}, {buckets} buckets: bound {bound} > optimum {opt}\n{world:?}\n{jobs:?}"
            );
            if buckets == DEFAULT_BUCKETS && opt < NOWHERE {
                feasible += 1;
                bounds += bound;
                optima += opt;
                tight += usize::from(bound >= opt - 1.0);
            }
        }
    }
    // Not a vacuous check: the bound is close, and often exact, on these.
    eprintln!(
        "bound / exact optimum over {feasible} feasible cases of {cases}: {:.4}; exact in {tight}",
        bounds / optima
    );
    assert!(feasible > cases / 2 && bounds / optima > 0.8 && tight > feasible / 4);
}

#[test]
fn every_schedule_the_simulator_runs_by_the_deadlines_costs_at_least_the_bound() {
    let mut rng = SplitMix64::new(29_029);
    let mut checked = 0;
    let cases = 120;
    for case in 0..cases {
        let (world, jobs) = random_instance(&mut rng, 5);
        let bound = lp_lower_bound(&world, &jobs, DEFAULT_BUCKETS);
        let opt = exact_optimum(&world, &jobs);
        let schedulers: [Box<dyn Scheduler>; 3] = [
            Box::new(Switchyard::default()),
            Box::new(Cheapest),
            Box::new(FifoBurst::default()),
        ];
        for mut s in schedulers {
            let r = sim::run(&world, &jobs, &SimConfig::default(), s.as_mut());
            if !r.jobs.iter().all(|o| o.met_deadline()) {
                continue;
            }
            checked += 1;
            let cost = r.total_cost();
            assert!(
                bound <= cost && opt <= cost.micros() as f64 + 1.0,
                "case {case}, {}: cost {cost:?} < bound {bound:?} or optimum {opt}\n{world:?}\n{jobs:?}",
                r.scheduler
            );
        }
    }
    eprintln!("{checked} of {} runs met every deadline", 3 * cases);
    assert!(checked > cases, "only {checked} runs met every deadline");
}

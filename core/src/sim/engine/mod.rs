//! The event loop and the world's state. See the parent module for the physics.
//!
//! The live [`Snapshot`] is kept up to date in place: each queued job, running attempt and
//! node sits at a position tracked per entity, and leaves by `swap_remove`, so a scheduler call
//! costs nothing to prepare. `plan` is independent of input order, so the shuffling is harmless.

mod act;

use super::rng::SplitMix64;
use super::*;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use uuid::Uuid;

/// How long jobs may wait with none running and none yet to arrive before the run stops:
/// whatever still waits then can never run. Launches do not count as progress: a
/// scheduler that launched nodes it never used, again and again, would otherwise never end.
const STALL_LIMIT_MS: i64 = 2 * 86_400_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Arrive(usize),
    End { job: usize, epoch: u32 },
    Ready(usize),
    IdleCheck { node: usize, epoch: u32 },
    Interrupt(usize),
    Wake,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum JobState {
    NotArrived,
    Queued,
    Running {
        node: usize,
        /// The node's GPUs it holds.
        gpus: GpuSet,
        start_ms: i64,
        work_start_ms: i64,
    },
    Done,
}

struct JobRec {
    id: JobId,
    remaining_s: i64,
    state: JobState,
    epoch: u32,
    first_start: Option<Timestamp>,
    /// The pool of the node it first started on.
    first_pool: Option<usize>,
    /// A gang's nodes past rank 0 while it runs (rank 0's are in `state`), with the GPUs it
    /// holds on each.
    ranks: Vec<(usize, GpuSet)>,
    /// Its GPUs' share of what the nodes it ran on cost while it ran (egress included).
    cost: Money,
    /// The same in cash, and its parts: see [`JobOutcome`].
    cash: Money,
    cloud_cash: Money,
    lost_cash: Money,
    /// It started in the cloud while owned nodes that fit it had its GPUs free.
    cloud_while_owned_free: bool,
    finish: Option<Timestamp>,
}

struct NodeRec {
    id: NodeId,
    pool: usize,
    market: Market,
    launched_ms: i64,
    ready: bool,
    released: bool,
    /// Its GPUs no job holds, by index.
    free: GpuSet,
    on_node: Vec<usize>,
    busy_since_ms: i64,
    busy_ms: i64,
    idle_epoch: u32,
    for_job: Option<usize>,
}

struct Engine<'w> {
    world: &'w World,
    jobs_in: &'w [SimJob],
    estimator: &'w mut dyn Estimator,
    /// What each job was told at its first arrival.
    told: Vec<Option<Told>>,
    cfg: &'w SimConfig,
    snap: Snapshot,
    jobs: Vec<JobRec>,
    nodes: Vec<NodeRec>,
    queued_at: Vec<Option<usize>>,
    queued_idx: Vec<usize>,
    /// Where each running job's attempts sit in `snap.running`, by rank (one per node).
    running_at: Vec<Vec<usize>>,
    /// The (job, rank) at each position of `snap.running`.
    running_idx: Vec<(usize, usize)>,
    node_at: Vec<Option<usize>>,
    node_idx: Vec<usize>,
    node_by_id: HashMap<NodeId, usize>,
    pool_by_id: HashMap<PoolId, usize>,
    region_by_id: HashMap<RegionId, usize>,
    live_per_pool: Vec<u32>,
    provisioning: BTreeMap<JobId, NodeId>,
    heap: BinaryHeap<Reverse<(i64, u64, Event)>>,
    seq: u64,
    /// Arrivals not yet applied.
    arrivals_pending: usize,
    wake_pending: Option<i64>,
    rng: SplitMix64,
    measure: (i64, i64),
    onprem_busy_gpu_ms: f64,
    /// The measured window's busy on-prem GPU time at the internal rate, in micro-dollars.
    onprem_busy_charge: f64,
    out: SimResult,
}

/// Replays `jobs` against `world` under `scheduler`. Deterministic: the same inputs give the
/// same result.
pub fn run(
    world: &World,
    jobs: &[SimJob],
    cfg: &SimConfig,
    scheduler: &mut dyn Scheduler,
) -> SimResult {
    run_with(world, jobs, cfg, scheduler, &mut AsGiven)
}

/// [`run`], with the runtimes the scheduler is told coming from `estimator`.
pub fn run_with(
    world: &World,
    jobs: &[SimJob],
    cfg: &SimConfig,
    scheduler: &mut dyn Scheduler,
    estimator: &mut dyn Estimator,
) -> SimResult {
    let mut e = Engine::new(world, jobs, cfg, scheduler.name(), estimator);
    for (i, j) in jobs.iter().enumerate() {
        e.push(j.submit.millis(), Event::Arrive(i));
    }
    let mut now = 0;
    let mut last_progress = 0;
    while let Some(Reverse((t, _, first))) = e.heap.pop() {
        now = t;
        let mut dirty = e.apply(first, now);
        while let Some(&Reverse((t2, _, _))) = e.heap.peek() {
            if t2 != now {
                break;
            }
            if let Some(Reverse((_, _, ev))) = e.heap.pop() {
                dirty |= e.apply(ev, now);
            }
        }
        if dirty && !e.snap.queued.is_empty() {
            let view = View {
                now: Timestamp(now),
                snapshot: &e.snap,
                provisioning: &e.provisioning,
            };
            let decisions = scheduler.decide(&view);
            e.out.scheduler_calls += 1;
            for action in decisions.actions {
                if !e.act(action, now) {
                    e.out.rejected_actions += 1;
                }
            }
            if !e.snap.queued.is_empty() {
                let tick = now.saturating_add(cfg.tick_s.max(1) * 1000);
                let wake = decisions
                    .wake_at
                    .map(|w| w.millis())
                    .filter(|&w| w > now)
                    .map_or(tick, |w| w.min(tick));
                e.schedule_wake(wake);
            }
        }
        // Capacity can still change: a job runs (its end frees GPUs) or one is yet to come.
        if e.arrivals_pending > 0 || !e.snap.running.is_empty() {
            last_progress = now;
        } else if now - last_progress > STALL_LIMIT_MS {
            break;
        }
    }
    e.finish(now)
}

impl<'w> Engine<'w> {
    fn new(
        world: &'w World,
        jobs_in: &'w [SimJob],
        cfg: &'w SimConfig,
        name: &str,
        estimator: &'w mut dyn Estimator,
    ) -> Self {
        let n = jobs_in.len();
        let mut e = Engine {
            world,
            jobs_in,
            estimator,
            told: vec![None; n],
            cfg,
            snap: Snapshot {
                regions: world.regions.clone(),
                pools: world.pools.iter().map(|p| p.pool.clone()).collect(),
                burst_enabled: true,
                spot_interruptions_per_hour_ppm: world
                    .pools
                    .iter()
                    .filter(|p| p.pool.launchable)
                    .map(|p| {
                        let ppm = (p.interruptions_per_hour.max(0.0) * 1e6).round();
                        (p.pool.id.clone(), ppm.min(f64::from(u32::MAX)) as u32)
                    })
                    .collect(),
                reserve_free_below_one_in: cfg.reserve_free_below_one_in,
                ..Snapshot::default()
            },
            jobs: jobs_in
                .iter()
                .enumerate()
                .map(|(i, j)| JobRec {
                    id: job_id(i),
                    remaining_s: j.runtime_s.max(0),
                    state: JobState::NotArrived,
                    epoch: 0,
                    first_start: None,
                    first_pool: None,
                    ranks: Vec::new(),
                    cost: Money::ZERO,
                    cash: Money::ZERO,
                    cloud_cash: Money::ZERO,
                    lost_cash: Money::ZERO,
                    cloud_while_owned_free: false,
                    finish: None,
                })
                .collect(),
            nodes: Vec::new(),
            queued_at: vec![None; n],
            queued_idx: Vec::new(),
            running_at: vec![Vec::new(); n],
            running_idx: Vec::new(),
            node_at: Vec::new(),
            node_idx: Vec::new(),
            node_by_id: HashMap::new(),
            pool_by_id: HashMap::new(),
            region_by_id: HashMap::new(),
            live_per_pool: vec![0; world.pools.len()],
            provisioning: BTreeMap::new(),
            heap: BinaryHeap::new(),
            seq: 0,
            arrivals_pending: 0,
            wake_pending: None,
            rng: SplitMix64::stream(cfg.seed, 0x5107),
            measure: measure_window(jobs_in, cfg),
            onprem_busy_gpu_ms: 0.0,
            onprem_busy_charge: 0.0,
            out: SimResult {
                scheduler: name.to_owned(),
                ..SimResult::default()
            },
        };
        for (i, p) in world.pools.iter().enumerate() {
            e.pool_by_id.insert(p.pool.id.clone(), i);
            if !p.pool.launchable {
                for _ in 0..p.fixed_nodes {
                    let node = e.add_node(i, Market::OnDemand, 0);
                    e.set_ready(node);
                }
            }
        }
        for (i, r) in world.regions.iter().enumerate() {
            e.region_by_id.insert(r.id.clone(), i);
        }
        e
    }

    fn push(&mut self, at_ms: i64, ev: Event) {
        if matches!(ev, Event::Arrive(_)) {
            self.arrivals_pending += 1;
        }
        self.seq += 1;
        self.heap.push(Reverse((at_ms, self.seq, ev)));
    }

    fn schedule_wake(&mut self, at_ms: i64) {
        if self.wake_pending.is_none_or(|p| at_ms < p) {
            self.wake_pending = Some(at_ms);
            self.push(at_ms, Event::Wake);
        }
    }

    /// Applies one event; true when the world changed in a way a scheduler may act on.
    fn apply(&mut self, ev: Event, now: i64) -> bool {
        if matches!(ev, Event::Arrive(_)) {
            self.arrivals_pending -= 1;
        }
        match ev {
            Event::Arrive(j) => {
                self.enqueue(j);
                true
            }
            Event::End { job, epoch } => {
                let live = self.jobs[job].epoch == epoch
                    && matches!(self.jobs[job].state, JobState::Running { .. });
                if live {
                    self.stop(job, now, true);
                }
                live
            }
            Event::Ready(node) => {
                if self.nodes[node].released {
                    return false;
                }
                self.set_ready(node);
                self.push_idle_check(node, now);
                true
            }
            Event::IdleCheck { node, epoch } => {
                let n = &self.nodes[node];
                if n.released || n.idle_epoch != epoch || !n.on_node.is_empty() {
                    return false;
                }
                self.release(node, now);
                true
            }
            Event::Interrupt(node) => {
                if self.nodes[node].released {
                    return false;
                }
                self.out.spot_interruptions += 1;
                for job in self.nodes[node].on_node.clone() {
                    self.stop(job, now, false);
                }
                self.release(node, now);
                true
            }
            Event::Wake => {
                let due = self.wake_pending == Some(now);
                if due {
                    self.wake_pending = None;
                }
                due
            }
        }
    }

    fn add_node(&mut self, pool: usize, market: Market, now: i64) -> usize {
        let p = &self.world.pools[pool].pool;
        let gpus = p.gpus_per_node.min(MAX_GPUS_PER_NODE);
        let all = GpuSet::first(gpus).unwrap_or_default();
        let idx = self.nodes.len();
        let id = NodeId::new(format!("{}#{:06}", p.id, idx));
        self.nodes.push(NodeRec {
            id: id.clone(),
            pool,
            market,
            launched_ms: now,
            ready: false,
            released: false,
            free: all,
            on_node: Vec::new(),
            busy_since_ms: 0,
            busy_ms: 0,
            idle_epoch: 0,
            for_job: None,
        });
        self.node_at.push(Some(self.snap.nodes.len()));
        self.node_idx.push(idx);
        self.snap.nodes.push(Node {
            id: id.clone(),
            pool: p.id.clone(),
            gpus_total: gpus,
            free_gpus: all,
            healthy: false,
            draining: false,
            last_heartbeat: Timestamp(now),
            market,
        });
        self.node_by_id.insert(id.clone(), idx);
        self.live_per_pool[pool] += 1;
        idx
    }

    fn set_ready(&mut self, node: usize) {
        self.nodes[node].ready = true;
        if let Some(pos) = self.node_at[node] {
            self.snap.nodes[pos].healthy = true;
        }
    }

    fn push_idle_check(&mut self, node: usize, now: i64) {
        let n = &self.nodes[node];
        if self.world.pools[n.pool].pool.launchable && n.on_node.is_empty() {
            let ev = Event::IdleCheck {
                node,
                epoch: n.idle_epoch,
            };
            self.push(now + self.cfg.idle_ttl_s.max(0) * 1000, ev);
        }
    }

    fn enqueue(&mut self, j: usize) {
        self.jobs[j].state = JobState::Queued;
        let mut spec = self.jobs_in[j].spec.clone();
        let remaining = self.jobs[j].remaining_s;
        let told = match self.told[j] {
            Some(t) => t,
            None => {
                let t = self.estimator.estimate(j, &self.jobs_in[j]);
                self.told[j] = Some(t);
                t
            }
        };
        // What it was told, less the progress it keeps; at least a second of what is left.
        let kept = self.jobs_in[j].runtime_s - remaining;
        let cost_s = (told.runtime_s - kept).max(remaining.min(1));
        spec.estimated_runtime_s = Some(cost_s);
        // Judged at a later quantile only when it says more than the cost runtime.
        let deadline_s = (told.deadline_runtime_s - kept).max(cost_s);
        let deadline_runtime_s = (deadline_s > cost_s).then_some(deadline_s);
        self.queued_at[j] = Some(self.snap.queued.len());
        self.queued_idx.push(j);
        self.snap.queued.push(QueuedJob {
            id: self.jobs[j].id,
            spec,
            submitted_at: self.jobs_in[j].submit,
            deadline_runtime_s,
        });
    }

    fn dequeue(&mut self, j: usize) {
        if let Some(pos) = self.queued_at[j].take() {
            self.snap.queued.swap_remove(pos);
            self.queued_idx.swap_remove(pos);
            if let Some(&moved) = self.queued_idx.get(pos) {
                self.queued_at[moved] = Some(pos);
            }
        }
    }

    /// Whether owned (fixed) nodes that fit job `j` have its GPUs free now: enough of one
    /// pool's nodes (a gang's every node) with as many free GPUs as it asks for on each.
    fn owned_room(&self, j: usize) -> bool {
        let spec = &self.jobs_in[j].spec;
        let (gpus, nodes) = (spec.resources.gpus, spec.resources.nodes.max(1));
        self.world.pools.iter().enumerate().any(|(pi, p)| {
            !p.pool.launchable
                && crate::placement::hard_constraint(&p.pool, spec).is_none()
                && self
                    .nodes
                    .iter()
                    .filter(|n| n.pool == pi && !n.released && n.free.len() >= gpus)
                    .take(nodes as usize)
                    .count()
                    >= nodes as usize
        })
    }

    /// Starts job `j` on `parts`: the GPUs of each of its nodes, rank 0 first (free, as many
    /// as it asks for on each, one pool: see `act`). A gang's data moves once, to its pool.
    fn start(&mut self, j: usize, parts: &[(usize, GpuSet)], now: i64) {
        let Some(&(n, gpus)) = parts.first() else {
            return;
        };
        self.dequeue(j);
        let job = &self.jobs_in[j];
        let pool = &self.world.pools[self.nodes[n].pool].pool;
        let mut transfer_s = 0;
        if let Some(d) = job.spec.data.as_ref().filter(|d| d.region != pool.region) {
            let (egress, src) = match self.region_by_id.get(&d.region) {
                Some(&r) => (self.world.regions[r].egress_per_gb, d.region.clone()),
                None => (Money::ZERO, d.region.clone()),
            };
            let cost = egress.saturating_mul(i64::from(d.size_gb));
            self.charge(now, &src, cost);
            self.out.egress_cost += cost;
            self.jobs[j].cost += cost;
            self.jobs[j].cash += cost;
            let gbps = match self.region_by_id.get(&pool.region) {
                Some(&r) if self.world.regions[r].ingress_gbps > 0 => {
                    self.world.regions[r].ingress_gbps
                }
                _ => 10,
            };
            transfer_s = i64::try_from((u64::from(d.size_gb) * 8).div_ceil(u64::from(gbps)))
                .unwrap_or(i64::MAX / 4_000);
        }
        let priority = job.spec.priority;
        if pool.launchable && self.owned_room(j) {
            self.jobs[j].cloud_while_owned_free = true;
        }
        let rec = &mut self.jobs[j];
        let work_start_ms = now + transfer_s * 1000;
        let end_ms = work_start_ms + rec.remaining_s * 1000;
        rec.state = JobState::Running {
            node: n,
            gpus,
            start_ms: now,
            work_start_ms,
        };
        rec.ranks = parts[1..].to_vec();
        rec.first_start.get_or_insert(Timestamp(now));
        rec.first_pool.get_or_insert(self.nodes[n].pool);
        let (id, epoch) = (rec.id, rec.epoch);
        if let Some(m) = self.provisioning.remove(&id)
            && let Some(&o) = self.node_by_id.get(&m)
        {
            self.nodes[o].for_job = None;
        }
        for (rank, &(n, gpus)) in parts.iter().enumerate() {
            let nr = &mut self.nodes[n];
            nr.free = nr.free.difference(gpus);
            if nr.on_node.is_empty() {
                nr.busy_since_ms = now;
                nr.idle_epoch += 1;
            }
            nr.on_node.push(j);
            if let Some(other) = nr.for_job.take() {
                self.provisioning.remove(&self.jobs[other].id);
            }
            let node_id = self.nodes[n].id.clone();
            if let Some(pos) = self.node_at[n] {
                self.snap.nodes[pos].free_gpus = self.nodes[n].free;
            }
            self.running_at[j].push(self.snap.running.len());
            self.running_idx.push((j, rank));
            // Rank 0's id as before gangs; a gang's other ranks apart in the top bits.
            let attempt = ((j as u128 + 1) << 32) | u128::from(epoch) | ((rank as u128) << 96);
            self.snap.running.push(RunningAttempt {
                job: id,
                attempt: AttemptId(Uuid::from_u128(attempt)),
                node: node_id,
                gpus,
                priority,
                started_at: Timestamp(now),
                expected_end: Timestamp(end_ms),
            });
        }
        self.push(end_ms, Event::End { job: j, epoch });
    }

    /// Ends job `j`'s attempt, on every node of a gang: done, or back to the queue with its
    /// checkpointed progress.
    fn stop(&mut self, j: usize, now: i64, completed: bool) {
        let JobState::Running {
            node,
            gpus: held,
            start_ms,
            work_start_ms,
        } = self.jobs[j].state
        else {
            return;
        };
        let mut parts = vec![(node, held)];
        parts.append(&mut self.jobs[j].ranks);
        let gpus = self.jobs_in[j].spec.resources.gpus;
        // What this attempt cost in cash on all its nodes, for the gap's anatomy.
        let mut attempt_cash = Money::ZERO;
        for &(node, held) in &parts {
            let nr = &mut self.nodes[node];
            nr.free = nr.free.union(held);
            nr.on_node.retain(|&x| x != j);
            let pool = &self.world.pools[nr.pool].pool;
            if nr.on_node.is_empty() {
                nr.busy_ms += now - nr.busy_since_ms;
                nr.idle_epoch += 1;
            }
            if let Some(pos) = self.node_at[node] {
                self.snap.nodes[pos].free_gpus = self.nodes[node].free;
            }
            let ran_s = (now - start_ms + 999) / 1000;
            self.jobs[j].cost += pool
                .price_per_gpu_hour(self.nodes[node].market)
                .saturating_mul(i64::from(gpus))
                .per_hour_for_secs(ran_s);
            let cash = pool
                .cash_per_gpu_hour(self.nodes[node].market)
                .saturating_mul(i64::from(gpus))
                .per_hour_for_secs(ran_s);
            attempt_cash += cash;
            if pool.launchable {
                self.jobs[j].cloud_cash += cash;
            }
            if !pool.launchable {
                let secs = (now - start_ms + 999) / 1000;
                let rate = pool.on_demand_per_gpu_hour();
                let cost = rate.saturating_mul(i64::from(gpus)).per_hour_for_secs(secs);
                let cash = pool
                    .cash_per_gpu_hour(Market::OnDemand)
                    .saturating_mul(i64::from(gpus))
                    .per_hour_for_secs(secs);
                let region = pool.region.clone();
                self.charge(now, &region, cash);
                self.out.onprem_cost += cost;
                self.out.onprem_cash_cost += cash;
                let (lo, hi) = self.measure;
                let overlap = (now.min(hi) - start_ms.max(lo)).max(0);
                self.onprem_busy_gpu_ms += overlap as f64 * f64::from(gpus);
                self.onprem_busy_charge +=
                    overlap as f64 * f64::from(gpus) * rate.micros() as f64 / 3_600_000.0;
            }
        }
        // Highest position first: what `swap_remove` moves in is never one of the job's own.
        let mut at = std::mem::take(&mut self.running_at[j]);
        at.sort_unstable_by(|a, b| b.cmp(a));
        for pos in at {
            self.snap.running.swap_remove(pos);
            self.running_idx.swap_remove(pos);
            if let Some(&(moved, rank)) = self.running_idx.get(pos) {
                self.running_at[moved][rank] = pos;
            }
        }
        let rec = &mut self.jobs[j];
        rec.epoch += 1;
        rec.cash += attempt_cash;
        if completed {
            rec.state = JobState::Done;
            rec.finish = Some(Timestamp(now));
            self.estimator.finished(j, &self.jobs_in[j]);
        } else {
            let done_s = ((now - work_start_ms).max(0)) / 1000;
            let ckpt = self.cfg.checkpoint_interval_s;
            let kept = if ckpt > 0 { done_s / ckpt * ckpt } else { 0 };
            rec.remaining_s = (rec.remaining_s - kept).max(0);
            // The part of the attempt's time no checkpoint kept (the data transfer included).
            let ran_ms = (now - start_ms).max(1);
            let lost_ms = (ran_ms - kept * 1000).clamp(0, ran_ms);
            rec.lost_cash += Money(
                i64::try_from(
                    i128::from(attempt_cash.micros()) * i128::from(lost_ms) / i128::from(ran_ms),
                )
                .unwrap_or(i64::MAX),
            );
            self.enqueue(j);
        }
        for &(node, _) in &parts {
            self.push_idle_check(node, now);
        }
    }

    fn release(&mut self, node: usize, now: i64) {
        let nr = &mut self.nodes[node];
        nr.released = true;
        let pool = &self.world.pools[nr.pool].pool;
        let price = match nr.market {
            Market::Spot => pool.spot_per_hour.unwrap_or(pool.on_demand_per_hour),
            Market::OnDemand => pool.on_demand_per_hour,
        };
        let billed_s = ((now - nr.launched_ms + 999) / 1000).max(self.cfg.min_billed_s);
        let total = price.per_hour_for_secs(billed_s);
        let busy = price.per_hour_for_secs(nr.busy_ms / 1000).min(total);
        self.out.cloud_busy_cost += busy;
        self.out.cloud_idle_cost += total - busy;
        if let Some(j) = nr.for_job.take() {
            self.provisioning.remove(&self.jobs[j].id);
        }
        let (pool_idx, id, region) = (nr.pool, nr.id.clone(), pool.region.clone());
        self.charge(now, &region, total);
        self.live_per_pool[pool_idx] -= 1;
        self.node_by_id.remove(&id);
        if let Some(pos) = self.node_at[node].take() {
            self.snap.nodes.swap_remove(pos);
            self.node_idx.swap_remove(pos);
            if let Some(&moved) = self.node_idx.get(pos) {
                self.node_at[moved] = Some(pos);
            }
        }
    }

    fn charge(&mut self, now: i64, region: &RegionId, cost: Money) {
        if cost == Money::ZERO {
            return;
        }
        *self.out.spend_by_region.entry(region.clone()).or_default() += cost;
        self.out.timeline.push((Timestamp(now), cost));
    }

    fn finish(mut self, now: i64) -> SimResult {
        for node in 0..self.nodes.len() {
            let n = &self.nodes[node];
            if !n.released && self.world.pools[n.pool].pool.launchable {
                self.release(node, now);
            }
        }
        let (lo, hi) = self.measure;
        let capacity: f64 = self
            .world
            .pools
            .iter()
            .filter(|p| !p.pool.launchable)
            .map(|p| f64::from(p.fixed_nodes) * f64::from(p.pool.gpus_per_node))
            .sum::<f64>()
            * (hi - lo).max(0) as f64;
        self.out.onprem_gpu_utilization = if capacity > 0.0 {
            self.onprem_busy_gpu_ms / capacity
        } else {
            0.0
        };
        // Owned GPUs' idle time in the measured window, and what it is worth at the internal
        // rate: the whole window's capacity less what ran there.
        let window_h = (hi - lo).max(0) as f64 / 3_600_000.0;
        let (gpu_h, value) =
            self.world
                .pools
                .iter()
                .filter(|p| !p.pool.launchable)
                .fold((0.0, 0.0), |(h, v), p| {
                    let gpus = f64::from(p.fixed_nodes) * f64::from(p.pool.gpus_per_node);
                    let rate = p.pool.on_demand_per_gpu_hour().micros() as f64;
                    (h + gpus * window_h, v + gpus * window_h * rate)
                });
        self.out.owned_idle_gpu_hours = (gpu_h - self.onprem_busy_gpu_ms / 3_600_000.0).max(0.0);
        self.out.owned_idle_cost =
            Money::from_micros((value - self.onprem_busy_charge).max(0.0).round() as i64);
        self.out.jobs = self
            .jobs
            .iter()
            .zip(self.jobs_in)
            .map(|(r, j)| JobOutcome {
                submit: j.submit,
                first_start: r.first_start,
                first_pool: r.first_pool.map(|p| self.world.pools[p].pool.id.clone()),
                cost: r.cost,
                cash: r.cash,
                cloud_cash: r.cloud_cash,
                lost_cash: r.lost_cash,
                cloud_while_owned_free: r.cloud_while_owned_free,
                finish: r.finish,
                deadline: j.spec.deadline,
                measured: j.measured,
            })
            .collect();
        self.out.end = Timestamp(now);
        self.out
    }
}

fn measure_window(jobs: &[SimJob], cfg: &SimConfig) -> (i64, i64) {
    let lo = cfg.measure_from.millis();
    let hi = jobs
        .iter()
        .filter(|j| j.measured)
        .map(|j| j.submit.millis())
        .max()
        .unwrap_or(lo);
    (lo, hi.max(lo))
}

/// The id of the `i`-th job of a trace.
pub fn job_id(i: usize) -> JobId {
    JobId(Uuid::from_u128(i as u128 + 1))
}

fn job_index(id: JobId, n: usize) -> Option<usize> {
    let v = id.0.as_u128();
    (v >= 1 && v <= n as u128).then(|| (v - 1) as usize)
}

//! The simulator's engine: replays a job trace against a world of pools on a virtual clock.
//!
//! Pure like the rest of `core`: no I/O, no clock, no threads. The engine keeps an event heap
//! (arrivals, attempt ends, nodes ready, idle releases, spot interruptions, wake-ups), jumps to
//! the next event, applies every event due at that instant, then asks a [`Scheduler`] what to do
//! and applies its [`Action`]s. It keeps a live [`Snapshot`] of the world up to date as it goes,
//! so a scheduler that calls [`crate::plan`] sees exactly what the broker would build.
//!
//! The physics, the same for every scheduler:
//! - On-prem pools (`launchable == false`) have a fixed set of nodes, ready from the start and
//!   never released. Their GPU-hours cost the pool's internal rate while a job holds them; idle
//!   on-prem capacity costs nothing (it is sunk, and equal for every scheduler).
//! - Cloud pools launch a node on request; it is ready `boot_time_s` later and bills per second
//!   from launch to release, with a [`SimConfig::min_billed_s`] minimum, at the market's node
//!   price. A node idle for [`SimConfig::idle_ttl_s`] is released. Up to `node_limit` nodes.
//! - A spot node is interrupted after an exponential time with the pool's rate per hour, drawn
//!   from a seeded generator in launch order. The jobs on it go back to the queue, keeping the
//!   progress of their last checkpoint ([`SimConfig::checkpoint_interval_s`]). Each node in
//!   the snapshot carries its market; a job whose spot rule is `never` is not put on a spot
//!   node (such an assignment is refused and counted in [`SimResult::rejected_actions`]).
//! - A gang (`resources.nodes` = N > 1, `resources.gpus` per node) runs on N nodes of one
//!   pool, started together, all or none, and launched together ([`Action::LaunchGang`]). It
//!   ends on all of them at once; a preemption or a spot interruption of any of its nodes
//!   requeues the whole gang, and its cost is every node's GPUs.
//! - A job whose data lives in another region pays the data region's egress per GB on every
//!   attempt start and holds its node for the transfer time first (`size × 8 / ingress_gbps`).
//!
//! Code map: `engine` (state and event loop), `baselines` (the `cheapest` and `fifo-burst`
//! peers), `switchyard` (the adapter over `plan`), `lower_bound` (the offline LP bound),
//! `rng` (a seeded generator with stable output).

mod baselines;
mod engine;
pub mod lower_bound;
pub mod rng;
mod switchyard;

pub use baselines::{Cheapest, FifoBurst};
pub use engine::{job_id, run, run_with};
pub use lower_bound::{job_floor, lp_lower_bound};
pub use switchyard::{Commitment, Switchyard};

use crate::domain::*;
use crate::money::Money;
use crate::time::Timestamp;
use std::collections::BTreeMap;

/// One pool of the simulated world.
#[derive(Clone, Debug, PartialEq)]
pub struct SimPool {
    /// Its nodes have `gpus_per_node` GPUs, at most [`MAX_GPUS_PER_NODE`] (a pool that claims
    /// more has nodes of that many: build worlds from validated pools).
    pub pool: Pool,
    /// Nodes that exist from the start (on-prem). Ignored for launchable pools.
    pub fixed_nodes: u32,
    /// Spot interruptions per node-hour (0: never).
    pub interruptions_per_hour: f64,
}

/// The capacity and the geography a trace is replayed against.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct World {
    pub regions: Vec<Region>,
    pub pools: Vec<SimPool>,
}

/// One job of the trace, with the assumptions the trace lacks already applied.
#[derive(Clone, Debug, PartialEq)]
pub struct SimJob {
    pub submit: Timestamp,
    /// True runtime.
    pub runtime_s: i64,
    /// What the scheduler is told the job will run (less the progress it keeps when requeued):
    /// `None` tells it the true runtime, as an oracle would; a replay of recorded jobs tells
    /// it what their users estimated, as the live planner was told.
    pub estimate_s: Option<i64>,
    pub spec: JobSpec,
    /// Counted in the metrics (false for warm-up jobs, which only load the world).
    pub measured: bool,
}

/// What the scheduler is told a job will run, from its start with no progress kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Told {
    /// The runtime its cost is judged by (the p50 of a prediction).
    pub runtime_s: i64,
    /// The runtime its deadline is judged by (the p90 of a prediction).
    pub deadline_runtime_s: i64,
}

/// Where the runtimes a scheduler is told come from, and what it learns as jobs end: the
/// simulator's view of the broker's runtime prediction (`crate::predict`).
pub trait Estimator {
    /// Job `index` of the run arrives for the first time: what the scheduler is told. A
    /// requeued job is told the same, less the progress it keeps.
    fn estimate(&mut self, index: usize, job: &SimJob) -> Told;
    /// Job `index` finished, having needed `job.runtime_s` in all.
    fn finished(&mut self, _index: usize, _job: &SimJob) {}
}

/// Tells each job's [`SimJob::estimate_s`] (the true runtime when `None`), for cost and
/// deadlines alike, and learns nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct AsGiven;

impl Estimator for AsGiven {
    fn estimate(&mut self, _index: usize, job: &SimJob) -> Told {
        let runtime_s = job.estimate_s.unwrap_or(job.runtime_s);
        Told {
            runtime_s,
            deadline_runtime_s: runtime_s,
        }
    }
}

/// Engine parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct SimConfig {
    /// A cloud node with nothing to run is released after this long.
    pub idle_ttl_s: i64,
    /// Minimum billed time of a cloud node.
    pub min_billed_s: i64,
    /// Progress a job keeps when its spot node is interrupted: whole intervals of this length.
    /// 0: restarts from scratch.
    pub checkpoint_interval_s: i64,
    /// While jobs wait, the scheduler is called at least this often.
    pub tick_s: i64,
    /// Seed of the spot interruption draws.
    pub seed: u64,
    /// Utilisation is measured over `[measure_from, last measured arrival]`.
    pub measure_from: Timestamp,
    /// The on-prem reserve's threshold the schedulers are given
    /// ([`crate::domain::Snapshot::reserve_free_below_one_in`]).
    pub reserve_free_below_one_in: Option<u32>,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            idle_ttl_s: 600,
            min_billed_s: 60,
            checkpoint_interval_s: 3600,
            tick_s: 300,
            seed: 1,
            measure_from: Timestamp(0),
            reserve_free_below_one_in: None,
        }
    }
}

/// What a scheduler sees on each call.
#[derive(Debug)]
pub struct View<'a> {
    pub now: Timestamp,
    /// The world as the broker would sense it: pools, nodes (booting ones unhealthy, each
    /// with the market it was launched on), queued jobs and running attempts.
    pub snapshot: &'a Snapshot,
    /// Jobs that a node being booted was launched for.
    pub provisioning: &'a BTreeMap<JobId, NodeId>,
}

impl View<'_> {
    pub fn is_provisioning(&self, job: JobId) -> bool {
        self.provisioning.contains_key(&job)
    }
}

/// A scheduler's decision; invalid ones (a full node, an unknown job) are counted and ignored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Start a queued one-node job on a ready node, on the GPUs `gpus` (as many as it asks
    /// for, all free).
    Assign {
        job: JobId,
        node: NodeId,
        gpus: GpuSet,
    },
    /// Start a queued gang (`resources.nodes` > 1) on all its nodes at once: one entry per
    /// node, rank 0 first, as many as it asks for, all ready and in one pool, each with the
    /// job's per-node GPUs free. The gang ends, is preempted or interrupted as one.
    AssignGang {
        job: JobId,
        nodes: Vec<(NodeId, GpuSet)>,
    },
    /// Launch a node in a cloud pool for a one-node job (which stays queued until assigned).
    Launch {
        pool: PoolId,
        market: Market,
        for_job: JobId,
    },
    /// Launch all of a gang's nodes in one cloud pool, or none when its quota lacks room.
    LaunchGang {
        pool: PoolId,
        market: Market,
        for_job: JobId,
    },
    /// Stop a running job and requeue it, keeping its checkpointed progress.
    Preempt { job: JobId },
}

/// What a scheduler returns from one call.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Decisions {
    pub actions: Vec<Action>,
    /// Call again no later than this, even if nothing happens.
    pub wake_at: Option<Timestamp>,
}

/// A scheduling policy under test.
pub trait Scheduler {
    fn name(&self) -> &str;
    fn decide(&mut self, view: &View<'_>) -> Decisions;
}

/// What happened to one job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobOutcome {
    pub submit: Timestamp,
    pub first_start: Option<Timestamp>,
    /// The pool it first started in.
    pub first_pool: Option<PoolId>,
    /// Its GPUs' share of the price of the nodes it ran on while it ran, and its data's
    /// egress; a cloud node's boot and idle time is not a job's.
    pub cost: Money,
    /// The same in cash (owned GPUs at their marginal cost): every attempt's, egress included.
    pub cash: Money,
    /// The part of `cash` on cloud nodes (their GPU share while it ran).
    pub cloud_cash: Money,
    /// The part of `cash` that bought work an interruption or preemption threw away (what no
    /// checkpoint kept).
    pub lost_cash: Money,
    /// It started in the cloud at least once while owned nodes that fit it had its GPUs free
    /// (a choice: the on-prem reserve, a cheaper cloud, a predicted finish past the deadline),
    /// not only when they were full.
    pub cloud_while_owned_free: bool,
    pub finish: Option<Timestamp>,
    pub deadline: Option<Timestamp>,
    pub measured: bool,
}

impl JobOutcome {
    pub fn queue_delay_s(&self) -> Option<f64> {
        self.first_start
            .map(|s| (s.millis() - self.submit.millis()) as f64 / 1000.0)
    }

    /// Finished by the deadline (a job without one meets it by finishing).
    pub fn met_deadline(&self) -> bool {
        match (self.finish, self.deadline) {
            (Some(f), Some(d)) => f <= d,
            (Some(_), None) => true,
            (None, _) => false,
        }
    }
}

/// Everything a run measured. Money is split by where it went; `timeline` lists each charge
/// in time order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SimResult {
    pub scheduler: String,
    pub jobs: Vec<JobOutcome>,
    /// Cloud node time while running at least one job.
    pub cloud_busy_cost: Money,
    /// Cloud node time booting or idle (the idle TTL tail, the billing minimum).
    pub cloud_idle_cost: Money,
    /// Busy on-prem GPU time at the internal rate: what the ledger bills teams for it.
    pub onprem_cost: Money,
    /// Busy on-prem GPU time at its marginal cost (power and wear): what the company pays for
    /// it in cash ([`crate::domain::Pool::cash_per_hour`]).
    pub onprem_cash_cost: Money,
    /// Owned GPU-hours idle in the measured window, and what they are worth at the internal
    /// rate: a cost of ownership, paid whether they run or not. It is equal for every scheduler
    /// of one run only because they share the capacity: it is the window's capacity less the
    /// busy GPU-hours, so it falls as on-prem use rises.
    pub owned_idle_gpu_hours: f64,
    pub owned_idle_cost: Money,
    pub egress_cost: Money,
    pub timeline: Vec<(Timestamp, Money)>,
    pub spend_by_region: BTreeMap<RegionId, Money>,
    pub burst_instances: u64,
    pub spot_interruptions: u64,
    pub preemptions: u64,
    pub rejected_actions: u64,
    pub scheduler_calls: u64,
    /// On-prem GPU-seconds busy / available within the measured window.
    pub onprem_gpu_utilization: f64,
    pub end: Timestamp,
}

impl SimResult {
    /// What the company pays in cash: cloud spend (busy and idle), on-prem at its marginal
    /// cost, and egress. The headline cost, and the basis of the LP bound
    /// ([`lp_lower_bound`]); the spend timeline and `spend_by_region` are in it too.
    pub fn total_cost(&self) -> Money {
        self.cloud_busy_cost + self.cloud_idle_cost + self.onprem_cash_cost + self.egress_cost
    }

    /// What the ledger bills teams: cloud spend, on-prem at the internal rate, and egress.
    pub fn chargeback_cost(&self) -> Money {
        self.cloud_busy_cost + self.cloud_idle_cost + self.onprem_cost + self.egress_cost
    }
}

//! Placement: `plan(snapshot, now) -> Plan`, pure and deterministic.
//!
//! Rules (DESIGN.md "Placement"): hard constraints filter candidates; a candidate's start is
//! `now + wait` (0 on free capacity, the boot time for a new node, or the expected time until
//! enough capacity frees); `finish = start + runtime`; `cost = price × (runtime + boot) + egress`.
//! Objective, in order: no hard constraint broken, deadline met, lowest cost, earliest finish, and
//! ties by id so the result never depends on input order. Waiting for cheaper capacity is a
//! first-class choice: a job waits when waiting still meets its deadline and costs less, and
//! reserves the capacity it waits for, so a job later in the queue counts on what will be left
//! rather than on the same release (and bursts when that would miss its deadline). When
//! no candidate meets the deadline, the earliest finish wins (the least lateness), then cost.
//!
//! On top: spot only where the job and its policies allow it, priced with its interruption risk
//! (expected restarts × lost work) and only when the deadline absorbs the expected delay;
//! `high`/`critical` jobs whose deadline is at risk may preempt `low` work; multi-node jobs
//! (gangs) take all their nodes in one pool or none; team policies (allow-lists, price
//! ceilings, spot caps, bursting, time windows, priority ceilings, budgets) are hard
//! constraints; and contended free capacity is assigned jointly (`batch`).
//!
//! Code map: `index` (the snapshot, sorted and indexed), `capacity` (free GPUs, releases and
//! launches as the round goes), `constraints` (hard constraints and markets), `policy` (team
//! policies and budgets), `estimate` (one job × one pool → candidates, spot risk, gangs),
//! `preempt` (where an urgent job may take low-priority GPUs), `batch` (the joint min-cost
//! assignment of contended capacity), `greedy` (the per-job loop that decides; also the warm
//! state behind [`Planner`]), `explain` (explanations and hold reasons). This file holds the
//! public types.

mod batch;
mod capacity;
mod constraints;
mod estimate;
mod explain;
mod greedy;
mod index;
mod policy;
mod preempt;
#[cfg(test)]
mod tests;

pub use constraints::hard_constraint;
pub(crate) use constraints::model_violation;
pub use index::PlanCache;

use crate::domain::*;
use crate::money::Money;
use crate::time::Timestamp;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The most candidates one explanation lists: the winner, the best runners-up, then the blocked
/// pools closest to feasible. Hold reasons still count every pool.
pub const MAX_EXPLAINED_CANDIDATES: usize = 20;

/// The planner's decisions for one round.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// Jobs to start now on a node that has the GPUs free.
    pub assignments: Vec<Assignment>,
    /// New nodes to ask providers for (only when the snapshot allows bursting).
    pub launches: Vec<Launch>,
    /// Jobs that cannot be placed at all as things stand (no candidate passes the hard
    /// constraints, or none has capacity now, later or by a launch), with why.
    pub holds: Vec<Hold>,
    /// One explanation per queued job, keyed by job id: its outcome, with an empty candidate
    /// list. The candidates are kept compact and made public on demand: see
    /// [`Plan::explanation`].
    pub explanations: BTreeMap<JobId, Explanation>,
    /// Running low-priority attempts to stop (checkpoint signal, grace period, requeue) so that
    /// an urgent job can have their GPUs. The job's assignment to the node is in `assignments`.
    #[serde(default)]
    pub preemptions: Vec<Preemption>,
    /// The candidates of each explanation, by position in the round's index (or the round's
    /// input, to work them out on the first request): turned into public [`Candidate`]s (ids
    /// cloned) only for the jobs whose explanation is asked for. Not serialised: a plan read
    /// back explains outcomes only.
    #[serde(skip)]
    pub(crate) details: explain::Explained,
}

impl Plan {
    /// The explanation of `job` with its candidates (at most [`MAX_EXPLAINED_CANDIDATES`]):
    /// the winner first, then the other workable ones by score, then the blocked ones
    /// closest-to-feasible first. A plan made with [`Detail::Outcomes`] (or deserialised)
    /// has no candidates to give: the list is then empty. `None` for a job not in the plan.
    ///
    /// A plan from [`plan`] works out every job's candidates on the first call (the round
    /// planned again with candidate lists, about what [`Detail::Full`] costs), then answers
    /// from them; call it off latency-sensitive paths.
    pub fn explanation(&self, job: &JobId) -> Option<Explanation> {
        let e = self.explanations.get(job)?;
        Some(e.with_candidates(self.details.candidates(job)))
    }

    /// The explanations of `jobs` (those in the plan), as [`Plan::explanation`] gives them.
    /// When the candidate lists are kept on demand and nobody has asked for one yet, the
    /// round is planned again recording these jobs' lists alone, at about the cost of the
    /// decisions (rather than of every job's list), and nothing is kept: what the broker does
    /// for the jobs a round placed.
    pub fn explanations_of(&self, jobs: &[JobId]) -> Vec<Explanation> {
        let outcomes: Vec<&Explanation> = jobs
            .iter()
            .filter_map(|j| self.explanations.get(j))
            .collect();
        let ids: Vec<JobId> = outcomes.iter().map(|e| e.job).collect();
        outcomes
            .iter()
            .zip(self.details.candidates_of(&ids))
            .map(|(e, candidates)| e.with_candidates(candidates))
            .collect()
    }
}

/// A running attempt the plan takes GPUs from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Preemption {
    /// The victim.
    pub attempt: AttemptId,
    pub job: JobId,
    pub node: NodeId,
    pub gpus: u32,
    /// The urgent job the GPUs go to.
    pub for_job: JobId,
    pub reason: String,
}

/// Why a job is held, as a stable code (the `reason` says it in words).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum HoldCode {
    /// No candidate passes the hard constraints or has capacity.
    #[default]
    NoCandidate,
    /// Every workable candidate costs more than a policy's remaining budget.
    BudgetExhausted,
    /// A policy allows the job's priority to start only in time windows, and now is outside them.
    OutsideTimeWindow,
}

impl HoldCode {
    pub fn as_str(self) -> &'static str {
        match self {
            HoldCode::NoCandidate => "no_candidate",
            HoldCode::BudgetExhausted => "budget_exhausted",
            HoldCode::OutsideTimeWindow => "outside_time_window",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assignment {
    pub job: JobId,
    pub pool: PoolId,
    pub node: NodeId,
    /// The node's GPUs the job takes, by index: as many as it asks for, free on the node
    /// (or held by the attempts this plan preempts for it), and in no other assignment of
    /// the plan. The planner picks the lowest free ones.
    pub gpus: GpuSet,
    pub market: Market,
    /// Estimated cost of the whole run at this placement.
    pub estimated_cost: Money,
    pub estimated_finish: Timestamp,
    /// A multi-node job has one assignment per node, ranks `0..nodes`, all in one pool; each
    /// carries the whole job's cost. Single-node jobs: 0.
    #[serde(default)]
    pub rank: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Launch {
    pub pool: PoolId,
    pub market: Market,
    /// The job this node is launched for.
    pub for_job: JobId,
    /// Estimated cost of the whole run on the launched node (boot included); a multi-node
    /// job's launches each carry the whole job's cost.
    #[serde(default)]
    pub estimated_cost: Money,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hold {
    pub job: JobId,
    pub reason: String,
    #[serde(default)]
    pub code: HoldCode,
}

/// How a candidate would get its capacity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CandidateKind {
    /// A node with the GPUs free now.
    FreeNow,
    /// Wait for running work on an existing node to finish.
    Wait,
    /// Launch a new node (burst).
    Launch,
    /// Take GPUs from low-priority running work (an urgent job whose deadline is at risk).
    Preempt,
}

/// Why a candidate was ruled out or lost.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "code", rename_all = "snake_case")]
pub enum Rejection {
    RegionNotAllowed,
    GpuModelNotAllowed {
        model: String,
    },
    /// The pool's model is not of the accelerator the job asks for (`resources.accelerator`;
    /// absent: not a GPU, e.g. a TPU).
    AcceleratorNotAllowed {
        model: String,
    },
    GpuMemoryTooSmall {
        have_gb: u32,
        need_gb: u32,
    },
    TooFewGpusPerNode {
        have: u32,
        need: u32,
    },
    TooFewCpus {
        have: u32,
        need: u32,
    },
    TooLittleMemory {
        have_gb: u32,
        need_gb: u32,
    },
    OverMaxPrice {
        price_per_hour: Money,
        max_per_hour: Money,
    },
    LatencyTooHigh {
        latency_ms: u32,
        max_ms: u32,
    },
    NoSpotMarket,
    NoCapacity,
    BurstDisabled,
    QuotaReached {
        node_limit: u32,
    },
    MissesDeadline {
        finish: Timestamp,
        deadline: Timestamp,
    },
    /// Feasible but another candidate scored better.
    Outscored,
    /// A team policy does not allow the pool's provider.
    ProviderNotAllowedByPolicy,
    /// A team policy does not allow the pool's region.
    RegionNotAllowedByPolicy,
    /// Over a team policy's most per GPU-hour.
    OverPolicyMaxPrice {
        price_per_gpu_hour: Money,
        max_per_gpu_hour: Money,
    },
    /// A team policy forbids launching new nodes for the team.
    BurstNotAllowedByPolicy,
    /// A `high` or `critical` service takes GPUs back from batch work (a preemption) before it
    /// launches a new node.
    PreemptsBatchWorkFirst,
    /// A team policy lets the job's priority start only in time windows; now is outside them.
    OutsideTimeWindow,
    /// The estimated cost is more than a team policy's remaining budget.
    BudgetExhausted {
        cost: Money,
        remaining: Money,
    },
    /// Cheaper, but the round's joint assignment gave this capacity to other jobs, for a lower
    /// total cost or to meet their deadlines.
    ContendedCapacity,
    /// Cheaper, but on a nearly full on-prem pool whose last GPUs are kept for jobs that cannot
    /// use spot: a job that allows spot is charged `reserve` there in its ranking (it never
    /// pays it), and the winner beat the two together.
    ReservedForJobsWithoutSpot {
        reserve: Money,
    },
}

/// One place a job could go, with the estimates that decided it. A candidate ruled out by a
/// constraint (not merely outscored) carries nominal estimates: what it would be had nothing
/// blocked it (start now, or after the boot time for a launch; plus any data transfer).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Candidate {
    pub pool: PoolId,
    pub region: RegionId,
    pub node: Option<NodeId>,
    pub kind: CandidateKind,
    pub market: Market,
    pub start: Timestamp,
    pub finish: Timestamp,
    pub cost: Money,
    /// `None` for the winner.
    pub rejected: Option<Rejection>,
}

/// What happened to the job this round.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "decision", rename_all = "snake_case")]
pub enum Outcome {
    Assigned {
        node: NodeId,
        pool: PoolId,
    },
    /// Best choice is to wait for capacity that is cheaper than bursting and still meets the
    /// deadline (or no better choice exists yet).
    Wait {
        pool: PoolId,
        expected_start: Timestamp,
    },
    Launch {
        pool: PoolId,
        market: Market,
    },
    Hold {
        reason: String,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Explanation {
    pub job: JobId,
    pub at: Timestamp,
    pub outcome: Outcome,
    /// The candidates considered, winner first, then the other workable ones by score, then
    /// the blocked ones closest-to-feasible first; at most [`MAX_EXPLAINED_CANDIDATES`].
    /// Filled by [`Plan::explanation`] (and [`Planner::explanation`]); empty in
    /// [`Plan::explanations`], which holds outcomes.
    pub candidates: Vec<Candidate>,
}

impl Explanation {
    /// This outcome with `candidates` (an outcome in [`Plan::explanations`] has none).
    fn with_candidates(&self, candidates: Vec<Candidate>) -> Explanation {
        Explanation {
            job: self.job,
            at: self.at,
            outcome: self.outcome.clone(),
            candidates,
        }
    }
}

/// Plans one round. See the module docs for the rules.
///
/// Jobs are decided one at a time in queue order (priority after policy ceilings, then
/// deadline, then submission, then id); each takes the best-scoring candidate given what earlier
/// jobs took this round, except where the joint assignment (`batch`) gave contended free
/// capacity to the jobs it saves most for.
///
/// The decisions need only each job's winner, so the round finds those; the candidate lists
/// are worked out on the first [`Plan::explanation`] call, from a copy of `snapshot` the plan
/// keeps, and are the same as [`Detail::Full`] records. [`plan_shared`] takes the snapshot
/// without copying it.
pub fn plan(snapshot: &Snapshot, now: Timestamp) -> Plan {
    plan_shared(std::sync::Arc::new(snapshot.clone()), now)
}

/// [`plan`] for a snapshot the caller hands over: the plan keeps it to explain itself.
pub fn plan_shared(snapshot: std::sync::Arc<Snapshot>, now: Timestamp) -> Plan {
    let plan = greedy::plan(&snapshot, now, greedy::Scan::Pruned, Detail::Outcomes);
    explained_on_demand(plan, snapshot, now)
}

/// [`plan_shared`] with a [`PlanCache`] kept between rounds (as the broker's scheduler does):
/// the same plan, explanations and all.
pub fn plan_shared_cached(
    cache: &mut PlanCache,
    snapshot: std::sync::Arc<Snapshot>,
    now: Timestamp,
) -> Plan {
    let plan = plan_cached(cache, &snapshot, now, Detail::Outcomes);
    explained_on_demand(plan, snapshot, now)
}

/// `plan` (made with outcomes only) explaining itself on demand from `snapshot`.
fn explained_on_demand(mut plan: Plan, snapshot: std::sync::Arc<Snapshot>, now: Timestamp) -> Plan {
    plan.details =
        explain::Explained::OnDemand(std::sync::Arc::new(explain::Replay::new(snapshot, now)));
    plan
}

/// How much of each job's explanation a plan keeps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Detail {
    /// Every explanation with its candidates ([`Plan::explanation`]), recorded as the round
    /// goes: the round scans past each job's winner for its runners-up.
    #[default]
    Full,
    /// Explanations with their outcomes only (no candidates): for callers that act on the
    /// decisions and show none, such as the simulator. The decisions are those of `Full`.
    Outcomes,
}

/// [`plan`] with a choice of how much to explain. The assignments, launches, preemptions,
/// holds and outcomes are the same whatever the detail; `Outcomes` keeps no candidates
/// ([`Plan::explanation`] gives outcomes only), and since it needs only each job's winner it
/// scans fewer pools.
pub fn plan_with(snapshot: &Snapshot, now: Timestamp, detail: Detail) -> Plan {
    greedy::plan(snapshot, now, greedy::Scan::Pruned, detail)
}

/// [`plan_with`] for a caller that plans round after round: `cache` keeps the index of the
/// snapshot's catalogue (its regions, pools and spot interruption rates) and the order of its
/// nodes, and builds each again only when what it came from changes (compared in full every
/// call). That is most of the work of indexing a round. The plan is the one [`plan_with`] makes.
pub fn plan_cached(
    cache: &mut PlanCache,
    snapshot: &Snapshot,
    now: Timestamp,
    detail: Detail,
) -> Plan {
    let (catalogue, nodes) = cache.get(snapshot);
    let index = index::Index::with_catalogue(
        snapshot,
        now,
        catalogue,
        Some(nodes),
        &mut cache.attempt_nodes,
    );
    greedy::plan_indexed(
        index,
        snapshot,
        greedy::Scan::Pruned,
        detail,
        None,
        &mut cache.capacity,
    )
}

/// A warm planning state for placing jobs one at a time, as they arrive: the snapshot is
/// indexed once, then each [`Planner::place`] decides one job against what is left, as `plan`
/// would for a job at that point of its queue (without the joint assignment). Decisions add up
/// in [`Planner::plan`]. Place each job once.
///
/// Like [`plan`], placing finds the winner only; [`Planner::explanation`] works out the
/// candidate lists by placing the same jobs again, in the same order, from the same snapshot.
pub struct Planner<'a> {
    round: greedy::Round<'a>,
    snapshot: &'a Snapshot,
    /// The jobs placed so far, in order, for the replay.
    placed: Vec<&'a QueuedJob>,
    /// The replay's candidate lists, until the next placement.
    replayed: std::cell::OnceCell<explain::Explained>,
}

impl<'a> Planner<'a> {
    /// Indexes the snapshot's pools, nodes, running work and policies. Its queued jobs are not
    /// placed.
    pub fn new(snapshot: &'a Snapshot, now: Timestamp) -> Planner<'a> {
        let index = index::Index::new(snapshot, now);
        Planner {
            round: greedy::Round::new(index, greedy::Scan::Pruned, Detail::Outcomes),
            snapshot,
            placed: Vec::new(),
            replayed: std::cell::OnceCell::new(),
        }
    }

    /// Decides `job` now, takes what it takes from the warm state, and returns its outcome
    /// (an explanation without candidates: [`Planner::explanation`] has them). The planner
    /// keeps `job` by reference, as it keeps the snapshot, to place it again for an
    /// explanation.
    pub fn place(&mut self, job: &'a QueuedJob) -> &Explanation {
        self.placed.push(job);
        self.replayed.take();
        self.round.place(job)
    }

    /// The explanation of a job placed so far, with its candidates. The first call after a
    /// placement places every job so far again, recording candidates.
    pub fn explanation(&self, job: &JobId) -> Option<Explanation> {
        let e = self.round.plan.explanations.get(job)?;
        let details = self.replayed.get_or_init(|| {
            let index = index::Index::new(self.snapshot, self.round.index.now);
            let mut replay = greedy::Round::new(index, greedy::Scan::Pruned, Detail::Full);
            for &job in &self.placed {
                replay.place(job);
            }
            replay.plan.details
        });
        Some(e.with_candidates(details.candidates(job)))
    }

    /// The decisions so far.
    pub fn plan(&self) -> &Plan {
        &self.round.plan
    }

    pub fn into_plan(self) -> Plan {
        self.round.plan
    }
}

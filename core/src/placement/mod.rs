//! Placement: `plan(snapshot, now) -> Plan`, pure and deterministic.
//!
//! Rules (DESIGN.md "Placement"): hard constraints filter candidates; a candidate's start is
//! `now + wait` (0 on free capacity, the boot time for a new node, or the expected time until
//! enough capacity frees); `finish = start + runtime`; `cost = price × (runtime + boot) + egress`.
//! Objective, in order: no hard constraint broken, deadline met, lowest cost, earliest finish, and
//! ties by id so the result never depends on input order. Waiting for cheaper capacity is a
//! first-class choice: a job waits when waiting still meets its deadline and costs less.
//!
//! Code map: `index` (the snapshot, sorted and indexed), `capacity` (free GPUs, releases and
//! launches as the round goes), `constraints` (hard constraints and markets), `estimate` (one
//! job × one pool → candidates; reusable by a batch optimiser), `greedy` (the per-job loop that
//! decides), `explain` (explanations and hold reasons). This file holds the public types.

mod capacity;
mod constraints;
mod estimate;
mod explain;
mod greedy;
mod index;
#[cfg(test)]
mod tests;

pub use constraints::hard_constraint;

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
    /// One explanation per queued job, keyed by job id.
    pub explanations: BTreeMap<JobId, Explanation>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assignment {
    pub job: JobId,
    pub pool: PoolId,
    pub node: NodeId,
    pub gpus: u32,
    pub market: Market,
    /// Estimated cost of the whole run at this placement.
    pub estimated_cost: Money,
    pub estimated_finish: Timestamp,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Launch {
    pub pool: PoolId,
    pub market: Market,
    /// The job this node is launched for.
    pub for_job: JobId,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hold {
    pub job: JobId,
    pub reason: String,
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
}

/// Why a candidate was ruled out or lost.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "code", rename_all = "snake_case")]
pub enum Rejection {
    RegionNotAllowed,
    GpuModelNotAllowed {
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
    pub candidates: Vec<Candidate>,
}

/// Plans one round. See the module docs for the rules.
///
/// Jobs are taken one at a time in queue order (priority, then deadline, then submission, then
/// id); each takes the best-scoring candidate given what earlier jobs took this round.
pub fn plan(snapshot: &Snapshot, now: Timestamp) -> Plan {
    greedy::plan(snapshot, now, greedy::Scan::Pruned)
}

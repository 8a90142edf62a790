//! The per-job greedy planner: jobs in queue order, each taking its best candidate given what
//! the jobs before it took this round. It owns the decisions — assignment, launch, wait or hold —
//! and the bookkeeping that follows them; what a pool offers is `estimate`'s business, what is
//! shown `explain`'s. A batch optimiser would replace this loop and keep the rest.

use super::capacity::Capacity;
use super::estimate::{Blocked, Estimate, JobCtx, ScanBound, evaluate};
use super::explain::{candidates, hold_reason, keep_best};
use super::index::Index;
use super::{
    Assignment, Candidate, CandidateKind, Explanation, Hold, Launch, MAX_EXPLAINED_CANDIDATES,
    Outcome, Plan,
};
use crate::domain::{QueuedJob, Snapshot};
use crate::time::Timestamp;
use std::cmp::Ordering;

/// Hold reason for jobs that ask for more than one node (the broker refuses them at submit).
const MULTI_NODE_HOLD_REASON: &str = "multi-node jobs are not supported yet";

/// How many pools each job looks at. Both give the same plan; tests check that they do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Scan {
    /// Cheapest pools first, stopping once the rest cannot matter ([`ScanBound`]).
    Pruned,
    /// Every pool, for every job.
    #[cfg_attr(not(test), allow(dead_code))]
    Exhaustive,
}

pub(crate) fn plan(snapshot: &Snapshot, now: Timestamp, scan: Scan) -> Plan {
    let index = Index::new(snapshot, now);
    let mut queue: Vec<&QueuedJob> = snapshot.queued.iter().collect();
    queue.sort_by(|a, b| queue_order(a, b));
    let mut round = Round {
        capacity: Capacity::new(&index),
        index,
        scan,
        plan: Plan::default(),
        viable: Vec::new(),
        blocked: Vec::new(),
    };
    for job in queue {
        let explanation = round.place(job);
        round.plan.explanations.insert(job.id, explanation);
    }
    round.plan
}

/// Queue order: priority (critical first), deadline (none last), submission, id.
fn queue_order(a: &QueuedJob, b: &QueuedJob) -> Ordering {
    let deadline = |j: &QueuedJob| (j.spec.deadline.is_none(), j.spec.deadline);
    b.spec
        .priority
        .cmp(&a.spec.priority)
        .then_with(|| deadline(a).cmp(&deadline(b)))
        .then_with(|| a.submitted_at.cmp(&b.submitted_at))
        .then_with(|| a.id.cmp(&b.id))
}

struct Round<'a> {
    index: Index<'a>,
    capacity: Capacity,
    scan: Scan,
    plan: Plan,
    /// Scratch buffers for one job's candidates, reused across jobs.
    viable: Vec<Estimate>,
    blocked: Vec<Blocked>,
}

impl Round<'_> {
    /// Decides one job: records its assignment, launch or hold and returns its explanation.
    fn place(&mut self, job: &QueuedJob) -> Explanation {
        if job.spec.resources.nodes > 1 {
            return self.hold(job, MULTI_NODE_HOLD_REASON.into(), Vec::new());
        }
        let ctx = JobCtx::new(&self.index, &job.spec);
        self.evaluate_pools(&ctx);
        keep_best(&mut self.viable, MAX_EXPLAINED_CANDIDATES, |e| e.score);
        let Some(&winner) = self.viable.first() else {
            let reason = hold_reason(&self.blocked);
            keep_best(&mut self.blocked, MAX_EXPLAINED_CANDIDATES, |b| {
                b.order_key()
            });
            let shown = candidates(&self.index, &ctx, &self.viable, &self.blocked);
            return self.hold(job, reason, shown);
        };
        let room = MAX_EXPLAINED_CANDIDATES - self.viable.len();
        keep_best(&mut self.blocked, room, |b| b.order_key());
        let shown = candidates(&self.index, &ctx, &self.viable, &self.blocked);
        let outcome = self.commit(job, &ctx, winner);
        Explanation {
            job: job.id,
            at: self.index.now,
            outcome,
            candidates: shown,
        }
    }

    /// Fills `viable` and `blocked` with what the pools offer the job. Pruned, it takes the
    /// cheapest pools first and stops when the rest cannot change what the job gets or what
    /// its explanation shows; a job nothing can take still sees every pool, so its hold reason
    /// counts them all.
    fn evaluate_pools(&mut self, ctx: &JobCtx) {
        self.viable.clear();
        self.blocked.clear();
        let mut bound = ScanBound::new(MAX_EXPLAINED_CANDIDATES);
        for &(gpu_price, pool) in self.index.pools_by_price(ctx.spec.spot) {
            if self.scan == Scan::Pruned && bound.excludes(gpu_price, |p| ctx.min_cost(p)) {
                break;
            }
            let before = self.viable.len();
            let (index, capacity) = (&self.index, &mut self.capacity);
            evaluate(
                index,
                capacity,
                ctx,
                pool,
                &mut self.viable,
                &mut self.blocked,
            );
            self.viable[before..].iter().for_each(|e| bound.offer(e));
        }
    }

    /// Acts on the winner: takes the node's GPUs, or plans the launch, or just waits.
    fn commit(&mut self, job: &QueuedJob, ctx: &JobCtx, winner: Estimate) -> Outcome {
        let s = winner.score;
        let pool = self.index.pools[s.pool].pool;
        match (s.kind, s.node) {
            (CandidateKind::FreeNow, Some(node)) => {
                let until = ctx.releases_at(s.finish);
                self.capacity.assign(&self.index, node, ctx.gpus, until);
                let node = self.index.nodes[node].id.clone();
                self.plan.assignments.push(Assignment {
                    job: job.id,
                    pool: pool.id.clone(),
                    node: node.clone(),
                    gpus: ctx.gpus,
                    market: winner.market,
                    estimated_cost: s.cost,
                    estimated_finish: s.finish,
                });
                Outcome::Assigned {
                    node,
                    pool: pool.id.clone(),
                }
            }
            (CandidateKind::Launch, _) => {
                self.capacity.launch(s.pool);
                self.plan.launches.push(Launch {
                    pool: pool.id.clone(),
                    market: winner.market,
                    for_job: job.id,
                });
                Outcome::Launch {
                    pool: pool.id.clone(),
                    market: winner.market,
                }
            }
            // Waiting reserves nothing: the job is planned again next round. (A free-now
            // candidate always names its node; without one it could only wait.)
            (CandidateKind::Wait, _) | (CandidateKind::FreeNow, None) => Outcome::Wait {
                pool: pool.id.clone(),
                expected_start: winner.start,
            },
        }
    }

    fn hold(&mut self, job: &QueuedJob, reason: String, shown: Vec<Candidate>) -> Explanation {
        self.plan.holds.push(Hold {
            job: job.id,
            reason: reason.clone(),
        });
        Explanation {
            job: job.id,
            at: self.index.now,
            outcome: Outcome::Hold { reason },
            candidates: shown,
        }
    }
}

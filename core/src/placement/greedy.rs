//! The per-job planner: jobs in queue order, each taking its best candidate given what the jobs
//! before it took this round. It owns the decisions — assignment, launch, preemption, wait or
//! hold — and the bookkeeping that follows them (capacity, budgets); what a pool offers is
//! `estimate`'s business, what is shown `explain`'s. `batch` may pin jobs first; this loop
//! carries the pins out through the same checks.

use super::batch::Pin;
use super::capacity::Capacity;
use super::constraints::Reject;
use super::estimate::{Blocked, Estimate, JobCtx, PREEMPTION_GRACE_S, ScanBound, evaluate};
use super::explain::{candidates, hold_reason, keep_best};
use super::index::Index;
use super::policy::{Budgets, JobPolicy};
use super::preempt::best_preemption;
use super::{
    Assignment, Candidate, CandidateKind, Explanation, Hold, HoldCode, Launch,
    MAX_EXPLAINED_CANDIDATES, Outcome, Plan, Preemption,
};
use crate::domain::{QueuedJob, Snapshot};
use crate::money::Money;
use crate::time::Timestamp;
use std::cmp::Reverse;
use std::collections::HashMap;

/// How many pools each job looks at. Both give the same plan; tests check that they do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Scan {
    /// Cheapest pools first, stopping once the rest cannot matter ([`ScanBound`]).
    Pruned,
    /// Every pool, for every job.
    #[cfg_attr(not(test), allow(dead_code))]
    Exhaustive,
}

/// The queue in the order the loop takes it: priority after policy ceilings (critical first),
/// deadline (none last), submission, id.
pub(crate) fn queue<'s>(index: &Index, snapshot: &'s Snapshot) -> Vec<&'s QueuedJob> {
    let mut keyed: Vec<_> = snapshot
        .queued
        .iter()
        .map(|j| {
            let priority = if index.policies.is_empty() {
                j.spec.priority
            } else {
                JobPolicy::new(&index.policies, &j.spec, index.now).priority
            };
            let key = (
                Reverse(priority),
                j.spec.deadline.is_none(),
                j.spec.deadline,
                j.submitted_at,
                j.id,
            );
            (key, j)
        })
        .collect();
    keyed.sort_unstable_by_key(|a| a.0);
    keyed.into_iter().map(|(_, j)| j).collect()
}

/// Plans the queue per job and, where free capacity is contended, again with the joint
/// assignment's pins; keeps the pinned plan only when it is better by [`Objective`]. (The
/// joint assignment prices each job's way out against the round's starting capacity; it cannot
/// see that a displaced job could have waited for a job placed this round, so it is checked
/// against the per-job plan rather than trusted.)
pub(crate) fn plan(snapshot: &Snapshot, now: Timestamp, scan: Scan) -> Plan {
    let mut round = Round::new(Index::new(snapshot, now), scan);
    let queue = queue(&round.index, snapshot);
    let pins = super::batch::pins(&mut round, &queue);
    for &job in &queue {
        round.place(job);
    }
    if pins.is_empty() {
        return round.plan;
    }
    let per_job = (round.objective, round.reset());
    round.pins = pins;
    for &job in &queue {
        round.place(job);
    }
    if round.objective < per_job.0 {
        round.plan
    } else {
        per_job.1
    }
}

/// How good a round's plan is, field order being priority order: fewer jobs held, fewer
/// deadlines missed, less estimated cost (of every job's chosen candidate, waits included).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Objective {
    holds: u32,
    misses: u32,
    cost: Money,
}

/// One round's warm state: the index, what is left of capacity and budgets, and the plan so
/// far. [`super::Planner`] keeps one between calls.
pub(crate) struct Round<'a> {
    pub index: Index<'a>,
    pub capacity: Capacity,
    budgets: Budgets,
    scan: Scan,
    pub plan: Plan,
    /// Decisions the joint assignment made for some jobs (see `batch`).
    pub pins: HashMap<crate::domain::JobId, Pin>,
    /// Scratch buffers for one job's candidates, reused across jobs.
    pub viable: Vec<Estimate>,
    pub blocked: Vec<Blocked>,
    objective: Objective,
}

impl<'a> Round<'a> {
    pub(crate) fn new(index: Index<'a>, scan: Scan) -> Round<'a> {
        Round {
            capacity: Capacity::new(&index),
            budgets: Budgets::new(&index.policies),
            index,
            scan,
            plan: Plan::default(),
            pins: HashMap::new(),
            viable: Vec::new(),
            blocked: Vec::new(),
            objective: Objective::default(),
        }
    }

    /// Back to the start of the round, pins dropped; returns the plan made so far.
    fn reset(&mut self) -> Plan {
        self.capacity = Capacity::new(&self.index);
        self.budgets = Budgets::new(&self.index.policies);
        self.pins.clear();
        self.objective = Objective::default();
        std::mem::take(&mut self.plan)
    }

    /// Decides one job: records its assignment, launch or hold and its explanation, and
    /// returns the explanation.
    pub(crate) fn place(&mut self, job: &QueuedJob) -> &Explanation {
        let explanation = self.decide(job);
        match self.plan.explanations.entry(job.id) {
            std::collections::btree_map::Entry::Occupied(mut e) => {
                e.insert(explanation);
                e.into_mut()
            }
            std::collections::btree_map::Entry::Vacant(e) => e.insert(explanation),
        }
    }

    fn decide(&mut self, job: &QueuedJob) -> Explanation {
        let ctx = JobCtx::new(&self.index, &job.spec);
        let remaining = self.budgets.remaining(&ctx.policy);
        self.evaluate_pools(&ctx, Some(job.id));
        let mut victims = Vec::new();
        let best = self.viable.iter().min_by_key(|e| e.score).copied();
        if ctx.policy.window_open && ctx.may_preempt(best.as_ref()) {
            let any_finish = best.is_none();
            if let Some((e, v)) = best_preemption(&self.index, &self.capacity, &ctx, any_finish) {
                match remaining {
                    Some(left) if e.score.cost > left => self.blocked.push(Blocked {
                        pool: e.score.pool,
                        kind: CandidateKind::Preempt,
                        reject: Reject::BudgetExhausted {
                            cost: e.score.cost,
                            remaining: left,
                        },
                    }),
                    _ => {
                        self.viable.push(e);
                        victims = v;
                    }
                }
            }
        }
        keep_best(&mut self.viable, MAX_EXPLAINED_CANDIDATES, |e| e.score);
        // The joint assignment's choice goes first; the better-scored ones it displaced lost
        // their capacity to other jobs.
        let displaced = self.pinned_winner(job).unwrap_or(0);
        if displaced > 0 {
            self.viable[..=displaced].rotate_right(1);
        }
        let Some(&winner) = self.viable.first() else {
            self.objective.holds += 1;
            let code = hold_code(&ctx, &self.blocked);
            let reason = hold_reason(&self.blocked);
            keep_best(&mut self.blocked, MAX_EXPLAINED_CANDIDATES, |b| {
                b.order_key()
            });
            let shown = candidates(&self.index, &ctx, &self.viable, 0, &self.blocked);
            return self.hold(job, code, reason, shown);
        };
        let room = MAX_EXPLAINED_CANDIDATES - self.viable.len();
        keep_best(&mut self.blocked, room, |b| b.order_key());
        let shown = candidates(&self.index, &ctx, &self.viable, displaced, &self.blocked);
        self.objective.misses += u32::from(winner.score.misses_deadline);
        self.objective.cost += winner.score.cost;
        let outcome = self.commit(job, &ctx, winner, &victims);
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
    ///
    /// The joint assignment's pins (for `job`) and the policy rules that depend on the
    /// candidate are applied as pools are scanned, so pruning counts only what is workable.
    fn evaluate_pools(&mut self, ctx: &JobCtx, job: Option<crate::domain::JobId>) {
        self.viable.clear();
        self.blocked.clear();
        let remaining = self.budgets.remaining(&ctx.policy);
        let elsewhere = match job.and_then(|j| self.pins.get(&j)) {
            Some(Pin::Elsewhere(pools)) => pools.as_slice(),
            _ => &[],
        };
        let mut bound = ScanBound::new(MAX_EXPLAINED_CANDIDATES);
        for &(gpu_price, pool) in self.index.pools_by_price(ctx.spot) {
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
            filter(&mut self.viable, before, &mut self.blocked, |e| {
                candidate_rule(ctx, remaining, elsewhere, e)
            });
            self.viable[before..].iter().for_each(|e| bound.offer(e));
        }
    }

    /// Evaluates the job against the capacity as it stands, with its policy rules, for the
    /// joint assignment: `viable` holds what it could take.
    pub(crate) fn evaluate_for_batch(&mut self, ctx: &JobCtx) {
        self.evaluate_pools(ctx, None);
    }

    /// Position in `viable` (best first) of the free-now candidate the joint assignment gave
    /// the job, when it is still there.
    fn pinned_winner(&self, job: &QueuedJob) -> Option<usize> {
        let Some(Pin::Pool(pool)) = self.pins.get(&job.id) else {
            return None;
        };
        self.viable
            .iter()
            .position(|e| e.score.kind == CandidateKind::FreeNow && e.score.pool == *pool)
    }

    /// Acts on the winner: takes the nodes' GPUs (stopping victims first), or plans the
    /// launches, or just waits.
    fn commit(
        &mut self,
        job: &QueuedJob,
        ctx: &JobCtx,
        winner: Estimate,
        victims: &[usize],
    ) -> Outcome {
        let s = winner.score;
        let pool = self.index.pools[s.pool].pool;
        let until = ctx.releases_at(s.finish);
        let nodes: Vec<usize> = match (s.kind, s.node) {
            (CandidateKind::FreeNow, Some(node)) if ctx.nodes > 1 => self
                .capacity
                .best_fit_n(s.pool, ctx.gpus, ctx.nodes)
                .unwrap_or_else(|| vec![node]),
            (CandidateKind::FreeNow | CandidateKind::Preempt, Some(node)) => vec![node],
            (CandidateKind::Launch, _) => {
                for _ in 0..ctx.nodes {
                    self.capacity.launch(s.pool);
                    self.plan.launches.push(Launch {
                        pool: pool.id.clone(),
                        market: winner.market,
                        for_job: job.id,
                    });
                }
                self.budgets.spend(&ctx.policy, s.cost);
                return Outcome::Launch {
                    pool: pool.id.clone(),
                    market: winner.market,
                };
            }
            // Waiting reserves nothing: the job is planned again next round.
            _ => {
                return Outcome::Wait {
                    pool: pool.id.clone(),
                    expected_start: winner.start,
                };
            }
        };
        if s.kind == CandidateKind::Preempt {
            let grace_end = self.index.now.plus_secs(PREEMPTION_GRACE_S);
            self.capacity
                .preempt(&self.index, nodes[0], victims, ctx.gpus, grace_end, until);
            for &a in victims {
                let (node, attempt) = self.index.running[a];
                self.plan.preemptions.push(Preemption {
                    attempt: attempt.attempt,
                    job: attempt.job,
                    node: self.index.nodes[node].id.clone(),
                    gpus: attempt.gpus,
                    for_job: job.id,
                    reason: format!(
                        "a {} job would miss its deadline without these GPUs",
                        ctx.priority.as_str()
                    ),
                });
            }
        } else {
            for &node in &nodes {
                self.capacity.assign(&self.index, node, ctx.gpus, until);
            }
        }
        self.budgets.spend(&ctx.policy, s.cost);
        for (rank, &node) in nodes.iter().enumerate() {
            self.plan.assignments.push(Assignment {
                job: job.id,
                pool: pool.id.clone(),
                node: self.index.nodes[node].id.clone(),
                gpus: ctx.gpus,
                market: winner.market,
                estimated_cost: s.cost,
                estimated_finish: s.finish,
                rank: u32::try_from(rank).unwrap_or(u32::MAX),
            });
        }
        Outcome::Assigned {
            node: self.index.nodes[nodes[0]].id.clone(),
            pool: pool.id.clone(),
        }
    }

    fn hold(
        &mut self,
        job: &QueuedJob,
        code: HoldCode,
        reason: String,
        shown: Vec<Candidate>,
    ) -> Explanation {
        self.plan.holds.push(Hold {
            job: job.id,
            reason: reason.clone(),
            code,
        });
        Explanation {
            job: job.id,
            at: self.index.now,
            outcome: Outcome::Hold { reason },
            candidates: shown,
        }
    }
}

/// Why a workable candidate is still out: the joint assignment kept the job off that pool's
/// free capacity; or a policy rule — nothing starts outside the job's time windows, nothing
/// costs more than its remaining budget (waiting spends nothing now but will, so it is held to
/// the budget too).
fn candidate_rule(
    ctx: &JobCtx,
    remaining: Option<Money>,
    elsewhere: &[usize],
    e: &Estimate,
) -> Option<Reject> {
    if e.score.kind == CandidateKind::FreeNow && elsewhere.binary_search(&e.score.pool).is_ok() {
        return Some(Reject::ContendedCapacity);
    }
    if !ctx.policy.window_open {
        return Some(Reject::OutsideTimeWindow);
    }
    remaining
        .filter(|&left| e.score.cost > left)
        .map(|left| Reject::BudgetExhausted {
            cost: e.score.cost,
            remaining: left,
        })
}

/// Moves the candidates from `from` on that `rule` rules out to `blocked`.
fn filter(
    viable: &mut Vec<Estimate>,
    from: usize,
    blocked: &mut Vec<Blocked>,
    rule: impl Fn(&Estimate) -> Option<Reject>,
) {
    let mut i = from;
    while i < viable.len() {
        match rule(&viable[i]) {
            Some(reject) => {
                let e = viable.swap_remove(i);
                blocked.push(Blocked {
                    pool: e.score.pool,
                    kind: e.score.kind,
                    reject,
                });
            }
            None => i += 1,
        }
    }
}

/// The code of a hold: the policy rule that blocked workable candidates, if one did.
fn hold_code(ctx: &JobCtx, blocked: &[Blocked]) -> HoldCode {
    if !ctx.policy.window_open
        && blocked
            .iter()
            .any(|b| b.reject == Reject::OutsideTimeWindow)
    {
        HoldCode::OutsideTimeWindow
    } else if blocked
        .iter()
        .any(|b| matches!(b.reject, Reject::BudgetExhausted { .. }))
    {
        HoldCode::BudgetExhausted
    } else {
        HoldCode::NoCandidate
    }
}

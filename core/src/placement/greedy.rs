//! The per-job planner: jobs in queue order, each taking its best candidate given what the jobs
//! before it took this round. It owns the decisions — assignment, launch, preemption, wait or
//! hold — and the bookkeeping that follows them (capacity, budgets); what a pool offers is
//! `estimate`'s business, what is shown `explain`'s. `batch` may pin jobs first; this loop
//! carries the pins out through the same checks.

use super::batch::Pin;
use super::capacity::{Capacity, Markets};
use super::constraints::Reject;
use super::estimate::{
    Blocked, Estimate, JobCtx, PREEMPTION_GRACE_S, ScanBound, Score, evaluate, on_demand_nodes,
    static_block,
};
use super::explain::{Details, Explained, hold_reason, keep_best};
use super::index::{IdMap, Index, PoolMask, PriceOrder, Victims};
use super::policy::{Budgets, JobPolicy};
use super::preempt::best_preemption;
use super::{
    Assignment, CandidateKind, Detail, Explanation, Hold, HoldCode, Launch,
    MAX_EXPLAINED_CANDIDATES, Outcome, Plan, Preemption,
};
use crate::domain::{Market, QueuedJob, Snapshot};
use crate::money::Money;
use crate::time::Timestamp;
use std::cmp::Reverse;

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
pub(crate) fn plan(snapshot: &Snapshot, now: Timestamp, scan: Scan, detail: Detail) -> Plan {
    plan_recording(snapshot, now, scan, detail, None)
}

/// [`plan`] recording candidate lists for the jobs in `only` alone (with [`Detail::Full`]):
/// the same decisions, at about the cost of outcomes only when `only` is small.
pub(crate) fn plan_recording(
    snapshot: &Snapshot,
    now: Timestamp,
    scan: Scan,
    detail: Detail,
    only: Option<IdMap<crate::domain::JobId, ()>>,
) -> Plan {
    let index = Index::new(snapshot, now);
    plan_indexed(index, snapshot, scan, detail, only, &mut None)
}

/// [`plan_recording`] on `snapshot` indexed. The round's capacity is built in `spare`'s
/// buffers when it holds some, and left there for the next round.
pub(crate) fn plan_indexed<'a>(
    index: Index<'a>,
    snapshot: &'a Snapshot,
    scan: Scan,
    detail: Detail,
    only: Option<IdMap<crate::domain::JobId, ()>>,
    spare: &mut Option<Capacity>,
) -> Plan {
    let mut round = Round::with_capacity(index, scan, detail, spare.take());
    round.only = only;
    let plan = plan_round(&mut round, snapshot);
    *spare = Some(round.capacity);
    plan
}

fn plan_round(round: &mut Round, snapshot: &Snapshot) -> Plan {
    let queue = queue(&round.index, snapshot);
    let start_free: Vec<[u32; 2]> = (0..round.index.pools.len())
        .map(|p| round.capacity.most_free_by_market(&round.index, p))
        .collect();
    for &job in &queue {
        round.place(job);
    }
    if !contended(round, &queue, &start_free) {
        // No job was kept off free capacity it wanted: the joint assignment would pin nothing.
        return std::mem::take(&mut round.plan);
    }
    let per_job = (round.objective, round.reset());
    let pins = super::batch::pins(round, &queue);
    if pins.is_empty() || pins_kept(&per_job.1, &round.index, &pins) {
        // Pins the per-job plan already keeps would give it again, to the same objective.
        return per_job.1;
    }
    round.pins = pins;
    for &job in &queue {
        round.place(job);
    }
    if round.objective < per_job.0 {
        std::mem::take(&mut round.plan)
    } else {
        per_job.1
    }
}

/// [`plan`] without the shortcut past the joint assignment: the reference it must agree with.
#[cfg(test)]
pub(crate) fn plan_always_batched(snapshot: &Snapshot, now: Timestamp, scan: Scan) -> Plan {
    let mut round = Round::new(Index::new(snapshot, now), scan, Detail::Full);
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

/// After the per-job pass: whether free capacity may have been contended, so that the joint
/// assignment could pin anything. It cannot when every pool that had room at the start for
/// some job still has room for the largest of those jobs at the end, on nodes of each market
/// apart (some jobs may take only one market's nodes): a job whose best choice was free
/// capacity in a pool then found it still there at its turn, at the same cost, and took it, so
/// no pool was wanted beyond what it had.
/// Budgets and preemption can change a job's choice during the pass, so with them this says
/// yes.
fn contended(round: &mut Round, queue: &[&QueuedJob], start_free: &[[u32; 2]]) -> bool {
    if round
        .index
        .policies
        .iter()
        .any(|p| p.remaining_budget.is_some())
        || round.index.preemptible_nodes[Victims::LowThenNormal as usize]
            .iter()
            .any(|n| !n.is_empty())
    {
        return true;
    }
    let mut sizes: Vec<u32> = queue
        .iter()
        .filter(|j| j.spec.resources.nodes <= 1)
        .map(|j| j.spec.resources.gpus)
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    let (index, capacity) = (&round.index, &mut round.capacity);
    start_free.iter().enumerate().any(|(pool, free)| {
        [Market::OnDemand, Market::Spot]
            .into_iter()
            .zip(free)
            .any(|(market, &free)| {
                let fitting = sizes.partition_point(|&g| g <= free);
                let only = Markets::only(market);
                fitting > 0
                    && (capacity)
                        .best_fit_in(index, pool, sizes[fitting - 1], only)
                        .is_none()
            })
    })
}

/// Whether `plan` already does what every pin says: the job took free capacity in its pinned
/// pool, or none in the pools it was to leave to others.
fn pins_kept(plan: &Plan, index: &Index, pins: &IdMap<crate::domain::JobId, Pin>) -> bool {
    pins.iter().all(|(job, pin)| {
        let taken = match plan.explanations.get(job).map(|e| &e.outcome) {
            Some(Outcome::Assigned { pool, .. }) => Some(pool),
            _ => None,
        };
        let is = |p: usize| taken == Some(&index.pools[p].pool.id);
        match pin {
            Pin::Pool(p) => is(*p),
            Pin::Elsewhere(pools) => !pools.iter().any(|&p| is(p)),
        }
    })
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
    detail: Detail,
    pub plan: Plan,
    /// Decisions the joint assignment made for some jobs (see `batch`).
    pub pins: IdMap<crate::domain::JobId, Pin>,
    /// Scratch buffers for one job's candidates, reused across jobs.
    pub viable: Vec<Estimate>,
    pub blocked: Vec<Blocked>,
    /// Scratch: the positions a job's scan looks at, and those of one phase of it.
    mask: PoolMask,
    phase: PoolMask,
    /// Scratch: the pools (by index, not price position) `batch_candidates` evaluated in full.
    evaluated: PoolMask,
    /// Scratch: the heap of a scan's bound ([`ScanBound::reusing`]).
    bound: std::collections::BinaryHeap<Score>,
    objective: Objective,
    /// With [`Detail::Full`], the jobs whose candidates are recorded (`None`: every job).
    only: Option<IdMap<crate::domain::JobId, ()>>,
}

impl<'a> Round<'a> {
    pub(crate) fn new(index: Index<'a>, scan: Scan, detail: Detail) -> Round<'a> {
        Round::with_capacity(index, scan, detail, None)
    }

    /// [`Round::new`] building its capacity in `spare`'s buffers, when given.
    pub(crate) fn with_capacity(
        index: Index<'a>,
        scan: Scan,
        detail: Detail,
        spare: Option<Capacity>,
    ) -> Round<'a> {
        let capacity = match spare {
            Some(mut c) => {
                c.rebuild(&index);
                c
            }
            None => Capacity::new(&index),
        };
        let plan = Plan {
            details: match detail {
                Detail::Full => Explained::Recorded(Details::new(&index)),
                Detail::Outcomes => Explained::Nothing,
            },
            ..Plan::default()
        };
        Round {
            capacity,
            budgets: Budgets::new(&index.policies),
            index,
            scan,
            detail,
            plan,
            pins: IdMap::default(),
            viable: Vec::new(),
            blocked: Vec::new(),
            mask: PoolMask::default(),
            phase: PoolMask::default(),
            evaluated: PoolMask::default(),
            bound: std::collections::BinaryHeap::new(),
            objective: Objective::default(),
            only: None,
        }
    }

    /// Whether the round records `job`'s candidates.
    fn records(&self, job: crate::domain::JobId) -> bool {
        self.detail == Detail::Full && self.only.as_ref().is_none_or(|o| o.contains_key(&job))
    }

    /// Back to the start of the round, pins dropped; returns the plan made so far.
    pub(crate) fn reset(&mut self) -> Plan {
        self.capacity.restore(&self.index);
        self.budgets = Budgets::new(&self.index.policies);
        self.pins.clear();
        self.objective = Objective::default();
        let details = match &self.plan.details {
            Explained::Recorded(d) => Explained::Recorded(d.emptied()),
            _ => Explained::Nothing,
        };
        std::mem::replace(
            &mut self.plan,
            Plan {
                details,
                ..Plan::default()
            },
        )
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
        let mut ctx = JobCtx::new(&self.index, &job.spec, job.deadline_runtime_s);
        ctx.avoid = self.index.avoided(job.id);
        let remaining = self.budgets.remaining(&ctx.policy);
        let full = self.records(job.id);
        // Without candidate lists only the winner matters, unless the joint assignment pinned
        // the job to a pool: the winner is then looked for among the best few.
        let keep = if full || matches!(self.pins.get(&job.id), Some(Pin::Pool(_))) {
            MAX_EXPLAINED_CANDIDATES
        } else {
            1
        };
        // A `high` or `critical` service looks at the nodes there are, and at the batch work it
        // could stop on them, before it looks at new nodes.
        ctx.defer_launch = ctx.preempts_before_bursting() && ctx.policy.window_open;
        self.evaluate_pools(&ctx, Some(job.id), keep);
        self.on_demand_fallback(&ctx, Some(job.id));
        let mut victims = self.preemption(&ctx, remaining);
        if ctx.defer_launch {
            // Free now, a preemption, or GPUs a preemption is freeing (a wait no longer than
            // its grace period): no new node.
            let soon = self.index.now.plus_secs(PREEMPTION_GRACE_S);
            let best = self.viable.iter().min_by_key(|e| e.score);
            let now = best.is_some_and(|e| match e.score.kind {
                CandidateKind::FreeNow | CandidateKind::Preempt => true,
                CandidateKind::Wait => e.ready <= soon,
                CandidateKind::Launch => false,
            });
            if !now {
                // Nothing runs it now without a new node: weigh new nodes too, as for any job.
                ctx.defer_launch = false;
                self.evaluate_pools(&ctx, Some(job.id), keep);
                self.on_demand_fallback(&ctx, Some(job.id));
                victims = self.preemption(&ctx, remaining);
            }
        }
        if keep == 1 {
            // Only the winner is wanted: the best to the front, no sort (scores are unique).
            if let Some(best) = (0..self.viable.len()).min_by_key(|&i| self.viable[i].score) {
                self.viable.swap(0, best);
                self.viable.truncate(1);
            }
        } else {
            keep_best(&mut self.viable, MAX_EXPLAINED_CANDIDATES, |e| e.score);
        }
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
            if full {
                keep_best(&mut self.blocked, MAX_EXPLAINED_CANDIDATES, |b| {
                    b.order_key()
                });
                let (index, viable, blocked) = (&self.index, &self.viable, &self.blocked);
                if let Explained::Recorded(d) = &mut self.plan.details {
                    d.record(index, &ctx, job.id, viable, 0, blocked);
                }
            }
            return self.hold(job, code, reason);
        };
        if full {
            let room = MAX_EXPLAINED_CANDIDATES - self.viable.len();
            keep_best(&mut self.blocked, room, |b| b.order_key());
            let (index, viable, blocked) = (&self.index, &self.viable, &self.blocked);
            if let Explained::Recorded(d) = &mut self.plan.details {
                d.record(index, &ctx, job.id, viable, displaced, blocked);
            }
        }
        self.objective.misses += u32::from(winner.score.misses_deadline);
        self.objective.cost += winner.score.cost;
        let outcome = self.commit(job, &ctx, winner, &victims);
        Explanation {
            job: job.id,
            at: self.index.now,
            outcome,
            candidates: Vec::new(),
        }
    }

    /// Fills `viable` and `blocked` with what the pools offer the job. Pruned, it takes the
    /// cheapest pools first and stops when the rest cannot change what the job gets or what
    /// its explanation shows; a job nothing can take still sees every pool, so its hold reason
    /// counts them all.
    ///
    /// The joint assignment's pins (for `job`) and the policy rules that depend on the
    /// candidate are applied as pools are scanned, so pruning counts only what is workable.
    /// Adds the job's best preemption to the viable candidates when it may preempt, and gives
    /// its victims (none otherwise); one over the job's remaining budget is blocked instead.
    fn preemption(&mut self, ctx: &JobCtx, remaining: Option<Money>) -> Vec<usize> {
        let best = self.viable.iter().min_by_key(|e| e.score).copied();
        if !(ctx.policy.window_open && ctx.may_preempt(best.as_ref())) {
            return Vec::new();
        }
        let any_finish = best.is_none();
        let Some((e, victims)) = best_preemption(&self.index, &self.capacity, ctx, any_finish)
        else {
            return Vec::new();
        };
        match remaining {
            Some(left) if e.cost() > left => {
                self.blocked.push(Blocked::worked(
                    &e,
                    Reject::BudgetExhausted {
                        cost: e.cost(),
                        remaining: left,
                    },
                ));
                Vec::new()
            }
            _ => {
                self.viable.push(e);
                victims
            }
        }
    }

    fn evaluate_pools(&mut self, ctx: &JobCtx, job: Option<crate::domain::JobId>, keep: usize) {
        self.viable.clear();
        self.blocked.clear();
        let remaining = self.budgets.remaining(&ctx.policy);
        let elsewhere = pinned_elsewhere(&self.pins, job);
        let mut bound = ScanBound::reusing(keep, std::mem::take(&mut self.bound));
        let order = &self.index.price_orders()[ctx.scan_order()];
        let pruned = self.scan == Scan::Pruned;
        // Pruned, the scan skips the pools the job's own constraints rule out; it looks at them
        // only if it ends up needing every blocked candidate.
        let mut restricted = pruned && ctx.scan_mask(order, &mut self.mask);
        if !restricted {
            self.mask.fill_to(order.pools.len());
        }
        // Pruned, a gang skips the pools that cannot hold it: fewer nodes than it needs, and no
        // room under the quota to launch them all (a 100-node gang and 64-node cloud pools).
        // They offer it nothing; the pools left out are looked at as the constraints' are.
        if pruned && ctx.nodes > 1 {
            for (pos, &(_, pool)) in order.pools.iter().enumerate() {
                if self.mask.contains(pos) && !holds_gang(&self.index, &self.capacity, ctx, pool) {
                    self.mask.set(pos, false);
                    restricted = true;
                }
            }
        }
        // Pruned, a price tier of several pools is scanned in two passes: first its pools with
        // capacity free now for the job, then the others, whose candidates (waits, launches)
        // rank after a free-now one of the same cost; the bound often stops the second pass.
        let order_id = ctx.scan_order();
        let split =
            pruned && ctx.nodes == 1 && self.capacity.free_now(order_id, ctx.gpus).is_some();
        // Pruned, a job with data elsewhere scans the pools in its data's region first, then
        // the others, bounded with the egress and transfer time every one of them adds.
        let away = ctx.away(&self.index).filter(|_| pruned);
        let phases = match away {
            Some(_) => 2,
            None => 1,
        };
        let mut completed = true;
        for phase in 0..phases {
            self.phase.copy_from(&self.mask);
            if let Some((home, extra, delay_s)) = away {
                let empty = PoolMask::empty(order.pools.len());
                let here = home.map_or(&empty, |h| &order.in_region[h]);
                match phase {
                    0 => self.phase.and(here),
                    _ => {
                        self.phase.and_not(here);
                        bound.away(extra, delay_s);
                    }
                }
            }
            let mut scan = Phase {
                index: &self.index,
                capacity: &mut self.capacity,
                viable: &mut self.viable,
                blocked: &mut self.blocked,
                pruned,
            };
            if !scan.scan(
                ctx,
                order,
                &self.phase,
                &mut bound,
                split,
                remaining,
                elsewhere,
            ) {
                completed = false;
            }
        }
        self.bound = bound.into_buffer();
        // Blocked candidates are shown only when fewer than `keep` are workable (the scan then
        // went through every wanted pool), and their count only for a hold. A pool the mask
        // left out breaks one of the job's own constraints ([`JobCtx::scan_mask`]) or cannot
        // hold the gang ([`holds_gang`]): blocked candidates are all `evaluate` finds there.
        let full = job.map_or(self.detail == Detail::Full, |j| self.records(j));
        if restricted && completed && (full || self.viable.is_empty()) {
            for (pos, &(_, pool)) in order.pools.iter().enumerate() {
                if self.mask.contains(pos) {
                    continue;
                }
                if let Some(b) = static_block(&self.index, ctx, pool) {
                    self.blocked.push(b);
                } else {
                    let (index, capacity) = (&self.index, &mut self.capacity);
                    evaluate(
                        index,
                        capacity,
                        ctx,
                        pool,
                        &mut self.viable,
                        &mut self.blocked,
                        None,
                    );
                }
            }
        }
    }

    /// A job that allows spot takes only the spot nodes of pools that sell spot cheaper
    /// ([`JobCtx::node_markets`]); their on-demand nodes are looked at here, paid on demand,
    /// so that a one-node job does not wait, miss its deadline or launch beside an idle
    /// on-demand node ([`JobCtx::wants_on_demand_nodes`]).
    fn on_demand_fallback(&mut self, ctx: &JobCtx, job: Option<crate::domain::JobId>) {
        if self.index.spot_pools_with_on_demand_nodes.is_empty()
            || !ctx.wants_on_demand_nodes(&self.viable)
        {
            return;
        }
        let remaining = self.budgets.remaining(&ctx.policy);
        let elsewhere = pinned_elsewhere(&self.pins, job);
        let mut best = self.viable.iter().map(|e| e.score).min();
        let order = ctx.scan_order();
        // No candidate here finishes before this.
        let soonest = self.index.now.plus_secs(ctx.runtime_s);
        // Cheapest first: once a GPU-hour there costs more than the best found (which meets
        // the deadline, or finishes as soon as any could), no on-demand node from there on
        // can beat it: an existing node's share costs at least its GPUs at that price. Only
        // the pools the job's scan mask kept (the others break one of its own constraints);
        // `on_demand_nodes` checks the rest.
        for i in 0..self.index.spot_pools_with_on_demand_nodes.len() {
            let (per_gpu, pool) = self.index.spot_pools_with_on_demand_nodes[i];
            if !self
                .mask
                .contains(self.index.price_orders()[order].position[pool])
            {
                continue;
            }
            if let Some(b) = best.filter(|b| !b.misses_deadline || b.late_finish <= soonest) {
                let floor = per_gpu
                    .saturating_mul(i64::from(ctx.gpus.max(1)))
                    .per_hour_for_secs(ctx.runtime_s);
                if floor > b.cost {
                    break;
                }
            }
            let before = self.viable.len();
            let (index, capacity) = (&self.index, &mut self.capacity);
            on_demand_nodes(index, capacity, ctx, pool, &mut self.viable);
            filter(&mut self.viable, before, &mut self.blocked, |e| {
                candidate_rule(ctx, remaining, elsewhere, e)
            });
            best = best
                .into_iter()
                .chain(self.viable[before..].iter().map(|e| e.score))
                .min();
        }
    }

    /// What the joint assignment needs of a job, against the capacity as it stands and with
    /// its policy rules: its workable candidates on free capacity in `free_pools` (pools where
    /// some usable node has the job's GPUs free: every free-now candidate it has), and its best
    /// workable candidate that is not a free-now one meeting its deadline (its way out). The
    /// second comes from a scan that, pruned, counts only such candidates in its bounds; the
    /// pruned and exhaustive scans give the same way out, which the pruning proptests check
    /// through the plans. A job with no free-now candidate wants no free capacity and takes no
    /// part in the assignment: its way out is not looked for (`None`).
    pub(crate) fn batch_candidates(
        &mut self,
        ctx: &JobCtx,
        free_pools: &[usize],
    ) -> (Vec<Estimate>, Option<Estimate>) {
        let remaining = self.budgets.remaining(&ctx.policy);
        let rule = |e: &Estimate| candidate_rule(ctx, remaining, &[], e);
        let way_out =
            |e: &Estimate| e.score.kind != CandidateKind::FreeNow || e.score.misses_deadline;
        self.viable.clear();
        self.blocked.clear();
        for &pool in free_pools {
            let before = self.viable.len();
            let (index, capacity) = (&self.index, &mut self.capacity);
            evaluate(
                index,
                capacity,
                ctx,
                pool,
                &mut self.viable,
                &mut self.blocked,
                None,
            );
            filter(&mut self.viable, before, &mut self.blocked, rule);
        }
        let free: Vec<Estimate> = self
            .viable
            .iter()
            .filter(|e| e.score.kind == CandidateKind::FreeNow)
            .copied()
            .collect();
        if free.is_empty() {
            self.viable.clear();
            return (free, None);
        }
        let mut bound = ScanBound::reusing(1, std::mem::take(&mut self.bound));
        let pruned = self.scan == Scan::Pruned;
        self.evaluated.clear_to(self.index.pools.len());
        if pruned {
            // The free pools' other candidates are all known already (evaluated in full
            // above): the scan starts from the best of them and does not evaluate those pools
            // again.
            self.viable.retain(way_out);
            self.viable.iter().for_each(|e| bound.offer(e));
            free_pools.iter().for_each(|&p| self.evaluated.insert(p));
        } else {
            self.viable.clear();
        }
        let order = &self.index.price_orders()[ctx.scan_order()];
        let restricted = ctx.scan_mask(order, &mut self.mask);
        for (pos, &(_, pool)) in order.pools.iter().enumerate() {
            if restricted && !self.mask.contains(pos) {
                continue;
            }
            if self.evaluated.contains(pool) {
                continue;
            }
            if pruned && bound.excludes(pos, order, ctx, self.index.now, false) {
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
                bound.worst().filter(|_| pruned),
            );
            filter(&mut self.viable, before, &mut self.blocked, rule);
            self.viable[before..]
                .iter()
                .filter(|e| way_out(e))
                .for_each(|e| bound.offer(e));
        }
        self.bound = bound.into_buffer();
        let other = self
            .viable
            .iter()
            .filter(|e| way_out(e))
            .min_by_key(|e| e.score)
            .copied();
        (free, other)
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
            // The gang `evaluate` found, on nodes of the markets the job may take.
            (CandidateKind::FreeNow, Some(node)) if ctx.nodes > 1 => {
                let markets = ctx.gang_markets(&self.index, s.pool, winner.market);
                self.capacity
                    .best_fit_n_in(&self.index, s.pool, ctx.gpus, ctx.nodes, markets)
                    .unwrap_or_else(|| vec![node])
            }
            (CandidateKind::FreeNow | CandidateKind::Preempt, Some(node)) => vec![node],
            (CandidateKind::Launch, _) => {
                for _ in 0..ctx.nodes {
                    self.capacity.launch(s.pool);
                    self.plan.launches.push(Launch {
                        pool: pool.id.clone(),
                        market: winner.market,
                        for_job: job.id,
                        estimated_cost: winner.cost(),
                    });
                }
                self.budgets.spend(&ctx.policy, winner.cost());
                return Outcome::Launch {
                    pool: pool.id.clone(),
                    market: winner.market,
                };
            }
            // The job is planned again next round; until then, the jobs after it count on
            // the capacity it waits for being taken.
            _ => {
                if let (CandidateKind::Wait, Some(node), 1) = (s.kind, s.node, ctx.nodes) {
                    self.capacity.reserve(&self.index, node, ctx.gpus, until);
                }
                return Outcome::Wait {
                    pool: pool.id.clone(),
                    expected_start: winner.start,
                };
            }
        };
        let preempt_gpus = (s.kind == CandidateKind::Preempt).then(|| {
            let grace_end = self.index.now.plus_secs(PREEMPTION_GRACE_S);
            for &a in victims {
                let (node, attempt) = self.index.running[a];
                self.plan.preemptions.push(Preemption {
                    attempt: attempt.attempt,
                    job: attempt.job,
                    node: self.index.nodes[node].id.clone(),
                    gpus: attempt.gpus.len(),
                    for_job: job.id,
                    reason: if ctx.preempts_before_bursting() {
                        format!(
                            "a {} service takes these GPUs back from batch work",
                            ctx.priority.as_str()
                        )
                    } else {
                        format!(
                            "a {} job would miss its deadline without these GPUs",
                            ctx.priority.as_str()
                        )
                    },
                });
            }
            self.capacity
                .preempt(&self.index, nodes[0], victims, ctx.gpus, grace_end, until)
        });
        self.budgets.spend(&ctx.policy, winner.cost());
        for (rank, &node) in nodes.iter().enumerate() {
            // The GPUs: the node's lowest free ones, marked taken for the rest of the round.
            let gpus = match preempt_gpus {
                Some(gpus) => gpus,
                None => self.capacity.assign(&self.index, node, ctx.gpus, until),
            };
            debug_assert_eq!(gpus.len(), ctx.gpus, "an assignment over capacity");
            self.plan.assignments.push(Assignment {
                job: job.id,
                pool: pool.id.clone(),
                node: self.index.nodes[node].id.clone(),
                gpus,
                // Each node's (a gang's may have been bought in different markets), as priced.
                market: JobCtx::node_market(&self.index, s.pool, node),
                estimated_cost: winner.cost(),
                estimated_finish: s.finish,
                rank: u32::try_from(rank).unwrap_or(u32::MAX),
            });
        }
        Outcome::Assigned {
            node: self.index.nodes[nodes[0]].id.clone(),
            pool: pool.id.clone(),
        }
    }

    fn hold(&mut self, job: &QueuedJob, code: HoldCode, reason: String) -> Explanation {
        self.plan.holds.push(Hold {
            job: job.id,
            reason: reason.clone(),
            code,
        });
        Explanation {
            job: job.id,
            at: self.index.now,
            outcome: Outcome::Hold { reason },
            candidates: Vec::new(),
        }
    }
}

/// One phase of a job's pool scan (see `Round::evaluate_pools`): the positions of `order` in
/// `phase`, tier by tier, with `split` the free-now pools of a tier first. False when the bound
/// cut it short.
struct Phase<'r, 'a> {
    index: &'r Index<'a>,
    capacity: &'r mut Capacity,
    viable: &'r mut Vec<Estimate>,
    blocked: &'r mut Vec<Blocked>,
    pruned: bool,
}

impl Phase<'_, '_> {
    #[allow(clippy::too_many_arguments)]
    fn scan(
        &mut self,
        ctx: &JobCtx,
        order: &PriceOrder,
        phase: &PoolMask,
        bound: &mut ScanBound,
        split: bool,
        remaining: Option<Money>,
        elsewhere: &[usize],
    ) -> bool {
        let pruned = self.pruned;
        let order_id = ctx.scan_order();
        let mut next = phase.ones_from(0).next();
        while let Some(start) = next {
            let end = order.tier_end[start];
            let passes: &[Option<bool>] = match split && end - start > 1 {
                true => &[Some(true), Some(false)],
                false => &[None],
            };
            for &want_free in passes {
                let busy = want_free == Some(false);
                let positions = phase.ones_from(start).take_while(|&p| p < end);
                for pos in positions {
                    if let Some(want) = want_free {
                        let free = self.capacity.free_now(order_id, ctx.gpus);
                        if free.is_some_and(|m| m.contains(pos)) != want {
                            continue;
                        }
                    }
                    if pruned && bound.excludes(pos, order, ctx, self.index.now, busy) {
                        return false;
                    }
                    let pool = order.pools[pos].1;
                    // While the kept candidates are late, a pool that cannot start a
                    // one-node job soon enough to finish sooner offers nothing better.
                    if pruned
                        && ctx.nodes == 1
                        && let Some(late) = bound.late_from(ctx)
                        && (self.capacity)
                            .earliest_start(self.index, pool, ctx.gpus)
                            .is_some_and(|at| at >= late)
                    {
                        continue;
                    }
                    let before = self.viable.len();
                    evaluate(
                        self.index,
                        self.capacity,
                        ctx,
                        pool,
                        self.viable,
                        self.blocked,
                        bound.worst().filter(|_| pruned),
                    );
                    filter(self.viable, before, self.blocked, |e| {
                        candidate_rule(ctx, remaining, elsewhere, e)
                    });
                    self.viable[before..].iter().for_each(|e| bound.offer(e));
                }
            }
            next = phase.ones_from(end).next();
        }
        true
    }
}

/// Whether `pool` could offer the gang `ctx` a candidate: it has as many nodes as the gang
/// needs (free now or a wait), or it may launch them all under its quota. One that cannot is
/// only blocked ([`super::estimate::evaluate`]).
fn holds_gang(index: &Index, capacity: &Capacity, ctx: &JobCtx, pool: usize) -> bool {
    let info = &index.pools[pool];
    let nodes = u32::try_from(info.nodes.len()).unwrap_or(u32::MAX);
    nodes >= ctx.nodes
        || (info.pool.launchable
            && capacity.pool_size(index, pool).saturating_add(ctx.nodes) <= info.pool.node_limit)
}

/// The pools whose free capacity the joint assignment left to others than `job`.
fn pinned_elsewhere(
    pins: &IdMap<crate::domain::JobId, Pin>,
    job: Option<crate::domain::JobId>,
) -> &[usize] {
    match job.and_then(|j| pins.get(&j)) {
        Some(Pin::Elsewhere(pools)) => pools.as_slice(),
        _ => &[],
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
        .filter(|&left| e.cost() > left)
        .map(|left| Reject::BudgetExhausted {
            cost: e.cost(),
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
                blocked.push(Blocked::worked(&e, reject));
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

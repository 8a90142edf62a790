//! Candidate evaluation: for one job and one pool, each way the pool could get the job its GPUs
//! (free now, after waiting for running work, on a newly launched node) with its start, finish,
//! cost and whether it meets the deadline — or why the pool cannot take the job.
//!
//! This is the reusable half of placement: it reads the index and the round's capacity but
//! decides nothing, so the per-job greedy planner and a later batch optimiser can share it.
//! Costs and prices follow DESIGN.md "Placement"; data gravity adds egress to the cost and
//! transfer time to the start; spot adds the expected cost and delay of interruptions; a gang
//! (multi-node job) needs all its nodes in one pool, pays for each, and on spot is interrupted
//! when any of them is.

use super::CandidateKind;
use super::capacity::{Capacity, Markets};
use super::constraints::{Reject, latency_violation, model_violation, shape_violation};
use super::index::{Index, PoolInfo, PoolMask, PriceOrder, Victims};
use super::policy::JobPolicy;
use crate::domain::{JobKind, JobSpec, Market, Objective, Pool, Priority, SpotRule};
use crate::money::Money;
use crate::time::Timestamp;
use std::collections::BinaryHeap;

/// The least slack a deadline needs: estimates are estimates.
pub(crate) const MIN_DEADLINE_MARGIN_S: i64 = 60;
/// Ingress assumed for a region that states none.
pub(crate) const DEFAULT_INGRESS_GBPS: u32 = 10;
/// Work an interrupted spot run loses on average, at most: half of a 1-hour checkpoint interval.
pub(crate) const SPOT_LOST_WORK_CAP_S: i64 = 1800;
/// Seconds a preempted attempt gets to checkpoint and stop before its GPUs are taken.
pub(crate) const PREEMPTION_GRACE_S: i64 = 120;

/// Expected extra seconds of a spot run from interruptions: expected interruptions (rate ×
/// runtime) times what each costs — a replacement node's boot plus the work lost since the last
/// checkpoint, half the runtime but at most [`SPOT_LOST_WORK_CAP_S`]. Rounded up.
pub(crate) fn spot_overhead_s(rate_ppm: u32, runtime_s: i64, boot_s: u32) -> i64 {
    let runtime_s = runtime_s.max(0);
    let per_interruption =
        i128::from(boot_s) + i128::from((runtime_s / 2).min(SPOT_LOST_WORK_CAP_S));
    let num = i128::from(rate_ppm) * i128::from(runtime_s) * per_interruption;
    let den: i128 = 3600 * 1_000_000;
    i64::try_from((num + den - 1) / den).unwrap_or(i64::MAX)
}

/// What makes one candidate better than another; field order is priority order (STYLE.md):
/// meet the deadline; when it cannot be met, the earliest finish (the least lateness); then
/// cost, then finish, then the simpler way to get capacity, then ids (positions in the index,
/// which sort like ids).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Score {
    pub misses_deadline: bool,
    /// The finish of a candidate that misses the deadline; zero for one that meets it.
    pub late_finish: Timestamp,
    pub cost: Money,
    pub finish: Timestamp,
    pub kind: CandidateKind,
    pub pool: usize,
    pub node: Option<usize>,
}

/// A way to run the job that works, with its estimates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Estimate {
    /// Its score's cost is the job's objective ([`Objective`]: cash, or the team's bill) plus
    /// `reserve`.
    pub score: Score,
    /// What the team is billed: compute at chargeback rates plus egress ([`Estimate::cost`]).
    pub charge: Money,
    pub market: Market,
    /// When its place is ready (its node free or booted): `start` is later by moving the data.
    pub ready: Timestamp,
    pub start: Timestamp,
    /// What the score adds to the cost for a place on a protected pool (see
    /// [`super::index::PoolInfo::displaced_per_gpu_hour`]); zero elsewhere.
    pub reserve: Money,
}

impl Estimate {
    /// What the job would pay, at chargeback rates: what plans, budgets and explanations
    /// show. A team's budget binds on this, whatever the objective ranks by.
    pub(crate) fn cost(&self) -> Money {
        self.charge
    }
}

/// A way to run the job that does not work, and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Blocked {
    pub pool: usize,
    pub kind: CandidateKind,
    pub reject: Reject,
    /// The market and ready time of a candidate a policy rule blocked once it was worked out
    /// ([`Blocked::worked`]); `None` for one ruled out before. An explanation shows it as
    /// [`JobCtx::nominal`] works it out again from these.
    pub worked: Option<(Market, Timestamp)>,
}

impl Blocked {
    /// A candidate of `kind` in `pool` that `reject` rules out before it is worked out.
    pub(crate) fn ruled_out(pool: usize, kind: CandidateKind, reject: Reject) -> Blocked {
        Blocked {
            pool,
            kind,
            reject,
            worked: None,
        }
    }

    /// A worked-out candidate that `reject` blocks.
    pub(crate) fn worked(e: &Estimate, reject: Reject) -> Blocked {
        Blocked {
            pool: e.score.pool,
            kind: e.score.kind,
            reject,
            worked: Some((e.market, e.ready)),
        }
    }

    /// Explanation order: closest to feasible first, then by pool id and kind; then the
    /// market and the reject, so no two that show differently tie (the order never depends
    /// on which other candidates a scan looked at).
    pub(crate) fn order_key(
        &self,
    ) -> (
        u8,
        usize,
        CandidateKind,
        Option<(Market, Timestamp)>,
        Reject,
    ) {
        (
            self.reject.rank(),
            self.pool,
            self.kind,
            self.worked,
            self.reject,
        )
    }
}

/// The job's own figures, worked out once per job rather than once per pool.
#[derive(Debug)]
pub(crate) struct JobCtx<'a> {
    pub spec: &'a JobSpec,
    /// GPUs per node.
    pub gpus: u32,
    /// Nodes: more than one for a gang.
    pub nodes: u32,
    pub runtime_s: i64,
    pub policy: JobPolicy,
    /// What the job's candidates are ranked by (its policies': [`JobPolicy::objective`]).
    pub objective: Objective,
    /// The job's spot rule, capped by its policies.
    pub spot: SpotRule,
    /// The job's priority, capped by its policies.
    pub priority: Priority,
    /// Slack a finish (at the cost runtime) must leave before the deadline: the least margin
    /// plus how much longer the deadline runtime is ([`JobCtx::new`]).
    margin_ms: i64,
    /// The job allows spot but misses its deadline wherever it runs: see
    /// [`JobCtx::scan_order`].
    late_on_demand: bool,
    /// The entry of the price orders' `gpus_at_least` for the smallest node size that fits
    /// the job (their length when none does).
    node_class: usize,
    data: Option<DataCtx>,
    /// Per region key, whether the job's region list allows it (`None`: any region).
    region_ok: Option<Vec<bool>>,
    /// Per model key, the job's model list and accelerator's verdict
    /// ([`model_violation`]; `None`: every model is allowed).
    model_ok: Option<Vec<Option<Reject>>>,
    /// Per region key, a service's latency verdict (`None`: no latency bound).
    latency: Option<Vec<Option<Reject>>>,
    /// Launches are left out for now: a service looks for batch work to preempt first
    /// ([`JobCtx::preempts_before_bursting`]).
    pub defer_launch: bool,
    /// Positions of the nodes the job is kept off ([`Snapshot::avoid`]; usually none), sorted.
    ///
    /// [`Snapshot::avoid`]: crate::domain::Snapshot::avoid
    pub avoid: Vec<usize>,
}

#[derive(Debug)]
struct DataCtx {
    /// The data's region key in the index; `None` when no pool is there (every pool is away).
    region_key: Option<usize>,
    size_gb: u32,
    egress: Money,
}

impl<'a> JobCtx<'a> {
    /// The job's context; `deadline_runtime_s` is the runtime its deadline is judged at
    /// ([`QueuedJob::deadline_runtime_s`], `None`: the cost runtime).
    ///
    /// [`QueuedJob::deadline_runtime_s`]: crate::domain::QueuedJob::deadline_runtime_s
    pub(crate) fn new(
        index: &Index,
        spec: &'a JobSpec,
        deadline_runtime_s: Option<i64>,
    ) -> JobCtx<'a> {
        let runtime_s = spec.runtime_s();
        let deadline_runtime_s = deadline_runtime_s.map_or(runtime_s, |r| r.max(0));
        let data = spec.data.as_ref().map(|d| DataCtx {
            region_key: index.region_key(&d.region),
            size_gb: d.size_gb,
            egress: index
                .region(&d.region)
                .map_or(Money::ZERO, |r| r.egress_per_gb)
                .saturating_mul(i64::from(d.size_gb)),
        });
        let policy = JobPolicy::new(&index.policies, spec, index.now);
        let mut ctx = JobCtx {
            spec,
            gpus: spec.resources.gpus,
            nodes: spec.resources.nodes.max(1),
            runtime_s,
            spot: policy.spot,
            priority: policy.priority,
            objective: policy.objective,
            policy,
            // max(60 s, 5% of the runtime), in milliseconds: 5% of a second is 50 ms; both
            // at the deadline runtime, whose excess over the cost runtime (the p90 over the
            // p50) is judged as margin too: candidates' finishes are at the cost runtime.
            margin_ms: (MIN_DEADLINE_MARGIN_S * 1000)
                .max(deadline_runtime_s.saturating_mul(50))
                .saturating_add(
                    deadline_runtime_s
                        .saturating_sub(runtime_s)
                        .saturating_mul(1000),
                ),
            late_on_demand: false,
            defer_launch: false,
            avoid: Vec::new(),
            node_class: index.price_orders()[0]
                .gpus_at_least
                .partition_point(|&(g, _)| g < spec.resources.gpus.max(1)),
            data,
            region_ok: (!spec.regions.is_empty()).then(|| {
                index
                    .region_ids
                    .iter()
                    .map(|id| spec.regions.contains(id))
                    .collect()
            }),
            model_ok: if spec.resources.gpu_models.is_empty()
                && spec.resources.accelerator.is_none()
                && index.all_gpus
            {
                None
            } else {
                let verdicts: Vec<Option<Reject>> = index
                    .model_names
                    .iter()
                    .map(|m| model_violation(&spec.resources, m))
                    .collect();
                verdicts.iter().any(Option::is_some).then_some(verdicts)
            },
            latency: (spec.kind == JobKind::Service && spec.max_latency_ms.is_some()).then(|| {
                index
                    .region_ids
                    .iter()
                    .map(|id| latency_violation(spec, index.region(id), |r| index.region(r)))
                    .collect()
            }),
        };
        ctx.late_on_demand =
            ctx.spot != SpotRule::Never && ctx.misses(index.now.plus_secs(runtime_s));
        ctx
    }

    /// Which of [`Index::price_orders`] the job's pool scans take: the one by the price of
    /// the cheapest market the job may use, except for a job that allows spot but misses its
    /// deadline wherever it runs. Its candidates rank by how late they finish before what
    /// they cost, and a spot run finishes later than an on-demand one by its interruptions'
    /// expected delay, so its best candidates are mostly on demand: by on-demand price they
    /// come first and the scan stops early, bounding the spot candidates by that delay
    /// ([`JobCtx::spot_delay_from`]).
    pub(crate) fn scan_order(&self) -> usize {
        match self.late_on_demand {
            true => Index::order_of(SpotRule::Never),
            false => Index::order_of(self.spot),
        }
    }

    /// The fewest seconds a spot candidate from position `at` of `order` on runs longer than
    /// on demand: the spot overhead at the lowest interruption rate and shortest boot of the
    /// pools there that sell spot; `None` when no pool from `at` on offers spot. What bounds
    /// the spot candidates of a scan by on-demand price ([`JobCtx::scan_order`]).
    fn spot_delay_from(&self, order: &PriceOrder, at: usize) -> Option<i64> {
        let (rate, boot) = order.min_spot_risk_from.get(at).copied().flatten()?;
        Some(spot_overhead_s(self.gang_rate(rate), self.runtime_s, boot))
    }

    /// The rate at which the job's run is interrupted where each spot node is interrupted
    /// `rate_ppm` times an hour: a gang stops (and goes back to the queue whole) when any of its
    /// nodes does, `nodes` times as often as one node.
    fn gang_rate(&self, rate_ppm: u32) -> u32 {
        rate_ppm.saturating_mul(self.nodes)
    }

    /// The job's own hard constraints and its latency bound against the pool: what
    /// [`super::constraints::static_violation`] and [`latency_violation`] say, from the tables
    /// worked out once per job.
    fn static_violation(&self, info: &PoolInfo) -> Option<Reject> {
        if let Some(ok) = &self.region_ok
            && !ok[info.region_key]
        {
            return Some(Reject::RegionNotAllowed);
        }
        if let Some(reject) = self.model_ok.as_ref().and_then(|ok| ok[info.model_key]) {
            return Some(reject);
        }
        shape_violation(info.pool, self.spec)
            .or_else(|| self.latency.as_ref().and_then(|l| l[info.region_key]))
    }

    /// Narrows the scan of `order` to a superset of the pools that pass the job's region,
    /// latency, GPU model and GPUs-per-node constraints: sets `mask` to those positions and
    /// returns true, or returns false (and leaves `mask` alone) when these constraints rule
    /// out no pool. Every position left out fails [`JobCtx::static_violation`].
    pub(crate) fn scan_mask(&self, order: &PriceOrder, mask: &mut PoolMask) -> bool {
        let mut restricted = false;
        let mut part = PoolMask::default();
        let mut apply = |part: &PoolMask, mask: &mut PoolMask| {
            if restricted {
                mask.and(part);
            } else {
                mask.copy_from(part);
                restricted = true;
            }
        };
        if self.region_ok.is_some() || self.latency.is_some() {
            part.0 = vec![0; order.pools.len().div_ceil(64)];
            for (key, m) in order.in_region.iter().enumerate() {
                let ok = self.region_ok.as_ref().is_none_or(|ok| ok[key])
                    && self.latency.as_ref().is_none_or(|l| l[key].is_none());
                if ok {
                    part.or(m);
                }
            }
            apply(&part, mask);
        }
        if let Some(ok) = &self.model_ok {
            part.0.clear();
            part.0.resize(order.pools.len().div_ceil(64), 0);
            for (key, m) in order.of_model.iter().enumerate() {
                if ok[key].is_none() {
                    part.or(m);
                }
            }
            apply(&part, mask);
        }
        let sizes = &order.gpus_at_least;
        let fit = sizes.partition_point(|(g, _)| *g < self.gpus);
        if fit > 0 || sizes.is_empty() {
            match sizes.get(fit) {
                Some((_, m)) => apply(m, mask),
                None => {
                    part.0.clear();
                    part.0.resize(order.pools.len().div_ceil(64), 0);
                    apply(&part, mask);
                }
            }
        }
        restricted
    }

    /// For a job with data to move: its data's region key (`None`: no pool there) and what
    /// running in any pool elsewhere adds at least — the egress, and the transfer at the
    /// fastest ingress of the index. `None` when the job has no data or moving it adds nothing.
    pub(crate) fn away(&self, index: &Index) -> Option<(Option<usize>, Money, i64)> {
        let d = self.data.as_ref()?;
        let secs = (u64::from(d.size_gb) * 8).div_ceil(u64::from(index.max_ingress_gbps.max(1)));
        let secs = i64::try_from(secs).unwrap_or(i64::MAX);
        (d.egress > Money::ZERO || secs > 0).then_some((d.region_key, d.egress, secs))
    }

    /// Egress cost and transfer seconds of bringing the job's data to the pool.
    fn data_move(&self, info: &PoolInfo) -> (Money, i64) {
        match &self.data {
            Some(d) if d.region_key != Some(info.region_key) => {
                let gbps = match info.region.map_or(0, |r| r.ingress_gbps) {
                    0 => DEFAULT_INGRESS_GBPS,
                    g => g,
                };
                let secs = (u64::from(d.size_gb) * 8).div_ceil(u64::from(gbps));
                (d.egress, i64::try_from(secs).unwrap_or(i64::MAX))
            }
            _ => (Money::ZERO, 0),
        }
    }

    /// What the job's compute costs in `p` for `run_s` seconds at `per_hour` a node-hour (the
    /// pool's price in a market, or its cash cost): a new node is the job's alone, so a launch
    /// pays for all of it, boot included; on an existing node the job pays its GPUs' share.
    fn compute_cost(&self, p: &Pool, kind: CandidateKind, per_hour: Money, run_s: i64) -> Money {
        let per_node = match kind {
            CandidateKind::Launch => {
                per_hour.per_hour_for_secs(run_s.saturating_add(i64::from(p.boot_time_s)))
            }
            CandidateKind::FreeNow | CandidateKind::Wait | CandidateKind::Preempt => per_hour
                .div_ceil(i64::from(p.gpus_per_node.max(1)))
                .saturating_mul(i64::from(self.gpus.max(1)))
                .per_hour_for_secs(run_s),
        };
        per_node.saturating_mul(i64::from(self.nodes))
    }

    /// The score of a candidate that finishes at `finish` and costs `cost`.
    fn score(
        &self,
        finish: Timestamp,
        cost: Money,
        kind: CandidateKind,
        pool: usize,
        node: Option<usize>,
    ) -> Score {
        let misses_deadline = self.misses(finish);
        Score {
            misses_deadline,
            late_finish: if misses_deadline {
                finish
            } else {
                Timestamp(0)
            },
            cost,
            finish,
            kind,
            pool,
            node,
        }
    }

    /// Start, finish and cost of running in `pool` on capacity ready at `ready`.
    pub(crate) fn estimate(
        &self,
        index: &Index,
        pool: usize,
        node: Option<usize>,
        kind: CandidateKind,
        market: Market,
        ready: Timestamp,
    ) -> Estimate {
        let info = &index.pools[pool];
        let (egress, transfer_s) = self.data_move(info);
        let start = ready.plus_secs(transfer_s);
        let boot_s = info.pool.boot_time_s;
        let run_s = match market {
            Market::Spot => self.runtime_s.saturating_add(spot_overhead_s(
                self.gang_rate(info.spot_interruptions_ppm),
                self.runtime_s,
                boot_s,
            )),
            Market::OnDemand => self.runtime_s,
        };
        let finish = start.plus_secs(run_s);
        let price = info.pool.price_per_hour(market);
        let charge = self
            .compute_cost(info.pool, kind, price, run_s)
            .saturating_add(egress);
        // Cash and chargeback differ only on a fixed (on-prem) pool under the company objective.
        let cost = match self.objective {
            Objective::Company if !info.pool.launchable => self
                .compute_cost(info.pool, kind, info.pool.cash_per_hour(market), run_s)
                .saturating_add(egress),
            _ => charge,
        };
        Estimate {
            score: self.score(finish, cost, kind, pool, node),
            charge,
            market,
            ready,
            start,
            reserve: Money::ZERO,
        }
    }

    /// Whether a candidate of `kind` in `pool`, ready at `ready`, scores `worst` or worse
    /// whatever its market and node: the score it is held to has its data move, no spot
    /// overhead, the pool's cheapest market's price and no node, and every part of a real one
    /// is at least that. Spares the estimates of candidates a bounded scan would drop. Never
    /// true at a price that is not positive (a longer run would cost less, not more).
    pub(crate) fn cannot_beat(
        &self,
        index: &Index,
        pool: usize,
        kind: CandidateKind,
        ready: Timestamp,
        worst: &Score,
    ) -> bool {
        let info = &index.pools[pool];
        let p = info.pool;
        let market = p.cheapest_market(self.spot);
        let per_hour = p.objective_per_hour(market, self.objective);
        if per_hour <= Money::ZERO {
            return false;
        }
        let (egress, transfer_s) = self.data_move(info);
        let finish = ready.plus_secs(transfer_s).plus_secs(self.runtime_s);
        let cost = self
            .compute_cost(p, kind, per_hour, self.runtime_s)
            .saturating_add(egress);
        self.score(finish, cost, kind, pool, None) >= *worst
    }

    /// The best market for a new node, ready at `ready`: on demand, or spot where the job
    /// (after its policies) allows it and the pool sells it cheaper. `Allowed` takes spot when
    /// it scores better with its interruption risk priced in; `Preferred` takes it whenever it
    /// still meets the deadline. Markets over a price ceiling are out;
    /// [`JobCtx::priced_out_everywhere`] has already ruled out pools where every market is.
    /// (On an existing node the market is the node's: [`JobCtx::on_node`].)
    pub(crate) fn launch_market(&self, index: &Index, pool: usize, ready: Timestamp) -> Estimate {
        let p = index.pools[pool].pool;
        let spot_ok = p.cheapest_market(self.spot) == Market::Spot
            && self.priced_out(index, pool, Market::Spot).is_none();
        let launch =
            |market| self.estimate(index, pool, None, CandidateKind::Launch, market, ready);
        let od = launch(Market::OnDemand);
        if !spot_ok {
            return od;
        }
        let spot = launch(Market::Spot);
        let od_ok = self.priced_out(index, pool, Market::OnDemand).is_none();
        let prefer = self.spot == SpotRule::Preferred && !spot.score.misses_deadline;
        if !od_ok || prefer || spot.score < od.score {
            spot
        } else {
            od
        }
    }

    /// The markets whose nodes in `pool` the job may take. A job that never runs on spot
    /// (after its policies) takes on-demand nodes only. One that allows spot takes the nodes
    /// of the market it is cheapest for it to use there: spot nodes where the pool sells spot
    /// cheaper, and then not on-demand ones (whose price its scan, by spot price, could not
    /// bound), else nodes of either market, each paid on demand ([`JobCtx::node_market`]).
    /// Nodes paid in a market over one of the job's price ceilings are out (where spot is
    /// cheaper and over it, so is on demand).
    pub(crate) fn node_markets(&self, index: &Index, pool: usize) -> Markets {
        let within =
            |market| !self.has_price_ceiling() || self.priced_out(index, pool, market).is_none();
        let cheapest = index.pools[pool].pool.cheapest_market(self.spot);
        match (self.spot, cheapest) {
            (SpotRule::Never, _) => {
                Markets::only(Market::OnDemand).within(within(Market::OnDemand))
            }
            (_, Market::Spot) => Markets::only(Market::Spot).within(within(Market::Spot)),
            (_, Market::OnDemand) => Markets::ANY.within(within(Market::OnDemand)),
        }
    }

    /// For a gang in `pool`, the on-demand nodes where [`JobCtx::node_markets`] gives it spot
    /// nodes only (it allows spot and the pool sells spot cheaper), and on demand is within its
    /// price ceilings: it may take them too, paid on demand. A gang whose spot run would miss
    /// its deadline or finish later launches on demand there ([`JobCtx::launch_market`]);
    /// without these it would never take the nodes it launched. `None` otherwise.
    pub(crate) fn gang_on_demand(&self, index: &Index, pool: usize) -> Option<Markets> {
        let od = Markets::only(Market::OnDemand);
        let spot_only = self.node_markets(index, pool) == Markets::only(Market::Spot);
        let od_ok =
            !self.has_price_ceiling() || self.priced_out(index, pool, Market::OnDemand).is_none();
        (self.nodes > 1 && spot_only && od_ok).then_some(od)
    }

    /// The markets of the nodes a gang's free-now candidate in `pool`, priced in `market`,
    /// takes: those [`JobCtx::node_markets`] gives, or on-demand ones
    /// ([`JobCtx::gang_on_demand`]).
    pub(crate) fn gang_markets(&self, index: &Index, pool: usize, market: Market) -> Markets {
        match self.gang_on_demand(index, pool) {
            Some(od) if market == Market::OnDemand => od,
            _ => self.node_markets(index, pool),
        }
    }

    /// Whether the job, having found `found`, looks at the on-demand nodes of the pools that
    /// sell spot cheaper too ([`on_demand_nodes`]): a one-node job that allows spot and either
    /// would launch an on-demand node at best, or found nothing that meets its deadline while
    /// it is not late wherever it runs. The first case is the node launched for the job a
    /// round ago when a long run's spot risk made on demand its best launch: without this look
    /// the job would never take it (its scan takes spot nodes there), and the node would idle
    /// out and be launched again, for ever. Otherwise the job leaves on-demand nodes there to
    /// the jobs they were launched for: taking one to save on a spot launch only sends that
    /// job to launch again (the simulator's small trace costs 10 % more with it).
    pub(crate) fn wants_on_demand_nodes(&self, found: &[Estimate]) -> bool {
        if self.spot == SpotRule::Never || self.nodes != 1 {
            return false;
        }
        let best = found.iter().min_by_key(|e| e.score);
        let launches_on_demand = best
            .is_some_and(|e| e.score.kind == CandidateKind::Launch && e.market == Market::OnDemand);
        launches_on_demand
            || (!self.late_on_demand && found.iter().all(|e| e.score.misses_deadline))
    }

    /// The market the job pays on an existing node: the one the node was bought in. A spot
    /// node of a pool that does not sell spot cheaper now (or cannot launch) is priced on
    /// demand, as the pool's price orders and the scan's bounds count it.
    pub(crate) fn node_market(index: &Index, pool: usize, node: usize) -> Market {
        let pool = index.pools[pool].pool;
        match index.nodes[node].market {
            Market::Spot if pool.cheapest_market(SpotRule::Allowed) == Market::Spot => Market::Spot,
            _ => Market::OnDemand,
        }
    }

    /// A candidate on an existing node (free now, a wait, a preemption): in the node's market,
    /// which the job may take there ([`JobCtx::node_markets`]).
    pub(crate) fn on_node(
        &self,
        index: &Index,
        pool: usize,
        node: usize,
        kind: CandidateKind,
        ready: Timestamp,
    ) -> Estimate {
        let market = JobCtx::node_market(index, pool, node);
        let mut estimate = self.estimate(index, pool, Some(node), kind, market, ready);
        let info = &index.pools[pool];
        if self.spot != SpotRule::Never
            && info.protected
            && matches!(kind, CandidateKind::FreeNow | CandidateKind::Wait)
        {
            let own = info
                .pool
                .objective_per_hour(market, self.objective)
                .div_ceil(i64::from(info.pool.gpus_per_node.max(1)));
            estimate.reserve = info
                .displaced_per_gpu_hour
                .saturating_sub(own)
                .max(Money::ZERO)
                .saturating_mul(i64::from(self.gpus))
                .per_hour_for_secs(self.runtime_s)
                .saturating_mul(i64::from(self.nodes));
            estimate.score.cost = estimate.score.cost.saturating_add(estimate.reserve);
        }
        estimate
    }

    /// Whether a candidate finishing at `finish` misses the job's deadline (with the margin).
    pub(crate) fn misses(&self, finish: Timestamp) -> bool {
        self.spec
            .deadline
            .is_some_and(|d| finish.plus_millis(self.margin_ms) > d)
    }

    /// The last start from which `run_ms` of work still meets the deadline (with the margin):
    /// a later one [`JobCtx::misses`] it. `None` without a deadline.
    pub(crate) fn last_start_on_time(&self, run_ms: i64) -> Option<Timestamp> {
        let deadline = self.spec.deadline?;
        let last = deadline
            .millis()
            .saturating_sub(self.margin_ms)
            .saturating_sub(run_ms);
        Some(Timestamp(last))
    }

    /// Whether any price ceiling applies (most jobs have none: the checks are skipped).
    pub(crate) fn has_price_ceiling(&self) -> bool {
        self.spec.max_price_per_hour.is_some() || !self.policy.covering.is_empty()
    }

    /// Why no market of `pool` is within the job's price ceilings (the cheapest market's
    /// reason); `None` when one is.
    pub(crate) fn priced_out_everywhere(&self, index: &Index, pool: usize) -> Option<Reject> {
        if !self.has_price_ceiling() {
            return None;
        }
        let p = index.pools[pool].pool;
        let cheapest = p.cheapest_market(self.spot);
        let reject = self.priced_out(index, pool, cheapest)?;
        if cheapest == Market::Spot && self.priced_out(index, pool, Market::OnDemand).is_none() {
            return None;
        }
        Some(reject)
    }

    /// The price ceiling `market` in `pool` breaks, if any: the job's own (whole job, per
    /// hour) or its policies' (per GPU-hour).
    pub(crate) fn priced_out(&self, index: &Index, pool: usize, market: Market) -> Option<Reject> {
        if !self.has_price_ceiling() {
            return None;
        }
        let p = index.pools[pool].pool;
        if let Some(max) = self.spec.max_price_per_hour {
            let price = p
                .price_per_gpu_hour(market)
                .saturating_mul(i64::from(self.gpus.max(1)));
            if price > max {
                return Some(Reject::OverMaxPrice {
                    price_per_hour: price,
                    max_per_hour: max,
                });
            }
        }
        self.policy.price_violation(&index.policies, p, market)
    }

    /// Whether every pool from position `at` of `order` on is over the job's own price
    /// ceiling in every market: the order is by the GPU-hour price in the cheapest market the
    /// job may use, and no market is cheaper than that.
    pub(crate) fn over_max_price_from(&self, order: &PriceOrder, at: usize) -> bool {
        let Some(max) = self.spec.max_price_per_hour else {
            return false;
        };
        // By on-demand price, a pool over the ceiling on demand may still sell spot under it.
        if self.late_on_demand {
            return false;
        }
        order
            .pools
            .get(at)
            .is_some_and(|&(price, _)| price.saturating_mul(i64::from(self.gpus.max(1))) > max)
    }

    /// The estimate shown for a blocked candidate: what it was when a policy rule blocked it,
    /// or, for one ruled out before it was worked out, what it would be had nothing ruled it
    /// out, in the pool's cheapest market for the job and ready as early as its kind can be.
    pub(crate) fn nominal(&self, index: &Index, blocked: &Blocked) -> Estimate {
        let Blocked { pool, kind, .. } = *blocked;
        let (market, ready) = blocked.worked.unwrap_or_else(|| {
            let p = index.pools[pool].pool;
            let ready = match kind {
                CandidateKind::Launch => index.now.plus_secs(i64::from(p.boot_time_s)),
                CandidateKind::Preempt => index.now.plus_secs(PREEMPTION_GRACE_S),
                CandidateKind::FreeNow | CandidateKind::Wait => index.now,
            };
            (p.cheapest_market(self.spot), ready)
        });
        self.estimate(index, pool, None, kind, market, ready)
    }

    /// The least any candidate in the pools from position `at` of `order` on can cost this
    /// job. On existing nodes (free now, a wait, a preemption) it pays its GPUs' share of a
    /// node at the GPU-hour price of the first pool from `at` on that has nodes, at least
    /// (the order is by that price); a launch pays a whole node for the runtime and the boot,
    /// at least the lowest node price of a launchable pool from `at` on whose nodes are large
    /// enough for the job (and at least its GPUs' share at `at`'s price), and the shortest
    /// boot of a launchable pool from `at` on.
    /// `None` (no bound) for prices that are not positive; `Money::MAX` when no pool from
    /// `at` on has nodes or can launch, so none has a candidate to offer.
    pub(crate) fn floor_cost(&self, order: &PriceOrder, at: usize) -> Option<Money> {
        let gpus = i64::from(self.gpus.max(1));
        let nodes = i64::from(self.nodes);
        let with_nodes = order.next_with_nodes[at];
        let shared = match order.pools.get(with_nodes) {
            Some(&(price, _)) if price <= Money::ZERO => return None,
            Some(&(price, _)) => Some(
                price
                    .saturating_mul(gpus)
                    .per_hour_for_secs(self.runtime_s)
                    .saturating_mul(nodes),
            ),
            None => None,
        };
        let node_price = order
            .min_node_price_from
            .get(self.node_class)
            .and_then(|p| p[at]);
        let launched = match (node_price, order.min_boot_from[at]) {
            (Some(price), _) if price <= Money::ZERO => return None,
            (Some(price), Some(boot)) => {
                let share = Money::from_micros(order.pools[at].0.micros() - 1).saturating_mul(gpus);
                Some(
                    price
                        .max(share)
                        .per_hour_for_secs(self.runtime_s.saturating_add(i64::from(boot)))
                        .saturating_mul(nodes),
                )
            }
            _ => None,
        };
        Some(match (shared, launched) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b).unwrap_or(Money::MAX),
        })
    }

    /// Whether the job may take GPUs from low-priority work: it is urgent (high or critical,
    /// after its policies' ceilings), fits on one node, and none of its other candidates
    /// (`best`, the best of them) meets its deadline.
    pub(crate) fn may_preempt(&self, best: Option<&Estimate>) -> bool {
        self.priority >= Priority::High
            && self.nodes == 1
            && (self.preempts_before_bursting() || best.is_none_or(|e| e.score.misses_deadline))
    }

    /// A `high` or `critical` service: it takes GPUs back from batch work (`low`, then
    /// `normal`) before it launches new capacity — inference wins its GPUs back from training
    /// rather than paying for a cloud node while training holds the company's own.
    pub(crate) fn preempts_before_bursting(&self) -> bool {
        self.priority >= Priority::High && self.spec.kind == JobKind::Service
    }

    /// Which running work this job's preemptions may stop.
    pub(crate) fn victims(&self) -> Victims {
        if self.preempts_before_bursting() {
            Victims::LowThenNormal
        } else {
            Victims::Low
        }
    }

    /// When a job placed now releases its GPUs: never for a service.
    pub(crate) fn releases_at(&self, finish: Timestamp) -> Option<Timestamp> {
        (self.spec.kind == JobKind::Batch).then_some(finish)
    }
}

/// The constraints that rule `pool` out for the job whatever its capacity: the job's own, its
/// region's latency, and its policies' allow-lists (price ceilings depend on the market).
pub(crate) fn pool_violation(index: &Index, job: &JobCtx, pool: usize) -> Option<Reject> {
    let info = &index.pools[pool];
    job.static_violation(info)
        .or_else(|| job.policy.allow_violation(&index.policies, info.pool))
        .or_else(|| job.priced_out_everywhere(index, pool))
}

/// The kind of candidate a pool ruled out whatever its capacity is reported as: a launch where
/// it could only launch, else a place on its nodes.
fn nominal_kind(info: &PoolInfo) -> CandidateKind {
    if info.pool.launchable && info.nodes.is_empty() {
        CandidateKind::Launch
    } else {
        CandidateKind::FreeNow
    }
}

/// What [`evaluate`] records for a pool that breaks one of the job's own constraints (region,
/// GPU model, shape, latency): that first one, without a look at the pool's policies or
/// capacity. `None` when the pool breaks none.
pub(crate) fn static_block(index: &Index, job: &JobCtx, pool: usize) -> Option<Blocked> {
    let info = &index.pools[pool];
    let reject = job.static_violation(info)?;
    Some(Blocked::ruled_out(pool, nominal_kind(info), reject))
}

/// Adds the candidates `pool` offers the job to `viable`, and the ways it cannot to `blocked`.
///
/// The job takes only nodes of the market it uses in the pool ([`JobCtx::node_markets`]) and
/// pays that market there. A pool with such nodes free now offers only that (a launch would
/// cost more and start later). Otherwise it offers waiting for its nodes and, when
/// launchable, new nodes. A gang needs all its nodes free (or launched) together: no partial
/// starts.
///
/// With `worst` (a bounded scan's worst kept score), a wait or launch that cannot score better
/// is left out unpriced: the scan would drop it.
pub(crate) fn evaluate(
    index: &Index,
    capacity: &mut Capacity,
    job: &JobCtx,
    pool: usize,
    viable: &mut Vec<Estimate>,
    blocked: &mut Vec<Blocked>,
    worst: Option<&Score>,
) {
    let out = |kind, ready| worst.is_some_and(|w| job.cannot_beat(index, pool, kind, ready, w));
    let info = &index.pools[pool];
    let p = info.pool;
    let mut block = |kind, reject| blocked.push(Blocked::ruled_out(pool, kind, reject));
    if let Some(reject) = pool_violation(index, job, pool) {
        block(nominal_kind(info), reject);
        return;
    }
    let now = index.now;
    let markets = job.node_markets(index, pool);
    let free_now = match job.nodes {
        1 if !job.avoid.is_empty() => {
            capacity.best_fit_avoiding(index, pool, job.gpus, markets, &job.avoid)
        }
        1 => capacity.best_fit_in(index, pool, job.gpus, markets),
        n => (capacity.best_fit_n_in(index, pool, job.gpus, n, markets)).map(|nodes| nodes[0]),
    };
    if let Some(node) = free_now {
        viable.push(job.on_node(index, pool, node, CandidateKind::FreeNow, now));
        return;
    }
    // A gang kept to spot nodes here may take on-demand ones free for all of it, on demand.
    if let Some(od) = job.gang_on_demand(index, pool)
        && let Some(nodes) = capacity.best_fit_n_in(index, pool, job.gpus, job.nodes, od)
    {
        viable.push(job.on_node(index, pool, nodes[0], CandidateKind::FreeNow, now));
    }
    match capacity.earliest_free_n_in(index, pool, job.gpus, job.nodes, markets) {
        // The node that frees first is one the job is kept off: no wait here (the next one
        // to free is not worked out; a job kept off a node is a service's replica, which
        // rarely waits).
        Some((_, node)) if job.avoid.binary_search(&node).is_ok() => {}
        Some((at, _)) if out(CandidateKind::Wait, at) => {}
        Some((at, node)) => {
            viable.push(job.on_node(index, pool, node, CandidateKind::Wait, at));
        }
        None if !p.launchable || !info.nodes.is_empty() => {
            block(CandidateKind::Wait, Reject::NoCapacity);
        }
        None => {}
    }
    if p.launchable {
        if !index.burst_enabled {
            block(CandidateKind::Launch, Reject::BurstDisabled);
        } else if !job.policy.burst_allowed {
            block(CandidateKind::Launch, Reject::BurstNotAllowedByPolicy);
        } else if job.defer_launch {
            block(CandidateKind::Launch, Reject::PreemptsBatchWorkFirst);
        } else if capacity.pool_size(index, pool).saturating_add(job.nodes) > p.node_limit {
            let reject = Reject::QuotaReached {
                node_limit: p.node_limit,
            };
            block(CandidateKind::Launch, reject);
        } else {
            let ready = now.plus_secs(i64::from(p.boot_time_s));
            if !out(CandidateKind::Launch, ready) {
                viable.push(job.launch_market(index, pool, ready));
            }
        }
    }
}

/// What the on-demand nodes of `pool` offer a one-node job that allows spot, where the pool
/// sells spot cheaper (and the job's scan left them out): the best fit free now, else the
/// earliest wait; nothing where a constraint rules the pool out or the job's price ceilings
/// rule on demand out.
pub(crate) fn on_demand_nodes(
    index: &Index,
    capacity: &mut Capacity,
    job: &JobCtx,
    pool: usize,
    viable: &mut Vec<Estimate>,
) {
    let info = &index.pools[pool];
    if !info.on_demand_nodes
        || info.pool.cheapest_market(job.spot) != Market::Spot
        || pool_violation(index, job, pool).is_some()
        || (job.has_price_ceiling() && job.priced_out(index, pool, Market::OnDemand).is_some())
    {
        return;
    }
    let markets = Markets::only(Market::OnDemand);
    let free_now = if job.avoid.is_empty() {
        capacity.best_fit_in(index, pool, job.gpus, markets)
    } else {
        capacity.best_fit_avoiding(index, pool, job.gpus, markets, &job.avoid)
    };
    if let Some(node) = free_now {
        viable.push(job.on_node(index, pool, node, CandidateKind::FreeNow, index.now));
    } else if let Some((at, node)) = capacity.earliest_free_n_in(index, pool, job.gpus, 1, markets)
        && job.avoid.binary_search(&node).is_err()
    {
        viable.push(job.on_node(index, pool, node, CandidateKind::Wait, at));
    }
}

/// Tells when scanning more pools cannot change a job's best `keep` candidates, which is all an
/// explanation shows (and, with `keep == 1`, all a decision needs): once `keep` candidates are
/// found, pools whose every candidate would score worse than the worst of them cannot place
/// among them. Pools come cheapest first, so a lower bound on the score of any candidate from
/// a position on is the least cost at that price tier (or the next) with no egress, no
/// transfer, no wait and the smallest pool position left in the tier.
#[derive(Debug)]
pub(crate) struct ScanBound {
    keep: usize,
    /// The best `keep` scores so far; the worst on top.
    best: BinaryHeap<Score>,
    /// The last next-tier bound worked out: (its position, the bound).
    next: Option<(usize, Option<Score>)>,
    /// What every pool left to scan adds at least: cost, and seconds before the start.
    extra_cost: Money,
    delay_s: i64,
}

impl ScanBound {
    /// A bound keeping the best `keep` scores, in the buffer an earlier bound gave back
    /// ([`ScanBound::into_buffer`]): a round scans for job after job without allocating a heap
    /// for each.
    pub(crate) fn reusing(keep: usize, mut best: BinaryHeap<Score>) -> ScanBound {
        best.clear();
        ScanBound {
            keep,
            best,
            next: None,
            extra_cost: Money::ZERO,
            delay_s: 0,
        }
    }

    pub(crate) fn into_buffer(self) -> BinaryHeap<Score> {
        self.best
    }

    /// From now on, bounds pools that each add at least `cost` and `delay_s` (moving data).
    pub(crate) fn away(&mut self, cost: Money, delay_s: i64) {
        self.extra_cost = cost;
        self.delay_s = delay_s;
        self.next = None;
    }

    /// The worst of the best `keep` once there are `keep` (a candidate must score better to
    /// enter).
    pub(crate) fn worst(&self) -> Option<&Score> {
        self.best
            .peek()
            .filter(|_| self.keep > 0 && self.best.len() == self.keep)
    }

    pub(crate) fn offer(&mut self, estimate: &Estimate) {
        if self.keep == 0 {
            return;
        }
        if self.best.len() == self.keep && self.best.peek().is_some_and(|&w| estimate.score >= w) {
            return;
        }
        self.best.push(estimate.score);
        if self.best.len() > self.keep {
            self.best.pop();
        }
    }

    /// True when no pool from position `pos` of `order` on can offer the job a candidate
    /// among the best `keep`. With `busy`, only the pools of `pos`'s price tier from `pos` on
    /// that have no capacity free now for the job are bounded (their candidates wait or
    /// launch: they cannot start before now and rank after a free-now candidate of the same
    /// cost and finish), and the tiers after it.
    pub(crate) fn excludes(
        &mut self,
        pos: usize,
        order: &PriceOrder,
        job: &JobCtx,
        now: Timestamp,
        busy: bool,
    ) -> bool {
        if self.best.len() < self.keep {
            return false;
        }
        if job.over_max_price_from(order, pos) {
            return true;
        }
        // No candidate finishes before `finish`; when even that misses the deadline, every
        // candidate misses it (and ranks by how late it finishes, then cost).
        let finish = now.plus_secs(job.runtime_s.saturating_add(self.delay_s));
        let hopeless = job.misses(finish);
        // Otherwise a worst candidate that misses the deadline is beaten by any bound (which
        // meets it).
        let Some(&worst) = self.best.peek().filter(|w| hopeless || !w.misses_deadline) else {
            return false;
        };
        let floor = |at: usize, pool: usize, kind: CandidateKind| -> Option<Score> {
            let cost = job.floor_cost(order, at)?;
            let cost = cost.saturating_add(self.extra_cost);
            Some(Score {
                misses_deadline: hopeless,
                late_finish: if hopeless { finish } else { Timestamp(0) },
                cost,
                finish,
                kind,
                pool,
                node: None,
            })
        };
        let kind = match busy {
            true => CandidateKind::Wait,
            false => CandidateKind::FreeNow,
        };
        let Some(tier) = floor(pos, order.tier_min_pool[pos], kind) else {
            return false;
        };
        let end = order.tier_end[pos];
        let lower = if end < order.pools.len() {
            let next = match self.next {
                Some((at, next)) if at == end => next,
                _ => {
                    let next = floor(end, 0, CandidateKind::FreeNow);
                    self.next = Some((end, next));
                    next
                }
            };
            match next {
                Some(next) => tier.min(next),
                None => return false,
            }
        } else {
            tier
        };
        // By on-demand price (a late job: `hopeless`), the price bound holds only for
        // on-demand candidates; a spot one finishes later by its interruptions' delay,
        // whatever it costs.
        if hopeless
            && job.late_on_demand
            && let Some(delay_s) = job.spot_delay_from(order, pos)
        {
            let spot = Score {
                late_finish: finish.plus_secs(delay_s),
                cost: Money::from_micros(i64::MIN),
                ..lower
            };
            return worst < lower.min(spot);
        }
        worst < lower
    }

    /// While the worst of the best `keep` misses the deadline, the start from which a
    /// candidate cannot place among them however cheap: one that starts then (before moving
    /// data) misses the deadline too and finishes later than that worst. `None` until `keep`
    /// are found, while the worst meets the deadline (only the price bound can cut then), for
    /// a job without a deadline, and when the worst's finish is the latest time there is (a
    /// later start then finishes no later: saturated finishes tie). The price bound cannot cut
    /// a scan whose candidates are all late; this keeps such a job from evaluating every pool
    /// of the order.
    pub(crate) fn late_from(&self, job: &JobCtx) -> Option<Timestamp> {
        if self.best.len() < self.keep {
            return None;
        }
        let worst = self
            .best
            .peek()
            .filter(|w| w.misses_deadline && w.late_finish < Timestamp::MAX)?;
        let run_ms = job
            .runtime_s
            .saturating_add(self.delay_s)
            .saturating_mul(1000);
        // The last start that still meets the deadline, and the last that finishes no later
        // than the worst.
        let last_ok = job.last_start_on_time(run_ms)?;
        let last_as_early = worst.late_finish.millis().saturating_sub(run_ms);
        Some(Timestamp(
            last_ok.millis().max(last_as_early).saturating_add(1),
        ))
    }
}

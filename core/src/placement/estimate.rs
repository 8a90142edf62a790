//! Candidate evaluation: for one job and one pool, each way the pool could get the job its GPUs
//! (free now, after waiting for running work, on a newly launched node) with its start, finish,
//! cost and whether it meets the deadline — or why the pool cannot take the job.
//!
//! This is the reusable half of placement: it reads the index and the round's capacity but
//! decides nothing, so the per-job greedy planner and a later batch optimiser can share it.
//! Costs and prices follow DESIGN.md "Placement"; data gravity adds egress to the cost and
//! transfer time to the start.

use super::CandidateKind;
use super::capacity::Capacity;
use super::constraints::{
    Reject, gpu_price, latency_violation, market_for, node_price, static_violation,
};
use super::index::{Index, PoolInfo};
use crate::domain::{JobKind, JobSpec, Market};
use crate::money::Money;
use crate::time::Timestamp;
use std::collections::BinaryHeap;

/// The least slack a deadline needs: estimates are estimates.
pub(crate) const MIN_DEADLINE_MARGIN_S: i64 = 60;
/// Ingress assumed for a region that states none.
pub(crate) const DEFAULT_INGRESS_GBPS: u32 = 10;

/// What makes one candidate better than another; field order is priority order (STYLE.md):
/// meet the deadline, then cost, then finish, then the simpler way to get capacity, then ids
/// (positions in the index, which sort like ids).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Score {
    pub misses_deadline: bool,
    pub cost: Money,
    pub finish: Timestamp,
    pub kind: CandidateKind,
    pub pool: usize,
    pub node: Option<usize>,
}

/// A way to run the job that works, with its estimates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Estimate {
    pub score: Score,
    pub market: Market,
    pub start: Timestamp,
}

/// A way to run the job that does not work, and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Blocked {
    pub pool: usize,
    pub kind: CandidateKind,
    pub reject: Reject,
}

impl Blocked {
    /// Explanation order: closest to feasible first, then by pool id and kind.
    pub(crate) fn order_key(&self) -> (u8, usize, CandidateKind) {
        (self.reject.rank(), self.pool, self.kind)
    }
}

/// The job's own figures, worked out once per job rather than once per pool.
#[derive(Debug)]
pub(crate) struct JobCtx<'a> {
    pub spec: &'a JobSpec,
    pub gpus: u32,
    pub runtime_s: i64,
    margin_ms: i64,
    data: Option<DataCtx>,
}

#[derive(Debug)]
struct DataCtx {
    /// The data's region key in the index; `None` when no pool is there (every pool is away).
    region_key: Option<usize>,
    size_gb: u32,
    egress: Money,
}

impl<'a> JobCtx<'a> {
    pub(crate) fn new(index: &Index, spec: &'a JobSpec) -> JobCtx<'a> {
        let runtime_s = spec.runtime_s();
        let data = spec.data.as_ref().map(|d| DataCtx {
            region_key: index.region_key(&d.region),
            size_gb: d.size_gb,
            egress: index
                .region(&d.region)
                .map_or(Money::ZERO, |r| r.egress_per_gb)
                .saturating_mul(i64::from(d.size_gb)),
        });
        JobCtx {
            spec,
            gpus: spec.resources.gpus,
            runtime_s,
            // max(60 s, 5% of the runtime), in milliseconds: 5% of a second is 50 ms.
            margin_ms: (MIN_DEADLINE_MARGIN_S * 1000).max(runtime_s.saturating_mul(50)),
            data,
        }
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
        let finish = start.plus_secs(self.runtime_s);
        let compute = match kind {
            // A new node is the job's alone: it pays for all of it, boot included.
            CandidateKind::Launch => node_price(info.pool, market).per_hour_for_secs(
                self.runtime_s
                    .saturating_add(i64::from(info.pool.boot_time_s)),
            ),
            CandidateKind::FreeNow | CandidateKind::Wait => gpu_price(info.pool, market)
                .saturating_mul(i64::from(self.gpus.max(1)))
                .per_hour_for_secs(self.runtime_s),
        };
        let misses_deadline = self
            .spec
            .deadline
            .is_some_and(|d| finish.plus_millis(self.margin_ms) > d);
        Estimate {
            score: Score {
                misses_deadline,
                cost: compute.saturating_add(egress),
                finish,
                kind,
                pool,
                node,
            },
            market,
            start,
        }
    }

    /// The estimate shown for a blocked candidate: what it would be had nothing blocked it.
    pub(crate) fn nominal(&self, index: &Index, blocked: &Blocked) -> Estimate {
        let pool = index.pools[blocked.pool].pool;
        let ready = match blocked.kind {
            CandidateKind::Launch => index.now.plus_secs(i64::from(pool.boot_time_s)),
            CandidateKind::FreeNow | CandidateKind::Wait => index.now,
        };
        let market = market_for(pool, self.spec.spot);
        self.estimate(index, blocked.pool, None, blocked.kind, market, ready)
    }

    /// The least any candidate in a pool can cost this job, given the GPU-hour price it pays
    /// there (see [`Index::pools_by_price`]). A launch pays the whole node, which costs at least
    /// the job's GPUs' share; the per-GPU price is rounded up, hence the micro-dollar off.
    /// Negative prices bound nothing.
    pub(crate) fn min_cost(&self, gpu_price: Money) -> Money {
        if gpu_price <= Money::ZERO {
            return Money::from_micros(i64::MIN);
        }
        Money::from_micros(gpu_price.micros() - 1)
            .saturating_mul(i64::from(self.gpus.max(1)))
            .per_hour_for_secs(self.runtime_s)
    }

    /// When a job placed now releases its GPUs: never for a service.
    pub(crate) fn releases_at(&self, finish: Timestamp) -> Option<Timestamp> {
        (self.spec.kind == JobKind::Batch).then_some(finish)
    }
}

/// Adds the candidates `pool` offers the job to `viable`, and the ways it cannot to `blocked`.
///
/// A pool with a node free now offers only that (a launch would cost more and start later).
/// Otherwise it offers waiting for its nodes and, when launchable, a new node.
pub(crate) fn evaluate(
    index: &Index,
    capacity: &mut Capacity,
    job: &JobCtx,
    pool: usize,
    viable: &mut Vec<Estimate>,
    blocked: &mut Vec<Blocked>,
) {
    let info = &index.pools[pool];
    let p = info.pool;
    let mut block = |kind, reject| blocked.push(Blocked { pool, kind, reject });
    let nominal_kind = if p.launchable && info.nodes.is_empty() {
        CandidateKind::Launch
    } else {
        CandidateKind::FreeNow
    };
    if let Some(reject) =
        static_violation(p, job.spec).or_else(|| latency_violation(job.spec, info.region))
    {
        block(nominal_kind, reject);
        return;
    }
    let market = market_for(p, job.spec.spot);
    if let Some(max) = job.spec.max_price_per_hour {
        // The static check allows the cheapest market; the one actually used may cost more
        // (an on-prem pool with a spot figure still charges its internal rate).
        let price = gpu_price(p, market).saturating_mul(i64::from(job.gpus.max(1)));
        if price > max {
            let reject = Reject::OverMaxPrice {
                price_per_hour: price,
                max_per_hour: max,
            };
            block(nominal_kind, reject);
            return;
        }
    }
    if let Some(node) = capacity.best_fit(pool, job.gpus) {
        let now = index.now;
        viable.push(job.estimate(index, pool, Some(node), CandidateKind::FreeNow, market, now));
        return;
    }
    match capacity.earliest_free(index, pool, job.gpus) {
        Some((at, node)) => {
            viable.push(job.estimate(index, pool, Some(node), CandidateKind::Wait, market, at));
        }
        None if !p.launchable || !info.nodes.is_empty() => {
            block(CandidateKind::Wait, Reject::NoCapacity);
        }
        None => {}
    }
    if p.launchable {
        if !index.burst_enabled {
            block(CandidateKind::Launch, Reject::BurstDisabled);
        } else if capacity.pool_size(index, pool) >= p.node_limit {
            let reject = Reject::QuotaReached {
                node_limit: p.node_limit,
            };
            block(CandidateKind::Launch, reject);
        } else {
            let ready = index.now.plus_secs(i64::from(p.boot_time_s));
            viable.push(job.estimate(index, pool, None, CandidateKind::Launch, market, ready));
        }
    }
}

/// Tells when scanning more pools cannot change a job's best `keep` candidates, which is all an
/// explanation shows: once `keep` candidates meet the deadline, a pool whose cheapest possible
/// candidate costs more than the dearest of them cannot place among them, and pools scanned
/// cheapest-first only get dearer.
#[derive(Debug)]
pub(crate) struct ScanBound {
    keep: usize,
    /// The costs of the cheapest `keep` deadline-meeting candidates so far; the dearest on top.
    best: BinaryHeap<Money>,
    /// The last GPU-hour price asked about and the least cost it allows: pools come in price
    /// order and many share a price, so this saves most `min_cost` calls.
    last: Option<(Money, Money)>,
}

impl ScanBound {
    pub(crate) fn new(keep: usize) -> ScanBound {
        ScanBound {
            keep,
            best: BinaryHeap::with_capacity(keep + 1),
            last: None,
        }
    }

    pub(crate) fn offer(&mut self, estimate: &Estimate) {
        if estimate.score.misses_deadline || self.keep == 0 {
            return;
        }
        self.best.push(estimate.score.cost);
        if self.best.len() > self.keep {
            self.best.pop();
        }
    }

    /// True when no candidate in a pool at `gpu_price` can be among the best `keep`;
    /// `min_cost` gives the least a candidate at a price can cost.
    pub(crate) fn excludes(&mut self, gpu_price: Money, min_cost: impl Fn(Money) -> Money) -> bool {
        if self.best.len() < self.keep {
            return false;
        }
        let least = match self.last {
            Some((price, least)) if price == gpu_price => least,
            _ => {
                let least = min_cost(gpu_price);
                self.last = Some((gpu_price, least));
                least
            }
        };
        self.best.peek().is_some_and(|&dearest| least > dearest)
    }
}

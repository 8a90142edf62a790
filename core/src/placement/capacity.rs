//! Capacity as it stands during one planning round: GPUs free per node after the assignments
//! already made this round, when running work is expected to release GPUs, and the launches
//! already planned per pool.
//!
//! Best fit is a range query on a per-pool ordered set of (free GPUs, node), so a job never scans
//! a pool's nodes. Wait estimates read each node's releases; per pool and GPU count, a min-tree
//! over the nodes gives the earliest one and is updated one node at a time as the round takes
//! capacity. A job that waits reserves what it waits for ([`Capacity::reserve`]), so the jobs
//! after it in the queue see the wait they will really have, not the same release. This module
//! decides nothing: it answers "what fits where, and when", and records what the planner took,
//! down to the GPU indexes (an assignment takes the node's lowest free ones).

use super::index::{Index, PoolMask, Victims};
use crate::domain::{GpuSet, Market};
use crate::time::Timestamp;

/// The markets whose nodes a job may take in a pool (see
/// [`super::estimate::JobCtx::node_markets`]). The queries with `_in` answer for those nodes
/// only: the pool-wide queries where they are all of the pool's nodes (most pools have nodes
/// of one market), nothing where they are none, else answers memoised per market.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Markets {
    pub on_demand: bool,
    pub spot: bool,
}

impl Markets {
    /// The nodes of `market` only.
    pub(crate) fn only(market: Market) -> Markets {
        Markets {
            on_demand: market == Market::OnDemand,
            spot: market == Market::Spot,
        }
    }

    /// These, if `ok`; else none.
    pub(crate) fn within(self, ok: bool) -> Markets {
        Markets {
            on_demand: self.on_demand && ok,
            spot: self.spot && ok,
        }
    }

    /// Nodes of either market.
    pub(crate) const ANY: Markets = Markets {
        on_demand: true,
        spot: true,
    };

    pub(crate) fn allows(self, market: Market) -> bool {
        match market {
            Market::OnDemand => self.on_demand,
            Market::Spot => self.spot,
        }
    }

    /// Whether every node of `pool` is of a market allowed.
    fn take_all(self, index: &Index, pool: usize) -> bool {
        let info = &index.pools[pool];
        (self.on_demand || !info.on_demand_nodes) && (self.spot || !info.spot_nodes)
    }

    /// Where the memos keep answers for these markets: 0 both, 1 on demand, 2 spot.
    fn slot(self) -> usize {
        match (self.on_demand, self.spot) {
            (true, false) => 1,
            (false, true) => 2,
            _ => 0,
        }
    }

    /// Whether no node of `pool` is.
    fn take_none(self, index: &Index, pool: usize) -> bool {
        let info = &index.pools[pool];
        !((self.on_demand && info.on_demand_nodes) || (self.spot && info.spot_nodes))
    }
}

/// Seconds after `now` at which an attempt already past its expected end is assumed to finish:
/// it is late, not gone, and may report completion any moment.
pub(crate) const OVERDUE_GRACE_S: i64 = 60;

/// Best fits are memoised for jobs of fewer GPUs than this.
const FIT_MEMO: usize = 9;
const FIT_UNKNOWN: usize = usize::MAX;
const FIT_NONE: usize = usize::MAX - 1;

/// A leaf for a node that never will (or is not usable).
const NEVER: (i64, usize) = (i64::MAX, usize::MAX);

/// The least of a fixed number of (time in ms, node) leaves, updated one leaf at a time.
#[derive(Debug, Clone)]
struct MinTree {
    /// Leaves from `size` on; each inner node the least of its two children.
    data: Vec<(i64, usize)>,
    size: usize,
}

impl MinTree {
    fn new(leaves: &[(i64, usize)]) -> MinTree {
        let size = leaves.len().next_power_of_two();
        let mut data = vec![NEVER; 2 * size];
        data[size..size + leaves.len()].copy_from_slice(leaves);
        for i in (1..size).rev() {
            data[i] = data[2 * i].min(data[2 * i + 1]);
        }
        MinTree { data, size }
    }

    fn set(&mut self, slot: usize, leaf: (i64, usize)) {
        let mut i = self.size + slot;
        if self.data[i] == leaf {
            return;
        }
        self.data[i] = leaf;
        while i > 1 {
            i /= 2;
            let least = self.data[2 * i].min(self.data[2 * i + 1]);
            if self.data[i] == least {
                // Every node above is the least of what it was: unchanged.
                return;
            }
            self.data[i] = least;
        }
    }

    fn min(&self) -> WaitEstimate {
        let (at, node) = self.data[1.min(self.data.len() - 1)];
        (node != usize::MAX).then_some((Timestamp(at), node))
    }
}

/// When a node will have the GPUs: the time and the node.
pub(crate) type WaitEstimate = Option<(Timestamp, usize)>;

/// A memoised wait: (GPUs per node, nodes, [`Markets::slot`]).
type WaitKey = (u32, u32, usize);

#[derive(Debug, Default)]
pub(crate) struct Capacity {
    /// GPUs free per node now, after this round's assignments.
    free: Vec<u32>,
    /// Which GPUs those are, by index (`free` counts them): an assignment takes the lowest.
    free_set: Vec<GpuSet>,
    /// Of those, the GPUs no waiting job of this round counts on: what wait estimates start
    /// from. Jobs that wait reserve the capacity they expect (see [`Capacity::reserve`]), so
    /// the jobs behind them in the queue do not all count on the same release.
    wait_free: Vec<u32>,
    /// The most GPUs a node can ever have free: its total (or what it reports free, if more).
    ceiling: Vec<u32>,
    /// Per pool, its usable nodes as (free GPUs, node): the first entry at or above (g, 0) is
    /// the best fit for g GPUs, ties by node id.
    fit: Vec<FitSet>,
    /// Per node, (time, GPUs) released by work expected to end, by time. Services never end
    /// and are left out.
    releases: Vec<Vec<(Timestamp, u32)>>,
    /// Per pool, nodes launched this round.
    launches: Vec<u32>,
    /// Per pool, memoised best fits for 0..FIT_MEMO GPUs ([`FIT_UNKNOWN`] until asked, then
    /// the node or [`FIT_NONE`]); forgotten when the pool's free GPUs change.
    /// (At [0]: over all its usable nodes; at [1] and [2]: over its on-demand or spot ones.)
    fit_memo: Vec<[[usize; FIT_MEMO]; 3]>,
    /// Per pool and GPU count below FIT_MEMO, once asked: when each usable node of the pool will
    /// have that many GPUs, as a min-tree, kept up to date as nodes change.
    trees: Vec<[Option<MinTree>; FIT_MEMO]>,
    /// Per node, its position among its pool's nodes (a leaf of the pool's trees).
    slot: Vec<usize>,
    /// Per pool, memoised wait estimates by (GPUs per node, nodes) needed.
    /// (Keyed also by the markets' [`Markets::slot`], 0 for all.)
    waits: Vec<Vec<(WaitKey, WaitEstimate)>>,
    /// Per running attempt (position in the index), whether this round preempts it.
    preempted: Vec<bool>,
    /// Per price order of the index and GPU count `g` in `1..FIT_MEMO` (at `g - 1`): the
    /// positions of the pools where a usable node has `g` GPUs free now.
    free_now: [Vec<PoolMask>; 2],
    /// The nodes changed this round (repeats allowed) and the pools launched into: what
    /// [`Capacity::restore`] puts back.
    changed: Vec<usize>,
    launched: Vec<usize>,
}

impl Capacity {
    pub(crate) fn new(index: &Index) -> Capacity {
        let mut capacity = Capacity::default();
        capacity.rebuild(index);
        capacity
    }

    /// Makes this the capacity [`Capacity::new`] gives for `index`, in the buffers it already
    /// has: a planner that plans round after round keeps one and allocates little per round.
    pub(crate) fn rebuild(&mut self, index: &Index) {
        let (pools, nodes) = (index.pools.len(), index.nodes.len());
        refill(&mut self.free, index.nodes.iter().map(|n| n.gpus_free()));
        refill(&mut self.free_set, index.nodes.iter().map(|n| n.free_gpus));
        self.wait_free.clone_from(&self.free);
        refill(
            &mut self.ceiling,
            index.nodes.iter().map(|n| n.gpus_total.max(n.gpus_free())),
        );
        self.fit.truncate(pools);
        self.fit.iter_mut().for_each(|f| f.0.clear());
        self.fit.resize_with(pools, FitSet::default);
        for (node, &pool) in index.node_pool.iter().enumerate() {
            if index.usable(node) {
                self.fit[pool].0.push((self.free[node], node));
            }
        }
        for fit in &mut self.fit {
            fit.0.sort_unstable();
        }
        self.releases.truncate(nodes);
        self.releases.iter_mut().for_each(Vec::clear);
        self.releases.resize_with(nodes, Vec::new);
        for &(node, attempt) in &index.running {
            if let Some(end) = release_time(index, attempt.expected_end) {
                self.releases[node].push((end, attempt.gpus.len()));
            }
        }
        for r in &mut self.releases {
            r.sort_unstable();
        }
        refill(&mut self.launches, (0..pools).map(|_| 0));
        refill(
            &mut self.fit_memo,
            (0..pools).map(|_| [[FIT_UNKNOWN; FIT_MEMO]; 3]),
        );
        self.trees.truncate(pools);
        for trees in &mut self.trees {
            if trees.iter().any(Option::is_some) {
                *trees = Default::default();
            }
        }
        self.trees.resize_with(pools, Default::default);
        self.slot.clear();
        self.slot.resize(nodes, 0);
        for info in &index.pools {
            for (i, &node) in info.nodes.iter().enumerate() {
                self.slot[node] = i;
            }
        }
        self.waits.truncate(pools);
        self.waits.iter_mut().for_each(Vec::clear);
        self.waits.resize_with(pools, Vec::new);
        self.preempted.clear();
        self.preempted.resize(index.running.len(), false);
        for masks in &mut self.free_now {
            masks.truncate(FIT_MEMO - 1);
            for mask in masks.iter_mut() {
                mask.clear_to(pools);
            }
            masks.resize_with(FIT_MEMO - 1, || PoolMask::empty(pools));
        }
        self.changed.clear();
        self.launched.clear();
        // A pool without a usable node has no GPU free: its bits are already clear.
        for pool in 0..pools {
            if !self.fit[pool].is_empty() {
                self.refresh_free_now(index, pool);
            }
        }
    }

    /// Back to the capacity the round started from, as [`Capacity::new`] of the same index
    /// would give, rebuilding only what the round changed: the nodes it assigned, reserved or
    /// preempted on, their pools' memos, and the launches.
    pub(crate) fn restore(&mut self, index: &Index) {
        let mut changed = std::mem::take(&mut self.changed);
        changed.sort_unstable();
        changed.dedup();
        for &node in &changed {
            self.releases[node].clear();
        }
        if !changed.is_empty() {
            for &(node, attempt) in &index.running {
                if changed.binary_search(&node).is_ok()
                    && let Some(end) = release_time(index, attempt.expected_end)
                {
                    self.releases[node].push((end, attempt.gpus.len()));
                }
            }
        }
        let mut pools: Vec<usize> = Vec::with_capacity(changed.len());
        for &node in &changed {
            self.releases[node].sort_unstable();
            let pool = index.node_pool[node];
            let start = index.nodes[node].gpus_free();
            if self.fit[pool].remove((self.free[node], node)) {
                self.fit[pool].insert((start, node));
            }
            self.free[node] = start;
            self.free_set[node] = index.nodes[node].free_gpus;
            self.wait_free[node] = start;
            pools.push(pool);
        }
        for &node in &changed {
            self.retree(index, node);
        }
        pools.sort_unstable();
        pools.dedup();
        for pool in pools {
            self.fit_memo[pool] = [[FIT_UNKNOWN; FIT_MEMO]; 3];
            self.refresh_free_now(index, pool);
        }
        for pool in self.launched.drain(..) {
            self.launches[pool] = 0;
        }
        self.preempted.fill(false);
        changed.clear();
        self.changed = changed;
    }

    /// Brings the pool's bits in `free_now` up to date.
    fn refresh_free_now(&mut self, index: &Index, pool: usize) {
        let most = self.most_free(pool);
        for (o, order) in index.price_orders().iter().enumerate() {
            let pos = order.position[pool];
            for (g, mask) in self.free_now[o].iter_mut().enumerate() {
                mask.set(pos, most > g as u32);
            }
        }
    }

    /// The pools (positions in price order `order`, 0 or 1 as [`Index::price_orders`]) with a
    /// usable node that has `gpus` free now; `None` for GPU counts not tracked (0, or
    /// [`FIT_MEMO`] and more).
    pub(crate) fn free_now(&self, order: usize, gpus: u32) -> Option<&PoolMask> {
        let g = usize::try_from(gpus)
            .ok()
            .filter(|&g| (1..FIT_MEMO).contains(&g))?;
        Some(&self.free_now[order][g - 1])
    }

    /// The `n` usable nodes of `pool` with `gpus` free and the fewest left over, for a gang:
    /// all or nothing.
    pub(crate) fn best_fit_n(&self, pool: usize, gpus: u32, n: u32) -> Option<Vec<usize>> {
        let nodes: Vec<usize> = self.fit[pool]
            .from((gpus, 0))
            .take(n as usize)
            .map(|&(_, node)| node)
            .collect();
        (nodes.len() == n as usize).then_some(nodes)
    }

    /// The earliest time `n` usable nodes of `pool` are each expected to have `gpus` free, and
    /// the first of them (rank 0). `n == 1` is [`Capacity::earliest_free`].
    pub(crate) fn earliest_free_n(
        &mut self,
        index: &Index,
        pool: usize,
        gpus: u32,
        n: u32,
    ) -> WaitEstimate {
        if n <= 1 {
            return self.earliest_free(index, pool, gpus);
        }
        self.scan_waits(index, pool, gpus, n, Markets::ANY)
    }

    /// The earliest time `n` usable nodes of `pool` of the `markets` allowed are each expected
    /// to have `gpus` free, and the first of them, from their releases one node at a time;
    /// memoised until the pool changes.
    fn scan_waits(
        &mut self,
        index: &Index,
        pool: usize,
        gpus: u32,
        n: u32,
        markets: Markets,
    ) -> WaitEstimate {
        let key = (gpus, n.max(1), markets.slot());
        if let Some(&(_, known)) = self.waits[pool].iter().find(|(k, _)| *k == key) {
            return known;
        }
        let nodes = index.pools[pool].nodes.iter();
        let times = nodes
            .filter(|&&node| index.usable(node) && markets.allows(index.nodes[node].market))
            .filter_map(|&node| self.node_free_at(index, node, gpus).map(|t| (t, node)));
        let estimate = if n <= 1 {
            times.min()
        } else {
            let mut times: Vec<(Timestamp, usize)> = times.collect();
            times.sort_unstable();
            times.get(n as usize - 1).map(|&(at, _)| (at, times[0].1))
        };
        self.waits[pool].push((key, estimate));
        estimate
    }

    /// The GPUs a node would have free once its not-yet-preempted attempts of the kind
    /// `victims` allows stop, and those attempts (positions in the index), the fewest in
    /// preemption's order that give `gpus`. `None` when even all of them would not.
    pub(crate) fn preemption_on(
        &self,
        index: &Index,
        node: usize,
        gpus: u32,
        allowed: Victims,
    ) -> Option<Vec<usize>> {
        let mut victims = Vec::new();
        self.preemption_walk(index, node, gpus, allowed, |a| victims.push(a))?;
        Some(victims)
    }

    /// What [`Capacity::preemption_on`] would stop, counted without listing it: the GPUs
    /// taken from `normal` work, and in all.
    pub(crate) fn preemption_size(
        &self,
        index: &Index,
        node: usize,
        gpus: u32,
        allowed: Victims,
    ) -> Option<(u32, u32)> {
        let (mut normal, mut taken) = (0u32, 0u32);
        self.preemption_walk(index, node, gpus, allowed, |a| {
            let (g, priority) = (index.running[a].1.gpus.len(), index.running[a].1.priority);
            taken += g;
            if priority != crate::domain::Priority::Low {
                normal += g;
            }
        })?;
        Some((normal, taken))
    }

    /// Calls `victim` with each attempt [`Capacity::preemption_on`] stops, in order; `None`
    /// (after calling it on some) when even all of them would not free `gpus`.
    fn preemption_walk(
        &self,
        index: &Index,
        node: usize,
        gpus: u32,
        allowed: Victims,
        mut victim: impl FnMut(usize),
    ) -> Option<()> {
        let mut have = self.free[node];
        if have >= gpus || self.ceiling[node] < gpus {
            return None;
        }
        for &a in &index.preemptible[node] {
            if !allowed.may_stop(index.running[a].1) {
                // `low` ones come first: nothing after this one may be stopped either.
                break;
            }
            if self.preempted[a] {
                continue;
            }
            victim(a);
            have = have.saturating_add(index.running[a].1.gpus.len());
            if have >= gpus {
                return Some(());
            }
        }
        None
    }

    /// Stops `victims` on `node` and gives `gpus` to a job expected to release them at `until`;
    /// returns the GPUs it takes. The job takes the free GPUs first, then the lowest of the
    /// victims'; what the victims free beyond its need comes back after the grace period, at
    /// `grace_end`.
    pub(crate) fn preempt(
        &mut self,
        index: &Index,
        node: usize,
        victims: &[usize],
        gpus: u32,
        grace_end: Timestamp,
        until: Option<Timestamp>,
    ) -> GpuSet {
        let mut freed = 0u32;
        let mut held = GpuSet::EMPTY;
        for &a in victims {
            self.preempted[a] = true;
            let attempt = index.running[a].1;
            freed = freed.saturating_add(attempt.gpus.len());
            held = held.union(attempt.gpus);
            let end = release_time(index, attempt.expected_end);
            if let Some(end) = end {
                let r = &mut self.releases[node];
                if let Some(pos) = r.iter().position(|&e| e == (end, attempt.gpus.len())) {
                    r.remove(pos);
                }
            }
        }
        let from_free = self.free[node].min(gpus);
        let leftover = freed.saturating_sub(gpus - from_free);
        let taken = self.assign(index, node, from_free, until);
        let taken = taken.union(held.difference(taken).lowest(gpus - from_free));
        if gpus > from_free
            && let Some(at) = until
        {
            self.add_release(node, at, gpus - from_free);
        }
        if leftover > 0 {
            self.add_release(node, grace_end, leftover);
        }
        self.touch(index, node);
        taken
    }

    fn add_release(&mut self, node: usize, at: Timestamp, gpus: u32) {
        let r = &mut self.releases[node];
        let pos = r.partition_point(|&e| e <= (at, gpus));
        r.insert(pos, (at, gpus));
    }

    /// The most GPUs a usable node of `pool` has free, among its on-demand nodes and among
    /// its spot nodes.
    pub(crate) fn most_free_by_market(&self, index: &Index, pool: usize) -> [u32; 2] {
        let info = &index.pools[pool];
        match (info.on_demand_nodes, info.spot_nodes) {
            (true, true) => {
                let mut most = [0, 0];
                for &(free, node) in self.fit[pool].0.iter().rev() {
                    let m = &mut most[usize::from(index.nodes[node].market == Market::Spot)];
                    *m = (*m).max(free);
                    if most.iter().all(|&m| m > 0) {
                        break;
                    }
                }
                most
            }
            (_, true) => [0, self.most_free(pool)],
            _ => [self.most_free(pool), 0],
        }
    }

    /// The most GPUs a usable node of `pool` has free.
    pub(crate) fn most_free(&self, pool: usize) -> u32 {
        self.fit[pool].last().map_or(0, |&(free, _)| free)
    }

    /// [`Capacity::best_fit`] among the nodes of the `markets` allowed.
    pub(crate) fn best_fit_in(
        &mut self,
        index: &Index,
        pool: usize,
        gpus: u32,
        markets: Markets,
    ) -> Option<usize> {
        if markets.take_all(index, pool) {
            return self.best_fit(pool, gpus);
        }
        if markets.take_none(index, pool) {
            return None;
        }
        let (m, g) = (
            markets.slot(),
            usize::try_from(gpus).ok().filter(|&g| g < FIT_MEMO),
        );
        if let Some(g) = g {
            match self.fit_memo[pool][m][g] {
                FIT_UNKNOWN => {}
                FIT_NONE => return None,
                node => return Some(node),
            }
        }
        let fit = self.fit[pool]
            .from((gpus, 0))
            .map(|&(_, node)| node)
            .find(|&node| markets.allows(index.nodes[node].market));
        if let Some(g) = g {
            self.fit_memo[pool][m][g] = fit.unwrap_or(FIT_NONE);
        }
        fit
    }

    /// [`Capacity::best_fit_in`] leaving out the nodes in `avoid` (sorted; not memoised: few
    /// jobs are kept off nodes).
    pub(crate) fn best_fit_avoiding(
        &self,
        index: &Index,
        pool: usize,
        gpus: u32,
        markets: Markets,
        avoid: &[usize],
    ) -> Option<usize> {
        if markets.take_none(index, pool) {
            return None;
        }
        self.fit[pool]
            .from((gpus, 0))
            .map(|&(_, node)| node)
            .find(|&node| {
                markets.allows(index.nodes[node].market) && avoid.binary_search(&node).is_err()
            })
    }

    /// [`Capacity::best_fit_n`] among the nodes of the `markets` allowed.
    pub(crate) fn best_fit_n_in(
        &self,
        index: &Index,
        pool: usize,
        gpus: u32,
        n: u32,
        markets: Markets,
    ) -> Option<Vec<usize>> {
        if markets.take_all(index, pool) {
            return self.best_fit_n(pool, gpus, n);
        }
        if markets.take_none(index, pool) {
            return None;
        }
        let nodes: Vec<usize> = self.fit[pool]
            .from((gpus, 0))
            .map(|&(_, node)| node)
            .filter(|&node| markets.allows(index.nodes[node].market))
            .take(n as usize)
            .collect();
        (nodes.len() == n as usize).then_some(nodes)
    }

    /// [`Capacity::earliest_free_n`] among the nodes of the `markets` allowed.
    pub(crate) fn earliest_free_n_in(
        &mut self,
        index: &Index,
        pool: usize,
        gpus: u32,
        n: u32,
        markets: Markets,
    ) -> WaitEstimate {
        if markets.take_all(index, pool) {
            return self.earliest_free_n(index, pool, gpus, n);
        }
        if markets.take_none(index, pool) {
            return None;
        }
        self.scan_waits(index, pool, gpus, n, markets)
    }

    /// The usable node of `pool` with `gpus` free and the fewest left over, ties by node id.
    pub(crate) fn best_fit(&mut self, pool: usize, gpus: u32) -> Option<usize> {
        let slot = usize::try_from(gpus).ok().filter(|&g| g < FIT_MEMO);
        if let Some(g) = slot {
            match self.fit_memo[pool][0][g] {
                FIT_UNKNOWN => {}
                FIT_NONE => return None,
                node => return Some(node),
            }
        }
        let fit = self.fit[pool].from((gpus, 0)).next().map(|&(_, node)| node);
        if let Some(g) = slot {
            self.fit_memo[pool][0][g] = fit.unwrap_or(FIT_NONE);
        }
        fit
    }

    /// The earliest time a usable node of `pool` is expected to have `gpus` free, and that node
    /// (ties by node id). `None` when no usable node ever will.
    pub(crate) fn earliest_free(&mut self, index: &Index, pool: usize, gpus: u32) -> WaitEstimate {
        if let Some(g) = usize::try_from(gpus).ok().filter(|&g| g < FIT_MEMO) {
            if self.trees[pool][g].is_none() {
                let leaves: Vec<(i64, usize)> = index.pools[pool]
                    .nodes
                    .iter()
                    .map(|&node| self.leaf(index, node, gpus))
                    .collect();
                self.trees[pool][g] = Some(MinTree::new(&leaves));
            }
            return self.trees[pool][g].as_ref().and_then(MinTree::min);
        }
        self.scan_waits(index, pool, gpus, 1, Markets::ANY)
    }

    /// The earliest a one-node job of `gpus` GPUs could start in `pool`, before moving data:
    /// now where a usable node has them free, else the pool's first wait or a launch's boot
    /// (whether or not a rule then blocks the launch). `None` where the pool has neither.
    pub(crate) fn earliest_start(
        &mut self,
        index: &Index,
        pool: usize,
        gpus: u32,
    ) -> Option<Timestamp> {
        if self.best_fit(pool, gpus).is_some() {
            return Some(index.now);
        }
        let wait = self.earliest_free(index, pool, gpus).map(|(at, _)| at);
        let p = index.pools[pool].pool;
        let launch = p
            .launchable
            .then(|| index.now.plus_secs(i64::from(p.boot_time_s)));
        match (wait, launch) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// A node's leaf in its pool's min-trees for `gpus`: when it will have them free.
    fn leaf(&self, index: &Index, node: usize, gpus: u32) -> (i64, usize) {
        match index.usable(node) {
            true => self
                .node_free_at(index, node, gpus)
                .map_or(NEVER, |t| (t.millis(), node)),
            false => NEVER,
        }
    }

    /// Brings the node's leaves up to date after it changed, forgets its pool's other memoised
    /// waits, and notes the node for [`Capacity::restore`].
    fn touch(&mut self, index: &Index, node: usize) {
        self.changed.push(node);
        self.retree(index, node);
    }

    /// [`Capacity::touch`] without the note.
    fn retree(&mut self, index: &Index, node: usize) {
        let pool = index.node_pool[node];
        if self.trees[pool].iter().any(Option::is_some) {
            let leaves = self.leaves(index, node);
            let slot = self.slot[node];
            for (tree, &leaf) in self.trees[pool].iter_mut().zip(&leaves) {
                if let Some(tree) = tree {
                    tree.set(slot, leaf);
                }
            }
        }
        self.waits[pool].clear();
    }

    /// The node's leaf for every GPU count below [`FIT_MEMO`] (as [`Capacity::leaf`] gives
    /// each), from one walk over its releases.
    fn leaves(&self, index: &Index, node: usize) -> [(i64, usize); FIT_MEMO] {
        let mut leaves = [NEVER; FIT_MEMO];
        if !index.usable(node) {
            return leaves;
        }
        let ceiling = self.ceiling[node];
        let mut have = self.wait_free[node];
        let mut at = index.now;
        let mut next = 0usize;
        let mut releases = self.releases[node].iter();
        loop {
            while next < FIT_MEMO && next as u32 <= have {
                leaves[next] = (at.millis(), node);
                next += 1;
            }
            match releases.next() {
                Some(&(t, released)) if next < FIT_MEMO && (next as u32) <= ceiling => {
                    have = have.saturating_add(released).min(ceiling);
                    at = t;
                }
                _ => return leaves,
            }
        }
    }

    /// Whether [`Capacity::leaves`] agrees with [`Capacity::leaf`] on every node.
    #[cfg(test)]
    pub(crate) fn leaves_agree(&self, index: &Index) -> bool {
        (0..index.nodes.len()).all(|node| {
            let all = self.leaves(index, node);
            (0..FIT_MEMO).all(|g| all[g] == self.leaf(index, node, g as u32))
        })
    }

    fn node_free_at(&self, index: &Index, node: usize, gpus: u32) -> Option<Timestamp> {
        let free = self.wait_free[node];
        if free >= gpus {
            return Some(index.now);
        }
        if self.ceiling[node] < gpus {
            return None;
        }
        let mut have = free;
        for &(at, released) in &self.releases[node] {
            have = have.saturating_add(released).min(self.ceiling[node]);
            if have >= gpus {
                return Some(at);
            }
        }
        None
    }

    /// Nodes the pool has plus those launched for it this round: what its node limit counts.
    pub(crate) fn pool_size(&self, index: &Index, pool: usize) -> u32 {
        let existing = u32::try_from(index.pools[pool].nodes.len()).unwrap_or(u32::MAX);
        existing.saturating_add(self.launches[pool])
    }

    /// Takes `gpus` on `node` for a job expected to release them at `until` (`None`: never, a
    /// service); returns which: the node's lowest free GPUs (all of them, if fewer).
    pub(crate) fn assign(
        &mut self,
        index: &Index,
        node: usize,
        gpus: u32,
        until: Option<Timestamp>,
    ) -> GpuSet {
        let pool = index.node_pool[node];
        let taken = self.free_set[node].lowest(gpus);
        self.free_set[node] = self.free_set[node].difference(taken);
        let before = self.free[node];
        let after = before.saturating_sub(gpus);
        if self.fit[pool].remove((before, node)) {
            self.fit[pool].insert((after, node));
            self.fit_memo[pool] = [[FIT_UNKNOWN; FIT_MEMO]; 3];
            self.refresh_free_now(index, pool);
        }
        self.free[node] = after;
        // Free-now GPUs go to the jobs that start now; a waiting job that counted on them will
        // see that in its next round. What such a job takes from them comes back to that
        // waiting job, not to the jobs after it.
        let owed = gpus.saturating_sub(self.wait_free[node]);
        self.wait_free[node] = self.wait_free[node].saturating_sub(gpus).min(after);
        if let Some(at) = until
            && gpus > owed
        {
            self.add_release(node, at, gpus - owed);
        }
        self.touch(index, node);
        taken
    }

    /// Reserves `gpus` on `node` for a job that waits for them (a single-node job whose best
    /// choice is to wait there): the GPUs it will take — those free now that no earlier waiting
    /// job counts on, then the earliest releases — are no longer offered to the wait estimates
    /// of the jobs after it, and come back when it is expected to finish (`until`; `None`: a
    /// service, never). Jobs that start now are not held back (they may use the GPUs until the
    /// waiting job's turn); the next round sees what they took.
    pub(crate) fn reserve(
        &mut self,
        index: &Index,
        node: usize,
        gpus: u32,
        until: Option<Timestamp>,
    ) {
        let from_free = self.wait_free[node].min(gpus);
        self.wait_free[node] -= from_free;
        let mut need = gpus - from_free;
        let r = &mut self.releases[node];
        let mut used = 0;
        while need > 0 && used < r.len() {
            let take = r[used].1.min(need);
            need -= take;
            r[used].1 -= take;
            if r[used].1 == 0 {
                used += 1;
            }
        }
        r.drain(..used);
        if let Some(at) = until
            && gpus > 0
        {
            self.add_release(node, at, gpus);
        }
        self.touch(index, node);
    }

    /// Records a node launched in `pool` this round. It is not offered to later jobs: it does
    /// not exist yet, and the job it is for will take it.
    pub(crate) fn launch(&mut self, pool: usize) {
        self.launches[pool] = self.launches[pool].saturating_add(1);
        self.launched.push(pool);
    }
}

/// A pool's usable nodes as (free GPUs, node), sorted: the entries from (g, 0) on are the
/// nodes with at least g free, best fit first. A sorted vector rather than a tree: it is built
/// every round from a few nodes per pool and changed a few times, and a vector is built in the
/// buffer the last round left.
#[derive(Debug, Default)]
struct FitSet(Vec<(u32, usize)>);

impl FitSet {
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn last(&self) -> Option<&(u32, usize)> {
        self.0.last()
    }

    /// The entries at or after `key`, in order.
    fn from(&self, key: (u32, usize)) -> std::slice::Iter<'_, (u32, usize)> {
        self.0[self.0.partition_point(|&e| e < key)..].iter()
    }

    /// Removes `key`; whether it was there.
    fn remove(&mut self, key: (u32, usize)) -> bool {
        match self.0.binary_search(&key) {
            Ok(at) => {
                self.0.remove(at);
                true
            }
            Err(_) => false,
        }
    }

    fn insert(&mut self, key: (u32, usize)) {
        if let Err(at) = self.0.binary_search(&key) {
            self.0.insert(at, key);
        }
    }
}

/// Sets `v` to what `items` yields, in the allocation it has.
fn refill<T>(v: &mut Vec<T>, items: impl Iterator<Item = T>) {
    v.clear();
    v.extend(items);
}

/// When an attempt expected to end at `expected_end` releases its GPUs: never for a service;
/// an overdue one shortly ([`OVERDUE_GRACE_S`]).
fn release_time(index: &Index, expected_end: Timestamp) -> Option<Timestamp> {
    if expected_end == Timestamp::MAX {
        None
    } else if expected_end <= index.now {
        Some(index.now.plus_secs(OVERDUE_GRACE_S))
    } else {
        Some(expected_end)
    }
}

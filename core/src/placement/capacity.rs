//! Capacity as it stands during one planning round: GPUs free per node after the assignments
//! already made this round, when running work is expected to release GPUs, and the launches
//! already planned per pool.
//!
//! Best fit is a range query on a per-pool ordered set of (free GPUs, node), so a job never scans
//! a pool's nodes. Wait estimates are computed lazily per (pool, GPUs needed) and forgotten when
//! the pool's capacity changes. This module decides nothing: it answers "what fits where, and
//! when", and records what the planner took.

use super::index::Index;
use crate::time::Timestamp;
use std::collections::BTreeSet;

/// Seconds after `now` at which an attempt already past its expected end is assumed to finish:
/// it is late, not gone, and may report completion any moment.
pub(crate) const OVERDUE_GRACE_S: i64 = 60;

/// When a node will have the GPUs: the time and the node.
pub(crate) type WaitEstimate = Option<(Timestamp, usize)>;

#[derive(Debug)]
pub(crate) struct Capacity {
    /// GPUs free per node now, after this round's assignments.
    free: Vec<u32>,
    /// The most GPUs a node can ever have free: its total (or what it reports free, if more).
    ceiling: Vec<u32>,
    /// Per pool, its usable nodes as (free GPUs, node): the first entry at or above (g, 0) is
    /// the best fit for g GPUs, ties by node id.
    fit: Vec<BTreeSet<(u32, usize)>>,
    /// Per node, (time, GPUs) released by work expected to end, by time. Services never end
    /// and are left out.
    releases: Vec<Vec<(Timestamp, u32)>>,
    /// Per pool, nodes launched this round.
    launches: Vec<u32>,
    /// Per pool, memoised wait estimates by (GPUs per node, nodes) needed.
    waits: Vec<Vec<((u32, u32), WaitEstimate)>>,
    /// Per running attempt (position in the index), whether this round preempts it.
    preempted: Vec<bool>,
}

impl Capacity {
    pub(crate) fn new(index: &Index) -> Capacity {
        let free: Vec<u32> = index.nodes.iter().map(|n| n.gpus_free).collect();
        let ceiling = index
            .nodes
            .iter()
            .map(|n| n.gpus_total.max(n.gpus_free))
            .collect();
        let mut fit = vec![BTreeSet::new(); index.pools.len()];
        for (node, &pool) in index.node_pool.iter().enumerate() {
            if index.usable(node) {
                fit[pool].insert((free[node], node));
            }
        }
        let mut releases = vec![Vec::new(); index.nodes.len()];
        for &(node, attempt) in &index.running {
            if let Some(end) = release_time(index, attempt.expected_end) {
                releases[node].push((end, attempt.gpus));
            }
        }
        for r in &mut releases {
            r.sort_unstable();
        }
        Capacity {
            free,
            ceiling,
            fit,
            releases,
            launches: vec![0; index.pools.len()],
            waits: vec![Vec::new(); index.pools.len()],
            preempted: vec![false; index.running.len()],
        }
    }

    /// The `n` usable nodes of `pool` with `gpus` free and the fewest left over, for a gang:
    /// all or nothing.
    pub(crate) fn best_fit_n(&self, pool: usize, gpus: u32, n: u32) -> Option<Vec<usize>> {
        let nodes: Vec<usize> = self.fit[pool]
            .range((gpus, 0)..)
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
        if let Some(&(_, known)) = self.waits[pool].iter().find(|(k, _)| *k == (gpus, n)) {
            return known;
        }
        let mut times: Vec<(Timestamp, usize)> = index.pools[pool]
            .nodes
            .iter()
            .filter(|&&node| index.usable(node))
            .filter_map(|&node| self.node_free_at(index, node, gpus).map(|t| (t, node)))
            .collect();
        times.sort_unstable();
        let estimate = times.get(n as usize - 1).map(|&(at, _)| (at, times[0].1));
        self.waits[pool].push(((gpus, n), estimate));
        estimate
    }

    /// The GPUs a node would have free once its not-yet-preempted low-priority attempts stop,
    /// and those attempts (positions in the index), the fewest that give `gpus`. `None` when
    /// even all of them would not.
    pub(crate) fn preemption_on(
        &self,
        index: &Index,
        node: usize,
        gpus: u32,
    ) -> Option<Vec<usize>> {
        let mut have = self.free[node];
        if have >= gpus || self.ceiling[node] < gpus {
            return None;
        }
        let mut victims = Vec::new();
        for &a in &index.preemptible[node] {
            if self.preempted[a] {
                continue;
            }
            victims.push(a);
            have = have.saturating_add(index.running[a].1.gpus);
            if have >= gpus {
                return Some(victims);
            }
        }
        None
    }

    /// Stops `victims` on `node` and gives `gpus` to a job expected to release them at `until`.
    /// The job takes the free GPUs first; what the victims free beyond its need comes back
    /// after the grace period, at `grace_end`.
    pub(crate) fn preempt(
        &mut self,
        index: &Index,
        node: usize,
        victims: &[usize],
        gpus: u32,
        grace_end: Timestamp,
        until: Option<Timestamp>,
    ) {
        let mut freed = 0u32;
        for &a in victims {
            self.preempted[a] = true;
            let attempt = index.running[a].1;
            freed = freed.saturating_add(attempt.gpus);
            let end = release_time(index, attempt.expected_end);
            if let Some(end) = end {
                let r = &mut self.releases[node];
                if let Some(pos) = r.iter().position(|&e| e == (end, attempt.gpus)) {
                    r.remove(pos);
                }
            }
        }
        let from_free = self.free[node].min(gpus);
        let leftover = freed.saturating_sub(gpus - from_free);
        self.assign(index, node, from_free, until);
        if gpus > from_free
            && let Some(at) = until
        {
            self.add_release(node, at, gpus - from_free);
        }
        if leftover > 0 {
            self.add_release(node, grace_end, leftover);
        }
        self.waits[index.node_pool[node]].clear();
    }

    fn add_release(&mut self, node: usize, at: Timestamp, gpus: u32) {
        let r = &mut self.releases[node];
        let pos = r.partition_point(|&e| e <= (at, gpus));
        r.insert(pos, (at, gpus));
    }

    /// The usable node of `pool` with `gpus` free and the fewest left over, ties by node id.
    pub(crate) fn best_fit(&self, pool: usize, gpus: u32) -> Option<usize> {
        self.fit[pool]
            .range((gpus, 0)..)
            .next()
            .map(|&(_, node)| node)
    }

    /// The earliest time a usable node of `pool` is expected to have `gpus` free, and that node
    /// (ties by node id). `None` when no usable node ever will.
    pub(crate) fn earliest_free(&mut self, index: &Index, pool: usize, gpus: u32) -> WaitEstimate {
        if let Some(&(_, known)) = self.waits[pool].iter().find(|(k, _)| *k == (gpus, 1)) {
            return known;
        }
        let estimate = index.pools[pool]
            .nodes
            .iter()
            .filter(|&&node| index.usable(node))
            .filter_map(|&node| self.node_free_at(index, node, gpus).map(|t| (t, node)))
            .min();
        self.waits[pool].push(((gpus, 1), estimate));
        estimate
    }

    fn node_free_at(&self, index: &Index, node: usize, gpus: u32) -> Option<Timestamp> {
        let free = self.free[node];
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
    /// service).
    pub(crate) fn assign(
        &mut self,
        index: &Index,
        node: usize,
        gpus: u32,
        until: Option<Timestamp>,
    ) {
        let pool = index.node_pool[node];
        let before = self.free[node];
        let after = before.saturating_sub(gpus);
        if self.fit[pool].remove(&(before, node)) {
            self.fit[pool].insert((after, node));
        }
        self.free[node] = after;
        if let Some(at) = until
            && gpus > 0
        {
            self.add_release(node, at, gpus);
        }
        self.waits[pool].clear();
    }

    /// Records a node launched in `pool` this round. It is not offered to later jobs: it does
    /// not exist yet, and the job it is for will take it.
    pub(crate) fn launch(&mut self, pool: usize) {
        self.launches[pool] = self.launches[pool].saturating_add(1);
    }
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

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
    /// Per pool, memoised wait estimates by GPUs needed.
    waits: Vec<Vec<(u32, WaitEstimate)>>,
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
        let overdue_end = index.now.plus_secs(OVERDUE_GRACE_S);
        let mut releases = vec![Vec::new(); index.nodes.len()];
        for &(node, attempt) in &index.running {
            if attempt.expected_end == Timestamp::MAX {
                continue;
            }
            let end = if attempt.expected_end <= index.now {
                overdue_end
            } else {
                attempt.expected_end
            };
            releases[node].push((end, attempt.gpus));
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
        }
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
        if let Some(&(_, known)) = self.waits[pool].iter().find(|(g, _)| *g == gpus) {
            return known;
        }
        let estimate = index.pools[pool]
            .nodes
            .iter()
            .filter(|&&node| index.usable(node))
            .filter_map(|&node| self.node_free_at(index, node, gpus).map(|t| (t, node)))
            .min();
        self.waits[pool].push((gpus, estimate));
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
        if let Some(at) = until {
            let r = &mut self.releases[node];
            let pos = r.partition_point(|&e| e <= (at, gpus));
            r.insert(pos, (at, gpus));
        }
        self.waits[pool].clear();
    }

    /// Records a node launched in `pool` this round. It is not offered to later jobs: it does
    /// not exist yet, and the job it is for will take it.
    pub(crate) fn launch(&mut self, pool: usize) {
        self.launches[pool] = self.launches[pool].saturating_add(1);
    }
}

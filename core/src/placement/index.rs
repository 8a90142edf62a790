//! A read-only, indexed view of one snapshot for one planning round.
//!
//! Pools and nodes are sorted by id and referred to by position, so comparing positions compares
//! ids: the planner's tie-breaks never depend on the order of the snapshot's vectors. Hash maps
//! here are only looked up, never iterated. Nothing here changes during a round; what does
//! (free GPUs, planned launches) lives in `capacity`.
//!
//! Ids are assumed unique within each vector of the snapshot (the broker's stores key them).

use crate::domain::{
    DEFAULT_SPOT_INTERRUPTIONS_PER_HOUR_PPM, Node, Pool, Priority, Region, RegionId,
    RunningAttempt, Snapshot, SpotRule, TeamPolicy,
};
use crate::money::Money;
use crate::time::Timestamp;
use std::collections::HashMap;

/// One pool with what the planner looks up about it on every candidate.
#[derive(Debug)]
pub(crate) struct PoolInfo<'a> {
    pub pool: &'a Pool,
    /// The pool's region, interned: equal keys mean equal region ids.
    pub region_key: usize,
    /// `None` when the snapshot does not describe the pool's region.
    pub region: Option<&'a Region>,
    /// Every node of the pool, whatever its health (they all count against the node limit),
    /// by id.
    pub nodes: Vec<usize>,
    /// Spot interruptions per hour, in millionths.
    pub spot_interruptions_ppm: u32,
}

#[derive(Debug)]
pub(crate) struct Index<'a> {
    pub now: Timestamp,
    pub burst_enabled: bool,
    /// Sorted by id.
    pub pools: Vec<PoolInfo<'a>>,
    /// Nodes of known pools, sorted by id.
    pub nodes: Vec<&'a Node>,
    /// Position in `pools` of each node's pool.
    pub node_pool: Vec<usize>,
    /// Running attempts on known nodes, as (node position, attempt).
    pub running: Vec<(usize, &'a RunningAttempt)>,
    /// Per node, its low-priority attempts (positions in `running`) in the order preemption
    /// takes them: the latest started first (the least work lost), ties by attempt id.
    pub preemptible: Vec<Vec<usize>>,
    /// Per pool, its usable nodes with low-priority work, by id: where preemption may look.
    pub preemptible_nodes: Vec<Vec<usize>>,
    /// The snapshot's policies, sorted, so which one is reported first never depends on input
    /// order.
    pub policies: Vec<&'a TeamPolicy>,
    /// Pools by the GPU-hour price a job pays there, cheapest first (ties by id): for jobs that
    /// never use spot, and for jobs that may.
    by_price: [Vec<(Money, usize)>; 2],
    region_keys: HashMap<&'a str, usize>,
    regions: HashMap<&'a str, &'a Region>,
}

impl<'a> Index<'a> {
    pub(crate) fn new(snapshot: &'a Snapshot, now: Timestamp) -> Index<'a> {
        let regions: HashMap<&str, &Region> = snapshot
            .regions
            .iter()
            .map(|r| (r.id.as_str(), r))
            .collect();

        let mut pools: Vec<&Pool> = snapshot.pools.iter().collect();
        pools.sort_by(|a, b| a.id.cmp(&b.id));
        let pool_pos: HashMap<&str, usize> = pools
            .iter()
            .enumerate()
            .map(|(i, p)| (p.id.as_str(), i))
            .collect();

        let mut region_keys: HashMap<&str, usize> = HashMap::new();
        let mut pools: Vec<PoolInfo> = pools
            .into_iter()
            .map(|pool| {
                let next = region_keys.len();
                let region_key = *region_keys.entry(pool.region.as_str()).or_insert(next);
                PoolInfo {
                    pool,
                    region_key,
                    region: regions.get(pool.region.as_str()).copied(),
                    nodes: Vec::new(),
                    spot_interruptions_ppm: snapshot
                        .spot_interruptions_per_hour_ppm
                        .get(&pool.id)
                        .copied()
                        .unwrap_or(DEFAULT_SPOT_INTERRUPTIONS_PER_HOUR_PPM),
                }
            })
            .collect();

        let mut nodes: Vec<(&Node, usize)> = snapshot
            .nodes
            .iter()
            .filter_map(|n| pool_pos.get(n.pool.as_str()).map(|&p| (n, p)))
            .collect();
        nodes.sort_by(|a, b| a.0.id.cmp(&b.0.id));
        let (nodes, node_pool): (Vec<&Node>, Vec<usize>) = nodes.into_iter().unzip();
        for (i, &p) in node_pool.iter().enumerate() {
            pools[p].nodes.push(i);
        }

        let node_pos: HashMap<&str, usize> = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.id.as_str(), i))
            .collect();
        let mut running: Vec<(usize, &RunningAttempt)> = snapshot
            .running
            .iter()
            .filter_map(|a| node_pos.get(a.node.as_str()).map(|&n| (n, a)))
            .collect();
        running.sort_by_key(|a| (a.0, a.1.attempt));
        let mut preemptible = vec![Vec::new(); nodes.len()];
        for (i, (node, attempt)) in running.iter().enumerate() {
            if attempt.priority == Priority::Low {
                preemptible[*node].push(i);
            }
        }
        for list in &mut preemptible {
            list.sort_by(|&a, &b| {
                let (x, y) = (running[a].1, running[b].1);
                (y.started_at, x.attempt).cmp(&(x.started_at, y.attempt))
            });
        }
        let mut preemptible_nodes = vec![Vec::new(); pools.len()];
        for (node, list) in preemptible.iter().enumerate() {
            let n = nodes[node];
            if !list.is_empty() && n.healthy && !n.draining {
                preemptible_nodes[node_pool[node]].push(node);
            }
        }
        let mut policies: Vec<&TeamPolicy> = snapshot.policies.iter().collect();
        policies.sort();

        let by_price = [SpotRule::Never, SpotRule::Allowed].map(|rule| {
            let mut order: Vec<(Money, usize)> = pools
                .iter()
                .enumerate()
                .map(|(i, info)| {
                    (
                        info.pool
                            .price_per_gpu_hour(info.pool.cheapest_market(rule)),
                        i,
                    )
                })
                .collect();
            order.sort_unstable();
            order
        });

        Index {
            now,
            burst_enabled: snapshot.burst_enabled,
            pools,
            nodes,
            node_pool,
            running,
            preemptible,
            preemptible_nodes,
            policies,
            by_price,
            region_keys,
            regions,
        }
    }

    /// The interned key of a region that has a pool; `None` when no pool is there.
    pub(crate) fn region_key(&self, id: &RegionId) -> Option<usize> {
        self.region_keys.get(id.as_str()).copied()
    }

    pub(crate) fn region(&self, id: &RegionId) -> Option<&'a Region> {
        self.regions.get(id.as_str()).copied()
    }

    /// Every pool with the GPU-hour price a job with this spot rule pays there, cheapest first.
    pub(crate) fn pools_by_price(&self, spot: SpotRule) -> &[(Money, usize)] {
        match spot {
            SpotRule::Never => &self.by_price[0],
            SpotRule::Allowed | SpotRule::Preferred => &self.by_price[1],
        }
    }

    /// Only healthy, non-draining nodes receive work or count for waiting.
    pub(crate) fn usable(&self, node: usize) -> bool {
        let n = self.nodes[node];
        n.healthy && !n.draining
    }
}

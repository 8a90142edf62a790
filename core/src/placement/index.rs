//! A read-only, indexed view of one snapshot for one planning round.
//!
//! Pools and nodes are sorted by id and referred to by position, so comparing positions compares
//! ids: the planner's tie-breaks never depend on the order of the snapshot's vectors. Hash maps
//! here are only looked up, never iterated. Nothing here changes during a round; what does
//! (free GPUs, planned launches) lives in `capacity`.
//!
//! Ids are assumed unique within each vector of the snapshot (the broker's stores key them).

use super::estimate::DEFAULT_INGRESS_GBPS;
use crate::domain::{
    DEFAULT_SPOT_INTERRUPTIONS_PER_HOUR_PPM, Node, Pool, Priority, Region, RegionId,
    RunningAttempt, Snapshot, SpotRule, TeamPolicy,
};
use crate::money::Money;
use crate::time::Timestamp;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// FNV-1a: the index hashes short ids many times per round, where SipHash's resistance to
/// flooding buys nothing (the broker's own ids) and costs a good part of the round.
#[derive(Default)]
pub(crate) struct Fnv(u64);

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut h = if self.0 == 0 {
            0xcbf2_9ce4_8422_2325
        } else {
            self.0
        };
        for &b in bytes {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        self.0 = h;
    }
}

/// A hash map keyed by ids, hashed with [`Fnv`]. Only looked up, never iterated.
pub(crate) type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<Fnv>>;

/// One pool with what the planner looks up about it on every candidate.
#[derive(Debug)]
pub(crate) struct PoolInfo<'a> {
    pub pool: &'a Pool,
    /// The pool's region, interned: equal keys mean equal region ids.
    pub region_key: usize,
    /// The pool's GPU model, interned case-insensitively (as job model lists match).
    pub model_key: usize,
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
    by_price: [PriceOrder; 2],
    region_keys: IdMap<&'a str, usize>,
    regions: IdMap<&'a str, &'a Region>,
    /// The region id of each region key.
    pub region_ids: Vec<&'a RegionId>,
    /// The GPU model (as some pool spells it) of each model key.
    pub model_names: Vec<&'a str>,
    /// The fastest ingress of any pool's region, in Gb/s (a region that states none counts
    /// as [`DEFAULT_INGRESS_GBPS`]).
    pub max_ingress_gbps: u32,
}

impl<'a> Index<'a> {
    pub(crate) fn new(snapshot: &'a Snapshot, now: Timestamp) -> Index<'a> {
        let regions: IdMap<&str, &Region> = snapshot
            .regions
            .iter()
            .map(|r| (r.id.as_str(), r))
            .collect();

        let mut pools: Vec<&Pool> = snapshot.pools.iter().collect();
        // Callers that keep their pools sorted (the simulator) skip the sort's id comparisons.
        if !pools.is_sorted_by(|a, b| a.id <= b.id) {
            pools.sort_unstable_by(|a, b| a.id.cmp(&b.id));
        }
        let pool_pos: IdMap<&str, usize> = pools
            .iter()
            .enumerate()
            .map(|(i, p)| (p.id.as_str(), i))
            .collect();

        let mut region_keys: IdMap<&str, usize> = IdMap::default();
        let mut region_ids: Vec<&RegionId> = Vec::new();
        let mut model_names: Vec<&str> = Vec::new();
        // Interruption rates by pool id, walked alongside the pools (both sorted by id).
        let mut rates = snapshot.spot_interruptions_per_hour_ppm.iter().peekable();
        let mut pools: Vec<PoolInfo> = pools
            .into_iter()
            .map(|pool| {
                let next = region_keys.len();
                let region_key = *region_keys.entry(pool.region.as_str()).or_insert_with(|| {
                    region_ids.push(&pool.region);
                    next
                });
                // A handful of models: a scan beats hashing a lower-cased copy.
                let model_key = match model_names
                    .iter()
                    .position(|m| m.eq_ignore_ascii_case(&pool.gpu_model))
                {
                    Some(key) => key,
                    None => {
                        model_names.push(&pool.gpu_model);
                        model_names.len() - 1
                    }
                };
                while rates.next_if(|(id, _)| **id < pool.id).is_some() {}
                let rate = rates
                    .peek()
                    .filter(|(id, _)| **id == pool.id)
                    .map(|&(_, &r)| r);
                PoolInfo {
                    pool,
                    region_key,
                    model_key,
                    region: regions.get(pool.region.as_str()).copied(),
                    nodes: Vec::new(),
                    spot_interruptions_ppm: rate.unwrap_or(DEFAULT_SPOT_INTERRUPTIONS_PER_HOUR_PPM),
                }
            })
            .collect();

        let mut nodes: Vec<(&Node, usize)> = snapshot
            .nodes
            .iter()
            .filter_map(|n| pool_pos.get(n.pool.as_str()).map(|&p| (n, p)))
            .collect();
        if !nodes.is_sorted_by(|a, b| a.0.id <= b.0.id) {
            nodes.sort_unstable_by(|a, b| a.0.id.cmp(&b.0.id));
        }
        let (nodes, node_pool): (Vec<&Node>, Vec<usize>) = nodes.into_iter().unzip();
        for (i, &p) in node_pool.iter().enumerate() {
            pools[p].nodes.push(i);
        }

        let node_pos: IdMap<&str, usize> = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.id.as_str(), i))
            .collect();
        let mut running: Vec<(usize, &RunningAttempt)> = snapshot
            .running
            .iter()
            .filter_map(|a| node_pos.get(a.node.as_str()).map(|&n| (n, a)))
            .collect();
        running.sort_unstable_by_key(|a| (a.0, a.1.attempt));
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

        let regions_n = region_ids.len();
        let models_n = model_names.len();
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
            PriceOrder::new(order, &pools, rule, regions_n, models_n)
        });

        let max_ingress_gbps = pools
            .iter()
            .map(|p| match p.region.map_or(0, |r| r.ingress_gbps) {
                0 => DEFAULT_INGRESS_GBPS,
                g => g,
            })
            .max()
            .unwrap_or(DEFAULT_INGRESS_GBPS);
        Index {
            max_ingress_gbps,
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
            region_ids,
            model_names,
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
    pub(crate) fn pools_by_price(&self, spot: SpotRule) -> &PriceOrder {
        &self.by_price[Index::order_of(spot)]
    }

    /// Which of [`Index::price_orders`] a job with this spot rule scans.
    pub(crate) fn order_of(spot: SpotRule) -> usize {
        match spot {
            SpotRule::Never => 0,
            SpotRule::Allowed | SpotRule::Preferred => 1,
        }
    }

    /// Both price orders.
    pub(crate) fn price_orders(&self) -> &[PriceOrder; 2] {
        &self.by_price
    }

    /// Only healthy, non-draining nodes receive work or count for waiting.
    pub(crate) fn usable(&self, node: usize) -> bool {
        let n = self.nodes[node];
        n.healthy && !n.draining
    }
}

/// Pools by the GPU-hour price a job pays there, cheapest first (ties by id), with what the
/// pruned scan needs to bound what the pools from a position on can offer.
#[derive(Debug)]
pub(crate) struct PriceOrder {
    pub pools: Vec<(Money, usize)>,
    /// Per position, the first position with a higher price (the end of its price tier).
    pub tier_end: Vec<usize>,
    /// Per position, the smallest pool position from it to the end of its tier.
    pub tier_min_pool: Vec<usize>,
    /// Per position, the shortest boot time of a launchable pool from it on (`None`: none).
    pub min_boot_from: Vec<Option<u32>>,
    /// Per entry of `gpus_at_least` (pools with nodes of at least that many GPUs), per
    /// position, the lowest node-hour price (in the cheapest market the order's jobs may use)
    /// of such a launchable pool from it on: what a launch there pays at least per node.
    pub min_node_price_from: Vec<Vec<Option<Money>>>,
    /// Per position, the first position from it on of a pool with nodes (`len`: none): only
    /// those offer a share of a node (free now, a wait, a preemption); the others only launch.
    pub next_with_nodes: Vec<usize>,
    /// Per pool, its position.
    pub position: Vec<usize>,
    /// Bitsets over positions ([`PoolMask`]) of the pools in each region key, in each model
    /// key, and with at least each GPU count per node (`gpus_at_least`).
    pub in_region: Vec<PoolMask>,
    pub of_model: Vec<PoolMask>,
    pub gpus_at_least: Vec<(u32, PoolMask)>,
}

/// A set of positions in a [`PriceOrder`], one bit each.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct PoolMask(pub Vec<u64>);

impl PoolMask {
    pub(crate) fn empty(len: usize) -> PoolMask {
        PoolMask(vec![0; len.div_ceil(64)])
    }

    /// Every position below `len`.
    pub(crate) fn full(len: usize) -> PoolMask {
        let mut mask = PoolMask(vec![u64::MAX; len.div_ceil(64)]);
        if let Some(last) = mask.0.last_mut()
            && !len.is_multiple_of(64)
        {
            *last = (1 << (len % 64)) - 1;
        }
        mask
    }

    pub(crate) fn insert(&mut self, pos: usize) {
        self.0[pos / 64] |= 1 << (pos % 64);
    }

    pub(crate) fn set(&mut self, pos: usize, on: bool) {
        let bit = 1 << (pos % 64);
        if on {
            self.0[pos / 64] |= bit;
        } else {
            self.0[pos / 64] &= !bit;
        }
    }

    pub(crate) fn contains(&self, pos: usize) -> bool {
        self.0[pos / 64] & (1 << (pos % 64)) != 0
    }

    /// `self = a`, word by word.
    pub(crate) fn copy_from(&mut self, a: &PoolMask) {
        self.0.clear();
        self.0.extend_from_slice(&a.0);
    }

    /// `self &= a`.
    pub(crate) fn and(&mut self, a: &PoolMask) {
        self.0.iter_mut().zip(&a.0).for_each(|(x, y)| *x &= y);
    }

    /// `self &= !a`.
    pub(crate) fn and_not(&mut self, a: &PoolMask) {
        self.0.iter_mut().zip(&a.0).for_each(|(x, y)| *x &= !y);
    }

    /// `self |= a`.
    pub(crate) fn or(&mut self, a: &PoolMask) {
        self.0.iter_mut().zip(&a.0).for_each(|(x, y)| *x |= y);
    }

    /// The positions in the set, in order, from `from` on.
    pub(crate) fn ones_from(&self, from: usize) -> impl Iterator<Item = usize> + '_ {
        let first = from / 64;
        self.0
            .iter()
            .enumerate()
            .skip(first)
            .flat_map(move |(w, &word)| {
                let word = if w == first {
                    word & (u64::MAX << (from % 64))
                } else {
                    word
                };
                Bits(word).map(move |b| w * 64 + b)
            })
    }
}

/// The set bits of one word, lowest first.
struct Bits(u64);

impl Iterator for Bits {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        if self.0 == 0 {
            return None;
        }
        let b = self.0.trailing_zeros() as usize;
        self.0 &= self.0 - 1;
        Some(b)
    }
}

impl PriceOrder {
    fn new(
        pools: Vec<(Money, usize)>,
        info: &[PoolInfo],
        spot: SpotRule,
        regions: usize,
        models: usize,
    ) -> PriceOrder {
        let n = pools.len();
        let mut in_region = vec![PoolMask::empty(n); regions];
        let mut of_model = vec![PoolMask::empty(n); models];
        let mut sizes: Vec<u32> = info.iter().map(|i| i.pool.gpus_per_node).collect();
        sizes.sort_unstable();
        sizes.dedup();
        let mut gpus_at_least: Vec<(u32, PoolMask)> =
            sizes.into_iter().map(|g| (g, PoolMask::empty(n))).collect();
        for (pos, &(_, pool)) in pools.iter().enumerate() {
            let i = &info[pool];
            in_region[i.region_key].insert(pos);
            of_model[i.model_key].insert(pos);
            for (g, mask) in &mut gpus_at_least {
                if i.pool.gpus_per_node >= *g {
                    mask.insert(pos);
                }
            }
        }
        let mut tier_end = vec![n; n];
        let mut tier_min_pool = vec![usize::MAX; n];
        let mut min_boot_from = vec![None; n];
        let mut boot: Option<u32> = None;
        let mut min_node_price_from = vec![vec![None; n + 1]; gpus_at_least.len()];
        let mut next_with_nodes = vec![n; n + 1];
        for i in (0..n).rev() {
            let (price, pool) = pools[i];
            let same_tier = i + 1 < n && pools[i + 1].0 == price;
            if same_tier {
                tier_end[i] = tier_end[i + 1];
                tier_min_pool[i] = tier_min_pool[i + 1].min(pool);
            } else {
                tier_end[i] = i + 1;
                tier_min_pool[i] = pool;
            }
            let p = info[pool].pool;
            if p.launchable {
                boot = Some(boot.map_or(p.boot_time_s, |b| b.min(p.boot_time_s)));
            }
            min_boot_from[i] = boot;
            let node_price = p
                .launchable
                .then(|| p.price_per_hour(p.cheapest_market(spot)));
            for (class, &(g, _)) in gpus_at_least.iter().enumerate() {
                let from = &mut min_node_price_from[class];
                from[i] = match (node_price.filter(|_| p.gpus_per_node >= g), from[i + 1]) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
            next_with_nodes[i] = match info[pool].nodes.is_empty() {
                true => next_with_nodes[i + 1],
                false => i,
            };
        }
        let mut position = vec![0; n];
        for (pos, &(_, pool)) in pools.iter().enumerate() {
            position[pool] = pos;
        }
        PriceOrder {
            position,
            pools,
            tier_end,
            tier_min_pool,
            min_boot_from,
            min_node_price_from,
            next_with_nodes,
            in_region,
            of_model,
            gpus_at_least,
        }
    }
}

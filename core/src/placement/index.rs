//! A read-only, indexed view of one snapshot for one planning round.
//!
//! Pools and nodes are sorted by id and referred to by position, so comparing positions compares
//! ids: the planner's tie-breaks never depend on the order of the snapshot's vectors. Hash maps
//! here are only looked up, never iterated. Nothing here changes during a round; what does
//! (free GPUs, planned launches) lives in `capacity`.
//!
//! What depends on the catalogue alone (regions, pools, spot rates: [`Catalogue`]) and on the
//! node ids alone ([`NodeOrder`]) borrows nothing from the snapshot, so a caller that plans
//! round after round keeps both in a [`PlanCache`] and builds them again only when what they
//! came from changes.
//!
//! Ids are assumed unique within each vector of the snapshot (the broker's stores key them).

use super::estimate::DEFAULT_INGRESS_GBPS;
use crate::domain::{
    DEFAULT_SPOT_INTERRUPTIONS_PER_HOUR_PPM, JobId, Market, Node, NodeId, Pool, PoolId, Priority,
    Region, RegionId, RunningAttempt, Snapshot, SpotRule, TeamPolicy,
};
use crate::money::Money;
use crate::time::Timestamp;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// A hash map keyed by ids, hashed with `FxHash`: the index hashes ids many times per round,
/// where SipHash's resistance to flooding buys nothing (the broker's own ids and the
/// operator's catalogue) and costs a good part of the round. Only looked up, never iterated.
pub(crate) type IdMap<K, V> = HashMap<K, V, rustc_hash::FxBuildHasher>;

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
    /// Whether any of those nodes was bought on demand (or is on-prem), and whether any on
    /// spot: a job that may take only one market's nodes needs the others left out.
    pub on_demand_nodes: bool,
    pub spot_nodes: bool,
    /// A fixed pool (it cannot launch) whose usable nodes have less than one in
    /// [`Snapshot::reserve_free_below_one_in`] of their GPUs free at the round's start: jobs
    /// that allow spot are charged a reserve for a place there
    /// ([`super::estimate::JobCtx::on_node`]).
    pub protected: bool,
    /// For a fixed pool, what a job displaced from its last GPUs pays per GPU-hour: the
    /// cheapest on-demand GPU-hour of a launchable pool whose GPUs have at least this pool's
    /// memory (zero for a launchable pool, or where none fits). A job that allows spot is
    /// charged, in its score only, up to this for a place on a protected pool: the reserve is
    /// this less the pool's own price in the job's objective, the opportunity cost of the
    /// last owned GPUs for the jobs that cannot use spot ([`super::estimate::JobCtx::on_node`]).
    pub displaced_per_gpu_hour: Money,
    /// Spot interruptions per hour, in millionths.
    pub spot_interruptions_ppm: u32,
}

/// Which running work a preemption may stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Victims {
    /// `low` attempts only: what any `high` or `critical` job may stop.
    Low = 0,
    /// `low`, then `normal` batch attempts: what a `high` or `critical` service may stop to
    /// win its GPUs back from training.
    LowThenNormal = 1,
}

impl Victims {
    /// Whether `attempt` may be stopped. Services (which never end) at `normal` are not batch
    /// work and stay.
    pub fn may_stop(self, attempt: &RunningAttempt) -> bool {
        match attempt.priority {
            Priority::Low => true,
            Priority::Normal => {
                self == Victims::LowThenNormal && attempt.expected_end != Timestamp::MAX
            }
            Priority::High | Priority::Critical => false,
        }
    }
}

#[derive(Debug)]
pub(crate) struct Index<'a> {
    /// The snapshot's nodes to keep each job off ([`Snapshot::avoid`]).
    pub avoid: &'a BTreeMap<JobId, Vec<NodeId>>,
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
    /// Per node, the attempts preemption may stop (positions in `running`) in the order it
    /// takes them: the `low` ones (any kind), then the `normal` batch ones (which only a
    /// `high` or `critical` service may stop: [`Victims`]); within each, the latest started
    /// first (the least work lost), ties by attempt id.
    pub preemptible: Vec<Vec<usize>>,
    /// Per pool, its usable nodes with work preemption may stop, by id: where preemption may
    /// look. At [`Victims::Low`]: nodes with `low` work; at [`Victims::LowThenNormal`]: with
    /// `low` or `normal` batch work.
    pub preemptible_nodes: [Vec<Vec<usize>>; 2],
    /// Pools that sell spot cheaper and have on-demand nodes, with the least a GPU-hour on
    /// demand costs there under either objective, cheapest first (ties by position in
    /// `pools`): where a one-node job that allows spot looks for on-demand nodes apart from
    /// its scan ([`super::estimate::on_demand_nodes`]), until one costs more than its best.
    pub spot_pools_with_on_demand_nodes: Vec<(Money, usize)>,
    /// The snapshot's policies, sorted, so which one is reported first never depends on input
    /// order.
    pub policies: Vec<&'a TeamPolicy>,
    /// Pools by the GPU-hour price a job pays there, cheapest first (ties by id): for jobs that
    /// never use spot, and for jobs that may. An on-prem pool's price here is the lower of its
    /// cash cost and its chargeback rate, so the order bounds either objective.
    by_price: [PriceOrder; 2],
    /// What is known from the catalogue alone.
    catalogue: Arc<Catalogue>,
    /// The snapshot's regions, which the catalogue's region positions point into.
    regions: &'a [Region],
    /// The region id of each region key.
    pub region_ids: Vec<&'a RegionId>,
    /// The GPU model (as some pool spells it) of each model key.
    pub model_names: Vec<&'a str>,
    /// Every model is a GPU (no TPU, Trainium…): a job that names no models and no accelerator
    /// may use every pool, and its model check is skipped.
    pub all_gpus: bool,
    /// The fastest ingress of any pool's region, in Gb/s (a region that states none counts
    /// as [`DEFAULT_INGRESS_GBPS`]).
    pub max_ingress_gbps: u32,
}

/// What an index knows from a snapshot's catalogue alone (its regions, pools and spot
/// interruption rates), as positions in those vectors: it borrows nothing, so a caller that
/// plans the same catalogue round after round keeps it ([`PlanCache`]).
#[derive(Debug)]
pub(crate) struct Catalogue {
    /// Positions in the snapshot's `pools`, sorted by pool id.
    order: Vec<usize>,
    /// Per pool, in id order: its keys, region and spot rate.
    keys: Vec<PoolKeys>,
    /// Pool id to its place in id order.
    pool_pos: IdMap<String, usize>,
    region_keys: IdMap<String, usize>,
    /// Region id to its position in the snapshot's `regions` (the last of equal ids).
    regions: IdMap<String, usize>,
    /// Per region key, and per model key, the first pool (in id order) that has it: where its
    /// spelling is.
    region_key_pool: Vec<usize>,
    model_key_pool: Vec<usize>,
    by_price: [Arc<PriceTable>; 2],
    max_ingress_gbps: u32,
}

#[derive(Debug, Clone, Copy)]
struct PoolKeys {
    region_key: usize,
    model_key: usize,
    /// Position in the snapshot's `regions`.
    region: Option<usize>,
    spot_interruptions_ppm: u32,
    /// See [`PoolInfo::displaced_per_gpu_hour`].
    displaced_per_gpu_hour: Money,
}

/// The snapshot's nodes of known pools in id order, as positions in its `nodes`: what an index
/// knows from the node ids and their pools alone, kept by [`PlanCache`] while they do not
/// change (nodes come and go far less often than their free GPUs change).
#[derive(Debug)]
pub(crate) struct NodeOrder {
    /// Positions in the snapshot's `nodes`, sorted by node id.
    order: Vec<usize>,
    /// Per node (in id order), its pool's place in id order.
    node_pool: Vec<usize>,
    /// Node id to its place in id order.
    node_pos: IdMap<String, usize>,
}

impl NodeOrder {
    fn new(snapshot: &Snapshot, catalogue: &Catalogue) -> NodeOrder {
        let mut nodes: Vec<(usize, usize)> = snapshot
            .nodes
            .iter()
            .enumerate()
            .filter_map(|(i, n)| catalogue.pool_pos.get(n.pool.as_str()).map(|&p| (i, p)))
            .collect();
        let id = |i: usize| &snapshot.nodes[i].id;
        if !nodes.is_sorted_by(|a, b| id(a.0) <= id(b.0)) {
            nodes.sort_unstable_by(|a, b| id(a.0).cmp(id(b.0)));
        }
        let mut node_pos: IdMap<String, usize> = IdMap::default();
        node_pos.reserve(nodes.len());
        for (pos, &(i, _)) in nodes.iter().enumerate() {
            node_pos.insert(id(i).as_str().to_owned(), pos);
        }
        let (order, node_pool) = nodes.into_iter().unzip();
        NodeOrder {
            order,
            node_pool,
            node_pos,
        }
    }
}

impl Catalogue {
    pub(crate) fn new(snapshot: &Snapshot) -> Catalogue {
        let mut regions: IdMap<String, usize> = IdMap::default();
        for (i, r) in snapshot.regions.iter().enumerate() {
            regions.insert(r.id.as_str().to_owned(), i);
        }
        let mut order: Vec<usize> = (0..snapshot.pools.len()).collect();
        let by_id = |&a: &usize, &b: &usize| snapshot.pools[a].id.cmp(&snapshot.pools[b].id);
        order.sort_by(by_id);
        let pools: Vec<&Pool> = order.iter().map(|&i| &snapshot.pools[i]).collect();
        let mut pool_pos: IdMap<String, usize> = IdMap::default();
        for (i, p) in pools.iter().enumerate() {
            pool_pos.insert(p.id.as_str().to_owned(), i);
        }

        let mut region_keys: IdMap<String, usize> = IdMap::default();
        let mut region_key_pool: Vec<usize> = Vec::new();
        let mut model_key_pool: Vec<usize> = Vec::new();
        // Interruption rates by pool id, walked alongside the pools (both sorted by id).
        let mut rates = snapshot.spot_interruptions_per_hour_ppm.iter().peekable();
        let keys: Vec<PoolKeys> = pools
            .iter()
            .enumerate()
            .map(|(i, pool)| {
                let next = region_keys.len();
                let region_key = *region_keys
                    .entry(pool.region.as_str().to_owned())
                    .or_insert_with(|| {
                        region_key_pool.push(i);
                        next
                    });
                // A handful of models: a scan beats hashing a lower-cased copy.
                let model_key = match model_key_pool
                    .iter()
                    .position(|&m| pools[m].gpu_model.eq_ignore_ascii_case(&pool.gpu_model))
                {
                    Some(key) => key,
                    None => {
                        model_key_pool.push(i);
                        model_key_pool.len() - 1
                    }
                };
                while rates.next_if(|(id, _)| **id < pool.id).is_some() {}
                let rate = rates
                    .peek()
                    .filter(|(id, _)| **id == pool.id)
                    .map(|&(_, &r)| r);
                PoolKeys {
                    region_key,
                    model_key,
                    region: regions.get(pool.region.as_str()).copied(),
                    spot_interruptions_ppm: rate.unwrap_or(DEFAULT_SPOT_INTERRUPTIONS_PER_HOUR_PPM),
                    displaced_per_gpu_hour: Money::ZERO,
                }
            })
            .collect();
        let mut keys = keys;
        for (k, pool) in keys.iter_mut().zip(&pools).filter(|(_, p)| !p.launchable) {
            k.displaced_per_gpu_hour = pools
                .iter()
                .filter(|c| c.launchable && c.gpu_memory_gb >= pool.gpu_memory_gb)
                .map(|c| c.on_demand_per_gpu_hour())
                .min()
                .unwrap_or(Money::ZERO);
        }

        let by_price = [SpotRule::Never, SpotRule::Allowed].map(|rule| {
            let mut order: Vec<(Money, usize)> = pools
                .iter()
                .enumerate()
                .map(|(i, pool)| {
                    // The lower of cash and chargeback: a bound on the cost under either
                    // objective ([`super::estimate::JobCtx::floor_cost`]).
                    let market = pool.cheapest_market(rule);
                    let price = pool.price_per_gpu_hour(market);
                    (price.min(pool.cash_per_gpu_hour(market)), i)
                })
                .collect();
            order.sort_unstable();
            Arc::new(PriceTable::new(
                order,
                &pools,
                &keys,
                rule,
                region_key_pool.len(),
                model_key_pool.len(),
            ))
        });

        let max_ingress_gbps = keys
            .iter()
            .map(
                |k| match k.region.map_or(0, |r| snapshot.regions[r].ingress_gbps) {
                    0 => DEFAULT_INGRESS_GBPS,
                    g => g,
                },
            )
            .max()
            .unwrap_or(DEFAULT_INGRESS_GBPS);
        Catalogue {
            order,
            keys,
            pool_pos,
            region_keys,
            regions,
            region_key_pool,
            model_key_pool,
            by_price,
            max_ingress_gbps,
        }
    }
}

/// Planning state a caller keeps between rounds (the simulator, the broker's scheduler): the
/// index of the snapshot's regions, pools and spot interruption rates, built again only when
/// one of them changes, and the order of its nodes, built again only when their ids or pools
/// (or the catalogue) change; and the buffers of the last round's capacity, to build the next
/// one in. Plans made with it are those made without it ([`super::plan_cached`]).
#[derive(Debug, Default)]
pub struct PlanCache {
    /// Set by [`PlanCache::fixed_catalogue`]: the caller's catalogue never changes, so it is
    /// not compared round by round (but in debug builds).
    fixed_catalogue: bool,
    /// The catalogue `catalogue` was built from, to tell when it changes.
    regions: Vec<Region>,
    pools: Vec<Pool>,
    rates: BTreeMap<PoolId, u32>,
    catalogue: Option<Arc<Catalogue>>,
    /// The node ids and pools (in the snapshot's order) `nodes` was built from.
    node_ids: Vec<(NodeId, PoolId)>,
    nodes: Option<Arc<NodeOrder>>,
    /// The last round's capacity, whose buffers the next round's is built in.
    pub(crate) capacity: Option<super::capacity::Capacity>,
    /// Per running attempt of the last round (in the snapshot's order), the position of its
    /// node: a guess for this round's attempt at the same place, checked before it is used.
    pub(crate) attempt_nodes: Vec<usize>,
}

impl PlanCache {
    /// A cache for a caller whose regions, pools and spot interruption rates stay the same
    /// in every snapshot it plans (the simulator: its world is fixed for the run). It indexes
    /// them once and then skips comparing them in full each round — with a few hundred pools,
    /// their strings are the largest part of checking what changed. Debug builds still
    /// compare, and panic if the promise is broken.
    pub fn fixed_catalogue() -> PlanCache {
        PlanCache {
            fixed_catalogue: true,
            ..PlanCache::default()
        }
    }

    /// Whether `snapshot`'s catalogue is the one `catalogue` was built from.
    fn same_catalogue(&self, snapshot: &Snapshot) -> bool {
        self.pools == snapshot.pools
            && self.regions == snapshot.regions
            && self.rates == snapshot.spot_interruptions_per_hour_ppm
    }

    /// The index of `snapshot`'s catalogue, and the order of its nodes: the kept ones while
    /// what they were built from is equal in `snapshot`.
    pub(crate) fn get(&mut self, snapshot: &Snapshot) -> (Arc<Catalogue>, Arc<NodeOrder>) {
        let catalogue = match &self.catalogue {
            Some(c) if self.fixed_catalogue => {
                debug_assert!(
                    self.same_catalogue(snapshot),
                    "a fixed catalogue changed between rounds"
                );
                Arc::clone(c)
            }
            Some(c) if self.same_catalogue(snapshot) => Arc::clone(c),
            _ => {
                self.pools.clone_from(&snapshot.pools);
                self.regions.clone_from(&snapshot.regions);
                self.rates
                    .clone_from(&snapshot.spot_interruptions_per_hour_ppm);
                self.nodes = None;
                Arc::clone(self.catalogue.insert(Arc::new(Catalogue::new(snapshot))))
            }
        };
        let same_nodes = self.node_ids.len() == snapshot.nodes.len()
            && self
                .node_ids
                .iter()
                .zip(&snapshot.nodes)
                .all(|((id, pool), n)| *id == n.id && *pool == n.pool);
        let nodes = match &self.nodes {
            Some(n) if same_nodes => Arc::clone(n),
            _ => {
                self.node_ids.clear();
                self.node_ids.extend(
                    snapshot
                        .nodes
                        .iter()
                        .map(|n| (n.id.clone(), n.pool.clone())),
                );
                Arc::clone(
                    self.nodes
                        .insert(Arc::new(NodeOrder::new(snapshot, &catalogue))),
                )
            }
        };
        (catalogue, nodes)
    }
}

impl<'a> Index<'a> {
    pub(crate) fn new(snapshot: &'a Snapshot, now: Timestamp) -> Index<'a> {
        Index::with_catalogue(
            snapshot,
            now,
            Arc::new(Catalogue::new(snapshot)),
            None,
            &mut Vec::new(),
        )
    }

    /// The index of `snapshot`, given the index of its catalogue (built from this snapshot's
    /// regions, pools and rates, or equal ones) and, when kept, the order of its nodes (built
    /// from nodes with the same ids and pools, in the same order, and the same catalogue);
    /// `None` works it out. `attempt_nodes` holds, per running attempt, a guess at the
    /// position of its node (each checked against the attempt's node id; a wrong or missing
    /// one is looked up), and is left holding this snapshot's positions.
    pub(crate) fn with_catalogue(
        snapshot: &'a Snapshot,
        now: Timestamp,
        catalogue: Arc<Catalogue>,
        nodes: Option<Arc<NodeOrder>>,
        attempt_nodes: &mut Vec<usize>,
    ) -> Index<'a> {
        let cat = &*catalogue;
        let mut pools: Vec<PoolInfo> = cat
            .order
            .iter()
            .zip(&cat.keys)
            .map(|(&i, k)| PoolInfo {
                pool: &snapshot.pools[i],
                region_key: k.region_key,
                model_key: k.model_key,
                region: k.region.map(|r| &snapshot.regions[r]),
                nodes: Vec::new(),
                on_demand_nodes: false,
                spot_nodes: false,
                protected: false,
                displaced_per_gpu_hour: k.displaced_per_gpu_hour,
                spot_interruptions_ppm: k.spot_interruptions_ppm,
            })
            .collect();

        let order = nodes.unwrap_or_else(|| Arc::new(NodeOrder::new(snapshot, cat)));
        let nodes: Vec<&Node> = order.order.iter().map(|&i| &snapshot.nodes[i]).collect();
        let node_pool = order.node_pool.clone();
        for (i, &p) in node_pool.iter().enumerate() {
            let info = &mut pools[p];
            info.nodes.push(i);
            match nodes[i].market {
                Market::OnDemand => info.on_demand_nodes = true,
                Market::Spot => info.spot_nodes = true,
            }
        }
        let mut spot_pools_with_on_demand_nodes: Vec<(Money, usize)> = pools
            .iter()
            .enumerate()
            .filter(|(_, p)| {
                p.on_demand_nodes && p.pool.cheapest_market(SpotRule::Allowed) == Market::Spot
            })
            .map(|(i, p)| {
                let od = Market::OnDemand;
                (
                    p.pool
                        .price_per_gpu_hour(od)
                        .min(p.pool.cash_per_gpu_hour(od)),
                    i,
                )
            })
            .collect();
        spot_pools_with_on_demand_nodes.sort_unstable();
        let one_in = u64::from(
            snapshot
                .reserve_free_below_one_in
                .unwrap_or(crate::domain::DEFAULT_RESERVE_FREE_BELOW_ONE_IN),
        );
        for info in pools.iter_mut().filter(|p| !p.pool.launchable) {
            let (free, total) = info
                .nodes
                .iter()
                .map(|&n| nodes[n])
                .filter(|n| usable(n))
                .fold((0u64, 0u64), |(f, t), n| {
                    let total = n.gpus_total.max(n.gpus_free());
                    (f + u64::from(n.gpus_free()), t + u64::from(total))
                });
            info.protected = one_in > 0 && total > 0 && free * one_in < total;
        }
        let node_pos = &order.node_pos;
        // In the snapshot's order: what reads it goes through the per-node lists below (and
        // the releases, sorted per node), which sort by their own keys.
        // Attempts mostly keep their place from one round to the next: the node found at this
        // place last time is checked (one string comparison) before the id is hashed.
        attempt_nodes.resize(snapshot.running.len(), usize::MAX);
        let mut running: Vec<(usize, &RunningAttempt)> = Vec::with_capacity(snapshot.running.len());
        for (a, guess) in snapshot.running.iter().zip(attempt_nodes.iter_mut()) {
            let hit = nodes.get(*guess).is_some_and(|n| n.id == a.node);
            if !hit {
                *guess = node_pos.get(a.node.as_str()).copied().unwrap_or(usize::MAX);
            }
            if *guess != usize::MAX {
                running.push((*guess, a));
            }
        }
        let mut preemptible = vec![Vec::new(); nodes.len()];
        for (i, (node, attempt)) in running.iter().enumerate() {
            if Victims::LowThenNormal.may_stop(attempt) {
                preemptible[*node].push(i);
            }
        }
        for list in &mut preemptible {
            list.sort_by(|&a, &b| {
                let (x, y) = (running[a].1, running[b].1);
                (x.priority, y.started_at, x.attempt).cmp(&(y.priority, x.started_at, y.attempt))
            });
        }
        let mut preemptible_nodes = [vec![Vec::new(); pools.len()], vec![Vec::new(); pools.len()]];
        for (node, list) in preemptible.iter().enumerate() {
            let n = nodes[node];
            if list.is_empty() || !n.healthy || n.draining {
                continue;
            }
            if running[list[0]].1.priority == Priority::Low {
                preemptible_nodes[Victims::Low as usize][node_pool[node]].push(node);
            }
            preemptible_nodes[Victims::LowThenNormal as usize][node_pool[node]].push(node);
        }
        let mut policies: Vec<&TeamPolicy> = snapshot.policies.iter().collect();
        policies.sort();

        let by_price = [0, 1].map(|o| {
            let table = &cat.by_price[o];
            PriceOrder {
                next_with_nodes: table.next_with_nodes(&pools, o),
                table: Arc::clone(table),
            }
        });
        let region_ids = cat
            .region_key_pool
            .iter()
            .map(|&p| &pools[p].pool.region)
            .collect();
        let model_names: Vec<&str> = cat
            .model_key_pool
            .iter()
            .map(|&p| pools[p].pool.gpu_model.as_str())
            .collect();
        let all_gpus = model_names.iter().all(|m| crate::gpu_model::is_gpu(m));
        Index {
            avoid: &snapshot.avoid,
            max_ingress_gbps: cat.max_ingress_gbps,
            now,
            burst_enabled: snapshot.burst_enabled,
            pools,
            nodes,
            node_pool,
            running,
            preemptible,
            preemptible_nodes,
            spot_pools_with_on_demand_nodes,
            policies,
            by_price,
            regions: &snapshot.regions,
            region_ids,
            model_names,
            all_gpus,
            catalogue,
        }
    }

    /// The positions of the nodes `job` is kept off (usually none), sorted.
    pub(crate) fn avoided(&self, job: JobId) -> Vec<usize> {
        self.avoid.get(&job).map_or_else(Vec::new, |ids| {
            let mut nodes: Vec<usize> = ids
                .iter()
                .filter_map(|id| self.nodes.binary_search_by(|n| n.id.cmp(id)).ok())
                .collect();
            nodes.sort_unstable();
            nodes
        })
    }

    /// The interned key of a region that has a pool; `None` when no pool is there.
    pub(crate) fn region_key(&self, id: &RegionId) -> Option<usize> {
        self.catalogue.region_keys.get(id.as_str()).copied()
    }

    pub(crate) fn region(&self, id: &RegionId) -> Option<&'a Region> {
        let regions = self.regions;
        self.catalogue
            .regions
            .get(id.as_str())
            .map(|&r| &regions[r])
    }

    /// Which of [`Index::price_orders`] lists pools by the price a job with this spot rule
    /// pays there: 0 on demand, 1 the cheaper market.
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
        usable(self.nodes[node])
    }
}

/// Whether a node receives work and counts for waiting: healthy and not draining.
fn usable(node: &Node) -> bool {
    node.healthy && !node.draining
}

/// Pools by the GPU-hour price a job pays there, cheapest first (ties by id), with what the
/// pruned scan needs to bound what the pools from a position on can offer: the catalogue's
/// [`PriceTable`] and what depends on the round's nodes.
#[derive(Debug)]
pub(crate) struct PriceOrder {
    table: Arc<PriceTable>,
    /// Per position, the first position from it on of a pool with nodes the order's jobs may
    /// take there ([`super::estimate::JobCtx::node_markets`]) at the order's price or more
    /// (`len`: none): only those offer a share of a node (free now, a wait, a preemption); the
    /// others only launch.
    pub next_with_nodes: Vec<usize>,
}

impl std::ops::Deref for PriceOrder {
    type Target = PriceTable;

    fn deref(&self) -> &PriceTable {
        &self.table
    }
}

/// The part of a [`PriceOrder`] known from the catalogue alone.
#[derive(Debug)]
pub(crate) struct PriceTable {
    pub pools: Vec<(Money, usize)>,
    /// Per position, the first position with a higher price (the end of its price tier).
    pub tier_end: Vec<usize>,
    /// Per position, the smallest pool position from it to the end of its tier.
    pub tier_min_pool: Vec<usize>,
    /// Per position, the shortest boot time of a launchable pool from it on (`None`: none).
    pub min_boot_from: Vec<Option<u32>>,
    /// Per position, the lowest spot interruption rate (ppm per hour) and, on its own, the
    /// shortest boot time of the pools from it on that offer spot candidates to jobs that
    /// allow spot (their spot price is their cheapest; `None`: no such pool): what the spot
    /// overhead of a candidate there is at least ([`super::estimate::spot_overhead_s`]).
    pub min_spot_risk_from: Vec<Option<(u32, u32)>>,
    /// Per entry of `gpus_at_least` (pools with nodes of at least that many GPUs), per
    /// position, the lowest node-hour price (in the cheapest market the order's jobs may use)
    /// of such a launchable pool from it on: what a launch there pays at least per node.
    pub min_node_price_from: Vec<Vec<Option<Money>>>,
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

    /// Makes this [`PoolMask::empty`] of `len`, in the allocation it has.
    pub(crate) fn clear_to(&mut self, len: usize) {
        self.0.clear();
        self.0.resize(len.div_ceil(64), 0);
    }

    /// Makes this every position below `len`, in the allocation it has.
    pub(crate) fn fill_to(&mut self, len: usize) {
        self.0.clear();
        self.0.resize(len.div_ceil(64), u64::MAX);
        if let Some(last) = self.0.last_mut()
            && !len.is_multiple_of(64)
        {
            *last = (1 << (len % 64)) - 1;
        }
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

impl PriceTable {
    fn new(
        pools: Vec<(Money, usize)>,
        info: &[&Pool],
        keys: &[PoolKeys],
        spot: SpotRule,
        regions: usize,
        models: usize,
    ) -> PriceTable {
        let n = pools.len();
        let mut in_region = vec![PoolMask::empty(n); regions];
        let mut of_model = vec![PoolMask::empty(n); models];
        let mut sizes: Vec<u32> = info.iter().map(|p| p.gpus_per_node).collect();
        sizes.sort_unstable();
        sizes.dedup();
        let mut gpus_at_least: Vec<(u32, PoolMask)> =
            sizes.into_iter().map(|g| (g, PoolMask::empty(n))).collect();
        for (pos, &(_, pool)) in pools.iter().enumerate() {
            in_region[keys[pool].region_key].insert(pos);
            of_model[keys[pool].model_key].insert(pos);
            for (g, mask) in &mut gpus_at_least {
                if info[pool].gpus_per_node >= *g {
                    mask.insert(pos);
                }
            }
        }
        let mut tier_end = vec![n; n];
        let mut tier_min_pool = vec![usize::MAX; n];
        let mut min_boot_from = vec![None; n];
        let mut boot: Option<u32> = None;
        let mut min_spot_risk_from = vec![None; n];
        let mut risk: Option<(u32, u32)> = None;
        let mut min_node_price_from = vec![vec![None; n + 1]; gpus_at_least.len()];
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
            let p = info[pool];
            if p.launchable {
                boot = Some(boot.map_or(p.boot_time_s, |b| b.min(p.boot_time_s)));
            }
            min_boot_from[i] = boot;
            if p.cheapest_market(SpotRule::Allowed) == Market::Spot {
                let (rate, boot) = (keys[pool].spot_interruptions_ppm, p.boot_time_s);
                risk = Some(risk.map_or((rate, boot), |(r, b)| (r.min(rate), b.min(boot))));
            }
            min_spot_risk_from[i] = risk;
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
        }
        let mut position = vec![0; n];
        for (pos, &(_, pool)) in pools.iter().enumerate() {
            position[pool] = pos;
        }
        PriceTable {
            position,
            pools,
            tier_end,
            tier_min_pool,
            min_boot_from,
            min_spot_risk_from,
            min_node_price_from,
            in_region,
            of_model,
            gpus_at_least,
        }
    }

    /// Per position, the first position from it on of a pool with nodes that the jobs of
    /// price order `order` may take at (at least) the order's price there (`len`: none). Where
    /// a pool sells spot cheaper, those are its spot nodes by the cheaper market and its
    /// on-demand nodes by on-demand price (a late job that allows spot and takes a spot node
    /// there has its spot candidates bounded apart, by their delay); elsewhere any node.
    fn next_with_nodes(&self, pools: &[PoolInfo], order: usize) -> Vec<usize> {
        let n = self.pools.len();
        let mut next = vec![n; n + 1];
        for i in (0..n).rev() {
            let info = &pools[self.pools[i].1];
            let takes = match info.pool.cheapest_market(SpotRule::Allowed) {
                Market::Spot if order == 0 => info.on_demand_nodes,
                Market::Spot => info.spot_nodes,
                Market::OnDemand => !info.nodes.is_empty(),
            };
            next[i] = if takes { i } else { next[i + 1] };
        }
        next
    }
}

//! A [`PlanCache`] kept across rounds must never change a plan: through a run of rounds whose
//! snapshot changes a little each time (free GPUs, nodes joining and leaving, a price, a spot
//! rate, a region's latency, the order of the vectors), each plan made with the cache is the
//! one made without it, and the broker's `plan_shared_cached` explains as `plan` does.

use super::fleet::{NOW, fleet};
use super::{Detail, PlanCache, plan_cached, plan_shared_cached, plan_with};
use crate::domain::*;
use crate::money::Money;
use proptest::prelude::*;

/// One change between two rounds.
#[derive(Clone, Debug)]
enum Change {
    /// A node's free GPUs (by position, modulo the node count).
    FreeGpus(usize, u32),
    /// A node leaves.
    NodeLeaves(usize),
    /// A node of pool `.0` joins, with id suffix `.1`.
    NodeJoins(usize, u32),
    /// A pool's on-demand price moves by `.1` micros.
    Price(usize, i64),
    /// A pool's spot interruption rate is set.
    SpotRate(usize, u32),
    /// A region's latency changes.
    Latency(usize, u32),
    /// The pools, nodes and regions are listed in reverse.
    Reverse,
    /// A queued job leaves.
    JobLeaves(usize),
}

fn change() -> impl Strategy<Value = Change> {
    prop_oneof![
        3 => (any::<usize>(), 0u32..9).prop_map(|(n, f)| Change::FreeGpus(n, f)),
        1 => any::<usize>().prop_map(Change::NodeLeaves),
        1 => (any::<usize>(), any::<u32>()).prop_map(|(p, s)| Change::NodeJoins(p, s)),
        1 => (any::<usize>(), -500_000i64..500_000).prop_map(|(p, d)| Change::Price(p, d)),
        1 => (any::<usize>(), 0u32..200_000).prop_map(|(p, r)| Change::SpotRate(p, r)),
        1 => (any::<usize>(), 1u32..300).prop_map(|(r, l)| Change::Latency(r, l)),
        1 => Just(Change::Reverse),
        1 => any::<usize>().prop_map(Change::JobLeaves),
    ]
}

/// Whether `change` touches the regions, pools or spot rates (what a
/// [`PlanCache::fixed_catalogue`] is promised never change).
fn changes_catalogue(change: &Change) -> bool {
    matches!(
        change,
        Change::Price(..) | Change::SpotRate(..) | Change::Latency(..) | Change::Reverse
    )
}

fn apply(snapshot: &mut Snapshot, change: &Change) {
    let pick = |i: usize, len: usize| (len > 0).then(|| i % len);
    match *change {
        Change::FreeGpus(n, free) => {
            if let Some(n) = pick(n, snapshot.nodes.len()) {
                let node = &mut snapshot.nodes[n];
                node.free_gpus = super::top_gpus(node.gpus_total, free.min(node.gpus_total));
            }
        }
        Change::NodeLeaves(n) => {
            if let Some(n) = pick(n, snapshot.nodes.len()) {
                snapshot.nodes.swap_remove(n);
            }
        }
        Change::NodeJoins(p, suffix) => {
            if let Some(p) = pick(p, snapshot.pools.len()) {
                let pool = &snapshot.pools[p];
                snapshot.nodes.push(Node {
                    id: NodeId::new(format!("{}/joined-{suffix}", pool.id)),
                    pool: pool.id.clone(),
                    gpus_total: pool.gpus_per_node,
                    free_gpus: GpuSet::first(pool.gpus_per_node).expect("at most 64 GPUs"),
                    healthy: true,
                    draining: false,
                    last_heartbeat: NOW,
                    market: Market::OnDemand,
                });
            }
        }
        Change::Price(p, delta) => {
            if let Some(p) = pick(p, snapshot.pools.len()) {
                let pool = &mut snapshot.pools[p];
                let price = pool
                    .on_demand_per_hour
                    .micros()
                    .saturating_add(delta)
                    .max(1);
                pool.on_demand_per_hour = Money::from_micros(price);
            }
        }
        Change::SpotRate(p, rate) => {
            if let Some(p) = pick(p, snapshot.pools.len()) {
                let id = snapshot.pools[p].id.clone();
                snapshot.spot_interruptions_per_hour_ppm.insert(id, rate);
            }
        }
        Change::Latency(r, latency) => {
            if let Some(r) = pick(r, snapshot.regions.len()) {
                snapshot.regions[r].latency_ms = latency;
            }
        }
        Change::Reverse => {
            snapshot.pools.reverse();
            snapshot.nodes.reverse();
            snapshot.regions.reverse();
        }
        Change::JobLeaves(j) => {
            if let Some(j) = pick(j, snapshot.queued.len()) {
                snapshot.queued.swap_remove(j);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn a_kept_cache_plans_as_no_cache(
        seed in any::<u64>(),
        jobs in 1usize..40,
        pools in 1usize..60,
        nodes in 0usize..80,
        changes in proptest::collection::vec(change(), 1..12),
    ) {
        let mut snapshot = fleet(seed, jobs, pools, nodes);
        let mut cache = PlanCache::default();
        // The simulator's cache: the same changes but those to the catalogue.
        let mut fixed_snapshot = snapshot.clone();
        let mut fixed = PlanCache::fixed_catalogue();
        let mut now = NOW;
        for change in std::iter::once(None).chain(changes.iter().map(Some)) {
            if let Some(change) = change {
                apply(&mut snapshot, change);
                if !changes_catalogue(change) {
                    apply(&mut fixed_snapshot, change);
                }
            }
            now = now.plus_secs(30);
            let cached = plan_cached(&mut cache, &snapshot, now, Detail::Outcomes);
            prop_assert_eq!(&cached, &plan_with(&snapshot, now, Detail::Outcomes));
            prop_assert_eq!(
                plan_cached(&mut fixed, &fixed_snapshot, now, Detail::Outcomes),
                plan_with(&fixed_snapshot, now, Detail::Outcomes)
            );
            // The same round again, with nothing changed, from what the cache kept.
            prop_assert_eq!(&cached, &plan_cached(&mut cache, &snapshot, now, Detail::Outcomes));
        }
        // As the broker plans: explanations and all, those of `plan`.
        let shared = plan_shared_cached(&mut cache, std::sync::Arc::new(snapshot.clone()), now);
        prop_assert_eq!(&shared, &super::plan(&snapshot, now));
    }
}

/// A fixed catalogue that changes anyway is a caller's bug: debug builds (the tests) catch it.
#[cfg(debug_assertions)]
#[test]
#[should_panic(expected = "a fixed catalogue changed between rounds")]
fn a_fixed_catalogue_that_changes_panics_in_debug_builds() {
    let mut snapshot = fleet(1, 4, 6, 8);
    let mut cache = PlanCache::fixed_catalogue();
    let _ = plan_cached(&mut cache, &snapshot, NOW, Detail::Outcomes);
    apply(&mut snapshot, &Change::Latency(0, 250));
    let _ = plan_cached(&mut cache, &snapshot, NOW, Detail::Outcomes);
}

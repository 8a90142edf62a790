//! [`Capacity::restore`] must give back exactly the capacity the round started from: after a
//! round that assigned, reserved, preempted and launched, every answer the capacity gives (free
//! GPUs, best fits, wait estimates, the free-now masks, node limits) is the one a capacity built
//! afresh from the same index gives.

use super::super::capacity::Capacity;
use super::super::greedy::{Round, Scan};
use super::super::index::{Index, Victims};
use super::Detail;
use super::fleet::{NOW, fleet};
use crate::domain::Priority;
use proptest::prelude::*;

/// Every query `a` and `b` answer, for every pool and GPU count a job may ask for.
fn assert_same(index: &Index, a: &mut Capacity, b: &mut Capacity) {
    for pool in 0..index.pools.len() {
        assert_eq!(
            a.most_free(pool),
            b.most_free(pool),
            "pool {pool}: most free"
        );
        assert_eq!(
            a.pool_size(index, pool),
            b.pool_size(index, pool),
            "pool {pool}: size"
        );
        for gpus in 0..=9 {
            assert_eq!(
                a.best_fit(pool, gpus),
                b.best_fit(pool, gpus),
                "best fit {pool}/{gpus}"
            );
            for n in 1..=3 {
                assert_eq!(
                    a.best_fit_n(pool, gpus, n),
                    b.best_fit_n(pool, gpus, n),
                    "best fit of {n} in {pool}/{gpus}"
                );
                assert_eq!(
                    a.earliest_free_n(index, pool, gpus, n),
                    b.earliest_free_n(index, pool, gpus, n),
                    "earliest {n} in {pool}/{gpus}"
                );
            }
        }
    }
    for order in 0..2 {
        for gpus in 0..=9 {
            assert_eq!(
                a.free_now(order, gpus),
                b.free_now(order, gpus),
                "free now {gpus}"
            );
        }
    }
    for node in 0..index.nodes.len() {
        for gpus in 1..=8 {
            assert_eq!(
                a.preemption_on(index, node, gpus, Victims::LowThenNormal),
                b.preemption_on(index, node, gpus, Victims::LowThenNormal),
                "preemption on {node} for {gpus}"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn restore_gives_back_the_starting_capacity(
        seed in any::<u64>(),
        jobs in 1usize..120,
        pools in 1usize..12,
        nodes in 0usize..60,
        low in 0u64..4,
    ) {
        let mut snapshot = fleet(seed, jobs, pools, nodes);
        // Some running work preemptible, so high-priority jobs may stop it.
        for (i, r) in snapshot.running.iter_mut().enumerate() {
            if (i as u64) % 4 < low {
                r.priority = Priority::Low;
            }
        }
        let mut round = Round::new(Index::new(&snapshot, NOW), Scan::Pruned, Detail::Outcomes);
        // Touch some pools' memos and trees before the round changes anything.
        let mut fresh = Capacity::new(&round.index);
        assert_same(&round.index, &mut round.capacity, &mut fresh);
        for job in &snapshot.queued {
            round.place(job);
        }
        prop_assert!(round.capacity.leaves_agree(&round.index));
        round.capacity.restore(&round.index);
        let mut fresh = Capacity::new(&round.index);
        assert_same(&round.index, &mut round.capacity, &mut fresh);
        // A second round from the restored capacity plans as the first did.
        let first = round.reset();
        for job in &snapshot.queued {
            round.place(job);
        }
        prop_assert_eq!(&first.assignments, &round.plan.assignments);
        prop_assert_eq!(&first.launches, &round.plan.launches);
        prop_assert_eq!(&first.preemptions, &round.plan.preemptions);
    }
}

//! The pruned pool scan must plan exactly as the exhaustive one — the same decisions and the
//! same explanations — on fleets large enough that pruning cuts most scans short.

use super::fleet::{NOW, fleet};
use super::greedy::{self, Scan};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn pruning_changes_nothing(
        seed in any::<u64>(),
        jobs in 1usize..60,
        pools in 1usize..150,
        nodes in 0usize..200,
        burst_enabled in any::<bool>(),
    ) {
        let mut snapshot = fleet(seed, jobs, pools, nodes);
        snapshot.burst_enabled = burst_enabled;
        let pruned = greedy::plan(&snapshot, NOW, Scan::Pruned);
        let exhaustive = greedy::plan(&snapshot, NOW, Scan::Exhaustive);
        prop_assert_eq!(pruned, exhaustive);
    }
}

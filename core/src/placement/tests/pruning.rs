//! The pruned pool scan must plan exactly as the exhaustive one — the same decisions and the
//! same explanations — on fleets large enough that pruning cuts most scans short; a plan
//! without candidate lists (`Detail::Outcomes`) must decide exactly as a full one; and skipping
//! the joint assignment when nothing was contended must change nothing.

use super::fleet::{NOW, fleet};
use super::greedy::{self, Scan};
use super::{Detail, Plan};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

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
        let pruned = greedy::plan(&snapshot, NOW, Scan::Pruned, Detail::Full);
        let exhaustive = greedy::plan(&snapshot, NOW, Scan::Exhaustive, Detail::Full);
        prop_assert_eq!(&pruned, &exhaustive);
        let lean = greedy::plan(&snapshot, NOW, Scan::Pruned, Detail::Outcomes);
        let batched = greedy::plan_always_batched(&snapshot, NOW, Scan::Pruned);
        prop_assert_eq!(&batched, &pruned);
        prop_assert_eq!(without_candidates(pruned), lean);
    }
}

/// The plan without its candidate lists.
fn without_candidates(mut plan: Plan) -> Plan {
    plan.details = Default::default();
    plan
}

//! The pruned pool scan must plan exactly as the exhaustive one — the same decisions and the
//! same explanations — on fleets large enough that pruning cuts most scans short; a plan
//! without candidate lists (`Detail::Outcomes`) must decide exactly as a full one, and one that
//! works them out on demand (`plan`) must end up with the same ones; and skipping
//! the joint assignment when nothing was contended must change nothing.

use super::fleet::{NOW, fleet};
use super::greedy::{self, Scan};
use super::{Detail, Plan};
use crate::domain::{
    Objective, Priority, PriorityWindows, RegionId, SpotRule, TeamPolicy, TimeWindow,
};
use crate::money::Money;
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
        rates in prop::collection::vec(prop::sample::select(vec![0u32, 500, 20_000, 400_000]), 0..150),
    ) {
        let mut snapshot = fleet(seed, jobs, pools, nodes);
        snapshot.burst_enabled = burst_enabled;
        keep_some_off_nodes(&mut snapshot, seed);
        // Observed interruption rates for some pools (none at all for a few): the bounds on
        // spot candidates use the lowest rate left in the scan.
        for (pool, rate) in snapshot.pools.iter().zip(rates) {
            snapshot.spot_interruptions_per_hour_ppm.insert(pool.id.clone(), rate);
        }
        let pruned = greedy::plan(&snapshot, NOW, Scan::Pruned, Detail::Full);
        let exhaustive = greedy::plan(&snapshot, NOW, Scan::Exhaustive, Detail::Full);
        prop_assert_eq!(&pruned, &exhaustive);
        let lean = greedy::plan(&snapshot, NOW, Scan::Pruned, Detail::Outcomes);
        let batched = greedy::plan_always_batched(&snapshot, NOW, Scan::Pruned);
        prop_assert_eq!(&batched, &pruned);
        // `plan` decides with outcomes only and works the candidate lists out on the first
        // request: the same plan, explanations and all.
        let on_demand = super::plan(&snapshot, NOW);
        prop_assert!(matches!(on_demand.details, super::explain::Explained::OnDemand(_)));
        // A few jobs' lists worked out alone are theirs in the full replay.
        let some: Vec<_> = snapshot.queued.iter().step_by(3).map(|j| j.id).collect();
        let alone = on_demand.explanations_of(&some);
        prop_assert_eq!(alone.len(), some.len());
        for e in &alone {
            prop_assert_eq!(Some(e.clone()), pruned.explanation(&e.job));
        }
        prop_assert_eq!(&on_demand, &pruned);
        prop_assert_eq!(without_candidates(pruned), lean);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// The same at the edges of the arithmetic: runtimes so long that finishes, costs and
    /// lateness saturate, and regions that pay for data leaving them (negative egress).
    #[test]
    fn pruning_changes_nothing_at_the_extremes(
        seed in any::<u64>(),
        jobs in 1usize..40,
        pools in 1usize..100,
        nodes in 0usize..150,
        huge in prop::sample::select(vec![i64::MAX, i64::MAX / 1000, 1 << 53]),
    ) {
        let mut snapshot = fleet(seed, jobs, pools, nodes);
        for (i, job) in snapshot.queued.iter_mut().enumerate() {
            if i % 3 == 0 {
                job.spec.estimated_runtime_s = Some(huge);
            }
        }
        for (i, region) in snapshot.regions.iter_mut().enumerate() {
            if i % 2 == 1 {
                region.egress_per_gb = crate::Money::from_micros(-50_000);
            }
        }
        let pruned = greedy::plan(&snapshot, NOW, Scan::Pruned, Detail::Full);
        let exhaustive = greedy::plan(&snapshot, NOW, Scan::Exhaustive, Detail::Full);
        prop_assert_eq!(&pruned, &exhaustive);
        let batched = greedy::plan_always_batched(&snapshot, NOW, Scan::Pruned);
        prop_assert_eq!(&batched, &pruned);
        let lean = greedy::plan(&snapshot, NOW, Scan::Pruned, Detail::Outcomes);
        prop_assert_eq!(without_candidates(pruned), lean);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// The same with the rules the fleet alone lacks: gangs of two and three nodes, and team
    /// and project policies — allow-lists, a GPU-hour ceiling, a spot cap, no bursting, time
    /// windows shut now for some priorities, priority ceilings, and budgets small enough that
    /// the round runs out of them.
    #[test]
    fn pruning_changes_nothing_under_policies_and_gangs(
        seed in any::<u64>(),
        jobs in 1usize..50,
        pools in 1usize..120,
        nodes in 0usize..180,
        gang_every in 2usize..6,
        budget in prop::sample::select(vec![0i64, 2_000_000, 40_000_000, 400_000_000]),
        project_budget in prop::option::of(prop::sample::select(vec![1_000_000i64, 20_000_000])),
        max_per_gpu_hour in prop::option::of(prop::sample::select(vec![1_000_000i64, 3_000_000])),
        providers in prop::sample::subsequence(vec!["onprem", "aws", "gcp", "azure"], 0..=4),
        spot_cap in prop::sample::select(vec![SpotRule::Never, SpotRule::Allowed, SpotRule::Preferred]),
        burst_allowed in any::<bool>(),
        shut in prop::sample::subsequence(vec![Priority::Low, Priority::Normal, Priority::High], 0..=3),
        ceiling in prop::option::of(prop::sample::select(vec![Priority::Low, Priority::Normal])),
    ) {
        let mut snapshot = fleet(seed, jobs, pools, nodes);
        let teams = ["ml", "research", "infra"];
        for (i, job) in snapshot.queued.iter_mut().enumerate() {
            job.spec.team = teams[i % teams.len()].into();
            if i % 2 == 0 {
                job.spec.project = Some("vision".into());
            }
            if i % gang_every == 0 {
                job.spec.resources.nodes = 2 + (i % 2) as u32;
            }
        }
        // A window that leaves out the current minute of the day.
        let minute = u16::try_from(NOW.millis().rem_euclid(86_400_000) / 60_000).unwrap_or(0);
        let later = TimeWindow {
            start_minute: (minute + 1) % 1440,
            end_minute: (minute + 60) % 1440,
        };
        let open = TimeWindow { start_minute: minute, end_minute: (minute + 1) % 1440 };
        let regions: Vec<RegionId> =
            snapshot.regions.iter().step_by(2).map(|r| r.id.clone()).collect();
        snapshot.policies = vec![
            TeamPolicy {
                team: "research".into(),
                project: None,
                allowed_providers: providers.iter().map(|p| p.to_string()).collect(),
                allowed_regions: vec![],
                max_price_per_gpu_hour: max_per_gpu_hour.map(Money::from_micros),
                spot: spot_cap,
                burst_allowed,
                windows: vec![
                    PriorityWindows { priorities: shut, windows: vec![later] },
                    PriorityWindows { priorities: vec![], windows: vec![open, later] },
                ],
                priority_ceiling: ceiling,
                remaining_budget: Some(Money::from_micros(budget)),
                objective: if budget % 2 == 0 { Objective::Team } else { Objective::Company },
            },
            TeamPolicy {
                team: "infra".into(),
                project: None,
                allowed_providers: vec![],
                allowed_regions: vec![],
                max_price_per_gpu_hour: None,
                spot: SpotRule::Preferred,
                burst_allowed: true,
                windows: vec![],
                priority_ceiling: None,
                remaining_budget: Some(Money::from_micros(budget.saturating_mul(10))),
                objective: Objective::Company,
            },
            TeamPolicy {
                team: "infra".into(),
                project: Some("vision".into()),
                allowed_providers: vec![],
                allowed_regions: regions,
                max_price_per_gpu_hour: None,
                spot: SpotRule::Allowed,
                burst_allowed: true,
                windows: vec![],
                priority_ceiling: Some(Priority::Normal),
                remaining_budget: project_budget.map(Money::from_micros),
                objective: Objective::Company,
            },
        ];
        let pruned = greedy::plan(&snapshot, NOW, Scan::Pruned, Detail::Full);
        let exhaustive = greedy::plan(&snapshot, NOW, Scan::Exhaustive, Detail::Full);
        prop_assert_eq!(&pruned, &exhaustive);
        let batched = greedy::plan_always_batched(&snapshot, NOW, Scan::Pruned);
        prop_assert_eq!(&batched, &pruned);
        prop_assert_eq!(&super::plan(&snapshot, NOW), &pruned);
        let lean = greedy::plan(&snapshot, NOW, Scan::Pruned, Detail::Outcomes);
        prop_assert_eq!(without_candidates(pruned), lean);
    }
}

/// The plan without its candidate lists.
fn without_candidates(mut plan: Plan) -> Plan {
    plan.details = Default::default();
    plan
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// `Planner` places with outcomes only; its explanations, worked out by placing the same
    /// jobs again with candidate lists, are those a placement that recorded them gives.
    #[test]
    fn the_planner_explains_what_it_placed(
        seed in any::<u64>(),
        jobs in 1usize..40,
        pools in 1usize..100,
        nodes in 0usize..150,
    ) {
        let snapshot = fleet(seed, jobs, pools, nodes);
        let mut planner = super::Planner::new(&snapshot, NOW);
        let index = super::index::Index::new(&snapshot, NOW);
        let mut recorded = greedy::Round::new(index, Scan::Pruned, Detail::Full);
        for (i, job) in snapshot.queued.iter().enumerate() {
            let outcome = planner.place(job).outcome.clone();
            prop_assert_eq!(&recorded.place(job).outcome, &outcome);
            // Asked for between placements too: the next placement starts a new replay.
            if i % 3 == 0 {
                let first = &snapshot.queued[0].id;
                prop_assert_eq!(planner.explanation(first), recorded.plan.explanation(first));
            }
        }
        for job in &snapshot.queued {
            prop_assert_eq!(planner.explanation(&job.id), recorded.plan.explanation(&job.id));
        }
    }
}

/// Keeps every fifth queued job off one or two nodes (as the broker keeps a service's replica
/// off the node its others are on): the pruned scan must still plan as the exhaustive one.
fn keep_some_off_nodes(snapshot: &mut crate::domain::Snapshot, seed: u64) {
    if snapshot.nodes.is_empty() {
        return;
    }
    let n = snapshot.nodes.len();
    for (i, job) in snapshot
        .queued
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 5 == 0)
    {
        let a = (seed as usize).wrapping_add(i * 7) % n;
        let b = (seed as usize).wrapping_add(i * 13 + 1) % n;
        let mut nodes = vec![snapshot.nodes[a].id.clone()];
        if i % 2 == 0 {
            nodes.push(snapshot.nodes[b].id.clone());
        }
        snapshot.avoid.insert(job.id, nodes);
    }
}

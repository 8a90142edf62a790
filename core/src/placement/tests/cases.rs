//! The placement tables: one line per case, `check(world, expected outcome)`. Kept one-line on
//! purpose (`rustfmt::skip`): a table reads down, not across.

use super::*;
use crate::domain::{Objective, TeamPolicy};

const P5: &str = "aws:use1/p5";
const DGX: &str = "onprem:dc1/dgx";
const WAIT_DGX: &str = "wait onprem:dc1/dgx +3600s";

/// On-prem 8×H100 at $16/h ($2/GPU-h) with node `d1`; AWS 8×H100 at $80/h ($10/GPU-h), spot
/// $32/h, launchable, with node `a1`.
fn two_pools(dgx_free: u32, p5_free: u32) -> W {
    w().onprem("dgx", 16.0)
        .node(DGX, "d1", dgx_free)
        .pool(P5, "H100", 8, 80.0, Some(32.0))
        .node(P5, "a1", p5_free)
}

#[rustfmt::skip]
#[test]
fn cheapest_feasible_wins() {
    check(two_pools(8, 8).job(1), "assign d1 on_demand");
    check(two_pools(8, 8).job(8), "assign d1 on_demand");
    check(two_pools(0, 8).job(1).deadline_in(7200), "assign a1 on_demand");
    check(two_pools(2, 8).job(4), "assign a1 on_demand");
    // On-prem billed at $20/GPU-h costs the company a fifth of that ($4): it wins on cash
    // over $10 in the cloud, and loses where the team minimises its bill.
    let dear = || w().onprem("dgx", 160.0).node(DGX, "d1", 8).pool(P5, "H100", 8, 80.0, None).node(P5, "a1", 8).job(1);
    check(dear(), "assign d1 on_demand");
    check(dear().policy(TeamPolicy { objective: Objective::Team, ..TeamPolicy::new("ml") }), "assign a1 on_demand");
    check(w().pool(P5, "H100", 8, 80.0, None).job(1), "launch aws:use1/p5 on_demand");
}

#[rustfmt::skip]
#[test]
fn waiting_for_cheaper_capacity_beats_bursting_when_the_deadline_allows() {
    let busy = || two_pools(0, 0).busy("d1", 8, 3600).busy("a1", 8, 36_000);
    check(busy().job(1), WAIT_DGX);
    check(busy().job(1).deadline_in(3 * 3600), WAIT_DGX);
    // Finish at +2h plus a 180 s margin (5% of the runtime) lands exactly on the deadline.
    check(busy().job(8).deadline_in(2 * 3600 + 180), WAIT_DGX);
    check(busy().job(8).deadline_in(2 * 3600 + 179), "launch aws:use1/p5 on_demand");
    // Waiting would finish past the deadline: burst (boot 5 min).
    check(busy().job(1).deadline_in(5400), "launch aws:use1/p5 on_demand");
    // Nothing can make it: the earliest finish (the least late), not the cheapest.
    check(busy().job(1).deadline_in(600), "launch aws:use1/p5 on_demand");
    // Overdue work is expected to end shortly, not never.
    check(two_pools(0, 0).busy("d1", 8, -50).job(1), "wait onprem:dc1/dgx +60s");
    // Services never free their GPUs.
    check(two_pools(0, 0).service_on("d1", 8).service_on("a1", 8).job(1), "launch aws:use1/p5 on_demand");
    // Releases add up: 2 free, +2 at 10 min, +4 at 20 min.
    check(two_pools(2, 0).busy("d1", 2, 600).busy("d1", 4, 1200).job(8), "wait onprem:dc1/dgx +1200s");
}

#[rustfmt::skip]
#[test]
fn burst_disabled_waits_or_holds() {
    let busy = || two_pools(0, 0).busy("d1", 8, 3600).service_on("a1", 8).no_burst();
    check(busy().job(1).deadline_in(5400), WAIT_DGX);
    check(w().onprem("dgx", 16.0).node(DGX, "d1", 0).service_on("d1", 8).pool(P5, "H100", 8, 80.0, None).no_burst().job(1), &hold(&[(BURST_OFF, 1), (NO_CAPACITY, 1)]));
    check(w().pool(P5, "H100", 8, 80.0, None).no_burst().job(1), &hold(&[(BURST_OFF, 1)]));
}

#[rustfmt::skip]
#[test]
fn quota_limits_launches() {
    let one = || w().pool(P5, "H100", 8, 80.0, None).limit(P5, 1);
    check(one().job(8), "launch aws:use1/p5 on_demand");
    check(one().job(8).job(8), &format!("j1: launch aws:use1/p5 on_demand | j2: {}", hold(&[(QUOTA, 1)])));
    check(one().node(P5, "a1", 0).service_on("a1", 8).job(1), &hold(&[(QUOTA, 1), (NO_CAPACITY, 1)]));
    // Unhealthy nodes still count against the quota.
    check(one().node(P5, "a1", 8).sick("a1").job(1), &hold(&[(QUOTA, 1), (NO_CAPACITY, 1)]));
    check(one().limit(P5, 2).node(P5, "a1", 8).sick("a1").job(1), "launch aws:use1/p5 on_demand");
}

#[rustfmt::skip]
#[test]
fn max_price_filters_pools() {
    let over = |max: &str| format!("costs more than the job's maximum of {max}/h");
    check(two_pools(8, 8).job(1).max_price(5.0), "assign d1 on_demand");
    check(two_pools(0, 8).job(1).max_price(5.0), &hold(&[(NO_CAPACITY, 1), (&over("$5.00"), 1)]));
    check(two_pools(0, 8).job(1).max_price(10.0), "assign a1 on_demand");
    check(two_pools(0, 8).job(2).max_price(10.0), &hold(&[(NO_CAPACITY, 1), (&over("$10.00"), 1)]));
    // Spot brings the price under the ceiling ($4/GPU-h): on a spot node, or a new one (a1,
    // bought on demand, is over it).
    check(two_pools(0, 8).spot_node("a1").job(1).max_price(5.0).spot(SpotRule::Allowed), "assign a1 spot");
    check(two_pools(0, 8).job(1).max_price(5.0).spot(SpotRule::Allowed), "launch aws:use1/p5 spot");
    check(two_pools(0, 0).busy("d1", 8, 3600).job(1).max_price(5.0).deadline_in(1800), WAIT_DGX);
    // On-prem charges its internal rate even where it lists a cheaper spot figure.
    check(w().pool(DGX, "H100", 8, 16.0, Some(8.0)).node(DGX, "d1", 8).job(1).max_price(1.5).spot(SpotRule::Allowed), &hold(&[(&over("$1.50"), 1)]));
}

#[rustfmt::skip]
#[test]
fn gpu_model_and_memory_filter_pools() {
    let mixed = || two_pools(8, 8).pool("aws:use1/g6", "L4", 8, 2.0, None).node("aws:use1/g6", "l1", 8);
    check(mixed().job(1), "assign l1 on_demand");
    check(mixed().job(1).models(&["H100"]), "assign d1 on_demand");
    check(mixed().job(1).models(&["h100"]), "assign d1 on_demand");
    check(mixed().job(1).models(&["L4", "A10G"]), "assign l1 on_demand");
    check(mixed().job(1).with(|j| j.resources.min_gpu_memory_gb = 40), "assign d1 on_demand");
    check(mixed().job(1).models(&["B200"]), &hold(&[(MODEL, 3)]));
    check(mixed().job(16), &hold(&[("fewer than 16 GPUs per node", 3)]));
}

#[rustfmt::skip]
#[test]
fn region_allow_list() {
    let three = || two_pools(8, 8).pool("gcp:euw4/a3", "H100", 8, 88.0, None).node("gcp:euw4/a3", "g1", 8);
    check(three().job(1), "assign d1 on_demand");
    check(three().job(1).regions(&["gcp:euw4"]), "assign g1 on_demand");
    check(three().job(1).regions(&["aws:use1", "gcp:euw4"]), "assign a1 on_demand");
    check(three().job(1).regions(&["azure:westeu"]), &hold(&[(REGION, 3)]));
}

#[rustfmt::skip]
#[test]
fn latency_bounds_services_only() {
    let far = || w().pool("gcp:euw4/a3", "H100", 8, 8.0, None).node("gcp:euw4/a3", "g1", 8).pool(P5, "H100", 8, 80.0, None).node(P5, "a1", 8);
    check(far().job(1), "assign g1 on_demand");
    check(far().job(1).service(50), "assign a1 on_demand");
    check(far().job(1).service(120), "assign g1 on_demand");
    check(far().job(1).with(|j| j.max_latency_ms = Some(50)), "assign g1 on_demand");
    check(far().job(1).service(10), &hold(&[("region latency above the service's maximum of 10 ms", 2)]));
    // A region the snapshot does not describe has unknown latency: not good enough.
    check(w().pool("azure:weu/nd", "H100", 8, 8.0, None).node("azure:weu/nd", "z1", 8).job(1).service(500), &hold(&[("region latency above the service's maximum of 500 ms", 1)]));
}

/// With callers, the bound is on the share-weighted latency from them: zero from callers in
/// the replica's own region, else both regions' latencies (onprem 5, aws 20, gcp 120 ms).
#[rustfmt::skip]
#[test]
fn latency_from_the_callers_is_weighed_by_their_shares() {
    let far = || w().pool("gcp:euw4/a3", "H100", 8, 8.0, None).node("gcp:euw4/a3", "g1", 8).pool(P5, "H100", 8, 80.0, None).node(P5, "a1", 8);
    let callers = |shares: &[(&str, u32)]| {
        let c: Vec<CallerShare> = shares.iter().map(|(r, bp)| CallerShare { region: RegionId::new(*r), share_bp: *bp }).collect();
        move |j: &mut JobSpec| j.callers = c.clone()
    };
    // All callers in gcp: its own latency (120 ms) does not count, the cheap pool wins.
    check(far().job(1).service(50).with(callers(&[("gcp:euw4", 10_000)])), "assign g1 on_demand");
    // 60 % in aws, 40 % in gcp: gcp is 0.6 × 140 = 84 ms away, aws 0.4 × 140 = 56 ms.
    check(far().job(1).service(60).with(callers(&[("aws:use1", 6_000), ("gcp:euw4", 4_000)])), "assign a1 on_demand");
    check(far().job(1).service(50).with(callers(&[("aws:use1", 6_000), ("gcp:euw4", 4_000)])), &hold(&[("region latency above the service's maximum of 50 ms", 2)]));
    // Callers in a region the snapshot does not describe: the bound cannot be checked.
    check(far().job(1).service(500).with(callers(&[("azure:weu", 10_000)])), &hold(&[("region latency above the service's maximum of 500 ms", 2)]));
}

#[rustfmt::skip]
#[test]
fn data_gravity_moves_the_winner() {
    // On-prem $2/GPU-h vs AWS $10/GPU-h; 500 GB in AWS costs $45 to move out.
    check(two_pools(8, 8).job(1), "assign d1 on_demand");
    check(two_pools(8, 8).job(1).data("aws:use1", 500), "assign a1 on_demand");
    check(two_pools(8, 8).job(1).data("aws:use1", 50), "assign d1 on_demand");
    check(two_pools(8, 8).job(1).data("onprem:dc1", 500), "assign d1 on_demand");
    // Data in a region the snapshot does not know: no egress price, so no cost to move.
    check(two_pools(8, 8).job(1).data("azure:westeu", 500), "assign d1 on_demand");
}

#[test]
fn data_gravity_prices_egress_and_delays_start() {
    let a = plan_of(two_pools(8, 0).job(1).data("aws:use1", 500)).assignments[0].clone();
    // $2 compute + 500 GB × $0.09 egress; 4,000 Gbit at 100 Gbit/s into dc1 = 40 s.
    assert_eq!(a.estimated_cost, usd(47.0));
    assert_eq!(a.estimated_finish, NOW.plus_secs(3640));
    // gcp:euw4 states no ingress: 10 Gbit/s assumed, so 800 Gbit take 80 s.
    let gcp = w()
        .pool("gcp:euw4/a3", "H100", 8, 8.0, None)
        .node("gcp:euw4/a3", "g1", 8);
    let p = plan_of(gcp.job(1).data("aws:use1", 100));
    assert_eq!(p.assignments[0].estimated_finish, NOW.plus_secs(3680));
}

#[rustfmt::skip]
#[test]
fn ties_break_by_id_and_best_fit() {
    let twins = || w().onprem("b", 16.0).node("onprem:dc1/b", "n1", 8).onprem("a", 16.0).node("onprem:dc1/a", "n2", 8);
    check(twins().job(1), "assign n2 on_demand");
    let pool = || w().onprem("dgx", 16.0);
    check(pool().node(DGX, "n2", 8).node(DGX, "n1", 8).job(1), "assign n1 on_demand");
    check(pool().node(DGX, "n1", 8).node(DGX, "n2", 2).job(2), "assign n2 on_demand");
    check(pool().node(DGX, "n1", 8).node(DGX, "n2", 1).job(2), "assign n1 on_demand");
    check(pool().node(DGX, "n1", 3).node(DGX, "n2", 2).node(DGX, "n3", 2).job(2), "assign n2 on_demand");
}

#[rustfmt::skip]
#[test]
fn spot_only_when_allowed_and_cheaper() {
    let cloud = |spot| w().pool(P5, "H100", 8, 80.0, spot).node(P5, "a1", 8);
    check(cloud(Some(32.0)).job(1), "assign a1 on_demand");
    // An existing node is paid in the market it was bought in; where the pool sells spot
    // cheaper, a job that allows spot takes spot nodes only (a new one if none is free).
    check(cloud(Some(32.0)).spot_node("a1").job(1).spot(SpotRule::Allowed), "assign a1 spot");
    check(cloud(Some(32.0)).spot_node("a1").job(1).spot(SpotRule::Preferred), "assign a1 spot");
    check(cloud(Some(32.0)).job(8).spot(SpotRule::Allowed), "launch aws:use1/p5 spot");
    check(cloud(Some(90.0)).job(1).spot(SpotRule::Allowed), "assign a1 on_demand");
    check(cloud(None).job(1).spot(SpotRule::Allowed), "assign a1 on_demand");
    check(w().pool(P5, "H100", 8, 80.0, Some(32.0)).job(8).spot(SpotRule::Allowed), "launch aws:use1/p5 spot");
    // On-prem charges its internal rate whatever spot figure it carries.
    check(w().pool(DGX, "H100", 8, 16.0, Some(8.0)).node(DGX, "d1", 8).job(1).spot(SpotRule::Allowed), "assign d1 on_demand");
}

#[rustfmt::skip]
#[test]
fn capacity_is_shared_within_a_round() {
    let one = || w().onprem("dgx", 16.0).node(DGX, "d1", 8);
    check(one().job(4).job(4), "j1: assign d1 on_demand | j2: assign d1 on_demand");
    // j2 waits for j1, which ends in an hour.
    check(one().job(8).job(8), "j1: assign d1 on_demand | j2: wait onprem:dc1/dgx +3600s");
    check(one().job(6).job(4).job(2), "j1: assign d1 on_demand | j2: wait onprem:dc1/dgx +3600s | j3: assign d1 on_demand");
    // A service placed this round never frees its GPUs.
    check(one().job(8).service(1000).job(8), &format!("j1: assign d1 on_demand | j2: {}", hold(&[(NO_CAPACITY, 1)])));
    // A launched node is for its job only.
    check(w().pool(P5, "H100", 8, 80.0, None).job(1).job(1), "j1: launch aws:use1/p5 on_demand | j2: launch aws:use1/p5 on_demand");
}

#[rustfmt::skip]
#[test]
fn queue_order_decides_who_gets_scarce_capacity() {
    let one = || w().onprem("dgx", 16.0).node(DGX, "d1", 8);
    check(one().job(8).job(8).priority(Priority::Critical), "j1: wait onprem:dc1/dgx +3600s | j2: assign d1 on_demand");
    check(one().job(8).job(8).deadline_in(36_000), "j1: wait onprem:dc1/dgx +3600s | j2: assign d1 on_demand");
    check(one().job(8).deadline_in(72_000).job(8).deadline_in(36_000), "j1: wait onprem:dc1/dgx +3600s | j2: assign d1 on_demand");
    check(one().job(8).job(8).submitted_ago(5000), "j1: wait onprem:dc1/dgx +3600s | j2: assign d1 on_demand");
    // Submitted at the same moment: the lower id first.
    check(one().job(8).job(8).submitted_ago(999), "j1: assign d1 on_demand | j2: wait onprem:dc1/dgx +3600s");
}

#[rustfmt::skip]
#[test]
fn unusable_nodes_get_nothing() {
    let pool = || w().onprem("dgx", 16.0).node(DGX, "d1", 8);
    check(pool().sick("d1").job(1), &hold(&[(NO_CAPACITY, 1)]));
    check(pool().draining("d1").job(1), &hold(&[(NO_CAPACITY, 1)]));
    check(pool().node(DGX, "d0", 8).sick("d0").job(1), "assign d1 on_demand");
    check(pool().sick("d1").busy("d1", 8, 60).job(1), &hold(&[(NO_CAPACITY, 1)]));
    check(w().onprem("dgx", 16.0).job(1), &hold(&[(NO_CAPACITY, 1)]));
}

#[rustfmt::skip]
#[test]
fn holds_name_what_blocks() {
    check(w().job(1), "hold: no pools in the catalogue");
    check(two_pools(8, 8).job(1).with(|j| j.resources.cpus = 128), &hold(&[("fewer than 128 vCPUs per node", 2)]));
    check(two_pools(8, 8).job(1).with(|j| j.resources.memory_gb = 2048), &hold(&[("less than 2048 GB of memory per node", 2)]));
    check(two_pools(8, 8).job(1).models(&["L4"]).regions(&["onprem:dc1"]), &hold(&[(MODEL, 1), (REGION, 1)]));
}

#[rustfmt::skip]
#[test]
fn explanations_list_candidates_winner_first_then_by_score() {
    check_explain(two_pools(8, 8).job(1), &[
        "onprem:dc1/dgx d1 FreeNow on_demand $2.000000 WIN",
        "aws:use1/p5 a1 FreeNow on_demand $10.000000 outscored",
    ]);
    // A launch pays the whole node, boot included: $80/h × 3,900 s. Blocked pools come last.
    let busy = two_pools(0, 0).busy("d1", 8, 3600).busy("a1", 8, 36_000).pool("aws:use1/g6", "L4", 8, 8.0, None);
    check_explain(busy.job(1).deadline_in(5400).with(|j| j.resources.min_gpu_memory_gb = 40), &[
        "aws:use1/p5 - Launch on_demand $86.666667 WIN",
        "onprem:dc1/dgx d1 Wait on_demand $2.000000 misses_deadline",
        "aws:use1/p5 a1 Wait on_demand $10.000000 misses_deadline",
        "aws:use1/g6 - Launch on_demand $8.666667 GpuMemoryTooSmall { have_gb: 24, need_gb: 40 }",
    ]);
    // Blocked: closest to feasible first, then by pool id.
    let blocked = || w().pool(P5, "H100", 8, 80.0, Some(32.0)).no_burst().onprem("dgx", 16.0).node(DGX, "d1", 0);
    check_explain(blocked().job(1), &[
        "aws:use1/p5 - Launch on_demand $86.666667 BurstDisabled",
        "onprem:dc1/dgx - Wait on_demand $2.000000 NoCapacity",
    ]);
    check_explain(blocked().job(1).models(&["A100"]), &[
        "aws:use1/p5 - Launch on_demand $86.666667 GpuModelNotAllowed { model: \"H100\" }",
        "onprem:dc1/dgx - FreeNow on_demand $2.000000 GpuModelNotAllowed { model: \"H100\" }",
    ]);
}

#[test]
fn explanations_are_capped_best_first() {
    let mut world = w();
    for i in 0..30 {
        let id = format!("onprem:dc1/p{i:02}");
        let price = 100.0 - f64::from(i);
        world = world
            .pool(&id, "H100", 8, price, None)
            .node(&id, &format!("n{i:02}"), 8);
    }
    let lines = explain(world.job(1));
    assert_eq!(lines.len(), MAX_EXPLAINED_CANDIDATES);
    assert!(
        lines[0].starts_with("onprem:dc1/p29 n29 FreeNow"),
        "{lines:?}"
    );
    assert!(
        lines[19].starts_with("onprem:dc1/p10 n10 FreeNow"),
        "{lines:?}"
    );
}

#[test]
fn every_job_is_explained_and_the_plan_ignores_input_order() {
    let world = two_pools(4, 8)
        .busy("d1", 4, 600)
        .pool("aws:use1/g6", "L4", 8, 8.0, None)
        .job(4)
        .job(4)
        .deadline_in(9000)
        .job(8)
        .priority(Priority::High)
        .job(1)
        .models(&["L4"])
        .job(2)
        .with(|j| j.resources.nodes = 3);
    let forward = plan_of(world.clone());
    assert_eq!(forward.explanations.len(), 5);
    assert!(forward.explanations.values().all(|e| e.at == NOW));
    let mut reversed = world.snap;
    reversed.regions.reverse();
    reversed.pools.reverse();
    reversed.nodes.reverse();
    reversed.queued.reverse();
    reversed.running.reverse();
    assert_eq!(plan(&reversed, NOW), forward);
}

#[test]
fn assignments_carry_their_estimates() {
    let half_hour = |j: &mut JobSpec| j.estimated_runtime_s = Some(1800);
    let p = plan_of(
        two_pools(8, 8)
            .job(2)
            .spot(SpotRule::Allowed)
            .with(half_hour),
    );
    let a = &p.assignments[0];
    let placed = (a.node.as_str(), a.pool.as_str(), a.gpus.to_vec(), a.market);
    assert_eq!(placed, ("d1", DGX, vec![0, 1], Market::OnDemand));
    // 2 GPUs × $2/GPU-h × half an hour.
    assert_eq!(a.estimated_cost, usd(2.0));
    assert_eq!(a.estimated_finish, NOW.plus_secs(1800));
    // No runtime estimate: an hour is assumed.
    let p = plan_of(
        two_pools(8, 8)
            .job(1)
            .with(|j| j.estimated_runtime_s = None),
    );
    assert_eq!(p.assignments[0].estimated_finish, NOW.plus_secs(3600));
    // A launch: the spot node for an hour plus its 5-minute boot, plus the expected cost of
    // interruptions at the default 2 %/h: 0.02 × (300 s boot + 1,800 s lost work) = 42 s.
    let p = plan_of(
        w().pool(P5, "H100", 8, 80.0, Some(36.0))
            .job(8)
            .spot(SpotRule::Preferred),
    );
    let l = &p.launches[0];
    assert_eq!(
        (l.pool.as_str(), l.market, l.for_job),
        (P5, Market::Spot, JobId(Uuid::from_u128(1)))
    );
    assert_eq!(
        p.explanation(&l.for_job).expect("explained").candidates[0].cost,
        usd(39.42)
    );
}

#[rustfmt::skip]
#[test]
fn waiting_jobs_reserve_what_they_wait_for() {
    // d1 frees its 8 GPUs in an hour; each job takes all 8 for an hour. Without reservations
    // all three would count on +1h; in queue order they get +1h, +2h and +3h.
    let busy = || two_pools(0, 0).busy("d1", 8, 3600).service_on("a1", 8);
    check(busy().job(8).job(8).job(8), "j1: wait onprem:dc1/dgx +3600s | j2: wait onprem:dc1/dgx +7200s | j3: wait onprem:dc1/dgx +10800s");
    // The queue goes by deadline: the third job waits first.
    check(busy().job(8).job(8).job(8).deadline_in(4 * 3600), "j1: wait onprem:dc1/dgx +7200s | j2: wait onprem:dc1/dgx +10800s | j3: wait onprem:dc1/dgx +3600s");
    // The third would finish at +4h, past its deadline (with its 180 s margin): it bursts
    // instead of counting on capacity the jobs ahead of it will take.
    check(busy().job(8).deadline_in(2 * 3600 + 180).job(8).deadline_in(3 * 3600 + 180).job(8).deadline_in(4 * 3600 + 179), "j1: wait onprem:dc1/dgx +3600s | j2: wait onprem:dc1/dgx +7200s | j3: launch aws:use1/p5 on_demand");
    // Small jobs share the release: eight 1-GPU jobs all start at +1h, the ninth at +2h.
    let nine = (0..9).fold(busy(), |w, _| w.job(1));
    let plan = plan_of(nine);
    let starts: Vec<i64> = plan.explanations.values().map(|e| match e.outcome {
        Outcome::Wait { expected_start, .. } => expected_start.secs_since(NOW),
        _ => -1,
    }).collect();
    assert_eq!(starts, [3600, 3600, 3600, 3600, 3600, 3600, 3600, 3600, 7200]);
}

#[rustfmt::skip]
#[test]
fn spot_nodes_take_only_jobs_that_allow_spot() {
    let spot_a1 = || w().pool(P5, "H100", 8, 80.0, Some(32.0)).node(P5, "a1", 8).spot_node("a1");
    // A job that never runs on spot keeps off the idle spot node: it launches on demand, or
    // waits for an on-demand node, and its explanation does not offer the spot node.
    check(spot_a1().job(1), "launch aws:use1/p5 on_demand");
    check(spot_a1().node(P5, "a2", 0).busy("a2", 8, 1800).job(1).deadline_in(7200), "wait aws:use1/p5 +1800s");
    check(spot_a1().job(1).spot(SpotRule::Allowed), "assign a1 spot");
    // A team policy that forbids spot caps the job's own rule.
    check(spot_a1().job(1).spot(SpotRule::Preferred).policy(TeamPolicy { spot: SpotRule::Never, ..TeamPolicy::new("ml") }), "launch aws:use1/p5 on_demand");
    // A gang takes on-demand nodes only, all of them or none.
    check(spot_a1().node(P5, "a2", 8).node(P5, "a3", 8).job(8).gang(2), "assign a2 on_demand");
    check(spot_a1().node(P5, "a2", 8).job(8).gang(2).no_burst(), &hold(&[("needs a new node but bursting is disabled", 1), (NO_CAPACITY, 1)]));
    // A gang that allows spot, where spot is cheaper, may take idle on-demand nodes too, paid
    // on demand: those it launched on demand when spot would miss its deadline (else it would
    // launch again and again beside them).
    check(w().pool(P5, "H100", 8, 80.0, Some(32.0)).node(P5, "a2", 8).node(P5, "a3", 8).job(8).gang(2).spot(SpotRule::Allowed).deadline_in(3880), "assign a2 on_demand");
    // Preemption for an urgent job: not on a spot node it may not take.
    check(spot_a1().node(P5, "a2", 0).low("a1", 8, 60, 7200).low("a2", 8, 60, 7200).job(8).priority(Priority::Critical).deadline_in(5400).no_burst(), "assign a2 on_demand");
}

/// Every job's GPUs in job order, `jN node {indexes}`, or `jN -` when it is not assigned now.
fn gpus_of(world: W) -> String {
    let p = plan_of(world.clone());
    world
        .snap
        .queued
        .iter()
        .map(|j| {
            let placed: Vec<String> = p
                .assignments
                .iter()
                .filter(|a| a.job == j.id)
                .map(|a| format!(" {} {:?}", a.node, a.gpus))
                .collect();
            match placed.is_empty() {
                true => format!("{} -", j.spec.name),
                false => format!("{}{}", j.spec.name, placed.concat()),
            }
        })
        .collect::<Vec<_>>()
        .join(" | ")
}

#[rustfmt::skip]
#[test]
fn the_planner_picks_the_gpus_lowest_free_first_and_never_twice() {
    // On-prem node d1 (8 GPUs), no bursting.
    let d1 = |free: u32| w().onprem("dgx", 16.0).node(DGX, "d1", free).no_burst();
    check_gpus(d1(8).job(2), "j1 d1 {0, 1}");
    // Two jobs on one node get disjoint GPUs.
    check_gpus(d1(8).job(2).job(3).job(3), "j1 d1 {0, 1} | j2 d1 {2, 3, 4} | j3 d1 {5, 6, 7}");
    check_gpus(d1(4).busy("d1", 4, 3600).job(1).job(2), "j1 d1 {4} | j2 d1 {5, 6}");
    // GPUs 0 and 2 busy: a 2-GPU job gets 1 and 3.
    check_gpus(d1(8).free_gpus("d1", &[1, 3, 4, 5, 6, 7]).job(2), "j1 d1 {1, 3}");
    check_gpus(d1(8).free_gpus("d1", &[1, 3, 4, 5, 6, 7]).job(1).job(1).job(4), "j1 d1 {1} | j2 d1 {3} | j3 d1 {4, 5, 6, 7}");
    // More GPUs than free is not placed there: it waits, or goes where they are.
    check_gpus(d1(2).busy("d1", 6, 3600).job(3), "j1 -");
    check_gpus(d1(8).job(6).job(3), "j1 d1 {0, 1, 2, 3, 4, 5} | j2 -");
    check_gpus(d1(2).busy("d1", 6, 3600).node(DGX, "d2", 8).job(3).job(2), "j1 d2 {0, 1, 2} | j2 d1 {6, 7}");
    // A gang: each node's own lowest free GPUs.
    check_gpus(d1(8).node(DGX, "d2", 4).busy("d2", 4, 3600).job(4).gang(2), "j1 d2 {4, 5, 6, 7} d1 {0, 1, 2, 3}");
    // Preempting: the free GPUs, then the lowest of the victims'; the rest stays theirs.
    check_gpus(d1(4).low("d1", 2, 1000, 36_000).low("d1", 2, 100, 36_000).job(6).priority(Priority::Critical).deadline_in(7200).job(2), "j1 d1 {2, 3, 4, 5, 6, 7} | j2 -");
    check_gpus(d1(4).low("d1", 4, 100, 36_000).job(5).priority(Priority::Critical).deadline_in(7200), "j1 d1 {0, 4, 5, 6, 7}");
}

#[track_caller]
fn check_gpus(world: W, expect: &str) {
    assert_eq!(gpus_of(world), expect);
}

/// Issue 28: a job without `accelerator` runs on GPUs only, even where a TPU is cheaper and free;
/// `google` (or a list naming the TPU) runs on the TPU, `any` on the cheapest of all.
#[rustfmt::skip]
#[test]
fn accelerator_picks_the_kind_of_chip() {
    use crate::gpu_model::Accelerator;
    let tpu = "gcp:usc1/tpu-v5litepod-8";
    let mixed = || w().pool(tpu, "TPU-v5e", 8, 4.0, None).node(tpu, "t1", 8).pool(P5, "H100", 8, 80.0, None).node(P5, "a1", 8);
    let asks = |a: Accelerator| move |j: &mut JobSpec| j.resources.accelerator = Some(a);
    check(mixed().job(1), "assign a1 on_demand");
    check(mixed().job(1).with(asks(Accelerator::Google)), "assign t1 on_demand");
    check(mixed().job(1).with(asks(Accelerator::Any)), "assign t1 on_demand");
    check(mixed().job(1).with(asks(Accelerator::Nvidia)), "assign a1 on_demand");
    check(mixed().job(1).models(&["TPU-v5e"]), "assign t1 on_demand");
    check(mixed().job(1).models(&["H100", "TPU-v5e"]).with(asks(Accelerator::Nvidia)), "assign a1 on_demand");
    // Only TPUs: a job that names no accelerator waits rather than land on one.
    let tpus = || w().pool(tpu, "TPU-v5e", 8, 4.0, None).node(tpu, "t1", 8);
    check(tpus().job(1), &hold(&[(ACCELERATOR, 1)]));
    check(tpus().job(1).with(asks(Accelerator::Amd)), &hold(&[(ACCELERATOR, 1)]));
    check(tpus().job(1).with(asks(Accelerator::Google)), "assign t1 on_demand");
}

/// Issue 28: submit-time, an accelerator no pool has is refused naming `resources.accelerator`.
#[test]
fn no_pool_of_the_accelerator_is_unsatisfiable() {
    use crate::gpu_model::Accelerator;
    let tpu = "gcp:usc1/tpu-v5litepod-8";
    let verdict = |pools: W, accelerator: Option<Accelerator>, models: &[&str]| {
        let mut world = pools.job(1).models(models);
        world.spec().resources.accelerator = accelerator;
        let spec = world.spec().clone();
        crate::check_satisfiable(&world.snap.pools, &spec).map_err(|e| e.field)
    };
    let tpus = || w().pool(tpu, "TPU-v5e", 8, 4.0, None);
    let h100s = || w().pool(P5, "H100", 8, 80.0, None);
    assert_eq!(verdict(tpus(), None, &[]), Err("resources.accelerator"));
    assert_eq!(verdict(tpus(), Some(Accelerator::Google), &[]), Ok(()));
    assert_eq!(verdict(tpus(), Some(Accelerator::Any), &[]), Ok(()));
    assert_eq!(verdict(tpus(), None, &["TPU-v5e"]), Ok(()));
    assert_eq!(
        verdict(h100s(), Some(Accelerator::Amd), &[]),
        Err("resources.accelerator")
    );
    assert_eq!(
        verdict(h100s(), Some(Accelerator::Google), &[]),
        Err("resources.accelerator")
    );
    assert_eq!(verdict(h100s(), None, &[]), Ok(()));
    assert_eq!(
        verdict(h100s(), None, &["MI300X"]),
        Err("resources.gpu_models")
    );
}

#[rustfmt::skip]
#[test]
fn deadlines_are_judged_at_the_deadline_runtime_and_costs_at_the_cost_runtime() {
    let busy = || two_pools(0, 0).busy("d1", 8, 3600).busy("a1", 8, 36_000);
    // At its p50 (1 h) waiting for the DGX finishes at +2 h, in time for +2.5 h.
    check(busy().job(1).deadline_in(9000), WAIT_DGX);
    let mut slow = busy().job(1).deadline_in(9000);
    slow.last_job().deadline_runtime_s = Some(3600);
    check(slow, WAIT_DGX);
    // At its p90 (2 h) it would finish at +3 h: it bursts (boot 5 min, +2 h 5 min at p90).
    let mut slow = busy().job(1).deadline_in(9000);
    slow.last_job().deadline_runtime_s = Some(7200);
    check(slow, "launch aws:use1/p5 on_demand");
    // A p90 that misses everywhere: the earliest finish, as for any late job.
    let mut late = busy().job(1).deadline_in(9000);
    late.last_job().deadline_runtime_s = Some(20_000);
    check(late, "launch aws:use1/p5 on_demand");
    // In time at its p90 too: unchanged.
    let mut w = two_pools(0, 8).job(1).deadline_in(7200);
    w.last_job().deadline_runtime_s = Some(5400);
    check(w, "assign a1 on_demand");
}

//! The rules beyond "cheapest feasible": spot risk, preemption, gangs, team policies, budgets,
//! time windows, the joint assignment of contended capacity, and the warm [`Planner`].

use super::*;
use crate::domain::Objective;

const P5: &str = "aws:use1/p5";
const P4: &str = "aws:use1/p4";
const DGX: &str = "onprem:dc1/dgx";

/// AWS 8×H100 at $80/h ($10/GPU-h), spot $32/h ($4/GPU-h), node `a1` free.
fn spot_pool() -> W {
    w().pool(P5, "H100", 8, 80.0, Some(32.0)).node(P5, "a1", 8)
}

#[rustfmt::skip]
#[test]
fn spot_prices_its_interruptions() {
    // Which market to buy a new node in weighs the risk.
    let p5 = || w().pool(P5, "H100", 8, 80.0, Some(32.0));
    check(p5().job(8).spot(SpotRule::Allowed), "launch aws:use1/p5 spot");
    // 5 interruptions an hour: 10,500 s expected extra (boot + 30 min lost, 5 × 1 h): dearer.
    check(p5().risk(P5, 5_000_000).job(8).spot(SpotRule::Allowed), "launch aws:use1/p5 on_demand");
    // Preferred leans to spot whenever the deadline allows it…
    check(p5().risk(P5, 5_000_000).job(8).spot(SpotRule::Preferred), "launch aws:use1/p5 spot");
    // …and neither takes it when the expected delay (2/h: 4,200 s) would miss the deadline.
    check(p5().risk(P5, 2_000_000).job(8).spot(SpotRule::Allowed).deadline_in(7200), "launch aws:use1/p5 on_demand");
    check(p5().risk(P5, 2_000_000).job(8).spot(SpotRule::Preferred).deadline_in(7200), "launch aws:use1/p5 on_demand");
    check(p5().risk(P5, 2_000_000).job(8).spot(SpotRule::Allowed).deadline_in(9000), "launch aws:use1/p5 spot");
    // An existing node is paid in the market it was bought in. Where the pool sells spot
    // cheaper, a job that allows spot takes its spot nodes (`s1`), not its on-demand ones
    // (`a1`), which are left to the jobs they were launched for…
    let both = || spot_pool().node(P5, "s1", 8).spot_node("s1");
    check(both().job(1).spot(SpotRule::Allowed), "assign s1 spot");
    check(both().job(1), "assign a1 on_demand");
    check(spot_pool().job(1).spot(SpotRule::Allowed), "launch aws:use1/p5 spot");
    // …unless its best is an on-demand launch (5 interruptions an hour make spot dearer):
    // then it takes the idle on-demand node, the same price and free now. A long run that
    // launched on demand takes its own node this way.
    check(spot_pool().risk(P5, 5_000_000).job(8).spot(SpotRule::Allowed), "assign a1 on_demand");
    // Where it does not sell spot cheaper, either node is paid on demand.
    check(w().pool(P5, "H100", 8, 80.0, Some(90.0)).node(P5, "s1", 8).spot_node("s1").job(1).spot(SpotRule::Allowed), "assign s1 on_demand");
}

#[test]
fn spot_cost_includes_expected_restarts() {
    let cost = |ppm| {
        let world = spot_pool().spot_node("a1").risk(P5, ppm).job(1);
        plan_of(world.spot(SpotRule::Allowed)).assignments[0].estimated_cost
    };
    assert_eq!(cost(0), usd(4.0));
    // 2 %/h × 1 h × (300 s boot + 1,800 s lost) = 42 s more at $4/h.
    assert_eq!(cost(20_000), usd(4.046667));
}

/// On-prem node `d1` fully held by low-priority work started an hour ago, ending in 10 h.
fn low_busy() -> W {
    w().onprem("dgx", 16.0)
        .node(DGX, "d1", 0)
        .low("d1", 8, 3600, 36_000)
        .no_burst()
}

#[rustfmt::skip]
#[test]
fn urgent_jobs_preempt_low_work_only_when_their_deadline_is_at_risk() {
    check(low_busy().job(8).priority(Priority::Critical).deadline_in(7200), "assign d1 on_demand");
    check(low_busy().job(8).priority(Priority::High).deadline_in(7200), "assign d1 on_demand");
    // Normal jobs never preempt; nor does anyone whose deadline waiting still meets.
    check(low_busy().job(8).deadline_in(7200), "wait onprem:dc1/dgx +36000s");
    check(low_busy().job(8).priority(Priority::Critical).deadline_in(72_000), "wait onprem:dc1/dgx +36000s");
    // Normal work is never a victim.
    let normal = w().onprem("dgx", 16.0).node(DGX, "d1", 0).busy("d1", 8, 36_000).no_burst();
    check(normal.job(8).priority(Priority::Critical).deadline_in(7200), "wait onprem:dc1/dgx +36000s");
    // No candidate at all (services hold the node): an urgent job preempts low services too.
    let mut services = w().onprem("dgx", 16.0).node(DGX, "d1", 0).low("d1", 8, 60, 0).no_burst();
    services.snap.running[0].expected_end = Timestamp::MAX;
    check(services.clone().job(8).priority(Priority::Critical), "assign d1 on_demand");
    // A policy's priority ceiling makes a critical job normal: no preemption.
    check(low_busy().policy(TeamPolicy { priority_ceiling: Some(Priority::Normal), ..TeamPolicy::new("ml") }).job(8).priority(Priority::Critical).deadline_in(7200), "wait onprem:dc1/dgx +36000s");
}

#[rustfmt::skip]
#[test]
fn urgent_services_take_gpus_back_from_batch_work_before_bursting() {
    // On-prem `d1` held by normal training for 10 h; the cloud could launch a node.
    let training = || w().onprem("dgx", 16.0).node(DGX, "d1", 0).busy("d1", 8, 36_000).pool(P5, "H100", 8, 80.0, None);
    check(training().job(8).service(10_000).priority(Priority::Critical), "assign d1 on_demand");
    check(training().job(8).service(10_000).priority(Priority::High), "assign d1 on_demand");
    // A normal service, or a critical batch job, stops no normal work (with no deadline,
    // each waits for the cheaper node here).
    check(training().job(8).service(10_000), "wait onprem:dc1/dgx +36000s");
    check(training().job(8).priority(Priority::Critical), "wait onprem:dc1/dgx +36000s");
    check(training().job(8).priority(Priority::Critical).deadline_in(7200), "launch aws:use1/p5 on_demand");
    // Another normal service is not batch work: it keeps its GPUs, and the service bursts.
    let serving = w().onprem("dgx", 16.0).node(DGX, "d1", 0).service_on("d1", 8).pool(P5, "H100", 8, 80.0, None);
    check(serving.job(8).service(10_000).priority(Priority::Critical), "launch aws:use1/p5 on_demand");
    // A free node is still better than stopping anyone.
    check(training().node(DGX, "d2", 8).job(8).service(10_000).priority(Priority::Critical), "assign d2 on_demand");
}

#[rustfmt::skip]
#[test]
fn a_job_kept_off_a_node_goes_elsewhere_or_to_a_new_node() {
    // `d1` fits best (4 free for 4), `d2` has 8: kept off `d1`, the job takes `d2`.
    let two = || w().onprem("dgx", 16.0).node(DGX, "d1", 4).node(DGX, "d2", 8).pool(P5, "H100", 8, 80.0, None);
    check(two().job(4).service(10_000), "assign d1 on_demand");
    check(two().job(4).service(10_000).avoid("d1"), "assign d2 on_demand");
    // Nowhere else on-prem: a new node, not `d1`.
    check(two().job(4).service(10_000).avoid("d1").avoid("d2"), "launch aws:use1/p5 on_demand");
    // Nor a wait for it, nor a preemption on it.
    let busy = || w().onprem("dgx", 16.0).node(DGX, "d1", 0).low("d1", 8, 60, 600).pool(P5, "H100", 8, 80.0, None);
    check(busy().job(8).service(10_000).priority(Priority::Critical), "assign d1 on_demand");
    check(busy().job(8).service(10_000).priority(Priority::Critical).avoid("d1"), "launch aws:use1/p5 on_demand");
    check(busy().job(8).avoid("d1"), "launch aws:use1/p5 on_demand");
}

#[test]
fn a_service_stops_low_work_before_normal_work() {
    let world = w()
        .onprem("dgx", 16.0)
        .node(DGX, "d1", 0)
        .busy("d1", 4, 36_000)
        .low("d1", 4, 7200, 36_000)
        .pool(P5, "H100", 8, 80.0, None)
        .job(4)
        .service(10_000)
        .priority(Priority::Critical);
    let p = plan_of(world.clone());
    assert_eq!(p.preemptions.len(), 1, "{:?}", p.preemptions);
    assert_eq!(p.preemptions[0].attempt, world.snap.running[1].attempt);
    // Low work on one node goes before normal work on another, whatever the ids.
    let apart = w()
        .onprem("dgx", 16.0)
        .node(DGX, "d1", 0)
        .busy("d1", 4, 36_000)
        .node(DGX, "d2", 0)
        .low("d2", 4, 7200, 36_000)
        .job(2)
        .service(10_000)
        .priority(Priority::Critical);
    let p = plan_of(apart.clone());
    assert_eq!(p.preemptions.len(), 1, "{:?}", p.preemptions);
    assert_eq!(p.preemptions[0].attempt, apart.snap.running[1].attempt);
    // Eight GPUs: both go.
    let mut eight = world;
    eight.snap.queued[0].spec.resources.gpus = 8;
    let p = plan_of(eight);
    assert_eq!(p.preemptions.len(), 2, "{:?}", p.preemptions);
    // The explanation says why no node was launched.
    let j = p
        .explanation(&JobId(Uuid::from_u128(1)))
        .expect("explained");
    assert_eq!(j.candidates[0].kind, CandidateKind::Preempt);
    let why: Vec<_> = j
        .candidates
        .iter()
        .filter_map(|c| c.rejected.clone())
        .collect();
    assert!(why.contains(&Rejection::PreemptsBatchWorkFirst), "{why:?}");
}

#[test]
fn preemption_takes_the_fewest_latest_started_victims() {
    let world = w()
        .onprem("dgx", 16.0)
        .node(DGX, "d1", 4)
        .low("d1", 2, 1000, 36_000)
        .low("d1", 2, 100, 36_000)
        .no_burst()
        .job(6)
        .priority(Priority::Critical)
        .deadline_in(7200)
        .job(2);
    let p = plan_of(world.clone());
    assert_eq!(p.preemptions.len(), 1, "{:?}", p.preemptions);
    let victim = &p.preemptions[0];
    let latest = &world.snap.running[1];
    assert_eq!((victim.attempt, victim.gpus), (latest.attempt, 2));
    assert_eq!(victim.for_job, JobId(Uuid::from_u128(1)));
    assert_eq!(p.assignments[0].estimated_finish, NOW.plus_secs(120 + 3600));
    // The job used the 4 free GPUs and 2 of the victim's: nothing is left for j2 now, and the
    // explanation names the preemption.
    let j2 = &p.explanations[&JobId(Uuid::from_u128(2))];
    assert!(matches!(j2.outcome, Outcome::Wait { .. }), "{j2:?}");
    let j1 = p
        .explanation(&JobId(Uuid::from_u128(1)))
        .expect("explained");
    assert_eq!(j1.candidates[0].kind, CandidateKind::Preempt);
}

#[rustfmt::skip]
#[test]
fn gangs_take_all_their_nodes_in_one_pool_or_none() {
    let dgx = |free: &[u32]| free.iter().enumerate().fold(w().onprem("dgx", 16.0), |w, (i, &f)| w.node(DGX, &format!("d{i}"), f));
    check(dgx(&[8, 8, 8]).job(8).gang(2), "assign d0 on_demand");
    check(dgx(&[8, 4, 8]).job(8).gang(2), "assign d0 on_demand");
    check(dgx(&[8, 4, 4]).no_burst().job(8).gang(2), &hold(&[(NO_CAPACITY, 1)]));
    // Never partial: one free node and a cloud pool means two new cloud nodes.
    check(dgx(&[8]).pool(P5, "H100", 8, 80.0, None).job(8).gang(2), "launch aws:use1/p5 on_demand");
    check(dgx(&[8]).pool(P5, "H100", 8, 80.0, None).limit(P5, 1).job(8).gang(2), &hold(&[(QUOTA, 1), (NO_CAPACITY, 1)]));
}

#[test]
fn gang_assignments_have_ranks_and_launches_one_per_node() {
    let world = w()
        .onprem("dgx", 16.0)
        .node(DGX, "d0", 8)
        .node(DGX, "d1", 2)
        .node(DGX, "d2", 8)
        .job(4)
        .gang(2);
    let p = plan_of(world);
    let placed: Vec<(&str, u32, u32)> = p
        .assignments
        .iter()
        .map(|a| (a.node.as_str(), a.rank, a.gpus.len()))
        .collect();
    assert_eq!(placed, [("d0", 0, 4), ("d2", 1, 4)]);
    // Two nodes × 4 GPUs × $2/GPU-h.
    assert_eq!(p.assignments[0].estimated_cost, usd(16.0));
    let p = plan_of(w().pool(P5, "H100", 8, 80.0, None).job(8).gang(3));
    assert_eq!(p.launches.len(), 3);
}

/// On-prem busy for an hour; AWS free now.
fn busy_onprem() -> W {
    w().onprem("dgx", 16.0)
        .node(DGX, "d1", 0)
        .busy("d1", 8, 3600)
        .pool(P5, "H100", 8, 80.0, Some(32.0))
        .node(P5, "a1", 8)
}

fn team(f: impl FnOnce(&mut TeamPolicy)) -> TeamPolicy {
    let mut p = TeamPolicy::new("ml");
    f(&mut p);
    p
}

#[rustfmt::skip]
#[test]
fn team_policies_are_hard_constraints() {
    let urgent = || busy_onprem().job(1).deadline_in(5400);
    check(urgent(), "assign a1 on_demand");
    check(urgent().policy(team(|p| p.allowed_providers = vec!["onprem".into()])), "wait onprem:dc1/dgx +3600s");
    check(urgent().policy(team(|p| p.allowed_regions = vec![RegionId::new("onprem:dc1")])), "wait onprem:dc1/dgx +3600s");
    check(urgent().policy(team(|p| p.max_price_per_gpu_hour = Some(usd(5.0)))), "wait onprem:dc1/dgx +3600s");
    // Another team's policy, or a project's the job is not in, changes nothing.
    check(urgent().policy(TeamPolicy { allowed_providers: vec!["onprem".into()], ..TeamPolicy::new("web") }), "assign a1 on_demand");
    check(urgent().policy(team(|p| { p.project = Some("x".into()); p.allowed_providers = vec!["onprem".into()] })), "assign a1 on_demand");
    // The spot rule is capped.
    check(urgent().spot_node("a1").spot(SpotRule::Preferred), "assign a1 spot");
    check(urgent().spot_node("a1").spot(SpotRule::Preferred).policy(team(|p| p.spot = SpotRule::Never)), "launch aws:use1/p5 on_demand");
    // Bursting.
    check(w().pool(P5, "H100", 8, 80.0, None).job(1).policy(team(|p| p.burst_allowed = false)), &hold(&[("needs a new node but the team's policy forbids bursting", 1)]));
    check(w().pool(P5, "H100", 8, 80.0, None).job(1).team("web").policy(team(|p| p.burst_allowed = false)), "launch aws:use1/p5 on_demand");
}

#[rustfmt::skip]
#[test]
fn time_windows_gate_starts() {
    // NOW is 08:00 UTC.
    let window = |start, end| team(|p| p.windows = vec![PriorityWindows { priorities: vec![Priority::Normal], windows: vec![TimeWindow { start_minute: start, end_minute: end }] }]);
    let closed = "hold: no pool can take this job now: outside the time windows the team's policy allows for its priority (1 pool)";
    check(spot_pool().job(1).policy(window(0, 60)), closed);
    check(spot_pool().job(1).policy(window(420, 540)), "assign a1 on_demand");
    check(spot_pool().job(1).policy(window(1320, 500)), "assign a1 on_demand");
    check(spot_pool().job(1).policy(window(1320, 480)), closed);
    // Other priorities are not gated.
    check(spot_pool().job(1).priority(Priority::High).policy(window(0, 60)), "assign a1 on_demand");
    let p = plan_of(spot_pool().job(1).policy(window(0, 60)));
    assert_eq!(p.holds[0].code, HoldCode::OutsideTimeWindow);
}

#[rustfmt::skip]
#[test]
fn an_idle_owned_gpu_wins_over_spot_cheaper_than_its_internal_rate_unless_the_team_minimises_its_bill() {
    // On-prem bills $2/GPU-h and costs the company $0.40 (a fifth); spot sells at $1.50.
    // The pool is idle (not protected). Under `company` the owned GPUs win: $3.20 in cash
    // against about $13 of spot; under `team` the team's bill decides: $16 against $13.
    let idle = || w().onprem("dgx", 16.0).pool(P5, "H100", 8, 80.0, Some(12.0)).node(DGX, "d1", 8).job(8).spot(SpotRule::Allowed);
    check(idle(), "assign d1 on_demand");
    check(idle().policy(team(|p| p.objective = Objective::Company)), "assign d1 on_demand");
    check(idle().policy(team(|p| p.objective = Objective::Team)), "launch aws:use1/p5 spot");
    // Either way the plan shows what the team is billed.
    let plan = plan_of(idle());
    assert_eq!(plan.assignments[0].estimated_cost, usd(16.0));
    // A finance-set marginal cost above spot's price sends the job to spot under `company` too.
    let mut dear = idle();
    dear.pool_mut(DGX).marginal_per_hour = Some(usd(14.0));
    check(dear, "launch aws:use1/p5 spot");
}

#[test]
fn budgets_are_hard_and_spent_across_the_round() {
    // $3 left; each job costs $2 on-prem (billed at the internal rate, though it costs the
    // company $0.40 in cash): the second would overspend.
    let world = w()
        .onprem("dgx", 16.0)
        .node(DGX, "d1", 8)
        .policy(team(|p| p.remaining_budget = Some(usd(3.0))))
        .job(1)
        .job(1)
        .job(1)
        .team("web");
    let p = plan_of(world);
    assert_eq!(p.assignments.len(), 2, "{:?}", p.holds);
    assert_eq!(p.holds.len(), 1);
    assert_eq!(p.holds[0].code, HoldCode::BudgetExhausted);
    assert_eq!(p.holds[0].job, JobId(Uuid::from_u128(2)));
    assert_eq!(
        p.holds[0].reason,
        "no pool can take this job now: over budget: needs $2.00, $1.00 left (1 pool)"
    );
    let e = p
        .explanation(&JobId(Uuid::from_u128(2)))
        .expect("explained");
    assert_eq!(
        e.candidates[0].rejected,
        Some(Rejection::BudgetExhausted {
            cost: usd(2.0),
            remaining: usd(1.0)
        })
    );
}

/// One free on-prem H100 GPU (the rest busy for 10 h) at $2/GPU-h; A100s at $4/GPU-h and
/// H100s at $10/GPU-h in AWS, free. j1 (1 h) can run on anything, j2 (6 h) needs an H100 and
/// cannot wait for j1; j1 is first in the queue (earlier deadline).
fn contended() -> W {
    w().onprem("dgx", 16.0)
        .node(DGX, "d1", 1)
        .busy("d1", 7, 36_000)
        .pool(P4, "A100-80GB", 8, 32.0, None)
        .node(P4, "b1", 8)
        .pool(P5, "H100", 8, 80.0, None)
        .node(P5, "a1", 8)
        .job(1)
        .deadline_in(3 * 3600)
        .job(1)
        .models(&["H100"])
        .with(|j| j.estimated_runtime_s = Some(6 * 3600))
        .deadline_in(6 * 3600 + 1800)
}

fn total(p: &Plan) -> Money {
    p.assignments
        .iter()
        .map(|a| a.estimated_cost)
        .fold(Money::ZERO, |a, b| a + b)
}

#[test]
fn the_round_assigns_contended_capacity_jointly() {
    let world = contended();
    // Arrival order: j1 takes the cheap GPU, j2 pays for 6 h of an AWS H100: $2 + $60.
    let mut planner = Planner::new(&world.snap, NOW);
    for job in &world.snap.queued {
        planner.place(job);
    }
    assert_eq!(total(planner.plan()), usd(62.0));
    // Jointly: j2 gets the on-prem GPU, j1 an A100: $12 + $4.
    check(
        world.clone(),
        "j1: assign b1 on_demand | j2: assign d1 on_demand",
    );
    let p = plan_of(world);
    assert_eq!(total(&p), usd(16.0));
    // j1's explanation says why the cheaper GPU was not its own.
    let j1 = p
        .explanation(&JobId(Uuid::from_u128(1)))
        .expect("explained");
    let reasons: Vec<_> = j1
        .candidates
        .iter()
        .map(|c| (c.pool.as_str(), c.rejected.clone()))
        .collect();
    assert!(
        reasons.contains(&(DGX, Some(Rejection::ContendedCapacity))),
        "{reasons:?}"
    );
}

#[test]
fn the_joint_assignment_is_kept_only_when_it_beats_the_per_job_plan() {
    // j2 is short now and can wait an hour for j1: the per-job plan ($2 + $2 later) wins over
    // giving j1 an A100 ($2 + $4).
    let world = contended().with(|j| j.estimated_runtime_s = Some(3600));
    check(
        world,
        "j1: assign d1 on_demand | j2: wait onprem:dc1/dgx +3600s",
    );
}

#[test]
fn the_joint_assignment_meets_deadlines_before_saving() {
    // j2 (6 h) can only meet its deadline on the on-prem GPU (no other H100 capacity, no
    // burst); j1 is first in the queue and the cheapest there.
    let world = w()
        .onprem("dgx", 16.0)
        .node(DGX, "d1", 1)
        .busy("d1", 7, 36_000)
        .pool(P4, "A100-80GB", 8, 32.0, None)
        .node(P4, "b1", 8)
        .no_burst()
        .job(1)
        .deadline_in(3 * 3600)
        .job(1)
        .models(&["H100"])
        .with(|j| j.estimated_runtime_s = Some(6 * 3600))
        .deadline_in(6 * 3600 + 1800);
    check(world, "j1: assign b1 on_demand | j2: assign d1 on_demand");
}

#[test]
fn the_planner_places_one_job_at_a_time_into_warm_state() {
    let world = w().onprem("dgx", 16.0).node(DGX, "d1", 8).job(8).job(8);
    let mut planner = Planner::new(&world.snap, NOW);
    let first = planner.place(&world.snap.queued[0]).outcome.clone();
    assert!(matches!(first, Outcome::Assigned { .. }));
    let second = planner.place(&world.snap.queued[1]).outcome.clone();
    assert!(matches!(second, Outcome::Wait { .. }), "{second:?}");
    assert_eq!(planner.plan().assignments.len(), 1);
    let explained = planner
        .explanation(&world.snap.queued[1].id)
        .expect("placed");
    assert_eq!(explained.outcome, second);
    assert!(explained.candidates[0].rejected.is_none(), "{explained:?}");
    assert_eq!(planner.into_plan().explanations.len(), 2);
}

/// On-prem at $2/GPU-h: 16 nodes, `d1` with `free` GPUs free, the other 15 full for 10 h;
/// and AWS p5 selling spot at `spot` dollars an hour for its 8 GPUs (no risk), boot 300 s.
fn nearly_full(free: u32, spot: f64) -> W {
    let mut world = w()
        .onprem("dgx", 16.0)
        .pool(P5, "H100", 8, 80.0, Some(spot))
        .node(DGX, "d1", free);
    for n in 2..=16 {
        let id = format!("d{n}");
        world = world.node(DGX, &id, 0).busy(&id, 8, 36_000);
    }
    world
}

#[rustfmt::skip]
#[test]
fn a_nearly_full_on_prem_pool_is_kept_for_jobs_that_cannot_use_spot() {
    // 8 of 128 GPUs free (under one in eight): protected. A job that allows spot is charged,
    // for the place, what a job it displaces would pay on demand in the cloud: $10/GPU-h (P5),
    // less the place's own $0.40 (cash: a fifth of the $2 internal rate): $3.20 + $76.80 = $80.
    // A spot node ($16.80/h for 1 h, the 5-minute boot and 42 s of expected restarts: $18.40)
    // is cheaper; a job that never runs on spot takes the on-prem GPUs (billed $16).
    check(nearly_full(8, 16.8).job(8).spot(SpotRule::Allowed), "launch aws:use1/p5 spot");
    check(nearly_full(8, 16.8).job(8), "assign d1 on_demand");
    // The explanation says why the cheaper place lost, at what it would cost.
    let shown = explain(nearly_full(8, 16.8).job(8).spot(SpotRule::Allowed));
    assert_eq!(shown[0], "aws:use1/p5 - Launch spot $18.396000 WIN");
    assert_eq!(
        shown[1],
        "onprem:dc1/dgx d1 FreeNow on_demand $16.000000 ReservedForJobsWithoutSpot { reserve: Money(76800000) }"
    );
    // Where spot costs more than the place and the reserve (a displaced job's on-demand
    // price: $79/h of spot for 1 h 5 min and restarts is $86.50), it still takes the place,
    // and pays (and is shown) what the place is billed, not the reserve.
    let plan = plan_of(nearly_full(8, 79.0).job(8).spot(SpotRule::Allowed));
    assert_eq!(plan.assignments[0].node.0, "d1");
    assert_eq!(plan.assignments[0].estimated_cost, usd(16.0));
    let shown = explain(nearly_full(8, 79.0).job(8).spot(SpotRule::Allowed));
    assert!(shown[0].contains("d1") && shown[0].contains("$16.00"), "{shown:?}");
    // With 24 of 144 GPUs free (one in six) the pool is not protected: on-prem is cheapest.
    let roomy = nearly_full(8, 16.8).node(DGX, "d17", 8).node(DGX, "d18", 8);
    check(roomy.job(8).spot(SpotRule::Allowed), "assign d1 on_demand");
    // A wait on a protected pool carries the reserve too.
    check(nearly_full(0, 16.8).job(8).spot(SpotRule::Allowed).deadline_in(86_400), "launch aws:use1/p5 spot");
    check(nearly_full(0, 16.8).job(8).deadline_in(86_400), "wait onprem:dc1/dgx +36000s");
    // The threshold is the snapshot's (config and scenario `reserve_free_below_one_in`): 0
    // turns the reserve off; below one in four, one in six free is protected again.
    let mut off = nearly_full(8, 16.8).job(8).spot(SpotRule::Allowed);
    off.snap.reserve_free_below_one_in = Some(0);
    check(off, "assign d1 on_demand");
    let mut wide = nearly_full(8, 16.8).node(DGX, "d17", 8).node(DGX, "d18", 8).job(8).spot(SpotRule::Allowed);
    wide.snap.reserve_free_below_one_in = Some(4);
    check(wide, "launch aws:use1/p5 spot");
}

#[test]
fn several_urgent_replicas_in_one_round_take_training_gpus_before_bursting() {
    let world = w()
        .onprem("dgx", 16.0)
        .node(DGX, "d1", 2)
        .node(DGX, "d2", 0)
        .busy("d2", 4, 36_000)
        .pool(P5, "H100", 8, 80.0, None)
        .job(2)
        .service(10_000)
        .priority(Priority::Critical)
        .job(2)
        .service(10_000)
        .priority(Priority::Critical)
        .job(2)
        .service(10_000)
        .priority(Priority::Critical)
        .job(2)
        .service(10_000)
        .priority(Priority::Critical);
    let p = plan_of(world);
    let outcomes: Vec<String> = (1..=4u128)
        .map(|i| {
            outcome(
                &p.explanation(&JobId(Uuid::from_u128(i)))
                    .expect("explained"),
            )
        })
        .collect();
    eprintln!(
        "{outcomes:?} preemptions {:?} launches {:?}",
        p.preemptions, p.launches
    );
    assert_eq!(p.preemptions.len(), 1, "{outcomes:?}");
    assert_eq!(
        p.launches.len(),
        1,
        "one new node for the fourth: {outcomes:?}"
    );
}

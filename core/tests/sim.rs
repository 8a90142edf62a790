//! The simulator on tiny worlds whose answers are worked out by hand in the comments.
//!
//! World: on-prem `onprem:dc` with one 2-GPU node at $1/GPU-hour; cloud `aws:r1` with 1-GPU
//! nodes at $3.60/h on demand, $1.80/h spot, 60 s boot; idle TTL 600 s; 60 s billing minimum.

use std::collections::BTreeMap;
use switchyard_core::sim::{
    self, Cheapest, FifoBurst, Scheduler, SimConfig, SimJob, SimPool, SimResult, Switchyard, World,
};
use switchyard_core::*;

fn region(id: &str, egress_micros: i64) -> Region {
    let (provider, code) = id.split_once(':').expect("provider:code");
    Region {
        id: RegionId::new(id),
        provider: provider.into(),
        code: code.into(),
        latitude: None,
        longitude: None,
        egress_per_gb: Money(egress_micros),
        latency_ms: 10,
        ingress_gbps: 10,
    }
}

fn pool(region: &str, name: &str, gpus: u32, od: i64, spot: Option<i64>, cloud: bool) -> Pool {
    Pool {
        id: PoolId::new(format!("{region}/{name}")),
        region: RegionId::new(region),
        provider: region.split(':').next().unwrap_or_default().into(),
        instance_type: name.into(),
        gpu_model: "V100".into(),
        gpus_per_node: gpus,
        gpu_memory_gb: 16,
        vcpus: 0,
        memory_gb: 0,
        on_demand_per_hour: Money(od),
        spot_per_hour: spot.map(Money),
        node_limit: if cloud { 10 } else { 1 },
        launchable: cloud,
        boot_time_s: if cloud { 60 } else { 0 },
        price_updated_at: Timestamp(0),
        recent_capacity_failures: 0,
        marginal_per_hour: None,
    }
}

fn world(interruptions_per_hour: f64) -> World {
    World {
        regions: vec![region("onprem:dc", 20_000), region("aws:r1", 90_000)],
        pools: vec![
            SimPool {
                pool: pool("onprem:dc", "box", 2, 2_000_000, None, false),
                fixed_nodes: 1,
                interruptions_per_hour: 0.0,
            },
            SimPool {
                pool: pool("aws:r1", "g1", 1, 3_600_000, Some(1_800_000), true),
                fixed_nodes: 0,
                interruptions_per_hour,
            },
        ],
    }
}

fn job(submit_s: i64, runtime_s: i64, deadline_factor: Option<f64>, spot: SpotRule) -> SimJob {
    SimJob {
        submit: Timestamp::from_secs(submit_s),
        runtime_s,
        estimate_s: None,
        spec: JobSpec {
            expected_gpu_utilization_pct: None,
            name: "j".into(),
            team: "t".into(),
            project: None,
            command: vec!["true".into()],
            env: BTreeMap::new(),
            resources: Resources {
                gpus: 1,
                gpu_models: vec![],
                accelerator: None,
                min_gpu_memory_gb: 0,
                cpus: 0,
                memory_gb: 0,
                nodes: 1,
            },
            estimated_runtime_s: Some(runtime_s),
            deadline: deadline_factor
                .map(|f| Timestamp::from_secs(submit_s + (f * runtime_s as f64) as i64)),
            priority: Priority::Normal,
            spot,
            max_price_per_hour: None,
            regions: vec![],
            data: None,
            kind: JobKind::Batch,
            max_latency_ms: None,
            callers: Vec::new(),
        },
        measured: true,
    }
}

fn run(s: &mut dyn Scheduler, jobs: &[SimJob]) -> SimResult {
    sim::run(&world(0.0), jobs, &SimConfig::default(), s)
}

fn delays(r: &SimResult) -> Vec<Option<f64>> {
    r.jobs.iter().map(|j| j.queue_delay_s()).collect()
}

fn three_jobs(deadline_factor: f64) -> Vec<SimJob> {
    (0..3)
        .map(|_| job(0, 3600, Some(deadline_factor), SpotRule::Never))
        .collect()
}

#[test]
fn cheapest_bursts_the_third_job_at_once() {
    // Two jobs take the on-prem node (billed $1 each, $0.20 in cash: a fifth of the internal
    // rate). The third launches a cloud node at 0, ready at 60 s, runs to 3,660 s, idles 600 s,
    // released at 4,260 s: 4,260 s × $3.60/h = $4.26.
    let r = run(&mut Cheapest, &three_jobs(3.0));
    assert_eq!(r.onprem_cost, Money(2_000_000));
    assert_eq!(r.onprem_cash_cost, Money(400_000));
    assert_eq!(r.cloud_busy_cost + r.cloud_idle_cost, Money(4_260_000));
    assert_eq!(r.cloud_busy_cost, Money(3_600_000));
    assert_eq!(r.total_cost(), Money(400_000 + 4_260_000));
    assert_eq!(r.chargeback_cost(), Money(2_000_000 + 4_260_000));
    assert_eq!(delays(&r), vec![Some(0.0), Some(0.0), Some(60.0)]);
    assert_eq!(r.burst_instances, 1);
    assert!(r.jobs.iter().all(|j| j.met_deadline()));
}

#[test]
fn fifo_burst_waits_ten_minutes_then_bursts() {
    // The third job waits 600 s, launches, is ready at 660 s, ends at 4,260 s; the node goes
    // at 4,860 s, billed from its launch at 600 s: 4,260 s, $4.26 as for `cheapest`, but the
    // job finishes 600 s later.
    let r = run(&mut FifoBurst::default(), &three_jobs(3.0));
    assert_eq!(r.total_cost(), Money(400_000 + 4_260_000));
    assert_eq!(r.jobs[2].finish, Some(Timestamp::from_secs(4260)));
    assert_eq!(delays(&r), vec![Some(0.0), Some(0.0), Some(660.0)]);
}

#[test]
fn switchyard_waits_for_on_prem_when_the_deadline_allows() {
    // Deadline 3 h: the third job waits for the on-prem node (free at 3,600 s), ends at
    // 7,200 s ≤ 10,800 s, and is billed $1 like the others ($0.20 in cash).
    let r = run(&mut Switchyard::default(), &three_jobs(3.0));
    assert_eq!(r.total_cost(), Money(600_000));
    assert_eq!(r.chargeback_cost(), Money(3_000_000));
    assert_eq!(delays(&r), vec![Some(0.0), Some(0.0), Some(3600.0)]);
    assert_eq!(r.burst_instances, 0);
    assert!(r.jobs.iter().all(|j| j.met_deadline()));
}

#[test]
fn switchyard_bursts_when_waiting_would_miss_the_deadline() {
    // Deadline 1.5 h = 5,400 s: waiting ends at 7,200 s, too late; a launch ends at 3,660 s.
    let r = run(&mut Switchyard::default(), &three_jobs(1.5));
    assert_eq!(r.total_cost(), Money(4_660_000));
    assert!(r.jobs.iter().all(|j| j.met_deadline()));
    // Cheapest meets it too, at the same price; fifo-burst's third job ends at 4,260 s.
    assert_eq!(
        run(&mut Cheapest, &three_jobs(1.5)).total_cost(),
        Money(4_660_000)
    );
}

#[test]
fn a_missed_deadline_is_counted() {
    // Deadline 1.01 h: the third job cannot finish by 3,636 s anywhere (boot is 60 s).
    let r = run(&mut Cheapest, &three_jobs(1.01));
    let met: Vec<bool> = r.jobs.iter().map(|j| j.met_deadline()).collect();
    assert_eq!(met, vec![true, true, false]);
}

#[test]
fn egress_is_charged_and_transfer_holds_the_node() {
    // 100 GB in aws:r1 at $0.09/GB = $9 to bring on-prem; 800 Gb at 10 Gb/s = 80 s more on
    // the node: 3,680 s at $1/h = $1.022223 (rounded up to the micro-dollar).
    let mut j = job(0, 3600, None, SpotRule::Never);
    j.spec.data = Some(DataLocation {
        region: RegionId::new("aws:r1"),
        size_gb: 100,
    });
    let r = run(&mut Cheapest, &[j]);
    assert_eq!(r.egress_cost, Money(9_000_000));
    assert_eq!(r.onprem_cost, Money(1_022_223));
    assert_eq!(
        r.spend_by_region[&RegionId::new("aws:r1")],
        Money(9_000_000)
    );
    assert_eq!(r.jobs[0].finish, Some(Timestamp::from_secs(3680)));
}

#[test]
fn spot_interruptions_requeue_and_jobs_still_finish_deterministically() {
    // On-prem busy with two long jobs; spot jobs burst and are interrupted often (2 per hour),
    // keep hourly checkpoints and still finish. Same seed, same result.
    let mut jobs = vec![
        job(0, 50_000, None, SpotRule::Never),
        job(0, 50_000, None, SpotRule::Never),
    ];
    jobs.extend((0..4).map(|i| job(i, 4 * 3600, None, SpotRule::Allowed)));
    let cfg = SimConfig {
        seed: 7,
        ..SimConfig::default()
    };
    let a = sim::run(&world(2.0), &jobs, &cfg, &mut Cheapest);
    let b = sim::run(&world(2.0), &jobs, &cfg, &mut Cheapest);
    assert_eq!(a, b);
    assert!(a.spot_interruptions > 0, "{a:?}");
    assert!(a.jobs.iter().all(|j| j.finish.is_some()));
    assert!(a.burst_instances > 4);
}

#[test]
fn an_idle_spot_node_takes_only_jobs_that_allow_spot() {
    // On-prem is full for 4 h. A spot-tolerant job gets a spot node (t = 1 s, done by ≈ 11 min);
    // at t = 900 s that node idles (TTL 600 s) when a job that never runs on spot arrives
    // with a 20-minute deadline: every scheduler launches it an on-demand node instead.
    let jobs = vec![
        job(0, 4 * 3600, None, SpotRule::Never),
        job(0, 4 * 3600, None, SpotRule::Never),
        job(1, 600, Some(3.0), SpotRule::Allowed),
        job(900, 600, Some(2.0), SpotRule::Never),
    ];
    let scheds: [Box<dyn Scheduler>; 3] = [
        Box::new(Switchyard::default()),
        Box::new(Cheapest),
        Box::new(FifoBurst::default()),
    ];
    for mut s in scheds {
        let r = run(s.as_mut(), &jobs);
        // The engine refuses a never-spot job on a spot node: none was even tried.
        assert_eq!(r.rejected_actions, 0, "{}", r.scheduler);
        assert!(r.jobs.iter().all(|j| j.finish.is_some()), "{r:?}");
        assert_eq!(r.burst_instances, 2, "{}", r.scheduler);
    }
}

#[test]
fn same_seed_same_result_for_every_scheduler() {
    let jobs: Vec<SimJob> = (0..40)
        .map(|i| {
            job(
                i * 97 % 1800,
                600 + (i * 331) % 7200,
                Some(2.0),
                SpotRule::Allowed,
            )
        })
        .collect();
    let cfg = SimConfig::default();
    let scheds: [fn() -> Box<dyn Scheduler>; 3] = [
        || Box::new(Switchyard::default()),
        || Box::new(Cheapest),
        || Box::new(FifoBurst::default()),
    ];
    for make in scheds {
        let a = sim::run(&world(0.5), &jobs, &cfg, make().as_mut());
        let b = sim::run(&world(0.5), &jobs, &cfg, make().as_mut());
        assert_eq!(a, b);
        assert_eq!(a.rejected_actions, 0, "{}", a.scheduler);
    }
}

#[test]
fn lower_bound_by_hand() {
    // In cash: on-prem at its marginal cost, $0.20/GPU-h (a fifth of its $1 internal rate).
    // Window 2 h: on-prem holds 2 GPUs × 2 h = 4 GPU-hours ≥ 3 needed: $0.60.
    assert_eq!(
        sim::lp_lower_bound(&world(0.0), &three_jobs(2.0), 16),
        Money(600_000)
    );
    // Window 1 h: 2 GPU-hours on-prem ($0.40), one hour in the cloud on demand ($3.60).
    assert_eq!(
        sim::lp_lower_bound(&world(0.0), &three_jobs(1.0), 16),
        Money(4_000_000)
    );
    // Spot allowed: the cloud hour costs $1.80.
    let spot: Vec<SimJob> = (0..3)
        .map(|_| job(0, 3600, Some(1.0), SpotRule::Allowed))
        .collect();
    assert_eq!(
        sim::lp_lower_bound(&world(0.0), &spot, 16),
        Money(2_200_000)
    );
}

#[test]
fn cash_and_chargeback_split_on_prem_and_idle_owned_gpus_are_reported_apart() {
    // One 1-h job on the 2-GPU on-prem node, finance's marginal cost $0.30/GPU-h against the
    // $1 internal rate; the measured window is the job's hour (submit to deadline: 1 h).
    let mut w = world(0.0);
    w.pools[0].pool.marginal_per_hour = Some(Money(600_000));
    let r = sim::run(
        &w,
        &[job(0, 3600, Some(1.0), SpotRule::Never)],
        &SimConfig::default(),
        &mut Cheapest,
    );
    assert_eq!(r.onprem_cost, Money(1_000_000));
    assert_eq!(r.onprem_cash_cost, Money(300_000));
    assert_eq!(r.total_cost(), Money(300_000));
    assert_eq!(r.chargeback_cost(), Money(1_000_000));
    // The other GPU idled: what it is worth at the internal rate, apart from both totals.
    assert!(r.owned_idle_gpu_hours >= 0.0 && r.owned_idle_cost >= Money::ZERO);
    assert_eq!(
        r.owned_idle_cost.micros(),
        (r.owned_idle_gpu_hours * 1_000_000.0).round() as i64
    );
}

#[test]
fn lower_bound_is_below_every_schedule_that_meets_the_deadlines() {
    let jobs: Vec<SimJob> = (0..60)
        .map(|i| {
            job(
                i * 211 % 7200,
                300 + (i * 577) % 9000,
                Some(2.5),
                SpotRule::Never,
            )
        })
        .collect();
    let bound = sim::lp_lower_bound(&world(0.0), &jobs, 64);
    for s in [
        &mut Switchyard::default() as &mut dyn Scheduler,
        &mut Cheapest,
        &mut FifoBurst::default(),
    ] {
        let r = run(s, &jobs);
        if r.jobs.iter().all(|j| j.met_deadline()) {
            assert!(
                bound <= r.total_cost(),
                "{}: {bound} > {}",
                r.scheduler,
                r.total_cost()
            );
        }
    }
    assert!(bound > Money::ZERO);
}

#[test]
fn a_long_spot_allowed_job_takes_the_on_demand_node_launched_for_it() {
    // Two 1-GPU jobs fill the on-prem node for 10 h. The third allows spot, runs 10 h and is
    // due in 15 h, so it cannot wait for them. At 5 interruptions an hour its spot run would
    // restart from its last checkpoint every 12 minutes, so on demand is its best launch. It
    // must then take that on-demand node (once it did not: the node idled out and was
    // launched again until the deadline had passed and the on-prem node was free).
    let w = world(5.0);
    let jobs = vec![
        job(0, 36_000, None, SpotRule::Never),
        job(0, 36_000, None, SpotRule::Never),
        job(100, 36_000, Some(1.5), SpotRule::Allowed),
    ];
    let r = sim::run(&w, &jobs, &SimConfig::default(), &mut Switchyard::default());
    assert_eq!(delays(&r), [Some(0.0), Some(0.0), Some(60.0)]);
    assert_eq!(r.burst_instances, 1);
}

/// Launches a node for every queued job at each call and never assigns one.
struct LaunchesOnly;

impl Scheduler for LaunchesOnly {
    fn name(&self) -> &str {
        "launches-only"
    }
    fn decide(&mut self, view: &sim::View<'_>) -> sim::Decisions {
        let actions = view
            .snapshot
            .queued
            .iter()
            .filter(|j| !view.is_provisioning(j.id))
            .map(|j| sim::Action::Launch {
                pool: PoolId::new("aws:r1/g1"),
                market: Market::OnDemand,
                for_job: j.id,
            })
            .collect();
        sim::Decisions {
            actions,
            wake_at: None,
        }
    }
}

#[test]
fn a_run_whose_scheduler_only_launches_ends_with_the_job_unfinished() {
    // Each node idles out after 10 minutes and is launched again: the run stops once two
    // days pass with nothing running and nothing to come, rather than never.
    let jobs = vec![job(0, 3600, None, SpotRule::Never)];
    let r = sim::run(&world(0.0), &jobs, &SimConfig::default(), &mut LaunchesOnly);
    assert_eq!(r.jobs[0].finish, None);
    assert!(r.burst_instances > 100, "{} launches", r.burst_instances);
}

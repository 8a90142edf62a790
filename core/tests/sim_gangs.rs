//! Gangs (`resources.nodes` > 1) in the simulator: the engine starts one on all its nodes or
//! none, ends and frees them together; the peers place one in a single pool or launch all its
//! nodes there; the bound counts every node's GPUs.
//!
//! World: on-prem `onprem:a` and `onprem:b`, each with nodes of 2 GPUs at $1/GPU-hour
//! (`a` has 2 nodes, `b` 1); cloud `aws:r1` with 2-GPU nodes at $7.20/h on demand (quota 1)
//! and `gcp:r2` with 2-GPU nodes at $9/h (quota 10), 60 s boot; idle TTL 600 s.

use std::collections::BTreeMap;
use switchyard_core::sim::{
    self, Action, Cheapest, Decisions, FifoBurst, Scheduler, SimConfig, SimJob, SimPool, SimResult,
    Switchyard, View, World,
};
use switchyard_core::*;

fn region(id: &str) -> Region {
    let (provider, code) = id.split_once(':').expect("provider:code");
    Region {
        id: RegionId::new(id),
        provider: provider.into(),
        code: code.into(),
        latitude: None,
        longitude: None,
        egress_per_gb: Money::ZERO,
        latency_ms: 10,
        ingress_gbps: 10,
    }
}

fn pool(region: &str, od: i64, limit: u32, cloud: bool) -> SimPool {
    SimPool {
        pool: Pool {
            id: PoolId::new(format!("{region}/n2")),
            region: RegionId::new(region),
            provider: region.split(':').next().unwrap_or_default().into(),
            instance_type: "n2".into(),
            gpu_model: "V100".into(),
            gpus_per_node: 2,
            gpu_memory_gb: 16,
            vcpus: 0,
            memory_gb: 0,
            on_demand_per_hour: Money(od),
            spot_per_hour: None,
            node_limit: limit,
            launchable: cloud,
            boot_time_s: if cloud { 60 } else { 0 },
            price_updated_at: Timestamp(0),
            recent_capacity_failures: 0,
            marginal_per_hour: None,
        },
        fixed_nodes: if cloud { 0 } else { limit },
        interruptions_per_hour: 0.0,
    }
}

fn world(onprem_a_nodes: u32) -> World {
    World {
        regions: ["onprem:a", "onprem:b", "aws:r1", "gcp:r2"]
            .into_iter()
            .map(region)
            .collect(),
        pools: vec![
            pool("onprem:a", 2_000_000, onprem_a_nodes, false),
            pool("onprem:b", 2_000_000, 1, false),
            pool("aws:r1", 7_200_000, 1, true),
            pool("gcp:r2", 9_000_000, 10, true),
        ],
    }
}

fn job(submit_s: i64, runtime_s: i64, gpus: u32, nodes: u32, deadline_s: Option<i64>) -> SimJob {
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
                gpus,
                gpu_models: vec![],
                accelerator: None,
                min_gpu_memory_gb: 0,
                cpus: 0,
                memory_gb: 0,
                nodes,
            },
            estimated_runtime_s: Some(runtime_s),
            deadline: deadline_s.map(Timestamp::from_secs),
            priority: Priority::Normal,
            spot: SpotRule::Never,
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

fn run(w: &World, s: &mut dyn Scheduler, jobs: &[SimJob]) -> SimResult {
    sim::run(w, jobs, &SimConfig::default(), s)
}

fn node(pool: &str, i: usize) -> NodeId {
    NodeId::new(format!("{pool}/n2#{i:06}"))
}

/// Plays the given actions on its first call, then nothing.
struct Script(Vec<Action>);

impl Scheduler for Script {
    fn name(&self) -> &str {
        "script"
    }
    fn decide(&mut self, _: &View<'_>) -> Decisions {
        Decisions {
            actions: std::mem::take(&mut self.0),
            wake_at: None,
        }
    }
}

#[test]
fn a_gang_on_two_nodes_runs_and_frees_both() {
    // The gang holds both of `onprem:a`'s nodes (2 × 2 GPUs) for an hour: $4. The one-node
    // 2-GPU job behind it waits (fifo-burst never bursts here) and starts on a freed node at
    // 3,600 s: $2 more, beside the two-hour job's $4.
    let w = world(2);
    // A two-hour job fills `onprem:b`'s node, so the last job can only wait for `onprem:a`.
    let jobs = [
        job(0, 3600, 2, 2, None),
        job(0, 7200, 2, 1, None),
        job(1, 3600, 2, 1, None),
    ];
    let mut fifo = FifoBurst {
        burst_after_s: 1_000_000,
    };
    let r = run(&w, &mut fifo, &jobs);
    assert_eq!(r.jobs[0].first_start, Some(Timestamp::from_secs(0)));
    assert_eq!(r.jobs[0].finish, Some(Timestamp::from_secs(3600)));
    assert_eq!(r.jobs[0].first_pool, Some(PoolId::new("onprem:a/n2")));
    assert_eq!(r.jobs[0].cost, Money(4_000_000));
    assert_eq!(r.jobs[2].first_start, Some(Timestamp::from_secs(3600)));
    assert_eq!(r.jobs[2].finish, Some(Timestamp::from_secs(7200)));
    assert_eq!(r.onprem_cost, Money(4_000_000 + 4_000_000 + 2_000_000));
    assert_eq!((r.burst_instances, r.rejected_actions), (0, 0));
}

#[test]
fn the_engine_refuses_a_partial_or_split_gang() {
    let w = world(2);
    let gpus = GpuSet::first(2).expect("2 GPUs");
    let gang = job(0, 3600, 2, 2, None);
    let id = sim::job_id(0);
    let tries = [
        // One node of two.
        vec![Action::Assign {
            job: id,
            node: node("onprem:a", 0),
            gpus,
        }],
        vec![Action::AssignGang {
            job: id,
            nodes: vec![(node("onprem:a", 0), gpus)],
        }],
        // Two pools.
        vec![Action::AssignGang {
            job: id,
            nodes: vec![(node("onprem:a", 0), gpus), (node("onprem:b", 2), gpus)],
        }],
        // One node twice.
        vec![Action::AssignGang {
            job: id,
            nodes: vec![(node("onprem:a", 0), gpus), (node("onprem:a", 0), gpus)],
        }],
        // A launch of one node, or of two where the quota has room for one.
        vec![Action::Launch {
            pool: PoolId::new("gcp:r2/n2"),
            market: Market::OnDemand,
            for_job: id,
        }],
        vec![Action::LaunchGang {
            pool: PoolId::new("aws:r1/n2"),
            market: Market::OnDemand,
            for_job: id,
        }],
    ];
    for actions in tries {
        let r = run(
            &w,
            &mut Script(actions.clone()),
            std::slice::from_ref(&gang),
        );
        assert_eq!(r.rejected_actions, 1, "{actions:?}");
        assert_eq!((r.jobs[0].first_start, r.burst_instances), (None, 0));
    }
    let both = vec![Action::AssignGang {
        job: id,
        nodes: vec![(node("onprem:a", 0), gpus), (node("onprem:a", 1), gpus)],
    }];
    let r = run(&w, &mut Script(both), std::slice::from_ref(&gang));
    assert_eq!(r.jobs[0].finish, Some(Timestamp::from_secs(3600)));
    let launch = vec![Action::LaunchGang {
        pool: PoolId::new("gcp:r2/n2"),
        market: Market::OnDemand,
        for_job: id,
    }];
    let r = run(&w, &mut Script(launch), std::slice::from_ref(&gang));
    assert_eq!((r.burst_instances, r.rejected_actions), (2, 0));
}

#[test]
fn the_peers_place_a_gang_in_one_pool_or_launch_all_its_nodes() {
    // `onprem:a` has one node and `onprem:b` one: two nodes free, but in two pools. The gang
    // cannot run on-prem. `cheapest` launches both nodes at once in `gcp:r2` (`aws:r1` is
    // cheaper but its quota of 1 cannot hold the gang): ready at 60 s, done at 3,660 s.
    let w = world(1);
    let jobs = [job(0, 3600, 2, 2, None)];
    let r = run(&w, &mut Cheapest, &jobs);
    assert_eq!(r.burst_instances, 2);
    assert_eq!(r.jobs[0].first_pool, Some(PoolId::new("gcp:r2/n2")));
    assert_eq!(r.jobs[0].first_start, Some(Timestamp::from_secs(60)));
    assert_eq!(r.jobs[0].finish, Some(Timestamp::from_secs(3660)));
    // Two nodes, each billed from launch to release at 3,660 + 600 s: 2 × 4,260 s × $9/h.
    assert_eq!(r.cloud_busy_cost + r.cloud_idle_cost, Money(2 * 10_650_000));
    assert_eq!(r.onprem_cost, Money::ZERO);
    assert_eq!(r.rejected_actions, 0);
    // fifo-burst waits its 600 s, then launches both the same way.
    let r = run(&w, &mut FifoBurst::default(), &jobs);
    assert_eq!(r.burst_instances, 2);
    assert_eq!(r.jobs[0].first_pool, Some(PoolId::new("gcp:r2/n2")));
    assert_eq!(r.jobs[0].first_start, Some(Timestamp::from_secs(660)));
    // Never bursting, it waits: the gang never runs split across the two pools.
    let r = run(
        &w,
        &mut FifoBurst {
            burst_after_s: 1_000_000,
        },
        &jobs,
    );
    assert_eq!((r.jobs[0].first_start, r.burst_instances), (None, 0));
    // With two nodes in `onprem:a`, both take it there, on-prem.
    for s in [
        &mut Cheapest as &mut dyn Scheduler,
        &mut FifoBurst::default(),
    ] {
        let r = run(&world(2), s, &jobs);
        assert_eq!(r.jobs[0].first_pool, Some(PoolId::new("onprem:a/n2")));
        assert_eq!(r.jobs[0].finish, Some(Timestamp::from_secs(3600)));
        assert_eq!(r.burst_instances, 0);
    }
}

#[test]
fn switchyard_runs_a_gang_and_the_bound_counts_every_node() {
    // Switchyard waits for or bursts the gang; either way it runs on two nodes of one pool.
    let w = world(1);
    let jobs = [job(0, 3600, 2, 2, Some(3 * 3600))];
    let r = run(&w, &mut Switchyard::default(), &jobs);
    assert!(r.jobs[0].met_deadline(), "{:?}", r.jobs[0]);
    assert_eq!(r.rejected_actions, 0);
    assert_eq!(r.burst_instances, 2);
    assert_eq!(r.jobs[0].first_pool, Some(PoolId::new("gcp:r2/n2")));
    // On-prem in one pool of two nodes: the bound is 4 GPU-hours at $0.20 in cash (a fifth of
    // the $1 internal rate), twice a one-node job's.
    let w = world(2);
    let gang = sim::lp_lower_bound(&w, &jobs, 16);
    let one = sim::lp_lower_bound(&w, &[job(0, 3600, 2, 1, Some(3 * 3600))], 16);
    assert_eq!((gang, one), (Money(800_000), Money(400_000)));
    let r = run(&w, &mut Switchyard::default(), &jobs);
    assert_eq!(r.total_cost(), Money(800_000));
    assert_eq!(r.chargeback_cost(), Money(4_000_000));
}

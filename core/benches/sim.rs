//! The simulator on a synthetic Philly-like trace (heavy-tailed runtimes, mostly 1-GPU jobs,
//! bursty arrivals) against 32 on-prem 8-GPU nodes and 40 cloud pools, for each scheduler.
//! The full 15,000-job Philly replay is timed by `switchyard simulate` (BENCHMARKS.md).

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use std::collections::BTreeMap;
use std::hint::black_box;
use switchyard_core::sim::rng::SplitMix64;
use switchyard_core::sim::{
    self, Cheapest, FifoBurst, Scheduler, SimConfig, SimJob, SimPool, Switchyard, World,
};
use switchyard_core::*;

fn pool(id: usize, cloud: bool, gpus: u32, per_gpu: i64) -> SimPool {
    let region = if cloud {
        format!("aws:r{}", id % 4)
    } else {
        "onprem:dc".into()
    };
    SimPool {
        pool: Pool {
            id: PoolId::new(format!("{region}/p{id}")),
            region: RegionId::new(&region),
            provider: region.split(':').next().unwrap_or("aws").into(),
            instance_type: format!("p{id}"),
            gpu_model: "V100".into(),
            gpus_per_node: gpus,
            gpu_memory_gb: 16,
            vcpus: 0,
            memory_gb: 0,
            on_demand_per_hour: Money(per_gpu * i64::from(gpus)),
            spot_per_hour: cloud.then_some(Money(per_gpu * i64::from(gpus) / 3)),
            node_limit: if cloud { 64 } else { 32 },
            launchable: cloud,
            boot_time_s: if cloud { 180 } else { 0 },
            price_updated_at: Timestamp(0),
            recent_capacity_failures: 0,
            marginal_per_hour: None,
        },
        fixed_nodes: if cloud { 0 } else { 32 },
        interruptions_per_hour: 0.01,
    }
}

fn world() -> World {
    let mut pools = vec![pool(0, false, 8, 250_000)];
    pools.extend((1..=40).map(|i| pool(i, true, [1, 4, 8][i % 3], 600_000 + (i as i64) * 17_000)));
    World {
        regions: vec![],
        pools,
    }
}

fn jobs(n: usize) -> Vec<SimJob> {
    let mut r = SplitMix64::new(3);
    let mut t = 0;
    (0..n)
        .map(|_| {
            t += (r.exponential(1.0 / 60.0)) as i64;
            let runtime_s = (60.0 * (r.next_f64() * 8.0).exp()) as i64;
            let gpus = [1, 1, 1, 1, 1, 1, 1, 2, 4, 8][(r.next_u64() % 10) as usize];
            SimJob {
                submit: Timestamp::from_secs(t),
                runtime_s,
                estimate_s: None,
                measured: true,
                spec: JobSpec {
                    expected_gpu_utilization_pct: None,
                    name: "j".into(),
                    team: "t".into(),
                    project: None,
                    command: vec![],
                    env: BTreeMap::new(),
                    resources: Resources {
                        gpus,
                        gpu_models: vec![],
                        accelerator: None,
                        min_gpu_memory_gb: 0,
                        cpus: 0,
                        memory_gb: 0,
                        nodes: 1,
                    },
                    estimated_runtime_s: Some(runtime_s),
                    deadline: Some(Timestamp::from_secs(t + runtime_s * 3 + 900)),
                    priority: Priority::Normal,
                    spot: if r.bernoulli(0.5) {
                        SpotRule::Allowed
                    } else {
                        SpotRule::Never
                    },
                    max_price_per_hour: None,
                    regions: vec![],
                    data: None,
                    kind: JobKind::Batch,
                    max_latency_ms: None,
                    callers: Vec::new(),
                },
            }
        })
        .collect()
}

type MakeScheduler = fn() -> Box<dyn Scheduler>;

fn bench_sim(c: &mut Criterion) {
    let (world, jobs) = (world(), jobs(2_000));
    let cfg = SimConfig::default();
    let mut group = c.benchmark_group("sim_2000_jobs");
    group.sample_size(10);
    let makers: [(&str, MakeScheduler); 3] = [
        ("switchyard", || Box::new(Switchyard::default())),
        ("cheapest", || Box::new(Cheapest)),
        ("fifo-burst", || Box::new(FifoBurst::default())),
    ];
    for (name, make) in makers {
        group.bench_function(BenchmarkId::from_parameter(name), |b| {
            b.iter(|| sim::run(black_box(&world), black_box(&jobs), &cfg, make().as_mut()))
        });
    }
    group.bench_function("lp_lower_bound", |b| {
        b.iter(|| sim::lp_lower_bound(black_box(&world), black_box(&jobs), 256))
    });
    group.finish();
}

criterion_group!(benches, bench_sim);
criterion_main!(benches);

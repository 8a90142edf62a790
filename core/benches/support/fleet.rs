//! A synthetic fleet for benchmarks and tests, from a seed: a quarter of the pools on-prem
//! (static, cheap), the rest cloud (launchable, some with spot) over 20 regions and 5 GPU models;
//! nodes spread over the pools with a mix of free and busy GPUs and running work ending over the
//! next hours; jobs with a mix of model lists, region allow-lists, deadlines, spot rules and data
//! locations.
//!
//! Shared by `benches/plan.rs` and the placement unit tests through `#[path]`; the including
//! module brings the domain types into scope (`switchyard_core::*` or `crate::*`), hence
//! `use super::*`.

use super::*;
use std::collections::BTreeMap;
use uuid::Uuid;

pub const NOW: Timestamp = Timestamp::from_secs(1_800_000_000);
const MODELS: [&str; 5] = ["H100", "A100-80GB", "L4", "H200", "L40S"];

/// A small deterministic generator (SplitMix64): benches must not depend on a crate's RNG.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

/// A fleet of `pools` pools and `nodes` nodes with `jobs` queued jobs, the same for the same
/// arguments.
pub fn fleet(seed: u64, jobs: usize, pools: usize, nodes: usize) -> Snapshot {
    let mut rng = Rng(seed);
    let regions: Vec<Region> = (0..20)
        .map(|i| {
            let provider = if i < 4 {
                "onprem"
            } else {
                ["aws", "gcp", "azure"][i % 3]
            };
            let id = RegionId::new(format!("{provider}:r{i}"));
            Region {
                id,
                provider: provider.into(),
                code: format!("r{i}"),
                latitude: None,
                longitude: None,
                egress_per_gb: Money::from_micros(if i < 4 { 0 } else { 90_000 }),
                latency_ms: 5 + rng.below(150) as u32,
                ingress_gbps: [10, 25, 100][i % 3],
            }
        })
        .collect();
    let pools: Vec<Pool> = (0..pools)
        .map(|i| {
            let onprem = i % 4 == 0;
            let region = if onprem {
                &regions[(i / 4) % 4]
            } else {
                &regions[4 + i % 16]
            };
            let gpus_per_node = *rng.pick(&[1u32, 4, 8, 8]);
            let model = *rng.pick(&MODELS);
            let per_gpu = if onprem {
                1_500_000
            } else {
                2_000_000 + rng.below(8_000_000) as i64
            };
            let on_demand = Money::from_micros(per_gpu * i64::from(gpus_per_node));
            Pool {
                id: PoolId::new(format!("{}/t{i}", region.id)),
                region: region.id.clone(),
                provider: region.provider.clone(),
                instance_type: format!("t{i}"),
                gpu_model: model.into(),
                gpus_per_node,
                gpu_memory_gb: if model == "L4" { 24 } else { 80 },
                vcpus: 12 * gpus_per_node,
                memory_gb: 128 * gpus_per_node,
                on_demand_per_hour: on_demand,
                spot_per_hour: (!onprem && rng.chance(60))
                    .then(|| Money::from_micros(on_demand.0 / 3)),
                node_limit: if onprem { 1_000 } else { 20 },
                launchable: !onprem,
                boot_time_s: if onprem {
                    0
                } else {
                    120 + rng.below(480) as u32
                },
                price_updated_at: NOW,
                recent_capacity_failures: 0,
                marginal_per_hour: None,
            }
        })
        .collect();
    let mut running = Vec::new();
    let nodes: Vec<Node> = (0..nodes)
        .map(|i| {
            let pool = &pools[rng.below(pools.len() as u64) as usize];
            let id = NodeId::new(format!("node-{i:05}"));
            let busy = rng.below(u64::from(pool.gpus_per_node) + 1) as u32;
            for g in 0..busy {
                let n = running.len() as u128;
                running.push(RunningAttempt {
                    job: JobId(Uuid::from_u128(1 << 64 | n)),
                    attempt: AttemptId(Uuid::from_u128(1 << 64 | n)),
                    node: id.clone(),
                    gpus: GpuSet::from_indexes([g]).expect("at most 64 GPUs"),
                    priority: Priority::Normal,
                    started_at: NOW,
                    expected_end: if rng.chance(5) {
                        Timestamp::MAX
                    } else {
                        NOW.plus_secs(rng.below(8 * 3600) as i64 - 600)
                    },
                });
            }
            Node {
                id,
                pool: pool.id.clone(),
                gpus_total: pool.gpus_per_node,
                // GPUs `busy..` (the attempts above hold `0..busy`).
                free_gpus: GpuSet::first(pool.gpus_per_node)
                    .expect("at most 64 GPUs")
                    .difference(GpuSet::first(busy).expect("at most 64 GPUs")),
                healthy: !rng.chance(3),
                draining: rng.chance(2),
                last_heartbeat: NOW,
                // Every fourth node of a pool that sells spot was bought there (no draw: the
                // rest of the fleet is what it was before nodes had markets).
                market: if pool.launchable && pool.spot_per_hour.is_some() && i % 4 == 0 {
                    Market::Spot
                } else {
                    Market::OnDemand
                },
            }
        })
        .collect();
    let queued = (0..jobs)
        .map(|i| {
            let gpus = *rng.pick(&[1u32, 1, 1, 2, 4, 8]);
            let models = match rng.below(3) {
                0 => vec![],
                1 => vec![rng.pick(&MODELS).to_string()],
                _ => vec![rng.pick(&MODELS).to_string(), rng.pick(&MODELS).to_string()],
            };
            let allowed = if rng.chance(20) {
                (0..3).map(|_| rng.pick(&regions).id.clone()).collect()
            } else {
                vec![]
            };
            QueuedJob {
                id: JobId(Uuid::from_u128(i as u128 + 1)),
                spec: JobSpec {
                    expected_gpu_utilization_pct: None,
                    name: format!("job-{i}"),
                    team: "ml".into(),
                    project: None,
                    command: vec!["train".into()],
                    env: BTreeMap::new(),
                    resources: Resources {
                        gpus,
                        gpu_models: models,
                        accelerator: None,
                        min_gpu_memory_gb: 0,
                        cpus: 4 * gpus,
                        memory_gb: 32 * gpus,
                        nodes: 1,
                    },
                    estimated_runtime_s: Some(600 + rng.below(12 * 3600) as i64),
                    deadline: rng
                        .chance(50)
                        .then(|| NOW.plus_secs(3600 + rng.below(24 * 3600) as i64)),
                    priority: *rng.pick(&[
                        Priority::Low,
                        Priority::Normal,
                        Priority::Normal,
                        Priority::High,
                    ]),
                    spot: *rng.pick(&[SpotRule::Never, SpotRule::Allowed, SpotRule::Preferred]),
                    max_price_per_hour: rng.chance(20).then(|| Money::from_micros(40_000_000)),
                    regions: allowed,
                    data: rng.chance(20).then(|| DataLocation {
                        region: rng.pick(&regions).id.clone(),
                        size_gb: rng.below(1_000) as u32,
                    }),
                    kind: if rng.chance(10) {
                        JobKind::Service
                    } else {
                        JobKind::Batch
                    },
                    max_latency_ms: rng.chance(10).then_some(100),
                    callers: Vec::new(),
                },
                submitted_at: NOW.plus_secs(-(rng.below(86_400) as i64)),
                deadline_runtime_s: None,
            }
        })
        .collect();
    Snapshot {
        regions,
        pools,
        nodes,
        queued,
        running,
        burst_enabled: true,
        ..Snapshot::default()
    }
}

//! Safety properties of `plan` over random snapshots (Nomad-style): never over a node's free
//! GPUs, never a pool, region, model or latency the job forbids, never an unhealthy or draining
//! node, never past a pool's node limit or with bursting off; every queued job explained exactly
//! once and decided exactly once; and the same plan whatever the order of the input vectors.

use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use switchyard_core::placement::{MAX_EXPLAINED_CANDIDATES, hard_constraint};
use switchyard_core::*;
use uuid::Uuid;

const NOW: Timestamp = Timestamp::from_secs(1_800_000_000);
/// The last one is never described in `Snapshot::regions`.
const REGIONS: [&str; 5] = [
    "onprem:dc1",
    "aws:use1",
    "aws:usw2",
    "gcp:euw4",
    "azure:weu",
];
const MODELS: [&str; 3] = ["H100", "A100-80GB", "L4"];

fn region(i: usize, egress_cents: i64, latency_ms: u32, ingress_gbps: u32) -> Region {
    let id = REGIONS[i];
    let (provider, code) = id.split_once(':').unwrap_or((id, id));
    Region {
        id: RegionId::new(id),
        provider: provider.into(),
        code: code.into(),
        latitude: None,
        longitude: None,
        egress_per_gb: Money::from_micros(egress_cents * 10_000),
        latency_ms,
        ingress_gbps,
    }
}

prop_compose! {
    fn arb_pool()(
        region in 0..REGIONS.len(),
        model in 0..MODELS.len(),
        gpus_per_node in prop::sample::select(vec![1u32, 2, 4, 8]),
        gpu_memory_gb in prop::sample::select(vec![24u32, 40, 80]),
        vcpus in prop::sample::select(vec![0u32, 32, 96]),
        memory_gb in prop::sample::select(vec![0u32, 256, 1024]),
        on_demand in 1i64..100,
        spot in prop::option::of(1i64..120),
        node_limit in 0u32..4,
        launchable in any::<bool>(),
        boot_time_s in 0u32..900,
    ) -> Pool {
        Pool {
            id: PoolId::new(""),
            region: RegionId::new(REGIONS[region]),
            provider: REGIONS[region].split(':').next().unwrap_or("").into(),
            instance_type: String::new(),
            gpu_model: MODELS[model].into(),
            gpus_per_node,
            gpu_memory_gb,
            vcpus,
            memory_gb,
            on_demand_per_hour: Money::from_micros(on_demand * 1_000_000),
            spot_per_hour: spot.map(|s| Money::from_micros(s * 1_000_000)),
            node_limit,
            launchable,
            boot_time_s,
            price_updated_at: NOW,
            recent_capacity_failures: 0,
        }
    }
}

prop_compose! {
    fn arb_node()(pool in any::<prop::sample::Index>(), free in any::<prop::sample::Index>(),
                  healthy in prop::bool::weighted(0.85), draining in prop::bool::weighted(0.1))
                  -> (prop::sample::Index, prop::sample::Index, bool, bool) {
        (pool, free, healthy, draining)
    }
}

prop_compose! {
    fn arb_attempt()(node in any::<prop::sample::Index>(), gpus in 1u32..5,
                     end in prop::option::weighted(0.9, -3_600i64..36_000))
                     -> (prop::sample::Index, u32, Option<i64>) {
        (node, gpus, end)
    }
}

prop_compose! {
    fn arb_spec()(
        gpus in prop::sample::select(vec![0u32, 1, 1, 1, 2, 2, 4, 8, 16]),
        models in prop::option::weighted(0.3, prop::sample::subsequence(MODELS.to_vec(), 1..=2)),
        min_gpu_memory_gb in prop::sample::select(vec![0u32, 0, 0, 0, 40, 80]),
        cpus in prop::sample::select(vec![0u32, 0, 0, 16, 64]),
        memory_gb in prop::sample::select(vec![0u32, 0, 0, 128, 512]),
        nodes in prop::sample::select(vec![1u32, 1, 1, 1, 1, 1, 1, 1, 1, 2]),
        runtime in prop::option::weighted(0.8, 0i64..36_000),
        deadline in prop::option::of(0i64..72_000),
        priority in prop::sample::select(vec![Priority::Low, Priority::Normal, Priority::High, Priority::Critical]),
        spot in prop::sample::select(vec![SpotRule::Never, SpotRule::Allowed, SpotRule::Preferred]),
        max_price in prop::option::weighted(0.2, 1i64..200),
        regions in prop::option::weighted(0.3, prop::sample::subsequence(REGIONS.to_vec(), 1..=3)),
        data in prop::option::weighted(0.3, (0..REGIONS.len(), 0u32..2_000)),
        service in prop::bool::weighted(0.2),
        max_latency_ms in prop::option::of(1u32..200),
    ) -> JobSpec {
        JobSpec {
            name: "job".into(),
            team: "team".into(),
            project: None,
            command: vec!["true".into()],
            env: BTreeMap::new(),
            resources: Resources {
                gpus,
                gpu_models: models.unwrap_or_default().into_iter().map(String::from).collect(),
                min_gpu_memory_gb,
                cpus,
                memory_gb,
                nodes,
            },
            estimated_runtime_s: runtime,
            deadline: deadline.map(|d| NOW.plus_secs(d)),
            priority,
            spot,
            max_price_per_hour: max_price.map(|d| Money::from_micros(d * 1_000_000)),
            regions: regions.unwrap_or_default().into_iter().map(RegionId::new).collect(),
            data: data.map(|(r, size_gb)| DataLocation { region: RegionId::new(REGIONS[r]), size_gb }),
            kind: if service { JobKind::Service } else { JobKind::Batch },
            max_latency_ms,
        }
    }
}

fn arb_snapshot() -> impl Strategy<Value = Snapshot> {
    (
        prop::collection::vec((0i64..20, 1u32..200, 0u32..100), REGIONS.len() - 1),
        prop::collection::vec(arb_pool(), 0..10),
        prop::collection::vec(arb_node(), 0..20),
        prop::collection::vec(arb_attempt(), 0..20),
        prop::collection::vec((arb_spec(), 0i64..600, 0i64..3), 0..14),
        any::<bool>(),
    )
        .prop_map(|(regions, pools, nodes, attempts, jobs, burst_enabled)| {
            let regions = regions
                .into_iter()
                .enumerate()
                .map(|(i, (egress, latency, ingress))| region(i, egress, latency, ingress))
                .collect();
            let pools: Vec<Pool> = pools
                .into_iter()
                .enumerate()
                .map(|(i, p)| Pool {
                    id: PoolId::new(format!("{}/p{i}", p.region)),
                    ..p
                })
                .collect();
            let nodes: Vec<Node> = if pools.is_empty() {
                Vec::new()
            } else {
                nodes
                    .into_iter()
                    .enumerate()
                    .map(|(i, (pool, free, healthy, draining))| {
                        let pool = pool.get(&pools);
                        Node {
                            id: NodeId::new(format!("n{i:02}")),
                            pool: pool.id.clone(),
                            gpus_total: pool.gpus_per_node,
                            gpus_free: free.index(pool.gpus_per_node as usize + 1) as u32,
                            healthy,
                            draining,
                            last_heartbeat: NOW,
                        }
                    })
                    .collect()
            };
            let running = attempts
                .into_iter()
                .enumerate()
                .map(|(i, (node, gpus, end))| RunningAttempt {
                    job: JobId(Uuid::from_u128(1_000 + i as u128)),
                    attempt: AttemptId(Uuid::from_u128(1_000 + i as u128)),
                    // An attempt on a node the snapshot lacks is possible and ignored.
                    node: if nodes.is_empty() {
                        NodeId::new("gone")
                    } else {
                        node.get(&nodes).id.clone()
                    },
                    gpus,
                    priority: Priority::Normal,
                    started_at: NOW,
                    expected_end: end.map_or(Timestamp::MAX, |e| NOW.plus_secs(e)),
                })
                .collect();
            let queued = jobs
                .into_iter()
                .enumerate()
                .map(|(i, (spec, submitted_ago, _))| QueuedJob {
                    id: JobId(Uuid::from_u128(i as u128 + 1)),
                    spec,
                    // Few distinct values, so later tie-breaks are exercised.
                    submitted_at: NOW.plus_secs(-(submitted_ago % 3)),
                })
                .collect();
            Snapshot {
                regions,
                pools,
                nodes,
                queued,
                running,
                burst_enabled,
                ..Snapshot::default()
            }
        })
}

/// Fisher–Yates with a small LCG: the shuffle is part of the generated case, so it shrinks and
/// replays with it.
fn shuffle<T>(v: &mut [T], seed: &mut u64) {
    for i in (1..v.len()).rev() {
        *seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let j = ((*seed >> 33) % (i as u64 + 1)) as usize;
        v.swap(i, j);
    }
}

fn check_safety(snap: &Snapshot, plan: &Plan) -> Result<(), TestCaseError> {
    let pools: HashMap<&PoolId, &Pool> = snap.pools.iter().map(|p| (&p.id, p)).collect();
    let nodes: HashMap<&NodeId, &Node> = snap.nodes.iter().map(|n| (&n.id, n)).collect();
    let jobs: HashMap<JobId, &QueuedJob> = snap.queued.iter().map(|j| (j.id, j)).collect();
    let regions: HashMap<&RegionId, &Region> = snap.regions.iter().map(|r| (&r.id, r)).collect();

    let allowed = |pool: &Pool, spec: &JobSpec| -> Result<(), TestCaseError> {
        prop_assert_eq!(
            hard_constraint(pool, spec),
            None,
            "pool {} for {:?}",
            pool.id,
            spec
        );
        prop_assert!(spec.regions.is_empty() || spec.regions.contains(&pool.region));
        prop_assert!(
            spec.resources.gpu_models.is_empty()
                || spec
                    .resources
                    .gpu_models
                    .iter()
                    .any(|m| m.eq_ignore_ascii_case(&pool.gpu_model))
        );
        prop_assert!(pool.gpus_per_node >= spec.resources.gpus);
        if let (JobKind::Service, Some(max)) = (spec.kind, spec.max_latency_ms) {
            let latency = regions.get(&pool.region).map(|r| r.latency_ms);
            prop_assert!(
                latency.is_some_and(|l| l <= max),
                "latency {latency:?} > {max}"
            );
        }
        prop_assert!(spec.resources.nodes <= 1);
        Ok(())
    };

    let mut used: HashMap<&NodeId, u32> = HashMap::new();
    for a in &plan.assignments {
        let job = jobs
            .get(&a.job)
            .ok_or_else(|| TestCaseError::fail("unknown job"))?;
        let node = nodes
            .get(&a.node)
            .ok_or_else(|| TestCaseError::fail("unknown node"))?;
        let pool = pools
            .get(&a.pool)
            .ok_or_else(|| TestCaseError::fail("unknown pool"))?;
        prop_assert_eq!(&node.pool, &a.pool);
        prop_assert!(node.healthy && !node.draining, "unusable node {}", node.id);
        prop_assert_eq!(a.gpus, job.spec.resources.gpus);
        allowed(pool, &job.spec)?;
        if a.market == Market::Spot {
            prop_assert!(job.spec.spot != SpotRule::Never && pool.spot_per_hour.is_some());
        }
        *used.entry(&a.node).or_default() += a.gpus;
    }
    for (node, gpus) in used {
        prop_assert!(
            gpus <= nodes[node].gpus_free,
            "node {} over capacity: {}",
            node,
            gpus
        );
    }

    let mut launched: HashMap<&PoolId, u32> = HashMap::new();
    for l in &plan.launches {
        let job = jobs
            .get(&l.for_job)
            .ok_or_else(|| TestCaseError::fail("unknown job"))?;
        let pool = pools[&l.pool];
        prop_assert!(snap.burst_enabled && pool.launchable);
        allowed(pool, &job.spec)?;
        *launched.entry(&l.pool).or_default() += 1;
    }
    for (pool, n) in launched {
        let existing = snap.nodes.iter().filter(|node| &node.pool == pool).count() as u32;
        prop_assert!(
            existing + n <= pools[pool].node_limit,
            "pool {} over quota",
            pool
        );
    }

    // Every queued job: one explanation, one decision, and the lists agree with it.
    let ids: BTreeSet<JobId> = jobs.keys().copied().collect();
    prop_assert_eq!(
        plan.explanations.keys().copied().collect::<BTreeSet<_>>(),
        ids
    );
    let mut decided: HashMap<JobId, usize> = HashMap::new();
    for id in plan
        .assignments
        .iter()
        .map(|a| a.job)
        .chain(plan.launches.iter().map(|l| l.for_job))
        .chain(plan.holds.iter().map(|h| h.job))
    {
        *decided.entry(id).or_default() += 1;
    }
    for (id, e) in &plan.explanations {
        prop_assert_eq!(e.job, *id);
        prop_assert_eq!(e.at, NOW);
        prop_assert!(e.candidates.len() <= MAX_EXPLAINED_CANDIDATES);
        let winners = e.candidates.iter().filter(|c| c.rejected.is_none()).count();
        let listed = decided.get(id).copied().unwrap_or(0);
        match &e.outcome {
            Outcome::Hold { .. } => prop_assert_eq!((winners, listed), (0, 1)),
            Outcome::Wait { pool, .. } => {
                prop_assert_eq!((winners, listed), (1, 0));
                prop_assert_eq!(&e.candidates[0].pool, pool);
                allowed(pools[pool], &jobs[id].spec)?;
            }
            Outcome::Assigned { pool, .. } | Outcome::Launch { pool, .. } => {
                prop_assert_eq!((winners, listed), (1, 1));
                prop_assert_eq!(&e.candidates[0].pool, pool);
            }
        }
        if winners == 1 {
            prop_assert!(e.candidates[0].rejected.is_none(), "winner not first");
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn plans_are_safe(snap in arb_snapshot()) {
        let plan = plan(&snap, NOW);
        check_safety(&snap, &plan)?;
    }

    #[test]
    fn plans_ignore_input_order(snap in arb_snapshot(), seed in any::<u64>()) {
        let expected = plan(&snap, NOW);
        let mut shuffled = snap.clone();
        let mut seed = seed;
        shuffle(&mut shuffled.regions, &mut seed);
        shuffle(&mut shuffled.pools, &mut seed);
        shuffle(&mut shuffled.nodes, &mut seed);
        shuffle(&mut shuffled.queued, &mut seed);
        shuffle(&mut shuffled.running, &mut seed);
        prop_assert_eq!(plan(&shuffled, NOW), expected);
    }
}

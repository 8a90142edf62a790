//! Safety properties of `plan` over random snapshots (Nomad-style): never over a node's free
//! GPUs (plus what the plan preempts there, and only `low` work is preempted, only for `high`
//! or `critical` jobs), never a pool, region, model or latency the job forbids, never a provider,
//! region or price its team's policies forbid, never over a policy's budget, never an unhealthy
//! or draining node, never past a pool's node limit or with bursting off; gangs all or nothing
//! in one pool; every queued job explained exactly once and decided exactly once; the same plan
//! whatever the order of the input vectors, and for the same input.
//!
//! Deadlines: a lone job (nothing to contend with) that fits a usable node's free GPUs in a pool
//! it may use, where starting now meets its deadline on demand, gets a plan that meets it.

use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use switchyard_core::placement::{self, MAX_EXPLAINED_CANDIDATES, hard_constraint};
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
            marginal_per_hour: None,
        }
    }
}

prop_compose! {
    fn arb_node()(pool in any::<prop::sample::Index>(), free in any::<prop::sample::Index>(),
                  healthy in prop::bool::weighted(0.85), draining in prop::bool::weighted(0.1),
                  spot in prop::bool::weighted(0.3))
                  -> (prop::sample::Index, prop::sample::Index, bool, bool, bool) {
        (pool, free, healthy, draining, spot)
    }
}

prop_compose! {
    fn arb_attempt()(node in any::<prop::sample::Index>(), gpus in 1u32..5,
                     end in prop::option::weighted(0.9, -3_600i64..36_000),
                     low in any::<bool>(), started in 0i64..3)
                     -> (prop::sample::Index, u32, Option<i64>, bool, i64) {
        (node, gpus, end, low, started)
    }
}

prop_compose! {
    fn arb_policy()(
        team in prop::sample::select(vec!["team", "other"]),
        project in prop::option::weighted(0.3, Just("x")),
        providers in prop::option::weighted(0.3, prop::sample::subsequence(vec!["onprem", "aws", "gcp"], 1..=2)),
        regions in prop::option::weighted(0.3, prop::sample::subsequence(REGIONS.to_vec(), 1..=3)),
        max_gpu in prop::option::weighted(0.3, 1i64..30),
        spot in prop::sample::select(vec![SpotRule::Never, SpotRule::Allowed, SpotRule::Preferred]),
        burst_allowed in prop::bool::weighted(0.7),
        budget in prop::option::weighted(0.5, 0i64..400),
        ceiling in prop::option::weighted(0.2, prop::sample::select(vec![Priority::Low, Priority::Normal])),
    ) -> TeamPolicy {
        TeamPolicy {
            project: project.map(String::from),
            allowed_providers: providers.unwrap_or_default().into_iter().map(String::from).collect(),
            allowed_regions: regions.unwrap_or_default().into_iter().map(RegionId::new).collect(),
            max_price_per_gpu_hour: max_gpu.map(|d| Money::from_micros(d * 1_000_000)),
            spot,
            burst_allowed,
            remaining_budget: budget.map(|d| Money::from_micros(d * 1_000_000)),
            priority_ceiling: ceiling,
            ..TeamPolicy::new(team)
        }
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
 expected_gpu_utilization_pct: None,
            name: "job".into(),
            team: "team".into(),
            project: None,
            command: vec!["true".into()],
            env: BTreeMap::new(),
            resources: Resources {
                gpus,
                gpu_models: models.unwrap_or_default().into_iter().map(String::from).collect(),
                accelerator: None,
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
            callers: Vec::new(),
        }
    }
}

/// Every GPU index a node may have.
fn all_gpus() -> GpuSet {
    GpuSet::first(MAX_GPUS_PER_NODE).expect("64")
}

/// The top `free` of a node's `total` GPUs (the lowest are held).
fn top_gpus(total: u32, free: u32) -> GpuSet {
    let all = GpuSet::first(total.max(free)).expect("at most 64 GPUs");
    all.difference(all.lowest(total.saturating_sub(free)))
}

fn arb_snapshot() -> impl Strategy<Value = Snapshot> {
    (
        prop::collection::vec((0i64..20, 1u32..200, 0u32..100), REGIONS.len() - 1),
        prop::collection::vec(arb_pool(), 0..10),
        prop::collection::vec(arb_node(), 0..20),
        prop::collection::vec(arb_attempt(), 0..20),
        prop::collection::vec((arb_spec(), 0i64..600, 0i64..3), 0..14),
        any::<bool>(),
        prop::collection::vec(arb_policy(), 0..3),
    )
        .prop_map(
            |(regions, pools, nodes, attempts, jobs, burst_enabled, policies)| {
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
                        .map(|(i, (pool, free, healthy, draining, spot))| {
                            let pool = pool.get(&pools);
                            // Spot nodes are bought where spot is sold.
                            let spot = spot && pool.launchable && pool.spot_per_hour.is_some();
                            Node {
                                id: NodeId::new(format!("n{i:02}")),
                                pool: pool.id.clone(),
                                gpus_total: pool.gpus_per_node,
                                free_gpus: top_gpus(
                                    pool.gpus_per_node,
                                    free.index(pool.gpus_per_node as usize + 1) as u32,
                                ),
                                healthy,
                                draining,
                                last_heartbeat: NOW,
                                market: if spot { Market::Spot } else { Market::OnDemand },
                            }
                        })
                        .collect()
                };
                // Each attempt holds GPUs no other attempt and no free GPU of its node is: the
                // lowest left (past the node's total if its attempts add up to more).
                let mut held: HashMap<NodeId, GpuSet> =
                    nodes.iter().map(|n| (n.id.clone(), n.free_gpus)).collect();
                let running = attempts
                    .into_iter()
                    .enumerate()
                    .map(|(i, (node, gpus, end, low, started))| {
                        // An attempt on a node the snapshot lacks is possible and ignored.
                        let node = if nodes.is_empty() {
                            NodeId::new("gone")
                        } else {
                            node.get(&nodes).id.clone()
                        };
                        let taken = held.entry(node.clone()).or_default();
                        let gpus = all_gpus().difference(*taken).lowest(gpus);
                        *taken = taken.union(gpus);
                        (i, node, gpus, end, low, started)
                    })
                    .map(|(i, node, gpus, end, low, started)| RunningAttempt {
                        job: JobId(Uuid::from_u128(1_000 + i as u128)),
                        attempt: AttemptId(Uuid::from_u128(1_000 + i as u128)),
                        node,
                        gpus,
                        priority: if low { Priority::Low } else { Priority::Normal },
                        started_at: NOW.plus_secs(-started),
                        expected_end: end.map_or(Timestamp::MAX, |e| NOW.plus_secs(e)),
                    })
                    .collect();
                let queued = jobs
                    .into_iter()
                    .enumerate()
                    .map(|(i, (spec, submitted_ago, team))| QueuedJob {
                        id: JobId(Uuid::from_u128(i as u128 + 1)),
                        spec: JobSpec {
                            team: if team == 1 { "other" } else { "team" }.into(),
                            project: (team == 2).then(|| "x".into()),
                            ..spec
                        },
                        // Few distinct values, so later tie-breaks are exercised.
                        submitted_at: NOW.plus_secs(-(submitted_ago % 3)),
                        deadline_runtime_s: None,
                    })
                    .collect();
                Snapshot {
                    regions,
                    pools,
                    nodes,
                    queued,
                    running,
                    burst_enabled,
                    policies,
                    ..Snapshot::default()
                }
            },
        )
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
        for p in snap
            .policies
            .iter()
            .filter(|p| p.applies_to(&spec.team, spec.project.as_deref()))
        {
            prop_assert!(
                p.allowed_providers.is_empty() || p.allowed_providers.contains(&pool.provider)
            );
            prop_assert!(p.allowed_regions.is_empty() || p.allowed_regions.contains(&pool.region));
        }
        Ok(())
    };
    let covering = |spec: &JobSpec| -> Vec<&TeamPolicy> {
        snap.policies
            .iter()
            .filter(|p| p.applies_to(&spec.team, spec.project.as_deref()))
            .collect()
    };
    let gpu_price = |pool: &Pool, market: Market| match market {
        Market::Spot => pool
            .spot_per_gpu_hour()
            .unwrap_or(pool.on_demand_per_gpu_hour()),
        Market::OnDemand => pool.on_demand_per_gpu_hour(),
    };

    // Preemptions: only for urgent jobs; only low work, or normal batch work for an urgent
    // service; each victim once.
    let attempts: HashMap<AttemptId, &RunningAttempt> =
        snap.running.iter().map(|a| (a.attempt, a)).collect();
    let mut freed: HashMap<&NodeId, GpuSet> = HashMap::new();
    let mut victims = BTreeSet::new();
    for p in &plan.preemptions {
        let a = attempts
            .get(&p.attempt)
            .ok_or_else(|| TestCaseError::fail("unknown victim"))?;
        let job = jobs[&p.for_job];
        let normal_batch = a.priority == Priority::Normal && a.expected_end != Timestamp::MAX;
        prop_assert!(
            a.priority == Priority::Low
                || (normal_batch && job.spec.kind == switchyard_core::JobKind::Service),
            "{:?} work stopped for a {:?} job",
            a.priority,
            job.spec.kind
        );
        prop_assert_eq!(&a.node, &p.node);
        prop_assert!(victims.insert(p.attempt), "preempted twice");
        prop_assert!(job.spec.priority >= Priority::High);
        let f = freed.entry(&a.node).or_default();
        *f = f.union(a.gpus);
    }

    // Budgets: what the plan commits (assignments and launches, each job once) never exceeds
    // a covering policy's remaining budget.
    let mut spent: HashMap<JobId, Money> = HashMap::new();
    for a in &plan.assignments {
        spent.insert(a.job, a.estimated_cost);
    }
    for l in &plan.launches {
        let e = plan.explanation(&l.for_job).expect("explained");
        spent.insert(l.for_job, e.candidates[0].cost);
    }
    for p in &snap.policies {
        if let Some(budget) = p.remaining_budget {
            let total = spent
                .iter()
                .filter(|(id, _)| {
                    p.applies_to(&jobs[*id].spec.team, jobs[*id].spec.project.as_deref())
                })
                .fold(Money::ZERO, |acc, (_, c)| acc + *c);
            prop_assert!(total <= budget, "{} over budget {}", total, budget);
        }
    }

    // GPUs: each assignment's are as many as its job asks for, free on the node or freed by
    // the plan's preemptions there, and no other assignment's.
    let mut used: HashMap<&NodeId, GpuSet> = HashMap::new();
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
        prop_assert_eq!(a.gpus.len(), job.spec.resources.gpus);
        let room = node
            .free_gpus
            .union(freed.get(&a.node).copied().unwrap_or_default());
        prop_assert!(
            a.gpus.is_subset(room),
            "{:?} on {} not free: {:?}",
            a.gpus,
            node.id,
            room
        );
        let taken = used.entry(&a.node).or_default();
        prop_assert!(
            a.gpus.is_disjoint(*taken),
            "{:?} on {} given twice",
            a.gpus,
            node.id
        );
        *taken = taken.union(a.gpus);
        allowed(pool, &job.spec)?;
        let policies = covering(&job.spec);
        // A spot node takes only jobs that allow spot; an on-demand node is paid on demand.
        let spot_ok =
            job.spec.spot != SpotRule::Never && policies.iter().all(|p| p.spot != SpotRule::Never);
        if node.market == Market::Spot {
            prop_assert!(
                spot_ok,
                "job {} never takes spot, on spot node {}",
                a.job,
                node.id
            );
        } else {
            prop_assert_eq!(a.market, Market::OnDemand, "on-demand node {}", &node.id);
        }
        if a.market == Market::Spot {
            prop_assert!(spot_ok && pool.spot_per_hour.is_some());
        }
        for p in &policies {
            if let Some(max) = p.max_price_per_gpu_hour {
                prop_assert!(gpu_price(pool, a.market) <= max);
            }
        }
        if let Some(max) = job.spec.max_price_per_hour {
            let price = gpu_price(pool, a.market).saturating_mul(i64::from(a.gpus.len().max(1)));
            prop_assert!(price <= max, "{} over the job's {}", price, max);
        }
    }
    // Gangs: one assignment per node, ranks 0..n, distinct nodes, one pool; or none.
    let mut gangs: BTreeMap<JobId, Vec<&Assignment>> = BTreeMap::new();
    for a in &plan.assignments {
        gangs.entry(a.job).or_default().push(a);
    }
    for (id, parts) in &gangs {
        let n = jobs[id].spec.resources.nodes.max(1) as usize;
        prop_assert_eq!(parts.len(), n);
        let ranks: BTreeSet<u32> = parts.iter().map(|a| a.rank).collect();
        prop_assert_eq!(ranks, (0..n as u32).collect::<BTreeSet<_>>());
        let distinct: BTreeSet<&NodeId> = parts.iter().map(|a| &a.node).collect();
        prop_assert_eq!(distinct.len(), n);
        prop_assert!(parts.iter().all(|a| a.pool == parts[0].pool));
    }

    let mut launched: HashMap<&PoolId, u32> = HashMap::new();
    for l in &plan.launches {
        let job = jobs
            .get(&l.for_job)
            .ok_or_else(|| TestCaseError::fail("unknown job"))?;
        let pool = pools[&l.pool];
        prop_assert!(snap.burst_enabled && pool.launchable);
        prop_assert!(covering(&job.spec).iter().all(|p| p.burst_allowed));
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
    let mut launched_for: HashMap<JobId, usize> = HashMap::new();
    for l in &plan.launches {
        *launched_for.entry(l.for_job).or_default() += 1;
    }
    for (id, n) in &launched_for {
        prop_assert_eq!(*n, jobs[id].spec.resources.nodes.max(1) as usize);
    }
    for id in gangs
        .keys()
        .copied()
        .chain(launched_for.keys().copied())
        .chain(plan.holds.iter().map(|h| h.job))
    {
        *decided.entry(id).or_default() += 1;
    }
    for (id, outcome_only) in &plan.explanations {
        prop_assert!(outcome_only.candidates.is_empty());
        let e = plan.explanation(id).expect("explained");
        prop_assert_eq!(&e.outcome, &outcome_only.outcome);
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
    fn same_input_same_plan(snap in arb_snapshot()) {
        prop_assert_eq!(plan(&snap, NOW), plan(&snap.clone(), NOW));
    }

}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, max_global_rejects: 100_000, ..ProptestConfig::default() })]

    #[test]
    fn a_lone_job_that_fits_free_capacity_meets_its_deadline(snap in arb_snapshot(), runtime in 0i64..36_000, slack in 0i64..36_000) {
        let mut snap = snap;
        snap.queued.truncate(1);
        prop_assume!(!snap.queued.is_empty());
        let spec = &mut snap.queued[0].spec;
        spec.resources.nodes = 1;
        spec.data = None;
        spec.estimated_runtime_s = Some(runtime);
        let margin = (60_000i64).max(runtime * 50);
        spec.deadline = Some(NOW.plus_secs(runtime).plus_millis(margin).plus_secs(slack));
        let spec = snap.queued[0].spec.clone();
        let regions: HashMap<&RegionId, &Region> = snap.regions.iter().map(|r| (&r.id, r)).collect();
        let covering: Vec<&TeamPolicy> = snap.policies.iter().filter(|p| p.applies_to(&spec.team, spec.project.as_deref())).collect();
        let fits = snap.pools.iter().any(|pool| {
            let latency_ok = spec.kind == JobKind::Batch || spec.max_latency_ms.is_none_or(|max| regions.get(&pool.region).is_some_and(|r| r.latency_ms <= max));
            let price_ok = spec.max_price_per_hour.is_none_or(|max| pool.on_demand_per_gpu_hour().saturating_mul(i64::from(spec.resources.gpus.max(1))) <= max);
            let policy_ok = covering.iter().all(|p| {
                (p.allowed_providers.is_empty() || p.allowed_providers.contains(&pool.provider))
                    && (p.allowed_regions.is_empty() || p.allowed_regions.contains(&pool.region))
                    && p.max_price_per_gpu_hour.is_none_or(|m| pool.on_demand_per_gpu_hour() <= m)
                    && p.remaining_budget.is_none()
                    && p.windows.is_empty()
            });
            hard_constraint(pool, &spec).is_none() && latency_ok && price_ok && policy_ok
                && snap.nodes.iter().any(|n| n.pool == pool.id && n.healthy && !n.draining && n.gpus_free() >= spec.resources.gpus && n.market == Market::OnDemand)
        });
        prop_assume!(fits);
        let p = plan(&snap, NOW);
        let e = p.explanation(&snap.queued[0].id).expect("explained");
        let winner = e.candidates.first().filter(|c| c.rejected.is_none());
        prop_assert!(winner.is_some(), "{:?}", e);
        let finish = winner.map_or(Timestamp::MAX, |c| c.finish);
        prop_assert!(finish.plus_millis(margin) <= spec.deadline.unwrap_or(Timestamp::MAX), "{:?}", e);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

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
        shuffle(&mut shuffled.policies, &mut seed);
        prop_assert_eq!(plan(&shuffled, NOW), expected);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// A plan without candidate lists decides exactly as a full one.
    #[test]
    fn outcome_only_plans_decide_as_full_ones(snap in arb_snapshot()) {
        let full = plan(&snap, NOW);
        let lean = placement::plan_with(&snap, NOW, placement::Detail::Outcomes);
        let public = |p: &Plan| (p.assignments.clone(), p.launches.clone(), p.holds.clone(), p.explanations.clone(), p.preemptions.clone());
        prop_assert_eq!(public(&lean), public(&full));
        for id in lean.explanations.keys() {
            prop_assert!(lean.explanation(id).expect("explained").candidates.is_empty());
        }
    }

    /// Waiting jobs reserve what they wait for: on a lone node that nothing can be launched
    /// beside, the waits the plan expects and the running work never need more GPUs at once
    /// than the node has (running work holds its GPUs until its expected end; overdue work a
    /// minute more).
    #[test]
    fn waiting_jobs_never_count_on_the_same_gpus(
        busy in prop::collection::vec((1u32..5, -600i64..20_000), 0..6),
        jobs in prop::collection::vec((1u32..9, 0i64..20_000), 1..12),
        free in 0u32..3,
    ) {
        let (onprem, total) = ("onprem:dc1", 8u32);
        let held: u32 = busy.iter().map(|&(g, _)| g).sum::<u32>().min(total - free);
        let pool = Pool {
            id: PoolId::new("onprem:dc1/n8"),
            region: RegionId::new(onprem),
            provider: "onprem".into(),
            instance_type: String::new(),
            gpu_model: "H100".into(),
            gpus_per_node: total,
            gpu_memory_gb: 80,
            vcpus: 0,
            memory_gb: 0,
            on_demand_per_hour: Money::from_micros(8_000_000),
            spot_per_hour: None,
            node_limit: 1,
            launchable: false,
            boot_time_s: 0,
            price_updated_at: NOW,
            recent_capacity_failures: 0,
            marginal_per_hour: None,
        };
        let node = Node {
            id: NodeId::new("n1"),
            pool: pool.id.clone(),
            gpus_total: total,
            free_gpus: top_gpus(total, total - held),
            healthy: true,
            draining: false,
            last_heartbeat: NOW,
            market: Market::OnDemand,
        };
        // Running work that adds up to what is held (the last attempt takes the rest).
        let mut left = held;
        let mut running = Vec::new();
        let mut taken = node.free_gpus;
        for (i, &(g, end)) in busy.iter().enumerate() {
            let g = if i + 1 == busy.len() { left } else { g.min(left) };
            if g == 0 {
                continue;
            }
            left -= g;
            let gpus = all_gpus().difference(taken).lowest(g);
            taken = taken.union(gpus);
            running.push(RunningAttempt {
                job: JobId(Uuid::from_u128(1_000 + i as u128)),
                attempt: AttemptId(Uuid::from_u128(1_000 + i as u128)),
                node: node.id.clone(),
                gpus,
                priority: Priority::Normal,
                started_at: NOW,
                expected_end: NOW.plus_secs(end),
            });
        }
        prop_assume!(left == 0);
        let queued: Vec<QueuedJob> = jobs
            .iter()
            .enumerate()
            .map(|(i, &(gpus, runtime))| QueuedJob {
                id: JobId(Uuid::from_u128(i as u128 + 1)),
                spec: JobSpec {
 expected_gpu_utilization_pct: None,
                    name: "j".into(),
                    team: "team".into(),
                    project: None,
                    command: vec![],
                    env: BTreeMap::new(),
                    resources: Resources { gpus, gpu_models: vec![], accelerator: None, min_gpu_memory_gb: 0, cpus: 0, memory_gb: 0, nodes: 1 },
                    estimated_runtime_s: Some(runtime),
                    deadline: None,
                    priority: Priority::Normal,
                    spot: SpotRule::Never,
                    max_price_per_hour: None,
                    regions: vec![],
                    data: None,
                    kind: JobKind::Batch,
                    max_latency_ms: None,
                    callers: Vec::new(),
                },
                submitted_at: NOW,
                deadline_runtime_s: None,
            })
            .collect();
        let snap = Snapshot { pools: vec![pool], nodes: vec![node], queued: queued.clone(), running: running.clone(), ..Snapshot::default() };
        let p = plan(&snap, NOW);
        // Intervals of GPU use: running work, jobs assigned now, jobs expected to start later.
        let mut uses: Vec<(i64, i64, u32)> = running
            .iter()
            .map(|a| {
                let end = a.expected_end.millis() - NOW.millis();
                (0, if end <= 0 { 60_000 } else { end }, a.gpus.len())
            })
            .collect();
        for j in &queued {
            let runtime_ms = j.spec.runtime_s() * 1000;
            match &p.explanations[&j.id].outcome {
                // Jobs that start now may use GPUs a waiting job counts on (the next round
                // sees it): they are not part of the promise.
                Outcome::Assigned { .. } => {}
                Outcome::Wait { expected_start, .. } => {
                    let s = expected_start.millis() - NOW.millis();
                    uses.push((s, s + runtime_ms, j.spec.resources.gpus));
                }
                other => prop_assert!(false, "{other:?}"),
            }
        }
        for &(at, _, _) in &uses {
            let in_use: u32 = uses.iter().filter(|&&(s, e, _)| s <= at && at < e).map(|&(_, _, g)| g).sum();
            prop_assert!(in_use <= total, "{in_use} GPUs in use at +{at} ms: {uses:?} {:?}", p.explanations.keys().map(|id| p.explanation(id).map(|e| (e.outcome, e.candidates.first().cloned()))).collect::<Vec<_>>());
        }
    }
}

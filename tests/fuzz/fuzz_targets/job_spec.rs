//! A user's job submission, as `POST /api/v1/jobs` handles it: the bytes through the broker's
//! JSON reader (`json::parse`, what `ApiJson` runs), the spec through `convert::job_spec` (the
//! 400/422 checks that need no database), then the catalogue check (`check_satisfiable`), the
//! policy check (`policy::check_submit`), storage as JSON and reading back (`job_view`, the
//! store's `core_spec_json`), and one planning round with the job queued.
//!
//! Asserts: nothing panics; every refusal is a 400 or 422 naming the field; an accepted spec
//! is well formed (every rule `convert::job_spec` states holds of what it returns); what the
//! broker stores reads back equal, and validating it again gives the same job; the plan only
//! places the job on capacity that exists.

#![no_main]

use libfuzzer_sys::fuzz_target;
use switchyard_broker::rules::convert;
use switchyard_broker::http::error::ApiError;
use switchyard_broker::http::json;
use switchyard_broker::store::JobRecord;
use switchyard_core::{
    self as core, GpuSet, JobId, JobState, Market, Money, Node, NodeId, Pool, PoolId, QueuedJob,
    Region, RegionId, Snapshot, TeamPolicy, Timestamp,
};
use switchyard_protocol::api as wire;

/// 2026-01-01T00:00:00Z: deadlines before it are in the past.
const NOW: Timestamp = Timestamp(1_767_225_600_000);

fn region(id: &str, provider: &str) -> Region {
    Region {
        id: RegionId(id.into()),
        provider: provider.into(),
        code: id.split_once(':').map_or("", |(_, c)| c).into(),
        latitude: None,
        longitude: None,
        egress_per_gb: Money::from_dollars(0.09).unwrap_or(Money::ZERO),
        latency_ms: 20,
        ingress_gbps: 10,
    }
}

#[allow(clippy::too_many_arguments)]
fn pool(
    id: &str,
    region: &str,
    provider: &str,
    model: &str,
    gpus: u32,
    per_hour: f64,
    spot: Option<f64>,
    launchable: bool,
) -> Pool {
    Pool {
        id: PoolId(id.into()),
        region: RegionId(region.into()),
        provider: provider.into(),
        instance_type: format!("{model}x{gpus}"),
        gpu_model: model.into(),
        gpus_per_node: gpus,
        gpu_memory_gb: 80,
        vcpus: 96,
        memory_gb: 1024,
        on_demand_per_hour: Money::from_dollars(per_hour).unwrap_or(Money::ZERO),
        spot_per_hour: spot.and_then(Money::from_dollars),
        node_limit: 4,
        launchable,
        boot_time_s: 180,
        price_updated_at: NOW,
        recent_capacity_failures: 0,
        marginal_per_hour: None,
    }
}

fn world() -> (Vec<Region>, Vec<Pool>, Vec<Node>) {
    let regions = vec![
        region("onprem:dc1", "onprem"),
        region("aws:us-east-1", "aws"),
        region("gcp:europe-west4", "gcp"),
    ];
    let pools = vec![
        pool(
            "onprem-h100",
            "onprem:dc1",
            "onprem",
            "H100",
            4,
            8.0,
            None,
            false,
        ),
        pool(
            "aws-a100",
            "aws:us-east-1",
            "aws",
            "A100-80GB",
            8,
            32.77,
            Some(12.0),
            true,
        ),
        pool(
            "gcp-l4",
            "gcp:europe-west4",
            "gcp",
            "L4",
            1,
            0.7,
            Some(0.2),
            true,
        ),
    ];
    let nodes = vec![
        Node {
            id: NodeId("dc1-a".into()),
            pool: PoolId("onprem-h100".into()),
            gpus_total: 4,
            // GPU 0 busy.
            free_gpus: GpuSet::from_indexes([1, 2, 3]).expect("< 64"),
            healthy: true,
            draining: false,
            last_heartbeat: NOW,
            market: Market::OnDemand,
        },
        // A spot instance: only jobs that allow spot may run there.
        Node {
            id: NodeId("gcp-l4-s1".into()),
            pool: PoolId("gcp-l4".into()),
            gpus_total: 1,
            free_gpus: GpuSet::first(1).expect("< 64"),
            healthy: true,
            draining: false,
            last_heartbeat: NOW,
            market: Market::Spot,
        },
    ];
    (regions, pools, nodes)
}

fn policies() -> Vec<TeamPolicy> {
    let base = TeamPolicy {
        team: "ml".into(),
        project: None,
        allowed_providers: vec!["onprem".into(), "aws".into()],
        allowed_regions: Vec::new(),
        max_price_per_gpu_hour: Money::from_dollars(5.0),
        spot: core::SpotRule::Preferred,
        burst_allowed: true,
        windows: Vec::new(),
        priority_ceiling: Some(core::Priority::High),
        remaining_budget: Money::from_dollars(100.0),
        objective: core::Objective::Company,
    };
    let project = TeamPolicy {
        project: Some("p".into()),
        allowed_providers: vec!["gcp".into()],
        spot: core::SpotRule::Never,
        ..base.clone()
    };
    vec![base, project]
}

fn slug_ok(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// Every rule `convert::job_spec` states, checked on what it accepted.
fn assert_well_formed(wire: &wire::JobSpec, spec: &core::JobSpec) {
    // At most 128 characters (not bytes), every one printable (issue 23's bound).
    assert!(
        !spec.name.is_empty()
            && spec.name.chars().count() <= 128
            && spec.name.chars().all(switchyard_broker::rules::convert::printable),
        "name {:?}",
        spec.name
    );
    assert_eq!(spec.name, spec.name.trim());
    assert!(slug_ok(&spec.team), "team {:?}", spec.team);
    assert!(spec.project.as_deref().is_none_or(slug_ok));
    assert!(!spec.command.is_empty() && spec.command.len() <= 1024);
    assert!(!spec.command[0].trim().is_empty());
    assert!(spec.command.iter().all(|a| !a.contains('\0')));
    assert!(spec.env.len() <= 256);
    for (k, v) in &spec.env {
        assert!(
            !k.is_empty() && !k.starts_with(|c: char| c.is_ascii_digit()),
            "{k:?}"
        );
        assert!(
            k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'),
            "{k:?}"
        );
        assert_ne!(k, "CUDA_VISIBLE_DEVICES");
        assert!(!switchyard_broker::rules::gang::ENV.contains(&k.as_str()), "{k:?}");
        assert!(!v.contains('\0'));
    }
    let r = &spec.resources;
    assert!((1..=64).contains(&r.gpus));
    assert_eq!(i64::from(r.gpus), wire.resources.gpus);
    // A multi-node job: 1 to 256 nodes, as asked (one when not asked).
    assert!((1..=256).contains(&r.nodes), "nodes {}", r.nodes);
    assert_eq!(i64::from(r.nodes), wire.resources.nodes.unwrap_or(1));
    assert!(r.gpu_models.iter().all(|m| !m.is_empty() && m == m.trim()));
    assert!(spec.estimated_runtime_s.is_none_or(|s| s > 0));
    assert!(spec.deadline.is_none_or(|d| d > NOW));
    assert!(spec.max_price_per_hour.is_none_or(|m| m.micros() > 0));
    assert!(spec.regions.iter().all(|r| {
        r.as_str()
            .split_once(':')
            .is_some_and(|(p, c)| !p.is_empty() && !c.is_empty())
    }));
    assert!(
        spec.data
            .as_ref()
            .is_none_or(|d| d.region.as_str().contains(':'))
    );
    assert!(spec.max_latency_ms.is_none() || spec.kind == core::JobKind::Service);
}

fuzz_target!(|data: &[u8]| {
    let spec: wire::JobSpec = match json::parse(data) {
        Ok(spec) => spec,
        Err(e) => {
            assert!(matches!(e, ApiError::BadRequest { .. }), "{e:?}");
            return;
        }
    };
    let core_spec = match convert::job_spec(&spec, NOW) {
        Ok(s) => s,
        Err(ApiError::BadRequest { field, .. }) | Err(ApiError::Unprocessable { field, .. }) => {
            assert!(field.is_some_and(|f| !f.is_empty()));
            return;
        }
        Err(other) => panic!("validation answered neither 400 nor 422: {other:?}"),
    };
    assert_well_formed(&spec, &core_spec);

    // What the submit handler stores, read back the way the API and the store read it.
    let spec_json = serde_json::to_string(&spec).expect("a spec serialises");
    let again: wire::JobSpec =
        serde_json::from_str(&spec_json).expect("the stored spec reads back");
    // serde_json (without its `float_roundtrip` feature) may read a float back one ulp off
    // (found by this target: 120.528666666666666666666 is stored as 120.52866666666668 and
    // read back as 120.52866666666667). The broker works in micro-dollars: compare those.
    let price = |s: &wire::JobSpec| s.max_price_per_hour.and_then(Money::from_dollars);
    assert_eq!(
        price(&again),
        price(&spec),
        "the stored price reads back different"
    );
    // The same for the declared GPU utilisation: the core spec (compared below) holds it as a
    // whole percentage.
    let exact = |s: &wire::JobSpec| wire::JobSpec {
        max_price_per_hour: None,
        expected_gpu_utilization: None,
        ..s.clone()
    };
    assert_eq!(
        exact(&again),
        exact(&spec),
        "the stored spec reads back different"
    );
    let core_json = serde_json::to_string(&core_spec).expect("a core spec serialises");
    let core_again: core::JobSpec =
        serde_json::from_str(&core_json).expect("core_spec_json reads back");
    assert_eq!(core_again, core_spec);
    assert_eq!(convert::job_spec(&again, NOW).ok(), Some(core_spec.clone()));
    let record = JobRecord {
        id: JobId(uuid::Uuid::from_u128(7)),
        spec: core_spec.clone(),
        spec_json,
        state: JobState::Queued,
        submitted_at: NOW,
        started_at: None,
        finished_at: None,
        exit_code: None,
        reason: None,
        cancel_requested: false,
        attempts: 0,
        version: 0,
        explanation_json: None,
        placement: None,
        cost: Money::ZERO,
    };
    let view = convert::job_view(&record).expect("a stored job has a view");
    assert_eq!(exact(&view.spec), exact(&spec));
    serde_json::to_vec(&view).expect("a view serialises");

    let (regions, pools, nodes) = world();
    if let Err(u) = core::check_satisfiable(&pools, &core_spec) {
        assert!(!u.field.is_empty() && !u.message.is_empty());
        return;
    }
    let policies = policies();
    if let Err(e) = switchyard_broker::rules::policy::check_submit(&policies, &pools, &core_spec) {
        assert!(matches!(e, ApiError::PolicyViolation { .. }), "{e:?}");
        return;
    }

    // One planning round with the job queued, as the scheduler runs it.
    let snapshot = Snapshot {
        regions,
        pools,
        nodes,
        queued: vec![QueuedJob {
            id: record.id,
            spec: core_spec.clone(),
            submitted_at: NOW,
            deadline_runtime_s: None,
        }],
        running: Vec::new(),
        burst_enabled: true,
        policies,
        spot_interruptions_per_hour_ppm: Default::default(),
        avoid: Default::default(),
        reserve_free_below_one_in: None,
    };
    let plan = core::plan(&snapshot, NOW);
    assert!(plan.assignments.len() <= 1);
    for a in &plan.assignments {
        assert_eq!(a.job, record.id);
        if a.node == NodeId("gcp-l4-s1".into()) {
            // The spot instance runs only a job that allows spot, after its team's policies.
            let covering = snapshot
                .policies
                .iter()
                .filter(|p| p.applies_to(&core_spec.team, core_spec.project.as_deref()));
            let never = core_spec.spot == core::SpotRule::Never
                || covering
                    .into_iter()
                    .any(|p| p.spot == core::SpotRule::Never);
            assert!(!never && a.market == Market::Spot, "{a:?}");
            assert!(
                a.gpus.len() == core_spec.resources.gpus && a.gpus.to_vec() == [0],
                "{a:?}"
            );
        } else {
            assert_eq!(a.node, NodeId("dc1-a".into()));
            // The free GPUs, lowest first: never GPU 0, which is busy.
            let free = GpuSet::from_indexes([1, 2, 3]).expect("< 64");
            assert!(a.gpus.len() == core_spec.resources.gpus && a.gpus == free.lowest(a.gpus.len()), "{a:?}");
        }
    }
    let explanation = plan
        .explanations
        .get(&record.id)
        .expect("the job is explained");
    serde_json::to_string(explanation).expect("an explanation serialises");
    convert::explanation_view(explanation);
    let _ = NOW.plus_secs(core_spec.runtime_s());
});

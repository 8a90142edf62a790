//! Rows to records, and the text forms of enums in columns: one reading for both databases.

use super::{Row, corrupt};
use crate::store::*;
use switchyard_core::{
    AttemptId, JobId, JobSpec, JobState, Market, Money, NodeId, Pool, PoolId, Priority, Region,
    RegionId,
};
use switchyard_protocol::agent::{AttemptRef, EventResult, EventStatus, Stream};
use switchyard_protocol::api::Role;

pub(crate) fn leader_of_row(r: &Row) -> StoreResult<LeaderRecord> {
    Ok(LeaderRecord {
        holder: r.get("holder")?,
        holder_instance: r.uuid("holder_instance")?,
        epoch: r.get("epoch")?,
        acquired_at: r.time("acquired_at")?,
        expires_at: r.time("expires_at")?,
    })
}

pub(crate) fn region_from_row(r: &Row) -> StoreResult<Region> {
    Ok(Region {
        id: RegionId(r.get("id")?),
        provider: r.get("provider")?,
        code: r.get("code")?,
        latitude: r.get("latitude")?,
        longitude: r.get("longitude")?,
        egress_per_gb: Money(r.get("egress_per_gb_micros")?),
        latency_ms: r.u32("latency_ms")?,
        ingress_gbps: r.u32("ingress_gbps")?,
    })
}

pub(crate) fn pool_from_row(r: &Row) -> StoreResult<Pool> {
    Ok(Pool {
        id: PoolId(r.get("id")?),
        region: RegionId(r.get("region_id")?),
        provider: r.get("provider")?,
        instance_type: r.get("instance_type")?,
        gpu_model: r.get("gpu_model")?,
        gpus_per_node: r.u32("gpus_per_node")?,
        gpu_memory_gb: r.u32("gpu_memory_gb")?,
        vcpus: r.u32("vcpus")?,
        memory_gb: r.u32("memory_gb")?,
        on_demand_per_hour: Money(r.get("on_demand_micros")?),
        spot_per_hour: r.get::<Option<i64>>("spot_micros")?.map(Money),
        node_limit: r.u32("node_limit")?,
        launchable: r.get("launchable")?,
        boot_time_s: r.u32("boot_time_s")?,
        price_updated_at: r.time("price_updated_at")?,
        recent_capacity_failures: r.u32("recent_capacity_failures")?,
        marginal_per_hour: r.get::<Option<i64>>("marginal_micros")?.map(Money),
    })
}

pub(crate) fn node_from_row(r: &Row) -> StoreResult<NodeRecord> {
    Ok(NodeRecord {
        id: NodeId(r.get("id")?),
        pool: PoolId(r.get("pool_id")?),
        hostname: r.get("hostname")?,
        gpus_total: r.u32("gpus_total")?,
        inventory_json: r.get("inventory_json")?,
        healthy: r.get("healthy")?,
        draining: r.get("draining")?,
        revoked: r.get("revoked")?,
        registered_at: r.time("registered_at")?,
        last_heartbeat: r.time("last_heartbeat")?,
        gpu_marks: match r.get::<Option<String>>("gpu_marks_json")? {
            None => Vec::new(),
            Some(json) => {
                serde_json::from_str(&json).map_err(|e| corrupt(format!("node GPU marks: {e}")))?
            }
        },
    })
}

pub(crate) fn token_from_row(
    r: &Row,
    created_at: &str,
    revoked_at: &str,
) -> StoreResult<ApiTokenRecord> {
    Ok(ApiTokenRecord {
        id: r.uuid("id")?,
        token_hash: r.get("token_hash")?,
        role: parse_role(&r.get::<String>("role")?)?,
        team: r.get("team")?,
        name: r.get("name")?,
        created_at: r.time(created_at)?,
        revoked: r.time_opt(revoked_at)?.is_some(),
    })
}

pub(crate) fn job_from_row(r: &Row) -> StoreResult<JobRecord> {
    let placement = match r.uuid_opt("a_id")? {
        None => None,
        Some(a_id) => Some(AttemptPlacement {
            attempt: AttemptId(a_id),
            node: NodeId(r.get("a_node")?),
            pool: PoolId(r.get("a_pool")?),
            region: r.get::<Option<String>>("a_region")?.unwrap_or_default(),
            gpus: parse_gpus(&r.get::<String>("a_gpus")?)?,
            market: parse_market(&r.get::<String>("a_market")?)?,
            ranks: Vec::new(),
        }),
    };
    let exit_code = r
        .get::<Option<i64>>("exit_code")?
        .map(|c| i32::try_from(c).map_err(|_| corrupt(format!("exit code out of range: {c}"))))
        .transpose()?;
    Ok(JobRecord {
        id: JobId(r.uuid("id")?),
        spec: parse_spec(&r.get::<String>("core_spec_json")?)?,
        spec_json: r.get("spec_json")?,
        state: parse_state(&r.get::<String>("state")?)?,
        submitted_at: r.time("submitted_at")?,
        started_at: r.time_opt("started_at")?,
        finished_at: r.time_opt("finished_at")?,
        exit_code,
        reason: r.get("reason")?,
        cancel_requested: r.get("cancel_requested")?,
        attempts: r.u32("attempts")?,
        version: r.get("version")?,
        explanation_json: r.get("explanation_json")?,
        placement,
        cost: Money(r.get::<Option<i64>>("cost_micros")?.unwrap_or(0)),
    })
}

pub(crate) fn policy_from_row(r: &Row) -> StoreResult<PolicyRecord> {
    let project: String = r.get("project_key")?;
    let body_json: String = r.get("body_json")?;
    Ok(PolicyRecord {
        team: r.get("team")?,
        project: (!project.is_empty()).then_some(project),
        version: r.get("version")?,
        body: serde_json::from_str(&body_json)
            .map_err(|e| corrupt(format!("bad policy body: {e}")))?,
        updated_at: r.time("created_at")?,
        updated_by: r.get("created_by")?,
    })
}

pub(crate) fn instance_from_row(r: &Row) -> StoreResult<InstanceRecord> {
    let state: String = r.get("state")?;
    Ok(InstanceRecord {
        id: r.get("id")?,
        provider: r.get("provider")?,
        provider_id: r.get("provider_id")?,
        pool: PoolId(r.get("pool_id")?),
        region: r.get("region_id")?,
        market: parse_market(&r.get::<String>("market")?)?,
        state: InstanceState::parse(&state)
            .ok_or_else(|| corrupt(format!("bad instance state {state:?}")))?,
        hourly_price: Money(r.get("hourly_price_micros")?),
        for_job: r.uuid_opt("for_job")?.map(JobId),
        node: r.get::<Option<String>>("node_id")?.map(NodeId),
        launch_attempts: r.u32("launch_attempts")?,
        next_attempt_at: r.time("next_attempt_at")?,
        last_error: r.get("last_error")?,
        end_reason: r.get("end_reason")?,
        requested_at: r.time("requested_at")?,
        launched_at: r.time_opt("launched_at")?,
        ready_at: r.time_opt("ready_at")?,
        idle_since: r.time_opt("idle_since")?,
        ended_at: r.time_opt("ended_at")?,
    })
}

pub(crate) fn epoch_of(r: &Row) -> StoreResult<u64> {
    let epoch: i64 = r.get("epoch")?;
    u64::try_from(epoch).map_err(|_| corrupt(format!("epoch out of range: {epoch}")))
}

pub(crate) fn attempt_ref_from_row(r: &Row) -> StoreResult<AttemptRef> {
    Ok(AttemptRef {
        job_id: r.uuid("job_id")?,
        attempt_id: r.uuid("id")?,
        epoch: epoch_of(r)?,
    })
}

/// Pools with infra's edits (`pool_overrides`) applied.
macro_rules! pools_select {
    ($tail:literal) => {
        concat!(
            "SELECT p.id, p.region_id, p.provider, p.instance_type, p.gpu_model, \
             p.gpus_per_node, p.gpu_memory_gb, p.vcpus, p.memory_gb, \
             COALESCE(o.on_demand_micros, p.on_demand_micros) AS on_demand_micros, \
             p.spot_micros, COALESCE(o.node_limit, p.node_limit) AS node_limit, \
             COALESCE(o.launchable, p.launchable) AS launchable, p.boot_time_s, \
             CASE WHEN o.on_demand_micros IS NOT NULL AND o.updated_at > p.price_updated_at \
                  THEN o.updated_at ELSE p.price_updated_at END AS price_updated_at, \
             p.recent_capacity_failures, \
             COALESCE(o.marginal_micros, p.marginal_micros) AS marginal_micros \
             FROM pools p LEFT JOIN pool_overrides o ON o.pool_id = p.id",
            $tail
        )
    };
}

pub(crate) const SQL_POOLS: &str = pools_select!(" ORDER BY p.id COLLATE \"C\"");
pub(crate) const SQL_POOL_BY_ID: &str = pools_select!(" WHERE p.id = $1");

macro_rules! job_select {
    ($tail:literal) => {
        concat!(
            "SELECT j.id, j.core_spec_json, j.spec_json, j.state, j.submitted_at, j.started_at, \
             j.finished_at, j.exit_code, j.reason, j.cancel_requested, j.attempts, j.version, \
             j.explanation_json, a.id AS a_id, a.node_id AS a_node, a.pool_id AS a_pool, \
             a.gpus_json AS a_gpus, a.market AS a_market, p.region_id AS a_region, \
             (SELECT CAST(SUM(l.amount_micros) AS BIGINT) FROM ledger l WHERE l.job_id = j.id) \
             AS cost_micros \
             FROM jobs j LEFT JOIN attempts a ON a.id = j.current_attempt \
             LEFT JOIN pools p ON p.id = a.pool_id ",
            $tail
        )
    };
}

pub(crate) const SQL_JOB_BY_ID: &str = job_select!("WHERE j.id = $1");
pub(crate) const SQL_LIST_JOBS: &str = job_select!("");
pub(crate) const SQL_PENDING_JOBS: &str =
    job_select!("WHERE j.state IN ('queued', 'provisioning', 'held') ORDER BY j.id");

pub(crate) fn market_str(m: Market) -> &'static str {
    match m {
        Market::OnDemand => "on_demand",
        Market::Spot => "spot",
    }
}

pub(crate) fn parse_market(s: &str) -> StoreResult<Market> {
    match s {
        "on_demand" => Ok(Market::OnDemand),
        "spot" => Ok(Market::Spot),
        other => Err(corrupt(format!("bad market {other:?}"))),
    }
}

pub(crate) fn parse_role(s: &str) -> StoreResult<Role> {
    Ok(match s {
        "admin" => Role::Admin,
        "finance" => Role::Finance,
        "infra" => Role::Infra,
        "developer" => Role::Developer,
        other => return Err(corrupt(format!("bad role {other:?}"))),
    })
}

pub(crate) fn parse_state(s: &str) -> StoreResult<JobState> {
    JobState::parse(s).ok_or_else(|| corrupt(format!("bad job state {s:?}")))
}

pub(crate) fn gpus_json(gpus: &[u32]) -> String {
    serde_json::to_string(gpus).unwrap_or_else(|_| "[]".into())
}

pub(crate) fn parse_gpus(s: &str) -> StoreResult<Vec<u32>> {
    serde_json::from_str(s).map_err(|e| corrupt(format!("bad gpus {s:?}: {e}")))
}

pub(crate) fn parse_spec(s: &str) -> StoreResult<JobSpec> {
    serde_json::from_str(s).map_err(|e| corrupt(format!("bad job spec: {e}")))
}

pub(crate) fn parse_priority(s: &str) -> StoreResult<Priority> {
    Priority::parse(s).ok_or_else(|| corrupt(format!("bad priority {s:?}")))
}

pub(crate) fn stream_str(s: Stream) -> &'static str {
    match s {
        Stream::Stdout => "stdout",
        Stream::Stderr => "stderr",
        Stream::System => "system",
    }
}

pub(crate) fn accepted() -> EventResult {
    EventResult {
        status: EventStatus::Accepted,
        reason: None,
    }
}

pub(crate) fn duplicate() -> EventResult {
    EventResult {
        status: EventStatus::Duplicate,
        reason: None,
    }
}

pub(crate) fn rejected(reason: &str) -> EventResult {
    EventResult {
        status: EventStatus::Rejected,
        reason: Some(reason.to_string()),
    }
}

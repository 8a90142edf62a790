//! The agent protocol under `/agent/v1` (shapes and rules in `switchyard_protocol::agent`):
//! enrolment, heartbeats that renew a node's lease (and carry spot interruption notices, which
//! drain the node and requeue its work), the work long-poll, and events (started, log chunks,
//! finished) checked against the lease that the reporting agent holds. What agents report
//! (inventory, names) is range-checked before it is stored ([`check_inventory`]); telemetry out
//! of physical range is dropped and counted (`rules/health.rs` `drop_out_of_range`,
//! `switchyard_telemetry_dropped_total{field}`), never stored or exported. Each heartbeat's GPUs
//! are judged by the health rules (`rules/health.rs`): allocation-free while nothing changes;
//! a change is written at once (`Store::apply_gpu_health`), the scheduler reloads its nodes, and
//! the work of a GPU that fell off the bus is requeued and stopped in this heartbeat's answer.

use axum::Json;
use axum::Router;
use axum::extract::{FromRequestParts, Query, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::routing::{get, post};
use serde::Deserialize;
use std::time::Duration;
use switchyard_core::NodeId;
use switchyard_protocol::agent::{
    AttemptRef, EventBatch, EventBatchResponse, Heartbeat, HeartbeatResponse, InterruptionNotice,
    Inventory, Lease, RegisterRequest, RegisterResponse, WorkResponse,
};

use crate::control::scheduler::SchedulerEvent;
use crate::http::auth::{AGENT_TOKEN_PREFIX, bearer, hash_token, new_token};
use crate::http::error::ApiError;
use crate::http::json::ApiJson;
use crate::state::App;
use crate::store::{NewNode, NodeRecord};

pub fn router(app: App) -> Router<App> {
    Router::new()
        .route(
            "/register",
            // The one-time token is checked before the body is read (`limits.rs`).
            post(register).route_layer(axum::middleware::from_fn_with_state(
                app,
                crate::http::limits::enrolment_gate,
            )),
        )
        .route("/heartbeat", post(heartbeat))
        .route("/work", get(work))
        .route("/events", post(events))
}

/// The agent making a request, authenticated by its agent token.
pub struct AgentCaller(pub NodeRecord);

impl FromRequestParts<App> for AgentCaller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, app: &App) -> Result<AgentCaller, ApiError> {
        let token = bearer(parts).ok_or(ApiError::Unauthorized)?;
        if !token.starts_with(AGENT_TOKEN_PREFIX) {
            return Err(ApiError::Unauthorized);
        }
        match app.store.node_by_token_hash(&hash_token(token)).await? {
            Some(node) if !node.revoked => {
                crate::http::limits::authenticated(&parts.extensions);
                Ok(AgentCaller(node))
            }
            _ => Err(ApiError::Unauthorized),
        }
    }
}

/// The enrolment token comes in `Authorization: Bearer` (checked by
/// [`crate::http::limits::enrolment_gate`] before the body was read; consumed here).
async fn register(
    State(app): State<App>,
    headers: axum::http::HeaderMap,
    ApiJson(mut req): ApiJson<RegisterRequest>,
) -> Result<(StatusCode, Json<RegisterResponse>), ApiError> {
    drop_telemetry(&app, &mut req.inventory);
    let enrolment_token = crate::http::auth::bearer_of(&headers).ok_or(ApiError::Unauthorized)?;
    if req.inventory.gpus.is_empty() {
        return Err(ApiError::invalid(
            "inventory.gpus",
            "an agent needs at least one GPU",
        ));
    }
    check_text("hostname", &req.hostname, MAX_HOSTNAME)?;
    check_text("agent_version", &req.agent_version, MAX_TEXT)?;
    if let Some(address) = &req.address {
        check_text("address", address, MAX_HOSTNAME)?;
    }
    check_inventory(&req.inventory)?;
    let agent_token = new_token(AGENT_TOKEN_PREFIX);
    let agent_id = uuid::Uuid::now_v7();
    let hostname: String = req.hostname.chars().take(128).collect();
    let inventory_json = serde_json::to_string(&req.inventory)
        .map_err(|e| ApiError::Internal(format!("inventory: {e}")))?;
    let node = NewNode {
        id: NodeId(format!(
            "{}-{}",
            sanitize(&hostname),
            &agent_id.simple().to_string()[24..]
        )),
        token_hash: hash_token(&agent_token),
        address: req.address.clone(),
        hostname,
        gpus_total: req.inventory.gpus.len() as u32,
        inventory_json,
    };
    let node = match app
        .store
        .register_node(&hash_token(enrolment_token), node, app.clock.now())
        .await?
    {
        Ok(node) => node,
        Err(refusal) => return Err(ApiError::Forbidden(refusal.to_string())),
    };
    tracing::info!(node.id = %node.id, pool.id = %node.pool, gpus = node.gpus_total, "agent registered");
    // A new node may be a burst instance its job was waiting for: reload all of it.
    app.scheduler.send(SchedulerEvent::InstancesChanged);
    Ok((
        StatusCode::CREATED,
        Json(RegisterResponse {
            agent_id,
            node_id: node.id.to_string(),
            pool: node.pool.to_string(),
            agent_token,
            heartbeat_interval_s: app.config.heartbeat_interval_s,
            lease_ttl_s: app.config.lease_ttl_s,
        }),
    ))
}

/// The hostname part of a node id: ASCII letters, digits and `-`, at most 40 characters.
pub fn sanitize(s: &str) -> String {
    let cleaned: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .take(40)
        .collect();
    if cleaned.is_empty() {
        "node".into()
    } else {
        cleaned
    }
}

// ---- What an agent may report -------------------------------------------------------------
//
// An agent's readings go into the node's stored inventory and from there to `/metrics` and
// the pool views; an agent is a machine that may be broken or taken over, so what it says is
// checked like any other input: a malformed inventory is refused (400, naming the field); a
// reading out of physical range (a broken sensor says 4 billion °C) is dropped and counted
// ([`drop_telemetry`]): the rest of the heartbeat, which renews the lease, still counts.

/// GPUs on one node, at most (the largest job asks for 64 on one node).
pub const MAX_GPUS: usize = 64;
/// A GPU's memory, at most: 4 TiB in MiB.
pub const MAX_GPU_MEMORY_MB: u64 = 4 * 1024 * 1024;
/// Text an agent reports (GPU uuid and model, agent version, notices), at most, in characters.
const MAX_TEXT: usize = 128;
/// XID events or throttle reasons in one GPU's heartbeat, at most (the agent keeps XIDs only
/// until a heartbeat is answered).
const MAX_HEALTH_ITEMS: usize = 64;
/// A hostname, at most: DNS's limit.
const MAX_HOSTNAME: usize = 253;

/// Agent-reported text: bounded and printable (it is shown in listings and metrics labels).
fn check_text(field: &str, s: &str, max: usize) -> Result<(), ApiError> {
    if s.chars().count() > max {
        return Err(ApiError::invalid(
            field,
            format!("at most {max} characters"),
        ));
    }
    if !s.chars().all(crate::rules::convert::printable) {
        return Err(ApiError::invalid(
            field,
            "must be printable (no control or bidirectional-override characters)",
        ));
    }
    Ok(())
}

/// Drops the readings of `inventory` out of physical range, counting each in
/// `switchyard_telemetry_dropped_total{field}`.
fn drop_telemetry(app: &App, inventory: &mut Inventory) {
    crate::rules::health::drop_out_of_range(inventory, |field| {
        app.metrics.telemetry_dropped(field);
    });
}

/// Checks an inventory as register and heartbeat receive it (`inventory.…` fields).
pub fn check_inventory(inv: &Inventory) -> Result<(), ApiError> {
    if inv.gpus.len() > MAX_GPUS {
        return Err(ApiError::invalid("inventory.gpus", "at most 64 GPUs"));
    }
    for (i, g) in inv.gpus.iter().enumerate() {
        let field = |name: &str| format!("inventory.gpus[{i}].{name}");
        check_text(&field("uuid"), &g.uuid, MAX_TEXT)?;
        check_text(&field("model"), &g.model, MAX_TEXT)?;
        if g.memory_mb > MAX_GPU_MEMORY_MB {
            return Err(ApiError::invalid(
                field("memory_mb"),
                "at most 4194304 (4 TiB)",
            ));
        }
        if let Some(vendor) = &g.vendor {
            check_text(&field("vendor"), vendor, MAX_TEXT)?;
        }
        if let Some(h) = &g.health {
            if h.xid_events.len() > MAX_HEALTH_ITEMS {
                return Err(ApiError::invalid(
                    field("health.xid_events"),
                    "at most 64 XID events",
                ));
            }
            if h.throttle_reasons.len() > MAX_HEALTH_ITEMS {
                return Err(ApiError::invalid(
                    field("health.throttle_reasons"),
                    "at most 64 reasons",
                ));
            }
            for r in &h.throttle_reasons {
                check_text(&field("health.throttle_reasons"), r, MAX_TEXT)?;
            }
        }
    }
    Ok(())
}

async fn heartbeat(
    State(app): State<App>,
    AgentCaller(node): AgentCaller,
    ApiJson(mut hb): ApiJson<Heartbeat>,
) -> Result<Json<HeartbeatResponse>, ApiError> {
    drop_telemetry(&app, &mut hb.inventory);
    check_inventory(&hb.inventory)?;
    if let Some(notice) = &hb.interruption {
        check_text("interruption.action", &notice.action, MAX_TEXT)?;
        if let Some(at) = &notice.at {
            check_text("interruption.at", at, MAX_TEXT)?;
        }
    }
    for r in &hb.serving {
        check_text("serving.host", &r.host, MAX_TEXT)?;
    }
    let now = app.clock.now();
    app.telemetry.record(&node.id, &hb.inventory, now);
    let mut stop = if node.healthy {
        // The common case: written with other heartbeats (heartbeats.rs), answered once that
        // write committed (the agent counts its lease from this answer), from one read.
        let inventory = serde_json::to_string(&hb.inventory)
            .map_err(|e| ApiError::Internal(format!("inventory: {e}")))?;
        let generation = app.heartbeats.record(&node.id, inventory, now);
        if !app
            .heartbeats
            .written(generation, crate::control::heartbeats::WRITE_WAIT)
            .await
        {
            return Err(ApiError::Unavailable(
                "the heartbeat could not be written in time; retry".into(),
            ));
        }
        app.store.node_stops(&node.id, &hb.running).await?
    } else {
        // A lost node comes back: written now, and the scheduler told.
        let beat = app
            .store
            .heartbeat(&node.id, &hb.inventory, &hb.running, now)
            .await?;
        if beat.came_back {
            tracing::info!(node.id = %node.id, "node is back");
            app.scheduler.send(SchedulerEvent::NodesChanged);
        }
        beat.stop
    };
    if !hb.serving.is_empty()
        && !app
            .store
            .record_serving(&node.id, &hb.serving, now)
            .await?
            .is_empty()
    {
        // A replica became ready or stopped being: the reconciler may now replace old ones.
        app.services.notify_one();
    }
    if crate::rules::health::changes(&hb.inventory.gpus, &node.gpu_marks) {
        for s in gpu_health(&app, &node, &hb.inventory, now).await? {
            if !stop.contains(&s) {
                stop.push(s);
            }
        }
    }
    if let Some(notice) = &hb.interruption {
        for s in interrupted(&app, &node, notice).await? {
            if !stop.contains(&s) {
                stop.push(s);
            }
        }
    }
    Ok(Json(HeartbeatResponse {
        stop,
        drain: node.draining || hb.interruption.is_some(),
    }))
}

/// The heartbeat's GPUs change the node's health marks: written (under the node's row lock,
/// judged again against the stored marks), the scheduler told, and the attempts on a GPU that
/// fell off the bus returned for the heartbeat's `stop` (their jobs are requeued).
async fn gpu_health(
    app: &App,
    node: &NodeRecord,
    inventory: &Inventory,
    now: switchyard_core::Timestamp,
) -> Result<Vec<AttemptRef>, ApiError> {
    let change = app
        .store
        .apply_gpu_health(&node.id, &inventory.gpus, now)
        .await?;
    if !change.changed {
        return Ok(Vec::new());
    }
    let reasons: Vec<&str> = change.marks.iter().map(|m| m.reason.as_str()).collect();
    tracing::warn!(node.id = %node.id, unhealthy = ?reasons, jobs.requeued = change.requeued.len(),
        "GPU health changed");
    // Nodes changed, and maybe attempts (requeued) and instances (draining): the scheduler
    // reloads everything. Rare: marks change only when a GPU falls sick or recovers.
    app.scheduler.send(SchedulerEvent::InstancesChanged);
    // A cloud instance with a sick GPU is replaced (burst.rs).
    app.burst.notify_one();
    Ok(change.stopped)
}

/// A spot interruption notice: the node drains and its work is requeued now, while the machine
/// still lives, so that the attempts (returned, for the heartbeat's `stop`) get their SIGTERM
/// and grace to checkpoint. The agent repeats the notice on every heartbeat; each repeat only
/// takes what was assigned to the node since (a plan committed before the node drained).
async fn interrupted(
    app: &App,
    node: &NodeRecord,
    notice: &InterruptionNotice,
) -> Result<Vec<AttemptRef>, ApiError> {
    let done = app
        .store
        .interrupt_node(&node.id, "spot interruption", app.clock.now())
        .await?;
    if done.newly_draining {
        tracing::warn!(node.id = %node.id, action = %notice.action,
            at = notice.at.as_deref().unwrap_or("unknown"), jobs.requeued = done.requeued.len(),
            instances = ?done.instances, "spot interruption notice: node draining, work requeued");
    } else if !done.stopped.is_empty() {
        tracing::info!(node.id = %node.id, jobs.requeued = done.requeued.len(),
            "interrupted node was given work; requeued");
    }
    if done.newly_draining || !done.stopped.is_empty() || !done.instances.is_empty() {
        // Nodes, attempts and instances all changed: the scheduler reloads from the database.
        app.scheduler.send(SchedulerEvent::InstancesChanged);
    }
    Ok(done.stopped)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WorkParams {
    wait_s: Option<u64>,
}

/// Long-poll: answers at once when there are leases or stops for this node, otherwise when
/// some arrive, or after `wait_s` (at most 60) with nothing.
async fn work(
    State(app): State<App>,
    AgentCaller(node): AgentCaller,
    Query(params): Query<WorkParams>,
) -> Result<Json<WorkResponse>, ApiError> {
    let wait = Duration::from_secs(params.wait_s.unwrap_or(25).min(60));
    let deadline = tokio::time::Instant::now() + wait;
    let waker = app.agents.get(&node.id);
    loop {
        let notified = waker.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let leases = app.store.leases_for_node(&node.id).await?;
        let stop = app.store.stops_for_node(&node.id).await?;
        if !leases.is_empty() || !stop.is_empty() || node.draining {
            let leases = leases
                .into_iter()
                .map(|l| Lease {
                    attempt: switchyard_protocol::agent::AttemptRef {
                        job_id: l.job.0,
                        attempt_id: l.attempt.0,
                        epoch: l.epoch,
                    },
                    command: l.spec.command.clone(),
                    // A gang rank's place among its nodes, on top of the job's own variables
                    // (which may not name these).
                    env: l
                        .spec
                        .env
                        .iter()
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .chain(l.gang_env)
                        .collect(),
                    gpus: l.gpus,
                    grace_s: app.config.grace_s,
                    traceparent: l.trace_parent,
                    expected_gpu_utilization_pct: l
                        .spec
                        .expected_gpu_utilization_pct
                        .map(u32::from),
                    serve: l.serve,
                })
                .collect();
            return Ok(Json(WorkResponse { leases, stop }));
        }
        tokio::select! {
            _ = &mut notified => continue,
            _ = tokio::time::sleep_until(deadline) => return Ok(Json(WorkResponse::default())),
        }
    }
}

async fn events(
    State(app): State<App>,
    AgentCaller(node): AgentCaller,
    ApiJson(batch): ApiJson<EventBatch>,
) -> Result<Json<EventBatchResponse>, ApiError> {
    if batch.events.len() > 10_000 {
        return Err(ApiError::invalid(
            "events",
            "at most 10000 events per batch",
        ));
    }
    let (results, ended) = app
        .store
        .apply_events(&node.id, &batch.events, app.clock.now())
        .await?;
    for e in &ended {
        let span = tracing::info_span!("job.report", job.id = %e.job, node.id = %e.node);
        crate::trace::join_job(&app, &span, e.job).await;
        span.in_scope(|| tracing::info!(state = e.final_state.as_str(), "job finished"));
    }
    if !ended.is_empty() {
        app.scheduler.send(SchedulerEvent::AttemptsEnded(ended));
    }
    Ok(Json(EventBatchResponse { results }))
}

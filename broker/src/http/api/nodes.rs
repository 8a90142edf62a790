//! `/api/v1/nodes`: the GPU nodes — each with its state, its GPUs as of the last heartbeat with
//! their health and the reasons a GPU is unhealthy (`rules/health.rs`), what runs on them, and
//! for one node the telemetry of the last hour (held in memory by the broker that heard it).
//! Every role may read; a developer sees another team's job without its name.
//!
//! `POST /nodes/{id}/drain` and `/undrain` (infra and admin): drain stops new work on the node
//! and lets running work finish (work assigned but not started is requeued); undrain takes work again and clears the GPUs' sticky health
//! marks (the operator vouches for them). Both are in the audit log.

use axum::Json;
use axum::extract::{Path, State};
use std::collections::HashMap;
use switchyard_core::NodeId;
use switchyard_protocol::agent::Inventory;
use switchyard_protocol::api::{
    ErrorBody, NodeDetail, NodeGpu, NodeJob, NodeList, NodeState, NodeSummary, Role,
};

use crate::clock::to_datetime;
use crate::control::scheduler::SchedulerEvent;
use crate::http::auth::Caller;
use crate::http::error::ApiError;
use crate::rules::health;
use crate::state::App;
use crate::store::{GpuAllocation, NodeRecord};

/// Who may drain and undrain nodes.
const OPERATORS: &[Role] = &[Role::Infra, Role::Admin];

fn state_of(node: &NodeRecord) -> NodeState {
    if node.revoked {
        NodeState::Revoked
    } else if !node.healthy {
        NodeState::Lost
    } else if node.draining {
        NodeState::Draining
    } else {
        NodeState::Healthy
    }
}

/// The node's stored inventory (written by the broker from what the agent sent; one that does
/// not parse shows no GPUs).
fn inventory_of(node: &NodeRecord) -> Option<Inventory> {
    serde_json::from_str(&node.inventory_json).ok()
}

fn gpus_of(node: &NodeRecord, inventory: Option<&Inventory>) -> Vec<NodeGpu> {
    inventory
        .map(|inv| {
            inv.gpus
                .iter()
                .map(|g| {
                    let reasons = health::reasons(&node.gpu_marks, g.index);
                    NodeGpu {
                        index: g.index,
                        model: g.model.clone(),
                        memory_total_mb: g.memory_mb,
                        memory_used_mb: g.memory_used_mb,
                        utilization_pct: g.utilization_pct,
                        temperature_c: g.temperature_c,
                        power_w: g.power_w,
                        // Older agents do not say: the model does.
                        vendor: Some(g.vendor.clone().unwrap_or_else(|| {
                            switchyard_core::gpu_model::vendor(&g.model)
                                .as_str()
                                .to_string()
                        })),
                        uuid: g.uuid.clone(),
                        healthy: reasons.is_empty(),
                        reasons,
                    }
                })
                .collect()
        })
        .unwrap_or_default()
}

/// What runs on `node`, from `live` (every live attempt with its job's team and name, read in
/// one query), names hidden from a developer of another team.
fn running_on(caller: &Caller, node: &NodeId, live: &[GpuAllocation]) -> Vec<NodeJob> {
    let scope = caller.team_scope();
    live.iter()
        .filter(|a| &a.node == node)
        .map(|a| {
            let visible = scope.is_none_or(|team| team == a.team);
            NodeJob {
                job_id: a.job.0,
                attempt_id: a.attempt.0,
                name: visible.then(|| a.name.clone()),
                team: a.team.clone(),
                gpus: a.gpus.clone(),
                started_at: a.started_at.map(to_datetime),
            }
        })
        .collect()
}

/// Every node that is not revoked: its state, GPUs with health and reasons, and what runs on
/// it. Every role may read it; a developer sees another team's job without its name.
#[utoipa::path(get, path = "/nodes", tag = "catalogue",
    responses((status = 200, body = NodeList)),
    security(("bearer" = [])))]
pub async fn list(State(app): State<App>, caller: Caller) -> Result<Json<NodeList>, ApiError> {
    let live = app.store.gpu_allocations().await?;
    let mut by_node: HashMap<NodeId, Vec<GpuAllocation>> = HashMap::new();
    for a in live {
        by_node.entry(a.node.clone()).or_default().push(a);
    }
    let mut nodes = Vec::new();
    for node in app.store.nodes().await? {
        let inventory = inventory_of(&node);
        let live = by_node.remove(&node.id).unwrap_or_default();
        nodes.push(NodeSummary {
            id: node.id.to_string(),
            hostname: node.hostname.clone(),
            pool: node.pool.to_string(),
            state: state_of(&node),
            last_heartbeat: to_datetime(node.last_heartbeat),
            isolation: inventory.as_ref().is_some_and(|i| i.isolation),
            simulated: inventory.as_ref().is_some_and(|i| i.simulated),
            gpus: gpus_of(&node, inventory.as_ref()),
            running: running_on(&caller, &node.id, &live),
        });
    }
    Ok(Json(NodeList { nodes }))
}

async fn find(app: &App, id: &str) -> Result<NodeRecord, ApiError> {
    app.store
        .nodes()
        .await?
        .into_iter()
        .find(|n| n.id.as_str() == id)
        .ok_or_else(|| ApiError::NotFound(format!("node {id}")))
}

/// A node, its GPUs with their health, the attempts running on it and its recent GPU
/// telemetry. Every role may read it; a developer sees another team's job without its name.
#[utoipa::path(get, path = "/nodes/{id}", tag = "catalogue",
    params(("id" = String, Path, description = "Node id")),
    responses(
        (status = 200, body = NodeDetail),
        (status = 404, description = "Unknown node", body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn get(
    State(app): State<App>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<NodeDetail>, ApiError> {
    let node = find(&app, &id).await?;
    let inventory = inventory_of(&node);
    let live = app.store.gpu_allocations().await?;
    let running = running_on(&caller, &node.id, &live);
    Ok(Json(NodeDetail {
        id: node.id.to_string(),
        hostname: node.hostname.clone(),
        pool: node.pool.to_string(),
        healthy: node.healthy,
        draining: node.draining,
        revoked: node.revoked,
        isolation: inventory.as_ref().is_some_and(|i| i.isolation),
        simulated: inventory.as_ref().is_some_and(|i| i.simulated),
        registered_at: to_datetime(node.registered_at),
        last_heartbeat: to_datetime(node.last_heartbeat),
        state: state_of(&node),
        gpus: gpus_of(&node, inventory.as_ref()),
        running,
        history: app.telemetry.of(&node.id),
    }))
}

/// Drain or undrain, audited; answers the node as `GET /nodes/{id}` would.
async fn set_drain(
    app: App,
    caller: Caller,
    id: String,
    drain: bool,
) -> Result<Json<NodeDetail>, ApiError> {
    caller.require(OPERATORS)?;
    let node = NodeId(id.clone());
    let Some(record) = app
        .store
        .set_node_drain(&node, drain, &caller.actor(), app.clock.now())
        .await?
    else {
        return Err(ApiError::NotFound(format!("node {id}")));
    };
    tracing::info!(node.id = %node, drain, actor = %caller.actor(),
        "node {}", if drain { "drained" } else { "undrained" });
    // Its free GPUs changed for the planner, and a drain may have requeued work assigned
    // there: the scheduler reloads. A drained agent is told on its next heartbeat, and a
    // waiting long-poll answers now.
    app.scheduler.send(SchedulerEvent::InstancesChanged);
    app.agents.wake(&record.id);
    get(State(app), caller, Path(id)).await
}

/// Stop new work on the node; running work finishes. For `infra` and `admin`.
#[utoipa::path(post, path = "/nodes/{id}/drain", tag = "catalogue",
    params(("id" = String, Path, description = "Node id")),
    responses(
        (status = 200, body = NodeDetail),
        (status = 403, description = "Not infra or admin", body = ErrorBody),
        (status = 404, description = "Unknown node", body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn drain(
    State(app): State<App>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<NodeDetail>, ApiError> {
    set_drain(app, caller, id, true).await
}

/// Take new work again, and clear the GPUs' health marks (the operator vouches for them; an
/// uncorrectable ECC count that is still there marks its GPU again on the next heartbeat). For
/// `infra` and `admin`.
#[utoipa::path(post, path = "/nodes/{id}/undrain", tag = "catalogue",
    params(("id" = String, Path, description = "Node id")),
    responses(
        (status = 200, body = NodeDetail),
        (status = 403, description = "Not infra or admin", body = ErrorBody),
        (status = 404, description = "Unknown node", body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn undrain(
    State(app): State<App>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<NodeDetail>, ApiError> {
    set_drain(app, caller, id, false).await
}

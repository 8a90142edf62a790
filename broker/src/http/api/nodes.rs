//! `/api/v1/nodes/{id}`: one GPU node — its GPUs as of the last heartbeat, what runs on them,
//! and the telemetry of the last hour (held in memory by the broker that heard it).

use axum::Json;
use axum::extract::{Path, State};
use switchyard_protocol::agent::Inventory;
use switchyard_protocol::api::{ErrorBody, NodeDetail, NodeGpu, NodeJob};

use crate::clock::to_datetime;
use crate::http::auth::Caller;
use crate::http::error::ApiError;
use crate::state::App;

/// A node, its GPUs, the attempts running on it and its recent GPU telemetry. Every role may
/// read it; a developer sees another team's job without its name.
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
    let node = app
        .store
        .nodes()
        .await?
        .into_iter()
        .find(|n| n.id.as_str() == id)
        .ok_or_else(|| ApiError::NotFound(format!("node {id}")))?;
    // Written by the broker from what the agent sent; one that does not parse shows no GPUs.
    let inventory: Option<Inventory> = serde_json::from_str(&node.inventory_json).ok();
    let gpus = inventory
        .as_ref()
        .map(|inv| {
            inv.gpus
                .iter()
                .map(|g| NodeGpu {
                    index: g.index,
                    model: g.model.clone(),
                    memory_total_mb: g.memory_mb,
                    memory_used_mb: g.memory_used_mb,
                    utilization_pct: g.utilization_pct,
                    temperature_c: g.temperature_c,
                    power_w: g.power_w,
                })
                .collect()
        })
        .unwrap_or_default();
    let scope = caller.team_scope().map(str::to_string);
    let mut running = Vec::new();
    for a in app.store.live_attempts().await? {
        if a.node != node.id {
            continue;
        }
        let Some(job) = app.store.job(a.job).await? else {
            continue;
        };
        let visible = scope.as_deref().is_none_or(|team| team == job.spec.team);
        running.push(NodeJob {
            job_id: job.id.0,
            attempt_id: a.id.0,
            name: visible.then(|| job.spec.name.clone()),
            team: job.spec.team.clone(),
            gpus: a.gpus.clone(),
            started_at: job.started_at.map(to_datetime),
        });
    }
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
        gpus,
        running,
        history: app.telemetry.of(&node.id),
    }))
}

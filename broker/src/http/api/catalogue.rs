//! `/api/v1/pools` and `/api/v1/regions`: the live catalogue, priced, with capacity from the
//! nodes that joined.

use axum::Json;
use axum::extract::{Path, State};
use std::collections::HashMap;
use switchyard_core::{GpuSet, MAX_GPUS_PER_NODE, Money, PoolId};
use switchyard_protocol::api::{
    ErrorBody, PoolList, PoolPatch, PoolView, RegionBacking, RegionList, RegionView, Role,
};

use crate::clock;
use crate::control::scheduler::SchedulerEvent;
use crate::http::auth::Caller;
use crate::http::error::ApiError;
use crate::http::json::ApiJson;
use crate::rules::convert;
use crate::state::App;
use crate::store::PoolChange;

/// Every pool with price, latency and capacity.
#[utoipa::path(get, path = "/pools", tag = "catalogue",
    responses((status = 200, body = PoolList), (status = 401, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn pools(State(app): State<App>, _caller: Caller) -> Result<Json<PoolList>, ApiError> {
    let pools = app.store.pools().await?;
    let regions = app.store.regions().await?;
    let nodes = app.store.nodes().await?;
    let busy = busy_gpus(&app).await?;
    let pools = pools
        .iter()
        .map(|p| view_with_nodes(&app, p, &regions, &nodes, &busy))
        .collect();
    Ok(Json(PoolList { pools }))
}

/// Infra's edit of a pool: its node limit, its on-demand (on-prem: internal) price per GPU-hour,
/// whether the broker may launch nodes in it; finance's marginal cost of an owned pool (what a
/// GPU-hour of use costs the company in cash). Audited as `pool.patch`; the scheduler plans with
/// it from its next round. Pool ids contain `/`: send it as `%2F`.
#[utoipa::path(patch, path = "/pools/{id}", tag = "catalogue", request_body = PoolPatch,
    params(("id" = String, Path, description = "Pool id, e.g. `onprem:sh-dc1%2Fdgx-h100`")),
    responses(
        (status = 200, body = PoolView),
        (status = 400, body = ErrorBody),
        (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn patch_pool(
    State(app): State<App>,
    caller: Caller,
    Path(id): Path<String>,
    ApiJson(patch): ApiJson<PoolPatch>,
) -> Result<Json<PoolView>, ApiError> {
    if patch.marginal_usd_per_gpu_hour.is_some() {
        caller.require(&[Role::Admin, Role::Infra, Role::Finance])?;
    } else {
        caller.require(&[Role::Admin, Role::Infra])?;
    }
    if patch == PoolPatch::default() {
        return Err(ApiError::invalid(
            "node_limit",
            "nothing to change: give node_limit, price_per_gpu_hour, launchable or \
             marginal_usd_per_gpu_hour",
        ));
    }
    // Finance's own field: a finance token changes nothing else in the same request.
    if caller.role == Role::Finance
        && (patch.node_limit.is_some()
            || patch.price_per_gpu_hour.is_some()
            || patch.launchable.is_some())
    {
        return Err(ApiError::Forbidden(
            "finance may set marginal_usd_per_gpu_hour only; node_limit, price_per_gpu_hour \
             and launchable are infra's"
                .into(),
        ));
    }
    if let Some(n) = patch.node_limit
        && n > 100_000
    {
        return Err(ApiError::invalid("node_limit", "must be at most 100000"));
    }
    let id = PoolId(id);
    let Some(pool) = app.store.pools().await?.into_iter().find(|p| p.id == id) else {
        return Err(ApiError::NotFound(format!("pool {id}")));
    };
    let on_demand_per_hour = match patch.price_per_gpu_hour {
        None => None,
        Some(p) => Some(
            Money::from_dollars(p)
                .filter(|m| p > 0.0 && m.micros() > 0)
                .map(|m| m.saturating_mul(i64::from(pool.gpus_per_node.max(1))))
                .ok_or_else(|| {
                    ApiError::invalid("price_per_gpu_hour", "must be a positive amount of USD")
                })?,
        ),
    };
    let marginal_per_hour = match patch.marginal_usd_per_gpu_hour {
        None => None,
        Some(m) => {
            if patch.launchable.unwrap_or(pool.launchable) {
                return Err(ApiError::invalid(
                    "marginal_usd_per_gpu_hour",
                    "applies to owned pools only: a pool the broker launches in costs its \
                     price in cash",
                ));
            }
            Some(
                Money::from_dollars(m)
                    .filter(|money| m >= 0.0 && money.micros() >= 0)
                    .map(|money| money.saturating_mul(i64::from(pool.gpus_per_node.max(1))))
                    .ok_or_else(|| {
                        ApiError::invalid(
                            "marginal_usd_per_gpu_hour",
                            "must be 0 or a positive amount of USD",
                        )
                    })?,
            )
        }
    };
    let change = PoolChange {
        node_limit: patch.node_limit,
        on_demand_per_hour,
        launchable: patch.launchable,
        marginal_per_hour,
    };
    let (_, after) = app
        .store
        .patch_pool(&id, &change, &caller.actor(), app.clock.now())
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("pool {id}")))?;
    tracing::info!(pool.id = %id, actor = %caller.actor(), ?patch, "pool patched");
    app.scheduler.send(SchedulerEvent::CatalogueChanged);
    let regions = app.store.regions().await?;
    let nodes = app.store.nodes().await?;
    let busy = busy_gpus(&app).await?;
    let view = view_with_nodes(&app, &after, &regions, &nodes, &busy);
    Ok(Json(view))
}

/// `pool` as the pools API shows it: its healthy nodes and their GPUs, free or busy (`busy`:
/// the GPUs held per node id), every node that joined it, and why the broker cannot launch in it
/// now when it is launchable.
fn view_with_nodes(
    app: &App,
    pool: &switchyard_core::Pool,
    regions: &[switchyard_core::Region],
    nodes: &[crate::store::NodeRecord],
    busy: &HashMap<String, GpuSet>,
) -> PoolView {
    let members: Vec<_> = nodes.iter().filter(|n| n.pool == pool.id).collect();
    let healthy: Vec<_> = members.iter().filter(|n| n.healthy).collect();
    let total: u32 = healthy.iter().map(|n| n.gpus_total).sum();
    // Free as the scheduler sees it (`control/scheduler.rs` `NodeState::free_gpus`): neither
    // held by live work nor marked unhealthy, on a node that is not draining.
    let free: u32 = healthy
        .iter()
        .filter(|n| !n.draining)
        .map(|n| {
            let all = GpuSet::first(n.gpus_total.min(MAX_GPUS_PER_NODE)).unwrap_or_default();
            let mut sick = GpuSet::EMPTY;
            for m in &n.gpu_marks {
                sick.insert(m.gpu);
            }
            let held = busy.get(n.id.as_str()).copied().unwrap_or_default();
            all.difference(held).difference(sick).len()
        })
        .sum();
    let mut view = convert::pool_view(
        pool,
        regions.iter().find(|r| r.id == pool.region),
        healthy.len() as u32,
        total,
        free,
    );
    view.node_list = members.iter().map(|n| pool_node(n)).collect();
    view.unlaunchable_reason = unlaunchable_reason(app, pool);
    view
}

/// Why the broker cannot launch in `pool` now, when it is launchable (the scheduler's snapshot
/// leaves out the same pools, `control/scheduler.rs` `State::snapshot`).
fn unlaunchable_reason(app: &App, pool: &switchyard_core::Pool) -> Option<String> {
    if !pool.launchable {
        return None;
    }
    if !app.config.burst_enabled {
        return Some("bursting is off (burst_enabled = false)".into());
    }
    app.providers.unlaunchable_reason(&pool.id)
}

/// A node as the pools API shows it; what its agent says of itself comes from the inventory
/// it last reported (an unreadable one shows as not isolated, not simulated).
fn pool_node(n: &crate::store::NodeRecord) -> switchyard_protocol::api::PoolNode {
    let inventory =
        serde_json::from_str::<switchyard_protocol::agent::Inventory>(&n.inventory_json).ok();
    switchyard_protocol::api::PoolNode {
        id: n.id.to_string(),
        hostname: n.hostname.clone(),
        healthy: n.healthy,
        draining: n.draining,
        gpus_total: n.gpus_total,
        isolation: inventory.as_ref().is_some_and(|i| i.isolation),
        simulated: inventory.as_ref().is_some_and(|i| i.simulated),
        last_heartbeat: clock::to_datetime(n.last_heartbeat),
    }
}

/// The GPUs live attempts hold, per node id.
async fn busy_gpus(app: &App) -> Result<HashMap<String, GpuSet>, ApiError> {
    let mut busy: HashMap<String, GpuSet> = HashMap::new();
    for a in app.store.live_attempts().await? {
        let held = busy.entry(a.node.to_string()).or_default();
        for &g in &a.gpus {
            if g < MAX_GPUS_PER_NODE {
                held.insert(g);
            }
        }
    }
    Ok(busy)
}

/// Every region with its latency and egress price.
#[utoipa::path(get, path = "/regions", tag = "catalogue",
    responses((status = 200, body = RegionList), (status = 401, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn regions(
    State(app): State<App>,
    _caller: Caller,
) -> Result<Json<RegionList>, ApiError> {
    let regions = app.store.regions().await?;
    let pools = app.store.pools().await?;
    let nodes = app.store.nodes().await?;
    let regions = regions
        .iter()
        .map(|r| {
            let pool_ids: Vec<_> = pools
                .iter()
                .filter(|p| p.region == r.id)
                .map(|p| &p.id)
                .collect();
            let launcher = pool_ids
                .iter()
                .find_map(|p| app.providers.for_pool(p))
                .map(|p| (p.name().to_string(), p.is_local()));
            let credentials = launcher.as_ref().and_then(|(name, local)| {
                if *local {
                    return None;
                }
                app.providers.credentials(name).map(|c| match c {
                    Ok(()) => "ok".to_string(),
                    Err(e) => e.clone(),
                })
            });
            RegionView {
                launched_by: launcher.as_ref().map(|(n, _)| n.clone()),
                backing: match &launcher {
                    None => RegionBacking::None,
                    Some((_, true)) => RegionBacking::Local,
                    Some((_, false)) => RegionBacking::Real,
                },
                credentials,
                id: r.id.to_string(),
                provider: r.provider.clone(),
                code: r.code.clone(),
                latitude: r.latitude,
                longitude: r.longitude,
                latency_ms: r.latency_ms,
                egress_per_gb_usd: r.egress_per_gb.as_dollars(),
                pools: pool_ids.len() as u32,
                nodes: nodes.iter().filter(|n| pool_ids.contains(&&n.pool)).count() as u32,
            }
        })
        .collect();
    Ok(Json(RegionList { regions }))
}

//! `/api/v1/pools` and `/api/v1/regions`: the live catalogue, priced, with capacity from the
//! nodes that joined.

use axum::Json;
use axum::extract::State;
use std::collections::HashMap;
use switchyard_protocol::api::{ErrorBody, PoolList, RegionList, RegionView};

use crate::app::App;
use crate::auth::Caller;
use crate::convert;
use crate::error::ApiError;

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
        .map(|p| {
            let members: Vec<_> = nodes.iter().filter(|n| n.pool == p.id).collect();
            let healthy: Vec<_> = members.iter().filter(|n| n.healthy).collect();
            let total: u32 = healthy.iter().map(|n| n.gpus_total).sum();
            let used: u32 = healthy
                .iter()
                .map(|n| busy.get(n.id.as_str()).copied().unwrap_or(0))
                .sum();
            convert::pool_view(
                p,
                regions.iter().find(|r| r.id == p.region),
                members.len() as u32,
                total,
                total.saturating_sub(used),
            )
        })
        .collect();
    Ok(Json(PoolList { pools }))
}

async fn busy_gpus(app: &App) -> Result<HashMap<String, u32>, ApiError> {
    let mut busy = HashMap::new();
    for a in app.store.live_attempts().await? {
        *busy.entry(a.node.to_string()).or_insert(0) += a.gpus.len() as u32;
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
            RegionView {
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

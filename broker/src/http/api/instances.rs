//! `/api/v1/instances`: the cloud instances the broker launched, with their state and cost.

use axum::Json;
use axum::extract::State;
use switchyard_protocol::api::{ErrorBody, InstanceList, InstanceView, Role};

use crate::clock::to_datetime;
use crate::http::auth::Caller;
use crate::http::error::ApiError;
use crate::rules::convert::market_name;
use crate::state::App;
use crate::store::{InstanceRecord, InstanceState};

/// Every instance launched, newest last, with its cost: accrued so far while it runs, and the
/// ledger's figure once it ended.
#[utoipa::path(get, path = "/instances", tag = "catalogue",
    responses((status = 200, body = InstanceList), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list(State(app): State<App>, caller: Caller) -> Result<Json<InstanceList>, ApiError> {
    caller.require(&[Role::Admin, Role::Infra, Role::Finance])?;
    let now = app.clock.now();
    let min_billed = app.config.min_billed_s as i64;
    let instances = app
        .store
        .instances(true)
        .await?
        .iter()
        .map(|i| view(i, now, min_billed))
        .collect();
    Ok(Json(InstanceList { instances }))
}

fn view(i: &InstanceRecord, now: switchyard_core::Timestamp, min_billed_s: i64) -> InstanceView {
    let cost = match i.launched_at {
        None => switchyard_core::Money::ZERO,
        Some(launched) => {
            let end = if i.state == InstanceState::Terminated {
                i.ended_at.unwrap_or(now)
            } else {
                now
            };
            // The ledger's rule (`store::stretches::cost_to`): a started second in full.
            let mut secs = end.billed_secs_since(launched);
            if i.state == InstanceState::Terminated {
                // What the ledger charged: the provider's minimum applies to ended instances.
                secs = secs.max(min_billed_s);
            }
            i.hourly_price.per_hour_for_secs(secs)
        }
    };
    InstanceView {
        id: i.id.clone(),
        provider: i.provider.clone(),
        provider_id: i.provider_id.clone(),
        region: i.region.clone(),
        pool: i.pool.to_string(),
        state: i.state.as_str().to_string(),
        market: market_name(i.market).to_string(),
        hourly_price_usd: i.hourly_price.as_dollars(),
        cost_usd: cost.as_dollars(),
        for_job: i.for_job.map(|j| j.0),
        node: i.node.as_ref().map(ToString::to_string),
        requested_at: to_datetime(i.requested_at),
        launched_at: i.launched_at.map(to_datetime),
        ready_at: i.ready_at.map(to_datetime),
        ended_at: i.ended_at.map(to_datetime),
        last_error: i.last_error.clone(),
        end_reason: i.end_reason.clone(),
    }
}

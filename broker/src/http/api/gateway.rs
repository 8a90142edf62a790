//! `/api/v1/gateway/…` (admin, infra): what a standalone services gateway (`switchyard
//! gateway`) reads and reports, so that it never needs the database — its routes with the
//! hashes of the tokens that may call each service, and its per-second reports, stored
//! before they are acknowledged (every broker reads them into its traffic windows; see
//! `gateway/traffic.rs`). And `/api/v1/services/{id}/tokens` (admin): per-service invoke
//! tokens, shown once, stored hashed, listed without secrets, revocable.
//!
//! Gateways authenticate with an `admin` or an `infra` token: running the data path is an
//! operator's job, like enrolling agents. The routes carry token hashes, never tokens.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use switchyard_core::Timestamp;
use switchyard_protocol::api::{ErrorBody, Role};
use switchyard_protocol::gateway::{
    CreateInvokeToken, GatewayReport, GatewayReportAccepted, GatewayRoutes, InvokeTokenCreated,
    InvokeTokenList, InvokeTokenView,
};
use uuid::Uuid;

use crate::clock;
use crate::gateway::traffic::{BUCKETS, KEEP_S};
use crate::http::auth::{Caller, hash_token, new_token};
use crate::http::error::ApiError;
use crate::http::json::ApiJson;
use crate::state::App;
use crate::store::{ServiceRecord, ServiceTokenRecord};

/// Invoke tokens say what they are when they turn up in a log or a paste.
pub const INVOKE_TOKEN_PREFIX: &str = "syi_";
/// Rows one report may carry.
pub const MAX_REPORT_ROWS: usize = 10_000;
/// How far ahead of the broker's clock a report's second may be (clocks differ a little).
const AHEAD_S: i64 = 60;

/// The routes: every live service, its ready and draining replicas with their regions, the
/// regions' latencies, and the hashes of the tokens that may call services.
#[utoipa::path(get, path = "/gateway/routes", tag = "services",
    responses(
        (status = 200, body = GatewayRoutes),
        (status = 403, description = "Not an admin or infra token", body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn routes(
    State(app): State<App>,
    caller: Caller,
) -> Result<Json<GatewayRoutes>, ApiError> {
    caller.require(&[Role::Admin, Role::Infra])?;
    Ok(Json(crate::gateway::routes_from_store(&app.store).await?))
}

/// A gateway's report: per service and replica and second, requests, errors, the latency
/// histogram, the queue's peak and the requests in flight. Answered once stored; rows sent
/// before (a retry) are taken once.
#[utoipa::path(post, path = "/gateway/reports", tag = "services", request_body = GatewayReport,
    responses(
        (status = 200, body = GatewayReportAccepted),
        (status = 400, description = "Malformed JSON", body = ErrorBody),
        (status = 403, description = "Not an admin or infra token", body = ErrorBody),
        (status = 422, description = "A field is out of range; the field is named", body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn report(
    State(app): State<App>,
    caller: Caller,
    ApiJson(report): ApiJson<GatewayReport>,
) -> Result<Json<GatewayReportAccepted>, ApiError> {
    caller.require(&[Role::Admin, Role::Infra])?;
    let now = app.clock.now();
    check_report(&report, now)?;
    let accepted =
        crate::gateway::store_report(&app.store, &report.gateway, &report.seconds, now).await?;
    Ok(Json(GatewayReportAccepted { accepted }))
}

/// A report's figures must hang together; the first that does not is named.
pub fn check_report(report: &GatewayReport, now: Timestamp) -> Result<(), ApiError> {
    let bad = |field: String, why: &str| Err(ApiError::unprocessable(field, why.to_string()));
    let g = &report.gateway;
    if g.is_empty() || g.len() > 200 || g.chars().any(char::is_control) {
        return bad(
            "gateway".into(),
            "1 to 200 characters, no control characters",
        );
    }
    if report.seconds.len() > MAX_REPORT_ROWS {
        return bad(
            "seconds".into(),
            &format!("at most {MAX_REPORT_ROWS} rows a report"),
        );
    }
    let now_s = now.millis().div_euclid(1000);
    for (i, s) in report.seconds.iter().enumerate() {
        let f = |name: &str| format!("seconds[{i}].{name}");
        if s.second <= now_s - KEEP_S || s.second > now_s + AHEAD_S {
            return bad(
                f("second"),
                &format!("must be within the last {KEEP_S} s (Unix seconds)"),
            );
        }
        if s.errors > s.requests {
            return bad(f("errors"), "more errors than requests");
        }
        if s.buckets.len() > BUCKETS {
            return bad(f("buckets"), &format!("at most {BUCKETS} buckets"));
        }
        let total = s
            .buckets
            .iter()
            .try_fold(0u64, |a, n| a.checked_add(*n))
            .unwrap_or(u64::MAX);
        if total != s.requests {
            return bad(f("buckets"), "must sum to requests");
        }
        if s.replica.is_none() && s.in_flight > 0 {
            return bad(
                f("in_flight"),
                "only a replica's row has requests in flight",
            );
        }
        if s.replica.is_some() && s.busy_us > 0 {
            return bad(f("busy_us"), "only the whole service's row has busy time");
        }
        if s.replica.is_some() && s.peak_in_system > 0 {
            return bad(
                f("peak_in_system"),
                "only the whole service's row has a peak at the gateway",
            );
        }
        for (name, v) in [
            ("requests", s.requests),
            ("latency_sum_us", s.latency_sum_us),
            ("queue_peak", s.queue_peak),
            ("in_flight", s.in_flight),
            ("busy_us", s.busy_us),
            ("peak_in_system", s.peak_in_system),
            ("batch", s.batch),
        ] {
            if i64::try_from(v).is_err() {
                return bad(f(name), "too large");
            }
        }
    }
    Ok(())
}

/// The live service `id`, or 404.
async fn service(app: &App, id: &str) -> Result<ServiceRecord, ApiError> {
    let not_found = || ApiError::NotFound(format!("service {id}"));
    let uuid = Uuid::parse_str(id).map_err(|_| not_found())?;
    match app.store.service(uuid).await? {
        Some(s) if s.deleted_at.is_none() => Ok(s),
        _ => Err(not_found()),
    }
}

fn token_view(t: &ServiceTokenRecord) -> InvokeTokenView {
    InvokeTokenView {
        id: t.id,
        service_id: t.service,
        name: t.name.clone(),
        created_at: clock::to_datetime(t.created_at),
        revoked: t.revoked,
    }
}

/// Issue an invoke token for one service: its bearer may call that service through the
/// gateway, nothing else. Shown once; only its hash is stored. Audited as
/// `service_token.create`.
#[utoipa::path(post, path = "/services/{id}/tokens", tag = "services",
    request_body = CreateInvokeToken,
    params(("id" = String, Path, description = "Service id")),
    responses(
        (status = 201, body = InvokeTokenCreated),
        (status = 400, body = ErrorBody),
        (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn create_token(
    State(app): State<App>,
    caller: Caller,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<CreateInvokeToken>,
) -> Result<(StatusCode, Json<InvokeTokenCreated>), ApiError> {
    caller.require(&[Role::Admin])?;
    let svc = service(&app, &id).await?;
    if let Some(name) = &req.name {
        crate::rules::convert::check_display_name("name", name)?;
    }
    let token = new_token(INVOKE_TOKEN_PREFIX);
    let record = ServiceTokenRecord {
        id: Uuid::now_v7(),
        service: svc.id,
        token_hash: hash_token(&token),
        name: req.name.clone(),
        created_at: app.clock.now(),
        revoked: false,
    };
    app.store.insert_service_token(&record).await?;
    let after = serde_json::json!({"id": record.id, "service": svc.id, "name": req.name});
    app.store
        .append_audit(&crate::http::api::audit::entry(
            &caller,
            record.created_at,
            "service_token.create",
            format!("service:{}", svc.id),
            None,
            Some(&after),
        ))
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(InvokeTokenCreated {
            id: record.id,
            service_id: svc.id,
            token,
            name: req.name,
        }),
    ))
}

/// A service's invoke tokens, revoked ones included; never the tokens.
#[utoipa::path(get, path = "/services/{id}/tokens", tag = "services",
    params(("id" = String, Path, description = "Service id")),
    responses(
        (status = 200, body = InvokeTokenList),
        (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn list_tokens(
    State(app): State<App>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<InvokeTokenList>, ApiError> {
    caller.require(&[Role::Admin])?;
    let svc = service(&app, &id).await?;
    let tokens = app.store.service_tokens(svc.id).await?;
    Ok(Json(InvokeTokenList {
        tokens: tokens.iter().map(token_view).collect(),
    }))
}

/// Revoke an invoke token: gateways refuse it from their next routes refresh (about a
/// second). Audited as `service_token.revoke`.
#[utoipa::path(delete, path = "/services/{id}/tokens/{token_id}", tag = "services",
    params(
        ("id" = String, Path, description = "Service id"),
        ("token_id" = String, Path, description = "The invoke token's id"),
    ),
    responses(
        (status = 200, body = InvokeTokenView),
        (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn revoke_token(
    State(app): State<App>,
    caller: Caller,
    Path((id, token_id)): Path<(String, String)>,
) -> Result<Json<InvokeTokenView>, ApiError> {
    caller.require(&[Role::Admin])?;
    let svc = service(&app, &id).await?;
    let not_found = || ApiError::NotFound(format!("invoke token {token_id}"));
    let tid = Uuid::parse_str(&token_id).map_err(|_| not_found())?;
    let now = app.clock.now();
    let before = app
        .store
        .revoke_service_token(svc.id, tid, now)
        .await?
        .ok_or_else(not_found)?;
    if !before.revoked {
        app.store
            .append_audit(&crate::http::api::audit::entry(
                &caller,
                now,
                "service_token.revoke",
                format!("service:{}", svc.id),
                Some(&serde_json::json!({"id": tid, "revoked": false})),
                Some(&serde_json::json!({"id": tid, "revoked": true})),
            ))
            .await?;
    }
    let mut view = token_view(&before);
    view.revoked = true;
    Ok(Json(view))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use switchyard_protocol::gateway::TrafficSecond;

    fn report(replica: Option<Uuid>, peak_in_system: u64) -> GatewayReport {
        GatewayReport {
            gateway: "test/gw".into(),
            seconds: vec![TrafficSecond {
                service: Uuid::from_u128(1),
                replica,
                second: 1_000,
                batch: 0,
                requests: 0,
                errors: 0,
                latency_sum_us: 0,
                buckets: Vec::new(),
                queue_peak: 3,
                in_flight: 0,
                busy_us: 0,
                peak_in_system,
            }],
        }
    }

    fn field(r: Result<(), ApiError>) -> Option<String> {
        match r {
            Err(ApiError::Unprocessable { field, .. }) => field,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_peak_at_the_gateway_is_the_whole_services_and_named_when_wrong() {
        let now = Timestamp::from_secs(1_000);
        assert!(check_report(&report(None, 9), now).is_ok());
        // A replica's row says nothing about the gateway's queue.
        assert!(check_report(&report(Some(Uuid::from_u128(2)), 0), now).is_ok());
        let r = check_report(&report(Some(Uuid::from_u128(2)), 9), now);
        assert_eq!(field(r).as_deref(), Some("seconds[0].peak_in_system"));
        let r = check_report(&report(None, u64::MAX), now);
        assert_eq!(field(r).as_deref(), Some("seconds[0].peak_in_system"));
    }
}

//! `/api/v1/services`: inference services (issue 26) — deploy, list, read, update (a new spec
//! version), delete (drain, then stop) and their event log. Handlers validate and store; the
//! services reconciler (`control/`) starts and drains the replicas, which are jobs.
//!
//! Bad input is answered 422 throughout, naming the field (`rules/service.rs`); malformed
//! JSON stays 400. Roles and teams as for jobs: developers deploy and see their own team's
//! services (others' are 404), admins everything; finance and infra read every team's.

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::header::{ETAG, IF_MATCH};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use switchyard_core::{JobId, Timestamp};
use switchyard_protocol::api::{
    ErrorBody, Role, ServiceEventList, ServiceEventView, ServiceList, ServiceSpec, ServiceView,
    TrafficView,
};
use utoipa::IntoParams;
use uuid::Uuid;

use crate::clock;
use crate::http::auth::Caller;
use crate::http::error::ApiError;
use crate::http::json::ApiJson;
use crate::rules::{policy, service};
use crate::state::App;
use crate::store::{NewService, ServiceDelete, ServiceInsert, ServiceRecord, ServiceUpdate};

/// How long a replica that ended stays in the service's view.
const ENDED_SHOWN_MS: i64 = 10 * 60 * 1000;

/// The body as a service spec; a field that does not parse is 422 like every bad field here.
type SpecBody = Result<ApiJson<ServiceSpec>, ApiError>;

fn body(spec: SpecBody) -> Result<ServiceSpec, ApiError> {
    spec.map(|ApiJson(s)| s).map_err(service::service_error)
}

/// Validates `spec` against its own rules, the catalogue and its team's policy; returns its
/// canonical JSON.
async fn validate(app: &App, spec: &ServiceSpec, now: Timestamp) -> Result<String, ApiError> {
    let replica = service::check_spec(spec, now)?;
    let pools = app.store.pools().await?;
    let regions = app.store.regions().await?;
    service::check_catalogue(spec, &replica, &regions, &pools)?;
    policy::check_submit_against_store(&app.store, &pools, &replica, now)
        .await
        .map_err(service::service_error)?;
    serde_json::to_string(spec).map_err(|e| ApiError::Internal(format!("serialising a spec: {e}")))
}

/// The view of `record` with its replicas now.
async fn view_of(app: &App, record: &ServiceRecord) -> Result<ServiceView, ApiError> {
    let since = Timestamp(app.clock.now().millis() - ENDED_SHOWN_MS);
    let replicas = app.store.service_replicas(record.id, since).await?;
    let gateway = app.config.gateway_listen.map(|a| a.to_string());
    let mut view = service::service_view(record, &replicas, gateway.as_deref())?;
    // What this broker's gateway saw over the service's window.
    let now = app.clock.now();
    let window = view
        .spec
        .scaling
        .as_ref()
        .and_then(|s| s.window_s)
        .unwrap_or(service::DEFAULT_WINDOW_S);
    let w = app.traffic.service(record.id, now, window);
    view.traffic = TrafficView {
        window_s: window,
        requests: w.requests,
        errors: w.errors,
        rps: w.rps,
        p50_ms: w.p50_ms,
        p95_ms: w.p95_ms,
        p99_ms: w.p99_ms,
    };
    for r in &mut view.replicas {
        let job = JobId(r.job_id);
        let rw = app.traffic.replica(record.id, job, now, window);
        r.rps = rw.rps;
        r.p95_ms = rw.p95_ms;
        r.in_flight = u32::try_from(app.traffic.in_flight(job)).unwrap_or(u32::MAX);
    }
    Ok(view)
}

/// The view, with the spec version as its `ETag`.
async fn answer(
    app: &App,
    status: StatusCode,
    record: &ServiceRecord,
) -> Result<Response, ApiError> {
    let view = view_of(app, record).await?;
    let mut res = (status, Json(view)).into_response();
    if let Ok(v) = HeaderValue::from_str(&format!("\"{}\"", record.spec_version)) {
        res.headers_mut().insert(ETAG, v);
    }
    Ok(res)
}

/// Deploy a service: its first spec version. The reconciler starts its replicas (jobs of
/// kind `service`); its `endpoint` answers through the gateway once one is ready.
#[utoipa::path(post, path = "/services", tag = "services", request_body = ServiceSpec,
    responses(
        (status = 201, description = "Created at spec version 1", body = ServiceView,
            headers(("ETag" = String, description = "\"<spec_version>\""))),
        (status = 400, description = "Malformed JSON", body = ErrorBody),
        (status = 403, description = "Not a developer of the team, nor an admin", body = ErrorBody),
        (status = 409, description = "The team has a live service of this name", body = ErrorBody),
        (status = 422, description = "A bad field (`invalid_field`, `error.field` names it), no pool could ever run a replica (`unsatisfiable`), or the team's policy never allows it (`policy_violation`)", body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn create(
    State(app): State<App>,
    caller: Caller,
    spec: SpecBody,
) -> Result<Response, ApiError> {
    caller.require(&[Role::Admin, Role::Developer])?;
    let spec = body(spec)?;
    if let Some(team) = caller.team_scope()
        && team != spec.team
    {
        return Err(ApiError::Forbidden(format!(
            "this token deploys for team {team:?} only"
        )));
    }
    let now = app.clock.now();
    let spec_json = validate(&app, &spec, now).await?;
    let (desired, reason) = service::initial_desired(&spec, now);
    let new = NewService {
        id: Uuid::now_v7(),
        team: spec.team.clone(),
        project: spec.project.clone(),
        name: spec.name.clone(),
        spec_json,
        desired_replicas: desired,
        desired_reason: reason,
        created_at: now,
    };
    match app.store.insert_service(&new).await? {
        ServiceInsert::Inserted(record) => {
            tracing::info!(service.id = %record.id, team = %record.team, name = %record.name,
                desired, "service deployed");
            app.services.notify_one();
            answer(&app, StatusCode::CREATED, &record).await
        }
        ServiceInsert::NameTaken { existing } => Err(ApiError::Conflict(format!(
            "team {} has a service named {:?} already ({existing}); PUT /services/{existing} \
             deploys a new version of it",
            spec.team, spec.name
        ))),
    }
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListParams {
    /// Only this team's services (developers always see only their own team).
    team: Option<String>,
    /// Only the service of this name (one per team).
    name: Option<String>,
}

/// List services by team and name: the live ones, and deleted ones whose replicas still drain.
#[utoipa::path(get, path = "/services", tag = "services", params(ListParams),
    responses(
        (status = 200, body = ServiceList),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn list(
    State(app): State<App>,
    caller: Caller,
    params: Result<Query<ListParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<ServiceList>, ApiError> {
    let Query(params) = params?;
    let team = match (caller.team_scope(), params.team) {
        // A developer asking for another team sees nothing, as if it had no services.
        (Some(own), Some(asked)) if own != asked => {
            return Ok(Json(ServiceList {
                services: Vec::new(),
            }));
        }
        (Some(own), _) => Some(own.to_string()),
        (None, asked) => asked,
    };
    let records = app.store.services(team.as_deref()).await?;
    let mut services = Vec::with_capacity(records.len());
    for r in records
        .iter()
        .filter(|r| params.name.as_ref().is_none_or(|n| *n == r.name))
    {
        services.push(view_of(&app, r).await?);
    }
    Ok(Json(ServiceList { services }))
}

/// Loads a service the caller may see; others' services are reported as absent.
async fn visible(app: &App, caller: &Caller, id: &str) -> Result<ServiceRecord, ApiError> {
    let not_found = || ApiError::NotFound(format!("service {id}"));
    let uuid = Uuid::parse_str(id).map_err(|_| not_found())?;
    match app.store.service(uuid).await? {
        Some(s) if caller.can_see_team(&s.team) => Ok(s),
        _ => Err(not_found()),
    }
}

/// Read one service: state, endpoint, desired replicas and why, each replica, traffic, cost.
#[utoipa::path(get, path = "/services/{id}", tag = "services",
    params(("id" = String, Path, description = "Service id")),
    responses(
        (status = 200, body = ServiceView,
            headers(("ETag" = String, description = "\"<spec_version>\""))),
        (status = 404, body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn get(
    State(app): State<App>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let record = visible(&app, &caller, &id).await?;
    answer(&app, StatusCode::OK, &record).await
}

/// `If-Match: "3"` (or `W/"3"`, or a bare `3`) → `Some(3)`; `*` (any version) → `None`.
fn if_match(headers: &HeaderMap) -> Result<Option<i64>, ApiError> {
    let Some(v) = headers.get(IF_MATCH) else {
        return Ok(None);
    };
    let bad = || ApiError::invalid("If-Match", "must be the service's ETag, e.g. \"3\"");
    let s = v.to_str().map_err(|_| bad())?.trim();
    if s == "*" {
        return Ok(None);
    }
    let s = s.strip_prefix("W/").unwrap_or(s);
    let s = s
        .strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .unwrap_or(s);
    s.parse::<i64>()
        .ok()
        .filter(|v| *v >= 1)
        .map(Some)
        .ok_or_else(bad)
}

/// Deploy a new spec version: a rolling update (new replicas start; the old drain once the new
/// are ready). `team` and `name` stay as they are. The same spec again is no new version.
/// With `If-Match`, only if the current version is the one given.
#[utoipa::path(put, path = "/services/{id}", tag = "services", request_body = ServiceSpec,
    params(
        ("id" = String, Path, description = "Service id"),
        ("If-Match" = Option<String>, Header, description = "The ETag last read"),
    ),
    responses(
        (status = 200, description = "The new version (or the current one, when the spec is the same)", body = ServiceView,
            headers(("ETag" = String, description = "\"<spec_version>\""))),
        (status = 400, description = "Malformed JSON or `If-Match`", body = ErrorBody),
        (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "Deleted, or `If-Match` is not the current version", body = ErrorBody),
        (status = 422, description = "A bad field, `team` or `name` changed, or a rule refuses it (as for `POST`)", body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn update(
    State(app): State<App>,
    caller: Caller,
    Path(id): Path<String>,
    headers: HeaderMap,
    spec: SpecBody,
) -> Result<Response, ApiError> {
    let record = visible(&app, &caller, &id).await?;
    caller.require(&[Role::Admin, Role::Developer])?;
    let expected = if_match(&headers)?;
    let spec = body(spec)?;
    if spec.team != record.team {
        return Err(ApiError::invalid_entity(
            "team",
            format!(
                "a service keeps its team ({}); deploy a new service instead",
                record.team
            ),
        ));
    }
    if spec.name != record.name {
        return Err(ApiError::invalid_entity(
            "name",
            format!(
                "a service keeps its name ({}); deploy a new service instead",
                record.name
            ),
        ));
    }
    if let Some(at) = record.deleted_at {
        return Err(ApiError::Conflict(format!(
            "service {id} was deleted at {}",
            clock::to_datetime(at).to_rfc3339()
        )));
    }
    let now = app.clock.now();
    let spec_json = validate(&app, &spec, now).await?;
    if spec_json == record.spec_json && expected.is_none_or(|v| v == record.spec_version) {
        return answer(&app, StatusCode::OK, &record).await;
    }
    match app
        .store
        .update_service_spec(
            record.id,
            expected,
            spec.project.as_deref(),
            &spec_json,
            now,
        )
        .await?
    {
        ServiceUpdate::Updated(record) => {
            tracing::info!(service.id = %record.id, version = record.spec_version,
                "service updated");
            app.services.notify_one();
            answer(&app, StatusCode::OK, &record).await
        }
        ServiceUpdate::NotFound => Err(ApiError::NotFound(format!("service {id}"))),
        ServiceUpdate::Deleted => Err(ApiError::Conflict(format!("service {id} was deleted"))),
        ServiceUpdate::Stale { current } => Err(ApiError::Conflict(format!(
            "service {id} is at version {current}, not {}; read it again",
            expected.unwrap_or_default()
        ))),
    }
}

/// Delete a service: its replicas drain (they finish their requests), then stop. It stays
/// readable (`stopped`) and its name is free for a new service at once.
#[utoipa::path(delete, path = "/services/{id}", tag = "services",
    params(("id" = String, Path, description = "Service id")),
    responses(
        (status = 202, description = "Deleted; its replicas drain", body = ServiceView),
        (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "Deleted already", body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn delete(
    State(app): State<App>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let record = visible(&app, &caller, &id).await?;
    caller.require(&[Role::Admin, Role::Developer])?;
    match app.store.delete_service(record.id, app.clock.now()).await? {
        ServiceDelete::Deleted(record) => {
            tracing::info!(service.id = %record.id, "service deleted");
            app.services.notify_one();
            let view = view_of(&app, &record).await?;
            Ok((StatusCode::ACCEPTED, Json(view)).into_response())
        }
        ServiceDelete::NotFound => Err(ApiError::NotFound(format!("service {id}"))),
        ServiceDelete::AlreadyDeleted(at) => Err(ApiError::Conflict(format!(
            "service {id} was deleted at {}",
            clock::to_datetime(at).to_rfc3339()
        ))),
    }
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct EventParams {
    /// Only events with ids above this one (the last id read).
    after: Option<i64>,
    /// At most this many, 1 to 1000 (default 100).
    limit: Option<i64>,
}

/// A service's events, oldest first: every scaling and placement decision, with its reason.
#[utoipa::path(get, path = "/services/{id}/events", tag = "services",
    params(("id" = String, Path, description = "Service id"), EventParams),
    responses(
        (status = 200, body = ServiceEventList),
        (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn events(
    State(app): State<App>,
    caller: Caller,
    Path(id): Path<String>,
    params: Result<Query<EventParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<ServiceEventList>, ApiError> {
    let Query(params) = params?;
    let limit = params.limit.unwrap_or(100);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::invalid("limit", "must be between 1 and 1000"));
    }
    let after = params.after.unwrap_or(0);
    if after < 0 {
        return Err(ApiError::invalid("after", "must be 0 or more"));
    }
    let record = visible(&app, &caller, &id).await?;
    let events = app
        .store
        .service_events(record.id, after, limit)
        .await?
        .into_iter()
        .map(|e| ServiceEventView {
            id: e.id,
            at: clock::to_datetime(e.at),
            kind: e.kind,
            message: e.message,
        })
        .collect();
    Ok(Json(ServiceEventList { events }))
}

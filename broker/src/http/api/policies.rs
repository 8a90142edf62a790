//! `/api/v1/policies`: team and project cost policies — read (everyone, developers their own
//! team), write (finance, admin) with versions and `If-Match`, and the what-if simulation of a
//! draft against the team's recorded jobs.

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::header::{ETAG, IF_MATCH};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use switchyard_protocol::api::{ErrorBody, PolicyBody, PolicyList, PolicyView, Role, WhatIfReport};
use utoipa::IntoParams;

use crate::clock;
use crate::http::auth::Caller;
use crate::http::error::ApiError;
use crate::http::json::ApiJson;
use crate::rules::policy;
use crate::rules::what_if::{self, WHAT_IF_DAYS, WHAT_IF_MAX_JOBS, WhatIfWorld};
use crate::state::App;
use crate::store::{JobFilter, PolicyRecord};

/// Roles that may change policies (and run what-ifs).
const WRITERS: &[Role] = &[Role::Admin, Role::Finance];

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ProjectParams {
    /// The project's policy instead of the team-wide one.
    project: Option<String>,
}

fn project_of(
    params: Result<Query<ProjectParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Option<String>, ApiError> {
    let Query(params) = params?;
    match params.project {
        None => Ok(None),
        Some(p) => {
            policy::check_name("project", &p)?;
            Ok(Some(p))
        }
    }
}

pub fn view(r: &PolicyRecord) -> PolicyView {
    PolicyView {
        team: r.team.clone(),
        project: r.project.clone(),
        version: r.version,
        updated_at: clock::to_datetime(r.updated_at),
        updated_by: r.updated_by.clone(),
        policy: r.body.clone(),
    }
}

fn with_etag(status: StatusCode, r: &PolicyRecord) -> Response {
    let mut res = (status, Json(view(r))).into_response();
    if let Ok(v) = HeaderValue::from_str(&format!("\"{}\"", r.version)) {
        res.headers_mut().insert(ETAG, v);
    }
    res
}

/// `If-Match: "3"` (or `W/"3"`, or a bare `3`) → `Some(3)`; `*` → `Some(-1)` (any existing).
fn if_match(headers: &HeaderMap) -> Result<Option<i64>, ApiError> {
    let Some(v) = headers.get(IF_MATCH) else {
        return Ok(None);
    };
    let bad = || ApiError::invalid("If-Match", "must be the policy's ETag, e.g. \"3\"");
    let s = v.to_str().map_err(|_| bad())?.trim();
    if s == "*" {
        return Ok(Some(-1));
    }
    let s = s.strip_prefix("W/").unwrap_or(s);
    let s = s
        .strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .unwrap_or(s);
    s.parse::<i64>()
        .ok()
        .filter(|v| *v >= 0)
        .map(Some)
        .ok_or_else(bad)
}

/// Every current policy (developers: their own team's).
#[utoipa::path(get, path = "/policies", tag = "policies",
    responses((status = 200, body = PolicyList), (status = 401, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list(State(app): State<App>, caller: Caller) -> Result<Json<PolicyList>, ApiError> {
    let policies = app
        .store
        .policies()
        .await?
        .iter()
        .filter(|r| caller.can_see_team(&r.team))
        .map(view)
        .collect();
    Ok(Json(PolicyList { policies }))
}

/// The current policy of a team (or one of its projects), with its version as the `ETag`.
#[utoipa::path(get, path = "/policies/{team}", tag = "policies",
    params(("team" = String, Path, description = "Team"), ProjectParams),
    responses(
        (status = 200, body = PolicyView, headers(("ETag" = String, description = "\"<version>\""))),
        (status = 404, description = "No policy (or another team's, for developers)", body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn get(
    State(app): State<App>,
    caller: Caller,
    Path(team): Path<String>,
    params: Result<Query<ProjectParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let project = project_of(params)?;
    let not_found = || ApiError::NotFound(format!("policy of team {team}"));
    if !caller.can_see_team(&team) {
        return Err(not_found());
    }
    let record = app
        .store
        .policy(&team, project.as_deref())
        .await?
        .ok_or_else(not_found)?;
    Ok(with_etag(StatusCode::OK, &record))
}

/// Save a new version of a team's (or project's) policy. With `If-Match`, only if the current
/// version is the one given (409 `conflict` otherwise; nothing is changed).
#[utoipa::path(put, path = "/policies/{team}", tag = "policies", request_body = PolicyBody,
    params(
        ("team" = String, Path, description = "Team"),
        ("If-Match" = Option<String>, Header, description = "The ETag last read"),
        ProjectParams,
    ),
    responses(
        (status = 200, description = "A new version", body = PolicyView),
        (status = 201, description = "The first version", body = PolicyView),
        (status = 400, description = "Malformed or invalid field (`field` names it)", body = ErrorBody),
        (status = 403, body = ErrorBody),
        (status = 409, description = "`If-Match` is not the current version", body = ErrorBody),
        (status = 422, description = "Unknown provider, region or GPU model", body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn put(
    State(app): State<App>,
    caller: Caller,
    Path(team): Path<String>,
    params: Result<Query<ProjectParams>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
    ApiJson(body): ApiJson<PolicyBody>,
) -> Result<Response, ApiError> {
    caller.require(WRITERS)?;
    policy::check_name("team", &team)?;
    let project = project_of(params)?;
    let expected = if_match(&headers)?;
    let regions = app.store.regions().await?;
    let pools = app.store.pools().await?;
    policy::validate(&body, &regions, &pools)?;
    let expected = match expected {
        // `*`: any existing version.
        Some(-1) => match app.store.policy(&team, project.as_deref()).await? {
            Some(r) => Some(r.version),
            None => {
                return Err(ApiError::Conflict(format!(
                    "team {team} has no policy yet (If-Match: *)"
                )));
            }
        },
        other => other,
    };
    let record = app
        .store
        .put_policy(
            &team,
            project.as_deref(),
            &body,
            expected,
            &caller.actor(),
            app.clock.now(),
        )
        .await?
        .map_err(|c| {
            ApiError::Conflict(format!(
                "the policy changed: If-Match {} but the current version is {}",
                expected.unwrap_or(0),
                c.current.map_or("none".to_string(), |v| v.to_string())
            ))
        })?;
    tracing::info!(team = %team, project = ?project, version = record.version, actor = %record.updated_by, "policy saved");
    let status = if record.version == 1 {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok(with_etag(status, &record))
}

/// A what-if that has not finished by then (waiting for its turn included) answers 503.
const WHAT_IF_TIMEOUT_S: u64 = 30;
/// What-ifs run one at a time: each is CPU-bound for up to seconds, and the broker's threads
/// serve agents and the scheduler too.
static WHAT_IF_SLOTS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);

/// Replay the team's recorded jobs (last 30 days) in the simulator under the current policy
/// and under a draft, on the current pools: cost, deadlines met, queueing delay, jobs held.
#[utoipa::path(post, path = "/policies/{team}/what-if", tag = "policies", request_body = PolicyBody,
    params(("team" = String, Path, description = "Team"), ProjectParams),
    responses(
        (status = 200, body = WhatIfReport),
        (status = 400, body = ErrorBody),
        (status = 403, body = ErrorBody),
        (status = 422, body = ErrorBody),
        (status = 503, description = "The simulation took too long", body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn what_if(
    State(app): State<App>,
    caller: Caller,
    Path(team): Path<String>,
    params: Result<Query<ProjectParams>, axum::extract::rejection::QueryRejection>,
    ApiJson(draft): ApiJson<PolicyBody>,
) -> Result<Json<WhatIfReport>, ApiError> {
    caller.require(WRITERS)?;
    policy::check_name("team", &team)?;
    let project = project_of(params)?;
    let regions = app.store.regions().await?;
    let pools = app.store.pools().await?;
    policy::validate(&draft, &regions, &pools)?;
    let now = app.clock.now();
    let since = now.plus_secs(-WHAT_IF_DAYS * 86_400);
    // The draft's waste rule, answered from the recorded attempts (issue 28).
    let waste = match policy::utilization_rule(&draft) {
        Some(rule) => {
            let rows = app
                .store
                .waste_rows(
                    since,
                    now.plus_millis(1),
                    Some(&team),
                    what_if::WHAT_IF_MAX_WASTE_ROWS,
                )
                .await?;
            let rows: Vec<_> = rows
                .into_iter()
                .filter(|r| project.is_none() || r.project == project)
                .collect();
            Some(what_if::waste(&rule, &rows))
        }
        None => None,
    };
    let recorded = app
        .store
        .list_jobs(&JobFilter {
            team: Some(team.clone()),
            limit: WHAT_IF_MAX_JOBS,
            ..JobFilter::default()
        })
        .await?;
    let jobs = what_if::replayed_jobs(recorded, since, project.as_deref());
    let current: Vec<PolicyRecord> = app
        .store
        .policies()
        .await?
        .into_iter()
        .filter(|r| r.team == team)
        .collect();
    let drafted = what_if::drafted(
        &current,
        &team,
        project.as_deref(),
        draft,
        now,
        caller.actor(),
    );
    let nodes = app.store.nodes().await?;
    let world = WhatIfWorld::new(team, project, regions, pools, &nodes, |p| {
        app.config.burst_enabled && app.providers.can_launch(&p.id)
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(WHAT_IF_TIMEOUT_S);
    let too_long = || {
        ApiError::Unavailable(format!(
            "the what-if simulation did not finish within {WHAT_IF_TIMEOUT_S} s; try one \
             project's policy (?project=) instead"
        ))
    };
    let slot = tokio::time::timeout_at(
        tokio::time::Instant::from_std(deadline),
        WHAT_IF_SLOTS.acquire(),
    )
    .await
    .map_err(|_| too_long())?
    .map_err(|e| ApiError::Internal(format!("what-if slots closed: {e}")))?;
    let report = tokio::task::spawn_blocking(move || {
        let _slot = slot;
        let started = std::time::Instant::now();
        let report = what_if::what_if(&world, &jobs, &current, &drafted, deadline);
        tracing::info!(
            team = %world.team,
            jobs = jobs.len(),
            finished = report.is_some(),
            ms = started.elapsed().as_millis() as u64,
            "what-if simulated"
        );
        report
    })
    .await
    .map_err(|e| ApiError::Internal(format!("what-if task failed: {e}")))?;
    let mut report = report.ok_or_else(too_long)?;
    report.waste = waste;
    Ok(Json(report))
}

//! `/api/v1/jobs`: submit, list, read, cancel, logs and the placement explanation.
//! Handlers validate, store and notify the scheduler; they never place anything.

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use switchyard_core::{AttemptId, JobId, JobState, NodeId, Priority, check_satisfiable};
use switchyard_protocol::api::{
    ErrorBody, JobList, JobSpec, JobView, LogPage, PlacementExplanation, Role,
};
use utoipa::IntoParams;
use uuid::Uuid;

use crate::control::scheduler::SchedulerEvent;
use crate::http::auth::Caller;
use crate::http::error::ApiError;
use crate::http::json::ApiJson;
use crate::rules::convert;
use crate::state::App;
use crate::store::{CancelOutcome, IdempotencyKey, IdempotentInsert, JobFilter, JobRecord, NewJob};

/// How long an `Idempotency-Key` names the job its first request created.
pub const IDEMPOTENCY_KEY_TTL_MS: i64 = 24 * 3_600_000;
/// The longest `Idempotency-Key`.
const IDEMPOTENCY_KEY_MAX: usize = 255;

/// Submit a job. With an `Idempotency-Key` header, a retry of the same request (same key and
/// same spec, within 24 hours, from the same team) returns the job the first one created
/// (200) instead of creating another; the same key with another spec is refused (422).
#[utoipa::path(post, path = "/jobs", tag = "jobs", request_body = JobSpec,
    params(("Idempotency-Key" = Option<String>, Header,
        description = "Up to 255 visible ASCII characters; scoped to the token's team (or to the token when it has none), kept 24 hours")),
    responses(
        (status = 200, description = "A retry: the job this `Idempotency-Key` created", body = JobView),
        (status = 201, description = "Accepted and stored", body = JobView),
        (status = 400, description = "Malformed or invalid field", body = ErrorBody),
        (status = 401, description = "No or bad token", body = ErrorBody),
        (status = 403, description = "Not allowed for this role or team", body = ErrorBody),
        (status = 422, description = "No pool can ever run it (`unsatisfiable`), the team's policy never allows it (`policy_violation`), or the `Idempotency-Key` was used with another spec (`idempotency_key_reused`)", body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn submit(
    State(app): State<App>,
    caller: Caller,
    headers: HeaderMap,
    ApiJson(spec): ApiJson<JobSpec>,
) -> Result<(StatusCode, Json<JobView>), ApiError> {
    caller.require(&[Role::Admin, Role::Developer])?;
    if let Some(team) = caller.team_scope()
        && team != spec.team
    {
        return Err(ApiError::Forbidden(format!(
            "this token submits for team {team:?} only"
        )));
    }
    let now = app.clock.now();
    let spec_json = serde_json::to_string(&spec)
        .map_err(|e| ApiError::Internal(format!("serialising a spec: {e}")))?;
    let key = idempotency_key(&headers, &caller, &spec_json)?;
    let since = switchyard_core::Timestamp(now.millis() - IDEMPOTENCY_KEY_TTL_MS);
    // A retry is answered before anything else is checked again: the first answer stands
    // even when a policy changed since.
    if let Some(key) = &key
        && let Some((job, same)) = app.store.idempotent_job(key, since).await?
    {
        return retried(&app, job, same).await;
    }
    let core_spec = convert::job_spec(&spec, now)?;
    let pools = app.store.pools().await?;
    check_satisfiable(&pools, &core_spec)
        .map_err(|u| ApiError::unprocessable(u.field, u.message))?;
    crate::rules::policy::check_submit_against_store(&app.store, &pools, &core_spec, now).await?;
    if let Some(data) = &core_spec.data {
        let regions = app.store.regions().await?;
        if !regions.iter().any(|r| r.id == data.region) {
            return Err(ApiError::unprocessable(
                "data.region",
                format!("unknown region {}", data.region),
            ));
        }
    }
    let id = JobId(Uuid::now_v7());
    // The root of the job's trace (exported only when an OTLP endpoint is configured).
    let span = tracing::info_span!("job.submit", job.id = %id, team = %spec.team);
    let job = NewJob {
        id,
        spec: core_spec,
        spec_json,
        submitted_at: now,
        trace_parent: switchyard_support::telemetry::traceparent(&span),
        replica: None,
    };
    match &key {
        None => tracing::Instrument::instrument(app.store.insert_job(&job), span).await?,
        Some(key) => {
            let insert = app.store.insert_job_idempotent(&job, key, since);
            match tracing::Instrument::instrument(insert, span).await? {
                IdempotentInsert::Inserted => {}
                // Another request with this key won the race.
                IdempotentInsert::Existing { job, same_request } => {
                    return retried(&app, job, same_request).await;
                }
            }
        }
    }
    app.metrics.job_submitted();
    let record = JobRecord {
        id,
        spec: job.spec,
        spec_json: job.spec_json,
        state: JobState::Queued,
        submitted_at: now,
        started_at: None,
        finished_at: None,
        exit_code: None,
        reason: None,
        cancel_requested: false,
        attempts: 0,
        version: 0,
        explanation_json: None,
        placement: None,
        cost: switchyard_core::Money::ZERO,
    };
    let view = convert::job_view(&record)?;
    tracing::info!(job.id = %id, job.team = %record.spec.team, gpus = record.spec.resources.gpus, "job submitted");
    app.scheduler
        .send(SchedulerEvent::JobSubmitted(Box::new(record)));
    Ok((StatusCode::CREATED, Json(view)))
}

/// The request's `Idempotency-Key`, if it sent one: up to 255 visible ASCII characters,
/// scoped to the caller's team (a token without a team: to the token), with a digest of the
/// spec as parsed (so that whitespace or field order do not make a retry "different").
fn idempotency_key(
    headers: &HeaderMap,
    caller: &Caller,
    spec_json: &str,
) -> Result<Option<IdempotencyKey>, ApiError> {
    let Some(value) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    let key = value
        .to_str()
        .ok()
        .filter(|k| {
            !k.is_empty()
                && k.len() <= IDEMPOTENCY_KEY_MAX
                && k.bytes().all(|b| b.is_ascii_graphic())
        })
        .ok_or_else(|| {
            ApiError::invalid(
                "Idempotency-Key",
                format!("must be 1 to {IDEMPOTENCY_KEY_MAX} visible ASCII characters"),
            )
        })?;
    let scope = match &caller.team {
        Some(team) => format!("team:{team}"),
        None => format!("token:{}", caller.token_id),
    };
    Ok(Some(IdempotencyKey {
        scope,
        key: key.to_string(),
        request_hash: hex::encode(Sha256::digest(spec_json.as_bytes())),
    }))
}

/// The answer to a request whose `Idempotency-Key` names `job` already: the job (200) when
/// the spec is the same, else 422.
async fn retried(
    app: &App,
    job: JobId,
    same: bool,
) -> Result<(StatusCode, Json<JobView>), ApiError> {
    if !same {
        return Err(ApiError::IdempotencyKeyReused {
            job: job.to_string(),
        });
    }
    let record =
        app.store.job(job).await?.ok_or_else(|| {
            ApiError::Internal(format!("idempotency key names missing job {job}"))
        })?;
    tracing::info!(job.id = %job, "job submitted again under its idempotency key");
    Ok((StatusCode::OK, Json(convert::job_view(&record)?)))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListParams {
    /// Only jobs in this state.
    state: Option<String>,
    /// Only this team's jobs (developers always see only their own team).
    team: Option<String>,
    /// Only jobs of this priority: `critical`, `high`, `normal` or `low`.
    priority: Option<String>,
    /// Only jobs with this exact name.
    name: Option<String>,
    /// Page size, 1 to 500 (default 50).
    limit: Option<i64>,
    /// `next_cursor` of the previous page.
    cursor: Option<String>,
}

/// List jobs, newest first.
#[utoipa::path(get, path = "/jobs", tag = "jobs", params(ListParams),
    responses(
        (status = 200, body = JobList),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn list(
    State(app): State<App>,
    caller: Caller,
    params: Result<Query<ListParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<JobList>, ApiError> {
    let Query(params) = params?;
    let limit = params.limit.unwrap_or(50);
    if !(1..=500).contains(&limit) {
        return Err(ApiError::invalid("limit", "must be between 1 and 500"));
    }
    let state = match params.state.as_deref() {
        None => None,
        Some(s) => Some(
            JobState::parse(s)
                .ok_or_else(|| ApiError::invalid("state", format!("unknown state {s:?}")))?,
        ),
    };
    let priority = match params.priority.as_deref() {
        None => None,
        Some(p) => Some(Priority::parse(p).ok_or_else(|| {
            ApiError::invalid(
                "priority",
                format!("unknown priority {p:?} (critical, high, normal or low)"),
            )
        })?),
    };
    let before = match params.cursor.as_deref() {
        None | Some("") => None,
        Some(c) => Some(JobId(Uuid::parse_str(c).map_err(|_| {
            ApiError::invalid("cursor", "not a cursor from this API")
        })?)),
    };
    let team = match (caller.team_scope(), params.team) {
        (Some(own), Some(asked)) if own != asked => {
            // A developer asking for another team sees nothing, as if it had no jobs.
            return Ok(Json(JobList {
                jobs: Vec::new(),
                next_cursor: None,
            }));
        }
        (Some(own), _) => Some(own.to_string()),
        (None, asked) => asked,
    };
    let filter = JobFilter {
        team,
        state,
        priority,
        name: params.name,
        before,
        limit,
    };
    let records = app.store.list_jobs(&filter).await?;
    let next_cursor = (records.len() as i64 == limit)
        .then(|| records.last().map(|r| r.id.to_string()))
        .flatten();
    let jobs = records
        .iter()
        .map(convert::job_view)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Json(JobList { jobs, next_cursor }))
}

fn parse_id(id: &str) -> Result<JobId, ApiError> {
    Uuid::parse_str(id)
        .map(JobId)
        .map_err(|_| ApiError::NotFound(format!("job {id}")))
}

/// Loads a job the caller may see; others' jobs are reported as absent.
async fn visible_job(app: &App, caller: &Caller, id: &str) -> Result<JobRecord, ApiError> {
    let id = parse_id(id)?;
    match app.store.job(id).await? {
        Some(job) if caller.can_see_team(&job.spec.team) => Ok(job),
        _ => Err(ApiError::NotFound(format!("job {id}"))),
    }
}

/// Read one job.
#[utoipa::path(get, path = "/jobs/{id}", tag = "jobs",
    params(("id" = String, Path, description = "Job id")),
    responses((status = 200, body = JobView), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn get(
    State(app): State<App>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<JobView>, ApiError> {
    let job = visible_job(&app, &caller, &id).await?;
    let mut view = convert::job_view(&job)?;
    view.runtime_prediction = runtime_prediction(&app, &job).await?;
    Ok(Json(view))
}

/// What the broker predicts a batch job runs now (issue 29); `None` for a service.
async fn runtime_prediction(
    app: &App,
    job: &JobRecord,
) -> Result<Option<switchyard_protocol::api::RuntimePredictionView>, ApiError> {
    if job.spec.kind != switchyard_core::JobKind::Batch {
        return Ok(None);
    }
    let p = app.store.runtime_prediction(&job.spec).await?;
    Ok(Some(convert::prediction_view(&p)))
}

/// Cancel a job. Waiting jobs are cancelled at once; running ones are stopped (SIGTERM, grace,
/// SIGKILL) and become `cancelled` when their agent reports.
#[utoipa::path(post, path = "/jobs/{id}/cancel", tag = "jobs",
    params(("id" = String, Path, description = "Job id")),
    responses(
        (status = 202, description = "Cancelled or stopping", body = JobView),
        (status = 403, description = "Not allowed for this role", body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "Already finished", body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn cancel(
    State(app): State<App>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<(StatusCode, Json<JobView>), ApiError> {
    let job = visible_job(&app, &caller, &id).await?;
    caller.require(&[Role::Admin, Role::Developer])?;
    match app.store.cancel_job(job.id, app.clock.now()).await? {
        CancelOutcome::NotFound => return Err(ApiError::NotFound(format!("job {id}"))),
        CancelOutcome::AlreadyFinished(state) => {
            return Err(ApiError::Conflict(format!(
                "job {id} already finished ({})",
                state.as_str()
            )));
        }
        CancelOutcome::Cancelled { withdrawn } => {
            app.scheduler.send(SchedulerEvent::JobRemoved(job.id));
            withdraw(&app, job.id, withdrawn);
        }
        CancelOutcome::Stopping { nodes, withdrawn } => {
            withdraw(&app, job.id, withdrawn);
            for node in &nodes {
                app.agents.wake(node);
            }
        }
    }
    tracing::info!(job.id = %job.id, "job cancel requested");
    let job = visible_job(&app, &caller, &id).await?;
    Ok((StatusCode::ACCEPTED, Json(convert::job_view(&job)?)))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct LogParams {
    /// Return entries after this offset (`next_after` of the previous page).
    after: Option<i64>,
    /// At most this many entries (default 1000, max 10000).
    limit: Option<i64>,
}

/// Read a job's output (stdout, stderr and agent messages), in order.
#[utoipa::path(get, path = "/jobs/{id}/logs", tag = "jobs",
    params(("id" = String, Path, description = "Job id"), LogParams),
    responses((status = 200, body = LogPage), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn logs(
    State(app): State<App>,
    caller: Caller,
    Path(id): Path<String>,
    params: Result<Query<LogParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<LogPage>, ApiError> {
    let Query(params) = params?;
    let limit = params.limit.unwrap_or(1000);
    if !(1..=10_000).contains(&limit) {
        return Err(ApiError::invalid("limit", "must be between 1 and 10000"));
    }
    let after = params.after.unwrap_or(0);
    if after < 0 {
        return Err(ApiError::invalid(
            "after",
            "must be 0 or more (the `next_after` of the previous page)",
        ));
    }
    // Read the state first: if the job had finished before the read, every entry is in.
    let job = visible_job(&app, &caller, &id).await?;
    let records = app.store.logs(job.id, after, limit).await?;
    let next_after = records.last().map_or(after, |r| r.offset);
    let complete = job.state.is_terminal() && (records.len() as i64) < limit;
    Ok(Json(LogPage {
        job_id: job.id.0,
        entries: records.iter().map(convert::log_entry).collect(),
        next_after,
        complete,
    }))
}

/// Why the job went where it went, or why it waits: every candidate pool with its estimated
/// start, finish and cost, and what ruled it out.
#[utoipa::path(get, path = "/jobs/{id}/placement", tag = "jobs",
    params(("id" = String, Path, description = "Job id")),
    responses(
        (status = 200, body = PlacementExplanation),
        (status = 404, description = "Unknown job, or not planned yet", body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn placement(
    State(app): State<App>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<PlacementExplanation>, ApiError> {
    let job = visible_job(&app, &caller, &id).await?;
    // The plan may work its candidate lists out on this first request: off the runtime.
    let scheduler = app.scheduler.clone();
    let job_id = job.id;
    let planned = tokio::task::spawn_blocking(move || scheduler.explanation(job_id))
        .await
        .map_err(|e| ApiError::Internal(format!("explaining the placement failed: {e}")))?;
    // A job that ran on (or waits for) a node launched for it: the round that chose to
    // launch, which the rounds since (placed on the new node, waiting for it) do not show.
    let node = job.placement.as_ref().map(|p| p.node.to_string());
    let runtime_prediction = runtime_prediction(&app, &job).await?;
    let round = match planned {
        Some(e) => convert::explanation_view(&e),
        None => stored_explanation(&app, &caller, &id, job).await?,
    };
    let launch_round = match app
        .store
        .launch_explanation(job_id, node.as_deref())
        .await?
    {
        Some(text) => {
            let e: switchyard_core::Explanation = serde_json::from_str(&text).map_err(|e| {
                ApiError::Internal(format!("stored launch explanation unreadable: {e}"))
            })?;
            Some(Box::new(convert::explanation_view(&e)))
        }
        None => None,
    };
    Ok(Json(PlacementExplanation {
        launch_round,
        runtime_prediction,
        ..round
    }))
}

/// The explanation stored with a placed job (the scheduler's mirror no longer has it).
async fn stored_explanation(
    app: &App,
    caller: &Caller,
    id: &str,
    job: JobRecord,
) -> Result<PlacementExplanation, ApiError> {
    // The scheduler stores a placed job's explanation, then drops its plan from what was
    // asked above: a row read before the store and a plan dropped since both miss it, so a
    // placed job's row without one is read again.
    let job = match job.explanation_json {
        None if job.placement.is_some() => visible_job(app, caller, id).await?,
        _ => job,
    };
    match job.explanation_json.as_deref() {
        Some(text) => {
            let e: switchyard_core::Explanation = serde_json::from_str(text)
                .map_err(|e| ApiError::Internal(format!("stored explanation unreadable: {e}")))?;
            Ok(convert::explanation_view(&e))
        }
        // Placed, but the broker stopped before it stored the explanation (it is worked out
        // just after the commit).
        None if job.placement.is_some() => Err(ApiError::NotFound(format!(
            "explanation of job {id}'s placement (not recorded)"
        ))),
        None => Err(ApiError::NotFound(format!(
            "placement of job {id} (not planned yet)"
        ))),
    }
}

/// Leases handed out but never started, withdrawn by a cancel: the agents are told, and the
/// scheduler frees the GPUs they held.
fn withdraw(app: &App, job: JobId, withdrawn: Vec<(AttemptId, NodeId)>) {
    if withdrawn.is_empty() {
        return;
    }
    for (_, node) in &withdrawn {
        app.agents.wake(node);
    }
    app.scheduler.send(SchedulerEvent::AttemptsEnded(
        withdrawn
            .into_iter()
            .map(|(attempt, node)| crate::store::EndedAttempt {
                attempt,
                job,
                node,
                final_state: JobState::Cancelled,
            })
            .collect(),
    ));
}

//! `/api/v1/tokens` (admin): API tokens, created, listed and revoked;
//! `/api/v1/enrolment-tokens` (admin, infra): one-time tokens for agents to join a pool;
//! `/api/v1/agent-tokens` (admin, infra): the enrolled agents' tokens, listed and revoked.
//!
//! Who revokes what: only an admin lists or revokes API tokens (they carry roles up to admin,
//! and only an admin creates them); infra, who enrol agents and run the fleet, may also revoke
//! an agent's token — cutting off a machine that looks compromised is an operator's job.
//! Revocation takes effect on the next request: every request looks its token up in the
//! database (no cache).

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use switchyard_core::{NodeId, PoolId, Timestamp};
use switchyard_protocol::api::{
    AgentTokenList, AgentTokenRevoked, AgentTokenView, CreateEnrolmentToken, CreateToken,
    EnrolmentTokenCreated, ErrorBody, Role, TokenCreated, TokenList, TokenView,
};
use uuid::Uuid;

use crate::clock;
use crate::control::scheduler::SchedulerEvent;
use crate::http::auth::{API_TOKEN_PREFIX, Caller, ENROLMENT_TOKEN_PREFIX, hash_token, new_token};
use crate::http::error::ApiError;
use crate::http::json::ApiJson;
use crate::state::App;
use crate::store::{ApiTokenRecord, EnrolmentTokenRecord};

/// Create an API token. The token is shown once; only its hash is stored.
#[utoipa::path(post, path = "/tokens", tag = "auth", request_body = CreateToken,
    responses(
        (status = 201, body = TokenCreated),
        (status = 400, body = ErrorBody),
        (status = 403, body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn create(
    State(app): State<App>,
    caller: Caller,
    ApiJson(req): ApiJson<CreateToken>,
) -> Result<(StatusCode, Json<TokenCreated>), ApiError> {
    caller.require(&[Role::Admin])?;
    // A token's team is the team its jobs are submitted and scoped under: a team name.
    let team = match (req.role, req.team) {
        (Role::Developer, None) => {
            return Err(ApiError::invalid("team", "developer tokens need a team"));
        }
        (_, team) => team,
    };
    if let Some(t) = &team {
        crate::rules::convert::check_slug("team", t)?;
    }
    if let Some(name) = &req.name {
        crate::rules::convert::check_display_name("name", name)?;
    }
    let token = new_token(API_TOKEN_PREFIX);
    let id = Uuid::now_v7();
    let now = app.clock.now();
    app.store
        .insert_api_token(&ApiTokenRecord {
            id,
            token_hash: hash_token(&token),
            role: req.role,
            team: team.clone(),
            name: req.name.clone(),
            created_at: now,
            revoked: false,
        })
        .await?;
    let after = serde_json::json!({
        "id": id, "role": crate::store::role_name(req.role), "team": team, "name": req.name,
    });
    app.store
        .append_audit(&crate::http::api::audit::entry(
            &caller,
            now,
            "token.create",
            format!("token:{id}"),
            None,
            Some(&after),
        ))
        .await?;
    tracing::info!(token.id = %id, role = ?req.role, team = ?team, "api token created");
    Ok((
        StatusCode::CREATED,
        Json(TokenCreated {
            token,
            id,
            role: req.role,
            team,
        }),
    ))
}

/// Create a one-time enrolment token for an agent to join a pool. Audited as
/// `enrolment_token.create` (pool and expiry; never the token).
#[utoipa::path(post, path = "/enrolment-tokens", tag = "auth", request_body = CreateEnrolmentToken,
    responses(
        (status = 201, body = EnrolmentTokenCreated),
        (status = 400, body = ErrorBody),
        (status = 403, body = ErrorBody),
        (status = 422, body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn create_enrolment(
    State(app): State<App>,
    caller: Caller,
    ApiJson(req): ApiJson<CreateEnrolmentToken>,
) -> Result<(StatusCode, Json<EnrolmentTokenCreated>), ApiError> {
    caller.require(&[Role::Admin, Role::Infra])?;
    let ttl = req.ttl_s.unwrap_or(900);
    if !(1..=7 * 24 * 3600).contains(&ttl) {
        return Err(ApiError::invalid("ttl_s", "must be between 1 s and 7 days"));
    }
    let pool = PoolId(req.pool);
    if !app.store.pools().await?.iter().any(|p| p.id == pool) {
        return Err(ApiError::unprocessable(
            "pool",
            format!("unknown pool {pool}"),
        ));
    }
    let now = app.clock.now();
    let (token, record) = issue_enrolment_token(&pool, None, ttl, now);
    app.store.insert_enrolment_token(&record).await?;
    // Who let a machine join which pool, until when (the shape of `audit::system_enrolment`);
    // never the token, nor its hash, which is what a registration looks up.
    let after = serde_json::json!({
        "pool": pool.to_string(),
        "expires_at": clock::to_datetime(record.expires_at),
    });
    app.store
        .append_audit(&crate::http::api::audit::entry(
            &caller,
            now,
            "enrolment_token.create",
            format!("pool:{pool}"),
            None,
            Some(&after),
        ))
        .await?;
    tracing::info!(pool.id = %pool, expires_at = %clock::to_datetime(record.expires_at),
        "enrolment token created");
    Ok((
        StatusCode::CREATED,
        Json(EnrolmentTokenCreated {
            token,
            pool: pool.to_string(),
            expires_at: clock::to_datetime(record.expires_at),
        }),
    ))
}

/// A fresh enrolment token for `pool` (and the launched instance it is for), and the record to
/// store.
pub fn issue_enrolment_token(
    pool: &PoolId,
    instance: Option<&str>,
    ttl_s: i64,
    now: Timestamp,
) -> (String, EnrolmentTokenRecord) {
    let token = new_token(ENROLMENT_TOKEN_PREFIX);
    let record = EnrolmentTokenRecord {
        token_hash: hash_token(&token),
        pool: pool.clone(),
        instance: instance.map(str::to_string),
        created_at: now,
        expires_at: now.plus_secs(ttl_s),
    };
    (token, record)
}

fn token_view(r: &ApiTokenRecord) -> TokenView {
    TokenView {
        id: r.id,
        role: r.role,
        team: r.team.clone(),
        name: r.name.clone(),
        created_at: clock::to_datetime(r.created_at),
        revoked: r.revoked,
    }
}

/// List API tokens, oldest first, revoked ones included. Never shows a token or its hash.
#[utoipa::path(get, path = "/tokens", tag = "auth",
    responses((status = 200, body = TokenList), (status = 403, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list(State(app): State<App>, caller: Caller) -> Result<Json<TokenList>, ApiError> {
    caller.require(&[Role::Admin])?;
    let tokens = app.store.api_tokens().await?;
    Ok(Json(TokenList {
        tokens: tokens.iter().map(token_view).collect(),
    }))
}

/// Revoke an API token: from the next request on it authenticates nothing, and the console
/// sessions signed in with it end. Revoking a revoked token changes nothing (200). Audited as
/// `token.revoke`.
#[utoipa::path(delete, path = "/tokens/{id}", tag = "auth",
    params(("id" = String, Path, description = "Token id (not the token)")),
    responses(
        (status = 200, body = TokenView),
        (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn revoke(
    State(app): State<App>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<TokenView>, ApiError> {
    caller.require(&[Role::Admin])?;
    let id: Uuid = id
        .parse()
        .map_err(|_| ApiError::NotFound(format!("token {id}")))?;
    let now = app.clock.now();
    let before = app
        .store
        .revoke_api_token(id, now)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("token {id}")))?;
    let mut view = token_view(&before);
    if !before.revoked {
        view.revoked = true;
        let state = |revoked: bool| {
            serde_json::json!({
                "id": id, "role": crate::store::role_name(before.role), "team": before.team,
                "name": before.name, "revoked": revoked,
            })
        };
        app.store
            .append_audit(&crate::http::api::audit::entry(
                &caller,
                now,
                "token.revoke",
                format!("token:{id}"),
                Some(&state(false)),
                Some(&state(true)),
            ))
            .await?;
        tracing::info!(token.id = %id, "api token revoked");
    }
    Ok(Json(view))
}

/// List the agent tokens in use: one per enrolled node that is not revoked.
#[utoipa::path(get, path = "/agent-tokens", tag = "auth",
    responses((status = 200, body = AgentTokenList), (status = 403, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list_agent(
    State(app): State<App>,
    caller: Caller,
) -> Result<Json<AgentTokenList>, ApiError> {
    caller.require(&[Role::Admin, Role::Infra])?;
    let nodes = app.store.nodes().await?;
    Ok(Json(AgentTokenList {
        agent_tokens: nodes
            .iter()
            .map(|n| AgentTokenView {
                node: n.id.to_string(),
                pool: n.pool.to_string(),
                hostname: n.hostname.clone(),
                registered_at: clock::to_datetime(n.registered_at),
                last_heartbeat: clock::to_datetime(n.last_heartbeat),
                healthy: n.healthy,
            })
            .collect(),
    }))
}

/// Revoke a node's agent token (admin, infra): the agent's next call gets 401 and it stops;
/// the node leaves the federation and the work it held is requeued at once. 404 for a node
/// that is unknown or already revoked. Audited as `agent_token.revoke`.
#[utoipa::path(delete, path = "/agent-tokens/{node}", tag = "auth",
    params(("node" = String, Path, description = "Node id")),
    responses(
        (status = 200, body = AgentTokenRevoked),
        (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn revoke_agent(
    State(app): State<App>,
    caller: Caller,
    Path(node): Path<String>,
) -> Result<Json<AgentTokenRevoked>, ApiError> {
    caller.require(&[Role::Admin, Role::Infra])?;
    let id = NodeId(node);
    let why = format!("agent token of node {id} revoked");
    let now = app.clock.now();
    let requeued = app
        .store
        .revoke_node(&id, &why, now)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("live agent token of node {id}")))?;
    let requeued: Vec<Uuid> = requeued.into_iter().map(|j| j.0).collect();
    app.store
        .append_audit(&crate::http::api::audit::entry(
            &caller,
            now,
            "agent_token.revoke",
            format!("node:{id}"),
            Some(&serde_json::json!({"node": id.to_string(), "revoked": false})),
            Some(&serde_json::json!({"node": id.to_string(), "revoked": true,
                "requeued": requeued})),
        ))
        .await?;
    tracing::info!(node.id = %id, jobs.requeued = requeued.len(), "agent token revoked");
    // The node and its attempts changed: the scheduler reloads them and re-places the work.
    app.scheduler.send(SchedulerEvent::InstancesChanged);
    Ok(Json(AgentTokenRevoked {
        node: id.to_string(),
        requeued,
    }))
}

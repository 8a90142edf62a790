//! `/api/v1/tokens` (admin): API tokens; `/api/v1/enrolment-tokens` (admin, infra): one-time
//! tokens for agents to join a pool.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use switchyard_core::PoolId;
use switchyard_protocol::api::{
    CreateEnrolmentToken, CreateToken, EnrolmentTokenCreated, ErrorBody, Role, TokenCreated,
};
use uuid::Uuid;

use crate::app::App;
use crate::auth::{API_TOKEN_PREFIX, Caller, ENROLMENT_TOKEN_PREFIX, hash_token, new_token};
use crate::clock;
use crate::error::ApiError;
use crate::json::ApiJson;
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
    let team = match (req.role, req.team) {
        (Role::Developer, None) => {
            return Err(ApiError::invalid("team", "developer tokens need a team"));
        }
        (_, Some(t)) if t.is_empty() || t.len() > 64 => {
            return Err(ApiError::invalid("team", "must be 1 to 64 characters"));
        }
        (_, team) => team,
    };
    let token = new_token(API_TOKEN_PREFIX);
    let id = Uuid::now_v7();
    app.store
        .insert_api_token(&ApiTokenRecord {
            id,
            token_hash: hash_token(&token),
            role: req.role,
            team: team.clone(),
            name: req.name.clone(),
            created_at: clock::now(),
            revoked: false,
        })
        .await?;
    let after = serde_json::json!({
        "id": id, "role": crate::store::role_name(req.role), "team": team, "name": req.name,
    });
    app.store
        .append_audit(&crate::api::audit::entry(
            &caller,
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

/// Create a one-time enrolment token for an agent to join a pool.
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
    let (token, record) = issue_enrolment_token(&pool, None, ttl);
    app.store.insert_enrolment_token(&record).await?;
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
) -> (String, EnrolmentTokenRecord) {
    let token = new_token(ENROLMENT_TOKEN_PREFIX);
    let now = clock::now();
    let record = EnrolmentTokenRecord {
        token_hash: hash_token(&token),
        pool: pool.clone(),
        instance: instance.map(str::to_string),
        created_at: now,
        expires_at: now.plus_secs(ttl_s),
    };
    (token, record)
}

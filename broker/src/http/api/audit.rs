//! `/api/v1/audit` (admin, finance, infra): the append-only log of changes — policies, pools,
//! tokens, budget alerts — newest first.

use axum::Json;
use axum::extract::{Query, State};
use serde::Deserialize;
use switchyard_core::Timestamp;
use switchyard_protocol::api::{AuditEntry, AuditList, ErrorBody, Role};
use utoipa::IntoParams;

use crate::clock;
use crate::http::auth::Caller;
use crate::http::error::ApiError;
use crate::state::App;
use crate::store::{AuditFilter, AuditRecord, NewAuditEntry};

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct AuditParams {
    /// Page size, 1 to 500 (default 100).
    limit: Option<i64>,
    /// `next_cursor` of the previous page.
    cursor: Option<String>,
    /// Only entries about this target, e.g. `policy:ml` or `pool:onprem:sh-dc1/dgx-h100`.
    target: Option<String>,
    /// Only entries by this actor, e.g. `finance:alice` or `system`; a role alone (`finance`)
    /// matches every actor of that role.
    actor: Option<String>,
    /// Only entries of this action, e.g. `policy.update` or `budget.alert`.
    action: Option<String>,
    /// Only entries at or after this time (RFC 3339).
    from: Option<String>,
    /// Only entries before this time (RFC 3339).
    to: Option<String>,
}

fn json_of(text: Option<&str>) -> Option<serde_json::Value> {
    // A row written by this broker is JSON; anything else is shown as the string it is.
    text.map(|t| {
        serde_json::from_str(t).unwrap_or_else(|_| serde_json::Value::String(t.to_string()))
    })
}

pub fn entry_view(r: &AuditRecord) -> AuditEntry {
    AuditEntry {
        id: r.id,
        at: clock::to_datetime(r.at),
        actor: r.actor.clone(),
        action: r.action.clone(),
        target: r.target.clone(),
        before: json_of(r.before_json.as_deref()),
        after: json_of(r.after_json.as_deref()),
    }
}

/// The `enrolment_token.create` audit row of a token the broker minted for an agent it starts
/// itself (`switchyard up`'s agents, burst instances): pool, agent and expiry, never the token.
pub fn system_enrolment(
    actor: &str,
    pool: &switchyard_core::PoolId,
    agent: &str,
    record: &crate::store::EnrolmentTokenRecord,
) -> NewAuditEntry {
    let after = serde_json::json!({
        "pool": pool.to_string(),
        "agent": agent,
        "expires_at": clock::to_datetime(record.expires_at),
    });
    NewAuditEntry {
        at: record.created_at,
        actor: actor.to_string(),
        action: "enrolment_token.create".to_string(),
        target: format!("pool:{pool}"),
        before_json: None,
        after_json: Some(after.to_string()),
    }
}

/// A new audit row for `action` on `target` by `caller` at `at`, with values before and after.
pub fn entry(
    caller: &Caller,
    at: Timestamp,
    action: &str,
    target: String,
    before: Option<&serde_json::Value>,
    after: Option<&serde_json::Value>,
) -> NewAuditEntry {
    NewAuditEntry {
        at,
        actor: caller.actor(),
        action: action.to_string(),
        target,
        before_json: before.map(ToString::to_string),
        after_json: after.map(ToString::to_string),
    }
}

/// The audit log, newest first.
#[utoipa::path(get, path = "/audit", tag = "policies", params(AuditParams),
    responses(
        (status = 200, body = AuditList),
        (status = 400, body = ErrorBody),
        (status = 403, body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn list(
    State(app): State<App>,
    caller: Caller,
    params: Result<Query<AuditParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<AuditList>, ApiError> {
    caller.require(&[Role::Admin, Role::Finance, Role::Infra])?;
    let Query(params) = params?;
    let limit = params.limit.unwrap_or(100);
    if !(1..=500).contains(&limit) {
        return Err(ApiError::invalid("limit", "must be between 1 and 500"));
    }
    let before = match params.cursor.as_deref() {
        None | Some("") => None,
        Some(c) => Some(
            c.parse::<i64>()
                .ok()
                .filter(|v| *v > 0)
                .ok_or_else(|| ApiError::invalid("cursor", "not a cursor from this API"))?,
        ),
    };
    let records = app
        .store
        .audit(&AuditFilter {
            target: params.target.filter(|t| !t.is_empty()),
            actor: params.actor.filter(|t| !t.is_empty()),
            action: params.action.filter(|t| !t.is_empty()),
            from: crate::http::api::spend::time_param("from", params.from.as_deref())?,
            to: crate::http::api::spend::time_param("to", params.to.as_deref())?,
            before,
            limit,
        })
        .await?;
    let next_cursor = (records.len() as i64 == limit)
        .then(|| records.last().map(|r| r.id.to_string()))
        .flatten();
    Ok(Json(AuditList {
        entries: records.iter().map(entry_view).collect(),
        next_cursor,
    }))
}

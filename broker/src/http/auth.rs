//! Bearer tokens and roles. Tokens are 256 random bits shown once; only their SHA-256 is
//! stored, so a database leak yields no usable token. Lookup is by hash, which makes the
//! comparison independent of how much of a guess matches.
//!
//! The console signs in with a token and then authenticates by a session cookie instead (see
//! [`ConsoleSession`]); writes made with the cookie need the session's CSRF token.
//!
//! Every failure to authenticate is a 401 here; `limits.rs` counts those against the client's
//! address, and the extractors tell it (`limits::authenticated`) when a credential proved good.
//!
//! Roles: `admin` (everything), `finance` (policies, budgets, spend; reads jobs), `infra`
//! (pools, instances, enrolment tokens; reads jobs), `developer` (their own team's jobs only).

use axum::extract::FromRequestParts;
use axum::http::header::{AUTHORIZATION, COOKIE};
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method};
use rand::RngCore;
use sha2::{Digest, Sha256};
use switchyard_core::Timestamp;
use switchyard_protocol::api::Role;

use crate::http::error::ApiError;
use crate::state::App;
use crate::store::{ApiTokenRecord, ConsoleSessionRecord};

/// Prefixes say what a token is when it turns up in a log or a paste.
pub const API_TOKEN_PREFIX: &str = "sya_";
pub const AGENT_TOKEN_PREFIX: &str = "syg_";
pub const ENROLMENT_TOKEN_PREFIX: &str = "sye_";

pub fn new_token(prefix: &str) -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    format!("{prefix}{}", hex::encode(bytes))
}

pub fn hash_token(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// The authenticated caller of an API request.
#[derive(Clone, Debug, PartialEq)]
pub struct Caller {
    pub role: Role,
    pub team: Option<String>,
    /// The API token's id and name, for the audit log.
    pub token_id: uuid::Uuid,
    pub token_name: Option<String>,
}

impl Caller {
    /// Who did it, for the audit log: `role:name`, or `role:token-id` for an unnamed token.
    pub fn actor(&self) -> String {
        let who = match &self.token_name {
            Some(n) if !n.is_empty() => n.clone(),
            _ => self.token_id.to_string(),
        };
        format!("{}:{who}", crate::store::role_name(self.role))
    }

    pub fn is_admin(&self) -> bool {
        self.role == Role::Admin
    }

    /// Developers see only their team; everyone else sees all teams.
    pub fn team_scope(&self) -> Option<&str> {
        match self.role {
            Role::Developer => Some(self.team.as_deref().unwrap_or("")),
            _ => None,
        }
    }

    /// Whether the caller may see jobs of `team`. Unseen jobs answer 404, not 403, so that
    /// other teams' job ids do not leak.
    pub fn can_see_team(&self, team: &str) -> bool {
        self.team_scope().is_none_or(|own| own == team)
    }

    pub fn require(&self, allowed: &[Role]) -> Result<(), ApiError> {
        if allowed.contains(&self.role) {
            Ok(())
        } else {
            Err(ApiError::Forbidden(format!(
                "this needs one of the roles {}",
                allowed
                    .iter()
                    .map(|r| crate::store::role_name(*r))
                    .collect::<Vec<_>>()
                    .join(", ")
            )))
        }
    }
}

pub fn bearer(parts: &Parts) -> Option<&str> {
    bearer_of(&parts.headers)
}

/// The bearer token of `Authorization`, if there is one.
pub fn bearer_of(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then_some(token.trim())
        .filter(|t| !t.is_empty())
}

/// The live API token a bearer token names, or 401.
pub async fn api_token(app: &App, token: &str) -> Result<ApiTokenRecord, ApiError> {
    if !token.starts_with(API_TOKEN_PREFIX) {
        return Err(ApiError::Unauthorized);
    }
    app.store
        .api_token_by_hash(&hash_token(token))
        .await?
        .filter(|r| !r.revoked)
        .ok_or(ApiError::Unauthorized)
}

/// The caller an API token authenticates (bearer or console session alike).
pub fn caller_for(record: ApiTokenRecord) -> Caller {
    Caller {
        role: record.role,
        team: record.team,
        token_id: record.id,
        token_name: record.name,
    }
}

/// Authenticates by `Authorization: Bearer` or, without that header, by the console session
/// cookie. Cookie-authenticated writes (anything but GET and HEAD) must carry the session's
/// CSRF token in `X-CSRF-Token`, else 403 `csrf`; bearer requests need none (a browser never
/// adds a bearer header by itself).
impl FromRequestParts<App> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, app: &App) -> Result<Caller, ApiError> {
        if parts.headers.contains_key(AUTHORIZATION) {
            let token = bearer(parts).ok_or(ApiError::Unauthorized)?;
            let record = api_token(app, token).await?;
            crate::http::limits::authenticated(&parts.extensions);
            return Ok(caller_for(record));
        }
        let session = console_session(&parts.headers, app)
            .await?
            .ok_or(ApiError::Unauthorized)?;
        // The cookie is good even when the CSRF token is not: that is no guess at a session.
        crate::http::limits::authenticated(&parts.extensions);
        check_csrf(&parts.method, &parts.headers, &session)?;
        Ok(caller_for(session.token))
    }
}

// ---- Console sessions -------------------------------------------------------------------

/// The session cookie (HttpOnly) and the CSRF cookie (readable by the console's script).
pub const SESSION_COOKIE: &str = "sy_session";
pub const CSRF_COOKIE: &str = "sy_csrf";
pub const CSRF_HEADER: &str = "x-csrf-token";
pub const SESSION_PREFIX: &str = "sys_";
pub const SESSION_TTL_MS: i64 = 12 * 3600 * 1000;

/// A live console session and the API token it acts as.
#[derive(Clone, Debug)]
pub struct ConsoleSession {
    pub session: ConsoleSessionRecord,
    pub token: ApiTokenRecord,
}

/// The value of cookie `name` in the request's `Cookie` headers.
pub fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.trim())
        .filter(|v| !v.is_empty())
}

/// The session the request's cookie names: `None` without a session cookie; 401 when the
/// cookie names no session, or one that expired or was revoked, or whose token was revoked.
pub async fn console_session(
    headers: &HeaderMap,
    app: &App,
) -> Result<Option<ConsoleSession>, ApiError> {
    let Some(id) = cookie(headers, SESSION_COOKIE) else {
        return Ok(None);
    };
    if !id.starts_with(SESSION_PREFIX) {
        return Err(ApiError::Unauthorized);
    }
    let now = app.clock.now();
    let (session, token) = app
        .store
        .console_session(&hash_token(id))
        .await?
        .filter(|(s, t)| s.revoked_at.is_none() && s.expires_at > now && !t.revoked)
        .ok_or(ApiError::Unauthorized)?;
    Ok(Some(ConsoleSession { session, token }))
}

/// Writes made with a session cookie must echo its CSRF token in `X-CSRF-Token`.
pub fn check_csrf(
    method: &Method,
    headers: &HeaderMap,
    session: &ConsoleSession,
) -> Result<(), ApiError> {
    if method == Method::GET || method == Method::HEAD {
        return Ok(());
    }
    let sent = headers
        .get(CSRF_HEADER)
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| ApiError::Csrf("missing X-CSRF-Token header".into()))?;
    // Compare digests so the time taken says nothing about how much of a guess matched.
    if Sha256::digest(sent.as_bytes()) == Sha256::digest(session.session.csrf_token.as_bytes()) {
        Ok(())
    } else {
        Err(ApiError::Csrf(
            "X-CSRF-Token does not match the session".into(),
        ))
    }
}

/// Creates a session for `token`: returns the session id (for the cookie; only its hash is
/// stored) and the stored record.
pub async fn create_console_session(
    app: &App,
    token: &ApiTokenRecord,
) -> Result<(String, ConsoleSessionRecord), ApiError> {
    let id = new_token(SESSION_PREFIX);
    let now = app.clock.now();
    let record = ConsoleSessionRecord {
        id_hash: hash_token(&id),
        api_token_id: token.id,
        csrf_token: new_token(""),
        created_at: now,
        expires_at: Timestamp(now.millis() + SESSION_TTL_MS),
        revoked_at: None,
    };
    app.store.insert_console_session(&record).await?;
    Ok((id, record))
}

//! Bearer tokens and roles. Tokens are 256 random bits shown once; only their SHA-256 is
//! stored, so a database leak yields no usable token. Lookup is by hash, which makes the
//! comparison independent of how much of a guess matches.
//!
//! Roles: `admin` (everything), `finance` (policies, budgets, spend; reads jobs), `infra`
//! (pools, instances, enrolment tokens; reads jobs), `developer` (their own team's jobs only).

use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use rand::RngCore;
use sha2::{Digest, Sha256};
use switchyard_protocol::api::Role;

use crate::app::App;
use crate::error::ApiError;

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
}

impl Caller {
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
    let value = parts.headers.get(AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then_some(token.trim())
        .filter(|t| !t.is_empty())
}

impl FromRequestParts<App> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, app: &App) -> Result<Caller, ApiError> {
        let token = bearer(parts).ok_or(ApiError::Unauthorized)?;
        if !token.starts_with(API_TOKEN_PREFIX) {
            return Err(ApiError::Unauthorized);
        }
        let record = app
            .store
            .api_token_by_hash(&hash_token(token))
            .await?
            .filter(|r| !r.revoked)
            .ok_or(ApiError::Unauthorized)?;
        Ok(Caller {
            role: record.role,
            team: record.team,
        })
    }
}

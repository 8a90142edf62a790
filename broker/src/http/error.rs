//! The one place where failures become HTTP. Client errors keep their detail; server errors
//! become a plain `internal error` and are logged once, here, with their cause.
//!
//! Which error where: handlers return [`ApiError`]; the store returns `StoreError` (converted
//! here); `anyhow` only in `main`, start-up and the CLI.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use switchyard_protocol::api::{ErrorBody, ErrorDetail};

use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 400: the request is malformed or a field is invalid.
    #[error("{message}")]
    BadRequest {
        code: &'static str,
        field: Option<String>,
        message: String,
    },
    #[error("missing or invalid bearer token")]
    Unauthorized,
    #[error("{0}")]
    Forbidden(String),
    /// 403 `csrf`: a cookie-authenticated write without the session's `X-CSRF-Token`.
    #[error("{0}")]
    Csrf(String),
    #[error("{0} not found")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    /// 422: well-formed but cannot be satisfied.
    #[error("{message}")]
    Unprocessable {
        field: Option<String>,
        message: String,
        details: Option<serde_json::Value>,
    },
    /// 422 `invalid_field`: a field of a well-formed body breaks a rule of its own. The
    /// services API answers all bad input so (issue 26), where the jobs API answers 400.
    #[error("{message}")]
    InvalidEntity { field: String, message: String },
    /// 422 `policy_violation`: the team's policy can never allow this request; `field` names
    /// the request field, the message the policy rule.
    #[error("{message}")]
    PolicyViolation { field: String, message: String },
    /// 422 `idempotency_key_reused`: an `Idempotency-Key` already names a job created by a
    /// request with another spec.
    #[error(
        "Idempotency-Key: this key was used within 24 hours for another request (job {job}); \
         use a new key for a new job"
    )]
    IdempotencyKeyReused { job: String },
    #[error("service unavailable: {0}")]
    Unavailable(String),
    /// 408 `request_timeout`: the request's body did not arrive in time.
    #[error("{0}")]
    RequestTimeout(String),
    /// 413 `body_too_large`.
    #[error("{0}")]
    PayloadTooLarge(String),
    /// 429 `rate_limited`, with `Retry-After` (whole seconds).
    #[error("too many requests (or failed sign-ins) from this caller; retry in {retry_after_s} s")]
    TooManyRequests { retry_after_s: u64 },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{0}")]
    Internal(String),
}

impl ApiError {
    /// 400 for one field; the message names the field so it reads well on its own.
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> ApiError {
        let field = field.into();
        ApiError::BadRequest {
            code: "invalid_field",
            message: format!("{field}: {}", message.into()),
            field: Some(field),
        }
    }

    /// 422 for a valid request that cannot be satisfied, naming the field to change.
    pub fn unprocessable(field: impl Into<String>, message: impl Into<String>) -> ApiError {
        let field = field.into();
        ApiError::Unprocessable {
            message: format!("{field}: {}", message.into()),
            field: Some(field),
            details: None,
        }
    }

    /// 422 `invalid_field` for one field of a well-formed body (see [`ApiError::InvalidEntity`]).
    pub fn invalid_entity(field: impl Into<String>, message: impl Into<String>) -> ApiError {
        let field = field.into();
        ApiError::InvalidEntity {
            message: format!("{field}: {}", message.into()),
            field,
        }
    }

    fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            ApiError::BadRequest { code, .. } => (StatusCode::BAD_REQUEST, code),
            ApiError::Unauthorized => (StatusCode::UNAUTHORIZED, "unauthorized"),
            ApiError::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden"),
            ApiError::Csrf(_) => (StatusCode::FORBIDDEN, "csrf"),
            ApiError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            ApiError::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
            ApiError::Unprocessable { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "unsatisfiable"),
            ApiError::InvalidEntity { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_field"),
            ApiError::PolicyViolation { .. } => {
                (StatusCode::UNPROCESSABLE_ENTITY, "policy_violation")
            }
            ApiError::IdempotencyKeyReused { .. } => {
                (StatusCode::UNPROCESSABLE_ENTITY, "idempotency_key_reused")
            }
            ApiError::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            ApiError::RequestTimeout(_) => (StatusCode::REQUEST_TIMEOUT, "request_timeout"),
            ApiError::PayloadTooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "body_too_large"),
            ApiError::TooManyRequests { .. } => (StatusCode::TOO_MANY_REQUESTS, "rate_limited"),
            ApiError::Store(_) | ApiError::Internal(_) => {
                (StatusCode::INTERNAL_SERVER_ERROR, "internal")
            }
        }
    }
}

/// A query string that does not parse (an unknown key, a value of the wrong type): 400
/// `invalid_query` with serde's words, for every route that takes one.
impl From<axum::extract::rejection::QueryRejection> for ApiError {
    fn from(e: axum::extract::rejection::QueryRejection) -> ApiError {
        ApiError::BadRequest {
            code: "invalid_query",
            field: None,
            message: e.body_text(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = self.status_and_code();
        if status.is_server_error() {
            tracing::error!(error = %self, status = status.as_u16(), "request failed");
        }
        let message = if status == StatusCode::INTERNAL_SERVER_ERROR {
            "internal error".to_string()
        } else {
            self.to_string()
        };
        let retry_after = match &self {
            ApiError::TooManyRequests { retry_after_s } => Some(*retry_after_s),
            _ => None,
        };
        let (field, details) = match self {
            ApiError::BadRequest { field, .. } => (field, None),
            ApiError::Unprocessable { field, details, .. } => (field, details),
            ApiError::InvalidEntity { field, .. } => (Some(field), None),
            ApiError::PolicyViolation { field, .. } => (Some(field), None),
            ApiError::IdempotencyKeyReused { .. } => (Some("Idempotency-Key".to_string()), None),
            _ => (None, None),
        };
        let body = ErrorBody {
            error: ErrorDetail {
                code: code.to_string(),
                message,
                field,
                details,
            },
        };
        let mut res = (status, Json(body)).into_response();
        if status == StatusCode::UNAUTHORIZED {
            res.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer"),
            );
        }
        if let Some(secs) = retry_after {
            res.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(secs.max(1)),
            );
        }
        res
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use axum::body::to_bytes;

    /// The one error shape, for every error class: status, code, message, field and details as
    /// clients see them, as a snapshot (a change is a diff to review, never silent).
    #[tokio::test]
    async fn every_error_class_has_the_one_shape() {
        let classes: Vec<(&str, ApiError)> = vec![
            (
                "invalid_field",
                ApiError::invalid("resources.gpus", "must be at least 1"),
            ),
            (
                "invalid_json",
                ApiError::BadRequest {
                    code: "invalid_json",
                    field: None,
                    message: "expected value at line 1 column 1".into(),
                },
            ),
            ("unauthorized", ApiError::Unauthorized),
            (
                "forbidden",
                ApiError::Forbidden("developers may not change policies".into()),
            ),
            ("csrf", ApiError::Csrf("missing X-CSRF-Token".into())),
            ("not_found", ApiError::NotFound("job 0190".into())),
            (
                "conflict",
                ApiError::Conflict("job 0190 already ended".into()),
            ),
            (
                "unsatisfiable",
                ApiError::unprocessable("resources.gpus", "no pool has 64 GPUs per node"),
            ),
            (
                "unsatisfiable_with_details",
                ApiError::Unprocessable {
                    field: Some("regions".into()),
                    message: "regions: no pool in these regions".into(),
                    details: Some(serde_json::json!({"regions": ["aws:nowhere"]})),
                },
            ),
            (
                "invalid_entity",
                ApiError::invalid_entity("replicas.min", "must not exceed replicas.max (8)"),
            ),
            (
                "policy_violation",
                ApiError::PolicyViolation {
                    field: "resources.gpu_models".into(),
                    message: "the team's policy allows only onprem".into(),
                },
            ),
            (
                "idempotency_key_reused",
                ApiError::IdempotencyKeyReused { job: "0190".into() },
            ),
            (
                "unavailable",
                ApiError::Unavailable("not the leader".into()),
            ),
            (
                "request_timeout",
                ApiError::RequestTimeout("body too slow".into()),
            ),
            (
                "body_too_large",
                ApiError::PayloadTooLarge("at most 1 MiB".into()),
            ),
            (
                "rate_limited",
                ApiError::TooManyRequests { retry_after_s: 3 },
            ),
            ("internal", ApiError::Internal("the disk is on fire".into())),
        ];
        let mut shapes = serde_json::Map::new();
        for (name, error) in classes {
            let response = error.into_response();
            let status = response.status().as_u16();
            let retry_after = response
                .headers()
                .get("retry-after")
                .map(|v| v.to_str().unwrap().to_string());
            let body = to_bytes(response.into_body(), 1 << 16).await.unwrap();
            let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
            shapes.insert(
                name.into(),
                serde_json::json!({"status": status, "retry_after": retry_after, "body": body}),
            );
        }
        insta::assert_json_snapshot!("error_shapes", shapes);
    }
}

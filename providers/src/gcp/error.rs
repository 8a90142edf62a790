//! GCE failures, classified by the error's code — an HTTP error's `errors[].reason`, or a zone
//! operation's `error.errors[].code` — and its HTTP status, never by message text. The table
//! is [`class_of`].
//!
//! GCE answers a failed request with
//! `{"error": {"code": 403, "message": "…", "errors": [{"domain": "usageLimits",
//! "reason": "rateLimitExceeded", "message": "…"}]}}`, and a failed asynchronous operation
//! with `Operation.error.errors[] = {code: "ZONE_RESOURCE_POOL_EXHAUSTED", message}` and
//! `httpErrorStatusCode`.

pub(crate) use crate::failure::{Class, Failure};
use serde::Deserialize;

/// Classifies one GCE error code or reason; `status` is the HTTP status (of the answer, or the
/// operation's `httpErrorStatusCode`; 0 when unknown). The code wins over the status: GCE
/// answers rate limits and quota with 403 as well as 429.
pub(crate) fn class_of(code: &str, status: u16) -> Class {
    match code {
        // Stockouts: the zone has no machines of this type (spot or on demand) right now.
        "ZONE_RESOURCE_POOL_EXHAUSTED"
        | "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS"
        | "REGION_RESOURCE_POOL_EXHAUSTED"
        | "RESOURCE_POOL_EXHAUSTED"
        | "STOCKOUT"
        | "resourcePoolExhausted" => Class::Capacity,
        "QUOTA_EXCEEDED" | "quotaExceeded" | "limitExceeded" => Class::Quota,
        "rateLimitExceeded"
        | "userRateLimitExceeded"
        | "RATE_LIMIT_EXCEEDED"
        | "RESOURCE_OPERATION_RATE_EXCEEDED" => Class::Throttled,
        "required" if status == 401 => Class::Auth,
        "authError"
        | "forbidden"
        | "insufficientPermissions"
        | "accessNotConfigured"
        | "PERMISSIONS_ERROR"
        | "SERVICE_ACCOUNT_ACCESS_DENIED" => Class::Auth,
        "notFound" | "RESOURCE_NOT_FOUND" => Class::NotFound,
        "backendError" | "internalError" | "INTERNAL_ERROR" | "serviceUnavailable" => {
            Class::Transient
        }
        _ if status == 429 => Class::Throttled,
        _ if status >= 500 => Class::Transient,
        _ if status == 401 || status == 403 => Class::Auth,
        _ if status == 404 => Class::NotFound,
        _ => Class::Rejected,
    }
}

#[derive(Deserialize, Default)]
struct ErrorBody {
    #[serde(default)]
    error: ErrorObject,
}

#[derive(Deserialize, Default)]
struct ErrorObject {
    #[serde(default)]
    message: String,
    #[serde(default)]
    errors: Vec<ErrorItem>,
}

#[derive(Deserialize, Default)]
struct ErrorItem {
    #[serde(default)]
    reason: String,
}

/// Classifies a GCE HTTP error answer (status and body).
pub(crate) fn from_http(status: u16, body: &[u8]) -> Failure {
    let parsed: ErrorBody = serde_json::from_slice(body).unwrap_or_default();
    let reason = parsed
        .error
        .errors
        .iter()
        .map(|e| e.reason.as_str())
        .find(|r| !r.is_empty());
    let class = class_of(reason.unwrap_or(""), status);
    let message = if parsed.error.message.is_empty() {
        format!("HTTP {status}")
    } else {
        parsed.error.message
    };
    Failure {
        class,
        code: reason.map(str::to_owned),
        message,
    }
}

/// The error of a failed operation: its first error's code decides the class.
#[derive(Deserialize, Default, Debug, Clone)]
pub(crate) struct OperationError {
    #[serde(default)]
    pub errors: Vec<OperationErrorItem>,
}

#[derive(Deserialize, Default, Debug, Clone)]
pub(crate) struct OperationErrorItem {
    #[serde(default)]
    pub code: String,
    #[serde(default)]
    pub message: String,
}

pub(crate) fn from_operation(error: &OperationError, http_status: Option<u16>) -> Failure {
    let status = http_status.unwrap_or(0);
    // A stockout, quota or throttling code anywhere in the list decides; else the first.
    let decisive = error
        .errors
        .iter()
        .find(|e| {
            matches!(
                class_of(&e.code, 0),
                Class::Capacity | Class::Quota | Class::Throttled
            )
        })
        .or_else(|| error.errors.first());
    match decisive {
        Some(e) => Failure {
            class: class_of(&e.code, status),
            code: Some(e.code.clone()),
            message: e.message.clone(),
        },
        None => Failure::new(
            class_of("", status),
            "the operation failed without an error",
        ),
    }
}

/// A request that got no HTTP answer (connection refused or dropped, timeout).
pub(crate) fn transport(what: &str, err: &reqwest::Error) -> Failure {
    let kind = if err.is_timeout() {
        "timed out"
    } else if err.is_connect() {
        "could not connect"
    } else {
        "failed"
    };
    // The URL is left out of the message on purpose (`without_url`): it is logged.
    let detail = format!("{}", ReqwestDetail(err));
    Failure::new(Class::Transient, format!("{what} {kind}: {detail}"))
}

struct ReqwestDetail<'a>(&'a reqwest::Error);

impl std::fmt::Display for ReqwestDetail<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use std::error::Error as _;
        let mut source = self.0.source();
        let mut first = true;
        while let Some(s) = source {
            if !first {
                f.write_str(": ")?;
            }
            write!(f, "{s}")?;
            first = false;
            source = s.source();
        }
        if first {
            f.write_str("no detail")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_map_to_classes() {
        let cases = [
            ("ZONE_RESOURCE_POOL_EXHAUSTED", 0, Class::Capacity),
            (
                "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
                503,
                Class::Capacity,
            ),
            ("STOCKOUT", 0, Class::Capacity),
            ("resourcePoolExhausted", 503, Class::Capacity),
            ("QUOTA_EXCEEDED", 403, Class::Quota),
            ("quotaExceeded", 403, Class::Quota),
            ("rateLimitExceeded", 403, Class::Throttled),
            ("userRateLimitExceeded", 403, Class::Throttled),
            ("rateLimitExceeded", 429, Class::Throttled),
            ("RESOURCE_OPERATION_RATE_EXCEEDED", 0, Class::Throttled),
            ("", 429, Class::Throttled),
            ("authError", 401, Class::Auth),
            ("forbidden", 403, Class::Auth),
            ("accessNotConfigured", 403, Class::Auth),
            ("", 401, Class::Auth),
            ("notFound", 404, Class::NotFound),
            ("", 404, Class::NotFound),
            ("backendError", 500, Class::Transient),
            ("somethingNew", 503, Class::Transient),
            ("invalid", 400, Class::Rejected),
            ("badRequest", 400, Class::Rejected),
            ("alreadyExists", 409, Class::Rejected),
            ("INVALID_FIELD_VALUE", 400, Class::Rejected),
        ];
        for (code, status, class) in cases {
            assert_eq!(class_of(code, status), class, "{code} {status}");
        }
    }

    #[test]
    fn http_error_bodies_are_read_by_reason() {
        let body = br#"{"error":{"code":403,"message":"Rate Limit Exceeded","errors":[{"domain":"usageLimits","reason":"rateLimitExceeded","message":"Rate Limit Exceeded"}]}}"#;
        let f = from_http(403, body);
        assert_eq!(f.class, Class::Throttled);
        assert_eq!(f.code.as_deref(), Some("rateLimitExceeded"));
        let f = from_http(502, b"<html>bad gateway</html>");
        assert_eq!(
            (f.class, f.message.as_str()),
            (Class::Transient, "HTTP 502")
        );
        let quota = br#"{"error":{"code":403,"message":"Quota 'GPUS_ALL_REGIONS' exceeded. Limit: 0.0 globally.","errors":[{"domain":"usageLimits","reason":"quotaExceeded","message":"Quota exceeded"}]}}"#;
        assert_eq!(from_http(403, quota).class, Class::Quota);
    }

    #[test]
    fn operation_errors_are_read_by_code() {
        let error = OperationError {
            errors: vec![
                OperationErrorItem {
                    code: "RESOURCE_NOT_READY".into(),
                    message: "m1".into(),
                },
                OperationErrorItem {
                    code: "ZONE_RESOURCE_POOL_EXHAUSTED".into(),
                    message: "The zone does not have enough resources".into(),
                },
            ],
        };
        let f = from_operation(&error, Some(503));
        assert_eq!(f.class, Class::Capacity);
        assert_eq!(f.code.as_deref(), Some("ZONE_RESOURCE_POOL_EXHAUSTED"));
        let f = from_operation(
            &OperationError {
                errors: vec![OperationErrorItem {
                    code: "INVALID_USAGE".into(),
                    message: "bad".into(),
                }],
            },
            Some(400),
        );
        assert_eq!(f.class, Class::Rejected);
        assert_eq!(
            from_operation(&OperationError::default(), Some(500)).class,
            Class::Transient
        );
    }
}

//! Azure failures, classified by ARM's error code (`{"error": {"code", "message"}}`, in an
//! answer or inside a failed `Azure-AsyncOperation`) and the HTTP status, never by message text.
//! The table is [`class_of_code`]; token endpoint errors (OAuth2 `error`) are [`class_of_oauth`].

pub(crate) use crate::failure::{Class, Failure};
use serde_json::Value;

/// Classifies an ARM error code; `status` is the HTTP status of the answer (0 for the error of
/// a failed asynchronous operation, which came with a 200).
pub(crate) fn class_of_code(code: &str, status: u16) -> Class {
    match code {
        "SkuNotAvailable"
        | "AllocationFailed"
        | "ZonalAllocationFailed"
        | "OverconstrainedAllocationRequest"
        | "OverconstrainedZonalAllocationRequest"
        | "AllocationFailedVMSeriesNotAvailable" => Class::Capacity,
        "QuotaExceeded" | "OperationNotAllowed" => Class::Quota,
        "TooManyRequests" | "SubscriptionRequestsThrottled" | "ResourceRequestsThrottled" => {
            Class::Throttled
        }
        "AuthenticationFailed"
        | "AuthorizationFailed"
        | "InvalidAuthenticationToken"
        | "InvalidAuthenticationTokenTenant"
        | "ExpiredAuthenticationToken"
        | "LinkedAuthorizationFailed"
        | "SubscriptionNotFound" => Class::Auth,
        "NotFound" | "ResourceNotFound" => Class::NotFound,
        "InternalServerError"
        | "InternalExecutionError"
        | "InternalOperationError"
        | "ServiceUnavailable"
        | "GatewayTimeout"
        | "RetryableError"
        | "AnotherOperationInProgress" => Class::Transient,
        _ if status == 429 => Class::Throttled,
        _ if status >= 500 => Class::Transient,
        _ if status == 401 || status == 403 => Class::Auth,
        // A 404 without a code is the resource itself; a coded one (ImageNotFound,
        // ResourceGroupNotFound…) is a missing dependency that no retry mends.
        "" if status == 404 => Class::NotFound,
        _ => Class::Rejected,
    }
}

/// Classifies an answer of the token endpoint (OAuth2 error codes, RFC 6749 §5.2).
pub(crate) fn class_of_oauth(code: &str, status: u16) -> Class {
    match code {
        _ if status == 429 => Class::Throttled,
        "temporarily_unavailable" | "server_error" => Class::Transient,
        _ if status >= 500 => Class::Transient,
        // invalid_client, unauthorized_client, invalid_grant, invalid_scope, invalid_request:
        // the credentials or the tenant are wrong; retrying cannot help.
        _ => Class::Auth,
    }
}

/// `(code, message)` of an ARM error body (`{"error": {"code", "message"}}`, or the bare
/// `{"code", "message"}` some services answer).
pub(crate) fn arm_error(body: &Value) -> Option<(String, String)> {
    let e = body.get("error").unwrap_or(body);
    let code = e.get("code")?.as_str()?.to_owned();
    let message = e
        .get("message")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    Some((code, message))
}

/// A failed ARM answer as a [`Failure`].
pub(crate) fn from_arm(status: u16, body: &Value) -> Failure {
    match arm_error(body) {
        Some((code, message)) => Failure {
            class: class_of_code(&code, status),
            code: Some(code),
            message,
        },
        None => Failure::new(class_of_code("", status), format!("HTTP {status}")),
    }
}

/// A failed token answer as a [`Failure`]; the description is AAD's, which never holds the
/// secret.
pub(crate) fn from_oauth(status: u16, body: &Value) -> Failure {
    let code = body.get("error").and_then(Value::as_str).map(str::to_owned);
    let message = body
        .get("error_description")
        .and_then(Value::as_str)
        .map_or_else(
            || format!("token endpoint answered HTTP {status}"),
            |d| d.lines().next().unwrap_or_default().to_owned(),
        );
    Failure {
        class: class_of_oauth(code.as_deref().unwrap_or(""), status),
        code,
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ProviderError;
    use serde_json::json;
    use switchyard_core::PoolId;

    #[test]
    fn arm_codes_map_to_classes() {
        let cases = [
            ("SkuNotAvailable", 409, Class::Capacity),
            ("AllocationFailed", 0, Class::Capacity),
            ("ZonalAllocationFailed", 0, Class::Capacity),
            ("OverconstrainedAllocationRequest", 409, Class::Capacity),
            ("QuotaExceeded", 409, Class::Quota),
            ("OperationNotAllowed", 409, Class::Quota),
            ("TooManyRequests", 429, Class::Throttled),
            ("SomethingNew", 429, Class::Throttled),
            ("AuthenticationFailed", 401, Class::Auth),
            ("AuthorizationFailed", 403, Class::Auth),
            ("ExpiredAuthenticationToken", 401, Class::Auth),
            ("SomethingNew", 403, Class::Auth),
            ("ResourceNotFound", 404, Class::NotFound),
            ("InternalServerError", 500, Class::Transient),
            ("InternalExecutionError", 0, Class::Transient),
            ("SomethingNew", 503, Class::Transient),
            ("InvalidParameter", 400, Class::Rejected),
            ("ImageNotFound", 404, Class::Rejected),
            ("ResourceGroupNotFound", 404, Class::Rejected),
            ("", 404, Class::NotFound),
            ("SomethingNew", 0, Class::Rejected),
        ];
        for (code, status, class) in cases {
            assert_eq!(class_of_code(code, status), class, "{code} {status}");
        }
    }

    #[test]
    fn oauth_errors_map_to_classes() {
        let cases = [
            ("invalid_client", 401, Class::Auth),
            ("unauthorized_client", 400, Class::Auth),
            ("invalid_scope", 400, Class::Auth),
            ("temporarily_unavailable", 503, Class::Transient),
            ("", 500, Class::Transient),
            ("", 429, Class::Throttled),
        ];
        for (code, status, class) in cases {
            assert_eq!(class_of_oauth(code, status), class, "{code} {status}");
        }
    }

    #[test]
    fn error_bodies_give_code_and_message() {
        let body = json!({"error": {"code": "AllocationFailed", "message": "no room"}});
        let f = from_arm(200, &body);
        assert_eq!(
            (f.class, f.code.as_deref(), f.message.as_str()),
            (Class::Capacity, Some("AllocationFailed"), "no room")
        );
        let f = from_arm(502, &json!("<html>bad gateway</html>"));
        assert_eq!((f.class, f.code), (Class::Transient, None));
        let f = from_oauth(
            401,
            &json!({"error": "invalid_client", "error_description": "AADSTS7000215: Invalid client secret provided.\r\nTrace ID: x"}),
        );
        assert_eq!(f.class, Class::Auth);
        assert_eq!(f.message, "AADSTS7000215: Invalid client secret provided.");
    }

    #[test]
    fn provider_errors_name_the_pool() {
        let pool = PoolId::new("azure:eastus/Standard_NC24ads_A100_v4");
        let f = from_arm(
            409,
            &json!({"error": {"code": "QuotaExceeded", "message": "cores"}}),
        );
        match f.into_provider_error(Some(&pool)) {
            ProviderError::Quota { pool: p, message } => {
                assert_eq!(p, pool);
                assert_eq!(message, "QuotaExceeded: cores");
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}

//! Lambda Cloud's errors, classified by their `error.code` (never by message text, which Lambda
//! says may change) and the HTTP status. Error bodies are
//! `{"error": {"code": "...", "message": "...", "suggestion": "..."}}`.

pub use crate::failure::{Class, Failure};
use serde::Deserialize;

#[derive(Deserialize)]
struct Envelope {
    error: Body,
}

#[derive(Deserialize)]
struct Body {
    code: String,
    #[serde(default)]
    message: String,
}

/// The class of an answer with `status` and the error `code` it carried, if any.
///
/// | code / status | class |
/// | --- | --- |
/// | `…/insufficient-capacity` | capacity |
/// | `global/quota-exceeded`, `…/quota-exceeded` | quota |
/// | 429 | throttled |
/// | `global/invalid-api-key`, `global/account-inactive`, `global/forbidden`, 401, 403 | auth |
/// | `global/object-does-not-exist`, `global/not-found`, 404 | not found |
/// | `global/internal-error`, `provider/…` (upstream outages), 5xx | transient |
/// | any other 4xx (`global/invalid-parameters`, `…/file-system-in-wrong-region`…) | rejected |
///
/// A 403 with another code (`global/invalid-address`: the account may not launch) is auth too.
pub fn classify(status: u16, code: Option<&str>) -> Class {
    if let Some(code) = code {
        if code.ends_with("/insufficient-capacity") {
            return Class::Capacity;
        }
        if code.ends_with("/quota-exceeded") {
            return Class::Quota;
        }
        if status == 429 {
            return Class::Throttled;
        }
        match code {
            "global/invalid-api-key" | "global/account-inactive" | "global/forbidden" => {
                return Class::Auth;
            }
            "global/object-does-not-exist" | "global/not-found" => return Class::NotFound,
            "global/internal-error" => return Class::Transient,
            c if c.starts_with("provider/") => return Class::Transient,
            _ => {}
        }
    }
    match status {
        429 => Class::Throttled,
        401 | 403 => Class::Auth,
        404 => Class::NotFound,
        408 => Class::Transient,
        s if s >= 500 => Class::Transient,
        _ => Class::Rejected,
    }
}

/// The failure an error answer stands for; `body` is the answer's text (not JSON for some
/// gateways' 429s and 5xx).
pub fn from_answer(status: u16, body: &str) -> Failure {
    let parsed: Option<Envelope> = serde_json::from_str(body).ok();
    let code = parsed.as_ref().map(|e| e.error.code.clone());
    let message = match &parsed {
        Some(e) => e.error.message.clone(),
        None => format!("HTTP {status}"),
    };
    Failure {
        class: classify(status, code.as_deref()),
        code,
        message,
    }
}

/// A request that got no answer: a timeout, a refused or dropped connection.
pub fn from_transport(e: &reqwest::Error) -> Failure {
    let what = if e.is_timeout() {
        "request timed out"
    } else if e.is_connect() {
        "could not connect"
    } else {
        "request failed"
    };
    // reqwest's Display names the URL, which carries no secret here (the key is a header).
    Failure::new(Class::Transient, format!("{what}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_statuses_map_to_classes() {
        let table: &[(u16, Option<&str>, Class)] = &[
            (
                400,
                Some("instance-operations/launch/insufficient-capacity"),
                Class::Capacity,
            ),
            (400, Some("global/quota-exceeded"), Class::Quota),
            (
                400,
                Some("instance-operations/launch/quota-exceeded"),
                Class::Quota,
            ),
            (429, None, Class::Throttled),
            (429, Some("global/invalid-parameters"), Class::Throttled),
            (401, Some("global/invalid-api-key"), Class::Auth),
            (403, Some("global/account-inactive"), Class::Auth),
            (403, Some("global/forbidden"), Class::Auth),
            (401, None, Class::Auth),
            (403, None, Class::Auth),
            (404, Some("global/object-does-not-exist"), Class::NotFound),
            (400, Some("global/object-does-not-exist"), Class::NotFound),
            (404, Some("global/not-found"), Class::NotFound),
            (404, None, Class::NotFound),
            (500, Some("global/internal-error"), Class::Transient),
            (503, Some("provider/internal-unavailable"), Class::Transient),
            (400, Some("provider/internal-unavailable"), Class::Transient),
            (502, None, Class::Transient),
            (408, None, Class::Transient),
            (400, Some("global/invalid-parameters"), Class::Rejected),
            (
                400,
                Some("instance-operations/launch/file-system-in-wrong-region"),
                Class::Rejected,
            ),
            (403, Some("global/invalid-address"), Class::Auth),
            (409, Some("global/conflict"), Class::Rejected),
            (400, None, Class::Rejected),
        ];
        for (status, code, class) in table {
            assert_eq!(classify(*status, *code), *class, "{status} {code:?}");
        }
    }

    #[test]
    fn error_bodies_are_parsed_and_non_json_bodies_tolerated() {
        let f = from_answer(
            400,
            r#"{"error":{"code":"instance-operations/launch/insufficient-capacity","message":"Not enough capacity","suggestion":"Try another region"}}"#,
        );
        assert_eq!(f.class, Class::Capacity);
        assert_eq!(
            f.code.as_deref(),
            Some("instance-operations/launch/insufficient-capacity")
        );
        assert_eq!(f.message, "Not enough capacity");
        let f = from_answer(429, "Too Many Requests");
        assert_eq!((f.class, f.code), (Class::Throttled, None));
        let f = from_answer(502, "<html>bad gateway</html>");
        assert_eq!(f.class, Class::Transient);
    }
}

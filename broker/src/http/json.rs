//! A JSON extractor that reports errors in the one error shape and names the field at fault
//! (`resources.gpus: invalid type: string "x", expected i64`), and refuses a body that holds
//! more than one JSON value. Every JSON body the broker reads (the REST API, the agent
//! protocol, the console's sign-in) goes through [`parse`].

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::header;
use serde::de::DeserializeOwned;

use crate::http::error::ApiError;

/// Like `axum::Json`, with errors as [`ApiError`].
#[derive(Debug, Clone, Copy, Default)]
pub struct ApiJson<T>(pub T);

impl<S, T> FromRequest<S> for ApiJson<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let is_json = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| {
                let ct = ct.trim().to_ascii_lowercase();
                ct.starts_with("application/json") || ct.contains("+json")
            });
        if !is_json {
            return Err(ApiError::BadRequest {
                code: "unsupported_media_type",
                field: None,
                message: "expected `Content-Type: application/json`".into(),
            });
        }
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            let too_large = e.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE;
            ApiError::BadRequest {
                code: if too_large {
                    "body_too_large"
                } else {
                    "bad_body"
                },
                field: None,
                message: if too_large {
                    "request body is over the 1 MiB limit".into()
                } else {
                    format!("could not read the body: {e}")
                },
            }
        })?;
        parse(&bytes).map(ApiJson)
    }
}

/// Parses one JSON value, naming the path of the offending field. Anything but whitespace
/// after the value (`{…}xyz`, or a second object) is malformed: a body means one thing, and a
/// proxy or logger that reads only the first value must not see another request than we do.
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = deserialize(&mut de)?;
    de.end().map_err(|e| ApiError::BadRequest {
        code: "malformed_json",
        field: None,
        message: format!("trailing data after the JSON value: {e}"),
    })?;
    Ok(value)
}

fn deserialize<'de, T: DeserializeOwned>(
    de: &mut serde_json::Deserializer<serde_json::de::SliceRead<'de>>,
) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let syntax = inner.is_syntax() || inner.is_eof();
        let field = (!syntax && path != "." && !path.is_empty()).then_some(path);
        ApiError::BadRequest {
            code: if syntax {
                "malformed_json"
            } else {
                "invalid_field"
            },
            message: match &field {
                Some(f) => format!("{f}: {inner}"),
                None => inner.to_string(),
            },
            field,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    struct Body {
        #[allow(dead_code)]
        a: u32,
    }

    fn code(bytes: &[u8]) -> Option<&'static str> {
        match parse::<Body>(bytes) {
            Ok(_) => None,
            Err(ApiError::BadRequest { code, .. }) => Some(code),
            Err(e) => panic!("unexpected error {e:?}"),
        }
    }

    #[test]
    fn one_value_with_whitespace_around_it_parses() {
        assert_eq!(code(b" {\"a\": 1}\n\t "), None);
    }

    #[test]
    fn trailing_data_or_a_second_value_is_malformed() {
        for body in [
            &b"{\"a\": 1}xyz"[..],
            b"{\"a\": 1}{}",
            b"{\"a\": 1} {\"a\": 2}",
            b"{\"a\": 1}\0",
        ] {
            assert_eq!(code(body), Some("malformed_json"), "{body:?}");
        }
    }
}

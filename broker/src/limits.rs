//! Hostile input, in front of every route: a request rate per credential, a bound on the body's
//! size and on the time it takes to arrive, and the security headers every response carries.
//! Rejections use the one error shape (`ApiError`).
//!
//! - **Rate** (`rate_limit_per_s`, `rate_limit_burst`): one GCRA bucket (the `governor` crate)
//!   per credential — the bearer token, else the console session cookie — keyed by a digest of
//!   it, checked before anything else (no database lookup for a throttled caller). Beyond it:
//!   429 `rate_limited` with `Retry-After`. Requests without a credential are not counted (the
//!   probes; agent enrolment and console sign-in carry their secret in the body).
//! - **Size**: `max_body_bytes` for the API and the console, `agent_max_body_bytes` for the
//!   agent protocol (event batches carry job output). A declared `Content-Length` over the
//!   limit is refused before reading; a chunked body when it crosses it: 413 `body_too_large`.
//! - **Time** (`body_timeout_ms`): the whole body must arrive within this time after the
//!   headers, else 408 `request_timeout` and the connection is closed. The body is read here,
//!   into memory (within the size limit), so that handlers never wait on a slow client.
//!   Requests without a body (every GET, the agents' work long-poll among them) pass at once.
//! - **Headers**: `X-Content-Type-Options: nosniff`, `X-Frame-Options: DENY`,
//!   `Referrer-Policy: no-referrer`, and a `Content-Security-Policy` of `default-src 'none';
//!   frame-ancestors 'none'` where the route set none (the console sets its own); HSTS when the
//!   public URL is https.
//!
//! Not here: the bounds on how long the TLS handshake and the request *headers* may take,
//! and on idle connections, which are the connection loop's (`server.rs`).

use axum::body::{Body, HttpBody};
use axum::extract::{Request, State};
use axum::http::header::{
    CONNECTION, CONTENT_SECURITY_POLICY, REFERRER_POLICY, STRICT_TRANSPORT_SECURITY,
    X_CONTENT_TYPE_OPTIONS, X_FRAME_OPTIONS,
};
use axum::http::request::Parts;
use axum::http::{HeaderName, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use governor::clock::Clock;
use governor::{DefaultKeyedRateLimiter, Quota};
use sha2::{Digest, Sha256};
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::auth;
use crate::config::Config;
use crate::error::ApiError;

/// The CSP of responses whose route sets none: they are data, never a page to frame or run.
pub const API_CSP: &str = "default-src 'none'; frame-ancestors 'none'";

/// Forgotten buckets (full again, so indistinguishable from new ones) are dropped every this
/// many checks, so that a flood of made-up tokens cannot grow the table without bound.
const RETAIN_EVERY: u64 = 4096;

/// The limits of one router, from the config.
pub struct Limits {
    api_body_bytes: usize,
    agent_body_bytes: usize,
    body_timeout: Duration,
    limiter: Option<DefaultKeyedRateLimiter<u128>>,
    checks: AtomicU64,
}

impl std::fmt::Debug for Limits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limits")
            .field("api_body_bytes", &self.api_body_bytes)
            .field("agent_body_bytes", &self.agent_body_bytes)
            .field("body_timeout", &self.body_timeout)
            .field("rate_limited", &self.limiter.is_some())
            .finish()
    }
}

impl Limits {
    pub fn from_config(config: &Config) -> Limits {
        let limiter = NonZeroU32::new(config.rate_limit_per_s).map(|rate| {
            let burst = NonZeroU32::new(config.rate_limit_burst).unwrap_or(rate);
            DefaultKeyedRateLimiter::keyed(Quota::per_second(rate).allow_burst(burst))
        });
        Limits {
            api_body_bytes: config.max_body_bytes,
            agent_body_bytes: config.agent_max_body_bytes.max(config.max_body_bytes),
            body_timeout: Duration::from_millis(config.body_timeout_ms.max(1)),
            limiter,
            checks: AtomicU64::new(0),
        }
    }

    /// The largest body any route accepts (for axum's own extractor limit behind this one).
    pub fn largest_body(&self) -> usize {
        self.api_body_bytes.max(self.agent_body_bytes)
    }

    fn body_limit(&self, path: &str) -> usize {
        if path.starts_with("/agent/") {
            self.agent_body_bytes
        } else {
            self.api_body_bytes
        }
    }

    /// Counts one request against `key`'s bucket.
    fn check_rate(&self, key: u128) -> Result<(), ApiError> {
        let Some(limiter) = &self.limiter else {
            return Ok(());
        };
        if self.checks.fetch_add(1, Ordering::Relaxed) % RETAIN_EVERY == RETAIN_EVERY - 1 {
            limiter.retain_recent();
            limiter.shrink_to_fit();
        }
        limiter.check_key(&key).map_err(|not_until| {
            let wait = not_until.wait_time_from(limiter.clock().now());
            ApiError::TooManyRequests {
                retry_after_s: wait.as_millis().div_ceil(1000).max(1) as u64,
            }
        })
    }
}

/// The credential a request presents, as the key of its rate bucket: a digest, so the table
/// holds no usable secret. The bearer token as the auth extractor reads it (so `Bearer` in
/// another case or extra spaces do not make a new bucket), else the whole `Authorization`
/// value, else the console session cookie.
fn credential_key(parts: &Parts) -> Option<u128> {
    let secret: &[u8] = if let Some(token) = auth::bearer(parts) {
        token.as_bytes()
    } else if let Some(value) = parts.headers.get(axum::http::header::AUTHORIZATION) {
        value.as_bytes()
    } else {
        auth::cookie(&parts.headers, auth::SESSION_COOKIE)?.as_bytes()
    };
    let digest = Sha256::digest(secret);
    let mut key = [0u8; 16];
    key.copy_from_slice(&digest[..16]);
    Some(u128::from_le_bytes(key))
}

/// The middleware: rate, then body size and time; then the route.
pub async fn guard(State(limits): State<Arc<Limits>>, req: Request, next: Next) -> Response {
    let (parts, body) = req.into_parts();
    if let Some(key) = credential_key(&parts)
        && let Err(e) = limits.check_rate(key)
    {
        return refuse(e, !body.is_end_stream());
    }
    let limit = limits.body_limit(parts.uri.path());
    let deadline = tokio::time::Instant::now() + limits.body_timeout;
    match read_body(body, limit, deadline).await {
        Ok(body) => next.run(Request::from_parts(parts, body)).await,
        Err(e) => refuse(e, true),
    }
}

/// The error response; with `close`, the connection is closed after it (the rest of the body
/// is never read).
fn refuse(e: ApiError, close: bool) -> Response {
    let mut res = e.into_response();
    if close {
        res.headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
    }
    res
}

/// The whole body, at most `limit` bytes, by `deadline`.
async fn read_body(
    body: Body,
    limit: usize,
    deadline: tokio::time::Instant,
) -> Result<Body, ApiError> {
    if body.is_end_stream() {
        return Ok(body);
    }
    let too_large = || {
        ApiError::PayloadTooLarge(format!(
            "the request body is over this route's limit of {limit} bytes"
        ))
    };
    let hint = body.size_hint();
    if hint.lower() > limit as u64 {
        return Err(too_large());
    }
    let mut buf = Vec::with_capacity(hint.lower() as usize);
    let mut frames = body.into_data_stream();
    loop {
        match tokio::time::timeout_at(deadline, frames.next()).await {
            Err(_) => {
                return Err(ApiError::RequestTimeout(
                    "the request body did not arrive in time".into(),
                ));
            }
            Ok(None) => break,
            Ok(Some(Err(e))) => {
                return Err(ApiError::BadRequest {
                    code: "bad_body",
                    field: None,
                    message: format!("could not read the body: {e}"),
                });
            }
            Ok(Some(Ok(chunk))) => {
                if buf.len() + chunk.len() > limit {
                    return Err(too_large());
                }
                buf.extend_from_slice(&chunk);
            }
        }
    }
    Ok(Body::from(buf))
}

/// Adds the security headers (see the module's documentation) that the route has not set.
pub async fn security_headers(State(hsts): State<bool>, mut res: Response) -> Response {
    let h = res.headers_mut();
    let mut set = |name: HeaderName, value: &'static str| {
        if !h.contains_key(&name) {
            h.insert(name, HeaderValue::from_static(value));
        }
    };
    set(X_CONTENT_TYPE_OPTIONS, "nosniff");
    set(X_FRAME_OPTIONS, "DENY");
    set(REFERRER_POLICY, "no-referrer");
    set(CONTENT_SECURITY_POLICY, API_CSP);
    if hsts {
        set(STRICT_TRANSPORT_SECURITY, "max-age=31536000");
    }
    res
}

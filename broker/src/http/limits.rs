//! Hostile input, in front of every route: a request rate per credential, a bound on the body's
//! size and on the time it takes to arrive, and the security headers every response carries.
//! Rejections use the one error shape (`ApiError`).
//!
//! - **Rate** (`rate_limit_per_s`, `rate_limit_burst`): one GCRA bucket (the `governor` crate)
//!   per credential — the bearer token, else the console session cookie — keyed by a digest of
//!   it, checked before anything else (no database lookup for a throttled caller). Beyond it:
//!   429 `rate_limited` with `Retry-After`. Requests without a credential are not counted (the
//!   probes; console sign-in carries its secret in the body).
//! - **Failed authentications** (`AuthFailures`): a bucket per credential does nothing
//!   against made-up credentials, each of which is new. So each client address (the peer of
//!   the connection; an IPv6 client by its /64) also has a budget of failed authentications —
//!   a 401 with a credential (bearer token, agent token, session cookie), a refused enrolment
//!   token at `/agent/v1/register`, a refused `POST /console/login` — of
//!   [`AUTH_FAILURE_BURST`], refilled at [`AUTH_FAILURES_PER_MINUTE`]. Once it is spent, the
//!   address's requests that carry a credential (and its sign-ins) are answered 429
//!   `rate_limited` with `Retry-After` before any lookup, except those whose credential
//!   authenticated recently: a client is not locked out by another's failures from behind
//!   the same address (agents behind one NAT). Loopback peers are not counted (the machine's
//!   own agents and CLI, and a reverse proxy on the same host, which must throttle itself);
//!   nor is a request whose peer the server did not record.
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
use axum::extract::{ConnectInfo, Request, State};
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
use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::http::auth;
use crate::http::error::ApiError;

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
    failures: AuthFailures,
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
            failures: AuthFailures::new(),
        }
    }

    /// The largest body any route accepts (for axum's own extractor limit behind this one).
    pub fn largest_body(&self) -> usize {
        self.api_body_bytes.max(self.agent_body_bytes)
    }

    fn body_limit(&self, path: &str) -> usize {
        if path == REGISTER_PATH {
            REGISTER_BODY_BYTES
        } else if path.starts_with("/agent/") {
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
        limiter
            .check_key(&key)
            .map_err(|not_until| too_many(not_until.wait_time_from(limiter.clock().now())))
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

/// Agent enrolment: its one-time token is checked (by [`enrolment_gate`]) before the body is
/// read, and the body is small — an inventory of a 64-GPU node is a few KiB.
pub const REGISTER_PATH: &str = "/agent/v1/register";
/// The largest registration body: room for a 64-GPU node's inventory many times over.
pub const REGISTER_BODY_BYTES: usize = 256 * 1024;

/// Console sign-in: its token is in the body, and a refusal counts as a failed
/// authentication of the client's address.
pub const LOGIN_PATH: &str = "/console/login";

/// The middleware: the client's failed-authentication budget, the credential's rate, then
/// body size and time; then the route, whose outcome is counted against the budget. The
/// registration body is read later, by [`enrolment_gate`], once its token has been checked.
pub async fn guard(State(limits): State<Arc<Limits>>, req: Request, next: Next) -> Response {
    let (mut parts, body) = req.into_parts();
    let credential = credential_key(&parts);
    let path = parts.uri.path().to_string();
    // Only requests that present a secret can fail to authenticate.
    let client = client_of(&parts).filter(|_| credential.is_some() || path == LOGIN_PATH);
    if let Some(client) = client
        && let Err(e) = limits.failures.admit(client, credential)
    {
        return refuse(e, !body.is_end_stream());
    }
    if let Some(key) = credential
        && let Err(e) = limits.check_rate(key)
    {
        return refuse(e, !body.is_end_stream());
    }
    let proof = AuthProof::default();
    parts.extensions.insert(proof.clone());
    let limit = limits.body_limit(&path);
    let res = if path == REGISTER_PATH {
        // Only a declared size over the limit is refused here; the body waits for the gate.
        if body.size_hint().lower() > limit as u64 {
            return refuse(too_large(limit), true);
        }
        next.run(Request::from_parts(parts, body)).await
    } else {
        let deadline = tokio::time::Instant::now() + limits.body_timeout;
        match read_body(body, limit, deadline).await {
            Ok(body) => next.run(Request::from_parts(parts, body)).await,
            Err(e) => return refuse(e, true),
        }
    };
    let Some(client) = client else {
        return res;
    };
    if proof.0.load(Ordering::Relaxed) {
        if let Some(key) = credential {
            limits.failures.proved(key);
        }
        return res;
    }
    let status = res.status();
    let failed = status == axum::http::StatusCode::UNAUTHORIZED
        || (path == REGISTER_PATH && status == axum::http::StatusCode::FORBIDDEN);
    if failed && let Err(e) = limits.failures.failed(client, credential) {
        return refuse(e, false);
    }
    res
}

// ---- Failed authentications per client ------------------------------------------------------

/// Failed authentications a client address may make at once…
pub const AUTH_FAILURE_BURST: u32 = 20;
/// …and how many more it gets a minute after that (one every 3 s).
pub const AUTH_FAILURES_PER_MINUTE: u32 = 20;
/// How long a credential that authenticated stays exempt from its address's spent budget.
const PROVED_FOR: Duration = Duration::from_secs(15 * 60);
/// The most addresses held as throttled, and credentials held as proved: the tables are pruned
/// of what has run out when they reach it, and take no more while still full.
const TABLE_CAP: usize = 65_536;

/// Marks, for [`guard`], that the request's credential authenticated (set by the
/// authenticating extractors through [`authenticated`]).
#[derive(Clone, Debug, Default)]
pub struct AuthProof(Arc<AtomicBool>);

/// Called by the extractors that authenticate a request (`auth::Caller`, the agent's
/// `AgentCaller`) when its credential proved good.
pub fn authenticated(extensions: &axum::http::Extensions) {
    if let Some(proof) = extensions.get::<AuthProof>() {
        proof.0.store(true, Ordering::Relaxed);
    }
}

/// The address a request's failures count against: the connection's peer (recorded by the
/// server as `ConnectInfo`), an IPv6 peer by its /64 (one machine's share of addresses), and
/// `None` for a loopback peer or when no peer was recorded.
fn client_of(parts: &Parts) -> Option<IpAddr> {
    let ConnectInfo(peer) = parts.extensions.get::<ConnectInfo<SocketAddr>>()?;
    let ip = match peer.ip() {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
        v4 => v4,
    };
    (!ip.is_loopback()).then_some(ip)
}

/// The failed-authentication budget of each client address (see the module docs).
struct AuthFailures {
    /// Failures per address: a GCRA bucket each; full buckets are dropped now and then.
    limiter: DefaultKeyedRateLimiter<IpAddr>,
    checks: AtomicU64,
    /// Addresses whose budget is spent, and until when.
    throttled: Mutex<HashMap<IpAddr, Instant>>,
    /// Digests of credentials that authenticated, and when they last did.
    proved: Mutex<HashMap<u128, Instant>>,
}

impl AuthFailures {
    fn new() -> AuthFailures {
        let rate = NonZeroU32::new(AUTH_FAILURES_PER_MINUTE).unwrap_or(NonZeroU32::MIN);
        let burst = NonZeroU32::new(AUTH_FAILURE_BURST).unwrap_or(rate);
        AuthFailures {
            limiter: DefaultKeyedRateLimiter::keyed(Quota::per_minute(rate).allow_burst(burst)),
            checks: AtomicU64::new(0),
            throttled: Mutex::new(HashMap::new()),
            proved: Mutex::new(HashMap::new()),
        }
    }

    /// Before the request: refused while `client`'s budget is spent, unless its credential
    /// authenticated recently.
    fn admit(&self, client: IpAddr, credential: Option<u128>) -> Result<(), ApiError> {
        let now = Instant::now();
        let until = {
            let mut throttled = self
                .throttled
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            match throttled.get(&client) {
                Some(until) if *until > now => *until,
                Some(_) => {
                    throttled.remove(&client);
                    return Ok(());
                }
                None => return Ok(()),
            }
        };
        let proved = credential.is_some_and(|key| {
            let proved = self.proved.lock().unwrap_or_else(PoisonError::into_inner);
            proved
                .get(&key)
                .is_some_and(|at| now.duration_since(*at) < PROVED_FOR)
        });
        if proved {
            return Ok(());
        }
        Err(too_many(until - now))
    }

    /// A failed authentication from `client`: counted; `Err` (the answer to give instead)
    /// when it spends the budget.
    fn failed(&self, client: IpAddr, credential: Option<u128>) -> Result<(), ApiError> {
        if let Some(key) = credential {
            // A credential that was good and is no more (revoked, expired) loses its pass.
            self.proved
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&key);
        }
        if self.checks.fetch_add(1, Ordering::Relaxed) % RETAIN_EVERY == RETAIN_EVERY - 1 {
            self.limiter.retain_recent();
            self.limiter.shrink_to_fit();
        }
        let Err(not_until) = self.limiter.check_key(&client) else {
            return Ok(());
        };
        let wait = not_until.wait_time_from(self.limiter.clock().now());
        let now = Instant::now();
        let mut throttled = self
            .throttled
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if throttled.len() >= TABLE_CAP {
            throttled.retain(|_, until| *until > now);
        }
        if throttled.len() < TABLE_CAP {
            throttled.insert(client, now + wait);
        }
        Err(too_many(wait))
    }

    /// A credential authenticated: it passes its address's spent budget for a while.
    fn proved(&self, credential: u128) {
        let now = Instant::now();
        let mut proved = self.proved.lock().unwrap_or_else(PoisonError::into_inner);
        if proved.len() >= TABLE_CAP && !proved.contains_key(&credential) {
            proved.retain(|_, at| now.duration_since(*at) < PROVED_FOR);
            if proved.len() >= TABLE_CAP {
                return;
            }
        }
        proved.insert(credential, now);
    }
}

fn too_many(wait: Duration) -> ApiError {
    ApiError::TooManyRequests {
        retry_after_s: wait.as_millis().div_ceil(1000).max(1) as u64,
    }
}

/// In front of `POST /agent/v1/register`: the one-time enrolment token in `Authorization` must
/// be one the broker issued, unused and unexpired, before a byte of the body is read (a flood
/// of made-up registrations costs a lookup each, not their bodies' memory); then the body is
/// read within [`REGISTER_BODY_BYTES`] and the body timeout. The handler consumes the token.
pub async fn enrolment_gate(
    State(app): State<crate::state::App>,
    req: Request,
    next: Next,
) -> Response {
    let (parts, body) = req.into_parts();
    let Some(token) = auth::bearer(&parts).map(str::to_string) else {
        return refuse(ApiError::Unauthorized, !body.is_end_stream());
    };
    let checked = app
        .store
        .check_enrolment_token(&auth::hash_token(&token), app.clock.now())
        .await;
    match checked {
        Ok(Ok(())) => {}
        Ok(Err(refusal)) => {
            return refuse(
                ApiError::Forbidden(refusal.to_string()),
                !body.is_end_stream(),
            );
        }
        Err(e) => return refuse(ApiError::from(e), !body.is_end_stream()),
    }
    let deadline =
        tokio::time::Instant::now() + Duration::from_millis(app.config.body_timeout_ms.max(1));
    match read_body(body, REGISTER_BODY_BYTES, deadline).await {
        Ok(body) => next.run(Request::from_parts(parts, body)).await,
        Err(e) => refuse(e, true),
    }
}

fn too_large(limit: usize) -> ApiError {
    ApiError::PayloadTooLarge(format!(
        "the request body is over this route's limit of {limit} bytes"
    ))
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
    let too_large = || too_large(limit);
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

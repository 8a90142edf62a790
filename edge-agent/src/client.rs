//! The broker's agent API over HTTP (`/agent/v1`): one method per endpoint, typed with the
//! protocol crate, and an error that says whether a retry can help. Each call fails over
//! between the broker replicas of `--broker` ([`crate::brokers`]); retrying after a full round,
//! pacing and what a failure means for the agent are the callers' business.

use crate::args::Secret;
use crate::brokers::{Brokers, fails_over};
use crate::error::AgentError;
use reqwest::{StatusCode, Url};
use serde::de::DeserializeOwned;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use switchyard_protocol::ErrorBody;
use switchyard_protocol::agent::{
    EventBatch, EventBatchResponse, Heartbeat, HeartbeatResponse, RegisterRequest,
    RegisterResponse, WorkResponse,
};
use thiserror::Error;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Added to a long-poll's `wait_s` for the request timeout, so that a broker answering at the
/// end of the wait is not cut off.
const POLL_MARGIN: Duration = Duration::from_secs(15);

/// Why one call failed.
#[derive(Debug, Error)]
pub enum CallError {
    #[error("cannot reach the broker: {}", causes(.0))]
    Network(#[source] reqwest::Error),
    #[error("the broker answered HTTP {status}: {message}")]
    Status { status: StatusCode, message: String },
    #[error("the broker's answer could not be read: {0}")]
    Decode(String),
}

impl CallError {
    /// True when the same call may succeed later: network trouble, 5xx, 408, 429, or an
    /// unreadable answer (a proxy's error page, a broker mid-upgrade).
    pub fn is_retryable(&self) -> bool {
        match self {
            CallError::Network(_) | CallError::Decode(_) => true,
            CallError::Status { status, .. } => {
                status.is_server_error()
                    || *status == StatusCode::REQUEST_TIMEOUT
                    || *status == StatusCode::TOO_MANY_REQUESTS
            }
        }
    }

    pub fn is_unauthorized(&self) -> bool {
        matches!(self, CallError::Status { status, .. } if *status == StatusCode::UNAUTHORIZED)
    }
}

/// A client of the broker replicas of `--broker`; cheap to clone. Clones share the connection
/// pool and the current replica (see [`crate::brokers`] for the failover policy).
#[derive(Clone, Debug)]
pub struct BrokerClient {
    http: reqwest::Client,
    brokers: Arc<Brokers>,
    token: Option<Secret>,
    heartbeat_timeout: Duration,
}

impl BrokerClient {
    /// A client of `brokers` (repeats dropped), starting with the first; https brokers are
    /// verified against the system's roots.
    pub fn new(brokers: &[Url]) -> Result<Self, AgentError> {
        Self::with_ca(brokers, None)
    }

    /// A client of `brokers` that verifies https brokers against the CA certificates of the
    /// PEM file `ca_cert` only (`--ca-cert`), or the system's roots without one. Verification
    /// of the chain and of the host name is always on.
    pub fn with_ca(brokers: &[Url], ca_cert: Option<&Path>) -> Result<Self, AgentError> {
        let brokers = Brokers::new(brokers).ok_or(AgentError::NoBroker)?;
        let mut builder = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .pool_idle_timeout(switchyard_support::http::POOL_IDLE_TIMEOUT)
            .user_agent(concat!("switchyard-agent/", env!("CARGO_PKG_VERSION")));
        if let Some(path) = ca_cert {
            builder = builder.tls_certs_only(read_ca(path)?);
        }
        let http = builder
            .build()
            .map_err(|e| AgentError::HttpClient(e.to_string()))?;
        Ok(BrokerClient {
            http,
            brokers: Arc::new(brokers),
            token: None,
            heartbeat_timeout: CALL_TIMEOUT,
        })
    }

    /// The same client, authenticating as an enrolled agent.
    pub fn with_token(mut self, token: Secret) -> Self {
        self.token = Some(token);
        self
    }

    /// The same client, giving up on a heartbeat (and trying the next replica) after `timeout`:
    /// a heartbeat stuck on a silent replica must not outlast the lease it renews.
    pub fn with_heartbeat_timeout(mut self, timeout: Duration) -> Self {
        self.heartbeat_timeout = timeout.min(CALL_TIMEOUT);
        self
    }

    /// How long a heartbeat may take.
    pub fn heartbeat_timeout(&self) -> Duration {
        self.heartbeat_timeout
    }

    /// The replica calls go to now (base form: the path ends with '/').
    pub fn current_broker(&self) -> Url {
        self.brokers.current()
    }

    /// Every replica, in the order tried (base form, repeats dropped).
    pub fn brokers(&self) -> &[Url] {
        self.brokers.urls()
    }

    /// Enrols with a one-time token, sent as the bearer credential (the broker checks it
    /// before it reads the body).
    pub async fn register(
        &self,
        enrolment_token: &Secret,
        req: &RegisterRequest,
    ) -> Result<RegisterResponse, CallError> {
        self.call("register", CALL_TIMEOUT, |base| {
            Ok(self
                .http
                .post(url(base, "agent/v1/register")?)
                .bearer_auth(enrolment_token.expose())
                .json(req))
        })
        .await
    }

    pub async fn heartbeat(&self, req: &Heartbeat) -> Result<HeartbeatResponse, CallError> {
        self.call("heartbeat", self.heartbeat_timeout, |base| {
            Ok(self
                .authed(self.http.post(url(base, "agent/v1/heartbeat")?))
                .json(req))
        })
        .await
    }

    /// Long-polls for work: the broker answers when there is some, or after `wait_s`.
    pub async fn work(&self, wait_s: u64) -> Result<WorkResponse, CallError> {
        self.call("work", Duration::from_secs(wait_s) + POLL_MARGIN, |base| {
            Ok(self
                .authed(self.http.get(url(base, "agent/v1/work")?))
                .query(&[("wait_s", wait_s)]))
        })
        .await
    }

    pub async fn events(&self, batch: &EventBatch) -> Result<EventBatchResponse, CallError> {
        self.call("events", CALL_TIMEOUT, |base| {
            Ok(self
                .authed(self.http.post(url(base, "agent/v1/events")?))
                .json(batch))
        })
        .await
    }

    fn authed(&self, req: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.token {
            Some(token) => req.bearer_auth(token.expose()),
            None => req,
        }
    }

    /// One call, with failover: on the current replica; after a failure that [`fails_over`],
    /// at once on the next one, until every replica was tried once; then the last error. A
    /// call in flight on a replica that another call has just left is re-sent to the new one.
    async fn call<T: DeserializeOwned>(
        &self,
        name: &'static str,
        timeout: Duration,
        request: impl Fn(&Url) -> Result<reqwest::RequestBuilder, CallError>,
    ) -> Result<T, CallError> {
        let mut tries = 0;
        loop {
            let mut target = self.brokers.target();
            let req = request(&target.base)?;
            let result = tokio::select! {
                result = self.send(req, timeout) => result,
                () = target.moved_away() => {
                    tracing::debug!(call = name, from = %target.base, to = %self.brokers.current(),
                        "the agent left this broker during the call; sending it again");
                    continue;
                }
            };
            tries += 1;
            match result {
                Ok(answer) => {
                    self.brokers.succeeded();
                    return Ok(answer);
                }
                Err(e) if fails_over(&e) => {
                    self.brokers.fail_over(target.index, name, &e);
                    if tries >= self.brokers.len() {
                        return Err(e);
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn send<T: DeserializeOwned>(
        &self,
        req: reqwest::RequestBuilder,
        timeout: Duration,
    ) -> Result<T, CallError> {
        let res = req
            .timeout(timeout)
            .send()
            .await
            .map_err(CallError::Network)?;
        let status = res.status();
        let body = res.bytes().await.map_err(CallError::Network)?;
        if !status.is_success() {
            return Err(CallError::Status {
                status,
                message: error_message(&body),
            });
        }
        serde_json::from_slice(&body).map_err(|e| CallError::Decode(e.to_string()))
    }
}

/// `path` under a broker's base URL (one that ends with '/', see [`crate::brokers::base_of`]).
fn url(base: &Url, path: &str) -> Result<Url, CallError> {
    base.join(path)
        .map_err(|e| CallError::Decode(format!("bad URL {path}: {e}")))
}

/// The certificates of the PEM file `path` (at least one).
pub fn read_ca(path: &Path) -> Result<Vec<reqwest::Certificate>, AgentError> {
    switchyard_support::http::read_ca(path).map_err(AgentError::HttpClient)
}

/// An error with its causes: reqwest's own message leaves out why ("connection refused").
fn causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let line = cause.to_string();
        if !text.contains(&line) {
            text.push_str(": ");
            text.push_str(&line);
        }
        source = cause.source();
    }
    text
}

/// The message of the broker's error shape, or the start of whatever else came back.
fn error_message(body: &[u8]) -> String {
    if let Ok(err) = serde_json::from_slice::<ErrorBody>(body) {
        return err.error.message;
    }
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    match text.char_indices().nth(200) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None if text.is_empty() => "(no message)".to_string(),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn reads_the_broker_error_shape_or_plain_text() {
        assert_eq!(
            error_message(br#"{"error":{"code":"forbidden","message":"token used"}}"#),
            "token used"
        );
        assert_eq!(error_message(b"  Bad Gateway \n"), "Bad Gateway");
        assert_eq!(error_message(b""), "(no message)");
        assert!(error_message("x".repeat(500).as_bytes()).ends_with('…'));
    }

    fn list(urls: &[&str]) -> Vec<Url> {
        urls.iter().map(|u| u.parse().unwrap()).collect()
    }

    #[test]
    fn joins_paths_under_a_base_path() {
        let c = BrokerClient::new(&list(&["http://b:8080/sy"])).unwrap();
        assert_eq!(
            url(&c.current_broker(), "agent/v1/work").unwrap().as_str(),
            "http://b:8080/sy/agent/v1/work"
        );
        let c = BrokerClient::new(&list(&["http://b:8080", "http://c:8080/"])).unwrap();
        assert_eq!(
            url(&c.current_broker(), "agent/v1/work").unwrap().as_str(),
            "http://b:8080/agent/v1/work"
        );
        assert_eq!(c.brokers().len(), 2);
        assert!(matches!(BrokerClient::new(&[]), Err(AgentError::NoBroker)));
    }

    fn closed_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    #[tokio::test]
    async fn a_network_error_says_why() {
        let port = closed_port();
        let c = BrokerClient::new(&list(&[&format!("http://127.0.0.1:{port}")])).unwrap();
        let err = c.work(1).await.unwrap_err();
        assert!(err.is_retryable());
        assert!(
            err.to_string()
                .to_lowercase()
                .contains("connection refused"),
            "{err}"
        );
    }

    /// A broker whose `work` answers `status` (an empty answer on 200); counts the calls.
    async fn replica(status: u16) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
        use axum::response::IntoResponse;
        use std::sync::atomic::{AtomicUsize, Ordering};
        let hits = Arc::new(AtomicUsize::new(0));
        let counted = hits.clone();
        let app = axum::Router::new().route(
            "/agent/v1/work",
            axum::routing::get(move || {
                counted.fetch_add(1, Ordering::SeqCst);
                async move {
                    let status = axum::http::StatusCode::from_u16(status).unwrap();
                    if status.is_success() {
                        axum::Json(WorkResponse {
                            leases: vec![],
                            stop: vec![],
                        })
                        .into_response()
                    } else {
                        (status, "no").into_response()
                    }
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (url, hits)
    }

    fn hits(counter: &std::sync::atomic::AtomicUsize) -> usize {
        counter.load(std::sync::atomic::Ordering::SeqCst)
    }

    #[tokio::test]
    async fn fails_over_at_once_and_sticks_to_the_broker_that_works() {
        let dead = format!("http://127.0.0.1:{}", closed_port());
        let (down, down_hits) = replica(503).await;
        let (up, up_hits) = replica(200).await;
        let c = BrokerClient::new(&list(&[&dead, &down, &up])).unwrap();
        c.work(1).await.unwrap();
        assert_eq!((hits(&down_hits), hits(&up_hits)), (1, 1));
        assert_eq!(c.current_broker().as_str(), format!("{up}/"));
        // Clones share the current broker; later calls go straight to it.
        let clone = c.clone();
        clone.work(1).await.unwrap();
        c.work(1).await.unwrap();
        assert_eq!((hits(&down_hits), hits(&up_hits)), (1, 3));
    }

    #[tokio::test]
    async fn a_full_round_of_failures_returns_the_last_error_and_rotates_on() {
        let (a, a_hits) = replica(502).await;
        let (b, b_hits) = replica(504).await;
        let c = BrokerClient::new(&list(&[&a, &b])).unwrap();
        let err = c.work(1).await.unwrap_err();
        assert!(err.to_string().contains("504"), "{err}");
        assert_eq!(
            (hits(&a_hits), hits(&b_hits)),
            (1, 1),
            "each once per round"
        );
        // The next round (after the caller's backoff) starts where the rotation is: `a` again.
        assert_eq!(c.current_broker().as_str(), format!("{a}/"));
        let err = c.work(1).await.unwrap_err();
        assert!(err.to_string().contains("504"), "{err}");
        assert_eq!((hits(&a_hits), hits(&b_hits)), (2, 2));
    }

    #[tokio::test]
    async fn answers_from_a_live_broker_do_not_fail_over() {
        for status in [500, 401, 429, 400] {
            let (a, a_hits) = replica(status).await;
            let (b, b_hits) = replica(200).await;
            let c = BrokerClient::new(&list(&[&a, &b])).unwrap();
            let err = c.work(1).await.unwrap_err();
            assert!(err.to_string().contains(&status.to_string()), "{err}");
            assert_eq!((hits(&a_hits), hits(&b_hits)), (1, 0), "{status}");
            assert_eq!(c.current_broker().as_str(), format!("{a}/"));
        }
    }

    #[test]
    fn classifies_statuses() {
        let s = |code: u16| CallError::Status {
            status: StatusCode::from_u16(code).unwrap(),
            message: String::new(),
        };
        assert!(s(503).is_retryable() && s(429).is_retryable() && s(408).is_retryable());
        assert!(!s(400).is_retryable() && !s(401).is_retryable() && !s(403).is_retryable());
        assert!(s(401).is_unauthorized() && !s(403).is_unauthorized());
    }
}

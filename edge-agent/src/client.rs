//! The broker's agent API over HTTP (`/agent/v1`): one method per endpoint, typed with the
//! protocol crate, and an error that says whether a retry can help. Retrying, pacing and what a
//! failure means for the agent are the callers' business.

use crate::args::Secret;
use reqwest::{StatusCode, Url};
use serde::de::DeserializeOwned;
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

/// A client of one broker; cheap to clone (the connection pool is shared).
#[derive(Clone, Debug)]
pub struct BrokerClient {
    http: reqwest::Client,
    base: Url,
    token: Option<Secret>,
}

impl BrokerClient {
    pub fn new(broker: &Url) -> Result<Self, reqwest::Error> {
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .user_agent(concat!("switchyard-agent/", env!("CARGO_PKG_VERSION")))
            .build()?;
        // `join` replaces the last path segment unless the base ends with '/'.
        let mut base = broker.clone();
        if !base.path().ends_with('/') {
            let path = format!("{}/", base.path());
            base.set_path(&path);
        }
        Ok(BrokerClient {
            http,
            base,
            token: None,
        })
    }

    /// The same client, authenticating as an enrolled agent.
    pub fn with_token(mut self, token: Secret) -> Self {
        self.token = Some(token);
        self
    }

    pub async fn register(&self, req: &RegisterRequest) -> Result<RegisterResponse, CallError> {
        self.call(
            self.http.post(self.url("agent/v1/register")?).json(req),
            CALL_TIMEOUT,
        )
        .await
    }

    pub async fn heartbeat(&self, req: &Heartbeat) -> Result<HeartbeatResponse, CallError> {
        self.call(
            self.authed(self.http.post(self.url("agent/v1/heartbeat")?))
                .json(req),
            CALL_TIMEOUT,
        )
        .await
    }

    /// Long-polls for work: the broker answers when there is some, or after `wait_s`.
    pub async fn work(&self, wait_s: u64) -> Result<WorkResponse, CallError> {
        let req = self
            .authed(self.http.get(self.url("agent/v1/work")?))
            .query(&[("wait_s", wait_s)]);
        self.call(req, Duration::from_secs(wait_s) + POLL_MARGIN)
            .await
    }

    pub async fn events(&self, batch: &EventBatch) -> Result<EventBatchResponse, CallError> {
        self.call(
            self.authed(self.http.post(self.url("agent/v1/events")?))
                .json(batch),
            CALL_TIMEOUT,
        )
        .await
    }

    fn url(&self, path: &str) -> Result<Url, CallError> {
        self.base
            .join(path)
            .map_err(|e| CallError::Decode(format!("bad URL {path}: {e}")))
    }

    fn authed(&self, req: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.token {
            Some(token) => req.bearer_auth(token.expose()),
            None => req,
        }
    }

    async fn call<T: DeserializeOwned>(
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

    #[test]
    fn joins_paths_under_a_base_path() {
        let c = BrokerClient::new(&"http://b:8080/sy".parse().unwrap()).unwrap();
        assert_eq!(
            c.url("agent/v1/work").unwrap().as_str(),
            "http://b:8080/sy/agent/v1/work"
        );
        let c = BrokerClient::new(&"http://b:8080".parse().unwrap()).unwrap();
        assert_eq!(
            c.url("agent/v1/work").unwrap().as_str(),
            "http://b:8080/agent/v1/work"
        );
    }

    #[tokio::test]
    async fn a_network_error_says_why() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let c = BrokerClient::new(&format!("http://127.0.0.1:{port}").parse().unwrap()).unwrap();
        let err = c.work(1).await.unwrap_err();
        assert!(err.is_retryable());
        assert!(
            err.to_string()
                .to_lowercase()
                .contains("connection refused"),
            "{err}"
        );
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

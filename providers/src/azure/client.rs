//! The HTTP side of the Azure provider: the client-credentials token (cached until shortly
//! before it expires), one ARM request with its timeout and error classification, the retry
//! loop around it ([`Backoff`]), and the polling of long-running operations through
//! `Azure-AsyncOperation` (or `Location`), bounded by the operation timeout.
//!
//! The bearer token goes only to `arm_endpoint`: operation and `nextLink` URLs that point
//! anywhere else are refused.

use super::error::{Class, Failure, from_arm, from_oauth};
use crate::retry::Backoff;
use reqwest::Method;
use serde_json::Value;
use std::fmt;
use std::time::{Duration, Instant};

/// A secret that never shows in `Debug` output or logs.
#[derive(Clone)]
pub(crate) struct Secret(pub String);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

#[derive(Clone)]
struct Token {
    value: String,
    refresh_at: Instant,
}

/// An answer of ARM with a 2xx status.
#[derive(Debug)]
pub(crate) struct Answer {
    pub status: u16,
    pub body: Value,
    /// `Azure-AsyncOperation`: the operation to poll.
    pub async_operation: Option<String>,
    /// `Location`: polled when there is no `Azure-AsyncOperation`.
    pub location: Option<String>,
    pub retry_after: Option<Duration>,
}

/// How a long-running operation ended, when it did not succeed.
#[derive(Debug)]
pub(crate) enum OpError {
    /// Azure says it failed (or was canceled), with its error.
    Failed(Failure),
    /// Its outcome is unknown: it outlived the operation timeout, or polling failed.
    Unknown(Failure),
}

impl OpError {
    pub fn into_failure(self) -> Failure {
        match self {
            OpError::Failed(f) | OpError::Unknown(f) => f,
        }
    }
}

pub(crate) struct Arm {
    http: reqwest::Client,
    /// `arm_endpoint` without a trailing slash.
    pub endpoint: String,
    token_url: String,
    client_id: String,
    secret: Secret,
    scope: String,
    request_timeout: Duration,
    operation_timeout: Duration,
    poll_interval: Duration,
    /// The longest `Retry-After` of a 429 that is slept before the retry loop's own delay.
    retry_after_cap: Duration,
    pub backoff: Backoff,
    token: tokio::sync::Mutex<Option<Token>>,
}

impl fmt::Debug for Arm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Arm")
            .field("endpoint", &self.endpoint)
            .field("token_url", &self.token_url)
            .field("client_id", &self.client_id)
            .field("secret", &self.secret)
            .finish_non_exhaustive()
    }
}

/// Settings of an [`Arm`] client.
pub(crate) struct ArmSettings {
    pub arm_endpoint: String,
    pub authority_host: String,
    pub tenant_id: String,
    pub client_id: String,
    pub secret: Secret,
    pub request_timeout: Duration,
    pub operation_timeout: Duration,
    pub poll_interval: Duration,
    pub retry: crate::retry::RetrySettings,
}

impl Arm {
    pub fn new(s: ArmSettings) -> Result<Arm, String> {
        let http = reqwest::Client::builder()
            .connect_timeout(s.request_timeout.min(Duration::from_secs(10)))
            .build()
            .map_err(|e| format!("building the HTTP client: {e}"))?;
        let endpoint = s.arm_endpoint.trim_end_matches('/').to_owned();
        Ok(Arm {
            http,
            token_url: format!(
                "{}/{}/oauth2/v2.0/token",
                s.authority_host.trim_end_matches('/'),
                s.tenant_id
            ),
            scope: format!("{endpoint}/.default"),
            endpoint,
            client_id: s.client_id,
            secret: s.secret,
            request_timeout: s.request_timeout,
            operation_timeout: s.operation_timeout,
            poll_interval: s.poll_interval,
            retry_after_cap: Duration::from_millis(s.retry.max_delay_ms),
            backoff: Backoff::new(&s.retry),
            token: tokio::sync::Mutex::new(None),
        })
    }

    /// The HTTP client (for the public prices API, which takes no token).
    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    pub fn request_timeout(&self) -> Duration {
        self.request_timeout
    }

    /// `{arm_endpoint}{path}?api-version={version}`.
    pub fn url(&self, path: &str, api_version: &str) -> String {
        format!("{}{path}?api-version={api_version}", self.endpoint)
    }

    /// A bearer token, from the cache while it has not reached its refresh time.
    async fn token(&self) -> Result<String, Failure> {
        let mut cached = self.token.lock().await;
        if let Some(t) = cached.as_ref()
            && Instant::now() < t.refresh_at
        {
            return Ok(t.value.clone());
        }
        let token = self.backoff.run("Token", || self.fetch_token()).await?;
        let value = token.value.clone();
        *cached = Some(token);
        Ok(value)
    }

    /// Forgets the cached token (after ARM refused it).
    async fn invalidate_token(&self) {
        *self.token.lock().await = None;
    }

    async fn fetch_token(&self) -> Result<Token, Failure> {
        let form = [
            ("grant_type", "client_credentials"),
            ("client_id", self.client_id.as_str()),
            ("client_secret", self.secret.0.as_str()),
            ("scope", self.scope.as_str()),
        ];
        let started = Instant::now();
        let response = self
            .http
            .post(&self.token_url)
            .timeout(self.request_timeout)
            .form(&form)
            .send()
            .await
            .map_err(|e| transport("token request", &e))?;
        let status = response.status().as_u16();
        let bytes = response
            .bytes()
            .await
            .map_err(|e| transport("token answer", &e))?;
        let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        if !(200..300).contains(&status) {
            return Err(from_oauth(status, &body));
        }
        let value = body
            .get("access_token")
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| Failure::new(Class::Transient, "token answer without access_token"))?
            .to_owned();
        // `expires_in` is a number (v2.0 endpoint) or a string of digits (older answers).
        let expires_in = match body.get("expires_in") {
            Some(Value::Number(n)) => n.as_u64(),
            Some(Value::String(s)) => s.parse().ok(),
            _ => None,
        }
        .unwrap_or(300);
        // Refresh five minutes early, or halfway through a short-lived token.
        let margin = (expires_in / 2).min(300);
        let refresh_at = started + Duration::from_secs(expires_in.saturating_sub(margin));
        tracing::debug!(expires_in, "obtained an Azure access token");
        Ok(Token { value, refresh_at })
    }

    /// One attempt of one ARM request: a 2xx answer, or the failure, classified.
    async fn attempt(
        &self,
        method: &Method,
        url: &str,
        body: Option<&Value>,
    ) -> Result<Answer, Failure> {
        let token = self.token().await?;
        let mut request = self
            .http
            .request(method.clone(), url)
            .timeout(self.request_timeout)
            .bearer_auth(token);
        if let Some(b) = body {
            request = request.json(b);
        }
        let response = request
            .send()
            .await
            .map_err(|e| transport("ARM request", &e))?;
        let status = response.status().as_u16();
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let async_operation = header("azure-asyncoperation");
        let location = header("location");
        let retry_after = header("retry-after")
            .and_then(|s| s.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let bytes = response
            .bytes()
            .await
            .map_err(|e| transport("ARM answer", &e))?;
        let body: Value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap_or(Value::Null)
        };
        if (200..300).contains(&status) {
            return Ok(Answer {
                status,
                body,
                async_operation,
                location,
                retry_after,
            });
        }
        let failure = from_arm(status, &body);
        if status == 401 {
            // A revoked or expired token: the next call asks for a new one.
            self.invalidate_token().await;
        }
        if failure.class == Class::Throttled
            && let Some(wait) = retry_after
        {
            // Honour Retry-After, up to the retry loop's longest delay.
            tokio::time::sleep(wait.min(self.retry_after_cap)).await;
        }
        Err(failure)
    }

    /// An ARM request, retried through the backoff loop when throttled or transient.
    pub async fn call(
        &self,
        operation: &'static str,
        method: Method,
        url: &str,
        body: Option<&Value>,
    ) -> Result<Answer, Failure> {
        self.check_own(url)?;
        self.backoff
            .run(operation, || self.attempt(&method, url, body))
            .await
    }

    /// Refuses a URL that is not on `arm_endpoint` (the token must not leave it).
    pub fn check_own(&self, url: &str) -> Result<(), Failure> {
        let own = url
            .strip_prefix(&self.endpoint)
            .is_some_and(|rest| rest.starts_with('/'));
        if own {
            Ok(())
        } else {
            Err(Failure::new(
                Class::Transient,
                format!("refusing to send the token to {url:?}, which is not on arm_endpoint"),
            ))
        }
    }

    /// Waits for the long-running operation an answer started, if any, until it ends or the
    /// operation timeout passes.
    pub async fn wait(&self, operation: &'static str, answer: &Answer) -> Result<(), OpError> {
        let (url, by_status) = match (&answer.async_operation, &answer.location) {
            (Some(url), _) => (url.clone(), true),
            (None, Some(url)) if answer.status == 202 => (url.clone(), false),
            _ => return Ok(()),
        };
        self.check_own(&url).map_err(OpError::Unknown)?;
        let bound = self.operation_timeout;
        let mut delay = answer.retry_after.unwrap_or(self.poll_interval);
        let polled = tokio::time::timeout(bound, async {
            loop {
                tokio::time::sleep(delay.min(self.poll_interval)).await;
                let a = self
                    .call(operation, Method::GET, &url, None)
                    .await
                    .map_err(OpError::Unknown)?;
                delay = a.retry_after.unwrap_or(self.poll_interval);
                if !by_status {
                    if a.status != 202 {
                        return Ok(());
                    }
                    continue;
                }
                let status = a.body.get("status").and_then(Value::as_str).unwrap_or("");
                if status.eq_ignore_ascii_case("Succeeded") {
                    return Ok(());
                }
                if status.eq_ignore_ascii_case("Failed") {
                    return Err(OpError::Failed(from_arm(0, &a.body)));
                }
                if status.eq_ignore_ascii_case("Canceled") {
                    let mut f = from_arm(0, &a.body);
                    if f.code.is_none() {
                        f = Failure::new(Class::Transient, "the operation was canceled");
                    }
                    return Err(OpError::Failed(f));
                }
            }
        })
        .await;
        match polled {
            Ok(result) => result,
            Err(_) => Err(OpError::Unknown(Failure::new(
                Class::Transient,
                format!(
                    "{operation} did not finish within {}s (operation_timeout_s)",
                    bound.as_secs()
                ),
            ))),
        }
    }
}

/// A request that got no HTTP answer (timeout, refused or dropped connection): transient.
pub(crate) fn transport(what: &str, e: &reqwest::Error) -> Failure {
    let why = if e.is_timeout() {
        "timed out (request_timeout_s)".to_owned()
    } else {
        // The error names the URL: ours carry no secrets (the token is a header, the secret a
        // form field).
        e.to_string()
    };
    Failure::new(Class::Transient, format!("{what}: {why}"))
}

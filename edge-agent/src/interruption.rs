//! The spot interruption watcher: polls the cloud's instance-metadata notice URL
//! (`--interruption-url`; on EC2 `http://169.254.169.254/latest/meta-data/spot/instance-action`)
//! and publishes the first notice it finds. HTTP 404 means no notice; any 200 is one, whatever
//! its body says (EC2 sends `{"action": "terminate", "time": "…"}`). What the agent does with a
//! notice — drain, tell the broker, stop jobs — is [`crate::agent`]'s; this module only reads.
//!
//! On an EC2-style URL (`/latest/meta-data/…`) it first asks for an IMDSv2 session token and
//! sends it, so instances that require IMDSv2 work; where the token call fails it reads without
//! one (IMDSv1, or a test server).

use reqwest::{StatusCode, Url};
use serde::Deserialize;
use std::time::Duration;
use switchyard_protocol::agent::InterruptionNotice;
use tokio::sync::watch;
use tokio::time::Instant;

/// The metadata service is on the machine's own link: an answer slower than this is a failure.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// Lifetime asked for an IMDSv2 token, and how long before its end a new one is fetched.
const TOKEN_TTL: Duration = Duration::from_secs(6 * 3600);
const TOKEN_MARGIN: Duration = Duration::from_secs(60);
const TOKEN_HEADER: &str = "X-aws-ec2-metadata-token";
const TOKEN_TTL_HEADER: &str = "X-aws-ec2-metadata-token-ttl-seconds";

/// Polls one notice URL.
#[derive(Debug)]
pub struct Watcher {
    http: reqwest::Client,
    url: Url,
    period: Duration,
    /// Where an IMDSv2 token comes from, for an EC2-style URL.
    token_url: Option<Url>,
    token: Option<(String, Instant)>,
}

/// The parts of a notice body we read; anything else in it is ignored.
#[derive(Deserialize)]
struct Body {
    action: Option<String>,
    time: Option<String>,
}

impl Watcher {
    pub fn new(url: Url, period: Duration) -> Result<Watcher, reqwest::Error> {
        let http = reqwest::Client::builder()
            .connect_timeout(CALL_TIMEOUT)
            .timeout(CALL_TIMEOUT)
            // The metadata service must be reached directly, never through a proxy.
            .no_proxy()
            .build()?;
        let token_url = url
            .path()
            .starts_with("/latest/meta-data/")
            .then(|| url.join("/latest/api/token").ok())
            .flatten();
        Ok(Watcher {
            http,
            url,
            period: period.max(Duration::from_millis(100)),
            token_url,
            token: None,
        })
    }

    /// Polls until the first notice, publishes it and returns. Failures to read the URL are
    /// logged once per streak and retried at the next period.
    pub async fn run(mut self, notice: watch::Sender<Option<InterruptionNotice>>) {
        tracing::info!(url = %self.url, poll_s = self.period.as_secs_f64(), "watching for spot interruption notices");
        let mut ticker = tokio::time::interval(self.period);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        loop {
            ticker.tick().await;
            match self.check().await {
                Ok(Some(found)) => {
                    tracing::warn!(action = %found.action, at = found.at.as_deref().unwrap_or("unknown"),
                        "spot interruption notice: this machine will be reclaimed");
                    notice.send_replace(Some(found));
                    return;
                }
                Ok(None) => {
                    if std::mem::take(&mut failing) {
                        tracing::info!(url = %self.url, "interruption notice URL readable again");
                    }
                }
                Err(e) => {
                    if !std::mem::replace(&mut failing, true) {
                        tracing::warn!(url = %self.url, error = %e, "cannot read the interruption notice URL; retrying");
                    }
                }
            }
        }
    }

    /// One read: `Some` when a notice is posted, `None` on 404.
    pub async fn check(&mut self) -> Result<Option<InterruptionNotice>, String> {
        let token = self.token().await;
        let mut req = self.http.get(self.url.clone());
        if let Some(t) = &token {
            req = req.header(TOKEN_HEADER, t);
        }
        let res = req.send().await.map_err(|e| e.to_string())?;
        match res.status() {
            StatusCode::NOT_FOUND => Ok(None),
            status if status.is_success() => {
                let body = res.bytes().await.map_err(|e| e.to_string())?;
                Ok(Some(parse_notice(&body)))
            }
            StatusCode::UNAUTHORIZED if token.is_some() => {
                // The token expired or the service restarted: fetch a new one next time.
                self.token = None;
                Err("the metadata service refused its session token".into())
            }
            status => Err(format!("HTTP {status}")),
        }
    }

    /// A valid IMDSv2 token, fetched when missing or about to expire; `None` when the URL is
    /// not EC2-style or the service gives none.
    async fn token(&mut self) -> Option<String> {
        let url = self.token_url.clone()?;
        if let Some((token, _)) = self
            .token
            .as_ref()
            .filter(|(_, until)| Instant::now() < *until)
        {
            return Some(token.clone());
        }
        let res = self
            .http
            .put(url)
            .header(TOKEN_TTL_HEADER, TOKEN_TTL.as_secs().to_string())
            .send()
            .await
            .ok()?;
        if !res.status().is_success() {
            return None;
        }
        let token = res.text().await.ok()?.trim().to_string();
        if token.is_empty() {
            return None;
        }
        self.token = Some((token.clone(), Instant::now() + TOKEN_TTL - TOKEN_MARGIN));
        Some(token)
    }
}

/// Reads a notice body; one that is not the expected JSON is still a notice to terminate.
pub fn parse_notice(body: &[u8]) -> InterruptionNotice {
    let parsed: Option<Body> = serde_json::from_slice(body).ok();
    let (action, at) = parsed.map_or((None, None), |b| (b.action, b.time));
    InterruptionNotice {
        action: action
            .filter(|a| !a.trim().is_empty())
            .unwrap_or_else(|| "terminate".to_string()),
        at: at.filter(|t| !t.trim().is_empty()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn reads_ec2_notices_and_tolerates_anything_else() {
        let check = |body: &str, action: &str, at: Option<&str>| {
            assert_eq!(
                parse_notice(body.as_bytes()),
                InterruptionNotice {
                    action: action.into(),
                    at: at.map(Into::into)
                },
                "{body}"
            );
        };
        check(
            r#"{"action": "terminate", "time": "2026-12-02T12:00:00Z"}"#,
            "terminate",
            Some("2026-12-02T12:00:00Z"),
        );
        check(
            r#"{"action": "stop", "time": "2026-12-02T12:00:00Z", "extra": 1}"#,
            "stop",
            Some("2026-12-02T12:00:00Z"),
        );
        check(r#"{"time": ""}"#, "terminate", None);
        check("", "terminate", None);
        check("<html>soon</html>", "terminate", None);
        check("[1, 2]", "terminate", None);
    }

    #[test]
    fn only_ec2_style_urls_ask_for_a_session_token() {
        let w = |u: &str| Watcher::new(u.parse().unwrap(), Duration::from_secs(5)).unwrap();
        assert_eq!(
            w("http://169.254.169.254/latest/meta-data/spot/instance-action")
                .token_url
                .unwrap()
                .as_str(),
            "http://169.254.169.254/latest/api/token"
        );
        assert!(
            w("http://127.0.0.1:9/spot/instance-action")
                .token_url
                .is_none()
        );
    }
}

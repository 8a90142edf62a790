//! The broker replicas an agent talks to, and the failover policy between them.
//!
//! Several broker replicas serve the same agent protocol on one database, so any of them can
//! answer any agent call. The agent keeps one *current* replica, shared by all its calls
//! (heartbeat, work, events, register), and sticks to it while it works. A failure that says
//! "this replica is unwell" — no connection, a broken or timed-out call, or a 502/503/504 from
//! whatever stands in front of it — moves the current replica to the next one in the list, and
//! the call is tried there at once. A call gives up after one full round through the list and
//! returns its last error; the caller then waits its usual backoff before the next round.
//! Other answers (a 4xx, a 500, a 429) come from a broker that is up: they stay with it.
//!
//! When one call moves on, calls still in flight on the replica it left (a 25-second long-poll
//! above all) are abandoned and re-issued on the new one, so that a replica that went silent
//! without closing its connections costs at most one short call timeout, not a long-poll's.

use crate::client::CallError;
use reqwest::{StatusCode, Url};
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::sync::watch;

/// Parses one `--broker` entry: an absolute `http` or `https` URL with a host. Surrounding
/// blanks are ignored (`SWITCHYARD_BROKER="http://a:8080, http://b:8080"`).
pub fn parse_broker_url(s: &str) -> Result<Url, String> {
    let s = s.trim();
    if s.is_empty() {
        return Err("empty broker URL (a stray comma?)".to_string());
    }
    let url = Url::parse(s).map_err(|e| format!("invalid broker URL `{s}`: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!(
            "invalid broker URL `{s}`: the scheme must be http or https"
        ));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(format!("invalid broker URL `{s}`: no host"));
    }
    Ok(url)
}

/// The form a broker URL is compared and joined in: its path ends with `/` (so that `join`
/// appends to it rather than replacing the last segment) and it has no query or fragment.
pub fn base_of(url: &Url) -> Url {
    let mut base = url.clone();
    base.set_query(None);
    base.set_fragment(None);
    if !base.path().ends_with('/') {
        let path = format!("{}/", base.path());
        base.set_path(&path);
    }
    base
}

/// The list without repeats (compared by [`base_of`]), first occurrences kept, in order.
pub fn dedup(urls: &[Url]) -> Vec<Url> {
    let mut seen = Vec::new();
    let mut out = Vec::new();
    for url in urls {
        let base = base_of(url);
        if seen.contains(&base) {
            tracing::warn!(broker = %url, "broker URL listed twice; using it once");
            continue;
        }
        seen.push(base);
        out.push(url.clone());
    }
    out
}

/// Whether a failed call should move to the next replica: the network (refused, reset, closed
/// mid-answer, timed out) or a gateway's "this backend is down" (502, 503, 504).
pub fn fails_over(error: &CallError) -> bool {
    match error {
        CallError::Network(_) => true,
        CallError::Status { status, .. } => matches!(
            *status,
            StatusCode::BAD_GATEWAY | StatusCode::SERVICE_UNAVAILABLE | StatusCode::GATEWAY_TIMEOUT
        ),
        CallError::Decode(_) => false,
    }
}

/// The replicas and which one is current; shared by every clone of a client.
#[derive(Debug)]
pub struct Brokers {
    /// In [`base_of`] form, without repeats, never empty.
    urls: Vec<Url>,
    current: watch::Sender<usize>,
    /// A call succeeded since the last switch: the next switch leaves a replica that worked
    /// (a warning), not one more in an outage (information).
    settled: AtomicBool,
}

/// Where a call goes: the replica's index and base URL, and a way to learn that the agent
/// moved on from it while the call was in flight.
#[derive(Debug)]
pub struct Target {
    pub index: usize,
    pub base: Url,
    moved: watch::Receiver<usize>,
}

impl Target {
    /// Resolves once the current replica is no longer this one.
    pub async fn moved_away(&mut self) {
        let index = self.index;
        if self.moved.wait_for(|c| *c != index).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

impl Brokers {
    /// The replicas of `urls` (repeats dropped), the first one current. None when empty.
    pub fn new(urls: &[Url]) -> Option<Brokers> {
        let urls: Vec<Url> = dedup(urls).iter().map(base_of).collect();
        if urls.is_empty() {
            return None;
        }
        Some(Brokers {
            urls,
            current: watch::Sender::new(0),
            settled: AtomicBool::new(true),
        })
    }

    pub fn len(&self) -> usize {
        self.urls.len()
    }

    /// Never true: a list is never empty (for clippy's `len_without_is_empty`).
    pub fn is_empty(&self) -> bool {
        self.urls.is_empty()
    }

    pub fn urls(&self) -> &[Url] {
        &self.urls
    }

    /// The current replica's base URL.
    pub fn current(&self) -> Url {
        self.urls[(*self.current.borrow()).min(self.urls.len() - 1)].clone()
    }

    /// The current replica, for one call.
    pub fn target(&self) -> Target {
        let mut moved = self.current.subscribe();
        let index = (*moved.borrow_and_update()).min(self.urls.len() - 1);
        Target {
            index,
            base: self.urls[index].clone(),
            moved,
        }
    }

    /// A call succeeded.
    pub fn succeeded(&self) {
        self.settled.store(true, Ordering::Relaxed);
    }

    /// A call on replica `from` failed in a way that [`fails_over`]: moves to the next replica
    /// unless another call already moved on from `from`. Returns the switch made, if any.
    pub fn fail_over(
        &self,
        from: usize,
        call: &'static str,
        error: &CallError,
    ) -> Option<(usize, usize)> {
        let to = next(self.urls.len(), from)?;
        let moved = self.current.send_if_modified(|c| {
            if *c == from {
                *c = to;
                true
            } else {
                false
            }
        });
        if !moved {
            return None;
        }
        let (from_url, to_url) = (self.urls[from].as_str(), self.urls[to].as_str());
        if self.settled.swap(false, Ordering::Relaxed) {
            tracing::warn!(from = %from_url, to = %to_url, call, error = %error, "switching to another broker");
        } else {
            tracing::info!(from = %from_url, to = %to_url, call, error = %error, "switching to another broker");
        }
        Some((from, to))
    }
}

/// The replica after `from` in a list of `len`, wrapping around; None when there is no other.
pub fn next(len: usize, from: usize) -> Option<usize> {
    (len > 1).then(|| (from + 1) % len)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn urls(list: &[&str]) -> Vec<Url> {
        list.iter().map(|u| parse_broker_url(u).unwrap()).collect()
    }

    fn status(code: u16) -> CallError {
        CallError::Status {
            status: StatusCode::from_u16(code).unwrap(),
            message: String::new(),
        }
    }

    #[test]
    fn parses_http_urls_and_says_what_is_wrong() {
        assert_eq!(
            parse_broker_url(" http://b:8080 ").unwrap().as_str(),
            "http://b:8080/"
        );
        assert_eq!(
            parse_broker_url("https://b.example.com/sy")
                .unwrap()
                .as_str(),
            "https://b.example.com/sy"
        );
        assert!(parse_broker_url("").unwrap_err().contains("empty"));
        assert!(parse_broker_url("  ").unwrap_err().contains("empty"));
        assert!(
            parse_broker_url("not a url")
                .unwrap_err()
                .contains("`not a url`")
        );
        assert!(
            parse_broker_url("ftp://b")
                .unwrap_err()
                .contains("http or https")
        );
    }

    #[test]
    fn bases_end_with_a_slash_and_repeats_are_dropped() {
        assert_eq!(
            base_of(&parse_broker_url("http://b:8080/sy").unwrap()).as_str(),
            "http://b:8080/sy/"
        );
        assert_eq!(
            base_of(&parse_broker_url("http://b:8080/sy/?x=1").unwrap()).as_str(),
            "http://b:8080/sy/"
        );
        let list = dedup(&urls(&[
            "http://a",
            "http://b/sy",
            "http://a/",
            "http://b/sy/",
        ]));
        assert_eq!(
            list.iter().map(Url::as_str).collect::<Vec<_>>(),
            ["http://a/", "http://b/sy"]
        );
        assert!(Brokers::new(&[]).is_none());
    }

    #[test]
    fn classifies_what_fails_over() {
        for code in [502, 503, 504] {
            assert!(fails_over(&status(code)), "{code}");
        }
        for code in [400, 401, 403, 404, 409, 429, 500] {
            assert!(!fails_over(&status(code)), "{code}");
        }
        assert!(!fails_over(&CallError::Decode("html".into())));
    }

    #[test]
    fn rotation_sticks_moves_on_failure_and_wraps() {
        let b = Brokers::new(&urls(&["http://a", "http://b", "http://c"])).unwrap();
        let err = status(503);
        assert_eq!(b.target().index, 0);
        b.succeeded();
        assert_eq!(b.target().index, 0, "sticks while it works");
        assert_eq!(b.fail_over(0, "work", &err), Some((0, 1)));
        assert_eq!(b.current().as_str(), "http://b/");
        // A second call that failed on `a` too must not skip `b`: someone moved on already.
        assert_eq!(b.fail_over(0, "heartbeat", &err), None);
        assert_eq!(b.target().index, 1);
        assert_eq!(b.fail_over(1, "work", &err), Some((1, 2)));
        assert_eq!(b.fail_over(2, "work", &err), Some((2, 0)), "wraps around");
        assert_eq!(b.target().base.as_str(), "http://a/");
    }

    #[test]
    fn one_broker_never_moves() {
        let b = Brokers::new(&urls(&["http://a"])).unwrap();
        assert_eq!(b.fail_over(0, "work", &status(503)), None);
        assert_eq!(b.target().index, 0);
        assert_eq!(next(1, 0), None);
        assert_eq!(next(2, 1), Some(0));
    }

    #[tokio::test]
    async fn a_call_in_flight_learns_that_the_agent_moved_on() {
        let b = Brokers::new(&urls(&["http://a", "http://b"])).unwrap();
        let mut on_a = b.target();
        let mut on_b = {
            b.fail_over(0, "heartbeat", &status(502));
            b.target()
        };
        // Resolves at once: the agent left `a` after this call began.
        tokio::time::timeout(std::time::Duration::from_secs(5), on_a.moved_away())
            .await
            .unwrap();
        // A call on the current replica is not disturbed.
        let waiting =
            tokio::time::timeout(std::time::Duration::from_millis(50), on_b.moved_away()).await;
        assert!(waiting.is_err());
    }
}

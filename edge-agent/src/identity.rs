//! Who this agent is to the broker: enrolment (register with a one-time token, retried until the
//! broker answers) and, with `--state-dir`, the saved result so that a restarted agent keeps its
//! id and token instead of needing a new enrolment token — with the same broker replicas, in
//! any order, or a list that shares one of them. The state file holds a secret: the directory
//! is kept 0700 and the file 0600 (written atomically), so that no job can read it.

use crate::args::Secret;
use crate::backoff::{Backoff, Streak};
use crate::brokers::base_of;
use crate::client::{BrokerClient, CallError};
use crate::error::AgentError;
use reqwest::Url;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::fmt;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;
use switchyard_protocol::agent::{RegisterRequest, RegisterResponse};
use tokio::time::Instant;

const STATE_FILE: &str = "agent.json";

/// What the state file holds: the enrolment, the broker it was made with and the replicas the
/// agent was given. `broker` was the only broker field before lists: it stays, so that an
/// older agent still reads the file.
#[derive(Serialize, Deserialize)]
struct Saved {
    broker: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    brokers: Vec<String>,
    registration: RegisterResponse,
}

/// A saved enrolment that the current broker list re-uses.
#[derive(Clone, PartialEq)]
pub struct SavedEnrolment {
    pub registration: RegisterResponse,
    /// The broker it was made with, as given then.
    pub enrolled_with: String,
    /// Whether it was saved with the same replicas, in any order; if not, save it again
    /// with the current ones.
    pub same_brokers: bool,
}

/// Without the agent token.
impl fmt::Debug for SavedEnrolment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SavedEnrolment")
            .field("agent_id", &self.registration.agent_id)
            .field("node_id", &self.registration.node_id)
            .field("enrolled_with", &self.enrolled_with)
            .field("same_brokers", &self.same_brokers)
            .finish_non_exhaustive()
    }
}

fn state_path(dir: &Path) -> PathBuf {
    dir.join(STATE_FILE)
}

fn state_error(path: &Path, message: impl ToString) -> AgentError {
    AgentError::State {
        path: path.to_path_buf(),
        message: message.to_string(),
    }
}

/// URLs in the form they are compared in ([`base_of`]); one that does not parse stays as is.
fn bases<'a>(urls: impl IntoIterator<Item = &'a str>) -> BTreeSet<String> {
    urls.into_iter()
        .map(|u| match Url::parse(u) {
            Ok(url) => base_of(&url).to_string(),
            Err(_) => u.to_string(),
        })
        .collect()
}

/// Creates the state directory owner-only (0700), or makes an existing one so, and keeps the
/// state file in it 0600: an older agent, or an operator's `mkdir`, may have left them open.
pub fn secure(dir: &Path) -> Result<(), AgentError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| state_error(dir, e))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| state_error(dir, e))?;
    let path = state_path(dir);
    match std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(state_error(&path, e)),
        _ => Ok(()),
    }
}

/// The saved enrolment, if it was made with the replicas of `brokers`. Replicas share one
/// database, so an enrolment is good on every replica of the federation: it is re-used when
/// the saved list and `brokers` have a URL in common (the same list, reordered, grown or
/// shrunk). One saved with other brokers only is ignored.
pub fn load(dir: &Path, brokers: &[Url]) -> Result<Option<SavedEnrolment>, AgentError> {
    let path = state_path(dir);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(state_error(&path, e)),
    };
    let saved: Saved = serde_json::from_str(&text)
        .map_err(|e| state_error(&path, format!("{e}; remove the file to enrol again")))?;
    let saved_list = if saved.brokers.is_empty() {
        vec![saved.broker.clone()]
    } else {
        saved.brokers.clone()
    };
    let then = bases(saved_list.iter().map(String::as_str));
    let now = bases(brokers.iter().map(Url::as_str));
    if then.is_disjoint(&now) {
        tracing::warn!(path = %path.display(), saved.brokers = %saved_list.join(","),
            "saved enrolment is for another broker; enrolling again");
        return Ok(None);
    }
    Ok(Some(SavedEnrolment {
        registration: saved.registration,
        enrolled_with: saved.broker,
        same_brokers: then == now,
    }))
}

/// Saves an enrolment made with `enrolled_with`, for the replicas `brokers`: written to a
/// temporary file with mode 0600, then renamed over the old one.
pub fn save(
    dir: &Path,
    enrolled_with: &str,
    brokers: &[Url],
    registration: &RegisterResponse,
) -> Result<(), AgentError> {
    let path = state_path(dir);
    secure(dir)?;
    let saved = Saved {
        broker: enrolled_with.to_string(),
        brokers: brokers.iter().map(|u| u.as_str().to_string()).collect(),
        registration: registration.clone(),
    };
    let text = serde_json::to_vec_pretty(&saved).map_err(|e| state_error(&path, e))?;
    let tmp = dir.join(format!("{STATE_FILE}.tmp"));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| state_error(&tmp, e))?;
    // `mode` applies only to a new file: one left behind keeps its mode unless set here.
    file.set_permissions(std::fs::Permissions::from_mode(0o600))
        .map_err(|e| state_error(&tmp, e))?;
    file.write_all(&text)
        .and_then(|()| file.sync_all())
        .map_err(|e| state_error(&tmp, e))?;
    std::fs::rename(&tmp, &path).map_err(|e| state_error(&path, e))
}

/// Removes a saved enrolment the broker no longer honours.
pub fn forget(dir: &Path) {
    let path = state_path(dir);
    if let Err(e) = std::fs::remove_file(&path)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(path = %path.display(), error = %e, "could not remove the stale agent state");
    }
}

/// Registers, retrying while the broker is unreachable or failing; a 4xx is final (a bad or
/// already used enrolment token). Also returns when the answered request was sent: the broker
/// records a new node's first heartbeat at registration, after that, so the lease runs from
/// then ([`crate::fence::LeaseClock::renewed`]).
pub async fn register(
    client: &BrokerClient,
    enrolment_token: &Secret,
    request: &RegisterRequest,
) -> Result<(RegisterResponse, Instant), AgentError> {
    let mut backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(10));
    let mut streak = Streak::new("register");
    loop {
        let sent = Instant::now();
        match client.register(enrolment_token, request).await {
            Ok(response) => {
                streak.succeeded();
                return Ok((response, sent));
            }
            Err(CallError::Status { status, message })
                if status.is_client_error() && !retryable(status) =>
            {
                return Err(AgentError::EnrolmentRefused {
                    status: status.as_u16(),
                    message,
                });
            }
            Err(e) => {
                streak.failed(&e);
                tokio::time::sleep(backoff.next_delay()).await;
            }
        }
    }
}

fn retryable(status: reqwest::StatusCode) -> bool {
    CallError::Status {
        status,
        message: String::new(),
    }
    .is_retryable()
}

/// The token of an enrolment, as a secret.
pub fn token(registration: &RegisterResponse) -> Secret {
    Secret::new(registration.agent_token.clone())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::os::unix::fs::PermissionsExt;
    use uuid::Uuid;

    fn registration() -> RegisterResponse {
        RegisterResponse {
            agent_id: Uuid::from_u128(7),
            node_id: "n1".into(),
            pool: "onprem:lab/l4".into(),
            agent_token: "tok".into(),
            heartbeat_interval_s: 5,
            lease_ttl_s: 30,
        }
    }

    fn list(urls: &[&str]) -> Vec<Url> {
        urls.iter().map(|u| u.parse().unwrap()).collect()
    }

    #[test]
    fn saves_and_loads_per_broker_owner_only() {
        let dir = tempfile::tempdir().unwrap();
        let b = list(&["http://b/"]);
        assert!(load(dir.path(), &b).unwrap().is_none());
        save(dir.path(), "http://b/", &b, &registration()).unwrap();
        let saved = load(dir.path(), &b).unwrap().unwrap();
        assert_eq!(saved.registration, registration());
        assert!(saved.same_brokers);
        assert_eq!(saved.enrolled_with, "http://b/");
        assert!(!format!("{saved:?}").contains("tok"), "{saved:?}");
        assert!(
            load(dir.path(), &list(&["http://other/"]))
                .unwrap()
                .is_none()
        );
        let mode = std::fs::metadata(dir.path().join(STATE_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        forget(dir.path());
        assert!(load(dir.path(), &b).unwrap().is_none());
    }

    fn mode_of(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn an_open_state_directory_and_file_are_made_owner_only() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("state");
        secure(&dir).unwrap();
        assert_eq!(mode_of(&dir), 0o700, "created owner-only");
        let b = list(&["http://b/"]);
        save(&dir, "http://b/", &b, &registration()).unwrap();
        let file = dir.join(STATE_FILE);
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        secure(&dir).unwrap();
        assert_eq!((mode_of(&dir), mode_of(&file)), (0o700, 0o600));
        // A temporary file left world-readable by a crash does not pass its mode on.
        let tmp_file = dir.join(format!("{STATE_FILE}.tmp"));
        std::fs::write(&tmp_file, "").unwrap();
        std::fs::set_permissions(&tmp_file, std::fs::Permissions::from_mode(0o644)).unwrap();
        save(&dir, "http://b/", &b, &registration()).unwrap();
        assert_eq!(mode_of(&file), 0o600);
    }

    #[test]
    fn a_list_reordered_grown_or_shrunk_keeps_the_enrolment() {
        let dir = tempfile::tempdir().unwrap();
        let ab = list(&["http://a:8080", "http://b:8080/sy"]);
        save(dir.path(), "http://b:8080/sy", &ab, &registration()).unwrap();
        let same = |urls: &[&str]| {
            load(dir.path(), &list(urls))
                .unwrap()
                .map(|s| (s.enrolled_with, s.same_brokers))
        };
        let enrolled = "http://b:8080/sy".to_string();
        assert_eq!(
            same(&["http://a:8080", "http://b:8080/sy"]),
            Some((enrolled.clone(), true))
        );
        assert_eq!(
            same(&["http://b:8080/sy/", "http://a:8080/"]),
            Some((enrolled.clone(), true))
        );
        assert_eq!(
            same(&["http://b:8080/sy", "http://c:8080"]),
            Some((enrolled.clone(), false))
        );
        assert_eq!(same(&["http://a:8080"]), Some((enrolled, false)));
        assert_eq!(same(&["http://c:8080", "http://d:8080"]), None);
    }

    #[test]
    fn reads_the_single_broker_file_of_older_agents_and_stays_readable_by_them() {
        let dir = tempfile::tempdir().unwrap();
        let old = serde_json::json!({"broker": "http://b:8080/", "registration": registration()});
        std::fs::write(dir.path().join(STATE_FILE), old.to_string()).unwrap();
        let saved = load(dir.path(), &list(&["http://b:8080"]))
            .unwrap()
            .unwrap();
        assert!(saved.same_brokers);
        let saved = load(dir.path(), &list(&["http://c:8080", "http://b:8080"]))
            .unwrap()
            .unwrap();
        assert!(!saved.same_brokers);
        // What an older agent reads: `broker` (the one enrolled with) and the registration.
        save(
            dir.path(),
            "http://b:8080/",
            &list(&["http://c:8080", "http://b:8080"]),
            &registration(),
        )
        .unwrap();
        let text = std::fs::read_to_string(dir.path().join(STATE_FILE)).unwrap();
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(json["broker"], "http://b:8080/");
        assert_eq!(
            json["brokers"],
            serde_json::json!(["http://c:8080/", "http://b:8080/"])
        );
        assert_eq!(json["registration"]["agent_token"], "tok");
    }

    #[test]
    fn a_corrupt_state_file_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(STATE_FILE), "{").unwrap();
        let err = load(dir.path(), &list(&["http://b/"]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("agent.json") && err.contains("remove the file"),
            "{err}"
        );
    }
}

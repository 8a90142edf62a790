//! Who this agent is to the broker: enrolment (register with a one-time token, retried until the
//! broker answers) and, with `--state-dir`, the saved result so that a restarted agent keeps its
//! id and token instead of needing a new enrolment token. The state file holds a secret: it is
//! written owner-only, atomically.

use crate::args::Secret;
use crate::backoff::{Backoff, Streak};
use crate::client::{BrokerClient, CallError};
use crate::error::AgentError;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;
use switchyard_protocol::agent::{RegisterRequest, RegisterResponse};

const STATE_FILE: &str = "agent.json";

/// What the state file holds: the enrolment, and the broker it was made with.
#[derive(Serialize, Deserialize)]
struct Saved {
    broker: String,
    registration: RegisterResponse,
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

/// The saved enrolment with `broker`, if any. One made with another broker is ignored.
pub fn load(dir: &Path, broker: &str) -> Result<Option<RegisterResponse>, AgentError> {
    let path = state_path(dir);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(state_error(&path, e)),
    };
    let saved: Saved = serde_json::from_str(&text)
        .map_err(|e| state_error(&path, format!("{e}; remove the file to enrol again")))?;
    if saved.broker != broker {
        tracing::warn!(path = %path.display(), saved.broker = %saved.broker, "saved enrolment is for another broker; enrolling again");
        return Ok(None);
    }
    Ok(Some(saved.registration))
}

/// Saves an enrolment: written to a temporary file with mode 0600, then renamed over the old one.
pub fn save(dir: &Path, broker: &str, registration: &RegisterResponse) -> Result<(), AgentError> {
    let path = state_path(dir);
    std::fs::create_dir_all(dir).map_err(|e| state_error(dir, e))?;
    let saved = Saved {
        broker: broker.to_string(),
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
/// already used enrolment token).
pub async fn register(
    client: &BrokerClient,
    request: &RegisterRequest,
) -> Result<RegisterResponse, AgentError> {
    let mut backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(10));
    let mut streak = Streak::new("register");
    loop {
        match client.register(request).await {
            Ok(response) => {
                streak.succeeded();
                return Ok(response);
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

    #[test]
    fn saves_and_loads_per_broker_owner_only() {
        let dir = tempfile::tempdir().unwrap();
        assert!(load(dir.path(), "http://b/").unwrap().is_none());
        save(dir.path(), "http://b/", &registration()).unwrap();
        assert_eq!(load(dir.path(), "http://b/").unwrap(), Some(registration()));
        assert!(load(dir.path(), "http://other/").unwrap().is_none());
        let mode = std::fs::metadata(dir.path().join(STATE_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        forget(dir.path());
        assert!(load(dir.path(), "http://b/").unwrap().is_none());
    }

    #[test]
    fn a_corrupt_state_file_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(STATE_FILE), "{").unwrap();
        let err = load(dir.path(), "http://b/").unwrap_err().to_string();
        assert!(
            err.contains("agent.json") && err.contains("remove the file"),
            "{err}"
        );
    }
}

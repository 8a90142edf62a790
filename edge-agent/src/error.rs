//! The agent's error type: the failures that end the agent, each with a message that tells the
//! operator what to do. Transient failures (broker unreachable, 5xx) never become an
//! `AgentError`; they are retried where they happen.

use std::path::PathBuf;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum AgentError {
    #[error(
        "no NVIDIA driver found ({0}); \
         pass --fake-gpus 4xH100-80GB to simulate GPUs"
    )]
    NoDriver(String),

    #[error(
        "the NVIDIA driver library is installed but the kernel driver is not loaded; \
         load it, or pass --fake-gpus 4xH100-80GB to simulate GPUs"
    )]
    DriverNotLoaded,

    #[error("reading the GPUs through NVML failed: {0}")]
    Nvml(String),

    #[error(
        "no enrolment token: pass --enrol-token TOKEN or set SWITCHYARD_ENROL_TOKEN \
         (`switchyard token create` makes one)"
    )]
    NoEnrolmentToken,

    #[error("the broker refused enrolment (HTTP {status}): {message}")]
    EnrolmentRefused { status: u16, message: String },

    #[error(
        "the broker refused this agent's token (HTTP 401 on {endpoint}): it was revoked or the \
         broker no longer knows this agent; enrol again with a new enrolment token"
    )]
    TokenRevoked { endpoint: &'static str },

    #[error("agent state file {path}: {message}")]
    State { path: PathBuf, message: String },

    #[error("no broker URL: pass --broker URL[,URL...] or set SWITCHYARD_BROKER")]
    NoBroker,

    #[error("cannot isolate jobs: {0}")]
    Isolation(String),

    #[error("invalid configuration: {0}")]
    Config(String),

    #[error("cannot build the HTTP client: {0}")]
    HttpClient(String),
}

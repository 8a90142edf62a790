//! Wire types of Switchyard's two boundaries: the REST API (`/api/v1`) and the agent protocol
//! (`/agent/v1`). Serde shapes only, no logic. Every request type rejects unknown fields, so a
//! typo in a job spec is an error rather than a silently ignored setting.

pub mod agent;
pub mod api;
pub mod gateway;

pub use api::{ErrorBody, ErrorDetail};

//! Everything that speaks HTTP: the connection loop and TLS, hostile-input limits, JSON
//! bodies, the one error shape, who the caller is, the web console, the REST handlers (`api/`)
//! and the agent protocol's (`agent_api`), and `/metrics`. Handlers validate, store and tell
//! the scheduler; they hold no placement logic.

pub mod agent_api;
pub mod api;
pub mod auth;
pub mod console;
pub mod error;
pub mod json;
pub mod limits;
pub mod metrics;
pub mod server;
pub mod tls;

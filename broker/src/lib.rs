//! The Switchyard broker: the control plane (REST API, agent protocol, scheduler loop, store)
//! and the `switchyard` command line.
//!
//! Flow: a handler validates and stores a job, then tells the [`scheduler`]; the scheduler
//! builds a snapshot, calls the pure `switchyard_core::plan`, commits the assignments in one
//! transaction and wakes the agents; agents long-poll for leases, run the work and report events
//! that the [`agent_api`] checks against their lease.

pub mod agent_api;
pub mod api;
pub mod app;
pub mod auth;
pub mod budget;
pub mod burst;
pub mod bus;
pub mod cli;
pub mod clock;
pub mod config;
pub mod console;
pub mod convert;
pub mod error;
pub mod heartbeats;
pub mod json;
pub mod leader;
pub mod lease;
pub mod ledger;
pub mod limits;
pub mod metrics;
pub mod policy;
pub mod scheduler;
pub mod server;
pub mod simulate;
pub mod store;
pub mod tls;
pub mod trace;
pub mod up;

//! The Switchyard broker: the control plane (REST API, agent protocol, scheduler loop, store)
//! and the `switchyard` command line.
//!
//! Flow: a handler validates and stores a job, then tells the [`control::scheduler`]; the
//! scheduler builds a snapshot, calls the pure `switchyard_core::plan`, commits the assignments
//! in one transaction and wakes the agents; agents long-poll for leases, run the work and report
//! events that [`http::agent_api`] checks against their lease ([`rules::lease`]).
//!
//! The parts, by folder:
//! - [`http`]: everything that speaks HTTP — the listener, TLS, limits, JSON, the one error
//!   shape, authentication, the console, the REST and agent handlers, `/metrics`.
//! - [`control`]: the loops that act over time — scheduler, burst controller, ledger accrual,
//!   leader election, heartbeat batching, the replicas' bus.
//! - [`rules`]: pure business rules — policies and what-if, budgets, wire ↔ domain conversion,
//!   lease fencing.
//! - [`store`]: the database, one transaction per method.
//! - At the top: start-up and state ([`app`], [`config`], [`clock`]), the command line
//!   ([`cli`], [`up`], [`simulate`]), and trace joining ([`trace`]).

pub mod app;
pub mod cli;
pub mod clock;
pub mod config;
pub mod control;
pub mod gateway;
pub mod http;
pub mod rules;
pub mod simulate;
pub mod state;
pub mod store;
pub mod trace;
pub mod up;

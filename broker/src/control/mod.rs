//! The loops that act over time, on the leader (the bus and heartbeat batching on every
//! replica): the scheduler (plan, commit, explain), the burst controller (launch, boot timeout,
//! idle release, orphan reaping), the ledger's accrual, the services reconciler (replicas),
//! leader election, the heartbeat writer, the waste rule (jobs holding GPUs idle), and the notes
//! replicas send each other.

pub mod burst;
pub mod bus;
pub mod heartbeats;
pub mod leader;
pub mod ledger;
pub mod scheduler;
pub mod services;
pub mod waste;

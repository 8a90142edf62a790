//! Business rules: team policies and what-if, budgets, the conversion between wire and domain
//! values (where dollars become micro-dollars), GPU-hour rates, lease fencing, inference
//! services' specs and schedules, and GPU health (`health`: sick GPUs, impossible readings).
//! The loops and handlers call them; they call no loop or handler. Pure but for three
//! functions that read what they judge from the store: `policy::check_submit_against_store`,
//! `budget::statuses` and `budget::round_policies`.

pub mod autoscale;
pub mod budget;
pub mod convert;
pub mod gang;
pub mod health;
pub mod lease;
pub mod policy;
pub mod rates;
pub mod replicas;
pub mod service;
pub mod what_if;

//! Switchyard's domain and placement engine.
//!
//! This crate is pure: it does no I/O, reads no clock (time is always an argument), spawns nothing
//! and depends on no async runtime, database, HTTP or cloud crate. The live broker and the simulator
//! call the same functions, so a decision can always be replayed.

pub mod domain;
pub mod gpu_model;
pub mod gpu_set;
pub mod money;
pub mod placement;
pub mod predict;
pub mod serving;
pub mod sim;
pub mod time;
pub mod validate;
pub mod waste;

pub use domain::*;
pub use money::Money;
pub use placement::{
    Assignment, Candidate, CandidateKind, Explanation, Hold, HoldCode, Launch, Outcome, Plan,
    PlanCache, Planner, Preemption, Rejection, plan, plan_shared, plan_shared_cached,
};
pub use predict::{JobKey, Prediction, Predictor};
pub use time::Timestamp;
pub use validate::{Unsatisfiable, check_satisfiable};

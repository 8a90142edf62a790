//! The agent protocol (`/agent/v1`), both ways. The first byte picks a message, the rest is its
//! JSON body.
//!
//! Agent → broker (register, heartbeat, events) is read with the broker's JSON reader
//! (`json::parse`, what `ApiJson` runs) and put through the rules the handlers and both stores
//! apply without a database: the node name made from the hostname, which attempts a heartbeat
//! stops (`heartbeat_stops`), the lease rule's verdict on every report in every attempt state
//! (`lease::judge`), what a `finished` report makes of a job (`finished_outcome`).
//! Broker → agent (the register, heartbeat, work and events answers) is read the way the
//! agent's client reads it (`serde_json::from_slice`), and every lease goes through what the
//! agent does with it before and after spawning: the attempt table, the grace period and its
//! deadlines, `CUDA_VISIBLE_DEVICES`, the stop-everything at shutdown.
//!
//! Asserts: nothing panics; a refused body is a 400; every message read re-serialises and
//! reads back equal; and the rules' own promises (below).

#![no_main]

use libfuzzer_sys::fuzz_target;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::fmt::Debug;
use std::time::{Duration, Instant};
use switchyard_agent::attempts::{AttemptTable, StopReason};
use switchyard_agent::inventory::cuda_visible_devices;
use switchyard_agent::runner::{self, MAX_GRACE, RunOptions};
use switchyard_broker::http::error::ApiError;
use switchyard_broker::rules::lease::{self, AttemptState, Verdict, finished_outcome};
use switchyard_broker::store::heartbeat_stops;
use switchyard_core::JobState;
use switchyard_protocol::agent::{
    AgentEvent, AttemptRef, EventBatch, EventBatchResponse, Heartbeat, HeartbeatResponse,
    RegisterRequest, RegisterResponse, WorkResponse,
};

/// The agent's margin after the longest grace at shutdown (`agent::STOP_MARGIN`).
const STOP_MARGIN: Duration = Duration::from_secs(10);

/// Agent → broker: read as the broker reads request bodies; a refusal is a 400.
fn broker_reads<T: DeserializeOwned + Serialize + PartialEq + Debug>(body: &[u8]) -> Option<T> {
    match switchyard_broker::http::json::parse::<T>(body) {
        Ok(v) => {
            round_trips(&v);
            Some(v)
        }
        Err(e) => {
            assert!(matches!(e, ApiError::BadRequest { .. }), "{e:?}");
            None
        }
    }
}

/// Broker → agent: read as the agent's client reads answers.
fn agent_reads<T: DeserializeOwned + Serialize + PartialEq + Debug>(body: &[u8]) -> Option<T> {
    let v: T = serde_json::from_slice(body).ok()?;
    round_trips(&v);
    Some(v)
}

fn round_trips<T: DeserializeOwned + Serialize + PartialEq + Debug>(v: &T) {
    let text = serde_json::to_string(v).expect("serialises");
    let again: T = serde_json::from_str(&text).expect("what was written reads back");
    if &again != v {
        // serde_json (without its `float_roundtrip` feature) may read a float back one ulp
        // off (found by this target: a GPU's `power_w`); anything else must be equal.
        let a = serde_json::to_value(v).expect("to a value");
        let b = serde_json::to_value(&again).expect("to a value");
        assert!(
            same_but_ulps(&a, &b),
            "round trip through {text}: {v:?} != {again:?}"
        );
    }
}

fn same_but_ulps(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    use serde_json::Value;
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_f64(), y.as_f64()) {
            (Some(x), Some(y)) if x.is_finite() && y.is_finite() => {
                x == y || (x - y).abs() <= 4.0 * f64::EPSILON * x.abs().max(y.abs())
            }
            _ => x == y,
        },
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same_but_ulps(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| same_but_ulps(v, w)))
        }
        _ => a == b,
    }
}

fn register(req: &RegisterRequest) {
    // The handler: the hostname, at most 128 characters, names the node.
    let hostname: String = req.hostname.chars().take(128).collect();
    let name = switchyard_broker::http::agent_api::sanitize(&hostname);
    assert!(!name.is_empty() && name.len() <= 40, "{name:?}");
    assert!(name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'));
    serde_json::to_string(&req.inventory).expect("the inventory is stored as JSON");
}

fn heartbeat(hb: &Heartbeat) {
    // The node's live attempts, one row per attempt id like the stores' query (an attempt has
    // one epoch and one state): the first ones the agent reports, in a state from their epoch,
    // with a cancel requested on odd epochs; except that the first was leased again under the
    // next epoch (the agent reports a stale one) and is running with a cancel requested; and,
    // when the agent reports nothing, one it does not report.
    const STATES: [&str; 3] = ["assigned", "running", "preempting"];
    let mut live: Vec<(AttemptRef, String, bool)> = Vec::new();
    for r in hb.running.iter().take(4) {
        if !live.iter().any(|(l, _, _)| l.attempt_id == r.attempt_id) {
            let state = STATES[(r.epoch % 3) as usize].to_string();
            live.push((r.clone(), state, r.epoch % 2 == 1));
        }
    }
    let mut extra = hb.running.first().cloned().unwrap_or(AttemptRef {
        job_id: uuid::Uuid::from_u128(1),
        attempt_id: uuid::Uuid::from_u128(2),
        epoch: 0,
    });
    extra.epoch = extra.epoch.wrapping_add(1);
    match live.first_mut() {
        Some(first) => *first = (extra, "running".into(), true),
        None => live.push((extra, "running".into(), true)),
    }
    let stop = heartbeat_stops(&live, &hb.running);
    for (i, s) in stop.iter().enumerate() {
        assert!(!stop[..i].contains(s), "{s:?} twice in stop");
        assert!(hb.running.contains(s) || live.iter().any(|(l, _, _)| l == s));
    }
    for r in &hb.running {
        let leased = live
            .iter()
            .any(|(l, st, _)| l == r && (st == "assigned" || st == "running"));
        assert!(
            leased || stop.contains(r),
            "{r:?} is not a lease yet not stopped"
        );
    }
    for (l, state, cancel) in &live {
        let must_stop = state == "preempting" || (state == "running" && *cancel);
        let leased = live
            .iter()
            .any(|(x, st, _)| x == l && (st == "assigned" || st == "running"));
        let foreign = hb.running.contains(l) && !leased;
        assert_eq!(
            stop.contains(l),
            must_stop || foreign,
            "{l:?} ({state}, cancel {cancel})"
        );
    }
}

fn events(batch: &EventBatch) {
    for e in &batch.events {
        // The lease rule: a report about no lease, or about a withdrawn one, changes nothing;
        // only a live lease starts, finishes or requeues; a verdict fits its report.
        for cancel in [false, true] {
            assert_eq!(
                lease::judge(None, e, cancel),
                Verdict::Reject(lease::NOT_A_LEASE)
            );
            for state in AttemptState::ALL {
                let verdict = lease::judge(Some(state), e, cancel);
                let changes = matches!(
                    verdict,
                    Verdict::Start | Verdict::Finish { .. } | Verdict::Requeue(_)
                );
                assert!(!changes || state.is_live(), "{state:?} {e:?}: {verdict:?}");
                match (&verdict, e) {
                    (Verdict::Start, AgentEvent::Started { .. })
                    | (Verdict::KeepLog, AgentEvent::Log { .. })
                    | (Verdict::Finish { .. } | Verdict::Requeue(_), AgentEvent::Finished { .. })
                    | (Verdict::Duplicate | Verdict::Reject(_), _) => {}
                    _ => panic!("{state:?} {e:?}: {verdict:?} does not fit the report"),
                }
            }
        }
        if let AgentEvent::Finished {
            exit_code,
            signal,
            error,
            stopped,
            ..
        } = e
        {
            for cancel in [false, true] {
                let (state, reason) =
                    finished_outcome(cancel, *exit_code, *signal, error.as_deref(), *stopped);
                let expected = if cancel {
                    JobState::Cancelled
                } else if *exit_code == Some(0) && error.is_none() {
                    JobState::Succeeded
                } else {
                    JobState::Failed
                };
                assert_eq!(state, expected);
                assert_eq!(
                    reason.is_some(),
                    state != JobState::Succeeded || error.is_some()
                );
            }
        }
    }
}

/// The runner's options need a job sandbox; these targets start no job, so one without uids,
/// made once, serves every input.
fn sandbox() -> std::sync::Arc<switchyard_agent::isolation::Sandbox> {
    static SANDBOX: std::sync::OnceLock<std::sync::Arc<switchyard_agent::isolation::Sandbox>> =
        std::sync::OnceLock::new();
    SANDBOX
        .get_or_init(|| {
            let root = std::env::temp_dir().join("switchyard-fuzz-jobs");
            std::sync::Arc::new(
                switchyard_agent::isolation::Sandbox::new(&root, None, Vec::new())
                    .expect("a job sandbox in the temp directory"),
            )
        })
        .clone()
}

fn work(answer: &WorkResponse) {
    let table = AttemptTable::new();
    let opts = RunOptions {
        default_grace: Duration::from_secs(30),
        sandbox: sandbox(),
        serving: std::sync::Arc::new(
            switchyard_agent::serving::Serving::new("127.0.0.1").expect("a loopback host"),
        ),
        gpu_sim: None,
    };
    let mut admitted = std::collections::BTreeSet::new();
    for lease in &answer.leases {
        let grace = runner::grace_of(lease, &opts);
        assert!(grace <= MAX_GRACE);
        // group::terminate's SIGKILL deadline.
        assert!(Instant::now().checked_add(grace).is_some());
        let devices = cuda_visible_devices(&lease.gpus);
        let back: Vec<u32> = if devices.is_empty() {
            Vec::new()
        } else {
            devices
                .split(',')
                .map(|d| d.parse().expect("an index"))
                .collect()
        };
        assert_eq!(back, lease.gpus);
        // Delivery is at least once: a lease is admitted only the first time.
        let fresh = admitted.insert(lease.attempt.attempt_id);
        assert_eq!(table.admit(lease, grace).is_some(), fresh);
    }
    for s in &answer.stop {
        assert_eq!(
            table.stop(s.attempt_id, StopReason::Broker),
            admitted.contains(&s.attempt_id)
        );
    }
    assert_eq!(table.running_count(), admitted.len());
    // Shutdown: stop everything, wait for the longest grace and a margin.
    let longest = table.stop_all(StopReason::Shutdown);
    assert!(longest <= MAX_GRACE);
    let wait = longest + STOP_MARGIN;
    assert!(Instant::now().checked_add(wait).is_some());
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, body)) = data.split_first() else {
        return;
    };
    match which % 7 {
        0 => {
            if let Some(req) = broker_reads::<RegisterRequest>(body) {
                register(&req);
            }
        }
        1 => {
            if let Some(hb) = broker_reads::<Heartbeat>(body) {
                heartbeat(&hb);
            }
        }
        2 => {
            if let Some(batch) = broker_reads::<EventBatch>(body) {
                events(&batch);
            }
        }
        3 => {
            agent_reads::<RegisterResponse>(body);
        }
        4 => {
            agent_reads::<HeartbeatResponse>(body);
        }
        5 => {
            if let Some(answer) = agent_reads::<WorkResponse>(body) {
                work(&answer);
            }
        }
        _ => {
            agent_reads::<EventBatchResponse>(body);
        }
    }
});

//! The whole agent (`run_until`) against a minimal in-test broker that implements the four agent
//! endpoints: enrolment, leases, ordered event delivery with retries, rejected leases, revoked
//! tokens, saved state and shutdown; and against an in-test instance-metadata service for spot
//! interruption notices. Waits poll with a deadline; no fixed sleeps.
#![allow(clippy::unwrap_used)]

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;
use std::collections::{BTreeMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use switchyard_agent::{AgentArgs, group};
use switchyard_protocol::agent::*;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use uuid::Uuid;

const DEADLINE: Duration = Duration::from_secs(20);
const TOKEN: &str = "agent-token";

#[derive(Default)]
struct Broker {
    registers: usize,
    register_refusal: Option<(StatusCode, String)>,
    revoked: bool,
    leases: VecDeque<Lease>,
    /// Attempts to stop, handed out with the next work answer.
    stops: Vec<AttemptRef>,
    drain: bool,
    heartbeats: Vec<Heartbeat>,
    /// Events accepted, in arrival order.
    events: Vec<AgentEvent>,
    /// Events answered `Rejected`.
    rejected_events: Vec<AgentEvent>,
    reject: HashSet<Uuid>,
    /// Event posts to answer with 503 before accepting any.
    fail_event_posts: usize,
    failed_event_posts: usize,
    /// Work long-polls received.
    work_polls: usize,
    /// While set, heartbeats are received (counted in `held_heartbeats`) but not answered, like
    /// the broker's heartbeat batch not yet written.
    hold_heartbeats: bool,
    held_heartbeats: usize,
}

type Shared = Arc<Mutex<Broker>>;

fn authorised(b: &Broker, headers: &HeaderMap) -> bool {
    !b.revoked
        && headers.get("authorization").and_then(|v| v.to_str().ok())
            == Some(&format!("Bearer {TOKEN}"))
}

fn unauthorised() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        Json(json!({"error": {"code": "unauthorized", "message": "bad token"}})),
    )
        .into_response()
}

async fn register(
    State(s): State<Shared>,
    headers: axum::http::HeaderMap,
    Json(_req): Json<RegisterRequest>,
) -> Response {
    let mut b = s.lock().unwrap();
    if let Some((status, message)) = &b.register_refusal {
        return (
            *status,
            Json(json!({"error": {"code": "forbidden", "message": message}})),
        )
            .into_response();
    }
    assert_eq!(
        headers.get("authorization").unwrap().to_str().unwrap(),
        "Bearer enrol-me"
    );
    b.registers += 1;
    Json(RegisterResponse {
        agent_id: Uuid::now_v7(),
        node_id: "node-1".into(),
        pool: "onprem:test/l4".into(),
        agent_token: TOKEN.into(),
        heartbeat_interval_s: 1,
        lease_ttl_s: 10,
    })
    .into_response()
}

async fn heartbeat(
    State(s): State<Shared>,
    headers: HeaderMap,
    Json(beat): Json<Heartbeat>,
) -> Response {
    s.lock().unwrap().held_heartbeats += 1;
    while s.lock().unwrap().hold_heartbeats {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut b = s.lock().unwrap();
    if !authorised(&b, &headers) {
        return unauthorised();
    }
    // Like the real broker: an interruption notice takes the node's work back.
    let stop = match &beat.interruption {
        Some(_) => beat.running.clone(),
        None => vec![],
    };
    b.heartbeats.push(beat);
    Json(HeartbeatResponse {
        stop,
        drain: b.drain,
    })
    .into_response()
}

#[derive(Deserialize)]
struct Wait {
    wait_s: u64,
}

async fn work(State(s): State<Shared>, headers: HeaderMap, Query(w): Query<Wait>) -> Response {
    // Long-poll: answer as soon as there is a lease, or empty after the wait.
    let until = Instant::now() + Duration::from_secs(w.wait_s);
    s.lock().unwrap().work_polls += 1;
    loop {
        {
            let mut b = s.lock().unwrap();
            if !authorised(&b, &headers) {
                return unauthorised();
            }
            if !b.leases.is_empty() || !b.stops.is_empty() || Instant::now() >= until {
                let leases = b.leases.drain(..).collect();
                let stop = std::mem::take(&mut b.stops);
                return Json(WorkResponse { leases, stop }).into_response();
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn events(
    State(s): State<Shared>,
    headers: HeaderMap,
    Json(batch): Json<EventBatch>,
) -> Response {
    let mut b = s.lock().unwrap();
    if !authorised(&b, &headers) {
        return unauthorised();
    }
    if b.failed_event_posts < b.fail_event_posts {
        b.failed_event_posts += 1;
        return (StatusCode::SERVICE_UNAVAILABLE, "try later").into_response();
    }
    let mut results = Vec::new();
    for event in batch.events {
        if b.reject.contains(&attempt_id(&event)) {
            b.rejected_events.push(event);
            results.push(EventResult {
                status: EventStatus::Rejected,
                reason: Some("stale epoch".into()),
            });
        } else {
            b.events.push(event);
            results.push(EventResult {
                status: EventStatus::Accepted,
                reason: None,
            });
        }
    }
    Json(EventBatchResponse { results }).into_response()
}

fn attempt_id(event: &AgentEvent) -> Uuid {
    match event {
        AgentEvent::Started { attempt, .. }
        | AgentEvent::Log { attempt, .. }
        | AgentEvent::Finished { attempt, .. } => attempt.attempt_id,
    }
}

/// Starts the test broker; returns its state and base URL.
async fn broker(init: Broker) -> (Shared, String) {
    let state: Shared = Arc::new(Mutex::new(init));
    let app = Router::new()
        .route("/agent/v1/register", post(register))
        .route("/agent/v1/heartbeat", post(heartbeat))
        .route("/agent/v1/work", get(work))
        .route("/agent/v1/events", post(events))
        .with_state(state.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (state, url)
}

fn args(url: &str, state_dir: Option<PathBuf>) -> AgentArgs {
    let mut a = AgentArgs::new(url.parse().unwrap());
    a.enrol_token = Some("enrol-me".parse().unwrap());
    a.fake_gpus = vec!["2xL4".parse().unwrap()];
    a.name = Some("test-agent".into());
    a.grace_s = 1;
    a.poll_wait_s = 1;
    a.state_dir = state_dir;
    a
}

/// A running agent and the switch that shuts it down.
struct Agent {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<anyhow::Result<()>>,
}

impl Agent {
    fn start(args: AgentArgs) -> Agent {
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(switchyard_agent::run_until(args, async move {
            let _ = rx.await;
        }));
        Agent {
            stop: Some(tx),
            task,
        }
    }

    /// Signals shutdown and waits for the agent's result.
    async fn shut_down(mut self) -> anyhow::Result<()> {
        let _ = self.stop.take().unwrap().send(());
        tokio::time::timeout(DEADLINE, self.task)
            .await
            .expect("agent did not shut down")
            .unwrap()
    }

    /// Waits for the agent to end on its own.
    async fn ended(self) -> anyhow::Result<()> {
        tokio::time::timeout(DEADLINE, self.task)
            .await
            .expect("agent did not end")
            .unwrap()
    }
}

/// Polls the broker state until `pick` returns something.
async fn eventually<T>(
    state: &Shared,
    what: &str,
    mut pick: impl FnMut(&Broker) -> Option<T>,
) -> T {
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Some(found) = pick(&state.lock().unwrap()) {
            return found;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn wait_gone(pid: u32) {
    let deadline = Instant::now() + DEADLINE;
    while group::process_alive(pid) {
        assert!(Instant::now() < deadline, "process {pid} still alive");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn lease(command: &[&str]) -> Lease {
    Lease {
        expected_gpu_utilization_pct: None,
        attempt: AttemptRef {
            job_id: Uuid::now_v7(),
            attempt_id: Uuid::now_v7(),
            epoch: 3,
        },
        command: command.iter().map(|s| s.to_string()).collect(),
        env: BTreeMap::new(),
        gpus: vec![1],
        grace_s: 1,
        traceparent: None,
        serve: None,
    }
}

fn finished_of(b: &Broker, id: Uuid) -> Option<AgentEvent> {
    b.events
        .iter()
        .find(|e| matches!(e, AgentEvent::Finished { .. }) && attempt_id(e) == id)
        .cloned()
}

fn started_pid(events: &[AgentEvent], id: Uuid) -> Option<u32> {
    events.iter().find_map(|e| match e {
        AgentEvent::Started { attempt, pid } if attempt.attempt_id == id => Some(*pid),
        _ => None,
    })
}

#[tokio::test]
async fn runs_a_lease_and_reports_it_in_order_through_broker_failures() {
    let l = lease(&["echo", "hello"]);
    let id = l.attempt.attempt_id;
    // The same lease twice (at-least-once delivery): it must run once.
    let (state, url) = broker(Broker {
        leases: [l.clone(), l.clone()].into(),
        fail_event_posts: 2,
        ..Broker::default()
    })
    .await;
    let agent = Agent::start(args(&url, None));

    eventually(&state, "Finished", |b| finished_of(b, id)).await;
    let beat = eventually(&state, "a heartbeat", |b| b.heartbeats.first().cloned()).await;
    agent.shut_down().await.unwrap();

    let b = state.lock().unwrap();
    assert_eq!(b.registers, 1);
    assert_eq!(b.failed_event_posts, 2, "the outbox retried through 503s");
    let attempt = l.attempt.clone();
    let pid = started_pid(&b.events, id).unwrap();
    assert_eq!(
        b.events,
        vec![
            AgentEvent::Started {
                attempt: attempt.clone(),
                pid
            },
            AgentEvent::Log {
                attempt: attempt.clone(),
                seq: 0,
                stream: Stream::Stdout,
                data: "hello\n".into()
            },
            AgentEvent::Finished {
                attempt,
                exit_code: Some(0),
                signal: None,
                error: None,
                stopped: false,
                requeue: false,
                drained: false
            },
        ]
    );
    assert!(beat.inventory.simulated);
    assert_eq!(
        beat.inventory
            .gpus
            .iter()
            .map(|g| g.model.as_str())
            .collect::<Vec<_>>(),
        ["L4", "L4"]
    );
}

#[tokio::test]
async fn a_rejected_event_stops_the_lease_and_silences_it() {
    let l = lease(&["sleep", "300"]);
    let id = l.attempt.attempt_id;
    let (state, url) = broker(Broker {
        leases: [l].into(),
        reject: [id].into(),
        ..Broker::default()
    })
    .await;
    let agent = Agent::start(args(&url, None));

    let pid = eventually(&state, "the rejected Started", |b| {
        started_pid(&b.rejected_events, id)
    })
    .await;
    wait_gone(pid).await;
    // Once a later heartbeat no longer lists it, its runner is done: nothing more was sent.
    let seen = state.lock().unwrap().heartbeats.len();
    eventually(&state, "a later heartbeat without the attempt", |b| {
        b.heartbeats[seen..]
            .iter()
            .find(|h| h.running.is_empty())
            .map(|_| ())
    })
    .await;
    agent.shut_down().await.unwrap();
    let b = state.lock().unwrap();
    assert!(b.events.is_empty(), "{:?}", b.events);
    assert_eq!(
        b.rejected_events.len(),
        1,
        "only Started: {:?}",
        b.rejected_events
    );
}

#[tokio::test]
async fn a_broker_stop_ends_the_job_as_stopped() {
    let l = lease(&["sleep", "300"]);
    let id = l.attempt.attempt_id;
    let (state, url) = broker(Broker {
        leases: [l.clone()].into(),
        ..Broker::default()
    })
    .await;
    let agent = Agent::start(args(&url, None));
    let pid = eventually(&state, "Started", |b| started_pid(&b.events, id)).await;
    state.lock().unwrap().stops.push(l.attempt.clone());

    let finished = eventually(&state, "Finished", |b| finished_of(b, id)).await;
    assert!(!group::process_alive(pid));
    match finished {
        AgentEvent::Finished {
            stopped,
            signal,
            exit_code,
            ..
        } => {
            assert_eq!((stopped, signal, exit_code), (true, Some(15), None));
        }
        other => panic!("{other:?}"),
    }
    agent.shut_down().await.unwrap();
}

#[tokio::test]
async fn drain_takes_no_new_work_until_lifted() {
    let (state, url) = broker(Broker {
        drain: true,
        ..Broker::default()
    })
    .await;
    let agent = Agent::start(args(&url, None));
    // Three beats: the drain is applied and any long-poll begun before it has returned.
    eventually(&state, "three heartbeats", |b| {
        (b.heartbeats.len() >= 3).then_some(())
    })
    .await;
    let l = lease(&["echo", "after drain"]);
    let id = l.attempt.attempt_id;
    state.lock().unwrap().leases.push_back(l);
    let seen = state.lock().unwrap().heartbeats.len();
    eventually(&state, "two more heartbeats", |b| {
        (b.heartbeats.len() >= seen + 2).then_some(())
    })
    .await;
    {
        let b = state.lock().unwrap();
        assert_eq!(b.leases.len(), 1, "a draining agent polled for work");
        assert!(b.events.is_empty());
    }
    state.lock().unwrap().drain = false;
    eventually(&state, "the lease to run after the drain", |b| {
        finished_of(b, id)
    })
    .await;
    agent.shut_down().await.unwrap();
}

/// An orderly shutdown drains: the job gets SIGTERM (its checkpoint signal) and is reported
/// `drained`, for the broker to requeue, never as a plain failure.
#[tokio::test]
async fn shutdown_drains_running_jobs_and_flushes_their_end() {
    let l = lease(&["sleep", "300"]);
    let id = l.attempt.attempt_id;
    let (state, url) = broker(Broker {
        leases: [l].into(),
        ..Broker::default()
    })
    .await;
    let agent = Agent::start(args(&url, None));
    let pid = eventually(&state, "Started", |b| started_pid(&b.events, id)).await;

    agent.shut_down().await.unwrap();
    assert!(!group::process_alive(pid), "the job outlived the agent");
    match finished_of(&state.lock().unwrap(), id) {
        Some(AgentEvent::Finished {
            stopped,
            error,
            signal,
            drained,
            requeue,
            ..
        }) => {
            assert!(!stopped && !requeue);
            assert!(drained, "reported as drained");
            assert_eq!(signal, Some(15));
            assert_eq!(
                error.unwrap(),
                "stopped because the agent is shutting down: sent SIGTERM"
            );
        }
        other => panic!("no Finished flushed: {other:?}"),
    }
}

#[tokio::test]
async fn a_refused_enrolment_is_a_clear_error() {
    let refusal = Some((
        StatusCode::FORBIDDEN,
        "enrolment token already used".to_string(),
    ));
    let (_state, url) = broker(Broker {
        register_refusal: refusal,
        ..Broker::default()
    })
    .await;
    let err = Agent::start(args(&url, None))
        .ended()
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("refused enrolment (HTTP 403): enrolment token already used"),
        "{err}"
    );
}

#[tokio::test]
async fn a_revoked_token_ends_the_agent_and_forgets_the_saved_state() {
    let dir = tempfile::tempdir().unwrap();
    let (state, url) = broker(Broker::default()).await;
    let agent = Agent::start(args(&url, Some(dir.path().into())));
    eventually(&state, "a heartbeat", |b| b.heartbeats.first().map(|_| ())).await;
    assert!(dir.path().join("agent.json").exists());
    state.lock().unwrap().revoked = true;
    let err = agent.ended().await.unwrap_err().to_string();
    assert!(
        err.contains("HTTP 401") && err.contains("enrol again"),
        "{err}"
    );
    assert!(!dir.path().join("agent.json").exists());
}

/// The registration is the lease's first renewal (the broker writes the node with its first
/// heartbeat before answering it): a freshly enrolled agent takes its first lease without waiting
/// for a heartbeat's answer. An agent restarted on a saved enrolment still waits for one.
#[tokio::test]
async fn a_fresh_enrolment_takes_work_before_its_first_heartbeat_is_answered() {
    let dir = tempfile::tempdir().unwrap();
    let l = lease(&["true"]);
    let id = l.attempt.attempt_id;
    let (state, url) = broker(Broker {
        leases: [l].into(),
        hold_heartbeats: true,
        ..Broker::default()
    })
    .await;
    let agent = Agent::start(args(&url, Some(dir.path().into())));
    eventually(&state, "Finished", |b| finished_of(b, id)).await;
    {
        let b = state.lock().unwrap();
        assert!(b.heartbeats.is_empty(), "no heartbeat was answered");
        assert!(started_pid(&b.events, id).is_some());
    }
    state.lock().unwrap().hold_heartbeats = false;
    agent.shut_down().await.unwrap();

    // Restarted on the saved enrolment: no renewal yet, so no long-poll until a heartbeat is
    // answered.
    let l = lease(&["true"]);
    let id = l.attempt.attempt_id;
    let (polls, held) = {
        let mut b = state.lock().unwrap();
        b.hold_heartbeats = true;
        b.leases = [l].into();
        (b.work_polls, b.held_heartbeats)
    };
    let mut again = args(&url, Some(dir.path().into()));
    again.enrol_token = None;
    let agent = Agent::start(again);
    eventually(&state, "a held heartbeat after the restart", |b| {
        (b.held_heartbeats > held).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        state.lock().unwrap().work_polls,
        polls,
        "fenced: no poll yet"
    );
    state.lock().unwrap().hold_heartbeats = false;
    eventually(&state, "Finished after the restart", |b| finished_of(b, id)).await;
    agent.shut_down().await.unwrap();
    assert_eq!(state.lock().unwrap().registers, 1);
}

#[tokio::test]
async fn a_restart_reuses_the_saved_enrolment() {
    let dir = tempfile::tempdir().unwrap();
    let (state, url) = broker(Broker::default()).await;
    let agent = Agent::start(args(&url, Some(dir.path().into())));
    eventually(&state, "a heartbeat", |b| b.heartbeats.first().map(|_| ())).await;
    agent.shut_down().await.unwrap();

    let mut again = args(&url, Some(dir.path().into()));
    again.enrol_token = None; // used up: the saved token must do
    let before = state.lock().unwrap().heartbeats.len();
    let agent = Agent::start(again);
    eventually(&state, "a heartbeat after the restart", |b| {
        (b.heartbeats.len() > before).then_some(())
    })
    .await;
    agent.shut_down().await.unwrap();
    assert_eq!(state.lock().unwrap().registers, 1);
}

#[tokio::test]
async fn shutdown_while_the_broker_is_unreachable_is_prompt() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let agent = Agent::start(args(&format!("http://127.0.0.1:{port}"), None));
    // Let it fail at least once; shutdown must still return promptly and cleanly.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let asked = Instant::now();
    agent.shut_down().await.unwrap();
    assert!(asked.elapsed() < Duration::from_secs(2));
}

/// An in-test instance-metadata service: IMDSv2 tokens, and the spot notice (404 until set).
#[derive(Default)]
struct Metadata {
    notice: Option<String>,
    /// Reads of the notice URL, and those that came with a valid session token.
    reads: usize,
    reads_with_token: usize,
}

type SharedMetadata = Arc<Mutex<Metadata>>;

const IMDS_TOKEN: &str = "imds-session-token";

async fn imds_token(headers: HeaderMap) -> Response {
    match headers.get("x-aws-ec2-metadata-token-ttl-seconds") {
        Some(_) => IMDS_TOKEN.into_response(),
        None => StatusCode::BAD_REQUEST.into_response(),
    }
}

async fn spot_notice(State(m): State<SharedMetadata>, headers: HeaderMap) -> Response {
    let mut m = m.lock().unwrap();
    m.reads += 1;
    if headers
        .get("x-aws-ec2-metadata-token")
        .and_then(|v| v.to_str().ok())
        == Some(IMDS_TOKEN)
    {
        m.reads_with_token += 1;
    }
    match &m.notice {
        Some(body) => body.clone().into_response(),
        None => (StatusCode::NOT_FOUND, "Not Found").into_response(),
    }
}

/// Starts the metadata service; returns its state and the notice URL (EC2's path).
async fn metadata() -> (SharedMetadata, String) {
    let state: SharedMetadata = Arc::default();
    let app = Router::new()
        .route("/latest/api/token", axum::routing::put(imds_token))
        .route("/latest/meta-data/spot/instance-action", get(spot_notice))
        .with_state(state.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!(
        "http://{}/latest/meta-data/spot/instance-action",
        listener.local_addr().unwrap()
    );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (state, url)
}

const EC2_NOTICE: &str = r#"{"action": "terminate", "time": "2026-12-02T12:00:00Z"}"#;

#[tokio::test]
async fn an_interruption_notice_is_reported_at_once_and_its_stops_checkpoint_the_jobs() {
    let l = lease(&["sleep", "300"]);
    let id = l.attempt.attempt_id;
    let (state, url) = broker(Broker {
        leases: [l.clone()].into(),
        ..Broker::default()
    })
    .await;
    let (meta, notice_url) = metadata().await;
    let mut a = args(&url, None);
    // Beats far apart: the notice's beat can only come early because the notice forced it.
    a.heartbeat_s = Some(30);
    a.interruption_url = Some(notice_url.parse().unwrap());
    a.interruption_poll_s = 1;
    let agent = Agent::start(a);

    let pid = eventually(&state, "Started", |b| started_pid(&b.events, id)).await;
    // A few 404s first: no notice, nothing changes.
    let deadline = Instant::now() + DEADLINE;
    while meta.lock().unwrap().reads < 2 {
        assert!(Instant::now() < deadline, "the notice URL was not polled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    {
        let b = state.lock().unwrap();
        assert_eq!(b.heartbeats.len(), 1, "only the first beat so far");
        assert_eq!(b.heartbeats[0].interruption, None);
        assert!(group::process_alive(pid));
    }
    meta.lock().unwrap().notice = Some(EC2_NOTICE.into());

    let beat = eventually(&state, "the heartbeat with the notice", |b| {
        b.heartbeats
            .iter()
            .find(|h| h.interruption.is_some())
            .cloned()
    })
    .await;
    assert_eq!(
        beat.interruption,
        Some(InterruptionNotice {
            action: "terminate".into(),
            at: Some("2026-12-02T12:00:00Z".into()),
        })
    );
    assert_eq!(beat.running, vec![l.attempt.clone()]);
    assert_eq!(
        state.lock().unwrap().heartbeats.len(),
        2,
        "the notice was sent at once, not at the next 30 s tick"
    );

    // The broker's stop SIGTERMs the job (its checkpoint signal), reported as stopped.
    match eventually(&state, "Finished", |b| finished_of(b, id)).await {
        AgentEvent::Finished {
            stopped,
            signal,
            exit_code,
            ..
        } => assert_eq!((stopped, signal, exit_code), (true, Some(15), None)),
        other => panic!("{other:?}"),
    }
    wait_gone(pid).await;
    let reads = meta.lock().unwrap().reads;
    {
        let m = meta.lock().unwrap();
        assert_eq!(
            m.reads_with_token, m.reads,
            "IMDSv2: every read carried a token"
        );
    }
    agent.shut_down().await.unwrap();
    assert_eq!(
        meta.lock().unwrap().reads,
        reads,
        "the watcher stopped reading after the notice"
    );
}

#[tokio::test]
async fn an_interrupted_agent_takes_no_new_work_whatever_the_broker_says() {
    // The broker never asks for a drain: the agent drains on its own.
    let (state, url) = broker(Broker::default()).await;
    let (meta, notice_url) = metadata().await;
    meta.lock().unwrap().notice = Some("not JSON, still a notice".into());
    let mut a = args(&url, None);
    a.interruption_url = Some(notice_url.parse().unwrap());
    a.interruption_poll_s = 1;
    let agent = Agent::start(a);

    let beat = eventually(&state, "the heartbeat with the notice", |b| {
        b.heartbeats
            .iter()
            .find(|h| h.interruption.is_some())
            .cloned()
    })
    .await;
    assert_eq!(
        beat.interruption.map(|n| (n.action, n.at)),
        Some(("terminate".to_string(), None))
    );
    let polls = state.lock().unwrap().work_polls;
    let l = lease(&["echo", "too late"]);
    state.lock().unwrap().leases.push_back(l);
    // Heartbeats are the clock: three more, and every one still carries the notice.
    let seen = state.lock().unwrap().heartbeats.len();
    eventually(&state, "three more heartbeats", |b| {
        (b.heartbeats.len() >= seen + 3).then_some(())
    })
    .await;
    agent.shut_down().await.unwrap();
    let b = state.lock().unwrap();
    assert!(
        b.heartbeats[seen..]
            .iter()
            .all(|h| h.interruption.is_some())
    );
    assert_eq!(b.leases.len(), 1, "an interrupted agent polled for work");
    assert!(b.events.is_empty(), "{:?}", b.events);
    // A long-poll begun just before the notice may have been counted; none after it.
    assert!(
        b.work_polls <= polls + 1,
        "{} polls after {polls}",
        b.work_polls
    );
}

/// The whole agent with simulated GPUs and injected faults: the leased GPU runs at the lease's
/// level, the XID reaches the broker in heartbeats, the overheated GPU reports thermal
/// throttling; a fault on a GPU the agent does not have stops it at start, naming the flag.
#[tokio::test]
async fn simulated_gpus_report_the_jobs_level_and_the_injected_faults() {
    let mut l = lease(&["sleep", "30"]);
    l.expected_gpu_utilization_pct = Some(60);
    let id = l.attempt.attempt_id;
    let (state, url) = broker(Broker {
        leases: [l].into(),
        ..Broker::default()
    })
    .await;
    let mut a = args(&url, None);
    a.heartbeat_s = Some(1);
    a.fake_gpu_faults = vec![
        "0:xid=48@0s".parse().unwrap(),
        "1:overheat@0s".parse().unwrap(),
    ];
    let agent = Agent::start(a);
    eventually(&state, "the job to start", |b| started_pid(&b.events, id)).await;
    let beat = eventually(&state, "a heartbeat with the job running", |b| {
        b.heartbeats
            .iter()
            .find(|h| h.inventory.gpus.get(1).and_then(|g| g.utilization_pct) == Some(60))
            .cloned()
    })
    .await;
    let xids = |h: &Heartbeat| -> Vec<u32> {
        h.inventory.gpus[0]
            .health
            .as_ref()
            .map(|h| h.xid_events.clone())
            .unwrap_or_default()
    };
    {
        let b = state.lock().unwrap();
        // The first heartbeat carried the XID; the broker answered it, so later ones do not.
        assert_eq!(xids(&b.heartbeats[0]), vec![48]);
        assert!(b.heartbeats.iter().skip(1).all(|h| xids(h).is_empty()));
    }
    let gpus = &beat.inventory.gpus;
    assert_eq!(gpus[0].utilization_pct, Some(0));
    assert!(gpus[1].temperature_c > gpus[1].slowdown_temp_c, "{gpus:?}");
    let health = gpus[1].health.as_ref().unwrap();
    assert_eq!(health.throttle_reasons, vec!["hw_thermal_slowdown"]);
    assert!(gpus.iter().all(|g| g.vendor.as_deref() == Some("nvidia")));
    agent.shut_down().await.unwrap();

    let mut bad = args(&url, None);
    bad.fake_gpu_faults = vec!["2:ecc=1@0s".parse().unwrap()];
    let err = Agent::start(bad).ended().await.unwrap_err().to_string();
    assert!(err.contains("--fake-gpu-fault 2:ecc=1@0s"), "{err}");
    assert!(err.contains("GPU 2 is not declared"), "{err}");
}

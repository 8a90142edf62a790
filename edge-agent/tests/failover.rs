//! The whole agent (`run_until`) against two or three broker replicas that share one in-test
//! "database", as real replicas share PostgreSQL: enrolment on the first replica; failover to
//! the next when the first dies mid-job (its connections closed, nothing answered any more) or
//! goes silent (connections held open, nothing answered); every report delivered in order and
//! at least once across the switch (a batch the dying replica recorded but never acknowledged
//! is sent again and taken as a duplicate); and restarts that re-use the saved enrolment with
//! the list reordered or grown. Each replica sits behind a TCP front door that the test can
//! kill or freeze. Waits poll with a deadline; no fixed sleeps.
#![allow(clippy::unwrap_used)]

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use switchyard_agent::AgentArgs;
use switchyard_protocol::agent::*;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};
use tokio::task::{AbortHandle, JoinHandle, JoinSet};
use tokio::time::Instant;
use uuid::Uuid;

/// Generous: the machine may be loaded. Still well under a stuck long-poll (`POLL_WAIT_S` + 15).
const DEADLINE: Duration = Duration::from_secs(30);
/// Long enough that a long-poll stuck on a dead replica would blow every deadline above.
const POLL_WAIT_S: u64 = 60;
const TOKEN: &str = "agent-token";
/// A lease handed out but not reported started is handed out again after this long: like the
/// broker, the fake delivers leases at least once (the agent runs each once).
const REDELIVER: Duration = Duration::from_secs(1);

/// What every replica shares: the database.
#[derive(Default)]
struct Db {
    /// Which replica served each enrolment.
    registers: Vec<&'static str>,
    offered: Vec<Offered>,
    heartbeats: Vec<(&'static str, Heartbeat)>,
    /// Long-polls being answered now, per replica.
    polling: HashMap<&'static str, usize>,
    /// Every event, recorded once, in the order recorded, with the replica that took it.
    events: Vec<(&'static str, AgentEvent)>,
    /// Events received again (answered `Duplicate`), with the replica that got them.
    duplicates: Vec<(&'static str, AgentEvent)>,
    /// Events received again with different content: must stay empty.
    conflicts: Vec<AgentEvent>,
    /// This replica records the next event batch, then dies without answering.
    die_after_recording_events: Option<&'static str>,
}

struct Offered {
    lease: Lease,
    handed: Option<Instant>,
    started: bool,
}

type Shared = Arc<Mutex<Db>>;

impl Db {
    fn offer(&mut self, lease: Lease) {
        self.offered.push(Offered {
            lease,
            handed: None,
            started: false,
        });
    }

    fn polling_at(&self, replica: &str) -> usize {
        self.polling.get(replica).copied().unwrap_or(0)
    }

    fn finished(&self, id: Uuid) -> Option<(&'static str, AgentEvent)> {
        self.events
            .iter()
            .find(|(_, e)| matches!(e, AgentEvent::Finished { .. }) && key(e).0 == id)
            .cloned()
    }

    fn beat_running(&self, replica: &str, id: Uuid) -> bool {
        self.heartbeats
            .iter()
            .any(|(r, h)| *r == replica && h.running.iter().any(|a| a.attempt_id == id))
    }
}

/// One broker replica: its name, the shared database, and whether it still lives.
struct Replica {
    name: &'static str,
    db: Shared,
    url: String,
    alive: AtomicBool,
    door: Mutex<Option<AbortHandle>>,
    frozen: watch::Sender<bool>,
}

impl Replica {
    /// Dies: every connection closed, new ones refused, nothing recorded any more.
    fn kill(&self) {
        // Under the database's lock: an event is recorded before the death or not at all.
        {
            let _db = self.db.lock().unwrap();
            self.alive.store(false, Ordering::SeqCst);
        }
        if let Some(door) = self.door.lock().unwrap().take() {
            door.abort();
        }
    }

    /// Goes silent (a partition, a hung process): connections are accepted and held, nothing
    /// is answered or recorded any more.
    fn freeze(&self) {
        // The door first: no answer of a dead handler may reach the agent.
        self.frozen.send_replace(true);
        self.alive.store(false, Ordering::SeqCst);
    }

    fn alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }
}

type Rep = Arc<Replica>;

/// A dead or silent replica answers nothing that reaches the agent; this answer goes nowhere.
fn gone() -> Response {
    StatusCode::SERVICE_UNAVAILABLE.into_response()
}

fn authorised(headers: &HeaderMap) -> bool {
    headers.get("authorization").and_then(|v| v.to_str().ok()) == Some(&format!("Bearer {TOKEN}"))
}

fn unauthorised() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        Json(json!({"error": {"code": "unauthorized", "message": "bad token"}})),
    )
        .into_response()
}

async fn register(
    State(r): State<Rep>,
    headers: axum::http::HeaderMap,
    Json(_req): Json<RegisterRequest>,
) -> Response {
    if !r.alive() {
        return gone();
    }
    assert_eq!(
        headers.get("authorization").unwrap().to_str().unwrap(),
        "Bearer enrol-me"
    );
    r.db.lock().unwrap().registers.push(r.name);
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
    State(r): State<Rep>,
    headers: HeaderMap,
    Json(beat): Json<Heartbeat>,
) -> Response {
    if !r.alive() {
        return gone();
    }
    if !authorised(&headers) {
        return unauthorised();
    }
    r.db.lock().unwrap().heartbeats.push((r.name, beat));
    Json(HeartbeatResponse {
        stop: vec![],
        drain: false,
    })
    .into_response()
}

#[derive(Deserialize)]
struct Wait {
    wait_s: u64,
}

/// Counts a long-poll as in flight at a replica while the handler runs.
struct Polling(Rep);

impl Drop for Polling {
    fn drop(&mut self) {
        if let Ok(mut db) = self.0.db.lock()
            && let Some(n) = db.polling.get_mut(self.0.name)
        {
            *n = n.saturating_sub(1);
        }
    }
}

async fn work(State(r): State<Rep>, headers: HeaderMap, Query(w): Query<Wait>) -> Response {
    if !authorised(&headers) {
        return unauthorised();
    }
    let until = Instant::now() + Duration::from_secs(w.wait_s);
    *r.db.lock().unwrap().polling.entry(r.name).or_default() += 1;
    let _polling = Polling(r.clone());
    loop {
        if !r.alive() {
            return gone();
        }
        {
            let mut db = r.db.lock().unwrap();
            let now = Instant::now();
            let mut leases = Vec::new();
            for offer in db.offered.iter_mut() {
                let due = offer.handed.is_none_or(|t| now >= t + REDELIVER);
                if !offer.started && due {
                    offer.handed = Some(now);
                    leases.push(offer.lease.clone());
                }
            }
            if !leases.is_empty() || now >= until {
                return Json(WorkResponse {
                    leases,
                    stop: vec![],
                })
                .into_response();
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An event's identity, as the broker dedupes: (attempt, kind, log sequence).
fn key(event: &AgentEvent) -> (Uuid, u8, u64) {
    match event {
        AgentEvent::Started { attempt, .. } => (attempt.attempt_id, 0, 0),
        AgentEvent::Log { attempt, seq, .. } => (attempt.attempt_id, 1, *seq),
        AgentEvent::Finished { attempt, .. } => (attempt.attempt_id, 2, 0),
    }
}

async fn events(
    State(r): State<Rep>,
    headers: HeaderMap,
    Json(batch): Json<EventBatch>,
) -> Response {
    if !r.alive() {
        return gone();
    }
    if !authorised(&headers) {
        return unauthorised();
    }
    let (results, die) = {
        let mut db = r.db.lock().unwrap();
        if !r.alive() {
            return gone();
        }
        let mut results = Vec::new();
        for event in batch.events {
            let k = key(&event);
            let status = match db.events.iter().find(|(_, e)| key(e) == k) {
                Some((_, earlier)) => {
                    if *earlier != event {
                        db.conflicts.push(event.clone());
                    }
                    db.duplicates.push((r.name, event));
                    EventStatus::Duplicate
                }
                None => {
                    if let AgentEvent::Started { attempt, .. } = &event {
                        for offer in db.offered.iter_mut() {
                            if offer.lease.attempt.attempt_id == attempt.attempt_id {
                                offer.started = true;
                            }
                        }
                    }
                    db.events.push((r.name, event));
                    EventStatus::Accepted
                }
            };
            results.push(EventResult {
                status,
                reason: None,
            });
        }
        let die = db.die_after_recording_events == Some(r.name);
        if die {
            db.die_after_recording_events = None;
        }
        (results, die)
    };
    if die {
        // Committed, then the process died before it could answer.
        r.kill();
        return std::future::pending::<Response>().await;
    }
    Json(EventBatchResponse { results }).into_response()
}

/// Forwards connections to `upstream` until the task is aborted (every connection closed with
/// it); once `frozen`, holds connections open and forwards nothing.
async fn front_door(listener: TcpListener, upstream: SocketAddr, frozen: watch::Receiver<bool>) {
    let mut conns = JoinSet::new();
    loop {
        let Ok((mut down, _)) = listener.accept().await else {
            continue;
        };
        let mut frozen = frozen.clone();
        conns.spawn(async move {
            let Ok(mut up) = TcpStream::connect(upstream).await else {
                return;
            };
            tokio::select! {
                biased;
                () = async { let _ = frozen.wait_for(|f| *f).await; } => {
                    std::future::pending::<()>().await;
                }
                _ = tokio::io::copy_bidirectional(&mut down, &mut up) => {}
            }
        });
        while conns.try_join_next().is_some() {}
    }
}

/// Starts a replica on `db`, behind its front door.
async fn replica(name: &'static str, db: &Shared) -> Rep {
    let upstream = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream_addr = upstream.local_addr().unwrap();
    let door = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (frozen, frozen_rx) = watch::channel(false);
    let replica = Arc::new(Replica {
        name,
        db: db.clone(),
        url: format!("http://{}", door.local_addr().unwrap()),
        alive: AtomicBool::new(true),
        door: Mutex::new(None),
        frozen,
    });
    let app = Router::new()
        .route("/agent/v1/register", post(register))
        .route("/agent/v1/heartbeat", post(heartbeat))
        .route("/agent/v1/work", get(work))
        .route("/agent/v1/events", post(events))
        .with_state(replica.clone());
    tokio::spawn(async move { axum::serve(upstream, app).await.unwrap() });
    let door = tokio::spawn(front_door(door, upstream_addr, frozen_rx));
    *replica.door.lock().unwrap() = Some(door.abort_handle());
    replica
}

fn args(replicas: &[&Rep], state_dir: Option<PathBuf>) -> AgentArgs {
    let mut a = AgentArgs::with_brokers(replicas.iter().map(|r| r.url.parse().unwrap()).collect());
    a.enrol_token = Some("enrol-me".parse().unwrap());
    a.fake_gpus = vec!["2xL4".parse().unwrap()];
    a.name = Some("test-agent".into());
    a.grace_s = 1;
    a.poll_wait_s = POLL_WAIT_S;
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

    async fn shut_down(mut self) -> anyhow::Result<()> {
        let _ = self.stop.take().unwrap().send(());
        tokio::time::timeout(DEADLINE, self.task)
            .await
            .expect("agent did not shut down")
            .unwrap()
    }
}

/// Polls the database until `pick` returns something.
async fn eventually<T>(db: &Shared, what: &str, mut pick: impl FnMut(&Db) -> Option<T>) -> T {
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Some(found) = pick(&db.lock().unwrap()) {
            return found;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn lease(command: &[&str]) -> Lease {
    Lease {
        expected_gpu_utilization_pct: None,
        attempt: AttemptRef {
            job_id: Uuid::now_v7(),
            attempt_id: Uuid::now_v7(),
            epoch: 1,
        },
        command: command.iter().map(|s| s.to_string()).collect(),
        env: BTreeMap::new(),
        gpus: vec![0],
        grace_s: 1,
        traceparent: None,
        serve: None,
    }
}

/// A job that prints `before`, waits for `gate` to exist, prints `after` and exits 0.
fn gated_job(gate: &Path) -> Lease {
    let script = format!(
        "echo before; while [ ! -e '{}' ]; do sleep 0.05; done; echo after",
        gate.display()
    );
    lease(&["sh", "-c", &script])
}

/// One attempt's recorded events, checked to be its whole story in order: `Started`, log
/// chunks numbered from 0 without gaps, `Finished` with exit code 0. Returns its output and
/// the replicas that recorded each event.
fn story(db: &Db, id: Uuid) -> (String, Vec<&'static str>) {
    let mine: Vec<&(&'static str, AgentEvent)> =
        db.events.iter().filter(|(_, e)| key(e).0 == id).collect();
    assert!(mine.len() >= 2, "{mine:?}");
    assert!(matches!(mine[0].1, AgentEvent::Started { .. }), "{mine:?}");
    match &mine[mine.len() - 1].1 {
        AgentEvent::Finished { exit_code, .. } => assert_eq!(*exit_code, Some(0), "{mine:?}"),
        other => panic!("not finished last: {other:?}"),
    }
    let mut output = String::new();
    for (n, (_, e)) in mine[1..mine.len() - 1].iter().enumerate() {
        match e {
            AgentEvent::Log { seq, data, .. } => {
                assert_eq!(*seq, n as u64, "log chunks out of order: {mine:?}");
                output.push_str(data);
            }
            other => panic!("not a log chunk: {other:?}"),
        }
    }
    (output, mine.iter().map(|(r, _)| *r).collect())
}

#[tokio::test]
async fn the_agent_fails_over_mid_job_and_every_report_arrives_in_order() {
    let db = Shared::default();
    let (a, b) = (replica("a", &db).await, replica("b", &db).await);
    let dir = tempfile::tempdir().unwrap();
    // Run as root, the agent runs the job as a uid of its own: let it look for the gate.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let gate = dir.path().join("go");
    let job = gated_job(&gate);
    let id = job.attempt.attempt_id;
    db.lock().unwrap().offer(job);
    let agent = Agent::start(args(&[&a, &b], None));

    // Enrolled at `a`; the job runs and reports there; a long-poll waits there.
    eventually(&db, "the job's first output at a", |d| {
        d.events
            .iter()
            .any(|(r, e)| {
                *r == "a" && matches!(e, AgentEvent::Log { data, .. } if data.contains("before"))
            })
            .then_some(())
    })
    .await;
    eventually(&db, "a heartbeat at a with the job", |d| {
        d.beat_running("a", id).then_some(())
    })
    .await;
    eventually(&db, "a long-poll in flight at a", |d| {
        (d.polling_at("a") > 0).then_some(())
    })
    .await;

    a.kill();
    let recorded_at_a = db.lock().unwrap().events.len();

    // Heartbeats and long-polls continue at `b`, promptly: the long-poll at `a` would
    // otherwise have waited POLL_WAIT_S.
    eventually(&db, "a heartbeat at b with the job", |d| {
        d.beat_running("b", id).then_some(())
    })
    .await;
    eventually(&db, "a long-poll in flight at b", |d| {
        (d.polling_at("b") > 0).then_some(())
    })
    .await;
    // New work arrives through `b`'s long-poll and reports there.
    let second = lease(&["echo", "second"]);
    let second_id = second.attempt.attempt_id;
    db.lock().unwrap().offer(second);
    eventually(&db, "the second job's end", |d| d.finished(second_id)).await;
    // The first job ends; its last reports go to `b`.
    std::fs::write(&gate, b"").unwrap();
    eventually(&db, "the first job's end", |d| d.finished(id)).await;
    agent.shut_down().await.unwrap();

    let d = db.lock().unwrap();
    assert_eq!(d.registers, ["a"]);
    assert!(d.conflicts.is_empty(), "{:?}", d.conflicts);
    let (output, replicas) = story(&d, id);
    assert_eq!(output, "before\nafter\n");
    assert_eq!(replicas[0], "a", "started at a");
    assert_eq!(replicas.last(), Some(&"b"), "finished at b");
    let (output, replicas) = story(&d, second_id);
    assert_eq!(output, "second\n");
    assert!(replicas.iter().all(|r| *r == "b"), "{replicas:?}");
    assert!(
        d.events[recorded_at_a..].iter().all(|(r, _)| *r == "b"),
        "nothing recorded at a after it died"
    );
}

#[tokio::test]
async fn a_batch_the_dying_replica_recorded_is_sent_again_and_taken_as_a_duplicate() {
    let db = Shared::default();
    let (a, b) = (replica("a", &db).await, replica("b", &db).await);
    db.lock().unwrap().die_after_recording_events = Some("a");
    let job = lease(&["echo", "hello"]);
    let id = job.attempt.attempt_id;
    db.lock().unwrap().offer(job);
    let agent = Agent::start(args(&[&a, &b], None));

    eventually(&db, "the job's end", |d| d.finished(id)).await;
    agent.shut_down().await.unwrap();

    let d = db.lock().unwrap();
    assert_eq!(d.registers, ["a"]);
    assert!(!a.alive());
    let (output, replicas) = story(&d, id);
    assert_eq!(output, "hello\n");
    assert_eq!(replicas[0], "a", "the batch a recorded before dying");
    // The unanswered batch went again to `b`: duplicates there, and nothing else.
    assert!(!d.duplicates.is_empty());
    assert!(
        d.duplicates.iter().all(|(r, _)| *r == "b"),
        "{:?}",
        d.duplicates
    );
    assert!(d.conflicts.is_empty(), "{:?}", d.conflicts);
}

#[tokio::test]
async fn a_silent_replica_is_left_by_every_call_within_a_heartbeat_timeout() {
    let db = Shared::default();
    let (a, b) = (replica("a", &db).await, replica("b", &db).await);
    let agent = Agent::start(args(&[&a, &b], None));
    eventually(&db, "a heartbeat at a", |d| {
        d.heartbeats.iter().any(|(r, _)| *r == "a").then_some(())
    })
    .await;
    eventually(&db, "a long-poll in flight at a", |d| {
        (d.polling_at("a") > 0).then_some(())
    })
    .await;

    // Connections stay open and nothing answers: only a timeout tells. The heartbeat's
    // (5 s here) moves the agent on, and the long-poll at `a` follows at once instead of
    // waiting out POLL_WAIT_S.
    a.freeze();
    eventually(&db, "a heartbeat at b", |d| {
        d.heartbeats.iter().any(|(r, _)| *r == "b").then_some(())
    })
    .await;
    eventually(&db, "a long-poll in flight at b", |d| {
        (d.polling_at("b") > 0).then_some(())
    })
    .await;
    let job = lease(&["echo", "via b"]);
    let id = job.attempt.attempt_id;
    db.lock().unwrap().offer(job);
    eventually(&db, "the job's end", |d| d.finished(id)).await;
    agent.shut_down().await.unwrap();

    let d = db.lock().unwrap();
    let (output, replicas) = story(&d, id);
    assert_eq!(output, "via b\n");
    assert!(replicas.iter().all(|r| *r == "b"), "{replicas:?}");
}

#[tokio::test]
async fn a_restart_with_the_list_reordered_or_grown_reuses_the_enrolment() {
    let db = Shared::default();
    let (a, b, c) = (
        replica("a", &db).await,
        replica("b", &db).await,
        replica("c", &db).await,
    );
    let dir = tempfile::tempdir().unwrap();
    let state = Some(dir.path().to_path_buf());
    let beats_at = |d: &Db, r: &str| d.heartbeats.iter().filter(|(x, _)| *x == r).count();

    let agent = Agent::start(args(&[&a, &b], state.clone()));
    eventually(&db, "a heartbeat at a", |d| {
        (beats_at(d, "a") > 0).then_some(())
    })
    .await;
    agent.shut_down().await.unwrap();

    // Reordered: the first replica now is `b`, and no enrolment token is left.
    let mut again = args(&[&b, &a], state.clone());
    again.enrol_token = None;
    let agent = Agent::start(again);
    eventually(&db, "a heartbeat at b", |d| {
        (beats_at(d, "b") > 0).then_some(())
    })
    .await;
    agent.shut_down().await.unwrap();

    // A replica added in front, one dropped: they still share `b`.
    let mut again = args(&[&c, &b], state.clone());
    again.enrol_token = None;
    let agent = Agent::start(again);
    eventually(&db, "a heartbeat at c", |d| {
        (beats_at(d, "c") > 0).then_some(())
    })
    .await;
    agent.shut_down().await.unwrap();

    assert_eq!(db.lock().unwrap().registers, ["a"]);
    let saved: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("agent.json")).unwrap()).unwrap();
    assert_eq!(saved["broker"], format!("{}/", a.url), "enrolled with a");
    assert_eq!(
        saved["brokers"],
        json!([format!("{}/", c.url), format!("{}/", b.url)]),
        "the list as last given"
    );
}

#[test]
fn the_broker_list_comes_from_the_environment_with_commas() {
    let run = |brokers: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_switchyard-agent"))
            .args(["--fake-gpus", "1xL4"])
            .env("SWITCHYARD_BROKER", brokers)
            .env("RUST_LOG", "info")
            .env_remove("SWITCHYARD_ENROL_TOKEN")
            .env_remove("SWITCHYARD_STATE_DIR")
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            .output()
            .unwrap()
    };
    // No enrolment token: the agent stops right after saying which brokers it was given.
    let out = run("http://127.0.0.1:9, http://127.0.0.1:10/sy");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("no enrolment token"), "{stderr}");
    assert!(
        stderr.contains("http://127.0.0.1:9/,http://127.0.0.1:10/sy"),
        "{stderr}"
    );
    let out = run("http://127.0.0.1:9,,http://127.0.0.1:10");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("empty broker URL"), "{stderr}");
}

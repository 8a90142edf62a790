//! Service replicas (issue 26) through the whole agent (`run_until`) against a minimal in-test
//! broker: a lease with `serve` runs a real HTTP server on the port the agent gives it in
//! `$PORT`; the agent probes it and reports it in heartbeats (`serving`), beating at once when
//! a replica's readiness changes. The broker asks for a heartbeat only every hour, so every
//! beat after the first one came early, because something changed. Waits poll with a deadline;
//! no fixed sleeps.
#![allow(clippy::unwrap_used)]

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use switchyard_agent::AgentArgs;
use switchyard_protocol::agent::*;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use uuid::Uuid;

const DEADLINE: Duration = Duration::from_secs(30);

/// A replica: listens on `$PORT` on 127.0.0.1 and answers `GET /health` with the codes of
/// `PLAN` (comma-separated), one per request, then with `AFTER`; prints its port and every
/// answer.
const SERVER: &str = r#"
import http.server, os
port = int(os.environ["PORT"])
plan = [int(c) for c in os.environ.get("PLAN", "").split(",") if c]
after = int(os.environ.get("AFTER", "200"))
served = [0]
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        i = served[0]
        served[0] += 1
        code = (plan[i] if i < len(plan) else after) if self.path == "/health" else 404
        print(self.path, code, flush=True)
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
server = http.server.HTTPServer(("127.0.0.1", port), Health)
print("port", port, flush=True)
server.serve_forever()
"#;

#[derive(Default)]
struct Broker {
    leases: VecDeque<Lease>,
    stops: Vec<AttemptRef>,
    /// Every heartbeat as it came (to see which keys it has) and as the agent meant it.
    raw_heartbeats: Vec<serde_json::Value>,
    heartbeats: Vec<Heartbeat>,
    events: Vec<AgentEvent>,
}

type Shared = Arc<Mutex<Broker>>;

async fn register(Json(_req): Json<RegisterRequest>) -> Json<RegisterResponse> {
    Json(RegisterResponse {
        agent_id: Uuid::now_v7(),
        node_id: "node-1".into(),
        pool: "onprem:test/l4".into(),
        agent_token: "agent-token".into(),
        // Hardly ever: a beat after the first is one the agent sent early.
        heartbeat_interval_s: 3600,
        lease_ttl_s: 0,
    })
}

async fn heartbeat(State(s): State<Shared>, Json(raw): Json<serde_json::Value>) -> Response {
    let beat: Heartbeat = serde_json::from_value(raw.clone()).unwrap();
    let mut b = s.lock().unwrap();
    b.raw_heartbeats.push(raw);
    b.heartbeats.push(beat);
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

async fn work(State(s): State<Shared>, Query(w): Query<Wait>) -> Json<WorkResponse> {
    let until = Instant::now() + Duration::from_secs(w.wait_s);
    loop {
        {
            let mut b = s.lock().unwrap();
            if !b.leases.is_empty() || !b.stops.is_empty() || Instant::now() >= until {
                let leases = b.leases.drain(..).collect();
                let stop = std::mem::take(&mut b.stops);
                return Json(WorkResponse { leases, stop });
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn events(
    State(s): State<Shared>,
    Json(batch): Json<EventBatch>,
) -> Json<EventBatchResponse> {
    let mut b = s.lock().unwrap();
    let results = batch
        .events
        .iter()
        .map(|_| EventResult {
            status: EventStatus::Accepted,
            reason: None,
        })
        .collect();
    b.events.extend(batch.events);
    Json(EventBatchResponse { results })
}

async fn broker(leases: Vec<Lease>) -> (Shared, String) {
    let state: Shared = Arc::new(Mutex::new(Broker {
        leases: leases.into(),
        ..Broker::default()
    }));
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

fn args(url: &str) -> AgentArgs {
    let mut a = AgentArgs::new(url.parse().unwrap());
    a.enrol_token = Some("enrol-me".parse().unwrap());
    a.fake_gpus = vec!["1xL4".parse().unwrap()];
    a.name = Some("serving-agent".into());
    a.grace_s = 1;
    a.poll_wait_s = 1;
    a
}

struct Agent {
    stop: oneshot::Sender<()>,
    task: JoinHandle<anyhow::Result<()>>,
}

impl Agent {
    fn start(args: AgentArgs) -> Agent {
        let (stop, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(switchyard_agent::run_until(args, async move {
            let _ = rx.await;
        }));
        Agent { stop, task }
    }

    async fn shut_down(self) {
        let _ = self.stop.send(());
        tokio::time::timeout(DEADLINE, self.task)
            .await
            .expect("agent did not shut down")
            .unwrap()
            .unwrap();
    }
}

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

fn lease(command: &[&str], env: &[(&str, &str)], serve: Option<ServeSpec>) -> Lease {
    Lease {
        expected_gpu_utilization_pct: None,
        attempt: AttemptRef {
            job_id: Uuid::now_v7(),
            attempt_id: Uuid::now_v7(),
            epoch: 1,
        },
        command: command.iter().map(|s| s.to_string()).collect(),
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>(),
        gpus: vec![0],
        grace_s: 1,
        traceparent: None,
        serve,
    }
}

fn probed(period_ms: u64, failure_threshold: u32) -> Option<ServeSpec> {
    Some(ServeSpec {
        readiness: Some(Readiness {
            path: "/health".into(),
            period_ms,
            timeout_ms: 2000,
            failure_threshold,
        }),
    })
}

fn server(plan: &str, after: &str, serve: Option<ServeSpec>) -> Lease {
    lease(
        &["python3", "-c", SERVER],
        &[("PLAN", plan), ("AFTER", after)],
        serve,
    )
}

/// The attempt's report in each heartbeat that had one, in order.
fn reports(b: &Broker, id: Uuid) -> Vec<ReplicaReport> {
    b.heartbeats
        .iter()
        .filter_map(|h| h.serving.iter().find(|r| r.attempt.attempt_id == id))
        .cloned()
        .collect()
}

/// The readiness the heartbeats went through, repeats folded.
fn readiness_seen(b: &Broker, id: Uuid) -> Vec<bool> {
    let mut seen: Vec<bool> = reports(b, id).iter().map(|r| r.ready).collect();
    seen.dedup();
    seen
}

/// What the attempt wrote on stdout so far.
fn stdout_of(b: &Broker, id: Uuid) -> String {
    b.events
        .iter()
        .filter_map(|e| match e {
            AgentEvent::Log {
                attempt,
                stream: Stream::Stdout,
                data,
                ..
            } if attempt.attempt_id == id => Some(data.as_str()),
            _ => None,
        })
        .collect()
}

fn started_pid(b: &Broker, id: Uuid) -> Option<u32> {
    b.events.iter().find_map(|e| match e {
        AgentEvent::Started { attempt, pid } if attempt.attempt_id == id => Some(*pid),
        _ => None,
    })
}

fn finished(b: &Broker, id: Uuid) -> bool {
    b.events
        .iter()
        .any(|e| matches!(e, AgentEvent::Finished { attempt, .. } if attempt.attempt_id == id))
}

#[tokio::test]
async fn a_replica_listens_on_its_port_and_is_ready_once_its_probe_passes() {
    let l = server("503,503,503", "200", probed(100, 1));
    let id = l.attempt.attempt_id;
    let (state, url) = broker(vec![l.clone()]).await;
    let mut a = args(&url);
    a.advertise_host = "10.9.8.7".into();
    let agent = Agent::start(a);

    let first = eventually(&state, "the replica reported not ready", |b| {
        reports(b, id).first().cloned()
    })
    .await;
    assert!(!first.ready, "the probe has not passed yet: {first:?}");
    assert_eq!(
        (first.attempt.clone(), first.host.as_str()),
        (l.attempt.clone(), "10.9.8.7")
    );
    assert_ne!(first.port, 0);
    let ready = eventually(&state, "the replica reported ready", |b| {
        reports(b, id).into_iter().find(|r| r.ready)
    })
    .await;
    assert_eq!(
        ready.port, first.port,
        "the port is the attempt's for its life"
    );
    // The replica listened on the port the agent reported, and the probe got its 503s first.
    let out = eventually(&state, "the replica's answers in its output", |b| {
        let out = stdout_of(b, id);
        out.contains("/health 200").then_some(out)
    })
    .await;
    assert!(out.starts_with(&format!("port {}\n", first.port)), "{out}");
    assert!(
        out.contains("/health 503\n/health 503\n/health 503\n/health 200\n"),
        "{out}"
    );
    {
        let b = state.lock().unwrap();
        assert_eq!(readiness_seen(&b, id), [false, true]);
        // With beats an hour apart, the one saying "ready" came early, because of the change.
        assert!(!b.heartbeats[0].serving.iter().any(|r| r.ready));
        let raw = b.raw_heartbeats.last().unwrap();
        assert_eq!(raw["serving"][0]["port"], u64::from(first.port));
        assert_eq!(raw["serving"][0]["ready"], true);
    }
    agent.shut_down().await;
}

#[tokio::test]
async fn a_replica_without_readiness_is_ready_once_started_and_gone_once_ended() {
    // It ignores SIGTERM, so that its stop is seen before its end.
    let mut l = lease(
        &[
            "sh",
            "-c",
            "trap '' TERM; echo \"port=$PORT\"; exec sleep 300",
        ],
        // The agent's PORT wins over the job's own.
        &[("PORT", "1")],
        Some(ServeSpec { readiness: None }),
    );
    l.grace_s = 300;
    let id = l.attempt.attempt_id;
    let (state, url) = broker(vec![l.clone()]).await;
    let agent = Agent::start(args(&url));

    let report = eventually(&state, "the replica reported", |b| {
        reports(b, id).first().cloned()
    })
    .await;
    assert!(report.ready, "ready from the start: {report:?}");
    assert_eq!(report.host, "127.0.0.1", "the default --advertise-host");
    let out = eventually(&state, "the replica's output", |b| {
        let out = stdout_of(b, id);
        (!out.is_empty()).then_some(out)
    })
    .await;
    assert_eq!(out, format!("port={}\n", report.port));

    // Stopped: not ready at once (SIGTERM sent; the grace runs), on an early beat…
    state.lock().unwrap().stops.push(l.attempt.clone());
    eventually(&state, "the replica reported not ready", |b| {
        (readiness_seen(b, id) == [true, false]).then_some(())
    })
    .await;
    // …and no longer reported once its process ended (killed here, not after the grace).
    let pid = eventually(&state, "Started", |b| started_pid(b, id)).await;
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    eventually(&state, "the replica's end", |b| {
        finished(b, id).then_some(())
    })
    .await;
    eventually(&state, "a heartbeat without the replica", |b| {
        let last = b.raw_heartbeats.last()?;
        last.get("serving").is_none().then_some(())
    })
    .await;
    agent.shut_down().await;
}

#[tokio::test]
async fn a_ready_replica_is_not_ready_after_failure_threshold_failed_probes_in_a_row() {
    // Ready, then two failures (under the threshold of 3), a pass, then failures for good.
    let l = server("200,200,503,503,200", "503", probed(150, 3));
    let id = l.attempt.attempt_id;
    let (state, url) = broker(vec![l.clone()]).await;
    let agent = Agent::start(args(&url));

    eventually(&state, "ready, then not ready", |b| {
        let seen = readiness_seen(b, id);
        let since_ready = seen
            .iter()
            .skip_while(|r| !**r)
            .copied()
            .collect::<Vec<_>>();
        (since_ready.len() >= 2).then_some(())
    })
    .await;
    let out = eventually(&state, "the failures in the replica's output", |b| {
        let out = stdout_of(b, id);
        (out.matches("/health 503").count() >= 5).then_some(out)
    })
    .await;
    assert!(
        out.contains("/health 200\n/health 200\n/health 503\n/health 503\n/health 200\n/health 503\n/health 503\n/health 503\n"),
        "{out}"
    );
    {
        let b = state.lock().unwrap();
        let seen = readiness_seen(&b, id);
        let since_ready: Vec<bool> = seen.into_iter().skip_while(|r| !*r).collect();
        assert_eq!(
            since_ready,
            [true, false],
            "two failures in a row kept it ready; the third in a row did not"
        );
        let last = reports(&b, id).pop().unwrap();
        assert!(!last.ready);
    }
    agent.shut_down().await;
}

#[tokio::test]
async fn a_lease_without_serve_has_no_serving_in_its_heartbeats() {
    let l = lease(&["sleep", "300"], &[("PORT", "8080")], None);
    let id = l.attempt.attempt_id;
    let (state, url) = broker(vec![l.clone()]).await;
    let mut a = args(&url);
    a.heartbeat_s = Some(1);
    let agent = Agent::start(a);

    eventually(&state, "a heartbeat with the job running", |b| {
        b.heartbeats
            .iter()
            .any(|h| h.running.iter().any(|r| r.attempt_id == id))
            .then_some(())
    })
    .await;
    {
        let b = state.lock().unwrap();
        assert!(b.heartbeats.iter().all(|h| h.serving.is_empty()));
        for raw in &b.raw_heartbeats {
            assert!(raw.get("serving").is_none(), "{raw}");
        }
    }
    agent.shut_down().await;
}

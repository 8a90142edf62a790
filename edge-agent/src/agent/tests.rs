//! The heartbeat's XID delivery: against a broker that fails a beat, the XIDs go again.
#![allow(clippy::unwrap_used)]

use super::*;
use crate::args::{GpuDeclaration, Secret};
use crate::fakegpu::{FakeProbe, GpuFault, GpuSim};
use crate::serving::Serving;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use std::sync::Mutex;
use switchyard_protocol::agent::HeartbeatResponse;

fn gpu(uuid: &str, xids: &[u32]) -> GpuInfo {
    GpuInfo {
        uuid: uuid.into(),
        health: (!xids.is_empty()).then(|| GpuHealthReport {
            xid_events: xids.to_vec(),
            ..GpuHealthReport::default()
        }),
        ..GpuInfo::default()
    }
}

const NONE: Vec<u32> = Vec::new();

fn xids(gpus: &[GpuInfo]) -> Vec<Vec<u32>> {
    gpus.iter()
        .map(|g| {
            g.health
                .as_ref()
                .map(|h| h.xid_events.clone())
                .unwrap_or_default()
        })
        .collect()
}

#[test]
fn the_ledger_keeps_xids_until_acknowledged() {
    let mut ledger = XidLedger::default();
    let mut first = vec![gpu("a", &[79]), gpu("b", &[])];
    ledger.absorb(&mut first);
    assert_eq!(xids(&first), vec![vec![79], NONE]);
    // Not answered: the next probe (which reports nothing new) still carries it, plus a new one.
    let mut second = vec![gpu("a", &[]), gpu("b", &[48])];
    ledger.absorb(&mut second);
    assert_eq!(xids(&second), vec![vec![79], vec![48]]);
    assert_eq!(ledger.pending(), 2);
    ledger.acknowledged(&mut second);
    assert_eq!(xids(&second), vec![NONE, NONE]);
    let mut third = vec![gpu("a", &[]), gpu("b", &[])];
    ledger.absorb(&mut third);
    assert_eq!(xids(&third), vec![NONE, NONE]);
    assert_eq!(ledger.pending(), 0);
}

#[test]
fn the_ledger_is_bounded() {
    let mut ledger = XidLedger::default();
    let mut gpus = vec![gpu("a", &vec![13; MAX_PENDING_XIDS + 10])];
    ledger.absorb(&mut gpus);
    assert_eq!(ledger.pending(), MAX_PENDING_XIDS);
}

/// Heartbeats the broker received; it answers 503 to the first `fail` of them.
#[derive(Default)]
struct Broker {
    beats: Vec<Heartbeat>,
    fail: usize,
}

type Shared = Arc<Mutex<Broker>>;

async fn heartbeat(State(b): State<Shared>, Json(beat): Json<Heartbeat>) -> Response {
    let mut b = b.lock().unwrap();
    b.beats.push(beat);
    if b.beats.len() <= b.fail {
        return (StatusCode::SERVICE_UNAVAILABLE, "try later").into_response();
    }
    Json(HeartbeatResponse {
        stop: vec![],
        drain: false,
    })
    .into_response()
}

async fn broker(fail: usize) -> (Shared, reqwest::Url) {
    let shared: Shared = Arc::new(Mutex::new(Broker {
        fail,
        ..Broker::default()
    }));
    let app = Router::new()
        .route("/agent/v1/heartbeat", post(heartbeat))
        .with_state(shared.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (shared, format!("http://{addr}/").parse().unwrap())
}

fn beat_loop(url: reqwest::Url, probe: Arc<dyn GpuProbe>) -> HeartbeatLoop {
    let client = BrokerClient::new(&[url])
        .unwrap()
        .with_token(Secret::new("agent-token"));
    let serving = Arc::new(Serving::new("127.0.0.1").unwrap());
    let (drain, _) = watch::channel(false);
    let (_, notice) = watch::channel(None);
    HeartbeatLoop {
        lease: None,
        client,
        last_inventory: inventory::inventory(probe.as_ref(), false).unwrap(),
        probe,
        xids: XidLedger::default(),
        attempts: Arc::new(AttemptTable::new()),
        drain,
        notice,
        watching: false,
        serving_changes: serving.subscribe(),
        serving,
    }
}

/// A simulated GPU raises XID 79 at once; the broker fails the first two beats. The XID is in
/// all three beats up to the first answered one, and in none after it.
#[tokio::test]
async fn a_failed_heartbeat_keeps_its_xids() {
    let (broker, url) = broker(2).await;
    let decl: GpuDeclaration = "2xH100".parse().unwrap();
    let fault: GpuFault = "1:xid=79@0s".parse().unwrap();
    let probe =
        FakeProbe::with_faults(&[decl], "node-x", Arc::new(GpuSim::new()), vec![fault]).unwrap();
    let mut beat = beat_loop(url, Arc::new(probe));
    // The enrolment's probe (in beat_loop) already took the XID: absorb it as `serve` does.
    beat.xids.absorb(&mut beat.last_inventory.gpus);
    let mut streak = Streak::new("heartbeat");
    for _ in 0..4 {
        assert!(beat.beat(&mut streak).await.is_none());
    }
    let seen: Vec<Vec<Vec<u32>>> = broker
        .lock()
        .unwrap()
        .beats
        .iter()
        .map(|b| xids(&b.inventory.gpus))
        .collect();
    assert_eq!(
        seen,
        vec![
            vec![NONE, vec![79]],
            vec![NONE, vec![79]],
            vec![NONE, vec![79]],
            vec![NONE, NONE],
        ]
    );
    assert_eq!(beat.xids.pending(), 0);
}

//! What the gateway tests share: a replica server in the test process, and a service deployed
//! with it as its one ready replica (registered through the store as its agent would report
//! it). Included with `#[path]` by `gateway.rs` and `gateway_tracing.rs`.

use super::common::*;
use axum::routing::get;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use std::time::Duration;
use switchyard_core::NodeId;
use switchyard_protocol::agent::{AttemptRef, ReplicaReport};
use tokio::net::TcpListener;

pub fn spec(name: &str) -> Value {
    json!({
        "name": name, "team": "ml",
        "command": ["serve"],
        "resources": {"gpus": 1, "gpu_models": ["H100"]},
        "replicas": {"min": 1, "max": 1},
        "callers": [{"region": "onprem:test-dc", "share": 1.0}],
    })
}

/// A replica: `/` answers `hello` (with the `traceparent` it got, if any), `/slow` after 3 s.
pub async fn replica() -> u16 {
    let router = axum::Router::new()
        .route(
            "/",
            get(|headers: axum::http::HeaderMap| async move {
                let tp = headers
                    .get("traceparent")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_string();
                format!("hello {tp}")
            }),
        )
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(3)).await;
                "slow"
            }),
        );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, router).await });
    port
}

/// Deploys service `name` of team `ml` and runs its one replica on `agent`, listening on
/// `port` and ready; returns (service id, replica job id).
pub async fn deploy(app: &TestApp, agent: &TestAgent, name: &str, port: u16) -> (String, String) {
    let r = app
        .call(
            Method::POST,
            "/api/v1/services",
            Some(&app.admin),
            Some(spec(name)),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let id = r.body["id"].as_str().unwrap().to_string();
    let job = eventually("the replica's job", 20, async || {
        let v = app
            .call(
                Method::GET,
                &format!("/api/v1/services/{id}"),
                Some(&app.admin),
                None,
            )
            .await;
        v.body["replicas"][0]["job_id"].as_str().map(str::to_string)
    })
    .await;
    let attempt = start_leased(app, agent, &job, 1).await;
    let attempt: AttemptRef = serde_json::from_value(attempt).unwrap();
    let report = ReplicaReport {
        attempt,
        host: "127.0.0.1".into(),
        port,
        ready: true,
    };
    app.app
        .store
        .record_serving(&NodeId(agent.node.clone()), &[report], app.app.clock.now())
        .await
        .unwrap();
    (id, job)
}

//! Runtime prediction from history (issue 29): a job that succeeds teaches the broker its
//! runtime, kept in the store; the job view and the placement explanation show the prediction
//! and its source, and the planner costs a job without an estimate at the predicted p50. The
//! agent is played by hand on a manual clock; on SQLite, or PostgreSQL with
//! `SWITCHYARD_TEST_PG_URL`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use std::time::Duration;

fn spec(estimate_s: Option<i64>) -> Value {
    let mut s = json!({"name": "train", "team": "ml", "project": "vision",
                       "command": ["python", "train.py"], "resources": {"gpus": 1}});
    if let Some(e) = estimate_s {
        s["estimated_runtime_s"] = json!(e);
    }
    s
}

async fn submit(app: &TestApp, dev: &str, spec: Value) -> String {
    let r = app.submit(dev, spec).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    r.body["id"].as_str().unwrap().to_string()
}

/// Runs one job of `spec` to success on `agent`, `ran` after it started.
async fn run(app: &TestApp, dev: &str, agent: &TestAgent, spec: Value, ran: Duration) {
    let id = submit(app, dev, spec).await;
    let attempt = start_leased(app, agent, &id, 1).await;
    app.advance(ran);
    let r = events(
        app,
        agent,
        json!([{"type": "finished", "attempt": attempt, "exit_code": 0, "signal": null,
                "error": null, "stopped": false}]),
    )
    .await;
    assert_eq!(r, ["accepted"]);
    app.wait_for_job(dev, &id, Duration::from_secs(10), |j| {
        j["state"] == "succeeded"
    })
    .await;
}

/// A broker on a manual clock whose agents' leases outlive the hours the tests move it by
/// (no heartbeats are sent).
async fn spawn() -> TestApp {
    TestApp::spawn_with_clock(
        manual_clock(),
        |c| c.lease_ttl_s = 10 * 86_400,
        |_| switchyard_broker::app::ProviderSet::default(),
    )
    .await
}

#[tokio::test]
async fn succeeded_runs_predict_the_next_jobs_runtime() {
    let app = spawn().await;
    let dev = app.token("developer", Some("ml")).await;
    let agent = app.agent(1).await;

    // Before any history: the estimate as given, or the default hour.
    let first = submit(&app, &dev, spec(Some(36_000))).await;
    let view = app.job(&dev, &first).await.body;
    assert_eq!(
        view["runtime_prediction"]["source"], "user_estimate",
        "{view}"
    );
    assert_eq!(view["runtime_prediction"]["p50_s"], 36_000);
    let r = app
        .call(
            Method::POST,
            &format!("/api/v1/jobs/{first}/cancel"),
            Some(&dev),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.body);

    // Three runs that asked for 10 h and ran 2 h.
    for _ in 0..3 {
        run(
            &app,
            &dev,
            &agent,
            spec(Some(36_000)),
            Duration::from_secs(7200),
        )
        .await;
    }

    // Kept in the store (a restart reloads it): one row per key level and the ratio.
    let rows = app.app.store.runtime_history_since(None).await.unwrap();
    assert_eq!(rows.len(), 6, "{rows:?}");
    assert!(rows.iter().all(|r| r.sketch.n == 3), "{rows:?}");

    // No estimate: the command's three runs, about 2 h (the sketch's 2 %).
    let next = submit(&app, &dev, spec(None)).await;
    let view = app.job(&dev, &next).await.body;
    let p = &view["runtime_prediction"];
    assert_eq!(p["source"], "history", "{view}");
    assert_eq!(p["level"], "command");
    assert_eq!(p["runs"], 3);
    let p50 = p["p50_s"].as_i64().unwrap();
    assert!((7056..=7344).contains(&p50), "{p}");
    assert!(
        p["explanation"]
            .as_str()
            .unwrap()
            .ends_with("from 3 past runs of `train` (this command, 1 GPU) by vision in team ml"),
        "{p}"
    );

    // The planner costs it at that p50: its candidate runs from start to finish for ~2 h.
    let placement = eventually("the placement", 20, async || {
        let r = app
            .call(
                Method::GET,
                &format!("/api/v1/jobs/{next}/placement"),
                Some(&dev),
                None,
            )
            .await;
        (r.status == StatusCode::OK).then_some(r.body)
    })
    .await;
    assert_eq!(placement["runtime_prediction"], *p, "{placement}");
    let c = &placement["candidates"][0];
    let secs = |v: &Value| {
        chrono::DateTime::parse_from_rfc3339(v.as_str().unwrap())
            .unwrap()
            .timestamp()
    };
    let ran = secs(&c["finish"]) - secs(&c["start"]);
    assert!((ran - p50).abs() <= 1, "{c} vs p50 {p50}");

    // With the 10 h estimate: calibrated by what the user's runs used of theirs (a fifth,
    // shrunk toward 1 with three runs), and blended with the command's history.
    let view = app
        .job(&dev, &submit(&app, &dev, spec(Some(36_000))).await)
        .await
        .body;
    let p = &view["runtime_prediction"];
    assert_eq!(p["source"], "calibrated", "{view}");
    let p50 = p["p50_s"].as_i64().unwrap();
    assert!(p50 > 7200 && p50 < 36_000 / 2, "{p}");
    assert!(
        p["explanation"]
            .as_str()
            .unwrap()
            .contains("the 10.0 h estimated, scaled by"),
        "{p}"
    );
}

#[tokio::test]
async fn a_failed_run_teaches_nothing() {
    let app = spawn().await;
    let dev = app.token("developer", Some("ml")).await;
    let agent = app.agent(1).await;
    let id = submit(&app, &dev, spec(None)).await;
    let attempt = start_leased(&app, &agent, &id, 1).await;
    app.advance(Duration::from_secs(60));
    let r = events(
        &app,
        &agent,
        json!([{"type": "finished", "attempt": attempt, "exit_code": 1, "signal": null,
                "error": null, "stopped": false}]),
    )
    .await;
    assert_eq!(r, ["accepted"]);
    assert_eq!(app.job(&dev, &id).await.body["state"], "failed");
    assert!(
        app.app
            .store
            .runtime_history_since(None)
            .await
            .unwrap()
            .is_empty()
    );
    let view = app.job(&dev, &id).await.body;
    assert_eq!(view["runtime_prediction"]["source"], "default", "{view}");
    assert_eq!(
        view["runtime_prediction"]["explanation"],
        "1.0 h assumed: no estimate and no past runs"
    );
}

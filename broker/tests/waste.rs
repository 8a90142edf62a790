//! The waste rule (issue 28): a team policy's `utilization` section acting on jobs whose GPUs
//! stay idle, judged from heartbeats the tests send by hand with chosen utilisation, on a manual
//! clock. SQLite, or PostgreSQL with `SWITCHYARD_TEST_PG_URL`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use std::time::Duration;

/// The heartbeat interval these tests run with: the judge's gap limit is three of them.
const BEAT_S: u64 = 10;

async fn spawn() -> TestApp {
    TestApp::spawn_with_clock(
        manual_clock(),
        |c| {
            c.heartbeat_interval_s = BEAT_S;
            c.lease_ttl_s = 600;
        },
        |_| switchyard_broker::app::ProviderSet::default(),
    )
    .await
}

async fn put_policy(app: &TestApp, body: Value) -> Response {
    app.call(
        Method::PUT,
        "/api/v1/policies/ml",
        Some(&app.admin),
        Some(body),
    )
    .await
}

fn rule(action: &str) -> Value {
    json!({"utilization": {"min_gpu_utilization_pct": 10, "window_s": 60, "action": action,
                           "exempt_priorities": ["critical"]}})
}

/// A running job of team ml on one GPU of a one-GPU node; returns (agent, job id, attempt).
async fn running_job(app: &TestApp, priority: &str) -> (TestAgent, String, Value) {
    let agent = app.agent(1).await;
    let dev = app.token("developer", Some("ml")).await;
    let r = app
        .submit(
            &dev,
            json!({"name": "train", "team": "ml", "command": ["sleep", "1000"],
                   "resources": {"gpus": 1}, "priority": priority}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let id = r.body["id"].as_str().unwrap().to_string();
    let attempt = start_leased(app, &agent, &id, 2).await;
    (agent, id, attempt)
}

/// A heartbeat from `agent` whose GPU 0 reads `util` % (`None`: no reading), running `attempt`.
async fn heartbeat(app: &TestApp, agent: &TestAgent, attempt: &Value, util: Option<u32>) {
    let mut gpu = json!({"index": 0, "uuid": "GPU-fake-0", "model": "H100", "memory_mb": 81920,
                         "memory_used_mb": 40000});
    if let Some(u) = util {
        gpu["utilization_pct"] = json!(u);
    }
    let hb = app
        .call(
            Method::POST,
            "/agent/v1/heartbeat",
            Some(&agent.token),
            Some(
                json!({"inventory": {"gpus": [gpu], "cpus": 8, "memory_mb": 65536,
                                      "simulated": true},
                        "running": [attempt]}),
            ),
        )
        .await;
    assert_eq!(hb.status, StatusCode::OK, "{}", hb.body);
}

/// The waste report since 2000 (admin).
async fn waste(app: &TestApp) -> Value {
    let r = app
        .call(
            Method::GET,
            "/api/v1/waste?from=2000-01-01T00:00:00Z",
            Some(&app.admin),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    r.body
}

fn millis(rfc3339: &Value) -> i64 {
    chrono::DateTime::parse_from_rfc3339(rfc3339.as_str().unwrap())
        .unwrap()
        .timestamp_millis()
}

/// One heartbeat reading `util`, then the clock moves `BEAT_S`; waits until the waste loop has
/// judged that heartbeat.
async fn beat(app: &TestApp, agent: &TestAgent, job: &str, attempt: &Value, util: Option<u32>) {
    let at = app.app.clock.now().millis();
    heartbeat(app, agent, attempt, util).await;
    app.advance(Duration::from_secs(BEAT_S));
    eventually("the waste loop to judge the heartbeat", 20, async || {
        let w = waste(app).await;
        w["worst"]
            .as_array()
            .unwrap()
            .iter()
            .any(|j| j["job_id"] == job && millis(&j["last_sample_at"]) >= at)
            .then_some(())
    })
    .await;
}

async fn job(app: &TestApp, id: &str) -> Value {
    let r = app.job(&app.admin, id).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    r.body
}

async fn audit(app: &TestApp, action: &str) -> Vec<Value> {
    let r = app
        .call(
            Method::GET,
            &format!("/api/v1/audit?action={action}"),
            Some(&app.admin),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    r.body["entries"].as_array().cloned().unwrap_or_default()
}

fn worst_row<'a>(w: &'a Value, job: &str) -> &'a Value {
    w["worst"]
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["job_id"] == job)
        .expect("the job is in the report")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_job_is_stopped_after_the_window_and_not_before() {
    let app = spawn().await;
    assert!(put_policy(&app, rule("stop")).await.status.is_success());
    let (agent, id, attempt) = running_job(&app, "normal").await;
    // Samples at 0, 10, … 50 s: idle for 50 s, under the 60 s window.
    for _ in 0..6 {
        beat(&app, &agent, &id, &attempt, Some(3)).await;
    }
    let j = job(&app, &id).await;
    assert_eq!(j["state"], "running", "{j}");
    assert!(audit(&app, "gpu_waste.stop").await.is_empty());
    assert!(worst_row(&waste(&app).await, &id)["action"].is_null());
    // The sample at 60 s meets the window.
    beat(&app, &agent, &id, &attempt, Some(3)).await;
    let why = "GPUs under 10 % for 1 min (policy ml v1): stopped";
    eventually("the stop", 20, async || {
        (job(&app, &id).await["reason"] == why).then_some(())
    })
    .await;
    let entries = audit(&app, "gpu_waste.stop").await;
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(entries[0]["target"], format!("job:{id}"));
    assert_eq!(entries[0]["after"]["team"], "ml");
    // Finance sees it too.
    let finance = app.token("finance", None).await;
    let r = app
        .call(
            Method::GET,
            "/api/v1/audit?action=gpu_waste.stop",
            Some(&finance),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body["entries"].as_array().map(Vec::len), Some(1));
    // The agent is told to stop it; when it reports, the job ends cancelled with the reason.
    let r = events(
        &app,
        &agent,
        json!([{"type": "finished", "attempt": attempt, "exit_code": null, "signal": 15,
                "error": null, "stopped": true}]),
    )
    .await;
    assert_eq!(r, ["accepted"]);
    let j = job(&app, &id).await;
    assert_eq!(j["state"], "cancelled", "{j}");
    assert_eq!(j["reason"], why);
    let w = worst_row(&waste(&app).await, &id).clone();
    assert_eq!(w["action"], "stop");
    // Idle from 0 to 60 s on one GPU: a sixtieth of a GPU-hour.
    let idle = w["idle_gpu_hours"].as_f64().unwrap();
    assert!((idle - 60.0 / 3600.0).abs() < 1e-9, "{idle}");

    // /metrics counts it by team.
    let text = app
        .http
        .get(format!("{}/metrics", app.url))
        .bearer_auth(&app.admin)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with("switchyard_gpu_wasted_hours_total{team=\"ml\"}"))
        .expect("the wasted-hours series");
    let v: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!((v - 60.0 / 3600.0).abs() < 1e-9, "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_job_is_requeued_or_notified_with_the_reason() {
    for action in ["requeue", "notify"] {
        let app = spawn().await;
        assert!(put_policy(&app, rule(action)).await.status.is_success());
        let (agent, id, attempt) = running_job(&app, "low").await;
        for _ in 0..7 {
            beat(&app, &agent, &id, &attempt, Some(0)).await;
        }
        let done = if action == "requeue" {
            "requeued"
        } else {
            "notified"
        };
        let why = format!("GPUs under 10 % for 1 min (policy ml v1): {done}");
        eventually("the action", 20, async || {
            (job(&app, &id).await["reason"] == why.as_str()).then_some(())
        })
        .await;
        let entries = audit(&app, &format!("gpu_waste.{action}")).await;
        assert_eq!(entries.len(), 1, "{action}: {entries:?}");
        let j = job(&app, &id).await;
        assert_ne!(j["state"], "cancelled", "{action}: {j}");
        if action == "notify" {
            assert_eq!(j["state"], "running", "{j}");
            // Acted on once: more idle heartbeats add no entry.
            beat(&app, &agent, &id, &attempt, Some(0)).await;
            beat(&app, &agent, &id, &attempt, Some(0)).await;
            assert_eq!(audit(&app, "gpu_waste.notify").await.len(), 1);
        } else {
            // The agent is told to stop the attempt (as a preemption's victim).
            let w = work(&app, &agent, 1).await;
            assert!(w["stop"].as_array().is_some_and(|s| !s.is_empty()), "{w}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_job_and_an_exempt_priority_are_never_acted_on() {
    let app = spawn().await;
    assert!(put_policy(&app, rule("stop")).await.status.is_success());
    let (agent, busy, attempt) = running_job(&app, "normal").await;
    for _ in 0..12 {
        beat(&app, &agent, &busy, &attempt, Some(80)).await;
    }
    let (agent2, exempt, attempt2) = running_job(&app, "critical").await;
    for _ in 0..12 {
        beat(&app, &agent2, &exempt, &attempt2, Some(0)).await;
    }
    for id in [&busy, &exempt] {
        let j = job(&app, id).await;
        assert_eq!(j["state"], "running", "{j}");
        assert!(
            j["reason"]
                .as_str()
                .is_none_or(|r| !r.contains("GPUs under")),
            "{j}"
        );
    }
    assert!(audit(&app, "gpu_waste.stop").await.is_empty());
    let w = waste(&app).await;
    assert_eq!(worst_row(&w, &busy)["idle_gpu_hours"], 0.0);
    // The exempt job's idle time is still measured.
    assert!(worst_row(&w, &exempt)["idle_gpu_hours"].as_f64().unwrap() > 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gap_in_heartbeats_or_no_reading_is_not_idleness() {
    let app = spawn().await;
    assert!(put_policy(&app, rule("stop")).await.status.is_success());
    let (agent, id, attempt) = running_job(&app, "normal").await;
    // Idle at 0…30 s, then 40 s of silence (over 3 heartbeat intervals).
    for _ in 0..4 {
        beat(&app, &agent, &id, &attempt, Some(0)).await;
    }
    app.advance(Duration::from_secs(30));
    // Idle again from 70 s: at 120 s that is 50 s, not the window.
    for _ in 0..6 {
        beat(&app, &agent, &id, &attempt, Some(0)).await;
    }
    assert_eq!(job(&app, &id).await["state"], "running");
    // A heartbeat without a reading breaks the stretch too.
    beat(&app, &agent, &id, &attempt, None).await;
    for _ in 0..6 {
        beat(&app, &agent, &id, &attempt, Some(0)).await;
    }
    let j = job(&app, &id).await;
    assert_eq!(j["state"], "running", "{j}");
    assert!(audit(&app, "gpu_waste.stop").await.is_empty());
    // One more idle sample: 60 s since the reading came back.
    beat(&app, &agent, &id, &attempt, Some(0)).await;
    eventually("the stop", 20, async || {
        (job(&app, &id).await["reason"]
            .as_str()
            .is_some_and(|r| r.ends_with("stopped")))
        .then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_from_before_the_job_started_is_not_a_sample() {
    let app = spawn().await;
    assert!(put_policy(&app, rule("stop")).await.status.is_success());
    let agent = app.agent(1).await;
    let dev = app.token("developer", Some("ml")).await;
    let r = app
        .submit(
            &dev,
            json!({"name": "train", "team": "ml", "command": ["sleep", "1000"],
                   "resources": {"gpus": 1}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let id = r.body["id"].as_str().unwrap().to_string();
    let attempt = eventually("the job's lease", 20, async || {
        let w = work(&app, &agent, 2).await;
        w["leases"]
            .as_array()
            .unwrap()
            .first()
            .map(|l| l["attempt"].clone())
    })
    .await;
    // The agent's heartbeat reads the GPU idle before it starts the job, 5 s later.
    heartbeat(&app, &agent, &attempt, Some(0)).await;
    app.advance(Duration::from_secs(5));
    let started_at = app.app.clock.now().millis();
    let r = events(
        &app,
        &agent,
        json!([{"type": "started", "attempt": attempt, "pid": 1}]),
    )
    .await;
    assert_eq!(r, ["accepted"]);
    // The loop passes over that heartbeat; the job's first sample is the next one.
    app.advance(Duration::from_secs(BEAT_S));
    tokio::time::sleep(Duration::from_millis(300)).await;
    beat(&app, &agent, &id, &attempt, Some(0)).await;
    let w = waste(&app).await;
    let row = worst_row(&w, &id);
    assert!(
        millis(&row["idle_since"]) >= started_at,
        "an idle stretch began before the job started: {row}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_utilization_rules_are_refused_naming_the_field() {
    let app = spawn().await;
    let cases = [
        (
            json!({"min_gpu_utilization_pct": 0, "window_s": 600, "action": "stop"}),
            "utilization.min_gpu_utilization_pct",
        ),
        (
            json!({"min_gpu_utilization_pct": 101, "window_s": 600, "action": "stop"}),
            "utilization.min_gpu_utilization_pct",
        ),
        (
            json!({"min_gpu_utilization_pct": 10, "window_s": 59, "action": "stop"}),
            "utilization.window_s",
        ),
        (
            json!({"min_gpu_utilization_pct": 10, "window_s": 604_801, "action": "stop"}),
            "utilization.window_s",
        ),
        (
            json!({"min_gpu_utilization_pct": 10, "window_s": 600, "action": "kill"}),
            "utilization.action",
        ),
        (
            json!({"min_gpu_utilization_pct": 10, "window_s": 600, "action": "stop",
                   "exempt_priorities": ["high", "high"]}),
            "utilization.exempt_priorities[1]",
        ),
    ];
    for (u, field) in cases {
        let r = put_policy(&app, json!({ "utilization": u })).await;
        assert!(
            r.status == StatusCode::BAD_REQUEST || r.status == StatusCode::UNPROCESSABLE_ENTITY,
            "{u}: {}",
            r.body
        );
        assert_eq!(r.error_field(), field, "{u}: {}", r.body);
    }
    // A good one is kept and shown.
    let good = json!({"min_gpu_utilization_pct": 10, "window_s": 1800, "action": "notify",
                      "exempt_priorities": ["critical"]});
    let r = put_policy(&app, json!({ "utilization": good })).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let r = app
        .call(Method::GET, "/api/v1/policies/ml", Some(&app.admin), None)
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.body["policy"]["utilization"], good, "{}", r.body);
    // Developers cannot read the waste report.
    let dev = app.token("developer", Some("ml")).await;
    let r = app
        .call(Method::GET, "/api/v1/waste", Some(&dev), None)
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    let r = app
        .call(
            Method::GET,
            "/api/v1/waste?period=year",
            Some(&app.admin),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.error_field(), "period");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_if_lists_the_job_a_utilization_rule_would_have_stopped() {
    let app = spawn().await;
    // No rule: the job is only measured.
    let (agent, idle, attempt) = running_job(&app, "normal").await;
    for _ in 0..10 {
        beat(&app, &agent, &idle, &attempt, Some(4)).await;
    }
    assert_eq!(job(&app, &idle).await["state"], "running");
    let what_if = |rule: Value| {
        let app = &app;
        async move {
            let r = app
                .call(
                    Method::POST,
                    "/api/v1/policies/ml/what-if",
                    Some(&app.admin),
                    Some(json!({ "utilization": rule })),
                )
                .await;
            assert_eq!(r.status, StatusCode::OK, "{}", r.body);
            r.body
        }
    };
    // Idle (4 %) for 90 s: a 60 s rule at 5 % would have stopped it, freeing 30 GPU-seconds.
    let r = what_if(json!({"min_gpu_utilization_pct": 5, "window_s": 60, "action": "stop"})).await;
    let w = &r["waste"];
    assert_eq!(w["action"], "stop", "{r}");
    assert_eq!(w["judged_at_pct"], 5);
    let listed = w["would_act"].as_array().unwrap();
    assert_eq!(listed.len(), 1, "{r}");
    assert_eq!(listed[0]["job_id"], idle.as_str());
    assert_eq!(listed[0]["longest_idle_s"], 90);
    let hours = w["gpu_hours_freed"].as_f64().unwrap();
    assert!((hours - 30.0 / 3600.0).abs() < 1e-9, "{r}");
    assert!(w["usd_freed"].as_f64().unwrap() >= 0.0);
    // A longer window, or a threshold under the job's activity, would not have.
    let r = what_if(json!({"min_gpu_utilization_pct": 5, "window_s": 120, "action": "stop"})).await;
    assert_eq!(
        r["waste"]["would_act"].as_array().map(Vec::len),
        Some(0),
        "{r}"
    );
    let r = what_if(json!({"min_gpu_utilization_pct": 4, "window_s": 60, "action": "stop"})).await;
    assert_eq!(
        r["waste"]["would_act"].as_array().map(Vec::len),
        Some(0),
        "{r}"
    );
    // An exempt priority is not listed.
    let r = what_if(
        json!({"min_gpu_utilization_pct": 20, "window_s": 60, "action": "stop",
                          "exempt_priorities": ["normal"]}),
    )
    .await;
    assert_eq!(
        r["waste"]["would_act"].as_array().map(Vec::len),
        Some(0),
        "{r}"
    );
    // Without a rule in the draft there is no waste answer.
    let r = app
        .call(
            Method::POST,
            "/api/v1/policies/ml/what-if",
            Some(&app.admin),
            Some(json!({})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert!(r.body.get("waste").is_none(), "{}", r.body);
}

//! GPU truth end to end on `switchyard up` (issue 28), real processes: the broker, its two
//! on-prem agents with simulated H100s that follow what runs on them, and the jobs.
//!
//! - **Waste**: the issue's story, a training job stuck while its GPUs idle. Team ml's policy
//!   stops a job whose GPUs stay under 20 % for 60 s. Job A works (its level file at 90), then
//!   writes 3 and sleeps; job B is busy at 90 throughout. A is left alone through the first
//!   half of the window, then stopped with the rule in its `reason`, an audit entry and its idle
//!   GPU-hours in `GET /waste`; B runs on.
//! - **A GPU falls off the bus**: `up --fake-gpu-fault` raises XID 79 on onprem-1's GPU 0 while
//!   a job holding all four of its GPUs runs there (onprem-2 drained, so that is where it runs).
//!   The job is requeued with the reason, `GET /nodes` marks the GPU with it, the job runs
//!   again on onprem-2 once that is undrained, and undraining onprem-1 (with the CLI) clears
//!   the mark, which stays cleared.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use chrono::{DateTime, Utc};
use reqwest::Method;
use serde_json::{Value, json};
use std::time::Duration;
use switchyard_tests::*;

/// A time the API wrote.
fn at(v: &Value) -> DateTime<Utc> {
    v.as_str()
        .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
        .unwrap_or_else(|| panic!("not a time: {v}"))
        .with_timezone(&Utc)
}

/// Job `id`'s entry among `GET /waste`'s worst jobs this month.
async fn wasted(up: &Up, id: &str) -> Option<Value> {
    up.get("/api/v1/waste?period=month").await["worst"]
        .as_array()?
        .iter()
        .find(|j| j["job_id"] == id)
        .cloned()
}

/// Works for a few seconds at 90 %, then is stuck: its GPUs at 3 % while it sleeps on.
const STUCK: &str =
    r#"echo 90 > "$SWITCHYARD_GPU_SIM"; sleep 10; echo 3 > "$SWITCHYARD_GPU_SIM"; exec sleep 600"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_jobs_idle_gpus_are_found_and_it_is_stopped_after_the_window() {
    let up = Up::start(&[], 8).await;
    let (status, body) = up
        .send(
            Method::PUT,
            "/api/v1/policies/ml",
            Some(
                json!({"utilization": {"min_gpu_utilization_pct": 20, "window_s": 60,
                                        "action": "stop"}}),
            ),
        )
        .await;
    assert!(status == 200 || status == 201, "{status} {body}");
    let spec = |name: &str, command: Value| {
        json!({"name": name, "team": "ml", "command": command,
               "resources": {"gpus": 2}, "regions": ["onprem:local-dc1"],
               "estimated_runtime_s": 600})
    };
    let a = up.submit(spec("stuck", json!(["sh", "-c", STUCK]))).await;
    let mut busy = spec("busy", json!(["sleep", "600"]));
    busy["expected_gpu_utilization"] = json!(90);
    let b = up.submit(busy).await;
    up.job_where(&a, 30, |j| j["state"] == "running").await;
    up.job_where(&b, 30, |j| j["state"] == "running").await;

    // A works first: a sample at its level of 90 (a heartbeat from before it started may
    // come first, at 0 %), then it goes idle once it writes 3.
    let working = eventually(
        "job A at work in GET /waste",
        Duration::from_secs(30),
        || async {
            wasted(&up, &a)
                .await
                .filter(|w| w["activity_pct"].as_f64().is_some_and(|p| p >= 80.0))
        },
    )
    .await;
    assert!(working["idle_since"].is_null(), "{working}");
    let idle = eventually(
        "job A idle in GET /waste",
        Duration::from_secs(45),
        || async { wasted(&up, &a).await.filter(|w| !w["idle_since"].is_null()) },
    )
    .await;
    let idle_since = at(&idle["idle_since"]);
    assert!(
        idle_since > at(&working["last_sample_at"]),
        "A's idle stretch began before its busy sample: {working} {idle}"
    );
    assert!(
        idle["activity_pct"].as_f64().is_some_and(|p| p < 20.0),
        "{idle}"
    );
    assert_eq!(idle["gpus"], 2, "{idle}");

    // Half-way through the window: A's GPUs show 3 % on its node, and it still runs.
    let halfway = eventually(
        "A idle for 30 s of the 60 s window",
        Duration::from_secs(45),
        || async {
            let w = wasted(&up, &a).await?;
            (at(&w["last_sample_at"]) - idle_since >= chrono::Duration::seconds(30)).then_some(w)
        },
    )
    .await;
    let now_a = up.get(&format!("/api/v1/jobs/{a}")).await;
    assert_eq!(
        now_a["state"], "running",
        "stopped before the window: {now_a}"
    );
    assert!(now_a["reason"].is_null(), "{now_a}");
    assert!(halfway["action"].is_null(), "{halfway}");
    let placement = &now_a["placement"];
    let nodes = up.get("/api/v1/nodes").await;
    let node = nodes["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["id"] == placement["node"])
        .unwrap_or_else(|| panic!("A's node in {nodes}"));
    for g in placement["gpus"].as_array().unwrap() {
        let gpu = &node["gpus"][g.as_u64().unwrap() as usize];
        assert_eq!(gpu["utilization_pct"], 3, "A's GPU {g}: {gpu}");
    }

    // After the window: stopped, the rule named in its reason.
    let done = up
        .job_where(&a, 60, |j| {
            j["state"] != "running" && j["state"] != "placed"
        })
        .await;
    assert_eq!(done["state"], "cancelled", "{done}");
    assert_eq!(
        done["reason"], "GPUs under 20 % for 1 min (policy ml v1): stopped",
        "{done}"
    );
    let idle_for = at(&done["finished_at"]) - idle_since;
    assert!(
        idle_for >= chrono::Duration::seconds(59) && idle_for <= chrono::Duration::seconds(90),
        "stopped {idle_for} after it went idle, the window is 60 s: {done}"
    );

    // The audit log says so, as the system.
    let audit = up
        .get(&format!(
            "/api/v1/audit?action=gpu_waste.stop&target=job:{a}"
        ))
        .await;
    let entries = audit["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 1, "{audit}");
    assert_eq!(entries[0]["actor"], "system", "{audit}");
    assert_eq!(entries[0]["after"]["reason"], done["reason"], "{audit}");

    // GET /waste: A's idle GPU-hours and what the rule did; team ml's total.
    let report = up.get("/api/v1/waste?period=month").await;
    let w = report["worst"]
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["job_id"] == a.as_str())
        .unwrap_or_else(|| panic!("A in {report}"));
    assert!(w["idle_gpu_hours"].as_f64().unwrap() > 0.0, "{w}");
    assert_eq!(w["action"], "stop", "{w}");
    assert_eq!(w["reason"], done["reason"], "{w}");
    let ml = report["teams"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["team"] == "ml")
        .unwrap_or_else(|| panic!("team ml in {report}"));
    assert!(ml["idle_gpu_hours"].as_f64().unwrap() > 0.0, "{report}");

    // B, busy all along, runs on, never judged idle.
    let job_b = up.get(&format!("/api/v1/jobs/{b}")).await;
    assert_eq!(job_b["state"], "running", "{job_b}");
    assert!(job_b["reason"].is_null(), "{job_b}");
    if let Some(wb) = wasted(&up, &b).await {
        assert_eq!(wb["idle_gpu_hours"].as_f64(), Some(0.0), "{wb}");
        assert!(wb["action"].is_null() && wb["idle_since"].is_null(), "{wb}");
    }
}

/// Node `prefix`-… of `GET /nodes` (up's agents are `onprem-1-<hash>`, `onprem-2-<hash>`).
async fn node(up: &Up, prefix: &str) -> Value {
    let nodes = up.get("/api/v1/nodes").await;
    nodes["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["id"].as_str().unwrap().starts_with(prefix))
        .cloned()
        .unwrap_or_else(|| panic!("no node {prefix} in {nodes}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_that_falls_off_the_bus_on_up_requeues_its_job_until_an_operator_undrains() {
    // onprem-1's GPU 0 falls off the bus 25 s after its agent starts.
    let up = Up::start(&["--fake-gpu-fault", "1/0:xid=79@25s"], 8).await;
    let one = node(&up, "onprem-1-").await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let two = node(&up, "onprem-2-").await["id"]
        .as_str()
        .unwrap()
        .to_string();
    // onprem-2 drained: a job asking for four GPUs on-prem can only run on all of onprem-1's.
    let (status, body) = up
        .send(Method::POST, &format!("/api/v1/nodes/{two}/drain"), None)
        .await;
    assert_eq!(status, 200, "{body}");
    let id = up
        .submit(
            json!({"name": "train", "team": "ml", "command": ["sleep", "600"],
                       "resources": {"gpus": 4}, "regions": ["onprem:local-dc1"],
                       "estimated_runtime_s": 600}),
        )
        .await;
    let job = up.job_where(&id, 20, |j| j["state"] == "running").await;
    assert_eq!(job["placement"]["node"], one.as_str(), "{job}");
    assert_eq!(job["placement"]["gpus"], json!([0, 1, 2, 3]), "{job}");
    assert_eq!(
        node(&up, "onprem-1-").await["gpus"][0]["healthy"],
        true,
        "the fault came before the job ran: lengthen its delay"
    );

    // The XID: the job is requeued with the reason, and waits (no four healthy GPUs free).
    let job = up.job_where(&id, 45, |j| j["state"] == "queued").await;
    assert_eq!(
        job["reason"], "GPU 0 fell off the bus (XID 79): requeued",
        "{job}"
    );
    assert_eq!(job["attempts"], 1, "{job}");
    let sick = node(&up, "onprem-1-").await;
    assert_eq!(sick["gpus"][0]["healthy"], false, "{sick}");
    assert_eq!(
        sick["gpus"][0]["reasons"],
        json!(["GPU 0 fell off the bus (XID 79)"]),
        "{sick}"
    );
    for g in 1..4 {
        assert_eq!(sick["gpus"][g]["healthy"], true, "GPU {g}: {sick}");
    }

    // onprem-2 takes work again: the job runs there, on healthy GPUs.
    let (status, body) = up
        .send(Method::POST, &format!("/api/v1/nodes/{two}/undrain"), None)
        .await;
    assert_eq!(status, 200, "{body}");
    let job = up
        .job_where(&id, 30, |j| j["state"] == "running" && j["attempts"] == 2)
        .await;
    assert_eq!(job["placement"]["node"], two.as_str(), "{job}");
    assert!(job["reason"].is_null(), "{job}");

    // The operator vouches for onprem-1's GPU 0 with the CLI: the mark is gone, and stays gone
    // through the heartbeats after (the XID was a single event).
    let out = std::process::Command::new(bin("switchyard"))
        .args([
            "nodes", "undrain", &one, "--url", &up.url, "--token", &up.token,
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let undrained = node(&up, "onprem-1-").await;
    let since = at(&undrained["last_heartbeat"]);
    assert_eq!(undrained["gpus"][0]["healthy"], true, "{undrained}");
    assert_eq!(undrained["gpus"][0]["reasons"], json!([]), "{undrained}");
    let later = eventually(
        "two more heartbeats from onprem-1",
        Duration::from_secs(30),
        || async {
            let n = node(&up, "onprem-1-").await;
            (at(&n["last_heartbeat"]) >= since + chrono::Duration::seconds(6)).then_some(n)
        },
    )
    .await;
    assert_eq!(later["state"], "healthy", "{later}");
    for g in 0..4 {
        assert_eq!(later["gpus"][g]["healthy"], true, "GPU {g}: {later}");
    }
}

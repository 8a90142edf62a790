//! Preemption carried out by the broker: an urgent job whose deadline cannot be met by waiting
//! takes a node from low-priority work. The victim is told to stop (checkpoint signal), keeps
//! its GPUs until its agent reports the end, and is then requeued with its progress noted; only
//! then does the urgent job get the GPUs — never two jobs on one GPU. The tests play the agent
//! by hand.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(10);

fn spec(name: &str, priority: &str, runtime_s: u64, deadline_in_s: Option<i64>) -> Value {
    let mut s = json!({
        "name": name, "team": "ml", "command": ["sleep", "1000"],
        "resources": {"gpus": 4}, "priority": priority, "estimated_runtime_s": runtime_s,
    });
    if let Some(d) = deadline_in_s {
        let at = chrono::Utc::now() + chrono::Duration::seconds(d);
        s["deadline"] = json!(at.to_rfc3339());
    }
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_urgent_job_preempts_low_work_which_is_requeued_after_it_stops() {
    let app = TestApp::spawn().await;
    let dev = app.token("developer", Some("ml")).await;
    let agent = app.agent(4).await;

    // Low-priority work fills the only node for ten hours.
    let low = app.submit(&dev, spec("low", "low", 36_000, None)).await;
    assert_eq!(low.status, StatusCode::CREATED, "{}", low.body);
    let low_id = low.body["id"].as_str().unwrap().to_string();
    let w = work(&app, &agent, 5).await;
    let old = w["leases"][0]["attempt"].clone();
    assert_eq!(old["job_id"], low_id.as_str(), "{w}");
    assert_eq!(
        events(
            &app,
            &agent,
            json!([{"type": "started", "attempt": old, "pid": 7}])
        )
        .await,
        ["accepted"]
    );

    // A critical job due in 20 minutes cannot wait ten hours: the low job is told to stop.
    let urgent = app
        .submit(&dev, spec("urgent", "critical", 300, Some(1200)))
        .await;
    assert_eq!(urgent.status, StatusCode::CREATED, "{}", urgent.body);
    let urgent_id = urgent.body["id"].as_str().unwrap().to_string();
    let deadline = tokio::time::Instant::now() + WAIT;
    let stop = loop {
        let w = work(&app, &agent, 2).await;
        if !w["stop"].as_array().unwrap().is_empty() {
            break w;
        }
        assert!(tokio::time::Instant::now() < deadline, "no stop: {w}");
    };
    assert_eq!(stop["stop"], json!([old]), "{stop}");
    // Until the agent reports the end, the GPUs are the victim's: nothing new on the node.
    assert_eq!(stop["leases"], json!([]), "{stop}");
    let low_job = app.job(&dev, &low_id).await.body;
    assert_eq!(low_job["state"], "running", "{low_job}");
    let reason = low_job["reason"].as_str().unwrap();
    assert!(
        reason.starts_with(&format!("preempted by job {urgent_id}"))
            && reason.contains(" s of an estimated 36000 s"),
        "{reason}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let u = app.job(&dev, &urgent_id).await.body;
    assert_eq!(u["state"], "queued", "{u}");

    // The victim checkpoints and exits on SIGTERM: it is requeued, and the urgent job gets
    // the node.
    assert_eq!(
        events(
            &app,
            &agent,
            json!([
                {"type": "log", "attempt": old, "seq": 0, "stream": "stdout", "data": "checkpoint saved\n"},
                {"type": "finished", "attempt": old, "exit_code": null, "signal": 15, "error": null, "stopped": true}
            ])
        )
        .await,
        ["accepted", "accepted"]
    );
    let low_job = app.job(&dev, &low_id).await.body;
    assert_eq!(low_job["state"], "queued", "{low_job}");
    assert!(
        low_job["reason"]
            .as_str()
            .unwrap()
            .starts_with("preempted by job"),
        "{low_job}"
    );
    let placed = app
        .wait_for_job(&dev, &urgent_id, WAIT, |j| j["state"] == "placed")
        .await;
    assert_eq!(placed["placement"]["node"], agent.node.as_str());
    let w = work(&app, &agent, 5).await;
    assert_eq!(
        w["leases"][0]["attempt"]["job_id"],
        urgent_id.as_str(),
        "{w}"
    );
    // The victim waits for the node rather than running twice.
    assert_eq!(app.job(&dev, &low_id).await.body["state"], "queued");
    // A repeated report of the victim's end is refused (the attempt is over), and changes
    // nothing.
    assert_eq!(
        events(
            &app,
            &agent,
            json!([{"type": "finished", "attempt": old, "exit_code": null, "signal": 15, "error": null, "stopped": true}])
        )
        .await,
        ["rejected"]
    );
    assert_eq!(app.job(&dev, &low_id).await.body["state"], "queued");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn urgent_work_that_can_wait_does_not_preempt() {
    let app = TestApp::spawn().await;
    let dev = app.token("developer", Some("ml")).await;
    let agent = app.agent(4).await;
    let low = app.submit(&dev, spec("low", "low", 600, None)).await;
    let low_id = low.body["id"].as_str().unwrap().to_string();
    let w = work(&app, &agent, 5).await;
    let old = w["leases"][0]["attempt"].clone();
    assert_eq!(old["job_id"], low_id.as_str(), "{w}");
    events(
        &app,
        &agent,
        json!([{"type": "started", "attempt": old, "pid": 7}]),
    )
    .await;
    // Due in a day: waiting ten minutes for the low job meets it.
    let urgent = app
        .submit(&dev, spec("urgent", "critical", 300, Some(86_400)))
        .await;
    assert_eq!(urgent.status, StatusCode::CREATED, "{}", urgent.body);
    let w = work(&app, &agent, 2).await;
    assert_eq!(w["stop"], json!([]), "{w}");
    assert_eq!(app.job(&dev, &low_id).await.body["state"], "running");
}

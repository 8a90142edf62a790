//! Spot interruptions over the agent protocol: a heartbeat carrying the cloud's notice drains
//! the node, takes its work back (the attempts come back in `stop`, for the checkpoint signal),
//! requeues the job elsewhere and rejects what the old attempt reports later; a burst instance
//! behind the node becomes `draining`. The tests play the agents by hand.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use switchyard_providers::fake::FakeProvider;

const WAIT: Duration = Duration::from_secs(10);

fn notice() -> Value {
    json!({"action": "terminate", "at": "2026-12-02T12:00:00Z"})
}

fn inventory(gpus: u32) -> Value {
    register_body(gpus)["inventory"].clone()
}

/// One heartbeat from `agent` saying it runs `running`, with or without a notice.
async fn heartbeat(
    app: &TestApp,
    agent: &TestAgent,
    gpus: u32,
    running: &[&Value],
    notice: Option<Value>,
) -> Value {
    let mut body = json!({"inventory": inventory(gpus), "running": running});
    if let Some(n) = notice {
        body["interruption"] = n;
    }
    let r = app
        .call(
            Method::POST,
            "/agent/v1/heartbeat",
            Some(&agent.token),
            Some(body),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    r.body
}

/// Polls `agent`'s work until a lease comes; returns its attempt.
async fn lease(app: &TestApp, agent: &TestAgent) -> Value {
    let w = work(app, agent, 5).await;
    assert!(
        !w["leases"].as_array().unwrap().is_empty(),
        "no lease within the long-poll: {w}"
    );
    w["leases"][0]["attempt"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spot_notice_requeues_the_work_elsewhere_and_rejects_the_old_attempt() {
    let app = TestApp::spawn().await;
    let dev = app.token("developer", Some("ml")).await;
    let a = app.agent(4).await;
    let id = app.submit(&dev, job_spec("ml")).await.body["id"]
        .as_str()
        .unwrap()
        .to_string();
    let old = lease(&app, &a).await;
    assert_eq!(old["job_id"], id.as_str());
    assert_eq!(
        events(
            &app,
            &a,
            json!([{"type": "started", "attempt": old, "pid": 7}])
        )
        .await,
        ["accepted"]
    );
    assert_eq!(app.job(&dev, &id).await.body["state"], "running");

    // The notice: the attempt comes back in `stop` (SIGTERM now), the node drains, the job
    // is back in the queue with the reason.
    let r = heartbeat(&app, &a, 4, &[&old], Some(notice())).await;
    assert_eq!(r["stop"], json!([old]), "{r}");
    assert_eq!(r["drain"], true);
    let job = app.job(&dev, &id).await.body;
    assert_eq!(job["state"], "queued", "{job}");
    assert_eq!(job["reason"], "spot interruption: requeued");
    assert_eq!(job["attempts"], 1);

    // Nothing goes back to the draining node: once the scheduler has re-planned the job (its
    // explanation is no longer the old assignment), it waits and the node has no lease.
    let path = format!("/api/v1/jobs/{id}/placement");
    let deadline = tokio::time::Instant::now() + WAIT;
    let outcome = loop {
        let r = app.call(Method::GET, &path, Some(&dev), None).await;
        if r.status == StatusCode::OK && r.body["outcome"]["decision"] != "assigned" {
            break r.body["outcome"].clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no re-plan: {}",
            r.body
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    };
    assert_eq!(outcome["decision"], "hold", "{outcome}");
    let w = work(&app, &a, 1).await;
    assert_eq!(w["leases"], json!([]), "{w}");
    assert_eq!(app.job(&dev, &id).await.body["state"], "queued");

    // The old attempt's last words (after its checkpoint) are rejected.
    let late = events(
        &app,
        &a,
        json!([
            {"type": "log", "attempt": old, "seq": 0, "stream": "stdout", "data": "checkpoint saved\n"},
            {"type": "finished", "attempt": old, "exit_code": null, "signal": 15, "error": null, "stopped": true}
        ]),
    )
    .await;
    assert_eq!(late, ["rejected", "rejected"]);
    assert_eq!(app.job(&dev, &id).await.body["state"], "queued");

    // A repeated notice is harmless: the old attempt is still to stop, nothing else changes.
    let r = heartbeat(&app, &a, 4, &[&old], Some(notice())).await;
    assert_eq!(r["stop"], json!([old]), "{r}");

    // Capacity elsewhere: the job is placed there, on its second attempt, and completes.
    let b = app.agent(4).await;
    let placed = app
        .wait_for_job(&dev, &id, WAIT, |j| j["state"] == "placed")
        .await;
    assert_eq!(placed["placement"]["node"], b.node.as_str());
    assert_eq!(placed["attempts"], 2);
    let new = lease(&app, &b).await;
    assert_eq!(new["job_id"], id.as_str());
    assert_ne!(new["attempt_id"], old["attempt_id"]);
    assert_eq!(
        events(
            &app,
            &b,
            json!([
                {"type": "started", "attempt": new, "pid": 8},
                {"type": "finished", "attempt": new, "exit_code": 0, "signal": null, "error": null, "stopped": false}
            ])
        )
        .await,
        ["accepted", "accepted"]
    );
    let done = app.job(&dev, &id).await.body;
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(done["attempts"], 2);

    // The interrupted node's heartbeat without the attempt asks for nothing; it stays drained.
    let r = heartbeat(&app, &a, 4, &[], Some(notice())).await;
    assert_eq!(r["stop"], json!([]));
    assert_eq!(r["drain"], true);
    let nodes = app.app.store.nodes().await.unwrap();
    let drained: Vec<(&str, bool)> = nodes.iter().map(|n| (n.id.as_str(), n.draining)).collect();
    assert!(drained.contains(&(a.node.as_str(), true)), "{drained:?}");
    assert!(drained.contains(&(b.node.as_str(), false)), "{drained:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notice_for_a_cancelled_job_ends_it_and_heartbeats_without_one_change_nothing() {
    let app = TestApp::spawn().await;
    let dev = app.token("developer", Some("ml")).await;
    let a = app.agent(4).await;
    let id = app.submit(&dev, job_spec("ml")).await.body["id"]
        .as_str()
        .unwrap()
        .to_string();
    let attempt = lease(&app, &a).await;
    events(
        &app,
        &a,
        json!([{"type": "started", "attempt": attempt, "pid": 7}]),
    )
    .await;

    // A plain heartbeat is no notice.
    let r = heartbeat(&app, &a, 4, &[&attempt], None).await;
    assert_eq!(
        (r["stop"].clone(), r["drain"].clone()),
        (json!([]), json!(false))
    );
    assert_eq!(app.job(&dev, &id).await.body["state"], "running");

    // Cancelled while running, then interrupted: the job ends cancelled, not requeued.
    let r = app
        .call(
            Method::POST,
            &format!("/api/v1/jobs/{id}/cancel"),
            Some(&dev),
            None,
        )
        .await;
    assert!(r.status.is_success(), "{}", r.body);
    let r = heartbeat(&app, &a, 4, &[&attempt], Some(notice())).await;
    assert_eq!(r["stop"], json!([attempt]), "{r}");
    let job = app.job(&dev, &id).await.body;
    assert_eq!(job["state"], "cancelled", "{job}");
    assert_eq!(job["attempts"], 1);
}

const CLOUD: &str = "aws:test-east/gpu8";

/// A broker with no on-prem nodes and one launchable cloud pool behind the fake provider.
async fn spawn_cloud() -> (TestApp, Arc<FakeProvider>) {
    spawn_with_fake(|c| {
        // Long enough that the drained instance is still there to look at.
        c.idle_ttl_s = 600;
        c.min_billed_s = 0;
        c.regions.push(cloud_region("aws:test-east"));
        c.pools.push(cloud_pool(CLOUD, "aws:test-east", 4.0));
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_burst_instance_drains_and_its_job_gets_a_new_one() {
    let (app, fake) = spawn_cloud().await;
    let dev = app.token("developer", Some("ml")).await;
    let deadline =
        switchyard_broker::clock::to_datetime(app.app.clock.now().plus_secs(3600)).to_rfc3339();
    let id = app
        .submit(
            &dev,
            json!({"name": "burst", "team": "ml", "command": ["true"],
                   "resources": {"gpus": 2, "gpu_models": ["H100"]},
                   "estimated_runtime_s": 600, "deadline": deadline}),
        )
        .await
        .body["id"]
        .as_str()
        .unwrap()
        .to_string();
    let first = eventually("a launch", 20, async || fake.launches().into_iter().next()).await;
    let agent = app.agent_with_token(&first.enrolment_token, 8).await;
    app.wait_for_job(&dev, &id, WAIT, |j| j["state"] == "placed")
        .await;
    let attempt = lease(&app, &agent).await;
    events(
        &app,
        &agent,
        json!([{"type": "started", "attempt": attempt, "pid": 7}]),
    )
    .await;
    let inst = instances(&app).await;
    assert_eq!(inst.len(), 1, "{inst:?}");
    assert_eq!(inst[0]["state"], "ready");

    let r = heartbeat(&app, &agent, 8, &[&attempt], Some(notice())).await;
    assert_eq!(r["stop"], json!([attempt]), "{r}");
    let inst = instances(&app).await;
    let drained = inst
        .iter()
        .find(|i| i["node"] == agent.node.as_str())
        .unwrap();
    assert_eq!(drained["state"], "draining", "{inst:?}");

    // The requeued job cannot go back to the draining node: it gets a new instance.
    eventually("a second launch for the requeued job", 20, async || {
        (fake.launches().len() >= 2).then_some(())
    })
    .await;
    let w = work(&app, &agent, 0).await;
    assert_eq!(w["leases"], json!([]), "{w}");
    let job = app.job(&dev, &id).await.body;
    assert!(
        job["state"] == "provisioning" || job["state"] == "queued",
        "{job}"
    );
}

/// A heartbeat from `agent` running `attempt` as a replica serving on `port`, ready or not.
async fn serving(
    app: &TestApp,
    agent: &TestAgent,
    attempt: &Value,
    port: u16,
    ready: bool,
    notice: Option<Value>,
) -> Value {
    let mut body = json!({"inventory": inventory(4), "running": [attempt],
        "serving": [{"attempt": attempt, "host": "127.0.0.1", "port": port, "ready": ready}]});
    if let Some(n) = notice {
        body["interruption"] = n;
    }
    let r = app
        .call(
            Method::POST,
            "/agent/v1/heartbeat",
            Some(&agent.token),
            Some(body),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    r.body
}

/// A service replica on a node with notice of its end is not stopped at the notice: a
/// replacement starts elsewhere, and only once it is ready does the doomed replica drain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_serves_through_the_notice_until_its_replacement_is_ready() {
    let app = TestApp::spawn().await;
    let a = app.agent(4).await;
    let spec = json!({"name": "chat", "team": "ml", "command": ["serve"],
        "resources": {"gpus": 1}, "replicas": {"min": 1, "max": 1}});
    let r = app
        .call(
            Method::POST,
            "/api/v1/services",
            Some(&app.admin),
            Some(spec),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let service = r.body["id"].as_str().unwrap().to_string();
    let old = lease(&app, &a).await;
    assert_eq!(
        events(
            &app,
            &a,
            json!([{"type": "started", "attempt": old, "pid": 7}])
        )
        .await,
        ["accepted"]
    );
    serving(&app, &a, &old, 41000, true, None).await;

    // The notice: the replica is not in `stop`, the node drains, the replica still runs.
    let r = serving(&app, &a, &old, 41000, true, Some(notice())).await;
    assert_eq!(r["stop"], json!([]), "{r}");
    assert_eq!(r["drain"], true);

    // A replacement is placed on the other node; the old replica keeps serving meanwhile.
    let b = app.agent(4).await;
    let new = lease(&app, &b).await;
    assert_ne!(new["job_id"], old["job_id"]);
    assert_eq!(
        events(
            &app,
            &b,
            json!([{"type": "started", "attempt": new, "pid": 8}])
        )
        .await,
        ["accepted"]
    );
    serving(&app, &b, &new, 41001, false, None).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let r = serving(&app, &a, &old, 41000, true, Some(notice())).await;
    assert_eq!(
        r["stop"],
        json!([]),
        "stopped before its replacement was ready: {r}"
    );
    let path = format!("/api/v1/services/{service}");
    let s = app
        .call(Method::GET, &path, Some(&app.admin), None)
        .await
        .body;
    let states: Vec<&str> = s["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["state"].as_str())
        .collect();
    assert!(states.contains(&"ready"), "{s}");

    // The replacement is ready: the doomed replica drains, with the reason in the events.
    serving(&app, &b, &new, 41001, true, None).await;
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let s = app
            .call(Method::GET, &path, Some(&app.admin), None)
            .await
            .body;
        let draining = s["replicas"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["job_id"] == old["job_id"] && r["state"] == "draining");
        if draining {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the old replica never drained: {s}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let events = app
        .call(
            Method::GET,
            &format!("{path}/events"),
            Some(&app.admin),
            None,
        )
        .await
        .body;
    assert!(
        events.to_string().contains("its node is going away"),
        "{events}"
    );
}

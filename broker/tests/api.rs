//! API tests through the real router: validation and the error shape, auth and team scoping,
//! the job lifecycle driven by a hand-written agent speaking the protocol, and the OpenAPI
//! document.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use std::time::Duration;

/// Every bad submission gets its status, its error code and the field it names, and writes
/// nothing.
#[tokio::test]
async fn bad_submissions_get_a_clear_error_and_store_nothing() {
    let app = TestApp::spawn().await;
    let dev = app.token("developer", Some("ml")).await;
    let base = job_spec("ml");
    let with = |patch: Value| {
        let mut spec = base.clone();
        merge(&mut spec, patch);
        spec
    };
    let cases: Vec<(&str, Value, u16, &str, &str)> = vec![
        (
            "unknown top-level field",
            with(json!({"colour": "red"})),
            400,
            "invalid_field",
            "colour",
        ),
        (
            "unknown nested field",
            with(json!({"resources": {"gpus": 1, "tpus": 2}})),
            400,
            "invalid_field",
            "resources.tpus",
        ),
        (
            "zero gpus",
            with(json!({"resources": {"gpus": 0}})),
            400,
            "invalid_field",
            "resources.gpus",
        ),
        (
            "negative gpus",
            with(json!({"resources": {"gpus": -1}})),
            400,
            "invalid_field",
            "resources.gpus",
        ),
        (
            "gpus as a string",
            with(json!({"resources": {"gpus": "two"}})),
            400,
            "invalid_field",
            "resources.gpus",
        ),
        (
            "more gpus than any node",
            with(json!({"resources": {"gpus": 8}})),
            422,
            "unsatisfiable",
            "resources.gpus",
        ),
        (
            "unknown gpu model",
            with(json!({"resources": {"gpus": 1, "gpu_models": ["Z9000"]}})),
            422,
            "unsatisfiable",
            "resources.gpu_models",
        ),
        (
            "an accelerator that is not one",
            with(json!({"resources": {"gpus": 1, "accelerator": "fpga"}})),
            400,
            "invalid_field",
            "resources.accelerator",
        ),
        (
            "gpu models of another vendor than the accelerator",
            with(json!({"resources": {"gpus": 1, "accelerator": "amd", "gpu_models": ["H100"]}})),
            400,
            "invalid_field",
            "resources.accelerator",
        ),
        (
            "an accelerator no pool has",
            with(json!({"resources": {"gpus": 1, "accelerator": "google"}})),
            422,
            "unsatisfiable",
            "resources.accelerator",
        ),
        (
            "gpu memory nowhere",
            with(json!({"resources": {"gpus": 1, "min_gpu_memory_gb": 200}})),
            422,
            "unsatisfiable",
            "resources",
        ),
        (
            "deadline in the past",
            with(json!({"deadline": "2020-01-01T00:00:00Z"})),
            400,
            "invalid_field",
            "deadline",
        ),
        (
            "deadline not a date",
            with(json!({"deadline": "tomorrow"})),
            400,
            "invalid_field",
            "deadline",
        ),
        (
            "negative runtime",
            with(json!({"estimated_runtime_s": -5})),
            400,
            "invalid_field",
            "estimated_runtime_s",
        ),
        (
            "empty command",
            with(json!({"command": []})),
            400,
            "invalid_field",
            "command",
        ),
        (
            "empty program",
            with(json!({"command": [""]})),
            400,
            "invalid_field",
            "command",
        ),
        (
            "missing command",
            json!({"name": "t", "team": "ml", "resources": {"gpus": 1}}),
            400,
            "invalid_field",
            "",
        ),
        (
            "bad priority",
            with(json!({"priority": "urgent"})),
            400,
            "invalid_field",
            "priority",
        ),
        (
            "negative max price",
            with(json!({"max_price_per_hour": -1.0})),
            400,
            "invalid_field",
            "max_price_per_hour",
        ),
        (
            "unknown region",
            with(json!({"regions": ["aws:mars-1"]})),
            422,
            "unsatisfiable",
            "regions",
        ),
        (
            "malformed region",
            with(json!({"regions": ["nowhere"]})),
            400,
            "invalid_field",
            "regions",
        ),
        (
            "bad env name",
            with(json!({"env": {"1BAD": "x"}})),
            400,
            "invalid_field",
            "env.1BAD",
        ),
        (
            "env overriding the GPUs",
            with(json!({"env": {"CUDA_VISIBLE_DEVICES": "0"}})),
            400,
            "invalid_field",
            "env.CUDA_VISIBLE_DEVICES",
        ),
        (
            "multi-node",
            with(json!({"resources": {"gpus": 1, "nodes": 5}})),
            422,
            "unsatisfiable",
            "resources.nodes",
        ),
        (
            "latency on a batch job",
            with(json!({"max_latency_ms": 50})),
            400,
            "invalid_field",
            "max_latency_ms",
        ),
        (
            "bad team",
            with(json!({"team": "has space"})),
            400,
            "invalid_field",
            "team",
        ),
    ];
    for (what, spec, status, code, field) in cases {
        // A developer naming another team is refused before validation (403); the admin may
        // submit for any team, so the team's own validity is checked with the admin's token.
        let token = if what == "bad team" { &app.admin } else { &dev };
        let r = app.submit(token, spec).await;
        assert_eq!(r.status.as_u16(), status, "{what}: {}", r.body);
        assert_eq!(r.error_code(), code, "{what}: {}", r.body);
        assert_eq!(r.error_field(), field, "{what}: {}", r.body);
        let message = r.body["error"]["message"].as_str().unwrap();
        assert!(!message.is_empty(), "{what}");
        assert!(
            message.contains(field),
            "{what}: the message names the field: {message}"
        );
    }

    let malformed = app
        .raw(
            "/api/v1/jobs",
            &dev,
            "application/json",
            b"{\"name\": ".to_vec(),
        )
        .await;
    assert_eq!(malformed.status, StatusCode::BAD_REQUEST);
    assert_eq!(malformed.error_code(), "malformed_json");

    let not_json = app
        .raw("/api/v1/jobs", &dev, "text/plain", b"hello".to_vec())
        .await;
    assert_eq!(not_json.status, StatusCode::BAD_REQUEST);
    assert_eq!(not_json.error_code(), "unsupported_media_type");

    let mut big = base.clone();
    big["env"] = json!({"BIG": "x".repeat(1024 * 1024 + 10)});
    let too_big = app
        .raw(
            "/api/v1/jobs",
            &dev,
            "application/json",
            serde_json::to_vec(&big).unwrap(),
        )
        .await;
    assert_eq!(
        too_big.status,
        StatusCode::PAYLOAD_TOO_LARGE,
        "{}",
        too_big.body
    );
    assert_eq!(too_big.error_code(), "body_too_large");

    assert_eq!(app.job_count().await, 0, "a refused submission left a row");

    // And a good one is stored.
    let ok = app.submit(&dev, base).await;
    assert_eq!(ok.status, StatusCode::CREATED, "{}", ok.body);
    assert_eq!(app.job_count().await, 1);
}

fn merge(target: &mut Value, patch: Value) {
    if let (Value::Object(t), Value::Object(p)) = (target, patch) {
        for (k, v) in p {
            t.insert(k, v);
        }
    }
}

#[tokio::test]
async fn auth_roles_and_team_scoping() {
    let app = TestApp::spawn().await;
    let ml = app.token("developer", Some("ml")).await;
    let cv = app.token("developer", Some("cv")).await;
    let finance = app.token("finance", None).await;

    // No token, a bad token, a token of the wrong kind: 401 in the error shape.
    for token in [None, Some("sya_nope"), Some("garbage")] {
        let r = app.call(Method::GET, "/api/v1/jobs", token, None).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{token:?}");
        assert_eq!(r.error_code(), "unauthorized");
    }

    let job = app.submit(&ml, job_spec("ml")).await;
    assert_eq!(job.status, StatusCode::CREATED);
    let id = job.body["id"].as_str().unwrap().to_string();
    assert_eq!(job.body["state"], "queued");
    assert_eq!(job.body["team"], "ml");

    // Another team's developer cannot see, read or cancel it: 404, as if it did not exist.
    assert_eq!(app.job(&cv, &id).await.status, StatusCode::NOT_FOUND);
    let r = app
        .call(
            Method::POST,
            &format!("/api/v1/jobs/{id}/cancel"),
            Some(&cv),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let r = app
        .call(
            Method::GET,
            &format!("/api/v1/jobs/{id}/logs"),
            Some(&cv),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let r = app.call(Method::GET, "/api/v1/jobs", Some(&cv), None).await;
    assert_eq!(r.body["jobs"].as_array().unwrap().len(), 0);
    let r = app
        .call(Method::GET, "/api/v1/jobs?team=ml", Some(&cv), None)
        .await;
    assert_eq!(r.body["jobs"].as_array().unwrap().len(), 0);
    // ...and cannot submit for it.
    let r = app.submit(&cv, job_spec("ml")).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(app.job_count().await, 1);

    // The owner and finance can read it; finance cannot submit or cancel; only admins mint tokens.
    assert_eq!(app.job(&ml, &id).await.status, StatusCode::OK);
    assert_eq!(app.job(&finance, &id).await.status, StatusCode::OK);
    assert_eq!(
        app.submit(&finance, job_spec("ml")).await.status,
        StatusCode::FORBIDDEN
    );
    let r = app
        .call(
            Method::POST,
            &format!("/api/v1/jobs/{id}/cancel"),
            Some(&finance),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    let r = app
        .call(
            Method::POST,
            "/api/v1/tokens",
            Some(&ml),
            Some(json!({"role": "admin"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    let r = app
        .call(
            Method::POST,
            "/api/v1/tokens",
            Some(&app.admin),
            Some(json!({"role": "developer"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.error_field(), "team");

    // Cancelling a queued job is immediate; cancelling again is a conflict.
    let r = app
        .call(
            Method::POST,
            &format!("/api/v1/jobs/{id}/cancel"),
            Some(&ml),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.body);
    assert_eq!(r.body["state"], "cancelled");
    let r = app
        .call(
            Method::POST,
            &format!("/api/v1/jobs/{id}/cancel"),
            Some(&ml),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT);

    // Unknown ids and routes are 404 in the same shape.
    let r = app.job(&ml, "not-a-uuid").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(r.error_code(), "not_found");
    let r = app
        .call(Method::GET, "/api/v1/nothing-here", Some(&ml), None)
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn job_lifecycle_over_the_agent_protocol() {
    let app = TestApp::spawn().await;
    let dev = app.token("developer", Some("ml")).await;
    let agent = app.agent(4).await;

    // The pool shows the agent's capacity.
    let pools = app
        .call(Method::GET, "/api/v1/pools", Some(&dev), None)
        .await;
    let pool = pools.body["pools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"] == POOL)
        .unwrap()
        .clone();
    assert_eq!(pool["gpus_total"], 4);
    assert_eq!(pool["gpus_free"], 4);
    assert_eq!(pool["provider"], "onprem");
    assert_eq!(pool["gpu_model"], "H100");
    assert_eq!(pool["price_per_gpu_hour"], 2.0);
    assert!(pool["latency_ms"].is_number());

    let mut spec = job_spec("ml");
    spec["resources"]["gpus"] = json!(2);
    spec["env"] = json!({"MODE": "test"});
    let job = app.submit(&dev, spec).await;
    let id = job.body["id"].as_str().unwrap().to_string();

    // The agent's long-poll delivers the lease.
    let work = poll_work(&app, &agent).await;
    let lease = &work["leases"][0];
    assert_eq!(lease["attempt"]["job_id"], id.as_str());
    assert_eq!(lease["command"], json!(["true"]));
    assert_eq!(lease["env"]["MODE"], "test");
    assert_eq!(lease["gpus"].as_array().unwrap().len(), 2);
    let attempt = lease["attempt"].clone();

    let placed = app.job(&dev, &id).await.body;
    assert_eq!(placed["state"], "placed");
    assert_eq!(placed["placement"]["pool"], POOL);
    assert_eq!(placed["placement"]["node"], agent.node.as_str());
    assert_eq!(placed["placement"]["region"], "onprem:test-dc");

    let explanation = app
        .call(
            Method::GET,
            &format!("/api/v1/jobs/{id}/placement"),
            Some(&dev),
            None,
        )
        .await;
    assert_eq!(explanation.status, StatusCode::OK, "{}", explanation.body);
    assert_eq!(explanation.body["outcome"]["decision"], "assigned");
    assert!(
        !explanation.body["candidates"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    // The plan works its explanations out after the commit and stores the placed job's, for
    // this attempt: the same one the API gave.
    let job_id = switchyard_core::JobId(uuid::Uuid::parse_str(&id).unwrap());
    let stored = eventually("the explanation to be stored", 10, async || {
        let rec = app.app.store.job(job_id).await.unwrap()?;
        rec.explanation_json
    })
    .await;
    let stored: switchyard_core::Explanation = serde_json::from_str(&stored).unwrap();
    assert_eq!(
        stored.candidates.len(),
        explanation.body["candidates"].as_array().unwrap().len()
    );
    assert_eq!(
        stored.candidates[0].pool.as_str(),
        explanation.body["candidates"][0]["pool"]
    );

    // Started, two log chunks (one retried), finished with 0.
    let events = json!({"events": [
        {"type": "started", "attempt": attempt, "pid": 4242},
        {"type": "log", "attempt": attempt, "seq": 0, "stream": "stdout", "data": "hello\n"},
        {"type": "log", "attempt": attempt, "seq": 1, "stream": "stderr", "data": "warn\n"},
        {"type": "log", "attempt": attempt, "seq": 1, "stream": "stderr", "data": "warn\n"},
    ]});
    let r = app
        .call(
            Method::POST,
            "/agent/v1/events",
            Some(&agent.token),
            Some(events),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let statuses: Vec<&str> = r.body["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses, ["accepted", "accepted", "accepted", "duplicate"]);
    assert_eq!(app.job(&dev, &id).await.body["state"], "running");

    let fin = json!({"events": [{"type": "finished", "attempt": attempt, "exit_code": 0, "signal": null, "error": null, "stopped": false}]});
    let r = app
        .call(
            Method::POST,
            "/agent/v1/events",
            Some(&agent.token),
            Some(fin.clone()),
        )
        .await;
    assert_eq!(r.body["results"][0]["status"], "accepted");
    let r = app
        .call(
            Method::POST,
            "/agent/v1/events",
            Some(&agent.token),
            Some(fin),
        )
        .await;
    assert_eq!(
        r.body["results"][0]["status"], "duplicate",
        "a retried report is idempotent"
    );

    let done = app.job(&dev, &id).await.body;
    assert_eq!(done["state"], "succeeded");
    assert_eq!(done["exit_code"], 0);

    let logs = app
        .call(
            Method::GET,
            &format!("/api/v1/jobs/{id}/logs"),
            Some(&dev),
            None,
        )
        .await;
    let entries = logs.body["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 2);
    assert_eq!(entries[0]["text"], "hello\n");
    assert_eq!(entries[0]["stream"], "stdout");
    assert_eq!(entries[1]["stream"], "stderr");
    assert_eq!(logs.body["complete"], true);
    let after = logs.body["next_after"].as_i64().unwrap();
    let rest = app
        .call(
            Method::GET,
            &format!("/api/v1/jobs/{id}/logs?after={after}"),
            Some(&dev),
            None,
        )
        .await;
    assert_eq!(rest.body["entries"].as_array().unwrap().len(), 0);

    // A second job that exits 3 fails with its code.
    let job = app.submit(&dev, job_spec("ml")).await;
    let id3 = job.body["id"].as_str().unwrap().to_string();
    let work = poll_work(&app, &agent).await;
    let attempt = work["leases"][0]["attempt"].clone();
    assert_eq!(attempt["job_id"], id3.as_str());
    let events = json!({"events": [
        {"type": "started", "attempt": attempt, "pid": 1},
        {"type": "finished", "attempt": attempt, "exit_code": 3, "signal": null, "error": null, "stopped": false}
    ]});
    app.call(
        Method::POST,
        "/agent/v1/events",
        Some(&agent.token),
        Some(events),
    )
    .await;
    let failed = app.job(&dev, &id3).await.body;
    assert_eq!(failed["state"], "failed");
    assert_eq!(failed["exit_code"], 3);
    assert_eq!(failed["reason"], "exited with code 3");
}

async fn poll_work(app: &TestApp, agent: &TestAgent) -> Value {
    let r = app
        .call(
            Method::GET,
            "/agent/v1/work?wait_s=10",
            Some(&agent.token),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert!(
        !r.body["leases"].as_array().unwrap().is_empty(),
        "no lease within the long-poll: {}",
        r.body
    );
    r.body
}

#[tokio::test]
async fn agents_cannot_report_for_leases_they_do_not_hold() {
    let app = TestApp::spawn().await;
    let dev = app.token("developer", Some("ml")).await;
    let a = app.agent(4).await;
    let b = app.agent(4).await;

    // Enrolment tokens are one-time; unknown ones are refused.
    let r = app
        .call(
            Method::POST,
            "/agent/v1/register",
            Some(&a.enrol),
            Some(register_body(4)),
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    let r = app
        .call(
            Method::POST,
            "/agent/v1/register",
            Some("sye_unknown"),
            Some(register_body(4)),
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    // Agent calls need the agent's token; API tokens do not work there.
    let r = app
        .call(
            Method::GET,
            "/agent/v1/work?wait_s=0",
            Some(&app.admin),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);

    let job = app.submit(&dev, job_spec("ml")).await;
    let id = job.body["id"].as_str().unwrap().to_string();
    let placed = app
        .wait_for_job(&dev, &id, Duration::from_secs(10), |j| {
            j["state"] == "placed"
        })
        .await;
    let (holder, other) = if placed["placement"]["node"] == a.node.as_str() {
        (&a, &b)
    } else {
        (&b, &a)
    };
    let work = poll_work(&app, holder).await;
    let attempt = work["leases"][0]["attempt"].clone();

    // The other agent's reports for it are rejected and change nothing.
    let fake = json!({"events": [
        {"type": "started", "attempt": attempt, "pid": 1},
        {"type": "log", "attempt": attempt, "seq": 0, "stream": "stdout", "data": "forged"},
        {"type": "finished", "attempt": attempt, "exit_code": 0, "signal": null, "error": null, "stopped": false}
    ]});
    let r = app
        .call(
            Method::POST,
            "/agent/v1/events",
            Some(&other.token),
            Some(fake),
        )
        .await;
    for res in r.body["results"].as_array().unwrap() {
        assert_eq!(res["status"], "rejected", "{}", r.body);
    }
    // A stale epoch from the holder is rejected too.
    let mut stale = attempt.clone();
    stale["epoch"] = json!(attempt["epoch"].as_u64().unwrap() + 7);
    let r = app
        .call(
            Method::POST,
            "/agent/v1/events",
            Some(&holder.token),
            Some(json!({"events": [{"type": "started", "attempt": stale, "pid": 1}]})),
        )
        .await;
    assert_eq!(r.body["results"][0]["status"], "rejected");
    let job = app.job(&dev, &id).await.body;
    assert_eq!(job["state"], "placed");
    let logs = app
        .call(
            Method::GET,
            &format!("/api/v1/jobs/{id}/logs"),
            Some(&dev),
            None,
        )
        .await;
    assert_eq!(logs.body["entries"].as_array().unwrap().len(), 0);

    // The other agent's heartbeat claiming the attempt is told to stop it.
    let hb = json!({"inventory": {"gpus": [], "cpus": 1, "memory_mb": 1, "simulated": true}, "running": [attempt]});
    let r = app
        .call(
            Method::POST,
            "/agent/v1/heartbeat",
            Some(&other.token),
            Some(hb),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.body["stop"][0], attempt);
}

#[tokio::test]
async fn cancelling_a_running_job_tells_its_agent_to_stop() {
    let app = TestApp::spawn().await;
    let dev = app.token("developer", Some("ml")).await;
    let agent = app.agent(4).await;
    let job = app.submit(&dev, job_spec("ml")).await;
    let id = job.body["id"].as_str().unwrap().to_string();
    let work = poll_work(&app, &agent).await;
    let attempt = work["leases"][0]["attempt"].clone();
    app.call(
        Method::POST,
        "/agent/v1/events",
        Some(&agent.token),
        Some(json!({"events": [{"type": "started", "attempt": attempt, "pid": 1}]})),
    )
    .await;

    let r = app
        .call(
            Method::POST,
            &format!("/api/v1/jobs/{id}/cancel"),
            Some(&dev),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED);
    assert_eq!(r.body["state"], "running");
    assert_eq!(r.body["cancel_requested"], true);

    let work = app
        .call(
            Method::GET,
            "/agent/v1/work?wait_s=5",
            Some(&agent.token),
            None,
        )
        .await;
    assert_eq!(work.body["stop"][0], attempt, "{}", work.body);
    app.call(Method::POST, "/agent/v1/events", Some(&agent.token),
             Some(json!({"events": [{"type": "finished", "attempt": attempt, "exit_code": null, "signal": 15, "error": null, "stopped": true}]}))).await;
    let done = app.job(&dev, &id).await.body;
    assert_eq!(done["state"], "cancelled");

    // The GPUs are free again: the next job is placed on the same node.
    let next = app.submit(&dev, job_spec("ml")).await;
    let next_id = next.body["id"].as_str().unwrap().to_string();
    app.wait_for_job(&dev, &next_id, Duration::from_secs(10), |j| {
        j["state"] == "placed"
    })
    .await;
}

#[tokio::test]
async fn lists_page_with_a_cursor() {
    let app = TestApp::spawn().await;
    let dev = app.token("developer", Some("ml")).await;
    let mut ids = Vec::new();
    for i in 0..5 {
        let mut spec = job_spec("ml");
        spec["name"] = json!(format!("job-{i}"));
        ids.push(
            app.submit(&dev, spec).await.body["id"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/api/v1/jobs?limit=2&cursor={c}"),
            None => "/api/v1/jobs?limit=2".to_string(),
        };
        let r = app.call(Method::GET, &path, Some(&dev), None).await;
        assert_eq!(r.status, StatusCode::OK);
        for j in r.body["jobs"].as_array().unwrap() {
            seen.push(j["id"].as_str().unwrap().to_string());
        }
        match r.body["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    ids.reverse();
    assert_eq!(seen, ids, "newest first, each once");
    let r = app
        .call(Method::GET, "/api/v1/jobs?name=job-3", Some(&dev), None)
        .await;
    assert_eq!(r.body["jobs"].as_array().unwrap().len(), 1);
    let r = app
        .call(Method::GET, "/api/v1/jobs?state=bogus", Some(&dev), None)
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.error_field(), "state");
    let r = app
        .call(Method::GET, "/api/v1/jobs?limit=0", Some(&dev), None)
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn lists_filter_by_priority_in_the_store() {
    let app = TestApp::spawn().await;
    let dev = app.token("developer", Some("ml")).await;
    let cv = app.token("developer", Some("cv")).await;
    let mut want: std::collections::BTreeMap<&str, Vec<String>> = Default::default();
    // More low-priority jobs than one page holds, so that a filter applied after the page
    // (as the console once did) would miss the others.
    for (i, prio) in ["low", "high", "low", "normal", "low", "high", "low"]
        .into_iter()
        .enumerate()
    {
        let mut spec = job_spec("ml");
        spec["name"] = json!(format!("job-{i}"));
        spec["priority"] = json!(prio);
        let r = app.submit(&dev, spec).await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
        want.entry(prio)
            .or_default()
            .insert(0, r.body["id"].as_str().unwrap().to_string());
    }
    let mut spec = job_spec("cv");
    spec["priority"] = json!("high");
    assert_eq!(app.submit(&cv, spec).await.status, StatusCode::CREATED);

    let ids = |body: &Value| -> Vec<String> {
        body["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|j| j["id"].as_str().unwrap().to_string())
            .collect()
    };
    for prio in ["low", "high", "normal"] {
        let r = app
            .call(
                Method::GET,
                &format!("/api/v1/jobs?priority={prio}"),
                Some(&dev),
                None,
            )
            .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
        assert_eq!(ids(&r.body), want[prio], "{prio}: {}", r.body);
        assert!(
            r.body["jobs"]
                .as_array()
                .unwrap()
                .iter()
                .all(|j| j["priority"] == prio && j["team"] == "ml"),
            "{}",
            r.body
        );
    }
    // Nothing of a priority no job has.
    let r = app
        .call(
            Method::GET,
            "/api/v1/jobs?priority=critical",
            Some(&dev),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(ids(&r.body).is_empty(), "{}", r.body);
    // The filter pages like the others: two low-priority jobs a page, each once.
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/api/v1/jobs?priority=low&limit=2&cursor={c}"),
            None => "/api/v1/jobs?priority=low&limit=2".to_string(),
        };
        let r = app.call(Method::GET, &path, Some(&dev), None).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
        seen.extend(ids(&r.body));
        match r.body["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    assert_eq!(seen, want["low"]);
    // With the team and state filters: an admin asks for high-priority queued jobs of cv.
    let r = app
        .call(
            Method::GET,
            "/api/v1/jobs?priority=high&team=cv&state=queued",
            Some(&app.admin),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let jobs = r.body["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 1, "{}", r.body);
    assert_eq!(jobs[0]["team"], "cv");
    let r = app
        .call(
            Method::GET,
            "/api/v1/jobs?priority=high",
            Some(&app.admin),
            None,
        )
        .await;
    assert_eq!(ids(&r.body).len(), 3, "{}", r.body);
    // An unknown priority is refused, naming the parameter.
    for bad in ["urgent", "HIGH", ""] {
        let r = app
            .call(
                Method::GET,
                &format!("/api/v1/jobs?priority={bad}"),
                Some(&dev),
                None,
            )
            .await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{bad:?}: {}", r.body);
        assert_eq!(r.error_field(), "priority", "{bad:?}");
    }
    // The parameter is in the API's description.
    let doc = app.call(Method::GET, "/openapi.json", None, None).await;
    let params = doc.body["paths"]["/jobs"]["get"]["parameters"]
        .as_array()
        .unwrap();
    assert!(
        params
            .iter()
            .any(|p| p["name"] == "priority" && p["in"] == "query"),
        "{params:?}"
    );
}

/// The served document is what generated clients are built from (scripts/openapi-check.sh
/// validates it with openapi-spec-validator and drives a broker with a client generated from
/// it): every operation has an `operationId` of its own, every response a description, and
/// every operation documents the errors every route can meet.
#[tokio::test]
async fn openapi_operation_ids_are_unique_and_every_response_is_described() {
    let app = TestApp::spawn().await;
    let doc = app.call(Method::GET, "/openapi.json", None, None).await;
    assert_eq!(doc.status, StatusCode::OK);
    assert_eq!(doc.body["openapi"].as_str().map(|v| &v[..4]), Some("3.1."));
    let paths = doc.body["paths"].as_object().expect("paths is an object");
    let mut ids: std::collections::BTreeMap<String, String> = Default::default();
    let mut operations = 0;
    for (path, item) in paths {
        let item = item.as_object().expect("a path item is an object");
        for (method, op) in item {
            if ![
                "get", "put", "post", "delete", "patch", "head", "options", "trace",
            ]
            .contains(&method.as_str())
            {
                continue;
            }
            operations += 1;
            let here = format!("{} {path}", method.to_uppercase());
            let id = op["operationId"].as_str().unwrap_or_default();
            assert!(
                !id.is_empty()
                    && id
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
                "{here}: operationId {id:?}"
            );
            if let Some(other) = ids.insert(id.to_string(), here.clone()) {
                panic!("operationId {id:?} is used by both {other} and {here}");
            }
            let responses = op["responses"].as_object().expect("responses");
            for (status, response) in responses {
                let described = response["description"]
                    .as_str()
                    .is_some_and(|d| !d.trim().is_empty());
                assert!(described, "{here} {status} has no description: {response}");
            }
            for status in ["500"]
                .into_iter()
                .chain(
                    op.get("security")
                        .map(|_| ["401", "429"])
                        .into_iter()
                        .flatten(),
                )
                .chain(
                    op.get("requestBody")
                        .map(|_| ["400", "408", "413"])
                        .into_iter()
                        .flatten(),
                )
            {
                assert!(
                    responses.contains_key(status),
                    "{here} does not document {status}"
                );
            }
        }
    }
    assert!(operations >= 20, "only {operations} operations");
    // The ids a generated client calls the job functions by.
    for (id, op) in [
        ("submit_job", "POST /jobs"),
        ("list_jobs", "GET /jobs"),
        ("get_job", "GET /jobs/{id}"),
        ("cancel_job", "POST /jobs/{id}/cancel"),
    ] {
        assert_eq!(ids.get(id).map(String::as_str), Some(op), "{id}");
    }
}

#[tokio::test]
async fn openapi_health_and_regions() {
    let app = TestApp::spawn().await;
    let doc = app.call(Method::GET, "/openapi.json", None, None).await;
    assert_eq!(doc.status, StatusCode::OK);
    for path in [
        "/jobs",
        "/jobs/{id}",
        "/jobs/{id}/cancel",
        "/jobs/{id}/logs",
        "/jobs/{id}/placement",
        "/pools",
        "/regions",
        "/tokens",
    ] {
        assert!(doc.body["paths"][path].is_object(), "openapi lacks {path}");
    }
    assert!(doc.body["components"]["schemas"]["JobSpec"].is_object());
    assert!(doc.body["components"]["securitySchemes"]["bearer"].is_object());

    assert_eq!(
        app.call(Method::GET, "/healthz", None, None).await.body["status"],
        "ok"
    );
    assert_eq!(
        app.call(Method::GET, "/readyz", None, None).await.body["status"],
        "ready"
    );

    let regions = app
        .call(Method::GET, "/api/v1/regions", Some(&app.admin), None)
        .await;
    let r = &regions.body["regions"][0];
    assert_eq!(r["id"], "onprem:test-dc");
    assert_eq!(r["provider"], "onprem");
    assert_eq!(r["pools"], 1);
    // Nothing launches on-prem machines: no provider, no credentials to check.
    assert_eq!(r["backing"], "none");
    assert_eq!(r["launched_by"], Value::Null);
    assert_eq!(r["credentials"], Value::Null);
}

/// Each region says which provider launches its machines, and whether its credentials
/// worked when the broker started.
#[tokio::test]
async fn regions_name_the_provider_behind_them_and_its_credentials() {
    let (app, _fake) = spawn_with_fake_checked(
        switchyard_broker::clock::Clock::system(),
        Err("not authorised: key revoked".into()),
        |c| {
            c.regions.push(cloud_region("aws:test-east"));
            c.pools.push(cloud_pool(CHEAP, "aws:test-east", 4.0));
        },
    )
    .await;
    let regions = app
        .call(Method::GET, "/api/v1/regions", Some(&app.admin), None)
        .await;
    assert_eq!(regions.status, StatusCode::OK);
    let by_id = |id: &str| {
        regions.body["regions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["id"] == id)
            .cloned()
            .unwrap_or_else(|| panic!("{id} missing: {}", regions.body))
    };
    let east = by_id("aws:test-east");
    assert_eq!(east["launched_by"], "fake");
    assert_eq!(east["backing"], "real");
    assert_eq!(east["credentials"], "not authorised: key revoked");
}

/// The served `/openapi.json`, as a snapshot: any change to the contract (a route, a field, a
/// description, an error) shows as a diff to review (`cargo insta review`), never silently.
#[tokio::test]
async fn the_openapi_document_is_the_snapshot() {
    let app = TestApp::spawn().await;
    let doc = app.call(Method::GET, "/openapi.json", None, None).await;
    assert_eq!(doc.status, StatusCode::OK);
    let mut body = doc.body;
    // The crate version is the only field a release changes without changing the contract.
    body["info"]["version"] = "(version)".into();
    insta::assert_json_snapshot!("openapi", body);
}

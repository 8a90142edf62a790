//! Multi-node jobs over the agent protocol: a gang is placed on as many nodes as it asks for,
//! all or none; each rank's lease tells it its place (`SWITCHYARD_NODE_RANK`, `MASTER_ADDR`…);
//! the job succeeds when every rank exited 0, fails with the first rank that fails (the others
//! are stopped), and goes back to the queue whole when one rank's node is taken away. The tests
//! play the agents by hand; `tests/tests/gang_up.rs` runs real ranks on `up`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use switchyard_core::PoolId;
use switchyard_providers::fake::FakeOutcome;

/// A hand-driven agent with 4 GPUs that says other nodes reach it at `address`.
async fn agent_at(app: &TestApp, address: &str) -> TestAgent {
    let enrol = app.enrolment_token().await;
    let mut body = register_body(4);
    body["address"] = json!(address);
    let r = app
        .call(Method::POST, "/agent/v1/register", Some(&enrol), Some(body))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    TestAgent {
        token: r.body["agent_token"].as_str().unwrap().to_string(),
        node: r.body["node_id"].as_str().unwrap().to_string(),
        enrol,
    }
}

fn gang_spec(nodes: u32) -> Value {
    json!({"name": "ddp", "team": "ml", "command": ["torchrun", "train.py"],
           "env": {"EPOCHS": "3"}, "resources": {"gpus": 4, "nodes": nodes}})
}

/// The one lease `agent` gets within the long-poll.
async fn lease(app: &TestApp, agent: &TestAgent) -> Value {
    let w = work(app, agent, 5).await;
    let leases = w["leases"].as_array().unwrap();
    assert_eq!(leases.len(), 1, "{w}");
    leases[0].clone()
}

fn env(lease: &Value) -> BTreeMap<String, String> {
    serde_json::from_value(lease["env"].clone()).unwrap()
}

/// The leases of a two-node gang placed on `a` and `b`, by rank, each with its agent.
async fn placed<'a>(
    app: &TestApp,
    a: &'a TestAgent,
    b: &'a TestAgent,
) -> [(Value, &'a TestAgent); 2] {
    let (la, lb) = (lease(app, a).await, lease(app, b).await);
    match env(&la)["SWITCHYARD_NODE_RANK"].as_str() {
        "0" => [(la, a), (lb, b)],
        _ => [(lb, b), (la, a)],
    }
}

/// A broker with two hand-driven agents, at 10.0.0.11 and 10.0.0.12, and a developer of team
/// ml who submitted `spec`.
struct TwoNodes {
    app: TestApp,
    dev: String,
    a: TestAgent,
    b: TestAgent,
    id: String,
}

async fn two_nodes(spec: Value) -> TwoNodes {
    let app = TestApp::spawn().await;
    let dev = app.token("developer", Some("ml")).await;
    let a = agent_at(&app, "10.0.0.11").await;
    let b = agent_at(&app, "10.0.0.12").await;
    let id = app.submit(&dev, spec).await.body["id"]
        .as_str()
        .unwrap()
        .to_string();
    TwoNodes { app, dev, a, b, id }
}

async fn start(app: &TestApp, agent: &TestAgent, attempt: &Value) {
    let r = events(
        app,
        agent,
        json!([{"type": "started", "attempt": attempt, "pid": 7}]),
    )
    .await;
    assert_eq!(r, ["accepted"]);
}

async fn finish(
    app: &TestApp,
    agent: &TestAgent,
    attempt: &Value,
    code: Option<i32>,
) -> Vec<String> {
    let signal = if code.is_none() {
        json!(15)
    } else {
        json!(null)
    };
    events(
        app,
        agent,
        json!([{"type": "finished", "attempt": attempt, "exit_code": code, "signal": signal,
                "error": null, "stopped": code.is_none()}]),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rank_is_told_its_place_and_the_job_succeeds_with_its_last_rank() {
    let TwoNodes { app, dev, a, b, id } = two_nodes(gang_spec(2)).await;
    let [(r0, ag0), (r1, ag1)] = placed(&app, &a, &b).await;
    let (e0, e1) = (env(&r0), env(&r1));
    let address = |agent: &TestAgent| {
        if agent.node == a.node {
            "10.0.0.11"
        } else {
            "10.0.0.12"
        }
    };
    let (addr0, addr1) = (address(ag0), address(ag1));
    for (rank, e) in [(0, &e0), (1, &e1)] {
        assert_eq!(e["SWITCHYARD_NODE_RANK"], rank.to_string());
        assert_eq!(e["NODE_RANK"], rank.to_string());
        assert_eq!(e["SWITCHYARD_NUM_NODES"], "2");
        assert_eq!(e["SWITCHYARD_GPUS_PER_NODE"], "4");
        assert_eq!(e["SWITCHYARD_NODE_IPS"], format!("{addr0}\n{addr1}"));
        assert_eq!(e["MASTER_ADDR"], addr0);
        assert_eq!(e["WORLD_SIZE"], "8");
        assert_eq!(e["EPOCHS"], "3", "the job's own variables stay");
    }
    assert_eq!(e0["MASTER_PORT"], e1["MASTER_PORT"]);
    assert_eq!(e0["MASTER_PORT"], "29500");
    assert_eq!(r0["gpus"], json!([0, 1, 2, 3]));
    assert_ne!(r0["attempt"]["attempt_id"], r1["attempt"]["attempt_id"]);
    let job = app.job(&dev, &id).await.body;
    assert_eq!(job["state"], "placed", "{job}");
    assert_eq!(job["attempts"], 2, "one attempt per rank");
    // Why it went there: the round that placed the gang, kept with rank 0 (an earlier round
    // may have seen one node only, and said wait).
    let path = format!("/api/v1/jobs/{id}/placement");
    let outcome = eventually("the gang's explanation", 10, async || {
        let r = app.call(Method::GET, &path, Some(&dev), None).await;
        (r.status == StatusCode::OK && r.body["outcome"]["decision"] == "assigned")
            .then(|| r.body["outcome"].clone())
    })
    .await;
    assert_eq!(outcome["pool"], "onprem:test-dc/h100x4", "{outcome}");

    start(&app, ag1, &r1["attempt"]).await;
    assert_eq!(app.job(&dev, &id).await.body["state"], "running");
    start(&app, ag0, &r0["attempt"]).await;
    // Rank 0 done first: the job runs on until rank 1 exits too.
    assert_eq!(
        finish(&app, ag0, &r0["attempt"], Some(0)).await,
        ["accepted"]
    );
    let job = app.job(&dev, &id).await.body;
    assert_eq!(job["state"], "running", "{job}");
    assert_eq!(job["reason"], "rank 0 exited 0; waiting for 1 other rank");
    assert_eq!(
        finish(&app, ag1, &r1["attempt"], Some(0)).await,
        ["accepted"]
    );
    let job = app.job(&dev, &id).await.body;
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(job["reason"], "every rank exited 0");
    // The job shows every rank: its node, GPUs, state and exit code.
    let ranks = job["placement"]["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 2, "{job}");
    for (k, (r, agent)) in ranks.iter().zip([ag0, ag1]).enumerate() {
        assert_eq!(r["rank"], k, "{job}");
        assert_eq!(r["node"], agent.node.as_str(), "{job}");
        assert_eq!(r["gpus"], json!([0, 1, 2, 3]), "{job}");
        assert_eq!(r["state"], "finished", "{job}");
        assert_eq!(r["exit_code"], 0, "{job}");
    }
    assert_eq!(job["placement"]["node"], ag0.node.as_str());

    // A second gang takes another rendezvous port only while the first one lives: now the
    // first is over, so it gets the same one.
    app.submit(&dev, gang_spec(2)).await;
    let [(s0, _), _] = placed(&app, &a, &b).await;
    assert_eq!(env(&s0)["MASTER_PORT"], "29500");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_rank_fails_the_job_and_stops_the_other_ranks() {
    let TwoNodes { app, dev, a, b, id } = two_nodes(gang_spec(2)).await;
    let [(r0, ag0), (r1, ag1)] = placed(&app, &a, &b).await;
    start(&app, ag0, &r0["attempt"]).await;
    start(&app, ag1, &r1["attempt"]).await;

    assert_eq!(
        finish(&app, ag1, &r1["attempt"], Some(3)).await,
        ["accepted"]
    );
    let job = app.job(&dev, &id).await.body;
    assert_eq!(job["state"], "failed", "{job}");
    assert_eq!(job["exit_code"], 3);
    let reason = job["reason"].as_str().unwrap();
    assert!(
        reason.starts_with(&format!("rank 1 on {}: ", ag1.node))
            && reason.ends_with("; the other ranks were stopped"),
        "{reason}"
    );
    // Rank 0 is told to stop (checkpoint signal, grace); its end changes nothing more.
    let w = work(&app, ag0, 5).await;
    assert_eq!(w["stop"], json!([r0["attempt"]]), "{w}");
    assert_eq!(finish(&app, ag0, &r0["attempt"], None).await, ["accepted"]);
    let job = app.job(&dev, &id).await.body;
    assert_eq!(job["state"], "failed", "{job}");
    assert_eq!(job["exit_code"], 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rank_taken_away_sends_the_whole_gang_back_to_the_queue() {
    let TwoNodes { app, dev, a, b, id } = two_nodes(gang_spec(2)).await;
    let [(r0, ag0), (r1, ag1)] = placed(&app, &a, &b).await;
    start(&app, ag0, &r0["attempt"]).await;
    start(&app, ag1, &r1["attempt"]).await;

    // Rank 1's node gets a spot notice: the job is back in the queue, rank 0 is stopped.
    let body = json!({"inventory": register_body(4)["inventory"], "running": [r1["attempt"]],
                      "interruption": {"action": "terminate", "at": "2026-12-02T12:00:00Z"}});
    let r = app
        .call(
            Method::POST,
            "/agent/v1/heartbeat",
            Some(&ag1.token),
            Some(body),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let job = app.job(&dev, &id).await.body;
    assert_eq!(job["state"], "queued", "{job}");
    let w = work(&app, ag0, 5).await;
    assert_eq!(w["stop"], json!([r0["attempt"]]), "{w}");
    assert_eq!(finish(&app, ag0, &r0["attempt"], None).await, ["accepted"]);

    // A third node joins: the gang is placed again, whole, away from the draining node.
    let c = agent_at(&app, "10.0.0.13").await;
    let la = lease(&app, ag0).await;
    let lc = lease(&app, &c).await;
    let ranks: Vec<String> = [&la, &lc]
        .iter()
        .map(|l| env(l)["SWITCHYARD_NODE_RANK"].clone())
        .collect();
    assert!(
        ranks.contains(&"0".into()) && ranks.contains(&"1".into()),
        "{ranks:?}"
    );
    let job = app.job(&dev, &id).await.body;
    assert_eq!(job["state"], "placed", "{job}");
    assert_eq!(job["attempts"], 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gang_not_started_is_cancelled_on_every_node_and_a_too_large_one_is_refused() {
    let TwoNodes { app, dev, a, b, id } = two_nodes(gang_spec(2)).await;
    let [(r0, ag0), (r1, ag1)] = placed(&app, &a, &b).await;
    start(&app, ag0, &r0["attempt"]).await;
    // Rank 0 runs, rank 1 has not started: the cancel withdraws rank 1 and stops rank 0.
    let r = app
        .call(
            Method::POST,
            &format!("/api/v1/jobs/{id}/cancel"),
            Some(&dev),
            None,
        )
        .await;
    assert!(r.status.is_success(), "{}", r.body);
    let w = work(&app, ag0, 5).await;
    assert_eq!(w["stop"], json!([r0["attempt"]]), "{w}");
    let late = events(
        &app,
        ag1,
        json!([{"type": "started", "attempt": r1["attempt"], "pid": 8}]),
    )
    .await;
    assert_eq!(late, ["rejected"], "rank 1's lease was withdrawn");
    assert_eq!(finish(&app, ag0, &r0["attempt"], None).await, ["accepted"]);
    let job = app.job(&dev, &id).await.body;
    assert_eq!(job["state"], "cancelled", "{job}");

    // The test pool holds at most 4 nodes.
    let r = app.submit(&dev, gang_spec(5)).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.body);
    assert_eq!(r.body["error"]["field"], "resources.nodes", "{}", r.body);
    let r = app.submit(&dev, gang_spec(1000)).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
    assert_eq!(r.body["error"]["field"], "resources.nodes", "{}", r.body);
    let mut spec = gang_spec(2);
    spec["env"] = json!({"MASTER_PORT": "1234"});
    let r = app.submit(&dev, spec).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
    assert_eq!(r.body["error"]["field"], "env.MASTER_PORT", "{}", r.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gang_that_must_burst_launches_all_its_nodes_together_and_runs_once_all_enrolled() {
    let (app, fake) = spawn_two_clouds(|_| {}).await;
    let dev = app.token("developer", Some("ml")).await;
    let mut spec = urgent("ddp");
    spec["resources"]["nodes"] = json!(2);
    let id = app.submit(&dev, spec).await.body["id"]
        .as_str()
        .unwrap()
        .to_string();
    // Two instances for the job (the test clouds allow two per pool), in one pool, in one
    // round.
    let launches = eventually("the gang's launches", 20, async || {
        let l = fake.launches();
        (l.len() >= 2).then_some(l)
    })
    .await;
    assert_eq!(launches.len(), 2, "{launches:?}");
    assert!(
        launches.iter().all(|l| l.pool == launches[0].pool),
        "{launches:?}"
    );
    assert_eq!(app.job(&dev, &id).await.body["state"], "provisioning");

    // One enrols: a gang of two does not start on one.
    let mut agents = vec![app.agent_with_token(&launches[0].enrolment_token, 8).await];
    let w = work(&app, &agents[0], 1).await;
    assert_eq!(w["leases"], json!([]), "{w}");
    assert_eq!(app.job(&dev, &id).await.body["state"], "provisioning");
    // The second enrols: every rank gets its lease, one per instance.
    agents.push(app.agent_with_token(&launches[1].enrolment_token, 8).await);
    let mut ranks = Vec::new();
    for a in &agents {
        let l = lease(&app, a).await;
        ranks.push(env(&l)["SWITCHYARD_NODE_RANK"].clone());
        assert_eq!(env(&l)["SWITCHYARD_NUM_NODES"], "2");
    }
    ranks.sort();
    assert_eq!(ranks, ["0", "1"]);
    assert_eq!(fake.launches().len(), 2, "nothing more was launched");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gang_whose_launch_gives_up_does_not_retry_the_rest_there_and_is_planned_again_whole() {
    let (app, fake) = spawn_two_clouds(|_| {}).await;
    // The gang's two launches in the cheap pool go out together: one is throttled (to be
    // retried), the other meets a capacity error (given up).
    fake.script(
        &PoolId(CHEAP.into()),
        [FakeOutcome::Throttled, FakeOutcome::Capacity],
    );
    let dev = app.token("developer", Some("ml")).await;
    let mut spec = urgent("ddp");
    spec["resources"]["nodes"] = json!(2);
    let id = app.submit(&dev, spec).await.body["id"]
        .as_str()
        .unwrap()
        .to_string();
    // The gang is planned again, whole, in the other region.
    let dear = eventually("two launches in the other region", 20, async || {
        let l: Vec<_> = fake
            .launches()
            .into_iter()
            .filter(|l| l.pool.as_str() == DEAR)
            .collect();
        (l.len() >= 2).then_some(l)
    })
    .await;
    assert_eq!(dear.len(), 2, "{dear:?}");
    // The throttled one was not tried again in the cheap pool.
    let cheap = fake
        .launches()
        .into_iter()
        .filter(|l| l.pool.as_str() == CHEAP)
        .count();
    assert_eq!(cheap, 2, "{:?}", fake.launches());
    let r = app
        .call(Method::GET, "/api/v1/instances", Some(&app.admin), None)
        .await;
    let cheap: Vec<&Value> = r.body["instances"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["pool"] == CHEAP)
        .collect();
    assert_eq!(cheap.len(), 2, "{}", r.body);
    assert!(
        cheap.iter().all(|i| i["state"] == "terminated"),
        "{}",
        r.body
    );
    assert!(
        cheap.iter().any(|i| i["last_error"]
            .as_str()
            .is_some_and(|e| e.starts_with("not launched: its gang's launch"))),
        "{}",
        r.body
    );
    assert_eq!(app.job(&dev, &id).await.body["state"], "provisioning");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_urgent_job_that_preempts_one_rank_stops_the_whole_gang() {
    // A low-priority gang fills both nodes for ten hours.
    let mut low = gang_spec(2);
    low["priority"] = json!("low");
    low["estimated_runtime_s"] = json!(36_000);
    let TwoNodes {
        app,
        dev,
        a,
        b,
        id: low_id,
    } = two_nodes(low).await;
    let [(r0, ag0), (r1, ag1)] = placed(&app, &a, &b).await;
    start(&app, ag0, &r0["attempt"]).await;
    start(&app, ag1, &r1["attempt"]).await;

    // A critical one-node job due in 20 minutes takes one node: both ranks are told to stop.
    let at = chrono::Utc::now() + chrono::Duration::seconds(1200);
    let urgent = json!({"name": "urgent", "team": "ml", "command": ["true"], "priority": "critical",
                        "resources": {"gpus": 4}, "estimated_runtime_s": 300, "deadline": at.to_rfc3339()});
    let urgent_id = app.submit(&dev, urgent).await.body["id"]
        .as_str()
        .unwrap()
        .to_string();
    for (agent, attempt) in [(ag0, &r0["attempt"]), (ag1, &r1["attempt"])] {
        let stop = eventually("the rank's stop", 10, async || {
            let w = work(&app, agent, 1).await;
            (!w["stop"].as_array().unwrap().is_empty()).then_some(w)
        })
        .await;
        assert_eq!(stop["stop"], json!([attempt]), "{stop}");
    }
    // Both stop; the gang goes back to the queue, and the urgent job runs.
    assert_eq!(finish(&app, ag0, &r0["attempt"], None).await, ["accepted"]);
    assert_eq!(finish(&app, ag1, &r1["attempt"], None).await, ["accepted"]);
    let low = app.job(&dev, &low_id).await.body;
    assert_eq!(low["state"], "queued", "{low}");
    assert!(
        low["reason"]
            .as_str()
            .is_some_and(|r| r.starts_with(&format!("preempted by job {urgent_id}"))),
        "{low}"
    );
    let u = app
        .wait_for_job(&dev, &urgent_id, std::time::Duration::from_secs(10), |j| {
            j["state"] == "placed"
        })
        .await;
    assert_eq!(u["state"], "placed", "{u}");
}

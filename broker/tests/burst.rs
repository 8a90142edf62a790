//! The burst controller against the scripted fake provider: failover on capacity errors,
//! retries on throttling without double launches, boot timeouts, idle termination with the
//! cost in the ledger, vanished instances, and the orphan reaper. The test plays each launched
//! instance's agent with the enrolment token the provider was given.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use reqwest::Method;
use serde_json::json;
use std::time::Duration;
use switchyard_core::{Market, PoolId};
use switchyard_providers::fake::FakeOutcome;
use switchyard_providers::{InstanceState, Provider};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capacity_error_fails_over_to_the_next_region_and_the_job_runs_there() {
    let (app, fake) = spawn_two_clouds_on(manual_clock(), |_| {}).await;
    fake.script(&PoolId(CHEAP.into()), [FakeOutcome::Capacity]);
    let dev = app.token("developer", Some("ml")).await;
    let id = app.submit(&dev, urgent("failover")).await.body["id"]
        .as_str()
        .unwrap()
        .to_string();

    // The cheap pool refuses; the dearer region gets the launch.
    let launched = eventually("a launch in the second region", 20, async || {
        fake.launches()
            .into_iter()
            .find(|l| l.pool.as_str() == DEAR)
    })
    .await;
    let launches = fake.launches();
    assert_eq!(
        launches.iter().filter(|l| l.pool.as_str() == CHEAP).count(),
        1,
        "{launches:?}"
    );
    assert_eq!(
        launches.iter().filter(|l| l.pool.as_str() == DEAR).count(),
        1,
        "{launches:?}"
    );
    let all = instances(&app).await;
    let failed = all.iter().find(|i| i["pool"] == CHEAP).unwrap();
    assert_eq!(failed["state"], "terminated");
    assert!(
        failed["last_error"]
            .as_str()
            .unwrap()
            .contains("InsufficientInstanceCapacity")
    );
    assert_eq!(app.job(&dev, &id).await.body["state"], "provisioning");

    // The instance's agent enrols with the token it was given; the job is placed on it.
    let agent = app.agent_with_token(&launched.enrolment_token, 8).await;
    let job = app
        .wait_for_job(&dev, &id, Duration::from_secs(10), |j| {
            j["state"] == "placed"
        })
        .await;
    assert_eq!(job["placement"]["node"], agent.node.as_str());
    assert_eq!(job["placement"]["pool"], DEAR);
    // Its explanation keeps the round that decided to burst, not only the one that placed it
    // on the new node: the launch, with the candidates it was weighed against.
    let explained = eventually("the launch round in the explanation", 10, async || {
        let r = app
            .call(
                Method::GET,
                &format!("/api/v1/jobs/{id}/placement"),
                Some(&dev),
                None,
            )
            .await;
        (r.status == reqwest::StatusCode::OK && r.body["launch_round"].is_object())
            .then_some(r.body)
    })
    .await;
    assert_eq!(explained["outcome"]["decision"], "assigned", "{explained}");
    let launch = &explained["launch_round"];
    assert_eq!(launch["outcome"]["decision"], "launch", "{explained}");
    assert_eq!(launch["outcome"]["pool"], DEAR, "{explained}");
    let kinds: Vec<&str> = launch["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds.first(), Some(&"launch"), "{explained}");
    // Times are dates, not epoch milliseconds.
    assert!(
        launch["planned_at"].as_str().unwrap().starts_with("20"),
        "{explained}"
    );
    let inst = instances(&app)
        .await
        .into_iter()
        .find(|i| i["pool"] == DEAR)
        .unwrap();
    assert_eq!(inst["state"], "ready");
    assert_eq!(inst["node"], agent.node.as_str());

    // It runs and finishes; the idle instance is terminated and its cost is in the ledger.
    let work = app
        .call(
            Method::GET,
            "/agent/v1/work?wait_s=5",
            Some(&agent.token),
            None,
        )
        .await;
    let attempt = work.body["leases"][0]["attempt"].clone();
    app.call(Method::POST, "/agent/v1/events", Some(&agent.token), Some(json!({"events": [
        {"type": "started", "attempt": attempt, "pid": 1},
        {"type": "finished", "attempt": attempt, "exit_code": 0, "signal": null, "error": null, "stopped": false}
    ]}))).await;
    // Past the idle TTL (1 s) once the controller has seen it idle.
    seen_idle(&app).await;
    app.advance(Duration::from_secs(2));
    eventually("the idle instance to be terminated", 20, async || {
        let i = instances(&app)
            .await
            .into_iter()
            .find(|i| i["pool"] == DEAR)?;
        (i["state"] == "terminated").then_some(())
    })
    .await;
    assert!(
        fake.running().is_empty(),
        "nothing left running at the provider"
    );
    let ledger = app.app.store.ledger_total().await.unwrap();
    assert!(ledger > 0, "the instance's lifetime is in the ledger");
    let inst = instances(&app)
        .await
        .into_iter()
        .find(|i| i["pool"] == DEAR)
        .unwrap();
    assert_eq!(
        (inst["cost_usd"].as_f64().unwrap() * 1e6).round() as i64,
        ledger
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttling_is_retried_with_the_same_key_and_launches_once() {
    let (app, fake) = spawn_two_clouds(|_| {}).await;
    fake.script(
        &PoolId(CHEAP.into()),
        [FakeOutcome::Throttled, FakeOutcome::Transient],
    );
    let dev = app.token("developer", Some("ml")).await;
    app.submit(&dev, urgent("throttled")).await;
    eventually("a booting instance", 30, async || {
        instances(&app)
            .await
            .into_iter()
            .find(|i| i["state"] == "booting")
    })
    .await;
    let launches = fake.launches();
    assert_eq!(launches.len(), 3, "two failures then success: {launches:?}");
    assert!(
        launches
            .iter()
            .all(|l| l.instance_key == launches[0].instance_key),
        "one need, one key"
    );
    assert_eq!(fake.running().len(), 1, "exactly one machine");
    assert_eq!(instances(&app).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_that_never_enrols_is_terminated_and_the_job_replanned() {
    let (app, fake) = spawn_two_clouds_on(manual_clock(), |c| c.boot_timeout_s = 1).await;
    let dev = app.token("developer", Some("ml")).await;
    let id = app.submit(&dev, urgent("slow-boot")).await.body["id"]
        .as_str()
        .unwrap()
        .to_string();
    let first = eventually("a first launch", 20, async || {
        fake.launches().first().cloned()
    })
    .await;
    // Nobody enrols it: after the boot timeout (1 s from its launch) it is terminated and a new
    // instance requested.
    eventually("the instance to be booting", 20, async || {
        let all = instances(&app).await;
        let first = all
            .iter()
            .find(|i| i["id"] == first.instance_key.as_str())?;
        (first["state"] == "booting").then_some(())
    })
    .await;
    app.advance(Duration::from_secs(2));
    let second = eventually("a second launch", 20, async || {
        fake.launches()
            .into_iter()
            .find(|l| l.instance_key != first.instance_key)
    })
    .await;
    let all = instances(&app).await;
    let timed_out = all
        .iter()
        .find(|i| i["id"] == first.instance_key.as_str())
        .unwrap();
    assert_eq!(timed_out["state"], "terminated");
    assert!(
        timed_out["last_error"]
            .as_str()
            .unwrap()
            .contains("boot timeout")
    );
    assert!(
        !fake
            .running()
            .iter()
            .any(|i| i.instance_key == first.instance_key)
    );
    // The second one enrols and gets the job.
    let agent = app.agent_with_token(&second.enrolment_token, 8).await;
    let job = app
        .wait_for_job(&dev, &id, Duration::from_secs(10), |j| {
            j["state"] == "placed"
        })
        .await;
    assert_eq!(job["placement"]["node"], agent.node.as_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vanished_instance_requeues_its_job_and_strays_are_reaped() {
    let (app, fake) = spawn_two_clouds(|c| c.idle_ttl_s = 600).await;
    let stray = fake.add_stray(&PoolId(CHEAP.into()), "not-from-this-broker");
    let dev = app.token("developer", Some("ml")).await;
    let id = app.submit(&dev, urgent("vanish")).await.body["id"]
        .as_str()
        .unwrap()
        .to_string();
    let launch = eventually("a launch", 20, async || fake.launches().first().cloned()).await;
    let agent = app.agent_with_token(&launch.enrolment_token, 8).await;
    app.wait_for_job(&dev, &id, Duration::from_secs(10), |j| {
        j["state"] == "placed"
    })
    .await;
    let work = app
        .call(
            Method::GET,
            "/agent/v1/work?wait_s=5",
            Some(&agent.token),
            None,
        )
        .await;
    let attempt = work.body["leases"][0]["attempt"].clone();
    app.call(
        Method::POST,
        "/agent/v1/events",
        Some(&agent.token),
        Some(json!({"events": [{"type": "started", "attempt": attempt, "pid": 1}]})),
    )
    .await;

    // The stray tagged instance is terminated by the reaper.
    eventually("the stray to be reaped", 20, async || {
        fake.terminations().contains(&stray).then_some(())
    })
    .await;

    // The provider loses our instance mid-job: the job goes back to the queue and bursts again.
    let provider_id = instances(&app).await[0]["provider_id"]
        .as_str()
        .unwrap()
        .to_string();
    fake.kill(&provider_id);
    eventually("a replacement launch", 30, async || {
        fake.launches()
            .into_iter()
            .find(|l| l.instance_key != launch.instance_key)
    })
    .await;
    let gone = instances(&app)
        .await
        .into_iter()
        .find(|i| i["id"] == launch.instance_key.as_str())
        .unwrap();
    assert_eq!(gone["state"], "terminated");
    assert!(gone["last_error"].as_str().unwrap().contains("gone"));
    let job = app.job(&dev, &id).await.body;
    assert_eq!(job["state"], "provisioning", "{job}");
    // Its late report is refused: the lease died with the instance.
    let r = app.call(Method::POST, "/agent/v1/events", Some(&agent.token), Some(json!({"events": [
        {"type": "finished", "attempt": attempt, "exit_code": 0, "signal": null, "error": null, "stopped": false}]}))).await;
    assert_eq!(
        r.status, 401,
        "a retired node's token no longer works: {}",
        r.body
    );

    // Invariant: the provider runs nothing the broker does not know as live, and vice versa.
    let live: Vec<String> = instances(&app)
        .await
        .into_iter()
        .filter(|i| i["state"] != "terminated")
        .filter_map(|i| i["provider_id"].as_str().map(str::to_string))
        .collect();
    for running in fake.running() {
        assert!(live.contains(&running.provider_id), "leaked {running:?}");
    }
    assert_eq!(
        fake.list()
            .await
            .unwrap()
            .iter()
            .filter(|i| i.state == InstanceState::Running)
            .count(),
        live.len()
    );
}

/// A spot instance's node takes only jobs that allow spot, and they pay spot there: a job that
/// never runs on spot gets an on-demand instance of its own, though the spot node has GPUs
/// free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spot_node_takes_only_jobs_that_allow_spot() {
    let (app, fake) = spawn_with_fake(|c| {
        c.idle_ttl_s = 600;
        c.min_billed_s = 0;
        // Spot about a third of on demand.
        c.catalogue_regions.push(aws_p5_catalogue(3));
    })
    .await;
    let dev = app.token("developer", Some("ml")).await;
    let job = |name: &str, spot: &str| {
        json!({"name": name, "team": "ml", "command": ["true"], "resources": {"gpus": 1},
               "estimated_runtime_s": 3600, "spot": spot})
    };
    let id = |r: Response| r.body["id"].as_str().unwrap().to_string();
    const WAIT: Duration = Duration::from_secs(10);

    // The first job allows spot: a spot instance is launched for it and it runs there.
    let first = id(app.submit(&dev, job("first", "allowed")).await);
    let launch = eventually("a launch", 20, async || fake.launches().into_iter().next()).await;
    assert_eq!(launch.market, Market::Spot, "{launch:?}");
    let agent = app.agent_with_token(&launch.enrolment_token, 8).await;
    let placed = app
        .wait_for_job(&dev, &first, WAIT, |j| j["state"] == "placed")
        .await;
    assert_eq!(placed["placement"]["node"], agent.node.as_str(), "{placed}");
    assert_eq!(placed["placement"]["market"], "spot", "{placed}");

    // Seven GPUs are free on the spot node; a job that never runs on spot does not take them.
    let never = id(app.submit(&dev, job("never", "never")).await);
    let second = eventually("a launch for the on-demand job", 20, async || {
        fake.launches().into_iter().nth(1)
    })
    .await;
    assert_eq!(second.market, Market::OnDemand, "{second:?}");
    let waiting = app.job(&dev, &never).await.body;
    assert_ne!(waiting["state"], "placed", "{waiting}");

    // A job that allows spot takes them, at the spot price.
    let spot = id(app.submit(&dev, job("spot", "allowed")).await);
    let placed = app
        .wait_for_job(&dev, &spot, WAIT, |j| j["state"] == "placed")
        .await;
    assert_eq!(placed["placement"]["node"], agent.node.as_str(), "{placed}");
    assert_eq!(placed["placement"]["market"], "spot", "{placed}");
    // The on-demand job runs on its own instance once that enrols.
    let od = app.agent_with_token(&second.enrolment_token, 8).await;
    let placed = app
        .wait_for_job(&dev, &never, WAIT, |j| j["state"] == "placed")
        .await;
    assert_eq!(placed["placement"]["node"], od.node.as_str(), "{placed}");
    assert_eq!(placed["placement"]["market"], "on_demand", "{placed}");
}

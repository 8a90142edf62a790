//! GPU health (issue 28): sick GPUs leave placement, a GPU that fell off the bus has its work
//! requeued, operators drain and undrain nodes, impossible telemetry is dropped and counted,
//! and a cloud instance with a bad GPU is replaced. The agents are played by hand, their
//! heartbeats built here; on SQLite, or PostgreSQL with `SWITCHYARD_TEST_PG_URL`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use std::time::Duration;

/// `n` healthy GPUs as an agent reports them, then `tweak`ed per GPU.
fn gpus(n: u32, tweak: impl Fn(u32, &mut Value)) -> Value {
    (0..n)
        .map(|i| {
            let mut g = json!({"index": i, "uuid": format!("GPU-fake-{i}"), "model": "H100",
                               "memory_mb": 81920, "temperature_c": 50});
            tweak(i, &mut g);
            g
        })
        .collect()
}

/// `n` GPUs of which GPU `gpu` reports XID `xid`.
fn with_xid(n: u32, gpu: u32, xid: u32) -> Value {
    gpus(n, |i, g| {
        if i == gpu {
            g["health"] = json!({"xid_events": [xid]});
        }
    })
}

/// An urgent job of team ml that bursts: its launched node's agent (8 GPUs) enrolled and
/// running it. Returns (developer token, job id, agent, attempt, the instance's id).
async fn running_on_a_launched_node(
    app: &TestApp,
    fake: &switchyard_providers::fake::FakeProvider,
    name: &str,
) -> (String, String, TestAgent, Value, String) {
    let dev = app.token("developer", Some("ml")).await;
    let id = app.submit(&dev, urgent(name)).await.body["id"]
        .as_str()
        .unwrap()
        .to_string();
    let launch = eventually("a launch", 20, async || fake.launches().first().cloned()).await;
    let agent = app.agent_with_token(&launch.enrolment_token, 8).await;
    let attempt = start_leased(app, &agent, &id, 1).await;
    let first = instances(app).await[0]["id"].as_str().unwrap().to_string();
    (dev, id, agent, attempt, first)
}

async fn heartbeat(app: &TestApp, agent: &TestAgent, gpus: Value, running: Value) -> Response {
    app.call(
        Method::POST,
        "/agent/v1/heartbeat",
        Some(&agent.token),
        Some(json!({
            "inventory": {"gpus": gpus, "cpus": 8, "memory_mb": 65536, "simulated": true},
            "running": running,
        })),
    )
    .await
}

async fn node_view(app: &TestApp, token: &str, node: &str) -> Value {
    let r = app
        .call(
            Method::GET,
            &format!("/api/v1/nodes/{node}"),
            Some(token),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    r.body
}

/// Waits until the scheduler planned twice more: what it would place, it has.
/// Free GPUs over every pool, as `GET /pools` says.
async fn gpus_free(app: &TestApp, token: &str) -> u64 {
    let r = app
        .call(Method::GET, "/api/v1/pools", Some(token), None)
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    r.body["pools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["gpus_free"].as_u64().unwrap_or(0))
        .sum()
}

async fn planned(app: &TestApp) {
    let before = scheduler_rounds(app).await;
    eventually("two scheduler rounds", 20, async || {
        (scheduler_rounds(app).await >= before + 2).then_some(())
    })
    .await;
}

async fn submit_one(app: &TestApp, token: &str, name: &str) -> String {
    let r = app
        .submit(
            token,
            json!({"name": name, "team": "ml", "command": ["true"], "resources": {"gpus": 1}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    r.body["id"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_with_a_fatal_xid_is_left_out_of_placement() {
    let app = TestApp::spawn().await;
    let agent = app.agent(2).await;
    let r = heartbeat(&app, &agent, with_xid(2, 0, 48), json!([])).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);

    let dev = app.token("developer", Some("ml")).await;
    let n = node_view(&app, &dev, &agent.node).await;
    assert_eq!(n["gpus"][0]["healthy"], false, "{n}");
    assert_eq!(
        n["gpus"][0]["reasons"],
        json!(["GPU 0 had a double-bit ECC error (XID 48)"]),
        "{n}"
    );
    assert_eq!(n["gpus"][1]["healthy"], true, "{n}");
    assert_eq!(n["state"], "healthy", "{n}");
    // The agent named no vendor: the model says.
    assert_eq!(n["gpus"][0]["vendor"], "nvidia", "{n}");
    // The pools view counts only the healthy GPU as free, as the scheduler does.
    assert_eq!(gpus_free(&app, &dev).await, 1);

    // The job gets the healthy GPU; a second finds none free.
    let first = submit_one(&app, &dev, "first").await;
    let lease = eventually("the first job's lease", 20, async || {
        let w = work(&app, &agent, 1).await;
        w["leases"].as_array().unwrap().first().cloned()
    })
    .await;
    assert_eq!(lease["attempt"]["job_id"], first.as_str());
    assert_eq!(lease["gpus"], json!([1]), "{lease}");
    let second = submit_one(&app, &dev, "second").await;
    planned(&app).await;
    assert_eq!(app.job(&dev, &second).await.body["state"], "queued");

    // The agent repeats the XID until a heartbeat is answered: still one reason.
    heartbeat(&app, &agent, with_xid(2, 0, 48), json!([])).await;
    let list = app
        .call(Method::GET, "/api/v1/nodes", Some(&dev), None)
        .await;
    assert_eq!(list.status, StatusCode::OK, "{}", list.body);
    let node = &list.body["nodes"][0];
    assert_eq!(node["id"], agent.node.as_str(), "{}", list.body);
    assert_eq!(node["gpus"][0]["reasons"].as_array().unwrap().len(), 1);
    assert_eq!(node["running"][0]["name"], "first", "{}", list.body);
    // Another team's developer sees the job, not its name.
    let other = app.token("developer", Some("other")).await;
    let list = app
        .call(Method::GET, "/api/v1/nodes", Some(&other), None)
        .await;
    assert_eq!(list.body["nodes"][0]["running"][0]["name"], Value::Null);
    assert_eq!(list.body["nodes"][0]["running"][0]["team"], "ml");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_only_gpu_overheats_takes_nothing_until_it_cools() {
    let app = TestApp::spawn().await;
    let agent = app.agent(1).await;
    let hot = |t: u32| {
        gpus(1, move |_, g| {
            g["temperature_c"] = json!(t);
            g["slowdown_temp_c"] = json!(87);
        })
    };
    heartbeat(&app, &agent, hot(91), json!([])).await;
    let dev = app.token("developer", Some("ml")).await;
    let n = node_view(&app, &dev, &agent.node).await;
    assert_eq!(
        n["gpus"][0]["reasons"],
        json!(["GPU 0 is at 91 °C, at or above its slowdown threshold of 87 °C"]),
        "{n}"
    );
    let id = submit_one(&app, &dev, "waits").await;
    planned(&app).await;
    assert_eq!(app.job(&dev, &id).await.body["state"], "queued");

    // Just under the threshold: still too hot (hysteresis).
    heartbeat(&app, &agent, hot(85), json!([])).await;
    planned(&app).await;
    assert_eq!(app.job(&dev, &id).await.body["state"], "queued");
    // Cool: the mark clears by itself and the job is placed.
    heartbeat(&app, &agent, hot(70), json!([])).await;
    app.wait_for_job(&dev, &id, Duration::from_secs(10), |j| {
        j["state"] == "placed"
    })
    .await;
    let n = node_view(&app, &dev, &agent.node).await;
    assert_eq!(n["gpus"][0]["healthy"], true, "{n}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uncorrectable_ecc_errors_take_the_only_gpu_out() {
    let app = TestApp::spawn().await;
    let agent = app.agent(1).await;
    heartbeat(
        &app,
        &agent,
        gpus(1, |_, g| {
            g["health"] = json!({"ecc_uncorrected_volatile": 2, "ecc_corrected_volatile": 7});
        }),
        json!([]),
    )
    .await;
    let dev = app.token("developer", Some("ml")).await;
    let id = submit_one(&app, &dev, "waits").await;
    planned(&app).await;
    assert_eq!(app.job(&dev, &id).await.body["state"], "queued");
    let n = node_view(&app, &dev, &agent.node).await;
    assert_eq!(
        n["gpus"][0]["reasons"][0],
        "GPU 0 has 2 uncorrectable ECC errors since its driver loaded"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_on_a_gpu_that_fell_off_the_bus_is_requeued_with_the_reason() {
    let app = TestApp::spawn().await;
    let agent = app.agent(1).await;
    let dev = app.token("developer", Some("ml")).await;
    let id = submit_one(&app, &dev, "victim").await;
    let attempt = start_leased(&app, &agent, &id, 1).await;

    let fell = gpus(1, |_, g| g["health"] = json!({"xid_events": [79]}));
    let r = heartbeat(&app, &agent, fell.clone(), json!([attempt])).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    // The attempt on the sick GPU is told to stop, in this very answer.
    assert_eq!(r.body["stop"], json!([attempt]), "{}", r.body);
    let job = app.job(&dev, &id).await.body;
    assert_eq!(job["state"], "queued", "{job}");
    assert!(
        job["reason"]
            .as_str()
            .unwrap()
            .contains("GPU 0 fell off the bus (XID 79)"),
        "{job}"
    );
    // The XID again (the agent repeats it until answered): nothing new, the job is not placed
    // on the node's only GPU.
    let r = heartbeat(&app, &agent, fell, json!([])).await;
    assert_eq!(r.body["stop"], json!([]), "{}", r.body);
    planned(&app).await;
    let job = app.job(&dev, &id).await.body;
    assert_eq!(job["state"], "queued", "{job}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_fatal_marks_leave_running_work_alone() {
    let app = TestApp::spawn().await;
    let agent = app.agent(1).await;
    let dev = app.token("developer", Some("ml")).await;
    let id = submit_one(&app, &dev, "survivor").await;
    let attempt = start_leased(&app, &agent, &id, 1).await;
    let r = heartbeat(
        &app,
        &agent,
        gpus(1, |_, g| g["health"] = json!({"xid_events": [48]})),
        json!([attempt]),
    )
    .await;
    assert_eq!(r.body["stop"], json!([]), "{}", r.body);
    assert_eq!(app.job(&dev, &id).await.body["state"], "running");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn infra_drains_and_undrains_a_node_and_both_are_audited() {
    let app = TestApp::spawn().await;
    let agent = app.agent(1).await;
    // A sticky mark the undrain clears.
    heartbeat(
        &app,
        &agent,
        gpus(1, |_, g| g["health"] = json!({"xid_events": [74]})),
        json!([]),
    )
    .await;
    let infra = app.token("infra", None).await;
    let dev = app.token("developer", Some("ml")).await;
    let path = |verb: &str| format!("/api/v1/nodes/{}/{verb}", agent.node);

    let r = app
        .call(Method::POST, &path("drain"), Some(&dev), None)
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
    assert_eq!(r.error_code(), "forbidden", "{}", r.body);
    let r = app
        .call(
            Method::POST,
            "/api/v1/nodes/no-such-node/drain",
            Some(&infra),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.body);
    assert_eq!(r.error_code(), "not_found", "{}", r.body);

    let r = app
        .call(Method::POST, &path("drain"), Some(&infra), None)
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.body["state"], "draining", "{}", r.body);
    // The agent hears it on its next heartbeat.
    let hb = heartbeat(&app, &agent, gpus(1, |_, _| {}), json!([])).await;
    assert_eq!(hb.body["drain"], true, "{}", hb.body);

    let r = app
        .call(Method::POST, &path("undrain"), Some(&infra), None)
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.body["state"], "healthy", "{}", r.body);
    assert_eq!(r.body["gpus"][0]["healthy"], true, "{}", r.body);
    let hb = heartbeat(&app, &agent, gpus(1, |_, _| {}), json!([])).await;
    assert_eq!(hb.body["drain"], false, "{}", hb.body);
    // The node takes work again.
    let id = submit_one(&app, &dev, "after").await;
    app.wait_for_job(&dev, &id, Duration::from_secs(10), |j| {
        j["state"] == "placed"
    })
    .await;

    let audit = app
        .call(
            Method::GET,
            &format!("/api/v1/audit?target=node:{}", agent.node),
            Some(&app.admin),
            None,
        )
        .await;
    assert_eq!(audit.status, StatusCode::OK, "{}", audit.body);
    let actions: Vec<&str> = audit.body["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert_eq!(actions, ["node.undrain", "node.drain"], "{}", audit.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_node_takes_no_new_work_and_running_work_finishes() {
    let app = TestApp::spawn().await;
    let agent = app.agent(2).await;
    let dev = app.token("developer", Some("ml")).await;
    let running = submit_one(&app, &dev, "running").await;
    let attempt = start_leased(&app, &agent, &running, 1).await;
    let r = app
        .call(
            Method::POST,
            &format!("/api/v1/nodes/{}/drain", agent.node),
            Some(&app.admin),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    // A drained node offers nothing, though one of its GPUs is idle.
    assert_eq!(gpus_free(&app, &dev).await, 0);
    let waits = submit_one(&app, &dev, "waits").await;
    planned(&app).await;
    assert_eq!(app.job(&dev, &waits).await.body["state"], "queued");
    let hb = heartbeat(&app, &agent, gpus(2, |_, _| {}), json!([attempt])).await;
    assert_eq!(hb.body["stop"], json!([]), "{}", hb.body);
    assert_eq!(app.job(&dev, &running).await.body["state"], "running");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn telemetry_out_of_physical_range_is_dropped_counted_and_never_exported() {
    let app = TestApp::spawn().await;
    let agent = app.agent(2).await;
    let r = heartbeat(
        &app,
        &agent,
        gpus(2, |i, g| {
            if i == 0 {
                g["utilization_pct"] = json!(101);
                g["temperature_c"] = json!(4_294_967_295_u64);
                g["power_w"] = json!(-1.0);
                g["memory_used_mb"] = json!(90_000);
                g["sm_clock_mhz"] = json!(9000);
                g["profiling"] = json!({"sm_active_pct": 140.0, "dram_active_pct": 25.0});
            } else {
                g["utilization_pct"] = json!(60);
                g["power_w"] = json!(300.0);
                g["sm_clock_mhz"] = json!(1980);
                g["profiling"] = json!({"sm_active_pct": 50.0});
                g["health"] = json!({"xid_events": [13], "ecc_uncorrected_volatile": 0});
            }
        }),
        json!([]),
    )
    .await;
    assert_eq!(
        r.status,
        StatusCode::OK,
        "the heartbeat still counts: {}",
        r.body
    );
    let n = node_view(&app, &app.admin, &agent.node).await;
    let g0 = &n["gpus"][0];
    for field in [
        "utilization_pct",
        "temperature_c",
        "power_w",
        "memory_used_mb",
    ] {
        assert_eq!(g0[field], Value::Null, "{field}: {n}");
    }
    assert_eq!(n["gpus"][1]["utilization_pct"], 60, "{n}");
    assert_eq!(g0["healthy"], true, "{n}");

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
    for field in [
        "utilization_pct",
        "temperature_c",
        "power_w",
        "memory_used_mb",
        "sm_clock_mhz",
        "sm_active_pct",
    ] {
        let line = format!("switchyard_telemetry_dropped_total{{field=\"{field}\"}} 1");
        assert!(text.contains(&line), "{line} in\n{text}");
    }
    let series = |name: &str, gpu: u32| {
        text.lines()
            .filter(|l| {
                l.starts_with(&format!("{name}{{")) && l.contains(&format!("gpu=\"{gpu}\""))
            })
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    // GPU 0's impossible readings are not exported; GPU 1's are.
    assert!(series("DCGM_FI_DEV_GPU_UTIL", 0).is_empty(), "{text}");
    assert!(series("DCGM_FI_DEV_SM_CLOCK", 0).is_empty(), "{text}");
    assert!(series("DCGM_FI_PROF_SM_ACTIVE", 0).is_empty(), "{text}");
    assert!(
        series("DCGM_FI_PROF_DRAM_ACTIVE", 0)[0].ends_with(" 0.25"),
        "{text}"
    );
    assert!(
        series("DCGM_FI_DEV_SM_CLOCK", 1)[0].ends_with(" 1980"),
        "{text}"
    );
    assert!(
        series("DCGM_FI_PROF_SM_ACTIVE", 1)[0].ends_with(" 0.5"),
        "{text}"
    );
    assert!(
        series("DCGM_FI_DEV_XID_ERRORS", 1)[0].ends_with(" 13"),
        "{text}"
    );
    assert!(
        series("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 1)[0].ends_with(" 0"),
        "{text}"
    );
    assert!(
        series("switchyard_gpu_healthy", 1)[0].ends_with(" 1"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_health_gauge_says_which_gpu_is_sick() {
    let app = TestApp::spawn().await;
    let agent = app.agent(2).await;
    heartbeat(&app, &agent, with_xid(2, 1, 95), json!([])).await;
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
    let healthy: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("switchyard_gpu_healthy{"))
        .collect();
    assert_eq!(healthy.len(), 2, "{text}");
    for l in healthy {
        let want = if l.contains("gpu=\"1\"") { " 0" } else { " 1" };
        assert!(l.ends_with(want), "{l}");
        assert!(l.contains(&format!("node=\"{}\"", agent.node)), "{l}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cloud_instance_whose_gpu_fell_off_the_bus_is_replaced() {
    let (app, fake) = spawn_two_clouds(|c| c.idle_ttl_s = 600).await;
    let (dev, id, agent, attempt, first) =
        running_on_a_launched_node(&app, &fake, "replaced").await;

    // GPU 0 (the job holds 0 and 1) falls off the bus.
    let r = heartbeat(&app, &agent, with_xid(8, 0, 79), json!([attempt])).await;
    assert_eq!(r.body["stop"], json!([attempt]), "{}", r.body);

    // The instance is terminated (its work is gone), and a fresh one is launched for the job.
    eventually("the sick instance terminated", 20, async || {
        instances(&app)
            .await
            .iter()
            .find(|i| i["id"] == first.as_str() && i["state"] == "terminated")
            .cloned()
    })
    .await;
    assert_eq!(fake.terminations().len(), 1, "{:?}", fake.terminations());
    let second = eventually("a second launch", 20, async || {
        fake.launches().get(1).cloned()
    })
    .await;
    // The job waits for the fresh instance (ending the old one did not take it back), and runs
    // there.
    let job = app.job(&dev, &id).await.body;
    assert_eq!(job["state"], "provisioning", "{job}");
    let fresh = app.agent_with_token(&second.enrolment_token, 8).await;
    start_leased(&app, &fresh, &id, 1).await;
    let all = instances(&app).await;
    let old = all.iter().find(|i| i["id"] == first.as_str()).unwrap();
    assert!(
        old["last_error"]
            .as_str()
            .unwrap_or("")
            .contains("GPU 0 fell off the bus (XID 79)"),
        "{old}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gang_rank_on_a_gpu_that_fell_off_the_bus_requeues_every_rank() {
    let app = TestApp::spawn().await;
    let dev = app.token("developer", Some("ml")).await;
    let a = app.agent(1).await;
    let b = app.agent(1).await;
    let r = app
        .submit(
            &dev,
            json!({"name": "ddp", "team": "ml", "command": ["torchrun"],
                   "resources": {"gpus": 1, "nodes": 2}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let id = r.body["id"].as_str().unwrap().to_string();
    let on_a = start_leased(&app, &a, &id, 1).await;
    let on_b = start_leased(&app, &b, &id, 1).await;

    let r = heartbeat(
        &app,
        &a,
        gpus(1, |_, g| g["health"] = json!({"xid_events": [79]})),
        json!([on_a]),
    )
    .await;
    assert_eq!(r.body["stop"], json!([on_a]), "{}", r.body);
    // The other rank is told to stop too, and the job waits for two healthy nodes.
    let r = heartbeat(&app, &b, gpus(1, |_, _| {}), json!([on_b])).await;
    assert_eq!(r.body["stop"], json!([on_b]), "{}", r.body);
    let job = app.job(&dev, &id).await.body;
    assert_eq!(job["state"], "queued", "{job}");
    assert!(
        job["reason"]
            .as_str()
            .unwrap()
            .contains("GPU 0 fell off the bus (XID 79)"),
        "{job}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_assigned_to_a_drained_node_but_not_started_is_requeued() {
    let app = TestApp::spawn().await;
    let agent = app.agent(1).await;
    let dev = app.token("developer", Some("ml")).await;
    let id = submit_one(&app, &dev, "assigned").await;
    app.wait_for_job(&dev, &id, Duration::from_secs(10), |j| {
        j["state"] == "placed"
    })
    .await;
    let r = app
        .call(
            Method::POST,
            &format!("/api/v1/nodes/{}/drain", agent.node),
            Some(&app.admin),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    // A draining agent takes no new lease: the job goes back to the queue, and waits.
    let job = app.job(&dev, &id).await.body;
    assert_eq!(job["state"], "queued", "{job}");
    assert!(
        job["reason"]
            .as_str()
            .unwrap()
            .contains("was drained before the job started"),
        "{job}"
    );
    planned(&app).await;
    assert_eq!(app.job(&dev, &id).await.body["state"], "queued");
    let r = app
        .call(
            Method::POST,
            &format!("/api/v1/nodes/{}/undrain", agent.node),
            Some(&app.admin),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    start_leased(&app, &agent, &id, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cloud_instance_with_a_sick_gpu_is_replaced_once_its_running_work_finishes() {
    let (app, fake) = spawn_two_clouds(|c| c.idle_ttl_s = 600).await;
    let (dev, id, agent, attempt, first) =
        running_on_a_launched_node(&app, &fake, "finishes").await;

    // A double-bit ECC error on a GPU the job does not hold: the job runs on, the node drains.
    let r = heartbeat(&app, &agent, with_xid(8, 5, 48), json!([attempt])).await;
    assert_eq!(r.body["stop"], json!([]), "{}", r.body);
    let hb = heartbeat(&app, &agent, gpus(8, |_, _| {}), json!([attempt])).await;
    assert_eq!(hb.body["drain"], true, "{}", hb.body);
    eventually("the instance draining", 20, async || {
        instances(&app)
            .await
            .iter()
            .find(|i| i["id"] == first.as_str() && i["state"] == "draining")
            .cloned()
    })
    .await;
    assert!(fake.terminations().is_empty(), "{:?}", fake.terminations());
    assert_eq!(app.job(&dev, &id).await.body["state"], "running");

    // The job ends: the instance is terminated at once, not after the idle TTL.
    let r = events(
        &app,
        &agent,
        json!([{"type": "finished", "attempt": attempt, "exit_code": 0, "signal": null,
                "error": null, "stopped": false}]),
    )
    .await;
    assert_eq!(r, ["accepted"]);
    let old = eventually("the sick instance terminated", 20, async || {
        instances(&app)
            .await
            .iter()
            .find(|i| i["id"] == first.as_str() && i["state"] == "terminated")
            .cloned()
    })
    .await;
    assert!(
        old["last_error"]
            .as_str()
            .unwrap_or("")
            .contains("GPU 5 had a double-bit ECC error (XID 48)"),
        "{old}"
    );
    assert_eq!(fake.terminations().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preempting_work_never_hands_out_a_sick_gpu() {
    let app = TestApp::spawn().await;
    let agent = app.agent(2).await;
    let dev = app.token("developer", Some("ml")).await;
    let low = |name: &str| {
        json!({"name": name, "team": "ml", "command": ["sleep", "600"], "priority": "low",
               "resources": {"gpus": 1}, "estimated_runtime_s": 36_000})
    };
    let older = app.submit(&dev, low("older")).await.body["id"]
        .as_str()
        .unwrap()
        .to_string();
    let on_0 = start_leased(&app, &agent, &older, 1).await;
    let newer = app.submit(&dev, low("newer")).await.body["id"]
        .as_str()
        .unwrap()
        .to_string();
    let on_1 = start_leased(&app, &agent, &newer, 1).await;
    // The newer job's GPU goes bad (its work runs on).
    let r = heartbeat(&app, &agent, with_xid(2, 1, 48), json!([on_0, on_1])).await;
    assert_eq!(r.body["stop"], json!([]), "{}", r.body);

    // An urgent job needs one GPU by its deadline: only stopping the job on the healthy GPU
    // gives it one (the newer job, the cheaper victim, holds only the sick one).
    let urgent = app
        .submit(
            &dev,
            json!({"name": "urgent", "team": "ml", "command": ["true"], "priority": "critical",
                   "resources": {"gpus": 1}, "estimated_runtime_s": 300,
                   "deadline": (chrono::Utc::now() + chrono::Duration::seconds(1200)).to_rfc3339()}),
        )
        .await;
    assert_eq!(urgent.status, StatusCode::CREATED, "{}", urgent.body);
    let urgent = urgent.body["id"].as_str().unwrap().to_string();
    let stop = eventually("a preemption", 20, async || {
        let w = work(&app, &agent, 1).await;
        (!w["stop"].as_array().unwrap().is_empty()).then(|| w["stop"].clone())
    })
    .await;
    assert_eq!(
        stop,
        json!([on_0]),
        "the job on the healthy GPU is the one victim"
    );
    let r = events(
        &app,
        &agent,
        json!([{"type": "finished", "attempt": on_0, "exit_code": null, "signal": 15,
                "error": null, "stopped": true}]),
    )
    .await;
    assert_eq!(r, ["accepted"]);
    let lease = eventually("the urgent job's lease", 20, async || {
        let w = work(&app, &agent, 1).await;
        w["leases"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["attempt"]["job_id"] == urgent.as_str())
            .cloned()
    })
    .await;
    assert_eq!(lease["gpus"], json!([0]), "{lease}");
}

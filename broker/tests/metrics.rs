//! `/metrics`: the Prometheus exposition reads queue depth, instances and nodes from the
//! database and each GPU's readings from the agents' last heartbeats, under dcgm-exporter's
//! names; the scheduler's histograms count real rounds. Only operator roles may scrape.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use reqwest::{Method, StatusCode};
use serde_json::json;
use std::collections::HashMap;
use std::time::Duration;

/// Scrapes `/metrics` and returns `series → value` (series is `name{labels}` as printed).
async fn scrape(app: &TestApp, token: &str) -> HashMap<String, f64> {
    let r = app
        .http
        .get(format!("{}/metrics", app.url))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let ct = r.headers()["content-type"].to_str().unwrap().to_string();
    assert!(ct.starts_with("application/openmetrics-text"), "{ct}");
    let text = r.text().await.unwrap();
    assert!(text.ends_with("# EOF\n"), "{text}");
    let mut out = HashMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        // Every sample is `series value`, the value a number.
        let (series, value) = line.rsplit_once(' ').unwrap();
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad sample {line:?}"));
        out.insert(series.to_string(), value);
    }
    out
}

fn find(m: &HashMap<String, f64>, name: &str, labels: &[&str]) -> Option<f64> {
    m.iter()
        .find(|(k, _)| k.split('{').next() == Some(name) && labels.iter().all(|l| k.contains(l)))
        .map(|(_, v)| *v)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_show_the_queue_the_gpus_and_the_scheduler() {
    let app = TestApp::spawn().await;
    let dev = app.token("developer", Some("ml")).await;
    let infra = app.token("infra", None).await;

    // Only operator roles scrape.
    let r = app.call(Method::GET, "/metrics", Some(&dev), None).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    let r = app.call(Method::GET, "/metrics", None, None).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);

    // An agent whose heartbeat carries NVML readings for its two GPUs.
    let agent = app.agent(2).await;
    let gpus: Vec<_> = (0..2)
        .map(|i| {
            json!({"index": i, "uuid": format!("GPU-real-{i}"), "model": "H100",
                   "memory_mb": 81920, "memory_used_mb": 1024 * (i + 1),
                   "utilization_pct": 40 + i, "temperature_c": 60 + i, "power_w": 301.5})
        })
        .collect();
    let hb = app
        .call(
            Method::POST,
            "/agent/v1/heartbeat",
            Some(&agent.token),
            Some(
                json!({"inventory": {"gpus": gpus, "cpus": 8, "memory_mb": 65536,
                                      "simulated": false}, "running": []}),
            ),
        )
        .await;
    assert_eq!(hb.status, StatusCode::OK, "{}", hb.body);

    // Two jobs placed on the node, one too big for it waiting.
    app.submit(&dev, job_spec("ml")).await;
    let mut big = job_spec("ml");
    big["resources"]["gpus"] = json!(4);
    big["priority"] = json!("high");
    let placed = app.submit(&dev, job_spec("ml")).await;
    assert_eq!(placed.status, StatusCode::CREATED);
    app.submit(&dev, big).await;

    let m = eventually("the scheduler to have planned", 10, async || {
        let m = scrape(&app, &infra).await;
        (find(&m, "switchyard_jobs", &["state=\"placed\""]) == Some(2.0)).then_some(m)
    })
    .await;
    assert_eq!(
        find(&m, "switchyard_jobs", &["priority=\"high\""]),
        Some(1.0),
        "{m:#?}"
    );
    assert_eq!(find(&m, "switchyard_jobs_submitted_total", &[]), Some(3.0));
    assert!(find(&m, "switchyard_placement_seconds_count", &[]).unwrap() >= 1.0);
    assert!(find(&m, "switchyard_plan_queued_jobs_sum", &[]).unwrap() >= 3.0);
    assert_eq!(
        find(&m, "switchyard_nodes", &["health=\"healthy\"", POOL]),
        Some(1.0)
    );
    assert_eq!(
        find(
            &m,
            "DCGM_FI_DEV_GPU_UTIL",
            &["gpu=\"1\"", "UUID=\"GPU-real-1\""]
        ),
        Some(41.0)
    );
    assert_eq!(
        find(
            &m,
            "DCGM_FI_DEV_FB_USED",
            &["gpu=\"1\"", "modelName=\"H100\""]
        ),
        Some(2048.0)
    );
    assert_eq!(
        find(
            &m,
            "DCGM_FI_DEV_GPU_TEMP",
            &["gpu=\"0\"", "Hostname=\"test-host\""]
        ),
        Some(60.0)
    );
    assert_eq!(
        find(&m, "DCGM_FI_DEV_POWER_USAGE", &["gpu=\"0\""]),
        Some(301.5)
    );

    // A lost node: counted as lost, its stale GPU readings gone, the expiry counted.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let m = eventually("the lease to expire", 10, async || {
        let m = scrape(&app, &infra).await;
        (find(&m, "switchyard_lease_expiries_total", &[]) == Some(1.0)).then_some(m)
    })
    .await;
    assert_eq!(
        find(&m, "switchyard_nodes", &["health=\"lost\""]),
        Some(1.0)
    );
    assert_eq!(find(&m, "DCGM_FI_DEV_GPU_UTIL", &[]), None);
    // The only replica leads, under the first epoch.
    assert_eq!(find(&m, "switchyard_leader", &[]), Some(1.0));
    assert_eq!(find(&m, "switchyard_leader_epoch", &[]), Some(1.0));
}

//! The morning story end to end on `switchyard up`, with real agents, real replica processes
//! (`model-emulator`) and real load through the gateway:
//!
//! 1. at night, batch training fills the on-prem GPUs (one `low` job, one `normal` job);
//! 2. a `critical` chat service is deployed: its first replica takes its GPUs back from the
//!    training (the checkpoint signal, then a requeue) rather than launching a cloud node;
//! 3. load rises: the autoscaler adds replicas on the load signal (after its up delay); they
//!    take the rest of on-prem from training, `low` work first, then `normal`; when on-prem
//!    holds nothing but the service, the next replica spills to a cloud region;
//! 4. the load falls: after the down delay the service drains to its minimum without a failed
//!    request, and the training runs again.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{Value, json};
use std::time::{Duration, Instant};
use switchyard_tests::{Callers, Up, bin, eventually};

/// A training job: runs until told to stop; on SIGTERM (the checkpoint signal) it saves and
/// exits.
const TRAINING: &str = r#"
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
while True:
    time.sleep(0.2)
"#;

fn training(name: &str, priority: &str) -> Value {
    json!({
        "name": name, "team": "research",
        "command": ["python3", "-c", TRAINING],
        "resources": {"gpus": 4},
        "priority": priority,
        "estimated_runtime_s": 36000,
        "regions": ["onprem:local-dc1"],
        "kind": "batch"
    })
}

fn chat() -> Value {
    let emulator = bin("model-emulator");
    json!({
        "name": "chat", "team": "ml",
        "command": [emulator.to_string_lossy(), "--speedup", "10", "--slots", "2"],
        "resources": {"gpus": 2},
        "priority": "critical",
        "replicas": {"min": 1, "max": 5},
        "scaling": {"max_concurrency_per_replica": 2, "window_s": 5,
                    "scale_up_delay_s": 2, "scale_down_delay_s": 6},
        "readiness": {"path": "/health", "period_s": 1, "timeout_s": 1, "failure_threshold": 2}
    })
}

fn ready(service: &Value) -> Vec<Value> {
    service["replicas"]
        .as_array()
        .map(|rs| {
            rs.iter()
                .filter(|r| r["state"] == "ready")
                .cloned()
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_critical_service_takes_gpus_back_from_training_spills_to_the_cloud_and_gives_them_back()
{
    let up = Up::start(&["--boot-delay", "2s", "--idle-ttl", "30s"], 8).await;
    // Night: training fills on-prem (two nodes of four GPUs).
    let low = up.submit(training("night-low", "low")).await;
    let normal = up.submit(training("night-normal", "normal")).await;
    for id in [&low, &normal] {
        up.job_where(id, 60, |j| j["state"] == "running").await;
    }

    // Morning: the chat service. Its first replica preempts the low job, not a cloud node.
    let (status, created) = up
        .send(reqwest::Method::POST, "/api/v1/services", Some(chat()))
        .await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    let endpoint = created["endpoint"].as_str().unwrap().to_string();
    let service = eventually("one ready replica", Duration::from_secs(90), || async {
        let s = up.get(&format!("/api/v1/services/{id}")).await;
        (ready(&s).len() == 1).then_some(s)
    })
    .await;
    assert!(
        ready(&service)[0]["region"]
            .as_str()
            .is_some_and(|r| r.starts_with("onprem:")),
        "{service}"
    );
    let low_job = up.get(&format!("/api/v1/jobs/{low}")).await;
    assert_ne!(
        low_job["state"], "running",
        "the low job gave its GPUs: {low_job}"
    );
    assert!(
        up.instances().await.is_empty(),
        "no cloud node for the first replica"
    );

    // The gateway routes the service once it has read its routes again (within 500 ms).
    let url = format!("{endpoint}v1/completions");
    eventually(
        "an answer through the gateway",
        Duration::from_secs(10),
        || async {
            let r = up
                .http
                .post(&url)
                .bearer_auth(&up.token)
                .json(&json!({"prompt_tokens": 10, "max_tokens": 1}))
                .send()
                .await
                .ok()?;
            r.status().is_success().then_some(())
        },
    )
    .await;
    // Load rises: ten callers on replicas that serve two at once.
    let load = Callers::start(
        &url,
        &up.token,
        10,
        json!({"prompt_tokens": 200, "max_tokens": 40}),
        Instant::now(),
    );
    let service = eventually(
        "the service scaled to five, one in the cloud",
        Duration::from_secs(120),
        || async {
            let s = up.get(&format!("/api/v1/services/{id}")).await;
            let r = ready(&s);
            let cloud = r
                .iter()
                .filter(|x| !x["region"].as_str().unwrap_or("").starts_with("onprem:"))
                .count();
            (r.len() == 5 && cloud >= 1).then_some(s)
        },
    )
    .await;
    assert_eq!(service["desired_replicas"], 5, "{service}");
    // Both training jobs gave their GPUs; the normal one only after the low one.
    let normal_job = up.get(&format!("/api/v1/jobs/{normal}")).await;
    let events = up.get(&format!("/api/v1/services/{id}/events")).await;
    assert_ne!(
        normal_job["state"], "running",
        "{normal_job}\n{service}\n{events}"
    );
    let scaled: Vec<&str> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "scaled")
        .filter_map(|e| e["message"].as_str())
        .collect();
    assert!(
        scaled.iter().any(|m| m.contains("requests")),
        "the load signal scaled it: {scaled:?}"
    );

    // The load falls: the service drains to one, and nothing failed on the way.
    let (ok, failures) = load.stop().await;
    assert!(ok > 50, "{ok} answers");
    let service = eventually("back to one replica", Duration::from_secs(90), || async {
        let s = up.get(&format!("/api/v1/services/{id}")).await;
        (s["desired_replicas"] == 1 && s["replicas"].as_array().is_some_and(|r| r.len() == 1))
            .then_some(s)
    })
    .await;
    let events = up.get(&format!("/api/v1/services/{id}/events")).await;
    for e in events["events"].as_array().into_iter().flatten() {
        eprintln!("EVENT {} {} {}", e["at"], e["kind"], e["message"]);
    }
    assert!(
        failures.is_empty(),
        "{} failed calls during the morning: {:?}\n{service}\n{events}",
        failures.len(),
        failures.iter().take(5).collect::<Vec<_>>()
    );
    // Training runs again on the GPUs the service gave back.
    up.job_where(&normal, 90, |j| j["state"] == "running").await;
}

//! GPU health end to end (issue 28): a real agent whose simulated GPU is given a fault
//! (`--fake-gpu-fault`) reports it in its heartbeats, and the broker acts on it: the GPU is
//! marked with the reason, the job on a GPU that fell off the bus runs again on a healthy one,
//! and an overheating GPU takes no work.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{Value, json};
use std::time::Duration;
use switchyard_tests::*;

const WAIT: Duration = Duration::from_secs(40);

/// GPU `index` of the one node, as `GET /nodes` shows it.
async fn gpu(broker: &Broker, index: usize) -> Value {
    let (status, body) = broker
        .call(reqwest::Method::GET, "/api/v1/nodes", None)
        .await;
    assert_eq!(status, 200, "{body}");
    body["nodes"][0]["gpus"][index].clone()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_simulated_gpu_that_falls_off_the_bus_is_marked_and_its_job_runs_on_another() {
    let mut broker = Broker::start().await;
    // Long enough for the job to be running on GPU 0 first.
    broker
        .start_agent_with("xid-a1", 2, &["--fake-gpu-fault", "0:xid=79@12s"], &[])
        .await;
    let id = broker
        .submit(
            json!({"name": "victim", "team": "ml", "command": ["sleep", "600"],
                       "resources": {"gpus": 1}}),
        )
        .await;
    let job = broker.wait_state(&id, &["running"], WAIT).await;
    assert_eq!(job["placement"]["gpus"], json!([0]), "{job}");

    let sick = eventually("GPU 0 marked unhealthy", WAIT, || async {
        let g = gpu(&broker, 0).await;
        (g["healthy"] == false).then_some(g)
    })
    .await;
    assert_eq!(
        sick["reasons"],
        json!(["GPU 0 fell off the bus (XID 79)"]),
        "{sick}"
    );
    assert_eq!(gpu(&broker, 1).await["healthy"], true);
    // Its job was requeued and runs again, on the healthy GPU.
    let job = eventually("the job running again on GPU 1", WAIT, || async {
        let j = broker.job(&id).await;
        (j["state"] == "running" && j["attempts"] == 2).then_some(j)
    })
    .await;
    assert_eq!(job["placement"]["gpus"], json!([1]), "{job}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_overheating_simulated_gpu_takes_no_work() {
    let mut broker = Broker::start().await;
    broker
        .start_agent_with("hot-a1", 1, &["--fake-gpu-fault", "0:overheat@0s"], &[])
        .await;
    let sick = eventually("GPU 0 marked unhealthy", WAIT, || async {
        let g = gpu(&broker, 0).await;
        (g["healthy"] == false).then_some(g)
    })
    .await;
    let reason = sick["reasons"][0].as_str().unwrap();
    assert!(reason.contains("slowdown threshold"), "{sick}");
    let id = broker
        .submit(json!({"name": "waits", "team": "ml", "command": ["true"],
                       "resources": {"gpus": 1}}))
        .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(broker.job(&id).await["state"], "queued");
}

//! Measures the burst path of BENCHMARKS.md: plan → launch call, launch → agent registered, and
//! registered → job running, with the local provider under `switchyard up` (boot delay 0, so the
//! figures are Switchyard's own overhead, not a cloud's boot time). Baseline in the same run:
//! submit → running on an idle on-prem agent. Run with
//! `cargo run --release -p switchyard-tests --bin bench-burst -- [BURSTS]` after building the
//! release binaries.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{Value, json};
use std::time::Duration;
use switchyard_tests::{Up, eventually, in_secs};

fn ms(v: &Value) -> i64 {
    chrono::DateTime::parse_from_rfc3339(v.as_str().expect("a timestamp"))
        .expect("RFC 3339")
        .timestamp_millis()
}

fn median(mut v: Vec<i64>) -> i64 {
    v.sort_unstable();
    v[v.len() / 2]
}

fn max(v: &[i64]) -> i64 {
    v.iter().copied().max().unwrap_or(0)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let bursts: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10);
    let up = Up::start(
        &[
            "--agents",
            "1",
            "--idle-ttl",
            "0s",
            "--boot-delay",
            "0s",
            "--billing-minimum",
            "0s",
        ],
        4,
    )
    .await;
    let wait_done = |id: String| {
        let up = &up;
        async move { up.job_where(&id, 60, |j| j["state"] == "succeeded").await }
    };

    // Baseline: submit → running on the idle on-prem agent.
    let mut baseline = Vec::new();
    for _ in 0..bursts {
        let id = up.submit(json!({"name": "base", "team": "b", "command": ["true"], "resources": {"gpus": 1}, "regions": ["onprem:local-dc1"]})).await;
        let j = wait_done(id).await;
        baseline.push(ms(&j["started_at"]) - ms(&j["submitted_at"]));
    }

    let filler = up.submit(json!({"name": "fill", "team": "b", "command": ["sleep", "3600"], "resources": {"gpus": 4}, "estimated_runtime_s": 7200, "regions": ["onprem:local-dc1"]})).await;
    up.job_where(&filler, 30, |j| j["state"] == "running").await;

    let (mut plan_to_launch, mut launch_to_ready, mut ready_to_running, mut submit_to_running) =
        (vec![], vec![], vec![], vec![]);
    for _ in 0..bursts {
        let deadline = in_secs(900);
        let id = up.submit(json!({"name": "burst", "team": "b", "command": ["true"], "resources": {"gpus": 1}, "estimated_runtime_s": 60, "deadline": deadline})).await;
        let j = wait_done(id.clone()).await;
        let inst = eventually("its instance to end", Duration::from_secs(30), || async {
            let i = up
                .instances()
                .await
                .into_iter()
                .find(|i| i["for_job"] == id.as_str())?;
            (i["state"] == "terminated").then_some(i)
        })
        .await;
        plan_to_launch.push(ms(&inst["launched_at"]) - ms(&inst["requested_at"]));
        launch_to_ready.push(ms(&inst["ready_at"]) - ms(&inst["launched_at"]));
        ready_to_running.push(ms(&j["started_at"]) - ms(&inst["ready_at"]));
        submit_to_running.push(ms(&j["started_at"]) - ms(&j["submitted_at"]));
    }
    println!("bursts: {bursts} (local provider, boot delay 0 s, one at a time)");
    println!(
        "plan → launch call returned (ms): median {}, max {}",
        median(plan_to_launch.clone()),
        max(&plan_to_launch)
    );
    println!(
        "launch → agent registered (ms): median {}, max {}",
        median(launch_to_ready.clone()),
        max(&launch_to_ready)
    );
    println!(
        "registered → job running (ms): median {}, max {}",
        median(ready_to_running.clone()),
        max(&ready_to_running)
    );
    println!(
        "submit → running via a burst (ms): median {}, max {}",
        median(submit_to_running.clone()),
        max(&submit_to_running)
    );
    println!(
        "baseline submit → running on-prem (ms): median {}, max {}",
        median(baseline.clone()),
        max(&baseline)
    );
}

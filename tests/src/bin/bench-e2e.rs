//! Measures the figures of BENCHMARKS.md "End to end": submit → running on an idle agent, the
//! agent's idle resident memory, and the binary sizes. Run with
//! `cargo run --release -p switchyard-tests --bin bench-e2e -- [JOBS]` after building the release
//! binaries (`cargo build --release -p switchyard-broker -p switchyard-agent`).
//!
//! Submit → running is read from the broker's own timestamps (`started_at − submitted_at`), so
//! the client's polling does not enter the figure. The baseline, measured in the same run, is one
//! HTTP round trip to `/healthz`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::json;
use std::time::{Duration, Instant};
use switchyard_tests::{Broker, bin_dir};

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx]
}

fn millis(v: &serde_json::Value) -> i64 {
    let s = v.as_str().expect("a timestamp");
    chrono::DateTime::parse_from_rfc3339(s)
        .expect("RFC 3339")
        .timestamp_millis()
}

fn vm_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with(field))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let jobs: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(50);
    let mut broker = Broker::start().await;
    broker.start_agent("bench", 4).await;

    // Baseline: an HTTP round trip to the same broker.
    let mut rtt = Vec::new();
    for _ in 0..jobs {
        let t = Instant::now();
        let r = broker
            .http
            .get(format!("{}/healthz", broker.url))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success());
        rtt.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    rtt.sort_by(f64::total_cmp);

    let mut latencies = Vec::new();
    for i in 0..jobs {
        let id = broker
            .submit(json!({"name": format!("bench-{i}"), "team": "bench", "command": ["true"], "resources": {"gpus": 1}}))
            .await;
        let deadline = Instant::now() + Duration::from_secs(30);
        let job = loop {
            let job = broker.job(&id).await;
            if job["state"] == "succeeded" || job["state"] == "failed" {
                break job;
            }
            assert!(Instant::now() < deadline, "job {id} did not finish: {job}");
            tokio::time::sleep(Duration::from_millis(2)).await;
        };
        assert_eq!(job["state"], "succeeded", "{job}");
        latencies.push((millis(&job["started_at"]) - millis(&job["submitted_at"])) as f64);
    }
    latencies.sort_by(f64::total_cmp);

    // The agent idles (heartbeats and an open long-poll) before its memory is read.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let agent_pid = broker.agent(0).child.id();
    let rss = vm_kib(agent_pid, "VmRSS:").unwrap_or(0);
    let hwm = vm_kib(agent_pid, "VmHWM:").unwrap_or(0);
    let broker_rss = vm_kib(broker.proc.child.id(), "VmRSS:").unwrap_or(0);

    let size = |name: &str| {
        std::fs::metadata(bin_dir().join(name))
            .map(|m| m.len() as f64 / (1024.0 * 1024.0))
            .unwrap_or(f64::NAN)
    };
    println!("binaries from {}", bin_dir().display());
    println!("jobs: {jobs} (each on an idle agent, one at a time)");
    println!(
        "submit → running (ms, broker timestamps): median {:.0}, p90 {:.0}, max {:.0}",
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.9),
        latencies[latencies.len() - 1]
    );
    println!(
        "baseline GET /healthz round trip (ms): median {:.2}, p90 {:.2}",
        percentile(&rtt, 0.5),
        percentile(&rtt, 0.9)
    );
    println!(
        "ratio median submit→running / median round trip: {:.1}",
        percentile(&latencies, 0.5) / percentile(&rtt, 0.5).max(0.001)
    );
    println!(
        "agent idle RSS: {:.1} MiB (peak {:.1} MiB); broker RSS: {:.1} MiB",
        rss as f64 / 1024.0,
        hwm as f64 / 1024.0,
        broker_rss as f64 / 1024.0
    );
    println!(
        "binary sizes: switchyard {:.1} MiB, switchyard-agent {:.1} MiB",
        size("switchyard"),
        size("switchyard-agent")
    );
}

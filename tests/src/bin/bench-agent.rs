//! Measures the agent's cost of the heartbeat (issue 28, BENCHMARKS.md "Agent"): idle resident
//! memory and CPU per heartbeat with 8 simulated GPUs, for two agent binaries in the same run
//! against one real broker: the current one and a baseline (an older build).
//!
//! ```text
//! cargo build --workspace --bins            # the broker (debug is fine: it is not measured)
//! # release agents, each from its commit, sharing one target directory:
//! # (touch the sources: git archive dates files at their commit, and cargo would take a
//! # second tree older than the first build's outputs for already built)
//! git archive c45c63b | tar -x -C /tmp/base && (cd /tmp/base && find . -name '*.rs' -exec touch {} + \
//!   && CARGO_TARGET_DIR=/tmp/bench-target cargo build --release -p switchyard-agent) && \
//!   cp /tmp/bench-target/release/switchyard-agent /tmp/agent-base
//! git archive HEAD | tar -x -C /tmp/cur && (cd /tmp/cur && find . -name '*.rs' -exec touch {} + \
//!   && CARGO_TARGET_DIR=/tmp/bench-target cargo build --release -p switchyard-agent) && \
//!   cp /tmp/bench-target/release/switchyard-agent /tmp/agent-cur
//! target/debug/bench-agent /tmp/agent-cur /tmp/agent-base [SECONDS]
//! ```
//!
//! Each agent enrols with `--fake-gpus 8xH100-80GB --heartbeat-s 1`, settles for 5 s, then is
//! watched for SECONDS (default 60): its CPU time is the sum of its threads' on-CPU time
//! (`/proc/PID/task/*/schedstat`, nanoseconds), divided by the heartbeats the window holds (one
//! a second). That includes everything an idle agent does (its work long-poll too), so it is an
//! upper bound of one heartbeat's cost. RSS is `VmRSS` at the end of the window.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::json;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};
use switchyard_tests::{Broker, POOL, Proc};

/// Summed on-CPU time of every thread of `pid`, in nanoseconds.
fn cpu_ns(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .filter_map(Result::ok)
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
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

async fn start_agent(broker: &Broker, program: &PathBuf, name: &str) -> Proc {
    let (status, body) = broker
        .call(
            reqwest::Method::POST,
            "/api/v1/enrolment-tokens",
            Some(json!({"pool": POOL})),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let token = body["token"].as_str().unwrap().to_string();
    let mut cmd = Command::new(program);
    cmd.args([
        "--broker",
        &broker.url,
        "--name",
        name,
        "--fake-gpus",
        "8xH100-80GB",
        "--heartbeat-s",
        "1",
    ])
    .env("SWITCHYARD_ENROL_TOKEN", &token)
    .env("RUST_LOG", "warn");
    let log = broker.dir.path().join(format!("agent-{name}.log"));
    Proc::spawn(name, cmd, &log).unwrap()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut args = std::env::args().skip(1);
    let usage = "usage: bench-agent CURRENT_AGENT BASELINE_AGENT [SECONDS]";
    let current = PathBuf::from(args.next().expect(usage));
    let baseline = PathBuf::from(args.next().expect(usage));
    let seconds: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(60);
    let broker = Broker::start().await;
    let agents = [("current", &current), ("baseline", &baseline)];
    let mut procs = Vec::new();
    for (name, program) in agents {
        procs.push((name, start_agent(&broker, program, name).await));
    }
    // Both enrolled and heartbeating (the pool's node count is how the harness knows).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, pools) = broker
            .call(reqwest::Method::GET, "/api/v1/pools", None)
            .await;
        let nodes = pools["pools"]
            .as_array()
            .and_then(|p| p.iter().find(|p| p["id"] == POOL))
            .and_then(|p| p["nodes"].as_u64())
            .unwrap_or(0);
        if nodes >= 2 {
            break;
        }
        assert!(Instant::now() < deadline, "the agents did not enrol");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    let pids: Vec<u32> = procs.iter().map(|(_, p)| p.pid() as u32).collect();
    let before: Vec<u64> = pids.iter().map(|p| cpu_ns(*p)).collect();
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let elapsed = t0.elapsed().as_secs_f64();
    let after: Vec<u64> = pids.iter().map(|p| cpu_ns(*p)).collect();
    let beats = elapsed.floor().max(1.0);
    println!(
        "agent      RSS (MiB)  peak RSS (MiB)  CPU per heartbeat (ms)  CPU (% of a core)  [{} s, 8 simulated H100, 1 s heartbeats]",
        elapsed.round()
    );
    for (i, (name, _)) in procs.iter().enumerate() {
        let cpu_ms = after[i].saturating_sub(before[i]) as f64 / 1e6;
        let rss = vm_kib(pids[i], "VmRSS:").unwrap_or(0) as f64 / 1024.0;
        let hwm = vm_kib(pids[i], "VmHWM:").unwrap_or(0) as f64 / 1024.0;
        println!(
            "{name:<10} {rss:>9.1}  {hwm:>14.1}  {:>22.3}  {:>17.3}",
            cpu_ms / beats,
            cpu_ms / elapsed / 10.0
        );
    }
    drop(procs);
}

//! Restarts that lose nothing, and an enrolment endpoint that a flood cannot swell, against the
//! real binaries:
//! - `switchyard up` killed with -9: its agents see their stdin pipe close and exit, and the
//!   next `up` on the same data directory retires the old nodes (their running job goes back
//!   to the queue with a reason and runs again) instead of counting them as capacity;
//! - Ctrl-C of `up`: the agents drain, each running job gets its checkpoint signal and ends
//!   `preempted` with its job back in `queued`, never `failed`;
//! - 25 concurrent 11.5 MB registrations with made-up enrolment tokens: refused before their
//!   bodies are read, so the broker's peak RSS grows by less than 64 MiB.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use nix::sys::signal::Signal;
use serde_json::{Value, json};
use std::path::Path;
use std::process::Command;
use std::time::Duration;
use switchyard_tests::{Broker, Proc, Up, bin, eventually, processes_matching};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// `switchyard up` again on `up`'s data directory and port (a restart); returns once it
/// answers.
async fn restart(up: &mut Up) {
    let port = port_of(&up.url);
    let mut cmd = Command::new(bin("switchyard"));
    cmd.args(["up", "--port", &port])
        .arg("--data-dir")
        .arg(&up.data);
    up.proc = Proc::spawn("up", cmd, &up.dir.path().join("up-again.log")).unwrap();
    eventually(
        "the restarted up to answer",
        Duration::from_secs(30),
        || async {
            up.http
                .get(format!("{}/readyz", up.url))
                .send()
                .await
                .ok()
                .filter(|r| r.status().is_success())
        },
    )
    .await;
}

/// The on-prem agents of the `up` on `port` that still run.
fn onprem_agents(port: &str) -> Vec<(i32, String)> {
    alive(&format!("127.0.0.1:{port}"))
        .into_iter()
        .filter(|(_, cmdline)| cmdline.contains("onprem-"))
        .collect()
}

fn port_of(url: &str) -> String {
    url.rsplit(':').next().unwrap().to_string()
}

/// A job that runs until stopped and says so when it gets SIGTERM (its checkpoint signal).
fn long_job(marker: &str) -> Value {
    json!({
        "name": "long", "team": "ml", "command": ["sh", "-c",
            format!("trap 'echo checkpointed {marker}; exit 0' TERM; echo started {marker}; \
                     while true; do sleep 0.2; done")],
        "resources": {"gpus": 1}, "estimated_runtime_s": 3600
    })
}

/// The processes whose command line mentions `needle`, besides this test itself.
fn alive(needle: &str) -> Vec<(i32, String)> {
    let me = std::process::id() as i32;
    processes_matching(needle)
        .into_iter()
        .filter(|(pid, _)| *pid != me)
        .collect()
}

/// Healthy on-prem nodes and their GPUs, as the pools API shows them.
async fn onprem(up: &Up) -> (u64, u64) {
    let pools = up.get("/api/v1/pools").await;
    let p = pools["pools"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["provider"] == "onprem").cloned())
        .unwrap_or(Value::Null);
    (
        p["nodes"].as_u64().unwrap_or(0),
        p["gpus_total"].as_u64().unwrap_or(0),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn up_killed_with_9_takes_its_agents_along_and_the_next_up_retires_their_nodes() {
    let mut up = Up::start(&[], 8).await;
    let port = port_of(&up.url);
    let marker = format!("marker-{}", uuid_like());
    let id = up.submit(long_job(&marker)).await;
    up.job_where(&id, 60, |j| j["state"] == "running").await;
    let broker_arg = format!("127.0.0.1:{port}");
    assert_eq!(onprem_agents(&port).len(), 2, "up's two agents");

    up.proc.signal_group(Signal::SIGKILL);
    up.proc.wait_exit(Duration::from_secs(10)).unwrap();
    // The agents' stdin pipe closed with `up`: they drain and exit, and take the job along.
    eventually(
        "the agents of the killed up to exit",
        Duration::from_secs(30),
        || async { (alive(&broker_arg).is_empty() && alive(&marker).is_empty()).then_some(()) },
    )
    .await;

    restart(&mut up).await;
    // Exactly the configured capacity: the old nodes are retired, not counted beside the new.
    eventually(
        "two on-prem nodes with 8 GPUs",
        Duration::from_secs(60),
        || async { (onprem(&up).await == (2, 8)).then_some(()) },
    )
    .await;
    // The job that ran on a node of the old run runs again, on a new node.
    let job = up
        .job_where(&id, 60, |j| {
            j["state"] == "running" && j["attempts"].as_u64() == Some(2)
        })
        .await;
    let node = job["placement"]["node"].as_str().unwrap().to_string();
    let pools = up.get("/api/v1/pools").await;
    let nodes = |provider_is_onprem: bool| -> Vec<String> {
        pools["pools"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| !provider_is_onprem || p["provider"] == "onprem")
            .flat_map(|p| p["node_list"].as_array().cloned().unwrap_or_default())
            .map(|n| n["id"].as_str().unwrap().to_string())
            .collect()
    };
    // (While the new agents enrolled the planner may have sent the job to a cloud pool.)
    assert!(
        nodes(false).contains(&node),
        "{node} not in {:?}",
        nodes(false)
    );
    assert_eq!(nodes(true).len(), 2, "{:?}", nodes(true));
    // Why it ran again is on its first attempt, in the database.
    let db = up.data.join("switchyard.db");
    let attempts = attempt_rows(&db, &id).await;
    assert_eq!(attempts[0].0, "lost", "{attempts:?}");
    assert!(
        attempts[0].1.contains("earlier run of `switchyard up`"),
        "{attempts:?}"
    );
    assert_eq!(onprem_agents(&port).len(), 2, "two on-prem agents, no more");
}

#[tokio::test(flavor = "multi_thread")]
async fn ctrl_c_of_up_hands_running_jobs_back_instead_of_failing_them() {
    let mut up = Up::start(&[], 8).await;
    let marker = format!("marker-{}", uuid_like());
    let id = up.submit(long_job(&marker)).await;
    up.job_where(&id, 60, |j| j["state"] == "running").await;
    eventually(
        "the job's first output",
        Duration::from_secs(20),
        || async {
            let logs = up.get(&format!("/api/v1/jobs/{id}/logs")).await;
            logs.to_string().contains("started").then_some(())
        },
    )
    .await;

    up.proc.signal_group(Signal::SIGINT);
    let status = up.proc.wait_exit(Duration::from_secs(40)).unwrap();
    assert!(status.success(), "{status:?}");
    assert!(alive(&marker).is_empty());

    let db = up.data.join("switchyard.db");
    let attempts = attempt_rows(&db, &id).await;
    assert_eq!(attempts.len(), 1, "{attempts:?}");
    assert_eq!(attempts[0].0, "preempted", "{attempts:?}");
    let (state, reason) = job_row(&db, &id).await;
    assert_eq!(state, "queued");
    assert!(reason.contains("checkpoint signal"), "{reason}");

    // It got the signal and said so; the next `up` runs it again.
    restart(&mut up).await;
    up.job_where(&id, 60, |j| {
        j["state"] == "running" && j["attempts"].as_u64() == Some(2)
    })
    .await;
    let logs = up.get(&format!("/api/v1/jobs/{id}/logs")).await;
    assert!(
        logs.to_string().contains(&format!("checkpointed {marker}")),
        "{logs}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_flood_of_bogus_registrations_is_refused_before_its_bodies_are_read() {
    let broker = Broker::start().await;
    let pid = broker.proc.pid();
    // Warm up the allocator and the connection paths first.
    for _ in 0..5 {
        let r = broker
            .http
            .post(format!("{}/agent/v1/register", broker.url))
            .bearer_auth("sye_warm_up")
            .json(&json!({}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 403);
    }
    let before = peak_rss_kib(pid);
    const BODY: usize = 11_500_000;
    let addr = broker.url.trim_start_matches("http://").to_string();
    let mut tasks = Vec::new();
    for i in 0..25 {
        let (http, url, addr) = (broker.http.clone(), broker.url.clone(), addr.clone());
        tasks.push(tokio::spawn(async move {
            if i % 2 == 0 {
                // With its length declared.
                let r = http
                    .post(format!("{url}/agent/v1/register"))
                    .bearer_auth(format!("sye_made_up_{i}"))
                    .header("content-type", "application/json")
                    .body(vec![b' '; BODY])
                    .send()
                    .await;
                r.map(|r| r.status().as_u16()).unwrap_or(0)
            } else {
                chunked_flood(&addr, &format!("sye_made_up_{i}"), BODY).await
            }
        }));
    }
    for t in tasks {
        let status = t.await.unwrap();
        // 403 (unknown token) or, for the declared length, 413 before the token is looked at;
        // 0 when the broker closed the connection while the client was still sending.
        assert!(matches!(status, 0 | 403 | 413), "{status}");
    }
    let after = peak_rss_kib(pid);
    let growth_mib = (after.saturating_sub(before)) as f64 / 1024.0;
    eprintln!("peak RSS {before} KiB → {after} KiB (+{growth_mib:.1} MiB)");
    assert!(growth_mib < 64.0, "peak RSS grew by {growth_mib:.1} MiB");
    // Still serving.
    let r = broker
        .http
        .get(format!("{}/readyz", broker.url))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
}

/// One registration with a chunked body of `len` bytes over a raw connection; the status the
/// broker answered (0 when it closed the connection first).
async fn chunked_flood(addr: &str, token: &str, len: usize) -> u16 {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /agent/v1/register HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    );
    if s.write_all(head.as_bytes()).await.is_err() {
        return 0;
    }
    let chunk = vec![b' '; 64 * 1024];
    let mut sent = 0;
    let mut answer = Vec::new();
    while sent < len {
        let frame = [
            format!("{:x}\r\n", chunk.len()).into_bytes(),
            chunk.clone(),
            b"\r\n".to_vec(),
        ]
        .concat();
        if s.write_all(&frame).await.is_err() {
            break;
        }
        sent += chunk.len();
        // The answer may come (and the connection close) long before the body is sent.
        let mut buf = [0u8; 512];
        if let Ok(Ok(n)) = tokio::time::timeout(Duration::from_millis(1), s.read(&mut buf)).await {
            if n == 0 {
                break;
            }
            answer.extend_from_slice(&buf[..n]);
            break;
        }
    }
    if answer.is_empty() {
        let _ = s.write_all(b"0\r\n\r\n").await;
        let mut buf = [0u8; 512];
        if let Ok(Ok(n)) = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf)).await {
            answer.extend_from_slice(&buf[..n]);
        }
    }
    let text = String::from_utf8_lossy(&answer);
    text.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

/// The peak resident set size of process `pid` (`VmHWM`), in KiB.
fn peak_rss_kib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap()
}

/// The attempts of job `id` in the SQLite database at `db`, oldest first: state and error.
async fn attempt_rows(db: &Path, id: &str) -> Vec<(String, String)> {
    let pool = sqlite(db).await;
    let rows: Vec<(String, Option<String>)> =
        sqlx::query_as("SELECT state, error FROM attempts WHERE job_id = $1 ORDER BY attempt_no")
            .bind(id)
            .fetch_all(&pool)
            .await
            .unwrap();
    pool.close().await;
    rows.into_iter()
        .map(|(s, e)| (s, e.unwrap_or_default()))
        .collect()
}

/// The state and reason of job `id` in the SQLite database at `db`.
async fn job_row(db: &Path, id: &str) -> (String, String) {
    let pool = sqlite(db).await;
    let (state, reason): (String, Option<String>) =
        sqlx::query_as("SELECT state, reason FROM jobs WHERE id = $1")
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap();
    pool.close().await;
    (state, reason.unwrap_or_default())
}

async fn sqlite(db: &Path) -> sqlx::SqlitePool {
    let opts = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(db)
        .read_only(true);
    sqlx::SqlitePool::connect_with(opts).await.unwrap()
}

/// A marker unique to this test run, for finding its processes.
fn uuid_like() -> String {
    format!(
        "{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    )
}

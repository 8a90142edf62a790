//! Load figures of BENCHMARKS.md "Load": durable submissions per second and their latency at a
//! fixed rate, many agents heartbeating, and listing a team's jobs in a large history. Each
//! phase starts a real `switchyard serve` (release build) on a fresh SQLite database and reports
//! ratios against a baseline measured in the same run (an HTTP round trip to `/healthz` with the
//! same concurrency), since the machine is shared and noisy. Run with
//!
//! ```text
//! cargo build --release -p switchyard-broker -p switchyard-agent
//! cargo run --release -p switchyard-tests --bin bench-load -- [submit|heartbeat|heartbeat8|list|all]
//! ```
//!
//! `heartbeat8` runs 10,000 agents with 4 GPUs and the first stage's readings, then with 8 GPUs
//! and every reading an NVML agent sends since issue 28, one after the other on fresh brokers.
//!
//! `SWITCHYARD_BENCH_DATABASE_URL=postgres://…/db` runs the broker on PostgreSQL instead (the
//! `list` phase then fills PostgreSQL directly). `scripts/bench-pg.sh` starts a throwaway,
//! durable PostgreSQL cluster and runs the phases on it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use reqwest::Method;
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use switchyard_tests::Broker;

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx]
}

/// CPU seconds (user + system) the process has used so far.
fn cpu_seconds(pid: i32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may contain spaces) start after the last ')'.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    ticks / 100.0 // USER_HZ is 100 on Linux
}

async fn start_broker(extra: &str) -> Broker {
    let db = std::env::var("SWITCHYARD_BENCH_DATABASE_URL").ok();
    // One token drives each phase far past the per-token rate limit (limits.rs): off here.
    let mut extra = format!("rate_limit_per_s = 0\n{extra}");
    if let Some(url) = db {
        extra.push_str(&format!("\ndatabase_url = \"{url}\"\n"));
    }
    Broker::start_with(&extra).await
}

async fn developer_token(broker: &Broker, team: &str) -> String {
    let (status, body) = broker
        .call(
            Method::POST,
            "/api/v1/tokens",
            Some(json!({"role": "developer", "team": team, "name": "bench"})),
        )
        .await;
    assert!((200..300).contains(&status), "{body}");
    body["token"].as_str().unwrap().to_string()
}

fn spec(i: u64) -> Value {
    json!({"name": format!("load-{i}"), "team": "ml", "command": ["true"],
           "resources": {"gpus": 1}, "estimated_runtime_s": 600})
}

/// `clients` tasks run `op` back to back for `secs`; returns operations per second.
async fn closed_loop<F, Fut>(clients: usize, secs: u64, op: F) -> f64
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let op = Arc::new(op);
    let done = Arc::new(AtomicU64::new(0));
    let seq = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let end = start + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (op, done, seq) = (op.clone(), done.clone(), seq.clone());
        tasks.push(tokio::spawn(async move {
            while Instant::now() < end {
                if op(seq.fetch_add(1, Ordering::Relaxed)).await {
                    done.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

async fn submit_phase() {
    let broker = start_broker("").await;
    let dev = developer_token(&broker, "ml").await;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        .build()
        .unwrap();
    let clients = 64;
    let secs = 5;

    let (h, url) = (http.clone(), broker.url.clone());
    let baseline = closed_loop(clients, secs, move |_| {
        let (h, url) = (h.clone(), url.clone());
        async move {
            h.get(format!("{url}/healthz"))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
        }
    })
    .await;

    let (h, url, tok) = (http.clone(), broker.url.clone(), dev.clone());
    let submits = closed_loop(clients, secs, move |i| {
        let (h, url, tok) = (h.clone(), url.clone(), tok.clone());
        async move {
            h.post(format!("{url}/api/v1/jobs"))
                .bearer_auth(&tok)
                .json(&spec(i))
                .send()
                .await
                .is_ok_and(|r| r.status().as_u16() == 201)
        }
    })
    .await;
    println!(
        "submit: {submits:.0} jobs/s acknowledged ({clients} clients, {secs} s); \
         /healthz baseline {baseline:.0} req/s; ratio {:.2}",
        submits / baseline
    );

    // Open loop at a fixed rate: latency of each acknowledged submission.
    for rate in [1000u64] {
        let n = rate * 5;
        let interval = Duration::from_nanos(1_000_000_000 / rate);
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        let mut tasks = Vec::with_capacity(n as usize);
        let started = Instant::now();
        for i in 0..n {
            ticker.tick().await;
            let (h, url, tok) = (http.clone(), broker.url.clone(), dev.clone());
            tasks.push(tokio::spawn(async move {
                let t = Instant::now();
                let ok = h
                    .post(format!("{url}/api/v1/jobs"))
                    .bearer_auth(&tok)
                    .json(&spec(1_000_000 + i))
                    .send()
                    .await
                    .is_ok_and(|r| r.status().as_u16() == 201);
                (ok, t.elapsed().as_secs_f64() * 1000.0)
            }));
        }
        let mut lat = Vec::with_capacity(n as usize);
        let mut failed = 0;
        for t in tasks {
            let (ok, ms) = t.await.unwrap();
            if ok {
                lat.push(ms);
            } else {
                failed += 1;
            }
        }
        let offered = n as f64 / started.elapsed().as_secs_f64();
        lat.sort_by(f64::total_cmp);
        println!(
            "submit at {rate}/s (offered {offered:.0}/s, {n} jobs): p50 {:.1} ms, p99 {:.1} ms, \
             max {:.1} ms, failed {failed}",
            percentile(&lat, 0.5),
            percentile(&lat, 0.99),
            lat.last().copied().unwrap_or(f64::NAN)
        );
    }
}

async fn heartbeat_phase(agents: usize, gpus: u32, rich: bool) {
    let broker = start_broker("heartbeat_interval_s = 10\nlease_ttl_s = 60\n").await;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        .build()
        .unwrap();
    // Enrol the agents (each with its own one-time token), 32 at a time.
    let registered = Instant::now();
    let tokens = Arc::new(tokio::sync::Mutex::new(Vec::with_capacity(agents)));
    let sem = Arc::new(tokio::sync::Semaphore::new(32));
    let mut tasks = Vec::new();
    for i in 0..agents {
        let (http, url, admin, tokens, sem) = (
            http.clone(),
            broker.url.clone(),
            broker.admin.clone(),
            tokens.clone(),
            sem.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let _permit = sem.acquire().await.unwrap();
            let r: Value = http
                .post(format!("{url}/api/v1/enrolment-tokens"))
                .bearer_auth(&admin)
                .json(&json!({"pool": switchyard_tests::POOL}))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            let enrol = r["token"].as_str().unwrap().to_string();
            let r: Value = http
                .post(format!("{url}/agent/v1/register"))
                .bearer_auth(&enrol)
                .json(&json!({"hostname": format!("sim-{i}"),
                              "agent_version": "bench", "inventory": inventory(gpus, rich)}))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            tokens
                .lock()
                .await
                .push(r["agent_token"].as_str().unwrap().to_string());
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let tokens = Arc::new(tokens.lock().await.clone());
    println!(
        "heartbeat: {} agents enrolled in {:.1} s",
        tokens.len(),
        registered.elapsed().as_secs_f64()
    );

    // Every agent heartbeats every 10 s, spread evenly: agents/10 heartbeats a second.
    let window = Duration::from_secs(30);
    let per_s = agents as f64 / 10.0;
    let interval = Duration::from_secs_f64(1.0 / per_s);
    let pid = broker.proc.pid();
    let cpu0 = cpu_seconds(pid);
    let t0 = Instant::now();
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let sent = Arc::new(AtomicU64::new(0));
    let ok = Arc::new(AtomicU64::new(0));
    let mut i = 0usize;
    let mut tasks = Vec::new();
    while t0.elapsed() < window {
        ticker.tick().await;
        let token = tokens[i % tokens.len()].clone();
        i += 1;
        let (http, url, sent, ok) = (http.clone(), broker.url.clone(), sent.clone(), ok.clone());
        tasks.push(tokio::spawn(async move {
            sent.fetch_add(1, Ordering::Relaxed);
            let r = http
                .post(format!("{url}/agent/v1/heartbeat"))
                .bearer_auth(&token)
                .json(&json!({"inventory": inventory(gpus, rich), "running": []}))
                .send()
                .await;
            if r.is_ok_and(|r| r.status().is_success()) {
                ok.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let wall = t0.elapsed().as_secs_f64();
    let cpu = cpu_seconds(pid) - cpu0;
    println!(
        "heartbeat: {agents} agents × {gpus} GPUs ({}) every 10 s = {per_s:.0}/s offered, {} \
         answered OK of {} in {wall:.1} s; broker CPU {:.3} cores ({cpu:.1} CPU s)",
        if rich {
            "full telemetry"
        } else {
            "first-stage readings"
        },
        ok.load(Ordering::Relaxed),
        sent.load(Ordering::Relaxed),
        cpu / wall
    );
}

/// An agent's inventory: `gpus` H100s with the first stage's four readings, or (`rich`) with
/// everything a real NVML agent sends since issue 28 (vendor, SM clock, slowdown threshold,
/// profiling, ECC counts, throttle reasons).
fn inventory(gpus: u32, rich: bool) -> Value {
    let gpus: Vec<Value> = (0..gpus)
        .map(|i| {
            let mut g = json!({"index": i, "uuid": format!("GPU-{i}"), "model": "H100",
                               "memory_mb": 81920, "memory_used_mb": 1024,
                               "utilization_pct": 50, "temperature_c": 60, "power_w": 300.0});
            if rich {
                g["vendor"] = json!("nvidia");
                g["sm_clock_mhz"] = json!(1755);
                g["slowdown_temp_c"] = json!(90);
                g["profiling"] = json!({"sm_active_pct": 48.5, "sm_occupancy_pct": 30.25,
                                        "dram_active_pct": 22.0});
                g["health"] = json!({"ecc_corrected_volatile": 0, "ecc_uncorrected_volatile": 0,
                                     "throttle_reasons": ["sw_power_cap"], "retired_pages": 0});
            }
            g
        })
        .collect();
    json!({"gpus": gpus, "cpus": 64, "memory_mb": 524288, "simulated": true})
}

async fn list_phase(jobs: u64) {
    // Fill the history straight into SQLite with the broker stopped (a broker at 2,000
    // submissions/s would take minutes), then list through the API like a user would.
    let mut broker = start_broker("").await;
    let dev = developer_token(&broker, "team-7").await;
    // One real job of the team: its stored row is the template of the generated history.
    let (status, body) = broker
        .call(
            Method::POST,
            "/api/v1/jobs",
            Some(
                json!({"name": "template", "team": "team-7", "command": ["true"],
                        "resources": {"gpus": 1}}),
            ),
        )
        .await;
    assert!((200..300).contains(&status), "{body}");
    broker.proc.signal_group(nix::sys::signal::Signal::SIGTERM);
    broker.proc.wait_exit(Duration::from_secs(20)).unwrap();

    let filled = Instant::now();
    // UUIDv7-shaped ids in time order (48-bit milliseconds first), 100 teams, nine in ten
    // succeeded and one in seven failed, all finished: history the scheduler does not load.
    let base_ms: i64 = 1_767_225_600_000; // 2026-01-01
    let total: i64 = match std::env::var("SWITCHYARD_BENCH_DATABASE_URL") {
        Ok(url) => {
            let pool = sqlx::PgPool::connect(&url).await.unwrap();
            sqlx::query(
                "INSERT INTO jobs (id, team, project, name, state, priority, kind, spec_json, \
                 core_spec_json, submitted_at, finished_at, exit_code, attempts, version) \
                 SELECT (lpad(to_hex(($2 + i * 30) >> 16), 8, '0') || '-' || \
                         lpad(to_hex(($2 + i * 30) & 65535), 4, '0') || '-7000-8000-' || \
                         lpad(to_hex(i), 12, '0'))::uuid, \
                        'team-' || (i % 100), t.project, 'hist-' || i, \
                        CASE WHEN i % 7 = 0 THEN 'failed' ELSE 'succeeded' END, t.priority, \
                        t.kind, \
                        replace(t.spec_json, '\"team-7\"', '\"team-' || (i % 100) || '\"'), \
                        replace(t.core_spec_json, '\"team-7\"', '\"team-' || (i % 100) || '\"'), \
                        to_timestamp(($2 + i * 30) / 1000.0), \
                        to_timestamp(($2 + i * 30 + 600000) / 1000.0), \
                        CASE WHEN i % 7 = 0 THEN 1 ELSE 0 END, 1, 2 \
                 FROM generate_series(1::bigint, $1) AS i, \
                      (SELECT * FROM jobs WHERE name = 'template') t",
            )
            .bind(jobs as i64)
            .bind(base_ms)
            .execute(&pool)
            .await
            .unwrap();
            // What autovacuum would do minutes later: fresh planner statistics.
            sqlx::query("ANALYZE jobs").execute(&pool).await.unwrap();
            let total = sqlx::query_scalar("SELECT COUNT(*) FROM jobs")
                .fetch_one(&pool)
                .await
                .unwrap();
            pool.close().await;
            total
        }
        Err(_) => {
            let db = broker.dir.path().join("data/switchyard.db");
            let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", db.display()))
                .await
                .unwrap();
            sqlx::query(
                "INSERT INTO jobs (id, team, project, name, state, priority, kind, spec_json, \
                 core_spec_json, submitted_at, finished_at, exit_code, attempts, version) \
                 WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < $1) \
                 SELECT printf('%08x-%04x-7000-8000-%012x', ($2 + i * 30) >> 16, ($2 + i * 30) & 65535, i), \
                        'team-' || (i % 100), t.project, 'hist-' || i, \
                        CASE WHEN i % 7 = 0 THEN 'failed' ELSE 'succeeded' END, t.priority, t.kind, \
                        replace(t.spec_json, '\"team-7\"', '\"team-' || (i % 100) || '\"'), \
                        replace(t.core_spec_json, '\"team-7\"', '\"team-' || (i % 100) || '\"'), \
                        $2 + i * 30, $2 + i * 30 + 600000, CASE WHEN i % 7 = 0 THEN 1 ELSE 0 END, 1, 2 \
                 FROM n, (SELECT * FROM jobs WHERE name = 'template') t",
            )
            .bind(jobs as i64)
            .bind(base_ms)
            .execute(&pool)
            .await
            .unwrap();
            let total = sqlx::query_scalar("SELECT COUNT(*) FROM jobs")
                .fetch_one(&pool)
                .await
                .unwrap();
            pool.close().await;
            total
        }
    };
    println!(
        "list: {total} jobs in the database (filled in {:.1} s)",
        filled.elapsed().as_secs_f64()
    );
    broker.restart().await;

    let http = reqwest::Client::new();
    let get = |path: String| {
        let (http, url, dev) = (http.clone(), broker.url.clone(), dev.clone());
        async move {
            let t = Instant::now();
            let r = http
                .get(format!("{url}{path}"))
                .bearer_auth(&dev)
                .send()
                .await
                .unwrap();
            assert!(r.status().is_success(), "{path}: {}", r.status());
            let body: Value = r.json().await.unwrap();
            (t.elapsed().as_secs_f64() * 1000.0, body)
        }
    };
    let report = |what: &str, mut lat: Vec<f64>| {
        lat.sort_by(f64::total_cmp);
        println!(
            "list: {what}: p50 {:.2} ms, p99 {:.2} ms over {} requests",
            percentile(&lat, 0.5),
            percentile(&lat, 0.99),
            lat.len()
        );
    };
    let rounds = 200;
    let mut base = Vec::new();
    for _ in 0..rounds {
        base.push(get("/healthz".into()).await.0);
    }
    report("baseline /healthz", base);
    for (what, path) in [
        ("team's recent jobs (limit 50)", "/api/v1/jobs?limit=50"),
        (
            "team's recent failed jobs (state filter, limit 50)",
            "/api/v1/jobs?state=failed&limit=50",
        ),
    ] {
        let mut lat = Vec::new();
        let mut cursor: Option<String> = None;
        for i in 0..rounds {
            // Every other request pages on from the last cursor, as a user scrolling.
            let p = match (&cursor, i % 2) {
                (Some(c), 1) => format!("{path}&cursor={c}"),
                _ => path.to_string(),
            };
            let (ms, body) = get(p).await;
            assert_eq!(body["jobs"].as_array().unwrap().len(), 50, "{body}");
            cursor = body["next_cursor"].as_str().map(str::to_string);
            lat.push(ms);
        }
        report(what, lat);
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let phase = std::env::args().nth(1).unwrap_or_else(|| "all".into());
    if matches!(phase.as_str(), "submit" | "all") {
        submit_phase().await;
    }
    if phase == "heartbeat" {
        heartbeat_phase(10_000, 4, false).await;
    }
    // Issue 28's heartbeat beside the first stage's, in the same run.
    if matches!(phase.as_str(), "heartbeat8" | "all") {
        heartbeat_phase(10_000, 4, false).await;
        heartbeat_phase(10_000, 8, true).await;
    }
    if matches!(phase.as_str(), "list" | "all") {
        list_phase(1_000_000).await;
    }
}

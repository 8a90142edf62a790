//! Measures the figures of BENCHMARKS.md "Services gateway": what the services gateway adds to
//! a request's latency at a fixed request rate, against calling the replicas directly in the
//! same run, and the standalone gateway's resident memory. Run with
//! `cargo run --release -p switchyard-tests --bin bench-gateway -- [--rate 2000] [--duration-s 10]`
//! after `cargo build --release --workspace`.
//!
//! Set-up: `switchyard up` (the broker, its agents) runs a service whose replicas are model
//! emulators in `--instant` mode (they answer at once, so the figures are the data path's
//! alone); a standalone `switchyard gateway` routes to them, as in production. Load is open
//! loop: requests are sent on a fixed schedule whatever the answers do (checked every 1 ms
//! tick, so up to rate/1000 leave together), over keep-alive connections. Rounds alternate the
//! targets — direct (round robin over the replicas), the standalone gateway and, with
//! `--in-process`, the gateway inside `up` — so slow drift of the machine hits each alike.
//!
//! Latency is from a request's send to its whole answer read. The client's lag (how late a
//! request left against its schedule) is reported beside it: when it is large, the machine
//! could not keep the rate and the figures say so. Everything here — client, gateway, broker,
//! agents, replicas — shares one machine's cores.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use clap::Parser;
use serde_json::{Value, json};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};
use switchyard_tests::{Proc, Up, bin, bin_dir, eventually, free_port};

#[derive(Parser, Debug)]
#[command(
    name = "bench-gateway",
    about = "The services gateway's overhead and memory"
)]
struct Args {
    /// Requests per second, for every target.
    #[arg(long, default_value_t = 2000)]
    rate: u32,
    /// Seconds of measured load per target and round.
    #[arg(long, default_value_t = 10)]
    duration_s: u64,
    /// Rounds; each runs every target once, in turn.
    #[arg(long, default_value_t = 2)]
    rounds: u32,
    /// Seconds of unmeasured load per target before the first round (fills connection pools).
    #[arg(long, default_value_t = 2)]
    warmup_s: u64,
    /// Replicas of the service.
    #[arg(long, default_value_t = 2)]
    replicas: u32,
    /// Also measure the gateway that runs inside `switchyard up`.
    #[arg(long)]
    in_process: bool,
    /// Write every measured request to this CSV file (target, round, sent at µs from the
    /// round's start, latency µs, ok): to see whether slow answers cluster in time.
    #[arg(long, value_name = "FILE")]
    dump: Option<std::path::PathBuf>,
}

/// Where requests go in one phase.
#[derive(Clone)]
struct Target {
    name: &'static str,
    /// Round robin over these URLs.
    urls: Arc<Vec<String>>,
    token: Option<String>,
    client: reqwest::Client,
}

/// One phase's outcome.
#[derive(Default)]
struct Samples {
    /// Send to whole answer, microseconds, successful requests only.
    latency_us: Vec<u64>,
    /// Every request: when it left (µs from the phase's start), its latency (µs), whether it
    /// was answered.
    trace: Vec<(u64, u64, bool)>,
    /// How late each request left against its schedule, microseconds.
    lag_us: Vec<u64>,
    errors: u64,
    first_error: Option<String>,
    sent: u64,
}

impl Samples {
    fn merge(&mut self, other: Samples) {
        self.latency_us.extend(other.latency_us);
        self.lag_us.extend(other.lag_us);
        self.trace.extend(other.trace);
        self.errors += other.errors;
        self.sent += other.sent;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
    }
}

fn percentile_ms(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx] as f64 / 1000.0
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

/// CPU seconds (user + system) a process has used, from `/proc/PID/stat`.
fn cpu_s(pid: u32, ticks_per_s: f64) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces), from field 3 on: utime is the
    // 14th field, stime the 15th.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / ticks_per_s)
}

/// Clock ticks per second of `/proc/PID/stat` times (`getconf CLK_TCK`; 100 on Linux).
fn clock_ticks() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// The machine's load averages, so a reader sees what else ran.
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn mib(kib: Option<u64>) -> String {
    kib.map(|k| format!("{:.1} MiB", k as f64 / 1024.0))
        .unwrap_or_else(|| "n/a".into())
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .http1_only()
        .tcp_nodelay(true)
        .pool_max_idle_per_host(1024)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// The request every target gets: a short completion.
fn body() -> Value {
    json!({"prompt_tokens": 16, "max_tokens": 16})
}

/// Drives `target` at `rate` requests per second for `duration`, open loop.
async fn drive(target: &Target, rate: u32, duration: Duration) -> Samples {
    let total = (u128::from(rate) * duration.as_millis() / 1000) as u64;
    let interval = Duration::from_secs_f64(1.0 / f64::from(rate));
    let start = Instant::now() + Duration::from_millis(20);
    let body = Arc::new(serde_json::to_vec(&body()).unwrap());
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut next = 0u64;
    while next < total {
        let now = Instant::now();
        // Every request whose time has come leaves now.
        while next < total {
            let due = start + interval.mul_f64(next as f64);
            if due > now {
                break;
            }
            let lag = now.duration_since(due);
            let url = target.urls[(next as usize) % target.urls.len()].clone();
            let mut req = target
                .client
                .post(url)
                .header("content-type", "application/json")
                .body(body.as_ref().clone());
            if let Some(t) = &target.token {
                req = req.bearer_auth(t);
            }
            let tx = tx.clone();
            tokio::spawn(async move {
                let sent = Instant::now();
                let outcome = match req.send().await {
                    Ok(r) if r.status().is_success() => match r.bytes().await {
                        Ok(_) => Ok(sent.elapsed()),
                        Err(e) => Err(format!("reading the answer: {e}")),
                    },
                    Ok(r) => Err(format!("status {}", r.status())),
                    Err(e) => Err(format!("{e}")),
                };
                let _ = tx.send((outcome, lag, sent.duration_since(start)));
            });
            next += 1;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    drop(tx);
    let mut s = Samples {
        sent: total,
        ..Samples::default()
    };
    while let Some((outcome, lag, at)) = rx.recv().await {
        s.lag_us.push(lag.as_micros() as u64);
        let at = at.as_micros() as u64;
        match outcome {
            Ok(d) => {
                s.latency_us.push(d.as_micros() as u64);
                s.trace.push((at, d.as_micros() as u64, true));
            }
            Err(e) => {
                s.trace.push((at, 0, false));
                s.errors += 1;
                s.first_error.get_or_insert(e);
            }
        }
    }
    s
}

/// Posts the service; returns its id and endpoint.
async fn deploy(up: &Up, replicas: u32) -> (String, String) {
    let spec = json!({
        "name": "bench", "team": "bench",
        "command": [bin("model-emulator").display().to_string(), "--instant", "--slots", "1024"],
        "resources": {"gpus": 1},
        "priority": "high",
        "replicas": {"min": replicas, "max": replicas},
        "scaling": {"max_concurrency_per_replica": 1024},
        "readiness": {"path": "/health", "period_s": 1, "timeout_s": 1, "failure_threshold": 3}
    });
    let r = up
        .http
        .post(format!("{}/api/v1/services", up.url))
        .bearer_auth(&up.token)
        .json(&spec)
        .send()
        .await
        .unwrap();
    let status = r.status();
    let created: Value = r.json().await.unwrap();
    assert_eq!(status, 201, "deploying the bench service: {created}");
    (
        created["id"].as_str().unwrap().to_string(),
        created["endpoint"].as_str().unwrap().to_string(),
    )
}

/// The addresses and region of the service's ready replicas, from the routes gateways read.
async fn ready_replicas(up: &Up, id: &str) -> Option<(Vec<String>, String)> {
    let routes = up.get("/api/v1/gateway/routes").await;
    let service = routes["services"]
        .as_array()?
        .iter()
        .find(|s| s["id"] == id)?;
    let ready: Vec<&Value> = service["replicas"]
        .as_array()?
        .iter()
        .filter(|r| r["ready"] == true && r["draining"] != true)
        .collect();
    let region = ready.first()?["region"].as_str()?.to_string();
    let addresses = ready
        .iter()
        .filter_map(|r| r["address"].as_str())
        .map(str::to_string)
        .collect();
    Some((addresses, region))
}

/// Waits until a POST through `url` answers 200.
async fn wait_routable(http: &reqwest::Client, url: &str, token: &str) {
    eventually(
        &format!("{url} to route"),
        Duration::from_secs(60),
        || async {
            let r = http
                .post(url)
                .bearer_auth(token)
                .json(&body())
                .send()
                .await
                .ok()?;
            r.status().is_success().then_some(())
        },
    )
    .await;
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = Args::parse();
    assert!(args.rate > 0 && args.duration_s > 0 && args.rounds > 0 && args.replicas > 0);
    println!("binaries from {}", bin_dir().display());
    let up = Up::start(&[], 8).await;
    let (id, endpoint) = deploy(&up, args.replicas).await;
    let (addresses, region) = eventually(
        "the bench service's replicas to be ready",
        Duration::from_secs(120),
        || async {
            // Settled: exactly the replicas asked for, all ready, and (with two or more) on
            // two nodes at least — a service that spreads starts one more while its first
            // replicas share a node, then stops one.
            let view = up.get(&format!("/api/v1/services/{id}")).await;
            let replicas = view["replicas"].as_array()?;
            let nodes: std::collections::BTreeSet<&str> =
                replicas.iter().filter_map(|r| r["node"].as_str()).collect();
            let settled = replicas.len() == args.replicas as usize
                && replicas.iter().all(|r| r["state"] == "ready")
                && nodes.len() >= (args.replicas as usize).min(2);
            if !settled {
                return None;
            }
            ready_replicas(&up, &id)
                .await
                .filter(|(a, _)| a.len() == args.replicas as usize)
        },
    )
    .await;

    // The standalone gateway, in the replicas' region, as an infra team would run it.
    let gateway_port = free_port();
    let mut cmd = Command::new(bin("switchyard"));
    cmd.arg("gateway")
        .args(["--broker", &up.url])
        .args(["--region", &region])
        .args(["--listen", &format!("127.0.0.1:{gateway_port}")])
        .arg("--token-file")
        .arg(up.data.join("admin.token"));
    let gateway = Proc::spawn("gateway", cmd, &up.dir.path().join("gateway.log")).unwrap();
    let gateway_pid = gateway.child.id();
    let standalone_url = format!("http://127.0.0.1:{gateway_port}/svc/bench/bench/v1/completions");
    let in_process_url = format!("{}v1/completions", endpoint);
    let http = reqwest::Client::new();
    wait_routable(&http, &standalone_url, &up.token).await;
    if args.in_process {
        wait_routable(&http, &in_process_url, &up.token).await;
    }
    let gateway_idle_rss = vm_kib(gateway_pid, "VmRSS:");

    let direct_urls: Vec<String> = addresses
        .iter()
        .map(|a| format!("http://{a}/v1/completions"))
        .collect();
    let mut targets = vec![
        Target {
            name: "direct",
            urls: Arc::new(direct_urls),
            token: None,
            client: client(),
        },
        Target {
            name: "gateway (standalone)",
            urls: Arc::new(vec![standalone_url]),
            token: Some(up.token.clone()),
            client: client(),
        },
    ];
    if args.in_process {
        targets.push(Target {
            name: "gateway (in `up`)",
            urls: Arc::new(vec![in_process_url]),
            token: Some(up.token.clone()),
            client: client(),
        });
    }

    for t in &targets {
        drive(t, args.rate, Duration::from_secs(args.warmup_s)).await;
    }
    let ticks = clock_ticks();
    let load_before = loadavg();
    let mut results: Vec<Samples> = targets.iter().map(|_| Samples::default()).collect();
    // Each round's p99 per target: a round disturbed by something else on the machine shows
    // as one outlier, and the median over rounds sets it aside.
    let mut round_p99: Vec<Vec<f64>> = targets.iter().map(|_| Vec::new()).collect();
    let mut dump = String::from("target,round,sent_us,latency_us,ok\n");
    // The standalone gateway's CPU over its own phases.
    let mut gateway_cpu_s = 0.0;
    for round in 0..args.rounds {
        for (i, (t, r)) in targets.iter().zip(results.iter_mut()).enumerate() {
            let cpu_before = cpu_s(gateway_pid, ticks);
            let s = drive(t, args.rate, Duration::from_secs(args.duration_s)).await;
            if i == 1
                && let (Some(a), Some(b)) = (cpu_before, cpu_s(gateway_pid, ticks))
            {
                gateway_cpu_s += b - a;
            }
            let mut sorted = s.latency_us.clone();
            sorted.sort_unstable();
            round_p99[i].push(percentile_ms(&sorted, 0.99));
            eprintln!(
                "round {round}: {} — {} sent, {} errors, p50 {:.3} ms, p99 {:.3} ms",
                t.name,
                s.sent,
                s.errors,
                percentile_ms(&sorted, 0.5),
                percentile_ms(&sorted, 0.99)
            );
            if args.dump.is_some() {
                for (at, latency, ok) in &s.trace {
                    dump.push_str(&format!("{},{round},{at},{latency},{ok}\n", t.name));
                }
            }
            r.merge(s);
        }
    }
    let gateway_rss = vm_kib(gateway_pid, "VmRSS:");
    let gateway_hwm = vm_kib(gateway_pid, "VmHWM:");
    let up_rss = vm_kib(up.proc.child.id(), "VmRSS:");

    println!(
        "load: {} req/s open loop, {} s × {} rounds per target (after {} s warm-up), {} instant replicas",
        args.rate, args.duration_s, args.rounds, args.warmup_s, args.replicas
    );
    println!(
        "{:<22} {:>8} {:>7} {:>8} {:>8} {:>8} {:>8} {:>13}",
        "target", "sent", "errors", "p50 ms", "p90 ms", "p99 ms", "max ms", "lag p99 ms"
    );
    for r in &mut results {
        r.latency_us.sort_unstable();
        r.lag_us.sort_unstable();
    }
    for (t, r) in targets.iter().zip(&results) {
        println!(
            "{:<22} {:>8} {:>7} {:>8.3} {:>8.3} {:>8.3} {:>8.3} {:>13.3}",
            t.name,
            r.sent,
            r.errors,
            percentile_ms(&r.latency_us, 0.5),
            percentile_ms(&r.latency_us, 0.9),
            percentile_ms(&r.latency_us, 0.99),
            percentile_ms(&r.latency_us, 1.0),
            percentile_ms(&r.lag_us, 0.99),
        );
        if let Some(e) = &r.first_error {
            println!("  first error: {e}");
        }
    }
    let direct = &results[0];
    for (t, r) in targets.iter().zip(&results).skip(1) {
        let d50 = percentile_ms(&r.latency_us, 0.5) - percentile_ms(&direct.latency_us, 0.5);
        let d99 = percentile_ms(&r.latency_us, 0.99) - percentile_ms(&direct.latency_us, 0.99);
        println!(
            "{}: overhead over direct +{d50:.3} ms at p50, +{d99:.3} ms at p99 (p99 ratio {:.2}×)",
            t.name,
            percentile_ms(&r.latency_us, 0.99) / percentile_ms(&direct.latency_us, 0.99)
        );
    }
    for (i, t) in targets.iter().enumerate().skip(1) {
        let mut per_round: Vec<f64> = round_p99[i]
            .iter()
            .zip(&round_p99[0])
            .map(|(g, d)| g - d)
            .collect();
        let shown: Vec<String> = per_round.iter().map(|d| format!("{d:+.3}")).collect();
        per_round.sort_by(f64::total_cmp);
        println!(
            "{}: p99 overhead per round (against that round's direct) [{}] ms, median {:+.3} ms",
            t.name,
            shown.join(", "),
            per_round[per_round.len() / 2]
        );
    }
    println!(
        "standalone gateway RSS: {} idle with routes, {} after the load, peak (VmHWM) {}",
        mib(gateway_idle_rss),
        mib(gateway_rss),
        mib(gateway_hwm)
    );
    let through_gateway = results[1].sent.max(1) as f64;
    println!(
        "standalone gateway CPU: {:.1} µs per request ({:.2} cores at {} req/s)",
        gateway_cpu_s * 1e6 / through_gateway,
        gateway_cpu_s / (args.duration_s * u64::from(args.rounds)) as f64,
        args.rate
    );
    println!(
        "`switchyard up` RSS (broker, scheduler, in-process gateway): {}",
        mib(up_rss)
    );
    println!(
        "load average (1, 5, 15 min) before the rounds: {load_before}; after: {}",
        loadavg()
    );
    if let Some(path) = &args.dump {
        std::fs::write(path, dump).unwrap();
        println!("every request: {}", path.display());
    }
    drop(gateway);
}

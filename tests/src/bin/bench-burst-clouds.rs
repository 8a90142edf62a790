//! The burst path of BENCHMARKS.md per real provider, each against its in-process fake (issue
//! 27): `switchyard serve` with a `[gcp]`, `[azure]` or `[lambda]` section pointed at the fake,
//! whose instances run the bootstrap script in a sandbox so a real `switchyard-agent` enrols.
//! For each provider in turn, BURSTS one-GPU jobs that no on-prem pool can run are submitted one
//! after another; each launches a fresh instance, which ends idle (TTL 1 s) before the next.
//!
//! Per provider: plan → launch call accepted (`requested_at` → `launched_at`), launch → agent
//! registered (`launched_at` → `ready_at`), registered → job running (`ready_at` → the job's
//! `started_at`), submit → running, and the fake's API requests (token calls included) from
//! submit to the job running (the launch), from the job's end to the fake holding nothing (the
//! terminate, idle TTL included), and while idle (the broker's orphan reaper lists every 5 s).
//! The fakes' operations are as fast as they allow (GCE operations and Azure long-running
//! operations done at once; Lambda instances active when first read), so the figures are
//! Switchyard's own overhead plus the fakes' modelled delays, not a cloud's boot time.
//! Baseline in the same run: the local provider under `switchyard up` (boot delay 0), as
//! `bench-burst` measures it. Run with
//! `cargo run --release -p switchyard-tests --bin bench-burst-clouds -- [BURSTS]` after
//! building the release binaries.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use switchyard_tests::clouds::e2e::{Section, azure_section, gcp_section, lambda_section};
use switchyard_tests::clouds::{FakeCloud, azure, gce, lambda};
use switchyard_tests::{Broker, Up, bin, eventually, in_secs};

/// Each instance ends 1 s after its job; nothing is billed past its life.
const BURST: &str = r#"
burst_enabled = true
idle_ttl_s = 1
min_billed_s = 0
boot_timeout_s = 60
pool_backoff_s = 600
provider_call_timeout_ms = 20000
"#;

/// How long the idle broker is watched for background calls (two orphan-reaper passes).
const IDLE: Duration = Duration::from_secs(10);

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

/// `median / max` of a column.
fn cell(v: &[i64], unit: &str) -> String {
    if v.is_empty() {
        return "—".into();
    }
    format!("{} / {} {unit}", median(v.to_vec()), max(v))
}

#[derive(Default)]
struct Figures {
    plan_to_launch: Vec<i64>,
    launch_to_ready: Vec<i64>,
    ready_to_running: Vec<i64>,
    submit_to_running: Vec<i64>,
    launch_calls: Vec<i64>,
    terminate_calls: Vec<i64>,
    cycle_calls: Vec<i64>,
    idle_calls: Option<i64>,
    /// Notes: the request mix of one burst (Azure's log), tokens issued.
    notes: Vec<String>,
}

impl Figures {
    fn add_times(&mut self, inst: &Value, job: &Value) {
        self.plan_to_launch
            .push(ms(&inst["launched_at"]) - ms(&inst["requested_at"]));
        self.launch_to_ready
            .push(ms(&inst["ready_at"]) - ms(&inst["launched_at"]));
        self.ready_to_running
            .push(ms(&job["started_at"]) - ms(&inst["ready_at"]));
        self.submit_to_running
            .push(ms(&job["started_at"]) - ms(&job["submitted_at"]));
    }
}

async fn instances(broker: &Broker) -> Vec<Value> {
    let (status, list) = broker
        .call(reqwest::Method::GET, "/api/v1/instances", None)
        .await;
    assert_eq!(status, 200, "{list}");
    list["instances"].as_array().cloned().unwrap_or_default()
}

/// Polls `f` every 10 ms (the request counts are read when the state is seen, so the poll is
/// fine-grained); dumps the broker's log on a timeout.
async fn until<T, F, Fut>(broker: &Broker, what: &str, secs: u64, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        if Instant::now() > deadline {
            panic!(
                "timed out after {secs} s waiting for {what}\n{}",
                broker.dump_logs()
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A one-GPU job of `model` with a deadline: the on-prem pool (H100) cannot run it, so the
/// planner must burst.
fn job(model: &str) -> Value {
    json!({
        "name": "burst", "team": "bench",
        "command": ["true"],
        "estimated_runtime_s": 60,
        "resources": {"gpus": 1, "gpu_models": [model]},
        "deadline": in_secs(3600),
        "spot": "never",
    })
}

/// N bursts through `fake` with the broker configured by `section`; `pool` is the pool every
/// launch must use.
async fn run_provider(
    fake: &dyn FakeCloud,
    section: String,
    pool: &str,
    model: &str,
    bursts: usize,
    azure_log: Option<&dyn Fn() -> Vec<String>>,
) -> Figures {
    let broker = Broker::start_with(&format!("{BURST}{section}")).await;
    let mut f = Figures::default();

    // Idle: what the broker calls with nothing to launch (startup's calls are over by then).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = fake.requests();
    tokio::time::sleep(IDLE).await;
    f.idle_calls = Some((fake.requests() - before) as i64);

    for n in 0..bursts {
        let log_from = azure_log.map(|l| l().len());
        let r0 = fake.requests();
        let id = broker.submit(job(model)).await;
        let running = until(&broker, "the job to run", 60, || async {
            let j = broker.job(&id).await;
            matches!(
                j["state"].as_str(),
                Some("running" | "succeeded" | "failed")
            )
            .then(|| (fake.requests(), j))
        })
        .await;
        let r_run = running.0;
        let done = until(&broker, "the job to finish", 60, || async {
            let j = broker.job(&id).await;
            matches!(
                j["state"].as_str(),
                Some("succeeded" | "failed" | "cancelled")
            )
            .then(|| (fake.requests(), j))
        })
        .await;
        assert_eq!(done.1["state"], "succeeded", "{}", done.1);
        assert_eq!(done.1["placement"]["pool"], pool, "{}", done.1);
        let r_done = done.0;
        let inst = until(&broker, "the instance to end", 60, || async {
            instances(&broker)
                .await
                .into_iter()
                .find(|i| i["for_job"] == id.as_str() && i["state"] == "terminated")
        })
        .await;
        let r_end = until(&broker, "the fake to hold nothing", 30, || async {
            fake.live_instances().is_empty().then(|| fake.requests())
        })
        .await;
        let attempts = instances(&broker)
            .await
            .into_iter()
            .filter(|i| i["for_job"] == id.as_str())
            .count();
        assert_eq!(attempts, 1, "one launch per burst");
        f.add_times(&inst, &done.1);
        f.launch_calls.push((r_run - r0) as i64);
        f.terminate_calls.push((r_end - r_done) as i64);
        f.cycle_calls.push((r_end - r0) as i64);
        if let (Some(log), Some(from)) = (azure_log, log_from)
            && n + 1 == bursts
        {
            let mut mix: BTreeMap<String, usize> = BTreeMap::new();
            for line in &log()[from..] {
                *mix.entry(shape(line)).or_default() += 1;
            }
            f.notes.push(format!(
                "last burst's requests: {}",
                mix.iter()
                    .map(|(k, v)| format!("{v}× {k}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    assert!(
        fake.invalid_requests().is_empty(),
        "{:?}",
        fake.invalid_requests()
    );
    f
}

/// `METHOD /path?query` with the names and ids taken out: the kind of an Azure request.
fn shape(line: &str) -> String {
    let (method, rest) = line.split_once(' ').unwrap_or((line, ""));
    let path = rest.split('?').next().unwrap_or("");
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    // Keep the resource-type words, drop the values after them.
    let kinds = [
        "virtualMachines",
        "networkInterfaces",
        "operations",
        "asyncoperations",
        "oauth2",
        "token",
        "disks",
        "prices",
    ];
    let named: Vec<&str> = segs
        .iter()
        .copied()
        .filter(|s| kinds.iter().any(|k| s.eq_ignore_ascii_case(k)))
        .collect();
    format!("{method} {}", named.join("/"))
}

/// The local provider under `switchyard up`, as `bench-burst` runs it.
async fn run_local(bursts: usize) -> Figures {
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
    let filler = up.submit(json!({"name": "fill", "team": "b", "command": ["sleep", "3600"], "resources": {"gpus": 4}, "estimated_runtime_s": 7200, "regions": ["onprem:local-dc1"]})).await;
    up.job_where(&filler, 30, |j| j["state"] == "running").await;
    let mut f = Figures::default();
    for _ in 0..bursts {
        let id = up.submit(json!({"name": "burst", "team": "b", "command": ["true"], "resources": {"gpus": 1}, "estimated_runtime_s": 60, "deadline": in_secs(900)})).await;
        let j = up.job_where(&id, 60, |j| j["state"] == "succeeded").await;
        let inst = eventually("its instance to end", Duration::from_secs(30), || async {
            let i = up
                .instances()
                .await
                .into_iter()
                .find(|i| i["for_job"] == id.as_str())?;
            (i["state"] == "terminated").then_some(i)
        })
        .await;
        f.add_times(&inst, &j);
    }
    f
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let bursts: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(5);
    let agent = bin("switchyard-agent");
    let keys = tempfile::tempdir().unwrap();
    let section = |cluster| Section {
        cluster,
        agent: &agent,
        boot_time_s: 20,
    };
    let mut results: Vec<(&str, Figures)> = Vec::new();

    let started = Instant::now();
    results.push(("local (`up`)", run_local(bursts).await));
    eprintln!("local: {:.1} s", started.elapsed().as_secs_f64());

    let started = Instant::now();
    let fake = gce::start(gce::Options {
        run_bootstrap: true,
        operation_time: Duration::ZERO,
        ..gce::Options::default()
    })
    .await;
    let s = gcp_section(
        &fake,
        keys.path(),
        "us-central1-a",
        "a2-ultragpu-1g",
        &section("bench"),
    );
    let mut g = run_provider(
        &fake,
        s,
        "gcp:us-central1/a2-ultragpu-1g",
        "A100-80GB",
        bursts,
        None,
    )
    .await;
    g.notes
        .push(format!("{} tokens issued in all", fake.tokens_issued()));
    results.push(("GCE fake", g));
    drop(fake);
    eprintln!("GCE: {:.1} s", started.elapsed().as_secs_f64());

    let started = Instant::now();
    let fake = azure::start(azure::FakeOptions {
        run_bootstrap: true,
        operation_delay: Duration::ZERO,
        ..azure::FakeOptions::default()
    })
    .await;
    let s = azure_section(
        &fake,
        keys.path(),
        "eastus",
        "Standard_NC24ads_A100_v4",
        &section("bench"),
    );
    let log = || fake.request_log();
    let mut a = run_provider(
        &fake,
        s,
        "azure:eastus/Standard_NC24ads_A100_v4",
        "A100-80GB",
        bursts,
        Some(&log),
    )
    .await;
    a.notes
        .push(format!("{} tokens issued in all", fake.token_requests()));
    results.push(("Azure fake", a));
    drop(fake);
    eprintln!("Azure: {:.1} s", started.elapsed().as_secs_f64());

    let started = Instant::now();
    let fake = lambda::start(lambda::FakeOptions {
        run_bootstrap: true,
        ..lambda::FakeOptions::default()
    })
    .await;
    let s = lambda_section(
        &fake,
        keys.path(),
        "us-east-1",
        "gpu_1x_a10",
        &section("bench"),
    );
    let l = run_provider(&fake, s, "lambda:us-east-1/gpu_1x_a10", "A10", bursts, None).await;
    results.push(("Lambda fake", l));
    drop(fake);
    eprintln!("Lambda: {:.1} s", started.elapsed().as_secs_f64());

    println!(
        "bursts: {bursts} per provider, one at a time, each a fresh instance (median / max)\n"
    );
    let header: Vec<&str> = results.iter().map(|(n, _)| *n).collect();
    println!("| step | {} |", header.join(" | "));
    println!("|---|{}", "---|".repeat(header.len()));
    let row = |name: &str, pick: &dyn Fn(&Figures) -> String| {
        let cells: Vec<String> = results.iter().map(|(_, f)| pick(f)).collect();
        println!("| {name} | {} |", cells.join(" | "));
    };
    row("plan committed → launch call accepted", &|f| {
        cell(&f.plan_to_launch, "ms")
    });
    row("launch → agent registered", &|f| {
        cell(&f.launch_to_ready, "ms")
    });
    row("registered → job running", &|f| {
        cell(&f.ready_to_running, "ms")
    });
    row("submit → running, end to end", &|f| {
        cell(&f.submit_to_running, "ms")
    });
    row("API calls, submit → job running (launch)", &|f| {
        cell(&f.launch_calls, "")
    });
    row(
        "API calls, job done → fake empty (idle TTL + terminate)",
        &|f| cell(&f.terminate_calls, ""),
    );
    row("API calls, whole burst cycle", &|f| {
        cell(&f.cycle_calls, "")
    });
    row(
        &format!("API calls while idle, {} s", IDLE.as_secs()),
        &|f| f.idle_calls.map_or("—".into(), |c| c.to_string()),
    );
    println!();
    for (name, f) in &results {
        for note in &f.notes {
            println!("- {name}: {note}");
        }
    }
}

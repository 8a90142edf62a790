//! Two broker replicas on one PostgreSQL database, with real processes: `kill -9` the leader
//! while jobs are being submitted and run; the follower leads within 10 s, every acknowledged
//! job is kept and completes, and no job runs twice at once (each job writes its start and end
//! to a file, and the intervals are checked). One replica names the database in its config
//! file, the other with `--database-url` on the command line.
//!
//! Needs a PostgreSQL server: `SWITCHYARD_TEST_PG_URL=postgres://user@host:port`, which
//! `scripts/test.sh` sets for its PostgreSQL step (a throwaway cluster). Without it the test
//! says so and returns: replicas need PostgreSQL.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use nix::sys::signal::Signal;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use switchyard_tests::*;

struct Replica {
    name: &'static str,
    url: String,
    proc: Proc,
}

/// The replica's config file; the database URL in it, or (`database_url: None`) left to the
/// command line.
fn write_config(
    dir: &Path,
    name: &str,
    port: u16,
    database_url: Option<&str>,
) -> std::path::PathBuf {
    let mut extra = format!("replica_name = \"{name}\"\n");
    if let Some(url) = database_url {
        extra.push_str(&format!("database_url = \"{url}\"\n"));
    }
    let config = broker_config(port, &dir.join(format!("data-{name}")), &extra);
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, config).unwrap();
    path
}

async fn ready(http: &reqwest::Client, url: &str) -> Option<Value> {
    let r = http.get(format!("{url}/readyz")).send().await.ok()?;
    if !r.status().is_success() {
        return None;
    }
    r.json().await.ok()
}

/// Where a replica is told its database: in its config file or with `--database-url`.
#[derive(Clone, Copy)]
enum DbFrom {
    Config,
    CommandLine,
}

async fn start_replica(
    dir: &Path,
    http: &reqwest::Client,
    name: &'static str,
    database_url: &str,
    from: DbFrom,
) -> Replica {
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let in_config = matches!(from, DbFrom::Config).then_some(database_url);
    let config = write_config(dir, name, port, in_config);
    let mut cmd = Command::new(bin("switchyard"));
    cmd.arg("serve").arg("--config").arg(config);
    if let DbFrom::CommandLine = from {
        cmd.arg("--database-url").arg(database_url);
    }
    let proc = Proc::spawn(name, cmd, &dir.join(format!("{name}.log"))).unwrap();
    eventually(
        &format!("replica {name} to be ready"),
        Duration::from_secs(30),
        || ready(http, &url),
    )
    .await;
    Replica { name, url, proc }
}

async fn leads(http: &reqwest::Client, r: &Replica) -> bool {
    ready(http, &r.url)
        .await
        .is_some_and(|h| h["leader"] == true)
}

fn dump(dir: &Path) -> String {
    let mut s = String::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let p = entry.path();
        if p.extension().is_some_and(|e| e == "log") {
            let text = std::fs::read_to_string(&p).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(60).collect();
            s.push_str(&format!("--- {} (last 60 lines)\n", p.display()));
            for l in tail.iter().rev() {
                s.push_str(l);
                s.push('\n');
            }
        }
    }
    s
}

/// Start/end instants (ns) a job's runs wrote to its marks file.
fn runs_of(path: &Path) -> Vec<(u128, Option<u128>)> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut runs: Vec<(u128, Option<u128>)> = Vec::new();
    for line in text.lines() {
        let mut parts = line.split_whitespace();
        let (Some(kind), Some(t)) = (parts.next(), parts.next()) else {
            continue;
        };
        let Ok(t) = t.parse::<u128>() else { continue };
        match kind {
            "start" => runs.push((t, None)),
            "end" => {
                if let Some(open) = runs.iter_mut().rev().find(|r| r.1.is_none()) {
                    open.1 = Some(t);
                }
            }
            _ => {}
        }
    }
    runs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killing_the_leader_hands_over_within_10s_and_loses_nothing() {
    let Some(server) = std::env::var("SWITCHYARD_TEST_PG_URL")
        .ok()
        .filter(|u| !u.is_empty())
    else {
        eprintln!("skipped: broker replicas need PostgreSQL (set SWITCHYARD_TEST_PG_URL)");
        return;
    };
    let server = server.trim_end_matches('/').to_string();
    let dir = tempfile::tempdir().unwrap();
    let marks = dir.path().join("marks");
    switchyard_tests::open_to_jobs(dir.path(), &marks);
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let database_url = fresh_pg_database(&server, "sy_failover");

    let mut a = start_replica(dir.path(), &http, "a", &database_url, DbFrom::Config).await;
    eventually("replica a to lead", Duration::from_secs(20), || async {
        leads(&http, &a).await.then_some(())
    })
    .await;
    // b is given the database on the command line only: were `--database-url` ignored, b would
    // start on SQLite in its data directory and lead there alone.
    let b = start_replica(dir.path(), &http, "b", &database_url, DbFrom::CommandLine).await;
    assert!(!leads(&http, &b).await, "two leaders");
    let admin = std::fs::read_to_string(dir.path().join("data-a/admin.token"))
        .unwrap()
        .trim()
        .to_string();

    // Three agents that know both replicas.
    let brokers = format!("{},{}", a.url, b.url);
    let mut agents = Vec::new();
    for i in 0..3 {
        let r = http
            .post(format!("{}/api/v1/enrolment-tokens", b.url))
            .bearer_auth(&admin)
            .json(&json!({"pool": POOL}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
        let token = r.json::<Value>().await.unwrap()["token"]
            .as_str()
            .unwrap()
            .to_string();
        let name = format!("agent-{i}");
        let mut cmd = Command::new(bin("switchyard-agent"));
        // The token in the environment, as `up` passes it: not in the process table.
        cmd.args(["--broker", &brokers, "--name", &name])
            .args(["--fake-gpus", "4xH100-80GB"])
            .env("SWITCHYARD_ENROL_TOKEN", &token)
            .env("RUST_LOG", "info");
        let log = dir.path().join(format!("{name}.log"));
        agents.push(Proc::spawn(&name, cmd, &log).unwrap());
    }
    eventually(
        "the agents to register",
        Duration::from_secs(30),
        || async {
            let r = http
                .get(format!("{}/api/v1/pools", b.url))
                .bearer_auth(&admin)
                .send()
                .await
                .ok()?;
            let pools: Value = r.json().await.ok()?;
            let nodes = pools["pools"]
                .as_array()?
                .iter()
                .find(|p| p["id"] == POOL)?["nodes"]
                .as_u64()?;
            (nodes >= 3).then_some(())
        },
    )
    .await;

    // Submitters: alternate replicas, fall over to the other one on an error; keep every id
    // a replica acknowledged (201).
    let acked: Arc<Mutex<Vec<String>>> = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let urls = [a.url.clone(), b.url.clone()];
    let mut submitters = Vec::new();
    for s in 0..2 {
        let (http, admin, acked, stop, urls) = (
            http.clone(),
            admin.clone(),
            acked.clone(),
            stop.clone(),
            urls.clone(),
        );
        let marks = marks.display().to_string();
        submitters.push(tokio::spawn(async move {
            let mut n = 0usize;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let spec = json!({
                    "name": format!("f-{s}-{n}"),
                    "team": "ml",
                    "command": ["sh", "-c",
                        "umask 0; echo start $(date +%s%N) >> \"$MARKS/$SWITCHYARD_JOB_ID\"; sleep 0.3; \
                         echo end $(date +%s%N) >> \"$MARKS/$SWITCHYARD_JOB_ID\""],
                    "resources": {"gpus": 1},
                    "env": {"MARKS": marks},
                });
                for k in 0..2 {
                    let url = &urls[(n + s + k) % 2];
                    let sent = http
                        .post(format!("{url}/api/v1/jobs"))
                        .bearer_auth(&admin)
                        .json(&spec)
                        .send()
                        .await;
                    if let Ok(r) = sent
                        && r.status() == 201
                        && let Ok(body) = r.json::<Value>().await
                        && let Some(id) = body["id"].as_str()
                    {
                        acked.lock().unwrap().push(id.to_string());
                        break;
                    }
                }
                n += 1;
                tokio::time::sleep(Duration::from_millis(80)).await;
            }
        }));
    }

    // Under load, kill -9 the leader.
    eventually("submissions to flow", Duration::from_secs(30), || async {
        (acked.lock().unwrap().len() >= 40).then_some(())
    })
    .await;
    let killed = Instant::now();
    a.proc.signal_group(Signal::SIGKILL);
    a.proc.wait_exit(Duration::from_secs(10)).unwrap();
    let acked_at_kill = acked.lock().unwrap().len();
    eventually(
        "replica b to lead after the leader died",
        Duration::from_secs(30),
        || async { leads(&http, &b).await.then_some(()) },
    )
    .await;
    let failover = killed.elapsed();
    eprintln!(
        "failover: replica {} leads {:.2} s after kill -9 of replica {} ({} jobs acknowledged by then)",
        b.name,
        failover.as_secs_f64(),
        a.name,
        acked_at_kill
    );

    // Keep submitting for a while on the survivor, then stop.
    tokio::time::sleep(Duration::from_secs(4)).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for s in submitters {
        s.await.unwrap();
    }
    let ids = acked.lock().unwrap().clone();
    assert!(
        ids.len() > acked_at_kill,
        "nothing was acknowledged after the kill"
    );
    assert!(
        failover < Duration::from_secs(10),
        "the follower took {failover:?} to lead\n{}",
        dump(dir.path())
    );

    // Every acknowledged job is there and completes; none ran twice at once.
    let started = Instant::now();
    let mut states: BTreeMap<String, String> = BTreeMap::new();
    while started.elapsed() < Duration::from_secs(240) {
        states.clear();
        for id in &ids {
            let r = http
                .get(format!("{}/api/v1/jobs/{id}", b.url))
                .bearer_auth(&admin)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200, "acknowledged job {id} is missing");
            let job: Value = r.json().await.unwrap();
            states.insert(id.clone(), job["state"].as_str().unwrap_or("?").to_string());
        }
        if states.values().all(|s| s == "succeeded") {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let unfinished: Vec<_> = states.iter().filter(|(_, s)| *s != "succeeded").collect();
    assert!(
        unfinished.is_empty(),
        "{} of {} acknowledged jobs did not succeed: {:?}\n{}",
        unfinished.len(),
        ids.len(),
        unfinished.iter().take(10).collect::<Vec<_>>(),
        dump(dir.path())
    );
    let mut reruns = 0;
    for id in &ids {
        let runs = runs_of(&marks.join(id));
        assert!(!runs.is_empty(), "job {id} succeeded but never ran");
        reruns += runs.len() - 1;
        let mut spans: Vec<(u128, u128)> = runs
            .iter()
            .map(|(s, e)| (*s, e.unwrap_or(u128::MAX)))
            .collect();
        spans.sort();
        for w in spans.windows(2) {
            assert!(w[0].1 <= w[1].0, "job {id} ran twice at once: {spans:?}");
        }
    }
    eprintln!(
        "failover: {} jobs acknowledged, all succeeded, {} re-run after a lost lease, none twice at once",
        ids.len(),
        reruns
    );
    drop(agents);
    drop(b);
}

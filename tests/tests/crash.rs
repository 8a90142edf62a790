//! Broker crash under load, with real processes: `kill -9` of `switchyard serve` while clients
//! submit 1,000+ jobs and long jobs run on four agents, then a restart on the same data and
//! port. Every acknowledged (201) job is still there and succeeds; the jobs that were running
//! through the crash keep running and are re-synced — one attempt, one run, never restarted —
//! and no job runs twice (each run writes its start and end, with its attempt, to a file); the
//! ledger balances (every ended attempt settled exactly once, the spend API's total equals the
//! sum of the entries).
//!
//! SQLite always; PostgreSQL too when `SWITCHYARD_TEST_PG_URL=postgres://user@host:port` is set
//! (`scripts/test.sh` sets it for its PostgreSQL step); without it that variant says so and
//! returns.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use switchyard_tests::*;

/// One run of a job, as its command wrote it: attempt, start and end (ns since the epoch).
#[derive(Debug)]
struct Run {
    attempt: String,
    start: u128,
    end: Option<u128>,
}

fn runs_of(path: &Path) -> Vec<Run> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut runs: Vec<Run> = Vec::new();
    for line in text.lines() {
        let parts: Vec<&str> = line.split_whitespace().collect();
        let [kind, t, attempt] = parts[..] else {
            continue;
        };
        let Ok(t) = t.parse::<u128>() else { continue };
        match kind {
            "start" => runs.push(Run {
                attempt: attempt.to_string(),
                start: t,
                end: None,
            }),
            "end" => {
                if let Some(run) = runs
                    .iter_mut()
                    .find(|r| r.attempt == attempt && r.end.is_none())
                {
                    run.end = Some(t);
                }
            }
            _ => {}
        }
    }
    runs
}

/// `sh -c` text that marks the run's start, sleeps `secs`, and marks its end.
fn marked(secs: &str) -> String {
    let mark = "\"$MARKS/$SWITCHYARD_JOB_ID\"";
    let sleep = if secs == "0" {
        String::new()
    } else {
        format!("sleep {secs}; ")
    };
    // umask 0: a rerun is another uid (a root agent gives each attempt its own) and appends
    // to the file the first run made.
    format!(
        "umask 0; echo start $(date +%s%N) $SWITCHYARD_ATTEMPT_ID >> {mark}; {sleep}\
         echo end $(date +%s%N) $SWITCHYARD_ATTEMPT_ID >> {mark}"
    )
}

fn spec(name: &str, secs: &str, marks: &Path) -> Value {
    json!({
        "name": name,
        "team": "ml",
        "command": ["sh", "-c", marked(secs)],
        "resources": {"gpus": 1},
        "env": {"MARKS": marks.display().to_string()},
    })
}

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

const AGENTS: usize = 4;
const LONG_JOBS: usize = 4;
const LONG_SECS: &str = "14";
/// Acknowledged submissions before the crash, and in all.
const BEFORE_CRASH: usize = 450;
const TOTAL: usize = 1_050;
const SUBMITTERS: usize = 8;

async fn crash_under_load(pg: Option<String>) {
    let backend = if pg.is_some() { "PostgreSQL" } else { "SQLite" };
    let started = Instant::now();
    let database = pg
        .as_ref()
        .map(|server| fresh_pg_database(server, "sy_crash"));
    let mut extra = String::from("ledger_accrual_interval_ms = 1000\nrate_limit_per_s = 0\n");
    if let Some(url) = &database {
        extra.push_str(&format!("database_url = \"{url}\"\n"));
    }
    let mut broker = Broker::start_with(&extra).await;
    let marks = broker.job_writable_dir("marks");
    for i in 0..AGENTS {
        broker.start_agent(&format!("crash-{i}"), 4).await;
    }

    // Long jobs, running when the broker dies.
    let mut long = Vec::new();
    for i in 0..LONG_JOBS {
        long.push(
            broker
                .submit(spec(&format!("long-{i}"), LONG_SECS, &marks))
                .await,
        );
    }
    for id in &long {
        broker
            .wait_state(id, &["running"], Duration::from_secs(20))
            .await;
    }
    eventually(
        "the long jobs to write their start",
        Duration::from_secs(10),
        || async {
            long.iter()
                .all(|id| !runs_of(&marks.join(id)).is_empty())
                .then_some(())
        },
    )
    .await;

    // Submitters: as fast as they can, each keeping what was acknowledged (201); errors and
    // refused connections (the broker is down) are retried after 50 ms.
    let acked: Arc<Mutex<Vec<String>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let mut submitters = Vec::new();
    for s in 0..SUBMITTERS {
        let (http, acked, stop) = (http.clone(), acked.clone(), stop.clone());
        let (url, admin, marks) = (broker.url.clone(), broker.admin.clone(), marks.clone());
        submitters.push(tokio::spawn(async move {
            let mut n = 0;
            let mut failed = 0usize;
            while !stop.load(Ordering::SeqCst) {
                let sent = http
                    .post(format!("{url}/api/v1/jobs"))
                    .bearer_auth(&admin)
                    .json(&spec(&format!("short-{s}-{n}"), "0", &marks))
                    .send()
                    .await;
                n += 1;
                match sent {
                    Ok(r) if r.status().is_success() => {
                        let body: Value = r.json().await.unwrap();
                        let mut acked = acked.lock().unwrap();
                        acked.push(body["id"].as_str().unwrap().to_string());
                        if acked.len() >= TOTAL {
                            stop.store(true, Ordering::SeqCst);
                        }
                    }
                    _ => {
                        failed += 1;
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
            failed
        }));
    }

    eventually(
        "submissions before the crash",
        Duration::from_secs(60),
        || async { (acked.lock().unwrap().len() >= BEFORE_CRASH).then_some(()) },
    )
    .await;
    let killed_at = now_ns();
    let killed = Instant::now();
    broker.kill9();
    let acked_at_kill = acked.lock().unwrap().len();
    broker.start_again().await;
    let serving = killed.elapsed();
    let ready_at = now_ns();
    eprintln!(
        "crash ({backend}): kill -9 after {acked_at_kill} acknowledged; serving again {:.2} s later",
        serving.as_secs_f64()
    );

    let mut failed_sends = 0;
    for s in submitters {
        failed_sends += s.await.unwrap();
    }
    let ids = acked.lock().unwrap().clone();
    assert!(ids.len() >= TOTAL, "only {} acknowledged", ids.len());

    // Every acknowledged job is there and succeeds.
    let wanted: BTreeSet<&str> = ids.iter().chain(&long).map(String::as_str).collect();
    let mut by_id: BTreeMap<String, Value>;
    let drained = Instant::now();
    let deadline = Duration::from_secs(120);
    loop {
        by_id = broker
            .all_jobs()
            .await
            .into_iter()
            .map(|j| (j["id"].as_str().unwrap().to_string(), j))
            .collect();
        let missing: Vec<_> = wanted
            .iter()
            .filter(|id| !by_id.contains_key(**id))
            .collect();
        assert!(
            missing.is_empty(),
            "{} acknowledged jobs are gone after the crash: {:?}",
            missing.len(),
            missing.iter().take(5).collect::<Vec<_>>()
        );
        let open = by_id
            .values()
            .filter(|j| {
                !matches!(
                    j["state"].as_str(),
                    Some("succeeded" | "failed" | "cancelled")
                )
            })
            .count();
        if open == 0 {
            break;
        }
        assert!(
            drained.elapsed() < deadline,
            "{open} jobs still unfinished {deadline:?} after the restart\n{}",
            broker.dump_logs()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let all_done = killed.elapsed();
    let not_ok: Vec<_> = by_id
        .values()
        .filter(|j| j["state"] != "succeeded")
        .map(|j| (j["id"].clone(), j["state"].clone(), j["reason"].clone()))
        .collect();
    assert!(not_ok.is_empty(), "jobs that did not succeed: {not_ok:?}");

    // Nothing ran twice, and nothing was re-run: one attempt, one run per job.
    for (id, job) in &by_id {
        let runs = runs_of(&marks.join(id));
        assert_eq!(runs.len(), 1, "job {id} ran {} times: {runs:?}", runs.len());
        assert!(
            runs[0].end.is_some(),
            "job {id} never wrote its end: {runs:?}"
        );
        assert_eq!(job["attempts"], 1, "job {id}: {job}");
    }
    // The long jobs ran through the crash: started before it, ended after the restart.
    for id in &long {
        let run = &runs_of(&marks.join(id))[0];
        assert!(
            run.start < killed_at && run.end.unwrap() > ready_at,
            "long job {id} did not run through the crash (kill at {killed_at}, ready at \
             {ready_at}): {run:?}"
        );
    }

    // The ledger balances.
    let audit = switchyard_tests::ledger::audit(&broker, database.as_deref()).await;
    let ran = audit
        .attempts
        .iter()
        .filter(|a| a.started.is_some())
        .count();
    assert_eq!(audit.settled, ran, "every attempt that ran is settled");
    assert_eq!(ran, by_id.len());
    eprintln!(
        "crash ({backend}): {} acknowledged ({} jobs in all, {} refused or unanswered sends \
         while down); all succeeded {:.1} s after the kill; {} long jobs ran through it; 0 lost, \
         0 re-run, 0 twice at once; ledger: {} attempts settled once in {} entries, each \
         charged exactly to its end; total ${:.6} = spend API ${:.6}; test took {:.1} s",
        ids.len() + long.len(),
        by_id.len(),
        failed_sends,
        all_done.as_secs_f64(),
        long.len(),
        audit.settled,
        audit.entries,
        audit.total_micros as f64 / 1e6,
        audit.api_total_usd,
        started.elapsed().as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_under_load_loses_nothing_on_sqlite() {
    crash_under_load(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_under_load_loses_nothing_on_postgres() {
    let Some(server) = std::env::var("SWITCHYARD_TEST_PG_URL")
        .ok()
        .filter(|u| !u.is_empty())
    else {
        eprintln!("skipped: the PostgreSQL variant needs SWITCHYARD_TEST_PG_URL");
        return;
    };
    crash_under_load(Some(server)).await;
}

/// A broker down for longer than the lease TTL. The agent cannot tell an outage from a
/// partition, so it fences: it stops its job before the broker could give the job to another
/// agent (TTL 2 s − 1 s margin; the 2 s grace does not fit, so SIGKILL). When the broker is
/// back, the agent's report (`requeue`) puts the job back in the queue instead of failing it;
/// the job runs again and succeeds under its second attempt, never two copies at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_longer_than_the_lease_ttl_fences_and_requeues_running_work() {
    let mut broker = Broker::start_with("lease_ttl_s = 2\n").await;
    let marks = broker.job_writable_dir("marks");
    broker.start_agent("resync-0", 1).await;
    let id = broker.submit(spec("through-the-outage", "5", &marks)).await;
    broker
        .wait_state(&id, &["running"], Duration::from_secs(20))
        .await;
    eventually(
        "the job to write its start",
        Duration::from_secs(10),
        || async { (!runs_of(&marks.join(&id)).is_empty()).then_some(()) },
    )
    .await;
    broker.kill9();
    // The outage: longer than the 2 s TTL (the agent's heartbeats fail meanwhile).
    tokio::time::sleep(Duration::from_secs(4)).await;
    broker.start_again().await;
    let job = broker
        .wait_state(
            &id,
            &["succeeded", "failed", "cancelled"],
            Duration::from_secs(40),
        )
        .await;
    let runs = runs_of(&marks.join(&id));
    assert_eq!(
        job["state"],
        "succeeded",
        "{job}\n{runs:?}\n{}",
        broker.dump_logs()
    );
    assert_eq!(job["attempts"], 2, "{job}\n{runs:?}");
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert!(
        runs[0].end.is_none(),
        "the first copy ran through the outage: {runs:?}"
    );
    assert_ne!(runs[0].attempt, runs[1].attempt, "{runs:?}");
    assert!(runs[1].end.is_some(), "{runs:?}");
}

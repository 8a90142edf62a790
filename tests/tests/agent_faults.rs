//! An agent's machine dies, or is cut off from the broker, while it runs a job; real processes.
//!
//! - Loss: SIGKILL of the agent, its process group and its jobs' groups (a dead machine) → the
//!   node's lease expires after `lease_ttl_s` → the job is requeued and completes on another
//!   agent, and the dead attempt is settled once in the ledger.
//! - Partition: a [`FaultProxy`] between one agent and the broker blackholes every connection
//!   → the cut-off agent cannot renew its lease and stops its copy by itself (self-fencing)
//!   before the lease expires → the job is requeued and completes elsewhere, never with two
//!   copies at once; the partition heals → what the stopped copy printed while cut off (log
//!   chunks, then its end) is rejected under the stale lease and changes nothing: the job's
//!   log, state, exit code and ledger come from the new attempt only.
//!
//! Each job writes its runs' start, ticks and end (with the attempt) to a marks file.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{Value, json};
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use switchyard_tests::proxy::{FaultProxy, Mode};
use switchyard_tests::*;

/// Lease TTL for these tests (heartbeats every second).
const TTL_S: u64 = 3;
/// The harness's heartbeat interval (`broker_config`). The broker requeues a node's work
/// `TTL_S` after the last heartbeat it recorded, which precedes a kill or a cut by up to one
/// interval (and by a few ms when the kill lands just after one): so the work comes back at
/// least `TTL_S - HEARTBEAT_S` after the fault, and never before its lease ran out.
const HEARTBEAT_S: u64 = 1;

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// A job that marks its start, prints and marks a tick a second for `secs` seconds, then marks
/// its end.
fn ticking(name: &str, secs: u32, marks: &Path) -> Value {
    let mark = "\"$MARKS/$SWITCHYARD_JOB_ID\"";
    // umask 0: a rerun is another uid (a root agent gives each attempt its own) and appends
    // to the file the first run made.
    let script = format!(
        "umask 0; echo start $(date +%s%N) $SWITCHYARD_ATTEMPT_ID >> {mark}; i=0; \
         while [ $i -lt {secs} ]; do t=$(date +%s%N); echo tick $t $SWITCHYARD_ATTEMPT_ID; \
         echo tick $t $SWITCHYARD_ATTEMPT_ID >> {mark}; sleep 1; i=$((i+1)); done; \
         echo end $(date +%s%N) $SWITCHYARD_ATTEMPT_ID >> {mark}"
    );
    json!({
        "name": name,
        "team": "ml",
        "command": ["sh", "-c", script],
        "resources": {"gpus": 1},
        "env": {"MARKS": marks.display().to_string()},
    })
}

/// The marks of one kind (`start`, `tick`, `end`): (instant in ns, attempt).
fn marks_of(path: &Path, kind: &str) -> Vec<(u128, String)> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let p: Vec<&str> = l.split_whitespace().collect();
            match p[..] {
                [k, t, a] if k == kind => Some((t.parse().ok()?, a.to_string())),
                _ => None,
            }
        })
        .collect()
}

async fn setup(agent_via_proxy: bool) -> (Broker, std::path::PathBuf, Option<FaultProxy>, String) {
    let mut broker = Broker::start_with(&format!(
        "lease_ttl_s = {TTL_S}\nledger_accrual_interval_ms = 1000\n"
    ))
    .await;
    let marks = broker.job_writable_dir("marks");
    let proxy = if agent_via_proxy {
        let upstream = broker.url.trim_start_matches("http://").parse().unwrap();
        Some(FaultProxy::start(upstream).await.unwrap())
    } else {
        None
    };
    // The first agent alone, so that the job runs there; then a second one to take it over.
    let url = proxy.as_ref().map_or(broker.url.clone(), FaultProxy::url);
    broker.start_agent_via("first", 1, &url).await;
    let id = broker.submit(ticking("victim", 14, &marks)).await;
    broker
        .wait_state(&id, &["running"], Duration::from_secs(20))
        .await;
    eventually("the job's first tick", Duration::from_secs(10), || async {
        (!marks_of(&marks.join(&id), "tick").is_empty()).then_some(())
    })
    .await;
    broker.start_agent("second", 1).await;
    (broker, marks, proxy, id)
}

/// The job's second attempt, once it runs.
async fn requeued_and_running(broker: &Broker, id: &str, marks: &Path) -> String {
    eventually(
        "the job to run again elsewhere",
        Duration::from_secs(30),
        || async {
            let job = broker.job(id).await;
            if job["attempts"] != 2 || job["state"] != "running" {
                return None;
            }
            let starts = marks_of(&marks.join(id), "start");
            (starts.len() == 2).then(|| starts[1].1.clone())
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_loss_lease_expires_and_the_job_completes_elsewhere() {
    let started = Instant::now();
    let (mut broker, marks, _, id) = setup(false).await;
    let file = marks.join(&id);
    let first = marks_of(&file, "start")[0].1.clone();

    let killed_at = now_ns();
    let killed = Instant::now();
    kill_machine(broker.agent(0));
    let second = requeued_and_running(&broker, &id, &marks).await;
    let rerun_after = killed.elapsed();
    assert_ne!(first, second);
    let job = broker
        .wait_state(&id, &["succeeded", "failed"], Duration::from_secs(40))
        .await;
    let done_after = killed.elapsed();
    assert_eq!(job["state"], "succeeded", "{job}\n{}", broker.dump_logs());
    assert_eq!(job["attempts"], 2, "{job}");

    // The dead run stopped at the kill; the new one began after it and ran to its end.
    let ticks = marks_of(&file, "tick");
    let last_dead_tick = ticks.iter().filter(|t| t.1 == first).map(|t| t.0).max();
    assert!(
        last_dead_tick.unwrap() < killed_at,
        "the killed job kept running: {ticks:?}"
    );
    let starts = marks_of(&file, "start");
    assert!(starts[1].0 > killed_at, "{starts:?}");
    let ends = marks_of(&file, "end");
    assert_eq!(ends.len(), 1, "{ends:?}");
    assert_eq!(ends[0].1, second);
    assert!(
        rerun_after >= Duration::from_secs(TTL_S - HEARTBEAT_S),
        "requeued {rerun_after:?} after the kill: sooner than the {TTL_S} s TTL after the \
         last heartbeat before it"
    );

    let audit = switchyard_tests::ledger::audit(&broker, None).await;
    assert_eq!(audit.settled, 2, "{:?}", audit.attempts);
    let states: Vec<&str> = audit.attempts.iter().map(|a| a.state.as_str()).collect();
    assert!(states.contains(&"lost"), "{states:?}");
    eprintln!(
        "agent loss: lease TTL {TTL_S} s; job running again on the other agent {:.2} s after \
         SIGKILL, succeeded {:.2} s after it; both attempts settled once (${:.6}); test took \
         {:.1} s",
        rerun_after.as_secs_f64(),
        done_after.as_secs_f64(),
        audit.total_micros as f64 / 1e6,
        started.elapsed().as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_agent_stops_its_job_before_the_lease_expires_and_its_late_reports_are_rejected()
 {
    let started = Instant::now();
    let (mut broker, marks, proxy, id) = setup(true).await;
    let proxy = proxy.unwrap();
    let file = marks.join(&id);
    let first = marks_of(&file, "start")[0].1.clone();
    let job_procs = descendants(broker.agent(0).pid());
    assert!(!job_procs.is_empty(), "the job's processes");
    let copy_gone = || {
        job_procs
            .iter()
            .all(|p| !Path::new(&format!("/proc/{p}")).exists() || is_zombie(*p))
    };

    let cut_at = now_ns();
    let cut = Instant::now();
    proxy.set(Mode::Blackhole);
    // Cut off, the first agent cannot renew its lease: it stops its copy by itself before the
    // broker may requeue the job (TTL less its grace and margin after its last renewal).
    eventually(
        "the cut-off agent to stop its copy",
        Duration::from_secs(TTL_S + 5),
        || async { copy_gone().then_some(()) },
    )
    .await;
    // Seen gone at this instant (to within the 50 ms poll): an upper bound of the stop.
    let gone_at = now_ns();
    let gone_after = cut.elapsed();
    let second = requeued_and_running(&broker, &id, &marks).await;
    let rerun_after = cut.elapsed();
    assert_ne!(first, second);
    let second_start = marks_of(&file, "start")[1].0;
    let ticks = marks_of(&file, "tick");
    let last_first_tick = ticks
        .iter()
        .filter(|t| t.1 == first)
        .map(|t| t.0)
        .max()
        .unwrap();
    // Never two copies at once: the cut-off copy was gone before the new attempt started.
    assert!(
        gone_at < second_start,
        "the new attempt started {:.3} s before the cut-off copy was seen gone",
        (gone_at - second_start) as f64 / 1e9
    );
    assert!(last_first_tick < second_start, "{ticks:?}");
    assert!(
        rerun_after >= Duration::from_secs(TTL_S - HEARTBEAT_S),
        "requeued {rerun_after:?} after the cut: sooner than the {TTL_S} s TTL after the \
         last heartbeat before it"
    );
    let printed_late = ticks
        .iter()
        .filter(|t| t.1 == first && t.0 > cut_at)
        .count();

    // Hold the partition a little longer (the new attempt ticks meanwhile), then heal.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let healed_at = now_ns();
    proxy.set(Mode::Pass);
    assert!(copy_gone());

    let job = broker
        .wait_state(
            &id,
            &["succeeded", "failed", "cancelled"],
            Duration::from_secs(40),
        )
        .await;
    assert_eq!(job["state"], "succeeded", "{job}\n{}", broker.dump_logs());
    assert_eq!(job["attempts"], 2, "{job}");
    assert_eq!(job["exit_code"], 0, "{job}");
    let ends = marks_of(&file, "end");
    assert_eq!(ends.len(), 1, "the stopped copy ran to its end: {ends:?}");
    assert_eq!(ends[0].1, second);
    // No tick of the first attempt after the second began, to the end.
    let ticks = marks_of(&file, "tick");
    assert!(
        ticks.iter().all(|t| t.1 != first || t.0 < second_start),
        "{ticks:?}"
    );

    // What the cut-off copy printed after the cut never reached the job's log.
    let (stdout, _, _) = broker.logs(&id).await;
    let late: Vec<&str> = stdout
        .lines()
        .filter(|l| {
            let p: Vec<&str> = l.split_whitespace().collect();
            matches!(p[..], ["tick", t, a] if a == first
                && t.parse::<u128>().is_ok_and(|t| t > cut_at))
        })
        .collect();
    assert!(
        late.is_empty(),
        "late output of the stale attempt was kept: {late:?}"
    );
    let second_ticks = stdout.lines().filter(|l| l.ends_with(&second)).count();
    assert_eq!(second_ticks, 14, "{stdout}");
    // The cut-off agent said why it stopped the job, and the broker answered its late events
    // (its output while cut off, its end) `rejected`.
    let agent_log = broker.dir.path().join("agent-first.log");
    eventually(
        "the cut-off agent to be told its events are rejected",
        Duration::from_secs(10),
        || async {
            let log = std::fs::read_to_string(&agent_log).unwrap_or_default();
            (log.lines()
                .any(|l| l.contains("self-fencing") && l.contains(&first))
                && log
                    .lines()
                    .any(|l| l.contains("rejected this attempt's events") && l.contains(&first)))
            .then_some(())
        },
    )
    .await;

    // Counted once: the stale attempt is settled at its loss, not at its late end.
    let audit = switchyard_tests::ledger::audit(&broker, None).await;
    assert_eq!(audit.settled, 2, "{:?}", audit.attempts);
    let lost = audit.attempts.iter().find(|a| a.id == first).unwrap();
    assert_eq!(lost.state, "lost", "{lost:?}");
    assert!(
        (lost.finished.unwrap() as u128) * 1_000_000 < healed_at,
        "the stale attempt's end moved after the heal: {lost:?}"
    );
    eprintln!(
        "partition: lease TTL {TTL_S} s; the cut-off copy was gone {:.2} s after the cut (its \
         last tick {:.2} s after it); the job started again on the other agent {:.2} s after \
         the cut, {:.2} s after the copy was gone: 0 s of two copies at once; healed after \
         {:.2} s ({} ticks printed while cut off, none kept); succeeded once, ledger ${:.6} over \
         2 attempts settled once; test took {:.1} s",
        gone_after.as_secs_f64(),
        last_first_tick.saturating_sub(cut_at) as f64 / 1e9,
        (second_start - cut_at) as f64 / 1e9,
        (second_start - gone_at) as f64 / 1e9,
        (healed_at - cut_at) as f64 / 1e9,
        printed_late,
        audit.total_micros as f64 / 1e6,
        started.elapsed().as_secs_f64()
    );
}

fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rfind(')')
                .map(|i| s[i + 1..].split_whitespace().next() == Some("Z"))
        })
        .unwrap_or(true)
}

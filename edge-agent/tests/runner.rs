//! The runner against real processes: output, exit codes, spawn failures, and stopping whole
//! process groups (SIGTERM, grace, SIGKILL). Tests may use `sh`; the agent itself never does.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use switchyard_agent::attempts::{AttemptTable, StopReason};
use switchyard_agent::group;
use switchyard_agent::logs::MAX_CHUNK_BYTES;
use switchyard_agent::outbox::EventSink;
use switchyard_agent::runner::{RunOptions, run_attempt};
use switchyard_protocol::agent::{AgentEvent, AttemptRef, Lease, Stream};
use tokio::sync::mpsc;
use tokio::time::{Instant, timeout};
use uuid::Uuid;

const DEADLINE: Duration = Duration::from_secs(20);

fn lease(command: &[&str], grace_s: u64) -> Lease {
    Lease {
        attempt: AttemptRef {
            job_id: Uuid::now_v7(),
            attempt_id: Uuid::now_v7(),
            epoch: 1,
        },
        command: command.iter().map(|s| s.to_string()).collect(),
        env: BTreeMap::new(),
        gpus: vec![],
        grace_s,
        traceparent: None,
    }
}

/// One attempt running in the background, its events arriving on a channel.
struct Attempt {
    id: Uuid,
    table: Arc<AttemptTable>,
    events: mpsc::Receiver<AgentEvent>,
    seen: Vec<AgentEvent>,
}

impl Attempt {
    fn start(lease: Lease) -> Attempt {
        let table = Arc::new(AttemptTable::new());
        let id = lease.attempt.attempt_id;
        let stop = table
            .admit(&lease, Duration::from_secs(lease.grace_s))
            .unwrap();
        let (sink, events) = EventSink::channel(1024);
        let opts = RunOptions {
            default_grace: Duration::from_secs(10),
        };
        tokio::spawn(run_attempt(lease, sink, stop, opts));
        Attempt {
            id,
            table,
            events,
            seen: Vec::new(),
        }
    }

    /// The next event; `None` once the runner is done.
    async fn next(&mut self) -> Option<AgentEvent> {
        let event = timeout(DEADLINE, self.events.recv())
            .await
            .expect("no event within the deadline");
        self.seen.extend(event.clone());
        event
    }

    async fn pid(&mut self) -> u32 {
        match self.next().await {
            Some(AgentEvent::Started { pid, .. }) => pid,
            other => panic!("expected Started, got {other:?}"),
        }
    }

    /// All events until the runner is done.
    async fn finish(&mut self) -> Vec<AgentEvent> {
        while self.next().await.is_some() {}
        self.seen.clone()
    }

    fn stop(&self, reason: StopReason) {
        assert!(self.table.stop(self.id, reason));
    }
}

fn logs(events: &[AgentEvent]) -> Vec<(u64, Stream, String)> {
    events
        .iter()
        .filter_map(|e| match e {
            AgentEvent::Log {
                seq, stream, data, ..
            } => Some((*seq, *stream, data.clone())),
            _ => None,
        })
        .collect()
}

fn text(events: &[AgentEvent], want: Stream) -> String {
    logs(events)
        .into_iter()
        .filter(|(_, s, _)| *s == want)
        .map(|(_, _, d)| d)
        .collect()
}

fn assert_gapless(events: &[AgentEvent]) {
    let seqs: Vec<u64> = logs(events).iter().map(|l| l.0).collect();
    assert_eq!(
        seqs,
        (0..seqs.len() as u64).collect::<Vec<_>>(),
        "{events:?}"
    );
}

/// (exit_code, signal, error, stopped) of the last event, which must be `Finished`.
fn finished(events: &[AgentEvent]) -> (Option<i32>, Option<i32>, Option<String>, bool) {
    match events.last() {
        Some(AgentEvent::Finished {
            exit_code,
            signal,
            error,
            stopped,
            ..
        }) => (*exit_code, *signal, error.clone(), *stopped),
        other => panic!("expected Finished last, got {other:?} in {events:?}"),
    }
}

/// Polls until the group has at least `n` live members; returns them.
async fn members_at_least(pgid: u32, n: usize) -> Vec<u32> {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let members = group::members(pgid).unwrap();
        if members.len() >= n {
            return members;
        }
        assert!(
            Instant::now() < deadline,
            "group {pgid} never reached {n} members: {members:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn reports_both_streams_in_order_and_the_exit_code() {
    let mut a = Attempt::start(lease(&["sh", "-c", "echo hi; echo err >&2; exit 3"], 1));
    assert!(a.pid().await > 0);
    let events = a.finish().await;
    assert_gapless(&events);
    assert_eq!(text(&events, Stream::Stdout), "hi\n");
    assert_eq!(text(&events, Stream::Stderr), "err\n");
    assert_eq!(finished(&events), (Some(3), None, None, false));
    assert_eq!(
        events
            .iter()
            .filter(|e| matches!(e, AgentEvent::Finished { .. }))
            .count(),
        1
    );
}

#[tokio::test]
async fn passes_env_and_gpus() {
    let mut l = lease(
        &[
            "sh",
            "-c",
            "echo \"$CUDA_VISIBLE_DEVICES|$FOO|$SWITCHYARD_ATTEMPT_ID\"",
        ],
        1,
    );
    l.env.insert("FOO".into(), "bar baz".into());
    l.env.insert("CUDA_VISIBLE_DEVICES".into(), "9".into()); // the agent's choice wins
    l.gpus = vec![0, 2];
    let id = l.attempt.attempt_id;
    let events = Attempt::start(l).finish().await;
    assert_eq!(text(&events, Stream::Stdout), format!("0,2|bar baz|{id}\n"));
    assert_eq!(finished(&events).0, Some(0));
}

#[tokio::test]
async fn a_spawn_failure_is_a_system_log_and_a_failed_finish() {
    let events = Attempt::start(lease(&["nosuchbinary-switchyard"], 1))
        .finish()
        .await;
    let want = "failed to start `nosuchbinary-switchyard`: No such file or directory (os error 2)";
    assert_eq!(
        logs(&events),
        vec![(0, Stream::System, format!("{want}\n"))]
    );
    assert_eq!(
        finished(&events),
        (None, None, Some(want.to_string()), false)
    );
    assert_eq!(events.len(), 2, "no Started: {events:?}");
}

#[tokio::test]
async fn large_output_is_chunked_without_loss() {
    let mut a = Attempt::start(lease(
        &["sh", "-c", "head -c 200000 /dev/zero | tr '\\0' a; echo"],
        1,
    ));
    let events = a.finish().await;
    assert_gapless(&events);
    let chunks = logs(&events);
    assert!(
        chunks.iter().all(|(_, _, d)| d.len() <= MAX_CHUNK_BYTES),
        "a chunk over the cap"
    );
    assert!(
        chunks.len() >= 4,
        "200 kB must take at least 4 chunks, got {}",
        chunks.len()
    );
    assert_eq!(
        text(&events, Stream::Stdout),
        format!("{}\n", "a".repeat(200_000))
    );
}

#[tokio::test]
async fn stop_terminates_a_sleep_within_grace() {
    let mut a = Attempt::start(lease(&["sleep", "300"], 5));
    let pid = a.pid().await;
    let asked = Instant::now();
    a.stop(StopReason::Broker);
    let events = a.finish().await;
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "took {:?}",
        asked.elapsed()
    );
    assert!(!group::process_alive(pid));
    let (exit_code, signal, error, stopped) = finished(&events);
    assert_eq!((exit_code, signal, stopped), (None, Some(15), true));
    assert!(error.unwrap().contains("broker's request"));
    let system = text(&events, Stream::System);
    assert!(
        system.contains("sent SIGTERM") && !system.contains("SIGKILL"),
        "{system}"
    );
    assert_gapless(&events);
}

#[tokio::test]
async fn stop_terminates_the_whole_process_group() {
    let mut a = Attempt::start(lease(&["sh", "-c", "sleep 300 & sleep 300"], 5));
    let pid = a.pid().await;
    let members = members_at_least(pid, 3).await; // sh and two sleeps
    let asked = Instant::now();
    a.stop(StopReason::Broker);
    let events = a.finish().await;
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "took {:?}",
        asked.elapsed()
    );
    for p in &members {
        assert!(!group::process_alive(*p), "{p} of {members:?} survived");
    }
    assert!(!group::is_alive(pid));
    assert!(finished(&events).3, "reported as stopped");
}

#[tokio::test]
async fn a_process_ignoring_sigterm_is_killed_after_grace() {
    let mut a = Attempt::start(lease(&["sh", "-c", "trap '' TERM; sleep 300"], 1));
    let pid = a.pid().await;
    // The sleep starts after the trap is set: from then on SIGTERM is ignored.
    let members = members_at_least(pid, 2).await;
    let asked = Instant::now();
    a.stop(StopReason::Broker);
    let events = a.finish().await;
    let took = asked.elapsed();
    assert!(
        took >= Duration::from_millis(900),
        "killed before the grace ended: {took:?}"
    );
    assert!(took < Duration::from_secs(5), "took {took:?}");
    for p in &members {
        assert!(!group::process_alive(*p), "{p} survived");
    }
    let (_, signal, _, stopped) = finished(&events);
    assert_eq!((signal, stopped), (Some(9), true));
    assert!(text(&events, Stream::System).contains("SIGKILL after the 1 s grace"));
}

#[tokio::test]
async fn leftovers_in_the_group_end_with_the_job() {
    let mut a = Attempt::start(lease(&["sh", "-c", "sleep 300 & echo $!"], 5));
    let events = a.finish().await;
    let background: u32 = text(&events, Stream::Stdout).trim().parse().unwrap();
    assert!(
        !group::process_alive(background),
        "background sleep {background} survived"
    );
    assert_eq!(finished(&events), (Some(0), None, None, false));
}

#[tokio::test]
async fn a_lost_lease_is_stopped_without_a_report() {
    let mut a = Attempt::start(lease(&["sleep", "300"], 5));
    let pid = a.pid().await;
    a.stop(StopReason::LeaseLost);
    let events = a.finish().await;
    assert!(!group::process_alive(pid));
    assert_eq!(events.len(), 1, "only Started: {events:?}");
}

#[tokio::test]
async fn shutdown_stops_jobs_as_failures_not_broker_stops() {
    let mut a = Attempt::start(lease(&["sleep", "300"], 5));
    a.pid().await;
    a.stop(StopReason::Shutdown);
    let events = a.finish().await;
    let (_, signal, error, stopped) = finished(&events);
    assert_eq!((signal, stopped), (Some(15), false));
    assert!(error.unwrap().contains("shutting down"));
}

#[tokio::test]
async fn an_escaped_process_holding_the_output_does_not_hang_the_attempt() {
    // The inner shell leaves the job's group (setsid), keeps stdout open and writes its pid;
    // the job waits for that, prints it and exits.
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("pid");
    let f = f.to_str().unwrap();
    let script = format!(
        "setsid sh -c 'echo $$ > {f}; exec sleep 300' & while [ ! -s {f} ]; do sleep 0.05; done; cat {f}"
    );
    let mut a = Attempt::start(lease(&["sh", "-c", &script], 1));
    let events = a.finish().await;
    let escaped: u32 = text(&events, Stream::Stdout).trim().parse().unwrap();
    let alive = group::process_alive(escaped);
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(escaped as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    assert!(
        alive,
        "the escaped process is outside the job's group: not the agent's to kill"
    );
    assert_eq!(finished(&events), (Some(0), None, None, false));
}

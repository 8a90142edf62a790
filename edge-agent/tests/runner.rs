//! The runner against real processes: output, exit codes, spawn failures, stopping whole
//! process groups (SIGTERM, grace, SIGKILL), the clean environment, and (as root) jobs that
//! run as uids of their own. Tests may use `sh`; the agent itself never does.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use switchyard_agent::args::UidRange;
use switchyard_agent::attempts::{AttemptTable, StopReason};
use switchyard_agent::group;
use switchyard_agent::isolation::{JOB_PATH, Sandbox, processes_of};
use switchyard_agent::logs::MAX_CHUNK_BYTES;
use switchyard_agent::outbox::EventSink;
use switchyard_agent::runner::{RunOptions, run_attempt};
use switchyard_agent::serving::Serving;
use switchyard_protocol::agent::{AgentEvent, AttemptRef, Lease, Stream};
use tokio::sync::mpsc;
use tokio::time::{Instant, timeout};
use uuid::Uuid;

const DEADLINE: Duration = Duration::from_secs(20);

fn lease(command: &[&str], grace_s: u64) -> Lease {
    Lease {
        expected_gpu_utilization_pct: None,
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
        serve: None,
    }
}

/// One attempt running in the background, its events arriving on a channel.
struct Attempt {
    id: Uuid,
    table: Arc<AttemptTable>,
    events: mpsc::Receiver<AgentEvent>,
    seen: Vec<AgentEvent>,
    _work: Option<tempfile::TempDir>,
}

/// The agent's table of service replicas (none of these leases is one).
fn serving() -> Arc<Serving> {
    Arc::new(Serving::new("127.0.0.1").unwrap())
}

/// A sandbox without uids (jobs run as the test's user) in a fresh work root.
fn plain_sandbox(pass_env: Vec<(OsString, OsString)>) -> (tempfile::TempDir, Arc<Sandbox>) {
    let dir = tempfile::tempdir().unwrap();
    let sandbox = Sandbox::new(&dir.path().join("jobs"), None, pass_env).unwrap();
    (dir, Arc::new(sandbox))
}

impl Attempt {
    fn start(lease: Lease) -> Attempt {
        let (dir, sandbox) = plain_sandbox(Vec::new());
        let mut attempt = Attempt::start_in(lease, sandbox);
        attempt._work = Some(dir);
        attempt
    }

    fn start_in(lease: Lease, sandbox: Arc<Sandbox>) -> Attempt {
        let table = Arc::new(AttemptTable::new());
        let id = lease.attempt.attempt_id;
        let stop = table
            .admit(&lease, Duration::from_secs(lease.grace_s))
            .unwrap();
        let (sink, events) = EventSink::channel(1024);
        let opts = RunOptions {
            default_grace: Duration::from_secs(10),
            sandbox,
            serving: serving(),
            gpu_sim: None,
        };
        tokio::spawn(run_attempt(lease, sink, stop, opts));
        Attempt {
            id,
            table,
            events,
            seen: Vec::new(),
            _work: None,
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

/// `drained` of the last event, which must be `Finished`.
fn drained(events: &[AgentEvent]) -> bool {
    match events.last() {
        Some(AgentEvent::Finished { drained, .. }) => *drained,
        other => panic!("expected Finished last, got {other:?}"),
    }
}

#[tokio::test]
async fn shutdown_drains_jobs_with_the_checkpoint_signal_never_as_failures() {
    let mut a = Attempt::start(lease(&["sleep", "300"], 5));
    a.pid().await;
    a.stop(StopReason::Shutdown);
    let events = a.finish().await;
    let (_, signal, error, stopped) = finished(&events);
    assert_eq!((signal, stopped), (Some(15), false));
    assert!(drained(&events), "{events:?}");
    assert_eq!(
        error.unwrap(),
        "stopped because the agent is shutting down: sent SIGTERM"
    );
}

#[tokio::test]
async fn a_lease_not_started_when_the_agent_shuts_down_is_drained_too() {
    let l = lease(&["sleep", "300"], 5);
    let table = Arc::new(AttemptTable::new());
    let stop = table.admit(&l, Duration::from_secs(5)).unwrap();
    table.stop(l.attempt.attempt_id, StopReason::Shutdown);
    let (sink, mut events) = EventSink::channel(16);
    let (_dir, sandbox) = plain_sandbox(Vec::new());
    let opts = RunOptions {
        default_grace: Duration::from_secs(1),
        sandbox,
        serving: serving(),
        gpu_sim: None,
    };
    run_attempt(l, sink, stop, opts).await;
    let mut seen = Vec::new();
    while let Ok(e) = events.try_recv() {
        seen.push(e);
    }
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(drained(&seen));
    assert_eq!(finished(&seen).0, None);
}

/// The names in `env` output (one `NAME=value` a line).
fn names(env_output: &str) -> BTreeSet<String> {
    env_output
        .lines()
        .filter_map(|l| l.split_once('=').map(|(n, _)| n.to_string()))
        .collect()
}

#[tokio::test]
async fn a_job_sees_a_clean_environment_with_only_what_it_is_given() {
    let passed = vec![(OsString::from("PASSED_ON"), OsString::from("by --pass-env"))];
    let (dir, sandbox) = plain_sandbox(passed);
    let mut l = lease(&["env"], 1);
    l.env.insert("FOO".into(), "bar".into());
    l.traceparent = Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into());
    let id = l.attempt.attempt_id;
    let events = Attempt::start_in(l, sandbox.clone()).finish().await;
    let out = text(&events, Stream::Stdout);
    let want: BTreeSet<String> = [
        "PATH",
        "HOME",
        "LANG",
        "TZ",
        "FOO",
        "PASSED_ON",
        "SWITCHYARD_JOB_ID",
        "SWITCHYARD_ATTEMPT_ID",
        "CUDA_VISIBLE_DEVICES",
        "TRACEPARENT",
    ]
    .map(String::from)
    .into();
    // Nothing of the test's own environment (cargo's variables, the user's) reaches it.
    assert_eq!(names(&out), want, "{out}");
    let home = sandbox.work_root().join(id.to_string());
    assert!(
        out.contains(&format!("\nHOME={}\n", home.display())),
        "{out}"
    );
    assert!(out.contains(&format!("PATH={JOB_PATH}\n")), "{out}");
    assert!(out.contains("PASSED_ON=by --pass-env\n"), "{out}");
    assert!(
        out.contains("LANG=C.UTF-8\n") && out.contains("TZ=UTC\n"),
        "{out}"
    );
    assert!(
        !home.exists(),
        "the job's directory is removed when it ends"
    );
    drop(dir);
}

#[tokio::test]
async fn a_job_runs_in_its_own_directory() {
    let (_dir, sandbox) = plain_sandbox(Vec::new());
    let l = lease(&["sh", "-c", "pwd; echo x > file; ls"], 1);
    let want = sandbox.work_root().join(l.attempt.attempt_id.to_string());
    let events = Attempt::start_in(l, sandbox).finish().await;
    assert_eq!(
        text(&events, Stream::Stdout),
        format!("{}\nfile\n", want.display())
    );
    assert!(!want.exists());
}

fn root() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    eprintln!("skipped: needs root (CI runs as root)");
    false
}

/// An isolated sandbox on its own uids (as root), in a work root that job uids can reach.
fn isolated_sandbox(start: u32, end: u32) -> (tempfile::TempDir, Arc<Sandbox>) {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let range = UidRange { start, end };
    let sandbox = Sandbox::new(&dir.path().join("jobs"), Some(range), Vec::new()).unwrap();
    (dir, Arc::new(sandbox))
}

/// Root only: two jobs at once run as two different unprivileged uids with no supplementary
/// groups, each in a 0700 directory of its own that the other cannot enter; both directories
/// are gone afterwards.
#[tokio::test]
async fn isolated_jobs_run_as_uids_of_their_own() {
    if !root() {
        return;
    }
    let (_dir, sandbox) = isolated_sandbox(20_800, 20_849);
    let script = "id -u; id -g; id -G; pwd; stat -c %a .; \
                  while [ ! -e ../go ]; do sleep 0.05; done; \
                  ls .. >/dev/null 2>&1 && echo listed || echo unlisted";
    let (la, lb) = (
        lease(&["sh", "-c", script], 1),
        lease(&["sh", "-c", script], 1),
    );
    let dirs: Vec<PathBuf> = [&la, &lb]
        .iter()
        .map(|l| sandbox.work_root().join(l.attempt.attempt_id.to_string()))
        .collect();
    let mut a = Attempt::start_in(la, sandbox.clone());
    let mut b = Attempt::start_in(lb, sandbox.clone());
    a.pid().await;
    b.pid().await;
    let owners: Vec<u32> = {
        use std::os::unix::fs::MetadataExt;
        dirs.iter()
            .map(|d| std::fs::metadata(d).unwrap().uid())
            .collect()
    };
    // Both run now, each with its uid: let them go on (the root is not listable, but a
    // name in it can be looked up).
    std::fs::write(sandbox.work_root().join("go"), "").unwrap();
    let (ea, eb) = (a.finish().await, b.finish().await);
    let mut uids = Vec::new();
    for (events, dir, owner) in [(&ea, &dirs[0], owners[0]), (&eb, &dirs[1], owners[1])] {
        let out = text(events, Stream::Stdout);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 6, "{out}\n{}", text(events, Stream::Stderr));
        let uid: u32 = lines[0].parse().unwrap();
        assert!((20_800..=20_849).contains(&uid), "{out}");
        assert_eq!(lines[1], lines[0], "gid = uid: {out}");
        assert_eq!(lines[2], lines[0], "no supplementary groups: {out}");
        assert_eq!(lines[3], dir.display().to_string());
        assert_eq!(lines[4], "700");
        assert_eq!(lines[5], "unlisted", "the work root is not listable: {out}");
        assert_eq!(owner, uid);
        assert!(!dir.exists(), "{} left behind", dir.display());
        assert_eq!(finished(events).0, Some(0));
        uids.push(uid);
    }
    assert_ne!(uids[0], uids[1]);
}

/// Root only: what a job leaves running outside its process group (setsid) is killed when
/// the job ends, by its uid, so it cannot linger into the next job that gets the uid.
#[tokio::test]
async fn an_isolated_jobs_escaped_processes_are_killed_when_it_ends() {
    if !root() {
        return;
    }
    let (_dir, sandbox) = isolated_sandbox(20_850, 20_859);
    let script = "setsid sh -c 'echo $$ > pid; exec sleep 300' & \
                  while [ ! -s pid ]; do sleep 0.05; done; cat pid; id -u";
    let events = Attempt::start_in(lease(&["sh", "-c", script], 1), sandbox)
        .finish()
        .await;
    let out = text(&events, Stream::Stdout);
    let mut lines = out.lines();
    let escaped: u32 = lines.next().unwrap().parse().unwrap();
    let uid: u32 = lines.next().unwrap().parse().unwrap();
    assert!(!group::process_alive(escaped), "{escaped} outlived its job");
    assert!(processes_of(uid).is_empty());
    assert_eq!(finished(&events), (Some(0), None, None, false));
}

/// Root only: with every uid of the range taken, a job fails to start with the reason.
#[tokio::test]
async fn no_free_uid_is_a_start_failure_with_the_reason() {
    if !root() {
        return;
    }
    let (_dir, sandbox) = isolated_sandbox(20_860, 20_860);
    let mut first = Attempt::start_in(lease(&["sleep", "300"], 1), sandbox.clone());
    first.pid().await;
    let events = Attempt::start_in(lease(&["true"], 1), sandbox)
        .finish()
        .await;
    let (exit_code, _, error, _) = finished(&events);
    assert_eq!(exit_code, None);
    assert!(
        error.unwrap().contains("no free job uid in 20860-20860"),
        "{events:?}"
    );
    first.stop(StopReason::Broker);
    first.finish().await;
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

/// On simulated GPUs a job holds its GPUs at its lease's level while it runs, may change the
/// level through `$SWITCHYARD_GPU_SIM` (which its own `env` cannot redirect), and leaves them
/// idle when it ends.
#[tokio::test]
async fn a_job_drives_its_simulated_gpus_through_the_level_file() {
    use switchyard_agent::fakegpu::{FakeProbe, GpuSim};
    use switchyard_agent::inventory::GpuProbe;
    let decl = "4xH100".parse().unwrap();
    let probe =
        FakeProbe::with_faults(&[decl], "node-sim", Arc::new(GpuSim::new()), vec![]).unwrap();
    let levels = || -> Vec<Option<u32>> {
        probe
            .gpus()
            .unwrap()
            .iter()
            .map(|g| g.utilization_pct)
            .collect()
    };
    let mut l = lease(
        &[
            "sh",
            "-c",
            "sleep 0.5; echo 33 > \"$SWITCHYARD_GPU_SIM\"; echo written; sleep 300",
        ],
        1,
    );
    l.gpus = vec![1, 3];
    l.expected_gpu_utilization_pct = Some(70);
    l.env.insert(
        "SWITCHYARD_GPU_SIM".into(),
        "/tmp/not-the-agents-file".into(),
    );
    let table = Arc::new(AttemptTable::new());
    let stop = table.admit(&l, Duration::from_secs(1)).unwrap();
    let (sink, mut events) = EventSink::channel(64);
    let (_dir, sandbox) = plain_sandbox(Vec::new());
    let opts = RunOptions {
        default_grace: Duration::from_secs(1),
        sandbox,
        serving: serving(),
        gpu_sim: Some(probe.sim().clone()),
    };
    let id = l.attempt.attempt_id;
    let runner = tokio::spawn(run_attempt(l, sink, stop, opts));
    // Started: the lease's level.
    let first = timeout(DEADLINE, events.recv()).await.unwrap();
    assert!(
        matches!(first, Some(AgentEvent::Started { .. })),
        "{first:?}"
    );
    assert_eq!(levels(), vec![Some(0), Some(70), Some(0), Some(70)]);
    // The job's own level, once it wrote it.
    let deadline = Instant::now() + DEADLINE;
    while levels() != vec![Some(0), Some(33), Some(0), Some(33)] {
        assert!(
            Instant::now() < deadline,
            "level never changed: {:?}",
            levels()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(table.stop(id, StopReason::Broker));
    timeout(DEADLINE, runner).await.unwrap().unwrap();
    assert_eq!(levels(), vec![Some(0); 4]);
    assert!(!std::path::Path::new("/tmp/not-the-agents-file").exists());
}

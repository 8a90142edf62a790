//! Runs one leased attempt: spawns its argv (never through a shell) as the leader of a new
//! process group, in the job's own space (uid, directory and clean environment, see
//! [`crate::isolation`]) with its GPUs, reports `Started`, its output (see [`crate::logs`]) and
//! `Finished`, and stops the whole group on request: SIGTERM, the grace period, SIGKILL. It
//! reports through the outbox channel and never talks to the broker. The job's argv is the
//! user's and may hold secrets: it is logged at DEBUG only.
//!
//! A service replica (a lease with `serve`) also gets a port in `$PORT` and a readiness probe
//! for as long as its process lives ([`crate::serving`]). On simulated GPUs an attempt holds
//! its GPUs on the board ([`crate::fakegpu::GpuSim`]) from its start to its end, at its lease's
//! level, and gets `$SWITCHYARD_GPU_SIM`, a file in its directory to write its level to.

use crate::attempts::{StopReason, StopSignal};
use crate::fakegpu::{self, GpuSim, SimHold};
use crate::group::{self, Termination};
use crate::isolation::{JobSpace, Sandbox, job_env};
use crate::logs::{self, COALESCE_WINDOW};
use crate::outbox::EventSink;
use crate::serving::{Reservation, Serving};
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;
use switchyard_protocol::agent::{AgentEvent, AttemptRef, Lease, Stream};
use tokio::process::{Child, Command};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tracing::Instrument;

/// Pieces of output in flight between the pipe readers and the coalescer, per attempt.
const PIECE_QUEUE: usize = 64;

/// Knobs of the runner that do not come from the lease.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Grace between SIGTERM and SIGKILL when the lease says 0.
    pub default_grace: Duration,
    /// Where and as whom jobs run.
    pub sandbox: Arc<Sandbox>,
    /// The agent's service replicas: their ports, probes and reports.
    pub serving: Arc<Serving>,
    /// Simulated GPUs (`--fake-gpus`): where attempts say which GPUs they hold and at what
    /// level they run; `None` on real GPUs.
    pub gpu_sim: Option<Arc<GpuSim>>,
}

/// The longest grace period the agent grants: a day. The lease comes from the network, and a
/// grace near `u64::MAX` seconds would overflow the agent's deadline arithmetic (`Instant +
/// grace` panicked, leaving the job's process group running).
pub const MAX_GRACE: Duration = Duration::from_secs(86_400);

/// The grace period of a lease: its own, or the agent's default when it names none (0); at
/// most [`MAX_GRACE`].
pub fn grace_of(lease: &Lease, opts: &RunOptions) -> Duration {
    let grace = if lease.grace_s > 0 {
        Duration::from_secs(lease.grace_s)
    } else {
        opts.default_grace
    };
    grace.min(MAX_GRACE)
}

/// Runs the attempt to its end and reports it on `sink`. Never fails: every problem becomes a
/// `Finished` event (unless the lease was lost, when nothing more is reported).
///
/// Two spans, each a child of the job's trace (the lease's `traceparent`): `job.launch` from
/// taking the lease to the process spawned (or refused), then `job.run` until it is reported.
pub async fn run_attempt(lease: Lease, sink: EventSink, mut stop: StopSignal, opts: RunOptions) {
    let attempt = lease.attempt.clone();
    let report = Reporter {
        sink: &sink,
        attempt: &attempt,
    };
    let launch = tracing::info_span!("job.launch", job.id = %attempt.job_id, attempt.id = %attempt.attempt_id);
    crate::telemetry::set_parent(&launch, lease.traceparent.as_deref());
    let Some(launched) = launch_attempt(&lease, &report, &mut stop, &opts)
        .instrument(launch)
        .await
    else {
        return;
    };
    let span =
        tracing::info_span!("job.run", job.id = %attempt.job_id, attempt.id = %attempt.attempt_id);
    crate::telemetry::set_parent(&span, lease.traceparent.as_deref());
    let grace = grace_of(&lease, &opts);
    supervise(launched, &lease, &report, &sink, stop, grace)
        .instrument(span)
        .await;
}

/// A started attempt: what its runner holds until the process ends.
struct Launched {
    child: Child,
    space: JobSpace,
    /// A service replica's port and probe.
    replica: Option<Reservation>,
    /// Its hold on simulated GPUs, released when the process ends.
    sim: Option<SimHold>,
}

/// Spawns the lease's process in a space of its own (a service replica with its port),
/// unless a stop came first; either way reports what kept it from starting.
async fn launch_attempt(
    lease: &Lease,
    report: &Reporter<'_>,
    stop: &mut StopSignal,
    opts: &RunOptions,
) -> Option<Launched> {
    tracing::info!(gpus = ?lease.gpus, "lease taken");
    let stopped_early = *stop.borrow_and_update();
    if let Some(reason) = stopped_early {
        if reason != StopReason::LeaseLost {
            let message = stop_message(reason, "before it started");
            report
                .finished(None, None, Some(message), Some(reason))
                .await;
        }
        return None;
    }
    let sandbox = &opts.sandbox;
    // A space whose process could not start is dropped: its directory goes, its uid is free;
    // so is a replica's port. The port is chosen last, just before the spawn, so that the
    // window in which another program may take it is as short as the agent can make it.
    let started = sandbox.enter(&lease.attempt).and_then(|space| {
        let replica = match &lease.serve {
            Some(_) => Some(opts.serving.reserve(&lease.attempt).map_err(|e| {
                format!("failed to start the service replica: no free port for it: {e}")
            })?),
            None => None,
        };
        let port = replica.as_ref().map(Reservation::port);
        let sim_file = match &opts.gpu_sim {
            Some(_) if !lease.gpus.is_empty() => Some(
                fakegpu::create_level_file(
                    space.dir(),
                    lease.expected_gpu_utilization_pct,
                    space.uid(),
                )
                .map_err(|e| format!("failed to start the job: its GPU level file: {e}"))?,
            ),
            _ => None,
        };
        spawn(lease, &space, sandbox, port, sim_file.as_deref())
            .map(|child| (child, space, replica, sim_file))
    });
    match started {
        Ok((child, space, mut replica, sim_file)) => {
            let sim = opts
                .gpu_sim
                .as_ref()
                .filter(|_| !lease.gpus.is_empty())
                .map(|board| {
                    board.attach(
                        lease.attempt.attempt_id,
                        &lease.gpus,
                        lease.expected_gpu_utilization_pct,
                        sim_file,
                    )
                });
            let pid = child.id().unwrap_or_default();
            tracing::info!(pid, uid = ?space.uid(), "job started");
            // The argv is the user's and may hold secrets: never at INFO.
            tracing::debug!(pid, command = ?lease.command, "job command");
            if let (Some(replica), Some(serve)) = (&mut replica, &lease.serve) {
                tracing::info!(
                    port = replica.port(),
                    probe = serve.readiness.as_ref().map(|r| r.path.as_str()),
                    "service replica started"
                );
                replica.started(serve.readiness.as_ref());
            }
            Some(Launched {
                child,
                space,
                replica,
                sim,
            })
        }
        Err(reason) => {
            tracing::warn!(error = %reason, "job could not be started");
            report.log(0, Stream::System, format!("{reason}\n")).await;
            report.finished(None, None, Some(reason), None).await;
            None
        }
    }
}

/// Watches a started attempt to its end (or stops it on request) and reports its output and
/// how it ended.
async fn supervise(
    launched: Launched,
    lease: &Lease,
    report: &Reporter<'_>,
    sink: &EventSink,
    mut stop: StopSignal,
    grace: Duration,
) {
    let Launched {
        mut child,
        space,
        mut replica,
        sim,
    } = launched;
    let attempt = &lease.attempt;
    // The id is known until the child is reaped, which has not happened yet.
    let pid = child.id().unwrap_or_default();

    let (pieces_tx, pieces_rx) = mpsc::channel(PIECE_QUEUE);
    let (ended_tx, ended_rx) = watch::channel(false);
    let mut readers = Vec::new();
    if let Some(pipe) = child.stdout.take() {
        readers.push(tokio::spawn(logs::read_stream(
            pipe,
            Stream::Stdout,
            pieces_tx.clone(),
            ended_rx.clone(),
        )));
    }
    if let Some(pipe) = child.stderr.take() {
        readers.push(tokio::spawn(logs::read_stream(
            pipe,
            Stream::Stderr,
            pieces_tx.clone(),
            ended_rx,
        )));
    }
    drop(pieces_tx);
    // `Started` goes first through the same task as the output, so that a full outbox never
    // keeps this task from watching for a stop.
    let pump = tokio::spawn({
        let (sink, attempt) = (sink.clone(), attempt.clone());
        async move {
            sink.send(AgentEvent::Started {
                attempt: attempt.clone(),
                pid,
            })
            .await;
            logs::pump(pieces_rx, sink, attempt, 0, COALESCE_WINDOW).await
        }
    });

    let started = Instant::now();
    let (status, stopped) = tokio::select! {
        status = child.wait() => {
            // A replica whose process ended is no longer reported.
            replica = None;
            // The job is over when its leader is; anything it left in its group would hold
            // GPUs the broker now counts as free (a fence meanwhile shortens their grace).
            let _ = stop_group(pid, grace, &mut stop).await;
            (status, None)
        }
        reason = stop_requested(&mut stop) => {
            let grace = match reason {
                StopReason::Fenced { grace: fence } => fence.min(grace),
                _ => grace,
            };
            tracing::info!(?reason, grace_ms = grace.as_millis() as u64, "stopping job");
            // SIGTERM: a replica takes no new requests from now on.
            if let Some(replica) = &replica {
                replica.stopping();
            }
            let (status, how) = tokio::join!(wait_for(&mut child), stop_group(pid, grace, &mut stop));
            (status, Some((reason, how)))
        }
    };
    drop(replica);
    // Its simulated GPUs are idle again.
    drop(sim);

    // Whatever still runs as the job's uid (out of its group, say) must not outlive it: it
    // would hold the GPUs the broker now counts as free, and see the next job with that uid.
    let left_behind = space.release().await;
    if left_behind > 0 {
        tracing::info!(
            processes = left_behind,
            "killed processes the job left behind"
        );
    }

    // Output already written is read to the end, however slow the outbox is.
    let _ = ended_tx.send(true);
    for reader in readers {
        let _ = reader.await;
    }
    let seq = pump.await.unwrap_or_default();

    let (exit_code, signal) = match &status {
        Ok(s) => (s.code(), s.signal()),
        Err(_) => (None, None),
    };
    let duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    tracing::info!(?exit_code, ?signal, duration_ms, "job ended");
    match stopped {
        // Not ours any more: the broker would reject anything we say.
        Some((StopReason::LeaseLost, _)) => {}
        Some((reason, (how, grace))) => {
            let how = match how {
                Termination::Killed if grace.is_zero() => "sent SIGKILL".to_string(),
                Termination::Killed if grace.subsec_millis() == 0 => format!(
                    "sent SIGTERM, then SIGKILL after the {} s grace period",
                    grace.as_secs()
                ),
                Termination::Killed => format!(
                    "sent SIGTERM, then SIGKILL after the {:.1} s grace period",
                    grace.as_secs_f64()
                ),
                Termination::Terminated | Termination::AlreadyGone => "sent SIGTERM".to_string(),
            };
            let message = stop_message(reason, &how);
            report
                .log(seq, Stream::System, format!("{message}\n"))
                .await;
            report
                .finished(exit_code, signal, Some(message), Some(reason))
                .await;
        }
        None => {
            let error = status
                .err()
                .map(|e| format!("waiting for the job failed: {e}"));
            report.finished(exit_code, signal, error, None).await;
        }
    }
}

async fn wait_for(child: &mut Child) -> std::io::Result<ExitStatus> {
    child.wait().await
}

/// Stops the group with `grace`; a fence that comes meanwhile and must kill sooner cuts the
/// grace short (SIGTERM again, SIGKILL after the fence's grace). How it ended, and the grace
/// that applied.
async fn stop_group(pid: u32, grace: Duration, stop: &mut StopSignal) -> (Termination, Duration) {
    let kill_at = Instant::now() + grace;
    let terminate = group::terminate(pid, grace);
    tokio::pin!(terminate);
    let mut watching = true;
    loop {
        tokio::select! {
            how = &mut terminate => return (how, grace),
            changed = stop.changed(), if watching => {
                if changed.is_err() {
                    watching = false;
                    continue;
                }
                let fence = match *stop.borrow_and_update() {
                    Some(StopReason::Fenced { grace }) => grace,
                    _ => continue,
                };
                if Instant::now() + fence < kill_at {
                    tracing::warn!(grace_ms = fence.as_millis() as u64,
                        "lease not renewed in time: cutting the stop's grace period short");
                    return (group::terminate(pid, fence).await, fence);
                }
            }
        }
    }
}

/// Resolves when a stop is requested; never, if the table dropped the sender.
async fn stop_requested(stop: &mut StopSignal) -> StopReason {
    loop {
        if let Some(reason) = *stop.borrow_and_update() {
            return reason;
        }
        if stop.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

fn stop_message(reason: StopReason, how: &str) -> String {
    match reason {
        StopReason::Broker => format!("stopped on the broker's request: {how}"),
        StopReason::Shutdown => format!("stopped because the agent is shutting down: {how}"),
        StopReason::LeaseLost => {
            format!("stopped because the broker no longer grants this lease: {how}")
        }
        StopReason::Fenced { .. } => format!(
            "stopped by the agent because it could not renew its lease with the broker in time \
             (the broker may give the job to another agent): {how}"
        ),
    }
}

/// The lease's argv as a new process group with piped output, in its space: its directory,
/// a clean environment (nothing of the agent's: its token, the operator's credentials) and,
/// when isolated, its uid and gid (std drops the supplementary groups when root sets a uid).
fn spawn(
    lease: &Lease,
    space: &JobSpace,
    sandbox: &Sandbox,
    port: Option<u16>,
    sim_file: Option<&std::path::Path>,
) -> Result<Child, String> {
    let Some((program, args)) = lease.command.split_first() else {
        return Err("failed to start the job: its command is empty".to_string());
    };
    let mut env = job_env(lease, space.dir(), sandbox.pass_env(), port);
    if let Some(file) = sim_file {
        env.insert(fakegpu::SIM_ENV.into(), file.as_os_str().to_owned());
    }
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env_clear()
        .envs(env)
        .current_dir(space.dir());
    if let Some(uid) = space.uid() {
        cmd.uid(uid).gid(uid);
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(false);
    cmd.spawn()
        .map_err(|e| format!("failed to start `{program}`: {e}"))
}

/// Sends one attempt's events; a closed channel means the agent is going away, so it is ignored.
struct Reporter<'a> {
    sink: &'a EventSink,
    attempt: &'a AttemptRef,
}

impl Reporter<'_> {
    async fn send(&self, event: AgentEvent) {
        self.sink.send(event).await;
    }

    async fn log(&self, seq: u64, stream: Stream, data: String) {
        self.send(AgentEvent::Log {
            attempt: self.attempt.clone(),
            seq,
            stream,
            data,
        })
        .await;
    }

    /// `Finished`; `stopped_for` says why the agent stopped it, if it did: the broker asked
    /// (`stopped`), a fence (`requeue`), or the agent's own orderly shutdown (`drained`).
    async fn finished(
        &self,
        exit_code: Option<i32>,
        signal: Option<i32>,
        error: Option<String>,
        stopped_for: Option<StopReason>,
    ) {
        self.send(AgentEvent::Finished {
            attempt: self.attempt.clone(),
            exit_code,
            signal,
            error,
            stopped: stopped_for == Some(StopReason::Broker),
            requeue: matches!(stopped_for, Some(StopReason::Fenced { .. })),
            drained: stopped_for == Some(StopReason::Shutdown),
        })
        .await;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use switchyard_protocol::agent::AttemptRef;
    use uuid::Uuid;

    fn lease(grace_s: u64) -> Lease {
        Lease {
            expected_gpu_utilization_pct: None,
            attempt: AttemptRef {
                job_id: Uuid::from_u128(1),
                attempt_id: Uuid::from_u128(2),
                epoch: 1,
            },
            command: vec!["true".into()],
            env: Default::default(),
            gpus: vec![0],
            grace_s,
            traceparent: None,
            serve: None,
        }
    }

    /// Found by the `agent_protocol` fuzz target: a lease with `grace_s` near `u64::MAX` made
    /// `Instant::now() + grace` (group::terminate) and `grace + STOP_MARGIN` (shutdown) panic.
    fn sandbox() -> (tempfile::TempDir, Arc<Sandbox>) {
        let dir = tempfile::tempdir().unwrap();
        let sandbox = Sandbox::new(&dir.path().join("jobs"), None, Vec::new()).unwrap();
        (dir, Arc::new(sandbox))
    }

    #[test]
    fn a_huge_grace_from_the_broker_is_capped() {
        let (_dir, sandbox) = sandbox();
        let serving = Arc::new(Serving::new("127.0.0.1").unwrap());
        let opts = RunOptions {
            default_grace: Duration::from_secs(30),
            sandbox: sandbox.clone(),
            serving: serving.clone(),
            gpu_sim: None,
        };
        for grace_s in [u64::MAX, u64::MAX / 1000, 86_401] {
            let grace = grace_of(&lease(grace_s), &opts);
            assert_eq!(grace, MAX_GRACE);
            assert!(
                Instant::now()
                    .checked_add(grace + Duration::from_secs(10))
                    .is_some()
            );
        }
        assert_eq!(grace_of(&lease(5), &opts), Duration::from_secs(5));
        assert_eq!(grace_of(&lease(0), &opts), Duration::from_secs(30));
        let huge_default = RunOptions {
            default_grace: Duration::MAX,
            sandbox,
            serving,
            gpu_sim: None,
        };
        assert_eq!(grace_of(&lease(0), &huge_default), MAX_GRACE);
    }

    /// A stop under way with a long grace (here 30 s) is cut short by a fence that must kill
    /// sooner: the job, which ignores SIGTERM, is killed at the fence's grace.
    #[tokio::test]
    async fn a_fence_cuts_a_slower_stop_short() {
        let mut l = lease(30);
        l.command = vec!["sh".into(), "-c".into(), "trap '' TERM; sleep 300".into()];
        let (_dir, sandbox) = sandbox();
        let space = sandbox.enter(&l.attempt).unwrap();
        let mut child = spawn(&l, &space, &sandbox, None, None).unwrap();
        let pid = child.id().unwrap();
        // Let the shell set its trap before the first SIGTERM.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let (tx, mut rx) = watch::channel(Some(StopReason::Broker));
        rx.borrow_and_update();
        let asked = Instant::now();
        let fence = async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            tx.send_replace(Some(StopReason::Fenced {
                grace: Duration::from_millis(300),
            }));
        };
        let ((how, grace), ()) =
            tokio::join!(stop_group(pid, Duration::from_secs(30), &mut rx), fence);
        let took = asked.elapsed();
        assert_eq!(
            (how, grace),
            (Termination::Killed, Duration::from_millis(300))
        );
        assert!(took >= Duration::from_millis(500), "{took:?}");
        assert!(took < Duration::from_secs(5), "{took:?}");
        assert!(!group::is_alive(pid));
        let status = child.wait().await.unwrap();
        assert_eq!(status.signal(), Some(9));
    }
}

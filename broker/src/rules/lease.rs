//! Lease fencing, the heart of "never run twice": whether an agent's report about an attempt is
//! applied, and what it does. Pure — the store looks the attempt up (by id, job, node and lease
//! epoch, in the report's transaction), asks [`judge`], and carries the verdict out; it decides
//! nothing itself.
//!
//! The rules:
//! - A report about no lease of this agent (an unknown attempt, another node's, or an older
//!   epoch) is rejected.
//! - `started` moves an `assigned` attempt to `running`; again once it runs, it is a duplicate;
//!   on an attempt whose lease was withdrawn (lost, cancelled, preempted) it is rejected.
//! - `log` chunks are kept while the attempt holds its lease, and after it finished (the last
//!   chunks may follow the end); the store checks their sequence.
//! - `finished` ends the job (succeeded, failed or cancelled), unless the attempt was being
//!   preempted, or the agent says it stopped it because it could not renew the lease
//!   (`requeue`) or because it was shutting down (`drained`): then the job goes back to the
//!   queue. Again after the end, it is a duplicate.

use switchyard_core::JobState;
use switchyard_protocol::agent::AgentEvent;

/// An attempt's state as the store keeps it (`attempts.state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttemptState {
    /// Placed; its agent has not said it started.
    Assigned,
    Running,
    /// Told to stop for a preemption; its GPUs are held until the agent reports the end.
    Preempting,
    Finished,
    /// Stopped for a preemption or an agent's shutdown; its job went back to the queue.
    Preempted,
    /// Its lease expired (or its agent stopped it for want of one); its job went back to the
    /// queue.
    Lost,
    /// Its job was cancelled before it started.
    Cancelled,
}

impl AttemptState {
    /// Every state the store keeps.
    pub const ALL: [AttemptState; 7] = [
        AttemptState::Assigned,
        AttemptState::Running,
        AttemptState::Preempting,
        AttemptState::Finished,
        AttemptState::Preempted,
        AttemptState::Lost,
        AttemptState::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            AttemptState::Assigned => "assigned",
            AttemptState::Running => "running",
            AttemptState::Preempting => "preempting",
            AttemptState::Finished => "finished",
            AttemptState::Preempted => "preempted",
            AttemptState::Lost => "lost",
            AttemptState::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<AttemptState> {
        Some(match s {
            "assigned" => AttemptState::Assigned,
            "running" => AttemptState::Running,
            "preempting" => AttemptState::Preempting,
            "finished" => AttemptState::Finished,
            "preempted" => AttemptState::Preempted,
            "lost" => AttemptState::Lost,
            "cancelled" => AttemptState::Cancelled,
            _ => return None,
        })
    }

    /// Whether the attempt still holds its lease (its GPUs are taken).
    pub fn is_live(self) -> bool {
        matches!(
            self,
            AttemptState::Assigned | AttemptState::Running | AttemptState::Preempting
        )
    }
}

/// Why an attempt that ended goes back to the queue instead of ending its job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Requeue<'a> {
    /// Stopped for a preemption: the attempt is `preempted`; the job keeps the reason the
    /// preemption wrote (which notes the progress made).
    Preempted,
    /// The agent stopped it on its own because it could not renew its lease in time
    /// (`requeue` on its report, with the agent's message): the attempt is `lost`, as when
    /// the lease expires, and the job runs again.
    Fenced(Option<&'a str>),
    /// Its agent was shut down in an orderly way and stopped it with the checkpoint signal
    /// (`drained` on its report, with the agent's message): the attempt is `preempted`, and
    /// the job runs again. Never `failed`: the job did nothing wrong.
    Drained(Option<&'a str>),
}

impl<'a> Requeue<'a> {
    /// The attempt's state, the error to note on the attempt, and the job's new reason.
    pub fn parts(self) -> (AttemptState, Option<&'a str>, Option<&'static str>) {
        match self {
            Requeue::Preempted => (AttemptState::Preempted, None, None),
            Requeue::Fenced(error) => (
                AttemptState::Lost,
                error,
                Some("requeued: its agent could not renew the lease in time and stopped it"),
            ),
            Requeue::Drained(error) => (
                AttemptState::Preempted,
                error,
                Some("requeued: its agent was shut down and stopped it with the checkpoint signal"),
            ),
        }
    }
}

/// What the store does with a report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict<'a> {
    /// `started`: the attempt becomes `running`, and so does its job.
    Start,
    /// `log`: keep the chunk (the store checks its sequence number).
    KeepLog,
    /// `finished`: the attempt becomes `finished` and its job ends in `state`, saying `reason`.
    Finish {
        state: JobState,
        reason: Option<String>,
    },
    /// `finished`: the attempt ends as `how` says and its job goes back to the queue.
    Requeue(Requeue<'a>),
    /// Already applied: acknowledged, nothing changes.
    Duplicate,
    /// Refused, saying why; nothing changes.
    Reject(&'static str),
}

/// A report about no lease of the reporting agent.
pub const NOT_A_LEASE: &str = "not a lease of this agent";
/// A report about an attempt whose lease was withdrawn (lost, cancelled, preempted).
pub const WITHDRAWN: &str = "the lease was withdrawn";

/// The verdict on `event`, reported by an agent about an attempt it holds in `state` (`None`:
/// no attempt with that id, job, node and epoch), whose job's cancellation was asked for when
/// `cancel_requested`.
pub fn judge<'a>(
    state: Option<AttemptState>,
    event: &'a AgentEvent,
    cancel_requested: bool,
) -> Verdict<'a> {
    use AttemptState as S;
    let Some(state) = state else {
        return Verdict::Reject(NOT_A_LEASE);
    };
    match event {
        AgentEvent::Started { .. } => match state {
            S::Assigned => Verdict::Start,
            S::Running | S::Finished | S::Preempting => Verdict::Duplicate,
            S::Preempted | S::Lost | S::Cancelled => Verdict::Reject(WITHDRAWN),
        },
        AgentEvent::Log { .. } => match state {
            S::Assigned | S::Running | S::Finished | S::Preempting => Verdict::KeepLog,
            S::Preempted | S::Lost | S::Cancelled => Verdict::Reject(WITHDRAWN),
        },
        AgentEvent::Finished {
            exit_code,
            signal,
            error,
            stopped,
            requeue,
            drained,
            ..
        } => match state {
            S::Preempting => Verdict::Requeue(Requeue::Preempted),
            S::Assigned | S::Running if *requeue => {
                Verdict::Requeue(Requeue::Fenced(error.as_deref()))
            }
            S::Assigned | S::Running if *drained => {
                Verdict::Requeue(Requeue::Drained(error.as_deref()))
            }
            S::Assigned | S::Running => {
                let (state, reason) = finished_outcome(
                    cancel_requested,
                    *exit_code,
                    *signal,
                    error.as_deref(),
                    *stopped,
                );
                Verdict::Finish { state, reason }
            }
            S::Finished => Verdict::Duplicate,
            S::Preempted | S::Lost | S::Cancelled => Verdict::Reject(WITHDRAWN),
        },
    }
}

/// How a job ends from its attempt's `finished` report: cancelled when that was asked for,
/// succeeded on exit code 0 without an error, failed otherwise — always saying why.
pub fn finished_outcome(
    cancel_requested: bool,
    exit_code: Option<i32>,
    signal: Option<i32>,
    error: Option<&str>,
    stopped: bool,
) -> (JobState, Option<String>) {
    let state = if cancel_requested {
        JobState::Cancelled
    } else if exit_code == Some(0) && error.is_none() {
        JobState::Succeeded
    } else {
        JobState::Failed
    };
    let reason = match (state, exit_code, signal, error) {
        (JobState::Cancelled, ..) => Some("cancelled by user".to_string()),
        (_, _, _, Some(e)) => Some(e.to_string()),
        (JobState::Failed, Some(c), _, _) => Some(format!("exited with code {c}")),
        (JobState::Failed, None, Some(s), _) => Some(format!("killed by signal {s}")),
        (JobState::Failed, None, None, None) if stopped => Some("stopped by the agent".into()),
        // A failed job always says why, even when its agent could not tell how it ended.
        (JobState::Failed, None, None, None) => {
            Some("ended without an exit code or a signal".into())
        }
        _ => None,
    };
    (state, reason)
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_protocol::agent::{AttemptRef, Stream};
    use uuid::Uuid;

    fn attempt() -> AttemptRef {
        AttemptRef {
            job_id: Uuid::from_u128(1),
            attempt_id: Uuid::from_u128(2),
            epoch: 1,
        }
    }

    fn started() -> AgentEvent {
        AgentEvent::Started {
            attempt: attempt(),
            pid: 1,
        }
    }

    fn log() -> AgentEvent {
        AgentEvent::Log {
            attempt: attempt(),
            seq: 0,
            stream: Stream::Stdout,
            data: "x".into(),
        }
    }

    fn finished(exit_code: Option<i32>, requeue: bool, drained: bool) -> AgentEvent {
        AgentEvent::Finished {
            attempt: attempt(),
            exit_code,
            signal: None,
            error: None,
            stopped: false,
            requeue,
            drained,
        }
    }

    /// One row per attempt state: the verdict on `started`, `log`, `finished` (exit 0),
    /// `finished` with `requeue`, `finished` with `drained`.
    #[rustfmt::skip]
    #[test]
    fn the_verdict_for_every_state_and_report() {
        use AttemptState as S;
        let done = Verdict::Finish { state: JobState::Succeeded, reason: None };
        let fenced = Verdict::Requeue(Requeue::Fenced(None));
        let drained = Verdict::Requeue(Requeue::Drained(None));
        let pre = Verdict::Requeue(Requeue::Preempted);
        let gone = Verdict::Reject(WITHDRAWN);
        let dup = Verdict::Duplicate;
        let table: [(S, [Verdict; 5]); 7] = [
            (S::Assigned,   [Verdict::Start, Verdict::KeepLog, done.clone(), fenced.clone(), drained.clone()]),
            (S::Running,    [dup.clone(),    Verdict::KeepLog, done,         fenced,         drained]),
            (S::Preempting, [dup.clone(),    Verdict::KeepLog, pre.clone(),  pre.clone(),    pre]),
            (S::Finished,   [dup.clone(),    Verdict::KeepLog, dup.clone(),  dup.clone(),    dup]),
            (S::Preempted,  [gone.clone(),   gone.clone(),     gone.clone(), gone.clone(),   gone.clone()]),
            (S::Lost,       [gone.clone(),   gone.clone(),     gone.clone(), gone.clone(),   gone.clone()]),
            (S::Cancelled,  [gone.clone(),   gone.clone(),     gone.clone(), gone.clone(),   gone]),
        ];
        let events = [started(), log(), finished(Some(0), false, false),
                      finished(Some(0), true, false), finished(Some(0), false, true)];
        for (state, want) in table {
            for (event, want) in events.iter().zip(want) {
                assert_eq!(judge(Some(state), event, false), want, "{state:?} {event:?}");
            }
        }
    }

    #[test]
    fn a_report_about_no_lease_of_the_agent_is_rejected() {
        for event in [started(), log(), finished(Some(0), false, false)] {
            assert_eq!(judge(None, &event, false), Verdict::Reject(NOT_A_LEASE));
        }
    }

    #[test]
    fn a_cancelled_job_ends_cancelled_whatever_its_exit() {
        for code in [Some(0), Some(1), None] {
            let report = finished(code, false, false);
            let v = judge(Some(AttemptState::Running), &report, true);
            assert_eq!(
                v,
                Verdict::Finish {
                    state: JobState::Cancelled,
                    reason: Some("cancelled by user".into())
                }
            );
        }
        // A preemption's end still requeues (the cancel is applied when it is planned again).
        assert_eq!(
            judge(
                Some(AttemptState::Preempting),
                &finished(Some(0), false, false),
                true
            ),
            Verdict::Requeue(Requeue::Preempted)
        );
    }

    #[test]
    fn a_failed_job_always_says_why() {
        let end = |code, signal, error: Option<&str>, stopped| {
            finished_outcome(false, code, signal, error, stopped)
        };
        assert_eq!(end(Some(0), None, None, false), (JobState::Succeeded, None));
        assert_eq!(
            end(Some(3), None, None, false),
            (JobState::Failed, Some("exited with code 3".into()))
        );
        assert_eq!(
            end(None, Some(9), None, false),
            (JobState::Failed, Some("killed by signal 9".into()))
        );
        assert_eq!(
            end(Some(0), None, Some("spawn failed"), false),
            (JobState::Failed, Some("spawn failed".into()))
        );
        assert_eq!(
            end(None, None, None, true),
            (JobState::Failed, Some("stopped by the agent".into()))
        );
        assert_eq!(
            end(None, None, None, false),
            (
                JobState::Failed,
                Some("ended without an exit code or a signal".into())
            )
        );
    }

    #[test]
    fn states_read_back_as_written() {
        for s in AttemptState::ALL {
            assert_eq!(AttemptState::parse(s.as_str()), Some(s));
        }
        assert_eq!(AttemptState::parse("sleeping"), None);
        let live: Vec<_> = AttemptState::ALL.iter().filter(|s| s.is_live()).collect();
        assert_eq!(
            live,
            [
                &AttemptState::Assigned,
                &AttemptState::Running,
                &AttemptState::Preempting
            ]
        );
    }
}

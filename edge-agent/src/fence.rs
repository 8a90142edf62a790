//! Self-fencing: an agent that cannot renew its lease stops its jobs before the broker may give
//! them to another agent, so that no job runs twice at once.
//!
//! The broker declares a node lost, and requeues its work, `lease_ttl_s` after the last
//! heartbeat it recorded (`scheduler.rs`, `expire_leases`), never earlier: it records a
//! heartbeat at the moment it hears it, which is after the agent sent it. So the agent counts
//! from the *send* time of its last heartbeat that was answered (a renewal) and has every job's
//! process group gone by `renewal + TTL − FENCE_MARGIN` (the [`FencePlan::window`]): a job
//! whose grace fits gets SIGTERM at `window − grace` and SIGKILL at the window; one whose grace
//! does not fit (see [`FencePlan::stop_at`]) gets SIGKILL at the window (and a warning, once).
//!
//! The margin covers what lies between the agent's clock and the broker's decision: a SIGKILLed
//! process takes a few milliseconds to die, and the fence's own timer fires a little late (the
//! broker answers a heartbeat only once it is written, so an answered heartbeat is one lease
//! expiry sees). It is not meant to absorb clock skew between broker replicas.
//!
//! A heartbeat that fails, times out, or is answered after the window changes nothing: only an
//! answered heartbeat renews, and only from when it was sent. A fresh enrolment is the first
//! renewal, from when the answered registration was sent: the broker writes the new node with
//! its first heartbeat (`last_heartbeat`) before it answers, so a burst instance takes its
//! first lease without waiting for its first heartbeat's batch (`heartbeats.rs`, `GATHER`). While
//! the lease is not renewed (an agent with a saved enrolment before its first heartbeat is
//! answered, and once a window has passed) the agent takes no new lease:
//! [`LeaseClock::fenced`].
//!
//! The price: the agent cannot tell a broker that is down from one it is cut off from, so a
//! broker (or every replica) down for longer than the window stops the agents' work too.

use crate::attempts::AttemptTable;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// Between the agent's deadline and the broker's: see the module documentation.
pub const FENCE_MARGIN: Duration = Duration::from_secs(1);
/// The longest lease TTL taken from the broker (30 days): a TTL near `u64::MAX` seconds would
/// overflow `Instant + window`.
pub const MAX_LEASE_TTL: Duration = Duration::from_secs(30 * 86_400);

/// The fence's timing, from the lease TTL the broker gave at enrolment and the heartbeat period.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FencePlan {
    /// Every job is gone this long after the send of the last renewal: the TTL less the margin.
    pub window: Duration,
    /// The heartbeat period to use: the configured one, but at most half the window, so that a
    /// single heartbeat lost or late never stops a job.
    pub heartbeat: Duration,
}

/// When, after a renewal, to stop one job, and how.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FenceStop {
    /// From the renewal's send time to the SIGTERM.
    pub after: Duration,
    /// Between SIGTERM and SIGKILL (zero: SIGKILL at once).
    pub grace: Duration,
    /// False when the job's own grace did not fit in the window (it is then killed at the
    /// window's end without grace).
    pub fits: bool,
}

impl FencePlan {
    /// The plan for `lease_ttl`, with heartbeats every `heartbeat`; `None` when the TTL is not
    /// known (zero), in which case the agent does not fence.
    pub fn new(lease_ttl: Duration, heartbeat: Duration) -> Option<FencePlan> {
        if lease_ttl.is_zero() {
            return None;
        }
        let window = lease_ttl.min(MAX_LEASE_TTL).saturating_sub(FENCE_MARGIN);
        let half = window / 2;
        let heartbeat = if heartbeat > half && !half.is_zero() {
            half
        } else {
            heartbeat
        };
        Some(FencePlan { window, heartbeat })
    }

    /// How a job with `grace` is stopped. Its grace fits when the SIGTERM still comes no
    /// earlier than two heartbeat periods after the renewal (so one lost heartbeat does not
    /// stop it); otherwise it gets SIGKILL at the end of the window.
    pub fn stop_at(&self, grace: Duration) -> FenceStop {
        let slack = self.window.saturating_sub(grace);
        if grace <= self.window && slack >= self.heartbeat.saturating_mul(2) {
            FenceStop {
                after: slack,
                grace,
                fits: true,
            }
        } else {
            FenceStop {
                after: self.window,
                grace: Duration::ZERO,
                fits: false,
            }
        }
    }

    /// How long one heartbeat may take before it is given up and the next one sent: half the
    /// window (at least 1 s), so that a heartbeat stuck on a dead connection leaves time for
    /// another to renew the lease before the fence.
    pub fn heartbeat_timeout(&self) -> Duration {
        (self.window / 2).max(Duration::from_secs(1))
    }
}

/// The lease as the agent knows it: when its last renewal was sent, and the plan.
pub struct LeaseClock {
    plan: FencePlan,
    renewed: watch::Sender<Option<Instant>>,
    warned: AtomicBool,
}

impl LeaseClock {
    pub fn new(plan: FencePlan) -> Arc<LeaseClock> {
        Arc::new(LeaseClock {
            plan,
            renewed: watch::channel(None).0,
            warned: AtomicBool::new(false),
        })
    }

    pub fn plan(&self) -> FencePlan {
        self.plan
    }

    /// A heartbeat sent at `sent` was answered: the lease runs from then (a later renewal
    /// already recorded wins).
    pub fn renewed(&self, sent: Instant) {
        self.renewed.send_if_modified(|last| match last {
            Some(old) if *old >= sent => false,
            _ => {
                *last = Some(sent);
                true
            }
        });
    }

    /// The send time of the last renewal, if any.
    pub fn last_renewal(&self) -> Option<Instant> {
        *self.renewed.borrow()
    }

    /// True when the agent may not run anything: no renewal yet, or the window since the last
    /// one has passed.
    pub fn fenced(&self, now: Instant) -> bool {
        match self.last_renewal() {
            Some(sent) => now >= sent + self.plan.window,
            None => true,
        }
    }

    /// Resolves once the agent is not fenced (at once if it is not).
    pub async fn unfenced(&self) {
        let mut renewals = self.renewed.subscribe();
        loop {
            if !self.fenced(Instant::now()) {
                return;
            }
            if renewals.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Stops what is due at `now` (see [`FencePlan::stop_at`]); returns when the next job is
    /// due, if one runs that is not stopped yet.
    pub fn fence_due(&self, attempts: &AttemptTable, now: Instant) -> Option<Instant> {
        let renewal = self.last_renewal();
        let mut next: Option<Instant> = None;
        for (id, grace) in attempts.unfenced() {
            let Some(sent) = renewal else {
                // Nothing should run before the first renewal; if something does, stop it now.
                attempts.fence(id, Duration::ZERO);
                continue;
            };
            let stop = self.plan.stop_at(grace);
            if !stop.fits && !self.warned.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    grace_s = grace.as_secs(),
                    window_ms = self.plan.window.as_millis() as u64,
                    heartbeat_ms = self.plan.heartbeat.as_millis() as u64,
                    "a job's grace period does not fit in the lease TTL less the fencing margin: \
                     cut off from the broker, the agent will SIGKILL such jobs without grace"
                );
            }
            let end = sent + self.plan.window;
            let term_at = sent + stop.after;
            if now >= term_at {
                // Never past the window's end, even when the timer fired late.
                let grace = stop.grace.min(end.saturating_duration_since(now));
                if attempts.fence(id, grace) {
                    tracing::warn!(attempt.id = %id, grace_ms = grace.as_millis() as u64,
                        since_renewal_ms = now.saturating_duration_since(sent).as_millis() as u64,
                        "lease not renewed in time: stopping the job (self-fencing)");
                }
            } else {
                next = Some(next.map_or(term_at, |n| n.min(term_at)));
            }
        }
        next
    }

    /// Watches renewals and the attempts; stops each job when it is due. Runs until aborted.
    pub async fn run(self: Arc<Self>, attempts: Arc<AttemptTable>) {
        let mut renewals = self.renewed.subscribe();
        let mut admitted = attempts.subscribe();
        loop {
            renewals.borrow_and_update();
            admitted.borrow_and_update();
            let next = self.fence_due(&attempts, Instant::now());
            tokio::select! {
                changed = renewals.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
                changed = admitted.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
                () = sleep_until(next) => {}
            }
        }
    }
}

/// Sleeps until `at`; forever when `None`.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::attempts::StopReason;
    use std::collections::BTreeMap;
    use switchyard_protocol::agent::{AttemptRef, Lease};
    use uuid::Uuid;

    fn s(secs: f64) -> Duration {
        Duration::from_secs_f64(secs)
    }

    #[test]
    fn the_job_is_gone_a_margin_before_the_broker_may_requeue_it() {
        // The broker's defaults: TTL 30 s, heartbeats every 5 s, 10 s grace.
        let plan = FencePlan::new(s(30.0), s(5.0)).unwrap();
        assert_eq!(plan.window, s(29.0));
        assert_eq!(plan.heartbeat, s(5.0));
        let stop = plan.stop_at(s(10.0));
        assert_eq!(
            (stop.after, stop.grace, stop.fits),
            (s(19.0), s(10.0), true)
        );
        // SIGKILL (after + grace) no later than TTL − margin, counted from the send time.
        assert!(stop.after + stop.grace + FENCE_MARGIN <= s(30.0));
        assert_eq!(plan.heartbeat_timeout(), s(14.5));
    }

    #[test]
    fn a_grace_that_does_not_fit_becomes_a_sigkill_at_the_end_of_the_window() {
        // The partition test's broker: TTL 3 s, heartbeats every second, 2 s grace.
        let plan = FencePlan::new(s(3.0), s(1.0)).unwrap();
        assert_eq!((plan.window, plan.heartbeat), (s(2.0), s(1.0)));
        let stop = plan.stop_at(s(2.0));
        assert_eq!(
            (stop.after, stop.grace, stop.fits),
            (s(2.0), Duration::ZERO, false)
        );
        // A grace longer than the whole TTL, and a day (the agent's cap).
        assert!(!plan.stop_at(s(10.0)).fits);
        assert_eq!(plan.stop_at(s(86_400.0)).after, s(2.0));
        // A grace that fits only if a single lost heartbeat may stop the job does not fit.
        let plan = FencePlan::new(s(10.0), s(1.0)).unwrap();
        assert!(plan.stop_at(s(7.0)).fits);
        assert!(!plan.stop_at(s(7.5)).fits);
    }

    #[test]
    fn a_tight_ttl_shortens_the_heartbeat_and_an_unknown_one_turns_fencing_off() {
        // TTL 2 s with 1 s heartbeats: the window (1 s) holds two heartbeats of 0.5 s.
        let plan = FencePlan::new(s(2.0), s(1.0)).unwrap();
        assert_eq!((plan.window, plan.heartbeat), (s(1.0), s(0.5)));
        assert_eq!(plan.heartbeat_timeout(), s(1.0));
        assert_eq!(FencePlan::new(Duration::ZERO, s(5.0)), None);
        // A TTL no longer than the margin: nothing can run, nothing overflows.
        let plan = FencePlan::new(s(1.0), s(1.0)).unwrap();
        assert_eq!(plan.window, Duration::ZERO);
        assert_eq!(plan.heartbeat, s(1.0));
        assert!(!plan.stop_at(Duration::ZERO).fits);
        // A TTL near u64::MAX seconds from the broker is capped: no deadline overflows.
        let huge = FencePlan::new(Duration::from_secs(u64::MAX), Duration::MAX).unwrap();
        assert_eq!(huge.window, MAX_LEASE_TTL - FENCE_MARGIN);
        assert!(huge.heartbeat <= huge.window / 2);
        assert!(huge.stop_at(Duration::MAX).after <= huge.window);
        let clock = LeaseClock::new(huge);
        clock.renewed(Instant::now());
        assert!(!clock.fenced(Instant::now()));
    }

    fn lease(n: u128, grace_s: u64) -> Lease {
        Lease {
            expected_gpu_utilization_pct: None,
            attempt: AttemptRef {
                job_id: Uuid::from_u128(n),
                attempt_id: Uuid::from_u128(n),
                epoch: 1,
            },
            command: vec!["true".into()],
            env: BTreeMap::new(),
            gpus: vec![],
            grace_s,
            traceparent: None,
            serve: None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn jobs_are_stopped_on_time_unless_the_lease_is_renewed() {
        // TTL 30 s, heartbeats every 5 s: window 29 s.
        let clock = LeaseClock::new(FencePlan::new(s(30.0), s(5.0)).unwrap());
        let attempts = Arc::new(AttemptTable::new());
        let t0 = Instant::now();
        assert!(clock.fenced(t0), "nothing runs before the first renewal");
        clock.renewed(t0);
        assert!(!clock.fenced(t0));
        clock.renewed(t0 - s(1.0)); // an older renewal answered late changes nothing
        assert_eq!(clock.last_renewal(), Some(t0));

        let short = attempts.admit(&lease(1, 10), s(10.0)).unwrap();
        let long = attempts.admit(&lease(2, 60), s(60.0)).unwrap();
        let fence = tokio::spawn(clock.clone().run(attempts.clone()));

        // Renewed at t0 + 5 s (sent then): everything moves 5 s later.
        tokio::time::sleep(s(5.0)).await;
        clock.renewed(t0 + s(5.0));
        tokio::time::sleep(s(18.9)).await; // t0 + 23.9: the short job's SIGTERM is due at 24
        assert_eq!(*short.borrow(), None);
        tokio::time::sleep(s(0.2)).await; // t0 + 24.1
        assert_eq!(
            *short.borrow(),
            Some(StopReason::Fenced { grace: s(10.0) }),
            "SIGTERM at renewal + 19 s; SIGKILL still at renewal + 29 s"
        );
        // The 60 s grace does not fit: SIGKILL at the end of the window, t0 + 34.
        assert_eq!(*long.borrow(), None);
        tokio::time::sleep(s(10.0)).await; // t0 + 34.1
        assert_eq!(
            *long.borrow(),
            Some(StopReason::Fenced {
                grace: Duration::ZERO
            })
        );
        assert!(clock.fenced(Instant::now()));

        // A lease taken after the window (it should not be) is stopped at once.
        let late = attempts.admit(&lease(3, 1), s(1.0)).unwrap();
        tokio::time::sleep(s(0.01)).await;
        assert_eq!(
            *late.borrow(),
            Some(StopReason::Fenced {
                grace: Duration::ZERO
            })
        );
        fence.abort();
    }

    #[test]
    fn a_fence_overrides_any_other_stop_once() {
        let attempts = AttemptTable::new();
        let rx = attempts.admit(&lease(1, 10), s(10.0)).unwrap();
        assert!(attempts.stop(Uuid::from_u128(1), StopReason::Broker));
        assert!(attempts.fence(Uuid::from_u128(1), s(1.0)));
        assert_eq!(*rx.borrow(), Some(StopReason::Fenced { grace: s(1.0) }));
        assert!(!attempts.fence(Uuid::from_u128(1), s(0.0)), "fenced once");
        for other in [
            StopReason::Broker,
            StopReason::LeaseLost,
            StopReason::Shutdown,
        ] {
            attempts.stop(Uuid::from_u128(1), other);
            assert_eq!(*rx.borrow(), Some(StopReason::Fenced { grace: s(1.0) }));
        }
        assert!(attempts.unfenced().is_empty());
        // A lost lease (its stop under way with the full grace) is fenced too.
        let rx = attempts.admit(&lease(2, 10), s(10.0)).unwrap();
        attempts.stop(Uuid::from_u128(2), StopReason::LeaseLost);
        assert_eq!(attempts.unfenced(), vec![(Uuid::from_u128(2), s(10.0))]);
        assert!(attempts.fence(Uuid::from_u128(2), s(0.5)));
        assert_eq!(*rx.borrow(), Some(StopReason::Fenced { grace: s(0.5) }));
        assert!(
            !attempts.fence(Uuid::from_u128(9), s(0.5)),
            "not running here"
        );
    }
}

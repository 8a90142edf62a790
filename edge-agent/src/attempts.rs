//! The attempts this agent holds: which leases run, which already ran (so that a lease delivered
//! again is not started twice), and the stop signal of each running one. Shared by the work
//! loop, the heartbeat and the outbox; a plain mutex, never held across an await.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;
use switchyard_protocol::agent::{AttemptRef, Lease};
use tokio::sync::watch;
use uuid::Uuid;

/// How many finished attempt ids are remembered for deduplication.
const REMEMBERED_FINISHED: usize = 4096;

/// Why an attempt is being stopped; decides what the agent reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// The broker asked (cancel, preemption): reported as `stopped`.
    Broker,
    /// The broker rejected the attempt's events: the lease is not ours, report nothing more.
    LeaseLost,
    /// The agent itself is shutting down in an orderly way (SIGTERM, SIGINT, stdin closed):
    /// reported as `drained`, so that the broker requeues the job instead of failing it.
    Shutdown,
    /// The agent could not renew its lease in time (self-fencing, see [`crate::fence`]): the
    /// job gets SIGTERM and at most `grace` before SIGKILL, however long a stop already under
    /// way would have given it. Reported as failed, with the reason; the broker rejects the
    /// report when it has given the job to another agent meanwhile.
    Fenced { grace: Duration },
}

/// The receiving end of one attempt's stop signal.
pub type StopSignal = watch::Receiver<Option<StopReason>>;

struct Running {
    attempt: AttemptRef,
    grace: Duration,
    stop: watch::Sender<Option<StopReason>>,
}

#[derive(Default)]
struct Inner {
    running: HashMap<Uuid, Running>,
    finished: HashSet<Uuid>,
    finished_order: VecDeque<Uuid>,
}

#[derive(Default)]
pub struct AttemptTable {
    inner: Mutex<Inner>,
    /// Counts admissions, for the fence (which must see every new attempt at once).
    admitted: watch::Sender<u64>,
}

impl AttemptTable {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic elsewhere must not wedge the agent: the table stays consistent per call.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes a lease: its stop signal if it is new, `None` if it runs or ran already.
    pub fn admit(&self, lease: &Lease, grace: Duration) -> Option<StopSignal> {
        let mut inner = self.lock();
        let id = lease.attempt.attempt_id;
        if inner.running.contains_key(&id) || inner.finished.contains(&id) {
            return None;
        }
        let (tx, rx) = watch::channel(None);
        inner.running.insert(
            id,
            Running {
                attempt: lease.attempt.clone(),
                grace,
                stop: tx,
            },
        );
        drop(inner);
        self.admitted.send_modify(|n| *n = n.wrapping_add(1));
        Some(rx)
    }

    /// Asks a running attempt to stop; false when it is not running here. The first reason
    /// wins, except that a lost lease overrides (nothing more may be reported for it), and a
    /// fence overrides both (its deadline is what keeps the job from running twice; the outbox
    /// drops what a lost attempt reports).
    pub fn stop(&self, attempt_id: Uuid, reason: StopReason) -> bool {
        let inner = self.lock();
        let Some(r) = inner.running.get(&attempt_id) else {
            return false;
        };
        r.stop.send_if_modified(|current| match (*current, reason) {
            (Some(StopReason::Fenced { .. }), _) => false,
            (_, StopReason::Fenced { .. }) => {
                *current = Some(reason);
                true
            }
            (Some(StopReason::LeaseLost), _) => false,
            (Some(_), r) if r != StopReason::LeaseLost => false,
            _ => {
                *current = Some(reason);
                true
            }
        });
        true
    }

    /// Fences a running attempt: SIGTERM now, SIGKILL after `grace` at most. True the first
    /// time; false when it is not running here or is already fenced.
    pub fn fence(&self, attempt_id: Uuid, grace: Duration) -> bool {
        let inner = self.lock();
        let Some(r) = inner.running.get(&attempt_id) else {
            return false;
        };
        r.stop.send_if_modified(|current| match current {
            Some(StopReason::Fenced { .. }) => false,
            _ => {
                *current = Some(StopReason::Fenced { grace });
                true
            }
        })
    }

    /// The running attempts not yet fenced, with their grace.
    pub fn unfenced(&self) -> Vec<(Uuid, Duration)> {
        self.lock()
            .running
            .iter()
            .filter(|(_, r)| !matches!(*r.stop.borrow(), Some(StopReason::Fenced { .. })))
            .map(|(id, r)| (*id, r.grace))
            .collect()
    }

    /// Changes with every admission.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.admitted.subscribe()
    }

    /// Stops every running attempt; returns the longest grace among them.
    pub fn stop_all(&self, reason: StopReason) -> Duration {
        let ids: Vec<(Uuid, Duration)> = self
            .lock()
            .running
            .iter()
            .map(|(id, r)| (*id, r.grace))
            .collect();
        let mut longest = Duration::ZERO;
        for (id, grace) in ids {
            self.stop(id, reason);
            longest = longest.max(grace);
        }
        longest
    }

    /// Records that an attempt's process is gone and its outcome reported.
    pub fn finish(&self, attempt_id: Uuid) {
        let mut inner = self.lock();
        if inner.running.remove(&attempt_id).is_some() && inner.finished.insert(attempt_id) {
            inner.finished_order.push_back(attempt_id);
            while inner.finished_order.len() > REMEMBERED_FINISHED {
                if let Some(old) = inner.finished_order.pop_front() {
                    inner.finished.remove(&old);
                }
            }
        }
    }

    /// The attempts whose process runs (or is being started or stopped), for the heartbeat.
    pub fn running(&self) -> Vec<AttemptRef> {
        let mut refs: Vec<AttemptRef> = self
            .lock()
            .running
            .values()
            .map(|r| r.attempt.clone())
            .collect();
        refs.sort();
        refs
    }

    pub fn running_count(&self) -> usize {
        self.lock().running.len()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::collections::BTreeMap;

    fn lease(n: u128) -> Lease {
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
            grace_s: 1,
            traceparent: None,
            serve: None,
        }
    }

    #[test]
    fn admits_each_attempt_once() {
        let t = AttemptTable::new();
        let g = Duration::from_secs(1);
        assert!(t.admit(&lease(1), g).is_some());
        assert!(t.admit(&lease(1), g).is_none(), "running");
        t.finish(Uuid::from_u128(1));
        assert!(t.admit(&lease(1), g).is_none(), "finished");
        assert!(t.admit(&lease(2), g).is_some());
        assert_eq!(t.running().len(), 1);
    }

    #[test]
    fn lease_lost_overrides_other_stops() {
        let t = AttemptTable::new();
        let rx = t.admit(&lease(1), Duration::from_secs(3)).unwrap();
        assert!(t.stop(Uuid::from_u128(1), StopReason::Broker));
        assert!(t.stop(Uuid::from_u128(1), StopReason::Shutdown));
        assert_eq!(*rx.borrow(), Some(StopReason::Broker));
        t.stop(Uuid::from_u128(1), StopReason::LeaseLost);
        assert_eq!(*rx.borrow(), Some(StopReason::LeaseLost));
        t.stop(Uuid::from_u128(1), StopReason::Broker);
        assert_eq!(*rx.borrow(), Some(StopReason::LeaseLost));
        assert!(!t.stop(Uuid::from_u128(9), StopReason::Broker));
        assert_eq!(t.stop_all(StopReason::Shutdown), Duration::from_secs(3));
    }
}

//! Leader election among broker replicas on one database. Every replica serves the REST API and
//! the agent protocol; exactly one, the leader, runs the scheduler loop, the burst controller
//! and the ledger's accrual.
//!
//! The lease is one row (`leader_lease`): the holder renews it every quarter of
//! `leader_ttl_ms`; when it has not for the whole TTL, any replica takes it under the next
//! epoch (the same replica restarting takes it back at once). The epoch fences the leader's
//! writes: each of them checks it in its own transaction ([`crate::store::Fence`]), so a leader
//! that stalled, lost its database connection or was partitioned away cannot write after a
//! successor took over, even before it notices. A new leader rebuilds its state from the
//! database (the scheduler reloads its mirror when it starts leading).

use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;
use uuid::Uuid;

use crate::state::App;
use crate::store::Store;

/// This replica's side of the election.
pub struct Leadership {
    replica: String,
    /// This process's run of the replica: a renewal is only a renewal for the same run.
    instance: Uuid,
    /// `Some(epoch)` while this replica leads.
    state: watch::Sender<Option<i64>>,
}

impl Leadership {
    pub fn new(replica: String) -> Arc<Leadership> {
        Arc::new(Leadership {
            replica,
            instance: Uuid::now_v7(),
            state: watch::Sender::new(None),
        })
    }

    pub fn replica(&self) -> &str {
        &self.replica
    }

    /// The epoch this replica leads under, when it leads.
    pub fn epoch(&self) -> Option<i64> {
        *self.state.borrow()
    }

    pub fn is_leader(&self) -> bool {
        self.epoch().is_some()
    }

    /// Changes of [`Leadership::epoch`].
    pub fn watch(&self) -> watch::Receiver<Option<i64>> {
        self.state.subscribe()
    }

    /// Waits until this replica leads; returns the epoch.
    pub async fn until_leader(&self) -> i64 {
        let mut rx = self.watch();
        loop {
            if let Some(epoch) = *rx.borrow_and_update() {
                return epoch;
            }
            if rx.changed().await.is_err() {
                // The sender lives as long as `self`: unreachable, but never spin.
                std::future::pending::<()>().await;
            }
        }
    }

    /// Stops leading at once: a fenced write said another replica took over, or the lease
    /// could not be renewed in time.
    pub fn step_down(&self, store: &Store, why: &str) {
        store.fence().lose();
        let was = self.state.send_replace(None);
        if let Some(epoch) = was {
            tracing::warn!(replica = %self.replica, epoch, reason = why, "no longer the leader");
        }
    }

    fn lead(&self, store: &Store, epoch: i64) {
        store.fence().hold(epoch);
        if self.state.send_replace(Some(epoch)) != Some(epoch) {
            tracing::info!(replica = %self.replica, epoch, "leading: scheduler, burst controller and ledger run here");
        }
    }

    /// Gives the lease up (clean shutdown) so a follower takes over without waiting for it
    /// to expire.
    pub async fn resign(&self, store: &Store) {
        let was = self.epoch();
        self.step_down(store, "shutting down");
        if was.is_some()
            && let Err(e) = store.resign_leadership(self.instance).await
        {
            tracing::warn!(error = %e, "could not resign the leader lease; it expires by itself");
        }
    }
}

/// The election loop, for the life of the process.
pub async fn run(app: App) {
    let ttl = Duration::from_millis(app.config.leader_ttl_ms);
    let every = (ttl / 4).max(Duration::from_millis(50));
    let leadership = app.leadership.clone();
    let store = app.store.as_ref();
    let mut renewed_at: Option<Instant> = None;
    loop {
        let asked = Instant::now();
        match store
            .acquire_leadership(
                &leadership.replica,
                leadership.instance,
                ttl.as_millis() as i64,
                app.clock.now(),
            )
            .await
        {
            Ok(Some(epoch)) => {
                // The database set the expiry after `asked`: the lease is ours until at
                // least `asked + ttl`.
                renewed_at = Some(asked);
                leadership.lead(store, epoch);
            }
            Ok(None) => {
                renewed_at = None;
                if leadership.is_leader() {
                    leadership.step_down(store, "another replica holds the lease");
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "leader election: the database did not answer");
                // Step down before the lease can expire, not after: past `ttl` a follower may
                // already lead (fencing would reject our writes anyway).
                if leadership.is_leader()
                    && renewed_at.is_none_or(|t| t.elapsed() >= ttl.mul_f32(0.75))
                {
                    leadership.step_down(store, "the lease could not be renewed in time");
                }
            }
        }
        app.metrics.set_leader(leadership.epoch());
        tokio::time::sleep(every).await;
    }
}

//! Heartbeats of healthy nodes are kept in memory and written together, once every
//! [`FLUSH_EVERY`], in one transaction ([`Store::record_heartbeats`]), instead of one write
//! transaction per heartbeat. With 10,000 agents heartbeating every 10 s that is 2 write
//! transactions a second instead of 1,000; the heartbeat itself is answered from one read (the
//! attempts its agent must stop).
//!
//! What this changes, and why it is safe:
//! - A node's `last_heartbeat` in the database lags what this replica has heard by at most
//!   [`FLUSH_EVERY`] (plus a failed flush's retry). Lease expiry on this replica flushes first
//!   ([`HeartbeatBuffer::flush`]), so a heartbeat heard here is never ignored by it; a heartbeat
//!   heard by another replica is at most [`FLUSH_EVERY`] late, far inside any lease TTL (which the
//!   config requires to exceed the heartbeat interval, counted in seconds).
//! - A broker killed before a flush loses at most [`FLUSH_EVERY`] of heartbeats: the nodes'
//!   leases look that much older, and their next heartbeat renews them. No job, event or report
//!   goes through here.
//! - A node that is not healthy (lost) is never brought back by a buffered write: the heartbeat
//!   handler sends such a node's heartbeat straight to [`Store::heartbeat`], which revives it
//!   and tells the scheduler; the batch update skips nodes that are not healthy.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;
use switchyard_core::{NodeId, Timestamp};

use crate::app::App;
use crate::store::{HeartbeatWrite, Store, StoreResult};

/// How often buffered heartbeats are written.
pub const FLUSH_EVERY: Duration = Duration::from_millis(500);

/// Heartbeats heard and not yet written, the newest per node.
#[derive(Default)]
pub struct HeartbeatBuffer {
    pending: Mutex<HashMap<NodeId, (String, Timestamp)>>,
}

impl HeartbeatBuffer {
    /// Keeps a heartbeat to write with the next flush (replacing an older one of the node).
    pub fn record(&self, node: &NodeId, inventory_json: String, at: Timestamp) {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        match pending.get_mut(node) {
            Some(old) if old.1 > at => {}
            Some(old) => *old = (inventory_json, at),
            None => {
                pending.insert(node.clone(), (inventory_json, at));
            }
        }
    }

    /// Heartbeats waiting to be written.
    pub fn len(&self) -> usize {
        self.pending.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Writes every buffered heartbeat in one transaction. On failure they go back into the
    /// buffer (where a newer heartbeat heard meanwhile wins) for the next flush.
    pub async fn flush(&self, store: &dyn Store) -> StoreResult<u64> {
        let taken: Vec<HeartbeatWrite> = {
            let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            pending
                .drain()
                .map(|(node, (inventory_json, at))| HeartbeatWrite {
                    node,
                    inventory_json,
                    at,
                })
                .collect()
        };
        if taken.is_empty() {
            return Ok(0);
        }
        match store.record_heartbeats(&taken).await {
            Ok(n) => Ok(n),
            Err(e) => {
                for b in taken {
                    self.record(&b.node, b.inventory_json, b.at);
                }
                Err(e)
            }
        }
    }
}

/// Flushes the buffer every [`FLUSH_EVERY`] until the broker stops (which flushes once more).
pub async fn run(app: App) {
    let mut interval = tokio::time::interval(FLUSH_EVERY);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        if let Err(e) = app.heartbeats.flush(app.store.as_ref()).await {
            tracing::warn!(error = %e, pending = app.heartbeats.len(),
                "writing heartbeats failed; kept for the next flush");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_heartbeat_of_a_node_is_kept() {
        let buffer = HeartbeatBuffer::default();
        let node = NodeId("n1".into());
        buffer.record(&node, "new".into(), Timestamp::from_millis(2_000));
        buffer.record(&node, "old".into(), Timestamp::from_millis(1_000));
        buffer.record(
            &NodeId("n2".into()),
            "x".into(),
            Timestamp::from_millis(1_500),
        );
        assert_eq!(buffer.len(), 2);
        let pending = buffer.pending.lock().unwrap_or_else(|e| e.into_inner());
        assert_eq!(
            pending.get(&node),
            Some(&("new".to_string(), Timestamp::from_millis(2_000)))
        );
    }
}

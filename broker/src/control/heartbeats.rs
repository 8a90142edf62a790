//! Heartbeats of healthy nodes are written together ([`Store::record_heartbeats`]: one
//! statement per 500 nodes) instead of one write transaction each, and a heartbeat is answered
//! only once the batch that holds it has committed. With 10,000 agents heartbeating every 10 s
//! that is at most 1 / [`GATHER`] write transactions a second instead of 1,000.
//!
//! Why it is safe:
//! - Nothing is acknowledged before it is durable. The agent counts its lease from the
//!   heartbeats the broker answered (its self-fencing, `edge-agent/src/fence.rs`), so an answered
//!   heartbeat must be in the database that lease expiry reads. A heartbeat whose batch is not
//!   written within [`WRITE_WAIT`] (the write failed, or the broker is stopping) is answered
//!   503, and the agent's lease is not renewed by it. A write cut short loses nothing
//!   acknowledged either: its heartbeats were not answered.
//! - One writer: only [`run`] (and [`crate::app::Running::stop`], after it is stopped) writes,
//!   so batches commit in order and a generation number tells a waiting heartbeat when its batch
//!   (or a later one holding the same node's newer heartbeat) is in.
//! - A node that is not healthy (lost) is never brought back by a batched write: the heartbeat
//!   handler sends such a node's heartbeat straight to [`Store::heartbeat`], which revives it
//!   and tells the scheduler; the batch update skips nodes that are not healthy, and the
//!   handler's answer then lists the node's requeued attempts to stop.
//!
//! GPU health (issue 28) stays off this path while nothing changes: the handler judges each
//! heartbeat's GPUs against the marks on the node row it already read
//! (`rules::health::changes`, no allocation, no write); only a change (a GPU falls sick or an
//! overheat clears, rare) is written, at once and outside the batch
//! (`Store::apply_gpu_health`), before the heartbeat is answered.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;
use switchyard_core::{NodeId, Timestamp};
use switchyard_protocol::agent::Inventory;
use switchyard_protocol::api::{GpuSample, NodeSample};
use tokio::sync::{Notify, watch};

use crate::state::App;
use crate::store::{HeartbeatWrite, Store, StoreResult};

/// How long the writer gathers heartbeats after the first one arrives: the most a heartbeat
/// waits for its batch to start, and the least time between two writes.
pub const GATHER: Duration = Duration::from_millis(50);

/// How long a heartbeat waits for its batch to commit before it is answered 503.
pub const WRITE_WAIT: Duration = Duration::from_secs(2);

#[derive(Default)]
struct Pending {
    /// The newest heartbeat per node.
    beats: HashMap<NodeId, (String, Timestamp)>,
    /// The generation the heartbeats now gathered will be written under.
    generation: u64,
}

/// Samples a node's GPU telemetry is kept for: the last hour, one per [`SAMPLE_EVERY_MS`].
const HISTORY_MS: i64 = 3_600_000;
const SAMPLE_EVERY_MS: i64 = 10_000;

/// The GPU telemetry the heartbeats carried recently, per node, in memory (`GET /nodes/{id}`
/// charts it): lost on restart and local to the replica that heard the heartbeats; the durable
/// record of GPUs is the node's inventory in the store and the `/metrics` series scraped from
/// it.
#[derive(Default)]
pub struct TelemetryHistory {
    nodes: Mutex<HashMap<NodeId, std::collections::VecDeque<NodeSample>>>,
}

impl TelemetryHistory {
    /// Keeps `inventory`'s GPU readings at `at`, at most one sample per 10 s per node and the
    /// last hour of them. An inventory with no reading at all (GPUs that report nothing) adds
    /// nothing.
    pub fn record(&self, node: &NodeId, inventory: &Inventory, at: Timestamp) {
        // Every heartbeat passes here: decide before allocating anything.
        let reported = inventory.gpus.iter().any(|g| {
            g.utilization_pct.is_some()
                || g.memory_used_mb.is_some()
                || g.temperature_c.is_some()
                || g.power_w.is_some()
        });
        if !reported {
            return;
        }
        let mut nodes = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
        let samples = nodes.entry(node.clone()).or_default();
        if samples
            .back()
            .is_some_and(|last| at.millis() - last.at.timestamp_millis() < SAMPLE_EVERY_MS)
        {
            return;
        }
        let gpus = inventory
            .gpus
            .iter()
            .map(|g| GpuSample {
                index: g.index,
                utilization_pct: g.utilization_pct,
                memory_used_mb: g.memory_used_mb,
                temperature_c: g.temperature_c,
                power_w: g.power_w,
            })
            .collect();
        samples.push_back(NodeSample {
            at: crate::clock::to_datetime(at),
            gpus,
        });
        while samples
            .front()
            .is_some_and(|first| at.millis() - first.at.timestamp_millis() > HISTORY_MS)
        {
            samples.pop_front();
        }
    }

    /// The node's samples, oldest first.
    pub fn of(&self, node: &NodeId) -> Vec<NodeSample> {
        let nodes = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
        nodes
            .get(node)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }
}

/// Heartbeats heard and not yet written, and the newest generation written.
pub struct HeartbeatBuffer {
    pending: Mutex<Pending>,
    written: watch::Sender<u64>,
    arrived: Notify,
}

impl Default for HeartbeatBuffer {
    fn default() -> Self {
        HeartbeatBuffer {
            pending: Mutex::new(Pending {
                beats: HashMap::new(),
                generation: 1,
            }),
            written: watch::channel(0).0,
            arrived: Notify::new(),
        }
    }
}

impl HeartbeatBuffer {
    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps a heartbeat for the next write (replacing an older one of the node) and returns
    /// the generation to wait for ([`HeartbeatBuffer::written`]).
    pub fn record(&self, node: &NodeId, inventory_json: String, at: Timestamp) -> u64 {
        let generation = {
            let mut pending = self.lock();
            match pending.beats.get_mut(node) {
                Some(old) if old.1 > at => {}
                Some(old) => *old = (inventory_json, at),
                None => {
                    pending.beats.insert(node.clone(), (inventory_json, at));
                }
            }
            pending.generation
        };
        self.arrived.notify_one();
        generation
    }

    /// Waits until `generation` is written; false when it was not within `wait`.
    pub async fn written(&self, generation: u64, wait: Duration) -> bool {
        let mut rx = self.written.subscribe();
        matches!(
            tokio::time::timeout(wait, rx.wait_for(|w| *w >= generation)).await,
            Ok(Ok(_))
        )
    }

    /// Heartbeats waiting to be written.
    pub fn len(&self) -> usize {
        self.lock().beats.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Writes every buffered heartbeat in one transaction and releases their waiters. On
    /// failure they go back into the buffer (where a newer heartbeat heard meanwhile wins) and
    /// are written, and released, with the next generation. Only one writer may call this.
    pub async fn flush(&self, store: &Store) -> StoreResult<u64> {
        let (generation, mut taken) = {
            let mut pending = self.lock();
            let generation = pending.generation;
            pending.generation += 1;
            let taken: Vec<HeartbeatWrite> = pending
                .beats
                .drain()
                .map(|(node, (inventory_json, at))| HeartbeatWrite {
                    node,
                    inventory_json,
                    at,
                })
                .collect();
            (generation, taken)
        };
        if taken.is_empty() {
            self.written.send_if_modified(|w| bump(w, generation));
            return Ok(0);
        }
        // One order for every writer of node rows (PostgreSQL locks them in it).
        taken.sort_unstable_by(|a, b| a.node.as_str().cmp(b.node.as_str()));
        match store.record_heartbeats(&taken).await {
            Ok(n) => {
                self.written.send_if_modified(|w| bump(w, generation));
                Ok(n)
            }
            Err(e) => {
                for b in taken {
                    self.record(&b.node, b.inventory_json, b.at);
                }
                Err(e)
            }
        }
    }
}

fn bump(written: &mut u64, generation: u64) -> bool {
    let newer = generation > *written;
    if newer {
        *written = generation;
    }
    newer
}

/// Writes buffered heartbeats until the broker stops: [`GATHER`] after the first arrives, all
/// that came meanwhile in one transaction.
pub async fn run(app: App) {
    loop {
        app.heartbeats.arrived.notified().await;
        tokio::time::sleep(GATHER).await;
        if let Err(e) = app.heartbeats.flush(app.store.as_ref()).await {
            tracing::warn!(error = %e, pending = app.heartbeats.len(),
                "writing heartbeats failed; kept for the next write");
            // Try again after a pause, even if no new heartbeat arrives.
            tokio::time::sleep(GATHER).await;
            app.heartbeats.arrived.notify_one();
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
        let g = buffer.record(&node, "new".into(), Timestamp::from_millis(2_000));
        buffer.record(&node, "old".into(), Timestamp::from_millis(1_000));
        let g2 = buffer.record(
            &NodeId("n2".into()),
            "x".into(),
            Timestamp::from_millis(1_500),
        );
        assert_eq!((g, g2), (1, 1));
        assert_eq!(buffer.len(), 2);
        let pending = buffer.lock();
        assert_eq!(
            pending.beats.get(&node),
            Some(&("new".to_string(), Timestamp::from_millis(2_000)))
        );
    }

    #[tokio::test]
    async fn a_waiter_is_released_only_when_its_generation_is_written() {
        let buffer = HeartbeatBuffer::default();
        let g = buffer.record(&NodeId("n1".into()), "x".into(), Timestamp::from_millis(1));
        assert!(!buffer.written(g, Duration::from_millis(20)).await);
        // What a successful write of generation `g` publishes.
        {
            let mut pending = buffer.lock();
            pending.generation += 1;
            pending.beats.clear();
        }
        buffer.written.send_if_modified(|w| bump(w, g));
        assert!(buffer.written(g, Duration::from_millis(20)).await);
        // The next heartbeat waits for the next generation.
        let g3 = buffer.record(&NodeId("n1".into()), "y".into(), Timestamp::from_millis(2));
        assert_eq!(g3, g + 1);
        assert!(!buffer.written(g3, Duration::from_millis(20)).await);
    }
}

//! Delivery of attempt events to the broker, in order, at least once. One task owns the queue:
//! it posts what is queued as one `EventBatch`, retries network errors and 5xx with backoff
//! (never dropping or reordering), treats `Duplicate` as delivered, and on `Rejected` stops the
//! attempt locally (its lease is lost) and drops that attempt's later events. The queue is a
//! bounded channel: when the broker is slow, runners wait to enqueue and jobs' pipes fill, so
//! output is held back rather than lost.

use crate::attempts::{AttemptTable, StopReason};
use crate::backoff::{Backoff, Streak};
use crate::client::{BrokerClient, CallError};
use crate::error::AgentError;
use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use switchyard_protocol::agent::{AgentEvent, AttemptRef, EventBatch, EventStatus};
use tokio::sync::mpsc;
use uuid::Uuid;

/// Events queued between the runners and the sender.
pub const QUEUE_EVENTS: usize = 256;
/// Most events in one batch.
const BATCH_EVENTS: usize = 256;
/// Most log bytes in one batch (at least one event always goes).
const BATCH_LOG_BYTES: usize = 1024 * 1024;

/// The sending half, handed to runners: an ordered queue into the outbox that counts what it
/// holds until the broker acknowledges it.
#[derive(Clone, Debug)]
pub struct EventSink {
    sender: mpsc::Sender<AgentEvent>,
    pending: Arc<AtomicUsize>,
}

impl EventSink {
    /// A sink and the receiving end of its queue (the outbox's, or a test's).
    pub fn channel(capacity: usize) -> (EventSink, mpsc::Receiver<AgentEvent>) {
        let (sender, receiver) = mpsc::channel(capacity);
        (
            EventSink {
                sender,
                pending: Arc::new(AtomicUsize::new(0)),
            },
            receiver,
        )
    }

    /// Queues an event, waiting while the queue is full. False when the outbox is gone.
    pub async fn send(&self, event: AgentEvent) -> bool {
        self.pending.fetch_add(1, Ordering::Relaxed);
        if self.sender.send(event).await.is_ok() {
            true
        } else {
            self.pending.fetch_sub(1, Ordering::Relaxed);
            false
        }
    }

    /// Events queued or in flight that the broker has not acknowledged.
    pub fn pending(&self) -> usize {
        self.pending.load(Ordering::Relaxed)
    }

    /// The shared counter, which outlives the sink (for a report after the senders are gone).
    pub fn pending_counter(&self) -> Arc<AtomicUsize> {
        self.pending.clone()
    }
}

pub struct Outbox {
    queue: mpsc::Receiver<AgentEvent>,
    client: BrokerClient,
    attempts: Arc<AttemptTable>,
    pending: Arc<AtomicUsize>,
    lost: HashSet<Uuid>,
    backoff: Backoff,
}

impl Outbox {
    pub fn new(client: BrokerClient, attempts: Arc<AttemptTable>) -> (Outbox, EventSink) {
        let (sink, queue) = EventSink::channel(QUEUE_EVENTS);
        let outbox = Outbox {
            queue,
            client,
            attempts,
            pending: sink.pending_counter(),
            lost: HashSet::new(),
            backoff: Backoff::new(Duration::from_millis(200), Duration::from_secs(5)),
        };
        (outbox, sink)
    }

    /// Sends until every sender is dropped and the queue is empty. Fails only when the broker
    /// refuses the agent's token.
    pub async fn run(mut self) -> Result<(), AgentError> {
        let mut batch: Vec<AgentEvent> = Vec::new();
        let mut streak = Streak::new("events");
        loop {
            if batch.is_empty() {
                match self.queue.recv().await {
                    Some(event) => batch.push(event),
                    None => return Ok(()),
                }
            }
            let mut log_bytes: usize = batch.iter().map(log_len).sum();
            while batch.len() < BATCH_EVENTS && log_bytes < BATCH_LOG_BYTES {
                let Ok(event) = self.queue.try_recv() else {
                    break;
                };
                log_bytes += log_len(&event);
                batch.push(event);
            }
            let before = batch.len();
            batch.retain(|e| !self.lost.contains(&attempt_of(e).attempt_id));
            self.pending
                .fetch_sub(before - batch.len(), Ordering::Relaxed);
            if batch.is_empty() {
                continue;
            }

            let request = EventBatch {
                events: batch.clone(),
            };
            match self.client.events(&request).await {
                Ok(response) => {
                    streak.succeeded();
                    self.backoff.reset();
                    if response.results.len() != batch.len() {
                        tracing::error!(
                            sent = batch.len(),
                            results = response.results.len(),
                            "the broker answered a different number of event results; resending the rest"
                        );
                    }
                    let answered = response.results.len().min(batch.len());
                    for (event, result) in batch.iter().zip(&response.results) {
                        if result.status == EventStatus::Rejected {
                            self.lose(attempt_of(event), result.reason.as_deref());
                        }
                    }
                    batch.drain(..answered);
                    self.pending.fetch_sub(answered, Ordering::Relaxed);
                }
                Err(e) if e.is_unauthorized() => {
                    return Err(AgentError::TokenRevoked { endpoint: "events" });
                }
                Err(e) => {
                    if !e.is_retryable() {
                        // A 4xx other than 401 is a bug on one side; retrying (slowly) keeps the
                        // events for when it is fixed, rather than losing job output.
                        tracing::error!(error = %e, events = batch.len(), "the broker refused an event batch; retrying");
                    }
                    streak.failed(&e);
                    let delay = self.retry_delay(&e);
                    if streak.failures() == 10 {
                        tracing::warn!(
                            queued = self.pending.load(Ordering::Relaxed),
                            "events are backing up; jobs' output is held until the broker takes it"
                        );
                    }
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }

    fn retry_delay(&mut self, e: &CallError) -> Duration {
        let delay = self.backoff.next_delay();
        if e.is_retryable() {
            delay
        } else {
            delay.max(Duration::from_secs(5))
        }
    }

    fn lose(&mut self, attempt: &AttemptRef, reason: Option<&str>) {
        if self.lost.insert(attempt.attempt_id) {
            tracing::warn!(job.id = %attempt.job_id, attempt.id = %attempt.attempt_id, epoch = attempt.epoch,
                reason = reason.unwrap_or("none given"), "the broker rejected this attempt's events; stopping it");
            self.attempts
                .stop(attempt.attempt_id, StopReason::LeaseLost);
        }
    }
}

fn attempt_of(event: &AgentEvent) -> &AttemptRef {
    match event {
        AgentEvent::Started { attempt, .. }
        | AgentEvent::Log { attempt, .. }
        | AgentEvent::Finished { attempt, .. } => attempt,
    }
}

fn log_len(event: &AgentEvent) -> usize {
    match event {
        AgentEvent::Log { data, .. } => data.len(),
        _ => 0,
    }
}

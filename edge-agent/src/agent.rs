//! The enrolled agent's life: the heartbeat (inventory, running attempts → stops, drain), the
//! work long-poll (leases to start, attempts to stop), a runner task per attempt, the outbox,
//! and the orderly shutdown that drains: no new lease, every job gets SIGTERM (its checkpoint
//! signal) and its grace and is reported `drained`, so that the broker requeues it; then the
//! outbox flushes what they said. It decides what to run and when to stop; running a process
//! is [`crate::runner`]'s, talking HTTP the client's.
//!
//! A spot interruption notice (from [`crate::interruption`]) drains the agent at once — no new
//! leases — and is reported on an immediate heartbeat, then on every later one; the broker
//! answers with the attempts to stop, which get SIGTERM (their checkpoint signal) and grace.
//!
//! Service replicas ([`crate::serving`]) are reported in every heartbeat's `serving`; when that
//! report changes (a replica appears, becomes ready or not ready, is stopped, or ends), a
//! heartbeat goes at once rather than at the next tick, so that the gateway learns of it.
//!
//! Self-fencing ([`crate::fence`]): every answered heartbeat renews the lease from when it was
//! sent; a fence task stops every job before the broker may requeue it, and no lease is taken
//! while the lease is not renewed.
//!
//! XID errors are delivered without loss ([`XidLedger`]): the probe reports each once; the
//! heartbeat keeps it in `health.xid_events` of every beat until one that carries it is
//! answered 2xx, and only then forgets it.

use crate::attempts::{AttemptTable, StopReason};
use crate::backoff::{Backoff, Streak};
use crate::client::BrokerClient;
use crate::error::AgentError;
use crate::fence::LeaseClock;
use crate::interruption::Watcher;
use crate::inventory::{self, GpuProbe};
use crate::outbox::{EventSink, Outbox};
use crate::runner::{self, RunOptions};
use crate::serving::Serving;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use switchyard_protocol::agent::{
    GpuHealthReport, GpuInfo, Heartbeat, InterruptionNotice, Inventory, Lease,
};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

/// The shortest time between two long-polls that came back empty, so that a broker answering
/// at once cannot make the agent spin.
const MIN_EMPTY_POLL: Duration = Duration::from_millis(500);
/// Beyond the longest grace period: time for jobs' last output and `Finished` to be queued.
const STOP_MARGIN: Duration = Duration::from_secs(10);
/// How long the outbox may take to deliver what is left when the agent exits.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// Everything the enrolled agent needs.
pub struct Enrolled {
    /// Authenticated as this agent.
    pub client: BrokerClient,
    pub probe: Arc<dyn GpuProbe>,
    /// The inventory sent at enrolment, reused when a later probe fails.
    pub inventory: Inventory,
    pub heartbeat: Duration,
    pub poll_wait_s: u64,
    pub run: RunOptions,
    /// Watches the cloud's spot interruption notice, when configured.
    pub interruption: Option<Watcher>,
    /// The lease and its fence; `None` when the broker gave no lease TTL (no self-fencing).
    pub lease: Option<Arc<LeaseClock>>,
}

/// Serves until `shutdown` resolves or a fatal error; then stops the jobs and flushes events.
pub async fn serve(
    mut enrolled: Enrolled,
    shutdown: impl Future<Output = ()>,
) -> Result<(), AgentError> {
    let attempts = Arc::new(AttemptTable::new());
    let (outbox, sink) = Outbox::new(enrolled.client.clone(), attempts.clone());
    let pending = sink.pending_counter();
    let (fatal_tx, mut fatal_rx) = mpsc::channel::<AgentError>(2);

    let outbox_fatal = fatal_tx.clone();
    let outbox_task = tokio::spawn(async move {
        if let Err(e) = outbox.run().await {
            let _ = outbox_fatal.send(e).await;
        }
    });
    let (drain_tx, drain_rx) = watch::channel(false);
    let (notice_tx, notice_rx) = watch::channel(None);
    let watching = enrolled.interruption.is_some();
    let watcher_task = enrolled
        .interruption
        .take()
        .map(|watcher| tokio::spawn(watcher.run(notice_tx)));
    let fence_task = enrolled
        .lease
        .clone()
        .map(|clock| tokio::spawn(clock.run(attempts.clone())));
    let heartbeat_task = tokio::spawn({
        // XIDs the enrolment's probe found are pending like any other.
        let mut xids = XidLedger::default();
        let mut last_inventory = enrolled.inventory.clone();
        xids.absorb(&mut last_inventory.gpus);
        let beat = HeartbeatLoop {
            lease: enrolled.lease.clone(),
            client: enrolled.client.clone(),
            probe: enrolled.probe.clone(),
            last_inventory,
            xids,
            attempts: attempts.clone(),
            drain: drain_tx,
            notice: notice_rx,
            watching,
            serving_changes: enrolled.run.serving.subscribe(),
            serving: enrolled.run.serving.clone(),
        };
        let period = enrolled.heartbeat;
        async move {
            let e = beat.run(period).await;
            let _ = fatal_tx.send(e).await;
        }
    });

    let worker = Worker {
        enrolled,
        attempts: attempts.clone(),
        sink,
        draining: drain_rx,
    };
    let mut runners = JoinSet::new();
    let outcome = tokio::select! {
        () = shutdown => {
            tracing::info!("shutting down");
            Ok(())
        }
        result = worker.poll(&mut runners) => result,
        Some(e) = fatal_rx.recv() => Err(e),
    };
    if let Err(e) = &outcome {
        tracing::error!(error = %e, "stopping the agent");
    }

    // Jobs must not outlive the agent: stop them all and let them report.
    let longest_grace = attempts.stop_all(StopReason::Shutdown);
    if !runners.is_empty() {
        tracing::info!(
            jobs = runners.len(),
            grace_s = longest_grace.as_secs(),
            "stopping running jobs"
        );
    }
    let all_stopped = tokio::time::timeout(longest_grace + STOP_MARGIN, async {
        while runners.join_next().await.is_some() {}
    })
    .await;
    if all_stopped.is_err() {
        tracing::warn!(
            jobs = runners.len(),
            "jobs did not report their end in time"
        );
        runners.shutdown().await;
    }
    heartbeat_task.abort();
    if let Some(task) = fence_task {
        task.abort();
    }
    if let Some(task) = watcher_task {
        task.abort();
    }
    drop(worker); // the last event sender: the outbox ends once it has delivered everything

    if tokio::time::timeout(FLUSH_TIMEOUT, outbox_task)
        .await
        .is_err()
    {
        tracing::warn!(
            events = pending.load(Ordering::Relaxed),
            "exiting with events the broker has not acknowledged"
        );
    }
    outcome
}

/// The work side: long-polls and starts runners.
struct Worker {
    enrolled: Enrolled,
    attempts: Arc<AttemptTable>,
    sink: EventSink,
    draining: watch::Receiver<bool>,
}

impl Worker {
    /// Polls for work until the token is refused; retries everything else forever.
    async fn poll(&self, runners: &mut JoinSet<()>) -> Result<(), AgentError> {
        let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(5));
        let mut streak = Streak::new("work");
        let mut draining = self.draining.clone();
        loop {
            while runners.try_join_next().is_some() {}
            if let Some(lease) = &self.enrolled.lease
                && lease.fenced(Instant::now())
            {
                // No lease may start until a heartbeat renews ours; leases are redelivered.
                lease.unfenced().await;
                continue;
            }
            if *draining.borrow_and_update() {
                // Take nothing new; stops still arrive with heartbeats.
                if draining.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
                continue;
            }
            let asked = Instant::now();
            // A drain (or an interruption notice) ends the long-poll at once: anything it
            // would bring is not taken anyway.
            let answer = tokio::select! {
                answer = self.enrolled.client.work(self.enrolled.poll_wait_s) => answer,
                () = drained(&mut draining) => continue,
            };
            match answer {
                Ok(work) => {
                    streak.succeeded();
                    backoff.reset();
                    let empty = work.leases.is_empty() && work.stop.is_empty();
                    // Leases first: a stop in the same answer may be for one of them.
                    for lease in work.leases {
                        self.start(lease, runners);
                    }
                    for attempt in work.stop {
                        if self.attempts.stop(attempt.attempt_id, StopReason::Broker) {
                            tracing::info!(attempt.id = %attempt.attempt_id, "broker asked to stop");
                        }
                    }
                    if empty {
                        tokio::time::sleep_until(asked + MIN_EMPTY_POLL).await;
                    }
                }
                Err(e) if e.is_unauthorized() => {
                    return Err(AgentError::TokenRevoked { endpoint: "work" });
                }
                Err(e) => {
                    streak.failed(&e);
                    tokio::time::sleep(backoff.next_delay()).await;
                }
            }
        }
    }

    /// Starts a lease unless it runs or ran already (leases are delivered at least once).
    fn start(&self, lease: Lease, runners: &mut JoinSet<()>) {
        let id = lease.attempt.attempt_id;
        if *self.draining.borrow() {
            tracing::info!(attempt.id = %id, "draining: not taking a new lease");
            return;
        }
        if let Some(clock) = &self.enrolled.lease
            && clock.fenced(Instant::now())
        {
            tracing::info!(attempt.id = %id, "lease not renewed: not taking a new lease now");
            return;
        }
        let opts = self.enrolled.run.clone();
        let Some(stop) = self.attempts.admit(&lease, runner::grace_of(&lease, &opts)) else {
            tracing::debug!(attempt.id = %id, "lease delivered again; already taken");
            return;
        };
        let (attempts, sink) = (self.attempts.clone(), self.sink.clone());
        runners.spawn(async move {
            runner::run_attempt(lease, sink, stop, opts).await;
            attempts.finish(id);
        });
    }
}

/// Resolves once `drain` is set; never when its sender is gone (the agent is ending anyway).
async fn drained(drain: &mut watch::Receiver<bool>) {
    if drain.wait_for(|d| *d).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Resolves at the next change; never when the sender is gone (the agent is ending anyway).
async fn changed(rx: &mut watch::Receiver<u64>) {
    if rx.changed().await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// The heartbeat side: reports inventory and running attempts, applies stops and drain.
struct HeartbeatLoop {
    /// Renewed by every answered heartbeat.
    lease: Option<Arc<LeaseClock>>,
    client: BrokerClient,
    probe: Arc<dyn GpuProbe>,
    last_inventory: Inventory,
    /// XIDs not yet in an answered heartbeat.
    xids: XidLedger,
    attempts: Arc<AttemptTable>,
    drain: watch::Sender<bool>,
    /// The spot interruption notice, once the watcher found one.
    notice: watch::Receiver<Option<InterruptionNotice>>,
    /// Whether a watcher may still publish a notice.
    watching: bool,
    /// The service replicas, reported in `serving`.
    serving: Arc<Serving>,
    /// Changes when what `serving` reports does.
    serving_changes: watch::Receiver<u64>,
}

impl HeartbeatLoop {
    /// Beats every `period` until the token is refused, which it returns.
    async fn run(mut self, period: Duration) -> AgentError {
        let mut ticker = tokio::time::interval(period);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut streak = Streak::new("heartbeat");
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                changed = self.notice.changed(), if self.watching => {
                    if changed.is_err() {
                        self.watching = false; // the watcher is done (a notice, if any, was seen)
                        continue;
                    }
                    // Take nothing new from now on, and tell the broker now, not at the tick.
                    self.set_drain(true);
                    ticker.reset();
                }
                () = changed(&mut self.serving_changes) => {
                    // A replica became ready (or not, or went away): the gateway must know now.
                    ticker.reset();
                }
            }
            if let Some(fatal) = self.beat(&mut streak).await {
                return fatal;
            }
        }
    }

    /// One heartbeat: probe, send, apply the answer. `Some` when the token was refused.
    async fn beat(&mut self, streak: &mut Streak) -> Option<AgentError> {
        self.refresh_inventory().await;
        let interruption = self.notice.borrow().clone();
        // Changes from here on are not in this beat: they bring another.
        self.serving_changes.borrow_and_update();
        let beat = Heartbeat {
            inventory: self.last_inventory.clone(),
            running: self.attempts.running(),
            interruption,
            serving: self.serving.reports(),
        };
        // The broker records the heartbeat when it hears it, after this: counting the
        // lease from here keeps the agent's deadline before the broker's.
        let sent = Instant::now();
        match self.client.heartbeat(&beat).await {
            Ok(response) => {
                streak.succeeded();
                // The broker has this beat's XIDs: they need not go again.
                self.xids.acknowledged(&mut self.last_inventory.gpus);
                if let Some(lease) = &self.lease {
                    lease.renewed(sent);
                }
                for attempt in response.stop {
                    if self.attempts.stop(attempt.attempt_id, StopReason::Broker) {
                        tracing::info!(attempt.id = %attempt.attempt_id, "broker asked to stop");
                    }
                }
                // An interrupted machine stays drained whatever the broker says.
                let interrupted = self.notice.borrow().is_some();
                self.set_drain(response.drain || interrupted);
                None
            }
            Err(e) if e.is_unauthorized() => Some(AgentError::TokenRevoked {
                endpoint: "heartbeat",
            }),
            // The next beat is the retry (its XIDs with it): the period paces it.
            Err(e) => {
                streak.failed(&e);
                None
            }
        }
    }

    fn set_drain(&self, drain: bool) {
        if self
            .drain
            .send_if_modified(|d| std::mem::replace(d, drain) != drain)
        {
            tracing::info!(
                drain,
                running = self.attempts.running_count(),
                "drain changed"
            );
        }
    }

    /// Re-reads GPU metrics; keeps the last good inventory when the probe fails.
    async fn refresh_inventory(&mut self) {
        let probe = self.probe.clone();
        let isolation = self.last_inventory.isolation;
        match tokio::task::spawn_blocking(move || inventory::inventory(probe.as_ref(), isolation))
            .await
        {
            Ok(Ok(mut inventory)) => {
                self.xids.absorb(&mut inventory.gpus);
                self.last_inventory = inventory;
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "probing GPUs failed; reporting the last inventory")
            }
            Err(e) => {
                tracing::warn!(error = %e, "the GPU probe panicked; reporting the last inventory")
            }
        }
    }
}

/// The most XIDs kept per GPU while the broker cannot be reached; later ones are counted and
/// logged, not kept (the first are the diagnostic ones).
const MAX_PENDING_XIDS: usize = 64;

/// XIDs the probe reported that no answered heartbeat has carried yet, by GPU uuid.
#[derive(Debug, Default)]
pub struct XidLedger {
    pending: BTreeMap<String, Vec<u32>>,
}

impl XidLedger {
    /// Takes the XIDs a fresh probe found (each reported once) and puts every pending one in
    /// its GPU's report, so that the heartbeat carries them all.
    pub fn absorb(&mut self, gpus: &mut [GpuInfo]) {
        for gpu in gpus.iter_mut() {
            let new = gpu
                .health
                .as_mut()
                .map(|h| std::mem::take(&mut h.xid_events))
                .unwrap_or_default();
            if !new.is_empty() {
                let pending = self.pending.entry(gpu.uuid.clone()).or_default();
                for code in new {
                    if pending.len() < MAX_PENDING_XIDS {
                        pending.push(code);
                    } else {
                        tracing::warn!(gpu = %gpu.uuid, xid = code,
                            "too many XIDs waiting for the broker: this one is not kept");
                    }
                }
            }
            if let Some(pending) = self.pending.get(&gpu.uuid).filter(|p| !p.is_empty()) {
                gpu.health
                    .get_or_insert_with(GpuHealthReport::default)
                    .xid_events = pending.clone();
            }
        }
    }

    /// A heartbeat carrying every pending XID was answered 2xx: forget them, and take them out
    /// of the inventory reused when the next probe fails.
    pub fn acknowledged(&mut self, gpus: &mut [GpuInfo]) {
        self.pending.clear();
        for gpu in gpus.iter_mut() {
            if let Some(h) = gpu.health.as_mut() {
                h.xid_events.clear();
            }
        }
    }

    /// How many XIDs wait for the broker.
    pub fn pending(&self) -> usize {
        self.pending.values().map(Vec::len).sum()
    }
}

#[cfg(test)]
mod tests;

//! The scheduler loop: owns the in-memory mirror of what is waiting, what runs where and which
//! GPUs are busy; on each event or tick it builds a [`Snapshot`], calls the pure
//! [`switchyard_core::plan`], commits the plan's assignments in one transaction and wakes the
//! agents concerned.
//!
//! The mirror is rebuilt from the database at start and whenever a commit finds it stale (a
//! compare-and-swap on job versions failed), so a stale plan is re-planned, never half-applied.
//! Handlers never place anything: they store, then send an event here.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use switchyard_core::{
    AttemptId, Explanation, JobId, Node, NodeId, Pool, QueuedJob, Region, RunningAttempt, Snapshot,
    Timestamp, plan,
};
use tokio::sync::mpsc;
use uuid::Uuid;

use crate::app::App;
use crate::app::ProviderSet;
use crate::clock;
use crate::store::{
    AttemptRecord, EndedAttempt, InstanceState, JobRecord, NewAttempt, NewInstance, Store,
    StoreError,
};

#[derive(Debug)]
pub enum SchedulerEvent {
    JobSubmitted(Box<JobRecord>),
    /// A waiting job was cancelled (or otherwise left the queue).
    JobRemoved(JobId),
    /// Nodes registered, came back or changed: reload them.
    NodesChanged,
    AttemptsEnded(Vec<EndedAttempt>),
    /// Burst instances were launched, became ready, or ended: reload everything.
    InstancesChanged,
}

/// Handlers' side of the scheduler: send events, read the latest explanations.
#[derive(Clone)]
pub struct SchedulerHandle {
    tx: mpsc::UnboundedSender<SchedulerEvent>,
    explanations: Arc<RwLock<HashMap<JobId, Explanation>>>,
}

impl SchedulerHandle {
    pub fn send(&self, event: SchedulerEvent) {
        // The loop lives as long as the process; a send after shutdown has nobody to tell.
        let _ = self.tx.send(event);
    }

    /// The latest explanation of a job still waiting for placement.
    pub fn explanation(&self, job: JobId) -> Option<Explanation> {
        self.explanations
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&job)
            .cloned()
    }
}

pub struct Worker {
    rx: mpsc::UnboundedReceiver<SchedulerEvent>,
    explanations: Arc<RwLock<HashMap<JobId, Explanation>>>,
}

pub fn channel() -> (SchedulerHandle, Worker) {
    let (tx, rx) = mpsc::unbounded_channel();
    let explanations = Arc::new(RwLock::new(HashMap::new()));
    (
        SchedulerHandle {
            tx,
            explanations: explanations.clone(),
        },
        Worker { rx, explanations },
    )
}

/// A job waiting for placement, with the version the plan is made from.
#[derive(Clone, Debug)]
struct Pending {
    job: QueuedJob,
    version: i64,
}

#[derive(Clone, Debug)]
struct NodeState {
    pool: switchyard_core::PoolId,
    gpus_total: u32,
    busy: BTreeSet<u32>,
    healthy: bool,
    draining: bool,
    last_heartbeat: Timestamp,
}

/// The scheduler's mirror of the world.
#[derive(Default)]
struct State {
    regions: Vec<Region>,
    pools: Vec<Pool>,
    nodes: BTreeMap<NodeId, NodeState>,
    pending: BTreeMap<JobId, Pending>,
    live: BTreeMap<AttemptId, AttemptRecord>,
    /// Jobs waiting for an instance that is still being launched or booting: not re-planned
    /// until it is ready or gone.
    waiting_for_instance: HashMap<JobId, String>,
    /// Pools that may not launch now (capacity or quota errors lately).
    backed_off: HashMap<switchyard_core::PoolId, Timestamp>,
}

impl State {
    async fn load(store: &dyn Store) -> Result<State, StoreError> {
        let mut state = State {
            regions: store.regions().await?,
            pools: store.pools().await?,
            ..State::default()
        };
        state.reload_nodes(store).await?;
        for attempt in store.live_attempts().await? {
            if let Some(node) = state.nodes.get_mut(&attempt.node) {
                node.busy.extend(attempt.gpus.iter().copied());
            }
            state.live.insert(attempt.id, attempt);
        }
        for job in store.pending_jobs().await? {
            state.add_pending(&job);
        }
        for inst in store.instances(false).await? {
            if let (InstanceState::Requested | InstanceState::Booting, Some(job)) =
                (inst.state, inst.for_job)
            {
                state.waiting_for_instance.insert(job, inst.id);
            }
        }
        state.backed_off = store
            .pool_backoffs(clock::now())
            .await?
            .into_iter()
            .collect();
        Ok(state)
    }

    async fn reload_nodes(&mut self, store: &dyn Store) -> Result<(), StoreError> {
        let mut nodes = BTreeMap::new();
        for n in store.nodes().await? {
            let busy = self
                .live
                .values()
                .filter(|a| a.node == n.id)
                .flat_map(|a| a.gpus.iter().copied())
                .collect();
            nodes.insert(
                n.id.clone(),
                NodeState {
                    pool: n.pool,
                    gpus_total: n.gpus_total,
                    busy,
                    healthy: n.healthy && !n.revoked,
                    draining: n.draining,
                    last_heartbeat: n.last_heartbeat,
                },
            );
        }
        self.nodes = nodes;
        Ok(())
    }

    fn add_pending(&mut self, job: &JobRecord) {
        if job.state.is_pending() {
            self.pending.insert(
                job.id,
                Pending {
                    job: QueuedJob {
                        id: job.id,
                        spec: job.spec.clone(),
                        submitted_at: job.submitted_at,
                    },
                    version: job.version,
                },
            );
        }
    }

    fn end_attempt(&mut self, attempt: AttemptId) {
        if let Some(a) = self.live.remove(&attempt)
            && let Some(node) = self.nodes.get_mut(&a.node)
        {
            for g in &a.gpus {
                node.busy.remove(g);
            }
        }
    }

    fn snapshot(&self, burst_enabled: bool, providers: &ProviderSet, now: Timestamp) -> Snapshot {
        let pools = self
            .pools
            .iter()
            .map(|p| {
                let mut p = p.clone();
                let backed_off = self.backed_off.get(&p.id).is_some_and(|until| *until > now);
                p.launchable = p.launchable && !backed_off && providers.for_pool(&p.id).is_some();
                p
            })
            .collect();
        Snapshot {
            regions: self.regions.clone(),
            pools,
            nodes: self
                .nodes
                .iter()
                .map(|(id, n)| Node {
                    id: id.clone(),
                    pool: n.pool.clone(),
                    gpus_total: n.gpus_total,
                    gpus_free: n.gpus_total.saturating_sub(n.busy.len() as u32),
                    healthy: n.healthy,
                    draining: n.draining,
                    last_heartbeat: n.last_heartbeat,
                })
                .collect(),
            queued: self
                .pending
                .values()
                .filter(|p| !self.waiting_for_instance.contains_key(&p.job.id))
                .map(|p| p.job.clone())
                .collect(),
            running: self
                .live
                .values()
                .map(|a| RunningAttempt {
                    job: a.job,
                    attempt: a.id,
                    node: a.node.clone(),
                    gpus: a.gpus.len() as u32,
                    priority: a.priority,
                    started_at: a.created_at,
                    expected_end: a.expected_end,
                })
                .collect(),
            burst_enabled,
            ..Snapshot::default()
        }
    }
}

impl Worker {
    pub async fn run(mut self, app: App) {
        let store = app.store.clone();
        let mut state = loop {
            match State::load(store.as_ref()).await {
                Ok(s) => break s,
                Err(e) => {
                    tracing::error!(error = %e, "scheduler could not load state; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        };
        tracing::info!(
            jobs.pending = state.pending.len(),
            attempts.live = state.live.len(),
            nodes = state.nodes.len(),
            "scheduler started"
        );
        let tick = Duration::from_millis(app.config.scheduler_tick_ms.max(10));
        let mut interval = tokio::time::interval(tick);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let mut resync = false;
            tokio::select! {
                event = self.rx.recv() => {
                    let Some(event) = event else { return };
                    resync |= self.apply(&mut state, store.as_ref(), event).await;
                    // Take everything else that is already queued before planning once.
                    while let Ok(event) = self.rx.try_recv() {
                        resync |= self.apply(&mut state, store.as_ref(), event).await;
                    }
                }
                _ = interval.tick() => {
                    resync |= self.expire_leases(&app).await;
                }
            }
            if resync {
                match State::load(store.as_ref()).await {
                    Ok(s) => state = s,
                    Err(e) => {
                        tracing::error!(error = %e, "scheduler resync failed");
                        continue;
                    }
                }
            }
            if let Err(e) = self.plan_and_commit(&app, &mut state).await {
                match e {
                    StoreError::Stale(why) => {
                        tracing::info!(reason = %why, "plan was stale; re-planning from the database");
                        if let Ok(s) = State::load(store.as_ref()).await {
                            state = s;
                        }
                    }
                    other => tracing::error!(error = %other, "committing a plan failed"),
                }
            }
        }
    }

    /// Applies one event to the mirror; returns whether a full reload is needed.
    async fn apply(&self, state: &mut State, store: &dyn Store, event: SchedulerEvent) -> bool {
        match event {
            SchedulerEvent::JobSubmitted(job) => state.add_pending(&job),
            SchedulerEvent::JobRemoved(id) => {
                state.pending.remove(&id);
                self.forget_explanation(id);
            }
            SchedulerEvent::NodesChanged => {
                if let Err(e) = state.reload_nodes(store).await {
                    tracing::error!(error = %e, "reloading nodes failed");
                    return true;
                }
            }
            SchedulerEvent::AttemptsEnded(ended) => {
                for e in ended {
                    state.end_attempt(e.attempt);
                }
            }
            SchedulerEvent::InstancesChanged => return true,
        }
        false
    }

    fn forget_explanation(&self, id: JobId) {
        self.explanations
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
    }

    /// Marks nodes that stopped heartbeating as lost and requeues their work.
    async fn expire_leases(&self, app: &App) -> bool {
        let now = clock::now();
        let before = now.plus_secs(-(app.config.lease_ttl_s as i64));
        match app.store.expire_leases(before, now).await {
            Ok(expired) if !expired.nodes.is_empty() => {
                for node in &expired.nodes {
                    tracing::warn!(node.id = %node, jobs.requeued = expired.requeued.len(), "node lost: lease expired");
                }
                true
            }
            Ok(_) => false,
            Err(e) => {
                tracing::error!(error = %e, "lease expiry failed");
                false
            }
        }
    }

    async fn plan_and_commit(&self, app: &App, state: &mut State) -> Result<(), StoreError> {
        if state.pending.is_empty() {
            return Ok(());
        }
        let now = clock::now();
        let snapshot = state.snapshot(app.config.burst_enabled, &app.providers, now);
        let started = std::time::Instant::now();
        let plan = plan(&snapshot, now);
        let plan_us = started.elapsed().as_micros() as u64;

        let mut commits = Vec::with_capacity(plan.assignments.len());
        let mut taken: HashMap<NodeId, BTreeSet<u32>> = HashMap::new();
        // Preemption is decided by the planner but not yet carried out here: a job whose
        // assignment depends on victims stopping stays queued (and is re-planned each round).
        let waits_for_victims: std::collections::HashSet<JobId> =
            plan.preemptions.iter().map(|p| p.for_job).collect();
        for a in &plan.assignments {
            if waits_for_victims.contains(&a.job) {
                continue;
            }
            let Some(pending) = state.pending.get(&a.job) else {
                continue;
            };
            // GPU indexes: the node's lowest free ones not already given this round.
            let node = match state.nodes.get(&a.node) {
                Some(n) => n,
                None => continue,
            };
            let round = taken.entry(a.node.clone()).or_default();
            let gpus: Vec<u32> = (0..node.gpus_total)
                .filter(|g| !node.busy.contains(g) && !round.contains(g))
                .take(a.gpus as usize)
                .collect();
            if gpus.len() != a.gpus as usize {
                tracing::error!(job.id = %a.job, node.id = %a.node, "plan over capacity; skipping");
                continue;
            }
            round.extend(gpus.iter().copied());
            let explanation_json = plan
                .explanations
                .get(&a.job)
                .and_then(|e| serde_json::to_string(e).ok())
                .unwrap_or_else(|| "null".into());
            let runtime = pending.job.spec.runtime_s();
            let expected_end = match pending.job.spec.kind {
                switchyard_core::JobKind::Service => Timestamp::MAX,
                switchyard_core::JobKind::Batch => now.plus_secs(runtime),
            };
            commits.push(NewAttempt {
                id: AttemptId(Uuid::now_v7()),
                job: a.job,
                job_version: pending.version,
                node: a.node.clone(),
                pool: a.pool.clone(),
                gpus,
                market: a.market,
                estimated_cost: a.estimated_cost,
                expected_end,
                explanation_json,
            });
        }
        let mut launches = Vec::new();
        for l in &plan.launches {
            let (Some(pending), Some(pool)) = (
                state.pending.get(&l.for_job),
                state.pools.iter().find(|p| p.id == l.pool),
            ) else {
                continue;
            };
            let Some(provider) = app.providers.for_pool(&l.pool) else {
                continue;
            };
            let hourly_price = pool.price_per_hour(l.market);
            launches.push(NewInstance {
                id: Uuid::now_v7().to_string(),
                provider: provider.name().to_string(),
                pool: l.pool.clone(),
                region: pool.region.to_string(),
                market: l.market,
                hourly_price,
                for_job: l.for_job,
                job_version: pending.version,
            });
        }
        if !commits.is_empty() || !launches.is_empty() {
            app.store.commit_plan(&commits, &launches, now).await?;
        }
        for l in &launches {
            tracing::info!(job.id = %l.for_job, pool.id = %l.pool, instance.id = %l.id, market = ?l.market, "burst requested");
            if let Some(p) = state.pending.get_mut(&l.for_job) {
                p.version += 1;
            }
            state.waiting_for_instance.insert(l.for_job, l.id.clone());
        }
        if !launches.is_empty() {
            app.burst.notify_one();
        }
        // Committed: bring the mirror up to date and wake the agents.
        {
            let mut explanations = self.explanations.write().unwrap_or_else(|e| e.into_inner());
            for (id, e) in plan.explanations {
                explanations.insert(id, e);
            }
            for c in &commits {
                explanations.remove(&c.job);
            }
        }
        for c in commits {
            let Some(pending) = state.pending.remove(&c.job) else {
                continue;
            };
            if let Some(node) = state.nodes.get_mut(&c.node) {
                node.busy.extend(c.gpus.iter().copied());
            }
            tracing::info!(
                job.id = %c.job,
                node.id = %c.node,
                pool.id = %c.pool,
                gpus = ?c.gpus,
                cost_usd = c.estimated_cost.as_dollars(),
                plan_us,
                "job placed"
            );
            app.agents.wake(&c.node);
            state.live.insert(
                c.id,
                AttemptRecord {
                    id: c.id,
                    job: c.job,
                    node: c.node,
                    gpus: c.gpus,
                    priority: pending.job.spec.priority,
                    created_at: now,
                    expected_end: c.expected_end,
                },
            );
        }
        Ok(())
    }
}

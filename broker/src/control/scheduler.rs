//! The scheduler loop: owns the in-memory mirror of what is waiting, what runs where and which
//! GPUs are busy; on each event or tick it builds a [`Snapshot`], calls the pure
//! [`switchyard_core::plan`], commits the plan's assignments (each with the GPU indexes the
//! planner picked from the snapshot's free ones) in one transaction and wakes the agents
//! concerned.
//!
//! The mirror is rebuilt from the database at start and whenever a commit finds it stale (a
//! compare-and-swap on job versions failed), so a stale plan is re-planned, never half-applied.
//! Handlers never place anything: they store, then send an event here.
//!
//! GPU health is applied here, in the snapshot, not in `core`: a GPU the health rules marked
//! (`rules/health.rs`) is left out of its node's free set and of the GPUs of the attempt that
//! holds it (so that neither its end nor its preemption frees it), and a node with no healthy
//! GPU left is shown to the planner as draining (it takes nothing). The marks come with the nodes
//! (`NodesChanged` reloads them).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use switchyard_core::{
    AttemptId, Explanation, GpuSet, JobId, MAX_GPUS_PER_NODE, Market, Node, NodeId, Plan,
    PlanCache, Pool, Priority, QueuedJob, Region, RunningAttempt, Snapshot, Timestamp,
    plan_shared_cached,
};
use tokio::sync::mpsc;
use uuid::Uuid;

use crate::control::bus::{Bus, Note};
use crate::state::App;
use crate::state::ProviderSet;
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
    /// A pool was edited (price, node limit, launchable): reload everything.
    CatalogueChanged,
}

/// Per waiting job, the latest plan that explains it. A plan keeps its candidate lists compact;
/// a job's explanation is made public only when asked for ([`Plan::explanation`]).
type Explained = Arc<RwLock<HashMap<JobId, Arc<Plan>>>>;

/// Handlers' side of the scheduler: send events, read the latest explanations.
#[derive(Clone)]
pub struct SchedulerHandle {
    tx: mpsc::UnboundedSender<SchedulerEvent>,
    explanations: Explained,
    /// The other replicas: the leader may be one of them.
    bus: Bus,
}

impl SchedulerHandle {
    /// Tells this replica's scheduler and, through the bus, the other replicas' (only the
    /// leader's acts on it).
    pub fn send(&self, event: SchedulerEvent) {
        if self.bus.is_on() {
            self.bus.publish(match &event {
                SchedulerEvent::JobSubmitted(job) => Note::JobSubmitted(job.id),
                SchedulerEvent::JobRemoved(id) => Note::JobRemoved(*id),
                _ => Note::Resync,
            });
        }
        self.send_local(event);
    }

    /// Tells this replica's scheduler only (what another replica published).
    pub fn send_local(&self, event: SchedulerEvent) {
        // The loop lives as long as the process; a send after shutdown has nobody to tell.
        let _ = self.tx.send(event);
    }

    /// The latest explanation of a job still waiting for placement.
    pub fn explanation(&self, job: JobId) -> Option<Explanation> {
        self.explanations
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&job)
            .and_then(|plan| plan.explanation(&job))
    }
}

pub struct Worker {
    rx: mpsc::UnboundedReceiver<SchedulerEvent>,
    explanations: Explained,
    /// One committed plan's explanations worked out at a time (`explain_committed`).
    explaining: Arc<tokio::sync::Semaphore>,
    /// Runtime history, what the planner's runtimes are predicted from (issue 29).
    history: std::sync::Mutex<History>,
}

/// The runtime predictor: loaded from the store's `runtime_history` when this replica starts
/// to plan and refreshed with the rows updated since before each round. Kept across the
/// scheduler's resyncs.
#[derive(Default)]
struct History {
    predictor: switchyard_core::Predictor,
    /// The latest `updated_at` loaded; rows at it are read again (another may share it).
    seen: Option<Timestamp>,
}

impl Worker {
    /// Loads the runtime history updated since the last round. A failure keeps what was
    /// loaded: history is advice, and the round goes on without the latest runs.
    async fn refresh_history(&self, store: &Store) {
        let since = self.history.lock().unwrap_or_else(|e| e.into_inner()).seen;
        match store.runtime_history_since(since).await {
            Ok(rows) => {
                let mut h = self.history.lock().unwrap_or_else(|e| e.into_inner());
                for r in rows {
                    h.seen = Some(h.seen.map_or(r.updated_at, |s| s.max(r.updated_at)));
                    h.predictor.load(r.key, r.sketch);
                }
            }
            Err(e) => tracing::warn!(error = %e, "loading runtime history failed"),
        }
    }

    /// Sets each queued batch job's runtimes to its prediction: the p50 for cost
    /// (`estimated_runtime_s`) and the p90 for its deadline (`deadline_runtime_s`). Without
    /// history a job keeps its own estimate (or the default hour). Returns the p50s.
    fn predict_runtimes(&self, snapshot: &mut Snapshot) -> HashMap<JobId, i64> {
        let h = self.history.lock().unwrap_or_else(|e| e.into_inner());
        let mut p50s = HashMap::with_capacity(snapshot.queued.len());
        for q in &mut snapshot.queued {
            if q.spec.kind != switchyard_core::JobKind::Batch {
                continue;
            }
            let key = crate::store::runtime_key(&q.spec);
            let p = h.predictor.predict(&key, q.spec.estimated_runtime_s);
            q.spec.estimated_runtime_s = Some(p.p50_s);
            q.deadline_runtime_s = Some(p.p90_s);
            p50s.insert(q.id, p.p50_s);
        }
        p50s
    }
}

pub fn channel(bus: Bus) -> (SchedulerHandle, Worker) {
    let (tx, rx) = mpsc::unbounded_channel();
    let explanations = Arc::new(RwLock::new(HashMap::new()));
    (
        SchedulerHandle {
            tx,
            explanations: explanations.clone(),
            bus,
        },
        Worker {
            rx,
            explanations,
            explaining: Arc::new(tokio::sync::Semaphore::new(1)),
            history: std::sync::Mutex::new(History::default()),
        },
    )
}

/// A job waiting for placement, with the version the plan is made from.
#[derive(Clone, Debug)]
struct Pending {
    job: QueuedJob,
    version: i64,
    /// Held by a policy (budget, time window): the reason stored with the job.
    held: Option<String>,
    /// Never placed before: its placement's wait since submission is a queue wait (a requeued
    /// job's submission time would count its earlier runs too).
    first_placement: bool,
}

#[derive(Clone, Debug)]
struct NodeState {
    pool: switchyard_core::PoolId,
    gpus_total: u32,
    busy: BTreeSet<u32>,
    healthy: bool,
    draining: bool,
    last_heartbeat: Timestamp,
    /// The market of the instance the node runs on (on-prem: on demand).
    market: Market,
    /// Its GPUs the health rules marked unhealthy: never free.
    sick: GpuSet,
}

impl NodeState {
    /// Its GPUs no live attempt holds: what the planner picks from. (An agent registers at
    /// most [`MAX_GPUS_PER_NODE`] GPUs: the agent API refuses a larger inventory.)
    fn free_gpus(&self) -> GpuSet {
        let all = GpuSet::first(self.gpus_total.min(MAX_GPUS_PER_NODE)).unwrap_or_default();
        all.difference(gpu_set(&self.busy)).difference(self.sick)
    }

    /// Takes no new work: drained, or none of its GPUs is healthy.
    fn closed(&self) -> bool {
        let all = GpuSet::first(self.gpus_total.min(MAX_GPUS_PER_NODE)).unwrap_or_default();
        self.draining || all.is_subset(self.sick)
    }
}

/// GPU indexes as a set. Attempts hold indexes the planner picked, all below
/// [`MAX_GPUS_PER_NODE`].
fn gpu_set<'a>(indexes: impl IntoIterator<Item = &'a u32>) -> GpuSet {
    let mut set = GpuSet::EMPTY;
    for &g in indexes {
        set.insert(g);
    }
    set
}

/// How long past the grace period a job's claim on its victims' node holds (their agents
/// report the end on their next heartbeat).
const CLAIM_SLACK_S: i64 = 30;

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
    /// Jobs whose preemption's victims are stopping, with the node they stop on and until
    /// when the claim holds: such a job is kept off every other node (not a new one) until it
    /// is placed there, so that work is never stopped for nothing (a job that went elsewhere
    /// would leave the victims' GPUs to be taken back by the work it stopped).
    claims: HashMap<JobId, (NodeId, Timestamp)>,
    /// The planner's index of the catalogue and of the node set, kept between rounds while
    /// they do not change.
    plan_cache: PlanCache,
}

impl State {
    async fn load(store: &Store, now: Timestamp) -> Result<State, StoreError> {
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
        state.backed_off = store.pool_backoffs(now).await?.into_iter().collect();
        Ok(state)
    }

    async fn reload_nodes(&mut self, store: &Store) -> Result<(), StoreError> {
        // A node that enrolled from a launched instance was bought in that instance's market;
        // a spot one takes only jobs that allow spot.
        let markets: HashMap<NodeId, Market> = store
            .instances(false)
            .await?
            .into_iter()
            .filter_map(|i| Some((i.node?, i.market)))
            .collect();
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
                    market: markets.get(&n.id).copied().unwrap_or(Market::OnDemand),
                    sick: crate::rules::health::unhealthy(&n.gpu_marks),
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
                        deadline_runtime_s: None,
                    },
                    version: job.version,
                    held: (job.state == switchyard_core::JobState::Held)
                        .then(|| job.reason.clone().unwrap_or_default()),
                    first_placement: job.attempts == 0,
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

    fn snapshot(
        &self,
        burst_enabled: bool,
        grace_s: u64,
        providers: &ProviderSet,
        now: Timestamp,
    ) -> Snapshot {
        let pools = self
            .pools
            .iter()
            .map(|p| {
                let mut p = p.clone();
                let backed_off = self.backed_off.get(&p.id).is_some_and(|until| *until > now);
                p.launchable = p.launchable && !backed_off && providers.can_launch(&p.id);
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
                    free_gpus: n.free_gpus(),
                    healthy: n.healthy,
                    draining: n.closed(),
                    last_heartbeat: n.last_heartbeat,
                    market: n.market,
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
                .map(|a| {
                    // An attempt being preempted frees its GPUs within the grace period, and
                    // cannot be taken twice: the planner sees it ending soon, not preemptible
                    // (`high` is never a victim; `normal` batch work is, of urgent services).
                    let (priority, expected_end) = if a.stopping {
                        let by = now.plus_secs(grace_s as i64);
                        (a.priority.max(Priority::High), a.expected_end.min(by))
                    } else {
                        (a.priority, a.expected_end)
                    };
                    // A sick GPU it holds never comes back free: not when it ends, and not
                    // to a job that preempts it. Holding only sick GPUs, it is no victim
                    // (stopping it would free nothing).
                    let sick = self.nodes.get(&a.node).map_or(GpuSet::EMPTY, |n| n.sick);
                    let gpus = gpu_set(&a.gpus).difference(sick);
                    let priority = if gpus.is_empty() {
                        priority.max(Priority::High)
                    } else {
                        priority
                    };
                    RunningAttempt {
                        job: a.job,
                        attempt: a.id,
                        node: a.node.clone(),
                        gpus,
                        priority,
                        started_at: a.created_at,
                        expected_end,
                    }
                })
                .collect(),
            burst_enabled,
            ..Snapshot::default()
        }
    }
}

impl Worker {
    /// The loop, for the life of the process: it plans only while this replica leads, and
    /// rebuilds its mirror from the database each time it starts leading.
    pub async fn run(mut self, app: App) {
        loop {
            let epoch = self.until_leader(&app).await;
            self.lead(&app, epoch).await;
        }
    }

    /// Waits for the leadership, dropping events meanwhile (leading starts from the database).
    async fn until_leader(&mut self, app: &App) -> i64 {
        let leadership = app.leadership.clone();
        let became = leadership.until_leader();
        tokio::pin!(became);
        loop {
            tokio::select! {
                epoch = &mut became => return epoch,
                event = self.rx.recv() => {
                    if event.is_none() {
                        // Every handle is gone: nothing will ever be asked of this loop.
                        std::future::pending::<()>().await;
                    }
                }
            }
        }
    }

    /// Plans while this replica leads under `epoch`.
    async fn lead(&mut self, app: &App, epoch: i64) {
        let store = app.store.clone();
        let mut leadership = app.leadership.watch();
        let still_leading =
            |l: &tokio::sync::watch::Receiver<Option<i64>>| *l.borrow() == Some(epoch);
        // What was queued before this replica led is in the database already.
        while self.rx.try_recv().is_ok() {}
        let mut state = loop {
            if !still_leading(&leadership) {
                return;
            }
            match State::load(store.as_ref(), app.clock.now()).await {
                Ok(s) => break s,
                Err(e) => {
                    tracing::error!(error = %e, "scheduler could not load state; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        };
        tracing::info!(
            epoch,
            jobs.pending = state.pending.len(),
            attempts.live = state.live.len(),
            nodes = state.nodes.len(),
            "scheduler started"
        );
        // Leases are counted from now at the earliest: while no replica led (a broker restart,
        // a failover) agents could not renew them, and their next heartbeats re-sync what they
        // run. Without this a broker down for longer than the TTL would requeue, and so run
        // twice, every job that ran through the outage.
        let led_since = app.clock.now();
        let tick = Duration::from_millis(app.config.scheduler_tick_ms.max(10));
        let mut interval = tokio::time::interval(tick);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Other replicas' changes arrive as hints; with the bus on, reload regularly too.
        let mut last_load = tokio::time::Instant::now();
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
                    resync |= self.expire_leases(app, led_since).await;
                    resync |= app.agents.bus().is_on() && last_load.elapsed() >= crate::control::bus::RESYNC_EVERY;
                }
                _ = leadership.changed() => {}
            }
            if !still_leading(&leadership) {
                tracing::info!(epoch, "scheduler stopped: this replica no longer leads");
                return;
            }
            if resync {
                match State::load(store.as_ref(), app.clock.now()).await {
                    Ok(s) => {
                        state = s;
                        last_load = tokio::time::Instant::now();
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "scheduler resync failed");
                        continue;
                    }
                }
            }
            if let Err(e) = self.plan_and_commit(app, &mut state).await {
                match e {
                    StoreError::Stale(why) => {
                        tracing::info!(reason = %why, "plan was stale; re-planning from the database");
                        if let Ok(s) = State::load(store.as_ref(), app.clock.now()).await {
                            state = s;
                            last_load = tokio::time::Instant::now();
                        }
                    }
                    StoreError::Fenced { .. } => {
                        app.leadership.step_down(store.as_ref(), &e.to_string());
                        return;
                    }
                    other => tracing::error!(error = %other, "committing a plan failed"),
                }
            }
        }
    }

    /// Applies one event to the mirror; returns whether a full reload is needed.
    async fn apply(&self, state: &mut State, store: &Store, event: SchedulerEvent) -> bool {
        match event {
            // A reload may have read the job, and a round placed it, before this news
            // arrived: a job that holds a lease is not queued again (its stale version would
            // only fail a commit, and its explanation would say it waits).
            SchedulerEvent::JobSubmitted(job) => {
                if !state.live.values().any(|a| a.job == job.id) {
                    state.add_pending(&job);
                }
            }
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
                let mut requeued = false;
                for e in ended {
                    state.end_attempt(e.attempt);
                    requeued |= e.final_state == switchyard_core::JobState::Queued;
                }
                // A preempted job is back in the queue: reload to pick it up.
                return requeued;
            }
            SchedulerEvent::InstancesChanged | SchedulerEvent::CatalogueChanged => return true,
        }
        false
    }

    fn forget_explanation(&self, id: JobId) {
        self.explanations
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
    }

    /// Marks nodes that stopped heartbeating as lost and requeues their work: silent for the
    /// lease TTL, and for the TTL since this replica began to lead (`led_since`).
    async fn expire_leases(&self, app: &App, led_since: Timestamp) -> bool {
        let now = app.clock.now();
        let before = now.plus_secs(-(app.config.lease_ttl_s as i64));
        if before < led_since {
            return false;
        }
        match app.store.expire_leases(before, now).await {
            Ok(expired) if !expired.nodes.is_empty() => {
                app.metrics.lease_expired(expired.nodes.len());
                for node in &expired.nodes {
                    tracing::warn!(node.id = %node, jobs.requeued = expired.requeued.len(), "node lost: lease expired");
                }
                true
            }
            Ok(_) => false,
            Err(e @ StoreError::Fenced { .. }) => {
                app.leadership.step_down(app.store.as_ref(), &e.to_string());
                false
            }
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
        let now = app.clock.now();
        let mut snapshot = state.snapshot(
            app.config.burst_enabled,
            app.config.grace_s,
            &app.providers,
            now,
        );
        // Policies, hard budgets with what they have left (ledger + reserved estimates), and
        // the on-prem rates new attempts are charged at.
        let round = crate::rules::budget::round_policies(app.store.as_ref(), now).await?;
        snapshot.policies = round.policies;
        snapshot.reserve_free_below_one_in = app.config.reserve_free_below_one_in;
        // Service replicas kept off a node (spreading), and jobs whose victims are stopping
        // kept off every node but theirs, for the jobs of this round.
        {
            let spread = app.spread.lock().unwrap_or_else(|e| e.into_inner());
            state
                .claims
                .retain(|job, (_, until)| *until > now && state.pending.contains_key(job));
            if !spread.is_empty() || !state.claims.is_empty() {
                let mut avoid = BTreeMap::new();
                for j in &snapshot.queued {
                    if let Some((node, _)) = state.claims.get(&j.id) {
                        let others: Vec<NodeId> = snapshot
                            .nodes
                            .iter()
                            .filter(|n| n.id != *node)
                            .map(|n| n.id.clone())
                            .collect();
                        avoid.insert(j.id, others);
                    } else if let Some(nodes) = spread.get(&j.id) {
                        avoid.insert(j.id, nodes.clone());
                    }
                }
                snapshot.avoid = avoid;
            }
        }
        self.refresh_history(app.store.as_ref()).await;
        let predicted = self.predict_runtimes(&mut snapshot);
        let rates = round.rates;
        let queued = snapshot.queued.len();
        let started = std::time::Instant::now();
        // The plan keeps the snapshot to work out its explanations when first asked for:
        // after the commit, off this loop (see `explain_committed`).
        let plan = plan_shared_cached(&mut state.plan_cache, Arc::new(snapshot), now);
        let plan_us = started.elapsed().as_micros() as u64;
        app.metrics
            .observe_plan(started.elapsed().as_secs_f64(), queued);

        let mut commits = Vec::with_capacity(plan.assignments.len());
        // A job whose assignment depends on victims stopping stays queued: the victims are
        // told to stop now and hold their GPUs until their agents report the end; the job is
        // placed in a later round, once the GPUs are free.
        let waits_for_victims: std::collections::HashSet<JobId> =
            plan.preemptions.iter().map(|p| p.for_job).collect();
        let claim_until = now.plus_secs(app.config.grace_s as i64 + CLAIM_SLACK_S);
        for p in &plan.preemptions {
            state
                .claims
                .insert(p.for_job, (p.node.clone(), claim_until));
        }
        self.preempt(app, state, &plan.preemptions, now).await?;
        for a in &plan.assignments {
            if waits_for_victims.contains(&a.job) {
                continue;
            }
            let Some(pending) = state.pending.get(&a.job) else {
                continue;
            };
            // The GPU indexes are the planner's: free in the snapshot and given to no other
            // assignment of the plan.
            let runtime = predicted
                .get(&a.job)
                .copied()
                .unwrap_or_else(|| pending.job.spec.runtime_s());
            let expected_end = match pending.job.spec.kind {
                switchyard_core::JobKind::Service => Timestamp::MAX,
                switchyard_core::JobKind::Batch => now.plus_secs(runtime),
            };
            // What the ledger charges while it runs on a node the broker did not launch.
            let pool = state.pools.iter().find(|p| p.id == a.pool);
            let hourly_rate = pool.map_or(switchyard_core::Money::ZERO, |pool| {
                let onprem = rates.onprem_rate(&pending.job.spec, pool);
                crate::control::ledger::attempt_rate(pool, a.market, a.gpus.len(), onprem)
            });
            let hourly_cash = pool.map_or(switchyard_core::Money::ZERO, |pool| {
                crate::control::ledger::attempt_cash_rate(pool, a.market, a.gpus.len())
            });
            commits.push(NewAttempt {
                id: AttemptId(Uuid::now_v7()),
                job: a.job,
                job_version: pending.version,
                node: a.node.clone(),
                pool: a.pool.clone(),
                gpus: a.gpus.to_vec(),
                market: a.market,
                estimated_cost: a.estimated_cost,
                hourly_rate,
                hourly_cash,
                expected_end,
                rank: a.rank,
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
                estimated_cost: l.estimated_cost,
            });
        }
        if !commits.is_empty() || !launches.is_empty() {
            app.store.commit_plan(&commits, &launches, now).await?;
        }
        for l in &launches {
            let span = tracing::info_span!("job.burst", job.id = %l.for_job, pool.id = %l.pool);
            crate::trace::join_job(app, &span, l.for_job).await;
            span.in_scope(
                || tracing::info!(instance.id = %l.id, market = ?l.market, "burst requested"),
            );
            if let Some(p) = state.pending.get_mut(&l.for_job) {
                p.version += 1;
            }
            state.waiting_for_instance.insert(l.for_job, l.id.clone());
        }
        if !launches.is_empty() {
            app.burst.notify_one();
        }
        // Committed: bring the mirror up to date and wake the agents.
        let plan = Arc::new(plan);
        {
            let mut explanations = self.explanations.write().unwrap_or_else(|e| e.into_inner());
            for id in plan.explanations.keys() {
                explanations.insert(*id, plan.clone());
            }
        }
        if !commits.is_empty() || !launches.is_empty() {
            // A gang is explained once, with its rank 0 (the job's current attempt).
            let placed = commits
                .iter()
                .filter(|c| c.rank == 0)
                .map(|c| (c.job, c.id))
                .collect();
            let launched = launches.iter().map(|l| (l.for_job, l.id.clone())).collect();
            self.explain_committed(app, plan.clone(), placed, launched);
        }
        let mut commits = commits.into_iter().peekable();
        while let Some(c) = commits.next() {
            // A gang's ranks (adjacent) share one pending job: it leaves the queue with its
            // last rank.
            let last_rank = commits.peek().is_none_or(|next| next.job != c.job);
            let Some(pending) = (if last_rank {
                state.pending.remove(&c.job)
            } else {
                state.pending.get(&c.job).cloned()
            }) else {
                continue;
            };
            if let Some(node) = state.nodes.get_mut(&c.node) {
                debug_assert!(
                    c.gpus.iter().all(|g| !node.busy.contains(g)),
                    "the plan gave busy GPUs"
                );
                node.busy.extend(c.gpus.iter().copied());
            }
            if pending.first_placement && last_rank {
                let waited_ms = now
                    .millis()
                    .saturating_sub(pending.job.submitted_at.millis());
                app.metrics.observe_queue_wait(waited_ms as f64 / 1000.0);
            }
            let span = tracing::info_span!("job.place", job.id = %c.job, node.id = %c.node, pool.id = %c.pool);
            crate::trace::join_job(app, &span, c.job).await;
            span.in_scope(|| {
                tracing::info!(
                    gpus = ?c.gpus,
                    cost_usd = c.estimated_cost.as_dollars(),
                    plan_us,
                    "job placed"
                )
            });
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
                    stopping: false,
                },
            );
        }
        self.apply_holds(app, state, &plan.holds).await
    }

    /// Stores the explanations of the jobs a committed plan placed, and of those it launched a
    /// node for (kept with the instance: the decisive round of a job that bursts, shown with
    /// its placement later), worked out in the background (`Plan::explanations_of` plans the
    /// round again recording those jobs' lists, about the cost of the decisions), so the
    /// scheduler loop does not wait for them. One plan at a time, in commit order, so a busy
    /// broker spends at most about a core on them. Until they are stored the plan stays in the
    /// mirror, so `GET /api/v1/jobs/{id}/placement` answers from it either way. Lost in a crash
    /// before they are stored: the job's placement then has no explanation to show.
    fn explain_committed(
        &self,
        app: &App,
        plan: Arc<Plan>,
        placed: Vec<(JobId, AttemptId)>,
        launched: Vec<(JobId, String)>,
    ) {
        let store = app.store.clone();
        let mirror = self.explanations.clone();
        let turn = self.explaining.clone();
        tokio::spawn(async move {
            let Ok(_turn) = turn.acquire_owned().await else {
                return;
            };
            let work = plan.clone();
            let jobs = placed.clone();
            let (rows, launch_rows) = tokio::task::spawn_blocking(move || {
                let mut ids: Vec<JobId> = jobs.iter().map(|(job, _)| *job).collect();
                ids.extend(launched.iter().map(|(job, _)| *job));
                // A gang's launches name its job once each.
                ids.sort_unstable();
                ids.dedup();
                let attempts: HashMap<JobId, AttemptId> = jobs.into_iter().collect();
                let instances: HashMap<JobId, String> = launched.into_iter().collect();
                let (mut rows, mut launch_rows) = (Vec::new(), Vec::new());
                for e in work.explanations_of(&ids) {
                    let Ok(json) = serde_json::to_string(&e) else {
                        continue;
                    };
                    if let Some(attempt) = attempts.get(&e.job) {
                        rows.push((e.job, *attempt, json));
                    } else if let Some(instance) = instances.get(&e.job) {
                        launch_rows.push((instance.clone(), json));
                    }
                }
                (rows, launch_rows)
            })
            .await
            .unwrap_or_default();
            if let Err(e) = store.set_explanations(&rows).await {
                tracing::warn!(error = %e, jobs = rows.len(), "storing placement explanations failed");
            }
            if let Err(e) = store.set_launch_explanations(&launch_rows).await {
                tracing::warn!(error = %e, jobs = launch_rows.len(), "storing launch explanations failed");
            }
            let mut mirror = mirror.write().unwrap_or_else(|e| e.into_inner());
            for (job, _) in placed {
                if mirror.get(&job).is_some_and(|p| Arc::ptr_eq(p, &plan)) {
                    mirror.remove(&job);
                }
            }
        });
    }

    /// Jobs a policy holds (a hard budget their estimate does not fit, a time window) become
    /// `held` with the hold's code as their reason; held jobs the plan no longer holds go back
    /// to `queued` (a budget raised or a new period, a window opened). Either way they stay in
    /// the queue and are planned every round.
    async fn apply_holds(
        &self,
        app: &App,
        state: &mut State,
        holds: &[switchyard_core::Hold],
    ) -> Result<(), StoreError> {
        use switchyard_core::HoldCode;
        let by_policy: HashMap<JobId, &'static str> = holds
            .iter()
            .filter(|h| {
                matches!(
                    h.code,
                    HoldCode::BudgetExhausted | HoldCode::OutsideTimeWindow
                )
            })
            .map(|h| (h.job, h.code.as_str()))
            .collect();
        let mut changes = Vec::new();
        for (id, pending) in state.pending.iter_mut() {
            if state.waiting_for_instance.contains_key(id) {
                continue;
            }
            let want = by_policy.get(id).map(|r| r.to_string());
            if want != pending.held {
                changes.push((*id, want.clone()));
                pending.held = want;
            }
        }
        if !changes.is_empty() {
            for (id, reason) in &changes {
                tracing::info!(job.id = %id, reason = reason.as_deref().unwrap_or("released"), "job hold changed");
            }
            app.store.set_holds(&changes).await?;
        }
        Ok(())
    }

    /// Carries out the plan's preemptions: the victims become `preempting` (their agents get a
    /// stop: checkpoint signal, grace, kill) and their jobs will be requeued with a note of the
    /// progress they made when the agents report the end.
    async fn preempt(
        &self,
        app: &App,
        state: &mut State,
        preemptions: &[switchyard_core::Preemption],
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let victims: Vec<(AttemptId, String)> = preemptions
            .iter()
            .filter_map(|p| {
                let a = state.live.get(&p.attempt)?;
                if a.stopping {
                    return None;
                }
                let ran_s = (now.millis() - a.created_at.millis()).max(0) / 1000;
                let planned = if a.expected_end == Timestamp::MAX {
                    String::new()
                } else {
                    let total = (a.expected_end.millis() - a.created_at.millis()).max(0) / 1000;
                    format!(" of an estimated {total} s")
                };
                Some((
                    p.attempt,
                    format!(
                        "preempted by job {} ({}) after {ran_s} s{planned}",
                        p.for_job, p.reason
                    ),
                ))
            })
            .collect();
        if victims.is_empty() {
            return Ok(());
        }
        for (node, victim) in app.store.preempt_attempts(&victims).await? {
            let id = AttemptId(victim.attempt_id);
            if let Some(a) = state.live.get_mut(&id) {
                a.stopping = true;
            }
            tracing::info!(job.id = %victim.job_id, attempt.id = %id, node.id = %node, "preempting");
            app.agents.wake(&node);
        }
        Ok(())
    }
}

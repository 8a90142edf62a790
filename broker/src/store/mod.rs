//! Persistence. What is stored: regions, pools, tokens (hashed), nodes, jobs, attempts and log
//! chunks — everything acknowledged to a user or an agent. What is rebuilt at start: the
//! scheduler's in-memory mirror (from jobs, attempts and nodes) and the latest placement
//! explanations of waiting jobs.
//!
//! The [`Store`] trait is the only way the rest of the broker reaches the database. SQLite is
//! the embedded default; PostgreSQL (a later issue) is a second implementation with its own
//! migrations folder, not a rewrite. Each method is one transaction.

#[cfg(feature = "postgres")]
mod postgres;
mod records;
mod sqlite;
mod stretches;

#[cfg(feature = "postgres")]
pub use postgres::{PgStore, WRITE_LOCK_KEY};
pub use records::*;
pub use sqlite::{SqliteStore, policy_target, role_name};

use async_trait::async_trait;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use switchyard_core::{
    AttemptId, JobId, JobState, Money, NodeId, Pool, PoolId, Priority, Region, Timestamp,
};
use switchyard_protocol::agent::{AgentEvent, AttemptRef, EventResult, Inventory};
use uuid::Uuid;

// The lease rule the stores carry out (`lease.rs` decides; the stores apply).
use crate::rules::lease::{self, AttemptState, Requeue, Verdict};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("corrupt row: {0}")]
    Corrupt(String),
    /// A compare-and-swap lost: the caller must re-read and retry.
    #[error("stale write: {0}")]
    Stale(String),
    /// A leader's write made under an epoch that is no longer the lease's: this replica was
    /// deposed. Nothing was written; the caller stops acting as the leader.
    #[error("fenced: written under leader epoch {held}, the lease is at epoch {current}")]
    Fenced { held: i64, current: i64 },
}

pub type StoreResult<T> = Result<T, StoreError>;

/// The epoch the leader's writes (scheduler, burst controller, ledger) are made under; each of
/// those writes checks it against `leader_lease.epoch` inside its own transaction, after the
/// global write lock, so a deposed leader's write is rejected ([`StoreError::Fenced`]) even when
/// it has not yet noticed that it lost the lease. Starts off (nothing checked: tools and tests
/// that write without an election); the leader election turns it on.
#[derive(Clone, Debug)]
pub struct Fence(Arc<AtomicI64>);

impl Fence {
    const OFF: i64 = -1;
    /// Epochs start at 1: this one matches none.
    const NONE: i64 = 0;

    pub fn off() -> Fence {
        Fence(Arc::new(AtomicI64::new(Fence::OFF)))
    }

    /// Writes are made under `epoch` from now on.
    pub fn hold(&self, epoch: i64) {
        self.0.store(epoch.max(1), Ordering::SeqCst);
    }

    /// This replica is not the leader: every fenced write is rejected.
    pub fn lose(&self) {
        self.0.store(Fence::NONE, Ordering::SeqCst);
    }

    /// The epoch to check, or `None` when fencing is off.
    pub fn get(&self) -> Option<i64> {
        match self.0.load(Ordering::SeqCst) {
            Fence::OFF => None,
            e => Some(e),
        }
    }

    /// Ok when fencing is off or `current` (the lease's epoch, read in the writing
    /// transaction) is the one held.
    pub(crate) fn check(&self, current: Option<i64>) -> StoreResult<()> {
        match self.get() {
            None => Ok(()),
            Some(held) if current == Some(held) => Ok(()),
            Some(held) => Err(StoreError::Fenced {
                held,
                current: current.unwrap_or(0),
            }),
        }
    }
}

impl Default for Fence {
    fn default() -> Fence {
        Fence::off()
    }
}

/// The leader lease as stored.
#[derive(Clone, Debug, PartialEq)]
pub struct LeaderRecord {
    pub holder: String,
    pub holder_instance: Uuid,
    pub epoch: i64,
    pub acquired_at: Timestamp,
    pub expires_at: Timestamp,
}

/// What a replica asking for the lease does: `None` when another live replica holds it;
/// else the epoch it holds next, and whether that is a renewal of its own lease (same run:
/// same epoch, only the expiry moves) rather than taking it (first lease: epoch 1; expired,
/// or the same replica restarted: the next epoch). The one rule both stores apply.
pub(crate) fn lease_claim(
    row: Option<&LeaderRecord>,
    replica: &str,
    instance: Uuid,
    now: Timestamp,
) -> Option<(i64, bool)> {
    match row {
        None => Some((1, false)),
        Some(r) if r.holder_instance == instance => Some((r.epoch, true)),
        Some(r) if r.expires_at <= now || r.holder == replica => Some((r.epoch + 1, false)),
        Some(_) => None,
    }
}

/// The lease SQL both stores run (the same text; each binds its own column types).
pub(crate) const LEASE_SELECT: &str = "SELECT holder, holder_instance, epoch, acquired_at, \
     expires_at FROM leader_lease WHERE id = 1";
pub(crate) const LEASE_RENEW: &str = "UPDATE leader_lease SET expires_at = $1 WHERE id = 1";
/// Binds: holder, holder run, epoch, acquired at, expires at.
pub(crate) const LEASE_TAKE: &str = "INSERT INTO leader_lease \
     (id, holder, holder_instance, epoch, acquired_at, expires_at) VALUES (1, $1, $2, $3, $4, $5) \
     ON CONFLICT (id) DO UPDATE SET holder = excluded.holder, \
     holder_instance = excluded.holder_instance, epoch = excluded.epoch, \
     acquired_at = excluded.acquired_at, expires_at = excluded.expires_at";
pub(crate) const LEASE_EPOCH: &str = "SELECT epoch FROM leader_lease WHERE id = 1";
/// Settling an attempt that an accrual pass already charged past the end its transaction read
/// (the pass took the write lock first): it ends where it was charged to. Returns the moved end.
pub(crate) const ATTEMPT_END_TO_CHARGED: &str = "UPDATE attempts SET finished_at = accrued_until \
     WHERE id = $1 AND accrued_until > finished_at RETURNING finished_at";
/// The same for an instance being terminated.
pub(crate) const INSTANCE_END_TO_CHARGED: &str = "UPDATE instances SET ended_at = accrued_until \
     WHERE id = $1 AND accrued_until > ended_at";
/// Stores the explanation of a job's placement, only while that attempt is still its current
/// one (a job placed again since keeps its newer explanation); binds json, job, attempt.
pub(crate) const SET_EXPLANATION: &str =
    "UPDATE jobs SET explanation_json = $1 WHERE id = $2 AND current_attempt = $3";
/// A node's attempts a heartbeat answers about (see [`heartbeat_stops`]); binds the node id.
pub(crate) const NODE_LIVE_ATTEMPTS: &str = "SELECT a.id, a.job_id, a.epoch, a.state, \
     j.cancel_requested FROM attempts a JOIN jobs j ON j.id = a.job_id \
     WHERE a.node_id = $1 AND a.state IN ('assigned', 'running', 'preempting')";

/// Each live cloud instance's hourly price and the team it is charged to now: the job running
/// on its node (the earliest started, as the ledger's stretches pick), else the job it was
/// launched for. Live: launched and not terminated, as the ledger accrues them.
pub(crate) const LIVE_INSTANCE_PAYERS: &str = "SELECT i.hourly_price_micros, \
     COALESCE((SELECT oj.team FROM attempts a JOIN jobs oj ON oj.id = a.job_id \
     WHERE a.node_id = i.node_id AND a.started_at IS NOT NULL AND a.finished_at IS NULL \
     ORDER BY a.started_at, a.id LIMIT 1), j.team) AS team \
     FROM instances i LEFT JOIN jobs j ON j.id = i.for_job \
     WHERE i.launched_at IS NOT NULL AND i.state <> 'terminated'";

/// Adds up hourly rates per team (work no team pays for is left out), ordered by team: the
/// one fold both stores' `spend_rates` apply.
pub(crate) fn rates_by_team(
    rates: impl IntoIterator<Item = (Option<String>, Money)>,
) -> Vec<(String, Money)> {
    let mut by_team: std::collections::BTreeMap<String, Money> = Default::default();
    for (team, rate) in rates {
        if let Some(team) = team {
            let sum = by_team.entry(team).or_insert(Money::ZERO);
            *sum = sum.saturating_add(rate);
        }
    }
    by_team.into_iter().collect()
}

/// A heartbeat kept in memory and written with others in one transaction
/// ([`Store::record_heartbeats`]).
#[derive(Clone, Debug, PartialEq)]
pub struct HeartbeatWrite {
    pub node: NodeId,
    pub inventory_json: String,
    pub at: Timestamp,
}

/// Heartbeats written per statement by [`Store::record_heartbeats`] (3 parameters each: well
/// inside SQLite's and PostgreSQL's limits on bound parameters).
pub(crate) const HEARTBEATS_PER_STATEMENT: usize = 500;

/// The answer to a heartbeat.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HeartbeatOutcome {
    /// The node was lost (unhealthy) before this heartbeat.
    pub came_back: bool,
    /// Attempts the agent must stop.
    pub stop: Vec<AttemptRef>,
}

/// Which attempts a heartbeat tells the agent to stop: its live attempts whose job was
/// cancelled while running or that are being preempted, and whatever it says it runs that is
/// not its live lease (same attempt, job and epoch, `assigned` or `running`). `live` is the
/// node's attempts in `assigned`, `running` or `preempting`, with their state and whether
/// their job's cancel was requested. The one rule both stores apply.
pub fn heartbeat_stops(
    live: &[(AttemptRef, String, bool)],
    running: &[AttemptRef],
) -> Vec<AttemptRef> {
    let mut stop: Vec<AttemptRef> = Vec::new();
    for (r, state, cancel) in live {
        let must = state == "preempting" || (state == "running" && *cancel);
        if must && !stop.contains(r) {
            stop.push(r.clone());
        }
    }
    for r in running {
        let leased = live
            .iter()
            .any(|(l, state, _)| l == r && (state == "assigned" || state == "running"));
        if !leased && !stop.contains(r) {
            stop.push(r.clone());
        }
    }
    stop
}

/// What [`Store::interrupt_node`] did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeInterruption {
    /// The node was not draining before this notice.
    pub newly_draining: bool,
    /// Attempts taken from the node (now `preempted`): the agent must stop them.
    pub stopped: Vec<AttemptRef>,
    /// Their jobs, back in the queue (or `cancelled` when a cancel was pending).
    pub requeued: Vec<JobId>,
    /// Burst instances bound to the node that this notice moved to `draining`.
    pub instances: Vec<String>,
}

#[async_trait]
pub trait Store: Send + Sync + 'static {
    // Leader election (several replicas on one database).
    /// The epoch this store's leader writes are checked against.
    fn fence(&self) -> &Fence;
    /// Takes or renews the leader lease for `ttl_ms` (see [`lease_claim`]); the epoch held, or
    /// `None` when another replica holds a live lease. PostgreSQL uses the database's clock,
    /// SQLite `now`.
    async fn acquire_leadership(
        &self,
        replica: &str,
        instance: Uuid,
        ttl_ms: i64,
        now: Timestamp,
    ) -> StoreResult<Option<i64>>;
    /// Ends this process's lease at once (a clean shutdown), so a follower need not wait.
    async fn resign_leadership(&self, instance: Uuid) -> StoreResult<()>;
    async fn leader(&self) -> StoreResult<Option<LeaderRecord>>;

    // Catalogue.
    async fn upsert_region(&self, region: &Region) -> StoreResult<()>;
    async fn upsert_pool(&self, pool: &Pool) -> StoreResult<()>;
    async fn regions(&self) -> StoreResult<Vec<Region>>;
    async fn pools(&self) -> StoreResult<Vec<Pool>>;

    // API tokens.
    async fn insert_api_token(&self, token: &ApiTokenRecord) -> StoreResult<()>;
    async fn api_token_by_hash(&self, hash: &str) -> StoreResult<Option<ApiTokenRecord>>;
    /// Every API token, oldest first, revoked ones included.
    async fn api_tokens(&self) -> StoreResult<Vec<ApiTokenRecord>>;
    /// Revokes API token `id` and the console sessions that act as it, in one transaction.
    /// Returns the token as it was before (already revoked: unchanged), `None` when there is
    /// no such token.
    async fn revoke_api_token(
        &self,
        id: Uuid,
        now: Timestamp,
    ) -> StoreResult<Option<ApiTokenRecord>>;

    // Console sessions.
    async fn insert_console_session(&self, session: &ConsoleSessionRecord) -> StoreResult<()>;
    /// The session with this id hash and the API token it acts as, whatever their state (the
    /// caller checks expiry and revocation).
    async fn console_session(
        &self,
        id_hash: &str,
    ) -> StoreResult<Option<(ConsoleSessionRecord, ApiTokenRecord)>>;
    /// Marks the session revoked; false when there was no live session with this hash.
    async fn revoke_console_session(&self, id_hash: &str, now: Timestamp) -> StoreResult<bool>;

    // Enrolment and nodes.
    async fn insert_enrolment_token(&self, token: &EnrolmentTokenRecord) -> StoreResult<()>;
    /// Consumes a one-time enrolment token and creates the node in one transaction.
    /// Whether `enrolment_hash` names an enrolment token that could enrol an agent now (issued,
    /// unused, unexpired); read only, so that a registration's token is checked before its
    /// body is read. [`Store::register_node`] checks again and consumes it.
    async fn check_enrolment_token(
        &self,
        enrolment_hash: &str,
        now: Timestamp,
    ) -> StoreResult<Result<(), RegisterRefusal>>;
    async fn register_node(
        &self,
        enrolment_hash: &str,
        node: NewNode,
        now: Timestamp,
    ) -> StoreResult<Result<NodeRecord, RegisterRefusal>>;
    async fn node_by_token_hash(&self, hash: &str) -> StoreResult<Option<NodeRecord>>;
    /// Revokes node `node`'s agent token: the node is marked revoked and unhealthy, and its
    /// live attempts end `lost` with their jobs requeued (a revoked agent can no longer
    /// report), in one transaction. Returns the requeued jobs, `None` when there is no such
    /// node or it was revoked already.
    async fn revoke_node(
        &self,
        node: &NodeId,
        why: &str,
        now: Timestamp,
    ) -> StoreResult<Option<Vec<JobId>>>;
    async fn nodes(&self) -> StoreResult<Vec<NodeRecord>>;
    /// Records a heartbeat and answers it: whether the node was unhealthy before (it came
    /// back), and which attempts its agent must stop ([`heartbeat_stops`]). `running` is what
    /// the agent says it runs.
    async fn heartbeat(
        &self,
        node: &NodeId,
        inventory: &Inventory,
        running: &[AttemptRef],
        now: Timestamp,
    ) -> StoreResult<HeartbeatOutcome>;
    /// Writes heartbeats of healthy nodes in one transaction. `last_heartbeat` only moves
    /// forward (a later heartbeat already written wins, inventory included). A node that is
    /// not healthy (lost since the heartbeat was received) or unknown is left as it is: its
    /// next heartbeat goes through [`Store::heartbeat`], which brings it back and tells the
    /// scheduler. Returns the rows written.
    async fn record_heartbeats(&self, beats: &[HeartbeatWrite]) -> StoreResult<u64>;
    /// Which attempts the node's agent must stop ([`heartbeat_stops`]); `running` is what the
    /// agent says it runs.
    async fn node_stops(
        &self,
        node: &NodeId,
        running: &[AttemptRef],
    ) -> StoreResult<Vec<AttemptRef>>;
    /// Marks nodes whose last heartbeat is older than `before` as lost and requeues their live
    /// attempts. Returns the lost nodes and the requeued jobs.
    async fn expire_leases(&self, before: Timestamp, now: Timestamp) -> StoreResult<ExpiredLeases>;

    // Jobs.
    async fn insert_job(&self, job: &NewJob) -> StoreResult<()>;
    /// Inserts `job` under an `Idempotency-Key`, in one transaction with the key, unless the
    /// key (made at or after `since`) already names a job: then nothing is written and that
    /// job is returned. Keys made before `since` are deleted on the way.
    async fn insert_job_idempotent(
        &self,
        job: &NewJob,
        key: &IdempotencyKey,
        since: Timestamp,
    ) -> StoreResult<IdempotentInsert>;
    /// The job a key made at or after `since` names, and whether its request digest is
    /// `key.request_hash`.
    async fn idempotent_job(
        &self,
        key: &IdempotencyKey,
        since: Timestamp,
    ) -> StoreResult<Option<(JobId, bool)>>;
    async fn job(&self, id: JobId) -> StoreResult<Option<JobRecord>>;
    async fn list_jobs(&self, filter: &JobFilter) -> StoreResult<Vec<JobRecord>>;
    async fn cancel_job(&self, id: JobId, now: Timestamp) -> StoreResult<CancelOutcome>;
    /// The W3C trace context recorded with the job at submit, if any.
    async fn job_trace_parent(&self, job: JobId) -> StoreResult<Option<String>>;
    /// Jobs not yet finished, counted by state and priority (for `/metrics`).
    async fn queue_depth(&self) -> StoreResult<Vec<(JobState, Priority, i64)>>;
    /// Records placement explanations worked out after their plan was committed: each for
    /// the attempt it explains, so a job placed again since keeps its newer one.
    async fn set_explanations(&self, rows: &[(JobId, AttemptId, String)]) -> StoreResult<()>;
    /// Stores, per instance id, the explanation of the round that launched it for its job.
    async fn set_launch_explanations(&self, rows: &[(String, String)]) -> StoreResult<()>;
    /// The explanation of the round that launched an instance for `job`: the one whose node is
    /// `node`, or without a node the newest one still live.
    async fn launch_explanation(
        &self,
        job: JobId,
        node: Option<&str>,
    ) -> StoreResult<Option<String>>;

    // Scheduler.
    async fn pending_jobs(&self) -> StoreResult<Vec<JobRecord>>;
    async fn live_attempts(&self) -> StoreResult<Vec<AttemptRecord>>;
    /// Commits a round's assignments and launch requests in one transaction, each guarded by
    /// the job's version. A job changed since it was read fails the whole commit with
    /// [`StoreError::Stale`]. Jobs given a launch become `provisioning`.
    async fn commit_plan(
        &self,
        assignments: &[NewAttempt],
        launches: &[NewInstance],
        now: Timestamp,
    ) -> StoreResult<()>;

    // Burst instances.
    async fn instances(&self, include_terminated: bool) -> StoreResult<Vec<InstanceRecord>>;
    /// Pools backed off after capacity or quota errors, with until when.
    async fn pool_backoffs(&self, now: Timestamp) -> StoreResult<Vec<(PoolId, Timestamp)>>;
    /// The provider accepted the launch: `requested → booting`.
    async fn instance_launched(
        &self,
        id: &str,
        provider_id: &str,
        now: Timestamp,
    ) -> StoreResult<()>;
    async fn instance_launch_failed(
        &self,
        id: &str,
        error: &str,
        next: LaunchFailure,
        now: Timestamp,
    ) -> StoreResult<()>;
    async fn set_instance_idle(&self, id: &str, idle_since: Option<Timestamp>) -> StoreResult<()>;
    /// Ends an instance in one transaction: state `terminated`, its lifetime cost in the
    /// ledger (at least `min_billed_s`), its node retired and the node's live work requeued, and
    /// a job still waiting for it back in the queue. `reason` is kept as its `end_reason`, and
    /// as its `last_error` too when `error` (a boot timeout, gone at the provider; not a normal
    /// idle shutdown). Returns false if it had already ended.
    async fn end_instance(
        &self,
        id: &str,
        reason: Option<&str>,
        error: bool,
        min_billed_s: i64,
        now: Timestamp,
    ) -> StoreResult<bool>;
    /// Sum of ledger entries (micro-dollars).
    async fn ledger_total(&self) -> StoreResult<i64>;

    // Ledger accrual, spend and budgets.
    /// Writes ledger entries for every source up to `now` in one transaction: running attempts
    /// on nodes the broker did not launch, live instances (idle time included), and anything
    /// that ended unsettled (instances with at least `min_billed_s`). Returns the entries
    /// written. Idempotent: each source remembers how far it was accrued.
    async fn accrue_ledger(&self, now: Timestamp, min_billed_s: i64) -> StoreResult<usize>;
    /// Ledger entries grouped (and bucketed) as `query` asks.
    async fn spend(&self, query: &SpendQuery) -> StoreResult<Vec<SpendGroupRow>>;
    /// What a budget of `team` (and `project`) has spent in `[from, to)` and what live work of
    /// its jobs is still expected to cost.
    async fn budget_usage(
        &self,
        team: &str,
        project: Option<&str>,
        from: Timestamp,
        to: Timestamp,
    ) -> StoreResult<BudgetUsage>;
    /// What the work live now costs an hour, per team, by the ledger's own rules: running and
    /// preempting attempts on nodes the broker did not launch at their recorded rate, and live
    /// cloud instances at their hourly price, charged to the job on the node (else the job they
    /// were launched for). What the ledger accrues per hour if nothing changes.
    async fn spend_rates(&self) -> StoreResult<Vec<(String, Money)>>;
    /// Records that a budget's spend reached a threshold this period; false if it already was.
    async fn record_budget_alert(
        &self,
        team: &str,
        project: Option<&str>,
        period_start: Timestamp,
        threshold_ppm: i64,
        now: Timestamp,
    ) -> StoreResult<bool>;
    /// Ledger entries (of one job, or all), oldest period first.
    async fn ledger_entries(&self, job: Option<JobId>) -> StoreResult<Vec<LedgerEntry>>;
    /// Policy holds from the planner: `Some(reason)` makes a waiting job `held` with that
    /// reason, `None` returns a held job to `queued`. Jobs that left the queue meanwhile are
    /// left alone. Versions are not bumped: held jobs are still the planner's to place.
    async fn set_holds(&self, changes: &[(JobId, Option<String>)]) -> StoreResult<()>;

    /// Preemption: each `running` victim becomes `preempting` — it keeps its GPUs, and its
    /// agent is told to stop it (checkpoint signal, grace, kill); when the agent reports the
    /// end, the attempt becomes `preempted` and its job goes back to the queue with `why`
    /// (which notes the progress made). Victims not running (yet, or any more) are left alone.
    /// Returns the attempts now stopping.
    async fn preempt_attempts(
        &self,
        victims: &[(AttemptId, String)],
    ) -> StoreResult<Vec<(NodeId, AttemptRef)>>;

    // Policies and the audit log.
    /// Saves a new version of the policy of `team` (and `project`) and its `policy.put` audit
    /// row in one transaction. With `expected_version`, a compare-and-swap: `Some(0)` means
    /// "there is none yet"; any other mismatch is a [`PolicyConflict`] and nothing is written.
    async fn put_policy(
        &self,
        team: &str,
        project: Option<&str>,
        body: &switchyard_protocol::api::PolicyBody,
        expected_version: Option<i64>,
        actor: &str,
        now: Timestamp,
    ) -> StoreResult<Result<PolicyRecord, PolicyConflict>>;
    /// The current version of one policy.
    async fn policy(&self, team: &str, project: Option<&str>) -> StoreResult<Option<PolicyRecord>>;
    /// The current version of every policy, by team then project (team-wide first).
    async fn policies(&self) -> StoreResult<Vec<PolicyRecord>>;
    /// Appends one audit row; returns its id.
    async fn append_audit(&self, entry: &NewAuditEntry) -> StoreResult<i64>;
    /// Audit rows, newest first.
    async fn audit(&self, filter: &AuditFilter) -> StoreResult<Vec<AuditRecord>>;
    /// Applies infra's edit to a pool with its `pool.patch` audit row in one transaction (the
    /// edit outlives catalogue re-seeding). Returns the pool before and after; `None` if unknown.
    async fn patch_pool(
        &self,
        id: &PoolId,
        change: &PoolChange,
        actor: &str,
        now: Timestamp,
    ) -> StoreResult<Option<(Pool, Pool)>>;

    // Agent protocol.
    async fn leases_for_node(&self, node: &NodeId) -> StoreResult<Vec<LeaseRecord>>;
    /// Live attempts on the node whose job was cancelled: the agent must stop them.
    async fn stops_for_node(&self, node: &NodeId) -> StoreResult<Vec<AttemptRef>>;
    /// A spot interruption notice from the node's agent, in one transaction: the node drains
    /// (no new work), a burst instance bound to it becomes `draining`, and its live attempts
    /// become `preempted` with their jobs back in the queue (`why` as the reason). Idempotent:
    /// a repeated notice only takes what was assigned to the node since.
    async fn interrupt_node(
        &self,
        node: &NodeId,
        why: &str,
        now: Timestamp,
    ) -> StoreResult<NodeInterruption>;
    /// Applies agent events in order, in one transaction. Returns one result per event and the
    /// attempts that ended.
    async fn apply_events(
        &self,
        node: &NodeId,
        events: &[AgentEvent],
        now: Timestamp,
    ) -> StoreResult<(Vec<EventResult>, Vec<EndedAttempt>)>;
    async fn logs(&self, job: JobId, after: i64, limit: i64) -> StoreResult<Vec<LogRecord>>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::lease::finished_outcome;

    /// Found by the `agent_protocol` fuzz target: an attempt named twice (a heartbeat that
    /// repeats itself) was told to stop twice.
    #[test]
    fn an_attempt_named_twice_is_stopped_once() {
        let preempting = r(1, 2);
        let live = vec![
            (preempting.clone(), "preempting".to_string(), false),
            (preempting.clone(), "preempting".to_string(), false),
        ];
        let running = [preempting.clone(), preempting.clone(), r(9, 1), r(9, 1)];
        assert_eq!(heartbeat_stops(&live, &running), vec![preempting, r(9, 1)]);
    }

    /// Found by the `agent_protocol` fuzz target: a report with neither an exit code nor a
    /// signal nor an error failed the job without a reason.
    #[test]
    fn a_failed_job_always_has_a_reason() {
        for exit_code in [None, Some(0), Some(1)] {
            for signal in [None, Some(9)] {
                for error in [None, Some("spawn failed")] {
                    for stopped in [false, true] {
                        let (state, reason) =
                            finished_outcome(false, exit_code, signal, error, stopped);
                        assert_eq!(
                            reason.is_some(),
                            state != JobState::Succeeded || error.is_some(),
                            "{exit_code:?} {signal:?} {error:?} {stopped}: {state:?} {reason:?}"
                        );
                    }
                }
            }
        }
        assert_eq!(
            finished_outcome(false, None, None, None, false),
            (
                JobState::Failed,
                Some("ended without an exit code or a signal".to_string())
            )
        );
    }

    fn r(n: u128, epoch: u64) -> AttemptRef {
        AttemptRef {
            job_id: Uuid::from_u128(n),
            attempt_id: Uuid::from_u128(1000 + n),
            epoch,
        }
    }

    #[test]
    fn a_heartbeat_stops_cancelled_preempted_and_unleased_attempts() {
        let live = vec![
            (r(1, 1), "running".to_string(), false),
            (r(2, 1), "running".to_string(), true),
            (r(3, 1), "preempting".to_string(), false),
            (r(4, 1), "assigned".to_string(), false),
        ];
        // The agent runs 1, 2, 3, an old epoch of 4, and 5 which is not its lease at all.
        let running = [r(1, 1), r(2, 1), r(3, 1), r(4, 0), r(5, 1)];
        assert_eq!(
            heartbeat_stops(&live, &running),
            vec![r(2, 1), r(3, 1), r(4, 0), r(5, 1)]
        );
        assert_eq!(heartbeat_stops(&live[..1], &[r(1, 1)]), vec![]);
    }
}

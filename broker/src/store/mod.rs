//! Persistence. What is stored: regions, pools, tokens (hashed), nodes, jobs, attempts, log
//! chunks, instances, the ledger, policies and the audit log — everything acknowledged to a
//! user or an agent. What is rebuilt at start: the scheduler's in-memory mirror (from jobs,
//! attempts and nodes) and the latest placement explanations of waiting jobs.
//!
//! [`Store`] is the only way the rest of the broker reaches the database; each of its methods
//! is one transaction. The methods are written once (`sql/`) for both databases: SQLite, the
//! embedded default, and PostgreSQL, each with its own migrations folder (`migrations/`).
//!
//! - `sql/`: the methods, by subject, and the layer that runs one statement on either database;
//! - `sqlite.rs`, `postgres.rs` (+ `postgres/submits.rs`): only what differs — opening and
//!   migrating, the global write order, batched submissions and heartbeats;
//! - `records.rs`: the row shapes; `stretches.rs`: how the ledger splits an instance's time.
//! - It must not decide: the lease rule is `rules/lease.rs`, the budget rule `rules/budget.rs`;
//!   the store carries out their verdicts inside its transactions.

mod postgres;
mod records;
mod sql;
mod sqlite;
mod stretches;

pub use postgres::WRITE_LOCK_KEY;
pub use records::*;
pub use sql::{DbId, DbTime, RouteRow, RoutedService, ServiceTokenRecord, StoredReport};
pub use sql::{RuntimeRow, runtime_key};
pub use sql::{WasteRank, WasteRow, WasteWrite, merge_history};

use sql::{Db, Tx};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use switchyard_core::{AttemptId, JobId, JobState, Money, NodeId, PoolId, Priority, Timestamp};
use switchyard_protocol::agent::AttemptRef;
use switchyard_protocol::api::Role;
use uuid::Uuid;

pub fn role_name(r: Role) -> &'static str {
    match r {
        Role::Admin => "admin",
        Role::Finance => "finance",
        Role::Infra => "infra",
        Role::Developer => "developer",
    }
}

/// The audit target of a policy: `policy:TEAM` or `policy:TEAM/PROJECT`.
pub fn policy_target(team: &str, project: Option<&str>) -> String {
    match project {
        Some(p) => format!("policy:{team}/{p}"),
        None => format!("policy:{team}"),
    }
}

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
/// or the same replica restarted: the next epoch).
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

pub(crate) const LEASE_EPOCH: &str = "SELECT epoch FROM leader_lease WHERE id = 1";

/// Adds up hourly rates per team (work no team pays for is left out), ordered by team: the
/// fold `spend_rates` applies.
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
/// their job's cancel was requested.
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

/// A service replica whose readiness its agent reported changed ([`Store::record_serving`]).
#[derive(Clone, Debug, PartialEq)]
pub struct ReadinessChange {
    pub service: Uuid,
    pub job: JobId,
    pub ready: bool,
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

/// The broker's database: every read and write of the rest of the broker goes through its
/// methods, each one transaction. The methods are written once, in `sql/`, and run on SQLite
/// (the embedded default) and PostgreSQL (production, several replicas) alike; what differs
/// between the two is in `sqlite.rs` and `postgres.rs`. Cheap to clone: a handle on the pool.
#[derive(Clone, Debug)]
pub struct Store {
    db: Db,
    fence: Fence,
    /// Submissions, written in batches on PostgreSQL (`postgres/submits.rs`).
    submits: Option<postgres::Submits>,
}

impl Store {
    /// Opens (creating if needed) an SQLite database file and runs its migrations.
    pub async fn open_sqlite(path: &std::path::Path) -> StoreResult<Store> {
        Ok(Store::on(Db::Sqlite(sqlite::open_file(path).await?), None))
    }

    /// Opens a `sqlite:` URL, or connects to a `postgres://` (or `postgresql://`) one whose
    /// database exists; runs the migrations.
    pub async fn open_url(url: &str) -> StoreResult<Store> {
        if url.starts_with("sqlite:") {
            Ok(Store::on(Db::Sqlite(sqlite::open_url(url).await?), None))
        } else {
            let pool = postgres::open_url(url).await?;
            let submits = postgres::Submits::start(pool.clone());
            Ok(Store::on(Db::Postgres(pool), Some(submits)))
        }
    }

    fn on(db: Db, submits: Option<postgres::Submits>) -> Store {
        Store {
            db,
            fence: Fence::off(),
            submits,
        }
    }

    /// The epoch this store's leader writes are checked against.
    pub fn fence(&self) -> &Fence {
        &self.fence
    }

    /// The PostgreSQL pool (the replicas' notification bus, and tests that inspect the
    /// database); `None` on SQLite.
    pub fn pg_pool(&self) -> Option<&sqlx::PgPool> {
        match &self.db {
            Db::Postgres(p) => Some(p),
            Db::Sqlite(_) => None,
        }
    }

    /// A transaction in the global write order: SQLite's `BEGIN IMMEDIATE`, PostgreSQL's
    /// advisory lock (see `postgres.rs`).
    async fn write_tx(&self) -> StoreResult<Tx> {
        Ok(match &self.db {
            Db::Sqlite(p) => Tx::Sqlite(sqlite::write_tx(p).await?),
            Db::Postgres(p) => Tx::Postgres(postgres::write_tx(p).await?),
        })
    }

    /// A write transaction for the leader's writes: fails with [`StoreError::Fenced`] unless
    /// the lease is still at the epoch this replica leads under (see [`Fence`]). The lease is
    /// only changed under the same write lock, so it cannot move before this commits.
    async fn leader_tx(&self) -> StoreResult<Tx> {
        let mut tx = self.write_tx().await?;
        if self.fence.get().is_some() {
            let current: Option<i64> = sql::query_scalar(LEASE_EPOCH)
                .fetch_optional(&mut tx)
                .await?;
            self.fence.check(current)?;
        }
        Ok(tx)
    }

    fn dialect(&self) -> &'static sql::Dialect {
        self.db.dialect()
    }
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

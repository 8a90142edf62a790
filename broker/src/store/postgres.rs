//! The PostgreSQL store: production, and several broker replicas on one database. Migrations
//! from `migrations/postgres` (native UUID, TIMESTAMPTZ, BOOLEAN, BIGINT) are embedded in the
//! binary and run at start; sqlx's migrator serialises replicas starting together.
//!
//! What only PostgreSQL does is here: connecting and migrating, the write lock below, batched
//! submissions (`postgres/submits.rs`) and heartbeats (`UNNEST` arrays), the heartbeat's row
//! lock, the database's clock for the leader lease. Every other statement is in `sql/`, shared
//! with SQLite. Column types: see `sql/types.rs`; JSON documents stay TEXT (see the first
//! migration). Text ordering uses `COLLATE "C"` so that lists come back in the same (byte)
//! order as on SQLite, whatever the database's locale.
//!
//! # Transactions
//!
//! SQLite's `BEGIN IMMEDIATE` gives every writing transaction a global order. Here a writing
//! transaction takes the transaction-level advisory lock [`WRITE_LOCK_KEY`] first
//! (`pg_advisory_xact_lock`, released at commit or rollback), which gives the same global order
//! for the transactions that read and then write (plan commits, agent events, cancels, lease
//! expiry, instance ends, ledger accrual, policy compare-and-swap…): inside the lock, READ
//! COMMITTED sees every earlier writer's commit, so no check-then-write can be invalidated.
//! Log chunks and ledger rows also get their identity ids in commit order, which the `after`
//! cursors rely on. Not under the lock, because one statement is already atomic and nothing
//! reads-then-writes around it: job submission (one INSERT; the hot path), token, session and
//! catalogue writes, explanations and budget-alert inserts (`ON CONFLICT DO NOTHING`).
//! Heartbeats (10,000 agents every 10 s) take only their node's row lock
//! (`SELECT … FOR UPDATE`); lease expiry locks the nodes it marks lost the same way, so a
//! heartbeat and an expiry of the same node are ordered one way or the other, never mixed.

use super::{DbTime, HEARTBEATS_PER_STATEMENT, HeartbeatWrite, StoreResult};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgPool, Postgres, Transaction};
use std::str::FromStr;
use switchyard_core::Timestamp;

mod submits;
pub(super) use submits::Submits;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/postgres");

/// The key of the transaction-level advisory lock every writing transaction takes first
/// (`pg_advisory_xact_lock`): the global write order SQLite gets from `BEGIN IMMEDIATE`.
/// ("SYWRITE" in ASCII; any other advisory lock of the broker must use another key.)
pub const WRITE_LOCK_KEY: i64 = 0x0053_5957_5249_5445;

type Tz = chrono::DateTime<chrono::Utc>;

/// Connects to a `postgres://` (or `postgresql://`) URL and runs migrations. The database
/// must exist.
pub(super) async fn open_url(url: &str) -> StoreResult<PgPool> {
    let options = PgConnectOptions::from_str(url)?;
    let pool = PgPoolOptions::new()
        .max_connections(16)
        .connect_with(options)
        .await?;
    MIGRATOR.run(&pool).await?;
    Ok(pool)
}

/// A transaction holding the global write lock (see the module docs).
pub(super) async fn write_tx(pool: &PgPool) -> StoreResult<Transaction<'static, Postgres>> {
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(WRITE_LOCK_KEY)
        .execute(&mut *tx)
        .await?;
    Ok(tx)
}

/// The database's clock, read inside the leader lease's transaction: replicas' clocks need
/// not agree.
pub(super) async fn clock(tx: &mut sqlx::PgConnection) -> StoreResult<Timestamp> {
    let now: Tz = sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(tx)
        .await?;
    Ok(DbTime::from_tz(now).0)
}

/// A heartbeat's write: the node's last heartbeat and inventory, and whether it was healthy
/// before (`None`: no such node). One statement, the node's row lock only (see the module
/// docs: lease expiry locks it too); the subquery reads the row as it was before this update.
pub(super) async fn touch_node(
    pool: &PgPool,
    node: &str,
    inventory_json: &str,
    now: Timestamp,
) -> StoreResult<Option<bool>> {
    Ok(sqlx::query_scalar(
        "UPDATE nodes SET last_heartbeat = $1, inventory_json = $2, healthy = TRUE \
         FROM (SELECT healthy AS was FROM nodes WHERE id = $3 FOR UPDATE) AS old \
         WHERE nodes.id = $3 RETURNING old.was",
    )
    .bind(DbTime(now))
    .bind(inventory_json)
    .bind(node)
    .fetch_optional(pool)
    .await?)
}

/// Heartbeats kept in memory, written in one transaction of row locks (not the write lock),
/// `UNNEST` arrays per statement.
pub(super) async fn record_heartbeats(pool: &PgPool, beats: &[HeartbeatWrite]) -> StoreResult<u64> {
    let mut tx = pool.begin().await?;
    let mut written = 0;
    for chunk in beats.chunks(HEARTBEATS_PER_STATEMENT) {
        let ids: Vec<&str> = chunk.iter().map(|b| b.node.as_str()).collect();
        let ats: Vec<Tz> = chunk.iter().map(|b| DbTime(b.at).to_tz()).collect();
        let inventories: Vec<&str> = chunk.iter().map(|b| b.inventory_json.as_str()).collect();
        // Row locks in lease expiry's order (ORDER BY id COLLATE "C"), so the two never
        // deadlock; then one UPDATE for the chunk.
        sqlx::query("SELECT id FROM nodes WHERE id = ANY($1) ORDER BY id COLLATE \"C\" FOR UPDATE")
            .bind(&ids)
            .fetch_all(&mut *tx)
            .await?;
        written += sqlx::query(
            "UPDATE nodes SET last_heartbeat = v.at, inventory_json = v.inventory \
             FROM UNNEST($1::text[], $2::timestamptz[], $3::text[]) AS v(id, at, inventory) \
             WHERE nodes.id = v.id AND nodes.healthy AND v.at >= nodes.last_heartbeat",
        )
        .bind(&ids)
        .bind(&ats)
        .bind(&inventories)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    }
    tx.commit().await?;
    Ok(written)
}

//! What only SQLite does: one WAL-mode file in the data directory, readable by its owner only;
//! migrations from `migrations/sqlite` embedded in the binary and run at start; `BEGIN
//! IMMEDIATE` for the global write order; batched heartbeats through a `VALUES` list. Every
//! other statement is in `sql/`, shared with PostgreSQL.

use super::sql::corrupt;
use super::{HEARTBEATS_PER_STATEMENT, HeartbeatWrite, StoreResult};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Sqlite, SqlitePool, Transaction};
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;
use switchyard_core::Timestamp;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/sqlite");

/// Opens (creating if needed) the database file and runs migrations.
pub(super) async fn open_file(path: &Path) -> StoreResult<SqlitePool> {
    connect(SqliteConnectOptions::new().filename(path)).await
}

/// Opens a `sqlite:` URL (e.g. `sqlite://path/to/file.db`).
pub(super) async fn open_url(url: &str) -> StoreResult<SqlitePool> {
    connect(SqliteConnectOptions::from_str(url)?).await
}

async fn connect(options: SqliteConnectOptions) -> StoreResult<SqlitePool> {
    let options = options
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal)
        .busy_timeout(Duration::from_secs(10))
        .foreign_keys(true)
        // PostgreSQL's `COLLATE "C"` (byte order, whatever the locale), which the shared
        // statements use for lists ordered by text: SQLite's own BINARY order, under that name.
        .collation("C", |a: &str, b: &str| a.as_bytes().cmp(b.as_bytes()));
    owner_only(options.get_filename())?;
    let pool = SqlitePoolOptions::new()
        .max_connections(8)
        .connect_with(options)
        .await?;
    MIGRATOR.run(&pool).await?;
    Ok(pool)
}

/// Every transaction here writes, so it takes the write lock up front (`BEGIN IMMEDIATE`):
/// a deferred transaction that reads first and writes later fails with SQLITE_BUSY when
/// another writer committed in between, and the busy timeout cannot help it.
pub(super) async fn write_tx(pool: &SqlitePool) -> StoreResult<Transaction<'static, Sqlite>> {
    Ok(pool.begin_with("BEGIN IMMEDIATE").await?)
}

/// A heartbeat's write: the node's last heartbeat and inventory, and whether it was healthy
/// before (`None`: no such node).
pub(super) async fn touch_node(
    pool: &SqlitePool,
    node: &str,
    inventory_json: &str,
    now: Timestamp,
) -> StoreResult<Option<bool>> {
    let mut tx = write_tx(pool).await?;
    let was_healthy: Option<bool> = sqlx::query_scalar("SELECT healthy FROM nodes WHERE id = $1")
        .bind(node)
        .fetch_optional(&mut *tx)
        .await?;
    sqlx::query(
        "UPDATE nodes SET last_heartbeat = $1, inventory_json = $2, healthy = TRUE WHERE id = $3",
    )
    .bind(now.millis())
    .bind(inventory_json)
    .bind(node)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(was_healthy)
}

/// Heartbeats kept in memory, written in one transaction, a `VALUES` list per statement.
pub(super) async fn record_heartbeats(
    pool: &SqlitePool,
    beats: &[HeartbeatWrite],
) -> StoreResult<u64> {
    let mut tx = write_tx(pool).await?;
    let mut written = 0;
    for chunk in beats.chunks(HEARTBEATS_PER_STATEMENT) {
        let values = vec!["(?, ?, ?)"; chunk.len()].join(", ");
        let sql = format!(
            "WITH v(id, at, inventory) AS (VALUES {values}) \
             UPDATE nodes SET last_heartbeat = v.at, inventory_json = v.inventory \
             FROM v WHERE nodes.id = v.id AND nodes.healthy AND v.at >= nodes.last_heartbeat"
        );
        // Only placeholders are formatted in; every value is bound.
        let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
        for b in chunk {
            q = q
                .bind(b.node.as_str())
                .bind(b.at.millis())
                .bind(&b.inventory_json);
        }
        written += q.execute(&mut *tx).await?.rows_affected();
    }
    tx.commit().await?;
    Ok(written)
}

/// The database holds token hashes, job specs (with their environment) and the ledger: it is
/// created readable by its owner only (SQLite gives its `-wal` and `-shm` files the same
/// mode), and an existing file is narrowed to that. In-memory databases have no file.
fn owner_only(path: &Path) -> StoreResult<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let name = path.to_string_lossy();
    // `sqlite::memory:` becomes `file:sqlx-in-memory-N`: no file on disk.
    if name.is_empty() || name == ":memory:" || name.starts_with("file:") {
        return Ok(());
    }
    let io = |e: std::io::Error| corrupt(format!("database file {}: {e}", path.display()));
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
        .map_err(io)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(io)
}

//! The PostgreSQL store: production, and several broker replicas on one database. Migrations
//! from `migrations/postgres` (native UUID, TIMESTAMPTZ, BOOLEAN, BIGINT) are embedded in the
//! binary and run at start; sqlx's migrator serialises replicas starting together.
//!
//! Same semantics as [`SqliteStore`](super::SqliteStore), method for method. Conversions:
//! [`Timestamp`] (integer milliseconds) ⇄ TIMESTAMPTZ (microsecond precision, so whole
//! milliseconds round-trip exactly), job, attempt and API-token ids ⇄ UUID, flags ⇄ BOOLEAN.
//! JSON documents stay TEXT (see the first migration). Text ordering uses `COLLATE "C"` so that
//! lists come back in the same (byte) order as on SQLite, whatever the database's locale.
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

use super::sqlite::{
    accepted, corrupt, duplicate, gpus_json, market_str, parse_gpus, parse_market, parse_priority,
    parse_role, parse_spec, parse_state, rejected, stream_str, u32_of,
};
use super::*;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgRow};
use sqlx::{PgPool, Row};
use std::str::FromStr;
use switchyard_core::{AttemptId, JobState, Money, NodeId, PoolId, Priority, RegionId};
use uuid::Uuid;

mod ledger;
mod submits;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/postgres");

/// The key of the transaction-level advisory lock every writing transaction takes first
/// (`pg_advisory_xact_lock`): the global write order SQLite gets from `BEGIN IMMEDIATE`.
/// ("SYWRITE" in ASCII; any other advisory lock of the broker must use another key.)
pub const WRITE_LOCK_KEY: i64 = 0x0053_5957_5249_5445;

type Tx = sqlx::Transaction<'static, sqlx::Postgres>;
type Tz = chrono::DateTime<chrono::Utc>;

#[derive(Clone, Debug)]
pub struct PgStore {
    pool: PgPool,
    fence: Fence,
    /// Submissions, written in batches (`submits.rs`).
    submits: submits::Submits,
}

impl PgStore {
    /// Connects to a `postgres://` (or `postgresql://`) URL and runs migrations. The database
    /// must exist.
    pub async fn open_url(url: &str) -> StoreResult<PgStore> {
        let options = PgConnectOptions::from_str(url)?;
        let pool = PgPoolOptions::new()
            .max_connections(16)
            .connect_with(options)
            .await?;
        MIGRATOR.run(&pool).await?;
        Ok(PgStore {
            submits: submits::Submits::start(pool.clone()),
            pool,
            fence: Fence::off(),
        })
    }

    /// The connection pool (for tests and tools that inspect the database).
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// A transaction holding the global write lock (see the module docs).
    async fn write_tx(&self) -> StoreResult<Tx> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(WRITE_LOCK_KEY)
            .execute(&mut *tx)
            .await?;
        Ok(tx)
    }

    /// A write transaction for the leader's writes: fails with [`StoreError::Fenced`] unless
    /// the lease is still at the epoch this replica leads under (see [`Fence`]). The lease is
    /// only changed under the same write lock, so it cannot move before this commits.
    async fn leader_tx(&self) -> StoreResult<Tx> {
        let mut tx = self.write_tx().await?;
        if self.fence.get().is_some() {
            let current: Option<i64> = sqlx::query_scalar(LEASE_EPOCH)
                .fetch_optional(&mut *tx)
                .await?;
            self.fence.check(current)?;
        }
        Ok(tx)
    }

    /// The pool, for the replicas' notification bus (LISTEN/NOTIFY).
    pub fn notify_pool(&self) -> PgPool {
        self.pool.clone()
    }
}

fn leader_of_row(r: &PgRow) -> StoreResult<LeaderRecord> {
    Ok(LeaderRecord {
        holder: r.try_get("holder")?,
        holder_instance: r.try_get("holder_instance")?,
        epoch: r.try_get("epoch")?,
        acquired_at: ts_of(r.try_get("acquired_at")?),
        expires_at: ts_of(r.try_get("expires_at")?),
    })
}

/// The latest instant chrono holds (PostgreSQL goes further), in whole milliseconds: the end
/// of year 262142. Later times — `Timestamp::MAX`, which a service's expected end is — are
/// stored as this and read back as `Timestamp::MAX`.
const TS_MAX_MS: i64 = 8_210_266_876_799_999;
/// The start of year 1 (PostgreSQL holds back to 4713 BC): earlier times are stored as this
/// and read back as `Timestamp(i64::MIN)`. The broker has no use for either extreme but as
/// "never" and "always".
const TS_MIN_MS: i64 = -62_135_596_800_000;

/// A millisecond timestamp as TIMESTAMPTZ.
fn tz(t: Timestamp) -> Tz {
    let ms = t.millis().clamp(TS_MIN_MS, TS_MAX_MS);
    Tz::from_timestamp_millis(ms).unwrap_or(if ms < 0 { Tz::MIN_UTC } else { Tz::MAX_UTC })
}

fn tz_opt(t: Option<Timestamp>) -> Option<Tz> {
    t.map(tz)
}

fn ts_of(t: Tz) -> Timestamp {
    match t.timestamp_millis() {
        ms if ms >= TS_MAX_MS => Timestamp::MAX,
        ms if ms <= TS_MIN_MS => Timestamp(i64::MIN),
        ms => Timestamp(ms),
    }
}

fn get_ts(r: &PgRow, col: &str) -> StoreResult<Timestamp> {
    Ok(ts_of(r.try_get::<Tz, _>(col)?))
}

fn get_ts_opt(r: &PgRow, col: &str) -> StoreResult<Option<Timestamp>> {
    Ok(r.try_get::<Option<Tz>, _>(col)?.map(ts_of))
}

fn region_from_row(r: &PgRow) -> StoreResult<Region> {
    Ok(Region {
        id: RegionId(r.try_get("id")?),
        provider: r.try_get("provider")?,
        code: r.try_get("code")?,
        latitude: r.try_get("latitude")?,
        longitude: r.try_get("longitude")?,
        egress_per_gb: Money(r.try_get("egress_per_gb_micros")?),
        latency_ms: u32_of(r.try_get("latency_ms")?, "latency_ms")?,
        ingress_gbps: u32_of(r.try_get("ingress_gbps")?, "ingress_gbps")?,
    })
}

fn pool_from_row(r: &PgRow) -> StoreResult<Pool> {
    Ok(Pool {
        id: PoolId(r.try_get("id")?),
        region: RegionId(r.try_get("region_id")?),
        provider: r.try_get("provider")?,
        instance_type: r.try_get("instance_type")?,
        gpu_model: r.try_get("gpu_model")?,
        gpus_per_node: u32_of(r.try_get("gpus_per_node")?, "gpus_per_node")?,
        gpu_memory_gb: u32_of(r.try_get("gpu_memory_gb")?, "gpu_memory_gb")?,
        vcpus: u32_of(r.try_get("vcpus")?, "vcpus")?,
        memory_gb: u32_of(r.try_get("memory_gb")?, "memory_gb")?,
        on_demand_per_hour: Money(r.try_get("on_demand_micros")?),
        spot_per_hour: r.try_get::<Option<i64>, _>("spot_micros")?.map(Money),
        node_limit: u32_of(r.try_get("node_limit")?, "node_limit")?,
        launchable: r.try_get("launchable")?,
        boot_time_s: u32_of(r.try_get("boot_time_s")?, "boot_time_s")?,
        price_updated_at: get_ts(r, "price_updated_at")?,
        recent_capacity_failures: u32_of(
            r.try_get("recent_capacity_failures")?,
            "recent_capacity_failures",
        )?,
    })
}

fn node_from_row(r: &PgRow) -> StoreResult<NodeRecord> {
    Ok(NodeRecord {
        id: NodeId(r.try_get("id")?),
        pool: PoolId(r.try_get("pool_id")?),
        hostname: r.try_get("hostname")?,
        gpus_total: u32_of(r.try_get("gpus_total")?, "gpus_total")?,
        inventory_json: r.try_get("inventory_json")?,
        healthy: r.try_get("healthy")?,
        draining: r.try_get("draining")?,
        revoked: r.try_get("revoked")?,
        registered_at: get_ts(r, "registered_at")?,
        last_heartbeat: get_ts(r, "last_heartbeat")?,
    })
}

fn token_from_row(r: &PgRow, created_at: &str, revoked_at: &str) -> StoreResult<ApiTokenRecord> {
    Ok(ApiTokenRecord {
        id: r.try_get("id")?,
        token_hash: r.try_get("token_hash")?,
        role: parse_role(&r.try_get::<String, _>("role")?)?,
        team: r.try_get("team")?,
        name: r.try_get("name")?,
        created_at: get_ts(r, created_at)?,
        revoked: r.try_get::<Option<Tz>, _>(revoked_at)?.is_some(),
    })
}

fn job_from_row(r: &PgRow) -> StoreResult<JobRecord> {
    let placement = match r.try_get::<Option<Uuid>, _>("a_id")? {
        None => None,
        Some(a_id) => Some(AttemptPlacement {
            attempt: AttemptId(a_id),
            node: NodeId(r.try_get("a_node")?),
            pool: PoolId(r.try_get("a_pool")?),
            region: r
                .try_get::<Option<String>, _>("a_region")?
                .unwrap_or_default(),
            gpus: parse_gpus(&r.try_get::<String, _>("a_gpus")?)?,
            market: parse_market(&r.try_get::<String, _>("a_market")?)?,
        }),
    };
    let exit_code = r
        .try_get::<Option<i64>, _>("exit_code")?
        .map(|c| i32::try_from(c).map_err(|_| corrupt(format!("exit code out of range: {c}"))))
        .transpose()?;
    Ok(JobRecord {
        id: JobId(r.try_get("id")?),
        spec: parse_spec(&r.try_get::<String, _>("core_spec_json")?)?,
        spec_json: r.try_get("spec_json")?,
        state: parse_state(&r.try_get::<String, _>("state")?)?,
        submitted_at: get_ts(r, "submitted_at")?,
        started_at: get_ts_opt(r, "started_at")?,
        finished_at: get_ts_opt(r, "finished_at")?,
        exit_code,
        reason: r.try_get("reason")?,
        cancel_requested: r.try_get("cancel_requested")?,
        attempts: u32_of(r.try_get("attempts")?, "attempts")?,
        version: r.try_get("version")?,
        explanation_json: r.try_get("explanation_json")?,
        placement,
        cost: Money(r.try_get::<Option<i64>, _>("cost_micros")?.unwrap_or(0)),
    })
}

fn policy_from_row(r: &PgRow) -> StoreResult<PolicyRecord> {
    let project: String = r.try_get("project_key")?;
    let body_json: String = r.try_get("body_json")?;
    Ok(PolicyRecord {
        team: r.try_get("team")?,
        project: (!project.is_empty()).then_some(project),
        version: r.try_get("version")?,
        body: serde_json::from_str(&body_json)
            .map_err(|e| corrupt(format!("bad policy body: {e}")))?,
        updated_at: get_ts(r, "created_at")?,
        updated_by: r.try_get("created_by")?,
    })
}

fn instance_from_row(r: &PgRow) -> StoreResult<InstanceRecord> {
    let state: String = r.try_get("state")?;
    Ok(InstanceRecord {
        id: r.try_get("id")?,
        provider: r.try_get("provider")?,
        provider_id: r.try_get("provider_id")?,
        pool: PoolId(r.try_get("pool_id")?),
        region: r.try_get("region_id")?,
        market: parse_market(&r.try_get::<String, _>("market")?)?,
        state: InstanceState::parse(&state)
            .ok_or_else(|| corrupt(format!("bad instance state {state:?}")))?,
        hourly_price: Money(r.try_get("hourly_price_micros")?),
        for_job: r.try_get::<Option<Uuid>, _>("for_job")?.map(JobId),
        node: r.try_get::<Option<String>, _>("node_id")?.map(NodeId),
        launch_attempts: u32_of(r.try_get("launch_attempts")?, "launch_attempts")?,
        next_attempt_at: get_ts(r, "next_attempt_at")?,
        last_error: r.try_get("last_error")?,
        end_reason: r.try_get("end_reason")?,
        requested_at: get_ts(r, "requested_at")?,
        launched_at: get_ts_opt(r, "launched_at")?,
        ready_at: get_ts_opt(r, "ready_at")?,
        idle_since: get_ts_opt(r, "idle_since")?,
        ended_at: get_ts_opt(r, "ended_at")?,
    })
}

fn epoch_of(r: &PgRow) -> StoreResult<u64> {
    let epoch: i64 = r.try_get("epoch")?;
    u64::try_from(epoch).map_err(|_| corrupt(format!("epoch out of range: {epoch}")))
}

fn attempt_ref_from_row(r: &PgRow) -> StoreResult<AttemptRef> {
    Ok(AttemptRef {
        job_id: r.try_get("job_id")?,
        attempt_id: r.try_get("id")?,
        epoch: epoch_of(r)?,
    })
}

/// Pools with infra's edits (`pool_overrides`) applied.
macro_rules! pools_select {
    ($tail:literal) => {
        concat!(
            "SELECT p.id, p.region_id, p.provider, p.instance_type, p.gpu_model, \
             p.gpus_per_node, p.gpu_memory_gb, p.vcpus, p.memory_gb, \
             COALESCE(o.on_demand_micros, p.on_demand_micros) AS on_demand_micros, \
             p.spot_micros, COALESCE(o.node_limit, p.node_limit) AS node_limit, \
             COALESCE(o.launchable, p.launchable) AS launchable, p.boot_time_s, \
             CASE WHEN o.on_demand_micros IS NOT NULL AND o.updated_at > p.price_updated_at \
                  THEN o.updated_at ELSE p.price_updated_at END AS price_updated_at, \
             p.recent_capacity_failures \
             FROM pools p LEFT JOIN pool_overrides o ON o.pool_id = p.id",
            $tail
        )
    };
}

const SQL_POOLS: &str = pools_select!(" ORDER BY p.id COLLATE \"C\"");
const SQL_POOL_BY_ID: &str = pools_select!(" WHERE p.id = $1");

macro_rules! job_select {
    ($tail:literal) => {
        concat!(
            "SELECT j.id, j.core_spec_json, j.spec_json, j.state, j.submitted_at, j.started_at, \
             j.finished_at, j.exit_code, j.reason, j.cancel_requested, j.attempts, j.version, \
             j.explanation_json, a.id AS a_id, a.node_id AS a_node, a.pool_id AS a_pool, \
             a.gpus_json AS a_gpus, a.market AS a_market, p.region_id AS a_region, \
             (SELECT SUM(l.amount_micros)::BIGINT FROM ledger l WHERE l.job_id = j.id) \
             AS cost_micros \
             FROM jobs j LEFT JOIN attempts a ON a.id = j.current_attempt \
             LEFT JOIN pools p ON p.id = a.pool_id ",
            $tail
        )
    };
}

const SQL_JOB_BY_ID: &str = job_select!("WHERE j.id = $1");
const SQL_LIST_JOBS: &str = job_select!("");
const SQL_PENDING_JOBS: &str =
    job_select!("WHERE j.state IN ('queued', 'provisioning', 'held') ORDER BY j.id");

#[async_trait]
impl Store for PgStore {
    fn fence(&self) -> &Fence {
        &self.fence
    }

    async fn acquire_leadership(
        &self,
        replica: &str,
        instance: Uuid,
        ttl_ms: i64,
        _now: Timestamp,
    ) -> StoreResult<Option<i64>> {
        let mut tx = self.write_tx().await?;
        // The database's clock, read after the write lock: replicas' clocks need not agree.
        let now: Tz = sqlx::query_scalar("SELECT clock_timestamp()")
            .fetch_one(&mut *tx)
            .await?;
        let row = sqlx::query(LEASE_SELECT)
            .fetch_optional(&mut *tx)
            .await?
            .map(|r| leader_of_row(&r))
            .transpose()?;
        let expires = now + chrono::Duration::milliseconds(ttl_ms);
        let Some((epoch, renew)) = lease_claim(row.as_ref(), replica, instance, ts_of(now)) else {
            return Ok(None);
        };
        if renew {
            sqlx::query(LEASE_RENEW)
                .bind(expires)
                .execute(&mut *tx)
                .await?;
        } else {
            sqlx::query(LEASE_TAKE)
                .bind(replica)
                .bind(instance)
                .bind(epoch)
                .bind(now)
                .bind(expires)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(Some(epoch))
    }

    async fn resign_leadership(&self, instance: Uuid) -> StoreResult<()> {
        let mut tx = self.write_tx().await?;
        sqlx::query(
            "UPDATE leader_lease SET expires_at = 'epoch' \
             WHERE id = 1 AND holder_instance = $1",
        )
        .bind(instance)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn leader(&self) -> StoreResult<Option<LeaderRecord>> {
        sqlx::query(LEASE_SELECT)
            .fetch_optional(&self.pool)
            .await?
            .map(|r| leader_of_row(&r))
            .transpose()
    }

    async fn upsert_region(&self, region: &Region) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO regions (id, provider, code, latitude, longitude, egress_per_gb_micros, \
             latency_ms, ingress_gbps) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
             ON CONFLICT (id) DO UPDATE SET provider = excluded.provider, code = excluded.code, \
             latitude = excluded.latitude, longitude = excluded.longitude, \
             egress_per_gb_micros = excluded.egress_per_gb_micros, \
             latency_ms = excluded.latency_ms, ingress_gbps = excluded.ingress_gbps",
        )
        .bind(region.id.as_str())
        .bind(&region.provider)
        .bind(&region.code)
        .bind(region.latitude)
        .bind(region.longitude)
        .bind(region.egress_per_gb.micros())
        .bind(i64::from(region.latency_ms))
        .bind(i64::from(region.ingress_gbps))
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn upsert_pool(&self, pool: &Pool) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO pools (id, region_id, provider, instance_type, gpu_model, gpus_per_node, \
             gpu_memory_gb, vcpus, memory_gb, on_demand_micros, spot_micros, node_limit, \
             launchable, boot_time_s, price_updated_at, recent_capacity_failures) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16) \
             ON CONFLICT (id) DO UPDATE SET region_id = excluded.region_id, \
             provider = excluded.provider, instance_type = excluded.instance_type, \
             gpu_model = excluded.gpu_model, gpus_per_node = excluded.gpus_per_node, \
             gpu_memory_gb = excluded.gpu_memory_gb, vcpus = excluded.vcpus, \
             memory_gb = excluded.memory_gb, on_demand_micros = excluded.on_demand_micros, \
             spot_micros = excluded.spot_micros, node_limit = excluded.node_limit, \
             launchable = excluded.launchable, boot_time_s = excluded.boot_time_s, \
             price_updated_at = excluded.price_updated_at",
        )
        .bind(pool.id.as_str())
        .bind(pool.region.as_str())
        .bind(&pool.provider)
        .bind(&pool.instance_type)
        .bind(&pool.gpu_model)
        .bind(i64::from(pool.gpus_per_node))
        .bind(i64::from(pool.gpu_memory_gb))
        .bind(i64::from(pool.vcpus))
        .bind(i64::from(pool.memory_gb))
        .bind(pool.on_demand_per_hour.micros())
        .bind(pool.spot_per_hour.map(Money::micros))
        .bind(i64::from(pool.node_limit))
        .bind(pool.launchable)
        .bind(i64::from(pool.boot_time_s))
        .bind(tz(pool.price_updated_at))
        .bind(i64::from(pool.recent_capacity_failures))
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn regions(&self) -> StoreResult<Vec<Region>> {
        let rows = sqlx::query("SELECT * FROM regions ORDER BY id COLLATE \"C\"")
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(region_from_row).collect()
    }

    async fn pools(&self) -> StoreResult<Vec<Pool>> {
        let rows = sqlx::query(SQL_POOLS).fetch_all(&self.pool).await?;
        rows.iter().map(pool_from_row).collect()
    }

    async fn insert_api_token(&self, token: &ApiTokenRecord) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO api_tokens (id, token_hash, role, team, name, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(token.id)
        .bind(&token.token_hash)
        .bind(role_name(token.role))
        .bind(&token.team)
        .bind(&token.name)
        .bind(tz(token.created_at))
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn api_token_by_hash(&self, hash: &str) -> StoreResult<Option<ApiTokenRecord>> {
        let row = sqlx::query("SELECT * FROM api_tokens WHERE token_hash = $1")
            .bind(hash)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| token_from_row(&r, "created_at", "revoked_at"))
            .transpose()
    }

    async fn api_tokens(&self) -> StoreResult<Vec<ApiTokenRecord>> {
        let rows = sqlx::query("SELECT * FROM api_tokens ORDER BY created_at, id")
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| token_from_row(r, "created_at", "revoked_at"))
            .collect()
    }

    async fn revoke_api_token(
        &self,
        id: Uuid,
        now: Timestamp,
    ) -> StoreResult<Option<ApiTokenRecord>> {
        let mut tx = self.write_tx().await?;
        let Some(row) = sqlx::query("SELECT * FROM api_tokens WHERE id = $1")
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?
        else {
            return Ok(None);
        };
        let before = token_from_row(&row, "created_at", "revoked_at")?;
        sqlx::query("UPDATE api_tokens SET revoked_at = $2 WHERE id = $1 AND revoked_at IS NULL")
            .bind(id)
            .bind(tz(now))
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "UPDATE console_sessions SET revoked_at = $2 \
             WHERE api_token_id = $1 AND revoked_at IS NULL",
        )
        .bind(id)
        .bind(tz(now))
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Some(before))
    }

    async fn insert_console_session(&self, session: &ConsoleSessionRecord) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO console_sessions \
             (id_hash, api_token_id, csrf_token, created_at, expires_at, revoked_at) \
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(&session.id_hash)
        .bind(session.api_token_id)
        .bind(&session.csrf_token)
        .bind(tz(session.created_at))
        .bind(tz(session.expires_at))
        .bind(tz_opt(session.revoked_at))
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn console_session(
        &self,
        id_hash: &str,
    ) -> StoreResult<Option<(ConsoleSessionRecord, ApiTokenRecord)>> {
        let row = sqlx::query(
            "SELECT s.id_hash, s.api_token_id, s.csrf_token, s.created_at AS s_created_at, \
             s.expires_at, s.revoked_at AS s_revoked_at, t.id, t.token_hash, t.role, t.team, \
             t.name, t.created_at, t.revoked_at \
             FROM console_sessions s JOIN api_tokens t ON t.id = s.api_token_id \
             WHERE s.id_hash = $1",
        )
        .bind(id_hash)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| {
            let session = ConsoleSessionRecord {
                id_hash: r.try_get("id_hash")?,
                api_token_id: r.try_get("api_token_id")?,
                csrf_token: r.try_get("csrf_token")?,
                created_at: get_ts(&r, "s_created_at")?,
                expires_at: get_ts(&r, "expires_at")?,
                revoked_at: get_ts_opt(&r, "s_revoked_at")?,
            };
            Ok((session, token_from_row(&r, "created_at", "revoked_at")?))
        })
        .transpose()
    }

    async fn revoke_console_session(&self, id_hash: &str, now: Timestamp) -> StoreResult<bool> {
        let done = sqlx::query(
            "UPDATE console_sessions SET revoked_at = $2 \
             WHERE id_hash = $1 AND revoked_at IS NULL",
        )
        .bind(id_hash)
        .bind(tz(now))
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() > 0)
    }

    async fn insert_enrolment_token(&self, token: &EnrolmentTokenRecord) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO enrolment_tokens (token_hash, pool_id, created_at, expires_at, instance_id) \
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(&token.token_hash)
        .bind(token.pool.as_str())
        .bind(tz(token.created_at))
        .bind(tz(token.expires_at))
        .bind(&token.instance)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn check_enrolment_token(
        &self,
        enrolment_hash: &str,
        now: Timestamp,
    ) -> StoreResult<Result<(), RegisterRefusal>> {
        let Some(row) =
            sqlx::query("SELECT used_at, expires_at FROM enrolment_tokens WHERE token_hash = $1")
                .bind(enrolment_hash)
                .fetch_optional(&self.pool)
                .await?
        else {
            return Ok(Err(RegisterRefusal::UnknownToken));
        };
        if get_ts_opt(&row, "used_at")?.is_some() {
            return Ok(Err(RegisterRefusal::AlreadyUsed));
        }
        if get_ts(&row, "expires_at")? < now {
            return Ok(Err(RegisterRefusal::Expired));
        }
        Ok(Ok(()))
    }

    async fn register_node(
        &self,
        enrolment_hash: &str,
        node: NewNode,
        now: Timestamp,
    ) -> StoreResult<Result<NodeRecord, RegisterRefusal>> {
        let mut tx = self.write_tx().await?;
        let Some(row) = sqlx::query("SELECT * FROM enrolment_tokens WHERE token_hash = $1")
            .bind(enrolment_hash)
            .fetch_optional(&mut *tx)
            .await?
        else {
            return Ok(Err(RegisterRefusal::UnknownToken));
        };
        if get_ts_opt(&row, "used_at")?.is_some() {
            return Ok(Err(RegisterRefusal::AlreadyUsed));
        }
        if get_ts(&row, "expires_at")? < now {
            return Ok(Err(RegisterRefusal::Expired));
        }
        // A token minted for a launched instance enrols that instance only while it boots:
        // once the broker gave the instance up (boot timeout, terminated), its token is dead.
        if let Some(instance) = row.try_get::<Option<String>, _>("instance_id")? {
            let booting: Option<String> = sqlx::query_scalar(
                "SELECT id FROM instances WHERE id = $1 AND state IN ('requested', 'booting')",
            )
            .bind(&instance)
            .fetch_optional(&mut *tx)
            .await?;
            if booting.is_none() {
                return Ok(Err(RegisterRefusal::InstanceGone));
            }
        }
        let pool_id: String = row.try_get("pool_id")?;
        let used = sqlx::query(
            "UPDATE enrolment_tokens SET used_at = $1, node_id = $2 \
             WHERE token_hash = $3 AND used_at IS NULL",
        )
        .bind(tz(now))
        .bind(node.id.as_str())
        .bind(enrolment_hash)
        .execute(&mut *tx)
        .await?;
        if used.rows_affected() != 1 {
            return Ok(Err(RegisterRefusal::AlreadyUsed));
        }
        sqlx::query(
            "INSERT INTO nodes (id, pool_id, token_hash, hostname, gpus_total, inventory_json, \
             healthy, registered_at, last_heartbeat) \
             VALUES ($1, $2, $3, $4, $5, $6, TRUE, $7, $7)",
        )
        .bind(node.id.as_str())
        .bind(&pool_id)
        .bind(&node.token_hash)
        .bind(&node.hostname)
        .bind(i64::from(node.gpus_total))
        .bind(&node.inventory_json)
        .bind(tz(now))
        .execute(&mut *tx)
        .await?;
        if let Some(instance) = row.try_get::<Option<String>, _>("instance_id")? {
            sqlx::query(
                // An agent may enrol before the broker heard its launch answered (an answer
                // lost or late): bill it from now at the latest, never not at all.
                "UPDATE instances SET state = 'ready', node_id = $1, ready_at = $2, \
                 idle_since = $2, launched_at = COALESCE(launched_at, $2) \
                 WHERE id = $3 AND state IN ('requested', 'booting')",
            )
            .bind(node.id.as_str())
            .bind(tz(now))
            .bind(&instance)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(Ok(NodeRecord {
            id: node.id,
            pool: PoolId(pool_id),
            hostname: node.hostname,
            gpus_total: node.gpus_total,
            inventory_json: node.inventory_json,
            healthy: true,
            draining: false,
            revoked: false,
            registered_at: now,
            last_heartbeat: now,
        }))
    }

    async fn node_by_token_hash(&self, hash: &str) -> StoreResult<Option<NodeRecord>> {
        let row = sqlx::query("SELECT * FROM nodes WHERE token_hash = $1")
            .bind(hash)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(node_from_row).transpose()
    }

    async fn revoke_node(
        &self,
        node: &NodeId,
        why: &str,
        now: Timestamp,
    ) -> StoreResult<Option<Vec<JobId>>> {
        let mut tx = self.write_tx().await?;
        let marked = sqlx::query(
            "UPDATE nodes SET revoked = TRUE, healthy = FALSE WHERE id = $1 AND NOT revoked",
        )
        .bind(node.as_str())
        .execute(&mut *tx)
        .await?;
        if marked.rows_affected() != 1 {
            return Ok(None);
        }
        let (_, requeued) = end_node_work(&mut tx, node.as_str(), "lost", why, now).await?;
        tx.commit().await?;
        Ok(Some(requeued))
    }

    async fn nodes(&self) -> StoreResult<Vec<NodeRecord>> {
        let rows = sqlx::query("SELECT * FROM nodes WHERE NOT revoked ORDER BY id COLLATE \"C\"")
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(node_from_row).collect()
    }

    async fn heartbeat(
        &self,
        node: &NodeId,
        inventory: &Inventory,
        running: &[AttemptRef],
        now: Timestamp,
    ) -> StoreResult<HeartbeatOutcome> {
        let inventory_json =
            serde_json::to_string(inventory).map_err(|e| corrupt(format!("inventory: {e}")))?;
        // One statement, the node's row lock only (see the module docs: lease expiry locks it
        // too); the subquery reads the row as it was before this update.
        let was_healthy: Option<bool> = sqlx::query_scalar(
            "UPDATE nodes SET last_heartbeat = $1, inventory_json = $2, healthy = TRUE \
             FROM (SELECT healthy AS was FROM nodes WHERE id = $3 FOR UPDATE) AS old \
             WHERE nodes.id = $3 RETURNING old.was",
        )
        .bind(tz(now))
        .bind(&inventory_json)
        .bind(node.as_str())
        .fetch_optional(&self.pool)
        .await?;
        Ok(HeartbeatOutcome {
            came_back: was_healthy == Some(false),
            stop: self.node_stops(node, running).await?,
        })
    }

    async fn record_heartbeats(&self, beats: &[HeartbeatWrite]) -> StoreResult<u64> {
        if beats.is_empty() {
            return Ok(0);
        }
        let mut tx = self.pool.begin().await?;
        let mut written = 0;
        for chunk in beats.chunks(HEARTBEATS_PER_STATEMENT) {
            let ids: Vec<&str> = chunk.iter().map(|b| b.node.as_str()).collect();
            let ats: Vec<Tz> = chunk.iter().map(|b| tz(b.at)).collect();
            let inventories: Vec<&str> = chunk.iter().map(|b| b.inventory_json.as_str()).collect();
            // Row locks in lease expiry's order (ORDER BY id COLLATE "C"), so the two never
            // deadlock; then one UPDATE for the chunk.
            sqlx::query(
                "SELECT id FROM nodes WHERE id = ANY($1) ORDER BY id COLLATE \"C\" FOR UPDATE",
            )
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

    async fn node_stops(
        &self,
        node: &NodeId,
        running: &[AttemptRef],
    ) -> StoreResult<Vec<AttemptRef>> {
        let rows = sqlx::query(NODE_LIVE_ATTEMPTS)
            .bind(node.as_str())
            .fetch_all(&self.pool)
            .await?;
        let live = rows
            .iter()
            .map(|r| {
                Ok((
                    attempt_ref_from_row(r)?,
                    r.try_get::<String, _>("state")?,
                    r.try_get::<bool, _>("cancel_requested")?,
                ))
            })
            .collect::<StoreResult<Vec<_>>>()?;
        Ok(heartbeat_stops(&live, running))
    }

    async fn expire_leases(&self, before: Timestamp, now: Timestamp) -> StoreResult<ExpiredLeases> {
        let mut tx = self.leader_tx().await?;
        // FOR UPDATE: a heartbeat committing meanwhile is re-checked against the condition.
        let lost: Vec<String> = sqlx::query_scalar(
            "SELECT id FROM nodes WHERE healthy AND NOT revoked AND last_heartbeat < $1 \
             ORDER BY id COLLATE \"C\" FOR UPDATE",
        )
        .bind(tz(before))
        .fetch_all(&mut *tx)
        .await?;
        let mut out = ExpiredLeases::default();
        for node in lost {
            sqlx::query("UPDATE nodes SET healthy = FALSE WHERE id = $1")
                .bind(&node)
                .execute(&mut *tx)
                .await?;
            out.requeued.extend(
                end_node_work(
                    &mut tx,
                    &node,
                    "lost",
                    "node lost: no heartbeat within the lease TTL",
                    now,
                )
                .await?
                .1,
            );
            out.nodes.push(NodeId(node));
        }
        tx.commit().await?;
        Ok(out)
    }

    async fn insert_job(&self, job: &NewJob) -> StoreResult<()> {
        // Batched with the submissions arriving meanwhile; answered after its commit.
        self.submits.insert(job).await
    }

    async fn insert_job_idempotent(
        &self,
        job: &NewJob,
        key: &IdempotencyKey,
        since: Timestamp,
    ) -> StoreResult<IdempotentInsert> {
        // Not batched: the key and its job commit together, under the write lock, so two
        // requests with one key cannot both insert.
        let mut tx = self.write_tx().await?;
        sqlx::query("DELETE FROM idempotency_keys WHERE created_at < $1")
            .bind(tz(since))
            .execute(&mut *tx)
            .await?;
        let existing: Option<(Uuid, String)> = sqlx::query_as(
            "SELECT job_id, request_hash FROM idempotency_keys WHERE scope = $1 AND key = $2",
        )
        .bind(&key.scope)
        .bind(&key.key)
        .fetch_optional(&mut *tx)
        .await?;
        if let Some((id, hash)) = existing {
            return Ok(IdempotentInsert::Existing {
                job: JobId(id),
                same_request: hash == key.request_hash,
            });
        }
        let core_spec = serde_json::to_string(&job.spec)
            .map_err(|e| StoreError::Corrupt(format!("spec: {e}")))?;
        sqlx::query(
            "INSERT INTO jobs (id, team, project, name, state, priority, kind, spec_json, \
             core_spec_json, submitted_at, deadline, trace_parent) \
             VALUES ($1, $2, $3, $4, 'queued', $5, $6, $7, $8, $9, $10, $11)",
        )
        .bind(job.id.0)
        .bind(&job.spec.team)
        .bind(&job.spec.project)
        .bind(&job.spec.name)
        .bind(job.spec.priority.as_str())
        .bind(match job.spec.kind {
            switchyard_core::JobKind::Batch => "batch",
            switchyard_core::JobKind::Service => "service",
        })
        .bind(&job.spec_json)
        .bind(&core_spec)
        .bind(tz(job.submitted_at))
        .bind(tz_opt(job.spec.deadline))
        .bind(&job.trace_parent)
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "INSERT INTO idempotency_keys (scope, key, request_hash, job_id, created_at) \
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(&key.scope)
        .bind(&key.key)
        .bind(&key.request_hash)
        .bind(job.id.0)
        .bind(tz(job.submitted_at))
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(IdempotentInsert::Inserted)
    }

    async fn idempotent_job(
        &self,
        key: &IdempotencyKey,
        since: Timestamp,
    ) -> StoreResult<Option<(JobId, bool)>> {
        let row: Option<(Uuid, String)> = sqlx::query_as(
            "SELECT job_id, request_hash FROM idempotency_keys \
             WHERE scope = $1 AND key = $2 AND created_at >= $3",
        )
        .bind(&key.scope)
        .bind(&key.key)
        .bind(tz(since))
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(|(id, hash)| (JobId(id), hash == key.request_hash)))
    }

    async fn job(&self, id: JobId) -> StoreResult<Option<JobRecord>> {
        let row = sqlx::query(SQL_JOB_BY_ID)
            .bind(id.0)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(job_from_row).transpose()
    }

    async fn list_jobs(&self, filter: &JobFilter) -> StoreResult<Vec<JobRecord>> {
        // Only the filters given are in the statement (as on SQLite), so that the planner
        // walks the index that matches them — (team, state, id), (team, id) or (state, id) —
        // newest first; a generic plan for "$1 IS NULL OR …" could not.
        let mut sql = String::from(SQL_LIST_JOBS);
        let mut n = 0;
        let mut cond = |sql: &mut String, c: &str| {
            n += 1;
            sql.push_str(if n == 1 { " WHERE " } else { " AND " });
            sql.push_str(&c.replace('?', &format!("${n}")));
        };
        if filter.team.is_some() {
            cond(&mut sql, "j.team = ?");
        }
        if filter.state.is_some() {
            cond(&mut sql, "j.state = ?");
        }
        if filter.priority.is_some() {
            cond(&mut sql, "j.priority = ?");
        }
        if filter.name.is_some() {
            cond(&mut sql, "j.name = ?");
        }
        if filter.before.is_some() {
            cond(&mut sql, "j.id < ?");
        }
        sql.push_str(&format!(" ORDER BY j.id DESC LIMIT ${}", n + 1));
        // Built from the fixed fragments above only; every value is bound.
        let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
        if let Some(team) = &filter.team {
            q = q.bind(team);
        }
        if let Some(state) = filter.state {
            q = q.bind(state.as_str());
        }
        if let Some(priority) = filter.priority {
            q = q.bind(priority.as_str());
        }
        if let Some(name) = &filter.name {
            q = q.bind(name);
        }
        if let Some(before) = filter.before {
            q = q.bind(before.0);
        }
        let rows = q.bind(filter.limit).fetch_all(&self.pool).await?;
        rows.iter().map(job_from_row).collect()
    }

    async fn queue_depth(&self) -> StoreResult<Vec<(JobState, Priority, i64)>> {
        let rows = sqlx::query(
            "SELECT state, priority, COUNT(*) AS n FROM jobs \
             WHERE state IN ('queued', 'held', 'provisioning', 'placed', 'running') \
             GROUP BY state, priority ORDER BY state COLLATE \"C\", priority COLLATE \"C\"",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok((
                    parse_state(&r.try_get::<String, _>("state")?)?,
                    parse_priority(&r.try_get::<String, _>("priority")?)?,
                    r.try_get::<i64, _>("n")?,
                ))
            })
            .collect()
    }

    async fn cancel_job(&self, id: JobId, now: Timestamp) -> StoreResult<CancelOutcome> {
        let mut tx = self.write_tx().await?;
        let Some(row) = sqlx::query("SELECT state, current_attempt FROM jobs WHERE id = $1")
            .bind(id.0)
            .fetch_optional(&mut *tx)
            .await?
        else {
            return Ok(CancelOutcome::NotFound);
        };
        let state = parse_state(&row.try_get::<String, _>("state")?)?;
        let current: Option<Uuid> = row.try_get("current_attempt")?;
        let outcome = if state.is_terminal() {
            CancelOutcome::AlreadyFinished(state)
        } else if state == JobState::Running {
            let node: Option<String> = match current {
                Some(a) => {
                    sqlx::query_scalar("SELECT node_id FROM attempts WHERE id = $1")
                        .bind(a)
                        .fetch_optional(&mut *tx)
                        .await?
                }
                None => None,
            };
            sqlx::query(
                "UPDATE jobs SET cancel_requested = TRUE, version = version + 1 WHERE id = $1",
            )
            .bind(id.0)
            .execute(&mut *tx)
            .await?;
            match node {
                Some(n) => CancelOutcome::Stopping { node: NodeId(n) },
                None => return Err(corrupt(format!("running job {id} has no attempt"))),
            }
        } else {
            // Waiting, or placed but not yet started: cancelled at once (see SqliteStore).
            if let Some(a) = current {
                sqlx::query(
                    "UPDATE attempts SET state = 'cancelled', finished_at = $1 \
                     WHERE id = $2 AND state = 'assigned'",
                )
                .bind(tz(now))
                .bind(a)
                .execute(&mut *tx)
                .await?;
            }
            sqlx::query(
                "UPDATE jobs SET state = 'cancelled', cancel_requested = TRUE, finished_at = $1, \
                 reason = 'cancelled by user', version = version + 1 WHERE id = $2",
            )
            .bind(tz(now))
            .bind(id.0)
            .execute(&mut *tx)
            .await?;
            CancelOutcome::Cancelled
        };
        tx.commit().await?;
        Ok(outcome)
    }

    async fn set_explanations(&self, rows: &[(JobId, AttemptId, String)]) -> StoreResult<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let mut tx = self.pool.begin().await?;
        for (id, attempt, json) in rows {
            sqlx::query(SET_EXPLANATION)
                .bind(json)
                .bind(id.0)
                .bind(attempt.0)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn set_launch_explanations(&self, rows: &[(String, String)]) -> StoreResult<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let mut tx = self.pool.begin().await?;
        for (instance, json) in rows {
            sqlx::query("UPDATE instances SET launch_explanation_json = $1 WHERE id = $2")
                .bind(json)
                .bind(instance)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn launch_explanation(
        &self,
        job: JobId,
        node: Option<&str>,
    ) -> StoreResult<Option<String>> {
        let text: Option<Option<String>> = sqlx::query_scalar(
            "SELECT launch_explanation_json FROM instances WHERE for_job = $1 \
             AND (($2 IS NOT NULL AND node_id = $2) OR ($2 IS NULL AND state <> 'terminated')) \
             ORDER BY requested_at DESC LIMIT 1",
        )
        .bind(job.0)
        .bind(node)
        .fetch_optional(&self.pool)
        .await?;
        Ok(text.flatten())
    }

    async fn pending_jobs(&self) -> StoreResult<Vec<JobRecord>> {
        let rows = sqlx::query(SQL_PENDING_JOBS).fetch_all(&self.pool).await?;
        rows.iter().map(job_from_row).collect()
    }

    async fn live_attempts(&self) -> StoreResult<Vec<AttemptRecord>> {
        let rows = sqlx::query(
            "SELECT a.id, a.job_id, a.node_id, a.gpus_json, a.created_at, a.state, \
             a.expected_end, j.priority FROM attempts a JOIN jobs j ON j.id = a.job_id \
             WHERE a.state IN ('assigned', 'running', 'preempting') ORDER BY a.id",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(AttemptRecord {
                    id: AttemptId(r.try_get("id")?),
                    job: JobId(r.try_get("job_id")?),
                    node: NodeId(r.try_get("node_id")?),
                    gpus: parse_gpus(&r.try_get::<String, _>("gpus_json")?)?,
                    priority: parse_priority(&r.try_get::<String, _>("priority")?)?,
                    created_at: get_ts(r, "created_at")?,
                    expected_end: get_ts(r, "expected_end")?,
                    stopping: r.try_get::<String, _>("state")? == "preempting",
                })
            })
            .collect()
    }

    async fn commit_plan(
        &self,
        assignments: &[NewAttempt],
        launches: &[NewInstance],
        now: Timestamp,
    ) -> StoreResult<()> {
        let mut tx = self.leader_tx().await?;
        for l in launches {
            let updated = sqlx::query(
                "UPDATE jobs SET state = 'provisioning', version = version + 1, \
                 reason = 'waiting for a new instance in ' || $1 \
                 WHERE id = $2 AND version = $3 AND state IN ('queued', 'held')",
            )
            .bind(l.pool.as_str())
            .bind(l.for_job.0)
            .bind(l.job_version)
            .execute(&mut *tx)
            .await?;
            if updated.rows_affected() != 1 {
                return Err(StoreError::Stale(format!(
                    "job {} changed since planning",
                    l.for_job
                )));
            }
            sqlx::query(
                "INSERT INTO instances (id, provider, pool_id, region_id, market, state, \
                 hourly_price_micros, for_job, requested_at, estimated_cost_micros) \
                 VALUES ($1, $2, $3, $4, $5, 'requested', $6, $7, $8, $9)",
            )
            .bind(&l.id)
            .bind(&l.provider)
            .bind(l.pool.as_str())
            .bind(&l.region)
            .bind(market_str(l.market))
            .bind(l.hourly_price.micros())
            .bind(l.for_job.0)
            .bind(tz(now))
            .bind(l.estimated_cost.micros())
            .execute(&mut *tx)
            .await?;
        }
        for a in assignments {
            let attempt_no: Option<i64> = sqlx::query_scalar(
                "UPDATE jobs SET state = 'placed', attempts = attempts + 1, current_attempt = $1, \
                 explanation_json = NULL, reason = NULL, version = version + 1 \
                 WHERE id = $2 AND version = $3 AND state IN ('queued', 'provisioning', 'held') \
                 RETURNING attempts",
            )
            .bind(a.id.0)
            .bind(a.job.0)
            .bind(a.job_version)
            .fetch_optional(&mut *tx)
            .await?;
            let Some(attempt_no) = attempt_no else {
                return Err(StoreError::Stale(format!(
                    "job {} changed since planning",
                    a.job
                )));
            };
            sqlx::query(
                "INSERT INTO attempts (id, job_id, attempt_no, node_id, pool_id, epoch, gpus_json, \
                 market, state, estimated_cost_micros, expected_end, created_at, \
                 hourly_rate_micros) \
                 VALUES ($1, $2, $3, $4, $5, $3, $6, $7, 'assigned', $8, $9, $10, $11)",
            )
            .bind(a.id.0)
            .bind(a.job.0)
            .bind(attempt_no)
            .bind(a.node.as_str())
            .bind(a.pool.as_str())
            .bind(gpus_json(&a.gpus))
            .bind(market_str(a.market))
            .bind(a.estimated_cost.micros())
            .bind(tz(a.expected_end))
            .bind(tz(now))
            .bind(a.hourly_rate.micros())
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn instances(&self, include_terminated: bool) -> StoreResult<Vec<InstanceRecord>> {
        let rows = sqlx::query(
            "SELECT * FROM instances WHERE ($1 OR state <> 'terminated') \
             ORDER BY requested_at, id COLLATE \"C\"",
        )
        .bind(include_terminated)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(instance_from_row).collect()
    }

    async fn pool_backoffs(&self, now: Timestamp) -> StoreResult<Vec<(PoolId, Timestamp)>> {
        let rows = sqlx::query("SELECT id, backoff_until FROM pools WHERE backoff_until > $1")
            .bind(tz(now))
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| Ok((PoolId(r.try_get("id")?), get_ts(r, "backoff_until")?)))
            .collect()
    }

    async fn instance_launched(
        &self,
        id: &str,
        provider_id: &str,
        now: Timestamp,
    ) -> StoreResult<()> {
        let mut tx = self.leader_tx().await?;
        sqlx::query(
            "UPDATE instances SET state = 'booting', provider_id = $1, launched_at = $2, \
             launch_attempts = launch_attempts + 1, last_error = NULL \
             WHERE id = $3 AND state = 'requested'",
        )
        .bind(provider_id)
        .bind(tz(now))
        .bind(id)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn instance_launch_failed(
        &self,
        id: &str,
        error: &str,
        next: LaunchFailure,
        now: Timestamp,
    ) -> StoreResult<()> {
        let mut tx = self.leader_tx().await?;
        match next {
            LaunchFailure::RetryAt(at) => {
                sqlx::query(
                    "UPDATE instances SET launch_attempts = launch_attempts + 1, last_error = $1, \
                     next_attempt_at = $2 WHERE id = $3 AND state = 'requested'",
                )
                .bind(error)
                .bind(tz(at))
                .bind(id)
                .execute(&mut *tx)
                .await?;
            }
            LaunchFailure::GiveUp { pool_backoff_until } => {
                let row = sqlx::query("SELECT pool_id, for_job FROM instances WHERE id = $1")
                    .bind(id)
                    .fetch_optional(&mut *tx)
                    .await?;
                sqlx::query(
                    "UPDATE instances SET state = 'terminated', \
                     launch_attempts = launch_attempts + 1, last_error = $1, ended_at = $2 \
                     WHERE id = $3 AND state = 'requested'",
                )
                .bind(error)
                .bind(tz(now))
                .bind(id)
                .execute(&mut *tx)
                .await?;
                if let Some(row) = row {
                    let pool: String = row.try_get("pool_id")?;
                    if let Some(until) = pool_backoff_until {
                        sqlx::query(
                            "UPDATE pools SET backoff_until = $1, \
                             recent_capacity_failures = recent_capacity_failures + 1 WHERE id = $2",
                        )
                        .bind(tz(until))
                        .bind(&pool)
                        .execute(&mut *tx)
                        .await?;
                    }
                    if let Some(job) = row.try_get::<Option<Uuid>, _>("for_job")? {
                        requeue_provisioning(
                            &mut tx,
                            job,
                            &format!("launch in {pool} failed: {error}"),
                        )
                        .await?;
                    }
                }
            }
        }
        tx.commit().await?;
        Ok(())
    }

    async fn set_instance_idle(&self, id: &str, idle_since: Option<Timestamp>) -> StoreResult<()> {
        let mut tx = self.leader_tx().await?;
        sqlx::query("UPDATE instances SET idle_since = $1 WHERE id = $2")
            .bind(tz_opt(idle_since))
            .bind(id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn end_instance(
        &self,
        id: &str,
        reason: Option<&str>,
        error: bool,
        min_billed_s: i64,
        now: Timestamp,
    ) -> StoreResult<bool> {
        let mut tx = self.leader_tx().await?;
        let Some(row) = sqlx::query("SELECT * FROM instances WHERE id = $1")
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?
        else {
            return Ok(false);
        };
        let inst = instance_from_row(&row)?;
        if inst.state == InstanceState::Terminated {
            return Ok(false);
        }
        sqlx::query(
            "UPDATE instances SET state = 'terminated', ended_at = $1, \
             end_reason = COALESCE($2, end_reason), \
             last_error = CASE WHEN $4 THEN COALESCE($2, last_error) ELSE last_error END, billed = TRUE WHERE id = $3",
        )
        .bind(tz(now))
        .bind(reason)
        .bind(id)
        .bind(error)
        .execute(&mut *tx)
        .await?;
        // Its cost up to now (at least the minimum billed time), charged to the work on it,
        // before that work is ended below.
        ledger::settle_instance(&mut tx, id, min_billed_s, now).await?;
        if let Some(node) = &inst.node {
            sqlx::query("UPDATE nodes SET healthy = FALSE, revoked = TRUE WHERE id = $1")
                .bind(node.as_str())
                .execute(&mut *tx)
                .await?;
            let why = format!("instance {id} ended: {}", reason.unwrap_or("terminated"));
            end_node_work(&mut tx, node.as_str(), "lost", &why, now).await?;
        }
        if let Some(job) = inst.for_job {
            let why = format!("instance {id} ended before the job was placed");
            requeue_provisioning(&mut tx, job.0, &why).await?;
        }
        tx.commit().await?;
        Ok(true)
    }

    async fn ledger_total(&self) -> StoreResult<i64> {
        let total: Option<i64> =
            sqlx::query_scalar("SELECT SUM(amount_micros)::BIGINT FROM ledger")
                .fetch_one(&self.pool)
                .await?;
        Ok(total.unwrap_or(0))
    }

    async fn accrue_ledger(&self, now: Timestamp, min_billed_s: i64) -> StoreResult<usize> {
        let mut tx = self.leader_tx().await?;
        let written = ledger::accrue_all(&mut tx, now, min_billed_s).await?;
        tx.commit().await?;
        Ok(written)
    }

    async fn spend(&self, query: &SpendQuery) -> StoreResult<Vec<SpendGroupRow>> {
        ledger::spend(&self.pool, query).await
    }

    async fn budget_usage(
        &self,
        team: &str,
        project: Option<&str>,
        from: Timestamp,
        to: Timestamp,
    ) -> StoreResult<BudgetUsage> {
        ledger::budget_usage(&self.pool, team, project, from, to).await
    }

    async fn spend_rates(&self) -> StoreResult<Vec<(String, Money)>> {
        ledger::spend_rates(&self.pool).await
    }

    async fn record_budget_alert(
        &self,
        team: &str,
        project: Option<&str>,
        period_start: Timestamp,
        threshold_ppm: i64,
        now: Timestamp,
    ) -> StoreResult<bool> {
        let done = sqlx::query(
            "INSERT INTO budget_alerts (team, project, period_start, threshold_ppm, at) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
        )
        .bind(team)
        .bind(project.unwrap_or(""))
        .bind(tz(period_start))
        .bind(threshold_ppm)
        .bind(tz(now))
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn ledger_entries(&self, job: Option<JobId>) -> StoreResult<Vec<LedgerEntry>> {
        ledger::ledger_entries(&self.pool, job).await
    }

    async fn set_holds(&self, changes: &[(JobId, Option<String>)]) -> StoreResult<()> {
        let mut tx = self.leader_tx().await?;
        for (job, reason) in changes {
            match reason {
                Some(reason) => sqlx::query(
                    "UPDATE jobs SET state = 'held', reason = $1 \
                     WHERE id = $2 AND state IN ('queued', 'held')",
                )
                .bind(reason)
                .bind(job.0),
                None => sqlx::query(
                    "UPDATE jobs SET state = 'queued', reason = NULL \
                     WHERE id = $1 AND state = 'held'",
                )
                .bind(job.0),
            }
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn preempt_attempts(
        &self,
        victims: &[(AttemptId, String)],
    ) -> StoreResult<Vec<(NodeId, AttemptRef)>> {
        let mut tx = self.leader_tx().await?;
        let mut stopping = Vec::with_capacity(victims.len());
        for (attempt, why) in victims {
            let row = sqlx::query(
                "UPDATE attempts SET state = 'preempting', error = $1 \
                 WHERE id = $2 AND state = 'running' RETURNING id, job_id, epoch, node_id",
            )
            .bind(why)
            .bind(attempt.0)
            .fetch_optional(&mut *tx)
            .await?;
            let Some(row) = row else { continue };
            let victim = attempt_ref_from_row(&row)?;
            sqlx::query("UPDATE jobs SET reason = $1, version = version + 1 WHERE id = $2")
                .bind(why)
                .bind(victim.job_id)
                .execute(&mut *tx)
                .await?;
            stopping.push((NodeId(row.try_get("node_id")?), victim));
        }
        tx.commit().await?;
        Ok(stopping)
    }

    async fn put_policy(
        &self,
        team: &str,
        project: Option<&str>,
        body: &switchyard_protocol::api::PolicyBody,
        expected_version: Option<i64>,
        actor: &str,
        now: Timestamp,
    ) -> StoreResult<Result<PolicyRecord, PolicyConflict>> {
        let body_json = serde_json::to_string(body)
            .map_err(|e| corrupt(format!("policy body not serialisable: {e}")))?;
        let project_key = project.unwrap_or("");
        let mut tx = self.write_tx().await?;
        let current = sqlx::query(
            "SELECT version, body_json FROM policy_versions \
             WHERE team = $1 AND project_key = $2 ORDER BY version DESC LIMIT 1",
        )
        .bind(team)
        .bind(project_key)
        .fetch_optional(&mut *tx)
        .await?;
        let (current_version, before_json) = match &current {
            Some(r) => (
                Some(r.try_get::<i64, _>("version")?),
                Some(r.try_get::<String, _>("body_json")?),
            ),
            None => (None, None),
        };
        if let Some(expected) = expected_version
            && expected != current_version.unwrap_or(0)
        {
            return Ok(Err(PolicyConflict {
                current: current_version,
            }));
        }
        let version = current_version.unwrap_or(0) + 1;
        sqlx::query(
            "INSERT INTO policy_versions (team, project_key, version, body_json, created_at, \
             created_by) VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(team)
        .bind(project_key)
        .bind(version)
        .bind(&body_json)
        .bind(tz(now))
        .bind(actor)
        .execute(&mut *tx)
        .await?;
        insert_audit(
            &mut tx,
            &NewAuditEntry {
                at: now,
                actor: actor.to_string(),
                action: "policy.put".into(),
                target: policy_target(team, project),
                before_json,
                after_json: Some(body_json),
            },
        )
        .await?;
        tx.commit().await?;
        Ok(Ok(PolicyRecord {
            team: team.to_string(),
            project: project.map(str::to_string),
            version,
            body: body.clone(),
            updated_at: now,
            updated_by: actor.to_string(),
        }))
    }

    async fn policy(&self, team: &str, project: Option<&str>) -> StoreResult<Option<PolicyRecord>> {
        let row = sqlx::query(
            "SELECT team, project_key, version, body_json, created_at, created_by \
             FROM policy_versions WHERE team = $1 AND project_key = $2 \
             ORDER BY version DESC LIMIT 1",
        )
        .bind(team)
        .bind(project.unwrap_or(""))
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(policy_from_row).transpose()
    }

    async fn policies(&self) -> StoreResult<Vec<PolicyRecord>> {
        let rows = sqlx::query(
            "SELECT v.team, v.project_key, v.version, v.body_json, v.created_at, v.created_by \
             FROM policy_versions v \
             WHERE v.version = (SELECT MAX(w.version) FROM policy_versions w \
                                WHERE w.team = v.team AND w.project_key = v.project_key) \
             ORDER BY v.team COLLATE \"C\", v.project_key COLLATE \"C\"",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(policy_from_row).collect()
    }

    async fn append_audit(&self, entry: &NewAuditEntry) -> StoreResult<i64> {
        let mut tx = self.write_tx().await?;
        let id = insert_audit(&mut tx, entry).await?;
        tx.commit().await?;
        Ok(id)
    }

    async fn audit(&self, filter: &AuditFilter) -> StoreResult<Vec<AuditRecord>> {
        let rows = sqlx::query(
            "SELECT id, at, actor, action, target, before_json, after_json FROM audit_log \
             WHERE ($1::TEXT IS NULL OR target = $1) AND ($2::BIGINT IS NULL OR id < $2) \
             AND ($4::TEXT IS NULL OR actor = $4 \
             OR substr(actor, 1, length($4::TEXT) + 1) = $4 || ':') AND ($5::TEXT IS NULL OR action = $5) \
             AND ($6::TIMESTAMPTZ IS NULL OR at >= $6) AND ($7::TIMESTAMPTZ IS NULL OR at < $7) \
             ORDER BY id DESC LIMIT $3",
        )
        .bind(&filter.target)
        .bind(filter.before)
        .bind(filter.limit)
        .bind(&filter.actor)
        .bind(&filter.action)
        .bind(filter.from.map(tz))
        .bind(filter.to.map(tz))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(AuditRecord {
                    id: r.try_get("id")?,
                    at: get_ts(r, "at")?,
                    actor: r.try_get("actor")?,
                    action: r.try_get("action")?,
                    target: r.try_get("target")?,
                    before_json: r.try_get("before_json")?,
                    after_json: r.try_get("after_json")?,
                })
            })
            .collect()
    }

    async fn patch_pool(
        &self,
        id: &PoolId,
        change: &PoolChange,
        actor: &str,
        now: Timestamp,
    ) -> StoreResult<Option<(Pool, Pool)>> {
        let mut tx = self.write_tx().await?;
        let Some(row) = sqlx::query(SQL_POOL_BY_ID)
            .bind(id.as_str())
            .fetch_optional(&mut *tx)
            .await?
        else {
            return Ok(None);
        };
        let before = pool_from_row(&row)?;
        sqlx::query(
            "INSERT INTO pool_overrides (pool_id, node_limit, on_demand_micros, launchable, \
             updated_at) VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (pool_id) DO UPDATE SET \
             node_limit = COALESCE(excluded.node_limit, pool_overrides.node_limit), \
             on_demand_micros = COALESCE(excluded.on_demand_micros, pool_overrides.on_demand_micros), \
             launchable = COALESCE(excluded.launchable, pool_overrides.launchable), \
             updated_at = excluded.updated_at",
        )
        .bind(id.as_str())
        .bind(change.node_limit.map(i64::from))
        .bind(change.on_demand_per_hour.map(Money::micros))
        .bind(change.launchable)
        .bind(tz(now))
        .execute(&mut *tx)
        .await?;
        let row = sqlx::query(SQL_POOL_BY_ID)
            .bind(id.as_str())
            .fetch_one(&mut *tx)
            .await?;
        let after = pool_from_row(&row)?;
        let patch_json = |p: &Pool| {
            serde_json::json!({
                "node_limit": p.node_limit,
                "on_demand_per_hour_usd": p.on_demand_per_hour.as_dollars(),
                "price_per_gpu_hour": p.on_demand_per_gpu_hour().as_dollars(),
                "launchable": p.launchable,
            })
            .to_string()
        };
        insert_audit(
            &mut tx,
            &NewAuditEntry {
                at: now,
                actor: actor.to_string(),
                action: "pool.patch".into(),
                target: format!("pool:{id}"),
                before_json: Some(patch_json(&before)),
                after_json: Some(patch_json(&after)),
            },
        )
        .await?;
        tx.commit().await?;
        Ok(Some((before, after)))
    }

    async fn leases_for_node(&self, node: &NodeId) -> StoreResult<Vec<LeaseRecord>> {
        let rows = sqlx::query(
            "SELECT a.id, a.job_id, a.epoch, a.gpus_json, j.core_spec_json, j.trace_parent \
             FROM attempts a \
             JOIN jobs j ON j.id = a.job_id \
             WHERE a.node_id = $1 AND a.state = 'assigned' AND NOT j.cancel_requested \
             ORDER BY a.created_at, a.id",
        )
        .bind(node.as_str())
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(LeaseRecord {
                    attempt: AttemptId(r.try_get("id")?),
                    job: JobId(r.try_get("job_id")?),
                    epoch: epoch_of(r)?,
                    gpus: parse_gpus(&r.try_get::<String, _>("gpus_json")?)?,
                    spec: parse_spec(&r.try_get::<String, _>("core_spec_json")?)?,
                    trace_parent: r.try_get("trace_parent")?,
                })
            })
            .collect()
    }

    async fn job_trace_parent(&self, job: JobId) -> StoreResult<Option<String>> {
        let tp: Option<Option<String>> =
            sqlx::query_scalar("SELECT trace_parent FROM jobs WHERE id = $1")
                .bind(job.0)
                .fetch_optional(&self.pool)
                .await?;
        Ok(tp.flatten())
    }

    async fn stops_for_node(&self, node: &NodeId) -> StoreResult<Vec<AttemptRef>> {
        let rows = sqlx::query(
            "SELECT a.id, a.job_id, a.epoch FROM attempts a JOIN jobs j ON j.id = a.job_id \
             WHERE a.node_id = $1 \
             AND ((a.state = 'running' AND j.cancel_requested) OR a.state = 'preempting')",
        )
        .bind(node.as_str())
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(attempt_ref_from_row).collect()
    }

    async fn interrupt_node(
        &self,
        node: &NodeId,
        why: &str,
        now: Timestamp,
    ) -> StoreResult<NodeInterruption> {
        let mut tx = self.write_tx().await?;
        let marked = sqlx::query("UPDATE nodes SET draining = TRUE WHERE id = $1 AND NOT draining")
            .bind(node.as_str())
            .execute(&mut *tx)
            .await?;
        let instances: Vec<String> = sqlx::query_scalar(
            "SELECT id FROM instances WHERE node_id = $1 AND state IN ('booting', 'ready') \
             ORDER BY id COLLATE \"C\"",
        )
        .bind(node.as_str())
        .fetch_all(&mut *tx)
        .await?;
        for id in &instances {
            sqlx::query("UPDATE instances SET state = 'draining' WHERE id = $1")
                .bind(id)
                .execute(&mut *tx)
                .await?;
        }
        let (stopped, requeued) =
            end_node_work(&mut tx, node.as_str(), "preempted", why, now).await?;
        tx.commit().await?;
        Ok(NodeInterruption {
            newly_draining: marked.rows_affected() == 1,
            stopped,
            requeued,
            instances,
        })
    }

    async fn apply_events(
        &self,
        node: &NodeId,
        events: &[AgentEvent],
        now: Timestamp,
    ) -> StoreResult<(Vec<EventResult>, Vec<EndedAttempt>)> {
        let mut tx = self.write_tx().await?;
        let mut results = Vec::with_capacity(events.len());
        let mut ended = Vec::new();
        for event in events {
            let attempt = match event {
                AgentEvent::Started { attempt, .. }
                | AgentEvent::Log { attempt, .. }
                | AgentEvent::Finished { attempt, .. } => attempt,
            };
            let Ok(epoch) = i64::try_from(attempt.epoch) else {
                results.push(rejected(lease::NOT_A_LEASE));
                continue;
            };
            let row = sqlx::query(
                "SELECT a.state, a.attempt_no, j.cancel_requested FROM attempts a \
                 JOIN jobs j ON j.id = a.job_id \
                 WHERE a.id = $1 AND a.job_id = $2 AND a.node_id = $3 AND a.epoch = $4",
            )
            .bind(attempt.attempt_id)
            .bind(attempt.job_id)
            .bind(node.as_str())
            .bind(epoch)
            .fetch_optional(&mut *tx)
            .await?;
            let (state, attempt_no, cancel_requested) = match &row {
                Some(row) => {
                    let text: String = row.try_get("state")?;
                    let state = AttemptState::parse(&text)
                        .ok_or_else(|| corrupt(format!("bad attempt state {text:?}")))?;
                    (
                        Some(state),
                        row.try_get::<i64, _>("attempt_no")?,
                        row.try_get::<bool, _>("cancel_requested")?,
                    )
                }
                None => (None, 0, false),
            };
            // The lease rule decides (`lease.rs`); this carries its verdict out.
            let result = match (lease::judge(state, event, cancel_requested), event) {
                (Verdict::Reject(why), _) => rejected(why),
                (Verdict::Duplicate, _) => duplicate(),
                (Verdict::Start, _) => {
                    sqlx::query(
                        "UPDATE attempts SET state = 'running', started_at = $1 WHERE id = $2",
                    )
                    .bind(tz(now))
                    .bind(attempt.attempt_id)
                    .execute(&mut *tx)
                    .await?;
                    sqlx::query(
                        "UPDATE jobs SET state = 'running', started_at = $1, \
                         version = version + 1 WHERE id = $2 AND current_attempt = $3",
                    )
                    .bind(tz(now))
                    .bind(attempt.job_id)
                    .bind(attempt.attempt_id)
                    .execute(&mut *tx)
                    .await?;
                    accepted()
                }
                (
                    Verdict::KeepLog,
                    AgentEvent::Log {
                        seq, stream, data, ..
                    },
                ) => {
                    let Ok(seq) = i64::try_from(*seq) else {
                        results.push(rejected("log chunk sequence number out of range"));
                        continue;
                    };
                    let id = attempt.attempt_id;
                    let stored = async |tx: &mut Tx, n: i64| -> StoreResult<bool> {
                        let found: Option<i64> = sqlx::query_scalar(
                            "SELECT seq FROM log_chunks WHERE attempt_id = $1 AND seq = $2",
                        )
                        .bind(id)
                        .bind(n)
                        .fetch_optional(&mut **tx)
                        .await?;
                        Ok(found.is_some())
                    };
                    // Chunks are numbered from 0 without gaps: one that does not follow a
                    // stored one is a retry (already stored) or a broken agent.
                    if seq > 0 && !stored(&mut tx, seq - 1).await? {
                        results.push(if stored(&mut tx, seq).await? {
                            duplicate()
                        } else {
                            rejected("log chunk out of sequence: the one before it was never sent")
                        });
                        continue;
                    }
                    let inserted = sqlx::query(
                        "INSERT INTO log_chunks (job_id, attempt_id, attempt_no, seq, stream, \
                         data, at) VALUES ($1, $2, $3, $4, $5, $6, $7) \
                         ON CONFLICT (attempt_id, seq) DO NOTHING",
                    )
                    .bind(attempt.job_id)
                    .bind(attempt.attempt_id)
                    .bind(attempt_no)
                    .bind(seq)
                    .bind(stream_str(*stream))
                    .bind(data)
                    .bind(tz(now))
                    .execute(&mut *tx)
                    .await?;
                    if inserted.rows_affected() == 1 {
                        accepted()
                    } else {
                        duplicate()
                    }
                }
                (
                    Verdict::Requeue(how),
                    AgentEvent::Finished {
                        exit_code, signal, ..
                    },
                ) => {
                    let job =
                        finish_requeued(&mut tx, attempt, *exit_code, *signal, now, how).await?;
                    ended.push(EndedAttempt {
                        attempt: AttemptId(attempt.attempt_id),
                        job: JobId(attempt.job_id),
                        node: node.clone(),
                        final_state: job,
                    });
                    accepted()
                }
                (
                    Verdict::Finish {
                        state: final_state,
                        reason,
                    },
                    AgentEvent::Finished {
                        exit_code,
                        signal,
                        error,
                        ..
                    },
                ) => {
                    sqlx::query(
                        "UPDATE attempts SET state = 'finished', finished_at = $1, \
                         exit_code = $2, signal = $3, error = $4 WHERE id = $5",
                    )
                    .bind(tz(now))
                    .bind(exit_code.map(i64::from))
                    .bind(signal.map(i64::from))
                    .bind(error)
                    .bind(attempt.attempt_id)
                    .execute(&mut *tx)
                    .await?;
                    let end = ledger::settle_attempt(&mut tx, attempt.attempt_id, now).await?;
                    sqlx::query(
                        "UPDATE jobs SET state = $1, finished_at = $2, exit_code = $3, \
                         reason = $4, version = version + 1 \
                         WHERE id = $5 AND current_attempt = $6",
                    )
                    .bind(final_state.as_str())
                    .bind(tz(end))
                    .bind(exit_code.map(i64::from))
                    .bind(&reason)
                    .bind(attempt.job_id)
                    .bind(attempt.attempt_id)
                    .execute(&mut *tx)
                    .await?;
                    ended.push(EndedAttempt {
                        attempt: AttemptId(attempt.attempt_id),
                        job: JobId(attempt.job_id),
                        node: node.clone(),
                        final_state,
                    });
                    accepted()
                }
                // The rule gives these verdicts only for these reports.
                (Verdict::KeepLog | Verdict::Finish { .. } | Verdict::Requeue(_), _) => {
                    rejected("the report does not fit its verdict")
                }
            };
            results.push(result);
        }
        tx.commit().await?;
        Ok((results, ended))
    }

    async fn logs(&self, job: JobId, after: i64, limit: i64) -> StoreResult<Vec<LogRecord>> {
        let rows = sqlx::query(
            "SELECT id, attempt_no, stream, data, at FROM log_chunks \
             WHERE job_id = $1 AND id > $2 ORDER BY id LIMIT $3",
        )
        .bind(job.0)
        .bind(after)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(LogRecord {
                    offset: r.try_get("id")?,
                    attempt_no: u32_of(r.try_get("attempt_no")?, "attempt_no")?,
                    stream: r.try_get("stream")?,
                    data: r.try_get("data")?,
                    at: get_ts(r, "at")?,
                })
            })
            .collect()
    }
}

/// Appends one audit row inside a caller's transaction; returns its id.
async fn insert_audit(tx: &mut Tx, e: &NewAuditEntry) -> StoreResult<i64> {
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO audit_log (at, actor, action, target, before_json, after_json) \
         VALUES ($1, $2, $3, $4, $5, $6) RETURNING id",
    )
    .bind(tz(e.at))
    .bind(&e.actor)
    .bind(&e.action)
    .bind(&e.target)
    .bind(&e.before_json)
    .bind(&e.after_json)
    .fetch_one(&mut **tx)
    .await?;
    Ok(id)
}

/// Ends a node's live attempts in `attempt_state` and sends their jobs back to the queue (or
/// to `cancelled` when a cancel was pending); as in the SQLite store.
async fn end_node_work(
    tx: &mut Tx,
    node: &str,
    attempt_state: &'static str,
    why: &str,
    now: Timestamp,
) -> StoreResult<(Vec<AttemptRef>, Vec<JobId>)> {
    let rows = sqlx::query(
        "SELECT id, job_id, epoch FROM attempts \
         WHERE node_id = $1 AND state IN ('assigned', 'running', 'preempting') \
         ORDER BY created_at, id",
    )
    .bind(node)
    .fetch_all(&mut **tx)
    .await?;
    let mut stopped = Vec::with_capacity(rows.len());
    let mut requeued = Vec::with_capacity(rows.len());
    for row in &rows {
        let attempt = attempt_ref_from_row(row)?;
        sqlx::query("UPDATE attempts SET state = $1, finished_at = $2, error = $3 WHERE id = $4")
            .bind(attempt_state)
            .bind(tz(now))
            .bind(why)
            .bind(attempt.attempt_id)
            .execute(&mut **tx)
            .await?;
        let end = ledger::settle_attempt(tx, attempt.attempt_id, now).await?;
        sqlx::query(
            "UPDATE jobs SET state = CASE WHEN cancel_requested THEN 'cancelled' \
             ELSE 'queued' END, \
             finished_at = CASE WHEN cancel_requested THEN $1 ELSE NULL END, \
             reason = $2, version = version + 1 \
             WHERE id = $3 AND current_attempt = $4 AND state IN ('placed', 'running')",
        )
        .bind(tz(end))
        .bind(format!("{why}: requeued"))
        .bind(attempt.job_id)
        .bind(attempt.attempt_id)
        .execute(&mut **tx)
        .await?;
        requeued.push(JobId(attempt.job_id));
        stopped.push(attempt);
    }
    Ok((stopped, requeued))
}

/// The end of an attempt that puts its job back in the queue (or `cancelled`): stopped for a
/// preemption, or by its agent's self-fencing ([`Requeue`]). Returns the job's new state.
async fn finish_requeued(
    tx: &mut Tx,
    attempt: &AttemptRef,
    exit_code: Option<i32>,
    signal: Option<i32>,
    now: Timestamp,
    how: Requeue<'_>,
) -> StoreResult<JobState> {
    let (attempt_state, error, reason) = how.parts();
    sqlx::query(
        "UPDATE attempts SET state = $5, finished_at = $1, exit_code = $2, signal = $3, \
         error = COALESCE($6, error) WHERE id = $4",
    )
    .bind(tz(now))
    .bind(exit_code.map(i64::from))
    .bind(signal.map(i64::from))
    .bind(attempt.attempt_id)
    .bind(attempt_state.as_str())
    .bind(error)
    .execute(&mut **tx)
    .await?;
    let end = ledger::settle_attempt(tx, attempt.attempt_id, now).await?;
    let cancelled: Option<bool> = sqlx::query_scalar(
        "UPDATE jobs SET state = CASE WHEN cancel_requested THEN 'cancelled' \
         ELSE 'queued' END, \
         finished_at = CASE WHEN cancel_requested THEN $1 ELSE NULL END, \
         reason = CASE WHEN cancel_requested THEN 'cancelled by user' ELSE COALESCE($4, reason) END, \
         version = version + 1 \
         WHERE id = $2 AND current_attempt = $3 AND state IN ('placed', 'running') \
         RETURNING cancel_requested",
    )
    .bind(tz(end))
    .bind(attempt.job_id)
    .bind(attempt.attempt_id)
    .bind(reason)
    .fetch_optional(&mut **tx)
    .await?;
    Ok(match cancelled {
        Some(true) => JobState::Cancelled,
        _ => JobState::Queued,
    })
}

/// A job waiting for an instance that will not come goes back to the queue.
async fn requeue_provisioning(tx: &mut Tx, job: Uuid, why: &str) -> StoreResult<()> {
    sqlx::query(
        "UPDATE jobs SET state = 'queued', reason = $1, version = version + 1 \
         WHERE id = $2 AND state = 'provisioning'",
    )
    .bind(why)
    .bind(job)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

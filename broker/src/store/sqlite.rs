//! The SQLite store: one WAL-mode file in the data directory, migrations from
//! `migrations/sqlite` embedded in the binary and run at start.
//!
//! SQL uses `$N` placeholders, which SQLite and PostgreSQL both accept, so the PostgreSQL store
//! can share most statement text.

use super::*;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteRow, SqliteSynchronous,
};
use sqlx::{Row, SqlitePool};
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;
use switchyard_core::{
    AttemptId, JobSpec, JobState, Market, Money, NodeId, PoolId, Priority, RegionId,
};
use switchyard_protocol::agent::{EventStatus, Stream};
use switchyard_protocol::api::Role;
use uuid::Uuid;

mod ledger;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/sqlite");

#[derive(Clone, Debug)]
pub struct SqliteStore {
    pool: SqlitePool,
    fence: Fence,
}

impl SqliteStore {
    /// Opens (creating if needed) the database file and runs migrations.
    pub async fn open(path: &Path) -> StoreResult<SqliteStore> {
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(10))
            .foreign_keys(true);
        owner_only(options.get_filename())?;
        Self::connect(options).await
    }

    /// Opens a `sqlite:` URL (e.g. `sqlite://path/to/file.db`).
    pub async fn open_url(url: &str) -> StoreResult<SqliteStore> {
        let options = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(10))
            .foreign_keys(true);
        owner_only(options.get_filename())?;
        Self::connect(options).await
    }

    /// Every transaction here writes, so it takes the write lock up front (`BEGIN IMMEDIATE`):
    /// a deferred transaction that reads first and writes later fails with SQLITE_BUSY when
    /// another writer committed in between, and the busy timeout cannot help it.
    async fn write_tx(&self) -> StoreResult<sqlx::Transaction<'static, sqlx::Sqlite>> {
        Ok(self.pool.begin_with("BEGIN IMMEDIATE").await?)
    }

    /// A write transaction for the leader's writes: fails with [`StoreError::Fenced`] unless
    /// the lease is still at the epoch this replica leads under (see [`Fence`]).
    async fn leader_tx(&self) -> StoreResult<sqlx::Transaction<'static, sqlx::Sqlite>> {
        let mut tx = self.write_tx().await?;
        if self.fence.get().is_some() {
            let current: Option<i64> = sqlx::query_scalar(LEASE_EPOCH)
                .fetch_optional(&mut *tx)
                .await?;
            self.fence.check(current)?;
        }
        Ok(tx)
    }

    async fn connect(options: SqliteConnectOptions) -> StoreResult<SqliteStore> {
        let pool = SqlitePoolOptions::new()
            .max_connections(8)
            .connect_with(options)
            .await?;
        MIGRATOR.run(&pool).await?;
        Ok(SqliteStore {
            pool,
            fence: Fence::off(),
        })
    }
}

fn leader_of_row(r: &sqlx::sqlite::SqliteRow) -> StoreResult<LeaderRecord> {
    Ok(LeaderRecord {
        holder: r.try_get("holder")?,
        holder_instance: parse_uuid(&r.try_get::<String, _>("holder_instance")?)?,
        epoch: r.try_get("epoch")?,
        acquired_at: Timestamp(r.try_get("acquired_at")?),
        expires_at: Timestamp(r.try_get("expires_at")?),
    })
}

pub(crate) fn corrupt(what: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(what.to_string())
}

fn api_token_from_row(r: &SqliteRow) -> StoreResult<ApiTokenRecord> {
    Ok(ApiTokenRecord {
        id: parse_uuid(&r.try_get::<String, _>("id")?)?,
        token_hash: r.try_get("token_hash")?,
        role: parse_role(&r.try_get::<String, _>("role")?)?,
        team: r.try_get("team")?,
        name: r.try_get("name")?,
        created_at: Timestamp(r.try_get("created_at")?),
        revoked: r.try_get::<Option<i64>, _>("revoked_at")?.is_some(),
    })
}

fn parse_uuid(s: &str) -> StoreResult<Uuid> {
    Uuid::parse_str(s).map_err(|e| corrupt(format!("bad uuid {s:?}: {e}")))
}

pub(crate) fn u32_of(v: i64, what: &str) -> StoreResult<u32> {
    u32::try_from(v).map_err(|_| corrupt(format!("{what} out of range: {v}")))
}

pub(crate) fn market_str(m: Market) -> &'static str {
    match m {
        Market::OnDemand => "on_demand",
        Market::Spot => "spot",
    }
}

pub(crate) fn parse_market(s: &str) -> StoreResult<Market> {
    match s {
        "on_demand" => Ok(Market::OnDemand),
        "spot" => Ok(Market::Spot),
        other => Err(corrupt(format!("bad market {other:?}"))),
    }
}

pub fn role_name(r: Role) -> &'static str {
    match r {
        Role::Admin => "admin",
        Role::Finance => "finance",
        Role::Infra => "infra",
        Role::Developer => "developer",
    }
}

pub(crate) fn parse_role(s: &str) -> StoreResult<Role> {
    Ok(match s {
        "admin" => Role::Admin,
        "finance" => Role::Finance,
        "infra" => Role::Infra,
        "developer" => Role::Developer,
        other => return Err(corrupt(format!("bad role {other:?}"))),
    })
}

pub(crate) fn parse_state(s: &str) -> StoreResult<JobState> {
    JobState::parse(s).ok_or_else(|| corrupt(format!("bad job state {s:?}")))
}

pub(crate) fn gpus_json(gpus: &[u32]) -> String {
    serde_json::to_string(gpus).unwrap_or_else(|_| "[]".into())
}

pub(crate) fn parse_gpus(s: &str) -> StoreResult<Vec<u32>> {
    serde_json::from_str(s).map_err(|e| corrupt(format!("bad gpus {s:?}: {e}")))
}

pub(crate) fn parse_spec(s: &str) -> StoreResult<JobSpec> {
    serde_json::from_str(s).map_err(|e| corrupt(format!("bad job spec: {e}")))
}

fn region_from_row(r: &SqliteRow) -> StoreResult<Region> {
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

fn pool_from_row(r: &SqliteRow) -> StoreResult<Pool> {
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
        price_updated_at: Timestamp(r.try_get("price_updated_at")?),
        recent_capacity_failures: u32_of(
            r.try_get("recent_capacity_failures")?,
            "recent_capacity_failures",
        )?,
    })
}

fn node_from_row(r: &SqliteRow) -> StoreResult<NodeRecord> {
    Ok(NodeRecord {
        id: NodeId(r.try_get("id")?),
        pool: PoolId(r.try_get("pool_id")?),
        hostname: r.try_get("hostname")?,
        gpus_total: u32_of(r.try_get("gpus_total")?, "gpus_total")?,
        inventory_json: r.try_get("inventory_json")?,
        healthy: r.try_get("healthy")?,
        draining: r.try_get("draining")?,
        revoked: r.try_get("revoked")?,
        registered_at: Timestamp(r.try_get("registered_at")?),
        last_heartbeat: Timestamp(r.try_get("last_heartbeat")?),
    })
}

fn job_from_row(r: &SqliteRow) -> StoreResult<JobRecord> {
    let placement = match r.try_get::<Option<String>, _>("a_id")? {
        None => None,
        Some(a_id) => Some(AttemptPlacement {
            attempt: AttemptId(parse_uuid(&a_id)?),
            node: NodeId(r.try_get("a_node")?),
            pool: PoolId(r.try_get("a_pool")?),
            region: r
                .try_get::<Option<String>, _>("a_region")?
                .unwrap_or_default(),
            gpus: parse_gpus(&r.try_get::<String, _>("a_gpus")?)?,
            market: parse_market(&r.try_get::<String, _>("a_market")?)?,
        }),
    };
    Ok(JobRecord {
        id: JobId(parse_uuid(&r.try_get::<String, _>("id")?)?),
        spec: parse_spec(&r.try_get::<String, _>("core_spec_json")?)?,
        spec_json: r.try_get("spec_json")?,
        state: parse_state(&r.try_get::<String, _>("state")?)?,
        submitted_at: Timestamp(r.try_get("submitted_at")?),
        started_at: r.try_get::<Option<i64>, _>("started_at")?.map(Timestamp),
        finished_at: r.try_get::<Option<i64>, _>("finished_at")?.map(Timestamp),
        exit_code: r.try_get::<Option<i64>, _>("exit_code")?.map(|c| c as i32),
        reason: r.try_get("reason")?,
        cancel_requested: r.try_get("cancel_requested")?,
        attempts: u32_of(r.try_get("attempts")?, "attempts")?,
        version: r.try_get("version")?,
        explanation_json: r.try_get("explanation_json")?,
        placement,
        cost: Money(r.try_get::<Option<i64>, _>("cost_micros")?.unwrap_or(0)),
    })
}

pub(crate) fn parse_priority(s: &str) -> StoreResult<Priority> {
    Priority::parse(s).ok_or_else(|| corrupt(format!("bad priority {s:?}")))
}

#[async_trait]
impl Store for SqliteStore {
    fn fence(&self) -> &Fence {
        &self.fence
    }

    async fn acquire_leadership(
        &self,
        replica: &str,
        instance: Uuid,
        ttl_ms: i64,
        now: Timestamp,
    ) -> StoreResult<Option<i64>> {
        let mut tx = self.write_tx().await?;
        let row = sqlx::query(LEASE_SELECT)
            .fetch_optional(&mut *tx)
            .await?
            .map(|r| leader_of_row(&r))
            .transpose()?;
        let expires = now.millis().saturating_add(ttl_ms);
        let Some((epoch, renew)) = lease_claim(row.as_ref(), replica, instance, now) else {
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
                .bind(instance.to_string())
                .bind(epoch)
                .bind(now.millis())
                .bind(expires)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(Some(epoch))
    }

    async fn resign_leadership(&self, instance: Uuid) -> StoreResult<()> {
        let mut tx = self.write_tx().await?;
        sqlx::query("UPDATE leader_lease SET expires_at = 0 WHERE id = 1 AND holder_instance = $1")
            .bind(instance.to_string())
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
        .bind(pool.price_updated_at.millis())
        .bind(i64::from(pool.recent_capacity_failures))
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn regions(&self) -> StoreResult<Vec<Region>> {
        let rows = sqlx::query("SELECT * FROM regions ORDER BY id")
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
        .bind(token.id.to_string())
        .bind(&token.token_hash)
        .bind(role_name(token.role))
        .bind(&token.team)
        .bind(&token.name)
        .bind(token.created_at.millis())
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn api_token_by_hash(&self, hash: &str) -> StoreResult<Option<ApiTokenRecord>> {
        let row = sqlx::query("SELECT * FROM api_tokens WHERE token_hash = $1")
            .bind(hash)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(api_token_from_row).transpose()
    }

    async fn api_tokens(&self) -> StoreResult<Vec<ApiTokenRecord>> {
        let rows = sqlx::query("SELECT * FROM api_tokens ORDER BY created_at, id")
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(api_token_from_row).collect()
    }

    async fn revoke_api_token(
        &self,
        id: Uuid,
        now: Timestamp,
    ) -> StoreResult<Option<ApiTokenRecord>> {
        let mut tx = self.write_tx().await?;
        let Some(row) = sqlx::query("SELECT * FROM api_tokens WHERE id = $1")
            .bind(id.to_string())
            .fetch_optional(&mut *tx)
            .await?
        else {
            return Ok(None);
        };
        let before = api_token_from_row(&row)?;
        sqlx::query("UPDATE api_tokens SET revoked_at = $2 WHERE id = $1 AND revoked_at IS NULL")
            .bind(id.to_string())
            .bind(now.millis())
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "UPDATE console_sessions SET revoked_at = $2 \
             WHERE api_token_id = $1 AND revoked_at IS NULL",
        )
        .bind(id.to_string())
        .bind(now.millis())
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
        .bind(session.api_token_id.to_string())
        .bind(&session.csrf_token)
        .bind(session.created_at.millis())
        .bind(session.expires_at.millis())
        .bind(session.revoked_at.map(|t| t.millis()))
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
                api_token_id: parse_uuid(&r.try_get::<String, _>("api_token_id")?)?,
                csrf_token: r.try_get("csrf_token")?,
                created_at: Timestamp(r.try_get("s_created_at")?),
                expires_at: Timestamp(r.try_get("expires_at")?),
                revoked_at: r.try_get::<Option<i64>, _>("s_revoked_at")?.map(Timestamp),
            };
            let token = ApiTokenRecord {
                id: parse_uuid(&r.try_get::<String, _>("id")?)?,
                token_hash: r.try_get("token_hash")?,
                role: parse_role(&r.try_get::<String, _>("role")?)?,
                team: r.try_get("team")?,
                name: r.try_get("name")?,
                created_at: Timestamp(r.try_get("created_at")?),
                revoked: r.try_get::<Option<i64>, _>("revoked_at")?.is_some(),
            };
            Ok((session, token))
        })
        .transpose()
    }

    async fn revoke_console_session(&self, id_hash: &str, now: Timestamp) -> StoreResult<bool> {
        let done = sqlx::query(
            "UPDATE console_sessions SET revoked_at = $2 \
             WHERE id_hash = $1 AND revoked_at IS NULL",
        )
        .bind(id_hash)
        .bind(now.millis())
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
        .bind(token.created_at.millis())
        .bind(token.expires_at.millis())
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
        let row: Option<(Option<i64>, i64)> = sqlx::query_as(
            "SELECT used_at, expires_at FROM enrolment_tokens WHERE token_hash = $1",
        )
        .bind(enrolment_hash)
        .fetch_optional(&self.pool)
        .await?;
        Ok(match row {
            None => Err(RegisterRefusal::UnknownToken),
            Some((Some(_), _)) => Err(RegisterRefusal::AlreadyUsed),
            Some((None, expires)) if expires < now.millis() => Err(RegisterRefusal::Expired),
            Some(_) => Ok(()),
        })
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
        if row.try_get::<Option<i64>, _>("used_at")?.is_some() {
            return Ok(Err(RegisterRefusal::AlreadyUsed));
        }
        if row.try_get::<i64, _>("expires_at")? < now.millis() {
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
        .bind(now.millis())
        .bind(node.id.as_str())
        .bind(enrolment_hash)
        .execute(&mut *tx)
        .await?;
        if used.rows_affected() != 1 {
            return Ok(Err(RegisterRefusal::AlreadyUsed));
        }
        sqlx::query(
            "INSERT INTO nodes (id, pool_id, token_hash, hostname, gpus_total, inventory_json, \
             healthy, registered_at, last_heartbeat) VALUES ($1, $2, $3, $4, $5, $6, 1, $7, $7)",
        )
        .bind(node.id.as_str())
        .bind(&pool_id)
        .bind(&node.token_hash)
        .bind(&node.hostname)
        .bind(i64::from(node.gpus_total))
        .bind(&node.inventory_json)
        .bind(now.millis())
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
            .bind(now.millis())
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
        let marked =
            sqlx::query("UPDATE nodes SET revoked = 1, healthy = 0 WHERE id = $1 AND revoked = 0")
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
        let rows = sqlx::query("SELECT * FROM nodes WHERE revoked = 0 ORDER BY id")
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
        let mut tx = self.write_tx().await?;
        let was_healthy: Option<bool> =
            sqlx::query_scalar("SELECT healthy FROM nodes WHERE id = $1")
                .bind(node.as_str())
                .fetch_optional(&mut *tx)
                .await?;
        sqlx::query(
            "UPDATE nodes SET last_heartbeat = $1, inventory_json = $2, healthy = 1 WHERE id = $3",
        )
        .bind(now.millis())
        .bind(&inventory_json)
        .bind(node.as_str())
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(HeartbeatOutcome {
            came_back: was_healthy == Some(false),
            stop: self.node_stops(node, running).await?,
        })
    }

    async fn record_heartbeats(&self, beats: &[HeartbeatWrite]) -> StoreResult<u64> {
        if beats.is_empty() {
            return Ok(0);
        }
        let mut tx = self.write_tx().await?;
        let mut written = 0;
        for chunk in beats.chunks(HEARTBEATS_PER_STATEMENT) {
            let values = vec!["(?, ?, ?)"; chunk.len()].join(", ");
            let sql = format!(
                "WITH v(id, at, inventory) AS (VALUES {values}) \
                 UPDATE nodes SET last_heartbeat = v.at, inventory_json = v.inventory \
                 FROM v WHERE nodes.id = v.id AND nodes.healthy = 1 \
                 AND v.at >= nodes.last_heartbeat"
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
        let lost: Vec<String> = sqlx::query_scalar(
            "SELECT id FROM nodes WHERE healthy = 1 AND revoked = 0 AND last_heartbeat < $1",
        )
        .bind(before.millis())
        .fetch_all(&mut *tx)
        .await?;
        let mut out = ExpiredLeases::default();
        for node in lost {
            sqlx::query("UPDATE nodes SET healthy = 0 WHERE id = $1")
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
        insert_job_row(&self.pool, job).await
    }

    async fn insert_job_idempotent(
        &self,
        job: &NewJob,
        key: &IdempotencyKey,
        since: Timestamp,
    ) -> StoreResult<IdempotentInsert> {
        let mut tx = self.write_tx().await?;
        sqlx::query("DELETE FROM idempotency_keys WHERE created_at < $1")
            .bind(since.millis())
            .execute(&mut *tx)
            .await?;
        let existing: Option<(String, String)> = sqlx::query_as(
            "SELECT job_id, request_hash FROM idempotency_keys WHERE scope = $1 AND key = $2",
        )
        .bind(&key.scope)
        .bind(&key.key)
        .fetch_optional(&mut *tx)
        .await?;
        if let Some((id, hash)) = existing {
            return Ok(IdempotentInsert::Existing {
                job: JobId(parse_uuid(&id)?),
                same_request: hash == key.request_hash,
            });
        }
        insert_job_row(&mut *tx, job).await?;
        sqlx::query(
            "INSERT INTO idempotency_keys (scope, key, request_hash, job_id, created_at) \
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(&key.scope)
        .bind(&key.key)
        .bind(&key.request_hash)
        .bind(job.id.to_string())
        .bind(job.submitted_at.millis())
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
        let row: Option<(String, String)> = sqlx::query_as(
            "SELECT job_id, request_hash FROM idempotency_keys \
             WHERE scope = $1 AND key = $2 AND created_at >= $3",
        )
        .bind(&key.scope)
        .bind(&key.key)
        .bind(since.millis())
        .fetch_optional(&self.pool)
        .await?;
        row.map(|(id, hash)| Ok((JobId(parse_uuid(&id)?), hash == key.request_hash)))
            .transpose()
    }

    async fn job(&self, id: JobId) -> StoreResult<Option<JobRecord>> {
        let sql = sql_job_by_id();
        let row = sqlx::query(sql)
            .bind(id.to_string())
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(job_from_row).transpose()
    }

    async fn list_jobs(&self, filter: &JobFilter) -> StoreResult<Vec<JobRecord>> {
        // Only the filters given are in the statement, so that SQLite walks the index that
        // matches them — (team, state, id), (team, id) or (state, id) — newest first, instead
        // of the whole table ("$1 IS NULL OR …" hides every index from the planner).
        let mut sql = String::from(sql_list_jobs());
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
            q = q.bind(before.to_string());
        }
        let rows = q.bind(filter.limit).fetch_all(&self.pool).await?;
        rows.iter().map(job_from_row).collect()
    }

    async fn queue_depth(&self) -> StoreResult<Vec<(JobState, Priority, i64)>> {
        // Through the state index: only unfinished jobs are read, however long the history.
        let rows = sqlx::query(
            "SELECT state, priority, COUNT(*) AS n FROM jobs \
             WHERE state IN ('queued', 'held', 'provisioning', 'placed', 'running') \
             GROUP BY state, priority ORDER BY state, priority",
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
            .bind(id.to_string())
            .fetch_optional(&mut *tx)
            .await?
        else {
            return Ok(CancelOutcome::NotFound);
        };
        let state = parse_state(&row.try_get::<String, _>("state")?)?;
        let current: Option<String> = row.try_get("current_attempt")?;
        let outcome = if state.is_terminal() {
            CancelOutcome::AlreadyFinished(state)
        } else if state == JobState::Running {
            let node: Option<String> = match &current {
                Some(a) => {
                    sqlx::query_scalar("SELECT node_id FROM attempts WHERE id = $1")
                        .bind(a)
                        .fetch_optional(&mut *tx)
                        .await?
                }
                None => None,
            };
            sqlx::query(
                "UPDATE jobs SET cancel_requested = 1, version = version + 1 WHERE id = $1",
            )
            .bind(id.to_string())
            .execute(&mut *tx)
            .await?;
            match node {
                Some(n) => CancelOutcome::Stopping { node: NodeId(n) },
                None => return Err(corrupt(format!("running job {id} has no attempt"))),
            }
        } else {
            // Waiting, or placed but not yet started: nothing runs, cancel at once. A lease
            // delivered but not yet started is withdrawn; if the agent starts it anyway, its
            // report is rejected and it stops.
            if let Some(a) = &current {
                sqlx::query(
                    "UPDATE attempts SET state = 'cancelled', finished_at = $1 \
                     WHERE id = $2 AND state = 'assigned'",
                )
                .bind(now.millis())
                .bind(a)
                .execute(&mut *tx)
                .await?;
            }
            sqlx::query(
                "UPDATE jobs SET state = 'cancelled', cancel_requested = 1, finished_at = $1, \
                 reason = 'cancelled by user', version = version + 1 WHERE id = $2",
            )
            .bind(now.millis())
            .bind(id.to_string())
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
                .bind(id.to_string())
                .bind(attempt.to_string())
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
        .bind(job.to_string())
        .bind(node)
        .fetch_optional(&self.pool)
        .await?;
        Ok(text.flatten())
    }

    async fn pending_jobs(&self) -> StoreResult<Vec<JobRecord>> {
        let rows = sqlx::query(sql_pending_jobs())
            .fetch_all(&self.pool)
            .await?;
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
                let priority: String = r.try_get("priority")?;
                Ok(AttemptRecord {
                    id: AttemptId(parse_uuid(&r.try_get::<String, _>("id")?)?),
                    job: JobId(parse_uuid(&r.try_get::<String, _>("job_id")?)?),
                    node: NodeId(r.try_get("node_id")?),
                    gpus: parse_gpus(&r.try_get::<String, _>("gpus_json")?)?,
                    priority: parse_priority(&priority)?,
                    created_at: Timestamp(r.try_get("created_at")?),
                    expected_end: Timestamp(r.try_get("expected_end")?),
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
            .bind(l.for_job.to_string())
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
            .bind(l.for_job.to_string())
            .bind(now.millis())
            .bind(l.estimated_cost.micros())
            .execute(&mut *tx)
            .await?;
        }
        for a in assignments {
            let updated = sqlx::query(
                "UPDATE jobs SET state = 'placed', attempts = attempts + 1, current_attempt = $1, \
                 explanation_json = NULL, reason = NULL, version = version + 1 \
                 WHERE id = $2 AND version = $3 AND state IN ('queued', 'provisioning', 'held')",
            )
            .bind(a.id.to_string())
            .bind(a.job.to_string())
            .bind(a.job_version)
            .execute(&mut *tx)
            .await?;
            if updated.rows_affected() != 1 {
                return Err(StoreError::Stale(format!(
                    "job {} changed since planning",
                    a.job
                )));
            }
            let attempt_no: i64 = sqlx::query_scalar("SELECT attempts FROM jobs WHERE id = $1")
                .bind(a.job.to_string())
                .fetch_one(&mut *tx)
                .await?;
            sqlx::query(
                "INSERT INTO attempts (id, job_id, attempt_no, node_id, pool_id, epoch, gpus_json, \
                 market, state, estimated_cost_micros, expected_end, created_at, \
                 hourly_rate_micros) \
                 VALUES ($1, $2, $3, $4, $5, $3, $6, $7, 'assigned', $8, $9, $10, $11)",
            )
            .bind(a.id.to_string())
            .bind(a.job.to_string())
            .bind(attempt_no)
            .bind(a.node.as_str())
            .bind(a.pool.as_str())
            .bind(gpus_json(&a.gpus))
            .bind(market_str(a.market))
            .bind(a.estimated_cost.micros())
            .bind(a.expected_end.millis())
            .bind(now.millis())
            .bind(a.hourly_rate.micros())
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
            .bind(attempt.to_string())
            .fetch_optional(&mut *tx)
            .await?;
            let Some(row) = row else { continue };
            let victim = attempt_ref_from_row(&row)?;
            sqlx::query("UPDATE jobs SET reason = $1, version = version + 1 WHERE id = $2")
                .bind(why)
                .bind(victim.job_id.to_string())
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
        .bind(now.millis())
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
             ORDER BY v.team, v.project_key",
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
             WHERE ($1 IS NULL OR target = $1) AND ($2 IS NULL OR id < $2) \
             AND ($4 IS NULL OR actor = $4 \
             OR substr(actor, 1, length($4) + 1) = $4 || ':') AND ($5 IS NULL OR action = $5) \
             AND ($6 IS NULL OR at >= $6) AND ($7 IS NULL OR at < $7) \
             ORDER BY id DESC LIMIT $3",
        )
        .bind(&filter.target)
        .bind(filter.before)
        .bind(filter.limit)
        .bind(&filter.actor)
        .bind(&filter.action)
        .bind(filter.from.map(Timestamp::millis))
        .bind(filter.to.map(Timestamp::millis))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(AuditRecord {
                    id: r.try_get("id")?,
                    at: Timestamp(r.try_get("at")?),
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
        .bind(now.millis())
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
             WHERE a.node_id = $1 AND a.state = 'assigned' AND j.cancel_requested = 0 \
             ORDER BY a.created_at, a.id",
        )
        .bind(node.as_str())
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(LeaseRecord {
                    attempt: AttemptId(parse_uuid(&r.try_get::<String, _>("id")?)?),
                    job: JobId(parse_uuid(&r.try_get::<String, _>("job_id")?)?),
                    epoch: r.try_get::<i64, _>("epoch")? as u64,
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
                .bind(job.to_string())
                .fetch_optional(&self.pool)
                .await?;
        Ok(tp.flatten())
    }

    async fn stops_for_node(&self, node: &NodeId) -> StoreResult<Vec<AttemptRef>> {
        let rows = sqlx::query(
            "SELECT a.id, a.job_id, a.epoch FROM attempts a JOIN jobs j ON j.id = a.job_id \
             WHERE a.node_id = $1 \
             AND ((a.state = 'running' AND j.cancel_requested = 1) OR a.state = 'preempting')",
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
        let marked = sqlx::query("UPDATE nodes SET draining = 1 WHERE id = $1 AND draining = 0")
            .bind(node.as_str())
            .execute(&mut *tx)
            .await?;
        let instances: Vec<String> = sqlx::query_scalar(
            "SELECT id FROM instances WHERE node_id = $1 AND state IN ('booting', 'ready') \
             ORDER BY id",
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
            let row = sqlx::query(
                "SELECT a.state, a.attempt_no, j.cancel_requested FROM attempts a \
                 JOIN jobs j ON j.id = a.job_id \
                 WHERE a.id = $1 AND a.job_id = $2 AND a.node_id = $3 AND a.epoch = $4",
            )
            .bind(attempt.attempt_id.to_string())
            .bind(attempt.job_id.to_string())
            .bind(node.as_str())
            .bind(attempt.epoch as i64)
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
                    .bind(now.millis())
                    .bind(attempt.attempt_id.to_string())
                    .execute(&mut *tx)
                    .await?;
                    sqlx::query(
                        "UPDATE jobs SET state = 'running', started_at = $1, \
                         version = version + 1 WHERE id = $2 AND current_attempt = $3",
                    )
                    .bind(now.millis())
                    .bind(attempt.job_id.to_string())
                    .bind(attempt.attempt_id.to_string())
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
                    let id = attempt.attempt_id.to_string();
                    let stored = async |tx: &mut Tx, n: i64| -> StoreResult<bool> {
                        let found: Option<i64> = sqlx::query_scalar(
                            "SELECT seq FROM log_chunks WHERE attempt_id = $1 AND seq = $2",
                        )
                        .bind(&id)
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
                    .bind(attempt.job_id.to_string())
                    .bind(&id)
                    .bind(attempt_no)
                    .bind(seq)
                    .bind(stream_str(*stream))
                    .bind(data)
                    .bind(now.millis())
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
                    .bind(now.millis())
                    .bind(exit_code.map(i64::from))
                    .bind(signal.map(i64::from))
                    .bind(error)
                    .bind(attempt.attempt_id.to_string())
                    .execute(&mut *tx)
                    .await?;
                    let end = ledger::settle_attempt(&mut tx, &attempt.attempt_id.to_string(), now)
                        .await?;
                    sqlx::query(
                        "UPDATE jobs SET state = $1, finished_at = $2, exit_code = $3, \
                         reason = $4, version = version + 1 \
                         WHERE id = $5 AND current_attempt = $6",
                    )
                    .bind(final_state.as_str())
                    .bind(end.millis())
                    .bind(exit_code.map(i64::from))
                    .bind(&reason)
                    .bind(attempt.job_id.to_string())
                    .bind(attempt.attempt_id.to_string())
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

    async fn instances(&self, include_terminated: bool) -> StoreResult<Vec<InstanceRecord>> {
        let rows = sqlx::query(
            "SELECT * FROM instances WHERE ($1 OR state <> 'terminated') ORDER BY requested_at, id",
        )
        .bind(include_terminated)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(instance_from_row).collect()
    }

    async fn pool_backoffs(&self, now: Timestamp) -> StoreResult<Vec<(PoolId, Timestamp)>> {
        let rows = sqlx::query("SELECT id, backoff_until FROM pools WHERE backoff_until > $1")
            .bind(now.millis())
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| {
                Ok((
                    PoolId(r.try_get("id")?),
                    Timestamp(r.try_get("backoff_until")?),
                ))
            })
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
        .bind(now.millis())
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
                .bind(at.millis())
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
                    "UPDATE instances SET state = 'terminated', launch_attempts = launch_attempts + 1, \
                     last_error = $1, ended_at = $2 WHERE id = $3 AND state = 'requested'",
                )
                .bind(error)
                .bind(now.millis())
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
                        .bind(until.millis())
                        .bind(&pool)
                        .execute(&mut *tx)
                        .await?;
                    }
                    if let Some(job) = row.try_get::<Option<String>, _>("for_job")? {
                        requeue_provisioning(
                            &mut tx,
                            &job,
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
            .bind(idle_since.map(Timestamp::millis))
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
             last_error = CASE WHEN $4 THEN COALESCE($2, last_error) ELSE last_error END, billed = 1 WHERE id = $3",
        )
        .bind(now.millis())
        .bind(reason)
        .bind(id)
        .bind(error)
        .execute(&mut *tx)
        .await?;
        // Its cost up to now (at least the minimum billed time), charged to the work on it,
        // before that work is ended below.
        ledger::settle_instance(&mut tx, id, min_billed_s, now).await?;
        if let Some(node) = &inst.node {
            sqlx::query("UPDATE nodes SET healthy = 0, revoked = 1 WHERE id = $1")
                .bind(node.as_str())
                .execute(&mut *tx)
                .await?;
            let why = format!("instance {id} ended: {}", reason.unwrap_or("terminated"));
            end_node_work(&mut tx, node.as_str(), "lost", &why, now).await?;
        }
        if let Some(job) = inst.for_job {
            let why = format!("instance {id} ended before the job was placed");
            requeue_provisioning(&mut tx, &job.to_string(), &why).await?;
        }
        tx.commit().await?;
        Ok(true)
    }

    async fn ledger_total(&self) -> StoreResult<i64> {
        let total: Option<i64> = sqlx::query_scalar("SELECT SUM(amount_micros) FROM ledger")
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
        .bind(period_start.millis())
        .bind(threshold_ppm)
        .bind(now.millis())
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
                .bind(job.to_string()),
                None => sqlx::query(
                    "UPDATE jobs SET state = 'queued', reason = NULL \
                     WHERE id = $2 AND state = 'held' AND $1 IS NULL",
                )
                .bind(None::<String>)
                .bind(job.to_string()),
            }
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn logs(&self, job: JobId, after: i64, limit: i64) -> StoreResult<Vec<LogRecord>> {
        let rows = sqlx::query(
            "SELECT id, attempt_no, stream, data, at FROM log_chunks \
             WHERE job_id = $1 AND id > $2 ORDER BY id LIMIT $3",
        )
        .bind(job.to_string())
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
                    at: Timestamp(r.try_get("at")?),
                })
            })
            .collect()
    }
}

type Tx = sqlx::Transaction<'static, sqlx::Sqlite>;

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

const SQL_POOLS: &str = pools_select!(" ORDER BY p.id");
const SQL_POOL_BY_ID: &str = pools_select!(" WHERE p.id = $1");

/// The audit target of a policy: `policy:TEAM` or `policy:TEAM/PROJECT`.
pub fn policy_target(team: &str, project: Option<&str>) -> String {
    match project {
        Some(p) => format!("policy:{team}/{p}"),
        None => format!("policy:{team}"),
    }
}

/// Appends one audit row inside a caller's transaction (so a change and its audit entry commit
/// together); returns its id.
pub(crate) async fn insert_audit(tx: &mut Tx, e: &NewAuditEntry) -> StoreResult<i64> {
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO audit_log (at, actor, action, target, before_json, after_json) \
         VALUES ($1, $2, $3, $4, $5, $6) RETURNING id",
    )
    .bind(e.at.millis())
    .bind(&e.actor)
    .bind(&e.action)
    .bind(&e.target)
    .bind(&e.before_json)
    .bind(&e.after_json)
    .fetch_one(&mut **tx)
    .await?;
    Ok(id)
}

fn policy_from_row(r: &SqliteRow) -> StoreResult<PolicyRecord> {
    let project: String = r.try_get("project_key")?;
    let body_json: String = r.try_get("body_json")?;
    Ok(PolicyRecord {
        team: r.try_get("team")?,
        project: (!project.is_empty()).then_some(project),
        version: r.try_get("version")?,
        body: serde_json::from_str(&body_json)
            .map_err(|e| corrupt(format!("bad policy body: {e}")))?,
        updated_at: Timestamp(r.try_get("created_at")?),
        updated_by: r.try_get("created_by")?,
    })
}

/// Ends a node's live attempts in `attempt_state` (`lost` when the node or its instance is
/// gone, `preempted` when it is being interrupted) and sends their jobs back to the queue (or to
/// `cancelled` when a cancel was pending). Returns the attempts ended and the jobs requeued.
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
            .bind(now.millis())
            .bind(why)
            .bind(attempt.attempt_id.to_string())
            .execute(&mut **tx)
            .await?;
        let end = ledger::settle_attempt(tx, &attempt.attempt_id.to_string(), now).await?;
        sqlx::query(
            "UPDATE jobs SET state = CASE WHEN cancel_requested = 1 THEN 'cancelled' \
             ELSE 'queued' END, \
             finished_at = CASE WHEN cancel_requested = 1 THEN $1 ELSE NULL END, \
             reason = $2, version = version + 1 \
             WHERE id = $3 AND current_attempt = $4 AND state IN ('placed', 'running')",
        )
        .bind(end.millis())
        .bind(format!("{why}: requeued"))
        .bind(attempt.job_id.to_string())
        .bind(attempt.attempt_id.to_string())
        .execute(&mut **tx)
        .await?;
        requeued.push(JobId(attempt.job_id));
        stopped.push(attempt);
    }
    Ok((stopped, requeued))
}

/// The end of an attempt that puts its job back in the queue (or `cancelled` when a cancel
/// was pending): stopped for a preemption, or by its agent's self-fencing ([`Requeue`]).
/// Returns the job's new state.
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
    .bind(now.millis())
    .bind(exit_code.map(i64::from))
    .bind(signal.map(i64::from))
    .bind(attempt.attempt_id.to_string())
    .bind(attempt_state.as_str())
    .bind(error)
    .execute(&mut **tx)
    .await?;
    let end = ledger::settle_attempt(tx, &attempt.attempt_id.to_string(), now).await?;
    let cancelled: Option<bool> = sqlx::query_scalar(
        "UPDATE jobs SET state = CASE WHEN cancel_requested = 1 THEN 'cancelled' \
         ELSE 'queued' END, \
         finished_at = CASE WHEN cancel_requested = 1 THEN $1 ELSE NULL END, \
         reason = CASE WHEN cancel_requested = 1 THEN 'cancelled by user' ELSE COALESCE($4, reason) END, \
         version = version + 1 \
         WHERE id = $2 AND current_attempt = $3 AND state IN ('placed', 'running') \
         RETURNING cancel_requested",
    )
    .bind(end.millis())
    .bind(attempt.job_id.to_string())
    .bind(attempt.attempt_id.to_string())
    .bind(reason)
    .fetch_optional(&mut **tx)
    .await?;
    Ok(match cancelled {
        Some(true) => JobState::Cancelled,
        _ => JobState::Queued,
    })
}

/// A job waiting for an instance that will not come goes back to the queue.
async fn requeue_provisioning(tx: &mut Tx, job: &str, why: &str) -> StoreResult<()> {
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

fn instance_from_row(r: &SqliteRow) -> StoreResult<InstanceRecord> {
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
        for_job: r
            .try_get::<Option<String>, _>("for_job")?
            .map(|j| parse_uuid(&j).map(JobId))
            .transpose()?,
        node: r.try_get::<Option<String>, _>("node_id")?.map(NodeId),
        launch_attempts: u32_of(r.try_get("launch_attempts")?, "launch_attempts")?,
        next_attempt_at: Timestamp(r.try_get("next_attempt_at")?),
        last_error: r.try_get("last_error")?,
        end_reason: r.try_get("end_reason")?,
        requested_at: Timestamp(r.try_get("requested_at")?),
        launched_at: r.try_get::<Option<i64>, _>("launched_at")?.map(Timestamp),
        ready_at: r.try_get::<Option<i64>, _>("ready_at")?.map(Timestamp),
        idle_since: r.try_get::<Option<i64>, _>("idle_since")?.map(Timestamp),
        ended_at: r.try_get::<Option<i64>, _>("ended_at")?.map(Timestamp),
    })
}

fn attempt_ref_from_row(r: &SqliteRow) -> StoreResult<AttemptRef> {
    Ok(AttemptRef {
        job_id: parse_uuid(&r.try_get::<String, _>("job_id")?)?,
        attempt_id: parse_uuid(&r.try_get::<String, _>("id")?)?,
        epoch: r.try_get::<i64, _>("epoch")? as u64,
    })
}

pub(crate) fn stream_str(s: Stream) -> &'static str {
    match s {
        Stream::Stdout => "stdout",
        Stream::Stderr => "stderr",
        Stream::System => "system",
    }
}

pub(crate) fn accepted() -> EventResult {
    EventResult {
        status: EventStatus::Accepted,
        reason: None,
    }
}

pub(crate) fn duplicate() -> EventResult {
    EventResult {
        status: EventStatus::Duplicate,
        reason: None,
    }
}

pub(crate) fn rejected(reason: &str) -> EventResult {
    EventResult {
        status: EventStatus::Rejected,
        reason: Some(reason.to_string()),
    }
}

macro_rules! job_select {
    ($tail:literal) => {
        concat!(
            "SELECT j.id, j.core_spec_json, j.spec_json, j.state, j.submitted_at, j.started_at, \
             j.finished_at, j.exit_code, j.reason, j.cancel_requested, j.attempts, j.version, \
             j.explanation_json, a.id AS a_id, a.node_id AS a_node, a.pool_id AS a_pool, \
             a.gpus_json AS a_gpus, a.market AS a_market, p.region_id AS a_region, \
             (SELECT SUM(l.amount_micros) FROM ledger l WHERE l.job_id = j.id) AS cost_micros \
             FROM jobs j LEFT JOIN attempts a ON a.id = j.current_attempt \
             LEFT JOIN pools p ON p.id = a.pool_id ",
            $tail
        )
    };
}

fn sql_job_by_id() -> &'static str {
    job_select!("WHERE j.id = $1")
}

/// The job columns; `list_jobs` appends the filters it is given.
fn sql_list_jobs() -> &'static str {
    job_select!("")
}

fn sql_pending_jobs() -> &'static str {
    job_select!("WHERE j.state IN ('queued', 'provisioning', 'held') ORDER BY j.id")
}

/// The database holds token hashes, job specs (with their environment) and the ledger: it is
/// created readable by its owner only (SQLite gives its `-wal` and `-shm` files the same
/// mode), and an existing file is narrowed to that. In-memory databases have no file.
fn owner_only(path: &std::path::Path) -> StoreResult<()> {
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

/// Inserts a new job row (`queued`).
async fn insert_job_row<'e, E>(ex: E, job: &NewJob) -> StoreResult<()>
where
    E: sqlx::Executor<'e, Database = sqlx::Sqlite>,
{
    let core_spec = serde_json::to_string(&job.spec).map_err(|e| corrupt(format!("spec: {e}")))?;
    sqlx::query(
        "INSERT INTO jobs (id, team, project, name, state, priority, kind, spec_json, \
         core_spec_json, submitted_at, deadline, trace_parent) \
         VALUES ($1, $2, $3, $4, 'queued', $5, $6, $7, $8, $9, $10, $11)",
    )
    .bind(job.id.to_string())
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
    .bind(job.submitted_at.millis())
    .bind(job.spec.deadline.map(Timestamp::millis))
    .bind(&job.trace_parent)
    .execute(ex)
    .await?;
    Ok(())
}

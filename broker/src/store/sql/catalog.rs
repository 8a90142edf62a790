//! The leader lease, and the catalogue: regions and pools, with infra's edits to pools.

use super::*;

impl Store {
    /// Takes or renews the leader lease for `ttl_ms` (see [`lease_claim`]); the epoch held, or
    /// `None` when another replica holds a live lease. PostgreSQL uses the database's clock,
    /// SQLite `now`.
    pub async fn acquire_leadership(
        &self,
        replica: &str,
        instance: Uuid,
        ttl_ms: i64,
        now: Timestamp,
    ) -> StoreResult<Option<i64>> {
        let mut tx = self.write_tx().await?;
        // PostgreSQL's clock, read after the write lock: replicas' clocks need not agree.
        let now = match &mut tx {
            Tx::Postgres(t) => postgres::clock(t).await?,
            Tx::Sqlite(_) => now,
        };
        let row = query(LEASE_SELECT)
            .fetch_optional(&mut tx)
            .await?
            .map(|r| leader_of_row(&r))
            .transpose()?;
        let expires = Timestamp(now.millis().saturating_add(ttl_ms));
        let Some((epoch, renew)) = lease_claim(row.as_ref(), replica, instance, now) else {
            return Ok(None);
        };
        if renew {
            query(LEASE_RENEW).bind(expires).execute(&mut tx).await?;
        } else {
            query(LEASE_TAKE)
                .bind(replica)
                .bind(instance)
                .bind(epoch)
                .bind(now)
                .bind(expires)
                .execute(&mut tx)
                .await?;
        }
        tx.commit().await?;
        Ok(Some(epoch))
    }

    /// Ends this process's lease at once (a clean shutdown), so a follower need not wait.
    pub async fn resign_leadership(&self, instance: Uuid) -> StoreResult<()> {
        let mut tx = self.write_tx().await?;
        query("UPDATE leader_lease SET expires_at = $2 WHERE id = 1 AND holder_instance = $1")
            .bind(instance)
            .bind(Timestamp(0))
            .execute(&mut tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    pub async fn leader(&self) -> StoreResult<Option<LeaderRecord>> {
        query(LEASE_SELECT)
            .fetch_optional(&self.db)
            .await?
            .map(|r| leader_of_row(&r))
            .transpose()
    }

    pub async fn upsert_region(&self, region: &Region) -> StoreResult<()> {
        query(
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
        .execute(&self.db)
        .await?;
        Ok(())
    }

    pub async fn upsert_pool(&self, pool: &Pool) -> StoreResult<()> {
        query(
            "INSERT INTO pools (id, region_id, provider, instance_type, gpu_model, gpus_per_node, \
             gpu_memory_gb, vcpus, memory_gb, on_demand_micros, spot_micros, node_limit, \
             launchable, boot_time_s, price_updated_at, recent_capacity_failures, \
             marginal_micros) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, \
             $17) \
             ON CONFLICT (id) DO UPDATE SET region_id = excluded.region_id, \
             provider = excluded.provider, instance_type = excluded.instance_type, \
             gpu_model = excluded.gpu_model, gpus_per_node = excluded.gpus_per_node, \
             gpu_memory_gb = excluded.gpu_memory_gb, vcpus = excluded.vcpus, \
             memory_gb = excluded.memory_gb, on_demand_micros = excluded.on_demand_micros, \
             spot_micros = excluded.spot_micros, node_limit = excluded.node_limit, \
             launchable = excluded.launchable, boot_time_s = excluded.boot_time_s, \
             price_updated_at = excluded.price_updated_at, \
             marginal_micros = excluded.marginal_micros",
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
        .bind(pool.price_updated_at)
        .bind(i64::from(pool.recent_capacity_failures))
        .bind(pool.marginal_per_hour.map(Money::micros))
        .execute(&self.db)
        .await?;
        Ok(())
    }

    pub async fn regions(&self) -> StoreResult<Vec<Region>> {
        let rows = query("SELECT * FROM regions ORDER BY id COLLATE \"C\"")
            .fetch_all(&self.db)
            .await?;
        rows.iter().map(region_from_row).collect()
    }

    pub async fn pools(&self) -> StoreResult<Vec<Pool>> {
        let rows = query(SQL_POOLS).fetch_all(&self.db).await?;
        rows.iter().map(pool_from_row).collect()
    }

    /// Applies infra's edit to a pool with its `pool.patch` audit row in one transaction (the
    /// edit outlives catalogue re-seeding). Returns the pool before and after; `None` if unknown.
    pub async fn patch_pool(
        &self,
        id: &PoolId,
        change: &PoolChange,
        actor: &str,
        now: Timestamp,
    ) -> StoreResult<Option<(Pool, Pool)>> {
        let mut tx = self.write_tx().await?;
        let Some(row) = query(SQL_POOL_BY_ID)
            .bind(id.as_str())
            .fetch_optional(&mut tx)
            .await?
        else {
            return Ok(None);
        };
        let before = pool_from_row(&row)?;
        query(
            "INSERT INTO pool_overrides (pool_id, node_limit, on_demand_micros, launchable, \
             updated_at, marginal_micros) VALUES ($1, $2, $3, $4, $5, $6) \
             ON CONFLICT (pool_id) DO UPDATE SET \
             node_limit = COALESCE(excluded.node_limit, pool_overrides.node_limit), \
             on_demand_micros = COALESCE(excluded.on_demand_micros, pool_overrides.on_demand_micros), \
             launchable = COALESCE(excluded.launchable, pool_overrides.launchable), \
             marginal_micros = COALESCE(excluded.marginal_micros, pool_overrides.marginal_micros), \
             updated_at = excluded.updated_at",
        )
        .bind(id.as_str())
        .bind(change.node_limit.map(i64::from))
        .bind(change.on_demand_per_hour.map(Money::micros))
        .bind(change.launchable)
        .bind(now)
        .bind(change.marginal_per_hour.map(Money::micros))
        .execute(&mut tx)
        .await?;
        let row = query(SQL_POOL_BY_ID)
            .bind(id.as_str())
            .fetch_one(&mut tx)
            .await?;
        let after = pool_from_row(&row)?;
        let patch_json = |p: &Pool| {
            serde_json::json!({
                "node_limit": p.node_limit,
                "on_demand_per_hour_usd": p.on_demand_per_hour.as_dollars(),
                "price_per_gpu_hour": p.on_demand_per_gpu_hour().as_dollars(),
                "launchable": p.launchable,
                "marginal_usd_per_gpu_hour": p.marginal_per_hour
                    .map(|m| m.div_ceil(i64::from(p.gpus_per_node.max(1))).as_dollars()),
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
}

/// The lease SQL both stores run (the same text; each binds its own column types).
const LEASE_SELECT: &str = "SELECT holder, holder_instance, epoch, acquired_at, \
     expires_at FROM leader_lease WHERE id = 1";

const LEASE_RENEW: &str = "UPDATE leader_lease SET expires_at = $1 WHERE id = 1";

/// Binds: holder, holder run, epoch, acquired at, expires at.
const LEASE_TAKE: &str = "INSERT INTO leader_lease \
     (id, holder, holder_instance, epoch, acquired_at, expires_at) VALUES (1, $1, $2, $3, $4, $5) \
     ON CONFLICT (id) DO UPDATE SET holder = excluded.holder, \
     holder_instance = excluded.holder_instance, epoch = excluded.epoch, \
     acquired_at = excluded.acquired_at, expires_at = excluded.expires_at";

//! Inference services (issue 26): the service rows (a spec with versions, what the autoscaler
//! decided, deletion), their event log, and the replica jobs as the API and the reconciler read
//! them. A replica is a job (`jobs.service_id`, `service_version`); placing, leasing and
//! charging it is the jobs' business.

use super::*;
use crate::rules::lease::AttemptState;

/// A service row, with the ledger's amounts for its replica jobs.
const SQL_SERVICE: &str = "SELECT s.id, s.team, s.project, s.name, s.spec_json, s.spec_version, \
     s.desired_replicas, s.desired_reason, s.created_at, s.updated_at, s.deleted_at, \
     (SELECT CAST(SUM(l.amount_micros) AS BIGINT) FROM ledger l \
      JOIN jobs j ON j.id = l.job_id WHERE j.service_id = s.id) AS cost_micros \
     FROM services s";

/// The terminal job states, as stored.
const TERMINAL: &str = "('succeeded', 'failed', 'cancelled')";

fn service_from_row(r: &Row) -> StoreResult<ServiceRecord> {
    Ok(ServiceRecord {
        id: r.uuid("id")?,
        team: r.get("team")?,
        project: r.get("project")?,
        name: r.get("name")?,
        spec_json: r.get("spec_json")?,
        spec_version: r.get("spec_version")?,
        desired_replicas: r.u32("desired_replicas")?,
        desired_reason: r.get("desired_reason")?,
        created_at: r.time("created_at")?,
        updated_at: r.time("updated_at")?,
        deleted_at: r.time_opt("deleted_at")?,
        cost: Money(r.get::<Option<i64>>("cost_micros")?.unwrap_or(0)),
    })
}

fn event_from_row(r: &Row) -> StoreResult<ServiceEventRecord> {
    Ok(ServiceEventRecord {
        id: r.get("id")?,
        service: r.uuid("service_id")?,
        at: r.time("at")?,
        kind: r.get("kind")?,
        message: r.get("message")?,
        details_json: r.get("details_json")?,
    })
}

fn replica_from_row(r: &Row) -> StoreResult<ServiceReplicaRow> {
    let job = JobId(r.uuid("id")?);
    let attempt = match r.uuid_opt("a_id")? {
        None => None,
        Some(a) => {
            let state: String = r.get("a_state")?;
            let port = r
                .get::<Option<i64>>("a_serve_port")?
                .map(|p| {
                    u16::try_from(p).map_err(|_| corrupt(format!("serve port out of range: {p}")))
                })
                .transpose()?;
            Some(ReplicaAttemptRow {
                attempt: AttemptId(a),
                state: AttemptState::parse(&state)
                    .ok_or_else(|| corrupt(format!("bad attempt state {state:?}")))?,
                node: NodeId(r.get("a_node")?),
                pool: PoolId(r.get("a_pool")?),
                region: r.get::<Option<String>>("a_region")?.unwrap_or_default(),
                market: parse_market(&r.get::<String>("a_market")?)?,
                serve_host: r.get("a_serve_host")?,
                serve_port: port,
                ready: r.get("a_ready")?,
                node_draining: r.get::<Option<bool>>("a_node_draining")?.unwrap_or(false),
            })
        }
    };
    Ok(ServiceReplicaRow {
        job,
        service_version: r
            .get::<Option<i64>>("service_version")?
            .ok_or_else(|| corrupt(format!("replica {job} has no service version")))?,
        job_state: parse_state(&r.get::<String>("state")?)?,
        cancel_requested: r.get("cancel_requested")?,
        drain_at: r.time_opt("drain_at")?,
        finished_at: r.time_opt("finished_at")?,
        reason: r.get("reason")?,
        on_demand_only: {
            let spec: String = r.get("spec_json")?;
            serde_json::from_str::<switchyard_protocol::api::JobSpec>(&spec)
                .map_err(|e| corrupt(format!("replica {job} spec: {e}")))?
                .spot
                == Some(switchyard_protocol::api::SpotRule::Never)
        },
        attempt,
    })
}

/// Appends one event to a service's log.
async fn insert_event<'c>(
    ex: impl Into<Ex<'c>>,
    service: Uuid,
    kind: &str,
    message: &str,
    details_json: Option<&str>,
    now: Timestamp,
) -> StoreResult<i64> {
    query_scalar(
        "INSERT INTO service_events (service_id, at, kind, message, details_json) \
         VALUES ($1, $2, $3, $4, $5) RETURNING id",
    )
    .bind(service)
    .bind(now)
    .bind(kind)
    .bind(message)
    .bind(details_json)
    .fetch_one(ex)
    .await
}

async fn service_in<'c>(ex: impl Into<Ex<'c>>, id: Uuid) -> StoreResult<Option<ServiceRecord>> {
    let row = query(AssertSqlSafe(format!("{SQL_SERVICE} WHERE s.id = $1")))
        .bind(id)
        .fetch_optional(ex)
        .await?;
    row.as_ref().map(service_from_row).transpose()
}

impl Store {
    /// Creates a service at spec version 1, with its `deployed` event, unless its team has a
    /// live service of that name: then nothing is written ([`ServiceInsert::NameTaken`]).
    pub async fn insert_service(&self, s: &NewService) -> StoreResult<ServiceInsert> {
        // Under the global write order, so that two requests for one name cannot both pass
        // the check (the partial unique index `services_live_name` backs it).
        let mut tx = self.write_tx().await?;
        let existing: Option<DbId> = query_scalar(
            "SELECT id FROM services WHERE team = $1 AND name = $2 AND deleted_at IS NULL",
        )
        .bind(&s.team)
        .bind(&s.name)
        .fetch_optional(&mut tx)
        .await?;
        if let Some(existing) = existing {
            return Ok(ServiceInsert::NameTaken {
                existing: existing.0,
            });
        }
        query(
            "INSERT INTO services (id, team, project, name, spec_json, spec_version, \
             desired_replicas, desired_reason, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, 1, $6, $7, $8, $8)",
        )
        .bind(s.id)
        .bind(&s.team)
        .bind(&s.project)
        .bind(&s.name)
        .bind(&s.spec_json)
        .bind(i64::from(s.desired_replicas))
        .bind(&s.desired_reason)
        .bind(s.created_at)
        .execute(&mut tx)
        .await?;
        let message = format!(
            "version 1 deployed; {} replica{} desired: {}",
            s.desired_replicas,
            if s.desired_replicas == 1 { "" } else { "s" },
            s.desired_reason
        );
        insert_event(&mut tx, s.id, "deployed", &message, None, s.created_at).await?;
        tx.commit().await?;
        Ok(ServiceInsert::Inserted(ServiceRecord {
            id: s.id,
            team: s.team.clone(),
            project: s.project.clone(),
            name: s.name.clone(),
            spec_json: s.spec_json.clone(),
            spec_version: 1,
            desired_replicas: s.desired_replicas,
            desired_reason: s.desired_reason.clone(),
            created_at: s.created_at,
            updated_at: s.created_at,
            deleted_at: None,
            cost: Money::ZERO,
        }))
    }

    /// One service, deleted or not.
    pub async fn service(&self, id: Uuid) -> StoreResult<Option<ServiceRecord>> {
        service_in(&self.db, id).await
    }

    /// The services of `team` (every team's with `None`), by team and name: the live ones, and
    /// the deleted ones whose replicas have not all ended yet (draining).
    pub async fn services(&self, team: Option<&str>) -> StoreResult<Vec<ServiceRecord>> {
        let live = format!(
            "(s.deleted_at IS NULL OR EXISTS (SELECT 1 FROM jobs j WHERE j.service_id = s.id \
             AND j.state NOT IN {TERMINAL}))"
        );
        let order = "ORDER BY s.team COLLATE \"C\", s.name COLLATE \"C\", s.id";
        let rows = match team {
            Some(team) => {
                query(AssertSqlSafe(format!(
                    "{SQL_SERVICE} WHERE s.team = $1 AND {live} {order}"
                )))
                .bind(team)
                .fetch_all(&self.db)
                .await?
            }
            None => {
                query(AssertSqlSafe(format!("{SQL_SERVICE} WHERE {live} {order}")))
                    .fetch_all(&self.db)
                    .await?
            }
        };
        rows.iter().map(service_from_row).collect()
    }

    /// A new spec version of a live service (team and name stay; the project may change),
    /// with its `updated` event, in one transaction. With `expected_version`, a
    /// compare-and-swap: another current version is [`ServiceUpdate::Stale`] and nothing is
    /// written.
    pub async fn update_service_spec(
        &self,
        id: Uuid,
        expected_version: Option<i64>,
        project: Option<&str>,
        spec_json: &str,
        now: Timestamp,
    ) -> StoreResult<ServiceUpdate> {
        let mut tx = self.write_tx().await?;
        let row = query(AssertSqlSafe(format!(
            "SELECT spec_version, deleted_at FROM services WHERE id = $1{}",
            self.dialect().for_update
        )))
        .bind(id)
        .fetch_optional(&mut tx)
        .await?;
        let Some(row) = row else {
            return Ok(ServiceUpdate::NotFound);
        };
        if row.time_opt("deleted_at")?.is_some() {
            return Ok(ServiceUpdate::Deleted);
        }
        let current: i64 = row.get("spec_version")?;
        if expected_version.is_some_and(|e| e != current) {
            return Ok(ServiceUpdate::Stale { current });
        }
        let version = current + 1;
        query(
            "UPDATE services SET spec_json = $1, spec_version = $2, project = $3, \
             updated_at = $4 WHERE id = $5",
        )
        .bind(spec_json)
        .bind(version)
        .bind(project)
        .bind(now)
        .bind(id)
        .execute(&mut tx)
        .await?;
        let message =
            format!("version {version}: new replicas start, the old drain once they are ready");
        insert_event(&mut tx, id, "updated", &message, None, now).await?;
        let record = service_in(&mut tx, id)
            .await?
            .ok_or_else(|| corrupt(format!("service {id} vanished in its update")))?;
        tx.commit().await?;
        Ok(ServiceUpdate::Updated(record))
    }

    /// Marks a service deleted (desired replicas 0; the reconciler drains its replicas), with
    /// its `deleted` event.
    pub async fn delete_service(&self, id: Uuid, now: Timestamp) -> StoreResult<ServiceDelete> {
        let mut tx = self.write_tx().await?;
        let row = query(AssertSqlSafe(format!(
            "SELECT deleted_at FROM services WHERE id = $1{}",
            self.dialect().for_update
        )))
        .bind(id)
        .fetch_optional(&mut tx)
        .await?;
        let Some(row) = row else {
            return Ok(ServiceDelete::NotFound);
        };
        if let Some(at) = row.time_opt("deleted_at")? {
            return Ok(ServiceDelete::AlreadyDeleted(at));
        }
        query(
            "UPDATE services SET deleted_at = $1, updated_at = $1, desired_replicas = 0, \
             desired_reason = 'deleted' WHERE id = $2",
        )
        .bind(now)
        .bind(id)
        .execute(&mut tx)
        .await?;
        insert_event(
            &mut tx,
            id,
            "deleted",
            "deleted: its replicas drain, then stop",
            None,
            now,
        )
        .await?;
        let record = service_in(&mut tx, id)
            .await?
            .ok_or_else(|| corrupt(format!("service {id} vanished in its deletion")))?;
        tx.commit().await?;
        Ok(ServiceDelete::Deleted(record))
    }

    /// Records the autoscaler's decision: `n` replicas, and why. A `scaled` event is appended
    /// only when `n` changes (a new reason for the same number is kept without one). A
    /// leader's write (fenced). Returns whether `n` changed; `false` too for a service that
    /// is not there or deleted, which keeps its 0.
    pub async fn set_service_desired(
        &self,
        id: Uuid,
        n: u32,
        reason: &str,
        now: Timestamp,
    ) -> StoreResult<bool> {
        let mut tx = self.leader_tx().await?;
        let row = query(AssertSqlSafe(format!(
            "SELECT desired_replicas FROM services WHERE id = $1 AND deleted_at IS NULL{}",
            self.dialect().for_update
        )))
        .bind(id)
        .fetch_optional(&mut tx)
        .await?;
        let Some(row) = row else {
            return Ok(false);
        };
        let before = row.u32("desired_replicas")?;
        query("UPDATE services SET desired_replicas = $1, desired_reason = $2 WHERE id = $3")
            .bind(i64::from(n))
            .bind(reason)
            .bind(id)
            .execute(&mut tx)
            .await?;
        let changed = before != n;
        if changed {
            let message = format!("{before} → {n} replicas: {reason}");
            insert_event(&mut tx, id, "scaled", &message, None, now).await?;
        }
        tx.commit().await?;
        Ok(changed)
    }

    /// Appends an event to a service's log (a placement decision, a replica's news); returns
    /// its id.
    pub async fn append_service_event(
        &self,
        id: Uuid,
        kind: &str,
        message: &str,
        details_json: Option<&str>,
        now: Timestamp,
    ) -> StoreResult<i64> {
        let mut tx = self.write_tx().await?;
        let event = insert_event(&mut tx, id, kind, message, details_json, now).await?;
        tx.commit().await?;
        Ok(event)
    }

    /// A service's events with ids above `after`, oldest first, at most `limit`.
    pub async fn service_events(
        &self,
        id: Uuid,
        after: i64,
        limit: i64,
    ) -> StoreResult<Vec<ServiceEventRecord>> {
        let rows = query(
            "SELECT id, service_id, at, kind, message, details_json FROM service_events \
             WHERE service_id = $1 AND id > $2 ORDER BY id LIMIT $3",
        )
        .bind(id)
        .bind(after)
        .bind(limit)
        .fetch_all(&self.db)
        .await?;
        rows.iter().map(event_from_row).collect()
    }

    /// A service's replica jobs that have not ended, or ended at or after `finished_after`,
    /// oldest first, each with its current attempt.
    pub async fn service_replicas(
        &self,
        id: Uuid,
        finished_after: Timestamp,
    ) -> StoreResult<Vec<ServiceReplicaRow>> {
        let rows = query(AssertSqlSafe(format!(
            "SELECT j.id, j.service_version, j.state, j.cancel_requested, j.drain_at, j.finished_at, \
             j.reason, j.spec_json, a.id AS a_id, a.state AS a_state, a.node_id AS a_node, \
             a.pool_id AS a_pool, p.region_id AS a_region, a.market AS a_market, \
             a.serve_host AS a_serve_host, a.serve_port AS a_serve_port, a.ready AS a_ready, \
             n.draining AS a_node_draining \
             FROM jobs j LEFT JOIN attempts a ON a.id = j.current_attempt \
             LEFT JOIN pools p ON p.id = a.pool_id LEFT JOIN nodes n ON n.id = a.node_id \
             WHERE j.service_id = $1 AND (j.state NOT IN {TERMINAL} OR j.finished_at >= $2) \
             ORDER BY j.id"
        )))
        .bind(id)
        .bind(finished_after)
        .fetch_all(&self.db)
        .await?;
        rows.iter().map(replica_from_row).collect()
    }

    /// Begins draining a replica: from now on the gateway sends it nothing new (its job is
    /// cancelled later, once what it has in flight is done). Returns false when it already
    /// was, or its job has ended.
    pub async fn drain_replica(&self, job: JobId, now: Timestamp) -> StoreResult<bool> {
        let mut tx = self.leader_tx().await?;
        let done = query(AssertSqlSafe(format!(
            "UPDATE jobs SET drain_at = $1 WHERE id = $2 AND service_id IS NOT NULL \
             AND drain_at IS NULL AND state NOT IN {TERMINAL}"
        )))
        .bind(now)
        .bind(job)
        .execute(&mut tx)
        .await?;
        tx.commit().await?;
        Ok(done.rows_affected() == 1)
    }
}

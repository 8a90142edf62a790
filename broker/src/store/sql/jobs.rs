//! Jobs as users see them: submission (with idempotency keys), reading, listing, cancelling,
//! their logs.

use super::*;

impl Store {
    /// Inserts a new job (`queued`); answered once its row committed.
    pub async fn insert_job(&self, job: &NewJob) -> StoreResult<()> {
        match &self.submits {
            // Batched with the submissions arriving meanwhile (`postgres/submits.rs`); a
            // service's replica (from the reconciler) is written on its own.
            Some(submits) if job.replica.is_none() => submits.insert(job).await,
            _ => insert_job_row(&self.db, job).await,
        }
    }

    /// Inserts `job` under an `Idempotency-Key`, in one transaction with the key, unless the
    /// key (made at or after `since`) already names a job: then nothing is written and that
    /// job is returned. Keys made before `since` are deleted on the way.
    pub async fn insert_job_idempotent(
        &self,
        job: &NewJob,
        key: &IdempotencyKey,
        since: Timestamp,
    ) -> StoreResult<IdempotentInsert> {
        // Not batched: the key and its job commit together, under the write lock, so two
        // requests with one key cannot both insert.
        let mut tx = self.write_tx().await?;
        query("DELETE FROM idempotency_keys WHERE created_at < $1")
            .bind(since)
            .execute(&mut tx)
            .await?;
        let existing = query(
            "SELECT job_id, request_hash FROM idempotency_keys WHERE scope = $1 AND key = $2",
        )
        .bind(&key.scope)
        .bind(&key.key)
        .fetch_optional(&mut tx)
        .await?;
        if let Some(row) = existing {
            return Ok(IdempotentInsert::Existing {
                job: JobId(row.uuid("job_id")?),
                same_request: row.get::<String>("request_hash")? == key.request_hash,
            });
        }
        insert_job_row(&mut tx, job).await?;
        query(
            "INSERT INTO idempotency_keys (scope, key, request_hash, job_id, created_at) \
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(&key.scope)
        .bind(&key.key)
        .bind(&key.request_hash)
        .bind(job.id.0)
        .bind(job.submitted_at)
        .execute(&mut tx)
        .await?;
        tx.commit().await?;
        Ok(IdempotentInsert::Inserted)
    }

    /// The job a key made at or after `since` names, and whether its request digest is
    /// `key.request_hash`.
    pub async fn idempotent_job(
        &self,
        key: &IdempotencyKey,
        since: Timestamp,
    ) -> StoreResult<Option<(JobId, bool)>> {
        let row = query(
            "SELECT job_id, request_hash FROM idempotency_keys \
             WHERE scope = $1 AND key = $2 AND created_at >= $3",
        )
        .bind(&key.scope)
        .bind(&key.key)
        .bind(since)
        .fetch_optional(&self.db)
        .await?;
        row.map(|r| {
            let same = r.get::<String>("request_hash")? == key.request_hash;
            Ok((JobId(r.uuid("job_id")?), same))
        })
        .transpose()
    }

    pub async fn job(&self, id: JobId) -> StoreResult<Option<JobRecord>> {
        let row = query(SQL_JOB_BY_ID)
            .bind(id.0)
            .fetch_optional(&self.db)
            .await?;
        let Some(mut job) = row.as_ref().map(job_from_row).transpose()? else {
            return Ok(None);
        };
        // A gang's ranks, all of its current placement.
        if let Some(p) = job.placement.as_mut() {
            let rows = query(
                "SELECT node_rank, node_id, gpus_json, state, exit_code FROM attempts \
                 WHERE gang_lead = $1 ORDER BY node_rank",
            )
            .bind(p.attempt.0)
            .fetch_all(&self.db)
            .await?;
            p.ranks = rows
                .iter()
                .map(|r| {
                    Ok(RankPlacement {
                        rank: r.u32("node_rank")?,
                        node: NodeId(r.get("node_id")?),
                        gpus: parse_gpus(&r.get::<String>("gpus_json")?)?,
                        state: r.get("state")?,
                        exit_code: r
                            .get::<Option<i64>>("exit_code")?
                            .and_then(|c| i32::try_from(c).ok()),
                    })
                })
                .collect::<StoreResult<_>>()?;
        }
        Ok(Some(job))
    }

    pub async fn list_jobs(&self, filter: &JobFilter) -> StoreResult<Vec<JobRecord>> {
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
        let mut q = query(AssertSqlSafe(sql));
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
        let rows = q.bind(filter.limit).fetch_all(&self.db).await?;
        rows.iter().map(job_from_row).collect()
    }

    /// Jobs not yet finished, counted by state and priority (for `/metrics`).
    pub async fn queue_depth(&self) -> StoreResult<Vec<(JobState, Priority, i64)>> {
        let rows = query(
            "SELECT state, priority, COUNT(*) AS n FROM jobs \
             WHERE state IN ('queued', 'held', 'provisioning', 'placed', 'running') \
             GROUP BY state, priority ORDER BY state COLLATE \"C\", priority COLLATE \"C\"",
        )
        .fetch_all(&self.db)
        .await?;
        rows.iter()
            .map(|r| {
                Ok((
                    parse_state(&r.get::<String>("state")?)?,
                    parse_priority(&r.get::<String>("priority")?)?,
                    r.get::<i64>("n")?,
                ))
            })
            .collect()
    }

    pub async fn cancel_job(&self, id: JobId, now: Timestamp) -> StoreResult<CancelOutcome> {
        let mut tx = self.write_tx().await?;
        let Some(row) = query("SELECT state FROM jobs WHERE id = $1")
            .bind(id.0)
            .fetch_optional(&mut tx)
            .await?
        else {
            return Ok(CancelOutcome::NotFound);
        };
        let state = parse_state(&row.get::<String>("state")?)?;
        let outcome = if state.is_terminal() {
            CancelOutcome::AlreadyFinished(state)
        } else {
            // Leases handed out but not started are withdrawn now (every rank of a gang).
            let rows = query(
                "UPDATE attempts SET state = 'cancelled', finished_at = $1 \
                 WHERE job_id = $2 AND state = 'assigned' RETURNING id, node_id",
            )
            .bind(now)
            .bind(id.0)
            .fetch_all(&mut tx)
            .await?;
            let withdrawn = rows
                .iter()
                .map(|r| Ok((AttemptId(r.uuid("id")?), NodeId(r.get("node_id")?))))
                .collect::<StoreResult<Vec<_>>>()?;
            // What runs is stopped by its agent; the job ends when one reports.
            let nodes: Vec<String> = if state == JobState::Running {
                query_scalar(
                    "SELECT DISTINCT node_id FROM attempts WHERE job_id = $1 \
                     AND state IN ('running', 'preempting')",
                )
                .bind(id.0)
                .fetch_all(&mut tx)
                .await?
            } else {
                Vec::new()
            };
            if nodes.is_empty() {
                // Waiting, placed but not yet started, or a gang whose running ranks are
                // all done: cancelled at once.
                query(
                    "UPDATE jobs SET state = 'cancelled', cancel_requested = TRUE, \
                     finished_at = $1, reason = 'cancelled by user', version = version + 1 \
                     WHERE id = $2",
                )
                .bind(now)
                .bind(id.0)
                .execute(&mut tx)
                .await?;
                CancelOutcome::Cancelled { withdrawn }
            } else {
                query(
                    "UPDATE jobs SET cancel_requested = TRUE, version = version + 1 WHERE id = $1",
                )
                .bind(id.0)
                .execute(&mut tx)
                .await?;
                CancelOutcome::Stopping {
                    nodes: nodes.into_iter().map(NodeId).collect(),
                    withdrawn,
                }
            }
        };
        tx.commit().await?;
        Ok(outcome)
    }

    /// The W3C trace context recorded with the job at submit, if any.
    pub async fn job_trace_parent(&self, job: JobId) -> StoreResult<Option<String>> {
        let tp: Option<Option<String>> =
            query_scalar("SELECT trace_parent FROM jobs WHERE id = $1")
                .bind(job.0)
                .fetch_optional(&self.db)
                .await?;
        Ok(tp.flatten())
    }

    pub async fn logs(&self, job: JobId, after: i64, limit: i64) -> StoreResult<Vec<LogRecord>> {
        let rows = query(
            "SELECT id, attempt_no, stream, data, at FROM log_chunks \
             WHERE job_id = $1 AND id > $2 ORDER BY id LIMIT $3",
        )
        .bind(job.0)
        .bind(after)
        .bind(limit)
        .fetch_all(&self.db)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(LogRecord {
                    offset: r.get("id")?,
                    attempt_no: r.u32("attempt_no")?,
                    stream: r.get("stream")?,
                    data: r.get("data")?,
                    at: r.time("at")?,
                })
            })
            .collect()
    }
}

/// Inserts a new job row (`queued`).
async fn insert_job_row<'c>(ex: impl Into<Ex<'c>>, job: &NewJob) -> StoreResult<()> {
    let core_spec =
        serde_json::to_string(&job.spec).map_err(|e| StoreError::Corrupt(format!("spec: {e}")))?;
    let serve_json = match &job.replica {
        Some(r) => Some(
            serde_json::to_string(&r.serve)
                .map_err(|e| StoreError::Corrupt(format!("serve spec: {e}")))?,
        ),
        None => None,
    };
    query(
        "INSERT INTO jobs (id, team, project, name, state, priority, kind, spec_json, \
         core_spec_json, submitted_at, deadline, trace_parent, service_id, service_version, \
         serve_json) \
         VALUES ($1, $2, $3, $4, 'queued', $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)",
    )
    .bind(job.id)
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
    .bind(job.submitted_at)
    .bind(job.spec.deadline)
    .bind(&job.trace_parent)
    .bind(job.replica.as_ref().map(|r| r.service))
    .bind(job.replica.as_ref().map(|r| r.version))
    .bind(serve_json)
    .execute(ex)
    .await?;
    Ok(())
}

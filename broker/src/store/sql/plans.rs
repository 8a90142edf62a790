//! What the scheduler reads (pending jobs, live attempts) and writes (plans, preemptions, holds,
//! explanations).

use super::*;

impl Store {
    /// Records placement explanations worked out after their plan was committed: each for
    /// the attempt it explains, so a job placed again since keeps its newer one.
    pub async fn set_explanations(&self, rows: &[(JobId, AttemptId, String)]) -> StoreResult<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let mut tx = self.db.begin().await?;
        for (id, attempt, json) in rows {
            query(SET_EXPLANATION)
                .bind(json)
                .bind(id.0)
                .bind(attempt.0)
                .execute(&mut tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Stores, per instance id, the explanation of the round that launched it for its job.
    pub async fn set_launch_explanations(&self, rows: &[(String, String)]) -> StoreResult<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let mut tx = self.db.begin().await?;
        for (instance, json) in rows {
            query("UPDATE instances SET launch_explanation_json = $1 WHERE id = $2")
                .bind(json)
                .bind(instance)
                .execute(&mut tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// The explanation of the round that launched an instance for `job`: the one whose node is
    /// `node`, or without a node the newest one still live.
    pub async fn launch_explanation(
        &self,
        job: JobId,
        node: Option<&str>,
    ) -> StoreResult<Option<String>> {
        let text: Option<Option<String>> = query_scalar(
            "SELECT launch_explanation_json FROM instances WHERE for_job = $1 \
             AND (($2 IS NOT NULL AND node_id = $2) OR ($2 IS NULL AND state <> 'terminated')) \
             ORDER BY requested_at DESC LIMIT 1",
        )
        .bind(job.0)
        .bind(node)
        .fetch_optional(&self.db)
        .await?;
        Ok(text.flatten())
    }

    pub async fn pending_jobs(&self) -> StoreResult<Vec<JobRecord>> {
        let rows = query(SQL_PENDING_JOBS).fetch_all(&self.db).await?;
        rows.iter().map(job_from_row).collect()
    }

    pub async fn live_attempts(&self) -> StoreResult<Vec<AttemptRecord>> {
        let rows = query(
            "SELECT a.id, a.job_id, a.node_id, a.gpus_json, a.created_at, a.state, \
             a.expected_end, j.priority FROM attempts a JOIN jobs j ON j.id = a.job_id \
             WHERE a.state IN ('assigned', 'running', 'preempting') ORDER BY a.id",
        )
        .fetch_all(&self.db)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(AttemptRecord {
                    id: AttemptId(r.uuid("id")?),
                    job: JobId(r.uuid("job_id")?),
                    node: NodeId(r.get("node_id")?),
                    gpus: parse_gpus(&r.get::<String>("gpus_json")?)?,
                    priority: parse_priority(&r.get::<String>("priority")?)?,
                    created_at: r.time("created_at")?,
                    expected_end: r.time("expected_end")?,
                    stopping: r.get::<String>("state")? == "preempting",
                })
            })
            .collect()
    }

    /// Which live attempt holds which GPUs, with its job's team and name: the
    /// `switchyard_gpu_allocated` series that joins GPU telemetry to teams (`/metrics`), and
    /// what runs on each node (`GET /nodes`). One query, whatever the number of attempts.
    pub async fn gpu_allocations(&self) -> StoreResult<Vec<GpuAllocation>> {
        let rows = query(
            "SELECT a.id, a.node_id, a.gpus_json, a.job_id, j.team, j.name, j.priority, \
             j.started_at FROM attempts a JOIN jobs j ON j.id = a.job_id \
             WHERE a.state IN ('assigned', 'running', 'preempting') ORDER BY a.id",
        )
        .fetch_all(&self.db)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(GpuAllocation {
                    attempt: AttemptId(r.uuid("id")?),
                    node: NodeId(r.get("node_id")?),
                    gpus: parse_gpus(&r.get::<String>("gpus_json")?)?,
                    job: JobId(r.uuid("job_id")?),
                    team: r.get("team")?,
                    name: r.get("name")?,
                    priority: parse_priority(&r.get::<String>("priority")?)?,
                    started_at: r.time_opt("started_at")?,
                })
            })
            .collect()
    }

    /// Commits a round's assignments and launch requests in one transaction, each guarded by
    /// the job's version. A job changed since it was read fails the whole commit with
    /// [`StoreError::Stale`]. Jobs given a launch become `provisioning`.
    pub async fn commit_plan(
        &self,
        assignments: &[NewAttempt],
        launches: &[NewInstance],
        now: Timestamp,
    ) -> StoreResult<()> {
        let mut tx = self.leader_tx().await?;
        // A gang's launches (one per node, adjacent) move its job once.
        for group in launches.chunk_by(|a, b| a.for_job == b.for_job) {
            let l = &group[0];
            let updated = query(
                "UPDATE jobs SET state = 'provisioning', version = version + 1, \
                 reason = 'waiting for a new instance in ' || $1 \
                 WHERE id = $2 AND version = $3 AND state IN ('queued', 'held')",
            )
            .bind(l.pool.as_str())
            .bind(l.for_job.0)
            .bind(l.job_version)
            .execute(&mut tx)
            .await?;
            if updated.rows_affected() != 1 {
                return Err(StoreError::Stale(format!(
                    "job {} changed since planning",
                    l.for_job
                )));
            }
            for l in group {
                query(
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
                .bind(now)
                .bind(l.estimated_cost.micros())
                .execute(&mut tx)
                .await?;
            }
        }
        // A gang's assignments (one per node, adjacent, rank 0 first) are placed together:
        // one attempt per rank, each its own lease; rank 0's is the job's current attempt.
        for group in assignments.chunk_by(|a, b| a.job == b.job) {
            let a = &group[0];
            let ranks = i64::try_from(group.len()).unwrap_or(i64::MAX);
            let lead = group.iter().find(|r| r.rank == 0).unwrap_or(a).id;
            let attempts: Option<i64> = query_scalar(
                "UPDATE jobs SET state = 'placed', attempts = attempts + $4, \
                 current_attempt = $1, explanation_json = NULL, reason = NULL, \
                 version = version + 1 \
                 WHERE id = $2 AND version = $3 AND state IN ('queued', 'provisioning', 'held') \
                 RETURNING attempts",
            )
            .bind(lead.0)
            .bind(a.job.0)
            .bind(a.job_version)
            .bind(ranks)
            .fetch_optional(&mut tx)
            .await?;
            let Some(attempts) = attempts else {
                return Err(StoreError::Stale(format!(
                    "job {} changed since planning",
                    a.job
                )));
            };
            let (gang_lead, master_port) = if group.len() > 1 {
                let held: Vec<i64> = query_scalar(
                    "SELECT DISTINCT master_port FROM attempts WHERE master_port IS NOT NULL \
                     AND state IN ('assigned', 'running', 'preempting')",
                )
                .fetch_all(&mut tx)
                .await?;
                let held: Vec<u16> = held
                    .into_iter()
                    .filter_map(|p| u16::try_from(p).ok())
                    .collect();
                let Some(port) = gang::master_port(&held) else {
                    return Err(StoreError::Stale(format!(
                        "job {}: every MASTER_PORT is held by a live gang",
                        a.job
                    )));
                };
                (Some(lead.0), Some(i64::from(port)))
            } else {
                (None, None)
            };
            for (k, a) in group.iter().enumerate() {
                let attempt_no = attempts - ranks + 1 + k as i64;
                query(
                    "INSERT INTO attempts (id, job_id, attempt_no, node_id, pool_id, epoch, \
                     gpus_json, market, state, estimated_cost_micros, expected_end, created_at, \
                     hourly_rate_micros, node_rank, gang_lead, master_port, hourly_cash_micros) \
                     VALUES ($1, $2, $3, $4, $5, $3, $6, $7, 'assigned', $8, $9, $10, $11, \
                     $12, $13, $14, $15)",
                )
                .bind(a.id.0)
                .bind(a.job.0)
                .bind(attempt_no)
                .bind(a.node.as_str())
                .bind(a.pool.as_str())
                .bind(gpus_json(&a.gpus))
                .bind(market_str(a.market))
                .bind(a.estimated_cost.micros())
                .bind(a.expected_end)
                .bind(now)
                .bind(a.hourly_rate.micros())
                .bind(i64::from(a.rank))
                .bind(gang_lead)
                .bind(master_port)
                .bind(a.hourly_cash.micros())
                .execute(&mut tx)
                .await?;
            }
        }
        tx.commit().await?;
        Ok(())
    }

    /// Preemption: each `running` victim becomes `preempting` — it keeps its GPUs, and its
    /// agent is told to stop it (checkpoint signal, grace, kill); when the agent reports the
    /// end, the attempt becomes `preempted` and its job goes back to the queue with `why`
    /// (which notes the progress made). Victims not running (yet, or any more) are left alone.
    /// Returns the attempts now stopping.
    pub async fn preempt_attempts(
        &self,
        victims: &[(AttemptId, String)],
    ) -> StoreResult<Vec<(NodeId, AttemptRef)>> {
        let mut tx = self.leader_tx().await?;
        let mut stopping = Vec::with_capacity(victims.len());
        for (attempt, why) in victims {
            let row = query(
                "UPDATE attempts SET state = 'preempting', error = $1 \
                 WHERE id = $2 AND state = 'running' \
                 RETURNING id, job_id, epoch, node_id, gang_lead",
            )
            .bind(why)
            .bind(attempt.0)
            .fetch_optional(&mut tx)
            .await?;
            let Some(row) = row else { continue };
            let victim = attempt_ref_from_row(&row)?;
            // A gang is preempted whole: its other running ranks stop too.
            if let Some(lead) = row.uuid_opt("gang_lead")? {
                let ranks = query(
                    "UPDATE attempts SET state = 'preempting', error = $1 \
                     WHERE gang_lead = $2 AND id <> $3 AND state = 'running' \
                     RETURNING id, job_id, epoch, node_id",
                )
                .bind(why)
                .bind(lead)
                .bind(attempt.0)
                .fetch_all(&mut tx)
                .await?;
                for r in &ranks {
                    stopping.push((NodeId(r.get("node_id")?), attempt_ref_from_row(r)?));
                }
            }
            query("UPDATE jobs SET reason = $1, version = version + 1 WHERE id = $2")
                .bind(why)
                .bind(victim.job_id)
                .execute(&mut tx)
                .await?;
            stopping.push((NodeId(row.get("node_id")?), victim));
        }
        tx.commit().await?;
        Ok(stopping)
    }

    /// Policy holds from the planner: `Some(reason)` makes a waiting job `held` with that
    /// reason, `None` returns a held job to `queued`. Jobs that left the queue meanwhile are
    /// left alone. Versions are not bumped: held jobs are still the planner's to place.
    pub async fn set_holds(&self, changes: &[(JobId, Option<String>)]) -> StoreResult<()> {
        let mut tx = self.leader_tx().await?;
        for (job, reason) in changes {
            match reason {
                Some(reason) => query(
                    "UPDATE jobs SET state = 'held', reason = $1 \
                     WHERE id = $2 AND state IN ('queued', 'held')",
                )
                .bind(reason)
                .bind(job.0),
                None => query(
                    "UPDATE jobs SET state = 'queued', reason = NULL \
                     WHERE id = $1 AND state = 'held'",
                )
                .bind(job.0),
            }
            .execute(&mut tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }
}

/// Stores the explanation of a job's placement, only while that attempt is still its current
/// one (a job placed again since keeps its newer explanation); binds json, job, attempt.
const SET_EXPLANATION: &str =
    "UPDATE jobs SET explanation_json = $1 WHERE id = $2 AND current_attempt = $3";

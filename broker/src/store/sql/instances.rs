//! Burst instances: launched, failed, idle, ended — and what ending one does to its node's work.

use super::*;

impl Store {
    pub async fn instances(&self, include_terminated: bool) -> StoreResult<Vec<InstanceRecord>> {
        let rows = query(
            "SELECT * FROM instances WHERE ($1 OR state <> 'terminated') \
             ORDER BY requested_at, id COLLATE \"C\"",
        )
        .bind(include_terminated)
        .fetch_all(&self.db)
        .await?;
        rows.iter().map(instance_from_row).collect()
    }

    /// Pools backed off after capacity or quota errors, with until when.
    pub async fn pool_backoffs(&self, now: Timestamp) -> StoreResult<Vec<(PoolId, Timestamp)>> {
        let rows = query("SELECT id, backoff_until FROM pools WHERE backoff_until > $1")
            .bind(now)
            .fetch_all(&self.db)
            .await?;
        rows.iter()
            .map(|r| Ok((PoolId(r.get("id")?), r.time("backoff_until")?)))
            .collect()
    }

    /// The provider accepted the launch: `requested → booting`, with the provider's id. The
    /// machine may have booted and its agent enrolled before the answer came (cloud-init runs
    /// before an Azure create operation ends): an instance already past `requested` that has no
    /// provider id yet gets it, so it can be terminated and reaped by it.
    pub async fn instance_launched(
        &self,
        id: &str,
        provider_id: &str,
        now: Timestamp,
    ) -> StoreResult<()> {
        let mut tx = self.leader_tx().await?;
        let launched = query(
            "UPDATE instances SET state = 'booting', provider_id = $1, launched_at = $2, \
             launch_attempts = launch_attempts + 1, last_error = NULL \
             WHERE id = $3 AND state = 'requested'",
        )
        .bind(provider_id)
        .bind(now)
        .bind(id)
        .execute(&mut tx)
        .await?;
        if launched.rows_affected() == 0 {
            query(
                "UPDATE instances SET provider_id = $1, launched_at = COALESCE(launched_at, $2), \
                 launch_attempts = launch_attempts + 1, last_error = NULL \
                 WHERE id = $3 AND provider_id IS NULL AND state IN ('booting', 'ready', 'draining')",
            )
            .bind(provider_id)
            .bind(now)
            .bind(id)
            .execute(&mut tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    pub async fn instance_launch_failed(
        &self,
        id: &str,
        error: &str,
        next: LaunchFailure,
        now: Timestamp,
    ) -> StoreResult<()> {
        let mut tx = self.leader_tx().await?;
        match next {
            LaunchFailure::RetryAt(at) => {
                query(
                    "UPDATE instances SET launch_attempts = launch_attempts + 1, last_error = $1, \
                     next_attempt_at = $2 WHERE id = $3 AND state = 'requested'",
                )
                .bind(error)
                .bind(at)
                .bind(id)
                .execute(&mut tx)
                .await?;
            }
            LaunchFailure::GiveUp { pool_backoff_until } => {
                let row = query("SELECT pool_id, for_job FROM instances WHERE id = $1")
                    .bind(id)
                    .fetch_optional(&mut tx)
                    .await?;
                query(
                    "UPDATE instances SET state = 'terminated', \
                     launch_attempts = launch_attempts + 1, last_error = $1, ended_at = $2 \
                     WHERE id = $3 AND state = 'requested'",
                )
                .bind(error)
                .bind(now)
                .bind(id)
                .execute(&mut tx)
                .await?;
                if let Some(row) = row {
                    let pool: String = row.get("pool_id")?;
                    if let Some(until) = pool_backoff_until {
                        query(
                            "UPDATE pools SET backoff_until = $1, \
                             recent_capacity_failures = recent_capacity_failures + 1 WHERE id = $2",
                        )
                        .bind(until)
                        .bind(&pool)
                        .execute(&mut tx)
                        .await?;
                    }
                    if let Some(job) = row.uuid_opt("for_job")? {
                        // A gang's other instances not launched yet are not launched at all:
                        // the job goes back to the planner whole (those already launched
                        // join the pool, and its idle TTL ends them if the re-plan goes
                        // elsewhere).
                        query(
                            "UPDATE instances SET state = 'terminated', last_error = $1, \
                             ended_at = $2 WHERE for_job = $3 AND id <> $4 AND state = 'requested'",
                        )
                        .bind(format!(
                            "not launched: its gang's launch {id} in {pool} failed"
                        ))
                        .bind(now)
                        .bind(job)
                        .bind(id)
                        .execute(&mut tx)
                        .await?;
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

    pub async fn set_instance_idle(
        &self,
        id: &str,
        idle_since: Option<Timestamp>,
    ) -> StoreResult<()> {
        let mut tx = self.leader_tx().await?;
        query("UPDATE instances SET idle_since = $1 WHERE id = $2")
            .bind(idle_since)
            .bind(id)
            .execute(&mut tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Ends an instance in one transaction: state `terminated`, its lifetime cost in the
    /// ledger (at least `min_billed_s`), its node retired and the node's live work requeued, and
    /// a job still waiting for it back in the queue. `reason` is kept as its `end_reason`, and
    /// as its `last_error` too when `error` (a boot timeout, gone at the provider; not a normal
    /// idle shutdown). Returns false if it had already ended.
    pub async fn end_instance(
        &self,
        id: &str,
        reason: Option<&str>,
        error: bool,
        min_billed_s: i64,
        now: Timestamp,
    ) -> StoreResult<bool> {
        let mut tx = self.leader_tx().await?;
        let Some(row) = query("SELECT * FROM instances WHERE id = $1")
            .bind(id)
            .fetch_optional(&mut tx)
            .await?
        else {
            return Ok(false);
        };
        let inst = instance_from_row(&row)?;
        if inst.state == InstanceState::Terminated {
            return Ok(false);
        }
        query(
            "UPDATE instances SET state = 'terminated', ended_at = $1, \
             end_reason = COALESCE($2, end_reason), \
             last_error = CASE WHEN $4 THEN COALESCE($2, last_error) ELSE last_error END, billed = TRUE WHERE id = $3",
        )
        .bind(now)
        .bind(reason)
        .bind(id)
        .bind(error)
        .execute(&mut tx)
        .await?;
        // Its cost up to now (at least the minimum billed time), charged to the work on it,
        // before that work is ended below.
        ledger::settle_instance(&mut tx, id, min_billed_s, now).await?;
        if let Some(node) = &inst.node {
            query("UPDATE nodes SET healthy = FALSE, revoked = TRUE WHERE id = $1")
                .bind(node.as_str())
                .execute(&mut tx)
                .await?;
            let why = format!("instance {id} ended: {}", reason.unwrap_or("terminated"));
            end_node_work(
                &mut tx,
                node.as_str(),
                "lost",
                &why,
                now,
                NodeWorkKept::Nothing,
            )
            .await?;
        }
        // Unless the job now waits for another instance: it ran here, was requeued (a GPU fell
        // off the bus, issue 28) and the planner asked for a fresh one.
        let waits_elsewhere: Option<String> = match inst.for_job {
            None => None,
            Some(job) => {
                query_scalar(
                    "SELECT id FROM instances WHERE for_job = $1 AND id <> $2 \
                     AND state IN ('requested', 'booting') LIMIT 1",
                )
                .bind(job.0)
                .bind(id)
                .fetch_optional(&mut tx)
                .await?
            }
        };
        if let (Some(job), None) = (inst.for_job, waits_elsewhere) {
            let why = format!("instance {id} ended before the job was placed");
            requeue_provisioning(&mut tx, job.0, &why).await?;
        }
        tx.commit().await?;
        Ok(true)
    }
}

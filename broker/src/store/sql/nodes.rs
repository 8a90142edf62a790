//! Nodes: enrolment, heartbeats, lease expiry, revocation, interruption notices, GPU health
//! marks (`apply_gpu_health`: the verdicts of `rules/health.rs`, and the work of a GPU that fell
//! off the bus requeued), an operator's drain and undrain (audited), and what the agent of a
//! node is told to run or stop.

use super::*;
use crate::rules::health::{self, GpuMark};
use switchyard_protocol::agent::{GpuInfo, ReplicaReport};

impl Store {
    pub async fn register_node(
        &self,
        enrolment_hash: &str,
        node: NewNode,
        now: Timestamp,
    ) -> StoreResult<Result<NodeRecord, RegisterRefusal>> {
        let mut tx = self.write_tx().await?;
        let Some(row) = query("SELECT * FROM enrolment_tokens WHERE token_hash = $1")
            .bind(enrolment_hash)
            .fetch_optional(&mut tx)
            .await?
        else {
            return Ok(Err(RegisterRefusal::UnknownToken));
        };
        if row.time_opt("used_at")?.is_some() {
            return Ok(Err(RegisterRefusal::AlreadyUsed));
        }
        if row.time("expires_at")? < now {
            return Ok(Err(RegisterRefusal::Expired));
        }
        // A token minted for a launched instance enrols that instance only while it boots:
        // once the broker gave the instance up (boot timeout, terminated), its token is dead.
        if let Some(instance) = row.get::<Option<String>>("instance_id")? {
            let booting: Option<String> = query_scalar(
                "SELECT id FROM instances WHERE id = $1 AND state IN ('requested', 'booting')",
            )
            .bind(&instance)
            .fetch_optional(&mut tx)
            .await?;
            if booting.is_none() {
                return Ok(Err(RegisterRefusal::InstanceGone));
            }
        }
        let pool_id: String = row.get("pool_id")?;
        let used = query(
            "UPDATE enrolment_tokens SET used_at = $1, node_id = $2 \
             WHERE token_hash = $3 AND used_at IS NULL",
        )
        .bind(now)
        .bind(node.id.as_str())
        .bind(enrolment_hash)
        .execute(&mut tx)
        .await?;
        if used.rows_affected() != 1 {
            return Ok(Err(RegisterRefusal::AlreadyUsed));
        }
        query(
            "INSERT INTO nodes (id, pool_id, token_hash, hostname, gpus_total, inventory_json, \
             healthy, registered_at, last_heartbeat, address) \
             VALUES ($1, $2, $3, $4, $5, $6, TRUE, $7, $7, $8)",
        )
        .bind(node.id.as_str())
        .bind(&pool_id)
        .bind(&node.token_hash)
        .bind(&node.hostname)
        .bind(i64::from(node.gpus_total))
        .bind(&node.inventory_json)
        .bind(now)
        .bind(&node.address)
        .execute(&mut tx)
        .await?;
        if let Some(instance) = row.get::<Option<String>>("instance_id")? {
            query(
                // An agent may enrol before the broker heard its launch answered (an answer
                // lost or late): bill it from now at the latest, never not at all.
                "UPDATE instances SET state = 'ready', node_id = $1, ready_at = $2, \
                 idle_since = $2, launched_at = COALESCE(launched_at, $2) \
                 WHERE id = $3 AND state IN ('requested', 'booting')",
            )
            .bind(node.id.as_str())
            .bind(now)
            .bind(&instance)
            .execute(&mut tx)
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
            gpu_marks: Vec::new(),
        }))
    }

    pub async fn node_by_token_hash(&self, hash: &str) -> StoreResult<Option<NodeRecord>> {
        let row = query("SELECT * FROM nodes WHERE token_hash = $1")
            .bind(hash)
            .fetch_optional(&self.db)
            .await?;
        row.as_ref().map(node_from_row).transpose()
    }

    /// Revokes node `node`'s agent token: the node is marked revoked and unhealthy, and its
    /// live attempts end `lost` with their jobs requeued (a revoked agent can no longer
    /// report), in one transaction. Returns the requeued jobs, `None` when there is no such
    /// node or it was revoked already.
    pub async fn revoke_node(
        &self,
        node: &NodeId,
        why: &str,
        now: Timestamp,
    ) -> StoreResult<Option<Vec<JobId>>> {
        let mut tx = self.write_tx().await?;
        let marked =
            query("UPDATE nodes SET revoked = TRUE, healthy = FALSE WHERE id = $1 AND NOT revoked")
                .bind(node.as_str())
                .execute(&mut tx)
                .await?;
        if marked.rows_affected() != 1 {
            return Ok(None);
        }
        let (_, requeued) = end_node_work(
            &mut tx,
            node.as_str(),
            "lost",
            why,
            now,
            NodeWorkKept::Nothing,
        )
        .await?;
        tx.commit().await?;
        Ok(Some(requeued))
    }

    pub async fn nodes(&self) -> StoreResult<Vec<NodeRecord>> {
        let rows = query("SELECT * FROM nodes WHERE NOT revoked ORDER BY id COLLATE \"C\"")
            .fetch_all(&self.db)
            .await?;
        rows.iter().map(node_from_row).collect()
    }

    /// Records a heartbeat and answers it: whether the node was unhealthy before (it came
    /// back), and which attempts its agent must stop ([`heartbeat_stops`]). `running` is what
    /// the agent says it runs.
    pub async fn heartbeat(
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
        let was_healthy = match &self.db {
            Db::Sqlite(p) => sqlite::touch_node(p, node.as_str(), &inventory_json, now).await?,
            Db::Postgres(p) => postgres::touch_node(p, node.as_str(), &inventory_json, now).await?,
        };
        Ok(HeartbeatOutcome {
            came_back: was_healthy == Some(false),
            stop: self.node_stops(node, running).await?,
        })
    }

    /// Writes heartbeats of healthy nodes in one transaction. `last_heartbeat` only moves
    /// forward (a later heartbeat already written wins, inventory included). A node that is
    /// not healthy (lost since the heartbeat was received) or unknown is left as it is: its
    /// next heartbeat goes through [`Store::heartbeat`], which brings it back and tells the
    /// scheduler. Returns the rows written.
    pub async fn record_heartbeats(&self, beats: &[HeartbeatWrite]) -> StoreResult<u64> {
        if beats.is_empty() {
            return Ok(0);
        }
        match &self.db {
            Db::Sqlite(p) => sqlite::record_heartbeats(p, beats).await,
            Db::Postgres(p) => postgres::record_heartbeats(p, beats).await,
        }
    }

    /// Which attempts the node's agent must stop ([`heartbeat_stops`]); `running` is what the
    /// agent says it runs.
    pub async fn node_stops(
        &self,
        node: &NodeId,
        running: &[AttemptRef],
    ) -> StoreResult<Vec<AttemptRef>> {
        let rows = query(NODE_LIVE_ATTEMPTS)
            .bind(node.as_str())
            .fetch_all(&self.db)
            .await?;
        let live = rows
            .iter()
            .map(|r| {
                Ok((
                    attempt_ref_from_row(r)?,
                    r.get::<String>("state")?,
                    r.get::<bool>("cancel_requested")?,
                ))
            })
            .collect::<StoreResult<Vec<_>>>()?;
        Ok(heartbeat_stops(&live, running))
    }

    /// Marks nodes whose last heartbeat is older than `before` as lost and requeues their live
    /// attempts. Returns the lost nodes and the requeued jobs.
    pub async fn expire_leases(
        &self,
        before: Timestamp,
        now: Timestamp,
    ) -> StoreResult<ExpiredLeases> {
        let mut tx = self.leader_tx().await?;
        // FOR UPDATE: a heartbeat committing meanwhile is re-checked against the condition.
        let lost: Vec<String> = query_scalar(AssertSqlSafe(format!(
            "SELECT id FROM nodes WHERE healthy AND NOT revoked AND last_heartbeat < $1 \
             ORDER BY id COLLATE \"C\"{}",
            self.dialect().for_update
        )))
        .bind(before)
        .fetch_all(&mut tx)
        .await?;
        let mut out = ExpiredLeases::default();
        for node in lost {
            query("UPDATE nodes SET healthy = FALSE WHERE id = $1")
                .bind(&node)
                .execute(&mut tx)
                .await?;
            out.requeued.extend(
                end_node_work(
                    &mut tx,
                    &node,
                    "lost",
                    "node lost: no heartbeat within the lease TTL",
                    now,
                    NodeWorkKept::Nothing,
                )
                .await?
                .1,
            );
            out.nodes.push(NodeId(node));
        }
        tx.commit().await?;
        Ok(out)
    }

    pub async fn leases_for_node(&self, node: &NodeId) -> StoreResult<Vec<LeaseRecord>> {
        let rows = query(
            "SELECT a.id, a.job_id, a.epoch, a.gpus_json, a.node_rank, a.gang_lead, \
             a.master_port, j.core_spec_json, j.trace_parent, j.serve_json FROM attempts a \
             JOIN jobs j ON j.id = a.job_id \
             WHERE a.node_id = $1 AND a.state = 'assigned' AND NOT j.cancel_requested \
             ORDER BY a.created_at, a.id",
        )
        .bind(node.as_str())
        .fetch_all(&self.db)
        .await?;
        let mut leases = Vec::with_capacity(rows.len());
        for r in &rows {
            let spec = parse_spec(&r.get::<String>("core_spec_json")?)?;
            let gang_env = match gang_from_row(r)? {
                None => Vec::new(),
                Some(g) => {
                    // The gang's nodes in rank order, as the other nodes reach them.
                    let addresses: Vec<String> = query_scalar(
                        "SELECT COALESCE(n.address, n.hostname) FROM attempts a \
                         JOIN nodes n ON n.id = a.node_id \
                         WHERE a.gang_lead = $1 ORDER BY a.node_rank",
                    )
                    .bind(g.lead)
                    .fetch_all(&self.db)
                    .await?;
                    let port = r
                        .get::<Option<i64>>("master_port")?
                        .and_then(|p| u16::try_from(p).ok())
                        .ok_or_else(|| corrupt("a gang's attempt without a master port"))?;
                    gang::env(g.rank, &addresses, spec.resources.gpus, port)
                }
            };
            leases.push(LeaseRecord {
                attempt: AttemptId(r.uuid("id")?),
                job: JobId(r.uuid("job_id")?),
                epoch: epoch_of(r)?,
                gpus: parse_gpus(&r.get::<String>("gpus_json")?)?,
                spec,
                trace_parent: r.get("trace_parent")?,
                serve: r
                    .get::<Option<String>>("serve_json")?
                    .map(|s| {
                        serde_json::from_str(&s)
                            .map_err(|e| corrupt(format!("bad serve spec: {e}")))
                    })
                    .transpose()?,
                gang_env,
            });
        }
        Ok(leases)
    }

    /// Where the node's service replicas listen and whether they pass their readiness probe,
    /// as its agent reports them in heartbeats. Only a live attempt (assigned or running) of a
    /// replica job that this node holds at that epoch is written, and only what changed: a
    /// read first, the write lock only when something did. A change of readiness is a
    /// service event. Returns the replicas whose readiness changed.
    pub async fn record_serving(
        &self,
        node: &NodeId,
        reports: &[ReplicaReport],
        now: Timestamp,
    ) -> StoreResult<Vec<ReadinessChange>> {
        let mut changed = Vec::new();
        for report in reports {
            let Some(current) = serving_row(&self.db, node, report).await? else {
                continue;
            };
            if current.0 == Some(report.host.clone())
                && current.1 == Some(i64::from(report.port))
                && current.2 == report.ready
            {
                continue;
            }
            let mut tx = self.write_tx().await?;
            // Again under the lock: the attempt may have ended meanwhile.
            let Some((_, _, was_ready, service)) = serving_row(&mut tx, node, report).await? else {
                continue;
            };
            query("UPDATE attempts SET serve_host = $1, serve_port = $2, ready = $3 WHERE id = $4")
                .bind(&report.host)
                .bind(i64::from(report.port))
                .bind(report.ready)
                .bind(report.attempt.attempt_id)
                .execute(&mut tx)
                .await?;
            if was_ready != report.ready {
                let (kind, how) = if report.ready {
                    ("replica_ready", "ready")
                } else {
                    ("replica_not_ready", "not ready: its readiness probe fails")
                };
                let message = format!(
                    "replica {} on {node} at {}:{} is {how}",
                    report.attempt.job_id, report.host, report.port
                );
                query(
                    "INSERT INTO service_events (service_id, at, kind, message) \
                     VALUES ($1, $2, $3, $4)",
                )
                .bind(service)
                .bind(now)
                .bind(kind)
                .bind(message)
                .execute(&mut tx)
                .await?;
                changed.push(ReadinessChange {
                    service,
                    job: JobId(report.attempt.job_id),
                    ready: report.ready,
                });
            }
            tx.commit().await?;
        }
        Ok(changed)
    }

    /// Live attempts on the node whose job was cancelled: the agent must stop them.
    pub async fn stops_for_node(&self, node: &NodeId) -> StoreResult<Vec<AttemptRef>> {
        let rows = query(
            "SELECT a.id, a.job_id, a.epoch FROM attempts a JOIN jobs j ON j.id = a.job_id \
             WHERE a.node_id = $1 \
             AND ((a.state = 'running' AND j.cancel_requested) OR a.state = 'preempting')",
        )
        .bind(node.as_str())
        .fetch_all(&self.db)
        .await?;
        rows.iter().map(attempt_ref_from_row).collect()
    }

    /// A spot interruption notice from the node's agent, in one transaction: the node drains
    /// (no new work), a burst instance bound to it becomes `draining`, and its live attempts
    /// become `preempted` with their jobs back in the queue (`why` as the reason). Idempotent:
    /// a repeated notice only takes what was assigned to the node since.
    pub async fn interrupt_node(
        &self,
        node: &NodeId,
        why: &str,
        now: Timestamp,
    ) -> StoreResult<NodeInterruption> {
        let mut tx = self.write_tx().await?;
        let marked = query("UPDATE nodes SET draining = TRUE WHERE id = $1 AND NOT draining")
            .bind(node.as_str())
            .execute(&mut tx)
            .await?;
        let instances: Vec<String> = query_scalar(
            "SELECT id FROM instances WHERE node_id = $1 AND state IN ('booting', 'ready') \
             ORDER BY id COLLATE \"C\"",
        )
        .bind(node.as_str())
        .fetch_all(&mut tx)
        .await?;
        for id in &instances {
            query("UPDATE instances SET state = 'draining' WHERE id = $1")
                .bind(id)
                .execute(&mut tx)
                .await?;
        }
        let (stopped, requeued) = end_node_work(
            &mut tx,
            node.as_str(),
            "preempted",
            why,
            now,
            NodeWorkKept::RunningReplicas,
        )
        .await?;
        tx.commit().await?;
        Ok(NodeInterruption {
            newly_draining: marked.rows_affected() == 1,
            stopped,
            requeued,
            instances,
        })
    }
}

impl Store {
    /// A heartbeat's GPUs judged by the health rules ([`health::assess`]) against the node's
    /// stored marks, in one transaction (the row locked, so two heartbeats cannot both add a
    /// mark): the marks are written only when they change; the node of a launched instance
    /// with a sticky mark drains (the burst controller replaces it); and the live attempts holding a GPU
    /// newly fallen off the bus (XID 79) end `lost`, their jobs requeued with the mark's reason
    /// (a gang's other ranks are stopped and requeued with it, as for a lost node). Other marks
    /// leave running work alone. Unknown node: nothing.
    pub async fn apply_gpu_health(
        &self,
        node: &NodeId,
        gpus: &[GpuInfo],
        now: Timestamp,
    ) -> StoreResult<GpuHealthChange> {
        let mut tx = self.write_tx().await?;
        let Some(stored) = query_scalar::<Option<String>>(AssertSqlSafe(format!(
            "SELECT gpu_marks_json FROM nodes WHERE id = $1{}",
            self.dialect().for_update
        )))
        .bind(node.as_str())
        .fetch_optional(&mut tx)
        .await?
        else {
            return Ok(GpuHealthChange::default());
        };
        let marks: Vec<GpuMark> = match stored {
            None => Vec::new(),
            Some(json) => {
                serde_json::from_str(&json).map_err(|e| corrupt(format!("node GPU marks: {e}")))?
            }
        };
        let Some(verdict) = health::assess(gpus, &marks, now.millis()) else {
            return Ok(GpuHealthChange::default());
        };
        query("UPDATE nodes SET gpu_marks_json = $1 WHERE id = $2")
            .bind(health::to_json(&verdict.marks))
            .bind(node.as_str())
            .execute(&mut tx)
            .await?;
        let mut out = GpuHealthChange {
            changed: true,
            ..GpuHealthChange::default()
        };
        if health::first_sticky(&verdict.marks).is_some() {
            // A launched instance is replaced (burst.rs): its node drains now, in the same
            // commit, so that the planner puts nothing there meanwhile (not even the work
            // requeued below).
            let instances = query(
                "UPDATE instances SET state = 'draining' \
                 WHERE node_id = $1 AND state IN ('booting', 'ready')",
            )
            .bind(node.as_str())
            .execute(&mut tx)
            .await?
            .rows_affected();
            if instances > 0 {
                query("UPDATE nodes SET draining = TRUE WHERE id = $1")
                    .bind(node.as_str())
                    .execute(&mut tx)
                    .await?;
                out.stopped
                    .extend(requeue_assigned(&mut tx, node, now).await?);
            }
        }
        if !verdict.fell_off.is_empty() {
            let rows = query(
                "SELECT id, job_id, epoch, node_rank, gang_lead, gpus_json FROM attempts \
                 WHERE node_id = $1 AND state IN ('assigned', 'running', 'preempting') \
                 ORDER BY created_at, id",
            )
            .bind(node.as_str())
            .fetch_all(&mut tx)
            .await?;
            for row in &rows {
                let held = parse_gpus(&row.get::<String>("gpus_json")?)?;
                let Some(gpu) = held.iter().find(|g| verdict.fell_off.contains(g)) else {
                    continue;
                };
                let why = verdict
                    .marks
                    .iter()
                    .find(|m| m.gpu == *gpu && m.xid == Some(health::XID_FELL_OFF_THE_BUS))
                    .map_or_else(
                        || format!("GPU {gpu} fell off the bus"),
                        |m| m.reason.clone(),
                    );
                let attempt =
                    events::requeue_attempt(&mut tx, node.as_str(), row, "lost", &why, now).await?;
                out.requeued.push(JobId(attempt.job_id));
                out.stopped.push(attempt);
            }
        }
        tx.commit().await?;
        out.marks = verdict.marks;
        Ok(out)
    }

    /// An operator drains (`drain`) or undrains a node, in one transaction with its audit entry
    /// (`node.drain` / `node.undrain`, the node's draining flag and GPU marks before and after).
    /// Draining stops new work; running work finishes, and work assigned there but not started
    /// is requeued (a draining agent takes no new lease). Undraining also clears the GPU marks:
    /// the operator vouches for the GPUs (an ECC count that is still there marks its GPU again
    /// on the next heartbeat). `None`: no such node (or it was revoked).
    pub async fn set_node_drain(
        &self,
        node: &NodeId,
        drain: bool,
        actor: &str,
        now: Timestamp,
    ) -> StoreResult<Option<NodeRecord>> {
        let mut tx = self.write_tx().await?;
        let Some(row) = query(AssertSqlSafe(format!(
            "SELECT * FROM nodes WHERE id = $1 AND NOT revoked{}",
            self.dialect().for_update
        )))
        .bind(node.as_str())
        .fetch_optional(&mut tx)
        .await?
        else {
            return Ok(None);
        };
        let mut record = node_from_row(&row)?;
        let before = serde_json::json!({
            "draining": record.draining,
            "gpu_marks": record.gpu_marks,
        });
        if drain {
            query("UPDATE nodes SET draining = TRUE WHERE id = $1")
                .bind(node.as_str())
                .execute(&mut tx)
                .await?;
            requeue_assigned(&mut tx, node, now).await?;
        } else {
            query("UPDATE nodes SET draining = FALSE, gpu_marks_json = NULL WHERE id = $1")
                .bind(node.as_str())
                .execute(&mut tx)
                .await?;
            record.gpu_marks.clear();
        }
        record.draining = drain;
        let after = serde_json::json!({
            "draining": record.draining,
            "gpu_marks": record.gpu_marks,
        });
        insert_audit(
            &mut tx,
            &NewAuditEntry {
                at: now,
                actor: actor.to_string(),
                action: if drain { "node.drain" } else { "node.undrain" }.into(),
                target: format!("node:{node}"),
                before_json: Some(before.to_string()),
                after_json: Some(after.to_string()),
            },
        )
        .await?;
        tx.commit().await?;
        Ok(Some(record))
    }

    /// A launched instance whose node has a sick GPU is to be replaced: its node drains (no new
    /// work; work assigned but not started is requeued) and the instance becomes `draining`, in
    /// one transaction. Idempotent; returns whether anything changed.
    pub async fn drain_for_replacement(
        &self,
        instance: &str,
        node: &NodeId,
        now: Timestamp,
    ) -> StoreResult<bool> {
        let mut tx = self.write_tx().await?;
        let n = query("UPDATE nodes SET draining = TRUE WHERE id = $1 AND NOT draining")
            .bind(node.as_str())
            .execute(&mut tx)
            .await?
            .rows_affected();
        let i = query(
            "UPDATE instances SET state = 'draining' WHERE id = $1 AND state IN ('booting', 'ready')",
        )
        .bind(instance)
        .execute(&mut tx)
        .await?
        .rows_affected();
        let requeued = requeue_assigned(&mut tx, node, now).await?;
        tx.commit().await?;
        Ok(n + i > 0 || !requeued.is_empty())
    }
}

/// A node drains: its attempts assigned but not started go back to the queue (a draining agent
/// takes no new lease, so they would wait for the undrain). Running work finishes. Returns them.
async fn requeue_assigned(
    tx: &mut Tx,
    node: &NodeId,
    now: Timestamp,
) -> StoreResult<Vec<AttemptRef>> {
    let rows = query(
        "SELECT id, job_id, epoch, node_rank, gang_lead FROM attempts \
         WHERE node_id = $1 AND state = 'assigned' ORDER BY created_at, id",
    )
    .bind(node.as_str())
    .fetch_all(&mut *tx)
    .await?;
    let why = format!("node {node} was drained before the job started");
    let mut out = Vec::with_capacity(rows.len());
    for row in &rows {
        out.push(events::requeue_attempt(tx, node.as_str(), row, "preempted", &why, now).await?);
    }
    Ok(out)
}

/// A node's attempts a heartbeat answers about (see [`heartbeat_stops`]); binds the node id.
const NODE_LIVE_ATTEMPTS: &str = "SELECT a.id, a.job_id, a.epoch, a.state, \
     j.cancel_requested FROM attempts a JOIN jobs j ON j.id = a.job_id \
     WHERE a.node_id = $1 AND a.state IN ('assigned', 'running', 'preempting')";

/// A replica's serving columns (host, port, ready) and its service, when the report names a
/// live attempt of a replica job on `node` at its epoch.
async fn serving_row<'c>(
    ex: impl Into<Ex<'c>>,
    node: &NodeId,
    report: &ReplicaReport,
) -> StoreResult<Option<(Option<String>, Option<i64>, bool, Uuid)>> {
    let Ok(epoch) = i64::try_from(report.attempt.epoch) else {
        return Ok(None);
    };
    let row = query(
        "SELECT a.serve_host, a.serve_port, a.ready, j.service_id FROM attempts a \
         JOIN jobs j ON j.id = a.job_id \
         WHERE a.id = $1 AND a.job_id = $2 AND a.node_id = $3 AND a.epoch = $4 \
         AND a.state IN ('assigned', 'running') AND j.service_id IS NOT NULL",
    )
    .bind(report.attempt.attempt_id)
    .bind(report.attempt.job_id)
    .bind(node.as_str())
    .bind(epoch)
    .fetch_optional(ex)
    .await?;
    row.map(|r| {
        Ok((
            r.get("serve_host")?,
            r.get("serve_port")?,
            r.get("ready")?,
            r.uuid("service_id")?,
        ))
    })
    .transpose()
}

//! Agents' reports carried out (`apply_events`: the lease rule in `rules/lease.rs` decides,
//! this applies its verdict), and the endings of attempts shared with nodes and instances.

use super::*;

impl Store {
    /// Applies agent events in order, in one transaction. Returns one result per event and the
    /// attempts that ended.
    pub async fn apply_events(
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
            let row = query(
                "SELECT a.state, a.attempt_no, a.node_rank, a.gang_lead, j.cancel_requested \
                 FROM attempts a \
                 JOIN jobs j ON j.id = a.job_id \
                 WHERE a.id = $1 AND a.job_id = $2 AND a.node_id = $3 AND a.epoch = $4",
            )
            .bind(attempt.attempt_id)
            .bind(attempt.job_id)
            .bind(node.as_str())
            .bind(epoch)
            .fetch_optional(&mut tx)
            .await?;
            let (state, attempt_no, cancel_requested, gang) = match &row {
                Some(row) => {
                    let text: String = row.get("state")?;
                    let state = AttemptState::parse(&text)
                        .ok_or_else(|| corrupt(format!("bad attempt state {text:?}")))?;
                    (
                        Some(state),
                        row.get::<i64>("attempt_no")?,
                        row.get::<bool>("cancel_requested")?,
                        gang_from_row(row)?,
                    )
                }
                None => (None, 0, false, None),
            };
            // The job's `current_attempt`: the attempt, or its gang's rank 0.
            let lead = gang.as_ref().map_or(attempt.attempt_id, |g| g.lead);
            // The lease rule decides (`lease.rs`); this carries its verdict out.
            let result = match (lease::judge(state, event, cancel_requested), event) {
                (Verdict::Reject(why), _) => rejected(why),
                (Verdict::Duplicate, _) => duplicate(),
                (Verdict::Start, _) => {
                    query("UPDATE attempts SET state = 'running', started_at = $1 WHERE id = $2")
                        .bind(now)
                        .bind(attempt.attempt_id)
                        .execute(&mut tx)
                        .await?;
                    // A gang runs from its first rank's start.
                    query(
                        "UPDATE jobs SET state = 'running', started_at = $1, \
                         version = version + 1 WHERE id = $2 AND current_attempt = $3 \
                         AND state = 'placed'",
                    )
                    .bind(now)
                    .bind(attempt.job_id)
                    .bind(lead)
                    .execute(&mut tx)
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
                        let found: Option<i64> = query_scalar(
                            "SELECT seq FROM log_chunks WHERE attempt_id = $1 AND seq = $2",
                        )
                        .bind(id)
                        .bind(n)
                        .fetch_optional(&mut *tx)
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
                    let inserted = query(
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
                    .bind(now)
                    .execute(&mut tx)
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
                    let job = finish_requeued(
                        &mut tx, attempt, *exit_code, *signal, now, how, &mut ended,
                    )
                    .await?;
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
                    query(
                        "UPDATE attempts SET state = 'finished', finished_at = $1, \
                         exit_code = $2, signal = $3, error = $4 WHERE id = $5",
                    )
                    .bind(now)
                    .bind(exit_code.map(i64::from))
                    .bind(signal.map(i64::from))
                    .bind(error)
                    .bind(attempt.attempt_id)
                    .execute(&mut tx)
                    .await?;
                    let end = ledger::settle_attempt(&mut tx, attempt.attempt_id, now).await?;
                    // A gang's rank: the job ends with its last rank, or its first failure.
                    let (final_state, reason) = match &gang {
                        None => (final_state, reason),
                        Some(g) => {
                            let others = live_ranks(&mut tx, g.lead, attempt.attempt_id).await?;
                            match gang::on_finished(
                                g.rank,
                                node.as_str(),
                                final_state,
                                reason.as_deref(),
                                others,
                            ) {
                                gang::RankEnd::Wait { reason } => (JobState::Running, Some(reason)),
                                gang::RankEnd::End { state, reason } => {
                                    let why = reason.clone();
                                    stop_gang(
                                        &mut tx,
                                        g,
                                        attempt.attempt_id,
                                        &why,
                                        now,
                                        &mut ended,
                                    )
                                    .await?;
                                    (state, Some(reason))
                                }
                            }
                        }
                    };
                    if final_state == JobState::Running {
                        query(
                            "UPDATE jobs SET reason = $1, version = version + 1 \
                             WHERE id = $2 AND current_attempt = $3 AND state = 'running'",
                        )
                        .bind(&reason)
                        .bind(attempt.job_id)
                        .bind(lead)
                        .execute(&mut tx)
                        .await?;
                    } else {
                        let ended_job = query(
                            "UPDATE jobs SET state = $1, finished_at = $2, exit_code = $3, \
                             reason = CASE WHEN $1 = 'cancelled' THEN COALESCE(stop_reason, $4) \
                             ELSE $4 END, version = version + 1 \
                             WHERE id = $5 AND current_attempt = $6 \
                             AND state IN ('placed', 'running')",
                        )
                        .bind(final_state.as_str())
                        .bind(end)
                        .bind(exit_code.map(i64::from))
                        .bind(&reason)
                        .bind(attempt.job_id)
                        .bind(lead)
                        .execute(&mut tx)
                        .await?;
                        // Its run teaches the runtime predictor (issue 29).
                        if final_state == JobState::Succeeded && ended_job.rows_affected() == 1 {
                            runtime::record_success(&mut tx, attempt.job_id, end).await?;
                        }
                    }
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
}

/// Ends a node's live attempts in `attempt_state` and sends their jobs back to the queue (or
/// to `cancelled` when a cancel was pending); as in the SQLite store.
pub(super) async fn end_node_work(
    tx: &mut Tx,
    node: &str,
    attempt_state: &'static str,
    why: &str,
    now: Timestamp,
    keep: NodeWorkKept,
) -> StoreResult<(Vec<AttemptRef>, Vec<JobId>)> {
    let rows = query(
        "SELECT id, job_id, epoch, node_rank, gang_lead FROM attempts \
         WHERE node_id = $1 AND state IN ('assigned', 'running', 'preempting') \
         AND NOT ($2 AND EXISTS (SELECT 1 FROM jobs j WHERE j.id = attempts.job_id \
                                 AND j.service_id IS NOT NULL AND attempts.state = 'running')) \
         ORDER BY created_at, id",
    )
    .bind(node)
    .bind(keep == NodeWorkKept::RunningReplicas)
    .fetch_all(&mut *tx)
    .await?;
    let mut stopped = Vec::with_capacity(rows.len());
    let mut requeued = Vec::with_capacity(rows.len());
    for row in &rows {
        // The scheduler reloads after a node's work ends: the cancelled ranks need no report.
        let attempt = requeue_attempt(tx, node, row, attempt_state, why, now).await?;
        requeued.push(JobId(attempt.job_id));
        stopped.push(attempt);
    }
    Ok((stopped, requeued))
}

/// Ends one live attempt of `node` (`row`: id, job_id, epoch, node_rank, gang_lead) in
/// `state`, noting `why`, and sends its job back to the queue with `why` as the reason (or to
/// `cancelled` when a cancel was pending); a gang's other ranks are stopped and requeued with
/// it. [`end_node_work`] does this for each of a node's attempts.
pub(super) async fn requeue_attempt(
    tx: &mut Tx,
    node: &str,
    row: &Row,
    state: &'static str,
    why: &str,
    now: Timestamp,
) -> StoreResult<AttemptRef> {
    let attempt = attempt_ref_from_row(row)?;
    let gang = gang_from_row(row)?;
    query("UPDATE attempts SET state = $1, finished_at = $2, error = $3 WHERE id = $4")
        .bind(state)
        .bind(now)
        .bind(why)
        .bind(attempt.attempt_id)
        .execute(&mut *tx)
        .await?;
    let end = ledger::settle_attempt(tx, attempt.attempt_id, now).await?;
    query(
        "UPDATE jobs SET state = CASE WHEN cancel_requested THEN 'cancelled' ELSE 'queued' END, \
         finished_at = CASE WHEN cancel_requested THEN $1 ELSE NULL END, \
         reason = $2, version = version + 1 \
         WHERE id = $3 AND current_attempt = $4 AND state IN ('placed', 'running')",
    )
    .bind(end)
    .bind(format!("{why}: requeued"))
    .bind(attempt.job_id)
    .bind(gang.as_ref().map_or(attempt.attempt_id, |g| g.lead))
    .execute(&mut *tx)
    .await?;
    if let Some(g) = &gang {
        let why = gang::requeue_reason(g.rank, node, why);
        stop_gang(tx, g, attempt.attempt_id, &why, now, &mut Vec::new()).await?;
    }
    Ok(attempt)
}

/// What [`end_node_work`] leaves running.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum NodeWorkKept {
    Nothing,
    /// Running service replicas: the node has notice of its end (a spot interruption), and a
    /// replica serves on until the reconciler's replacement is ready (then it drains), or
    /// until the node is gone.
    RunningReplicas,
}

/// The end of an attempt that puts its job back in the queue (or `cancelled`): stopped for a
/// preemption, or by its agent's self-fencing ([`Requeue`]). Returns the job's new state.
pub(super) async fn finish_requeued(
    tx: &mut Tx,
    attempt: &AttemptRef,
    exit_code: Option<i32>,
    signal: Option<i32>,
    now: Timestamp,
    how: Requeue<'_>,
    ended: &mut Vec<EndedAttempt>,
) -> StoreResult<JobState> {
    let (attempt_state, error, reason) = how.parts();
    let row = query("SELECT node_rank, gang_lead, node_id, error FROM attempts WHERE id = $1")
        .bind(attempt.attempt_id)
        .fetch_optional(&mut *tx)
        .await?;
    let (gang, node, noted) = match &row {
        Some(r) => (
            gang_from_row(r)?,
            r.get::<String>("node_id")?,
            r.get::<Option<String>>("error")?,
        ),
        None => (None, String::new(), None),
    };
    query(
        "UPDATE attempts SET state = $5, finished_at = $1, exit_code = $2, signal = $3, \
         error = COALESCE($6, error) WHERE id = $4",
    )
    .bind(now)
    .bind(exit_code.map(i64::from))
    .bind(signal.map(i64::from))
    .bind(attempt.attempt_id)
    .bind(attempt_state.as_str())
    .bind(error)
    .execute(&mut *tx)
    .await?;
    let end = ledger::settle_attempt(tx, attempt.attempt_id, now).await?;
    let cancelled: Option<bool> = query_scalar(
        "UPDATE jobs SET state = CASE WHEN cancel_requested THEN 'cancelled' \
         ELSE 'queued' END, \
         finished_at = CASE WHEN cancel_requested THEN $1 ELSE NULL END, \
         reason = CASE WHEN cancel_requested THEN COALESCE(stop_reason, 'cancelled by user') \
         ELSE COALESCE($4, reason) END, \
         version = version + 1 \
         WHERE id = $2 AND current_attempt = $3 AND state IN ('placed', 'running') \
         RETURNING cancel_requested",
    )
    .bind(end)
    .bind(attempt.job_id)
    .bind(gang.as_ref().map_or(attempt.attempt_id, |g| g.lead))
    .bind(reason)
    .fetch_optional(&mut *tx)
    .await?;
    if let Some(g) = &gang {
        let why = error
            .map(str::to_string)
            .or(noted)
            .unwrap_or_else(|| attempt_state.as_str().to_string());
        let why = gang::requeue_reason(g.rank, &node, &why);
        stop_gang(tx, g, attempt.attempt_id, &why, now, ended).await?;
    }
    Ok(match cancelled {
        Some(true) => JobState::Cancelled,
        _ => JobState::Queued,
    })
}

/// A job waiting for an instance that will not come goes back to the queue.
pub(super) async fn requeue_provisioning(tx: &mut Tx, job: Uuid, why: &str) -> StoreResult<()> {
    query(
        "UPDATE jobs SET state = 'queued', reason = $1, version = version + 1 \
         WHERE id = $2 AND state = 'provisioning'",
    )
    .bind(why)
    .bind(job)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// A gang's rank: its rank and the gang's key (its rank-0 attempt).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Rank {
    pub rank: u32,
    pub lead: Uuid,
}

/// The gang a row's attempt (`node_rank`, `gang_lead`) belongs to; `None` for a single-node
/// attempt.
pub(super) fn gang_from_row(row: &Row) -> StoreResult<Option<Rank>> {
    Ok(match row.uuid_opt("gang_lead")? {
        Some(lead) => Some(Rank {
            rank: row.u32("node_rank")?,
            lead,
        }),
        None => None,
    })
}

/// How many of the gang's ranks besides `except` still hold their lease.
async fn live_ranks(tx: &mut Tx, lead: Uuid, except: Uuid) -> StoreResult<u32> {
    let n: i64 = query_scalar(
        "SELECT COUNT(*) FROM attempts WHERE gang_lead = $1 AND id <> $2 \
         AND state IN ('assigned', 'running', 'preempting')",
    )
    .bind(lead)
    .bind(except)
    .fetch_one(&mut *tx)
    .await?;
    u32_of(n, "live ranks")
}

/// Stops the gang's ranks other than `except`, saying `why`: one not started yet is
/// `cancelled` (its GPUs are free now: reported in `ended`), a running one is `preempting` —
/// its agent is told to stop it (the checkpoint signal, then the grace period) and it holds its
/// GPUs until the agent reports the end, which then changes nothing more.
pub(super) async fn stop_gang(
    tx: &mut Tx,
    gang: &Rank,
    except: Uuid,
    why: &str,
    now: Timestamp,
    ended: &mut Vec<EndedAttempt>,
) -> StoreResult<()> {
    let cancelled = query(
        "UPDATE attempts SET state = 'cancelled', finished_at = $1, error = $2 \
         WHERE gang_lead = $3 AND id <> $4 AND state = 'assigned' \
         RETURNING id, job_id, node_id",
    )
    .bind(now)
    .bind(why)
    .bind(gang.lead)
    .bind(except)
    .fetch_all(&mut *tx)
    .await?;
    for r in &cancelled {
        ended.push(EndedAttempt {
            attempt: AttemptId(r.uuid("id")?),
            job: JobId(r.uuid("job_id")?),
            node: NodeId(r.get("node_id")?),
            final_state: JobState::Cancelled,
        });
    }
    query(
        "UPDATE attempts SET state = 'preempting', error = $1 \
         WHERE gang_lead = $2 AND id <> $3 AND state = 'running'",
    )
    .bind(why)
    .bind(gang.lead)
    .bind(except)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

//! Waste (issue 28): what the leader's waste loop (`control/waste.rs`) reads — every running
//! attempt with its node's latest inventory — and writes: one `gpu_waste` row per job (keyed by
//! its rank-0 attempt), its idle GPU-time growing by the deltas the judge accrued, its what-if
//! history, and the action the rule took. Also the reads of that table: idle GPU-hours by team
//! (`/metrics`, `GET /waste`) and a team's recorded attempts (what-if).

use super::*;
use switchyard_core::waste::Recorded;

/// One running attempt (a rank of its job) with what its node last reported.
#[derive(Clone, Debug)]
pub struct WasteRank {
    /// The job's key: the rank-0 attempt of a gang, else the attempt itself.
    pub key: AttemptId,
    pub attempt: AttemptId,
    pub job: JobId,
    pub team: String,
    pub project: Option<String>,
    pub name: String,
    pub priority: Priority,
    /// The attempt is a service's replica (never acted on).
    pub service: bool,
    pub node: NodeId,
    pub gpus: Vec<u32>,
    pub started_at: Timestamp,
    pub hourly_rate_micros: Option<i64>,
    /// The node's latest inventory (JSON) and when it was heard.
    pub inventory_json: String,
    pub last_heartbeat: Timestamp,
}

/// A job's `gpu_waste` row.
#[derive(Clone, Debug, PartialEq)]
pub struct WasteRow {
    pub key: AttemptId,
    pub job: JobId,
    pub team: String,
    pub project: Option<String>,
    pub name: String,
    pub priority: Priority,
    pub gpus: u32,
    pub hourly_rate_micros: Option<i64>,
    pub started_at: Timestamp,
    pub last_sample_at: Timestamp,
    pub idle_since: Option<Timestamp>,
    pub activity_pct: Option<f64>,
    pub idle_gpu_ms: i64,
    pub history: Vec<Recorded>,
    pub action: Option<String>,
    pub action_at: Option<Timestamp>,
    pub reason: Option<String>,
}

/// One write of the waste loop: `row` with `idle_gpu_ms` *added* to what is stored (so a new
/// leader never counts an interval twice nor loses one) and `history` as the loop merged it
/// with what was stored when it began judging the job ([`merge_history`]). `action` is written
/// only where none is stored: a rule acts once.
#[derive(Clone, Debug, PartialEq)]
pub struct WasteWrite {
    pub row: WasteRow,
}

const WASTE_COLUMNS: &str = "attempt_id, job_id, team, project, job_name, priority, gpus, \
    hourly_rate_micros, started_at, last_sample_at, idle_since, activity_pct, idle_gpu_ms, \
    history_json, action, action_at, reason";

#[derive(serde::Serialize, serde::Deserialize)]
struct RecordedJson {
    threshold_pct: u8,
    longest_idle_ms: i64,
    idle_gpu_ms: i64,
}

fn history_to_json(h: &[Recorded]) -> StoreResult<String> {
    let v: Vec<RecordedJson> = h
        .iter()
        .map(|r| RecordedJson {
            threshold_pct: r.threshold_pct,
            longest_idle_ms: r.longest_idle_ms,
            idle_gpu_ms: r.idle_gpu_ms,
        })
        .collect();
    serde_json::to_string(&v).map_err(|e| corrupt(format!("waste history: {e}")))
}

fn history_from_json(s: &str) -> StoreResult<Vec<Recorded>> {
    let v: Vec<RecordedJson> =
        serde_json::from_str(s).map_err(|e| corrupt(format!("bad waste history {s:?}: {e}")))?;
    Ok(v.into_iter()
        .map(|r| Recorded {
            threshold_pct: r.threshold_pct,
            longest_idle_ms: r.longest_idle_ms,
            idle_gpu_ms: r.idle_gpu_ms,
        })
        .collect())
}

/// `stored` and `fresh` together: per threshold the longer stretch and the summed idle time.
pub fn merge_history(stored: &[Recorded], fresh: &[Recorded]) -> Vec<Recorded> {
    let mut out: Vec<Recorded> = stored.to_vec();
    for f in fresh {
        match out.iter_mut().find(|r| r.threshold_pct == f.threshold_pct) {
            Some(r) => {
                r.longest_idle_ms = r.longest_idle_ms.max(f.longest_idle_ms);
                r.idle_gpu_ms = r.idle_gpu_ms.saturating_add(f.idle_gpu_ms);
            }
            None => out.push(*f),
        }
    }
    out.sort_by_key(|r| r.threshold_pct);
    out
}

fn waste_from_row(r: &Row) -> StoreResult<WasteRow> {
    Ok(WasteRow {
        key: AttemptId(r.uuid("attempt_id")?),
        job: JobId(r.uuid("job_id")?),
        team: r.get("team")?,
        project: r.get("project")?,
        name: r.get("job_name")?,
        priority: parse_priority(&r.get::<String>("priority")?)?,
        gpus: u32::try_from(r.get::<i64>("gpus")?).unwrap_or(0),
        hourly_rate_micros: r.get("hourly_rate_micros")?,
        started_at: r.time("started_at")?,
        last_sample_at: r.time("last_sample_at")?,
        idle_since: r.time_opt("idle_since")?,
        activity_pct: r.get("activity_pct")?,
        idle_gpu_ms: r.get("idle_gpu_ms")?,
        history: history_from_json(&r.get::<String>("history_json")?)?,
        action: r.get("action")?,
        action_at: r.time_opt("action_at")?,
        reason: r.get("reason")?,
    })
}

impl Store {
    /// Every running attempt with its node's latest inventory, ordered by job key.
    pub async fn waste_ranks(&self) -> StoreResult<Vec<WasteRank>> {
        let rows = query(
            "SELECT a.id, a.gang_lead, a.job_id, a.node_id, a.gpus_json, \
             COALESCE(a.started_at, a.created_at) AS started, a.hourly_rate_micros, \
             j.team, j.project, j.name, j.priority, j.service_id, \
             n.inventory_json, n.last_heartbeat \
             FROM attempts a JOIN jobs j ON j.id = a.job_id JOIN nodes n ON n.id = a.node_id \
             WHERE a.state = 'running' ORDER BY a.id",
        )
        .fetch_all(&self.db)
        .await?;
        let mut out = rows
            .iter()
            .map(|r| {
                let attempt = AttemptId(r.uuid("id")?);
                Ok(WasteRank {
                    key: r.uuid_opt("gang_lead")?.map_or(attempt, AttemptId),
                    attempt,
                    job: JobId(r.uuid("job_id")?),
                    team: r.get("team")?,
                    project: r.get("project")?,
                    name: r.get("name")?,
                    priority: parse_priority(&r.get::<String>("priority")?)?,
                    service: r.get::<Option<String>>("service_id")?.is_some(),
                    node: NodeId(r.get("node_id")?),
                    gpus: parse_gpus(&r.get::<String>("gpus_json")?)?,
                    started_at: r.time("started")?,
                    hourly_rate_micros: r.get("hourly_rate_micros")?,
                    inventory_json: r.get("inventory_json")?,
                    last_heartbeat: r.time("last_heartbeat")?,
                })
            })
            .collect::<StoreResult<Vec<_>>>()?;
        out.sort_by_key(|r| (r.key.0, r.attempt.0));
        Ok(out)
    }

    /// The stored row of the job keyed by `key`, if any.
    pub async fn waste_row(&self, key: AttemptId) -> StoreResult<Option<WasteRow>> {
        let sql = format!("SELECT {WASTE_COLUMNS} FROM gpu_waste WHERE attempt_id = $1");
        let row = query(AssertSqlSafe(sql))
            .bind(key)
            .fetch_optional(&self.db)
            .await?;
        row.as_ref().map(waste_from_row).transpose()
    }

    /// Writes the waste loop's pass in one leader transaction (see [`WasteWrite`]).
    pub async fn record_waste(&self, writes: &[WasteWrite]) -> StoreResult<()> {
        if writes.is_empty() {
            return Ok(());
        }
        let mut tx = self.leader_tx().await?;
        for w in writes {
            let r = &w.row;
            let history_json = history_to_json(&r.history)?;
            let sql = format!(
                "INSERT INTO gpu_waste ({WASTE_COLUMNS}) VALUES \
                 ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17) \
                 ON CONFLICT (attempt_id) DO UPDATE SET gpus = excluded.gpus, \
                 last_sample_at = excluded.last_sample_at, idle_since = excluded.idle_since, \
                 activity_pct = excluded.activity_pct, \
                 idle_gpu_ms = gpu_waste.idle_gpu_ms + excluded.idle_gpu_ms, \
                 history_json = excluded.history_json, \
                 action = COALESCE(gpu_waste.action, excluded.action), \
                 action_at = COALESCE(gpu_waste.action_at, excluded.action_at), \
                 reason = COALESCE(gpu_waste.reason, excluded.reason)"
            );
            query(AssertSqlSafe(sql))
                .bind(r.key)
                .bind(r.job)
                .bind(r.team.as_str())
                .bind(r.project.clone())
                .bind(r.name.as_str())
                .bind(r.priority.as_str())
                .bind(i64::from(r.gpus))
                .bind(r.hourly_rate_micros)
                .bind(r.started_at)
                .bind(r.last_sample_at)
                .bind(r.idle_since)
                .bind(r.activity_pct)
                .bind(r.idle_gpu_ms)
                .bind(history_json)
                .bind(r.action.clone())
                .bind(r.action_at)
                .bind(r.reason.clone())
                .execute(&mut tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Stops `job` for the waste rule: cancels it as a user's cancel does, and the job ends with
    /// `reason` instead of "cancelled by user" (`jobs.stop_reason`, read where the stop is
    /// reported).
    pub async fn stop_for_waste(
        &self,
        job: JobId,
        reason: &str,
        now: Timestamp,
    ) -> StoreResult<CancelOutcome> {
        let mut tx = self.leader_tx().await?;
        query("UPDATE jobs SET stop_reason = $1, reason = $1 WHERE id = $2 AND state = 'running'")
            .bind(reason)
            .bind(job)
            .execute(&mut tx)
            .await?;
        tx.commit().await?;
        let outcome = self.cancel_job(job, now).await?;
        if matches!(outcome, CancelOutcome::Cancelled { .. }) {
            let mut tx = self.write_tx().await?;
            query("UPDATE jobs SET reason = $1 WHERE id = $2 AND state = 'cancelled'")
                .bind(reason)
                .bind(job)
                .execute(&mut tx)
                .await?;
            tx.commit().await?;
        }
        Ok(outcome)
    }

    /// Notes the waste rule's `notify` on a job still running (its `reason`).
    pub async fn note_waste(&self, job: JobId, reason: &str) -> StoreResult<()> {
        let mut tx = self.leader_tx().await?;
        query("UPDATE jobs SET reason = $1 WHERE id = $2 AND state = 'running'")
            .bind(reason)
            .bind(job)
            .execute(&mut tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Idle GPU-milliseconds by team, over every recorded job: the
    /// `switchyard_gpu_wasted_hours_total` counter (it only grows).
    pub async fn wasted_gpu_ms_by_team(&self) -> StoreResult<Vec<(String, i64)>> {
        let rows = query(
            "SELECT team, CAST(SUM(idle_gpu_ms) AS BIGINT) AS ms FROM gpu_waste \
             GROUP BY team ORDER BY team",
        )
        .fetch_all(&self.db)
        .await?;
        rows.iter()
            .map(|r| Ok((r.get("team")?, r.get::<Option<i64>>("ms")?.unwrap_or(0))))
            .collect()
    }

    /// Jobs last judged in `[from, to)` (of `team` when given), most idle GPU-time first, at
    /// most `limit`.
    pub async fn waste_rows(
        &self,
        from: Timestamp,
        to: Timestamp,
        team: Option<&str>,
        limit: i64,
    ) -> StoreResult<Vec<WasteRow>> {
        let sql = format!(
            "SELECT {WASTE_COLUMNS} FROM gpu_waste WHERE last_sample_at >= $1 \
             AND last_sample_at < $2 AND (CAST($3 AS TEXT) IS NULL OR team = $3) \
             ORDER BY idle_gpu_ms DESC, attempt_id LIMIT $4"
        );
        let rows = query(AssertSqlSafe(sql))
            .bind(from)
            .bind(to)
            .bind(team.map(str::to_string))
            .bind(limit)
            .fetch_all(&self.db)
            .await?;
        rows.iter().map(waste_from_row).collect()
    }

    /// Idle GPU-milliseconds by team for jobs last judged in `[from, to)`.
    pub async fn waste_by_team(
        &self,
        from: Timestamp,
        to: Timestamp,
    ) -> StoreResult<Vec<(String, i64, i64)>> {
        let rows = query(
            "SELECT team, CAST(SUM(idle_gpu_ms) AS BIGINT) AS ms, COUNT(*) AS jobs \
             FROM gpu_waste WHERE last_sample_at >= $1 AND last_sample_at < $2 \
             GROUP BY team ORDER BY team",
        )
        .bind(from)
        .bind(to)
        .fetch_all(&self.db)
        .await?;
        rows.iter()
            .map(|r| {
                Ok((
                    r.get("team")?,
                    r.get::<Option<i64>>("ms")?.unwrap_or(0),
                    r.get::<i64>("jobs")?,
                ))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_merges_longest_and_sums_idle() {
        let r = |t, l, i| Recorded {
            threshold_pct: t,
            longest_idle_ms: l,
            idle_gpu_ms: i,
        };
        let merged = merge_history(&[r(5, 100, 10), r(10, 50, 5)], &[r(10, 80, 1), r(20, 7, 7)]);
        assert_eq!(merged, vec![r(5, 100, 10), r(10, 80, 6), r(20, 7, 7)]);
        let json = history_to_json(&merged).expect("serialisable");
        assert_eq!(history_from_json(&json).expect("parses"), merged);
    }
}

//! What the ledger says: spend grouped and bucketed, budget use, spend rates, entries, budget
//! alerts.

use super::ledger::{ATTEMPT_SELECT, attempt_row_rate};
use super::*;

impl Store {
    /// Sum of ledger entries (micro-dollars).
    pub async fn ledger_total(&self) -> StoreResult<i64> {
        let total: Option<i64> =
            query_scalar("SELECT CAST(SUM(amount_micros) AS BIGINT) FROM ledger")
                .fetch_one(&self.db)
                .await?;
        Ok(total.unwrap_or(0))
    }

    /// Ledger entries grouped (and bucketed) as `query` asks.
    pub async fn spend(&self, q: &SpendQuery) -> StoreResult<Vec<SpendGroupRow>> {
        // Both fragments come from enums, never from the request.
        let key = match q.group {
            SpendGroup::Team => "team",
            SpendGroup::Project => "project",
            SpendGroup::Region => "region_id",
            SpendGroup::Provider => "provider",
            SpendGroup::Pool => "pool_id",
            SpendGroup::Usage => {
                "CASE kind WHEN 'instance_boot' THEN 'instance_boot' \
                 WHEN 'instance_idle' THEN 'instance_idle' ELSE 'job' END"
            }
        };
        let bucket = match q.bucket {
            Some(b) => (self.dialect().time_bucket)(b.millis()),
            None => "CAST(NULL AS TIMESTAMPTZ)".to_string(),
        };
        // NULLS FIRST and byte order: the order SQLite gives.
        let sql = format!(
            "SELECT {key} COLLATE \"C\" AS k, {bucket} AS b, CAST(SUM(amount_micros) AS BIGINT) AS amount, \
             CAST(SUM(COALESCE(cash_micros, amount_micros)) AS BIGINT) AS cash FROM ledger \
             WHERE (CAST($1 AS TIMESTAMPTZ) IS NULL OR period_start >= $1) \
             AND (CAST($2 AS TIMESTAMPTZ) IS NULL OR period_start < $2) \
             AND (CAST($3 AS TEXT) IS NULL OR team = $3) GROUP BY k, b \
             ORDER BY b NULLS FIRST, k NULLS FIRST"
        );
        let rows = query(AssertSqlSafe(sql))
            .bind(q.from)
            .bind(q.to)
            .bind(&q.team)
            .fetch_all(&self.db)
            .await?;
        rows.iter()
            .map(|r| {
                Ok(SpendGroupRow {
                    key: r.get("k")?,
                    bucket_start: r.time_opt("b")?,
                    amount: Money(r.get::<Option<i64>>("amount")?.unwrap_or(0)),
                    cash: Money(r.get::<Option<i64>>("cash")?.unwrap_or(0)),
                })
            })
            .collect()
    }

    /// Owned GPUs' idle time per pool in the hours that start in `[from, to)`.
    pub async fn owned_idle(
        &self,
        from: Option<Timestamp>,
        to: Option<Timestamp>,
    ) -> StoreResult<Vec<OwnedIdleRow>> {
        let rows = query(
            "SELECT pool_id COLLATE \"C\" AS pool, CAST(SUM(idle_gpu_ms) AS BIGINT) AS idle, \
             CAST(SUM(worth_micros) AS BIGINT) AS worth FROM owned_idle \
             WHERE (CAST($1 AS TIMESTAMPTZ) IS NULL OR period_start >= $1) \
             AND (CAST($2 AS TIMESTAMPTZ) IS NULL OR period_start < $2) \
             GROUP BY pool ORDER BY pool",
        )
        .bind(from)
        .bind(to)
        .fetch_all(&self.db)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(OwnedIdleRow {
                    pool: r.get("pool")?,
                    idle_gpu_ms: r.get::<Option<i64>>("idle")?.unwrap_or(0),
                    worth: Money(r.get::<Option<i64>>("worth")?.unwrap_or(0)),
                })
            })
            .collect()
    }

    /// What a budget of `team` (and `project`) has spent in `[from, to)` and what live work of
    /// its jobs is still expected to cost.
    pub async fn budget_usage(
        &self,
        team: &str,
        project: Option<&str>,
        from: Timestamp,
        to: Timestamp,
    ) -> StoreResult<BudgetUsage> {
        let spent: Option<i64> = query_scalar(
            "SELECT CAST(SUM(amount_micros) AS BIGINT) FROM ledger \
             WHERE team = $1 AND (CAST($2 AS TEXT) IS NULL OR project = $2) \
             AND period_start >= $3 AND period_start < $4",
        )
        .bind(team)
        .bind(project)
        .bind(from)
        .bind(to)
        .fetch_one(&self.db)
        .await?;
        // Live attempts: their estimate less what they accrued (on their own or on an instance).
        let attempts: Option<i64> = query_scalar(AssertSqlSafe(format!(
            "SELECT CAST(SUM({}(0, a.estimated_cost_micros - COALESCE((SELECT SUM(l.amount_micros) \
             FROM ledger l WHERE l.attempt_id = a.id), 0))) AS BIGINT) \
             FROM attempts a JOIN jobs j ON j.id = a.job_id \
             WHERE a.state IN ('assigned', 'running', 'preempting') AND j.team = $1 \
             AND (CAST($2 AS TEXT) IS NULL OR j.project = $2)",
            self.dialect().greatest
        )))
        .bind(team)
        .bind(project)
        .fetch_one(&self.db)
        .await?;
        // Launches in flight: the job's estimate less what the instance accrued so far.
        let launches: Option<i64> = query_scalar(AssertSqlSafe(format!(
            "SELECT CAST(SUM({}(0, i.estimated_cost_micros - COALESCE((SELECT SUM(l.amount_micros) \
             FROM ledger l WHERE l.source = 'instance:' || i.id), 0))) AS BIGINT) \
             FROM instances i JOIN jobs j ON j.id = i.for_job \
             WHERE i.state <> 'terminated' AND j.state = 'provisioning' AND j.team = $1 \
             AND (CAST($2 AS TEXT) IS NULL OR j.project = $2)",
            self.dialect().greatest
        )))
        .bind(team)
        .bind(project)
        .fetch_one(&self.db)
        .await?;
        Ok(BudgetUsage {
            spent: Money(spent.unwrap_or(0)),
            committed: Money(attempts.unwrap_or(0).saturating_add(launches.unwrap_or(0))),
        })
    }

    /// What the work live now costs an hour, per team, by the ledger's own rules: running and
    /// preempting attempts on nodes the broker did not launch at their recorded rate, and live
    /// cloud instances at their hourly price, charged to the job on the node (else the job they
    /// were launched for). What the ledger accrues per hour if nothing changes.
    pub async fn spend_rates(&self) -> StoreResult<Vec<(String, Money)>> {
        let mut rates = Vec::new();
        // Constant text only.
        let attempts = query(AssertSqlSafe(format!(
            "{ATTEMPT_SELECT} AND a.state IN ('running', 'preempting')"
        )))
        .fetch_all(&self.db)
        .await?;
        for r in &attempts {
            rates.push((r.get("team")?, attempt_row_rate(r)?));
        }
        let instances = query(LIVE_INSTANCE_PAYERS).fetch_all(&self.db).await?;
        for r in &instances {
            rates.push((r.get("team")?, Money(r.get("hourly_price_micros")?)));
        }
        Ok(rates_by_team(rates))
    }

    /// Records that a budget's spend reached a threshold this period; false if it already was.
    pub async fn record_budget_alert(
        &self,
        team: &str,
        project: Option<&str>,
        period_start: Timestamp,
        threshold_ppm: i64,
        now: Timestamp,
    ) -> StoreResult<bool> {
        let done = query(
            "INSERT INTO budget_alerts (team, project, period_start, threshold_ppm, at) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
        )
        .bind(team)
        .bind(project.unwrap_or(""))
        .bind(period_start)
        .bind(threshold_ppm)
        .bind(now)
        .execute(&self.db)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Ledger entries (of one job, or all), oldest period first.
    pub async fn ledger_entries(&self, job: Option<JobId>) -> StoreResult<Vec<LedgerEntry>> {
        let rows = query(
            "SELECT * FROM ledger WHERE (CAST($1 AS UUID) IS NULL OR job_id = $1) ORDER BY period_start, id",
        )
        .bind(job.map(|j| j.0))
        .fetch_all(&self.db)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(LedgerEntry {
                    id: r.get("id")?,
                    at: r.time("at")?,
                    kind: r.get("kind")?,
                    source: r.get("source")?,
                    team: r.get("team")?,
                    project: r.get("project")?,
                    job: r.uuid_opt("job_id")?.map(|u| u.to_string()),
                    attempt: r.uuid_opt("attempt_id")?.map(|u| u.to_string()),
                    instance: r.get("instance_id")?,
                    provider: r.get("provider")?,
                    region: r.get("region_id")?,
                    pool: r.get("pool_id")?,
                    period_start: r.time("period_start")?,
                    period_end: r.time("period_end")?,
                    amount: Money(r.get("amount_micros")?),
                    cash: Money(
                        r.get::<Option<i64>>("cash_micros")?
                            .unwrap_or(r.get("amount_micros")?),
                    ),
                })
            })
            .collect()
    }
}

/// Each live cloud instance's hourly price and the team it is charged to now: the job running
/// on its node (the earliest started, as the ledger's stretches pick), else the job it was
/// launched for. Live: launched and not terminated, as the ledger accrues them.
const LIVE_INSTANCE_PAYERS: &str = "SELECT i.hourly_price_micros, \
     COALESCE((SELECT oj.team FROM attempts a JOIN jobs oj ON oj.id = a.job_id \
     WHERE a.node_id = i.node_id AND a.started_at IS NOT NULL AND a.finished_at IS NULL \
     ORDER BY a.started_at, a.id LIMIT 1), j.team) AS team \
     FROM instances i LEFT JOIN jobs j ON j.id = i.for_job \
     WHERE i.launched_at IS NOT NULL AND i.state <> 'terminated'";

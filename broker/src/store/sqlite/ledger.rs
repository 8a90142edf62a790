//! The ledger in SQLite: accrual of attempts and instances, settlement when they end, spend
//! reports and budget use. Every function here that writes runs inside the caller's
//! transaction.
//!
//! A source (`attempt:<id>` or `instance:<id>`) is accrued from its `accrued_until` (or its
//! start) to a time `until`, then `accrued_until = until`, in the same transaction; entries are
//! keyed by `(source, period_start)`, so nothing is ever written twice. Amounts are cumulative
//! from the source's start — `cost(t) = rate × whole seconds since start`, rounded up — and each
//! entry is `cost(end) − cost(start)`, so a source's entries add up to exactly its rate × its
//! billed time however many passes wrote them.

use super::*;
use crate::store::stretches::{INSTANCE_JOB, Occupant, cost_to, labelled, stretches};

/// The attempts accrued by the ledger themselves: started, on a node no instance is bound to.
const ATTEMPT_SELECT: &str = "SELECT a.id, a.job_id, a.pool_id, a.market, a.gpus_json, \
     a.started_at, a.finished_at, a.accrued_until, a.hourly_rate_micros, a.state, \
     j.team, j.project, p.region_id, p.provider, p.on_demand_micros, p.spot_micros, \
     p.gpus_per_node FROM attempts a JOIN jobs j ON j.id = a.job_id \
     JOIN pools p ON p.id = a.pool_id \
     WHERE a.started_at IS NOT NULL \
     AND NOT EXISTS (SELECT 1 FROM instances i WHERE i.node_id = a.node_id) ";

const LIVE_ATTEMPT_STATES: [&str; 2] = ["running", "preempting"];

struct Entry<'a> {
    kind: &'static str,
    source: &'a str,
    team: Option<&'a str>,
    project: Option<&'a str>,
    job: Option<&'a str>,
    attempt: Option<&'a str>,
    instance: Option<&'a str>,
    provider: &'a str,
    region: &'a str,
    pool: &'a str,
    start: Timestamp,
    end: Timestamp,
    amount: i64,
    /// The final entry of a source that ended: written even when it adds nothing, so the
    /// source's entries run to its end.
    last: bool,
}

async fn insert(tx: &mut Tx, e: &Entry<'_>, now: Timestamp) -> StoreResult<usize> {
    if e.amount == 0 && !e.last {
        return Ok(0);
    }
    let done = sqlx::query(
        "INSERT INTO ledger (at, kind, source, team, project, job_id, attempt_id, instance_id, \
         provider, region_id, pool_id, period_start, period_end, amount_micros) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14) \
         ON CONFLICT (source, period_start) DO NOTHING",
    )
    .bind(now.millis())
    .bind(e.kind)
    .bind(e.source)
    .bind(e.team)
    .bind(e.project)
    .bind(e.job)
    .bind(e.attempt)
    .bind(e.instance)
    .bind(e.provider)
    .bind(e.region)
    .bind(e.pool)
    .bind(e.start.millis())
    .bind(e.end.millis())
    .bind(e.amount)
    .execute(&mut **tx)
    .await?;
    Ok(done.rows_affected() as usize)
}

/// What an attempt row (from [`ATTEMPT_SELECT`]) accrues an hour: the rate recorded when it was
/// placed, else its pool's price for its market.
fn attempt_row_rate(r: &SqliteRow) -> StoreResult<Money> {
    Ok(match r.try_get::<Option<i64>, _>("hourly_rate_micros")? {
        Some(rate) => Money(rate),
        None => {
            // Placed before rates were recorded: the pool's price for its market.
            let market = parse_market(&r.try_get::<String, _>("market")?)?;
            let on_demand: i64 = r.try_get("on_demand_micros")?;
            let node = match market {
                Market::Spot => r
                    .try_get::<Option<i64>, _>("spot_micros")?
                    .unwrap_or(on_demand),
                Market::OnDemand => on_demand,
            };
            let gpus = parse_gpus(&r.try_get::<String, _>("gpus_json")?)?.len() as i64;
            Money(node)
                .div_ceil(r.try_get::<i64, _>("gpus_per_node")?.max(1))
                .saturating_mul(gpus)
        }
    })
}

/// Accrues one attempt row (from [`ATTEMPT_SELECT`]) up to now, or to its end once it ended.
async fn accrue_attempt_row(tx: &mut Tx, r: &SqliteRow, now: Timestamp) -> StoreResult<usize> {
    let id: String = r.try_get("id")?;
    let state: String = r.try_get("state")?;
    let origin = Timestamp(r.try_get("started_at")?);
    let from = r
        .try_get::<Option<i64>, _>("accrued_until")?
        .map_or(origin, Timestamp);
    let live = LIVE_ATTEMPT_STATES.contains(&state.as_str());
    let until = if live {
        now
    } else {
        r.try_get::<Option<i64>, _>("finished_at")?
            .map_or(now, Timestamp)
    };
    if until <= from {
        return Ok(0);
    }
    let rate = attempt_row_rate(r)?;
    let amount = cost_to(rate, origin, until) - cost_to(rate, origin, from);
    if amount == 0 && live {
        // Less than a billed second so far: the next pass takes this stretch too, so a
        // source's entries stay contiguous.
        return Ok(0);
    }
    let source = format!("attempt:{id}");
    let (team, project): (Option<String>, Option<String>) =
        (r.try_get("team")?, r.try_get("project")?);
    let (job, pool, region, provider): (String, String, String, String) = (
        r.try_get("job_id")?,
        r.try_get("pool_id")?,
        r.try_get("region_id")?,
        r.try_get("provider")?,
    );
    let written = insert(
        tx,
        &Entry {
            kind: "attempt",
            source: &source,
            team: team.as_deref(),
            project: project.as_deref(),
            job: Some(&job),
            attempt: Some(&id),
            instance: None,
            provider: &provider,
            region: &region,
            pool: &pool,
            start: from,
            end: until,
            amount,
            last: !live,
        },
        now,
    )
    .await?;
    sqlx::query("UPDATE attempts SET accrued_until = $1 WHERE id = $2")
        .bind(until.millis())
        .bind(&id)
        .execute(&mut **tx)
        .await?;
    Ok(written)
}

/// Who a stretch of an instance's time is charged to.
#[derive(Clone, PartialEq)]
struct Owner {
    job: Option<String>,
    attempt: Option<String>,
    team: Option<String>,
    project: Option<String>,
}

/// Accrues instance `id` up to `until`; with `min_billed_s`, settles it (its total is at least
/// that long). Each stretch is charged to the job that ran on the instance's node then; time
/// with no job on it is boot or idle time, charged to the team (and project) of the job it was
/// launched for but to no job.
async fn accrue_instance(
    tx: &mut Tx,
    id: &str,
    until: Timestamp,
    min_billed_s: Option<i64>,
    now: Timestamp,
) -> StoreResult<usize> {
    let Some(r) = sqlx::query(
        "SELECT i.provider, i.pool_id, i.region_id, i.hourly_price_micros, i.for_job, i.node_id, \
         i.launched_at, i.ready_at, i.accrued_until, j.team, j.project \
         FROM instances i LEFT JOIN jobs j ON j.id = i.for_job WHERE i.id = $1",
    )
    .bind(id)
    .fetch_optional(&mut **tx)
    .await?
    else {
        return Ok(0);
    };
    let Some(origin) = r.try_get::<Option<i64>, _>("launched_at")?.map(Timestamp) else {
        return Ok(0);
    };
    let from = r
        .try_get::<Option<i64>, _>("accrued_until")?
        .map_or(origin, Timestamp);
    let billed_until = match min_billed_s {
        Some(min) => until.max(origin.plus_secs(min)),
        None => until,
    };
    if until <= from && billed_until <= from {
        return Ok(0);
    }
    let rate = Money(r.try_get("hourly_price_micros")?);
    if min_billed_s.is_none() && cost_to(rate, origin, until) == cost_to(rate, origin, from) {
        // Nothing billed since the last pass: leave the stretch to the next one.
        return Ok(0);
    }
    let launched_for = Owner {
        job: r.try_get("for_job")?,
        attempt: None,
        team: r.try_get("team")?,
        project: r.try_get("project")?,
    };
    let mut occupants = Vec::new();
    if let Some(node) = r.try_get::<Option<String>, _>("node_id")? {
        let rows = sqlx::query(
            "SELECT a.id, a.job_id, a.started_at, a.finished_at, j.team, j.project \
             FROM attempts a JOIN jobs j ON j.id = a.job_id \
             WHERE a.node_id = $1 AND a.started_at IS NOT NULL AND a.started_at < $3 \
             AND (a.finished_at IS NULL OR a.finished_at > $2) ORDER BY a.started_at, a.id",
        )
        .bind(&node)
        .bind(from.millis())
        .bind(until.millis())
        .fetch_all(&mut **tx)
        .await?;
        for a in &rows {
            occupants.push(Occupant {
                owner: Owner {
                    job: a.try_get("job_id")?,
                    attempt: a.try_get("id")?,
                    team: a.try_get("team")?,
                    project: a.try_get("project")?,
                },
                start: Timestamp(a.try_get("started_at")?),
                end: a.try_get::<Option<i64>, _>("finished_at")?.map(Timestamp),
            });
        }
    }
    // Time no job ran in is the team's overhead, not the launching job's: boot until the
    // node was ready, idle after.
    let ready_at = r.try_get::<Option<i64>, _>("ready_at")?.map(Timestamp);
    let stretches = labelled(
        stretches(&occupants, &launched_for, from, until),
        |o| o.attempt.is_some(),
        ready_at,
    );
    let (provider, pool, region): (String, String, String) = (
        r.try_get("provider")?,
        r.try_get("pool_id")?,
        r.try_get("region_id")?,
    );
    let source = format!("instance:{id}");
    let last = stretches.len() - 1;
    let mut written = 0;
    // A stretch too short to cost anything is folded into the next one (the entries stay
    // contiguous; the time is free either way).
    let mut carried: Option<Timestamp> = None;
    for (i, (start, end, owner, kind)) in stretches.iter().enumerate() {
        let on_job = *kind == INSTANCE_JOB;
        let start = carried.take().unwrap_or(*start);
        let billed_end = if i == last { billed_until } else { *end };
        let amount = cost_to(rate, origin, billed_end) - cost_to(rate, origin, start);
        if amount == 0 && i != last {
            carried = Some(start);
            continue;
        }
        written += insert(
            tx,
            &Entry {
                kind,
                source: &source,
                team: owner.team.as_deref(),
                project: owner.project.as_deref(),
                job: owner.job.as_deref().filter(|_| on_job),
                attempt: owner.attempt.as_deref().filter(|_| on_job),
                instance: Some(id),
                provider: &provider,
                region: &region,
                pool: &pool,
                start,
                end: *end,
                amount,
                last: i == last && min_billed_s.is_some(),
            },
            now,
        )
        .await?;
    }
    sqlx::query("UPDATE instances SET accrued_until = $1 WHERE id = $2")
        .bind(until.max(from).millis())
        .bind(id)
        .execute(&mut **tx)
        .await?;
    Ok(written)
}

/// Settles an attempt that just ended (its `finished_at` set): its last partial period, or,
/// on a node the broker launched, the instance's time up to now. Returns the attempt's end:
/// `now`, or later when an accrual pass already charged it past `now` (see below); the caller
/// gives its job the same end.
pub(super) async fn settle_attempt(
    tx: &mut Tx,
    attempt: &str,
    now: Timestamp,
) -> StoreResult<Timestamp> {
    let instance: Option<String> = sqlx::query_scalar(
        "SELECT i.id FROM instances i JOIN attempts a ON a.node_id = i.node_id \
         WHERE a.id = $1 AND i.state <> 'terminated' LIMIT 1",
    )
    .bind(attempt)
    .fetch_optional(&mut **tx)
    .await?;
    if let Some(instance) = instance {
        accrue_instance(tx, &instance, now, None, now).await?;
        return Ok(now);
    }
    // An accrual pass that read the clock after the caller did but took the write lock first
    // may have charged the attempt past `now`: it then ends where it was charged to, as that
    // pass ran while it was still live. Its entries end at its end, never past it.
    let end: Option<i64> = sqlx::query_scalar(crate::store::ATTEMPT_END_TO_CHARGED)
        .bind(attempt)
        .fetch_optional(&mut **tx)
        .await?;
    let end = end.map_or(now, Timestamp);
    let row = sqlx::query(sqlx::AssertSqlSafe(format!(
        "{ATTEMPT_SELECT} AND a.id = $1"
    )))
    .bind(attempt)
    .fetch_optional(&mut **tx)
    .await?;
    if let Some(row) = row {
        accrue_attempt_row(tx, &row, now).await?;
    }
    Ok(end)
}

/// Settles an instance being terminated (before its node's work is ended, so that work is
/// still charged for its time on it): up to now, and at least the minimum billed time.
pub(super) async fn settle_instance(
    tx: &mut Tx,
    id: &str,
    min_billed_s: i64,
    now: Timestamp,
) -> StoreResult<()> {
    // As for an attempt (`settle_attempt`): never ended before what was charged.
    sqlx::query(crate::store::INSTANCE_END_TO_CHARGED)
        .bind(id)
        .execute(&mut **tx)
        .await?;
    accrue_instance(tx, id, now, Some(min_billed_s), now).await?;
    Ok(())
}

/// Accrues every source up to `now` (and settles any that ended without being settled).
pub(super) async fn accrue_all(
    tx: &mut Tx,
    now: Timestamp,
    min_billed_s: i64,
) -> StoreResult<usize> {
    let mut written = 0;
    // Constant text only.
    let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
        "{ATTEMPT_SELECT} AND (a.state IN ('running', 'preempting') OR \
         (a.finished_at IS NOT NULL AND COALESCE(a.accrued_until, a.started_at) < a.finished_at)) \
         ORDER BY a.id"
    )))
    .fetch_all(&mut **tx)
    .await?;
    for row in &rows {
        written += accrue_attempt_row(tx, row, now).await?;
    }
    let live: Vec<String> = sqlx::query_scalar(
        "SELECT id FROM instances WHERE launched_at IS NOT NULL AND state <> 'terminated' \
         ORDER BY id",
    )
    .fetch_all(&mut **tx)
    .await?;
    for id in &live {
        written += accrue_instance(tx, id, now, None, now).await?;
    }
    let unsettled = sqlx::query(
        "SELECT id, ended_at FROM instances WHERE state = 'terminated' \
         AND launched_at IS NOT NULL AND ended_at IS NOT NULL \
         AND COALESCE(accrued_until, launched_at) < ended_at ORDER BY id",
    )
    .fetch_all(&mut **tx)
    .await?;
    for r in &unsettled {
        let id: String = r.try_get("id")?;
        let ended = Timestamp(r.try_get("ended_at")?);
        written += accrue_instance(tx, &id, ended, Some(min_billed_s), now).await?;
    }
    Ok(written)
}

pub(super) async fn spend(pool: &SqlitePool, q: &SpendQuery) -> StoreResult<Vec<SpendGroupRow>> {
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
        Some(b) => format!("(period_start / {0}) * {0}", b.millis()),
        None => "NULL".to_string(),
    };
    let sql = format!(
        "SELECT {key} AS k, {bucket} AS b, SUM(amount_micros) AS amount FROM ledger \
         WHERE ($1 IS NULL OR period_start >= $1) AND ($2 IS NULL OR period_start < $2) \
         AND ($3 IS NULL OR team = $3) GROUP BY k, b ORDER BY b, k"
    );
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(q.from.map(Timestamp::millis))
        .bind(q.to.map(Timestamp::millis))
        .bind(&q.team)
        .fetch_all(pool)
        .await?;
    rows.iter()
        .map(|r| {
            Ok(SpendGroupRow {
                key: r.try_get("k")?,
                bucket_start: r.try_get::<Option<i64>, _>("b")?.map(Timestamp),
                amount: Money(r.try_get::<Option<i64>, _>("amount")?.unwrap_or(0)),
            })
        })
        .collect()
}

pub(super) async fn budget_usage(
    pool: &SqlitePool,
    team: &str,
    project: Option<&str>,
    from: Timestamp,
    to: Timestamp,
) -> StoreResult<BudgetUsage> {
    let spent: Option<i64> = sqlx::query_scalar(
        "SELECT SUM(amount_micros) FROM ledger WHERE team = $1 AND ($2 IS NULL OR project = $2) \
         AND period_start >= $3 AND period_start < $4",
    )
    .bind(team)
    .bind(project)
    .bind(from.millis())
    .bind(to.millis())
    .fetch_one(pool)
    .await?;
    // Live attempts: their estimate less what they accrued (on their own or on an instance).
    let attempts: Option<i64> = sqlx::query_scalar(
        "SELECT SUM(MAX(0, a.estimated_cost_micros - COALESCE((SELECT SUM(l.amount_micros) \
         FROM ledger l WHERE l.attempt_id = a.id), 0))) \
         FROM attempts a JOIN jobs j ON j.id = a.job_id \
         WHERE a.state IN ('assigned', 'running', 'preempting') AND j.team = $1 \
         AND ($2 IS NULL OR j.project = $2)",
    )
    .bind(team)
    .bind(project)
    .fetch_one(pool)
    .await?;
    // Launches in flight: the job's estimate less what the instance accrued so far.
    let launches: Option<i64> = sqlx::query_scalar(
        "SELECT SUM(MAX(0, i.estimated_cost_micros - COALESCE((SELECT SUM(l.amount_micros) \
         FROM ledger l WHERE l.source = 'instance:' || i.id), 0))) \
         FROM instances i JOIN jobs j ON j.id = i.for_job \
         WHERE i.state <> 'terminated' AND j.state = 'provisioning' AND j.team = $1 \
         AND ($2 IS NULL OR j.project = $2)",
    )
    .bind(team)
    .bind(project)
    .fetch_one(pool)
    .await?;
    Ok(BudgetUsage {
        spent: Money(spent.unwrap_or(0)),
        committed: Money(attempts.unwrap_or(0).saturating_add(launches.unwrap_or(0))),
    })
}

pub(super) async fn spend_rates(pool: &SqlitePool) -> StoreResult<Vec<(String, Money)>> {
    let mut rates = Vec::new();
    // Constant text only.
    let attempts = sqlx::query(sqlx::AssertSqlSafe(format!(
        "{ATTEMPT_SELECT} AND a.state IN ('running', 'preempting')"
    )))
    .fetch_all(pool)
    .await?;
    for r in &attempts {
        rates.push((r.try_get("team")?, attempt_row_rate(r)?));
    }
    let instances = sqlx::query(LIVE_INSTANCE_PAYERS).fetch_all(pool).await?;
    for r in &instances {
        rates.push((r.try_get("team")?, Money(r.try_get("hourly_price_micros")?)));
    }
    Ok(rates_by_team(rates))
}

pub(super) async fn ledger_entries(
    pool: &SqlitePool,
    job: Option<JobId>,
) -> StoreResult<Vec<LedgerEntry>> {
    let rows = sqlx::query(
        "SELECT * FROM ledger WHERE ($1 IS NULL OR job_id = $1) ORDER BY period_start, id",
    )
    .bind(job.map(|j| j.to_string()))
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|r| {
            Ok(LedgerEntry {
                id: r.try_get("id")?,
                at: Timestamp(r.try_get("at")?),
                kind: r.try_get("kind")?,
                source: r.try_get("source")?,
                team: r.try_get("team")?,
                project: r.try_get("project")?,
                job: r.try_get("job_id")?,
                attempt: r.try_get("attempt_id")?,
                instance: r.try_get("instance_id")?,
                provider: r.try_get("provider")?,
                region: r.try_get("region_id")?,
                pool: r.try_get("pool_id")?,
                period_start: Timestamp(r.try_get("period_start")?),
                period_end: Timestamp(r.try_get("period_end")?),
                amount: Money(r.try_get("amount_micros")?),
            })
        })
        .collect()
}

//! The ledger: accrual of attempts and instances, settlement when they end, spend
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
use std::collections::BTreeMap;

/// The attempts accrued by the ledger themselves: started, on a node no instance is bound to.
pub(super) const ATTEMPT_SELECT: &str = "SELECT a.id, a.job_id, a.pool_id, a.market, a.gpus_json, \
     a.started_at, a.finished_at, a.accrued_until, a.hourly_rate_micros, a.hourly_cash_micros, \
     a.state, j.team, j.project, p.region_id, p.provider, p.on_demand_micros, p.spot_micros, \
     p.gpus_per_node, COALESCE(o.launchable, p.launchable) AS launchable, \
     COALESCE(o.marginal_micros, p.marginal_micros) AS marginal_micros \
     FROM attempts a JOIN jobs j ON j.id = a.job_id \
     JOIN pools p ON p.id = a.pool_id LEFT JOIN pool_overrides o ON o.pool_id = p.id \
     WHERE a.started_at IS NOT NULL \
     AND NOT EXISTS (SELECT 1 FROM instances i WHERE i.node_id = a.node_id) ";

const LIVE_ATTEMPT_STATES: [&str; 2] = ["running", "preempting"];

struct Entry<'a> {
    kind: &'static str,
    source: &'a str,
    team: Option<&'a str>,
    project: Option<&'a str>,
    job: Option<Uuid>,
    attempt: Option<Uuid>,
    instance: Option<&'a str>,
    provider: &'a str,
    region: &'a str,
    pool: &'a str,
    start: Timestamp,
    end: Timestamp,
    amount: i64,
    /// What the same time cost the company in cash (`amount` for a cloud instance).
    cash: i64,
    /// The final entry of a source that ended: written even when it adds nothing.
    last: bool,
}

async fn insert(tx: &mut Tx, e: &Entry<'_>, now: Timestamp) -> StoreResult<usize> {
    if e.amount == 0 && e.cash == 0 && !e.last {
        return Ok(0);
    }
    let done = query(
        "INSERT INTO ledger (at, kind, source, team, project, job_id, attempt_id, instance_id, \
         provider, region_id, pool_id, period_start, period_end, amount_micros, cash_micros) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15) \
         ON CONFLICT (source, period_start) DO NOTHING",
    )
    .bind(now)
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
    .bind(e.start)
    .bind(e.end)
    .bind(e.amount)
    .bind(e.cash)
    .execute(&mut *tx)
    .await?;
    Ok(done.rows_affected() as usize)
}

/// What an attempt row (from [`ATTEMPT_SELECT`]) accrues an hour: the rate recorded when it was
/// placed, else its pool's price for its market.
pub(super) fn attempt_row_rate(r: &Row) -> StoreResult<Money> {
    Ok(match r.get::<Option<i64>>("hourly_rate_micros")? {
        Some(rate) => Money(rate),
        None => {
            // Placed before rates were recorded: the pool's price for its market.
            let market = parse_market(&r.get::<String>("market")?)?;
            let on_demand: i64 = r.get("on_demand_micros")?;
            let node = match market {
                switchyard_core::Market::Spot => {
                    r.get::<Option<i64>>("spot_micros")?.unwrap_or(on_demand)
                }
                switchyard_core::Market::OnDemand => on_demand,
            };
            let gpus = parse_gpus(&r.get::<String>("gpus_json")?)?.len() as i64;
            Money(node)
                .div_ceil(r.get::<i64>("gpus_per_node")?.max(1))
                .saturating_mul(gpus)
        }
    })
}

/// What an attempt row (from [`ATTEMPT_SELECT`]) costs the company in cash an hour: the rate
/// recorded when it was placed, else (placed before cash was recorded) its pool's: the charge
/// on a launchable pool, the marginal cost (finance's, or the default share of the internal
/// rate) on an owned one.
pub(super) fn attempt_row_cash_rate(r: &Row) -> StoreResult<Money> {
    if let Some(cash) = r.get::<Option<i64>>("hourly_cash_micros")? {
        return Ok(Money(cash));
    }
    if r.get::<bool>("launchable")? {
        return attempt_row_rate(r);
    }
    let node = switchyard_core::owned_cash_per_hour(
        Money(r.get("on_demand_micros")?),
        r.get::<Option<i64>>("marginal_micros")?.map(Money),
    );
    let gpus = parse_gpus(&r.get::<String>("gpus_json")?)?.len() as i64;
    Ok(node
        .div_ceil(r.get::<i64>("gpus_per_node")?.max(1))
        .saturating_mul(gpus))
}

/// Accrues one attempt row (from [`ATTEMPT_SELECT`]) up to now, or to its end once it ended.
async fn accrue_attempt_row(tx: &mut Tx, r: &Row, now: Timestamp) -> StoreResult<usize> {
    let id = r.uuid("id")?;
    let state: String = r.get("state")?;
    let origin = r.time("started_at")?;
    let from = r.time_opt("accrued_until")?.unwrap_or(origin);
    let live = LIVE_ATTEMPT_STATES.contains(&state.as_str());
    let until = if live {
        now
    } else {
        r.time_opt("finished_at")?.unwrap_or(now)
    };
    if until <= from {
        return Ok(0);
    }
    let rate = attempt_row_rate(r)?;
    let amount = cost_to(rate, origin, until) - cost_to(rate, origin, from);
    let cash_rate = attempt_row_cash_rate(r)?;
    let cash = cost_to(cash_rate, origin, until) - cost_to(cash_rate, origin, from);
    if amount == 0 && cash == 0 && live {
        // Less than a billed second so far: the next pass takes this stretch too.
        return Ok(0);
    }
    let source = format!("attempt:{id}");
    let (team, project): (Option<String>, Option<String>) = (r.get("team")?, r.get("project")?);
    let job = r.uuid("job_id")?;
    let (pool, region, provider): (String, String, String) =
        (r.get("pool_id")?, r.get("region_id")?, r.get("provider")?);
    let written = insert(
        tx,
        &Entry {
            kind: "attempt",
            source: &source,
            team: team.as_deref(),
            project: project.as_deref(),
            job: Some(job),
            attempt: Some(id),
            instance: None,
            provider: &provider,
            region: &region,
            pool: &pool,
            start: from,
            end: until,
            amount,
            cash,
            last: !live,
        },
        now,
    )
    .await?;
    query("UPDATE attempts SET accrued_until = $1 WHERE id = $2")
        .bind(until)
        .bind(id)
        .execute(&mut *tx)
        .await?;
    Ok(written)
}

/// Who a stretch of an instance's time is charged to.
#[derive(Clone, PartialEq)]
struct Owner {
    job: Option<Uuid>,
    attempt: Option<Uuid>,
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
    let Some(r) = query(
        "SELECT i.provider, i.pool_id, i.region_id, i.hourly_price_micros, i.for_job, i.node_id, \
         i.launched_at, i.ready_at, i.accrued_until, j.team, j.project \
         FROM instances i LEFT JOIN jobs j ON j.id = i.for_job WHERE i.id = $1",
    )
    .bind(id)
    .fetch_optional(&mut *tx)
    .await?
    else {
        return Ok(0);
    };
    let Some(origin) = r.time_opt("launched_at")? else {
        return Ok(0);
    };
    let from = r.time_opt("accrued_until")?.unwrap_or(origin);
    let billed_until = match min_billed_s {
        Some(min) => until.max(origin.plus_secs(min)),
        None => until,
    };
    if until <= from && billed_until <= from {
        return Ok(0);
    }
    let rate = Money(r.get("hourly_price_micros")?);
    if min_billed_s.is_none() && cost_to(rate, origin, until) == cost_to(rate, origin, from) {
        // Nothing billed since the last pass: leave the stretch to the next one.
        return Ok(0);
    }
    let launched_for = Owner {
        job: r.uuid_opt("for_job")?,
        attempt: None,
        team: r.get("team")?,
        project: r.get("project")?,
    };
    let mut occupants = Vec::new();
    if let Some(node) = r.get::<Option<String>>("node_id")? {
        let rows = query(
            "SELECT a.id, a.job_id, a.started_at, a.finished_at, j.team, j.project \
             FROM attempts a JOIN jobs j ON j.id = a.job_id \
             WHERE a.node_id = $1 AND a.started_at IS NOT NULL AND a.started_at < $3 \
             AND (a.finished_at IS NULL OR a.finished_at > $2) ORDER BY a.started_at, a.id",
        )
        .bind(&node)
        .bind(from)
        .bind(until)
        .fetch_all(&mut *tx)
        .await?;
        for a in &rows {
            occupants.push(Occupant {
                owner: Owner {
                    job: a.uuid_opt("job_id")?,
                    attempt: a.uuid_opt("id")?,
                    team: a.get("team")?,
                    project: a.get("project")?,
                },
                start: a.time("started_at")?,
                end: a.time_opt("finished_at")?,
            });
        }
    }
    // Time no job ran in is the team's overhead, not the launching job's: boot until the
    // node was ready, idle after.
    let ready_at = r.time_opt("ready_at")?;
    let stretches = labelled(
        stretches(&occupants, &launched_for, from, until),
        |o| o.attempt.is_some(),
        ready_at,
    );
    let (provider, pool, region): (String, String, String) =
        (r.get("provider")?, r.get("pool_id")?, r.get("region_id")?);
    let source = format!("instance:{id}");
    let last = stretches.len() - 1;
    let mut written = 0;
    // A stretch too short to cost anything is folded into the next one.
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
                job: owner.job.filter(|_| on_job),
                attempt: owner.attempt.filter(|_| on_job),
                instance: Some(id),
                provider: &provider,
                region: &region,
                pool: &pool,
                start,
                end: *end,
                amount,
                cash: amount,
                last: i == last && min_billed_s.is_some(),
            },
            now,
        )
        .await?;
    }
    query("UPDATE instances SET accrued_until = $1 WHERE id = $2")
        .bind(until.max(from))
        .bind(id)
        .execute(&mut *tx)
        .await?;
    Ok(written)
}

/// Settles an attempt that just ended (its `finished_at` set): its last partial period, or,
/// on a node the broker launched, the instance's time up to now. Returns the attempt's end:
/// `now`, or later when an accrual pass already charged it past `now` (see below); the caller
/// gives its job the same end.
pub(super) async fn settle_attempt(
    tx: &mut Tx,
    attempt: Uuid,
    now: Timestamp,
) -> StoreResult<Timestamp> {
    let instance: Option<String> = query_scalar(
        "SELECT i.id FROM instances i JOIN attempts a ON a.node_id = i.node_id \
         WHERE a.id = $1 AND i.state <> 'terminated' LIMIT 1",
    )
    .bind(attempt)
    .fetch_optional(&mut *tx)
    .await?;
    if let Some(instance) = instance {
        accrue_instance(tx, &instance, now, None, now).await?;
        return Ok(now);
    }
    // An accrual pass that read the clock after the caller did but took the write lock first
    // may have charged the attempt past `now`: it then ends where it was charged to, as that
    // pass ran while it was still live. Its entries end at its end, never past it.
    let end: Option<DbTime> = query_scalar(ATTEMPT_END_TO_CHARGED)
        .bind(attempt)
        .fetch_optional(&mut *tx)
        .await?;
    let end = end.map_or(now, |e| e.0);
    let row = query(AssertSqlSafe(format!("{ATTEMPT_SELECT} AND a.id = $1")))
        .bind(attempt)
        .fetch_optional(&mut *tx)
        .await?;
    if let Some(row) = row {
        accrue_attempt_row(tx, &row, now).await?;
    }
    Ok(end)
}

/// Settles an instance being terminated: up to now, and at least the minimum billed time.
pub(super) async fn settle_instance(
    tx: &mut Tx,
    id: &str,
    min_billed_s: i64,
    now: Timestamp,
) -> StoreResult<()> {
    // As for an attempt (`settle_attempt`): never ended before what was charged.
    query(INSTANCE_END_TO_CHARGED)
        .bind(id)
        .execute(&mut *tx)
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
    let rows = query(AssertSqlSafe(format!(
        "{ATTEMPT_SELECT} AND (a.state IN ('running', 'preempting') OR \
         (a.finished_at IS NOT NULL AND COALESCE(a.accrued_until, a.started_at) < a.finished_at)) \
         ORDER BY a.id"
    )))
    .fetch_all(&mut *tx)
    .await?;
    for row in &rows {
        written += accrue_attempt_row(tx, row, now).await?;
    }
    let live: Vec<String> = query_scalar(
        "SELECT id FROM instances WHERE launched_at IS NOT NULL AND state <> 'terminated' \
         ORDER BY id COLLATE \"C\"",
    )
    .fetch_all(&mut *tx)
    .await?;
    for id in &live {
        written += accrue_instance(tx, id, now, None, now).await?;
    }
    let unsettled = query(
        "SELECT id, ended_at FROM instances WHERE state = 'terminated' \
         AND launched_at IS NOT NULL AND ended_at IS NOT NULL \
         AND COALESCE(accrued_until, launched_at) < ended_at ORDER BY id COLLATE \"C\"",
    )
    .fetch_all(&mut *tx)
    .await?;
    for r in &unsettled {
        let id: String = r.get("id")?;
        let ended = r.time("ended_at")?;
        written += accrue_instance(tx, &id, ended, Some(min_billed_s), now).await?;
    }
    accrue_owned_idle(tx, now).await?;
    Ok(written)
}

const HOUR_MS: i64 = 3_600_000;

/// Owned GPUs' idle time up to `now`: for each owned (not launchable) pool, the GPU time of
/// its nodes since the pool was last accrued that no started attempt held, added to the pool's
/// row for each UTC hour with its worth at the pool's internal rate. Only a healthy node heard
/// from since then counts: a node that is down or silent (the broker itself down, say) is
/// unavailable, not idle, and its gap is skipped. Three reads and a write per owned pool and
/// hour, whatever the number of nodes. Returns the rows touched.
async fn accrue_owned_idle(tx: &mut Tx, now: Timestamp) -> StoreResult<usize> {
    // Constant text: the owned pools, their nodes, and the started attempts on those nodes.
    const OWNED: &str = "FROM pools p LEFT JOIN pool_overrides o ON o.pool_id = p.id \
         WHERE NOT COALESCE(o.launchable, p.launchable)";
    const NODES: &str = "FROM nodes n JOIN pools p ON p.id = n.pool_id \
         LEFT JOIN pool_overrides o ON o.pool_id = p.id \
         WHERE NOT n.revoked AND NOT COALESCE(o.launchable, p.launchable) \
         AND NOT EXISTS (SELECT 1 FROM instances i WHERE i.node_id = n.id)";
    let pools = query(AssertSqlSafe(format!(
        "SELECT p.id, p.region_id, p.provider, p.gpus_per_node, p.idle_accrued_until, \
         COALESCE(o.on_demand_micros, p.on_demand_micros) AS on_demand_micros {OWNED} \
         ORDER BY p.id COLLATE \"C\""
    )))
    .fetch_all(&mut *tx)
    .await?;
    if pools.is_empty() {
        return Ok(0);
    }
    struct OwnedNode {
        pool: String,
        gpus: i64,
        registered: Timestamp,
        heartbeat: Timestamp,
        healthy: bool,
        /// (start, end, GPUs) of the started attempts on it.
        held: Vec<(Timestamp, Timestamp, i64)>,
    }
    let mut nodes: BTreeMap<String, OwnedNode> = BTreeMap::new();
    for n in query(AssertSqlSafe(format!(
        "SELECT n.id, n.pool_id, n.gpus_total, n.healthy, n.registered_at, n.last_heartbeat \
         {NODES}"
    )))
    .fetch_all(&mut *tx)
    .await?
    {
        nodes.insert(
            n.get("id")?,
            OwnedNode {
                pool: n.get("pool_id")?,
                gpus: i64::from(n.u32("gpus_total")?),
                registered: n.time("registered_at")?,
                heartbeat: n.time("last_heartbeat")?,
                healthy: n.get("healthy")?,
                held: Vec::new(),
            },
        );
    }
    // Where each pool's stretch starts: where it was accrued to, else its first node's
    // registration (a pool seeded after migration 19).
    let mut from_of: BTreeMap<String, Timestamp> = BTreeMap::new();
    for p in &pools {
        let id: String = p.get("id")?;
        let first = nodes
            .values()
            .filter(|n| n.pool == id)
            .map(|n| n.registered)
            .min()
            .unwrap_or(now);
        from_of.insert(id, p.time_opt("idle_accrued_until")?.unwrap_or(first));
    }
    let earliest = from_of.values().copied().min().unwrap_or(now);
    for a in query(
        "SELECT a.node_id, a.gpus_json, a.started_at, a.finished_at FROM attempts a \
         JOIN nodes n ON n.id = a.node_id JOIN pools p ON p.id = n.pool_id \
         LEFT JOIN pool_overrides o ON o.pool_id = p.id \
         WHERE NOT COALESCE(o.launchable, p.launchable) AND a.started_at IS NOT NULL \
         AND a.started_at < $2 AND (a.finished_at IS NULL OR a.finished_at > $1)",
    )
    .bind(earliest)
    .bind(now)
    .fetch_all(&mut *tx)
    .await?
    {
        let node: String = a.get("node_id")?;
        if let Some(n) = nodes.get_mut(&node) {
            let gpus = parse_gpus(&a.get::<String>("gpus_json")?)?.len() as i64;
            let end = a.time_opt("finished_at")?.unwrap_or(now);
            n.held.push((a.time("started_at")?, end, gpus));
        }
    }
    let overlap = |s: Timestamp, e: Timestamp, lo: Timestamp, hi: Timestamp| {
        (e.millis().min(hi.millis()) - s.millis().max(lo.millis())).max(0)
    };
    let mut touched = 0;
    for p in &pools {
        let id: String = p.get("id")?;
        let from = from_of.get(&id).copied().unwrap_or(now);
        if now <= from {
            continue;
        }
        // The nodes heard from since the stretch began, each from its registration.
        let counted: Vec<&OwnedNode> = nodes
            .values()
            .filter(|n| n.pool == id && n.healthy && n.heartbeat >= from)
            .collect();
        let per_gpu_hour = Money(p.get("on_demand_micros")?)
            .div_ceil(p.get::<i64>("gpus_per_node")?.max(1))
            .micros();
        let (region, provider): (String, String) = (p.get("region_id")?, p.get("provider")?);
        for (start, end) in hours(from, now) {
            let mut idle_ms = 0i64;
            for n in &counted {
                let live_from = if n.registered > start {
                    n.registered
                } else {
                    start
                };
                let capacity = n.gpus.saturating_mul(overlap(live_from, end, start, end));
                let busy: i64 = n
                    .held
                    .iter()
                    .map(|&(s, e, g)| overlap(s, e, live_from, end).saturating_mul(g))
                    .sum();
                idle_ms += capacity.saturating_sub(busy).max(0);
            }
            if idle_ms == 0 {
                continue;
            }
            // Nearest micro-dollar; at most one off per pass.
            let worth = (i128::from(idle_ms) * i128::from(per_gpu_hour) + i128::from(HOUR_MS / 2))
                / i128::from(HOUR_MS);
            let hour = Timestamp(start.millis() - start.millis().rem_euclid(HOUR_MS));
            query(
                "INSERT INTO owned_idle (pool_id, region_id, provider, period_start, period_end, \
                 idle_gpu_ms, worth_micros) VALUES ($1, $2, $3, $4, $5, $6, $7) \
                 ON CONFLICT (pool_id, period_start) DO UPDATE SET \
                 period_end = excluded.period_end, \
                 idle_gpu_ms = owned_idle.idle_gpu_ms + excluded.idle_gpu_ms, \
                 worth_micros = owned_idle.worth_micros + excluded.worth_micros",
            )
            .bind(&id)
            .bind(&region)
            .bind(&provider)
            .bind(hour)
            .bind(end)
            .bind(idle_ms)
            .bind(i64::try_from(worth).unwrap_or(i64::MAX))
            .execute(&mut *tx)
            .await?;
            touched += 1;
        }
        query("UPDATE pools SET idle_accrued_until = $1 WHERE id = $2")
            .bind(now)
            .bind(&id)
            .execute(&mut *tx)
            .await?;
    }
    Ok(touched)
}

/// `[from, to)` cut at UTC hour boundaries.
fn hours(from: Timestamp, to: Timestamp) -> Vec<(Timestamp, Timestamp)> {
    let mut out = Vec::new();
    let mut start = from.millis();
    while start < to.millis() {
        let next = (start - start.rem_euclid(HOUR_MS) + HOUR_MS).min(to.millis());
        out.push((Timestamp(start), Timestamp(next)));
        start = next;
    }
    out
}

impl Store {
    /// Writes ledger entries for every source up to `now` in one transaction: running attempts
    /// on nodes the broker did not launch, live instances (idle time included), and anything
    /// that ended unsettled (instances with at least `min_billed_s`). Returns the entries
    /// written. Idempotent: each source remembers how far it was accrued.
    pub async fn accrue_ledger(&self, now: Timestamp, min_billed_s: i64) -> StoreResult<usize> {
        let mut tx = self.leader_tx().await?;
        let written = accrue_all(&mut tx, now, min_billed_s).await?;
        tx.commit().await?;
        Ok(written)
    }
}

/// Settling an attempt that an accrual pass already charged past the end its transaction read
/// (the pass took the write lock first): it ends where it was charged to. Returns the moved end.
const ATTEMPT_END_TO_CHARGED: &str = "UPDATE attempts SET finished_at = accrued_until \
     WHERE id = $1 AND accrued_until > finished_at RETURNING finished_at";

/// The same for an instance being terminated.
const INSTANCE_END_TO_CHARGED: &str = "UPDATE instances SET ended_at = accrued_until \
     WHERE id = $1 AND accrued_until > ended_at";

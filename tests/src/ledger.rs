//! Audits a broker's ledger straight from its database (SQLite file or PostgreSQL), for fault
//! tests: every attempt that ran and ended is settled exactly once — its entries run
//! contiguously from its start to its end and add up to its rate × its billed seconds — and the
//! spend API's total equals the sum of the entries.

use crate::{Broker, psql_rows};
use std::collections::BTreeMap;

/// An attempt as stored.
#[derive(Clone, Debug)]
pub struct AttemptRow {
    pub id: String,
    pub job: String,
    pub state: String,
    pub started: Option<i64>,
    pub finished: Option<i64>,
    pub rate_micros: Option<i64>,
    /// How far the ledger has charged it (the broker's `accrued_until`).
    pub accrued_until: Option<i64>,
}

/// One `attempt:` ledger entry.
#[derive(Clone, Debug)]
pub struct EntryRow {
    pub attempt: String,
    pub start: i64,
    pub end: i64,
    pub amount: i64,
}

/// What [`audit`] found.
#[derive(Debug, Default)]
pub struct LedgerAudit {
    pub attempts: Vec<AttemptRow>,
    /// Attempts that ran and ended, each found settled exactly once.
    pub settled: usize,
    pub entries: usize,
    /// Sum of all ledger entries, micro-dollars.
    pub total_micros: i64,
    /// The spend API's `total_usd`.
    pub api_total_usd: f64,
}

const ATTEMPTS_SQLITE: &str = "SELECT id, job_id, state, started_at, finished_at, \
    hourly_rate_micros, accrued_until FROM attempts";
const ENTRIES_SQLITE: &str = "SELECT attempt_id, period_start, period_end, amount_micros \
    FROM ledger WHERE kind = 'attempt'";
const ATTEMPTS_PG: &str = "SELECT id, job_id, state, \
    round(extract(epoch FROM started_at) * 1000)::bigint, \
    round(extract(epoch FROM finished_at) * 1000)::bigint, hourly_rate_micros, \
    round(extract(epoch FROM accrued_until) * 1000)::bigint FROM attempts";
const ENTRIES_PG: &str = "SELECT attempt_id, \
    round(extract(epoch FROM period_start) * 1000)::bigint, \
    round(extract(epoch FROM period_end) * 1000)::bigint, amount_micros \
    FROM ledger WHERE kind = 'attempt'";

async fn read_sqlite(broker: &Broker) -> (Vec<AttemptRow>, Vec<EntryRow>, i64) {
    use sqlx::Row;
    let db = broker.data_dir().join("switchyard.db");
    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}?mode=ro", db.display()))
        .await
        .expect("opening the broker's database");
    let attempts = sqlx::query(ATTEMPTS_SQLITE)
        .fetch_all(&pool)
        .await
        .unwrap()
        .iter()
        .map(|r| AttemptRow {
            id: r.get(0),
            job: r.get(1),
            state: r.get(2),
            started: r.get(3),
            finished: r.get(4),
            rate_micros: r.get(5),
            accrued_until: r.get(6),
        })
        .collect();
    let entries = sqlx::query(ENTRIES_SQLITE)
        .fetch_all(&pool)
        .await
        .unwrap()
        .iter()
        .map(|r| EntryRow {
            attempt: r.get(0),
            start: r.get(1),
            end: r.get(2),
            amount: r.get(3),
        })
        .collect();
    let total: i64 = sqlx::query_scalar("SELECT COALESCE(SUM(amount_micros), 0) FROM ledger")
        .fetch_one(&pool)
        .await
        .unwrap();
    pool.close().await;
    (attempts, entries, total)
}

fn read_pg(url: &str) -> (Vec<AttemptRow>, Vec<EntryRow>, i64) {
    let opt = |s: &String| (!s.is_empty()).then(|| s.parse::<i64>().unwrap());
    let attempts = psql_rows(url, ATTEMPTS_PG)
        .iter()
        .map(|r| AttemptRow {
            id: r[0].clone(),
            job: r[1].clone(),
            state: r[2].clone(),
            started: opt(&r[3]),
            finished: opt(&r[4]),
            rate_micros: opt(&r[5]),
            accrued_until: opt(&r[6]),
        })
        .collect();
    let entries = psql_rows(url, ENTRIES_PG)
        .iter()
        .map(|r| EntryRow {
            attempt: r[0].clone(),
            start: r[1].parse().unwrap(),
            end: r[2].parse().unwrap(),
            amount: r[3].parse().unwrap(),
        })
        .collect();
    let total = psql_rows(url, "SELECT COALESCE(SUM(amount_micros), 0) FROM ledger")[0][0]
        .parse()
        .unwrap();
    (attempts, entries, total)
}

/// What an attempt at `rate` costs for `ms` milliseconds: whole seconds, a started second in
/// full, rounded up to the micro-dollar (the broker's `Timestamp::billed_secs_since` and
/// `Money::per_hour_for_secs`).
fn cost(rate: i64, ms: i64) -> i64 {
    (rate * ((ms.max(0) + 999) / 1000) + 3599) / 3600
}

/// Audits the ledger of `broker` (whose database is `pg_url` when on PostgreSQL, else its
/// SQLite file). Panics, naming the attempt, on any entry out of place.
pub async fn audit(broker: &Broker, pg_url: Option<&str>) -> LedgerAudit {
    let (attempts, entries, total_micros) = match pg_url {
        Some(url) => read_pg(url),
        None => read_sqlite(broker).await,
    };
    let mut by_attempt: BTreeMap<&str, Vec<&EntryRow>> = BTreeMap::new();
    for e in &entries {
        by_attempt.entry(e.attempt.as_str()).or_default().push(e);
    }
    let mut settled = 0;
    for a in &attempts {
        let mine = by_attempt.remove(a.id.as_str()).unwrap_or_default();
        let (Some(start), Some(end)) = (a.started, a.finished) else {
            assert!(
                a.started.is_some() || mine.is_empty(),
                "attempt {} never started but has ledger entries: {mine:?}",
                a.id
            );
            continue;
        };
        // Charged to its end exactly: never short of it (every ended attempt is settled in the
        // transaction that ends it) and never past it (an attempt an accrual pass charged past
        // the caller's clock ends where it was charged to).
        let charged_to = a.accrued_until.unwrap_or(start);
        assert_eq!(
            charged_to, end,
            "attempt {} ({}) ended at {end} but the ledger charged it to {:?}",
            a.id, a.state, a.accrued_until
        );
        let mut mine = mine;
        mine.sort_by_key(|e| e.start);
        let rate = a.rate_micros.unwrap_or_default();
        let want = cost(rate, end - start);
        let sum: i64 = mine.iter().map(|e| e.amount).sum();
        if want == 0 && mine.is_empty() {
            settled += 1;
            continue;
        }
        assert!(
            !mine.is_empty(),
            "attempt {} ({}) ran {} ms at {rate} µ$/h and has no ledger entry",
            a.id,
            a.state,
            end - start
        );
        assert_eq!(
            mine[0].start, start,
            "attempt {} charged from {mine:?}",
            a.id
        );
        for w in mine.windows(2) {
            assert_eq!(
                w[0].end, w[1].start,
                "attempt {}'s entries overlap or leave a gap: {mine:?}",
                a.id
            );
        }
        assert_eq!(
            mine.last().map(|e| e.end),
            Some(end),
            "attempt {} ({}) ended at {end} but is settled to {mine:?}",
            a.id,
            a.state
        );
        assert_eq!(
            sum,
            want,
            "attempt {} ran {} ms at {rate} µ$/h: charged {sum}, owes {want}: {mine:?}",
            a.id,
            end - start
        );
        settled += 1;
    }
    assert!(
        by_attempt.is_empty(),
        "ledger entries for attempts that do not exist: {by_attempt:?}"
    );
    let (status, spend) = broker
        .call(reqwest::Method::GET, "/api/v1/spend?group_by=team", None)
        .await;
    assert_eq!(status, 200, "{spend}");
    let api_total_usd = spend["total_usd"].as_f64().unwrap();
    let rows_usd: f64 = spend["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["amount_usd"].as_f64().unwrap())
        .sum();
    let total_usd = total_micros as f64 / 1e6;
    assert!(
        (api_total_usd - total_usd).abs() < 1e-6 && (rows_usd - total_usd).abs() < 1e-5,
        "spend API says {api_total_usd} (rows {rows_usd}), the ledger's entries add up to {total_usd}"
    );
    LedgerAudit {
        attempts,
        settled,
        entries: entries.len(),
        total_micros,
        api_total_usd,
    }
}

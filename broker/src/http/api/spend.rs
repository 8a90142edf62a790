//! `/api/v1/spend`: the ledger grouped by team, project, region, provider or pool, optionally
//! in hourly or daily buckets, as JSON or (with `Accept: text/csv`) CSV. Totals are sums of
//! ledger entries, in micro-dollars until the last step. Developers see their own team only.

use axum::Json;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use std::collections::BTreeMap;
use switchyard_core::Money;
use switchyard_protocol::api::{ErrorBody, OwnedIdle, OwnedIdlePool, SpendReport, SpendRow};
use utoipa::IntoParams;

use crate::clock::{from_datetime, to_datetime};
use crate::http::auth::Caller;
use crate::http::error::ApiError;
use crate::state::App;
use crate::store::{SpendBucket, SpendGroup, SpendGroupRow, SpendQuery};

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct SpendParams {
    /// `team` (default), `project`, `region`, `provider`, `pool` or `usage` (`job`,
    /// `instance_boot`, `instance_idle`: a cloud instance's boot and idle time is the team's
    /// overhead, charged to no job).
    group_by: Option<String>,
    /// Entries whose period starts at or after this time (RFC 3339).
    from: Option<String>,
    /// Entries whose period starts before this time (RFC 3339).
    to: Option<String>,
    /// `hour` or `day`: one row per bucket (UTC) and key.
    bucket: Option<String>,
    /// Only this team's spend (developers always get their own team).
    team: Option<String>,
}

/// An optional RFC 3339 query parameter, refused naming `field` when it is not one.
pub(crate) fn time_param(
    field: &str,
    value: Option<&str>,
) -> Result<Option<switchyard_core::Timestamp>, ApiError> {
    value
        .filter(|v| !v.is_empty())
        .map(|v| {
            chrono::DateTime::parse_from_rfc3339(v)
                .map(|t| from_datetime(t.with_timezone(&chrono::Utc)))
                .map_err(|_| {
                    ApiError::invalid(field, "must be an RFC 3339 time, e.g. 2026-12-01T00:00:00Z")
                })
        })
        .transpose()
}

/// Spend by team, project, region, provider or pool: the ledger's entries whose period starts
/// in `[from, to)`. `Accept: text/csv` returns CSV with the header
/// `<group_by>[,bucket_start],amount_usd,cash_usd`: `amount_usd` is what the ledger bills teams
/// (chargeback), `cash_usd` what the same entries cost the company. For a caller who sees
/// every team, the JSON adds `owned_idle`: owned GPUs' idle hours and their worth.
#[utoipa::path(get, path = "/spend", tag = "spend", params(SpendParams),
    responses(
        (status = 200, description = "The report (JSON, or CSV with `Accept: text/csv`)",
         content((SpendReport = "application/json"), (String = "text/csv"))),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn report(
    State(app): State<App>,
    caller: Caller,
    headers: HeaderMap,
    params: Result<Query<SpendParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(params) = params?;
    let group_by = params.group_by.as_deref().unwrap_or("team");
    let group = SpendGroup::parse(group_by).ok_or_else(|| {
        ApiError::invalid(
            "group_by",
            "must be team, project, region, provider, pool or usage",
        )
    })?;
    let bucket = match params.bucket.as_deref() {
        None | Some("") => None,
        Some(b) => Some(
            SpendBucket::parse(b)
                .ok_or_else(|| ApiError::invalid("bucket", "must be hour or day"))?,
        ),
    };
    let from = time_param("from", params.from.as_deref())?;
    let to = time_param("to", params.to.as_deref())?;
    if let (Some(f), Some(t)) = (from, to)
        && t < f
    {
        return Err(ApiError::invalid("to", "is before from"));
    }
    let (team, visible) = match (caller.team_scope(), params.team) {
        (Some(own), Some(asked)) if own != asked => (None, false),
        (Some(own), _) => (Some(own.to_string()), true),
        (None, asked) => (asked.filter(|t| !t.is_empty()), true),
    };
    let rows = if visible {
        app.store
            .spend(&SpendQuery {
                group,
                bucket,
                from,
                to,
                team,
            })
            .await?
    } else {
        // A developer asking for another team sees nothing, as if it had spent nothing.
        Vec::new()
    };
    let wants_csv = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.to_ascii_lowercase().contains("text/csv"));
    if wants_csv {
        return csv_response(group, bucket.is_some(), &rows);
    }
    let total = rows
        .iter()
        .fold(0i64, |sum, r| sum.saturating_add(r.amount.micros()));
    let total_cash = rows
        .iter()
        .fold(0i64, |sum, r| sum.saturating_add(r.cash.micros()));
    // Idle owned GPUs are no team's: shown to those who see every team.
    let owned_idle = if caller.team_scope().is_none() {
        let pools = app.store.owned_idle(from, to).await?;
        let hours = |ms: i64| ms as f64 / 3_600_000.0;
        Some(OwnedIdle {
            gpu_hours: hours(pools.iter().map(|p| p.idle_gpu_ms).sum()),
            usd: Money(pools.iter().map(|p| p.worth.micros()).sum()).as_dollars(),
            pools: pools
                .iter()
                .map(|p| OwnedIdlePool {
                    pool: p.pool.clone(),
                    gpu_hours: hours(p.idle_gpu_ms),
                    usd: p.worth.as_dollars(),
                })
                .collect(),
        })
    } else {
        None
    };
    Ok(Json(SpendReport {
        group_by: group.as_str().to_string(),
        rows: rows
            .iter()
            .map(|r| SpendRow {
                key: BTreeMap::from([(group.as_str().to_string(), r.key.clone())]),
                bucket_start: r.bucket_start.map(to_datetime),
                amount_usd: r.amount.as_dollars(),
                cash_usd: r.cash.as_dollars(),
            })
            .collect(),
        total_usd: Money(total).as_dollars(),
        total_cash_usd: Money(total_cash).as_dollars(),
        owned_idle,
    })
    .into_response())
}

/// Micro-dollars as an exact decimal string of dollars (`12.500000`).
fn dollars_text(m: Money) -> String {
    let sign = if m.micros() < 0 { "-" } else { "" };
    let abs = m.micros().unsigned_abs();
    format!("{sign}{}.{:06}", abs / 1_000_000, abs % 1_000_000)
}

/// A text cell as a spreadsheet will not run it (OWASP "CSV injection"): a cell that starts
/// with `=`, `+`, `-`, `@`, a tab or a carriage return is a formula to Excel, LibreOffice and
/// Google Sheets, so it gets a leading `'`, which they show as text. Only the key column (team,
/// project, pool, region or provider names, which users choose) goes through this; the amount
/// is a number we format, and stays one even when negative (a refund or correction).
fn neutralise_cell(cell: &str) -> std::borrow::Cow<'_, str> {
    if cell.starts_with(['=', '+', '-', '@', '\t', '\r']) {
        std::borrow::Cow::Owned(format!("'{cell}"))
    } else {
        std::borrow::Cow::Borrowed(cell)
    }
}

fn csv_response(
    group: SpendGroup,
    bucketed: bool,
    rows: &[SpendGroupRow],
) -> Result<Response, ApiError> {
    let broken = |e: &dyn std::fmt::Display| ApiError::Internal(format!("writing CSV: {e}"));
    let mut w = csv::Writer::from_writer(Vec::new());
    let mut head = vec![group.as_str()];
    if bucketed {
        head.push("bucket_start");
    }
    head.push("amount_usd");
    head.push("cash_usd");
    w.write_record(&head).map_err(|e| broken(&e))?;
    for r in rows {
        let key = r.key.as_deref().unwrap_or_default();
        let mut record = vec![neutralise_cell(key).into_owned()];
        if bucketed {
            record.push(
                r.bucket_start
                    .map(|b| to_datetime(b).to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
                    .unwrap_or_default(),
            );
        }
        record.push(dollars_text(r.amount));
        record.push(dollars_text(r.cash));
        w.write_record(&record).map_err(|e| broken(&e))?;
    }
    let body = w.into_inner().map_err(|e| broken(&e))?;
    let mut res = body.into_response();
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/csv; charset=utf-8"),
    );
    res.headers_mut().insert(
        header::CONTENT_DISPOSITION,
        HeaderValue::from_static("attachment; filename=\"spend.csv\""),
    );
    Ok(res)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn dollars_are_written_exactly() {
        assert_eq!(dollars_text(Money(12_500_000)), "12.500000");
        assert_eq!(dollars_text(Money(1)), "0.000001");
        assert_eq!(dollars_text(Money(-2_000_001)), "-2.000001");
    }

    #[test]
    fn cells_a_spreadsheet_would_run_as_formulas_are_quoted() {
        for (cell, want) in [
            ("=HYPERLINK(\"http://x\")", "'=HYPERLINK(\"http://x\")"),
            ("+1+1", "'+1+1"),
            ("-2+3", "'-2+3"),
            ("@SUM(A1)", "'@SUM(A1)"),
            ("\t=1", "'\t=1"),
            ("\r=1", "'\r=1"),
            ("ml-research", "ml-research"),
            ("aws:us-east-1", "aws:us-east-1"),
            ("", ""),
        ] {
            assert_eq!(neutralise_cell(cell), want, "{cell:?}");
        }
    }

    #[test]
    fn the_csv_quotes_formula_keys_and_keeps_negative_amounts_numeric() {
        let rows = [
            SpendGroupRow {
                key: Some("=cmd|' /C calc'!A0".into()),
                bucket_start: None,
                amount: Money(-1_500_000),
                cash: Money(-300_000),
            },
            SpendGroupRow {
                key: Some("ml".into()),
                bucket_start: None,
                amount: Money(2_000_000),
                cash: Money(400_000),
            },
        ];
        let res = csv_response(SpendGroup::Team, false, &rows).unwrap();
        let body =
            futures::executor::block_on(axum::body::to_bytes(res.into_body(), 1 << 20)).unwrap();
        let mut reader = csv::Reader::from_reader(&body[..]);
        let cells: Vec<Vec<String>> = reader
            .records()
            .map(|r| r.unwrap().iter().map(str::to_string).collect())
            .collect();
        assert_eq!(
            cells,
            [
                ["'=cmd|' /C calc'!A0", "-1.500000", "-0.300000"],
                ["ml", "2.000000", "0.400000"]
            ]
        );
    }
}

//! `/api/v1/waste` (admin, finance, infra): idle GPU-hours in a period, by team, and the jobs
//! that wasted most, as the waste rule recorded them (`control/waste.rs`, table `gpu_waste`).
//! A job's idle time counts in the period its last sample falls in (a job idle across a period
//! boundary counts whole in the later one).

use axum::Json;
use axum::extract::{Query, State};
use chrono::{Datelike, Duration as ChronoDuration, NaiveDate, NaiveTime, TimeZone, Utc};
use serde::Deserialize;
use switchyard_core::Timestamp;
use switchyard_protocol::api::{ErrorBody, Role, TeamWaste, WasteAction, WasteReport, WastedJob};
use utoipa::IntoParams;

use crate::clock::{from_datetime, to_datetime};
use crate::http::api::spend::time_param;
use crate::http::auth::Caller;
use crate::http::error::ApiError;
use crate::state::App;

/// Jobs listed as the worst, at most.
pub const WORST_JOBS: i64 = 20;

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct WasteParams {
    /// `month` (default: the calendar month, UTC), `week` (ISO, from Monday 00:00 UTC) or
    /// `day` (UTC); ignored when `from` is given.
    period: Option<String>,
    /// The start (RFC 3339); with it, `to` defaults to now.
    from: Option<String>,
    /// The end (RFC 3339).
    to: Option<String>,
}

/// The period `[start, end)` of `period` that holds `now`.
pub fn period_bounds(period: &str, now: Timestamp) -> Option<(Timestamp, Timestamp)> {
    let t = to_datetime(now);
    let midnight = |d: NaiveDate| from_datetime(Utc.from_utc_datetime(&d.and_time(NaiveTime::MIN)));
    let today = t.date_naive();
    let (start, end) = match period {
        "day" => (today, today + ChronoDuration::days(1)),
        "week" => {
            let monday =
                today - ChronoDuration::days(i64::from(today.weekday().num_days_from_monday()));
            (monday, monday + ChronoDuration::days(7))
        }
        "month" => {
            let first = NaiveDate::from_ymd_opt(t.year(), t.month(), 1)?;
            let next = if t.month() == 12 {
                NaiveDate::from_ymd_opt(t.year() + 1, 1, 1)?
            } else {
                NaiveDate::from_ymd_opt(t.year(), t.month() + 1, 1)?
            };
            (first, next)
        }
        _ => return None,
    };
    Some((midnight(start), midnight(end)))
}

/// A core priority as the API spells it.
pub fn wire_priority(p: switchyard_core::Priority) -> switchyard_protocol::api::Priority {
    use switchyard_protocol::api::Priority as P;
    match p {
        switchyard_core::Priority::Low => P::Low,
        switchyard_core::Priority::Normal => P::Normal,
        switchyard_core::Priority::High => P::High,
        switchyard_core::Priority::Critical => P::Critical,
    }
}

fn hours(ms: i64) -> f64 {
    ms as f64 / 3_600_000.0
}

/// Idle GPU-hours in the period by team, and the worst jobs.
#[utoipa::path(get, path = "/waste", tag = "spend", params(WasteParams),
    responses(
        (status = 200, body = WasteReport),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn report(
    State(app): State<App>,
    caller: Caller,
    params: Result<Query<WasteParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<WasteReport>, ApiError> {
    caller.require(&[Role::Admin, Role::Finance, Role::Infra])?;
    let Query(params) = params?;
    let now = app.clock.now();
    let from = time_param("from", params.from.as_deref())?;
    let to = time_param("to", params.to.as_deref())?;
    let (from, to) = match from {
        Some(f) => (f, to.unwrap_or(Timestamp(now.millis().saturating_add(1)))),
        None => {
            let period = params.period.as_deref().unwrap_or("month");
            period_bounds(period, now)
                .ok_or_else(|| ApiError::invalid("period", "must be month, week or day"))?
        }
    };
    if to <= from {
        return Err(ApiError::invalid("to", "must be after from"));
    }
    let teams = app.store.waste_by_team(from, to).await?;
    let worst = app.store.waste_rows(from, to, None, WORST_JOBS).await?;
    Ok(Json(WasteReport {
        from: to_datetime(from),
        to: to_datetime(to),
        total_idle_gpu_hours: hours(teams.iter().map(|(_, ms, _)| ms).sum()),
        teams: teams
            .into_iter()
            .map(|(team, ms, jobs)| TeamWaste {
                team,
                idle_gpu_hours: hours(ms),
                jobs: u32::try_from(jobs).unwrap_or(u32::MAX),
            })
            .collect(),
        worst: worst
            .into_iter()
            .map(|r| WastedJob {
                job_id: r.job.0,
                team: r.team,
                project: r.project,
                name: r.name,
                priority: wire_priority(r.priority),
                gpus: r.gpus,
                idle_gpu_hours: hours(r.idle_gpu_ms),
                activity_pct: r.activity_pct,
                idle_since: r.idle_since.map(to_datetime),
                last_sample_at: to_datetime(r.last_sample_at),
                action: r.action.as_deref().and_then(|a| match a {
                    "notify" => Some(WasteAction::Notify),
                    "stop" => Some(WasteAction::Stop),
                    "requeue" => Some(WasteAction::Requeue),
                    _ => None,
                }),
                reason: r.reason,
            })
            .collect(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn periods_hold_now() {
        // 2026-12-06T00:45Z, a Sunday.
        let now = from_datetime(Utc.with_ymd_and_hms(2026, 12, 6, 0, 45, 0).unwrap());
        let day = |y, m, d| from_datetime(Utc.with_ymd_and_hms(y, m, d, 0, 0, 0).unwrap());
        assert_eq!(
            period_bounds("month", now),
            Some((day(2026, 12, 1), day(2027, 1, 1)))
        );
        assert_eq!(
            period_bounds("week", now),
            Some((day(2026, 11, 30), day(2026, 12, 7)))
        );
        assert_eq!(
            period_bounds("day", now),
            Some((day(2026, 12, 6), day(2026, 12, 7)))
        );
        assert_eq!(period_bounds("year", now), None);
    }
}

//! Inference services (issue 26): validation of a [`ServiceSpec`] (every bad field refused with
//! 422 `invalid_field` naming it, or the job rules' own 422s), the wire job spec each replica
//! runs ([`replica_job_spec`], shared with the reconciler), the schedule's minimum at a time
//! ([`schedule_minimum`]), and the view users read.
//!
//! A replica is a job of kind `service`, so its resources, priority, spot rule, price ceiling
//! and allow-list are checked by the job rules (`convert::job_spec`, the catalogue's
//! `check_satisfiable`, the team's policy) on the replica's spec; their errors are given back
//! under the service's own field names ([`service_error`]).

use std::str::FromStr;

use chrono::{Datelike, Timelike, Weekday};
use chrono_tz::Tz;
use switchyard_core as core;
use switchyard_core::{JobState, Pool, Region, Timestamp};
use switchyard_protocol::agent;
use switchyard_protocol::api::{
    JobKind, JobSpec, ReplicaState, ReplicaView, ServiceSpec, ServiceState, ServiceView,
    TrafficView,
};

use crate::clock;
use crate::http::error::ApiError;
use crate::rules::convert;
use crate::rules::lease::AttemptState;
use crate::rules::policy::parse_hhmm;
use crate::store::{ServiceRecord, ServiceReplicaRow};

/// The most replicas a service may ask for: more is a mistake (or an attack on the budget).
pub const MAX_REPLICAS: i64 = 100;
/// Schedule rules, callers, at most.
pub const MAX_RULES: usize = 64;
pub const MAX_CALLERS: usize = 256;
/// Defaults of the readiness probe and of the autoscaler's window.
pub const DEFAULT_PERIOD_S: i64 = 2;
pub const DEFAULT_TIMEOUT_S: i64 = 1;
pub const DEFAULT_FAILURE_THRESHOLD: i64 = 3;
pub const DEFAULT_WINDOW_S: i64 = 30;
/// How far caller shares may be from summing to 1.
const SHARE_SLACK: f64 = 1e-6;

const DAYS: [(&str, Weekday); 7] = [
    ("mon", Weekday::Mon),
    ("tue", Weekday::Tue),
    ("wed", Weekday::Wed),
    ("thu", Weekday::Thu),
    ("fri", Weekday::Fri),
    ("sat", Weekday::Sat),
    ("sun", Weekday::Sun),
];

fn invalid(field: impl Into<String>, message: impl Into<String>) -> ApiError {
    ApiError::invalid_entity(field, message)
}

/// The wire job spec each replica of `spec` runs: kind `service`, the service's name, command,
/// environment, resources, priority, spot rule, allow-list, latency bound and price ceiling.
pub fn replica_job_spec(spec: &ServiceSpec) -> JobSpec {
    JobSpec {
        expected_gpu_utilization: None,
        name: spec.name.clone(),
        team: spec.team.clone(),
        project: spec.project.clone(),
        command: spec.command.clone(),
        env: spec.env.clone(),
        resources: spec.resources.clone(),
        estimated_runtime_s: None,
        deadline: None,
        priority: spec.priority,
        spot: spec.spot.as_ref().map(|s| s.rule),
        max_price_per_hour: spec.max_price_per_hour,
        regions: spec.regions.clone(),
        data: None,
        kind: Some(JobKind::Service),
        max_latency_ms: spec.max_latency_ms,
    }
}

/// How the agent serves a replica of `spec`: its readiness probe, defaults filled in.
pub fn serve_spec(spec: &ServiceSpec) -> agent::ServeSpec {
    let ms = |s: i64| u64::try_from(s.saturating_mul(1000)).unwrap_or(0);
    agent::ServeSpec {
        readiness: spec.readiness.as_ref().map(|r| agent::Readiness {
            path: r.path.clone(),
            period_ms: ms(r.period_s.unwrap_or(DEFAULT_PERIOD_S)),
            timeout_ms: ms(r.timeout_s.unwrap_or(DEFAULT_TIMEOUT_S)),
            failure_threshold: u32::try_from(
                r.failure_threshold.unwrap_or(DEFAULT_FAILURE_THRESHOLD),
            )
            .unwrap_or(1),
        }),
    }
}

/// `replicas` with its default (one replica), as validated numbers.
pub fn replica_range(spec: &ServiceSpec) -> (u32, u32) {
    match &spec.replicas {
        None => (1, 1),
        Some(r) => (
            u32::try_from(r.min).unwrap_or(0),
            u32::try_from(r.max).unwrap_or(0),
        ),
    }
}

/// The service's name for a field of its replica's job spec.
fn service_field(job_field: &str) -> String {
    match job_field {
        "spot" => "spot.rule".to_string(),
        other => other.to_string(),
    }
}

/// `message` (`"{old}: …"`) under the field's new name.
fn renamed(message: String, old: &str, new: &str) -> String {
    match message.strip_prefix(old).and_then(|m| m.strip_prefix(':')) {
        Some(rest) if old != new => format!("{new}:{rest}"),
        _ => message,
    }
}

/// An error of the job rules (or of reading the body) as the services API answers it: a bad
/// field is 422 `invalid_field` under the service's name of the field (a missing field named
/// too: `resources.gpus`); the rules' own 422s (`unsatisfiable`, `policy_violation`) keep their
/// code. Other errors pass through.
pub fn service_error(e: ApiError) -> ApiError {
    match e {
        ApiError::BadRequest {
            code: "invalid_field",
            field,
            message,
        } => {
            // serde names a missing field in its message only: `missing field `gpus``.
            let missing = message
                .split_once("missing field `")
                .and_then(|(_, rest)| rest.split_once('`'))
                .map(|(name, _)| name.to_string());
            let old = field.clone().unwrap_or_default();
            let new = match (&field, missing) {
                (Some(f), Some(m)) => format!("{f}.{m}"),
                (None, Some(m)) => m,
                (Some(f), None) => service_field(f),
                (None, None) => String::new(),
            };
            let message = if field.is_some() {
                renamed(message, &old, &new)
            } else {
                format!("{new}: {message}")
            };
            ApiError::InvalidEntity {
                field: new,
                message,
            }
        }
        ApiError::Unprocessable {
            field: Some(f),
            message,
            details,
        } => {
            let new = service_field(&f);
            ApiError::Unprocessable {
                message: renamed(message, &f, &new),
                field: Some(new),
                details,
            }
        }
        ApiError::PolicyViolation { field, message } => {
            let new = service_field(&field);
            ApiError::PolicyViolation {
                message: renamed(message, &field, &new),
                field: new,
            }
        }
        other => other,
    }
}

/// The checks that need no catalogue; returns the replica's validated job spec.
pub fn check_spec(spec: &ServiceSpec, now: Timestamp) -> Result<core::JobSpec, ApiError> {
    // The name is part of the endpoint's path (`/svc/TEAM/NAME/`).
    convert::check_slug("name", &spec.name).map_err(service_error)?;
    let mut replica = convert::job_spec(&replica_job_spec(spec), now).map_err(service_error)?;
    if spec.env.contains_key("PORT") {
        return Err(invalid(
            "env.PORT",
            "is set by the agent to the port the replica listens on",
        ));
    }
    if replica.resources.nodes > 1 {
        return Err(invalid(
            "resources.nodes",
            "a replica runs on one node; scale with replicas instead",
        ));
    }
    if spec.max_latency_ms == Some(0) {
        return Err(invalid("max_latency_ms", "must be at least 1 ms"));
    }
    let max = check_replicas(spec)?;
    check_scaling(spec)?;
    check_schedule(spec, max)?;
    check_readiness(spec)?;
    check_callers(spec)?;
    replica.callers = caller_shares(spec);
    if let Some(spot) = &spec.spot
        && let Some(n) = spot.min_on_demand
        && !(0..=max).contains(&n)
    {
        return Err(invalid(
            "spot.min_on_demand",
            format!("must be between 0 and replicas.max ({max})"),
        ));
    }
    Ok(replica)
}

/// `replicas`: `0 ≤ min ≤ max`, `1 ≤ max ≤ 100`. Returns `max`.
fn check_replicas(spec: &ServiceSpec) -> Result<i64, ApiError> {
    let Some(r) = &spec.replicas else {
        return Ok(1);
    };
    if r.min < 0 {
        return Err(invalid("replicas.min", "must be 0 or more"));
    }
    if !(1..=MAX_REPLICAS).contains(&r.max) {
        return Err(invalid(
            "replicas.max",
            format!("must be between 1 and {MAX_REPLICAS}"),
        ));
    }
    if r.min > r.max {
        return Err(invalid(
            "replicas.min",
            format!("must not exceed replicas.max ({})", r.max),
        ));
    }
    Ok(r.max)
}

fn check_scaling(spec: &ServiceSpec) -> Result<(), ApiError> {
    let Some(s) = &spec.scaling else {
        return Ok(());
    };
    let int = |v: Option<i64>, field: &str, lo: i64, hi: i64, what: &str| match v {
        Some(x) if !(lo..=hi).contains(&x) => Err(invalid(
            format!("scaling.{field}"),
            format!("must be {what} between {lo} and {hi}"),
        )),
        _ => Ok(()),
    };
    int(
        s.target_p95_latency_ms,
        "target_p95_latency_ms",
        1,
        600_000,
        "a number of milliseconds",
    )?;
    if let Some(rps) = s.target_rps_per_replica
        && !(rps.is_finite() && rps > 0.0 && rps <= 1e6)
    {
        return Err(invalid(
            "scaling.target_rps_per_replica",
            "must be a positive number of requests per second, at most 1000000",
        ));
    }
    int(
        s.max_concurrency_per_replica,
        "max_concurrency_per_replica",
        1,
        10_000,
        "a number of requests",
    )?;
    int(s.window_s, "window_s", 1, 3_600, "a number of seconds")?;
    int(
        s.scale_up_delay_s,
        "scale_up_delay_s",
        0,
        86_400,
        "a number of seconds",
    )?;
    int(
        s.scale_down_delay_s,
        "scale_down_delay_s",
        0,
        86_400,
        "a number of seconds",
    )
}

/// A schedule rule's day, `mon` … `sun`.
fn weekday(s: &str) -> Option<Weekday> {
    DAYS.iter().find(|(name, _)| *name == s).map(|(_, d)| *d)
}

fn check_schedule(spec: &ServiceSpec, max: i64) -> Result<(), ApiError> {
    if spec.schedule.len() > MAX_RULES {
        return Err(invalid("schedule", format!("at most {MAX_RULES} rules")));
    }
    for (i, rule) in spec.schedule.iter().enumerate() {
        let at = |f: &str| format!("schedule[{i}].{f}");
        if rule.days.is_empty() {
            return Err(invalid(at("days"), "must name at least one day"));
        }
        if rule.days.len() > 7 * 4 {
            return Err(invalid(at("days"), "at most 28 entries"));
        }
        for (j, d) in rule.days.iter().enumerate() {
            if weekday(d).is_none() {
                return Err(invalid(
                    format!("schedule[{i}].days[{j}]"),
                    format!("{d:?} is not a day: mon, tue, wed, thu, fri, sat or sun"),
                ));
            }
        }
        if parse_hhmm(&rule.from).filter(|m| *m < 1440).is_none() {
            return Err(invalid(
                at("from"),
                "must be a time of day HH:MM (00:00 to 23:59)",
            ));
        }
        if parse_hhmm(&rule.to).is_none() {
            return Err(invalid(
                at("to"),
                "must be a time of day HH:MM (00:00 to 24:00)",
            ));
        }
        if Tz::from_str(&rule.tz).is_err() {
            return Err(invalid(
                at("tz"),
                format!(
                    "{:?} is not an IANA time zone (e.g. \"Asia/Shanghai\", \"UTC\")",
                    rule.tz
                ),
            ));
        }
        if rule.min_replicas < 0 {
            return Err(invalid(at("min_replicas"), "must be 0 or more"));
        }
        if rule.min_replicas > max {
            return Err(invalid(
                at("min_replicas"),
                format!("must not exceed replicas.max ({max})"),
            ));
        }
    }
    Ok(())
}

fn check_readiness(spec: &ServiceSpec) -> Result<(), ApiError> {
    let Some(r) = &spec.readiness else {
        return Ok(());
    };
    if !r.path.starts_with('/') {
        return Err(invalid("readiness.path", "must start with '/'"));
    }
    if r.path.len() > 1024 || !r.path.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(invalid(
            "readiness.path",
            "at most 1024 visible ASCII characters (percent-encode the others)",
        ));
    }
    let period = r.period_s.unwrap_or(DEFAULT_PERIOD_S);
    if !(1..=3_600).contains(&period) {
        return Err(invalid(
            "readiness.period_s",
            "must be between 1 and 3600 seconds",
        ));
    }
    let timeout = r.timeout_s.unwrap_or(DEFAULT_TIMEOUT_S);
    if !(1..=60).contains(&timeout) {
        return Err(invalid(
            "readiness.timeout_s",
            "must be between 1 and 60 seconds",
        ));
    }
    if timeout > period {
        return Err(invalid(
            "readiness.timeout_s",
            format!("must not exceed readiness.period_s ({period})"),
        ));
    }
    if let Some(t) = r.failure_threshold
        && !(1..=100).contains(&t)
    {
        return Err(invalid(
            "readiness.failure_threshold",
            "must be between 1 and 100",
        ));
    }
    Ok(())
}

/// The service's callers as placement weighs them (shares in basis points); validated by
/// [`check_spec`].
pub fn caller_shares(spec: &ServiceSpec) -> Vec<core::CallerShare> {
    spec.callers
        .iter()
        .map(|c| core::CallerShare {
            region: core::RegionId(c.region.clone()),
            share_bp: (c.share.clamp(0.0, 1.0) * 10_000.0).round() as u32,
        })
        .collect()
}

fn check_callers(spec: &ServiceSpec) -> Result<(), ApiError> {
    if spec.callers.is_empty() {
        return Ok(());
    }
    if spec.callers.len() > MAX_CALLERS {
        return Err(invalid("callers", format!("at most {MAX_CALLERS} regions")));
    }
    let mut sum = 0.0;
    for (i, c) in spec.callers.iter().enumerate() {
        if !(c.share.is_finite() && (0.0..=1.0).contains(&c.share)) {
            return Err(invalid(
                format!("callers[{i}].share"),
                "must be a fraction between 0 and 1",
            ));
        }
        if spec.callers[..i].iter().any(|o| o.region == c.region) {
            return Err(invalid(
                format!("callers[{i}].region"),
                format!("{:?} is named twice", c.region),
            ));
        }
        sum += c.share;
    }
    if (sum - 1.0).abs() > SHARE_SLACK {
        return Err(invalid(
            "callers",
            format!("the shares must sum to 1, not {sum}"),
        ));
    }
    Ok(())
}

/// The checks against the catalogue: every region named exists, and some pool could ever run
/// a replica (`replica` from [`check_spec`]).
pub fn check_catalogue(
    spec: &ServiceSpec,
    replica: &core::JobSpec,
    regions: &[Region],
    pools: &[Pool],
) -> Result<(), ApiError> {
    let known = |r: &str| regions.iter().any(|x| x.id.as_str() == r);
    for (i, r) in spec.regions.iter().enumerate() {
        if !known(r) {
            return Err(invalid(
                format!("regions[{i}]"),
                format!("unknown region {r:?} (regions are provider:code, see GET /regions)"),
            ));
        }
    }
    for (i, c) in spec.callers.iter().enumerate() {
        if !known(&c.region) {
            return Err(invalid(
                format!("callers[{i}].region"),
                format!(
                    "unknown region {:?} (regions are provider:code, see GET /regions)",
                    c.region
                ),
            ));
        }
    }
    core::check_satisfiable(pools, replica)
        .map_err(|u| service_error(ApiError::unprocessable(u.field, u.message)))
}

/// Whether `rule`'s window covers local time `t` (weekday, minute of day): `days` are the
/// days a window starts on; a window past midnight (`20:00`–`08:00`) runs into the next day;
/// `from` = `to` is the whole day.
fn covers(days: &[Weekday], from: u16, to: u16, day: Weekday, minute: u16) -> bool {
    let to = if to == 1440 { 0 } else { to };
    if from == to {
        days.contains(&day)
    } else if from < to {
        days.contains(&day) && (from..to).contains(&minute)
    } else {
        (days.contains(&day) && minute >= from) || (days.contains(&day.pred()) && minute < to)
    }
}

/// `mon–fri`, `sat, sun`, `mon, wed`, `every day`: the days of a rule in week order.
fn days_text(days: &[Weekday]) -> String {
    let mut idx: Vec<u32> = days.iter().map(|d| d.num_days_from_monday()).collect();
    idx.sort_unstable();
    idx.dedup();
    if idx.len() == 7 {
        return "every day".into();
    }
    let name = |i: u32| DAYS[i as usize].0;
    let mut parts = Vec::new();
    let mut k = 0;
    while k < idx.len() {
        let mut end = k;
        while end + 1 < idx.len() && idx[end + 1] == idx[end] + 1 {
            end += 1;
        }
        if end - k >= 2 {
            parts.push(format!("{}–{}", name(idx[k]), name(idx[end])));
        } else {
            parts.extend((k..=end).map(|j| name(idx[j]).to_string()));
        }
        k = end + 1;
    }
    parts.join(", ")
}

/// The schedule's minimum at `now`: the largest `min_replicas` of the rules whose window
/// covers `now` in their own time zone (the first such rule on a tie), with the reason in
/// words ("schedule mon–fri 08:00–20:00 Asia/Shanghai: at least 4"). `None` when no rule
/// covers `now`. Rules that do not parse (never stored: validated first) are skipped.
pub fn schedule_minimum(spec: &ServiceSpec, now: Timestamp) -> Option<(u32, String)> {
    let now = clock::to_datetime(now);
    let mut best: Option<(u32, String)> = None;
    for rule in &spec.schedule {
        let (Ok(tz), Some(from), Some(to)) = (
            Tz::from_str(&rule.tz),
            parse_hhmm(&rule.from),
            parse_hhmm(&rule.to),
        ) else {
            continue;
        };
        let days: Vec<Weekday> = rule.days.iter().filter_map(|d| weekday(d)).collect();
        let local = now.with_timezone(&tz);
        let minute = (local.hour() * 60 + local.minute()) as u16;
        if !covers(&days, from, to, local.weekday(), minute) {
            continue;
        }
        let n = u32::try_from(rule.min_replicas).unwrap_or(0);
        if best.as_ref().is_none_or(|(b, _)| n > *b) {
            let reason = format!(
                "schedule {} {}–{} {}: at least {n}",
                days_text(&days),
                rule.from,
                rule.to,
                rule.tz
            );
            best = Some((n, reason));
        }
    }
    best
}

/// The replicas a service starts with at `now`: `replicas.min`, or the schedule's minimum
/// when it is higher (within `replicas.max`), and why. The autoscaler takes over from there.
pub fn initial_desired(spec: &ServiceSpec, now: Timestamp) -> (u32, String) {
    let (min, max) = replica_range(spec);
    match schedule_minimum(spec, now) {
        Some((n, reason)) if n > min => (n.min(max), reason),
        _ => (min, format!("replicas.min: at least {min}")),
    }
}

/// How a replica reads: draining once told to stop (a drain, a delete, a cancel, a
/// preemption), failed when its job ended on its own, ready when its probe passes, else
/// starting. A replica that was drained and has ended is not shown (`None`).
pub fn replica_state(r: &ServiceReplicaRow) -> Option<ReplicaState> {
    let attempt = r.attempt.as_ref();
    Some(match r.job_state {
        JobState::Cancelled => return None,
        JobState::Succeeded | JobState::Failed => ReplicaState::Failed,
        _ if r.cancel_requested || r.drain_at.is_some() => ReplicaState::Draining,
        _ if attempt.is_some_and(|a| a.state == AttemptState::Preempting) => ReplicaState::Draining,
        JobState::Running if attempt.is_some_and(|a| a.ready) => ReplicaState::Ready,
        _ => ReplicaState::Starting,
    })
}

/// The service as users read it. `gateway` is the gateway's `HOST:PORT`; traffic figures are
/// zero until the gateway reports.
pub fn service_view(
    record: &ServiceRecord,
    replicas: &[ServiceReplicaRow],
    gateway: Option<&str>,
) -> Result<ServiceView, ApiError> {
    let spec: ServiceSpec = serde_json::from_str(&record.spec_json).map_err(|e| {
        ApiError::Internal(format!(
            "stored spec of service {} unreadable: {e}",
            record.id
        ))
    })?;
    let mut views = Vec::with_capacity(replicas.len());
    let mut ready_now = 0u32;
    for r in replicas {
        let Some(state) = replica_state(r) else {
            continue;
        };
        if state == ReplicaState::Ready && r.service_version == record.spec_version {
            ready_now += 1;
        }
        let a = r.attempt.as_ref();
        views.push(ReplicaView {
            job_id: r.job.0,
            spec_version: r.service_version,
            state,
            region: a.map(|a| a.region.clone()).filter(|s| !s.is_empty()),
            pool: a.map(|a| a.pool.to_string()),
            node: a.map(|a| a.node.to_string()),
            market: a.map(|a| convert::market_name(a.market).to_string()),
            rps: 0.0,
            in_flight: 0,
            p95_ms: None,
        });
    }
    let state = if record.deleted_at.is_some() {
        ServiceState::Stopped
    } else if ready_now >= record.desired_replicas {
        ServiceState::Ready
    } else if ready_now == 0 {
        ServiceState::Deploying
    } else {
        ServiceState::Degraded
    };
    Ok(ServiceView {
        id: record.id,
        name: record.name.clone(),
        team: record.team.clone(),
        project: record.project.clone(),
        state,
        // Empty when this broker runs no gateway (`gateway_listen` unset).
        endpoint: gateway.map_or_else(String::new, |g| {
            format!("http://{g}/svc/{}/{}/", record.team, record.name)
        }),
        spec_version: record.spec_version,
        desired_replicas: record.desired_replicas,
        desired_reason: record.desired_reason.clone(),
        replicas: views,
        traffic: TrafficView {
            window_s: spec
                .scaling
                .as_ref()
                .and_then(|s| s.window_s)
                .unwrap_or(DEFAULT_WINDOW_S),
            ..TrafficView::default()
        },
        cost_usd: record.cost.as_dollars(),
        created_at: clock::to_datetime(record.created_at),
        updated_at: clock::to_datetime(record.updated_at),
        spec,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use chrono::{TimeZone, Utc};
    use serde_json::json;

    fn spec(extra: serde_json::Value) -> ServiceSpec {
        let mut base = json!({"name": "chat", "team": "ml", "command": ["serve"],
                              "resources": {"gpus": 1}, "replicas": {"min": 1, "max": 8}});
        for (k, v) in extra.as_object().unwrap() {
            base[k] = v.clone();
        }
        serde_json::from_value(base).unwrap()
    }

    fn at(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> Timestamp {
        clock::from_datetime(Utc.with_ymd_and_hms(y, mo, d, h, mi, 0).unwrap())
    }

    fn shanghai_weekdays() -> ServiceSpec {
        spec(
            json!({"schedule": [{"days": ["mon", "tue", "wed", "thu", "fri"], "from": "08:00",
                                  "to": "20:00", "tz": "Asia/Shanghai", "min_replicas": 4}]}),
        )
    }

    #[test]
    fn a_shanghai_working_day_counts_in_shanghai() {
        let s = shanghai_weekdays();
        // Wednesday 2026-12-02, 01:00 UTC = 09:00 in Shanghai.
        let (n, why) = schedule_minimum(&s, at(2026, 12, 2, 1, 0)).unwrap();
        assert_eq!(n, 4);
        assert_eq!(
            why,
            "schedule mon–fri 08:00–20:00 Asia/Shanghai: at least 4"
        );
        // 23:59 UTC Tuesday is 07:59 Wednesday there: not yet.
        assert_eq!(schedule_minimum(&s, at(2026, 12, 1, 23, 59)), None);
        // 00:00 UTC Wednesday is 08:00 there: from is inclusive.
        assert!(schedule_minimum(&s, at(2026, 12, 2, 0, 0)).is_some());
        // 12:00 UTC is 20:00 there: to is exclusive.
        assert_eq!(schedule_minimum(&s, at(2026, 12, 2, 12, 0)), None);
    }

    #[test]
    fn the_day_is_the_zones_day_not_utcs() {
        let s = shanghai_weekdays();
        // Friday 2026-12-04 23:30 UTC is Saturday 07:30 in Shanghai: a weekend.
        assert_eq!(schedule_minimum(&s, at(2026, 12, 4, 23, 30)), None);
        // Sunday 2026-12-06 18:00 UTC is Monday 02:00 there: too early; 01:00 UTC Monday is 09:00.
        assert_eq!(schedule_minimum(&s, at(2026, 12, 6, 18, 0)), None);
        assert_eq!(
            schedule_minimum(&s, at(2026, 12, 7, 1, 0)).map(|(n, _)| n),
            Some(4)
        );
        // Saturday 2026-12-05 in UTC daytime is Saturday there too.
        assert_eq!(schedule_minimum(&s, at(2026, 12, 5, 3, 0)), None);
    }

    #[test]
    fn new_york_follows_daylight_saving() {
        let s = spec(
            json!({"schedule": [{"days": ["mon", "tue", "wed", "thu", "fri"],
            "from": "09:00", "to": "17:00", "tz": "America/New_York", "min_replicas": 3}]}),
        );
        // Winter (EST, UTC-5): 14:00 UTC is 09:00; 13:30 UTC is 08:30.
        assert!(schedule_minimum(&s, at(2026, 12, 2, 14, 0)).is_some());
        assert!(schedule_minimum(&s, at(2026, 12, 2, 13, 30)).is_none());
        // Summer (EDT, UTC-4): 13:00 UTC is 09:00.
        assert!(schedule_minimum(&s, at(2026, 7, 1, 13, 0)).is_some());
        assert!(schedule_minimum(&s, at(2026, 7, 1, 21, 0)).is_none());
    }

    #[test]
    fn a_window_past_midnight_runs_into_the_next_day() {
        let s = spec(
            json!({"schedule": [{"days": ["fri"], "from": "22:00", "to": "02:00",
                                          "tz": "Europe/Berlin", "min_replicas": 2}]}),
        );
        // Friday 2026-12-04 22:30 Berlin (CET, UTC+1) = 21:30 UTC.
        assert!(schedule_minimum(&s, at(2026, 12, 4, 21, 30)).is_some());
        // Saturday 01:30 Berlin = 00:30 UTC Saturday: still Friday's window.
        assert!(schedule_minimum(&s, at(2026, 12, 5, 0, 30)).is_some());
        // Saturday 22:30 Berlin: not a Friday.
        assert!(schedule_minimum(&s, at(2026, 12, 5, 21, 30)).is_none());
        // Friday 01:30 Berlin: Thursday's window, and Thursday is not in the rule.
        assert!(schedule_minimum(&s, at(2026, 12, 4, 0, 30)).is_none());
    }

    #[test]
    fn the_largest_active_minimum_wins_and_whole_days_count() {
        let s = spec(json!({"schedule": [
            {"days": ["sat", "sun"], "from": "00:00", "to": "00:00", "tz": "UTC", "min_replicas": 2},
            {"days": ["mon", "tue", "wed", "thu", "fri", "sat", "sun"], "from": "10:00",
             "to": "24:00", "tz": "UTC", "min_replicas": 5},
            {"days": ["sat"], "from": "09:00", "to": "12:00", "tz": "UTC", "min_replicas": 3},
        ]}));
        // Saturday 2026-12-05 09:30 UTC: the first and the third; 3 wins.
        let (n, why) = schedule_minimum(&s, at(2026, 12, 5, 9, 30)).unwrap();
        assert_eq!(
            (n, why.as_str()),
            (3, "schedule sat 09:00–12:00 UTC: at least 3")
        );
        // 11:00: all three; 5.
        let (n, why) = schedule_minimum(&s, at(2026, 12, 5, 11, 0)).unwrap();
        assert_eq!(
            (n, why.as_str()),
            (5, "schedule every day 10:00–24:00 UTC: at least 5")
        );
        // Sunday 03:00: the weekend's whole day only.
        let (n, why) = schedule_minimum(&s, at(2026, 12, 6, 3, 0)).unwrap();
        assert_eq!(
            (n, why.as_str()),
            (2, "schedule sat, sun 00:00–00:00 UTC: at least 2")
        );
        // Monday 03:00: nothing.
        assert!(schedule_minimum(&s, at(2026, 12, 7, 3, 0)).is_none());
    }

    #[test]
    fn days_read_as_runs() {
        use Weekday::*;
        assert_eq!(days_text(&[Mon, Tue, Wed, Thu, Fri]), "mon–fri");
        assert_eq!(days_text(&[Sun, Sat]), "sat, sun");
        assert_eq!(days_text(&[Mon, Wed, Thu, Fri, Sun]), "mon, wed–fri, sun");
        assert_eq!(days_text(&[Mon, Mon]), "mon");
    }

    #[test]
    fn a_service_starts_at_its_minimum_or_its_schedules() {
        let s = shanghai_weekdays();
        assert_eq!(
            initial_desired(&s, at(2026, 12, 5, 3, 0)),
            (1, "replicas.min: at least 1".to_string())
        );
        assert_eq!(initial_desired(&s, at(2026, 12, 2, 3, 0)).0, 4);
        let one = spec(json!({"replicas": null}));
        assert_eq!(initial_desired(&one, at(2026, 12, 2, 3, 0)).0, 1);
    }

    #[test]
    fn the_replica_runs_the_services_job_spec() {
        let s = spec(
            json!({"priority": "critical", "spot": {"rule": "never", "min_on_demand": 1},
                            "regions": ["onprem:dc1"], "max_latency_ms": 40,
                            "max_price_per_hour": 20.0, "env": {"MODEL": "small"},
                            "project": "assistant",
                            "callers": [{"region": "aws:us-east-1", "share": 0.6},
                                        {"region": "onprem:dc1", "share": 0.4}]}),
        );
        let j = replica_job_spec(&s);
        assert_eq!(j.kind, Some(JobKind::Service));
        assert_eq!(j.name, "chat");
        assert_eq!(j.project.as_deref(), Some("assistant"));
        assert_eq!(j.spot, Some(switchyard_protocol::api::SpotRule::Never));
        assert_eq!(j.max_latency_ms, Some(40));
        assert_eq!(j.max_price_per_hour, Some(20.0));
        assert_eq!(j.regions, vec!["onprem:dc1".to_string()]);
        assert_eq!(j.env.get("MODEL").map(String::as_str), Some("small"));
        assert!(j.deadline.is_none() && j.estimated_runtime_s.is_none());
        let core = check_spec(&s, at(2026, 12, 2, 3, 0)).unwrap();
        assert_eq!(core.priority, core::Priority::Critical);
        assert_eq!(core.kind, core::JobKind::Service);
        // Placement weighs the callers' shares (basis points).
        let shares: Vec<(&str, u32)> = core
            .callers
            .iter()
            .map(|c| (c.region.as_str(), c.share_bp))
            .collect();
        assert_eq!(
            shares,
            vec![("aws:us-east-1", 6_000), ("onprem:dc1", 4_000)]
        );
    }

    #[test]
    fn job_rule_errors_come_back_under_the_services_names() {
        let e = |extra| match check_spec(&spec(extra), at(2026, 12, 2, 3, 0)) {
            Err(ApiError::InvalidEntity { field, message }) => (field, message),
            other => panic!("{other:?}"),
        };
        assert_eq!(e(json!({"resources": {"gpus": 0}})).0, "resources.gpus");
        assert_eq!(e(json!({"name": "has space"})).0, "name");
        assert_eq!(
            e(json!({"max_price_per_hour": -1.0})).0,
            "max_price_per_hour"
        );
        let (f, m) = e(json!({"env": {"PORT": "80"}}));
        assert_eq!(f, "env.PORT");
        assert!(m.starts_with("env.PORT: "), "{m}");
        // A serde error without a path names the missing field.
        let missing = service_error(ApiError::BadRequest {
            code: "invalid_field",
            field: None,
            message: "missing field `command` at line 1 column 2".into(),
        });
        assert!(
            matches!(&missing, ApiError::InvalidEntity { field, .. } if field == "command"),
            "{missing:?}"
        );
        let nested = service_error(ApiError::BadRequest {
            code: "invalid_field",
            field: Some("resources".into()),
            message: "resources: missing field `gpus`".into(),
        });
        assert!(
            matches!(&nested, ApiError::InvalidEntity { field, .. } if field == "resources.gpus"),
            "{nested:?}"
        );
        let spot = service_error(ApiError::PolicyViolation {
            field: "spot".into(),
            message: "spot: capped".into(),
        });
        assert!(
            matches!(&spot, ApiError::PolicyViolation { field, message }
                if field == "spot.rule" && message == "spot.rule: capped"),
            "{spot:?}"
        );
        // Malformed JSON stays 400.
        let malformed = service_error(ApiError::BadRequest {
            code: "malformed_json",
            field: None,
            message: "EOF".into(),
        });
        assert!(matches!(
            malformed,
            ApiError::BadRequest {
                code: "malformed_json",
                ..
            }
        ));
    }

    fn replica(version: i64, state: JobState, ready: bool, cancel: bool) -> ServiceReplicaRow {
        use switchyard_core::{AttemptId, JobId, Market, NodeId, PoolId};
        ServiceReplicaRow {
            job: JobId(uuid::Uuid::now_v7()),
            service_version: version,
            job_state: state,
            cancel_requested: cancel,
            drain_at: None,
            finished_at: None,
            reason: None,
            on_demand_only: false,
            attempt: (state == JobState::Running).then(|| crate::store::ReplicaAttemptRow {
                attempt: AttemptId(uuid::Uuid::now_v7()),
                state: AttemptState::Running,
                node: NodeId("n1".into()),
                pool: PoolId("onprem:dc/h100".into()),
                region: "onprem:dc".into(),
                market: Market::OnDemand,
                serve_host: Some("127.0.0.1".into()),
                serve_port: Some(41000),
                ready,
                node_draining: false,
            }),
        }
    }

    #[test]
    fn the_state_reads_from_the_current_versions_ready_replicas() {
        let record = ServiceRecord {
            id: uuid::Uuid::now_v7(),
            team: "ml".into(),
            project: None,
            name: "chat".into(),
            spec_json: serde_json::to_string(&spec(json!({}))).unwrap(),
            spec_version: 2,
            desired_replicas: 2,
            desired_reason: "replicas.min: at least 2".into(),
            created_at: Timestamp(0),
            updated_at: Timestamp(0),
            deleted_at: None,
            cost: core::Money(1_500_000),
        };
        let state = |rs: &[ServiceReplicaRow], r: &ServiceRecord| {
            service_view(r, rs, Some("127.0.0.1:8081")).unwrap().state
        };
        let old_ready = replica(1, JobState::Running, true, false);
        let new_ready = replica(2, JobState::Running, true, false);
        let new_starting = replica(2, JobState::Running, false, false);
        let queued = replica(2, JobState::Queued, false, false);
        // Only the old version is ready: still deploying the new one.
        assert_eq!(
            state(&[old_ready.clone(), new_starting.clone()], &record),
            ServiceState::Deploying
        );
        assert_eq!(
            state(
                &[old_ready.clone(), new_ready.clone(), queued.clone()],
                &record
            ),
            ServiceState::Degraded
        );
        let two = [new_ready.clone(), new_ready.clone(), old_ready.clone()];
        assert_eq!(state(&two, &record), ServiceState::Ready);
        let zero = ServiceRecord {
            desired_replicas: 0,
            ..record.clone()
        };
        assert_eq!(state(&[], &zero), ServiceState::Ready);
        let deleted = ServiceRecord {
            deleted_at: Some(Timestamp(1)),
            ..record.clone()
        };
        assert_eq!(state(&two, &deleted), ServiceState::Stopped);

        let v = service_view(&record, &two, Some("127.0.0.1:8081")).unwrap();
        assert_eq!(v.cost_usd, 1.5);
        assert_eq!(v.replicas[0].region.as_deref(), Some("onprem:dc"));
        assert_eq!(v.replicas[0].market.as_deref(), Some("on_demand"));
        assert_eq!(v.replicas[0].spec_version, 2);

        // Replica states: draining once told to stop, failed when ended on its own, not
        // shown once drained and ended.
        let read = |r: &ServiceReplicaRow| replica_state(r);
        assert_eq!(read(&new_ready), Some(ReplicaState::Ready));
        assert_eq!(read(&new_starting), Some(ReplicaState::Starting));
        assert_eq!(read(&queued), Some(ReplicaState::Starting));
        assert_eq!(
            read(&replica(2, JobState::Running, true, true)),
            Some(ReplicaState::Draining)
        );
        assert_eq!(
            read(&replica(2, JobState::Failed, false, false)),
            Some(ReplicaState::Failed)
        );
        assert_eq!(read(&replica(2, JobState::Cancelled, false, true)), None);
        let mut preempting = new_ready.clone();
        if let Some(a) = preempting.attempt.as_mut() {
            a.state = AttemptState::Preempting;
        }
        assert_eq!(read(&preempting), Some(ReplicaState::Draining));
    }

    #[test]
    fn the_probe_gets_its_defaults() {
        let s = spec(json!({"readiness": {"path": "/health"}}));
        let r = serve_spec(&s).readiness.unwrap();
        assert_eq!(
            (r.period_ms, r.timeout_ms, r.failure_threshold),
            (2000, 1000, 3)
        );
        assert_eq!(serve_spec(&spec(json!({}))).readiness, None);
    }
}

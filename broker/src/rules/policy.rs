//! Team policies: validation of what finance sends (field-level errors), conversion into the
//! planner's [`TeamPolicy`], and the submit-time check that refuses a job its team's policy can
//! never allow. What-if is `what_if.rs`. The `utilization` section (the waste rule, issue 28) is
//! checked here and converted by [`utilization_rule`]; it is carried out by
//! `control/waste.rs`.
//!
//! Policies are stored as sent ([`PolicyBody`], dollars and local times); the planner gets plain
//! values: micro-dollars, UTC minute ranges. Time windows are converted for the date of `now`
//! in their own zone, so a window keeps its local meaning across daylight-saving changes.

use std::str::FromStr;

use chrono::{DateTime, Duration, NaiveTime, TimeZone, Timelike, Utc};
use chrono_tz::Tz;
use switchyard_core as core;
use switchyard_core::{Money, Pool, Region, SpotRule, TeamPolicy, Timestamp};
use switchyard_protocol::api::{
    BudgetPeriod, PolicyBody, PolicyWindow, Priority, UtilizationRule, WasteAction,
};

use crate::clock;
use crate::http::error::ApiError;
use crate::store::PolicyRecord;

/// Team and project names: the job spec's rule ([`crate::rules::convert::check_slug`]).
pub fn check_name(field: &str, s: &str) -> Result<(), ApiError> {
    crate::rules::convert::check_slug(field, s)
}

/// A policy's time windows, at most: each is checked on every scheduler round.
pub const MAX_WINDOWS: usize = 64;
/// A budget's alert thresholds, at most: each can alert once per period.
pub const MAX_ALERTS: usize = 16;
/// Allow-lists of providers or regions and on-prem rates, at most (a catalogue has fewer).
pub const MAX_LIST: usize = 1024;

fn positive_dollars(field: &str, v: f64) -> Result<Money, ApiError> {
    Money::from_dollars(v)
        .filter(|m| v > 0.0 && m.micros() > 0)
        .ok_or_else(|| ApiError::invalid(field, "must be a positive, finite amount of USD"))
}

/// `HH:MM` (00:00 to 23:59, or 24:00 for the end of the day) as minutes after midnight.
pub fn parse_hhmm(s: &str) -> Option<u16> {
    let (h, m) = s.split_once(':')?;
    if h.len() != 2 || m.len() != 2 || !(h.bytes().chain(m.bytes())).all(|b| b.is_ascii_digit()) {
        return None;
    }
    let (h, m): (u16, u16) = (h.parse().ok()?, m.parse().ok()?);
    match (h, m) {
        (24, 0) => Some(1440),
        (0..=23, 0..=59) => Some(h * 60 + m),
        _ => None,
    }
}

fn window_tz(w: &PolicyWindow) -> Option<Tz> {
    Tz::from_str(w.tz.as_deref().unwrap_or("UTC")).ok()
}

/// Checks a policy body against the catalogue: 400 for a malformed value, 422 for a provider,
/// region or GPU model the catalogue does not have; `field` is the dotted path.
pub fn validate(body: &PolicyBody, regions: &[Region], pools: &[Pool]) -> Result<(), ApiError> {
    if let Some(b) = &body.budget {
        if !b.amount_usd.is_finite()
            || b.amount_usd < 0.0
            || Money::from_dollars(b.amount_usd).is_none()
        {
            return Err(ApiError::invalid(
                "budget.amount_usd",
                "must be a finite amount of USD, at least 0",
            ));
        }
        match b.period {
            BudgetPeriod::Custom => match (b.from, b.to) {
                (None, _) => {
                    return Err(ApiError::invalid(
                        "budget.from",
                        "a custom period needs `from`",
                    ));
                }
                (_, None) => {
                    return Err(ApiError::invalid("budget.to", "a custom period needs `to`"));
                }
                (Some(from), Some(to)) if from >= to => {
                    return Err(ApiError::invalid("budget.to", "must be after `from`"));
                }
                _ => {}
            },
            BudgetPeriod::Month | BudgetPeriod::Week => {
                if b.from.is_some() {
                    return Err(ApiError::invalid(
                        "budget.from",
                        "only with period \"custom\" (month and week periods are calendar ones, UTC)",
                    ));
                }
                if b.to.is_some() {
                    return Err(ApiError::invalid(
                        "budget.to",
                        "only with period \"custom\" (month and week periods are calendar ones, UTC)",
                    ));
                }
            }
        }
        if b.alert_at.len() > MAX_ALERTS {
            return Err(ApiError::invalid(
                "budget.alert_at",
                "at most 16 thresholds",
            ));
        }
        for (i, a) in b.alert_at.iter().enumerate() {
            if !(a.is_finite() && *a > 0.0 && *a <= 1.0) {
                return Err(ApiError::invalid(
                    format!("budget.alert_at[{i}]"),
                    "must be a fraction of the budget in (0, 1]",
                ));
            }
        }
    }
    if let Some(p) = body.max_price_per_gpu_hour {
        positive_dollars("max_price_per_gpu_hour", p)?;
    }
    for (field, len) in [
        (
            "allowed_providers",
            body.allowed_providers.as_ref().map(Vec::len),
        ),
        (
            "allowed_regions",
            body.allowed_regions.as_ref().map(Vec::len),
        ),
        ("onprem_rates", body.onprem_rates.as_ref().map(|r| r.len())),
    ] {
        if len.is_some_and(|n| n > MAX_LIST) {
            return Err(ApiError::invalid(field, "at most 1024 entries"));
        }
    }
    if let Some(list) = &body.allowed_providers {
        if list.is_empty() {
            return Err(ApiError::invalid(
                "allowed_providers",
                "must name at least one provider (null allows any)",
            ));
        }
        for (i, p) in list.iter().enumerate() {
            let known = regions.iter().any(|r| r.provider.eq_ignore_ascii_case(p))
                || pools.iter().any(|x| x.provider.eq_ignore_ascii_case(p));
            if !known {
                let mut have: Vec<&str> = regions.iter().map(|r| r.provider.as_str()).collect();
                have.sort_unstable();
                have.dedup();
                return Err(ApiError::unprocessable(
                    format!("allowed_providers[{i}]"),
                    format!(
                        "unknown provider {p:?}; the catalogue has {}",
                        have.join(", ")
                    ),
                ));
            }
        }
    }
    if let Some(list) = &body.allowed_regions {
        if list.is_empty() {
            return Err(ApiError::invalid(
                "allowed_regions",
                "must name at least one region (null allows any)",
            ));
        }
        for (i, r) in list.iter().enumerate() {
            if !regions.iter().any(|x| x.id.as_str() == r) {
                return Err(ApiError::unprocessable(
                    format!("allowed_regions[{i}]"),
                    format!("unknown region {r:?} (regions are provider:code, see GET /regions)"),
                ));
            }
        }
    }
    if body.windows.as_ref().is_some_and(|w| w.len() > MAX_WINDOWS) {
        return Err(ApiError::invalid("windows", "at most 64 windows"));
    }
    for (i, w) in body.windows.iter().flatten().enumerate() {
        if parse_hhmm(&w.from).filter(|m| *m < 1440).is_none() {
            return Err(ApiError::invalid(
                format!("windows[{i}].from"),
                "must be a time of day HH:MM (00:00 to 23:59)",
            ));
        }
        if parse_hhmm(&w.to).is_none() {
            return Err(ApiError::invalid(
                format!("windows[{i}].to"),
                "must be a time of day HH:MM (00:00 to 24:00)",
            ));
        }
        if window_tz(w).is_none() {
            return Err(ApiError::invalid(
                format!("windows[{i}].tz"),
                format!(
                    "{:?} is not an IANA time zone (e.g. \"Asia/Shanghai\", \"UTC\")",
                    w.tz.as_deref().unwrap_or_default()
                ),
            ));
        }
    }
    if let Some(rates) = &body.onprem_rates {
        for (model, rate) in rates {
            let field = format!("onprem_rates.{model}");
            positive_dollars(&field, *rate)?;
            if !pools
                .iter()
                .any(|p| p.gpu_model.eq_ignore_ascii_case(model))
            {
                return Err(ApiError::unprocessable(
                    field,
                    format!("no pool in the catalogue has GPU model {model:?}"),
                ));
            }
        }
    }
    if let Some(u) = &body.utilization {
        check_utilization(u)?;
    }
    Ok(())
}

/// The shortest and longest `utilization.window_s`: under a minute is a few heartbeats (noise);
/// over a week no job would ever meet it.
pub const UTILIZATION_WINDOW_S: std::ops::RangeInclusive<u32> = 60..=7 * 24 * 3600;

fn check_utilization(u: &UtilizationRule) -> Result<(), ApiError> {
    if !(1..=100).contains(&u.min_gpu_utilization_pct) {
        return Err(ApiError::invalid(
            "utilization.min_gpu_utilization_pct",
            "must be a percentage from 1 to 100",
        ));
    }
    if !UTILIZATION_WINDOW_S.contains(&u.window_s) {
        return Err(ApiError::invalid(
            "utilization.window_s",
            "must be from 60 seconds to 604800 (7 days)",
        ));
    }
    for (i, p) in u.exempt_priorities.iter().enumerate() {
        if u.exempt_priorities[..i].contains(p) {
            return Err(ApiError::invalid(
                format!("utilization.exempt_priorities[{i}]"),
                "is listed twice",
            ));
        }
    }
    Ok(())
}

/// A policy's waste rule as core's [`core::waste::UtilizationRule`], if it has one (and it is
/// valid: a stored body was checked when it was put).
pub fn utilization_rule(body: &PolicyBody) -> Option<core::waste::UtilizationRule> {
    let u = body.utilization.as_ref()?;
    Some(core::waste::UtilizationRule {
        min_gpu_utilization_pct: u8::try_from(u.min_gpu_utilization_pct.clamp(1, 100)).ok()?,
        window_s: u.window_s,
        action: match u.action {
            WasteAction::Notify => core::waste::WasteAction::Notify,
            WasteAction::Stop => core::waste::WasteAction::Stop,
            WasteAction::Requeue => core::waste::WasteAction::Requeue,
        },
        exempt_priorities: u
            .exempt_priorities
            .iter()
            .map(|p| core_priority(*p))
            .collect(),
    })
}

fn core_priority(p: Priority) -> core::Priority {
    match p {
        Priority::Low => core::Priority::Low,
        Priority::Normal => core::Priority::Normal,
        Priority::High => core::Priority::High,
        Priority::Critical => core::Priority::Critical,
    }
}

fn core_spot(s: switchyard_protocol::api::SpotRule) -> SpotRule {
    match s {
        switchyard_protocol::api::SpotRule::Never => SpotRule::Never,
        switchyard_protocol::api::SpotRule::Allowed => SpotRule::Allowed,
        switchyard_protocol::api::SpotRule::Preferred => SpotRule::Preferred,
    }
}

/// The UTC minute of day at which local `minute` (in `tz`, on the local date of `now`) falls.
fn utc_minute(tz: Tz, minute: u16, now: DateTime<Utc>) -> u16 {
    let date = now.with_timezone(&tz).date_naive();
    let local = date.and_time(NaiveTime::MIN) + Duration::minutes(i64::from(minute));
    // A time skipped by a daylight-saving jump is taken an hour later.
    let at = tz
        .from_local_datetime(&local)
        .earliest()
        .or_else(|| {
            tz.from_local_datetime(&(local + Duration::hours(1)))
                .earliest()
        })
        .map(|t| t.with_timezone(&Utc))
        .unwrap_or(now);
    (at.hour() * 60 + at.minute()) as u16
}

/// One window as a UTC minute range for the date of `now`.
fn utc_window(w: &PolicyWindow, now: DateTime<Utc>) -> Option<core::TimeWindow> {
    let tz = window_tz(w)?;
    let from = parse_hhmm(&w.from)?;
    let to = parse_hhmm(&w.to)?;
    if from == to % 1440 {
        // The whole day, whatever the zone.
        return Some(core::TimeWindow {
            start_minute: 0,
            end_minute: 0,
        });
    }
    Some(core::TimeWindow {
        start_minute: utc_minute(tz, from, now),
        end_minute: utc_minute(tz, to % 1440, now),
    })
}

/// A stored policy as the planner takes it, for the date of `now`. Windows of the same priority
/// are alternatives (a job may start in any of them); `remaining_budget` is left `None` for the
/// caller to fill from the ledger. On-prem rates are prices, not rules: see [`onprem_rate`].
pub fn policy_to_core(record: &PolicyRecord, now: Timestamp) -> TeamPolicy {
    let b = &record.body;
    let now_dt = clock::to_datetime(now);
    let mut windows: Vec<core::PriorityWindows> = Vec::new();
    for w in b.windows.iter().flatten() {
        let Some(tw) = utc_window(w, now_dt) else {
            continue;
        };
        let priorities: Vec<core::Priority> = w.priority.map(core_priority).into_iter().collect();
        match windows.iter_mut().find(|pw| pw.priorities == priorities) {
            Some(pw) => pw.windows.push(tw),
            None => windows.push(core::PriorityWindows {
                priorities,
                windows: vec![tw],
            }),
        }
    }
    TeamPolicy {
        team: record.team.clone(),
        project: record.project.clone(),
        allowed_providers: b.allowed_providers.clone().unwrap_or_default(),
        allowed_regions: b
            .allowed_regions
            .iter()
            .flatten()
            .map(|r| core::RegionId::new(r.clone()))
            .collect(),
        max_price_per_gpu_hour: b.max_price_per_gpu_hour.and_then(Money::from_dollars),
        spot: b.spot.map_or(SpotRule::Preferred, core_spot),
        burst_allowed: b.burst.unwrap_or(true),
        windows,
        priority_ceiling: b.priority_ceiling.map(core_priority),
        remaining_budget: None,
        objective: match b.objective.unwrap_or_default() {
            switchyard_protocol::api::Objective::Company => core::Objective::Company,
            switchyard_protocol::api::Objective::Team => core::Objective::Team,
        },
    }
}

/// The on-prem internal rate per GPU-hour a policy sets for `gpu_model`, if any.
pub fn onprem_rate(record: &PolicyRecord, gpu_model: &str) -> Option<Money> {
    record
        .body
        .onprem_rates
        .as_ref()?
        .iter()
        .find(|(m, _)| m.eq_ignore_ascii_case(gpu_model))
        .and_then(|(_, r)| Money::from_dollars(*r))
}

/// `pool` priced with the on-prem rates of the policies that cover a job of `team` and
/// `project` (the project's rate wins over the team's). Cloud pools are returned unchanged.
pub fn priced_for(
    pool: &Pool,
    records: &[PolicyRecord],
    team: &str,
    project: Option<&str>,
) -> Pool {
    let mut out = pool.clone();
    if pool.launchable || pool.provider != "onprem" {
        return out;
    }
    let rate = records
        .iter()
        .filter(|r| r.team == team && r.project.is_some() && r.project.as_deref() == project)
        .chain(
            records
                .iter()
                .filter(|r| r.team == team && r.project.is_none()),
        )
        .find_map(|r| onprem_rate(r, &pool.gpu_model));
    if let Some(per_gpu) = rate {
        out.on_demand_per_hour = per_gpu.saturating_mul(i64::from(pool.gpus_per_node.max(1)));
    }
    out
}

fn policy_name(p: &TeamPolicy) -> String {
    match &p.project {
        Some(project) => format!("the policy of project {}/{project}", p.team),
        None => format!("the policy of team {}", p.team),
    }
}

fn violation(field: &str, message: String) -> ApiError {
    ApiError::PolicyViolation {
        field: field.to_string(),
        message: format!("{field}: {message}"),
    }
}

fn allowed_by(p: &TeamPolicy, pool: &Pool) -> Result<(), &'static str> {
    if !p.allowed_providers.is_empty()
        && !p
            .allowed_providers
            .iter()
            .any(|a| a.eq_ignore_ascii_case(&pool.provider))
    {
        return Err("allowed_providers");
    }
    if !p.allowed_regions.is_empty() && !p.allowed_regions.contains(&pool.region) {
        return Err("allowed_regions");
    }
    Ok(())
}

fn rule_list(p: &TeamPolicy, rule: &str) -> String {
    let list: Vec<String> = match rule {
        "allowed_providers" => p.allowed_providers.clone(),
        _ => p.allowed_regions.iter().map(ToString::to_string).collect(),
    };
    format!("{rule} [{}]", list.join(", "))
}

/// Refuses (422 `policy_violation`) a job that the policies covering it can never allow,
/// whatever the load: every pool that could run it is outside the allow-lists, or over the
/// GPU-hour price ceiling in every market the spot rule leaves it. A priority above the
/// ceiling is not refused (the planner caps it), and a budget is not checked here: a job over
/// budget is held until the budget allows (it may be raised).
pub fn check_submit(
    policies: &[TeamPolicy],
    pools: &[Pool],
    spec: &core::JobSpec,
) -> Result<(), ApiError> {
    let covering: Vec<&TeamPolicy> = policies
        .iter()
        .filter(|p| p.applies_to(&spec.team, spec.project.as_deref()))
        .collect();
    if covering.is_empty() {
        return Ok(());
    }
    // The job's own regions, each against the allow-lists.
    if !spec.regions.is_empty() {
        for p in &covering {
            let blocked = spec.regions.iter().all(|r| {
                let provider_ok = p.allowed_providers.is_empty()
                    || p.allowed_providers
                        .iter()
                        .any(|a| a.eq_ignore_ascii_case(r.provider()));
                let region_ok = p.allowed_regions.is_empty() || p.allowed_regions.contains(r);
                !(provider_ok && region_ok)
            });
            if blocked {
                // The provider list when it alone rules out every region asked for.
                let providers_block = !p.allowed_providers.is_empty()
                    && spec.regions.iter().all(|r| {
                        !p.allowed_providers
                            .iter()
                            .any(|a| a.eq_ignore_ascii_case(r.provider()))
                    });
                let rule = if providers_block {
                    "allowed_providers"
                } else {
                    "allowed_regions"
                };
                return Err(violation(
                    "regions",
                    format!(
                        "none of the job's regions is allowed by {} ({})",
                        policy_name(p),
                        rule_list(p, rule)
                    ),
                ));
            }
        }
    }
    let spot = covering.iter().map(|p| p.spot).fold(spec.spot, Ord::min);
    let capped = core::JobSpec {
        spot,
        ..spec.clone()
    };
    let fits: Vec<&Pool> = pools
        .iter()
        .filter(|p| core::placement::hard_constraint(p, &capped).is_none())
        .collect();
    if fits.is_empty() {
        // It would fit with its own spot rule: the policy's spot cap is what rules it out.
        if spot < spec.spot
            && let Some(p) = covering.iter().find(|p| p.spot < spec.spot)
            && pools
                .iter()
                .any(|pool| core::placement::hard_constraint(pool, spec).is_none())
        {
            return Err(violation(
                "spot",
                format!(
                    "{} caps spot at {:?}, and no pool is within the job's max_price_per_hour \
                     without spot",
                    policy_name(p),
                    p.spot
                ),
            ));
        }
        // Not the policy's doing: the satisfiability check reports it.
        return Ok(());
    }
    let mut allowed: Vec<&Pool> = Vec::new();
    let mut first_block: Option<(&TeamPolicy, &'static str)> = None;
    'pools: for pool in &fits {
        for p in &covering {
            if let Err(rule) = allowed_by(p, pool) {
                first_block.get_or_insert((p, rule));
                continue 'pools;
            }
        }
        allowed.push(pool);
    }
    if allowed.is_empty() {
        let (p, rule) = first_block.unwrap_or((covering[0], "allowed_providers"));
        return Err(violation(
            "regions",
            format!(
                "no pool that can run this job is allowed by {} ({})",
                policy_name(p),
                rule_list(p, rule)
            ),
        ));
    }
    let max = covering
        .iter()
        .filter_map(|p| p.max_price_per_gpu_hour.map(|m| (m, *p)))
        .min_by_key(|(m, _)| *m);
    if let Some((max, p)) = max {
        let price =
            |pool: &Pool, rule: SpotRule| pool.price_per_gpu_hour(pool.cheapest_market(rule));
        let cheapest = allowed.iter().map(|pool| price(pool, spot)).min();
        if cheapest.is_some_and(|c| c > max) {
            let with_spot = allowed
                .iter()
                .any(|pool| price(pool, SpotRule::Allowed) <= max);
            if spot == SpotRule::Never && with_spot {
                return Err(violation(
                    "spot",
                    format!(
                        "only spot capacity is within max_price_per_gpu_hour {max} of {}, and \
                         spot is never (the job's or a policy's rule)",
                        policy_name(p)
                    ),
                ));
            }
            return Err(violation(
                "max_price_per_hour",
                format!(
                    "{} sets max_price_per_gpu_hour {max}; the cheapest allowed pool that can \
                     run this job costs {} per GPU-hour",
                    policy_name(p),
                    cheapest.unwrap_or(Money::ZERO)
                ),
            ));
        }
    }
    Ok(())
}

/// [`check_submit`] against the current policies of the job's team (and project).
pub async fn check_submit_against_store(
    store: &crate::store::Store,
    pools: &[Pool],
    spec: &core::JobSpec,
    now: Timestamp,
) -> Result<(), ApiError> {
    let mut records = Vec::new();
    if let Some(r) = store.policy(&spec.team, None).await? {
        records.push(r);
    }
    if let Some(project) = spec.project.as_deref()
        && let Some(r) = store.policy(&spec.team, Some(project)).await?
    {
        records.push(r);
    }
    if records.is_empty() {
        return Ok(());
    }
    let policies: Vec<TeamPolicy> = records.iter().map(|r| policy_to_core(r, now)).collect();
    // Pools at the prices the live planner sees, so that what is refused here is exactly what
    // it could never place.
    check_submit(&policies, pools, spec)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn record(body: PolicyBody) -> PolicyRecord {
        PolicyRecord {
            team: "ml".into(),
            project: None,
            version: 1,
            body,
            updated_at: Timestamp(0),
            updated_by: "test".into(),
        }
    }

    #[test]
    fn hhmm() {
        assert_eq!(parse_hhmm("00:00"), Some(0));
        assert_eq!(parse_hhmm("20:30"), Some(1230));
        assert_eq!(parse_hhmm("24:00"), Some(1440));
        assert_eq!(parse_hhmm("24:01"), None);
        assert_eq!(parse_hhmm("8:00"), None);
        assert_eq!(parse_hhmm("08:60"), None);
        assert_eq!(parse_hhmm("ab:cd"), None);
    }

    #[test]
    fn shanghai_night_window_is_utc_noon_to_midnight() {
        let body = PolicyBody {
            windows: Some(vec![PolicyWindow {
                priority: Some(Priority::Low),
                from: "20:00".into(),
                to: "08:00".into(),
                tz: Some("Asia/Shanghai".into()),
            }]),
            ..PolicyBody::default()
        };
        // 2026-12-02T10:00Z.
        let now = Timestamp::from_secs(1_796_205_600);
        let p = policy_to_core(&record(body), now);
        assert_eq!(p.windows.len(), 1);
        assert_eq!(p.windows[0].priorities, vec![core::Priority::Low]);
        // 20:00 +08:00 is 12:00 UTC; 08:00 +08:00 is 00:00 UTC.
        assert_eq!(
            p.windows[0].windows,
            vec![core::TimeWindow {
                start_minute: 720,
                end_minute: 0
            }]
        );
        assert!(p.windows[0].windows[0].contains(13 * 60));
        assert!(!p.windows[0].windows[0].contains(9 * 60));
    }

    #[test]
    fn new_york_window_follows_daylight_saving() {
        let body = PolicyBody {
            windows: Some(vec![PolicyWindow {
                priority: None,
                from: "09:00".into(),
                to: "17:00".into(),
                tz: Some("America/New_York".into()),
            }]),
            ..PolicyBody::default()
        };
        let winter = policy_to_core(&record(body.clone()), Timestamp::from_secs(1_796_205_600));
        assert_eq!(winter.windows[0].windows[0].start_minute, 14 * 60);
        // 2026-07-01T12:00Z: EDT, UTC-4.
        let summer = policy_to_core(&record(body), Timestamp::from_secs(1_782_907_200));
        assert_eq!(summer.windows[0].windows[0].start_minute, 13 * 60);
    }

    #[test]
    fn rules_convert() {
        let body: PolicyBody = serde_json::from_value(serde_json::json!({
            "max_price_per_gpu_hour": 4.0, "allowed_providers": ["onprem", "aws"],
            "allowed_regions": null, "spot": "never", "burst": false, "priority_ceiling": "high"
        }))
        .expect("valid body");
        let p = policy_to_core(&record(body), Timestamp(0));
        assert_eq!(p.max_price_per_gpu_hour, Some(Money(4_000_000)));
        assert_eq!(p.allowed_providers, vec!["onprem", "aws"]);
        assert!(p.allowed_regions.is_empty());
        assert_eq!(p.spot, SpotRule::Never);
        assert!(!p.burst_allowed);
        assert_eq!(p.priority_ceiling, Some(core::Priority::High));
        assert_eq!(p.remaining_budget, None);
    }
}

//! Team policies: validation of what finance sends (field-level errors), conversion into the
//! planner's [`TeamPolicy`], and the submit-time check that refuses a job its team's policy can
//! never allow.
//!
//! Policies are stored as sent ([`PolicyBody`], dollars and local times); the planner gets plain
//! values: micro-dollars, UTC minute ranges. Time windows are converted for the date of `now`
//! in their own zone, so a window keeps its local meaning across daylight-saving changes.

use std::collections::{HashMap, HashSet};
use std::str::FromStr;
use std::time::Instant;

use chrono::{DateTime, Duration, NaiveTime, TimeZone, Timelike, Utc};
use chrono_tz::Tz;
use switchyard_core as core;
use switchyard_core::sim::{
    self, Decisions, Scheduler, SimConfig, SimJob, SimPool, SimResult, Switchyard, View, World,
};
use switchyard_core::{Money, Pool, PoolId, Region, Snapshot, SpotRule, TeamPolicy, Timestamp};
use switchyard_protocol::api::{
    BudgetPeriod, DayCost, PolicyBody, PolicyWindow, Priority, QueueDelay, WhatIfChange,
    WhatIfOutcome, WhatIfReport,
};

use crate::clock;
use crate::http::error::ApiError;
use crate::store::{JobRecord, PolicyRecord};

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
    Ok(())
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
    app: &crate::app::App,
    pools: &[Pool],
    spec: &core::JobSpec,
    now: Timestamp,
) -> Result<(), ApiError> {
    let mut records = Vec::new();
    if let Some(r) = app.store.policy(&spec.team, None).await? {
        records.push(r);
    }
    if let Some(project) = spec.project.as_deref()
        && let Some(r) = app.store.policy(&spec.team, Some(project)).await?
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

// ---- What-if ------------------------------------------------------------------------------

/// The live world a what-if replays against: the catalogue, the nodes that joined, and which
/// pools the broker can launch in now.
#[derive(Clone, Debug)]
pub struct WhatIfWorld {
    pub team: String,
    pub project: Option<String>,
    pub regions: Vec<Region>,
    pub pools: Vec<Pool>,
    /// Healthy nodes per pool.
    pub node_counts: HashMap<PoolId, u32>,
    /// Pools with a provider that can launch there (and bursting on).
    pub can_launch: HashSet<PoolId>,
}

/// Spot interruptions assumed per node-hour in a what-if (the planner's default figure).
const WHAT_IF_SPOT_INTERRUPTIONS_PER_HOUR: f64 = 0.02;

impl WhatIfWorld {
    /// The simulated world, with the on-prem rates of `records` applied. On-prem (static)
    /// pools keep their fleet (`node_limit`, or the nodes that joined if more); cloud pools the
    /// broker cannot launch in keep only the nodes they have.
    fn sim_world(&self, records: &[PolicyRecord]) -> World {
        let pools = self
            .pools
            .iter()
            .filter_map(|p| {
                let mut pool = priced_for(p, records, &self.team, self.project.as_deref());
                let have = self.node_counts.get(&p.id).copied().unwrap_or(0);
                let fixed_nodes = if !p.launchable {
                    p.node_limit.max(have)
                } else if self.can_launch.contains(&p.id) {
                    0
                } else {
                    pool.launchable = false;
                    have
                };
                if !pool.launchable && fixed_nodes == 0 {
                    return None;
                }
                let interruptions_per_hour = if pool.launchable && pool.spot_per_hour.is_some() {
                    WHAT_IF_SPOT_INTERRUPTIONS_PER_HOUR
                } else {
                    0.0
                };
                Some(SimPool {
                    pool,
                    fixed_nodes,
                    interruptions_per_hour,
                })
            })
            .collect();
        World {
            regions: self.regions.clone(),
            pools,
        }
    }
}

/// Switchyard's scheduler with a policy set in every snapshot, the windows converted for each
/// simulated day (the engine's snapshot carries no policies of its own), and hard budgets kept
/// as the live broker keeps them: what a budget has left in its period is its amount less the
/// estimates of the work started (or launched for) in that period, each taken when the planner
/// commits it, so a job whose estimate does not fit is held exactly as the live planner holds
/// it.
struct WithPolicies<'a> {
    records: &'a [PolicyRecord],
    day: Option<i64>,
    policies: Vec<TeamPolicy>,
    /// What each record's hard budget has committed, per period (keyed by the period's start).
    committed: HashMap<(usize, Timestamp), Money>,
    /// Launches in flight: what each reserved until its job starts (then its attempt does).
    launching: HashMap<core::JobId, Vec<(usize, Timestamp, Money)>>,
    /// Past this instant the scheduler decides nothing more, so the engine winds down fast,
    /// and the run is reported as given up.
    deadline: Instant,
    gave_up: bool,
    inner: Switchyard,
}

impl<'a> WithPolicies<'a> {
    fn new(records: &'a [PolicyRecord], deadline: Instant) -> WithPolicies<'a> {
        WithPolicies {
            records,
            day: None,
            policies: Vec::new(),
            committed: HashMap::new(),
            launching: HashMap::new(),
            deadline,
            gave_up: false,
            inner: Switchyard::default(),
        }
    }

    /// The hard budget of record `i` and its period at `now`, if it has one that applies.
    fn hard_budget(&self, i: usize, now: Timestamp) -> Option<(Money, Timestamp)> {
        let rule = self.records[i].body.budget.as_ref()?;
        if rule.enforcement != switchyard_protocol::api::Enforcement::Hard {
            return None;
        }
        let (start, _) = crate::rules::budget::period_window(rule, now)?;
        Some((crate::rules::budget::amount(rule), start))
    }

    /// Takes the round's commitments from the budgets that cover their jobs.
    fn commit(&mut self, view: &View<'_>) {
        if self.inner.committed().is_empty() || self.records.iter().all(|r| r.body.budget.is_none())
        {
            return;
        }
        let specs: HashMap<core::JobId, &core::JobSpec> = view
            .snapshot
            .queued
            .iter()
            .map(|q| (q.id, &q.spec))
            .collect();
        for c in self.inner.committed().to_vec() {
            if let Some(reserved) = self.launching.remove(&c.job) {
                for (i, start, cost) in reserved {
                    if let Some(m) = self.committed.get_mut(&(i, start)) {
                        *m = Money(m.micros().saturating_sub(cost.micros()));
                    }
                }
            }
            let Some(spec) = specs.get(&c.job) else {
                continue;
            };
            let mut taken = Vec::new();
            for i in 0..self.records.len() {
                let r = &self.records[i];
                let covers = r.team == spec.team
                    && (r.project.is_none() || r.project.as_deref() == spec.project.as_deref());
                if !covers {
                    continue;
                }
                if let Some((_, start)) = self.hard_budget(i, view.now) {
                    let m = self.committed.entry((i, start)).or_insert(Money::ZERO);
                    *m = Money(m.micros().saturating_add(c.estimated_cost.micros()));
                    taken.push((i, start, c.estimated_cost));
                }
            }
            if c.launch {
                self.launching.insert(c.job, taken);
            }
        }
    }
}

impl Scheduler for WithPolicies<'_> {
    fn name(&self) -> &str {
        "switchyard"
    }

    fn decide(&mut self, view: &View<'_>) -> Decisions {
        if self.gave_up || Instant::now() > self.deadline {
            self.gave_up = true;
            return Decisions::default();
        }
        let day = view.now.millis().div_euclid(86_400_000);
        if self.day != Some(day) {
            self.day = Some(day);
            self.policies = self
                .records
                .iter()
                .map(|r| policy_to_core(r, view.now))
                .collect();
        }
        if self.policies.is_empty() {
            return self.inner.decide(view);
        }
        for i in 0..self.records.len() {
            self.policies[i].remaining_budget =
                self.hard_budget(i, view.now).map(|(amount, start)| {
                    let used = self.committed.get(&(i, start)).copied().unwrap_or_default();
                    Money(amount.micros().saturating_sub(used.micros()))
                });
        }
        let snapshot = Snapshot {
            policies: self.policies.clone(),
            ..view.snapshot.clone()
        };
        let decisions = self.inner.decide(&View {
            now: view.now,
            snapshot: &snapshot,
            provisioning: view.provisioning,
        });
        self.commit(view);
        decisions
    }
}

/// The recorded jobs as the simulator takes them, in submission order: submitted when they
/// were, running as long as they ran (or as estimated, when they never finished), the planner
/// told their users' estimates as it was live. Jobs
/// cancelled before they ever started are left out. Each comes with its record.
fn sim_jobs(jobs: &[JobRecord]) -> Vec<(SimJob, &JobRecord)> {
    let mut out: Vec<(SimJob, &JobRecord)> = jobs
        .iter()
        .filter(|j| !(j.state == core::JobState::Cancelled && j.started_at.is_none()))
        .map(|j| {
            let ran = match (j.started_at, j.finished_at) {
                (Some(s), Some(f)) if f > s => Some(f.secs_since(s).max(1)),
                _ => None,
            };
            let sim = SimJob {
                submit: j.submitted_at,
                runtime_s: ran.unwrap_or_else(|| j.spec.runtime_s()),
                // The planner decided (budgets, deadlines) on the user's estimate, live.
                estimate_s: Some(j.spec.runtime_s()),
                spec: j.spec.clone(),
                measured: true,
            };
            (sim, j)
        })
        .collect();
    out.sort_by_key(|(s, j)| (s.submit, j.id));
    out
}

const DAY_MS: i64 = 86_400_000;

/// `r`'s charges per UTC day, from day `first` to day `last` (both as days since the epoch).
fn cost_per_day(r: &SimResult, first: i64, last: i64) -> Vec<DayCost> {
    let mut days: Vec<i64> = vec![0; usize::try_from(last - first + 1).unwrap_or(0)];
    for (at, cost) in &r.timeline {
        let d = at.millis().div_euclid(DAY_MS) - first;
        if let Some(slot) = usize::try_from(d).ok().and_then(|d| days.get_mut(d)) {
            *slot = slot.saturating_add(cost.micros());
        }
    }
    days.iter()
        .enumerate()
        .map(|(i, micros)| DayCost {
            day: clock::to_datetime(Timestamp((first + i as i64) * DAY_MS))
                .format("%Y-%m-%d")
                .to_string(),
            cost_usd: Money(*micros).as_dollars(),
        })
        .collect()
}

fn outcome(r: &SimResult, first_day: i64, last_day: i64) -> WhatIfOutcome {
    let report = crate::simulate::report::scheduler_report(r, 0.0, 0.0);
    WhatIfOutcome {
        total_cost_usd: report.total_cost_usd,
        deadline_met_fraction: report.deadline_met_fraction,
        queue_delay_s: QueueDelay {
            p50: report.queue_delay_s.p50,
            p99: report.queue_delay_s.p99,
        },
        held_jobs: r.jobs.iter().filter(|j| j.first_start.is_none()).count() as u32,
        cost_per_day: cost_per_day(r, first_day, last_day),
    }
}

/// Most jobs listed as changed in a what-if.
pub const WHAT_IF_MAX_CHANGES: usize = 200;

/// The jobs the draft treats differently, the biggest cost differences first.
fn changes(
    jobs: &[(SimJob, &JobRecord)],
    current: &SimResult,
    draft: &SimResult,
) -> Vec<WhatIfChange> {
    let mut out: Vec<(i64, WhatIfChange)> = jobs
        .iter()
        .zip(current.jobs.iter().zip(&draft.jobs))
        .filter_map(|((_, record), (c, d))| {
            let change = match (c.first_start, d.first_start) {
                (Some(_), None) => "held",
                (None, Some(_)) => "released",
                (None, None) => return None,
                (Some(_), Some(_)) if c.first_pool != d.first_pool => "moved",
                (Some(_), Some(_)) if c.cost != d.cost => "cost",
                _ => return None,
            };
            let delta = (d.cost.micros() - c.cost.micros()).abs();
            Some((
                delta,
                WhatIfChange {
                    job_id: record.id.0,
                    name: record.spec.name.clone(),
                    project: record.spec.project.clone(),
                    change: change.to_string(),
                    current_pool: c.first_pool.as_ref().map(ToString::to_string),
                    draft_pool: d.first_pool.as_ref().map(ToString::to_string),
                    current_cost_usd: c.cost.as_dollars(),
                    draft_cost_usd: d.cost.as_dollars(),
                },
            ))
        })
        .collect();
    // Held and released first (they matter most), then by cost difference.
    out.sort_by_key(|(delta, c)| (!matches!(c.change.as_str(), "held" | "released"), -delta));
    out.truncate(WHAT_IF_MAX_CHANGES);
    out.into_iter().map(|(_, c)| c).collect()
}

/// Replays `jobs` on `world` under the `current` policies and under the `draft` set (each the
/// team's whole set: team-wide and projects), every rule of both applied as the live planner
/// applies it (allow-lists, prices, spot, burst, windows, ceilings, hard budgets, on-prem
/// rates). Synchronous and CPU-bound: run it off the async threads. `None` when the two runs
/// did not finish by `deadline` (a long, congested history makes every planning round slow).
pub fn what_if(
    world: &WhatIfWorld,
    jobs: &[JobRecord],
    current: &[PolicyRecord],
    draft: &[PolicyRecord],
    deadline: Instant,
) -> Option<WhatIfReport> {
    let jobs = sim_jobs(jobs);
    let Some(first) = jobs.first().map(|(j, _)| j.submit) else {
        let empty = WhatIfOutcome {
            total_cost_usd: 0.0,
            deadline_met_fraction: 1.0,
            queue_delay_s: QueueDelay { p50: 0.0, p99: 0.0 },
            held_jobs: 0,
            cost_per_day: Vec::new(),
        };
        return Some(WhatIfReport {
            jobs: 0,
            current: empty.clone(),
            draft: empty,
            changes: Vec::new(),
        });
    };
    let sim_jobs: Vec<SimJob> = jobs.iter().map(|(j, _)| j.clone()).collect();
    let cfg = SimConfig {
        measure_from: first,
        ..SimConfig::default()
    };
    let run = |records: &[PolicyRecord]| {
        let mut scheduler = WithPolicies::new(records, deadline);
        let result = sim::run(&world.sim_world(records), &sim_jobs, &cfg, &mut scheduler);
        (!scheduler.gave_up).then_some(result)
    };
    let current = run(current)?;
    let draft = run(draft)?;
    let first_day = first.millis().div_euclid(DAY_MS);
    let last_charge = |r: &SimResult| r.timeline.iter().map(|(t, _)| t.millis()).max();
    let last_day = last_charge(&current)
        .max(last_charge(&draft))
        .map_or(first_day, |t| t.div_euclid(DAY_MS))
        .max(first_day);
    Some(WhatIfReport {
        jobs: sim_jobs.len() as u32,
        current: outcome(&current, first_day, last_day),
        draft: outcome(&draft, first_day, last_day),
        changes: changes(&jobs, &current, &draft),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(body: PolicyBody) -> PolicyRecord {
        PolicyRecord {
            team: "ml".into(),
            project: None,
            version: 1,
            body,
            updated_at: Timestamp(0),
            updated_by: "test".into(),
        }
    }

    /// One on-prem node of 8 H100s at $2 per GPU-hour, and no cloud.
    fn onprem_world() -> WhatIfWorld {
        let pool = Pool {
            id: PoolId::new("onprem:dc/h100"),
            region: core::RegionId::new("onprem:dc"),
            provider: "onprem".into(),
            instance_type: "h100".into(),
            gpu_model: "H100".into(),
            gpus_per_node: 8,
            gpu_memory_gb: 80,
            vcpus: 0,
            memory_gb: 0,
            on_demand_per_hour: Money(16_000_000),
            spot_per_hour: None,
            node_limit: 1,
            launchable: false,
            boot_time_s: 0,
            price_updated_at: Timestamp(0),
            recent_capacity_failures: 0,
        };
        WhatIfWorld {
            team: "ml".into(),
            project: None,
            regions: Vec::new(),
            pools: vec![pool],
            node_counts: HashMap::new(),
            can_launch: HashSet::new(),
        }
    }

    /// `n` one-GPU jobs of team ml submitted a minute apart on 2026-12-02, each of which ran
    /// for `ran_s`.
    fn ran_jobs(n: i64, ran_s: i64) -> Vec<JobRecord> {
        let spec: core::JobSpec = serde_json::from_value(serde_json::json!({
            "name": "j", "team": "ml", "project": null, "command": ["x"], "env": {},
            "resources": {"gpus": 1, "gpu_models": [], "min_gpu_memory_gb": 0, "cpus": 0,
                          "memory_gb": 0, "nodes": 1},
            "estimated_runtime_s": ran_s, "deadline": null, "priority": "normal",
            "spot": "allowed", "max_price_per_hour": null, "regions": [], "data": null,
            "kind": "batch", "max_latency_ms": null
        }))
        .expect("a core spec");
        let day = 1_796_169_600; // 2026-12-02T00:00:00Z
        (0..n)
            .map(|i| JobRecord {
                id: core::JobId(uuid::Uuid::now_v7()),
                spec: spec.clone(),
                spec_json: String::new(),
                state: core::JobState::Succeeded,
                submitted_at: Timestamp::from_secs(day + i * 60),
                started_at: Some(Timestamp::from_secs(day + i * 60)),
                finished_at: Some(Timestamp::from_secs(day + i * 60 + ran_s)),
                exit_code: Some(0),
                reason: None,
                cancel_requested: false,
                attempts: 1,
                version: 0,
                explanation_json: None,
                placement: None,
                cost: Money::ZERO,
            })
            .collect()
    }

    fn later() -> Instant {
        Instant::now() + std::time::Duration::from_secs(60)
    }

    #[test]
    fn a_what_if_past_its_deadline_gives_up() {
        let world = onprem_world();
        let jobs = ran_jobs(3, 1800);
        let report = what_if(&world, &jobs, &[], &[], later()).expect("finishes in time");
        assert_eq!(report.jobs, 3);
        // Half an hour each (what they ran, not the estimate) at $2 per GPU-hour.
        assert!(
            (report.current.total_cost_usd - 3.0).abs() < 1e-3,
            "{report:?}"
        );
        assert_eq!(report.current, report.draft);
        assert!(report.changes.is_empty());
        assert_eq!(
            report.current.cost_per_day,
            vec![DayCost {
                day: "2026-12-02".into(),
                cost_usd: 3.0
            }]
        );
        assert_eq!(what_if(&world, &jobs, &[], &[], Instant::now()), None);
    }

    #[test]
    fn a_draft_hard_budget_holds_what_does_not_fit_and_lists_it() {
        let world = onprem_world();
        // $2 each; a $3 hard budget this month fits one.
        let jobs = ran_jobs(3, 3600);
        let draft = record(
            serde_json::from_value(serde_json::json!({
                "budget": {"amount_usd": 3.0, "period": "month", "enforcement": "hard"}
            }))
            .expect("a budget"),
        );
        let report =
            what_if(&world, &jobs, &[], std::slice::from_ref(&draft), later()).expect("in time");
        assert_eq!(report.current.held_jobs, 0, "{report:?}");
        assert_eq!(report.draft.held_jobs, 2, "{report:?}");
        assert!(
            (report.draft.total_cost_usd - 2.0).abs() < 1e-3,
            "{report:?}"
        );
        let held: Vec<&str> = report.changes.iter().map(|c| c.change.as_str()).collect();
        assert_eq!(held, ["held", "held"]);
        assert_eq!(report.changes[0].draft_pool, None);
        assert_eq!(
            report.changes[0].current_pool.as_deref(),
            Some("onprem:dc/h100")
        );
        // The same budget as the current policy: held there too, and nothing changes.
        let report = what_if(
            &world,
            &jobs,
            std::slice::from_ref(&draft),
            std::slice::from_ref(&draft),
            later(),
        )
        .expect("in time");
        assert_eq!(report.current.held_jobs, 2);
        assert!(report.changes.is_empty());
        // A soft budget only alerts.
        let soft = record(
            serde_json::from_value(serde_json::json!({
                "budget": {"amount_usd": 3.0, "period": "month", "enforcement": "soft"}
            }))
            .expect("a budget"),
        );
        let report = what_if(&world, &jobs, &[], &[soft], later()).expect("in time");
        assert_eq!(report.draft.held_jobs, 0);
    }

    #[test]
    fn a_draft_budget_judges_jobs_by_their_estimates_as_the_live_planner_did() {
        // Estimated at an hour ($2), finished in a second: live, a one-cent hard budget held
        // it on its estimate, and so does the replay.
        let mut jobs = ran_jobs(1, 1);
        jobs[0].spec.estimated_runtime_s = Some(3600);
        let draft = record(
            serde_json::from_value(serde_json::json!({
                "budget": {"amount_usd": 0.01, "period": "month", "enforcement": "hard"}
            }))
            .expect("a budget"),
        );
        let report = what_if(&onprem_world(), &jobs, &[], &[draft], later()).expect("in time");
        assert_eq!(report.current.held_jobs, 0, "{report:?}");
        assert_eq!(report.draft.held_jobs, 1, "{report:?}");
        assert_eq!(report.changes[0].change, "held");
    }

    #[test]
    fn a_draft_provider_allow_list_is_replayed() {
        let world = onprem_world();
        let jobs = ran_jobs(2, 600);
        let aws_only = record(
            serde_json::from_value(serde_json::json!({"allowed_providers": ["aws"]}))
                .expect("a body"),
        );
        let report = what_if(&world, &jobs, &[], &[aws_only], later()).expect("in time");
        assert_eq!(report.draft.held_jobs, 2, "{report:?}");
        assert_eq!(report.draft.total_cost_usd, 0.0);
        let onprem_only = record(
            serde_json::from_value(serde_json::json!({"allowed_providers": ["onprem"]}))
                .expect("a body"),
        );
        let report = what_if(&world, &jobs, &[], &[onprem_only], later()).expect("in time");
        assert_eq!(report.draft.held_jobs, 0, "{report:?}");
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

//! Budgets: the one place for their math. A policy's budget has a period (the calendar month or
//! ISO week in UTC, or a custom window); what it has `spent` is the ledger in that period; what is
//! `committed` is what live work is still expected to cost beyond what it has accrued (the
//! planner's estimates, reserved when an attempt or a launch is committed); `remaining` is the
//! amount less both. Hard budgets hold jobs whose estimate does not fit (the planner does that
//! with `TeamPolicy::remaining_budget`); soft ones only alert.
//!
//! The functions at the top are pure; [`statuses`] and [`round_policies`] read the store.

use chrono::{Datelike, Duration as ChronoDuration, NaiveDate, NaiveTime, TimeZone, Utc};
use switchyard_core::{Money, TeamPolicy, Timestamp};
use switchyard_protocol::api::{BudgetPeriod, BudgetRule, Enforcement};

use crate::clock::{from_datetime, to_datetime};
use crate::rules::rates::OnpremRates;
use crate::store::{BudgetUsage, PolicyRecord, Store, StoreError};

/// Where a budget stands now.
#[derive(Clone, Debug, PartialEq)]
pub struct BudgetStatus {
    pub team: String,
    pub project: Option<String>,
    pub period_start: Timestamp,
    pub period_end: Timestamp,
    pub amount: Money,
    pub spent: Money,
    pub committed: Money,
    /// `amount − spent − committed`; negative when over.
    pub remaining: Money,
    pub enforcement: Enforcement,
    pub alert_at: Vec<f64>,
    /// The `alert_at` fractions that `spent` has reached this period.
    pub alerts_crossed: Vec<f64>,
}

/// The budget period that contains `now`: `[start, end)`. `None` for a custom window that
/// `now` is outside of (before it starts or after it ends the budget does not apply), or one
/// missing its bounds.
pub fn period_window(rule: &BudgetRule, now: Timestamp) -> Option<(Timestamp, Timestamp)> {
    let t = to_datetime(now);
    let midnight = |d: NaiveDate| from_datetime(Utc.from_utc_datetime(&d.and_time(NaiveTime::MIN)));
    match rule.period {
        BudgetPeriod::Month => {
            let first = NaiveDate::from_ymd_opt(t.year(), t.month(), 1)?;
            let next = if t.month() == 12 {
                NaiveDate::from_ymd_opt(t.year() + 1, 1, 1)?
            } else {
                NaiveDate::from_ymd_opt(t.year(), t.month() + 1, 1)?
            };
            Some((midnight(first), midnight(next)))
        }
        BudgetPeriod::Week => {
            let today = t.date_naive();
            let monday =
                today - ChronoDuration::days(i64::from(today.weekday().num_days_from_monday()));
            Some((midnight(monday), midnight(monday + ChronoDuration::days(7))))
        }
        BudgetPeriod::Custom => {
            let (from, to) = (from_datetime(rule.from?), from_datetime(rule.to?));
            (from <= now && now < to).then_some((from, to))
        }
    }
}

/// The budget's amount in micro-dollars (negative or unreadable amounts count as zero).
pub fn amount(rule: &BudgetRule) -> Money {
    Money::from_dollars(rule.amount_usd)
        .filter(|m| m.micros() >= 0)
        .unwrap_or(Money::ZERO)
}

/// A threshold fraction as parts per million of the amount (the key alerts are recorded under).
pub fn threshold_ppm(fraction: f64) -> i64 {
    if fraction.is_finite() {
        (fraction * 1e6).round() as i64
    } else {
        0
    }
}

/// Whether `spent` has reached `fraction` of `amount`.
pub fn crossed(amount: Money, spent: Money, fraction: f64) -> bool {
    let ppm = i128::from(threshold_ppm(fraction));
    ppm > 0 && i128::from(spent.micros()) * 1_000_000 >= i128::from(amount.micros()) * ppm
}

/// Where a budget stands, from its rule, its window and what the store says of its use.
pub fn status(
    record: &PolicyRecord,
    rule: &BudgetRule,
    window: (Timestamp, Timestamp),
    usage: BudgetUsage,
) -> BudgetStatus {
    let amount = amount(rule);
    let remaining = Money(
        amount
            .micros()
            .saturating_sub(usage.spent.micros())
            .saturating_sub(usage.committed.micros()),
    );
    BudgetStatus {
        team: record.team.clone(),
        project: record.project.clone(),
        period_start: window.0,
        period_end: window.1,
        amount,
        spent: usage.spent,
        committed: usage.committed,
        remaining,
        enforcement: rule.enforcement,
        alert_at: rule.alert_at.clone(),
        alerts_crossed: rule
            .alert_at
            .iter()
            .copied()
            .filter(|&f| crossed(amount, usage.spent, f))
            .collect(),
    }
}

/// Every policy with a budget that applies now, with where it stands.
pub async fn statuses(
    store: &Store,
    records: &[PolicyRecord],
    now: Timestamp,
) -> Result<Vec<BudgetStatus>, StoreError> {
    let mut out = Vec::new();
    for record in records {
        let Some(rule) = &record.body.budget else {
            continue;
        };
        let Some(window) = period_window(rule, now) else {
            continue;
        };
        let usage = store
            .budget_usage(&record.team, record.project.as_deref(), window.0, window.1)
            .await?;
        out.push(status(record, rule, window, usage));
    }
    Ok(out)
}

/// What a planning round needs from the policies: each as the planner takes it, hard budgets
/// with what they have left, and the on-prem rates new attempts are charged at.
pub struct RoundPolicies {
    pub policies: Vec<TeamPolicy>,
    pub rates: OnpremRates,
}

pub async fn round_policies(store: &Store, now: Timestamp) -> Result<RoundPolicies, StoreError> {
    let records = store.policies().await?;
    let mut policies = Vec::with_capacity(records.len());
    for record in &records {
        let mut policy = crate::rules::policy::policy_to_core(record, now);
        policy.remaining_budget = None;
        if let Some(rule) = &record.body.budget
            && rule.enforcement == Enforcement::Hard
            && let Some(window) = period_window(rule, now)
        {
            let usage = store
                .budget_usage(&record.team, record.project.as_deref(), window.0, window.1)
                .await?;
            policy.remaining_budget = Some(status(record, rule, window, usage).remaining);
        }
        policies.push(policy);
    }
    Ok(RoundPolicies {
        policies,
        rates: OnpremRates::from_policies(&records),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use switchyard_protocol::api::PolicyBody;

    fn rule(period: BudgetPeriod) -> BudgetRule {
        BudgetRule {
            amount_usd: 100.0,
            period,
            from: None,
            to: None,
            enforcement: Enforcement::Hard,
            alert_at: vec![0.5, 0.9],
        }
    }

    fn at(s: &str) -> Timestamp {
        from_datetime(s.parse().unwrap())
    }

    #[test]
    fn months_and_weeks_are_calendar_periods_in_utc() {
        let (s, e) = period_window(&rule(BudgetPeriod::Month), at("2026-12-02T14:00:00Z")).unwrap();
        assert_eq!(
            (s, e),
            (at("2026-12-01T00:00:00Z"), at("2027-01-01T00:00:00Z"))
        );
        let (s, e) = period_window(&rule(BudgetPeriod::Month), at("2026-02-28T23:59:59Z")).unwrap();
        assert_eq!(
            (s, e),
            (at("2026-02-01T00:00:00Z"), at("2026-03-01T00:00:00Z"))
        );
        // 2026-12-02 is a Wednesday: its ISO week starts on Monday 2026-11-30.
        let (s, e) = period_window(&rule(BudgetPeriod::Week), at("2026-12-02T14:00:00Z")).unwrap();
        assert_eq!(
            (s, e),
            (at("2026-11-30T00:00:00Z"), at("2026-12-07T00:00:00Z"))
        );
        let (s, _) = period_window(&rule(BudgetPeriod::Week), at("2026-11-30T00:00:00Z")).unwrap();
        assert_eq!(s, at("2026-11-30T00:00:00Z"));
    }

    #[test]
    fn a_custom_window_applies_only_inside_it() {
        let mut r = rule(BudgetPeriod::Custom);
        r.from = Some("2026-12-01T00:00:00Z".parse().unwrap());
        r.to = Some("2026-12-10T00:00:00Z".parse().unwrap());
        assert_eq!(
            period_window(&r, at("2026-12-02T00:00:00Z")),
            Some((at("2026-12-01T00:00:00Z"), at("2026-12-10T00:00:00Z")))
        );
        assert_eq!(period_window(&r, at("2026-12-10T00:00:00Z")), None);
        assert_eq!(period_window(&r, at("2026-11-30T00:00:00Z")), None);
        r.to = None;
        assert_eq!(period_window(&r, at("2026-12-02T00:00:00Z")), None);
    }

    #[test]
    fn remaining_is_the_amount_less_spent_and_committed() {
        let record = PolicyRecord {
            team: "ml".into(),
            project: None,
            version: 1,
            body: PolicyBody::default(),
            updated_at: Timestamp(0),
            updated_by: "test".into(),
        };
        let r = rule(BudgetPeriod::Month);
        let usage = BudgetUsage {
            spent: Money(60_000_000),
            committed: Money(30_000_000),
        };
        let s = status(&record, &r, (Timestamp(0), Timestamp(1)), usage);
        assert_eq!(s.remaining, Money(10_000_000));
        assert_eq!(s.alerts_crossed, vec![0.5]);
        let over = BudgetUsage {
            spent: Money(95_000_000),
            committed: Money(30_000_000),
        };
        let s = status(&record, &r, (Timestamp(0), Timestamp(1)), over);
        assert_eq!(s.remaining, Money(-25_000_000));
        assert_eq!(s.alerts_crossed, vec![0.5, 0.9]);
    }

    #[test]
    fn thresholds_are_crossed_exactly_at_their_fraction() {
        let amount = Money(100_000_000);
        assert!(!crossed(amount, Money(49_999_999), 0.5));
        assert!(crossed(amount, Money(50_000_000), 0.5));
        assert!(crossed(amount, Money(100_000_000), 1.0));
        assert!(!crossed(amount, Money(100_000_000), 0.0));
        assert!(!crossed(amount, Money(100_000_000), f64::NAN));
        assert_eq!(threshold_ppm(0.9), 900_000);
    }
}

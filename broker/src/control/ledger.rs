//! The ledger's accrual loop. The ledger is the source of truth for spend: every running
//! attempt on a node the broker did not launch (on-prem and pre-registered nodes) accrues its
//! GPUs × the per-GPU rate of its pool and market (on-prem: the team's rate for the GPU model
//! when its policy sets one), and every live cloud instance accrues its hourly price: its time
//! running a job is that job's (`instance`), and its time booting (`instance_boot`, until its
//! node was ready) or idle (`instance_idle`) is the team's overhead — charged to the team and
//! project of the job it was launched for, to no job, so a job's cost stops when it ends.
//!
//! Every `ledger_accrual_interval_ms` this loop writes entries for `[accrued_until, now]` of
//! each source (the store does it in one transaction; `(source, period_start)` is unique, so a
//! restart never writes a period twice); the final partial period is settled by the store in
//! the same transaction that ends an attempt or an instance (with the provider's minimum billed
//! time). Amounts are cumulative from the source's start (whole seconds, rounded up), so the
//! entries of a source always add up to exactly its price × its billed time.
//!
//! After each pass, soft and hard budgets whose spend crossed an `alert_at` threshold get one
//! `budget.alert` audit entry per threshold and period.

use std::time::Duration;
use switchyard_core::{JobSpec, Market, Money, Pool, Timestamp};

use crate::app::App;
use crate::clock;
use crate::rules::budget;
use crate::store::{NewAuditEntry, PolicyRecord, StoreError};

/// What one GPU-hour of an attempt costs an hour: its GPUs × the per-GPU price of its pool and
/// market; on-prem, the team's rate for the GPU model when its policy sets one.
pub fn attempt_rate(pool: &Pool, market: Market, gpus: u32, onprem_rate: Option<Money>) -> Money {
    let per_gpu = match onprem_rate {
        Some(rate) if pool.provider.eq_ignore_ascii_case("onprem") => rate,
        _ => pool.price_per_gpu_hour(market),
    };
    per_gpu.saturating_mul(i64::from(gpus))
}

/// The on-prem rates per GPU model the policies set (`onprem_rates`), team-wide and per
/// project; a project's rate wins over its team's.
#[derive(Clone, Debug, Default)]
pub struct OnpremRates {
    records: Vec<PolicyRecord>,
}

impl OnpremRates {
    pub fn from_policies(records: &[PolicyRecord]) -> OnpremRates {
        OnpremRates {
            records: records
                .iter()
                .filter(|r| r.body.onprem_rates.is_some())
                .cloned()
                .collect(),
        }
    }

    /// The rate per GPU-hour for a job of `spec` on `pool`, if a policy sets one.
    pub fn onprem_rate(&self, spec: &JobSpec, pool: &Pool) -> Option<Money> {
        let find = |project: Option<&str>| {
            self.records
                .iter()
                .filter(|r| r.team == spec.team && r.project.as_deref() == project)
                .find_map(|r| crate::rules::policy::onprem_rate(r, &pool.gpu_model))
                .filter(|m| m.micros() >= 0)
        };
        spec.project
            .as_deref()
            .and_then(|p| find(Some(p)))
            .or_else(|| find(None))
    }
}

/// The accrual loop: one pass every `ledger_accrual_interval_ms` (and when a manual clock
/// moves), for the life of the process.
pub async fn run(app: App) {
    let every = Duration::from_millis(app.config.ledger_accrual_interval_ms.max(10));
    let mut interval = tokio::time::interval(every);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut moves = app.clock.moves();
    loop {
        tokio::select! {
            _ = interval.tick() => {}
            () = moves.next() => {}
        }
        // Only the leader accrues (the entries' keys would make a second writer harmless,
        // but it would be wasted work).
        if !app.leadership.is_leader() {
            continue;
        }
        match accrue_once(&app).await {
            Ok(_) => {}
            Err(e @ StoreError::Fenced { .. }) => {
                app.leadership.step_down(app.store.as_ref(), &e.to_string());
            }
            Err(e) => tracing::error!(error = %e, "ledger accrual failed; retrying next interval"),
        }
    }
}

/// One pass: accrue every source up to now, then record budget alerts. Returns the number of
/// ledger entries written.
pub async fn accrue_once(app: &App) -> Result<usize, StoreError> {
    let now = app.clock.now();
    let written = app
        .store
        .accrue_ledger(now, app.config.min_billed_s as i64)
        .await?;
    alert_budgets(app, now).await?;
    Ok(written)
}

/// One `budget.alert` audit entry per budget, threshold and period that spend has reached.
async fn alert_budgets(app: &App, now: Timestamp) -> Result<(), StoreError> {
    let records = app.store.policies().await?;
    if records.iter().all(|r| r.body.budget.is_none()) {
        return Ok(());
    }
    for status in budget::statuses(app.store.as_ref(), &records, now).await? {
        for &fraction in &status.alerts_crossed {
            let ppm = budget::threshold_ppm(fraction);
            let fresh = app
                .store
                .record_budget_alert(
                    &status.team,
                    status.project.as_deref(),
                    status.period_start,
                    ppm,
                    now,
                )
                .await?;
            if !fresh {
                continue;
            }
            let target = crate::store::policy_target(&status.team, status.project.as_deref());
            let after = serde_json::json!({
                "threshold": fraction,
                "enforcement": status.enforcement,
                "amount_usd": status.amount.as_dollars(),
                "spent_usd": status.spent.as_dollars(),
                "committed_usd": status.committed.as_dollars(),
                "period_start": clock::to_datetime(status.period_start),
                "period_end": clock::to_datetime(status.period_end),
            });
            tracing::warn!(team = %status.team, threshold = fraction, spent_usd = status.spent.as_dollars(), "budget threshold crossed");
            app.store
                .append_audit(&NewAuditEntry {
                    at: now,
                    actor: "system".into(),
                    action: "budget.alert".into(),
                    target,
                    before_json: None,
                    after_json: Some(after.to_string()),
                })
                .await?;
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use switchyard_core::{PoolId, RegionId};

    fn pool(provider: &str) -> Pool {
        Pool {
            id: PoolId(format!("{provider}:x/p")),
            region: RegionId(format!("{provider}:x")),
            provider: provider.into(),
            instance_type: "p".into(),
            gpu_model: "H100".into(),
            gpus_per_node: 4,
            gpu_memory_gb: 80,
            vcpus: 0,
            memory_gb: 0,
            on_demand_per_hour: Money(8_000_000),
            spot_per_hour: Some(Money(4_000_000)),
            node_limit: 1,
            launchable: false,
            boot_time_s: 0,
            price_updated_at: Timestamp(0),
            recent_capacity_failures: 0,
        }
    }

    #[test]
    fn an_attempt_pays_its_gpus_at_the_pool_rate_or_the_onprem_rate() {
        assert_eq!(
            attempt_rate(&pool("aws"), Market::OnDemand, 2, None),
            Money(4_000_000)
        );
        assert_eq!(
            attempt_rate(&pool("aws"), Market::Spot, 2, Some(Money(1))),
            Money(2_000_000)
        );
        assert_eq!(
            attempt_rate(&pool("onprem"), Market::OnDemand, 3, Some(Money(1_500_000))),
            Money(4_500_000)
        );
    }

    #[test]
    fn a_projects_onprem_rate_wins_over_its_teams() {
        let record = |project: Option<&str>, rate: f64| PolicyRecord {
            team: "ml".into(),
            project: project.map(str::to_string),
            version: 1,
            body: switchyard_protocol::api::PolicyBody {
                onprem_rates: Some([("H100".to_string(), rate)].into_iter().collect()),
                ..Default::default()
            },
            updated_at: Timestamp(0),
            updated_by: "t".into(),
        };
        let rates = OnpremRates::from_policies(&[record(None, 1.0), record(Some("cv"), 0.5)]);
        let wire: switchyard_protocol::api::JobSpec = serde_json::from_value(serde_json::json!({
            "name": "j", "team": "ml", "command": ["true"], "resources": {"gpus": 1}
        }))
        .unwrap();
        let mut spec = crate::rules::convert::job_spec(&wire, Timestamp(0)).unwrap();
        assert_eq!(
            rates.onprem_rate(&spec, &pool("onprem")),
            Some(Money(1_000_000))
        );
        spec.project = Some("cv".into());
        assert_eq!(
            rates.onprem_rate(&spec, &pool("onprem")),
            Some(Money(500_000))
        );
        spec.team = "web".into();
        assert_eq!(rates.onprem_rate(&spec, &pool("onprem")), None);
    }
}

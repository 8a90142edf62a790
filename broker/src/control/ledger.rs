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
use switchyard_core::Timestamp;

use crate::clock;
use crate::rules::budget;
use crate::state::App;
// The rate rules the scheduler reaches through here.
pub use crate::rules::rates::{OnpremRates, attempt_cash_rate, attempt_rate};
use crate::store::{NewAuditEntry, StoreError};

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

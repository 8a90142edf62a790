//! `/api/v1/budgets`: where each budget stands this period — the ledger in the period, the
//! estimates live work still holds, and what remains. Developers see their own team only.

use axum::Json;
use axum::extract::State;
use switchyard_protocol::api::{BudgetList, BudgetView, ErrorBody};

use crate::clock::to_datetime;
use crate::http::auth::Caller;
use crate::http::error::ApiError;
use crate::rules::budget::{self, BudgetStatus};
use crate::state::App;

/// Every budget that applies now, with its spend and what remains.
#[utoipa::path(get, path = "/budgets", tag = "spend",
    responses((status = 200, body = BudgetList), (status = 401, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list(State(app): State<App>, caller: Caller) -> Result<Json<BudgetList>, ApiError> {
    let records: Vec<_> = app
        .store
        .policies()
        .await?
        .into_iter()
        .filter(|r| caller.can_see_team(&r.team))
        .collect();
    let budgets = budget::statuses(app.store.as_ref(), &records, app.clock.now())
        .await?
        .iter()
        .map(view)
        .collect();
    Ok(Json(BudgetList { budgets }))
}

fn view(s: &BudgetStatus) -> BudgetView {
    BudgetView {
        team: s.team.clone(),
        project: s.project.clone(),
        period_start: to_datetime(s.period_start),
        period_end: to_datetime(s.period_end),
        amount_usd: s.amount.as_dollars(),
        spent_usd: s.spent.as_dollars(),
        committed_usd: s.committed.as_dollars(),
        remaining_usd: s.remaining.as_dollars(),
        enforcement: s.enforcement,
        alert_at: s.alert_at.clone(),
        alerts_crossed: s.alerts_crossed.clone(),
    }
}

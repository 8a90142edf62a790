//! What a GPU-hour costs the team that runs on it: the pool's price for its market, or on
//! prem the team's (or project's) rate for the GPU model when its policy sets one. The ledger
//! accrues by these rates and the scheduler records them on each attempt.

use switchyard_core::{JobSpec, Market, Money, Pool};

use crate::store::PolicyRecord;

/// What one GPU-hour of an attempt costs an hour: its GPUs × the per-GPU price of its pool and
/// market; on-prem, the team's rate for the GPU model when its policy sets one.
pub fn attempt_rate(pool: &Pool, market: Market, gpus: u32, onprem_rate: Option<Money>) -> Money {
    let per_gpu = match onprem_rate {
        Some(rate) if pool.provider.eq_ignore_ascii_case("onprem") => rate,
        _ => pool.price_per_gpu_hour(market),
    };
    per_gpu.saturating_mul(i64::from(gpus))
}

/// What one hour of an attempt costs the company in cash: its GPUs × its pool's cash rate per
/// GPU-hour (a cloud pool's price, an owned pool's marginal cost; [`Pool::cash_per_gpu_hour`]).
/// Team rates are chargeback and play no part.
pub fn attempt_cash_rate(pool: &Pool, market: Market, gpus: u32) -> Money {
    pool.cash_per_gpu_hour(market)
        .saturating_mul(i64::from(gpus))
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use switchyard_core::{PoolId, RegionId, Timestamp};

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
            marginal_per_hour: None,
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

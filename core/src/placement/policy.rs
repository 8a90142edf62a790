//! Team policies as hard constraints: which of the snapshot's policies cover a job, what they
//! make of its priority and spot rule, whether they let it start now, which pools they allow,
//! and the budgets the round spends.
//!
//! Every policy that covers a job applies (a team's and its project's alike), so the result
//! never depends on the order of `Snapshot::policies`: lists must all allow, ceilings take the
//! lowest, budgets are each charged. This module decides nothing and knows nothing of capacity.

use super::constraints::Reject;
use crate::domain::{JobSpec, Market, Objective, Pool, Priority, SpotRule, TeamPolicy};
use crate::money::Money;
use crate::time::Timestamp;

const MILLIS_PER_DAY: i64 = 86_400_000;

/// What the policies covering one job make of it.
#[derive(Debug)]
pub(crate) struct JobPolicy {
    /// Positions in the round's sorted policy list.
    pub covering: Vec<usize>,
    /// The job's priority after the policies' ceilings.
    pub priority: Priority,
    /// The job's spot rule after the policies' caps.
    pub spot: SpotRule,
    pub burst_allowed: bool,
    /// Whether the job may start now (time windows).
    pub window_open: bool,
    /// What its candidates rank by: the team's bill when any covering policy asks for it
    /// (finance wants that team to minimise its own bill), else what the company pays.
    pub objective: Objective,
}

impl JobPolicy {
    pub(crate) fn new(policies: &[&TeamPolicy], spec: &JobSpec, now: Timestamp) -> JobPolicy {
        let minute = u16::try_from(now.millis().rem_euclid(MILLIS_PER_DAY) / 60_000).unwrap_or(0);
        let mut out = JobPolicy {
            covering: Vec::new(),
            priority: spec.priority,
            spot: spec.spot,
            burst_allowed: true,
            window_open: true,
            objective: Objective::Company,
        };
        for (i, p) in policies.iter().enumerate() {
            if !p.applies_to(&spec.team, spec.project.as_deref()) {
                continue;
            }
            out.covering.push(i);
            if let Some(ceiling) = p.priority_ceiling {
                out.priority = out.priority.min(ceiling);
            }
            out.spot = out.spot.min(p.spot);
            out.burst_allowed &= p.burst_allowed;
            out.objective = out.objective.max(p.objective);
        }
        let priority = out.priority;
        for &i in &out.covering {
            for w in &policies[i].windows {
                let covers = w.priorities.is_empty() || w.priorities.contains(&priority);
                if covers && !w.windows.iter().any(|tw| tw.contains(minute)) {
                    out.window_open = false;
                }
            }
        }
        out
    }

    /// The allow-lists against `pool`.
    pub(crate) fn allow_violation(&self, policies: &[&TeamPolicy], pool: &Pool) -> Option<Reject> {
        for &i in &self.covering {
            let p = policies[i];
            if !p.allowed_providers.is_empty()
                && !p
                    .allowed_providers
                    .iter()
                    .any(|a| a.eq_ignore_ascii_case(&pool.provider))
            {
                return Some(Reject::ProviderNotAllowedByPolicy);
            }
            if !p.allowed_regions.is_empty() && !p.allowed_regions.contains(&pool.region) {
                return Some(Reject::RegionNotAllowedByPolicy);
            }
        }
        None
    }

    /// The policies' GPU-hour ceiling against the price of `market` in `pool`.
    pub(crate) fn price_violation(
        &self,
        policies: &[&TeamPolicy],
        pool: &Pool,
        market: Market,
    ) -> Option<Reject> {
        let price = pool.price_per_gpu_hour(market);
        self.covering
            .iter()
            .filter_map(|&i| policies[i].max_price_per_gpu_hour)
            .min()
            .filter(|&max| price > max)
            .map(|max| Reject::OverPolicyMaxPrice {
                price_per_gpu_hour: price,
                max_per_gpu_hour: max,
            })
    }
}

/// The budgets still to spend this round, one per policy (`None`: no budget).
#[derive(Debug)]
pub(crate) struct Budgets(Vec<Option<Money>>);

impl Budgets {
    pub(crate) fn new(policies: &[&TeamPolicy]) -> Budgets {
        Budgets(policies.iter().map(|p| p.remaining_budget).collect())
    }

    /// The least any of the job's policies has left; `None` when none has a budget.
    pub(crate) fn remaining(&self, job: &JobPolicy) -> Option<Money> {
        job.covering.iter().filter_map(|&i| self.0[i]).min()
    }

    /// Charges `cost` to every budget covering the job.
    pub(crate) fn spend(&mut self, job: &JobPolicy, cost: Money) {
        for &i in &job.covering {
            if let Some(left) = &mut self.0[i] {
                *left = *left - cost;
            }
        }
    }
}

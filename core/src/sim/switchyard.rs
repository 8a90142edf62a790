//! Switchyard under simulation: each call runs the same pure [`crate::plan`] the broker runs on
//! the live snapshot, and turns its plan into actions — assignments as they are, launches
//! unless a node is already booting for that job (the broker's burst controller is idempotent in
//! the same way), preemptions (the victim is requeued with its checkpointed progress), holds and
//! waits as nothing. The pools' spot interruption rates are in the snapshot, so `plan` can price
//! the risk.
//!
//! `plan` does not say when waiting stops being enough, so the adapter asks to be called again
//! at the latest moment a waiting job could still launch a node and meet its deadline
//! (`deadline − margin − runtime − the shortest boot time`), besides the engine's coarse tick.

use super::{Action, Decisions, Scheduler, View};
use crate::domain::JobId;
use crate::money::Money;
use crate::placement::Outcome;

/// Deadline margin `plan` keeps: `max(60 s, 5% of the runtime)`.
const MIN_MARGIN_S: i64 = 60;

#[derive(Debug)]
pub struct Switchyard {
    /// The simulated catalogue changes only with the scenario, never during a run: it is
    /// indexed once and not compared again.
    cache: crate::placement::PlanCache,
    /// What the last call committed: each job it assigned or launched a node for, with the
    /// plan's estimate of its cost (what the broker reserves against a hard budget).
    committed: Vec<Commitment>,
}

/// One job the last round started or launched a node for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Commitment {
    pub job: JobId,
    pub estimated_cost: Money,
    /// A node launched for it (the job starts on it later).
    pub launch: bool,
}

impl Default for Switchyard {
    fn default() -> Self {
        Switchyard {
            cache: crate::placement::PlanCache::fixed_catalogue(),
            committed: Vec::new(),
        }
    }
}

impl Switchyard {
    /// The jobs the last [`Scheduler::decide`] assigned (once each, a gang too) or launched a
    /// node for, with the plan's estimate of their cost.
    pub fn committed(&self) -> &[Commitment] {
        &self.committed
    }
}

impl Scheduler for Switchyard {
    fn name(&self) -> &str {
        "switchyard"
    }

    fn decide(&mut self, view: &View<'_>) -> Decisions {
        let snap = view.snapshot;
        // The adapter acts on decisions and shows no explanation: skip the candidate lists.
        let plan = crate::placement::plan_cached(
            &mut self.cache,
            snap,
            view.now,
            crate::placement::Detail::Outcomes,
        );
        // Victims first: the jobs they make room for are assigned to the freed GPUs.
        let mut actions: Vec<Action> = plan
            .preemptions
            .iter()
            .map(|p| Action::Preempt { job: p.job })
            .collect();
        // A gang's assignments come together, rank 0 first: one action starts them all.
        for group in plan.assignments.chunk_by(|a, b| a.job == b.job) {
            actions.push(match group {
                [a] => Action::Assign {
                    job: a.job,
                    node: a.node.clone(),
                    gpus: a.gpus,
                },
                _ => Action::AssignGang {
                    job: group[0].job,
                    nodes: group.iter().map(|a| (a.node.clone(), a.gpus)).collect(),
                },
            });
        }
        self.committed.clear();
        self.committed
            .extend(
                plan.assignments
                    .iter()
                    .filter(|a| a.rank == 0)
                    .map(|a| Commitment {
                        job: a.job,
                        estimated_cost: a.estimated_cost,
                        launch: false,
                    }),
            );
        let mut launched: Vec<JobId> = Vec::new();
        for l in &plan.launches {
            if !view.is_provisioning(l.for_job) && !launched.contains(&l.for_job) {
                launched.push(l.for_job);
                self.committed.push(Commitment {
                    job: l.for_job,
                    estimated_cost: l.estimated_cost,
                    launch: true,
                });
            }
        }
        // A gang's launches (one per node, together) become one launch of them all.
        for group in plan.launches.chunk_by(|a, b| a.for_job == b.for_job) {
            let l = &group[0];
            if view.is_provisioning(l.for_job) {
                continue;
            }
            let (pool, market, for_job) = (l.pool.clone(), l.market, l.for_job);
            actions.push(if group.len() > 1 {
                Action::LaunchGang {
                    pool,
                    market,
                    for_job,
                }
            } else {
                Action::Launch {
                    pool,
                    market,
                    for_job,
                }
            });
        }
        let min_boot_s = snap
            .pools
            .iter()
            .filter(|p| p.launchable)
            .map(|p| i64::from(p.boot_time_s))
            .min()
            .unwrap_or(0);
        let wake_at = snap
            .queued
            .iter()
            .filter(|j| {
                matches!(
                    plan.explanations.get(&j.id).map(|e| &e.outcome),
                    Some(Outcome::Wait { .. })
                )
            })
            .filter_map(|j| {
                // The runtime its deadline is judged at (the p90 of a prediction).
                let runtime = j.deadline_runtime_s.unwrap_or_else(|| j.spec.runtime_s());
                let margin = MIN_MARGIN_S.max(runtime / 20);
                j.spec
                    .deadline
                    .map(|d| d.plus_secs(-(margin + runtime + min_boot_s)))
            })
            .filter(|&t| t > view.now)
            .min();
        Decisions { actions, wake_at }
    }
}

//! Preemption: where an urgent job could have GPUs by stopping less urgent work. `low`
//! attempts are the victims of any `high` or `critical` job; a `high` or `critical` service
//! (inference winning its GPUs back from training) may stop `normal` batch work too, after the
//! `low` ([`JobCtx::victims`]). On a node, the fewest of them that free enough GPUs, `low`
//! first, the latest started first (the least work lost). Per pool, the node that needs the
//! fewest GPUs taken.
//!
//! This module finds the candidate; the planner decides whether the job may preempt at all
//! ([`JobCtx::may_preempt`]) and records the preemptions.

use super::CandidateKind;
use super::capacity::Capacity;
use super::estimate::{Estimate, JobCtx, PREEMPTION_GRACE_S, pool_violation};
use super::index::Index;
use crate::domain::Priority;

/// The best preemption candidate for the job and its victims (positions in the index's running
/// attempts). Only candidates that meet the deadline count, unless `any_finish` (the job has
/// no other candidate at all).
pub(crate) fn best_preemption(
    index: &Index,
    capacity: &Capacity,
    job: &JobCtx,
    any_finish: bool,
) -> Option<(Estimate, Vec<usize>)> {
    let ready = index.now.plus_secs(PREEMPTION_GRACE_S);
    let mut best: Option<(Estimate, Vec<usize>)> = None;
    let allowed = job.victims();
    for (pool, nodes) in index.preemptible_nodes[allowed as usize].iter().enumerate() {
        if nodes.is_empty() || pool_violation(index, job, pool).is_some() {
            continue;
        }
        // The node needing the fewest GPUs taken from `normal` work, then the fewest taken
        // at all, ties by id, of a market the job may take.
        let markets = job.node_markets(index, pool);
        let pick = nodes
            .iter()
            .filter(|&&node| markets.allows(index.nodes[node].market))
            .filter(|node| job.avoid.binary_search(node).is_err())
            .filter_map(|&node| {
                let victims = capacity.preemption_on(index, node, job.gpus, allowed)?;
                let (mut normal, mut taken) = (0u32, 0u32);
                for &a in &victims {
                    let (gpus, priority) =
                        (index.running[a].1.gpus.len(), index.running[a].1.priority);
                    taken += gpus;
                    if priority != Priority::Low {
                        normal += gpus;
                    }
                }
                Some(((normal, taken, node), victims))
            })
            .min_by_key(|(key, _)| *key);
        let Some(((_, _, node), victims)) = pick else {
            continue;
        };
        let e = job.on_node(index, pool, node, CandidateKind::Preempt, ready);
        if e.score.misses_deadline && !any_finish {
            continue;
        }
        if best.as_ref().is_none_or(|(b, _)| e.score < b.score) {
            best = Some((e, victims));
        }
    }
    best
}

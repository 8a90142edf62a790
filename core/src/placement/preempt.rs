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
    let mut best: Option<(Estimate, usize)> = None;
    let allowed = job.victims();
    let gpus = i64::from(job.gpus.max(1));
    // No candidate here finishes before this.
    let soonest = ready.plus_secs(job.runtime_s);
    // Pools cheapest first, by the price in their cheaper market (an on-prem pool's the lower
    // of its cash cost and its rate): once a GPU-hour there costs more than the best found,
    // which meets the deadline or finishes as soon as any could, no pool from there on can
    // beat it.
    for &(price, pool) in index.price_orders()[1].pools.iter() {
        if let Some((b, _)) = best
            .as_ref()
            .filter(|(b, _)| !b.score.misses_deadline || b.score.late_finish <= soonest)
            && price.saturating_mul(gpus).per_hour_for_secs(job.runtime_s) > b.score.cost
        {
            break;
        }
        let nodes = &index.preemptible_nodes[allowed as usize][pool];
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
                let (normal, taken) = capacity.preemption_size(index, node, job.gpus, allowed)?;
                Some((normal, taken, node))
            })
            .min();
        let Some((_, _, node)) = pick else {
            continue;
        };
        let e = job.on_node(index, pool, node, CandidateKind::Preempt, ready);
        if e.score.misses_deadline && !any_finish {
            continue;
        }
        if best.as_ref().is_none_or(|(b, _)| e.score < b.score) {
            best = Some((e, node));
        }
    }
    let (e, node) = best?;
    let victims = capacity.preemption_on(index, node, job.gpus, allowed)?;
    Some((e, victims))
}

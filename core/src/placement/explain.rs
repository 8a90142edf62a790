//! Explanations: the evaluated candidates of one job, made public — the winner first, then the
//! other workable candidates by score, then the blocked ones closest-to-feasible first — and the
//! human-readable reason a job is held.
//!
//! An explanation keeps at most [`MAX_EXPLAINED_CANDIDATES`](super::MAX_EXPLAINED_CANDIDATES)
//! candidates: with a thousand pools, the rest would say nothing the first ones do not. Hold
//! reasons are worked out from every blocked candidate, before that cut.

use super::constraints::Reject;
use super::estimate::{Blocked, Estimate, JobCtx};
use super::index::Index;
use super::{Candidate, Rejection};

/// Keeps the `limit` smallest items by `key`, sorted. Keys must be distinct (they end in ids),
/// so the unstable sort and selection give one answer whatever the input order.
pub(crate) fn keep_best<T, K: Ord>(items: &mut Vec<T>, limit: usize, key: impl Fn(&T) -> K) {
    if limit == 0 {
        items.clear();
        return;
    }
    if items.len() > limit {
        items.select_nth_unstable_by_key(limit - 1, &key);
        items.truncate(limit);
    }
    items.sort_unstable_by_key(key);
}

/// The public candidates: `viable` best first (the first is the winner), then `blocked`.
/// Both must already be cut and sorted by [`keep_best`], except that the joint assignment may
/// have moved the winner ahead of the `displaced` candidates after it, which scored better
/// but whose capacity went to other jobs.
pub(crate) fn candidates(
    index: &Index,
    job: &JobCtx,
    viable: &[Estimate],
    displaced: usize,
    blocked: &[Blocked],
) -> Vec<Candidate> {
    let mut out = Vec::with_capacity(viable.len() + blocked.len());
    for (i, e) in viable.iter().enumerate() {
        let rejected = match (i, job.spec.deadline) {
            (0, _) => None,
            _ if i <= displaced => Some(Rejection::ContendedCapacity),
            (_, Some(deadline)) if e.score.misses_deadline => Some(Rejection::MissesDeadline {
                finish: e.score.finish,
                deadline,
            }),
            _ => Some(Rejection::Outscored),
        };
        out.push(candidate(index, e, rejected));
    }
    for b in blocked {
        let e = job.nominal(index, b);
        let rejected = b.reject.to_rejection(index.pools[b.pool].pool);
        out.push(candidate(index, &e, Some(rejected)));
    }
    out
}

fn candidate(index: &Index, e: &Estimate, rejected: Option<Rejection>) -> Candidate {
    let pool = index.pools[e.score.pool].pool;
    Candidate {
        pool: pool.id.clone(),
        region: pool.region.clone(),
        node: e.score.node.map(|n| index.nodes[n].id.clone()),
        kind: e.score.kind,
        market: e.market,
        start: e.start,
        finish: e.score.finish,
        cost: e.score.cost,
        rejected,
    }
}

/// Why nothing can take the job, naming each blocking constraint with how many pools it
/// blocks, closest-to-feasible first: "no pool can take this job now: needs a new node but
/// bursting is disabled (2 pools); GPU model not among the job's gpu_models (5 pools)".
pub(crate) fn hold_reason(blocked: &[Blocked]) -> String {
    if blocked.is_empty() {
        return "no pools in the catalogue".into();
    }
    let mut by_rank: Vec<Option<(Reject, usize)>> = Vec::new();
    for b in blocked {
        let rank = usize::from(b.reject.rank());
        if by_rank.len() <= rank {
            by_rank.resize(rank + 1, None);
        }
        match &mut by_rank[rank] {
            Some((_, count)) => *count += 1,
            slot @ None => *slot = Some((b.reject, 1)),
        }
    }
    let parts: Vec<String> = by_rank
        .iter()
        .flatten()
        .map(|(reject, count)| {
            let plural = if *count == 1 { "" } else { "s" };
            format!("{} ({count} pool{plural})", reject.summary())
        })
        .collect();
    format!("no pool can take this job now: {}", parts.join("; "))
}

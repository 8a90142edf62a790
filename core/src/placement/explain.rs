//! Explanations: the evaluated candidates of one job — the winner first, then the other
//! workable candidates by score, then the blocked ones closest-to-feasible first — and the
//! human-readable reason a job is held.
//!
//! An explanation keeps at most [`MAX_EXPLAINED_CANDIDATES`](super::MAX_EXPLAINED_CANDIDATES)
//! candidates: with a thousand pools, the rest would say nothing the first ones do not. Hold
//! reasons are worked out from every blocked candidate, before that cut.
//!
//! A round records each job's candidates compactly ([`Details`]: index positions, no ids), and
//! [`super::Plan::explanation`] makes one job's list public, ids cloned, when it is asked for:
//! a 10,000-job round would otherwise clone some 600,000 id strings nobody reads.

use super::constraints::Reject;
use super::estimate::{Blocked, Estimate, JobCtx, Score};
use super::index::{IdMap, Index};
use super::{Candidate, CandidateKind, Rejection};
use crate::domain::{JobId, Market, NodeId, PoolId, RegionId, Snapshot};
use crate::money::Money;
use crate::time::Timestamp;
use std::ops::Range;
use std::sync::{Arc, OnceLock};

/// Where a plan's candidate lists come from.
#[derive(Clone, Default)]
pub(crate) enum Explained {
    /// None kept: a plan made for its outcomes only, or read back.
    #[default]
    Nothing,
    /// Recorded as the round went ([`super::Detail::Full`]).
    Recorded(Details),
    /// Worked out on the first request by planning the same snapshot again with candidate
    /// lists (`plan` is deterministic, so the replay decides exactly as the round did), then
    /// kept: what [`super::plan`] gives, so that a round's decisions do not wait for
    /// explanations nobody may read.
    OnDemand(Arc<Replay>),
}

/// A round's input, kept to explain it later.
pub(crate) struct Replay {
    snapshot: Arc<Snapshot>,
    now: Timestamp,
    details: OnceLock<Details>,
}

impl Replay {
    pub(crate) fn new(snapshot: Arc<Snapshot>, now: Timestamp) -> Replay {
        Replay {
            snapshot,
            now,
            details: OnceLock::new(),
        }
    }

    /// Plans the round again recording the candidate lists of `only` (`None`: every job's).
    fn run(&self, only: Option<IdMap<JobId, ()>>) -> Details {
        let plan = super::greedy::plan_recording(
            &self.snapshot,
            self.now,
            super::greedy::Scan::Pruned,
            super::Detail::Full,
            only,
        );
        match plan.details {
            Explained::Recorded(d) => d,
            _ => Details::default(),
        }
    }
}

impl Explained {
    /// The candidate lists, worked out first if they are kept on demand.
    pub(crate) fn details(&self) -> Option<&Details> {
        match self {
            Explained::Nothing => None,
            Explained::Recorded(d) => Some(d),
            Explained::OnDemand(r) => Some(r.details.get_or_init(|| r.run(None))),
        }
    }

    /// The candidates of `job`; empty when none are kept.
    pub(crate) fn candidates(&self, job: &JobId) -> Vec<Candidate> {
        self.details()
            .map(|d| d.candidates(job))
            .unwrap_or_default()
    }

    /// The candidates of each of `jobs`, in order. Kept on demand and not worked out yet: by
    /// planning the round again recording those jobs' lists alone (cheaper than all of them),
    /// without keeping them.
    pub(crate) fn candidates_of(&self, jobs: &[JobId]) -> Vec<Vec<Candidate>> {
        let replay = match self {
            Explained::OnDemand(r) if r.details.get().is_none() => r,
            _ => return jobs.iter().map(|j| self.candidates(j)).collect(),
        };
        let details = replay.run(Some(jobs.iter().map(|&j| (j, ())).collect()));
        jobs.iter().map(|j| details.candidates(j)).collect()
    }
}

/// Plans are equal when their candidate lists are (worked out if need be).
impl PartialEq for Explained {
    fn eq(&self, other: &Self) -> bool {
        self.details() == other.details()
    }
}

impl std::fmt::Debug for Explained {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Explained::Nothing => f.write_str("Nothing"),
            Explained::Recorded(d) => f.debug_tuple("Recorded").field(d).finish(),
            Explained::OnDemand(r) => match r.details.get() {
                Some(d) => f.debug_tuple("OnDemand").field(d).finish(),
                None => f.write_str("OnDemand(not yet asked for)"),
            },
        }
    }
}

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

/// The candidate lists of a plan's explanations, kept compact: positions in the round's index
/// instead of ids, so a round allocates nothing per candidate. [`Details::explanation`] turns
/// one job's list into public [`Candidate`]s, with ids, when it is asked for.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Details {
    /// The ids candidates name, by position in the index; `None` when the plan keeps no
    /// candidate lists ([`super::Detail::Outcomes`]).
    ids: Option<Arc<Ids>>,
    /// Per job, its candidates in `list`.
    jobs: IdMap<JobId, Range<u32>>,
    list: Vec<Compact>,
}

/// The ids of a round's pools and nodes, in index order.
#[derive(Debug, PartialEq)]
struct Ids {
    /// Pool id, region id and GPU model.
    pools: Vec<(PoolId, RegionId, String)>,
    nodes: Vec<NodeId>,
}

/// One candidate of an explanation, as the round knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Compact {
    pool: u32,
    /// `u32::MAX`: none.
    node: u32,
    kind: CandidateKind,
    market: Market,
    start: Timestamp,
    finish: Timestamp,
    cost: Money,
    why: Why,
}

/// Why a listed candidate did not win ([`Rejection`] without the allocation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Why {
    Won,
    Contended,
    MissesDeadline {
        deadline: Timestamp,
    },
    /// It would have won but for the reserve of a protected pool.
    Reserved {
        reserve: Money,
    },
    Outscored,
    Blocked(Reject),
}

impl Details {
    /// Details that keep candidate lists for the round of `index`.
    pub(crate) fn new(index: &Index) -> Details {
        let ids = Ids {
            pools: index
                .pools
                .iter()
                .map(|p| {
                    let p = p.pool;
                    (p.id.clone(), p.region.clone(), p.gpu_model.clone())
                })
                .collect(),
            nodes: index.nodes.iter().map(|n| n.id.clone()).collect(),
        };
        Details {
            ids: Some(Arc::new(ids)),
            ..Details::default()
        }
    }

    /// The same details with no job's candidates yet.
    pub(crate) fn emptied(&self) -> Details {
        Details {
            ids: self.ids.clone(),
            ..Details::default()
        }
    }

    /// Records a job's candidates: `viable` best first (the first is the winner), then
    /// `blocked`. Both must already be cut and sorted by [`keep_best`], except that the joint
    /// assignment may have moved the winner ahead of the `displaced` candidates after it, which
    /// scored better but whose capacity went to other jobs.
    pub(crate) fn record(
        &mut self,
        index: &Index,
        job: &JobCtx,
        id: JobId,
        viable: &[Estimate],
        displaced: usize,
        blocked: &[Blocked],
    ) {
        let from = self.list.len();
        for (i, e) in viable.iter().enumerate() {
            let why = match (i, job.spec.deadline) {
                (0, _) => Why::Won,
                _ if i <= displaced => Why::Contended,
                (_, Some(deadline)) if e.score.misses_deadline => Why::MissesDeadline { deadline },
                _ if e.reserve > Money::ZERO
                    && Score {
                        cost: e.score.cost.saturating_sub(e.reserve),
                        ..e.score
                    } < viable[0].score =>
                {
                    Why::Reserved { reserve: e.reserve }
                }
                _ => Why::Outscored,
            };
            self.list.push(compact(e, why));
        }
        for b in blocked {
            let e = job.nominal(index, b);
            self.list.push(compact(&e, Why::Blocked(b.reject)));
        }
        let span = u32::try_from(from).unwrap_or(u32::MAX)
            ..u32::try_from(self.list.len()).unwrap_or(u32::MAX);
        self.jobs.insert(id, span);
    }

    /// The public candidates of `job`; empty when none are kept.
    pub(crate) fn candidates(&self, job: &JobId) -> Vec<Candidate> {
        let (Some(ids), Some(span)) = (&self.ids, self.jobs.get(job)) else {
            return Vec::new();
        };
        let list = &self.list[span.start as usize..span.end as usize];
        list.iter()
            .map(|c| {
                let (pool, region, model) = &ids.pools[c.pool as usize];
                let rejected = match c.why {
                    Why::Won => None,
                    Why::Contended => Some(Rejection::ContendedCapacity),
                    Why::MissesDeadline { deadline } => Some(Rejection::MissesDeadline {
                        finish: c.finish,
                        deadline,
                    }),
                    Why::Outscored => Some(Rejection::Outscored),
                    Why::Reserved { reserve } => {
                        Some(Rejection::ReservedForJobsWithoutSpot { reserve })
                    }
                    Why::Blocked(reject) => Some(reject.to_rejection(model)),
                };
                Candidate {
                    pool: pool.clone(),
                    region: region.clone(),
                    node: (c.node != u32::MAX).then(|| ids.nodes[c.node as usize].clone()),
                    kind: c.kind,
                    market: c.market,
                    start: c.start,
                    finish: c.finish,
                    cost: c.cost,
                    rejected,
                }
            })
            .collect()
    }
}

fn compact(e: &Estimate, why: Why) -> Compact {
    let pos = |i: usize| u32::try_from(i).unwrap_or(u32::MAX);
    Compact {
        pool: pos(e.score.pool),
        node: e.score.node.map_or(u32::MAX, pos),
        kind: e.score.kind,
        market: e.market,
        start: e.start,
        finish: e.score.finish,
        cost: e.cost(),
        why,
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
            Some((kept, count)) => {
                *count += 1;
                // Over budget: name what the cheapest pool would need.
                if let (
                    Reject::BudgetExhausted {
                        cost: kept_cost, ..
                    },
                    Reject::BudgetExhausted { cost, .. },
                ) = (kept, b.reject)
                    && cost < *kept_cost
                {
                    *kept_cost = cost;
                }
            }
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

//! Hard constraints and the planner's verdicts on a pool: why a pool cannot take a job (allow-lists,
//! GPU model and accelerator kind ([`model_violation`]: the job's `gpu_models` and
//! `accelerator`, judged by [`crate::gpu_model::accepts`]), GPU memory, node shape, price ceiling, latency) and, once capacity is looked at, why it
//! cannot take it now (no capacity, bursting disabled, quota). It also owns which market a job
//! would use in a pool, since the price ceiling depends on it.
//!
//! The planner checks every pool for every queued job, so the check here allocates nothing: a
//! [`Reject`] becomes a public [`Rejection`] only for the few candidates an explanation shows.
//! This module knows nothing about nodes, running work or time.

use super::Rejection;
use crate::domain::{CallerShare, JobKind, JobSpec, Pool, Region, RegionId, Resources, SpotRule};
use crate::gpu_model;
use crate::money::Money;

/// Why a pool cannot take a job: [`Rejection`] without the allocation (`GpuModelNotAllowed`
/// takes its model from the pool when made public). Variants are declared closest-to-feasible
/// first; [`Reject::rank`] follows that order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Reject {
    /// Only ever shown, never a hold reason: the joint assignment gave the capacity away.
    ContendedCapacity,
    BudgetExhausted {
        cost: Money,
        remaining: Money,
    },
    OutsideTimeWindow,
    /// A `high` or `critical` service takes GPUs back from batch work before it launches.
    PreemptsBatchWorkFirst,
    BurstDisabled,
    BurstNotAllowedByPolicy,
    QuotaReached {
        node_limit: u32,
    },
    NoCapacity,
    OverMaxPrice {
        price_per_hour: Money,
        max_per_hour: Money,
    },
    OverPolicyMaxPrice {
        price_per_gpu_hour: Money,
        max_per_gpu_hour: Money,
    },
    LatencyTooHigh {
        latency_ms: u32,
        max_ms: u32,
    },
    TooFewCpus {
        have: u32,
        need: u32,
    },
    TooLittleMemory {
        have_gb: u32,
        need_gb: u32,
    },
    GpuMemoryTooSmall {
        have_gb: u32,
        need_gb: u32,
    },
    TooFewGpusPerNode {
        have: u32,
        need: u32,
    },
    GpuModelNotAllowed,
    /// The pool's model is not of the accelerator the job asks for (`resources.accelerator`;
    /// absent: not a GPU).
    AcceleratorNotAllowed,
    RegionNotAllowed,
    RegionNotAllowedByPolicy,
    ProviderNotAllowedByPolicy,
}

impl Reject {
    /// Closest to feasible first: a job blocked only because bursting is off is nearly placeable;
    /// one in a forbidden region never is. Explanations list blocked candidates in this order.
    pub(crate) fn rank(self) -> u8 {
        match self {
            Reject::ContendedCapacity => 0,
            Reject::BudgetExhausted { .. } => 1,
            Reject::OutsideTimeWindow => 2,
            Reject::PreemptsBatchWorkFirst => 3,
            Reject::BurstDisabled => 4,
            Reject::BurstNotAllowedByPolicy => 5,
            Reject::QuotaReached { .. } => 6,
            Reject::NoCapacity => 7,
            Reject::OverMaxPrice { .. } => 8,
            Reject::OverPolicyMaxPrice { .. } => 9,
            Reject::LatencyTooHigh { .. } => 10,
            Reject::TooFewCpus { .. } => 11,
            Reject::TooLittleMemory { .. } => 12,
            Reject::GpuMemoryTooSmall { .. } => 13,
            Reject::TooFewGpusPerNode { .. } => 14,
            Reject::GpuModelNotAllowed => 15,
            Reject::AcceleratorNotAllowed => 16,
            Reject::RegionNotAllowed => 17,
            Reject::RegionNotAllowedByPolicy => 18,
            Reject::ProviderNotAllowedByPolicy => 19,
        }
    }

    /// The public rejection; `gpu_model` is the pool's.
    pub(crate) fn to_rejection(self, gpu_model: &str) -> Rejection {
        match self {
            Reject::ContendedCapacity => Rejection::ContendedCapacity,
            Reject::BudgetExhausted { cost, remaining } => {
                Rejection::BudgetExhausted { cost, remaining }
            }
            Reject::OutsideTimeWindow => Rejection::OutsideTimeWindow,
            Reject::PreemptsBatchWorkFirst => Rejection::PreemptsBatchWorkFirst,
            Reject::BurstNotAllowedByPolicy => Rejection::BurstNotAllowedByPolicy,
            Reject::OverPolicyMaxPrice {
                price_per_gpu_hour,
                max_per_gpu_hour,
            } => Rejection::OverPolicyMaxPrice {
                price_per_gpu_hour,
                max_per_gpu_hour,
            },
            Reject::RegionNotAllowedByPolicy => Rejection::RegionNotAllowedByPolicy,
            Reject::ProviderNotAllowedByPolicy => Rejection::ProviderNotAllowedByPolicy,
            Reject::BurstDisabled => Rejection::BurstDisabled,
            Reject::QuotaReached { node_limit } => Rejection::QuotaReached { node_limit },
            Reject::NoCapacity => Rejection::NoCapacity,
            Reject::OverMaxPrice {
                price_per_hour,
                max_per_hour,
            } => Rejection::OverMaxPrice {
                price_per_hour,
                max_per_hour,
            },
            Reject::LatencyTooHigh { latency_ms, max_ms } => {
                Rejection::LatencyTooHigh { latency_ms, max_ms }
            }
            Reject::TooFewCpus { have, need } => Rejection::TooFewCpus { have, need },
            Reject::TooLittleMemory { have_gb, need_gb } => {
                Rejection::TooLittleMemory { have_gb, need_gb }
            }
            Reject::GpuMemoryTooSmall { have_gb, need_gb } => {
                Rejection::GpuMemoryTooSmall { have_gb, need_gb }
            }
            Reject::TooFewGpusPerNode { have, need } => Rejection::TooFewGpusPerNode { have, need },
            Reject::GpuModelNotAllowed => Rejection::GpuModelNotAllowed {
                model: gpu_model.to_string(),
            },
            Reject::AcceleratorNotAllowed => Rejection::AcceleratorNotAllowed {
                model: gpu_model.to_string(),
            },
            Reject::RegionNotAllowed => Rejection::RegionNotAllowed,
        }
    }

    /// A phrase for hold reasons, the same for every pool blocked the same way (so it names the
    /// job's requirement, not the pool's figure).
    pub(crate) fn summary(self) -> String {
        match self {
            Reject::ContendedCapacity => "capacity given to other jobs this round".into(),
            Reject::BudgetExhausted { cost, remaining } => format!(
                "over budget: needs {}, {} left",
                cost.usd_text(),
                remaining.usd_text()
            ),
            Reject::OutsideTimeWindow => {
                "outside the time windows the team's policy allows for its priority".into()
            }
            Reject::BurstNotAllowedByPolicy => {
                "needs a new node but the team's policy forbids bursting".into()
            }
            Reject::OverPolicyMaxPrice {
                max_per_gpu_hour, ..
            } => format!(
                "costs more than the team's maximum of {}/GPU-h",
                max_per_gpu_hour.usd_text()
            ),
            Reject::RegionNotAllowedByPolicy => "region not allowed by the team's policy".into(),
            Reject::ProviderNotAllowedByPolicy => {
                "provider not allowed by the team's policy".into()
            }
            Reject::BurstDisabled => "needs a new node but bursting is disabled".into(),
            Reject::PreemptsBatchWorkFirst => {
                "a new node only once no batch work can give its GPUs back".into()
            }
            Reject::QuotaReached { .. } => "needs a new node but its node quota is reached".into(),
            Reject::NoCapacity => "no healthy node has or will free enough GPUs".into(),
            Reject::OverMaxPrice { max_per_hour, .. } => {
                format!(
                    "costs more than the job's maximum of {}/h",
                    max_per_hour.usd_text()
                )
            }
            Reject::LatencyTooHigh { max_ms, .. } => {
                format!("region latency above the service's maximum of {max_ms} ms")
            }
            Reject::TooFewCpus { need, .. } => format!("fewer than {need} vCPUs per node"),
            Reject::TooLittleMemory { need_gb, .. } => {
                format!("less than {need_gb} GB of memory per node")
            }
            Reject::GpuMemoryTooSmall { need_gb, .. } => {
                format!("less than {need_gb} GB of GPU memory")
            }
            Reject::TooFewGpusPerNode { need, .. } => format!("fewer than {need} GPUs per node"),
            Reject::GpuModelNotAllowed => "GPU model not among the job's gpu_models".into(),
            Reject::AcceleratorNotAllowed => {
                "not the accelerator the job asks for (resources.accelerator; none: a GPU)".into()
            }
            Reject::RegionNotAllowed => "region not among the job's regions".into(),
        }
    }
}

/// The static hard constraints of one pool for one job: what no amount of waiting changes.
/// `None` when the pool could host the job. Region latency is checked by the planner, which has
/// the regions.
pub fn hard_constraint(pool: &Pool, spec: &JobSpec) -> Option<Rejection> {
    static_violation(pool, spec).map(|r| r.to_rejection(&pool.gpu_model))
}

/// [`hard_constraint`] without allocating.
pub(crate) fn static_violation(pool: &Pool, spec: &JobSpec) -> Option<Reject> {
    let r = &spec.resources;
    if !spec.regions.is_empty() && !spec.regions.contains(&pool.region) {
        return Some(Reject::RegionNotAllowed);
    }
    if let Some(reject) = model_violation(r, &pool.gpu_model) {
        return Some(reject);
    }
    shape_violation(pool, spec)
}

/// Whether the job may run on `model`: one of its `gpu_models` when it lists some, and of the
/// accelerator it asks for ([`gpu_model::accepts`]: absent, a GPU; `any`, every model; a vendor,
/// that vendor's).
pub(crate) fn model_violation(r: &Resources, model: &str) -> Option<Reject> {
    if !r.gpu_models.is_empty() && !r.gpu_models.iter().any(|m| m.eq_ignore_ascii_case(model)) {
        return Some(Reject::GpuModelNotAllowed);
    }
    (!gpu_model::accepts(r.accelerator, &r.gpu_models, model))
        .then_some(Reject::AcceleratorNotAllowed)
}

/// [`static_violation`] past the region and GPU model lists: the pool's shape and price
/// against the job's figures.
pub(crate) fn shape_violation(pool: &Pool, spec: &JobSpec) -> Option<Reject> {
    let r = &spec.resources;
    if pool.gpu_memory_gb < r.min_gpu_memory_gb {
        return Some(Reject::GpuMemoryTooSmall {
            have_gb: pool.gpu_memory_gb,
            need_gb: r.min_gpu_memory_gb,
        });
    }
    if pool.gpus_per_node < r.gpus {
        return Some(Reject::TooFewGpusPerNode {
            have: pool.gpus_per_node,
            need: r.gpus,
        });
    }
    if pool.vcpus > 0 && pool.vcpus < r.cpus {
        return Some(Reject::TooFewCpus {
            have: pool.vcpus,
            need: r.cpus,
        });
    }
    if pool.memory_gb > 0 && pool.memory_gb < r.memory_gb {
        return Some(Reject::TooLittleMemory {
            have_gb: pool.memory_gb,
            need_gb: r.memory_gb,
        });
    }
    if let Some(max) = spec.max_price_per_hour {
        // The job's share of the cheapest market it may use.
        let per_gpu = match (spec.spot, pool.spot_per_gpu_hour()) {
            (SpotRule::Allowed | SpotRule::Preferred, Some(spot)) => {
                spot.min(pool.on_demand_per_gpu_hour())
            }
            _ => pool.on_demand_per_gpu_hour(),
        };
        let price = per_gpu.saturating_mul(i64::from(r.gpus.max(1)));
        if price > max {
            return Some(Reject::OverMaxPrice {
                price_per_hour: price,
                max_per_hour: max,
            });
        }
    }
    None
}

/// A service's latency bound against the pool's region. Without callers, the bound applies to
/// the region's own latency (measured from the broker). With callers, it applies to the
/// share-weighted latency from them: zero from a caller in the region itself, else the two
/// regions' latencies added (the broker's vantage point as the hub, as the gateway ranks
/// regions). A region the snapshot does not describe has unknown latency, reported as
/// `u32::MAX`: a bound that cannot be checked is not met.
pub(crate) fn latency_violation<'r>(
    spec: &JobSpec,
    region: Option<&'r Region>,
    regions: impl Fn(&RegionId) -> Option<&'r Region>,
) -> Option<Reject> {
    if spec.kind != JobKind::Service {
        return None;
    }
    let max_ms = spec.max_latency_ms?;
    let latency_ms = match region {
        None => u32::MAX,
        Some(r) if spec.callers.is_empty() => r.latency_ms,
        Some(r) => caller_latency_ms(&spec.callers, r, regions),
    };
    (latency_ms > max_ms).then_some(Reject::LatencyTooHigh { latency_ms, max_ms })
}

/// The share-weighted latency from `callers` to `region`, rounded up; `u32::MAX` when a
/// caller's region is unknown.
pub(crate) fn caller_latency_ms<'r>(
    callers: &[CallerShare],
    region: &Region,
    regions: impl Fn(&RegionId) -> Option<&'r Region>,
) -> u32 {
    let mut weighted: u64 = 0;
    let mut total: u64 = 0;
    for c in callers {
        let ms = if c.region == region.id {
            0
        } else {
            match regions(&c.region) {
                Some(from) => u64::from(from.latency_ms) + u64::from(region.latency_ms),
                None => return u32::MAX,
            }
        };
        weighted += ms * u64::from(c.share_bp);
        total += u64::from(c.share_bp);
    }
    if total == 0 {
        return region.latency_ms;
    }
    u32::try_from(weighted.div_ceil(total)).unwrap_or(u32::MAX)
}

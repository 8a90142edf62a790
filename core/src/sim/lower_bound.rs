//! The offline lower bound on the cost of serving a trace by its deadlines.
//!
//! **The LP.** Knowing every arrival in advance, let job `j` (GPU-seconds `D_j = gpus ×
//! nodes × runtime`, a gang's every node counted, window `[submit_j, deadline_j]`) be served fractionally: `x_j` GPU-seconds on
//! on-prem capacity inside its window, the rest in the cloud. Costs are the company's cash
//! ([`crate::sim::SimResult::total_cost`]): on-prem costs `p_j` per GPU-second (the lowest
//! marginal cost, power and wear, of an on-prem pool the job fits, plus that pool's egress
//! share), the cloud `c_j`
//! (the cheapest per-GPU share of any cloud pool the job fits, spot when the job allows spot,
//! plus egress share): no boot time, no billing minimum, no idle tail, no interruptions. On-prem
//! has `C` GPUs (all on-prem pools pooled), so for every time interval `I` the work placed
//! inside `I` is at most `C × |I|`. Minimise `Σ p_j x_j + c_j (D_j − x_j)`.
//!
//! **Why it bounds every online policy that meets the deadlines.** Any real schedule that
//! finishes each job by its deadline gives a feasible point of this LP with a cost no higher
//! than the schedule's: the job's on-prem GPU-seconds fall in its window, on-prem never runs
//! more than `C` GPUs at once, and each costs the schedule its pool's marginal cost for at
//! least its runtime; a cloud node costs at least the per-GPU share of its price for the job's
//! GPUs, for at least the runtime, plus egress. (Owned GPUs' idle hours are a cost of
//! ownership, the same whatever runs: they are left out of both sides.) Every simplification (pooling on-prem,
//! fractional and preemptive service, any parallelism, windows widened to bucket edges below)
//! only enlarges the feasible set, so the LP optimum is a lower bound. A policy that misses
//! deadlines is outside the comparison (it could wait on-prem forever).
//!
//! **How it is solved, exactly, in milliseconds.** Time is cut into at most `buckets` intervals
//! at quantiles of the arrivals and deadlines (fine where jobs are dense); each window is widened
//! outward to bucket edges. The feasible `x` then form a polymatroid (a transportation problem
//! on a convex bipartite graph: by Hall's theorem for interval neighbourhoods, `x` is feasible
//! iff for every bucket interval `[l, r)` the work of the windows inside it is at most its
//! capacity). Maximising the saving `Σ (c_j − p_j) x_j` over a polymatroid is solved exactly by
//! the greedy algorithm (Edmonds, 1970): jobs by saving per GPU-second, best first, each taking
//! the most the interval constraints still allow. A table of the load of every bucket interval
//! makes each step `O(buckets²)`.
//!
//! **Checked** (`tests`, on small random instances): the greedy equals the time-indexed LP
//! solved as a min-cost flow (on the widened windows when buckets are coarse), and the bound
//! is at most the exact optimum of the integral, non-preemptive problem and at most the cost of
//! every simulated run that meets all its deadlines.

use super::{SimJob, World};
use crate::domain::{JobSpec, Pool, Region};
use crate::money::Money;
use crate::placement::hard_constraint;

/// Default number of time buckets.
pub const DEFAULT_BUCKETS: usize = 256;

/// The bound in micro-dollars (rounded down); see the module docs.
pub fn lp_lower_bound(world: &World, jobs: &[SimJob], buckets: usize) -> Money {
    let capacity_gpus: f64 = world
        .pools
        .iter()
        .filter(|p| !p.pool.launchable)
        .map(|p| f64::from(p.fixed_nodes) * f64::from(p.pool.gpus_per_node))
        .sum();
    let mut total = 0.0_f64;
    // (saving per GPU-second, job index, window, demand, saving)
    let mut contested: Vec<(f64, usize, i64, i64, f64, f64)> = Vec::new();
    for (i, job) in jobs.iter().enumerate() {
        let demand = f64::from(job.spec.resources.gpus)
            * f64::from(job.spec.resources.nodes.max(1))
            * job.runtime_s.max(0) as f64;
        let onprem = best_cost(world, &job.spec, job.runtime_s, false);
        let cloud = best_cost(world, &job.spec, job.runtime_s, true);
        match (onprem, cloud) {
            (None, None) => {}
            (Some(p), None) => total += p,
            (None, Some(c)) => total += c,
            (Some(p), Some(c)) if c <= p || demand <= 0.0 => total += c.min(p),
            (Some(p), Some(c)) => {
                total += c;
                match job.spec.deadline {
                    // No deadline: it may wait on-prem for as long as it takes.
                    None => total -= c - p,
                    Some(d) => contested.push((
                        (c - p) / demand,
                        i,
                        job.submit.millis(),
                        d.millis().max(job.submit.millis()),
                        demand,
                        c - p,
                    )),
                }
            }
        }
    }
    if capacity_gpus > 0.0 && !contested.is_empty() {
        total -= greedy_saving(&mut contested, capacity_gpus, buckets.max(1));
    }
    Money::from_micros(total.max(0.0).floor() as i64)
}

/// The least job `job` can cost in cash anywhere (its cheapest fitting pool, owned or cloud, for
/// its true runtime, egress included), as if owned capacity were unlimited: the bound's price
/// for it before capacity is shared, and whether that is on owned GPUs. The bound is the sum
/// of these floors plus what sharing the owned GPUs forces into the cloud. `None` when no pool
/// fits it.
pub fn job_floor(world: &World, job: &SimJob) -> Option<(Money, bool)> {
    let onprem = best_cost(world, &job.spec, job.runtime_s, false);
    let cloud = best_cost(world, &job.spec, job.runtime_s, true);
    let (floor, owned) = match (onprem, cloud) {
        (Some(p), Some(c)) => (p.min(c), p < c),
        (Some(p), None) => (p, true),
        (None, Some(c)) => (c, false),
        (None, None) => return None,
    };
    Some((Money::from_micros(floor.max(0.0).floor() as i64), owned))
}

/// The most saving on-prem capacity can buy: the polymatroid greedy of the module docs.
fn greedy_saving(jobs: &mut [(f64, usize, i64, i64, f64, f64)], gpus: f64, buckets: usize) -> f64 {
    let edges = bucket_edges(jobs, buckets);
    let b = edges.len();
    let cap_prefix: Vec<f64> = edges
        .iter()
        .map(|&t| (t - edges[0]) as f64 / 1000.0 * gpus)
        .collect();
    // load[l * b + r]: work placed in windows inside [edges[l], edges[r]].
    let mut load = vec![0.0_f64; b * b];
    jobs.sort_by(|x, y| y.0.total_cmp(&x.0).then(x.1.cmp(&y.1)));
    let mut saving = 0.0;
    for &(_, _, start, end, demand, job_saving) in jobs.iter() {
        let l_max = edges.partition_point(|&t| t <= start).saturating_sub(1);
        let r_min = edges.partition_point(|&t| t < end).min(b - 1);
        if r_min <= l_max {
            continue;
        }
        let mut room = demand;
        for l in 0..=l_max {
            for r in r_min..b {
                room = room.min(cap_prefix[r] - cap_prefix[l] - load[l * b + r]);
            }
        }
        let x = room.max(0.0);
        if x <= 0.0 {
            continue;
        }
        for l in 0..=l_max {
            for r in r_min..b {
                load[l * b + r] += x;
            }
        }
        saving += job_saving * (x / demand);
    }
    saving
}

/// At most `buckets + 1` edges at quantiles of the windows' ends, covering every window.
fn bucket_edges(jobs: &[(f64, usize, i64, i64, f64, f64)], buckets: usize) -> Vec<i64> {
    let mut times: Vec<i64> = jobs.iter().flat_map(|j| [j.2, j.3]).collect();
    times.sort_unstable();
    let n = times.len();
    let mut edges: Vec<i64> = (0..=buckets)
        .map(|k| times[(k * (n - 1)) / buckets])
        .collect();
    edges.dedup();
    edges
}

/// The least a job can cost in the cloud (`cloud`) or on-prem, in micro-dollars as a float.
fn best_cost(world: &World, spec: &JobSpec, runtime_s: i64, cloud: bool) -> Option<f64> {
    world
        .pools
        .iter()
        .filter(|p| p.pool.launchable == cloud && hard_constraint(&p.pool, spec).is_none())
        .map(|p| {
            let market = p.pool.cheapest_market(spec.spot);
            // The exact per-GPU share (no rounding up) of the cash cost: a bound must not
            // overcharge.
            let share = p.pool.cash_per_hour(market).micros() as f64
                / f64::from(p.pool.gpus_per_node.max(1));
            let gpus = f64::from(spec.resources.gpus) * f64::from(spec.resources.nodes.max(1));
            let compute = share * gpus * runtime_s.max(0) as f64 / 3600.0;
            compute + egress(&world.regions, spec, &p.pool).micros() as f64
        })
        .min_by(f64::total_cmp)
}

fn egress(regions: &[Region], spec: &JobSpec, pool: &Pool) -> Money {
    match &spec.data {
        Some(d) if d.region != pool.region => regions
            .iter()
            .find(|r| r.id == d.region)
            .map_or(Money::ZERO, |r| {
                r.egress_per_gb.saturating_mul(i64::from(d.size_gb))
            }),
        _ => Money::ZERO,
    }
}

#[cfg(test)]
mod tests;

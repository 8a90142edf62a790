//! `report.json` and the plots, from the engine's results. Latency metrics (deadlines met,
//! queueing delay) cover the measured jobs (submitted on or after the scenario's start day);
//! money covers the whole replay, warm-up jobs included, like the lower bound it is compared to.

use super::services::ServiceReport;
use super::svg::{Series, bar_chart, line_chart};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use switchyard_core::Money;
use switchyard_core::sim::SimResult;

#[derive(Debug, Serialize, Deserialize)]
pub struct Report {
    pub schedulers: BTreeMap<String, SchedulerReport>,
    pub lp_lower_bound_usd: f64,
    /// `total_cost / lp_lower_bound` per scheduler, and Switchyard against each baseline.
    pub ratios: BTreeMap<String, f64>,
    pub lp_time_ms: f64,
    pub trace: TraceInfo,
    pub scenario: serde_json::Value,
    /// The scenario's inference services, each under every scaling policy (`services.rs`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub services: Vec<ServiceReport>,
    /// What the services' chosen policies cost beside the batch work above.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub services_total: Option<ServicesTotal>,
    /// The waste rule replayed over the jobs as placed (`--waste` or `[waste]`; `waste.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waste: Option<super::waste::WasteReport>,
    /// The runtimes the schedulers were told, against the truth (`estimates.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimates: Option<super::estimates::EstimatesReport>,
}

/// The services' replicas next to the batch replay: one simulated day, repeated over the
/// replay's span; their on-prem peak is taken out of the batch work's on-prem nodes.
#[derive(Debug, Serialize, Deserialize)]
pub struct ServicesTotal {
    pub replica_hours_per_day: f64,
    pub usd_per_day: f64,
    /// Days from the trace's first to its last submission.
    pub replay_days: f64,
    pub usd_over_replay: f64,
    pub onprem_nodes_reserved: u32,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct TraceInfo {
    pub file: String,
    pub format: String,
    pub rows: usize,
    pub skipped_bad_rows: u64,
    pub measured_jobs: usize,
    pub warmup_jobs: usize,
    /// Multi-node jobs replayed as gangs (`multi_node = "gang"`, the default).
    pub multi_node_jobs_as_gangs: usize,
    /// Multi-node jobs folded onto one node: all of them under `multi_node = "fold"`, only
    /// those no pool could hold as a gang otherwise.
    pub multi_node_jobs_folded: usize,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct SchedulerReport {
    pub jobs: usize,
    /// The headline: what the company pays in cash (cloud spend, on-prem at its marginal cost,
    /// egress), the basis of the LP bound and the ratios. `cost_usd` without `onprem`.
    pub total_cost_usd: f64,
    /// What the ledger bills teams: on-prem at the internal rate instead. `cost_usd` without
    /// `onprem_cash`.
    #[serde(default)]
    pub chargeback_usd: f64,
    /// Owned GPU-hours idle in the measured window, and their worth at the internal rate: a
    /// cost of ownership, in neither total.
    #[serde(default)]
    pub owned_idle_gpu_hours: f64,
    #[serde(default)]
    pub owned_idle_usd: f64,
    pub deadline_met_fraction: f64,
    pub queue_delay_s: Delay,
    pub onprem_gpu_utilization: f64,
    pub burst_instances: u64,
    pub plan_time_ms: f64,
    pub cost_usd: Breakdown,
    pub unfinished_jobs: usize,
    pub spot_interruptions: u64,
    pub preemptions: u64,
    pub rejected_actions: u64,
    pub scheduler_calls: u64,
    pub simulation_wall_ms: f64,
    /// What its cost is made of against the LP bound ([`GapAnatomy`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gap: Option<GapAnatomy>,
}

/// A run's cash cost against the LP bound, in dollars per cause (issue 29).
///
/// The bound is every job at its floor (its cheapest fitting pool for its true runtime, owned
/// capacity unlimited: [`switchyard_core::sim::job_floor`]) plus `capacity_usd`, what sharing
/// the owned GPUs forces dearer. The run is its cloud nodes' idle time, their GPUs no job held
/// while busy, the work interruptions threw away, and what each job's kept work paid. So
///
/// `gap = cloud_idle + fragmentation + reruns + burst_owned_full + burst_owned_free + dearer
///        + unfinished − capacity + rounding`
///
/// Jobs whose floor is owned GPUs that ran in the cloud split by what the owned nodes that
/// fit them held when they started there: `burst_owned_full` (none had the job's GPUs free: a
/// deadline that could not wait for them; the bound, fractional, preemptive and knowing every
/// arrival, fits such peaks into the quiet hours, so this is where its looseness shows) and
/// `burst_owned_free` (some had: a choice, the on-prem reserve kept them for jobs that cannot
/// use spot, or a finish there judged too late). `dearer` is the rest: a dearer pool or market
/// than the floor. The others are what running real nodes costs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GapAnatomy {
    /// The run's cash cost less the bound.
    pub gap_usd: f64,
    /// Cloud nodes booting, idle before their TTL, and the billing minimum.
    pub cloud_idle_usd: f64,
    /// GPUs of a busy cloud node that no job held.
    pub fragmentation_usd: f64,
    /// Work that an interruption or preemption threw away (what no checkpoint kept).
    pub reruns_usd: f64,
    /// Finished jobs whose floor is owned GPUs that ran in the cloud, over that floor, when
    /// the owned nodes that fit them were full.
    pub burst_owned_full_usd: f64,
    /// The same when some owned nodes that fit them had their GPUs free.
    pub burst_owned_free_usd: f64,
    /// Other finished jobs over their floor.
    pub dearer_usd: f64,
    /// Jobs that did not finish: what they paid less their floor (negative: the bound counts
    /// their whole runtime).
    pub unfinished_usd: f64,
    /// The bound's own price of sharing the owned GPUs (the bound less the sum of floors).
    pub capacity_usd: f64,
    /// What the identity leaves (rounding to micro-dollars per charge).
    pub rounding_usd: f64,
}

/// The anatomy of `r`'s cost against `bound`; `floors` are the replayed jobs' floors, in
/// order ([`switchyard_core::sim::job_floor`], the same for every scheduler of a run).
pub fn gap_anatomy(r: &SimResult, floors: &[Option<(Money, bool)>], bound: Money) -> GapAnatomy {
    let mut floor_sum = 0i64;
    let (mut full, mut free, mut dearer, mut unfinished) = (0i64, 0, 0, 0);
    let (mut reruns, mut cloud_share) = (0i64, 0);
    for (floor, out) in floors.iter().zip(&r.jobs) {
        let (floor, owned) = floor.unwrap_or((Money::ZERO, false));
        floor_sum += floor.micros();
        reruns += out.lost_cash.micros();
        cloud_share += out.cloud_cash.micros();
        let over = out.cash.micros() - out.lost_cash.micros() - floor.micros();
        if out.finish.is_none() {
            unfinished += over;
        } else if owned && out.cloud_cash > Money::ZERO {
            if out.cloud_while_owned_free {
                free += over;
            } else {
                full += over;
            }
        } else {
            dearer += over;
        }
    }
    let d = |m: i64| Money(m).as_dollars();
    let total = r.total_cost().micros();
    let gap = total - bound.micros();
    let idle = r.cloud_idle_cost.micros();
    let fragmentation = r.cloud_busy_cost.micros() - cloud_share;
    let capacity = bound.micros() - floor_sum;
    let parts = idle + fragmentation + reruns + full + free + dearer + unfinished - capacity;
    GapAnatomy {
        gap_usd: d(gap),
        cloud_idle_usd: d(idle),
        fragmentation_usd: d(fragmentation),
        reruns_usd: d(reruns),
        burst_owned_full_usd: d(full),
        burst_owned_free_usd: d(free),
        dearer_usd: d(dearer),
        unfinished_usd: d(unfinished),
        capacity_usd: d(capacity),
        rounding_usd: d(gap - parts),
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Delay {
    pub p50: f64,
    pub p99: f64,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Breakdown {
    pub cloud_busy: f64,
    pub cloud_idle: f64,
    /// Busy on-prem GPU-hours at the internal rate (chargeback).
    pub onprem: f64,
    /// The same at their marginal cost (cash).
    #[serde(default)]
    pub onprem_cash: f64,
    pub egress: f64,
}

/// Nearest-rank percentile of sorted values (0 for none).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn usd(m: Money) -> f64 {
    m.as_dollars()
}

pub fn scheduler_report(r: &SimResult, plan_time_ms: f64, wall_ms: f64) -> SchedulerReport {
    let measured: Vec<_> = r.jobs.iter().filter(|j| j.measured).collect();
    let mut delays: Vec<f64> = measured.iter().filter_map(|j| j.queue_delay_s()).collect();
    delays.sort_by(f64::total_cmp);
    let met = measured.iter().filter(|j| j.met_deadline()).count();
    SchedulerReport {
        jobs: measured.len(),
        total_cost_usd: usd(r.total_cost()),
        chargeback_usd: usd(r.chargeback_cost()),
        owned_idle_gpu_hours: r.owned_idle_gpu_hours,
        owned_idle_usd: usd(r.owned_idle_cost),
        deadline_met_fraction: met as f64 / measured.len().max(1) as f64,
        queue_delay_s: Delay {
            p50: percentile(&delays, 50.0),
            p99: percentile(&delays, 99.0),
        },
        onprem_gpu_utilization: r.onprem_gpu_utilization,
        burst_instances: r.burst_instances,
        plan_time_ms,
        cost_usd: Breakdown {
            cloud_busy: usd(r.cloud_busy_cost),
            cloud_idle: usd(r.cloud_idle_cost),
            onprem: usd(r.onprem_cost),
            onprem_cash: usd(r.onprem_cash_cost),
            egress: usd(r.egress_cost),
        },
        unfinished_jobs: r.jobs.iter().filter(|j| j.finish.is_none()).count(),
        spot_interruptions: r.spot_interruptions,
        preemptions: r.preemptions,
        rejected_actions: r.rejected_actions,
        scheduler_calls: r.scheduler_calls,
        simulation_wall_ms: wall_ms,
        gap: None,
    }
}

/// `(file name, SVG)` for the three plots. Time is in days since `origin_ms`.
pub fn plots(results: &[SimResult], origin_ms: i64) -> Vec<(&'static str, String)> {
    let day = 86_400_000.0;
    let cost: Vec<Series> = results
        .iter()
        .map(|r| {
            let mut sum = 0.0;
            let mut points = vec![(0.0, 0.0)];
            for &(t, m) in &r.timeline {
                sum += usd(m);
                points.push(((t.millis() - origin_ms) as f64 / day, sum));
            }
            Series {
                name: r.scheduler.clone(),
                points: thin(points, 2000),
            }
        })
        .collect();
    let cdf: Vec<Series> = results
        .iter()
        .map(|r| {
            let mut d: Vec<f64> = r
                .jobs
                .iter()
                .filter(|j| j.measured)
                .filter_map(|j| j.queue_delay_s())
                .collect();
            d.sort_by(f64::total_cmp);
            let n = d.len().max(1) as f64;
            // Delays below a second are drawn at 1 s on the log axis.
            let points = d
                .iter()
                .enumerate()
                .map(|(i, &x)| (x.max(1.0), (i + 1) as f64 / n))
                .collect();
            Series {
                name: r.scheduler.clone(),
                points: thin(points, 2000),
            }
        })
        .collect();
    let mut totals: BTreeMap<String, f64> = BTreeMap::new();
    for r in results {
        for (region, m) in &r.spend_by_region {
            *totals.entry(region.to_string()).or_default() += usd(*m);
        }
    }
    let mut regions: Vec<(String, f64)> = totals.into_iter().collect();
    regions.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    regions.truncate(12);
    let categories: Vec<String> = regions.into_iter().map(|(r, _)| r).collect();
    let bars: Vec<(String, Vec<f64>)> = results
        .iter()
        .map(|r| {
            let v = categories
                .iter()
                .map(|c| {
                    r.spend_by_region
                        .iter()
                        .find(|(k, _)| k.as_str() == c)
                        .map_or(0.0, |(_, m)| usd(*m))
                })
                .collect();
            (r.scheduler.clone(), v)
        })
        .collect();
    vec![
        (
            "cost_over_time.svg",
            line_chart(
                "Cumulative cost",
                "days since trace start",
                "USD",
                &cost,
                false,
            ),
        ),
        (
            "queue_delay_cdf.svg",
            line_chart(
                "Queueing delay CDF (measured jobs)",
                "queueing delay, seconds (log)",
                "fraction of jobs",
                &cdf,
                true,
            ),
        ),
        (
            "spend_by_region.svg",
            bar_chart("Spend by region (top 12)", "USD", &categories, &bars),
        ),
    ]
}

/// Keeps at most about `max` points, always the last.
fn thin(points: Vec<(f64, f64)>, max: usize) -> Vec<(f64, f64)> {
    if points.len() <= max {
        return points;
    }
    let step = points.len().div_ceil(max);
    let last = points.last().copied();
    let mut out: Vec<(f64, f64)> = points.into_iter().step_by(step).collect();
    if let Some(l) = last
        && out.last() != Some(&l)
    {
        out.push(l);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
        assert_eq!(percentile(&[], 50.0), 0.0);
    }
}

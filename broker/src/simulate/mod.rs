//! `switchyard simulate`: replays a job trace against the bundled catalogue and a scenario on a
//! virtual clock, under Switchyard and the peers' strategies, and writes `report.json` and SVG
//! plots. The imperative shell around `switchyard_core::sim`: files, parsing, wall-clock timing
//! of each scheduler's own decisions, output. Synchronous: it runs before any async runtime
//! work and needs none.

pub mod estimates;
pub mod report;
pub mod scenario;
pub mod services;
pub mod svg;
#[cfg(test)]
mod tests;
pub mod trace;
pub mod waste;

use anyhow::{Context, bail};
use scenario::Scenario;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use switchyard_core::sim::{
    self, Cheapest, Decisions, FifoBurst, Scheduler, SimConfig, SimJob, SimResult, Switchyard, View,
};
use switchyard_core::{Money, Timestamp};
use switchyard_providers::catalogue::Catalogue;

#[derive(clap::Args, Debug, Clone)]
pub struct SimulateArgs {
    /// Job trace to replay (plain CSV or gzip). Not with `--services-only`.
    #[arg(long, required_unless_present = "services_only")]
    pub trace: Option<PathBuf>,
    /// The trace's format: `philly` (DIR-LAB's Philly CSV), `bluewaters` (the same columns
    /// with the users' requested wall times; CPU jobs left out), `helios` (SenseTime Helios'
    /// `cluster_log.csv`) or `swf` (the Parallel Workloads Archive's Standard Workload Format).
    #[arg(long, value_enum, default_value_t = TraceFormat::Philly)]
    pub trace_format: TraceFormat,
    /// Scenario TOML (defaults for every key; unknown keys are errors).
    #[arg(long)]
    pub scenario: Option<PathBuf>,
    /// The scheduler to replay the trace under (`all`: Switchyard and every peer's strategy).
    #[arg(long, value_enum, default_value_t = Which::All)]
    pub scheduler: Which,
    /// What Switchyard is told of runtimes (`estimates.rs`): `oracle` (the truth, for every
    /// scheduler: the default, as before issue 29), `predicted` (its own prediction from the
    /// replay's history), `user` (what users asked for: `switchyard-user`), or `all` three
    /// (then `switchyard` is the predicted run, `switchyard-oracle` the oracle's, and the peers
    /// are told what users asked for).
    #[arg(long, value_enum, default_value_t = Estimates::Oracle)]
    pub estimates: Estimates,
    /// Skip malformed trace rows (and count them) instead of stopping at the first.
    #[arg(long)]
    pub skip_bad_rows: bool,
    /// Output directory for report.json and the plots.
    #[arg(long)]
    pub out: PathBuf,
    /// Replay only the scenario's `[[services]]`, each under fixed provisioning, an RPS-target
    /// autoscaler and Switchyard's, side by side (the services bench); no job trace.
    #[arg(long, conflicts_with = "trace")]
    pub services_only: bool,
    /// Replay a GPU utilisation rule over the jobs as placed (`waste.rs`): the GPU-hours and
    /// dollars it frees and the jobs it stops wrongly, under assumed utilisation profiles (the
    /// scenario's `[waste]` section, or its defaults).
    #[arg(long)]
    pub waste: bool,
}

pub use trace::TraceFormat;

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Estimates {
    Predicted,
    User,
    Oracle,
    All,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Which {
    Switchyard,
    Cheapest,
    FifoBurst,
    All,
}

/// What a run's scheduler is told of runtimes.
#[derive(Clone, Copy, Debug)]
enum Told {
    Truth,
    Requested,
    Predicted,
}

/// Measures a scheduler's own compute time with the wall clock (the engine has none).
struct Timed<'a> {
    inner: &'a mut dyn Scheduler,
    spent: Duration,
}

impl Scheduler for Timed<'_> {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn decide(&mut self, view: &View<'_>) -> Decisions {
        let start = Instant::now();
        let d = self.inner.decide(view);
        self.spent += start.elapsed();
        d
    }
}

/// Runs the command; prints a one-line summary per scheduler (and a table per service).
/// Returns the batch replay's report (`None` with `--services-only`).
pub fn run(args: &SimulateArgs) -> anyhow::Result<Option<report::Report>> {
    let scenario = match &args.scenario {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            Scenario::from_toml(&text).with_context(|| format!("in {}", path.display()))?
        }
        None => Scenario::default(),
    };
    let catalogue = Catalogue::bundled().context("loading the bundled catalogue")?;
    let Some(trace_path) = args.trace.as_ref().filter(|_| !args.services_only) else {
        if scenario.services.is_empty() {
            bail!("--services-only needs a --scenario with [[services]]");
        }
        let world = scenario.world(&catalogue)?;
        let (services, _) = services::simulate_all(&scenario.services, &world, scenario.seed)?;
        std::fs::create_dir_all(&args.out)
            .with_context(|| format!("creating {}", args.out.display()))?;
        for (name, svg) in services.iter().flat_map(|s| &s.plots) {
            write(&args.out.join(name), svg)?;
        }
        let json = serde_json::json!({
            "services": services,
            "scenario": serde_json::to_value(&scenario)?,
        });
        write(
            &args.out.join("report.json"),
            &serde_json::to_string_pretty(&json)?,
        )?;
        return Ok(None);
    };
    let trace = trace::read(trace_path, args.trace_format, args.skip_bad_rows)?;
    if trace.jobs.is_empty() {
        bail!(
            "{} has no GPU jobs to replay ({} rows without GPUs, {} bad rows skipped)",
            trace_path.display(),
            trace.non_gpu_rows,
            trace.skipped
        );
    }
    let report = simulate(&scenario, &catalogue, &trace, args)?;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    write(
        &args.out.join("report.json"),
        &serde_json::to_string_pretty(&report)?,
    )?;
    Ok(Some(report))
}

fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// Builds the world and jobs, runs the schedulers and the bound, writes the plots.
pub fn simulate(
    scenario: &Scenario,
    catalogue: &Catalogue,
    trace: &trace::Trace,
    args: &SimulateArgs,
) -> anyhow::Result<report::Report> {
    let mut world = scenario.world(catalogue)?;
    for w in scenario.warnings() {
        eprintln!("warning: {w}");
    }
    // The services' replicas first: their on-prem peak is not batch work's to use.
    let (services, reserve) = services::simulate_all(&scenario.services, &world, scenario.seed)?;
    for p in &mut world.pools {
        if let Some(n) = reserve.get(&p.pool.id) {
            if *n > p.fixed_nodes {
                bail!(
                    "the services' replicas need {n} nodes of {}, which has {}",
                    p.pool.id,
                    p.fixed_nodes
                );
            }
            p.fixed_nodes -= n;
            p.pool.node_limit = p.pool.node_limit.saturating_sub(*n);
        }
    }
    if let Some(why) = scenario.nothing_measured(&trace.jobs) {
        bail!("{why}");
    }
    let jobs = scenario.jobs(&trace.jobs);
    let multi_node = scenario.multi_node_counts(&trace.jobs);
    eprintln!(
        "multi-node  {} jobs as gangs, {} folded onto one node",
        multi_node.gangs, multi_node.folded
    );
    let cfg = SimConfig {
        idle_ttl_s: scenario.idle_ttl_s,
        min_billed_s: 60,
        checkpoint_interval_s: scenario.checkpoint_interval_s,
        tick_s: scenario.tick_s,
        seed: scenario.seed,
        measure_from: scenario.measure_from(&trace.jobs),
        reserve_free_below_one_in: scenario.reserve_free_below_one_in,
    };
    // What the users asked for: the schedulers are told this, or Switchyard's prediction
    // from it; only `switchyard-oracle` sees the truth.
    let (requested, drawn) = scenario
        .estimates
        .requested(scenario.seed, &trace.jobs, &jobs);
    let told_jobs: Vec<SimJob> = jobs
        .iter()
        .zip(&requested)
        .map(|(j, &r)| SimJob {
            estimate_s: Some(r),
            ..j.clone()
        })
        .collect();
    let wants = |w: Which| args.scheduler == Which::All || args.scheduler == w;
    let wants_estimates = |e: Estimates| args.estimates == Estimates::All || args.estimates == e;
    let mut runs: Vec<(String, Box<dyn Scheduler>, Told)> = Vec::new();
    if wants(Which::Switchyard) {
        for (e, name) in [
            (Estimates::Predicted, "switchyard"),
            (Estimates::User, "switchyard-user"),
            (Estimates::Oracle, "switchyard-oracle"),
        ] {
            if wants_estimates(e) {
                let told = match e {
                    Estimates::Predicted => Told::Predicted,
                    Estimates::Oracle => Told::Truth,
                    _ => Told::Requested,
                };
                // Alone, the run is named as before.
                let name = if args.estimates == Estimates::All {
                    name
                } else {
                    "switchyard"
                };
                runs.push((name.into(), Box::new(Switchyard::default()), told));
            }
        }
    }
    // The peers are told what Switchyard is, or the users' requests beside a prediction.
    let peers_told = match args.estimates {
        Estimates::Oracle => Told::Truth,
        _ => Told::Requested,
    };
    if wants(Which::Cheapest) {
        runs.push(("cheapest".into(), Box::new(Cheapest), peers_told));
    }
    if wants(Which::FifoBurst) {
        let s = FifoBurst {
            burst_after_s: scenario.fifo_burst_after_s,
        };
        runs.push(("fifo-burst".into(), Box::new(s), peers_told));
    }
    let mut results: Vec<SimResult> = Vec::new();
    let mut reports = BTreeMap::new();
    let mut user_error = None;
    let mut predicted_error = None;
    for (name, s, told) in &mut runs {
        let mut timed = Timed {
            inner: s.as_mut(),
            spent: Duration::ZERO,
        };
        let start = Instant::now();
        let mut result = match told {
            Told::Truth => sim::run(&world, &jobs, &cfg, &mut timed),
            Told::Requested => {
                let mut given = estimates::Given::new(jobs.len());
                let r = sim::run_with(&world, &told_jobs, &cfg, &mut timed, &mut given);
                user_error.get_or_insert_with(|| estimates::error_stats(&jobs, &given.told));
                r
            }
            Told::Predicted => {
                let mut p = estimates::Predicting::new(&trace.jobs, &told_jobs);
                let r = sim::run_with(&world, &told_jobs, &cfg, &mut timed, &mut p);
                predicted_error = Some(estimates::error_stats(&jobs, &p.told));
                r
            }
        };
        result.scheduler = name.clone();
        let wall_ms = start.elapsed().as_secs_f64() * 1000.0;
        let plan_ms = timed.spent.as_secs_f64() * 1000.0;
        let r = report::scheduler_report(&result, plan_ms, wall_ms);
        eprintln!("{}", summary_line(&result.scheduler, &r));
        reports.insert(result.scheduler.clone(), r);
        results.push(result);
    }
    let estimates_report = (user_error.is_some() || predicted_error.is_some()).then(|| {
        let e = estimates::EstimatesReport {
            requests_drawn: drawn,
            noise_model: drawn.then(|| scenario.estimates.clone()),
            user: user_error.unwrap_or_default(),
            predicted: predicted_error,
        };
        eprintln!("{}", estimates_line(&e));
        e
    });
    let start = Instant::now();
    let bound = sim::lp_lower_bound(&world, &jobs, scenario.lp_buckets);
    let lp_time_ms = start.elapsed().as_secs_f64() * 1000.0;
    eprintln!(
        "lp lower bound ${:.2} ({lp_time_ms:.0} ms)",
        bound.as_dollars()
    );
    let floors: Vec<_> = jobs.iter().map(|j| sim::job_floor(&world, j)).collect();
    for result in &results {
        let gap = report::gap_anatomy(result, &floors, bound);
        eprintln!("{}", gap_line(&result.scheduler, &gap));
        if let Some(r) = reports.get_mut(&result.scheduler) {
            r.gap = Some(gap);
        }
    }
    let ratios = ratios(&reports, bound);
    let waste = match (&scenario.waste, args.waste) {
        (Some(w), _) => Some(w.clone()),
        (None, true) => Some(waste::WasteScenario::default()),
        (None, false) => None,
    }
    .and_then(|w| {
        let placed = results
            .iter()
            .find(|r| r.scheduler == "switchyard")
            .or(results.first())?;
        let start = Instant::now();
        let r = waste::report(&w, scenario.seed, &jobs, placed);
        eprintln!(
            "{}(replayed in {:.0} ms)",
            waste::table(&r),
            start.elapsed().as_secs_f64() * 1000.0
        );
        Some(r)
    });
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let origin_ms = Timestamp::from_secs(scenario::EPOCH_S).millis();
    for (name, svg) in report::plots(&results, origin_ms) {
        write(&args.out.join(name), &svg)?;
    }
    for (name, svg) in services.iter().flat_map(|s| &s.plots) {
        write(&args.out.join(name), svg)?;
    }
    let start_s = scenario.warmup_end_s(&trace.jobs);
    let measured = trace.jobs.iter().filter(|j| j.submit_s >= start_s).count();
    let services_total = services_total(&services, &reserve, &trace.jobs);
    if let Some(t) = &services_total {
        eprintln!(
            "services    ${:.2} a day ({:.1} replica-hours), ${:.2} over the replay's {:.1} days; \
             {} on-prem nodes reserved",
            t.usd_per_day,
            t.replica_hours_per_day,
            t.usd_over_replay,
            t.replay_days,
            t.onprem_nodes_reserved
        );
    }
    Ok(report::Report {
        schedulers: reports,
        lp_lower_bound_usd: bound.as_dollars(),
        ratios,
        lp_time_ms,
        trace: report::TraceInfo {
            file: args
                .trace
                .as_ref()
                .map_or_else(String::new, |p| p.display().to_string()),
            format: clap::ValueEnum::to_possible_value(&args.trace_format)
                .map_or_else(String::new, |v| v.get_name().to_owned()),
            rows: trace.jobs.len(),
            skipped_bad_rows: trace.skipped,
            measured_jobs: measured,
            warmup_jobs: trace.jobs.len() - measured,
            multi_node_jobs_as_gangs: multi_node.gangs,
            multi_node_jobs_folded: multi_node.folded,
        },
        scenario: serde_json::to_value(scenario)?,
        services,
        services_total,
        waste,
        estimates: estimates_report,
    })
}

/// The chosen policies' replica-hours and cost per day, and over the job trace's span.
fn services_total(
    services: &[services::ServiceReport],
    reserve: &BTreeMap<switchyard_core::PoolId, u32>,
    jobs: &[trace::TraceJob],
) -> Option<report::ServicesTotal> {
    if services.is_empty() {
        return None;
    }
    fn chosen(s: &services::ServiceReport) -> Option<&services::PolicyReport> {
        s.policies
            .iter()
            .find(|p| p.policy.split(' ').next() == Some(s.reserved_by.as_str()))
    }
    let (hours, usd) = services
        .iter()
        .filter_map(chosen)
        .fold((0.0, 0.0), |a, p| (a.0 + p.replica_hours, a.1 + p.cost_usd));
    let first = jobs.iter().map(|j| j.submit_s).min().unwrap_or(0);
    let last = jobs.iter().map(|j| j.submit_s).max().unwrap_or(0);
    let days = (last - first) as f64 / 86_400.0;
    Some(report::ServicesTotal {
        replica_hours_per_day: hours,
        usd_per_day: usd,
        replay_days: days,
        usd_over_replay: usd * days,
        onprem_nodes_reserved: reserve.values().sum(),
    })
}

/// One line of a run's gap to the bound, by cause (see [`report::GapAnatomy`]).
fn gap_line(name: &str, g: &report::GapAnatomy) -> String {
    format!(
        "gap {name:<18} ${:.0} = idle ${:.0} + fragmentation ${:.0} + reruns ${:.0} + bursts with \
         owned full ${:.0} + bursts with owned free ${:.0} + dearer ${:.0} + unfinished ${:.0} \
         - capacity ${:.0} (rounding ${:.2})",
        g.gap_usd,
        g.cloud_idle_usd,
        g.fragmentation_usd,
        g.reruns_usd,
        g.burst_owned_full_usd,
        g.burst_owned_free_usd,
        g.dearer_usd,
        g.unfinished_usd,
        g.capacity_usd,
        g.rounding_usd
    )
}

fn ratios(
    reports: &BTreeMap<String, report::SchedulerReport>,
    bound: Money,
) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    let lb = bound.as_dollars();
    for (name, r) in reports {
        if lb > 0.0 {
            out.insert(format!("{name}_over_lp_bound"), r.total_cost_usd / lb);
        }
    }
    if let Some(sy) = reports.get("switchyard") {
        for base in ["cheapest", "fifo-burst"] {
            if let Some(b) = reports.get(base).filter(|b| b.total_cost_usd > 0.0) {
                out.insert(
                    format!("switchyard_over_{base}"),
                    sy.total_cost_usd / b.total_cost_usd,
                );
            }
        }
    }
    out
}

/// The line `simulate` prints about the runtimes the schedulers were told.
fn estimates_line(e: &estimates::EstimatesReport) -> String {
    let stats = |s: &estimates::ErrorStats| {
        format!(
            "MdAPE {:.0}%, under-predicted {:.0}% (p90 {:.0}% of the run)",
            s.median_abs_pct_error * 100.0,
            s.under_predicted_share * 100.0,
            s.p90_under_prediction * 100.0
        )
    };
    let mut line = format!(
        "estimates   users' requests ({}): {}",
        if e.requests_drawn {
            "drawn from the noise model"
        } else {
            "the trace's"
        },
        stats(&e.user)
    );
    if let Some(p) = &e.predicted {
        line.push_str(&format!("; predicted p50: {}", stats(p)));
    }
    line
}

/// The line `simulate` prints for one scheduler (README explains the columns).
pub fn summary_line(name: &str, r: &report::SchedulerReport) -> String {
    format!(
        "{:<11} cost ${:>12.2}  deadlines met {:>6.2}%  delay p50 {:>8.0}s p99 {:>9.0}s  \
         bursts {:>6}  scheduler {:>8.0} ms  wall {:>8.0} ms",
        name,
        r.total_cost_usd,
        r.deadline_met_fraction * 100.0,
        r.queue_delay_s.p50,
        r.queue_delay_s.p99,
        r.burst_instances,
        r.plan_time_ms,
        r.simulation_wall_ms
    )
}

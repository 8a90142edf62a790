//! The command end to end on a small trace: report shape, same seed → same report, bad input.

use super::scenario::Scenario;
use super::*;

const HEADER: &str = "u_id,user,gpu_num,cpu_num,node_num,interval,run_time,wall_time,new_status\n";

fn small_trace() -> String {
    let mut s = String::from(HEADER);
    for i in 0..60 {
        let gpus = [1, 1, 2, 4, 8, 16][i % 6];
        let nodes = if gpus == 16 { 2 } else { 1 };
        let interval = (i * 37) % 400;
        let runtime = 300 + (i * 911) % 20_000;
        s.push_str(&format!(
            "{i},1,{gpus},0,{nodes},{interval},{runtime},0,Pass\n"
        ));
    }
    s
}

/// A world small enough to contend: 2 on-prem nodes, start day 0.
fn small_scenario() -> Scenario {
    // Gangs: the small trace's ten 2-node jobs run on two nodes each.
    let mut s = Scenario {
        start_day: Some(0.0),
        multi_node: scenario::MultiNode::Gang,
        ..Scenario::default()
    };
    s.onprem[0].nodes = 2;
    s
}

fn args(dir: &Path, trace: &Path) -> SimulateArgs {
    SimulateArgs {
        trace: Some(trace.to_owned()),
        trace_format: TraceFormat::Philly,
        scenario: None,
        scheduler: Which::All,
        estimates: Estimates::Oracle,
        skip_bad_rows: false,
        out: dir.to_owned(),
        services_only: false,
        waste: false,
    }
}

fn report_json(scenario: &Scenario, text: &str, dir: &Path) -> serde_json::Value {
    let trace = trace::parse_philly(text, false).expect("trace parses");
    let catalogue = Catalogue::bundled().expect("catalogue");
    let path = dir.join("t.csv");
    let r = simulate(scenario, &catalogue, &trace, &args(dir, &path)).expect("simulates");
    let mut v = serde_json::to_value(&r).expect("serialises");
    // Wall-clock timings differ between runs; everything else must not.
    for s in v["schedulers"].as_object_mut().expect("map").values_mut() {
        s["plan_time_ms"] = 0.into();
        s["simulation_wall_ms"] = 0.into();
    }
    v["lp_time_ms"] = 0.into();
    v
}

#[test]
fn report_has_the_issue_shape_and_plots() {
    let dir = tempfile::tempdir().expect("tempdir");
    let v = report_json(&small_scenario(), &small_trace(), dir.path());
    for name in ["switchyard", "cheapest", "fifo-burst"] {
        let s = &v["schedulers"][name];
        for key in [
            "jobs",
            "total_cost_usd",
            "deadline_met_fraction",
            "onprem_gpu_utilization",
            "burst_instances",
            "plan_time_ms",
        ] {
            assert!(s[key].is_number(), "{name}.{key} in {s}");
        }
        assert!(s["queue_delay_s"]["p50"].is_number() && s["queue_delay_s"]["p99"].is_number());
        assert_eq!(s["jobs"], 60);
    }
    assert!(v["lp_lower_bound_usd"].as_f64().is_some_and(|x| x > 0.0));
    assert_eq!(v["trace"]["multi_node_jobs_as_gangs"], 10);
    assert_eq!(v["trace"]["multi_node_jobs_folded"], 0);
    for plot in [
        "cost_over_time.svg",
        "queue_delay_cdf.svg",
        "spend_by_region.svg",
    ] {
        let svg = std::fs::read_to_string(dir.path().join(plot)).expect("plot written");
        assert!(svg.starts_with("<svg"), "{plot}");
    }
}

/// The gap to the bound splits into its causes exactly (issue 29): the parts add up to the gap
/// but for rounding, the bound's capacity share is not negative, and a run with cloud nodes
/// pays for some idle time.
#[test]
fn the_gap_to_the_bound_adds_up_by_cause() {
    let dir = tempfile::tempdir().expect("tempdir");
    let v = report_json(&small_scenario(), &small_trace(), dir.path());
    let bound = v["lp_lower_bound_usd"].as_f64().expect("a bound");
    for name in ["switchyard", "cheapest", "fifo-burst"] {
        let s = &v["schedulers"][name];
        let g = &s["gap"];
        let f = |k: &str| {
            g[k].as_f64()
                .unwrap_or_else(|| panic!("{name}.gap.{k} in {g}"))
        };
        let total = s["total_cost_usd"].as_f64().expect("a total");
        assert!((f("gap_usd") - (total - bound)).abs() < 1e-6, "{name}: {g}");
        let parts = f("cloud_idle_usd")
            + f("fragmentation_usd")
            + f("reruns_usd")
            + f("burst_owned_full_usd")
            + f("burst_owned_free_usd")
            + f("dearer_usd")
            + f("unfinished_usd")
            - f("capacity_usd");
        assert!(
            (f("gap_usd") - parts - f("rounding_usd")).abs() < 1e-6,
            "{name}: {g}"
        );
        // A micro-dollar per charge at most, over 60 jobs and their nodes.
        assert!(f("rounding_usd").abs() < 0.01, "{name}: {g}");
        assert!(f("capacity_usd") >= -1e-6, "{name}: {g}");
        assert!(f("fragmentation_usd") >= -0.01, "{name}: {g}");
        if s["burst_instances"].as_u64() > Some(0) {
            assert!(f("cloud_idle_usd") > 0.0, "{name}: {g}");
        }
    }
}

#[test]
fn same_seed_same_report() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = report_json(&small_scenario(), &small_trace(), dir.path());
    let b = report_json(&small_scenario(), &small_trace(), dir.path());
    assert_eq!(a, b);
    let mut other = small_scenario();
    other.seed = 7;
    let c = report_json(&other, &small_trace(), dir.path());
    assert_ne!(a["schedulers"], c["schedulers"]);
}

/// Found by the `trace_reader` fuzz target: an on-prem rate of -0.25 was accepted and the
/// replay billed negative costs.
#[test]
fn negative_prices_and_rates_are_rejected_naming_the_field() {
    let onprem = "[[onprem]]\nregion = \"onprem:dc\"\nname = \"v100\"\ngpu_model = \"V100\"\n\
                  gpu_memory_gb = 16\nnodes = 2\ngpus_per_node = 8\nusd_per_gpu_hour = -0.25\n";
    let cases = [
        (onprem.to_string(), "usd_per_gpu_hour"),
        (
            "[egress_usd_per_gb]\naws = -0.09\n".to_string(),
            "egress_usd_per_gb.aws",
        ),
        (
            "[spot.interruptions_per_hour]\ngcp = -1.0\n".to_string(),
            "interruptions_per_hour.gcp",
        ),
        (
            "[egress_usd_per_gb]\naws = nan\n".to_string(),
            "egress_usd_per_gb.aws",
        ),
        // Found by the same target as a hang: a negative idle TTL.
        ("idle_ttl_s = -600\n".to_string(), "idle_ttl_s"),
        ("tick_s = 0\n".to_string(), "tick_s"),
        (
            onprem.replace("gpus_per_node = 8", "gpus_per_node = 0"),
            "gpus_per_node",
        ),
        // GPU indexes run 0 to 63.
        (
            onprem.replace("gpus_per_node = 8", "gpus_per_node = 65"),
            "gpus_per_node must be at most 64",
        ),
    ];
    for (text, field) in cases {
        let err = Scenario::from_toml(&text).expect_err(&text);
        assert!(format!("{err:#}").contains(field), "{text}: {err:#}");
    }
    let ok = onprem.replace("-0.25", "0");
    Scenario::from_toml(&ok).expect("a free on-prem pool is fine");
}

#[test]
fn unknown_scenario_keys_are_rejected() {
    let err = Scenario::from_toml("seed = 1\nstart_dya = 3\n").expect_err("typo");
    assert!(format!("{err:#}").contains("start_dya"), "{err:#}");
    let err = Scenario::from_toml("[cloud]\nregion = [\"aws:us-east-1\"]\n").expect_err("typo");
    assert!(format!("{err:#}").contains("region"), "{err:#}");
    let ok = Scenario::from_toml("seed = 9\n[spot]\nshare = 0.25\n").expect("valid");
    assert_eq!((ok.seed, ok.spot.share, ok.start_day), (9, 0.25, None));
}

#[test]
fn an_empty_catalogue_after_filters_is_a_clear_error() {
    let s = Scenario::from_toml("[cloud]\nregions = [\"aws:mars-north-1\"]\n").expect("parses");
    let err = s
        .world(&Catalogue::bundled().expect("catalogue"))
        .expect_err("no pools");
    assert!(err.to_string().contains("no cloud offer is left"), "{err}");
}

#[test]
fn the_command_reads_gzip_and_names_bad_rows() {
    use std::io::Write;
    let dir = tempfile::tempdir().expect("tempdir");
    let gz = dir.path().join("t.csv.gz");
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(small_trace().as_bytes()).expect("gzip");
    std::fs::write(&gz, enc.finish().expect("gzip")).expect("write");
    let mut a = args(&dir.path().join("out"), &gz);
    a.scheduler = Which::Cheapest;
    let r = run(&a).expect("runs on gzip").expect("a batch report");
    assert_eq!(r.schedulers.len(), 1);
    assert!(dir.path().join("out/report.json").exists());

    let bad = dir.path().join("bad.csv");
    std::fs::write(
        &bad,
        format!("{HEADER}0,1,1,0,1,0,100,0,Pass\n1,1,1,0,1,zero,5,0,Pass\n"),
    )
    .expect("write");
    let mut a = args(&dir.path().join("out2"), &bad);
    let err = run(&a).expect_err("bad row");
    assert!(
        format!("{err:#}").contains("line 3, column `interval`"),
        "{err:#}"
    );
    a.skip_bad_rows = true;
    let r = run(&a).expect("skips").expect("a batch report");
    assert_eq!((r.trace.rows, r.trace.skipped_bad_rows), (1, 1));
}

/// Found writing the `trace_reader` fuzz target (tests/fuzz): rows with huge runtimes, GPU
/// counts and intervals, and a scenario with a huge slack, overflowed `Scenario::jobs` (a
/// panic in debug builds, wrapped deadlines in release); so did a huge `start_day`.
#[test]
fn extreme_trace_rows_and_scenarios_do_not_overflow() {
    let job = |line, gpus| super::trace::TraceJob {
        line,
        submit_s: i64::MAX,
        gpus,
        nodes: 1,
        runtime_s: i64::MAX,
        status: "Pass".into(),
        user: String::new(),
        name: None,
        requested_s: None,
    };
    let trace = super::trace::Trace {
        jobs: vec![job(2, 64), job(3, u32::MAX)],
        ..Default::default()
    };
    let mut s = Scenario::default();
    s.deadlines.min_slack_s = i64::MAX;
    s.start_day = Some(1e300);
    let jobs = s.jobs(&trace.jobs);
    for j in &jobs {
        assert_eq!(j.spec.resources.gpus, 8);
        assert_eq!(j.runtime_s, i64::MAX);
        assert!(j.spec.deadline.is_some_and(|d| d >= j.submit));
    }
    assert!(s.measure_from(&trace.jobs) > Timestamp::from_secs(scenario::EPOCH_S));
}

/// The report `simulate` writes and the summary line it prints per scheduler, on the small
/// trace, as a snapshot: the format, and the decisions behind the figures, change only with a
/// reviewed diff. Timings (which differ run to run) and the temporary trace path are masked.
#[test]
fn the_report_and_summary_are_the_snapshot() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut v = report_json(&small_scenario(), &small_trace(), dir.path());
    v["trace"]["file"] = "(trace)".into();
    insta::assert_json_snapshot!("simulate_report", v);
    let report: report::Report = serde_json::from_value(v).expect("reads back");
    let lines: Vec<String> = report
        .schedulers
        .iter()
        .map(|(name, r)| summary_line(name, r))
        .collect();
    insta::assert_snapshot!("simulate_summary", lines.join("\n"));
}

/// A service beside the batch trace: its day's replica-hours and cost are in the report, and
/// its on-prem replicas' peak leaves the batch work fewer on-prem nodes.
#[test]
fn services_beside_batch_work_cost_and_hold_onprem_nodes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut csv = String::from("TIMESTAMP,ContextTokens,GeneratedTokens\n");
    for i in 0..120 {
        csv.push_str(&format!(
            "2023-11-16 18:{:02}:{:02}.5,200,20\n",
            i / 60,
            i % 60
        ));
    }
    let svc_trace = dir.path().join("llm.csv");
    std::fs::write(&svc_trace, csv).expect("write");
    let text = format!(
        "start_day = 0.0\n[[onprem]]\nregion = \"onprem:philly\"\nname = \"v100-8x\"\n\
         gpu_model = \"V100\"\ngpu_memory_gb = 16\nnodes = 2\ngpus_per_node = 8\n\
         usd_per_gpu_hour = 0.25\n\n[[services]]\nname = \"chat\"\ntrace = {:?}\n\
         peak_rps = 0.05\ngpu_model = \"V100\"\npolicy = \"fixed\"\nfixed_replicas = 9\n\
         rps_target_per_replica = 1.0\nreplicas = {{ min = 1, max = 12 }}\n\
         scaling = {{ target_p95_latency_ms = 2000, max_concurrency_per_replica = 16, \
         window_s = 5 }}\n",
        svc_trace.display().to_string()
    );
    let scenario = Scenario::from_toml(&text).expect("parses");
    let with = report_json(&scenario, &small_trace(), dir.path());
    let s = &with["services"][0];
    assert_eq!(s["fixed_replicas"], 9);
    // Nine V100 replicas all day at the pool's $0.25 per GPU-hour, taking ⌈9 / 8⌉ nodes.
    assert_eq!(s["onprem_nodes_reserved"], 2);
    let total = &with["services_total"];
    assert!((total["replica_hours_per_day"].as_f64().expect("present") - 216.0).abs() < 1e-6);
    assert!((total["usd_per_day"].as_f64().expect("present") - 54.0).abs() < 1e-6);
    assert_eq!(total["onprem_nodes_reserved"], 2);
    for plot in ["services_chat_replicas.svg", "services_chat_p95.svg"] {
        let svg = std::fs::read_to_string(dir.path().join(plot)).expect("plot written");
        assert!(svg.starts_with("<svg"), "{plot}");
    }
    let names: Vec<&str> = s["policies"]
        .as_array()
        .expect("present")
        .iter()
        .map(|p| p["policy"].as_str().expect("present"))
        .collect();
    // The fourth: the RPS autoscaler with its target set for Switchyard's replica-hours (here
    // the bisection's ceiling, 8 × the target: at this trickle of traffic every target runs the
    // minimum, as many hours as Switchyard).
    assert_eq!(
        names,
        [
            "fixed (9)",
            "rps (1.00/replica)",
            "switchyard",
            "rps (8.00/replica, = hours)"
        ]
    );
    // Both on-prem nodes are the service's: the batch jobs run in the cloud, where the same
    // jobs without the service used on-prem.
    for name in ["switchyard", "cheapest", "fifo-burst"] {
        assert_eq!(
            with["schedulers"][name]["cost_usd"]["onprem"], 0.0,
            "{name}"
        );
    }
    let mut alone = scenario.clone();
    alone.services.clear();
    let without = report_json(&alone, &small_trace(), dir.path());
    assert!(without.get("services").is_none());
    let onprem = without["schedulers"]["switchyard"]["cost_usd"]["onprem"]
        .as_f64()
        .expect("present");
    assert!(onprem > 0.0);
}

/// A trace job's GPUs are packed onto as few nodes as hold them (the default), a gang when
/// that is more than one; `multi_node = "gang"` runs a multi-node job on the trace's `nodes`
/// nodes with `ceil(gpus / nodes)` GPUs each and its true runtime; `multi_node = "fold"` folds
/// it as before; a job no pool could hold as a gang is folded either way, and counted.
#[test]
fn multi_node_jobs_are_gangs_unless_folded() {
    let job = |line, gpus, nodes| super::trace::TraceJob {
        line,
        submit_s: 0,
        gpus,
        nodes,
        runtime_s: 1000,
        status: "Pass".into(),
        user: String::new(),
        name: None,
        requested_s: None,
    };
    // 16 GPUs on 2 nodes; 5 on 2 (3 per node); 32 on 2 (16 per node: more than any node);
    // 200 on 200 (more nodes than any pool: 128 on-prem, a cloud quota of 64); one node.
    let trace = [
        job(2, 16, 2),
        job(3, 5, 2),
        job(4, 32, 2),
        job(5, 200, 200),
        job(6, 4, 1),
    ];
    let shape = |j: &switchyard_core::sim::SimJob| {
        (j.spec.resources.nodes, j.spec.resources.gpus, j.runtime_s)
    };
    // The default packs: as few 8-GPU nodes as hold the GPUs, one node when they fit.
    let pack = Scenario::default();
    assert_eq!(pack.multi_node, scenario::MultiNode::Pack);
    let packed: Vec<_> = pack.jobs(&trace).iter().map(shape).collect();
    assert_eq!(
        packed,
        [
            (2, 8, 1000),
            (1, 5, 1000),
            (4, 8, 1000),
            (25, 8, 1000),
            (1, 4, 1000)
        ]
    );
    let c = pack.multi_node_counts(&trace);
    assert_eq!((c.gangs, c.folded), (3, 0));
    let s = Scenario::from_toml("multi_node = \"gang\"\n").expect("parses");
    let gang: Vec<_> = s.jobs(&trace).iter().map(shape).collect();
    assert_eq!(
        gang,
        [
            (2, 8, 1000),
            (2, 3, 1000),
            (1, 8, 4000),
            (1, 8, 25_000),
            (1, 4, 1000)
        ]
    );
    let c = s.multi_node_counts(&trace);
    assert_eq!((c.gangs, c.folded), (2, 2));
    let fold = Scenario::from_toml("multi_node = \"fold\"\n").expect("parses");
    let folded: Vec<_> = fold.jobs(&trace).iter().map(shape).collect();
    assert_eq!(
        folded,
        [
            (1, 8, 2000),
            (1, 5, 1000),
            (1, 8, 4000),
            (1, 8, 25_000),
            (1, 4, 1000)
        ]
    );
    let c = fold.multi_node_counts(&trace);
    assert_eq!((c.gangs, c.folded), (0, 4));
    let err = Scenario::from_toml("multi_node = \"split\"\n").expect_err("unknown");
    assert!(format!("{err:#}").contains("multi_node"), "{err:#}");
    // The small trace's 2-node jobs run, as gangs, under every scheduler.
    let dir = tempfile::tempdir().expect("tempdir");
    let mut small = small_scenario();
    let v = report_json(&small, &small_trace(), dir.path());
    small.multi_node = scenario::MultiNode::Fold;
    let f = report_json(&small, &small_trace(), dir.path());
    assert_eq!(f["trace"]["multi_node_jobs_folded"], 10);
    for name in ["switchyard", "cheapest", "fifo-burst"] {
        for r in [&v, &f] {
            assert_eq!(r["schedulers"][name]["jobs"], 60, "{name}");
            assert_eq!(r["schedulers"][name]["unfinished_jobs"], 0, "{name}");
        }
    }
}

/// Issue 28: `[waste]` replays the utilisation rule over the jobs as placed. All stuck: every
/// stop is right and frees dollars; all light (12–35 %) under a 50 % rule: every stop is wrong,
/// frees nothing, and what it cut is counted apart. Without the section, no waste report.
#[test]
fn the_waste_rule_replays_over_the_placed_jobs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let with = |toml: &str| {
        let mut s = Scenario::from_toml(toml).expect("the section parses");
        s.start_day = Some(0.0);
        s.onprem[0].nodes = 2;
        report_json(&s, &small_trace(), dir.path())
    };
    let stuck = with(
        "[waste]\nstuck_share = 1.0\nphased_share = 0.0\nlight_share = 0.0\n\
         rules = [{ min_gpu_utilization_pct = 20, window_s = 600 }]\n",
    );
    let w = &stuck["waste"];
    assert_eq!(w["placed_by"], "switchyard");
    assert_eq!(w["jobs"], 60);
    assert_eq!(w["jobs_by_kind"]["stuck"], 60);
    let r = &w["rules"][0];
    assert!(
        r["stuck_jobs_stopped"].as_u64().is_some_and(|n| n > 30),
        "{r}"
    );
    assert_eq!(r["jobs_wrongly_stopped"], 0, "{r}");
    assert_eq!(r["jobs_stopped"], r["stuck_jobs_stopped"]);
    let freed = r["freed_gpu_hours"].as_f64().expect("number");
    let stuck_h = w["stuck_gpu_hours"].as_f64().expect("number");
    assert!(freed > 0.0 && freed <= stuck_h, "{freed} of {stuck_h}");
    assert!(r["freed_usd"].as_f64().is_some_and(|d| d > 0.0), "{r}");
    assert_eq!(r["cut_gpu_hours"], 0.0);

    let light = with(
        "[waste]\nstuck_share = 0.0\nphased_share = 0.0\nlight_share = 1.0\n\
         rules = [{ min_gpu_utilization_pct = 50, window_s = 600 }]\n",
    );
    let r = &light["waste"]["rules"][0];
    assert_eq!(light["waste"]["stuck_gpu_hours"], 0.0);
    // Every job that ran longer than the window (all but 3 of the small trace's).
    assert_eq!(r["jobs_stopped"], 57, "{r}");
    assert_eq!(r["jobs_wrongly_stopped"], 57, "{r}");
    assert_eq!(r["wrongly_stopped_by_kind"]["light"], 57, "{r}");
    assert_eq!(r["freed_gpu_hours"], 0.0);
    assert!(r["cut_usd"].as_f64().is_some_and(|d| d > 0.0), "{r}");

    // Absent: no report, and the scenario serialises as before.
    let none = report_json(&small_scenario(), &small_trace(), dir.path());
    assert!(none.get("waste").is_none());
    assert!(none["scenario"].get("waste").is_none());
    // Out of range, naming the field.
    let e = Scenario::from_toml("[waste]\nlight_share = 2.0\n").expect_err("refused");
    assert!(format!("{e:#}").contains("waste.light_share"), "{e:#}");
    let e = Scenario::from_toml("[waste]\nthreshold = 10\n").expect_err("refused");
    assert!(format!("{e:#}").contains("threshold"), "{e:#}");
}

/// Issue 29: `marginal_usd_per_gpu_hour` is optional (scenarios without it parse as before and
/// take a fifth of the internal rate), sets the on-prem pool's cash cost, is refused when
/// negative, and draws a warning when above the chargeback rate.
#[test]
fn onprem_marginal_cost_is_optional_checked_and_warned_about() {
    let onprem = "[[onprem]]\nregion = \"onprem:dc\"\nname = \"v100\"\ngpu_model = \"V100\"\n\
                  gpu_memory_gb = 16\nnodes = 2\ngpus_per_node = 8\nusd_per_gpu_hour = 0.25\n";
    let catalogue =
        switchyard_providers::catalogue::Catalogue::bundled().expect("the bundled catalogue");
    let without = Scenario::from_toml(onprem).expect("an old scenario parses");
    assert_eq!(without.onprem[0].marginal_usd_per_gpu_hour, None);
    assert!(without.warnings().is_empty());
    let pool = &without.world(&catalogue).expect("world").pools[0].pool;
    assert_eq!(pool.marginal_per_hour, None);
    // A fifth of 8 × $0.25.
    assert_eq!(
        pool.cash_per_hour(switchyard_core::Market::OnDemand),
        switchyard_core::Money::from_micros(400_000)
    );
    let with = Scenario::from_toml(&format!("{onprem}marginal_usd_per_gpu_hour = 0.04\n"))
        .expect("the key parses");
    let pool = &with.world(&catalogue).expect("world").pools[0].pool;
    assert_eq!(
        pool.cash_per_hour(switchyard_core::Market::OnDemand),
        switchyard_core::Money::from_micros(320_000)
    );
    assert!(with.warnings().is_empty());
    let dear = Scenario::from_toml(&format!("{onprem}marginal_usd_per_gpu_hour = 0.5\n"))
        .expect("allowed");
    let warnings = dear.warnings();
    assert_eq!(warnings.len(), 1);
    assert!(
        warnings[0].contains("marginal_usd_per_gpu_hour") && warnings[0].contains("chargeback"),
        "{warnings:?}"
    );
    let err = Scenario::from_toml(&format!("{onprem}marginal_usd_per_gpu_hour = -1\n"))
        .expect_err("negative");
    assert!(
        format!("{err:#}").contains("marginal_usd_per_gpu_hour"),
        "{err:#}"
    );
}

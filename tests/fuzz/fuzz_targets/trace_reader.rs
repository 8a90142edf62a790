//! `switchyard simulate`'s inputs: a trace in each `--trace-format` (Philly, Blue Waters, Helios,
//! SWF; plain or gzip) and the scenario TOML. The first byte picks which; the rest is the file.
//!
//! Trace: read strictly and skipping bad rows; the jobs the scenario makes of it; a short
//! replay (`sim::run`, the cheapest scheduler) of the first rows on a small world.
//! Scenario: `Scenario::from_toml` (parse and validate); an accepted scenario writes back to
//! TOML that reads back the same, builds its world from the bundled catalogue, makes jobs of a
//! fixed trace, and replays them.
//!
//! Asserts: nothing panics or hangs; an error names its line and column; the strict reading,
//! when it succeeds, is the lenient one with nothing skipped; every job kept is well formed
//! (GPUs and nodes at least 1, runtime not negative, a requested time positive, submit times in
//! order, from 0 to ten years); the jobs the
//! simulator gets keep their GPU-hours and have a deadline after their submission.

#![no_main]

use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;
use switchyard_broker::simulate::scenario::{EPOCH_S, MultiNode, Scenario};
use switchyard_broker::simulate::trace::{
    MAX_SECONDS, Trace, TraceFormat, TraceJob, parse, parse_philly, trace_text,
};
use switchyard_core::sim::{self, Cheapest, SimConfig, SimJob, World};
use switchyard_core::{Timestamp, sim::SimPool};
use switchyard_providers::catalogue::Catalogue;

/// Rows replayed per input: enough to contend, few enough to stay fast.
const REPLAYED: usize = 6;

fn catalogue() -> &'static Catalogue {
    static CATALOGUE: OnceLock<Catalogue> = OnceLock::new();
    CATALOGUE.get_or_init(|| Catalogue::bundled().expect("the bundled catalogue loads"))
}

/// The default scenario with a small world: its on-prem pool and the A10G/L4 offers of one
/// region per provider.
fn small() -> &'static (Scenario, World) {
    static SMALL: OnceLock<(Scenario, World)> = OnceLock::new();
    SMALL.get_or_init(|| {
        let mut s = Scenario::default();
        s.onprem[0].nodes = 2;
        s.cloud.regions = vec!["aws:us-east-1".into(), "gcp:us-central1".into()];
        s.cloud.gpu_models = vec!["A10G".into(), "L4".into(), "V100".into()];
        s.cloud.node_limit = 2;
        let world = s.world(catalogue()).expect("the small world builds");
        (s, world)
    })
}

fn check_trace(format: TraceFormat, trace: &Trace) {
    let mut last_submit = 0;
    let mut last_line = 1;
    for j in &trace.jobs {
        assert!(j.gpus >= 1 && j.nodes >= 1 && j.runtime_s >= 0, "{j:?}");
        assert!(!j.status.is_empty() && j.status == j.status.trim());
        assert!(j.requested_s.is_none_or(|r| r > 0), "{j:?}");
        assert!(
            j.submit_s >= last_submit,
            "submit times go back at line {}",
            j.line
        );
        // Helios and SWF sort their rows by submission; the others keep file order. Not
        // strictly increasing: the csv reader counts `\n` only, so a file with `\r` line ends
        // has every row on line 1 (found by this target).
        if matches!(format, TraceFormat::Philly | TraceFormat::Bluewaters) {
            assert!(j.line >= last_line, "line {} after {last_line}", j.line);
        } else {
            assert!(j.submit_s <= MAX_SECONDS, "{j:?}");
        }
        last_submit = j.submit_s;
        last_line = j.line;
    }
    assert_eq!(trace.skipped == 0, trace.first_skip.is_none());
}

/// What `Scenario::jobs` promises of each job.
fn check_jobs(scenario: &Scenario, trace: &[TraceJob], jobs: &[SimJob]) {
    assert_eq!(trace.len(), jobs.len());
    let largest = scenario
        .onprem
        .iter()
        .map(|o| o.gpus_per_node)
        .max()
        .unwrap_or(8)
        .max(1);
    for (t, j) in trace.iter().zip(jobs) {
        let gpus = j.spec.resources.gpus;
        let nodes = j.spec.resources.nodes;
        assert!(gpus >= 1 && nodes >= 1);
        if nodes > 1 {
            // A gang: its GPUs spread over its nodes, its true runtime. `gang` keeps the
            // trace's nodes; `pack` (the default) takes as few of the largest on-prem nodes as
            // hold its GPUs; `fold` never makes one.
            let want = match scenario.multi_node {
                MultiNode::Gang => t.nodes,
                MultiNode::Pack => t.gpus.div_ceil(largest),
                MultiNode::Fold => panic!("a fold made a gang: {t:?}"),
            };
            assert_eq!(nodes, want, "{t:?}");
            assert_eq!(gpus, t.gpus.div_ceil(nodes), "{t:?}");
            assert!(gpus <= largest, "{t:?}");
            assert_eq!(j.runtime_s, t.runtime_s, "{t:?}");
        } else {
            // One node: the trace's GPUs, or folded onto the largest on-prem node.
            assert_eq!(gpus, t.gpus.min(largest), "{t:?}");
        }
        assert!(j.runtime_s >= t.runtime_s, "{t:?}: runtime {}", j.runtime_s);
        // GPU-hours are kept when a job is folded onto fewer GPUs (rounded up), or spread
        // over a gang's nodes.
        let before = i128::from(t.runtime_s) * i128::from(t.gpus);
        let after = i128::from(j.runtime_s) * i128::from(gpus) * i128::from(nodes);
        assert!(
            after >= before || j.runtime_s == i64::MAX,
            "{t:?}: {after} < {before}"
        );
        let deadline = j.spec.deadline.expect("every replayed job has a deadline");
        assert!(deadline >= j.submit, "{t:?}: deadline before submission");
        assert_eq!(j.spec.estimated_runtime_s, Some(j.runtime_s));
    }
}

fn replay(scenario: &Scenario, world: &World, jobs: &[SimJob]) {
    if jobs.is_empty() || !world.pools.iter().any(|p: &SimPool| p.pool.launchable) {
        return;
    }
    let cfg = SimConfig {
        idle_ttl_s: scenario.idle_ttl_s,
        min_billed_s: 60,
        checkpoint_interval_s: scenario.checkpoint_interval_s,
        tick_s: scenario.tick_s,
        seed: scenario.seed,
        measure_from: scenario.measure_from(&[]),
        reserve_free_below_one_in: scenario.reserve_free_below_one_in,
    };
    let result = sim::run(world, jobs, &cfg, &mut Cheapest);
    assert!(result.jobs.len() <= jobs.len());
    for cost in [
        result.cloud_busy_cost,
        result.cloud_idle_cost,
        result.onprem_cost,
        result.egress_cost,
    ] {
        assert!(cost.micros() >= 0, "negative cost {cost:?}");
    }
}

fn csv(format: TraceFormat, text: &str) {
    let lenient = parse(text, format, true);
    let strict = parse(text, format, false);
    match (&strict, &lenient) {
        (Ok(s), Ok(l)) => {
            assert_eq!(s, l, "nothing to skip, yet the readings differ");
            assert_eq!(s.skipped, 0);
        }
        (Err(e), Ok(l)) => {
            // (Its line may be 1 for a data row: see `check_trace`.)
            assert!(
                l.skipped >= 1,
                "strict failed ({e}) but nothing was skipped"
            );
        }
        (Err(s), Err(l)) => {
            assert_eq!(s, l);
            assert_eq!(l.line, 1, "only the header stops a lenient reading: {l}");
        }
        (Ok(_), Err(l)) => panic!("strict reading passed, lenient failed: {l}"),
    }
    for e in [&strict, &lenient]
        .into_iter()
        .filter_map(|r| r.as_ref().err())
    {
        assert!(e.line >= 1 && !e.column.is_empty() && !e.message.is_empty());
    }
    let Ok(trace) = lenient else { return };
    check_trace(format, &trace);
    let (scenario, world) = small();
    let rows = &trace.jobs[..trace.jobs.len().min(REPLAYED)];
    let jobs = scenario.jobs(rows);
    check_jobs(scenario, rows, &jobs);
    replay(scenario, world, &jobs);
}

fn scenario(text: &str) {
    let Ok(s) = Scenario::from_toml(text) else {
        return;
    };
    let written = toml::to_string(&s).expect("a scenario writes as TOML");
    let again = Scenario::from_toml(&written).expect("a written scenario reads back");
    assert_eq!(
        toml::to_string(&again).expect("writes again"),
        written,
        "the scenario changed on its way through TOML"
    );
    serde_json::to_value(&s).expect("the report embeds the scenario");
    let _ = s.measure_from(&[]);
    let Ok(world) = s.world(catalogue()) else {
        return;
    };
    assert!(world.pools.iter().any(|p| p.pool.launchable));
    let trace = parse_philly(
        "u_id,user,gpu_num,cpu_num,node_num,interval,run_time,wall_time,new_status\n\
         0,1,1,0,1,0,1389,0,Killed\n1,2,8,0,4,3951,14405,0,Failed\n2,3,16,0,2,0,663,0,Pass\n",
        false,
    )
    .expect("the fixed trace parses");
    let jobs = s.jobs(&trace.jobs);
    check_jobs(&s, &trace.jobs, &jobs);
    assert!(
        jobs.iter()
            .all(|j| j.submit >= Timestamp::from_secs(EPOCH_S))
    );
    // Replaying every catalogue pool is slow; the first few pools of the world are enough.
    let mut world = world;
    let launchable = world.pools.iter().position(|p| p.pool.launchable);
    if let Some(i) = launchable {
        let keep = world.pools.swap_remove(i);
        world.pools.truncate(3);
        world.pools.push(keep);
    }
    replay(&s, &world, &jobs);
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, body)) = data.split_first() else {
        return;
    };
    let format = TraceFormat::ALL[usize::from(which / 3) % TraceFormat::ALL.len()];
    match which % 3 {
        0 => {
            if let Ok(text) = std::str::from_utf8(body) {
                csv(format, text);
            }
        }
        1 => {
            if let Ok(text) = trace_text(body.to_vec()) {
                csv(format, &text);
            }
        }
        _ => {
            if let Ok(text) = std::str::from_utf8(body) {
                scenario(text);
            }
        }
    }
});

//! `plan` over synthetic fleets (see `support/fleet.rs`): 1,000 queued jobs / 100 pools /
//! 1,000 nodes, and 10,000 / 1,000 / 10,000 (the target: under 50 ms), as the broker runs it
//! (`plan_shared`), with a snapshot copy (`plan`), decisions only, and with every candidate
//! list recorded (what the first explanation asked of a plan costs); and [`Planner::place`],
//! one new job into a warm 1,000-pool / 10,000-node state (the target: under 20 µs at p99).
//! Criterion gives the mean per placement; the p50/p99 over 10,000 single placements are
//! measured directly and printed, since criterion reports no percentiles. Plans keep each job's
//! candidates compact; `explanation/…` is what making one job's explanation public costs.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use std::hint::black_box;
use std::time::Instant;
use switchyard_core::placement::{self, Detail};
use switchyard_core::*;

#[path = "support/fleet.rs"]
mod fleet;

fn bench_plan(c: &mut Criterion) {
    let mut group = c.benchmark_group("plan");
    group.sample_size(10);
    for (jobs, pools, nodes) in [(1_000, 100, 1_000), (10_000, 1_000, 10_000)] {
        let snapshot = fleet::fleet(42, jobs, pools, nodes);
        group.throughput(Throughput::Elements(jobs as u64));
        let name = format!("{jobs}j_{pools}p_{nodes}n");
        // What the broker's scheduler runs: `plan_shared` takes the round's snapshot (no copy)
        // and keeps it to explain the plan on demand.
        let shared = std::sync::Arc::new(snapshot.clone());
        group.bench_with_input(BenchmarkId::from_parameter(&name), &shared, |b, s| {
            b.iter(|| plan_shared(black_box(s.clone()), fleet::NOW))
        });
        // `plan(&snapshot)`: the same, with a copy of the snapshot for the plan to keep.
        group.bench_with_input(BenchmarkId::new("copying", &name), &snapshot, |b, s| {
            b.iter(|| plan(black_box(s), fleet::NOW))
        });
        // The same decisions without candidate lists (what the simulator asks for).
        group.bench_with_input(
            BenchmarkId::new("outcomes_only", &name),
            &snapshot,
            |b, s| b.iter(|| placement::plan_with(black_box(s), fleet::NOW, Detail::Outcomes)),
        );
        // Every job's candidates recorded as the round goes (what `plan` did before it
        // explained on demand): about what the first `Plan::explanation` call costs.
        group.bench_with_input(BenchmarkId::new("recorded", &name), &snapshot, |b, s| {
            b.iter(|| placement::plan_with(black_box(s), fleet::NOW, Detail::Full))
        });
    }
    group.finish();

    // What asking for one job's explanation costs once the plan has worked its candidate
    // lists out (the broker's `GET /api/v1/jobs/{id}/placement`): its candidates made public,
    // ids cloned.
    let snapshot = fleet::fleet(42, 10_000, 1_000, 10_000);
    let made = plan(&snapshot, fleet::NOW);
    let _ = made.explanation(&snapshot.queued[0].id);
    // What the broker does after committing a round: the explanations of the jobs it placed,
    // worked out by a replay that records only theirs.
    let fresh = plan(&snapshot, fleet::NOW);
    let placed: Vec<JobId> = fresh.assignments.iter().map(|a| a.job).collect();
    eprintln!("explanations_of: {} placed jobs of 10,000", placed.len());
    c.bench_function("explanations_of/placed_of_10000j_1000p_10000n", |b| {
        b.iter(|| fresh.explanations_of(black_box(&placed)))
    });
    let mut jobs = snapshot.queued.iter().cycle();
    c.bench_function("explanation/one_job_of_10000j_1000p_10000n", |b| {
        b.iter(|| {
            let job = jobs.next().expect("cycle");
            made.explanation(black_box(&job.id))
        })
    });
}

fn bench_place(c: &mut Criterion) {
    // The warm state: 1,000 pools and 10,000 nodes with their running work; the new jobs come
    // from a second fleet of the same shape.
    let warm = fleet::fleet(42, 0, 1_000, 10_000);
    let arrivals = fleet::fleet(7, 10_000, 1_000, 0).queued;
    let mut group = c.benchmark_group("place");
    let mut planner = Planner::new(&warm, fleet::NOW);
    let mut next = arrivals.iter().cycle();
    group.bench_function("one_job_warm_1000p_10000n", |b| {
        b.iter(|| {
            let job = next.next().expect("cycle");
            black_box(planner.place(job));
        })
    });
    group.finish();

    let mut planner = Planner::new(&warm, fleet::NOW);
    let mut times: Vec<u128> = arrivals
        .iter()
        .map(|job| {
            let t = Instant::now();
            black_box(planner.place(job));
            t.elapsed().as_nanos()
        })
        .collect();
    times.sort_unstable();
    let at = |q: usize| times[(times.len() * q / 100).min(times.len() - 1)] as f64 / 1000.0;
    eprintln!(
        "place: {} single placements into a warm 1,000-pool / 10,000-node state: p50 {:.1} µs, p99 {:.1} µs, max {:.1} µs",
        times.len(),
        at(50),
        at(99),
        at(100)
    );
}

criterion_group!(benches, bench_plan, bench_place);
criterion_main!(benches);

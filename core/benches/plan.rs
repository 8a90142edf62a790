//! `plan` over synthetic fleets (see `support/fleet.rs`): 1,000 queued jobs / 100 pools /
//! 1,000 nodes, and 10,000 / 1,000 / 10,000 (the scale a later issue must plan in under 50 ms).

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use std::hint::black_box;
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
        group.bench_with_input(BenchmarkId::from_parameter(name), &snapshot, |b, s| {
            b.iter(|| plan(black_box(s), fleet::NOW))
        });
    }
    group.finish();
}

criterion_group!(benches, bench_plan);
criterion_main!(benches);

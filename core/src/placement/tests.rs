//! Table-driven tests of `plan`: a small world builder, `check(world, expect)` comparing a
//! one-line rendering of every job's outcome, and `explain(world)` for the candidate lists.
//!
//! The base world has three regions: `onprem:dc1` (no egress, 5 ms, 100 Gbit/s in), `aws:use1`
//! ($0.09/GB out, 20 ms, 10 Gbit/s in) and `gcp:euw4` ($0.12/GB out, 120 ms, ingress unstated).
//! Jobs default to 1 GPU for one hour, normal priority, no deadline, on-demand only.

use super::*;
use uuid::Uuid;

const NOW: Timestamp = Timestamp::from_secs(1_800_000_000);

fn usd(dollars: f64) -> Money {
    Money::from_micros((dollars * 1e6).round() as i64)
}

struct W {
    snap: Snapshot,
}

fn region(id: &str, egress: f64, latency_ms: u32, ingress_gbps: u32) -> Region {
    let (provider, code) = id.split_once(':').unwrap();
    Region {
        id: RegionId::new(id),
        provider: provider.into(),
        code: code.into(),
        latitude: None,
        longitude: None,
        egress_per_gb: usd(egress),
        latency_ms,
        ingress_gbps,
    }
}

fn w() -> W {
    W {
        snap: Snapshot {
            regions: vec![
                region("onprem:dc1", 0.0, 5, 100),
                region("aws:use1", 0.09, 20, 10),
                region("gcp:euw4", 0.12, 120, 0),
            ],
            burst_enabled: true,
            ..Snapshot::default()
        },
    }
}

impl W {
    fn pool(mut self, id: &str, model: &str, gpus: u32, per_hour: f64, spot: Option<f64>) -> W {
        let (region, _) = id.split_once('/').unwrap();
        let launchable = !region.starts_with("onprem");
        self.snap.pools.push(Pool {
            id: PoolId::new(id),
            region: RegionId::new(region),
            provider: region.split(':').next().unwrap().into(),
            instance_type: id.split('/').nth(1).unwrap().into(),
            gpu_model: model.into(),
            gpus_per_node: gpus,
            gpu_memory_gb: if model == "L4" { 24 } else { 80 },
            vcpus: 96,
            memory_gb: 1024,
            on_demand_per_hour: usd(per_hour),
            spot_per_hour: spot.map(usd),
            node_limit: if launchable { 10 } else { 100 },
            launchable,
            boot_time_s: if launchable { 300 } else { 0 },
            price_updated_at: NOW,
            recent_capacity_failures: 0,
        });
        self
    }
    /// An 8×H100 on-prem pool at `per_hour` for the node.
    fn onprem(self, name: &str, per_hour: f64) -> W {
        self.pool(&format!("onprem:dc1/{name}"), "H100", 8, per_hour, None)
    }
    fn limit(mut self, pool: &str, n: u32) -> W {
        self.pool_mut(pool).node_limit = n;
        self
    }
    fn pool_mut(&mut self, pool: &str) -> &mut Pool {
        self.snap.pools.iter_mut().find(|p| p.id.0 == pool).unwrap()
    }
    fn no_burst(mut self) -> W {
        self.snap.burst_enabled = false;
        self
    }
    fn node(mut self, pool: &str, id: &str, free: u32) -> W {
        let total = self.pool_mut(pool).gpus_per_node;
        self.snap.nodes.push(Node {
            id: NodeId::new(id),
            pool: PoolId::new(pool),
            gpus_total: total,
            gpus_free: free,
            healthy: true,
            draining: false,
            last_heartbeat: NOW,
        });
        self
    }
    fn node_mut(&mut self, id: &str) -> &mut Node {
        self.snap.nodes.iter_mut().find(|n| n.id.0 == id).unwrap()
    }
    fn sick(mut self, id: &str) -> W {
        self.node_mut(id).healthy = false;
        self
    }
    fn draining(mut self, id: &str) -> W {
        self.node_mut(id).draining = true;
        self
    }
    /// Work holding `gpus` on `node` until `ends_in_s` from now (negative: overdue).
    fn busy(self, node: &str, gpus: u32, ends_in_s: i64) -> W {
        self.attempt(node, gpus, NOW.plus_secs(ends_in_s))
    }
    /// A service holding `gpus` on `node`: never ends.
    fn service_on(self, node: &str, gpus: u32) -> W {
        self.attempt(node, gpus, Timestamp::MAX)
    }
    fn attempt(mut self, node: &str, gpus: u32, expected_end: Timestamp) -> W {
        let n = self.snap.running.len() as u128 + 1000;
        self.snap.running.push(RunningAttempt {
            job: JobId(Uuid::from_u128(n)),
            attempt: AttemptId(Uuid::from_u128(n)),
            node: NodeId::new(node),
            gpus,
            priority: Priority::Normal,
            started_at: NOW,
            expected_end,
        });
        self
    }
    /// A new job `j<n>` asking for `gpus` for one hour; the methods below shape the last one.
    fn job(mut self, gpus: u32) -> W {
        let n = self.snap.queued.len() as u128 + 1;
        self.snap.queued.push(QueuedJob {
            id: JobId(Uuid::from_u128(n)),
            spec: JobSpec {
                name: format!("j{n}"),
                team: "ml".into(),
                project: None,
                command: vec!["true".into()],
                env: BTreeMap::new(),
                resources: Resources {
                    gpus,
                    gpu_models: vec![],
                    min_gpu_memory_gb: 0,
                    cpus: 0,
                    memory_gb: 0,
                    nodes: 1,
                },
                estimated_runtime_s: Some(3600),
                deadline: None,
                priority: Priority::Normal,
                spot: SpotRule::Never,
                max_price_per_hour: None,
                regions: vec![],
                data: None,
                kind: JobKind::Batch,
                max_latency_ms: None,
            },
            // Later jobs were submitted later.
            submitted_at: NOW.plus_secs(n as i64 - 1000),
        });
        self
    }
    fn submitted_ago(mut self, s: i64) -> W {
        self.snap.queued.last_mut().unwrap().submitted_at = NOW.plus_secs(-s);
        self
    }
    fn spec(&mut self) -> &mut JobSpec {
        &mut self.snap.queued.last_mut().unwrap().spec
    }
    fn with(mut self, f: impl FnOnce(&mut JobSpec)) -> W {
        f(self.spec());
        self
    }
    fn deadline_in(self, s: i64) -> W {
        self.with(|j| j.deadline = Some(NOW.plus_secs(s)))
    }
    fn spot(self, rule: SpotRule) -> W {
        self.with(|j| j.spot = rule)
    }
    fn models(self, models: &[&str]) -> W {
        self.with(|j| j.resources.gpu_models = models.iter().map(|m| m.to_string()).collect())
    }
    fn regions(self, regions: &[&str]) -> W {
        self.with(|j| j.regions = regions.iter().map(|r| RegionId::new(*r)).collect())
    }
    fn max_price(self, dollars: f64) -> W {
        self.with(|j| j.max_price_per_hour = Some(usd(dollars)))
    }
    fn service(self, max_latency_ms: u32) -> W {
        self.with(|j| {
            j.kind = JobKind::Service;
            j.max_latency_ms = Some(max_latency_ms);
        })
    }
    fn data(self, region: &str, size_gb: u32) -> W {
        self.with(|j| {
            j.data = Some(DataLocation {
                region: RegionId::new(region),
                size_gb,
            })
        })
    }
    fn priority(self, p: Priority) -> W {
        self.with(|j| j.priority = p)
    }
}

fn outcome(e: &Explanation) -> String {
    match &e.outcome {
        Outcome::Assigned { node, .. } => {
            let a = e.candidates.first().unwrap();
            format!("assign {node} {}", market(a.market))
        }
        Outcome::Wait {
            pool,
            expected_start,
        } => format!("wait {pool} +{}s", expected_start.secs_since(NOW)),
        Outcome::Launch { pool, market: m } => format!("launch {pool} {}", market(*m)),
        Outcome::Hold { reason } => format!("hold: {reason}"),
    }
}

fn market(m: Market) -> &'static str {
    match m {
        Market::OnDemand => "on_demand",
        Market::Spot => "spot",
    }
}

/// Every job's outcome in job order, `jN: ` prefixed when there are several.
fn render(world: &W) -> String {
    let plan = plan(&world.snap, NOW);
    let many = plan.explanations.len() > 1;
    let names: BTreeMap<JobId, &str> = world
        .snap
        .queued
        .iter()
        .map(|j| (j.id, j.spec.name.as_str()))
        .collect();
    plan.explanations
        .values()
        .map(|e| match many {
            true => format!("{}: {}", names[&e.job], outcome(e)),
            false => outcome(e),
        })
        .collect::<Vec<_>>()
        .join(" | ")
}

#[track_caller]
fn check(world: W, expect: &str) {
    assert_eq!(render(&world), expect);
}

/// The first job's candidates, one line each: pool, node, kind, market, cost, verdict.
fn explain(world: W) -> Vec<String> {
    let plan = plan(&world.snap, NOW);
    let e = plan.explanations.values().next().unwrap();
    e.candidates
        .iter()
        .map(|c| {
            let node = c.node.as_ref().map_or("-", |n| n.as_str());
            let verdict = match &c.rejected {
                None => "WIN".to_string(),
                Some(Rejection::Outscored) => "outscored".to_string(),
                Some(Rejection::MissesDeadline { .. }) => "misses_deadline".to_string(),
                Some(r) => format!("{r:?}"),
            };
            let kind = format!("{:?}", c.kind);
            format!(
                "{} {node} {kind} {} {} {verdict}",
                c.pool,
                market(c.market),
                c.cost
            )
        })
        .collect()
}

// --- the tables ------------------------------------------------------------------------------

const P5: &str = "aws:use1/p5";
const DGX: &str = "onprem:dc1/dgx";

/// On-prem 8×H100 at $16/h ($2/GPU-h) with node `d1`; AWS 8×H100 at $80/h ($10/GPU-h), spot
/// $32/h, launchable, node `a1`.
fn two_pools(dgx_free: u32, p5_free: u32) -> W {
    w().onprem("dgx", 16.0)
        .node(DGX, "d1", dgx_free)
        .pool(P5, "H100", 8, 80.0, Some(32.0))
        .node(P5, "a1", p5_free)
}

#[test]
fn cheapest_feasible_wins() {
    check(two_pools(8, 8).job(1), "assign d1 on_demand");
    check(two_pools(8, 8).job(8), "assign d1 on_demand");
    check(
        two_pools(0, 8).job(1).deadline_in(7200),
        "assign a1 on_demand",
    );
    check(
        w().onprem("dgx", 160.0)
            .node(DGX, "d1", 8)
            .pool(P5, "H100", 8, 80.0, None)
            .node(P5, "a1", 8)
            .job(1),
        "assign a1 on_demand",
    );
    check(two_pools(2, 8).job(4), "assign a1 on_demand");
    check(
        w().pool(P5, "H100", 8, 80.0, None).job(1),
        "launch aws:use1/p5 on_demand",
    );
}

#[test]
fn waiting_for_cheaper_capacity_beats_bursting_when_the_deadline_allows() {
    let busy = || two_pools(0, 0).busy("d1", 8, 3600).busy("a1", 8, 36_000);
    check(busy().job(1), "wait onprem:dc1/dgx +3600s");
    check(
        busy().job(1).deadline_in(3 * 3600),
        "wait onprem:dc1/dgx +3600s",
    );
    check(
        busy().job(8).deadline_in(2 * 3600 + 180),
        "wait onprem:dc1/dgx +3600s",
    );
    // Waiting would finish at +2h, past the deadline: burst (boot 5 min).
    check(
        busy().job(1).deadline_in(5400),
        "launch aws:use1/p5 on_demand",
    );
    check(
        busy().job(1).deadline_in(2 * 3600),
        "launch aws:use1/p5 on_demand",
    );
    // Nothing can make it: the cheapest late option.
    check(busy().job(1).deadline_in(600), "wait onprem:dc1/dgx +3600s");
    // Overdue work is expected to end shortly, not never.
    check(
        two_pools(0, 0).busy("d1", 8, -50).job(1),
        "wait onprem:dc1/dgx +60s",
    );
    // A service never frees its GPUs.
    check(
        two_pools(0, 0)
            .service_on("d1", 8)
            .service_on("a1", 8)
            .job(1),
        "launch aws:use1/p5 on_demand",
    );
    // Waiting for enough GPUs to add up.
    check(
        two_pools(2, 0)
            .busy("d1", 2, 600)
            .busy("d1", 4, 1200)
            .job(8),
        "wait onprem:dc1/dgx +1200s",
    );
}

#[test]
fn burst_disabled_waits_or_holds() {
    let busy = || {
        two_pools(0, 0)
            .busy("d1", 8, 3600)
            .service_on("a1", 8)
            .no_burst()
    };
    check(
        busy().job(1).deadline_in(5400),
        "wait onprem:dc1/dgx +3600s",
    );
    check(
        w().onprem("dgx", 16.0)
            .node(DGX, "d1", 0)
            .service_on("d1", 8)
            .pool(P5, "H100", 8, 80.0, None)
            .no_burst()
            .job(1),
        "hold: no pool can take this job now: needs a new node but bursting is disabled (1 pool); no healthy node has or will free enough GPUs (1 pool)",
    );
    check(
        w().pool(P5, "H100", 8, 80.0, None).no_burst().job(1),
        "hold: no pool can take this job now: needs a new node but bursting is disabled (1 pool)",
    );
}

#[test]
fn quota_limits_launches() {
    let one = || w().pool(P5, "H100", 8, 80.0, None).limit(P5, 1);
    check(one().job(8), "launch aws:use1/p5 on_demand");
    check(
        one().job(8).job(8),
        "j1: launch aws:use1/p5 on_demand | j2: hold: no pool can take this job now: needs a new node but its node quota is reached (1 pool)",
    );
    check(
        one().node(P5, "a1", 0).service_on("a1", 8).job(1),
        "hold: no pool can take this job now: needs a new node but its node quota is reached (1 pool); no healthy node has or will free enough GPUs (1 pool)",
    );
    // Unhealthy nodes still count against the quota.
    check(
        one().node(P5, "a1", 8).sick("a1").job(1),
        "hold: no pool can take this job now: needs a new node but its node quota is reached (1 pool); no healthy node has or will free enough GPUs (1 pool)",
    );
    check(
        one().limit(P5, 2).node(P5, "a1", 8).sick("a1").job(1),
        "launch aws:use1/p5 on_demand",
    );
}

#[test]
fn max_price_filters_pools() {
    check(two_pools(8, 8).job(1).max_price(5.0), "assign d1 on_demand");
    check(
        two_pools(0, 8).job(1).max_price(5.0),
        "hold: no pool can take this job now: no healthy node has or will free enough GPUs (1 pool); costs more than the job's maximum of $5.000000/h (1 pool)",
    );
    check(
        two_pools(0, 8).job(1).max_price(10.0),
        "assign a1 on_demand",
    );
    check(
        two_pools(0, 8).job(2).max_price(10.0),
        "hold: no pool can take this job now: no healthy node has or will free enough GPUs (1 pool); costs more than the job's maximum of $10.000000/h (1 pool)",
    );
    // Spot brings the price under the ceiling ($4/GPU-h).
    check(
        two_pools(0, 8)
            .job(1)
            .max_price(5.0)
            .spot(SpotRule::Allowed),
        "assign a1 spot",
    );
    check(
        two_pools(0, 0)
            .busy("d1", 8, 3600)
            .job(1)
            .max_price(5.0)
            .deadline_in(1800),
        "wait onprem:dc1/dgx +3600s",
    );
}

#[test]
fn gpu_model_and_memory_filter_pools() {
    let mixed = || {
        two_pools(8, 8)
            .pool("aws:use1/g6", "L4", 8, 8.0, None)
            .node("aws:use1/g6", "l1", 8)
    };
    check(mixed().job(1), "assign l1 on_demand");
    check(mixed().job(1).models(&["H100"]), "assign d1 on_demand");
    check(mixed().job(1).models(&["h100"]), "assign d1 on_demand");
    check(
        mixed().job(1).models(&["L4", "A10G"]),
        "assign l1 on_demand",
    );
    check(
        mixed().job(1).with(|j| j.resources.min_gpu_memory_gb = 40),
        "assign d1 on_demand",
    );
    check(
        mixed().job(1).models(&["B200"]),
        "hold: no pool can take this job now: GPU model not among the job's gpu_models (3 pools)",
    );
    check(
        mixed().job(16),
        "hold: no pool can take this job now: fewer than 16 GPUs per node (3 pools)",
    );
}

#[test]
fn region_allow_list() {
    let three = || {
        two_pools(8, 8)
            .pool("gcp:euw4/a3", "H100", 8, 88.0, None)
            .node("gcp:euw4/a3", "g1", 8)
    };
    check(three().job(1), "assign d1 on_demand");
    check(three().job(1).regions(&["gcp:euw4"]), "assign g1 on_demand");
    check(
        three().job(1).regions(&["aws:use1", "gcp:euw4"]),
        "assign a1 on_demand",
    );
    check(
        three().job(1).regions(&["azure:westeu"]),
        "hold: no pool can take this job now: region not among the job's regions (3 pools)",
    );
}

#[test]
fn latency_bounds_services_only() {
    let far = || {
        w().pool("gcp:euw4/a3", "H100", 8, 8.0, None)
            .node("gcp:euw4/a3", "g1", 8)
            .pool(P5, "H100", 8, 80.0, None)
            .node(P5, "a1", 8)
    };
    check(far().job(1), "assign g1 on_demand");
    check(far().job(1).service(50), "assign a1 on_demand");
    check(far().job(1).service(120), "assign g1 on_demand");
    check(
        far().job(1).with(|j| j.max_latency_ms = Some(50)),
        "assign g1 on_demand",
    );
    check(
        far().job(1).service(10),
        "hold: no pool can take this job now: region latency above the service's maximum of 10 ms (2 pools)",
    );
}

#[test]
fn data_gravity_moves_the_winner() {
    // On-prem $2/GPU-h vs AWS $10/GPU-h; 500 GB in AWS costs $45 to move out.
    check(two_pools(8, 8).job(1), "assign d1 on_demand");
    check(
        two_pools(8, 8).job(1).data("aws:use1", 500),
        "assign a1 on_demand",
    );
    check(
        two_pools(8, 8).job(1).data("aws:use1", 50),
        "assign d1 on_demand",
    );
    check(
        two_pools(8, 8).job(1).data("onprem:dc1", 500),
        "assign d1 on_demand",
    );
    // Data in a region the snapshot does not know: no egress price, so no cost to move.
    check(
        two_pools(8, 8).job(1).data("azure:westeu", 500),
        "assign d1 on_demand",
    );
}

#[test]
fn data_gravity_prices_egress_and_delays_start() {
    let p = plan_of(two_pools(8, 0).job(1).data("aws:use1", 500));
    let a = &p.assignments[0];
    // $2 compute + 500 GB × $0.09 egress; 4,000 Gbit at 100 Gbit/s into dc1 = 40 s.
    assert_eq!(a.estimated_cost, usd(47.0));
    assert_eq!(a.estimated_finish, NOW.plus_secs(3640));
    // gcp:euw4 states no ingress: 10 Gbit/s assumed.
    let w = w()
        .pool("gcp:euw4/a3", "H100", 8, 8.0, None)
        .node("gcp:euw4/a3", "g1", 8);
    let p = plan_of(w.job(1).data("aws:use1", 100));
    assert_eq!(p.assignments[0].estimated_finish, NOW.plus_secs(3600 + 80));
}

#[test]
fn ties_break_by_id_and_best_fit() {
    let twins = || {
        w().onprem("b", 16.0)
            .node("onprem:dc1/b", "n1", 8)
            .onprem("a", 16.0)
            .node("onprem:dc1/a", "n2", 8)
    };
    check(twins().job(1), "assign n2 on_demand");
    let pool = || w().onprem("dgx", 16.0);
    check(
        pool().node(DGX, "n2", 8).node(DGX, "n1", 8).job(1),
        "assign n1 on_demand",
    );
    check(
        pool().node(DGX, "n1", 8).node(DGX, "n2", 2).job(2),
        "assign n2 on_demand",
    );
    check(
        pool().node(DGX, "n1", 8).node(DGX, "n2", 1).job(2),
        "assign n1 on_demand",
    );
    check(
        pool()
            .node(DGX, "n1", 3)
            .node(DGX, "n2", 2)
            .node(DGX, "n3", 2)
            .job(2),
        "assign n2 on_demand",
    );
}

#[test]
fn spot_only_when_allowed_and_cheaper() {
    let cloud = |spot| w().pool(P5, "H100", 8, 80.0, spot).node(P5, "a1", 8);
    check(cloud(Some(32.0)).job(1), "assign a1 on_demand");
    check(
        cloud(Some(32.0)).job(1).spot(SpotRule::Allowed),
        "assign a1 spot",
    );
    check(
        cloud(Some(32.0)).job(1).spot(SpotRule::Preferred),
        "assign a1 spot",
    );
    check(
        cloud(Some(90.0)).job(1).spot(SpotRule::Allowed),
        "assign a1 on_demand",
    );
    check(
        cloud(None).job(1).spot(SpotRule::Allowed),
        "assign a1 on_demand",
    );
    check(
        w().pool(P5, "H100", 8, 80.0, Some(32.0))
            .job(8)
            .spot(SpotRule::Allowed),
        "launch aws:use1/p5 spot",
    );
    // On-prem charges its internal rate whatever spot figure it carries.
    check(
        w().pool(DGX, "H100", 8, 16.0, Some(8.0))
            .node(DGX, "d1", 8)
            .job(1)
            .spot(SpotRule::Allowed),
        "assign d1 on_demand",
    );
}

#[test]
fn capacity_is_shared_within_a_round() {
    let one = || w().onprem("dgx", 16.0).node(DGX, "d1", 8);
    check(
        one().job(4).job(4),
        "j1: assign d1 on_demand | j2: assign d1 on_demand",
    );
    // j2 waits for j1, which ends in an hour.
    check(
        one().job(8).job(8),
        "j1: assign d1 on_demand | j2: wait onprem:dc1/dgx +3600s",
    );
    check(
        one().job(6).job(4).job(2),
        "j1: assign d1 on_demand | j2: wait onprem:dc1/dgx +3600s | j3: assign d1 on_demand",
    );
    // A launched node is for its job only.
    check(
        w().pool(P5, "H100", 8, 80.0, None).job(1).job(1),
        "j1: launch aws:use1/p5 on_demand | j2: launch aws:use1/p5 on_demand",
    );
}

#[test]
fn queue_order_decides_who_gets_scarce_capacity() {
    let one = || w().onprem("dgx", 16.0).node(DGX, "d1", 8);
    check(
        one().job(8).job(8).priority(Priority::Critical),
        "j1: wait onprem:dc1/dgx +3600s | j2: assign d1 on_demand",
    );
    check(
        one().job(8).job(8).deadline_in(36_000),
        "j1: wait onprem:dc1/dgx +3600s | j2: assign d1 on_demand",
    );
    check(
        one().job(8).deadline_in(72_000).job(8).deadline_in(36_000),
        "j1: wait onprem:dc1/dgx +3600s | j2: assign d1 on_demand",
    );
    // Earlier submission first: j2 was submitted before j1.
    check(
        one().job(8).job(8).submitted_ago(5000),
        "j1: wait onprem:dc1/dgx +3600s | j2: assign d1 on_demand",
    );
    // Same everything: the lower id first.
    check(
        one().job(8).job(8).submitted_ago(999),
        "j1: assign d1 on_demand | j2: wait onprem:dc1/dgx +3600s",
    );
}

#[test]
fn unusable_nodes_get_nothing() {
    let pool = || w().onprem("dgx", 16.0).node(DGX, "d1", 8);
    check(
        pool().sick("d1").job(1),
        "hold: no pool can take this job now: no healthy node has or will free enough GPUs (1 pool)",
    );
    check(
        pool().draining("d1").job(1),
        "hold: no pool can take this job now: no healthy node has or will free enough GPUs (1 pool)",
    );
    check(
        pool().node(DGX, "d0", 8).sick("d0").job(1),
        "assign d1 on_demand",
    );
    check(
        pool().sick("d1").busy("d1", 8, 60).job(1),
        "hold: no pool can take this job now: no healthy node has or will free enough GPUs (1 pool)",
    );
    check(
        w().onprem("dgx", 16.0).job(1),
        "hold: no pool can take this job now: no healthy node has or will free enough GPUs (1 pool)",
    );
}

#[test]
fn holds_name_what_blocks() {
    check(w().job(1), "hold: no pools in the catalogue");
    check(
        two_pools(8, 8).job(8).with(|j| j.resources.nodes = 2),
        "hold: multi-node jobs are not supported yet",
    );
    check(
        two_pools(8, 8).job(1).with(|j| j.resources.cpus = 128),
        "hold: no pool can take this job now: fewer than 128 vCPUs per node (2 pools)",
    );
    check(
        two_pools(8, 8)
            .job(1)
            .with(|j| j.resources.memory_gb = 2048),
        "hold: no pool can take this job now: less than 2048 GB of memory per node (2 pools)",
    );
}

#[test]
fn explanations_list_candidates_winner_first_then_by_score() {
    check_explain(
        two_pools(8, 8).job(1),
        &[
            "onprem:dc1/dgx d1 FreeNow on_demand $2.000000 WIN",
            "aws:use1/p5 a1 FreeNow on_demand $10.000000 outscored",
        ],
    );
    // Launch costs the whole node, boot included: $80/h × 3,900 s.
    check_explain(
        two_pools(0, 0)
            .busy("d1", 8, 3600)
            .busy("a1", 8, 36_000)
            .pool("aws:use1/g6", "L4", 8, 8.0, None)
            .job(1)
            .deadline_in(5400)
            .with(|j| j.resources.min_gpu_memory_gb = 40),
        &[
            "aws:use1/p5 - Launch on_demand $86.666667 WIN",
            "onprem:dc1/dgx d1 Wait on_demand $2.000000 misses_deadline",
            "aws:use1/p5 a1 Wait on_demand $10.000000 misses_deadline",
            "aws:use1/g6 - Launch on_demand $8.666667 GpuMemoryTooSmall { have_gb: 24, need_gb: 40 }",
        ],
    );
    check_explain(
        w().pool(P5, "H100", 8, 80.0, Some(32.0))
            .no_burst()
            .onprem("dgx", 16.0)
            .node(DGX, "d1", 0)
            .job(1)
            .models(&["A100"]),
        &[
            "aws:use1/p5 - Launch on_demand $86.666667 GpuModelNotAllowed { model: \"H100\" }",
            "onprem:dc1/dgx - FreeNow on_demand $2.000000 GpuModelNotAllowed { model: \"H100\" }",
        ],
    );
    check_explain(
        w().pool(P5, "H100", 8, 80.0, Some(32.0))
            .no_burst()
            .onprem("dgx", 16.0)
            .node(DGX, "d1", 0)
            .job(1),
        &[
            "aws:use1/p5 - Launch on_demand $86.666667 BurstDisabled",
            "onprem:dc1/dgx - Wait on_demand $2.000000 NoCapacity",
        ],
    );
}

#[track_caller]
fn check_explain(world: W, expect: &[&str]) {
    assert_eq!(explain(world), expect);
}

#[test]
fn explanations_are_capped_best_first() {
    let mut world = w();
    for i in 0..30 {
        let id = format!("onprem:dc1/p{i:02}");
        world = world.pool(&id, "H100", 8, 100.0 - f64::from(i), None).node(
            &id,
            &format!("n{i:02}"),
            8,
        );
    }
    let lines = explain(world.job(1));
    assert_eq!(lines.len(), MAX_EXPLAINED_CANDIDATES);
    assert!(
        lines[0].starts_with("onprem:dc1/p29 n29 FreeNow"),
        "{lines:?}"
    );
    assert!(
        lines[19].starts_with("onprem:dc1/p10 n10 FreeNow"),
        "{lines:?}"
    );
}

#[test]
fn every_job_is_explained_and_the_plan_ignores_input_order() {
    let world = two_pools(4, 8)
        .busy("d1", 4, 600)
        .pool("aws:use1/g6", "L4", 8, 8.0, None)
        .job(4)
        .job(4)
        .deadline_in(9000)
        .job(8)
        .priority(Priority::High)
        .job(1)
        .models(&["L4"])
        .job(2)
        .with(|j| j.resources.nodes = 3);
    let forward = plan(&world.snap, NOW);
    assert_eq!(forward.explanations.len(), 5);
    assert!(forward.explanations.values().all(|e| e.at == NOW));
    let mut reversed = world.snap.clone();
    reversed.regions.reverse();
    reversed.pools.reverse();
    reversed.nodes.reverse();
    reversed.queued.reverse();
    reversed.running.reverse();
    assert_eq!(plan(&reversed, NOW), forward);
}

#[test]
fn assignments_carry_their_estimates() {
    let p = plan_of(
        two_pools(8, 8)
            .job(2)
            .spot(SpotRule::Allowed)
            .with(|j| j.estimated_runtime_s = Some(1800)),
    );
    let a = &p.assignments[0];
    assert_eq!(
        (a.node.as_str(), a.pool.as_str(), a.gpus, a.market),
        ("d1", DGX, 2, Market::OnDemand)
    );
    // 2 GPUs × $2/GPU-h × half an hour.
    assert_eq!(a.estimated_cost, usd(2.0));
    assert_eq!(a.estimated_finish, NOW.plus_secs(1800));
    // No runtime estimate: an hour is assumed.
    let plan = plan_of(
        two_pools(8, 8)
            .job(1)
            .with(|j| j.estimated_runtime_s = None),
    );
    assert_eq!(plan.assignments[0].estimated_finish, NOW.plus_secs(3600));
}

fn plan_of(world: W) -> Plan {
    plan(&world.snap, NOW)
}

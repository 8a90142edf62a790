//! Tests of `plan`: a small world builder, `check(world, expect)` comparing a one-line rendering
//! of every job's outcome, and `check_explain(world, lines)` for the candidate lists. The tables
//! are in `cases`; `pruning` checks that the pruned pool scan plans exactly as the full one.
//!
//! The base world has three regions: `onprem:dc1` (no egress, 5 ms, 100 Gbit/s in), `aws:use1`
//! ($0.09/GB out, 20 ms, 10 Gbit/s in) and `gcp:euw4` ($0.12/GB out, 120 ms, ingress unstated).
//! Jobs default to 1 GPU for one hour, normal priority, no deadline, on-demand only.

mod cache;
mod cases;
#[path = "../../../benches/support/fleet.rs"]
mod fleet;
mod pruning;
mod restore;
mod rules;

use super::*;
use uuid::Uuid;

const NOW: Timestamp = Timestamp::from_secs(1_800_000_000);

fn usd(dollars: f64) -> Money {
    Money::from_micros((dollars * 1e6).round() as i64)
}

#[derive(Clone)]
struct W {
    snap: Snapshot,
}

fn region(id: &str, egress: f64, latency_ms: u32, ingress_gbps: u32) -> Region {
    let (provider, code) = id.split_once(':').expect("region ids are provider:code");
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
        let (region, instance_type) = id.split_once('/').expect("pool ids are region/type");
        let launchable = !region.starts_with("onprem");
        self.snap.pools.push(Pool {
            id: PoolId::new(id),
            region: RegionId::new(region),
            provider: RegionId::new(region).provider().into(),
            instance_type: instance_type.into(),
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
            marginal_per_hour: None,
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
        let found = self.snap.pools.iter_mut().find(|p| p.id.0 == pool);
        found.expect("add the pool first")
    }
    fn no_burst(mut self) -> W {
        self.snap.burst_enabled = false;
        self
    }
    /// A node with `free` GPUs free: its highest (the lowest are held, as the planner gives
    /// them out lowest first).
    fn node(mut self, pool: &str, id: &str, free: u32) -> W {
        let total = self.pool_mut(pool).gpus_per_node;
        self.snap.nodes.push(Node {
            id: NodeId::new(id),
            pool: PoolId::new(pool),
            gpus_total: total,
            free_gpus: top_gpus(total, free),
            healthy: true,
            draining: false,
            last_heartbeat: NOW,
            market: Market::OnDemand,
        });
        self
    }
    /// Marks `id` a spot node.
    fn spot_node(mut self, id: &str) -> W {
        self.node_mut(id).market = Market::Spot;
        self
    }
    /// Makes exactly `free` (indexes) the GPUs free on `id`.
    fn free_gpus(mut self, id: &str, free: &[u32]) -> W {
        self.node_mut(id).free_gpus = GpuSet::from_indexes(free.iter().copied()).expect("< 64");
        self
    }
    fn node_mut(&mut self, id: &str) -> &mut Node {
        let found = self.snap.nodes.iter_mut().find(|n| n.id.0 == id);
        found.expect("add the node first")
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
    /// Work holding `gpus` of `node`'s GPUs: the lowest neither free nor held already.
    fn attempt(mut self, node: &str, gpus: u32, expected_end: Timestamp) -> W {
        let n = self.snap.running.len() as u128 + 1000;
        let id = NodeId::new(node);
        let free = self.snap.nodes.iter().find(|n| n.id == id);
        let taken = self
            .snap
            .running
            .iter()
            .filter(|a| a.node == id)
            .fold(free.map_or(GpuSet::EMPTY, |n| n.free_gpus), |t, a| {
                t.union(a.gpus)
            });
        let all = GpuSet::first(MAX_GPUS_PER_NODE).expect("64");
        self.snap.running.push(RunningAttempt {
            job: JobId(Uuid::from_u128(n)),
            attempt: AttemptId(Uuid::from_u128(n)),
            node: id,
            gpus: all.difference(taken).lowest(gpus),
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
                expected_gpu_utilization_pct: None,
                name: format!("j{n}"),
                team: "ml".into(),
                project: None,
                command: vec!["true".into()],
                env: BTreeMap::new(),
                resources: Resources {
                    gpus,
                    gpu_models: vec![],
                    accelerator: None,
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
                callers: Vec::new(),
            },
            // Later jobs were submitted later.
            submitted_at: NOW.plus_secs(n as i64 - 1000),
            deadline_runtime_s: None,
        });
        self
    }
    fn submitted_ago(mut self, s: i64) -> W {
        self.last_job().submitted_at = NOW.plus_secs(-s);
        self
    }
    /// Keeps the last job off `node`.
    fn avoid(mut self, node: &str) -> W {
        let job = self.last_job().id;
        self.snap
            .avoid
            .entry(job)
            .or_default()
            .push(NodeId::new(node));
        self
    }
    fn last_job(&mut self) -> &mut QueuedJob {
        self.snap.queued.last_mut().expect("add a job first")
    }
    fn spec(&mut self) -> &mut JobSpec {
        &mut self.last_job().spec
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
    fn team(self, team: &str) -> W {
        self.with(|j| j.team = team.into())
    }
    fn gang(self, nodes: u32) -> W {
        self.with(|j| j.resources.nodes = nodes)
    }
    fn policy(mut self, p: TeamPolicy) -> W {
        self.snap.policies.push(p);
        self
    }
    /// Spot interruptions per hour in `pool`, in millionths.
    fn risk(mut self, pool: &str, ppm: u32) -> W {
        self.snap
            .spot_interruptions_per_hour_ppm
            .insert(PoolId::new(pool), ppm);
        self
    }
    /// Low-priority work holding `gpus` on `node`, started `ago_s` ago, ending in `ends_in_s`.
    fn low(mut self, node: &str, gpus: u32, ago_s: i64, ends_in_s: i64) -> W {
        self = self.busy(node, gpus, ends_in_s);
        let a = self.snap.running.last_mut().expect("just added");
        a.priority = Priority::Low;
        a.started_at = NOW.plus_secs(-ago_s);
        self
    }
}

/// The top `free` of a node's `total` GPUs (`0..free` when `free` is more than `total`).
fn top_gpus(total: u32, free: u32) -> GpuSet {
    let all = GpuSet::first(total.max(free)).expect("at most 64 GPUs");
    all.difference(all.lowest(total.saturating_sub(free)))
}

fn outcome(e: &Explanation) -> String {
    match &e.outcome {
        Outcome::Assigned { node, .. } => {
            let a = e.candidates.first().expect("the winner is listed");
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
        .keys()
        .map(|id| plan.explanation(id).expect("explained"))
        .map(|e| match many {
            true => format!("{}: {}", names[&e.job], outcome(&e)),
            false => outcome(&e),
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
    let first = plan.explanations.keys().next().expect("add a job");
    let e = plan.explanation(first).expect("explained");
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

#[track_caller]
fn check_explain(world: W, expect: &[&str]) {
    assert_eq!(explain(world), expect);
}

fn plan_of(world: W) -> Plan {
    plan(&world.snap, NOW)
}

// Hold reasons, as `hold(&[(WHY, pools)])` builds them.
const BURST_OFF: &str = "needs a new node but bursting is disabled";
const QUOTA: &str = "needs a new node but its node quota is reached";
const NO_CAPACITY: &str = "no healthy node has or will free enough GPUs";
const MODEL: &str = "GPU model not among the job's gpu_models";
const ACCELERATOR: &str =
    "not the accelerator the job asks for (resources.accelerator; none: a GPU)";
const REGION: &str = "region not among the job's regions";

/// The expected outcome of a job held for these reasons, each with its count of pools.
fn hold(reasons: &[(&str, usize)]) -> String {
    let parts: Vec<String> = reasons
        .iter()
        .map(|(why, n)| format!("{why} ({n} pool{})", if *n == 1 { "" } else { "s" }))
        .collect();
    format!("hold: no pool can take this job now: {}", parts.join("; "))
}

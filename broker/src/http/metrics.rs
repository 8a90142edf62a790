//! Prometheus exposition at `/metrics` (OpenMetrics text).
//!
//! Two kinds of figures. Counters and histograms the broker updates as it works (planner
//! round time, each job's wait from submission to placement, plan size, lease expiries,
//! submissions) live in [`Metrics`], shared through the `App`. Levels that the database already
//! knows (queue depth by state and priority, spend rate per team, budget remaining, instances
//! by state and provider, nodes, and each GPU's utilisation, memory, temperature and power from
//! the agents' last heartbeats) are read at scrape time, so they are never stale and never
//! drift from the truth. So is `switchyard_gpu_wasted_hours_total{team}` (the waste rule's idle
//! GPU-hours, `control/waste.rs`): a counter, because the store only adds to it.
//!
//! GPU series use NVIDIA dcgm-exporter's names and labels (`DCGM_FI_DEV_GPU_UTIL`,
//! `DCGM_FI_DEV_FB_USED`, `DCGM_FI_DEV_GPU_TEMP`, `DCGM_FI_DEV_POWER_USAGE` with `gpu`, `UUID`,
//! `device` (`nvidia0`, …), `modelName`, `Hostname`) so that existing GPU dashboards work unchanged; a `node` and a
//! `pool` label say where the GPU is in Switchyard's terms. Also dcgm-exporter's
//! `DCGM_FI_DEV_SM_CLOCK`, `DCGM_FI_DEV_XID_ERRORS` (the last XID), `DCGM_FI_DEV_ECC_DBE_VOL_TOTAL`
//! and, only where the GPU measures them, the profiling ratios (0–1) `DCGM_FI_PROF_SM_ACTIVE`,
//! `DCGM_FI_PROF_SM_OCCUPANCY`, `DCGM_FI_PROF_DRAM_ACTIVE`; Switchyard's
//! `switchyard_gpu_healthy{node,pool,gpu,UUID}` (the health rules' verdict) and
//! `switchyard_telemetry_dropped_total{field}` (readings out of physical range, dropped before
//! they were stored: never exported).

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use switchyard_core::Timestamp;
use switchyard_protocol::agent::Inventory;

use crate::gateway::traffic::{Traffic, bucket_upper_ms};
use crate::rules::budget;
use crate::store::{Store, StoreError};

type Labels = Vec<(String, String)>;
type FloatGauge = Gauge<f64, AtomicU64>;

/// What the broker counts as it works. Cheap to update from any task.
pub struct Metrics {
    placement_seconds: Histogram,
    queue_wait_seconds: Histogram,
    plan_jobs: Histogram,
    lease_expiries: Counter,
    jobs_submitted: Counter,
    /// 1 while this replica leads, else 0.
    leader: Gauge,
    /// The fencing epoch it leads (or last led) under.
    leader_epoch: Gauge,
    /// Agents' readings dropped as out of physical range, by field (`rules/health.rs`).
    telemetry_dropped: Family<Labels, Counter>,
}

/// Upper bounds of `switchyard_placement_seconds`: 1-3-10 steps from 10 µs to 5 s.
const PLACEMENT_BUCKETS_S: [f64; 12] = [
    0.00001, 0.00003, 0.0001, 0.0003, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 5.0,
];
/// Upper bounds of `switchyard_job_queue_wait_seconds`: 10 ms to 2 days.
const QUEUE_WAIT_BUCKETS_S: [f64; 14] = [
    0.01, 0.05, 0.25, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 10800.0, 28800.0, 86400.0,
    172800.0,
];

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics {
            // 10 µs … 5 s, written as decimals (a product like 1e-5 × 3 prints as
            // 0.000030000000000000005, which dashboards show as is).
            placement_seconds: Histogram::new(PLACEMENT_BUCKETS_S.iter().copied()),
            // 10 ms … 2 days.
            queue_wait_seconds: Histogram::new(QUEUE_WAIT_BUCKETS_S.iter().copied()),
            // 1 … ~60,000 queued jobs per plan.
            plan_jobs: Histogram::new(exponential_buckets(1.0, 3.0, 11)),
            lease_expiries: Counter::default(),
            jobs_submitted: Counter::default(),
            leader: Gauge::default(),
            leader_epoch: Gauge::default(),
            telemetry_dropped: Family::default(),
        }
    }
}

impl Metrics {
    /// One scheduler round: how long `plan` took and how many queued jobs it looked at.
    pub fn observe_plan(&self, seconds: f64, queued: usize) {
        self.placement_seconds.observe(seconds);
        self.plan_jobs.observe(queued as f64);
    }

    /// A job's first placement: how long it waited from submission until its assignment was
    /// committed.
    pub fn observe_queue_wait(&self, seconds: f64) {
        self.queue_wait_seconds.observe(seconds.max(0.0));
    }

    /// Nodes whose lease expired (lost: their work was requeued).
    pub fn lease_expired(&self, nodes: usize) {
        self.lease_expiries.inc_by(nodes as u64);
    }

    /// An agent's reading of `field` was out of physical range and dropped.
    pub fn telemetry_dropped(&self, field: &'static str) {
        self.telemetry_dropped
            .get_or_create(&vec![("field".into(), field.into())])
            .inc();
    }

    pub fn job_submitted(&self) {
        self.jobs_submitted.inc();
    }

    /// Whether this replica leads, and under which epoch.
    pub fn set_leader(&self, epoch: Option<i64>) {
        self.leader.set(i64::from(epoch.is_some()));
        if let Some(e) = epoch {
            self.leader_epoch.set(e);
        }
    }

    /// The whole exposition: this process's counters, the services' traffic as the gateways
    /// reported it, and the database's levels now.
    pub async fn render(
        &self,
        store: &Store,
        traffic: &Traffic,
        now: Timestamp,
    ) -> Result<String, StoreError> {
        let mut registry = Registry::default();
        registry.register(
            "switchyard_placement_seconds",
            "Time one scheduler round spent in the planner",
            self.placement_seconds.clone(),
        );
        registry.register(
            "switchyard_job_queue_wait_seconds",
            "Time from a job's submission to the commit of its first placement",
            self.queue_wait_seconds.clone(),
        );
        registry.register(
            "switchyard_plan_queued_jobs",
            "Queued jobs each scheduler round planned",
            self.plan_jobs.clone(),
        );
        registry.register(
            "switchyard_lease_expiries",
            "Nodes lost because their lease expired (their work was requeued)",
            self.lease_expiries.clone(),
        );
        registry.register(
            "switchyard_jobs_submitted",
            "Jobs accepted by this broker process",
            self.jobs_submitted.clone(),
        );
        registry.register(
            "switchyard_leader",
            "1 while this replica leads (runs the scheduler, burst controller and ledger)",
            self.leader.clone(),
        );
        registry.register(
            "switchyard_leader_epoch",
            "The fencing epoch this replica leads or last led under",
            self.leader_epoch.clone(),
        );
        registry.register(
            "switchyard_telemetry_dropped",
            "Agents' GPU readings dropped as out of physical range (never stored or exported), \
             by field",
            self.telemetry_dropped.clone(),
        );

        let queue = Family::<Labels, Gauge>::default();
        for (state, priority, n) in store.queue_depth().await? {
            queue
                .get_or_create(&vec![
                    ("state".into(), state.as_str().into()),
                    ("priority".into(), priority.as_str().into()),
                ])
                .set(n);
        }
        registry.register(
            "switchyard_jobs",
            "Jobs not yet finished, by state and priority",
            queue,
        );

        let instances = Family::<Labels, Gauge>::default();
        let mut counts: BTreeMap<(String, String), i64> = BTreeMap::new();
        for i in store.instances(false).await? {
            *counts
                .entry((i.state.as_str().to_string(), i.provider.clone()))
                .or_default() += 1;
        }
        for ((state, provider), n) in counts {
            instances
                .get_or_create(&vec![
                    ("state".into(), state),
                    ("provider".into(), provider),
                ])
                .set(n);
        }
        registry.register(
            "switchyard_instances",
            "Cloud instances the broker launched and has not seen end, by state and provider",
            instances,
        );

        let spend_rate = Family::<Labels, FloatGauge>::default();
        for (team, rate) in store.spend_rates().await? {
            spend_rate
                .get_or_create(&vec![("team".into(), team)])
                .set(rate.as_dollars());
        }
        registry.register(
            "switchyard_spend_rate_usd_per_hour",
            "What the team's work live now (running attempts, live cloud instances) costs an hour, \
             as the ledger accrues it",
            spend_rate,
        );

        // Idle GPU-hours by team, as the waste rule judged them (`control/waste.rs`): from the
        // store, which only adds to them, so the series is a counter on every replica.
        let wasted = Family::<Labels, Counter<f64, AtomicU64>>::default();
        for (team, ms) in store.wasted_gpu_ms_by_team().await? {
            wasted
                .get_or_create(&vec![("team".into(), team)])
                .inc_by(ms as f64 / 3_600_000.0);
        }
        registry.register(
            "switchyard_gpu_wasted_hours",
            "GPU-hours jobs held idle (their GPUs' activity under the team's utilization \
             threshold, 10 % without a rule), by team",
            wasted,
        );

        let remaining = Family::<Labels, FloatGauge>::default();
        let amount = Family::<Labels, FloatGauge>::default();
        let spent = Family::<Labels, FloatGauge>::default();
        let period_end = Family::<Labels, Gauge>::default();
        let policies = store.policies().await?;
        if policies.iter().any(|p| p.body.budget.is_some()) {
            for b in budget::statuses(store, &policies, now).await? {
                let labels: Labels = vec![
                    ("team".into(), b.team),
                    ("project".into(), b.project.unwrap_or_default()),
                ];
                remaining
                    .get_or_create(&labels)
                    .set(b.remaining.as_dollars());
                amount.get_or_create(&labels).set(b.amount.as_dollars());
                spent.get_or_create(&labels).set(b.spent.as_dollars());
                period_end
                    .get_or_create(&labels)
                    .set(b.period_end.millis() / 1000);
            }
        }
        registry.register(
            "switchyard_budget_usd",
            "The budget for this period (project is empty for a team-wide budget)",
            amount,
        );
        registry.register(
            "switchyard_budget_spent_usd",
            "What the ledger has charged against the budget this period",
            spent,
        );
        registry.register(
            "switchyard_budget_period_end_timestamp_seconds",
            "When this budget period ends (Unix seconds): remaining / hours left is the spend \
             rate the budget affords",
            period_end,
        );
        registry.register(
            "switchyard_budget_remaining_usd",
            "Budget left this period: the amount less what was spent and what live work has \
             reserved; negative when over (project is empty for a team-wide budget)",
            remaining,
        );

        let nodes = Family::<Labels, Gauge>::default();
        let util = Family::<Labels, Gauge>::default();
        let fb_used = Family::<Labels, Gauge>::default();
        let temp = Family::<Labels, Gauge>::default();
        let power = Family::<Labels, FloatGauge>::default();
        let sm_clock = Family::<Labels, Gauge>::default();
        let xid = Family::<Labels, Gauge>::default();
        let ecc_dbe = Family::<Labels, Gauge>::default();
        let sm_active = Family::<Labels, FloatGauge>::default();
        let sm_occupancy = Family::<Labels, FloatGauge>::default();
        let dram_active = Family::<Labels, FloatGauge>::default();
        let gpu_healthy = Family::<Labels, Gauge>::default();
        let mut gpu_uuids: Vec<((String, u32), String)> = Vec::new();
        for node in store.nodes().await? {
            if node.revoked {
                continue;
            }
            let health = if !node.healthy {
                "lost"
            } else if node.draining {
                "draining"
            } else {
                "healthy"
            };
            nodes
                .get_or_create(&vec![
                    ("pool".into(), node.pool.to_string()),
                    ("health".into(), health.into()),
                ])
                .inc();
            if !node.healthy {
                continue; // its last readings are stale
            }
            // An inventory that does not parse is skipped, not fatal: it came from an agent.
            let Ok(inventory) = serde_json::from_str::<Inventory>(&node.inventory_json) else {
                continue;
            };
            for gpu in &inventory.gpus {
                gpu_uuids.push(((node.id.to_string(), gpu.index), gpu.uuid.clone()));
                let labels: Labels = vec![
                    ("gpu".into(), gpu.index.to_string()),
                    ("UUID".into(), gpu.uuid.clone()),
                    ("device".into(), format!("nvidia{}", gpu.index)),
                    ("modelName".into(), gpu.model.clone()),
                    ("Hostname".into(), node.hostname.clone()),
                    ("node".into(), node.id.to_string()),
                    ("pool".into(), node.pool.to_string()),
                ];
                if let Some(v) = gpu.utilization_pct {
                    util.get_or_create(&labels).set(i64::from(v));
                }
                if let Some(v) = gpu.memory_used_mb {
                    fb_used
                        .get_or_create(&labels)
                        .set(i64::try_from(v).unwrap_or(i64::MAX));
                }
                if let Some(v) = gpu.temperature_c {
                    temp.get_or_create(&labels).set(i64::from(v));
                }
                if let Some(v) = gpu.power_w {
                    power.get_or_create(&labels).set(v);
                }
                if let Some(v) = gpu.sm_clock_mhz {
                    sm_clock.get_or_create(&labels).set(i64::from(v));
                }
                if let Some(h) = &gpu.health {
                    // As dcgm-exporter: the last XID seen (the agent sends those since the
                    // last answered heartbeat), 0 for none.
                    xid.get_or_create(&labels)
                        .set(h.xid_events.last().map_or(0, |&x| i64::from(x)));
                    if let Some(n) = h.ecc_uncorrected_volatile {
                        ecc_dbe
                            .get_or_create(&labels)
                            .set(i64::try_from(n).unwrap_or(i64::MAX));
                    }
                }
                // Profiling as dcgm-exporter exports it: ratios 0–1, only where measured.
                if let Some(p) = &gpu.profiling {
                    for (family, pct) in [
                        (&sm_active, p.sm_active_pct),
                        (&sm_occupancy, p.sm_occupancy_pct),
                        (&dram_active, p.dram_active_pct),
                    ] {
                        if let Some(pct) = pct {
                            family.get_or_create(&labels).set(pct / 100.0);
                        }
                    }
                }
                gpu_healthy
                    .get_or_create(&vec![
                        ("node".into(), node.id.to_string()),
                        ("pool".into(), node.pool.to_string()),
                        ("gpu".into(), gpu.index.to_string()),
                        ("UUID".into(), gpu.uuid.clone()),
                    ])
                    .set(i64::from(
                        !node.gpu_marks.iter().any(|m| m.gpu == gpu.index),
                    ));
            }
        }
        registry.register(
            "switchyard_nodes",
            "Registered nodes by pool and health",
            nodes,
        );

        // Whose work each busy GPU holds: an info series (always 1) joined to the DCGM series
        // on `UUID`, so that utilisation by team works with Switchyard's own GPU series and
        // with an existing dcgm-exporter's alike.
        let uuids: std::collections::HashMap<(String, u32), String> =
            gpu_uuids.into_iter().collect();
        let allocated = Family::<Labels, Gauge>::default();
        for a in store.gpu_allocations().await? {
            for gpu in &a.gpus {
                let Some(uuid) = uuids.get(&(a.node.to_string(), *gpu)) else {
                    continue;
                };
                allocated
                    .get_or_create(&vec![
                        ("UUID".into(), uuid.clone()),
                        ("gpu".into(), gpu.to_string()),
                        ("node".into(), a.node.to_string()),
                        ("team".into(), a.team.clone()),
                        ("job_id".into(), a.job.0.to_string()),
                        ("job_name".into(), a.name.clone()),
                        ("priority".into(), a.priority.as_str().into()),
                    ])
                    .set(1);
            }
        }
        registry.register(
            "switchyard_gpu_allocated",
            "1 for each GPU a live job holds, labelled with the job and its team (join on UUID)",
            allocated,
        );
        registry.register("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %)", util);
        registry.register(
            "DCGM_FI_DEV_SM_CLOCK",
            "SM clock frequency (in MHz)",
            sm_clock,
        );
        registry.register(
            "DCGM_FI_DEV_XID_ERRORS",
            "Value of the last XID error encountered",
            xid,
        );
        registry.register(
            "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
            "Total number of double-bit volatile ECC errors",
            ecc_dbe,
        );
        registry.register(
            "DCGM_FI_PROF_SM_ACTIVE",
            "The ratio of cycles an SM has at least 1 warp assigned (in %)",
            sm_active,
        );
        registry.register(
            "DCGM_FI_PROF_SM_OCCUPANCY",
            "The ratio of number of warps resident on an SM (in %)",
            sm_occupancy,
        );
        registry.register(
            "DCGM_FI_PROF_DRAM_ACTIVE",
            "Ratio of cycles the device memory interface is active sending or receiving data (in %)",
            dram_active,
        );
        registry.register(
            "switchyard_gpu_healthy",
            "1 while the GPU is healthy, 0 while a health rule marks it (fatal XID, uncorrectable \
             ECC, overheating; reasons in GET /api/v1/nodes)",
            gpu_healthy,
        );
        registry.register(
            "DCGM_FI_DEV_FB_USED",
            "Framebuffer memory used (in MiB)",
            fb_used,
        );
        registry.register("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C)", temp);
        registry.register("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W)", power);

        register_services(&mut registry, store, traffic).await?;

        let mut out = String::new();
        encode(&mut out, &registry)
            .map_err(|e| StoreError::Corrupt(format!("encoding metrics: {e}")))?;
        Ok(out)
    }
}

/// Upper bounds of `switchyard_service_latency_seconds`: 5 ms to 30 s.
const SERVICE_LATENCY_BUCKETS_S: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Each live service's latency histogram (from the gateways' finer buckets: a request is
/// counted in the first bound at or above its fine bucket's upper bound, so a little slow
/// rather than fast).
#[derive(Debug, Default)]
struct ServiceLatency(Vec<LatencySeries>);

/// One service's labels, latency sum (seconds), count, and (bound, requests) per bucket.
type LatencySeries = (Labels, f64, u64, Vec<(f64, u64)>);

impl prometheus_client::encoding::EncodeMetric for ServiceLatency {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::MetricEncoder,
    ) -> Result<(), std::fmt::Error> {
        for (labels, sum, count, buckets) in &self.0 {
            encoder
                .encode_family(labels)?
                .encode_histogram::<prometheus_client::encoding::NoLabelSet>(
                    *sum, *count, buckets, None,
                )?;
        }
        Ok(())
    }

    fn metric_type(&self) -> prometheus_client::metrics::MetricType {
        prometheus_client::metrics::MetricType::Histogram
    }
}

/// Per live service (labels `service`, `team`, `name`): requests and errors through the
/// gateways (counters since this broker started), their latency histogram, and the desired
/// and ready replicas from the store.
async fn register_services(
    registry: &mut Registry,
    store: &Store,
    traffic: &Traffic,
) -> Result<(), StoreError> {
    let (services, routes) = store.gateway_routes().await?;
    let desired_of: BTreeMap<uuid::Uuid, u32> = store
        .services(None)
        .await?
        .into_iter()
        .map(|s| (s.id, s.desired_replicas))
        .collect();
    let totals = traffic.totals();
    let requests = Family::<Labels, Counter>::default();
    let errors = Family::<Labels, Counter>::default();
    let desired = Family::<Labels, Gauge>::default();
    let ready = Family::<Labels, Gauge>::default();
    let mut latency = ServiceLatency::default();
    for s in &services {
        let labels: Labels = vec![
            ("service".into(), s.service.to_string()),
            ("team".into(), s.team.clone()),
            ("name".into(), s.name.clone()),
        ];
        desired
            .get_or_create(&labels)
            .set(i64::from(desired_of.get(&s.service).copied().unwrap_or(0)));
        let n = routes
            .iter()
            .filter(|r| r.service == s.service && r.ready && !r.draining)
            .count();
        ready
            .get_or_create(&labels)
            .set(i64::try_from(n).unwrap_or(i64::MAX));
        let t = totals.get(&s.service).cloned().unwrap_or_default();
        requests.get_or_create(&labels).inc_by(t.requests);
        errors.get_or_create(&labels).inc_by(t.errors);
        let mut buckets: Vec<(f64, u64)> = SERVICE_LATENCY_BUCKETS_S
            .iter()
            .map(|le| (*le, 0))
            .collect();
        buckets.push((f64::INFINITY, 0));
        for (i, n) in t.hist.iter().enumerate() {
            let upper_s = bucket_upper_ms(i) / 1000.0;
            if let Some(b) = buckets.iter_mut().find(|(le, _)| *le >= upper_s) {
                b.1 += n;
            }
        }
        // Per bucket: the encoder makes them cumulative.
        latency
            .0
            .push((labels, t.latency_sum_us as f64 / 1e6, t.requests, buckets));
    }
    registry.register(
        "switchyard_service_requests",
        "Requests to the service through its gateways (as they reported them to this broker)",
        requests,
    );
    registry.register(
        "switchyard_service_request_errors",
        "Of those, the ones that failed: 5xx, unreachable replica, full queue",
        errors,
    );
    registry.register(
        "switchyard_service_latency_seconds",
        "Gateway latency to the first byte of the answer",
        latency,
    );
    registry.register(
        "switchyard_service_desired_replicas",
        "Replicas the autoscaler wants for the service",
        desired,
    );
    registry.register(
        "switchyard_service_ready_replicas",
        "Running replicas that pass their readiness probe and are not draining",
        ready,
    );
    Ok(())
}

/// The exposition's content type.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

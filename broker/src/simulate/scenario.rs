//! The scenario: every assumption the trace lacks, as a TOML file whose every key has a
//! default (so `switchyard simulate --trace FILE` works alone) and where an unknown key is an
//! error. [`Scenario::world`] and [`Scenario::jobs`] turn it, the bundled catalogue and a trace
//! into the engine's inputs; every random draw comes from the scenario's seed.

use super::estimates::EstimatesScenario;
use super::services::ServiceScenario;
use super::trace::TraceJob;
use super::waste::WasteScenario;
use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use switchyard_core::sim::rng::SplitMix64;
use switchyard_core::sim::{SimJob, SimPool, World};
use switchyard_core::*;
use switchyard_providers::catalogue::{Catalogue, pool_from_entry};

/// Where replayed time starts: 2017-10-01T00:00:00Z (Philly ran Aug–Dec 2017; the trace has no
/// date, so only differences matter).
pub const EPOCH_S: i64 = 1_506_816_000;

/// A trace whose submissions span less than this many days gets no default warm-up.
pub const SHORT_TRACE_DAYS: f64 = 1.0;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Scenario {
    pub seed: u64,
    /// Jobs submitted before this day (counted from the trace's first submission) are warm-up:
    /// replayed and billed, but left out of the deadline and queueing metrics. Unset (the
    /// default): the first [`Scenario::warmup_share`] of the trace's span, or none for a trace
    /// shorter than [`SHORT_TRACE_DAYS`] (see [`Scenario::warmup_end_s`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_day: Option<f64>,
    /// The share of the trace's span replayed as warm-up when `start_day` is unset.
    pub warmup_share: f64,
    pub idle_ttl_s: i64,
    pub tick_s: i64,
    pub checkpoint_interval_s: i64,
    pub fifo_burst_after_s: i64,
    pub lp_buckets: usize,
    /// Switchyard's on-prem reserve: an owned pool with less than one in this many GPUs free
    /// charges jobs that allow spot a reserve for its last GPUs; 0 turns it off. Unset: the
    /// broker's default, 8 (`switchyard_core::DEFAULT_RESERVE_FREE_BELOW_ONE_IN`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reserve_free_below_one_in: Option<u32>,
    /// What becomes of a trace job on more than one node: `pack` (the default) asks for its
    /// GPUs on as few nodes as hold them: `n = ceil(gpus / largest on-prem node)` nodes of
    /// `ceil(gpus / n)` GPUs each, one node when they fit on one — what a user moving the job
    /// to this scenario's hardware would ask for, since a trace's node count is the shape of
    /// its own machine's nodes (Blue Waters' XK7 nodes have one GPU each, so its 100-GPU jobs
    /// span 100 nodes). A packed job on more than one node is a gang. `gang` runs it on the
    /// trace's `nodes` nodes of one pool with `ceil(gpus / nodes)` GPUs each, all started
    /// together, for its true runtime, as the broker runs a multi-node job; `fold` puts it on one node
    /// with `min(gpus, largest on-prem node)` GPUs and stretches its runtime to keep its
    /// GPU-hours (the shape of the replays before gangs, kept for comparison).
    /// A job no pool could ever hold as a gang (more GPUs per node than the largest on-prem
    /// node, or more nodes than any pool has) is folded either way, and counted in the report.
    pub multi_node: MultiNode,
    pub onprem: Vec<OnPrem>,
    pub cloud: Cloud,
    pub deadlines: Deadlines,
    pub spot: Spot,
    pub data: Data,
    pub egress_usd_per_gb: BTreeMap<String, f64>,
    /// What users ask for, for traces that do not record it (`estimates.rs`).
    pub estimates: EstimatesScenario,
    /// Inference services replayed beside the batch trace (`services.rs`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub services: Vec<ServiceScenario>,
    /// The waste rule's replay (`waste.rs`): assumed utilisation profiles and the rules to
    /// replay. Absent: no waste report unless `--waste` asks for one with the defaults.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waste: Option<WasteScenario>,
}

/// See [`Scenario::multi_node`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MultiNode {
    #[default]
    Pack,
    Gang,
    Fold,
}

/// How [`Scenario::jobs`] shaped the trace's multi-node jobs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MultiNodeCounts {
    pub gangs: usize,
    pub folded: usize,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OnPrem {
    /// `onprem:CODE`.
    pub region: String,
    pub name: String,
    pub gpu_model: String,
    pub gpu_memory_gb: u32,
    pub nodes: u32,
    pub gpus_per_node: u32,
    /// The internal rate finance sets: what the ledger bills teams (chargeback).
    pub usd_per_gpu_hour: f64,
    /// What one more GPU-hour costs the company in cash (power and wear), set by finance.
    /// Unset: a fifth of `usd_per_gpu_hour` ([`switchyard_core::DEFAULT_MARGINAL_SHARE`]).
    /// The planner and the headline cost count on-prem at this; a figure above
    /// `usd_per_gpu_hour` is allowed but warned about ([`Scenario::warnings`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub marginal_usd_per_gpu_hour: Option<f64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Cloud {
    /// Providers of the bundled catalogue to use; empty means all.
    pub providers: Vec<String>,
    /// `provider:region` allow-list; empty means all regions of those providers.
    pub regions: Vec<String>,
    /// GPU models a Philly job can use; empty means any.
    pub gpu_models: Vec<String>,
    pub min_gpu_memory_gb: u32,
    pub boot_time_s: u32,
    /// Quota per pool, in nodes.
    pub node_limit: u32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Deadlines {
    /// `deadline = submit + max(factor × runtime, runtime + min_slack_s)`, with `factor`
    /// uniform in `[min_factor, max_factor)` per job.
    pub min_factor: f64,
    pub max_factor: f64,
    pub min_slack_s: i64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Spot {
    /// Share of jobs that allow spot (drawn per job).
    pub share: f64,
    /// Interruptions per node-hour, by provider.
    pub interruptions_per_hour: BTreeMap<String, f64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Data {
    /// Share of jobs with an input data set (drawn per job).
    pub share: f64,
    /// Where data sets live, with weights.
    pub regions: Vec<Weighted>,
    /// Data set sizes, drawn uniformly.
    pub sizes_gb: Vec<u32>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Weighted {
    pub region: String,
    pub weight: f64,
}

impl Default for Scenario {
    fn default() -> Self {
        Scenario {
            seed: 42,
            start_day: None,
            warmup_share: 0.1,
            idle_ttl_s: 600,
            tick_s: 300,
            checkpoint_interval_s: 3600,
            fifo_burst_after_s: 600,
            lp_buckets: 256,
            reserve_free_below_one_in: None,
            multi_node: MultiNode::Pack,
            onprem: vec![OnPrem {
                region: "onprem:philly".into(),
                name: "v100-8x".into(),
                gpu_model: "V100".into(),
                gpu_memory_gb: 16,
                nodes: 128,
                gpus_per_node: 8,
                usd_per_gpu_hour: 0.25,
                marginal_usd_per_gpu_hour: None,
            }],
            cloud: Cloud::default(),
            deadlines: Deadlines::default(),
            spot: Spot::default(),
            data: Data::default(),
            egress_usd_per_gb: [
                ("onprem", 0.02),
                ("aws", 0.09),
                ("gcp", 0.12),
                ("azure", 0.087),
                ("lambda", 0.0),
                ("vast", 0.0),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect(),
            estimates: EstimatesScenario::default(),
            services: Vec::new(),
            waste: None,
        }
    }
}

impl Default for Cloud {
    fn default() -> Self {
        let s = |v: &[&str]| v.iter().map(|x| (*x).to_owned()).collect();
        Cloud {
            providers: s(&["aws", "gcp", "azure", "lambda"]),
            regions: s(&[
                "aws:us-east-1",
                "aws:us-west-2",
                "aws:eu-west-1",
                "gcp:us-central1",
                "gcp:us-east4",
                "gcp:europe-west4",
                "azure:eastus",
                "azure:westus2",
                "azure:westeurope",
                "lambda:us-east-1",
                "lambda:us-west-1",
                "lambda:us-south-1",
            ]),
            gpu_models: s(&[
                "V100",
                "V100-32GB",
                "A10G",
                "A10",
                "L4",
                "A100",
                "A100-80GB",
            ]),
            min_gpu_memory_gb: 16,
            boot_time_s: 180,
            node_limit: 64,
        }
    }
}

impl Default for Deadlines {
    fn default() -> Self {
        Deadlines {
            min_factor: 1.5,
            max_factor: 4.0,
            min_slack_s: 900,
        }
    }
}

impl Default for Spot {
    fn default() -> Self {
        Spot {
            share: 0.5,
            interruptions_per_hour: [("aws", 0.01), ("gcp", 0.02), ("azure", 0.02)]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect(),
        }
    }
}

impl Default for Data {
    fn default() -> Self {
        let w = |region: &str, weight| Weighted {
            region: region.into(),
            weight,
        };
        Data {
            share: 0.5,
            regions: vec![
                w("onprem:philly", 0.7),
                w("aws:us-east-1", 0.2),
                w("gcp:us-central1", 0.1),
            ],
            sizes_gb: vec![10, 50, 200, 1000],
        }
    }
}

impl Scenario {
    pub fn from_toml(text: &str) -> anyhow::Result<Scenario> {
        let s: Scenario = toml::from_str(text).context("invalid scenario")?;
        s.validate()?;
        Ok(s)
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        let d = &self.deadlines;
        if !(d.min_factor >= 1.0 && d.max_factor >= d.min_factor) {
            bail!("deadlines: need 1 <= min_factor <= max_factor");
        }
        if !(0.0..=1.0).contains(&self.spot.share) || !(0.0..=1.0).contains(&self.data.share) {
            bail!("spot.share and data.share must be in [0, 1]");
        }
        if self.onprem.iter().any(|o| !o.region.starts_with("onprem:")) {
            bail!("onprem regions must be `onprem:CODE`");
        }
        if self.data.share > 0.0 && (self.data.regions.is_empty() || self.data.sizes_gb.is_empty())
        {
            bail!("data.regions and data.sizes_gb must not be empty when data.share > 0");
        }
        // Durations are 0 or more (a negative idle TTL released nodes before they were idle,
        // forever: found by the trace_reader fuzz target), the tick at least a second.
        for (name, v) in [
            ("idle_ttl_s", self.idle_ttl_s),
            ("checkpoint_interval_s", self.checkpoint_interval_s),
            ("fifo_burst_after_s", self.fifo_burst_after_s),
            ("deadlines.min_slack_s", self.deadlines.min_slack_s),
        ] {
            if v < 0 {
                bail!("{name} must be 0 or more, not {v}");
            }
        }
        if let Some(day) = self.start_day
            && !(day.is_finite() && day >= 0.0)
        {
            bail!("start_day must be 0 or more, not {day}");
        }
        if !(0.0..1.0).contains(&self.warmup_share) {
            bail!(
                "warmup_share must be at least 0 and below 1, not {}",
                self.warmup_share
            );
        }
        if self.tick_s < 1 {
            bail!("tick_s must be at least 1, not {}", self.tick_s);
        }
        if let Some(w) = &self.waste {
            w.validate()?;
        }
        self.estimates.validate()?;
        if let Some(o) = self.onprem.iter().find(|o| o.gpus_per_node == 0) {
            bail!("onprem {}: gpus_per_node must be at least 1", o.name);
        }
        let most = switchyard_core::MAX_GPUS_PER_NODE;
        if let Some(o) = self.onprem.iter().find(|o| o.gpus_per_node > most) {
            bail!(
                "onprem {}: gpus_per_node must be at most {most} (a node's GPU indexes run 0 to {}), not {}",
                o.name,
                most - 1,
                o.gpus_per_node
            );
        }
        // Prices and rates are 0 or more: a negative one would pay the scheduler to use it.
        let bad = |x: f64| !(x.is_finite() && x >= 0.0);
        if let Some(o) = self.onprem.iter().find(|o| bad(o.usd_per_gpu_hour)) {
            bail!(
                "onprem {}: usd_per_gpu_hour must be 0 or more, not {}",
                o.name,
                o.usd_per_gpu_hour
            );
        }
        if let Some((o, m)) = self.onprem.iter().find_map(|o| {
            o.marginal_usd_per_gpu_hour
                .filter(|&m| bad(m))
                .map(|m| (o, m))
        }) {
            bail!(
                "onprem {}: marginal_usd_per_gpu_hour must be 0 or more, not {m}",
                o.name
            );
        }
        if let Some((p, v)) = self.egress_usd_per_gb.iter().find(|(_, v)| bad(**v)) {
            bail!("egress_usd_per_gb.{p} must be 0 or more, not {v}");
        }
        let rates = &self.spot.interruptions_per_hour;
        if let Some((p, v)) = rates.iter().find(|(_, v)| bad(**v)) {
            bail!("spot.interruptions_per_hour.{p} must be 0 or more, not {v}");
        }
        if let Some(w) = self.data.regions.iter().find(|w| bad(w.weight)) {
            bail!(
                "data.regions {}: weight must be 0 or more, not {}",
                w.region,
                w.weight
            );
        }
        for (i, svc) in self.services.iter().enumerate() {
            svc.validate()?;
            if self.services[..i].iter().any(|o| o.name == svc.name) {
                bail!("services {}: the name is used twice", svc.name);
            }
        }
        Ok(())
    }

    /// Where the measured part of the replay starts, in seconds of the trace's clock (jobs
    /// submitted earlier are warm-up): `start_day` days when the scenario sets it; otherwise
    /// the first [`Scenario::warmup_share`] of the span between the first and the last
    /// submission, and none when that span is under [`SHORT_TRACE_DAYS`] (a short trace has
    /// no steady state to wait for, and every job of it is worth measuring).
    pub fn warmup_end_s(&self, trace: &[TraceJob]) -> i64 {
        let first = trace.iter().map(|t| t.submit_s).min().unwrap_or(0);
        let last = trace.iter().map(|t| t.submit_s).max().unwrap_or(0);
        match self.start_day {
            Some(day) => first.saturating_add((day * 86_400.0) as i64),
            None => {
                let span = last - first;
                if (span as f64) < SHORT_TRACE_DAYS * 86_400.0 {
                    first
                } else {
                    first + (self.warmup_share * span as f64) as i64
                }
            }
        }
    }

    /// [`Scenario::warmup_end_s`] on the replay's clock.
    pub fn measure_from(&self, trace: &[TraceJob]) -> Timestamp {
        Timestamp::from_secs(EPOCH_S.saturating_add(self.warmup_end_s(trace)))
    }

    /// Why no job of `trace` is measured, when none is: the report would say nothing.
    pub fn nothing_measured(&self, trace: &[TraceJob]) -> Option<String> {
        let from = self.warmup_end_s(trace);
        if trace.iter().any(|t| t.submit_s >= from) {
            return None;
        }
        let first = trace.iter().map(|t| t.submit_s).min().unwrap_or(0);
        let last = trace.iter().map(|t| t.submit_s).max().unwrap_or(0);
        let why = match self.start_day {
            Some(day) => format!(
                "the scenario's start_day = {day} puts the warm-up past the last submission \
                 (the trace spans {:.1} days); lower start_day or remove it to use the default \
                 warm-up (the first {:.0} % of the span)",
                (last - first) as f64 / 86_400.0,
                self.warmup_share * 100.0
            ),
            None => format!(
                "warmup_share = {} leaves no job after the warm-up (the trace spans {:.1} days)",
                self.warmup_share,
                (last - first) as f64 / 86_400.0
            ),
        };
        Some(format!(
            "no job is measured: all {} jobs are warm-up: {why}",
            trace.len()
        ))
    }

    /// What is allowed but likely a mistake: an on-prem pool whose marginal cost (cash, per
    /// GPU-hour) exceeds its internal rate, so the company pays more to use it than it bills.
    pub fn warnings(&self) -> Vec<String> {
        self.onprem
            .iter()
            .filter_map(|o| {
                let m = o.marginal_usd_per_gpu_hour?;
                (m > o.usd_per_gpu_hour).then(|| {
                    format!(
                        "onprem {}: marginal_usd_per_gpu_hour {m} exceeds its chargeback rate \
                         usd_per_gpu_hour {}",
                        o.name, o.usd_per_gpu_hour
                    )
                })
            })
            .collect()
    }

    /// On-prem pools from the scenario, cloud pools from the catalogue after the filters.
    pub fn world(&self, catalogue: &Catalogue) -> anyhow::Result<World> {
        let c = &self.cloud;
        let has = |list: &[String], v: &str| {
            list.is_empty() || list.iter().any(|x| x.eq_ignore_ascii_case(v))
        };
        let mut pools: Vec<SimPool> = Vec::new();
        let mut regions: BTreeMap<RegionId, Region> = BTreeMap::new();
        for o in &self.onprem {
            let region = RegionId::new(&o.region);
            regions.insert(region.clone(), self.region(&region));
            let per_gpu = Money::from_dollars(o.usd_per_gpu_hour)
                .with_context(|| format!("onprem {}: bad usd_per_gpu_hour", o.name))?;
            let marginal = match o.marginal_usd_per_gpu_hour {
                Some(m) => Some(
                    Money::from_dollars(m)
                        .with_context(|| {
                            format!("onprem {}: bad marginal_usd_per_gpu_hour", o.name)
                        })?
                        .saturating_mul(i64::from(o.gpus_per_node)),
                ),
                None => None,
            };
            pools.push(SimPool {
                pool: Pool {
                    id: PoolId::new(format!("{}/{}", o.region, o.name)),
                    region,
                    provider: "onprem".into(),
                    instance_type: o.name.clone(),
                    gpu_model: o.gpu_model.clone(),
                    gpus_per_node: o.gpus_per_node,
                    gpu_memory_gb: o.gpu_memory_gb,
                    vcpus: 0,
                    memory_gb: 0,
                    on_demand_per_hour: per_gpu.saturating_mul(i64::from(o.gpus_per_node)),
                    spot_per_hour: None,
                    node_limit: o.nodes,
                    launchable: false,
                    boot_time_s: 0,
                    price_updated_at: Timestamp(0),
                    recent_capacity_failures: 0,
                    marginal_per_hour: marginal,
                },
                fixed_nodes: o.nodes,
                interruptions_per_hour: 0.0,
            });
        }
        for e in catalogue.entries() {
            let region = e.region_id();
            if !has(&c.providers, &e.provider)
                || !has(&c.regions, region.as_str())
                || !has(&c.gpu_models, &e.gpu_model)
                || e.gpu_memory_gb < c.min_gpu_memory_gb
            {
                continue;
            }
            regions
                .entry(region.clone())
                .or_insert_with(|| self.region(&region));
            pools.push(SimPool {
                pool: pool_from_entry(e, c.boot_time_s, c.node_limit, Timestamp(0)),
                fixed_nodes: 0,
                interruptions_per_hour: self
                    .spot
                    .interruptions_per_hour
                    .get(&e.provider)
                    .copied()
                    .unwrap_or(0.0),
            });
        }
        if !pools.iter().any(|p| p.pool.launchable) {
            bail!(
                "no cloud offer is left after the scenario's filters (providers {:?}, regions \
                 {:?}, gpu_models {:?}, min_gpu_memory_gb {}); widen them",
                c.providers,
                c.regions,
                c.gpu_models,
                c.min_gpu_memory_gb
            );
        }
        for w in &self.data.regions {
            let id = RegionId::new(&w.region);
            regions
                .entry(id.clone())
                .or_insert_with(|| self.region(&id));
        }
        Ok(World {
            regions: regions.into_values().collect(),
            pools,
        })
    }

    fn region(&self, id: &RegionId) -> Region {
        let provider = id.provider().to_owned();
        let egress = self
            .egress_usd_per_gb
            .get(&provider)
            .copied()
            .unwrap_or(0.0);
        Region {
            id: id.clone(),
            code: id
                .as_str()
                .split_once(':')
                .map_or("", |(_, c)| c)
                .to_owned(),
            provider,
            latitude: None,
            longitude: None,
            egress_per_gb: Money::from_dollars(egress).unwrap_or(Money::ZERO),
            latency_ms: 50,
            ingress_gbps: 10,
        }
    }

    /// The shape a multi-node trace job runs as: `Some((nodes, gpus per node))` for a gang,
    /// `None` for a fold (see [`Scenario::multi_node`]). `largest` is the largest on-prem
    /// node's GPUs, `most_nodes` the most nodes any pool may have.
    fn gang_shape(&self, t: &TraceJob, largest: u32, most_nodes: u32) -> Option<(u32, u32)> {
        let nodes = match self.multi_node {
            MultiNode::Fold => return None,
            MultiNode::Gang if t.nodes <= 1 => return None,
            MultiNode::Gang => t.nodes,
            MultiNode::Pack if t.gpus <= largest => return None,
            MultiNode::Pack => t.gpus.div_ceil(largest),
        };
        let per_node = t.gpus.div_ceil(nodes).max(1);
        (per_node <= largest && nodes <= most_nodes).then_some((nodes, per_node))
    }

    /// The largest on-prem node's GPUs and the most nodes any pool may have (on-prem nodes,
    /// the cloud quota).
    fn limits(&self) -> (u32, u32) {
        let largest = self
            .onprem
            .iter()
            .map(|o| o.gpus_per_node)
            .max()
            .unwrap_or(8)
            .max(1);
        let most_nodes = self
            .onprem
            .iter()
            .map(|o| o.nodes)
            .chain([self.cloud.node_limit])
            .max()
            .unwrap_or(0);
        (largest, most_nodes)
    }

    /// How many of the trace's multi-node jobs run as gangs and how many are folded.
    pub fn multi_node_counts(&self, trace: &[TraceJob]) -> MultiNodeCounts {
        let (largest, most_nodes) = self.limits();
        let mut c = MultiNodeCounts::default();
        for t in trace {
            match self.gang_shape(t, largest, most_nodes) {
                Some(_) => c.gangs += 1,
                // A packed job that fits one node is neither: it asks for what it used.
                None if t.nodes > 1 && self.multi_node != MultiNode::Pack => c.folded += 1,
                None if t.gpus > largest => c.folded += 1,
                None => {}
            }
        }
        c
    }

    /// The trace's jobs with the scenario's assumptions applied. A multi-node job becomes a
    /// gang, or is folded into one job on one node with `min(gpus, largest on-prem node)` GPUs
    /// and its runtime stretched so its GPU-hours stay the same ([`Scenario::multi_node`]).
    pub fn jobs(&self, trace: &[TraceJob]) -> Vec<SimJob> {
        let (largest, most_nodes) = self.limits();
        let start_s = self.warmup_end_s(trace);
        let mut deadlines = SplitMix64::stream(self.seed, 1);
        let mut spot = SplitMix64::stream(self.seed, 2);
        let mut data = SplitMix64::stream(self.seed, 3);
        let total_weight: f64 = self.data.regions.iter().map(|w| w.weight.max(0.0)).sum();
        trace
            .iter()
            .map(|t| {
                let gang = self.gang_shape(t, largest, most_nodes);
                let (nodes, gpus) = gang.unwrap_or((1, t.gpus.min(largest)));
                let runtime_s = if gang.is_none() && gpus < t.gpus {
                    // In i128: a hostile row's runtime × GPUs overflows i64.
                    let gpu_s = i128::from(t.runtime_s) * i128::from(t.gpus);
                    let folded = (gpu_s + i128::from(gpus) - 1) / i128::from(gpus);
                    i64::try_from(folded).unwrap_or(i64::MAX)
                } else {
                    t.runtime_s
                };
                let d = &self.deadlines;
                let factor = deadlines.uniform(d.min_factor, d.max_factor);
                let window = ((factor * runtime_s as f64) as i64)
                    .max(runtime_s.saturating_add(d.min_slack_s));
                let submit = Timestamp::from_secs(EPOCH_S.saturating_add(t.submit_s));
                let spot_rule = if spot.bernoulli(self.spot.share) {
                    SpotRule::Allowed
                } else {
                    SpotRule::Never
                };
                let data_loc = self.draw_data(&mut data, total_weight);
                SimJob {
                    submit,
                    runtime_s,
                    estimate_s: None,
                    spec: JobSpec {
                        expected_gpu_utilization_pct: None,
                        name: format!("philly-{}", t.line),
                        team: "philly".into(),
                        project: None,
                        command: Vec::new(),
                        env: BTreeMap::new(),
                        resources: Resources {
                            gpus,
                            gpu_models: Vec::new(),
                            accelerator: None,
                            min_gpu_memory_gb: 0,
                            cpus: 0,
                            memory_gb: 0,
                            nodes,
                        },
                        estimated_runtime_s: Some(runtime_s),
                        deadline: Some(submit.plus_secs(window)),
                        priority: Priority::Normal,
                        spot: spot_rule,
                        max_price_per_hour: None,
                        regions: Vec::new(),
                        data: data_loc,
                        kind: JobKind::Batch,
                        max_latency_ms: None,
                        callers: Vec::new(),
                    },
                    measured: t.submit_s >= start_s,
                }
            })
            .collect()
    }

    fn draw_data(&self, rng: &mut SplitMix64, total_weight: f64) -> Option<DataLocation> {
        // Three draws per job whatever the outcome, so one job's draw never shifts another's.
        let (has, pick, size) = (rng.next_f64(), rng.next_f64(), rng.next_f64());
        if has >= self.data.share || total_weight <= 0.0 || self.data.sizes_gb.is_empty() {
            return None;
        }
        let mut left = pick * total_weight;
        let region = self
            .data
            .regions
            .iter()
            .find(|w| {
                left -= w.weight.max(0.0);
                left < 0.0
            })
            .or(self.data.regions.last())?;
        let n = self.data.sizes_gb.len();
        let size_gb = self.data.sizes_gb[((size * n as f64) as usize).min(n - 1)];
        Some(DataLocation {
            region: RegionId::new(&region.region),
            size_gb,
        })
    }
}

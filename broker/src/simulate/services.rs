//! Inference services in the simulator: a day of LLM requests replayed against a gateway and
//! a set of replicas whose count a policy sets each second. It answers two questions:
//! how Switchyard's autoscaler compares with fixed provisioning and with a request-rate
//! autoscaler (SkyPilot's and dstack's rule) on the same arrivals (`switchyard simulate
//! --services-only`, the services bench), and what a day of a service's replicas costs and
//! holds next to batch work (`[[services]]` in a scenario replayed with a job trace).
//!
//! **Arrivals.** The Azure LLM inference trace (columns `TIMESTAMP`, `ContextTokens`,
//! `GeneratedTokens`: one real hour) replayed under a *day curve*, our assumption: the curve
//! gives, for each hour of the day (UTC), the arrival rate as a share of the service's peak
//! rate, linear between its points; two points at the same hour are a step. The default
//! ([`default_day_curve`]) runs from a night trough of 15 % of the peak through a morning ramp
//! with a step at 09:00 (50 % → 85 %: the office opens) to a plateau at 100 % from 11:00 to
//! 17:00, and back down in the evening. Requests are drawn by block resampling: blocks of
//! `block_s` seconds of consecutive trace rows (their gaps and token counts, so the trace's own
//! burstiness stays), each from a random row drawn with the scenario's seed, with every gap
//! stretched by `trace mean rate / (peak × curve now)`.
//!
//! **Gateway** (as `gateway/mod.rs` does it): a request goes to the ready, non-draining
//! replica with the fewest in flight below `max_concurrency_per_replica`; when every one is at
//! the bound it waits in a FIFO queue of `max(32 × ready, 64)` places for at most 30 s; a full
//! queue or a 30 s wait is a 503. The gateway records each answer's latency into the same
//! [`Traffic`] the live autoscaler reads (503s too, as errors, as the gateway does).
//!
//! **Latency** is the time to the first token (TTFT), from arrival at the gateway to the first
//! generated token: queue wait, then the replica's fixed cost, the prompt's prefill and one
//! decode step, from `switchyard_core::serving` (the model emulator's timing). It is the one
//! latency of the report, of the target and of what the simulated gateway records (the live
//! gateway records the first byte of the answer, which for a streamed answer comes before the
//! first token; see the bench's notes in BENCHMARKS.md). A request holds its replica's slot
//! until its last token.
//!
//! **Replicas** take `startup_s` (a model load) from launch to ready and cost the pool's price
//! per replica-hour from launch to stop. Which to start and stop is the live reconciler's rule
//! (`rules::replicas::decide`: extra ones not ready first, then the newest); a stopped replica
//! drains: no new requests, stopped when its last request ends.
//!
//! **Policies**, on the same arrivals, seed and start-up time:
//! - `fixed`: a constant count, ready all day: the smallest count that keeps 99 % of the peak
//!   hour's requests under the target (searched), or `fixed_replicas`;
//! - `rps`: SkyPilot's and dstack's rule, `⌈rps / target⌉` held for the same up/down delays:
//!   the same [`Scaler`] and [`autoscale::recommend`] with a [`Targets`] that has only
//!   `rps_per_replica`. The target is `rps_target_per_replica`, or measured: the highest
//!   constant rate at which ONE replica behind the gateway keeps 99 % of requests under the
//!   latency target (found by search, the same way for every trace);
//! - `switchyard`: the live rule, fed each second exactly as `control/services.rs` feeds it:
//!   `span_s`, the window's rps, the span's requests, rps, p95, mean latency, queue depth,
//!   requests held and the p95 of the seconds' peaks at the gateway, the schedule's minimum,
//!   `recommend`, `step`. The simulated gateway reports what the live meter
//!   (`gateway/meter.rs`) counts: the integral of requests held each second, and the most at
//!   the gateway at once — held plus queued when a request joins the queue, held when one is
//!   dispatched, and what is still held when the second closes.
//!
//! **Batch work.** The engine in `core::sim` has a fixed on-prem capacity, so replicas are not
//! coupled into it request by request: when a service's pool is on-prem, the most replicas its
//! chosen policy held at once during the day (its peak, with starting and draining ones) are
//! taken out of that pool's nodes for the whole batch replay. That is conservative — at night
//! the GPUs the service gives back are not lent to batch work in this replay.

use anyhow::{Context, anyhow, bail};
use serde::{Deserialize, Serialize};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::path::Path;
use std::time::Duration;
use switchyard_core::serving::{ReplicaQueue, ServingModel};
use switchyard_core::sim::World;
use switchyard_core::sim::rng::SplitMix64;
use switchyard_core::{JobId, Money, PoolId, Timestamp};
use switchyard_protocol::api::{
    Priority, ReplicaRange, ResourceSpec, ScalingSpec, ScheduleRule, ServiceSpec,
};
use uuid::Uuid;

use super::report::percentile;
use super::svg::{Series, line_chart};
use super::trace::trace_text;
use crate::gateway::traffic::Traffic;
use crate::rules::autoscale::{self, Measured, Scaler, Targets};
use crate::rules::replicas::Seen;
use crate::rules::{self, service};

/// The simulated day starts at 2017-10-02T00:00:00Z, a Monday, so weekday schedules apply.
pub const DAY_START_S: i64 = super::scenario::EPOCH_S + 86_400;
const DAY_US: u64 = 86_400_000_000;
/// The gateway's queue: places per ready replica, at least [`QUEUE_MIN`], and the longest wait.
const QUEUE_PER_REPLICA: usize = crate::gateway::QUEUE_PER_REPLICA;
const QUEUE_MIN: usize = crate::gateway::QUEUE_MIN;
const QUEUE_WAIT_US: u64 = 30_000_000;
/// The share of requests under the target that counts as meeting it (the goal).
pub const MEET_SHARE: f64 = 0.99;
/// Reaction time: the p95 is read over this sliding window of arrivals…
pub const SLIDING_S: u64 = 60;
/// …for this long after the load step.
pub const STEP_WATCH_S: u64 = 1800;
/// How long each measurement of one replica's sustainable rate runs.
const SUSTAIN_RUN_S: f64 = 1800.0;
/// The largest fixed count searched.
const FIXED_SEARCH_MAX: u32 = 512;

/// One `[[services]]` entry of a scenario.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceScenario {
    pub name: String,
    /// An Azure LLM inference trace (CSV, plain or gzip), read from the working directory.
    pub trace: String,
    /// The peak arrival rate (requests per second at curve share 1.0)…
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_rps: Option<f64>,
    /// …or the peak as this many replicas' sustainable rate (measured as for the `rps`
    /// policy's target), so that traces of different weights load the same number of replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_load_replicas: Option<f64>,
    /// `[hour, share of peak]` points, hours 0 to 24 (UTC), linear between.
    #[serde(default = "default_day_curve")]
    pub day_curve: Vec<[f64; 2]>,
    /// Seconds of consecutive trace rows per resampled block.
    #[serde(default = "default_block_s")]
    pub block_s: f64,
    /// Launch to ready, per replica.
    #[serde(default = "default_startup_s")]
    pub startup_s: u32,
    /// Resolved against the scenario's pools: an on-prem pool of this model, else the
    /// cheapest cloud pool of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_model: Option<String>,
    /// The price of a replica-hour; overrides the pool's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usd_per_replica_hour: Option<f64>,
    #[serde(default = "default_gpus")]
    pub gpus_per_replica: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<Priority>,
    /// Whose replicas the batch replay reserves on-prem.
    #[serde(default)]
    pub policy: PolicyName,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<ReplicaRange>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scaling: Option<ScalingSpec>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub schedule: Vec<ScheduleRule>,
    /// The `fixed` policy's count; searched when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fixed_replicas: Option<u32>,
    /// The `rps` policy's target per replica; measured when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rps_target_per_replica: Option<f64>,
    /// The replica's timing; each field defaults to `ServingModel::DEFAULT`'s.
    #[serde(default)]
    pub serving: Serving,
}

/// Overrides of [`ServingModel::DEFAULT`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Serving {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill_us_per_token: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decode_us_per_token: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decode_growth_us_per_peer: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_us: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slots: Option<u32>,
}

impl Serving {
    pub fn model(&self) -> ServingModel {
        let d = ServingModel::DEFAULT;
        ServingModel {
            prefill_us_per_token: self.prefill_us_per_token.unwrap_or(d.prefill_us_per_token),
            decode_us_per_token: self.decode_us_per_token.unwrap_or(d.decode_us_per_token),
            decode_growth_us_per_peer: self
                .decode_growth_us_per_peer
                .unwrap_or(d.decode_growth_us_per_peer),
            base_us: self.base_us.unwrap_or(d.base_us),
            slots: self.slots.unwrap_or(d.slots),
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyName {
    Fixed,
    Rps,
    #[default]
    Switchyard,
}

/// The default day curve (our assumption; see the module's documentation).
pub fn default_day_curve() -> Vec<[f64; 2]> {
    vec![
        [0.0, 0.15],
        [6.0, 0.15],
        [9.0, 0.5],
        [9.0, 0.85],
        [11.0, 1.0],
        [17.0, 1.0],
        [22.0, 0.3],
        [24.0, 0.15],
    ]
}

fn default_block_s() -> f64 {
    300.0
}

fn default_startup_s() -> u32 {
    90
}

fn default_gpus() -> u32 {
    1
}

impl ServiceScenario {
    /// The spec the live broker would hold for this service (its replicas, scaling and
    /// schedule; the command is a stand-in).
    pub fn spec(&self) -> ServiceSpec {
        ServiceSpec {
            name: self.name.clone(),
            team: "simulated".into(),
            project: None,
            command: vec!["model-emulator".into()],
            env: BTreeMap::new(),
            resources: ResourceSpec {
                gpus: i64::from(self.gpus_per_replica),
                gpu_models: self.gpu_model.iter().cloned().collect(),
                accelerator: None,
                min_gpu_memory_gb: None,
                cpus: None,
                memory_gb: None,
                nodes: None,
            },
            priority: self.priority,
            replicas: self.replicas.clone(),
            scaling: self.scaling.clone(),
            schedule: self.schedule.clone(),
            readiness: None,
            callers: Vec::new(),
            regions: Vec::new(),
            max_latency_ms: None,
            spot: None,
            max_price_per_hour: None,
            public: false,
        }
    }

    /// The latency target in milliseconds (required: the report counts requests under it).
    pub fn target_ms(&self) -> Option<f64> {
        self.scaling
            .as_ref()
            .and_then(|s| s.target_p95_latency_ms)
            .filter(|v| *v > 0)
            .map(|v| v as f64)
    }

    /// Checks the entry the way the services API checks a spec, plus the simulator's keys.
    pub fn validate(&self) -> anyhow::Result<()> {
        let n = &self.name;
        service::check_spec(&self.spec(), Timestamp::from_secs(DAY_START_S))
            .map_err(|e| anyhow!("services {n}: {e}"))?;
        if self.target_ms().is_none() {
            bail!("services {n}: scaling.target_p95_latency_ms is required (the latency target)");
        }
        match (self.peak_rps, self.peak_load_replicas) {
            (Some(v), None) | (None, Some(v)) if v.is_finite() && v > 0.0 => {}
            _ => bail!("services {n}: give one of peak_rps or peak_load_replicas, above 0"),
        }
        DayCurve::new(&self.day_curve).with_context(|| format!("services {n}: day_curve"))?;
        if !(self.block_s.is_finite() && self.block_s >= 1.0) {
            bail!(
                "services {n}: block_s must be at least 1, not {}",
                self.block_s
            );
        }
        if self.gpus_per_replica == 0 {
            bail!("services {n}: gpus_per_replica must be at least 1");
        }
        if self.gpu_model.is_none() && self.usd_per_replica_hour.is_none() {
            bail!("services {n}: give gpu_model or usd_per_replica_hour (the replica's price)");
        }
        if let Some(p) = self.usd_per_replica_hour
            && !(p.is_finite() && p >= 0.0)
        {
            bail!("services {n}: usd_per_replica_hour must be 0 or more, not {p}");
        }
        if let Some(r) = self.rps_target_per_replica
            && !(r.is_finite() && r > 0.0)
        {
            bail!("services {n}: rps_target_per_replica must be above 0, not {r}");
        }
        if self.fixed_replicas == Some(0) {
            bail!("services {n}: fixed_replicas must be at least 1");
        }
        if self.serving.slots == Some(0) {
            bail!("services {n}: serving.slots must be at least 1");
        }
        Ok(())
    }
}

/// The day curve: share of the peak rate by hour of the day.
#[derive(Clone, Debug, PartialEq)]
pub struct DayCurve {
    points: Vec<(f64, f64)>,
}

/// A rise of the curve at one instant.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct LoadStep {
    pub hour: f64,
    pub from: f64,
    pub to: f64,
}

impl DayCurve {
    pub fn new(points: &[[f64; 2]]) -> anyhow::Result<DayCurve> {
        if points.len() < 2 {
            bail!("needs at least two points");
        }
        let first = points[0][0];
        let last = points[points.len() - 1][0];
        if first != 0.0 || last != 24.0 {
            bail!("must run from hour 0 to hour 24, not {first} to {last}");
        }
        for w in points.windows(2) {
            if w[1][0] < w[0][0] {
                bail!("hours must not decrease ({} after {})", w[1][0], w[0][0]);
            }
        }
        if let Some(p) = points.iter().find(|p| !(p[1].is_finite() && p[1] > 0.0)) {
            bail!("shares must be above 0 (hour {}: {})", p[0], p[1]);
        }
        Ok(DayCurve {
            points: points.iter().map(|p| (p[0], p[1])).collect(),
        })
    }

    /// A flat curve: the same rate all day.
    pub fn flat() -> DayCurve {
        DayCurve {
            points: vec![(0.0, 1.0), (24.0, 1.0)],
        }
    }

    /// The share at `second` of the day (wrapping at midnight); at a step, the later point.
    pub fn at(&self, second: f64) -> f64 {
        let h = (second / 3600.0).rem_euclid(24.0);
        let i = self.points.partition_point(|p| p.0 <= h);
        if i == 0 {
            return self.points[0].1;
        }
        let a = self.points[i - 1];
        match self.points.get(i) {
            Some(b) if b.0 > a.0 => a.1 + (b.1 - a.1) * (h - a.0) / (b.0 - a.0),
            _ => a.1,
        }
    }

    /// The largest upward step, if any.
    pub fn step(&self) -> Option<LoadStep> {
        self.points
            .windows(2)
            .filter(|w| w[0].0 == w[1].0 && w[1].1 > w[0].1)
            .map(|w| LoadStep {
                hour: w[0].0,
                from: w[0].1,
                to: w[1].1,
            })
            .max_by(|a, b| (a.to - a.from).total_cmp(&(b.to - b.from)))
    }

    /// The start of the whole hour with the highest mean share (the earliest on a tie).
    pub fn peak_hour(&self) -> u32 {
        let mean = |h: u32| -> f64 {
            (0..60)
                .map(|m| self.at(f64::from(h) * 3600.0 + f64::from(m) * 60.0 + 30.0))
                .sum::<f64>()
        };
        (0..24)
            .max_by(|a, b| mean(*a).total_cmp(&mean(*b)).then(b.cmp(a)))
            .unwrap_or(0)
    }
}

/// An LLM trace: per row, seconds since the first row and the token counts.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LlmTrace {
    pub rows: Vec<(f64, u32, u32)>,
}

impl LlmTrace {
    /// Rows per second over the trace's span.
    pub fn mean_rps(&self) -> f64 {
        let span = self.rows.last().map_or(0.0, |r| r.0);
        if span > 0.0 {
            (self.rows.len() - 1) as f64 / span
        } else {
            0.0
        }
    }
}

/// The largest token count accepted in a row.
const MAX_TOKENS: u32 = 1_000_000;

/// Reads an Azure LLM inference trace file, gzip or plain.
pub fn read_azure(path: &Path) -> anyhow::Result<LlmTrace> {
    let raw = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let text = trace_text(raw).with_context(|| format!("in {}", path.display()))?;
    parse_azure(&text).with_context(|| format!("in {}", path.display()))
}

/// Parses the Azure trace's CSV (`TIMESTAMP,ContextTokens,GeneratedTokens`); rows are sorted
/// by time. At least two rows with distinct times are needed.
pub fn parse_azure(text: &str) -> anyhow::Result<LlmTrace> {
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(true)
        .from_reader(text.as_bytes());
    let header = reader.headers().context("reading the header")?.clone();
    let column = |name: &str| {
        header
            .iter()
            .position(|h| h.trim() == name)
            .ok_or_else(|| anyhow!("line 1: {name} is missing from the header"))
    };
    let (ti, ci, gi) = (
        column("TIMESTAMP")?,
        column("ContextTokens")?,
        column("GeneratedTokens")?,
    );
    let mut rows: Vec<(chrono::NaiveDateTime, u32, u32)> = Vec::new();
    for (i, record) in reader.records().enumerate() {
        let line = i + 2;
        let r = record.with_context(|| format!("line {line}"))?;
        let field = |k: usize, name: &str| {
            r.get(k)
                .map(str::trim)
                .ok_or_else(|| anyhow!("line {line}: {name} is missing"))
        };
        let at =
            chrono::NaiveDateTime::parse_from_str(field(ti, "TIMESTAMP")?, "%Y-%m-%d %H:%M:%S%.f")
                .with_context(|| format!("line {line}: TIMESTAMP"))?;
        let tokens = |k: usize, name: &str| -> anyhow::Result<u32> {
            let v: u32 = field(k, name)?
                .parse()
                .with_context(|| format!("line {line}: {name}"))?;
            if v > MAX_TOKENS {
                bail!("line {line}: {name} {v} is above {MAX_TOKENS}");
            }
            Ok(v)
        };
        rows.push((
            at,
            tokens(ci, "ContextTokens")?,
            tokens(gi, "GeneratedTokens")?,
        ));
    }
    rows.sort_by_key(|r| r.0);
    let (Some(first), Some(last)) = (rows.first(), rows.last()) else {
        bail!("the trace has no rows");
    };
    if rows.len() < 2 || last.0 <= first.0 {
        bail!("the trace needs at least two rows at different times");
    }
    let t0 = first.0;
    Ok(LlmTrace {
        rows: rows
            .iter()
            .map(|(at, c, g)| {
                let us = (*at - t0).num_microseconds().unwrap_or(i64::MAX);
                (us as f64 / 1e6, *c, *g)
            })
            .collect(),
    })
}

/// One request: when it reaches the gateway (µs since the day's start) and its tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arrival {
    pub at_us: u64,
    pub prompt: u32,
    pub output: u32,
}

/// Arrivals from `from_s` to `to_s` (seconds of the day) at `peak_rps × curve`, by block
/// resampling of the trace with `seed` (see the module's documentation).
pub fn arrivals(
    trace: &LlmTrace,
    curve: &DayCurve,
    peak_rps: f64,
    from_s: f64,
    to_s: f64,
    block_s: f64,
    seed: u64,
) -> Vec<Arrival> {
    let rows = &trace.rows;
    let mean = trace.mean_rps();
    let mut out = Vec::new();
    if rows.len() < 2 || mean <= 0.0 || peak_rps.is_nan() || peak_rps <= 0.0 {
        return out;
    }
    let mut rng = SplitMix64::stream(seed, 0x5e41);
    let last = rows.len() - 1;
    let pick = |rng: &mut SplitMix64| (rng.next_u64() % last as u64) as usize;
    let mut i = pick(&mut rng);
    let mut left = block_s;
    let mut t = from_s;
    loop {
        if i >= last {
            i = pick(&mut rng);
            left = block_s;
        }
        let (a, b) = (rows[i], rows[i + 1]);
        let gap = (b.0 - a.0).max(0.0);
        let rate = peak_rps * curve.at(t);
        t += gap * mean / rate;
        if t >= to_s {
            break;
        }
        out.push(Arrival {
            at_us: (t * 1e6) as u64,
            prompt: b.1,
            output: b.2,
        });
        i += 1;
        left -= gap;
        if left <= 0.0 {
            i = pick(&mut rng);
            left = block_s;
        }
    }
    out
}

/// How replica counts are decided.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Policy {
    /// This many, ready all along.
    Fixed(u32),
    /// `⌈rps / target⌉` through the live rule's delays.
    Rps(f64),
    /// The live rule.
    Switchyard,
}

impl Policy {
    pub fn label(&self) -> String {
        match self {
            Policy::Fixed(n) => format!("fixed ({n})"),
            Policy::Rps(r) => format!("rps ({r:.2}/replica)"),
            Policy::Switchyard => "switchyard".into(),
        }
    }

    pub fn key(&self) -> &'static str {
        match self {
            Policy::Fixed(_) => "fixed",
            Policy::Rps(_) => "rps",
            Policy::Switchyard => "switchyard",
        }
    }
}

/// What a run needs besides the arrivals and the policy.
#[derive(Clone, Debug)]
pub struct Setup {
    pub spec: ServiceSpec,
    pub model: ServingModel,
    pub startup_us: u64,
}

impl Setup {
    fn max_concurrency(&self) -> Option<u32> {
        self.spec
            .scaling
            .as_ref()
            .and_then(|s| s.max_concurrency_per_replica)
            .and_then(|v| u32::try_from(v).ok())
            .filter(|v| *v > 0)
    }
}

struct Replica {
    launched_us: u64,
    ready: bool,
    draining: bool,
    stopped_us: Option<u64>,
    in_flight: u32,
    queue: ReplicaQueue,
}

impl Replica {
    fn active(&self) -> bool {
        self.stopped_us.is_none() && !self.draining
    }
    fn routable(&self) -> bool {
        self.active() && self.ready
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Ready(usize),
    FirstToken { latency_us: u64 },
    Finish { replica: usize },
}

/// How the gateway took a request: the anatomy of misses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Served {
    /// Dispatched on arrival: a miss is the replica's own time (a long prompt, a full batch).
    #[default]
    AtOnce,
    /// Waited in the queue while no replica was starting: the rule had not asked for more.
    Waited,
    /// Waited in the queue while a replica was starting: the rule had asked, start-up is slow.
    WaitedStarting,
    /// A 503: the queue was full, or the wait reached 30 s.
    Refused,
}

/// One run's outcome.
#[derive(Clone, Debug, Default)]
pub struct RunOut {
    /// Per arrival: its time to first token, or `None` when the gateway answered 503.
    pub ttft_us: Vec<Option<u64>>,
    /// Per arrival: how the gateway took it.
    pub served: Vec<Served>,
    /// Replica time billed within the run, launch to stop.
    pub replica_us: u64,
    /// The most replicas held at once (starting, ready and draining).
    pub peak_held: u32,
    /// How often the desired count changed.
    pub changes: u32,
    /// Replicas added to the desired count, by the signal that asked for them.
    pub rises: BTreeMap<String, u32>,
    /// Per second of the run: (desired, ready).
    pub timeline: Vec<(u32, u32)>,
}

fn ts(us: u64) -> Timestamp {
    Timestamp::from_secs(DAY_START_S).plus_millis((us / 1000) as i64)
}

/// Replays `arrivals` (sorted, within `from_us..to_us`) under `policy`. Ticks every whole
/// second; requests still in service at `to_us` finish, but billing stops there.
pub fn run_policy(
    setup: &Setup,
    arrivals: &[Arrival],
    policy: Policy,
    from_us: u64,
    to_us: u64,
) -> RunOut {
    let spec = &setup.spec;
    let model = setup.model;
    let conc = setup.max_concurrency();
    let base = Targets::of(spec);
    let targets = match policy {
        Policy::Rps(r) => Targets {
            p95_ms: None,
            rps_per_replica: Some(r),
            max_concurrency: None,
            ..base
        },
        _ => base,
    };
    let traffic = Traffic::default();
    let id = Uuid::from_u128(0x005e_41ce);
    let mut scaler = Scaler::default();
    let mut replicas: Vec<Replica> = Vec::new();
    let mut heap: BinaryHeap<Reverse<(u64, u64, Event)>> = BinaryHeap::new();
    let mut seq = 0u64;
    let mut push = |heap: &mut BinaryHeap<Reverse<(u64, u64, Event)>>, at: u64, e: Event| {
        seq += 1;
        heap.push(Reverse((at, seq, e)));
    };
    let mut queue: VecDeque<usize> = VecDeque::new();
    let mut out = RunOut {
        ttft_us: vec![None; arrivals.len()],
        served: vec![Served::AtOnce; arrivals.len()],
        ..RunOut::default()
    };
    let new_replica = |at: u64, ready: bool| Replica {
        launched_us: at,
        ready,
        draining: false,
        stopped_us: None,
        in_flight: 0,
        queue: ReplicaQueue::new(model),
    };
    let mut desired = match policy {
        Policy::Fixed(n) => n,
        Policy::Rps(_) => targets.min,
        _ => service::initial_desired(spec, ts(from_us)).0,
    };
    for _ in 0..desired {
        replicas.push(new_replica(from_us, true));
    }
    let mut next_tick = from_us.div_ceil(1_000_000) * 1_000_000;
    let mut next_arrival = 0usize;
    // The live gateway's integral of requests held on replicas (`TrafficSecond::busy_us`):
    // summed between events, handed to the traffic each second; and its peak at the gateway
    // (`TrafficSecond::peak_in_system`), counted as the meter counts it.
    let (mut busy_us, mut busy_since) = (0u64, from_us);
    let (mut held_now, mut peak) = (0u64, 0u64);
    loop {
        let t_event = heap.peek().map(|Reverse((at, _, _))| *at);
        let t_expiry = queue
            .front()
            .map(|&k| arrivals[k].at_us.saturating_add(QUEUE_WAIT_US));
        let t_tick = (next_tick < to_us).then_some(next_tick);
        let t_arrival = arrivals.get(next_arrival).map(|a| a.at_us);
        let Some(now) = [t_event, t_expiry, t_tick, t_arrival]
            .into_iter()
            .flatten()
            .min()
        else {
            break;
        };
        busy_us = busy_us.saturating_add(held_now.saturating_mul(now.saturating_sub(busy_since)));
        busy_since = now;
        let mut dispatch = false;
        if t_event == Some(now) {
            let Some(Reverse((_, _, event))) = heap.pop() else {
                break;
            };
            match event {
                Event::Ready(r) => {
                    if let Some(rep) = replicas.get_mut(r)
                        && rep.stopped_us.is_none()
                    {
                        rep.ready = true;
                        dispatch = true;
                    }
                }
                Event::FirstToken { latency_us } => {
                    traffic.record(id, None, ts(now), Duration::from_micros(latency_us), false);
                }
                Event::Finish { replica } => {
                    if let Some(rep) = replicas.get_mut(replica) {
                        rep.in_flight = rep.in_flight.saturating_sub(1);
                        held_now = held_now.saturating_sub(1);
                        if rep.draining && rep.in_flight == 0 && rep.stopped_us.is_none() {
                            rep.stopped_us = Some(now);
                        }
                    }
                    dispatch = true;
                }
            }
        } else if t_expiry == Some(now) {
            if let Some(k) = queue.pop_front() {
                traffic.record(
                    id,
                    None,
                    ts(now),
                    Duration::from_micros(QUEUE_WAIT_US),
                    true,
                );
                out.ttft_us[k] = None;
                out.served[k] = Served::Refused;
            }
        } else if t_tick == Some(now) {
            next_tick += 1_000_000;
            traffic.busy(
                id,
                ts(now.saturating_sub(1)),
                Duration::from_micros(busy_us),
            );
            traffic.in_system(id, ts(now.saturating_sub(1)), peak.max(held_now));
            busy_us = 0;
            peak = held_now;
            let ready = replicas.iter().filter(|r| r.routable()).count() as u32;
            if !matches!(policy, Policy::Fixed(_)) {
                let at = ts(now);
                let span = scaler.span_s(&targets, ready, at);
                let window = traffic.service(id, at, targets.window_s);
                let recent = traffic.service(id, at, span);
                let measured = Measured {
                    rps: window.rps,
                    span_requests: recent.requests,
                    span_rps: recent.rps,
                    span_p95_ms: recent.p95_ms,
                    span_mean_ms: recent.mean_ms,
                    span_queued: recent.queued_mean,
                    span_in_flight: recent.in_flight_mean,
                    span_peak: recent.peak_quantile(autoscale::PEAK_QUANTILE),
                    ready,
                };
                let schedule = match policy {
                    Policy::Rps(_) => None,
                    _ => service::schedule_minimum(spec, at),
                };
                let schedule_min = schedule.as_ref().map_or(0, |(n, _)| *n);
                let rec = autoscale::recommend(&targets, &measured, schedule);
                if let Some(r) = scaler.step(&targets, rec, desired, schedule_min, at) {
                    if r.n != desired {
                        out.changes += 1;
                    }
                    if r.n > desired {
                        *out.rises.entry(signal_of(&r.reason)).or_default() += r.n - desired;
                    }
                    desired = r.n;
                }
            }
            // Reconcile by the live reconciler's rule (`rules::replicas::decide`): start the
            // missing replicas, stop extra ones (not ready first, then the newest), which
            // drain. Replica `i` is job `i + 1`: ids grow in creation order, as UUIDv7s do.
            let live: Vec<Seen> = replicas
                .iter()
                .enumerate()
                .filter(|(_, r)| r.stopped_us.is_none())
                .map(|(i, r)| Seen {
                    job: JobId(Uuid::from_u128(i as u128 + 1)),
                    version: 1,
                    ready: r.ready,
                    stopping: r.draining,
                    node: None,
                    burst: false,
                    doomed: false,
                })
                .collect();
            let decision = rules::replicas::decide(1, desired, false, false, &live);
            for _ in 0..decision.start {
                let r = replicas.len();
                replicas.push(new_replica(now, setup.startup_us == 0));
                push(&mut heap, now + setup.startup_us, Event::Ready(r));
            }
            for (job, _) in decision.stop {
                let i = (job.0.as_u128() as usize).saturating_sub(1);
                if let Some(rep) = replicas.get_mut(i) {
                    rep.draining = true;
                    if rep.in_flight == 0 {
                        rep.stopped_us = Some(now);
                    }
                }
            }
            let live = replicas.iter().filter(|r| r.stopped_us.is_none()).count() as u32;
            out.peak_held = out.peak_held.max(live);
            out.timeline.push((desired, ready));
        } else {
            let k = next_arrival;
            next_arrival += 1;
            queue.push_back(k);
            let ready = replicas.iter().filter(|r| r.routable()).count();
            let cap = (ready * QUEUE_PER_REPLICA).max(QUEUE_MIN);
            // The request itself is in the queue: it waits only when it did not go at once.
            if queue.len() > 1 || !has_room(&replicas, conc) {
                if queue.len() > cap {
                    queue.pop_back();
                    traffic.record(id, None, ts(now), Duration::ZERO, true);
                    out.served[k] = Served::Refused;
                    continue;
                }
                out.served[k] = if replicas.iter().any(|r| r.active() && !r.ready) {
                    Served::WaitedStarting
                } else {
                    Served::Waited
                };
                traffic.queued(id, ts(now), queue.len());
                peak = peak.max(held_now + queue.len() as u64);
            }
            dispatch = true;
        }
        if dispatch {
            while let Some(&k) = queue.front() {
                let Some(r) = free_replica(&replicas, conc) else {
                    break;
                };
                queue.pop_front();
                let a = arrivals[k];
                let rep = &mut replicas[r];
                rep.in_flight += 1;
                held_now += 1;
                peak = peak.max(held_now);
                let got = rep.queue.admit(now, a.prompt, a.output);
                let first = got
                    .start_us
                    .saturating_add(model.base_us)
                    .saturating_add(model.prefill_us(a.prompt))
                    .saturating_add(model.decode_step_us(got.running))
                    .min(got.finish_us);
                let latency_us = first.saturating_sub(a.at_us);
                out.ttft_us[k] = Some(latency_us);
                push(&mut heap, first, Event::FirstToken { latency_us });
                push(&mut heap, got.finish_us, Event::Finish { replica: r });
            }
        }
    }
    out.replica_us = replicas
        .iter()
        .map(|r| {
            r.stopped_us
                .unwrap_or(to_us)
                .min(to_us)
                .saturating_sub(r.launched_us)
        })
        .sum();
    out
}

/// Which signal a recommendation's reason (`rules::autoscale::recommend`) comes from.
fn signal_of(reason: &str) -> String {
    let signal = if reason.contains("requests at the gateway") {
        "load"
    } else if reason.contains("requests queued") {
        "queue"
    } else if reason.starts_with("p95 ") {
        "latency"
    } else if reason.contains("req/s at a target") {
        "rate"
    } else if reason.starts_with("replicas.min") {
        "min"
    } else {
        "schedule"
    };
    signal.to_string()
}

fn has_room(replicas: &[Replica], conc: Option<u32>) -> bool {
    free_replica(replicas, conc).is_some()
}

/// The routable replica with the fewest in flight below the bound (the lowest index on a tie).
fn free_replica(replicas: &[Replica], conc: Option<u32>) -> Option<usize> {
    replicas
        .iter()
        .enumerate()
        .filter(|(_, r)| r.routable() && conc.is_none_or(|c| r.in_flight < c))
        .min_by_key(|(i, r)| (r.in_flight, *i))
        .map(|(i, _)| i)
}

/// Latency percentiles in milliseconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
}

/// One policy's figures for one service.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PolicyReport {
    pub policy: String,
    pub requests: usize,
    /// Answered with a first token within the target, over all requests (503s count as misses).
    pub under_target_fraction: f64,
    pub misses: usize,
    /// Answered requests' time to first token.
    pub ttft_ms: Percentiles,
    /// 503s: the queue was full, or a request waited 30 s.
    pub refused: usize,
    pub replica_hours: f64,
    pub cost_usd: f64,
    pub peak_replicas: u32,
    pub mean_replicas: f64,
    pub desired_changes: u32,
    /// Replicas added to the desired count over the day, by the signal that asked for them.
    pub rises_by_signal: BTreeMap<String, u32>,
    /// From the load step to the end of the last second, within [`STEP_WATCH_S`], at which
    /// the p95 over the last [`SLIDING_S`] seconds of arrivals was above the target (0: never).
    pub reaction_s: Option<f64>,
    /// Misses among requests that arrived in the [`STEP_WATCH_S`] after the step, and the rest.
    pub misses_after_step: usize,
    pub misses_elsewhere: usize,
    /// Misses by how the gateway took them ([`Served`]): answered slow after no wait (the
    /// replica's own time), after a wait while no replica was starting, after a wait while
    /// one was; and 503s.
    pub misses_at_once: usize,
    pub misses_waited: usize,
    pub misses_waited_starting: usize,
}

/// One service's report: its assumptions and every policy side by side.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ServiceReport {
    pub name: String,
    pub trace: String,
    pub trace_rows: usize,
    pub trace_mean_rps: f64,
    /// Always "time to first token".
    pub latency: String,
    pub target_ms: f64,
    pub peak_rps: f64,
    /// One replica's highest rate with 99 % under the target (measured), or the given target.
    pub rps_target_per_replica: f64,
    pub rps_target_measured: bool,
    pub fixed_replicas: u32,
    pub fixed_searched: bool,
    pub load_step: Option<LoadStep>,
    pub startup_s: u32,
    pub pool: String,
    pub usd_per_replica_hour: f64,
    pub priority: String,
    pub policies: Vec<PolicyReport>,
    /// `policies`' figures of the policy whose replicas the batch replay reserves.
    pub reserved_by: String,
    /// On-prem nodes taken out of `pool` for the batch replay (0 for a cloud pool).
    pub onprem_nodes_reserved: u32,
    pub goals: Vec<Goal>,
    /// `(file name, SVG)`: ready replicas and the p95 over the day, per policy.
    #[serde(skip)]
    pub plots: Vec<(String, String)>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Goal {
    pub goal: String,
    pub result: String,
    pub met: bool,
}

/// The price and the pool of a service's replicas.
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    pub price: Money,
    pub pool: String,
    /// `(pool, GPUs per node)` when the pool is on-prem.
    pub onprem: Option<(PoolId, u32)>,
}

/// Resolves a service's price and pool against the world's pools (see [`ServiceScenario`]).
pub fn place(svc: &ServiceScenario, world: &World) -> anyhow::Result<Placement> {
    let gpus = i64::from(svc.gpus_per_replica.max(1));
    let matching = |p: &switchyard_core::Pool| {
        svc.gpu_model
            .as_deref()
            .is_some_and(|m| p.gpu_model.eq_ignore_ascii_case(m))
            && p.gpus_per_node >= svc.gpus_per_replica
    };
    let per_replica = |p: &switchyard_core::Pool| {
        Money::from_micros(
            p.on_demand_per_hour.micros().saturating_mul(gpus) / i64::from(p.gpus_per_node.max(1)),
        )
    };
    let onprem = world
        .pools
        .iter()
        .find(|p| !p.pool.launchable && matching(&p.pool));
    let cloud = world
        .pools
        .iter()
        .filter(|p| p.pool.launchable && matching(&p.pool))
        .min_by_key(|p| (per_replica(&p.pool), p.pool.id.clone()));
    let chosen = onprem.or(cloud);
    let price = match svc.usd_per_replica_hour {
        Some(usd) => Money::from_dollars(usd)
            .ok_or_else(|| anyhow!("services {}: bad usd_per_replica_hour", svc.name))?,
        None => match chosen {
            Some(p) => per_replica(&p.pool),
            None => bail!(
                "services {}: no pool of gpu_model {:?} with {} GPUs per node",
                svc.name,
                svc.gpu_model,
                svc.gpus_per_replica
            ),
        },
    };
    Ok(Placement {
        price,
        pool: chosen.map_or_else(
            || "(priced by the scenario)".into(),
            |p| p.pool.id.to_string(),
        ),
        onprem: chosen
            .filter(|p| !p.pool.launchable)
            .map(|p| (p.pool.id.clone(), p.pool.gpus_per_node)),
    })
}

fn share_under(out: &RunOut, target_us: u64) -> f64 {
    let n = out.ttft_us.len();
    if n == 0 {
        return 1.0;
    }
    let ok = out
        .ttft_us
        .iter()
        .filter(|t| t.is_some_and(|t| t <= target_us))
        .count();
    ok as f64 / n as f64
}

/// The highest constant rate at which one replica keeps [`MEET_SHARE`] of requests under
/// `target_us` (the `rps` policy's target when none is given).
pub fn sustainable_rps(
    setup: &Setup,
    trace: &LlmTrace,
    target_us: u64,
    block_s: f64,
    seed: u64,
) -> f64 {
    let flat = DayCurve::flat();
    let meets = |rate: f64| {
        let a = arrivals(trace, &flat, rate, 0.0, SUSTAIN_RUN_S, block_s, seed);
        let out = run_policy(setup, &a, Policy::Fixed(1), 0, (SUSTAIN_RUN_S * 1e6) as u64);
        share_under(&out, target_us) >= MEET_SHARE
    };
    let (mut lo, mut hi) = (0.0, 0.25);
    while meets(hi) && hi < 10_000.0 {
        lo = hi;
        hi *= 2.0;
    }
    for _ in 0..12 {
        let mid = (lo + hi) / 2.0;
        if meets(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}

/// The smallest fixed count that keeps [`MEET_SHARE`] of the peak hour's requests under
/// the target (at most [`FIXED_SEARCH_MAX`]).
pub fn fixed_at_peak(setup: &Setup, day: &[Arrival], curve: &DayCurve, target_us: u64) -> u32 {
    let from = u64::from(curve.peak_hour()) * 3_600_000_000;
    let to = from + 3_600_000_000;
    let lo_i = day.partition_point(|a| a.at_us < from);
    let hi_i = day.partition_point(|a| a.at_us < to);
    let hour = &day[lo_i..hi_i];
    let meets = |n: u32| {
        share_under(
            &run_policy(setup, hour, Policy::Fixed(n), from, to),
            target_us,
        ) >= MEET_SHARE
    };
    let (mut lo, mut hi) = (0u32, 1u32);
    while !meets(hi) {
        lo = hi;
        hi = (hi * 2).min(FIXED_SEARCH_MAX);
        if hi == FIXED_SEARCH_MAX {
            break;
        }
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if meets(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    hi
}

/// The RPS autoscaler's highest per-replica target at which it runs at least `hours`
/// replica-hours (a higher target runs fewer replicas), found by bisection between a quarter
/// and eight times `from`, with its run; `None` when even the lowest target runs fewer.
fn rps_at_hours(setup: &Setup, day: &[Arrival], from: f64, hours: f64) -> Option<(f64, RunOut)> {
    let run = |r: f64| run_policy(setup, day, Policy::Rps(r), 0, DAY_US);
    let hours_of = |out: &RunOut| out.replica_us as f64 / 3.6e9;
    let (mut lo, mut hi) = (from / 4.0, from * 8.0);
    let mut best = {
        let out = run(lo);
        (hours_of(&out) >= hours).then_some((lo, out))?
    };
    let out = run(hi);
    if hours_of(&out) >= hours {
        return Some((hi, out));
    }
    for _ in 0..RPS_MATCH_STEPS {
        let mid = (lo + hi) / 2.0;
        let out = run(mid);
        if hours_of(&out) >= hours {
            lo = mid;
            best = (mid, out);
        } else {
            hi = mid;
        }
    }
    Some(best)
}

/// Bisection steps of [`rps_at_hours`]: the target to within 9 × `from` / 2^10.
const RPS_MATCH_STEPS: u32 = 10;

/// The report's figures for one run over the whole day.
pub fn summarize(
    policy: &Policy,
    day: &[Arrival],
    out: &RunOut,
    target_us: u64,
    step: Option<LoadStep>,
    price: Money,
) -> PolicyReport {
    let miss = |t: &Option<u64>| t.is_none_or(|t| t > target_us);
    let mut answered: Vec<f64> = out
        .ttft_us
        .iter()
        .flatten()
        .map(|t| *t as f64 / 1000.0)
        .collect();
    answered.sort_by(f64::total_cmp);
    let misses = out.ttft_us.iter().filter(|t| miss(t)).count();
    let missed_as = |how: Served| {
        out.ttft_us
            .iter()
            .zip(&out.served)
            .filter(|(t, s)| **s == how && miss(t))
            .count()
    };
    let (mut after, mut reaction) = (0, None);
    if let Some(s) = step {
        let from = (s.hour * 3_600_000_000.0) as u64;
        let to = from + STEP_WATCH_S * 1_000_000;
        let lo = day.partition_point(|a| a.at_us < from);
        let hi = day.partition_point(|a| a.at_us < to);
        after = out.ttft_us[lo..hi].iter().filter(|t| miss(t)).count();
        let mut last_breach: Option<u64> = None;
        for sec in 0..STEP_WATCH_S {
            let end = from + (sec + 1) * 1_000_000;
            let start = end.saturating_sub(SLIDING_S * 1_000_000).max(from);
            let i = day.partition_point(|a| a.at_us < start);
            let j = day.partition_point(|a| a.at_us < end);
            let mut w: Vec<f64> = out.ttft_us[i..j]
                .iter()
                .map(|t| t.map_or(f64::INFINITY, |t| t as f64))
                .collect();
            if w.is_empty() {
                continue;
            }
            w.sort_by(f64::total_cmp);
            if percentile(&w, 95.0) > target_us as f64 {
                last_breach = Some(sec + 1);
            }
        }
        reaction = Some(last_breach.map_or(0.0, |s| s as f64));
    }
    let hours = out.replica_us as f64 / 3.6e9;
    let cost = i128::from(price.micros()) * i128::from(out.replica_us) / 3_600_000_000;
    let seconds = out.timeline.len().max(1) as f64;
    PolicyReport {
        policy: policy.label(),
        requests: day.len(),
        under_target_fraction: if day.is_empty() {
            1.0
        } else {
            1.0 - misses as f64 / day.len() as f64
        },
        misses,
        ttft_ms: Percentiles {
            p50: percentile(&answered, 50.0),
            p95: percentile(&answered, 95.0),
            p99: percentile(&answered, 99.0),
        },
        refused: out.ttft_us.iter().filter(|t| t.is_none()).count(),
        replica_hours: hours,
        cost_usd: Money::from_micros(i64::try_from(cost).unwrap_or(i64::MAX)).as_dollars(),
        peak_replicas: out.peak_held,
        mean_replicas: out.replica_us as f64 / 1e6 / seconds,
        desired_changes: out.changes,
        rises_by_signal: out.rises.clone(),
        reaction_s: reaction,
        misses_after_step: after,
        misses_elsewhere: misses - after,
        misses_at_once: missed_as(Served::AtOnce),
        misses_waited: missed_as(Served::Waited),
        misses_waited_starting: missed_as(Served::WaitedStarting),
    }
}

/// Simulates one service's day under every policy. `world` prices its replicas.
pub fn simulate_service(
    svc: &ServiceScenario,
    trace: &LlmTrace,
    world: &World,
    seed: u64,
) -> anyhow::Result<ServiceReport> {
    svc.validate()?;
    let placement = place(svc, world)?;
    let curve = DayCurve::new(&svc.day_curve)?;
    let target_ms = svc.target_ms().unwrap_or(0.0);
    let target_us = (target_ms * 1000.0) as u64;
    let setup = Setup {
        spec: svc.spec(),
        model: svc.serving.model(),
        startup_us: u64::from(svc.startup_s) * 1_000_000,
    };
    let (rps_target, rps_measured) = match svc.rps_target_per_replica {
        Some(r) => (r, false),
        None => (
            sustainable_rps(&setup, trace, target_us, svc.block_s, seed),
            true,
        ),
    };
    if rps_target <= 0.0 {
        bail!(
            "services {}: one replica cannot keep {:.0} % of requests under {target_ms} ms at any \
             rate; raise the target",
            svc.name,
            MEET_SHARE * 100.0
        );
    }
    let peak_rps = match (svc.peak_rps, svc.peak_load_replicas) {
        (Some(r), _) => r,
        (None, Some(n)) => n * rps_target,
        (None, None) => 0.0,
    };
    let day = arrivals(trace, &curve, peak_rps, 0.0, 86_400.0, svc.block_s, seed);
    let (fixed, searched) = match svc.fixed_replicas {
        Some(n) => (n, false),
        None => (fixed_at_peak(&setup, &day, &curve, target_us), true),
    };
    let step = curve.step();
    let policies = [
        Policy::Fixed(fixed),
        Policy::Rps(rps_target),
        Policy::Switchyard,
    ];
    let mut reports = Vec::new();
    let mut reserve_peak = 0;
    let (mut ready_series, mut p95_series) = (Vec::new(), Vec::new());
    for p in policies {
        let out = run_policy(&setup, &day, p, 0, DAY_US);
        ready_series.push(Series {
            name: p.label(),
            points: out
                .timeline
                .chunks(60)
                .enumerate()
                .map(|(m, c)| {
                    let mean = c.iter().map(|d| f64::from(d.1)).sum::<f64>() / c.len() as f64;
                    (m as f64 / 60.0, mean)
                })
                .collect(),
        });
        p95_series.push(Series {
            name: p.label(),
            points: p95_by(&day, &out, PLOT_P95_S),
        });
        let chosen = matches!(
            (svc.policy, p),
            (PolicyName::Fixed, Policy::Fixed(_))
                | (PolicyName::Rps, Policy::Rps(_))
                | (PolicyName::Switchyard, Policy::Switchyard)
        );
        if chosen {
            reserve_peak = out.peak_held;
        }
        reports.push(summarize(&p, &day, &out, target_us, step, placement.price));
    }
    // The RPS autoscaler again, its per-replica target moved until it runs no fewer
    // replica-hours than Switchyard's: the comparison at equal hours the goal asks for.
    if let Some(sy) = reports.get(2)
        && let Some((r, out)) = rps_at_hours(&setup, &day, rps_target, sy.replica_hours)
    {
        let mut matched = summarize(
            &Policy::Rps(r),
            &day,
            &out,
            target_us,
            step,
            placement.price,
        );
        matched.policy = format!("rps ({r:.2}/replica, = hours)");
        reports.push(matched);
    }
    let nodes = placement.onprem.as_ref().map_or(0, |(_, per_node)| {
        (reserve_peak * svc.gpus_per_replica.max(1)).div_ceil((*per_node).max(1))
    });
    let goals = goals(&reports);
    let plots = vec![
        (
            format!("services_{}_replicas.svg", svc.name),
            line_chart(
                &format!("{}: ready replicas (per-minute mean)", svc.name),
                "hour of the day (UTC)",
                "replicas",
                &ready_series,
                false,
            ),
        ),
        (
            format!("services_{}_p95.svg", svc.name),
            line_chart(
                &format!(
                    "{}: p95 time to first token per {} min (503s count as misses), target {target_ms:.0} ms",
                    svc.name,
                    PLOT_P95_S / 60
                ),
                "hour of the day (UTC)",
                "ms (capped at 4 × target)",
                &p95_series
                    .into_iter()
                    .map(|s| Series {
                        name: s.name,
                        points: s
                            .points
                            .into_iter()
                            .map(|(x, y)| (x, y.min(4.0 * target_ms)))
                            .collect(),
                    })
                    .collect::<Vec<_>>(),
                false,
            ),
        ),
    ];
    Ok(ServiceReport {
        name: svc.name.clone(),
        trace: svc.trace.clone(),
        trace_rows: trace.rows.len(),
        trace_mean_rps: trace.mean_rps(),
        latency: "time to first token".into(),
        target_ms,
        peak_rps,
        rps_target_per_replica: rps_target,
        rps_target_measured: rps_measured,
        fixed_replicas: fixed,
        fixed_searched: searched,
        load_step: step,
        startup_s: svc.startup_s,
        pool: placement.pool,
        usd_per_replica_hour: placement.price.as_dollars(),
        priority: format!("{:?}", svc.priority.unwrap_or(Priority::Normal)).to_lowercase(),
        policies: reports,
        reserved_by: format!("{:?}", svc.policy).to_lowercase(),
        onprem_nodes_reserved: nodes,
        goals,
        plots,
    })
}

/// Seconds per point of the p95 plot.
const PLOT_P95_S: u64 = 300;

/// `(hour, p95 ms)` of the arrivals in each `step_s` of the day; a 503 counts as infinitely
/// slow (the plot caps it).
fn p95_by(day: &[Arrival], out: &RunOut, step_s: u64) -> Vec<(f64, f64)> {
    let mut points = Vec::new();
    let mut i = 0;
    let mut from = 0;
    while from < DAY_US {
        let to = from + step_s * 1_000_000;
        let j = i + day[i..].partition_point(|a| a.at_us < to);
        let mut w: Vec<f64> = out.ttft_us[i..j]
            .iter()
            .map(|t| t.map_or(f64::INFINITY, |t| t as f64 / 1000.0))
            .collect();
        if !w.is_empty() {
            w.sort_by(f64::total_cmp);
            points.push((from as f64 / 3.6e9, percentile(&w, 95.0)));
        }
        i = j;
        from = to;
    }
    points
}

/// The goals, read off the first three policies (fixed, rps, switchyard).
fn goals(r: &[PolicyReport]) -> Vec<Goal> {
    let (Some(fixed), Some(rps), Some(sy)) = (r.first(), r.get(1), r.get(2)) else {
        return Vec::new();
    };
    let share = fixed.replica_hours.max(f64::MIN_POSITIVE);
    let mut goals = vec![
        Goal {
            goal: "switchyard: at least 99 % under the target".into(),
            result: format!("{:.2} %", sy.under_target_fraction * 100.0),
            met: sy.under_target_fraction >= MEET_SHARE,
        },
        Goal {
            goal: "switchyard: at most 60 % of fixed provisioning's replica-hours".into(),
            result: format!("{:.1} %", sy.replica_hours / share * 100.0),
            met: sy.replica_hours <= 0.6 * fixed.replica_hours,
        },
        Goal {
            goal: "switchyard: fewer misses than rps at equal or fewer replica-hours".into(),
            result: format!(
                "{} vs {} misses; {:.1} vs {:.1} replica-hours",
                sy.misses, rps.misses, sy.replica_hours, rps.replica_hours
            ),
            met: sy.misses < rps.misses && sy.replica_hours <= rps.replica_hours,
        },
    ];
    // The same, against the RPS autoscaler whose target gives it Switchyard's hours or more.
    if let Some(matched) = r.get(3) {
        goals.push(Goal {
            goal: "switchyard: fewer misses than rps with its target set for equal hours".into(),
            result: format!(
                "{} vs {} misses; {:.1} vs {:.1} replica-hours",
                sy.misses, matched.misses, sy.replica_hours, matched.replica_hours
            ),
            met: sy.misses < matched.misses && sy.replica_hours <= matched.replica_hours,
        });
    }
    goals
}

/// The table `simulate` prints for a service.
pub fn table(s: &ServiceReport) -> String {
    let mut t = format!(
        "service {}: {} ({} rows, {:.2} req/s), peak {:.1} req/s, target: p95 time to first \
         token {:.0} ms, start-up {} s, ${:.2}/replica-hour on {}\n",
        s.name,
        s.trace,
        s.trace_rows,
        s.trace_mean_rps,
        s.peak_rps,
        s.target_ms,
        s.startup_s,
        s.usd_per_replica_hour,
        s.pool
    );
    t.push_str(&format!(
        "{:<26} {:>8} {:>9} {:>8} {:>8} {:>8} {:>7} {:>9} {:>9} {:>5} {:>9} {:>12}\n",
        "policy",
        "requests",
        "under tgt",
        "p50 ms",
        "p95 ms",
        "p99 ms",
        "503s",
        "replica-h",
        "cost $",
        "peak",
        "reaction",
        "miss step/rest"
    ));
    for p in &s.policies {
        t.push_str(&format!(
            "{:<26} {:>8} {:>8.2}% {:>8.0} {:>8.0} {:>8.0} {:>7} {:>9.1} {:>9.2} {:>5} {:>8} {:>12}\n",
            p.policy,
            p.requests,
            p.under_target_fraction * 100.0,
            p.ttft_ms.p50,
            p.ttft_ms.p95,
            p.ttft_ms.p99,
            p.refused,
            p.replica_hours,
            p.cost_usd,
            p.peak_replicas,
            p.reaction_s.map_or("-".into(), |r| format!("{r:.0} s")),
            format!("{}/{}", p.misses_after_step, p.misses_elsewhere),
        ));
    }
    for p in &s.policies {
        t.push_str(&format!(
            "  {} misses: {} answered slow without waiting, {} after a wait with no replica \
             starting, {} after a wait while replicas started, {} 503s\n",
            p.policy, p.misses_at_once, p.misses_waited, p.misses_waited_starting, p.refused
        ));
        if !p.rises_by_signal.is_empty() {
            let by: Vec<String> = p
                .rises_by_signal
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect();
            t.push_str(&format!(
                "  {} replicas added, by signal: {}\n",
                p.policy,
                by.join(", ")
            ));
        }
    }
    for g in &s.goals {
        t.push_str(&format!(
            "  goal: {} — {} ({})\n",
            g.goal,
            g.result,
            if g.met { "met" } else { "NOT met" }
        ));
    }
    t
}

/// Simulates every service of a scenario; returns the reports and, per on-prem pool, the
/// nodes to take out of it for the batch replay.
pub fn simulate_all(
    services: &[ServiceScenario],
    world: &World,
    seed: u64,
) -> anyhow::Result<(Vec<ServiceReport>, BTreeMap<PoolId, u32>)> {
    let mut reports = Vec::new();
    let mut reserve: BTreeMap<PoolId, u32> = BTreeMap::new();
    for svc in services {
        let trace = read_azure(Path::new(&svc.trace))
            .with_context(|| format!("services {}: trace", svc.name))?;
        let r = simulate_service(svc, &trace, world, seed)?;
        if let Some((pool, _)) = place(svc, world)?.onprem {
            *reserve.entry(pool).or_default() += r.onprem_nodes_reserved;
        }
        eprint!("{}", table(&r));
        reports.push(r);
    }
    Ok((reports, reserve))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::simulate::scenario::Scenario;

    /// One request every second for 100 s: 100 prompt tokens, 10 generated.
    fn even_trace() -> String {
        let mut s = String::from("TIMESTAMP,ContextTokens,GeneratedTokens\n");
        for i in 0..100 {
            s.push_str(&format!(
                "2023-11-16 18:{:02}:{:02}.0000000,100,10\n",
                i / 60,
                i % 60
            ));
        }
        s
    }

    /// A replica whose only cost is 1 ms per generated token, alone or batched.
    fn simple_model() -> ServingModel {
        ServingModel {
            prefill_us_per_token: 0,
            decode_us_per_token: 1_000,
            decode_growth_us_per_peer: 0,
            base_us: 0,
            slots: 16,
        }
    }

    fn svc(toml_scaling: &str) -> ServiceScenario {
        let text = format!(
            "[[services]]\nname = \"chat\"\ntrace = \"t.csv\"\npeak_rps = 1.0\n\
             usd_per_replica_hour = 1.5\nreplicas = {{ min = 1, max = 10 }}\n\
             scaling = {toml_scaling}\n"
        );
        Scenario::from_toml(&text)
            .expect("parses")
            .services
            .remove(0)
    }

    fn setup(s: &ServiceScenario, startup_s: u64) -> Setup {
        Setup {
            spec: s.spec(),
            model: simple_model(),
            startup_us: startup_s * 1_000_000,
        }
    }

    fn at(ms: u64, output: u32) -> Arrival {
        Arrival {
            at_us: ms * 1000,
            prompt: 0,
            output,
        }
    }

    #[test]
    fn scenarios_take_services_and_refuse_unknown_or_bad_keys() {
        let s = svc("{ target_p95_latency_ms = 500, max_concurrency_per_replica = 4 }");
        assert_eq!(s.name, "chat");
        assert_eq!(s.day_curve, default_day_curve());
        assert_eq!((s.startup_s, s.gpus_per_replica), (90, 1));
        assert_eq!(s.policy, PolicyName::Switchyard);
        assert_eq!(s.target_ms(), Some(500.0));
        let base = "[[services]]\nname = \"chat\"\ntrace = \"t.csv\"\npeak_rps = 1.0\n\
                    usd_per_replica_hour = 1.0\nscaling = { target_p95_latency_ms = 500 }\n";
        assert!(Scenario::from_toml(base).is_ok());
        for (extra, wanted) in [
            ("colour = \"red\"\n", "unknown field"),
            ("day_curve = [[0, 1.0], [12, 1.0]]\n", "hour 0 to hour 24"),
            ("day_curve = [[0, 1.0], [12, 0.0], [24, 1.0]]\n", "above 0"),
            ("peak_load_replicas = 3.0\n", "one of peak_rps"),
            ("policy = \"magic\"\n", "unknown variant"),
            ("serving = { slots = 0 }\n", "serving.slots"),
            ("serving = { speed = 2 }\n", "unknown field"),
            ("replicas = { min = 3, max = 2 }\n", "replicas"),
        ] {
            let err = Scenario::from_toml(&format!("{base}{extra}")).expect_err(extra);
            assert!(format!("{err:#}").contains(wanted), "{extra}: {err:#}");
        }
        let no_target = base.replace("target_p95_latency_ms = 500", "window_s = 30");
        let err = Scenario::from_toml(&no_target).expect_err("no target");
        assert!(
            format!("{err:#}").contains("target_p95_latency_ms"),
            "{err:#}"
        );
        let twice = format!(
            "{base}{}",
            base.replace("[[services]]\n", "\n[[services]]\n")
        );
        let err = Scenario::from_toml(&twice).expect_err("same name twice");
        assert!(format!("{err:#}").contains("used twice"), "{err:#}");
    }

    #[test]
    fn the_azure_trace_parses_and_bad_rows_are_named() {
        let t = parse_azure(&even_trace()).expect("parses");
        assert_eq!(t.rows.len(), 100);
        assert_eq!(t.rows[1], (1.0, 100, 10));
        assert!((t.mean_rps() - 1.0).abs() < 1e-9);
        let err =
            parse_azure("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:00.0,1,x\n")
                .expect_err("bad tokens");
        assert!(
            format!("{err:#}").contains("line 2: GeneratedTokens"),
            "{err:#}"
        );
        let err = parse_azure("TIMESTAMP,ContextTokens\n").expect_err("missing column");
        assert!(
            format!("{err:#}").contains("GeneratedTokens is missing"),
            "{err:#}"
        );
    }

    #[test]
    fn the_day_curve_interpolates_and_finds_its_step_and_peak() {
        let c = DayCurve::new(&default_day_curve()).expect("valid");
        assert_eq!(c.at(3.0 * 3600.0), 0.15);
        // Half-way up the 06:00–09:00 ramp from 0.15 to 0.5.
        assert!((c.at(7.5 * 3600.0) - 0.325).abs() < 1e-9);
        // At 09:00 the later point applies: the step.
        assert_eq!(c.at(9.0 * 3600.0), 0.85);
        assert_eq!(
            c.step(),
            Some(LoadStep {
                hour: 9.0,
                from: 0.5,
                to: 0.85
            })
        );
        assert_eq!(c.peak_hour(), 11);
        assert_eq!(DayCurve::flat().step(), None);
    }

    #[test]
    fn arrivals_follow_the_rate_and_keep_the_trace_tokens() {
        let t = parse_azure(&even_trace()).expect("parses");
        // The trace runs at 1 req/s; at a peak of 2 the gaps halve: 0.5 s, 1.0 s, … 9.5 s.
        let a = arrivals(&t, &DayCurve::flat(), 2.0, 0.0, 10.0, 300.0, 1);
        assert_eq!(a.len(), 19);
        assert_eq!(a[0].at_us, 500_000);
        assert_eq!(a[18].at_us, 9_500_000);
        assert!(a.iter().all(|x| (x.prompt, x.output) == (100, 10)));
        // A step from 1.0 to 4.0 of the peak at 01:00: four times as many after it.
        let curve = DayCurve::new(&[[0.0, 1.0], [1.0, 1.0], [1.0, 4.0], [24.0, 4.0]]).unwrap();
        let a = arrivals(&t, &curve, 1.0, 3000.0, 4200.0, 300.0, 1);
        let before = a.iter().filter(|x| x.at_us < 3_600_000_000).count();
        assert_eq!((before, a.len() - before), (599, 2400));
        // The same seed gives the same arrivals.
        assert_eq!(a, arrivals(&t, &curve, 1.0, 3000.0, 4200.0, 300.0, 1));
    }

    #[test]
    fn the_gateway_queues_at_the_bound_in_order() {
        let s = svc("{ target_p95_latency_ms = 500, max_concurrency_per_replica = 1 }");
        // One replica serving one request at a time: a 1 s request, then two short ones.
        let a = [at(0, 1000), at(100, 10), at(200, 10)];
        let out = run_policy(&setup(&s, 0), &a, Policy::Fixed(1), 0, 10_000_000);
        // First token after one decode step; the others wait for the slot, in arrival order.
        assert_eq!(out.ttft_us, vec![Some(1_000), Some(901_000), Some(811_000)]);
        assert_eq!(out.replica_us, 10_000_000);
        let r = summarize(
            &Policy::Fixed(1),
            &a,
            &out,
            500_000,
            None,
            Money::from_micros(1_500_000),
        );
        assert_eq!((r.misses, r.refused), (2, 0));
        // Both misses waited in the queue, with no replica starting.
        assert_eq!(
            out.served,
            vec![Served::AtOnce, Served::Waited, Served::Waited]
        );
        assert_eq!(
            (r.misses_at_once, r.misses_waited, r.misses_waited_starting),
            (0, 2, 0)
        );
        // 10 s at $1.50 an hour.
        assert!((r.cost_usd - 0.004166).abs() < 1e-6, "{}", r.cost_usd);
    }

    #[test]
    fn a_full_queue_and_a_long_wait_are_503s() {
        let s = svc("{ target_p95_latency_ms = 500, max_concurrency_per_replica = 1 }");
        // 66 requests at once on one replica of one slot, each 100 s long: one is served, 64
        // wait (the queue's least size), the last finds the queue full, and the 64 give up
        // after 30 s.
        let a: Vec<Arrival> = (0..66).map(|_| at(0, 100_000)).collect();
        let out = run_policy(&setup(&s, 0), &a, Policy::Fixed(1), 0, 200_000_000);
        assert_eq!(out.ttft_us[0], Some(1_000));
        assert_eq!(out.ttft_us.iter().filter(|t| t.is_none()).count(), 65);
        assert_eq!(
            out.served.iter().filter(|s| **s == Served::Refused).count(),
            65
        );
    }

    #[test]
    fn the_rate_policy_scales_by_the_live_rule_and_its_delays() {
        let s = svc(
            "{ target_p95_latency_ms = 500, window_s = 10, scale_up_delay_s = 5, \
             scale_down_delay_s = 10 }",
        );
        // 4 req/s for 60 s with a target of 1 req/s per replica. At tick s the window holds
        // seconds s-9..s-1 (answers land 1 ms after each whole second's tick), so the rule
        // asks 1, 1, 1, 2, 2, 2, 3, 3, 4, 4… from second 0; held for 5 s, the count goes to
        // 2 at second 8, 3 at 11 and 4 at 13.
        let a: Vec<Arrival> = (0..240).map(|i| at(i * 250, 1)).collect();
        let out = run_policy(&setup(&s, 0), &a, Policy::Rps(1.0), 0, 60_000_000);
        let desired: Vec<u32> = out.timeline.iter().map(|d| d.0).collect();
        assert_eq!(
            &desired[..16],
            &[1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 3, 3, 4, 4, 4]
        );
        assert!(desired[16..].iter().all(|&d| d == 4));
        assert_eq!(out.changes, 3);
        // Replica-seconds: 60 + (60 - 8) + (60 - 11) + (60 - 13).
        assert_eq!(out.replica_us, 208_000_000);
        assert_eq!(out.peak_held, 4);
        assert!(out.ttft_us.iter().all(|t| *t == Some(1_000)));
    }

    #[test]
    fn switchyard_adds_replicas_when_requests_queue_and_they_start_slowly() {
        let s = svc(
            "{ target_p95_latency_ms = 500, max_concurrency_per_replica = 2, window_s = 10, \
             scale_up_delay_s = 5, scale_down_delay_s = 60 }",
        );
        // 4 req/s of 1 s requests: 4 in flight, twice what one replica holds.
        let a: Vec<Arrival> = (0..480).map(|i| at(i * 250, 1000)).collect();
        let fixed = run_policy(&setup(&s, 10), &a, Policy::Fixed(1), 0, 120_000_000);
        let sy = run_policy(&setup(&s, 10), &a, Policy::Switchyard, 0, 120_000_000);
        let target = 500_000;
        assert!(share_under(&fixed, target) < 0.5);
        assert!(sy.peak_held >= 2, "{:?}", sy.timeline);
        assert!(share_under(&sy, target) > share_under(&fixed, target) + 0.3);
        // Nobody is ready before the start-up time: the count of ready replicas rises only
        // 10 s after the desired count does.
        let first_up = sy.timeline.iter().position(|d| d.0 > 1).expect("scaled up");
        let first_ready = sy
            .timeline
            .iter()
            .position(|d| d.1 > 1)
            .expect("became ready");
        assert_eq!(first_ready, first_up + 10);
    }

    #[test]
    fn pools_price_replicas_and_onprem_ones_are_reserved() {
        let mut s = svc("{ target_p95_latency_ms = 500 }");
        s.usd_per_replica_hour = None;
        s.gpu_model = Some("v100".into());
        s.gpus_per_replica = 2;
        let scenario = Scenario::default();
        let catalogue = switchyard_providers::catalogue::Catalogue::bundled().expect("catalogue");
        let world = scenario.world(&catalogue).expect("world");
        let p = place(&s, &world).expect("placed");
        // The default on-prem pool: V100 at $0.25 per GPU-hour, 8 per node.
        assert_eq!(p.price, Money::from_micros(500_000));
        assert_eq!(p.onprem.as_ref().map(|o| o.1), Some(8));
        s.gpu_model = Some("H100".into());
        let p = place(&s, &world);
        assert!(p.is_err(), "no H100 in the default scenario's pools");
    }
}

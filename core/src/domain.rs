//! The domain of DESIGN.md: regions, pools, nodes, jobs and attempts, as plain values.
//!
//! These are the broker's and the simulator's shared vocabulary. Wire shapes live in
//! `switchyard-protocol`; storage shapes live in the broker. Nothing here knows about either.

pub use crate::gpu_model::Accelerator;
pub use crate::gpu_set::{GpuSet, MAX_GPUS_PER_NODE};
use crate::money::Money;
use crate::time::Timestamp;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use uuid::Uuid;

macro_rules! string_id {
    ($(#[$m:meta])* $name:ident) => {
        $(#[$m])*
        #[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub String);

        impl $name {
            pub fn new(s: impl Into<String>) -> Self {
                Self(s.into())
            }
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

string_id!(
    /// `provider:code`, e.g. `aws:us-east-1`, `onprem:sh-dc1`.
    RegionId
);
string_id!(
    /// `region/instance-type`, e.g. `aws:us-east-1/p5.48xlarge`, `onprem:sh-dc1/dgx-h100`.
    PoolId
);
string_id!(
    /// A machine with an agent.
    NodeId
);

impl RegionId {
    /// The provider part of `provider:code`.
    pub fn provider(&self) -> &str {
        self.0.split_once(':').map_or(self.0.as_str(), |(p, _)| p)
    }
}

/// A job's id: a UUIDv7, so ids sort by submission time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct JobId(pub Uuid);

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// One run of a job on one node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct AttemptId(pub Uuid);

impl fmt::Display for AttemptId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A geographic and network location of capacity.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Region {
    pub id: RegionId,
    /// `onprem`, `aws`, `gcp`, `azure`, `lambda`, `vast`, `local`…
    pub provider: String,
    pub code: String,
    pub latitude: Option<f64>,
    pub longitude: Option<f64>,
    /// Price of moving one GB out of this region.
    pub egress_per_gb: Money,
    /// Broker-to-region round trip: an EWMA of agent RTTs, or the configured figure.
    pub latency_ms: u32,
    /// Sustained transfer rate into this region, for data-gravity transfer-time estimates.
    pub ingress_gbps: u32,
}

/// One kind of capacity in one region.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Pool {
    pub id: PoolId,
    pub region: RegionId,
    pub provider: String,
    pub instance_type: String,
    /// Normalised model name, e.g. `H100`, `A100-80GB`, `L4`.
    pub gpu_model: String,
    pub gpus_per_node: u32,
    pub gpu_memory_gb: u32,
    pub vcpus: u32,
    pub memory_gb: u32,
    /// Per node and hour. On-prem: the internal rate set by finance, what the ledger bills
    /// teams (chargeback).
    pub on_demand_per_hour: Money,
    /// Per node and hour; `None` where the pool has no spot market.
    pub spot_per_hour: Option<Money>,
    /// Most nodes this pool may have (a quota for cloud pools; the fleet size on-prem).
    pub node_limit: u32,
    /// Whether the broker may launch new nodes in this pool (cloud) or only use those that
    /// joined (on-prem, static).
    pub launchable: bool,
    /// Expected seconds from launch to an agent ready for work.
    pub boot_time_s: u32,
    pub price_updated_at: Timestamp,
    /// Capacity errors seen lately; a later issue turns this into a back-off.
    pub recent_capacity_failures: u32,
    /// What one more node-hour of use costs the company in cash, for a fixed (on-prem) pool:
    /// power and wear, set by finance. `None`: [`DEFAULT_MARGINAL_SHARE`] of the internal rate.
    /// Ignored for a launchable (cloud) pool, whose cash cost is its price
    /// ([`Pool::cash_per_hour`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub marginal_per_hour: Option<Money>,
}

/// The share of an on-prem pool's internal rate that its use costs in cash when finance states
/// no marginal cost (`marginal_usd_per_gpu_hour`): one fifth. A GPU's power at full load with
/// its share of host, cooling and a PUE of 1.4–1.6 is 0.45–1.1 kW (300 W V100 to 700 W H100),
/// $0.05–0.12 an hour at $0.10/kWh, plus wear (fans, PSUs and GPUs failing faster under load)
/// of a few cents; internal rates are set to recover the purchase over 3–4 years and run
/// $0.25 (V100) to $2 (H100) per GPU-hour. A fifth is the high end for old GPUs and generous
/// for new ones: finance should set the figure (DESIGN.md "Two costs").
pub const DEFAULT_MARGINAL_SHARE: (i64, i64) = (1, 5);
/// What one node-hour of an owned pool costs the company in cash: finance's `marginal`, else
/// [`DEFAULT_MARGINAL_SHARE`] of its internal rate `on_demand` (rounded up).
pub fn owned_cash_per_hour(on_demand: Money, marginal: Option<Money>) -> Money {
    marginal.unwrap_or_else(|| {
        let (num, den) = DEFAULT_MARGINAL_SHARE;
        on_demand.saturating_mul(num).div_ceil(den)
    })
}

impl Pool {
    /// What one node-hour in `market` costs the company in cash: a launchable (cloud) pool's
    /// price; a fixed (on-prem) pool's marginal cost ([`Pool::marginal_per_hour`]). What the
    /// planner minimises under [`Objective::Company`].
    pub fn cash_per_hour(&self, market: Market) -> Money {
        if self.launchable {
            return self.price_per_hour(market);
        }
        owned_cash_per_hour(self.on_demand_per_hour, self.marginal_per_hour)
    }

    /// What one GPU-hour in `market` costs the company in cash (the node's share, rounded up).
    pub fn cash_per_gpu_hour(&self, market: Market) -> Money {
        self.cash_per_hour(market)
            .div_ceil(i64::from(self.gpus_per_node.max(1)))
    }

    /// The node-hour price `objective` ranks by: cash or chargeback.
    pub fn objective_per_hour(&self, market: Market, objective: Objective) -> Money {
        match objective {
            Objective::Company => self.cash_per_hour(market),
            Objective::Team => self.price_per_hour(market),
        }
    }

    /// Price of one GPU-hour on demand (the node price shared evenly, rounded up).
    pub fn on_demand_per_gpu_hour(&self) -> Money {
        self.on_demand_per_hour
            .div_ceil(i64::from(self.gpus_per_node.max(1)))
    }

    pub fn spot_per_gpu_hour(&self) -> Option<Money> {
        self.spot_per_hour
            .map(|p| p.div_ceil(i64::from(self.gpus_per_node.max(1))))
    }

    /// Price of one node-hour in `market` (spot falls back to on demand where there is none).
    pub fn price_per_hour(&self, market: Market) -> Money {
        match market {
            Market::Spot => self.spot_per_hour.unwrap_or(self.on_demand_per_hour),
            Market::OnDemand => self.on_demand_per_hour,
        }
    }

    /// Price of one GPU-hour in `market` (the node price shared evenly, rounded up).
    pub fn price_per_gpu_hour(&self, market: Market) -> Money {
        self.price_per_hour(market)
            .div_ceil(i64::from(self.gpus_per_node.max(1)))
    }

    /// The cheapest market a job with `spot` may use here: spot where the job allows it and
    /// the pool sells it cheaper; on demand otherwise. Pools the broker cannot launch in
    /// (on-prem, static) charge their internal on-demand rate.
    pub fn cheapest_market(&self, spot: SpotRule) -> Market {
        match (spot, self.spot_per_hour) {
            (SpotRule::Allowed | SpotRule::Preferred, Some(price))
                if self.launchable && price < self.on_demand_per_hour =>
            {
                Market::Spot
            }
            _ => Market::OnDemand,
        }
    }
}

/// A machine with an agent, in a pool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    pub id: NodeId,
    pub pool: PoolId,
    pub gpus_total: u32,
    /// The GPUs (by index) not held by any attempt: the planner gives a job the lowest of
    /// them. A node has at most [`MAX_GPUS_PER_NODE`] GPUs.
    pub free_gpus: GpuSet,
    /// Healthy and heartbeating: only such nodes receive work.
    pub healthy: bool,
    /// Draining nodes finish what they run and take nothing new.
    pub draining: bool,
    pub last_heartbeat: Timestamp,
    /// The market the node was bought in: on-prem and on-demand nodes `on_demand`. A spot node
    /// can be interrupted, so only jobs that allow spot (after their policies) run there, and
    /// they pay its spot price.
    #[serde(default)]
    pub market: Market,
}

impl Node {
    /// How many GPUs are free.
    pub fn gpus_free(&self) -> u32 {
        self.free_gpus.len()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Priority {
    Low,
    Normal,
    High,
    Critical,
}

impl Priority {
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Low => "low",
            Priority::Normal => "normal",
            Priority::High => "high",
            Priority::Critical => "critical",
        }
    }

    /// The priority [`Priority::as_str`] names, if `s` is one.
    pub fn parse(s: &str) -> Option<Priority> {
        [
            Priority::Low,
            Priority::Normal,
            Priority::High,
            Priority::Critical,
        ]
        .into_iter()
        .find(|p| p.as_str() == s)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpotRule {
    Never,
    Allowed,
    Preferred,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobKind {
    Batch,
    Service,
}

#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Market {
    #[default]
    OnDemand,
    Spot,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resources {
    pub gpus: u32,
    /// Acceptable GPU models (of any vendor, TPUs and Trainium included); empty means any the
    /// accelerator allows.
    pub gpu_models: Vec<String>,
    /// Which accelerators the job runs on (`resources.accelerator`): `None` (absent) is any GPU
    /// (NVIDIA, AMD, Intel), never a TPU, Trainium, Inferentia or Gaudi unless `gpu_models`
    /// names one; see [`crate::gpu_model::accepts`]. Absent from specs stored before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accelerator: Option<Accelerator>,
    pub min_gpu_memory_gb: u32,
    pub cpus: u32,
    pub memory_gb: u32,
    pub nodes: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataLocation {
    pub region: RegionId,
    pub size_gb: u32,
}

/// What a job asks for, validated. Built from the wire spec by the broker.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobSpec {
    pub name: String,
    pub team: String,
    pub project: Option<String>,
    pub command: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub resources: Resources,
    /// `None`: unknown; placement assumes [`DEFAULT_RUNTIME_S`].
    pub estimated_runtime_s: Option<i64>,
    pub deadline: Option<Timestamp>,
    pub priority: Priority,
    pub spot: SpotRule,
    /// Most the job may cost per hour (whole job, all its GPUs).
    pub max_price_per_hour: Option<Money>,
    /// Allowed regions; empty means any.
    pub regions: Vec<RegionId>,
    pub data: Option<DataLocation>,
    pub kind: JobKind,
    pub max_latency_ms: Option<u32>,
    /// A service's callers: where its calls come from and in what shares. With callers,
    /// `max_latency_ms` bounds the share-weighted latency from them to a replica's region;
    /// without, the region's own latency.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub callers: Vec<CallerShare>,
    /// How busy the job says it keeps its GPUs, in percent (`expected_gpu_utilization`).
    /// Simulated GPUs run at this level; nothing is placed by it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_gpu_utilization_pct: Option<u8>,
}

/// One region a service's calls come from, and its share of them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallerShare {
    pub region: RegionId,
    /// The share in basis points (1/10,000): shares of one service add up to 10,000.
    pub share_bp: u32,
}

/// Runtime assumed for a job that gives no estimate.
pub const DEFAULT_RUNTIME_S: i64 = 3600;

impl JobSpec {
    pub fn runtime_s(&self) -> i64 {
        self.estimated_runtime_s.unwrap_or(DEFAULT_RUNTIME_S).max(0)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    Queued,
    /// Waiting for capacity being launched for it.
    Provisioning,
    /// Held back by policy or budget; released when that allows.
    Held,
    /// Assigned to a node; the agent has not yet reported it started.
    Placed,
    Running,
    Succeeded,
    Failed,
    Cancelled,
}

impl JobState {
    pub const ALL: [JobState; 8] = [
        JobState::Queued,
        JobState::Provisioning,
        JobState::Held,
        JobState::Placed,
        JobState::Running,
        JobState::Succeeded,
        JobState::Failed,
        JobState::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Provisioning => "provisioning",
            JobState::Held => "held",
            JobState::Placed => "placed",
            JobState::Running => "running",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<JobState> {
        JobState::ALL.into_iter().find(|st| st.as_str() == s)
    }

    /// Finished: nothing will change it again.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobState::Succeeded | JobState::Failed | JobState::Cancelled
        )
    }

    /// Waiting for placement: the scheduler may act on it.
    pub fn is_pending(self) -> bool {
        matches!(
            self,
            JobState::Queued | JobState::Provisioning | JobState::Held
        )
    }

    /// Holding capacity on a node.
    pub fn is_active(self) -> bool {
        matches!(self, JobState::Placed | JobState::Running)
    }
}

/// A job waiting for placement, as the planner sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueuedJob {
    pub id: JobId,
    /// The job as the planner costs it: `spec.estimated_runtime_s` is the runtime costs are
    /// judged at (the broker sets it to the predicted p50, [`crate::predict`]).
    pub spec: JobSpec,
    pub submitted_at: Timestamp,
    /// The runtime its deadline is judged at (the predicted p90); `None`: the same as the
    /// cost runtime ([`JobSpec::runtime_s`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_runtime_s: Option<i64>,
}

/// Capacity held by a running attempt, with when it is expected to free up.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunningAttempt {
    pub job: JobId,
    pub attempt: AttemptId,
    pub node: NodeId,
    /// The GPUs (by index) of `node` it holds: a job that preempts it may take them.
    pub gpus: GpuSet,
    pub priority: Priority,
    pub started_at: Timestamp,
    /// `started_at + estimated runtime`; `Timestamp::MAX` for services, which run until
    /// cancelled.
    pub expected_end: Timestamp,
}

/// Everything the planner may look at. Built by the broker from its in-memory state, or by the
/// simulator from its virtual world.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    pub regions: Vec<Region>,
    pub pools: Vec<Pool>,
    pub nodes: Vec<Node>,
    pub queued: Vec<QueuedJob>,
    pub running: Vec<RunningAttempt>,
    /// Whether the plan may ask for new cloud nodes. When false, launchable pools count only
    /// the nodes they already have.
    pub burst_enabled: bool,
    /// Team and project policies, as plain inputs: every policy that matches a job applies.
    #[serde(default)]
    pub policies: Vec<TeamPolicy>,
    /// Spot interruptions per hour, in millionths (50,000 = 5 % an hour), by pool; later
    /// filled from observed history. A pool not listed gets
    /// [`DEFAULT_SPOT_INTERRUPTIONS_PER_HOUR_PPM`]; `0` states that spot there is never taken
    /// back.
    #[serde(default)]
    pub spot_interruptions_per_hour_ppm: BTreeMap<PoolId, u32>,
    /// Nodes a queued one-node job must not be placed on (free now, a wait or a preemption
    /// there): a service's replica kept off the one node every other replica of its service
    /// is on, so that the service spreads over at least two nodes. New nodes are never
    /// avoided; gangs ignore it.
    #[serde(default)]
    pub avoid: BTreeMap<JobId, Vec<NodeId>>,
    /// An owned (fixed) pool is *protected* while less than one in this many of its usable GPUs
    /// are free at the round's start: a job that allows spot then pays, in its score only, a
    /// reserve for a place there (what the jobs that cannot use spot would pay to be displaced
    /// to the cloud, less the pool's own price). `None`: [`DEFAULT_RESERVE_FREE_BELOW_ONE_IN`];
    /// `Some(0)`: no reserve. Broker config `reserve_free_below_one_in`; scenario key of the
    /// same name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserve_free_below_one_in: Option<u32>,
}

/// See [`Snapshot::reserve_free_below_one_in`]: protected below one GPU free in eight. The
/// cross-trace sweep in BENCHMARKS.md ("The on-prem reserve's threshold") is its justification.
pub const DEFAULT_RESERVE_FREE_BELOW_ONE_IN: u32 = 8;

/// Spot interruption rate assumed for a pool with no observed figure: 2 % an hour.
pub const DEFAULT_SPOT_INTERRUPTIONS_PER_HOUR_PPM: u32 = 20_000;

/// A UTC time-of-day range, in minutes after midnight: `[start, end)`. `start > end` wraps past
/// midnight (22:00–06:00 is `1320..360`); `start == end` is the whole day. The caller converts
/// the team's time zone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TimeWindow {
    pub start_minute: u16,
    pub end_minute: u16,
}

impl TimeWindow {
    /// Whether the minute of day `minute` (0..1440) falls in the window.
    pub fn contains(self, minute: u16) -> bool {
        let (s, e) = (self.start_minute, self.end_minute);
        match s.cmp(&e) {
            std::cmp::Ordering::Equal => true,
            std::cmp::Ordering::Less => (s..e).contains(&minute),
            std::cmp::Ordering::Greater => minute >= s || minute < e,
        }
    }
}

/// When jobs of some priorities may start: outside every window, they are held.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PriorityWindows {
    /// The priorities this applies to; empty means all.
    #[serde(default)]
    pub priorities: Vec<Priority>,
    pub windows: Vec<TimeWindow>,
}

/// A team's (or one of its projects') rules, as the placement engine takes them: plain values,
/// every one a hard constraint. Empty lists and `None` mean "no rule". Policies are defined and
/// stored by a later issue; the caller resolves time zones and budgets before planning.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TeamPolicy {
    pub team: String,
    /// `None`: the whole team; `Some`: only that project's jobs (on top of the team's policy).
    #[serde(default)]
    pub project: Option<String>,
    /// Providers the team may use (`aws`, `onprem`…); empty means any.
    #[serde(default)]
    pub allowed_providers: Vec<String>,
    /// Regions the team may use; empty means any.
    #[serde(default)]
    pub allowed_regions: Vec<RegionId>,
    /// Most one GPU-hour may cost in the market used.
    #[serde(default)]
    pub max_price_per_gpu_hour: Option<Money>,
    /// The most spot the team's jobs may use: a job's own rule is capped at this.
    #[serde(default = "spot_preferred")]
    pub spot: SpotRule,
    /// Whether the team's jobs may have new cloud nodes launched for them.
    #[serde(default = "yes")]
    pub burst_allowed: bool,
    /// When jobs may start, by priority.
    #[serde(default)]
    pub windows: Vec<PriorityWindows>,
    /// The highest priority the team's jobs get; a job asking for more is planned at this.
    #[serde(default)]
    pub priority_ceiling: Option<Priority>,
    /// What the team may still spend; a hard limit. Each job placed this round takes its
    /// estimated cost (at chargeback rates, what the team is billed) from it.
    #[serde(default)]
    pub remaining_budget: Option<Money>,
    /// What the planner minimises for the team's jobs.
    #[serde(default, skip_serializing_if = "Objective::is_company")]
    pub objective: Objective,
}

/// What placement minimises for a job ([`TeamPolicy::objective`]).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Objective {
    /// What the company pays in cash: cloud spend plus owned GPUs' marginal cost (power and
    /// wear). An idle owned GPU costs the company nearly nothing more to use.
    #[default]
    Company,
    /// The team's bill: cloud spend plus owned GPUs at their internal (chargeback) rate.
    Team,
}

impl Objective {
    pub fn as_str(self) -> &'static str {
        match self {
            Objective::Company => "company",
            Objective::Team => "team",
        }
    }

    /// The objective [`Objective::as_str`] names, if `s` is one.
    pub fn parse(s: &str) -> Option<Objective> {
        [Objective::Company, Objective::Team]
            .into_iter()
            .find(|o| o.as_str() == s)
    }

    pub fn is_company(&self) -> bool {
        *self == Objective::Company
    }
}

fn spot_preferred() -> SpotRule {
    SpotRule::Preferred
}

fn yes() -> bool {
    true
}

impl TeamPolicy {
    /// A policy for `team` with no rules: add them with struct update syntax.
    pub fn new(team: impl Into<String>) -> TeamPolicy {
        TeamPolicy {
            team: team.into(),
            project: None,
            allowed_providers: Vec::new(),
            allowed_regions: Vec::new(),
            max_price_per_gpu_hour: None,
            spot: SpotRule::Preferred,
            burst_allowed: true,
            windows: Vec::new(),
            priority_ceiling: None,
            remaining_budget: None,
            objective: Objective::Company,
        }
    }

    /// Whether the policy covers a job of `team` and `project`.
    pub fn applies_to(&self, team: &str, project: Option<&str>) -> bool {
        self.team == team && self.project.as_deref().is_none_or(|p| Some(p) == project)
    }
}

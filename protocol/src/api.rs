//! REST API shapes under `/api/v1`. Money leaves and enters as dollars (JSON numbers); the
//! broker converts to integer micro-dollars at the edge.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::ToSchema;
use uuid::Uuid;

/// The one error shape: `{"error": {"code": "...", "message": "..."}}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ErrorDetail {
    /// Stable machine-readable code, e.g. `invalid_field`, `unauthorized`, `not_found`.
    pub code: String,
    pub message: String,
    /// The request field at fault, when there is one (dotted path, e.g. `resources.gpus`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// For 422: the placement explanation showing why nothing fits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub details: Option<serde_json::Value>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Priority {
    Critical,
    High,
    Normal,
    Low,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SpotRule {
    Never,
    Allowed,
    Preferred,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum JobKind {
    Batch,
    Service,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    Queued,
    Provisioning,
    Held,
    Placed,
    Running,
    Succeeded,
    Failed,
    Cancelled,
}

/// A job as submitted. Only `name`, `team`, `command` and `resources.gpus` are required.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    pub name: String,
    pub team: String,
    #[serde(default)]
    pub project: Option<String>,
    /// argv; run without a shell.
    pub command: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    pub resources: ResourceSpec,
    #[serde(default)]
    pub estimated_runtime_s: Option<i64>,
    #[serde(default)]
    pub deadline: Option<DateTime<Utc>>,
    #[serde(default)]
    pub priority: Option<Priority>,
    #[serde(default)]
    pub spot: Option<SpotRule>,
    /// USD per hour for the whole job.
    #[serde(default)]
    pub max_price_per_hour: Option<f64>,
    #[serde(default)]
    pub regions: Vec<String>,
    #[serde(default)]
    pub data: Option<DataSpec>,
    #[serde(default)]
    pub kind: Option<JobKind>,
    /// Services only: the most latency the caller's region may see.
    #[serde(default)]
    pub max_latency_ms: Option<u32>,
    /// How busy the job keeps its GPUs, in percent (0–100). Simulated GPUs (`up`) run at this
    /// level; the utilisation policy judges real GPUs by what they report, not by this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_gpu_utilization: Option<f64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResourceSpec {
    pub gpus: i64,
    /// Acceptable models (`H100`, `A100-80GB`, `MI300X`, `TPU-v5e`, `Trainium2`…), of any
    /// vendor; empty: any model `accelerator` allows. A list may name a TPU, Trainium or Gaudi
    /// without `accelerator`; a model of another vendor than `accelerator`'s is refused (400,
    /// naming `resources.accelerator`).
    #[serde(default)]
    pub gpu_models: Vec<String>,
    /// Which accelerators the job runs on: `nvidia`, `amd`, `intel`, `google` (TPUs), `aws`
    /// (Trainium, Inferentia) or `any`. Absent: any GPU (NVIDIA, AMD or Intel), never a TPU,
    /// Trainium, Inferentia or Gaudi unless `gpu_models` names one, since their software
    /// stacks differ. A vendor: only that vendor's models. `any`: every accelerator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(example = "nvidia")]
    pub accelerator: Option<String>,
    #[serde(default)]
    pub min_gpu_memory_gb: Option<i64>,
    #[serde(default)]
    pub cpus: Option<i64>,
    #[serde(default)]
    pub memory_gb: Option<i64>,
    #[serde(default)]
    pub nodes: Option<i64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DataSpec {
    pub region: String,
    pub size_gb: i64,
}

/// Where a job runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PlacementView {
    pub region: String,
    pub pool: String,
    /// The node (of a multi-node job: rank 0's).
    pub node: String,
    pub gpus: Vec<u32>,
    pub market: String,
    /// A multi-node job's ranks, one per node, in rank order (`GET /jobs/{id}` only; absent
    /// for single-node jobs and in lists).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ranks: Vec<RankView>,
}

/// One rank of a multi-node job: its node, GPUs and how its attempt stands.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RankView {
    pub rank: u32,
    pub node: String,
    pub gpus: Vec<u32>,
    /// `assigned`, `running`, `finished`, `preempting`, `preempted`, `lost` or `cancelled`.
    pub state: String,
    pub exit_code: Option<i32>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct JobView {
    pub id: Uuid,
    pub name: String,
    pub team: String,
    pub project: Option<String>,
    pub state: JobState,
    pub priority: Priority,
    pub kind: JobKind,
    pub submitted_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    /// Set once the job has finished with a process exit status.
    pub exit_code: Option<i32>,
    /// Why the job is held, failed or was cancelled.
    pub reason: Option<String>,
    pub placement: Option<PlacementView>,
    pub attempts: u32,
    pub cancel_requested: bool,
    /// What the ledger attributes to the job so far (USD): accrued while it runs, settled when
    /// it ends.
    #[serde(default)]
    pub cost_usd: f64,
    /// The spec as submitted.
    pub spec: JobSpec,
    /// How long the broker predicts a job like this runs, from past runs (issue 29): given by
    /// `GET /jobs/{id}` for a batch job, absent from lists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_prediction: Option<RuntimePredictionView>,
}

/// How long the broker predicts a job runs, learnt from the runs that succeeded before it
/// (keyed by team, project, job name, command and GPUs, falling back to coarser keys), and
/// what from. Placement costs the job at the p50 and judges its deadline at the p90.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RuntimePredictionView {
    /// Median runtime, seconds.
    pub p50_s: i64,
    /// 90th percentile, seconds.
    pub p90_s: i64,
    /// `history` (past runs of the finest key that has any: `level`), `calibrated` (the job's
    /// estimate scaled by what the same project's past runs used of theirs), `user_estimate` (the
    /// estimate as given: no history yet) or `default` (no estimate, no history: one hour).
    pub source: String,
    /// For `history`: `command`, `name`, `user`, `team` or `global`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub level: Option<String>,
    /// The past runs it was learnt from (`history`, `calibrated`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runs: Option<u32>,
    /// One line, e.g. "p50 23 min, p90 2.1 h from 41 past runs of `train` by vision in team
    /// ml" (the user is the job's project).
    pub explanation: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct JobList {
    pub jobs: Vec<JobView>,
    /// Pass as `cursor` to get the next page; `null` on the last page.
    pub next_cursor: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum LogStream {
    Stdout,
    Stderr,
    /// Messages from the agent itself (e.g. why a process could not start).
    System,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct LogEntry {
    /// Position in the job's log across attempts, strictly increasing.
    pub offset: i64,
    pub attempt: u32,
    pub stream: LogStream,
    pub text: String,
    pub at: DateTime<Utc>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct LogPage {
    pub job_id: Uuid,
    pub entries: Vec<LogEntry>,
    /// Pass as `after` to read on.
    pub next_after: i64,
    /// The job has finished: no more entries will come.
    pub complete: bool,
}

/// One candidate of a placement explanation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CandidateView {
    pub pool: String,
    pub region: String,
    pub node: Option<String>,
    /// `free_now`, `wait` or `launch`.
    pub kind: String,
    pub market: String,
    pub start: DateTime<Utc>,
    pub finish: DateTime<Utc>,
    pub cost_usd: f64,
    /// `null` for the winner; otherwise why it lost or was ruled out.
    #[schema(value_type = Option<Object>)]
    pub rejected: Option<serde_json::Value>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PlacementExplanation {
    pub job_id: Uuid,
    pub planned_at: DateTime<Utc>,
    /// `assigned`, `wait`, `launch` or `hold`, with its details.
    #[schema(value_type = Object)]
    pub outcome: serde_json::Value,
    pub candidates: Vec<CandidateView>,
    /// For a job that ran on a node launched for it: the round that chose to launch, with the
    /// candidates it weighed (what waiting for existing capacity would have cost and when it
    /// would have finished). The top-level round is then the one that placed the job on the new
    /// node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(no_recursion)]
    pub launch_round: Option<Box<PlacementExplanation>>,
    /// The job's runtime as the broker predicts it now (issue 29): the p50 its candidates are
    /// costed at, the p90 its deadline is judged at. Absent for services.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_prediction: Option<RuntimePredictionView>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PoolView {
    pub id: String,
    pub provider: String,
    pub region: String,
    pub instance_type: String,
    pub gpu_model: String,
    pub gpu_memory_gb: u32,
    pub gpus_per_node: u32,
    /// Healthy nodes in the pool now (`node_list` also lists the unhealthy ones).
    pub nodes: u32,
    /// The most nodes the pool may have: its fleet on-prem, the launch quota in a cloud.
    pub node_limit: u32,
    /// Whether the broker may launch nodes in the pool: the catalogue's setting, or infra's
    /// edit (`PATCH /pools/{id}`). It launches there now only when `unlaunchable_reason` is
    /// absent too.
    pub launchable: bool,
    /// Why the broker cannot launch in this `launchable` pool now, in words: bursting is off,
    /// no configured provider launches it, or its provider's credentials check failed when
    /// the broker started (`credentials check failed: …`; fixed by a restart with working
    /// credentials). The scheduler plans no launch here meanwhile. Absent when it can launch,
    /// and for pools that are not `launchable`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unlaunchable_reason: Option<String>,
    pub gpus_total: u32,
    pub gpus_free: u32,
    /// On-demand USD per GPU-hour (on-prem: the internal rate).
    pub price_per_gpu_hour: f64,
    pub spot_price_per_gpu_hour: Option<f64>,
    /// What one more GPU-hour on demand costs the company in cash: a cloud pool's price; an
    /// owned (not launchable) pool's marginal cost, power and wear, as finance set it
    /// (`marginal_set`) or by default a fifth of the internal rate. What the planner minimises
    /// for teams whose policy says `objective: company` (the default).
    #[serde(default)]
    pub cash_per_gpu_hour: f64,
    /// Whether finance set this owned pool's marginal cost (config `marginal_usd_per_gpu_hour`,
    /// `PATCH /pools/{id}`); false: the default share, or a cloud pool.
    #[serde(default)]
    pub marginal_set: bool,
    pub latency_ms: u32,
    pub boot_time_s: u32,
    pub price_updated_at: DateTime<Utc>,
    /// The nodes that joined the pool (revoked ones left out).
    #[serde(default)]
    pub node_list: Vec<PoolNode>,
}

/// One node of a pool, as its agent last reported it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PoolNode {
    pub id: String,
    pub hostname: String,
    pub healthy: bool,
    pub draining: bool,
    pub gpus_total: u32,
    /// Whether its agent runs every job as its own unprivileged uid with a clean environment.
    /// False for an agent that is not root (a developer's `switchyard up`): there, jobs run as
    /// the agent's own user and can read each other's processes.
    pub isolation: bool,
    /// GPUs declared with `--fake-gpus` rather than read from NVML.
    pub simulated: bool,
    pub last_heartbeat: DateTime<Utc>,
}

/// `GET /nodes/{id}`: one GPU node, its GPUs, what runs on them, and the telemetry its
/// heartbeats carried recently.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct NodeDetail {
    pub id: String,
    pub hostname: String,
    pub pool: String,
    pub healthy: bool,
    pub draining: bool,
    pub revoked: bool,
    pub isolation: bool,
    /// GPUs declared with `--fake-gpus` rather than read from NVML.
    pub simulated: bool,
    pub registered_at: DateTime<Utc>,
    pub last_heartbeat: DateTime<Utc>,
    /// `healthy`, `lost`, `draining` or `revoked` (see [`NodeState`]).
    pub state: NodeState,
    /// As of the last heartbeat; absent figures were not reported.
    pub gpus: Vec<NodeGpu>,
    /// Attempts running on the node now. Another team's job shows to a developer as
    /// `name: null`.
    pub running: Vec<NodeJob>,
    /// Heartbeat samples since the broker started (at most the last hour, oldest first). Held in
    /// memory by the broker that received them: empty after a restart or on another replica.
    pub history: Vec<NodeSample>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct NodeGpu {
    pub index: u32,
    pub model: String,
    pub memory_total_mb: u64,
    pub memory_used_mb: Option<u64>,
    pub utilization_pct: Option<u32>,
    pub temperature_c: Option<u32>,
    pub power_w: Option<f64>,
    /// Who made it (`nvidia`, `amd`, `intel`, `google`, `aws`), as its agent reports it, or
    /// (older agents) as the model says.
    #[serde(default)]
    pub vendor: Option<String>,
    #[serde(default)]
    pub uuid: String,
    /// False while a health rule marks it (a fatal XID, uncorrectable ECC errors, overheating):
    /// it takes no new work.
    #[serde(default = "default_true")]
    pub healthy: bool,
    /// Why it is unhealthy, one sentence each ("GPU 2 fell off the bus (XID 79)").
    #[serde(default)]
    pub reasons: Vec<String>,
}

fn default_true() -> bool {
    true
}

/// A node's state: `healthy` (heartbeating, taking work), `lost` (no heartbeat within the
/// lease), `draining` (takes no new work; running work finishes: an operator's drain, a spot
/// notice, or a cloud instance being replaced), `revoked` (its agent token was revoked).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum NodeState {
    Healthy,
    Lost,
    Draining,
    Revoked,
}

/// `GET /nodes`: every node that is not revoked, by id.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct NodeList {
    pub nodes: Vec<NodeSummary>,
}

/// One node in `GET /nodes`: where it is, its state, its GPUs with their health, and what
/// runs on it (another team's job shows to a developer as `name: null`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct NodeSummary {
    pub id: String,
    pub hostname: String,
    pub pool: String,
    pub state: NodeState,
    pub last_heartbeat: DateTime<Utc>,
    /// Whether its agent runs every job as its own unprivileged uid with a clean environment.
    pub isolation: bool,
    /// GPUs declared with `--fake-gpus` rather than read from NVML.
    pub simulated: bool,
    pub gpus: Vec<NodeGpu>,
    pub running: Vec<NodeJob>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct NodeJob {
    pub job_id: Uuid,
    pub attempt_id: Uuid,
    pub name: Option<String>,
    pub team: String,
    pub gpus: Vec<u32>,
    pub started_at: Option<DateTime<Utc>>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct NodeSample {
    pub at: DateTime<Utc>,
    pub gpus: Vec<GpuSample>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct GpuSample {
    pub index: u32,
    pub utilization_pct: Option<u32>,
    pub memory_used_mb: Option<u64>,
    pub temperature_c: Option<u32>,
    pub power_w: Option<f64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PoolList {
    pub pools: Vec<PoolView>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RegionView {
    pub id: String,
    pub provider: String,
    pub code: String,
    pub latitude: Option<f64>,
    pub longitude: Option<f64>,
    pub latency_ms: u32,
    pub egress_per_gb_usd: f64,
    pub pools: u32,
    pub nodes: u32,
    /// The provider that launches machines in this region (`aws`, `gcp`, `azure`, `lambda`,
    /// `local`), or none: capacity the broker does not launch (on-prem), or a catalogue
    /// region without a configured provider.
    pub launched_by: Option<String>,
    /// `real`: a cloud's machines; `local`: agent processes on the broker's machine (`up`);
    /// `none`: nothing launches here.
    pub backing: RegionBacking,
    /// Whether the launching provider's credentials worked when the broker started: `ok`, or
    /// the failure. Absent where nothing was checked (no provider, or the local one).
    pub credentials: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RegionBacking {
    Real,
    Local,
    None,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RegionList {
    pub regions: Vec<RegionView>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Admin,
    Finance,
    Infra,
    Developer,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateToken {
    pub role: Role,
    /// Required for developers: the team whose jobs the token may see and submit.
    #[serde(default)]
    pub team: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TokenCreated {
    /// Shown once; only its hash is stored.
    pub token: String,
    pub id: Uuid,
    pub role: Role,
    pub team: Option<String>,
}

/// An API token as `GET /tokens` lists it: never the token, nor its hash.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TokenView {
    pub id: Uuid,
    pub role: Role,
    pub team: Option<String>,
    pub name: Option<String>,
    pub created_at: DateTime<Utc>,
    /// A revoked token authenticates nothing from its revocation on.
    pub revoked: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TokenList {
    pub tokens: Vec<TokenView>,
}

/// An enrolled agent's token, as `GET /agent-tokens` lists it: which node holds it (one per
/// node), never the token itself.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct AgentTokenView {
    /// The node id, which `DELETE /agent-tokens/{node}` takes.
    pub node: String,
    pub pool: String,
    pub hostname: String,
    pub registered_at: DateTime<Utc>,
    pub last_heartbeat: DateTime<Utc>,
    pub healthy: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct AgentTokenList {
    pub agent_tokens: Vec<AgentTokenView>,
}

/// What revoking an agent token did: the node left, and its running work went back to the
/// queue.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct AgentTokenRevoked {
    pub node: String,
    /// Jobs that ran (or were about to) on the node, now queued again (or cancelled, when a
    /// cancel was pending).
    pub requeued: Vec<Uuid>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateEnrolmentToken {
    /// The pool the enrolling node joins.
    pub pool: String,
    /// Seconds until the token expires (default 900).
    #[serde(default)]
    pub ttl_s: Option<i64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct EnrolmentTokenCreated {
    pub token: String,
    pub pool: String,
    pub expires_at: DateTime<Utc>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Health {
    pub status: String,
    /// This replica's name in the leader election (readiness only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica: Option<String>,
    /// Whether this replica leads: runs the scheduler, the burst controller and the ledger.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<bool>,
    /// The fencing epoch it leads under.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<i64>,
}

/// A cloud instance the broker launched (burst), with its cost.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct InstanceView {
    pub id: String,
    pub provider: String,
    /// The provider's own id (EC2 instance id, …) once the launch was accepted.
    pub provider_id: Option<String>,
    pub region: String,
    pub pool: String,
    /// `requested`, `booting`, `ready`, `draining` or `terminated`.
    pub state: String,
    /// `on_demand` or `spot`.
    pub market: String,
    pub hourly_price_usd: f64,
    /// Running instances: accrued so far; ended ones: what the ledger recorded.
    pub cost_usd: f64,
    /// The job it was launched for.
    pub for_job: Option<Uuid>,
    pub node: Option<String>,
    pub requested_at: DateTime<Utc>,
    pub launched_at: Option<DateTime<Utc>>,
    pub ready_at: Option<DateTime<Utc>>,
    pub ended_at: Option<DateTime<Utc>>,
    /// The last error of a launch or terminate call.
    pub last_error: Option<String>,
    /// Why it ended: `idle: no job for N s`, a boot timeout, gone at the provider….
    #[serde(default)]
    pub end_reason: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct InstanceList {
    pub instances: Vec<InstanceView>,
}

/// A team's (or project's) cost policy, as `PUT /policies/{team}` takes it. Every field is
/// optional (absent or `null`: no rule); unknown fields are rejected.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PolicyBody {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetRule>,
    /// Most one GPU-hour may cost (USD) in the market used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_price_per_gpu_hour: Option<f64>,
    /// Providers the team may use (`onprem`, `aws`…); `null`: any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_providers: Option<Vec<String>>,
    /// Regions (`provider:code`) the team may use; `null`: any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_regions: Option<Vec<String>>,
    /// The most spot the team's jobs may use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spot: Option<SpotRule>,
    /// Whether cloud nodes may be launched for the team's jobs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<bool>,
    /// When jobs of a priority may start; outside every window that covers them, they wait.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub windows: Option<Vec<PolicyWindow>>,
    /// The highest priority the team's jobs get; higher asks are capped (not refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_ceiling: Option<Priority>,
    /// On-prem internal rate, USD per GPU-hour, by GPU model (e.g. `{"H100": 1.5}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub onprem_rates: Option<BTreeMap<String, f64>>,
    /// What to do with a job that holds GPUs without using them (issue 28).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub utilization: Option<UtilizationRule>,
    /// What placement minimises for the team's jobs; `null`: `company`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub objective: Option<Objective>,
}

/// What placement minimises: `company`, what the company pays in cash (cloud spend, owned
/// GPUs at their marginal cost: an idle owned GPU wins over cheap spot); `team`, the team's
/// bill (owned GPUs at their internal rate). Budgets bind on the bill either way.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Objective {
    #[default]
    Company,
    Team,
}

/// A policy's waste rule: a job whose GPUs stay under `min_gpu_utilization_pct` (their mean
/// activity: profiling SM activity where the GPU gives it, else utilisation) for `window_s` is
/// acted on. Service replicas are never acted on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UtilizationRule {
    /// Percent, 1–100: under it, a job is idle.
    pub min_gpu_utilization_pct: u32,
    /// Seconds, 60 to 604800 (7 days): how long a job must stay idle.
    pub window_s: u32,
    pub action: WasteAction,
    /// Jobs of these priorities are never acted on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exempt_priorities: Vec<Priority>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum WasteAction {
    /// An audit entry (listed for finance and infra); the job keeps running.
    Notify,
    /// The job is cancelled with the reason.
    Stop,
    /// The attempt is stopped and the job queued again with the reason.
    Requeue,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum BudgetPeriod {
    /// The calendar month, UTC.
    #[default]
    Month,
    /// The ISO week (Monday 00:00 UTC).
    Week,
    /// `from` to `to`.
    Custom,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Enforcement {
    /// Jobs whose estimate does not fit the remaining budget are held.
    #[default]
    Hard,
    /// Only alerts.
    Soft,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BudgetRule {
    pub amount_usd: f64,
    pub period: BudgetPeriod,
    /// Custom periods only: the start (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<DateTime<Utc>>,
    /// Custom periods only: the end (RFC 3339), after `from`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<DateTime<Utc>>,
    /// Default `hard`.
    #[serde(default)]
    pub enforcement: Enforcement,
    /// Fractions of the amount at which to alert, each in (0, 1].
    #[serde(default)]
    pub alert_at: Vec<f64>,
}

/// Jobs of `priority` (all priorities when absent) may start only between `from` and `to`
/// (`HH:MM`, local time in `tz`; `from > to` wraps past midnight).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PolicyWindow {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<Priority>,
    pub from: String,
    pub to: String,
    /// IANA time zone, e.g. `Asia/Shanghai` (default `UTC`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tz: Option<String>,
}

/// A stored policy: its current version.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PolicyView {
    pub team: String,
    pub project: Option<String>,
    /// Starts at 1; every PUT adds one. Sent as the `ETag`.
    pub version: i64,
    pub updated_at: DateTime<Utc>,
    /// Who saved this version, e.g. `finance:alice`.
    pub updated_by: String,
    pub policy: PolicyBody,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PolicyList {
    pub policies: Vec<PolicyView>,
}

/// One change in the append-only audit log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct AuditEntry {
    pub id: i64,
    pub at: DateTime<Utc>,
    /// `role:name` of the token that made the change (or `system`).
    pub actor: String,
    /// `policy.put`, `pool.patch`, `token.create`, `budget.alert`…
    pub action: String,
    /// What changed, e.g. `policy:ml`, `pool:aws:us-east-1/p5.48xlarge`.
    pub target: String,
    #[schema(value_type = Option<Object>)]
    pub before: Option<serde_json::Value>,
    #[schema(value_type = Option<Object>)]
    pub after: Option<serde_json::Value>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct AuditList {
    /// Newest first.
    pub entries: Vec<AuditEntry>,
    /// Pass as `cursor` to get older entries; `null` on the last page.
    pub next_cursor: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct QueueDelay {
    pub p50: f64,
    pub p99: f64,
}

/// What the simulator measured for one policy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct WhatIfOutcome {
    pub total_cost_usd: f64,
    pub deadline_met_fraction: f64,
    pub queue_delay_s: QueueDelay,
    /// Jobs that never started under this policy.
    pub held_jobs: u32,
    /// What the replayed jobs cost per UTC day, by the day each cost was charged (when a job's
    /// run or a cloud node ended), from the first replayed submission to the last charge of
    /// either outcome; days with no cost included, so the two outcomes line up.
    #[serde(default)]
    pub cost_per_day: Vec<DayCost>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct DayCost {
    /// `YYYY-MM-DD` (UTC).
    pub day: String,
    pub cost_usd: f64,
}

/// `POST /policies/{team}/what-if`: the team's recorded jobs replayed under the current policy
/// and under the draft.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct WhatIfReport {
    pub jobs: u32,
    pub current: WhatIfOutcome,
    pub draft: WhatIfOutcome,
    /// Jobs the draft treats differently: held (never started) where the current policy ran
    /// them, released, moved to another pool, or ran at another cost. At most 200, the biggest
    /// cost differences first.
    #[serde(default)]
    pub changes: Vec<WhatIfChange>,
    /// What the draft's `utilization` rule would have done to the past period's recorded
    /// attempts; absent when the draft has no such rule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waste: Option<WhatIfWaste>,
}

/// The recorded attempts a draft `utilization` rule would have acted on (issue 28). Judged from
/// each attempt's longest idle stretch under the nearest recorded threshold at or under the
/// rule's (5, 10, 20, 30 or 50 %): a listed attempt certainly met the rule; one whose stretch
/// lay between two recorded thresholds may be missed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct WhatIfWaste {
    pub action: WasteAction,
    /// The recorded threshold the answer used (percent).
    pub judged_at_pct: Option<u32>,
    /// Attempts recorded in the period (of the team, or the draft's project).
    pub attempts_recorded: u32,
    /// Those the rule would have acted on, most GPU-hours freed first (at most 200).
    pub would_act: Vec<WhatIfWasted>,
    /// GPU-hours and dollars freed at least: each attempt's idle stretch past the window.
    pub gpu_hours_freed: f64,
    pub usd_freed: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct WhatIfWasted {
    pub job_id: Uuid,
    pub name: String,
    pub project: Option<String>,
    pub priority: Priority,
    pub gpus: u32,
    /// Its longest idle stretch under the threshold used, seconds.
    pub longest_idle_s: i64,
    pub gpu_hours_freed: f64,
    pub usd_freed: f64,
}

/// `GET /waste`: idle GPU-hours (jobs holding GPUs they do not use) in a period, by team, and
/// the jobs that wasted most.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct WasteReport {
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub teams: Vec<TeamWaste>,
    /// The jobs with the most idle GPU-hours, most first.
    pub worst: Vec<WastedJob>,
    pub total_idle_gpu_hours: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TeamWaste {
    pub team: String,
    pub idle_gpu_hours: f64,
    /// Jobs judged in the period.
    pub jobs: u32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct WastedJob {
    pub job_id: Uuid,
    pub team: String,
    pub project: Option<String>,
    pub name: String,
    pub priority: Priority,
    pub gpus: u32,
    pub idle_gpu_hours: f64,
    /// Its GPUs' mean activity at the last sample (percent); absent without a reading.
    pub activity_pct: Option<f64>,
    /// When its current idle stretch began; absent when it is not idle now.
    pub idle_since: Option<DateTime<Utc>>,
    pub last_sample_at: DateTime<Utc>,
    /// What the rule did (`notify`, `stop`, `requeue`), if it acted, and why.
    pub action: Option<WasteAction>,
    pub reason: Option<String>,
}

/// One job the draft policy treats differently from the current one.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct WhatIfChange {
    pub job_id: Uuid,
    pub name: String,
    pub project: Option<String>,
    /// `held` (runs now, never starts under the draft), `released` (the opposite), `moved`
    /// (starts first in another pool) or `cost` (same pool, another cost).
    pub change: String,
    /// The pool it first started in under each policy (`null`: never started).
    pub current_pool: Option<String>,
    pub draft_pool: Option<String>,
    pub current_cost_usd: f64,
    pub draft_cost_usd: f64,
}

/// `PATCH /pools/{id}`: infra's edits to a pool.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PoolPatch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_limit: Option<u32>,
    /// On-demand USD per GPU-hour (on-prem: the internal rate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub price_per_gpu_hour: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launchable: Option<bool>,
    /// An owned (not launchable) pool's marginal cost in USD per GPU-hour: power and wear, what
    /// one more hour of use costs the company in cash (0 or more). Finance's figure; a cloud
    /// pool's cash cost is its price and is refused here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub marginal_usd_per_gpu_hour: Option<f64>,
}

/// One row of a spend report. The group's key is named after the grouping (`team`, `project`,
/// `region`, `provider` or `pool`; `null` for entries without one, e.g. an instance whose job is
/// gone), e.g. `{"team": "ml", "amount_usd": 12.5}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SpendRow {
    #[serde(flatten)]
    #[schema(value_type = Object)]
    pub key: BTreeMap<String, Option<String>>,
    /// With `bucket`: the start of the hour or day (UTC) the row covers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket_start: Option<DateTime<Utc>>,
    /// What the ledger bills teams (chargeback): cloud time at its price, owned GPUs at the
    /// internal rate (or the team's on-prem rate).
    pub amount_usd: f64,
    /// What the same entries cost the company in cash: cloud time as billed, owned GPUs at
    /// their pool's marginal cost (`PoolView::cash_per_gpu_hour`).
    #[serde(default)]
    pub cash_usd: f64,
}

/// Owned GPUs' idle time in a spend report's window: GPU-hours of the nodes of owned (not
/// launchable) pools that no job held, and their worth at the internal rate. A cost of
/// ownership paid whether they run or not, in neither `total_usd` nor `total_cash_usd`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct OwnedIdle {
    pub gpu_hours: f64,
    pub usd: f64,
    /// Per pool, by pool id.
    pub pools: Vec<OwnedIdlePool>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct OwnedIdlePool {
    pub pool: String,
    pub gpu_hours: f64,
    pub usd: f64,
}

/// `GET /spend`: ledger entries whose period starts in `[from, to)`, grouped.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SpendReport {
    pub group_by: String,
    pub rows: Vec<SpendRow>,
    /// The sum of the ledger entries in the window (for the caller's scope): chargeback.
    pub total_usd: f64,
    /// The same entries in cash: what the company paid.
    #[serde(default)]
    pub total_cash_usd: f64,
    /// Owned GPUs' idle time in the window (hours whose start is in it). Absent for a caller
    /// who sees one team only: idle GPUs are no team's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owned_idle: Option<OwnedIdle>,
}

/// Where a team's (or project's) budget stands this period.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct BudgetView {
    pub team: String,
    pub project: Option<String>,
    pub period_start: DateTime<Utc>,
    pub period_end: DateTime<Utc>,
    pub amount_usd: f64,
    /// The ledger in the period.
    pub spent_usd: f64,
    /// Estimates of live work (and launches in flight) beyond what they have accrued.
    pub committed_usd: f64,
    /// `amount − spent − committed`; negative when over.
    pub remaining_usd: f64,
    pub enforcement: Enforcement,
    pub alert_at: Vec<f64>,
    /// The `alert_at` fractions spend has reached this period.
    pub alerts_crossed: Vec<f64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct BudgetList {
    pub budgets: Vec<BudgetView>,
}

/// An inference service as deployed (`POST /api/v1/services`, `PUT …/{id}`; TOML through the
/// CLI). Its replicas are jobs of kind `service` placed by the same planner. Only `name`,
/// `team`, `command` and `resources.gpus` are required.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ServiceSpec {
    pub name: String,
    pub team: String,
    #[serde(default)]
    pub project: Option<String>,
    /// argv; run without a shell. A replica listens on the port in `$PORT`.
    pub command: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Per replica.
    pub resources: ResourceSpec,
    /// `normal` when left out. `critical` and `high` services preempt batch work.
    #[serde(default)]
    pub priority: Option<Priority>,
    /// One replica when left out.
    #[serde(default)]
    pub replicas: Option<ReplicaRange>,
    #[serde(default)]
    pub scaling: Option<ScalingSpec>,
    /// Minimum replicas at times of the week.
    #[serde(default)]
    pub schedule: Vec<ScheduleRule>,
    /// `GET` on the replica's port; a replica gets traffic only while it passes.
    #[serde(default)]
    pub readiness: Option<ReadinessSpec>,
    /// Where the service's callers are; shares sum to 1.
    #[serde(default)]
    pub callers: Vec<CallerShare>,
    /// Allow-list of regions (empty: any region the policy allows).
    #[serde(default)]
    pub regions: Vec<String>,
    /// The most network latency from the callers' regions to a replica's region.
    #[serde(default)]
    pub max_latency_ms: Option<u32>,
    #[serde(default)]
    pub spot: Option<ServiceSpot>,
    /// USD per hour, per replica.
    #[serde(default)]
    pub max_price_per_hour: Option<f64>,
    /// Anyone may call it through the gateway, without a token.
    #[serde(default)]
    pub public: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReplicaRange {
    pub min: i64,
    pub max: i64,
}

/// The autoscaler's targets. Every field optional; a service with none scales on its schedule
/// and `replicas.min` only.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ScalingSpec {
    #[serde(default)]
    pub target_p95_latency_ms: Option<i64>,
    #[serde(default)]
    pub target_rps_per_replica: Option<f64>,
    /// Requests a replica serves at once; more wait in the gateway's queue.
    #[serde(default)]
    pub max_concurrency_per_replica: Option<i64>,
    /// Seconds of traffic the signals are computed over (default 30).
    #[serde(default)]
    pub window_s: Option<i64>,
    /// Seconds a signal must hold before replicas are added (default 15).
    #[serde(default)]
    pub scale_up_delay_s: Option<i64>,
    /// Seconds a signal must hold before replicas are removed (default 120).
    #[serde(default)]
    pub scale_down_delay_s: Option<i64>,
}

/// At least `min_replicas` on `days` from `from` to `to` (`HH:MM`, in `tz`, an IANA zone).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ScheduleRule {
    /// `mon` … `sun`.
    pub days: Vec<String>,
    pub from: String,
    pub to: String,
    pub tz: String,
    pub min_replicas: i64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadinessSpec {
    /// Starts with `/`.
    pub path: String,
    /// Seconds between probes (default 2).
    #[serde(default)]
    pub period_s: Option<i64>,
    /// Seconds a probe may take (default 1).
    #[serde(default)]
    pub timeout_s: Option<i64>,
    /// Failed probes in a row before a ready replica is not ready (default 3).
    #[serde(default)]
    pub failure_threshold: Option<i64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CallerShare {
    /// A catalogue region id, e.g. `aws:us-east-1`.
    pub region: String,
    pub share: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ServiceSpot {
    pub rule: SpotRule,
    /// Replicas kept on on-demand capacity whatever runs on spot (default 1).
    #[serde(default)]
    pub min_on_demand: Option<i64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ServiceState {
    /// No replica of the current version is ready yet.
    Deploying,
    /// At least the desired replicas of the current version are ready.
    Ready,
    /// Some, but fewer than desired, are ready.
    Degraded,
    /// Deleted: draining or gone.
    Stopped,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ReplicaState {
    Starting,
    Ready,
    Draining,
    Failed,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ReplicaView {
    /// The replica's job.
    pub job_id: Uuid,
    pub spec_version: i64,
    pub state: ReplicaState,
    pub region: Option<String>,
    pub pool: Option<String>,
    pub node: Option<String>,
    pub market: Option<String>,
    /// Over the service's window, as the gateway saw it.
    pub rps: f64,
    pub in_flight: u32,
    pub p95_ms: Option<f64>,
}

/// What the gateway saw over the service's window.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TrafficView {
    pub window_s: i64,
    pub requests: u64,
    pub errors: u64,
    pub rps: f64,
    pub p50_ms: Option<f64>,
    pub p95_ms: Option<f64>,
    pub p99_ms: Option<f64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ServiceView {
    pub id: Uuid,
    pub name: String,
    pub team: String,
    pub project: Option<String>,
    pub state: ServiceState,
    /// `http://HOST:PORT/svc/TEAM/NAME/` on the gateway.
    pub endpoint: String,
    pub spec_version: i64,
    pub desired_replicas: u32,
    /// Why, in words ("schedule mon–fri 08:00–20:00: at least 4").
    pub desired_reason: String,
    pub replicas: Vec<ReplicaView>,
    pub traffic: TrafficView,
    /// What the ledger attributes to the service's replicas so far (USD).
    pub cost_usd: f64,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// The current version's spec, as deployed.
    pub spec: ServiceSpec,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ServiceList {
    pub services: Vec<ServiceView>,
}

/// A scaling or placement decision about a service, with its reason.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ServiceEventView {
    pub id: i64,
    pub at: DateTime<Utc>,
    /// e.g. `deployed`, `updated`, `scaled`, `replica_started`, `replica_ready`,
    /// `replica_failed`, `replica_drained`, `deleted`.
    pub kind: String,
    pub message: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ServiceEventList {
    pub events: Vec<ServiceEventView>,
}

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
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResourceSpec {
    pub gpus: i64,
    #[serde(default)]
    pub gpu_models: Vec<String>,
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
    pub node: String,
    pub gpus: Vec<u32>,
    pub market: String,
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
    /// The spec as submitted.
    pub spec: JobSpec,
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
    pub nodes: u32,
    pub node_limit: u32,
    pub launchable: bool,
    pub gpus_total: u32,
    pub gpus_free: u32,
    /// On-demand USD per GPU-hour (on-prem: the internal rate).
    pub price_per_gpu_hour: f64,
    pub spot_price_per_gpu_hour: Option<f64>,
    pub latency_ms: u32,
    pub boot_time_s: u32,
    pub price_updated_at: DateTime<Utc>,
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
    pub last_error: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct InstanceList {
    pub instances: Vec<InstanceView>,
}

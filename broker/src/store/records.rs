//! Row shapes the store reads and writes. Domain values where they exist; plain fields where the
//! row is storage-only.

use switchyard_core::{
    AttemptId, JobId, JobSpec, JobState, Market, Money, NodeId, PoolId, Priority, Timestamp,
};
use switchyard_protocol::api::Role;
use uuid::Uuid;

#[derive(Clone, Debug, PartialEq)]
pub struct ApiTokenRecord {
    pub id: Uuid,
    pub token_hash: String,
    pub role: Role,
    pub team: Option<String>,
    pub name: Option<String>,
    pub created_at: Timestamp,
    pub revoked: bool,
}

/// A console (browser) session: the hash of its id, the API token it acts as, its CSRF token.
#[derive(Clone, Debug, PartialEq)]
pub struct ConsoleSessionRecord {
    pub id_hash: String,
    pub api_token_id: Uuid,
    pub csrf_token: String,
    pub created_at: Timestamp,
    pub expires_at: Timestamp,
    pub revoked_at: Option<Timestamp>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct EnrolmentTokenRecord {
    pub token_hash: String,
    pub pool: PoolId,
    /// The launched instance this token belongs to; its agent binds to it at enrolment.
    pub instance: Option<String>,
    pub created_at: Timestamp,
    pub expires_at: Timestamp,
}

#[derive(Clone, Debug, PartialEq)]
pub struct NewNode {
    pub id: NodeId,
    pub token_hash: String,
    pub hostname: String,
    /// Where other nodes reach it (`RegisterRequest::address`).
    pub address: Option<String>,
    pub gpus_total: u32,
    pub inventory_json: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RegisterRefusal {
    UnknownToken,
    AlreadyUsed,
    Expired,
    /// The token was minted for a launched instance that is no longer booting (the broker
    /// terminated it, or it enrolled already).
    InstanceGone,
}

impl std::fmt::Display for RegisterRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RegisterRefusal::UnknownToken => "unknown enrolment token",
            RegisterRefusal::AlreadyUsed => "enrolment token already used",
            RegisterRefusal::Expired => "enrolment token expired",
            RegisterRefusal::InstanceGone => {
                "the instance this enrolment token was issued for is no longer booting"
            }
        })
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct NodeRecord {
    pub id: NodeId,
    pub pool: PoolId,
    pub hostname: String,
    pub gpus_total: u32,
    pub inventory_json: String,
    pub healthy: bool,
    pub draining: bool,
    pub revoked: bool,
    pub registered_at: Timestamp,
    pub last_heartbeat: Timestamp,
    /// Its unhealthy GPUs and why (`rules/health.rs`); empty when all are healthy.
    pub gpu_marks: Vec<crate::rules::health::GpuMark>,
}

/// What `Store::apply_gpu_health` did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuHealthChange {
    /// The node's marks changed (the scheduler must reload its nodes).
    pub changed: bool,
    /// The node's marks now (when changed).
    pub marks: Vec<crate::rules::health::GpuMark>,
    /// Attempts on a GPU that fell off the bus, ended: the agent must stop them.
    pub stopped: Vec<switchyard_protocol::agent::AttemptRef>,
    pub requeued: Vec<JobId>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct ExpiredLeases {
    pub nodes: Vec<NodeId>,
    pub requeued: Vec<JobId>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct NewJob {
    pub id: JobId,
    pub spec: JobSpec,
    /// The spec exactly as submitted (wire JSON), served back to users.
    pub spec_json: String,
    pub submitted_at: Timestamp,
    /// W3C trace context of the submit span (only when traces are exported).
    pub trace_parent: Option<String>,
    /// Set for a service's replica (inserted by the services reconciler, never batched).
    pub replica: Option<ReplicaOf>,
}

/// The service a replica job runs, at which spec version, and how its agent serves it.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplicaOf {
    pub service: uuid::Uuid,
    pub version: i64,
    pub serve: switchyard_protocol::agent::ServeSpec,
}

/// The `Idempotency-Key` of a submission: the key as sent, the scope it lives in (the
/// caller's team, or its token when it has none) and a digest of the request's spec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdempotencyKey {
    pub scope: String,
    pub key: String,
    pub request_hash: String,
}

/// What [`crate::store::Store::insert_job_idempotent`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IdempotentInsert {
    /// The job was inserted with its key.
    Inserted,
    /// The key already names `job` (within the key lifetime); `same_request` when its
    /// request digest is this one's. Nothing was written.
    Existing { job: JobId, same_request: bool },
}

#[derive(Clone, Debug, PartialEq)]
pub struct JobRecord {
    pub id: JobId,
    pub spec: JobSpec,
    pub spec_json: String,
    pub state: JobState,
    pub submitted_at: Timestamp,
    pub started_at: Option<Timestamp>,
    pub finished_at: Option<Timestamp>,
    pub exit_code: Option<i32>,
    pub reason: Option<String>,
    pub cancel_requested: bool,
    pub attempts: u32,
    pub version: i64,
    pub explanation_json: Option<String>,
    /// The current or last attempt, with its placement.
    pub placement: Option<AttemptPlacement>,
    /// What the ledger attributes to the job so far.
    pub cost: Money,
}

#[derive(Clone, Debug, PartialEq)]
pub struct AttemptPlacement {
    pub attempt: AttemptId,
    pub node: NodeId,
    pub pool: PoolId,
    pub region: String,
    pub gpus: Vec<u32>,
    pub market: Market,
    /// A multi-node job's ranks in rank order (filled by [`Store::job`] only).
    pub ranks: Vec<RankPlacement>,
}

/// One rank of a gang: its node, GPUs, attempt state and exit code.
#[derive(Clone, Debug, PartialEq)]
pub struct RankPlacement {
    pub rank: u32,
    pub node: NodeId,
    pub gpus: Vec<u32>,
    pub state: String,
    pub exit_code: Option<i32>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct JobFilter {
    /// Only this team's jobs (developers always get their own team here).
    pub team: Option<String>,
    pub state: Option<JobState>,
    pub priority: Option<Priority>,
    pub name: Option<String>,
    /// Jobs with ids below this one (ids are time-ordered; lists are newest first).
    pub before: Option<JobId>,
    pub limit: i64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CancelOutcome {
    NotFound,
    /// Already finished: nothing to do.
    AlreadyFinished(JobState),
    /// Was waiting or not yet started: cancelled now. `withdrawn`: the leases handed out but
    /// not started (a gang's ranks, one per node), whose GPUs are free now.
    Cancelled {
        withdrawn: Vec<(AttemptId, NodeId)>,
    },
    /// Running: the agents are told to stop it (on `nodes`); the job becomes `cancelled` when
    /// one reports. A gang's ranks not started yet are `withdrawn` at once.
    Stopping {
        nodes: Vec<NodeId>,
        withdrawn: Vec<(AttemptId, NodeId)>,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct NewAttempt {
    pub id: AttemptId,
    pub job: JobId,
    /// The job version the plan was made from (compare-and-swap).
    pub job_version: i64,
    pub node: NodeId,
    pub pool: PoolId,
    pub gpus: Vec<u32>,
    pub market: Market,
    pub estimated_cost: Money,
    /// What the attempt costs an hour while it runs on a node the broker did not launch
    /// (GPUs × the pool's per-GPU rate, or the team's on-prem rate): what the ledger accrues.
    pub hourly_rate: Money,
    /// What it costs the company in cash an hour there (GPUs × the pool's cash rate: an owned
    /// pool's marginal cost): what the ledger's `cash_micros` accrues.
    pub hourly_cash: Money,
    pub expected_end: Timestamp,
    /// Its rank in a multi-node job's gang (0 for a single-node job); a gang's attempts are
    /// committed adjacent, rank 0 first.
    pub rank: u32,
}

#[derive(Clone, Debug, PartialEq)]
pub struct AttemptRecord {
    pub id: AttemptId,
    pub job: JobId,
    pub node: NodeId,
    pub gpus: Vec<u32>,
    pub priority: switchyard_core::Priority,
    pub created_at: Timestamp,
    pub expected_end: Timestamp,
    /// Being preempted: told to stop, GPUs still held until the agent reports the end.
    pub stopping: bool,
}

/// The GPUs one live attempt holds, and whose work it is.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuAllocation {
    pub attempt: AttemptId,
    pub node: NodeId,
    pub gpus: Vec<u32>,
    pub job: JobId,
    pub team: String,
    pub name: String,
    pub priority: switchyard_core::Priority,
    /// When the job started (its first attempt's start), if it has.
    pub started_at: Option<Timestamp>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct LeaseRecord {
    pub job: JobId,
    pub attempt: AttemptId,
    pub epoch: u64,
    pub spec: JobSpec,
    pub gpus: Vec<u32>,
    pub trace_parent: Option<String>,
    /// A service replica's serve spec (its port and readiness probe).
    pub serve: Option<switchyard_protocol::agent::ServeSpec>,
    /// A gang rank's place among its nodes (`rules::gang::env`); empty for single-node jobs.
    pub gang_env: Vec<(String, String)>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct EndedAttempt {
    pub attempt: AttemptId,
    pub job: JobId,
    pub node: NodeId,
    pub final_state: JobState,
}

#[derive(Clone, Debug, PartialEq)]
pub struct LogRecord {
    pub offset: i64,
    pub attempt_no: u32,
    pub stream: String,
    pub data: String,
    pub at: Timestamp,
}

/// Where a launched instance is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InstanceState {
    Requested,
    Booting,
    Ready,
    Draining,
    Terminated,
}

impl InstanceState {
    pub fn as_str(self) -> &'static str {
        match self {
            InstanceState::Requested => "requested",
            InstanceState::Booting => "booting",
            InstanceState::Ready => "ready",
            InstanceState::Draining => "draining",
            InstanceState::Terminated => "terminated",
        }
    }

    pub fn parse(s: &str) -> Option<InstanceState> {
        [
            InstanceState::Requested,
            InstanceState::Booting,
            InstanceState::Ready,
            InstanceState::Draining,
            InstanceState::Terminated,
        ]
        .into_iter()
        .find(|st| st.as_str() == s)
    }

    pub fn is_live(self) -> bool {
        self != InstanceState::Terminated
    }
}

/// An instance the scheduler wants launched for a job.
#[derive(Clone, Debug, PartialEq)]
pub struct NewInstance {
    pub id: String,
    pub provider: String,
    pub pool: PoolId,
    pub region: String,
    pub market: Market,
    pub hourly_price: Money,
    pub for_job: JobId,
    /// The job version the plan was made from (compare-and-swap).
    pub job_version: i64,
    /// The planner's estimate for the job: reserved against its team's budget until the job
    /// is placed on the instance.
    pub estimated_cost: Money,
}

#[derive(Clone, Debug, PartialEq)]
pub struct InstanceRecord {
    pub id: String,
    pub provider: String,
    pub provider_id: Option<String>,
    pub pool: PoolId,
    pub region: String,
    pub market: Market,
    pub state: InstanceState,
    pub hourly_price: Money,
    pub for_job: Option<JobId>,
    pub node: Option<NodeId>,
    pub launch_attempts: u32,
    pub next_attempt_at: Timestamp,
    pub last_error: Option<String>,
    /// Why it ended (idle past its TTL, a boot timeout, gone at the provider).
    pub end_reason: Option<String>,
    pub requested_at: Timestamp,
    pub launched_at: Option<Timestamp>,
    pub ready_at: Option<Timestamp>,
    pub idle_since: Option<Timestamp>,
    pub ended_at: Option<Timestamp>,
}

/// What a failed launch does next.
#[derive(Clone, Debug, PartialEq)]
pub enum LaunchFailure {
    /// Transient: try again at this time.
    RetryAt(Timestamp),
    /// Give up on this instance (its job goes back to the queue); back the pool off until then.
    GiveUp {
        pool_backoff_until: Option<Timestamp>,
    },
}

/// The current (or a past) version of a team's or project's policy.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyRecord {
    pub team: String,
    /// `None`: the team-wide policy.
    pub project: Option<String>,
    /// Starts at 1.
    pub version: i64,
    pub body: switchyard_protocol::api::PolicyBody,
    pub updated_at: Timestamp,
    pub updated_by: String,
}

/// A policy write lost its compare-and-swap: the version the caller expected is not current.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyConflict {
    /// The current version (`None`: there is no policy yet).
    pub current: Option<i64>,
}

/// A row to append to the audit log. `before`/`after` are JSON text.
#[derive(Clone, Debug, PartialEq)]
pub struct NewAuditEntry {
    pub at: Timestamp,
    pub actor: String,
    pub action: String,
    pub target: String,
    pub before_json: Option<String>,
    pub after_json: Option<String>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct AuditRecord {
    pub id: i64,
    pub at: Timestamp,
    pub actor: String,
    pub action: String,
    pub target: String,
    pub before_json: Option<String>,
    pub after_json: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct AuditFilter {
    /// Only entries for this target (exact).
    pub target: Option<String>,
    /// Only entries by this actor (`finance:alice`), or by every actor of a role (`finance`).
    pub actor: Option<String>,
    /// Only entries of this action (exact, e.g. `policy.update`).
    pub action: Option<String>,
    /// Only entries at or after this time.
    pub from: Option<Timestamp>,
    /// Only entries before this time.
    pub to: Option<Timestamp>,
    /// Entries with ids below this one (lists are newest first).
    pub before: Option<i64>,
    pub limit: i64,
}

/// Infra's edit of a pool; `None` leaves a field as it is.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PoolChange {
    pub node_limit: Option<u32>,
    /// Per node and hour.
    pub on_demand_per_hour: Option<Money>,
    pub launchable: Option<bool>,
    /// An owned pool's marginal cost, per node and hour.
    pub marginal_per_hour: Option<Money>,
}

/// How spend is grouped (`GET /spend?group_by=`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpendGroup {
    Team,
    Project,
    Region,
    Provider,
    Pool,
    /// `job` (a job's own time), `instance_boot` or `instance_idle` (a cloud instance's time
    /// before its node was ready, or with no job on it: the team's overhead).
    Usage,
}

impl SpendGroup {
    pub fn parse(s: &str) -> Option<SpendGroup> {
        Some(match s {
            "team" => SpendGroup::Team,
            "project" => SpendGroup::Project,
            "region" => SpendGroup::Region,
            "provider" => SpendGroup::Provider,
            "pool" => SpendGroup::Pool,
            "usage" => SpendGroup::Usage,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SpendGroup::Team => "team",
            SpendGroup::Project => "project",
            SpendGroup::Region => "region",
            SpendGroup::Provider => "provider",
            SpendGroup::Pool => "pool",
            SpendGroup::Usage => "usage",
        }
    }
}

/// Time buckets of a spend report (UTC).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpendBucket {
    Hour,
    Day,
}

impl SpendBucket {
    pub fn parse(s: &str) -> Option<SpendBucket> {
        match s {
            "hour" => Some(SpendBucket::Hour),
            "day" => Some(SpendBucket::Day),
            _ => None,
        }
    }

    pub fn millis(self) -> i64 {
        match self {
            SpendBucket::Hour => 3_600_000,
            SpendBucket::Day => 86_400_000,
        }
    }
}

/// Ledger entries whose period starts in `[from, to)`, of one team or all, grouped.
#[derive(Clone, Debug, PartialEq)]
pub struct SpendQuery {
    pub group: SpendGroup,
    pub bucket: Option<SpendBucket>,
    pub from: Option<Timestamp>,
    pub to: Option<Timestamp>,
    pub team: Option<String>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct SpendGroupRow {
    /// The group's key (`None`: entries with no team, project…).
    pub key: Option<String>,
    pub bucket_start: Option<Timestamp>,
    pub amount: Money,
    /// The same entries in cash (`cash_micros`).
    pub cash: Money,
}

/// Owned GPUs' idle time of one pool in a window (`owned_idle`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnedIdleRow {
    pub pool: String,
    pub idle_gpu_ms: i64,
    pub worth: Money,
}

/// A budget's use: what the ledger holds in its period, and what live work is still expected
/// to cost beyond what it has accrued (launches in flight included).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BudgetUsage {
    pub spent: Money,
    pub committed: Money,
}

/// One ledger entry.
#[derive(Clone, Debug, PartialEq)]
pub struct LedgerEntry {
    pub id: i64,
    pub at: Timestamp,
    /// `attempt` or `instance`.
    pub kind: String,
    /// `attempt:<id>` or `instance:<id>`.
    pub source: Option<String>,
    pub team: Option<String>,
    pub project: Option<String>,
    pub job: Option<String>,
    pub attempt: Option<String>,
    pub instance: Option<String>,
    pub provider: String,
    pub region: String,
    pub pool: String,
    pub period_start: Timestamp,
    pub period_end: Timestamp,
    /// What the ledger bills the team (chargeback).
    pub amount: Money,
    /// What the same time cost the company in cash: `amount` for a cloud instance, the pool's
    /// marginal cost for an attempt on an owned node.
    pub cash: Money,
}

/// A service to create (`POST /services`): its first spec version and what it starts with.
#[derive(Clone, Debug, PartialEq)]
pub struct NewService {
    pub id: Uuid,
    pub team: String,
    pub project: Option<String>,
    pub name: String,
    /// The spec as deployed (wire JSON), served back to users.
    pub spec_json: String,
    pub desired_replicas: u32,
    pub desired_reason: String,
    pub created_at: Timestamp,
}

/// A service as stored: its current spec version, what the autoscaler decided, and what the
/// ledger attributes to its replicas.
#[derive(Clone, Debug, PartialEq)]
pub struct ServiceRecord {
    pub id: Uuid,
    pub team: String,
    pub project: Option<String>,
    pub name: String,
    pub spec_json: String,
    /// 1 at creation; each `PUT` that changes the spec adds one.
    pub spec_version: i64,
    pub desired_replicas: u32,
    pub desired_reason: String,
    pub created_at: Timestamp,
    /// When the spec last changed (or the service was deleted).
    pub updated_at: Timestamp,
    /// Set by `DELETE`: its replicas drain.
    pub deleted_at: Option<Timestamp>,
    /// The ledger's amounts for the service's replica jobs, all versions.
    pub cost: Money,
}

/// What [`crate::store::Store::insert_service`] did.
#[derive(Clone, Debug, PartialEq)]
pub enum ServiceInsert {
    Inserted(ServiceRecord),
    /// The team has a live service of that name already (`existing`); nothing was written.
    NameTaken {
        existing: Uuid,
    },
}

/// What [`crate::store::Store::update_service_spec`] did.
#[derive(Clone, Debug, PartialEq)]
pub enum ServiceUpdate {
    /// A new spec version, with its `updated` event.
    Updated(ServiceRecord),
    NotFound,
    /// Deleted: its spec no longer changes.
    Deleted,
    /// The compare-and-swap lost: the current version is `current`; nothing was written.
    Stale {
        current: i64,
    },
}

/// What [`crate::store::Store::delete_service`] did.
#[derive(Clone, Debug, PartialEq)]
pub enum ServiceDelete {
    /// Marked deleted now (desired replicas 0), with its `deleted` event.
    Deleted(ServiceRecord),
    NotFound,
    /// Deleted before, at this time.
    AlreadyDeleted(Timestamp),
}

/// One entry of a service's event log: a scaling or placement decision with its reason.
#[derive(Clone, Debug, PartialEq)]
pub struct ServiceEventRecord {
    /// Increasing across all services: read on with `after`.
    pub id: i64,
    pub service: Uuid,
    pub at: Timestamp,
    /// `deployed`, `updated`, `scaled`, `deleted`, `replica_started`, …
    pub kind: String,
    pub message: String,
    pub details_json: Option<String>,
}

/// A replica of a service: its job and, once placed, its current attempt.
#[derive(Clone, Debug, PartialEq)]
pub struct ServiceReplicaRow {
    pub job: JobId,
    /// The spec version the replica runs.
    pub service_version: i64,
    pub job_state: JobState,
    /// Drained (or cancelled by a user): the agent stops it, and it ends `cancelled`.
    pub cancel_requested: bool,
    /// When the reconciler began draining it (no new requests; cancelled once idle).
    pub drain_at: Option<Timestamp>,
    /// When the job ended, if it has.
    pub finished_at: Option<Timestamp>,
    /// Why it failed or was cancelled, when it did.
    pub reason: Option<String>,
    /// Its job never takes spot (started to keep the service's `spot.min_on_demand`).
    pub on_demand_only: bool,
    pub attempt: Option<ReplicaAttemptRow>,
}

/// The current attempt of a replica: where it runs and how it serves.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplicaAttemptRow {
    pub attempt: AttemptId,
    pub state: crate::rules::lease::AttemptState,
    pub node: NodeId,
    pub pool: PoolId,
    /// The pool's region (empty when the pool is no longer in the catalogue).
    pub region: String,
    pub market: Market,
    /// Where the replica listens, as its agent reported it.
    pub serve_host: Option<String>,
    pub serve_port: Option<u16>,
    /// Its readiness probe passes (the agent's last report).
    pub ready: bool,
    /// Its node is draining: a spot interruption notice, or an operator's drain. The replica
    /// serves on until a replacement is ready.
    pub node_draining: bool,
}

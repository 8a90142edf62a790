//! The agent protocol under `/agent/v1`.
//!
//! - `POST /agent/v1/register` (`Authorization: Bearer <one-time enrolment token>`, checked
//!   before the body is read; the body is at most 256 KiB) → agent id and agent token. All
//!   other calls send `Authorization: Bearer <agent token>`.
//! - `POST /agent/v1/heartbeat` every `heartbeat_interval_s`: inventory, metrics and the
//!   attempts the agent runs → attempts to stop, drain. A heartbeat renews the node's lease.
//!   A heartbeat carrying an [`InterruptionNotice`] (sent at once when the cloud announces the
//!   machine's end) drains the node and requeues its work: the answer's `stop` lists the
//!   attempts to SIGTERM now, so that they checkpoint before the machine dies.
//! - `GET /agent/v1/work?wait_s=N` long-poll: returns as soon as there are leases to start or
//!   attempts to stop, or after `wait_s` with empty lists. Delivery is at-least-once: the same
//!   lease may come again until the agent reports it started; agents deduplicate by attempt id.
//! - `POST /agent/v1/events`: started, log chunks (per-attempt sequence numbers from 0, in
//!   order), finished. Each event carries its attempt and lease epoch; events for an attempt the
//!   agent does not hold (or an old epoch) are rejected, duplicates are acknowledged again.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use uuid::Uuid;

/// One accelerator as its agent sees it: what it is, and (read on every heartbeat) how busy and
/// how healthy it is. A reading the source cannot give is absent, never zero; every field added
/// after the first stage is left out of the JSON when absent or empty, so that a broker from
/// before it still reads the rest (upgrade brokers before agents).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuInfo {
    pub index: u32,
    pub uuid: String,
    /// Normalised model name (`H100`, `A100-80GB`, `MI300X`, …).
    pub model: String,
    pub memory_mb: u64,
    #[serde(default)]
    pub memory_used_mb: Option<u64>,
    #[serde(default)]
    pub utilization_pct: Option<u32>,
    #[serde(default)]
    pub temperature_c: Option<u32>,
    #[serde(default)]
    pub power_w: Option<f64>,
    /// Who made it: `nvidia`, `amd`, `intel`, `google`, `aws`. Absent from older agents: the
    /// broker derives it from the model (`switchyard_core::gpu_model::vendor`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vendor: Option<String>,
    /// SM (graphics) clock now, MHz.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sm_clock_mhz: Option<u32>,
    /// The temperature at which the GPU slows itself down (NVML's slowdown threshold; for
    /// simulated GPUs the model's published figure). Above it the GPU is unhealthy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slowdown_temp_c: Option<u32>,
    /// Profiling activity over the last sample period (NVML GPM on Hopper and later, or
    /// DCGM profiling); absent where the GPU or driver cannot give it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profiling: Option<GpuProfiling>,
    /// Error and throttle state; absent where the source reports none of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<GpuHealthReport>,
}

/// Profiling metrics: fractions of the sample period, in percent (0–100).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuProfiling {
    /// Time at least one warp was resident on an SM, averaged over SMs (`DCGM_FI_PROF_SM_ACTIVE`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sm_active_pct: Option<f64>,
    /// Resident warps over the most an SM holds (`DCGM_FI_PROF_SM_OCCUPANCY`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sm_occupancy_pct: Option<f64>,
    /// Time the memory interface was busy (`DCGM_FI_PROF_DRAM_ACTIVE`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dram_active_pct: Option<f64>,
}

/// What the driver says about a GPU's errors and throttling.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuHealthReport {
    /// XID errors the driver raised since the last heartbeat the broker answered (the agent
    /// keeps them until one is answered, so a lost heartbeat loses none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub xid_events: Vec<u32>,
    /// Volatile ECC error counts (since the driver loaded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ecc_corrected_volatile: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ecc_uncorrected_volatile: Option<u64>,
    /// Clock throttle reasons active now, snake case: `sw_power_cap`, `hw_slowdown`,
    /// `hw_thermal_slowdown`, `sw_thermal_slowdown`, `hw_power_brake_slowdown`, `sync_boost`…
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub throttle_reasons: Vec<String>,
    /// Pages retired for double-bit errors (pre-Ampere) or rows remapped for uncorrectable
    /// errors (Ampere and later).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retired_pages: Option<u64>,
    /// A row remapping failed, or a retirement or remapping waits for a reset.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reset_required: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Inventory {
    pub gpus: Vec<GpuInfo>,
    pub cpus: u32,
    pub memory_mb: u64,
    /// True when the GPUs were declared with `--fake-gpus` rather than read from NVML.
    pub simulated: bool,
    /// True when the agent runs each job as its own unprivileged uid with a clean environment
    /// (it runs as root with a job uid range); false for an agent that runs jobs as its own
    /// user (a developer's `switchyard up`). Absent from older agents: false.
    #[serde(default)]
    pub isolation: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegisterRequest {
    pub hostname: String,
    pub agent_version: String,
    pub inventory: Inventory,
    /// The address other nodes reach this one at (the agent's `--advertise-host`): what a
    /// multi-node job's ranks get as `SWITCHYARD_NODE_IPS` and `MASTER_ADDR`. Absent from
    /// older agents: the hostname stands in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegisterResponse {
    pub agent_id: Uuid,
    pub node_id: String,
    pub pool: String,
    pub agent_token: String,
    pub heartbeat_interval_s: u64,
    /// The broker requeues a node's work this long after its last heartbeat. The agent stops
    /// its jobs before then when it cannot renew the lease (self-fencing); 0 turns that off.
    pub lease_ttl_s: u64,
}

/// Names one lease: a job's attempt under an epoch.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttemptRef {
    pub job_id: Uuid,
    pub attempt_id: Uuid,
    pub epoch: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Heartbeat {
    pub inventory: Inventory,
    /// Attempts whose process is alive on this agent.
    pub running: Vec<AttemptRef>,
    /// The cloud announced that this machine will be taken away (a spot interruption). Sent
    /// with every heartbeat from the first notice on; the broker drains the node and answers
    /// its live attempts in `stop` so that they checkpoint before the machine dies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interruption: Option<InterruptionNotice>,
    /// Service replicas running here: where each listens and whether its readiness probe
    /// passes. Left out of the JSON when empty (brokers from before services read the rest).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub serving: Vec<ReplicaReport>,
}

/// A service replica as its agent sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplicaReport {
    pub attempt: AttemptRef,
    /// The address the gateway reaches the replica at (the agent's `--advertise-host`).
    pub host: String,
    /// The port the agent gave the replica in `$PORT`.
    pub port: u16,
    /// Its readiness probe passes (always true for a replica without one, once started).
    pub ready: bool,
}

/// A cloud's notice that it will reclaim the machine, as read from its instance metadata
/// (EC2: `spot/instance-action`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InterruptionNotice {
    /// What the cloud will do: `terminate`, `stop` or `hibernate` (EC2); `terminate` when the
    /// notice did not say.
    pub action: String,
    /// When, as the cloud wrote it (EC2: RFC 3339 UTC), if it said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeartbeatResponse {
    /// Attempts the agent must stop (cancelled, or no longer its lease).
    pub stop: Vec<AttemptRef>,
    /// Finish current work, take nothing new.
    pub drain: bool,
}

/// Permission to run one attempt.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Lease {
    pub attempt: AttemptRef,
    /// argv; no shell.
    pub command: Vec<String>,
    pub env: BTreeMap<String, String>,
    /// GPU indexes for `CUDA_VISIBLE_DEVICES`.
    pub gpus: Vec<u32>,
    /// Seconds between SIGTERM and SIGKILL when the attempt is stopped.
    pub grace_s: u64,
    /// W3C trace context of the job's trace, when the broker exports traces: the agent's span
    /// for the run joins it, and the job sees it as `TRACEPARENT`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    /// Set for a service replica: the agent gives it a free port in `$PORT`, probes it and
    /// reports it in heartbeats (`Heartbeat::serving`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serve: Option<ServeSpec>,
    /// The job's declared GPU utilisation (`expected_gpu_utilization`, percent): simulated GPUs
    /// (`--fake-gpus`) run at this level while the attempt holds them. Real GPUs ignore it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_gpu_utilization_pct: Option<u32>,
}

/// How the agent runs a service replica.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServeSpec {
    /// `GET http://127.0.0.1:$PORT{path}` answered 2xx means ready; `None`: ready once started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readiness: Option<Readiness>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Readiness {
    pub path: String,
    pub period_ms: u64,
    pub timeout_ms: u64,
    /// Failed probes in a row before a ready replica is reported not ready.
    pub failure_threshold: u32,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkResponse {
    pub leases: Vec<Lease>,
    pub stop: Vec<AttemptRef>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    Stdout,
    Stderr,
    /// The agent's own messages about the attempt.
    System,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum AgentEvent {
    Started {
        attempt: AttemptRef,
        pid: u32,
    },
    Log {
        attempt: AttemptRef,
        /// Per attempt, from 0, no gaps.
        seq: u64,
        stream: Stream,
        data: String,
    },
    Finished {
        attempt: AttemptRef,
        /// The process exit code; `None` when it died by a signal or never started.
        exit_code: Option<i32>,
        /// The signal that ended it, if any.
        signal: Option<i32>,
        /// Set when the process could not be started, or was stopped by the agent.
        error: Option<String>,
        /// The agent stopped it on the broker's request.
        stopped: bool,
        /// The agent stopped it for a reason that is not the job's (it could not renew its
        /// lease in time, see the agent's `fence.rs`): the broker puts the job back in the
        /// queue instead of ending it. Left out of the JSON when false, so that a broker from
        /// before this field still reads every other report (upgrade brokers before agents).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        requeue: bool,
        /// The agent stopped it because the agent itself is shutting down in an orderly way
        /// (SIGTERM, Ctrl-C of `switchyard up`): the job got its checkpoint signal, and the
        /// broker ends the attempt as `preempted` and puts the job back in the queue instead
        /// of failing it. Left out of the JSON when false.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        drained: bool,
    },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventBatch {
    pub events: Vec<AgentEvent>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventStatus {
    Accepted,
    /// Already recorded: a retry. Treat as accepted.
    Duplicate,
    /// Not this agent's lease (stale epoch, unknown attempt): stop the attempt.
    Rejected,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventResult {
    pub status: EventStatus,
    #[serde(default)]
    pub reason: Option<String>,
}

/// One result per event, in order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventBatchResponse {
    pub results: Vec<EventResult>,
}

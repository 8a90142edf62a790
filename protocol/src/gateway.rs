//! What a services gateway and the broker say to each other under `/api/v1/gateway`
//! (`switchyard gateway`, one per region; the in-process gateway of `up` and `serve` uses the
//! same shapes through the store), and the per-service invoke tokens an admin issues under
//! `/api/v1/services/{id}/tokens`.
//!
//! A gateway reads [`GatewayRoutes`] (every live service, its replicas and who may call it)
//! and posts a [`GatewayReport`] every second (what it saw per service and replica).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

/// `GET /gateway/routes`: everything a gateway needs to route and to check callers, without
/// the database.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct GatewayRoutes {
    pub services: Vec<GatewayService>,
    /// Every region with its catalogue latency: the gateway prefers replicas in the regions
    /// nearest its own.
    pub regions: Vec<GatewayRegion>,
    /// The live tokens that may call services, by SHA-256 (hex) of the token: never a token.
    pub grants: Vec<GatewayGrant>,
}

/// A live service as a gateway routes it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct GatewayService {
    pub id: Uuid,
    pub team: String,
    pub name: String,
    /// Anyone may call it, without a token.
    pub public: bool,
    /// `scaling.max_concurrency_per_replica`: more requests than this on a replica wait in
    /// the gateway's queue.
    pub max_concurrency: Option<u32>,
    pub replicas: Vec<GatewayReplica>,
}

/// A running replica that reported where it listens.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct GatewayReplica {
    /// The replica's job id.
    pub job: Uuid,
    /// `host:port`, as its agent reported it.
    pub address: String,
    /// Its readiness probe passes.
    pub ready: bool,
    /// Being stopped: it finishes what it has and gets nothing new.
    pub draining: bool,
    /// The region it runs in (`provider:code`); empty when unknown.
    pub region: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct GatewayRegion {
    pub id: String,
    /// The catalogue's round trip to the region.
    pub latency_ms: u32,
}

/// A token that may call services, and which.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct GatewayGrant {
    /// SHA-256 of the token, lowercase hex.
    pub token_hash: String,
    pub scope: GrantScope,
}

/// What a token may call: every service (an admin's), its team's (any team token), or one
/// service (an invoke token).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum GrantScope {
    Admin,
    Team { team: String },
    Service { service: Uuid },
}

/// `POST /gateway/reports`: what one gateway saw, one row per service (and per replica),
/// second and report number. A row is never sent twice with different figures: a retry sends
/// the same rows, which the broker takes once.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GatewayReport {
    /// The gateway process: its region, address and a random suffix per start.
    pub gateway: String,
    pub seconds: Vec<TrafficSecond>,
}

/// One second of one service's traffic through one gateway; per replica when `replica` is set.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TrafficSecond {
    pub service: Uuid,
    /// The replica's job id; `None`: the whole service (requests that reached no replica
    /// included).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica: Option<Uuid>,
    /// Unix time, in seconds.
    pub second: i64,
    /// The gateway's report number (from 0 at its start, one more each report): the same
    /// second may come in two reports; a retried report keeps its number.
    pub batch: u64,
    /// Requests answered (or failed) in the second.
    pub requests: u64,
    /// Of those, the ones that failed (5xx, unreachable, refused by a full queue).
    pub errors: u64,
    /// The sum of their latencies to the first byte, in microseconds.
    pub latency_sum_us: u64,
    /// Latency histogram: `buckets[i]` requests took at most 100 µs × 1.12^i (the last of
    /// 120 holds everything slower); trailing zeros left out. Sums to `requests`.
    #[serde(default)]
    pub buckets: Vec<u64>,
    /// The most requests waiting in the service's queue at once during the second.
    #[serde(default)]
    pub queue_peak: u64,
    /// Requests in flight on the replica when the row was made (replica rows only).
    #[serde(default)]
    pub in_flight: u64,
    /// Microseconds that requests held replicas during the second: the integral over the
    /// second of the requests in flight, from dispatch to the last byte of the answer (the
    /// whole service's row only). Over a window, divided by its length, it is the mean number
    /// of requests in service — what the autoscaler's load signal reads, exact also for
    /// streamed answers, which hold a replica long after their first byte.
    #[serde(default)]
    pub busy_us: u64,
    /// The most requests at the gateway at once since its last report — held on replicas
    /// plus waiting in the queue (the whole service's row only). Counted at each arrival, so
    /// a burst shows even when it lasts less than a second; the autoscaler sizes replicas for
    /// a high quantile of these per-second peaks, the headroom a mean cannot show.
    #[serde(default)]
    pub peak_in_system: u64,
}

/// The answer to a report: sent only once its rows are committed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct GatewayReportAccepted {
    /// Rows taken (a row sent before is taken once).
    pub accepted: u64,
}

/// `POST /services/{id}/tokens`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateInvokeToken {
    /// Who it is for, in words.
    #[serde(default)]
    pub name: Option<String>,
}

/// A new invoke token: shown this once.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct InvokeTokenCreated {
    pub id: Uuid,
    pub service_id: Uuid,
    /// `Authorization: Bearer TOKEN` on the service's endpoint; for this service only.
    pub token: String,
    pub name: Option<String>,
}

/// An invoke token as listed: never the token.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct InvokeTokenView {
    pub id: Uuid,
    pub service_id: Uuid,
    pub name: Option<String>,
    pub created_at: DateTime<Utc>,
    pub revoked: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct InvokeTokenList {
    pub tokens: Vec<InvokeTokenView>,
}

//! Where capacity comes from: the [`Provider`] trait, its implementations, and the bundled GPU
//! price catalogue.
//!
//! - [`local`]: "instances" are agent processes on this machine with simulated GPUs.
//! - `aws` (cargo feature `aws`, which the broker turns on): EC2 through aws-sdk-ec2 — the only module that
//!   may import the AWS SDK.
//!
//! Providers act; they never decide. The broker's burst controller decides what to launch and
//! reconciles what providers report against what it asked for.

#[cfg(feature = "aws")]
pub mod aws;
pub mod azure;
pub mod bootstrap;
pub mod catalogue;
pub mod failure;
pub mod fake;
pub mod gcp;
pub mod lambda;
pub mod local;
pub mod retry;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use switchyard_core::{Market, Pool, PoolId, Region};

pub use catalogue::{Catalogue, CatalogueEntry, CatalogueError};

/// The tag every instance Switchyard launches carries, so the orphan reaper can find them.
pub const INSTANCE_TAG: &str = "switchyard:instance";

/// Everything a provider needs to start one node that joins the federation by itself. Its
/// `Debug` form leaves the enrolment token out, so logging a request never logs the secret.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchRequest {
    pub pool: PoolId,
    pub market: Market,
    /// The broker's own id for this instance: the idempotency key and the `switchyard:instance`
    /// tag. Launching twice with the same key starts one instance.
    pub instance_key: String,
    /// One-time token the agent enrols with.
    pub enrolment_token: String,
    /// Where the agent finds the broker.
    pub broker_url: String,
}

impl std::fmt::Debug for LaunchRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LaunchRequest")
            .field("pool", &self.pool)
            .field("market", &self.market)
            .field("instance_key", &self.instance_key)
            .field("enrolment_token", &"<redacted>")
            .field("broker_url", &self.broker_url)
            .finish()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InstanceState {
    Pending,
    Running,
    Terminated,
}

/// An instance as the provider sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceInfo {
    /// The provider's id (EC2 instance id, local process id…).
    pub provider_id: String,
    pub instance_key: String,
    pub pool: PoolId,
    pub market: Market,
    pub state: InstanceState,
}

/// Failures, classified so the burst controller knows whether to retry, back off or fail over.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    #[error("no capacity for {pool}: {message}")]
    Capacity { pool: PoolId, message: String },
    #[error("quota reached for {pool}: {message}")]
    Quota { pool: PoolId, message: String },
    #[error("throttled: {0}")]
    Throttled(String),
    #[error("not authorised: {0}")]
    Auth(String),
    #[error("unknown pool {0}")]
    UnknownPool(PoolId),
    #[error("transient provider failure: {0}")]
    Transient(String),
    /// The cloud refused the request itself (a bad image, an unknown instance type, a
    /// malformed bootstrap): retrying cannot help.
    #[error("rejected by the provider: {0}")]
    Rejected(String),
}

/// What a provider offers: the regions and pools it can serve, priced.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Offers {
    pub regions: Vec<Region>,
    pub pools: Vec<Pool>,
}

#[async_trait]
pub trait Provider: Send + Sync {
    /// Short name, e.g. `local`, `aws`.
    fn name(&self) -> &str;
    /// Whether its "instances" are processes on this machine (the local provider), not a
    /// cloud's machines.
    fn is_local(&self) -> bool {
        false
    }
    /// The regions and pools this provider can serve, with current prices.
    async fn offers(&self) -> Result<Offers, ProviderError>;
    /// Starts one node. Idempotent on `instance_key`.
    async fn launch(&self, request: &LaunchRequest) -> Result<InstanceInfo, ProviderError>;
    /// Stops a node. Terminating an instance that is already gone succeeds.
    async fn terminate(&self, provider_id: &str) -> Result<(), ProviderError>;
    /// Every instance this provider has that carries Switchyard's tag.
    async fn list(&self) -> Result<Vec<InstanceInfo>, ProviderError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_launch_requests_debug_form_leaves_its_enrolment_token_out() {
        let request = LaunchRequest {
            pool: PoolId::new("aws:us-east-1/g5.xlarge"),
            market: Market::Spot,
            instance_key: "key-1".into(),
            enrolment_token: "s3cr3t-enrolment-token".into(),
            broker_url: "https://broker:8443".into(),
        };
        let shown = format!("{request:?} {request:#?}");
        assert!(!shown.contains("s3cr3t"), "{shown}");
        assert!(
            shown.contains("key-1") && shown.contains("<redacted>"),
            "{shown}"
        );
    }
}

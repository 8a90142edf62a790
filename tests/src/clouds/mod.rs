//! Test clouds: in-process **fakes** of the GCE, Azure VM and Lambda Cloud APIs. No emulator
//! exists for them (moto covers EC2 only), so these servers follow the published API
//! descriptions checked in under `tests/data/apis/` (sources and licences in its README):
//! request paths and bodies, async operations, pagination and error bodies. Every request they
//! receive is checked against that description; what does not validate is recorded and fails
//! the contract suite.
//!
//! - [`contract`]: the one suite every [`Provider`](switchyard_providers::Provider) passes.
//! - [`boot`]: a launched fake instance runs the bootstrap script it was given in a sandbox
//!   directory, so a real `switchyard-agent` enrols.
//! - `gce`, `azure`, `lambda`: the fakes themselves.
//!
//! These are fakes, not the clouds: they model what Switchyard relies on, and nothing else.

pub mod azure;
pub mod boot;
pub mod contract;
pub mod e2e;
pub mod gce;
pub mod lambda;
pub mod moto;
pub mod openapi;

use std::time::Duration;

/// A fault a fake cloud injects, the same set the EC2 tests inject through their proxy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Launches fail with the cloud's own "no capacity" error (GCE
    /// `ZONE_RESOURCE_POOL_EXHAUSTED`, Azure `AllocationFailed`, Lambda
    /// `insufficient-capacity`).
    Capacity,
    /// Launches fail with the cloud's quota error (GCE `QUOTA_EXCEEDED`, Azure
    /// `QuotaExceeded`, Lambda `quota-exceeded`).
    Quota,
    /// The next `n` requests of any kind are answered 429 with the cloud's error body.
    Throttle(u32),
    /// The next launch does its work (the instance exists) but the answer is lost: the
    /// connection is dropped before a response is written.
    LoseNextLaunchAnswer,
    /// Asynchronous operations (GCE zone operations, Azure `Azure-AsyncOperation`, a Lambda
    /// instance's `booting`) take this long to finish; every call still answers at once.
    SlowOperations(Duration),
    /// Requests hang this long before any answer (a dead network path).
    Hang(Duration),
    /// Every request is refused as unauthenticated (401 with the cloud's body), as with
    /// revoked credentials.
    Unauthorized,
}

/// The faults a fake cloud holds now ([`Fault`] as state): each fake reads them as it answers.
#[derive(Clone, Debug, Default)]
pub struct Faults {
    pub capacity: bool,
    pub quota: bool,
    /// Requests still to answer 429.
    pub throttle: u32,
    pub lose_next_launch: bool,
    pub slow: Option<Duration>,
    pub hang: Option<Duration>,
    pub unauthorized: bool,
}

impl Faults {
    pub fn inject(&mut self, fault: Fault) {
        match fault {
            Fault::Capacity => self.capacity = true,
            Fault::Quota => self.quota = true,
            Fault::Throttle(n) => self.throttle = self.throttle.saturating_add(n),
            Fault::LoseNextLaunchAnswer => self.lose_next_launch = true,
            Fault::SlowOperations(d) => self.slow = Some(d),
            Fault::Hang(d) => self.hang = Some(d),
            Fault::Unauthorized => self.unauthorized = true,
        }
    }
}

/// What the contract suite needs from a fake cloud besides its API.
pub trait FakeCloud: Send + Sync {
    /// Starts injecting `fault` (faults accumulate until [`FakeCloud::clear_faults`]).
    fn inject(&self, fault: Fault);
    fn clear_faults(&self);
    /// The cloud reclaims an instance by its provider id, as a spot eviction or an operator
    /// would: it is gone from the API afterwards.
    fn vanish(&self, provider_id: &str);
    /// Provider ids of the instances that exist and are not terminated, and of any resource
    /// a launch created beside them (an Azure NIC or disk, named `nic:…`): the ground truth
    /// for "nothing leaked".
    fn live_instances(&self) -> Vec<String>;
    /// Every request that did not validate against the published description, with why.
    fn invalid_requests(&self) -> Vec<String>;
    /// How many API requests the cloud has answered (calls per launch in the benches).
    fn requests(&self) -> u64;
}

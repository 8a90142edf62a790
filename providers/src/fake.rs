//! A scripted provider for tests: launches succeed or fail as a script says (capacity, quota,
//! throttling, transient errors, hangs), every call is recorded, and no machine exists — a test
//! plays the instance's agent itself with the enrolment token from the recorded launch.

use async_trait::async_trait;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;
use switchyard_core::PoolId;

use crate::{InstanceInfo, InstanceState, LaunchRequest, Offers, Provider, ProviderError};

/// What the next launch in a pool does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FakeOutcome {
    Ok,
    Capacity,
    Quota,
    Throttled,
    Transient,
    /// Answer nothing for this long (the caller's timeout should fire first).
    Hang(Duration),
}

#[derive(Default)]
struct FakeState {
    script: HashMap<PoolId, VecDeque<FakeOutcome>>,
    instances: BTreeMap<String, InstanceInfo>,
    launches: Vec<LaunchRequest>,
    terminations: Vec<String>,
    next_id: u64,
}

pub struct FakeProvider {
    name: String,
    offers: Offers,
    state: Mutex<FakeState>,
}

impl FakeProvider {
    pub fn new(name: &str, offers: Offers) -> FakeProvider {
        FakeProvider {
            name: name.to_string(),
            offers,
            state: Mutex::new(FakeState::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FakeState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues outcomes for the next launches in `pool`; once used up, launches succeed.
    pub fn script(&self, pool: &PoolId, outcomes: impl IntoIterator<Item = FakeOutcome>) {
        self.lock()
            .script
            .entry(pool.clone())
            .or_default()
            .extend(outcomes);
    }

    /// Every launch call so far, in order (retries included).
    pub fn launches(&self) -> Vec<LaunchRequest> {
        self.lock().launches.clone()
    }

    /// Every terminate call so far (provider ids).
    pub fn terminations(&self) -> Vec<String> {
        self.lock().terminations.clone()
    }

    /// Makes an instance vanish, as a spot reclaim or a crash would.
    pub fn kill(&self, provider_id: &str) {
        let mut st = self.lock();
        if let Some(i) = st
            .instances
            .values_mut()
            .find(|i| i.provider_id == provider_id)
        {
            i.state = InstanceState::Terminated;
        }
    }

    /// Adds a tagged instance nobody launched through the broker (a leak to be reaped).
    pub fn add_stray(&self, pool: &PoolId, instance_key: &str) -> String {
        let mut st = self.lock();
        st.next_id += 1;
        let provider_id = format!("fake-stray-{}", st.next_id);
        st.instances.insert(
            instance_key.to_string(),
            InstanceInfo {
                provider_id: provider_id.clone(),
                instance_key: instance_key.to_string(),
                pool: pool.clone(),
                market: switchyard_core::Market::OnDemand,
                state: InstanceState::Running,
            },
        );
        provider_id
    }

    /// Instances the provider would bill for now.
    pub fn running(&self) -> Vec<InstanceInfo> {
        self.lock()
            .instances
            .values()
            .filter(|i| i.state != InstanceState::Terminated)
            .cloned()
            .collect()
    }
}

#[async_trait]
impl Provider for FakeProvider {
    fn name(&self) -> &str {
        &self.name
    }

    async fn offers(&self) -> Result<Offers, ProviderError> {
        Ok(self.offers.clone())
    }

    async fn launch(&self, request: &LaunchRequest) -> Result<InstanceInfo, ProviderError> {
        let outcome = {
            let mut st = self.lock();
            st.launches.push(request.clone());
            if let Some(existing) = st.instances.get(&request.instance_key) {
                return Ok(existing.clone());
            }
            if !self.offers.pools.iter().any(|p| p.id == request.pool) {
                return Err(ProviderError::UnknownPool(request.pool.clone()));
            }
            st.script
                .get_mut(&request.pool)
                .and_then(VecDeque::pop_front)
                .unwrap_or(FakeOutcome::Ok)
        };
        let pool = request.pool.clone();
        match outcome {
            FakeOutcome::Ok => {}
            FakeOutcome::Capacity => {
                return Err(ProviderError::Capacity {
                    pool,
                    message: "InsufficientInstanceCapacity (scripted)".into(),
                });
            }
            FakeOutcome::Quota => {
                return Err(ProviderError::Quota {
                    pool,
                    message: "VcpuLimitExceeded (scripted)".into(),
                });
            }
            FakeOutcome::Throttled => {
                return Err(ProviderError::Throttled(
                    "RequestLimitExceeded (scripted)".into(),
                ));
            }
            FakeOutcome::Transient => {
                return Err(ProviderError::Transient("503 (scripted)".into()));
            }
            FakeOutcome::Hang(d) => {
                tokio::time::sleep(d).await;
                return Err(ProviderError::Transient("hung (scripted)".into()));
            }
        }
        let mut st = self.lock();
        st.next_id += 1;
        let info = InstanceInfo {
            provider_id: format!("fake-{}", st.next_id),
            instance_key: request.instance_key.clone(),
            pool: request.pool.clone(),
            market: request.market,
            state: InstanceState::Running,
        };
        st.instances
            .insert(request.instance_key.clone(), info.clone());
        Ok(info)
    }

    async fn terminate(&self, provider_id: &str) -> Result<(), ProviderError> {
        let mut st = self.lock();
        st.terminations.push(provider_id.to_string());
        if let Some(i) = st
            .instances
            .values_mut()
            .find(|i| i.provider_id == provider_id)
        {
            i.state = InstanceState::Terminated;
        }
        Ok(())
    }

    async fn list(&self) -> Result<Vec<InstanceInfo>, ProviderError> {
        Ok(self.running())
    }
}

//! A scripted provider for tests: launches and terminations succeed or fail as a script says
//! (capacity, quota, throttling, transient errors, hangs, answers lost after the work was
//! done), every call is recorded, and no machine exists — a test plays the instance's agent
//! itself with the enrolment token from the recorded launch.
//!
//! Like EC2 with a client token, a launch of an `instance_key` that already has an instance
//! returns that instance instead of starting another — but only once the scripted outcome of
//! that call lets it through: a throttled or failing call fails whether or not the instance
//! exists, as a real API's would.

use async_trait::async_trait;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;
use switchyard_core::PoolId;

use crate::{InstanceInfo, InstanceState, LaunchRequest, Offers, Provider, ProviderError};

/// What the next launch in a pool (or the next terminate call) does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FakeOutcome {
    Ok,
    Capacity,
    Quota,
    Throttled,
    Transient,
    /// Answer nothing for this long, then fail; nothing is done (the caller's timeout should
    /// fire first).
    Hang(Duration),
    /// A partial failure: the work is done (the instance is started, or terminated) but the
    /// answer is lost — the call fails as a 5xx or a dropped connection would.
    LostAnswer,
    /// The work is done at once, but the answer takes this long (longer than the caller
    /// waits): a timeout after success.
    SlowAnswer(Duration),
}

impl FakeOutcome {
    /// The error a failing outcome answers with; `None` for those that do the work.
    fn error(&self, pool: &PoolId) -> Option<ProviderError> {
        let pool = pool.clone();
        match self {
            FakeOutcome::Ok | FakeOutcome::SlowAnswer(_) => None,
            FakeOutcome::Capacity => Some(ProviderError::Capacity {
                pool,
                message: "InsufficientInstanceCapacity (scripted)".into(),
            }),
            FakeOutcome::Quota => Some(ProviderError::Quota {
                pool,
                message: "VcpuLimitExceeded (scripted)".into(),
            }),
            FakeOutcome::Throttled => Some(ProviderError::Throttled(
                "RequestLimitExceeded (scripted)".into(),
            )),
            FakeOutcome::Transient => Some(ProviderError::Transient("503 (scripted)".into())),
            FakeOutcome::Hang(_) => Some(ProviderError::Transient("hung (scripted)".into())),
            FakeOutcome::LostAnswer => Some(ProviderError::Transient(
                "connection reset after the request was sent (scripted)".into(),
            )),
        }
    }
}

#[derive(Default)]
struct FakeState {
    script: HashMap<PoolId, VecDeque<FakeOutcome>>,
    terminate_script: VecDeque<FakeOutcome>,
    terminate_script_of: HashMap<String, VecDeque<FakeOutcome>>,
    /// By provider id: one instance key may have several (a duplicate launch).
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

    /// Queues outcomes for the next terminate calls (any instance); once used up, they
    /// succeed. Capacity and quota outcomes fail as transient errors would.
    pub fn script_terminate(&self, outcomes: impl IntoIterator<Item = FakeOutcome>) {
        self.lock().terminate_script.extend(outcomes);
    }

    /// Queues outcomes for the next terminate calls of one instance (before those of
    /// [`FakeProvider::script_terminate`]).
    pub fn script_terminate_of(
        &self,
        provider_id: &str,
        outcomes: impl IntoIterator<Item = FakeOutcome>,
    ) {
        self.lock()
            .terminate_script_of
            .entry(provider_id.to_string())
            .or_default()
            .extend(outcomes);
    }

    /// Instances this provider ever started (launch calls that created one), in order.
    pub fn started(&self) -> Vec<InstanceInfo> {
        let st = self.lock();
        let mut all: Vec<InstanceInfo> = st
            .instances
            .values()
            .filter(|i| {
                i.provider_id.starts_with("fake-") && !i.provider_id.starts_with("fake-stray-")
            })
            .cloned()
            .collect();
        all.sort_by_key(|i| {
            i.provider_id
                .trim_start_matches("fake-")
                .parse::<u64>()
                .unwrap_or(u64::MAX)
        });
        all
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

    /// Adds a tagged instance nobody launched through the broker (a leak to be reaped). With
    /// the key of an instance the broker did launch, it is a duplicate: what a launch retried
    /// against an API that ignores idempotency tokens leaves behind.
    pub fn add_stray(&self, pool: &PoolId, instance_key: &str) -> String {
        let mut st = self.lock();
        st.next_id += 1;
        let provider_id = format!("fake-stray-{}", st.next_id);
        st.instances.insert(
            provider_id.clone(),
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
            if !self.offers.pools.iter().any(|p| p.id == request.pool) {
                return Err(ProviderError::UnknownPool(request.pool.clone()));
            }
            st.script
                .get_mut(&request.pool)
                .and_then(VecDeque::pop_front)
                .unwrap_or(FakeOutcome::Ok)
        };
        match &outcome {
            FakeOutcome::Hang(d) => {
                tokio::time::sleep(*d).await;
                return Err(outcome
                    .error(&request.pool)
                    .unwrap_or_else(|| ProviderError::Transient("hung (scripted)".into())));
            }
            FakeOutcome::LostAnswer | FakeOutcome::SlowAnswer(_) | FakeOutcome::Ok => {}
            failing => {
                if let Some(e) = failing.error(&request.pool) {
                    return Err(e);
                }
            }
        }
        let info = {
            let mut st = self.lock();
            let existing = st
                .instances
                .values()
                .filter(|i| i.instance_key == request.instance_key)
                .min_by_key(|i| i.state == InstanceState::Terminated)
                .cloned();
            match existing {
                // Idempotent on the key, as EC2's client token is.
                Some(existing) => existing,
                None => {
                    st.next_id += 1;
                    let info = InstanceInfo {
                        provider_id: format!("fake-{}", st.next_id),
                        instance_key: request.instance_key.clone(),
                        pool: request.pool.clone(),
                        market: request.market,
                        state: InstanceState::Running,
                    };
                    st.instances.insert(info.provider_id.clone(), info.clone());
                    info
                }
            }
        };
        match outcome {
            FakeOutcome::SlowAnswer(d) => {
                tokio::time::sleep(d).await;
                Ok(info)
            }
            FakeOutcome::LostAnswer => Err(outcome
                .error(&request.pool)
                .unwrap_or_else(|| ProviderError::Transient("answer lost (scripted)".into()))),
            _ => Ok(info),
        }
    }

    async fn terminate(&self, provider_id: &str) -> Result<(), ProviderError> {
        let outcome = {
            let mut st = self.lock();
            st.terminations.push(provider_id.to_string());
            st.terminate_script_of
                .get_mut(provider_id)
                .and_then(VecDeque::pop_front)
                .or_else(|| st.terminate_script.pop_front())
                .unwrap_or(FakeOutcome::Ok)
        };
        let fail = |o: &FakeOutcome| match o {
            FakeOutcome::Throttled => {
                ProviderError::Throttled("RequestLimitExceeded (scripted)".into())
            }
            _ => ProviderError::Transient(format!("terminate failed: {o:?} (scripted)")),
        };
        match &outcome {
            FakeOutcome::Ok | FakeOutcome::LostAnswer | FakeOutcome::SlowAnswer(_) => {}
            FakeOutcome::Hang(d) => {
                tokio::time::sleep(*d).await;
                return Err(fail(&outcome));
            }
            other => return Err(fail(other)),
        }
        {
            let mut st = self.lock();
            if let Some(i) = st
                .instances
                .values_mut()
                .find(|i| i.provider_id == provider_id)
            {
                i.state = InstanceState::Terminated;
            }
        }
        match outcome {
            FakeOutcome::SlowAnswer(d) => {
                tokio::time::sleep(d).await;
                Ok(())
            }
            FakeOutcome::LostAnswer => Err(fail(&outcome)),
            _ => Ok(()),
        }
    }

    async fn list(&self) -> Result<Vec<InstanceInfo>, ProviderError> {
        Ok(self.running())
    }
}

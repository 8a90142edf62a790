//! The broker's shared state: [`App`] holds the config, the clock, the store, the scheduler's
//! handle, the agent wake-ups, the providers and the in-memory buffers; every handler gets it as
//! axum state and every loop as its argument. It is built in one place, `app.rs`
//! ([`App::start`]), and handed down: nothing here starts anything, and no module below the top
//! imports `app.rs`.

use std::collections::HashMap;
use std::ops::Deref;
use std::sync::{Arc, Mutex};
use switchyard_core::{NodeId, PoolId};
use switchyard_providers::{Offers, Provider};
use tokio::sync::Notify;

use crate::clock::Clock;
use crate::config::Config;
use crate::control::bus::{Bus, Note};
use crate::control::leader::Leadership;
use crate::control::scheduler::SchedulerHandle;
use crate::store::Store;

#[derive(Clone)]
pub struct App(pub(crate) Arc<AppInner>);

pub struct AppInner {
    pub config: Config,
    /// Where every handler and loop reads the time (a manual one in tests).
    pub clock: Clock,
    pub store: Arc<Store>,
    pub scheduler: SchedulerHandle,
    pub agents: AgentWakers,
    pub providers: ProviderSet,
    /// Wakes the burst controller when the scheduler asked for launches.
    pub burst: Arc<Notify>,
    /// Wakes the services reconciler when a service was deployed, changed or deleted.
    pub services: Arc<Notify>,
    /// Queued service replicas kept off a node, so that a service spreads over nodes: set by
    /// the services reconciler, read into each plan's snapshot by the scheduler (both in the
    /// leader).
    pub spread: std::sync::Mutex<
        std::collections::BTreeMap<switchyard_core::JobId, Vec<switchyard_core::NodeId>>,
    >,
    /// What the services gateway saw (`gateway/traffic.rs`).
    pub traffic: Arc<crate::gateway::traffic::Traffic>,
    /// Counters and histograms for `/metrics`.
    pub metrics: crate::http::metrics::Metrics,
    /// Whether this replica leads (runs the scheduler, burst controller and ledger).
    pub leadership: Arc<Leadership>,
    /// Heartbeats of healthy nodes, written in batches (`heartbeats.rs`).
    pub heartbeats: crate::control::heartbeats::HeartbeatBuffer,
    /// The GPU telemetry heartbeats carried in the last hour (`GET /nodes/{id}`).
    pub telemetry: crate::control::heartbeats::TelemetryHistory,
}

/// Which provider launches which pool. Pools without one are never launched.
#[derive(Clone, Default)]
pub struct ProviderSet {
    providers: Vec<Arc<dyn Provider>>,
    by_pool: HashMap<PoolId, usize>,
    /// Regions and pools that providers offer beyond the configured catalogue; seeded into
    /// the store at start.
    pub(crate) offers: Vec<Offers>,
    /// Whether each provider's credentials worked when the broker started, by provider name:
    /// `Ok(())`, or the failure (`GET /regions` shows it). A provider whose check failed
    /// launches nothing: its pools are unlaunchable until a restart with working credentials.
    credentials: HashMap<String, Result<(), String>>,
}

impl ProviderSet {
    /// Adds a provider with what it offers: its pools join the catalogue and it launches them.
    pub fn add_with_offers(&mut self, provider: Arc<dyn Provider>, offers: Offers) {
        let pools: Vec<PoolId> = offers.pools.iter().map(|p| p.id.clone()).collect();
        self.add(provider, pools);
        self.offers.push(offers);
    }

    /// Adds a provider that launches `pools`.
    pub fn add(&mut self, provider: Arc<dyn Provider>, pools: impl IntoIterator<Item = PoolId>) {
        let index = self.providers.len();
        self.providers.push(provider);
        for pool in pools {
            self.by_pool.insert(pool, index);
        }
    }

    pub fn for_pool(&self, pool: &PoolId) -> Option<&Arc<dyn Provider>> {
        self.by_pool.get(pool).map(|&i| &self.providers[i])
    }

    pub fn all(&self) -> &[Arc<dyn Provider>] {
        &self.providers
    }

    /// Records whether `provider`'s credentials worked (a `list` call at start).
    pub fn set_credentials(&mut self, provider: &str, check: Result<(), String>) {
        self.credentials.insert(provider.to_string(), check);
    }

    /// What [`ProviderSet::set_credentials`] recorded for `provider`, if anything.
    pub fn credentials(&self, provider: &str) -> Option<&Result<(), String>> {
        self.credentials.get(provider)
    }

    /// Whether a provider can launch in `pool`: one launches it, and its credentials did not
    /// fail their check at start. The scheduler plans launches only in such pools.
    pub fn can_launch(&self, pool: &PoolId) -> bool {
        self.for_pool(pool)
            .is_some_and(|p| !matches!(self.credentials.get(p.name()), Some(Err(_))))
    }

    /// Why no provider can launch in `pool`, in words (`GET /pools` shows it), or `None` when
    /// [`ProviderSet::can_launch`] says one can.
    pub fn unlaunchable_reason(&self, pool: &PoolId) -> Option<String> {
        let Some(provider) = self.for_pool(pool) else {
            return Some("no configured provider launches this pool".into());
        };
        match self.credentials.get(provider.name()) {
            Some(Err(e)) => Some(format!("credentials check failed: {e}")),
            _ => None,
        }
    }
}

impl Deref for App {
    type Target = AppInner;
    fn deref(&self) -> &AppInner {
        &self.0
    }
}

/// Wakes an agent's pending long-poll when there is work or a stop for it, on this replica
/// and (through the bus) on whichever other replica the agent waits.
#[derive(Default)]
pub struct AgentWakers {
    waiters: Mutex<HashMap<NodeId, Arc<Notify>>>,
    bus: Bus,
}

impl AgentWakers {
    pub fn new(bus: Bus) -> AgentWakers {
        AgentWakers {
            waiters: Mutex::default(),
            bus,
        }
    }

    pub fn get(&self, node: &NodeId) -> Arc<Notify> {
        let mut map = self.waiters.lock().unwrap_or_else(|e| e.into_inner());
        map.entry(node.clone()).or_default().clone()
    }

    pub fn wake(&self, node: &NodeId) {
        self.bus.publish(Note::Wake(node.clone()));
        self.wake_local(node);
    }

    /// Wakes a long-poll waiting on this replica only.
    pub fn wake_local(&self, node: &NodeId) {
        self.get(node).notify_one();
    }

    /// Every long-poll waiting here looks again (after notes may have been missed).
    pub fn wake_all_local(&self) {
        let map = self.waiters.lock().unwrap_or_else(|e| e.into_inner());
        for waiter in map.values() {
            waiter.notify_one();
        }
    }

    pub fn bus(&self) -> &Bus {
        &self.bus
    }
}

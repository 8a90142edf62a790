//! Lambda Cloud (On-Demand Cloud) through its public REST API (`/api/v1`), as described by
//! Lambda's OpenAPI document (a copy is test data: `tests/data/apis/lambda-openapi.json`).
//!
//! - Auth: the API key from `api_key_file`, sent as `Authorization: Bearer <key>` (Lambda
//!   also accepts Basic; Bearer is what its document recommends). The key is a sensitive
//!   header value and is never logged.
//! - Launch: `POST /instance-operations/launch` with the agent bootstrap as `user_data` (plain
//!   text cloud-init user-data, at most 1 MB). The instance is named `sy-{cluster}-{key}` and
//!   tagged `switchyard:cluster` / `switchyard:instance`; the name is what `list` and the
//!   idempotency look-up go by, and tags, where an instance has them, must agree with it. Each
//!   launch attempt first looks the name up (`GET /instances`), so a retry after a lost answer
//!   adopts the instance instead of starting a second one: Lambda offers no idempotency token.
//! - Rate limit: Lambda allows one launch request per 12 s (five a minute); [`LaunchLimiter`]
//!   spaces launches `launch_min_interval_ms` apart on this side. The general one request per
//!   second is left to the retry loop (a 429 is retried with backoff).
//! - No spot market on Lambda: a spot launch is refused as [`ProviderError::Rejected`] and the
//!   pools carry no spot price.
//! - Offers: the bundled catalogue's pools for the configured regions, priced live from
//!   `GET /instance-types` (`price_cents_per_hour`, one cheap call for every type). A type the
//!   API no longer lists is offered unlaunchable. Which regions have capacity
//!   (`regions_with_capacity_available`) is remembered for a minute: a launch into a region
//!   the last answer said was full fails at once as capacity, without spending a launch slot.
//! - Terminate: `POST /instance-operations/terminate`; an instance that does not exist
//!   (`global/object-does-not-exist`) is already gone, which is success.
//! - List: `GET /instances` (one page: the API has no pagination), this cluster's names only.

mod api;
mod config;
mod error;

pub use api::{LaunchLimiter, MAX_USER_DATA_BYTES};
pub use config::{
    AgentInstall, DEFAULT_API_ENDPOINT, DEFAULT_LAUNCH_MIN_INTERVAL_MS, LambdaConfig,
    LambdaConfigError, MAX_NAME_LEN, RetrySettings,
};
pub use error::classify;

use crate::bootstrap::{Enrolment, render};
use crate::catalogue::{Catalogue, CatalogueError, pool_from_entry, pool_id, region_id};
use crate::failure::{Class, Failure};
use crate::retry::Backoff;
use crate::{InstanceInfo, InstanceState, LaunchRequest, Offers, Provider, ProviderError};
use api::{Client, LaunchBody, RequestedTag};
use async_trait::async_trait;
use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use switchyard_core::{Market, Money, Pool, PoolId, Region, Timestamp};

/// Tag carrying the cluster (beside the name, which is authoritative).
pub const CLUSTER_TAG: &str = "switchyard:cluster";
/// Tag carrying the instance key.
pub const INSTANCE_KEY_TAG: &str = "switchyard:instance";

/// How long the capacity seen in `GET /instance-types` is trusted by `launch`.
const CAPACITY_FRESH_FOR: Duration = Duration::from_secs(60);

/// Why the provider could not be built.
#[derive(Debug, thiserror::Error)]
pub enum LambdaSetupError {
    #[error(transparent)]
    Config(#[from] LambdaConfigError),
    #[error("bundled catalogue: {0}")]
    Catalogue(#[from] CatalogueError),
}

/// What the last `GET /instance-types` said: the types listed and where each had capacity.
#[derive(Debug)]
struct CapacitySnapshot {
    at: Instant,
    regions: HashMap<String, BTreeSet<String>>,
}

pub struct LambdaProvider {
    config: LambdaConfig,
    client: Client,
    backoff: Backoff,
    limiter: LaunchLimiter,
    regions: Vec<Region>,
    pools: Vec<Pool>,
    /// Pool id → (region code, instance type).
    launchable: HashMap<PoolId, (String, String)>,
    capacity: Mutex<Option<CapacitySnapshot>>,
}

impl std::fmt::Debug for LambdaProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LambdaProvider")
            .field("cluster", &self.config.cluster)
            .field("api_endpoint", &self.config.api_endpoint)
            .field("regions", &self.config.regions)
            .field("pools", &self.pools.len())
            .finish_non_exhaustive()
    }
}

impl LambdaProvider {
    /// Validates the config, reads the API key and builds the pools from the bundled
    /// catalogue. Calls no API: a bad key shows on the first call, as `ProviderError::Auth`.
    pub fn new(config: LambdaConfig) -> Result<LambdaProvider, LambdaSetupError> {
        config.validate()?;
        let key = config.read_api_key()?;
        let catalogue = Catalogue::bundled()?;
        let known_regions: BTreeSet<&str> = catalogue
            .regions()
            .filter(|(p, _)| *p == "lambda")
            .map(|(_, r)| r)
            .collect();
        let egress = Money::from_dollars(config.egress_per_gb_usd).ok_or_else(|| {
            LambdaConfigError(format!(
                "egress_per_gb_usd {} out of range",
                config.egress_per_gb_usd
            ))
        })?;
        let priced_at = now();
        let mut regions = Vec::new();
        let mut pools = Vec::new();
        let mut launchable = HashMap::new();
        for code in &config.regions {
            if !known_regions.contains(code.as_str()) {
                return Err(LambdaConfigError(format!(
                    "regions: {code:?} is not a Lambda region (known: {})",
                    known_regions.iter().copied().collect::<Vec<_>>().join(", ")
                ))
                .into());
            }
            for t in &config.instance_types {
                if catalogue.find("lambda", code, t).is_none() {
                    return Err(LambdaConfigError(format!(
                        "instance_types: {t:?} is not a Lambda instance type in {code}"
                    ))
                    .into());
                }
            }
            regions.push(Region {
                id: region_id("lambda", code),
                provider: "lambda".into(),
                code: code.clone(),
                latitude: None,
                longitude: None,
                egress_per_gb: egress,
                latency_ms: config.latency_ms,
                ingress_gbps: 10,
            });
            for e in catalogue.entries().iter().filter(|e| {
                e.provider == "lambda"
                    && &e.region == code
                    && (config.instance_types.is_empty()
                        || config.instance_types.contains(&e.instance_type))
            }) {
                let mut pool = pool_from_entry(e, config.boot_time_s, config.node_limit, priced_at);
                pool.spot_per_hour = None;
                launchable.insert(pool.id.clone(), (code.clone(), e.instance_type.clone()));
                pools.push(pool);
            }
        }
        let client = Client::new(
            &config.api_endpoint,
            &key,
            Duration::from_secs(config.request_timeout_s),
        )
        .map_err(|e| LambdaConfigError(format!("api_key_file: {e}")))?;
        Ok(LambdaProvider {
            backoff: Backoff::new(&config.retry),
            limiter: LaunchLimiter::new(
                Duration::from_millis(config.launch_min_interval_ms),
                Duration::from_secs(config.operation_timeout_s),
            ),
            client,
            regions,
            pools,
            launchable,
            capacity: Mutex::new(None),
            config,
        })
    }

    /// The configuration this provider runs with.
    pub fn config(&self) -> &LambdaConfig {
        &self.config
    }

    /// The instance name that carries `key`: `sy-{cluster}-{key}`.
    pub fn instance_name(&self, key: &str) -> String {
        format!("{}{key}", self.config.name_prefix())
    }

    /// This cluster's instances, as Switchyard sees them.
    async fn ours(&self) -> Result<Vec<InstanceInfo>, Failure> {
        let all = self
            .backoff
            .run("ListInstances", || self.client.instances())
            .await?;
        Ok(all.iter().filter_map(|i| self.info_of(i)).collect())
    }

    fn info_of(&self, i: &api::Instance) -> Option<InstanceInfo> {
        let key = i
            .name
            .as_deref()?
            .strip_prefix(&self.config.name_prefix())?;
        if key.is_empty() {
            return None;
        }
        // Where the instance has our tags, they must agree with the name.
        let tag = |k: &str| i.tags.iter().find(|t| t.key == k).map(|t| t.value.as_str());
        if tag(CLUSTER_TAG).is_some_and(|c| c != self.config.cluster)
            || tag(INSTANCE_KEY_TAG).is_some_and(|k| k != key)
        {
            return None;
        }
        let state = match i.status.as_str() {
            "booting" => InstanceState::Pending,
            "active" | "unhealthy" => InstanceState::Running,
            _ => InstanceState::Terminated,
        };
        Some(InstanceInfo {
            provider_id: i.id.clone(),
            instance_key: key.to_string(),
            pool: pool_id(&region_id("lambda", &i.region.name), &i.instance_type.name),
            market: Market::OnDemand,
            state,
        })
    }

    /// Whether the last `GET /instance-types`, if fresh, rules the launch out.
    fn capacity_verdict(&self, region: &str, instance_type: &str) -> Option<Failure> {
        let guard = self.capacity.lock().ok()?;
        let snap = guard.as_ref()?;
        if snap.at.elapsed() > CAPACITY_FRESH_FOR {
            return None;
        }
        match snap.regions.get(instance_type) {
            None => Some(Failure::new(
                Class::Rejected,
                format!("Lambda does not offer the instance type {instance_type}"),
            )),
            Some(r) if !r.contains(region) => Some(Failure {
                class: Class::Capacity,
                code: Some("regions_with_capacity_available".into()),
                message: format!("{instance_type} has no capacity in {region} (instance-types)"),
            }),
            Some(_) => None,
        }
    }

    async fn launch_in(
        &self,
        request: &LaunchRequest,
        region: &str,
        instance_type: &str,
    ) -> Result<InstanceInfo, Failure> {
        let name = self.instance_name(&request.instance_key);
        if name.chars().count() > MAX_NAME_LEN {
            return Err(Failure::new(
                Class::Rejected,
                format!(
                    "the instance name {name:?} is longer than Lambda's {MAX_NAME_LEN} characters"
                ),
            ));
        }
        let script = render(
            &self.config.agent,
            &Enrolment {
                broker_url: &request.broker_url,
                token: &request.enrolment_token,
                agent_name: &request.instance_key,
            },
        )
        .map_err(|e| Failure::new(Class::Rejected, e.to_string()))?;
        if script.len() > MAX_USER_DATA_BYTES {
            return Err(Failure::new(
                Class::Rejected,
                format!(
                    "the bootstrap is {} bytes, over Lambda's user-data limit",
                    script.len()
                ),
            ));
        }
        let body = LaunchBody {
            region_name: region.to_string(),
            instance_type_name: instance_type.to_string(),
            ssh_key_names: vec![self.config.ssh_key_name.clone()],
            file_system_names: self.config.file_system_names.clone(),
            name: name.clone(),
            user_data: script,
            tags: vec![
                RequestedTag {
                    key: CLUSTER_TAG.into(),
                    value: self.config.cluster.clone(),
                },
                RequestedTag {
                    key: INSTANCE_KEY_TAG.into(),
                    value: request.instance_key.clone(),
                },
            ],
        };
        // A slot further away than operation_timeout_s: refused now, not retried attempt by
        // attempt (each attempt would look the name up again for nothing).
        if self.limiter.over_max_wait() {
            return Err(Failure::new(
                Class::Throttled,
                format!(
                    "the next launch slot is {:?} away (launch_min_interval_ms {})",
                    self.limiter.wait_ahead(),
                    self.config.launch_min_interval_ms
                ),
            ));
        }
        let pool = request.pool.clone();
        let key = request.instance_key.clone();
        // Every attempt looks the name up first: after a lost answer, the retry adopts.
        self.backoff
            .run("LaunchInstance", || {
                let body = &body;
                let pool = pool.clone();
                let key = key.clone();
                async move {
                    let all = self.client.instances().await?;
                    if let Some(found) = all
                        .iter()
                        .filter_map(|i| self.info_of(i))
                        .find(|i| i.instance_key == key && i.state != InstanceState::Terminated)
                    {
                        tracing::info!(instance.id = %found.provider_id, "adopting the instance launched before");
                        return Ok(found);
                    }
                    self.limiter.acquire().await?;
                    let id = self.client.launch(body).await?;
                    Ok(InstanceInfo {
                        provider_id: id,
                        instance_key: key,
                        pool,
                        market: Market::OnDemand,
                        state: InstanceState::Pending,
                    })
                }
            })
            .await
    }
}

#[async_trait]
impl Provider for LambdaProvider {
    fn name(&self) -> &str {
        "lambda"
    }

    async fn offers(&self) -> Result<Offers, ProviderError> {
        let mut pools = self.pools.clone();
        match self
            .backoff
            .run("ListInstanceTypes", || self.client.instance_types())
            .await
        {
            Ok(types) => {
                let at = now();
                for pool in &mut pools {
                    match types.get(&pool.instance_type) {
                        Some(item) => {
                            if let Some(price) = Money::from_dollars(
                                item.instance_type.price_cents_per_hour as f64 / 100.0,
                            )
                            .filter(|m| *m > Money::ZERO)
                            {
                                pool.on_demand_per_hour = price;
                                pool.price_updated_at = at;
                            }
                        }
                        None => pool.launchable = false,
                    }
                }
                let regions = types
                    .iter()
                    .map(|(name, item)| {
                        let r = item
                            .regions_with_capacity_available
                            .iter()
                            .map(|r| r.name.clone())
                            .collect();
                        (name.clone(), r)
                    })
                    .collect();
                if let Ok(mut c) = self.capacity.lock() {
                    *c = Some(CapacitySnapshot {
                        at: Instant::now(),
                        regions,
                    });
                }
            }
            Err(f) if f.class == Class::Auth => return Err(f.into_provider_error(None)),
            Err(f) => {
                tracing::warn!(error = %f.detail(), "Lambda instance types unavailable, keeping the catalogue's prices");
            }
        }
        Ok(Offers {
            regions: self.regions.clone(),
            pools,
        })
    }

    #[tracing::instrument(skip_all, fields(instance.key = %request.instance_key, pool.id = %request.pool))]
    async fn launch(&self, request: &LaunchRequest) -> Result<InstanceInfo, ProviderError> {
        let (region, instance_type) = self
            .launchable
            .get(&request.pool)
            .ok_or_else(|| ProviderError::UnknownPool(request.pool.clone()))?;
        if request.market == Market::Spot {
            return Err(ProviderError::Rejected(
                "Lambda Cloud has no spot market: launch on demand".into(),
            ));
        }
        if let Some(f) = self.capacity_verdict(region, instance_type) {
            return Err(f.into_provider_error(Some(&request.pool)));
        }
        let started = Instant::now();
        let info = self
            .launch_in(request, region, instance_type)
            .await
            .map_err(|f| match f.class {
                // An instance type or region the launch names does not exist.
                Class::NotFound => ProviderError::Rejected(f.detail()),
                _ => f.into_provider_error(Some(&request.pool)),
            })?;
        tracing::info!(
            instance.id = %info.provider_id,
            duration_ms = started.elapsed().as_millis() as u64,
            "launched Lambda instance"
        );
        Ok(info)
    }

    #[tracing::instrument(skip_all, fields(instance.id = %provider_id))]
    async fn terminate(&self, provider_id: &str) -> Result<(), ProviderError> {
        match self
            .backoff
            .run("TerminateInstance", || self.client.terminate(provider_id))
            .await
        {
            Ok(()) => {
                tracing::info!("terminated Lambda instance");
                Ok(())
            }
            Err(f) if f.class == Class::NotFound => {
                tracing::info!("Lambda instance already gone");
                Ok(())
            }
            Err(f) => Err(f.into_provider_error(None)),
        }
    }

    async fn list(&self) -> Result<Vec<InstanceInfo>, ProviderError> {
        self.ours().await.map_err(|f| f.into_provider_error(None))
    }
}

fn now() -> Timestamp {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    Timestamp::from_millis(ms)
}

#[cfg(test)]
mod tests;

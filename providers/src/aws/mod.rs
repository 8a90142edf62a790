//! The AWS EC2 provider: offers from the bundled catalogue refreshed with live spot prices and
//! instance facts, `RunInstances` with an idempotency token, tags and a cloud-init user-data that
//! starts `switchyard-agent`, `TerminateInstances`, and `DescribeInstances` by the cluster tag.
//!
//! This module tree is the only code in Switchyard that imports the AWS SDK. It acts and
//! reports; it never decides what to launch (the broker's burst controller does). Failures are
//! classified into [`ProviderError`] by EC2's error code (see `error`); throttling and
//! transient failures are retried here with jittered backoff (see `retry`), with the SDK's own
//! retries turned off so there is one retry policy and every attempt is visible.
//!
//! Idempotency of `launch` on `instance_key`: first a `DescribeInstances` by the
//! `switchyard:instance` tag (covers a key launched long ago, and emulators that ignore client
//! tokens), then `RunInstances` with a client token derived from the key (covers concurrent
//! and retried launches, for which the tags may not be visible yet).

mod config;
mod error;
mod instances;
mod offers;

pub use config::{
    AgentInstall, AwsConfig, AwsConfigError, ImageConfig, RegionSettings, RetrySettings,
    StaticCredentials,
};
pub use instances::{CLUSTER_TAG, POOL_TAG};

use crate::catalogue::{Catalogue, CatalogueError, first_not_offered, pool_from_entry, region_id};
use crate::retry::Backoff;
use crate::{INSTANCE_TAG, InstanceInfo, LaunchRequest, Offers, Provider, ProviderError};
use async_trait::async_trait;
use aws_config::BehaviorVersion;
use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_sdk_ec2::Client;
use aws_sdk_ec2::config::{Credentials, Region as AwsRegion};
use aws_sdk_ec2::types::{
    HttpTokensState, IamInstanceProfileSpecification, InstanceInterruptionBehavior,
    InstanceMarketOptionsRequest, InstanceMetadataOptionsRequest, InstanceType, MarketType,
    ResourceType, SpotInstanceType, SpotMarketOptions, Tag, TagSpecification,
};
use base64::Engine as _;
use error::{Class, Failure, classify};
use instances::{filter, info_of};
use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use switchyard_core::{Market, Money, Pool, PoolId, Region, RegionId, Timestamp};

/// How long an AMI found by name filter is used before the filter is asked again.
const IMAGE_CACHE_TTL: Duration = Duration::from_secs(3600);

/// A provider that cannot be built from its configuration.
#[derive(Debug, thiserror::Error)]
pub enum AwsSetupError {
    #[error(transparent)]
    Config(#[from] AwsConfigError),
    #[error("reading the bundled price catalogue: {0}")]
    Catalogue(#[from] CatalogueError),
}

/// EC2 as a [`Provider`], one SDK client per configured region.
pub struct AwsProvider {
    config: AwsConfig,
    clients: BTreeMap<String, Client>,
    backoff: Backoff,
    regions: Vec<Region>,
    /// Catalogue-priced pools of every configured region, refreshed on each `offers`.
    pools: Vec<Pool>,
    /// Pool → (region code, instance type).
    launchable: HashMap<PoolId, (String, String)>,
    /// Region → (AMI id, when it was looked up), for name-filtered images.
    images: Mutex<HashMap<String, (String, Instant)>>,
    /// Instance id → region code, learnt from launch and list, so terminate asks the right
    /// region first.
    homes: Mutex<HashMap<String, String>>,
}

impl std::fmt::Debug for AwsProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AwsProvider")
            .field("cluster", &self.config.cluster)
            .field("regions", &self.config.regions)
            .field("pools", &self.pools.len())
            .finish_non_exhaustive()
    }
}

impl AwsProvider {
    /// Validates the config, builds the offers from the bundled catalogue and one client per
    /// region. Calls no API: bad credentials show on the first call, as `ProviderError::Auth`.
    pub async fn new(config: AwsConfig) -> Result<AwsProvider, AwsSetupError> {
        config.validate()?;
        let catalogue = Catalogue::bundled()?;
        let priced_at = now();
        let mut regions = Vec::new();
        let mut pools = Vec::new();
        let mut launchable = HashMap::new();
        for code in &config.regions {
            let entries: Vec<_> = catalogue
                .entries()
                .iter()
                .filter(|e| e.provider == "aws" && &e.region == code)
                .filter(|e| {
                    config.instance_types.is_empty()
                        || config.instance_types.contains(&e.instance_type)
                })
                .collect();
            if entries.is_empty() {
                return Err(AwsConfigError(format!(
                    "the bundled catalogue has no (selected) GPU instance types in {code}"
                ))
                .into());
            }
            regions.push(Region {
                id: region_id("aws", code),
                provider: "aws".into(),
                code: code.clone(),
                latitude: None,
                longitude: None,
                egress_per_gb: Money::from_dollars(config.egress_per_gb_usd).ok_or_else(|| {
                    AwsConfigError(format!(
                        "egress_per_gb_usd {} out of range",
                        config.egress_per_gb_usd
                    ))
                })?,
                latency_ms: config.latency_ms,
                ingress_gbps: 10,
            });
            for e in entries {
                let pool = pool_from_entry(e, config.boot_time_s, config.node_limit, priced_at);
                launchable.insert(pool.id.clone(), (code.clone(), e.instance_type.clone()));
                pools.push(pool);
            }
        }
        // A listed type no configured region has would be skipped without a word.
        if let Some(t) = first_not_offered(&config.instance_types, &pools) {
            return Err(AwsConfigError(format!(
                "instance_types: {t} is not a GPU instance type the bundled catalogue has in the \
                 configured regions ({})",
                config.regions.join(", ")
            ))
            .into());
        }
        let clients = build_clients(&config).await;
        Ok(AwsProvider {
            backoff: Backoff::new(&config.retry),
            config,
            clients,
            regions,
            pools,
            launchable,
            images: Mutex::new(HashMap::new()),
            homes: Mutex::new(HashMap::new()),
        })
    }

    /// The configuration this provider runs with.
    pub fn config(&self) -> &AwsConfig {
        &self.config
    }

    fn client(&self, region: &str) -> Result<&Client, Failure> {
        self.clients
            .get(region)
            .ok_or_else(|| Failure::new(Class::Rejected, format!("region {region} not configured")))
    }

    fn remember(&self, info: &InstanceInfo, region: &str) {
        if let Ok(mut homes) = self.homes.lock() {
            homes.insert(info.provider_id.clone(), region.to_owned());
        }
    }

    /// The AMI to launch in `region`: configured, or the newest available image matching the
    /// name filter (cached for an hour).
    async fn image_for(&self, region: &str) -> Result<String, Failure> {
        let settings = self.config.region_settings(region);
        if let Some(id) = settings.image_id.or_else(|| self.config.image.id.clone()) {
            return Ok(id);
        }
        let Some(name) = self.config.image.name_filter.as_deref() else {
            return Err(Failure::new(Class::Rejected, "no image configured"));
        };
        if let Ok(cache) = self.images.lock()
            && let Some((id, at)) = cache.get(region)
            && at.elapsed() < IMAGE_CACHE_TTL
        {
            return Ok(id.clone());
        }
        let client = self.client(region)?;
        let owners: Vec<String> = self.config.image.owners.clone();
        let mut newest: Option<(String, String)> = None;
        let mut token: Option<String> = None;
        loop {
            let page = self
                .backoff
                .run("DescribeImages", || async {
                    client
                        .describe_images()
                        .set_owners(Some(owners.clone()))
                        .filters(filter("name", &[name]))
                        .filters(filter("state", &["available"]))
                        .set_next_token(token.clone())
                        .send()
                        .await
                        .map_err(classify)
                })
                .await?;
            for image in page.images() {
                if let (Some(id), Some(created)) = (image.image_id(), image.creation_date())
                    && newest.as_ref().is_none_or(|(_, c)| created > c.as_str())
                {
                    newest = Some((id.to_owned(), created.to_owned()));
                }
            }
            token = page
                .next_token()
                .filter(|t| !t.is_empty())
                .map(str::to_owned);
            if token.is_none() {
                break;
            }
        }
        let (id, _) = newest.ok_or_else(|| {
            Failure::new(
                Class::Rejected,
                format!("no available image named {name:?} owned by {owners:?} in {region}"),
            )
        })?;
        tracing::info!(aws.region = region, image.id = %id, image.filter = name, "resolved AMI");
        if let Ok(mut cache) = self.images.lock() {
            cache.insert(region.to_owned(), (id.clone(), Instant::now()));
        }
        Ok(id)
    }

    /// The `RunInstances` call of one launch.
    fn run_request(
        &self,
        client: &Client,
        request: &LaunchRequest,
        region: &str,
        instance_type: &str,
        image: &str,
        user_data: &str,
    ) -> aws_sdk_ec2::operation::run_instances::builders::RunInstancesFluentBuilder {
        let tags = [
            (CLUSTER_TAG, self.config.cluster.as_str()),
            (POOL_TAG, request.pool.as_str()),
            (INSTANCE_TAG, request.instance_key.as_str()),
            (
                "Name",
                &format!(
                    "switchyard-{}-{}",
                    self.config.cluster, request.instance_key
                ),
            ),
        ]
        .map(|(k, v)| Tag::builder().key(k).value(v).build());
        let tag_spec = |kind: ResourceType| {
            TagSpecification::builder()
                .resource_type(kind)
                .set_tags(Some(tags.to_vec()))
                .build()
        };
        let settings = self.config.region_settings(region);
        let mut run = client
            .run_instances()
            .image_id(image)
            .instance_type(InstanceType::from(instance_type))
            .min_count(1)
            .max_count(1)
            .client_token(instances::client_token(
                &self.config.cluster,
                &request.instance_key,
            ))
            .user_data(base64::engine::general_purpose::STANDARD.encode(user_data))
            .tag_specifications(tag_spec(ResourceType::Instance))
            .tag_specifications(tag_spec(ResourceType::Volume))
            .set_subnet_id(settings.subnet_id)
            .set_key_name(self.config.key_name.clone());
        if !settings.security_group_ids.is_empty() {
            run = run.set_security_group_ids(Some(settings.security_group_ids));
        }
        if let Some(profile) = &self.config.instance_profile {
            let spec = IamInstanceProfileSpecification::builder();
            let spec = if profile.starts_with("arn:") {
                spec.arn(profile)
            } else {
                spec.name(profile)
            };
            run = run.iam_instance_profile(spec.build());
        }
        if self.config.require_imdsv2 {
            run = run.metadata_options(
                InstanceMetadataOptionsRequest::builder()
                    .http_tokens(HttpTokensState::Required)
                    .build(),
            );
        }
        if request.market == Market::Spot {
            run = run.instance_market_options(
                InstanceMarketOptionsRequest::builder()
                    .market_type(MarketType::Spot)
                    .spot_options(
                        SpotMarketOptions::builder()
                            .spot_instance_type(SpotInstanceType::OneTime)
                            .instance_interruption_behavior(InstanceInterruptionBehavior::Terminate)
                            .build(),
                    )
                    .build(),
            );
        }
        run
    }

    async fn launch_in(
        &self,
        request: &LaunchRequest,
        region: &str,
        instance_type: &str,
    ) -> Result<InstanceInfo, Failure> {
        let client = self.client(region)?;
        let mine = [
            filter(&format!("tag:{CLUSTER_TAG}"), &[&self.config.cluster]),
            filter(&format!("tag:{INSTANCE_TAG}"), &[&request.instance_key]),
        ];
        let existing = instances::describe(client, &self.backoff, &mine).await?;
        if let Some(info) = existing.iter().find_map(|i| info_of(i, region)) {
            tracing::info!(instance.id = %info.provider_id, "instance key already launched");
            return Ok(info);
        }
        let image = self.image_for(region).await?;
        let enrolment = crate::bootstrap::Enrolment {
            broker_url: &request.broker_url,
            token: &request.enrolment_token,
            agent_name: &request.instance_key,
        };
        let script = crate::bootstrap::render(&self.config.agent, &enrolment)
            .map_err(|e| Failure::new(Class::Rejected, format!("refusing to launch: {e}")))?;
        let run = self.run_request(client, request, region, instance_type, &image, &script);
        let output = self
            .backoff
            .run("RunInstances", || {
                let run = run.clone();
                async move { run.send().await.map_err(classify) }
            })
            .await?;
        let instance = output
            .instances()
            .first()
            .ok_or_else(|| Failure::new(Class::Transient, "RunInstances returned no instance"))?;
        let id = instance.instance_id().ok_or_else(|| {
            Failure::new(Class::Transient, "RunInstances returned no instance id")
        })?;
        Ok(InstanceInfo {
            provider_id: id.to_owned(),
            instance_key: request.instance_key.clone(),
            pool: request.pool.clone(),
            market: request.market,
            state: instances::state_of(instance.state().and_then(|s| s.name())),
        })
    }
}

#[async_trait]
impl Provider for AwsProvider {
    fn name(&self) -> &str {
        "aws"
    }

    async fn offers(&self) -> Result<Offers, ProviderError> {
        let now = now();
        let mut pools = self.pools.clone();
        for (code, client) in &self.clients {
            let region: RegionId = region_id("aws", code);
            let types: Vec<String> = pools
                .iter()
                .filter(|p| p.region == region)
                .map(|p| p.instance_type.clone())
                .collect();
            let quotes = match offers::spot_records(client, &self.backoff, &types, now).await {
                Ok(records) => {
                    offers::fresh_spot_prices(&records, now, self.config.spot_price_max_age())
                }
                Err(f) if f.class == Class::Auth => return Err(f.into_provider_error(None)),
                Err(f) => {
                    tracing::warn!(aws.region = %code, error = %f.detail(),
                        "spot prices unavailable, keeping the catalogue's");
                    BTreeMap::new()
                }
            };
            let facts = match offers::instance_facts(client, &self.backoff, &types).await {
                Ok(facts) => facts,
                Err(f) if f.class == Class::Auth => return Err(f.into_provider_error(None)),
                Err(f) => {
                    tracing::warn!(aws.region = %code, error = %f.detail(),
                        "instance facts unavailable, keeping the catalogue's");
                    HashMap::new()
                }
            };
            tracing::debug!(aws.region = %code, fresh_spot_prices = quotes.len(),
                instance_facts = facts.len(), "refreshed EC2 offers");
            for pool in pools.iter_mut().filter(|p| p.region == region) {
                let t = pool.instance_type.clone();
                offers::refresh_pool(pool, quotes.get(&t), facts.get(&t));
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
        let started = Instant::now();
        let info = self
            .launch_in(request, region, instance_type)
            .await
            .map_err(|f| f.into_provider_error(Some(&request.pool)))?;
        self.remember(&info, region);
        tracing::info!(
            instance.id = %info.provider_id,
            market = ?request.market,
            duration_ms = started.elapsed().as_millis() as u64,
            "launched EC2 instance"
        );
        Ok(info)
    }

    #[tracing::instrument(skip_all, fields(instance.id = %provider_id))]
    async fn terminate(&self, provider_id: &str) -> Result<(), ProviderError> {
        let home = self
            .homes
            .lock()
            .ok()
            .and_then(|h| h.get(provider_id).cloned());
        let order: Vec<&String> = match &home {
            Some(region) => vec![region],
            None => self.clients.keys().collect(),
        };
        for region in order {
            let client = self
                .client(region)
                .map_err(|f| f.into_provider_error(None))?;
            match instances::terminate(client, &self.backoff, provider_id).await {
                Ok(true) => {
                    tracing::info!(aws.region = %region, "terminated EC2 instance");
                    return Ok(());
                }
                Ok(false) => continue,
                Err(f) => return Err(f.into_provider_error(None)),
            }
        }
        tracing::info!("EC2 instance already gone");
        Ok(())
    }

    async fn list(&self) -> Result<Vec<InstanceInfo>, ProviderError> {
        let ours = [filter(
            &format!("tag:{CLUSTER_TAG}"),
            &[&self.config.cluster],
        )];
        let mut out = Vec::new();
        for (code, client) in &self.clients {
            let found = instances::describe(client, &self.backoff, &ours)
                .await
                .map_err(|f| f.into_provider_error(None))?;
            for info in found.iter().filter_map(|i| info_of(i, code)) {
                self.remember(&info, code);
                out.push(info);
            }
        }
        Ok(out)
    }
}

/// One SDK client per region, sharing credentials, endpoint, timeouts and (disabled) retries.
async fn build_clients(config: &AwsConfig) -> BTreeMap<String, Client> {
    let first = config.regions.first().cloned().unwrap_or_default();
    // A region on the loader keeps aws-config from probing the instance metadata service.
    let mut loader = aws_config::defaults(BehaviorVersion::latest())
        .region(AwsRegion::new(first))
        .retry_config(RetryConfig::disabled())
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(Duration::from_secs(5))
                .operation_attempt_timeout(Duration::from_secs(config.request_timeout_s))
                .build(),
        );
    if let Some(c) = &config.credentials {
        loader = loader.credentials_provider(Credentials::new(
            &c.access_key_id,
            &c.secret_access_key,
            c.session_token.clone(),
            None,
            "switchyard-config",
        ));
    }
    if let Some(url) = &config.endpoint_url {
        loader = loader.endpoint_url(url);
    }
    let shared = loader.load().await;
    config
        .regions
        .iter()
        .map(|code| {
            let conf = aws_sdk_ec2::config::Builder::from(&shared)
                .region(AwsRegion::new(code.clone()))
                .build();
            (code.clone(), Client::from_conf(conf))
        })
        .collect()
}

fn now() -> Timestamp {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    Timestamp::from_millis(ms)
}

#[cfg(test)]
mod tests;

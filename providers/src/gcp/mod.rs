//! The GCP Compute Engine provider, over the REST API v1 (JSON over HTTPS with reqwest; no
//! Google SDK).
//!
//! - Auth: a service-account JSON key signs an RS256 JWT exchanged at the key's `token_uri`
//!   for an OAuth token, cached until shortly before it expires (see `auth`).
//! - `launch`: first an `instances.aggregatedList` by the `switchyard-cluster` and
//!   `switchyard-instance` labels (an instance launched before, whose answer was lost, is
//!   adopted), then `instances.insert` in the pool's region's configured zones, in order, moving
//!   to the next zone on a stockout. The instance name is derived from the cluster and key, and
//!   the insert carries a `requestId` derived from them too, so a retried insert is the same
//!   request to GCE. The zone operation is then polled (`zoneOperations.get`) until `DONE`,
//!   within `operation_timeout_s`; its error code is classified (see `error`).
//! - The instance carries the agent bootstrap as its `startup-script` metadata, the exact
//!   instance key, cluster and pool as metadata (`switchyard-instance`, `switchyard-cluster`,
//!   `switchyard-pool`), and labels (`switchyard-cluster`, `switchyard-instance`, sanitised to
//!   GCE's label rules) to be found by.
//! - Spot: `scheduling.provisioningModel = SPOT` with `instanceTerminationAction = DELETE`
//!   (a preempted node is gone, not stopped). GPU machines take `onHostMaintenance =
//!   TERMINATE` (they cannot live-migrate).
//! - Accelerators: every GCE machine type in the bundled catalogue is accelerator-optimized
//!   (a2, a3, a4, g2): its GPUs come with the machine type, so no `guestAccelerators` are sent.
//!   (N1 machines with attachable T4/V100/P100 are not in the catalogue and not offered.)
//! - `terminate`: `instances.delete` (404: already gone, Ok). It returns once GCE accepted the
//!   deletion, without waiting for the delete operation: until it is done, `list` shows the
//!   instance as terminated (`STOPPING`), afterwards not at all.
//! - `list`: `instances.aggregatedList` filtered by the cluster label, every page.
//! - `offers`: the bundled catalogue's prices for the configured regions. There is no cheap
//!   live price source: GCE prices are published only through the Cloud Billing Catalog API,
//!   as thousands of SKUs per service whose machine family, region and spot/on-demand split
//!   must be matched by description text; the catalogue (regenerated from published price
//!   lists) is used instead.
//!
//! Provider ids are `{zone}/{instance name}`. Every request has `request_timeout_s`; throttled
//! and transient failures are retried only through [`Backoff`].

mod auth;
mod config;
mod error;
mod names;

pub use auth::{COMPUTE_SCOPE, JWT_BEARER_GRANT, ServiceAccountKey};
pub use config::{AgentInstall, GcpConfig, GcpConfigError, RetrySettings, ZoneSettings, region_of};
pub use names::{instance_name, label_value};

use crate::catalogue::{Catalogue, CatalogueError, first_not_offered, pool_from_entry, region_id};
use crate::retry::Backoff;
use crate::{InstanceInfo, InstanceState, LaunchRequest, Offers, Provider, ProviderError};
use async_trait::async_trait;
use auth::TokenSource;
use error::{Class, Failure, OperationError};
use reqwest::Method;
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use switchyard_core::{Market, Money, Pool, PoolId, Region, Timestamp};

/// Label: the broker's cluster (sanitised).
pub const CLUSTER_LABEL: &str = "switchyard-cluster";
/// Label: the instance key (sanitised).
pub const INSTANCE_LABEL: &str = "switchyard-instance";
/// Metadata: the exact instance key.
pub const INSTANCE_METADATA: &str = "switchyard-instance";
/// Metadata: the exact cluster.
pub const CLUSTER_METADATA: &str = "switchyard-cluster";
/// Metadata: the pool id the instance was launched for.
pub const POOL_METADATA: &str = "switchyard-pool";
/// Metadata: the bootstrap script GCE runs at first boot.
pub const STARTUP_SCRIPT: &str = "startup-script";

/// A provider that cannot be built from its configuration.
#[derive(Debug, thiserror::Error)]
pub enum GcpSetupError {
    #[error(transparent)]
    Config(#[from] GcpConfigError),
    #[error("reading the bundled price catalogue: {0}")]
    Catalogue(#[from] CatalogueError),
    #[error("gcp: building the HTTP client: {0}")]
    Http(String),
}

/// Compute Engine as a [`Provider`].
pub struct GcpProvider {
    config: GcpConfig,
    http: reqwest::Client,
    tokens: TokenSource,
    backoff: Backoff,
    /// `{api_endpoint}/compute/v1/projects/{project}`.
    base: String,
    regions: Vec<Region>,
    pools: Vec<Pool>,
    /// Pool → (region, machine type).
    launchable: HashMap<PoolId, (String, String)>,
}

impl std::fmt::Debug for GcpProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GcpProvider")
            .field("project", &self.config.project)
            .field("cluster", &self.config.cluster)
            .field("zones", &self.config.zones)
            .field("pools", &self.pools.len())
            .finish_non_exhaustive()
    }
}

impl GcpProvider {
    /// Validates the config, reads the service-account key, builds the offers from the bundled
    /// catalogue. Calls no API: bad credentials show on the first call, as
    /// `ProviderError::Auth`.
    pub async fn new(config: GcpConfig) -> Result<GcpProvider, GcpSetupError> {
        config.validate()?;
        let (key, signer) =
            ServiceAccountKey::load(&config.credentials_file).map_err(GcpConfigError)?;
        let catalogue = Catalogue::bundled()?;
        let priced_at = now();
        let egress = Money::from_dollars(config.egress_per_gb_usd).ok_or_else(|| {
            GcpConfigError(format!(
                "egress_per_gb_usd {} out of range",
                config.egress_per_gb_usd
            ))
        })?;
        let mut region_codes: Vec<&str> = Vec::new();
        for zone in &config.zones {
            if let Some(r) = region_of(zone)
                && !region_codes.contains(&r)
            {
                region_codes.push(r);
            }
        }
        let mut regions = Vec::new();
        let mut pools = Vec::new();
        let mut launchable = HashMap::new();
        for code in region_codes {
            let in_region: Vec<_> = catalogue
                .entries()
                .iter()
                .filter(|e| e.provider == "gcp" && e.region == code)
                .collect();
            if in_region.is_empty() {
                return Err(GcpConfigError(format!(
                    "zones: region {code} is not one the bundled catalogue has GCE GPU machines in"
                ))
                .into());
            }
            let entries: Vec<_> = in_region
                .into_iter()
                .filter(|e| {
                    config.machine_types.is_empty()
                        || config.machine_types.contains(&e.instance_type)
                })
                .collect();
            if entries.is_empty() {
                return Err(GcpConfigError(format!(
                    "machine_types: none of {:?} is in the bundled catalogue for {code}",
                    config.machine_types
                ))
                .into());
            }
            regions.push(Region {
                id: region_id("gcp", code),
                provider: "gcp".into(),
                code: code.to_owned(),
                latitude: None,
                longitude: None,
                egress_per_gb: egress,
                latency_ms: config.latency_ms,
                ingress_gbps: 10,
            });
            for e in entries {
                let pool = pool_from_entry(e, config.boot_time_s, config.node_limit, priced_at);
                launchable.insert(pool.id.clone(), (code.to_owned(), e.instance_type.clone()));
                pools.push(pool);
            }
        }
        if let Some(t) = first_not_offered(&config.machine_types, &pools) {
            return Err(GcpConfigError(format!(
                "machine_types: {t} is not a GPU machine type the bundled catalogue has in the configured regions"
            ))
            .into());
        }
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(config.request_timeout_s))
            .connect_timeout(Duration::from_secs(config.request_timeout_s.min(10)))
            .build()
            .map_err(|e| GcpSetupError::Http(e.to_string()))?;
        let base = format!(
            "{}/compute/v1/projects/{}",
            config.api_endpoint.trim_end_matches('/'),
            config.project
        );
        Ok(GcpProvider {
            tokens: TokenSource::new(key, signer, http.clone()),
            backoff: Backoff::new(&config.retry),
            http,
            base,
            config,
            regions,
            pools,
            launchable,
        })
    }

    /// The configuration this provider runs with.
    pub fn config(&self) -> &GcpConfig {
        &self.config
    }

    /// One API call, retried through the backoff: `Ok(body)` on 2xx, else the classified
    /// failure (a 404 is `Class::NotFound`).
    async fn call(
        &self,
        operation: &'static str,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
    ) -> Result<Vec<u8>, Failure> {
        let url = format!("{}/{}", self.base, path);
        self.backoff
            .run(operation, || async {
                let token = self.tokens.token().await?;
                let mut request = self
                    .http
                    .request(method.clone(), &url)
                    .bearer_auth(&token)
                    .query(query);
                if let Some(b) = body {
                    request = request.json(b);
                }
                let response = request
                    .send()
                    .await
                    .map_err(|e| error::transport(operation, &e))?;
                let status = response.status().as_u16();
                let bytes = response
                    .bytes()
                    .await
                    .map_err(|e| error::transport(operation, &e))?;
                if (200..300).contains(&status) {
                    return Ok(bytes.to_vec());
                }
                if status == 401 {
                    self.tokens.invalidate().await;
                }
                Err(error::from_http(status, &bytes))
            })
            .await
    }

    async fn call_json<T: for<'de> Deserialize<'de>>(
        &self,
        operation: &'static str,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
    ) -> Result<T, Failure> {
        let bytes = self.call(operation, method, path, query, body).await?;
        serde_json::from_slice(&bytes).map_err(|e| {
            Failure::new(
                Class::Transient,
                format!("{operation}: unreadable answer: {e}"),
            )
        })
    }

    /// Every instance of this cluster matching `extra` label filters, all pages.
    async fn aggregated(&self, extra: &[(&str, String)]) -> Result<Vec<ApiInstance>, Failure> {
        let mut filter = format!(
            "(labels.{CLUSTER_LABEL} = \"{}\")",
            label_value(&self.config.cluster)
        );
        for (label, value) in extra {
            filter.push_str(&format!(" (labels.{label} = \"{value}\")"));
        }
        let mut out = Vec::new();
        let mut page_token: Option<String> = None;
        loop {
            let mut query = vec![("filter", filter.clone()), ("maxResults", "500".into())];
            if let Some(t) = &page_token {
                query.push(("pageToken", t.clone()));
            }
            let page: AggregatedList = self
                .call_json(
                    "instances.aggregatedList",
                    Method::GET,
                    "aggregated/instances",
                    &query,
                    None,
                )
                .await?;
            for scoped in page.items.into_values() {
                out.extend(scoped.instances);
            }
            match page.next_page_token.filter(|t| !t.is_empty()) {
                Some(t) => page_token = Some(t),
                None => break,
            }
        }
        Ok(out)
    }

    /// What Switchyard knows of an instance, if it is one of this cluster's.
    fn info_of(&self, instance: &ApiInstance) -> Option<InstanceInfo> {
        let zone = last_segment(&instance.zone);
        let region = region_of(zone)?;
        let metadata = |key: &str| {
            instance
                .metadata
                .items
                .iter()
                .find(|i| i.key == key)
                .and_then(|i| i.value.clone())
        };
        if metadata(CLUSTER_METADATA).is_some_and(|c| c != self.config.cluster) {
            return None;
        }
        let instance_key =
            metadata(INSTANCE_METADATA).or_else(|| instance.labels.get(INSTANCE_LABEL).cloned())?;
        let machine_type = last_segment(&instance.machine_type);
        let pool = metadata(POOL_METADATA)
            .map(PoolId::new)
            .unwrap_or_else(|| crate::catalogue::pool_id(&region_id("gcp", region), machine_type));
        let spot = instance.scheduling.provisioning_model.as_deref() == Some("SPOT")
            || instance.scheduling.preemptible == Some(true);
        Some(InstanceInfo {
            provider_id: format!("{zone}/{}", instance.name),
            instance_key,
            pool,
            market: if spot { Market::Spot } else { Market::OnDemand },
            state: state_of(&instance.status),
        })
    }

    /// The `instances.insert` body of one launch.
    fn instance_body(
        &self,
        request: &LaunchRequest,
        zone: &str,
        region: &str,
        machine_type: &str,
        script: &str,
    ) -> Result<Value, Failure> {
        let project = &self.config.project;
        let image = self
            .config
            .image_for(zone)
            .ok_or_else(|| Failure::new(Class::Rejected, format!("no image for zone {zone}")))?;
        let labels = json!({
            CLUSTER_LABEL: label_value(&self.config.cluster),
            INSTANCE_LABEL: label_value(&request.instance_key),
        });
        let network = expand(&self.config.network, || {
            format!("projects/{project}/global/networks/{}", self.config.network)
        });
        let mut nic = json!({ "network": network });
        if let Some(sub) = self.config.subnetwork_for(zone) {
            nic["subnetwork"] = json!(expand(&sub, || format!(
                "projects/{project}/regions/{region}/subnetworks/{sub}"
            )));
        }
        if self.config.external_ip {
            nic["accessConfigs"] = json!([{ "type": "ONE_TO_ONE_NAT", "name": "External NAT" }]);
        }
        let scheduling = match request.market {
            Market::Spot => json!({
                "provisioningModel": "SPOT",
                "instanceTerminationAction": "DELETE",
                "onHostMaintenance": "TERMINATE",
                "automaticRestart": false,
            }),
            Market::OnDemand => json!({
                "provisioningModel": "STANDARD",
                "onHostMaintenance": "TERMINATE",
                "automaticRestart": true,
            }),
        };
        Ok(json!({
            "name": instance_name(&self.config.cluster, &request.instance_key),
            "description": format!("Switchyard node {} of cluster {}", request.instance_key, self.config.cluster),
            "machineType": format!("zones/{zone}/machineTypes/{machine_type}"),
            "labels": labels,
            "metadata": { "items": [
                { "key": STARTUP_SCRIPT, "value": script },
                { "key": INSTANCE_METADATA, "value": request.instance_key },
                { "key": CLUSTER_METADATA, "value": self.config.cluster },
                { "key": POOL_METADATA, "value": request.pool.as_str() },
            ]},
            "scheduling": scheduling,
            "disks": [{
                "boot": true,
                "autoDelete": true,
                "type": "PERSISTENT",
                "initializeParams": {
                    "sourceImage": image,
                    "diskSizeGb": self.config.boot_disk_gb.to_string(),
                    "diskType": format!("zones/{zone}/diskTypes/{}", self.config.boot_disk_type),
                    "labels": labels,
                },
            }],
            "networkInterfaces": [nic],
        }))
    }

    /// Polls a zone operation until `DONE`, within `operation_timeout_s`; its error, if any,
    /// classified.
    async fn wait_operation(&self, zone: &str, first: ApiOperation) -> Result<(), Failure> {
        let bound = Duration::from_secs(self.config.operation_timeout_s);
        let name = first.name.clone();
        let poll = async {
            let mut op = first;
            let mut interval = Duration::from_millis(100);
            loop {
                if op.status == "DONE" {
                    return match &op.error {
                        Some(e) if !e.errors.is_empty() => {
                            Err(error::from_operation(e, op.http_error_status_code))
                        }
                        _ => Ok(()),
                    };
                }
                tokio::time::sleep(interval).await;
                interval = (interval * 2).min(Duration::from_secs(2));
                op = self
                    .call_json(
                        "zoneOperations.get",
                        Method::GET,
                        &format!("zones/{zone}/operations/{}", op.name),
                        &[],
                        None,
                    )
                    .await?;
            }
        };
        match tokio::time::timeout(bound, poll).await {
            Ok(result) => result,
            Err(_) => Err(Failure::new(
                Class::Transient,
                format!(
                    "operation {name} in {zone} not done after {}s; the instance may still start \
                     (a relaunch of the same key adopts it)",
                    bound.as_secs()
                ),
            )),
        }
    }

    /// One zone's insert: `Ok(info)`, or the classified failure.
    async fn insert_in(
        &self,
        request: &LaunchRequest,
        zone: &str,
        region: &str,
        machine_type: &str,
        script: &str,
    ) -> Result<InstanceInfo, Failure> {
        let body = self.instance_body(request, zone, region, machine_type, script)?;
        let name = instance_name(&self.config.cluster, &request.instance_key);
        let request_id =
            names::request_id(&["insert", &self.config.cluster, &request.instance_key, zone]);
        let inserted: Result<ApiOperation, Failure> = self
            .call_json(
                "instances.insert",
                Method::POST,
                &format!("zones/{zone}/instances"),
                &[("requestId", request_id.to_string())],
                Some(&body),
            )
            .await;
        match inserted {
            Ok(op) => self.wait_operation(zone, op).await?,
            // Created by an earlier attempt whose requestId GCE no longer remembers: adopt it.
            Err(f) if f.code.as_deref() == Some("alreadyExists") => {
                tracing::info!(gcp.zone = zone, "instance already exists, adopting it");
            }
            Err(f) => return Err(f),
        }
        Ok(InstanceInfo {
            provider_id: format!("{zone}/{name}"),
            instance_key: request.instance_key.clone(),
            pool: request.pool.clone(),
            market: request.market,
            state: InstanceState::Pending,
        })
    }

    async fn launch_in(
        &self,
        request: &LaunchRequest,
        region: &str,
        machine_type: &str,
    ) -> Result<InstanceInfo, Failure> {
        let found = self
            .aggregated(&[(INSTANCE_LABEL, label_value(&request.instance_key))])
            .await?;
        let mut known: Vec<InstanceInfo> = found
            .iter()
            .filter_map(|i| self.info_of(i))
            .filter(|i| i.instance_key == request.instance_key)
            .collect();
        known.sort_by_key(|i| i.state == InstanceState::Terminated);
        if let Some(info) = known.into_iter().next() {
            tracing::info!(instance.id = %info.provider_id, "instance key already launched");
            return Ok(info);
        }
        let enrolment = crate::bootstrap::Enrolment {
            broker_url: &request.broker_url,
            token: &request.enrolment_token,
            agent_name: &request.instance_key,
        };
        let script = crate::bootstrap::render(&self.config.agent, &enrolment)
            .map_err(|e| Failure::new(Class::Rejected, format!("refusing to launch: {e}")))?;
        let zones: Vec<&String> = self
            .config
            .zones
            .iter()
            .filter(|z| region_of(z) == Some(region))
            .collect();
        let mut last = Failure::new(Class::Rejected, format!("no zone configured in {region}"));
        for zone in zones {
            match self
                .insert_in(request, zone, region, machine_type, &script)
                .await
            {
                Err(f) if f.class == Class::Capacity => {
                    tracing::warn!(gcp.zone = %zone, error = %f.detail(), "zone out of capacity");
                    last = f;
                }
                other => return other,
            }
        }
        Err(last)
    }
}

#[async_trait]
impl Provider for GcpProvider {
    fn name(&self) -> &str {
        "gcp"
    }

    async fn offers(&self) -> Result<Offers, ProviderError> {
        Ok(Offers {
            regions: self.regions.clone(),
            pools: self.pools.clone(),
        })
    }

    #[tracing::instrument(skip_all, fields(instance.key = %request.instance_key, pool.id = %request.pool))]
    async fn launch(&self, request: &LaunchRequest) -> Result<InstanceInfo, ProviderError> {
        let (region, machine_type) = self
            .launchable
            .get(&request.pool)
            .ok_or_else(|| ProviderError::UnknownPool(request.pool.clone()))?;
        let started = Instant::now();
        let info = self
            .launch_in(request, region, machine_type)
            .await
            .map_err(|f| f.into_provider_error(Some(&request.pool)))?;
        tracing::info!(
            instance.id = %info.provider_id,
            market = ?request.market,
            duration_ms = started.elapsed().as_millis() as u64,
            "launched GCE instance"
        );
        Ok(info)
    }

    #[tracing::instrument(skip_all, fields(instance.id = %provider_id))]
    async fn terminate(&self, provider_id: &str) -> Result<(), ProviderError> {
        let (zone, name) = split_provider_id(provider_id).ok_or_else(|| {
            ProviderError::Rejected(format!(
                "{provider_id:?} is not a GCE provider id (zone/name)"
            ))
        })?;
        // A fresh requestId per terminate (reused by its retries): a later instance of the
        // same name is not mistaken for this one.
        let request_id = uuid::Uuid::now_v7();
        let result = self
            .call(
                "instances.delete",
                Method::DELETE,
                &format!("zones/{zone}/instances/{name}"),
                &[("requestId", request_id.to_string())],
                None,
            )
            .await;
        match result {
            Ok(_) => {
                tracing::info!("GCE instance deletion accepted");
                Ok(())
            }
            Err(f) if f.class == Class::NotFound => {
                tracing::info!("GCE instance already gone");
                Ok(())
            }
            Err(f) => Err(f.into_provider_error(None)),
        }
    }

    async fn list(&self) -> Result<Vec<InstanceInfo>, ProviderError> {
        let found = self
            .aggregated(&[])
            .await
            .map_err(|f| f.into_provider_error(None))?;
        Ok(found.iter().filter_map(|i| self.info_of(i)).collect())
    }
}

/// GCE instance status → Switchyard's view.
fn state_of(status: &str) -> InstanceState {
    match status {
        "PROVISIONING" | "STAGING" | "REPAIRING" => InstanceState::Pending,
        "RUNNING" => InstanceState::Running,
        // STOPPING, STOPPED, SUSPENDING, SUSPENDED, TERMINATED, DEPROVISIONING…: not serving.
        _ => InstanceState::Terminated,
    }
}

fn last_segment(url: &str) -> &str {
    url.rsplit('/').next().unwrap_or(url)
}

/// A name becomes a partial URL; a URL is kept.
fn expand(value: &str, url: impl FnOnce() -> String) -> String {
    if value.contains('/') {
        value.to_owned()
    } else {
        url()
    }
}

fn split_provider_id(id: &str) -> Option<(&str, &str)> {
    let (zone, name) = id.split_once('/')?;
    let plain = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    };
    (region_of(zone).is_some() && plain(name)).then_some((zone, name))
}

fn now() -> Timestamp {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    Timestamp::from_millis(ms)
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AggregatedList {
    #[serde(default)]
    items: BTreeMap<String, ScopedList>,
    #[serde(default)]
    next_page_token: Option<String>,
}

#[derive(Deserialize)]
struct ScopedList {
    #[serde(default)]
    instances: Vec<ApiInstance>,
}

/// The fields of a GCE `Instance` Switchyard reads. No `Debug`: its metadata holds the
/// startup script, enrolment token included.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ApiInstance {
    name: String,
    #[serde(default)]
    zone: String,
    #[serde(default)]
    status: String,
    #[serde(default)]
    machine_type: String,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    metadata: ApiMetadata,
    #[serde(default)]
    scheduling: ApiScheduling,
}

#[derive(Deserialize, Default)]
struct ApiMetadata {
    #[serde(default)]
    items: Vec<ApiMetadataItem>,
}

#[derive(Deserialize)]
struct ApiMetadataItem {
    key: String,
    #[serde(default)]
    value: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct ApiScheduling {
    #[serde(default)]
    provisioning_model: Option<String>,
    #[serde(default)]
    preemptible: Option<bool>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ApiOperation {
    name: String,
    #[serde(default)]
    status: String,
    #[serde(default)]
    error: Option<OperationError>,
    #[serde(default)]
    http_error_status_code: Option<u16>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_states() {
        for (status, state) in [
            ("PROVISIONING", InstanceState::Pending),
            ("STAGING", InstanceState::Pending),
            ("RUNNING", InstanceState::Running),
            ("STOPPING", InstanceState::Terminated),
            ("TERMINATED", InstanceState::Terminated),
            ("SUSPENDED", InstanceState::Terminated),
        ] {
            assert_eq!(state_of(status), state, "{status}");
        }
    }

    #[test]
    fn provider_ids_are_zone_and_name() {
        assert_eq!(
            split_provider_id("us-central1-a/sy-x-0123"),
            Some(("us-central1-a", "sy-x-0123"))
        );
        for bad in [
            "sy-x",
            "us-central1-a/",
            "nozone/x",
            "us-central1-a/a/b",
            "us-central1-a/A",
        ] {
            assert_eq!(split_provider_id(bad), None, "{bad}");
        }
        assert_eq!(region_of("europe-west4-a"), Some("europe-west4"));
        assert_eq!(region_of("uscentral1"), None);
    }
}

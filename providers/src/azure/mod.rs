//! The Azure Virtual Machines provider, on the Azure Resource Manager REST API.
//!
//! - Auth: OAuth2 client credentials (`{authority_host}/{tenant}/oauth2/v2.0/token`, the
//!   secret read from `client_secret_file`), the token cached until shortly before it expires.
//! - Launch: a NIC on the location's subnet, then the VM with the agent bootstrap as
//!   `osProfile.customData` (base64), tags carrying the cluster, the instance key and the pool,
//!   `priority: Spot` + `evictionPolicy: Delete` + `billingProfile.maxPrice: -1` for spot, and
//!   `deleteOption: Delete` on the NIC reference and the OS disk, so deleting the VM deletes
//!   them too. Both are long-running operations polled through `Azure-AsyncOperation`. A VM
//!   create that fails deletes what it made (the failed VM, the NIC).
//! - Idempotency on `instance_key`: the VM, NIC and disk names are derived from the cluster and
//!   the key ([`names`]), so a launch first reads the VM by name, and a retried `PUT` of the
//!   same name is ARM's own create-or-update: one key never makes two VMs.
//! - `list`: the resource group's VMs (following `nextLink`), those tagged with our cluster.
//! - `terminate`: `DELETE` the VM (already gone = Ok) and wait for the operation.
//! - Offers: the bundled catalogue's Azure sizes in the configured locations, with prices
//!   refreshed from the public Azure Retail Prices API ([`prices`]) when `prices_endpoint` is
//!   set (Linux pay-as-you-go and Spot meters, cached for an hour; on failure the catalogue's
//!   prices stay).
//!
//! Failures are classified by ARM's error code (see `error`); throttling and transient failures
//! are retried by [`crate::retry::Backoff`] only.

mod client;
mod config;
mod error;
pub mod names;
mod prices;

pub use config::{
    AgentInstall, AzureConfig, AzureConfigError, ImageConfig, LocationSettings, RetrySettings,
};

use crate::catalogue::{Catalogue, CatalogueError, first_not_offered, pool_from_entry, region_id};
use crate::{
    INSTANCE_TAG, InstanceInfo, InstanceState, LaunchRequest, Offers, Provider, ProviderError,
};
use async_trait::async_trait;
use base64::Engine as _;
use client::{Answer, Arm, ArmSettings, OpError, Secret};
use error::{Class, Failure};
use reqwest::Method;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use switchyard_core::{Market, Money, Pool, PoolId, Region, Timestamp};

/// The Microsoft.Compute api-version of every VM call (the checked-in spec's version).
pub const COMPUTE_API_VERSION: &str = "2024-07-01";
/// The Microsoft.Network api-version of every NIC call.
pub const NETWORK_API_VERSION: &str = "2024-05-01";
/// Tag holding the broker's cluster name: `list` sees only VMs carrying ours.
pub const CLUSTER_TAG: &str = "switchyard:cluster";
/// Tag holding the pool the VM was launched for.
pub const POOL_TAG: &str = "switchyard:pool";

/// A provider that cannot be built from its configuration.
#[derive(Debug, thiserror::Error)]
pub enum AzureSetupError {
    #[error(transparent)]
    Config(#[from] AzureConfigError),
    #[error("reading the bundled price catalogue: {0}")]
    Catalogue(#[from] CatalogueError),
    #[error("azure: {0}")]
    Client(String),
}

/// Azure VMs as a [`Provider`].
pub struct AzureProvider {
    config: AzureConfig,
    arm: Arm,
    regions: Vec<Region>,
    /// Catalogue-priced pools of every configured location.
    pools: Vec<Pool>,
    /// Pool → (location, VM size).
    launchable: HashMap<PoolId, (String, String)>,
    prices: prices::PriceCache,
}

impl std::fmt::Debug for AzureProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AzureProvider")
            .field("cluster", &self.config.cluster)
            .field("locations", &self.config.locations)
            .field("pools", &self.pools.len())
            .field("arm", &self.arm)
            .finish_non_exhaustive()
    }
}

impl AzureProvider {
    /// Validates the config (reading the client secret file), builds the offers from the
    /// bundled catalogue and the HTTP client. Calls no API: bad credentials show on the first
    /// call, as `ProviderError::Auth`.
    pub async fn new(config: AzureConfig) -> Result<AzureProvider, AzureSetupError> {
        config.validate()?;
        let secret = config.client_secret()?;
        let catalogue = Catalogue::bundled()?;
        let priced_at = now();
        let egress = Money::from_dollars(config.egress_per_gb_usd).ok_or_else(|| {
            AzureConfigError(format!(
                "egress_per_gb_usd {} out of range",
                config.egress_per_gb_usd
            ))
        })?;
        let mut regions = Vec::new();
        let mut pools = Vec::new();
        let mut launchable = HashMap::new();
        for location in &config.locations {
            let entries: Vec<_> = catalogue
                .entries()
                .iter()
                .filter(|e| e.provider == "azure" && &e.region == location)
                .collect();
            if entries.is_empty() {
                return Err(AzureConfigError(format!(
                    "locations: the bundled catalogue has no GPU VM sizes in {location:?} \
                     (an unknown location?)"
                ))
                .into());
            }
            let selected: Vec<_> = entries
                .into_iter()
                .filter(|e| {
                    config.vm_sizes.is_empty() || config.vm_sizes.contains(&e.instance_type)
                })
                .collect();
            if selected.is_empty() {
                return Err(AzureConfigError(format!(
                    "vm_sizes: none of {:?} is in the bundled catalogue for {location}",
                    config.vm_sizes
                ))
                .into());
            }
            regions.push(Region {
                id: region_id("azure", location),
                provider: "azure".into(),
                code: location.clone(),
                latitude: None,
                longitude: None,
                egress_per_gb: egress,
                latency_ms: config.latency_ms,
                ingress_gbps: 10,
            });
            for e in selected {
                let pool = pool_from_entry(e, config.boot_time_s, config.node_limit, priced_at);
                launchable.insert(pool.id.clone(), (location.clone(), e.instance_type.clone()));
                pools.push(pool);
            }
        }
        if let Some(size) = first_not_offered(&config.vm_sizes, &pools) {
            return Err(AzureConfigError(format!(
                "vm_sizes: {size:?} is not an Azure GPU size the bundled catalogue has in the \
                 configured locations"
            ))
            .into());
        }
        let arm = Arm::new(ArmSettings {
            arm_endpoint: config.arm_endpoint.clone(),
            authority_host: config.authority_host.clone(),
            tenant_id: config.tenant_id.clone(),
            client_id: config.client_id.clone(),
            secret: Secret(secret),
            request_timeout: Duration::from_secs(config.request_timeout_s),
            operation_timeout: Duration::from_secs(config.operation_timeout_s),
            poll_interval: Duration::from_millis(config.poll_interval_ms),
            retry: config.retry.clone(),
        })
        .map_err(AzureSetupError::Client)?;
        Ok(AzureProvider {
            config,
            arm,
            regions,
            pools,
            launchable,
            prices: prices::PriceCache::default(),
        })
    }

    /// The configuration this provider runs with.
    pub fn config(&self) -> &AzureConfig {
        &self.config
    }

    fn group_path(&self) -> String {
        format!(
            "/subscriptions/{}/resourceGroups/{}",
            self.config.subscription_id, self.config.resource_group
        )
    }

    fn vm_path(&self, vm: &str) -> String {
        format!(
            "{}/providers/Microsoft.Compute/virtualMachines/{vm}",
            self.group_path()
        )
    }

    fn nic_path(&self, nic: &str) -> String {
        format!(
            "{}/providers/Microsoft.Network/networkInterfaces/{nic}",
            self.group_path()
        )
    }

    /// The VM named `vm`, if it exists.
    async fn get_vm(&self, vm: &str) -> Result<Option<Value>, Failure> {
        let url = self.arm.url(&self.vm_path(vm), COMPUTE_API_VERSION);
        match self
            .arm
            .call("VirtualMachines_Get", Method::GET, &url, None)
            .await
        {
            Ok(a) => Ok(Some(a.body)),
            Err(f) if f.class == Class::NotFound => Ok(None),
            Err(f) => Err(f),
        }
    }

    /// Deletes a VM and waits for it to go; gone already is fine.
    async fn delete_vm(&self, vm: &str) -> Result<(), Failure> {
        let url = self.arm.url(&self.vm_path(vm), COMPUTE_API_VERSION);
        match self
            .arm
            .call("VirtualMachines_Delete", Method::DELETE, &url, None)
            .await
        {
            Ok(a) => self
                .arm
                .wait("VirtualMachines_Delete", &a)
                .await
                .map_err(OpError::into_failure),
            Err(f) if f.class == Class::NotFound => Ok(()),
            Err(f) => Err(f),
        }
    }

    /// Deletes a NIC a failed launch made, without waiting for it to go (a NIC still attached
    /// to a VM is refused by Azure, which is what we want). Failures are only logged.
    async fn delete_nic(&self, nic: &str) {
        let url = self.arm.url(&self.nic_path(nic), NETWORK_API_VERSION);
        match self
            .arm
            .call("NetworkInterfaces_Delete", Method::DELETE, &url, None)
            .await
        {
            Ok(_) => tracing::info!(azure.nic = nic, "deleted the NIC of a failed launch"),
            Err(f) if f.class == Class::NotFound => {}
            Err(f) => {
                tracing::warn!(azure.nic = nic, error = %f.detail(), "could not delete the NIC of a failed launch");
            }
        }
    }

    fn image_reference(&self) -> Value {
        let i = &self.config.image;
        match &i.id {
            Some(id) => json!({ "id": id }),
            None => json!({
                "publisher": i.publisher,
                "offer": i.offer,
                "sku": i.sku,
                "version": i.version.as_deref().unwrap_or("latest"),
            }),
        }
    }

    fn tags(&self, request: &LaunchRequest) -> Value {
        json!({
            CLUSTER_TAG: self.config.cluster,
            INSTANCE_TAG: request.instance_key,
            POOL_TAG: request.pool.as_str(),
        })
    }

    /// The `NetworkInterfaces_CreateOrUpdate` body.
    fn nic_body(&self, request: &LaunchRequest, location: &str) -> Result<Value, Failure> {
        let subnet = self
            .config
            .per_location
            .get(location)
            .map(|s| s.subnet_id.clone())
            .ok_or_else(|| Failure::new(Class::Rejected, format!("no subnet_id for {location}")))?;
        Ok(json!({
            "location": location,
            "tags": self.tags(request),
            "properties": {
                "ipConfigurations": [{
                    "name": "ipconfig1",
                    "properties": {
                        "subnet": { "id": subnet },
                        "privateIPAllocationMethod": "Dynamic",
                        "primary": true,
                    }
                }]
            }
        }))
    }

    /// The `VirtualMachines_CreateOrUpdate` body.
    fn vm_body(
        &self,
        request: &LaunchRequest,
        names: &names::Names,
        location: &str,
        size: &str,
        script: &str,
    ) -> Value {
        let nic_id = self.nic_path(&names.nic);
        let user = &self.config.admin_username;
        let mut properties = json!({
            "hardwareProfile": { "vmSize": size },
            "storageProfile": {
                "imageReference": self.image_reference(),
                "osDisk": {
                    "name": names.disk,
                    "createOption": "FromImage",
                    "deleteOption": "Delete",
                    "managedDisk": { "storageAccountType": self.config.os_disk_type },
                },
            },
            "osProfile": {
                "computerName": names.vm,
                "adminUsername": user,
                "customData": base64::engine::general_purpose::STANDARD.encode(script),
                "linuxConfiguration": {
                    "disablePasswordAuthentication": true,
                    "ssh": {
                        "publicKeys": [{
                            "path": format!("/home/{user}/.ssh/authorized_keys"),
                            "keyData": self.config.ssh_public_key.trim(),
                        }]
                    }
                }
            },
            "networkProfile": {
                "networkInterfaces": [{
                    "id": nic_id,
                    "properties": { "primary": true, "deleteOption": "Delete" }
                }]
            },
            "priority": "Regular",
        });
        if request.market == Market::Spot {
            properties["priority"] = json!("Spot");
            properties["evictionPolicy"] = json!("Delete");
            // -1: pay up to the on-demand price; the VM is evicted for capacity, not price.
            properties["billingProfile"] = json!({ "maxPrice": -1 });
        }
        json!({
            "location": location,
            "tags": self.tags(request),
            "properties": properties,
        })
    }

    async fn launch_in(
        &self,
        request: &LaunchRequest,
        location: &str,
        size: &str,
    ) -> Result<InstanceInfo, Failure> {
        let names = names::Names::of(&self.config.cluster, &request.instance_key);
        if let Some(vm) = self.get_vm(&names.vm).await? {
            let Some(info) = self.info_of(&vm) else {
                return Err(Failure::new(
                    Class::Rejected,
                    format!(
                        "a VM named {} exists in the resource group without this cluster's tags",
                        names.vm
                    ),
                ));
            };
            if provisioning_state(&vm) != Some("Failed") {
                tracing::info!(azure.vm = %names.vm, "instance key already launched");
                return Ok(info);
            }
            tracing::info!(azure.vm = %names.vm, "replacing a VM whose creation failed");
            self.delete_vm(&names.vm).await?;
        }
        let enrolment = crate::bootstrap::Enrolment {
            broker_url: &request.broker_url,
            token: &request.enrolment_token,
            agent_name: &request.instance_key,
        };
        let script = crate::bootstrap::render(&self.config.agent, &enrolment)
            .map_err(|e| Failure::new(Class::Rejected, format!("refusing to launch: {e}")))?;

        let nic_url = self
            .arm
            .url(&self.nic_path(&names.nic), NETWORK_API_VERSION);
        let nic_body = self.nic_body(request, location)?;
        let nic = self
            .arm
            .call(
                "NetworkInterfaces_CreateOrUpdate",
                Method::PUT,
                &nic_url,
                Some(&nic_body),
            )
            .await;
        let nic_done = match nic {
            Ok(a) => self
                .arm
                .wait("NetworkInterfaces_CreateOrUpdate", &a)
                .await
                .map_err(OpError::into_failure),
            Err(f) => Err(f),
        };
        if let Err(f) = nic_done {
            self.delete_nic(&names.nic).await;
            return Err(f);
        }

        let vm_url = self.arm.url(&self.vm_path(&names.vm), COMPUTE_API_VERSION);
        let body = self.vm_body(request, &names, location, size, &script);
        let created: Answer = match self
            .arm
            .call(
                "VirtualMachines_CreateOrUpdate",
                Method::PUT,
                &vm_url,
                Some(&body),
            )
            .await
        {
            Ok(a) => a,
            Err(f) => {
                // Refused (capacity, quota, a bad request) or unanswered: the NIC goes. Should
                // a VM exist after all (a lost answer), Azure refuses to delete its NIC.
                self.delete_nic(&names.nic).await;
                return Err(f);
            }
        };
        let info = InstanceInfo {
            provider_id: names.vm.clone(),
            instance_key: request.instance_key.clone(),
            pool: request.pool.clone(),
            market: request.market,
            state: InstanceState::Pending,
        };
        match self
            .arm
            .wait("VirtualMachines_CreateOrUpdate", &created)
            .await
        {
            Ok(()) => Ok(InstanceInfo {
                state: InstanceState::Running,
                ..info
            }),
            Err(OpError::Failed(f)) => {
                // The VM exists in the Failed state: delete it (its disk and NIC go with it),
                // then the NIC in case it was never attached.
                tracing::warn!(azure.vm = %names.vm, error = %f.detail(), "VM creation failed; deleting what it made");
                if let Err(e) = self.delete_vm(&names.vm).await {
                    tracing::warn!(azure.vm = %names.vm, error = %e.detail(), "could not delete the failed VM");
                }
                self.delete_nic(&names.nic).await;
                Err(f)
            }
            // Still running: the VM may come up; the same key finds it again.
            Err(OpError::Unknown(f)) => Err(f),
        }
    }

    /// Ours (the cluster tag matches, the instance tag is there) as an [`InstanceInfo`].
    fn info_of(&self, vm: &Value) -> Option<InstanceInfo> {
        let tags = vm.get("tags")?;
        if tags.get(CLUSTER_TAG)?.as_str()? != self.config.cluster {
            return None;
        }
        let key = tags.get(INSTANCE_TAG)?.as_str()?.to_owned();
        let name = vm.get("name")?.as_str()?.to_owned();
        let props = vm.get("properties");
        let location = vm.get("location").and_then(Value::as_str).unwrap_or("");
        let size = props
            .and_then(|p| p.pointer("/hardwareProfile/vmSize"))
            .and_then(Value::as_str);
        let pool = match (tags.get(POOL_TAG).and_then(Value::as_str), size) {
            (Some(p), _) => PoolId::new(p),
            (None, Some(s)) => crate::catalogue::pool_id(&region_id("azure", location), s),
            (None, None) => PoolId::new("unknown"),
        };
        let spot = props
            .and_then(|p| p.get("priority"))
            .and_then(Value::as_str)
            .is_some_and(|p| p.eq_ignore_ascii_case("Spot"));
        let state = match provisioning_state(vm) {
            Some("Succeeded") => InstanceState::Running,
            Some("Deleting") => InstanceState::Terminated,
            _ => InstanceState::Pending,
        };
        Some(InstanceInfo {
            provider_id: name,
            instance_key: key,
            pool,
            market: if spot { Market::Spot } else { Market::OnDemand },
            state,
        })
    }
}

fn provisioning_state(vm: &Value) -> Option<&str> {
    vm.pointer("/properties/provisioningState")
        .and_then(Value::as_str)
}

/// Most `nextLink` pages one `list` follows.
const MAX_PAGES: usize = 1_000;

#[async_trait]
impl Provider for AzureProvider {
    fn name(&self) -> &str {
        "azure"
    }

    async fn offers(&self) -> Result<Offers, ProviderError> {
        let mut pools = self.pools.clone();
        if !self.config.prices_endpoint.is_empty() {
            let quotes = self
                .prices
                .get(&self.arm, &self.config.prices_endpoint, &self.launchable)
                .await;
            prices::apply(&mut pools, &quotes, now());
        }
        Ok(Offers {
            regions: self.regions.clone(),
            pools,
        })
    }

    #[tracing::instrument(skip_all, fields(instance.key = %request.instance_key, pool.id = %request.pool))]
    async fn launch(&self, request: &LaunchRequest) -> Result<InstanceInfo, ProviderError> {
        let (location, size) = self
            .launchable
            .get(&request.pool)
            .ok_or_else(|| ProviderError::UnknownPool(request.pool.clone()))?;
        let started = Instant::now();
        let info = self
            .launch_in(request, location, size)
            .await
            .map_err(|f| f.into_provider_error(Some(&request.pool)))?;
        tracing::info!(
            azure.vm = %info.provider_id,
            market = ?request.market,
            duration_ms = started.elapsed().as_millis() as u64,
            "launched Azure VM"
        );
        Ok(info)
    }

    #[tracing::instrument(skip_all, fields(azure.vm = %provider_id))]
    async fn terminate(&self, provider_id: &str) -> Result<(), ProviderError> {
        if !names::is_vm_name(provider_id) {
            return Err(ProviderError::Rejected(format!(
                "{provider_id:?} is not an Azure VM name"
            )));
        }
        self.delete_vm(provider_id)
            .await
            .map_err(|f| f.into_provider_error(None))?;
        tracing::info!("deleted Azure VM (or it was gone)");
        Ok(())
    }

    async fn list(&self) -> Result<Vec<InstanceInfo>, ProviderError> {
        let mut url = self.arm.url(
            &format!(
                "{}/providers/Microsoft.Compute/virtualMachines",
                self.group_path()
            ),
            COMPUTE_API_VERSION,
        );
        let mut out = Vec::new();
        for _ in 0..MAX_PAGES {
            let page = self
                .arm
                .call("VirtualMachines_List", Method::GET, &url, None)
                .await
                .map_err(|f| f.into_provider_error(None))?;
            if let Some(vms) = page.body.get("value").and_then(Value::as_array) {
                out.extend(vms.iter().filter_map(|vm| self.info_of(vm)));
            }
            match page.body.get("nextLink").and_then(Value::as_str) {
                Some(next) if !next.is_empty() => url = next.to_owned(),
                _ => return Ok(out),
            }
        }
        Err(ProviderError::Transient(format!(
            "VirtualMachines_List: more than {MAX_PAGES} pages"
        )))
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

//! The Azure provider's configuration: its serde shape (the `[azure]` table of the broker's
//! TOML) and its validation. Reading the client secret file is the only I/O here.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;

pub use crate::bootstrap::AgentInstall;
pub use crate::retry::RetrySettings;

/// How Switchyard authenticates to Azure Resource Manager and launches its VMs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AzureConfig {
    /// Microsoft Entra (Azure AD) tenant of the service principal (a GUID or a domain).
    pub tenant_id: String,
    /// Application (client) id of the service principal.
    pub client_id: String,
    /// File holding the service principal's client secret (its first line; never logged).
    pub client_secret_file: PathBuf,
    /// Subscription the VMs are billed to.
    pub subscription_id: String,
    /// Resource group holding the VMs and their NICs and disks (it must exist).
    pub resource_group: String,
    /// Azure locations to offer and launch in, e.g. `["eastus", "westeurope"]`.
    pub locations: Vec<String>,
    /// Value of the `switchyard:cluster` tag: `list` sees only VMs carrying it, so two
    /// brokers in one resource group never touch each other's VMs.
    pub cluster: String,
    /// Where OAuth2 tokens come from; the public cloud's by default (sovereign clouds and
    /// tests override it).
    #[serde(default = "default_authority_host")]
    pub authority_host: String,
    /// Azure Resource Manager; the public cloud's by default.
    #[serde(default = "default_arm_endpoint")]
    pub arm_endpoint: String,
    /// The Azure Retail Prices API (public, no credentials) for live prices; `""` turns the
    /// refresh off and the bundled catalogue's prices are used.
    #[serde(default = "default_prices_endpoint")]
    pub prices_endpoint: String,
    /// The OS image of every VM.
    pub image: ImageConfig,
    /// Per-location settings, keyed by location; every location needs a `subnet_id`.
    pub per_location: BTreeMap<String, LocationSettings>,
    /// Linux administrator account of the VMs (password login is off).
    #[serde(default = "default_admin_username")]
    pub admin_username: String,
    /// OpenSSH public key for `admin_username` (Azure requires one for Linux VMs without a
    /// password), e.g. `ssh-ed25519 AAAA… ops@example`.
    pub ssh_public_key: String,
    /// VM sizes to offer; empty means every GPU size the bundled catalogue has there.
    #[serde(default)]
    pub vm_sizes: Vec<String>,
    /// Managed disk type of the OS disk (`Standard_LRS`, `StandardSSD_LRS`, `Premium_LRS`…).
    #[serde(default = "default_os_disk_type")]
    pub os_disk_type: String,
    /// Expected seconds from launch to an agent ready for work.
    #[serde(default = "default_boot_time_s")]
    pub boot_time_s: u32,
    /// Node limit per pool (the broker's quota estimate; Azure's core quota is Azure's).
    #[serde(default = "default_node_limit")]
    pub node_limit: u32,
    /// Broker-to-region round trip used until agents report one.
    #[serde(default = "default_latency_ms")]
    pub latency_ms: u32,
    /// Price of one GB out of a location.
    #[serde(default = "default_egress")]
    pub egress_per_gb_usd: f64,
    /// Timeout of one HTTP request (token, ARM, prices).
    #[serde(default = "default_request_timeout_s")]
    pub request_timeout_s: u64,
    /// Longest wait for one long-running operation (`Azure-AsyncOperation`) to finish.
    #[serde(default = "default_operation_timeout_s")]
    pub operation_timeout_s: u64,
    /// Longest pause between two polls of an operation (Azure's `Retry-After` is followed
    /// when shorter).
    #[serde(default = "default_poll_interval_ms")]
    pub poll_interval_ms: u64,
    #[serde(default)]
    pub retry: RetrySettings,
    pub agent: AgentInstall,
}

/// A marketplace image (`publisher`, `offer`, `sku`, `version`) or an image resource id
/// (`id`: a managed image or a gallery image version).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageConfig {
    #[serde(default)]
    pub publisher: Option<String>,
    #[serde(default)]
    pub offer: Option<String>,
    #[serde(default)]
    pub sku: Option<String>,
    /// `latest` by default.
    #[serde(default)]
    pub version: Option<String>,
    #[serde(default)]
    pub id: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LocationSettings {
    /// Resource id of the subnet the VMs' NICs join in this location
    /// (`/subscriptions/…/resourceGroups/…/providers/Microsoft.Network/virtualNetworks/…/subnets/…`).
    pub subnet_id: String,
}

/// A configuration that cannot work; the message names the field.
#[derive(Debug, thiserror::Error)]
#[error("azure config: {0}")]
pub struct AzureConfigError(pub String);

impl AzureConfig {
    /// Checks everything that can be checked without calling Azure, and reads the secret.
    pub fn validate(&self) -> Result<(), AzureConfigError> {
        self.validate_fields()?;
        self.client_secret().map(|_| ())
    }

    /// The client secret: the first line of `client_secret_file`.
    pub(crate) fn client_secret(&self) -> Result<String, AzureConfigError> {
        let path = &self.client_secret_file;
        let text = std::fs::read_to_string(path).map_err(|e| {
            AzureConfigError(format!(
                "client_secret_file {}: cannot be read: {e}",
                path.display()
            ))
        })?;
        let secret = text.lines().next().unwrap_or("").trim().to_owned();
        if secret.is_empty() {
            return Err(AzureConfigError(format!(
                "client_secret_file {} is empty",
                path.display()
            )));
        }
        Ok(secret)
    }

    fn validate_fields(&self) -> Result<(), AzureConfigError> {
        let fail = |m: String| Err(AzureConfigError(m));
        for (field, value) in [
            ("tenant_id", &self.tenant_id),
            ("client_id", &self.client_id),
            ("subscription_id", &self.subscription_id),
            ("resource_group", &self.resource_group),
            ("cluster", &self.cluster),
            ("admin_username", &self.admin_username),
            ("os_disk_type", &self.os_disk_type),
        ] {
            if value.trim().is_empty() {
                return fail(format!("{field} is empty"));
            }
            if !value
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.()".contains(&b))
            {
                return fail(format!(
                    "{field} {value:?} may hold only letters, digits and -_.()"
                ));
            }
        }
        if self.locations.is_empty() {
            return fail("locations is empty".into());
        }
        for l in &self.locations {
            if l.is_empty()
                || !l
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
            {
                return fail(format!(
                    "locations: {l:?} is not an Azure location name (e.g. eastus)"
                ));
            }
            match self.per_location.get(l) {
                None => return fail(format!("per_location.{l}.subnet_id is missing")),
                Some(s) if !is_subnet_id(&s.subnet_id) => {
                    return fail(format!(
                        "per_location.{l}.subnet_id {:?} is not a subnet resource id \
                         (/subscriptions/…/providers/Microsoft.Network/virtualNetworks/…/subnets/…)",
                        s.subnet_id
                    ));
                }
                Some(_) => {}
            }
        }
        if let Some(l) = self
            .per_location
            .keys()
            .find(|l| !self.locations.contains(l))
        {
            return fail(format!(
                "per_location.{l} names a location not in locations"
            ));
        }
        for (field, url) in [
            ("authority_host", &self.authority_host),
            ("arm_endpoint", &self.arm_endpoint),
        ] {
            if !is_http_url(url) {
                return fail(format!("{field} {url:?} is not an http(s) URL"));
            }
        }
        if !self.prices_endpoint.is_empty() && !is_http_url(&self.prices_endpoint) {
            return fail(format!(
                "prices_endpoint {:?} is not an http(s) URL (or \"\" for none)",
                self.prices_endpoint
            ));
        }
        let i = &self.image;
        match (&i.id, &i.publisher, &i.offer, &i.sku) {
            (Some(id), None, None, None) if id.starts_with('/') => {}
            (Some(id), None, None, None) => {
                return fail(format!("image.id {id:?} is not a resource id"));
            }
            (None, Some(p), Some(o), Some(s))
                if !p.is_empty() && !o.is_empty() && !s.is_empty() => {}
            (Some(_), _, _, _) => {
                return fail("image: give id, or publisher/offer/sku, not both".into());
            }
            _ => return fail("image: give id, or all of publisher, offer and sku".into()),
        }
        if i.id.is_some() && i.version.is_some() {
            return fail("image.version applies only to publisher/offer/sku".into());
        }
        let key = self.ssh_public_key.trim();
        if !(key.starts_with("ssh-") || key.starts_with("ecdsa-")) || key.contains('\n') {
            return fail("ssh_public_key is not an OpenSSH public key (ssh-ed25519 AAAA…)".into());
        }
        if self.vm_sizes.iter().any(|s| s.trim().is_empty()) {
            return fail("vm_sizes holds an empty name".into());
        }
        if self.retry.max_attempts == 0 {
            return fail("retry.max_attempts must be at least 1".into());
        }
        if self.retry.base_delay_ms > self.retry.max_delay_ms {
            return fail("retry.base_delay_ms exceeds retry.max_delay_ms".into());
        }
        if self.request_timeout_s == 0 {
            return fail("request_timeout_s must be positive".into());
        }
        if self.operation_timeout_s == 0 {
            return fail("operation_timeout_s must be positive".into());
        }
        if self.poll_interval_ms == 0 {
            return fail("poll_interval_ms must be positive".into());
        }
        if !(self.egress_per_gb_usd.is_finite() && self.egress_per_gb_usd >= 0.0) {
            return fail(format!(
                "egress_per_gb_usd {} is not a price",
                self.egress_per_gb_usd
            ));
        }
        self.agent.validate().map_err(AzureConfigError)
    }
}

fn is_http_url(url: &str) -> bool {
    (url.starts_with("http://") || url.starts_with("https://"))
        && !url.contains(char::is_whitespace)
}

fn is_subnet_id(id: &str) -> bool {
    let parts: Vec<&str> = id.split('/').collect();
    // "", subscriptions, S, resourceGroups, RG, providers, Microsoft.Network,
    // virtualNetworks, V, subnets, N
    parts.len() == 11
        && parts[0].is_empty()
        && parts[1].eq_ignore_ascii_case("subscriptions")
        && parts[3].eq_ignore_ascii_case("resourceGroups")
        && parts[5].eq_ignore_ascii_case("providers")
        && parts[6].eq_ignore_ascii_case("Microsoft.Network")
        && parts[7].eq_ignore_ascii_case("virtualNetworks")
        && parts[9].eq_ignore_ascii_case("subnets")
        && parts.iter().skip(1).all(|p| !p.is_empty())
}

fn default_authority_host() -> String {
    "https://login.microsoftonline.com".into()
}
fn default_arm_endpoint() -> String {
    "https://management.azure.com".into()
}
fn default_prices_endpoint() -> String {
    "https://prices.azure.com".into()
}
fn default_admin_username() -> String {
    "switchyard".into()
}
fn default_os_disk_type() -> String {
    "StandardSSD_LRS".into()
}
fn default_boot_time_s() -> u32 {
    240
}
fn default_node_limit() -> u32 {
    4
}
fn default_latency_ms() -> u32 {
    40
}
fn default_egress() -> f64 {
    0.087
}
fn default_request_timeout_s() -> u64 {
    30
}
fn default_operation_timeout_s() -> u64 {
    600
}
fn default_poll_interval_ms() -> u64 {
    5_000
}

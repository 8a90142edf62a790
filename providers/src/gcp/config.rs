//! The GCE provider's configuration: the `[gcp]` table of the broker's TOML, and its
//! validation. Reading the service-account key file is part of validation (a key that does not
//! parse stops the start with the field named); nothing here calls an API.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub use crate::bootstrap::AgentInstall;
pub use crate::retry::RetrySettings;

/// How Switchyard launches and finds its Compute Engine instances.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GcpConfig {
    /// The project instances are created in (its id, e.g. `my-gpu-project`).
    pub project: String,
    /// Zones to launch in, e.g. `["us-central1-a", "us-central1-b", "europe-west4-a"]`. Pools
    /// are per region (the zone without its last `-x`); a launch tries the region's zones in
    /// this order and moves to the next one when a zone is out of capacity.
    pub zones: Vec<String>,
    /// Path of the service-account JSON key file (`type = "service_account"`, with
    /// `client_email`, `private_key`, `private_key_id`, `token_uri`). Its key signs the JWT
    /// exchanged at `token_uri` for an OAuth token (scope `…/auth/compute`).
    pub credentials_file: String,
    /// The Compute Engine endpoint; requests go to `{api_endpoint}/compute/v1/projects/…`.
    #[serde(default = "default_api_endpoint")]
    pub api_endpoint: String,
    /// Boot disk image: a full or partial URL, e.g.
    /// `projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64`. May be left out
    /// when every zone has a `per_zone.<zone>.image`.
    #[serde(default)]
    pub image: Option<String>,
    /// The VPC network: a name (`default`) or a partial URL (`projects/p/global/networks/n`).
    #[serde(default = "default_network")]
    pub network: String,
    /// The subnetwork: a name (expanded to the zone's region) or a partial URL. Optional on an
    /// auto-mode network.
    #[serde(default)]
    pub subnetwork: Option<String>,
    /// Per-zone overrides, keyed by zone (each must be in `zones`).
    #[serde(default)]
    pub per_zone: BTreeMap<String, ZoneSettings>,
    /// Value of the `switchyard-cluster` label: `list` and the orphan reaper see only the
    /// instances carrying it, so two brokers in one project never touch each other's.
    pub cluster: String,
    /// Machine types to offer (e.g. `["g2-standard-8", "a3-highgpu-8g"]`); empty means every
    /// GPU machine type the bundled catalogue has in the configured regions.
    #[serde(default)]
    pub machine_types: Vec<String>,
    /// Boot disk size in GB.
    #[serde(default = "default_boot_disk_gb")]
    pub boot_disk_gb: u32,
    /// Boot disk type (`pd-balanced`, `pd-ssd`, `hyperdisk-balanced` — a4 machines take only
    /// Hyperdisk).
    #[serde(default = "default_boot_disk_type")]
    pub boot_disk_type: String,
    /// Give each instance an ephemeral external IP (the agent must reach the broker and its
    /// download URL); turn off on a subnetwork with Cloud NAT.
    #[serde(default = "default_true")]
    pub external_ip: bool,
    /// The broker's planning estimate of the boot time, in seconds.
    #[serde(default = "default_boot_time_s")]
    pub boot_time_s: u32,
    /// Node limit per pool (the broker's quota estimate; GCE's GPU quota is enforced by GCE).
    #[serde(default = "default_node_limit")]
    pub node_limit: u32,
    #[serde(default = "default_latency_ms")]
    pub latency_ms: u32,
    /// Internet egress price per GB, for the planner.
    #[serde(default = "default_egress")]
    pub egress_per_gb_usd: f64,
    /// Timeout of one HTTP request (the token exchange included), in seconds.
    #[serde(default = "default_request_timeout_s")]
    pub request_timeout_s: u64,
    /// How long a launch waits for its zone operation to be `DONE`, in seconds.
    #[serde(default = "default_operation_timeout_s")]
    pub operation_timeout_s: u64,
    /// Retries of throttled and transient calls (jittered exponential backoff).
    #[serde(default)]
    pub retry: RetrySettings,
    /// How the instance installs and starts `switchyard-agent`.
    pub agent: AgentInstall,
}

/// Settings of one zone that win over the top-level ones.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ZoneSettings {
    #[serde(default)]
    pub image: Option<String>,
    #[serde(default)]
    pub subnetwork: Option<String>,
}

/// A configuration that cannot work; the message names the field.
#[derive(Debug, thiserror::Error)]
#[error("gcp config: {0}")]
pub struct GcpConfigError(pub String);

impl GcpConfig {
    /// Settings of one zone (defaults when it has none).
    pub fn zone_settings(&self, zone: &str) -> ZoneSettings {
        self.per_zone.get(zone).cloned().unwrap_or_default()
    }

    /// The image a launch in `zone` boots.
    pub fn image_for(&self, zone: &str) -> Option<String> {
        self.zone_settings(zone)
            .image
            .or_else(|| self.image.clone())
    }

    /// The subnetwork of `zone`, if any.
    pub fn subnetwork_for(&self, zone: &str) -> Option<String> {
        self.zone_settings(zone)
            .subnetwork
            .or_else(|| self.subnetwork.clone())
    }

    /// Checks everything that can be checked without calling GCE (the key file is read and
    /// parsed, see [`super::auth::ServiceAccountKey::load`]).
    pub fn validate(&self) -> Result<(), GcpConfigError> {
        let fail = |m: String| Err(GcpConfigError(m));
        if !is_project_id(&self.project) {
            return fail(format!(
                "project {:?} is not a project id (lowercase letters, digits, hyphens)",
                self.project
            ));
        }
        if self.cluster.trim().is_empty() {
            return fail("cluster is empty".into());
        }
        if self.zones.is_empty() {
            return fail("zones is empty".into());
        }
        for zone in &self.zones {
            if region_of(zone).is_none() {
                return fail(format!(
                    "zones: {zone:?} is not a zone name like us-central1-a"
                ));
            }
        }
        if let Some(z) = self.per_zone.keys().find(|z| !self.zones.contains(z)) {
            return fail(format!("per_zone.{z} names a zone not in zones"));
        }
        if let Some(z) = self.zones.iter().find(|z| self.image_for(z).is_none()) {
            return fail(format!(
                "image: none given (zone {z} has no per_zone image)"
            ));
        }
        for (what, value) in [("image", self.image.as_deref())].into_iter().chain(
            self.per_zone
                .values()
                .map(|s| ("per_zone image", s.image.as_deref())),
        ) {
            if let Some(v) = value
                && !is_url_path(v)
            {
                return fail(format!("{what} {v:?} is not an image URL"));
            }
        }
        if !is_url_path(&self.network) {
            return fail(format!("network {:?} is not a name or URL", self.network));
        }
        if let Some(s) = &self.subnetwork
            && !is_url_path(s)
        {
            return fail(format!("subnetwork {s:?} is not a name or URL"));
        }
        if !(self.api_endpoint.starts_with("http://") || self.api_endpoint.starts_with("https://"))
        {
            return fail(format!(
                "api_endpoint {:?} is not an http(s) URL",
                self.api_endpoint
            ));
        }
        if self.credentials_file.trim().is_empty() {
            return fail("credentials_file is empty".into());
        }
        if !is_url_path(&self.boot_disk_type) || self.boot_disk_type.contains('/') {
            return fail(format!(
                "boot_disk_type {:?} is not a disk type name",
                self.boot_disk_type
            ));
        }
        if self.boot_disk_gb < 10 {
            return fail("boot_disk_gb must be at least 10".into());
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
        if !self.egress_per_gb_usd.is_finite() || self.egress_per_gb_usd < 0.0 {
            return fail("egress_per_gb_usd must be a non-negative number".into());
        }
        self.agent.validate().map_err(GcpConfigError)
    }
}

/// The region of a zone: `us-central1-a` → `us-central1`.
pub fn region_of(zone: &str) -> Option<&str> {
    let (region, suffix) = zone.rsplit_once('-')?;
    let ok = region.contains('-')
        && !suffix.is_empty()
        && suffix.bytes().all(|b| b.is_ascii_lowercase())
        && region
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    ok.then_some(region)
}

fn is_project_id(p: &str) -> bool {
    // Domain-scoped projects (`example.com:proj`) are allowed too.
    let id = p.rsplit_once(':').map_or(p, |(_, id)| id);
    (1..=63).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// A resource name or partial/full URL: no spaces, quotes, query strings or fragments.
fn is_url_path(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-:".contains(&b))
}

fn default_api_endpoint() -> String {
    "https://compute.googleapis.com".into()
}
fn default_network() -> String {
    "default".into()
}
fn default_boot_disk_gb() -> u32 {
    100
}
fn default_boot_disk_type() -> String {
    "pd-balanced".into()
}
fn default_true() -> bool {
    true
}
fn default_boot_time_s() -> u32 {
    150
}
fn default_node_limit() -> u32 {
    4
}
fn default_latency_ms() -> u32 {
    40
}
fn default_egress() -> f64 {
    0.12
}
fn default_request_timeout_s() -> u64 {
    30
}
fn default_operation_timeout_s() -> u64 {
    300
}

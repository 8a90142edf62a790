//! The EC2 provider's configuration: its serde shape (the `[aws]` table of the broker's TOML)
//! and its validation. This module reads no environment and calls no API; credentials come from
//! the AWS default chain unless static ones are given here (tests, moto).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

pub use crate::bootstrap::AgentInstall;
pub use crate::retry::RetrySettings;
use std::time::Duration;

/// How Switchyard launches and finds its EC2 instances.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AwsConfig {
    /// Value of the `switchyard:cluster` tag: `list` and the orphan reaper see only instances
    /// carrying it, so two brokers in one account never touch each other's instances.
    pub cluster: String,
    /// Region codes to offer and launch in, e.g. `["us-east-1", "us-west-2"]`.
    pub regions: Vec<String>,
    /// Instance types to offer; empty means every GPU type the bundled catalogue has there.
    #[serde(default)]
    pub instance_types: Vec<String>,
    /// EC2 endpoint for every region instead of AWS's own (moto, LocalStack, a proxy).
    #[serde(default)]
    pub endpoint_url: Option<String>,
    /// Static credentials (tests); without them the AWS default chain is used (env, profile,
    /// SSO, instance role…).
    #[serde(default)]
    pub credentials: Option<StaticCredentials>,
    pub image: ImageConfig,
    /// Per-region network and image settings, keyed by region code.
    #[serde(default)]
    pub per_region: BTreeMap<String, RegionSettings>,
    /// IAM instance profile: a name, or an ARN (starting with `arn:`).
    #[serde(default)]
    pub instance_profile: Option<String>,
    /// EC2 key pair for SSH; none by default.
    #[serde(default)]
    pub key_name: Option<String>,
    /// Require IMDSv2 session tokens on the instances. Leave off until the agent's
    /// interruption watcher fetches a token first (it reads the metadata service).
    #[serde(default)]
    pub require_imdsv2: bool,
    #[serde(default = "default_boot_time_s")]
    pub boot_time_s: u32,
    /// Node limit per pool (the broker's quota estimate; EC2's vCPU quota is enforced by EC2).
    #[serde(default = "default_node_limit")]
    pub node_limit: u32,
    #[serde(default = "default_latency_ms")]
    pub latency_ms: u32,
    #[serde(default = "default_egress")]
    pub egress_per_gb_usd: f64,
    /// Spot prices older than this are ignored and the catalogue's price is kept.
    #[serde(default = "default_spot_price_max_age_s")]
    pub spot_price_max_age_s: u64,
    /// Timeout of one API attempt.
    #[serde(default = "default_request_timeout_s")]
    pub request_timeout_s: u64,
    #[serde(default)]
    pub retry: RetrySettings,
    pub agent: AgentInstall,
}

/// Access keys for tests and emulators. The secret never appears in `Debug` output.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StaticCredentials {
    pub access_key_id: String,
    pub secret_access_key: String,
    #[serde(default)]
    pub session_token: Option<String>,
}

impl fmt::Debug for StaticCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StaticCredentials")
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"<redacted>")
            .finish()
    }
}

/// The machine image: a fixed AMI id, or the newest available image whose name matches a
/// filter (`DescribeImages`), owned by one of `owners`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageConfig {
    #[serde(default)]
    pub id: Option<String>,
    /// EC2 name filter, wildcards allowed, e.g. `switchyard-agent-ubuntu-24.04-*`.
    #[serde(default)]
    pub name_filter: Option<String>,
    /// Image owners for the name filter: account ids, `self`, `amazon`.
    #[serde(default = "default_owners")]
    pub owners: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegionSettings {
    /// AMI ids are regional: this one wins over `image` in its region.
    #[serde(default)]
    pub image_id: Option<String>,
    #[serde(default)]
    pub subnet_id: Option<String>,
    #[serde(default)]
    pub security_group_ids: Vec<String>,
}

/// A configuration that cannot work.
#[derive(Debug, thiserror::Error)]
#[error("aws config: {0}")]
pub struct AwsConfigError(pub String);

impl AwsConfig {
    pub fn spot_price_max_age(&self) -> Duration {
        Duration::from_secs(self.spot_price_max_age_s)
    }

    /// Settings of one region (defaults when it has none).
    pub fn region_settings(&self, region: &str) -> RegionSettings {
        self.per_region.get(region).cloned().unwrap_or_default()
    }

    /// Checks everything that can be checked without calling AWS.
    pub fn validate(&self) -> Result<(), AwsConfigError> {
        let fail = |m: String| Err(AwsConfigError(m));
        if self.cluster.trim().is_empty() {
            return fail("cluster is empty".into());
        }
        if self.regions.is_empty() {
            return fail("regions is empty".into());
        }
        if let Some(r) = self.per_region.keys().find(|r| !self.regions.contains(r)) {
            return fail(format!("per_region.{r} names a region not in regions"));
        }
        match (&self.image.id, &self.image.name_filter) {
            (Some(_), Some(_)) => return fail("image: give id or name_filter, not both".into()),
            (None, None) => {
                if let Some(r) = self
                    .regions
                    .iter()
                    .find(|r| self.region_settings(r).image_id.is_none())
                {
                    return fail(format!(
                        "image: give id or name_filter (region {r} has no per_region image_id)"
                    ));
                }
            }
            (None, Some(_)) if self.image.owners.is_empty() => {
                return fail("image.owners is empty".into());
            }
            _ => {}
        }
        if let Some(url) = &self.endpoint_url
            && !(url.starts_with("http://") || url.starts_with("https://"))
        {
            return fail(format!("endpoint_url {url:?} is not an http(s) URL"));
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
        self.agent.validate().map_err(AwsConfigError)
    }
}

fn default_boot_time_s() -> u32 {
    180
}
fn default_node_limit() -> u32 {
    4
}
fn default_latency_ms() -> u32 {
    40
}
fn default_egress() -> f64 {
    0.09
}
fn default_spot_price_max_age_s() -> u64 {
    7 * 24 * 3600
}
fn default_request_timeout_s() -> u64 {
    30
}
fn default_owners() -> Vec<String> {
    vec!["self".into()]
}

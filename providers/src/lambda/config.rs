//! The Lambda Cloud provider's configuration: the `[lambda]` table of the broker's TOML, and
//! its validation. Reading the API key file is the only I/O here.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

pub use crate::bootstrap::AgentInstall;
pub use crate::retry::RetrySettings;

/// The public API's base: the production server of Lambda's OpenAPI document (`servers[0]`,
/// the older `cloud.lambdalabs.com` is listed there as deprecated) and its `/api/v1` prefix.
pub const DEFAULT_API_ENDPOINT: &str = "https://cloud.lambda.ai/api/v1";

/// Lambda documents a limit of one launch request per 12 seconds (five a minute).
pub const DEFAULT_LAUNCH_MIN_INTERVAL_MS: u64 = 12_000;

/// The longest instance name Lambda accepts (`InstanceLaunchRequest.name.maxLength`).
pub const MAX_NAME_LEN: usize = 64;

/// The longest `cluster`: the name `sy-{cluster}-{key}` must leave room for the key.
pub const MAX_CLUSTER_LEN: usize = 16;

/// How Switchyard launches and finds its Lambda Cloud instances.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LambdaConfig {
    /// Scopes what `list` returns: instances are named `sy-{cluster}-{instance key}` (and
    /// tagged `switchyard:cluster`), and only this cluster's are listed, so two brokers on one
    /// account never touch each other's instances. Lower-case letters and digits, at most 16.
    pub cluster: String,
    /// File holding the API key (its first line; surrounding whitespace is ignored). The key is
    /// sent as `Authorization: Bearer <key>` and never logged.
    pub api_key_file: PathBuf,
    /// The API's base URL, `/api/v1` included. Default `https://cloud.lambda.ai/api/v1`.
    #[serde(default = "default_api_endpoint")]
    pub api_endpoint: String,
    /// Region codes to offer and launch in, e.g. `["us-east-1", "us-west-1"]`; each must be a
    /// Lambda region of the bundled catalogue.
    pub regions: Vec<String>,
    /// Instance types to offer (e.g. `gpu_1x_a10`); empty means every type the bundled
    /// catalogue has in the regions.
    #[serde(default)]
    pub instance_types: Vec<String>,
    /// The SSH key (by its name in the Lambda account) every instance gets: Lambda requires
    /// exactly one.
    pub ssh_key_name: String,
    /// Lambda filesystems to mount on every instance (they must be in the instance's region).
    #[serde(default)]
    pub file_system_names: Vec<String>,
    /// Least time between two launch requests, enforced here before each one is sent (Lambda
    /// allows one launch every 12 s). Default 12000.
    #[serde(default = "default_launch_min_interval_ms")]
    pub launch_min_interval_ms: u64,
    /// Expected seconds from launch to an enrolled agent (the pools' `boot_time_s`).
    #[serde(default = "default_boot_time_s")]
    pub boot_time_s: u32,
    /// Node limit per pool (the broker's estimate; Lambda enforces the account's quota).
    #[serde(default = "default_node_limit")]
    pub node_limit: u32,
    #[serde(default = "default_latency_ms")]
    pub latency_ms: u32,
    /// Price of one GB out of a Lambda region (Lambda charges no egress: default 0).
    #[serde(default)]
    pub egress_per_gb_usd: f64,
    /// Timeout of one API request (connect included).
    #[serde(default = "default_request_timeout_s")]
    pub request_timeout_s: u64,
    /// The longest a launch waits for its turn under the launch rate limit; a launch that
    /// would wait longer fails at once as throttled. Launch does not wait for the instance to
    /// leave `booting` (Lambda answers with the id at once; the agent's enrolment is the
    /// broker's signal), so this is the launch's only wait besides its requests.
    #[serde(default = "default_operation_timeout_s")]
    pub operation_timeout_s: u64,
    #[serde(default)]
    pub retry: RetrySettings,
    pub agent: AgentInstall,
}

/// A configuration that cannot work; the message names the field.
#[derive(Debug, thiserror::Error)]
#[error("lambda config: {0}")]
pub struct LambdaConfigError(pub String);

impl LambdaConfig {
    /// Checks what can be checked without calling Lambda (the key file is read by
    /// [`LambdaConfig::read_api_key`]; regions and types against the catalogue by the provider).
    pub fn validate(&self) -> Result<(), LambdaConfigError> {
        let fail = |m: String| Err(LambdaConfigError(m));
        if self.cluster.is_empty()
            || self.cluster.len() > MAX_CLUSTER_LEN
            || !self
                .cluster
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        {
            return fail(format!(
                "cluster {:?} must be 1 to {MAX_CLUSTER_LEN} lower-case letters or digits",
                self.cluster
            ));
        }
        if self.regions.is_empty() {
            return fail("regions is empty".into());
        }
        if let Some(r) = self.regions.iter().find(|r| r.trim().is_empty()) {
            return fail(format!("regions contains an empty name {r:?}"));
        }
        if self.ssh_key_name.trim().is_empty() {
            return fail("ssh_key_name is empty (Lambda requires exactly one SSH key)".into());
        }
        let url = &self.api_endpoint;
        if !(url.starts_with("https://") || url.starts_with("http://")) || url.len() < 9 {
            return fail(format!("api_endpoint {url:?} is not an http(s) URL"));
        }
        if self.launch_min_interval_ms > 3_600_000 {
            return fail("launch_min_interval_ms is more than an hour".into());
        }
        if self.request_timeout_s == 0 {
            return fail("request_timeout_s must be positive".into());
        }
        if self.retry.max_attempts == 0 {
            return fail("retry.max_attempts must be at least 1".into());
        }
        if self.retry.base_delay_ms > self.retry.max_delay_ms {
            return fail("retry.base_delay_ms exceeds retry.max_delay_ms".into());
        }
        if !self.egress_per_gb_usd.is_finite() || self.egress_per_gb_usd < 0.0 {
            return fail(format!(
                "egress_per_gb_usd {} is not a price",
                self.egress_per_gb_usd
            ));
        }
        self.agent
            .validate()
            .map_err(|e| LambdaConfigError(e.to_string()))
    }

    /// The API key: the key file's first line, trimmed. The error names the file, never its
    /// content.
    pub fn read_api_key(&self) -> Result<String, LambdaConfigError> {
        let path = self.api_key_file.display();
        let text = std::fs::read_to_string(&self.api_key_file)
            .map_err(|e| LambdaConfigError(format!("api_key_file {path}: {e}")))?;
        let key = text.lines().next().unwrap_or("").trim().to_string();
        if key.is_empty() {
            return Err(LambdaConfigError(format!("api_key_file {path} is empty")));
        }
        if !key.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(LambdaConfigError(format!(
                "api_key_file {path}: the key has characters an HTTP header cannot carry"
            )));
        }
        Ok(key)
    }

    /// `sy-{cluster}-`: the start of every instance name of this cluster.
    pub fn name_prefix(&self) -> String {
        format!("sy-{}-", self.cluster)
    }
}

fn default_api_endpoint() -> String {
    DEFAULT_API_ENDPOINT.into()
}
fn default_launch_min_interval_ms() -> u64 {
    DEFAULT_LAUNCH_MIN_INTERVAL_MS
}
fn default_boot_time_s() -> u32 {
    300
}
fn default_node_limit() -> u32 {
    4
}
fn default_latency_ms() -> u32 {
    40
}
fn default_request_timeout_s() -> u64 {
    30
}
fn default_operation_timeout_s() -> u64 {
    60
}

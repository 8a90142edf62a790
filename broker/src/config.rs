//! The broker's one typed configuration: defaults → TOML file → `SWITCHYARD_*` environment →
//! command-line flags, loaded and validated once in `main`. Nothing else reads the environment.

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Where the API, the agent protocol and the console listen.
    pub listen: SocketAddr,
    /// Set by `switchyard up` only (never from a file): every node in the database belongs to
    /// an earlier run whose agents are gone, so at start they are revoked and their work is
    /// requeued before the scheduler plans anything.
    #[serde(skip)]
    pub retire_nodes_at_start: bool,
    /// The URL agents and the CLI use to reach this broker; defaults to `http://{listen}`.
    pub public_url: Option<String>,
    /// Where the services gateway listens, in-process: a service's `endpoint` is
    /// `http://{gateway_listen}/svc/TEAM/NAME/`. `up` always runs one (on its API port + 1);
    /// `serve` runs one when this is set (e.g. `"0.0.0.0:8081"`). `SWITCHYARD_GATEWAY_LISTEN`.
    pub gateway_listen: Option<SocketAddr>,
    /// The region the in-process gateway serves (`provider:code`): it prefers replicas there,
    /// then in the regions nearest it by catalogue latency. `up`: its on-prem region.
    /// `SWITCHYARD_GATEWAY_REGION`.
    pub gateway_region: Option<String>,
    /// Holds the SQLite file and `admin.token`.
    pub data_dir: PathBuf,
    /// `sqlite://…` (defaults to `{data_dir}/switchyard.db`) or `postgres://…` (the
    /// `postgres` feature); `SWITCHYARD_DATABASE_URL`, `--database-url`.
    pub database_url: Option<String>,
    /// How often agents heartbeat.
    pub heartbeat_interval_s: u64,
    /// A node that has not heartbeated for this long is lost and its work requeued.
    pub lease_ttl_s: u64,
    /// Seconds between SIGTERM and SIGKILL when a job is stopped.
    pub grace_s: u64,
    /// How often the scheduler re-plans without being woken.
    pub scheduler_tick_ms: u64,
    /// Requests with larger bodies are refused.
    pub max_body_bytes: usize,
    /// Whether the planner may ask for new cloud nodes (pools also need a provider that can
    /// launch them).
    pub burst_enabled: bool,
    /// The on-prem reserve: an owned pool with less than one in this many of its GPUs free
    /// charges jobs that allow spot, in their score, what the jobs that cannot use spot would
    /// pay in the cloud for its last GPUs; 0 turns it off. Unset: 8
    /// (`switchyard_core::DEFAULT_RESERVE_FREE_BELOW_ONE_IN`; BENCHMARKS.md has the sweep).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reserve_free_below_one_in: Option<u32>,
    /// An instance idle this long is drained and terminated.
    pub idle_ttl_s: u64,
    /// An instance whose agent has not enrolled this long after launch is terminated.
    pub boot_timeout_s: u64,
    /// The provider bills at least this long per instance (EC2: 60 s); an idle instance is kept
    /// until then, since it is paid for anyway.
    pub min_billed_s: u64,
    /// After a capacity or quota error, the pool gets no new launches for this long.
    pub pool_backoff_s: u64,
    /// Launch attempts per instance on throttling or transient errors before giving up.
    pub launch_attempts: u32,
    /// How long one provider call (launch, terminate, list) may take before the burst
    /// controller counts it as a transient failure and moves on; a launch that timed out is
    /// retried under the same instance key, so it starts at most one machine.
    pub provider_call_timeout_ms: u64,
    /// How often the ledger accrues running attempts and live instances (spend to date).
    pub ledger_accrual_interval_ms: u64,
    /// This replica's name in the leader election; defaults to `{hostname}:{port}`. A replica
    /// restarting under the same name takes the leadership back at once (with a new fencing
    /// epoch) instead of waiting for its old lease to expire, so give every replica its own.
    pub replica_name: Option<String>,
    /// The leader's lease: a replica that has not renewed it for this long is deposed, and a
    /// follower takes over (with a new fencing epoch). Renewed every quarter of it.
    pub leader_ttl_ms: u64,
    /// Regions with capacity the broker does not launch (on-prem) or configures by hand.
    pub regions: Vec<RegionConfig>,
    pub pools: Vec<PoolConfig>,
    /// Cloud regions to offer from the bundled price catalogue, as `provider:code`.
    pub catalogue_regions: Vec<CatalogueRegion>,
    /// Burst to AWS EC2 (see `providers/src/aws/config.rs` for every field).
    #[cfg(feature = "aws")]
    pub aws: Option<switchyard_providers::aws::AwsConfig>,
    /// Burst to GCP Compute Engine (`providers/src/gcp/config.rs`).
    pub gcp: Option<switchyard_providers::gcp::GcpConfig>,
    /// Burst to Azure Virtual Machines (`providers/src/azure/config.rs`).
    pub azure: Option<switchyard_providers::azure::AzureConfig>,
    /// Burst to Lambda Cloud (`providers/src/lambda/config.rs`).
    pub lambda: Option<switchyard_providers::lambda::LambdaConfig>,
    // ---- Hostile input (`limits.rs`): body size and time, per-token request rate. ----
    /// Largest body of an agent-protocol request (`/agent/v1`): event batches carry up to
    /// 1 MiB of job output, more once JSON-escaped. Larger bodies are answered 413;
    /// `max_body_bytes` bounds every other request.
    pub agent_max_body_bytes: usize,
    /// A request body that has not fully arrived this long after the request's headers is
    /// answered 408 and its connection closed (slow or stalled clients). Requests without a
    /// body, such as the agents' work long-poll, are not affected.
    pub body_timeout_ms: u64,
    /// Requests per second one credential (bearer token or console session) may make,
    /// sustained; beyond it the broker answers 429 with `Retry-After`. 0 turns the limit off.
    pub rate_limit_per_s: u32,
    /// Requests one credential may make at once (the bucket's size); 0: `rate_limit_per_s`.
    pub rate_limit_burst: u32,
    // ---- Connections and TLS (`server.rs`, `tls.rs`). ----
    /// PEM certificate chain (the server's certificate first) to serve HTTPS with, together
    /// with `tls_key`; plain HTTP when neither is set. `SWITCHYARD_TLS_CERT`, `--tls-cert`.
    pub tls_cert: Option<PathBuf>,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1) of `tls_cert`. `SWITCHYARD_TLS_KEY`,
    /// `--tls-key`.
    pub tls_key: Option<PathBuf>,
    /// PEM CA certificate(s) the agents of instances this broker launches must trust, for a
    /// broker certificate signed by a private CA: the providers pass it to the instance (EC2:
    /// in its cloud-init, as the agent's `--ca-cert`). Unset: the agents use the system roots.
    pub agent_ca_cert: Option<PathBuf>,
    /// A connection must finish its TLS handshake and the headers of its first request within
    /// this time, and HTTP/1 every later request's headers too (the clock starts as soon as
    /// the connection waits for a request, so an idle HTTP/1 keep-alive connection is also
    /// closed after it). Else the connection is closed without an answer.
    pub header_timeout_ms: u64,
    /// A keep-alive connection with no request in flight for this long is closed gracefully
    /// (HTTP/2: GOAWAY). Long-polls in flight keep their connection.
    pub idle_timeout_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegionConfig {
    /// `provider:code`, e.g. `onprem:sh-dc1`.
    pub id: String,
    #[serde(default)]
    pub latitude: Option<f64>,
    #[serde(default)]
    pub longitude: Option<f64>,
    #[serde(default = "default_latency_ms")]
    pub latency_ms: u32,
    #[serde(default)]
    pub egress_per_gb_usd: f64,
    #[serde(default = "default_ingress_gbps")]
    pub ingress_gbps: u32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    /// `region/name`, e.g. `onprem:sh-dc1/dgx-h100`.
    pub id: String,
    pub region: String,
    pub gpu_model: String,
    pub gpus_per_node: u32,
    pub gpu_memory_gb: u32,
    #[serde(default)]
    pub vcpus: u32,
    #[serde(default)]
    pub memory_gb: u32,
    /// On-prem: the internal rate finance charges per GPU-hour.
    pub price_per_gpu_hour_usd: f64,
    /// An owned (not launchable) pool's marginal cost per GPU-hour: power and wear, what one
    /// more hour of use costs the company in cash, which the planner minimises. Absent: a fifth
    /// of the internal rate (`switchyard_core::DEFAULT_MARGINAL_SHARE`). `PATCH /pools/{id}`
    /// overrides it. Ignored for a launchable pool, whose cash cost is its price.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub marginal_usd_per_gpu_hour: Option<f64>,
    pub node_limit: u32,
    #[serde(default)]
    pub launchable: bool,
    #[serde(default)]
    pub boot_time_s: u32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CatalogueRegion {
    /// `provider:code` as in the bundled catalogue, e.g. `aws:us-east-1`.
    pub id: String,
    /// Instance types to offer; empty means every GPU type the catalogue has there.
    #[serde(default)]
    pub instance_types: Vec<String>,
    #[serde(default = "default_cloud_latency_ms")]
    pub latency_ms: u32,
    #[serde(default = "default_egress")]
    pub egress_per_gb_usd: f64,
    #[serde(default = "default_node_limit")]
    pub node_limit: u32,
    #[serde(default = "default_boot_time_s")]
    pub boot_time_s: u32,
}

/// The largest amount of USD a config may state (what [`switchyard_core::money::Money`] holds
/// with room to multiply).
const MAX_USD: f64 = 1.0e9;

/// `value` is a finite, non-negative amount of USD, else an error naming `what`.
fn non_negative_usd(what: &str, value: f64) -> anyhow::Result<()> {
    if !(value.is_finite() && (0.0..=MAX_USD).contains(&value)) {
        bail!("{what} must be a non-negative amount of USD, not {value}");
    }
    Ok(())
}

fn default_latency_ms() -> u32 {
    5
}
fn default_cloud_latency_ms() -> u32 {
    40
}
fn default_ingress_gbps() -> u32 {
    10
}
fn default_egress() -> f64 {
    0.09
}
fn default_node_limit() -> u32 {
    4
}
fn default_boot_time_s() -> u32 {
    180
}

impl Default for Config {
    fn default() -> Config {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            retire_nodes_at_start: false,
            public_url: None,
            gateway_listen: None,
            gateway_region: None,
            data_dir: PathBuf::from(".switchyard"),
            database_url: None,
            heartbeat_interval_s: 5,
            lease_ttl_s: 30,
            grace_s: 10,
            scheduler_tick_ms: 1000,
            max_body_bytes: 1024 * 1024,
            burst_enabled: false,
            reserve_free_below_one_in: None,
            idle_ttl_s: 300,
            boot_timeout_s: 600,
            min_billed_s: 60,
            pool_backoff_s: 300,
            launch_attempts: 5,
            provider_call_timeout_ms: 60_000,
            ledger_accrual_interval_ms: 60_000,
            replica_name: None,
            leader_ttl_ms: 5_000,
            regions: Vec::new(),
            pools: Vec::new(),
            catalogue_regions: Vec::new(),
            #[cfg(feature = "aws")]
            aws: None,
            gcp: None,
            azure: None,
            lambda: None,
            agent_max_body_bytes: 16 * 1024 * 1024,
            body_timeout_ms: 30_000,
            rate_limit_per_s: 1_000,
            rate_limit_burst: 2_000,
            tls_cert: None,
            tls_key: None,
            agent_ca_cert: None,
            header_timeout_ms: 10_000,
            idle_timeout_ms: 60_000,
        }
    }
}

impl Config {
    /// Reads a TOML file over the defaults.
    pub fn from_file(path: &Path) -> anyhow::Result<Config> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading config {}", path.display()))?;
        toml::from_str(&text).with_context(|| format!("parsing config {}", path.display()))
    }

    /// Applies `SWITCHYARD_*` variables from `vars` (the process environment in `main`): every
    /// single-value setting by its name upper-cased, e.g. `SWITCHYARD_IDLE_TIMEOUT_MS=30000`.
    /// Other `SWITCHYARD_*` variables (the CLI's `SWITCHYARD_TOKEN`, the agent's) are not
    /// settings of the broker and are left alone.
    pub fn apply_env(
        &mut self,
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> anyhow::Result<()> {
        for (key, value) in vars {
            if let Some(name) = key.strip_prefix("SWITCHYARD_") {
                self.apply_var(name, value)
                    .map_err(|e| anyhow::anyhow!("{key}: {e}"))?;
            }
        }
        Ok(())
    }

    /// Sets the setting `name` (upper case) from `value`; false when `name` is not a setting
    /// that one value sets (lists and tables live in the TOML file).
    fn apply_var(&mut self, name: &str, value: String) -> Result<bool, String> {
        fn set<T: std::str::FromStr>(slot: &mut T, value: &str) -> Result<(), String>
        where
            T::Err: std::fmt::Display,
        {
            *slot = value.parse().map_err(|e| format!("{value:?}: {e}"))?;
            Ok(())
        }
        match name {
            "LISTEN" => set(&mut self.listen, &value)?,
            "PUBLIC_URL" => self.public_url = Some(value),
            "GATEWAY_LISTEN" => {
                let mut addr = SocketAddr::from(([127, 0, 0, 1], 0));
                set(&mut addr, &value)?;
                self.gateway_listen = Some(addr);
            }
            "GATEWAY_REGION" => self.gateway_region = Some(value),
            "DATA_DIR" => self.data_dir = PathBuf::from(value),
            "DATABASE_URL" => self.database_url = Some(value),
            "HEARTBEAT_INTERVAL_S" => set(&mut self.heartbeat_interval_s, &value)?,
            "LEASE_TTL_S" => set(&mut self.lease_ttl_s, &value)?,
            "GRACE_S" => set(&mut self.grace_s, &value)?,
            "SCHEDULER_TICK_MS" => set(&mut self.scheduler_tick_ms, &value)?,
            "MAX_BODY_BYTES" => set(&mut self.max_body_bytes, &value)?,
            "BURST_ENABLED" => set(&mut self.burst_enabled, &value)?,
            "IDLE_TTL_S" => set(&mut self.idle_ttl_s, &value)?,
            "BOOT_TIMEOUT_S" => set(&mut self.boot_timeout_s, &value)?,
            "MIN_BILLED_S" => set(&mut self.min_billed_s, &value)?,
            "POOL_BACKOFF_S" => set(&mut self.pool_backoff_s, &value)?,
            "LAUNCH_ATTEMPTS" => set(&mut self.launch_attempts, &value)?,
            "PROVIDER_CALL_TIMEOUT_MS" => set(&mut self.provider_call_timeout_ms, &value)?,
            "LEDGER_ACCRUAL_INTERVAL_MS" => set(&mut self.ledger_accrual_interval_ms, &value)?,
            "REPLICA_NAME" => self.replica_name = Some(value),
            "LEADER_TTL_MS" => set(&mut self.leader_ttl_ms, &value)?,
            "AGENT_MAX_BODY_BYTES" => set(&mut self.agent_max_body_bytes, &value)?,
            "BODY_TIMEOUT_MS" => set(&mut self.body_timeout_ms, &value)?,
            "RATE_LIMIT_PER_S" => set(&mut self.rate_limit_per_s, &value)?,
            "RATE_LIMIT_BURST" => set(&mut self.rate_limit_burst, &value)?,
            "TLS_CERT" => self.tls_cert = Some(PathBuf::from(value)),
            "TLS_KEY" => self.tls_key = Some(PathBuf::from(value)),
            "AGENT_CA_CERT" => self.agent_ca_cert = Some(PathBuf::from(value)),
            "HEADER_TIMEOUT_MS" => set(&mut self.header_timeout_ms, &value)?,
            "IDLE_TIMEOUT_MS" => set(&mut self.idle_timeout_ms, &value)?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        if self.heartbeat_interval_s == 0 || self.lease_ttl_s <= self.heartbeat_interval_s {
            bail!(
                "lease_ttl_s ({}) must be longer than heartbeat_interval_s ({}) and both positive",
                self.lease_ttl_s,
                self.heartbeat_interval_s
            );
        }
        if self.leader_ttl_ms < 200 {
            bail!("leader_ttl_ms must be at least 200");
        }
        if self.max_body_bytes < 1024 {
            bail!("max_body_bytes must be at least 1024");
        }
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            bail!("tls_cert and tls_key go together: set both (HTTPS) or neither (HTTP)");
        }
        if self.provider_call_timeout_ms == 0 {
            bail!("provider_call_timeout_ms must be positive");
        }
        if self.header_timeout_ms == 0 || self.idle_timeout_ms == 0 {
            bail!("header_timeout_ms and idle_timeout_ms must be positive");
        }
        // On-prem and catalogue regions share one namespace of `provider:code` ids.
        let regions = (self.regions.iter())
            .map(|r| ("region", &r.id, r.egress_per_gb_usd))
            .chain(
                (self.catalogue_regions.iter())
                    .map(|c| ("catalogue region", &c.id, c.egress_per_gb_usd)),
            );
        let mut ids = std::collections::HashSet::new();
        for (what, id, egress) in regions {
            if !id.contains(':') {
                bail!("{what} {id:?} must be provider:code");
            }
            if !ids.insert(id.as_str()) {
                bail!("region {id} is configured twice");
            }
            non_negative_usd(&format!("{what} {id}: egress_per_gb_usd"), egress)?;
        }
        for r in &self.regions {
            if let Some(lat) = r.latitude
                && !(-90.0..=90.0).contains(&lat)
            {
                bail!("region {}: latitude {lat} is not within -90..=90", r.id);
            }
            if let Some(lon) = r.longitude
                && !(-180.0..=180.0).contains(&lon)
            {
                bail!("region {}: longitude {lon} is not within -180..=180", r.id);
            }
        }
        let mut pool_ids = std::collections::HashSet::new();
        for p in &self.pools {
            if !pool_ids.insert(p.id.as_str()) {
                bail!("pool {} is configured twice", p.id);
            }
            // The same rule as `PATCH /pools/{id}`: a price is a positive amount of USD.
            let price = p.price_per_gpu_hour_usd;
            if !(price.is_finite() && price > 0.0 && price <= MAX_USD) {
                bail!(
                    "pool {}: price_per_gpu_hour_usd must be a positive amount of USD, not {price}",
                    p.id
                );
            }
            if let Some(m) = p.marginal_usd_per_gpu_hour
                && !(m.is_finite() && (0.0..=MAX_USD).contains(&m))
            {
                bail!(
                    "pool {}: marginal_usd_per_gpu_hour must be 0 or a positive amount of USD, \
                     not {m}",
                    p.id
                );
            }
            if !self.regions.iter().any(|r| r.id == p.region) {
                bail!(
                    "pool {} names region {} which is not configured",
                    p.id,
                    p.region
                );
            }
            if p.gpus_per_node == 0 || p.gpus_per_node > switchyard_core::MAX_GPUS_PER_NODE {
                bail!(
                    "pool {}: gpus_per_node must be 1 to {}, not {}",
                    p.id,
                    switchyard_core::MAX_GPUS_PER_NODE,
                    p.gpus_per_node
                );
            }
        }
        Ok(())
    }

    /// The configured public URL, else `https://{listen}` with TLS and `http://{listen}`
    /// without.
    pub fn public_url(&self) -> String {
        self.public_url.clone().unwrap_or_else(|| {
            let scheme = if self.tls_cert.is_some() {
                "https"
            } else {
                "http"
            };
            format!("{scheme}://{}", self.listen)
        })
    }

    /// This replica's name in the leader election (see [`Config::replica_name`]).
    pub fn replica_name(&self) -> String {
        self.replica_name.clone().unwrap_or_else(|| {
            let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_string())
                .unwrap_or_default();
            let host = if host.is_empty() {
                "localhost".to_string()
            } else {
                host
            };
            format!("{host}:{}", self.listen.port())
        })
    }

    pub fn database_url(&self) -> String {
        self.database_url.clone().unwrap_or_else(|| {
            format!("sqlite://{}", self.data_dir.join("switchyard.db").display())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// Every setting that one value sets has its variable: each is set back to its default
    /// from the text of that default.
    #[test]
    fn every_single_value_setting_has_a_variable() {
        let defaults = Config::default();
        let value = toml::Value::try_from(&defaults).expect("the config serializes");
        let table = value.as_table().expect("a table");
        let mut cfg = defaults.clone();
        let mut covered = 0;
        for (key, value) in table {
            let text = match value {
                toml::Value::String(s) => s.clone(),
                toml::Value::Integer(i) => i.to_string(),
                toml::Value::Boolean(b) => b.to_string(),
                toml::Value::Float(f) => f.to_string(),
                // Lists and tables (regions, pools, the clouds) are the file's.
                _ => continue,
            };
            assert_eq!(
                cfg.apply_var(&key.to_ascii_uppercase(), text),
                Ok(true),
                "SWITCHYARD_{} sets nothing",
                key.to_ascii_uppercase()
            );
            covered += 1;
        }
        assert!(covered >= 20, "{covered}");
        assert_eq!(cfg, defaults);
    }

    #[test]
    fn variables_override_and_bad_values_name_the_variable() {
        let mut cfg = Config::default();
        cfg.apply_env(vars(&[
            ("SWITCHYARD_IDLE_TIMEOUT_MS", "1234"),
            ("SWITCHYARD_PROVIDER_CALL_TIMEOUT_MS", "5000"),
            ("SWITCHYARD_BURST_ENABLED", "false"),
            ("SWITCHYARD_REPLICA_NAME", "b1"),
            ("SWITCHYARD_TLS_CERT", "/etc/switchyard/cert.pem"),
            // Not broker settings: the CLI's and the agent's.
            ("SWITCHYARD_TOKEN", "secret"),
            ("SWITCHYARD_CA_CERT", "/tmp/ca.pem"),
            ("PATH", "/usr/bin"),
        ]))
        .expect("valid variables");
        assert_eq!(cfg.idle_timeout_ms, 1234);
        assert_eq!(cfg.provider_call_timeout_ms, 5000);
        assert!(!cfg.burst_enabled);
        assert_eq!(cfg.replica_name.as_deref(), Some("b1"));
        assert_eq!(
            cfg.tls_cert.as_deref(),
            Some(Path::new("/etc/switchyard/cert.pem"))
        );

        let before = cfg.clone();
        let err = cfg
            .apply_env(vars(&[("SWITCHYARD_IDLE_TIMEOUT_MS", "soon")]))
            .expect_err("not a number");
        assert!(
            err.to_string().contains("SWITCHYARD_IDLE_TIMEOUT_MS")
                && err.to_string().contains("soon"),
            "{err}"
        );
        assert_eq!(cfg, before, "a bad value changes nothing");
    }

    /// A config from the TOML a user writes: one on-prem region with a pool, one catalogue
    /// region.
    fn catalogue_config(extra_region: &str, pool: &str, cloud: &str) -> anyhow::Result<Config> {
        let text = format!(
            r#"
[[regions]]
id = "onprem:dc1"
{extra_region}

[[pools]]
id = "onprem:dc1/dgx"
region = "onprem:dc1"
gpu_model = "H100"
gpus_per_node = 8
gpu_memory_gb = 80
node_limit = 2
{pool}

[[catalogue_regions]]
id = "aws:us-east-1"
{cloud}
"#
        );
        let cfg: Config = toml::from_str(&text)?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Prices, egress rates and coordinates a planner would misprice with are refused at
    /// start, naming the setting; the same file with sane values loads.
    #[test]
    fn prices_egress_and_coordinates_out_of_range_are_refused() {
        let ok = catalogue_config(
            "egress_per_gb_usd = 0.0\nlatitude = 31.2\nlongitude = 121.5",
            "price_per_gpu_hour_usd = 1.5",
            "egress_per_gb_usd = 0.09",
        )
        .expect("a sane config loads");
        assert_eq!(ok.pools[0].price_per_gpu_hour_usd, 1.5);
        let with_marginal = catalogue_config(
            "",
            "price_per_gpu_hour_usd = 1.5\nmarginal_usd_per_gpu_hour = 0.2",
            "",
        )
        .expect("a marginal cost loads");
        assert_eq!(with_marginal.pools[0].marginal_usd_per_gpu_hour, Some(0.2));

        let refused = [
            (
                "egress_per_gb_usd = -0.05",
                "price_per_gpu_hour_usd = 1.5",
                "",
                "region onprem:dc1: egress_per_gb_usd",
            ),
            (
                "",
                "price_per_gpu_hour_usd = 1.5",
                "egress_per_gb_usd = -0.01",
                "catalogue region aws:us-east-1: egress_per_gb_usd",
            ),
            (
                "egress_per_gb_usd = inf",
                "price_per_gpu_hour_usd = 1.5",
                "",
                "egress_per_gb_usd must be a non-negative amount",
            ),
            (
                "",
                "price_per_gpu_hour_usd = -2.0",
                "",
                "pool onprem:dc1/dgx: price_per_gpu_hour_usd",
            ),
            (
                "",
                "price_per_gpu_hour_usd = 1.5\nmarginal_usd_per_gpu_hour = -0.1",
                "",
                "pool onprem:dc1/dgx: marginal_usd_per_gpu_hour must be 0 or",
            ),
            (
                "",
                "price_per_gpu_hour_usd = 0.0",
                "",
                "price_per_gpu_hour_usd must be a positive amount",
            ),
            (
                "",
                "price_per_gpu_hour_usd = nan",
                "",
                "price_per_gpu_hour_usd must be a positive amount",
            ),
            (
                "latitude = 91.0",
                "price_per_gpu_hour_usd = 1.5",
                "",
                "latitude 91 is not within",
            ),
            (
                "longitude = -181.0",
                "price_per_gpu_hour_usd = 1.5",
                "",
                "longitude -181 is not within",
            ),
        ];
        for (region, pool, cloud, message) in refused {
            let err = catalogue_config(region, pool, cloud).expect_err(message);
            assert!(err.to_string().contains(message), "{message}: {err}");
        }
    }

    #[test]
    fn a_region_or_pool_configured_twice_is_refused() {
        let mut cfg = catalogue_config("", "price_per_gpu_hour_usd = 1.5", "").expect("loads");
        cfg.pools.push(cfg.pools[0].clone());
        let err = cfg.validate().expect_err("pool twice");
        assert!(
            err.to_string()
                .contains("pool onprem:dc1/dgx is configured twice"),
            "{err}"
        );
        cfg.pools.pop();
        cfg.catalogue_regions[0].id = "onprem:dc1".into();
        let err = cfg.validate().expect_err("region twice");
        assert!(
            err.to_string()
                .contains("region onprem:dc1 is configured twice"),
            "{err}"
        );
    }
}

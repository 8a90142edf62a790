//! Start-up: [`App::start`] opens the store, seeds the catalogue, makes sure an admin token
//! exists, builds the shared state (`state.rs`) and starts the loops that take it. The top of
//! the broker: only `up.rs`, `main.rs` and tests import this.

use anyhow::Context;
use std::sync::Arc;
use switchyard_core::{Money, Pool, PoolId, Region, RegionId, Timestamp};
use switchyard_protocol::api::Role;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::clock::Clock;
use crate::config::Config;
use crate::control::bus::Bus;
use crate::control::leader::Leadership;
use crate::control::scheduler;
use crate::http::auth::{API_TOKEN_PREFIX, hash_token, new_token};
pub use crate::state::{AgentWakers, App, AppInner, ProviderSet};
use crate::store::{ApiTokenRecord, Store};

/// What [`App::start`] leaves running.
pub struct Running {
    pub app: App,
    pub scheduler: JoinHandle<()>,
    pub burst: JoinHandle<()>,
    /// The ledger's accrual loop.
    pub ledger: JoinHandle<()>,
    /// The services reconciler.
    pub services: JoinHandle<()>,
    /// The leader election.
    pub election: JoinHandle<()>,
    /// Writes buffered heartbeats.
    pub heartbeat_writer: JoinHandle<()>,
    /// The admin token, when this start created it (first start).
    pub created_admin_token: Option<String>,
}

impl Running {
    /// Stops the background loops and gives the leader lease up, so that another replica
    /// (or this one's next start) leads at once.
    pub async fn stop(&self) {
        self.election.abort();
        self.scheduler.abort();
        self.burst.abort();
        self.ledger.abort();
        self.services.abort();
        self.heartbeat_writer.abort();
        // The one writer of heartbeats (heartbeats.rs) is gone before the last write here.
        for _ in 0..100 {
            if self.heartbeat_writer.is_finished() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        if let Err(e) = self.app.heartbeats.flush(self.app.store.as_ref()).await {
            tracing::warn!(error = %e, "writing the last heartbeats failed");
        }
        self.app.leadership.resign(self.app.store.as_ref()).await;
    }
}

impl App {
    /// Starts the broker on the system clock.
    pub async fn start(config: Config, providers: ProviderSet) -> anyhow::Result<Running> {
        App::start_with_clock(config, providers, Clock::system()).await
    }

    /// Starts the broker reading the time from `clock` (tests: a manual one).
    pub async fn start_with_clock(
        config: Config,
        providers: ProviderSet,
        clock: Clock,
    ) -> anyhow::Result<Running> {
        std::fs::create_dir_all(&config.data_dir)
            .with_context(|| format!("creating data dir {}", config.data_dir.display()))?;
        let url = config.database_url();
        let leadership = Leadership::new(config.replica_name());
        let origin = uuid::Uuid::now_v7().simple().to_string();
        let known = ["sqlite:", "postgres://", "postgresql://"];
        if !known.iter().any(|scheme| url.starts_with(scheme)) {
            anyhow::bail!(
                "unsupported database URL {:?} (sqlite://… or postgres://…)",
                redact_url(&url)
            );
        }
        let store = Store::open_url(&url)
            .await
            .with_context(|| format!("opening {}", redact_url(&url)))?;
        // Several replicas on one PostgreSQL database tell each other through it.
        let notify_pool = store.pg_pool().cloned();
        let bus = match &notify_pool {
            Some(pool) => crate::control::bus::start(pool.clone(), origin),
            None => Bus::default(),
        };
        let store = Arc::new(store);
        seed_catalogue(store.as_ref(), &config, clock.now()).await?;
        for offers in &providers.offers {
            for region in &offers.regions {
                store.upsert_region(region).await?;
            }
            for pool in &offers.pools {
                store.upsert_pool(pool).await?;
            }
        }
        let created_admin_token = ensure_admin_token(store.as_ref(), &config, clock.now()).await?;
        if config.retire_nodes_at_start {
            retire_previous_run(store.as_ref(), clock.now()).await?;
        }
        let agents = AgentWakers::new(bus.clone());
        let (handle, worker) = scheduler::channel(bus);
        let app = App(Arc::new(AppInner {
            config,
            clock,
            store,
            scheduler: handle,
            agents,
            providers,
            burst: Arc::new(Notify::new()),
            services: Arc::new(Notify::new()),
            traffic: Default::default(),
            spread: Default::default(),
            metrics: crate::http::metrics::Metrics::default(),
            leadership,
            heartbeats: Default::default(),
            telemetry: Default::default(),
        }));
        let election = tokio::spawn(crate::control::leader::run(app.clone()));
        spawn_listener(&app, notify_pool);
        let scheduler = tokio::spawn(worker.run(app.clone()));
        let burst = tokio::spawn(crate::control::burst::run(app.clone()));
        let ledger = tokio::spawn(crate::control::ledger::run(app.clone()));
        let services = tokio::spawn(crate::control::services::run(app.clone()));
        let heartbeat_writer = tokio::spawn(crate::control::heartbeats::run(app.clone()));
        // The waste rule (issue 28): leader only, like the ledger; stops with the process.
        tokio::spawn(crate::control::waste::run(app.clone()));
        // Every broker reads the gateways' reports (its views; the leader's autoscaler).
        tokio::spawn(crate::gateway::traffic::load(app.clone()));
        Ok(Running {
            app,
            scheduler,
            burst,
            ledger,
            services,
            election,
            heartbeat_writer,
            created_admin_token,
        })
    }
}

/// `switchyard up` starts its own agents at every start; the nodes in the database are those of
/// an earlier run, whose agents exited with it (or were killed with it). They are revoked — an
/// agent of theirs that somehow still runs can no longer report — and their live attempts end
/// `lost` with their jobs back in the queue, before the scheduler's first round.
async fn retire_previous_run(store: &Store, now: Timestamp) -> anyhow::Result<()> {
    let why = "its node belonged to an earlier run of `switchyard up`";
    for node in store.nodes().await? {
        if let Some(requeued) = store.revoke_node(&node.id, why, now).await? {
            tracing::info!(node.id = %node.id, jobs.requeued = requeued.len(),
                "retired a node of the previous run");
        }
    }
    Ok(())
}

fn spawn_listener(app: &App, pool: Option<sqlx::PgPool>) {
    if let Some(pool) = pool {
        tokio::spawn(crate::control::bus::listen(app.clone(), pool));
    }
}

/// A database URL with its password (if any) replaced, for messages and logs.
fn redact_url(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => match rest.rsplit_once('@') {
            Some((userinfo, host)) => {
                let user = userinfo.split(':').next().unwrap_or("");
                if userinfo.contains(':') {
                    format!("{scheme}://{user}:***@{host}")
                } else {
                    url.to_string()
                }
            }
            None => url.to_string(),
        },
        None => url.to_string(),
    }
}

/// Writes the configured regions and pools and the chosen catalogue regions to the store.
async fn seed_catalogue(store: &Store, config: &Config, now: Timestamp) -> anyhow::Result<()> {
    for (region, pools) in catalogue_from_config(config, now)? {
        store.upsert_region(&region).await?;
        for pool in pools {
            store.upsert_pool(&pool).await?;
        }
    }
    Ok(())
}

/// The regions and pools a config describes: its own (on-prem) ones, then the chosen regions
/// of the bundled cloud price catalogue.
pub fn catalogue_from_config(
    config: &Config,
    now: Timestamp,
) -> anyhow::Result<Vec<(Region, Vec<Pool>)>> {
    let mut out = Vec::new();
    for r in &config.regions {
        let (provider, code) =
            r.id.split_once(':')
                .with_context(|| format!("region id {:?} must be provider:code", r.id))?;
        let region = Region {
            id: RegionId(r.id.clone()),
            provider: provider.to_string(),
            code: code.to_string(),
            latitude: r.latitude,
            longitude: r.longitude,
            egress_per_gb: Money::from_dollars(r.egress_per_gb_usd)
                .context("egress_per_gb_usd out of range")?,
            latency_ms: r.latency_ms,
            ingress_gbps: r.ingress_gbps,
        };
        let pools = config
            .pools
            .iter()
            .filter(|p| p.region == r.id)
            .map(|p| {
                let per_gpu = Money::from_dollars(p.price_per_gpu_hour_usd)
                    .with_context(|| format!("pool {}: price out of range", p.id))?;
                let marginal = p
                    .marginal_usd_per_gpu_hour
                    .map(|m| {
                        Money::from_dollars(m)
                            .map(|m| m.saturating_mul(i64::from(p.gpus_per_node)))
                            .with_context(|| {
                                format!("pool {}: marginal_usd_per_gpu_hour out of range", p.id)
                            })
                    })
                    .transpose()?;
                if let Some(m) = p.marginal_usd_per_gpu_hour
                    && m > p.price_per_gpu_hour_usd
                {
                    // Allowed (finance's call) but likely a mistake: the planner then avoids
                    // the pool's own GPUs even where its teams are billed less.
                    tracing::warn!(
                        pool = %p.id,
                        "marginal_usd_per_gpu_hour {m} exceeds the internal rate {}",
                        p.price_per_gpu_hour_usd
                    );
                }
                Ok(Pool {
                    id: PoolId(p.id.clone()),
                    region: region.id.clone(),
                    provider: provider.to_string(),
                    instance_type: p.id.rsplit('/').next().unwrap_or(&p.id).to_string(),
                    gpu_model: switchyard_core::gpu_model::normalize(
                        &p.gpu_model,
                        Some(p.gpu_memory_gb),
                    ),
                    gpus_per_node: p.gpus_per_node,
                    gpu_memory_gb: p.gpu_memory_gb,
                    vcpus: p.vcpus,
                    memory_gb: p.memory_gb,
                    on_demand_per_hour: per_gpu.saturating_mul(i64::from(p.gpus_per_node)),
                    spot_per_hour: None,
                    node_limit: p.node_limit,
                    launchable: p.launchable,
                    boot_time_s: p.boot_time_s,
                    price_updated_at: now,
                    recent_capacity_failures: 0,
                    marginal_per_hour: marginal,
                })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        out.push((region, pools));
    }
    if !config.catalogue_regions.is_empty() {
        let catalogue = switchyard_providers::Catalogue::bundled()
            .context("reading the bundled price catalogue")?;
        for c in &config.catalogue_regions {
            let (provider, code) = c
                .id
                .split_once(':')
                .with_context(|| format!("catalogue region {:?} must be provider:code", c.id))?;
            let region = Region {
                id: RegionId(c.id.clone()),
                provider: provider.to_string(),
                code: code.to_string(),
                latitude: None,
                longitude: None,
                egress_per_gb: Money::from_dollars(c.egress_per_gb_usd)
                    .context("egress_per_gb_usd out of range")?,
                latency_ms: c.latency_ms,
                ingress_gbps: default_ingress(),
            };
            let pools: Vec<Pool> = catalogue
                .entries()
                .iter()
                .filter(|e| e.provider == provider && e.region == code)
                .filter(|e| {
                    c.instance_types.is_empty() || c.instance_types.contains(&e.instance_type)
                })
                .map(|e| {
                    switchyard_providers::catalogue::pool_from_entry(
                        e,
                        c.boot_time_s,
                        c.node_limit,
                        now,
                    )
                })
                .collect();
            if pools.is_empty() {
                anyhow::bail!("the bundled catalogue has no GPU instances for {}", c.id);
            }
            out.push((region, pools));
        }
    }
    Ok(out)
}

fn default_ingress() -> u32 {
    10
}

/// Creates the admin token on first start and writes it to `{data_dir}/admin.token` (0600).
/// Later starts keep the token that file holds, as long as the database knows it.
async fn ensure_admin_token(
    store: &Store,
    config: &Config,
    now: Timestamp,
) -> anyhow::Result<Option<String>> {
    let path = config.data_dir.join("admin.token");
    if let Ok(existing) = std::fs::read_to_string(&path) {
        let existing = existing.trim();
        if let Some(rec) = store.api_token_by_hash(&hash_token(existing)).await?
            && rec.role == Role::Admin
            && !rec.revoked
        {
            return Ok(None);
        }
    }
    let token = new_token(API_TOKEN_PREFIX);
    store
        .insert_api_token(&ApiTokenRecord {
            id: uuid::Uuid::now_v7(),
            token_hash: hash_token(&token),
            role: Role::Admin,
            team: None,
            name: Some("bootstrap admin".into()),
            created_at: now,
            revoked: false,
        })
        .await?;
    write_secret(&path, &token)?;
    Ok(Some(token))
}

fn write_secret(path: &std::path::Path, secret: &str) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    writeln!(f, "{secret}")?;
    Ok(())
}

//! `switchyard up`: the whole federation on this machine — the broker with SQLite in the data
//! directory, an on-prem region with two local agents of four simulated H100s each, and cloud
//! regions priced from the bundled catalogue. Ctrl-C stops everything it started, agents
//! included: planning stops, the agents drain (their running jobs get the checkpoint signal
//! and go back to the queue), then the broker. The agents also exit when `up` dies without a
//! word (kill -9): they watch the pipe `up` holds open on their stdin. A restart retires the
//! nodes of the previous run (`Config::retire_nodes_at_start`) and requeues their work.

use anyhow::Context;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use switchyard_core::PoolId;
use switchyard_providers::local::{LocalConfig, LocalProvider};
use tokio::net::TcpListener;

use crate::app::{App, ProviderSet, catalogue_from_config};
use crate::clock::Clock;
use crate::config::{CatalogueRegion, Config, PoolConfig, RegionConfig};
use crate::http::api::tokens::issue_enrolment_token;
use crate::http::server;

pub const ONPREM_POOL: &str = "onprem:local-dc1/sim-h100x4";

#[derive(Clone, Debug)]
pub struct UpOptions {
    pub port: u16,
    /// The services gateway's port; `None`: `port + 1`.
    pub gateway_port: Option<u16>,
    pub data_dir: PathBuf,
    pub agents: u32,
    pub boot_delay: Duration,
    pub idle_ttl: Duration,
    pub billing_minimum: Duration,
    /// `None`: SQLite in the data directory.
    pub database_url: Option<String>,
    /// Faults injected into the on-prem agents' simulated GPUs.
    pub fake_gpu_faults: Vec<UpFault>,
}

/// One `--fake-gpu-fault AGENT/INDEX:KIND@DELAY` of `up`: the on-prem agent `onprem-AGENT`
/// (from 1) gets `--fake-gpu-fault INDEX:KIND@DELAY`. The spec itself is checked by the
/// caller (with the agent's parser); `up` checks that the agent and the GPU exist.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UpFault {
    pub agent: u32,
    pub gpu: u32,
    /// `INDEX:KIND@DELAY`, as the agent takes it.
    pub spec: String,
}

/// The on-prem agents' extra arguments for `faults`, by agent name; a fault on an agent or a
/// GPU that `up` does not start is refused, naming the flag.
pub fn fault_args(
    faults: &[UpFault],
    agents: u32,
    gpus_per_agent: u32,
) -> anyhow::Result<BTreeMap<String, Vec<String>>> {
    let mut args: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for f in faults {
        if f.agent == 0 || f.agent > agents {
            anyhow::bail!(
                "--fake-gpu-fault {}/{}: there is no on-prem agent {} (up starts {agents}, \
                 numbered from 1; see --agents)",
                f.agent,
                f.spec,
                f.agent
            );
        }
        if f.gpu >= gpus_per_agent {
            anyhow::bail!(
                "--fake-gpu-fault {}/{}: GPU {} does not exist (each on-prem agent has \
                 {gpus_per_agent} GPUs, indexes 0 to {})",
                f.agent,
                f.spec,
                f.gpu,
                gpus_per_agent.saturating_sub(1)
            );
        }
        args.entry(onprem_agent_name(f.agent))
            .or_default()
            .extend(["--fake-gpu-fault".to_string(), f.spec.clone()]);
    }
    Ok(args)
}

/// The name of on-prem agent `i` (from 1).
pub fn onprem_agent_name(i: u32) -> String {
    format!("onprem-{i}")
}

/// The configuration `up` runs with: one on-prem region and three priced cloud regions.
pub fn up_config(opts: &UpOptions) -> Config {
    let cloud = |id: &str, types: &[&str], latency_ms: u32| CatalogueRegion {
        id: id.to_string(),
        instance_types: types.iter().map(|t| t.to_string()).collect(),
        latency_ms,
        egress_per_gb_usd: 0.09,
        node_limit: 4,
        boot_time_s: 180,
    };
    Config {
        listen: std::net::SocketAddr::from(([127, 0, 0, 1], opts.port)),
        // The services gateway on the next port (8081 next to the default 8080).
        gateway_listen: Some(std::net::SocketAddr::from((
            [127, 0, 0, 1],
            opts.gateway_port.unwrap_or(opts.port.saturating_add(1)),
        ))),
        // The gateway is where callers on this machine are: the on-prem region.
        gateway_region: Some("onprem:local-dc1".into()),
        retire_nodes_at_start: true,
        data_dir: opts.data_dir.clone(),
        database_url: opts.database_url.clone(),
        burst_enabled: true,
        idle_ttl_s: opts.idle_ttl.as_secs(),
        min_billed_s: opts.billing_minimum.as_secs(),
        // Local "instances" boot in `boot_delay`; give them ample room before calling it a
        // failure.
        boot_timeout_s: opts.boot_delay.as_secs() + 60,
        // A first look at the console shows running work's spend within seconds.
        ledger_accrual_interval_ms: 10_000,
        regions: vec![RegionConfig {
            id: "onprem:local-dc1".into(),
            latitude: None,
            longitude: None,
            latency_ms: 2,
            egress_per_gb_usd: 0.0,
            ingress_gbps: 100,
        }],
        pools: vec![PoolConfig {
            id: ONPREM_POOL.into(),
            region: "onprem:local-dc1".into(),
            gpu_model: "H100".into(),
            gpus_per_node: 4,
            gpu_memory_gb: 80,
            vcpus: 64,
            memory_gb: 512,
            price_per_gpu_hour_usd: 1.50,
            // Power and wear: 4 × 700 W with host and cooling at PUE 1.5 is about 1 kW per
            // GPU, $0.10 an hour, plus wear. A figure finance would state (`pool set
            // --marginal-per-gpu-hour`), here so that the tour shows one.
            marginal_usd_per_gpu_hour: Some(0.15),
            node_limit: opts.agents,
            launchable: false,
            boot_time_s: 0,
        }],
        // Datacenter GPUs only, so that on-prem H100s at the internal rate are the cheapest
        // home for ordinary work and the cloud is where deadlines send it.
        catalogue_regions: vec![
            cloud("aws:us-east-1", &["p5.48xlarge", "p4d.24xlarge"], 12),
            cloud("gcp:us-central1", &["a3-highgpu-8g", "a2-ultragpu-1g"], 25),
            cloud(
                "lambda:us-east-1",
                &["gpu_1x_h100_pcie", "gpu_1x_a100_sxm4", "gpu_8x_h100_sxm5"],
                18,
            ),
        ],
        ..Config::default()
    }
}

pub async fn run(opts: UpOptions) -> anyhow::Result<()> {
    let config = up_config(&opts);
    config.validate()?;
    let gpus_per_agent = config.pools.first().map_or(0, |p| p.gpus_per_node);
    let extra_agent_args = fault_args(&opts.fake_gpu_faults, opts.agents, gpus_per_agent)?;
    let listener = TcpListener::bind(config.listen).await.with_context(|| {
        format!(
            "binding {} (is another broker running? try --port)",
            config.listen
        )
    })?;
    let gateway_listen = config
        .gateway_listen
        .context("up runs a services gateway: gateway_listen is set")?;
    let gateway_listener = TcpListener::bind(gateway_listen).await.with_context(|| {
        format!(
            "binding the services gateway on {gateway_listen} (is another broker running? try --port)"
        )
    })?;
    let url = config.public_url();
    let agent_program = std::env::current_exe().context("locating the switchyard binary")?;
    let log_dir = opts.data_dir.join("agents");
    std::fs::create_dir_all(&log_dir)?;
    let offers = catalogue_from_config(&config, Clock::system().now())?;
    let launchable: Vec<PoolId> = offers
        .iter()
        .flat_map(|(_, pools)| pools.iter().filter(|p| p.launchable).map(|p| p.id.clone()))
        .collect();
    let provider = Arc::new(LocalProvider::new(LocalConfig {
        agent_program,
        agent_args: vec!["agent".into()],
        boot_delay: opts.boot_delay,
        log_dir: log_dir.clone(),
        regions: offers.iter().map(|(r, _)| r.clone()).collect(),
        pools: offers.into_iter().flat_map(|(_, p)| p).collect(),
        extra_agent_args,
    }));
    let mut providers = ProviderSet::default();
    providers.add(provider.clone(), launchable);
    let running = App::start(config.clone(), providers).await?;
    let app = running.app.clone();

    let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);
    let mut rx = shutdown_rx.clone();
    let mut server = tokio::spawn(server::serve(app.clone(), listener, async move {
        let _ = rx.wait_for(|stop| *stop).await;
    }));
    let mut rx = shutdown_rx.clone();
    let gateway = tokio::spawn(crate::gateway::serve(
        app.clone(),
        gateway_listener,
        async move {
            let _ = rx.wait_for(|stop| *stop).await;
        },
    ));

    let pool = PoolId(ONPREM_POOL.into());
    for i in 1..=opts.agents {
        let name = onprem_agent_name(i);
        let (token, record) = issue_enrolment_token(&pool, None, 900, app.clock.now());
        app.store.insert_enrolment_token(&record).await?;
        let audit = crate::http::api::audit::system_enrolment("system:up", &pool, &name, &record);
        app.store.append_audit(&audit).await?;
        provider
            .spawn_static_agent(&name, &pool, &token, &url)
            .await
            .with_context(|| format!("starting local agent {name}"))?;
    }

    let token_path = opts.data_dir.join("admin.token");
    println!("Switchyard is up: {url}");
    println!("  console      {url}/");
    println!("  OpenAPI      {url}/openapi.json");
    println!("  gateway      http://{gateway_listen}/svc/TEAM/NAME/ (services)");
    println!(
        "  admin token  {} (written at first start)",
        token_path.display()
    );
    println!(
        "  agents       {} local agents with 4 simulated H100 each, logs in {}",
        opts.agents,
        log_dir.display()
    );
    for f in &opts.fake_gpu_faults {
        println!(
            "  fault        {} GPU {}",
            onprem_agent_name(f.agent),
            f.spec
        );
    }
    println!();
    println!("Try:");
    println!("  export SWITCHYARD_TOKEN=$(cat {})", token_path.display());
    println!("  curl -s -H \"Authorization: Bearer $SWITCHYARD_TOKEN\" {url}/api/v1/pools");
    println!("Ctrl-C stops the broker and its agents.");

    let stopped_by_itself = tokio::select! {
        _ = server::shutdown_signal() => None,
        res = &mut server => Some(res),
    };
    println!("Stopping agents and the broker…");
    // Planning stops first, so that no job is handed to an agent that is about to stop; the
    // API stays up while the agents drain: each running job gets its checkpoint signal, and
    // their reports put the jobs back in the queue (attempt `preempted`) for the next start.
    running.stop().await;
    provider.shutdown().await;
    if let Some(res) = stopped_by_itself {
        res.context("server task")??;
        anyhow::bail!("the server stopped unexpectedly");
    }
    let _ = shutdown_tx.send(true);
    match tokio::time::timeout(Duration::from_secs(10), server).await {
        Ok(res) => res.context("server task")??,
        Err(_) => tracing::warn!("server did not stop within 10 s"),
    }
    match tokio::time::timeout(Duration::from_secs(10), gateway).await {
        Ok(res) => res.context("gateway task")??,
        Err(_) => tracing::warn!("the gateway did not stop within 10 s"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fault(agent: u32, gpu: u32) -> UpFault {
        UpFault {
            agent,
            gpu,
            spec: format!("{gpu}:xid=79@30s"),
        }
    }

    #[test]
    fn faults_go_to_the_agent_they_name() {
        let args =
            fault_args(&[fault(2, 3), fault(2, 0), fault(1, 1)], 2, 4).expect("valid faults");
        assert_eq!(
            args.get("onprem-2").map(Vec::as_slice),
            Some(
                [
                    "--fake-gpu-fault",
                    "3:xid=79@30s",
                    "--fake-gpu-fault",
                    "0:xid=79@30s"
                ]
                .map(String::from)
                .as_slice()
            )
        );
        assert_eq!(args.len(), 2);
    }

    #[test]
    fn a_fault_on_a_missing_agent_or_gpu_is_refused_naming_the_flag() {
        for (f, want) in [
            (fault(3, 0), "there is no on-prem agent 3"),
            (fault(0, 0), "there is no on-prem agent 0"),
            (fault(1, 4), "GPU 4 does not exist"),
        ] {
            let err = fault_args(&[f], 2, 4).expect_err("refused").to_string();
            assert!(err.contains("--fake-gpu-fault"), "{err}");
            assert!(err.contains(want), "{err}");
        }
    }
}

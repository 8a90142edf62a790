//! The Switchyard edge agent: enrols this machine with a broker, heartbeats its inventory, runs
//! the attempts the broker leases to it as process groups, and reports their output and end.
//!
//! Embedding: the broker mounts [`AgentArgs`] as its `switchyard agent` subcommand and calls
//! [`run`]. Neither installs a rustls crypto provider: reqwest (feature `rustls`) uses the
//! process default when one is installed and otherwise builds its own aws-lc-rs provider, so
//! it works alone and alongside a `main` that installs one.
//!
//! Code map: `args` (flags), `inventory` (GPU probes: `fakegpu` simulated, `nvml`, `amdsmi`), `identity` (enrolment, saved state),
//! `client` (HTTP), `brokers` (the broker replicas, failover between them), `agent`
//! (heartbeat, work, shutdown), `attempts` (what runs), `runner` and `group` (processes),
//! `isolation` (each job's uid, directory and clean environment), `logs` (output → chunks),
//! `outbox` (ordered delivery), `backoff`, `interruption` (the cloud's spot interruption
//! notice), `serving` (service replicas: their `$PORT`, readiness probes and reports).
//! The agent never touches the database and depends only on `protocol` and `core`.

pub mod agent;
pub mod amdsmi;
pub mod args;
pub mod attempts;
pub mod backoff;
pub mod brokers;
pub mod client;
pub mod error;
pub mod fakegpu;
pub mod fence;
pub mod group;
pub mod identity;
pub mod interruption;
pub mod inventory;
pub mod isolation;
pub mod logs;
pub mod nvml;
pub mod outbox;
pub mod runner;
pub mod serving;
/// Logging and tracing set-up: shared with the broker, in `switchyard-support`.
pub use switchyard_support::telemetry;

pub use args::AgentArgs;
pub use error::AgentError;

use agent::Enrolled;
use client::BrokerClient;
use runner::RunOptions;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use switchyard_protocol::agent::RegisterRequest;

/// Runs the agent until SIGTERM or SIGINT (exit 0) or a fatal error; with
/// `--exit-on-stdin-eof`, also until stdin closes.
pub async fn run(args: AgentArgs) -> anyhow::Result<()> {
    if args.exit_on_stdin_eof {
        let closed = stdin_closed();
        run_until(args, async {
            tokio::select! {
                () = shutdown_signal() => {}
                () = closed => tracing::info!("stdin closed: whoever started the agent is gone"),
            }
        })
        .await
    } else {
        run_until(args, shutdown_signal()).await
    }
}

/// Runs the agent until `shutdown` resolves: the embeddable and testable form of [`run`].
pub async fn run_until(args: AgentArgs, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    let name = args.name.clone().unwrap_or_else(hostname);
    if let Some(dir) = &args.state_dir {
        // Before anything is read from it or written to it: jobs must never read the token.
        identity::secure(dir)?;
    }
    let sandbox = Arc::new(isolation::Sandbox::from_args(&args)?);
    let probe: Arc<dyn inventory::GpuProbe> = Arc::from(inventory::probe_for(
        &args.fake_gpus,
        &args.fake_gpu_faults,
        &name,
    )?);
    let inventory = {
        let probe = probe.clone();
        let isolated = sandbox.is_isolated();
        tokio::task::spawn_blocking(move || inventory::inventory(probe.as_ref(), isolated))
            .await??
    };
    let brokers = brokers::dedup(&args.brokers);
    let broker_list = brokers
        .iter()
        .map(|u| u.as_str())
        .collect::<Vec<_>>()
        .join(",");
    tracing::info!(agent.name = %name, gpus = inventory.gpus.len(), simulated = inventory.simulated,
        cpus = inventory.cpus, memory_mb = inventory.memory_mb, brokers = %broker_list, "agent starting");
    let client = BrokerClient::with_ca(&brokers, args.ca_cert.as_deref())?;

    tokio::pin!(shutdown);
    let saved = match &args.state_dir {
        Some(dir) => identity::load(dir, &brokers)?,
        None => None,
    };
    // A fresh enrolment is the lease's first renewal: the broker writes the new node with its
    // first heartbeat before it answers. A saved one waits for the first answered heartbeat.
    let (registration, registered_at) = match saved {
        Some(saved) => {
            tracing::info!(agent.id = %saved.registration.agent_id, node.id = %saved.registration.node_id,
                enrolled_with = %saved.enrolled_with, "re-using the saved enrolment");
            if let (false, Some(dir)) = (saved.same_brokers, &args.state_dir) {
                // Keep the saved list in step with the replicas, so that it keeps matching as
                // they are replaced one by one. The enrolment is good either way.
                match identity::save(dir, &saved.enrolled_with, &brokers, &saved.registration) {
                    Ok(()) => {
                        tracing::info!(brokers = %broker_list, "saved the new broker list with the enrolment")
                    }
                    Err(e) => tracing::warn!(error = %e, "could not save the new broker list"),
                }
            }
            (saved.registration, None)
        }
        None => {
            let token = args
                .enrol_token
                .clone()
                .ok_or(AgentError::NoEnrolmentToken)?;
            let request = RegisterRequest {
                hostname: name.clone(),
                agent_version: env!("CARGO_PKG_VERSION").to_string(),
                inventory: inventory.clone(),
                address: Some(args.advertise_host.clone()),
            };
            let (registration, sent) = tokio::select! {
                () = &mut shutdown => return Ok(()),
                r = identity::register(&client, &token, &request) => r?,
            };
            // The replica that answered, as it was given.
            let current = client.current_broker();
            let enrolled_with = brokers
                .iter()
                .find(|u| brokers::base_of(u) == current)
                .unwrap_or(&current)
                .to_string();
            if let Some(dir) = &args.state_dir {
                identity::save(dir, &enrolled_with, &brokers, &registration)?;
            }
            tracing::info!(agent.id = %registration.agent_id, node.id = %registration.node_id,
                pool = %registration.pool, broker = %enrolled_with, "enrolled");
            (registration, Some(sent))
        }
    };

    let heartbeat_s = args
        .heartbeat_s
        .unwrap_or(registration.heartbeat_interval_s)
        .max(1);
    let mut heartbeat = Duration::from_secs(heartbeat_s);
    let lease = fence::FencePlan::new(Duration::from_secs(registration.lease_ttl_s), heartbeat)
        .map(fence::LeaseClock::new);
    if let (Some(clock), Some(sent)) = (&lease, registered_at) {
        // So that the first lease is taken at once, not after the first heartbeat's answer
        // (which waits for the broker's heartbeat batch to be written).
        clock.renewed(sent);
    }
    match &lease {
        Some(clock) => {
            let plan = clock.plan();
            if plan.heartbeat < heartbeat {
                tracing::info!(
                    heartbeat_ms = plan.heartbeat.as_millis() as u64,
                    lease_ttl_s = registration.lease_ttl_s,
                    "heartbeating more often than asked: the lease TTL is short"
                );
                heartbeat = plan.heartbeat;
            }
            tracing::info!(
                lease_ttl_s = registration.lease_ttl_s,
                fence_after_ms = plan.window.as_millis() as u64,
                "self-fencing: jobs stop if no heartbeat is answered for the lease TTL less the margin"
            );
        }
        None => tracing::warn!(
            "the broker gave no lease TTL: jobs are not stopped when it cannot be reached"
        ),
    }
    let interruption = match &args.interruption_url {
        Some(url) => Some(
            interruption::Watcher::new(
                url.clone(),
                Duration::from_secs(args.interruption_poll_s.max(1)),
            )
            .map_err(|e| AgentError::HttpClient(e.to_string()))?,
        ),
        None => None,
    };
    let mut client = client.with_token(identity::token(&registration));
    if client.brokers().len() > 1 {
        // With another replica to go to, a heartbeat stuck on a silent one must give up in
        // time to renew the lease elsewhere.
        client = client.with_heartbeat_timeout(heartbeat_timeout(registration.lease_ttl_s));
    }
    if let Some(clock) = &lease {
        // A heartbeat stuck on a dead connection must leave time for another before the fence.
        let timeout = clock
            .plan()
            .heartbeat_timeout()
            .min(client.heartbeat_timeout());
        client = client.with_heartbeat_timeout(timeout);
    }
    let gpu_sim = probe.gpu_sim();
    let enrolled = Enrolled {
        client,
        probe,
        inventory,
        heartbeat,
        poll_wait_s: args.poll_wait_s.max(1),
        run: RunOptions {
            default_grace: Duration::from_secs(args.grace_s),
            sandbox,
            serving: Arc::new(serving::Serving::new(args.advertise_host.clone())?),
            gpu_sim,
        },
        interruption,
        lease,
    };
    let result = agent::serve(enrolled, shutdown).await;
    if let (Err(AgentError::TokenRevoked { .. }), Some(dir)) = (&result, &args.state_dir) {
        // The saved token is worthless now; the next start must enrol again.
        identity::forget(dir);
    }
    Ok(result?)
}

/// How long one heartbeat may take before the agent tries the next broker replica: a third of
/// the lease TTL (between 5 and 30 seconds), so that a replica gone silent delays the lease's
/// renewal well within the TTL rather than past it.
fn heartbeat_timeout(lease_ttl_s: u64) -> Duration {
    Duration::from_secs(lease_ttl_s / 3).clamp(Duration::from_secs(5), Duration::from_secs(30))
}

/// The machine's hostname, or a fixed name when it cannot be read.
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "switchyard-agent".to_string())
}

/// Resolves when stdin reaches end of file (or cannot be read): the process holding the pipe's
/// other end is gone. Read on a thread of its own, not tokio's blocking pool, whose reads
/// cannot be cancelled and would keep the runtime from shutting down while stdin is open.
fn stdin_closed() -> impl Future<Output = ()> {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let spawned = std::thread::Builder::new()
        .name("stdin-watch".into())
        .spawn(move || {
            use std::io::Read;
            let mut stdin = std::io::stdin().lock();
            let mut buf = [0u8; 256];
            loop {
                match stdin.read(&mut buf) {
                    Ok(0) => break,
                    Ok(_) => continue,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(_) => break,
                }
            }
            let _ = tx.send(());
        });
    async move {
        match spawned {
            Ok(_) => {
                let _ = rx.await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch stdin");
                std::future::pending::<()>().await;
            }
        }
    }
}

/// Resolves on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        () = term => tracing::info!("SIGTERM received"),
        r = tokio::signal::ctrl_c() => match r {
            Ok(()) => tracing::info!("SIGINT received"),
            Err(e) => tracing::warn!(error = %e, "cannot listen for SIGINT"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_heartbeat_gives_up_well_within_the_lease() {
        assert_eq!(heartbeat_timeout(30), Duration::from_secs(10));
        assert_eq!(heartbeat_timeout(10), Duration::from_secs(5));
        assert_eq!(heartbeat_timeout(600), Duration::from_secs(30));
    }
}

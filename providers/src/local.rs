//! The local provider: "instances" are `switchyard agent` processes on this machine with
//! simulated GPUs. It powers `switchyard up` (a one-machine federation) and the burst tests.
//!
//! Each process is owned by one supervisor task that waits out the boot delay, spawns the agent
//! in its own process group, and then waits for whichever comes first: the process exiting by
//! itself, or a stop request. Stopping sends SIGTERM to the group, waits up to the grace period
//! (5 s), sends SIGKILL to the group and reaps the leader. The shared table only records what
//! the supervisors report, so no lock is held across an await.
//!
//! Every agent's stdin is a pipe whose write end its supervisor holds for as long as the agent
//! should live, and the agent runs with `--exit-on-stdin-eof`: when this process dies, however
//! (kill -9 of `switchyard up` included), the pipe closes and every agent drains its jobs and
//! exits, instead of living on in its own process group.
//!
//! Semantics the broker relies on:
//! - [`Provider::launch`] is idempotent on `instance_key` for the life of the provider: the same
//!   key returns the same [`InstanceInfo`] (with its current state, even `Terminated`) and never
//!   starts a second process. It returns at once with state `Pending`; the state becomes
//!   `Running` when the process has been spawned after `boot_delay`.
//! - [`Provider::list`] returns the launched instances that are not terminated. A process that
//!   exited by itself is reaped at once by its supervisor, marked `Terminated`, and so **omitted**.
//! - Static agents ([`LocalProvider::spawn_static_agent`], the on-prem nodes of `switchyard up`)
//!   are not launched instances: `list` leaves them out, so the burst controller never takes them
//!   for orphans. [`LocalProvider::shutdown`] and [`Provider::terminate`] stop them like the rest.
//! - If the provider is dropped, supervisors stop their processes the same way (while the runtime
//!   runs). When the runtime itself goes away, or this process dies, the agents' stdin closes
//!   and they drain and exit by themselves (not SIGKILL, which would orphan their jobs).
//!
//! The enrolment token is passed in the agent's environment (`SWITCHYARD_ENROL_TOKEN`), never on
//! its command line, which every local user can read in the process table. The agent's
//! environment is readable only by its own user (and root); its jobs get a clean one.

use crate::{InstanceInfo, InstanceState, LaunchRequest, Offers, Provider, ProviderError};
use async_trait::async_trait;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use std::collections::{BTreeMap, HashMap};
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;
use switchyard_core::{Market, Pool, PoolId, Region};
use tokio::process::{Child, Command};
use tokio::sync::{oneshot, watch};

/// How long a stopped agent gets between SIGTERM and SIGKILL, unless changed with
/// [`LocalProvider::with_stop_grace`].
pub const DEFAULT_STOP_GRACE: Duration = Duration::from_secs(5);

/// What the local provider offers and how it starts agents.
#[derive(Clone, Debug)]
pub struct LocalConfig {
    /// The agent binary, e.g. the `switchyard` executable itself.
    pub agent_program: PathBuf,
    /// Arguments before the generated ones, e.g. `["agent"]`.
    pub agent_args: Vec<String>,
    /// Simulated time from launch to the agent process starting.
    pub boot_delay: Duration,
    /// Where each agent's stdout and stderr go: `{log_dir}/{instance_key}.log`, appended.
    pub log_dir: PathBuf,
    /// The offers, exactly: the broker builds them (catalogue-priced simulated cloud regions,
    /// on-prem regions from its config).
    pub regions: Vec<Region>,
    pub pools: Vec<Pool>,
    /// More arguments for the agent of one name (a static agent's name, or a launched
    /// instance's key), after the generated ones: `up`'s `--fake-gpu-fault` for its on-prem
    /// agents, say.
    pub extra_agent_args: BTreeMap<String, Vec<String>>,
}

/// Agent processes on this machine, as a [`Provider`].
pub struct LocalProvider {
    config: Arc<LocalConfig>,
    stop_grace: Duration,
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// By provider id.
    instances: HashMap<String, Instance>,
    /// Launched instances: instance key → provider id.
    by_key: HashMap<String, String>,
    /// Static agents: name → provider id of the latest one.
    static_by_name: HashMap<String, String>,
    shut_down: bool,
}

struct Instance {
    info: InstanceInfo,
    is_static: bool,
    pid: Option<u32>,
    /// Taken by the first stop request; dropping it also stops the supervisor.
    stop: Option<oneshot::Sender<()>>,
    /// Becomes `true` once the process is gone and reaped (or was never started).
    done: watch::Receiver<bool>,
}

/// How a supervisor gets its process.
enum Start {
    /// Spawn after the boot delay (a launched instance).
    After(Duration, AgentCommand),
    /// Already spawned (a static agent).
    Spawned(Child),
}

/// The agent's environment variable for its enrolment token (the agent's `ENROL_TOKEN_ENV`).
const ENROL_TOKEN_ENV: &str = "SWITCHYARD_ENROL_TOKEN";

/// A fully resolved agent command line.
struct AgentCommand {
    program: PathBuf,
    args: Vec<String>,
    /// The enrolment token, set as [`ENROL_TOKEN_ENV`] in the agent's environment only.
    enrolment_token: String,
    log_path: PathBuf,
}

impl AgentCommand {
    /// The agent with its stdin a pipe: the caller must keep the child's `stdin` open for as
    /// long as the agent should run.
    fn spawn(&self) -> std::io::Result<Child> {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)?;
        let err = log.try_clone()?;
        Command::new(&self.program)
            .args(&self.args)
            .env(ENROL_TOKEN_ENV, &self.enrolment_token)
            .stdin(Stdio::piped())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(err))
            .process_group(0)
            // The stdin pipe ends it gracefully instead (see the module docs).
            .kill_on_drop(false)
            .spawn()
    }
}

impl LocalProvider {
    pub fn new(config: LocalConfig) -> LocalProvider {
        LocalProvider {
            config: Arc::new(config),
            stop_grace: DEFAULT_STOP_GRACE,
            shared: Arc::new(Shared {
                state: Mutex::new(State::default()),
            }),
        }
    }

    /// Changes the time between SIGTERM and SIGKILL (5 s by default).
    pub fn with_stop_grace(mut self, grace: Duration) -> LocalProvider {
        self.stop_grace = grace;
        self
    }

    pub fn config(&self) -> &LocalConfig {
        &self.config
    }

    /// The OS process id of a running instance or static agent (the leader of its process
    /// group); `None` before it is spawned and after it is gone.
    pub fn pid(&self, provider_id: &str) -> Option<u32> {
        self.shared
            .lock()
            .instances
            .get(provider_id)
            .and_then(|i| i.pid)
    }

    /// Starts an on-prem agent now (no boot delay), in `pool` (which must be one of the
    /// configured pools: it gives the simulated GPUs). Idempotent on `name` while that agent
    /// runs; a name whose agent has gone starts a new one. Logs go to `{log_dir}/{name}.log`.
    pub async fn spawn_static_agent(
        &self,
        name: &str,
        pool: &PoolId,
        enrolment_token: &str,
        broker_url: &str,
    ) -> Result<InstanceInfo, ProviderError> {
        let command = self.agent_command(name, pool, enrolment_token, broker_url)?;
        prepare_log_dir(&self.config.log_dir).await?;
        let mut state = self.shared.lock();
        if state.shut_down {
            return Err(shut_down_error());
        }
        if let Some(existing) = state
            .static_by_name
            .get(name)
            .and_then(|id| state.instances.get(id))
            .filter(|i| i.info.state != InstanceState::Terminated)
        {
            return Ok(existing.info.clone());
        }
        let child = command
            .spawn()
            .map_err(|e| ProviderError::Transient(format!("cannot start agent {name}: {e}")))?;
        let info = InstanceInfo {
            provider_id: new_provider_id(),
            instance_key: name.to_string(),
            pool: pool.clone(),
            market: Market::OnDemand,
            state: InstanceState::Running,
        };
        tracing::info!(
            agent.name = name,
            pool.id = %pool,
            pid = child.id(),
            "started static agent"
        );
        let pid = child.id();
        self.track(&mut state, info.clone(), true, pid, Start::Spawned(child));
        state
            .static_by_name
            .insert(name.to_string(), info.provider_id.clone());
        Ok(info)
    }

    /// Stops every process this provider started — launched instances and static agents — in
    /// parallel (SIGTERM, grace period, SIGKILL), and refuses new launches afterwards.
    /// `switchyard up` calls it on Ctrl-C.
    pub async fn shutdown(&self) {
        let waits: Vec<watch::Receiver<bool>> = {
            let mut state = self.shared.lock();
            state.shut_down = true;
            state.instances.values_mut().map(request_stop).collect()
        };
        for mut done in waits {
            // An error means the supervisor is gone, which also means the process is.
            let _ = done.wait_for(|d| *d).await;
        }
    }

    fn agent_command(
        &self,
        name: &str,
        pool_id: &PoolId,
        enrolment_token: &str,
        broker_url: &str,
    ) -> Result<AgentCommand, ProviderError> {
        let pool = self
            .config
            .pools
            .iter()
            .find(|p| p.id == *pool_id)
            .ok_or_else(|| ProviderError::UnknownPool(pool_id.clone()))?;
        let mut args = self.config.agent_args.clone();
        args.extend(["--broker", broker_url, "--exit-on-stdin-eof"].map(String::from));
        if let Some(decl) = fake_gpus(pool) {
            args.extend(["--fake-gpus".to_string(), decl]);
        }
        args.extend(["--name".to_string(), name.to_string()]);
        if let Some(extra) = self.config.extra_agent_args.get(name) {
            args.extend(extra.iter().cloned());
        }
        Ok(AgentCommand {
            program: self.config.agent_program.clone(),
            args,
            enrolment_token: enrolment_token.to_string(),
            log_path: self.config.log_dir.join(log_file_name(name)),
        })
    }

    /// Records an instance and starts its supervisor.
    fn track(
        &self,
        state: &mut State,
        info: InstanceInfo,
        is_static: bool,
        pid: Option<u32>,
        start: Start,
    ) {
        let (stop_tx, stop_rx) = oneshot::channel();
        let (done_tx, done_rx) = watch::channel(false);
        let id = info.provider_id.clone();
        state.instances.insert(
            id.clone(),
            Instance {
                info,
                is_static,
                pid,
                stop: Some(stop_tx),
                done: done_rx,
            },
        );
        let supervisor = Supervisor {
            shared: Arc::downgrade(&self.shared),
            id,
            grace: self.stop_grace,
        };
        tokio::spawn(supervisor.run(start, stop_rx, done_tx));
    }
}

#[async_trait]
impl Provider for LocalProvider {
    fn name(&self) -> &str {
        "local"
    }

    fn is_local(&self) -> bool {
        true
    }

    async fn offers(&self) -> Result<Offers, ProviderError> {
        Ok(Offers {
            regions: self.config.regions.clone(),
            pools: self.config.pools.clone(),
        })
    }

    async fn launch(&self, request: &LaunchRequest) -> Result<InstanceInfo, ProviderError> {
        if let Some(info) = self.launched(&request.instance_key) {
            return Ok(info);
        }
        let command = self.agent_command(
            &request.instance_key,
            &request.pool,
            &request.enrolment_token,
            &request.broker_url,
        )?;
        prepare_log_dir(&self.config.log_dir).await?;
        let mut state = self.shared.lock();
        // Checked again under the lock: a concurrent launch with the same key may have won.
        if let Some(info) = state
            .by_key
            .get(&request.instance_key)
            .and_then(|id| state.instances.get(id))
        {
            return Ok(info.info.clone());
        }
        if state.shut_down {
            return Err(shut_down_error());
        }
        let info = InstanceInfo {
            provider_id: new_provider_id(),
            instance_key: request.instance_key.clone(),
            pool: request.pool.clone(),
            market: request.market,
            state: InstanceState::Pending,
        };
        tracing::info!(
            instance.key = %info.instance_key,
            instance.id = %info.provider_id,
            pool.id = %info.pool,
            boot_delay_ms = self.config.boot_delay.as_millis() as u64,
            "launching local agent"
        );
        let start = Start::After(self.config.boot_delay, command);
        self.track(&mut state, info.clone(), false, None, start);
        state
            .by_key
            .insert(info.instance_key.clone(), info.provider_id.clone());
        Ok(info)
    }

    async fn terminate(&self, provider_id: &str) -> Result<(), ProviderError> {
        let done = {
            let mut state = self.shared.lock();
            state.instances.get_mut(provider_id).map(request_stop)
        };
        if let Some(mut done) = done {
            let _ = done.wait_for(|d| *d).await;
        }
        Ok(())
    }

    async fn list(&self) -> Result<Vec<InstanceInfo>, ProviderError> {
        let state = self.shared.lock();
        let mut out: Vec<InstanceInfo> = state
            .instances
            .values()
            .filter(|i| !i.is_static && i.info.state != InstanceState::Terminated)
            .map(|i| i.info.clone())
            .collect();
        out.sort_by(|a, b| a.instance_key.cmp(&b.instance_key));
        Ok(out)
    }
}

impl LocalProvider {
    fn launched(&self, key: &str) -> Option<InstanceInfo> {
        let state = self.shared.lock();
        let id = state.by_key.get(key)?;
        state.instances.get(id).map(|i| i.info.clone())
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain data behind: keep going with it.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Asks an instance's supervisor to stop; returns what to wait on.
fn request_stop(instance: &mut Instance) -> watch::Receiver<bool> {
    if let Some(stop) = instance.stop.take() {
        let _ = stop.send(());
    }
    instance.done.clone()
}

/// Owns one agent process from boot delay to reaping.
struct Supervisor {
    shared: Weak<Shared>,
    id: String,
    grace: Duration,
}

impl Supervisor {
    async fn run(self, start: Start, mut stop: oneshot::Receiver<()>, done: watch::Sender<bool>) {
        let child = match start {
            Start::Spawned(child) => Some(child),
            Start::After(delay, command) => {
                tokio::select! {
                    _ = tokio::time::sleep(delay) => self.spawn(&command),
                    // A stop request, or the provider dropped: never start it.
                    _ = &mut stop => None,
                }
            }
        };
        if let Some(mut child) = child {
            // Held until the agent is gone: its end of file is the agent's order to drain and
            // exit, which it also gets when this whole process dies.
            let _stdin = child.stdin.take();
            let group = child.id().map(|pid| Pid::from_raw(pid as i32));
            tokio::select! {
                status = child.wait() => {
                    tracing::info!(instance.id = %self.id, status = ?status, "local agent exited");
                    // Leave no orphans (its jobs, say) of an agent that died.
                    if let Some(group) = group {
                        signal_group(group, Signal::SIGKILL);
                    }
                }
                _ = &mut stop => stop_group(&mut child, self.grace, &self.id).await,
            }
        }
        self.update(|i| {
            i.info.state = InstanceState::Terminated;
            i.pid = None;
        });
        let _ = done.send(true);
    }

    /// Spawns the process unless the instance was stopped meanwhile; records the outcome.
    fn spawn(&self, command: &AgentCommand) -> Option<Child> {
        let shared = self.shared.upgrade()?;
        let mut state = shared.lock();
        let instance = state.instances.get_mut(&self.id)?;
        // A stop request took the sender meanwhile: do not start it.
        instance.stop.as_ref()?;
        match command.spawn() {
            Ok(child) => {
                instance.pid = child.id();
                instance.info.state = InstanceState::Running;
                tracing::info!(instance.id = %self.id, pid = child.id(), "local agent started");
                Some(child)
            }
            Err(e) => {
                tracing::warn!(
                    instance.id = %self.id,
                    program = %command.program.display(),
                    error = %e,
                    "cannot start local agent"
                );
                None
            }
        }
    }

    fn update(&self, f: impl FnOnce(&mut Instance)) {
        let Some(shared) = self.shared.upgrade() else {
            return;
        };
        if let Some(instance) = shared.lock().instances.get_mut(&self.id) {
            f(instance);
        }
    }
}

/// SIGTERM to the group, up to `grace` for the leader to exit, SIGKILL to the group (also
/// reaching any children the leader left behind), then reap the leader.
async fn stop_group(child: &mut Child, grace: Duration, id: &str) {
    let Some(pid) = child.id() else {
        // Already reaped.
        return;
    };
    let group = Pid::from_raw(pid as i32);
    signal_group(group, Signal::SIGTERM);
    let exited = tokio::time::timeout(grace, child.wait()).await.is_ok();
    if !exited {
        tracing::warn!(
            instance.id = %id,
            grace_ms = grace.as_millis() as u64,
            "local agent ignored SIGTERM; killing it"
        );
    }
    // Kill whatever is left of the group (children the leader left behind). Linux does not hand
    // out a pid that is still a live group's id, so this reaches our group or no one.
    signal_group(group, Signal::SIGKILL);
    if exited {
        return;
    }
    if let Err(e) = child.wait().await {
        tracing::warn!(instance.id = %id, error = %e, "cannot reap local agent");
    }
}

fn signal_group(group: Pid, signal: Signal) {
    match killpg(group, signal) {
        Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
        Err(e) => {
            let pgid = group.as_raw();
            tracing::warn!(pgid, ?signal, error = %e, "cannot signal process group");
        }
    }
}

/// `--fake-gpus` for a pool: `{count}x{model}-{memory}GB`; none for a pool without GPUs.
fn fake_gpus(pool: &Pool) -> Option<String> {
    (pool.gpus_per_node > 0).then(|| {
        format!(
            "{}x{}-{}GB",
            pool.gpus_per_node, pool.gpu_model, pool.gpu_memory_gb
        )
    })
}

/// A file name from an instance key: anything outside `[A-Za-z0-9._-]` becomes `_`, and a
/// leading dot too, so a key can never leave the log directory.
fn log_file_name(key: &str) -> String {
    let mut name: String = key
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if name.is_empty() || name.starts_with('.') {
        name.insert(0, '_');
    }
    name + ".log"
}

fn new_provider_id() -> String {
    format!("local-{}", uuid::Uuid::now_v7())
}

fn shut_down_error() -> ProviderError {
    ProviderError::Transient("the local provider is shutting down".into())
}

async fn prepare_log_dir(dir: &Path) -> Result<(), ProviderError> {
    tokio::fs::create_dir_all(dir).await.map_err(|e| {
        ProviderError::Transient(format!(
            "cannot create log directory {}: {e}",
            dir.display()
        ))
    })
}

#[cfg(test)]
mod tests;

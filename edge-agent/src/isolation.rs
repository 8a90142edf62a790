//! What a job may see of this machine: its own unprivileged uid, its own working directory and
//! a clean environment. A job must never read the agent's state or token, another job's
//! `/proc/PID/environ`, or the environment of whoever started the agent.
//!
//! - **Uids.** An agent running as root runs each attempt as a uid of its own from
//!   `--job-uids` (gid = uid, no supplementary groups). A uid is claimed with an exclusive
//!   `flock` on `{lock dir}/{uid}.lock`, so agents on one machine that share the range never
//!   hand out the same uid, and a crashed agent's claims end with it. A uid that still has
//!   processes, or that names an account in `/etc/passwd`, is never claimed. When the attempt
//!   ends, every process left with that uid is killed (a job that left its process group must
//!   not linger into the next job with the same uid), then the uid is released.
//! - **Working directory.** `{work root}/{attempt id}`, mode 0700, owned by the job's uid, its
//!   cwd and `HOME`; removed when the attempt ends. The root is 0711: job uids can reach their
//!   own directory but cannot list the others.
//! - **Environment.** Cleared, then [`job_env`]: a fixed `PATH`, `HOME`, `LANG`, `TZ`, the
//!   `--pass-env` variables, the job's own `env`, and the four variables the agent decides (five
//!   for a service replica: its `PORT`).
//!
//! An agent that is not root cannot change uids: its jobs run as its own user, in their own
//! directory and clean environment, and it reports `isolation: false`.
//!
//! This module sets up and tears down a job's space; it does not spawn or signal the job's
//! process group (that is [`crate::runner`] and [`crate::group`]).

use crate::args::{AgentArgs, UidRange};
use crate::error::AgentError;
use crate::inventory::cuda_visible_devices;
use nix::fcntl::{Flock, FlockArg};
use nix::sys::signal::{Signal, kill};
use nix::unistd::{Pid, geteuid};
use std::collections::{BTreeMap, HashSet};
use std::ffi::OsString;
use std::fs::{DirBuilder, File, OpenOptions, Permissions};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;
use switchyard_protocol::agent::{AttemptRef, Lease};
use tokio::time::Instant;

/// The `PATH` of every job, whatever the agent's own.
pub const JOB_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Where root agents keep job directories by default.
const ROOT_WORK_DIR: &str = "/var/lib/switchyard-agent/jobs";
/// Where root agents claim uids, machine-wide; `/run` is cleared at boot, as claims should be.
const RUN_LOCK_DIR: &str = "/run/switchyard-agent/job-uids";
const FALLBACK_LOCK_DIR: &str = "/var/lib/switchyard-agent/job-uids";
/// How long the agent keeps killing a uid's processes (a fork bomb keeps making new ones).
const KILL_SETTLE: Duration = Duration::from_secs(2);

/// The variables the agent sets last, so that a job's `env` cannot override them.
const AGENT_VARS: [&str; 5] = [
    "SWITCHYARD_JOB_ID",
    "SWITCHYARD_ATTEMPT_ID",
    "CUDA_VISIBLE_DEVICES",
    "TRACEPARENT",
    crate::fakegpu::SIM_ENV,
];

/// How jobs run on this agent: decided once at start.
#[derive(Debug)]
pub struct Sandbox {
    work_root: PathBuf,
    /// `Some` when jobs run as uids of their own (the agent is root).
    uids: Option<UidPool>,
    /// `--pass-env` variables, read from the agent's environment at start.
    pass_env: Vec<(OsString, OsString)>,
}

impl Sandbox {
    /// From the flags: isolation when the agent is root (with `--job-uids` or the default
    /// range), none otherwise (a warning, once); `--job-uids` without root is an error.
    pub fn from_args(args: &AgentArgs) -> Result<Sandbox, AgentError> {
        let root = geteuid().is_root();
        let uids = match (root, args.job_uids) {
            (true, range) => Some(range.unwrap_or(UidRange::DEFAULT)),
            (false, Some(range)) => {
                return Err(AgentError::Isolation(format!(
                    "--job-uids {}-{} needs the agent to run as root (it runs as uid {})",
                    range.start,
                    range.end,
                    geteuid()
                )));
            }
            (false, None) => {
                tracing::warn!(
                    uid = geteuid().as_raw(),
                    "jobs are not isolated: the agent is not root, so its jobs run as its own \
                     user and can read its state and each other's processes; run the agent as \
                     root to give each job a uid of its own"
                );
                None
            }
        };
        let work_root = args.work_dir.clone().unwrap_or_else(default_work_root);
        let pass_env = args
            .pass_env
            .iter()
            .filter_map(|name| std::env::var_os(name).map(|v| (OsString::from(name), v)))
            .collect();
        let sandbox = Sandbox::new(&work_root, uids, pass_env)?;
        tracing::info!(isolation = sandbox.is_isolated(), work_dir = %sandbox.work_root.display(),
            job_uids = ?uids.map(|r| format!("{}-{}", r.start, r.end)), pass_env = ?args.pass_env,
            "job sandbox ready");
        Ok(sandbox)
    }

    /// A sandbox with its work root (created 0711 if missing, and checked to be the agent's),
    /// uids from `uids` when given (the caller must be root), and `pass_env` as given.
    pub fn new(
        work_root: &Path,
        uids: Option<UidRange>,
        pass_env: Vec<(OsString, OsString)>,
    ) -> Result<Sandbox, AgentError> {
        let work_root = prepare_work_root(work_root, uids.is_some())?;
        let uids = match uids {
            Some(range) => Some(UidPool::new(range, &lock_dir())?),
            None => None,
        };
        Ok(Sandbox {
            work_root,
            uids,
            pass_env,
        })
    }

    /// Whether jobs run as uids of their own.
    pub fn is_isolated(&self) -> bool {
        self.uids.is_some()
    }

    pub fn work_root(&self) -> &Path {
        &self.work_root
    }

    /// The `--pass-env` variables with their values.
    pub fn pass_env(&self) -> &[(OsString, OsString)] {
        &self.pass_env
    }

    /// Claims a uid (when isolated) and creates the attempt's directory. The error is the
    /// message to report as the attempt's failure to start.
    pub fn enter(&self, attempt: &AttemptRef) -> Result<JobSpace, String> {
        let claim = match &self.uids {
            Some(pool) => Some(pool.claim()?),
            None => None,
        };
        let dir = self.work_root.join(attempt.attempt_id.to_string());
        create_job_dir(&dir, claim.as_ref().map(|c| c.uid)).map_err(|e| {
            format!(
                "failed to create the job's directory {}: {e}",
                dir.display()
            )
        })?;
        Ok(JobSpace {
            dir,
            claim,
            released: false,
        })
    }
}

/// One attempt's uid and directory, from [`Sandbox::enter`] to [`JobSpace::release`].
#[derive(Debug)]
pub struct JobSpace {
    dir: PathBuf,
    claim: Option<UidClaim>,
    released: bool,
}

impl JobSpace {
    /// The job's working directory and `HOME`.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The uid (and gid) the job runs as; `None` when it runs as the agent's user.
    pub fn uid(&self) -> Option<u32> {
        self.claim.as_ref().map(|c| c.uid)
    }

    /// Kills whatever still runs as the job's uid, removes its directory and gives the uid
    /// back. How many processes were left behind and killed.
    pub async fn release(mut self) -> usize {
        self.released = true;
        let killed = match self.uid() {
            Some(uid) => kill_uid(uid).await,
            None => 0,
        };
        let dir = self.dir.clone();
        let removed = tokio::task::spawn_blocking(move || remove_dir(&dir)).await;
        if let Ok(Err(e)) = removed {
            tracing::warn!(dir = %self.dir.display(), error = %e, "could not remove the job's directory");
        }
        // Dropping the claim releases the uid, only now that nothing runs as it.
        killed
    }
}

/// A runner task cancelled mid-job (the agent giving up on a stop): clean up as far as can be
/// done without waiting.
impl Drop for JobSpace {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        if let Some(uid) = self.uid() {
            kill_all(uid);
        }
        let _ = remove_dir(&self.dir);
    }
}

/// A job's environment: the fixed base, the `--pass-env` variables, the job's own `env`, then
/// the variables the agent decides (job and attempt ids, GPUs, trace context), which the job
/// cannot override — nor set when the agent leaves one out (no trace context). A service
/// replica also gets `PORT`, the port the agent chose for it, which its `env` cannot override.
pub fn job_env(
    lease: &Lease,
    home: &Path,
    pass_env: &[(OsString, OsString)],
    port: Option<u16>,
) -> BTreeMap<OsString, OsString> {
    let mut env: BTreeMap<OsString, OsString> = [
        ("PATH", OsString::from(JOB_PATH)),
        ("HOME", home.as_os_str().to_owned()),
        ("LANG", OsString::from("C.UTF-8")),
        ("TZ", OsString::from("UTC")),
    ]
    .into_iter()
    .map(|(k, v)| (OsString::from(k), v))
    .collect();
    env.extend(pass_env.iter().cloned());
    env.extend(
        lease
            .env
            .iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v))),
    );
    for name in AGENT_VARS {
        env.remove(&OsString::from(name));
    }
    let attempt = &lease.attempt;
    let agent_vars = [
        ("SWITCHYARD_JOB_ID", Some(attempt.job_id.to_string())),
        (
            "SWITCHYARD_ATTEMPT_ID",
            Some(attempt.attempt_id.to_string()),
        ),
        (
            "CUDA_VISIBLE_DEVICES",
            Some(cuda_visible_devices(&lease.gpus)),
        ),
        ("TRACEPARENT", lease.traceparent.clone()),
    ];
    for (name, value) in agent_vars {
        if let Some(value) = value {
            env.insert(name.into(), value.into());
        }
    }
    // A service replica listens where the agent says; a batch job's own `PORT` is its own.
    if let Some(port) = port {
        env.insert("PORT".into(), port.to_string().into());
    }
    env
}

/// The work root when `--work-dir` is not given: a system directory for root, a per-user one
/// under the temporary directory otherwise (checked to be the agent's own before use).
fn default_work_root() -> PathBuf {
    let uid = geteuid();
    if uid.is_root() {
        PathBuf::from(ROOT_WORK_DIR)
    } else {
        std::env::temp_dir().join(format!("switchyard-jobs-{uid}"))
    }
}

fn lock_dir() -> PathBuf {
    if Path::new("/run").is_dir() {
        PathBuf::from(RUN_LOCK_DIR)
    } else {
        PathBuf::from(FALLBACK_LOCK_DIR)
    }
}

/// Creates (0711) or checks the work root: a directory, not a link, owned by the agent's user,
/// 0711 (reachable, not listable); with isolation, every directory above it must be
/// searchable by others, or job uids could not reach their directories. Its canonical path.
fn prepare_work_root(root: &Path, isolated: bool) -> Result<PathBuf, AgentError> {
    let err =
        |what: String| AgentError::Isolation(format!("work directory {}: {what}", root.display()));
    DirBuilder::new()
        .recursive(true)
        .mode(0o711)
        .create(root)
        .map_err(|e| err(e.to_string()))?;
    check_own_dir(root).map_err(err)?;
    std::fs::set_permissions(root, Permissions::from_mode(0o711))
        .map_err(|e| err(e.to_string()))?;
    let root = std::fs::canonicalize(root).map_err(|e| err(e.to_string()))?;
    if isolated {
        for above in root.ancestors().skip(1) {
            let mode = std::fs::metadata(above)
                .map_err(|e| err(e.to_string()))?
                .mode();
            if mode & 0o001 == 0 {
                return Err(err(format!(
                    "{} is not searchable by others, so job uids could not reach their \
                     directories (chmod o+x it, or choose another --work-dir)",
                    above.display()
                )));
            }
        }
    }
    Ok(root)
}

/// A directory owned by this process's effective uid, and not a symbolic link (someone else
/// could have made either in a shared temporary directory).
fn check_own_dir(dir: &Path) -> Result<(), String> {
    let meta = std::fs::symlink_metadata(dir).map_err(|e| e.to_string())?;
    if !meta.file_type().is_dir() {
        return Err("not a directory".into());
    }
    if meta.uid() != geteuid().as_raw() {
        return Err(format!(
            "owned by uid {}, not by the agent's uid {}",
            meta.uid(),
            geteuid()
        ));
    }
    Ok(())
}

/// `{root}/{attempt id}`, 0700, owned by the job's uid and gid when it has one. A directory
/// left by an earlier run of the same attempt (an agent that crashed) is removed first.
fn create_job_dir(dir: &Path, uid: Option<u32>) -> std::io::Result<()> {
    if std::fs::symlink_metadata(dir).is_ok() {
        remove_dir(dir)?;
    }
    DirBuilder::new().mode(0o700).create(dir)?;
    if let Some(uid) = uid {
        std::os::unix::fs::chown(dir, Some(uid), Some(uid))?;
    }
    std::fs::set_permissions(dir, Permissions::from_mode(0o700))
}

/// Removes a job's directory and everything in it. `remove_dir_all` does not follow symbolic
/// links, so a job cannot make the agent delete outside its directory.
fn remove_dir(dir: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// The uids handed to jobs and who holds them.
#[derive(Debug)]
struct UidPool {
    range: UidRange,
    lock_dir: PathBuf,
    /// Where the next search starts: uids go round the range, so a uid just given back is the
    /// last to be reused.
    next: Mutex<u32>,
}

/// A uid held by one attempt; dropping it gives the uid back.
#[derive(Debug)]
struct UidClaim {
    uid: u32,
    _lock: Flock<File>,
}

impl UidPool {
    fn new(range: UidRange, lock_dir: &Path) -> Result<UidPool, AgentError> {
        let err = |what: String| {
            AgentError::Isolation(format!("uid lock directory {}: {what}", lock_dir.display()))
        };
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(lock_dir)
            .map_err(|e| err(e.to_string()))?;
        check_own_dir(lock_dir).map_err(err)?;
        std::fs::set_permissions(lock_dir, Permissions::from_mode(0o700))
            .map_err(|e| err(e.to_string()))?;
        let own = geteuid().as_raw();
        if range.contains(own) || range.contains(0) {
            return Err(AgentError::Isolation(format!(
                "--job-uids {}-{} holds the agent's own uid {own}",
                range.start, range.end
            )));
        }
        Ok(UidPool {
            range,
            lock_dir: lock_dir.to_path_buf(),
            next: Mutex::new(range.start),
        })
    }

    /// The next free uid: no process runs as it, no account has it, no one holds its lock.
    fn claim(&self) -> Result<UidClaim, String> {
        let busy = uids_in_use();
        let accounts = account_uids();
        let mut next = self.next.lock().unwrap_or_else(|e| e.into_inner());
        let UidRange { start, end } = self.range;
        let count = u64::from(end - start) + 1;
        let first = u64::from(next.clamp(start, end) - start);
        for i in 0..count {
            let offset = u32::try_from((first + i) % count).unwrap_or(0);
            let uid = start + offset;
            if busy.contains(&uid) || accounts.contains(&uid) {
                continue;
            }
            if let Some(lock) = self.try_lock(uid)? {
                *next = if uid == end { start } else { uid + 1 };
                return Ok(UidClaim { uid, _lock: lock });
            }
        }
        Err(format!(
            "failed to start the job: no free job uid in {start}-{end} (each running job \
             holds one; widen --job-uids)"
        ))
    }

    fn try_lock(&self, uid: u32) -> Result<Option<Flock<File>>, String> {
        let path = self.lock_dir.join(format!("{uid}.lock"));
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| {
                format!(
                    "failed to start the job: cannot open {}: {e}",
                    path.display()
                )
            })?;
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => Ok(Some(lock)),
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => Ok(None),
            Err((_, e)) => Err(format!(
                "failed to start the job: cannot lock {}: {e}",
                path.display()
            )),
        }
    }
}

/// Kills every process running as `uid` until none is left (bounded by [`KILL_SETTLE`]: a
/// process may fork between a scan and the kill). How many were found.
pub async fn kill_uid(uid: u32) -> usize {
    let deadline = Instant::now() + KILL_SETTLE;
    let mut killed = 0;
    loop {
        let found = kill_all(uid);
        killed += found;
        if found == 0 || Instant::now() >= deadline {
            return killed;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// SIGKILL to every live process of `uid`; how many there were. Never the agent's own uid or
/// root's: the scan would find the agent itself.
fn kill_all(uid: u32) -> usize {
    if uid == 0 || uid == geteuid().as_raw() {
        return 0;
    }
    let pids = processes_of(uid);
    for pid in &pids {
        if let Ok(raw) = i32::try_from(*pid) {
            let _ = kill(Pid::from_raw(raw), Signal::SIGKILL);
        }
    }
    pids.len()
}

/// Live (not zombie) processes with `uid` as their real, effective, saved or filesystem uid.
pub fn processes_of(uid: u32) -> Vec<u32> {
    scan_processes()
        .into_iter()
        .filter(|(_, uids)| uids.contains(&uid))
        .map(|(pid, _)| pid)
        .collect()
}

/// Every uid some live process runs as.
fn uids_in_use() -> HashSet<u32> {
    scan_processes()
        .into_iter()
        .flat_map(|(_, uids)| uids)
        .collect()
}

/// (pid, its four uids) of every live process, from `/proc/PID/status`.
fn scan_processes() -> Vec<(u32, [u32; 4])> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_str()?.parse::<u32>().ok()?;
            // A process may exit between listing and reading: skip it.
            let status = std::fs::read_to_string(entry.path().join("status")).ok()?;
            parse_status(&status).map(|uids| (pid, uids))
        })
        .collect()
}

/// The `Uid:` line of a `/proc/PID/status`, unless the process is a zombie (it holds nothing
/// and its parent reaps it).
fn parse_status(status: &str) -> Option<[u32; 4]> {
    let mut uids = None;
    for line in status.lines() {
        if let Some(state) = line.strip_prefix("State:") {
            if matches!(state.trim_start().chars().next(), Some('Z' | 'X')) {
                return None;
            }
        } else if let Some(rest) = line.strip_prefix("Uid:") {
            let mut fields = rest.split_whitespace().map(|f| f.parse::<u32>().ok());
            let mut four = [0u32; 4];
            for slot in &mut four {
                *slot = fields.next()??;
            }
            uids = Some(four);
        }
    }
    uids
}

/// Uids of the accounts in `/etc/passwd`: a real user's processes must never be a job's.
fn account_uids() -> HashSet<u32> {
    std::fs::read_to_string("/etc/passwd")
        .map(|text| {
            text.lines()
                .filter_map(|l| l.split(':').nth(2)?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests;

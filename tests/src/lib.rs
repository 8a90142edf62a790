//! Harness for end-to-end tests: real `switchyard` and `switchyard-agent` processes on loopback
//! ports, a fresh data directory per test, polling with deadlines (never fixed sleeps), and
//! every process group killed when the test ends.
//!
//! The binaries come from the same target directory as the test (`scripts/test.sh` builds them
//! first), or from `SWITCHYARD_BIN_DIR`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod clouds;
pub mod ledger;
pub mod proxy;

use anyhow::{Context, bail};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde_json::{Value, json};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Directory holding the built binaries.
pub fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("SWITCHYARD_BIN_DIR") {
        return PathBuf::from(dir);
    }
    // Tests run from target/<profile>/deps/, binaries such as bench-e2e from target/<profile>/.
    let exe = std::env::current_exe().expect("executable path");
    let dir = exe.parent().expect("target directory");
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.parent().expect("target directory").to_path_buf()
    } else {
        dir.to_path_buf()
    }
}

pub fn bin(name: &str) -> PathBuf {
    let path = bin_dir().join(name);
    assert!(
        path.exists(),
        "{} is missing: build it first (`cargo build -p switchyard-broker -p switchyard-agent`) or set SWITCHYARD_BIN_DIR",
        path.display()
    );
    path
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// A child process in its own process group, killed (group and all) on drop.
pub struct Proc {
    pub child: Child,
    pub name: String,
}

impl Proc {
    pub fn spawn(name: &str, mut cmd: Command, log: &Path) -> anyhow::Result<Proc> {
        use std::os::unix::process::CommandExt;
        let out = std::fs::File::create(log)?;
        let err = out.try_clone()?;
        cmd.stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .process_group(0);
        let child = cmd.spawn().with_context(|| format!("starting {name}"))?;
        Ok(Proc {
            child,
            name: name.to_string(),
        })
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn signal_group(&self, sig: Signal) {
        let _ = killpg(Pid::from_raw(self.pid()), sig);
    }

    /// Waits for the process to exit by itself.
    pub fn wait_exit(&mut self, timeout: Duration) -> anyhow::Result<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            if Instant::now() > deadline {
                bail!("{} did not exit within {timeout:?}", self.name);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Proc {
    /// SIGTERM first, so an agent stops its jobs (they run in process groups of their own),
    /// then SIGKILL whatever is left after 5 s.
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.signal_group(Signal::SIGTERM);
            let _ = self.wait_exit(Duration::from_secs(5));
        }
        self.signal_group(Signal::SIGKILL);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `f` every 50 ms until it returns `Some`, or fails after `timeout`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A broker started with `switchyard serve --config`.
pub struct Broker {
    pub url: String,
    pub admin: String,
    pub dir: tempfile::TempDir,
    pub http: reqwest::Client,
    pub proc: Proc,
    agents: Vec<Proc>,
}

pub const POOL: &str = "onprem:e2e-dc/h100x4";

/// The e2e brokers' config: `listen` on `port`, `data_dir`, the harness's timings (1 s
/// heartbeats, 10 s lease TTL, 2 s grace, 200 ms ticks), then `extra` (TOML: top-level keys,
/// then sections; a top-level key in it replaces the harness's own), then the on-prem region
/// and [`POOL`].
pub fn broker_config(port: u16, data_dir: &Path, extra: &str) -> String {
    let overridden = |key: &str| {
        extra
            .lines()
            .any(|l| l.split('=').next().map(str::trim) == Some(key))
    };
    let defaults: String = [
        ("heartbeat_interval_s", "1"),
        ("lease_ttl_s", "10"),
        ("grace_s", "2"),
        ("scheduler_tick_ms", "200"),
    ]
    .iter()
    .filter(|(k, _)| !overridden(k))
    .map(|(k, v)| format!("{k} = {v}\n"))
    .collect();
    format!(
        r#"
listen = "127.0.0.1:{port}"
data_dir = "{data}"
{defaults}{extra}

[[regions]]
id = "onprem:e2e-dc"
latency_ms = 1

[[pools]]
id = "{POOL}"
region = "onprem:e2e-dc"
gpu_model = "H100"
gpus_per_node = 4
gpu_memory_gb = 80
price_per_gpu_hour_usd = 2.0
node_limit = 4
"#,
        data = data_dir.display()
    )
}

impl Broker {
    pub async fn start() -> Broker {
        Broker::start_with("").await
    }

    /// Starts a broker whose config has `extra` (TOML: top-level keys, then sections) after its
    /// own top-level keys and before its region and pool tables. A top-level key in `extra`
    /// replaces the harness's own setting of it.
    pub async fn start_with(extra: &str) -> Broker {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let url = format!("http://127.0.0.1:{port}");
        let config = broker_config(port, &dir.path().join("data"), extra);
        let config_path = dir.path().join("switchyard.toml");
        std::fs::write(&config_path, config).unwrap();
        let http = reqwest::Client::new();
        let proc = Broker::spawn_serve(dir.path(), &url, &http).await;
        let admin = std::fs::read_to_string(dir.path().join("data/admin.token"))
            .unwrap()
            .trim()
            .to_string();
        Broker {
            url,
            admin,
            dir,
            http,
            proc,
            agents: Vec::new(),
        }
    }

    /// `switchyard serve` with the config in `dir`; returns once it is ready.
    async fn spawn_serve(dir: &Path, url: &str, http: &reqwest::Client) -> Proc {
        let mut cmd = Command::new(bin("switchyard"));
        cmd.arg("serve")
            .arg("--config")
            .arg(dir.join("switchyard.toml"));
        let proc = Proc::spawn("broker", cmd, &dir.join("broker.log")).unwrap();
        let ready_url = format!("{url}/readyz");
        eventually("the broker to be ready", Duration::from_secs(20), || {
            let http = http.clone();
            let ready_url = ready_url.clone();
            async move {
                let r = http.get(&ready_url).send().await.ok()?;
                r.status().is_success().then_some(())
            }
        })
        .await;
        proc
    }

    /// Stops the broker (SIGTERM, graceful) and starts it again on the same config and data.
    pub async fn restart(&mut self) {
        self.proc.signal_group(Signal::SIGTERM);
        self.proc.wait_exit(Duration::from_secs(20)).unwrap();
        self.proc = Broker::spawn_serve(self.dir.path(), &self.url, &self.http).await;
    }

    /// `kill -9` of the broker (a crash: no shutdown, no resignation); returns once it died.
    pub fn kill9(&mut self) {
        self.proc.signal_group(Signal::SIGKILL);
        self.proc.wait_exit(Duration::from_secs(20)).unwrap();
    }

    /// Starts the broker again on the same config, data and port after [`Broker::kill9`];
    /// the previous run's log is kept as `broker-<pid>.log`.
    pub async fn start_again(&mut self) {
        let log = self.dir.path().join("broker.log");
        let _ = std::fs::rename(
            &log,
            self.dir
                .path()
                .join(format!("broker-{}.log", self.proc.pid())),
        );
        self.proc = Broker::spawn_serve(self.dir.path(), &self.url, &self.http).await;
    }

    /// A directory under the test's directory that jobs can write to (mode 1777, the test's
    /// directory made traversable): an agent that runs as root runs its jobs as uids of their
    /// own, which cannot write to the test's private directories.
    pub fn job_writable_dir(&self, name: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let dir = self.dir.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        // Not sticky: with `fs.protected_regular` a sticky world-writable directory refuses
        // one uid's O_CREAT open of a file another uid made (a rerun appending to its marks).
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        std::fs::set_permissions(self.dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
        dir
    }

    /// The broker's data directory.
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Every job, newest first, through the list API's pages.
    pub async fn all_jobs(&self) -> Vec<Value> {
        let mut jobs = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let path = match &cursor {
                Some(c) => format!("/api/v1/jobs?limit=500&cursor={c}"),
                None => "/api/v1/jobs?limit=500".to_string(),
            };
            let (status, page) = self.call(reqwest::Method::GET, &path, None).await;
            assert_eq!(status, 200, "{page}");
            jobs.extend(page["jobs"].as_array().cloned().unwrap_or_default());
            match page["next_cursor"].as_str() {
                Some(c) => cursor = Some(c.to_string()),
                None => return jobs,
            }
        }
    }

    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.url))
            .bearer_auth(&self.admin);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let res = req.send().await.unwrap();
        let status = res.status().as_u16();
        let text = res.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// Starts a `switchyard-agent` with `gpus` simulated H100s and waits until it joined.
    pub async fn start_agent(&mut self, name: &str, gpus: u32) {
        let url = self.url.clone();
        self.start_agent_via(name, gpus, &url).await;
    }

    /// [`Broker::start_agent`], with the agent talking to the broker at `broker_url` (a
    /// [`proxy::FaultProxy`] in front of it, say).
    pub async fn start_agent_via(&mut self, name: &str, gpus: u32, broker_url: &str) {
        let (status, body) = self
            .call(
                reqwest::Method::POST,
                "/api/v1/enrolment-tokens",
                Some(json!({"pool": POOL})),
            )
            .await;
        assert_eq!(status, 201, "{body}");
        let token = body["token"].as_str().unwrap().to_string();
        let mut cmd = Command::new(bin("switchyard-agent"));
        cmd.args([
            "--broker",
            broker_url,
            "--enrol-token",
            &token,
            "--name",
            name,
        ])
        .arg("--fake-gpus")
        .arg(format!("{gpus}xH100-80GB"))
        .env("RUST_LOG", "info");
        let log = self.dir.path().join(format!("agent-{name}.log"));
        self.agents.push(Proc::spawn(name, cmd, &log).unwrap());
        let want = self.agents.len();
        eventually("the agent to register", Duration::from_secs(20), || async {
            let (_, pools) = self.call(reqwest::Method::GET, "/api/v1/pools", None).await;
            let nodes = pools["pools"]
                .as_array()?
                .iter()
                .find(|p| p["id"] == POOL)?["nodes"]
                .as_u64()?;
            (nodes as usize >= want).then_some(())
        })
        .await;
    }

    /// Starts a `switchyard-agent` as [`Broker::start_agent`] does, with its enrolment token in
    /// its environment (never on its command line), `args` added to its command line and
    /// `env` to its environment; waits until it joined. Its index for [`Broker::agent`].
    pub async fn start_agent_with(
        &mut self,
        name: &str,
        gpus: u32,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> usize {
        let (status, body) = self
            .call(
                reqwest::Method::POST,
                "/api/v1/enrolment-tokens",
                Some(json!({"pool": POOL})),
            )
            .await;
        assert_eq!(status, 201, "{body}");
        let token = body["token"].as_str().unwrap().to_string();
        let mut cmd = Command::new(bin("switchyard-agent"));
        cmd.args(["--broker", &self.url, "--name", name])
            .arg("--fake-gpus")
            .arg(format!("{gpus}xH100-80GB"))
            .args(args)
            .env("SWITCHYARD_ENROL_TOKEN", &token)
            .env("RUST_LOG", "info")
            .envs(env.iter().copied());
        let log = self.dir.path().join(format!("agent-{name}.log"));
        self.agents.push(Proc::spawn(name, cmd, &log).unwrap());
        let want = self.agents.len();
        eventually("the agent to register", Duration::from_secs(20), || async {
            let (_, pools) = self.call(reqwest::Method::GET, "/api/v1/pools", None).await;
            let nodes = pools["pools"]
                .as_array()?
                .iter()
                .find(|p| p["id"] == POOL)?["nodes"]
                .as_u64()?;
            (nodes as usize >= want).then_some(())
        })
        .await;
        want - 1
    }

    pub fn agent(&mut self, i: usize) -> &mut Proc {
        &mut self.agents[i]
    }

    pub async fn submit(&self, spec: Value) -> String {
        let (status, body) = self
            .call(reqwest::Method::POST, "/api/v1/jobs", Some(spec))
            .await;
        assert_eq!(status, 201, "{body}");
        body["id"].as_str().unwrap().to_string()
    }

    pub async fn job(&self, id: &str) -> Value {
        self.call(reqwest::Method::GET, &format!("/api/v1/jobs/{id}"), None)
            .await
            .1
    }

    pub async fn wait_state(&self, id: &str, states: &[&str], timeout: Duration) -> Value {
        eventually(
            &format!("job {id} to reach {states:?}"),
            timeout,
            || async {
                let job = self.job(id).await;
                states.iter().any(|s| job["state"] == *s).then_some(job)
            },
        )
        .await
    }

    /// All log text of a job, stream by stream.
    pub async fn logs(&self, id: &str) -> (String, String, String) {
        let (_, page) = self
            .call(
                reqwest::Method::GET,
                &format!("/api/v1/jobs/{id}/logs"),
                None,
            )
            .await;
        let mut out = (String::new(), String::new(), String::new());
        for e in page["entries"].as_array().unwrap() {
            let text = e["text"].as_str().unwrap();
            match e["stream"].as_str().unwrap() {
                "stdout" => out.0.push_str(text),
                "stderr" => out.1.push_str(text),
                _ => out.2.push_str(text),
            }
        }
        out
    }

    /// The broker's and agents' logs, for a failing test's message.
    pub fn dump_logs(&self) -> String {
        let mut s = String::new();
        for entry in std::fs::read_dir(self.dir.path()).unwrap().flatten() {
            let p = entry.path();
            if p.extension().is_some_and(|e| e == "log") {
                s.push_str(&format!("--- {}\n", p.display()));
                s.push_str(&std::fs::read_to_string(&p).unwrap_or_default());
            }
        }
        s
    }
}

/// The processes descending from `pid` (via /proc), children before grandchildren.
pub fn descendants(pid: i32) -> Vec<i32> {
    let mut parents: Vec<(i32, i32)> = Vec::new();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for e in entries.flatten() {
            let Ok(p) = e.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
                continue;
            };
            // `pid (comm) state ppid …`; comm may hold spaces and parentheses.
            let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
                continue;
            };
            if let Some(ppid) = rest.split_whitespace().nth(1).and_then(|v| v.parse().ok()) {
                parents.push((p, ppid));
            }
        }
    }
    let mut out = Vec::new();
    let mut frontier = vec![pid];
    while let Some(parent) = frontier.pop() {
        for (child, _) in parents.iter().filter(|(_, pp)| *pp == parent) {
            out.push(*child);
            frontier.push(*child);
        }
    }
    out
}

/// A machine dying at once: SIGKILL to the process, its process group and the process group of
/// every descendant (an agent's jobs run in groups of their own). Waits for the process.
pub fn kill_machine(proc: &mut Proc) {
    let tree = descendants(proc.pid());
    proc.signal_group(Signal::SIGKILL);
    for p in tree {
        let _ = killpg(Pid::from_raw(p), Signal::SIGKILL);
        let _ = nix::sys::signal::kill(Pid::from_raw(p), Signal::SIGKILL);
    }
    proc.wait_exit(Duration::from_secs(10)).unwrap();
}

/// A fresh database named `<prefix>_<nanos>` on the PostgreSQL server at `server`
/// (`postgres://user@host:port`, no database); its URL.
pub fn fresh_pg_database(server: &str, prefix: &str) -> String {
    let server = server.trim_end_matches('/');
    let name = format!(
        "{prefix}_{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    );
    let out = Command::new(PSQL)
        .arg(format!("{server}/postgres"))
        .args([
            "-v",
            "ON_ERROR_STOP=1",
            "-c",
            &format!("CREATE DATABASE {name}"),
        ])
        .output()
        .expect("running psql");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    format!("{server}/{name}")
}

/// PostgreSQL's client, for tests that read a database directly.
pub const PSQL: &str = "/usr/lib/postgresql/15/bin/psql";

/// Rows of `sql` on the PostgreSQL database at `url`, each a list of its columns as text.
pub fn psql_rows(url: &str, sql: &str) -> Vec<Vec<String>> {
    let out = Command::new(PSQL)
        .arg(url)
        .args(["-v", "ON_ERROR_STOP=1", "-A", "-t", "-F", "\t", "-c", sql])
        .output()
        .expect("running psql");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| l.split('\t').map(str::to_string).collect())
        .collect()
}

/// Processes whose command line contains `needle` (via /proc), excluding this one.
pub fn processes_matching(needle: &str) -> Vec<(i32, String)> {
    let me = std::process::id() as i32;
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return found;
    };
    for e in entries.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(raw) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&raw).replace('\0', " ");
        // Zombies have an empty command line and are already dead.
        if cmdline.contains(needle) {
            found.push((pid, cmdline));
        }
    }
    found
}

/// A `switchyard up` process with its own data directory and port, driven over REST with the
/// admin token it wrote.
pub struct Up {
    pub url: String,
    pub token: String,
    pub data: PathBuf,
    pub http: reqwest::Client,
    pub proc: Proc,
    pub dir: tempfile::TempDir,
}

impl Up {
    /// Starts `switchyard up` with `args` (besides port and data dir) and waits until its
    /// on-prem agents offer `onprem_gpus` free GPUs.
    pub async fn start(args: &[&str], onprem_gpus: u64) -> Up {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        // Its own free port too: the API's + 1 may be taken by another test's process.
        let gateway_port = free_port();
        let data = dir.path().join("state");
        let mut cmd = Command::new(bin("switchyard"));
        cmd.args(["up", "--port", &port.to_string()])
            .args(["--gateway-port", &gateway_port.to_string()])
            .args(args)
            .arg("--data-dir")
            .arg(&data);
        let proc = Proc::spawn("up", cmd, &dir.path().join("up.log")).unwrap();
        let token_path = data.join("admin.token");
        let token = eventually("the admin token", Duration::from_secs(30), || async {
            std::fs::read_to_string(&token_path)
                .ok()
                .map(|t| t.trim().to_string())
                .filter(|t| !t.is_empty())
        })
        .await;
        let up = Up {
            url: format!("http://127.0.0.1:{port}"),
            token,
            data,
            http: reqwest::Client::new(),
            proc,
            dir,
        };
        eventually("the on-prem agents", Duration::from_secs(60), || async {
            let pools = up.get("/api/v1/pools").await;
            let onprem = pools["pools"]
                .as_array()?
                .iter()
                .find(|p| p["provider"] == "onprem")?
                .clone();
            (onprem["gpus_free"] == onprem_gpus).then_some(())
        })
        .await;
        up
    }

    pub async fn get(&self, path: &str) -> Value {
        let r = self
            .http
            .get(format!("{}{path}", self.url))
            .bearer_auth(&self.token)
            .send()
            .await
            .unwrap();
        r.json().await.unwrap_or(Value::Null)
    }

    /// A call of the API with the admin token: the status and the JSON answer.
    pub async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.url))
            .bearer_auth(&self.token);
        if let Some(body) = body {
            req = req.json(&body);
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// Submits a job; returns its id.
    pub async fn submit(&self, spec: Value) -> String {
        let r = self
            .http
            .post(format!("{}/api/v1/jobs", self.url))
            .bearer_auth(&self.token)
            .json(&spec)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
        let body: Value = r.json().await.unwrap();
        body["id"].as_str().unwrap().to_string()
    }

    pub async fn job_where(&self, id: &str, secs: u64, pred: impl Fn(&Value) -> bool) -> Value {
        eventually(&format!("job {id}"), Duration::from_secs(secs), || async {
            let j = self.get(&format!("/api/v1/jobs/{id}")).await;
            pred(&j).then_some(j)
        })
        .await
    }

    pub async fn instances(&self) -> Vec<Value> {
        self.get("/api/v1/instances").await["instances"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }
}

/// Whether this process runs as root (its effective uid, from `/proc/self/status`): tests of
/// job isolation need it, and skip with one line when it is not there (CI runs as root).
pub fn running_as_root() -> bool {
    uid_of(std::process::id() as i32) == Some(0)
}

/// The effective uid of a live process, from `/proc/PID/status`.
pub fn uid_of(pid: i32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// An RFC 3339 time `secs` from now, for deadlines.
pub fn in_secs(secs: u64) -> String {
    chrono::DateTime::<chrono::Utc>::from(std::time::SystemTime::now() + Duration::from_secs(secs))
        .to_rfc3339()
}

/// Opens `dir` (made if missing) to the jobs' own uids: agents that run as root run each job
/// as an unprivileged uid of its own, so a directory a job writes its marks into must be
/// world-writable and its parent traversable. `parent` is that parent (a
/// test's private temp dir, mode 0700 until now).
pub fn open_to_jobs(parent: &Path, dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir).unwrap();
    // Not sticky: see `Broker::job_writable_dir`.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    std::fs::set_permissions(parent, std::fs::Permissions::from_mode(0o711)).unwrap();
}

/// Closed-loop callers of a service: each sends `body` to `url` with `token`, waits for the
/// whole answer, and sends the next, until stopped. Every failure is kept with when it
/// happened (seconds since `t0`) and why.
pub struct Callers {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    ok: std::sync::Arc<std::sync::atomic::AtomicU64>,
    failures: std::sync::Arc<std::sync::Mutex<Vec<(f64, String)>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Callers {
    pub fn start(url: &str, token: &str, callers: usize, body: Value, t0: Instant) -> Callers {
        use std::sync::atomic::Ordering;
        let stop: std::sync::Arc<std::sync::atomic::AtomicBool> = Default::default();
        let ok: std::sync::Arc<std::sync::atomic::AtomicU64> = Default::default();
        let failures: std::sync::Arc<std::sync::Mutex<Vec<(f64, String)>>> = Default::default();
        let client = reqwest::Client::new();
        let tasks = (0..callers)
            .map(|_| {
                let (stop, ok, failures) = (stop.clone(), ok.clone(), failures.clone());
                let (client, url, token, body) = (
                    client.clone(),
                    url.to_string(),
                    token.to_string(),
                    body.clone(),
                );
                tokio::spawn(async move {
                    while !stop.load(Ordering::SeqCst) {
                        let r = client
                            .post(&url)
                            .bearer_auth(&token)
                            .json(&body)
                            .timeout(Duration::from_secs(60))
                            .send()
                            .await;
                        let failure = match r {
                            Ok(r) if r.status().is_success() => match r.bytes().await {
                                Ok(_) => None,
                                Err(e) => Some(format!("body: {e}")),
                            },
                            Ok(r) => {
                                let status = r.status();
                                Some(format!("{status} {}", r.text().await.unwrap_or_default()))
                            }
                            Err(e) => Some(e.to_string()),
                        };
                        match failure {
                            None => {
                                ok.fetch_add(1, Ordering::SeqCst);
                            }
                            Some(why) => {
                                let at = t0.elapsed().as_secs_f64();
                                failures.lock().unwrap().push((at, why));
                                // A failing gateway answers at once: do not spin.
                                tokio::time::sleep(Duration::from_millis(20)).await;
                            }
                        }
                    }
                })
            })
            .collect();
        Callers {
            stop,
            ok,
            failures,
            tasks,
        }
    }

    /// Answers so far.
    pub fn ok(&self) -> u64 {
        self.ok.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Stops the callers; the answers and the failures.
    pub async fn stop(self) -> (u64, Vec<(f64, String)>) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        for t in self.tasks {
            t.await.unwrap();
        }
        let failures = self.failures.lock().unwrap().clone();
        (self.ok.load(std::sync::atomic::Ordering::SeqCst), failures)
    }
}

//! Tests of the local provider with real processes: a `/bin/sh` stand-in agent that prints its
//! argv (and pids) to its log file. No fixed sleeps: every wait polls with a deadline.

#![allow(clippy::unwrap_used)]

use super::*;
use std::time::Instant;
use switchyard_core::{Money, RegionId, Timestamp};

const POOL: &str = "local:sim-1/h100x8";
/// Prints the real argv, then becomes a long sleep (so `$$` is the process that stays).
const ECHO_AGENT: &str = r#"echo started "$@"; exec sleep 300"#;
/// Leaves a second member in the process group, and says which pids to watch.
const FORKING_AGENT: &str =
    r#"sleep 300 & echo child $!; echo leader $$; echo started "$@"; exec sleep 300"#;
/// Ignores SIGTERM (the ignore survives exec), so only SIGKILL ends it.
const STUBBORN_AGENT: &str = r#"trap "" TERM; echo leader $$; echo started "$@"; exec sleep 300"#;
const WAIT: Duration = Duration::from_secs(10);

fn region() -> Region {
    Region {
        id: RegionId::new("local:sim-1"),
        provider: "local".into(),
        code: "sim-1".into(),
        latitude: None,
        longitude: None,
        egress_per_gb: Money::ZERO,
        latency_ms: 1,
        ingress_gbps: 10,
    }
}

fn pool() -> Pool {
    Pool {
        id: PoolId::new(POOL),
        region: RegionId::new("local:sim-1"),
        provider: "local".into(),
        instance_type: "h100x8".into(),
        gpu_model: "H100".into(),
        gpus_per_node: 8,
        gpu_memory_gb: 80,
        vcpus: 32,
        memory_gb: 256,
        on_demand_per_hour: Money::from_micros(20_000_000),
        spot_per_hour: None,
        node_limit: 4,
        launchable: true,
        boot_time_s: 1,
        price_updated_at: Timestamp::from_secs(0),
        recent_capacity_failures: 0,
        marginal_per_hour: None,
    }
}

struct Fixture {
    provider: LocalProvider,
    dir: tempfile::TempDir,
}

fn fixture(script: &str, boot_delay: Duration) -> Fixture {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = LocalConfig {
        agent_program: "/bin/sh".into(),
        agent_args: ["-c", script, "sh", "agent"].map(String::from).to_vec(),
        boot_delay,
        log_dir: dir.path().join("logs"),
        regions: vec![region()],
        pools: vec![pool()],
        extra_agent_args: [(
            "onprem-faulty".to_string(),
            vec!["--fake-gpu-fault".to_string(), "2:xid=79@30s".to_string()],
        )]
        .into(),
    };
    Fixture {
        provider: LocalProvider::new(config),
        dir,
    }
}

impl Fixture {
    fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join("logs").join(format!("{name}.log")))
            .unwrap_or_default()
    }

    /// Waits until the log of `name` has a line starting with `started`, and returns the log.
    async fn wait_started(&self, name: &str) -> String {
        let mut log = String::new();
        wait_for(&format!("{name} to start"), || {
            log = self.log(name);
            log.lines().any(|l| l.starts_with("started"))
        })
        .await;
        log
    }

    fn state(&self, provider_id: &str) -> Option<InstanceState> {
        self.provider
            .shared
            .lock()
            .instances
            .get(provider_id)
            .map(|i| i.info.state)
    }
}

fn request(key: &str) -> LaunchRequest {
    LaunchRequest {
        pool: PoolId::new(POOL),
        market: Market::Spot,
        instance_key: key.into(),
        enrolment_token: format!("tok-{key}"),
        broker_url: "http://127.0.0.1:9".into(),
    }
}

async fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Alive: the process exists and is not a zombie (a killed orphan may wait a moment for init).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // "pid (comm) S ...": the state follows the last ')'.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
            .is_some_and(|state| state != 'Z' && state != 'X'),
        Err(_) => false,
    }
}

async fn wait_gone(pid: u32) {
    wait_for(&format!("pid {pid} to be gone"), || !alive(pid)).await;
}

fn pid_in(log: &str, label: &str) -> u32 {
    log.lines()
        .find_map(|l| l.strip_prefix(label)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no `{label}` line in {log:?}"))
}

#[tokio::test]
async fn launch_starts_the_agent_after_the_boot_delay_with_its_command_line() {
    let boot = Duration::from_millis(300);
    let f = fixture(ECHO_AGENT, boot);
    let t0 = Instant::now();
    let info = f.provider.launch(&request("inst-1")).await.expect("launch");
    assert_eq!(info.state, InstanceState::Pending);
    assert_eq!(
        (info.instance_key.as_str(), info.pool.as_str()),
        ("inst-1", POOL)
    );
    assert_eq!(info.market, Market::Spot);
    assert!(
        info.provider_id.starts_with("local-"),
        "{}",
        info.provider_id
    );
    assert_eq!(
        f.provider.pid(&info.provider_id),
        None,
        "no process before the boot delay"
    );

    let log = f.wait_started("inst-1").await;
    assert!(t0.elapsed() >= boot, "started after {:?}", t0.elapsed());
    assert_eq!(
        log.trim(),
        "started agent --broker http://127.0.0.1:9 --exit-on-stdin-eof \
         --fake-gpus 8xH100-80GB --name inst-1"
    );
    wait_for("Running", || f.provider.pid(&info.provider_id).is_some()).await;
    let listed = f.provider.list().await.expect("list");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].state, InstanceState::Running);
    assert_eq!(listed[0].provider_id, info.provider_id);
    let pid = f.provider.pid(&info.provider_id).expect("pid");
    assert!(alive(pid));

    f.provider
        .terminate(&info.provider_id)
        .await
        .expect("terminate");
    assert!(!alive(pid));
}

/// Says where its enrolment token came from and what its stdin is, then stays.
const INSPECTING_AGENT: &str = r#"echo "token=$SWITCHYARD_ENROL_TOKEN"; echo "stdin=$(readlink /proc/$$/fd/0)"; echo started "$@"; exec sleep 300"#;

#[tokio::test]
async fn the_token_is_in_the_agents_environment_not_its_command_line() {
    let f = fixture(INSPECTING_AGENT, Duration::ZERO);
    let info = f.provider.launch(&request("env-1")).await.expect("launch");
    let pool = PoolId::new(POOL);
    let onprem = f
        .provider
        .spawn_static_agent("onprem-env", &pool, "tok-static", "http://127.0.0.1:9")
        .await
        .expect("static agent");
    for (name, token) in [("env-1", "tok-env-1"), ("onprem-env", "tok-static")] {
        let log = f.wait_started(name).await;
        assert!(log.contains(&format!("token={token}\n")), "{log}");
        assert!(log.contains("stdin=pipe:["), "stdin is a pipe: {log}");
        let argv = log.lines().find(|l| l.starts_with("started")).unwrap();
        assert!(!argv.contains(token), "{argv}");
        assert!(argv.contains("--exit-on-stdin-eof"), "{argv}");
        // Not in the process table either: what `ps` shows is the command line.
        let pid = pid_of(&f, name).await;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
        assert!(!String::from_utf8_lossy(&cmdline).contains(token));
    }
    f.provider
        .terminate(&info.provider_id)
        .await
        .expect("terminate");
    f.provider
        .terminate(&onprem.provider_id)
        .await
        .expect("terminate");
}

/// `up`'s `--fake-gpu-fault` reaches the agent it names, and only that one.
#[tokio::test]
async fn extra_arguments_reach_the_agent_they_name() {
    let f = fixture(ECHO_AGENT, Duration::ZERO);
    let pool = PoolId::new(POOL);
    let mut started = Vec::new();
    for name in ["onprem-faulty", "onprem-fine"] {
        started.push(
            f.provider
                .spawn_static_agent(name, &pool, "tok", "http://127.0.0.1:9")
                .await
                .expect("static agent"),
        );
    }
    let faulty = f.wait_started("onprem-faulty").await;
    let argv = faulty.lines().find(|l| l.starts_with("started")).unwrap();
    assert!(
        argv.ends_with("--name onprem-faulty --fake-gpu-fault 2:xid=79@30s"),
        "{argv}"
    );
    let fine = f.wait_started("onprem-fine").await;
    assert!(!fine.contains("--fake-gpu-fault"), "{fine}");
    for info in started {
        f.provider
            .terminate(&info.provider_id)
            .await
            .expect("terminate");
    }
}

/// The pid of the agent named `name` once it runs.
async fn pid_of(f: &Fixture, name: &str) -> u32 {
    let mut pid = None;
    wait_for(&format!("{name} to run"), || {
        let state = f.provider.shared.lock();
        pid = state
            .instances
            .values()
            .find(|i| i.info.instance_key == name)
            .and_then(|i| i.pid);
        pid.is_some()
    })
    .await;
    pid.unwrap()
}

/// Waits for end of file on stdin, says so, and exits: the agent's `--exit-on-stdin-eof`.
const EOF_AGENT: &str =
    r#"echo leader $$; echo started "$@"; cat >/dev/null; echo "stdin closed"; exit 0"#;

/// The supervisor holds the agent's stdin for as long as the agent should run: while it runs,
/// the agent sees no end of file. When the supervisor goes without a stop (here the runtime
/// that ran it goes away, as everything does when `switchyard up` is killed), the pipe closes
/// and the agent, reading end of file, exits by itself.
#[test]
fn an_agent_sees_end_of_file_only_when_its_supervisor_is_gone() {
    let f = fixture(EOF_AGENT, Duration::ZERO);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let leader = rt.block_on(async {
        f.provider.launch(&request("eof-1")).await.expect("launch");
        let leader = pid_in(&f.wait_started("eof-1").await, "leader");
        // Long enough for `cat` to have read an end of file, were there one.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !f.log("eof-1").contains("stdin closed"),
            "{}",
            f.log("eof-1")
        );
        assert!(alive(leader));
        leader
    });
    rt.shutdown_background();
    let deadline = Instant::now() + WAIT;
    while !f.log("eof-1").contains("stdin closed") || alive(leader) {
        assert!(
            Instant::now() < deadline,
            "the agent did not exit on end of file: {}",
            f.log("eof-1")
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[tokio::test]
async fn launch_is_idempotent_on_the_instance_key() {
    let f = fixture(ECHO_AGENT, Duration::from_millis(100));
    let first = f.provider.launch(&request("same")).await.expect("launch");
    let second = f
        .provider
        .launch(&request("same"))
        .await
        .expect("launch again");
    assert_eq!(first, second);
    f.wait_started("same").await;
    wait_for("Running", || f.provider.pid(&first.provider_id).is_some()).await;

    let third = f
        .provider
        .launch(&request("same"))
        .await
        .expect("launch once more");
    assert_eq!(third.provider_id, first.provider_id);
    assert_eq!(third.state, InstanceState::Running);
    assert_eq!(f.provider.list().await.expect("list").len(), 1);
    assert_eq!(f.provider.shared.lock().instances.len(), 1);

    f.provider
        .terminate(&first.provider_id)
        .await
        .expect("terminate");
    assert_eq!(
        f.log("same")
            .lines()
            .filter(|l| l.starts_with("started"))
            .count(),
        1
    );
    // The key stays bound to its (now terminated) instance: no second process.
    let after = f
        .provider
        .launch(&request("same"))
        .await
        .expect("launch after terminate");
    assert_eq!(after.provider_id, first.provider_id);
    assert_eq!(after.state, InstanceState::Terminated);
    assert!(f.provider.list().await.expect("list").is_empty());
}

#[tokio::test]
async fn terminate_kills_the_whole_process_group() {
    let f = fixture(FORKING_AGENT, Duration::ZERO);
    let info = f.provider.launch(&request("fork")).await.expect("launch");
    let log = f.wait_started("fork").await;
    let (leader, child) = (pid_in(&log, "leader"), pid_in(&log, "child"));
    wait_for("Running", || {
        f.provider.pid(&info.provider_id) == Some(leader)
    })
    .await;
    assert!(alive(leader) && alive(child));

    f.provider
        .terminate(&info.provider_id)
        .await
        .expect("terminate");
    assert!(
        !alive(leader),
        "the leader is reaped before terminate returns"
    );
    wait_gone(child).await;
    assert_eq!(f.state(&info.provider_id), Some(InstanceState::Terminated));
    assert!(f.provider.list().await.expect("list").is_empty());

    // Already gone, and never known: both succeed.
    f.provider
        .terminate(&info.provider_id)
        .await
        .expect("terminate again");
    f.provider
        .terminate("local-no-such-id")
        .await
        .expect("terminate unknown");
}

#[tokio::test]
async fn an_agent_ignoring_sigterm_is_killed_after_the_grace_period() {
    let grace = Duration::from_millis(300);
    let f = fixture(STUBBORN_AGENT, Duration::ZERO);
    let provider = f.provider.with_stop_grace(grace);
    let f = Fixture {
        provider,
        dir: f.dir,
    };
    let info = f
        .provider
        .launch(&request("stubborn"))
        .await
        .expect("launch");
    let leader = pid_in(&f.wait_started("stubborn").await, "leader");
    wait_for("Running", || f.provider.pid(&info.provider_id).is_some()).await;

    let t0 = Instant::now();
    f.provider
        .terminate(&info.provider_id)
        .await
        .expect("terminate");
    assert!(t0.elapsed() >= grace, "killed after {:?}", t0.elapsed());
    assert!(!alive(leader));
}

#[tokio::test]
async fn terminate_before_the_boot_delay_never_starts_the_process() {
    let f = fixture(ECHO_AGENT, Duration::from_secs(30));
    let info = f.provider.launch(&request("early")).await.expect("launch");
    let t0 = Instant::now();
    f.provider
        .terminate(&info.provider_id)
        .await
        .expect("terminate");
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "terminate waited for the boot delay"
    );
    assert_eq!(f.state(&info.provider_id), Some(InstanceState::Terminated));
    assert!(
        f.log("early").is_empty(),
        "the agent was started: {}",
        f.log("early")
    );
    assert!(f.provider.list().await.expect("list").is_empty());
}

#[tokio::test]
async fn an_agent_that_exits_by_itself_is_reaped_and_left_out_of_list() {
    // It leaves a child behind, which must not outlive it.
    let f = fixture(
        r#"sleep 300 & echo child $!; echo started "$@"; exit 3"#,
        Duration::ZERO,
    );
    let info = f
        .provider
        .launch(&request("quitter"))
        .await
        .expect("launch");
    let orphan = pid_in(&f.wait_started("quitter").await, "child");
    let mut listed = vec![info.clone()];
    let deadline = Instant::now() + WAIT;
    while !listed.is_empty() {
        assert!(Instant::now() < deadline, "still listed: {listed:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
        listed = f.provider.list().await.expect("list");
    }
    assert_eq!(f.state(&info.provider_id), Some(InstanceState::Terminated));
    wait_gone(orphan).await;
    let again = f
        .provider
        .launch(&request("quitter"))
        .await
        .expect("launch again");
    assert_eq!(
        (again.provider_id, again.state),
        (info.provider_id, InstanceState::Terminated)
    );
}

#[tokio::test]
async fn an_agent_that_cannot_start_ends_up_terminated() {
    let mut f = fixture(ECHO_AGENT, Duration::ZERO);
    let mut config = f.provider.config().clone();
    config.agent_program = f.dir.path().join("no-such-agent");
    f.provider = LocalProvider::new(config);
    let info = f
        .provider
        .launch(&request("ghost"))
        .await
        .expect("launch is accepted");
    assert_eq!(info.state, InstanceState::Pending);
    wait_for("Terminated", || {
        f.state(&info.provider_id) == Some(InstanceState::Terminated)
    })
    .await;
    assert!(f.provider.list().await.expect("list").is_empty());
    // A static agent fails at once, with the reason.
    let res = f
        .provider
        .spawn_static_agent("ghost-2", &PoolId::new(POOL), "tok", "http://127.0.0.1:9")
        .await;
    assert!(
        matches!(res, Err(ProviderError::Transient(ref m)) if m.contains("ghost-2")),
        "{res:?}"
    );
}

#[tokio::test]
async fn static_agents_start_at_once_and_shutdown_stops_everything_in_parallel() {
    // Every process ignores SIGTERM, so each one costs a full grace period: stopping three one
    // after the other would take 3 s, in parallel about 1 s.
    let grace = Duration::from_secs(1);
    let f = fixture(STUBBORN_AGENT, Duration::ZERO);
    let f = Fixture {
        provider: f.provider.with_stop_grace(grace),
        dir: f.dir,
    };
    let pool = PoolId::new(POOL);
    let onprem = f
        .provider
        .spawn_static_agent("onprem-1", &pool, "tok-s", "http://127.0.0.1:9")
        .await
        .expect("static agent");
    assert_eq!(onprem.state, InstanceState::Running);
    assert_eq!(onprem.instance_key, "onprem-1");
    let again = f
        .provider
        .spawn_static_agent("onprem-1", &pool, "tok-s", "http://127.0.0.1:9")
        .await
        .expect("same static agent");
    assert_eq!(again.provider_id, onprem.provider_id);

    let a = f
        .provider
        .launch(&request("burst-a"))
        .await
        .expect("launch a");
    let b = f
        .provider
        .launch(&request("burst-b"))
        .await
        .expect("launch b");
    let mut pids = Vec::new();
    for name in ["onprem-1", "burst-a", "burst-b"] {
        let log = f.wait_started(name).await;
        assert!(log.contains(&format!("--name {name}")), "{log}");
        pids.push(pid_in(&log, "leader"));
    }
    assert_eq!(f.provider.pid(&onprem.provider_id), Some(pids[0]));
    wait_for("both launched Running", || {
        f.provider.pid(&a.provider_id).is_some() && f.provider.pid(&b.provider_id).is_some()
    })
    .await;
    // The static agent is not a launched instance.
    let listed: Vec<String> = f
        .provider
        .list()
        .await
        .expect("list")
        .into_iter()
        .map(|i| i.instance_key)
        .collect();
    assert_eq!(listed, ["burst-a", "burst-b"]);

    let t0 = Instant::now();
    f.provider.shutdown().await;
    let took = t0.elapsed();
    assert!(
        took >= grace && took < grace * 5 / 2,
        "shutdown took {took:?}"
    );
    for pid in pids {
        assert!(!alive(pid), "pid {pid} survived shutdown");
    }
    assert!(f.provider.list().await.expect("list").is_empty());
    assert!(matches!(
        f.provider.launch(&request("late")).await,
        Err(ProviderError::Transient(_))
    ));
    assert!(
        f.provider
            .spawn_static_agent("onprem-2", &pool, "tok", "http://127.0.0.1:9")
            .await
            .is_err()
    );
}

#[tokio::test]
async fn unknown_pools_are_refused() {
    let f = fixture(ECHO_AGENT, Duration::ZERO);
    let mut req = request("lost");
    req.pool = PoolId::new("local:sim-1/nope");
    match f.provider.launch(&req).await {
        Err(ProviderError::UnknownPool(p)) => assert_eq!(p, req.pool),
        other => panic!("{other:?}"),
    }
    let res = f
        .provider
        .spawn_static_agent("x", &req.pool, "tok", "http://127.0.0.1:9")
        .await;
    assert!(matches!(res, Err(ProviderError::UnknownPool(_))), "{res:?}");
    assert!(f.provider.list().await.expect("list").is_empty());
    assert!(f.provider.shared.lock().instances.is_empty());
}

#[tokio::test]
async fn offers_are_the_configured_regions_and_pools() {
    let f = fixture(ECHO_AGENT, Duration::ZERO);
    assert_eq!(f.provider.name(), "local");
    let offers = f.provider.offers().await.expect("offers");
    assert_eq!(offers.regions, vec![region()]);
    assert_eq!(offers.pools, vec![pool()]);
}

#[test]
fn fake_gpu_declarations_round_trip_through_core() {
    use switchyard_core::gpu_model::parse_declaration;
    let mut p = pool();
    assert_eq!(fake_gpus(&p).as_deref(), Some("8xH100-80GB"));
    assert_eq!(
        parse_declaration("8xH100-80GB"),
        Some((8, "H100".into(), 80))
    );
    p.gpu_model = "A100-80GB".into();
    let decl = fake_gpus(&p).expect("declaration");
    assert_eq!(parse_declaration(&decl), Some((8, "A100-80GB".into(), 80)));
    p.gpu_model = "RTX5090".into();
    p.gpus_per_node = 2;
    p.gpu_memory_gb = 32;
    let decl = fake_gpus(&p).expect("declaration");
    assert_eq!(parse_declaration(&decl), Some((2, "RTX5090".into(), 32)));
    p.gpus_per_node = 0;
    assert_eq!(fake_gpus(&p), None);
}

#[test]
fn log_file_names_stay_in_the_log_directory() {
    assert_eq!(log_file_name("inst-1"), "inst-1.log");
    assert_eq!(log_file_name("0190c0de.a_b"), "0190c0de.a_b.log");
    assert_eq!(log_file_name("../etc/passwd"), "_.._etc_passwd.log");
    assert_eq!(log_file_name(".hidden"), "_.hidden.log");
    assert_eq!(log_file_name(""), "_.log");
}

//! Bursting end to end on one machine: `switchyard up` with one on-prem agent; when it is full
//! and a deadline cannot wait, the local provider launches an agent process as a cloud
//! instance, the job runs there, the idle instance is terminated and billed; an instance killed
//! mid-job has its job requeued onto a new instance; and no token of the run reaches a log.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::json;
use std::time::Duration;
use switchyard_tests::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tight_deadline_bursts_to_a_new_instance_that_is_released_when_idle() {
    let up = Up::start(
        &[
            "--agents",
            "1",
            "--idle-ttl",
            "2s",
            "--boot-delay",
            "1s",
            "--billing-minimum",
            "0s",
        ],
        4,
    )
    .await;
    // Every agent's enrolment token, sampled all through the run: instances live for seconds,
    // so one look at the end would miss the ones already terminated.
    let tokens = TokenWatch::start();
    // Fill on-prem for two hours (as far as the planner knows).
    let filler = up
        .submit(json!({"name": "filler", "team": "ml", "command": ["sleep", "3031"], "resources": {"gpus": 4},
                       "estimated_runtime_s": 7200, "regions": ["onprem:local-dc1"]}))
        .await;
    up.job_where(&filler, 30, |j| j["state"] == "running").await;

    // A one-GPU job due in 15 minutes cannot wait two hours: it bursts.
    let urgent = up
        .submit(json!({"name": "urgent", "team": "ml", "command": ["echo", "ran in the cloud"],
                       "resources": {"gpus": 1}, "estimated_runtime_s": 60, "deadline": in_secs(900)}))
        .await;
    let job = up
        .job_where(&urgent, 60, |j| {
            j["state"] == "succeeded" || j["state"] == "failed"
        })
        .await;
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_ne!(job["placement"]["region"], "onprem:local-dc1", "{job}");
    let logs = up.get(&format!("/api/v1/jobs/{urgent}/logs")).await;
    assert_eq!(logs["entries"][0]["text"], "ran in the cloud\n");
    let instance = up
        .instances()
        .await
        .into_iter()
        .find(|i| i["for_job"] == urgent.as_str())
        .unwrap();
    assert_eq!(
        job["placement"]["pool"], instance["pool"],
        "it ran on the instance launched for it"
    );
    assert_eq!(job["placement"]["node"], instance["node"]);

    // The instance goes idle and is terminated after the 2 s TTL, with its cost recorded.
    let inst = eventually(
        "the idle instance to end",
        Duration::from_secs(30),
        || async {
            let all = up.instances().await;
            let i = all
                .iter()
                .find(|i| i["for_job"] == urgent.as_str())?
                .clone();
            (i["state"] == "terminated").then_some(i)
        },
    )
    .await;
    // A normal idle shutdown is not an error.
    assert!(
        inst["end_reason"]
            .as_str()
            .unwrap()
            .starts_with("idle: no job for"),
        "{inst}"
    );
    assert!(inst["last_error"].is_null(), "{inst}");
    assert!(inst["cost_usd"].as_f64().unwrap() > 0.0, "{inst}");
    assert!(inst["ready_at"].is_string() && inst["launched_at"].is_string());
    let name = inst["id"].as_str().unwrap().to_string();
    eventually(
        "the instance's agent process to be gone",
        Duration::from_secs(10),
        || async { processes_matching(&name).is_empty().then_some(()) },
    )
    .await;

    // A burst instance killed mid-job: its job is requeued onto a new instance and completes.
    let second = up
        .submit(json!({"name": "doomed", "team": "ml", "command": ["sh", "-c", "sleep 2; echo survived"],
                       "resources": {"gpus": 1}, "estimated_runtime_s": 60, "deadline": in_secs(900)}))
        .await;
    up.job_where(&second, 60, |j| j["state"] == "running").await;
    let first_instance = up
        .instances()
        .await
        .into_iter()
        .find(|i| i["for_job"] == second.as_str())
        .unwrap();
    let key = first_instance["id"].as_str().unwrap().to_string();
    let agents = processes_matching(&key);
    assert!(!agents.is_empty(), "the instance's agent runs");
    for (pid, _) in agents {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    let job = up
        .job_where(&second, 90, |j| {
            j["state"] == "succeeded" || j["state"] == "failed"
        })
        .await;
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(job["attempts"], 2, "{job}");
    let all = up.instances().await;
    let killed = all.iter().find(|i| i["id"] == key.as_str()).unwrap();
    assert_eq!(killed["state"], "terminated");
    assert!(
        all.iter()
            .filter(|i| i["for_job"] == second.as_str())
            .count()
            >= 2
    );

    // Nothing leaked: every instance process the broker does not count as live is gone.
    eventually(
        "only live instances to have processes",
        Duration::from_secs(20),
        || async {
            let all = up.instances().await;
            let leaked = all
                .iter()
                .filter(|i| i["state"] == "terminated")
                .any(|i| !processes_matching(i["id"].as_str().unwrap()).is_empty());
            (!leaked).then_some(())
        },
    )
    .await;

    // No secret of the run reached a log: the admin token and every enrolment token an agent
    // was started with (the on-prem agent and the instances'). The local agents keep their
    // agent tokens in memory only; `broker/tests/hostile.rs` scans for those in-process.
    let mut secrets = tokens.stop();
    secrets.push(up.token.clone());
    secrets.sort();
    secrets.dedup();
    assert!(
        secrets.len() >= 5,
        "the admin token and 4 enrolment tokens (on-prem, three instances): {}",
        secrets.len()
    );
    let mut lines = 0;
    let mut files = 0;
    for log in files_named(up.dir.path(), ".log") {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        files += 1;
        lines += text.lines().count();
        for secret in &secrets {
            assert!(
                !text.contains(secret.as_str()),
                "{} holds a secret ({}…)",
                log.display(),
                &secret[..6.min(secret.len())]
            );
        }
    }
    assert!(files >= 3 && lines > 0, "{files} log files, {lines} lines");
    eprintln!(
        "secrets scan: {} secrets, none in {lines} lines of {files} log files",
        secrets.len()
    );
}

/// Collects the enrolment token of every agent process seen, looking every 50 ms until
/// stopped. `up` passes it in the agent's environment (`SWITCHYARD_ENROL_TOKEN`); one on an
/// agent's command line (`--enrol-token`, readable by everyone in the process table) is
/// collected too, and fails the test when it is stopped.
struct TokenWatch {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<(std::collections::BTreeSet<String>, Vec<String>)>,
}

impl TokenWatch {
    fn start() -> Self {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut seen = std::collections::BTreeSet::new();
            let mut on_command_lines = Vec::new();
            loop {
                let done = flag.load(std::sync::atomic::Ordering::Relaxed);
                for (pid, cmdline) in processes_matching("--exit-on-stdin-eof") {
                    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
                    for var in environ.split(|b| *b == 0) {
                        if let Some(token) = var.strip_prefix(b"SWITCHYARD_ENROL_TOKEN=") {
                            seen.insert(String::from_utf8_lossy(token).into_owned());
                        }
                    }
                    let mut words = cmdline.split_whitespace();
                    if words.any(|w| w == "--enrol-token") {
                        seen.extend(words.next().map(str::to_string));
                        on_command_lines.push(cmdline.clone());
                    }
                }
                if done {
                    return (seen, on_command_lines);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        Self { stop, thread }
    }

    fn stop(self) -> Vec<String> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let (seen, on_command_lines) = self.thread.join().unwrap();
        assert!(
            on_command_lines.is_empty(),
            "an enrolment token in the process table: {on_command_lines:?}"
        );
        seen.into_iter().collect()
    }
}

/// Every file under `dir` whose name ends with `suffix`.
fn files_named(dir: &std::path::Path, suffix: &str) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let path = e.path();
            if path.is_dir() {
                todo.push(path);
            } else if path.to_string_lossy().ends_with(suffix) {
                found.push(path);
            }
        }
    }
    found
}

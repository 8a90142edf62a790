//! Jobs isolated from their agent and from each other, end to end with a real broker and real
//! agents: a job cannot read its agent's state or token, nor another job's environment, nor
//! forge its agent's reports; its environment holds nothing of the agent's; two jobs on one
//! node run as two uids, neither the agent's, in directories removed after them; and the
//! agents of a `switchyard up` killed with SIGKILL exit by themselves.
//!
//! The isolation tests need root (CI runs as root); elsewhere they say so in one line and pass.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{Value, json};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;
use switchyard_tests::*;

fn needs_root() -> bool {
    if running_as_root() {
        return true;
    }
    eprintln!("skipped: job isolation needs the agent to run as root (CI runs as root)");
    false
}

/// A directory every job uid can look into (not write): the test's gates live there.
fn shared_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

fn sh(name: &str, team: &str, script: &str, argv0: &str) -> Value {
    json!({"name": name, "team": team, "command": ["sh", "-c", script, argv0],
           "resources": {"gpus": 1}})
}

/// The forge attack of issue 23: a job of team A, running beside a job of team B on the same
/// node, tries to read the agent's state file, B's environment and the agent's environment
/// and command line, and then posts a `finished` event for B's attempt with whatever token it
/// found. All of it fails: B runs on and ends with its own exit code and output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_can_neither_read_its_agents_secrets_nor_another_jobs_nor_forge_reports() {
    if !needs_root() {
        return;
    }
    let mut broker = Broker::start().await;
    // The state directory's own mode must protect it: its parent is open to everyone.
    let open = shared_dir();
    let state = open.path().join("agent-state");
    let i = broker
        .start_agent_with(
            "shared-node",
            4,
            &["--state-dir", state.to_str().unwrap()],
            &[],
        )
        .await;
    let agent_pid = broker.agent(i).pid();
    let state_file = state.join("agent.json");
    eventually(
        "the agent to save its enrolment",
        Duration::from_secs(10),
        || async { state_file.exists().then_some(()) },
    )
    .await;
    let gate = shared_dir();

    // B: holds a secret in its environment, says who it is, waits for the gate, ends with 7.
    let b_secret = format!("b-secret-{}", std::process::id());
    let mut b = sh(
        "victim",
        "team-b",
        &format!(
            "echo attempt=$SWITCHYARD_ATTEMPT_ID; while [ ! -e {}/go ]; do sleep 0.1; done; \
             echo b-real-output; exit 7",
            gate.path().display()
        ),
        "forge-victim-b",
    );
    b["env"] = json!({"B_SECRET": b_secret});
    let b_id = broker.submit(b).await;
    broker
        .wait_state(&b_id, &["running"], Duration::from_secs(30))
        .await;
    let b_attempt = eventually("B's attempt id", Duration::from_secs(20), || async {
        let (out, _, _) = broker.logs(&b_id).await;
        out.lines()
            .find_map(|l| l.strip_prefix("attempt="))
            .map(str::to_string)
    })
    .await;

    // A: everything the attacker tried, each step printing what happened.
    let attack = r#"
echo "uid=$(id -u) agent=$PPID"
if cat "$STATE_FILE" >/dev/null 2>&1; then echo "state file: READ"; else echo "state file: denied"; fi
needle="forge-victim-"; needle="${needle}b"
bpid=""
for p in /proc/[0-9]*; do
  pid=${p#/proc/}
  [ "$pid" = "$$" ] && continue
  if tr '\0' ' ' < "$p/cmdline" 2>/dev/null | grep -qF -- "$needle"; then bpid=$pid; fi
done
echo "victim found: ${bpid:-no}"
if [ -n "$bpid" ] && cat "/proc/$bpid/environ" >/dev/null 2>&1; then echo "victim environ: READ"; else echo "victim environ: denied"; fi
if cat "/proc/$PPID/environ" >/dev/null 2>&1; then echo "agent environ: READ"; else echo "agent environ: denied"; fi
token=$( { cat "/proc/$PPID/cmdline" "/proc/$PPID/environ" "$STATE_FILE" "/proc/$bpid/environ"; } 2>/dev/null \
  | tr '\0' '\n' | grep -oE 'sy[a-z]_[A-Za-z0-9_-]+' | head -n 1)
echo "token found: ${token:-none}"
body="{\"events\":[{\"type\":\"finished\",\"attempt\":{\"job_id\":\"$VICTIM_JOB\",\"attempt_id\":\"$VICTIM_ATTEMPT\",\"epoch\":1},\"exit_code\":0,\"signal\":null,\"error\":null,\"stopped\":false}]}"
code=$(curl -s -o /dev/null -w '%{http_code}' -X POST -H "Authorization: Bearer ${token:-none}" \
  -H 'Content-Type: application/json' --data "$body" "$BROKER/agent/v1/events")
echo "forged finish: HTTP $code"
"#;
    assert!(
        Path::new("/usr/bin/curl").exists(),
        "the attack posts with curl"
    );
    let mut a = sh("attacker", "team-a", attack, "attacker");
    a["env"] = json!({
        "STATE_FILE": state_file.to_str().unwrap(),
        "VICTIM_JOB": b_id,
        "VICTIM_ATTEMPT": b_attempt,
        "BROKER": broker.url,
    });
    let a_id = broker.submit(a).await;
    let a_job = broker
        .wait_state(&a_id, &["succeeded", "failed"], Duration::from_secs(30))
        .await;
    let (out, err, _) = broker.logs(&a_id).await;
    assert_eq!(a_job["state"], "succeeded", "{a_job}\n{out}\n{err}");
    let uid = out
        .lines()
        .find_map(|l| l.strip_prefix("uid="))
        .and_then(|l| l.split_whitespace().next())
        .unwrap();
    assert_ne!(uid, "0", "the job runs unprivileged: {out}");
    for want in [
        format!("agent={agent_pid}"),
        "state file: denied".into(),
        "victim environ: denied".into(),
        "agent environ: denied".into(),
        "token found: none".into(),
        "forged finish: HTTP 401".into(),
    ] {
        assert!(out.contains(&want), "no `{want}` in:\n{out}\n{err}");
    }
    assert!(
        !out.contains("victim found: no"),
        "the attacker found B's process (its command line is public): {out}"
    );
    assert!(!out.contains(&b_secret), "{out}");

    // B was not touched: it still runs, then ends as itself.
    assert_eq!(broker.job(&b_id).await["state"], "running");
    std::fs::write(gate.path().join("go"), "").unwrap();
    let b_job = broker
        .wait_state(&b_id, &["succeeded", "failed"], Duration::from_secs(30))
        .await;
    assert_eq!(b_job["state"], "failed", "{b_job}");
    assert_eq!(b_job["exit_code"], 7, "{b_job}");
    let (b_out, _, _) = broker.logs(&b_id).await;
    assert!(b_out.ends_with("b-real-output\n"), "{b_out}");

    // The token stays where the agent put it: owner-only.
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!((mode(&state), mode(&state_file)), (0o700, 0o600));
}

/// A job's environment holds nothing of the agent's (a marker variable, the enrolment token),
/// only the fixed base, its own variables and what `--pass-env` names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobs_environment_holds_nothing_of_the_agents_but_what_is_passed() {
    let mut broker = Broker::start().await;
    broker
        .start_agent_with(
            "clean-env",
            1,
            &["--pass-env", "PASS_ME"],
            &[
                ("SWITCHYARD_TEST_SECRET", "do-not-leak-4242"),
                ("PASS_ME", "passed-on"),
            ],
        )
        .await;
    let mut spec = json!({"name": "env", "team": "ml", "command": ["env"],
                          "resources": {"gpus": 1}});
    spec["env"] = json!({"MINE": "mine"});
    let id = broker.submit(spec).await;
    let job = broker
        .wait_state(&id, &["succeeded", "failed"], Duration::from_secs(30))
        .await;
    assert_eq!(job["state"], "succeeded", "{job}");
    let (out, _, _) = broker.logs(&id).await;
    assert!(!out.contains("do-not-leak-4242"), "{out}");
    assert!(!out.contains("SWITCHYARD_TEST_SECRET"), "{out}");
    assert!(!out.contains("SWITCHYARD_ENROL_TOKEN"), "{out}");
    assert!(!out.contains("sye_"), "an enrolment token: {out}");
    assert!(out.contains("PASS_ME=passed-on\n"), "{out}");
    assert!(out.contains("MINE=mine\n"), "{out}");
    let names: Vec<&str> = out
        .lines()
        .filter_map(|l| l.split_once('=').map(|(n, _)| n))
        .collect();
    let allowed = [
        "PATH",
        "HOME",
        "LANG",
        "TZ",
        "MINE",
        "PASS_ME",
        "SWITCHYARD_JOB_ID",
        "SWITCHYARD_ATTEMPT_ID",
        "CUDA_VISIBLE_DEVICES",
        "TRACEPARENT",
        // Simulated GPUs only: the job's own file for its GPU level (in its directory).
        "SWITCHYARD_GPU_SIM",
    ];
    for name in &names {
        assert!(allowed.contains(name), "`{name}` reached the job: {out}");
    }
}

/// `GET /api/v1/pools` shows the node of an agent that runs as root as isolated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pools_api_marks_an_isolated_node() {
    if !needs_root() {
        return;
    }
    let mut broker = Broker::start().await;
    broker.start_agent_with("isolated", 1, &[], &[]).await;
    let (status, pools) = broker
        .call(reqwest::Method::GET, "/api/v1/pools", None)
        .await;
    assert_eq!(status, 200, "{pools}");
    let pool = pools["pools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"] == POOL)
        .unwrap()
        .clone();
    let mut flags = Vec::new();
    isolation_flags(&pool, &mut flags);
    assert!(
        !flags.is_empty() && flags.iter().all(|f| *f == Value::Bool(true)),
        "every node of the pool says `isolation: true`: {pool}"
    );
}

/// Every value of an `isolation` key anywhere in `v`.
fn isolation_flags(v: &Value, out: &mut Vec<Value>) {
    match v {
        Value::Object(map) => {
            for (k, v) in map {
                if k == "isolation" {
                    out.push(v.clone());
                } else {
                    isolation_flags(v, out);
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| isolation_flags(v, out)),
        _ => {}
    }
}

/// Two jobs at once on one node run as two uids, neither the agent's, each in a directory of
/// its own that is gone once the job has ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_jobs_on_one_node_run_as_two_uids_in_directories_removed_after_them() {
    if !needs_root() {
        return;
    }
    let mut broker = Broker::start().await;
    let i = broker.start_agent_with("two-jobs", 2, &[], &[]).await;
    let agent_uid = uid_of(broker.agent(i).pid()).unwrap();
    let gate = shared_dir();
    let script = format!(
        "id -u; pwd; echo \"home=$HOME\"; touch started-here; \
         while [ ! -e {}/go ]; do sleep 0.1; done",
        gate.path().display()
    );
    let mut ids = Vec::new();
    for name in ["one", "two"] {
        ids.push(broker.submit(sh(name, "ml", &script, name)).await);
    }
    for id in &ids {
        broker
            .wait_state(id, &["running"], Duration::from_secs(30))
            .await;
    }
    // Both run now: their first lines are out, then let them end.
    let mut seen = Vec::new();
    for id in &ids {
        let out = eventually(
            "the job's uid and directory",
            Duration::from_secs(20),
            || async {
                let (out, _, _) = broker.logs(id).await;
                (out.lines().count() >= 3).then_some(out)
            },
        )
        .await;
        let mut lines = out.lines();
        let uid: u32 = lines.next().unwrap().parse().unwrap();
        let dir = lines.next().unwrap().to_string();
        assert_eq!(lines.next().unwrap(), format!("home={dir}"));
        assert!(Path::new(&dir).join("started-here").exists(), "{dir}");
        seen.push((uid, dir));
    }
    std::fs::write(gate.path().join("go"), "").unwrap();
    for id in &ids {
        let job = broker
            .wait_state(id, &["succeeded", "failed"], Duration::from_secs(30))
            .await;
        assert_eq!(job["state"], "succeeded", "{job}");
    }
    assert_ne!(seen[0].0, seen[1].0, "two jobs, two uids: {seen:?}");
    assert_ne!(seen[0].1, seen[1].1);
    for (uid, dir) in &seen {
        assert_ne!(*uid, agent_uid, "a job ran as the agent");
        assert_ne!(*uid, 0);
        assert!(!Path::new(dir).exists(), "{dir} outlived its job");
    }
}

/// `switchyard up` killed with SIGKILL: its agents (and their jobs) do not live on; each reads
/// the end of file of the pipe `up` held and shuts down within seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agents_of_a_killed_up_exit_by_themselves() {
    let mut up = Up::start(&["--agents", "2"], 8).await;
    let port = up.url.rsplit(':').next().unwrap().to_string();
    let broker_arg = format!("http://127.0.0.1:{port}");
    let agents: Vec<i32> = processes_matching("--exit-on-stdin-eof")
        .into_iter()
        .filter(|(_, cmdline)| cmdline.contains(&broker_arg))
        .map(|(pid, _)| pid)
        .collect();
    assert_eq!(agents.len(), 2, "the agents of this `up`: {agents:?}");
    let job = up
        .submit(
            json!({"name": "long", "team": "ml", "command": ["sleep", "3033"],
                       "resources": {"gpus": 1}}),
        )
        .await;
    up.job_where(&job, 30, |j| j["state"] == "running").await;
    assert!(!processes_matching("sleep 3033").is_empty());

    // Only `up` itself: its agents are in process groups of their own.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(up.proc.pid()),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    up.proc.wait_exit(Duration::from_secs(10)).unwrap();
    eventually(
        "the agents and their job to exit",
        Duration::from_secs(30),
        || async {
            let left: Vec<i32> = agents
                .iter()
                .copied()
                .filter(|pid| uid_of(*pid).is_some() && !is_zombie(*pid))
                .collect();
            (left.is_empty() && processes_matching("sleep 3033").is_empty()).then_some(())
        },
    )
    .await;
}

fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map(|s| {
            s.lines()
                .any(|l| l.starts_with("State:") && l.contains('Z'))
        })
        .unwrap_or(true)
}

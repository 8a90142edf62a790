//! End to end with real processes: a `switchyard serve` broker, `switchyard-agent` processes
//! with simulated GPUs, and jobs that are real child processes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::json;
use std::time::{Duration, Instant};
use switchyard_tests::*;

fn spec(name: &str, command: &[&str], gpus: u32) -> serde_json::Value {
    json!({"name": name, "team": "ml", "command": command, "resources": {"gpus": gpus}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_run_as_real_processes_and_report_back() {
    let mut broker = Broker::start().await;
    broker.start_agent("agent-a", 4).await;

    // Prints on both streams, sees its GPUs and env, exits 0.
    let mut ok = spec(
        "hello",
        &[
            "sh",
            "-c",
            "echo hello from GPUs $CUDA_VISIBLE_DEVICES mode=$MODE; echo oops >&2",
        ],
        2,
    );
    ok["env"] = json!({"MODE": "e2e"});
    let id = broker.submit(ok).await;
    let job = broker
        .wait_state(&id, &["succeeded", "failed"], Duration::from_secs(30))
        .await;
    assert_eq!(job["state"], "succeeded", "{job}\n{}", broker.dump_logs());
    assert_eq!(job["exit_code"], 0);
    assert_eq!(job["placement"]["pool"], POOL);
    let (out, err, _) = broker.logs(&id).await;
    assert_eq!(out, "hello from GPUs 0,1 mode=e2e\n");
    assert_eq!(err, "oops\n");

    // Exits 3: failed, with its code.
    let id = broker
        .submit(spec("three", &["sh", "-c", "exit 3"], 1))
        .await;
    let job = broker
        .wait_state(&id, &["succeeded", "failed"], Duration::from_secs(30))
        .await;
    assert_eq!(job["state"], "failed");
    assert_eq!(job["exit_code"], 3);

    // A program that does not exist: failed with the reason in its logs; the agent carries on.
    let id = broker
        .submit(spec(
            "missing",
            &["/nonexistent/switchyard-no-such-binary"],
            1,
        ))
        .await;
    let job = broker
        .wait_state(&id, &["succeeded", "failed"], Duration::from_secs(30))
        .await;
    assert_eq!(job["state"], "failed", "{job}");
    let (_, _, system) = broker.logs(&id).await;
    assert!(
        system.contains("/nonexistent/switchyard-no-such-binary"),
        "the reason names the program: {system:?}"
    );
    let id = broker
        .submit(spec("after", &["echo", "still", "here"], 1))
        .await;
    let job = broker
        .wait_state(&id, &["succeeded", "failed"], Duration::from_secs(30))
        .await;
    assert_eq!(job["state"], "succeeded");
    assert_eq!(broker.logs(&id).await.0, "still here\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_kills_the_whole_process_group_within_the_grace_period() {
    let mut broker = Broker::start().await;
    broker.start_agent("agent-c", 4).await;

    // A job that spawns a child, and one that ignores SIGTERM (SIGKILL after the 2 s grace).
    let polite = broker
        .submit(spec(
            "polite",
            &["sh", "-c", "sleep 3011 & sleep 3012; wait"],
            1,
        ))
        .await;
    let stubborn = broker
        .submit(spec(
            "stubborn",
            &["sh", "-c", "trap '' TERM; sleep 3013 & wait; sleep 3014"],
            1,
        ))
        .await;
    for id in [&polite, &stubborn] {
        broker
            .wait_state(id, &["running"], Duration::from_secs(30))
            .await;
    }
    eventually(
        "the job processes to start",
        Duration::from_secs(10),
        || async { (processes_matching("sleep 301").len() >= 3).then_some(()) },
    )
    .await;

    let started = Instant::now();
    for id in [&polite, &stubborn] {
        let (status, body) = broker
            .call(
                reqwest::Method::POST,
                &format!("/api/v1/jobs/{id}/cancel"),
                None,
            )
            .await;
        assert_eq!(status, 202, "{body}");
    }
    for id in [&polite, &stubborn] {
        let job = broker
            .wait_state(
                id,
                &["cancelled", "failed", "succeeded"],
                Duration::from_secs(20),
            )
            .await;
        assert_eq!(job["state"], "cancelled", "{job}");
    }
    eventually(
        "every job process to be gone",
        Duration::from_secs(10),
        || async { processes_matching("sleep 301").is_empty().then_some(()) },
    )
    .await;
    // Grace is 2 s: both are gone well before the 10 s a default grace would take.
    let took = started.elapsed();
    assert!(took < Duration::from_secs(8), "stopping took {took:?}");
}

/// A critical job due soon takes the node from low-priority work: the real agent sends the
/// low job SIGTERM (its checkpoint signal), the job saves and exits, is requeued with its
/// progress noted, and resumes after the urgent job is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_urgent_job_preempts_low_work_through_the_real_agent() {
    let mut broker = Broker::start().await;
    broker.start_agent("agent-p", 4).await;

    let mut low = spec(
        "low",
        &[
            "sh",
            "-c",
            "trap 'echo checkpoint saved; exit 0' TERM; echo working; sleep 3021 & wait",
        ],
        4,
    );
    low["priority"] = json!("low");
    low["estimated_runtime_s"] = json!(36_000);
    let low = broker.submit(low).await;
    broker
        .wait_state(&low, &["running"], Duration::from_secs(30))
        .await;

    let mut urgent = spec("urgent", &["echo", "urgent done"], 4);
    urgent["priority"] = json!("critical");
    urgent["estimated_runtime_s"] = json!(60);
    urgent["deadline"] = json!(in_secs(600));
    let urgent = broker.submit(urgent).await;
    let job = broker
        .wait_state(&urgent, &["succeeded", "failed"], Duration::from_secs(30))
        .await;
    assert_eq!(job["state"], "succeeded", "{job}\n{}", broker.dump_logs());
    assert_eq!(broker.logs(&urgent).await.0, "urgent done\n");

    // The victim checkpointed on SIGTERM, was requeued with its progress noted, and runs again
    // on its second attempt.
    let victim = broker
        .wait_state(&low, &["running"], Duration::from_secs(30))
        .await;
    assert_eq!(victim["attempts"], 2, "{victim}");
    let (out, _, _) = broker.logs(&low).await;
    assert!(out.contains("working\ncheckpoint saved\n"), "{out:?}");
    eventually(
        "the second attempt's log",
        Duration::from_secs(10),
        || async {
            let (out, _, _) = broker.logs(&low).await;
            (out.matches("working").count() == 2).then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switchyard_up_runs_a_federation_and_ctrl_c_stops_it_all() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let data = dir.path().join("state");
    let mut cmd = std::process::Command::new(bin("switchyard"));
    cmd.args(["up", "--port", &port.to_string(), "--data-dir"])
        .arg(&data);
    let mut up = Proc::spawn("up", cmd, &dir.path().join("up.log")).unwrap();

    let cli = |args: &[&str]| {
        let out = std::process::Command::new(bin("switchyard"))
            .args(["--url", &url])
            .args(args)
            .env_remove("SWITCHYARD_TOKEN")
            .current_dir(dir.path())
            .env(
                "SWITCHYARD_TOKEN",
                std::fs::read_to_string(data.join("admin.token"))
                    .unwrap_or_default()
                    .trim(),
            )
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };

    // Two on-prem agents with four GPUs each join.
    eventually(
        "two local agents to join",
        Duration::from_secs(60),
        || async {
            if !data.join("admin.token").exists() {
                return None;
            }
            let (ok, out, _) = cli(&["pools", "--json"]);
            if !ok {
                return None;
            }
            let pools: serde_json::Value = serde_json::from_str(&out).ok()?;
            let onprem = pools["pools"]
                .as_array()?
                .iter()
                .find(|p| p["provider"] == "onprem")?
                .clone();
            (onprem["gpus_free"] == 8).then_some(())
        },
    )
    .await;
    let (ok, out, err) = cli(&["pools"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("aws:us-east-1/p5.48xlarge"),
        "priced cloud pools listed:\n{out}"
    );

    // Submit from a TOML file with the CLI, follow it to the end.
    std::fs::write(
        dir.path().join("job.toml"),
        "name = \"tour\"\nteam = \"ml\"\ncommand = [\"echo\", \"hello from switchyard\"]\n\n[resources]\ngpus = 1\n",
    )
    .unwrap();
    let (ok, id, err) = cli(&["submit", "job.toml"]);
    assert!(ok, "{err}");
    let id = id.trim().to_string();
    eventually("the job to succeed", Duration::from_secs(30), || async {
        let (_, out, _) = cli(&["job", &id, "--json"]);
        out.contains("\"succeeded\"").then_some(())
    })
    .await;
    let (ok, out, err) = cli(&["logs", &id]);
    assert!(ok, "{err}");
    assert_eq!(out, "hello from switchyard\n");
    let (ok, out, _) = cli(&["jobs"]);
    assert!(
        ok && out.contains(&id) && out.contains("succeeded"),
        "{out}"
    );

    // Ctrl-C stops the broker and every agent it started.
    let needle = format!("127.0.0.1:{port}");
    assert_eq!(
        processes_matching(&needle)
            .iter()
            .filter(|(_, c)| c.contains(" agent "))
            .count(),
        2
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(up.pid()),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let status = up.wait_exit(Duration::from_secs(30)).unwrap();
    assert!(status.success(), "up exited with {status}");
    eventually("the agents to be gone", Duration::from_secs(10), || async {
        processes_matching(&needle).is_empty().then_some(())
    })
    .await;
}

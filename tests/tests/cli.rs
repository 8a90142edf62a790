//! The `switchyard` CLI against a real broker: a submit whose answers are lost creates one job
//! (its retries carry the same `Idempotency-Key`), a key stays good across a broker crash, and
//! a closed stdout ends a command quietly instead of with a panic.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::json;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use switchyard_tests::{Broker, bin};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A gateway in front of the broker that forwards every request but answers the first `lose`
/// with `502 Bad Gateway`, as a proxy does when the upstream's answer is lost after it acted.
/// Returns its URL and how many requests it forwarded.
async fn lossy_gateway(broker: &str, lose: usize) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let forwarded = Arc::new(AtomicUsize::new(0));
    let (count, broker) = (forwarded.clone(), broker.to_string());
    tokio::spawn(async move {
        let http = reqwest::Client::new();
        loop {
            let Ok((conn, _)) = listener.accept().await else {
                continue;
            };
            let n = count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(forward(conn, http.clone(), broker.clone(), n < lose));
        }
    });
    (url, forwarded)
}

/// One request on `conn`, sent on to `broker`; answered with the broker's answer, or 502.
async fn forward(mut conn: TcpStream, http: reqwest::Client, broker: String, lose: bool) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        let n = conn.read(&mut chunk).await.unwrap();
        assert!(n > 0, "the client closed before sending a request");
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let mut lines = head.lines();
    let mut first = lines.next().unwrap().split_whitespace();
    let (method, path) = (first.next().unwrap(), first.next().unwrap());
    let mut headers = Vec::new();
    let mut length = 0;
    for l in lines.filter(|l| !l.is_empty()) {
        let (k, v) = l.split_once(':').unwrap();
        let (k, v) = (k.trim().to_ascii_lowercase(), v.trim().to_string());
        if k == "content-length" {
            length = v.parse().unwrap();
        }
        if matches!(
            k.as_str(),
            "authorization" | "content-type" | "idempotency-key"
        ) {
            headers.push((k, v));
        }
    }
    while buf.len() < head_end + length {
        let n = conn.read(&mut chunk).await.unwrap();
        buf.extend_from_slice(&chunk[..n]);
    }
    let mut req = http.request(method.parse().unwrap(), format!("{broker}{path}"));
    for (k, v) in headers {
        req = req.header(k, v);
    }
    let res = req
        .body(buf[head_end..head_end + length].to_vec())
        .send()
        .await
        .unwrap();
    let status = res.status();
    let body = res.bytes().await.unwrap();
    let answer = if lose {
        b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".to_vec()
    } else {
        [
            format!(
                "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
                 connection: close\r\n\r\n",
                status.as_u16(),
                status.canonical_reason().unwrap_or(""),
                body.len()
            )
            .into_bytes(),
            body.to_vec(),
        ]
        .concat()
    };
    let _ = conn.write_all(&answer).await;
    let _ = conn.shutdown().await;
}

fn cli(url: &str, token: &str) -> Command {
    let mut cmd = Command::new(bin("switchyard"));
    cmd.args(["--url", url, "--token", token]);
    cmd
}

#[tokio::test(flavor = "multi_thread")]
async fn a_submit_whose_answers_are_lost_creates_one_job() {
    let broker = Broker::start().await;
    let (gateway, forwarded) = lossy_gateway(&broker.url, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("job.toml");
    std::fs::write(
        &spec,
        "name = \"once\"\nteam = \"ml\"\ncommand = [\"true\"]\n[resources]\ngpus = 1\n",
    )
    .unwrap();
    let (gateway_url, token) = (gateway.clone(), broker.admin.clone());
    let out = tokio::task::spawn_blocking(move || {
        cli(&gateway_url, &token)
            .arg("submit")
            .arg(&spec)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(forwarded.load(Ordering::SeqCst), 3, "{stderr}");
    assert_eq!(stderr.matches("retrying").count(), 2, "{stderr}");
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let jobs = broker.all_jobs().await;
    let once: Vec<_> = jobs.iter().filter(|j| j["name"] == "once").collect();
    assert_eq!(once.len(), 1, "{jobs:?}");
    assert_eq!(once[0]["id"], id.as_str());
}

#[tokio::test(flavor = "multi_thread")]
async fn an_idempotency_key_outlives_a_broker_crash() {
    let mut broker = Broker::start().await;
    let spec = json!({"name": "durable", "team": "ml", "command": ["true"],
                      "resources": {"gpus": 1}});
    let post = async |broker: &Broker, spec: &serde_json::Value| {
        let r = broker
            .http
            .post(format!("{}/api/v1/jobs", broker.url))
            .bearer_auth(&broker.admin)
            .header("Idempotency-Key", "crash-proof-1")
            .json(spec)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json::<serde_json::Value>().await.unwrap())
    };
    let (status, first) = post(&broker, &spec).await;
    assert_eq!(status, 201, "{first}");
    broker.kill9();
    broker.start_again().await;
    let (status, again) = post(&broker, &spec).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["id"], first["id"]);
    let mut other = spec.clone();
    other["name"] = json!("another");
    let (status, refused) = post(&broker, &other).await;
    assert_eq!(status, 422, "{refused}");
    assert_eq!(refused["error"]["code"], "idempotency_key_reused");
    assert_eq!(refused["error"]["field"], "Idempotency-Key");
    let jobs = broker.all_jobs().await;
    assert_eq!(jobs.len(), 1, "{jobs:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_closed_stdout_ends_the_cli_quietly() {
    let broker = Broker::start().await;
    for _ in 0..3 {
        broker
            .submit(json!({"name": "listed", "team": "ml", "command": ["true"],
                           "resources": {"gpus": 1}}))
            .await;
    }
    let (url, token) = (broker.url.clone(), broker.admin.clone());
    for args in [
        vec!["jobs"],
        vec!["pools"],
        vec!["regions"],
        vec!["audit"],
        vec!["jobs", "--json"],
    ] {
        let (url, token) = (url.clone(), token.clone());
        let out = tokio::task::spawn_blocking(move || {
            let mut child = cli(&url, &token)
                .args(&args)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            // The reader goes away before the first line is written (`| head -0`).
            drop(child.stdout.take());
            let status = child.wait().unwrap();
            let mut err = String::new();
            std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
            (args, status, err)
        })
        .await
        .unwrap();
        let (args, status, err) = out;
        assert!(status.success(), "{args:?}: {status:?} {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(err.is_empty(), "{args:?}: {err}");
    }
}

/// Runs the CLI against `broker` with `token`; its status, stdout and stderr.
async fn run_cli(broker: &Broker, token: &str, args: &[&str]) -> (bool, String, String) {
    let (url, token) = (broker.url.clone(), token.to_string());
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let out = cli(&url, &token).args(&args).output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    })
    .await
    .unwrap()
}

/// The commands finance and infra need without curl: instances, budgets, audit, tokens (list
/// and revoke) and filtered job lists, each as a table and as `--json`.
#[tokio::test(flavor = "multi_thread")]
async fn the_cli_lists_instances_budgets_audit_and_tokens_and_revokes_one() {
    let broker = Broker::start().await;
    let admin = broker.admin.clone();
    let (status, body) = broker
        .call(
            reqwest::Method::PUT,
            "/api/v1/policies/ml",
            Some(json!({"budget": {"amount_usd": 1234.5, "period": "month",
                                   "enforcement": "hard"}})),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    broker
        .submit(json!({"name": "findme", "team": "ml", "command": ["true"],
                       "resources": {"gpus": 1}, "priority": "low"}))
        .await;
    broker
        .submit(json!({"name": "other", "team": "ml", "command": ["true"],
                       "resources": {"gpus": 1}}))
        .await;

    let (ok, out, err) = run_cli(&broker, &admin, &["budgets"]).await;
    assert!(ok, "{err}");
    assert!(out.contains("ml") && out.contains("$1,234.50"), "{out}");
    let (ok, out, err) = run_cli(&broker, &admin, &["budgets", "--json"]).await;
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["budgets"][0]["team"], "ml");

    let (ok, out, err) = run_cli(&broker, &admin, &["audit", "--target", "policy:ml"]).await;
    assert!(ok, "{err}");
    assert!(out.contains("policy.put"), "{out}");

    let (ok, out, err) = run_cli(&broker, &admin, &["instances", "--json"]).await;
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(v["instances"].is_array(), "{v}");
    let (ok, out, _) = run_cli(&broker, &admin, &["instances"]).await;
    assert!(ok && out.starts_with("INSTANCE"), "{out}");

    let (ok, out, err) = run_cli(
        &broker,
        &admin,
        &["jobs", "--name", "findme", "--priority", "low"],
    )
    .await;
    assert!(ok, "{err}");
    assert_eq!(out.lines().count(), 2, "a header and one job: {out}");
    assert!(out.contains("findme"), "{out}");

    let (ok, dev, err) = run_cli(
        &broker,
        &admin,
        &["token", "create", "--role", "developer", "--team", "ml"],
    )
    .await;
    assert!(ok, "{err}");
    let dev = dev.trim().to_string();
    let (ok, out, err) = run_cli(&broker, &admin, &["token", "list", "--json"]).await;
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let id = v["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["role"] == "developer" && t["team"] == "ml")
        .map(|t| t["id"].as_str().unwrap().to_string())
        .unwrap();
    assert!(!out.contains(&dev), "token list shows no secret");
    let (ok, _, err) = run_cli(&broker, &dev, &["jobs"]).await;
    assert!(ok, "{err}");
    let (ok, out, err) = run_cli(&broker, &admin, &["token", "revoke", &id]).await;
    assert!(ok, "{err}");
    assert_eq!(out.trim(), format!("{id} revoked"));
    // The audit by action, actor and time: the policy change, not the tokens.
    let (ok, out, err) = run_cli(
        &broker,
        &admin,
        &[
            "audit",
            "--action",
            "policy.put",
            "--from",
            "2000-01-01T00:00:00Z",
        ],
    )
    .await;
    assert!(ok, "{err}");
    assert_eq!(
        out.lines().count(),
        2,
        "a header and the policy change: {out}"
    );
    assert!(
        out.contains("policy:ml") && !out.contains("token.create"),
        "{out}"
    );
    let (ok, out, err) = run_cli(
        &broker,
        &admin,
        &["audit", "--to", "2000-01-01T00:00:00Z", "--json"],
    )
    .await;
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["entries"], json!([]), "nothing before 2000: {v}");
    let (ok, out, err) = run_cli(&broker, &admin, &["audit", "--actor", "nobody:here"]).await;
    assert!(ok, "{err}");
    assert_eq!(out.lines().count(), 1, "the header alone: {out}");
    let (ok, _, err) = run_cli(&broker, &dev, &["jobs"]).await;
    assert!(!ok && err.contains("401"), "{err}");
}

/// The CLI's exit status, stdout and stderr for `args` (connection options after the command).
async fn cli_output(broker: &Broker, token: &str, args: &[&str]) -> (i32, String, String) {
    let (url, token) = (broker.url.clone(), token.to_string());
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let out = Command::new(bin("switchyard"))
            .args(&args)
            .args(["--url", &url, "--token", &token])
            .env_remove("SWITCHYARD_URL")
            .env_remove("SWITCHYARD_TOKEN")
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    })
    .await
    .unwrap()
}

/// `stdout` read as one JSON document, or the test fails saying which command printed what.
fn json_of(args: &[&str], code: i32, stdout: &str, stderr: &str) -> serde_json::Value {
    assert_eq!(code, 0, "{args:?}: {stderr}");
    serde_json::from_str(stdout)
        .unwrap_or_else(|e| panic!("{args:?} printed no JSON ({e}):\n{stdout}\n{stderr}"))
}

fn write(dir: &std::path::Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

/// Every client command prints JSON with `--json`, and `logs --json` one JSON object a line.
#[tokio::test(flavor = "multi_thread")]
async fn every_client_command_prints_json_with_json() {
    let mut broker = Broker::start().await;
    broker.start_agent("json-a1", 4).await;
    let admin = broker.admin.clone();
    let dir = tempfile::tempdir().unwrap();
    let policy = write(dir.path(), "policy.toml", "max_price_per_gpu_hour = 50.0\n");
    let draft = write(
        dir.path(),
        "draft.json",
        r#"{"budget": {"amount_usd": 0.01, "period": "month", "enforcement": "hard"}}"#,
    );
    let job = write(
        dir.path(),
        "job.toml",
        "name = \"json\"\nteam = \"ml\"\ncommand = [\"sh\", \"-c\", \"echo one; echo two >&2\"]\n\
         estimated_runtime_s = 60\n[resources]\ngpus = 1\n",
    );

    let run = async |args: &[&str]| {
        let (code, out, err) = cli_output(&broker, &admin, args).await;
        json_of(args, code, &out, &err)
    };
    let v = run(&["policy", "set", "ml", &policy, "--json"]).await;
    assert_eq!(v["version"], 1, "{v}");
    let v = run(&["policy", "get", "ml", "--json"]).await;
    assert_eq!(v["policy"]["max_price_per_gpu_hour"], 50.0, "{v}");
    let v = run(&["policy", "list", "--json"]).await;
    assert_eq!(v["policies"][0]["team"], "ml", "{v}");
    let v = run(&["submit", &job, "--json"]).await;
    let id = v["id"].as_str().unwrap().to_string();
    assert_eq!(v["name"], "json");
    broker
        .wait_state(&id, &["succeeded"], Duration::from_secs(60))
        .await;
    let v = run(&["jobs", "--json"]).await;
    assert_eq!(v["jobs"][0]["id"], id.as_str(), "{v}");
    let v = run(&["job", &id, "--json"]).await;
    assert_eq!(v["state"], "succeeded", "{v}");
    let v = run(&["explain", &id, "--json"]).await;
    assert_eq!(v["job_id"], id.as_str(), "{v}");
    assert!(v["outcome"]["decision"].is_string(), "{v}");
    for args in [
        &["pools", "--json"][..],
        &["regions", "--json"],
        &["instances", "--json"],
        &["budgets", "--json"],
        &["audit", "--json"],
        &["spend", "--group-by", "pool", "--json"],
        &["token", "list", "--json"],
    ] {
        let v = run(args).await;
        assert!(v.is_object(), "{args:?}: {v}");
    }
    let v = run(&["regions", "--json"]).await;
    assert_eq!(v["regions"][0]["id"], "onprem:e2e-dc", "{v}");
    let v = run(&["spend", "--json"]).await;
    assert_eq!(v["group_by"], "team", "{v}");
    let v = run(&["spend", "--group-by", "usage", "--json"]).await;
    assert_eq!(v["group_by"], "usage", "{v}");
    // As a table: billed and cash side by side, and the owned GPUs' idle time (issue 29).
    let (code, out, err) = cli_output(&broker, &admin, &["spend"]).await;
    assert_eq!(code, 0, "{err}");
    let head = out.lines().next().unwrap_or_default();
    assert!(head.contains("BILLED") && head.contains("CASH"), "{out}");
    assert!(out.lines().any(|l| l.starts_with("TOTAL")), "{out}");
    assert!(out.contains("owned GPUs idle: "), "{out}");
    let v = run(&["policy", "what-if", &draft, "--team", "ml", "--json"]).await;
    assert!(v["jobs"].as_u64().unwrap() >= 1, "{v}");
    assert!(v["current"]["total_cost_usd"].is_number(), "{v}");
    assert!(v["draft"]["held_jobs"].is_number(), "{v}");

    // Logs: one entry a line, every stream.
    let (code, out, err) = cli_output(&broker, &admin, &["logs", &id, "--json"]).await;
    assert_eq!(code, 0, "{err}");
    let entries: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let text = |stream: &str| -> String {
        entries
            .iter()
            .filter(|e| e["stream"] == stream)
            .map(|e| e["text"].as_str().unwrap())
            .collect()
    };
    assert_eq!(text("stdout"), "one\n", "{out}");
    assert_eq!(text("stderr"), "two\n", "{out}");

    // Tokens: create, then revoke, each as JSON.
    let v = run(&[
        "token",
        "create",
        "--role",
        "developer",
        "--team",
        "ml",
        "--name",
        "ci",
        "--json",
    ])
    .await;
    assert!(v["token"].is_string() && v["id"].is_string(), "{v}");
    let token_id = v["id"].as_str().unwrap().to_string();
    let v = run(&["token", "revoke", &token_id, "--json"]).await;
    assert_eq!(v["revoked"], true, "{v}");

    // Cancel, as JSON: the job as the broker answered.
    let long = broker
        .submit(
            json!({"name": "long", "team": "ml", "command": ["sleep", "60"],
                       "resources": {"gpus": 1}}),
        )
        .await;
    broker
        .wait_state(&long, &["running"], Duration::from_secs(30))
        .await;
    let v = run(&["cancel", &long, "--json"]).await;
    assert_eq!(v["id"], long.as_str(), "{v}");
    assert_eq!(v["cancel_requested"], true, "{v}");
}

/// `logs --follow` ends with the job's exit status: its own code, 0 when it succeeded, 1 when
/// it failed without one (killed by a signal).
#[tokio::test(flavor = "multi_thread")]
async fn logs_follow_exits_with_the_jobs_exit_code() {
    let mut broker = Broker::start().await;
    broker.start_agent("follow-a1", 4).await;
    let admin = broker.admin.clone();
    let spec = |name: &str, script: &str| {
        json!({"name": name, "team": "ml", "command": ["sh", "-c", script],
               "resources": {"gpus": 1}})
    };
    let three = broker
        .submit(spec("three", "echo out; echo err >&2; exit 3"))
        .await;
    let ok = broker.submit(spec("ok", "echo fine")).await;
    let killed = broker.submit(spec("killed", "kill -KILL $$")).await;

    let (code, out, err) = cli_output(&broker, &admin, &["logs", &three, "--follow"]).await;
    assert_eq!(code, 3, "{err}");
    assert_eq!(out, "out\n");
    assert!(err.contains("err\n"), "{err}");
    assert!(err.contains("failed with exit code 3"), "{err}");

    let (code, out, err) = cli_output(&broker, &admin, &["logs", &ok, "-f"]).await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "fine\n");
    assert!(err.contains("succeeded"), "{err}");

    let (code, _, err) = cli_output(&broker, &admin, &["logs", &killed, "--follow"]).await;
    let job = broker.job(&killed).await;
    assert_eq!(job["state"], "failed", "{job}");
    assert!(job["exit_code"].is_null(), "killed by a signal: {job}");
    assert_eq!(code, 1, "{err}");

    // Without --follow, printing the logs is all: the job's status is not the command's.
    let (code, out, err) = cli_output(&broker, &admin, &["logs", &three]).await;
    assert_eq!((code, out.as_str()), (0, "out\n"), "{err}");
}

/// Following a held job says so once, with the reason, however many times it polls; a cancel
/// ends it with the documented status for a cancelled job (130).
#[tokio::test(flavor = "multi_thread")]
async fn logs_follow_says_once_why_a_job_is_held_and_exits_130_when_it_is_cancelled() {
    let mut broker = Broker::start().await;
    broker.start_agent("held-a1", 4).await;
    let (status, body) = broker
        .call(
            reqwest::Method::PUT,
            "/api/v1/policies/ml",
            Some(json!({"budget": {"amount_usd": 0.01, "period": "month",
                                   "enforcement": "hard"}})),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    // An hour of one H100 at $2/GPU-hour: beyond a one-cent budget.
    let id = broker
        .submit(json!({"name": "held", "team": "ml", "command": ["true"],
                       "resources": {"gpus": 1}, "estimated_runtime_s": 3600}))
        .await;
    broker
        .wait_state(&id, &["held"], Duration::from_secs(30))
        .await;

    let mut child = tokio::process::Command::new(bin("switchyard"))
        .args(["logs", &id, "--follow", "--url", &broker.url, "--token"])
        .arg(&broker.admin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let said = Arc::new(std::sync::Mutex::new(String::new()));
    let reader = tokio::spawn({
        let said = said.clone();
        async move {
            let mut buf = [0u8; 4096];
            loop {
                match stderr.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => said
                        .lock()
                        .unwrap()
                        .push_str(&String::from_utf8_lossy(&buf[..n])),
                }
            }
        }
    });
    switchyard_tests::eventually(
        "logs --follow to say the job is held",
        Duration::from_secs(20),
        || async { said.lock().unwrap().contains("held:").then_some(()) },
    )
    .await;
    // Several polls (one a second) later, it has still said so once.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let (status, body) = broker
        .call(
            reqwest::Method::POST,
            &format!("/api/v1/jobs/{id}/cancel"),
            None,
        )
        .await;
    assert!(status == 200 || status == 202, "{status} {body}");
    let exit = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("logs --follow ends once the job is cancelled")
        .unwrap();
    reader.await.unwrap();
    let said = said.lock().unwrap().clone();
    assert_eq!(said.matches("held:").count(), 1, "{said}");
    assert!(said.contains("budget"), "the reason, in words: {said}");
    assert!(said.contains("cancelled"), "{said}");
    assert_eq!(exit.code(), Some(130), "{said}");
}

/// `cancel` says "cancel requested" while the job runs; with `--wait` it then prints the state
/// the job ended in. A job that had not started is cancelled at once.
#[tokio::test(flavor = "multi_thread")]
async fn cancel_says_cancel_requested_until_the_job_has_stopped() {
    let mut broker = Broker::start().await;
    broker.start_agent("cancel-a1", 4).await;
    let admin = broker.admin.clone();
    let id = broker
        .submit(
            json!({"name": "sleeper", "team": "ml", "command": ["sleep", "60"],
                       "resources": {"gpus": 1}}),
        )
        .await;
    broker
        .wait_state(&id, &["running"], Duration::from_secs(30))
        .await;
    let (code, out, err) = cli_output(&broker, &admin, &["cancel", &id, "--wait"]).await;
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines,
        [
            format!("{id} cancel requested").as_str(),
            &format!("{id} cancelled")
        ],
        "{out}"
    );
    assert_eq!(broker.job(&id).await["state"], "cancelled");

    // Held, never started: cancelled at once.
    let (status, body) = broker
        .call(
            reqwest::Method::PUT,
            "/api/v1/policies/vision",
            Some(json!({"budget": {"amount_usd": 0.01, "period": "month",
                                   "enforcement": "hard"}})),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let held = broker
        .submit(
            json!({"name": "held", "team": "vision", "command": ["true"],
                       "resources": {"gpus": 1}, "estimated_runtime_s": 3600}),
        )
        .await;
    broker
        .wait_state(&held, &["held"], Duration::from_secs(30))
        .await;
    let (code, out, err) = cli_output(&broker, &admin, &["cancel", &held]).await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.trim(), format!("{held} cancelled"));
}

/// `job ID` shows the id and the state first, then the rest for people: money as money, times
/// with how long ago, the durations it queued and ran. `jobs` is an aligned table that
/// `--team` narrows.
#[tokio::test(flavor = "multi_thread")]
async fn job_shows_id_and_state_first_and_jobs_filters_by_team() {
    let mut broker = Broker::start().await;
    broker.start_agent("show-a1", 4).await;
    let admin = broker.admin.clone();
    let id = broker
        .submit(
            json!({"name": "shown", "team": "ml", "command": ["echo", "a b"],
                       "resources": {"gpus": 1}, "estimated_runtime_s": 60}),
        )
        .await;
    let vision = broker
        .submit(
            json!({"name": "other-team", "team": "vision", "command": ["true"],
                       "resources": {"gpus": 1}}),
        )
        .await;
    broker
        .wait_state(&id, &["succeeded"], Duration::from_secs(60))
        .await;
    broker
        .wait_state(&vision, &["succeeded"], Duration::from_secs(60))
        .await;

    let (code, out, err) = cli_output(&broker, &admin, &["job", &id]).await;
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    let field = |name: &str| -> String {
        lines
            .iter()
            .find_map(|l| {
                let (k, v) = l.split_at(l.find("  ").unwrap_or(l.len()));
                (k == name).then(|| v.trim().to_string())
            })
            .unwrap_or_else(|| panic!("no {name} in\n{out}"))
    };
    assert!(
        lines[0].starts_with("id ") && lines[0].ends_with(&id),
        "{out}"
    );
    assert!(
        lines[1].starts_with("state ") && lines[1].ends_with("succeeded"),
        "{out}"
    );
    // Aligned: every value starts in the same column.
    let column = lines[0].len() - id.len();
    assert!(
        lines.iter().all(|l| l.len() > column
            && !l[..column].trim_end().contains("  ")
            && l.as_bytes()[column - 1] == b' '),
        "{out}"
    );
    assert!(field("cost").starts_with('$'), "{out}");
    assert!(!field("cost").contains("e-"), "{out}");
    // A time, with how long ago it was: `2025-12-05 08:26:01 UTC (3 min ago)`, `(just now)`.
    let submitted = field("submitted");
    assert!(
        submitted.contains(" UTC (")
            && (submitted.ends_with(" ago)") || submitted.ends_with("(just now)")),
        "{out}"
    );
    assert!(field("queued").ends_with('s'), "{out}");
    assert!(field("ran").ends_with('s'), "{out}");
    assert_eq!(field("exit code"), "0");
    assert_eq!(field("command"), "echo 'a b'");
    assert!(
        field("placement").starts_with(switchyard_tests::POOL),
        "{out}"
    );

    let (code, out, err) = cli_output(&broker, &admin, &["jobs", "--team", "vision"]).await;
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "a header and one job: {out}");
    assert!(lines[1].starts_with(&vision), "{out}");
    assert!(!out.contains(&id), "{out}");
    // Columns line up with the header.
    let state_at = lines[0].find("STATE").unwrap();
    assert_eq!(
        &lines[1][state_at..state_at + "succeeded".len()],
        "succeeded",
        "{out}"
    );
    assert!(
        lines[1].contains(" ago ") || lines[1].contains("just now"),
        "{out}"
    );
}

/// `policy what-if` prints the current and the draft policy side by side: total cost,
/// deadlines met, queueing delay, held jobs, how many jobs it replayed; and the jobs the draft
/// treats differently when the broker reports them.
#[tokio::test(flavor = "multi_thread")]
async fn policy_what_if_prints_current_and_draft_side_by_side() {
    let mut broker = Broker::start().await;
    broker.start_agent("whatif-a1", 4).await;
    let admin = broker.admin.clone();
    let id = broker
        .submit(
            json!({"name": "replayed", "team": "ml", "command": ["true"],
                       "resources": {"gpus": 1}, "estimated_runtime_s": 3600}),
        )
        .await;
    broker
        .wait_state(&id, &["succeeded"], Duration::from_secs(60))
        .await;
    let dir = tempfile::tempdir().unwrap();
    let draft = write(
        dir.path(),
        "draft.toml",
        "[budget]\namount_usd = 0.01\nperiod = \"month\"\nenforcement = \"hard\"\n",
    );
    let (code, out, err) = cli_output(
        &broker,
        &admin,
        &["policy", "what-if", &draft, "--team", "ml"],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    let (code, json_out, err) = cli_output(
        &broker,
        &admin,
        &["policy", "what-if", &draft, "--team", "ml", "--json"],
    )
    .await;
    let v = json_of(&["policy", "what-if"], code, &json_out, &err);
    assert!(
        out.starts_with(&format!(
            "what-if for ml: {} job",
            v["jobs"].as_u64().unwrap()
        )),
        "{out}"
    );
    let row = |name: &str| -> Vec<String> {
        out.lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no {name} row in\n{out}"))[name.len()..]
            .split_whitespace()
            .map(str::to_string)
            .collect()
    };
    // Money as money: `$1,234.50`, `$0.0145`; the same amounts as the JSON's, to the cent
    // shown.
    let dollars = |cell: &str| -> f64 {
        assert!(cell.starts_with('$'), "{cell} in\n{out}");
        cell[1..].replace(',', "").parse().unwrap()
    };
    let cost = row("total cost");
    for (cell, side) in cost.iter().zip(["current", "draft"]) {
        let usd = v[side]["total_cost_usd"].as_f64().unwrap();
        assert!(
            (dollars(cell) - usd).abs() < 0.005,
            "{side}: {cell} vs {usd}\n{out}"
        );
    }
    let held = row("held jobs");
    assert_eq!(held[0], v["current"]["held_jobs"].to_string(), "{out}");
    assert_eq!(held[1], v["draft"]["held_jobs"].to_string(), "{out}");
    assert!(row("deadlines met")[0].ends_with('%'), "{out}");
    // Durations for people (`0s`, `3m 05s`, `+1h 02m`), never raw seconds like `180.0`.
    for name in ["queue delay p50", "queue delay p99"] {
        let cells = row(name);
        assert!(cells.len() >= 3, "{name}: {out}");
        assert!(
            cells
                .iter()
                .all(|w| w == "same" || w.ends_with(['s', 'm', 'h', 'd'])),
            "{name}: {out}"
        );
    }
    let changes = v["changes"].as_array().cloned().unwrap_or_default();
    if changes.is_empty() {
        assert!(out.contains("no job is treated differently"), "{out}");
    } else {
        assert!(out.contains("jobs the draft treats differently"), "{out}");
        for c in &changes {
            assert!(out.contains(c["job_id"].as_str().unwrap()), "{out}");
        }
    }
    // Nothing was saved.
    let (status, _) = broker
        .call(reqwest::Method::GET, "/api/v1/policies/ml", None)
        .await;
    assert_eq!(status, 404);
}

/// The connection options go after the command (`jobs --url …`), before it as earlier
/// versions took them (`--url … jobs`), or in the environment; the command's own win. Server
/// commands refuse them.
#[tokio::test(flavor = "multi_thread")]
async fn the_connection_options_work_after_before_and_from_the_environment() {
    let broker = Broker::start().await;
    let (url, token) = (broker.url.clone(), broker.admin.clone());
    let out = tokio::task::spawn_blocking(move || {
        let run = |args: &[&str], env: &[(&str, &str)]| {
            let out = Command::new(bin("switchyard"))
                .args(args)
                .env_remove("SWITCHYARD_URL")
                .env_remove("SWITCHYARD_TOKEN")
                .envs(env.iter().copied())
                .output()
                .unwrap();
            (
                out.status.code(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            )
        };
        let dead = "http://127.0.0.1:9";
        vec![
            run(&["pools", "--url", &url, "--token", &token], &[]),
            run(&["--url", &url, "--token", &token, "pools"], &[]),
            run(
                &["pools"],
                &[("SWITCHYARD_URL", &url), ("SWITCHYARD_TOKEN", &token)],
            ),
            // The command's own option beats the one before it and the environment.
            run(
                &["--url", dead, "pools", "--url", &url, "--token", &token],
                &[("SWITCHYARD_URL", dead)],
            ),
            // One before the command beats the environment.
            run(
                &["--url", &url, "pools", "--token", &token],
                &[("SWITCHYARD_URL", dead)],
            ),
            run(
                &["--url", &url, "simulate", "--trace", "x", "--out", "y"],
                &[],
            ),
        ]
    })
    .await
    .unwrap();
    for (i, (code, stdout, stderr)) in out.iter().enumerate().take(5) {
        assert_eq!(*code, Some(0), "form {i}: {stderr}");
        assert!(
            stdout.contains(switchyard_tests::POOL),
            "form {i}: {stdout}"
        );
    }
    let (code, _, stderr) = &out[5];
    assert_eq!(*code, Some(1), "{stderr}");
    assert!(stderr.contains("client commands"), "{stderr}");
}

/// `--help` describes every option, lists the values of enumerations, and shows the connection
/// options on client commands only; a value outside the list is a usage error (status 2).
#[test]
fn help_lists_possible_values_and_keeps_connection_options_on_client_commands() {
    let help = |args: &[&str]| {
        let out = Command::new(bin("switchyard")).args(args).output().unwrap();
        assert!(out.status.success(), "{args:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let jobs = help(&["jobs", "--help"]);
    assert!(
        jobs.contains("[possible values: critical, high, normal, low]"),
        "{jobs}"
    );
    assert!(
        jobs.contains(
            "[possible values: queued, held, provisioning, placed, running, succeeded, \
             failed, cancelled]"
        ),
        "{jobs}"
    );
    for flag in ["--url", "--token", "--ca-cert", "--json"] {
        assert!(
            jobs.lines().any(|l| l.trim_start().starts_with(flag)),
            "{flag}: {jobs}"
        );
    }
    assert!(jobs.contains("SWITCHYARD_URL"), "{jobs}");
    let spend = help(&["spend", "--help"]);
    assert!(
        spend.contains("[possible values: team, project, region, provider, pool, usage]"),
        "{spend}"
    );
    let token = help(&["token", "create", "--help"]);
    assert!(
        token.contains("admin") && token.contains("developer"),
        "{token}"
    );
    for server in [
        &["up", "--help"][..],
        &["serve", "--help"],
        &["simulate", "--help"],
        &["agent", "--help"],
        &["--help"],
    ] {
        let text = help(server);
        let options: Vec<&str> = text
            .lines()
            .map(str::trim_start)
            .filter(|l| l.starts_with("--"))
            .collect();
        // The agent's own --ca-cert is the CA it trusts for the broker: its option, not a
        // client's.
        let flags: &[&str] = if server[0] == "agent" {
            &["--url", "--token"]
        } else {
            &["--url", "--token", "--ca-cert"]
        };
        for flag in flags {
            assert!(
                !options.iter().any(|o| o.starts_with(flag)),
                "{server:?} offers {flag}: {text}"
            );
        }
    }
    let sim = help(&["simulate", "--help"]);
    assert!(sim.contains("[possible values: switchyard"), "{sim}");

    let out = Command::new(bin("switchyard"))
        .args(["jobs", "--priority", "urgent"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("critical"), "{err}");
}

/// Infra's day without curl: the nodes and one node's GPUs and jobs, a pool's limits, an
/// enrolment token for a new agent, the enrolled agents, and revoking one.
#[tokio::test(flavor = "multi_thread")]
async fn nodes_pools_and_agent_tokens_from_the_cli() {
    let mut broker = Broker::start().await;
    broker.start_agent("infra-a1", 4).await;
    let admin = broker.admin.clone();
    let pool = switchyard_tests::POOL;

    let (code, out, err) = cli_output(&broker, &admin, &["nodes", "--json"]).await;
    let v = json_of(&["nodes"], code, &out, &err);
    assert_eq!(v["nodes"][0]["pool"], pool, "{v}");
    let node = v["nodes"][0]["id"].as_str().unwrap().to_string();
    let (code, out, err) = cli_output(&broker, &admin, &["nodes"]).await;
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert!(
        lines[1].starts_with(&node) && lines[1].contains(pool),
        "{out}"
    );
    assert!(lines[1].contains("healthy"), "{out}");
    assert!(lines[0].contains("UNHEALTHY GPUS"), "{out}");

    // Drain and undrain by hand (issue 28): the node's state says so.
    let (code, out, err) = cli_output(&broker, &admin, &["nodes", "drain", &node]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("draining"), "{out}");
    let (_, out, _) = cli_output(&broker, &admin, &["nodes"]).await;
    assert!(out.lines().nth(1).unwrap().contains("draining"), "{out}");
    let (code, out, err) = cli_output(&broker, &admin, &["nodes", "undrain", &node]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("takes work again"), "{out}");
    let (code, _, err) = cli_output(&broker, &admin, &["nodes", "drain", "no-such-node"]).await;
    assert_ne!(code, 0, "an unknown node: {err}");

    let id = broker
        .submit(
            json!({"name": "on-node", "team": "ml", "command": ["sleep", "60"],
                       "resources": {"gpus": 2}}),
        )
        .await;
    broker
        .wait_state(&id, &["running"], Duration::from_secs(30))
        .await;
    let (code, out, err) = cli_output(&broker, &admin, &["node", &node, "--json"]).await;
    let v = json_of(&["node"], code, &out, &err);
    assert_eq!(v["gpus"].as_array().unwrap().len(), 4, "{v}");
    let (code, out, err) = cli_output(&broker, &admin, &["node", &node]).await;
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].starts_with("id ") && lines[0].ends_with(&node),
        "{out}"
    );
    assert!(
        lines[1].starts_with("state ") && lines[1].ends_with("healthy"),
        "{out}"
    );
    let gpu_rows = out
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("GPU"))
        .skip(1)
        .take_while(|l| !l.is_empty())
        .count();
    assert_eq!(gpu_rows, 4, "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with(&id) && l.contains("on-node")),
        "its job: {out}"
    );

    let (code, out, err) = cli_output(
        &broker,
        &admin,
        &[
            "pool",
            "set",
            pool,
            "--node-limit",
            "3",
            "--price-per-gpu-hour",
            "2.5",
        ],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out.trim(),
        format!(
            "pool {pool}: up to 3 nodes, $2.50 per GPU-hour ($0.50 in cash: the default fifth), \
             not launchable"
        )
    );
    // Finance's figure for an owned pool: its marginal cost, what the planner minimises.
    let (code, out, err) = cli_output(
        &broker,
        &admin,
        &["pool", "set", pool, "--marginal-per-gpu-hour", "0.3"],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out.trim(),
        format!("pool {pool}: up to 3 nodes, $2.50 per GPU-hour ($0.30 in cash), not launchable")
    );
    let (code, out, err) = cli_output(
        &broker,
        &admin,
        &["pool", "set", pool, "--node-limit", "4", "--json"],
    )
    .await;
    let v = json_of(&["pool", "set"], code, &out, &err);
    assert_eq!(
        (v["node_limit"].as_u64(), v["price_per_gpu_hour"].as_f64()),
        (Some(4), Some(2.5))
    );
    let (code, _, err) = cli_output(&broker, &admin, &["pool", "set", pool]).await;
    assert_eq!(code, 1, "nothing to change is an error: {err}");
    assert!(err.contains("nothing to change"), "{err}");

    let (code, out, err) = cli_output(
        &broker,
        &admin,
        &["enrolment-token", "--pool", pool, "--ttl-s", "60"],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.lines().count(), 1, "the token alone: {out}");
    assert!(out.trim().len() > 20, "{out}");
    assert!(err.contains("until"), "when it expires, on stderr: {err}");
    let (code, out, err) = cli_output(
        &broker,
        &admin,
        &["enrolment-token", "--pool", pool, "--json"],
    )
    .await;
    let v = json_of(&["enrolment-token"], code, &out, &err);
    assert!(v["token"].is_string() && v["expires_at"].is_string(), "{v}");

    let (code, out, err) = cli_output(&broker, &admin, &["agent-token", "list", "--json"]).await;
    let v = json_of(&["agent-token", "list"], code, &out, &err);
    assert_eq!(v["agent_tokens"][0]["node"], node.as_str(), "{v}");
    let (code, out, err) = cli_output(&broker, &admin, &["agent-token", "list"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.lines().nth(1).unwrap().starts_with(&node), "{out}");
    let (code, out, err) = cli_output(&broker, &admin, &["agent-token", "revoke", &node]).await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        [
            format!("{node} revoked"),
            format!("1 job queued again: {id}")
        ],
        "{out}"
    );
    let (code, out, err) = cli_output(&broker, &admin, &["nodes"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(!out.contains(&node), "a revoked node is gone: {out}");
}

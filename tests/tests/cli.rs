//! The `switchyard` CLI against a real broker: a submit whose answers are lost creates one job
//! (its retries carry the same `Idempotency-Key`), a key stays good across a broker crash, and
//! a closed stdout ends a command quietly instead of with a panic.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::json;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
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
    for args in [vec!["jobs"], vec!["pools"], vec!["jobs", "--json"]] {
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
    let (ok, _, err) = run_cli(&broker, &dev, &["jobs"]).await;
    assert!(!ok && err.contains("401"), "{err}");
}

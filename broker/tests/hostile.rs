//! Hostile input and what must never leak: oversized bodies (413), deeply nested JSON (400),
//! slow clients (408 and the connection closed; the agents' long-poll is not cut), too many
//! requests with one token (429 with `Retry-After`), the security headers on every response,
//! and no token or secret in the broker's (and agent's) logs over a full run.
//!
//! The body and rate limits are `limits.rs`'s; settings in `config.rs` (`max_body_bytes`,
//! `agent_max_body_bytes`, `body_timeout_ms`, `rate_limit_per_s`, `rate_limit_burst`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

// ---- A raw HTTP/1.1 client, for what reqwest will not send -------------------------------

/// What came back on a raw connection: the status, the head and body as text, and whether
/// the server closed the connection (EOF) within the read bound.
struct RawResponse {
    status: u16,
    text: String,
    closed: bool,
}

/// Writes `head`, then each of `parts` after `gap`, and reads until the server closes the
/// connection or `read_for` passes. A write that fails (the server closed first) ends the
/// writing, not the test.
async fn raw_exchange(
    url: &str,
    head: String,
    parts: Vec<Vec<u8>>,
    gap: Duration,
    read_for: Duration,
) -> RawResponse {
    let addr = url.trim_start_matches("http://");
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut rd, mut wr) = stream.into_split();
    let writer = tokio::spawn(async move {
        if wr.write_all(head.as_bytes()).await.is_err() {
            return;
        }
        for p in parts {
            tokio::time::sleep(gap).await;
            if wr.write_all(&p).await.is_err() {
                return;
            }
        }
        // Keep the write half open (a slow client that has not given up).
        tokio::time::sleep(Duration::from_secs(60)).await;
        drop(wr);
    });
    let mut buf = Vec::new();
    let mut closed = false;
    let deadline = tokio::time::Instant::now() + read_for;
    loop {
        let mut chunk = [0u8; 8192];
        match tokio::time::timeout_at(deadline, rd.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {
                closed = true;
                break;
            }
            Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
            Err(_) => break,
        }
    }
    writer.abort();
    let text = String::from_utf8_lossy(&buf).to_string();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    RawResponse {
        status,
        text,
        closed,
    }
}

fn post_head(path: &str, token: &str, framing: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\n{framing}\r\n"
    )
}

/// The JSON error body at the end of a raw response.
fn raw_error_code(text: &str) -> String {
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("");
    // A chunked response: the JSON is the line that starts with `{`.
    let json_line = body
        .lines()
        .find(|l| l.starts_with('{'))
        .unwrap_or(body)
        .trim();
    serde_json::from_str::<Value>(json_line)
        .ok()
        .and_then(|v| v["error"]["code"].as_str().map(str::to_string))
        .unwrap_or_default()
}

async fn healthy(app: &TestApp) {
    let r = app.call(Method::GET, "/healthz", None, None).await;
    assert_eq!(r.status, StatusCode::OK);
}

// ---- Body size ----------------------------------------------------------------------------

#[tokio::test]
async fn oversized_bodies_are_refused_with_413() {
    let app = TestApp::spawn().await;
    let dev = app.token("developer", Some("ml")).await;
    let agent = app.agent(1).await;
    let limit = app.app.config.max_body_bytes;
    let mut spec = job_spec("ml");

    // Declared too large (Content-Length): refused before it is read.
    spec["name"] = json!("x".repeat(limit + 1));
    let r = app
        .raw(
            "/api/v1/jobs",
            &dev,
            "application/json",
            spec.to_string().into_bytes(),
        )
        .await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE, "{}", r.body);
    assert_eq!(r.error_code(), "body_too_large");
    assert!(
        r.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains(&limit.to_string())
    );

    // Chunked, with no length declared: refused once it crosses the limit.
    let chunk = vec![b' '; 64 * 1024];
    let mut parts = Vec::new();
    for _ in 0..(limit / chunk.len() + 2) {
        let mut p = format!("{:x}\r\n", chunk.len()).into_bytes();
        p.extend_from_slice(&chunk);
        p.extend_from_slice(b"\r\n");
        parts.push(p);
    }
    parts.push(b"0\r\n\r\n".to_vec());
    let r = raw_exchange(
        &app.url,
        post_head("/api/v1/jobs", &dev, "Transfer-Encoding: chunked\r\n"),
        parts,
        Duration::ZERO,
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(r.status, 413, "{}", &r.text[..r.text.len().min(500)]);
    assert_eq!(raw_error_code(&r.text), "body_too_large");

    // Just under the limit goes through to the handler (which judges the content).
    spec["name"] = json!("x".repeat(limit - 200));
    let r = app
        .raw(
            "/api/v1/jobs",
            &dev,
            "application/json",
            spec.to_string().into_bytes(),
        )
        .await;
    assert_ne!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(
        r.status.is_client_error() || r.status.is_success(),
        "{}",
        r.status
    );

    // The agent protocol takes more (a batch of job output), up to its own limit.
    let attempt =
        json!({"job_id": uuid::Uuid::now_v7(), "attempt_id": uuid::Uuid::now_v7(), "epoch": 1});
    let batch = |bytes: usize| {
        json!({"events": [{"type": "log", "attempt": attempt, "seq": 0, "stream": "stdout",
                           "data": "y".repeat(bytes)}]})
        .to_string()
        .into_bytes()
    };
    let r = app
        .raw(
            "/agent/v1/events",
            &agent.token,
            "application/json",
            batch(2 * limit),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let agent_limit = app.app.config.agent_max_body_bytes;
    let r = app
        .raw(
            "/agent/v1/events",
            &agent.token,
            "application/json",
            batch(agent_limit),
        )
        .await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE, "{}", r.body);
    assert_eq!(r.error_code(), "body_too_large");
    healthy(&app).await;
}

// ---- Deep JSON ----------------------------------------------------------------------------

fn nested(depth: usize) -> String {
    format!("{}{}", "[".repeat(depth), "]".repeat(depth))
}

/// serde_json reads 127 levels of nesting and stops at the 128th with a syntax error
/// ("recursion limit exceeded"), which the one JSON reader answers as 400 `malformed_json`,
/// whatever the depth: the stack never grows with the input.
#[test]
fn the_json_reader_stops_at_serde_jsons_recursion_limit() {
    for depth in [1, 127] {
        let v = switchyard_broker::http::json::parse::<Value>(nested(depth).as_bytes());
        assert!(v.is_ok(), "depth {depth}: {v:?}");
    }
    for depth in [128, 129, 10_000, 500_000] {
        let err =
            switchyard_broker::http::json::parse::<Value>(nested(depth).as_bytes()).unwrap_err();
        match err {
            switchyard_broker::http::error::ApiError::BadRequest { code, message, .. } => {
                assert_eq!(code, "malformed_json", "depth {depth}");
                assert!(
                    message.contains("recursion limit"),
                    "depth {depth}: {message}"
                );
            }
            other => panic!("depth {depth}: {other:?}"),
        }
    }
}

#[tokio::test]
async fn deeply_nested_json_is_refused_with_400_on_every_json_route() {
    let app = TestApp::spawn().await;
    let agent = app.agent(1).await;
    let enrol = app.enrolment_token().await;
    let deep = nested(200_000);
    // Where a value is buffered before its type is known (the agent events' internally tagged
    // enum), the nesting is really parsed: serde_json's recursion limit is what stops it.
    let attempt =
        json!({"job_id": uuid::Uuid::now_v7(), "attempt_id": uuid::Uuid::now_v7(), "epoch": 1});
    let tagged =
        format!(r#"{{"events": [{{"attempt": {attempt}, "extra": {deep}, "type": "log"}}]}}"#);
    let in_field = format!(r#"{{"name": {deep}}}"#);
    let pool = POOL.replace('/', "%2F");
    let routes: Vec<(&str, String, Option<&str>)> = vec![
        ("POST", "/api/v1/jobs".into(), Some(app.admin.as_str())),
        ("POST", "/api/v1/tokens".into(), Some(&app.admin)),
        ("POST", "/api/v1/enrolment-tokens".into(), Some(&app.admin)),
        ("PUT", "/api/v1/policies/ml".into(), Some(&app.admin)),
        (
            "POST",
            "/api/v1/policies/ml/what-if".into(),
            Some(&app.admin),
        ),
        ("PATCH", format!("/api/v1/pools/{pool}"), Some(&app.admin)),
        // Registration reads at most 256 KiB, and only with a live enrolment token: its
        // bodies are nested less deeply below (still far past serde_json's limit).
        ("POST", "/agent/v1/register".into(), Some(&enrol)),
        ("POST", "/agent/v1/heartbeat".into(), Some(&agent.token)),
        ("POST", "/agent/v1/events".into(), Some(&agent.token)),
        ("POST", "/console/login".into(), None),
    ];
    let shallower = nested(100_000);
    let register_bodies = [
        shallower.clone(),
        format!(r#"{{"hostname": {shallower}}}"#),
        format!(r#"{{"inventory": {shallower}}}"#),
    ];
    for (m, path, token) in &routes {
        let bodies: Vec<&String> = if path == "/agent/v1/register" {
            register_bodies.iter().collect()
        } else {
            vec![&deep, &in_field, &tagged]
        };
        for body in bodies {
            let mut req = app
                .http
                .request(m.parse().unwrap(), format!("{}{path}", app.url))
                .header("content-type", "application/json")
                .body(body.clone());
            if let Some(t) = token {
                req = req.bearer_auth(t);
            }
            let res = req.send().await.unwrap();
            let status = res.status();
            let body: Value = res.json().await.unwrap_or(Value::Null);
            assert_eq!(status, StatusCode::BAD_REQUEST, "{m} {path}: {body}");
            let code = body["error"]["code"].as_str().unwrap_or("");
            assert!(
                code == "malformed_json" || code == "invalid_field",
                "{m} {path}: {body}"
            );
        }
    }
    // The events route really parses the nesting; serde_json's limit says so.
    let r = app
        .raw(
            "/agent/v1/events",
            &agent.token,
            "application/json",
            tagged.into_bytes(),
        )
        .await;
    assert_eq!(r.error_code(), "malformed_json", "{}", r.body);
    assert!(
        r.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("recursion limit"),
        "{}",
        r.body
    );
    healthy(&app).await;
}

// ---- Slow clients ---------------------------------------------------------------------------

#[tokio::test]
async fn a_slow_body_gets_408_and_its_connection_closed_but_long_polls_live() {
    let app = TestApp::spawn_with(
        |c| c.body_timeout_ms = 600,
        |_| switchyard_broker::app::ProviderSet::default(),
    )
    .await;
    let dev = app.token("developer", Some("ml")).await;

    // Headers, then one byte of a 100-byte body every 150 ms: never done in time.
    let started = Instant::now();
    let r = raw_exchange(
        &app.url,
        post_head("/api/v1/jobs", &dev, "Content-Length: 100\r\n"),
        (0..100).map(|_| b" ".to_vec()).collect(),
        Duration::from_millis(150),
        Duration::from_secs(10),
    )
    .await;
    let took = started.elapsed();
    eprintln!("trickled body: 408 after {took:?}");
    assert_eq!(r.status, 408, "{}", r.text);
    assert_eq!(raw_error_code(&r.text), "request_timeout");
    assert!(r.closed, "the connection stays open after the 408");
    assert!(
        took >= Duration::from_millis(500) && took < Duration::from_secs(5),
        "{took:?}"
    );

    // Headers and then nothing at all: the same.
    let r = raw_exchange(
        &app.url,
        post_head("/api/v1/jobs", &dev, "Content-Length: 100\r\n"),
        Vec::new(),
        Duration::ZERO,
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(r.status, 408, "{}", r.text);
    assert!(r.closed);

    // An agent's long-poll is longer than the body timeout, and is not cut.
    let agent = app.agent(1).await;
    let started = Instant::now();
    let w = work(&app, &agent, 2).await;
    assert!(started.elapsed() >= Duration::from_millis(1900), "{w}");
    // A body that arrives at once is served as ever.
    assert_eq!(
        app.submit(&dev, job_spec("ml")).await.status,
        StatusCode::CREATED
    );
}

// ---- Rate ---------------------------------------------------------------------------------

#[tokio::test]
async fn too_many_requests_with_one_token_get_429_with_retry_after() {
    let app = TestApp::spawn_with(
        |c| {
            c.rate_limit_per_s = 1;
            c.rate_limit_burst = 5;
        },
        |_| switchyard_broker::app::ProviderSet::default(),
    )
    .await;
    let dev = app.token("developer", Some("ml")).await;
    let other = app.token("developer", Some("ml")).await;
    let get = |auth: String| {
        app.http
            .get(format!("{}/api/v1/jobs", app.url))
            .header("authorization", auth)
            .send()
    };
    for i in 0..5 {
        let res = get(format!("Bearer {dev}")).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK, "request {i} of the burst");
    }
    // Over the burst, however the header is spelled.
    for auth in [format!("Bearer {dev}"), format!("bearer   {dev} ")] {
        let res = get(auth).await.unwrap();
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
        let retry: u64 = res.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!((1..=2).contains(&retry), "Retry-After {retry}");
        let body: Value = res.json().await.unwrap();
        assert_eq!(body["error"]["code"], "rate_limited", "{body}");
    }
    // Other tokens, and requests without one, are not affected.
    assert_eq!(
        get(format!("Bearer {other}")).await.unwrap().status(),
        StatusCode::OK
    );
    for _ in 0..20 {
        healthy(&app).await;
    }
    // Made-up tokens get their own buckets (and 401).
    let r = app
        .call(Method::GET, "/api/v1/jobs", Some("sya_made-up"), None)
        .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    // After Retry-After, the token works again.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(
        get(format!("Bearer {dev}")).await.unwrap().status(),
        StatusCode::OK
    );
}

// ---- Security headers -----------------------------------------------------------------------

#[tokio::test]
async fn every_response_carries_the_security_headers() {
    let app = TestApp::spawn().await;
    let dev = app.token("developer", Some("ml")).await;
    let agent = app.agent(1).await;
    let big = vec![b' '; app.app.config.max_body_bytes + 1];
    /// Method, path, bearer token, JSON body.
    type Case<'a> = (Method, &'a str, Option<&'a str>, Option<Vec<u8>>);
    let cases: Vec<Case> = vec![
        (Method::GET, "/healthz", None, None),
        (Method::GET, "/readyz", None, None),
        (Method::GET, "/openapi.json", None, None),
        (Method::GET, "/metrics", Some(&app.admin), None),
        (Method::GET, "/api/v1/jobs", Some(&dev), None),
        (Method::GET, "/api/v1/jobs", None, None),
        (Method::GET, "/api/v1/instances", Some(&dev), None),
        (Method::GET, "/api/v1/no-such-route", Some(&dev), None),
        (Method::POST, "/api/v1/jobs", Some(&dev), Some(big)),
        (
            Method::POST,
            "/api/v1/jobs",
            Some(&dev),
            Some(b"{".to_vec()),
        ),
        (
            Method::GET,
            "/agent/v1/work?wait_s=0",
            Some(&agent.token),
            None,
        ),
        (Method::GET, "/", None, None),
        (Method::GET, "/console/app.js", None, None),
        (Method::GET, "/console/session", None, None),
    ];
    for (m, path, token, body) in cases {
        let mut req = app.http.request(m.clone(), format!("{}{path}", app.url));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.header("content-type", "application/json").body(b);
        }
        let res = req.send().await.unwrap();
        let h = res.headers();
        let what = format!("{m} {path} ({})", res.status());
        assert_eq!(h["x-content-type-options"], "nosniff", "{what}");
        assert_eq!(h["x-frame-options"], "DENY", "{what}");
        assert_eq!(h["referrer-policy"], "no-referrer", "{what}");
        let csp = h["content-security-policy"].to_str().unwrap();
        assert!(csp.contains("frame-ancestors 'none'"), "{what}: {csp}");
        if path == "/" || path.starts_with("/console") {
            // The console keeps its own policy (scripts and styles from itself only).
            assert_eq!(csp, switchyard_broker::http::console::CSP, "{what}");
        } else {
            assert_eq!(csp, switchyard_broker::http::limits::API_CSP, "{what}");
        }
        assert!(
            !h.contains_key("strict-transport-security"),
            "{what}: plain http"
        );
    }
}

// ---- Secrets in logs ------------------------------------------------------------------------

/// Every log line of this test binary, as the broker writes them with `--json-logs`.
fn captured_logs() -> Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let buf: Arc<Mutex<Vec<u8>>> = Arc::default();
        let writer = buf.clone();
        tracing_subscriber::fmt()
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .with_env_filter(tracing_subscriber::EnvFilter::new("trace"))
            .with_writer(move || Capture(writer.clone()))
            .try_init()
            .expect("no other subscriber in this test binary");
        buf
    })
    .clone()
}

struct Capture(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Capture {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(data);
        Ok(data.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Every string in `v` that starts with `prefix`.
fn strings_with_prefix(v: &Value, prefix: &str, out: &mut Vec<String>) {
    match v {
        Value::String(s) if s.starts_with(prefix) => out.push(s.clone()),
        Value::Array(items) => items
            .iter()
            .for_each(|i| strings_with_prefix(i, prefix, out)),
        Value::Object(map) => map
            .values()
            .for_each(|i| strings_with_prefix(i, prefix, out)),
        _ => {}
    }
}

/// A full run with every log line captured at `trace` level, in JSON: the admin token, API
/// tokens of each role, a console session and its CSRF token, enrolment tokens, the agent
/// tokens of a real agent (in this process) and a hand-played one, a job whose environment
/// holds a secret (leased to the agent and run), failed sign-ins with made-up and used tokens.
/// None of those strings may appear in any log line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_token_or_secret_reaches_the_logs() {
    let logs = captured_logs();
    let app = TestApp::spawn().await;
    let mut secrets: Vec<String> = vec![app.admin.clone()];
    let dev = app.token("developer", Some("ml")).await;
    let finance = app.token("finance", None).await;
    let infra = app.token("infra", None).await;
    secrets.extend([dev.clone(), finance.clone(), infra.clone()]);

    // A real agent enrols with a one-time token and keeps its agent token in its state dir.
    let r = app
        .call(
            Method::POST,
            "/api/v1/enrolment-tokens",
            Some(&infra),
            Some(json!({"pool": POOL})),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let enrol = r.body["token"].as_str().unwrap().to_string();
    secrets.push(enrol.clone());
    let state = tempfile::tempdir().unwrap();
    let mut args = switchyard_agent::AgentArgs::new(app.url.parse().unwrap());
    args.enrol_token = Some(enrol.parse().unwrap());
    args.fake_gpus = vec!["4xH100-80GB".parse().unwrap()];
    args.name = Some("secretive".into());
    args.state_dir = Some(state.path().to_path_buf());
    args.poll_wait_s = 1;
    args.grace_s = 1;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let agent_task = tokio::spawn(switchyard_agent::run_until(args, async {
        let _ = stopped.await;
    }));

    // A job with a secret in its environment runs on it.
    let secret_env = format!("hunter2-{}", uuid::Uuid::now_v7().simple());
    secrets.push(secret_env.clone());
    let mut spec = job_spec("ml");
    spec["command"] = json!(["sh", "-c", "test -n \"$DB_PASSWORD\" && echo ok"]);
    spec["env"] = json!({"DB_PASSWORD": secret_env});
    let r = app.submit(&dev, spec).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let id = r.body["id"].as_str().unwrap().to_string();
    let job = app
        .wait_for_job(&dev, &id, Duration::from_secs(30), |j| {
            matches!(j["state"].as_str(), Some("succeeded" | "failed"))
        })
        .await;
    assert_eq!(job["state"], "succeeded", "{job}");

    // The agent's token, from its saved enrolment.
    let mut saved = Vec::new();
    for entry in std::fs::read_dir(state.path()).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap_or_default();
        if let Ok(v) = serde_json::from_str::<Value>(&text) {
            strings_with_prefix(&v, "syg_", &mut saved);
        }
    }
    assert!(!saved.is_empty(), "the agent saved no token");
    secrets.extend(saved);

    // A hand-played agent, and its enrolment token used a second time (refused).
    let hand = app.agent(1).await;
    secrets.extend([hand.token.clone(), hand.enrol.clone()]);
    let r = app
        .call(
            Method::POST,
            "/agent/v1/register",
            Some(&hand.enrol),
            Some(register_body(1)),
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);

    // Console sign-in: the session id and the CSRF token are secrets too.
    let res = app
        .http
        .post(format!("{}/console/login", app.url))
        .json(&json!({"token": finance}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let cookies: Vec<String> = res
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|c| c.to_str().unwrap().split(';').next().unwrap().to_string())
        .collect();
    let cookie_value = |name: &str| {
        cookies
            .iter()
            .find_map(|c| c.strip_prefix(&format!("{name}=")))
            .unwrap()
            .to_string()
    };
    let (session, csrf) = (cookie_value("sy_session"), cookie_value("sy_csrf"));
    secrets.extend([session.clone(), csrf.clone()]);
    let cookie = format!("sy_session={session}; sy_csrf={csrf}");
    let res = app
        .http
        .get(format!("{}/api/v1/spend", app.url))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let res = app
        .http
        .post(format!("{}/console/logout", app.url))
        .header("cookie", &cookie)
        .header("x-csrf-token", &csrf)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::NO_CONTENT);

    // Made-up credentials of every kind: refused, and not written down either.
    let made_up: Vec<String> = ["sya_", "syg_", "sye_", "sys_"]
        .iter()
        .map(|p| format!("{p}{}", uuid::Uuid::now_v7().simple()))
        .collect();
    for t in &made_up[..2] {
        let r = app.call(Method::GET, "/api/v1/jobs", Some(t), None).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED);
        let r = app
            .call(Method::GET, "/agent/v1/work?wait_s=0", Some(t), None)
            .await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    }
    let r = app
        .call(
            Method::POST,
            "/agent/v1/register",
            Some(&made_up[2]),
            Some(register_body(1)),
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    let r = app
        .call(
            Method::POST,
            "/console/login",
            None,
            Some(json!({"token": made_up[0]})),
        )
        .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    let res = app
        .http
        .get(format!("{}/api/v1/jobs", app.url))
        .header("cookie", format!("sy_session={}", made_up[3]))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    secrets.extend(made_up);

    let _ = stop.send(());
    agent_task.await.unwrap().unwrap();

    // The capture works: a line written the way the broker writes them is found.
    let canary = format!("canary-{}", uuid::Uuid::now_v7().simple());
    tracing::info!(token = %canary, "a line that must be caught");
    let text = String::from_utf8(logs.lock().unwrap().clone()).unwrap();
    assert!(text.contains(&canary), "the log capture misses lines");
    let lines = text.lines().count();
    assert!(
        lines > 50,
        "too few log lines captured ({lines}) for the test to mean anything"
    );
    // The run really was logged: the job's id appears (so the filter let the broker through).
    assert!(text.contains(&id), "the job's id is in no log line");
    eprintln!(
        "{lines} log lines ({} bytes) scanned for {} secrets",
        text.len(),
        secrets.len()
    );
    for s in &secrets {
        if let Some(line) = text.lines().find(|l| l.contains(s.as_str())) {
            panic!("a secret ({}…) is in the logs: {line}", &s[..6]);
        }
    }
}

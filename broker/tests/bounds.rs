//! Bad input is refused at the door, in the one error shape naming the field, and stores
//! nothing: a JSON body with trailing data on every kind of JSON route; out-of-range job
//! specs, policies and token names; agent telemetry out of range (which never reaches
//! `/metrics`). And the doors themselves: a client address that keeps failing to authenticate
//! is throttled without locking out the good credentials behind it, the console's cookies are
//! `Secure` under TLS, and enrolment tokens made through the API are audited.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use axum::body::Body;
use axum::extract::ConnectInfo;
use common::*;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::time::Duration;
use tower::ServiceExt;

fn assert_invalid(r: &Response, field: &str, what: &str) {
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{what}: {}", r.body);
    assert_eq!(r.error_code(), "invalid_field", "{what}: {}", r.body);
    assert_eq!(r.error_field(), field, "{what}: {}", r.body);
    assert!(
        r.body["error"]["message"].as_str().unwrap().contains(field),
        "{what}: the message names the field: {}",
        r.body
    );
}

// ---- Trailing data --------------------------------------------------------------------------

#[tokio::test]
async fn a_json_body_with_trailing_data_is_malformed_on_every_kind_of_json_route() {
    let app = TestApp::spawn().await;
    let agent = app.agent(1).await;
    let spec = job_spec("ml").to_string();
    for tail in ["xyz", "{}", " {\"name\": \"b\"}", "\n]"] {
        let body = format!("{spec}{tail}").into_bytes();
        let what = format!("a job spec followed by {tail:?}");
        let r = app
            .raw("/api/v1/jobs", &app.admin, "application/json", body)
            .await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{what}: {}", r.body);
        assert_eq!(r.error_code(), "malformed_json", "{what}: {}", r.body);
    }
    assert_eq!(app.job_count().await, 0);

    // A REST write other than jobs, and the agent protocol.
    let policy = app
        .raw(
            "/api/v1/tokens",
            &app.admin,
            "application/json",
            br#"{"role": "admin"}{"role": "admin"}"#.to_vec(),
        )
        .await;
    assert_eq!(policy.error_code(), "malformed_json", "{}", policy.body);
    let tokens = app
        .call(Method::GET, "/api/v1/tokens", Some(&app.admin), None)
        .await;
    assert_eq!(tokens.body["tokens"].as_array().unwrap().len(), 1);
    let beat = json!({"inventory": register_body(1)["inventory"], "running": []});
    let r = app
        .raw(
            "/agent/v1/heartbeat",
            &agent.token,
            "application/json",
            format!("{beat}xyz").into_bytes(),
        )
        .await;
    assert_eq!(r.error_code(), "malformed_json", "{}", r.body);

    // A registration with trailing data is refused and leaves its one-time token unused.
    let enrol = app
        .call(
            Method::POST,
            "/api/v1/enrolment-tokens",
            Some(&app.admin),
            Some(json!({"pool": POOL})),
        )
        .await;
    let enrol = enrol.body["token"].as_str().unwrap().to_string();
    let r = app
        .raw(
            "/agent/v1/register",
            &enrol,
            "application/json",
            format!("{}{{}}", register_body(1)).into_bytes(),
        )
        .await;
    assert_eq!(r.error_code(), "malformed_json", "{}", r.body);
    app.agent_with_token(&enrol, 1).await;

    // The console's sign-in reads its JSON itself: the same rule, and no cookie.
    let res = app
        .http
        .post(format!("{}/console/login", app.url))
        .header("content-type", "application/json")
        .body(format!("{}{{}}", json!({"token": app.admin})))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    assert!(res.headers().get("set-cookie").is_none());
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["error"]["code"], "malformed_json", "{body}");
}

// ---- Bounds on what users send ---------------------------------------------------------------

#[tokio::test]
async fn job_specs_with_an_unbounded_runtime_or_unprintable_names_are_refused() {
    let app = TestApp::spawn().await;
    let long = "n".repeat(129);
    let mut cases: Vec<(Value, &str, String)> = Vec::new();
    for rt in [
        json!(9_223_372_036_854_775_807_i64),
        json!(2_592_001),
        json!(0),
    ] {
        let mut spec = job_spec("ml");
        spec["estimated_runtime_s"] = rt.clone();
        cases.push((spec, "estimated_runtime_s", format!("runtime {rt}")));
    }
    for bad in [
        "a\u{1b}[2Jb",
        "a\0b",
        "bell\u{7}",
        "a\rb",
        "a\nb",
        "a\tb",
        "evil\u{202e}gpj.exe",
        "\u{2066}x",
        long.as_str(),
        "",
    ] {
        let mut spec = job_spec("ml");
        spec["name"] = json!(bad);
        cases.push((spec, "name", format!("name {bad:?}")));
    }
    for (field, bad) in [("team", "ml\u{1b}"), ("project", "vision\u{202e}")] {
        let mut spec = job_spec("ml");
        spec[field] = json!(bad);
        cases.push((spec, field, format!("{field} {bad:?}")));
    }
    for (spec, field, what) in cases {
        let r = app.submit(&app.admin, spec).await;
        assert_invalid(&r, field, &what);
    }
    assert_eq!(app.job_count().await, 0, "nothing was stored");

    // The bounds themselves are accepted: 30 days, 128 characters (not bytes).
    let mut spec = job_spec("ml");
    spec["estimated_runtime_s"] = json!(2_592_000);
    spec["name"] = json!("é".repeat(128));
    let r = app.submit(&app.admin, spec).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
}

#[tokio::test]
async fn policies_with_too_many_windows_or_alerts_are_refused_and_store_nothing() {
    let app = TestApp::spawn().await;
    let finance = app.token("finance", None).await;
    let windows = |n: usize| -> Value {
        json!({"windows": (0..n).map(|_| json!({"from": "20:00", "to": "08:00"})).collect::<Vec<_>>()})
    };
    let alerts = |n: usize| -> Value {
        json!({"budget": {"amount_usd": 100.0, "period": "month",
            "alert_at": (1..=n).map(|i| i as f64 / n as f64).collect::<Vec<_>>()}})
    };
    let put = async |team: &str, body: Value| {
        app.call(
            Method::PUT,
            &format!("/api/v1/policies/{team}"),
            Some(&finance),
            Some(body),
        )
        .await
    };
    assert_invalid(
        &put("ml", windows(10_000)).await,
        "windows",
        "10000 windows",
    );
    assert_invalid(&put("ml", windows(65)).await, "windows", "65 windows");
    assert_invalid(
        &put("ml", alerts(10_000)).await,
        "budget.alert_at",
        "10000 alerts",
    );
    assert_invalid(&put("ml", alerts(17)).await, "budget.alert_at", "17 alerts");
    assert_invalid(
        &put("ml%1B%5B2J", windows(1)).await,
        "team",
        "ESC in the team",
    );
    let r = app
        .call(Method::GET, "/api/v1/policies", Some(&finance), None)
        .await;
    assert_eq!(r.body["policies"], json!([]), "nothing was stored");
    assert_eq!(put("ml", windows(64)).await.status, StatusCode::CREATED);
    assert_eq!(put("web", alerts(16)).await.status, StatusCode::CREATED);
}

#[tokio::test]
async fn token_names_and_teams_are_bounded_printable_and_a_developer_needs_a_team() {
    let app = TestApp::spawn().await;
    let huge = format!("{}\u{1b}\0", "x".repeat(100_000));
    let cases = [
        (
            json!({"role": "admin", "name": huge}),
            "name",
            "a 100 KB name with ESC and NUL",
        ),
        (
            json!({"role": "admin", "name": "ops\u{1b}]0;pwned\u{7}"}),
            "name",
            "ESC in the name",
        ),
        (
            json!({"role": "admin", "name": "a\u{202e}b"}),
            "name",
            "RTL override in the name",
        ),
        (
            json!({"role": "admin", "name": "n".repeat(129)}),
            "name",
            "129 characters",
        ),
        (
            json!({"role": "developer"}),
            "team",
            "a developer without a team",
        ),
        (
            json!({"role": "developer", "team": "ml\u{1b}"}),
            "team",
            "ESC in the team",
        ),
        (
            json!({"role": "developer", "team": "ml research"}),
            "team",
            "a space in the team",
        ),
        (
            json!({"role": "developer", "team": ""}),
            "team",
            "an empty team",
        ),
        (
            json!({"role": "finance", "team": "x".repeat(65)}),
            "team",
            "a 65-byte team",
        ),
    ];
    for (body, field, what) in cases {
        let r = app
            .call(Method::POST, "/api/v1/tokens", Some(&app.admin), Some(body))
            .await;
        assert_invalid(&r, field, what);
    }
    let r = app
        .call(Method::GET, "/api/v1/tokens", Some(&app.admin), None)
        .await;
    assert_eq!(r.body["tokens"].as_array().unwrap().len(), 1, "{}", r.body);
    let r = app
        .call(
            Method::POST,
            "/api/v1/tokens",
            Some(&app.admin),
            Some(json!({"role": "developer", "team": "ml-research", "name": "Zoë's laptop"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
}

// ---- Agent telemetry --------------------------------------------------------------------------

fn gpu(over: Value) -> Value {
    let mut g = json!({"index": 0, "uuid": "GPU-0", "model": "H100", "memory_mb": 81920,
        "memory_used_mb": 1024, "utilization_pct": 50, "temperature_c": 61, "power_w": 300.5});
    for (k, v) in over.as_object().unwrap() {
        g[k] = v.clone();
    }
    g
}

fn inventory(gpus: Vec<Value>) -> Value {
    json!({"gpus": gpus, "cpus": 8, "memory_mb": 65536, "simulated": true})
}

/// Readings out of physical range, as a single GPU's, and the field: dropped and counted
/// (issue 28), the rest of the heartbeat still counts.
fn impossible_readings() -> Vec<(Value, &'static str)> {
    vec![
        (json!({"temperature_c": 4_294_967_295_u64}), "temperature_c"),
        (json!({"temperature_c": 201}), "temperature_c"),
        (json!({"power_w": 1e308}), "power_w"),
        (json!({"power_w": -1.0}), "power_w"),
        (json!({"utilization_pct": 101}), "utilization_pct"),
        (json!({"memory_used_mb": 81921}), "memory_used_mb"),
    ]
}

/// An inventory out of range (not a reading: what the GPU is), as a single GPU's, and the
/// field named.
fn bad_gpus() -> Vec<(Vec<Value>, &'static str)> {
    vec![
        (
            vec![gpu(json!({"memory_mb": 4_194_305, "memory_used_mb": 0}))],
            "inventory.gpus[0].memory_mb",
        ),
        (
            vec![gpu(json!({"uuid": "GPU-\u{1b}[31m"}))],
            "inventory.gpus[0].uuid",
        ),
        (
            vec![gpu(json!({"model": "H100\0"}))],
            "inventory.gpus[0].model",
        ),
        (
            vec![gpu(json!({"model": "m".repeat(129)}))],
            "inventory.gpus[0].model",
        ),
        (
            (0..65).map(|i| gpu(json!({"index": i}))).collect(),
            "inventory.gpus",
        ),
    ]
}

#[tokio::test]
async fn agent_inventory_out_of_range_is_refused_and_impossible_readings_never_reach_metrics() {
    let app = TestApp::spawn().await;
    let enrol = app
        .call(
            Method::POST,
            "/api/v1/enrolment-tokens",
            Some(&app.admin),
            Some(json!({"pool": POOL})),
        )
        .await;
    let enrol = enrol.body["token"].as_str().unwrap().to_string();
    let register =
        |body: Value| app.call(Method::POST, "/agent/v1/register", Some(&enrol), Some(body));
    for (gpus, field) in bad_gpus() {
        let body = json!({"hostname": "h", "agent_version": "1", "inventory": inventory(gpus)});
        assert_invalid(&register(body).await, field, field);
    }
    for (over, field) in [
        (json!({"hostname": "evil\u{1b}]2;x\u{7}"}), "hostname"),
        (json!({"hostname": "h".repeat(254)}), "hostname"),
        (json!({"agent_version": "1\r\n2"}), "agent_version"),
    ] {
        let mut body = json!({"hostname": "h", "agent_version": "1",
            "inventory": inventory(vec![gpu(json!({}))])});
        for (k, v) in over.as_object().unwrap() {
            body[k] = v.clone();
        }
        assert_invalid(&register(body).await, field, field);
    }
    let r = app
        .call(Method::GET, "/api/v1/agent-tokens", Some(&app.admin), None)
        .await;
    assert_eq!(r.body["agent_tokens"], json!([]), "no node was stored");

    // The enrolment token is still unused; the agent joins, and reports.
    let agent = app.agent_with_token(&enrol, 1).await;
    let beat = |inv: Value| {
        app.call(
            Method::POST,
            "/agent/v1/heartbeat",
            Some(&agent.token),
            Some(json!({"inventory": inv, "running": []})),
        )
    };
    assert_eq!(
        beat(inventory(vec![gpu(json!({}))])).await.status,
        StatusCode::OK
    );
    for (gpus, field) in bad_gpus() {
        assert_invalid(&beat(inventory(gpus)).await, field, field);
    }
    for (reading, field) in impossible_readings() {
        let r = beat(inventory(vec![gpu(reading.clone())])).await;
        assert_eq!(r.status, StatusCode::OK, "{reading}: {}", r.body);
        let metrics = app
            .call(Method::GET, "/metrics", Some(&app.admin), None)
            .await;
        let text = metrics.body.as_str().unwrap();
        assert!(
            text.contains(&format!(
                "switchyard_telemetry_dropped_total{{field=\"{field}\"}}"
            )),
            "{text}"
        );
        let readings: Vec<&str> = text
            .lines()
            .filter(|l| {
                [
                    "DCGM_FI_DEV_GPU_TEMP{",
                    "DCGM_FI_DEV_POWER_USAGE{",
                    "DCGM_FI_DEV_GPU_UTIL{",
                    "DCGM_FI_DEV_FB_USED{",
                ]
                .iter()
                .any(|p| l.starts_with(p))
            })
            .collect();
        assert_eq!(
            readings.len(),
            3,
            "the other three readings: {reading}: {text}"
        );
        for line in readings {
            let value = line.rsplit(' ').next().unwrap();
            assert!(
                ["61", "300.5", "50", "1024"].contains(&value),
                "only the good readings: {line}"
            );
        }
    }
}

// ---- Failed authentications -------------------------------------------------------------------

/// The broker's router, called as if from `peer` (what the server records of a connection).
struct Door {
    router: axum::Router,
}

struct Answer {
    status: StatusCode,
    retry_after: Option<u64>,
    body: Value,
}

impl Door {
    async fn send(
        &self,
        peer: &str,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> Answer {
        let mut req = axum::http::Request::builder()
            .method(method.as_str())
            .uri(path);
        if let Some(t) = token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        let body = match body {
            Some(b) => {
                req = req.header("content-type", "application/json");
                Body::from(b.to_string())
            }
            None => Body::empty(),
        };
        let mut req = req.body(body).unwrap();
        let peer: SocketAddr = peer.parse().unwrap();
        req.extensions_mut().insert(ConnectInfo(peer));
        let res = self.router.clone().oneshot(req).await.unwrap();
        let status = StatusCode::from_u16(res.status().as_u16()).unwrap();
        let retry_after = res
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().parse().unwrap());
        let bytes = axum::body::to_bytes(res.into_body(), 1 << 20)
            .await
            .unwrap();
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Answer {
            status,
            retry_after,
            body,
        }
    }
}

#[tokio::test]
async fn an_address_that_keeps_failing_to_authenticate_is_throttled_but_proven_credentials_behind_it_are_not()
 {
    let app = TestApp::spawn().await;
    let door = Door {
        router: switchyard_broker::http::api::router(app.app.clone()),
    };
    const ATTACKER: &str = "203.0.113.7:40000";
    const NEIGHBOUR: &str = "198.51.100.4:40000";
    let dev = app.token("developer", Some("ml")).await;
    let agent = app.agent(1).await;
    // The developer and the agent work from the attacker's address (one NAT) before the attack.
    let r = door
        .send(ATTACKER, Method::GET, "/api/v1/jobs", Some(&dev), None)
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let work = "/agent/v1/work?wait_s=0";
    let r = door
        .send(ATTACKER, Method::GET, work, Some(&agent.token), None)
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);

    // Twenty failures of every kind: made-up bearer, agent and enrolment tokens, and sign-ins.
    let made_up = |prefix: &str| format!("{prefix}{}", uuid::Uuid::now_v7().simple());
    for i in 0..5 {
        let r = door
            .send(
                ATTACKER,
                Method::GET,
                "/api/v1/jobs",
                Some(&made_up("sya_")),
                None,
            )
            .await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "bearer {i}");
        let r = door
            .send(ATTACKER, Method::GET, work, Some(&made_up("syg_")), None)
            .await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "agent {i}");
        let r = door
            .send(
                ATTACKER,
                Method::POST,
                "/agent/v1/register",
                Some(&made_up("sye_")),
                Some(register_body(1)),
            )
            .await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "enrolment {i}");
        let r = door
            .send(
                ATTACKER,
                Method::POST,
                "/console/login",
                None,
                Some(json!({"token": made_up("sya_")})),
            )
            .await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "sign-in {i}");
    }

    // The budget is spent: every route that takes a secret answers 429, before any lookup —
    // even a good token that has not proved itself from here yet is not looked at.
    let fresh = app.token("developer", Some("ml")).await;
    let throttled = [
        (Method::GET, "/api/v1/jobs", Some(made_up("sya_")), None),
        (Method::GET, "/api/v1/jobs", Some(fresh.clone()), None),
        (Method::GET, work, Some(made_up("syg_")), None),
        (
            Method::POST,
            "/agent/v1/register",
            Some(made_up("sye_")),
            Some(register_body(1)),
        ),
        (
            Method::POST,
            "/console/login",
            None,
            Some(json!({"token": fresh.clone()})),
        ),
    ];
    let mut retry = 0;
    for (m, path, token, body) in throttled {
        let r = door
            .send(ATTACKER, m.clone(), path, token.as_deref(), body)
            .await;
        assert_eq!(
            r.status,
            StatusCode::TOO_MANY_REQUESTS,
            "{m} {path}: {}",
            r.body
        );
        assert_eq!(r.body["error"]["code"], "rate_limited", "{}", r.body);
        retry = r.retry_after.expect("Retry-After");
        assert!((1..=3).contains(&retry), "Retry-After {retry}");
    }

    // Credentials that proved themselves from there still work; other addresses are untouched.
    let r = door
        .send(ATTACKER, Method::GET, "/api/v1/jobs", Some(&dev), None)
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let r = door
        .send(ATTACKER, Method::GET, work, Some(&agent.token), None)
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let r = door
        .send(NEIGHBOUR, Method::GET, "/api/v1/jobs", Some(&fresh), None)
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let r = door
        .send(
            NEIGHBOUR,
            Method::GET,
            "/api/v1/jobs",
            Some(&made_up("sya_")),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);

    // After Retry-After, one more try is allowed (the budget refills at 20 a minute).
    tokio::time::sleep(Duration::from_millis(retry * 1000 + 100)).await;
    let r = door
        .send(ATTACKER, Method::GET, "/api/v1/jobs", Some(&fresh), None)
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
}

#[tokio::test]
async fn an_ipv6_client_is_counted_by_its_64_so_new_addresses_do_not_reset_its_budget() {
    let app = TestApp::spawn().await;
    let door = Door {
        router: switchyard_broker::http::api::router(app.app.clone()),
    };
    for i in 0..20 {
        let peer = format!("[2001:db8:1:2::{:x}]:443", i + 1);
        let r = door
            .send(
                &peer,
                Method::GET,
                "/api/v1/jobs",
                Some("sya_made-up"),
                None,
            )
            .await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{i}");
    }
    let r = door
        .send(
            "[2001:db8:1:2:ffff::9]:443",
            Method::GET,
            "/api/v1/jobs",
            Some("sya_x"),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    let r = door
        .send(
            "[2001:db8:1:3::1]:443",
            Method::GET,
            "/api/v1/jobs",
            Some("sya_x"),
            None,
        )
        .await;
    assert_eq!(
        r.status,
        StatusCode::UNAUTHORIZED,
        "another /64 is another client"
    );
}

// ---- Console cookies under TLS -----------------------------------------------------------------

/// A CA and a server certificate it signed for localhost; PEM files in `dir`.
fn pki(dir: &std::path::Path) -> (String, std::path::PathBuf, std::path::PathBuf) {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    let (cert_path, key_path) = (dir.join("server.pem"), dir.join("server.key"));
    std::fs::write(&cert_path, cert.pem()).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    (ca.pem(), cert_path, key_path)
}

#[tokio::test]
async fn console_cookies_are_secure_when_the_broker_serves_tls_without_a_public_url() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = pki(dir.path());
    let mut config = test_config(dir.path());
    config.tls_cert = Some(cert);
    config.tls_key = Some(key);
    config.public_url = None;
    config.validate().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let running =
        switchyard_broker::app::App::start(config, switchyard_broker::app::ProviderSet::default())
            .await
            .unwrap();
    let admin = running.created_admin_token.clone().unwrap();
    tokio::spawn(switchyard_broker::http::server::serve(
        running.app.clone(),
        listener,
        std::future::pending(),
    ));
    let http = reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(ca.as_bytes()).unwrap()])
        .build()
        .unwrap();
    let res = http
        .post(format!("https://localhost:{port}/console/login"))
        .json(&json!({ "token": admin }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let cookies: Vec<&str> = res
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect();
    assert_eq!(cookies.len(), 2, "{cookies:?}");
    for c in cookies {
        assert!(
            c.split(';').any(|a| a.trim() == "Secure"),
            "cookie without Secure under TLS: {c}"
        );
    }
    drop(running);
}

// ---- Audit -------------------------------------------------------------------------------------

#[tokio::test]
async fn an_enrolment_token_made_through_the_api_is_audited_without_the_token() {
    let app = TestApp::spawn().await;
    let infra = app.token("infra", None).await;
    let r = app
        .call(
            Method::POST,
            "/api/v1/enrolment-tokens",
            Some(&infra),
            Some(json!({"pool": POOL, "ttl_s": 600})),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let token = r.body["token"].as_str().unwrap().to_string();
    let audit = app
        .call(Method::GET, "/api/v1/audit", Some(&app.admin), None)
        .await;
    assert_eq!(audit.status, StatusCode::OK, "{}", audit.body);
    let entries = audit.body["entries"].as_array().unwrap();
    let row = entries
        .iter()
        .find(|e| e["action"] == "enrolment_token.create")
        .unwrap_or_else(|| panic!("no enrolment_token.create row: {}", audit.body));
    assert!(
        row["actor"].as_str().unwrap().starts_with("infra:"),
        "{row}"
    );
    assert_eq!(row["target"], format!("pool:{POOL}"));
    assert_eq!(row["after"]["pool"], POOL);
    assert_eq!(row["after"]["expires_at"], r.body["expires_at"], "{row}");
    let text = audit.body.to_string();
    assert!(!text.contains(&token), "the token is in the audit log");
    assert!(
        !text.contains(&switchyard_broker::http::auth::hash_token(&token)),
        "the token's hash is in the audit log"
    );
}

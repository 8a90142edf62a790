//! HTTPS and the connection bounds of `server.rs`: a broker serving TLS with a certificate of
//! a CA made here (rcgen) is reached by a client and a real agent that trust that CA, and
//! refused by clients that do not, or when the certificate names another host; a connection
//! that sends partial headers, nothing at all, or stalls its TLS handshake is closed within
//! `header_timeout_ms`, an idle keep-alive connection too, while a long-poll outlives the
//! idle bound; and a stop drains what is in flight.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use reqwest::{Method, StatusCode};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use switchyard_broker::app::{App, ProviderSet};
use switchyard_broker::config::Config;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A CA, and a server certificate it signed for `names`; PEM files in `dir`.
struct Pki {
    ca: String,
    cert: PathBuf,
    key: PathBuf,
}

fn pki(dir: &Path, names: &[&str]) -> Pki {
    use rcgen::{
        BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair,
        KeyUsagePurpose,
    };
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "Switchyard test CA");
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(names)
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    let (cert_path, key_path) = (dir.join("server.pem"), dir.join("server.key"));
    std::fs::write(&cert_path, cert.pem()).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    Pki {
        ca: ca.pem(),
        cert: cert_path,
        key: key_path,
    }
}

/// A broker serving HTTPS (or HTTP without `tls`) on an ephemeral port, stopped with `stop`.
struct Broker {
    url: String,
    port: u16,
    admin: String,
    app: App,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    served: tokio::task::JoinHandle<anyhow::Result<()>>,
    running: switchyard_broker::app::Running,
    _dir: tempfile::TempDir,
}

async fn broker(tls: Option<&Pki>, tweak: impl FnOnce(&mut Config)) -> Broker {
    let dir = tempfile::tempdir().unwrap();
    let mut config = test_config(dir.path());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let scheme = if let Some(pki) = tls {
        config.tls_cert = Some(pki.cert.clone());
        config.tls_key = Some(pki.key.clone());
        "https"
    } else {
        "http"
    };
    let url = format!("{scheme}://localhost:{port}");
    config.public_url = Some(url.clone());
    tweak(&mut config);
    config.validate().unwrap();
    let running = App::start(config, ProviderSet::default()).await.unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(switchyard_broker::http::server::serve(
        running.app.clone(),
        listener,
        async move {
            let _ = rx.await;
        },
    ));
    Broker {
        url,
        port,
        admin: running.created_admin_token.clone().unwrap(),
        app: running.app.clone(),
        stop: Some(tx),
        served,
        running,
        _dir: dir,
    }
}

fn client_trusting(ca_pem: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(ca_pem.as_bytes()).unwrap()])
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_client_with_the_ca_is_served_and_clients_without_it_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ours = pki(dir.path(), &["localhost", "127.0.0.1"]);
    let b = broker(Some(&ours), |_| {}).await;
    let good = client_trusting(&ours.ca);
    for url in [
        format!("{}/healthz", b.url),
        format!("https://127.0.0.1:{}/healthz", b.port),
    ] {
        let r = good.get(&url).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{url}");
        // ALPN picked HTTP/2; the public URL is https, so HSTS is on.
        assert_eq!(r.version(), reqwest::Version::HTTP_2, "{url}");
        assert!(
            r.headers().contains_key("strict-transport-security"),
            "{url}"
        );
    }
    // An authenticated API call over TLS.
    let r = good
        .get(format!("{}/api/v1/pools", b.url))
        .bearer_auth(&b.admin)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);

    // The system's roots do not know the test CA; another CA is no better.
    let system = reqwest::Client::new();
    let err = system
        .get(format!("{}/healthz", b.url))
        .send()
        .await
        .unwrap_err();
    assert!(err.is_connect(), "{err:?}");
    let other = pki(tempfile::tempdir().unwrap().path(), &["localhost"]);
    let err = client_trusting(&other.ca)
        .get(format!("{}/healthz", b.url))
        .send()
        .await
        .unwrap_err();
    assert!(err.is_connect(), "{err:?}");
    // Plain HTTP to the TLS port gets no answer.
    let plain = reqwest::Client::new()
        .get(format!("http://127.0.0.1:{}/healthz", b.port))
        .send()
        .await;
    assert!(plain.is_err(), "{plain:?}");
    // And the broker still serves after all that.
    let r = good.get(format!("{}/healthz", b.url)).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_certificate_for_another_host_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki(dir.path(), &["broker.example.com"]);
    let b = broker(Some(&pki), |_| {}).await;
    let client = client_trusting(&pki.ca);
    for url in [
        format!("{}/healthz", b.url),
        format!("https://127.0.0.1:{}/healthz", b.port),
    ] {
        let err = client.get(&url).send().await.unwrap_err();
        assert!(err.is_connect(), "{url}: {err:?}");
    }
    // The agent's client refuses it the same way.
    let ca_path = dir.path().join("ca.pem");
    std::fs::write(&ca_path, &pki.ca).unwrap();
    let agent =
        switchyard_agent::client::BrokerClient::with_ca(&[b.url.parse().unwrap()], Some(&ca_path))
            .unwrap();
    let err = agent
        .register(
            &switchyard_agent::args::Secret::new("sye_x"),
            &serde_json::from_value(register_body(1)).unwrap(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, switchyard_agent::client::CallError::Network(_)),
        "{err:?}"
    );
}

/// The `switchyard` CLI (the real binary) lists pools from an https broker with `--ca-cert`
/// (or `SWITCHYARD_CA_CERT`), and refuses the broker's certificate without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_with_ca_cert_reaches_an_https_broker_and_refuses_it_without() {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki(dir.path(), &["localhost", "127.0.0.1"]);
    let b = broker(Some(&pki), |_| {}).await;
    let ca_path = dir.path().join("ca.pem");
    std::fs::write(&ca_path, &pki.ca).unwrap();
    let cli = |ca: Option<(&str, &Path)>| {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_switchyard"));
        cmd.args(["pools", "--json"])
            .env("SWITCHYARD_URL", &b.url)
            .env("SWITCHYARD_TOKEN", &b.admin)
            .env_remove("SWITCHYARD_CA_CERT")
            .kill_on_drop(true);
        match ca {
            Some(("flag", path)) => {
                cmd.arg("--ca-cert").arg(path);
            }
            Some((_, path)) => {
                cmd.env("SWITCHYARD_CA_CERT", path);
            }
            None => {}
        }
        cmd.output()
    };
    for how in ["flag", "env"] {
        let out = cli(Some((how, &ca_path))).await.unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{how}: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let pools: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        assert!(
            !pools["pools"].as_array().unwrap().is_empty(),
            "{how}: {pools}"
        );
    }
    let out = cli(None).await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "served without the CA: {stderr}");
    assert!(stderr.contains("cannot reach the broker"), "{stderr}");
    // A file with no certificate in it is a clear error, before any request.
    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "not a certificate\n").unwrap();
    let out = cli(Some(("flag", &empty))).await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("--ca-cert"),
        "{stderr}"
    );
}

/// A real agent (the library `switchyard-agent` runs) with `--ca-cert` enrols over HTTPS and
/// runs a job; one without it never enrols.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_with_ca_cert_enrols_and_runs_a_job_over_https() {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki(dir.path(), &["localhost"]);
    let ca_path = dir.path().join("ca.pem");
    std::fs::write(&ca_path, &pki.ca).unwrap();
    let b = broker(Some(&pki), |_| {}).await;
    let http = client_trusting(&pki.ca);
    let call = |m: Method, path: &str, body: Option<serde_json::Value>| {
        let mut req = http
            .request(m, format!("{}{path}", b.url))
            .bearer_auth(&b.admin);
        if let Some(body) = body {
            req = req.json(&body);
        }
        async move {
            let r = req.send().await.unwrap();
            let status = r.status();
            (status, r.json::<serde_json::Value>().await.unwrap())
        }
    };
    let enrol = |_: ()| {
        call(
            Method::POST,
            "/api/v1/enrolment-tokens",
            Some(serde_json::json!({"pool": POOL})),
        )
    };
    let agent_args = |token: &str, ca: Option<PathBuf>, state: &str| {
        let mut a = switchyard_agent::AgentArgs::new(b.url.parse().unwrap());
        a.enrol_token = Some(token.parse().unwrap());
        a.fake_gpus = vec!["2xH100".parse().unwrap()];
        a.name = Some(state.into());
        a.grace_s = 1;
        a.poll_wait_s = 1;
        a.state_dir = Some(dir.path().join(state));
        a.ca_cert = ca;
        a
    };

    // Without the CA the agent cannot reach the broker: nothing enrols.
    let (_, t) = enrol(()).await;
    let args = agent_args(t["token"].as_str().unwrap(), None, "no-ca");
    let stray = tokio::spawn(switchyard_agent::run_until(
        args,
        tokio::time::sleep(Duration::from_secs(2)),
    ));
    let _ = stray.await.unwrap();
    let (status, list) = call(Method::GET, "/api/v1/agent-tokens", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(list["agent_tokens"].as_array().unwrap().len(), 0, "{list}");

    // With it, the agent enrols and runs a job.
    let (_, t) = enrol(()).await;
    let args = agent_args(
        t["token"].as_str().unwrap(),
        Some(ca_path.clone()),
        "with-ca",
    );
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let agent = tokio::spawn(switchyard_agent::run_until(args, async move {
        let _ = stop_rx.await;
    }));
    let (status, job) = call(
        Method::POST,
        "/api/v1/jobs",
        Some(
            serde_json::json!({"name": "tls", "team": "ml", "command": ["true"],
            "resources": {"gpus": 1}}),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{job}");
    let id = job["id"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, j) = call(Method::GET, &format!("/api/v1/jobs/{id}"), None).await;
        if j["state"] == "succeeded" {
            break;
        }
        assert!(Instant::now() < deadline, "job did not succeed: {j}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, list) = call(Method::GET, "/api/v1/agent-tokens", None).await;
    assert_eq!(list["agent_tokens"].as_array().unwrap().len(), 1, "{list}");
    let _ = stop_tx.send(());
    agent.await.unwrap().unwrap();
}

/// Reads from `stream` until EOF or an error; the time it took.
async fn closed_within(stream: &mut TcpStream, bound: Duration) -> Duration {
    let start = Instant::now();
    let mut buf = [0u8; 4096];
    let read_all = async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(bound, read_all)
        .await
        .expect("the connection was not closed in time");
    start.elapsed()
}

#[tokio::test]
async fn slow_or_silent_connections_are_closed_within_the_header_timeout() {
    let b = broker(None, |c| {
        c.header_timeout_ms = 500;
        c.idle_timeout_ms = 1_500;
    })
    .await;
    let addr = format!("127.0.0.1:{}", b.port);
    // Partial headers, then nothing.
    let mut partial = TcpStream::connect(&addr).await.unwrap();
    partial
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Slow: 1")
        .await
        .unwrap();
    let took = closed_within(&mut partial, Duration::from_secs(3)).await;
    assert!(took >= Duration::from_millis(300), "closed after {took:?}");
    // Connected, and not a byte sent.
    let mut silent = TcpStream::connect(&addr).await.unwrap();
    let took = closed_within(&mut silent, Duration::from_secs(3)).await;
    assert!(took >= Duration::from_millis(300), "closed after {took:?}");
    // A whole request is answered, then the idle keep-alive connection is closed.
    let mut kept = TcpStream::connect(&addr).await.unwrap();
    kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let n = kept.read(&mut buf).await.unwrap();
    assert!(
        String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&buf[..n])
    );
    closed_within(&mut kept, Duration::from_secs(3)).await;
    // A normal request still works, and a long-poll longer than the idle bound is served.
    let app = TestAppLike::new(&b);
    let agent = app.agent().await;
    let start = Instant::now();
    let r = reqwest::Client::new()
        .get(format!("{}/agent/v1/work?wait_s=2", b.url))
        .bearer_auth(&agent)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert!(start.elapsed() >= Duration::from_secs(2));
}

#[tokio::test]
async fn a_stalled_tls_handshake_is_closed_within_the_header_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki(dir.path(), &["localhost"]);
    let b = broker(Some(&pki), |c| c.header_timeout_ms = 500).await;
    let mut stalled = TcpStream::connect(format!("127.0.0.1:{}", b.port))
        .await
        .unwrap();
    // The first bytes of a ClientHello record, and no more.
    stalled.write_all(&[0x16, 0x03, 0x01, 0x02]).await.unwrap();
    let took = closed_within(&mut stalled, Duration::from_secs(3)).await;
    assert!(took >= Duration::from_millis(300), "closed after {took:?}");
    let r = client_trusting(&pki.ca)
        .get(format!("{}/healthz", b.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
}

/// Stopping drains: a long-poll in flight is answered, new connections are refused, `serve`
/// returns, and `Running::stop` gives the leader lease up.
#[tokio::test]
async fn a_stop_drains_requests_in_flight_and_resigns() {
    let mut b = broker(None, |_| {}).await;
    let app = TestAppLike::new(&b);
    let agent = app.agent().await;
    let url = format!("{}/agent/v1/work?wait_s=1", b.url);
    let poll = tokio::spawn(async move {
        reqwest::Client::new()
            .get(url)
            .bearer_auth(agent)
            .send()
            .await
            .map(|r| r.status())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _ = b.stop.take().unwrap().send(());
    assert_eq!(poll.await.unwrap().unwrap(), StatusCode::OK);
    tokio::time::timeout(Duration::from_secs(6), &mut b.served)
        .await
        .expect("serve returned")
        .unwrap()
        .unwrap();
    assert!(
        TcpStream::connect(format!("127.0.0.1:{}", b.port))
            .await
            .is_err()
    );
    // Wait for this replica to lead, then stop it: the lease is given up.
    let leader = async || b.app.store.leader().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !b.app.leadership.is_leader() {
        assert!(Instant::now() < deadline, "never led");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    b.running.stop().await;
    let lease = leader().await;
    assert!(
        lease
            .as_ref()
            .is_none_or(|l| l.expires_at <= b.app.clock.now()),
        "{lease:?}"
    );
}

/// The bits of `TestApp` these tests need, on a [`Broker`].
struct TestAppLike<'a>(&'a Broker);

impl<'a> TestAppLike<'a> {
    fn new(b: &'a Broker) -> Self {
        TestAppLike(b)
    }

    /// Enrols a hand-played agent; its agent token.
    async fn agent(&self) -> String {
        let http = reqwest::Client::new();
        let r: serde_json::Value = http
            .post(format!("{}/api/v1/enrolment-tokens", self.0.url))
            .bearer_auth(&self.0.admin)
            .json(&serde_json::json!({"pool": POOL}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let r = http
            .post(format!("{}/agent/v1/register", self.0.url))
            .bearer_auth(r["token"].as_str().unwrap())
            .json(&register_body(1))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::CREATED);
        let r: serde_json::Value = r.json().await.unwrap();
        r["agent_token"].as_str().unwrap().to_string()
    }
}

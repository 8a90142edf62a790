//! The Lambda Cloud provider against the fake Lambda API (`switchyard_tests::clouds::lambda`):
//! the shared contract suite, then what is Lambda's own — the launch request's shape and the
//! bootstrap reaching the cloud intact, the launch rate limit on both sides, capacity known
//! from `instance-types`, the fake's answers against Lambda's document, and a launched
//! instance running its bootstrap.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::Value;
use std::path::Path;
use std::time::{Duration, Instant};
use switchyard_core::{Market, Money, PoolId};
use switchyard_providers::bootstrap::{AgentInstall, Enrolment, render};
use switchyard_providers::lambda::{LambdaConfig, LambdaProvider, RetrySettings};
use switchyard_providers::{InstanceState, LaunchRequest, Provider, ProviderError};
use switchyard_tests::clouds::lambda::{self, FakeHandle, FakeOptions};
use switchyard_tests::clouds::{FakeCloud, Fault, boot, contract};

const POOL: &str = "lambda:us-east-1/gpu_1x_a10";
const RETIRED: &str = "gpu_8x_v100_n";

fn agent(install_command: &str) -> AgentInstall {
    AgentInstall {
        download_url: None,
        sha256: None,
        install_command: Some(install_command.into()),
        binary_path: "/usr/local/bin/switchyard-agent".into(),
        env: Default::default(),
        ca_cert_pem: None,
    }
}

/// A provider config for `fake`, with tight timeouts and retries so the suite takes seconds.
fn config(fake: &FakeHandle, dir: &Path, key: &str) -> LambdaConfig {
    let key_file = dir.join("lambda-api-key");
    std::fs::write(&key_file, format!("{key}\n")).unwrap();
    LambdaConfig {
        cluster: "test".into(),
        api_key_file: key_file,
        api_endpoint: fake.api_endpoint(),
        regions: vec!["us-east-1".into(), "us-west-1".into()],
        instance_types: vec![],
        ssh_key_name: "switchyard".into(),
        file_system_names: vec![],
        launch_min_interval_ms: 60,
        boot_time_s: 120,
        node_limit: 4,
        latency_ms: 40,
        egress_per_gb_usd: 0.0,
        request_timeout_s: 1,
        operation_timeout_s: 5,
        retry: RetrySettings {
            max_attempts: 4,
            base_delay_ms: 20,
            max_delay_ms: 100,
        },
        agent: agent("true"),
    }
}

fn request(key: &str, pool: &str) -> LaunchRequest {
    LaunchRequest {
        pool: PoolId::new(pool),
        market: Market::OnDemand,
        instance_key: key.into(),
        enrolment_token: format!("enrol-secret-{key}"),
        broker_url: "https://broker.test:8443".into(),
    }
}

#[tokio::test]
async fn the_lambda_provider_passes_the_contract() {
    let fake = lambda::start(FakeOptions {
        retired_types: vec![RETIRED.into()],
        ..FakeOptions::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(&fake, dir.path(), fake.api_key());
    // One attempt's timeout bounds a hung call: 4 × 400 ms plus the backoff.
    c.request_timeout_s = 1;
    let provider = LambdaProvider::new(c).expect("provider");
    contract::run(contract::Setup {
        provider: &provider,
        cloud: &fake,
        pool: PoolId::new(POOL),
        spot_pool: None,
        unknown_type_pool: PoolId::new(format!("lambda:us-east-1/{RETIRED}")),
        call_bound: Duration::from_millis(5_500),
        slow: Duration::from_secs(6),
        broker_url: "https://broker.test:8443".into(),
    })
    .await;
}

#[tokio::test]
async fn the_launch_carries_the_bootstrap_intact_and_the_token_nowhere_else() {
    let fake = lambda::start(FakeOptions::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let c = config(&fake, dir.path(), fake.api_key());
    let expected = render(
        &c.agent,
        &Enrolment {
            broker_url: "https://broker.test:8443",
            token: "enrol-secret-shape",
            agent_name: "shape",
        },
    )
    .unwrap();
    let provider = LambdaProvider::new(c).unwrap();
    let info = provider.launch(&request("shape", POOL)).await.unwrap();
    assert_eq!(info.state, InstanceState::Pending);
    assert_eq!(info.market, Market::OnDemand);
    assert_eq!(
        fake.user_data(&info.provider_id).as_deref(),
        Some(expected.as_str())
    );
    assert_eq!(
        fake.instance_name(&info.provider_id).as_deref(),
        Some("sy-test-shape")
    );
    let shown = fake.instance(&info.provider_id).unwrap();
    assert!(!shown.to_string().contains("enrol-secret"), "{shown}");
    let tags = &shown["tags"];
    assert_eq!(tags[0]["key"], "switchyard:cluster");
    assert_eq!(tags[0]["value"], "test");
    assert_eq!(tags[1]["key"], "switchyard:instance");
    assert_eq!(tags[1]["value"], "shape");
    assert!(format!("{provider:?}").find("enrol-secret").is_none());
    assert!(
        fake.invalid_requests().is_empty(),
        "{:?}",
        fake.invalid_requests()
    );

    // Another cluster's provider on the same account sees none of it.
    let mut other = config(&fake, dir.path(), fake.api_key());
    other.cluster = "other".into();
    let other = LambdaProvider::new(other).unwrap();
    assert!(other.list().await.unwrap().is_empty());
    assert_eq!(provider.list().await.unwrap().len(), 1);

    // No spot market: refused before any request.
    let before = fake.requests();
    let spot = LaunchRequest {
        market: Market::Spot,
        ..request("spot", POOL)
    };
    assert!(matches!(
        provider.launch(&spot).await,
        Err(ProviderError::Rejected(_))
    ));
    assert_eq!(fake.requests(), before);
    // Offers carry live prices and no spot price.
    let offers = provider.offers().await.unwrap();
    assert!(offers.pools.iter().all(|p| p.spot_per_hour.is_none()));
}

#[tokio::test]
async fn launches_are_spaced_by_the_provider_and_the_fake_refuses_a_burst() {
    let fake = lambda::start(FakeOptions {
        launch_min_interval: Duration::from_millis(150),
        ..FakeOptions::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(&fake, dir.path(), fake.api_key());
    c.launch_min_interval_ms = 200;
    let provider = LambdaProvider::new(c).unwrap();
    let started = Instant::now();
    for key in ["r1", "r2", "r3"] {
        provider.launch(&request(key, POOL)).await.expect(key);
    }
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(fake.launches(), 3);

    // Without the client-side spacing and without retries, the fake's limit answers 429.
    let mut c = config(&fake, dir.path(), fake.api_key());
    c.launch_min_interval_ms = 0;
    c.retry.max_attempts = 1;
    let eager = LambdaProvider::new(c).unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    eager.launch(&request("e1", POOL)).await.expect("first");
    let second = eager.launch(&request("e2", POOL)).await;
    assert!(
        matches!(second, Err(ProviderError::Throttled(_))),
        "{second:?}"
    );

    // A launch that would wait longer than operation_timeout_s for its slot is refused.
    let mut c = config(&fake, dir.path(), fake.api_key());
    c.launch_min_interval_ms = 3_000;
    c.operation_timeout_s = 1;
    let slow = LambdaProvider::new(c).unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    slow.launch(&request("s1", POOL)).await.expect("first");
    let refused = slow.launch(&request("s2", POOL)).await;
    assert!(
        matches!(refused, Err(ProviderError::Throttled(_))),
        "{refused:?}"
    );
}

#[tokio::test]
async fn capacity_from_instance_types_saves_a_launch_and_bad_keys_are_auth_errors() {
    let fake = lambda::start(FakeOptions::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let provider = LambdaProvider::new(config(&fake, dir.path(), fake.api_key())).unwrap();
    fake.inject(Fault::Capacity);
    provider.offers().await.unwrap();
    let r = provider.launch(&request("full", POOL)).await;
    assert!(
        matches!(&r, Err(ProviderError::Capacity { pool, .. }) if pool.as_str() == POOL),
        "{r:?}"
    );
    assert_eq!(fake.launches(), 0, "refused without a launch request");
    fake.clear_faults();
    provider.offers().await.unwrap();
    provider.launch(&request("room", POOL)).await.unwrap();

    let wrong = LambdaProvider::new(config(&fake, dir.path(), "not-the-key")).unwrap();
    assert!(matches!(wrong.list().await, Err(ProviderError::Auth(_))));
    assert!(matches!(wrong.offers().await, Err(ProviderError::Auth(_))));
    assert!(matches!(
        wrong.launch(&request("nokey", POOL)).await,
        Err(ProviderError::Auth(_))
    ));
}

#[tokio::test]
async fn offers_take_live_prices_and_a_retired_type_is_unlaunchable() {
    let fake = lambda::start(FakeOptions {
        retired_types: vec![RETIRED.into()],
        prices_cents: [("gpu_1x_a10".to_string(), 149)].into(),
        ..FakeOptions::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let provider = LambdaProvider::new(config(&fake, dir.path(), fake.api_key())).unwrap();
    let offers = provider.offers().await.unwrap();
    let pool = |id: &str| offers.pools.iter().find(|p| p.id.as_str() == id).unwrap();
    assert_eq!(
        pool(POOL).on_demand_per_hour,
        Money::from_dollars(1.49).unwrap()
    );
    assert!(pool(POOL).launchable);
    let retired = format!("lambda:us-east-1/{RETIRED}");
    assert!(!pool(&retired).launchable);
    assert_eq!(offers.regions.len(), 2);
    // A type the API no longer lists is refused without a launch request.
    let r = provider.launch(&request("old", &retired)).await;
    assert!(matches!(r, Err(ProviderError::Rejected(_))), "{r:?}");
    assert_eq!(fake.launches(), 0);
    // Without a fresh instance-types answer, the cloud itself refuses it.
    let fresh = LambdaProvider::new(config(&fake, dir.path(), fake.api_key())).unwrap();
    let r = fresh.launch(&request("old", &retired)).await;
    assert!(matches!(r, Err(ProviderError::Rejected(_))), "{r:?}");
    assert!(fake.invalid_requests().is_empty());
}

#[tokio::test]
async fn the_fakes_answers_follow_lambdas_document() {
    let fake = lambda::start(FakeOptions::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let provider = LambdaProvider::new(config(&fake, dir.path(), fake.api_key())).unwrap();
    let info = provider.launch(&request("doc", POOL)).await.unwrap();
    let spec = lambda::spec();
    let http = reqwest::Client::new();
    let get = |path: String| {
        let http = http.clone();
        let url = format!("{}{path}", fake.url());
        let key = fake.api_key().to_string();
        async move {
            let r = http.get(url).bearer_auth(key).send().await.unwrap();
            let status = r.status().as_u16();
            (status, r.json::<Value>().await.unwrap())
        }
    };
    for path in [
        "/api/v1/instance-types".to_string(),
        "/api/v1/instances".to_string(),
        format!("/api/v1/instances/{}", info.provider_id),
        "/api/v1/instances/0000".to_string(),
    ] {
        let (status, body) = get(path.clone()).await;
        lambda::check_answer(&spec, "GET", &path, status, &body)
            .unwrap_or_else(|e| panic!("GET {path} ({status}): {e:#?}"));
    }
    let post = |path: &'static str, body: Value| {
        let http = http.clone();
        let url = format!("{}{path}", fake.url());
        let key = fake.api_key().to_string();
        async move {
            let r = http
                .post(url)
                .bearer_auth(key)
                .json(&body)
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            (status, r.json::<Value>().await.unwrap())
        }
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let terminate = "/api/v1/instance-operations/terminate";
    let launch = "/api/v1/instance-operations/launch";
    let ids = serde_json::json!({ "instance_ids": [info.provider_id] });
    for (path, body) in [
        (terminate, ids.clone()),
        (terminate, ids),
        (
            launch,
            serde_json::json!({"region_name": "us-east-1", "instance_type_name": "gpu_0x_none", "ssh_key_names": ["switchyard"]}),
        ),
        (
            launch,
            serde_json::json!({"region_name": "us-east-1", "instance_type_name": 7}),
        ),
    ] {
        let (status, answer) = post(path, body).await;
        lambda::check_answer(&spec, "POST", path, status, &answer)
            .unwrap_or_else(|e| panic!("POST {path} ({status}): {e:#?}"));
    }
    // The last request broke the document: recorded, and answered 400.
    let invalid = fake.invalid_requests();
    assert_eq!(invalid.len(), 1, "{invalid:#?}");
    assert!(
        invalid[0].contains("$.instance_type_name: expected string"),
        "{invalid:?}"
    );
    assert!(
        invalid[0].contains("required property \"ssh_key_names\""),
        "{invalid:?}"
    );
}

#[tokio::test]
async fn a_launched_instance_runs_its_bootstrap_and_terminate_powers_it_off() {
    let fake = lambda::start(FakeOptions {
        run_bootstrap: true,
        ..FakeOptions::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    // The "agent": a script that stays up until the instance powers off.
    let agent_bin = dir.path().join("fake-agent");
    std::fs::write(&agent_bin, "#!/bin/sh\nexec sleep 300\n").unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&agent_bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut c = config(&fake, dir.path(), fake.api_key());
    c.agent = agent(&boot::install_command(&agent_bin));
    let provider = LambdaProvider::new(c).unwrap();
    let info = provider.launch(&request("booted", POOL)).await.unwrap();

    let deadline = Instant::now() + Duration::from_secs(20);
    let root = loop {
        if let Some(root) = fake.sandbox_root(&info.provider_id) {
            break root;
        }
        assert!(
            fake.boot_error(&info.provider_id).is_none(),
            "{:?}",
            fake.boot_error(&info.provider_id)
        );
        assert!(Instant::now() < deadline, "the instance never booted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let env = std::fs::read_to_string(root.join("etc/switchyard/agent.env")).unwrap();
    assert!(
        env.contains("SWITCHYARD_ENROL_TOKEN=\"enrol-secret-booted\""),
        "{env}"
    );
    assert!(env.contains("SWITCHYARD_AGENT_NAME=\"booted\""), "{env}");
    let log = std::fs::read_to_string(root.join("systemctl.log")).unwrap();
    assert!(
        log.contains("enable --now switchyard-agent.service"),
        "{log}"
    );
    let unit =
        std::fs::read_to_string(root.join("etc/systemd/system/switchyard-agent.service")).unwrap();
    assert!(!unit.contains("enrol-secret"), "{unit}");
    assert!(fake.agent_running(&info.provider_id));

    provider.terminate(&info.provider_id).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !fake.powered_off(&info.provider_id) {
        assert!(
            Instant::now() < deadline,
            "terminate did not power the instance off"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!fake.agent_running(&info.provider_id));
    assert!(fake.live_instances().is_empty());
}

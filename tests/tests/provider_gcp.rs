//! The GCE provider against the fake Compute Engine (`switchyard_tests::clouds::gce`): the
//! shared contract suite, then what is particular to GCE — the service-account token exchange
//! and its cache, aggregatedList pagination, zone operation failures, the spot request's shape,
//! the bootstrap reaching the instance intact (and running in a sandbox), config validation.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;
use switchyard_core::{Market, PoolId};
use switchyard_providers::gcp::{GcpConfig, GcpProvider, GcpSetupError};
use switchyard_providers::{InstanceState, LaunchRequest, Provider, ProviderError};
use switchyard_tests::clouds::gce::{self, FakeHandle, Options};
use switchyard_tests::clouds::{FakeCloud, Fault, contract};

const POOL: &str = "gcp:us-central1/g2-standard-4";
const SPOT_POOL: &str = "gcp:us-central1/a2-highgpu-1g";

/// A stand-in agent: the bootstrap installs it; it runs until powered off.
const FAKE_AGENT_INSTALL: &str = "printf '#!/bin/sh\\nexec sleep 300\\n' > \"$R/usr/local/bin/switchyard-agent\" && chmod 0755 \"$R/usr/local/bin/switchyard-agent\"";

fn config(fake: &FakeHandle, dir: &Path) -> GcpConfig {
    let credentials = fake.write_credentials(dir);
    let text = format!(
        r#"
project = "{project}"
zones = ["us-central1-a", "us-central1-b", "europe-west4-a"]
credentials_file = "{credentials}"
api_endpoint = "{url}"
image = "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64"
subnetwork = "gpu-subnet"
cluster = "contract"
request_timeout_s = 1
operation_timeout_s = 2

[per_zone.europe-west4-a]
subnetwork = "projects/{project}/regions/europe-west4/subnetworks/eu-gpus"

[retry]
max_attempts = 3
base_delay_ms = 10
max_delay_ms = 40

[agent]
install_command = '''{install}'''
"#,
        project = fake.project(),
        credentials = credentials.display(),
        url = fake.url(),
        install = FAKE_AGENT_INSTALL,
    );
    toml::from_str(&text).expect("config")
}

async fn provider(fake: &FakeHandle, dir: &Path) -> GcpProvider {
    GcpProvider::new(config(fake, dir)).await.expect("provider")
}

fn request(key: &str, pool: &str, market: Market) -> LaunchRequest {
    LaunchRequest {
        pool: PoolId::new(pool),
        market,
        instance_key: key.into(),
        enrolment_token: format!("enrol-secret-{key}"),
        broker_url: "https://broker.example:8443".into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gce_provider_passes_the_contract() {
    let fake = gce::start(Options::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let p = provider(&fake, dir.path()).await;
    contract::run(contract::Setup {
        provider: &p,
        cloud: &fake,
        pool: PoolId::new(POOL),
        spot_pool: Some(PoolId::new(SPOT_POOL)),
        unknown_type_pool: PoolId::new("gcp:us-central1/n9-imaginary-8g"),
        call_bound: Duration::from_secs(5),
        slow: Duration::from_secs(6),
        broker_url: "https://broker.example:8443".into(),
    })
    .await;
}

#[tokio::test]
async fn the_token_is_fetched_once_and_again_after_it_expires() {
    let fake = gce::start(Options {
        token_lifetime: Duration::from_secs(2),
        ..Options::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let p = provider(&fake, dir.path()).await;
    assert_eq!(fake.tokens_issued(), 0, "no call before the first use");
    for _ in 0..5 {
        p.list().await.expect("list");
    }
    p.launch(&request("tok", POOL, Market::OnDemand))
        .await
        .expect("launch");
    assert_eq!(fake.tokens_issued(), 1, "one token for many calls");
    tokio::time::sleep(Duration::from_millis(2100)).await;
    p.list().await.expect("list after expiry");
    assert_eq!(fake.tokens_issued(), 2, "a new token after expiry");
    // A token the API refuses (revoked) is dropped; the next call after the fault gets one.
    fake.inject(Fault::Unauthorized);
    assert!(matches!(p.list().await, Err(ProviderError::Auth(_))));
    fake.clear_faults();
    p.list()
        .await
        .expect("list after the credentials came back");
    assert_eq!(fake.tokens_issued(), 3);
    assert!(
        fake.invalid_requests().is_empty(),
        "{:?}",
        fake.invalid_requests()
    );
}

#[tokio::test]
async fn a_key_the_token_endpoint_refuses_is_an_auth_error() {
    let fake = gce::start(Options::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let p = provider(&fake, dir.path()).await;
    fake.inject(Fault::Unauthorized);
    let r = p.list().await;
    assert!(
        matches!(&r, Err(ProviderError::Auth(m)) if m.contains("invalid_grant")),
        "{r:?}"
    );
}

#[tokio::test]
async fn list_follows_every_page() {
    let fake = gce::start(Options {
        page_size: 2,
        ..Options::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let p = provider(&fake, dir.path()).await;
    for i in 0..7 {
        let pool = if i % 2 == 0 {
            POOL
        } else {
            "gcp:europe-west4/g2-standard-8"
        };
        p.launch(&request(&format!("page-{i}"), pool, Market::OnDemand))
            .await
            .expect("launch");
    }
    let before = fake.requests();
    let listed = p.list().await.expect("list");
    assert_eq!(listed.len(), 7, "{listed:?}");
    assert_eq!(fake.requests() - before, 4, "4 pages of at most 2");
    let mut keys: Vec<_> = listed.iter().map(|i| i.instance_key.as_str()).collect();
    keys.sort();
    assert_eq!(
        keys,
        (0..7).map(|i| format!("page-{i}")).collect::<Vec<_>>()
    );
    let eu = listed.iter().find(|i| i.instance_key == "page-1").unwrap();
    assert_eq!(eu.pool, PoolId::new("gcp:europe-west4/g2-standard-8"));
    assert!(eu.provider_id.starts_with("europe-west4-a/"), "{eu:?}");
    assert!(
        fake.invalid_requests().is_empty(),
        "{:?}",
        fake.invalid_requests()
    );
}

#[tokio::test]
async fn another_cluster_s_instances_are_not_listed() {
    let fake = gce::start(Options::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let ours = provider(&fake, dir.path()).await;
    let mut cfg = config(&fake, dir.path());
    cfg.cluster = "Other Cluster".into();
    let theirs = GcpProvider::new(cfg).await.unwrap();
    ours.launch(&request("mine", POOL, Market::OnDemand))
        .await
        .unwrap();
    theirs
        .launch(&request("theirs", POOL, Market::OnDemand))
        .await
        .unwrap();
    let a = ours.list().await.unwrap();
    let b = theirs.list().await.unwrap();
    assert_eq!(a.len(), 1, "{a:?}");
    assert_eq!(a[0].instance_key, "mine");
    assert_eq!(b.len(), 1, "{b:?}");
    assert_eq!(b[0].instance_key, "theirs");
}

#[tokio::test]
async fn the_spot_request_has_gce_s_shape_and_the_bootstrap_arrives_intact() {
    let fake = gce::start(Options::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let p = provider(&fake, dir.path()).await;
    let req = request("Spot Node/1", SPOT_POOL, Market::Spot);
    let info = p.launch(&req).await.expect("launch spot");
    assert_eq!(info.market, Market::Spot);
    let body = fake.instance(&info.provider_id).expect("the instance");
    assert_eq!(body["scheduling"]["provisioningModel"], "SPOT");
    assert_eq!(body["scheduling"]["instanceTerminationAction"], "DELETE");
    assert_eq!(body["scheduling"]["onHostMaintenance"], "TERMINATE");
    assert_eq!(body["scheduling"]["automaticRestart"], false);
    assert!(
        body["machineType"]
            .as_str()
            .unwrap()
            .ends_with("/zones/us-central1-a/machineTypes/a2-highgpu-1g"),
        "{}",
        body["machineType"]
    );
    assert!(
        body.get("guestAccelerators").is_none(),
        "a2 has its GPUs built in"
    );
    assert_eq!(body["labels"]["switchyard-cluster"], "contract");
    let label = body["labels"]["switchyard-instance"].as_str().unwrap();
    assert!(label.starts_with("spot-node-1-"), "{label}");
    assert_eq!(
        body["networkInterfaces"][0]["subnetwork"],
        format!(
            "projects/{}/regions/us-central1/subnetworks/gpu-subnet",
            fake.project()
        )
    );
    assert_eq!(
        body["networkInterfaces"][0]["accessConfigs"][0]["type"],
        "ONE_TO_ONE_NAT"
    );
    assert_eq!(body["disks"][0]["boot"], true);
    assert_eq!(body["disks"][0]["autoDelete"], true);
    assert_eq!(
        body["disks"][0]["initializeParams"]["sourceImage"],
        "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64"
    );

    // The script is exactly what the shared bootstrap renders; the token is in it and nowhere
    // else in the request (not in a label, the name or the description).
    let script = fake.script(&info.provider_id).expect("startup-script");
    let agent = config(&fake, dir.path()).agent;
    let expected = switchyard_providers::bootstrap::render(
        &agent,
        &switchyard_providers::bootstrap::Enrolment {
            broker_url: &req.broker_url,
            token: &req.enrolment_token,
            agent_name: &req.instance_key,
        },
    )
    .unwrap();
    assert_eq!(script, expected);
    let mut without_script = body.clone();
    without_script["metadata"]["items"]
        .as_array_mut()
        .unwrap()
        .retain(|i| i["key"] != "startup-script");
    assert!(!without_script.to_string().contains(&req.enrolment_token));
    assert!(!format!("{info:?} {p:?}").contains(&req.enrolment_token));

    // Listed back with its exact key, pool and market.
    let listed = p.list().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].instance_key, "Spot Node/1");
    assert_eq!(listed[0].pool, PoolId::new(SPOT_POOL));
    assert_eq!(listed[0].market, Market::Spot);
    assert!(
        fake.invalid_requests().is_empty(),
        "{:?}",
        fake.invalid_requests()
    );
}

#[tokio::test]
async fn a_stockout_in_one_zone_moves_to_the_next_and_failures_are_classified() {
    let fake = gce::start(Options::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let p = provider(&fake, dir.path()).await;
    // Every zone out of capacity: capacity, after trying both us-central1 zones.
    fake.inject(Fault::Capacity);
    let before = fake.requests();
    let r = p.launch(&request("stockout", POOL, Market::Spot)).await;
    assert!(
        matches!(&r, Err(ProviderError::Capacity { pool, message })
            if pool.as_str() == POOL && message.starts_with("ZONE_RESOURCE_POOL_EXHAUSTED")),
        "{r:?}"
    );
    assert!(
        fake.requests() - before >= 5,
        "lookup, then insert+poll in two zones"
    );
    fake.clear_faults();
    fake.inject(Fault::Quota);
    let r = p.launch(&request("quota", POOL, Market::OnDemand)).await;
    assert!(
        matches!(&r, Err(ProviderError::Quota { message, .. }) if message.starts_with("QUOTA_EXCEEDED")),
        "{r:?}"
    );
    fake.clear_faults();
    assert!(fake.live_instances().is_empty());
    assert!(
        fake.invalid_requests().is_empty(),
        "{:?}",
        fake.invalid_requests()
    );
}

#[tokio::test]
async fn a_launch_moves_past_a_zone_without_capacity() {
    let fake = gce::start(Options {
        stockout_zones: vec!["us-central1-a".into()],
        ..Options::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let p = provider(&fake, dir.path()).await;
    let info = p
        .launch(&request("moved", POOL, Market::Spot))
        .await
        .expect("launched in the second zone");
    assert!(info.provider_id.starts_with("us-central1-b/"), "{info:?}");
    assert_eq!(fake.live_instances(), vec![info.provider_id.clone()]);
    let listed = p.list().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].pool, PoolId::new(POOL));
    assert!(
        fake.invalid_requests().is_empty(),
        "{:?}",
        fake.invalid_requests()
    );
}

#[tokio::test]
async fn a_booted_instance_runs_its_bootstrap_and_terminate_powers_it_off() {
    let fake = gce::start(Options {
        run_bootstrap: true,
        ..Options::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let p = provider(&fake, dir.path()).await;
    let req = request("booted", POOL, Market::OnDemand);
    let info = p.launch(&req).await.expect("launch");
    assert_eq!(fake.boot_error(&info.provider_id), None);
    let root = fake.sandbox_root(&info.provider_id).expect("a sandbox");
    let env = std::fs::read_to_string(root.join("etc/switchyard/agent.env")).unwrap();
    assert!(
        env.lines()
            .any(|l| l == format!("SWITCHYARD_ENROL_TOKEN=\"{}\"", req.enrolment_token)),
        "{env}"
    );
    assert!(env.contains("SWITCHYARD_AGENT_NAME=\"booted\""), "{env}");
    let unit =
        std::fs::read_to_string(root.join("etc/systemd/system/switchyard-agent.service")).unwrap();
    assert!(!unit.contains(&req.enrolment_token), "{unit}");
    let log = std::fs::read_to_string(root.join("systemctl.log")).unwrap();
    assert!(
        log.contains("enable --now switchyard-agent.service"),
        "{log}"
    );
    assert!(fake.agent_running(&info.provider_id), "the agent runs");

    p.terminate(&info.provider_id).await.expect("terminate");
    // The delete operation completes, the instance goes, and its agent is powered off.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !fake.live_instances().is_empty() {
        assert!(std::time::Instant::now() < deadline, "still there");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let pid: i32 = std::fs::read_to_string(root.join("agent.pid"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while pid > 0 && nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok() {
        assert!(std::time::Instant::now() < deadline, "the agent survived");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        p.list()
            .await
            .unwrap()
            .iter()
            .all(|i| i.state == InstanceState::Terminated)
    );
}

#[tokio::test]
async fn a_lost_insert_answer_is_retried_with_the_same_request_id() {
    let fake = gce::start(Options::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let p = provider(&fake, dir.path()).await;
    p.list().await.unwrap(); // the token, fetched before counting
    fake.inject(Fault::LoseNextLaunchAnswer);
    let before = fake.requests();
    let info = p
        .launch(&request("lost", POOL, Market::OnDemand))
        .await
        .expect("the retried insert finds the same operation");
    // The lookup, the lost insert, the retried insert (the same operation), at least one poll.
    assert!(
        fake.requests() - before >= 4,
        "{}",
        fake.requests() - before
    );
    assert_eq!(fake.live_instances(), vec![info.provider_id.clone()]);
    let again = p
        .launch(&request("lost", POOL, Market::OnDemand))
        .await
        .unwrap();
    assert_eq!(again.provider_id, info.provider_id);
    assert_eq!(fake.live_instances().len(), 1);
    assert!(
        fake.invalid_requests().is_empty(),
        "{:?}",
        fake.invalid_requests()
    );
}

#[tokio::test]
async fn requests_outside_the_discovery_document_are_refused_and_recorded() {
    let fake = gce::start(Options::default()).await;
    let http = reqwest::Client::new();
    let base = format!("{}/compute/v1/projects/{}", fake.url(), fake.project());
    for (method, url) in [
        (
            reqwest::Method::GET,
            format!("{base}/zones/us-central1-a/instances/x/bogus"),
        ),
        (
            reqwest::Method::PUT,
            format!("{base}/zones/us-central1-a/instances/x"),
        ),
        (
            reqwest::Method::GET,
            format!("{base}/aggregated/instances?maxResults=ten"),
        ),
        (
            reqwest::Method::GET,
            format!("{base}/aggregated/instances?colour=blue"),
        ),
    ] {
        let r = http.request(method, &url).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 400, "{url}");
        let body: serde_json::Value = r.json().await.unwrap();
        assert_eq!(body["error"]["errors"][0]["reason"], "invalid", "{body}");
    }
    let insert = http
        .post(format!("{base}/zones/us-central1-a/instances"))
        .json(&serde_json::json!({ "name": "x", "colour": "blue" }))
        .send()
        .await
        .unwrap();
    assert_eq!(insert.status().as_u16(), 400);
    let invalid = fake.invalid_requests();
    assert_eq!(invalid.len(), 5, "{invalid:#?}");
    assert!(
        invalid[4].contains("unknown property \"colour\""),
        "{invalid:#?}"
    );
}

/// One change to a good config, for the validation cases.
type Change = Box<dyn Fn(&mut GcpConfig)>;

#[tokio::test]
async fn config_errors_name_the_field() {
    let fake = gce::start(Options::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let good = config(&fake, dir.path());
    let bad_key = dir.path().join("bad.json");
    std::fs::write(&bad_key, r#"{"type": "service_account"}"#).unwrap();
    let cases: Vec<(Change, &str)> = vec![
        (Box::new(|c| c.zones.clear()), "zones is empty"),
        (
            Box::new(|c| c.zones = vec!["uscentral1".into()]),
            "zones: \"uscentral1\"",
        ),
        (
            Box::new(|c| {
                c.per_zone.clear();
                c.zones = vec!["mars-north1-a".into()];
            }),
            "region mars-north1 is not one",
        ),
        (
            Box::new(|c| c.api_endpoint = "ftp://x".into()),
            "api_endpoint \"ftp://x\" is not an http(s) URL",
        ),
        (
            Box::new(|c| c.credentials_file = "/nonexistent/key.json".into()),
            "credentials_file \"/nonexistent/key.json\": cannot read it",
        ),
        (
            Box::new(move |c| c.credentials_file = bad_key.display().to_string()),
            "not a service-account JSON key",
        ),
        (Box::new(|c| c.image = None), "image: none given"),
        (Box::new(|c| c.cluster = " ".into()), "cluster is empty"),
        (
            Box::new(|c| c.project = "My Project".into()),
            "project \"My Project\"",
        ),
        (
            Box::new(|c| c.machine_types = vec!["n9-imaginary".into()]),
            "machine_types",
        ),
        (
            Box::new(|c| {
                c.per_zone.insert("asia-east1-a".into(), Default::default());
            }),
            "per_zone.asia-east1-a names a zone not in zones",
        ),
        (
            Box::new(|c| c.operation_timeout_s = 0),
            "operation_timeout_s",
        ),
        (Box::new(|c| c.retry.max_attempts = 0), "retry.max_attempts"),
        (
            Box::new(|c| c.agent.install_command = None),
            "agent: give download_url",
        ),
    ];
    for (change, expected) in cases {
        let mut c = good.clone();
        change(&mut c);
        let err = match GcpProvider::new(c).await {
            Err(GcpSetupError::Config(e)) => e.to_string(),
            Err(other) => panic!("{expected}: {other}"),
            Ok(_) => panic!("{expected}: accepted"),
        };
        assert!(err.contains(expected), "{expected:?} not in {err:?}");
        assert!(err.starts_with("gcp config: "), "{err}");
    }
    // Unknown fields are refused by name.
    let r: Result<GcpConfig, _> = toml::from_str(
        r#"project = "p"
zones = ["us-central1-a"]
credentials_file = "k"
cluster = "c"
image = "i"
zone = "typo"
[agent]
install_command = "true"
"#,
    );
    assert!(r.unwrap_err().to_string().contains("unknown field `zone`"));
    // Defaults.
    let minimal: GcpConfig = toml::from_str(
        r#"project = "p"
zones = ["us-central1-a"]
credentials_file = "k"
cluster = "c"
image = "i"
[agent]
install_command = "true"
"#,
    )
    .unwrap();
    assert_eq!(minimal.api_endpoint, "https://compute.googleapis.com");
    assert_eq!(minimal.network, "default");
    assert_eq!(minimal.request_timeout_s, 30);
    assert_eq!(minimal.operation_timeout_s, 300);
    let _: BTreeMap<String, _> = minimal.per_zone;
}

//! The Azure provider against the fake ARM (`clouds::azure`): the shared contract suite, then
//! what is Azure's own — the token exchange and its cache, `nextLink` pagination, the request
//! shapes (spot, NIC, delete options), the bootstrap reaching the VM intact, live prices,
//! configuration errors, and a VM that runs its bootstrap in a sandbox.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};
use switchyard_core::{Market, PoolId};
use switchyard_providers::azure::{
    AgentInstall, AzureConfig, AzureProvider, LocationSettings, names::Names,
};
use switchyard_providers::{InstanceState, LaunchRequest, Provider, ProviderError};
use switchyard_tests::clouds::azure::{self, FakeHandle, FakeOptions};
use switchyard_tests::clouds::{FakeCloud, contract};

const POOL: &str = "azure:eastus/Standard_NC24ads_A100_v4";
const SPOT_POOL: &str = "azure:westeurope/Standard_NC4as_T4_v3";

fn secret_file(secret: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().expect("temp file");
    writeln!(f, "{secret}").expect("write");
    f
}

fn agent() -> AgentInstall {
    AgentInstall {
        download_url: None,
        sha256: None,
        install_command: Some("true".into()),
        binary_path: "/usr/local/bin/switchyard-agent".into(),
        env: BTreeMap::new(),
        ca_cert_pem: None,
    }
}

/// Tight timeouts and retry delays, so the suite takes seconds (the fake's own config, with
/// the secret file the test chose).
fn config(fake: &FakeHandle, secret: &Path) -> AzureConfig {
    let scratch = tempfile::NamedTempFile::new().expect("temp file");
    let mut c = fake.provider_config(scratch.path(), agent());
    c.client_secret_file = secret.to_path_buf();
    c
}

struct Rig {
    fake: FakeHandle,
    provider: AzureProvider,
    _secret: tempfile::NamedTempFile,
}

async fn rig(options: FakeOptions) -> Rig {
    let secret = secret_file(&options.client_secret);
    let fake = azure::start(options).await;
    let provider = AzureProvider::new(config(&fake, secret.path()))
        .await
        .expect("provider");
    Rig {
        fake,
        provider,
        _secret: secret,
    }
}

fn request(key: &str, pool: &str, market: Market) -> LaunchRequest {
    LaunchRequest {
        pool: PoolId::new(pool),
        market,
        instance_key: key.into(),
        enrolment_token: format!("enrol-token-{key}"),
        broker_url: "https://broker.test:8443".into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_azure_provider_passes_the_contract() {
    let r = rig(FakeOptions::default()).await;
    contract::run(contract::Setup {
        provider: &r.provider,
        cloud: &r.fake,
        pool: PoolId::new(POOL),
        spot_pool: Some(PoolId::new(SPOT_POOL)),
        unknown_type_pool: PoolId::new("azure:eastus/Standard_ND999_v9"),
        call_bound: Duration::from_secs(5),
        slow: Duration::from_secs(6),
        broker_url: "https://broker.test:8443".into(),
    })
    .await;
}

#[tokio::test]
async fn the_token_is_fetched_once_cached_and_refreshed_before_it_expires() {
    let r = rig(FakeOptions {
        token_lifetime: Duration::from_secs(2),
        ..FakeOptions::default()
    })
    .await;
    for _ in 0..3 {
        r.provider.list().await.expect("list");
    }
    assert_eq!(r.fake.token_requests(), 1, "cached");
    // A 2 s token is refreshed after 1 s (halfway for short lives), before ARM refuses it.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    r.provider
        .list()
        .await
        .expect("list after the refresh time");
    assert_eq!(r.fake.token_requests(), 2, "refreshed");
    assert!(r.fake.invalid_requests().is_empty());
}

#[tokio::test]
async fn a_wrong_secret_is_an_auth_error_and_never_shows() {
    let fake = azure::start(FakeOptions::default()).await;
    let secret = secret_file("not-the-secret-xyz");
    let p = AzureProvider::new(config(&fake, secret.path()))
        .await
        .expect("provider");
    let e = p.list().await.expect_err("wrong secret");
    assert!(matches!(e, ProviderError::Auth(_)), "{e:?}");
    let shown = format!("{e} {e:?} {p:?}");
    assert!(!shown.contains("not-the-secret-xyz"), "{shown}");
    let e = p
        .launch(&request("k", POOL, Market::OnDemand))
        .await
        .expect_err("launch");
    assert!(matches!(e, ProviderError::Auth(_)), "{e:?}");
    assert_eq!(fake.token_requests(), 0);
}

#[tokio::test]
async fn list_follows_next_links() {
    let r = rig(FakeOptions {
        page_size: 2,
        operation_delay: Duration::from_millis(10),
        ..FakeOptions::default()
    })
    .await;
    for i in 0..5 {
        r.provider
            .launch(&request(&format!("page-{i}"), POOL, Market::OnDemand))
            .await
            .expect("launch");
    }
    let listed = r.provider.list().await.expect("list");
    let mut keys: Vec<&str> = listed.iter().map(|i| i.instance_key.as_str()).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["page-0", "page-1", "page-2", "page-3", "page-4"]);
    let pages = r
        .fake
        .request_log()
        .iter()
        .filter(|l| l.starts_with("GET ") && l.contains("/virtualMachines?"))
        .filter(|l| l.contains("$skiptoken"))
        .count();
    assert_eq!(pages, 2, "{:#?}", r.fake.request_log());
    assert!(listed.iter().all(|i| i.state == InstanceState::Running));
    assert!(r.fake.invalid_requests().is_empty());
}

#[tokio::test]
async fn a_spot_launch_sends_the_documented_shape_and_the_bootstrap_intact() {
    let r = rig(FakeOptions::default()).await;
    let req = request("spot-1", SPOT_POOL, Market::Spot);
    let info = r.provider.launch(&req).await.expect("launch");
    let names = Names::of("contract", "spot-1");
    assert_eq!(info.provider_id, names.vm);
    assert_eq!(info.market, Market::Spot);

    let vm = r.fake.vm_request(&names.vm).expect("VM body");
    let p = &vm["properties"];
    assert_eq!(p["priority"], "Spot");
    assert_eq!(p["evictionPolicy"], "Delete");
    assert_eq!(p["billingProfile"]["maxPrice"], -1);
    assert_eq!(p["hardwareProfile"]["vmSize"], "Standard_NC4as_T4_v3");
    assert_eq!(p["storageProfile"]["osDisk"]["deleteOption"], "Delete");
    assert_eq!(p["storageProfile"]["osDisk"]["name"], names.disk.as_str());
    let nic = &p["networkProfile"]["networkInterfaces"][0];
    assert_eq!(nic["properties"]["deleteOption"], "Delete");
    assert!(nic["id"].as_str().expect("id").ends_with(&names.nic));
    assert_eq!(vm["tags"]["switchyard:instance"], "spot-1");
    assert_eq!(vm["tags"]["switchyard:cluster"], "contract");
    assert_eq!(vm["location"], "westeurope");

    let nic_body = r.fake.nic_request(&names.nic).expect("NIC body");
    assert_eq!(
        nic_body["properties"]["ipConfigurations"][0]["properties"]["subnet"]["id"],
        r.fake.options().subnet_id("gpu", "default")
    );

    // The script arrived as sent, and the token travelled only inside it (base64, in a body).
    let script = r.fake.script(&names.vm).expect("script");
    let expected = switchyard_providers::bootstrap::render(
        &agent(),
        &switchyard_providers::bootstrap::Enrolment {
            broker_url: &req.broker_url,
            token: &req.enrolment_token,
            agent_name: &req.instance_key,
        },
    )
    .expect("render");
    assert_eq!(script, expected);
    assert!(script.contains("SWITCHYARD_ENROL_TOKEN=\"enrol-token-spot-1\""));
    assert!(
        r.fake
            .request_log()
            .iter()
            .all(|l| !l.contains("enrol-token")),
        "the token is in a URL"
    );
    assert!(
        r.fake
            .live_instances()
            .contains(&format!("disk:{}", names.disk))
    );

    // Deleting the VM takes its NIC and disk.
    r.provider
        .terminate(&info.provider_id)
        .await
        .expect("terminate");
    assert!(
        r.fake.live_instances().is_empty(),
        "{:?}",
        r.fake.live_instances()
    );
    assert!(
        r.fake.invalid_requests().is_empty(),
        "{:?}",
        r.fake.invalid_requests()
    );
}

#[tokio::test]
async fn a_failed_vm_operation_is_classified_and_cleaned_up() {
    let r = rig(FakeOptions::default()).await;
    r.fake.inject(switchyard_tests::clouds::Fault::Capacity);
    let e = r
        .provider
        .launch(&request("cap-1", POOL, Market::OnDemand))
        .await
        .expect_err("capacity");
    match e {
        ProviderError::Capacity { pool, message } => {
            assert_eq!(pool.as_str(), POOL);
            assert!(message.starts_with("AllocationFailed"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    r.fake.clear_faults();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !r.fake.live_instances().is_empty() {
        assert!(Instant::now() < deadline, "{:?}", r.fake.live_instances());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The same key launches cleanly afterwards.
    let ok = r
        .provider
        .launch(&request("cap-1", POOL, Market::OnDemand))
        .await
        .expect("relaunch");
    assert_eq!(ok.state, InstanceState::Running);
}

#[tokio::test]
async fn offers_take_live_retail_prices_across_pages() {
    let r = rig(FakeOptions {
        price_factor: 0.5,
        price_page_size: 3,
        ..FakeOptions::default()
    })
    .await;
    let catalogue = switchyard_providers::Catalogue::bundled().expect("catalogue");
    let entry = catalogue
        .find("azure", "eastus", "Standard_NC24ads_A100_v4")
        .expect("entry");
    let offers = r.provider.offers().await.expect("offers");
    let pool = offers
        .pools
        .iter()
        .find(|p| p.id.as_str() == POOL)
        .expect("pool");
    let half = |m: switchyard_core::Money| m.as_dollars() * 0.5;
    assert!((pool.on_demand_per_hour.as_dollars() - half(entry.on_demand_per_hour)).abs() < 1e-6);
    assert!(
        (pool.spot_per_hour.expect("spot").as_dollars() - half(entry.spot_per_hour.expect("spot")))
            .abs()
            < 1e-6
    );
    let price_pages = r
        .fake
        .request_log()
        .iter()
        .filter(|l| l.contains("/api/retail/prices") && l.contains("%24skip"))
        .count();
    assert!(price_pages > 0, "{:#?}", r.fake.request_log());
    // Cached: a second call asks nothing.
    let before = r.fake.requests();
    r.provider.offers().await.expect("offers");
    assert_eq!(r.fake.requests(), before);
}

#[tokio::test]
async fn bad_configuration_stops_the_start_naming_the_field() {
    let fake = azure::start(FakeOptions::default()).await;
    let secret = secret_file("s");
    let mut c = config(&fake, secret.path());
    c.client_secret_file = "/nonexistent/azure-secret".into();
    let e = AzureProvider::new(c)
        .await
        .expect_err("no secret")
        .to_string();
    assert!(e.contains("client_secret_file"), "{e}");
    let mut c = config(&fake, secret.path());
    c.arm_endpoint = "management.example".into();
    let e = AzureProvider::new(c)
        .await
        .expect_err("endpoint")
        .to_string();
    assert!(e.contains("arm_endpoint"), "{e}");
    let mut c = config(&fake, secret.path());
    c.locations.push("atlantis".into());
    c.per_location.insert(
        "atlantis".into(),
        LocationSettings {
            subnet_id: fake.options().subnet_id("v", "s"),
        },
    );
    let e = AzureProvider::new(c)
        .await
        .expect_err("location")
        .to_string();
    assert!(e.contains("atlantis"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_launched_vm_runs_its_bootstrap_and_terminate_powers_it_off() {
    let secret = secret_file(&FakeOptions::default().client_secret);
    let fake = azure::start(FakeOptions {
        run_bootstrap: true,
        ..FakeOptions::default()
    })
    .await;
    let mut c = config(&fake, secret.path());
    // A stand-in agent: the sandbox's systemctl starts it from the unit, as systemd would.
    c.agent.install_command = Some(
        "printf '#!/bin/sh\\nexec sleep 300\\n' > \"$R/usr/local/bin/switchyard-agent\" && chmod 0755 \"$R/usr/local/bin/switchyard-agent\"".into(),
    );
    let p = AzureProvider::new(c).await.expect("provider");
    let info = p
        .launch(&request("boot-1", POOL, Market::OnDemand))
        .await
        .expect("launch");
    let root = fake.boot_root(&info.provider_id).expect("booted");
    let env = std::fs::read_to_string(root.join("etc/switchyard/agent.env")).expect("agent.env");
    assert!(
        env.contains("SWITCHYARD_ENROL_TOKEN=\"enrol-token-boot-1\""),
        "{env}"
    );
    assert!(env.contains("SWITCHYARD_AGENT_NAME=\"boot-1\""), "{env}");
    let log = std::fs::read_to_string(root.join("systemctl.log")).expect("systemctl.log");
    assert!(
        log.contains("enable --now switchyard-agent.service"),
        "{log}"
    );
    assert!(fake.agent_running(&info.provider_id));
    let pid: i32 = std::fs::read_to_string(root.join("agent.pid"))
        .expect("pid")
        .trim()
        .parse()
        .expect("pid");

    p.terminate(&info.provider_id).await.expect("terminate");
    let deadline = Instant::now() + Duration::from_secs(5);
    while alive(pid) {
        assert!(Instant::now() < deadline, "the agent still runs");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        fake.live_instances().is_empty(),
        "{:?}",
        fake.live_instances()
    );
    assert!(
        fake.invalid_requests().is_empty(),
        "{:?}",
        fake.invalid_requests()
    );
}

/// Whether a process exists and is not a zombie waiting for its parent.
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit(')')
                .next()
                .map(|rest| rest.trim_start().starts_with('Z'))
        })
        .is_some_and(|zombie| !zombie)
}

#[tokio::test]
async fn the_fake_refuses_requests_outside_the_description() {
    let r = rig(FakeOptions::default()).await;
    // A token, as the provider would get it.
    r.provider.list().await.expect("list");
    let o = r.fake.options().clone();
    let http = reqwest::Client::new();
    let token: serde_json::Value = http
        .post(format!(
            "{}/{}/oauth2/v2.0/token",
            r.fake.url(),
            o.tenant_id
        ))
        .form(&[
            ("grant_type", "client_credentials"),
            ("client_id", o.client_id.as_str()),
            ("client_secret", o.client_secret.as_str()),
            ("scope", &format!("{}/.default", r.fake.url())),
        ])
        .send()
        .await
        .expect("token")
        .json()
        .await
        .expect("json");
    let bearer = token["access_token"].as_str().expect("token").to_owned();
    let vm = |version: &str| {
        format!(
            "{}/subscriptions/{}/resourceGroups/{}/providers/Microsoft.Compute/virtualMachines/x?api-version={version}",
            r.fake.url(),
            o.subscription_id,
            o.resource_group
        )
    };
    let cases = [
        // A misspelt property, a wrong type, a missing required property (location).
        (
            vm("2024-07-01"),
            serde_json::json!({"location": "eastus", "properties": {"hardwareProfile": {"vmSize": 1}, "priorty": "Spot"}}),
        ),
        (vm("2024-07-01"), serde_json::json!({"properties": {}})),
        // A read-only property, and an api-version the description is not.
        (
            vm("2024-07-01"),
            serde_json::json!({"location": "eastus", "properties": {"vmId": "x"}}),
        ),
        (vm("2019-03-01"), serde_json::json!({"location": "eastus"})),
    ];
    for (url, body) in &cases {
        let status = http
            .put(url)
            .bearer_auth(&bearer)
            .json(body)
            .send()
            .await
            .expect("send")
            .status();
        assert_eq!(status, 400, "{url} {body}");
    }
    let invalid = r.fake.invalid_requests();
    assert_eq!(invalid.len(), cases.len(), "{invalid:#?}");
    let all = invalid.join("\n");
    for expected in [
        "priorty: unknown property",
        "vmSize: expected string",
        "required property \"location\"",
        "vmId: read-only",
        "api-version must be 2024-07-01",
    ] {
        assert!(all.contains(expected), "{expected:?} not in\n{all}");
    }
}

#[tokio::test]
async fn a_vm_slower_than_the_operation_timeout_is_found_again_not_duplicated() {
    let r = rig(FakeOptions {
        vm_create_delay: Duration::from_secs(3),
        ..FakeOptions::default()
    })
    .await;
    let started = Instant::now();
    let e = r
        .provider
        .launch(&request("slow-vm", POOL, Market::OnDemand))
        .await
        .expect_err("outlives operation_timeout_s");
    assert!(matches!(e, ProviderError::Transient(_)), "{e:?}");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    // The VM is still being created: kept (with its NIC), found by its key, not made twice.
    let names = Names::of("contract", "slow-vm");
    let live = r.fake.live_instances();
    assert!(
        live.contains(&names.vm) && live.contains(&format!("nic:{}", names.nic)),
        "{live:?}"
    );
    let again = r
        .provider
        .launch(&request("slow-vm", POOL, Market::OnDemand))
        .await
        .expect("found again");
    assert_eq!(again.provider_id, names.vm);
    assert_eq!(again.state, InstanceState::Pending);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let listed = r.provider.list().await.expect("list");
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].state, InstanceState::Running);
    r.provider.terminate(&names.vm).await.expect("terminate");
    assert!(
        r.fake.live_instances().is_empty(),
        "{:?}",
        r.fake.live_instances()
    );
}

#[tokio::test]
async fn offers_keep_the_catalogue_prices_when_the_prices_api_fails() {
    let fake = azure::start(FakeOptions::default()).await;
    let secret = secret_file(&fake.options().client_secret);
    let mut c = config(&fake, secret.path());
    // A port nothing listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    c.prices_endpoint = format!("http://{}", closed.local_addr().expect("addr"));
    drop(closed);
    let p = AzureProvider::new(c).await.expect("provider");
    let offers = p.offers().await.expect("offers");
    let catalogue = switchyard_providers::Catalogue::bundled().expect("catalogue");
    let entry = catalogue
        .find("azure", "eastus", "Standard_NC24ads_A100_v4")
        .expect("entry");
    let pool = offers
        .pools
        .iter()
        .find(|p| p.id.as_str() == POOL)
        .expect("pool");
    assert_eq!(pool.on_demand_per_hour, entry.on_demand_per_hour);
    assert_eq!(pool.spot_per_hour, entry.spot_per_hour);
}

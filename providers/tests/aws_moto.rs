//! The EC2 provider against moto (a real `moto_server` process per test, on a loopback port):
//! launches on-demand and spot, tags, user-data, list by tag, terminate, idempotency, the spot
//! price refresh, and — through a fault-injecting proxy in front of moto — the classification
//! of capacity, quota, throttling and auth errors and the retries of throttling.
//!
//! `moto_server` must be installed (`pip install 'moto[server]'`; scripts/test.sh does it).

#![allow(clippy::unwrap_used)]

#[path = "aws_moto/harness.rs"]
mod harness;

use aws_sdk_ec2::types::{InstanceAttributeName, InstanceLifecycleType, InstanceType};
use base64::Engine as _;
use harness::{Fault, Moto, Proxy, client, config};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};
use switchyard_core::{Market, Money, PoolId};
use switchyard_providers::aws::{AwsProvider, CLUSTER_TAG, POOL_TAG};
use switchyard_providers::{
    Catalogue, INSTANCE_TAG, InstanceState, LaunchRequest, Provider, ProviderError,
};

fn request(key: &str, market: Market) -> LaunchRequest {
    LaunchRequest {
        pool: PoolId::new("aws:us-east-1/g5.xlarge"),
        market,
        instance_key: key.into(),
        enrolment_token: format!("enrol-{key}"),
        broker_url: "https://broker.example.com:8443".into(),
    }
}

/// The provider ids of the machines listed under `key` that are not terminated.
fn machines_under(all: Vec<switchyard_providers::InstanceInfo>, key: &str) -> Vec<String> {
    all.into_iter()
        .filter(|i| i.instance_key == key && i.state != InstanceState::Terminated)
        .map(|i| i.provider_id)
        .collect()
}

async fn provider(endpoint: &str, cluster: &str) -> AwsProvider {
    AwsProvider::new(config(endpoint, cluster)).await.unwrap()
}

async fn describe(ec2: &aws_sdk_ec2::Client, id: &str) -> aws_sdk_ec2::types::Instance {
    let out = ec2
        .describe_instances()
        .instance_ids(id)
        .send()
        .await
        .unwrap();
    out.reservations()[0].instances()[0].clone()
}

fn tag<'a>(instance: &'a aws_sdk_ec2::types::Instance, key: &str) -> Option<&'a str> {
    instance
        .tags()
        .iter()
        .find(|t| t.key() == Some(key))
        .and_then(|t| t.value())
}

#[tokio::test]
async fn launch_list_and_terminate_against_moto() {
    let moto = Moto::start().await;
    let ec2 = client(&moto.url);
    let aws = provider(&moto.url, "test-cluster").await;

    // On-demand: tags on instance and volume, the right type, a client token.
    let t = Instant::now();
    let on_demand = aws
        .launch(&request("od-1", Market::OnDemand))
        .await
        .unwrap();
    let first_launch_ms = t.elapsed().as_millis();
    assert!(on_demand.provider_id.starts_with("i-"), "{on_demand:?}");
    assert_eq!(on_demand.instance_key, "od-1");
    assert_eq!(on_demand.market, Market::OnDemand);
    assert!(matches!(
        on_demand.state,
        InstanceState::Pending | InstanceState::Running
    ));
    let instance = describe(&ec2, &on_demand.provider_id).await;
    assert_eq!(instance.instance_type(), Some(&InstanceType::G5Xlarge));
    assert_eq!(instance.instance_lifecycle(), None);
    assert_eq!(tag(&instance, CLUSTER_TAG), Some("test-cluster"));
    assert_eq!(tag(&instance, POOL_TAG), Some("aws:us-east-1/g5.xlarge"));
    assert_eq!(tag(&instance, INSTANCE_TAG), Some("od-1"));
    assert_eq!(tag(&instance, "Name"), Some("switchyard-test-cluster-od-1"));
    let token = instance.client_token().unwrap();
    assert!(token.starts_with("sy-") && token.len() <= 64, "{token}");
    let volumes = ec2
        .describe_volumes()
        .filters(
            aws_sdk_ec2::types::Filter::builder()
                .name(format!("tag:{INSTANCE_TAG}"))
                .values("od-1")
                .build(),
        )
        .send()
        .await
        .unwrap();
    assert!(
        !volumes.volumes().is_empty(),
        "the root volume carries the tags"
    );

    // User-data: the cloud-init script with the broker URL, the token and the unit.
    let attr = ec2
        .describe_instance_attribute()
        .instance_id(&on_demand.provider_id)
        .attribute(InstanceAttributeName::UserData)
        .send()
        .await
        .unwrap();
    let encoded = attr.user_data().and_then(|v| v.value()).unwrap();
    let script = String::from_utf8(
        base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .unwrap(),
    )
    .unwrap();
    assert!(script.starts_with("#!/bin/bash\n"), "{script}");
    assert!(script.contains("SWITCHYARD_BROKER=\"https://broker.example.com:8443\""));
    assert!(script.contains("SWITCHYARD_ENROL_TOKEN=\"enrol-od-1\""));
    assert!(
        script.contains("SWITCHYARD_INTERRUPTION_URL=\"http://127.0.0.1:9/spot/instance-action\"")
    );
    assert!(script.contains("chmod 0600 \"$R/etc/switchyard/agent.env\""));
    assert!(script.contains("EnvironmentFile=$R/etc/switchyard/agent.env"));
    assert!(script.contains("systemctl enable --now switchyard-agent.service"));
    let exec = script
        .lines()
        .find(|l| l.starts_with("ExecStart="))
        .unwrap();
    assert!(
        !exec.contains("enrol-od-1"),
        "the token stays off the command line"
    );

    // Spot: one-time, seen by EC2 as a spot instance.
    let t = Instant::now();
    let spot = aws.launch(&request("spot-1", Market::Spot)).await.unwrap();
    let warm_launch_ms = t.elapsed().as_millis();
    assert_eq!(spot.market, Market::Spot);
    let instance = describe(&ec2, &spot.provider_id).await;
    assert_eq!(
        instance.instance_lifecycle(),
        Some(&InstanceLifecycleType::Spot)
    );

    // Idempotent: the same key is the same instance.
    let again = aws.launch(&request("spot-1", Market::Spot)).await.unwrap();
    assert_eq!(again.provider_id, spot.provider_id);

    // An instance Switchyard did not launch, and one of another cluster, are not listed.
    let stranger = ec2
        .run_instances()
        .image_id("ami-12c6146b")
        .instance_type(InstanceType::G5Xlarge)
        .min_count(1)
        .max_count(1)
        .send()
        .await
        .unwrap();
    let stranger = stranger.instances()[0].instance_id().unwrap().to_owned();
    let other = provider(&moto.url, "other-cluster").await;
    let other_one = other
        .launch(&request("od-1", Market::OnDemand))
        .await
        .unwrap();
    assert_ne!(
        other_one.provider_id, on_demand.provider_id,
        "same key, other cluster"
    );

    let t = Instant::now();
    let listed = aws.list().await.unwrap();
    let list_ms = t.elapsed().as_millis();
    let ids: BTreeSet<&str> = listed.iter().map(|i| i.provider_id.as_str()).collect();
    let expected: BTreeSet<&str> =
        [on_demand.provider_id.as_str(), spot.provider_id.as_str()].into();
    assert_eq!(
        ids, expected,
        "exactly ours, not {stranger} nor {}",
        other_one.provider_id
    );
    let listed_spot = listed
        .iter()
        .find(|i| i.provider_id == spot.provider_id)
        .unwrap();
    assert_eq!(listed_spot.instance_key, "spot-1");
    assert_eq!(listed_spot.market, Market::Spot);
    assert_eq!(listed_spot.pool, PoolId::new("aws:us-east-1/g5.xlarge"));

    // Terminate, twice, and an id EC2 never had: all succeed.
    let t = Instant::now();
    aws.terminate(&on_demand.provider_id).await.unwrap();
    let terminate_ms = t.elapsed().as_millis();
    aws.terminate(&on_demand.provider_id).await.unwrap();
    aws.terminate("i-0123456789abcdef0").await.unwrap();
    let fresh = provider(&moto.url, "test-cluster").await; // knows no homes
    fresh.terminate("i-0123456789abcdef0").await.unwrap();
    let listed = aws.list().await.unwrap();
    assert!(
        listed
            .iter()
            .all(|i| i.provider_id != on_demand.provider_id || i.state == InstanceState::Terminated),
        "{listed:?}"
    );
    eprintln!(
        "moto latencies: first launch {first_launch_ms} ms, warm launch {warm_launch_ms} ms, \
         list {list_ms} ms, terminate {terminate_ms} ms"
    );

    // A name-filtered image: the newest match is resolved and launched.
    moto.reset().await;
    let mut cfg = config(&moto.url, "images");
    cfg.image.id = None;
    cfg.image.name_filter = Some("al2023-ami-2023.*-kernel-6.1-x86_64".into());
    cfg.image.owners = vec!["amazon".into()];
    let images = ec2
        .describe_images()
        .owners("amazon")
        .filters(
            aws_sdk_ec2::types::Filter::builder()
                .name("name")
                .values("al2023-ami-2023.*-kernel-6.1-x86_64")
                .build(),
        )
        .send()
        .await
        .unwrap();
    let newest = images
        .images()
        .iter()
        .max_by_key(|i| i.creation_date().unwrap_or_default().to_owned())
        .and_then(|i| i.image_id())
        .unwrap();
    let aws = AwsProvider::new(cfg).await.unwrap();
    let launched = aws
        .launch(&request("img-1", Market::OnDemand))
        .await
        .unwrap();
    assert_eq!(
        describe(&ec2, &launched.provider_id).await.image_id(),
        Some(newest)
    );
}

#[tokio::test]
async fn offers_refresh_from_moto_and_keep_catalogue_prices_over_placeholders() {
    let moto = Moto::start().await;
    let catalogue = Catalogue::bundled().unwrap();
    let aws = provider(&moto.url, "offers").await;

    // moto does answer spot prices, but they are placeholders: 0.00001, dated 2006.
    let history = client(&moto.url)
        .describe_spot_price_history()
        .instance_types(InstanceType::G5Xlarge)
        .send()
        .await
        .unwrap();
    assert!(
        history
            .spot_price_history()
            .iter()
            .any(|p| p.spot_price() == Some("0.00001"))
    );

    let offers = aws.offers().await.unwrap();
    assert_eq!(offers.regions.len(), 1);
    assert_eq!(offers.pools.len(), 3);
    for pool in &offers.pools {
        let entry = catalogue
            .find("aws", "us-east-1", &pool.instance_type)
            .unwrap();
        assert_eq!(pool.spot_per_hour, entry.spot_per_hour, "{}", pool.id);
        assert_eq!(pool.on_demand_per_hour, entry.on_demand_per_hour);
        assert!(
            pool.price_updated_at.0 > 1_700_000_000_000,
            "catalogue time, not 2006"
        );
    }
    // Instance facts from DescribeInstanceTypes agree with the catalogue's.
    let p4d = offers
        .pools
        .iter()
        .find(|p| p.instance_type == "p4d.24xlarge")
        .unwrap();
    assert_eq!(
        (p4d.gpus_per_node, p4d.gpu_memory_gb, p4d.vcpus),
        (8, 40, 96)
    );
    let g5 = offers
        .pools
        .iter()
        .find(|p| p.instance_type == "g5.xlarge")
        .unwrap();
    assert_eq!(
        (g5.gpus_per_node, g5.gpu_memory_gb, g5.vcpus, g5.memory_gb),
        (1, 22, 4, 16)
    );

    // With an age limit that admits 2006, moto's price reaches the pool: the live path works.
    let mut cfg = config(&moto.url, "offers");
    cfg.spot_price_max_age_s = 100 * 365 * 86_400;
    let lenient = AwsProvider::new(cfg).await.unwrap();
    let offers = lenient.offers().await.unwrap();
    let g5 = offers
        .pools
        .iter()
        .find(|p| p.instance_type == "g5.xlarge")
        .unwrap();
    assert_eq!(g5.spot_per_hour, Money::from_dollars(0.00001));
    assert!(g5.price_updated_at.0 < 1_200_000_000_000, "dated 2006");
}

#[tokio::test]
async fn faults_are_classified_and_throttling_is_retried() {
    let moto = Moto::start().await;
    let proxy = Proxy::start(&moto.url).await;
    let aws = provider(&proxy.url, "faults").await;
    let fault = |code, status, remaining| Fault {
        code,
        status,
        remaining,
    };

    proxy.fail(
        "RunInstances",
        fault("InsufficientInstanceCapacity", 500, 99),
    );
    match aws.launch(&request("cap", Market::Spot)).await {
        Err(ProviderError::Capacity { pool, message }) => {
            assert_eq!(pool, PoolId::new("aws:us-east-1/g5.xlarge"));
            assert!(
                message.contains("InsufficientInstanceCapacity"),
                "{message}"
            );
        }
        other => panic!("expected Capacity, got {other:?}"),
    }
    assert_eq!(
        proxy.attempts("RunInstances"),
        1,
        "capacity errors are not retried"
    );

    for code in [
        "VcpuLimitExceeded",
        "InstanceLimitExceeded",
        "MaxSpotInstanceCountExceeded",
    ] {
        proxy.clear();
        proxy.fail("RunInstances", fault(code, 400, 99));
        let result = aws.launch(&request("quota", Market::OnDemand)).await;
        assert!(
            matches!(result, Err(ProviderError::Quota { .. })),
            "{code}: {result:?}"
        );
    }

    // Throttled twice, then moto answers: the launch succeeds on the third attempt.
    proxy.clear();
    proxy.fail("RunInstances", fault("RequestLimitExceeded", 503, 2));
    let launched = aws
        .launch(&request("throttled", Market::OnDemand))
        .await
        .unwrap();
    assert!(launched.provider_id.starts_with("i-"));
    assert_eq!(proxy.attempts("RunInstances"), 3);

    // Throttled for good: reported as Throttled after max_attempts (4).
    proxy.clear();
    proxy.fail("RunInstances", fault("RequestLimitExceeded", 503, 99));
    let result = aws.launch(&request("throttled-2", Market::OnDemand)).await;
    assert!(
        matches!(result, Err(ProviderError::Throttled(_))),
        "{result:?}"
    );
    assert_eq!(proxy.attempts("RunInstances"), 4);

    // A transient 5xx on terminate is retried.
    proxy.clear();
    proxy.fail("TerminateInstances", fault("InternalError", 500, 1));
    aws.terminate(&launched.provider_id).await.unwrap();
    assert_eq!(proxy.attempts("TerminateInstances"), 2);

    // Auth failures: not retried, classified, also when refreshing offers.
    proxy.clear();
    proxy.fail("DescribeInstances", fault("AuthFailure", 401, 99));
    let result = aws.list().await;
    assert!(matches!(result, Err(ProviderError::Auth(_))), "{result:?}");
    assert_eq!(proxy.attempts("DescribeInstances"), 1);
    proxy.fail(
        "DescribeSpotPriceHistory",
        fault("UnauthorizedOperation", 403, 99),
    );
    let result = aws.offers().await;
    assert!(matches!(result, Err(ProviderError::Auth(_))), "{result:?}");

    // Other refresh failures keep the catalogue's prices rather than failing the offers.
    proxy.clear();
    proxy.fail("DescribeSpotPriceHistory", fault("InternalError", 500, 99));
    let offers = aws.offers().await.unwrap();
    assert_eq!(offers.pools.len(), 3);
    assert_eq!(proxy.attempts("DescribeSpotPriceHistory"), 4);
}

/// Partial failures: EC2 (here moto) starts the instance, or ends it, and the answer is lost
/// (a 500 after the work). The launch is retried with the same client token; a later launch of
/// the same key finds the instance by its tag instead of starting another; whatever exists
/// under the key is listed, so the broker's reaper sees it; a terminate whose answer was lost
/// is retried and succeeds.
#[tokio::test]
async fn lost_answers_after_the_work_leave_no_hidden_instance() {
    let moto = Moto::start().await;
    let proxy = Proxy::start(&moto.url).await;
    let aws = provider(&proxy.url, "lost").await;
    let t0 = Instant::now();
    proxy.lose_answers("RunInstances", 1);
    let launched = aws
        .launch(&request("lost-1", Market::OnDemand))
        .await
        .unwrap();
    let run_calls = proxy.attempts("RunInstances");
    assert_eq!(run_calls, 2, "the lost answer, then one retry");
    let under_key = |all| machines_under(all, "lost-1");
    let listed = under_key(aws.list().await.unwrap());
    assert!(
        listed.contains(&launched.provider_id),
        "{listed:?} {launched:?}"
    );
    // Moto ignores client tokens, so the retry may have started a second machine; EC2 would
    // return the first. Either way every machine under the key is listed (the broker's reaper
    // ends all but the one it recorded).
    assert!(
        (1..=2).contains(&listed.len()),
        "{} instances under one key: {listed:?}",
        listed.len()
    );

    // The broker retrying the key (its own answer was lost too): found by tag, no new call.
    let again = aws
        .launch(&request("lost-1", Market::OnDemand))
        .await
        .unwrap();
    assert!(listed.contains(&again.provider_id));
    assert_eq!(
        proxy.attempts("RunInstances"),
        run_calls,
        "no third RunInstances"
    );

    // A terminate whose answer is lost is retried; the instances end.
    for id in &listed {
        proxy.lose_answers("TerminateInstances", 1);
        aws.terminate(id).await.unwrap();
    }
    assert!(proxy.attempts("TerminateInstances") >= 2 * listed.len() as u32);
    assert!(under_key(aws.list().await.unwrap()).is_empty());
    println!(
        "FIGURE moto-lost-answers: RunInstances calls {run_calls}, instances under the key {} (moto ignores client tokens), TerminateInstances calls {}, none left, {:.2} s",
        listed.len(),
        proxy.attempts("TerminateInstances"),
        t0.elapsed().as_secs_f64()
    );
}

/// Calls that hang past the request timeout and still take effect (EC2 carrying out a
/// `RunInstances` or a `TerminateInstances` whose answer comes too late): the provider gives up
/// on the call within its timeout, not the hang's length, and retries under the same key; a later
/// launch of the key finds what exists by its tag instead of starting another; every machine
/// under the key is listed, and all of them end.
#[tokio::test]
async fn calls_hanging_past_the_timeout_are_bounded_and_leave_no_hidden_instance() {
    let moto = Moto::start().await;
    let proxy = Proxy::start(&moto.url).await;
    let mut cfg = config(&proxy.url, "hung");
    cfg.request_timeout_s = 1;
    let aws = AwsProvider::new(cfg).await.unwrap();
    let hang = Duration::from_secs(4);
    let under_key = |all| machines_under(all, "hung-1");

    proxy.hang("RunInstances", hang, 1);
    let t0 = Instant::now();
    let launched = aws
        .launch(&request("hung-1", Market::OnDemand))
        .await
        .unwrap();
    let launch_took = t0.elapsed();
    assert!(
        launch_took < hang,
        "bounded by the 1 s request timeout, not the {hang:?} hang: {launch_took:?}"
    );
    let run_calls = proxy.attempts("RunInstances");
    assert_eq!(run_calls, 2, "the hung call, then one retry");
    // The hung call reaches moto after the hang, and it starts a machine too (moto ignores
    // client tokens; EC2 would not).
    tokio::time::sleep(hang).await;
    let listed = under_key(aws.list().await.unwrap());
    assert!(
        listed.contains(&launched.provider_id),
        "{listed:?} {launched:?}"
    );
    assert!(
        (1..=2).contains(&listed.len()),
        "{} instances under one key: {listed:?}",
        listed.len()
    );
    // The broker retrying the key: found by tag, no new call.
    let again = aws
        .launch(&request("hung-1", Market::OnDemand))
        .await
        .unwrap();
    assert!(listed.contains(&again.provider_id));
    assert_eq!(proxy.attempts("RunInstances"), run_calls);

    // A terminate that hangs is bounded the same way and retried.
    let t1 = Instant::now();
    for id in &listed {
        proxy.hang("TerminateInstances", hang, 1);
        aws.terminate(id).await.unwrap();
    }
    let terminate_took = t1.elapsed();
    assert!(
        terminate_took < hang * listed.len() as u32,
        "{terminate_took:?}"
    );
    tokio::time::sleep(hang).await;
    assert!(under_key(aws.list().await.unwrap()).is_empty());
    println!(
        "FIGURE moto-hung-calls: launch answered after {:.2} s ({run_calls} RunInstances calls, the first hung {} s), instances under the key {}, {} terminates in {:.2} s ({} calls), none left",
        launch_took.as_secs_f64(),
        hang.as_secs(),
        listed.len(),
        listed.len(),
        terminate_took.as_secs_f64(),
        proxy.attempts("TerminateInstances"),
    );
}

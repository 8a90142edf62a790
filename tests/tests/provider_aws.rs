//! The EC2 provider against moto behind the fault proxy (`switchyard_tests::clouds::moto`): the
//! same contract suite the GCE, Azure and Lambda providers pass against their fakes. What is
//! particular to EC2 (tags, user-data, the spot price refresh, per-action faults) is tested in
//! `providers/tests/aws_moto.rs`.
//!
//! `moto_server` must be installed (`pip install 'moto[server]'`; scripts/test.sh does it).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};
use switchyard_core::{Market, PoolId};
use switchyard_providers::aws::{AwsConfig, AwsProvider};
use switchyard_providers::{LaunchRequest, Provider, ProviderError};
use switchyard_tests::clouds::{FakeCloud, contract, moto};

const POOL: &str = "aws:us-east-1/g5.xlarge";
const SPOT_POOL: &str = "aws:us-east-1/g4dn.xlarge";

/// One region, two GPU types, a 1 s request timeout and three quick attempts per call: a call
/// under a hang gives up after about 3 s.
fn config(endpoint: &str) -> AwsConfig {
    let text = format!(
        r#"
cluster = "contract"
regions = ["us-east-1"]
instance_types = ["g4dn.xlarge", "g5.xlarge"]
endpoint_url = "{endpoint}"
credentials = {{ access_key_id = "testing", secret_access_key = "testing" }}
image = {{ id = "ami-12c6146b" }}
request_timeout_s = 1

[retry]
max_attempts = 3
base_delay_ms = 10
max_delay_ms = 40

[agent]
download_url = "https://downloads.example.com/switchyard-agent"
"#
    );
    toml::from_str(&text).expect("config")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ec2_provider_passes_the_contract_against_moto() {
    let started = Instant::now();
    let cloud = moto::start().await;
    let p = AwsProvider::new(config(cloud.url()))
        .await
        .expect("provider");
    let ready = started.elapsed();
    contract::run(contract::Setup {
        provider: &p,
        cloud: &cloud,
        pool: PoolId::new(POOL),
        spot_pool: Some(PoolId::new(SPOT_POOL)),
        // The provider launches only the catalogue's types: one EC2 does not have is refused
        // before any call.
        unknown_type_pool: PoolId::new("aws:us-east-1/p9.imaginary"),
        call_bound: Duration::from_secs(5),
        slow: Duration::from_secs(6),
        broker_url: "https://broker.example:8443".into(),
    })
    .await;
    println!(
        "FIGURE ec2-contract: moto up in {:.2} s, the suite in {:.2} s, {} requests through the proxy",
        ready.as_secs_f64(),
        (started.elapsed() - ready).as_secs_f64(),
        FakeCloud::requests(&cloud)
    );
}

/// A type the bundled catalogue lists but EC2 (here moto, which validates instance types) does
/// not have: the one `RunInstances` is refused (`InvalidInstanceType.NotFound`, a 400), and the
/// launch is `Rejected`, not retried. The contract's unknown pool never reaches EC2: the
/// provider launches only the catalogue's types.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_catalogue_type_ec2_does_not_have_is_rejected_without_a_retry() {
    const MISSING: &str = "g7.2xlarge";
    let cloud = moto::start().await;
    let mut cfg = config(cloud.url());
    cfg.instance_types.push(MISSING.into());
    let p = AwsProvider::new(cfg).await.expect("provider");
    let before = FakeCloud::requests(&cloud);
    let r = p
        .launch(&LaunchRequest {
            pool: PoolId::new(format!("aws:us-east-1/{MISSING}")),
            market: Market::OnDemand,
            instance_key: "missing-type".into(),
            enrolment_token: "enrol-missing-type".into(),
            broker_url: "https://broker.example:8443".into(),
        })
        .await;
    let calls = FakeCloud::requests(&cloud) - before;
    match &r {
        Err(ProviderError::Rejected(m)) => assert!(m.contains("InvalidInstanceType"), "{m}"),
        Ok(info) => {
            panic!("moto now has {MISSING} ({info:?}): name a catalogue type it lacks in this test")
        }
        Err(e) => panic!("a type EC2 does not have gave {e:?}"),
    }
    assert_eq!(calls, 2, "DescribeInstances, then one RunInstances");
    assert!(FakeCloud::live_instances(&cloud).is_empty());
}

//! The EC2 provider against moto behind the fault proxy (`switchyard_tests::clouds::moto`): the
//! same contract suite the GCE, Azure and Lambda providers pass against their fakes. What is
//! particular to EC2 (tags, user-data, the spot price refresh, per-action faults) is tested in
//! `providers/tests/aws_moto.rs`.
//!
//! `moto_server` must be installed (`pip install 'moto[server]'`; scripts/test.sh does it).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};
use switchyard_core::PoolId;
use switchyard_providers::aws::{AwsConfig, AwsProvider};
use switchyard_tests::clouds::{contract, moto};

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
        switchyard_tests::clouds::FakeCloud::requests(&cloud)
    );
}

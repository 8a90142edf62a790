//! Unit tests of the Lambda provider that need no server: configuration, names, spot.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use std::io::Write as _;

fn key_file(content: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().expect("temp file");
    f.write_all(content.as_bytes()).expect("write");
    f
}

fn config(key: &tempfile::NamedTempFile) -> LambdaConfig {
    let toml = format!(
        r#"
cluster = "prod1"
api_key_file = "{}"
regions = ["us-east-1", "us-west-1"]
ssh_key_name = "switchyard"
[agent]
install_command = "true"
"#,
        key.path().display()
    );
    toml::from_str(&toml).expect("config")
}

#[test]
fn defaults_follow_lambdas_documentation() {
    let key = key_file("secret-key\n");
    let c = config(&key);
    assert_eq!(c.api_endpoint, DEFAULT_API_ENDPOINT);
    assert_eq!(c.launch_min_interval_ms, 12_000);
    assert!(c.validate().is_ok());
    assert_eq!(c.read_api_key().expect("key"), "secret-key");
    assert_eq!(c.name_prefix(), "sy-prod1-");
}

type Change = Box<dyn Fn(&mut LambdaConfig)>;

#[test]
fn validation_names_the_field() {
    let key = key_file("k");
    let cases: Vec<(Change, &str)> = vec![
        (Box::new(|c| c.cluster = "Prod-1".into()), "cluster"),
        (Box::new(|c| c.cluster = "a".repeat(17)), "cluster"),
        (Box::new(|c| c.regions.clear()), "regions is empty"),
        (Box::new(|c| c.ssh_key_name = " ".into()), "ssh_key_name"),
        (
            Box::new(|c| c.api_endpoint = "ftp://x".into()),
            "api_endpoint",
        ),
        (Box::new(|c| c.request_timeout_s = 0), "request_timeout_s"),
        (Box::new(|c| c.retry.max_attempts = 0), "retry.max_attempts"),
        (
            Box::new(|c| c.egress_per_gb_usd = -1.0),
            "egress_per_gb_usd",
        ),
        (Box::new(|c| c.agent.install_command = None), "agent"),
    ];
    for (change, field) in cases {
        let mut c = config(&key);
        change(&mut c);
        let e = c.validate().expect_err(field).to_string();
        assert!(e.contains(field), "{field}: {e}");
    }
    let e = toml::from_str::<LambdaConfig>("cluster = \"a\"\nbogus = 1")
        .expect_err("unknown field")
        .to_string();
    assert!(e.contains("bogus"), "{e}");
}

#[test]
fn a_bad_key_file_stops_the_start_naming_the_file_not_the_key() {
    let empty = key_file("\n");
    let e = LambdaProvider::new(config(&empty))
        .expect_err("empty")
        .to_string();
    assert!(e.contains("api_key_file") && e.contains("empty"), "{e}");
    let key = key_file("k");
    let mut c = config(&key);
    c.api_key_file = "/nonexistent/lambda-key".into();
    let e = LambdaProvider::new(c).expect_err("missing").to_string();
    assert!(e.contains("api_key_file /nonexistent/lambda-key"), "{e}");
    let spaced = key_file("two words");
    let e = LambdaProvider::new(config(&spaced))
        .expect_err("space")
        .to_string();
    assert!(
        e.contains("api_key_file") && !e.contains("two words"),
        "{e}"
    );
}

#[test]
fn unknown_regions_and_instance_types_stop_the_start() {
    let key = key_file("k");
    let mut c = config(&key);
    c.regions.push("mars-north-1".into());
    let e = LambdaProvider::new(c).expect_err("region").to_string();
    assert!(e.contains("regions") && e.contains("mars-north-1"), "{e}");
    let mut c = config(&key);
    c.instance_types = vec!["gpu_1x_a10".into(), "gpu_9x_imaginary".into()];
    let e = LambdaProvider::new(c).expect_err("type").to_string();
    assert!(
        e.contains("instance_types") && e.contains("gpu_9x_imaginary"),
        "{e}"
    );
}

#[tokio::test]
async fn pools_come_from_the_catalogue_without_spot_and_spot_is_refused() {
    let key = key_file("k");
    let mut c = config(&key);
    c.instance_types = vec!["gpu_1x_a10".into()];
    let p = LambdaProvider::new(c).expect("provider");
    let ids: Vec<String> = p.pools.iter().map(|p| p.id.to_string()).collect();
    assert_eq!(
        ids,
        ["lambda:us-east-1/gpu_1x_a10", "lambda:us-west-1/gpu_1x_a10"]
    );
    assert!(
        p.pools
            .iter()
            .all(|p| p.spot_per_hour.is_none() && p.launchable)
    );
    assert_eq!(p.instance_name("k-1"), "sy-prod1-k-1");
    let request = LaunchRequest {
        pool: PoolId::new("lambda:us-east-1/gpu_1x_a10"),
        market: Market::Spot,
        instance_key: "k-1".into(),
        enrolment_token: "t".into(),
        broker_url: "https://b".into(),
    };
    let r = p.launch(&request).await;
    assert!(matches!(r, Err(ProviderError::Rejected(_))), "{r:?}");
    let r = p
        .launch(&LaunchRequest {
            pool: PoolId::new("lambda:us-east-1/gpu_8x_h100_sxm5"),
            ..request
        })
        .await;
    assert!(matches!(r, Err(ProviderError::UnknownPool(_))), "{r:?}");
    assert!(!format!("{p:?}").contains("k\""));
}

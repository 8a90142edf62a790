//! Configuration tests of the EC2 provider (the API paths are tested against moto in
//! `providers/tests/aws_moto.rs`).

use super::*;

/// The documented example: every field the provider reads.
const EXAMPLE: &str = r#"
cluster = "prod"
regions = ["us-east-1", "us-west-2"]
instance_types = ["g5.xlarge", "p5.48xlarge"]
instance_profile = "switchyard-agent"
key_name = "ops"
spot_price_max_age_s = 86400

[image]
name_filter = "switchyard-agent-ubuntu-24.04-*"
owners = ["self"]

[per_region.us-east-1]
subnet_id = "subnet-0abc"
security_group_ids = ["sg-0abc"]

[per_region.us-west-2]
image_id = "ami-0west"

[retry]
max_attempts = 5

[agent]
download_url = "https://downloads.example.com/switchyard-agent-x86_64"
env = { SWITCHYARD_INTERRUPTION_URL = "http://169.254.169.254/latest/meta-data/spot/instance-action" }
"#;

fn example() -> AwsConfig {
    toml::from_str(EXAMPLE).expect("example parses")
}

#[test]
fn the_example_parses_and_validates_with_defaults() {
    let c = example();
    c.validate().expect("valid");
    assert_eq!(c.retry.max_attempts, 5);
    assert_eq!(c.retry.base_delay_ms, 200);
    assert_eq!(c.boot_time_s, 180);
    assert_eq!(
        c.region_settings("us-east-1").subnet_id.as_deref(),
        Some("subnet-0abc")
    );
    assert_eq!(c.region_settings("eu-west-1"), RegionSettings::default());
    assert!(c.credentials.is_none() && c.endpoint_url.is_none() && !c.require_imdsv2);
}

#[test]
fn unknown_fields_are_refused() {
    let text = format!("{EXAMPLE}\n[extra]\nx = 1\n");
    assert!(toml::from_str::<AwsConfig>(&text).is_err());
    let text = EXAMPLE.replace("key_name", "key_nme");
    assert!(toml::from_str::<AwsConfig>(&text).is_err());
}

#[test]
fn invalid_configs_say_why() {
    type Mutation = Box<dyn Fn(&mut AwsConfig)>;
    let cases: Vec<(&str, Mutation)> = vec![
        ("cluster is empty", Box::new(|c| c.cluster = " ".into())),
        ("regions is empty", Box::new(|c| c.regions.clear())),
        ("not both", Box::new(|c| c.image.id = Some("ami-1".into()))),
        (
            "per_region.eu-west-1",
            Box::new(|c| {
                c.per_region
                    .insert("eu-west-1".into(), RegionSettings::default());
            }),
        ),
        ("max_attempts", Box::new(|c| c.retry.max_attempts = 0)),
        (
            "download_url or install_command",
            Box::new(|c| c.agent.download_url = None),
        ),
        (
            "set by the provider",
            Box::new(|c| {
                c.agent
                    .env
                    .insert("SWITCHYARD_ENROL_TOKEN".into(), "x".into());
            }),
        ),
        (
            "not a SWITCHYARD_* name",
            Box::new(|c| {
                c.agent.env.insert("PATH".into(), "/tmp".into());
            }),
        ),
        (
            "64 hex digits",
            Box::new(|c| c.agent.sha256 = Some("abc".into())),
        ),
        (
            "binary_path",
            Box::new(|c| c.agent.binary_path = "/usr/bin/a b".into()),
        ),
        (
            "endpoint_url",
            Box::new(|c| c.endpoint_url = Some("localhost:5000".into())),
        ),
    ];
    for (expected, mutate) in cases {
        let mut c = example();
        mutate(&mut c);
        let err = c.validate().expect_err(expected).to_string();
        assert!(err.contains(expected), "{expected:?} not in {err:?}");
    }
}

#[test]
fn secrets_stay_out_of_debug_output() {
    let creds = StaticCredentials {
        access_key_id: "AKIA".into(),
        secret_access_key: "very-secret".into(),
        session_token: None,
    };
    assert!(!format!("{creds:?}").contains("very-secret"));
}

#[tokio::test]
async fn offers_cover_the_configured_regions_and_types_and_unknown_pools_are_refused() {
    let mut c = example();
    c.credentials = Some(StaticCredentials {
        access_key_id: "testing".into(),
        secret_access_key: "testing".into(),
        session_token: None,
    });
    let provider = AwsProvider::new(c).await.expect("provider");
    let ids: Vec<&str> = provider.pools.iter().map(|p| p.id.as_str()).collect();
    assert!(ids.contains(&"aws:us-east-1/g5.xlarge"), "{ids:?}");
    assert!(
        ids.iter()
            .all(|id| id.ends_with("/g5.xlarge") || id.ends_with("/p5.48xlarge"))
    );
    assert_eq!(provider.regions.len(), 2);
    let request = LaunchRequest {
        pool: PoolId::new("aws:eu-west-1/g5.xlarge"),
        market: Market::OnDemand,
        instance_key: "k".into(),
        enrolment_token: "t".into(),
        broker_url: "http://b".into(),
    };
    assert!(matches!(
        provider.launch(&request).await,
        Err(ProviderError::UnknownPool(_))
    ));
}

#[tokio::test]
async fn an_instance_type_no_configured_region_has_is_a_setup_error_naming_the_setting() {
    let mut c = example();
    c.instance_types.push("g9.imaginary".into());
    let err = AwsProvider::new(c).await.expect_err("no such type");
    let text = err.to_string();
    assert!(
        text.contains("instance_types: g9.imaginary is not a GPU instance type"),
        "{text}"
    );
}

#[tokio::test]
async fn a_region_missing_from_the_catalogue_is_a_setup_error() {
    let mut c = example();
    c.regions.push("mars-north-1".into());
    let err = AwsProvider::new(c).await.expect_err("no catalogue there");
    assert!(err.to_string().contains("mars-north-1"), "{err}");
}

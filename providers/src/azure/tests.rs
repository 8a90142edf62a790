//! Configuration and request-shape tests of the Azure provider (the API paths are tested
//! against the fake ARM in `tests/tests/provider_azure.rs`).

use super::*;
use std::io::Write as _;

const SUBNET: &str = "/subscriptions/00000000-0000-0000-0000-000000000001/resourceGroups/net/providers/Microsoft.Network/virtualNetworks/gpu/subnets/default";

/// The documented example, with the secret file filled in by [`example`].
fn example_text(secret_file: &str) -> String {
    format!(
        r#"
tenant_id = "00000000-0000-0000-0000-00000000000a"
client_id = "00000000-0000-0000-0000-00000000000b"
client_secret_file = "{secret_file}"
subscription_id = "00000000-0000-0000-0000-000000000001"
resource_group = "switchyard-gpu"
locations = ["eastus", "westeurope"]
cluster = "prod"
vm_sizes = ["Standard_NC24ads_A100_v4", "Standard_NC40ads_H100_v5"]
ssh_public_key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIG ops@example"

[image]
publisher = "Canonical"
offer = "ubuntu-24_04-lts"
sku = "server"

[per_location.eastus]
subnet_id = "{SUBNET}"

[per_location.westeurope]
subnet_id = "{SUBNET}"

[agent]
download_url = "https://downloads.example.com/switchyard-agent-x86_64"
"#
    )
}

fn secret_file() -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().expect("temp file");
    writeln!(f, "s3cret-value").expect("write");
    f
}

fn example(file: &tempfile::NamedTempFile) -> AzureConfig {
    toml::from_str(&example_text(&file.path().display().to_string())).expect("example parses")
}

#[test]
fn the_example_parses_and_validates_with_defaults() {
    let file = secret_file();
    let c = example(&file);
    c.validate().expect("valid");
    assert_eq!(c.authority_host, "https://login.microsoftonline.com");
    assert_eq!(c.arm_endpoint, "https://management.azure.com");
    assert_eq!(c.admin_username, "switchyard");
    assert_eq!((c.request_timeout_s, c.operation_timeout_s), (30, 600));
    assert_eq!(c.client_secret().expect("secret"), "s3cret-value");
    assert!(!format!("{c:?}").contains("s3cret"));
}

#[test]
fn unknown_fields_are_refused() {
    let file = secret_file();
    let text = example_text(&file.path().display().to_string());
    assert!(toml::from_str::<AzureConfig>(&format!("{text}\n[extra]\nx = 1\n")).is_err());
    assert!(toml::from_str::<AzureConfig>(&text.replace("vm_sizes", "vm_size")).is_err());
}

#[test]
fn validation_names_the_field() {
    let file = secret_file();
    let base = example(&file);
    type Change = Box<dyn Fn(&mut AzureConfig)>;
    let cases: Vec<(&str, Change)> = vec![
        (
            "client_secret_file",
            Box::new(|c| c.client_secret_file = "/nonexistent/secret".into()),
        ),
        ("locations is empty", Box::new(|c| c.locations.clear())),
        (
            "per_location.northpole",
            Box::new(|c| {
                c.locations.push("northpole".into());
            }),
        ),
        (
            "subnet_id",
            Box::new(|c| {
                c.per_location.insert(
                    "eastus".into(),
                    LocationSettings {
                        subnet_id: "default".into(),
                    },
                );
            }),
        ),
        (
            "arm_endpoint",
            Box::new(|c| c.arm_endpoint = "management.azure.com".into()),
        ),
        (
            "authority_host",
            Box::new(|c| c.authority_host = "ftp://login".into()),
        ),
        (
            "prices_endpoint",
            Box::new(|c| c.prices_endpoint = "prices".into()),
        ),
        ("image", Box::new(|c| c.image.sku = None)),
        (
            "image",
            Box::new(|c| c.image.id = Some("/subscriptions/x/images/y".into())),
        ),
        (
            "ssh_public_key",
            Box::new(|c| c.ssh_public_key = "AAAA".into()),
        ),
        ("tenant_id", Box::new(|c| c.tenant_id = " ".into())),
        (
            "resource_group",
            Box::new(|c| c.resource_group = "a/b".into()),
        ),
        ("cluster", Box::new(|c| c.cluster = String::new())),
        ("retry.max_attempts", Box::new(|c| c.retry.max_attempts = 0)),
        (
            "operation_timeout_s",
            Box::new(|c| c.operation_timeout_s = 0),
        ),
        ("agent", Box::new(|c| c.agent.download_url = None)),
    ];
    for (field, change) in cases {
        let mut c = base.clone();
        change(&mut c);
        let err = c.validate().expect_err(field).to_string();
        assert!(err.contains(field), "{field}: {err}");
    }
    let empty = tempfile::NamedTempFile::new().expect("temp file");
    let mut c = base.clone();
    c.client_secret_file = empty.path().into();
    assert!(
        c.validate()
            .expect_err("empty")
            .to_string()
            .contains("is empty")
    );
}

#[tokio::test]
async fn unknown_locations_and_sizes_stop_the_start() {
    let file = secret_file();
    let mut c = example(&file);
    c.locations = vec!["northpole".into()];
    c.per_location = [(
        "northpole".to_owned(),
        LocationSettings {
            subnet_id: SUBNET.into(),
        },
    )]
    .into();
    let err = AzureProvider::new(c)
        .await
        .expect_err("unknown location")
        .to_string();
    assert!(
        err.contains("locations") && err.contains("northpole"),
        "{err}"
    );

    let mut c = example(&file);
    c.vm_sizes.push("Standard_Nope".into());
    let err = AzureProvider::new(c)
        .await
        .expect_err("unknown size")
        .to_string();
    assert!(
        err.contains("vm_sizes") && err.contains("Standard_Nope"),
        "{err}"
    );
}

#[tokio::test]
async fn offers_are_the_catalogues_sizes_in_the_locations() {
    let file = secret_file();
    let mut c = example(&file);
    c.prices_endpoint = String::new();
    let p = AzureProvider::new(c).await.expect("provider");
    let offers = p.offers().await.expect("offers");
    let ids: Vec<&str> = offers.pools.iter().map(|p| p.id.as_str()).collect();
    assert!(
        ids.contains(&"azure:eastus/Standard_NC24ads_A100_v4"),
        "{ids:?}"
    );
    assert!(
        ids.iter()
            .all(|id| id.contains("NC24ads_A100_v4") || id.contains("NC40ads_H100_v5"))
    );
    assert_eq!(offers.regions.len(), 2);
    assert!(!format!("{p:?}").contains("s3cret"));
}

#[tokio::test]
async fn the_vm_body_carries_spot_tags_delete_options_and_the_bootstrap() {
    let file = secret_file();
    let p = AzureProvider::new(example(&file)).await.expect("provider");
    let request = LaunchRequest {
        pool: PoolId::new("azure:eastus/Standard_NC24ads_A100_v4"),
        market: Market::Spot,
        instance_key: "key-1".into(),
        enrolment_token: "tok-123".into(),
        broker_url: "https://broker:8443".into(),
    };
    let names = names::Names::of("prod", "key-1");
    let body = p.vm_body(
        &request,
        &names,
        "eastus",
        "Standard_NC24ads_A100_v4",
        "#!/bin/bash\necho tok-123\n",
    );
    let props = &body["properties"];
    assert_eq!(props["priority"], "Spot");
    assert_eq!(props["evictionPolicy"], "Delete");
    assert_eq!(props["billingProfile"]["maxPrice"], -1);
    assert_eq!(props["storageProfile"]["osDisk"]["deleteOption"], "Delete");
    assert_eq!(
        props["networkProfile"]["networkInterfaces"][0]["properties"]["deleteOption"],
        "Delete"
    );
    assert_eq!(body["tags"][INSTANCE_TAG], "key-1");
    assert_eq!(body["tags"][CLUSTER_TAG], "prod");
    let custom = props["osProfile"]["customData"]
        .as_str()
        .expect("customData");
    let script = base64::engine::general_purpose::STANDARD
        .decode(custom)
        .expect("base64");
    assert_eq!(script, b"#!/bin/bash\necho tok-123\n");
    assert!(
        !body.to_string().contains("tok-123"),
        "the token is only inside the base64"
    );

    let on_demand = LaunchRequest {
        market: Market::OnDemand,
        ..request
    };
    let body = p.vm_body(
        &on_demand,
        &names,
        "eastus",
        "Standard_NC24ads_A100_v4",
        "x",
    );
    assert_eq!(body["properties"]["priority"], "Regular");
    assert!(body["properties"].get("evictionPolicy").is_none());
}

//! Helpers for end-to-end tests of `switchyard serve` bursting into the fake clouds: the
//! `[gcp]`, `[azure]` and `[lambda]` sections of a broker config pointed at a running fake (and
//! `[aws]` at moto behind its fault proxy), with the instances' bootstrap installing the real
//! `switchyard-agent` (see [`super::boot`]).

use super::{azure, boot, gce, lambda, moto};
use std::path::Path;

/// Settings of a `[section]` for a fake cloud shared by both clouds.
#[derive(Clone, Debug)]
pub struct Section<'a> {
    /// Value of the `cluster` label/tag.
    pub cluster: &'a str,
    /// The `switchyard-agent` binary the instances' bootstrap installs.
    pub agent: &'a Path,
    /// The planner's estimate of the boot time, in seconds.
    pub boot_time_s: u32,
}

/// A `[gcp]` section launching `machine_type` in `zone` of the fake GCE; its service-account
/// key (with `token_uri` at the fake) is written into `dir`.
pub fn gcp_section(
    fake: &gce::FakeHandle,
    dir: &Path,
    zone: &str,
    machine_type: &str,
    s: &Section<'_>,
) -> String {
    let credentials = fake.write_credentials(dir);
    format!(
        r#"
[gcp]
project = "{project}"
zones = ["{zone}"]
machine_types = ["{machine_type}"]
credentials_file = "{credentials}"
api_endpoint = "{url}"
image = "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64"
subnetwork = "gpu-subnet"
cluster = "{cluster}"
boot_time_s = {boot_time_s}
request_timeout_s = 5
operation_timeout_s = 10
retry = {{ max_attempts = 3, base_delay_ms = 10, max_delay_ms = 40 }}
agent = {{ install_command = '''{install}''' }}
"#,
        project = fake.project(),
        credentials = credentials.display(),
        url = fake.url(),
        cluster = s.cluster,
        boot_time_s = s.boot_time_s,
        install = boot::install_command(s.agent),
    )
}

/// An `[azure]` section launching `vm_size` in `location` of the fake ARM; the client secret
/// is written into `dir`.
pub fn azure_section(
    fake: &azure::FakeHandle,
    dir: &Path,
    location: &str,
    vm_size: &str,
    s: &Section<'_>,
) -> String {
    let o = fake.options();
    let secret = dir.join("azure-client-secret");
    std::fs::write(&secret, format!("{}\n", o.client_secret)).expect("write the secret");
    format!(
        r#"
[azure]
tenant_id = "{tenant}"
client_id = "{client}"
client_secret_file = "{secret}"
subscription_id = "{subscription}"
resource_group = "{group}"
locations = ["{location}"]
vm_sizes = ["{vm_size}"]
cluster = "{cluster}"
authority_host = "{url}"
arm_endpoint = "{url}"
prices_endpoint = "{url}"
image = {{ publisher = "Canonical", offer = "ubuntu-24_04-lts", sku = "server" }}
ssh_public_key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFAKE e2e@switchyard"
boot_time_s = {boot_time_s}
request_timeout_s = 5
operation_timeout_s = 10
poll_interval_ms = 50
retry = {{ max_attempts = 3, base_delay_ms = 10, max_delay_ms = 50 }}
agent = {{ install_command = '''{install}''' }}

[azure.per_location.{location}]
subnet_id = "{subnet}"
"#,
        tenant = o.tenant_id,
        client = o.client_id,
        secret = secret.display(),
        subscription = o.subscription_id,
        group = o.resource_group,
        cluster = s.cluster,
        url = fake.url(),
        boot_time_s = s.boot_time_s,
        install = boot::install_command(s.agent),
        subnet = o.subnet_id("gpu", "default"),
    )
}

/// The value of `KEY="value"` in a bootstrap's agent env file (`/etc/switchyard/agent.env`
/// under a sandbox root).
pub fn env_value(root: &Path, key: &str) -> Option<String> {
    let text = std::fs::read_to_string(root.join("etc/switchyard/agent.env")).ok()?;
    text.lines().find_map(|l| {
        l.strip_prefix(key)?
            .strip_prefix("=\"")?
            .strip_suffix('"')
            .map(str::to_string)
    })
}

/// A `[lambda]` section launching `instance_type` in `region` of the fake Lambda; the API key
/// is written into `dir`. Launches may follow each other after 50 ms (the fake's default
/// limit), not Lambda's 12 s.
pub fn lambda_section(
    fake: &lambda::FakeHandle,
    dir: &Path,
    region: &str,
    instance_type: &str,
    s: &Section<'_>,
) -> String {
    let key = dir.join("lambda-api-key");
    std::fs::write(&key, format!("{}\n", fake.api_key())).expect("write the API key");
    format!(
        r#"
[lambda]
cluster = "{cluster}"
api_key_file = "{key}"
api_endpoint = "{url}"
regions = ["{region}"]
instance_types = ["{instance_type}"]
ssh_key_name = "switchyard"
launch_min_interval_ms = 60
boot_time_s = {boot_time_s}
request_timeout_s = 5
operation_timeout_s = 10
retry = {{ max_attempts = 3, base_delay_ms = 10, max_delay_ms = 50 }}
agent = {{ install_command = '''{install}''' }}
"#,
        cluster = s.cluster.replace(|c: char| !c.is_ascii_alphanumeric(), ""),
        key = key.display(),
        url = fake.api_endpoint(),
        boot_time_s = s.boot_time_s,
        install = boot::install_command(s.agent),
    )
}

/// An `[aws]` section launching `instance_type` in each of `regions`, every region through
/// `moto`'s fault proxy (one endpoint serves them all; the SigV4 scope names the region), with
/// moto's test credentials. Moto boots nothing: an instance that launches there never enrols.
pub fn aws_section(
    moto: &moto::MotoCloud,
    regions: &[&str],
    instance_type: &str,
    s: &Section<'_>,
) -> String {
    let regions = regions
        .iter()
        .map(|r| format!("{r:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        r#"
[aws]
cluster = "{cluster}"
regions = [{regions}]
instance_types = ["{instance_type}"]
endpoint_url = "{url}"
credentials = {{ access_key_id = "testing", secret_access_key = "testing" }}
image = {{ id = "ami-12345678" }}
boot_time_s = {boot_time_s}
request_timeout_s = 5
retry = {{ max_attempts = 3, base_delay_ms = 10, max_delay_ms = 50 }}
agent = {{ install_command = '''{install}''' }}
"#,
        cluster = s.cluster,
        url = moto.url(),
        boot_time_s = s.boot_time_s,
        install = boot::install_command(s.agent),
    )
}

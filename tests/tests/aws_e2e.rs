//! The broker bursting into EC2 for real: `switchyard serve` with an `[aws]` section pointed at
//! a moto EC2 endpoint. A deadline with no on-prem capacity launches a p5.48xlarge through
//! RunInstances; the instance never enrols (moto boots nothing), so the boot timeout terminates
//! it and the job is re-planned; a tagged instance the broker never launched is reaped.
//! The EC2 state is read back through EC2's own query API.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::json;
use std::time::Duration;
use switchyard_tests::*;

struct Moto {
    url: String,
    _proc: Proc,
    _dir: tempfile::TempDir,
}

async fn moto() -> Moto {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut cmd = std::process::Command::new("moto_server");
    cmd.args(["-H", "127.0.0.1", "-p", &port.to_string()]);
    let proc = Proc::spawn("moto", cmd, &dir.path().join("moto.log"))
        .expect("moto_server must be installed (scripts/test.sh installs it)");
    let url = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    eventually("moto to answer", Duration::from_secs(30), || async {
        http.get(format!("{url}/moto-api/"))
            .send()
            .await
            .ok()
            .map(|_| ())
    })
    .await;
    Moto {
        url,
        _proc: proc,
        _dir: dir,
    }
}

impl Moto {
    async fn ec2(&self, params: &[(&str, &str)]) -> String {
        let mut form: Vec<(&str, &str)> = vec![("Version", "2016-11-15")];
        form.extend_from_slice(params);
        let r = reqwest::Client::new()
            .post(&self.url)
            .header("Authorization", "AWS4-HMAC-SHA256 Credential=testing/20261202/us-east-1/ec2/aws4_request, SignedHeaders=host, Signature=x")
            .form(&form)
            .send()
            .await
            .unwrap();
        let status = r.status();
        let body = r.text().await.unwrap();
        assert!(status.is_success(), "{status}: {body}");
        body
    }

    /// (instance id, state name) of every instance tagged with the cluster.
    async fn cluster_instances(&self, cluster: &str) -> Vec<(String, String)> {
        let xml = self
            .ec2(&[
                ("Action", "DescribeInstances"),
                ("Filter.1.Name", "tag:switchyard:cluster"),
                ("Filter.1.Value.1", cluster),
            ])
            .await;
        xml.split("<instanceId>")
            .skip(1)
            .map(|chunk| {
                let id = chunk.split("</instanceId>").next().unwrap().to_string();
                let state = chunk
                    .split("<instanceState>")
                    .nth(1)
                    .and_then(|s| s.split("<name>").nth(1))
                    .and_then(|s| s.split("</name>").next())
                    .unwrap_or("")
                    .to_string();
                (id, state)
            })
            .collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bursting_into_ec2_launches_times_out_and_reaps_against_moto() {
    let moto = moto().await;
    // A tagged instance from an earlier broker that this one does not know: a leak.
    let stray = moto
        .ec2(&[
            ("Action", "RunInstances"),
            ("ImageId", "ami-12345678"),
            ("MinCount", "1"),
            ("MaxCount", "1"),
            ("InstanceType", "p5.48xlarge"),
            ("TagSpecification.1.ResourceType", "instance"),
            ("TagSpecification.1.Tag.1.Key", "switchyard:cluster"),
            ("TagSpecification.1.Tag.1.Value", "e2e"),
            ("TagSpecification.1.Tag.2.Key", "switchyard:instance"),
            ("TagSpecification.1.Tag.2.Value", "stray-1"),
            ("TagSpecification.1.Tag.3.Key", "switchyard:pool"),
            (
                "TagSpecification.1.Tag.3.Value",
                "aws:us-east-1/p5.48xlarge",
            ),
        ])
        .await;
    let stray_id = stray
        .split("<instanceId>")
        .nth(1)
        .unwrap()
        .split("</instanceId>")
        .next()
        .unwrap()
        .to_string();

    let broker = Broker::start_with(&format!(
        r#"
burst_enabled = true
boot_timeout_s = 3

[aws]
cluster = "e2e"
regions = ["us-east-1"]
instance_types = ["p5.48xlarge"]
endpoint_url = "{}"
credentials = {{ access_key_id = "testing", secret_access_key = "testing" }}
image = {{ id = "ami-12345678" }}
boot_time_s = 120
agent = {{ install_command = "true" }}
"#,
        moto.url
    ))
    .await;

    let (_, pools) = broker
        .call(reqwest::Method::GET, "/api/v1/pools", None)
        .await;
    let p5 = pools["pools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"] == "aws:us-east-1/p5.48xlarge")
        .unwrap()
        .clone();
    assert_eq!(p5["gpus_per_node"], 8, "{p5}");
    assert_eq!(
        p5["price_per_gpu_hour"], 6.88,
        "the catalogue price survives moto's placeholder spot prices"
    );

    let deadline = chrono::DateTime::<chrono::Utc>::from(
        std::time::SystemTime::now() + Duration::from_secs(3600),
    )
    .to_rfc3339();
    let id = broker
        .submit(json!({"name": "big", "team": "ml", "command": ["true"], "estimated_runtime_s": 600,
                       "resources": {"gpus": 8, "gpu_models": ["H100"]}, "deadline": deadline, "spot": "never"}))
        .await;

    // RunInstances happened: the broker knows the EC2 id and EC2 has it, tagged as ours.
    let first = eventually(
        "an instance booting in EC2",
        Duration::from_secs(30),
        || async {
            let (_, list) = broker
                .call(reqwest::Method::GET, "/api/v1/instances", None)
                .await;
            list["instances"]
                .as_array()?
                .iter()
                .find(|i| i["state"] == "booting")
                .cloned()
        },
    )
    .await;
    let ec2_id = first["provider_id"].as_str().unwrap().to_string();
    assert!(ec2_id.starts_with("i-"), "{first}");
    assert_eq!(first["market"], "on_demand");
    assert_eq!(broker.job(&id).await["state"], "provisioning");
    assert!(
        moto.cluster_instances("e2e")
            .await
            .iter()
            .any(|(i, s)| *i == ec2_id && s == "running")
    );

    // The stray is terminated by the reaper.
    eventually(
        "the stray to be terminated",
        Duration::from_secs(30),
        || async {
            let all = moto.cluster_instances("e2e").await;
            all.iter()
                .any(|(i, s)| *i == stray_id && (s == "terminated" || s == "shutting-down"))
                .then_some(())
        },
    )
    .await;

    // Nobody enrols (moto boots nothing): after 3 s the boot timeout terminates it in EC2 and
    // the job is re-planned onto a fresh launch.
    eventually(
        "the first instance to be terminated in EC2",
        Duration::from_secs(30),
        || async {
            let all = moto.cluster_instances("e2e").await;
            all.iter()
                .any(|(i, s)| *i == ec2_id && (s == "terminated" || s == "shutting-down"))
                .then_some(())
        },
    )
    .await;
    let (_, list) = broker
        .call(reqwest::Method::GET, "/api/v1/instances", None)
        .await;
    let instances = list["instances"].as_array().unwrap();
    let ended = instances
        .iter()
        .find(|i| i["provider_id"] == ec2_id.as_str())
        .unwrap();
    assert_eq!(ended["state"], "terminated");
    assert!(
        ended["last_error"]
            .as_str()
            .unwrap()
            .contains("boot timeout"),
        "{ended}"
    );
    eventually("a replacement launch", Duration::from_secs(30), || async {
        let (_, list) = broker
            .call(reqwest::Method::GET, "/api/v1/instances", None)
            .await;
        (list["instances"].as_array()?.len() >= 2).then_some(())
    })
    .await;

    // Invariant: every running tagged instance in EC2 is one the broker counts as live. The
    // broker records the provider's id once RunInstances has answered, so a launch in flight
    // is given a moment to be recorded.
    eventually(
        "every running EC2 instance to be live in the broker",
        Duration::from_secs(10),
        || async {
            let (_, list) = broker
                .call(reqwest::Method::GET, "/api/v1/instances", None)
                .await;
            let live: Vec<String> = list["instances"]
                .as_array()?
                .iter()
                .filter(|i| i["state"] != "terminated")
                .filter_map(|i| i["provider_id"].as_str().map(str::to_string))
                .collect();
            moto.cluster_instances("e2e")
                .await
                .iter()
                .filter(|(_, s)| s == "running" || s == "pending")
                .all(|(i, _)| live.contains(i))
                .then_some(())
        },
    )
    .await;
}

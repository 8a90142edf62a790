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
    /// A broker config that bursts into this moto as `cluster` (p5.48xlarge in us-east-1),
    /// giving an instance `boot_timeout_s` to enrol.
    fn burst_config(&self, cluster: &str, boot_timeout_s: u32) -> String {
        format!(
            r#"
burst_enabled = true
boot_timeout_s = {boot_timeout_s}

[aws]
cluster = "{cluster}"
regions = ["us-east-1"]
instance_types = ["p5.48xlarge"]
endpoint_url = "{}"
credentials = {{ access_key_id = "testing", secret_access_key = "testing" }}
image = {{ id = "ami-12345678" }}
boot_time_s = 120
agent = {{ install_command = "true" }}
"#,
            self.url
        )
    }

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

    /// (instance id, state name, `switchyard:instance` tag) of every instance tagged with the
    /// cluster. The broker starts one machine per RunInstances, so each reservation holds one.
    async fn cluster_machines(&self, cluster: &str) -> Vec<(String, String, String)> {
        let xml = self
            .ec2(&[
                ("Action", "DescribeInstances"),
                ("Filter.1.Name", "tag:switchyard:cluster"),
                ("Filter.1.Value.1", cluster),
            ])
            .await;
        xml.split("<reservationId>")
            .skip(1)
            .map(|reservation| {
                let machines = self.cluster_instances_in(reservation);
                assert_eq!(
                    machines.len(),
                    1,
                    "one machine per reservation: {reservation}"
                );
                let key = reservation
                    .split("<key>switchyard:instance</key>")
                    .nth(1)
                    .and_then(|s| s.split("<value>").nth(1))
                    .and_then(|s| s.split("</value>").next())
                    .unwrap_or("")
                    .to_string();
                let (id, state) = machines.into_iter().next().unwrap();
                (id, state, key)
            })
            .collect()
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
        self.cluster_instances_in(&xml)
    }

    fn cluster_instances_in(&self, xml: &str) -> Vec<(String, String)> {
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

    let broker = Broker::start_with(&moto.burst_config("e2e", 3)).await;

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
    // The broker records the end once the terminate call has answered, a moment after EC2
    // shows it.
    let ended = eventually(
        "the broker to record the first instance terminated",
        Duration::from_secs(10),
        || async {
            instances(&broker)
                .await
                .into_iter()
                .find(|i| i["provider_id"] == ec2_id.as_str() && i["state"] == "terminated")
        },
    )
    .await;
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

/// A broker killed with `kill -9` while its launches into EC2 are under way: after the restart
/// it adopts what it launched (or reaps a second machine under one key), launches nothing new
/// for jobs it already launched for, and once the jobs are cancelled every machine is
/// terminated in EC2. Nothing leaks, whatever moment the kill hits: here before any
/// RunInstances answered (the instances only recorded as requested)…
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_killed_before_its_launches_leaks_no_instance_and_launches_none_twice() {
    killed_mid_burst(KillAt::FirstRecorded).await;
}

/// … and once the first machine exists in EC2, the others' RunInstances still in flight or
/// answered but not yet recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_killed_after_its_first_machine_started_leaks_none_and_launches_none_twice() {
    killed_mid_burst(KillAt::FirstMachine).await;
}

#[derive(Debug)]
enum KillAt {
    /// The first instance row exists in the broker.
    FirstRecorded,
    /// The first machine exists in EC2.
    FirstMachine,
}

async fn killed_mid_burst(kill_at: KillAt) {
    let moto = moto().await;
    let mut broker = Broker::start_with(&moto.burst_config("crash", 600)).await;
    let deadline = chrono::DateTime::<chrono::Utc>::from(
        std::time::SystemTime::now() + Duration::from_secs(3600),
    )
    .to_rfc3339();
    // Three 8-GPU jobs: no on-prem pool has 8 GPUs on a node, so each needs a launch.
    let mut jobs = Vec::new();
    for n in 0..3 {
        jobs.push(
            broker
                .submit(
                    json!({"name": format!("big-{n}"), "team": "ml", "command": ["true"],
                               "estimated_runtime_s": 600, "deadline": deadline, "spot": "never",
                               "resources": {"gpus": 8, "gpu_models": ["H100"]}}),
                )
                .await,
        );
    }
    match kill_at {
        KillAt::FirstRecorded => {
            eventually(
                "a launch to be recorded",
                Duration::from_secs(30),
                || async { (!instances(&broker).await.is_empty()).then_some(()) },
            )
            .await
        }
        KillAt::FirstMachine => {
            eventually("a machine in EC2", Duration::from_secs(30), || async {
                (!moto.cluster_machines("crash").await.is_empty()).then_some(())
            })
            .await
        }
    }
    broker.kill9();
    let at_kill = moto.cluster_machines("crash").await;

    // Back with a short boot timeout (moto boots nothing, so nobody will enrol).
    let config_path = broker.data_dir().parent().unwrap().join("switchyard.toml");
    let text = std::fs::read_to_string(&config_path).unwrap();
    std::fs::write(
        &config_path,
        text.replace("boot_timeout_s = 600", "boot_timeout_s = 4"),
    )
    .unwrap();
    broker.start_again().await;

    // Every machine running in EC2 is one the restarted broker counts as live, one per key.
    let settled = eventually(
        "EC2 and the broker to agree after the restart",
        Duration::from_secs(30),
        || async {
            let live: Vec<String> = instances(&broker)
                .await
                .iter()
                .filter(|i| i["state"] != "terminated")
                .filter_map(|i| i["provider_id"].as_str().map(str::to_string))
                .collect();
            let machines = moto.cluster_machines("crash").await;
            let running: Vec<&(String, String, String)> = machines
                .iter()
                .filter(|(_, s, _)| s == "running" || s == "pending")
                .collect();
            let keys: std::collections::BTreeSet<&str> =
                running.iter().map(|(_, _, k)| k.as_str()).collect();
            (!running.is_empty()
                && keys.len() == running.len()
                && running.iter().all(|(i, _, _)| live.contains(i)))
            .then_some(machines)
        },
    )
    .await;
    // No job was launched for twice: the keys in EC2 are the instances recorded for the jobs.
    let recorded = instances(&broker).await;
    let keys: std::collections::BTreeSet<String> =
        settled.iter().map(|(_, _, k)| k.clone()).collect();
    for key in &keys {
        let inst = recorded
            .iter()
            .find(|i| i["id"] == key.as_str())
            .unwrap_or_else(|| panic!("EC2 has {key}, the broker never recorded it"));
        assert!(jobs.iter().any(|j| inst["for_job"] == j.as_str()), "{inst}");
    }
    for job in &jobs {
        let launched: Vec<&serde_json::Value> = recorded
            .iter()
            .filter(|i| i["for_job"] == job.as_str())
            .collect();
        assert!(launched.len() <= 1, "two launches for {job}: {launched:?}");
    }

    // Cancelled, the jobs need nothing: every machine ends in EC2 (the boot timeout ends the
    // booting ones), and the broker records every instance as terminated.
    for job in &jobs {
        let (status, body) = broker
            .call(
                reqwest::Method::POST,
                &format!("/api/v1/jobs/{job}/cancel"),
                None,
            )
            .await;
        assert!((200..300).contains(&status), "{status}: {body}");
    }
    let end = eventually(
        "every machine to be terminated",
        Duration::from_secs(60),
        || async {
            let machines = moto.cluster_machines("crash").await;
            let all_ended = machines
                .iter()
                .all(|(_, s, _)| s == "terminated" || s == "shutting-down");
            let broker_ended = instances(&broker)
                .await
                .iter()
                .all(|i| i["state"] == "terminated");
            (all_ended && broker_ended).then_some(machines)
        },
    )
    .await;
    let per_key = |ms: &[(String, String, String)]| {
        let mut n: std::collections::BTreeMap<String, usize> = Default::default();
        for (_, _, k) in ms {
            *n.entry(k.clone()).or_default() += 1;
        }
        n
    };
    eprintln!(
        "crash mid-burst ({kill_at:?}): at the kill EC2 had {} machines; the restarted broker has {} \
         instances, EC2 {} keys, machines per key {:?}; all {} machines terminated after the cancel",
        at_kill.len(),
        recorded.len(),
        keys.len(),
        per_key(&end),
        end.len()
    );
}

/// The broker's instances, through its API.
async fn instances(broker: &Broker) -> Vec<serde_json::Value> {
    let (_, list) = broker
        .call(reqwest::Method::GET, "/api/v1/instances", None)
        .await;
    list["instances"].as_array().cloned().unwrap_or_default()
}

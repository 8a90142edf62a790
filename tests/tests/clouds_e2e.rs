//! The burst cycle end to end through the fake clouds (issue 27, items 2 and 3): `switchyard
//! serve` with a `[gcp]` (and `[azure]`) section pointed at the in-process fakes, whose
//! "instances" run the bootstrap script they were given in a sandbox, so a real
//! `switchyard-agent` enrols with the one-time token the launch carried.
//!
//! - A deadline job that no on-prem pool can run launches a GCE instance; its agent enrols,
//!   the job runs there and succeeds, and after the idle TTL the broker deletes the instance
//!   (nothing is left in the fake). The token reaches the instance's env file and never the
//!   broker's log.
//! - Cross-cloud failover: GCE (the cheaper cloud) answers every launch with
//!   `QUOTA_EXCEEDED`; the job launches on Azure instead, and the instances list shows the
//!   failed GCE attempt (its error, no cost) beside the Azure one.
//! - The whole chain (issue 27, deliverable 3): EC2 (moto behind its fault proxy, the cheapest
//!   of the three) answers `InsufficientInstanceCapacity` in every configured region, GCE
//!   answers `QUOTA_EXCEEDED`, and the job launches on Azure and succeeds before its deadline;
//!   the instances list and the ledger show every attempt, the failed ones at no cost.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::{Value, json};
use std::time::{Duration, Instant};
use switchyard_tests::clouds::e2e::{Section, aws_section, azure_section, env_value, gcp_section};
use switchyard_tests::clouds::{FakeCloud, Fault, azure, gce, moto};
use switchyard_tests::*;

/// 1× A100-80GB on GCE (the cheaper of the two) and on Azure.
const GCE_TYPE: &str = "a2-ultragpu-1g";
const GCE_POOL: &str = "gcp:us-central1/a2-ultragpu-1g";
const AZURE_SIZE: &str = "Standard_NC24ads_A100_v4";
const AZURE_POOL: &str = "azure:eastus/Standard_NC24ads_A100_v4";

/// Short timings: an idle instance ends 2 s after its job (no minimum billed time), a pool
/// that answered quota is left alone for the rest of the test.
const BURST: &str = r#"
burst_enabled = true
idle_ttl_s = 2
min_billed_s = 0
boot_timeout_s = 60
pool_backoff_s = 600
provider_call_timeout_ms = 20000
"#;

/// A one-GPU A100-80GB job with a deadline: the on-prem pool (H100) cannot run it, so the
/// planner must burst.
fn job(name: &str) -> Value {
    json!({
        "name": name, "team": "ml",
        "command": ["sh", "-c", "echo burst-ok"],
        "estimated_runtime_s": 60,
        "resources": {"gpus": 1, "gpu_models": ["A100-80GB"]},
        "deadline": in_secs(3600),
        "spot": "never",
    })
}

async fn instances(broker: &Broker) -> Vec<Value> {
    let (status, list) = broker
        .call(reqwest::Method::GET, "/api/v1/instances", None)
        .await;
    assert_eq!(status, 200, "{list}");
    list["instances"].as_array().cloned().unwrap_or_default()
}

/// Waits for `what`, dumping the broker's log and `extra` (the agents' logs) on a timeout.
async fn wait<T, F, Fut>(
    broker: &Broker,
    what: &str,
    secs: u64,
    extra: &dyn Fn() -> String,
    f: F,
) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    match tokio::time::timeout(
        Duration::from_secs(secs + 1),
        eventually_quiet(Duration::from_secs(secs), f),
    )
    .await
    {
        Ok(Some(v)) => v,
        _ => panic!(
            "timed out after {secs} s waiting for {what}\n{}\n{}",
            broker.dump_logs(),
            extra()
        ),
    }
}

async fn eventually_quiet<T, F, Fut>(timeout: Duration, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return Some(v);
        }
        if tokio::time::Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Job `id`'s run on the fake Azure: its instance in `pool` ready, the one VM the fake holds,
/// the enrolment token that VM's bootstrap carried, and the job once it ended.
struct AzureRun {
    inst: Value,
    vm: String,
    token: String,
    done: Value,
}

/// Waits `secs.0` for job `id`'s Azure instance in `pool` to be ready (dumping `extra` on a
/// timeout), then `secs.1` for the job to end on it.
async fn runs_on_azure(
    broker: &Broker,
    az: &azure::FakeHandle,
    id: &str,
    pool: &str,
    secs: (u64, u64),
    extra: &dyn Fn() -> String,
) -> AzureRun {
    let inst = wait(broker, "an Azure instance ready", secs.0, extra, || async {
        instances(broker)
            .await
            .into_iter()
            .find(|i| i["pool"] == pool && i["for_job"] == id && i["state"] == "ready")
    })
    .await;
    let vms: Vec<String> = az
        .live_instances()
        .into_iter()
        .filter(|r| !r.contains(':'))
        .collect();
    assert_eq!(vms.len(), 1, "{vms:?}");
    let vm = vms[0].clone();
    let root = az
        .boot_root(&vm)
        .unwrap_or_else(|| panic!("no sandbox for {vm}"));
    let token = env_value(&root, "SWITCHYARD_ENROL_TOKEN").expect("the enrolment token");
    let dump = || agent_log(az.boot_root(&vm));
    let done = wait(broker, "the job to finish", secs.1, &dump, || async {
        let j = broker.job(id).await;
        matches!(
            j["state"].as_str(),
            Some("succeeded" | "failed" | "cancelled")
        )
        .then_some(j)
    })
    .await;
    AzureRun {
        inst,
        vm,
        token,
        done,
    }
}

fn agent_log(root: Option<std::path::PathBuf>) -> String {
    root.map(|r| {
        format!(
            "--- agent.log in {}\n{}",
            r.display(),
            std::fs::read_to_string(r.join("agent.log")).unwrap_or_default()
        )
    })
    .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_through_the_fake_gce_enrols_a_real_agent_runs_the_job_and_ends_the_instance() {
    let started = Instant::now();
    let fake = gce::start(gce::Options {
        run_bootstrap: true,
        ..gce::Options::default()
    })
    .await;
    let keys = tempfile::tempdir().unwrap();
    let agent = bin("switchyard-agent");
    let section = Section {
        cluster: "e2e",
        agent: &agent,
        boot_time_s: 20,
    };
    let config = format!(
        "{BURST}{}",
        gcp_section(&fake, keys.path(), "us-central1-a", GCE_TYPE, &section)
    );
    let broker = Broker::start_with(&config).await;

    // The GCE pool is offered, from the bundled catalogue.
    let (_, pools) = broker
        .call(reqwest::Method::GET, "/api/v1/pools", None)
        .await;
    let pool = pools["pools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"] == GCE_POOL)
        .unwrap_or_else(|| panic!("no {GCE_POOL} in {pools}"))
        .clone();
    assert_eq!(pool["gpus_per_node"], 1, "{pool}");

    let id = broker.submit(job("gce-burst")).await;

    // The broker launches into GCE: the fake got an instances.insert (the one instance it
    // holds) carrying the startup-script, and the broker lists an instance of the GCE pool for
    // the job. (Its provider id is not awaited here: when the agent enrols before the launch
    // answer is recorded, the broker never records it — see
    // `a_launch_answer_that_arrives_after_the_agent_enrolled_is_recorded`.)
    let provider_id = wait(
        &broker,
        "an instance in the fake GCE",
        30,
        &String::new,
        || async {
            let live = fake.live_instances();
            (live.len() == 1).then(|| live[0].clone())
        },
    )
    .await;
    assert!(provider_id.starts_with("us-central1-a/"), "{provider_id}");
    let inst = wait(
        &broker,
        "the broker's GCE instance",
        10,
        &String::new,
        || async {
            instances(&broker)
                .await
                .into_iter()
                .find(|i| i["pool"] == GCE_POOL && i["for_job"] == id.as_str())
        },
    )
    .await;
    assert_eq!(inst["provider"], "gcp", "{inst}");
    // The key the broker launched under is the instance's `switchyard-instance` metadata.
    let body = fake
        .instance(&provider_id)
        .expect("the fake has the instance");
    let key = body["metadata"]["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["key"] == "switchyard-instance")
        .map(|m| m["value"].clone());
    assert_eq!(key.as_ref(), Some(&inst["id"]), "{body}");
    assert_eq!(body["labels"]["switchyard-cluster"], "e2e", "{body}");
    let script = fake.script(&provider_id).expect("a startup-script");
    assert!(script.contains("switchyard-agent"), "{script}");
    assert_eq!(fake.boot_error(&provider_id), None, "the bootstrap ran");

    // The token the launch carried is in the instance's env file (root-only) and nowhere in
    // the broker's log.
    let root = fake.sandbox_root(&provider_id).expect("a sandbox");
    let token = env_value(&root, "SWITCHYARD_ENROL_TOKEN").expect("the enrolment token");
    assert!(token.len() >= 16, "{token}");
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(root.join("etc/switchyard/agent.env"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "the env file is root-only");
    assert_eq!(
        env_value(&root, "SWITCHYARD_BROKER").as_deref(),
        Some(broker.url.as_str())
    );
    let dump = || agent_log(fake.sandbox_root(&provider_id));

    // The sandbox's agent enrols: the instance is ready with a node of the GCE pool.
    let ready = wait(&broker, "the instance to be ready", 30, &dump, || async {
        instances(&broker)
            .await
            .into_iter()
            .find(|i| i["id"] == inst["id"] && i["state"] == "ready" && i["node"].is_string())
    })
    .await;
    let node = ready["node"].as_str().unwrap().to_string();
    let (status, detail) = broker
        .call(reqwest::Method::GET, &format!("/api/v1/nodes/{node}"), None)
        .await;
    assert_eq!(status, 200, "{detail}");
    assert_eq!(detail["pool"], GCE_POOL, "{detail}");
    assert_eq!(detail["gpus"][0]["model"], "A100-80GB", "{detail}");

    // The job runs there and succeeds.
    let done = wait(&broker, "the job to finish", 30, &dump, || async {
        let j = broker.job(&id).await;
        matches!(
            j["state"].as_str(),
            Some("succeeded" | "failed" | "cancelled")
        )
        .then_some(j)
    })
    .await;
    assert_eq!(done["state"], "succeeded", "{done}\n{}", dump());
    assert_eq!(done["placement"]["pool"], GCE_POOL, "{done}");
    assert_eq!(done["placement"]["node"], node.as_str(), "{done}");
    let (stdout, _, _) = broker.logs(&id).await;
    assert!(stdout.contains("burst-ok"), "{stdout}");

    // Idle past its TTL, the instance is terminated: the broker records it ended, and the
    // fake holds nothing (the delete operation ran and powered the sandbox off).
    let ended = wait(&broker, "the idle instance to end", 30, &dump, || async {
        instances(&broker)
            .await
            .into_iter()
            .find(|i| i["id"] == inst["id"] && i["state"] == "terminated")
    })
    .await;
    assert!(
        ended["end_reason"]
            .as_str()
            .unwrap_or("")
            .starts_with("idle"),
        "{ended}"
    );
    assert!(ended["cost_usd"].as_f64().unwrap() > 0.0, "{ended}");
    wait(
        &broker,
        "the fake to hold no instance",
        15,
        &String::new,
        || async { fake.live_instances().is_empty().then_some(()) },
    )
    .await;
    assert!(
        fake.invalid_requests().is_empty(),
        "{:?}",
        fake.invalid_requests()
    );
    let log = std::fs::read_to_string(broker.dir.path().join("broker.log")).unwrap();
    assert!(
        !log.contains(&token),
        "the enrolment token is in the broker's log"
    );
    eprintln!(
        "GCE burst cycle: launched, enrolled, ran, ended in {:.1} s; {} GCE requests; provider id \
         recorded by the broker: {}",
        started.elapsed().as_secs_f64(),
        fake.requests(),
        ended["provider_id"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gce_out_of_quota_fails_over_to_azure() {
    let started = Instant::now();
    let gce = gce::start(gce::Options {
        run_bootstrap: true,
        ..gce::Options::default()
    })
    .await;
    gce.inject(Fault::Quota);
    let az = azure::start(azure::FakeOptions {
        run_bootstrap: true,
        operation_delay: Duration::from_millis(50),
        ..azure::FakeOptions::default()
    })
    .await;
    let keys = tempfile::tempdir().unwrap();
    let agent = bin("switchyard-agent");
    let section = Section {
        cluster: "e2e-failover",
        agent: &agent,
        boot_time_s: 20,
    };
    let config = format!(
        "{BURST}{}{}",
        gcp_section(&gce, keys.path(), "us-central1-a", GCE_TYPE, &section),
        azure_section(&az, keys.path(), "eastus", AZURE_SIZE, &section)
    );
    let broker = Broker::start_with(&config).await;

    // GCE is the cheaper A100-80GB: the planner tries it first.
    let (_, pools) = broker
        .call(reqwest::Method::GET, "/api/v1/pools", None)
        .await;
    let price = |id: &str| {
        pools["pools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["id"] == id)
            .unwrap_or_else(|| panic!("no {id} in {pools}"))["price_per_gpu_hour"]
            .as_f64()
            .unwrap()
    };
    assert!(price(GCE_POOL) < price(AZURE_POOL), "{pools}");

    let id = broker.submit(job("failover")).await;

    // The GCE launch fails with the quota error; the job launches on Azure, whose agent
    // enrols, and it succeeds there.
    let AzureRun {
        inst: azure_inst,
        vm,
        token,
        done,
    } = runs_on_azure(&broker, &az, &id, AZURE_POOL, (45, 30), &|| {
        format!("{:?}", az.request_log())
    })
    .await;
    let dump = || agent_log(az.boot_root(&vm));
    assert_eq!(done["state"], "succeeded", "{done}\n{}", dump());
    assert_eq!(done["placement"]["pool"], AZURE_POOL, "{done}");

    // The instances list shows both attempts: GCE's failed one (the quota error, never
    // launched, no cost) and the Azure one.
    let all = instances(&broker).await;
    let gce_attempts: Vec<&Value> = all.iter().filter(|i| i["pool"] == GCE_POOL).collect();
    assert!(!gce_attempts.is_empty(), "no GCE attempt in {all:?}");
    for g in &gce_attempts {
        assert_eq!(g["state"], "terminated", "{g}");
        assert_eq!(g["for_job"], id.as_str(), "{g}");
        assert!(g["provider_id"].is_null(), "{g}");
        let error = g["last_error"].as_str().unwrap_or("");
        assert!(
            error.to_lowercase().contains("quota"),
            "the GCE attempt's error: {g}"
        );
        assert_eq!(g["cost_usd"].as_f64(), Some(0.0), "{g}");
    }
    assert!(
        gce.live_instances().is_empty(),
        "{:?}",
        gce.live_instances()
    );

    // Idle, the Azure VM is deleted with its NIC and disk: nothing leaks in either cloud.
    wait(&broker, "the Azure instance to end", 30, &dump, || async {
        instances(&broker)
            .await
            .into_iter()
            .find(|i| i["id"] == azure_inst["id"] && i["state"] == "terminated")
    })
    .await;
    wait(
        &broker,
        "the fake Azure to hold nothing",
        15,
        &String::new,
        || async { az.live_instances().is_empty().then_some(()) },
    )
    .await;
    // The ledger: the Azure instance's lifetime is charged to Azure; the refused GCE launch
    // cost nothing.
    let (status, spend) = broker
        .call(
            reqwest::Method::GET,
            "/api/v1/spend?group_by=provider",
            None,
        )
        .await;
    assert_eq!(status, 200, "{spend}");
    let by = |p: &str| {
        spend["rows"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["provider"] == p)
            .map(|r| r["amount_usd"].as_f64().unwrap())
            .sum::<f64>()
    };
    assert!(by("azure") > 0.0, "{spend}");
    assert_eq!(by("gcp"), 0.0, "{spend}");
    assert!(
        gce.invalid_requests().is_empty(),
        "{:?}",
        gce.invalid_requests()
    );
    assert!(
        az.invalid_requests().is_empty(),
        "{:?}",
        az.invalid_requests()
    );
    let log = std::fs::read_to_string(broker.dir.path().join("broker.log")).unwrap();
    assert!(
        !log.contains(&token),
        "the enrolment token is in the broker's log"
    );
    eprintln!(
        "cross-cloud failover: {} GCE attempt(s) refused for quota, Azure launched and ran the \
         job, both clouds empty after {:.1} s",
        gce_attempts.len(),
        started.elapsed().as_secs_f64()
    );
}

/// 8× A100-80GB in three clouds, priced (catalogue, on demand, per node-hour) so that the
/// planner orders them EC2 (27.45 in both regions) < GCE us-east5 (44.19) < Azure brazilsouth
/// (65.54): the failover has to walk the whole chain.
const AWS_TYPE: &str = "p4de.24xlarge";
const AWS_REGIONS: [&str; 2] = ["us-east-1", "us-west-2"];
const GCE_8_TYPE: &str = "a2-ultragpu-8g";
const GCE_8_ZONE: &str = "us-east5-a";
const GCE_8_POOL: &str = "gcp:us-east5/a2-ultragpu-8g";
const AZURE_8_SIZE: &str = "Standard_ND96amsr_A100_v4";
const AZURE_8_LOCATION: &str = "brazilsouth";
const AZURE_8_POOL: &str = "azure:brazilsouth/Standard_ND96amsr_A100_v4";
/// The job's deadline, from its submission: far less than `pool_backoff_s` (a pool that
/// answered capacity or quota is not retried before it), so waiting for EC2 or GCE to come back
/// would miss it; an estimated 60 s run plus a 20 s boot fits with room for the failovers.
const CHAIN_DEADLINE_S: u64 = 180;

fn timestamp(v: &Value) -> chrono::DateTime<chrono::Utc> {
    v.as_str()
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .unwrap_or_else(|| panic!("not a timestamp: {v}"))
        .with_timezone(&chrono::Utc)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_out_of_capacity_everywhere_fails_over_to_gce_then_azure() {
    let started = Instant::now();
    let ec2 = moto::start().await;
    ec2.inject(Fault::Capacity);
    let gce = gce::start(gce::Options {
        run_bootstrap: true,
        ..gce::Options::default()
    })
    .await;
    gce.inject(Fault::Quota);
    let az = azure::start(azure::FakeOptions {
        run_bootstrap: true,
        operation_delay: Duration::from_millis(50),
        ..azure::FakeOptions::default()
    })
    .await;
    let keys = tempfile::tempdir().unwrap();
    let agent = bin("switchyard-agent");
    let section = Section {
        cluster: "e2e-chain",
        agent: &agent,
        boot_time_s: 20,
    };
    let config = format!(
        "{BURST}{}{}{}",
        aws_section(&ec2, &AWS_REGIONS, AWS_TYPE, &section),
        gcp_section(&gce, keys.path(), GCE_8_ZONE, GCE_8_TYPE, &section),
        azure_section(&az, keys.path(), AZURE_8_LOCATION, AZURE_8_SIZE, &section)
    );
    let broker = Broker::start_with(&config).await;

    // EC2 is the cheapest 8× A100-80GB node in every configured region, GCE next, Azure last:
    // the planner tries EC2 first and Azure only when both others failed.
    let aws_pools: Vec<String> = AWS_REGIONS
        .iter()
        .map(|r| format!("aws:{r}/{AWS_TYPE}"))
        .collect();
    let (_, pools) = broker
        .call(reqwest::Method::GET, "/api/v1/pools", None)
        .await;
    let pool = |id: &str| {
        pools["pools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["id"] == id)
            .unwrap_or_else(|| panic!("no {id} in {pools}"))
            .clone()
    };
    let price = |id: &str| pool(id)["price_per_gpu_hour"].as_f64().unwrap();
    for id in aws_pools
        .iter()
        .map(String::as_str)
        .chain([GCE_8_POOL, AZURE_8_POOL])
    {
        assert_eq!(pool(id)["gpus_per_node"], 8, "{}", pool(id));
    }
    for aws in &aws_pools {
        assert!(price(aws) < price(GCE_8_POOL), "{pools}");
    }
    assert!(price(GCE_8_POOL) < price(AZURE_8_POOL), "{pools}");

    let mut spec = job("chain");
    spec["resources"]["gpus"] = json!(8);
    spec["deadline"] = json!(in_secs(CHAIN_DEADLINE_S));
    let id = broker.submit(spec).await;
    let deadline = timestamp(&broker.job(&id).await["spec"]["deadline"]);

    // EC2 refuses in both regions, GCE for quota; the job launches on Azure, whose agent
    // enrols.
    // The job runs on the Azure node and succeeds before its deadline.
    let AzureRun {
        inst: azure_inst,
        vm,
        token,
        done,
    } = runs_on_azure(&broker, &az, &id, AZURE_8_POOL, (60, 45), &|| {
        format!(
            "EC2 launches by region: {:?}\nAzure requests: {:?}",
            ec2.launch_regions(),
            az.request_log()
        )
    })
    .await;
    assert_eq!(azure_inst["provider"], "azure", "{azure_inst}");
    let dump = || agent_log(az.boot_root(&vm));
    assert_eq!(done["state"], "succeeded", "{done}\n{}", dump());
    assert_eq!(done["placement"]["pool"], AZURE_8_POOL, "{done}");
    assert_eq!(
        done["placement"]["node"], azure_inst["node"],
        "{done}\n{azure_inst}"
    );
    let finished = timestamp(&done["finished_at"]);
    assert!(
        finished <= deadline,
        "finished at {finished}, after its deadline {deadline}: {done}"
    );
    let (stdout, _, _) = broker.logs(&id).await;
    assert!(stdout.contains("burst-ok"), "{stdout}");

    // The instances list shows every attempt, in the planner's order: EC2 in each region
    // (refused for capacity), then GCE (refused for quota), all ended with their error, no
    // provider id and no cost; then the Azure instance that ran the job.
    let all = instances(&broker).await;
    let refused = |pool: &str, error: &str| -> Vec<Value> {
        let attempts: Vec<Value> = all.iter().filter(|i| i["pool"] == pool).cloned().collect();
        assert!(!attempts.is_empty(), "no {pool} attempt in {all:#?}");
        for a in &attempts {
            assert_eq!(a["state"], "terminated", "{a}");
            assert_eq!(a["for_job"], id.as_str(), "{a}");
            assert!(a["provider_id"].is_null(), "{a}");
            assert!(a["node"].is_null(), "{a}");
            let e = a["last_error"].as_str().unwrap_or("").to_lowercase();
            assert!(e.contains(error), "the {pool} attempt's error: {a}");
            assert_eq!(a["cost_usd"].as_f64(), Some(0.0), "{a}");
        }
        attempts
    };
    let aws_attempts: Vec<Value> = aws_pools
        .iter()
        .flat_map(|p| refused(p, "capacity"))
        .collect();
    for a in &aws_attempts {
        assert_eq!(a["provider"], "aws", "{a}");
    }
    let gce_attempts = refused(GCE_8_POOL, "quota");
    let last_requested = |v: &[Value]| v.iter().map(|i| timestamp(&i["requested_at"])).max();
    let first_requested = |v: &[Value]| v.iter().map(|i| timestamp(&i["requested_at"])).min();
    assert!(
        last_requested(&aws_attempts) <= first_requested(&gce_attempts),
        "EC2 was not tried before GCE: {all:#?}"
    );
    assert!(
        last_requested(&gce_attempts).unwrap() <= timestamp(&azure_inst["requested_at"]),
        "GCE was not tried before Azure: {all:#?}"
    );
    let azure_attempts: Vec<&Value> = all.iter().filter(|i| i["pool"] == AZURE_8_POOL).collect();
    assert_eq!(azure_attempts.len(), 1, "{all:#?}");
    assert!(
        all.iter().all(|i| i["for_job"] == id.as_str()),
        "an instance for something else: {all:#?}"
    );

    // The RunInstances calls really reached EC2's endpoint, from both regions, and moto holds
    // no machine: every launch was refused. GCE holds nothing either.
    let regions = ec2.launch_regions();
    for r in AWS_REGIONS {
        assert!(
            regions.iter().any(|x| x == r),
            "no RunInstances in {r}: {regions:?}"
        );
    }
    assert!(
        ec2.live_instances().is_empty(),
        "{:?}",
        ec2.live_instances()
    );
    assert!(
        gce.live_instances().is_empty(),
        "{:?}",
        gce.live_instances()
    );

    // Idle, the Azure VM is deleted with its NIC and disk.
    let ended = wait(&broker, "the Azure instance to end", 30, &dump, || async {
        instances(&broker)
            .await
            .into_iter()
            .find(|i| i["id"] == azure_inst["id"] && i["state"] == "terminated")
    })
    .await;
    let azure_cost = ended["cost_usd"].as_f64().unwrap();
    assert!(azure_cost > 0.0, "{ended}");
    wait(
        &broker,
        "the fake Azure to hold nothing",
        15,
        &String::new,
        || async { az.live_instances().is_empty().then_some(()) },
    )
    .await;

    // The ledger: Azure's instance (and the job on it) is all that was charged; the refused
    // launches on EC2 and GCE cost nothing, by provider and by pool.
    let spend = |group: &'static str| {
        let broker = &broker;
        async move {
            let (status, spend) = broker
                .call(
                    reqwest::Method::GET,
                    &format!("/api/v1/spend?group_by={group}"),
                    None,
                )
                .await;
            assert_eq!(status, 200, "{spend}");
            spend
        }
    };
    let sum = |spend: &Value, group: &str, key: &str| {
        spend["rows"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r[group] == key)
            .map(|r| r["amount_usd"].as_f64().unwrap())
            .sum::<f64>()
    };
    let by_provider = spend("provider").await;
    assert!(
        sum(&by_provider, "provider", "azure") > 0.0,
        "{by_provider}"
    );
    assert_eq!(sum(&by_provider, "provider", "aws"), 0.0, "{by_provider}");
    assert_eq!(sum(&by_provider, "provider", "gcp"), 0.0, "{by_provider}");
    let by_pool = spend("pool").await;
    for row in by_pool["rows"].as_array().unwrap() {
        assert!(
            row["pool"] == AZURE_8_POOL || row["amount_usd"].as_f64() == Some(0.0),
            "a charge outside the Azure pool: {by_pool}"
        );
    }
    assert!(sum(&by_pool, "pool", AZURE_8_POOL) > 0.0, "{by_pool}");

    assert!(
        gce.invalid_requests().is_empty(),
        "{:?}",
        gce.invalid_requests()
    );
    assert!(
        az.invalid_requests().is_empty(),
        "{:?}",
        az.invalid_requests()
    );
    let log = std::fs::read_to_string(broker.dir.path().join("broker.log")).unwrap();
    assert!(
        !log.contains(&token),
        "the enrolment token is in the broker's log"
    );
    eprintln!(
        "failover chain: {} EC2 attempt(s) refused for capacity ({:?}), {} GCE attempt(s) \
         refused for quota, Azure ran the job ({:.1} s before its deadline, instance ${:.4}); \
         every cloud empty after {:.1} s",
        aws_attempts.len(),
        regions,
        gce_attempts.len(),
        (deadline - finished).num_milliseconds() as f64 / 1000.0,
        azure_cost,
        started.elapsed().as_secs_f64()
    );
}

/// A launch whose answer arrives after the instance's agent enrolled (Azure answers a VM
/// creation when its long-running operation is done, while cloud-init — and so the agent —
/// runs before that) must still record the provider's id: without it the broker cannot tell
/// that the VM vanished (the reaper skips instances without one) and `GET /instances` shows
/// none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_launch_answer_that_arrives_after_the_agent_enrolled_is_recorded() {
    let az = azure::start(azure::FakeOptions {
        run_bootstrap: true,
        operation_delay: Duration::from_millis(50),
        // The VM's agent enrols at once; the creation's operation is done 3 s later.
        vm_create_delay: Duration::from_secs(3),
        ..azure::FakeOptions::default()
    })
    .await;
    let keys = tempfile::tempdir().unwrap();
    let agent = bin("switchyard-agent");
    let section = Section {
        cluster: "e2e-late-answer",
        agent: &agent,
        boot_time_s: 20,
    };
    let config = format!(
        "{BURST}{}",
        azure_section(&az, keys.path(), "eastus", AZURE_SIZE, &section)
    );
    let broker = Broker::start_with(&config).await;
    // Busy long enough that the instance is not idle when the launch answer comes.
    let mut spec = job("late-answer");
    spec["command"] = json!(["sh", "-c", "sleep 8; echo burst-ok"]);
    let id = broker.submit(spec).await;

    let inst = wait(
        &broker,
        "the VM's agent to enrol",
        30,
        &String::new,
        || async {
            instances(&broker)
                .await
                .into_iter()
                .find(|i| i["for_job"] == id.as_str() && i["state"] == "ready")
        },
    )
    .await;
    let vms: Vec<String> = az
        .live_instances()
        .into_iter()
        .filter(|r| !r.contains(':'))
        .collect();
    assert_eq!(vms.len(), 1, "{vms:?}");
    let vm = vms[0].clone();
    let log_path = broker.dir.path().join("broker.log");
    wait(
        &broker,
        "the launch to answer",
        20,
        &String::new,
        || async {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            log.lines()
                .any(|l| {
                    l.contains("instance launched") && l.contains(inst["id"].as_str().unwrap())
                })
                .then_some(())
        },
    )
    .await;
    let recorded = eventually_quiet(Duration::from_secs(3), || async {
        instances(&broker)
            .await
            .into_iter()
            .find(|i| i["id"] == inst["id"] && i["provider_id"] == vm.as_str())
    })
    .await;
    let now: Vec<Value> = instances(&broker).await;
    assert!(
        recorded.is_some(),
        "the launch answered {vm} after the agent enrolled, but the broker never recorded it \
         (broker/src/store/sql/instances.rs, instance_launched: `WHERE state = 'requested'`): \
         {now:#?}"
    );
    let done = broker
        .wait_state(&id, &["succeeded", "failed"], Duration::from_secs(30))
        .await;
    assert_eq!(done["state"], "succeeded", "{done}");
}

/// A cloud section that cannot work stops `switchyard serve` at once, naming the section and
/// the setting; nothing is served.
#[test]
fn a_cloud_section_that_cannot_work_stops_the_start_naming_the_setting() {
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.json");
    std::fs::write(&junk, "this is not a service-account key").unwrap();
    let key = dir.path().join("lambda-key");
    std::fs::write(&key, "secret_abc123\n").unwrap();
    let agent = r#"agent = { install_command = "true" }"#;
    let cases = [
        (
            format!(
                "[gcp]\nproject = \"p\"\nzones = [\"us-central1-a\"]\ncluster = \"c\"\n\
                 image = \"projects/x/global/images/y\"\ncredentials_file = {:?}\n{agent}\n",
                junk.display()
            ),
            "[gcp]",
            "credentials",
        ),
        (
            format!(
                "[lambda]\ncluster = \"c\"\napi_key_file = {:?}\nregions = [\"atlantis-1\"]\n\
                 ssh_key_name = \"k\"\n{agent}\n",
                key.display()
            ),
            "[lambda]",
            "atlantis-1",
        ),
        (
            "[azure]\ntenant_id = \"t\"\n".to_string(),
            "azure",
            "missing field",
        ),
    ];
    for (i, (section, names, field)) in cases.iter().enumerate() {
        let config = dir.path().join(format!("switchyard-{i}.toml"));
        std::fs::write(&config, section).unwrap();
        let out = std::process::Command::new(bin("switchyard"))
            .arg("serve")
            .arg("--config")
            .arg(&config)
            .arg("--data-dir")
            .arg(dir.path().join(format!("data-{i}")))
            .arg("--listen")
            .arg("127.0.0.1:0")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{section}: started anyway: {stderr}");
        assert!(
            stderr.contains(names) && stderr.contains(field),
            "{section}: the error should name {names} and {field}: {stderr}"
        );
    }
}

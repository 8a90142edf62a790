//! `/metrics`: the Prometheus exposition reads queue depth, instances and nodes from the
//! database and each GPU's readings from the agents' last heartbeats, under dcgm-exporter's
//! names; the scheduler's histograms count real rounds. Only operator roles may scrape.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use reqwest::{Method, StatusCode};
use serde_json::json;
use std::collections::HashMap;
use std::time::Duration;

/// Scrapes `/metrics` and returns `series → value` (series is `name{labels}` as printed).
async fn scrape(app: &TestApp, token: &str) -> HashMap<String, f64> {
    let r = app
        .http
        .get(format!("{}/metrics", app.url))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let ct = r.headers()["content-type"].to_str().unwrap().to_string();
    assert!(ct.starts_with("application/openmetrics-text"), "{ct}");
    let text = r.text().await.unwrap();
    assert!(text.ends_with("# EOF\n"), "{text}");
    let mut out = HashMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        // Bucket bounds read as written, with no float noise (`le="0.000030000000000000005"`).
        if let Some(le) = line.split("le=\"").nth(1).and_then(|r| r.split('"').next()) {
            assert!(
                le == "+Inf" || le.len() <= 10,
                "noisy bucket bound in {line:?}"
            );
        }
        // Every sample is `series value`, the value a number.
        let (series, value) = line.rsplit_once(' ').unwrap();
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad sample {line:?}"));
        out.insert(series.to_string(), value);
    }
    out
}

fn find(m: &HashMap<String, f64>, name: &str, labels: &[&str]) -> Option<f64> {
    m.iter()
        .find(|(k, _)| k.split('{').next() == Some(name) && labels.iter().all(|l| k.contains(l)))
        .map(|(_, v)| *v)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_show_the_queue_the_gpus_and_the_scheduler() {
    let app = TestApp::spawn_manual().await;
    let dev = app.token("developer", Some("ml")).await;
    let infra = app.token("infra", None).await;

    // Only operator roles scrape.
    let r = app.call(Method::GET, "/metrics", Some(&dev), None).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    let r = app.call(Method::GET, "/metrics", None, None).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);

    // An agent whose heartbeat carries NVML readings for its two GPUs.
    let agent = app.agent(2).await;
    let gpus: Vec<_> = (0..2)
        .map(|i| {
            json!({"index": i, "uuid": format!("GPU-real-{i}"), "model": "H100",
                   "memory_mb": 81920, "memory_used_mb": 1024 * (i + 1),
                   "utilization_pct": 40 + i, "temperature_c": 60 + i, "power_w": 301.5,
                   "sm_clock_mhz": 1980, "profiling": {"sm_active_pct": 25.0 * f64::from(i + 1)},
                   "health": {"ecc_uncorrected_volatile": 0}})
        })
        .collect();
    heartbeat_with(&app, &agent, gpus).await;

    // Two jobs placed on the node, one too big for it waiting.
    app.submit(&dev, job_spec("ml")).await;
    let mut big = job_spec("ml");
    big["resources"]["gpus"] = json!(4);
    big["priority"] = json!("high");
    let placed = app.submit(&dev, job_spec("ml")).await;
    assert_eq!(placed.status, StatusCode::CREATED);
    app.submit(&dev, big).await;

    // Two placed, and every job planned at least once: the two may be placed in a round
    // before the one that first sees the big job.
    let m = eventually("the scheduler to have planned", 10, async || {
        let m = scrape(&app, &infra).await;
        (find(&m, "switchyard_jobs", &["state=\"placed\""]) == Some(2.0)
            && find(&m, "switchyard_plan_queued_jobs_sum", &[]).unwrap_or(0.0) >= 3.0)
            .then_some(m)
    })
    .await;
    assert_eq!(
        find(&m, "switchyard_jobs", &["priority=\"high\""]),
        Some(1.0),
        "{m:#?}"
    );
    assert_eq!(find(&m, "switchyard_jobs_submitted_total", &[]), Some(3.0));
    assert!(find(&m, "switchyard_placement_seconds_count", &[]).unwrap() >= 1.0);
    assert!(find(&m, "switchyard_plan_queued_jobs_sum", &[]).unwrap() >= 3.0);
    assert_eq!(
        find(&m, "switchyard_nodes", &["health=\"healthy\"", POOL]),
        Some(1.0)
    );
    assert_eq!(
        find(
            &m,
            "DCGM_FI_DEV_GPU_UTIL",
            &["gpu=\"1\"", "UUID=\"GPU-real-1\"", "device=\"nvidia1\""]
        ),
        Some(41.0)
    );
    assert_eq!(
        find(
            &m,
            "DCGM_FI_DEV_FB_USED",
            &["gpu=\"1\"", "modelName=\"H100\""]
        ),
        Some(2048.0)
    );
    assert_eq!(
        find(
            &m,
            "DCGM_FI_DEV_GPU_TEMP",
            &["gpu=\"0\"", "Hostname=\"test-host\""]
        ),
        Some(60.0)
    );
    // Issue 28: the SM clock, the last XID (0: none), double-bit ECC errors, profiling as a
    // 0-1 ratio only where measured, and the health rules' verdict.
    assert_eq!(
        find(&m, "DCGM_FI_DEV_SM_CLOCK", &["gpu=\"0\""]),
        Some(1980.0)
    );
    assert_eq!(
        find(
            &m,
            "DCGM_FI_PROF_SM_ACTIVE",
            &["gpu=\"1\"", "UUID=\"GPU-real-1\""]
        ),
        Some(0.5)
    );
    assert_eq!(find(&m, "DCGM_FI_PROF_DRAM_ACTIVE", &[]), None);
    assert_eq!(
        find(&m, "DCGM_FI_DEV_XID_ERRORS", &["gpu=\"0\""]),
        Some(0.0)
    );
    assert_eq!(
        find(&m, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", &["gpu=\"1\""]),
        Some(0.0)
    );
    assert_eq!(
        find(
            &m,
            "switchyard_gpu_healthy",
            &["gpu=\"1\"", "UUID=\"GPU-real-1\""]
        ),
        Some(1.0)
    );
    assert_eq!(
        find(&m, "DCGM_FI_DEV_POWER_USAGE", &["gpu=\"0\""]),
        Some(301.5)
    );

    // A lost node: counted as lost, its stale GPU readings gone, the expiry counted.
    app.advance(Duration::from_secs(6));
    // One scrape is not a snapshot: it reads the store before it encodes the in-process
    // counters, so a scrape racing the expiry may count it and still see the node healthy.
    let m = eventually("the lease to expire", 10, async || {
        let m = scrape(&app, &infra).await;
        (find(&m, "switchyard_lease_expiries_total", &[]) == Some(1.0)
            && find(&m, "switchyard_nodes", &["health=\"lost\""]) == Some(1.0))
        .then_some(m)
    })
    .await;
    assert_eq!(find(&m, "DCGM_FI_DEV_GPU_UTIL", &[]), None);
    // The only replica leads, under the first epoch.
    assert_eq!(find(&m, "switchyard_leader", &[]), Some(1.0));
    assert_eq!(find(&m, "switchyard_leader_epoch", &[]), Some(1.0));
}

/// A heartbeat from `agent` whose inventory reports `gpus` (NVML-style readings).
async fn heartbeat_with(app: &TestApp, agent: &TestAgent, gpus: Vec<serde_json::Value>) {
    let hb = app
        .call(
            Method::POST,
            "/agent/v1/heartbeat",
            Some(&agent.token),
            Some(
                json!({"inventory": {"gpus": gpus, "cpus": 8, "memory_mb": 65536,
                                      "simulated": false}, "running": []}),
            ),
        )
        .await;
    assert_eq!(hb.status, StatusCode::OK, "{}", hb.body);
}

async fn start(app: &TestApp, agent: &TestAgent, job: &str) -> serde_json::Value {
    start_leased(app, agent, job, 2).await
}

fn id_of(r: &Response) -> String {
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    r.body["id"].as_str().unwrap().to_string()
}

fn close(got: Option<f64>, want: f64) -> bool {
    got.is_some_and(|g| (g - want).abs() < 1e-6)
}

/// A job of `team` on `gpus` H100s, estimated at an hour.
fn hour_job(team: &str, gpus: u32) -> serde_json::Value {
    json!({"name": "h", "team": team, "command": ["true"],
           "resources": {"gpus": gpus, "gpu_models": ["H100"]}, "estimated_runtime_s": 3600})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spend_rates_budgets_and_queue_waits_follow_the_work() {
    // No accrual pass on the interval while the test runs, and the one the clock's move wakes
    // finds d not yet started: what live work has accrued stays 0, so what it has reserved is
    // exactly its estimate.
    let app = TestApp::spawn_with_clock(
        manual_clock(),
        |c| {
            c.ledger_accrual_interval_ms = 3_600_000;
            c.lease_ttl_s = 600;
        },
        |_| switchyard_broker::app::ProviderSet::default(),
    )
    .await;
    let agent = app.agent(4).await;
    let infra = app.token("infra", None).await;
    let finance = app.token("finance", None).await;
    let ml = app.token("developer", Some("ml")).await;
    let cv = app.token("developer", Some("cv")).await;
    // ml: $100 a month; cv: no budget, its own H100 rate ($1.50 instead of the pool's $2).
    for (team, body) in [
        (
            "ml",
            json!({"budget": {"amount_usd": 100.0, "period": "month", "enforcement": "hard",
                               "alert_at": [0.9]}}),
        ),
        ("cv", json!({"onprem_rates": {"H100": 1.5}})),
    ] {
        let r = app
            .call(
                Method::PUT,
                &format!("/api/v1/policies/{team}"),
                Some(&finance),
                Some(body),
            )
            .await;
        assert!(r.status.is_success(), "{}", r.body);
    }
    let m = scrape(&app, &infra).await;
    assert!(
        close(
            find(
                &m,
                "switchyard_budget_remaining_usd",
                &["team=\"ml\"", "project=\"\""]
            ),
            100.0
        ),
        "{m:#?}"
    );
    assert_eq!(
        find(&m, "switchyard_budget_remaining_usd", &["team=\"cv\""]),
        None
    );
    assert_eq!(find(&m, "switchyard_spend_rate_usd_per_hour", &[]), None);
    assert_eq!(
        find(&m, "switchyard_job_queue_wait_seconds_count", &[]),
        Some(0.0)
    );

    // a (ml, 3 GPUs) runs; c (cv, 2 GPUs) waits for it.
    let a = id_of(&app.submit(&ml, hour_job("ml", 3)).await);
    let a_attempt = start(&app, &agent, &a).await;
    let c = id_of(&app.submit(&cv, hour_job("cv", 2)).await);
    let m = scrape(&app, &infra).await;
    assert!(
        close(
            find(&m, "switchyard_spend_rate_usd_per_hour", &["team=\"ml\""]),
            3.0 * 2.0
        ),
        "{m:#?}"
    );
    let waited = Duration::from_millis(1500);
    app.advance(waited);
    let r = events(
        &app,
        &agent,
        json!([{"type": "finished", "attempt": a_attempt, "exit_code": 0,
                "signal": null, "error": null, "stopped": false}]),
    )
    .await;
    assert_eq!(r, ["accepted"]);
    start(&app, &agent, &c).await;
    // d (ml, 2 GPUs) is placed at once.
    let d = id_of(&app.submit(&ml, hour_job("ml", 2)).await);
    start(&app, &agent, &d).await;

    let m = scrape(&app, &infra).await;
    // Running now: d, 2 GPUs at the pool's $2; c, 2 GPUs at cv's own $1.50.
    assert!(
        close(
            find(&m, "switchyard_spend_rate_usd_per_hour", &["team=\"ml\""]),
            2.0 * 2.0
        ),
        "{m:#?}"
    );
    assert!(
        close(
            find(&m, "switchyard_spend_rate_usd_per_hour", &["team=\"cv\""]),
            2.0 * 1.5
        ),
        "{m:#?}"
    );
    // ml's budget: less what a cost (settled in the ledger when it finished) and what d
    // reserved (its predicted p50 — its 1 h estimate calibrated by what a used of its own —
    // × 2 GPUs × $2, nothing accrued yet).
    let view = app.job(&ml, &d).await;
    let p50_h = view.body["runtime_prediction"]["p50_s"]
        .as_f64()
        .expect("d's prediction")
        / 3600.0;
    assert!(p50_h < 1.0, "calibrated below the 1 h asked: {}", view.body);
    let spent: i64 = app
        .app
        .store
        .ledger_entries(None)
        .await
        .unwrap()
        .iter()
        .filter(|e| e.team.as_deref() == Some("ml"))
        .map(|e| e.amount.micros())
        .sum();
    assert!(spent > 0, "a's run is in the ledger");
    let want = 100.0 - spent as f64 / 1e6 - 2.0 * 2.0 * p50_h;
    assert!(
        close(
            find(&m, "switchyard_budget_remaining_usd", &["team=\"ml\""]),
            want
        ),
        "want {want}: {m:#?}"
    );
    // Three first placements: a and d at once, c exactly as long as a ran.
    assert_eq!(
        find(&m, "switchyard_job_queue_wait_seconds_count", &[]),
        Some(3.0)
    );
    let sum = find(&m, "switchyard_job_queue_wait_seconds_sum", &[]).unwrap();
    assert!(close(Some(sum), waited.as_secs_f64()), "sum {sum}");
    // The widest bucket under c's wait holds a and d only.
    let (le, under) = m
        .iter()
        .filter_map(|(k, v)| {
            let le: f64 = k
                .strip_prefix("switchyard_job_queue_wait_seconds_bucket{le=\"")?
                .strip_suffix("\"}")?
                .parse()
                .ok()?;
            (le < waited.as_secs_f64()).then_some((le, *v))
        })
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .unwrap();
    assert_eq!(under, 2.0, "le {le}: {m:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_by_state_and_provider_and_their_spend() {
    let (app, fake) = spawn_two_clouds(|c| c.ledger_accrual_interval_ms = 3_600_000).await;
    fake.script(
        &switchyard_core::PoolId(CHEAP.into()),
        [switchyard_providers::fake::FakeOutcome::Capacity],
    );
    let infra = app.token("infra", None).await;
    let dev = app.token("developer", Some("ml")).await;
    let id = id_of(&app.submit(&dev, urgent("burst")).await);
    let launched = eventually("a launch in the dearer region", 20, async || {
        fake.launches()
            .into_iter()
            .find(|l| l.pool.as_str() == DEAR)
    })
    .await;

    // What the API lists, counted by state and provider (ended instances left out).
    let by_state = |all: &[serde_json::Value]| {
        let mut counts: std::collections::BTreeMap<(String, String), f64> = Default::default();
        for i in all.iter().filter(|i| i["state"] != "terminated") {
            let key = (
                i["state"].as_str().unwrap().to_string(),
                i["provider"].as_str().unwrap().to_string(),
            );
            *counts.entry(key).or_default() += 1.0;
        }
        counts
    };
    let scraped = |m: &HashMap<String, f64>| {
        let mut counts: std::collections::BTreeMap<(String, String), f64> = Default::default();
        for (k, v) in m
            .iter()
            .filter(|(k, _)| k.starts_with("switchyard_instances{"))
        {
            let label = |name: &str| {
                let from = k.find(&format!("{name}=\"")).unwrap() + name.len() + 2;
                k[from..from + k[from..].find('"').unwrap()].to_string()
            };
            counts.insert((label("state"), label("provider")), *v);
        }
        counts
    };
    let all = eventually("the launch to be recorded", 10, async || {
        let all = instances(&app).await;
        all.iter()
            .any(|i| i["pool"] == DEAR && i["state"] == "booting")
            .then_some(all)
    })
    .await;
    assert!(all.iter().any(|i| i["state"] == "terminated"), "{all:?}");
    // The one live instance is in `state`, the scrape counts what the API lists, and it is
    // billed to the job's team from its launch: 8 GPUs at $5 an hour, once.
    let live_one = async |all: &[serde_json::Value], state: &str| {
        let want = by_state(all);
        assert_eq!(
            want,
            [((state.to_string(), "fake".to_string()), 1.0)].into(),
            "{all:?}"
        );
        let m = scrape(&app, &infra).await;
        assert_eq!(scraped(&m), want, "{m:#?}");
        assert!(
            close(
                find(&m, "switchyard_spend_rate_usd_per_hour", &["team=\"ml\""]),
                8.0 * 5.0
            ),
            "{m:#?}"
        );
    };
    live_one(&all, "booting").await;

    // Its agent enrols, the job runs on it: ready, and its price is counted once, not again
    // for the attempt.
    let agent = app.agent_with_token(&launched.enrolment_token, 8).await;
    start(&app, &agent, &id).await;
    live_one(&instances(&app).await, "ready").await;
}

/// `GET /nodes/{id}`: a node's GPUs as of its last heartbeat, the attempts running on it (a
/// developer sees another team's job without its name), and the telemetry its heartbeats
/// carried, one sample per 10 s at most.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_page_shows_its_gpus_its_work_and_their_telemetry() {
    let app = TestApp::spawn().await;
    let ml = app.token("developer", Some("ml")).await;
    let web = app.token("developer", Some("web")).await;
    let agent = app.agent(2).await;
    let beat = async |util: u32| {
        let gpus: Vec<_> = (0..2)
            .map(|i| {
                json!({"index": i, "uuid": format!("GPU-{i}"), "model": "H100",
                       "memory_mb": 81920, "memory_used_mb": 2048,
                       "utilization_pct": util + i, "temperature_c": 55, "power_w": 250.0})
            })
            .collect();
        heartbeat_with(&app, &agent, gpus).await;
    };
    beat(30).await;
    // Within 10 s of the first: not a second sample.
    beat(90).await;
    let job = id_of(&app.submit(&ml, hour_job("ml", 1)).await);
    start(&app, &agent, &job).await;

    let path = format!("/api/v1/nodes/{}", agent.node);
    let mine = app.call(Method::GET, &path, Some(&ml), None).await;
    assert_eq!(mine.status, StatusCode::OK, "{}", mine.body);
    let n = &mine.body;
    assert_eq!(n["id"], agent.node.as_str());
    assert_eq!(n["gpus"].as_array().unwrap().len(), 2, "{n}");
    // The last heartbeat's readings.
    assert_eq!(n["gpus"][1]["utilization_pct"], 91, "{n}");
    assert_eq!(n["gpus"][0]["memory_total_mb"], 81920, "{n}");
    let history = n["history"].as_array().unwrap();
    assert_eq!(history.len(), 1, "{n}");
    assert_eq!(history[0]["gpus"][0]["utilization_pct"], 30, "{n}");
    assert_eq!(n["running"][0]["job_id"], job.as_str(), "{n}");
    assert_eq!(n["running"][0]["name"], "h", "{n}");
    assert_eq!(n["running"][0]["gpus"].as_array().unwrap().len(), 1, "{n}");
    // Another team's developer sees the work, not its name.
    let theirs = app.call(Method::GET, &path, Some(&web), None).await;
    assert!(
        theirs.body["running"][0]["name"].is_null(),
        "{}",
        theirs.body
    );
    assert_eq!(theirs.body["running"][0]["team"], "ml");
    let none = app
        .call(Method::GET, "/api/v1/nodes/no-such-node", Some(&ml), None)
        .await;
    assert_eq!(none.status, StatusCode::NOT_FOUND);
}

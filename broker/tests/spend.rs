//! The ledger, the spend API and budgets: accrual of running work on-prem and in the cloud, spend
//! reports that always equal the ledger (every grouping and bucket, JSON and CSV), developers
//! scoped to their team, a hard budget that 100 concurrent submissions cannot overspend, held
//! jobs released when the budget is raised, and accrual that settles exactly at the end and
//! never counts twice across a restart.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::time::Duration;
use switchyard_broker::app::{App, ProviderSet};
use switchyard_broker::clock::{Clock, from_datetime};
use switchyard_broker::control::ledger::accrue_once;
use switchyard_broker::store::LedgerEntry;
use switchyard_core::{Money, Timestamp};

const CLOUD: &str = "aws:test-east/gpu8";

async fn start(app: &TestApp, agent: &TestAgent, job: &str) -> Value {
    start_leased(app, agent, job, 5).await
}

async fn finish(app: &TestApp, agent: &TestAgent, attempt: &Value) {
    let r = events(
        app,
        agent,
        json!([{"type": "finished", "attempt": attempt, "exit_code": 0,
        "signal": null, "error": null, "stopped": false}]),
    )
    .await;
    assert_eq!(r, ["accepted"]);
}

fn id_of(r: &Response) -> String {
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    r.body["id"].as_str().unwrap().to_string()
}

fn micros(usd: &Value) -> i64 {
    (usd.as_f64().unwrap() * 1e6).round() as i64
}

fn time_of(v: &Value) -> Timestamp {
    let t: chrono::DateTime<chrono::Utc> = v.as_str().unwrap().parse().unwrap();
    Timestamp(t.timestamp_millis())
}

async fn spend(app: &TestApp, token: &str, query: &str) -> Value {
    let r = app
        .call(
            Method::GET,
            &format!("/api/v1/spend?{query}"),
            Some(token),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{query}: {}", r.body);
    r.body
}

async fn spend_csv(app: &TestApp, token: &str, query: &str) -> String {
    let res = app
        .http
        .get(format!("{}/api/v1/spend?{query}", app.url))
        .bearer_auth(token)
        .header("accept", "text/csv")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert!(
        res.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/csv")
    );
    res.text().await.unwrap()
}

/// The key of an entry under a grouping, as the API names it.
fn key_of(e: &LedgerEntry, group: &str) -> Option<String> {
    match group {
        "team" => e.team.clone(),
        "project" => e.project.clone(),
        "region" => Some(e.region.clone()),
        "provider" => Some(e.provider.clone()),
        "pool" => Some(e.pool.clone()),
        _ => unreachable!(),
    }
}

fn bucket_of(e: &LedgerEntry, bucket: &str) -> Option<String> {
    let size = match bucket {
        "hour" => 3_600_000,
        "day" => 86_400_000,
        _ => return None,
    };
    let start = e.period_start.millis() / size * size;
    Some(switchyard_broker::clock::to_datetime(Timestamp(start)).to_rfc3339())
}

/// (bucket, key) → (chargeback, cash) in micro-dollars.
type Grouped = BTreeMap<(Option<String>, Option<String>), (i64, i64)>;

/// The ledger grouped by hand.
fn expected(entries: &[LedgerEntry], group: &str, bucket: &str) -> Grouped {
    let mut out = Grouped::new();
    for e in entries {
        let sums = out
            .entry((bucket_of(e, bucket), key_of(e, group)))
            .or_default();
        sums.0 += e.amount.micros();
        sums.1 += e.cash.micros();
    }
    out
}

fn normalise_time(s: &str) -> String {
    let t: chrono::DateTime<chrono::Utc> = s.parse().unwrap();
    t.to_rfc3339()
}

/// Spend as the API reports it, in the same shape as [`expected`].
fn reported(body: &Value, group: &str) -> Grouped {
    assert_eq!(body["group_by"], group);
    body["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let key = r[group].as_str().map(str::to_string);
            let bucket = r["bucket_start"].as_str().map(normalise_time);
            (
                (bucket, key),
                (micros(&r["amount_usd"]), micros(&r["cash_usd"])),
            )
        })
        .collect()
}

/// The same from the CSV, parsed with the csv crate; checks its header.
fn reported_csv(text: &str, group: &str, bucketed: bool) -> Grouped {
    let mut reader = csv::Reader::from_reader(text.as_bytes());
    let header: Vec<String> = reader
        .headers()
        .unwrap()
        .iter()
        .map(str::to_string)
        .collect();
    let mut want = vec![group.to_string()];
    if bucketed {
        want.push("bucket_start".into());
    }
    want.push("amount_usd".into());
    want.push("cash_usd".into());
    assert_eq!(header, want);
    reader
        .records()
        .map(|r| {
            let r = r.unwrap();
            let key = Some(r[0].to_string()).filter(|k| !k.is_empty());
            let (bucket, amount, cash) = if bucketed {
                (Some(normalise_time(&r[1])), &r[2], &r[3])
            } else {
                (None, &r[1], &r[2])
            };
            let usd = |cell: &str| (cell.parse::<f64>().unwrap() * 1e6).round() as i64;
            ((bucket, key), (usd(amount), usd(cash)))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ledger_totals_equal_the_spend_api_for_every_grouping_and_bucket() {
    let (app, fake) = spawn_with_fake_on(manual_clock(), |c| {
        c.ledger_accrual_interval_ms = 100;
        c.idle_ttl_s = 1;
        c.min_billed_s = 0;
        c.regions.push(cloud_region("aws:test-east"));
        c.pools.push(cloud_pool(CLOUD, "aws:test-east", 4.0));
    })
    .await;
    let finance = app.token("finance", None).await;
    let ml = app.token("developer", Some("ml")).await;
    let web = app.token("developer", Some("web")).await;
    let onprem = app.agent(4).await;

    // Two teams on-prem, one ml job in the cloud (it may only run there, and soon).
    let cv = id_of(
        &app.submit(
            &ml,
            json!({"name": "cv", "team": "ml", "project": "vision",
            "command": ["true"], "resources": {"gpus": 2}, "estimated_runtime_s": 600}),
        )
        .await,
    );
    let site = id_of(
        &app.submit(
            &web,
            json!({"name": "site", "team": "web", "command": ["true"],
            "resources": {"gpus": 1}, "estimated_runtime_s": 600}),
        )
        .await,
    );
    let deadline =
        switchyard_broker::clock::to_datetime(app.app.clock.now().plus_secs(3600)).to_rfc3339();
    let burst = id_of(
        &app.submit(
            &ml,
            json!({"name": "burst", "team": "ml", "project": "llm",
            "command": ["true"], "resources": {"gpus": 2, "gpu_models": ["H100"]},
            "regions": ["aws:test-east"], "estimated_runtime_s": 600, "deadline": deadline,
            "spot": "never"}),
        )
        .await,
    );
    let cv_attempt = start(&app, &onprem, &cv).await;
    let site_attempt = start(&app, &onprem, &site).await;
    let launched = eventually("a cloud launch", 20, async || {
        fake.launches().into_iter().next()
    })
    .await;
    let cloud = app.agent_with_token(&launched.enrolment_token, 8).await;
    let burst_attempt = start(&app, &cloud, &burst).await;

    // Running work shows spend to date, per job and in the report.
    app.advance(Duration::from_secs(1));
    for (job, token) in [(&cv, &ml), (&site, &web), (&burst, &ml)] {
        eventually("spend to date on a running job", 20, async || {
            let j = app.job(token, job).await.body;
            (j["state"] == "running" && j["cost_usd"].as_f64().unwrap() > 0.0).then_some(())
        })
        .await;
    }
    let running = spend(&app, &finance, "group_by=team").await;
    assert!(running["total_usd"].as_f64().unwrap() > 0.0, "{running}");

    app.advance(Duration::from_millis(1200));
    finish(&app, &onprem, &cv_attempt).await;
    finish(&app, &onprem, &site_attempt).await;
    finish(&app, &cloud, &burst_attempt).await;
    // Once the burst controller has seen the instance idle, its idle TTL (1 s) passes.
    seen_idle(&app).await;
    app.advance(Duration::from_secs(2));
    eventually("the idle instance to end", 20, async || {
        let all = instances(&app).await;
        all.iter().all(|i| i["state"] == "terminated").then_some(())
    })
    .await;
    // Everything ended and is settled: the ledger no longer moves.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let entries = app.app.store.ledger_entries(None).await.unwrap();
    let total = app.app.store.ledger_total().await.unwrap();
    assert_eq!(
        entries.iter().map(|e| e.amount.micros()).sum::<i64>(),
        total
    );
    for kind in ["attempt", "instance"] {
        assert!(
            entries.iter().any(|e| e.kind == kind),
            "{kind}: {entries:?}"
        );
    }
    let instance = instances(&app)
        .await
        .into_iter()
        .find(|i| i["pool"] == CLOUD)
        .unwrap();
    let instance_total: i64 = entries
        .iter()
        .filter(|e| e.instance.as_deref() == instance["id"].as_str())
        .map(|e| e.amount.micros())
        .sum();
    assert_eq!(micros(&instance["cost_usd"]), instance_total);
    // Cash beside chargeback: a cloud instance's time is cash as billed; an on-prem attempt
    // costs its pool's default marginal cost, a fifth of the internal rate (rounded up).
    for e in &entries {
        if e.kind == "attempt" {
            // (Each entry is a difference of costs rounded up: a micro-dollar either way.)
            assert!(
                (e.cash.micros() * 5 - e.amount.micros()).abs() <= 10,
                "{e:?}"
            );
        } else {
            assert_eq!(e.cash, e.amount, "{e:?}");
        }
    }
    let total_cash: i64 = entries.iter().map(|e| e.cash.micros()).sum();

    for group in ["team", "project", "region", "provider", "pool"] {
        for bucket in ["", "hour", "day"] {
            let query = format!("group_by={group}&bucket={bucket}");
            let body = spend(&app, &finance, &query).await;
            let want = expected(&entries, group, bucket);
            assert_eq!(reported(&body, group), want, "{query}");
            assert_eq!(micros(&body["total_usd"]), total, "{query}");
            assert_eq!(micros(&body["total_cash_usd"]), total_cash, "{query}");
            assert!(
                body["owned_idle"]["gpu_hours"].is_number(),
                "{query}: {body}"
            );
            let text = spend_csv(&app, &finance, &query).await;
            assert_eq!(
                reported_csv(&text, group, !bucket.is_empty()),
                want,
                "{query} as CSV"
            );
        }
    }
    // A window: entries whose period starts in [from, to).
    let mid = entries[entries.len() / 2].period_start;
    let from = switchyard_broker::clock::to_datetime(mid).to_rfc3339();
    let body = spend(
        &app,
        &finance,
        &format!("group_by=provider&from={}", urlencode(&from)),
    )
    .await;
    let in_window: i64 = entries
        .iter()
        .filter(|e| e.period_start >= mid)
        .map(|e| e.amount.micros())
        .sum();
    assert_eq!(micros(&body["total_usd"]), in_window);
    let body = spend(
        &app,
        &finance,
        &format!("group_by=provider&to={}", urlencode(&from)),
    )
    .await;
    assert_eq!(micros(&body["total_usd"]), total - in_window);

    // Each job's cost is its share of the ledger.
    for (job, token) in [(&cv, &ml), (&site, &web), (&burst, &ml)] {
        let j = app.job(token, job).await.body;
        let share: i64 = entries
            .iter()
            .filter(|e| e.job.as_deref() == Some(job.as_str()))
            .map(|e| e.amount.micros())
            .sum();
        assert!(share > 0);
        assert_eq!(micros(&j["cost_usd"]), share, "{j}");
    }

    // A developer sees their own team only, whatever they ask for.
    let team_total = |team: &str| -> i64 {
        entries
            .iter()
            .filter(|e| e.team.as_deref() == Some(team))
            .map(|e| e.amount.micros())
            .sum()
    };
    let mine = spend(&app, &ml, "group_by=team").await;
    let rows = mine["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{mine}");
    assert_eq!(rows[0]["team"], "ml");
    assert_eq!(micros(&mine["total_usd"]), team_total("ml"));
    let by_project = spend(&app, &ml, "group_by=project").await;
    assert_eq!(micros(&by_project["total_usd"]), team_total("ml"));
    let theirs = spend(&app, &ml, "group_by=team&team=web").await;
    assert!(theirs["rows"].as_array().unwrap().is_empty(), "{theirs}");
    assert_eq!(theirs["total_usd"], 0.0);
    let team_cash: i64 = entries
        .iter()
        .filter(|e| e.team.as_deref() == Some("web"))
        .map(|e| e.cash.micros())
        .sum();
    let csv = spend_csv(&app, &web, "group_by=team").await;
    assert_eq!(
        reported_csv(&csv, "team", false),
        BTreeMap::from([(
            (None, Some("web".to_string())),
            (team_total("web"), team_cash)
        )])
    );
    // Owned idle GPUs are no team's: finance sees them, a developer does not.
    assert!(mine.get("owned_idle").is_none(), "{mine}");
    let filtered = spend(&app, &finance, "group_by=pool&team=web").await;
    assert_eq!(micros(&filtered["total_usd"]), team_total("web"));

    let doc = app.call(Method::GET, "/openapi.json", None, None).await;
    for path in ["/spend", "/budgets"] {
        assert!(
            doc.body["paths"][path]["get"].is_object(),
            "openapi lacks {path}"
        );
    }

    // Bad parameters name the field.
    for (query, field) in [
        ("group_by=colour", "group_by"),
        ("bucket=week", "bucket"),
        ("from=yesterday", "from"),
    ] {
        let r = app
            .call(
                Method::GET,
                &format!("/api/v1/spend?{query}"),
                Some(&finance),
                None,
            )
            .await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{query}: {}", r.body);
        assert_eq!(r.error_field(), field);
    }
}

fn urlencode(s: &str) -> String {
    s.replace('+', "%2B").replace(':', "%3A")
}

async fn put_budget(app: &TestApp, token: &str, team: &str, amount: f64) {
    let r = app
        .call(
            Method::PUT,
            &format!("/api/v1/policies/{team}"),
            Some(token),
            Some(json!({"budget": {"amount_usd": amount, "period": "month",
                                   "enforcement": "hard", "alert_at": [0.5]}})),
        )
        .await;
    assert!(r.status.is_success(), "{}", r.body);
}

async fn all_jobs(app: &TestApp) -> Vec<Value> {
    let r = app
        .call(
            Method::GET,
            "/api/v1/jobs?limit=500",
            Some(&app.admin),
            None,
        )
        .await;
    r.body["jobs"].as_array().unwrap().clone()
}

/// The winner's estimate of a placed job.
async fn estimate(app: &TestApp, job: &str) -> i64 {
    let r = app
        .call(
            Method::GET,
            &format!("/api/v1/jobs/{job}/placement"),
            Some(&app.admin),
            None,
        )
        .await;
    micros(&r.body["candidates"][0]["cost_usd"])
}

/// A broker accruing every 100 ms with three 4-GPU on-prem agents (leases that outlive the
/// test), and finance's and an `ml` developer's tokens.
async fn three_agents(clock: Clock) -> (TestApp, String, String) {
    let app = TestApp::spawn_with_clock(
        clock,
        |c| {
            c.ledger_accrual_interval_ms = 100;
            c.lease_ttl_s = 600;
        },
        |_| ProviderSet::default(),
    )
    .await;
    for _ in 0..3 {
        app.agent(4).await;
    }
    let finance = app.token("finance", None).await;
    let dev = app.token("developer", Some("ml")).await;
    (app, finance, dev)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_submissions_never_overspend_a_hard_budget_and_a_raise_releases_held_jobs() {
    let (app, finance, dev) = three_agents(Clock::system()).await;
    // Each job is estimated at 1 GPU × $2/h × 1 h = $2: the budget fits five.
    put_budget(&app, &finance, "ml", 11.0).await;

    let spec = json!({"name": "b", "team": "ml", "command": ["true"], "resources": {"gpus": 1},
                      "estimated_runtime_s": 3600});
    let submissions = (0..100).map(|_| app.submit(&dev, spec.clone()));
    for r in futures::future::join_all(submissions).await {
        id_of(&r);
    }
    let settled = |placed: usize| {
        let app = &app;
        async move {
            eventually("the queue to settle", 30, async || {
                let jobs = all_jobs(app).await;
                let n_placed = jobs.iter().filter(|j| j["state"] == "placed").count();
                let n_held = jobs.iter().filter(|j| j["state"] == "held").count();
                (n_placed == placed && n_placed + n_held == 100).then_some(jobs)
            })
            .await
        }
    };
    let jobs = settled(5).await;
    for j in jobs.iter().filter(|j| j["state"] == "held") {
        assert_eq!(j["reason"], "budget_exhausted", "{j}");
    }
    let mut reserved = 0;
    for j in jobs.iter().filter(|j| j["state"] == "placed") {
        reserved += estimate(&app, j["id"].as_str().unwrap()).await;
    }
    let ledger = app.app.store.ledger_total().await.unwrap();
    assert!(reserved + ledger <= 11_000_000, "{reserved} + {ledger}");
    let budgets = app
        .call(Method::GET, "/api/v1/budgets", Some(&finance), None)
        .await
        .body;
    let b = &budgets["budgets"][0];
    assert_eq!(b["team"], "ml");
    assert_eq!(b["enforcement"], "hard");
    assert_eq!(micros(&b["committed_usd"]), reserved, "{b}");
    assert!(micros(&b["spent_usd"]) + micros(&b["committed_usd"]) <= 11_000_000);
    assert!(micros(&b["remaining_usd"]) < 2_000_000, "{b}");
    // Nothing ran: the budget is reserved, not spent, and a developer of another team sees none.
    let other = app.token("developer", Some("web")).await;
    let none = app
        .call(Method::GET, "/api/v1/budgets", Some(&other), None)
        .await
        .body;
    assert!(none["budgets"].as_array().unwrap().is_empty(), "{none}");

    // Raising the budget releases as many held jobs as it now covers.
    put_budget(&app, &finance, "ml", 21.0).await;
    let jobs = settled(10).await;
    let mut reserved = 0;
    for j in jobs.iter().filter(|j| j["state"] == "placed") {
        reserved += estimate(&app, j["id"].as_str().unwrap()).await;
    }
    assert!(reserved <= 21_000_000, "{reserved}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_held_by_a_custom_budget_window_is_released_when_the_window_ends() {
    let app = TestApp::spawn_with_clock(
        manual_clock(),
        |c| {
            c.ledger_accrual_interval_ms = 100;
            c.lease_ttl_s = 600;
        },
        |_| ProviderSet::default(),
    )
    .await;
    app.agent(4).await;
    let finance = app.token("finance", None).await;
    let dev = app.token("developer", Some("ml")).await;
    // A $1 hard budget whose custom window ends a few seconds from now on the broker's clock.
    let whole = |secs: i64| chrono::DateTime::from_timestamp(secs, 0).unwrap();
    let now = app.app.clock.now().millis() / 1000;
    let (from, to) = (whole(now - 3600), whole(now + 7));
    let r = app
        .call(
            Method::PUT,
            "/api/v1/policies/ml",
            Some(&finance),
            Some(json!({"budget": {"amount_usd": 1.0, "period": "custom",
                                   "from": from.to_rfc3339(), "to": to.to_rfc3339(),
                                   "enforcement": "hard", "alert_at": [0.5]}})),
        )
        .await;
    assert!(r.status.is_success(), "{}", r.body);
    let budgets = app
        .call(Method::GET, "/api/v1/budgets", Some(&finance), None)
        .await
        .body;
    let b = &budgets["budgets"][0];
    assert_eq!(b["team"], "ml", "{budgets}");
    assert_eq!(
        normalise_time(b["period_end"].as_str().unwrap()),
        normalise_time(&to.to_rfc3339()),
        "{b}"
    );

    // One GPU for an hour at $2/GPU-hour: $2, beyond the $1 the window allows.
    let spec = json!({"name": "w", "team": "ml", "command": ["true"], "resources": {"gpus": 1},
                      "estimated_runtime_s": 3600});
    let job = id_of(&app.submit(&dev, spec).await);
    app.wait_for_job(&dev, &job, Duration::from_secs(10), |j| {
        j["state"] == "held"
    })
    .await;
    let held = app.job(&dev, &job).await.body;
    assert_eq!(held["reason"], "budget_exhausted", "{held}");
    // Still held a moment before the window ends, once the scheduler has planned at that
    // time: nothing but the window's end releases it.
    app.app
        .clock
        .set(from_datetime(to - chrono::Duration::milliseconds(1)));
    // (Two rounds: the first may have read the time before it was set.)
    let rounds = scheduler_rounds(&app).await;
    let j = eventually("two scheduler rounds", 10, async || {
        let j = app.job(&dev, &job).await.body;
        (j["state"] != "held" || scheduler_rounds(&app).await >= rounds + 2).then_some(j)
    })
    .await;
    assert_eq!(j["state"], "held", "released before the window ended: {j}");

    // The window ends: no budget applies any more, and the job is placed.
    app.app.clock.set(from_datetime(to));
    app.wait_for_job(&dev, &job, Duration::from_secs(20), |j| {
        j["state"] == "placed"
    })
    .await;
    let budgets = app
        .call(Method::GET, "/api/v1/budgets", Some(&finance), None)
        .await
        .body;
    assert!(
        budgets["budgets"].as_array().unwrap().is_empty(),
        "no budget applies outside its window: {budgets}"
    );
}

/// A broker on a data directory that outlives it.
struct Broker {
    url: String,
    app: App,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Broker {
    async fn start(dir: &std::path::Path, clock: Clock) -> (Broker, Option<String>) {
        let mut config = test_config(dir);
        config.ledger_accrual_interval_ms = 100;
        config.lease_ttl_s = 600;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        config.public_url = Some(url.clone());
        let running = App::start_with_clock(config, ProviderSet::default(), clock)
            .await
            .unwrap();
        let server = tokio::spawn({
            let app = running.app.clone();
            async move {
                let _ =
                    switchyard_broker::http::server::serve(app, listener, std::future::pending())
                        .await;
            }
        });
        let broker = Broker {
            url,
            app: running.app.clone(),
            // The election too: a stopped broker must not go on renewing (and retaking) the
            // lease of the one started after it under the same replica name.
            tasks: vec![
                running.election,
                running.scheduler,
                running.burst,
                running.ledger,
                running.heartbeat_writer,
                server,
            ],
        };
        (broker, running.created_admin_token)
    }

    fn stop(self) {
        for t in self.tasks {
            t.abort();
        }
    }

    async fn call(&self, method: Method, path: &str, token: &str, body: Option<Value>) -> Value {
        let mut req = reqwest::Client::new()
            .request(method, format!("{}{path}", self.url))
            .bearer_auth(token);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let res = req.send().await.unwrap();
        assert!(res.status().is_success(), "{path}: {}", res.status());
        res.json().await.unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accrual_shows_spend_to_date_and_settles_exactly_once_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    // One clock for both runs of the broker.
    let clock = manual_clock();
    let (broker, admin) = Broker::start(dir.path(), clock.clone()).await;
    let admin = admin.unwrap();
    let enrol = broker
        .call(
            Method::POST,
            "/api/v1/enrolment-tokens",
            &admin,
            Some(json!({"pool": POOL})),
        )
        .await;
    let agent = broker
        .call(
            Method::POST,
            "/agent/v1/register",
            enrol["token"].as_str().unwrap(),
            Some(register_body(4)),
        )
        .await;
    let agent_token = agent["agent_token"].as_str().unwrap().to_string();
    let job = broker
        .call(
            Method::POST,
            "/api/v1/jobs",
            &admin,
            Some(json!({"name": "long", "team": "ml", "command": ["true"],
                        "resources": {"gpus": 2}, "estimated_runtime_s": 600})),
        )
        .await;
    let job_id = job["id"].as_str().unwrap().to_string();
    let lease = eventually("the lease", 20, async || {
        let w = broker
            .call(Method::GET, "/agent/v1/work?wait_s=5", &agent_token, None)
            .await;
        w["leases"].as_array().unwrap().first().cloned()
    })
    .await;
    let attempt = lease["attempt"].clone();
    broker
        .call(
            Method::POST,
            "/agent/v1/events",
            &agent_token,
            Some(json!({"events": [{"type": "started", "attempt": attempt, "pid": 1}]})),
        )
        .await;

    // Spend to date grows while it runs.
    let cost = |b: &Broker| {
        let (url, admin, job) = (b.url.clone(), admin.clone(), job_id.clone());
        async move {
            let v: Value = reqwest::Client::new()
                .get(format!("{url}/api/v1/jobs/{job}"))
                .bearer_auth(admin)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            micros(&v["cost_usd"])
        }
    };
    clock.advance(Duration::from_millis(1500));
    let first = eventually("spend to date while running", 10, async || {
        let c = cost(&broker).await;
        (c > 0).then_some(c)
    })
    .await;

    // Restart on the same database; the accrual loop picks up where it left off.
    broker.stop();
    let (broker, _) = Broker::start(dir.path(), clock.clone()).await;
    clock.advance(Duration::from_millis(1500));
    eventually("more spend after the restart", 10, async || {
        (cost(&broker).await > first).then_some(())
    })
    .await;
    // It finishes half a second after that pass: the end settles the stretch since.
    clock.advance(Duration::from_millis(500));
    broker
        .call(
            Method::POST,
            "/agent/v1/events",
            &agent_token,
            Some(
                json!({"events": [{"type": "finished", "attempt": attempt, "exit_code": 0,
                "signal": null, "error": null, "stopped": false}]}),
            ),
        )
        .await;
    let view = broker
        .call(Method::GET, &format!("/api/v1/jobs/{job_id}"), &admin, None)
        .await;
    assert_eq!(view["state"], "succeeded");
    let (started, finished) = (time_of(&view["started_at"]), time_of(&view["finished_at"]));

    // Settled at the end: contiguous periods from start to finish, each written once, adding
    // up to exactly 2 GPUs × $2/h for the whole seconds it ran; later passes add nothing.
    let settled = micros(&view["cost_usd"]);
    clock.advance(Duration::from_secs(5));
    assert_eq!(
        accrue_once(&broker.app).await.unwrap(),
        0,
        "a later pass adds nothing"
    );
    let entries = broker
        .app
        .store
        .ledger_entries(Some(switchyard_core::JobId(job_id.parse().unwrap())))
        .await
        .unwrap();
    assert!(entries.len() >= 3, "{entries:?}");
    assert_eq!(entries[0].period_start, started);
    assert_eq!(entries.last().unwrap().period_end, finished);
    for pair in entries.windows(2) {
        assert_eq!(pair[0].period_end, pair[1].period_start, "{entries:?}");
    }
    let sum: i64 = entries.iter().map(|e| e.amount.micros()).sum();
    let want = Money(4_000_000)
        .per_hour_for_secs(finished.billed_secs_since(started))
        .micros();
    assert_eq!(sum, want);
    assert_eq!(settled, want);
    assert_eq!(cost(&broker).await, want);
    assert_eq!(broker.app.store.ledger_total().await.unwrap(), want);
    broker.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_soft_budget_alerts_once_per_threshold_at_the_teams_onprem_rate_and_never_holds() {
    let app = TestApp::spawn_with_clock(
        manual_clock(),
        |c| {
            c.ledger_accrual_interval_ms = 100;
            c.lease_ttl_s = 600;
        },
        |_| ProviderSet::default(),
    )
    .await;
    let agent = app.agent(4).await;
    let finance = app.token("finance", None).await;
    let dev = app.token("developer", Some("ops")).await;
    // $36 per H100-hour is a cent a second: three seconds on the clock cross both thresholds.
    let r = app
        .call(
            Method::PUT,
            "/api/v1/policies/ops",
            Some(&finance),
            Some(
                json!({"budget": {"amount_usd": 0.02, "period": "week", "enforcement": "soft",
                                   "alert_at": [0.5, 1.0]},
                        "onprem_rates": {"H100": 36.0}}),
            ),
        )
        .await;
    assert!(r.status.is_success(), "{}", r.body);
    let spec = json!({"name": "s", "team": "ops", "command": ["true"], "resources": {"gpus": 1},
                      "estimated_runtime_s": 3600});
    let job = id_of(&app.submit(&dev, spec.clone()).await);
    let attempt = start(&app, &agent, &job).await;
    let alerts = || async {
        let r = app
            .call(
                Method::GET,
                "/api/v1/audit?target=policy:ops",
                Some(&finance),
                None,
            )
            .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
        r.body["entries"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["action"] == "budget.alert")
            .map(|e| e["after"]["threshold"].as_f64().unwrap())
            .collect::<Vec<f64>>()
    };
    app.advance(Duration::from_secs(3));
    eventually("both thresholds to alert", 20, async || {
        (alerts().await.len() == 2).then_some(())
    })
    .await;
    // Over budget, soft: the next job is placed all the same.
    let next = id_of(&app.submit(&dev, spec).await);
    app.wait_for_job(&dev, &next, Duration::from_secs(10), |j| {
        j["state"] == "placed"
    })
    .await;
    finish(&app, &agent, &attempt).await;
    app.advance(Duration::from_secs(1));
    accrue_once(&app.app).await.unwrap();
    let mut crossed = alerts().await;
    crossed.sort_by(f64::total_cmp);
    assert_eq!(
        crossed,
        vec![0.5, 1.0],
        "one alert per threshold and period"
    );

    let view = app.job(&dev, &job).await.body;
    let (started, finished) = (time_of(&view["started_at"]), time_of(&view["finished_at"]));
    let want = Money(36_000_000)
        .per_hour_for_secs(finished.billed_secs_since(started))
        .micros();
    assert_eq!(micros(&view["cost_usd"]), want, "{view}");
    let budgets = app
        .call(Method::GET, "/api/v1/budgets", Some(&dev), None)
        .await
        .body;
    let b = &budgets["budgets"][0];
    assert_eq!(b["enforcement"], "soft");
    assert!(micros(&b["spent_usd"]) >= want, "{b}");
    assert!(b["remaining_usd"].as_f64().unwrap() < 0.0, "{b}");
    assert_eq!(b["alerts_crossed"], json!([0.5, 1.0]));
}

/// The store on its own, with explicit times: an instance's life charged stretch by stretch to
/// the job on it (else to the job it was launched for), contiguous, settled with the provider's
/// minimum billed time, and never written twice.
#[tokio::test]
async fn an_instance_is_charged_to_the_work_on_it_and_settled_to_its_minimum() {
    use switchyard_broker::store::*;
    use switchyard_core::{AttemptId, JobId, Market, Pool, PoolId, Region, RegionId};
    use switchyard_protocol::agent::{AgentEvent, AttemptRef};

    let dir = tempfile::tempdir().unwrap();
    // SQLite, or PostgreSQL with SWITCHYARD_TEST_PG_URL.
    let store = test_store(dir.path()).await;
    let region = Region {
        id: RegionId("aws:x".into()),
        provider: "aws".into(),
        code: "x".into(),
        latitude: None,
        longitude: None,
        egress_per_gb: Money::ZERO,
        latency_ms: 10,
        ingress_gbps: 10,
    };
    let pool = Pool {
        id: PoolId("aws:x/gpu8".into()),
        region: region.id.clone(),
        provider: "aws".into(),
        instance_type: "gpu8".into(),
        gpu_model: "H100".into(),
        gpus_per_node: 8,
        gpu_memory_gb: 80,
        vcpus: 0,
        memory_gb: 0,
        on_demand_per_hour: Money(3_600_000),
        spot_per_hour: None,
        node_limit: 2,
        launchable: true,
        boot_time_s: 60,
        price_updated_at: Timestamp(0),
        recent_capacity_failures: 0,
        marginal_per_hour: None,
    };
    store.upsert_region(&region).await.unwrap();
    store.upsert_pool(&pool).await.unwrap();
    let t0 = Timestamp(1_800_000_000_000);
    let at = |s: i64| t0.plus_secs(s);
    let job = |team: &str| {
        let wire: switchyard_protocol::api::JobSpec = serde_json::from_value(
            json!({"name": "j", "team": team, "command": ["true"], "resources": {"gpus": 2}}),
        )
        .unwrap();
        NewJob {
            id: JobId(uuid::Uuid::now_v7()),
            spec: switchyard_broker::rules::convert::job_spec(&wire, t0).unwrap(),
            spec_json: serde_json::to_string(&wire).unwrap(),
            submitted_at: t0,
            trace_parent: None,
            replica: None,
        }
    };
    let (j1, j2) = (job("ml"), job("web"));
    store.insert_job(&j1).await.unwrap();
    store.insert_job(&j2).await.unwrap();
    let window = (Timestamp(0), Timestamp::MAX);
    let usage = |team: &'static str| {
        let store = &store;
        async move {
            store
                .budget_usage(team, None, window.0, window.1)
                .await
                .unwrap()
        }
    };

    // A launch for j1 reserves its estimate; the instance is paid from its launch ($3.6/h).
    store
        .commit_plan(
            &[],
            &[NewInstance {
                id: "i-1".into(),
                provider: "fake".into(),
                pool: pool.id.clone(),
                region: region.id.to_string(),
                market: Market::OnDemand,
                hourly_price: Money(3_600_000),
                for_job: j1.id,
                job_version: 0,
                estimated_cost: Money(5_000_000),
            }],
            t0,
        )
        .await
        .unwrap();
    assert_eq!(usage("ml").await.committed, Money(5_000_000));
    store
        .instance_launched("i-1", "prov-1", at(0))
        .await
        .unwrap();
    assert_eq!(store.accrue_ledger(at(10), 0).await.unwrap(), 1);
    let ml = usage("ml").await;
    assert_eq!((ml.spent, ml.committed), (Money(10_000), Money(4_990_000)));

    // Its agent enrols; j1 is placed, starts, runs and finishes on it.
    let node = enrol_node(store.as_ref(), &pool.id, Some("i-1"), 8, t0, at(20)).await;
    let place = |job: &NewJob, version: i64, now: Timestamp| {
        let attempt = AttemptId(uuid::Uuid::now_v7());
        let new = NewAttempt {
            id: attempt,
            job: job.id,
            job_version: version,
            node: node.clone(),
            pool: pool.id.clone(),
            gpus: vec![0, 1],
            market: Market::OnDemand,
            estimated_cost: Money(5_000_000),
            hourly_rate: Money(1),
            hourly_cash: Money(1),
            expected_end: now.plus_secs(600),
            rank: 0,
        };
        let r = AttemptRef {
            job_id: job.id.0,
            attempt_id: attempt.0,
            epoch: 1,
        };
        (new, r)
    };
    let (a1, r1) = place(&j1, 1, at(20));
    store.commit_plan(&[a1], &[], at(20)).await.unwrap();
    let started = |r: &AttemptRef| AgentEvent::Started {
        attempt: r.clone(),
        pid: 1,
    };
    let finished = |r: &AttemptRef| AgentEvent::Finished {
        attempt: r.clone(),
        exit_code: Some(0),
        signal: None,
        error: None,
        stopped: false,
        requeue: false,
        drained: false,
    };
    store
        .apply_events(&node, &[started(&r1)], at(30))
        .await
        .unwrap();
    store.accrue_ledger(at(40), 0).await.unwrap();
    store
        .apply_events(&node, &[finished(&r1)], at(50))
        .await
        .unwrap();
    // Then j2 (another team) runs on it until the instance is terminated at 70 s; the provider
    // bills an hour at least.
    let (a2, r2) = place(&j2, 0, at(55));
    store.commit_plan(&[a2], &[], at(55)).await.unwrap();
    store
        .apply_events(&node, &[started(&r2)], at(60))
        .await
        .unwrap();
    assert!(
        store
            .end_instance("i-1", None, false, 3600, at(70))
            .await
            .unwrap()
    );
    // Later passes add nothing.
    assert_eq!(store.accrue_ledger(at(100), 3600).await.unwrap(), 0);
    assert_eq!(store.accrue_ledger(at(200), 3600).await.unwrap(), 0);

    let entries = store.ledger_entries(None).await.unwrap();
    // (from s, to s, kind, team, job, attempt, micro-dollars)
    type Stretch = (
        i64,
        i64,
        String,
        String,
        Option<String>,
        Option<String>,
        i64,
    );
    let stretches: Vec<Stretch> = entries
        .iter()
        .map(|e| {
            (
                (e.period_start.millis() - t0.millis()) / 1000,
                (e.period_end.millis() - t0.millis()) / 1000,
                e.kind.clone(),
                e.team.clone().unwrap_or_default(),
                e.job.clone(),
                e.attempt.clone(),
                e.amount.micros(),
            )
        })
        .collect();
    let (j1s, j2s) = (Some(j1.id.to_string()), Some(j2.id.to_string()));
    let (a1s, a2s) = (
        Some(r1.attempt_id.to_string()),
        Some(r2.attempt_id.to_string()),
    );
    let (boot, idle, on_job) = ("instance_boot", "instance_idle", "instance");
    let row = |from: i64, to: i64, kind: &str, team: &str, job, attempt, micros| {
        (
            from,
            to,
            kind.to_string(),
            team.to_string(),
            job,
            attempt,
            micros,
        )
    };
    assert_eq!(
        stretches,
        vec![
            // Booting until its node joined at 20 s, then idle until j1 started: the team's
            // overhead, charged to no job.
            row(0, 10, boot, "ml", None, None, 10_000),
            row(10, 20, boot, "ml", None, None, 10_000),
            row(20, 30, idle, "ml", None, None, 10_000),
            row(30, 40, on_job, "ml", j1s.clone(), a1s.clone(), 10_000),
            row(40, 50, on_job, "ml", j1s.clone(), a1s.clone(), 10_000),
            // Idle between jobs: the team of the job it was launched for.
            row(50, 60, idle, "ml", None, None, 10_000),
            // The rest of the billed hour goes to the work on it at the end.
            row(60, 70, on_job, "web", j2s.clone(), a2s.clone(), 3_540_000),
        ]
    );
    assert!(entries.iter().all(
        |e| e.instance.as_deref() == Some("i-1") && e.source.as_deref() == Some("instance:i-1")
    ));
    assert_eq!(store.ledger_total().await.unwrap(), 3_600_000);
    // A job pays for its own time only: j1's cost stopped when it finished.
    assert_eq!(store.job(j1.id).await.unwrap().unwrap().cost, Money(20_000));
    assert_eq!(
        store.job(j2.id).await.unwrap().unwrap().cost,
        Money(3_540_000)
    );
    let by_usage = store
        .spend(&SpendQuery {
            group: SpendGroup::Usage,
            bucket: None,
            from: None,
            to: None,
            team: Some("ml".into()),
        })
        .await
        .unwrap();
    assert_eq!(
        by_usage
            .iter()
            .map(|r| (r.key.clone().unwrap(), r.amount.micros()))
            .collect::<Vec<_>>(),
        vec![
            ("instance_boot".to_string(), 20_000),
            ("instance_idle".to_string(), 20_000),
            ("job".to_string(), 20_000),
        ]
    );
    let by_team = store
        .spend(&SpendQuery {
            group: SpendGroup::Team,
            bucket: None,
            from: None,
            to: None,
            team: None,
        })
        .await
        .unwrap();
    assert_eq!(
        by_team
            .iter()
            .map(|r| (r.key.clone().unwrap(), r.amount.micros()))
            .collect::<Vec<_>>(),
        vec![("ml".to_string(), 60_000), ("web".to_string(), 3_540_000)]
    );
    // Nothing is live any more: nothing is reserved.
    assert_eq!(usage("ml").await.committed, Money::ZERO);
    assert_eq!(usage("web").await.committed, Money::ZERO);
    assert_eq!(usage("web").await.spent, Money(3_540_000));
}

/// An accrual pass that read the clock after the transaction ending an attempt did, but took
/// the write lock first, has charged the attempt past the end that transaction read. The
/// attempt and its job then end where the ledger charged them to: the ledger never runs past an
/// attempt's end, and nothing is charged twice.
#[tokio::test]
async fn an_attempt_overtaken_by_an_accrual_pass_ends_where_it_was_charged_to() {
    use switchyard_broker::store::*;
    use switchyard_core::{AttemptId, JobState, Market};
    use switchyard_protocol::agent::{AgentEvent, AttemptRef};

    let dir = tempfile::tempdir().unwrap();
    // SQLite, or PostgreSQL with SWITCHYARD_TEST_PG_URL.
    let store = test_store(dir.path()).await;
    let t0 = Timestamp(1_800_000_000_000);
    let at_ms = |ms: i64| Timestamp(t0.millis() + ms);
    let (pool, job, node) = onprem_job(&store, None, t0).await;
    let attempt = AttemptId(uuid::Uuid::now_v7());
    // $3.6 an hour: a micro-dollar a millisecond, a thousand a billed second.
    let new = NewAttempt {
        id: attempt,
        job: job.id,
        job_version: 0,
        node: node.clone(),
        pool: pool.id.clone(),
        gpus: vec![0],
        market: Market::OnDemand,
        estimated_cost: Money(100_000),
        hourly_rate: Money(3_600_000),
        hourly_cash: Money(720_000),
        expected_end: at_ms(600_000),
        rank: 0,
    };
    store.commit_plan(&[new], &[], t0).await.unwrap();
    let r = AttemptRef {
        job_id: job.id.0,
        attempt_id: attempt.0,
        epoch: 1,
    };
    store
        .apply_events(
            &node,
            &[AgentEvent::Started {
                attempt: r.clone(),
                pid: 1,
            }],
            at_ms(1_000),
        )
        .await
        .unwrap();
    // The pass read 11.004 s and committed; the report that ends the attempt read 11.000 s
    // before it, and commits after it.
    assert_eq!(store.accrue_ledger(at_ms(11_004), 0).await.unwrap(), 1);
    store
        .apply_events(
            &node,
            &[AgentEvent::Finished {
                attempt: r.clone(),
                exit_code: Some(0),
                signal: None,
                error: None,
                stopped: false,
                requeue: false,
                drained: false,
            }],
            at_ms(11_000),
        )
        .await
        .unwrap();
    assert_eq!(store.accrue_ledger(at_ms(20_000), 0).await.unwrap(), 0);

    let record = store.job(job.id).await.unwrap().unwrap();
    assert_eq!(record.state, JobState::Succeeded);
    assert_eq!(record.finished_at, Some(at_ms(11_004)));
    let entries = store.ledger_entries(None).await.unwrap();
    let spans: Vec<(i64, i64, i64)> = entries
        .iter()
        .map(|e| {
            (
                e.period_start.millis() - t0.millis(),
                e.period_end.millis() - t0.millis(),
                e.amount.micros(),
            )
        })
        .collect();
    // 10.004 s run: 11 seconds billed, a started second counting in full.
    assert_eq!(spans, vec![(1_000, 11_004, 11_000)]);
    assert_eq!(store.ledger_total().await.unwrap(), 11_000);
}

/// Two costs (issue 29): an attempt on an owned node is billed to its team at the internal rate
/// and costs the company its pool's marginal cost, both kept per ledger entry and summed by the
/// spend query; the GPUs no attempt held are owned idle time, per UTC hour and worth the
/// internal rate, and a node that went silent is unavailable, not idle.
#[tokio::test]
async fn an_owned_node_keeps_cash_beside_chargeback_and_its_idle_gpus_are_counted() {
    use switchyard_broker::store::*;
    use switchyard_core::{AttemptId, Market};
    use switchyard_protocol::agent::{AgentEvent, AttemptRef, Inventory};

    let dir = tempfile::tempdir().unwrap();
    // SQLite, or PostgreSQL with SWITCHYARD_TEST_PG_URL.
    let store = test_store(dir.path()).await;
    // On an hour boundary, so that the idle rows are whole hours. $3.60 per GPU-hour billed,
    // $0.72 in cash (finance's figure).
    let t0 = Timestamp(500_000 * 3_600_000);
    let at_s = |s: i64| Timestamp(t0.millis() + s * 1000);
    let (pool, job, node) = onprem_job(&store, Some(Money(2_880_000)), t0).await;
    let read = store.pools().await.unwrap();
    assert_eq!(read[0].marginal_per_hour, Some(Money(2_880_000)));
    assert_eq!(read[0].cash_per_gpu_hour(Market::OnDemand), Money(720_000));
    let attempt = AttemptId(uuid::Uuid::now_v7());
    let rate = switchyard_broker::control::ledger::attempt_rate(&pool, Market::OnDemand, 1, None);
    let cash = switchyard_broker::control::ledger::attempt_cash_rate(&pool, Market::OnDemand, 1);
    assert_eq!((rate, cash), (Money(3_600_000), Money(720_000)));
    let new = NewAttempt {
        id: attempt,
        job: job.id,
        job_version: 0,
        node: node.clone(),
        pool: pool.id.clone(),
        gpus: vec![0],
        market: Market::OnDemand,
        estimated_cost: Money(3_600_000),
        hourly_rate: rate,
        hourly_cash: cash,
        expected_end: at_s(3600),
        rank: 0,
    };
    store.commit_plan(&[new], &[], t0).await.unwrap();
    let r = AttemptRef {
        job_id: job.id.0,
        attempt_id: attempt.0,
        epoch: 1,
    };
    let report = |event: AgentEvent, at: Timestamp| {
        let store = store.clone();
        let node = node.clone();
        async move { store.apply_events(&node, &[event], at).await.unwrap() }
    };
    report(
        AgentEvent::Started {
            attempt: r.clone(),
            pid: 1,
        },
        t0,
    )
    .await;
    // Half an hour in: a pass (the attempt's first half, the 3 idle GPUs' first half hour),
    // then a heartbeat: the node is heard from in each stretch a pass counts.
    store.accrue_ledger(at_s(1800), 0).await.unwrap();
    let inventory = Inventory {
        gpus: Vec::new(),
        cpus: 0,
        memory_mb: 0,
        simulated: true,
        isolation: false,
    };
    store
        .heartbeat(&node, &inventory, &[], at_s(1800))
        .await
        .unwrap();
    report(
        AgentEvent::Finished {
            attempt: r.clone(),
            exit_code: Some(0),
            signal: None,
            error: None,
            stopped: false,
            requeue: false,
            drained: false,
        },
        at_s(3600),
    )
    .await;
    store.accrue_ledger(at_s(3600), 0).await.unwrap();

    let entries = store.ledger_entries(Some(job.id)).await.unwrap();
    let billed: i64 = entries.iter().map(|e| e.amount.micros()).sum();
    let paid: i64 = entries.iter().map(|e| e.cash.micros()).sum();
    assert_eq!((billed, paid), (3_600_000, 720_000), "{entries:?}");
    let by_team = store
        .spend(&SpendQuery {
            group: SpendGroup::Team,
            bucket: None,
            from: None,
            to: None,
            team: None,
        })
        .await
        .unwrap();
    assert_eq!(by_team.len(), 1);
    assert_eq!(
        (by_team[0].amount, by_team[0].cash),
        (Money(3_600_000), Money(720_000))
    );
    // The first hour: 4 GPUs owned, 1 busy: 3 GPU-hours idle, worth 3 × $3.60.
    let idle = store.owned_idle(None, None).await.unwrap();
    assert_eq!(
        idle,
        vec![OwnedIdleRow {
            pool: pool.id.to_string(),
            idle_gpu_ms: 3 * 3_600_000,
            worth: Money(10_800_000),
        }]
    );

    // Silent for an hour (no heartbeat since the last pass): unavailable, not idle.
    store.accrue_ledger(at_s(7200), 0).await.unwrap();
    assert_eq!(store.owned_idle(None, None).await.unwrap(), idle);
    // Heard again: the next half hour, all 4 GPUs idle, in the third hour's row.
    store
        .heartbeat(&node, &inventory, &[], at_s(7200))
        .await
        .unwrap();
    store.accrue_ledger(at_s(9000), 0).await.unwrap();
    let third = store
        .owned_idle(Some(at_s(7200)), Some(at_s(10_800)))
        .await
        .unwrap();
    assert_eq!(third[0].idle_gpu_ms, 4 * 1_800_000);
    assert_eq!(third[0].worth, Money(7_200_000));
    let all = store.owned_idle(None, None).await.unwrap();
    assert_eq!(all[0].idle_gpu_ms, 3 * 3_600_000 + 4 * 1_800_000);
}

/// Straight through the store: an owned pool of 4-GPU A100 nodes ($14.40 a node-hour billed,
/// `marginal` in cash) in `onprem:dc`, its node `n1` enrolled at `t0`, and a one-GPU job of
/// team ml submitted at `t0`.
async fn onprem_job(
    store: &switchyard_broker::store::Store,
    marginal: Option<Money>,
    t0: Timestamp,
) -> (
    switchyard_core::Pool,
    switchyard_broker::store::NewJob,
    switchyard_core::NodeId,
) {
    use switchyard_core::{JobId, Pool, PoolId, Region};
    let region = Region {
        id: switchyard_core::RegionId("onprem:dc".into()),
        provider: "onprem".into(),
        code: "dc".into(),
        latitude: None,
        longitude: None,
        egress_per_gb: Money::ZERO,
        latency_ms: 1,
        ingress_gbps: 10,
    };
    let pool = Pool {
        id: PoolId("onprem:dc/a100".into()),
        region: region.id.clone(),
        provider: "onprem".into(),
        instance_type: "a100".into(),
        gpu_model: "A100".into(),
        gpus_per_node: 4,
        gpu_memory_gb: 80,
        vcpus: 0,
        memory_gb: 0,
        on_demand_per_hour: Money(14_400_000),
        spot_per_hour: None,
        node_limit: 1,
        launchable: false,
        boot_time_s: 0,
        price_updated_at: Timestamp(0),
        recent_capacity_failures: 0,
        marginal_per_hour: marginal,
    };
    store.upsert_region(&region).await.unwrap();
    store.upsert_pool(&pool).await.unwrap();
    let wire: switchyard_protocol::api::JobSpec = serde_json::from_value(
        json!({"name": "j", "team": "ml", "command": ["true"], "resources": {"gpus": 1}}),
    )
    .unwrap();
    let job = switchyard_broker::store::NewJob {
        id: JobId(uuid::Uuid::now_v7()),
        spec: switchyard_broker::rules::convert::job_spec(&wire, t0).unwrap(),
        spec_json: serde_json::to_string(&wire).unwrap(),
        submitted_at: t0,
        trace_parent: None,
        replica: None,
    };
    store.insert_job(&job).await.unwrap();
    let node = enrol_node(store, &pool.id, None, 4, t0, t0).await;
    (pool, job, node)
}

/// Enrols node `n1` of `pool` at `at` (for `instance`, when given) with a token made at
/// `issued`, straight through the store.
async fn enrol_node(
    store: &switchyard_broker::store::Store,
    pool: &switchyard_core::PoolId,
    instance: Option<&str>,
    gpus: u32,
    issued: Timestamp,
    at: Timestamp,
) -> switchyard_core::NodeId {
    use switchyard_broker::store::{EnrolmentTokenRecord, NewNode};
    store
        .insert_enrolment_token(&EnrolmentTokenRecord {
            token_hash: "enrol".into(),
            pool: pool.clone(),
            instance: instance.map(str::to_string),
            created_at: issued,
            expires_at: issued.plus_secs(3600),
        })
        .await
        .unwrap();
    let node = switchyard_core::NodeId("n1".into());
    store
        .register_node(
            "enrol",
            NewNode {
                id: node.clone(),
                address: None,
                token_hash: "agent".into(),
                hostname: "h".into(),
                gpus_total: gpus,
                inventory_json: "{}".into(),
            },
            at,
        )
        .await
        .unwrap()
        .unwrap();
    node
}

/// What-if and the live broker agree: the team's jobs replayed under the policy that holds some
/// of them live hold exactly those (current and an identical draft alike), and a draft without
/// the budget releases exactly them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_if_holds_what_the_live_broker_holds_under_the_same_hard_budget() {
    let (app, finance, dev) = three_agents(manual_clock()).await;
    // Each job is estimated at 1 GPU × $2/h × 1 h = $2: the budget fits five of eight.
    put_budget(&app, &finance, "ml", 11.0).await;
    let spec = json!({"name": "b", "team": "ml", "command": ["true"], "resources": {"gpus": 1},
                      "estimated_runtime_s": 3600});
    // One at a time: the live queue and the replay order them by submission alike.
    for _ in 0..8 {
        id_of(&app.submit(&dev, spec.clone()).await);
        app.advance(Duration::from_millis(5));
    }
    let jobs = eventually("the queue to settle", 30, async || {
        let jobs = all_jobs(&app).await;
        let placed = jobs.iter().filter(|j| j["state"] == "placed").count();
        let held = jobs.iter().filter(|j| j["state"] == "held").count();
        (placed == 5 && held == 3).then_some(jobs)
    })
    .await;
    let mut live_held: Vec<String> = jobs
        .iter()
        .filter(|j| j["state"] == "held")
        .map(|j| j["id"].as_str().unwrap().to_string())
        .collect();
    live_held.sort();
    let policy = app
        .call(Method::GET, "/api/v1/policies/ml", Some(&finance), None)
        .await
        .body;
    let what_if = async |draft: Value| {
        let r = app
            .call(
                Method::POST,
                "/api/v1/policies/ml/what-if",
                Some(&finance),
                Some(draft),
            )
            .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
        r.body
    };
    let same = what_if(policy["policy"].clone()).await;
    assert_eq!(same["jobs"], 8, "{same}");
    assert_eq!(same["current"]["held_jobs"], 3, "{same}");
    assert_eq!(same["draft"]["held_jobs"], 3, "{same}");
    assert_eq!(same["changes"], json!([]), "{same}");
    // Five jobs of $2 each billed, charged the day they end; what-if totals are cash (on-prem
    // at its marginal cost, a fifth of that).
    let per_day: f64 = same["current"]["cost_per_day"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["cost_usd"].as_f64().unwrap())
        .sum();
    assert!((per_day - 2.0).abs() < 0.01, "{same}");
    let none = what_if(json!({})).await;
    assert_eq!(none["draft"]["held_jobs"], 0, "{none}");
    let mut released: Vec<String> = none["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            assert_eq!(c["change"], "released", "{c}");
            c["job_id"].as_str().unwrap().to_string()
        })
        .collect();
    released.sort();
    assert_eq!(released, live_held, "{none}");
}

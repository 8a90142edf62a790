//! `TestApp`: the real router and scheduler on an ephemeral port, a fresh database per test
//! (a SQLite file in the data directory, or — with `SWITCHYARD_TEST_PG_URL` set and the
//! `postgres` feature — a PostgreSQL database of its own), and helpers to act as each role or
//! as an agent speaking the protocol by hand.
//!
//! A test that waits for time to pass — a lease, an idle TTL, a budget window, a token's
//! lifetime — starts the broker on a manual clock ([`TestApp::spawn_manual`],
//! [`TestApp::spawn_with_clock`], [`spawn_with_fake_on`]) and moves it ([`TestApp::advance`])
//! instead of sleeping; it sleeps or polls only for real work (an agent, a loop's next pass).

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

pub mod authz;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use std::time::Duration;
use switchyard_broker::app::App;
use switchyard_broker::clock::Clock;
use switchyard_broker::config::{Config, PoolConfig, RegionConfig};

pub struct TestApp {
    pub url: String,
    pub admin: String,
    pub app: App,
    pub http: reqwest::Client,
    _dir: tempfile::TempDir,
}

pub struct Response {
    pub status: StatusCode,
    pub body: Value,
}

impl Response {
    pub fn error_code(&self) -> &str {
        self.body["error"]["code"].as_str().unwrap_or("")
    }
    pub fn error_field(&self) -> &str {
        self.body["error"]["field"].as_str().unwrap_or("")
    }
}

pub const POOL: &str = "onprem:test-dc/h100x4";

pub fn test_config(dir: &std::path::Path) -> Config {
    Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: dir.to_path_buf(),
        database_url: test_database_url(dir),
        heartbeat_interval_s: 1,
        lease_ttl_s: 5,
        grace_s: 2,
        scheduler_tick_ms: 100,
        regions: vec![RegionConfig {
            id: "onprem:test-dc".into(),
            latitude: None,
            longitude: None,
            latency_ms: 2,
            egress_per_gb_usd: 0.0,
            ingress_gbps: 100,
        }],
        pools: vec![PoolConfig {
            id: POOL.into(),
            region: "onprem:test-dc".into(),
            gpu_model: "H100".into(),
            gpus_per_node: 4,
            gpu_memory_gb: 80,
            vcpus: 64,
            memory_gb: 512,
            price_per_gpu_hour_usd: 2.0,
            marginal_usd_per_gpu_hour: None,
            node_limit: 4,
            launchable: false,
            boot_time_s: 0,
        }],
        ..Config::default()
    }
}

/// The PostgreSQL server the tests use instead of SQLite (`postgres://user@host:port`, no
/// database name), if any.
fn test_pg_url() -> Option<String> {
    let url = std::env::var("SWITCHYARD_TEST_PG_URL")
        .ok()
        .filter(|u| !u.is_empty())?;
    Some(url.trim_end_matches('/').to_string())
}

/// The database of the broker whose data directory is `dir`: `None` (SQLite in `dir`), or with
/// `SWITCHYARD_TEST_PG_URL` a fresh PostgreSQL database `sy_<uuid>`, created on first use and
/// named in `dir/pg-database`, so that a broker restarted on the same directory finds its data.
pub fn test_database_url(dir: &std::path::Path) -> Option<String> {
    let server = test_pg_url()?;
    let marker = dir.join("pg-database");
    let name = match std::fs::read_to_string(&marker) {
        Ok(name) => name,
        Err(_) => {
            let name = format!("sy_{}", uuid::Uuid::now_v7().simple());
            create_pg_database(&server, &name);
            std::fs::write(&marker, &name).unwrap();
            name
        }
    };
    Some(format!("{server}/{name}"))
}

fn create_pg_database(server: &str, name: &str) {
    use sqlx::Connection;
    let url = format!("{server}/postgres");
    let sql = format!("CREATE DATABASE {name}");
    // `test_config` is not async and runs inside the tests' runtime: a runtime of its own on
    // another thread.
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async move {
                let mut conn = sqlx::PgConnection::connect(&url)
                    .await
                    .unwrap_or_else(|e| panic!("connecting to {url}: {e}"));
                sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                    .execute(&mut conn)
                    .await
                    .unwrap();
                conn.close().await.unwrap();
            })
    })
    .join()
    .unwrap();
}

/// A store on its own (no broker) for data directory `dir`, on the backend the tests use.
pub async fn test_store(dir: &std::path::Path) -> std::sync::Arc<switchyard_broker::store::Store> {
    let store = match test_database_url(dir) {
        Some(url) => switchyard_broker::store::Store::open_url(&url).await,
        None => switchyard_broker::store::Store::open_sqlite(&dir.join("switchyard.db")).await,
    };
    std::sync::Arc::new(store.unwrap())
}

/// Runs one statement straight on the broker's database, whichever backend it is (for tests
/// of what the schema itself refuses). Returns the database's error message on failure.
pub async fn execute_raw(config: &Config, sql: &'static str) -> Result<u64, String> {
    let url = config.database_url();
    if url.starts_with("postgres") {
        let pool = sqlx::PgPool::connect(&url).await.unwrap();
        let out = sqlx::query(sql).execute(&pool).await;
        pool.close().await;
        return out.map(|d| d.rows_affected()).map_err(|e| e.to_string());
    }
    let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
    let out = sqlx::query(sql).execute(&pool).await;
    pool.close().await;
    out.map(|d| d.rows_affected()).map_err(|e| e.to_string())
}

/// A manual clock that stands at the wall clock's time now (so that times the tests compute
/// from the wall clock, such as deadlines, still read as the broker's) until moved.
pub fn manual_clock() -> Clock {
    Clock::manual(Clock::system().now())
}

impl TestApp {
    pub async fn spawn() -> TestApp {
        TestApp::spawn_with(|_| {}, |_| switchyard_broker::app::ProviderSet::default()).await
    }

    /// The default TestApp on a manual clock: time passes only when the test moves it.
    pub async fn spawn_manual() -> TestApp {
        TestApp::spawn_with_clock(
            manual_clock(),
            |_| {},
            |_| switchyard_broker::app::ProviderSet::default(),
        )
        .await
    }

    /// A TestApp whose config `tweak` may change, with providers built from that config.
    pub async fn spawn_with(
        tweak: impl FnOnce(&mut Config),
        providers: impl FnOnce(&Config) -> switchyard_broker::app::ProviderSet,
    ) -> TestApp {
        TestApp::spawn_with_clock(Clock::system(), tweak, providers).await
    }

    /// [`TestApp::spawn_with`] reading the time from `clock`.
    pub async fn spawn_with_clock(
        clock: Clock,
        tweak: impl FnOnce(&mut Config),
        providers: impl FnOnce(&Config) -> switchyard_broker::app::ProviderSet,
    ) -> TestApp {
        let dir = tempfile::tempdir().unwrap();
        let mut config = test_config(dir.path());
        tweak(&mut config);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        config.public_url = Some(url.clone());
        let providers = providers(&config);
        let running = App::start_with_clock(config, providers, clock)
            .await
            .unwrap();
        let admin = running.created_admin_token.clone().unwrap();
        let app = running.app.clone();
        tokio::spawn(switchyard_broker::http::server::serve(
            running.app,
            listener,
            std::future::pending(),
        ));
        TestApp {
            url,
            admin,
            app,
            // Idle connections dropped before the broker closes them (header_timeout_ms):
            // polls spaced ~10 s apart raced the close and got a reset.
            http: reqwest::Client::builder()
                .pool_idle_timeout(switchyard_support::http::POOL_IDLE_TIMEOUT)
                .build()
                .expect("an HTTP client"),
            _dir: dir,
        }
    }

    /// Moves the broker's manual clock forward by `by`: leases, idle TTLs, budget windows and
    /// tokens see that much time pass; the ledger and the burst controller run a pass at once,
    /// the scheduler at its next tick.
    pub fn advance(&self, by: Duration) {
        self.app.clock.advance(by);
    }

    pub async fn call(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> Response {
        let mut req = self.http.request(method, format!("{}{path}", self.url));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let res = req.send().await.unwrap();
        let status = res.status();
        let text = res.text().await.unwrap();
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Response { status, body }
    }

    pub async fn raw(
        &self,
        path: &str,
        token: &str,
        content_type: &str,
        body: Vec<u8>,
    ) -> Response {
        let res = self
            .http
            .post(format!("{}{path}", self.url))
            .bearer_auth(token)
            .header("content-type", content_type)
            .body(body)
            .send()
            .await
            .unwrap();
        let status = res.status();
        let text = res.text().await.unwrap();
        Response {
            status,
            body: serde_json::from_str(&text).unwrap_or(Value::String(text)),
        }
    }

    pub async fn token(&self, role: &str, team: Option<&str>) -> String {
        let r = self
            .call(
                Method::POST,
                "/api/v1/tokens",
                Some(&self.admin),
                Some(json!({"role": role, "team": team})),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
        r.body["token"].as_str().unwrap().to_string()
    }

    pub async fn submit(&self, token: &str, spec: Value) -> Response {
        self.call(Method::POST, "/api/v1/jobs", Some(token), Some(spec))
            .await
    }

    pub async fn job(&self, token: &str, id: &str) -> Response {
        self.call(
            Method::GET,
            &format!("/api/v1/jobs/{id}"),
            Some(token),
            None,
        )
        .await
    }

    pub async fn job_count(&self) -> usize {
        let r = self
            .call(
                Method::GET,
                "/api/v1/jobs?limit=500",
                Some(&self.admin),
                None,
            )
            .await;
        r.body["jobs"].as_array().unwrap().len()
    }

    /// Polls a job until `pred` holds or `timeout` passes.
    pub async fn wait_for_job(
        &self,
        token: &str,
        id: &str,
        timeout: Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let r = self.job(token, id).await;
            if pred(&r.body) {
                return r.body;
            }
            if tokio::time::Instant::now() > deadline {
                panic!(
                    "job {id} did not reach the expected state in {timeout:?}: {}",
                    r.body
                );
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Registers a hand-driven agent with an enrolment token it was given (a burst instance).
    pub async fn agent_with_token(&self, enrol: &str, gpus: u32) -> TestAgent {
        let r = self
            .call(
                Method::POST,
                "/agent/v1/register",
                Some(enrol),
                Some(register_body(gpus)),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
        TestAgent {
            token: r.body["agent_token"].as_str().unwrap().to_string(),
            node: r.body["node_id"].as_str().unwrap().to_string(),
            enrol: enrol.to_string(),
        }
    }

    /// A fresh one-time enrolment token for the test pool.
    pub async fn enrolment_token(&self) -> String {
        let r = self
            .call(
                Method::POST,
                "/api/v1/enrolment-tokens",
                Some(&self.admin),
                Some(json!({"pool": POOL})),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
        r.body["token"].as_str().unwrap().to_string()
    }

    /// Registers a hand-driven agent in the test pool.
    pub async fn agent(&self, gpus: u32) -> TestAgent {
        let enrol = self.enrolment_token().await;
        self.agent_with_token(&enrol, gpus).await
    }
}

/// A registration body (its one-time token goes in `Authorization`).
pub fn register_body(gpus: u32) -> Value {
    let gpus: Vec<Value> = (0..gpus)
        .map(|i| json!({"index": i, "uuid": format!("GPU-fake-{i}"), "model": "H100", "memory_mb": 81920}))
        .collect();
    json!({
        "hostname": "test-host",
        "agent_version": "test",
        "inventory": {"gpus": gpus, "cpus": 8, "memory_mb": 65536, "simulated": true}
    })
}

pub struct TestAgent {
    pub token: String,
    pub node: String,
    pub enrol: String,
}

pub fn job_spec(team: &str) -> Value {
    json!({"name": "t", "team": team, "command": ["true"], "resources": {"gpus": 1}})
}

/// A region for test cloud pools.
pub fn cloud_region(id: &str) -> switchyard_broker::config::RegionConfig {
    RegionConfig {
        id: id.into(),
        latitude: None,
        longitude: None,
        latency_ms: 20,
        egress_per_gb_usd: 0.09,
        ingress_gbps: 10,
    }
}

/// A launchable pool of 8-GPU H100 nodes.
pub fn cloud_pool(id: &str, region: &str, price: f64) -> PoolConfig {
    PoolConfig {
        id: id.into(),
        region: region.into(),
        gpu_model: "H100".into(),
        gpus_per_node: 8,
        gpu_memory_gb: 80,
        vcpus: 0,
        memory_gb: 0,
        price_per_gpu_hour_usd: price,
        marginal_usd_per_gpu_hour: None,
        node_limit: 2,
        launchable: true,
        boot_time_s: 60,
    }
}

/// AWS us-east-1 from the bundled catalogue with p5.48xlarge only (8 H100s: $55.04/h on
/// demand, about $20.08/h on spot), `node_limit` instances at most, 60 s boot.
pub fn aws_p5_catalogue(node_limit: u32) -> switchyard_broker::config::CatalogueRegion {
    switchyard_broker::config::CatalogueRegion {
        id: "aws:us-east-1".into(),
        instance_types: vec!["p5.48xlarge".into()],
        latency_ms: 40,
        egress_per_gb_usd: 0.09,
        node_limit,
        boot_time_s: 60,
    }
}

/// The cheaper of [`spawn_two_clouds`]' launchable pools (aws, $4/h) and the dearer (gcp, $5/h).
pub const CHEAP: &str = "aws:test-east/gpu8";
pub const DEAR: &str = "gcp:test-west/gpu8";

/// A broker with no on-prem nodes and two launchable cloud pools ([`CHEAP`], [`DEAR`]) behind
/// one fake provider; instances idle for 1 s are released, with no minimum billed time.
pub async fn spawn_two_clouds(
    tweak: impl FnOnce(&mut Config),
) -> (
    TestApp,
    std::sync::Arc<switchyard_providers::fake::FakeProvider>,
) {
    spawn_two_clouds_on(Clock::system(), tweak).await
}

/// [`spawn_two_clouds`] reading the time from `clock`.
pub async fn spawn_two_clouds_on(
    clock: Clock,
    tweak: impl FnOnce(&mut Config),
) -> (
    TestApp,
    std::sync::Arc<switchyard_providers::fake::FakeProvider>,
) {
    spawn_with_fake_on(clock, |c| {
        c.idle_ttl_s = 1;
        c.min_billed_s = 0;
        c.regions.push(cloud_region("aws:test-east"));
        c.regions.push(cloud_region("gcp:test-west"));
        c.pools.push(cloud_pool(CHEAP, "aws:test-east", 4.0));
        c.pools.push(cloud_pool(DEAR, "gcp:test-west", 5.0));
        tweak(c);
    })
    .await
}

/// A job that cannot wait (2 H100s, 10 min, a deadline in an hour, no spot): with no on-prem
/// capacity it must burst.
pub fn urgent(name: &str) -> Value {
    let deadline =
        switchyard_broker::clock::to_datetime(Clock::system().now().plus_secs(3600)).to_rfc3339();
    json!({"name": name, "team": "ml", "command": ["true"], "resources": {"gpus": 2, "gpu_models": ["H100"]},
           "estimated_runtime_s": 600, "deadline": deadline, "spot": "never"})
}

/// A bursting broker whose launchable pools (those `tweak` configures) are served by one
/// scripted fake provider, returned alongside. Leases are long: the tests' hand-played agents
/// do not heartbeat, and only the paths under test may end their work.
pub async fn spawn_with_fake(
    tweak: impl FnOnce(&mut Config),
) -> (
    TestApp,
    std::sync::Arc<switchyard_providers::fake::FakeProvider>,
) {
    spawn_with_fake_on(Clock::system(), tweak).await
}

/// [`spawn_with_fake`] reading the time from `clock`.
pub async fn spawn_with_fake_on(
    clock: Clock,
    tweak: impl FnOnce(&mut Config),
) -> (
    TestApp,
    std::sync::Arc<switchyard_providers::fake::FakeProvider>,
) {
    spawn_with_fake_checked(clock, Ok(()), tweak).await
}

/// [`spawn_with_fake_on`] with the fake's credentials check at start recorded as `credentials`
/// (as `serve` records it: an `Err` makes its pools unlaunchable).
pub async fn spawn_with_fake_checked(
    clock: Clock,
    credentials: Result<(), String>,
    tweak: impl FnOnce(&mut Config),
) -> (
    TestApp,
    std::sync::Arc<switchyard_providers::fake::FakeProvider>,
) {
    use std::sync::{Arc, Mutex};
    use switchyard_providers::fake::FakeProvider;
    let slot: Arc<Mutex<Option<Arc<FakeProvider>>>> = Arc::default();
    let out = slot.clone();
    let now = clock.now();
    let app = TestApp::spawn_with_clock(
        clock,
        |c| {
            c.burst_enabled = true;
            c.lease_ttl_s = 600;
            tweak(c);
        },
        move |config| {
            let offers = switchyard_broker::app::catalogue_from_config(config, now).unwrap();
            let pools: Vec<_> = offers
                .iter()
                .flat_map(|(_, p)| p.clone())
                .filter(|p| p.launchable)
                .collect();
            let fake = Arc::new(FakeProvider::new(
                "fake",
                switchyard_providers::Offers {
                    regions: offers.iter().map(|(r, _)| r.clone()).collect(),
                    pools: pools.clone(),
                },
            ));
            *slot.lock().unwrap() = Some(fake.clone());
            let mut set = switchyard_broker::app::ProviderSet::default();
            set.add(fake, pools.into_iter().map(|p| p.id));
            // As `serve` records the credentials check (`GET /regions` shows it).
            set.set_credentials("fake", credentials);
            set
        },
    )
    .await;
    let fake = out.lock().unwrap().take().unwrap();
    (app, fake)
}

/// Every instance the broker knows, as the API shows it.
pub async fn instances(app: &TestApp) -> Vec<Value> {
    let r = app
        .call(Method::GET, "/api/v1/instances", Some(&app.admin), None)
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    r.body["instances"].as_array().unwrap().clone()
}

/// Waits until the burst controller has seen a live instance idle (it stamps `idle_since` at a
/// pass): from then on, a manual clock moved past the idle TTL gets it released.
pub async fn seen_idle(app: &TestApp) {
    eventually(
        "the burst controller to see an instance idle",
        20,
        async || {
            let live = app.app.store.instances(false).await.unwrap();
            live.iter().any(|i| i.idle_since.is_some()).then_some(())
        },
    )
    .await;
}

/// Polls `f` every 50 ms until it returns `Some`, or fails after `secs`.
pub async fn eventually<T>(what: &str, secs: u64, mut f: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The scheduler's rounds so far (`switchyard_placement_seconds_count`: one per plan; it plans
/// every tick while a job is pending). Two more rounds than when the test set the clock: the
/// scheduler has planned at that time.
pub async fn scheduler_rounds(app: &TestApp) -> u64 {
    let text = app
        .http
        .get(format!("{}/metrics", app.url))
        .bearer_auth(&app.admin)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("switchyard_placement_seconds_count "))
        .map_or(0, |n| n.parse().unwrap())
}

/// One long-poll for `agent`'s work (leases and stops), waiting at most `wait_s`.
pub async fn work(app: &TestApp, agent: &TestAgent, wait_s: u64) -> Value {
    let r = app
        .call(
            Method::GET,
            &format!("/agent/v1/work?wait_s={wait_s}"),
            Some(&agent.token),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    r.body
}

/// Posts `events` as `agent`; returns each event's result (`accepted`, `duplicate`, …).
pub async fn events(app: &TestApp, agent: &TestAgent, events: Value) -> Vec<String> {
    let r = app
        .call(
            Method::POST,
            "/agent/v1/events",
            Some(&agent.token),
            Some(json!({ "events": events })),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    r.body["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["status"].as_str().unwrap().to_string())
        .collect()
}

/// Waits (long-polling `wait_s` at a time, 20 s in all) for the lease of `job` on `agent` and
/// reports it started; returns its attempt.
pub async fn start_leased(app: &TestApp, agent: &TestAgent, job: &str, wait_s: u64) -> Value {
    let attempt = eventually("the job's lease", 20, async || {
        let w = work(app, agent, wait_s).await;
        w["leases"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["attempt"]["job_id"] == job)
            .map(|l| l["attempt"].clone())
    })
    .await;
    let r = events(
        app,
        agent,
        json!([{"type": "started", "attempt": attempt, "pid": 1}]),
    )
    .await;
    assert_eq!(r, ["accepted"]);
    attempt
}

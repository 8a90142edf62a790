//! The services gateway: the data path of inference services. `switchyard gateway` runs one
//! as its own process, one per region ([`standalone`]); `up` and `serve` run one in-process on
//! its own port (`gateway_listen`, [`serve`]). A service's endpoint is
//! `http://GATEWAY/svc/TEAM/NAME/`. Both kinds are the same code; only their [`Source`]
//! differs: the broker's store in-process, the broker's REST API (`/api/v1/gateway/…`) for
//! the standalone one, which never touches the database.
//!
//! - **Routes** ([`GatewayRoutes`]) are read again every [`REFRESH`] (in-process) or
//!   [`REFRESH_REMOTE`]: each live service's running replicas with the address their agent
//!   reported and their region, the regions' catalogue latencies, and the hashes of the
//!   tokens that may call services. When the broker cannot be reached, the gateway keeps
//!   routing on the last routes it read. A replica gets new requests only while it is ready
//!   and not draining; one that is draining finishes what it has.
//! - **Routing:** nearest region first: among the ready replicas, those whose region is
//!   nearest the gateway's (its own, then by catalogue latency); within them the one with
//!   the fewest requests in flight; farther regions only when the nearer ones are all at the
//!   concurrency bound. A request whose connection to a replica failed before anything was
//!   sent is tried once more on another. Responses stream through (chunked, SSE) without
//!   buffering; request bodies are read first (up to [`MAX_BODY`]) so that the retry can
//!   resend them.
//! - **Queueing:** at `scaling.max_concurrency_per_replica` on every ready replica, a request
//!   waits (up to [`QUEUE_WAIT`]) in a bounded queue; when that is full, or nothing became
//!   free in time, the answer is 503 with `Retry-After`.
//! - **Auth:** a bearer token of the service's team, an admin token, or an invoke token of
//!   this service; none for a `public` service. Checked against the routes' token hashes (a
//!   revoked token stops working at the next refresh). The token is not passed on.
//! - **Reports:** every answer's latency (to its first byte) and whether it failed, per
//!   service and replica, go into the [`meter::Meter`]; every [`meter::REPORT_EVERY`] the
//!   gateway reports them with each replica's requests in flight, and the brokers read the
//!   reports into [`traffic::Traffic`] (the service view, the autoscaler, the reconciler).
//! - **Traces:** each request is a span (`gateway request`: service, replica, status,
//!   latency), exported when tracing is on, a child of the caller's `traceparent`; the
//!   replica gets the span's own `traceparent`.
//!
//! It decides nothing about replicas: the reconciler (`control/services.rs`) does.

pub mod meter;
pub mod traffic;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};
use switchyard_core::{JobId, Timestamp};
use switchyard_protocol::api::ServiceSpec;
use switchyard_protocol::gateway::{
    GatewayRegion, GatewayReplica, GatewayReport, GatewayRoutes, GatewayService, GrantScope,
    TrafficSecond,
};
use switchyard_support::telemetry;
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tracing::Instrument;
use uuid::Uuid;

use crate::clock::Clock;
use crate::http::auth::hash_token;
use crate::state::App;
use crate::store::{Store, StoreError};

/// How often the in-process gateway reads the routes again.
pub const REFRESH: Duration = Duration::from_millis(500);
/// How often a standalone gateway asks the broker for the routes.
pub const REFRESH_REMOTE: Duration = Duration::from_secs(1);
/// The largest request body passed on.
pub const MAX_BODY: usize = 16 * 1024 * 1024;
/// How long a request waits in a service's queue for a free replica.
pub const QUEUE_WAIT: Duration = Duration::from_secs(30);
/// Requests a service's queue holds per ready replica (at least [`QUEUE_MIN`]).
pub const QUEUE_PER_REPLICA: usize = 32;
pub const QUEUE_MIN: usize = 64;
/// How late a replica's requests in flight may reach a broker's [`traffic::Traffic`] at
/// most: a route refresh (the gateway learns of a drain), a report, a broker's read of the
/// reports. The reconciler waits at least this long on a draining replica.
pub const IN_FLIGHT_LAG: Duration = Duration::from_secs(4);

/// A replica requests may go to.
pub struct Upstream {
    pub job: JobId,
    pub address: String,
    pub ready: bool,
    pub draining: bool,
    /// How far its region is from the gateway's: 0 for the same region (or a gateway that
    /// knows no region), else the sum of both regions' catalogue latencies; `u32::MAX` for a
    /// region the catalogue does not describe.
    pub distance: u32,
    /// Requests in flight on it through this gateway: one counter per replica, carried from
    /// each refresh's routes to the next, so a request that began before a refresh is counted
    /// off when it ends after it.
    pub in_flight: Arc<AtomicUsize>,
}

/// A service as the gateway routes it.
pub struct Route {
    pub id: Uuid,
    pub team: String,
    pub name: String,
    pub public: bool,
    pub max_concurrency: Option<usize>,
    pub upstreams: Vec<Arc<Upstream>>,
    /// Requests waiting for a free replica.
    pub waiting: AtomicUsize,
    /// Told when a request ends or the routes change.
    pub freed: Notify,
}

/// The routes and who may call them, replaced whole at each refresh.
#[derive(Default)]
struct Table {
    routes: HashMap<(String, String), Arc<Route>>,
    grants: HashMap<String, GrantScope>,
    /// Whether routes were ever read (until then every service is unknown).
    loaded: bool,
    /// Replicas gone from the routes (their service deleted, their job ended) with requests
    /// still in flight: counted in reports until those end, so that the reconciler waits for
    /// them before it stops the replica.
    retiring: Vec<(Uuid, JobId, Arc<AtomicUsize>)>,
}

/// Where a gateway reads its routes and sends its reports.
pub enum Source {
    /// In-process (`up`, `serve`): this broker's store.
    Store(App),
    /// `switchyard gateway`: the broker's REST API, with an `admin` or `infra` token.
    Http {
        client: reqwest::Client,
        /// The broker's URL, without a trailing `/`.
        broker: String,
        token: String,
    },
}

impl Source {
    async fn routes(&self) -> anyhow::Result<GatewayRoutes> {
        match self {
            Source::Store(app) => Ok(routes_from_store(&app.store).await?),
            Source::Http {
                client,
                broker,
                token,
            } => {
                let answer = client
                    .get(format!("{broker}/api/v1/gateway/routes"))
                    .bearer_auth(token)
                    .send()
                    .await?
                    .error_for_status()?;
                Ok(answer.json().await?)
            }
        }
    }

    /// Delivers `rows`; `Ok` once the broker has committed them.
    async fn report(&self, gateway: &str, rows: Vec<TrafficSecond>) -> anyhow::Result<()> {
        match self {
            Source::Store(app) => {
                let now = app.clock.now();
                store_report(&app.store, gateway, &rows, now).await?;
                Ok(())
            }
            Source::Http {
                client,
                broker,
                token,
            } => {
                let report = GatewayReport {
                    gateway: gateway.to_string(),
                    seconds: rows,
                };
                client
                    .post(format!("{broker}/api/v1/gateway/reports"))
                    .bearer_auth(token)
                    .json(&report)
                    .send()
                    .await?
                    .error_for_status()?;
                Ok(())
            }
        }
    }
}

/// The routes as the store holds them: what `GET /gateway/routes` answers and what the
/// in-process gateway reads.
pub async fn routes_from_store(store: &Store) -> Result<GatewayRoutes, StoreError> {
    let (services, rows) = store.gateway_routes().await?;
    let regions = store.regions().await?;
    let grants = store.gateway_grants().await?;
    let services = services
        .into_iter()
        .map(|s| {
            let spec: Option<ServiceSpec> = serde_json::from_str(&s.spec_json).ok();
            GatewayService {
                id: s.service,
                public: spec.as_ref().is_some_and(|s| s.public),
                max_concurrency: spec
                    .as_ref()
                    .and_then(|s| s.scaling.as_ref())
                    .and_then(|s| s.max_concurrency_per_replica)
                    .and_then(|n| u32::try_from(n).ok()),
                replicas: rows
                    .iter()
                    .filter(|r| r.service == s.service)
                    .map(|r| GatewayReplica {
                        job: r.job.0,
                        address: r.address.clone(),
                        ready: r.ready,
                        draining: r.draining,
                        region: r.region.clone(),
                    })
                    .collect(),
                team: s.team,
                name: s.name,
            }
        })
        .collect();
    Ok(GatewayRoutes {
        services,
        regions: regions
            .into_iter()
            .map(|r| GatewayRegion {
                id: r.id.to_string(),
                latency_ms: r.latency_ms,
            })
            .collect(),
        grants,
    })
}

/// How long report rows are kept in the store.
pub const REPORTS_KEPT_MS: i64 = traffic::KEEP_S * 1000;

/// Stores a gateway's report rows (taken once each), forgetting rows older than
/// [`REPORTS_KEPT_MS`]; returns how many were new.
pub async fn store_report(
    store: &Store,
    gateway: &str,
    rows: &[TrafficSecond],
    now: Timestamp,
) -> Result<u64, StoreError> {
    store
        .insert_gateway_report(
            gateway,
            rows,
            now,
            Timestamp(now.millis() - REPORTS_KEPT_MS),
        )
        .await
}

/// The gateway's state: its source, the routes, the meter.
pub struct Gateway {
    source: Source,
    clock: Clock,
    /// This process, in reports: its region, address and a random suffix.
    id: String,
    region: Option<String>,
    table: RwLock<Table>,
    client: reqwest::Client,
    meter: Arc<meter::Meter>,
}

impl Gateway {
    pub fn new(
        source: Source,
        clock: Clock,
        region: Option<String>,
        listen: &str,
    ) -> anyhow::Result<Arc<Gateway>> {
        let client = reqwest::Client::builder()
            .no_proxy()
            .connect_timeout(Duration::from_secs(2))
            .pool_idle_timeout(switchyard_support::http::POOL_IDLE_TIMEOUT)
            .build()?;
        let mut bytes = [0u8; 4];
        rand::RngCore::fill_bytes(&mut rand::rng(), &mut bytes);
        let suffix = hex::encode(bytes);
        let id = format!(
            "{}/{listen}/{suffix}",
            region.as_deref().unwrap_or("any-region")
        );
        Ok(Arc::new(Gateway {
            source,
            clock,
            id,
            region,
            table: RwLock::default(),
            client,
            meter: Arc::default(),
        }))
    }

    /// The name this gateway reports under.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Reads the routes again; on failure the last ones stay.
    pub async fn refresh(&self) -> anyhow::Result<()> {
        let doc = self.source.routes().await?;
        self.install(doc);
        Ok(())
    }

    /// Replaces the routes with `doc`'s, keeping each replica's in-flight count.
    fn install(&self, doc: GatewayRoutes) {
        let latency: HashMap<&str, u32> = doc
            .regions
            .iter()
            .map(|r| (r.id.as_str(), r.latency_ms))
            .collect();
        let own = self.region.as_deref();
        let distance = |region: &str| -> u32 {
            match own {
                None => 0,
                Some(own) if own == region => 0,
                Some(own) => match (latency.get(own), latency.get(region)) {
                    (Some(a), Some(b)) => a.saturating_add(*b),
                    _ => u32::MAX,
                },
            }
        };
        let (old, old_retiring) = {
            let table = self.table.read().unwrap_or_else(|e| e.into_inner());
            (table.routes.clone(), table.retiring.clone())
        };
        let mut next = HashMap::new();
        for s in doc.services {
            let key = (s.team.clone(), s.name.clone());
            let previous = old.get(&key).filter(|r| r.id == s.id);
            let upstreams = s
                .replicas
                .iter()
                .map(|r| {
                    let job = JobId(r.job);
                    let in_flight = previous
                        .and_then(|p| p.upstreams.iter().find(|u| u.job == job))
                        .map(|u| Arc::clone(&u.in_flight))
                        .unwrap_or_default();
                    Arc::new(Upstream {
                        job,
                        address: r.address.clone(),
                        ready: r.ready,
                        draining: r.draining,
                        distance: distance(&r.region),
                        in_flight,
                    })
                })
                .collect();
            let route = Arc::new(Route {
                id: s.id,
                team: s.team,
                name: s.name,
                public: s.public,
                max_concurrency: s
                    .max_concurrency
                    .and_then(|n| usize::try_from(n).ok())
                    .filter(|n| *n > 0),
                upstreams,
                waiting: AtomicUsize::new(0),
                freed: Notify::new(),
            });
            next.insert(key, route);
        }
        let grants = doc
            .grants
            .into_iter()
            .map(|g| (g.token_hash, g.scope))
            .collect();
        let present: std::collections::HashSet<JobId> = next
            .values()
            .flat_map(|r: &Arc<Route>| r.upstreams.iter().map(|u| u.job))
            .collect();
        let mut retiring: Vec<(Uuid, JobId, Arc<AtomicUsize>)> = Vec::new();
        let gone = old_retiring.into_iter().chain(old.values().flat_map(|r| {
            r.upstreams
                .iter()
                .map(|u| (r.id, u.job, Arc::clone(&u.in_flight)))
        }));
        for (service, job, n) in gone {
            if !present.contains(&job)
                && n.load(Ordering::SeqCst) > 0
                && !retiring.iter().any(|(_, j, _)| *j == job)
            {
                retiring.push((service, job, n));
            }
        }
        *self.table.write().unwrap_or_else(|e| e.into_inner()) = Table {
            routes: next,
            grants,
            loaded: true,
            retiring,
        };
        // Waiters look again at the new routes (they hold the old ones).
        for route in old.values() {
            route.freed.notify_waiters();
        }
    }

    fn route(&self, team: &str, name: &str) -> Option<Arc<Route>> {
        let table = self.table.read().unwrap_or_else(|e| e.into_inner());
        table
            .routes
            .get(&(team.to_string(), name.to_string()))
            .cloned()
    }

    /// Whether routes were ever read.
    pub fn loaded(&self) -> bool {
        self.table.read().unwrap_or_else(|e| e.into_inner()).loaded
    }

    /// Whether the caller may call `route`: its team's token, an admin's, or an invoke token
    /// of this service.
    fn allowed(
        &self,
        route: &Route,
        headers: &HeaderMap,
    ) -> Result<(), (StatusCode, &'static str)> {
        if route.public {
            return Ok(());
        }
        let Some(token) = crate::http::auth::bearer_of(headers) else {
            return Err((StatusCode::UNAUTHORIZED, "a bearer token is required"));
        };
        let hash = hash_token(token);
        let table = self.table.read().unwrap_or_else(|e| e.into_inner());
        match table.grants.get(&hash) {
            None => Err((StatusCode::UNAUTHORIZED, "unknown or revoked token")),
            Some(GrantScope::Admin) => Ok(()),
            Some(GrantScope::Team { team }) if *team == route.team => Ok(()),
            Some(GrantScope::Service { service }) if *service == route.id => Ok(()),
            Some(_) => Err((
                StatusCode::FORBIDDEN,
                "this token may not call this service",
            )),
        }
    }

    /// Each replica's requests in flight now, as (service, replica, count).
    fn in_flight(&self) -> Vec<(Uuid, JobId, usize)> {
        let table = self.table.read().unwrap_or_else(|e| e.into_inner());
        table
            .routes
            .values()
            .flat_map(|r| {
                r.upstreams
                    .iter()
                    .map(|u| (r.id, u.job, u.in_flight.load(Ordering::SeqCst)))
            })
            .chain(
                table
                    .retiring
                    .iter()
                    .map(|(s, j, n)| (*s, *j, n.load(Ordering::SeqCst))),
            )
            .collect()
    }

    /// Closes the meter into a report and delivers every report not yet taken.
    pub async fn report(&self) -> anyhow::Result<()> {
        let rows = self.meter.close(self.clock.now(), &self.in_flight());
        let Some(through) = rows.iter().map(|r| r.batch).max() else {
            return Ok(());
        };
        self.source.report(&self.id, rows).await?;
        self.meter.acknowledged(through);
        Ok(())
    }
}

/// The in-process gateway of `up` and `serve`: routes from this broker's store, in the region
/// of `gateway_region`, on `listener` until `shutdown` resolves.
pub async fn serve(
    app: App,
    listener: TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let listen = listener.local_addr()?.to_string();
    let region = app.config.gateway_region.clone();
    let clock = app.clock.clone();
    let gateway = Gateway::new(Source::Store(app), clock, region, &listen)?;
    run(gateway, listener, REFRESH, shutdown).await
}

/// What `switchyard gateway` is told.
#[derive(Clone, Debug)]
pub struct StandaloneOptions {
    /// The broker's URL (`http://127.0.0.1:8080`).
    pub broker: String,
    /// An `admin` or `infra` API token.
    pub token: String,
    /// The region it serves (`provider:code`).
    pub region: Option<String>,
    /// For an https broker with a private CA.
    pub ca_cert: Option<std::path::PathBuf>,
}

/// `switchyard gateway`: the gateway as its own process, routes and reports over the broker's
/// REST API, on `listener` until `shutdown` resolves.
pub async fn standalone(
    opts: StandaloneOptions,
    listener: TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let mut builder = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .connect_timeout(Duration::from_secs(3))
        .pool_idle_timeout(switchyard_support::http::POOL_IDLE_TIMEOUT);
    if let Some(path) = &opts.ca_cert {
        let pem =
            std::fs::read(path).map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
        for cert in reqwest::Certificate::from_pem_bundle(&pem)? {
            builder = builder.add_root_certificate(cert);
        }
    }
    let source = Source::Http {
        client: builder.build()?,
        broker: opts.broker.trim_end_matches('/').to_string(),
        token: opts.token,
    };
    let listen = listener.local_addr()?.to_string();
    let gateway = Gateway::new(source, Clock::system(), opts.region, &listen)?;
    run(gateway, listener, REFRESH_REMOTE, shutdown).await
}

/// The refresher, the reporter and the HTTP server of `gateway`.
pub async fn run(
    gateway: Arc<Gateway>,
    listener: TcpListener,
    every: Duration,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let refresher = {
        let gateway = gateway.clone();
        tokio::spawn(async move {
            let mut failing = false;
            loop {
                match gateway.refresh().await {
                    Ok(()) if failing => {
                        tracing::info!("gateway routes read again");
                        failing = false;
                    }
                    Ok(()) => {}
                    // Once per outage: the last routes stay in use meanwhile.
                    Err(e) if !failing => {
                        tracing::warn!(error = %e, "gateway routes refresh failed; routing on the last ones");
                        failing = true;
                    }
                    Err(_) => {}
                }
                tokio::time::sleep(every).await;
            }
        })
    };
    let reporter = {
        let gateway = gateway.clone();
        tokio::spawn(async move {
            let mut failing = false;
            loop {
                tokio::time::sleep(meter::REPORT_EVERY).await;
                match gateway.report().await {
                    Ok(()) => failing = false,
                    Err(e) if !failing => {
                        tracing::warn!(error = %e, unsent = gateway.meter.unsent(),
                            "gateway report not delivered; it is kept for the next try");
                        failing = true;
                    }
                    Err(_) => {}
                }
            }
        })
    };
    let router = Router::new()
        .route("/svc/{team}/{name}", any(proxy_root))
        .route("/svc/{team}/{name}/", any(proxy_root))
        .route("/svc/{team}/{name}/{*rest}", any(proxy))
        .with_state(gateway.clone());
    let served = axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await;
    refresher.abort();
    reporter.abort();
    // What the last second saw, once more.
    if let Err(e) = gateway.report().await {
        tracing::debug!(error = %e, "the last gateway report was not delivered");
    }
    Ok(served?)
}

async fn proxy_root(
    State(gw): State<Arc<Gateway>>,
    Path((team, name)): Path<(String, String)>,
    request: Request,
) -> Response {
    forward(gw, team, name, String::new(), request).await
}

async fn proxy(
    State(gw): State<Arc<Gateway>>,
    Path((team, name, rest)): Path<(String, String, String)>,
    request: Request,
) -> Response {
    forward(gw, team, name, rest, request).await
}

fn plain(status: StatusCode, message: &str) -> Response {
    (status, format!("{message}\n")).into_response()
}

fn busy(message: &str) -> Response {
    let mut r = plain(StatusCode::SERVICE_UNAVAILABLE, message);
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    r
}

/// Takes a replica with room: in the nearest region that has one, the one with the fewest
/// requests in flight; waits in the service's queue when every ready replica is at its
/// concurrency bound. Each look reads the latest routes (a refresh replaces them), so a
/// replica that became ready while the request waited is seen.
async fn acquire(
    gw: &Gateway,
    queue: &Arc<Route>,
    exclude: Option<JobId>,
) -> Result<(Arc<Route>, Arc<Upstream>), Response> {
    let deadline = tokio::time::Instant::now() + QUEUE_WAIT;
    let mut queued = false;
    let result = loop {
        let latest = gw
            .route(&queue.team, &queue.name)
            .filter(|r| r.id == queue.id);
        let route = latest.unwrap_or_else(|| Arc::clone(queue));
        let ready: Vec<&Arc<Upstream>> = route
            .upstreams
            .iter()
            .filter(|u| u.ready && !u.draining && Some(u.job) != exclude)
            .collect();
        if let Some(u) = pick(&ready, route.max_concurrency) {
            u.in_flight.fetch_add(1, Ordering::SeqCst);
            break Ok((Arc::clone(&route), Arc::clone(u)));
        }
        if exclude.is_some() {
            // A retry does not queue: there is no other replica now.
            break Err(busy("no other ready replica"));
        }
        if !queued {
            let cap = (ready.len() * QUEUE_PER_REPLICA).max(QUEUE_MIN);
            let depth = queue.waiting.fetch_add(1, Ordering::SeqCst);
            if depth >= cap {
                queue.waiting.fetch_sub(1, Ordering::SeqCst);
                return Err(busy("the service's queue is full"));
            }
            gw.meter.queued(queue.id, gw.clock.now(), depth + 1);
            queued = true;
        }
        // Requests that end, and new routes, wake the queue; look again at least every 100 ms
        // (a request ending on the routes of a later refresh wakes that `Route`'s waiters).
        let wait = route.freed.notified();
        let tick = tokio::time::sleep(Duration::from_millis(100));
        tokio::select! {
            () = wait => {}
            () = tick => {}
            () = tokio::time::sleep_until(deadline) => {
                break Err(busy(if ready.is_empty() {
                    "no replica of the service is ready"
                } else {
                    "every replica is busy"
                }));
            }
        }
    };
    if queued {
        queue.waiting.fetch_sub(1, Ordering::SeqCst);
    }
    result
}

/// The replica a request goes to among `ready`: the nearest region with one below `max` in
/// flight, then the fewest in flight, then the first listed (`None`: all are at the bound).
fn pick<'a>(ready: &[&'a Arc<Upstream>], max: Option<usize>) -> Option<&'a Arc<Upstream>> {
    ready
        .iter()
        .copied()
        .filter(|u| max.is_none_or(|max| u.in_flight.load(Ordering::SeqCst) < max))
        .min_by_key(|u| (u.distance, u.in_flight.load(Ordering::SeqCst)))
}

/// Gives a replica's slot back when the response (or the failure) is done with it; the meter
/// counts the time it was held.
struct Slot {
    upstream: Arc<Upstream>,
    route: Arc<Route>,
    meter: Arc<meter::Meter>,
}

impl Slot {
    fn new(upstream: &Arc<Upstream>, route: &Arc<Route>, meter: &Arc<meter::Meter>) -> Slot {
        meter.began(route.id);
        Slot {
            upstream: Arc::clone(upstream),
            route: Arc::clone(route),
            meter: Arc::clone(meter),
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.upstream.in_flight.fetch_sub(1, Ordering::SeqCst);
        self.meter.ended(self.route.id);
        self.route.freed.notify_one();
    }
}

/// A request's latency, recorded once: at the first byte of its answer's body (for a streamed
/// answer, its first token), when it fails, or when the answer is dropped unread.
struct FirstByte {
    gw: Arc<Gateway>,
    service: Uuid,
    job: JobId,
    started: Instant,
    server_error: bool,
}

impl FirstByte {
    fn record(mut self, error: bool) {
        self.server_error |= error;
    }
}

impl Drop for FirstByte {
    fn drop(&mut self) {
        self.gw.meter.record(
            self.service,
            Some(self.job),
            self.gw.clock.now(),
            self.started.elapsed(),
            self.server_error,
        );
    }
}

const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");

async fn forward(
    gw: Arc<Gateway>,
    team: String,
    name: String,
    rest: String,
    request: Request,
) -> Response {
    let Some(route) = gw.route(&team, &name) else {
        let why = if gw.loaded() {
            format!("no service {team}/{name}")
        } else {
            "the gateway has not read its routes from the broker yet".to_string()
        };
        let status = if gw.loaded() {
            StatusCode::NOT_FOUND
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        };
        return plain(status, &why);
    };
    let span = tracing::info_span!(
        "gateway request",
        otel.kind = "server",
        http.request.method = %request.method(),
        service.id = %route.id,
        service.name = %format!("{team}/{name}"),
        replica = tracing::field::Empty,
        http.response.status_code = tracing::field::Empty,
        latency_ms = tracing::field::Empty,
    );
    telemetry::set_parent(
        &span,
        request
            .headers()
            .get(&TRACEPARENT)
            .and_then(|v| v.to_str().ok()),
    );
    let started = Instant::now();
    let response = send(&gw, &route, rest, request, &span)
        .instrument(span.clone())
        .await;
    span.record("http.response.status_code", response.status().as_u16());
    span.record("latency_ms", started.elapsed().as_secs_f64() * 1000.0);
    response
}

/// Passes the request on to a replica of `route` and streams its answer back.
async fn send(
    gw: &Arc<Gateway>,
    route: &Arc<Route>,
    rest: String,
    request: Request,
    span: &tracing::Span,
) -> Response {
    let started = Instant::now();
    let (parts, body) = request.into_parts();
    if let Err((status, why)) = gw.allowed(route, &parts.headers) {
        return plain(status, why);
    }
    let body = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(_) => {
            return plain(
                StatusCode::PAYLOAD_TOO_LARGE,
                &format!("request bodies are limited to {MAX_BODY} bytes"),
            );
        }
    };
    let path_and_query = match parts.uri.query() {
        Some(q) => format!("/{rest}?{q}"),
        None => format!("/{rest}"),
    };
    let mut headers = parts.headers.clone();
    headers.remove(header::AUTHORIZATION);
    headers.remove(header::HOST);
    for h in HOP_BY_HOP {
        headers.remove(h);
    }
    // The replica's work is a child of this request's span (when traces are exported; else
    // the caller's own `traceparent` passes through as it came).
    if let Some(tp) = telemetry::traceparent(span)
        && let Ok(v) = HeaderValue::from_str(&tp)
    {
        headers.insert(TRACEPARENT, v);
    }
    let mut exclude = None;
    let now = || gw.clock.now();
    for attempt in 0..2 {
        let (current, upstream) = match acquire(gw, route, exclude).await {
            Ok(got) => got,
            Err(refused) => {
                gw.meter
                    .record(route.id, None, now(), started.elapsed(), true);
                return refused;
            }
        };
        span.record("replica", tracing::field::display(upstream.job));
        let slot = Slot::new(&upstream, &current, &gw.meter);
        let url = format!("http://{}{path_and_query}", upstream.address);
        let sent = gw
            .client
            .request(parts.method.clone(), &url)
            .headers(headers.clone())
            .body(body.clone())
            .send()
            .await;
        match sent {
            Ok(answer) => {
                let status = answer.status();
                let first = FirstByte {
                    gw: Arc::clone(gw),
                    service: route.id,
                    job: upstream.job,
                    started,
                    server_error: status.is_server_error(),
                };
                let mut response = Response::builder().status(status);
                if let Some(h) = response.headers_mut() {
                    for (k, v) in answer.headers() {
                        if !HOP_BY_HOP.contains(&k.as_str()) {
                            h.append(k.clone(), v.clone());
                        }
                    }
                }
                // Chunk by chunk as the replica sends them; the slot is held until the body
                // has streamed through (or the caller went away). The latency is recorded at
                // the first chunk.
                let state = Some((answer, slot, Some(first)));
                let stream = futures::stream::unfold(state, |state| async move {
                    let (mut answer, slot, mut first) = state?;
                    let chunk = answer.chunk().await;
                    if let Some(first) = first.take() {
                        first.record(chunk.is_err());
                    }
                    match chunk {
                        Ok(Some(bytes)) => Some((Ok(bytes), Some((answer, slot, None)))),
                        Ok(None) => None,
                        Err(e) => Some((Err(e), None)),
                    }
                });
                return response
                    .body(Body::from_stream(stream))
                    .unwrap_or_else(|_| plain(StatusCode::BAD_GATEWAY, "bad answer"));
            }
            Err(e) if e.is_connect() && attempt == 0 => {
                // Nothing was sent: once more, on another replica.
                tracing::debug!(error = %e, replica = %upstream.job, "replica unreachable; retrying");
                exclude = Some(upstream.job);
                drop(slot);
            }
            Err(e) => {
                gw.meter
                    .record(route.id, Some(upstream.job), now(), started.elapsed(), true);
                drop(slot);
                let status = if e.is_timeout() {
                    StatusCode::GATEWAY_TIMEOUT
                } else {
                    StatusCode::BAD_GATEWAY
                };
                return plain(status, &format!("the replica failed: {e}"));
            }
        }
    }
    plain(StatusCode::BAD_GATEWAY, "no replica could be reached")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn replica(n: u128, region: &str, ready: bool, draining: bool) -> GatewayReplica {
        GatewayReplica {
            job: Uuid::from_u128(n),
            address: format!("127.0.0.1:{n}"),
            ready,
            draining,
            region: region.into(),
        }
    }

    /// A gateway in `region` with one service whose replicas are `replicas`, at most one
    /// request each.
    fn gateway(region: Option<&str>, replicas: Vec<GatewayReplica>) -> Arc<Gateway> {
        let source = Source::Http {
            client: reqwest::Client::new(),
            broker: "http://127.0.0.1:9".into(),
            token: "unused".into(),
        };
        let gw = Gateway::new(
            source,
            Clock::system(),
            region.map(str::to_string),
            "127.0.0.1:0",
        )
        .unwrap();
        let region = |id: &str, latency_ms| GatewayRegion {
            id: id.into(),
            latency_ms,
        };
        gw.install(GatewayRoutes {
            services: vec![GatewayService {
                id: Uuid::from_u128(1),
                team: "ml".into(),
                name: "chat".into(),
                public: false,
                max_concurrency: Some(1),
                replicas,
            }],
            regions: vec![
                region("onprem:dc1", 2),
                region("aws:us-east-1", 12),
                region("gcp:us-central1", 25),
            ],
            grants: Vec::new(),
        });
        gw
    }

    async fn take(gw: &Gateway) -> Option<u128> {
        let route = gw.route("ml", "chat").unwrap();
        let got = tokio::time::timeout(Duration::from_millis(300), acquire(gw, &route, None))
            .await
            .ok()?;
        got.ok().map(|(_, u)| u.job.0.as_u128())
    }

    #[tokio::test]
    async fn the_nearest_region_first_then_farther_ones_when_it_is_full() {
        let gw = gateway(
            Some("onprem:dc1"),
            vec![
                replica(10, "gcp:us-central1", true, false),
                replica(11, "aws:us-east-1", true, false),
                replica(12, "onprem:dc1", true, false),
                replica(13, "onprem:dc1", false, false),
                replica(14, "onprem:dc1", true, true),
            ],
        );
        // Its own region, then the nearer cloud, then the farther one; not ready or
        // draining replicas never.
        assert_eq!(take(&gw).await, Some(12));
        assert_eq!(take(&gw).await, Some(11));
        assert_eq!(take(&gw).await, Some(10));
        // All at their bound: the request queues (and here gives up waiting).
        assert_eq!(take(&gw).await, None);
    }

    #[tokio::test]
    async fn a_gateway_without_a_region_takes_the_least_busy_anywhere() {
        let gw = gateway(
            None,
            vec![
                replica(10, "gcp:us-central1", true, false),
                replica(11, "onprem:dc1", true, false),
            ],
        );
        let first = take(&gw).await.unwrap();
        let second = take(&gw).await.unwrap();
        assert_ne!(first, second);
    }

    #[tokio::test]
    async fn the_in_flight_count_survives_a_refresh() {
        let gw = gateway(
            Some("onprem:dc1"),
            vec![replica(12, "onprem:dc1", true, false)],
        );
        let route = gw.route("ml", "chat").unwrap();
        let (_, held) = acquire(&gw, &route, None).await.ok().unwrap();
        assert_eq!(held.job.0.as_u128(), 12);
        // The same routes read again: the replica still has its one request.
        gw.install(GatewayRoutes {
            services: vec![GatewayService {
                id: Uuid::from_u128(1),
                team: "ml".into(),
                name: "chat".into(),
                public: false,
                max_concurrency: Some(1),
                replicas: vec![replica(12, "onprem:dc1", true, false)],
            }],
            regions: Vec::new(),
            grants: Vec::new(),
        });
        assert_eq!(
            gw.in_flight(),
            vec![(Uuid::from_u128(1), JobId(Uuid::from_u128(12)), 1)]
        );
        assert_eq!(take(&gw).await, None);
        // The request that began before the refresh ends after it (its slot holds the old
        // routes' upstream): counted off, and the replica takes a request again.
        held.in_flight.fetch_sub(1, Ordering::SeqCst);
        assert_eq!(
            gw.in_flight(),
            vec![(Uuid::from_u128(1), JobId(Uuid::from_u128(12)), 0)]
        );
        assert_eq!(take(&gw).await, Some(12));
    }

    #[tokio::test]
    async fn a_replica_gone_from_the_routes_is_counted_until_its_requests_end() {
        let gw = gateway(
            Some("onprem:dc1"),
            vec![replica(12, "onprem:dc1", true, false)],
        );
        let route = gw.route("ml", "chat").unwrap();
        let (_, held) = acquire(&gw, &route, None).await.ok().unwrap();
        // The service is deleted: its routes go, its replica's request is still in flight.
        let empty = || GatewayRoutes {
            services: Vec::new(),
            regions: Vec::new(),
            grants: Vec::new(),
        };
        gw.install(empty());
        assert!(gw.route("ml", "chat").is_none());
        assert_eq!(
            gw.in_flight(),
            vec![(Uuid::from_u128(1), JobId(Uuid::from_u128(12)), 1)]
        );
        gw.install(empty());
        assert_eq!(
            gw.in_flight().len(),
            1,
            "still in flight after two refreshes"
        );
        // It ends: reported once more as 0, then forgotten.
        held.in_flight.fetch_sub(1, Ordering::SeqCst);
        assert_eq!(
            gw.in_flight(),
            vec![(Uuid::from_u128(1), JobId(Uuid::from_u128(12)), 0)]
        );
        gw.install(empty());
        assert!(gw.in_flight().is_empty());
    }
}

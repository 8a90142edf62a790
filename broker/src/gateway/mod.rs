//! The services gateway: the data path of inference services. `up` and `serve` run one
//! in-process on its own port (`gateway_listen`); a service's endpoint is
//! `http://{gateway_listen}/svc/TEAM/NAME/`.
//!
//! - **Routes** come from the store every [`REFRESH`] (`Store::gateway_routes`): each live
//!   service's running replicas with the address their agent reported. A replica gets new
//!   requests only while it is ready and not draining; one that is draining finishes what it
//!   has.
//! - **Routing:** the ready replica with the fewest requests in flight. A request whose
//!   connection to a replica failed before anything was sent is tried once more on another.
//!   Responses stream through (chunked, SSE) without buffering; request bodies are read first
//!   (up to [`MAX_BODY`]) so that the retry can resend them.
//! - **Queueing:** at `scaling.max_concurrency_per_replica` on every ready replica, a request
//!   waits (up to [`QUEUE_WAIT`]) in a bounded queue; when that is full, or nothing became
//!   free in time, the answer is 503 with `Retry-After`.
//! - **Auth:** a bearer token of the service's team, or an admin token; none for a `public`
//!   service. The token is not passed on to the replica.
//! - **Traffic:** every answer's latency (to its first byte) and whether it failed, per
//!   service and replica, into [`traffic::Traffic`] (the service view and the autoscaler read
//!   it).
//!
//! It decides nothing about replicas: the reconciler (`control/services.rs`) does.

pub mod traffic;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};
use switchyard_core::JobId;
use switchyard_protocol::api::{Role, ServiceSpec};
use tokio::net::TcpListener;
use tokio::sync::Notify;
use uuid::Uuid;

use crate::http::auth::hash_token;
use crate::state::App;

/// How often the routes are read again.
pub const REFRESH: Duration = Duration::from_millis(500);
/// The largest request body passed on.
pub const MAX_BODY: usize = 16 * 1024 * 1024;
/// How long a request waits in a service's queue for a free replica.
pub const QUEUE_WAIT: Duration = Duration::from_secs(30);
/// Requests a service's queue holds per ready replica (at least [`QUEUE_MIN`]).
pub const QUEUE_PER_REPLICA: usize = 32;
pub const QUEUE_MIN: usize = 64;
/// How long a token's check is remembered.
const AUTH_TTL: Duration = Duration::from_secs(30);

/// A replica requests may go to.
pub struct Upstream {
    pub job: JobId,
    pub address: String,
    pub ready: bool,
    pub draining: bool,
    pub in_flight: AtomicUsize,
}

/// A service as the gateway routes it.
pub struct Route {
    pub id: Uuid,
    pub team: String,
    pub public: bool,
    pub max_concurrency: Option<usize>,
    pub upstreams: Vec<Arc<Upstream>>,
    /// Requests waiting for a free replica.
    pub waiting: AtomicUsize,
    /// Told when a request ends or the routes change.
    pub freed: Notify,
}

/// Who a token is: its role and team; `None` for an unknown or revoked one.
type Caller = Option<(Role, Option<String>)>;

/// The gateway's state: the routes and the remembered token checks.
pub struct Gateway {
    app: App,
    routes: RwLock<HashMap<(String, String), Arc<Route>>>,
    auth: Mutex<HashMap<String, (Instant, Caller)>>,
    client: reqwest::Client,
}

impl Gateway {
    pub fn new(app: App) -> anyhow::Result<Arc<Gateway>> {
        let client = reqwest::Client::builder()
            .no_proxy()
            .connect_timeout(Duration::from_secs(2))
            .pool_idle_timeout(switchyard_support::http::POOL_IDLE_TIMEOUT)
            .build()?;
        Ok(Arc::new(Gateway {
            app,
            routes: RwLock::default(),
            auth: Mutex::default(),
            client,
        }))
    }

    /// Reads the routes again, keeping each replica's in-flight count.
    pub async fn refresh(&self) -> Result<(), crate::store::StoreError> {
        let (services, rows) = self.app.store.gateway_routes().await?;
        let old = self
            .routes
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let mut next = HashMap::new();
        for s in services {
            let spec: Option<ServiceSpec> = serde_json::from_str(&s.spec_json).ok();
            let key = (s.team.clone(), s.name.clone());
            let previous = old.get(&key).filter(|r| r.id == s.service);
            let upstreams = rows
                .iter()
                .filter(|r| r.service == s.service)
                .map(|r| {
                    let in_flight = previous
                        .and_then(|p| p.upstreams.iter().find(|u| u.job == r.job))
                        .map_or(0, |u| u.in_flight.load(Ordering::SeqCst));
                    Arc::new(Upstream {
                        job: r.job,
                        address: r.address.clone(),
                        ready: r.ready,
                        draining: r.draining,
                        in_flight: AtomicUsize::new(in_flight),
                    })
                })
                .collect();
            let route = Arc::new(Route {
                id: s.service,
                team: s.team,
                public: spec.as_ref().is_some_and(|s| s.public),
                max_concurrency: spec
                    .as_ref()
                    .and_then(|s| s.scaling.as_ref())
                    .and_then(|s| s.max_concurrency_per_replica)
                    .and_then(|n| usize::try_from(n).ok())
                    .filter(|n| *n > 0),
                upstreams,
                waiting: AtomicUsize::new(0),
                freed: Notify::new(),
            });
            next.insert(key, route);
        }
        *self.routes.write().unwrap_or_else(|e| e.into_inner()) = next;
        // Waiters look again at the new routes (they hold the old ones).
        for route in old.values() {
            route.freed.notify_waiters();
        }
        Ok(())
    }

    fn route(&self, team: &str, name: &str) -> Option<Arc<Route>> {
        let routes = self.routes.read().unwrap_or_else(|e| e.into_inner());
        routes.get(&(team.to_string(), name.to_string())).cloned()
    }

    /// Whether the caller may call `route`: its team's token or an admin's.
    async fn allowed(&self, route: &Route, headers: &HeaderMap) -> Result<(), Response> {
        if route.public {
            return Ok(());
        }
        let token = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty());
        let Some(token) = token else {
            return Err(plain(
                StatusCode::UNAUTHORIZED,
                "a bearer token is required",
            ));
        };
        let hash = hash_token(token);
        let cached = {
            let auth = self.auth.lock().unwrap_or_else(|e| e.into_inner());
            auth.get(&hash)
                .filter(|(at, _)| at.elapsed() < AUTH_TTL)
                .map(|(_, who)| who.clone())
        };
        let who = match cached {
            Some(who) => who,
            None => {
                let who = match self.app.store.api_token_by_hash(&hash).await {
                    Ok(Some(t)) if !t.revoked => Some((t.role, t.team)),
                    Ok(_) => None,
                    Err(e) => {
                        tracing::warn!(error = %e, "gateway token check failed");
                        return Err(plain(StatusCode::SERVICE_UNAVAILABLE, "try again"));
                    }
                };
                let mut auth = self.auth.lock().unwrap_or_else(|e| e.into_inner());
                auth.retain(|_, (at, _)| at.elapsed() < AUTH_TTL);
                auth.insert(hash, (Instant::now(), who.clone()));
                who
            }
        };
        match who {
            None => Err(plain(StatusCode::UNAUTHORIZED, "unknown or revoked token")),
            Some((Role::Admin, _)) => Ok(()),
            Some((_, Some(team))) if team == route.team => Ok(()),
            Some(_) => Err(plain(
                StatusCode::FORBIDDEN,
                "this token's team may not call this service",
            )),
        }
    }
}

/// Runs the gateway on `listener` until `shutdown` resolves: the routes' refresher and the
/// HTTP server.
pub async fn serve(
    app: App,
    listener: TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let gateway = Gateway::new(app)?;
    let refresher = {
        let gateway = gateway.clone();
        tokio::spawn(async move {
            loop {
                if let Err(e) = gateway.refresh().await {
                    tracing::warn!(error = %e, "gateway routes refresh failed");
                }
                tokio::time::sleep(REFRESH).await;
            }
        })
    };
    let router = Router::new()
        .route("/svc/{team}/{name}", any(proxy_root))
        .route("/svc/{team}/{name}/", any(proxy_root))
        .route("/svc/{team}/{name}/{*rest}", any(proxy))
        .with_state(gateway);
    let served = axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await;
    refresher.abort();
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

/// Takes a replica with room (the fewest in flight), waiting in the service's queue when every
/// ready one is at its concurrency bound. Each look reads the latest routes (a refresh
/// replaces them), so a replica that became ready while the request waited is seen.
async fn acquire(
    gw: &Gateway,
    queue: &Arc<Route>,
    exclude: Option<JobId>,
) -> Result<(Arc<Route>, Arc<Upstream>), Response> {
    let deadline = tokio::time::Instant::now() + QUEUE_WAIT;
    let mut queued = false;
    let result = loop {
        let latest = gw
            .routes
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .find(|r| r.id == queue.id)
            .cloned();
        let route = latest.unwrap_or_else(|| Arc::clone(queue));
        let ready: Vec<&Arc<Upstream>> = route
            .upstreams
            .iter()
            .filter(|u| u.ready && !u.draining && Some(u.job) != exclude)
            .collect();
        let free = ready
            .iter()
            .filter(|u| {
                route
                    .max_concurrency
                    .is_none_or(|max| u.in_flight.load(Ordering::SeqCst) < max)
            })
            .min_by_key(|u| u.in_flight.load(Ordering::SeqCst));
        if let Some(u) = free {
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
            gw.app
                .traffic
                .queued(queue.id, gw.app.clock.now(), depth + 1);
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

/// Gives a replica's slot back when the response (or the failure) is done with it.
struct Slot {
    upstream: Arc<Upstream>,
    route: Arc<Route>,
    traffic: Arc<traffic::Traffic>,
}

impl Slot {
    fn new(upstream: &Arc<Upstream>, route: &Arc<Route>, traffic: &Arc<traffic::Traffic>) -> Slot {
        traffic.began(upstream.job);
        Slot {
            upstream: Arc::clone(upstream),
            route: Arc::clone(route),
            traffic: Arc::clone(traffic),
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.upstream.in_flight.fetch_sub(1, Ordering::SeqCst);
        self.traffic.ended(self.upstream.job);
        self.route.freed.notify_one();
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

async fn forward(
    gw: Arc<Gateway>,
    team: String,
    name: String,
    rest: String,
    request: Request,
) -> Response {
    let started = Instant::now();
    let Some(route) = gw.route(&team, &name) else {
        return plain(StatusCode::NOT_FOUND, &format!("no service {team}/{name}"));
    };
    let (parts, body) = request.into_parts();
    if let Err(refused) = gw.allowed(&route, &parts.headers).await {
        return refused;
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
    let mut exclude = None;
    let now = || gw.app.clock.now();
    for attempt in 0..2 {
        let (current, upstream) = match acquire(&gw, &route, exclude).await {
            Ok(got) => got,
            Err(refused) => {
                gw.app
                    .traffic
                    .record(route.id, None, now(), started.elapsed(), true);
                return refused;
            }
        };
        let slot = Slot::new(&upstream, &current, &gw.app.traffic);
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
                gw.app.traffic.record(
                    route.id,
                    Some(upstream.job),
                    now(),
                    started.elapsed(),
                    status.is_server_error(),
                );
                let mut response = Response::builder().status(status);
                if let Some(h) = response.headers_mut() {
                    for (k, v) in answer.headers() {
                        if !HOP_BY_HOP.contains(&k.as_str()) {
                            h.append(k.clone(), v.clone());
                        }
                    }
                }
                // Chunk by chunk as the replica sends them; the slot is held until the body
                // has streamed through (or the caller went away).
                let stream = futures::stream::unfold(Some((answer, slot)), |state| async move {
                    let (mut answer, slot) = state?;
                    match answer.chunk().await {
                        Ok(Some(bytes)) => Some((Ok(bytes), Some((answer, slot)))),
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
                gw.app
                    .traffic
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

//! Serving: accepts connections, serves the router on each with hyper (HTTP/1.1 and HTTP/2,
//! over TLS when `tls_cert` is set), and drains in-flight requests on shutdown with a timeout.
//!
//! Each connection runs in its own task under three bounds (`Config`):
//! - `header_timeout_ms`: the TLS handshake and the first request's headers must arrive within
//!   it, else the connection is dropped; on HTTP/1 hyper's `header_read_timeout` (with a tokio
//!   timer) then bounds every later request's headers, and since its clock starts as soon as
//!   the connection waits for a request, it also closes an idle HTTP/1 keep-alive connection.
//! - `idle_timeout_ms`: a connection with no request in flight for this long is shut down
//!   gracefully (HTTP/2: GOAWAY); a long-poll in flight keeps it open.
//! - shutdown: every connection is told to finish what it serves and close; after 5 s the
//!   rest are cut (agents' long-polls among them: they retry elsewhere or later).
//!
//! Bodies are bounded separately, in `limits.rs` (size, and the time the body may take).

use anyhow::Context;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;

use crate::http::api;
use crate::state::App;

/// How long in-flight requests get to finish after the shutdown signal.
const DRAIN: Duration = Duration::from_secs(5);

/// What every connection is served with.
#[derive(Clone)]
struct Settings {
    tls: Option<TlsAcceptor>,
    header_timeout: Duration,
    idle_timeout: Duration,
    builder: Arc<auto::Builder<TokioExecutor>>,
}

impl Settings {
    fn from_config(config: &crate::config::Config) -> anyhow::Result<Settings> {
        let header_timeout = Duration::from_millis(config.header_timeout_ms.max(1));
        let idle_timeout = Duration::from_millis(config.idle_timeout_ms.max(1));
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(header_timeout)
            .keep_alive(true);
        // Pings find a dead HTTP/2 peer; the idle bound below closes a live but unused one.
        builder
            .http2()
            .timer(TokioTimer::new())
            .keep_alive_interval(Some(Duration::from_secs(20)))
            .keep_alive_timeout(Duration::from_secs(20));
        Ok(Settings {
            tls: crate::http::tls::server_config(config)?.map(TlsAcceptor::from),
            header_timeout,
            idle_timeout,
            builder: Arc::new(builder),
        })
    }
}

/// Serves `app` on `listener` (HTTPS when the config names a certificate) until `shutdown`
/// resolves; in-flight requests then get 5 s to finish.
pub async fn serve(
    app: App,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let settings = Settings::from_config(&app.config)?;
    let router = api::router(app);
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    connections.spawn(connection(
                        stream,
                        peer,
                        router.clone(),
                        settings.clone(),
                        stop_rx.clone(),
                    ));
                }
                // Out of file descriptors and the like: the next accept may succeed.
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            // Reap finished connection tasks so that the set does not grow.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    let _ = stop_tx.send(true);
    let drained = tokio::time::timeout(DRAIN, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            open = connections.len(),
            "requests still open after 5 s; closing them"
        );
        connections.abort_all();
    }
    Ok(())
}

/// One accepted connection: the TLS handshake if any, then HTTP until the client closes, a
/// bound is crossed or the server stops.
async fn connection(
    stream: TcpStream,
    peer: std::net::SocketAddr,
    router: Router,
    settings: Settings,
    stop: watch::Receiver<bool>,
) {
    let accepted = Instant::now();
    let _ = stream.set_nodelay(true);
    match &settings.tls {
        None => {
            drive(
                TokioIo::new(stream),
                peer,
                router,
                &settings,
                accepted,
                stop,
            )
            .await
        }
        Some(acceptor) => {
            match tokio::time::timeout(settings.header_timeout, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => {
                    drive(TokioIo::new(tls), peer, router, &settings, accepted, stop).await
                }
                Ok(Err(e)) => tracing::debug!(error = %e, "TLS handshake failed"),
                Err(_) => tracing::debug!("TLS handshake timed out"),
            }
        }
    }
}

/// Serves HTTP on `io` under the connection's bounds (see the module docs).
async fn drive<I>(
    io: TokioIo<I>,
    peer: std::net::SocketAddr,
    router: Router,
    settings: &Settings,
    accepted: Instant,
    mut stop: watch::Receiver<bool>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let activity = Arc::new(Activity::new());
    let service = {
        let activity = activity.clone();
        hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
            // The client's address, for the throttle of failed authentications (limits.rs).
            req.extensions_mut()
                .insert(axum::extract::ConnectInfo(peer));
            let guard = InFlight::begin(&activity);
            let router = router.clone();
            async move {
                let response = router.oneshot(req).await;
                drop(guard);
                response
            }
        })
    };
    let conn = settings.builder.serve_connection(io, service);
    tokio::pin!(conn);
    let first_deadline = accepted + settings.header_timeout;
    let mut closing = false;
    loop {
        let (served_any, idle_since) = activity.state();
        // Before its first request a connection has `header_timeout` in all; after, it is
        // checked for idleness (a request in flight: look again after a full idle period).
        let wake = if !served_any {
            first_deadline
        } else {
            idle_since.map_or(Instant::now() + settings.idle_timeout, |t| {
                t + settings.idle_timeout
            })
        };
        tokio::select! {
            res = conn.as_mut() => {
                if let Err(e) = res {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                return;
            }
            changed = stop.changed(), if !closing => {
                // The server stops (or, with the sender gone, has stopped).
                let _ = changed;
                conn.as_mut().graceful_shutdown();
                closing = true;
            }
            () = tokio::time::sleep_until(wake), if !closing => {
                let (served_any, idle_since) = activity.state();
                if !served_any {
                    tracing::debug!("no request headers within header_timeout_ms; closing");
                    return;
                }
                if idle_since.is_some_and(|t| t.elapsed() >= settings.idle_timeout) {
                    conn.as_mut().graceful_shutdown();
                    closing = true;
                }
            }
        }
    }
}

/// What a connection is doing: requests begun, in flight, and when the last one ended.
#[derive(Debug)]
struct Activity(Mutex<ActivityState>);

#[derive(Debug)]
struct ActivityState {
    begun: u64,
    in_flight: u64,
    last_end: Instant,
}

impl Activity {
    fn new() -> Activity {
        Activity(Mutex::new(ActivityState {
            begun: 0,
            in_flight: 0,
            last_end: Instant::now(),
        }))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ActivityState> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether any request has begun, and since when nothing is in flight (`None`: a request
    /// is).
    fn state(&self) -> (bool, Option<Instant>) {
        let s = self.lock();
        (s.begun > 0, (s.in_flight == 0).then_some(s.last_end))
    }
}

/// One request in flight on a connection; its drop (answered, or dropped with the
/// connection) ends it.
struct InFlight(Arc<Activity>);

impl InFlight {
    fn begin(activity: &Arc<Activity>) -> InFlight {
        let mut s = activity.lock();
        s.begun += 1;
        s.in_flight += 1;
        drop(s);
        InFlight(activity.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut s = self.0.lock();
        s.in_flight = s.in_flight.saturating_sub(1);
        s.last_end = Instant::now();
    }
}

/// Resolves on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}

/// Binds nothing and serves nothing: checks that the config's TLS files load, so that
/// `switchyard serve` fails at start rather than at the first connection.
pub fn check_tls(config: &crate::config::Config) -> anyhow::Result<()> {
    crate::http::tls::server_config(config)
        .map(|_| ())
        .context("loading the TLS certificate and key")
}

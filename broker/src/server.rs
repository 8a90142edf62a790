//! Serving: binds, runs the router until the shutdown signal, drains in-flight requests with a
//! timeout.

use anyhow::Context;
use std::future::Future;
use std::time::Duration;
use tokio::net::TcpListener;

use crate::api;
use crate::app::App;

/// Serves `app` on `listener` until `shutdown` resolves; in-flight requests get 5 s to finish
/// (agents' long-polls are cut, and they retry elsewhere or later).
pub async fn serve(
    app: App,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let router = api::router(app);
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let server = axum::serve(listener, router).with_graceful_shutdown(async move {
        shutdown.await;
        let _ = tx.send(());
    });
    let server = tokio::spawn(async move { server.await });
    tokio::pin!(server);
    tokio::select! {
        res = &mut server => return res.context("server task")?.context("serving"),
        _ = rx => {}
    }
    match tokio::time::timeout(Duration::from_secs(5), &mut server).await {
        Ok(res) => res.context("server task")?.context("serving"),
        Err(_) => {
            tracing::warn!("requests still open after 5 s; closing them");
            server.abort();
            Ok(())
        }
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

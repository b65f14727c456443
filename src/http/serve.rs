//! Serving one server's HTTP side: connection slots, handshake and header
//! timeouts, and the linger at shutdown.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use tower::ServiceExt;

use super::routes::router_of;
use super::slots;
use super::state::{AppState, Options};
use crate::connections::{self, Plain, Upgrade};
use crate::node::Node;

/// The HTTP address used when `--http` is not given.
pub const DEFAULT_HTTP_ADDR: &str = "127.0.0.1:9090";

/// How long HTTP keeps answering once shutdown begins, so that load
/// balancers read `/readyz` 503 while gRPC calls drain (the process exits
/// sooner when they are done): as long as the gRPC side's drain, which
/// `lib.rs` checks at compile time.
pub const SHUTDOWN_LINGER: std::time::Duration = std::time::Duration::from_secs(5);

/// Serves the HTTP routes on `listener`. Once `shutdown` resolves, event
/// streams end and `/readyz` answers 503; the routes keep answering for at
/// most [`SHUTDOWN_LINGER`], then the server stops.
pub async fn serve(
    listener: tokio::net::TcpListener,
    node: Arc<Node>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let options = Options::of(&node);
    serve_with(listener, node, options, shutdown).await
}

/// Like [`serve`], with `options`.
pub async fn serve_with(
    listener: tokio::net::TcpListener,
    node: Arc<Node>,
    options: Options,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_upgraded(listener, node, options, Plain, shutdown).await
}

/// Like [`serve_with`], each connection upgraded by `upgrade` (TLS) first.
///
/// Each connection takes one of `[server] max_http_connections` slots at
/// accept (past the cap it is closed at once, counted); its upgrade and
/// then each request's headers must arrive within `[server]
/// handshake_timeout`, else it is closed. An answer whose peer reads none
/// of it for `[server] http_write_timeout` closes its connection.
pub async fn serve_upgraded<U: Upgrade>(
    listener: tokio::net::TcpListener,
    node: Arc<Node>,
    options: Options,
    upgrade: U,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let limits = node.limits().connections();
    let caps = node.ports().caps();
    let timeout = Duration::from_millis(limits.handshake_timeout);
    let write_timeout = Duration::from_millis(limits.http_write_timeout);
    let state = AppState::new(node, options);
    let slots = state.slots.clone();
    let backoffs = state.node.ports().clone();
    let router = router_of(state);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let stop = async move {
        shutdown.await;
        tokio::time::sleep(SHUTDOWN_LINGER).await;
    };
    tokio::pin!(stop);
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = connections::accept(&listener, "HTTP", &backoffs.figures().accept_backoffs) => accepted,
            () = &mut stop => break,
        };
        let Some(mut slot) = slots::HttpSlot::take(&slots, caps.max_http_connections) else {
            continue;
        };
        // Past the cap, the idle connection closed for this one's room
        // goes first (it closes both ways at once), before any other is
        // accepted: so a flood never holds more sockets than the cap.
        tokio::select! {
            _ = tokio::time::timeout(timeout, slot.room()) => {}
            () = &mut stop => break,
        }
        let _ = tcp.set_nodelay(true);
        let router = router.clone();
        let upgrade = upgrade.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let slot = Arc::new(slot);
            let upgraded = tokio::select! {
                upgraded = tokio::time::timeout(timeout, upgrade.upgrade(tcp)) => upgraded,
                // Closed for room during its handshake.
                () = slot.closing() => return,
            };
            let stream = match upgraded {
                Ok(Ok(stream)) => stream,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, "closing an HTTP connection whose handshake failed: {e}");
                    return;
                }
                Err(_) => return,
            };
            // What every request knows of its connection: the peer and,
            // with mutual TLS, the client certificate's names.
            let identity = U::identity(&stream);
            // Each request keeps the connection busy until its answer is
            // written to the socket, so that only idle connections are
            // closed for room.
            let tracked = slot.clone();
            let service =
                tower::service_fn(move |mut request: axum::http::Request<Incoming>| {
                    request.extensions_mut().insert(ConnectInfo(peer));
                    if let Some(identity) = &identity {
                        request.extensions_mut().insert(identity.clone());
                    }
                    let busy = tracked.busy();
                    let call = router.clone().oneshot(request);
                    async move {
                        let response = call.await?;
                        Ok::<_, std::convert::Infallible>(response.map(|body| {
                            axum::body::Body::new(connections::Holding::new(body, busy))
                        }))
                    }
                });
            let service = hyper_util::service::TowerToHyperService::new(service);
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(timeout)
                .serve_connection(
                    hyper_util::rt::TokioIo::new(slot.wrap(stream, write_timeout)),
                    service,
                );
            if let Err(e) = watcher.watch(connection).await {
                tracing::debug!(%peer, "an HTTP connection ended: {e}");
            }
        });
    }
    drop(listener);
    // Event streams have ended; other answers get a moment to finish.
    let _ = tokio::time::timeout(Duration::from_secs(1), graceful.shutdown()).await;
    Ok(())
}

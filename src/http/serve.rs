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
/// handshake_timeout`, else it is closed.
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
        let Some(slot) = slots::HttpSlot::take(&slots, caps.max_http_connections) else {
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let router = router.clone();
        let upgrade = upgrade.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let slot = Arc::new(slot);
            let stream = match tokio::time::timeout(timeout, upgrade.upgrade(tcp)).await {
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
            // sent, so that only idle connections are closed for room.
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
                .serve_connection(hyper_util::rt::TokioIo::new(slot.wrap(stream)), service);
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

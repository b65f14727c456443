//! The HTTP side of fusebox (`--http ADDR`): `/metrics` in the Prometheus
//! text format, `/healthz`, `/readyz`, and the live dashboard at `/`. Like
//! the gRPC services, it only converts and delegates to the engine.
//!
//! | route | what |
//! |---|---|
//! | `GET /metrics` | the Prometheus text format ([`metrics`]) |
//! | `GET /healthz` | 200 while the process answers |
//! | `GET /readyz` | 200 while the engine takes requests, 503 once it shuts down |
//! | `GET /` | the dashboard (assets embedded in the binary) |
//! | `GET /api/overview?prefix=` | totals, the keys not closed, the busiest keys, their sparklines ([`api::Overview`]) |
//! | `GET /api/keys?prefix=&after=&limit=` | a page of keys in key order, at most 100 ([`api::Page`]) |
//! | `GET /api/transitions?prefix=` | the last transitions, oldest first |
//! | `GET /api/events?prefix=` | server-sent events: the overview every round, and changes ([`events`]) |
//! | `POST /api/keys/{key}/isolate` | isolate, with `{"reason": "..."}` (who: `dashboard:PEER`) |
//! | `POST /api/keys/{key}/close` | close, with `{"reason": "..."}` |
//!
//! Nothing here walks every key: totals come from [`Engine::totals`], the
//! rows from bounded reads ([`Engine::busiest`], [`Engine::list`] pages),
//! and one sampler task ([`trends`]) serves every viewer.
//!
//! Connections are capped (`[server] max_http_connections`, lowered if
//! need be to fit the open-file limit); one that does not send a request's
//! headers within `[server] handshake_timeout` is closed; a body past
//! [`api::MAX_BODY_BYTES`] is refused (413) before it is read.
//!
//! A key in a path is percent-encoded (`payments%2Fcharge`). API errors are
//! `{"error": {"field": ..., "message": ...}}`. There is no authentication:
//! like the gRPC Admin service, the port is for operators only (the default
//! address is loopback). With `[tls]` (unless `http = false`) the port
//! speaks TLS with the gRPC port's certificate ([`serve_tls`]), and with
//! `client_ca` it asks for client certificates in the same way.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::Router;

use crate::connections::{self, Plain, Upgrade};
use crate::engine::Store;
use crate::node::Node;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use tower::ServiceExt;

pub mod api;
mod dashboard;
pub mod events;
pub mod guard;
pub mod metrics;
mod slots;
pub mod trends;

/// The HTTP address used when `--http` is not given.
pub const DEFAULT_HTTP_ADDR: &str = "127.0.0.1:9090";

/// How long HTTP keeps answering once shutdown begins, so that load
/// balancers read `/readyz` 503 while gRPC calls drain (the process exits
/// sooner when they are done): as long as the gRPC side's drain, which
/// `lib.rs` checks at compile time.
pub const SHUTDOWN_LINGER: std::time::Duration = std::time::Duration::from_secs(5);

/// Dashboard event streams open at once, by default.
pub const MAX_EVENT_STREAMS: usize = crate::config::MAX_EVENT_STREAMS as usize;

/// How the HTTP side is set up.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Most dashboard event streams open at once; more are answered 503.
    pub max_event_streams: usize,
    /// How often the sampler reads the board and the sparklines' counters.
    pub sample_every: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            max_event_streams: MAX_EVENT_STREAMS,
            sample_every: Duration::from_secs(3),
        }
    }
}

impl Options {
    /// The defaults, with the caps of the server's `[server]` limits.
    pub fn of(node: &Node) -> Options {
        Options {
            max_event_streams: usize::try_from(node.limits().max_event_streams)
                .unwrap_or(usize::MAX),
            ..Options::default()
        }
    }
}

/// Open dashboard event streams, against their cap.
#[derive(Debug)]
pub struct Streams {
    open: AtomicU64,
    refused: AtomicU64,
    max: u64,
}

/// A place among the open event streams, given back when dropped.
#[derive(Debug)]
pub struct StreamSlot(Arc<Streams>);

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Streams {
    /// At most `max` streams at once.
    pub fn new(max: usize) -> Arc<Streams> {
        Arc::new(Streams {
            open: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            max: max as u64,
        })
    }

    /// A place for one more stream, or `None` (counted) when all are taken.
    pub fn open(self: &Arc<Streams>) -> Option<StreamSlot> {
        let taken = self
            .open
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < self.max).then_some(n + 1)
            });
        match taken {
            Ok(_) => Some(StreamSlot(self.clone())),
            Err(_) => {
                self.refused.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Open streams, refusals, and the cap, for the metrics.
    pub fn figures(&self) -> metrics::HttpFigures {
        metrics::HttpFigures {
            event_streams: self.open.load(Ordering::Relaxed),
            event_streams_refused: self.refused.load(Ordering::Relaxed),
            max_event_streams: self.max,
        }
    }
}

/// What every handler shares.
#[derive(Clone, Debug)]
pub struct AppState {
    /// Where the keys are.
    pub store: Store,
    /// The server: who may call, its caps and counters.
    pub node: Arc<Node>,
    /// Recent transitions, for the dashboard's timeline.
    pub history: Arc<api::History>,
    /// The board and the sparklines, from the one sampler task.
    pub trends: Arc<trends::Trends>,
    /// Open event streams and their cap.
    pub streams: Arc<Streams>,
}

/// The routes of `node`, with the default [`Options`].
pub fn router(node: Arc<Node>) -> Router {
    let options = Options::of(&node);
    router_with(node, options)
}

/// The routes of `node`. Starts the tasks that remember transitions for
/// the timeline and sample the board, so it must be called inside a Tokio
/// runtime.
pub fn router_with(node: Arc<Node>, options: Options) -> Router {
    let store = node.store().clone();
    let state = AppState {
        node,
        history: api::History::record(store.core().clone()),
        trends: trends::Trends::start(store.clone(), options.sample_every),
        streams: Streams::new(options.max_event_streams),
        store,
    };
    Router::new()
        .route("/", get(dashboard::index))
        .route("/app.js", get(dashboard::app_js))
        .route("/style.css", get(dashboard::style_css))
        .route("/metrics", get(metrics_text))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/api/overview", get(api::overview_json))
        .route("/api/keys", get(api::keys))
        .route("/api/transitions", get(api::transitions))
        .route("/api/events", get(events::events))
        .route("/api/keys/{key}/isolate", post(api::isolate))
        .route("/api/keys/{key}/close", post(api::close))
        .fallback(not_found)
        .layer(axum::extract::DefaultBodyLimit::max(api::MAX_BODY_BYTES))
        .layer(axum::middleware::from_fn(api::refuse_large_bodies))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            guard::guard,
        ))
        .with_state(state)
}

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
    let caps = connections::caps(&limits);
    let timeout = Duration::from_millis(limits.handshake_timeout);
    let router = router_with(node, options);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let stop = async move {
        shutdown.await;
        tokio::time::sleep(SHUTDOWN_LINGER).await;
    };
    tokio::pin!(stop);
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = connections::accept(&listener, "HTTP") => accepted,
            () = &mut stop => break,
        };
        let Some(slot) = slots::HttpSlot::take(caps.max_http_connections) else {
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

/// `GET /metrics`.
async fn metrics_text(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<guard::Caller>,
) -> impl IntoResponse {
    let figures = state.streams.figures();
    // With [auth], per-key series only for the keys of the credential that
    // asks; none for anyone else (the aggregates count every key).
    let shown = match (state.node.access(), caller.0) {
        (None, _) => metrics::Shown::Every,
        (Some(_), Some(grant)) => metrics::Shown::Of(grant),
        (Some(_), None) => metrics::Shown::None,
    };
    let text = metrics::render(&state.node, &figures, &shown).await;
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, metrics::CONTENT_TYPE)],
        text,
    )
}

/// Liveness: the process answers.
async fn healthz() -> &'static str {
    "ok\n"
}

/// Readiness: 200 while the engine takes requests, 503 once it shuts down.
async fn readyz(State(state): State<AppState>) -> (StatusCode, &'static str) {
    if state.store.core().is_shutting_down() {
        (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n")
    } else {
        (StatusCode::OK, "ready\n")
    }
}

async fn not_found() -> (StatusCode, &'static str) {
    (
        StatusCode::NOT_FOUND,
        "not found: try / (the dashboard), /metrics, /healthz or /readyz\n",
    )
}

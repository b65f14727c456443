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
//! | `GET /api/keys?prefix=` | the matching keys, what is broken first ([`api::Listing`]) |
//! | `GET /api/transitions?prefix=` | the last transitions, oldest first |
//! | `GET /api/events?prefix=` | server-sent events: a snapshot, then changes ([`events`]) |
//! | `POST /api/keys/{key}/isolate` | isolate, with `{"reason": "..."}` (who: `dashboard:PEER`) |
//! | `POST /api/keys/{key}/close` | close, with `{"reason": "..."}` |
//!
//! A key in a path is percent-encoded (`payments%2Fcharge`). API errors are
//! `{"error": {"field": ..., "message": ...}}`. There is no authentication:
//! like the gRPC Admin service, the port is for operators only (the default
//! address is loopback).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::Router;

use crate::engine::Engine;

pub mod api;
mod dashboard;
pub mod events;
pub mod metrics;

/// The HTTP address used when `--http` is not given.
pub const DEFAULT_HTTP_ADDR: &str = "127.0.0.1:9090";

/// How long HTTP keeps answering once shutdown begins, so that load
/// balancers read `/readyz` 503 while gRPC calls drain (the process exits
/// sooner when they are done): as long as the gRPC side's drain, which
/// `lib.rs` checks at compile time.
pub const SHUTDOWN_LINGER: std::time::Duration = std::time::Duration::from_secs(5);

/// What every handler shares.
#[derive(Clone, Debug)]
pub struct AppState {
    /// The engine.
    pub engine: Arc<Engine>,
    /// Recent transitions, for the dashboard's timeline.
    pub history: Arc<api::History>,
}

/// The routes, over `engine`. Starts the task that remembers transitions
/// for the timeline, so it must be called inside a Tokio runtime.
pub fn router(engine: Arc<Engine>) -> Router {
    let state = AppState {
        history: api::History::record(engine.clone()),
        engine,
    };
    Router::new()
        .route("/", get(dashboard::index))
        .route("/app.js", get(dashboard::app_js))
        .route("/style.css", get(dashboard::style_css))
        .route("/metrics", get(metrics_text))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/api/keys", get(api::keys))
        .route("/api/transitions", get(api::transitions))
        .route("/api/events", get(events::events))
        .route("/api/keys/{key}/isolate", post(api::isolate))
        .route("/api/keys/{key}/close", post(api::close))
        .fallback(not_found)
        .with_state(state)
}

/// Serves the HTTP routes on `listener`. Once `shutdown` resolves, event
/// streams end and `/readyz` answers 503; the routes keep answering for at
/// most [`SHUTDOWN_LINGER`], then the server stops.
pub async fn serve(
    listener: tokio::net::TcpListener,
    engine: Arc<Engine>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = router(engine).into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            shutdown.await;
            tokio::time::sleep(SHUTDOWN_LINGER).await;
        })
        .await
}

/// `GET /metrics`.
async fn metrics_text(State(state): State<AppState>) -> impl IntoResponse {
    let engine = state.engine.clone();
    // A walk over every key: off the async workers.
    match tokio::task::spawn_blocking(move || metrics::render(&engine)).await {
        Ok(text) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, metrics::CONTENT_TYPE)],
            text,
        ),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            format!("metrics failed: {e}\n"),
        ),
    }
}

/// Liveness: the process answers.
async fn healthz() -> &'static str {
    "ok\n"
}

/// Readiness: 200 while the engine takes requests, 503 once it shuts down.
async fn readyz(State(state): State<AppState>) -> (StatusCode, &'static str) {
    if state.engine.is_shutting_down() {
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

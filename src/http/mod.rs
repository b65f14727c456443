//! The HTTP side of fusebox (`--http ADDR`): `/metrics` in the Prometheus
//! text format, `/healthz`, `/readyz`, and the live dashboard at `/`. Like
//! the gRPC services, it only converts and delegates to the engine.

use std::future::Future;
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;

use crate::engine::Engine;

/// The HTTP address used when `--http` is not given.
pub const DEFAULT_HTTP_ADDR: &str = "127.0.0.1:9090";

/// The routes, over `engine`.
pub fn router(engine: Arc<Engine>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(engine)
}

/// Serves the HTTP routes on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    engine: Arc<Engine>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(engine))
        .with_graceful_shutdown(shutdown)
        .await
}

/// Liveness: the process answers.
async fn healthz() -> &'static str {
    "ok\n"
}

/// Readiness: 200 while the engine takes requests, 503 once it shuts down.
async fn readyz(State(engine): State<Arc<Engine>>) -> (StatusCode, &'static str) {
    if engine.is_shutting_down() {
        (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n")
    } else {
        (StatusCode::OK, "ready\n")
    }
}

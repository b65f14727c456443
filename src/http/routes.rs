//! The routes of one server's HTTP side, and the small handlers: `/metrics`,
//! `/healthz`, `/readyz` and what is not found.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Extension, Router};

use super::guard::Caller;
use super::metrics::{self, Shown};
use super::state::{AppState, Options};
use super::{api, dashboard, events, guard};
use crate::domain::OperatorAction;
use crate::node::Node;

/// The routes of `node`, with the default [`Options`].
pub fn router(node: Arc<Node>) -> Router {
    let options = Options::of(&node);
    router_with(node, options)
}

/// The routes of `node`. Starts the tasks that remember transitions for
/// the timeline and sample the board, so it must be called inside a Tokio
/// runtime.
pub fn router_with(node: Arc<Node>, options: Options) -> Router {
    router_of(AppState::new(node, options))
}

/// The routes over `state`.
pub fn router_of(state: AppState) -> Router {
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
        .route(
            "/api/keys/{key}/isolate",
            post(api::operate).layer(Extension(OperatorAction::Isolate)),
        )
        .route(
            "/api/keys/{key}/close",
            post(api::operate).layer(Extension(OperatorAction::Close)),
        )
        .fallback(not_found)
        .layer(axum::extract::DefaultBodyLimit::max(api::MAX_BODY_BYTES))
        .layer(axum::middleware::from_fn(api::refuse_large_bodies))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            guard::guard,
        ))
        .with_state(state)
}

/// `GET /metrics`.
async fn metrics_text(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
) -> impl IntoResponse {
    // With [auth], per-key series only for the keys of the credential that
    // asks; none for anyone else (the aggregates count every key).
    let shown = match (state.node.access(), caller.0) {
        (None, _) => Shown::Every,
        (Some(_), Some(grant)) => Shown::Of(grant),
        (Some(_), None) => Shown::None,
    };
    let text = metrics::render(&state.node, &state.figures(), &shown).await;
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

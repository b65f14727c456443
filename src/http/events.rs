//! `/api/events`: the dashboard's live feed, as server-sent events.
//!
//! A stream sends a `snapshot` (an [`Overview`](super::api::Overview); the
//! first also carries the remembered transitions as `recent`) after every
//! round of the sampler ([`super::trends`]), and a `change` for every phase
//! change, isolate and close of a matching key (its state right after, and
//! the transition). No stream walks the keys: the board is read once per
//! round for every viewer, and a stream with a prefix reads one page of its
//! keys that are not closed. Like a gRPC watcher, a reader that falls
//! behind never slows decisions: it gets `lagged`, and the next snapshot
//! catches it up. The stream ends when the server begins to shut down.
//!
//! At most [`Options::max_event_streams`](super::Options::max_event_streams)
//! streams are open at once; past that, 503 with a JSON error.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::response::sse::{Event as SseEvent, KeepAlive, KeepAliveStream, Sse};
use tokio::sync::broadcast::error::RecvError;

use super::api::{overview, prefix_of, PrefixQuery};
use super::error::ApiError;
use super::guard::Caller;
use super::json::{KeyJson, TransitionJson};
use super::state::{AppState, StreamSlot};
use super::trends::{current_board, Board};
use crate::auth::Role;
use crate::engine::{Event, KeyReading};

/// Messages buffered for a reader before the stream waits for it.
const STREAM_BUFFER: usize = 64;

type Sink = crate::outbox::Outbox<Result<SseEvent, Infallible>>;

/// The stream of one reader.
pub type Feed = crate::outbox::Unread<Result<SseEvent, Infallible>>;

/// `GET /api/events?prefix=`.
pub async fn events(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    query: Result<Query<PrefixQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Sse<KeepAliveStream<Feed>>, ApiError> {
    let prefix = prefix_of(query)?;
    // A unit of the caller's share of Watch and event streams (decisions 99).
    let held = state
        .node
        .share_of(caller.0.as_deref())
        .map(|s| s.take(crate::engine::shares::Kind::WatchStreams))
        .transpose()?;
    let Some(slot) = state.streams.open() else {
        return Err(ApiError::unavailable(format!(
            "too many dashboard event streams: {} are open, the most this server keeps; \
             close a dashboard tab or try again later",
            state.streams.max()
        )));
    };
    let (tx, rx) = crate::outbox::outbox(
        state.node.unread(),
        caller.0.as_deref().map(|g| g.tenant.as_str()),
        crate::outbox::Kind::Events,
        STREAM_BUFFER,
        |_| 0,
        |error| {
            let data = serde_json::json!({ "error": error }).to_string();
            Ok(SseEvent::default().event("stuck").data(data))
        },
    );
    // Subscribe before the first snapshot, so that nothing after it is missed.
    let events = state.store.core().subscribe();
    let stopped = state.store.core().stopped();
    // A credential removed by a reload ends the stream at once, with an
    // `refused` event saying so (the guard checked it on every key
    // when the stream opened; it must still read every key).
    let mut credential = crate::auth::Credential::of(state.node.watch_access());
    tokio::spawn(async move {
        let _held = held;
        let mut grant = caller.0;
        let revoked = credential.lost(&mut grant, |g| {
            g.on_everything(Role::Operator, "GET /api/events")
        });
        tokio::select! {
            _ = forward(&state, &prefix, events, &tx, slot) => {}
            () = stopped => {}
            refusal = revoked => {
                let error = refusal.to_string();
                let _ = send(&tx, "refused", &serde_json::json!({ "error": error })).await;
            }
        }
    });
    Ok(Sse::new(rx).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))))
}

async fn forward(
    state: &AppState,
    prefix: &str,
    mut events: tokio::sync::broadcast::Receiver<Event>,
    tx: &Sink,
    _slot: StreamSlot,
) -> Option<()> {
    let mut boards = state.trends.subscribe();
    let board = current_board(&mut boards).await?;
    snapshot(state, &board, prefix, true, tx).await?;
    let core = state.store.core();
    loop {
        tokio::select! {
            received = events.recv() => match received {
                Ok(event) if event.key.starts_with(prefix) => {
                    let change = serde_json::json!({
                        "key": KeyJson::of(core, &KeyReading {
                            key: event.key.to_string(),
                            view: event.view.clone(),
                            now: event.at,
                        }),
                        "transition": TransitionJson::of(core, &event),
                    });
                    send(tx, "change", &change).await?;
                }
                Ok(_) => {}
                Err(RecvError::Lagged(missed)) => {
                    send(tx, "lagged", &serde_json::json!({ "missed": missed })).await?;
                }
                Err(RecvError::Closed) => return None,
            },
            changed = boards.changed() => {
                changed.ok()?;
                let board = boards.borrow_and_update().clone();
                snapshot(state, &board, prefix, false, tx).await?;
            }
            () = tx.closed() => return None,
        }
    }
}

async fn send(tx: &Sink, name: &str, data: &serde_json::Value) -> Option<()> {
    let data = data.to_string();
    let bytes = name.len() + data.len();
    let event = SseEvent::default().event(name).data(data);
    tx.send_sized(Ok(event), bytes).await.then_some(())
}

/// Sends the overview of `board`; with `recent`, the remembered
/// transitions too.
async fn snapshot(
    state: &AppState,
    board: &Arc<Board>,
    prefix: &str,
    recent: bool,
    tx: &Sink,
) -> Option<()> {
    let read = overview(state, board, prefix).await.ok()?;
    let mut data = serde_json::to_value(read).ok()?;
    if recent {
        data["recent"] = serde_json::to_value(state.history.matching(prefix)).ok()?;
    }
    send(tx, "snapshot", &data).await
}

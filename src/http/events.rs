//! `/api/events`: the dashboard's live feed, as server-sent events.
//!
//! A stream starts with a `snapshot` (the matching keys and the remembered
//! transitions), then sends a `change` for every phase change, isolate and
//! close of a matching key (its state right after, and the transition), and
//! a fresh `snapshot` every [`REFRESH`] for what changes without an event
//! (permits, tickets, failures). Like a gRPC watcher, a reader that falls
//! behind never slows decisions: it gets `lagged`, then a fresh snapshot.
//! The stream ends when the server begins to shut down.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::response::sse::{Event as SseEvent, KeepAlive, KeepAliveStream, Sse};
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::api::{listing, prefix_of, ApiError, History, KeyJson, PrefixQuery, TransitionJson};
use super::AppState;
use crate::engine::{Engine, Event, KeyReading};

/// How often a stream sends a fresh snapshot.
pub const REFRESH: Duration = Duration::from_secs(2);

/// Messages buffered for a reader before the stream waits for it.
const STREAM_BUFFER: usize = 64;

type Sink = mpsc::Sender<Result<SseEvent, Infallible>>;

/// The stream of one reader.
pub type Feed = ReceiverStream<Result<SseEvent, Infallible>>;

/// `GET /api/events?prefix=`.
pub async fn events(
    State(state): State<AppState>,
    query: Result<Query<PrefixQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Sse<KeepAliveStream<Feed>>, ApiError> {
    let prefix = prefix_of(query)?;
    let (tx, rx) = mpsc::channel(STREAM_BUFFER);
    // Subscribe before the snapshot, so that nothing after it is missed.
    let events = state.engine.subscribe();
    let engine = state.engine.clone();
    let history = state.history.clone();
    tokio::spawn(async move {
        let stopped = engine.stopped();
        tokio::select! {
            _ = forward(&engine, &history, &prefix, events, &tx) => {}
            () = stopped => {}
        }
    });
    Ok(Sse::new(ReceiverStream::new(rx))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15))))
}

async fn forward(
    engine: &Arc<Engine>,
    history: &History,
    prefix: &str,
    mut events: tokio::sync::broadcast::Receiver<Event>,
    tx: &Sink,
) -> Option<()> {
    snapshot(engine, Some(history), prefix, tx).await?;
    let mut refresh = tokio::time::interval_at(tokio::time::Instant::now() + REFRESH, REFRESH);
    refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            received = events.recv() => match received {
                Ok(event) if event.key.starts_with(prefix) => {
                    let change = serde_json::json!({
                        "key": KeyJson::of(engine, &KeyReading {
                            key: event.key.to_string(),
                            view: event.view.clone(),
                            now: event.at,
                        }),
                        "transition": TransitionJson::of(engine, &event),
                    });
                    send(tx, "change", &change).await?;
                }
                Ok(_) => {}
                Err(RecvError::Lagged(missed)) => {
                    send(tx, "lagged", &serde_json::json!({ "missed": missed })).await?;
                    snapshot(engine, Some(history), prefix, tx).await?;
                }
                Err(RecvError::Closed) => return None,
            },
            _ = refresh.tick() => snapshot(engine, None, prefix, tx).await?,
            () = tx.closed() => return None,
        }
    }
}

async fn send(tx: &Sink, name: &str, data: &serde_json::Value) -> Option<()> {
    let event = SseEvent::default().event(name).data(data.to_string());
    tx.send(Ok(event)).await.ok()
}

/// Sends the matching keys; with `history`, the remembered transitions too.
async fn snapshot(
    engine: &Arc<Engine>,
    history: Option<&History>,
    prefix: &str,
    tx: &Sink,
) -> Option<()> {
    let walk = {
        let engine = engine.clone();
        let prefix = prefix.to_owned();
        // A walk over every key: off the async workers.
        tokio::task::spawn_blocking(move || listing(&engine, &prefix))
    };
    let listing = walk.await.ok()?;
    let mut data = serde_json::to_value(listing).ok()?;
    if let Some(history) = history {
        data["recent"] = serde_json::to_value(history.matching(prefix)).ok()?;
    }
    send(tx, "snapshot", &data).await
}

//! The Watch stream: a snapshot of the matching keys, then their events. A
//! watcher that stops reading never slows decisions: the engine publishes
//! into a bounded broadcast buffer and moves on; a watcher that falls
//! behind is told how much it missed and gets a fresh snapshot.

use std::sync::Arc;

use tokio::sync::broadcast::error::RecvError;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use super::{key_state_of, phase_of, timestamp_of};
use crate::engine::{Engine, Event, EventKind, KeyReading};
use crate::proto::v1 as pb;

/// Keys per snapshot message, so that every message stays small.
const SNAPSHOT_CHUNK: usize = 100;

/// Messages buffered for a watcher before the stream waits for it to read.
const STREAM_BUFFER: usize = 64;

type Sink = mpsc::Sender<Result<pb::WatchEvent, Status>>;

/// Starts a Watch stream of the keys that start with `prefix`.
pub fn stream(
    engine: Arc<Engine>,
    prefix: String,
) -> ReceiverStream<Result<pb::WatchEvent, Status>> {
    let (tx, rx) = mpsc::channel(STREAM_BUFFER);
    // Subscribe before the snapshot, so that nothing after it is missed.
    let events = engine.subscribe();
    tokio::spawn(async move {
        let stopped = engine.stopped();
        tokio::select! {
            _ = forward(&engine, &prefix, events, &tx) => {}
            () = stopped => {}
            // The watcher went away: stop at once, even if no event comes.
            () = tx.closed() => {}
        }
    });
    ReceiverStream::new(rx)
}

async fn forward(
    engine: &Engine,
    prefix: &str,
    mut events: tokio::sync::broadcast::Receiver<Event>,
    tx: &Sink,
) -> Option<()> {
    snapshot(engine, prefix, tx).await?;
    loop {
        match events.recv().await {
            Ok(event) if event.key.starts_with(prefix) => {
                send(
                    tx,
                    pb::watch_event::Event::Transition(transition_of(engine, event)),
                )
                .await?;
            }
            Ok(_) => {}
            Err(RecvError::Lagged(missed)) => {
                send(tx, pb::watch_event::Event::Lagged(pb::Lagged { missed })).await?;
                // Start again from now: the events still buffered are older
                // than the fresh snapshot and must not follow it. Subscribe
                // before reading the snapshot, so that nothing after it is
                // missed (an event may show in both, as at the start).
                events = events.resubscribe();
                snapshot(engine, prefix, tx).await?;
            }
            Err(RecvError::Closed) => return None,
        }
    }
}

async fn send(tx: &Sink, event: pb::watch_event::Event) -> Option<()> {
    tx.send(Ok(pb::WatchEvent { event: Some(event) }))
        .await
        .ok()
}

async fn snapshot(engine: &Engine, prefix: &str, tx: &Sink) -> Option<()> {
    let (readings, _) = engine.list(prefix, &[], None, usize::MAX);
    let mut chunks = readings.chunks(SNAPSHOT_CHUNK).peekable();
    if chunks.peek().is_none() {
        return send(
            tx,
            pb::watch_event::Event::Snapshot(pb::Snapshot {
                keys: Vec::new(),
                complete: true,
            }),
        )
        .await;
    }
    while let Some(chunk) = chunks.next() {
        let keys = chunk
            .iter()
            .map(|r: &KeyReading| key_state_of(engine, r))
            .collect();
        let complete = chunks.peek().is_none();
        send(
            tx,
            pb::watch_event::Event::Snapshot(pb::Snapshot { keys, complete }),
        )
        .await?;
    }
    Some(())
}

fn transition_of(engine: &Engine, e: Event) -> pb::Transition {
    let reading = KeyReading {
        key: e.key.to_string(),
        view: e.view,
        now: e.at,
    };
    pb::Transition {
        key: e.key.to_string(),
        kind: match e.kind {
            EventKind::PhaseChange => pb::TransitionKind::PhaseChange,
            EventKind::Isolate => pb::TransitionKind::Isolate,
            EventKind::Close => pb::TransitionKind::Close,
            EventKind::Policy => pb::TransitionKind::Policy,
        } as i32,
        from: phase_of(e.from) as i32,
        to: phase_of(e.to) as i32,
        cause: e.cause.to_owned(),
        who: e.who,
        reason: e.reason,
        at: Some(timestamp_of(engine.wall_time(e.at))),
        state: Some(key_state_of(engine, &reading)),
        sequence: e.sequence,
    }
}

//! The Watch stream: a snapshot of the matching keys, then their events. A
//! watcher that stops reading never slows decisions: the engine publishes
//! into a bounded broadcast buffer and moves on; a watcher that falls
//! behind is told how much it missed and gets a fresh snapshot.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::sync::broadcast::error::RecvError;
use tonic::Status;

use super::bounds::Bounds;
use super::status::status_of_refusal;
use super::wire::key_state_of;
use crate::auth::{Grant, Role};
use crate::engine::{Core, Cursor, Event, EventKind, KeyReading, Store};
use crate::node::Node;
use crate::proto::v1 as pb;
use crate::proto::wire::{phase_of, timestamp_of};

/// Keys per snapshot message, so that every message stays small and a
/// page of the snapshot is quick to read.
const SNAPSHOT_CHUNK: usize = 100;

// One snapshot page is read at a time, across every Watch stream of the
// server, and snapshots together take at most a tenth of one core
// ([`Bounds::snapshot_pause`]): a hundred watchers that open at once (each
// taking as much as its client's flow-control window lets through,
// megabytes of keys) wait their turn instead of filling the workers, so
// decisions keep their latency.

/// Messages buffered for a watcher before the stream waits for it to read.
/// The snapshot is read a page at a time, only when there is room for it,
/// so a watcher that stops reading holds a few pages and no more.
const STREAM_BUFFER: usize = 4;

type Sink = crate::outbox::Outbox<Result<pb::WatchEvent, Status>>;

/// The events of a Watch stream, as tonic sends them.
pub type Events = crate::outbox::Unread<Result<pb::WatchEvent, Status>>;

/// What an event message holds in memory until it is sent, for the
/// unread bounds: its encoded size, and its keys as structs.
fn size_of(message: &Result<pb::WatchEvent, Status>) -> usize {
    use prost::Message;
    message.as_ref().map_or(256, |m| {
        let keys = match &m.event {
            Some(pb::watch_event::Event::Snapshot(s)) => s.keys.capacity(),
            _ => 1,
        };
        m.encoded_len() + keys * std::mem::size_of::<pb::KeyState>()
    })
}

/// Holds one of the `max_watch_streams` places, and a unit of its
/// credential's share, while a stream is open.
struct Place {
    node: Arc<Node>,
    _share: Option<crate::engine::shares::Hold>,
}

impl Place {
    fn take(node: &Arc<Node>, grant: Option<&Grant>) -> Result<Place, Status> {
        let counters = node.counters();
        let held = node
            .share_of(grant)
            .map(|s| s.take(crate::engine::shares::Kind::WatchStreams))
            .transpose()
            .map_err(|e| {
                counters
                    .watch_streams_refused
                    .fetch_add(1, Ordering::Relaxed);
                Status::resource_exhausted(e.to_string())
            })?;
        let cap = node.limits().max_watch_streams;
        let open = counters.watch_streams.fetch_add(1, Ordering::Relaxed);
        if open >= cap {
            counters.watch_streams.fetch_sub(1, Ordering::Relaxed);
            counters
                .watch_streams_refused
                .fetch_add(1, Ordering::Relaxed);
            return Err(Status::resource_exhausted(format!(
                "too many Watch streams: the server's max_watch_streams cap ({cap}) is reached; close a watcher or raise [server].max_watch_streams"
            )));
        }
        Ok(Place {
            node: node.clone(),
            _share: held,
        })
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        self.node
            .counters()
            .watch_streams
            .fetch_sub(1, Ordering::Relaxed);
    }
}

/// Starts a Watch stream of `node`'s keys that start with `prefix`, its
/// snapshot pages taken in turn under `bounds`, or refuses it with
/// `RESOURCE_EXHAUSTED` past the cap.
pub fn stream(
    node: Arc<Node>,
    bounds: Arc<Bounds>,
    prefix: String,
    grant: Option<Arc<Grant>>,
) -> Result<Events, Status> {
    let place = Place::take(&node, grant.as_deref())?;
    let mut credential = crate::auth::Credential::of(node.watch_access());
    let store = node.store().clone();
    let (tx, rx) = crate::outbox::outbox(
        node.unread(),
        grant.as_deref().map(|g| g.tenant.as_str()),
        crate::outbox::Kind::Watch,
        STREAM_BUFFER,
        size_of,
        |m| Err(Status::resource_exhausted(m)),
    );
    // Subscribe before the snapshot, so that nothing after it is missed.
    let events = store.core().subscribe();
    tokio::spawn(async move {
        let _place = place;
        let stopped = store.core().stopped();
        let mut grant = grant;
        let revoked = credential.lost(&mut grant, |g| {
            g.on_prefix(Role::Operator, "Watch", &prefix)
        });
        tokio::select! {
            _ = forward(&store, &bounds, &prefix, events, &tx) => {}
            refusal = revoked => {
                tx.end(Err(status_of_refusal(refusal)));
            }
            () = stopped => {
                // The stream ends UNAVAILABLE, not OK: the watcher did not
                // see everything, and should watch another instance. A
                // watcher that does not read is not waited for long.
                let gone = Status::unavailable(
                    "fusebox is shutting down; watch again (another instance, or this one once it is back)",
                );
                tx.end(Err(gone));
            }
            // The watcher went away: stop at once, even if no event comes.
            () = tx.closed() => {}
        }
    });
    Ok(rx)
}

async fn forward(
    store: &Store,
    bounds: &Bounds,
    prefix: &str,
    mut events: tokio::sync::broadcast::Receiver<Event>,
    tx: &Sink,
) -> Option<()> {
    snapshot(store, bounds, prefix, tx).await?;
    loop {
        match events.recv().await {
            Ok(event) if event.key.starts_with(prefix) => {
                send(
                    tx,
                    pb::watch_event::Event::Transition(transition_of(store.core(), event)),
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
                snapshot(store, bounds, prefix, tx).await?;
            }
            Err(RecvError::Closed) => return None,
        }
    }
}

async fn send(tx: &Sink, event: pb::watch_event::Event) -> Option<()> {
    tx.send(Ok(pb::WatchEvent { event: Some(event) }))
        .await
        .then_some(())
}

/// Sends the keys as they are now, a page at a time in key order, each
/// page read only once the watcher has room for it.
async fn snapshot(store: &Store, bounds: &Bounds, prefix: &str, tx: &Sink) -> Option<()> {
    let mut from = Cursor::Start;
    loop {
        let (keys, more) = {
            let _turn = bounds.snapshot_turn().acquire().await.ok()?;
            let started = std::time::Instant::now();
            let page = store
                .list_page(prefix, &[], &from, SNAPSHOT_CHUNK)
                .await
                .ok()?;
            let keys: Vec<pb::KeyState> = page
                .readings
                .iter()
                .map(|r: &KeyReading| key_state_of(store.core(), r))
                .collect();
            let pause = bounds.snapshot_pause(started.elapsed());
            if !pause.is_zero() {
                tokio::time::sleep(pause).await;
            }
            let more = page.next.is_some();
            if let Some(next) = page.next {
                from = next;
            }
            (keys, more)
        };
        let page = pb::watch_event::Event::Snapshot(pb::Snapshot {
            keys,
            complete: !more,
        });
        send(tx, page).await?;
        if !more {
            return Some(());
        }
        // Let decisions waiting on this worker go first.
        tokio::task::yield_now().await;
    }
}

fn transition_of(core: &Core, e: Event) -> pb::Transition {
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
        at: Some(timestamp_of(core.wall_time(e.at))),
        state: Some(key_state_of(core, &reading)),
        sequence: e.sequence,
    }
}

//! What watchers are told: phase changes, isolates and closes.
//!
//! A key's events are made under its shard lock and queued in the shard's
//! outbox, so they keep the key's order; they are sent after the lock is
//! released. Sending takes one engine-wide lock, only when a breaker moved
//! (never on an ordinary decision), so that sequence numbers increase along
//! every stream.

use std::sync::{Arc, Mutex};

use tokio::sync::broadcast;

use crate::domain::{Cause, Millis, Notice, Phase, View};

/// How many events a watcher may fall behind before it is told it lagged.
pub const EVENT_BUFFER: usize = 4096;

/// What a watcher is told: a phase change, isolate or close of one key.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    /// The key.
    pub key: Arc<str>,
    /// What happened.
    pub kind: EventKind,
    /// The phase before.
    pub from: Phase,
    /// The phase after.
    pub to: Phase,
    /// Why, in words.
    pub cause: &'static str,
    /// Who asked (isolate and close).
    pub who: String,
    /// The operator's reason (isolate and close).
    pub reason: String,
    /// When, on the engine's clock.
    pub at: Millis,
    /// The event's number; consecutive numbers for consecutive events.
    pub sequence: u64,
    /// The key's state right after the operation.
    pub view: View,
}

/// The kinds of [`Event`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// The breaker changed phase by itself.
    PhaseChange,
    /// An operator isolated the key.
    Isolate,
    /// An operator closed the key.
    Close,
    /// A changed policy moved the breaker.
    Policy,
}

/// The event of a phase change `notice` (none for other notices), with
/// the operator's name and reason for isolate and close.
pub(super) fn event_of(
    key: &Arc<str>,
    notice: &Notice,
    view: &View,
    actor: Option<(&str, &str)>,
    shadow: bool,
) -> Option<Event> {
    let Notice::Phase {
        from,
        to,
        cause,
        at,
    } = *notice
    else {
        return None;
    };
    let kind = match cause {
        Cause::Isolated => EventKind::Isolate,
        Cause::Closed => EventKind::Close,
        Cause::PolicyChanged => EventKind::Policy,
        _ => EventKind::PhaseChange,
    };
    let (who, reason) = match (kind, actor) {
        (EventKind::Isolate | EventKind::Close, Some((who, why))) => {
            (who.to_owned(), why.to_owned())
        }
        _ => (String::new(), String::new()),
    };
    Some(Event {
        key: key.clone(),
        kind,
        from,
        to,
        cause: cause.text(shadow),
        who,
        reason,
        at,
        sequence: 0,
        view: view.clone(),
    })
}

/// Numbers events and sends them to every subscriber.
pub(super) struct Publisher {
    sender: broadcast::Sender<Event>,
    /// The next event's number; held while a batch is sent.
    next: Mutex<u64>,
}

impl Publisher {
    pub(super) fn new() -> Self {
        Publisher {
            sender: broadcast::channel(EVENT_BUFFER).0,
            next: Mutex::new(0),
        }
    }

    pub(super) fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.sender.subscribe()
    }

    /// Sends the events that `take` hands over, numbered in order. `take`
    /// runs under the publisher's lock, so batches taken one after another
    /// leave in the order they were taken.
    pub(super) fn send_batch(&self, take: impl FnOnce() -> Vec<Event>) {
        let mut next = self.next.lock().expect("publisher lock");
        for mut event in take() {
            event.sequence = *next;
            *next += 1;
            let _no_watchers = self.sender.send(event);
        }
    }
}

/// Logs a phase change in words an operator understands.
pub(super) fn log_change(key: &str, change: &Notice, shadow: bool) {
    if let Notice::Phase {
        from,
        to,
        cause,
        at,
    } = *change
    {
        tracing::info!(key, from = %from, to = %to, at_ms = at, "breaker {from} -> {to}: {}", cause.text(shadow));
    }
}

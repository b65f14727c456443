//! What every handler of one server's HTTP side shares ([`AppState`]): the
//! store and the server, the timeline, the board's sampler, the open
//! dashboard event streams and the connection slots, with their figures
//! ([`HttpFigures`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::history::History;
use super::slots::Slots;
use super::trends::Trends;
use crate::engine::Store;
use crate::node::Node;

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

    /// The cap.
    pub fn max(&self) -> u64 {
        self.max
    }
}

/// The HTTP side's own figures, for the exposition.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HttpFigures {
    /// Dashboard event streams open now.
    pub event_streams: u64,
    /// Event streams refused because [`HttpFigures::max_event_streams`] were open.
    pub event_streams_refused: u64,
    /// The cap on open event streams.
    pub max_event_streams: u64,
    /// Open HTTP connections.
    pub connections: u64,
    /// HTTP connections closed at once because the cap was reached and
    /// none was idle.
    pub connections_refused: u64,
    /// Idle HTTP connections closed to make room for a new one.
    pub idle_closed: u64,
    /// HTTP connections closed because their peer read nothing of an
    /// answer for `http_write_timeout`.
    pub write_timed_out: u64,
}

/// What every handler shares: one server's HTTP side.
#[derive(Clone, Debug)]
pub struct AppState {
    /// Where the keys are.
    pub store: Store,
    /// The server: who may call, its caps and counters.
    pub node: Arc<Node>,
    /// Recent transitions, for the dashboard's timeline.
    pub history: Arc<History>,
    /// The board and the sparklines, from the one sampler task.
    pub trends: Arc<Trends>,
    /// Open event streams and their cap.
    pub streams: Arc<Streams>,
    /// The connection slots (`[server] max_http_connections`).
    pub slots: Arc<Slots>,
}

impl AppState {
    /// The HTTP side of `node`. Starts the tasks that remember transitions
    /// for the timeline and sample the board, so it must be called inside
    /// a Tokio runtime.
    pub fn new(node: Arc<Node>, options: Options) -> AppState {
        let store = node.store().clone();
        AppState {
            node,
            history: History::record(store.core().clone()),
            trends: Trends::start(store.clone(), options.sample_every),
            streams: Streams::new(options.max_event_streams),
            slots: Arc::new(Slots::default()),
            store,
        }
    }

    /// The HTTP side's figures now.
    pub fn figures(&self) -> HttpFigures {
        let slots = self.slots.figures();
        HttpFigures {
            event_streams: self.streams.open.load(Ordering::Relaxed),
            event_streams_refused: self.streams.refused.load(Ordering::Relaxed),
            max_event_streams: self.streams.max,
            connections: slots.connections,
            connections_refused: slots.refused,
            idle_closed: slots.idle_closed,
            write_timed_out: slots.write_timed_out,
        }
    }
}

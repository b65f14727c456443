//! A link to the store: one Redis server's connection manager (which
//! reconnects with backoff), or the Redis Cluster client (which follows
//! MOVED and ASK). The connection ([`super::conn`]) makes them; the
//! batches ([`super::batch`]) send on them.

use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;

/// A connection to the store.
#[derive(Clone)]
pub(super) enum Link {
    /// To one Redis server.
    Single(ConnectionManager),
    /// To a Redis Cluster.
    Cluster(ClusterConnection),
}

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::super::store::StoreFigures;
use super::super::EngineError;

/// The breaker on the link to the store (F4-F6 in
/// docs/contract-extensions.md): once the link fails (refused, reset,
/// timed out), every call answers UNAVAILABLE at once, saying since when
/// and why, while one background probe asks the store again (with
/// backoff) and closes the breaker when it answers. Each transition is
/// logged once; `/metrics` shows the state and counts the calls failed
/// fast.
pub(super) struct Health {
    /// The store, as the messages name it (no password).
    url: String,
    /// True while the breaker is open: read by every call, without a lock.
    down: AtomicBool,
    state: Mutex<State>,
    figures: Arc<StoreFigures>,
}

#[derive(Default)]
struct State {
    /// Since when, and why, while open.
    down: Option<Down>,
    /// A probe runs (at most one).
    probing: bool,
    /// When a cluster's nodes were last checked after a failure.
    checked: Option<Instant>,
}

struct Down {
    unix_ms: u64,
    at: Instant,
    why: String,
}

/// What a failure of the link asks of the caller that saw it.
pub(super) enum Next {
    /// Nothing: a probe runs already, or a check ran a moment ago.
    Nothing,
    /// Start the probe (the breaker is open, or must be checked).
    Probe,
}

/// How often the store is checked after failures at most, while the
/// breaker is closed (one slow command, or one cluster node down, is not a
/// dead link).
const CHECK_EVERY: Duration = Duration::from_secs(1);

impl Health {
    pub(super) fn new(url: String, figures: Arc<StoreFigures>) -> Health {
        Health {
            url,
            down: AtomicBool::new(false),
            state: Mutex::new(State::default()),
            figures,
        }
    }

    /// UNAVAILABLE at once while the breaker is open, saying since when
    /// and why; counted in `fusebox_store_fast_failed_total`.
    pub(super) fn refuse(&self) -> Result<(), EngineError> {
        if !self.down.load(Ordering::Acquire) {
            return Ok(());
        }
        let state = self.state.lock().expect("link state");
        let Some(down) = &state.down else {
            return Ok(());
        };
        self.figures.fast_failed.fetch_add(1, Ordering::Relaxed);
        Err(EngineError::StoreUnavailable(format!(
            "the store at {} is unreachable since {} ({:.1} s ago: {}); retrying in the background, and until it answers every call is answered at once",
            self.url,
            super::super::storage::humantime_of(down.unix_ms),
            down.at.elapsed().as_secs_f64(),
            down.why
        )))
    }

    /// A command on the link failed (refused, reset, timed out): the
    /// store is checked (a `PING` to the server, or to a cluster's seed
    /// nodes), at most every [`CHECK_EVERY`]; the breaker opens only when
    /// it does not answer ([`Health::unanswered`]). One slow command on a
    /// busy store is not a dead link; a refused connection fails its
    /// `PING` at once.
    pub(super) fn failed(&self) -> Next {
        let mut state = self.state.lock().expect("link state");
        let recent = state.checked.is_some_and(|at| at.elapsed() < CHECK_EVERY);
        if state.probing || recent {
            return Next::Nothing;
        }
        state.checked = Some(Instant::now());
        state.probing = true;
        Next::Probe
    }

    /// A probe found no node answering, saying `why`: the breaker opens
    /// (if it is not open).
    pub(super) fn unanswered(&self, why: &str) {
        let mut state = self.state.lock().expect("link state");
        self.open(&mut state, why);
    }

    fn open(&self, state: &mut State, why: &str) {
        if state.down.is_some() {
            return;
        }
        state.down = Some(Down {
            unix_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            at: Instant::now(),
            why: why.to_owned(),
        });
        self.down.store(true, Ordering::Release);
        self.figures.link_down.store(1, Ordering::Relaxed);
        self.figures.link_breaks.fetch_add(1, Ordering::Relaxed);
        tracing::error!(
            store = %self.url,
            "the store at {} is unreachable ({why}): calls answer UNAVAILABLE at once while fusebox retries in the background",
            self.url
        );
    }

    /// The probe ends: the store answered (the breaker closes, if open).
    pub(super) fn answered(&self) {
        let mut state = self.state.lock().expect("link state");
        state.probing = false;
        let Some(down) = state.down.take() else {
            return;
        };
        self.down.store(false, Ordering::Release);
        self.figures.link_down.store(0, Ordering::Relaxed);
        tracing::warn!(
            store = %self.url,
            "the store at {} answers again after {:.1} s unreachable: calls go through",
            self.url,
            down.at.elapsed().as_secs_f64()
        );
    }

    /// The probe ends without an answer (nobody holds the link any more).
    pub(super) fn given_up(&self) {
        self.state.lock().expect("link state").probing = false;
    }
}

//! What the gRPC services of one server bound together, beyond the
//! server's caps: `Decide` streams per connection, Decide frames in flight
//! to the store (decisions 102), the single calls in flight that Decide
//! parts yield to (decisions 103), and the turn and the share of a core
//! that Watch snapshot pages take. One [`Bounds`] per server, made with
//! its services ([`super::Api::new`]): two servers in one process bound
//! apart.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

use crate::engine::shares::Share;

/// With a store, a message's frames are sent in parts of this many.
pub const STORE_PART: usize = 256;

/// The most Decide frames in flight to the store at once, server-wide
/// (decisions 102): two parts, enough to keep a Redis busy.
pub const MAX_STORE_FRAMES_IN_FLIGHT: usize = 2 * STORE_PART;

const _: () = assert!(crate::engine::shares::STORE_FRAMES_PER_CREDENTIAL == STORE_PART);

/// The most `Decide` streams open on one connection.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 16;

/// The share of one core that snapshot pages may use together.
const SNAPSHOT_SHARE: f64 = 0.1;

/// The bounds of one server's gRPC services.
#[derive(Debug)]
pub struct Bounds {
    /// Open `Decide` streams by connection (the peer's address); a
    /// connection's entry goes with its last stream.
    by_peer: Mutex<HashMap<SocketAddr, u32>>,
    /// The Decide frames in flight to the store.
    store_frames: Semaphore,
    /// Single calls (Acquire, Complete, Renew and the batches) in flight
    /// with a credential, with a store: what Decide parts yield to.
    calling: AtomicU64,
    /// One snapshot page is read at a time, across every Watch stream.
    snapshot_turn: Semaphore,
    /// Time spent reading snapshot pages since the first instant.
    snapshot_spent: Mutex<Option<(Instant, Duration)>>,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds {
            by_peer: Mutex::new(HashMap::new()),
            store_frames: Semaphore::new(MAX_STORE_FRAMES_IN_FLIGHT),
            calling: AtomicU64::new(0),
            snapshot_turn: Semaphore::new(1),
            snapshot_spent: Mutex::new(None),
        }
    }
}

/// One `Decide` stream counted against its connection's
/// [`MAX_STREAMS_PER_CONNECTION`], until dropped.
#[derive(Debug)]
pub struct PeerStream {
    bounds: Arc<Bounds>,
    peer: SocketAddr,
}

impl Drop for PeerStream {
    fn drop(&mut self) {
        let mut streams = self.bounds.by_peer.lock().expect("streams lock");
        if let Some(open) = streams.get_mut(&self.peer) {
            *open -= 1;
            if *open == 0 {
                streams.remove(&self.peer);
            }
        }
    }
}

/// One single call in flight, counted for its credential and the server
/// until dropped.
#[derive(Debug)]
pub struct Calling {
    share: Arc<Share>,
    bounds: Arc<Bounds>,
}

impl Drop for Calling {
    fn drop(&mut self) {
        self.share.calls_in_flight().fetch_sub(1, Ordering::Relaxed);
        self.bounds.calling.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Bounds {
    /// A place for one more `Decide` stream of `peer`'s connection, or
    /// `None` when it has [`MAX_STREAMS_PER_CONNECTION`] open.
    pub fn peer_stream(self: &Arc<Self>, peer: SocketAddr) -> Option<PeerStream> {
        let mut streams = self.by_peer.lock().expect("streams lock");
        let open = streams.entry(peer).or_insert(0);
        if *open >= MAX_STREAMS_PER_CONNECTION {
            return None;
        }
        *open += 1;
        Some(PeerStream {
            bounds: self.clone(),
            peer,
        })
    }

    /// The Decide frames in flight to the store.
    pub fn store_frames(&self) -> &Semaphore {
        &self.store_frames
    }

    /// Counts a single call of `share`'s credential while it is in flight.
    pub fn calling(self: &Arc<Self>, share: &Arc<Share>) -> Calling {
        share.calls_in_flight().fetch_add(1, Ordering::Relaxed);
        self.calling.fetch_add(1, Ordering::Relaxed);
        Calling {
            share: share.clone(),
            bounds: self.clone(),
        }
    }

    /// Whether a credential other than `share`'s has a single call in flight.
    pub fn others_calling(&self, share: &Share) -> bool {
        self.calling.load(Ordering::Relaxed) > share.calls_in_flight().load(Ordering::Relaxed)
    }

    /// The turn to read one snapshot page (one at a time, across every
    /// Watch stream of the server).
    pub fn snapshot_turn(&self) -> &Semaphore {
        &self.snapshot_turn
    }

    /// Records `spent` on a snapshot page and says how long to pause so
    /// that snapshots stay within their share of a core (counted over
    /// windows of about a second).
    pub fn snapshot_pause(&self, spent: Duration) -> Duration {
        let now = Instant::now();
        let mut budget = self.snapshot_spent.lock().expect("snapshot budget lock");
        let (since, used) = budget.get_or_insert((now, Duration::ZERO));
        if now.duration_since(*since) > Duration::from_secs(1) {
            *since = now;
            *used = Duration::ZERO;
        }
        *used += spent;
        let allowed = used.div_f64(SNAPSHOT_SHARE);
        allowed.saturating_sub(now.duration_since(*since))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_holds_at_most_its_streams_and_frees_them() {
        let bounds = Arc::new(Bounds::default());
        let other = Arc::new(Bounds::default());
        let peer: SocketAddr = "127.0.0.1:4000".parse().unwrap();
        let held: Vec<_> = (0..MAX_STREAMS_PER_CONNECTION)
            .map(|_| bounds.peer_stream(peer).expect("room"))
            .collect();
        assert!(bounds.peer_stream(peer).is_none(), "the connection is full");
        assert!(
            other.peer_stream(peer).is_some(),
            "another server's bounds are its own"
        );
        drop(held);
        assert!(
            bounds.by_peer.lock().unwrap().is_empty(),
            "entries go with their streams"
        );
        assert!(bounds.peer_stream(peer).is_some());
    }

    #[test]
    fn snapshots_pause_to_stay_within_their_share() {
        let bounds = Bounds::default();
        let pause = bounds.snapshot_pause(Duration::from_millis(10));
        // 10 ms of work allows 100 ms of wall time.
        assert!(pause > Duration::from_millis(50), "{pause:?}");
        assert!(pause <= Duration::from_millis(100), "{pause:?}");
    }
}

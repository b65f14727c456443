//! The caps the engine holds (K2, K3): live keys, tickets and waiters, the
//! rules in force, the streams a credential's share counts, and how long an
//! idle key and an unsaved breaker change wait. The server's other caps
//! (connections, handshakes, unread answers) are not the engine's.

use crate::domain::Millis;

/// The engine's validated caps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Cap on live keys.
    pub max_keys: u64,
    /// Cap on live tickets.
    pub max_tickets: u64,
    /// Cap on waiting requests.
    pub max_waiters: u64,
    /// Cap on open Watch streams (a share counts them).
    pub max_watch_streams: u64,
    /// Cap on open Decide streams, server-wide (a share counts them).
    pub max_decide_streams: u64,
    /// Cap on the rules in force.
    pub max_rules: u64,
    /// How long a key at rest is kept.
    pub idle_after: Millis,
    /// How long breaker changes may wait before they are written to the
    /// data dir, together (operator actions and policies never wait).
    pub commit_window: Millis,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_keys: 1_000_000,
            max_tickets: 1_000_000,
            max_waiters: 100_000,
            max_watch_streams: 256,
            max_decide_streams: 1_024,
            max_rules: 1_000,
            idle_after: crate::domain::IDLE_AFTER,
            commit_window: 50,
        }
    }
}

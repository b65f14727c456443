//! What the engine is asked and what it answers, whichever store holds
//! the keys: the arguments of an acquire, its answer and a completion's,
//! a key as read, and the figures kept as keys change.

use crate::domain::{CallerId, Decision, Millis, Phase, View};

/// A request for permits, as the server hands it over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AcquireArgs {
    /// The key.
    pub key: String,
    /// Permits (0 = status check).
    pub permits: u32,
    /// How long the request may wait server-side.
    pub max_wait: Millis,
    /// The lease asked for.
    pub lease: Option<Millis>,
    /// Which attempt of the call this is (R1): 0 or 1 a first attempt, 2
    /// or more a retry.
    pub attempt: u32,
    /// Who asks (Q1): the credential's name, the Acquire's `caller`, or
    /// the peer's address, as the server resolved it; empty when nobody
    /// says (in-process).
    pub caller: String,
}

impl AcquireArgs {
    /// True when the request says it is a retry (R1).
    pub fn is_retry(&self) -> bool {
        self.attempt >= 2
    }

    /// The caller's fingerprint (Q1).
    pub fn caller_id(&self) -> CallerId {
        CallerId::of(&self.caller)
    }
}

/// The engine's answer to an acquire.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AcquireReply {
    /// The decision (never `Queued`: the engine waits).
    pub decision: Decision,
    /// The ticket's token, when one was given.
    pub ticket: Option<String>,
    /// Time left on the ticket's lease.
    pub lease_left: Option<Millis>,
    /// The phase after the call.
    pub phase: Phase,
}

/// The engine's answer to a completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CompleteReply {
    /// The outcome was stale (B3).
    pub stale: bool,
    /// The phase after the call.
    pub phase: Phase,
}

/// A key as read, with the time it was read at.
#[derive(Clone, Debug, PartialEq)]
pub struct KeyReading {
    /// The key.
    pub key: String,
    /// What it shows.
    pub view: View,
    /// The engine's time of the reading.
    pub now: Millis,
}

/// Engine-wide figures (see [`Engine::totals`](super::Engine::totals)); each shard keeps its own
/// as they change, and a read sums them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    /// Live keys.
    pub keys: u64,
    /// Live keys by phase, indexed by [`Phase::index`].
    pub by_phase: [u64; 4],
    /// Live tickets.
    pub tickets: u64,
    /// Waiting requests.
    pub waiters: u64,
    /// Keys forgotten since start (K2).
    pub forgotten: u64,
    /// Final decisions by kind (see [`DECISION_NAMES`]).
    pub decisions: [u64; 6],
    /// Blocked and denied decisions by reason, in [`crate::domain::Reason::ALL`] order.
    pub reasons: [u64; crate::domain::Reason::COUNT],
    /// Phase changes.
    pub transitions: u64,
    /// Requests refused (RESOURCE_EXHAUSTED) at a cap, by [`CAP_NAMES`].
    pub cap_refusals: [u64; 3],
}

/// The caps of [`Totals::cap_refusals`], as their `[server]` fields.
pub const CAP_NAMES: [&str; 3] = ["max_keys", "max_tickets", "max_waiters"];

/// Decisions by kind, in [`Totals::decisions`] order.
pub const DECISION_NAMES: [&str; 6] =
    ["granted", "probe", "blocked", "refused", "denied", "shadow"];

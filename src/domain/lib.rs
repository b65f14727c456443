//! The rules of fusebox as pure, deterministic state machines.
//!
//! Nothing in this crate performs I/O, reads a clock or spawns a task: every
//! operation takes `now`, a count of milliseconds on the engine's monotonic
//! clock (SPEC T0), and returns a value. The engine wraps these machines in a
//! sharded map, reads the clock and sleeps until [`Fuse::next_deadline`].
//!
//! Layout:
//! - [`policy`]: validated policies (Y1–Y3) and the plain specs they come from;
//! - [`breaker`] and [`health`]: the circuit breaker of SPEC section 1;
//! - [`limiter`]: the four limiter kinds of SPEC section 2, one file each;
//! - [`book`]: the permit book, a limiter with its wait queue (P1–P8);
//! - [`ticket`]: a ticket's id and its text form;
//! - [`decision`]: the answer to a request, a value;
//! - [`fuse`]: everything kept for one key, and the one decision over breaker
//!   and book (C1–C6), tickets and leases (L1–L4); [`FuseState`] is a key's
//!   exact, versioned, serde-able snapshot;
//! - [`key`]: the key syntax of K1;
//! - [`names`]: how the enums written as text are read back;
//! - [`wire`]: what the Redis module and the fusebox servers say to each
//!   other (replies, views, notices), one type for both sides;
//! - [`hex`]: the lower-case hexadecimal of ids and MACs (the `hex` crate).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod book;
pub mod breaker;
pub mod budget;
pub mod decision;
pub mod fuse;
pub mod health;
pub mod key;
pub mod limiter;
pub mod names;
pub mod policy;
pub mod quorum;
pub mod ticket;
pub mod wire;

pub use book::{Book, Waiter};
pub use breaker::{Admission, Breaker, Durable, Probing, Report};
pub use budget::{Budget, BudgetSegment};
pub use decision::{Decision, DecisionKind, Grant};
pub use fuse::{
    sorted_tickets, Ask, BreakerState, CallersState, Cause, Completed, CounterState, Fuse,
    FuseError, FuseHead, FuseState, HeapParts, LimiterState, Notice, OperatorAction, ProbingState,
    Quote, ReasonCounts, SlotState, StateError, Stats, Ticket, TicketState, TicketTable, Tickets,
    View, WaiterState, WindowBucket, STATE_VERSION,
};
pub use fuse::{SlowCalls, SlowPending, SlowPendingState, SlowState};
pub use key::{validate_key, KeyError, IDLE_AFTER};
pub use names::{Named, UnknownName};
pub use policy::{
    millionths, policy_id, BreakerPolicy, DurationSpec, HalfOpen, LeasePolicy, LimiterKind,
    LimiterPolicy, Order, Policy, PolicyError, PolicySpec, Trip,
};
pub use policy::{Slow, SlowSpec};
pub use quorum::{CallerId, Callers, MAX_QUORUM};
pub use ticket::TicketId;

/// Lower-case hexadecimal: the `hex` crate, through the domain so that its
/// users need no dependency of their own. Every hex form fusebox writes is
/// lower case (ticket ids, policy ids, page tokens, MACs).
pub mod hex {
    pub use ::hex::{decode, decode_to_slice, encode, encode_to_slice, FromHexError};
}

/// A count of milliseconds on the engine's monotonic clock, or a duration in
/// milliseconds (SPEC T0, T1).
pub type Millis = u64;

/// The breaker's phase (SPEC section 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Phase {
    /// Requests are admitted and outcomes are recorded for the trip mode.
    Closed,
    /// Requests are blocked until the break's deadline.
    Open,
    /// One probe at a time decides whether the dependency recovered.
    HalfOpen,
    /// Set by an operator: every request is refused until `Close`.
    Isolated,
}

impl Phase {
    /// Every phase, in wire order.
    pub const ALL: [Phase; 4] = [Phase::Closed, Phase::Open, Phase::HalfOpen, Phase::Isolated];

    /// The phase's place in [`Phase::ALL`], for tables indexed by phase.
    pub fn index(self) -> usize {
        self as usize
    }

    /// The name used in logs, vectors and the CLI.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Closed => "CLOSED",
            Phase::Open => "OPEN",
            Phase::HalfOpen => "HALF_OPEN",
            Phase::Isolated => "ISOLATED",
        }
    }
}

names::named!(Phase, "phase");

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the caller reports about the call a ticket covered (SPEC B3, B4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Outcome {
    /// The dependency answered well.
    Success,
    /// The dependency failed.
    Failure,
    /// The call says nothing about the dependency (cancelled, bad request...).
    Ignored,
}

impl Outcome {
    /// Every outcome.
    pub const ALL: [Outcome; 3] = [Outcome::Success, Outcome::Failure, Outcome::Ignored];

    /// The name used in the config, the vectors and the CLI.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Success => "SUCCESS",
            Outcome::Failure => "FAILURE",
            Outcome::Ignored => "IGNORED",
        }
    }
}

names::named!(Outcome, "outcome");

/// Why a request was blocked or denied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// The breaker is open and its break has not ended.
    Open,
    /// The breaker is half-open and another request holds the probe slot.
    ProbeInFlight,
    /// Not enough permits now, and the request may not wait.
    NoPermits,
    /// The wait queue has no room for the request.
    QueueFull,
    /// The request asks for more permits than the limit: it can never succeed.
    ExceedsLimit,
    /// A newer request pushed this waiter out of a full `newest_first` queue.
    Evicted,
    /// The waiter's `max_wait` ended before permits came free.
    Timeout,
    /// A retry beyond the key's retry budget (R2).
    RetryBudget,
}

impl Reason {
    /// The lower-case name used in the vectors and the CLI.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Open => "open",
            Reason::ProbeInFlight => "probe_in_flight",
            Reason::NoPermits => "no_permits",
            Reason::QueueFull => "queue_full",
            Reason::ExceedsLimit => "exceeds_limit",
            Reason::Evicted => "evicted",
            Reason::Timeout => "timeout",
            Reason::RetryBudget => "retry_budget",
        }
    }

    /// Every reason, in wire order.
    pub const ALL: [Reason; Reason::COUNT] = [
        Reason::Open,
        Reason::ProbeInFlight,
        Reason::NoPermits,
        Reason::QueueFull,
        Reason::ExceedsLimit,
        Reason::Evicted,
        Reason::Timeout,
        Reason::RetryBudget,
    ];

    /// How many reasons there are.
    pub const COUNT: usize = 8;
}

names::named!(Reason, "reason");

#[cfg(test)]
mod tests {
    use super::*;
    use std::str::FromStr;

    /// Serde's names (the state's and the config's) are the `as_str`
    /// names, and each reads back in any case.
    #[test]
    fn each_name_is_written_once_and_reads_back() {
        fn check<T>(all: &[T], name: fn(T) -> &'static str)
        where
            T: Copy + PartialEq + std::fmt::Debug + FromStr + serde::Serialize,
            T::Err: std::fmt::Debug,
        {
            for &v in all {
                let text = name(v);
                assert_eq!(serde_json::to_value(v).unwrap(), text);
                assert_eq!(text.parse::<T>().unwrap(), v);
                assert_eq!(text.to_ascii_lowercase().parse::<T>().unwrap(), v);
                assert_eq!(text.to_ascii_uppercase().parse::<T>().unwrap(), v);
            }
            assert!("no such name".parse::<T>().is_err());
        }
        check(&Phase::ALL, Phase::as_str);
        check(&Outcome::ALL, Outcome::as_str);
        check(&Reason::ALL, Reason::as_str);
        // A decision's serde name (in a stored state's notices) is its kind's.
        let grant = Grant {
            ticket: TicketId(1),
            lease_end: 2,
        };
        let decisions = [
            Decision::Granted(None),
            Decision::Probe(grant),
            Decision::Blocked {
                reason: Reason::Open,
                retry_after: 1,
            },
            Decision::Refused,
            Decision::Denied {
                reason: Reason::NoPermits,
                retry_after: None,
            },
            Decision::Queued,
        ];
        for (decision, kind) in decisions.into_iter().zip(DecisionKind::ALL) {
            assert_eq!(decision.kind(), kind);
            let tag = match serde_json::to_value(decision).unwrap() {
                serde_json::Value::Object(fields) => fields.keys().next().cloned().unwrap(),
                serde_json::Value::String(name) => name,
                other => panic!("{other}"),
            };
            assert_eq!(tag, kind.as_str());
            assert_eq!(kind.as_str().parse::<DecisionKind>().unwrap(), kind);
        }
    }
}

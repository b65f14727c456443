//! A key's whole state as plain, versioned data: what a store that keeps
//! each key as one value (and runs one step per command: load, step, store)
//! writes between steps.
//!
//! [`Fuse::state`] takes the snapshot; [`Fuse::from_state`] checks it and
//! rebuilds the fuse through the same code paths the fuse itself uses (the
//! policy through [`PolicySpec::validate`], tickets through their table,
//! waiters through the book's queue, the limiter from a fresh one of the
//! policy's kind), so a restored fuse is indistinguishable from the
//! original: equal to it, and giving the same decisions, views and notices
//! from then on.
//!
//! The snapshot is deterministic: tickets sorted by id, waiters in queue
//! order, no map iteration order anywhere. Ticket ids are written as 32
//! lower-case hex digits. Like the policy spec it embeds (whose durations
//! read as numbers or strings), it needs a self-describing format (JSON,
//! CBOR, MessagePack...). The policy's two floats (`failure_ratio`,
//! `multiplier`) come back bit for bit only from a reader that parses floats
//! exactly (serde_json does with its `float_roundtrip` feature; without it,
//! a float of 17 significant digits may come back one unit in the last
//! place away).

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{Counters, Fuse, Live, MoreCounters, Notice, Ticket, TicketTable};
use crate::book::{Book, Waiter};
use crate::breaker::{Breaker, Probing};
use crate::budget::{Budget, BudgetSegment, SEGMENTS};
use crate::health::HealthWindow;
use crate::limiter::{
    Adaptive, Concurrency, FixedWindow, Limiter, SlidingWindow, TokenBucket, ADAPTIVE_UNIT,
};
use crate::policy::{LimiterKind, Policy, PolicyError, PolicySpec};
use crate::quorum::{CallerId, Callers, MAX_QUORUM};
use crate::ticket::TicketId;
use crate::{Millis, Phase, Reason};

/// The version of [`FuseState`] this build writes, and the newest it reads.
/// Version 4 added tickets' and waiters' `caller` and the breaker's
/// `callers` (Q1-Q2), live slow calls (`slow`, S2) and the slow outcomes
/// of the window's buckets and the counters (S1), the adaptive limiter's
/// state; version 5 gave that state its present meaning (an older one is
/// read as a limiter that measures its baseline again, CX26). Version 3
/// added the
/// breaker's `probing` (H1-H4); version 2 added
/// tickets' `granted_at` and `settles` and a token bucket's negative tokens
/// (U1); version 1 is read with neither (its tickets settle no cost).
/// Version 6 added tickets' `seq`, their grant order (T2); older tickets
/// read as granted together (`seq` 0), settled among themselves by id; and
/// `slow_counted` (S2's "each once" across a policy change).
pub const STATE_VERSION: u32 = 6;

/// The largest time, count or epoch a state may hold: 2^53, far beyond
/// anything a key reaches (285,000 years of milliseconds, or 2^53 events),
/// so that no later step of a restored key can overflow.
const LIMIT: u64 = 1 << 53;

/// Everything fusebox keeps for one key, as plain data (see the module
/// documentation). Made by [`Fuse::state`], read by [`Fuse::from_state`].
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FuseState {
    /// The layout's version: [`STATE_VERSION`].
    pub version: u32,
    /// The policy in force, as the spec it validates from ([`crate::Policy::spec`]).
    pub policy: PolicySpec,
    /// The last time the key saw.
    pub last_now: Millis,
    /// The breaker.
    pub breaker: BreakerState,
    /// The limiter's state; present exactly when the policy has a limiter,
    /// of the same kind, under the policy's settings.
    pub limiter: Option<LimiterState>,
    /// Live tickets, sorted by id.
    pub tickets: Vec<TicketState>,
    /// The grant number the next ticket takes (T2); 0 when absent (before
    /// version 6, or no ticket live).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub next_seq: u64,
    /// Waiters in queue order, oldest first.
    pub waiters: Vec<WaiterState>,
    /// Statistics.
    pub counters: CounterState,
    /// Notices not yet drained, oldest first.
    pub notices: Vec<Notice>,
    /// The retry budget's segments, oldest first (R3); absent when none
    /// is kept (before version 3: always).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub budget: Vec<BudgetSegment>,
    /// Live slow calls (S2); absent when none is tracked (before version
    /// 4: always).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slow: Option<SlowState>,
}

/// A breaker's state.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct BreakerState {
    /// The phase.
    pub phase: Phase,
    /// The epoch: it changes at every phase change and probe admission.
    pub epoch: u64,
    /// When open, the end of the break; when half-open, the end of the
    /// probe slot (0 when the slot is free); 0 when closed or isolated.
    pub deadline: Millis,
    /// When the phase last changed.
    pub changed_at: Millis,
    /// Failures in a row.
    pub run: u32,
    /// Probes admitted since the breaker last closed.
    pub attempts: u32,
    /// Openings since the last recovery (the backoff step).
    pub openings: u32,
    /// The ratio mode's sampling window, in the order its buckets were made.
    pub window: Vec<WindowBucket>,
    /// A half-open period's successes and slots beyond the single slot
    /// (H1-H4); absent when it has none (before version 3: always).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probing: Option<ProbingState>,
    /// Under a quorum, the callers of the run's and the window's failures
    /// (Q2); absent when none are recorded (before version 4: always).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callers: Option<CallersState>,
}

/// The callers a breaker under a quorum recorded (see [`Callers`]).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct CallersState {
    /// The distinct callers of the run's failures.
    pub run: Vec<CallerId>,
    /// Each distinct caller of a window failure and the start of the
    /// bucket of its latest one, oldest first.
    pub window: Vec<(CallerId, Millis)>,
    /// The same for slow outcomes (S1).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub slow: Vec<(CallerId, Millis)>,
}

/// A half-open period's successes and slots (see [`crate::breaker::Probing`]).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ProbingState {
    /// Current probe successes counted in the period.
    pub successes: u32,
    /// The period follows the rule of several slots.
    pub shared: bool,
    /// Under that rule, each probe's ticket and the end of its slot, in
    /// admission order.
    pub slots: Vec<SlotState>,
}

/// One probe slot of a period of several.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SlotState {
    /// The probe's ticket.
    pub ticket: TicketId,
    /// When the slot ends.
    pub until: Millis,
}

/// One bucket of the ratio mode's sampling window.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct WindowBucket {
    /// When the bucket starts.
    pub start: Millis,
    /// Successes recorded in it.
    pub successes: u32,
    /// Failures recorded in it.
    pub failures: u32,
    /// Of those outcomes, the slow ones (S1; before version 4: 0).
    #[serde(default, skip_serializing_if = "is_zero32")]
    pub slow: u32,
}

/// A limiter's state, of one of the four kinds; its settings are the policy's.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum LimiterState {
    /// Permits held by live tickets.
    Concurrency {
        /// Permits held.
        held: u64,
    },
    /// Tokens as of the last refill tick counted.
    TokenBucket {
        /// Tokens, between `-capacity` and `capacity` (U1).
        tokens: i64,
        /// The last tick counted: ticks happen at `tick * period`.
        tick: u64,
    },
    /// Permits used in one window.
    FixedWindow {
        /// The window's index: it starts at `index * window`.
        index: u64,
        /// Permits used in it, up to `2 * permits` (U1).
        used: u64,
    },
    /// Permits taken per segment.
    SlidingWindow {
        /// `[segment index, permits taken]`, oldest first.
        taken: Vec<(u64, u64)>,
    },
    /// An adaptive limit and what it learned (section 10, CX20-CX27).
    Adaptive {
        /// Permits held.
        held: u64,
        /// The learned limit, in millionths of a permit.
        limit: u64,
        /// The baseline age, in thousandths of a ms (0: none yet; 2^64 - 1:
        /// being measured again).
        #[serde(alias = "short")]
        base: u64,
        /// The ages (ms) of the current round's or measurement's samples.
        #[serde(alias = "low")]
        sum: u64,
        /// How many samples those are.
        #[serde(alias = "before")]
        count: u64,
        /// When the current round or measurement began.
        #[serde(alias = "window")]
        since: u64,
    },
}

impl LimiterState {
    fn name(&self) -> &'static str {
        match self {
            LimiterState::Concurrency { .. } => "concurrency",
            LimiterState::TokenBucket { .. } => "token_bucket",
            LimiterState::FixedWindow { .. } => "fixed_window",
            LimiterState::SlidingWindow { .. } => "sliding_window",
            LimiterState::Adaptive { .. } => "adaptive",
        }
    }
}

/// A live ticket.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TicketState {
    /// The ticket's id.
    pub id: TicketId,
    /// The breaker epoch it was issued in.
    pub epoch: u64,
    /// Permits it asked for.
    pub permits: u32,
    /// True when it is the probe.
    pub probe: bool,
    /// When its lease ends.
    pub lease_end: Millis,
    /// True when its permits are concurrency permits that must come back.
    pub holds: bool,
    /// When its permits were taken (U1). Absent (version 1) = 0.
    #[serde(default)]
    pub granted_at: Millis,
    /// True when a reported cost is settled against its permits (U1).
    /// Absent (version 1) = false: such a ticket settles no cost.
    #[serde(default)]
    pub settles: bool,
    /// Who acquired it (Q1). Absent (before version 4) = the empty name's.
    #[serde(default = "no_caller")]
    pub caller: CallerId,
    /// True for a shadow ticket (D2). Absent (before version 4) = false.
    #[serde(default, skip_serializing_if = "is_false")]
    pub shadow: bool,
    /// Its grant number on the key (T2: lease ends at one instant settle
    /// in grant order). Absent (before version 6) = 0.
    #[serde(default)]
    pub seq: u64,
    /// Counted in the statistics' `slow` already (S2). Absent (before
    /// version 6) = false.
    #[serde(default, skip_serializing_if = "is_false")]
    pub slow_counted: bool,
}

fn no_caller() -> CallerId {
    CallerId::of("")
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// A waiting request.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct WaiterState {
    /// The ticket it gets when served.
    pub id: TicketId,
    /// Permits it asks for (at least 1).
    pub permits: u32,
    /// When its `max_wait` ends.
    pub until: Millis,
    /// The lease it asked for; `None` = the policy's default.
    pub lease: Option<Millis>,
    /// Who asked (Q1). Absent (before version 4) = the empty name's.
    #[serde(default = "no_caller")]
    pub caller: CallerId,
}

/// The key's statistics, as totals; what [`crate::Stats`] derives from
/// them (blocked, denied, evicted, timed out, failed) is not stored.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct CounterState {
    /// Tickets granted as ordinary requests.
    pub granted: u64,
    /// Probes admitted.
    pub probes: u64,
    /// Requests refused while isolated.
    pub refused: u64,
    /// Blocked and denied requests by reason.
    pub by_reason: ReasonCounts,
    /// Requests that waited in the queue.
    pub queued: u64,
    /// Waiters withdrawn.
    pub withdrawn: u64,
    /// Outcomes recorded as successes.
    pub successes: u64,
    /// Outcomes recorded as failures.
    pub failures: u64,
    /// Outcomes reported as ignored.
    pub ignored: u64,
    /// Outcomes that arrived stale.
    pub stale: u64,
    /// Tickets whose lease ended.
    pub expired: u64,
    /// Tickets that became slow (S1, S2), each once (before version 4: 0).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub slow: u64,
    /// Shadow grants (D1); absent before version 4.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub shadow: u64,
}

fn is_zero32(n: &u32) -> bool {
    *n == 0
}

/// A key's live slow calls (S2, see [`crate::SlowCalls`]).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SlowState {
    /// When the policy's `slow.duration` came in force.
    pub since: Millis,
    /// Live slow tickets.
    pub live: u32,
    /// Current closed-period tickets not slow yet, in the order they
    /// become slow.
    pub pending: Vec<SlowPendingState>,
    /// The callers of the live slow tickets, each with how many it holds
    /// (Q2 for S3 (b)).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub callers: Vec<(CallerId, u32)>,
}

/// A ticket not slow yet.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SlowPendingState {
    /// When it becomes live slow.
    pub at: Millis,
    /// The ticket.
    pub ticket: TicketId,
    /// It is counted in `slow` already.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub counted: bool,
    /// Who acquired it (Q1).
    #[serde(default = "no_caller")]
    pub caller: CallerId,
}

/// Blocked and denied requests, by [`Reason`].
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ReasonCounts {
    /// [`Reason::Open`].
    pub open: u64,
    /// [`Reason::ProbeInFlight`].
    pub probe_in_flight: u64,
    /// [`Reason::NoPermits`].
    pub no_permits: u64,
    /// [`Reason::QueueFull`].
    pub queue_full: u64,
    /// [`Reason::ExceedsLimit`].
    pub exceeds_limit: u64,
    /// [`Reason::Evicted`].
    pub evicted: u64,
    /// [`Reason::Timeout`].
    pub timeout: u64,
    /// [`Reason::RetryBudget`]; absent before version 3.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub retry_budget: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl From<[u64; Reason::COUNT]> for ReasonCounts {
    fn from(c: [u64; Reason::COUNT]) -> Self {
        let at = |r: Reason| c[r as usize];
        ReasonCounts {
            open: at(Reason::Open),
            probe_in_flight: at(Reason::ProbeInFlight),
            no_permits: at(Reason::NoPermits),
            queue_full: at(Reason::QueueFull),
            exceeds_limit: at(Reason::ExceedsLimit),
            evicted: at(Reason::Evicted),
            timeout: at(Reason::Timeout),
            retry_budget: at(Reason::RetryBudget),
        }
    }
}

impl From<ReasonCounts> for [u64; Reason::COUNT] {
    fn from(c: ReasonCounts) -> Self {
        let mut all = [0; Reason::COUNT];
        for (r, n) in [
            (Reason::Open, c.open),
            (Reason::ProbeInFlight, c.probe_in_flight),
            (Reason::NoPermits, c.no_permits),
            (Reason::QueueFull, c.queue_full),
            (Reason::ExceedsLimit, c.exceeds_limit),
            (Reason::Evicted, c.evicted),
            (Reason::Timeout, c.timeout),
            (Reason::RetryBudget, c.retry_budget),
        ] {
            all[r as usize] = n;
        }
        all
    }
}

/// Why a state was refused; nothing is built from a refused state.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    /// The layout's version is not one this build reads.
    #[error(
        "version: {0} is not a state version this build reads (it reads 1 to {STATE_VERSION})"
    )]
    UnknownVersion(u32),
    /// The policy does not validate.
    #[error("policy.{0}")]
    Policy(#[from] PolicyError),
    /// The limiter's state is missing, unexpected, or of another kind than
    /// the policy's limiter.
    #[error("limiter: the state is for {state} but the policy's limiter is {policy}")]
    LimiterKind {
        /// The state's kind, or "none".
        state: &'static str,
        /// The policy's kind, or "none".
        policy: &'static str,
    },
    /// A value is beyond what any key reaches, or later than `last_now`
    /// where it cannot be.
    #[error("{field}: {value} is out of range (at most {max})")]
    OutOfRange {
        /// The field.
        field: &'static str,
        /// Its value.
        value: u64,
        /// The largest value it may have here.
        max: u64,
    },
    /// A closed or isolated breaker has a deadline.
    #[error("breaker.deadline: must be 0 while {phase}, not {deadline}")]
    Deadline {
        /// The phase.
        phase: Phase,
        /// The deadline found.
        deadline: Millis,
    },
    /// Retry-budget segments without a budget, out of order, too many, or
    /// after the last time seen.
    #[error("budget: segments only under a retry budget, at most 11, in increasing order, none after last_now")]
    Budget,
    /// A bucket of the sampling window holds no outcome.
    #[error("breaker.window: every bucket must hold an outcome, and no more slow outcomes than outcomes")]
    Window,
    /// More callers recorded than a quorum keeps.
    #[error("breaker.callers: at most 100 callers in the run and 100 in the window")]
    Callers,
    /// Live slow calls without slow calls in the policy or while not
    /// closed, out of order, with a ticket twice, or already due.
    #[error("slow: only under a policy with slow calls while closed, in order, each ticket once, none due by last_now")]
    Slow,
    /// Probing outside a half-open period, slots under the single-slot
    /// rule, or more slots than any policy allows.
    #[error("breaker.probing: only a half-open period probes; only the rule of several slots keeps slots, at most 1000")]
    Probing,
    /// The sliding window's segments are out of order.
    #[error("limiter.taken: segments must be in increasing order")]
    Segments,
    /// Tickets are not sorted by id, or an id appears twice.
    #[error("tickets: must be in increasing id order without repeats; {0} is out of place")]
    TicketOrder(TicketId),
    /// More than one ticket is flagged as the probe.
    #[error("tickets: more than one ticket is the probe")]
    TwoProbes,
    /// A ticket was issued in an epoch the breaker has not reached.
    #[error("tickets: {id} has epoch {epoch}, after the breaker's {current}")]
    FutureEpoch {
        /// The ticket.
        id: TicketId,
        /// Its epoch.
        epoch: u64,
        /// The breaker's epoch.
        current: u64,
    },
    /// An adaptive limit outside its policy's `[min, max]`.
    #[error("limiter.limit: {limit} millionths, outside the policy's [{low}, {high}]")]
    AdaptiveLimit {
        /// The state's limit.
        limit: u64,
        /// `min`, in millionths.
        low: u64,
        /// `max`, in millionths.
        high: u64,
    },
    /// A ticket holds permits that no concurrency limiter takes back.
    #[error(
        "tickets: {0} holds permits, but the limiter is not a concurrency or adaptive limiter"
    )]
    HoldsWithoutConcurrency(TicketId),
    /// A shadow ticket is a probe, holds permits or settles a cost (D2).
    #[error(
        "tickets: {0} is a shadow ticket, so it cannot be a probe, hold permits or settle a cost"
    )]
    ShadowHolds(TicketId),
    /// A ticket settles a cost, but the limiter is not a token bucket or window.
    #[error("tickets: {0} settles a cost, but the limiter is not a token bucket or window")]
    SettlesWithoutRate(TicketId),
    /// The concurrency limiter's held permits are not those of the tickets.
    #[error("limiter.held: {held} permits, but live tickets hold {tickets}")]
    HeldPermits {
        /// The limiter's count.
        held: u64,
        /// The tickets' sum.
        tickets: u64,
    },
    /// A waiter's id appears twice, or is also a live ticket's.
    #[error("waiters: {0} appears twice, or is also a live ticket")]
    DuplicateWaiter(TicketId),
    /// A waiter asks for no permits.
    #[error("waiters: {0} asks for 0 permits")]
    WaiterWithoutPermits(TicketId),
    /// A waiter asks for a lease of 0, which is refused before anyone waits.
    #[error("waiters: {0} asks for a lease of 0 ms")]
    WaiterZeroLease(TicketId),
    /// A waiter asks for more permits than the limit.
    #[error("waiters: {id} asks for {permits} permits, above the limit of {limit}")]
    WaiterAboveLimit {
        /// The waiter.
        id: TicketId,
        /// Permits it asks for.
        permits: u32,
        /// The limiter's limit.
        limit: u32,
    },
    /// Waiters with no limiter, or while the breaker does not admit normally.
    #[error("waiters: none may wait without a limiter or while the breaker is not CLOSED (here {phase}, limiter {limiter})")]
    WaitersNotAllowed {
        /// The breaker's phase.
        phase: Phase,
        /// The policy's limiter kind, or "none".
        limiter: &'static str,
    },
}

fn at_most(field: &'static str, value: u64, max: u64) -> Result<(), StateError> {
    if value > max {
        return Err(StateError::OutOfRange { field, value, max });
    }
    Ok(())
}

fn limiter_name(kind: Option<&LimiterKind>) -> &'static str {
    kind.map_or("none", LimiterKind::name)
}

/// Splits a total into the inline 32 bits and what carried past them.
fn split(total: u64) -> (u32, u64) {
    let inline = total as u32;
    (inline, total - u64::from(inline))
}

impl Counters {
    fn state(&self) -> CounterState {
        let zero = MoreCounters::default();
        let more = self.more.as_deref().unwrap_or(&zero);
        CounterState {
            granted: more.granted + u64::from(self.granted),
            probes: more.probes,
            refused: more.refused,
            by_reason: more.by_reason.into(),
            queued: more.queued,
            withdrawn: more.withdrawn,
            successes: more.successes + u64::from(self.successes),
            failures: more.failures + u64::from(self.failures),
            ignored: more.ignored,
            stale: more.stale,
            expired: more.expired,
            slow: more.slow,
            shadow: more.shadow,
        }
    }

    /// The counters that count `s`: the rarer counts are boxed exactly when
    /// one of them is not zero, as counting makes them.
    fn from_state(s: &CounterState) -> Result<Counters, StateError> {
        let by_reason: [u64; Reason::COUNT] = s.by_reason.into();
        for (field, value) in [
            ("counters.granted", s.granted),
            ("counters.probes", s.probes),
            ("counters.refused", s.refused),
            ("counters.queued", s.queued),
            ("counters.withdrawn", s.withdrawn),
            ("counters.successes", s.successes),
            ("counters.failures", s.failures),
            ("counters.ignored", s.ignored),
            ("counters.stale", s.stale),
            ("counters.expired", s.expired),
            ("counters.slow", s.slow),
            ("counters.shadow", s.shadow),
        ] {
            at_most(field, value, LIMIT)?;
        }
        for count in by_reason {
            at_most("counters.by_reason", count, LIMIT)?;
        }
        let (granted, more_granted) = split(s.granted);
        let (successes, more_successes) = split(s.successes);
        let (failures, more_failures) = split(s.failures);
        let more = MoreCounters {
            granted: more_granted,
            successes: more_successes,
            failures: more_failures,
            probes: s.probes,
            refused: s.refused,
            by_reason,
            queued: s.queued,
            withdrawn: s.withdrawn,
            ignored: s.ignored,
            stale: s.stale,
            expired: s.expired,
            slow: s.slow,
            shadow: s.shadow,
        };
        Ok(Counters {
            granted,
            successes,
            failures,
            tag: 0,
            more: (more != MoreCounters::default()).then(|| Box::new(more)),
        })
    }
}

impl Breaker {
    fn state(&self) -> BreakerState {
        BreakerState {
            phase: self.phase,
            epoch: self.epoch,
            deadline: self.deadline,
            changed_at: self.changed_at,
            run: self.run,
            attempts: self.attempts,
            openings: self.openings,
            window: self
                .window
                .buckets()
                .map(|b| WindowBucket {
                    start: b.start,
                    successes: b.successes,
                    failures: b.failures,
                    slow: b.slow,
                })
                .collect(),
            probing: self.probing().map(|p| ProbingState {
                successes: p.successes,
                shared: p.shared,
                slots: p
                    .slots
                    .iter()
                    .map(|&(ticket, until)| SlotState { ticket, until })
                    .collect(),
            }),
            callers: self.callers().map(|c| CallersState {
                run: c.run.clone(),
                window: c.window.clone(),
                slow: c.slow.clone(),
            }),
        }
    }

    fn from_state(s: &BreakerState, last_now: Millis) -> Result<Breaker, StateError> {
        at_most("breaker.epoch", s.epoch, LIMIT)?;
        at_most("breaker.deadline", s.deadline, LIMIT)?;
        at_most("breaker.changed_at", s.changed_at, LIMIT)?;
        if matches!(s.phase, Phase::Closed | Phase::Isolated) && s.deadline != 0 {
            return Err(StateError::Deadline {
                phase: s.phase,
                deadline: s.deadline,
            });
        }
        // Buckets are in recording order; their starts need not increase,
        // since a changed sampling window aligns new buckets to another width.
        for b in &s.window {
            at_most("breaker.window.start", b.start, last_now)?;
            if (b.successes, b.failures) == (0, 0)
                || u64::from(b.slow) > u64::from(b.successes) + u64::from(b.failures)
            {
                return Err(StateError::Window);
            }
        }
        let probing = match &s.probing {
            None => None,
            Some(_) if s.phase != Phase::HalfOpen => return Err(StateError::Probing),
            Some(p) if !p.shared && !p.slots.is_empty() => return Err(StateError::Probing),
            Some(p) if p.slots.len() > crate::policy::MAX_HALF_OPEN as usize => {
                return Err(StateError::Probing)
            }
            Some(p) => {
                for slot in &p.slots {
                    at_most("breaker.probing.slots.until", slot.until, LIMIT)?;
                }
                Some(Probing {
                    successes: p.successes,
                    shared: p.shared,
                    slots: p.slots.iter().map(|s| (s.ticket, s.until)).collect(),
                })
            }
        };
        let callers = match &s.callers {
            None => None,
            Some(c)
                if c.run.len() > MAX_QUORUM as usize || c.window.len() > MAX_QUORUM as usize =>
            {
                return Err(StateError::Callers)
            }
            Some(c) => {
                for &(_, start) in c.window.iter().chain(&c.slow) {
                    at_most("breaker.callers.window", start, last_now)?;
                }
                let callers = Callers {
                    run: c.run.clone(),
                    window: c.window.clone(),
                    slow: c.slow.clone(),
                };
                (!callers.is_empty()).then_some(callers)
            }
        };
        let mut breaker = Breaker {
            epoch: s.epoch,
            deadline: s.deadline,
            changed_at: s.changed_at,
            run: s.run,
            attempts: s.attempts,
            openings: s.openings,
            phase: s.phase,
            window: HealthWindow::of(s.window.iter().map(|b| crate::health::Bucket {
                start: b.start,
                successes: b.successes,
                failures: b.failures,
                slow: b.slow,
            })),
            extra: None,
        };
        breaker.set_probing(probing);
        breaker.set_callers(callers);
        Ok(breaker)
    }
}

impl Limiter {
    fn state(&self) -> LimiterState {
        match self {
            Limiter::Concurrency(t) => LimiterState::Concurrency { held: t.state.held },
            Limiter::TokenBucket(t) => LimiterState::TokenBucket {
                tokens: t.state.tokens,
                tick: t.state.tick,
            },
            Limiter::FixedWindow(t) => LimiterState::FixedWindow {
                index: t.state.index,
                used: t.state.used,
            },
            Limiter::SlidingWindow(t) => LimiterState::SlidingWindow {
                taken: t.state.taken.iter().copied().collect(),
            },
            Limiter::Adaptive(t) => {
                let [limit, base, sum, count, since] = t.state.parts();
                LimiterState::Adaptive {
                    held: t.state.held(),
                    limit,
                    base,
                    sum,
                    count,
                    since,
                }
            }
        }
    }

    /// A fresh limiter of `kind`, as the fuse makes one, given the state `s`.
    /// Windows and ticks are counted no later than `last_now`'s.
    fn from_state(
        kind: &LimiterKind,
        s: &LimiterState,
        last_now: Millis,
    ) -> Result<Limiter, StateError> {
        let mut limiter = Limiter::new(kind, last_now);
        match (&mut limiter, s) {
            (Limiter::Concurrency(t), &LimiterState::Concurrency { held }) => {
                t.state = Concurrency { held };
            }
            (Limiter::TokenBucket(t), &LimiterState::TokenBucket { tokens, tick }) => {
                at_most("limiter.tick", tick, last_now / t.settings.period.get())?;
                t.state = TokenBucket { tokens, tick };
            }
            (Limiter::FixedWindow(t), &LimiterState::FixedWindow { index, used }) => {
                at_most("limiter.index", index, last_now / t.settings.window.get())?;
                t.state = FixedWindow { index, used };
            }
            (Limiter::SlidingWindow(t), LimiterState::SlidingWindow { taken }) => {
                let segment =
                    (t.settings.window.get() / u64::from(t.settings.segments.get())).max(1);
                let mut previous = None;
                for &(index, _) in taken {
                    at_most("limiter.taken", index, last_now / segment)?;
                    if previous.is_some_and(|p| p >= index) {
                        return Err(StateError::Segments);
                    }
                    previous = Some(index);
                }
                t.state = SlidingWindow {
                    taken: taken.iter().copied().collect(),
                };
            }
            (
                Limiter::Adaptive(t),
                &LimiterState::Adaptive {
                    held,
                    limit,
                    base,
                    sum,
                    count,
                    since,
                },
            ) => {
                let (bottom, top) = (
                    u64::from(t.settings.min.get()) * ADAPTIVE_UNIT,
                    u64::from(t.settings.max.get()) * ADAPTIVE_UNIT,
                );
                if !(bottom..=top).contains(&limit) {
                    return Err(StateError::AdaptiveLimit {
                        limit,
                        low: bottom,
                        high: top,
                    });
                }
                if base != crate::limiter::ADAPTIVE_MEASURING {
                    at_most("limiter.base", base, LIMIT)?;
                }
                at_most("limiter.sum", sum, LIMIT)?;
                at_most("limiter.count", count, LIMIT)?;
                at_most("limiter.since", since, last_now)?;
                t.state = Adaptive::from_parts(held, [limit, base, sum, count, since]);
            }
            (_, s) => {
                return Err(StateError::LimiterKind {
                    state: s.name(),
                    policy: kind.name(),
                })
            }
        }
        Ok(limiter)
    }
}

impl<T: TicketTable> Fuse<T> {
    /// This key's whole state, as plain data: [`Fuse::from_state`] gives
    /// back a fuse equal to this one. Tickets are sorted by id, waiters in
    /// queue order.
    pub fn state(&self) -> FuseState {
        let live = self.live.as_deref();
        let tickets: Vec<TicketState> = live
            .map(|l| super::tickets::sorted(&l.tickets))
            .unwrap_or_default()
            .into_iter()
            .map(|(id, t)| TicketState {
                id,
                epoch: t.epoch,
                permits: t.permits,
                probe: t.probe,
                lease_end: t.lease_end,
                holds: t.holds,
                granted_at: t.granted_at,
                settles: t.settles,
                caller: t.caller,
                shadow: t.shadow,
                seq: t.seq,
                slow_counted: t.slow_counted,
            })
            .collect();
        let FuseHead {
            last_now,
            breaker,
            limiter,
            waiters,
            counters,
            budget,
            slow,
        } = self.head();
        FuseState {
            version: STATE_VERSION,
            policy: self.policy.spec(),
            last_now,
            breaker,
            limiter,
            tickets,
            next_seq: live.map_or(0, |l| l.tickets.next_seq()),
            waiters,
            counters,
            notices: live.map_or_else(Vec::new, |l| l.notices.clone()),
            budget,
            slow,
        }
    }
}

impl Fuse {
    /// The fuse whose state is `s`, after checking it: a known version, a
    /// valid policy (validated as any spec is), a limiter of the policy's
    /// kind, tickets sorted by id with one probe at most and epochs the
    /// breaker reached, concurrency permits held exactly by the tickets
    /// that hold them, waiters with unique ids, permits within the limit,
    /// only while the breaker is closed, and times, epochs and counts in
    /// range. Tickets, waiters and the limiter are rebuilt through the
    /// fuse's own tables, so the result is indistinguishable from the fuse
    /// the state was taken from.
    pub fn from_state(s: FuseState) -> Result<Fuse, StateError> {
        if !(1..=STATE_VERSION).contains(&s.version) {
            return Err(StateError::UnknownVersion(s.version));
        }
        let policy = Arc::new(s.policy.validate()?);
        let mut limiter = s.limiter;
        if s.version < 5 {
            if let Some(LimiterState::Adaptive { held, limit, .. }) = limiter {
                // Learned by the algorithm before version 5: measured again.
                limiter = Some(LimiterState::Adaptive {
                    held,
                    limit,
                    base: 0,
                    sum: 0,
                    count: 0,
                    since: 0,
                });
            }
        }
        let head = FuseHead {
            last_now: s.last_now,
            breaker: s.breaker,
            limiter,
            waiters: s.waiters,
            counters: s.counters,
            budget: s.budget,
            slow: s.slow,
        };
        let (tickets, next_seq) = (s.tickets, s.next_seq);
        at_most("next_seq", next_seq, LIMIT)?;
        let mut fuse = assemble(policy, head, |breaker, kind| {
            let (mut table, held) = checked_tickets(&tickets, breaker, kind)?;
            table.raise_next_seq(next_seq);
            Ok((table, held))
        })?;
        fuse.live_mut().notices = s.notices;
        fuse.tidy();
        Ok(fuse)
    }
}

/// Everything of a key's state but its tickets and its notices: what a
/// store that keeps the tickets apart (in a [`TicketTable`] of its own, in
/// place) writes between steps. Made by [`Fuse::head`], read by
/// [`Fuse::from_head`].
#[derive(Clone, Debug, PartialEq)]
pub struct FuseHead {
    /// The last time the key saw.
    pub last_now: Millis,
    /// The breaker.
    pub breaker: BreakerState,
    /// The limiter's state; present exactly when the policy has a limiter.
    pub limiter: Option<LimiterState>,
    /// Waiters in queue order, oldest first.
    pub waiters: Vec<WaiterState>,
    /// Statistics.
    pub counters: CounterState,
    /// The retry budget's segments, oldest first.
    pub budget: Vec<BudgetSegment>,
    /// Live slow calls (S2), when any is tracked.
    pub slow: Option<SlowState>,
}

impl<T: TicketTable> Fuse<T> {
    /// This key's state but its tickets and notices ([`FuseHead`]).
    pub fn head(&self) -> FuseHead {
        let live = self.live.as_deref();
        FuseHead {
            last_now: self.last_now,
            breaker: self.breaker.state(),
            limiter: self.limiter().map(Limiter::state),
            waiters: live
                .into_iter()
                .flat_map(|l| l.book.iter())
                .map(|w| WaiterState {
                    id: w.id,
                    permits: w.permits,
                    until: w.until,
                    lease: w.lease,
                    caller: w.caller,
                })
                .collect(),
            counters: self.counters.state(),
            budget: self.budget().segments().to_vec(),
            slow: live
                .map(|l| &l.slow)
                .filter(|s| !s.is_empty())
                .map(|s| SlowState {
                    since: s.since,
                    live: s.live,
                    pending: s
                        .pending
                        .iter()
                        .map(|p| SlowPendingState {
                            at: p.at,
                            ticket: p.ticket,
                            counted: p.counted,
                            caller: p.caller,
                        })
                        .collect(),
                    callers: s.callers.clone(),
                }),
        }
    }

    /// The fuse whose head is `head` under `policy`, with `tickets` as its
    /// live tickets. The head is checked as [`Fuse::from_state`] checks a
    /// state; the table is taken as it is (a store that keeps one in place
    /// checks its layout when it reads it), so that making a fuse costs
    /// the same with a thousand tickets as with none.
    pub fn from_head(
        policy: Arc<Policy>,
        head: FuseHead,
        tickets: T,
    ) -> Result<Fuse<T>, StateError> {
        let mut fuse = assemble(policy, head, |_, _| Ok((tickets, None)))?;
        fuse.tidy();
        Ok(fuse)
    }

    /// The table of live tickets, once a step is done with the fuse;
    /// `None` when the fuse holds no live part (and so no ticket).
    pub fn into_tickets(self) -> Option<T> {
        self.live.map(|live| live.tickets)
    }
}

/// Tickets of a state, checked (order, epochs, times, holds, one probe),
/// in the engine's table, with the concurrency permits they hold.
fn checked_tickets(
    tickets: &[TicketState],
    breaker: &Breaker,
    kind: Option<&LimiterKind>,
) -> Result<(super::Tickets, Option<u64>), StateError> {
    let mut table = super::Tickets::default();
    let mut probes = 0;
    let mut held = 0u64;
    let mut previous = None;
    for t in tickets {
        if previous.is_some_and(|p| p >= t.id) {
            return Err(StateError::TicketOrder(t.id));
        }
        previous = Some(t.id);
        if t.epoch > breaker.epoch {
            return Err(StateError::FutureEpoch {
                id: t.id,
                epoch: t.epoch,
                current: breaker.epoch,
            });
        }
        at_most("tickets.lease_end", t.lease_end, LIMIT)?;
        at_most("tickets.granted_at", t.granted_at, LIMIT)?;
        // Below the limit, so that the next number (one more) stays in
        // range when the state is written again.
        at_most("tickets.seq", t.seq, LIMIT - 1)?;
        if t.settles && !kind.is_some_and(LimiterKind::is_rate) {
            return Err(StateError::SettlesWithoutRate(t.id));
        }
        if t.shadow && (t.probe || t.holds || t.settles) {
            return Err(StateError::ShadowHolds(t.id));
        }
        probes += usize::from(t.probe);
        if t.holds {
            if !kind.is_some_and(LimiterKind::returns_permits) {
                return Err(StateError::HoldsWithoutConcurrency(t.id));
            }
            held += u64::from(t.permits);
        }
        table.insert(
            t.id,
            Ticket {
                epoch: t.epoch,
                permits: t.permits,
                probe: t.probe,
                lease_end: t.lease_end,
                holds: t.holds,
                granted_at: t.granted_at,
                settles: t.settles,
                caller: t.caller,
                shadow: t.shadow,
                seq: t.seq,
                slow_counted: t.slow_counted,
            },
        );
    }
    if probes > 1 {
        return Err(StateError::TwoProbes);
    }
    Ok((table, Some(held)))
}

/// A fuse from its parts, each checked; `tickets` makes the table (and,
/// when it can tell, the concurrency permits its tickets hold) once the
/// breaker and the limiter's kind are known.
/// A retry budget's segments, checked: only under a policy with a budget,
/// at most [`SEGMENTS`] + 1, in increasing order, none after `last_now`.
fn checked_budget(
    policy: &Policy,
    segments: &[BudgetSegment],
    last_now: Millis,
) -> Result<Budget, StateError> {
    if segments.is_empty() {
        return Ok(Budget::default());
    }
    let Some(rb) = policy.retry_budget else {
        return Err(StateError::Budget);
    };
    let in_order = segments.windows(2).all(|w| w[0].index < w[1].index);
    let last = segments.last().map_or(0, |s| s.index);
    if !in_order || segments.len() as u64 > SEGMENTS + 1 || last > last_now / rb.segment_ms() {
        return Err(StateError::Budget);
    }
    for s in segments {
        at_most("budget.first", s.first, LIMIT)?;
        at_most("budget.retries", s.retries, LIMIT)?;
    }
    Ok(Budget {
        segments: segments.to_vec(),
    })
}

/// Live slow calls, checked: only under a policy with slow calls while
/// closed, instants in order and in range, no ticket twice.
fn checked_slow(
    policy: &Policy,
    breaker: &Breaker,
    s: Option<&SlowState>,
    last_now: Millis,
) -> Result<super::SlowCalls, StateError> {
    let Some(s) = s else {
        return Ok(super::SlowCalls::default());
    };
    let has_slow = policy.breaker.is_some_and(|b| b.slow.is_some());
    let in_order = s.pending.windows(2).all(|w| w[0].at <= w[1].at);
    let mut ids: Vec<TicketId> = s.pending.iter().map(|p| p.ticket).collect();
    ids.sort_unstable();
    ids.dedup();
    if !has_slow
        || breaker.phase != Phase::Closed
        || !in_order
        || ids.len() != s.pending.len()
        || s.pending.first().is_some_and(|p| p.at <= last_now)
    {
        return Err(StateError::Slow);
    }
    at_most("slow.since", s.since, last_now)?;
    for p in &s.pending {
        at_most("slow.pending.at", p.at, LIMIT)?;
    }
    Ok(super::SlowCalls {
        since: s.since,
        live: s.live,
        pending: s
            .pending
            .iter()
            .map(|p| super::SlowPending {
                at: p.at,
                ticket: p.ticket,
                counted: p.counted,
                caller: p.caller,
            })
            .collect(),
        callers: s.callers.clone(),
    })
}

fn assemble<T: TicketTable>(
    policy: Arc<Policy>,
    head: FuseHead,
    tickets: impl FnOnce(&Breaker, Option<&LimiterKind>) -> Result<(T, Option<u64>), StateError>,
) -> Result<Fuse<T>, StateError> {
    let last_now = head.last_now;
    at_most("last_now", last_now, LIMIT)?;
    let breaker = Breaker::from_state(&head.breaker, last_now)?;
    let counters = Counters::from_state(&head.counters)?;
    let kind = policy.limiter.map(|lp| lp.kind);
    let limiter = match (&kind, &head.limiter) {
        (Some(kind), Some(state)) => Some(Limiter::from_state(kind, state, last_now)?),
        (None, None) => None,
        (kind, state) => {
            return Err(StateError::LimiterKind {
                state: state.as_ref().map_or("none", LimiterState::name),
                policy: limiter_name(kind.as_ref()),
            })
        }
    };
    let (table, held) = tickets(&breaker, kind.as_ref())?;
    if let (
        Some(
            LimiterState::Concurrency { held: in_use }
            | LimiterState::Adaptive { held: in_use, .. },
        ),
        Some(held),
    ) = (&head.limiter, held)
    {
        if *in_use != held {
            return Err(StateError::HeldPermits {
                held: *in_use,
                tickets: held,
            });
        }
    }
    let budget = checked_budget(&policy, &head.budget, last_now)?;
    let slow = checked_slow(&policy, &breaker, head.slow.as_ref(), last_now)?;
    let mut live = Live {
        tickets: table,
        book: Book::default(),
        notices: Vec::new(),
        budget,
        slow,
    };
    live.book.limiter = limiter;
    if !head.waiters.is_empty() && (kind.is_none() || breaker.phase != Phase::Closed) {
        return Err(StateError::WaitersNotAllowed {
            phase: breaker.phase,
            limiter: limiter_name(kind.as_ref()),
        });
    }
    for w in &head.waiters {
        if live.tickets.contains(w.id) || live.book.contains(w.id) {
            return Err(StateError::DuplicateWaiter(w.id));
        }
        if w.permits == 0 {
            return Err(StateError::WaiterWithoutPermits(w.id));
        }
        if w.lease == Some(0) {
            return Err(StateError::WaiterZeroLease(w.id));
        }
        let limit = kind.map_or(0, |k| k.limit());
        if w.permits > limit {
            return Err(StateError::WaiterAboveLimit {
                id: w.id,
                permits: w.permits,
                limit,
            });
        }
        at_most("waiters.until", w.until, LIMIT)?;
        live.book.enqueue(Waiter {
            id: w.id,
            permits: w.permits,
            until: w.until,
            lease: w.lease,
            caller: w.caller,
        });
    }
    Ok(Fuse {
        policy,
        breaker,
        live: Some(Box::new(live)),
        counters,
        last_now,
    })
}

#[cfg(test)]
mod tests;

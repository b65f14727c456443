//! A fuse is everything fusebox keeps for one key: its breaker, its permit
//! book and its live tickets, with the one decision over both (SPEC C1–C6)
//! and the settlement of leases and waits in time order (T2, L3, P6).
//!
//! Every operation takes `now` and first settles whatever fell due up to
//! `now`, each event at its own time, so a fuse reads the same whether the
//! engine's timer woke on time or a request arrived first.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::book::{Book, Waiter};
use crate::breaker::{Admission, Breaker, Report};
use crate::budget::Budget;
use crate::decision::{Decision, Grant};
use crate::limiter::Limiter;
use crate::policy::{Order, Policy};
use crate::quorum::CallerId;
use crate::ticket::TicketId;
use crate::{Millis, Outcome, Phase, Reason};

/// A retry beyond the budget: denied, no hint (R2).
const RETRY_DENIED: Decision = Decision::Denied {
    reason: Reason::RetryBudget,
    retry_after: None,
};

/// What a live ticket remembers (SPEC B3, L2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticket {
    /// The breaker epoch it was issued in.
    pub epoch: u64,
    /// Permits it asked for.
    pub permits: u32,
    /// True when it is a probe.
    pub probe: bool,
    /// When its lease ends.
    pub lease_end: Millis,
    /// True when its permits are concurrency permits that must come back.
    pub holds: bool,
    /// When its permits were taken: its grant, or a waiter's serving (U1).
    pub granted_at: Millis,
    /// True when its permits are rate permits (token bucket or window)
    /// taken from the limiter in force, so that a reported cost is settled
    /// against them (U1). Cleared, like `holds`, when the limiter is remade
    /// or keeps time otherwise.
    pub settles: bool,
    /// Who acquired it (Q1).
    pub caller: CallerId,
    /// True for a shadow ticket (D2): granted by a shadow policy where it
    /// would have blocked or denied. It holds no permits, is never a probe,
    /// and its outcome changes nothing. Fixed at its grant.
    pub shadow: bool,
    /// Its grant number on the key: tickets granted later (a waiter's when
    /// it was served) have higher numbers, so that lease ends at one
    /// instant are settled in grant order (T2).
    pub seq: u64,
    /// Counted in the statistics' `slow` already (S2: each once), so that
    /// it is not counted again when `slow` is removed and added back.
    pub slow_counted: bool,
}

impl Ticket {
    /// Its permits neither come back nor are settled any more (the limiter
    /// they came from is gone or keeps time otherwise).
    pub fn forget(&mut self) {
        self.holds = false;
        self.settles = false;
    }
}

/// A request for permits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ask {
    /// Permits asked for; 0 is a status check (P2a).
    pub permits: u32,
    /// How long the request may wait in the queue; 0 = not at all.
    pub max_wait: Millis,
    /// The lease asked for; `None` = the policy's default.
    pub lease: Option<Millis>,
    /// False when the engine has no room for another ticket (K3).
    pub room_for_ticket: bool,
    /// False when the engine has no room for another waiter (K3).
    pub room_for_waiter: bool,
    /// True when the request says it is a retry (`attempt` >= 2, R1).
    pub retry: bool,
    /// Who asks (Q1); the empty name when nobody says.
    pub caller: CallerId,
}

impl Default for Ask {
    fn default() -> Self {
        Ask {
            permits: 1,
            max_wait: 0,
            lease: None,
            room_for_ticket: true,
            room_for_waiter: true,
            retry: false,
            caller: CallerId::of(""),
        }
    }
}

/// The reply to a completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completed {
    /// The outcome came from an earlier epoch and moved nothing (B3).
    pub stale: bool,
    /// The phase after the completion.
    pub phase: Phase,
}

/// Why a phase changed, in words for operators.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    /// The trip condition was reached while closed.
    Tripped,
    /// The break ended and a request was admitted as the probe.
    ProbeAdmitted,
    /// The probe succeeded.
    ProbeSucceeded,
    /// The probe failed.
    ProbeFailed,
    /// An operator isolated the key.
    Isolated,
    /// An operator closed the key.
    Closed,
    /// A changed policy has no breaker.
    PolicyChanged,
    /// Slow calls reached the trip condition (S3 (b)) while failures did not.
    SlowCalls,
}

impl Cause {
    /// Every cause.
    pub const ALL: [Cause; 8] = [
        Cause::Tripped,
        Cause::ProbeAdmitted,
        Cause::ProbeSucceeded,
        Cause::ProbeFailed,
        Cause::Isolated,
        Cause::Closed,
        Cause::PolicyChanged,
        Cause::SlowCalls,
    ];

    /// The cause in plain words: what watchers are told, and what the
    /// Redis module's events carry.
    pub fn as_str(self) -> &'static str {
        match self {
            Cause::Tripped => "failures reached the trip condition",
            Cause::ProbeAdmitted => "the break ended and a probe was admitted",
            Cause::ProbeSucceeded => "the probe succeeded",
            Cause::ProbeFailed => "the probe failed",
            Cause::Isolated => "isolated by an operator",
            Cause::Closed => "closed by an operator",
            Cause::PolicyChanged => "the policy no longer has a breaker",
            Cause::SlowCalls => "slow calls",
        }
    }

    /// The cause in plain words, prefixed `shadow: ` for a shadow
    /// policy's breaker (D1, section 10's transition causes).
    pub fn text(self, shadow: bool) -> &'static str {
        if !shadow {
            return self.as_str();
        }
        match self {
            Cause::Tripped => "shadow: failures reached the trip condition",
            Cause::ProbeAdmitted => "shadow: the break ended and a probe was admitted",
            Cause::ProbeSucceeded => "shadow: the probe succeeded",
            Cause::ProbeFailed => "shadow: the probe failed",
            Cause::Isolated => "shadow: isolated by an operator",
            Cause::Closed => "shadow: closed by an operator",
            Cause::PolicyChanged => "shadow: the policy no longer has a breaker",
            Cause::SlowCalls => "shadow: slow calls",
        }
    }
}

crate::names::named!(Cause, "cause");

/// What an operator does to a key (B5): isolate it or close it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OperatorAction {
    /// Put the breaker in `ISOLATED`: every request is refused.
    Isolate,
    /// Put the breaker in `CLOSED` with everything cleared.
    Close,
}

impl OperatorAction {
    /// The action's name, as the `Admin` service and the permission
    /// checks spell it: `Isolate` or `Close`.
    pub fn as_str(self) -> &'static str {
        match self {
            OperatorAction::Isolate => "Isolate",
            OperatorAction::Close => "Close",
        }
    }

    /// Why the key's phase changes when the action is taken.
    pub fn cause(self) -> Cause {
        match self {
            OperatorAction::Isolate => Cause::Isolated,
            OperatorAction::Close => Cause::Closed,
        }
    }
}

/// Something that happened inside an operation that the engine must pass on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Notice {
    /// A waiter got its final answer: granted, blocked, refused or denied.
    Answered {
        /// The waiter (and, when granted, its ticket).
        waiter: TicketId,
        /// The answer.
        decision: Decision,
    },
    /// A ticket's lease ended and it was settled with the expired outcome.
    Expired {
        /// The ticket.
        ticket: TicketId,
    },
    /// The breaker changed phase.
    Phase {
        /// The phase before.
        from: Phase,
        /// The phase after.
        to: Phase,
        /// Why.
        cause: Cause,
        /// When.
        at: Millis,
    },
}

/// Per-key statistics; they restart from zero when a key is forgotten (K2).
/// A key's view carries them as they are ([`crate::wire::KeyView`]), the
/// reasons by name; a count the writer did not send reads as 0.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Stats {
    /// Tickets granted as ordinary requests, at once or after waiting.
    pub granted: u64,
    /// Probes admitted.
    pub probes: u64,
    /// Requests blocked by the breaker.
    pub blocked: u64,
    /// Requests refused while isolated.
    pub refused: u64,
    /// Requests denied by the permit book (any reason but the retry budget).
    pub denied: u64,
    /// Retries denied by the retry budget (R2); not in `denied`.
    pub retry_denied: u64,
    /// Blocked and denied requests by reason, indexed by [`Reason::ALL`].
    #[serde(with = "crate::wire::by_reason")]
    pub by_reason: [u64; Reason::COUNT],
    /// Requests that waited in the queue.
    pub queued: u64,
    /// Waiters evicted from a full `newest_first` queue.
    pub evicted: u64,
    /// Waiters whose `max_wait` ended.
    pub timed_out: u64,
    /// Waiters withdrawn because their caller went away.
    pub withdrawn: u64,
    /// Requests that waited and got no permits: evicted, timed out or
    /// withdrawn (P8).
    pub failed: u64,
    /// Outcomes recorded as successes.
    pub successes: u64,
    /// Outcomes recorded as failures.
    pub failures: u64,
    /// Outcomes reported as ignored.
    pub ignored: u64,
    /// Outcomes that arrived stale (shadow tickets' outcomes included, D2).
    pub stale: u64,
    /// Tickets whose lease ended.
    pub expired: u64,
    /// Tickets that became slow (S1, S2), live or at completion, each once.
    pub slow: u64,
    /// Shadow grants (D1): requests a shadow policy granted that it would
    /// have blocked or denied; each is also counted under its would-be
    /// decision and reason, never in `granted`.
    pub shadow: u64,
}

/// The statistics a fuse keeps: the counts of the common path (granted,
/// successes, failures) inline in 32 bits each, everything rarer in a box
/// made the first time something rare happens. Counts that follow from
/// others are not kept: `blocked` and `denied` are sums of `by_reason`,
/// `evicted` and `timed_out` are entries of it, and `failed` is
/// `evicted + timed_out + withdrawn`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Counters {
    granted: u32,
    successes: u32,
    failures: u32,
    /// Not a count: the 32 bits [`Fuse::tag`] gives its owner, kept here
    /// where the counts leave them free.
    tag: u32,
    more: Option<Box<MoreCounters>>,
}

/// The rarer counts, and what the inline counts carried past 32 bits.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct MoreCounters {
    granted: u64,
    successes: u64,
    failures: u64,
    probes: u64,
    refused: u64,
    by_reason: [u64; Reason::COUNT],
    queued: u64,
    withdrawn: u64,
    ignored: u64,
    stale: u64,
    expired: u64,
    slow: u64,
    shadow: u64,
}

/// Which of the common counts.
#[derive(Clone, Copy)]
enum Common {
    Granted,
    Success,
    Failure,
}

impl Counters {
    fn more(&mut self) -> &mut MoreCounters {
        self.more.get_or_insert_with(Default::default)
    }

    /// Adds one to a common count; past `u32::MAX` the carry goes to the box.
    fn bump(&mut self, which: Common) {
        let (inline, carried) = match which {
            Common::Granted => (&mut self.granted, 0),
            Common::Success => (&mut self.successes, 1),
            Common::Failure => (&mut self.failures, 2),
        };
        if let Some(next) = inline.checked_add(1) {
            *inline = next;
            return;
        }
        *inline = 0;
        let more = self.more();
        let carry = [&mut more.granted, &mut more.successes, &mut more.failures];
        *carry[carried] += 1 << 32;
    }

    fn count(&mut self, decision: &Decision) {
        match *decision {
            Decision::Granted(Some(_)) => self.bump(Common::Granted),
            Decision::Probe(_) => self.more().probes += 1,
            Decision::Blocked { reason, .. } => {
                debug_assert!(matches!(reason, Reason::Open | Reason::ProbeInFlight));
                self.more().by_reason[reason as usize] += 1;
            }
            Decision::Refused => self.more().refused += 1,
            Decision::Denied { reason, .. } => {
                debug_assert!(!matches!(reason, Reason::Open | Reason::ProbeInFlight));
                self.more().by_reason[reason as usize] += 1;
            }
            Decision::Queued => self.more().queued += 1,
            Decision::Granted(None) => {}
            // Under its would-be decision and reason, and as a shadow
            // grant, never as granted (D2).
            Decision::Shadow { reason, .. } => {
                let more = self.more();
                more.by_reason[reason as usize] += 1;
                more.shadow += 1;
            }
        }
    }

    fn outcome(&mut self, outcome: Outcome, stale: bool) {
        match outcome {
            _ if stale => self.more().stale += 1,
            Outcome::Success => self.bump(Common::Success),
            Outcome::Failure => self.bump(Common::Failure),
            Outcome::Ignored => self.more().ignored += 1,
        }
    }

    fn stats(&self) -> Stats {
        let zero = MoreCounters::default();
        let more = self.more.as_deref().unwrap_or(&zero);
        let by_reason = more.by_reason;
        let reason = |r: Reason| by_reason[r as usize];
        let blocked = reason(Reason::Open) + reason(Reason::ProbeInFlight);
        let retry_denied = reason(Reason::RetryBudget);
        let evicted = reason(Reason::Evicted);
        let timed_out = reason(Reason::Timeout);
        Stats {
            granted: more.granted + u64::from(self.granted),
            probes: more.probes,
            blocked,
            refused: more.refused,
            denied: by_reason.iter().sum::<u64>() - blocked - retry_denied,
            retry_denied,
            by_reason,
            queued: more.queued,
            evicted,
            timed_out,
            withdrawn: more.withdrawn,
            failed: evicted + timed_out + more.withdrawn,
            successes: more.successes + u64::from(self.successes),
            failures: more.failures + u64::from(self.failures),
            ignored: more.ignored,
            stale: more.stale,
            expired: more.expired,
            slow: more.slow,
            shadow: more.shadow,
        }
    }
}

/// What a read of a key shows (SPEC section 8, `KeyState`).
#[derive(Clone, Debug, PartialEq)]
pub struct View {
    /// The breaker's phase.
    pub phase: Phase,
    /// Failures in a row.
    pub consecutive_failures: u32,
    /// Probes admitted since the breaker last closed.
    pub half_open_attempts: u32,
    /// Probe slots held now (H1).
    pub probes_held: u32,
    /// Current probe successes in this half-open period (H2).
    pub half_open_successes: u32,
    /// The end of the break, when open.
    pub open_until: Option<Millis>,
    /// Permits free now (0 without a limiter).
    pub free: u32,
    /// The limiter's limit (0 without a limiter).
    pub limit: u32,
    /// Permits asked for by waiters.
    pub queued: u64,
    /// Live tickets.
    pub live_tickets: usize,
    /// Waiting requests.
    pub waiters: usize,
    /// The breaker's epoch.
    pub epoch: u64,
    /// The share of failures in the sampling window, in ratio mode.
    pub failure_ratio: Option<f64>,
    /// When the phase last changed.
    pub changed_at: Millis,
    /// Statistics.
    pub stats: Stats,
    /// Live slow tickets (S2).
    pub live_slow: u32,
    /// Slow outcomes in the window and live slow tickets, as a share of
    /// outcomes in the window and live slow tickets (S3 (b)), when the
    /// policy has slow calls and the share is not empty.
    pub slow_ratio: Option<f64>,
    /// The adaptive limiter's limit in force; 0 without one.
    pub adaptive_limit: u32,
}

/// Why an operation was refused. A refused operation changes nothing (E3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FuseError {
    /// Time went backwards: the engine's clock is monotonic.
    #[error("now ({now} ms) is earlier than the last time seen ({last} ms)")]
    ClockWentBack {
        /// The time given.
        now: Millis,
        /// The last time seen.
        last: Millis,
    },
    /// The ticket is unknown, completed or expired (L4).
    #[error("ticket: not found; it is unknown, already completed, or its lease ended")]
    UnknownTicket,
    /// A lease of zero was asked for (L2).
    #[error("lease: must be longer than 0 ms; leave it out for the policy's default")]
    ZeroLease,
    /// The engine gave a ticket id that is already in use.
    #[error("ticket id is already in use")]
    TicketInUse,
    /// The engine's cap on live tickets is reached (K3).
    #[error("too many live tickets: the server's max_tickets cap is reached")]
    NoRoomForTicket,
    /// The engine's cap on waiters is reached (K3).
    #[error("too many waiters: the server's max_waiters cap is reached")]
    NoRoomForWaiter,
}

/// What a key keeps only while it needs it: live tickets, the permit book
/// (limiter and waiters) and the notices not yet drained. A key with no
/// ticket, no limiter, no waiter and no notice has none of it.
#[derive(Clone, Debug, Default, PartialEq)]
struct Live<T> {
    tickets: T,
    book: Book,
    notices: Vec<Notice>,
    budget: Budget,
    slow: SlowCalls,
}

impl<T: TicketTable> Live<T> {
    fn is_empty(&self) -> bool {
        self.tickets.is_empty()
            && self.book.is_empty()
            && self.notices.is_empty()
            && self.budget.is_empty()
            && self.slow.is_empty()
    }
}

/// The counts of a key that has none.
static NO_BUDGET: Budget = Budget {
    segments: Vec::new(),
};

/// Which optional parts of a fuse own a heap allocation now, besides the
/// shared policy; see [`Fuse::heap_parts`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeapParts {
    /// Live tickets, the permit book or notices are kept.
    pub live: bool,
    /// Rarer statistics are kept (anything but grants, successes, failures).
    pub more_stats: bool,
    /// The ratio-mode sampling window holds outcomes.
    pub health_window: bool,
}

/// One key's breaker, permit book and live tickets, the tickets in a
/// [`TicketTable`] (the embedded engine's [`Tickets`] unless a store keeps
/// its own).
///
/// Kept small, since a server holds a million of them: the policy is
/// shared, and whatever a key at rest does not need is boxed and made only
/// when needed (see [`Fuse::heap_parts`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Fuse<T = Tickets> {
    policy: Arc<Policy>,
    breaker: Breaker,
    live: Option<Box<Live<T>>>,
    counters: Counters,
    last_now: Millis,
}

impl Fuse {
    /// A fresh key under `policy`, made at `now` (K2), its tickets in memory.
    pub fn new(policy: impl Into<Arc<Policy>>, now: Millis) -> Self {
        Fuse::new_in(policy, now)
    }

    /// A key brought back after a restart under `policy` at `now`, from
    /// what [`Fuse::durable`] kept: no ticket and no waiter survive, and the
    /// limiter starts full. A policy with no breaker cannot end a break, so
    /// an open or half-open key under one comes back closed (as Y4 does).
    pub fn restore(
        policy: impl Into<Arc<Policy>>,
        kept: &crate::breaker::Durable,
        now: Millis,
    ) -> Self {
        let mut fuse = Fuse::new(policy, now);
        fuse.breaker = Breaker::restore(kept);
        let breaker = fuse.policy.breaker;
        fuse.breaker.adopt(breaker.as_ref(), now);
        fuse.breaker.restart_probing(breaker.as_ref());
        fuse
    }
}

impl<T: TicketTable> Fuse<T> {
    /// A fresh key under `policy`, made at `now` (K2), its tickets in a
    /// table of type `T`.
    pub fn new_in(policy: impl Into<Arc<Policy>>, now: Millis) -> Self {
        let policy = policy.into();
        let mut fuse = Fuse {
            breaker: Breaker::new(now),
            live: None,
            counters: Counters::default(),
            last_now: now,
            policy,
        };
        if let Some(lp) = fuse.policy.limiter {
            fuse.live_mut().book.adopt(Some(&lp), now);
        }
        fuse
    }

    /// The policy in force.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The breaker.
    pub fn breaker(&self) -> &Breaker {
        &self.breaker
    }

    /// The breaker's phase.
    pub fn phase(&self) -> Phase {
        self.breaker.phase()
    }

    /// A live ticket.
    pub fn ticket(&self, id: TicketId) -> Option<Ticket> {
        self.live.as_ref()?.tickets.get(id)
    }

    /// True when `id` names a request waiting in the queue.
    pub fn is_waiting(&self, id: TicketId) -> bool {
        self.book().is_some_and(|b| b.contains(id))
    }

    /// True when `id` names a live ticket or a waiting request: an acquire
    /// with that id would be refused as [`FuseError::TicketInUse`].
    pub fn knows(&self, id: TicketId) -> bool {
        self.ticket(id).is_some() || self.is_waiting(id)
    }

    /// Live tickets.
    pub fn live_tickets(&self) -> usize {
        self.live.as_ref().map_or(0, |l| l.tickets.len())
    }

    /// Waiting requests.
    pub fn waiters(&self) -> usize {
        self.book().map_or(0, Book::waiters)
    }

    /// The last time this fuse saw.
    pub fn last_now(&self) -> Millis {
        self.last_now
    }

    /// 32 bits the fuse keeps for its owner and never reads (0 when
    /// made): what the engine keeps of a key beside its fuse, without a
    /// word of its own.
    pub fn tag(&self) -> u32 {
        self.counters.tag
    }

    /// Sets [`Fuse::tag`].
    pub fn set_tag(&mut self, tag: u32) {
        self.counters.tag = tag;
    }

    /// Statistics.
    pub fn stats(&self) -> Stats {
        self.counters.stats()
    }

    /// Which optional parts own a heap allocation now: for memory tests
    /// and accounting. A key at rest owns none.
    pub fn heap_parts(&self) -> HeapParts {
        HeapParts {
            live: self.live.is_some(),
            more_stats: self.counters.more.is_some(),
            health_window: self.breaker.window_allocated(),
        }
    }

    /// Moves out the notices gathered since the last call.
    pub fn drain_notices(&mut self) -> std::vec::IntoIter<Notice> {
        let notices = self
            .live
            .as_mut()
            .map(|l| std::mem::take(&mut l.notices))
            .unwrap_or_default();
        self.tidy();
        notices.into_iter()
    }

    /// What the breaker would do with a request at `now`, under the policy
    /// in force. Changes nothing.
    fn admission(&self, now: Millis) -> Admission {
        self.breaker.admission(self.policy.breaker.as_ref(), now)
    }

    /// The retry-budget counts.
    pub fn budget(&self) -> &Budget {
        self.live.as_ref().map_or(&NO_BUDGET, |l| &l.budget)
    }

    /// True when the policy's retry budget would deny a retry at `now`.
    fn retry_denied(&self, ask: &Ask, now: Millis) -> bool {
        ask.retry
            && self
                .policy
                .retry_budget
                .is_some_and(|rb| !self.budget().admits_retry(&rb, now))
    }

    fn book(&self) -> Option<&Book> {
        self.live.as_ref().map(|l| &l.book)
    }

    fn limiter(&self) -> Option<&Limiter> {
        self.book()?.limiter()
    }

    /// The live part, made when first needed.
    fn live_mut(&mut self) -> &mut Live<T> {
        self.live.get_or_insert_with(Box::default)
    }

    /// Frees the live part once it holds nothing; every public operation
    /// ends here, so between operations a key at rest owns no live part.
    fn tidy(&mut self) {
        if let Some(slow) = self.live.as_deref_mut().map(|l| &mut l.slow) {
            // With nothing tracked, when the duration came in force no
            // longer matters: every later grant is after it.
            if slow.pending.is_empty() && slow.live == 0 {
                slow.since = 0;
            }
        }
        if self.live.as_ref().is_some_and(|l| l.is_empty()) {
            self.live = None;
        }
    }

    fn notice(&mut self, notice: Notice) {
        self.live_mut().notices.push(notice);
    }

    fn check_time(&self, now: Millis) -> Result<(), FuseError> {
        if now < self.last_now {
            return Err(FuseError::ClockWentBack {
                now,
                last: self.last_now,
            });
        }
        Ok(())
    }

    /// A live ticket at `now`: one whose lease has not ended (T1).
    fn live_ticket(&self, id: TicketId, now: Millis) -> Result<Ticket, FuseError> {
        self.ticket(id)
            .filter(|t| t.lease_end > now)
            .ok_or(FuseError::UnknownTicket)
    }

    /// Applies a changed policy from `now` on (Y4): the breaker keeps its
    /// phase, deadline, run and epoch; held permits stay held.
    pub fn set_policy(
        &mut self,
        policy: impl Into<Arc<Policy>>,
        now: Millis,
    ) -> Result<(), FuseError> {
        self.check_time(now)?;
        self.settle(now);
        let before = self.policy.retry_budget;
        let slow_before = self.slow_policy().map(|s| s.duration);
        self.policy = policy.into();
        let Policy {
            breaker,
            limiter,
            retry_budget,
            ..
        } = *self.policy;
        // A budget keeps its counts while its window is unchanged, and
        // starts empty when added or when its window changes.
        let same_window =
            matches!((before, retry_budget), (Some(b), Some(a)) if b.window == a.window);
        if !same_window {
            if let Some(live) = self.live.as_deref_mut() {
                live.budget.clear();
            }
        }
        if let Some((from, to)) = self.breaker.adopt(breaker.as_ref(), now) {
            self.phase_changed(from, to, Cause::PolicyChanged, now);
        }
        if slow_before != self.slow_policy().map(|s| s.duration) {
            self.restart_slow(now, slow_before.is_some());
        }
        if self.live.is_some() || limiter.is_some() {
            let live = self.live_mut();
            if live.book.adopt(limiter.as_ref(), now) {
                live.tickets.forget_holds();
            }
        }
        if let (Some(lp), Some(live)) = (limiter, self.live.as_deref_mut()) {
            // A waiter that asks for more than the new limit could never be served.
            for waiter in live.book.remove_above(lp.kind.limit()) {
                self.answer(
                    waiter.id,
                    Decision::Denied {
                        reason: Reason::ExceedsLimit,
                        retry_after: None,
                    },
                );
            }
        }
        self.serve(now);
        self.tidy();
        Ok(())
    }

    /// Settles everything due by `now`: lease ends, waiters served by
    /// refills and window rolls, waiters whose wait ended (T2).
    pub fn advance(&mut self, now: Millis) -> Result<(), FuseError> {
        self.check_time(now)?;
        self.settle(now);
        self.tidy();
        Ok(())
    }

    /// The next time at which something must happen on this key even if no
    /// request arrives: a lease end, a waiter's `max_wait`, or a refill or
    /// window roll that can serve the head waiter.
    pub fn next_deadline(&self) -> Option<Millis> {
        let live = self.live.as_deref()?;
        let lease = live.tickets.first_lease().map(|(end, _)| end);
        let timeout = live.book.first_timeout();
        let refill = self.policy.limiter.as_ref().and_then(|lp| {
            let head = live.book.head(lp.order)?;
            let limiter = live.book.limiter()?;
            if limiter.returns_permits() {
                return None;
            }
            limiter.ready_at(head.permits, self.last_now)
        });
        let slow = live.slow.next();
        [lease, timeout, refill, slow].into_iter().flatten().min()
    }

    fn settle(&mut self, now: Millis) {
        let mut settled_at = None;
        while let Some(at) = self.next_deadline().filter(|&t| t <= now) {
            if settled_at.is_some_and(|done| at <= done) {
                break;
            }
            self.last_now = self.last_now.max(at);
            while let Some((end, id)) = self.live.as_ref().and_then(|l| l.tickets.first_lease()) {
                if end > at {
                    break;
                }
                let outcome = self.policy.lease.expired_outcome;
                self.counters.more().expired += 1;
                self.finish_with_cost(id, outcome, None, end, true);
                self.notice(Notice::Expired { ticket: id });
            }
            self.serve(at);
            while let Some(waiter) = self
                .live
                .as_deref_mut()
                .and_then(|l| l.book.pop_timed_out(at))
            {
                self.answer(
                    waiter.id,
                    Decision::Denied {
                        reason: Reason::Timeout,
                        retry_after: None,
                    },
                );
                self.serve(at);
            }
            self.settle_slow(at);
            settled_at = Some(at);
        }
        self.last_now = now;
    }

    /// The policy's slow calls, if any (S1-S3).
    fn slow_policy(&self) -> Option<crate::policy::Slow> {
        self.policy.breaker.and_then(|b| b.slow)
    }

    /// S2, S3 at `at`, after T2's events of that instant: the tickets due
    /// by `at` become live slow together, and the trip condition is
    /// evaluated once if any did.
    fn settle_slow(&mut self, at: Millis) {
        let Some(live) = self.live.as_deref_mut() else {
            return;
        };
        // `joined`: tickets that became live slow at `at`; `became`: those
        // of them not counted before (CX12).
        let (mut joined, mut became) = (false, 0u64);
        while let Some(p) = live.slow.pending.front().copied().filter(|p| p.at <= at) {
            live.slow.pending.pop_front();
            live.slow.live = live.slow.live.saturating_add(1);
            live.slow.join(p.caller);
            joined = true;
            if !p.counted {
                became += 1;
                live.tickets.mark_slow_counted(p.ticket);
            }
        }
        // S3: evaluated once at every instant when tickets become live slow,
        // not at other settled instants (an outcome evaluates on its own).
        if !joined {
            return;
        }
        let live_slow = live.slow.live;
        if became > 0 {
            self.counters.more().slow += became;
        }
        let policy = self.policy.breaker;
        let live_callers = self
            .live
            .as_deref()
            .map_or(&[][..], |l| &l.slow.callers[..]);
        if let Some(((from, to), slow_trip)) =
            self.breaker
                .evaluate_slow(policy.as_ref(), live_slow, live_callers, at)
        {
            let cause = if slow_trip {
                Cause::SlowCalls
            } else {
                Cause::Tripped
            };
            self.phase_changed(from, to, cause, at);
        }
    }

    /// Y4 for `slow` (section 10, "Policy changes"): from `now`, every live
    /// current closed-period ticket becomes live slow at `max(now,
    /// granted_at + duration)`; without `slow` none is. A ticket live slow
    /// before keeps its place in the statistics (counted once).
    fn restart_slow(&mut self, now: Millis, had_slow: bool) {
        let slow = self.slow_policy();
        let epoch = self.breaker.epoch();
        let closed = self.breaker.phase() == Phase::Closed;
        let Some(live) = self.live.as_deref_mut() else {
            return;
        };
        let old = std::mem::take(&mut live.slow);
        // Tickets already counted in `slow`: every current one not waiting
        // to become slow under the old duration, and those waiting that
        // were counted before.
        let waiting: std::collections::HashMap<TicketId, bool> =
            old.pending.iter().map(|p| (p.ticket, p.counted)).collect();
        let Some(slow) = slow.filter(|_| closed) else {
            return;
        };
        live.slow.since = now;
        let mut pending = Vec::new();
        live.tickets.for_each(&mut |id, t| {
            // A shadow ticket (D2) is never live slow.
            if t.epoch == epoch && !t.probe && !t.shadow {
                let counted = waiting.get(&id).copied().unwrap_or(had_slow) || t.slow_counted;
                pending.push((t.granted_at, id, counted, t.caller));
            }
        });
        pending.sort_unstable();
        live.slow.pending = pending
            .into_iter()
            .map(|(granted_at, ticket, counted, caller)| slow::Pending {
                at: now.max(granted_at.saturating_add(slow.duration.get())),
                ticket,
                counted,
                caller,
            })
            .collect();
        self.settle_slow(now);
    }

    /// Answers a request for permits at `now` (C1–C3, P1–P4). `id` names the
    /// ticket, or the waiter, that the request may become.
    pub fn acquire(&mut self, ask: &Ask, id: TicketId, now: Millis) -> Result<Decision, FuseError> {
        self.check_time(now)?;
        if ask.lease == Some(0) {
            return Err(FuseError::ZeroLease);
        }
        if ask.permits > 0
            && self
                .live
                .as_ref()
                .is_some_and(|l| l.tickets.contains(id) || l.book.contains(id))
        {
            return Err(FuseError::TicketInUse);
        }
        self.settle(now);
        let admission = self.admission(now);
        let decision = if ask.permits == 0 {
            Ok(self.shadow_status(self.status(ask, admission, now)))
        } else {
            self.decide(ask, admission, id, now)
        };
        if let (Ok(decision), true) = (&decision, ask.permits > 0) {
            self.counters.count(decision);
        }
        self.tidy();
        decision
    }

    /// The status check of P2a: what the breaker answers when it blocks or
    /// refuses, else what the retry budget answers a retry (R2), else
    /// whether any permit is free. Changes nothing.
    fn status(&self, ask: &Ask, admission: Admission, now: Millis) -> Decision {
        if let Some(refusal) = admission.refusal() {
            return refusal;
        }
        if admission == Admission::Normal && self.retry_denied(ask, now) {
            return RETRY_DENIED;
        }
        let Some(limiter) = self.limiter() else {
            return Decision::Granted(None);
        };
        if limiter.available(now) > 0 {
            return Decision::Granted(None);
        }
        Decision::Denied {
            reason: Reason::NoPermits,
            retry_after: limiter.ready_at(1, now).map(|t| t - now),
        }
    }

    /// A status check's answer on a shadow policy (D1): what would be
    /// `BLOCKED` or `DENIED` is `GRANTED` with no ticket, the would-be
    /// reason kept; `REFUSED` stays (D4).
    fn shadow_status(&self, decision: Decision) -> Decision {
        match decision {
            Decision::Blocked { reason, .. } | Decision::Denied { reason, .. }
                if !self.policy.enforce =>
            {
                Decision::Shadow {
                    grant: None,
                    reason,
                }
            }
            other => other,
        }
    }

    /// A request's answer on a shadow policy (D1, D2): what would be
    /// `BLOCKED` or `DENIED` gets a shadow ticket instead, which holds no
    /// permits and is never a probe. `REFUSED` stays (D4); a would-be
    /// `QUEUED` cannot arise, since `max_wait` is 0 (D3). A shadow ticket
    /// needs room like any ticket (K3); without it the acquire fails and
    /// changes nothing.
    fn shadowed(
        &mut self,
        ask: &Ask,
        decision: Decision,
        id: TicketId,
        now: Millis,
    ) -> Result<Decision, FuseError> {
        if self.policy.enforce {
            return Ok(decision);
        }
        let reason = match decision {
            Decision::Blocked { reason, .. } | Decision::Denied { reason, .. } => reason,
            other => return Ok(other),
        };
        if !ask.room_for_ticket {
            return Err(FuseError::NoRoomForTicket);
        }
        let lease_end = now.saturating_add(self.policy.lease.grant(ask.lease));
        let epoch = self.breaker.epoch();
        let tickets = &mut self.live_mut().tickets;
        let seq = tickets.next_seq();
        tickets.insert(
            id,
            Ticket {
                epoch,
                permits: ask.permits,
                probe: false,
                lease_end,
                holds: false,
                granted_at: now,
                settles: false,
                shadow: true,
                caller: ask.caller,
                seq,
                slow_counted: false,
            },
        );
        Ok(Decision::Shadow {
            grant: Some(Grant {
                ticket: id,
                lease_end,
            }),
            reason,
        })
    }

    /// C1 and R2: the breaker, then the retry budget, then the limiter. A
    /// request the breaker admits normally counts once in the budget,
    /// whatever the limiter answers, unless the acquire fails (E3). On a
    /// shadow policy the answer is then made a shadow grant (D1).
    fn decide(
        &mut self,
        ask: &Ask,
        admission: Admission,
        id: TicketId,
        now: Millis,
    ) -> Result<Decision, FuseError> {
        if let Some(refusal) = admission.refusal() {
            return self.shadowed(ask, refusal, id, now);
        }
        let budget = self
            .policy
            .retry_budget
            .filter(|_| admission == Admission::Normal);
        if budget.is_some() && self.retry_denied(ask, now) {
            return self.shadowed(ask, RETRY_DENIED, id, now);
        }
        // Nobody waits on a shadow policy (D3).
        let ask = &Ask {
            max_wait: if self.policy.enforce { ask.max_wait } else { 0 },
            ..*ask
        };
        let decision = self.decide_permits(ask, admission == Admission::Probe, id, now)?;
        let decision = self.shadowed(ask, decision, id, now)?;
        if let Some(rb) = budget {
            self.live_mut().budget.count(&rb, now, ask.retry);
        }
        Ok(decision)
    }

    /// The limiter's part of a decision (P2-P4) for a request the breaker
    /// admitted, as a `probe` or not.
    fn decide_permits(
        &mut self,
        ask: &Ask,
        probe: bool,
        id: TicketId,
        now: Millis,
    ) -> Result<Decision, FuseError> {
        let n = ask.permits;
        let (Some(lp), Some(limiter)) = (self.policy.limiter, self.limiter()) else {
            return self.grant_at_once(ask, id, probe, 0, now);
        };
        if n > limiter.limit() {
            return Ok(Decision::Denied {
                reason: Reason::ExceedsLimit,
                retry_after: None,
            });
        }
        let free = limiter.available(now);
        let waiters_first = lp.order == Order::OldestFirst && self.waiters() > 0;
        if free >= n && (probe || !waiters_first) {
            return self.grant_at_once(ask, id, probe, n, now);
        }
        let retry_after = if free >= n {
            None
        } else {
            limiter.ready_at(n, now).map(|t| t - now)
        };
        let may_wait = !probe && ask.max_wait > 0 && lp.queue_limit > 0;
        let queue_limit = u64::from(lp.queue_limit);
        let queued = self.book().map_or(0, Book::queued);
        let fits = queued + u64::from(n) <= queue_limit
            || (lp.order == Order::NewestFirst && u64::from(n) <= queue_limit);
        if may_wait && fits {
            if !ask.room_for_waiter {
                return Err(FuseError::NoRoomForWaiter);
            }
            let book = &mut self.live_mut().book;
            let mut evicted = Vec::new();
            while book.queued() + u64::from(n) > queue_limit {
                let oldest = book
                    .oldest()
                    .map(|w| w.id)
                    .expect("a full queue has a waiter");
                book.remove(oldest);
                evicted.push(oldest);
            }
            book.enqueue(Waiter {
                id,
                permits: n,
                until: now.saturating_add(ask.max_wait),
                lease: ask.lease,
                caller: ask.caller,
            });
            for oldest in evicted {
                self.answer(
                    oldest,
                    Decision::Denied {
                        reason: Reason::Evicted,
                        retry_after: None,
                    },
                );
            }
            return Ok(Decision::Queued);
        }
        let reason = if ask.max_wait > 0 && lp.queue_limit > 0 && !probe {
            Reason::QueueFull
        } else {
            Reason::NoPermits
        };
        Ok(Decision::Denied {
            reason,
            retry_after,
        })
    }

    fn grant_at_once(
        &mut self,
        ask: &Ask,
        id: TicketId,
        probe: bool,
        n: u32,
        now: Millis,
    ) -> Result<Decision, FuseError> {
        if !ask.room_for_ticket {
            return Err(FuseError::NoRoomForTicket);
        }
        let grant = self.issue(id, probe, n, ask.lease, ask.caller, now);
        Ok(if probe {
            Decision::Probe(grant)
        } else {
            Decision::Granted(Some(grant))
        })
    }

    /// Takes `n` permits and records a live ticket (and, for a probe, the slot).
    fn issue(
        &mut self,
        id: TicketId,
        probe: bool,
        n: u32,
        lease: Option<Millis>,
        caller: CallerId,
        now: Millis,
    ) -> Grant {
        let lease_end = now.saturating_add(self.policy.lease.grant(lease));
        if probe {
            let probe_lease = self
                .policy
                .breaker
                .map_or(lease_end, |b| now.saturating_add(b.probe_lease.get()));
            let policy = self.policy.breaker;
            let slot_until = probe_lease.min(lease_end);
            if let Some((from, to)) = self
                .breaker
                .begin_probe(policy.as_ref(), id, now, slot_until)
            {
                self.phase_changed(from, to, Cause::ProbeAdmitted, now);
            }
        }
        let epoch = self.breaker.epoch();
        // A probe of a period of several slots is known by its slot (H3);
        // the ticket's flag marks the single slot's probe only.
        let probe = probe && !self.breaker.shares_probe_epoch();
        let (slow_policy, phase) = (self.slow_policy(), self.breaker.phase());
        let live = self.live_mut();
        let (mut holds, mut settles) = (false, false);
        if let Some(limiter) = live.book.limiter_mut() {
            limiter.take(n, now);
            holds = limiter.returns_permits();
            settles = !holds && n > 0;
        }
        // S2: a current closed-period ticket becomes live slow at its
        // instant. (A shadow ticket, D2, is never live slow: it belongs
        // outside this branch.)
        if let (Some(slow), false, Phase::Closed) = (slow_policy, probe, phase) {
            let at = live.slow.instant(now, slow.duration.get());
            live.slow.pending.push_back(slow::Pending {
                at,
                ticket: id,
                counted: false,
                caller,
            });
        }
        // B2: a superseded probe stays live (its outcome will be stale) but
        // is no longer the probe: inserting a probe moves the flag.
        let seq = live.tickets.next_seq();
        live.tickets.insert(
            id,
            Ticket {
                epoch,
                permits: n,
                probe,
                lease_end,
                holds,
                granted_at: now,
                settles,
                caller,
                shadow: false,
                seq,
                slow_counted: false,
            },
        );
        Grant {
            ticket: id,
            lease_end,
        }
    }

    /// Serves waiters in order while the head's permits are free (P5).
    fn serve(&mut self, now: Millis) {
        if self.admission(now) != Admission::Normal {
            return;
        }
        let order = self
            .policy
            .limiter
            .map_or(Order::OldestFirst, |lp| lp.order);
        loop {
            let Some(book) = self.book() else {
                return;
            };
            let Some(head) = book.head(order) else {
                return;
            };
            if let Some(limiter) = book.limiter() {
                if limiter.available(now) < head.permits {
                    return;
                }
            }
            self.live_mut().book.remove(head.id);
            let grant = self.issue(head.id, false, head.permits, head.lease, head.caller, now);
            self.answer(head.id, Decision::Granted(Some(grant)));
        }
    }

    fn answer(&mut self, waiter: TicketId, decision: Decision) {
        self.counters.count(&decision);
        self.notice(Notice::Answered { waiter, decision });
    }

    fn phase_changed(&mut self, from: Phase, to: Phase, cause: Cause, at: Millis) {
        // Every phase change starts an epoch: no ticket is current, so
        // none is live slow or will be (S2).
        if let Some(live) = self.live.as_deref_mut() {
            live.slow.clear();
        }
        self.notice(Notice::Phase {
            from,
            to,
            cause,
            at,
        });
        // C4: waiters exist only while the breaker admits normally.
        let Some(answer) = self.admission(at).refusal() else {
            return;
        };
        for waiter in self.live_mut().book.drain() {
            self.answer(waiter.id, answer);
        }
    }

    /// Records a ticket's outcome at `now` (B3, C5, P7, L4).
    pub fn complete(
        &mut self,
        id: TicketId,
        outcome: Outcome,
        now: Millis,
    ) -> Result<Completed, FuseError> {
        self.complete_with_cost(id, outcome, None, now)
    }

    /// Records a ticket's outcome at `now` with the permits the call really
    /// used (U1; `None` = what the ticket took): the outcome reaches the
    /// breaker, then the difference is settled in a token-bucket or window
    /// limiter, stale or not, then waiters are served.
    pub fn complete_with_cost(
        &mut self,
        id: TicketId,
        outcome: Outcome,
        cost: Option<u32>,
        now: Millis,
    ) -> Result<Completed, FuseError> {
        self.check_time(now)?;
        self.live_ticket(id, now)?;
        self.settle(now);
        let stale = self.finish_with_cost(id, outcome, cost, now, false);
        self.tidy();
        Ok(Completed {
            stale,
            phase: self.breaker.phase(),
        })
    }

    /// Ends a live ticket with `outcome` at `at` (its lease end's
    /// settlement when `at_lease_end`): the outcome reaches the breaker
    /// first, then a reported cost is settled (U1), then the permits come
    /// back and waiters are served (C5). Returns staleness.
    fn finish_with_cost(
        &mut self,
        id: TicketId,
        outcome: Outcome,
        cost: Option<u32>,
        at: Millis,
        at_lease_end: bool,
    ) -> bool {
        let Some(ticket) = self.live.as_deref_mut().and_then(|l| l.tickets.remove(id)) else {
            return false;
        };
        if ticket.shadow {
            // Its outcome, age and cost change nothing; it answers stale (D2).
            self.counters.outcome(outcome, true);
            return true;
        }
        let slow = self.slow_policy();
        let epoch = self.breaker.epoch();
        let phase = self.breaker.phase();
        // S2: the ticket leaves the live slow count, or the queue of those
        // not slow yet. `counted`: it is in the statistics' `slow` already.
        let mut counted = false;
        let mut live_slow = 0;
        if let (Some(slow), Some(live)) = (slow, self.live.as_deref_mut()) {
            if ticket.epoch == epoch && !ticket.probe && phase == Phase::Closed {
                let due = live.slow.instant(ticket.granted_at, slow.duration.get());
                match live.slow.take(id, due) {
                    Some(was) => counted = was,
                    None if due <= at => {
                        live.slow.live = live.slow.live.saturating_sub(1);
                        live.slow.leave(ticket.caller);
                        counted = true;
                    }
                    None => {}
                }
            }
            live_slow = live.slow.live;
        }
        let report = Report {
            ticket: id,
            epoch: ticket.epoch,
            probe: ticket.probe,
            outcome,
            at_lease_end,
            caller: ticket.caller,
            slow: slow.is_some_and(|s| at.saturating_sub(ticket.granted_at) >= s.duration.get()),
            live_slow,
            live_callers: self
                .live
                .as_deref()
                .map_or(&[][..], |l| &l.slow.callers[..]),
        };
        let recorded = self
            .breaker
            .record(self.policy.breaker.as_ref(), report, at);
        // A slow probe success is counted as the failure it was taken for.
        let counted_outcome = if recorded.probe && recorded.slow && outcome == Outcome::Success {
            Outcome::Failure
        } else {
            outcome
        };
        self.counters.outcome(counted_outcome, recorded.stale);
        if recorded.slow && !counted {
            self.counters.more().slow += 1;
        }
        if let Some((from, to)) = recorded.change {
            let cause = match (recorded.probe, to) {
                (false, _) if recorded.slow_trip => Cause::SlowCalls,
                (false, _) => Cause::Tripped,
                (true, Phase::Closed) => Cause::ProbeSucceeded,
                (true, _) => Cause::ProbeFailed,
            };
            self.phase_changed(from, to, cause, at);
        }
        // An adaptive limit learns from the completion after the breaker
        // heard it and before the permits come back (section 10, C5); the
        // live tickets count the one completing.
        if let Some(live) = self.live.as_deref_mut() {
            let count = live.tickets.len() as u64 + 1;
            if let Some(limiter) = live.book.limiter_mut() {
                limiter.observe(at.saturating_sub(ticket.granted_at), outcome, count, at);
            }
        }
        if ticket.holds {
            if let Some(limiter) = self.live.as_deref_mut().and_then(|l| l.book.limiter_mut()) {
                limiter.release(ticket.permits);
            }
        }
        if let (Some(cost), true) = (cost, ticket.settles) {
            if let Some(limiter) = self.live.as_deref_mut().and_then(|l| l.book.limiter_mut()) {
                limiter.settle(ticket.permits, cost, ticket.granted_at, at);
            }
        }
        self.serve(at);
        recorded.stale
    }

    /// Sets a live ticket's lease to end at `now + lease` (capped by the
    /// policy's maximum; `None` = the default) and returns the time left (L2).
    /// The probe slot is not extended (B1).
    pub fn renew(
        &mut self,
        id: TicketId,
        lease: Option<Millis>,
        now: Millis,
    ) -> Result<Millis, FuseError> {
        self.check_time(now)?;
        if lease == Some(0) {
            return Err(FuseError::ZeroLease);
        }
        self.live_ticket(id, now)?;
        self.settle(now);
        let granted = self.policy.lease.grant(lease);
        let lease_end = now.saturating_add(granted);
        if let Some(live) = self.live.as_deref_mut() {
            live.tickets.set_lease_end(id, lease_end);
            if let Some(t) = live.tickets.get(id) {
                let current = t.probe && t.epoch == self.breaker.epoch();
                self.breaker.lease_moved(id, current, lease_end);
            }
        }
        self.tidy();
        Ok(granted)
    }

    /// Withdraws a waiter whose caller went away, silently (P6). Returns
    /// false when it no longer waits (it was answered already).
    pub fn withdraw(&mut self, id: TicketId, now: Millis) -> Result<bool, FuseError> {
        self.check_time(now)?;
        self.settle(now);
        let withdrawn = self
            .live
            .as_deref_mut()
            .and_then(|l| l.book.remove(id))
            .is_some();
        if withdrawn {
            self.counters.more().withdrawn += 1;
            self.serve(now);
        }
        self.tidy();
        Ok(withdrawn)
    }

    /// Isolates the breaker (B5); waiters are refused at once (C4).
    pub fn isolate(&mut self, now: Millis) -> Result<(), FuseError> {
        self.check_time(now)?;
        self.settle(now);
        let (from, to) = self.breaker.isolate(now);
        self.phase_changed(from, to, Cause::Isolated, now);
        self.tidy();
        Ok(())
    }

    /// Closes the breaker with everything cleared (B5).
    pub fn close(&mut self, now: Millis) -> Result<(), FuseError> {
        self.check_time(now)?;
        self.settle(now);
        let (from, to) = self.breaker.reset(now);
        self.phase_changed(from, to, Cause::Closed, now);
        self.serve(now);
        self.tidy();
        Ok(())
    }

    /// True when the key is as a fresh one would be (K2): breaker closed
    /// with nothing recorded, no live ticket, no waiter, limiter full.
    pub fn is_at_rest(&self, now: Millis) -> bool {
        self.live_tickets() == 0
            && self.waiters() == 0
            && self.breaker.is_at_rest(self.policy.breaker.as_ref(), now)
            && self
                .budget()
                .is_empty_at(self.policy.retry_budget.as_ref(), now)
            && self.limiter().is_none_or(|limiter| limiter.is_full(now))
    }

    /// What of this key is to be kept across a restart (its breaker's).
    pub fn durable(&self) -> crate::breaker::Durable {
        self.breaker.durable()
    }

    /// What a read shows at `now`. Changes nothing: an `OPEN` breaker past
    /// its deadline reads `OPEN` (B6). Call [`Fuse::advance`] first so that
    /// lease ends are settled.
    pub fn view(&self, now: Millis) -> View {
        let (free, limit) = self
            .limiter()
            .map_or((0, 0), |limiter| (limiter.available(now), limiter.limit()));
        View {
            phase: self.breaker.phase(),
            consecutive_failures: self.breaker.consecutive_failures(),
            half_open_attempts: self.breaker.half_open_attempts(),
            probes_held: self.breaker.probes_held(now),
            half_open_successes: self.breaker.half_open_successes(),
            open_until: self.breaker.open_until(),
            free,
            limit,
            queued: self.book().map_or(0, Book::queued),
            live_tickets: self.live_tickets(),
            waiters: self.waiters(),
            epoch: self.breaker.epoch(),
            failure_ratio: self
                .breaker
                .failure_ratio(self.policy.breaker.as_ref(), now),
            changed_at: self.breaker.changed_at(),
            stats: self.stats(),
            live_slow: self.live_slow(),
            slow_ratio: self.breaker.slow_ratio(
                self.policy.breaker.as_ref(),
                self.live_slow(),
                now,
            ),
            adaptive_limit: self
                .limiter()
                .and_then(Limiter::adaptive_limit)
                .unwrap_or(0),
        }
    }

    /// Live slow tickets (S2), as settled at the last time seen.
    pub fn live_slow(&self) -> u32 {
        self.live.as_ref().map_or(0, |l| l.slow.live)
    }

    /// The live slow calls kept: the count and the queue of tickets not
    /// slow yet.
    pub fn slow_calls(&self) -> Option<&SlowCalls> {
        self.live.as_deref().map(|l| &l.slow)
    }
}

mod charge;
mod slow;
mod state;
mod tickets;

pub use slow::{Pending as SlowPending, SlowCalls};

pub use charge::Quote;

pub use tickets::{sorted as sorted_tickets, TicketTable, Tickets};

pub use state::{
    BreakerState, CallersState, CounterState, FuseHead, FuseState, LimiterState, ProbingState,
    ReasonCounts, SlotState, SlowPendingState, SlowState, StateError, TicketState, WaiterState,
    WindowBucket, STATE_VERSION,
};

#[cfg(test)]
mod tests;

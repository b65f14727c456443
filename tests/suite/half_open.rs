//! Property test of bounded half-open (SPEC H1-H4) on the pure core.
//!
//! Random traces of acquires, status checks, completions (`SUCCESS`,
//! `FAILURE`, `IGNORED`), time passing, policy changes (a new `N`, `M`),
//! isolations and closes, on one key with a consecutive breaker and
//! `half_open = { probes = N, successes = M }` (random `N` and `M`, each
//! sometimes left out), random leases and probe leases, `IGNORED` or
//! `FAILURE` at lease ends, and sometimes a concurrency limiter of a few
//! permits, without a queue (a probe the limiter denies takes no slot, C2,
//! C3).
//!
//! Beside the [`Fuse`] runs a model written from the contract (B1-B3, C2,
//! C3, H1-H4, L3, T2, Y4): it predicts every decision with its retry hint,
//! every completion (stale or not, and the phase after), every lease end
//! and every phase change with its cause and time; after every step the
//! fuse must agree with it, and read the same phase, failure run, attempts,
//! break end, live tickets, probe slots held and successes counted. Besides:
//!
//! - H1 (B2 with `N`): at no instant are more than `N` probe slots held,
//!   counted on the fuse: live tickets granted as `PROBE`, of the breaker's
//!   current epoch, whose slot has not ended (`N` the largest in force at an
//!   admission of the half-open period: a lower `N` frees no slot, H4; a
//!   period that began with `N = 1` keeps its one slot whatever `N`
//!   becomes, and under a raised `N` a new probe takes it over while the
//!   earlier one goes stale, docs/contract-extensions.md CX3, CX4);
//! - H2: the breaker leaves `HALF_OPEN` for `CLOSED` only at a `SUCCESS` of
//!   a current probe that is the `M`-th of its period (`M` in force then);
//! - the state a store keeps ([`Fuse::state`]) makes the same fuse again,
//!   half-open period included;
//! - H3: with `N = M = 1`, written or left out, the model is B1-B3 exactly
//!   (each admission supersedes the last probe, whose success closes), and
//!   the fuse behaves as under a policy without `half_open` at all.
//!
//! Failing cases are saved by proptest's default persistence to
//! `tests/proptest-regressions/half_open.txt`, which is committed.

use std::collections::BTreeMap;

use fusebox::domain::policy::{BreakerSpec, HalfOpenSpec, LeaseSpec, LimiterSpec};
use fusebox::domain::{
    Ask, Cause, Completed, Decision, DurationSpec, Fuse, FuseError, Grant, Notice, Outcome, Phase,
    Policy, PolicySpec, Reason, TicketId,
};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::TestCaseError;

// ---------------------------------------------------------------------------
// Policies

fn ms(d: u64) -> Option<DurationSpec> {
    Some(DurationSpec(d))
}

/// `half_open` as written: left out, written as `{ 1, 1 }`, or random
/// counts from 1 to 4, each sometimes left out.
fn half_open() -> impl Strategy<Value = Option<HalfOpenSpec>> {
    prop_oneof![
        1 => Just(None),
        1 => Just(Some(HalfOpenSpec {
            probes: Some(1),
            successes: Some(1),
        })),
        6 => (
            proptest::option::weighted(0.9, 1u32..=4),
            proptest::option::weighted(0.9, 1u32..=4),
        )
            .prop_map(|(probes, successes)| Some(HalfOpenSpec { probes, successes })),
    ]
}

/// A consecutive breaker with bounded half-open, and lease settings.
fn policy_spec() -> impl Strategy<Value = PolicySpec> {
    let multiplier = prop_oneof![Just(None), Just(Some(2.0))];
    let breaker = (
        1u32..=3,
        1u64..=60,
        multiplier,
        proptest::option::of(1u64..=80),
        half_open(),
    )
        .prop_map(
            |(failures, break_ms, multiplier, probe_lease, half_open)| BreakerSpec {
                mode: "consecutive".into(),
                failures: Some(failures),
                break_: ms(break_ms),
                multiplier,
                max_break: multiplier.map(|_| DurationSpec(break_ms * 4)),
                probe_lease: probe_lease.map(DurationSpec),
                half_open,
                ..BreakerSpec::default()
            },
        );
    let expired = prop_oneof![Just("IGNORED"), Just("FAILURE")];
    let lease = (5u64..=150, 0u64..=200, expired).prop_map(|(default, extra, outcome)| LeaseSpec {
        default: ms(default),
        max: ms(default + extra),
        expired_outcome: Some(outcome.to_owned()),
    });
    // Sometimes a concurrency limiter, so that probes compete for permits
    // (C2, C3); never a queue.
    let limiter = prop::option::weighted(
        0.3,
        (1u32..=4).prop_map(|permits| LimiterSpec {
            kind: "concurrency".into(),
            permits: Some(permits),
            ..LimiterSpec::default()
        }),
    );
    (breaker, limiter, lease).prop_map(|(breaker, limiter, lease)| PolicySpec {
        breaker: Some(breaker),
        limiter,
        lease: Some(lease),
        ..PolicySpec::default()
    })
}

// ---------------------------------------------------------------------------
// Traces

#[derive(Clone, Debug)]
enum Op {
    /// One permit, with this lease (`None`: the policy's default).
    Acquire {
        lease: Option<u64>,
    },
    /// A status check (`n = 0`, P2a).
    Check,
    /// Completes a live ticket (`live`) or any ticket handed out so far.
    Complete {
        live: bool,
        pick: Index,
        outcome: Outcome,
    },
    /// Time passes; lease ends are settled.
    Advance,
    /// The same policy with another `half_open` (Y4, H4).
    SetPolicy {
        half_open: Option<HalfOpenSpec>,
    },
    Isolate,
    Close,
}

fn outcome() -> impl Strategy<Value = Outcome> {
    prop_oneof![
        3 => Just(Outcome::Success),
        2 => Just(Outcome::Failure),
        1 => Just(Outcome::Ignored),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let lease = prop_oneof![2 => Just(None), 3 => (1u64..=120).prop_map(Some)];
    prop_oneof![
        30 => lease.prop_map(|lease| Op::Acquire { lease }),
        3 => Just(Op::Check),
        22 => (prop::bool::weighted(0.9), any::<Index>(), outcome())
            .prop_map(|(live, pick, outcome)| Op::Complete { live, pick, outcome }),
        4 => Just(Op::Advance),
        2 => half_open().prop_map(|half_open| Op::SetPolicy { half_open }),
        1 => Just(Op::Isolate),
        1 => Just(Op::Close),
    ]
}

/// Milliseconds after the previous step: often none (a burst at one
/// instant), mostly a few, sometimes past a break or a lease.
fn later() -> impl Strategy<Value = u64> {
    prop_oneof![
        6 => Just(0u64),
        10 => 1u64..=10,
        2 => 11u64..=150,
    ]
}

fn case() -> impl Strategy<Value = (PolicySpec, Vec<(u64, Op)>)> {
    (
        policy_spec(),
        prop::collection::vec((later(), op()), 1..=100),
    )
}

// ---------------------------------------------------------------------------
// The model

/// What the model knows of a live ticket.
#[derive(Clone, Copy, Debug)]
struct Held {
    /// The phase period it was issued in (a new one at every phase change).
    period: u64,
    probe: bool,
    lease_end: u64,
    /// A probe's slot ends at the first of its admission plus
    /// `probe_lease` and its lease end (B1), or when it is completed.
    slot_end: u64,
}

/// The breaker of one key as the contract describes it.
#[derive(Clone, Debug)]
struct Model {
    policy: Policy,
    phase: Phase,
    /// The end of the break, when open.
    deadline: u64,
    run: u32,
    attempts: u32,
    openings: u32,
    /// Counts phase changes (and isolations and closes): tickets of an
    /// earlier period are stale.
    period: u64,
    /// H3: the half-open period began with `N = 1`, so each admission
    /// supersedes the last probe (`latest`), whose slot may lapse while it
    /// stays current.
    one_at_a_time: bool,
    latest: Option<TicketId>,
    /// Current probe successes of this half-open period (H2).
    successes: u32,
    /// The largest `N` in force at an admission of this period.
    cap: u32,
    live: BTreeMap<TicketId, Held>,
    /// What the fuse must have said since the last step.
    notices: Vec<Notice>,
}

impl Model {
    fn new(policy: Policy) -> Self {
        Model {
            policy,
            phase: Phase::Closed,
            deadline: 0,
            run: 0,
            attempts: 0,
            openings: 0,
            period: 0,
            one_at_a_time: false,
            latest: None,
            successes: 0,
            cap: 0,
            live: BTreeMap::new(),
            notices: Vec::new(),
        }
    }

    fn failures(&self) -> u32 {
        match self.breaker().trip {
            fusebox::domain::Trip::Consecutive { failures } => failures.get(),
            fusebox::domain::Trip::Ratio { .. } => unreachable!("consecutive breakers only"),
        }
    }

    fn breaker(&self) -> &fusebox::domain::BreakerPolicy {
        self.policy.breaker.as_ref().expect("a breaker")
    }

    /// `N` in force.
    fn probes(&self) -> u32 {
        self.breaker().half_open.probes.get()
    }

    /// `M` in force.
    fn successes_to_close(&self) -> u32 {
        self.breaker().half_open.successes.get()
    }

    /// True when `ticket`'s outcome at `at` moves the breaker (B3, H2, H3);
    /// `own_lease_end` when it is its lease end being settled (L3 comes
    /// before the slot's end, H3).
    fn current(&self, id: TicketId, ticket: &Held, at: u64, own_lease_end: bool) -> bool {
        if ticket.period != self.period {
            return false;
        }
        match (self.phase, ticket.probe) {
            (Phase::Closed, false) => true,
            (Phase::HalfOpen, true) if self.one_at_a_time => self.latest == Some(id),
            (Phase::HalfOpen, true) => {
                ticket.slot_end > at || (own_lease_end && ticket.slot_end == at)
            }
            _ => false,
        }
    }

    /// Live probes of this half-open period holding a slot at `at`. A
    /// period that began with `N = 1` has one slot, the latest probe's,
    /// whatever `N` becomes (H3, H4, docs/contract-extensions.md CX3).
    fn slots_held(&self, at: u64) -> impl Iterator<Item = (&TicketId, &Held)> + '_ {
        let half_open = self.phase == Phase::HalfOpen;
        self.live.iter().filter(move |(&id, t)| {
            half_open
                && t.probe
                && t.period == self.period
                && t.slot_end > at
                && (!self.one_at_a_time || self.latest == Some(id))
        })
    }

    fn enter(&mut self, to: Phase, cause: Cause, at: u64) {
        self.notices.push(Notice::Phase {
            from: self.phase,
            to,
            cause,
            at,
        });
        self.phase = to;
        self.period += 1;
        self.deadline = 0;
        self.latest = None;
        self.successes = 0;
        self.cap = 0;
    }

    fn open(&mut self, cause: Cause, at: u64) {
        self.openings += 1;
        self.enter(Phase::Open, cause, at);
        self.deadline = at + self.breaker().break_length(self.openings);
    }

    fn close(&mut self, cause: Cause, at: u64) {
        self.run = 0;
        self.attempts = 0;
        self.openings = 0;
        self.enter(Phase::Closed, cause, at);
    }

    /// Ends a live ticket with `outcome` at `at` (B3, H2).
    fn finish(
        &mut self,
        id: TicketId,
        outcome: Outcome,
        at: u64,
        own_lease_end: bool,
    ) -> Completed {
        let ticket = self.live.remove(&id).expect("a live ticket");
        if !self.current(id, &ticket, at, own_lease_end) {
            return Completed {
                stale: true,
                phase: self.phase,
            };
        }
        match (ticket.probe, outcome) {
            (true, Outcome::Success) => {
                self.successes += 1;
                if self.successes >= self.successes_to_close() {
                    self.close(Cause::ProbeSucceeded, at);
                }
            }
            (true, Outcome::Failure) => {
                self.run += 1;
                self.open(Cause::ProbeFailed, at);
            }
            (false, Outcome::Success) => self.run = 0,
            (false, Outcome::Failure) => {
                self.run += 1;
                if self.run >= self.failures() {
                    self.open(Cause::Tripped, at);
                }
            }
            (_, Outcome::Ignored) => {}
        }
        Completed {
            stale: false,
            phase: self.phase,
        }
    }

    /// Settles every lease end due by `now`, in time order (L3, T2).
    fn settle(&mut self, now: u64) {
        while let Some((end, id)) = self
            .live
            .iter()
            .map(|(&id, t)| (t.lease_end, id))
            .filter(|&(end, _)| end <= now)
            .min()
        {
            let outcome = self.policy.lease.expired_outcome;
            self.finish(id, outcome, end, true);
            self.notices.push(Notice::Expired { ticket: id });
        }
    }

    /// True when a concurrency limiter has no permit free: every live
    /// ticket holds one (P7).
    fn no_permit_free(&self) -> bool {
        self.policy
            .limiter
            .is_some_and(|l| self.live.len() >= l.kind.limit() as usize)
    }

    /// The answer to one permit at `now` (B1, H1, C1-C3), or to a status
    /// check (P2a, B6).
    fn acquire(&mut self, lease: Option<u64>, status: bool, id: TicketId, now: u64) -> Decision {
        self.settle(now);
        let held: Vec<u64> = self.slots_held(now).map(|(_, t)| t.slot_end).collect();
        let slots_full = self.phase == Phase::HalfOpen && held.len() >= self.probes() as usize;
        match self.phase {
            Phase::Isolated => Decision::Refused,
            Phase::Open if now < self.deadline => Decision::Blocked {
                reason: Reason::Open,
                retry_after: self.deadline - now,
            },
            _ if slots_full => Decision::Blocked {
                reason: Reason::ProbeInFlight,
                retry_after: held.iter().min().expect("N >= 1 slots held") - now,
            },
            // C2, C3: a request the breaker admits but the limiter denies
            // takes no slot, counts no attempt, and leaves an OPEN breaker
            // past its deadline OPEN; a concurrency limiter gives no hint.
            _ if self.no_permit_free() => Decision::Denied {
                reason: Reason::NoPermits,
                retry_after: None,
            },
            _ if status => Decision::Granted(None),
            Phase::Closed => {
                let lease_end = now + self.policy.lease.grant(lease);
                self.live.insert(
                    id,
                    Held {
                        period: self.period,
                        probe: false,
                        lease_end,
                        slot_end: 0,
                    },
                );
                Decision::Granted(Some(Grant {
                    ticket: id,
                    lease_end,
                }))
            }
            Phase::Open => {
                self.enter(Phase::HalfOpen, Cause::ProbeAdmitted, now);
                self.one_at_a_time = self.probes() == 1;
                self.admit(lease, id, now)
            }
            Phase::HalfOpen => self.admit(lease, id, now),
        }
    }

    /// Admits a probe (B1, H1).
    fn admit(&mut self, lease: Option<u64>, id: TicketId, now: u64) -> Decision {
        let lease_end = now + self.policy.lease.grant(lease);
        let slot_end = lease_end.min(now + self.breaker().probe_lease.get());
        self.attempts += 1;
        self.cap = self.cap.max(self.probes());
        if self.one_at_a_time {
            self.latest = Some(id);
        }
        self.live.insert(
            id,
            Held {
                period: self.period,
                probe: true,
                lease_end,
                slot_end,
            },
        );
        Decision::Probe(Grant {
            ticket: id,
            lease_end,
        })
    }
}

// ---------------------------------------------------------------------------
// The runner

/// An id never handed out.
const UNKNOWN: TicketId = TicketId(u128::MAX);

struct Run {
    spec: PolicySpec,
    fuse: Fuse,
    model: Model,
    clock: u64,
    next_id: u128,
}

fn validate(spec: &PolicySpec) -> Result<Policy, TestCaseError> {
    let policy = spec.validate();
    prop_assert!(policy.is_ok(), "generated an invalid policy: {policy:?}");
    Ok(policy.expect("checked"))
}

impl Run {
    fn new(spec: PolicySpec) -> Result<Self, TestCaseError> {
        let policy = validate(&spec)?;
        Ok(Run {
            spec,
            fuse: Fuse::new(policy, 0),
            model: Model::new(policy),
            clock: 0,
            next_id: 1,
        })
    }

    fn step(&mut self, later: u64, op: &Op) -> Result<(), TestCaseError> {
        let now = self.clock + later;
        self.clock = now;
        let id = TicketId(self.next_id);
        // What H2 needs to know of a completion before it happens.
        let mut closing_success = false;
        match *op {
            Op::Acquire { lease } => {
                self.next_id += 1;
                let ask = Ask {
                    lease,
                    ..Ask::default()
                };
                let got = self.fuse.acquire(&ask, id, now);
                let want = self.model.acquire(lease, false, id, now);
                prop_assert_eq!(got, Ok(want), "acquire {:?} at {}", id, now);
            }
            Op::Check => {
                let ask = Ask {
                    permits: 0,
                    ..Ask::default()
                };
                let got = self.fuse.acquire(&ask, id, now);
                let want = self.model.acquire(None, true, id, now);
                prop_assert_eq!(got, Ok(want), "status check at {}", now);
            }
            Op::Complete {
                live,
                ref pick,
                outcome,
            } => {
                let target = self.pick(live, pick);
                let got = self.fuse.complete(target, outcome, now);
                self.model.settle(now);
                match self.model.live.get(&target).copied() {
                    Some(ticket) => {
                        let m = &self.model;
                        closing_success = outcome == Outcome::Success
                            && ticket.probe
                            && m.current(target, &ticket, now, false)
                            && m.successes + 1 >= m.successes_to_close();
                        let want = self.model.finish(target, outcome, now, false);
                        prop_assert_eq!(got, Ok(want), "{:?} of {:?} at {}", outcome, target, now);
                    }
                    None => {
                        prop_assert_eq!(got, Err(FuseError::UnknownTicket), "{:?}", target);
                        // A refused completion may have left lease ends unsettled (E3).
                        self.fuse.advance(now).expect("forward");
                    }
                }
            }
            Op::Advance => {
                self.fuse.advance(now).expect("forward");
                self.model.settle(now);
            }
            Op::SetPolicy { ref half_open } => {
                let mut spec = self.spec.clone();
                if let Some(breaker) = spec.breaker.as_mut() {
                    breaker.half_open = half_open.clone();
                }
                let policy = validate(&spec)?;
                self.fuse.set_policy(policy, now).expect("forward");
                self.model.settle(now);
                self.model.policy = policy;
            }
            Op::Isolate => {
                self.fuse.isolate(now).expect("forward");
                self.model.settle(now);
                self.model.enter(Phase::Isolated, Cause::Isolated, now);
            }
            Op::Close => {
                self.fuse.close(now).expect("forward");
                self.model.settle(now);
                self.model.close(Cause::Closed, now);
            }
        }
        let notices: Vec<Notice> = self.fuse.drain_notices().collect();
        let expected = std::mem::take(&mut self.model.notices);
        prop_assert_eq!(&notices, &expected, "{:?} at {}: notices", op, now);
        // H2: a close from HALF_OPEN is the M-th current probe success.
        let closed = notices.iter().any(|n| {
            matches!(
                n,
                Notice::Phase {
                    from: Phase::HalfOpen,
                    to: Phase::Closed,
                    cause: Cause::ProbeSucceeded,
                    ..
                }
            )
        });
        prop_assert_eq!(
            closed,
            closing_success,
            "H2: {:?} at {} closed the breaker from HALF_OPEN",
            op,
            now
        );
        self.check(now)
    }

    fn pick(&self, live: bool, pick: &Index) -> TicketId {
        if live {
            let ids: Vec<TicketId> = self.model.live.keys().copied().collect();
            if ids.is_empty() {
                return UNKNOWN;
            }
            ids[pick.index(ids.len())]
        } else {
            TicketId(1 + pick.index(self.next_id as usize) as u128)
        }
    }

    /// The fuse reads as the model says, and H1 holds.
    fn check(&self, now: u64) -> Result<(), TestCaseError> {
        let (fuse, model) = (&self.fuse, &self.model);
        let breaker = fuse.breaker();
        prop_assert_eq!(breaker.phase(), model.phase, "phase at {}", now);
        prop_assert_eq!(breaker.consecutive_failures(), model.run, "failure run");
        prop_assert_eq!(breaker.half_open_attempts(), model.attempts, "attempts");
        prop_assert_eq!(
            breaker.open_until(),
            (model.phase == Phase::Open).then_some(model.deadline),
            "break end"
        );
        prop_assert_eq!(fuse.live_tickets(), model.live.len(), "live tickets");
        let epoch = breaker.epoch();
        let mut held_current_probes = 0;
        for (&id, held) in &model.live {
            let ticket = fuse.ticket(id);
            prop_assert!(ticket.is_some(), "{:?} should be live", id);
            let ticket = ticket.expect("checked");
            prop_assert_eq!(ticket.lease_end, held.lease_end, "{:?}: lease end", id);
            // A superseded probe may lose the fuse's probe mark (B2); only
            // a ticket granted as PROBE may carry it.
            prop_assert!(!ticket.probe || held.probe, "{:?} marked a probe", id);
            if held.probe && ticket.epoch == epoch && held.slot_end > now {
                held_current_probes += 1;
            }
        }
        // H1: at no instant more than N probe slots held.
        prop_assert!(
            held_current_probes <= model.cap.max(1),
            "H1: {held_current_probes} current probes hold a slot at {now}, N is {} (at most {} at an admission)",
            model.probes(),
            model.cap
        );
        let view = fuse.view(now);
        let slots = model.slots_held(now).count() as u32;
        prop_assert_eq!(
            (view.probes_held, view.half_open_successes),
            (slots, model.successes),
            "(probes_held, half_open_successes) at {}",
            now
        );
        prop_assert!(slots <= model.cap.max(1), "H1 in the model");
        // What a store keeps of a key brings the half-open period back whole
        // (its rule, slots and successes): a fuse made again from it is
        // this one, so it goes on exactly alike.
        prop_assert_eq!(
            Fuse::from_state(fuse.state()),
            Ok(fuse.clone()),
            "the fuse made again from its state at {}",
            now
        );
        Ok(())
    }

    /// Moves time past every lease: nothing stays live.
    fn finish(&mut self) -> Result<(), TestCaseError> {
        let end = self.clock + 1_000_000;
        self.step(end - self.clock, &Op::Advance)?;
        prop_assert_eq!(
            self.fuse.live_tickets(),
            0,
            "L3: tickets outlived every lease"
        );
        Ok(())
    }
}

/// H3: with `N = M = 1`, the same trace under the same policy without
/// `half_open` gives the same fuse after every step.
fn without_half_open(spec: &PolicySpec) -> Option<PolicySpec> {
    let half_open = spec.breaker.as_ref()?.half_open.as_ref()?;
    let one = |n: Option<u32>| n.unwrap_or(1) == 1;
    if !(one(half_open.probes) && one(half_open.successes)) {
        return None;
    }
    let mut plain = spec.clone();
    plain.breaker.as_mut()?.half_open = None;
    Some(plain)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 2048,
        max_shrink_iters: 20_000,
        ..ProptestConfig::default()
    })]

    #[test]
    fn bounded_half_open_follows_the_contract((spec, steps) in case()) {
        let twin_spec = without_half_open(&spec);
        let mut run = Run::new(spec)?;
        let mut twin = twin_spec.map(Run::new).transpose()?;
        run.check(0)?;
        for (later, op) in &steps {
            run.step(*later, op)?;
            if let Some(twin) = twin.as_mut() {
                twin.step(*later, op)?;
                prop_assert!(twin.fuse == run.fuse, "N = M = 1 differs from no half_open after {:?}", op);
            }
        }
        run.finish()?;
    }
}

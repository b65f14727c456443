//! Property tests of the pure core: random valid policies driven by random
//! operation sequences, with the contract's invariants checked after every
//! step.
//!
//! A model kept beside the [`Fuse`] follows only what the fuse tells its
//! caller (decisions, replies and notices): the live tickets with their
//! permits and lease ends, and the waiters. After every step:
//!
//! - B2: at most one live ticket is a probe of the breaker's current epoch;
//! - P8: `0 <= free <= limit` and `queued <= queue_limit`;
//! - P7: for a concurrency limiter, `limit - free` is the sum of the permits
//!   of the live tickets, and once every ticket has ended `free == limit`;
//! - E3: a failed operation leaves the fuse as it was, or as it was merely
//!   advanced to the same `now` (time passing is not the operation's effect);
//! - T0: an earlier `now` than the last seen is refused with `ClockWentBack`
//!   and changes nothing;
//! - P5/P6/C4: every waiter is answered exactly once, a granted waiter's
//!   ticket is live, and waiters exist only while the breaker is closed;
//! - L3/T2: nothing due by the last `now` is left unsettled, and settling a
//!   stretch of time in one jump equals walking it event by event.
//!
//! Failing cases are saved by proptest's default `SourceParallel` persistence:
//! `tests/suite/` holds `main.rs`, so they go to
//! `tests/proptest-regressions/properties.txt`, which is committed.

use std::collections::{BTreeMap, BTreeSet};

use fusebox::domain::policy::{BreakerSpec, LeaseSpec, LimiterSpec};
use fusebox::domain::{
    Ask, Decision, DurationSpec, Fuse, FuseError, LimiterKind, Notice, Outcome, Phase, Policy,
    PolicySpec, Reason, TicketId,
};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::TestCaseError;

// ---------------------------------------------------------------------------
// Policies

fn ms(d: u64) -> Option<DurationSpec> {
    Some(DurationSpec(d))
}

fn breaker_spec() -> impl Strategy<Value = BreakerSpec> {
    let mode = prop_oneof![
        (1u32..=4).prop_map(|failures| BreakerSpec {
            mode: "consecutive".into(),
            failures: Some(failures),
            ..BreakerSpec::default()
        }),
        (1u32..=10, 1u32..=5, 10u64..=200).prop_map(|(tenths, minimum, window)| BreakerSpec {
            mode: "ratio".into(),
            failure_ratio: Some(f64::from(tenths) / 10.0),
            minimum_throughput: Some(minimum),
            sampling_window: ms(window),
            ..BreakerSpec::default()
        }),
    ];
    let multiplier = prop_oneof![
        Just(None),
        Just(Some(1.0)),
        (10u32..=40).prop_map(|m| Some(f64::from(m) / 10.0)),
    ];
    (
        mode,
        1u64..=100,
        multiplier,
        proptest::option::of(0u64..=200),
        proptest::option::of(1u64..=100),
    )
        .prop_map(
            |(mode, break_ms, multiplier, extra, probe_lease)| BreakerSpec {
                break_: ms(break_ms),
                multiplier,
                max_break: extra.map(|e| DurationSpec(break_ms + e)),
                probe_lease: probe_lease.map(DurationSpec),
                ..mode
            },
        )
}

fn limiter_spec() -> impl Strategy<Value = LimiterSpec> {
    let kind = prop_oneof![
        (1u32..=3).prop_map(|permits| LimiterSpec {
            kind: "concurrency".into(),
            permits: Some(permits),
            ..LimiterSpec::default()
        }),
        (1u32..=5)
            .prop_flat_map(|capacity| (Just(capacity), 1u32..=capacity, 1u64..=50))
            .prop_map(|(capacity, refill, period)| LimiterSpec {
                kind: "token_bucket".into(),
                capacity: Some(capacity),
                refill: Some(refill),
                period: ms(period),
                ..LimiterSpec::default()
            }),
        (1u32..=5, 1u64..=50).prop_map(|(permits, window)| LimiterSpec {
            kind: "fixed_window".into(),
            permits: Some(permits),
            window: ms(window),
            ..LimiterSpec::default()
        }),
        (1u32..=5, 1u32..=4, 1u64..=20).prop_map(|(permits, segments, segment)| LimiterSpec {
            kind: "sliding_window".into(),
            permits: Some(permits),
            window: ms(u64::from(segments) * segment),
            segments: Some(segments),
            ..LimiterSpec::default()
        }),
    ];
    let order = proptest::option::of(prop_oneof![Just("oldest_first"), Just("newest_first")]);
    let queue_limit = prop_oneof![
        1 => Just(None),
        1 => Just(Some(0)),
        4 => (1u32..=8).prop_map(Some),
    ];
    (kind, queue_limit, order).prop_map(|(kind, queue_limit, order)| LimiterSpec {
        queue_limit,
        order: order.map(str::to_owned),
        ..kind
    })
}

fn lease_spec() -> impl Strategy<Value = LeaseSpec> {
    let outcome = proptest::option::of(prop_oneof![Just("IGNORED"), Just("FAILURE")]);
    (
        proptest::option::of(5u64..=150),
        proptest::option::of(0u64..=200),
        outcome,
    )
        .prop_map(|(default, extra, outcome)| LeaseSpec {
            default: default.map(DurationSpec),
            // `lease.default` (30 s when absent) must not be above `lease.max`.
            max: extra.map(|e| DurationSpec(default.unwrap_or(30_000) + e)),
            expired_outcome: outcome.map(str::to_owned),
        })
}

/// A random valid policy as the config writes it (also used by the fuzz module).
pub(crate) fn policy_spec() -> impl Strategy<Value = PolicySpec> {
    (
        prop::option::weighted(0.85, breaker_spec()),
        prop::option::weighted(0.8, limiter_spec()),
        prop::option::weighted(0.8, lease_spec()),
    )
        .prop_map(|(breaker, limiter, lease)| PolicySpec {
            breaker,
            limiter,
            lease,
            ..PolicySpec::default()
        })
}

/// The limiter's limit as the spec writes it (3 without a limiter).
fn spec_limit(spec: &PolicySpec) -> u32 {
    spec.limiter
        .as_ref()
        .and_then(|l| l.permits.or(l.capacity))
        .unwrap_or(3)
}

// ---------------------------------------------------------------------------
// Operations

/// Which ticket or waiter an operation names.
#[derive(Clone, Debug)]
enum Pick {
    /// One the model holds live (a ticket) or waiting (for `Withdraw`).
    Held(Index),
    /// Any id handed out so far, whatever became of it.
    Issued(Index),
    /// An id never handed out.
    Unknown,
}

fn pick() -> impl Strategy<Value = Pick> {
    prop_oneof![
        6 => any::<Index>().prop_map(Pick::Held),
        2 => any::<Index>().prop_map(Pick::Issued),
        1 => Just(Pick::Unknown),
    ]
}

fn outcome() -> impl Strategy<Value = Outcome> {
    prop_oneof![
        2 => Just(Outcome::Success),
        3 => Just(Outcome::Failure),
        1 => Just(Outcome::Ignored),
    ]
}

fn lease() -> impl Strategy<Value = Option<u64>> {
    prop_oneof![
        3 => Just(None),
        1 => Just(Some(0)),
        6 => (1u64..=250).prop_map(Some),
    ]
}

#[derive(Clone, Debug)]
enum Op {
    Acquire {
        permits: u32,
        max_wait: u64,
        lease: Option<u64>,
        room_for_ticket: bool,
        room_for_waiter: bool,
    },
    Complete {
        pick: Pick,
        outcome: Outcome,
    },
    Renew {
        pick: Pick,
        lease: Option<u64>,
    },
    Withdraw {
        pick: Pick,
    },
    Isolate,
    Close,
    Advance,
}

fn op(limit: u32) -> impl Strategy<Value = Op> {
    let max_wait = prop_oneof![2 => Just(0u64), 3 => 1u64..=60];
    let acquire = (
        0..=limit + 1,
        max_wait,
        lease(),
        prop::bool::weighted(0.95),
        prop::bool::weighted(0.95),
    )
        .prop_map(
            |(permits, max_wait, lease, room_for_ticket, room_for_waiter)| Op::Acquire {
                permits,
                max_wait,
                lease,
                room_for_ticket,
                room_for_waiter,
            },
        );
    prop_oneof![
        24 => acquire,
        12 => (pick(), outcome()).prop_map(|(pick, outcome)| Op::Complete { pick, outcome }),
        4 => (pick(), lease()).prop_map(|(pick, lease)| Op::Renew { pick, lease }),
        4 => pick().prop_map(|pick| Op::Withdraw { pick }),
        1 => Just(Op::Isolate),
        3 => Just(Op::Close),
        4 => Just(Op::Advance),
    ]
}

/// When an operation happens.
#[derive(Clone, Copy, Debug)]
enum When {
    /// This many ms after the latest time used so far.
    Later(u64),
    /// This many ms before the last time the fuse saw.
    Earlier(u64),
}

fn when() -> impl Strategy<Value = When> {
    prop_oneof![
        18 => (0u64..=15).prop_map(When::Later),
        1 => (16u64..=300).prop_map(When::Later),
        1 => (1u64..=20).prop_map(When::Earlier),
    ]
}

/// How a case ends: every live ticket completed with `outcome` (or left to
/// its lease when `None`), then time moved far past every lease and wait.
#[derive(Clone, Copy, Debug)]
struct Ending {
    complete_with: Option<Outcome>,
}

fn case() -> impl Strategy<Value = (PolicySpec, Vec<(When, Op)>, Ending)> {
    policy_spec().prop_flat_map(|spec| {
        let limit = spec_limit(&spec);
        let ending =
            proptest::option::of(outcome()).prop_map(|complete_with| Ending { complete_with });
        (
            Just(spec),
            prop::collection::vec((when(), op(limit)), 1..=60),
            ending,
        )
    })
}

// ---------------------------------------------------------------------------
// The model and the runner

/// What the model knows of a live ticket.
#[derive(Clone, Copy, Debug)]
struct Held {
    permits: u32,
    lease_end: u64,
}

struct Run {
    policy: Policy,
    fuse: Fuse,
    /// The latest `now` used (the fuse may have seen less after a failed operation).
    clock: u64,
    next_id: u128,
    live: BTreeMap<TicketId, Held>,
    /// Waiters and the permits they ask for.
    waiting: BTreeMap<TicketId, u32>,
    /// Waiters that left the queue, answered or withdrawn: none may be answered again.
    left_queue: BTreeSet<TicketId>,
}

/// An id the engine never hands out in these tests.
const UNKNOWN: TicketId = TicketId(u128::MAX);

fn nth<T: Copy>(set: impl ExactSizeIterator<Item = T>, index: &Index) -> Option<T> {
    let len = set.len();
    if len == 0 {
        return None;
    }
    let i = index.index(len);
    set.into_iter().nth(i)
}

impl Run {
    fn new(policy: Policy) -> Self {
        Run {
            policy,
            fuse: Fuse::new(policy, 0),
            clock: 0,
            next_id: 1,
            live: BTreeMap::new(),
            waiting: BTreeMap::new(),
            left_queue: BTreeSet::new(),
        }
    }

    fn is_concurrency(&self) -> bool {
        matches!(
            self.policy.limiter.map(|l| l.kind),
            Some(LimiterKind::Concurrency { .. })
        )
    }

    fn resolve(&self, pick: &Pick, waiters: bool) -> TicketId {
        match pick {
            Pick::Held(i) if waiters => nth(self.waiting.keys().copied(), i).unwrap_or(UNKNOWN),
            Pick::Held(i) => nth(self.live.keys().copied(), i).unwrap_or(UNKNOWN),
            Pick::Issued(i) => {
                let issued = self.next_id - 1;
                if issued == 0 {
                    UNKNOWN
                } else {
                    TicketId(1 + i.index(issued as usize) as u128)
                }
            }
            Pick::Unknown => UNKNOWN,
        }
    }

    /// Folds the notices of one operation into the model.
    fn absorb(&mut self, notices: &[Notice], now: u64) -> Result<(), TestCaseError> {
        for notice in notices {
            match *notice {
                Notice::Answered { waiter, decision } => {
                    let permits = self.waiting.remove(&waiter);
                    prop_assert!(
                        permits.is_some(),
                        "{waiter:?} answered ({decision:?}) but it does not wait"
                    );
                    prop_assert!(self.left_queue.insert(waiter), "{waiter:?} answered twice");
                    match decision {
                        Decision::Granted(Some(grant)) => {
                            prop_assert_eq!(grant.ticket, waiter, "a waiter's ticket is its id");
                            self.live.insert(
                                waiter,
                                Held {
                                    permits: permits.unwrap_or(0),
                                    lease_end: grant.lease_end,
                                },
                            );
                        }
                        Decision::Blocked { .. } | Decision::Refused => {}
                        Decision::Denied {
                            reason: Reason::Evicted | Reason::Timeout,
                            ..
                        } => {}
                        other => {
                            prop_assert!(false, "{waiter:?} answered with {other:?}");
                        }
                    }
                }
                Notice::Expired { ticket } => {
                    let held = self.live.remove(&ticket);
                    prop_assert!(held.is_some(), "{ticket:?} expired but it was not live");
                    let held = held.unwrap_or(Held {
                        permits: 0,
                        lease_end: 0,
                    });
                    prop_assert!(
                        held.lease_end <= now,
                        "{ticket:?} expired at {now} before its lease end {}",
                        held.lease_end
                    );
                }
                Notice::Phase { at, .. } => {
                    prop_assert!(at <= now, "a phase change at {at} after now {now}");
                }
            }
        }
        Ok(())
    }

    /// The invariants that hold after every step.
    fn check(&self) -> Result<(), TestCaseError> {
        let fuse = &self.fuse;
        let seen = fuse.last_now();
        let epoch = fuse.breaker().epoch();
        let concurrency = self.is_concurrency();

        // The model's live tickets are exactly the fuse's.
        prop_assert_eq!(fuse.live_tickets(), self.live.len(), "live tickets");
        prop_assert_eq!(fuse.waiters(), self.waiting.len(), "waiters");
        let mut current_probes = Vec::new();
        for (&id, held) in &self.live {
            let ticket = fuse.ticket(id);
            prop_assert!(ticket.is_some(), "{id:?} should be live");
            let ticket = ticket.expect("checked");
            prop_assert_eq!(ticket.lease_end, held.lease_end, "{:?} lease end", id);
            prop_assert!(
                ticket.lease_end > seen,
                "{id:?} still live at {seen} though its lease ended at {} (L3)",
                ticket.lease_end
            );
            let expected_permits = if self.policy.limiter.is_some() {
                held.permits
            } else {
                0
            };
            prop_assert_eq!(ticket.permits, expected_permits, "{:?} permits", id);
            prop_assert_eq!(ticket.holds, concurrency, "{:?} holds", id);
            if ticket.probe && ticket.epoch == epoch {
                current_probes.push(id);
            }
        }
        // B2.
        prop_assert!(
            current_probes.len() <= 1,
            "B2: live probes of the current epoch {epoch}: {current_probes:?}"
        );

        // P8.
        let view = fuse.view(seen);
        prop_assert!(
            view.free <= view.limit,
            "P8: free {} > limit {}",
            view.free,
            view.limit
        );
        let queued: u64 = self.waiting.values().map(|&n| u64::from(n)).sum();
        prop_assert_eq!(view.queued, queued, "queued permits");
        prop_assert_eq!(view.live_tickets, self.live.len());
        prop_assert_eq!(view.waiters, self.waiting.len());
        match self.policy.limiter {
            Some(lp) => {
                prop_assert_eq!(view.limit, lp.kind.limit());
                prop_assert!(
                    view.queued <= u64::from(lp.queue_limit),
                    "P8: queued {} > queue_limit {}",
                    view.queued,
                    lp.queue_limit
                );
            }
            None => {
                prop_assert_eq!((view.free, view.limit, view.queued), (0, 0, 0));
            }
        }

        // P7: concurrency permits held are exactly those of the live tickets.
        if concurrency {
            let held: u64 = self.live.values().map(|h| u64::from(h.permits)).sum();
            prop_assert_eq!(
                u64::from(view.limit - view.free),
                held,
                "P7: limit - free vs permits of live tickets"
            );
        }

        // C4: waiters exist only while the breaker admits normally.
        if !self.waiting.is_empty() {
            prop_assert_eq!(view.phase, Phase::Closed, "C4: waiters while not closed");
        }

        // L3, P6, T2: nothing due by the last time seen is left unsettled.
        if let Some(due) = fuse.next_deadline() {
            prop_assert!(
                due > seen,
                "next_deadline {due} is not after the last time seen {seen}"
            );
        }
        Ok(())
    }

    /// Settling `[last, now]` in one jump equals walking it event by event
    /// and millisecond by millisecond (the fuse's module doc, T2).
    fn check_time_splits(&self, now: u64) -> Result<(), TestCaseError> {
        let last = self.fuse.last_now();
        if now <= last {
            return Ok(());
        }
        let mut jump = self.fuse.clone();
        jump.advance(now).expect("forward");
        let jumped: Vec<Notice> = jump.drain_notices().collect();

        let mut by_event = self.fuse.clone();
        while let Some(due) = by_event.next_deadline().filter(|&t| t <= now) {
            if due <= by_event.last_now() {
                break;
            }
            by_event.advance(due).expect("forward");
        }
        by_event.advance(now).expect("forward");
        let walked: Vec<Notice> = by_event.drain_notices().collect();
        prop_assert_eq!(&walked, &jumped, "notices: walking by events vs one jump");
        prop_assert!(by_event == jump, "state: walking by events vs one jump");

        if now - last <= 40 {
            let mut by_ms = self.fuse.clone();
            for t in last + 1..=now {
                by_ms.advance(t).expect("forward");
            }
            let walked: Vec<Notice> = by_ms.drain_notices().collect();
            prop_assert_eq!(&walked, &jumped, "notices: walking by ms vs one jump");
            prop_assert!(by_ms == jump, "state: walking by ms vs one jump");
        }
        Ok(())
    }

    fn step(&mut self, when: When, op: &Op) -> Result<(), TestCaseError> {
        let last = self.fuse.last_now();
        let now = match when {
            When::Later(d) => self.clock + d,
            When::Earlier(k) if last > 0 => last - k.min(last),
            When::Earlier(_) => self.clock,
        };
        let back = now < last;
        if !back {
            self.clock = now;
            self.check_time_splits(now)?;
        }
        let untouched = self.fuse.clone();

        let id = TicketId(self.next_id);
        let result = match *op {
            Op::Acquire {
                permits,
                max_wait,
                lease,
                room_for_ticket,
                room_for_waiter,
            } => {
                self.next_id += 1;
                let ask = Ask {
                    caller: Default::default(),
                    permits,
                    max_wait,
                    lease,
                    room_for_ticket,
                    room_for_waiter,
                    retry: false,
                };
                self.fuse.acquire(&ask, id, now).map(Reply::Decision)
            }
            Op::Complete { ref pick, outcome } => {
                let target = self.resolve(pick, false);
                self.fuse
                    .complete(target, outcome, now)
                    .map(|_| Reply::Completed(target))
            }
            Op::Renew { ref pick, lease } => {
                let target = self.resolve(pick, false);
                self.fuse
                    .renew(target, lease, now)
                    .map(|left| Reply::Renewed(target, left))
            }
            Op::Withdraw { ref pick } => {
                let target = self.resolve(pick, true);
                self.fuse
                    .withdraw(target, now)
                    .map(|gone| Reply::Withdrawn(target, gone))
            }
            Op::Isolate => self.fuse.isolate(now).map(|()| Reply::Done),
            Op::Close => self.fuse.close(now).map(|()| Reply::Done),
            Op::Advance => self.fuse.advance(now).map(|()| Reply::Done),
        };
        let notices: Vec<Notice> = self.fuse.drain_notices().collect();

        if back {
            // T0: an earlier `now` is refused and changes nothing.
            prop_assert_eq!(
                result.as_ref().err(),
                Some(&FuseError::ClockWentBack { now, last }),
                "an earlier now must be refused"
            );
            prop_assert!(notices.is_empty(), "a refused call gave notices");
            prop_assert!(self.fuse == untouched, "ClockWentBack changed the fuse");
            return self.check();
        }

        let reply = match result {
            Ok(reply) => reply,
            Err(error) => {
                prop_assert!(
                    !matches!(error, FuseError::ClockWentBack { .. }),
                    "{error:?} at {now} (last {last})"
                );
                self.expect_error(op, error, now)?;
                // E3: the fuse is as it was, or as it was advanced to `now`.
                let mut advanced = untouched.clone();
                advanced.advance(now).expect("forward");
                let advanced_notices: Vec<Notice> = advanced.drain_notices().collect();
                let unchanged = self.fuse == untouched && notices.is_empty();
                let only_time = self.fuse == advanced && notices == advanced_notices;
                prop_assert!(
                    unchanged || only_time,
                    "E3: {op:?} failed with {error:?} but changed the fuse"
                );
                self.absorb(&notices, now)?;
                return self.check();
            }
        };

        // Tickets whose lease ended by `now` were settled first.
        let due_before: BTreeSet<TicketId> = self
            .live
            .iter()
            .filter(|(_, h)| h.lease_end <= now)
            .map(|(&id, _)| id)
            .collect();
        let was_live = |t: TicketId| self.live.get(&t).is_some_and(|h| h.lease_end > now);
        match reply {
            Reply::Decision(decision) => {
                self.absorb(&notices, now)?;
                self.expect_decision(op, id, decision, now, &untouched)?;
            }
            Reply::Completed(target) => {
                prop_assert!(was_live(target), "completed {target:?}, which was not live");
                self.live.remove(&target);
                self.absorb(&notices, now)?;
                prop_assert!(
                    self.fuse.ticket(target).is_none(),
                    "{target:?} still live after its completion"
                );
            }
            Reply::Renewed(target, left) => {
                prop_assert!(was_live(target), "renewed {target:?}, which was not live");
                let Op::Renew { lease, .. } = *op else {
                    unreachable!()
                };
                prop_assert_eq!(left, self.policy.lease.grant(lease), "L2: time left");
                self.absorb(&notices, now)?;
                if let Some(h) = self.live.get_mut(&target) {
                    h.lease_end = now + left;
                }
            }
            Reply::Withdrawn(target, gone) => {
                self.absorb(&notices, now)?;
                let waited = self.waiting.remove(&target).is_some();
                prop_assert_eq!(gone, waited, "withdraw {:?}", target);
                if waited {
                    self.left_queue.insert(target);
                }
            }
            Reply::Done => self.absorb(&notices, now)?,
        }
        for id in due_before {
            prop_assert!(
                !self.live.contains_key(&id),
                "{id:?} outlived its lease end at {now}"
            );
        }
        self.check()
    }

    /// The error an operation may fail with.
    fn expect_error(&self, op: &Op, error: FuseError, now: u64) -> Result<(), TestCaseError> {
        let live = |t: TicketId| self.live.get(&t).is_some_and(|h| h.lease_end > now);
        match *op {
            Op::Acquire {
                lease,
                room_for_ticket,
                room_for_waiter,
                ..
            } => match error {
                FuseError::ZeroLease => prop_assert_eq!(lease, Some(0)),
                FuseError::NoRoomForTicket => prop_assert!(!room_for_ticket && lease != Some(0)),
                FuseError::NoRoomForWaiter => prop_assert!(!room_for_waiter && lease != Some(0)),
                other => prop_assert!(false, "acquire failed with {other:?}"),
            },
            Op::Complete { ref pick, .. } => {
                prop_assert_eq!(error, FuseError::UnknownTicket);
                let target = self.resolve(pick, false);
                prop_assert!(!live(target), "L4: completing live {target:?} failed");
            }
            Op::Renew { ref pick, lease } => {
                let target = self.resolve(pick, false);
                match error {
                    FuseError::ZeroLease => prop_assert_eq!(lease, Some(0)),
                    FuseError::UnknownTicket => {
                        prop_assert!(lease != Some(0), "ZeroLease comes first");
                        prop_assert!(!live(target), "L2: renewing live {target:?} failed");
                    }
                    other => prop_assert!(false, "renew failed with {other:?}"),
                }
            }
            _ => prop_assert!(false, "{op:?} failed with {error:?}"),
        }
        Ok(())
    }

    /// Checks an acquire's decision and records what it created.
    fn expect_decision(
        &mut self,
        op: &Op,
        id: TicketId,
        decision: Decision,
        now: u64,
        untouched: &Fuse,
    ) -> Result<(), TestCaseError> {
        let Op::Acquire {
            permits,
            max_wait,
            lease,
            ..
        } = *op
        else {
            unreachable!("only an acquire decides")
        };
        prop_assert!(lease != Some(0), "a zero lease was accepted");
        let limiter = self.policy.limiter;
        if permits == 0 {
            // P2a: a status check gives no ticket and changes nothing.
            prop_assert!(
                matches!(
                    decision,
                    Decision::Granted(None)
                        | Decision::Blocked { .. }
                        | Decision::Refused
                        | Decision::Denied {
                            reason: Reason::NoPermits,
                            ..
                        }
                ),
                "P2a: status check answered {decision:?}"
            );
            let mut advanced = untouched.clone();
            advanced.advance(now).expect("forward");
            advanced.drain_notices().for_each(drop);
            prop_assert!(
                self.fuse == advanced,
                "P2a: a status check changed the fuse"
            );
            return Ok(());
        }
        if let Some(lp) = limiter {
            if permits > lp.kind.limit() {
                prop_assert!(
                    matches!(
                        decision,
                        Decision::Blocked { .. }
                            | Decision::Refused
                            | Decision::Denied {
                                reason: Reason::ExceedsLimit,
                                retry_after: None
                            }
                    ),
                    "P2: {permits} permits over the limit answered {decision:?}"
                );
            }
        }
        match decision {
            Decision::Granted(None) => {
                prop_assert!(false, "a request for {permits} permits got no ticket");
            }
            Decision::Shadow { .. } => {
                prop_assert!(false, "a shadow grant under an enforcing policy");
            }
            Decision::Granted(Some(grant)) | Decision::Probe(grant) => {
                prop_assert_eq!(grant.ticket, id);
                prop_assert_eq!(grant.lease_end, now + self.policy.lease.grant(lease), "L2");
                if matches!(decision, Decision::Probe(_)) {
                    prop_assert!(self.policy.breaker.is_some(), "a probe without a breaker");
                    prop_assert_eq!(self.fuse.breaker().phase(), Phase::HalfOpen);
                    let ticket = self.fuse.ticket(id);
                    prop_assert!(
                        ticket.is_some_and(|t| t.probe && t.epoch == self.fuse.breaker().epoch())
                    );
                }
                self.live.insert(
                    id,
                    Held {
                        permits,
                        lease_end: grant.lease_end,
                    },
                );
            }
            Decision::Queued => {
                let lp = limiter.expect("only a limiter queues");
                prop_assert!(max_wait > 0, "P4: queued with max_wait 0");
                prop_assert!(
                    permits <= lp.queue_limit,
                    "P4: queued beyond the queue limit"
                );
                self.waiting.insert(id, permits);
            }
            Decision::Blocked { .. } | Decision::Refused | Decision::Denied { .. } => {}
        }
        Ok(())
    }

    /// Ends every ticket, then moves time past every lease and wait.
    fn finish(&mut self, ending: Ending) -> Result<(), TestCaseError> {
        // A failed operation may have left the fuse behind the latest `now`.
        self.fuse.advance(self.clock).expect("forward");
        let notices: Vec<Notice> = self.fuse.drain_notices().collect();
        self.absorb(&notices, self.clock)?;
        self.check()?;
        if let Some(outcome) = ending.complete_with {
            let mut rounds = 0;
            while let Some((&id, _)) = self.live.iter().next() {
                rounds += 1;
                prop_assert!(rounds < 10_000, "completions never end");
                let now = self.clock;
                let reply = self.fuse.complete(id, outcome, now);
                prop_assert!(reply.is_ok(), "completing live {id:?}: {reply:?}");
                self.live.remove(&id);
                let notices: Vec<Notice> = self.fuse.drain_notices().collect();
                self.absorb(&notices, now)?;
                self.check()?;
            }
            if self.is_concurrency() {
                // P5, P7: with every permit back, no waiter is left behind.
                prop_assert!(
                    self.waiting.is_empty(),
                    "P5: waiters left with every permit free"
                );
                let view = self.fuse.view(self.clock);
                prop_assert_eq!(view.free, view.limit, "P7: free after every ticket ended");
            }
        }
        let end = self.clock + 1_000_000;
        self.check_time_splits(end)?;
        self.fuse.advance(end).expect("forward");
        self.clock = end;
        let notices: Vec<Notice> = self.fuse.drain_notices().collect();
        self.absorb(&notices, end)?;
        self.check()?;
        prop_assert!(self.live.is_empty(), "L3: tickets outlived every lease");
        prop_assert!(self.waiting.is_empty(), "P6: waiters outlived every wait");
        let view = self.fuse.view(end);
        prop_assert_eq!(view.free, view.limit, "P7: a limiter is full again at rest");
        Ok(())
    }
}

enum Reply {
    Decision(Decision),
    Completed(TicketId),
    Renewed(TicketId, u64),
    Withdrawn(TicketId, bool),
    Done,
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 1024,
        max_shrink_iters: 20_000,
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_operations_keep_the_contracts_invariants((spec, steps, ending) in case()) {
        let policy = spec.validate();
        prop_assert!(policy.is_ok(), "generated an invalid policy: {policy:?}");
        let mut run = Run::new(policy.expect("checked"));
        run.check()?;
        for (when, op) in &steps {
            run.step(*when, op)?;
        }
        run.finish(ending)?;
    }
}

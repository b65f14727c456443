//! A key's state as plain data: every reachable fuse reads back as itself
//! (also through JSON), a fuse reloaded from its state before every step
//! decides as the original does, and a damaged state is refused with the
//! fault named, never with a panic.

use proptest::prelude::*;
use proptest::sample::Index;
use serde_json::Value;

use super::*;
use crate::fuse::{Ask, Decision};
use crate::policy::{BreakerSpec, DurationSpec, LeaseSpec, LimiterSpec, Policy};
use crate::{HeapParts, Outcome};

// ---------------------------------------------------------------------------
// Generators

fn ms(range: std::ops::RangeInclusive<u64>) -> impl Strategy<Value = DurationSpec> {
    range.prop_map(DurationSpec)
}

fn breaker_spec() -> impl Strategy<Value = BreakerSpec> {
    let mode = prop_oneof![
        (1u32..=4).prop_map(|failures| BreakerSpec {
            mode: "consecutive".into(),
            failures: Some(failures),
            ..BreakerSpec::default()
        }),
        (
            // Ratios written with few digits, so that JSON reads them back exactly.
            prop::sample::select(vec![0.25, 0.5, 0.6, 0.75, 1.0]),
            1u32..=4,
            ms(10..=400),
        )
            .prop_map(|(ratio, throughput, window)| BreakerSpec {
                mode: "ratio".into(),
                failure_ratio: Some(ratio),
                minimum_throughput: Some(throughput),
                sampling_window: Some(window),
                ..BreakerSpec::default()
            }),
    ];
    (
        mode,
        ms(1..=300),
        prop::option::of(prop::sample::select(vec![1.0, 1.5, 2.0, 3.25])),
        prop::option::of(300u64..=900),
        prop::option::of(ms(1..=300)),
    )
        .prop_map(
            |(mode, break_, multiplier, max_break, probe_lease)| BreakerSpec {
                break_: Some(break_),
                multiplier,
                max_break: max_break.map(DurationSpec),
                probe_lease,
                ..mode
            },
        )
}

fn limiter_spec() -> impl Strategy<Value = LimiterSpec> {
    let kind = prop_oneof![
        (1u32..=5).prop_map(|permits| LimiterSpec {
            kind: "concurrency".into(),
            permits: Some(permits),
            ..LimiterSpec::default()
        }),
        (1u32..=5, 1u32..=5, ms(1..=120)).prop_map(|(capacity, refill, period)| LimiterSpec {
            kind: "token_bucket".into(),
            capacity: Some(capacity),
            refill: Some(refill.min(capacity)),
            period: Some(period),
            ..LimiterSpec::default()
        }),
        (1u32..=5, ms(1..=200)).prop_map(|(permits, window)| LimiterSpec {
            kind: "fixed_window".into(),
            permits: Some(permits),
            window: Some(window),
            ..LimiterSpec::default()
        }),
        (1u32..=5, 1u32..=4, 1u64..=60).prop_map(|(permits, segments, length)| LimiterSpec {
            kind: "sliding_window".into(),
            permits: Some(permits),
            segments: Some(segments),
            window: Some(DurationSpec(u64::from(segments) * length)),
            ..LimiterSpec::default()
        }),
    ];
    (
        kind,
        prop::option::weighted(0.8, 0u32..=16),
        prop::option::of(prop::sample::select(vec!["oldest_first", "newest_first"])),
    )
        .prop_map(|(kind, queue_limit, order)| LimiterSpec {
            queue_limit,
            order: order.map(String::from),
            ..kind
        })
}

fn lease_spec() -> impl Strategy<Value = LeaseSpec> {
    (
        prop_oneof![1u64..=100, 100u64..=3_000],
        0u64..=3_000,
        prop::sample::select(vec!["IGNORED", "FAILURE"]),
    )
        .prop_map(|(default, extra, outcome)| LeaseSpec {
            default: Some(DurationSpec(default)),
            max: Some(DurationSpec(default + extra)),
            expired_outcome: Some(outcome.into()),
        })
}

/// A valid policy of any shape.
fn policy() -> impl Strategy<Value = Policy> {
    (
        prop::option::weighted(0.8, breaker_spec()),
        prop::option::weighted(0.8, limiter_spec()),
        prop::option::of(lease_spec()),
    )
        .prop_filter_map("a valid policy", |(breaker, limiter, lease)| {
            PolicySpec {
                breaker,
                limiter,
                lease,
                ..PolicySpec::default()
            }
            .validate()
            .ok()
        })
}

#[derive(Clone, Debug)]
enum Op {
    /// A request under one of a small pool of ids.
    Acquire {
        id: u8,
        permits: u32,
        max_wait: Millis,
        lease: Option<Millis>,
        room: bool,
    },
    /// Completes a live ticket (`pick` among them), or an unknown id.
    Complete {
        pick: usize,
        outcome: Outcome,
    },
    /// Renews a live ticket.
    Renew {
        pick: usize,
        lease: Option<Millis>,
    },
    /// Withdraws a waiter.
    Withdraw {
        pick: usize,
    },
    Advance,
    Isolate,
    Close,
    SetPolicy(Policy),
    Drain,
}

fn op() -> impl Strategy<Value = Op> {
    let outcome = prop::sample::select(vec![Outcome::Success, Outcome::Failure, Outcome::Ignored]);
    let lease = prop::option::weighted(0.3, 0u64..=400);
    prop_oneof![
        16 => (0u8..30, prop_oneof![1 => Just(0u32), 8 => 1u32..=3, 1 => 4u32..=7], prop_oneof![Just(0u64), 1u64..=150, 150u64..=3_000], lease.clone(), prop::bool::weighted(0.95))
            .prop_map(|(id, permits, max_wait, lease, room)| Op::Acquire { id, permits, max_wait, lease, room }),
        5 => (any::<usize>(), outcome).prop_map(|(pick, outcome)| Op::Complete { pick, outcome }),
        2 => (any::<usize>(), lease).prop_map(|(pick, lease)| Op::Renew { pick, lease }),
        2 => any::<usize>().prop_map(|pick| Op::Withdraw { pick }),
        2 => Just(Op::Advance),
        1 => Just(Op::Isolate),
        2 => Just(Op::Close),
        1 => policy().prop_map(Op::SetPolicy),
        2 => Just(Op::Drain),
    ]
}

/// Steps of time (often none, so that events share an instant) and operations.
fn steps() -> impl Strategy<Value = Vec<(Millis, Op)>> {
    prop::collection::vec(
        (
            prop_oneof![3 => Just(0u64), 3 => 1u64..=20, 1 => 21u64..=400],
            op(),
        ),
        1..100,
    )
}

/// Ids spread over both halves of the `u128`.
fn ticket_id(n: u8) -> TicketId {
    TicketId((u128::from(n % 5) << 100) | (u128::from(n % 3) << 64) | u128::from(n))
}

/// The id an operation names, chosen from `f` (the same in equal fuses).
fn target(f: &Fuse, op: &Op) -> TicketId {
    let s = f.state();
    let pick_from = |ids: Vec<TicketId>, pick: usize| {
        if ids.is_empty() {
            ticket_id(pick as u8)
        } else {
            ids[pick % ids.len()]
        }
    };
    match *op {
        Op::Acquire { id, .. } => ticket_id(id),
        Op::Complete { pick, .. } | Op::Renew { pick, .. } => {
            pick_from(s.tickets.iter().map(|t| t.id).collect(), pick)
        }
        Op::Withdraw { pick } => pick_from(s.waiters.iter().map(|w| w.id).collect(), pick),
        _ => TicketId(0),
    }
}

/// Applies `op` at `now` to `f` and says what came back.
fn apply(f: &mut Fuse, id: TicketId, op: &Op, now: Millis) -> String {
    match op {
        &Op::Acquire {
            permits,
            max_wait,
            lease,
            room,
            ..
        } => {
            let ask = Ask {
                caller: Default::default(),
                permits,
                max_wait,
                lease,
                room_for_ticket: room,
                room_for_waiter: room,
                retry: false,
            };
            format!("{:?}", f.acquire(&ask, id, now))
        }
        &Op::Complete { outcome, .. } => format!("{:?}", f.complete(id, outcome, now)),
        &Op::Renew { lease, .. } => format!("{:?}", f.renew(id, lease, now)),
        Op::Withdraw { .. } => format!("{:?}", f.withdraw(id, now)),
        Op::Advance => format!("{:?}", f.advance(now)),
        Op::Isolate => format!("{:?}", f.isolate(now)),
        Op::Close => format!("{:?}", f.close(now)),
        Op::SetPolicy(p) => format!("{:?}", f.set_policy(*p, now)),
        Op::Drain => format!("{:?}", f.drain_notices().collect::<Vec<_>>()),
    }
}

/// The state through JSON.
fn through_json(s: &FuseState) -> FuseState {
    let json = serde_json::to_string(s).expect("a state writes as JSON");
    serde_json::from_str(&json).expect("a state reads back from JSON")
}

/// Everything a caller can see of a fuse at `now`, besides its notices.
fn seen(f: &Fuse, now: Millis) -> String {
    format!(
        "{:?} {:?} {:?} {:?}",
        f.view(now),
        f.next_deadline(),
        f.is_at_rest(now),
        f.heap_parts()
    )
}

/// A fuse under `policy` after `steps`.
fn run(policy: Policy, steps: &[(Millis, Op)]) -> Fuse {
    let mut f = Fuse::new(policy, 0);
    let mut now = 0;
    for (dt, op) in steps {
        now += dt;
        let id = target(&f, op);
        apply(&mut f, id, op, now);
    }
    f
}

proptest! {
    /// At every step the state reads back as the same fuse, directly and
    /// through JSON, and its JSON is the same each time it is written.
    #[test]
    fn every_state_reads_back_as_the_same_fuse(policy in policy(), start in 0u64..5_000, steps in steps()) {
        let mut f = Fuse::new(policy, start);
        let mut now = start;
        for (dt, op) in &steps {
            now += dt;
            let id = target(&f, op);
            apply(&mut f, id, op, now);
            let s = f.state();
            prop_assert_eq!(s.version, STATE_VERSION);
            prop_assert!(s.tickets.windows(2).all(|w| w[0].id < w[1].id), "sorted by id");
            prop_assert_eq!(Fuse::from_state(s.clone()), Ok(f.clone()));
            let back = through_json(&s);
            prop_assert_eq!(&back, &s);
            prop_assert_eq!(serde_json::to_string(&back).unwrap(), serde_json::to_string(&s).unwrap());
            let restored = Fuse::from_state(back).expect("a state taken from a fuse is valid");
            prop_assert_eq!(&restored, &f);
            prop_assert_eq!(restored.state(), s);
        }
    }

    /// A fuse reloaded from its JSON state before every step (as a store that
    /// keeps only the state does), and a copy restored once part way, decide,
    /// read and notify as the original does.
    #[test]
    fn a_restored_fuse_decides_as_the_original(
        policy in policy(),
        steps in steps(),
        split in any::<Index>(),
    ) {
        let split = split.index(steps.len());
        let mut f = Fuse::new(policy, 0);
        let mut reloaded = f.clone();
        let mut copy = None;
        let mut now = 0;
        for (k, (dt, op)) in steps.iter().enumerate() {
            now += dt;
            if k == split {
                copy = Some(Fuse::from_state(through_json(&f.state())).expect("valid"));
            }
            reloaded = Fuse::from_state(through_json(&reloaded.state())).expect("valid");
            let id = target(&f, op);
            let expected = apply(&mut f, id, op, now);
            prop_assert_eq!(&apply(&mut reloaded, id, op, now), &expected, "{:?} at {}", op, now);
            prop_assert_eq!(seen(&reloaded, now), seen(&f, now));
            prop_assert_eq!(&reloaded, &f);
            if let Some(copy) = copy.as_mut() {
                prop_assert_eq!(&apply(copy, id, op, now), &expected, "{:?} at {}", op, now);
                prop_assert_eq!(seen(copy, now), seen(&f, now));
            }
        }
        let notices: Vec<_> = f.drain_notices().collect();
        prop_assert_eq!(reloaded.drain_notices().collect::<Vec<_>>(), notices.clone());
        let mut copy = copy.expect("the split is within the steps");
        prop_assert_eq!(copy.drain_notices().collect::<Vec<_>>(), notices);
    }
}

// ---------------------------------------------------------------------------
// Refused states

fn nz_policy(text: &str) -> Policy {
    toml::from_str::<PolicySpec>(text)
        .expect("a spec")
        .validate()
        .expect("a valid policy")
}

/// A key with a concurrency limiter, two live tickets and two waiters.
fn busy() -> Fuse {
    let policy = nz_policy(
        r#"
        breaker = { mode = "consecutive", failures = 3, break = "1s" }
        limiter = { kind = "concurrency", permits = 3, queue_limit = 4 }
        "#,
    );
    let mut f = Fuse::new(policy, 10);
    let ask = |permits, max_wait| Ask {
        permits,
        max_wait,
        ..Ask::default()
    };
    assert!(f
        .acquire(&ask(1, 0), TicketId(1), 10)
        .unwrap()
        .grant()
        .is_some());
    assert!(f
        .acquire(&ask(2, 0), TicketId(2), 11)
        .unwrap()
        .grant()
        .is_some());
    assert_eq!(
        f.acquire(&ask(2, 100), TicketId(3), 12),
        Ok(Decision::Queued)
    );
    assert_eq!(
        f.acquire(&ask(1, 100), TicketId(4), 13),
        Ok(Decision::Queued)
    );
    f
}

fn refused(edit: impl FnOnce(&mut FuseState)) -> StateError {
    let mut s = busy().state();
    edit(&mut s);
    Fuse::from_state(s).expect_err("a damaged state is refused")
}

#[test]
fn a_busy_key_reads_back_and_its_json_names_every_part() {
    let f = busy();
    let s = f.state();
    assert_eq!(s.tickets.len(), 2);
    assert_eq!(
        s.waiters.iter().map(|w| w.id).collect::<Vec<_>>(),
        [TicketId(3), TicketId(4)]
    );
    assert_eq!(s.limiter, Some(LimiterState::Concurrency { held: 3 }));
    assert_eq!(Fuse::from_state(s.clone()), Ok(f));
    let json = serde_json::to_value(&s).unwrap();
    assert_eq!(json["version"], STATE_VERSION);
    assert_eq!(json["tickets"][0]["id"], "00000000000000000000000000000001");
    assert_eq!(json["breaker"]["phase"], "CLOSED");
    assert_eq!(json["limiter"]["concurrency"]["held"], 3);
    assert_eq!(json["policy"]["limiter"]["kind"], "concurrency");
}

/// Tickets and waiters past the few kept in plain vectors are indexed;
/// restored, they are indexed again and settle in the same order.
#[test]
fn a_key_with_many_tickets_and_waiters_reads_back_and_decides_alike() {
    let policy = nz_policy(
        r#"
        limiter = { kind = "concurrency", permits = 12, queue_limit = 30, order = "newest_first" }
        lease = { default = "1s", max = "1m" }
        "#,
    );
    let mut f = Fuse::new(policy, 0);
    for n in 0..12u8 {
        let ask = Ask {
            lease: Some(500 + u64::from(n % 4) * 100),
            ..Ask::default()
        };
        assert!(f
            .acquire(&ask, ticket_id(n), u64::from(n))
            .unwrap()
            .grant()
            .is_some());
    }
    for n in 12..30u8 {
        let ask = Ask {
            max_wait: 300 + u64::from(n % 5) * 50,
            ..Ask::default()
        };
        assert_eq!(f.acquire(&ask, ticket_id(n), 20), Ok(Decision::Queued));
    }
    let s = f.state();
    assert_eq!((s.tickets.len(), s.waiters.len()), (12, 18));
    let mut restored = Fuse::from_state(through_json(&s)).unwrap();
    assert_eq!(restored, f);
    for (k, now) in [100, 330, 350, 400, 520, 650, 700, 2_000]
        .into_iter()
        .enumerate()
    {
        let op = match k % 3 {
            0 => Op::Complete {
                pick: k,
                outcome: Outcome::Success,
            },
            1 => Op::Withdraw { pick: k },
            _ => Op::Advance,
        };
        let id = target(&f, &op);
        assert_eq!(
            apply(&mut restored, id, &op, now),
            apply(&mut f, id, &op, now)
        );
        assert_eq!(seen(&restored, now), seen(&f, now));
        assert_eq!(
            restored.drain_notices().collect::<Vec<_>>(),
            f.drain_notices().collect::<Vec<_>>()
        );
        assert_eq!(Fuse::from_state(f.state()), Ok(f.clone()));
    }
    assert!(f.is_at_rest(2_000));
}

/// A changed sampling window aligns new buckets to another width, so a
/// later bucket may start before an earlier one.
#[test]
fn a_sampling_window_changed_in_flight_reads_back() {
    let ratio = |window: &str| {
        nz_policy(&format!(
            r#"breaker = {{ mode = "ratio", failure_ratio = 0.5, minimum_throughput = 5, sampling_window = "{window}", break = "1s" }}"#
        ))
    };
    let mut f = Fuse::new(ratio("20ms"), 0);
    f.acquire(&Ask::default(), TicketId(1), 2_210).unwrap();
    f.complete(TicketId(1), Outcome::Success, 2_210).unwrap();
    f.set_policy(ratio("60ms"), 2_210).unwrap();
    f.acquire(&Ask::default(), TicketId(2), 2_210).unwrap();
    f.complete(TicketId(2), Outcome::Failure, 2_210).unwrap();
    let s = f.state();
    let starts: Vec<Millis> = s.breaker.window.iter().map(|b| b.start).collect();
    assert_eq!(starts, [2_210, 2_208]);
    assert_eq!(Fuse::from_state(through_json(&s)), Ok(f));
}

#[test]
fn a_fresh_key_at_rest_reads_back_owning_nothing() {
    let f = Fuse::new(Policy::default(), 5);
    let restored = Fuse::from_state(through_json(&f.state())).unwrap();
    assert_eq!(restored.heap_parts(), HeapParts::default());
    assert_eq!(restored, f);
}

#[test]
fn an_unknown_version_is_refused() {
    assert_eq!(refused(|s| s.version = 7), StateError::UnknownVersion(7));
    assert_eq!(refused(|s| s.version = 0), StateError::UnknownVersion(0));
    assert_eq!(
        StateError::UnknownVersion(7).to_string(),
        "version: 7 is not a state version this build reads (it reads 1 to 6)"
    );
}

#[test]
fn an_adaptive_limiter_written_before_version_5_learns_its_baseline_again() {
    let policy = nz_policy(r#"limiter = { kind = "adaptive", min = 2, max = 50, initial = 8 }"#);
    let mut f = Fuse::new(policy, 0);
    for (i, at) in (0..12u64).map(|i| (i, i * 10)) {
        let t = ticket_id(i as u8 + 1);
        assert!(matches!(
            f.acquire(&Ask::default(), t, at),
            Ok(Decision::Granted(Some(_)))
        ));
        f.complete(t, Outcome::Success, at + 5).unwrap();
    }
    assert_eq!(
        f.view(200).adaptive_limit,
        8,
        "measured: in force at initial"
    );
    let mut old = serde_json::to_value(f.state()).unwrap();
    old["version"] = 4.into();
    let limiter = old["limiter"]["adaptive"].as_object_mut().unwrap();
    for (new, was) in [
        ("base", "short"),
        ("sum", "low"),
        ("count", "before"),
        ("since", "window"),
    ] {
        let v = limiter.remove(new).unwrap();
        limiter.insert(was.into(), v);
    }
    let back = Fuse::from_state(serde_json::from_value(old).unwrap()).unwrap();
    let Some(LimiterState::Adaptive {
        held,
        limit,
        base,
        sum,
        count,
        since,
    }) = back.state().limiter
    else {
        panic!("an adaptive limiter");
    };
    assert_eq!(
        (held, limit, base, sum, count, since),
        (0, 8_000_000, 0, 0, 0, 0)
    );
    // A slow call ends a round of the limiter read as it was (a baseline of
    // 5 ms: it shrinks), but is one of the ten first samples of the one
    // read back (the limit stays).
    let mut kept = f.clone();
    let mut back = back;
    for f in [&mut kept, &mut back] {
        let t = ticket_id(99);
        assert!(matches!(
            f.acquire(&Ask::default(), t, 300),
            Ok(Decision::Granted(Some(_)))
        ));
        f.complete(t, Outcome::Success, 500).unwrap();
    }
    assert_eq!(kept.view(500).adaptive_limit, 7, "a round against 5 ms");
    assert_eq!(back.view(500).adaptive_limit, 8, "a first sample");
}

#[test]
fn a_version_1_state_reads_back_and_its_tickets_settle_no_cost() {
    let mut json = serde_json::to_value(busy().state()).unwrap();
    json["version"] = 1.into();
    for t in json["tickets"].as_array_mut().unwrap() {
        let t = t.as_object_mut().unwrap();
        t.remove("granted_at");
        t.remove("settles");
    }
    let s: FuseState = serde_json::from_value(json).unwrap();
    let f = Fuse::from_state(s).expect("version 1 is read");
    assert!(f
        .state()
        .tickets
        .iter()
        .all(|t| !t.settles && t.granted_at == 0));
    assert_eq!(f.state().version, STATE_VERSION, "written as the newest");
}

#[test]
fn a_ticket_that_settles_needs_a_rate_limiter() {
    let e = refused(|s| s.tickets[0].settles = true);
    assert_eq!(e, StateError::SettlesWithoutRate(TicketId(1)));
}

#[test]
fn an_invalid_policy_is_refused_naming_its_field() {
    let e = refused(|s| s.policy.limiter.as_mut().unwrap().permits = Some(0));
    assert_eq!(e.to_string(), "policy.limiter.permits: must be at least 1");
}

#[test]
fn a_limiter_of_another_kind_or_a_missing_one_is_refused() {
    assert_eq!(
        refused(|s| s.limiter = Some(LimiterState::FixedWindow { index: 0, used: 0 })),
        StateError::LimiterKind {
            state: "fixed_window",
            policy: "concurrency"
        }
    );
    assert_eq!(
        refused(|s| s.limiter = None),
        StateError::LimiterKind {
            state: "none",
            policy: "concurrency"
        }
    );
}

#[test]
fn duplicate_or_unsorted_tickets_are_refused() {
    assert_eq!(
        refused(|s| s.tickets[1].id = s.tickets[0].id),
        StateError::TicketOrder(TicketId(1))
    );
    assert_eq!(
        refused(|s| s.tickets.reverse()),
        StateError::TicketOrder(TicketId(1))
    );
    assert_eq!(
        refused(|s| s.waiters[0].id = TicketId(2)),
        StateError::DuplicateWaiter(TicketId(2))
    );
    assert_eq!(
        refused(|s| s.waiters[1].id = TicketId(3)),
        StateError::DuplicateWaiter(TicketId(3))
    );
}

#[test]
fn permits_in_use_must_be_those_of_the_tickets() {
    assert_eq!(
        refused(|s| s.limiter = Some(LimiterState::Concurrency { held: 2 })),
        StateError::HeldPermits {
            held: 2,
            tickets: 3
        }
    );
    assert_eq!(
        refused(|s| s.tickets[0].permits = 5),
        StateError::HeldPermits {
            held: 3,
            tickets: 7
        }
    );
}

#[test]
fn a_bad_waiter_is_refused() {
    assert_eq!(
        refused(|s| s.waiters[0].permits = 0),
        StateError::WaiterWithoutPermits(TicketId(3))
    );
    assert_eq!(
        refused(|s| s.waiters[0].lease = Some(0)),
        StateError::WaiterZeroLease(TicketId(3))
    );
    assert_eq!(
        refused(|s| s.waiters[1].permits = 4),
        StateError::WaiterAboveLimit {
            id: TicketId(4),
            permits: 4,
            limit: 3
        }
    );
    assert_eq!(
        refused(|s| {
            s.breaker.phase = Phase::Isolated;
        }),
        StateError::WaitersNotAllowed {
            phase: Phase::Isolated,
            limiter: "concurrency"
        }
    );
}

#[test]
fn a_breaker_or_tickets_that_cannot_be_are_refused() {
    assert_eq!(
        refused(|s| s.breaker.deadline = 7),
        StateError::Deadline {
            phase: Phase::Closed,
            deadline: 7
        }
    );
    assert_eq!(
        refused(|s| s.tickets[0].epoch = s.breaker.epoch + 1),
        StateError::FutureEpoch {
            id: TicketId(1),
            epoch: 1,
            current: 0
        }
    );
    assert_eq!(
        refused(|s| {
            s.tickets[0].probe = true;
            s.tickets[1].probe = true;
        }),
        StateError::TwoProbes
    );
    assert_eq!(
        refused(|s| s.breaker.window = vec![WindowBucket {
            start: 5,
            successes: 0,
            failures: 0,
            slow: 0,
        }]),
        StateError::Window
    );
    assert_eq!(
        refused(|s| s.last_now = u64::MAX),
        StateError::OutOfRange {
            field: "last_now",
            value: u64::MAX,
            max: 1 << 53
        }
    );
    assert_eq!(
        refused(|s| s.counters.by_reason.open = u64::MAX),
        StateError::OutOfRange {
            field: "counters.by_reason",
            value: u64::MAX,
            max: 1 << 53
        }
    );
}

#[test]
fn rate_limiter_counts_later_than_the_last_time_are_refused() {
    let policy = nz_policy(
        r#"limiter = { kind = "sliding_window", permits = 3, window = "100ms", segments = 4 }"#,
    );
    let mut f = Fuse::new(policy, 60);
    f.acquire(&Ask::default(), TicketId(9), 60).unwrap();
    let mut s = f.state();
    assert_eq!(
        s.limiter,
        Some(LimiterState::SlidingWindow {
            taken: vec![(2, 1)]
        })
    );
    s.limiter = Some(LimiterState::SlidingWindow {
        taken: vec![(3, 1)],
    });
    assert_eq!(
        Fuse::from_state(s.clone()),
        Err(StateError::OutOfRange {
            field: "limiter.taken",
            value: 3,
            max: 2
        })
    );
    s.limiter = Some(LimiterState::SlidingWindow {
        taken: vec![(2, 1), (1, 1)],
    });
    assert_eq!(Fuse::from_state(s), Err(StateError::Segments));
}

#[test]
fn a_badly_written_state_is_refused_when_read() {
    let json = serde_json::to_value(busy().state()).unwrap();
    let read = |edit: &dyn Fn(&mut Value)| {
        let mut v = json.clone();
        edit(&mut v);
        serde_json::from_value::<FuseState>(v).map_err(|e| e.to_string())
    };
    assert!(read(&|_| {}).is_ok());
    let e = read(&|v| v["tickets"][0]["id"] = "xyz".into()).unwrap_err();
    assert!(
        e.contains("ticket id \"xyz\" is not 1 to 32 hex digits"),
        "{e}"
    );
    let e = read(&|v| v["tickets"][0]["id"] = "+1".into()).unwrap_err();
    assert!(e.contains("hex digits"), "{e}");
    let e = read(&|v| v["breaker"]["extra"] = 1.into()).unwrap_err();
    assert!(e.contains("unknown field `extra`"), "{e}");
    let e = read(&|v| v["limiter"]["concurrency"]["extra"] = 1.into()).unwrap_err();
    assert!(e.contains("unknown field `extra`"), "{e}");
    let e = read(&|v| v["waiters"][0]["permits"] = (-1).into()).unwrap_err();
    assert!(e.contains("invalid value"), "{e}");
}

// ---------------------------------------------------------------------------
// Damaged states never panic

#[derive(Clone, Debug)]
enum Damage {
    /// Replaces the value at one place (any node of the tree).
    Replace(Index, Value),
    /// Repeats an element of an array, or a field's value under another field.
    Repeat(Index),
    /// Removes an element of an array or a field of an object.
    Remove(Index),
}

fn json_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        (0u64..10).prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        Just(Value::from(1u64 << 53)),
        Just(Value::from(u32::MAX)),
        (-3i64..0).prop_map(Value::from),
        Just(Value::from(0.5)),
        any::<bool>().prop_map(Value::from),
        Just(Value::Null),
        "[0-9a-f]{1,33}".prop_map(Value::from),
        prop::sample::select(vec![
            "CLOSED",
            "OPEN",
            "HALF_OPEN",
            "ISOLATED",
            "concurrency",
            "token_bucket",
            "fixed_window",
            "sliding_window",
            "FAILURE",
            "1s",
            "0ms",
            "",
        ])
        .prop_map(Value::from),
        Just(Value::Array(vec![])),
        Just(serde_json::json!({})),
        Just(serde_json::json!([[0, 1]])),
        Just(serde_json::json!({"concurrency": {"held": 1}})),
        Just(serde_json::json!({"token_bucket": {"tokens": 9, "tick": 0}})),
    ]
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        6 => (any::<Index>(), json_value()).prop_map(|(at, v)| Damage::Replace(at, v)),
        2 => any::<Index>().prop_map(Damage::Repeat),
        2 => any::<Index>().prop_map(Damage::Remove),
    ]
}

/// Every node of the tree, as a JSON pointer.
fn pointers(v: &Value, at: String, all: &mut Vec<String>) {
    match v {
        Value::Array(items) => {
            for (k, item) in items.iter().enumerate() {
                pointers(item, format!("{at}/{k}"), all);
            }
        }
        Value::Object(fields) => {
            for (name, field) in fields {
                pointers(field, format!("{at}/{name}"), all);
            }
        }
        _ => {}
    }
    all.push(at);
}

fn harm(v: &mut Value, damage: &Damage) {
    let mut all = Vec::new();
    pointers(v, String::new(), &mut all);
    match damage {
        Damage::Replace(at, new) => {
            if let Some(node) = v.pointer_mut(&all[at.index(all.len())]) {
                *node = new.clone();
            }
        }
        Damage::Repeat(at) | Damage::Remove(at) => {
            let repeat = matches!(damage, Damage::Repeat(_));
            let containers: Vec<&String> = all
                .iter()
                .filter(|p| v.pointer(p).is_some_and(|n| n.is_array() || n.is_object()))
                .collect();
            if containers.is_empty() {
                return;
            }
            let path = containers[at.index(containers.len())].clone();
            match v.pointer_mut(&path) {
                Some(Value::Array(items)) if !items.is_empty() => {
                    let k = at.index(items.len());
                    if repeat {
                        let item = items[k].clone();
                        items.insert(k, item);
                    } else {
                        items.remove(k);
                    }
                }
                Some(Value::Object(fields)) if !fields.is_empty() => {
                    let names: Vec<String> = fields.keys().cloned().collect();
                    let name = &names[at.index(names.len())];
                    if repeat {
                        let other = &names[(at.index(names.len()) + 1) % names.len()];
                        let value = fields[name].clone();
                        fields.insert(other.clone(), value);
                    } else {
                        fields.remove(name);
                    }
                }
                _ => {}
            }
        }
    }
}

proptest! {
    /// Damaged JSON is refused when read or when checked, or is a valid
    /// state whose fuse reads back as itself and keeps working.
    #[test]
    fn a_damaged_state_is_refused_or_valid_and_never_panics(
        policy in policy(),
        steps in prop::collection::vec((0u64..=60, op()), 0..40),
        damages in prop::collection::vec(damage(), 1..4),
    ) {
        let f = run(policy, &steps);
        let mut json = serde_json::to_value(f.state()).unwrap();
        for d in &damages {
            harm(&mut json, d);
        }
        let Ok(state) = serde_json::from_value::<FuseState>(json) else {
            return Ok(());
        };
        let Ok(mut g) = Fuse::from_state(state) else {
            return Ok(());
        };
        prop_assert_eq!(Fuse::from_state(g.state()), Ok(g.clone()));
        let now = g.last_now();
        let _ = (g.view(now), g.next_deadline(), g.is_at_rest(now));
        for (k, (dt, op)) in steps.iter().enumerate().take(10) {
            let at = now + dt + k as u64;
            let id = target(&g, op);
            apply(&mut g, id, op, at);
            let _ = g.view(at);
        }
        // Steps from a time or count at the limit may go past it; within it
        // the state still reads back.
        match Fuse::from_state(g.state()) {
            Err(StateError::OutOfRange { .. }) => {}
            back => prop_assert_eq!(back, Ok(g.clone())),
        }
    }
}

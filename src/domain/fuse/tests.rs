//! Unit tests of the fuse: one key's breaker, permit book and tickets, with
//! the settlement of time (T2, L3, P6), statistics, renewals, withdrawals,
//! status checks, caps (K3), policy changes (Y4) and rest (K2).

use std::num::{NonZeroU32, NonZeroU64};

use super::*;
use crate::policy::{BreakerPolicy, HalfOpen, LeasePolicy, LimiterKind, LimiterPolicy, Trip};
use crate::ticket::PackedId;

fn nz32(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).expect("non-zero")
}

fn nz64(n: u64) -> NonZeroU64 {
    NonZeroU64::new(n).expect("non-zero")
}

fn consecutive(failures: u32, break_ms: u64) -> BreakerPolicy {
    BreakerPolicy {
        quorum: None,
        trip: Trip::Consecutive {
            failures: nz32(failures),
        },
        break_ms: nz64(break_ms),
        multiplier: 1.0,
        max_break: None,
        probe_lease: nz64(break_ms),
        half_open: HalfOpen::default(),
        slow: None,
    }
}

fn ratio(failure_ratio: f64, minimum_throughput: u32, sampling_window: Millis) -> BreakerPolicy {
    BreakerPolicy {
        quorum: None,
        trip: Trip::Ratio {
            failure_ratio,
            minimum_throughput: nz32(minimum_throughput),
            sampling_window,
        },
        break_ms: nz64(1_000),
        multiplier: 1.0,
        max_break: None,
        probe_lease: nz64(1_000),
        half_open: HalfOpen::default(),
        slow: None,
    }
}

fn limiter(kind: LimiterKind, queue_limit: u32, order: Order) -> LimiterPolicy {
    LimiterPolicy {
        kind,
        queue_limit,
        order,
    }
}

fn concurrency(permits: u32, queue_limit: u32, order: Order) -> LimiterPolicy {
    limiter(
        LimiterKind::Concurrency {
            permits: nz32(permits),
        },
        queue_limit,
        order,
    )
}

fn bucket(capacity: u32, refill: u32, period: Millis, queue_limit: u32) -> LimiterPolicy {
    limiter(
        LimiterKind::TokenBucket {
            capacity: nz32(capacity),
            refill: nz32(refill),
            period: nz64(period),
        },
        queue_limit,
        Order::OldestFirst,
    )
}

fn fixed(permits: u32, window: Millis, queue_limit: u32) -> LimiterPolicy {
    limiter(
        LimiterKind::FixedWindow {
            permits: nz32(permits),
            window: nz64(window),
        },
        queue_limit,
        Order::OldestFirst,
    )
}

fn policy(breaker: Option<BreakerPolicy>, limiter: Option<LimiterPolicy>) -> Policy {
    Policy {
        breaker,
        limiter,
        lease: LeasePolicy::default(),
        retry_budget: None,
        enforce: true,
    }
}

fn lease(default: Millis, max: Millis, expired_outcome: Outcome) -> LeasePolicy {
    LeasePolicy {
        default: nz64(default),
        max: nz64(max),
        expired_outcome,
    }
}

fn id(n: u128) -> TicketId {
    TicketId(n)
}

/// A request for `n` permits that may not wait.
fn take(n: u32) -> Ask {
    Ask {
        permits: n,
        ..Ask::default()
    }
}

/// A request for `n` permits that may wait `max_wait` ms.
fn wait(n: u32, max_wait: Millis) -> Ask {
    Ask {
        permits: n,
        max_wait,
        ..Ask::default()
    }
}

/// A request for one permit with its own lease.
fn leased(lease: Millis) -> Ask {
    Ask {
        lease: Some(lease),
        ..Ask::default()
    }
}

fn status() -> Ask {
    take(0)
}

fn granted(ticket: u128, lease_end: Millis) -> Decision {
    Decision::Granted(Some(Grant {
        ticket: id(ticket),
        lease_end,
    }))
}

fn probe(ticket: u128, lease_end: Millis) -> Decision {
    Decision::Probe(Grant {
        ticket: id(ticket),
        lease_end,
    })
}

fn blocked(reason: Reason, retry_after: Millis) -> Decision {
    Decision::Blocked {
        reason,
        retry_after,
    }
}

fn denied(reason: Reason, retry_after: Option<Millis>) -> Decision {
    Decision::Denied {
        reason,
        retry_after,
    }
}

fn answered(waiter: u128, decision: Decision) -> Notice {
    Notice::Answered {
        waiter: id(waiter),
        decision,
    }
}

/// The notices gathered since the last call.
fn notices(fuse: &mut Fuse) -> Vec<Notice> {
    fuse.drain_notices().collect()
}

/// Only the answers to waiters among the notices gathered since the last call.
fn answers(fuse: &mut Fuse) -> Vec<Notice> {
    fuse.drain_notices()
        .filter(|n| matches!(n, Notice::Answered { .. }))
        .collect()
}

fn reason_count(stats: Stats, reason: Reason) -> u64 {
    stats.by_reason[Reason::ALL.iter().position(|&r| r == reason).unwrap()]
}

/// Opens a consecutive breaker of `failures` at `at` by completing failures.
fn trip(fuse: &mut Fuse, failures: u32, first_id: u128, at: Millis) {
    for k in 0..u128::from(failures) {
        let d = fuse.acquire(&take(1), id(first_id + k), at).unwrap();
        assert!(d.grant().is_some(), "{d:?}");
        fuse.complete(id(first_id + k), Outcome::Failure, at)
            .unwrap();
    }
    assert_eq!(fuse.breaker().phase(), Phase::Open);
}

// ---------------------------------------------------------------------------
// Statistics

/// A scripted scenario touching every counter, with the exact totals.
#[test]
fn statistics_count_every_kind_of_answer_and_outcome() {
    let mut f = Fuse::new(
        policy(
            Some(consecutive(2, 1_000)),
            Some(concurrency(2, 1, Order::NewestFirst)),
        ),
        0,
    );
    // t=0: A takes both permits; B waits; C evicts B from the one-permit queue.
    assert_eq!(f.acquire(&take(2), id(1), 0), Ok(granted(1, 30_000)));
    assert_eq!(f.acquire(&wait(1, 100), id(2), 0), Ok(Decision::Queued));
    assert_eq!(f.acquire(&wait(1, 100), id(3), 0), Ok(Decision::Queued));
    assert_eq!(
        answers(&mut f),
        vec![answered(2, denied(Reason::Evicted, None))]
    );
    // Two permits can never fit a one-permit queue: queue_full, evicting nobody.
    assert_eq!(
        f.acquire(&wait(2, 100), id(4), 0),
        Ok(denied(Reason::QueueFull, None))
    );
    assert_eq!(f.waiters(), 1);
    assert_eq!(
        f.acquire(&take(1), id(5), 0),
        Ok(denied(Reason::NoPermits, None))
    );
    assert_eq!(
        f.acquire(&take(3), id(6), 0),
        Ok(denied(Reason::ExceedsLimit, None))
    );
    // A status check counts nothing.
    let before = f.stats();
    assert_eq!(
        f.acquire(&status(), id(99), 0),
        Ok(denied(Reason::NoPermits, None))
    );
    assert_eq!(f.stats(), before);
    // t=1: C is withdrawn; G waits and times out at t=6.
    assert_eq!(f.withdraw(id(3), 1), Ok(true));
    assert_eq!(f.acquire(&wait(1, 5), id(7), 1), Ok(Decision::Queued));
    f.advance(6).unwrap();
    assert_eq!(
        answers(&mut f),
        vec![answered(7, denied(Reason::Timeout, None))]
    );
    // t=10: A succeeds; H takes both permits, I waits, H fails and I is served.
    assert_eq!(
        f.complete(id(1), Outcome::Success, 10),
        Ok(Completed {
            stale: false,
            phase: Phase::Closed
        })
    );
    assert_eq!(f.acquire(&take(2), id(8), 10), Ok(granted(8, 30_010)));
    assert_eq!(f.acquire(&wait(1, 1_000), id(9), 10), Ok(Decision::Queued));
    f.complete(id(8), Outcome::Failure, 10).unwrap();
    assert_eq!(answers(&mut f), vec![answered(9, granted(9, 30_010))]);
    // J takes the last permit, K waits; J's failure trips the breaker and K
    // gets the breaker's answer at once (C4).
    assert_eq!(f.acquire(&take(1), id(10), 10), Ok(granted(10, 30_010)));
    assert_eq!(f.acquire(&wait(1, 1_000), id(11), 10), Ok(Decision::Queued));
    assert_eq!(
        f.complete(id(10), Outcome::Failure, 10),
        Ok(Completed {
            stale: false,
            phase: Phase::Open
        })
    );
    assert_eq!(
        answers(&mut f),
        vec![answered(11, blocked(Reason::Open, 1_000))]
    );
    assert_eq!(
        f.acquire(&take(1), id(12), 20),
        Ok(blocked(Reason::Open, 990))
    );
    // I, issued while closed, completes while open: stale.
    assert_eq!(
        f.complete(id(9), Outcome::Success, 30),
        Ok(Completed {
            stale: true,
            phase: Phase::Open
        })
    );
    // t=1010: a probe, a request blocked by it, the probe ignored, a second
    // probe that succeeds.
    assert_eq!(f.acquire(&take(1), id(13), 1_010), Ok(probe(13, 31_010)));
    assert_eq!(
        f.acquire(&take(1), id(14), 1_010),
        Ok(blocked(Reason::ProbeInFlight, 1_000))
    );
    f.complete(id(13), Outcome::Ignored, 1_010).unwrap();
    assert_eq!(f.acquire(&take(1), id(15), 1_011), Ok(probe(15, 31_011)));
    assert_eq!(
        f.complete(id(15), Outcome::Success, 1_011),
        Ok(Completed {
            stale: false,
            phase: Phase::Closed
        })
    );
    // Isolated: refused. Closed again, a ticket whose lease ends.
    f.isolate(1_012).unwrap();
    assert_eq!(f.acquire(&take(1), id(16), 1_012), Ok(Decision::Refused));
    f.close(1_013).unwrap();
    assert_eq!(
        f.acquire(&leased(100), id(17), 1_013),
        Ok(granted(17, 1_113))
    );
    f.advance(1_113).unwrap();
    assert_eq!(f.live_tickets(), 0);

    let mut by_reason = [0; Reason::COUNT];
    for (reason, n) in [
        (Reason::Open, 2),
        (Reason::ProbeInFlight, 1),
        (Reason::NoPermits, 1),
        (Reason::QueueFull, 1),
        (Reason::ExceedsLimit, 1),
        (Reason::Evicted, 1),
        (Reason::Timeout, 1),
    ] {
        by_reason[reason as usize] = n;
    }
    let expected = Stats {
        granted: 5,
        probes: 2,
        blocked: 3,
        refused: 1,
        denied: 5,
        by_reason,
        queued: 5,
        evicted: 1,
        timed_out: 1,
        withdrawn: 1,
        failed: 3,
        successes: 2,
        failures: 2,
        ignored: 2,
        stale: 1,
        expired: 1,
        retry_denied: 0,
        slow: 0,
        shadow: 0,
    };
    assert_eq!(f.stats(), expected);
    assert_eq!(f.view(1_113).stats, expected);
    assert_eq!(reason_count(f.stats(), Reason::Timeout), 1);
}

#[test]
fn a_stale_outcome_is_counted_as_stale_only() {
    let mut f = Fuse::new(policy(Some(consecutive(1, 1_000)), None), 0);
    f.acquire(&take(1), id(1), 0).unwrap();
    f.isolate(1).unwrap();
    assert_eq!(
        f.complete(id(1), Outcome::Failure, 2),
        Ok(Completed {
            stale: true,
            phase: Phase::Isolated
        })
    );
    let s = f.stats();
    assert_eq!((s.stale, s.failures, s.successes, s.ignored), (1, 0, 0, 0));
    assert_eq!(f.breaker().consecutive_failures(), 0);
}

// ---------------------------------------------------------------------------
// next_deadline

#[test]
fn a_fresh_key_has_no_deadline() {
    for limiter in [
        None,
        Some(concurrency(2, 2, Order::OldestFirst)),
        Some(bucket(2, 1, 100, 2)),
        Some(fixed(2, 1_000, 2)),
    ] {
        let mut f = Fuse::new(policy(Some(consecutive(1, 1_000)), limiter), 7);
        assert_eq!(f.next_deadline(), None);
        f.acquire(&status(), id(1), 8).unwrap();
        assert_eq!(f.next_deadline(), None);
    }
}

#[test]
fn the_next_deadline_is_the_earliest_lease_end() {
    let mut f = Fuse::new(policy(None, None), 0);
    assert_eq!(f.acquire(&leased(500), id(1), 100), Ok(granted(1, 600)));
    assert_eq!(f.next_deadline(), Some(600));
    assert_eq!(f.acquire(&leased(300), id(2), 200), Ok(granted(2, 500)));
    assert_eq!(f.next_deadline(), Some(500));
    f.complete(id(2), Outcome::Success, 250).unwrap();
    assert_eq!(f.next_deadline(), Some(600));
    f.advance(600).unwrap();
    assert_eq!(notices(&mut f), vec![Notice::Expired { ticket: id(1) }]);
    assert_eq!(f.next_deadline(), None);
}

#[test]
fn the_next_deadline_is_a_waiters_max_wait_under_concurrency() {
    let mut f = Fuse::new(policy(None, Some(concurrency(1, 2, Order::OldestFirst))), 0);
    assert_eq!(f.acquire(&take(1), id(1), 0), Ok(granted(1, 30_000)));
    assert_eq!(f.next_deadline(), Some(30_000));
    assert_eq!(f.acquire(&wait(1, 200), id(2), 0), Ok(Decision::Queued));
    assert_eq!(f.next_deadline(), Some(200));
    // Concurrency permits come back only with tickets: no refill deadline,
    // however long the waiter may wait.
    assert_eq!(f.acquire(&wait(1, 90_000), id(3), 0), Ok(Decision::Queued));
    assert_eq!(f.next_deadline(), Some(200));
    f.advance(200).unwrap();
    assert_eq!(
        answers(&mut f),
        vec![answered(2, denied(Reason::Timeout, None))]
    );
    assert_eq!(f.next_deadline(), Some(30_000));
}

#[test]
fn the_next_deadline_is_a_refill_that_can_serve_the_head_waiter() {
    let mut f = Fuse::new(policy(None, Some(bucket(2, 1, 100, 4))), 50);
    assert_eq!(f.acquire(&take(2), id(1), 50), Ok(granted(1, 30_050)));
    assert_eq!(f.acquire(&wait(1, 1_000), id(2), 50), Ok(Decision::Queued));
    // One token comes at t=100: it serves the head.
    assert_eq!(f.next_deadline(), Some(100));
    f.advance(100).unwrap();
    assert_eq!(answers(&mut f), vec![answered(2, granted(2, 30_100))]);
    // A head that needs two tokens waits for two ticks.
    assert_eq!(f.acquire(&wait(2, 1_000), id(3), 100), Ok(Decision::Queued));
    assert_eq!(f.next_deadline(), Some(300));
    f.advance(299).unwrap();
    assert!(answers(&mut f).is_empty());
    f.advance(300).unwrap();
    assert_eq!(answers(&mut f), vec![answered(3, granted(3, 30_300))]);
    assert_eq!(f.next_deadline(), Some(30_050));
}

#[test]
fn the_next_deadline_is_a_window_roll_that_can_serve_the_head_waiter() {
    let mut f = Fuse::new(policy(None, Some(fixed(1, 1_000, 1))), 0);
    assert_eq!(f.acquire(&take(1), id(1), 10), Ok(granted(1, 30_010)));
    assert_eq!(f.acquire(&wait(1, 5_000), id(2), 10), Ok(Decision::Queued));
    assert_eq!(f.next_deadline(), Some(1_000));
    f.advance(1_000).unwrap();
    assert_eq!(answers(&mut f), vec![answered(2, granted(2, 31_000))]);

    let sliding = limiter(
        LimiterKind::SlidingWindow {
            permits: nz32(2),
            window: nz64(1_000),
            segments: nz32(4),
        },
        1,
        Order::OldestFirst,
    );
    let mut f = Fuse::new(policy(None, Some(sliding)), 0);
    f.acquire(&take(1), id(1), 0).unwrap();
    f.acquire(&take(1), id(2), 300).unwrap();
    assert_eq!(f.acquire(&wait(1, 5_000), id(3), 400), Ok(Decision::Queued));
    // The segment [0, 250) leaves the window when segment 4 begins.
    assert_eq!(f.next_deadline(), Some(1_000));
}

#[test]
fn the_next_deadline_is_the_earliest_of_leases_waits_and_refills() {
    let mut f = Fuse::new(policy(None, Some(bucket(1, 1, 1_000, 2))), 0);
    assert_eq!(f.acquire(&leased(500), id(1), 0), Ok(granted(1, 500)));
    assert_eq!(f.acquire(&wait(1, 300), id(2), 0), Ok(Decision::Queued));
    // Lease 500, wait 300, refill 1000: the wait comes first.
    assert_eq!(f.next_deadline(), Some(300));
    f.advance(300).unwrap();
    assert_eq!(
        answers(&mut f),
        vec![answered(2, denied(Reason::Timeout, None))]
    );
    assert_eq!(f.acquire(&wait(1, 5_000), id(3), 300), Ok(Decision::Queued));
    // Lease 500, wait 5300, refill 1000: the lease comes first.
    assert_eq!(f.next_deadline(), Some(500));
    f.advance(500).unwrap();
    assert_eq!(notices(&mut f), vec![Notice::Expired { ticket: id(1) }]);
    // A spent token does not come back with its ticket: the refill is next.
    assert_eq!(f.next_deadline(), Some(1_000));
    f.advance(1_000).unwrap();
    assert_eq!(answers(&mut f), vec![answered(3, granted(3, 31_000))]);
    assert_eq!(f.next_deadline(), Some(31_000));
}

// ---------------------------------------------------------------------------
// T2: events at one instant

#[test]
fn a_lease_end_serves_a_waiter_whose_wait_ends_at_the_same_instant() {
    let mut f = Fuse::new(policy(None, Some(concurrency(1, 1, Order::OldestFirst))), 0);
    assert_eq!(f.acquire(&leased(100), id(1), 0), Ok(granted(1, 100)));
    assert_eq!(f.acquire(&wait(1, 100), id(2), 0), Ok(Decision::Queued));
    assert_eq!(f.next_deadline(), Some(100));
    f.advance(100).unwrap();
    let seen = notices(&mut f);
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(
        seen.contains(&Notice::Expired { ticket: id(1) }),
        "{seen:?}"
    );
    assert!(seen.contains(&answered(2, granted(2, 30_100))), "{seen:?}");
    assert_eq!(f.stats().timed_out, 0);
    assert_eq!(f.stats().expired, 1);
    assert_eq!(f.live_tickets(), 1);
}

#[test]
fn a_lease_end_at_the_instant_is_settled_before_a_request_at_that_instant() {
    let mut f = Fuse::new(policy(None, Some(concurrency(1, 1, Order::OldestFirst))), 0);
    f.acquire(&leased(100), id(1), 0).unwrap();
    f.acquire(&wait(1, 100), id(2), 0).unwrap();
    // No timer fired: the next request settles t=100 in T2 order first.
    assert_eq!(
        f.acquire(&take(1), id(3), 150),
        Ok(denied(Reason::NoPermits, None))
    );
    assert_eq!(answers(&mut f), vec![answered(2, granted(2, 30_100))]);
}

#[test]
fn a_refill_serves_a_waiter_whose_wait_ends_at_the_same_instant() {
    let mut f = Fuse::new(policy(None, Some(bucket(1, 1, 100, 1))), 0);
    f.acquire(&take(1), id(1), 0).unwrap();
    assert_eq!(f.acquire(&wait(1, 100), id(2), 0), Ok(Decision::Queued));
    f.advance(100).unwrap();
    assert_eq!(answers(&mut f), vec![answered(2, granted(2, 30_100))]);
    assert_eq!(f.stats().timed_out, 0);
}

#[test]
fn a_lease_that_expires_as_failure_trips_before_waits_end_at_that_instant() {
    let mut p = policy(
        Some(consecutive(1, 1_000)),
        Some(concurrency(2, 1, Order::OldestFirst)),
    );
    p.lease = lease(100, 1_000, Outcome::Failure);
    let mut f = Fuse::new(p, 0);
    assert_eq!(f.acquire(&take(2), id(1), 0), Ok(granted(1, 100)));
    assert_eq!(f.acquire(&wait(1, 100), id(2), 0), Ok(Decision::Queued));
    f.advance(100).unwrap();
    // The lease end comes first (as FAILURE: the breaker opens), so the
    // waiter gets the breaker's answer (C4), not a timeout.
    assert_eq!(
        answers(&mut f),
        vec![answered(2, blocked(Reason::Open, 1_000))]
    );
    assert_eq!(f.breaker().phase(), Phase::Open);
    assert_eq!(f.view(100).open_until, Some(1_100));
    let s = f.stats();
    assert_eq!(
        (s.expired, s.failures, s.timed_out, s.blocked),
        (1, 1, 0, 1)
    );
}

// ---------------------------------------------------------------------------
// Leases and renewals (L2, L4)

fn leasing() -> Fuse {
    let mut p = policy(None, None);
    p.lease = lease(1_000, 5_000, Outcome::Ignored);
    Fuse::new(p, 0)
}

#[test]
fn an_acquired_lease_is_capped_by_the_maximum_and_defaults_when_absent() {
    let mut f = leasing();
    assert_eq!(f.acquire(&take(1), id(1), 10), Ok(granted(1, 1_010)));
    assert_eq!(f.acquire(&leased(60_000), id(2), 10), Ok(granted(2, 5_010)));
    assert_eq!(f.acquire(&leased(1), id(3), 10), Ok(granted(3, 11)));
    let before = f.clone();
    assert_eq!(f.acquire(&leased(0), id(4), 10), Err(FuseError::ZeroLease));
    assert_eq!(f, before);
}

#[test]
fn renew_sets_the_lease_from_now_capped_by_the_maximum() {
    let mut f = leasing();
    f.acquire(&take(1), id(1), 0).unwrap();
    assert_eq!(f.renew(id(1), Some(60_000), 500), Ok(5_000));
    assert_eq!(f.ticket(id(1)).unwrap().lease_end, 5_500);
    assert_eq!(f.next_deadline(), Some(5_500));
    // A shorter lease shortens it: the lease is set, not extended.
    assert_eq!(f.renew(id(1), Some(100), 600), Ok(100));
    assert_eq!(f.ticket(id(1)).unwrap().lease_end, 700);
    f.advance(699).unwrap();
    assert_eq!(f.live_tickets(), 1);
    f.advance(700).unwrap();
    assert_eq!(f.live_tickets(), 0);
    assert_eq!(f.stats().expired, 1);
}

#[test]
fn renew_without_a_lease_gives_the_default() {
    let mut f = leasing();
    f.acquire(&leased(50), id(1), 0).unwrap();
    assert_eq!(f.renew(id(1), None, 40), Ok(1_000));
    assert_eq!(f.ticket(id(1)).unwrap().lease_end, 1_040);
    f.advance(1_039).unwrap();
    assert_eq!(f.live_tickets(), 1);
}

#[test]
fn renew_with_a_zero_lease_is_refused_and_changes_nothing() {
    let mut f = leasing();
    f.acquire(&take(1), id(1), 0).unwrap();
    f.advance(10).unwrap();
    let before = f.clone();
    assert_eq!(f.renew(id(1), Some(0), 10), Err(FuseError::ZeroLease));
    assert_eq!(f, before);
}

#[test]
fn renewing_or_completing_a_ticket_that_is_not_live_fails_and_changes_nothing() {
    let mut f = leasing();
    f.acquire(&leased(100), id(1), 0).unwrap();
    f.acquire(&take(1), id(2), 0).unwrap();
    f.complete(id(2), Outcome::Success, 10).unwrap();
    let before = f.clone();
    assert_eq!(f.renew(id(9), None, 10), Err(FuseError::UnknownTicket));
    assert_eq!(f.renew(id(2), None, 10), Err(FuseError::UnknownTicket));
    assert_eq!(
        f.complete(id(2), Outcome::Success, 10),
        Err(FuseError::UnknownTicket)
    );
    assert_eq!(f, before);
    // At its lease end (T1: equality reaches it) the ticket is not live.
    assert_eq!(f.renew(id(1), None, 100), Err(FuseError::UnknownTicket));
    assert_eq!(
        f.complete(id(1), Outcome::Failure, 100),
        Err(FuseError::UnknownTicket)
    );
    f.advance(100).unwrap();
    assert_eq!(f.stats().expired, 1);
    assert_eq!(f.stats().failures, 0);
}

#[test]
fn renew_extends_a_probe_ticket_but_not_the_probe_slot() {
    let mut breaker = consecutive(1, 1_000);
    breaker.probe_lease = nz64(200);
    let mut f = Fuse::new(policy(Some(breaker), None), 0);
    trip(&mut f, 1, 1, 0);
    assert_eq!(f.acquire(&take(1), id(10), 1_000), Ok(probe(10, 31_000)));
    assert_eq!(f.renew(id(10), Some(60_000), 1_100), Ok(60_000));
    assert_eq!(
        f.acquire(&take(1), id(11), 1_150),
        Ok(blocked(Reason::ProbeInFlight, 50))
    );
    // The slot ends at 1000 + probe_lease whatever the renewal said.
    assert_eq!(f.acquire(&take(1), id(12), 1_200), Ok(probe(12, 31_200)));
    assert_eq!(f.breaker().half_open_attempts(), 2);
    // The renewed first probe is superseded: stale.
    assert_eq!(
        f.complete(id(10), Outcome::Success, 1_300),
        Ok(Completed {
            stale: true,
            phase: Phase::HalfOpen
        })
    );
}

#[test]
fn a_probe_slot_ends_with_its_tickets_lease_even_if_renewed() {
    let mut f = Fuse::new(policy(Some(consecutive(1, 1_000)), None), 0);
    trip(&mut f, 1, 1, 0);
    // The ticket's lease (100) is shorter than probe_lease (1000).
    assert_eq!(f.acquire(&leased(100), id(10), 1_000), Ok(probe(10, 1_100)));
    assert_eq!(f.renew(id(10), Some(10_000), 1_050), Ok(10_000));
    assert_eq!(
        f.acquire(&take(1), id(11), 1_099),
        Ok(blocked(Reason::ProbeInFlight, 1))
    );
    assert_eq!(f.acquire(&take(1), id(12), 1_100), Ok(probe(12, 31_100)));
}

// ---------------------------------------------------------------------------
// Withdrawal (P6)

#[test]
fn a_withdrawn_waiter_frees_its_room_at_once_and_lets_the_next_be_served() {
    let mut f = Fuse::new(policy(None, Some(concurrency(2, 3, Order::OldestFirst))), 0);
    assert_eq!(f.acquire(&take(1), id(1), 0), Ok(granted(1, 30_000)));
    // B needs two permits with one free: it holds back C (P5).
    assert_eq!(f.acquire(&wait(2, 1_000), id(2), 0), Ok(Decision::Queued));
    assert_eq!(f.acquire(&wait(1, 1_000), id(3), 0), Ok(Decision::Queued));
    assert_eq!(
        f.acquire(&wait(1, 1_000), id(4), 0),
        Ok(denied(Reason::QueueFull, None))
    );
    assert!(answers(&mut f).is_empty());
    assert_eq!(f.withdraw(id(2), 5), Ok(true));
    // Withdrawn silently; C is served at once with the free permit.
    assert_eq!(answers(&mut f), vec![answered(3, granted(3, 30_005))]);
    let v = f.view(5);
    assert_eq!((v.waiters, v.queued, v.live_tickets, v.free), (0, 0, 2, 0));
    // The room is free: a new waiter fits.
    assert_eq!(f.acquire(&wait(1, 1_000), id(5), 5), Ok(Decision::Queued));
    assert_eq!(f.acquire(&wait(2, 1_000), id(6), 5), Ok(Decision::Queued));
    assert_eq!(f.view(5).queued, 3);
    assert_eq!(f.withdraw(id(6), 6), Ok(true));
    assert_eq!(f.view(6).queued, 1);
    // Withdrawing what no longer waits says so and counts nothing.
    assert_eq!(f.withdraw(id(2), 7), Ok(false));
    assert_eq!(f.withdraw(id(3), 7), Ok(false));
    assert_eq!(f.withdraw(id(42), 7), Ok(false));
    let s = f.stats();
    assert_eq!((s.withdrawn, s.denied, s.granted, s.queued), (2, 1, 2, 4));
}

#[test]
fn a_withdrawn_head_lets_a_token_bucket_serve_the_next_waiter() {
    let mut f = Fuse::new(policy(None, Some(bucket(3, 1, 100, 5))), 0);
    f.acquire(&take(2), id(1), 0).unwrap();
    assert_eq!(f.acquire(&wait(3, 1_000), id(2), 0), Ok(Decision::Queued));
    assert_eq!(f.acquire(&wait(1, 1_000), id(3), 0), Ok(Decision::Queued));
    assert_eq!(f.withdraw(id(2), 10), Ok(true));
    assert_eq!(answers(&mut f), vec![answered(3, granted(3, 30_010))]);
}

// ---------------------------------------------------------------------------
// Status checks (P2a) and P2b

#[test]
fn a_status_check_gives_no_ticket_and_changes_nothing() {
    for limiter in [None, Some(concurrency(2, 2, Order::OldestFirst))] {
        let mut f = Fuse::new(policy(Some(consecutive(1, 1_000)), limiter), 0);
        f.advance(5).unwrap();
        let before = f.clone();
        let ask = Ask {
            caller: Default::default(),
            permits: 0,
            max_wait: 1_000,
            lease: Some(100),
            room_for_ticket: false,
            room_for_waiter: false,
            retry: false,
        };
        assert_eq!(f.acquire(&ask, id(1), 5), Ok(Decision::Granted(None)));
        assert_eq!(f, before);
        assert_eq!(f.next_deadline(), None);
        assert!(f.is_at_rest(5));
    }
}

#[test]
fn a_status_check_with_no_permit_free_is_denied_with_the_hint_for_one() {
    let mut f = Fuse::new(policy(None, Some(concurrency(1, 1, Order::OldestFirst))), 0);
    f.acquire(&take(1), id(1), 0).unwrap();
    f.acquire(&wait(1, 500), id(2), 0).unwrap();
    let before = f.clone();
    assert_eq!(
        f.acquire(&status(), id(3), 0),
        Ok(denied(Reason::NoPermits, None))
    );
    assert_eq!(f, before);

    let mut f = Fuse::new(policy(None, Some(bucket(4, 2, 100, 0))), 0);
    f.acquire(&take(4), id(1), 30).unwrap();
    assert_eq!(
        f.acquire(&status(), id(2), 30),
        Ok(denied(Reason::NoPermits, Some(70)))
    );
    assert_eq!(
        f.acquire(&status(), id(2), 100),
        Ok(Decision::Granted(None))
    );

    let mut f = Fuse::new(policy(None, Some(fixed(1, 1_000, 0))), 0);
    f.acquire(&take(1), id(1), 250).unwrap();
    assert_eq!(
        f.acquire(&status(), id(2), 250),
        Ok(denied(Reason::NoPermits, Some(750)))
    );
}

#[test]
fn a_status_check_answers_what_the_breaker_answers_and_never_admits() {
    let mut f = Fuse::new(
        policy(
            Some(consecutive(1, 1_000)),
            Some(concurrency(1, 0, Order::OldestFirst)),
        ),
        0,
    );
    trip(&mut f, 1, 1, 0);
    let stats = f.stats();
    assert_eq!(
        f.acquire(&status(), id(2), 400),
        Ok(blocked(Reason::Open, 600))
    );
    // Past the deadline the breaker would admit a probe: the status check
    // answers that a permit is free, and the breaker stays OPEN (B6).
    f.advance(1_500).unwrap();
    let before = f.clone();
    assert_eq!(
        f.acquire(&status(), id(3), 1_500),
        Ok(Decision::Granted(None))
    );
    assert_eq!(f, before);
    let v = f.view(1_500);
    assert_eq!(
        (v.phase, v.half_open_attempts, v.open_until),
        (Phase::Open, 0, Some(1_000))
    );
    assert_eq!(f.stats(), stats);
    // The probe is still there for the next request.
    assert_eq!(f.acquire(&take(1), id(4), 1_500), Ok(probe(4, 31_500)));
    assert_eq!(
        f.acquire(&status(), id(5), 1_600),
        Ok(blocked(Reason::ProbeInFlight, 900))
    );
    f.isolate(1_700).unwrap();
    assert_eq!(f.acquire(&status(), id(6), 1_700), Ok(Decision::Refused));
    assert_eq!(f.stats().probes, 1);
    assert_eq!(f.stats().blocked, 0);
    assert_eq!(f.stats().refused, 0);
}

#[test]
fn without_a_limiter_the_permit_count_is_not_checked() {
    let mut f = Fuse::new(policy(Some(consecutive(1, 1_000)), None), 0);
    assert_eq!(f.acquire(&take(u32::MAX), id(1), 0), Ok(granted(1, 30_000)));
    assert_eq!(
        f.acquire(&wait(1_000_000, 50), id(2), 0),
        Ok(granted(2, 30_000))
    );
    assert_eq!(f.live_tickets(), 2);
    f.complete(id(1), Outcome::Failure, 1).unwrap();
    assert_eq!(
        f.acquire(&take(u32::MAX), id(3), 1_001),
        Ok(probe(3, 31_001))
    );
    assert_eq!(f.view(1_001).free, 0);
    assert_eq!(f.view(1_001).queued, 0);
}

// ---------------------------------------------------------------------------
// Denials (P2, P4) and eviction

#[test]
fn a_request_above_the_limit_is_denied_without_a_hint_and_changes_nothing() {
    for lp in [
        concurrency(3, 10, Order::OldestFirst),
        bucket(3, 1, 100, 10),
        fixed(3, 1_000, 10),
    ] {
        let mut f = Fuse::new(policy(None, Some(lp)), 0);
        assert_eq!(
            f.acquire(&wait(4, 1_000), id(1), 0),
            Ok(denied(Reason::ExceedsLimit, None))
        );
        assert_eq!(
            f.acquire(&take(4), id(2), 0),
            Ok(denied(Reason::ExceedsLimit, None))
        );
        let v = f.view(0);
        assert_eq!((v.free, v.waiters, v.live_tickets), (3, 0, 0));
        assert_eq!(f.acquire(&take(3), id(3), 0), Ok(granted(3, 30_000)));
        assert_eq!(reason_count(f.stats(), Reason::ExceedsLimit), 2);
    }
}

#[test]
fn a_probe_denied_by_the_limiter_is_undone_and_never_waits() {
    let mut f = Fuse::new(
        policy(
            Some(consecutive(1, 1_000)),
            Some(concurrency(2, 5, Order::OldestFirst)),
        ),
        0,
    );
    f.acquire(&take(1), id(1), 0).unwrap();
    trip(&mut f, 1, 2, 0);
    let epoch = f.view(1_000).epoch;
    // Above the limit (C2).
    assert_eq!(
        f.acquire(&take(3), id(10), 1_000),
        Ok(denied(Reason::ExceedsLimit, None))
    );
    // Two permits with one held: a probe never waits (C3).
    assert_eq!(
        f.acquire(&wait(2, 1_000), id(11), 1_000),
        Ok(denied(Reason::NoPermits, None))
    );
    let v = f.view(1_000);
    assert_eq!(
        (v.phase, v.half_open_attempts, v.waiters, v.epoch),
        (Phase::Open, 0, 0, epoch)
    );
    assert_eq!(f.acquire(&take(1), id(12), 1_000), Ok(probe(12, 31_000)));
}

#[test]
fn the_breaker_decides_first_and_leaves_the_limiter_untouched() {
    let mut f = Fuse::new(
        policy(
            Some(consecutive(1, 1_000)),
            Some(concurrency(2, 2, Order::OldestFirst)),
        ),
        0,
    );
    trip(&mut f, 1, 1, 0);
    // Above the limit, but the breaker answers first (C1).
    assert_eq!(
        f.acquire(&wait(5, 100), id(2), 10),
        Ok(blocked(Reason::Open, 990))
    );
    assert_eq!(
        f.acquire(&wait(1, 100), id(3), 10),
        Ok(blocked(Reason::Open, 990))
    );
    let v = f.view(10);
    assert_eq!((v.free, v.waiters, v.live_tickets), (2, 0, 0));
    f.isolate(20).unwrap();
    assert_eq!(f.acquire(&take(5), id(4), 20), Ok(Decision::Refused));
    assert_eq!(reason_count(f.stats(), Reason::ExceedsLimit), 0);
    assert_eq!(reason_count(f.stats(), Reason::Open), 2);
}

#[test]
fn queue_full_needs_a_queue_and_a_wait_otherwise_no_permits() {
    let mut f = Fuse::new(policy(None, Some(concurrency(1, 1, Order::OldestFirst))), 0);
    f.acquire(&take(1), id(1), 0).unwrap();
    assert_eq!(f.acquire(&wait(1, 100), id(2), 0), Ok(Decision::Queued));
    assert_eq!(
        f.acquire(&wait(1, 100), id(3), 0),
        Ok(denied(Reason::QueueFull, None))
    );
    assert_eq!(
        f.acquire(&take(1), id(4), 0),
        Ok(denied(Reason::NoPermits, None))
    );
    // No queue at all: a request that may wait is denied no_permits.
    let mut f = Fuse::new(policy(None, Some(concurrency(1, 0, Order::OldestFirst))), 0);
    f.acquire(&take(1), id(1), 0).unwrap();
    assert_eq!(
        f.acquire(&wait(1, 100), id(2), 0),
        Ok(denied(Reason::NoPermits, None))
    );
}

#[test]
fn rate_limiters_tell_when_enough_permits_will_be_there() {
    let mut f = Fuse::new(policy(None, Some(bucket(2, 1, 100, 1))), 0);
    f.acquire(&take(2), id(1), 50).unwrap();
    assert_eq!(f.acquire(&wait(1, 1_000), id(2), 50), Ok(Decision::Queued));
    assert_eq!(
        f.acquire(&wait(1, 1_000), id(3), 50),
        Ok(denied(Reason::QueueFull, Some(50)))
    );
    assert_eq!(
        f.acquire(&take(2), id(4), 60),
        Ok(denied(Reason::NoPermits, Some(140)))
    );
    let mut f = Fuse::new(policy(None, Some(fixed(2, 1_000, 0))), 0);
    f.acquire(&take(2), id(1), 250).unwrap();
    assert_eq!(
        f.acquire(&take(1), id(2), 250),
        Ok(denied(Reason::NoPermits, Some(750)))
    );
}

#[test]
fn free_permits_behind_waiters_give_no_hint() {
    let mut f = Fuse::new(policy(None, Some(bucket(3, 1, 100, 3))), 0);
    f.acquire(&take(2), id(1), 0).unwrap();
    assert_eq!(f.acquire(&wait(3, 1_000), id(2), 0), Ok(Decision::Queued));
    assert_eq!(f.view(0).free, 1);
    assert_eq!(
        f.acquire(&take(1), id(3), 0),
        Ok(denied(Reason::NoPermits, None))
    );
    assert_eq!(
        f.acquire(&wait(1, 1_000), id(4), 0),
        Ok(denied(Reason::QueueFull, None))
    );
}

#[test]
fn newest_first_evicts_the_oldest_waiter_and_serves_the_newest() {
    let mut f = Fuse::new(policy(None, Some(concurrency(2, 2, Order::NewestFirst))), 0);
    f.acquire(&take(2), id(1), 0).unwrap();
    assert_eq!(f.acquire(&wait(1, 1_000), id(2), 0), Ok(Decision::Queued));
    assert_eq!(f.acquire(&wait(1, 1_000), id(3), 0), Ok(Decision::Queued));
    assert!(answers(&mut f).is_empty());
    // 2 queued + 1 > 2: the oldest goes.
    assert_eq!(f.acquire(&wait(1, 1_000), id(4), 1), Ok(Decision::Queued));
    assert_eq!(
        answers(&mut f),
        vec![answered(2, denied(Reason::Evicted, None))]
    );
    assert_eq!((f.view(1).queued, f.waiters()), (2, 2));
    // Two permits come back: the newest waiter is served first.
    f.complete(id(1), Outcome::Success, 3).unwrap();
    assert_eq!(
        answers(&mut f),
        vec![
            answered(4, granted(4, 30_003)),
            answered(3, granted(3, 30_003))
        ]
    );
    let s = f.stats();
    assert_eq!((s.evicted, s.denied, s.granted, s.queued), (1, 1, 3, 3));
    assert_eq!(reason_count(s, Reason::Evicted), 1);
}

#[test]
fn newest_first_evicts_as_many_waiters_as_a_larger_request_needs() {
    let mut f = Fuse::new(policy(None, Some(concurrency(2, 2, Order::NewestFirst))), 0);
    f.acquire(&take(2), id(1), 0).unwrap();
    f.acquire(&wait(1, 1_000), id(2), 0).unwrap();
    f.acquire(&wait(1, 1_000), id(3), 0).unwrap();
    assert_eq!(f.acquire(&wait(2, 1_000), id(4), 1), Ok(Decision::Queued));
    assert_eq!(
        answers(&mut f),
        vec![
            answered(2, denied(Reason::Evicted, None)),
            answered(3, denied(Reason::Evicted, None)),
        ]
    );
    assert_eq!((f.view(1).queued, f.waiters()), (2, 1));
    f.complete(id(1), Outcome::Success, 2).unwrap();
    assert_eq!(answers(&mut f), vec![answered(4, granted(4, 30_002))]);
    assert_eq!(f.stats().evicted, 2);
}

#[test]
fn a_request_that_could_never_fit_the_queue_evicts_nobody() {
    let mut f = Fuse::new(policy(None, Some(concurrency(4, 2, Order::NewestFirst))), 0);
    f.acquire(&take(4), id(1), 0).unwrap();
    f.acquire(&wait(1, 1_000), id(2), 0).unwrap();
    f.acquire(&wait(1, 1_000), id(3), 0).unwrap();
    assert_eq!(
        f.acquire(&wait(3, 1_000), id(4), 0),
        Ok(denied(Reason::QueueFull, None))
    );
    assert!(answers(&mut f).is_empty());
    assert_eq!(f.waiters(), 2);
    // Two permits fit once both waiters go.
    assert_eq!(f.acquire(&wait(2, 1_000), id(5), 0), Ok(Decision::Queued));
    assert_eq!(
        answers(&mut f),
        vec![
            answered(2, denied(Reason::Evicted, None)),
            answered(3, denied(Reason::Evicted, None)),
        ]
    );
    assert_eq!(f.view(0).queued, 2);
}

// ---------------------------------------------------------------------------
// Caps (K3)

#[test]
fn no_room_for_a_ticket_is_an_error_that_changes_nothing() {
    let no_ticket = Ask {
        room_for_ticket: false,
        ..Ask::default()
    };
    let mut f = Fuse::new(
        policy(
            Some(consecutive(1, 1_000)),
            Some(concurrency(2, 2, Order::OldestFirst)),
        ),
        0,
    );
    f.advance(5).unwrap();
    let before = f.clone();
    assert_eq!(
        f.acquire(&no_ticket, id(1), 5),
        Err(FuseError::NoRoomForTicket)
    );
    assert_eq!(f, before);
    // Not even a probe is admitted.
    trip(&mut f, 1, 2, 10);
    f.advance(1_010).unwrap();
    let before = f.clone();
    assert_eq!(
        f.acquire(&no_ticket, id(3), 1_010),
        Err(FuseError::NoRoomForTicket)
    );
    assert_eq!(f, before);
    assert_eq!(f.view(1_010).phase, Phase::Open);
    // Without a limiter too.
    let mut f = Fuse::new(policy(None, None), 0);
    assert_eq!(
        f.acquire(&no_ticket, id(1), 0),
        Err(FuseError::NoRoomForTicket)
    );
    assert_eq!(f, Fuse::new(policy(None, None), 0));
}

#[test]
fn no_room_for_a_waiter_is_an_error_that_changes_nothing() {
    let no_waiter = |n| Ask {
        permits: n,
        max_wait: 1_000,
        room_for_waiter: false,
        ..Ask::default()
    };
    for order in [Order::OldestFirst, Order::NewestFirst] {
        let mut f = Fuse::new(policy(None, Some(concurrency(1, 1, order))), 0);
        // A request granted at once needs no room for a waiter.
        assert_eq!(f.acquire(&no_waiter(1), id(1), 0), Ok(granted(1, 30_000)));
        let before = f.clone();
        assert_eq!(
            f.acquire(&no_waiter(1), id(2), 0),
            Err(FuseError::NoRoomForWaiter)
        );
        assert_eq!(f, before);
    }
}

#[test]
fn no_room_for_a_waiter_evicts_nobody() {
    let mut f = Fuse::new(policy(None, Some(concurrency(1, 1, Order::NewestFirst))), 0);
    f.acquire(&take(1), id(1), 0).unwrap();
    f.acquire(&wait(1, 1_000), id(2), 0).unwrap();
    let before = f.clone();
    let ask = Ask {
        max_wait: 1_000,
        room_for_waiter: false,
        ..Ask::default()
    };
    assert_eq!(f.acquire(&ask, id(3), 0), Err(FuseError::NoRoomForWaiter));
    assert_eq!(f, before);
    assert!(notices(&mut f).is_empty());
}

#[test]
fn a_request_that_would_not_wait_anyway_is_answered_without_room_for_a_waiter() {
    let mut f = Fuse::new(policy(None, Some(concurrency(1, 1, Order::OldestFirst))), 0);
    f.acquire(&take(1), id(1), 0).unwrap();
    f.acquire(&wait(1, 1_000), id(2), 0).unwrap();
    let ask = Ask {
        max_wait: 1_000,
        room_for_waiter: false,
        ..Ask::default()
    };
    assert_eq!(
        f.acquire(&ask, id(3), 0),
        Ok(denied(Reason::QueueFull, None))
    );
}

#[test]
fn a_ticket_id_in_use_is_refused() {
    let mut f = Fuse::new(policy(None, Some(concurrency(1, 1, Order::OldestFirst))), 0);
    f.acquire(&take(1), id(1), 0).unwrap();
    f.acquire(&wait(1, 100), id(2), 0).unwrap();
    let before = f.clone();
    assert_eq!(f.acquire(&take(1), id(1), 0), Err(FuseError::TicketInUse));
    assert_eq!(
        f.acquire(&wait(1, 100), id(2), 0),
        Err(FuseError::TicketInUse)
    );
    assert_eq!(f, before);
}

// ---------------------------------------------------------------------------
// Policy changes (Y4)

#[test]
fn a_lower_limit_keeps_held_permits_until_their_tickets_return() {
    let mut f = Fuse::new(policy(None, Some(concurrency(3, 0, Order::OldestFirst))), 0);
    for k in 1..=3 {
        f.acquire(&take(1), id(k), 0).unwrap();
    }
    f.set_policy(
        policy(None, Some(concurrency(1, 0, Order::OldestFirst))),
        10,
    )
    .unwrap();
    let v = f.view(10);
    assert_eq!((v.free, v.limit, v.live_tickets), (0, 1, 3));
    assert_eq!(
        f.acquire(&take(1), id(4), 10),
        Ok(denied(Reason::NoPermits, None))
    );
    for (k, free) in [(1, 0), (2, 0), (3, 1)] {
        assert_eq!(
            f.complete(id(k), Outcome::Success, 20),
            Ok(Completed {
                stale: false,
                phase: Phase::Closed
            })
        );
        assert_eq!(f.view(20).free, free, "after ticket {k}");
    }
}

#[test]
fn a_higher_limit_serves_waiters() {
    let mut f = Fuse::new(policy(None, Some(concurrency(1, 2, Order::OldestFirst))), 0);
    f.acquire(&take(1), id(1), 0).unwrap();
    f.acquire(&wait(1, 1_000), id(2), 0).unwrap();
    f.set_policy(
        policy(None, Some(concurrency(2, 2, Order::OldestFirst))),
        10,
    )
    .unwrap();
    assert_eq!(answers(&mut f), vec![answered(2, granted(2, 30_010))]);
    assert_eq!(f.view(10).free, 0);
}

#[test]
fn a_changed_limiter_kind_keeps_live_tickets_without_returning_to_the_new_kind() {
    let mut f = Fuse::new(policy(None, Some(concurrency(2, 0, Order::OldestFirst))), 0);
    f.acquire(&take(2), id(1), 0).unwrap();
    f.set_policy(policy(None, Some(bucket(3, 1, 1_000, 0))), 10)
        .unwrap();
    assert_eq!(f.live_tickets(), 1);
    assert_eq!(f.view(10).free, 3);
    f.acquire(&take(1), id(2), 10).unwrap();
    assert_eq!(f.view(10).free, 2);
    // Back to concurrency: a fresh count; the old permits are not held in it
    // and must not come back to it twice (P7).
    f.set_policy(
        policy(None, Some(concurrency(2, 0, Order::OldestFirst))),
        15,
    )
    .unwrap();
    assert_eq!(f.view(15).free, 2);
    f.acquire(&take(1), id(3), 15).unwrap();
    for k in 1..=3 {
        assert_eq!(
            f.complete(id(k), Outcome::Success, 20),
            Ok(Completed {
                stale: false,
                phase: Phase::Closed
            })
        );
    }
    let v = f.view(20);
    assert_eq!((v.free, v.limit, v.live_tickets), (2, 2, 0));
    assert!(f.is_at_rest(20));
}

#[test]
fn a_changed_breaker_keeps_its_phase_deadline_run_and_epoch() {
    let mut f = Fuse::new(policy(Some(consecutive(2, 1_000)), None), 0);
    f.acquire(&take(1), id(1), 0).unwrap();
    trip(&mut f, 2, 2, 10);
    let _ = notices(&mut f);
    let before = f.view(10);
    assert_eq!(before.open_until, Some(1_010));
    f.set_policy(policy(Some(consecutive(5, 5_000)), None), 20)
        .unwrap();
    let after = f.view(20);
    assert_eq!(
        (
            after.phase,
            after.open_until,
            after.consecutive_failures,
            after.epoch
        ),
        (Phase::Open, Some(1_010), 2, before.epoch)
    );
    assert!(notices(&mut f)
        .iter()
        .all(|n| !matches!(n, Notice::Phase { .. })));
    // The old deadline holds; the new break applies to the next opening.
    assert_eq!(
        f.acquire(&take(1), id(10), 1_009),
        Ok(blocked(Reason::Open, 1))
    );
    assert_eq!(f.acquire(&take(1), id(11), 1_010), Ok(probe(11, 31_010)));
    f.complete(id(11), Outcome::Failure, 1_010).unwrap();
    assert_eq!(f.view(1_010).open_until, Some(6_010));
    // The ticket issued before the change is stale now, not lost.
    assert_eq!(
        f.complete(id(1), Outcome::Success, 1_020),
        Ok(Completed {
            stale: true,
            phase: Phase::Open
        })
    );
}

#[test]
fn new_thresholds_apply_from_the_next_outcome_and_old_tickets_still_count() {
    let mut f = Fuse::new(policy(Some(consecutive(3, 1_000)), None), 0);
    for k in 1..=3 {
        f.acquire(&take(1), id(k), 0).unwrap();
    }
    f.complete(id(1), Outcome::Failure, 1).unwrap();
    f.complete(id(2), Outcome::Failure, 2).unwrap();
    f.set_policy(policy(Some(consecutive(1, 500)), None), 3)
        .unwrap();
    // A run of 2 already reaches the new threshold, but only an outcome trips.
    assert_eq!(f.view(3).phase, Phase::Closed);
    assert_eq!(
        f.complete(id(3), Outcome::Failure, 4),
        Ok(Completed {
            stale: false,
            phase: Phase::Open
        })
    );
    assert_eq!(f.view(4).open_until, Some(504));
    assert_eq!(f.view(4).consecutive_failures, 3);
}

/// Y4 and K4: after a change of `period`, refills come at whole multiples
/// of the new period, counted from the change (not from ticks counted in
/// units of the old period).
#[test]
fn a_changed_refill_period_refills_on_the_new_periods_ticks() {
    let mut f = Fuse::new(policy(None, Some(bucket(10, 1, 100, 0))), 0);
    f.acquire(&take(10), id(1), 5_000).unwrap();
    f.set_policy(policy(None, Some(bucket(10, 1, 1_000, 0))), 5_001)
        .unwrap();
    assert_eq!(f.view(5_999).free, 0);
    assert_eq!(f.view(6_000).free, 1);
    assert_eq!(f.acquire(&take(1), id(2), 6_000), Ok(granted(2, 36_000)));

    let mut f = Fuse::new(policy(None, Some(bucket(10, 1, 1_000, 0))), 0);
    f.acquire(&take(10), id(1), 5_000).unwrap();
    f.set_policy(policy(None, Some(bucket(10, 1, 100, 0))), 5_001)
        .unwrap();
    assert_eq!(f.view(5_050).free, 0);
    assert_eq!(f.view(5_100).free, 1);
}

/// Permits taken in one fixed window count in that window only, whatever
/// the window's length became since (Y4, K4: a kept key behaves as a
/// forgotten one made again).
#[test]
fn a_changed_window_length_does_not_bring_back_old_counts() {
    let mut f = Fuse::new(policy(None, Some(fixed(2, 100, 0))), 0);
    f.acquire(&take(2), id(1), 5_050).unwrap();
    f.complete(id(1), Outcome::Success, 5_050).unwrap();
    f.set_policy(policy(None, Some(fixed(2, 1_000, 0))), 5_060)
        .unwrap();
    assert!(f.is_at_rest(6_000));
    assert_eq!(f.view(50_500).free, 2);
    assert_eq!(f.acquire(&take(2), id(2), 50_500), Ok(granted(2, 80_500)));
}

#[test]
fn a_changed_sliding_window_does_not_bring_back_old_counts() {
    let sliding = |window| {
        limiter(
            LimiterKind::SlidingWindow {
                permits: nz32(2),
                window: nz64(window),
                segments: nz32(10),
            },
            0,
            Order::OldestFirst,
        )
    };
    let mut f = Fuse::new(policy(None, Some(sliding(1_000))), 0);
    f.acquire(&take(2), id(1), 5_050).unwrap();
    f.complete(id(1), Outcome::Success, 5_050).unwrap();
    f.set_policy(policy(None, Some(sliding(10_000))), 5_060)
        .unwrap();
    assert!(f.is_at_rest(20_000));
    assert_eq!(f.view(50_500).free, 2);
}

/// An outcome counts for at most the (new) sampling window after it was
/// recorded (section 1), so a key whose outcomes are older than the window
/// is at rest (K2).
#[test]
fn a_changed_sampling_window_ages_old_outcomes_by_their_own_time() {
    let mut f = Fuse::new(policy(Some(ratio(0.5, 10, 1_000)), None), 0);
    f.acquire(&take(1), id(1), 5_000).unwrap();
    f.complete(id(1), Outcome::Failure, 5_000).unwrap();
    f.set_policy(policy(Some(ratio(0.5, 10, 10_000)), None), 5_001)
        .unwrap();
    assert_eq!(f.view(5_001).failure_ratio, Some(1.0));
    assert_eq!(f.view(20_000).failure_ratio, None);
    // The outcome left the window, but the failure run still counts (K2).
    assert!(!f.is_at_rest(20_000));
}

#[test]
fn a_set_policy_in_the_past_is_refused() {
    let mut f = Fuse::new(policy(None, None), 100);
    let before = f.clone();
    assert_eq!(
        f.set_policy(Policy::default(), 99),
        Err(FuseError::ClockWentBack { now: 99, last: 100 })
    );
    assert_eq!(f, before);
}

// ---------------------------------------------------------------------------
// Rest (K2)

#[test]
fn a_key_is_at_rest_only_when_it_is_as_a_fresh_one() {
    let mut f = Fuse::new(
        policy(
            Some(consecutive(2, 1_000)),
            Some(concurrency(1, 1, Order::OldestFirst)),
        ),
        0,
    );
    assert!(f.is_at_rest(0));
    f.acquire(&take(1), id(1), 0).unwrap();
    assert!(!f.is_at_rest(0), "a live ticket");
    f.acquire(&wait(1, 100), id(2), 0).unwrap();
    f.complete(id(1), Outcome::Success, 1).unwrap();
    assert!(!f.is_at_rest(1), "the served waiter's ticket");
    f.complete(id(2), Outcome::Failure, 2).unwrap();
    assert!(!f.is_at_rest(2), "a failure run");
    f.acquire(&take(1), id(3), 3).unwrap();
    f.complete(id(3), Outcome::Success, 3).unwrap();
    assert!(f.is_at_rest(3), "a success resets the run");
    trip(&mut f, 2, 4, 4);
    assert!(!f.is_at_rest(5_000), "open, even past the deadline");
    f.acquire(&take(1), id(6), 5_000).unwrap();
    f.complete(id(6), Outcome::Ignored, 5_000).unwrap();
    assert!(!f.is_at_rest(5_000), "half-open with a free slot");
    f.acquire(&take(1), id(7), 5_001).unwrap();
    f.complete(id(7), Outcome::Success, 5_001).unwrap();
    assert!(f.is_at_rest(5_001), "recovered");
    f.isolate(5_002).unwrap();
    assert!(!f.is_at_rest(5_002), "isolated");
    f.close(5_003).unwrap();
    assert!(f.is_at_rest(5_003), "closed again");
}

#[test]
fn a_waiter_keeps_a_key_from_rest() {
    let mut f = Fuse::new(policy(None, Some(concurrency(2, 2, Order::OldestFirst))), 0);
    f.acquire(&take(2), id(1), 0).unwrap();
    assert_eq!(f.acquire(&wait(1, 5_000), id(2), 0), Ok(Decision::Queued));
    assert!(!f.is_at_rest(0));
    f.complete(id(1), Outcome::Success, 2).unwrap();
    assert_eq!(answers(&mut f).len(), 1);
    f.complete(id(2), Outcome::Success, 3).unwrap();
    assert!(f.is_at_rest(3));
}

#[test]
fn a_waiter_that_cannot_fit_a_lowered_limit_is_denied_at_the_change() {
    let mut f = Fuse::new(policy(None, Some(concurrency(2, 2, Order::OldestFirst))), 0);
    f.acquire(&take(1), id(1), 0).unwrap();
    assert_eq!(f.acquire(&wait(2, 5_000), id(2), 0), Ok(Decision::Queued));
    f.set_policy(policy(None, Some(concurrency(1, 2, Order::OldestFirst))), 1)
        .unwrap();
    assert_eq!(
        answers(&mut f),
        vec![answered(2, denied(Reason::ExceedsLimit, None))]
    );
    assert_eq!((f.live_tickets(), f.waiters()), (1, 0));
    f.complete(id(1), Outcome::Success, 2).unwrap();
    assert!(f.is_at_rest(2));
}

#[test]
fn a_rate_limiter_rests_when_it_is_full_again() {
    let mut f = Fuse::new(policy(None, Some(bucket(2, 1, 100, 0))), 0);
    f.acquire(&take(1), id(1), 0).unwrap();
    f.complete(id(1), Outcome::Success, 0).unwrap();
    assert!(!f.is_at_rest(99));
    assert!(f.is_at_rest(100));
}

#[test]
fn a_ratio_breaker_rests_once_its_outcomes_leave_the_sampling_window() {
    let mut f = Fuse::new(policy(Some(ratio(0.5, 10, 1_000)), None), 0);
    f.acquire(&take(1), id(1), 0).unwrap();
    f.complete(id(1), Outcome::Success, 0).unwrap();
    assert_eq!(f.breaker().consecutive_failures(), 0);
    assert!(!f.is_at_rest(999), "a success inside the window");
    assert!(f.is_at_rest(1_000));
}

// ---------------------------------------------------------------------------
// Time going back

#[test]
fn every_operation_refuses_a_time_before_the_last_one_and_changes_nothing() {
    let mut f = Fuse::new(
        policy(
            Some(consecutive(2, 1_000)),
            Some(concurrency(1, 1, Order::OldestFirst)),
        ),
        0,
    );
    f.acquire(&take(1), id(1), 0).unwrap();
    f.acquire(&wait(1, 10_000), id(2), 0).unwrap();
    f.advance(100).unwrap();
    let went_back = FuseError::ClockWentBack { now: 99, last: 100 };
    let back = Err(went_back);
    let before = f.clone();
    assert_eq!(f.acquire(&take(1), id(3), 99).map(|_| ()), back);
    assert_eq!(f.acquire(&status(), id(3), 99).map(|_| ()), back);
    assert_eq!(f.complete(id(1), Outcome::Failure, 99).map(|_| ()), back);
    assert_eq!(f.renew(id(1), None, 99).map(|_| ()), back);
    assert_eq!(f.withdraw(id(2), 99).map(|_| ()), back);
    assert_eq!(f.isolate(99), back);
    assert_eq!(f.close(99), back);
    assert_eq!(f.advance(99), back);
    assert_eq!(f.set_policy(Policy::default(), 99), back);
    assert_eq!(f, before);
    assert_eq!(f.last_now(), 100);
    // The same instant is fine.
    assert_eq!(f.advance(100), Ok(()));
    assert_eq!(
        went_back.to_string(),
        "now (99 ms) is earlier than the last time seen (100 ms)"
    );
}

// ---------------------------------------------------------------------------
// Manual control and waiters (C4, B5)

#[test]
fn isolation_refuses_every_waiter_at_once() {
    let mut f = Fuse::new(
        policy(
            Some(consecutive(1, 1_000)),
            Some(concurrency(1, 2, Order::OldestFirst)),
        ),
        0,
    );
    f.acquire(&take(1), id(1), 0).unwrap();
    f.acquire(&wait(1, 500), id(2), 0).unwrap();
    f.acquire(&wait(1, 500), id(3), 0).unwrap();
    f.isolate(10).unwrap();
    assert_eq!(
        answers(&mut f),
        vec![
            answered(2, Decision::Refused),
            answered(3, Decision::Refused)
        ]
    );
    assert_eq!((f.waiters(), f.view(10).queued), (0, 0));
    assert_eq!(f.stats().refused, 2);
    assert_eq!(f.next_deadline(), Some(30_000));
}

// ---------------------------------------------------------------------------
// memory: a million keys at a few hundred bytes each

#[test]
fn a_fuse_stays_small() {
    // With its owner's name (16) and credential (8), a key's slot takes
    // 128 bytes: a size class of its own in the allocator.
    assert!(
        std::mem::size_of::<Fuse>() <= 104,
        "Fuse is {} bytes",
        std::mem::size_of::<Fuse>()
    );
    // A half-open period's slots and successes (H1-H4) and a quorum's
    // callers (Q1-Q2) share one box, made only while one is needed; the
    // window's buckets (and their slow outcomes, S1) another.
    assert_eq!(std::mem::size_of::<Breaker>(), 56);
    // U1 added when its permits were taken and whether they settle a cost;
    // Q1 its caller's fingerprint; T2 its grant number.
    assert_eq!(std::mem::size_of::<Ticket>(), 48);
    assert_eq!(std::mem::align_of::<Fuse>(), 8, "no u128 alignment");
    // A live ticket costs its id and its ticket, with no padding.
    assert_eq!(std::mem::size_of::<(PackedId, Ticket)>(), 64);
}

/// The measured case of the memory budget: one acquire and a FAILURE under
/// the default policy leaves a run of 1 and no live ticket, and the fuse
/// owns no heap allocation but the shared policy.
#[test]
fn a_key_used_once_owns_nothing_but_the_shared_policy() {
    let shared = std::sync::Arc::new(Policy::default());
    let mut f = Fuse::new(shared.clone(), 0);
    assert_eq!(f.heap_parts(), HeapParts::default());
    assert_eq!(f.acquire(&take(1), id(1), 5), Ok(granted(1, 30_005)));
    assert!(
        f.heap_parts().live,
        "a live ticket is kept in the live part"
    );
    f.complete(id(1), Outcome::Failure, 6).unwrap();
    assert_eq!(f.heap_parts(), HeapParts::default());
    assert_eq!(f.breaker().consecutive_failures(), 1);
    assert_eq!(f.phase(), Phase::Closed);
    let s = f.stats();
    assert_eq!((s.granted, s.failures, s.successes), (1, 1, 0));
    assert_eq!(
        s,
        Stats {
            granted: 1,
            failures: 1,
            ..Stats::default()
        }
    );
    assert!(
        std::ptr::eq(f.policy(), &*shared),
        "the policy is shared, not copied"
    );
}

#[test]
fn the_live_part_is_freed_once_the_last_ticket_or_waiter_leaves() {
    let mut f = Fuse::new(policy(Some(consecutive(100, 1_000)), None), 0);
    for n in 0..20 {
        f.acquire(&leased(1_000 + n as u64), id(n), 0).unwrap();
    }
    assert!(f.live.as_ref().unwrap().tickets.is_indexed());
    for n in 0..19 {
        f.complete(id(n), Outcome::Success, 1).unwrap();
        assert!(f.heap_parts().live);
    }
    assert!(!f.live.as_ref().unwrap().tickets.is_indexed(), "few again");
    f.complete(id(19), Outcome::Ignored, 1).unwrap();
    assert!(!f.heap_parts().live);
    // A lease that ends frees it too, once the notice is drained.
    f.acquire(&take(1), id(30), 2).unwrap();
    f.advance(30_002).unwrap();
    assert_eq!(notices(&mut f), vec![Notice::Expired { ticket: id(30) }]);
    assert!(!f.heap_parts().live);
    // Notices of a key at rest are kept only until drained.
    f.isolate(30_003).unwrap();
    assert!(f.heap_parts().live);
    assert_eq!(notices(&mut f).len(), 1);
    assert!(!f.heap_parts().live);

    // Waiters live there too; a key whose policy has a limiter keeps it.
    let mut f = Fuse::new(policy(None, Some(concurrency(1, 4, Order::OldestFirst))), 0);
    assert!(f.heap_parts().live, "the limiter is kept");
    f.acquire(&take(1), id(1), 0).unwrap();
    assert_eq!(f.acquire(&wait(1, 100), id(2), 0), Ok(Decision::Queued));
    f.withdraw(id(2), 1).unwrap();
    f.complete(id(1), Outcome::Success, 1).unwrap();
    let live = f.live.as_ref().unwrap();
    assert!(live.tickets.is_empty() && live.book.waiters() == 0);
    // Losing the limiter frees the live part.
    f.set_policy(policy(None, None), 2).unwrap();
    assert!(!f.heap_parts().live);
}

#[test]
fn many_tickets_expire_in_lease_order_as_few_do() {
    let mut f = Fuse::new(policy(None, None), 0);
    // Ids and lease ends in different orders, with ties settled in grant
    // order (T2).
    let leases: Vec<(u128, Millis)> = (0..30u128)
        .map(|n| (1_000 - n, 100 + (n as u64 * 7) % 5))
        .collect();
    for &(n, lease) in &leases {
        f.acquire(&leased(lease), id(n), 0).unwrap();
    }
    f.advance(200).unwrap();
    let expired: Vec<u128> = notices(&mut f)
        .into_iter()
        .map(|n| match n {
            Notice::Expired { ticket } => ticket.0,
            other => panic!("{other:?}"),
        })
        .collect();
    let mut expected = leases.clone();
    // A stable sort: the grants' order among equal lease ends.
    expected.sort_by_key(|&(_, lease)| lease);
    assert_eq!(
        expired,
        expected.iter().map(|&(n, _)| n).collect::<Vec<_>>()
    );
    assert!(!f.heap_parts().live);
    assert_eq!((f.stats().expired, f.stats().ignored), (30, 30));
}

#[test]
fn rarer_statistics_are_boxed_when_first_needed_and_derived_counts_add_up() {
    let mut f = Fuse::new(policy(Some(consecutive(1, 1_000)), None), 0);
    f.acquire(&take(1), id(1), 0).unwrap();
    f.complete(id(1), Outcome::Success, 0).unwrap();
    assert!(!f.heap_parts().more_stats);
    f.acquire(&take(1), id(2), 0).unwrap();
    f.complete(id(2), Outcome::Failure, 0).unwrap();
    assert!(!f.heap_parts().more_stats, "a trip is not a statistic");
    assert_eq!(
        f.acquire(&take(1), id(3), 10),
        Ok(blocked(Reason::Open, 990))
    );
    assert!(f.heap_parts().more_stats);
    let s = f.stats();
    assert_eq!((s.blocked, s.denied, s.failed), (1, 0, 0));
    assert_eq!(reason_count(s, Reason::Open), 1);

    // The inline counts carry into the box past 32 bits.
    let mut f = Fuse::new(Policy::default(), 0);
    f.counters.granted = u32::MAX;
    f.counters.failures = u32::MAX;
    f.acquire(&take(1), id(1), 0).unwrap();
    f.complete(id(1), Outcome::Failure, 0).unwrap();
    let s = f.stats();
    assert_eq!(s.granted, u64::from(u32::MAX) + 1);
    assert_eq!(s.failures, u64::from(u32::MAX) + 1);
    f.acquire(&take(1), id(2), 0).unwrap();
    assert_eq!(f.stats().granted, u64::from(u32::MAX) + 2);
}

#[test]
fn the_sampling_window_owns_memory_only_while_it_holds_outcomes() {
    let mut f = Fuse::new(policy(Some(ratio(0.5, 2, 1_000)), None), 0);
    f.acquire(&take(1), id(1), 0).unwrap();
    f.complete(id(1), Outcome::Failure, 0).unwrap();
    assert!(f.heap_parts().health_window);
    f.acquire(&take(1), id(2), 1).unwrap();
    f.complete(id(2), Outcome::Failure, 1).unwrap();
    assert_eq!(f.phase(), Phase::Open);
    assert!(!f.heap_parts().health_window, "a trip clears the window");
}

// ---------------------------------------------------------------------------
// cost reported after the call (U1)

fn sliding(permits: u32, window: Millis, segments: u32, queue_limit: u32) -> LimiterPolicy {
    limiter(
        LimiterKind::SlidingWindow {
            permits: nz32(permits),
            window: nz64(window),
            segments: nz32(segments),
        },
        queue_limit,
        Order::OldestFirst,
    )
}

#[test]
fn a_refund_serves_a_waiter_and_a_charge_goes_below_zero() {
    let mut f = Fuse::new(policy(None, Some(bucket(4, 1, 1000, 4))), 0);
    assert_eq!(f.acquire(&take(4), id(1), 0), Ok(granted(1, 30_000)));
    assert_eq!(f.acquire(&wait(2, 500), id(2), 10), Ok(Decision::Queued));
    f.complete_with_cost(id(1), Outcome::Success, Some(1), 20)
        .expect("live");
    let served: Vec<_> = f.drain_notices().collect();
    assert_eq!(
        served,
        [Notice::Answered {
            waiter: id(2),
            decision: granted(2, 30_020)
        }]
    );
    assert_eq!(f.view(20).free, 1);
    f.complete_with_cost(id(2), Outcome::Success, Some(100), 30)
        .expect("live");
    assert_eq!(f.view(30).free, 0);
    assert_eq!(
        f.state().limiter,
        Some(LimiterState::TokenBucket {
            tokens: -4,
            tick: 0
        })
    );
    // -4 + 5 ticks of 1: the next grant needs the refill to pay back first.
    assert_eq!(
        f.acquire(&take(1), id(3), 4_000),
        Ok(Decision::Denied {
            reason: Reason::NoPermits,
            retry_after: Some(1_000)
        })
    );
    assert_eq!(f.acquire(&take(1), id(3), 5_000), Ok(granted(3, 35_000)));
}

#[test]
fn cost_is_ignored_by_concurrency_and_after_a_change_of_shape() {
    let mut f = Fuse::new(policy(None, Some(concurrency(2, 0, Order::OldestFirst))), 0);
    f.acquire(&take(1), id(1), 0).expect("granted");
    f.complete_with_cost(id(1), Outcome::Success, Some(9), 1)
        .expect("live");
    assert_eq!(f.view(1).free, 2);
    let mut f = Fuse::new(policy(None, Some(fixed(4, 1000, 0))), 0);
    f.acquire(&take(1), id(1), 0).expect("granted");
    f.set_policy(policy(None, Some(fixed(4, 2000, 0))), 10)
        .expect("changed");
    f.complete_with_cost(id(1), Outcome::Success, Some(4), 20)
        .expect("live");
    assert_eq!(f.view(20).free, 4, "the window changed: no cost");
    f.acquire(&take(1), id(2), 30).expect("granted");
    f.set_policy(policy(None, Some(fixed(3, 2000, 0))), 40)
        .expect("changed");
    f.complete_with_cost(id(2), Outcome::Success, Some(3), 50)
        .expect("live");
    assert_eq!(f.view(50).free, 0, "only the permits changed: settled");
}

#[test]
fn a_stale_completion_applies_its_cost() {
    let mut f = Fuse::new(
        policy(Some(consecutive(1, 1000)), Some(fixed(4, 10_000, 0))),
        0,
    );
    f.acquire(&take(1), id(1), 0).expect("granted");
    f.acquire(&take(1), id(2), 0).expect("granted");
    f.complete(id(1), Outcome::Failure, 1).expect("live");
    assert_eq!(f.phase(), Phase::Open);
    let done = f
        .complete_with_cost(id(2), Outcome::Success, Some(3), 2)
        .expect("live");
    assert!(done.stale);
    assert_eq!(f.view(2).free, 0, "1 + 3 of 4 used");
}

mod cost_model {
    use proptest::prelude::*;

    use super::*;

    #[derive(Clone, Debug)]
    enum Op {
        /// Acquire `n` (waiting up to `wait`), after `dt` ms.
        Acquire { n: u32, wait: Millis, dt: Millis },
        /// Complete the `i`-th live ticket with `cost` (None = as taken), after `dt`.
        Complete {
            i: usize,
            cost: Option<u32>,
            dt: Millis,
        },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (1u32..5, prop_oneof![Just(0u64), 1u64..400], 0u64..300)
                .prop_map(|(n, wait, dt)| Op::Acquire { n, wait, dt }),
            (any::<usize>(), proptest::option::of(0u32..20), 0u64..300)
                .prop_map(|(i, cost, dt)| Op::Complete { i, cost, dt }),
        ]
    }

    fn limiter_policy() -> impl Strategy<Value = LimiterPolicy> {
        prop_oneof![
            (1u32..6, 1u32..3, 50u64..400).prop_map(|(c, r, p)| bucket(c, r.min(c), p, 6)),
            (1u32..6, 100u64..1000).prop_map(|(n, w)| fixed(n, w, 6)),
            (1u32..6, 1u32..5, 1u64..5).prop_map(|(n, s, k)| sliding(
                n,
                u64::from(s) * k * 100,
                s,
                6
            )),
        ]
    }

    /// What the limiter's bounds are, read from its state (U1).
    fn check_bounds(f: &Fuse, lp: &LimiterPolicy, now: Millis) -> Result<(), TestCaseError> {
        let limit = i64::from(lp.kind.limit());
        match f.state().limiter {
            Some(LimiterState::TokenBucket { tokens, .. }) => {
                prop_assert!((-limit..=limit).contains(&tokens), "tokens {tokens}");
            }
            Some(LimiterState::FixedWindow { used, .. }) => {
                prop_assert!(used <= 2 * limit as u64, "used {used}");
            }
            Some(LimiterState::SlidingWindow { taken }) => {
                for (_, count) in taken {
                    prop_assert!(count <= 2 * limit as u64, "count {count}");
                }
            }
            other => prop_assert!(false, "no rate limiter: {other:?}"),
        }
        let view = f.view(now);
        prop_assert!(view.free <= view.limit);
        Ok(())
    }

    proptest! {
        /// Tokens stay in [-capacity, capacity], counts in [0, 2 * permits],
        /// free in [0, limit]; and a cost equal to what was taken is exactly
        /// a completion without a cost.
        #[test]
        fn cost_keeps_the_bounds_and_cost_as_taken_changes_nothing(
            lp in limiter_policy(),
            ops in proptest::collection::vec(op(), 1..60),
        ) {
            let p = Arc::new(policy(None, Some(lp)));
            let mut costed = Fuse::new(p.clone(), 0);
            let mut plain = Fuse::new(p.clone(), 0);
            let mut as_taken = Fuse::new(p, 0);
            let mut live: Vec<(TicketId, u32)> = Vec::new();
            let mut now = 0;
            for (n, op) in ops.into_iter().enumerate() {
                let ticket = id(n as u128 + 1);
                match op {
                    Op::Acquire { n, wait: max_wait, dt } => {
                        now += dt;
                        let ask = Ask { permits: n, max_wait, ..Ask::default() };
                        let d = plain.acquire(&ask, ticket, now);
                        prop_assert_eq!(as_taken.acquire(&ask, ticket, now), d);
                        let _ = costed.acquire(&ask, ticket, now);
                        if let Ok(Decision::Granted(Some(_))) = d {
                            live.push((ticket, n));
                        }
                    }
                    Op::Complete { i, cost, dt } => {
                        now += dt;
                        if live.is_empty() {
                            continue;
                        }
                        let (ticket, taken) = live.remove(i % live.len());
                        let d = plain.complete(ticket, Outcome::Success, now);
                        prop_assert_eq!(
                            as_taken.complete_with_cost(ticket, Outcome::Success, Some(taken), now),
                            d
                        );
                        let _ = costed.complete_with_cost(ticket, Outcome::Success, cost, now);
                    }
                }
                for notice in plain.drain_notices() {
                    if let Notice::Answered { waiter, decision: Decision::Granted(Some(_)) } = notice {
                        let permits = as_taken.ticket(waiter).map_or(0, |t| t.permits);
                        live.push((waiter, permits));
                    }
                }
                let _ = costed.drain_notices();
                let _ = as_taken.drain_notices();
                prop_assert_eq!(&as_taken.state(), &plain.state());
                check_bounds(&costed, &lp, now)?;
            }
        }
    }
}

// ---------------------------------------------------------------------------
// bounded half-open (H1-H4)

/// Consecutive, 1 failure, a break of 1000 ms, `probes` slots and
/// `successes` to close.
fn bounded(probes: u32, successes: u32) -> BreakerPolicy {
    BreakerPolicy {
        half_open: HalfOpen {
            probes: nz32(probes),
            successes: nz32(successes),
        },
        ..consecutive(1, 1_000)
    }
}

/// A fuse under `breaker` that tripped at 0 (ticket 1's failure).
fn tripped(breaker: BreakerPolicy) -> Fuse {
    let mut f = Fuse::new(policy(Some(breaker), None), 0);
    assert!(matches!(
        f.acquire(&take(1), id(1), 0),
        Ok(Decision::Granted(Some(_)))
    ));
    f.complete(id(1), Outcome::Failure, 0).unwrap();
    assert_eq!(f.phase(), Phase::Open);
    f
}

fn is_probe(d: Decision) -> bool {
    matches!(d, Decision::Probe(_))
}

#[test]
fn several_slots_admit_that_many_probes_then_block_until_the_earliest_ends() {
    let mut f = tripped(bounded(3, 2));
    for (n, at) in [(10, 1_000), (11, 1_100), (12, 1_200)] {
        assert!(is_probe(f.acquire(&take(1), id(n), at).unwrap()), "{n}");
    }
    assert_eq!(
        f.acquire(&take(1), id(13), 1_300),
        Ok(Decision::Blocked {
            reason: Reason::ProbeInFlight,
            retry_after: 700
        })
    );
    let v = f.view(1_300);
    assert_eq!((v.probes_held, v.half_open_attempts), (3, 3));
    // All three share the period's epoch; none superseded another.
    let epochs: Vec<u64> = [10, 11, 12]
        .iter()
        .map(|&n| f.ticket(id(n)).unwrap().epoch)
        .collect();
    assert!(epochs.iter().all(|&e| e == f.breaker().epoch()));
    // The first slot ends at 2000 (probe_lease = break): a fourth probe fits.
    assert!(is_probe(f.acquire(&take(1), id(14), 2_000).unwrap()));
    assert_eq!(f.view(2_000).probes_held, 3);
}

#[test]
fn the_mth_success_closes_and_a_success_before_it_frees_its_slot() {
    let mut f = tripped(bounded(2, 2));
    assert!(is_probe(f.acquire(&take(1), id(10), 1_000).unwrap()));
    assert!(is_probe(f.acquire(&take(1), id(11), 1_000).unwrap()));
    let done = f.complete(id(10), Outcome::Success, 1_010).unwrap();
    assert_eq!((done.stale, done.phase), (false, Phase::HalfOpen));
    let v = f.view(1_010);
    assert_eq!((v.probes_held, v.half_open_successes), (1, 1));
    assert!(is_probe(f.acquire(&take(1), id(12), 1_020).unwrap()));
    let done = f.complete(id(12), Outcome::Success, 1_030).unwrap();
    assert_eq!((done.stale, done.phase), (false, Phase::Closed));
    assert_eq!(f.view(1_030).half_open_successes, 0);
    // The period ended: its last probe is of an old epoch.
    assert!(f.complete(id(11), Outcome::Failure, 1_040).unwrap().stale);
    assert_eq!(f.phase(), Phase::Closed);
    assert!(f.drain_notices().any(|n| matches!(
        n,
        Notice::Phase {
            to: Phase::Closed,
            cause: Cause::ProbeSucceeded,
            ..
        }
    )));
}

#[test]
fn a_probe_failure_opens_again_and_ignored_frees_a_slot_counting_nothing() {
    let mut f = tripped(bounded(2, 2));
    assert!(is_probe(f.acquire(&take(1), id(10), 1_000).unwrap()));
    assert!(is_probe(f.acquire(&take(1), id(11), 1_000).unwrap()));
    f.complete(id(10), Outcome::Ignored, 1_005).unwrap();
    let v = f.view(1_005);
    assert_eq!((v.probes_held, v.half_open_successes), (1, 0));
    f.drain_notices().for_each(drop);
    let done = f.complete(id(11), Outcome::Failure, 1_010).unwrap();
    assert_eq!((done.stale, done.phase), (false, Phase::Open));
    assert!(f.drain_notices().any(|n| matches!(
        n,
        Notice::Phase {
            to: Phase::Open,
            cause: Cause::ProbeFailed,
            ..
        }
    )));
    assert_eq!(f.view(1_010).open_until, Some(2_010));
}

#[test]
fn a_lapsed_slot_makes_its_probe_stale_with_several_slots_but_not_with_one() {
    // Several slots: a probe is current only while it holds its slot.
    let mut f = tripped(bounded(2, 1));
    assert!(is_probe(f.acquire(&take(1), id(10), 1_000).unwrap()));
    let done = f.complete(id(10), Outcome::Success, 2_000).unwrap();
    assert_eq!((done.stale, done.phase), (true, Phase::HalfOpen));
    // One slot (M = 2): the lapsed probe stays current until the next admission.
    let mut g = tripped(bounded(1, 2));
    assert!(is_probe(g.acquire(&take(1), id(10), 1_000).unwrap()));
    let done = g.complete(id(10), Outcome::Success, 2_500).unwrap();
    assert_eq!((done.stale, done.phase), (false, Phase::HalfOpen));
    assert_eq!(g.view(2_500).half_open_successes, 1);
    let e = g.breaker().epoch();
    assert!(is_probe(g.acquire(&take(1), id(11), 2_600).unwrap()));
    assert_ne!(g.breaker().epoch(), e, "each admission starts an epoch");
    let done = g.complete(id(11), Outcome::Success, 2_700).unwrap();
    assert_eq!(done.phase, Phase::Closed);
}

#[test]
fn a_lease_end_is_settled_before_a_slot_ending_at_the_same_instant() {
    let mut p = policy(Some(bounded(2, 1)), None);
    p.lease = lease(500, 10_000, Outcome::Failure);
    let mut f = Fuse::new(p, 0);
    assert!(matches!(
        f.acquire(&take(1), id(1), 0),
        Ok(Decision::Granted(Some(_)))
    ));
    f.complete(id(1), Outcome::Failure, 0).unwrap();
    assert!(is_probe(f.acquire(&take(1), id(10), 1_000).unwrap()));
    // Lease 500 < probe_lease 1000: the slot ends with the lease, at 1500.
    f.advance(1_500).unwrap();
    assert_eq!(
        f.phase(),
        Phase::Open,
        "the probe's lease end is its failure"
    );
    assert_eq!(f.view(1_500).open_until, Some(2_500));
}

#[test]
fn a_policy_change_mid_period_frees_no_slot_and_keeps_successes() {
    let mut f = tripped(bounded(3, 3));
    for n in [10, 11] {
        assert!(is_probe(f.acquire(&take(1), id(n), 1_000).unwrap()));
    }
    f.complete(id(10), Outcome::Success, 1_010).unwrap();
    f.set_policy(policy(Some(bounded(1, 2)), None), 1_020)
        .unwrap();
    let v = f.view(1_020);
    assert_eq!((v.probes_held, v.half_open_successes), (1, 1));
    // The new N (1) limits admissions from now on: the slot held blocks.
    assert!(matches!(
        f.acquire(&take(1), id(12), 1_030),
        Ok(Decision::Blocked {
            reason: Reason::ProbeInFlight,
            ..
        })
    ));
    // The new M (2) is compared at the next current probe success.
    let done = f.complete(id(11), Outcome::Success, 1_040).unwrap();
    assert_eq!((done.stale, done.phase), (false, Phase::Closed));
}

#[test]
fn one_slot_and_one_success_keep_no_probing_state() {
    let mut f = tripped(bounded(1, 1));
    assert!(is_probe(f.acquire(&take(1), id(10), 1_000).unwrap()));
    assert!(f.breaker().probing().is_none());
    assert_eq!(f.view(1_000).probes_held, 1);
    assert!(f.ticket(id(10)).unwrap().probe);
}

#[test]
fn a_half_open_period_of_several_slots_reads_back_from_its_state() {
    let mut f = tripped(bounded(3, 2));
    for n in [10, 11] {
        assert!(is_probe(f.acquire(&take(1), id(n), 1_000).unwrap()));
    }
    f.complete(id(10), Outcome::Success, 1_010).unwrap();
    let s = f.state();
    assert_eq!(s.breaker.probing.as_ref().map(|p| p.slots.len()), Some(1));
    let mut back = Fuse::from_state(s).unwrap();
    assert_eq!(back, f);
    let done = back.complete(id(11), Outcome::Success, 1_020).unwrap();
    assert_eq!(done.phase, Phase::Closed);
}

// ---------------------------------------------------------------------------
// retry budget (R1-R3)

/// A policy with a concurrency limiter of `permits` and a budget of
/// `ratio` (in millionths), `floor` a second, over `window` ms.
fn budgeted(permits: u32, ratio: u64, floor: u32, window: Millis) -> Policy {
    Policy {
        retry_budget: Some(crate::policy::RetryBudget {
            ratio_millionths: ratio,
            min_per_second: floor,
            window: nz64(window),
        }),
        ..policy(
            Some(consecutive(5, 1_000)),
            Some(concurrency(permits, 0, Order::OldestFirst)),
        )
    }
}

fn retry(n: u32) -> Ask {
    Ask {
        retry: true,
        ..take(n)
    }
}

const BUDGET_DENIED: Decision = Decision::Denied {
    reason: Reason::RetryBudget,
    retry_after: None,
};

#[test]
fn retries_pass_up_to_the_ratio_of_first_attempts_and_are_denied_beyond() {
    // 0.2 of first attempts, no floor, 10 s.
    let mut f = Fuse::new(budgeted(100, 200_000, 0, 10_000), 0);
    assert_eq!(f.acquire(&retry(1), id(1), 0), Ok(BUDGET_DENIED));
    for n in 0..10 {
        assert!(matches!(
            f.acquire(&take(1), id(10 + n), 1),
            Ok(Decision::Granted(Some(_)))
        ));
    }
    // floor(0.2 * 10) = 2 retries.
    for n in 0..2 {
        assert!(matches!(
            f.acquire(&retry(1), id(30 + n), 2),
            Ok(Decision::Granted(Some(_)))
        ));
    }
    assert_eq!(f.acquire(&retry(1), id(40), 3), Ok(BUDGET_DENIED));
    let s = f.stats();
    assert_eq!((s.retry_denied, s.denied), (2, 0), "not in denied");
    assert_eq!(s.by_reason[Reason::RetryBudget as usize], 2);
    // A status check says what a retry would get, and counts nothing.
    assert_eq!(f.acquire(&retry(0), id(0), 3), Ok(BUDGET_DENIED));
    assert_eq!(
        f.budget().totals(&f.policy().retry_budget.unwrap(), 3),
        (10, 2)
    );
}

#[test]
fn the_floor_allows_retries_without_first_attempts_and_counts_age_out() {
    // No ratio to speak of, 1 a second over 1 s: one retry per window.
    let mut f = Fuse::new(budgeted(100, 1, 1, 1_000), 0);
    assert!(matches!(
        f.acquire(&retry(1), id(1), 0),
        Ok(Decision::Granted(Some(_)))
    ));
    assert_eq!(f.acquire(&retry(1), id(2), 999), Ok(BUDGET_DENIED));
    // Segment 0 leaves when segment 10 begins (10 x 100 ms).
    assert!(matches!(
        f.acquire(&retry(1), id(3), 1_000),
        Ok(Decision::Granted(Some(_)))
    ));
}

#[test]
fn a_count_stands_whatever_the_limiter_answers_but_a_blocked_request_counts_nothing() {
    let mut f = Fuse::new(budgeted(1, 1_000_000, 0, 10_000), 0);
    assert!(matches!(
        f.acquire(&take(1), id(1), 0),
        Ok(Decision::Granted(Some(_)))
    ));
    // Denied by the limiter, still counted as a first attempt.
    assert!(matches!(
        f.acquire(&take(1), id(2), 0),
        Ok(Decision::Denied {
            reason: Reason::NoPermits,
            ..
        })
    ));
    let rb = f.policy().retry_budget.unwrap();
    assert_eq!(f.budget().totals(&rb, 0), (2, 0));
    // Tripped (5 failures): blocked requests count nothing.
    f.complete(id(1), Outcome::Failure, 1).unwrap();
    for n in 0..4 {
        assert!(matches!(
            f.acquire(&take(1), id(10 + n), 1),
            Ok(Decision::Granted(Some(_)))
        ));
        f.complete(id(10 + n), Outcome::Failure, 1).unwrap();
    }
    assert_eq!(f.phase(), Phase::Open);
    assert!(matches!(
        f.acquire(&retry(1), id(20), 2),
        Ok(Decision::Blocked { .. })
    ));
    assert_eq!(f.budget().totals(&rb, 2), (6, 0));
    // The probe counts nothing either, and is never denied by the budget.
    assert!(is_probe(f.acquire(&retry(1), id(21), 1_001).unwrap()));
    assert_eq!(f.budget().totals(&rb, 1_001), (6, 0));
}

#[test]
fn a_budget_keeps_its_counts_while_its_window_is_unchanged() {
    let mut f = Fuse::new(budgeted(100, 500_000, 0, 10_000), 0);
    for n in 0..4 {
        f.acquire(&take(1), id(n + 1), 0).unwrap();
    }
    let rb = f.policy().retry_budget.unwrap();
    f.set_policy(budgeted(100, 250_000, 0, 10_000), 1).unwrap();
    assert_eq!(f.budget().totals(&rb, 1), (4, 0), "same window: kept");
    f.set_policy(budgeted(100, 250_000, 0, 20_000), 2).unwrap();
    assert!(f.budget().is_empty(), "a new window starts empty");
    // K2: at rest once the window is empty and nothing is live.
    let mut g = Fuse::new(budgeted(100, 500_000, 0, 1_000), 0);
    g.acquire(&take(1), id(1), 0).unwrap();
    g.complete(id(1), Outcome::Success, 0).unwrap();
    assert!(!g.is_at_rest(999));
    assert!(g.is_at_rest(1_000));
    // The state keeps the counts.
    f.acquire(&take(1), id(50), 3).unwrap();
    let back = Fuse::from_state(f.state()).unwrap();
    assert_eq!(back, f);
}

mod budget_model {
    //! The retry budget against a model that keeps every count with its
    //! time: whatever the sequence of first attempts, retries and status
    //! checks, the fuse answers as the model does, so retries granted never
    //! exceed `max(floor(ratio x F), floor(min_per_second x window))` over
    //! the window (R2, R3).
    use super::*;
    use proptest::prelude::*;

    #[derive(Clone, Copy, Debug)]
    struct Step {
        after: Millis,
        retry: bool,
        permits: u32,
    }

    fn step() -> impl Strategy<Value = Step> {
        (
            0u64..400,
            any::<bool>(),
            prop::sample::select(vec![0u32, 1, 1, 1, 2]),
        )
            .prop_map(|(after, retry, permits)| Step {
                after,
                retry,
                permits,
            })
    }

    proptest! {
        #[test]
        fn the_budget_answers_as_a_model_of_timed_counts(
            ratio in prop::sample::select(vec![1u64, 100_000, 200_000, 333_333, 1_000_000]),
            floor in 0u32..3,
            window in prop::sample::select(vec![1_000u64, 1_230, 2_000]),
            steps in prop::collection::vec(step(), 1..120),
        ) {
            let rb = crate::policy::RetryBudget {
                ratio_millionths: ratio,
                min_per_second: floor,
                window: nz64(window),
            };
            let p = Policy {
                retry_budget: Some(rb),
                ..policy(None, None)
            };
            let mut f = Fuse::new(p, 0);
            let segment = window / 10;
            let mut counted: Vec<(Millis, bool)> = Vec::new();
            let mut now = 0;
            for (i, s) in steps.iter().enumerate() {
                now += s.after;
                let current = now / segment;
                let live = counted.iter().filter(|(t, _)| t / segment + 10 > current);
                let first = live.clone().filter(|(_, r)| !r).count() as u64;
                let retries = live.filter(|(_, r)| *r).count() as u64;
                let allowance = (u128::from(ratio) * u128::from(first) / 1_000_000)
                    .max(u128::from(floor) * u128::from(window) / 1_000) as u64;
                let denied = s.retry && retries + 1 > allowance;
                let ask = Ask { permits: s.permits, retry: s.retry, ..Ask::default() };
                let got = f.acquire(&ask, id(i as u128 + 1), now).unwrap();
                let want_granted = s.permits > 0;
                match got {
                    Decision::Denied { reason: Reason::RetryBudget, retry_after: None } => {
                        prop_assert!(denied, "step {i}: denied with {retries} retries, allowance {allowance}");
                    }
                    Decision::Granted(grant) => {
                        prop_assert!(!denied, "step {i}: granted past the budget");
                        prop_assert_eq!(grant.is_some(), want_granted);
                        if want_granted {
                            counted.push((now, s.retry));
                        }
                    }
                    other => prop_assert!(false, "step {i}: {other:?}"),
                }
            }
        }
    }
}

mod quorum_model {
    //! Quorum trips against a model that keeps every outcome with its time
    //! and caller: whatever the sequence of callers and outcomes, the
    //! breaker opens exactly when the model's trip condition holds and its
    //! failures come from at least `quorum` distinct callers (Q2), in
    //! consecutive and in ratio mode, and never below the quorum.
    use super::*;
    use crate::quorum::CallerId;
    use proptest::prelude::*;

    #[derive(Clone, Copy, Debug)]
    struct Step {
        after: Millis,
        caller: u8,
        failed: bool,
    }

    fn step() -> impl Strategy<Value = Step> {
        (0u64..300, 0u8..5, prop::bool::weighted(0.7)).prop_map(|(after, caller, failed)| Step {
            after,
            caller,
            failed,
        })
    }

    fn run(
        breaker: BreakerPolicy,
        steps: &[Step],
        trips: impl Fn(&[(Millis, u8, bool)], Millis) -> bool,
    ) -> Result<(), TestCaseError> {
        let mut f = Fuse::new(policy(Some(breaker), None), 0);
        let mut seen: Vec<(Millis, u8, bool)> = Vec::new();
        let mut now = 0;
        for (i, s) in steps.iter().enumerate() {
            now += s.after;
            let ask = Ask {
                caller: CallerId::of(&format!("pod-{}", s.caller)),
                ..Ask::default()
            };
            let t = id(i as u128 + 1);
            let granted = matches!(f.acquire(&ask, t, now).unwrap(), Decision::Granted(Some(_)));
            prop_assert!(granted, "step {}: a closed breaker grants", i);
            let outcome = if s.failed {
                Outcome::Failure
            } else {
                Outcome::Success
            };
            f.complete(t, outcome, now).unwrap();
            seen.push((now, s.caller, s.failed));
            let want = trips(&seen, now);
            prop_assert_eq!(f.phase() == Phase::Open, want, "step {}: {:?}", i, seen);
            if want {
                return Ok(());
            }
        }
        Ok(())
    }

    proptest! {
        #[test]
        fn consecutive_mode_trips_as_the_model_says(
            failures in 1u32..5,
            quorum in 2u32..5,
            steps in prop::collection::vec(step(), 1..60),
        ) {
            let b = BreakerPolicy { quorum: Some(nz32(quorum)), ..consecutive(failures, 1_000) };
            run(b, &steps, |seen, _| {
                let tail: Vec<_> = seen.iter().rev().take_while(|o| o.2).collect();
                let callers: std::collections::BTreeSet<u8> = tail.iter().map(|o| o.1).collect();
                tail.len() as u32 >= failures && callers.len() as u32 >= quorum
            })?;
        }

        #[test]
        fn ratio_mode_trips_as_the_model_says(
            millionths in prop::sample::select(vec![300_000u64, 500_000, 700_000, 1_000_000]),
            minimum in 1u32..6,
            quorum in 2u32..5,
            steps in prop::collection::vec(step(), 1..60),
        ) {
            let window = 1_000;
            let b = BreakerPolicy {
                quorum: Some(nz32(quorum)),
                ..ratio(millionths as f64 / 1_000_000.0, minimum, window)
            };
            run(b, &steps, |seen, now| {
                let inside: Vec<_> = seen.iter().filter(|o| o.0 / 100 * 100 + window > now).collect();
                let n = inside.len() as u64;
                let failed = inside.iter().filter(|o| o.2).count() as u64;
                let callers: std::collections::BTreeSet<u8> =
                    inside.iter().filter(|o| o.2).map(|o| o.1).collect();
                n >= u64::from(minimum)
                    && failed * 1_000_000 >= millionths * n
                    && callers.len() as u32 >= quorum
            })?;
        }
    }
}

// ---------------------------------------------------------------------------
// slow calls (S1-S3)

mod slow_model {
    use proptest::prelude::*;

    use super::*;
    use crate::policy::Slow;

    #[derive(Clone, Debug)]
    enum Op {
        /// A request for one permit.
        Acquire,
        /// Completes the `n`-th live ticket (mod their count) as a failure
        /// or a success.
        Complete(usize, bool),
    }

    fn op() -> impl Strategy<Value = (Millis, Op)> {
        (
            0u64..12,
            prop_oneof![
                3 => Just(Op::Acquire),
                2 => (any::<usize>(), proptest::bool::weighted(0.3))
                    .prop_map(|(n, failed)| Op::Complete(n, failed)),
            ],
        )
    }

    /// The model: outcomes recorded (failed, slow) and live tickets'
    /// grant times, all in the closed period (the window is longer than
    /// any trace). `trip_at` evaluates S3 at `t` with the live tickets
    /// whose age reached `d`: `Some(cause)` when (a) or (b) holds.
    struct Model {
        d: Millis,
        min: u64,
        ratio: u64,
        outcomes: Vec<(bool, bool)>,
        live: Vec<(u128, Millis)>,
    }

    impl Model {
        fn live_slow(&self, t: Millis) -> u64 {
            self.live.iter().filter(|(_, g)| g + self.d <= t).count() as u64
        }

        fn condition(&self, t: Millis) -> Option<Cause> {
            let n = self.outcomes.len() as u64;
            let f = self.outcomes.iter().filter(|o| o.0).count() as u64;
            if n >= self.min && f == n {
                return Some(Cause::Tripped);
            }
            let live = self.live_slow(t);
            let slow = self.outcomes.iter().filter(|o| o.1).count() as u64 + live;
            let all = n + live;
            (all >= self.min && all > 0 && slow * 1_000_000 >= self.ratio * all)
                .then_some(Cause::SlowCalls)
        }
    }

    proptest! {
        /// The breaker opens through S3 exactly when, and at the instant
        /// that, a model of outcomes and live ticket ages says: at an
        /// outcome, or at an instant tickets become live slow (before any
        /// request at that instant), with the cause the model gives.
        #[test]
        fn slow_calls_trip_exactly_when_a_model_says(
            d in 1u64..30,
            min in 1u32..6,
            ratio in prop::sample::select(vec![250_000u64, 500_000, 750_000, 1_000_000]),
            ops in proptest::collection::vec(op(), 1..60),
        ) {
            let mut breaker = ratio_breaker(min);
            breaker.slow = Some(Slow { duration: nz64(d), ratio_millionths: ratio });
            let mut p = policy(Some(breaker), None);
            p.lease = lease(1_000_000, 1_000_000, Outcome::Ignored);
            let mut f = Fuse::new(p, 0);
            let mut m = Model { d, min: u64::from(min), ratio, outcomes: Vec::new(), live: Vec::new() };
            let (mut now, mut next) = (0u64, 1u128);
            let mut tripped: Option<(Millis, Cause)> = None;
            for (after, op) in ops {
                let t = now + after;
                // Instants in (now, t]: tickets becoming live slow at s,
                // then the condition once.
                for s in (now + 1)..=t {
                    if tripped.is_none() && m.live.iter().any(|(_, g)| g + d == s) {
                        if let Some(cause) = m.condition(s) {
                            tripped = Some((s, cause));
                        }
                    }
                }
                now = t;
                if tripped.is_some() {
                    break;
                }
                match op {
                    Op::Acquire => {
                        let decision = f.acquire(&take(1), id(next), t).unwrap();
                        prop_assert!(matches!(decision, Decision::Granted(Some(_))), "{decision:?} at {t}");
                        m.live.push((next, t));
                        next += 1;
                    }
                    Op::Complete(_, _) if m.live.is_empty() => {}
                    Op::Complete(n, failed) => {
                        let (ticket, g) = m.live.remove(n % m.live.len());
                        let outcome = if failed { Outcome::Failure } else { Outcome::Success };
                        let done = f.complete(id(ticket), outcome, t).unwrap();
                        prop_assert!(!done.stale);
                        m.outcomes.push((failed, t - g >= d));
                        if let Some(cause) = m.condition(t) {
                            tripped = Some((t, cause));
                            break;
                        }
                    }
                }
                prop_assert_eq!(f.phase(), Phase::Closed, "at {}", t);
                prop_assert_eq!(u64::from(f.view(t).live_slow), m.live_slow(t), "live slow at {}", t);
            }
            // Settle what is due by the end of the trace.
            f.advance(now).unwrap();
            let opened = f.drain_notices().find_map(|n| match n {
                Notice::Phase { to: Phase::Open, at, cause, .. } => Some((at, cause)),
                _ => None,
            });
            prop_assert_eq!(opened, tripped);
        }
    }

    fn ratio_breaker(min: u32) -> BreakerPolicy {
        ratio(1.0, min, 10_000_000)
    }
}

/// S3: the slow-call condition is evaluated at outcomes and at the
/// instants when tickets become live slow, and at no other settled
/// instant: once the window's success has aged out the share would hold,
/// but a lease end recording nothing (IGNORED) does not evaluate it; the
/// next instant a ticket becomes live slow does.
#[test]
fn a_lease_end_that_records_nothing_does_not_evaluate_slow_calls() {
    let mut breaker = ratio(0.99, 2, 1_000);
    breaker.slow = Some(crate::policy::Slow {
        duration: nz64(100),
        ratio_millionths: 700_000,
    });
    let mut p = policy(Some(breaker), None);
    p.lease = lease(5_000, 5_000, Outcome::Ignored);
    let mut f = Fuse::new(p, 0);
    f.acquire(&take(1), id(1), 0).unwrap();
    f.complete(id(1), Outcome::Success, 10).unwrap();
    f.acquire(&take(1), id(2), 500).unwrap();
    f.acquire(&take(1), id(3), 500).unwrap();
    // Two live slow and one success: 2 / 3 < 0.7.
    f.advance(600).unwrap();
    assert_eq!(f.view(600).live_slow, 2);
    assert_eq!(f.view(600).phase, Phase::Closed);
    // A lease of 50 ms ends before the ticket would become slow.
    f.acquire(&leased(50), id(4), 1_400).unwrap();
    f.advance(1_450).unwrap();
    assert!(f.ticket(id(4)).is_none(), "its lease ended");
    assert_eq!(f.view(1_450).phase, Phase::Closed, "no evaluation at 1450");
    // The success aged out: at the next live-slow instant, 3 / 3 trips.
    f.acquire(&take(1), id(5), 1_460).unwrap();
    f.advance(1_560).unwrap();
    assert_eq!(f.view(1_560).phase, Phase::Open);
}
mod shadow;

mod adaptive_model {
    //! The adaptive limiter (section 10, CX20-CX27) under any sequence of
    //! grants, completions of every outcome, lease ends and policy changes:
    //! the limit in force stays within the policy's `[min, max]`, a grant
    //! never leaves more permits held than the limit at that instant (so
    //! never more than `max`), `free = max(0, limit - held)`, and the whole
    //! state reads back bit for bit (what `--data-dir` and the module keep).
    use super::*;
    use proptest::prelude::*;

    #[derive(Clone, Copy, Debug)]
    enum Op {
        Acquire { permits: u32, lease: Millis },
        Complete { pick: usize, outcome: Outcome },
        Limits { min: u32, width: u32 },
    }

    fn op() -> impl Strategy<Value = Op> {
        let outcome = prop::sample::select(vec![
            Outcome::Success,
            Outcome::Success,
            Outcome::Failure,
            Outcome::Ignored,
        ]);
        prop_oneof![
            6 => (1u32..4, 1u64..400).prop_map(|(permits, lease)| Op::Acquire { permits, lease }),
            6 => (any::<usize>(), outcome).prop_map(|(pick, outcome)| Op::Complete { pick, outcome }),
            1 => (1u32..8, 0u32..12).prop_map(|(min, width)| Op::Limits { min, width }),
        ]
    }

    fn adaptive(min: u32, max: u32, initial: u32, expired: Outcome) -> Policy {
        Policy {
            lease: lease(100, 1_000, expired),
            ..policy(
                None,
                Some(LimiterPolicy {
                    kind: LimiterKind::Adaptive {
                        min: nz32(min),
                        max: nz32(max),
                        initial: nz32(initial),
                    },
                    queue_limit: 0,
                    order: Order::OldestFirst,
                }),
            )
        }
    }

    proptest! {
        #[test]
        fn the_limit_stays_in_bounds_and_grants_never_pass_it(
            min in 1u32..6,
            width in 0u32..20,
            start in 0u32..20,
            expired in prop::sample::select(vec![Outcome::Ignored, Outcome::Failure]),
            steps in prop::collection::vec((0u64..300, op()), 1..150),
        ) {
            let (mut lo, mut hi) = (min, min + width);
            let initial = lo + start.min(width);
            let mut f = Fuse::new(adaptive(lo, hi, initial, expired), 0);
            let mut issued: Vec<TicketId> = Vec::new();
            let mut now = 0;
            for (i, (after, op)) in steps.into_iter().enumerate() {
                now += after;
                match op {
                    Op::Acquire { permits, lease } => {
                        let ask = Ask { permits, lease: Some(lease), ..Ask::default() };
                        let t = id(i as u128 + 1);
                        f.advance(now).unwrap();
                        let before = f.view(now).adaptive_limit;
                        match f.acquire(&ask, t, now).unwrap() {
                            Decision::Granted(Some(_)) => {
                                issued.push(t);
                                let held: u64 = issued
                                    .iter()
                                    .filter_map(|&t| f.ticket(t))
                                    .filter(|t| t.holds)
                                    .map(|t| u64::from(t.permits))
                                    .sum();
                                let limit = f.view(now).adaptive_limit;
                                prop_assert!(held <= u64::from(limit), "step {i}: {held} held, limit {limit}");
                                prop_assert!(held <= u64::from(hi));
                            }
                            Decision::Denied { reason, retry_after } => {
                                prop_assert_eq!(retry_after, None, "step {}: a hint", i);
                                prop_assert!(matches!(reason, Reason::NoPermits | Reason::ExceedsLimit));
                                prop_assert_eq!(f.view(now).adaptive_limit, before, "a denial learns nothing");
                            }
                            other => prop_assert!(false, "step {i}: {other:?}"),
                        }
                    }
                    Op::Complete { pick, outcome } => {
                        f.advance(now).unwrap();
                        issued.retain(|&t| f.ticket(t).is_some());
                        if !issued.is_empty() {
                            let t = issued.remove(pick % issued.len());
                            f.complete(t, outcome, now).unwrap();
                        }
                    }
                    Op::Limits { min, width } => {
                        (lo, hi) = (min, min + width);
                        f.set_policy(adaptive(lo, hi, lo, expired), now).unwrap();
                    }
                }
                f.advance(now).unwrap();
                let v = f.view(now);
                prop_assert!((lo..=hi).contains(&v.adaptive_limit), "step {i}: {} outside [{lo}, {hi}]", v.adaptive_limit);
                prop_assert_eq!(v.limit, hi, "P2's limit is max");
                let held: u64 = issued
                    .iter()
                    .filter_map(|&t| f.ticket(t))
                    .filter(|t| t.holds)
                    .map(|t| u64::from(t.permits))
                    .sum();
                prop_assert_eq!(u64::from(v.free), u64::from(v.adaptive_limit).saturating_sub(held));
                let back = Fuse::from_state(f.state()).unwrap();
                prop_assert_eq!(&back, &f, "step {}: the state reads back", i);
            }
        }
    }

    #[test]
    fn a_key_that_learned_an_age_is_not_at_rest_until_made_afresh() {
        let mut f = Fuse::new(adaptive(1, 10, 3, Outcome::Ignored), 0);
        assert!(f.is_at_rest(0));
        f.acquire(&take(1), id(1), 0).unwrap();
        assert!(!f.is_at_rest(0));
        f.complete(id(1), Outcome::Ignored, 5).unwrap();
        assert!(f.is_at_rest(5), "IGNORED teaches nothing");
        f.acquire(&take(1), id(2), 5).unwrap();
        f.complete(id(2), Outcome::Success, 15).unwrap();
        // One of the ten first samples that make the baseline (CX24).
        assert_eq!(f.view(15).adaptive_limit, 3);
        assert!(!f.is_at_rest(15), "it learned an age");
    }
}

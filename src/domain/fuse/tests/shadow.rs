//! Shadow policies (D1-D4): what a shadow policy would block or deny it
//! grants with a shadow ticket that holds nothing and changes nothing,
//! while its breaker, limiter and budget evolve exactly as the same policy
//! enforced would.

use super::*;

fn shadow(p: Policy) -> Policy {
    Policy {
        enforce: false,
        ..p
    }
}

fn shadow_grant(ticket: u128, lease_end: Millis, reason: Reason) -> Decision {
    Decision::Shadow {
        grant: Some(Grant {
            ticket: id(ticket),
            lease_end,
        }),
        reason,
    }
}

#[test]
fn a_would_be_denial_is_a_shadow_ticket_that_holds_nothing_and_answers_stale() {
    let p = Policy {
        lease: lease(1_000, 5_000, Outcome::Failure),
        ..shadow(policy(
            Some(consecutive(1, 1_000)),
            Some(concurrency(1, 0, Order::OldestFirst)),
        ))
    };
    let mut f = Fuse::new(p, 0);
    assert_eq!(f.acquire(&take(1), id(1), 0), Ok(granted(1, 1_000)));
    // No permit is free: denied, so granted as a shadow ticket.
    assert_eq!(
        f.acquire(&take(1), id(2), 10),
        Ok(shadow_grant(2, 1_010, Reason::NoPermits))
    );
    let t = f.ticket(id(2)).expect("a shadow ticket is live (D2)");
    assert!(t.shadow && !t.holds && !t.probe && !t.settles);
    assert_eq!(f.view(10).free, 0, "it holds no permit");
    assert_eq!(f.view(10).live_tickets, 2);
    // A status check that would be denied answers granted, no ticket.
    assert_eq!(
        f.acquire(&status(), id(0), 10),
        Ok(Decision::Shadow {
            grant: None,
            reason: Reason::NoPermits
        })
    );
    // Its failure changes nothing and is stale (D2).
    let done = f.complete(id(2), Outcome::Failure, 20).unwrap();
    assert!(done.stale);
    assert_eq!(done.phase, Phase::Closed);
    assert_eq!(f.breaker().consecutive_failures(), 0);
    // Renewed like any ticket; its lease end changes nothing either.
    assert!(matches!(
        f.acquire(&take(1), id(3), 30),
        Ok(Decision::Shadow { .. })
    ));
    assert_eq!(f.renew(id(3), Some(2_000), 40), Ok(2_000));
    f.advance(2_040).unwrap();
    assert!(f.ticket(id(3)).is_none());
    // The real ticket's lease end (a failure) trips the breaker.
    assert_eq!(f.phase(), Phase::Open);
    let stats = f.stats();
    assert_eq!(stats.granted, 1);
    assert_eq!(stats.shadow, 2);
    assert_eq!(stats.denied, 2);
    assert_eq!(stats.by_reason[Reason::NoPermits as usize], 2);
    assert_eq!(stats.stale, 2, "a shadow ticket's outcome and lease end");
    assert_eq!(stats.failures, 1);
}

#[test]
fn a_shadow_breaker_trips_and_blocked_requests_get_shadow_tickets_but_isolation_is_enforced() {
    let mut f = Fuse::new(shadow(policy(Some(consecutive(2, 1_000)), None)), 0);
    for n in 1..=2 {
        f.acquire(&take(1), id(n), 0).unwrap();
        f.complete(id(n), Outcome::Failure, 0).unwrap();
    }
    assert_eq!(f.phase(), Phase::Open);
    assert_eq!(
        f.acquire(&take(1), id(3), 100),
        Ok(shadow_grant(
            3,
            100 + LeasePolicy::default().default.get(),
            Reason::Open
        ))
    );
    // The probe is a real probe; a second request would be blocked.
    assert!(matches!(
        f.acquire(&take(1), id(4), 1_000),
        Ok(Decision::Probe(_))
    ));
    assert!(matches!(
        f.acquire(&take(1), id(5), 1_001),
        Ok(Decision::Shadow {
            reason: Reason::ProbeInFlight,
            ..
        })
    ));
    assert!(!f.ticket(id(5)).unwrap().probe);
    // The shadow ticket's success does not close the breaker.
    assert!(f.complete(id(5), Outcome::Success, 1_002).unwrap().stale);
    assert_eq!(f.phase(), Phase::HalfOpen);
    assert_eq!(
        f.complete(id(4), Outcome::Success, 1_003).unwrap().phase,
        Phase::Closed
    );
    // D4: isolation is enforced.
    f.isolate(1_004).unwrap();
    assert_eq!(f.acquire(&take(1), id(6), 1_005), Ok(Decision::Refused));
    assert_eq!(f.acquire(&status(), id(0), 1_005), Ok(Decision::Refused));
    assert_eq!(f.stats().blocked, 2);
    assert_eq!(f.stats().shadow, 2);
    assert_eq!(f.stats().refused, 1);
}

#[test]
fn nobody_waits_on_a_shadow_policy_but_earlier_waiters_keep_waiting() {
    let enforced = policy(None, Some(concurrency(1, 10, Order::OldestFirst)));
    let mut f = Fuse::new(enforced, 0);
    assert_eq!(f.acquire(&take(1), id(1), 0), Ok(granted(1, 30_000)));
    assert_eq!(f.acquire(&wait(1, 500), id(2), 0), Ok(Decision::Queued));
    f.set_policy(shadow(enforced), 1).unwrap();
    // D3: max_wait is 0, so the would-be answer is denied (no_permits).
    assert!(matches!(
        f.acquire(&wait(1, 500), id(3), 2),
        Ok(Decision::Shadow {
            reason: Reason::NoPermits,
            ..
        })
    ));
    assert_eq!(f.waiters(), 1, "the earlier waiter keeps waiting");
    f.complete(id(1), Outcome::Success, 3).unwrap();
    let served = notices(&mut f);
    assert!(served.contains(&answered(2, granted(2, 30_003))));
    assert!(
        f.ticket(id(2)).unwrap().holds,
        "served under enforcing rules"
    );
    assert_eq!(f.view(3).free, 0);
}

#[test]
fn a_retry_beyond_the_budget_is_a_shadow_grant_counted_as_retry_denied() {
    let p = Policy {
        retry_budget: Some(crate::policy::RetryBudget {
            ratio_millionths: 1,
            min_per_second: 0,
            window: nz64(1_000),
        }),
        ..shadow(policy(None, None))
    };
    let mut f = Fuse::new(p, 0);
    let retry = Ask {
        retry: true,
        ..take(1)
    };
    assert!(matches!(
        f.acquire(&retry, id(1), 0),
        Ok(Decision::Shadow {
            reason: Reason::RetryBudget,
            ..
        })
    ));
    assert_eq!(f.stats().retry_denied, 1);
    assert_eq!(f.stats().denied, 0);
    assert_eq!(f.stats().shadow, 1);
}

#[test]
fn a_shadow_ticket_needs_room_like_any_ticket_and_reads_back_from_its_state() {
    let p = shadow(policy(None, Some(concurrency(1, 0, Order::OldestFirst))));
    let mut f = Fuse::new(p, 0);
    f.acquire(&take(1), id(1), 0).unwrap();
    let full = Ask {
        room_for_ticket: false,
        ..take(1)
    };
    let before = f.clone();
    assert_eq!(f.acquire(&full, id(2), 0), Err(FuseError::NoRoomForTicket));
    assert_eq!(f, before, "a refused acquire changes nothing");
    f.acquire(&take(1), id(2), 0).unwrap();
    let state = f.state();
    assert!(state.tickets.iter().any(|t| t.shadow));
    let json = serde_json::to_value(&state).unwrap();
    assert_eq!(json["policy"]["enforce"], false);
    assert_eq!(Fuse::from_state(state.clone()).unwrap(), f);
    let mut bad = state;
    bad.tickets
        .iter_mut()
        .for_each(|t| t.holds = t.shadow || t.holds);
    assert!(matches!(
        Fuse::from_state(bad),
        Err(StateError::ShadowHolds(_))
    ));
}

mod model {
    //! The strong check: a shadow policy's breaker, limiter and budget
    //! evolve exactly as the same policy enforced, given the same outcomes
    //! of the tickets really granted; the shadow answers only where the
    //! enforcing one blocks or denies, with its reason; it never refuses
    //! but while isolated.
    use super::*;
    use proptest::prelude::*;

    #[derive(Clone, Copy, Debug)]
    enum Op {
        Acquire { permits: u32, retry: bool },
        Complete { pick: usize, outcome: Outcome },
        CompleteShadow { pick: usize, outcome: Outcome },
        Renew { pick: usize, lease: Millis },
        Isolate,
        Close,
    }

    fn outcome() -> impl Strategy<Value = Outcome> {
        prop::sample::select(Outcome::ALL.to_vec())
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (prop::sample::select(vec![0u32, 1, 1, 2]), any::<bool>())
                .prop_map(|(permits, retry)| Op::Acquire { permits, retry }),
            4 => (any::<usize>(), outcome()).prop_map(|(pick, outcome)| Op::Complete { pick, outcome }),
            2 => (any::<usize>(), outcome()).prop_map(|(pick, outcome)| Op::CompleteShadow { pick, outcome }),
            1 => (any::<usize>(), 1u64..600).prop_map(|(pick, lease)| Op::Renew { pick, lease }),
            1 => Just(Op::Isolate),
            1 => Just(Op::Close),
        ]
    }

    fn a_policy() -> impl Strategy<Value = Policy> {
        let breaker = prop::sample::select(vec![0u8, 1, 2, 3]);
        let limiter = prop::sample::select(vec![0u8, 1, 2, 3]);
        let budget = any::<bool>();
        let expired = prop::sample::select(vec![Outcome::Failure, Outcome::Ignored]);
        (breaker, limiter, budget, expired).prop_map(|(b, l, budget, expired)| {
            let breaker = match b {
                0 => None,
                1 => Some(consecutive(2, 200)),
                2 => Some(ratio(0.5, 3, 300)),
                _ => Some(BreakerPolicy {
                    half_open: HalfOpen {
                        probes: nz32(2),
                        successes: nz32(2),
                    },
                    ..consecutive(2, 200)
                }),
            };
            let limiter = match l {
                0 => None,
                1 => Some(concurrency(2, 0, Order::OldestFirst)),
                2 => Some(bucket(2, 1, 50, 0)),
                _ => Some(fixed(2, 100, 0)),
            };
            Policy {
                lease: lease(250, 1_000, expired),
                retry_budget: budget.then(|| crate::policy::RetryBudget {
                    ratio_millionths: 500_000,
                    min_per_second: 0,
                    window: nz64(1_000),
                }),
                ..policy(breaker, limiter)
            }
        })
    }

    /// Everything of a fuse that a shadow ticket must not change.
    fn same_state(e: &Fuse, s: &Fuse, now: Millis) -> Result<(), TestCaseError> {
        prop_assert_eq!(e.breaker(), s.breaker());
        prop_assert_eq!(e.budget(), s.budget());
        let (ev, sv) = (e.view(now), s.view(now));
        prop_assert_eq!(
            (
                ev.phase,
                ev.free,
                ev.limit,
                ev.probes_held,
                ev.half_open_successes
            ),
            (
                sv.phase,
                sv.free,
                sv.limit,
                sv.probes_held,
                sv.half_open_successes
            )
        );
        let (mut es, mut ss) = (ev.stats, sv.stats);
        // What shadow tickets add: their grants, stale outcomes, lease ends.
        prop_assert_eq!(es.shadow, 0);
        for st in [&mut es, &mut ss] {
            st.shadow = 0;
            st.stale = 0;
            st.expired = 0;
        }
        prop_assert_eq!(es, ss);
        Ok(())
    }

    proptest! {
        #[test]
        fn a_shadow_policy_evolves_as_the_enforced_one_and_only_never_refuses_while_isolated(
            p in a_policy(),
            steps in prop::collection::vec((0u64..120, op()), 1..80),
        ) {
            let mut e = Fuse::new(p, 0);
            let mut s = Fuse::new(shadow(p), 0);
            let mut real: Vec<TicketId> = Vec::new();
            let mut shadows: Vec<TicketId> = Vec::new();
            let mut now = 0;
            let mut next = 1u128;
            for (i, (after, op)) in steps.into_iter().enumerate() {
                now += after;
                e.advance(now).unwrap();
                s.advance(now).unwrap();
                real.retain(|&t| e.ticket(t).is_some());
                shadows.retain(|&t| s.ticket(t).is_some());
                match op {
                    Op::Acquire { permits, retry } => {
                        let ask = Ask { permits, retry, ..Ask::default() };
                        let t = id(next);
                        next += 1;
                        let want = e.acquire(&ask, t, now).unwrap();
                        let got = s.acquire(&ask, t, now).unwrap();
                        match want {
                            Decision::Blocked { reason, .. } | Decision::Denied { reason, .. } => {
                                let Decision::Shadow { grant, reason: r } = got else {
                                    return Err(TestCaseError::fail(format!("step {i}: {want:?} became {got:?}")));
                                };
                                prop_assert_eq!(r, reason);
                                prop_assert_eq!(grant.is_some(), permits > 0);
                                if permits > 0 {
                                    shadows.push(t);
                                    prop_assert!(s.ticket(t).unwrap().shadow);
                                }
                            }
                            Decision::Refused => {
                                prop_assert_eq!(got, Decision::Refused);
                                prop_assert_eq!(s.phase(), Phase::Isolated);
                            }
                            _ => {
                                prop_assert_eq!(got, want);
                                if want.grant().is_some() {
                                    real.push(t);
                                }
                            }
                        }
                        let never = matches!(got, Decision::Blocked { .. } | Decision::Denied { .. } | Decision::Queued);
                        prop_assert!(!never, "step {}: {:?}", i, got);
                    }
                    Op::Complete { pick, outcome } if !real.is_empty() => {
                        let t = real.remove(pick % real.len());
                        prop_assert_eq!(e.complete(t, outcome, now), s.complete(t, outcome, now));
                    }
                    Op::CompleteShadow { pick, outcome } if !shadows.is_empty() => {
                        let t = shadows.remove(pick % shadows.len());
                        let done = s.complete(t, outcome, now).unwrap();
                        prop_assert!(done.stale);
                    }
                    Op::Renew { pick, lease } if !real.is_empty() || !shadows.is_empty() => {
                        let all: Vec<TicketId> = real.iter().chain(&shadows).copied().collect();
                        let t = all[pick % all.len()];
                        let got = s.renew(t, Some(lease), now);
                        if real.contains(&t) {
                            prop_assert_eq!(e.renew(t, Some(lease), now), got);
                        } else {
                            prop_assert!(got.is_ok());
                        }
                    }
                    Op::Isolate => {
                        e.isolate(now).unwrap();
                        s.isolate(now).unwrap();
                    }
                    Op::Close => {
                        e.close(now).unwrap();
                        s.close(now).unwrap();
                    }
                    _ => {}
                }
                let (en, sn): (Vec<_>, Vec<_>) = (e.drain_notices().collect(), s.drain_notices().collect());
                // Lease ends of shadow tickets are the only extra notices.
                let sn: Vec<_> = sn
                    .into_iter()
                    .filter(|n| !matches!(n, Notice::Expired { ticket } if e.ticket(*ticket).is_none() && !en.contains(n)))
                    .collect();
                prop_assert_eq!(en, sn, "step {}", i);
                same_state(&e, &s, now)?;
                prop_assert_eq!(s.live_tickets(), e.live_tickets() + shadows.len());
            }
        }
    }
}

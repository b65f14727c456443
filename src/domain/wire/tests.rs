//! Every kind of message round-trips, and what the module has written
//! since its state encoding 3 (the oldest a server accepts) still reads.

use proptest::prelude::*;

use super::*;
use crate::decision::Grant;
use crate::fuse::Ask;
use crate::{Outcome, Policy};

/// Times below 2^53 (SPEC T0), as every store keeps them.
const T: u64 = 1 << 53;

fn phase() -> impl Strategy<Value = Phase> {
    proptest::sample::select(Phase::ALL.to_vec())
}

fn reason() -> impl Strategy<Value = Reason> {
    proptest::sample::select(Reason::ALL.to_vec())
}

/// An answer as a step makes it: a grant's lease ends at or after `now`.
fn answer() -> impl Strategy<Value = Answer> {
    (0..T, phase()).prop_flat_map(|(now, phase)| {
        let grant = (any::<u128>(), 0..T).prop_map(move |(id, lease)| Grant {
            ticket: TicketId(id),
            lease_end: now + lease,
        });
        let decision = prop_oneof![
            proptest::option::of(grant.clone()).prop_map(Decision::Granted),
            grant.prop_map(Decision::Probe),
            (reason(), 0..T).prop_map(|(reason, retry_after)| Decision::Blocked {
                reason,
                retry_after
            }),
            Just(Decision::Refused),
            (reason(), proptest::option::of(0..T)).prop_map(|(reason, retry_after)| {
                Decision::Denied {
                    reason,
                    retry_after,
                }
            }),
            Just(Decision::Queued),
        ];
        decision.prop_map(move |decision| Answer {
            decision,
            phase,
            now,
        })
    })
}

/// The text of each of the answer's fields, as the array reply writes
/// them (nil as `-`).
fn array_text(a: &Answer) -> String {
    let f = AnswerFields::from(a);
    let ms = |m: Option<u64>| m.map_or("-".to_owned(), |m| m.to_string());
    [
        f.decision.as_str().to_owned(),
        f.reason.map_or("-".to_owned(), |r| r.as_str().to_owned()),
        f.ticket.map_or("-".to_owned(), |t| t.to_string()),
        ms(f.lease_ms),
        ms(f.retry_after_ms),
        phase_label(f.phase),
        f.now_ms.to_string(),
    ]
    .join(" ")
}

proptest! {
    /// The packed form reads back as the answer it was written from, and
    /// holds the array's fields in order.
    #[test]
    fn an_answer_round_trips_through_the_packed_form(a in answer()) {
        let packed = a.packed();
        prop_assert_eq!(Answer::read_packed(&packed), Ok(a));
        prop_assert_eq!(String::from_utf8(packed).unwrap(), array_text(&a));
    }

    /// The array's fields, and the answers channel's JSON, read back too.
    #[test]
    fn an_answer_round_trips_through_its_fields_and_its_notice(a in answer(), waiter: u128) {
        prop_assert_eq!(Answer::try_from(AnswerFields::from(&a)), Ok(a));
        let notice = AnswerNotice {
            key: "fusebox:k:a".into(),
            waiter: TicketId(waiter),
            answer: AnswerFields::from(&a),
        };
        let json = serde_json::to_string(&notice).unwrap();
        let back: AnswerNotice = serde_json::from_str(&json).unwrap();
        prop_assert_eq!(Answer::try_from(back.answer), Ok(a));
        prop_assert_eq!(back, notice);
    }

    /// Whatever the bytes, reading a packed reply never panics, and what
    /// reads writes back the same.
    #[test]
    fn any_packed_bytes_read_or_are_refused(text in "[a-z_0-9 -]{0,80}") {
        if let Ok(a) = Answer::read_packed(text.as_bytes()) {
            prop_assert_eq!(Answer::read_packed(&a.packed()), Ok(a));
        }
        if let Ok(c) = Completion::read_packed(text.as_bytes()) {
            prop_assert_eq!(Completion::read_packed(&c.packed()), Ok(c));
        }
    }
}

#[test]
fn completions_round_trip() {
    for phase in Phase::ALL {
        for stale in [false, true] {
            let c = Completion { stale, phase };
            assert_eq!(Completion::read_packed(&c.packed()), Ok(c));
        }
    }
    assert_eq!(
        Completion {
            stale: false,
            phase: Phase::HalfOpen
        }
        .packed(),
        b"0 half_open"
    );
    for bad in ["2 closed", "0", "0 ajar", "0 closed x", "0  closed", ""] {
        assert!(Completion::read_packed(bad.as_bytes()).is_err(), "{bad}");
    }
}

/// What today's module writes, byte for byte, reads as it always did.
#[test]
fn the_modules_packed_replies_read() {
    let granted =
        Answer::read_packed(b"granted - 00000000000000000000000000000abc 500 - closed 1000")
            .unwrap();
    assert_eq!(
        granted,
        Answer {
            decision: Decision::Granted(Some(Grant {
                ticket: TicketId(0xabc),
                lease_end: 1500
            })),
            phase: Phase::Closed,
            now: 1000,
        }
    );
    assert_eq!(
        granted.packed(),
        b"granted - 00000000000000000000000000000abc 500 - closed 1000"
    );
    assert_eq!(
        Answer::read_packed(b"blocked open - - 30 OPEN 7").unwrap(),
        Answer {
            decision: Decision::Blocked {
                reason: Reason::Open,
                retry_after: 30
            },
            phase: Phase::Open,
            now: 7
        }
    );
    assert_eq!(
        Answer::read_packed(b"granted - - - - half_open 5")
            .unwrap()
            .decision,
        Decision::Granted(None)
    );
    for bad in [
        "granted - abc 500 - closed",
        "granted - abc 500 - closed 1000 more",
        "granted  abc 500 - closed 1000",
        "blocked open - - x OPEN 7",
        "maybe - - - - closed 1",
        "probe - - - - closed 1",
        "blocked - - - 30 open 1",
        "denied - - - - closed 1",
        "granted - 0123456789abcdef0123456789abcdef0 5 - closed 1",
        "granted - abc 5 - closed 18446744073709551615",
    ] {
        assert!(Answer::read_packed(bad.as_bytes()).is_err(), "{bad}");
    }
}

/// A key with a concurrency limiter, tickets, a waiter and some history.
fn busy() -> Fuse {
    let policy: Policy = serde_json::from_str::<PolicySpec>(
        r#"{"breaker":{"mode":"consecutive","failures":2,"break":"1s"},
            "limiter":{"kind":"concurrency","permits":2,"queue_limit":4}}"#,
    )
    .unwrap()
    .validate()
    .unwrap();
    let mut f = Fuse::new(policy, 10);
    let ask = |permits, max_wait| Ask {
        permits,
        max_wait,
        ..Ask::default()
    };
    f.acquire(&ask(1, 0), TicketId(1), 10).unwrap();
    f.acquire(&ask(1, 0), TicketId(2), 11).unwrap();
    f.acquire(&ask(1, 100), TicketId(3), 12).unwrap();
    f.acquire(&ask(5, 0), TicketId(4), 13).unwrap();
    f.complete(TicketId(1), Outcome::Failure, 14).unwrap();
    f
}

#[test]
fn a_view_round_trips_without_its_policy() {
    let f = busy();
    let view = KeyView::of(&f, 20);
    assert_eq!(view.view(), f.view(20));
    assert_eq!(view.policy, Some(f.policy().spec()));
    assert_eq!((view.last_now, view.now_ms), (14, 20));
    let json = serde_json::to_value(&view).unwrap();
    assert_eq!(json["phase"], "closed");
    assert_eq!(json["stats"]["by_reason"]["exceeds_limit"], 1);
    assert_eq!(json["policy"]["limiter"]["kind"], "concurrency");
    let back: KeyView = serde_json::from_value(json).unwrap();
    assert_eq!(
        back,
        KeyView {
            policy: None,
            ..view
        }
    );
}

/// A view as today's module writes it (keys in the order its JSON map
/// kept them), with a reason this release does not know and a field it
/// does not read.
const MODULE_VIEW: &str = r#"{"changed_at":0,"consecutive_failures":1,"epoch":0,"failure_ratio":null,"free":0,"half_open_attempts":0,"last_now":14,"limit":2,"live_tickets":1,"next_deadline":30010,"now_ms":20,"open_until":null,"phase":"half_open","policy":{"breaker":{"mode":"consecutive","failures":2,"break":1000}},"queued":1,"stats":{"blocked":0,"by_reason":{"evicted":0,"exceeds_limit":1,"no_permits":0,"open":0,"probe_in_flight":0,"queue_full":0,"timeout":0,"later_reason":9},"denied":1,"evicted":0,"expired":0,"failed":0,"failures":1,"granted":2,"ignored":0,"probes":0,"queued":1,"refused":0,"stale":0,"successes":0,"timed_out":0,"withdrawn":0},"waiters":1,"something_new":true}"#;

#[test]
fn the_modules_views_and_notices_read() {
    let view: KeyView = serde_json::from_str(MODULE_VIEW).unwrap();
    let v = view.view();
    assert_eq!(v.phase, Phase::HalfOpen);
    assert_eq!(
        (v.consecutive_failures, v.live_tickets, v.waiters),
        (1, 1, 1)
    );
    assert_eq!((v.stats.granted, v.stats.denied), (2, 1));
    assert_eq!(v.stats.by_reason[Reason::ExceedsLimit as usize], 1);
    assert_eq!((view.now_ms, view.next_deadline), (20, Some(30010)));

    let answer = br#"{"key":"fusebox:k:a","waiter":"ff","decision":"denied","reason":"timeout","ticket":null,"lease_ms":null,"retry_after_ms":null,"phase":"closed","now_ms":9}"#;
    let notice: AnswerNotice = serde_json::from_slice(answer).unwrap();
    assert_eq!(
        (notice.key.as_str(), notice.waiter),
        ("fusebox:k:a", TicketId(0xff))
    );
    assert_eq!(
        Answer::try_from(notice.answer).unwrap().decision,
        Decision::Denied {
            reason: Reason::Timeout,
            retry_after: None
        }
    );

    let event = format!(
        r#"{{"at_ms":7,"cause":"isolated by an operator","from":"closed","key":"fusebox:k:w","to":"isolated","view":{MODULE_VIEW},"who":"ops","why":null}}"#
    );
    let event: PhaseNotice = serde_json::from_str(&event).unwrap();
    assert_eq!(
        (event.from, event.to, event.cause, event.at_ms),
        (Phase::Closed, Phase::Isolated, Cause::Isolated, 7)
    );
    assert_eq!((event.who.as_deref(), event.why), (Some("ops"), None));

    for bad in [
        r#"{}"#,
        r#"{"key":"k","waiter":"ff","decision":"maybe","phase":"closed","now_ms":1}"#,
        r#"{"key":"k","waiter":"xyz","decision":"queued","phase":"closed","now_ms":1}"#,
        r#"{"key":"k","waiter":"ff","decision":"queued","phase":"ajar","now_ms":1}"#,
    ] {
        assert!(serde_json::from_str::<AnswerNotice>(bad).is_err(), "{bad}");
    }
}

#[test]
fn every_event_round_trips() {
    let f = busy();
    for cause in Cause::ALL {
        for (from, to) in [
            (Phase::Closed, Phase::Open),
            (Phase::HalfOpen, Phase::Isolated),
        ] {
            let notice = PhaseNotice {
                key: "fusebox:k:e".into(),
                from,
                to,
                cause,
                at_ms: 99,
                who: Some("ops".into()),
                why: None,
                view: KeyView {
                    policy: None,
                    ..KeyView::of(&f, 30)
                },
                shadow: false,
                order: Some(NoticeOrder { now_ms: 30, seq: 7 }),
            };
            let json = serde_json::to_string(&notice).unwrap();
            assert!(
                json.contains(&format!(r#""cause":"{}""#, cause.as_str())),
                "{json}"
            );
            let back: PhaseNotice = serde_json::from_str(&json).unwrap();
            assert_eq!(back, notice);
        }
    }
}

#[test]
fn a_keys_notices_are_ordered_by_time_then_epoch() {
    // Two transitions in one step at 50 that left the epoch at 9, then one
    // at the same instant (epoch 10), then a key made afresh later.
    let first: Vec<_> = NoticeOrder::of_step(50, 9, 2).collect();
    let next: Vec<_> = NoticeOrder::of_step(50, 10, 1).collect();
    let afresh: Vec<_> = NoticeOrder::of_step(51, 1, 1).collect();
    let all: Vec<_> = [first, next, afresh].concat();
    assert_eq!(all.len(), 4);
    assert!(all.windows(2).all(|w| w[0] < w[1]), "{all:?}");
    assert_eq!(all[0], NoticeOrder { now_ms: 50, seq: 8 });
    assert_eq!(NoticeOrder::of_step(1, 0, 0).count(), 0);
}

#[test]
fn a_sealed_message_opens_and_nothing_else_does() {
    let mac = [0xab; MAC_BYTES];
    let sealed = seal(&mac, "{}");
    assert_eq!(sealed, format!("{} {{}}", "ab".repeat(32)));
    assert_eq!(unseal(sealed.as_bytes()), Ok((mac, &b"{}"[..])));
    assert_eq!(unseal(sealed.to_uppercase().as_bytes()), Err("not signed"));
    assert_eq!(unseal(b"{}"), Err("not signed"));
    assert_eq!(unseal(&sealed.as_bytes()[..64]), Err("not signed"));
    let mut no_space = sealed.clone().into_bytes();
    no_space[64] = b'x';
    assert_eq!(unseal(&no_space), Err("not signed"));
    assert_eq!(fingerprint(&mac), "abababababababab");
    assert_eq!(
        signed_parts("fusebox:answers", b"{}").concat(),
        b"fusebox:answers\n{}"
    );
}

#[test]
fn labelled_figures_round_trip() {
    let v = ModuleVersion {
        module: "0.1.0".into(),
        encoding: 3,
        signing: Some("08c2720d49dc191e".into()),
    };
    assert_eq!(ModuleVersion::read(v.items()), Ok(v.clone()));
    let off = ModuleVersion { signing: None, ..v };
    assert_eq!(off.items()[2], ("signing", Item::Text("off")));
    assert_eq!(ModuleVersion::read(off.items()), Ok(off));
    assert!(ModuleVersion::read([("module", Item::Text("0.0.1"))]).is_err());

    let c = CensusFigures {
        keys: 10,
        complete: true,
        counted_at_ms: 5,
        by_phase: [1, 2, 3, 4],
        tickets: 6,
        waiters: 7,
    };
    let items = c.items();
    let labels: Vec<&str> = items.iter().map(|(l, _)| l.as_ref()).collect();
    assert_eq!(
        labels,
        [
            "keys",
            "complete",
            "counted_at_ms",
            "closed",
            "open",
            "half_open",
            "isolated",
            "tickets",
            "waiters"
        ]
    );
    let read = |items: &[(Cow<'static, str>, u64)]| {
        CensusFigures::read(items.iter().map(|(l, n)| (l.as_ref(), *n)))
    };
    assert_eq!(read(&items), Ok(c));
    assert!(read(&items[1..]).is_err(), "no keys");
    let mut more = items.clone();
    more.push((Cow::Borrowed("later_figure"), 1));
    assert!(read(&more).is_ok(), "an unknown figure is skipped");
}

#[test]
fn channels_and_forms_are_named_once() {
    for c in Channel::ALL {
        assert_eq!(c.as_str().parse::<Channel>(), Ok(c));
        assert_eq!(Channel::ALL[c.index()], c);
    }
    assert_eq!("PACKED".parse::<ReplyForm>(), Ok(ReplyForm::Packed));
    assert_eq!(ReplyForm::default(), ReplyForm::Array);
    let e = "tabular".parse::<ReplyForm>().unwrap_err();
    assert_eq!(
        e.to_string(),
        r#"reply: "tabular" is not one; send array or packed"#
    );
}

//! SPEC section 5 over real gRPC: every malformed field and every error code
//! that applies without authentication (K1, K3, L2, L4, E2, X1), each one
//! asserted to fail with its code, to name its field, and to change nothing
//! (E3): the whole `KeyState` of the keys involved is compared before and
//! after, and a never-used key is shown not to be made (K2) through the key
//! cap, which has room for exactly one more key at the end.

use fusebox::proto::v1 as pb;
use prost_types::Duration as WireDuration;
use tonic::transport::Channel;
use tonic::{Code, Status};

use crate::harness::{millis, ms, Options, Server};

/// One key is made by the setup, one at the end; a third must not fit.
const CONFIG: &str = r#"
[server]
max_keys = 2

[default]
breaker = { mode = "consecutive", failures = 3, break = "1s" }
limiter = { kind = "concurrency", permits = 4, queue_limit = 4 }
lease = { default = "1s", max = "10s" }
"#;

/// The key with state: a recorded failure, a live ticket, permits taken.
const USED: &str = "k/used";
/// Named by bad requests; never made.
const NEVER: &str = "k/never";
/// Made only at the end, to show the key cap still had room.
const FRESH: &str = "k/fresh";
/// Past the key cap at the end.
const THIRD: &str = "k/third";

/// Longest valid duration: 365 days.
const MAX_SECONDS: i64 = 365 * 24 * 3600;

#[derive(Clone, Debug)]
enum Call {
    Acquire(pb::AcquireRequest),
    Complete(pb::CompleteRequest),
    Renew(pb::RenewRequest),
    GetKey(pb::GetKeyRequest),
    Isolate(pb::IsolateRequest),
    Close(pb::CloseRequest),
    Advance(pb::AdvanceRequest),
}

#[derive(Debug)]
struct Case {
    name: String,
    call: Call,
    code: Code,
    /// The field the message must name.
    field: &'static str,
}

struct Clients {
    fusebox: pb::fusebox_client::FuseboxClient<Channel>,
    admin: pb::admin_client::AdminClient<Channel>,
    clock: pb::clock_client::ClockClient<Channel>,
}

impl Clients {
    async fn new(server: &Server) -> Clients {
        Clients {
            fusebox: server.fusebox().await,
            admin: server.admin().await,
            clock: server.clock().await,
        }
    }

    /// Sends `call`; the reply's content is not needed, only success or the status.
    async fn send(&mut self, call: Call) -> Result<(), Status> {
        match call {
            Call::Acquire(r) => self.fusebox.acquire(r).await.map(drop),
            Call::Complete(r) => self.fusebox.complete(r).await.map(drop),
            Call::Renew(r) => self.fusebox.renew(r).await.map(drop),
            Call::GetKey(r) => self.admin.get_key(r).await.map(drop),
            Call::Isolate(r) => self.admin.isolate(r).await.map(drop),
            Call::Close(r) => self.admin.close(r).await.map(drop),
            Call::Advance(r) => self.clock.advance(r).await.map(drop),
        }
    }

    /// The key's state: the fields of SPEC section 8 and the statistics
    /// (a refused request must not count as a request either). The time of
    /// the last phase change is left out: a never-used key reads as made now.
    async fn get(&mut self, key: &str) -> pb::KeyState {
        let state = crate::admin::get(&mut self.admin, key).await;
        pb::KeyState {
            phase_changed_at: None,
            ..state
        }
    }

    async fn acquire(&mut self, key: &str, lease: Option<u64>) -> pb::AcquireResponse {
        self.fusebox
            .acquire(pb::AcquireRequest {
                key: key.into(),
                permits: None,
                max_wait: None,
                lease: lease.map(ms),
                ..Default::default()
            })
            .await
            .unwrap_or_else(|s| panic!("Acquire {key:?}: {s:?}"))
            .into_inner()
    }

    async fn ticket(&mut self, key: &str, lease: Option<u64>) -> String {
        let r = self.acquire(key, lease).await;
        assert_eq!(r.decision, pb::Decision::Granted as i32, "{r:?}");
        assert!(!r.ticket.is_empty(), "{r:?}");
        r.ticket
    }

    async fn complete(&mut self, ticket: &str, outcome: pb::Outcome) -> pb::CompleteResponse {
        crate::admin::complete(&mut self.fusebox, ticket, outcome).await
    }

    async fn advance(&mut self, by: u64) -> u64 {
        crate::admin::advance_clock(&mut self.clock, by).await
    }
}

/// A fresh key's state, as the config above makes it.
fn fresh(key: &str) -> pb::KeyState {
    pb::KeyState {
        key: key.into(),
        phase: pb::Phase::Closed as i32,
        consecutive_failures: 0,
        half_open_attempts: 0,
        open_remaining: None,
        free: 4,
        queued: 0,
        live_tickets: 0,
        waiters: 0,
        stats: Some(pb::KeyStats::default()),
        failure_ratio: None,
        phase_changed_at: None,
        limit: 4,
        ..Default::default()
    }
}

/// A state without its statistics: for keys that were used and are at rest.
fn without_stats(state: pb::KeyState) -> pb::KeyState {
    pb::KeyState {
        stats: None,
        ..state
    }
}

fn dur(seconds: i64, nanos: i32) -> WireDuration {
    WireDuration { seconds, nanos }
}

/// Durations that every duration field must refuse.
fn bad_durations() -> Vec<(&'static str, WireDuration)> {
    vec![
        ("negative seconds", dur(-1, 0)),
        ("negative nanos", dur(0, -1)),
        ("negative both", dur(-5, -500_000_000)),
        ("nanos of a whole second", dur(0, 1_000_000_000)),
        ("nanos below -1 s", dur(0, -1_000_000_000)),
        ("nanos i32::MAX", dur(0, i32::MAX)),
        ("positive seconds, negative nanos", dur(1, -1)),
        ("negative seconds, positive nanos", dur(-1, 1)),
        ("365 days and 1 s", dur(MAX_SECONDS + 1, 0)),
        ("365 days and 1 ns", dur(MAX_SECONDS, 1)),
        ("365 days and 999999999 ns", dur(MAX_SECONDS, 999_999_999)),
        ("i64::MAX seconds", dur(i64::MAX, 0)),
        ("i64::MIN seconds", dur(i64::MIN, 0)),
    ]
}

/// Keys that K1 refuses.
fn bad_keys() -> Vec<(&'static str, String)> {
    vec![
        ("empty key", String::new()),
        ("257-byte key", "x".repeat(257)),
        ("257-byte multi-byte key", format!("{}x", "é".repeat(128))),
        ("key with a newline", "k/a\nb".into()),
        ("key with NUL", "k/\0".into()),
        ("key with a tab", "\tk/a".into()),
        ("key with DEL", "k/a\u{7f}".into()),
        ("key with a C1 control", "k/a\u{85}b".into()),
        ("key with ESC", "k/\u{1b}[31m".into()),
    ]
}

fn acquire(key: &str, max_wait: Option<WireDuration>, lease: Option<WireDuration>) -> Call {
    Call::Acquire(pb::AcquireRequest {
        key: key.into(),
        permits: None,
        max_wait,
        lease,
        ..Default::default()
    })
}

fn complete(ticket: &str, outcome: i32) -> Call {
    Call::Complete(pb::CompleteRequest {
        ticket: ticket.into(),
        outcome,
        cost: None,
    })
}

fn renew(ticket: &str, lease: Option<WireDuration>) -> Call {
    Call::Renew(pb::RenewRequest {
        ticket: ticket.into(),
        lease,
    })
}

/// The tickets the table refers to.
struct Tickets {
    live: String,
    completed: String,
    expired: String,
}

fn cases(t: &Tickets) -> Vec<Case> {
    let mut cases = Vec::new();
    let mut add = |name: String, call: Call, code: Code, field: &'static str| {
        cases.push(Case {
            name,
            call,
            code,
            field,
        })
    };
    let invalid = Code::InvalidArgument;

    // K1: bad keys, on every RPC that takes one.
    for (what, key) in bad_keys() {
        add(
            format!("Acquire, {what}"),
            acquire(&key, None, None),
            invalid,
            "key",
        );
        add(
            format!("Acquire status check, {what}"),
            Call::Acquire(crate::admin::status_check(&key)),
            invalid,
            "key",
        );
        add(
            format!("GetKey, {what}"),
            Call::GetKey(pb::GetKeyRequest { key: key.clone() }),
            invalid,
            "key",
        );
        add(
            format!("Isolate, {what}"),
            Call::Isolate(pb::IsolateRequest {
                key: key.clone(),
                reason: "test".into(),
            }),
            invalid,
            "key",
        );
        add(
            format!("Close, {what}"),
            Call::Close(pb::CloseRequest {
                key: key.clone(),
                reason: "test".into(),
            }),
            invalid,
            "key",
        );
    }

    // Q1: a caller id that breaks the key rules or is longer than 128
    // bytes, on a key with state and on one never made.
    for (what, caller) in [
        ("129 bytes", "c".repeat(129)),
        ("a control character", "pod\u{7}-1".to_owned()),
    ] {
        for key in [USED, NEVER] {
            add(
                format!("Acquire {key}, caller of {what}"),
                Call::Acquire(pb::AcquireRequest {
                    key: key.into(),
                    caller: caller.clone(),
                    ..Default::default()
                }),
                invalid,
                "caller",
            );
        }
    }

    // E2: negative and out-of-range durations, in every duration field.
    for (what, d) in bad_durations() {
        for key in [USED, NEVER] {
            add(
                format!("Acquire {key}, max_wait {what}"),
                acquire(key, Some(d), None),
                invalid,
                "max_wait",
            );
            add(
                format!("Acquire {key}, lease {what}"),
                acquire(key, None, Some(d)),
                invalid,
                "lease",
            );
        }
        add(
            format!("Renew, lease {what}"),
            renew(&t.live, Some(d)),
            invalid,
            "lease",
        );
        add(
            format!("Advance, by {what}"),
            Call::Advance(pb::AdvanceRequest { by: Some(d) }),
            invalid,
            "by",
        );
    }

    // L2: a zero lease is refused.
    for key in [USED, NEVER] {
        add(
            format!("Acquire {key}, zero lease"),
            acquire(key, None, Some(dur(0, 0))),
            invalid,
            "lease",
        );
        add(
            format!("Acquire {key}, zero lease with a valid max_wait"),
            acquire(key, Some(ms(100)), Some(dur(0, 0))),
            invalid,
            "lease",
        );
    }
    add(
        "Renew, zero lease".into(),
        renew(&t.live, Some(dur(0, 0))),
        invalid,
        "lease",
    );

    // E2: outcomes, on a live ticket that must stay live.
    for (what, outcome) in [
        ("OUTCOME_UNSPECIFIED", pb::Outcome::Unspecified as i32),
        ("unknown outcome 4", 4),
        ("unknown outcome 1000", 1000),
        ("negative outcome", -1),
    ] {
        add(
            format!("Complete, {what}"),
            complete(&t.live, outcome),
            invalid,
            "outcome",
        );
    }

    // Tickets: empty is malformed (INVALID_ARGUMENT), anything else that is
    // not a live ticket is unknown (NOT_FOUND, L4).
    add(
        "Complete, empty ticket".into(),
        complete("", pb::Outcome::Success as i32),
        invalid,
        "ticket",
    );
    add(
        "Renew, empty ticket".into(),
        renew("", None),
        invalid,
        "ticket",
    );
    let unknown: Vec<(&str, String)> = vec![
        ("unknown ticket (zeros)", "0".repeat(32)),
        (
            "unknown ticket (hex)",
            "0123456789abcdef0123456789abcdef".into(),
        ),
        ("garbage ticket", "not a ticket".into()),
        ("garbage ticket of 32 chars", "z".repeat(32)),
        ("live ticket plus a character", format!("{}0", t.live)),
        ("live ticket minus a character", t.live[1..].to_owned()),
        ("live ticket with a space", format!(" {}", t.live)),
        ("very long garbage ticket", "a".repeat(10_000)),
        ("completed ticket", t.completed.clone()),
        ("expired ticket", t.expired.clone()),
    ];
    for (what, ticket) in unknown {
        for outcome in [pb::Outcome::Success, pb::Outcome::Failure] {
            add(
                format!("Complete {outcome:?}, {what}"),
                complete(&ticket, outcome as i32),
                Code::NotFound,
                "ticket",
            );
        }
        add(
            format!("Renew, {what}"),
            renew(&ticket, Some(ms(5_000))),
            Code::NotFound,
            "ticket",
        );
        add(
            format!("Renew default lease, {what}"),
            renew(&ticket, None),
            Code::NotFound,
            "ticket",
        );
    }

    // Operator reasons: at most 1024 bytes (counted in bytes, not characters).
    for (what, reason) in [
        ("1025-byte reason", "r".repeat(1025)),
        ("1026-byte multi-byte reason", "é".repeat(513)),
        ("reason with a control character", "line\nbreak".to_owned()),
    ] {
        for key in [USED, NEVER] {
            add(
                format!("Isolate {key}, {what}"),
                Call::Isolate(pb::IsolateRequest {
                    key: key.into(),
                    reason: reason.clone(),
                }),
                invalid,
                "reason",
            );
            add(
                format!("Close {key}, {what}"),
                Call::Close(pb::CloseRequest {
                    key: key.into(),
                    reason: reason.clone(),
                }),
                invalid,
                "reason",
            );
        }
    }
    cases
}

#[tokio::test]
async fn bad_input_fails_with_its_code_names_the_field_and_changes_nothing() {
    let server = Server::start(Options {
        config: Some(CONFIG),
        manual_clock: true,
        ..Options::default()
    })
    .await;
    let mut c = Clients::new(&server).await;

    // Setup at t = 0: a ticket that will expire, then at t = 100 a completed
    // ticket, a recorded failure, and a live ticket (lease 10 s, ends at 10_100).
    let expired = c.ticket(USED, Some(100)).await;
    assert_eq!(c.advance(100).await, 100);
    assert_eq!(c.get(USED).await.live_tickets, 0, "the 100 ms lease ended");
    let completed = c.ticket(USED, None).await;
    c.complete(&completed, pb::Outcome::Ignored).await;
    let failed = c.ticket(USED, None).await;
    c.complete(&failed, pb::Outcome::Failure).await;
    let live = c.ticket(USED, Some(10_000)).await;
    let used = c.get(USED).await;
    assert_eq!(
        used,
        pb::KeyState {
            consecutive_failures: 1,
            free: 3,
            live_tickets: 1,
            stats: Some(pb::KeyStats {
                granted: 4,
                failures: 1,
                // The expired ticket is settled as IGNORED (L3).
                ignored: 2,
                expired: 1,
                ..pb::KeyStats::default()
            }),
            ..fresh(USED)
        }
    );
    assert_eq!(c.get(NEVER).await, fresh(NEVER));

    let tickets = Tickets {
        live,
        completed,
        expired,
    };
    let cases = cases(&tickets);
    let mut failures = Vec::new();
    for case in &cases {
        let before = (c.get(USED).await, c.get(NEVER).await);
        let result = c.send(case.call.clone()).await;
        let after = (c.get(USED).await, c.get(NEVER).await);
        match result {
            Ok(()) => failures.push(format!(
                "{}: succeeded, expected {:?}",
                case.name, case.code
            )),
            Err(status) => {
                if status.code() != case.code {
                    failures.push(format!(
                        "{}: got {:?} ({:?}), expected {:?}",
                        case.name,
                        status.code(),
                        status.message(),
                        case.code
                    ));
                } else if !status.message().contains(case.field) {
                    failures.push(format!(
                        "{}: the message {:?} does not name the field {:?}",
                        case.name,
                        status.message(),
                        case.field
                    ));
                }
            }
        }
        if before != after {
            failures.push(format!(
                "{}: state changed (E3)\n  before {before:?}\n  after  {after:?}",
                case.name
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases went wrong:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    assert!(cases.len() > 150, "the table has {} cases", cases.len());

    // No bad Advance moved the clock.
    assert_eq!(c.advance(0).await, 100);
    // No bad Renew or Complete touched the live ticket: it ends at 10_100 as granted.
    assert_eq!(c.advance(9_999).await, 10_099);
    assert_eq!(c.get(USED).await.live_tickets, 1);
    assert_eq!(c.advance(1).await, 10_100);
    assert_eq!(
        c.get(USED).await.live_tickets,
        0,
        "the live ticket's lease ended on time"
    );
    // The expired ticket is gone.
    crate::admin::complete_not_found(&mut c.fusebox, &tickets.live).await;

    // K2: no bad request made a key. The cap (2) has room for exactly one more
    // key beside USED, so FRESH is made and behaves as fresh...
    assert_eq!(
        without_stats(c.get(FRESH).await),
        without_stats(fresh(FRESH))
    );
    let r = c.acquire(FRESH, None).await;
    assert_eq!(r.decision, pb::Decision::Granted as i32, "{r:?}");
    assert_eq!(millis(r.lease), Some(1_000), "the policy's default lease");
    c.complete(&r.ticket, pb::Outcome::Ignored).await;
    assert_eq!(
        without_stats(c.get(FRESH).await),
        without_stats(fresh(FRESH))
    );
    // ...and then the cap is reached (K3).
    cap_reached_changes_nothing(&mut c).await;
}

/// K3 at the key cap: RESOURCE_EXHAUSTED naming the cap, nothing made,
/// existing keys keep working.
async fn cap_reached_changes_nothing(c: &mut Clients) {
    let before = (c.get(USED).await, c.get(FRESH).await, c.get(THIRD).await);
    for max_wait in [None, Some(ms(1_000))] {
        let status = c
            .fusebox
            .acquire(pb::AcquireRequest {
                key: THIRD.into(),
                permits: Some(1),
                max_wait,
                lease: None,
                ..Default::default()
            })
            .await
            .expect_err("the key cap is reached");
        assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
        assert!(status.message().contains("max_keys"), "{status:?}");
    }
    // Isolate makes a key too.
    let status = crate::harness::steer(&mut c.admin, true, None, THIRD, "test")
        .await
        .expect_err("the key cap is reached");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("max_keys"), "{status:?}");
    let after = (c.get(USED).await, c.get(FRESH).await, c.get(THIRD).await);
    assert_eq!(before, after);
    assert_eq!(after.2, fresh(THIRD));
    // A status check makes no key, so it is not capped (K2, P2a).
    let r = c
        .fusebox
        .acquire(crate::admin::status_check(THIRD))
        .await
        .expect("a status check is not capped")
        .into_inner();
    assert_eq!(r.decision, pb::Decision::Granted as i32, "{r:?}");
    assert!(r.ticket.is_empty());
    // Existing keys keep working.
    let t = c.ticket(USED, None).await;
    let done = c.complete(&t, pb::Outcome::Success).await;
    assert!(!done.stale);
    assert_eq!(without_stats(c.get(USED).await), without_stats(fresh(USED)));
}

/// X1: without --manual-clock, Clock.Advance does not exist for callers.
#[tokio::test]
async fn advance_without_manual_clock_is_unimplemented() {
    let server = Server::start(Options::default()).await;
    let mut clock = server.clock().await;
    for by in [Some(ms(1)), Some(ms(0)), None, Some(dur(-1, 0))] {
        let status = clock
            .advance(pb::AdvanceRequest { by })
            .await
            .expect_err("no manual clock");
        assert_eq!(status.code(), Code::Unimplemented, "{status:?}");
    }
    // The rest of the server works.
    let r = server
        .fusebox()
        .await
        .acquire(crate::admin::request("k"))
        .await
        .expect("Acquire answers")
        .into_inner();
    assert_eq!(r.decision, pb::Decision::Granted as i32);
}

/// H1, H2, Y2: `breaker.half_open.probes` and `.successes` outside 1..=1000
/// are refused by `SetPolicy` (naming `policy.breaker.half_open.<field>`,
/// the rules in force unchanged, E3) and by the config file at start-up
/// (naming the rule and `breaker.half_open.<field>`); the bounds themselves
/// are accepted and read back as set.
#[tokio::test]
async fn half_open_bounds_out_of_range_are_refused_naming_the_field() {
    use crate::admin::{consecutive, policies, rule, set_policy};

    let server = Server::manual(Some(CONFIG)).await;
    let mut admin = server.admin().await;
    let before = policies(&mut admin).await;
    let half_open = |probes, successes| pb::Breaker {
        half_open: Some(pb::HalfOpen { probes, successes }),
        ..consecutive(3, 1000)
    };
    let dir = tempfile::tempdir().expect("a temp dir");
    let cases = [
        ("probes", 0),
        ("probes", 1001),
        ("successes", 0),
        ("successes", 1001),
    ];
    for (field, value) in cases {
        let what = format!("half_open.{field} = {value}");
        let breaker = match field {
            "probes" => half_open(Some(value), None),
            _ => half_open(None, Some(value)),
        };
        let status = set_policy(&mut admin, rule("h/*", Some(breaker), None))
            .await
            .expect_err(&what);
        assert_eq!(status.code(), Code::InvalidArgument, "{what}: {status:?}");
        let wire = format!("policy.breaker.half_open.{field}");
        assert!(
            status.message().contains(&wire),
            "{what}: SetPolicy names {wire}: {:?}",
            status.message()
        );
        assert_eq!(
            policies(&mut admin).await,
            before,
            "{what}: nothing changed"
        );

        let path = dir.path().join(format!("{field}-{value}.toml"));
        let text = format!(
            "[[rule]]\nmatch = \"h/*\"\nbreaker = {{ mode = \"consecutive\", failures = 3, break = \"1s\", half_open = {{ {field} = {value} }} }}\n"
        );
        std::fs::write(&path, text).expect("config written");
        let err = crate::harness::refused_start(
            &["--config", path.to_str().expect("a UTF-8 path")],
            None,
        )
        .await;
        let named = format!("breaker.half_open.{field}");
        for word in ["rule 1", "h/*", named.as_str()] {
            assert!(
                err.contains(word),
                "{what}: the config error names {word:?}: {err}"
            );
        }
    }

    // The bounds are valid, and read back as set.
    let set = set_policy(
        &mut admin,
        rule("h/*", Some(half_open(Some(1000), Some(1000))), None),
    )
    .await
    .expect("probes = 1000, successes = 1000 is a valid policy");
    let breaker = set.policy.and_then(|p| p.breaker).expect("a breaker");
    assert_eq!(
        breaker.half_open,
        Some(pb::HalfOpen {
            probes: Some(1000),
            successes: Some(1000)
        })
    );
}

/// Q2, Y2: `breaker.quorum` outside 2..=100 is refused by `SetPolicy`
/// (naming `policy.breaker.quorum`, the rules in force unchanged, E3) and
/// by the config file at start-up (naming the rule and `breaker.quorum`);
/// the bounds themselves are accepted and read back as set.
#[tokio::test]
async fn a_quorum_out_of_range_is_refused_naming_the_field() {
    use crate::admin::{consecutive, policies, rule, set_policy};

    let server = Server::manual(Some(CONFIG)).await;
    let mut admin = server.admin().await;
    let before = policies(&mut admin).await;
    let with_quorum = |quorum| pb::Breaker {
        quorum: Some(quorum),
        ..consecutive(3, 1000)
    };
    let dir = tempfile::tempdir().expect("a temp dir");
    for value in [0u32, 1, 101, u32::MAX] {
        let what = format!("quorum = {value}");
        let status = set_policy(&mut admin, rule("q/*", Some(with_quorum(value)), None))
            .await
            .expect_err(&what);
        assert_eq!(status.code(), Code::InvalidArgument, "{what}: {status:?}");
        assert!(
            status.message().contains("policy.breaker.quorum"),
            "{what}: SetPolicy names policy.breaker.quorum: {:?}",
            status.message()
        );
        assert_eq!(
            policies(&mut admin).await,
            before,
            "{what}: nothing changed"
        );

        let path = dir.path().join(format!("quorum-{value}.toml"));
        let text = format!(
            "[[rule]]\nmatch = \"q/*\"\nbreaker = {{ mode = \"consecutive\", failures = 3, break = \"1s\", quorum = {value} }}\n"
        );
        std::fs::write(&path, text).expect("config written");
        let err = crate::harness::refused_start(
            &["--config", path.to_str().expect("a UTF-8 path")],
            None,
        )
        .await;
        for word in ["rule 1", "q/*", "breaker.quorum"] {
            assert!(
                err.contains(word),
                "{what}: the config error names {word:?}: {err}"
            );
        }
    }
    for value in [2, 100] {
        let set = set_policy(&mut admin, rule("q/*", Some(with_quorum(value)), None))
            .await
            .unwrap_or_else(|s| panic!("quorum = {value} is valid: {s:?}"));
        let breaker = set.policy.and_then(|p| p.breaker).expect("a breaker");
        assert_eq!(breaker.quorum, Some(value), "read back as set");
    }
}

/// R1-R3, Y2: a `retry_budget` with `ratio` outside (0, 1] or missing, or a
/// `window` under 1 s, not a multiple of 10 ms or missing, is refused by
/// `SetPolicy` (naming `policy.retry_budget.<field>`, the rules in force
/// unchanged, E3) and by the config file at start-up (naming the rule and
/// `retry_budget.<field>`).
#[tokio::test]
async fn retry_budget_out_of_range_is_refused_naming_the_field() {
    use crate::admin::{policies, set_policy};

    let server = Server::manual(Some(CONFIG)).await;
    let mut admin = server.admin().await;
    let before = policies(&mut admin).await;
    let budget_rule = |budget: pb::RetryBudget| pb::PolicyRule {
        r#match: "b/*".into(),
        policy: Some(pb::Policy {
            retry_budget: Some(budget),
            ..Default::default()
        }),
        default: false,
    };
    let dir = tempfile::tempdir().expect("a temp dir");
    // (field, what is wrong, the budget on the wire, the budget in TOML).
    let cases: [(&str, &str, pb::RetryBudget, &str); 7] = [
        (
            "ratio",
            "ratio = 0",
            pb::RetryBudget {
                ratio: 0.0,
                min_per_second: 3,
                window: Some(ms(10_000)),
            },
            "ratio = 0.0, min_per_second = 3, window = \"10s\"",
        ),
        (
            "ratio",
            "ratio = 1.5",
            pb::RetryBudget {
                ratio: 1.5,
                min_per_second: 3,
                window: Some(ms(10_000)),
            },
            "ratio = 1.5, min_per_second = 3, window = \"10s\"",
        ),
        (
            "ratio",
            "ratio missing",
            pb::RetryBudget {
                ratio: 0.0,
                min_per_second: 3,
                window: Some(ms(10_000)),
            },
            "min_per_second = 3, window = \"10s\"",
        ),
        (
            "window",
            "window = 500ms",
            pb::RetryBudget {
                ratio: 0.2,
                min_per_second: 3,
                window: Some(ms(500)),
            },
            "ratio = 0.2, min_per_second = 3, window = \"500ms\"",
        ),
        (
            "window",
            "window = 1005ms",
            pb::RetryBudget {
                ratio: 0.2,
                min_per_second: 3,
                window: Some(ms(1_005)),
            },
            "ratio = 0.2, min_per_second = 3, window = \"1005ms\"",
        ),
        (
            "window",
            "window missing",
            pb::RetryBudget {
                ratio: 0.2,
                min_per_second: 3,
                window: None,
            },
            "ratio = 0.2, min_per_second = 3",
        ),
        (
            "window",
            "window = 0",
            pb::RetryBudget {
                ratio: 0.2,
                min_per_second: 3,
                window: Some(ms(0)),
            },
            "ratio = 0.2, min_per_second = 3, window = \"0s\"",
        ),
    ];
    for (i, (field, what, budget, toml)) in cases.into_iter().enumerate() {
        let status = set_policy(&mut admin, budget_rule(budget))
            .await
            .expect_err(what);
        assert_eq!(status.code(), Code::InvalidArgument, "{what}: {status:?}");
        let wire = format!("policy.retry_budget.{field}");
        assert!(
            status.message().contains(&wire),
            "{what}: SetPolicy names {wire}: {:?}",
            status.message()
        );
        assert_eq!(
            policies(&mut admin).await,
            before,
            "{what}: nothing changed"
        );

        let path = dir.path().join(format!("budget-{i}.toml"));
        let text = format!("[[rule]]\nmatch = \"b/*\"\nretry_budget = {{ {toml} }}\n");
        std::fs::write(&path, text).expect("config written");
        let err = crate::harness::refused_start(
            &["--config", path.to_str().expect("a UTF-8 path")],
            None,
        )
        .await;
        let named = format!("retry_budget.{field}");
        for word in ["rule 1", "b/*", named.as_str()] {
            assert!(
                err.contains(word),
                "{what}: the config error names {word:?}: {err}"
            );
        }
    }
}

/// R1-R3: a retry budget at its bounds (ratio 1, min_per_second 0, window
/// 1 s) and a usual one are accepted by `SetPolicy`, and read back as set,
/// in its answer and by `ListPolicies`.
#[tokio::test]
async fn retry_budget_reads_back_as_set() {
    use crate::admin::{policies, set_policy};

    let server = Server::manual(Some(CONFIG)).await;
    let mut admin = server.admin().await;
    let budgets = [
        pb::RetryBudget {
            ratio: 1.0,
            min_per_second: 0,
            window: Some(ms(1_000)),
        },
        pb::RetryBudget {
            ratio: 0.2,
            min_per_second: 3,
            window: Some(ms(10_000)),
        },
    ];
    for budget in budgets {
        let what = format!("{budget:?}");
        let set = set_policy(
            &mut admin,
            pb::PolicyRule {
                r#match: "b/*".into(),
                policy: Some(pb::Policy {
                    retry_budget: Some(budget),
                    ..Default::default()
                }),
                default: false,
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{what} is a valid budget: {e:?}"));
        assert_eq!(
            set.policy.and_then(|p| p.retry_budget).as_ref(),
            Some(&budget),
            "SetPolicy answers the budget as set"
        );
        let listed = policies(&mut admin).await;
        let shown = listed
            .rules
            .iter()
            .find(|r| r.r#match == "b/*")
            .and_then(|r| r.policy.as_ref())
            .and_then(|p| p.retry_budget.as_ref());
        assert_eq!(shown, Some(&budget), "ListPolicies shows {what}");
    }
}

/// S1-S3, Y2, CX10: `breaker.slow` in consecutive mode, without both
/// fields, with `ratio` outside (0, 1] or under 0.0000005, or with
/// `duration` 0 or above `lease.max`, is refused by `SetPolicy` (naming
/// `policy.breaker.slow...`, the rules in force unchanged, E3) and by the
/// config file at start-up (naming the rule and `breaker.slow...`); a
/// valid one is accepted and reads back as set.
#[tokio::test]
async fn slow_calls_out_of_range_are_refused_naming_the_field() {
    use crate::admin::{policies, set_policy};

    let server = Server::manual(Some(CONFIG)).await;
    let mut admin = server.admin().await;
    let before = policies(&mut admin).await;
    let ratio_mode = Some(pb::breaker::Mode::Ratio(pb::Ratio {
        failure_ratio: 0.5,
        minimum_throughput: 10,
        sampling_window: Some(ms(10_000)),
    }));
    let slow_rule = |consecutive: bool, slow: pb::Slow, lease_max: Option<u64>| pb::PolicyRule {
        r#match: "s/*".into(),
        policy: Some(pb::Policy {
            breaker: Some(pb::Breaker {
                mode: if consecutive {
                    Some(pb::breaker::Mode::Consecutive(pb::Consecutive {
                        failures: 3,
                    }))
                } else {
                    ratio_mode
                },
                break_duration: Some(ms(1_000)),
                slow: Some(slow),
                ..Default::default()
            }),
            lease: lease_max.map(|max| pb::Lease {
                default_lease: Some(ms(max)),
                max_lease: Some(ms(max)),
                expired_outcome: 0,
            }),
            ..Default::default()
        }),
        default: false,
    };
    let slow = |duration: Option<u64>, ratio: f64| pb::Slow {
        duration: duration.map(ms),
        ratio,
    };
    let ratio_toml = "mode = \"ratio\", failure_ratio = 0.5, minimum_throughput = 10, sampling_window = \"10s\", break = \"1s\"";
    let dir = tempfile::tempdir().expect("a temp dir");
    // (field, what is wrong, the rule on the wire, the rule's breaker and lease in TOML).
    let cases = [
        (
            "slow",
            "slow in consecutive mode",
            slow_rule(true, slow(Some(500), 0.5), None),
            "breaker = { mode = \"consecutive\", failures = 3, break = \"1s\", slow = { duration = \"500ms\", ratio = 0.5 } }".to_owned(),
        ),
        (
            "slow.duration",
            "duration missing",
            slow_rule(false, slow(None, 0.5), None),
            format!("breaker = {{ {ratio_toml}, slow = {{ ratio = 0.5 }} }}"),
        ),
        (
            "slow.duration",
            "duration 0",
            slow_rule(false, slow(Some(0), 0.5), None),
            format!("breaker = {{ {ratio_toml}, slow = {{ duration = \"0s\", ratio = 0.5 }} }}"),
        ),
        (
            "slow.duration",
            "duration above lease.max",
            slow_rule(false, slow(Some(2_000), 0.5), Some(1_000)),
            format!("breaker = {{ {ratio_toml}, slow = {{ duration = \"2s\", ratio = 0.5 }} }}\nlease = {{ default = \"1s\", max = \"1s\" }}"),
        ),
        (
            "slow.ratio",
            "ratio 0 (missing on the wire)",
            slow_rule(false, slow(Some(500), 0.0), None),
            format!("breaker = {{ {ratio_toml}, slow = {{ duration = \"500ms\" }} }}"),
        ),
        (
            "slow.ratio",
            "ratio 1.5",
            slow_rule(false, slow(Some(500), 1.5), None),
            format!("breaker = {{ {ratio_toml}, slow = {{ duration = \"500ms\", ratio = 1.5 }} }}"),
        ),
        (
            "slow.ratio",
            "ratio 0.0000001",
            slow_rule(false, slow(Some(500), 0.000_000_1), None),
            format!("breaker = {{ {ratio_toml}, slow = {{ duration = \"500ms\", ratio = 0.0000001 }} }}"),
        ),
    ];
    for (i, (field, what, rule, toml)) in cases.into_iter().enumerate() {
        let status = set_policy(&mut admin, rule).await.expect_err(what);
        assert_eq!(status.code(), Code::InvalidArgument, "{what}: {status:?}");
        let wire = format!("policy.breaker.{field}");
        assert!(
            status.message().contains(&wire),
            "{what}: SetPolicy names {wire}: {:?}",
            status.message()
        );
        assert_eq!(
            policies(&mut admin).await,
            before,
            "{what}: nothing changed"
        );

        let path = dir.path().join(format!("slow-{i}.toml"));
        let text = format!("[[rule]]\nmatch = \"s/*\"\n{toml}\n");
        std::fs::write(&path, text).expect("config written");
        let err = crate::harness::refused_start(
            &["--config", path.to_str().expect("a UTF-8 path")],
            None,
        )
        .await;
        let named = format!("breaker.{field}");
        for word in ["rule 1", "s/*", named.as_str()] {
            assert!(
                err.contains(word),
                "{what}: the config error names {word:?}: {err}"
            );
        }
    }

    // At its bounds (duration = lease.max, ratio 1) and a usual one: accepted,
    // read back as set by SetPolicy's answer and ListPolicies.
    for (duration, ratio, lease_max) in [(300_000, 1.0, None), (750, 0.25, Some(60_000))] {
        let rule = slow_rule(false, slow(Some(duration), ratio), lease_max);
        let what = format!("{duration} ms, {ratio}");
        set_policy(&mut admin, rule).await.expect(&what);
        let listed = policies(&mut admin).await;
        let got = listed
            .rules
            .iter()
            .find(|r| r.r#match == "s/*")
            .and_then(|r| r.policy.as_ref())
            .and_then(|p| p.breaker.as_ref())
            .and_then(|b| b.slow)
            .expect("the rule's slow reads back");
        assert_eq!(got, slow(Some(duration), ratio), "{what}");
    }
}

/// D1-D4, Y2: `enforce` is a bool. A config file whose rule says
/// `enforce = "no"` (or a number) is refused at start-up naming the rule
/// and `enforce`; `enforce = false` is a shadow policy, accepted by
/// `SetPolicy` and read back as set, in its answer and by `ListPolicies`,
/// and `enforce = true` (the default) reads back absent.
#[tokio::test]
async fn enforce_is_a_bool_and_a_shadow_policy_reads_back_as_set() {
    use crate::admin::{policies, set_policy};

    let dir = tempfile::tempdir().expect("a temp dir");
    for (i, value) in ["\"no\"", "0", "\"false\""].into_iter().enumerate() {
        let path = dir.path().join(format!("enforce-{i}.toml"));
        let text = format!(
            "[[rule]]\nmatch = \"s/*\"\nbreaker = {{ mode = \"consecutive\", failures = 3, break = \"1s\" }}\nenforce = {value}\n"
        );
        std::fs::write(&path, text).expect("config written");
        let err = crate::harness::refused_start(
            &["--config", path.to_str().expect("a UTF-8 path")],
            None,
        )
        .await;
        assert!(
            err.contains("enforce"),
            "enforce = {value}: the config error names enforce: {err}"
        );
    }

    let server = Server::manual(Some(CONFIG)).await;
    let mut admin = server.admin().await;
    for enforce in [Some(false), Some(true), None] {
        let set = set_policy(
            &mut admin,
            pb::PolicyRule {
                r#match: "s/*".into(),
                policy: Some(pb::Policy {
                    enforce,
                    ..Default::default()
                }),
                default: false,
            },
        )
        .await
        .unwrap_or_else(|e| panic!("enforce = {enforce:?} is a valid policy: {e:?}"));
        // Absent means true, and true is sent back absent.
        let want = enforce.filter(|e| !e);
        assert_eq!(
            set.policy.and_then(|p| p.enforce),
            want,
            "SetPolicy answers enforce = {enforce:?}"
        );
        let listed = policies(&mut admin).await;
        let shown = listed
            .rules
            .iter()
            .find(|r| r.r#match == "s/*")
            .and_then(|r| r.policy.as_ref())
            .and_then(|p| p.enforce);
        assert_eq!(shown, want, "ListPolicies shows enforce = {enforce:?}");
    }
}

/// CX20, Y2: an adaptive limiter with `min` or `max` of 0 or missing,
/// `max` below `min`, `initial` outside `[min, max]`, or a setting of
/// another kind is refused by `SetPolicy` (naming
/// `policy.limiter.adaptive.<field>`, the rules in force unchanged, E3) and
/// by the config file at start-up (naming the rule and `limiter.<field>`).
#[tokio::test]
async fn adaptive_limits_out_of_range_are_refused_naming_the_field() {
    use crate::admin::{policies, set_policy};

    let server = Server::manual(Some(CONFIG)).await;
    let mut admin = server.admin().await;
    let before = policies(&mut admin).await;
    let rule = |min: u32, max: u32, initial: Option<u32>| pb::PolicyRule {
        r#match: "a/*".into(),
        policy: Some(pb::Policy {
            limiter: Some(pb::Limiter {
                kind: Some(pb::limiter::Kind::Adaptive(pb::Adaptive {
                    min,
                    max,
                    initial,
                })),
                ..Default::default()
            }),
            ..Default::default()
        }),
        default: false,
    };
    let dir = tempfile::tempdir().expect("a temp dir");
    // (field, what is wrong, min, max, initial, the limiter in TOML).
    type Case = (
        &'static str,
        &'static str,
        u32,
        u32,
        Option<u32>,
        &'static str,
    );
    let cases: [Case; 6] = [
        ("min", "min = 0", 0, 10, None, "min = 0, max = 10"),
        ("max", "max = 0", 1, 0, None, "min = 1, max = 0"),
        ("max", "max below min", 5, 4, None, "min = 5, max = 4"),
        (
            "initial",
            "initial above max",
            2,
            4,
            Some(5),
            "min = 2, max = 4, initial = 5",
        ),
        (
            "initial",
            "initial below min",
            2,
            4,
            Some(1),
            "min = 2, max = 4, initial = 1",
        ),
        ("min", "min missing", 0, 4, None, "max = 4"),
    ];
    for (i, (field, what, min, max, initial, toml)) in cases.into_iter().enumerate() {
        let status = set_policy(&mut admin, rule(min, max, initial))
            .await
            .expect_err(what);
        assert_eq!(status.code(), Code::InvalidArgument, "{what}: {status:?}");
        let wire = format!("policy.limiter.adaptive.{field}");
        assert!(
            status.message().contains(&wire),
            "{what}: SetPolicy names {wire}: {:?}",
            status.message()
        );
        assert_eq!(
            policies(&mut admin).await,
            before,
            "{what}: nothing changed"
        );

        let path = dir.path().join(format!("adaptive-{i}.toml"));
        let text =
            format!("[[rule]]\nmatch = \"a/*\"\nlimiter = {{ kind = \"adaptive\", {toml} }}\n");
        std::fs::write(&path, text).expect("config written");
        let err = crate::harness::refused_start(
            &["--config", path.to_str().expect("a UTF-8 path")],
            None,
        )
        .await;
        let named = format!("limiter.{field}");
        for word in ["rule 1", "a/*", named.as_str()] {
            assert!(
                err.contains(word),
                "{what}: the config error names {word:?}: {err}"
            );
        }
    }
    // A setting of another kind is not silently ignored.
    let path = dir.path().join("adaptive-permits.toml");
    std::fs::write(
        &path,
        "[[rule]]\nmatch = \"a/*\"\nlimiter = { kind = \"adaptive\", min = 1, max = 4, permits = 3 }\n",
    )
    .expect("config written");
    let err =
        crate::harness::refused_start(&["--config", path.to_str().expect("a UTF-8 path")], None)
            .await;
    assert!(err.contains("limiter.permits"), "{err}");
}

/// CX20: an adaptive limiter is accepted by `SetPolicy` and reads back as
/// set (a missing `initial` as `min`), in its answer and by
/// `ListPolicies`; a key under it reads `adaptive_limit` = `initial` and
/// `limit` = `max`.
#[tokio::test]
async fn an_adaptive_limiter_reads_back_as_set() {
    use crate::admin::{policies, set_policy};

    let server = Server::manual(Some(CONFIG)).await;
    let mut admin = server.admin().await;
    for (sent, shown) in [
        (
            pb::Adaptive {
                min: 2,
                max: 40,
                initial: Some(7),
            },
            pb::Adaptive {
                min: 2,
                max: 40,
                initial: Some(7),
            },
        ),
        (
            pb::Adaptive {
                min: 3,
                max: 3,
                initial: None,
            },
            pb::Adaptive {
                min: 3,
                max: 3,
                initial: Some(3),
            },
        ),
    ] {
        let what = format!("{sent:?}");
        let set = set_policy(
            &mut admin,
            pb::PolicyRule {
                r#match: "a/*".into(),
                policy: Some(pb::Policy {
                    limiter: Some(pb::Limiter {
                        kind: Some(pb::limiter::Kind::Adaptive(sent)),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                default: false,
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{what} is a valid limiter: {e:?}"));
        let kind = |p: Option<&pb::Policy>| p.and_then(|p| p.limiter.as_ref()).and_then(|l| l.kind);
        assert_eq!(
            kind(set.policy.as_ref()),
            Some(pb::limiter::Kind::Adaptive(shown)),
            "SetPolicy answers {what} as set"
        );
        let listed = policies(&mut admin).await;
        let rule = listed.rules.iter().find(|r| r.r#match == "a/*");
        assert_eq!(
            kind(rule.and_then(|r| r.policy.as_ref())),
            Some(pb::limiter::Kind::Adaptive(shown)),
            "ListPolicies shows {what}"
        );
    }
    let mut c = Clients::new(&server).await;
    let _ticket = c.ticket("a/one", None).await;
    let state = c.get("a/one").await;
    assert_eq!((state.adaptive_limit, state.limit, state.free), (3, 3, 2));
}

//! The operator's Admin RPCs against a real server (docs/admin-api.md):
//! ListKeys (filters, order, paging, B6), SetPolicy / DeletePolicy /
//! ListPolicies (placement, validation as Y2, structured round trip, Y4),
//! and the per-key statistics of KeyState after a scripted scenario on the
//! manual clock. Asynchronous conditions are polled with a deadline.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use fusebox::proto::v1 as pb;
use tonic::transport::Channel;
use tonic::{Code, Status};

use crate::harness::{eventually, millis, ms, steer, Server};

pub type Fusebox = pb::fusebox_client::FuseboxClient<Channel>;
pub type Admin = pb::admin_client::AdminClient<Channel>;

/// Safety net for conditions reached asynchronously.
pub const LIMIT: Duration = Duration::from_secs(10);

pub fn request(key: &str) -> pb::AcquireRequest {
    pb::AcquireRequest {
        key: key.into(),
        permits: None,
        max_wait: None,
        lease: None,
        ..Default::default()
    }
}

/// A status check of `key` (`permits: 0`, P2a).
pub fn status_check(key: &str) -> pb::AcquireRequest {
    pb::AcquireRequest {
        permits: Some(0),
        ..request(key)
    }
}

/// An acquire of one permit of `key`, said explicitly.
pub fn one_permit(key: &str) -> pb::AcquireRequest {
    pb::AcquireRequest {
        permits: Some(1),
        ..request(key)
    }
}

pub async fn acquire(c: &mut Fusebox, r: pb::AcquireRequest) -> pb::AcquireResponse {
    let key = r.key.clone();
    c.acquire(r)
        .await
        .unwrap_or_else(|s| panic!("Acquire {key:?}: {s:?}"))
        .into_inner()
}

/// A ticket for `key`: the reply must be GRANTED or PROBE.
pub async fn ticket(c: &mut Fusebox, key: &str) -> String {
    let reply = acquire(c, request(key)).await;
    assert!(
        reply.decision == pb::Decision::Granted as i32
            || reply.decision == pb::Decision::Probe as i32,
        "{key}: {reply:?}"
    );
    assert!(!reply.ticket.is_empty(), "{reply:?}");
    reply.ticket
}

pub async fn complete(c: &mut Fusebox, ticket: &str, outcome: pb::Outcome) -> pb::CompleteResponse {
    c.complete(pb::CompleteRequest {
        ticket: ticket.into(),
        outcome: outcome as i32,
        cost: None,
    })
    .await
    .unwrap_or_else(|s| panic!("Complete: {s:?}"))
    .into_inner()
}

/// A Complete (SUCCESS) of `ticket`, which must be refused as NOT_FOUND:
/// the status.
pub async fn complete_not_found(c: &mut Fusebox, ticket: &str) -> Status {
    let status = c
        .complete(pb::CompleteRequest {
            ticket: ticket.into(),
            outcome: pb::Outcome::Success as i32,
            cost: None,
        })
        .await
        .expect_err("the ticket is not found");
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    status
}

/// The answer of the waiting Acquire that `task` runs, which must be
/// GRANTED within `limit`.
pub async fn granted_within(
    task: tokio::task::JoinHandle<Result<tonic::Response<pb::AcquireResponse>, Status>>,
    limit: Duration,
) -> pb::AcquireResponse {
    let served = tokio::time::timeout(limit, task)
        .await
        .expect("the waiter is served in time")
        .expect("the task")
        .expect("Acquire answers")
        .into_inner();
    assert_eq!(served.decision, pb::Decision::Granted as i32, "{served:?}");
    served
}

/// Checks that `reply` was DENIED for `reason`.
pub fn assert_denied(reply: &pb::AcquireResponse, reason: pb::Reason) {
    assert_eq!(
        (reply.decision, reply.reason),
        (pb::Decision::Denied as i32, reason as i32),
        "{reply:?}"
    );
}

/// One acquire and its outcome; returns the phase after.
pub async fn call(c: &mut Fusebox, key: &str, outcome: pb::Outcome) -> pb::Phase {
    let t = ticket(c, key).await;
    let done = complete(c, &t, outcome).await;
    assert!(!done.stale, "{key}: {done:?}");
    pb::Phase::try_from(done.phase).expect("a phase")
}

/// Moves the manual clock; returns its reading.
pub async fn advance(server: &Server, by: u64) -> u64 {
    advance_clock(&mut server.clock().await, by).await
}

/// Moves the manual clock through `clock`; returns its reading.
pub async fn advance_clock(clock: &mut pb::clock_client::ClockClient<Channel>, by: u64) -> u64 {
    let r = clock
        .advance(pb::AdvanceRequest { by: Some(ms(by)) })
        .await
        .expect("Advance answers")
        .into_inner();
    millis(r.now).expect("a reading")
}

pub async fn get(admin: &mut Admin, key: &str) -> pb::KeyState {
    admin
        .get_key(pb::GetKeyRequest { key: key.into() })
        .await
        .unwrap_or_else(|s| panic!("GetKey {key:?}: {s:?}"))
        .into_inner()
}

pub async fn list(
    admin: &mut Admin,
    prefix: &str,
    phases: &[pb::Phase],
    page_size: i32,
    page_token: &str,
) -> Result<pb::ListKeysResponse, Status> {
    admin
        .list_keys(pb::ListKeysRequest {
            prefix: prefix.into(),
            phases: phases.iter().map(|p| *p as i32).collect(),
            page_size,
            page_token: page_token.into(),
        })
        .await
        .map(|r| r.into_inner())
}

/// Every key of a listing, page after page, asserting the pages' sizes.
pub async fn list_all(
    admin: &mut Admin,
    prefix: &str,
    phases: &[pb::Phase],
    page_size: i32,
) -> Vec<String> {
    let mut all = Vec::new();
    let mut token = String::new();
    loop {
        let page = list(admin, prefix, phases, page_size, &token)
            .await
            .expect("ListKeys answers");
        assert!(page.keys.len() <= page_size as usize, "{page:?}");
        all.extend(page.keys.into_iter().map(|k| k.key));
        if page.next_page_token.is_empty() {
            return all;
        }
        token = page.next_page_token;
    }
}

fn names(page: &pb::ListKeysResponse) -> Vec<&str> {
    page.keys.iter().map(|k| k.key.as_str()).collect()
}

pub async fn policies(admin: &mut Admin) -> pb::ListPoliciesResponse {
    admin
        .list_policies(pb::ListPoliciesRequest {})
        .await
        .expect("ListPolicies answers")
        .into_inner()
}

pub async fn set_policy(admin: &mut Admin, rule: pb::PolicyRule) -> Result<pb::PolicyRule, Status> {
    admin
        .set_policy(pb::SetPolicyRequest { rule: Some(rule) })
        .await
        .map(|r| r.into_inner())
}

pub fn consecutive(failures: u32, break_ms: u64) -> pb::Breaker {
    pb::Breaker {
        mode: Some(pb::breaker::Mode::Consecutive(pb::Consecutive { failures })),
        break_duration: Some(ms(break_ms)),
        ..pb::Breaker::default()
    }
}

pub fn concurrency(permits: u32) -> pb::Limiter {
    pb::Limiter {
        kind: Some(pb::limiter::Kind::Concurrency(pb::Concurrency { permits })),
        ..pb::Limiter::default()
    }
}

pub fn rule(
    pattern: &str,
    breaker: Option<pb::Breaker>,
    limiter: Option<pb::Limiter>,
) -> pb::PolicyRule {
    pb::PolicyRule {
        r#match: pattern.into(),
        policy: Some(pb::Policy {
            breaker,
            limiter,
            lease: None,
            ..Default::default()
        }),
        default: false,
    }
}

/// The lease settings every policy shows when it names none (Y3).
pub fn default_lease() -> pb::Lease {
    pb::Lease {
        default_lease: Some(ms(30_000)),
        max_lease: Some(ms(300_000)),
        expired_outcome: pb::Outcome::Ignored as i32,
    }
}

/// A consecutive breaker as ListPolicies shows it: Y3 defaults filled in.
pub fn shown_consecutive(failures: u32, break_ms: u64) -> pb::Breaker {
    pb::Breaker {
        multiplier: Some(1.0),
        probe_lease: Some(ms(break_ms)),
        ..consecutive(failures, break_ms)
    }
}

fn phase(state: &pb::KeyState) -> pb::Phase {
    pb::Phase::try_from(state.phase).expect("a phase")
}

/// The status of a call refused as an invalid argument naming `field`.
pub fn assert_invalid<T: std::fmt::Debug>(result: Result<T, Status>, field: &str) -> Status {
    let status = result.expect_err("refused");
    assert_eq!(status.code(), Code::InvalidArgument, "{field}: {status:?}");
    assert!(
        status.message().contains(field),
        "the message names {field}: {:?}",
        status.message()
    );
    status
}

// ---------------------------------------------------------------------------
// ListKeys.

const LIST_CONFIG: &str = r#"
[[rule]]
match = "svc/*"
breaker = { mode = "consecutive", failures = 1, break = "1s" }
"#;

/// ListKeys filters by prefix and by phase and answers in key order,
/// whatever order the keys were made in.
#[tokio::test]
async fn list_keys_filters_by_prefix_and_phase_in_key_order() {
    let server = Server::manual(Some(LIST_CONFIG)).await;
    let mut c = server.fusebox().await;
    let mut admin = server.admin().await;
    for key in ["svc/c", "svc/a/1", "other/x", "svc/b", "svc/a", "svc/d"] {
        call(&mut c, key, pb::Outcome::Success).await;
    }
    assert_eq!(
        call(&mut c, "svc/b", pb::Outcome::Failure).await,
        pb::Phase::Open
    );
    steer(&mut admin, true, None, "svc/c", "maintenance")
        .await
        .expect("Isolate answers");
    let t = ticket(&mut c, "svc/d").await;
    complete(&mut c, &t, pb::Outcome::Failure).await;
    advance(&server, 1000).await;
    let probe = acquire(&mut c, request("svc/d")).await;
    assert_eq!(probe.decision, pb::Decision::Probe as i32, "{probe:?}");

    let all = list(&mut admin, "", &[], 0, "").await.expect("ListKeys");
    assert_eq!(
        names(&all),
        ["other/x", "svc/a", "svc/a/1", "svc/b", "svc/c", "svc/d"]
    );
    assert!(all.next_page_token.is_empty(), "one page: {all:?}");
    let svc = list(&mut admin, "svc/", &[], 0, "")
        .await
        .expect("ListKeys");
    assert_eq!(names(&svc), ["svc/a", "svc/a/1", "svc/b", "svc/c", "svc/d"]);
    let a = list(&mut admin, "svc/a", &[], 0, "")
        .await
        .expect("ListKeys");
    assert_eq!(names(&a), ["svc/a", "svc/a/1"]);
    let none = list(&mut admin, "nothing/", &[], 0, "")
        .await
        .expect("ListKeys");
    assert!(
        none.keys.is_empty() && none.next_page_token.is_empty(),
        "{none:?}"
    );

    let cases: [(&[pb::Phase], &[&str]); 5] = [
        (&[pb::Phase::Open], &["svc/b"]),
        (&[pb::Phase::Isolated], &["svc/c"]),
        (&[pb::Phase::HalfOpen], &["svc/d"]),
        (&[pb::Phase::Closed], &["svc/a", "svc/a/1"]),
        (&[pb::Phase::Isolated, pb::Phase::Open], &["svc/b", "svc/c"]),
    ];
    for (phases, expected) in cases {
        let page = list(&mut admin, "svc/", phases, 0, "")
            .await
            .expect("ListKeys");
        assert_eq!(names(&page), expected, "phases {phases:?}");
        for state in &page.keys {
            assert!(phases.contains(&phase(state)), "{state:?}");
        }
    }

    // Each listed state is what GetKey reads at the same (manual) time.
    for state in &all.keys {
        assert_eq!(state, &get(&mut admin, &state.key).await);
    }

    // A phase that is not one is refused, naming the field.
    for bad in [pb::Phase::Unspecified as i32, 99] {
        let result = admin
            .list_keys(pb::ListKeysRequest {
                phases: vec![bad],
                ..pb::ListKeysRequest::default()
            })
            .await;
        assert_invalid(result, "phases");
    }
    assert_invalid(list(&mut admin, "a\u{7}", &[], 0, "").await, "prefix");
    assert_invalid(
        list(&mut admin, &"p".repeat(257), &[], 0, "").await,
        "prefix",
    );
}

/// Paging visits every key exactly once, in order; keys made while paging
/// after the cursor are seen, keys made before it are not (the cursor is a
/// key, not an offset); filters apply across pages.
#[tokio::test]
async fn list_keys_pages_cover_every_key_once_in_order() {
    let server = Server::manual(Some(LIST_CONFIG)).await;
    let admin = server.admin().await;
    let mut expected = BTreeSet::new();
    let mut tasks = Vec::new();
    for part in 0..5 {
        let mut c = server.fusebox().await;
        tasks.push(tokio::spawn(async move {
            let mut made = Vec::new();
            for i in (part..250).step_by(5) {
                // Made out of order on purpose: the order is the key's.
                let key = format!("svc/{:03}", (i * 7919) % 250);
                let outcome = if i % 10 == 0 {
                    pb::Outcome::Failure
                } else {
                    pb::Outcome::Success
                };
                call(&mut c, &key, outcome).await;
                made.push(key);
            }
            made
        }));
    }
    for task in tasks {
        expected.extend(task.await.expect("a task"));
    }
    let mut c = server.fusebox().await;
    call(&mut c, "zzz/after", pb::Outcome::Success).await;
    call(&mut c, "aaa/before", pb::Outcome::Success).await;
    let expected: Vec<String> = expected.into_iter().collect();
    assert_eq!(expected.len(), 250);

    for size in [1, 7, 100, 249, 250, 1000] {
        let mut admin = admin.clone();
        let got = list_all(&mut admin, "svc/", &[], size).await;
        assert_eq!(got, expected, "page size {size}");
    }

    // The phase filter applies across pages.
    let mut admin = admin.clone();
    let open = list_all(&mut admin, "svc/", &[pb::Phase::Open], 3).await;
    let expected_open: Vec<String> = {
        let mut a = admin.clone();
        let mut v = Vec::new();
        for key in &expected {
            if get(&mut a, key).await.phase == pb::Phase::Open as i32 {
                v.push(key.clone());
            }
        }
        v
    };
    assert_eq!(expected_open.len(), 25, "every 10th call failed");
    assert_eq!(open, expected_open);

    // Keys made while paging: after the cursor they appear, before it they
    // do not; no key present throughout is repeated or skipped.
    let first = list(&mut admin, "svc/", &[], 10, "")
        .await
        .expect("ListKeys");
    assert_eq!(
        names(&first),
        expected[..10]
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
    );
    call(&mut c, "svc/000a", pb::Outcome::Success).await; // before the cursor
    call(&mut c, "svc/999", pb::Outcome::Success).await; // after it
    let mut rest = Vec::new();
    let mut token = first.next_page_token.clone();
    while !token.is_empty() {
        let page = list(&mut admin, "svc/", &[], 10, &token)
            .await
            .expect("ListKeys");
        rest.extend(page.keys.into_iter().map(|k| k.key));
        token = page.next_page_token;
    }
    let mut want: Vec<String> = expected[10..].to_vec();
    want.push("svc/999".into());
    assert_eq!(rest, want);
}

/// page_size: 0 means 100, above 1000 is capped at 1000, negative is
/// refused; a token only works with the filters it was made for, and a
/// token that is not one is refused naming page_token. Errors change nothing.
#[tokio::test]
async fn list_keys_page_size_and_token_rules() {
    let server = Server::manual(Some(LIST_CONFIG)).await;
    let mut admin = server.admin().await;
    // Realistic key names, so that a full page is a large message.
    let key = |i: usize| format!("cap/payments.internal.example.com/v1/charges/{i:05}");
    let mut tasks = Vec::new();
    for part in 0..4 {
        let mut c = server.fusebox().await;
        tasks.push(tokio::spawn(async move {
            for i in (part..1050).step_by(4) {
                let t = ticket(&mut c, &key(i)).await;
                complete(&mut c, &t, pb::Outcome::Success).await;
            }
        }));
    }
    for task in tasks {
        task.await.expect("a task");
    }

    let default = list(&mut admin, "cap/", &[], 0, "")
        .await
        .expect("ListKeys");
    assert_eq!(default.keys.len(), 100, "page_size 0 means 100");
    assert_eq!(default.keys[0].key, key(0));
    assert!(!default.next_page_token.is_empty());

    let capped = list(&mut admin, "cap/", &[], 5000, "")
        .await
        .expect("a page of 1000 keys fits in a message");
    assert_eq!(capped.keys.len(), 1000, "page_size above 1000 means 1000");
    assert_eq!(capped.keys[999].key, key(999));
    let last = list(&mut admin, "cap/", &[], i32::MAX, &capped.next_page_token)
        .await
        .expect("ListKeys");
    assert_eq!(last.keys.len(), 50);
    assert!(
        last.next_page_token.is_empty(),
        "the last page has no token"
    );
    assert_eq!(list_all(&mut admin, "cap/", &[], 1000).await.len(), 1050);

    assert_invalid(list(&mut admin, "cap/", &[], -1, "").await, "page_size");

    let token = list(&mut admin, "cap/", &[], 10, "")
        .await
        .expect("ListKeys")
        .next_page_token;
    // The same token with another prefix or other phases.
    assert_invalid(
        list(&mut admin, "cap/p", &[], 10, &token).await,
        "page_token",
    );
    assert_invalid(list(&mut admin, "", &[], 10, &token).await, "page_token");
    assert_invalid(
        list(&mut admin, "cap/", &[pb::Phase::Closed], 10, &token).await,
        "page_token",
    );
    // A different page size is fine (AIP-158).
    let next = list(&mut admin, "cap/", &[], 3, &token)
        .await
        .expect("ListKeys");
    assert_eq!(names(&next), [key(10), key(11), key(12)]);
    // Phases are a set: their order and repeats do not matter.
    let phases = [pb::Phase::Closed, pb::Phase::Open];
    let token = list(&mut admin, "cap/", &phases, 10, "")
        .await
        .expect("ListKeys")
        .next_page_token;
    let same = [pb::Phase::Open, pb::Phase::Closed, pb::Phase::Open];
    let next = list(&mut admin, "cap/", &same, 2, &token)
        .await
        .expect("the same phases in another order");
    assert_eq!(names(&next), [key(10), key(11)]);
    assert_invalid(
        list(&mut admin, "cap/", &[pb::Phase::Open], 2, &token).await,
        "page_token",
    );
    // Tokens that are not tokens.
    for garbage in ["garbage", "abc", "zz", "00", "ffff", &"0".repeat(600)] {
        assert_invalid(
            list(&mut admin, "cap/", &[], 10, garbage).await,
            "page_token",
        );
    }
    // Nothing changed.
    assert_eq!(list_all(&mut admin, "", &[], 1000).await.len(), 1050);
}

/// B6: listing never makes a key and never moves one: an OPEN key past its
/// deadline lists as OPEN (open_remaining zero) until an Acquire arrives.
#[tokio::test]
async fn list_keys_never_creates_or_moves_keys() {
    let server = Server::manual(Some(LIST_CONFIG)).await;
    let mut c = server.fusebox().await;
    let mut admin = server.admin().await;
    assert_eq!(
        call(&mut c, "svc/open", pb::Outcome::Failure).await,
        pb::Phase::Open
    );
    advance(&server, 5_000).await;
    for _ in 0..3 {
        let page = list(&mut admin, "svc/", &[], 0, "")
            .await
            .expect("ListKeys");
        assert_eq!(names(&page), ["svc/open"]);
        let state = &page.keys[0];
        assert_eq!(phase(state), pb::Phase::Open, "{state:?}");
        assert_eq!(millis(state.open_remaining), Some(0));
        assert_eq!(state.half_open_attempts, 0);
        let open = list(&mut admin, "", &[pb::Phase::Open], 0, "")
            .await
            .expect("ListKeys");
        assert_eq!(names(&open), ["svc/open"]);
        let half = list(&mut admin, "", &[pb::Phase::HalfOpen], 0, "")
            .await
            .expect("ListKeys");
        assert!(half.keys.is_empty(), "{half:?}");
    }
    // Reading a key that was never used makes nothing either.
    let ghost = get(&mut admin, "svc/ghost").await;
    assert_eq!(phase(&ghost), pb::Phase::Closed);
    let page = list(&mut admin, "", &[], 0, "").await.expect("ListKeys");
    assert_eq!(names(&page), ["svc/open"]);
    // A status check (n = 0) makes nothing.
    let check = acquire(&mut c, status_check("svc/checked")).await;
    assert_eq!(check.decision, pb::Decision::Granted as i32);
    let page = list(&mut admin, "", &[], 0, "").await.expect("ListKeys");
    assert_eq!(names(&page), ["svc/open"]);

    // Only a request moves the breaker.
    let probe = acquire(&mut c, request("svc/open")).await;
    assert_eq!(probe.decision, pb::Decision::Probe as i32, "{probe:?}");
    let page = list(&mut admin, "svc/", &[], 0, "")
        .await
        .expect("ListKeys");
    assert_eq!(phase(&page.keys[0]), pb::Phase::HalfOpen);
    assert_eq!(page.keys[0].half_open_attempts, 1);
}

// ---------------------------------------------------------------------------
// SetPolicy, DeletePolicy, ListPolicies.

const POLICY_CONFIG: &str = r#"
[[rule]]
match = "a/*"
breaker = { mode = "consecutive", failures = 3, break = "1s" }

[[rule]]
match = "b/*"
limiter = { kind = "concurrency", permits = 2 }

[default]
breaker = { mode = "consecutive", failures = 10, break = "10s" }
"#;

fn matches(p: &pb::ListPoliciesResponse) -> Vec<&str> {
    p.rules.iter().map(|r| r.r#match.as_str()).collect()
}

/// A new rule goes last, a rule with the same match is replaced where it
/// stands, the default is replaced (never deleted), DeletePolicy removes a
/// rule or answers NOT_FOUND; keys follow the rules in force.
#[tokio::test]
async fn set_policy_adds_replaces_in_place_and_delete_policy_removes() {
    let server = Server::manual(Some(POLICY_CONFIG)).await;
    let mut admin = server.admin().await;
    let mut c = server.fusebox().await;
    let start = policies(&mut admin).await;
    assert_eq!(matches(&start), ["a/*", "b/*"]);
    assert_eq!(
        start.rules[0].policy,
        Some(pb::Policy {
            breaker: Some(shown_consecutive(3, 1000)),
            limiter: None,
            lease: Some(default_lease()),
            ..Default::default()
        })
    );
    let default = start.default.clone().expect("a default");
    assert!(default.default && default.r#match.is_empty(), "{default:?}");
    assert_eq!(
        default.policy.expect("a policy").breaker,
        Some(shown_consecutive(10, 10_000))
    );

    // Added last.
    let set = set_policy(&mut admin, rule("c/*", Some(consecutive(1, 500)), None))
        .await
        .expect("SetPolicy answers");
    assert_eq!(
        set,
        pb::PolicyRule {
            r#match: "c/*".into(),
            policy: Some(pb::Policy {
                breaker: Some(shown_consecutive(1, 500)),
                limiter: None,
                lease: Some(default_lease()),
                ..Default::default()
            }),
            default: false,
        },
        "SetPolicy answers the rule as it is now in force"
    );
    let now = policies(&mut admin).await;
    assert_eq!(matches(&now), ["a/*", "b/*", "c/*"]);
    assert_eq!(now.rules[2], set);
    assert_eq!(
        call(&mut c, "c/x", pb::Outcome::Failure).await,
        pb::Phase::Open
    );

    // Replaced where it stands.
    let replaced = set_policy(&mut admin, rule("a/*", Some(consecutive(1, 2000)), None))
        .await
        .expect("SetPolicy answers");
    let now = policies(&mut admin).await;
    assert_eq!(matches(&now), ["a/*", "b/*", "c/*"]);
    assert_eq!(now.rules[0], replaced);
    assert_eq!(
        call(&mut c, "a/x", pb::Outcome::Failure).await,
        pb::Phase::Open
    );
    assert_eq!(
        millis(get(&mut admin, "a/x").await.open_remaining),
        Some(2000)
    );

    // An exact rule set later goes after the prefix rule that shadows it:
    // the first match wins (Y1).
    set_policy(&mut admin, rule("a/special", None, Some(concurrency(1))))
        .await
        .expect("SetPolicy answers");
    assert_eq!(
        matches(&policies(&mut admin).await),
        ["a/*", "b/*", "c/*", "a/special"]
    );
    assert_eq!(
        get(&mut admin, "a/special").await.limit,
        0,
        "a/* matches first"
    );

    // The default is replaced.
    let mut new_default = rule("", Some(consecutive(2, 3000)), Some(concurrency(5)));
    new_default.default = true;
    let set = set_policy(&mut admin, new_default)
        .await
        .expect("SetPolicy answers");
    assert!(set.default, "{set:?}");
    let now = policies(&mut admin).await;
    assert_eq!(now.default, Some(set));
    assert_eq!(
        matches(&now),
        ["a/*", "b/*", "c/*", "a/special"],
        "rules unchanged"
    );
    assert_eq!(get(&mut admin, "elsewhere").await.limit, 5);
    assert_eq!(
        call(&mut c, "elsewhere", pb::Outcome::Failure).await,
        pb::Phase::Closed
    );
    assert_eq!(
        call(&mut c, "elsewhere", pb::Outcome::Failure).await,
        pb::Phase::Open
    );
    assert_eq!(
        millis(get(&mut admin, "elsewhere").await.open_remaining),
        Some(3000)
    );

    // Deleted.
    admin
        .delete_policy(pb::DeletePolicyRequest {
            r#match: "b/*".into(),
        })
        .await
        .expect("DeletePolicy answers");
    assert_eq!(
        matches(&policies(&mut admin).await),
        ["a/*", "c/*", "a/special"]
    );
    assert_eq!(
        get(&mut admin, "b/x").await.limit,
        5,
        "b/x now takes the default"
    );
    let again = admin
        .delete_policy(pb::DeletePolicyRequest {
            r#match: "b/*".into(),
        })
        .await
        .expect_err("gone");
    assert_eq!(again.code(), Code::NotFound, "{again:?}");
    assert!(again.message().contains("b/*"), "{again:?}");
    let unknown = admin
        .delete_policy(pb::DeletePolicyRequest {
            r#match: "a/".into(),
        })
        .await
        .expect_err("a/ is not a/*");
    assert_eq!(unknown.code(), Code::NotFound, "{unknown:?}");
    assert_invalid(
        admin
            .delete_policy(pb::DeletePolicyRequest {
                r#match: String::new(),
            })
            .await,
        "match",
    );
    assert_eq!(
        matches(&policies(&mut admin).await),
        ["a/*", "c/*", "a/special"]
    );
}

/// Policies are structured messages: every breaker mode and limiter kind,
/// with every setting, comes back from ListPolicies exactly as SetPolicy
/// answered it, with the Y3 defaults filled in.
#[tokio::test]
async fn structured_policies_round_trip_through_list_policies() {
    let server = Server::manual(None).await;
    let mut admin = server.admin().await;
    let ratio = pb::Breaker {
        mode: Some(pb::breaker::Mode::Ratio(pb::Ratio {
            failure_ratio: 0.25,
            minimum_throughput: 20,
            sampling_window: Some(ms(10_000)),
        })),
        break_duration: Some(ms(5_000)),
        multiplier: Some(2.0),
        max_break: Some(ms(60_000)),
        probe_lease: Some(ms(1_500)),
        ..Default::default()
    };
    let lease = pb::Lease {
        default_lease: Some(ms(2_000)),
        max_lease: Some(ms(9_000)),
        expired_outcome: pb::Outcome::Failure as i32,
    };
    let limiters = [
        pb::limiter::Kind::Concurrency(pb::Concurrency { permits: 64 }),
        pb::limiter::Kind::TokenBucket(pb::TokenBucket {
            capacity: 10,
            refill: 2,
            period: Some(ms(250)),
        }),
        pb::limiter::Kind::FixedWindow(pb::FixedWindow {
            permits: 100,
            window: Some(ms(1_000)),
        }),
        pb::limiter::Kind::SlidingWindow(pb::SlidingWindow {
            permits: 100,
            window: Some(ms(1_000)),
            segments: 10,
        }),
    ];
    let mut sent = Vec::new();
    for (i, kind) in limiters.into_iter().enumerate() {
        let r = pb::PolicyRule {
            r#match: format!("kind{i}/*"),
            policy: Some(pb::Policy {
                breaker: Some(ratio),
                limiter: Some(pb::Limiter {
                    kind: Some(kind),
                    queue_limit: 7,
                    order: pb::Order::NewestFirst as i32,
                }),
                lease: Some(lease),
                ..Default::default()
            }),
            default: false,
        };
        let answered = set_policy(&mut admin, r.clone())
            .await
            .expect("SetPolicy answers");
        assert_eq!(
            answered, r,
            "every setting was given: it comes back as sent"
        );
        sent.push(answered);
    }
    // Left out: no breaker, no limiter, lease defaults; order oldest_first.
    let bare = set_policy(&mut admin, rule("bare", None, Some(concurrency(3))))
        .await
        .expect("SetPolicy answers");
    assert_eq!(
        bare.policy,
        Some(pb::Policy {
            breaker: None,
            limiter: Some(pb::Limiter {
                order: pb::Order::OldestFirst as i32,
                ..concurrency(3)
            }),
            lease: Some(default_lease()),
            ..Default::default()
        })
    );
    sent.push(bare);
    // A finer duration is rounded up to the next millisecond (T1).
    let mut fine = consecutive(1, 0);
    fine.break_duration = Some(prost_types::Duration {
        seconds: 1,
        nanos: 1,
    });
    let fine = set_policy(&mut admin, rule("fine", Some(fine), None))
        .await
        .expect("SetPolicy answers");
    assert_eq!(
        fine.policy
            .as_ref()
            .and_then(|p| p.breaker.as_ref())
            .and_then(|b| b.break_duration),
        Some(ms(1_001))
    );
    sent.push(fine);
    let listed = policies(&mut admin).await;
    assert_eq!(listed.rules, sent);
    // The key's state follows: the limit, and the ratio (none yet).
    let state = get(&mut admin, "kind1/x").await;
    assert_eq!((state.limit, state.free), (10, 10));
    assert_eq!(state.failure_ratio, None);
}

/// Y2 over the wire: every invalid policy is refused with INVALID_ARGUMENT
/// naming the wire field, and changes nothing.
#[tokio::test]
async fn every_invalid_policy_is_refused_naming_the_field_and_changes_nothing() {
    let server = Server::manual(Some(POLICY_CONFIG)).await;
    let mut admin = server.admin().await;
    let mut c = server.fusebox().await;
    let before = policies(&mut admin).await;

    let ratio = |failure_ratio: f64, minimum_throughput: u32, window: Option<u64>| pb::Breaker {
        mode: Some(pb::breaker::Mode::Ratio(pb::Ratio {
            failure_ratio,
            minimum_throughput,
            sampling_window: window.map(ms),
        })),
        break_duration: Some(ms(1000)),
        ..pb::Breaker::default()
    };
    let limiter = |kind: pb::limiter::Kind| pb::Limiter {
        kind: Some(kind),
        ..pb::Limiter::default()
    };
    let bucket = |capacity, refill, period: Option<u64>| {
        limiter(pb::limiter::Kind::TokenBucket(pb::TokenBucket {
            capacity,
            refill,
            period: period.map(ms),
        }))
    };
    let sliding = |permits, window: u64, segments| {
        limiter(pb::limiter::Kind::SlidingWindow(pb::SlidingWindow {
            permits,
            window: Some(ms(window)),
            segments,
        }))
    };
    let fixed = |permits, window: Option<u64>| {
        limiter(pb::limiter::Kind::FixedWindow(pb::FixedWindow {
            permits,
            window: window.map(ms),
        }))
    };
    let with_lease = |default: Option<u64>, max: Option<u64>, expired: i32| pb::PolicyRule {
        policy: Some(pb::Policy {
            breaker: None,
            limiter: None,
            lease: Some(pb::Lease {
                default_lease: default.map(ms),
                max_lease: max.map(ms),
                expired_outcome: expired,
            }),
            ..Default::default()
        }),
        ..rule("bad/*", None, None)
    };
    let negative = prost_types::Duration {
        seconds: -1,
        nanos: 0,
    };
    let breaker = |b: pb::Breaker| rule("bad/*", Some(b), None);
    let limited = |l: pb::Limiter| rule("bad/*", None, Some(l));

    let with = |b: pb::Breaker, f: fn(&mut pb::Breaker)| {
        let mut b = b;
        f(&mut b);
        breaker(b)
    };
    let big = prost_types::Duration {
        seconds: 366 * 86_400,
        nanos: 0,
    };
    let bad_nanos = prost_types::Duration {
        seconds: 1,
        nanos: 1_000_000_000,
    };
    let c1 = consecutive(1, 1000);
    #[rustfmt::skip]
    let cases: Vec<(&str, pb::PolicyRule, &str)> = vec![
        // The breaker.
        ("no mode", with(c1, |b| b.mode = None), "policy.breaker.mode"),
        ("zero failures", breaker(consecutive(0, 1000)), "policy.breaker.consecutive.failures"),
        ("no break", with(c1, |b| b.break_duration = None), "policy.breaker.break_duration"),
        ("zero break", breaker(consecutive(1, 0)), "policy.breaker.break_duration"),
        ("negative break", breaker(pb::Breaker { break_duration: Some(negative), ..c1 }), "policy.breaker.break_duration"),
        ("break over 365 days", breaker(pb::Breaker { break_duration: Some(big), ..c1 }), "policy.breaker.break_duration"),
        ("bad nanos", breaker(pb::Breaker { break_duration: Some(bad_nanos), ..c1 }), "policy.breaker.break_duration"),
        ("ratio 0", breaker(ratio(0.0, 1, Some(1000))), "policy.breaker.ratio.failure_ratio"),
        ("ratio above 1", breaker(ratio(1.5, 1, Some(1000))), "policy.breaker.ratio.failure_ratio"),
        ("ratio NaN", breaker(ratio(f64::NAN, 1, Some(1000))), "policy.breaker.ratio.failure_ratio"),
        ("negative ratio", breaker(ratio(-0.5, 1, Some(1000))), "policy.breaker.ratio.failure_ratio"),
        ("zero throughput", breaker(ratio(0.5, 0, Some(1000))), "policy.breaker.ratio.minimum_throughput"),
        ("no window", breaker(ratio(0.5, 1, None)), "policy.breaker.ratio.sampling_window"),
        ("window under 10 ms", breaker(ratio(0.5, 1, Some(9))), "policy.breaker.ratio.sampling_window"),
        ("multiplier under 1", with(c1, |b| b.multiplier = Some(0.5)), "policy.breaker.multiplier"),
        ("multiplier infinite", with(c1, |b| b.multiplier = Some(f64::INFINITY)), "policy.breaker.multiplier"),
        ("max_break under break", with(c1, |b| b.max_break = Some(ms(999))), "policy.breaker.max_break"),
        ("zero probe_lease", with(c1, |b| b.probe_lease = Some(ms(0))), "policy.breaker.probe_lease"),
        // The limiter.
        ("no kind", limited(pb::Limiter::default()), "policy.limiter.kind"),
        ("zero permits", limited(concurrency(0)), "policy.limiter.concurrency.permits"),
        ("zero capacity", limited(bucket(0, 1, Some(100))), "policy.limiter.token_bucket.capacity"),
        ("zero refill", limited(bucket(5, 0, Some(100))), "policy.limiter.token_bucket.refill"),
        ("refill above capacity", limited(bucket(5, 6, Some(100))), "policy.limiter.token_bucket.refill"),
        ("no period", limited(bucket(5, 1, None)), "policy.limiter.token_bucket.period"),
        ("zero period", limited(bucket(5, 1, Some(0))), "policy.limiter.token_bucket.period"),
        ("zero window permits", limited(fixed(0, Some(1000))), "policy.limiter.fixed_window.permits"),
        ("no fixed window", limited(fixed(5, None)), "policy.limiter.fixed_window.window"),
        ("zero fixed window", limited(fixed(5, Some(0))), "policy.limiter.fixed_window.window"),
        ("segments that do not divide", limited(sliding(5, 1000, 3)), "policy.limiter.sliding_window.segments"),
        ("zero segments", limited(sliding(5, 1000, 0)), "policy.limiter.sliding_window.segments"),
        ("zero sliding permits", limited(sliding(0, 1000, 10)), "policy.limiter.sliding_window.permits"),
        ("zero sliding window", limited(sliding(5, 0, 10)), "policy.limiter.sliding_window.window"),
        ("unknown order", limited(pb::Limiter { order: 9, ..concurrency(1) }), "policy.limiter.order"),
        // The lease.
        ("default above max", with_lease(Some(10_000), Some(5_000), 0), "policy.lease.default_lease"),
        ("default above the default max", with_lease(Some(600_000), None, 0), "policy.lease.default_lease"),
        ("zero default", with_lease(Some(0), None, 0), "policy.lease.default_lease"),
        ("zero max", with_lease(None, Some(0), 0), "policy.lease.max_lease"),
        ("expired SUCCESS", with_lease(None, None, pb::Outcome::Success as i32), "policy.lease.expired_outcome"),
        ("expired not an outcome", with_lease(None, None, 42), "policy.lease.expired_outcome"),
        // The rule itself.
        ("empty match", rule("", Some(c1), None), "rule.match"),
        ("star inside", rule("a*b", Some(c1), None), "rule.match"),
        ("two stars", rule("a**", Some(c1), None), "rule.match"),
        ("control character", rule("a\u{1}*", Some(c1), None), "rule.match"),
        ("match too long", rule(&"m".repeat(300), Some(c1), None), "rule.match"),
        ("default with a match", pb::PolicyRule { default: true, ..rule("a/*", None, None) }, "rule.match"),
        ("invalid default", pb::PolicyRule { default: true, ..rule("", Some(consecutive(0, 1000)), None) }, "policy.breaker.consecutive.failures"),
    ];
    for (what, r, field) in cases {
        let result = set_policy(&mut admin, r).await;
        let status = result.expect_err(what);
        assert_eq!(status.code(), Code::InvalidArgument, "{what}: {status:?}");
        assert!(
            status.message().starts_with(field) || status.message().contains(&format!("{field}:")),
            "{what}: the message names {field}: {:?}",
            status.message()
        );
        assert_eq!(
            policies(&mut admin).await,
            before,
            "{what}: nothing changed"
        );
    }
    let missing = admin.set_policy(pb::SetPolicyRequest { rule: None }).await;
    assert_invalid(missing, "rule");
    assert_eq!(policies(&mut admin).await, before);
    // Behaviour unchanged: a/* still trips on the third failure.
    for _ in 0..2 {
        assert_eq!(
            call(&mut c, "a/k", pb::Outcome::Failure).await,
            pb::Phase::Closed
        );
    }
    assert_eq!(
        call(&mut c, "a/k", pb::Outcome::Failure).await,
        pb::Phase::Open
    );
}

/// Y4 through SetPolicy: an existing key adopts the new policy at its next
/// operation; its breaker keeps phase, deadline, run and epoch, and the new
/// thresholds apply to the next outcome. A lowered concurrency limit keeps
/// the permits held; no live ticket is lost.
#[tokio::test]
async fn set_policy_applies_to_existing_keys_as_y4_says() {
    let config = r#"
[[rule]]
match = "y4/*"
breaker = { mode = "consecutive", failures = 3, break = "1s" }

[[rule]]
match = "lim/*"
limiter = { kind = "concurrency", permits = 3 }
"#;
    let server = Server::manual(Some(config)).await;
    let mut admin = server.admin().await;
    let mut c = server.fusebox().await;

    // y4/run: a run of 2, and a ticket issued under the old policy.
    let t1 = ticket(&mut c, "y4/run").await;
    let t2 = ticket(&mut c, "y4/run").await;
    let t3 = ticket(&mut c, "y4/run").await;
    complete(&mut c, &t1, pb::Outcome::Failure).await;
    complete(&mut c, &t2, pb::Outcome::Failure).await;
    // y4/open: open until 1000.
    for _ in 0..3 {
        call(&mut c, "y4/open", pb::Outcome::Failure).await;
    }
    assert_eq!(
        millis(get(&mut admin, "y4/open").await.open_remaining),
        Some(1000)
    );

    set_policy(&mut admin, rule("y4/*", Some(consecutive(5, 4000)), None))
        .await
        .expect("SetPolicy answers");

    let run = get(&mut admin, "y4/run").await;
    assert_eq!(
        (phase(&run), run.consecutive_failures),
        (pb::Phase::Closed, 2),
        "the run stays"
    );
    let open = get(&mut admin, "y4/open").await;
    assert_eq!(phase(&open), pb::Phase::Open, "the phase stays");
    assert_eq!(
        millis(open.open_remaining),
        Some(1000),
        "the deadline stays"
    );

    // The ticket from before the change is of the current epoch; the third
    // failure in a row no longer trips (the new threshold is 5).
    let done = complete(&mut c, &t3, pb::Outcome::Failure).await;
    assert!(!done.stale, "the epoch stays: {done:?}");
    assert_eq!(done.phase, pb::Phase::Closed as i32, "new threshold: 5");
    assert_eq!(
        call(&mut c, "y4/run", pb::Outcome::Failure).await,
        pb::Phase::Closed
    );
    assert_eq!(
        call(&mut c, "y4/run", pb::Outcome::Failure).await,
        pb::Phase::Open
    );
    let run = get(&mut admin, "y4/run").await;
    assert_eq!(run.consecutive_failures, 5);
    assert_eq!(millis(run.open_remaining), Some(4000), "the new break");

    // y4/open: blocked until the old deadline, then a probe; a change while
    // the probe is out keeps it current; its failure opens for the new break.
    advance(&server, 999).await;
    let blocked = acquire(&mut c, request("y4/open")).await;
    assert_eq!(blocked.decision, pb::Decision::Blocked as i32);
    assert_eq!(millis(blocked.retry_after), Some(1));
    advance(&server, 1).await;
    let probe = acquire(&mut c, request("y4/open")).await;
    assert_eq!(
        probe.decision,
        pb::Decision::Probe as i32,
        "the old deadline holds: {probe:?}"
    );
    set_policy(&mut admin, rule("y4/*", Some(consecutive(5, 2000)), None))
        .await
        .expect("SetPolicy answers");
    let done = complete(&mut c, &probe.ticket, pb::Outcome::Failure).await;
    assert!(!done.stale, "the probe stays current: {done:?}");
    assert_eq!(done.phase, pb::Phase::Open as i32);
    assert_eq!(
        millis(get(&mut admin, "y4/open").await.open_remaining),
        Some(2000)
    );

    // A lowered concurrency limit: permits held stay held.
    let held: Vec<String> = {
        let mut v = Vec::new();
        for _ in 0..3 {
            v.push(ticket(&mut c, "lim/k").await);
        }
        v
    };
    set_policy(&mut admin, rule("lim/*", None, Some(concurrency(1))))
        .await
        .expect("SetPolicy answers");
    let denied = acquire(&mut c, request("lim/k")).await;
    assert_eq!(denied.decision, pb::Decision::Denied as i32, "{denied:?}");
    assert_eq!(denied.reason, pb::Reason::NoPermits as i32);
    let state = get(&mut admin, "lim/k").await;
    assert_eq!((state.limit, state.free, state.live_tickets), (1, 0, 3));
    for (i, t) in held.iter().enumerate() {
        let done = complete(&mut c, t, pb::Outcome::Success).await;
        assert!(!done.stale, "{done:?}");
        let state = get(&mut admin, "lim/k").await;
        let expected_free = if i == 2 { 1 } else { 0 };
        assert_eq!(state.free, expected_free, "after returning {} of 3", i + 1);
    }
    let again = acquire(&mut c, request("lim/k")).await;
    assert_eq!(again.decision, pb::Decision::Granted as i32, "{again:?}");
}

// ---------------------------------------------------------------------------
// Per-key statistics.

/// A waiting Acquire on its own connection, in its own task.
async fn spawn_acquire(
    server: &Server,
    r: pb::AcquireRequest,
) -> tokio::task::JoinHandle<Result<pb::AcquireResponse, Status>> {
    let mut client = server.fusebox().await;
    tokio::spawn(async move { client.acquire(r).await.map(|r| r.into_inner()) })
}

fn wall_ms(t: &Option<prost_types::Timestamp>) -> i128 {
    let t = t.as_ref().expect("a timestamp");
    i128::from(t.seconds) * 1000 + i128::from(t.nanos) / 1_000_000
}

/// KeyState statistics after a scripted scenario on the manual clock:
/// every counter, the failure ratio in ratio mode, and phase_changed_at.
#[tokio::test]
async fn key_state_statistics_after_a_scripted_scenario() {
    let config = r#"
[[rule]]
match = "st/*"
breaker = { mode = "ratio", failure_ratio = 0.5, minimum_throughput = 4, sampling_window = "10s", break = "1s" }
limiter = { kind = "concurrency", permits = 2, queue_limit = 1, order = "newest_first" }
lease = { default = "1s", max = "5s" }
"#;
    let server = Server::manual(Some(config)).await;
    let mut admin = server.admin().await;
    let mut c = server.fusebox().await;
    let key = "st/k";
    let waiting = |max_wait: u64| pb::AcquireRequest {
        max_wait: Some(ms(max_wait)),
        ..request(key)
    };
    let reader = admin.clone();
    let waiters_are = |n: u32| {
        let admin = reader.clone();
        async move {
            eventually(&format!("{n} waiter(s)"), LIMIT, || {
                let mut admin = admin.clone();
                async move { (get(&mut admin, key).await.waiters == n).then_some(()) }
            })
            .await
        }
    };

    // t = 0: two grants fill the limit.
    let ta = ticket(&mut c, key).await;
    let tb = ticket(&mut c, key).await;
    let created = get(&mut admin, key).await;
    // w1 waits; w2 evicts it (newest_first, queue_limit 1); w2 times out.
    let w1 = spawn_acquire(&server, waiting(500)).await;
    waiters_are(1).await;
    let w2 = spawn_acquire(&server, waiting(500)).await;
    let evicted = w1.await.expect("a task").expect("Acquire answers");
    assert_denied(&evicted, pb::Reason::Evicted);
    waiters_are(1).await;
    advance(&server, 500).await;
    let timed_out = w2.await.expect("a task").expect("Acquire answers");
    assert_denied(&timed_out, pb::Reason::Timeout);
    // t = 500: no permits, exceeds the limit, a waiter whose caller leaves.
    let none = acquire(&mut c, request(key)).await;
    assert_eq!(none.reason, pb::Reason::NoPermits as i32, "{none:?}");
    let big = acquire(
        &mut c,
        pb::AcquireRequest {
            permits: Some(3),
            ..request(key)
        },
    )
    .await;
    assert_eq!(big.reason, pb::Reason::ExceedsLimit as i32, "{big:?}");
    let w3 = spawn_acquire(&server, waiting(60_000)).await;
    waiters_are(1).await;
    w3.abort();
    eventually("the waiter is withdrawn", LIMIT, || {
        let mut admin = reader.clone();
        async move {
            let s = get(&mut admin, key).await;
            (s.stats.expect("stats").withdrawn == 1).then_some(())
        }
    })
    .await;
    complete(&mut c, &ta, pb::Outcome::Success).await;
    let one = get(&mut admin, key).await;
    assert_eq!(one.failure_ratio, Some(0.0), "one success in the window");

    // t = 1000: tb's lease ends (expired, settled IGNORED).
    advance(&server, 500).await;
    complete_not_found(&mut c, &tb).await;
    let tc = ticket(&mut c, key).await;
    let td = ticket(&mut c, key).await;
    complete(&mut c, &tc, pb::Outcome::Failure).await;
    assert_eq!(get(&mut admin, key).await.failure_ratio, Some(0.5));
    let te = ticket(&mut c, key).await;
    complete(&mut c, &te, pb::Outcome::Failure).await;
    let ratio = get(&mut admin, key).await.failure_ratio.expect("a ratio");
    assert!((ratio - 2.0 / 3.0).abs() < 1e-9, "{ratio}");
    assert_eq!(
        phase(&get(&mut admin, key).await),
        pb::Phase::Closed,
        "3 < minimum_throughput"
    );
    let tf = ticket(&mut c, key).await;
    let trip = complete(&mut c, &tf, pb::Outcome::Failure).await;
    assert_eq!(trip.phase, pb::Phase::Open as i32, "3 of 4 failed");
    let tripped = get(&mut admin, key).await;
    assert_eq!(
        tripped.failure_ratio, None,
        "the window starts over when it opens"
    );
    let stale = complete(&mut c, &td, pb::Outcome::Success).await;
    assert!(stale.stale, "{stale:?}");
    let blocked = acquire(&mut c, request(key)).await;
    assert_eq!(blocked.reason, pb::Reason::Open as i32, "{blocked:?}");

    // t = 2000: a probe, a request blocked behind it, recovery.
    advance(&server, 1000).await;
    let probe = acquire(&mut c, request(key)).await;
    assert_eq!(probe.decision, pb::Decision::Probe as i32, "{probe:?}");
    let behind = acquire(&mut c, request(key)).await;
    assert_eq!(
        behind.reason,
        pb::Reason::ProbeInFlight as i32,
        "{behind:?}"
    );
    complete(&mut c, &probe.ticket, pb::Outcome::Success).await;
    let recovered = get(&mut admin, key).await;
    assert_eq!(phase(&recovered), pb::Phase::Closed);

    // t = 2010: isolated, a request refused.
    advance(&server, 10).await;
    steer(&mut admin, true, None, key, "stats")
        .await
        .expect("Isolate answers");
    let refused = acquire(&mut c, request(key)).await;
    assert_eq!(
        refused.decision,
        pb::Decision::Refused as i32,
        "{refused:?}"
    );

    let state = get(&mut admin, key).await;
    let by_reason: HashMap<String, u64> = [
        ("evicted", 1),
        ("timeout", 1),
        ("no_permits", 1),
        ("exceeds_limit", 1),
        ("open", 1),
        ("probe_in_flight", 1),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    assert_eq!(
        state.stats,
        Some(pb::KeyStats {
            granted: 6,
            probes: 1,
            blocked: 2,
            refused: 1,
            denied: 4,
            by_reason,
            queued: 3,
            evicted: 1,
            timed_out: 1,
            withdrawn: 1,
            successes: 2,
            failures: 3,
            ignored: 1,
            stale: 1,
            expired: 1,
            ..Default::default()
        }),
        "{state:?}"
    );
    // phase_changed_at: made at 0, opened at 1000, closed at 2000, isolated at 2010.
    let base = wall_ms(&created.phase_changed_at);
    assert_eq!(wall_ms(&one.phase_changed_at) - base, 0, "no change yet");
    assert_eq!(wall_ms(&tripped.phase_changed_at) - base, 1000);
    assert_eq!(wall_ms(&recovered.phase_changed_at) - base, 2000);
    assert_eq!(wall_ms(&state.phase_changed_at) - base, 2010);
    // ListKeys shows the same statistics.
    let listed = list(&mut admin, "st/", &[], 0, "").await.expect("ListKeys");
    assert_eq!(listed.keys, vec![state]);
}

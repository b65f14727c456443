//! Fair shares (issue 18, decisions 99): what one credential may hold at
//! once, per kind of growing thing, so that one tenant cannot fill a
//! server-wide cap and keep the others out. A table of every kind, run
//! embedded and with `--store`, and a fuzz property: no sequence of calls
//! by one credential makes another's first Acquire fail for a cap.

use std::time::Duration;

use fusebox::proto::v1 as pb;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

use crate::harness::{eventually, ms, Options, Server};
use crate::http::request;
use crate::redis_harness::Standalone;
use crate::tenants::bearer;

const A: &str = "tenant-a-share-token-0123456789";
const B: &str = "tenant-b-share-token-0123456789";

/// An `[[auth.token]]` entry: an admin of `prefix`, with `limits` if any.
fn entry(name: &str, token: &str, prefix: &str, limits: &str) -> String {
    let limits = match limits {
        "" => String::new(),
        l => format!("limits = {{ {l} }}\n"),
    };
    format!(
        "[[auth.token]]\nname = \"{name}\"\nrole = \"admin\"\nprefixes = [\"{prefix}\"]\nsha256 = \"{}\"\n{limits}",
        fusebox::auth::hash_hex(token)
    )
}

/// Where the server keeps its keys.
#[derive(Clone, Copy, Debug)]
enum Mode<'a> {
    Embedded,
    Store(&'a str),
}

/// A server under `server` (its `[server]` lines) and `rules`, with
/// tenants `a` (`a/*`) and `b` (`b/*`) and their `limits`.
async fn tenants(mode: Mode<'_>, server: &str, rules: &str, limits: (&str, &str)) -> Server {
    tenants_and(mode, server, rules, limits, "").await
}

/// [`tenants`], with `more` entries after theirs.
async fn tenants_and(
    mode: Mode<'_>,
    server: &str,
    rules: &str,
    limits: (&str, &str),
    more: &str,
) -> Server {
    let config = format!(
        "[server]\n{server}\n{rules}\n[auth]\n{}{}{more}",
        entry("a", A, "a/*", limits.0),
        entry("b", B, "b/*", limits.1)
    );
    let args = match mode {
        Mode::Embedded => vec![],
        Mode::Store(url) => vec!["--store", url],
    };
    Server::start(Options {
        config: Some(&config),
        args,
        ..Options::default()
    })
    .await
}

fn acquire(key: &str, wait: Option<u64>) -> pb::AcquireRequest {
    pb::AcquireRequest {
        key: key.into(),
        permits: Some(1),
        max_wait: wait.map(ms),
        lease: Some(ms(600_000)),
        ..Default::default()
    }
}

/// One permit of `key`, asked for as `token`, without waiting.
async fn acquire_as(
    server: &Server,
    token: &str,
    key: &str,
) -> Result<pb::AcquireResponse, tonic::Status> {
    server
        .fusebox()
        .await
        .acquire(bearer(token, acquire(key, None)))
        .await
        .map(tonic::Response::into_inner)
}

/// One unit of a kind, taken by a credential; what it holds stays held
/// (tickets, streams, waiting calls) until the test ends.
struct Taker<'a> {
    server: &'a Server,
    held: Vec<Box<dyn std::any::Any + Send>>,
}

impl Taker<'_> {
    /// Takes the `n`-th unit of `kind` as `token` (keys under `prefix`).
    async fn take(
        &mut self,
        kind: &str,
        token: &str,
        prefix: &str,
        n: usize,
    ) -> Result<(), tonic::Status> {
        let server = self.server;
        match kind {
            "keys" => {
                let reply = acquire_as(server, token, &format!("{prefix}key{n}")).await?;
                let done = pb::CompleteRequest {
                    ticket: reply.ticket,
                    outcome: pb::Outcome::Success as i32,
                    cost: None,
                };
                server.fusebox().await.complete(bearer(token, done)).await?;
                Ok(())
            }
            "tickets" => {
                let reply = acquire_as(server, token, &format!("{prefix}t")).await?;
                self.held.push(Box::new(reply.ticket));
                Ok(())
            }
            "waiters" => {
                // The first call holds the key's one permit; each later
                // one waits behind it, held until the test ends.
                if n == 0 {
                    acquire_as(server, token, &format!("{prefix}q")).await?;
                }
                let mut client = server.fusebox().await;
                let request = bearer(token, acquire(&format!("{prefix}q"), Some(600_000)));
                let mut call = Box::pin(async move { client.acquire(request).await });
                // Either refused at once, or waiting (held until the end).
                tokio::select! {
                    done = &mut call => {
                        done?;
                        panic!("{token}: a call behind a held permit was answered without waiting");
                    }
                    () = queued(server, token, prefix, n + 1) => {}
                }
                self.held.push(Box::new(tokio::spawn(call)));
                Ok(())
            }
            "decide_streams" => {
                let (tx, rx) = tokio::sync::mpsc::channel::<pb::DecideRequest>(1);
                let stream = server
                    .fusebox()
                    .await
                    .decide(bearer(token, ReceiverStream::new(rx)))
                    .await?;
                self.held.push(Box::new((tx, stream)));
                Ok(())
            }
            "watch_streams" => {
                let stream = server
                    .admin()
                    .await
                    .watch(bearer(
                        token,
                        pb::WatchRequest {
                            prefix: prefix.into(),
                        },
                    ))
                    .await?;
                self.held.push(Box::new(stream));
                Ok(())
            }
            "rules" => {
                let rule = pb::PolicyRule {
                    r#match: format!("{prefix}rule{n}"),
                    policy: Some(pb::Policy {
                        breaker: Some(crate::admin::consecutive(3, 1000)),
                        ..Default::default()
                    }),
                    default: false,
                };
                server
                    .admin()
                    .await
                    .set_policy(bearer(token, pb::SetPolicyRequest { rule: Some(rule) }))
                    .await?;
                Ok(())
            }
            other => panic!("no kind {other}"),
        }
    }
}

/// Resolves once the key `{prefix}q` has `n` waiters, as `token` reads it.
async fn queued(server: &Server, token: &str, prefix: &str, n: usize) {
    let key = format!("{prefix}q");
    eventually(
        "the call to wait in the queue",
        Duration::from_secs(10),
        || async {
            let state = server
                .admin()
                .await
                .get_key(bearer(token, pb::GetKeyRequest { key: key.clone() }))
                .await
                .expect("GetKey")
                .into_inner();
            (state.waiters as usize >= n).then_some(())
        },
    )
    .await;
}

/// A `/metrics` sample's value, by its whole label set as written, as
/// `a` reads it (a credential sees its own share).
async fn sample(server: &Server, series: &str) -> f64 {
    let http = server.http_addr.as_deref().expect("an HTTP port");
    let auth = format!("Bearer {A}");
    let body = request(http, "GET", "/metrics", &[("Authorization", &auth)], b"")
        .await
        .body;
    body.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {series} in /metrics:\n{body}"))
}

/// One row: a kind, its server cap, and the rules it needs.
struct Row {
    kind: &'static str,
    /// The `[server]` field of its cap (`limits` use the same name).
    field: &'static str,
    cap: u64,
    rules: &'static str,
    /// Rules inside `a/*` that the config already holds.
    held_at_start: usize,
}

const QUEUE_RULES: &str = r#"
[[rule]]
match = "a/q"
breaker = { mode = "consecutive", failures = 5, break = "5s" }
limiter = { kind = "concurrency", permits = 1, queue_limit = 100 }
[[rule]]
match = "b/q"
breaker = { mode = "consecutive", failures = 5, break = "5s" }
limiter = { kind = "concurrency", permits = 1, queue_limit = 100 }
"#;

const ROWS: [Row; 6] = [
    Row {
        kind: "keys",
        field: "max_keys",
        cap: 6,
        rules: "",
        held_at_start: 0,
    },
    Row {
        kind: "tickets",
        field: "max_tickets",
        cap: 6,
        rules: "",
        held_at_start: 0,
    },
    Row {
        kind: "waiters",
        field: "max_waiters",
        cap: 6,
        rules: QUEUE_RULES,
        held_at_start: 0,
    },
    Row {
        kind: "decide_streams",
        field: "max_decide_streams",
        cap: 6,
        rules: "",
        held_at_start: 0,
    },
    Row {
        kind: "watch_streams",
        field: "max_watch_streams",
        cap: 6,
        rules: "",
        held_at_start: 0,
    },
    Row {
        kind: "rules",
        field: "max_rules",
        cap: 8,
        rules: QUEUE_RULES,
        held_at_start: 1,
    },
];

/// Every row, with the default share (half of each cap) and with limits
/// written in the entries: `a` is refused past its share with an error
/// that names it, the limit and what to do, the refusal is counted, and
/// `b` still gets its own; the server-wide cap holds over both.
async fn every_kind_is_shared(mode: Mode<'_>, flush: &dyn Fn()) {
    for row in &ROWS {
        for explicit in [false, true] {
            flush();
            let what = format!(
                "{} ({mode:?}, {})",
                row.kind,
                if explicit { "limits" } else { "share" }
            );
            let a_limit = if explicit {
                2
            } else {
                row.cap.div_ceil(2) as usize
            };
            let a_limits = if explicit {
                format!("{} = 2", row.field)
            } else {
                String::new()
            };
            // b may take the whole cap: the server-wide cap stops it.
            let b_limits = if explicit {
                format!("{} = {}", row.field, row.cap)
            } else {
                String::new()
            };
            let server = tenants(
                mode,
                &format!("{} = {}", row.field, row.cap),
                row.rules,
                (&a_limits, &b_limits),
            )
            .await;
            let mut taker = Taker {
                server: &server,
                held: Vec::new(),
            };
            let a_may = a_limit - row.held_at_start;
            for n in 0..a_may {
                if let Err(status) = taker.take(row.kind, A, "a/", n).await {
                    panic!("{what}: a's unit {n} of {a_may} is refused: {status:?}");
                }
            }
            let refused = taker
                .take(row.kind, A, "a/", a_may)
                .await
                .expect_err(&format!("{what}: a is refused past its share"));
            assert_eq!(
                refused.code(),
                Code::ResourceExhausted,
                "{what}: {refused:?}"
            );
            let message = refused.message();
            let source = if explicit {
                format!("limits.{} in its entry", row.field)
            } else {
                format!("[auth] share of [server] {}", row.field)
            };
            assert!(
                message.contains("\"a\"")
                    && message.contains(&source)
                    && message.contains(&format!("{} = N", row.field)),
                "{what}: the refusal names whose limit, which, and what to do: {message}"
            );
            let counted = sample(
                &server,
                &format!(
                    "fusebox_share_refusals_total{{credential=\"a\",limit=\"{}\"}}",
                    row.field
                ),
            )
            .await;
            assert_eq!(counted, 1.0, "{what}: the refusal is counted");
            // b gets its first, and more, up to what the cap leaves.
            let room = row.cap as usize - a_limit;
            let b_may = if explicit {
                room - row.held_at_start
            } else {
                a_limit - row.held_at_start
            };
            for n in 0..b_may {
                if let Err(status) = taker.take(row.kind, B, "b/", n).await {
                    panic!("{what}: b's unit {n} of {b_may} is refused: {status:?}");
                }
            }
            // With --store, Redis's memory bounds keys and tickets, not
            // max_keys and max_tickets (decisions 71): a share still limits
            // each credential (decisions 104).
            let server_caps =
                !(matches!(row.kind, "keys" | "tickets") && matches!(mode, Mode::Store(_)));
            if explicit && server_caps {
                let capped = taker
                    .take(row.kind, B, "b/", b_may)
                    .await
                    .expect_err(&format!("{what}: the server-wide cap still holds"));
                assert_eq!(capped.code(), Code::ResourceExhausted, "{what}: {capped:?}");
                assert!(
                    !capped.message().contains("\"b\" holds"),
                    "{what}: b is stopped by the server's cap, not its share: {}",
                    capped.message()
                );
            }
            drop(taker);
            server.stop().await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_is_shared_embedded() {
    every_kind_is_shared(Mode::Embedded, &|| {}).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_is_shared_with_a_store() {
    let Some(redis) = crate::harness::standalone("every_kind_is_shared_with_a_store").await else {
        return;
    };
    let port = redis.server.port;
    let url = format!("redis://127.0.0.1:{port}");
    every_kind_is_shared(Mode::Store(&url), &|| crate::store::flush(&[port])).await;
}

/// Keys made by Envoy's rate-limit checks count against the caller's share
/// of `max_keys` as Acquire's do: tenant `a` (prefix `rls/*`, half of a
/// cap of 6) makes 3 and its 4th is refused, UNAVAILABLE (RL12), while
/// the keys it made still answer.
async fn rls_keys_count_in_the_share(mode: Mode<'_>) {
    use fusebox::proto::envoy::extensions::common::ratelimit::v3::{
        rate_limit_descriptor::Entry, RateLimitDescriptor,
    };
    use fusebox::proto::envoy::service::ratelimit::v3 as rls;
    // The node's own budget (RL20) is above the share, so that the share
    // is what refuses.
    let rules = "[[rls.domain]]\nname = \"edge\"\n[[rls.domain.descriptor]]\nkey = \"user\"\n\
                 max_keys = 10\nrate_limit = { unit = \"hour\", requests_per_unit = 100 }\n";
    let config = format!(
        "[server]\nmax_keys = 6\n{rules}\n[auth]\n{}",
        entry("a", A, "rls/*", "")
    );
    let args = match mode {
        Mode::Embedded => vec![],
        Mode::Store(url) => vec!["--store", url],
    };
    let server = Server::start(Options {
        config: Some(&config),
        args,
        ..Options::default()
    })
    .await;
    let mut client =
        rls::rate_limit_service_client::RateLimitServiceClient::new(server.channel().await);
    let check = |user: String| {
        bearer(
            A,
            rls::RateLimitRequest {
                domain: "edge".into(),
                descriptors: vec![RateLimitDescriptor {
                    entries: vec![Entry {
                        key: "user".into(),
                        value: user,
                    }],
                    ..Default::default()
                }],
                hits_addend: 0,
            },
        )
    };
    for n in 0..3 {
        let answer = client
            .should_rate_limit(check(format!("u{n}")))
            .await
            .unwrap_or_else(|e| panic!("{mode:?}: key {n} within the share: {e:?}"))
            .into_inner();
        assert_eq!(answer.overall_code(), rls::rate_limit_response::Code::Ok);
    }
    // A 4th key is past a's share: its descriptor is answered as
    // `[rls] no_room` says (OVER_LIMIT), never an error of the check (RL18).
    let refused = client
        .should_rate_limit(check("u3".into()))
        .await
        .unwrap_or_else(|e| panic!("{mode:?}: a key past the share fails the check: {e:?}"))
        .into_inner();
    assert_eq!(
        refused.overall_code(),
        rls::rate_limit_response::Code::OverLimit,
        "{mode:?}: {refused:?}"
    );
    client
        .should_rate_limit(check("u0".into()))
        .await
        .expect("a key it made still answers");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rls_keys_count_in_the_share_embedded() {
    rls_keys_count_in_the_share(Mode::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rls_keys_count_in_the_share_with_a_store() {
    let Some(redis) = crate::harness::standalone("rls_keys_count_in_the_share_with_a_store").await
    else {
        return;
    };
    let url = format!("redis://127.0.0.1:{}", redis.server.port);
    rls_keys_count_in_the_share(Mode::Store(&url)).await;
}

/// A ticket leaves its holder's share when it is completed, and when its
/// lease ends: the share counts what is live, not what was ever taken.
#[tokio::test]
async fn a_share_is_given_back_when_tickets_end() {
    let server = tenants(
        Mode::Embedded,
        "max_tickets = 4",
        "",
        ("max_tickets = 1", ""),
    )
    .await;
    let mut client = server.fusebox().await;
    let first = client
        .acquire(bearer(A, acquire("a/t", None)))
        .await
        .expect("a's first ticket")
        .into_inner();
    let second = client.acquire(bearer(A, acquire("a/t", None))).await;
    assert_eq!(
        second.map(|_| ()).unwrap_err().code(),
        Code::ResourceExhausted
    );
    client
        .complete(bearer(
            A,
            pb::CompleteRequest {
                ticket: first.ticket,
                outcome: pb::Outcome::Success as i32,
                cost: None,
            },
        ))
        .await
        .expect("completed");
    // A short lease: the share is free again once it ends.
    let short = pb::AcquireRequest {
        lease: Some(ms(50)),
        ..acquire("a/t", None)
    };
    client
        .acquire(bearer(A, short))
        .await
        .expect("room again after the completion");
    eventually(
        "the lease to end and leave the share",
        Duration::from_secs(10),
        || {
            let mut client = client.clone();
            async move { client.acquire(bearer(A, acquire("a/t", None))).await.ok() }
        },
    )
    .await;
}

// ---------------------------------------------------------------------------
// The property: whatever `a` does, `b`'s first Acquire is not refused for a cap.

/// One call by `a`.
#[derive(Clone, Debug)]
enum Op {
    /// Acquire a key of its own (`a/k{0}`), perhaps a new one.
    Acquire(u8),
    /// Acquire and wait behind a held permit.
    Wait,
    /// Complete the oldest ticket it holds.
    Complete,
    /// Open a Decide stream and keep it.
    Decide,
    /// Open a Watch stream and keep it.
    Watch,
    /// Set a rule `a/r{0}`.
    Rule(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..40).prop_map(Op::Acquire),
        2 => Just(Op::Wait),
        2 => Just(Op::Complete),
        1 => Just(Op::Decide),
        1 => Just(Op::Watch),
        1 => (0u8..20).prop_map(Op::Rule),
    ]
}

const PROPERTY_CONFIG: &str = r#"
max_keys = 8
max_tickets = 8
max_waiters = 4
max_decide_streams = 4
max_watch_streams = 4
max_rules = 6
"#;

#[test]
fn fuzz_no_calls_by_one_credential_make_anothers_first_acquire_fail_for_a_cap() {
    no_calls_by_one_credential_make_anothers_first_fail(Mode::Embedded, &|| {});
}

#[test]
fn fuzz_no_calls_by_one_credential_make_anothers_first_acquire_fail_with_a_store() {
    let Some(redis) = Standalone::start("shares_property_with_a_store") else {
        return;
    };
    let port = redis.server.port;
    let url = format!("redis://127.0.0.1:{port}");
    no_calls_by_one_credential_make_anothers_first_fail(Mode::Store(&url), &|| {
        crate::store::flush(&[port])
    });
}

/// The property, in `mode` (`flush` empties the store between cases).
fn no_calls_by_one_credential_make_anothers_first_fail(mode: Mode<'_>, flush: &(dyn Fn() + Sync)) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let name = match mode {
        Mode::Embedded => "shares",
        Mode::Store(_) => "shares_store",
    };
    crate::fuzz::fuzz(name, 12, prop::collection::vec(op(), 1..60), |ops| {
        flush();
        rt.block_on(async {
            let server = tenants(mode, PROPERTY_CONFIG, QUEUE_RULES, ("", "")).await;
            let mut taker = Taker {
                server: &server,
                held: Vec::new(),
            };
            let mut tickets: std::collections::VecDeque<String> = Default::default();
            let mut client = server.fusebox().await;
            let mut waited = 0;
            for op in &ops {
                // Refusals are a's own business here; only b's call is checked.
                match op {
                    Op::Acquire(k) => {
                        if let Ok(r) = client
                            .acquire(bearer(A, acquire(&format!("a/k{k}"), None)))
                            .await
                        {
                            tickets.push_back(r.into_inner().ticket);
                        }
                    }
                    Op::Wait => {
                        if taker.take("waiters", A, "a/", waited).await.is_ok() {
                            waited += 1;
                        }
                    }
                    Op::Complete => {
                        if let Some(ticket) = tickets.pop_front() {
                            let done = pb::CompleteRequest {
                                ticket,
                                outcome: pb::Outcome::Failure as i32,
                                cost: None,
                            };
                            let _ = client.complete(bearer(A, done)).await;
                        }
                    }
                    Op::Decide => {
                        let _ = taker.take("decide_streams", A, "a/", 0).await;
                    }
                    Op::Watch => {
                        let _ = taker.take("watch_streams", A, "a/", 0).await;
                    }
                    Op::Rule(r) => {
                        let _ = taker.take("rules", A, "a/", usize::from(*r)).await;
                    }
                }
            }
            // b's first call of each kind gets its room.
            let first = client.acquire(bearer(B, acquire("b/first", None))).await;
            if let Err(status) = &first {
                return Err(TestCaseError::fail(format!(
                    "b's first Acquire: {status:?}"
                )));
            }
            let mut taker = Taker {
                server: &server,
                held: Vec::new(),
            };
            for kind in ["waiters", "decide_streams", "watch_streams", "rules"] {
                if let Err(status) = taker.take(kind, B, "b/", 0).await {
                    return Err(TestCaseError::fail(format!(
                        "b's first of {kind}: {status:?}"
                    )));
                }
            }
            Ok(())
        })
    });
}

/// Two credentials of one namespace (the same `prefixes`, no `tenant`)
/// hold one share between them (decisions 140): with `max_tickets = 40`
/// and two tenants, `a` and `a2` together take 20 tickets, and `b` still
/// gets its own. Before, each token had half the cap and the two took all
/// 40.
#[tokio::test]
async fn two_credentials_of_one_namespace_hold_one_share() {
    const A2: &str = "tenant-a2-share-token-0123456789";
    let config = format!(
        "[server]\nmax_tickets = 40\n[auth]\n{}{}{}",
        entry("a", A, "a/*", ""),
        entry("a2", A2, "a/*", ""),
        entry("b", B, "b/*", "")
    );
    let server = Server::start(Options {
        config: Some(&config),
        ..Options::default()
    })
    .await;
    let mut client = server.fusebox().await;
    let mut granted = 0;
    let mut refused = None;
    for n in 0..40 {
        let token = if n % 2 == 0 { A } else { A2 };
        match client
            .acquire(bearer(token, acquire(&format!("a/k{n}"), None)))
            .await
        {
            Ok(_) => granted += 1,
            Err(status) => {
                refused = Some(status);
                break;
            }
        }
    }
    assert_eq!(granted, 20, "a and a2 share half of 40 tickets");
    let refused = refused.expect("refused past the share");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused.message().contains("\"a\""),
        "the share is a's: {refused:?}"
    );
    for n in 0..20 {
        client
            .acquire(bearer(B, acquire(&format!("b/k{n}"), None)))
            .await
            .unwrap_or_else(|e| panic!("b's ticket {n}: {e:?}"));
    }
}

/// The sample of `family` for credential `a` and `kind` on `server`'s
/// `/metrics`, as `a` reads it.
async fn share_figure(server: &Server, family: &str, kind: &str) -> Option<u64> {
    let addr = server.http_addr.clone().expect("an HTTP address");
    let bearer = format!("Bearer {A}");
    let reply = request(&addr, "GET", "/metrics", &[("authorization", &bearer)], b"").await;
    let text = reply.body;
    let head = format!("{family}{{credential=\"a\",kind=\"{kind}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(head.as_str()))
        .and_then(|v| v.trim().parse().ok())
}

/// With `--store`, a share holds fleet-wide (decisions 148): tenant `a`
/// takes its 4 tickets and 6 keys through one server, and the other
/// server on the same Redis, once the exchange told it, refuses `a` a 5th
/// ticket and a 7th key, while `a`'s keys still answer there and `b`
/// keeps its own share. Before, each server kept its own share, and one
/// credential held one share per server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_on_one_store_hold_one_share() {
    one_share_through_two_servers("two_servers_on_one_store_hold_one_share", A).await;
}

/// The same with a second token of tenant `a` (the same prefixes, so one
/// tenant: decisions 140) on the other server: what `a`'s first token
/// holds through one server counts against its second token's share
/// through the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tokens_of_one_tenant_on_two_servers_hold_one_share() {
    one_share_through_two_servers("two_tokens_of_one_tenant_on_two_servers", A2).await;
}

/// A second token of tenant `a`.
const A2: &str = "tenant-a-second-share-token-0123";

/// Tenant `a` fills its share through one server with its token `A`, then
/// asks through another server on the same Redis with `then_as`.
async fn one_share_through_two_servers(name: &'static str, then_as: &str) {
    let Some(redis) = crate::harness::standalone(name).await else {
        return;
    };
    let url = format!("redis://127.0.0.1:{}", redis.server.port);
    let limits = ("max_tickets = 4, max_keys = 6", "");
    let second = entry("a2", A2, "a/*", limits.0);
    let one = tenants_and(Mode::Store(&url), "", "", limits, &second).await;
    let two = tenants_and(Mode::Store(&url), "", "", limits, &second).await;
    let mut taker = Taker {
        server: &one,
        held: Vec::new(),
    };
    for n in 0..6 {
        taker
            .take("keys", A, "a/", n)
            .await
            .expect("a key in a's share");
    }
    let mut tickets = Vec::new();
    for n in 0..4 {
        let granted = acquire_as(&one, A, &format!("a/key{n}"))
            .await
            .expect("a ticket in a's share");
        tickets.push(granted.ticket);
    }
    let learnt = |kind: &'static str, held: u64| {
        let two = &two;
        async move {
            eventually(
                &format!("the other server learns that a holds {held} {kind}"),
                Duration::from_secs(10),
                || async {
                    (share_figure(two, "fusebox_share_held_elsewhere", kind).await == Some(held))
                        .then_some(())
                },
            )
            .await;
        }
    };
    learnt("tickets", 4).await;
    learnt("keys", 6).await;
    let refused = acquire_as(&two, then_as, "a/key0")
        .await
        .expect_err("a 5th ticket through the other server");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(refused.message().contains("max_tickets"), "{refused:?}");
    // Its tickets given back, a new key is still past its share there,
    // and a key it holds still answers.
    let mut client = one.fusebox().await;
    for ticket in tickets {
        let done = pb::CompleteRequest {
            ticket,
            outcome: pb::Outcome::Success as i32,
            cost: None,
        };
        client.complete(bearer(A, done)).await.expect("complete");
    }
    learnt("tickets", 0).await;
    let refused = acquire_as(&two, then_as, "a/new")
        .await
        .expect_err("a 7th key through the other server");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(refused.message().contains("max_keys"), "{refused:?}");
    acquire_as(&two, then_as, "a/key5")
        .await
        .expect("a key a holds answers through either server");
    acquire_as(&two, B, "b/new")
        .await
        .expect("b's share is its own");
}

/// `used_memory` of the Redis on `conn`.
fn used_memory(conn: &mut crate::resp::Conn) -> u64 {
    let info = conn.cmd(&["INFO", "memory"]).text();
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no used_memory in {info}"))
}

/// With `--store`, a credential's new keys are refused before Redis
/// reaches `maxmemory` (decisions 148): past 90% of it, tenant `a`, which
/// made nearly every key, is refused new keys in words that say so, while
/// its keys still answer and `b`, below its part, still makes new ones.
/// Before, `a` went on until Redis refused every tenant's writes (OOM).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nearly_full_store_refuses_the_greedy_credentials_new_keys() {
    let Some(redis) = crate::harness::standalone("a_nearly_full_store_refuses_greedy_keys").await
    else {
        return;
    };
    let port = redis.server.port;
    let url = format!("redis://127.0.0.1:{port}");
    let server = tenants(Mode::Store(&url), "", "", ("", "")).await;
    let mut conn = crate::resp::Conn::connect(port).expect("connect to redis");
    let room: u64 = 8 << 20;
    let max = used_memory(&mut conn) + room;
    let max_arg = max.to_string();
    assert!(conn.cmd(&["CONFIG", "SET", "maxmemory", &max_arg]).is_ok());
    // Most of the room taken by something that is no credential's key.
    let junk = (room * 70 / 100).to_string();
    assert!(!matches!(
        conn.cmd(&["SETRANGE", "other:junk", &junk, "x"]),
        crate::resp::Reply::Error(_)
    ));
    let mut taker = Taker {
        server: &server,
        held: Vec::new(),
    };
    taker.take("keys", B, "b/", 0).await.expect("b's first key");
    let long = "k".repeat(200);
    // a fills past 90% of maxmemory (or until the server refuses it).
    let mut n = 0;
    let mut refused = None;
    while refused.is_none() && (n == 0 || (used_memory(&mut conn) as f64) < 0.905 * max as f64) {
        for _ in 0..20 {
            match taker.take("keys", A, &format!("a/{long}/"), n).await {
                Ok(()) => n += 1,
                Err(e) if n > 0 && e.message().contains("nearly full") => {
                    refused = Some(e);
                    break;
                }
                Err(e) => panic!("a's key {n} below 90% of maxmemory: {e:?}"),
            }
        }
    }
    let refused = match refused {
        Some(refused) => refused,
        None => {
            eventually("a's new keys refused", Duration::from_secs(10), || {
                let key = format!("a/new{n}");
                n += 1;
                let server = &server;
                async move { acquire_as(server, A, &key).await.err() }
            })
            .await
        }
    };
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused.message().contains("nearly full") && refused.message().contains("\"a\""),
        "the words say the store is nearly full and whose keys are refused: {refused:?}"
    );
    acquire_as(&server, A, &format!("a/{long}/key0"))
        .await
        .expect("a's keys still answer");
    acquire_as(&server, B, "b/new")
        .await
        .expect("b, below its part, still makes new keys");
    assert!(conn.cmd(&["CONFIG", "SET", "maxmemory", "0"]).is_ok());
}

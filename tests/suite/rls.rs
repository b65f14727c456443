//! Envoy's rate-limit service (RLS v3) against a real server on port 0
//! with `[rls]` in its config: statuses, the overall code, hits_addend, the
//! header figures, unknown domains, bad input, all-or-nothing under
//! concurrency, metrics and Watch's view of the keys.

use std::collections::HashMap;

use fusebox::proto::envoy::extensions::common::ratelimit::v3::{
    rate_limit_descriptor::{Entry, RateLimitOverride},
    RateLimitDescriptor,
};
use fusebox::proto::envoy::service::ratelimit::v3::{
    rate_limit_response::Code, rate_limit_service_client::RateLimitServiceClient, RateLimitRequest,
    RateLimitResponse,
};
use tonic::transport::Channel;

use crate::admin::advance;
use crate::harness::Server;

const CONFIG: &str = r#"
[[rls.domain]]
name = "edge"

[[rls.domain.descriptor]]
key = "remote_address"
rate_limit = { unit = "minute", requests_per_unit = 3 }

[[rls.domain.descriptor]]
key = "path"
value = "/api"
rate_limit = { unit = "hour", requests_per_unit = 100 }

[[rls.domain.descriptor]]
key = "health"
unlimited = true

[[rls.domain.descriptor]]
key = "canary"
rate_limit = { unit = "second", requests_per_unit = 1 }
shadow_mode = true
"#;

fn descriptor(entries: &[(&str, &str)], hits: Option<u64>) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).into(),
                value: (*v).into(),
            })
            .collect(),
        limit: None,
        hits_addend: hits,
    }
}

async fn client(server: &Server) -> RateLimitServiceClient<Channel> {
    RateLimitServiceClient::new(server.channel().await)
}

async fn ask(
    rls: &mut RateLimitServiceClient<Channel>,
    domain: &str,
    descriptors: Vec<RateLimitDescriptor>,
    hits: u32,
) -> Result<RateLimitResponse, tonic::Status> {
    rls.should_rate_limit(RateLimitRequest {
        domain: domain.into(),
        descriptors,
        hits_addend: hits,
    })
    .await
    .map(tonic::Response::into_inner)
}

fn codes(r: &RateLimitResponse) -> Vec<i32> {
    r.statuses.iter().map(|s| s.code).collect()
}

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

#[tokio::test]
async fn statuses_overall_code_hits_and_header_figures() {
    let server = Server::manual(Some(CONFIG)).await;
    let mut rls = client(&server).await;
    let ip = || descriptor(&[("remote_address", "10.0.0.1")], None);
    let api = || descriptor(&[("path", "/api")], None);

    // 10 s into the minute: 50 s until the window resets.
    advance(&server, 10_000).await;
    let r = ask(&mut rls, "edge", vec![ip(), api()], 0)
        .await
        .expect("answer");
    assert_eq!(r.overall_code, OK);
    assert_eq!(codes(&r), [OK, OK]);
    let first = &r.statuses[0];
    let limit = first.current_limit.as_ref().expect("current_limit");
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (3, 2),
        "3 per MINUTE"
    );
    assert_eq!(first.limit_remaining, 2);
    let reset = first.duration_until_reset.expect("duration_until_reset");
    assert_eq!((reset.seconds, reset.nanos), (50, 0));
    assert_eq!(r.statuses[1].limit_remaining, 99);

    // Request-level hits_addend 2 takes the last two; a descriptor's explicit 0 only checks.
    let r = ask(&mut rls, "edge", vec![ip(), api()], 2)
        .await
        .expect("answer");
    assert_eq!(codes(&r), [OK, OK]);
    assert_eq!(r.statuses[0].limit_remaining, 0);
    assert_eq!(r.statuses[1].limit_remaining, 97);
    let r = ask(
        &mut rls,
        "edge",
        vec![descriptor(&[("remote_address", "10.0.0.1")], Some(0))],
        0,
    )
    .await
    .expect("answer");
    assert_eq!(r.overall_code, OVER, "a check with nothing free is over");

    // Over on one descriptor: OVER_LIMIT, and the other is not charged.
    let r = ask(&mut rls, "edge", vec![ip(), api()], 0)
        .await
        .expect("answer");
    assert_eq!(r.overall_code, OVER);
    assert_eq!(codes(&r), [OVER, OK]);
    assert_eq!(r.statuses[1].limit_remaining, 97, "nothing charged");

    // Another address is its own counter; unlimited, unmatched and unknown
    // domains are OK without a limit.
    let r = ask(
        &mut rls,
        "edge",
        vec![
            descriptor(&[("remote_address", "10.0.0.2")], None),
            descriptor(&[("health", "x")], None),
            descriptor(&[("path", "/other")], None),
        ],
        0,
    )
    .await
    .expect("answer");
    assert_eq!(codes(&r), [OK, OK, OK]);
    assert_eq!(r.statuses[0].limit_remaining, 2);
    assert!(r.statuses[1].current_limit.is_none());
    assert!(r.statuses[2].current_limit.is_none());
    let r = ask(&mut rls, "nowhere", vec![ip()], 0)
        .await
        .expect("answer");
    assert_eq!((r.overall_code, codes(&r)), (OK, vec![OK]));

    // Shadow mode: over and counted, but what Envoy acts on never
    // changes: OK without figures (RL7).
    let canary = || descriptor(&[("canary", "c")], None);
    ask(&mut rls, "edge", vec![canary()], 0)
        .await
        .expect("answer");
    let r = ask(&mut rls, "edge", vec![canary()], 0)
        .await
        .expect("answer");
    assert_eq!((r.overall_code, codes(&r)), (OK, vec![OK]));
    assert!(r.statuses[0].current_limit.is_none(), "{r:?}");
    assert!(r.statuses[0].duration_until_reset.is_none(), "{r:?}");

    // The next minute starts afresh.
    advance(&server, 50_000).await;
    let r = ask(&mut rls, "edge", vec![ip()], 0).await.expect("answer");
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OK, 2));

    // A descriptor's own limit: its own counter under the node's algorithm.
    let own = || RateLimitDescriptor {
        limit: Some(RateLimitOverride {
            requests_per_unit: 1,
            unit: 1,
        }),
        ..descriptor(&[("remote_address", "10.0.0.1")], None)
    };
    let r = ask(&mut rls, "edge", vec![own()], 0).await.expect("answer");
    let limit = r.statuses[0].current_limit.as_ref().expect("current_limit");
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (1, 1),
        "1 per SECOND"
    );
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OK, 0));
    let r = ask(&mut rls, "edge", vec![own()], 0).await.expect("answer");
    assert_eq!(r.overall_code, OVER);
    server
        .get("rls/{edge}/remote_address/=10.0.0.1/~1/second")
        .await;
    let bad = RateLimitDescriptor {
        limit: Some(RateLimitOverride {
            requests_per_unit: 0,
            unit: 1,
        }),
        ..own()
    };
    let e = ask(&mut rls, "edge", vec![bad], 0)
        .await
        .expect_err("refused");
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(
        e.message()
            .starts_with("descriptors[0].limit.requests_per_unit:"),
        "{e:?}"
    );

    // The keys are fusebox keys like any other.
    let key = server.get("rls/{edge}/remote_address/=10.0.0.1").await;
    assert_eq!(key.key, "rls/{edge}/remote_address/=10.0.0.1");

    let (_, metrics) = crate::reload::http_get(&server, "/metrics").await;
    let value = |name: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("{name} in /metrics"))
    };
    assert_eq!(value("fusebox_rls_shadow_over_limit_total"), 1.0);
    assert_eq!(value("fusebox_rls_over_limit_total"), 3.0);
    assert!(value("fusebox_rls_requests_total") >= 11.0);
}

#[tokio::test]
async fn bad_requests_are_invalid_argument_naming_the_field() {
    let server = Server::manual(Some(CONFIG)).await;
    let mut rls = client(&server).await;
    let long = "v".repeat(129);
    for (domain, descriptors, field) in [
        ("", vec![descriptor(&[("a", "b")], None)], "domain"),
        ("edge", vec![], "descriptors"),
        (
            "edge",
            vec![descriptor(&[], None)],
            "descriptors[0].entries",
        ),
        (
            "edge",
            vec![
                descriptor(&[("a", "b")], None),
                descriptor(&[(long.as_str(), "v")], None),
            ],
            "descriptors[1].entries[0].key",
        ),
        (
            "edge",
            (0..17).map(|_| descriptor(&[("a", "b")], None)).collect(),
            "descriptors",
        ),
    ] {
        let e = ask(&mut rls, domain, descriptors, 0)
            .await
            .expect_err("refused");
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{field}: {e:?}");
        assert!(
            e.message().starts_with(&format!("{field}:")),
            "{field}: {e:?}"
        );
    }
}

/// No value an end user sends fails a check (RL17): a value whose key
/// would be too long (100 slashes, each written %2F) or that is over
/// `max_value_bytes` is counted at a key of its digest, and the request's
/// other descriptors are decided as ever. A descriptor's `hits_addend`
/// above 2^32 - 1 is still refused whole, before anything is charged
/// (RL2), even where no rule matches.
#[tokio::test]
async fn a_request_is_refused_whole_before_any_charge() {
    let server = Server::manual(Some(CONFIG)).await;
    let mut rls = client(&server).await;
    let slashes = "/".repeat(100);
    for n in 1..=4u32 {
        let r = ask(
            &mut rls,
            "edge",
            vec![
                descriptor(&[("remote_address", &slashes)], None),
                descriptor(&[("remote_address", "10.0.0.9")], None),
            ],
            0,
        )
        .await
        .expect("answered, never refused for a value");
        let want = if n <= 3 { OK } else { OVER };
        assert_eq!(r.overall_code, want, "request {n}: {r:?}");
        if n <= 3 {
            assert_eq!(r.statuses[0].limit_remaining, 3 - n, "{r:?}");
            assert_eq!(r.statuses[1].limit_remaining, 3 - n, "{r:?}");
        }
    }
    let (_, metrics) = crate::reload::http_get(&server, "/metrics").await;
    assert!(
        metrics.contains("fusebox_rls_trouble_total{reason=\"digested\"} 4"),
        "{metrics}"
    );
    let e = ask(
        &mut rls,
        "edge",
        vec![descriptor(
            &[("color", "red")],
            Some(u64::from(u32::MAX) + 1),
        )],
        0,
    )
    .await
    .expect_err("refused");
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(
        e.message().starts_with("descriptors[0].hits_addend:"),
        "{e:?}"
    );
}

/// Many callers at once on a two-descriptor request: one descriptor allows
/// 20, the other 1000. Exactly 20 pass, and the other descriptor was
/// charged for those 20 only: nothing is charged on an OVER_LIMIT answer.
#[tokio::test]
async fn all_or_nothing_under_concurrency() {
    let server = Server::manual(Some(TWO)).await;
    hammer(&[server]).await;
}

/// The same over two servers sharing a Redis (`FB.CHARGE`), each caller
/// on one or the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_or_nothing_under_concurrency_over_two_servers_on_redis() {
    let Some(redis) = crate::harness::standalone("rls_all_or_nothing_on_redis").await else {
        return;
    };
    let store = format!("redis://127.0.0.1:{}", redis.server.port);
    let servers = crate::harness::servers_on(&store, TWO, true, 2).await;
    hammer(&servers).await;
}

const TWO: &str = r#"
[[rls.domain]]
name = "d"
[[rls.domain.descriptor]]
key = "tight"
rate_limit = { unit = "hour", requests_per_unit = 20, algorithm = "sliding_window" }
[[rls.domain.descriptor]]
key = "loose"
rate_limit = { unit = "hour", requests_per_unit = 1000, algorithm = "token_bucket" }
"#;

/// 8 callers spread over `servers` send 10 two-descriptor requests each:
/// exactly 20 pass, and the loose descriptor was charged for those only.
async fn hammer(servers: &[Server]) {
    let server = &servers[0];
    let mut tasks = Vec::new();
    for n in 0..8 {
        let mut rls = client(&servers[n % servers.len()]).await;
        tasks.push(tokio::spawn(async move {
            let mut seen: HashMap<i32, u32> = HashMap::new();
            for _ in 0..10 {
                let r = ask(
                    &mut rls,
                    "d",
                    vec![
                        descriptor(&[("tight", "t")], None),
                        descriptor(&[("loose", "l")], None),
                    ],
                    0,
                )
                .await
                .expect("answer");
                *seen.entry(r.overall_code).or_default() += 1;
            }
            seen
        }));
    }
    let mut ok = 0;
    for t in tasks {
        ok += t.await.expect("task").get(&OK).copied().unwrap_or(0);
    }
    assert_eq!(ok, 20);
    let mut rls = client(server).await;
    let r = ask(
        &mut rls,
        "d",
        vec![
            descriptor(&[("tight", "t")], Some(0)),
            descriptor(&[("loose", "l")], Some(0)),
        ],
        0,
    )
    .await
    .expect("answer");
    assert_eq!(r.statuses[0].limit_remaining, 0);
    assert_eq!(r.statuses[1].limit_remaining, 980);
}

#[tokio::test]
async fn a_descriptor_that_needs_a_complete_stops_the_server_with_the_reason() {
    let text = "[[rls.domain]]\nname = \"d\"\n[[rls.domain.descriptor]]\nkey = \"k\"\nrate_limit = { unit = \"second\", requests_per_unit = 1, algorithm = \"concurrency\" }\n";
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = dir.path().join("fusebox.toml");
    std::fs::write(&path, text).expect("config written");
    let message =
        crate::harness::refused_start(&["--config", path.to_str().expect("utf-8")], None).await;
    assert!(
        message.contains("rls.domain 1 (\"d\")")
            && message.contains("descriptor[0].rate_limit.algorithm")
            && message.contains("no Complete"),
        "{message}"
    );
}

/// The README's `[rls]` example is a config the server starts with, and
/// answers by: its nested token bucket and its unlimited path.
#[tokio::test]
async fn the_readme_example_is_a_working_config() {
    let readme = include_str!("../../README.md");
    let section = readme
        .split("## Behind Envoy (rate-limit service)")
        .nth(1)
        .expect("the README's Envoy section");
    let example = section
        .split("```toml\n")
        .nth(1)
        .and_then(|s| s.split("```").next())
        .expect("a toml block");
    let server = Server::manual(Some(example)).await;
    let mut rls = client(&server).await;
    let r = ask(
        &mut rls,
        "edge",
        vec![
            descriptor(&[("path", "/api"), ("user", "ann")], Some(20)),
            descriptor(&[("path", "/healthz")], None),
        ],
        0,
    )
    .await
    .expect("answer");
    assert_eq!(codes(&r), [OK, OK]);
    let bucket = r.statuses[0].current_limit.as_ref().expect("a limit");
    assert_eq!(
        (bucket.requests_per_unit, r.statuses[0].limit_remaining),
        (5, 0)
    );
    assert!(r.statuses[1].current_limit.is_none());
}

/// A SIGHUP reload puts a changed `[rls]` in force: a new domain answers,
/// and a changed limit is what the keys adopt and report.
#[tokio::test]
async fn a_reload_changes_the_mapping_and_the_limits() {
    let before = "[[rls.domain]]\nname = \"a\"\n[[rls.domain.descriptor]]\nkey = \"k\"\nrate_limit = { unit = \"hour\", requests_per_unit = 5 }\n";
    let after = "[[rls.domain]]\nname = \"a\"\n[[rls.domain.descriptor]]\nkey = \"k\"\nrate_limit = { unit = \"hour\", requests_per_unit = 8 }\n[[rls.domain]]\nname = \"b\"\n[[rls.domain.descriptor]]\nkey = \"k\"\nrate_limit = { unit = \"minute\", requests_per_unit = 2 }\n";
    let r = crate::reload::start(before).await;
    let mut rls = client(&r.server).await;
    let k = || vec![descriptor(&[("k", "v")], None)];
    let first = ask(&mut rls, "a", k(), 0).await.expect("answer");
    assert_eq!(first.statuses[0].limit_remaining, 4);
    let unknown = ask(&mut rls, "b", k(), 0).await.expect("answer");
    assert!(unknown.statuses[0].current_limit.is_none());

    crate::reload::write_config(&r.path, after);
    r.server.signal("HUP");
    crate::reload::wait_reloads(&r.server, "SIGHUP", 1).await;
    let a = ask(&mut rls, "a", k(), 0).await.expect("answer");
    let limit = a.statuses[0].current_limit.as_ref().expect("a limit");
    assert_eq!(
        (limit.requests_per_unit, a.statuses[0].limit_remaining),
        (8, 6)
    );
    let b = ask(&mut rls, "b", k(), 0).await.expect("answer");
    assert_eq!(b.statuses[0].limit_remaining, 1);
}

/// Watch sees RLS keys like any other: a snapshot of the prefix lists the
/// key a request charged, with its limiter's figures.
#[tokio::test]
async fn watch_sees_rls_keys() {
    let server = Server::manual(Some(CONFIG)).await;
    let mut rls = client(&server).await;
    ask(
        &mut rls,
        "edge",
        vec![descriptor(&[("remote_address", "10.1.1.1")], None)],
        0,
    )
    .await
    .expect("answer");
    let mut stream = crate::watch::watch(&server, "rls/{edge}/").await;
    let parts = crate::watch::snapshot(&mut stream).await;
    let keys: Vec<&str> = parts
        .iter()
        .flat_map(|p| p.keys.iter().map(|k| k.key.as_str()))
        .collect();
    assert_eq!(keys, ["rls/{edge}/remote_address/=10.1.1.1"]);
}

/// At the key cap a key that cannot be made never fails the check
/// (RL18): its descriptor is OVER_LIMIT (`no_room` by default) and nothing
/// of the request is charged, or, with `no_room = "ok"`, OK uncharged
/// while the request's existing keys are charged; keys that exist keep
/// working either way, and each such descriptor is counted.
#[tokio::test]
async fn at_the_key_cap_a_new_key_is_answered_as_no_room_says() {
    for (no_room, new_code) in [("", OVER), ("no_room = \"ok\"\n", OK)] {
        // The address node's own budget (RL20) is above the cap, so that
        // the cap is what refuses.
        let config = format!(
            "[server]\nmax_keys = 1\n[rls]\n{no_room}{}",
            CONFIG.replace(
                "key = \"remote_address\"\n",
                "key = \"remote_address\"\nmax_keys = 10\n"
            )
        );
        let server = Server::manual(Some(&config)).await;
        let mut rls = client(&server).await;
        let ip = |v: &str| descriptor(&[("remote_address", v)], None);
        ask(&mut rls, "edge", vec![ip("a")], 0)
            .await
            .expect("answer");
        let r = ask(&mut rls, "edge", vec![ip("a"), ip("b")], 0)
            .await
            .expect("answered, never refused for room");
        assert_eq!(codes(&r), [OK, new_code], "{no_room}: {r:?}");
        assert_eq!(r.overall_code, new_code, "{no_room}: {r:?}");
        let charged = if new_code == OK { 1 } else { 0 };
        assert_eq!(
            r.statuses[0].limit_remaining,
            2 - charged,
            "{no_room}: {r:?}"
        );
        let r = ask(&mut rls, "edge", vec![ip("a")], 0)
            .await
            .expect("answer");
        assert_eq!(
            r.statuses[0].limit_remaining,
            1 - charged,
            "{no_room}: {r:?}"
        );
        let (_, metrics) = crate::reload::http_get(&server, "/metrics").await;
        assert!(
            metrics.contains("fusebox_rls_trouble_total{reason=\"no_room\"} 1"),
            "{metrics}"
        );
    }
}

/// Two nodes that take any value: an end user's header (`user`) and the
/// client's address (`remote_address`, 3 a minute).
const ADDRESS_AND_USER: &str = r#"
[[rls.domain]]
name = "edge"
[[rls.domain.descriptor]]
key = "remote_address"
rate_limit = { unit = "minute", requests_per_unit = 3 }
[[rls.domain.descriptor]]
key = "user"
rate_limit = { unit = "hour", requests_per_unit = 100 }
"#;

const EDGE: &str = "edge-proxy-rls-token-0123456789";
const OPS: &str = "operators-rls-token-0123456789";

/// `[auth]` with Envoy's credential (keys under `rls/*`) and the
/// operators' (every key, to read `/metrics`): two tenants, so each holds
/// half of `max_keys` (decisions 140).
fn edge_and_ops() -> String {
    let entry = |name: &str, token: &str, prefixes: &str| {
        format!(
            "[[auth.token]]\nname = \"{name}\"\nrole = \"admin\"\n{prefixes}sha256 = \"{}\"\n",
            fusebox::auth::hash_hex(token)
        )
    };
    format!(
        "[auth]\n{}{}",
        entry("edge", EDGE, "prefixes = [\"rls/*\"]\n"),
        entry("ops", OPS, "")
    )
}

async fn ask_as(
    rls: &mut RateLimitServiceClient<Channel>,
    token: &str,
    descriptors: Vec<RateLimitDescriptor>,
) -> RateLimitResponse {
    rls.should_rate_limit(crate::tenants::bearer(
        token,
        RateLimitRequest {
            domain: "edge".into(),
            descriptors,
            hits_addend: 0,
        },
    ))
    .await
    .expect("answered, never refused whole")
    .into_inner()
}

/// RL20: 260 distinct `user` values fill the user node's budget (half of
/// Envoy's key share of 200, with two nodes that take any value), not the
/// share: a request from a new client address still has its per-address
/// descriptor decided, charged and OVER_LIMIT past 3. Users past the
/// budget are answered as `[rls] no_room` says; users within it keep
/// being decided, and a request with one new user past the budget
/// charges nothing (RL18).
async fn a_flood_of_users_leaves_room_for_a_new_address(server: &Server, mode: &str) {
    let mut rls = client(server).await;
    let user = |v: &str| descriptor(&[("user", v)], None);
    let address = |v: &str| descriptor(&[("remote_address", v)], None);
    let mut flood = Vec::new();
    for i in 0..260 {
        let r = ask_as(&mut rls, EDGE, vec![user(&format!("u{i}"))]).await;
        flood.push(r.statuses[0].code);
    }
    for remaining in [2, 1, 0] {
        let r = ask_as(&mut rls, EDGE, vec![address("203.0.113.7")]).await;
        assert_eq!(
            (codes(&r), r.statuses[0].limit_remaining),
            (vec![OK], remaining),
            "{mode}: a new address after a flood of users: {r:?}"
        );
    }
    let r = ask_as(&mut rls, EDGE, vec![address("203.0.113.7")]).await;
    assert_eq!(codes(&r), [OVER], "{mode}: the address limit holds: {r:?}");
    let ok = flood.iter().filter(|c| **c == OK).count();
    assert_eq!(ok, 100, "{mode}: the user node's budget is 100 keys");
    assert!(flood[..100].iter().all(|c| *c == OK), "{mode}: {flood:?}");
    // A user within the budget keeps being decided.
    let r = ask_as(&mut rls, EDGE, vec![user("u0")]).await;
    assert_eq!(
        (codes(&r), r.statuses[0].limit_remaining),
        (vec![OK], 98),
        "{mode}: {r:?}"
    );
    // A new user past the budget with a new address: OVER_LIMIT, and the
    // address is read, not charged.
    let r = ask_as(&mut rls, EDGE, vec![address("203.0.113.8"), user("u-new")]).await;
    assert_eq!(codes(&r), [OK, OVER], "{mode}: {r:?}");
    assert_eq!(r.overall_code, OVER, "{mode}: {r:?}");
    let r = ask_as(&mut rls, EDGE, vec![address("203.0.113.8")]).await;
    assert_eq!(r.statuses[0].limit_remaining, 2, "{mode}: {r:?}");
    let http = server.http_addr.as_deref().expect("an HTTP port");
    let auth = format!("Bearer {OPS}");
    let metrics = crate::http::request(http, "GET", "/metrics", &[("Authorization", &auth)], b"")
        .await
        .body;
    assert!(
        metrics.contains("fusebox_rls_trouble_total{reason=\"over_budget\"} 161"),
        "{mode}: {metrics}"
    );
}

#[tokio::test]
async fn a_flood_of_users_leaves_room_for_a_new_address_embedded() {
    let config = format!(
        "[server]\nmax_keys = 400\n{ADDRESS_AND_USER}\n{}",
        edge_and_ops()
    );
    let server = Server::manual(Some(&config)).await;
    a_flood_of_users_leaves_room_for_a_new_address(&server, "embedded").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_users_leaves_room_for_a_new_address_with_a_store() {
    let Some(redis) = crate::harness::standalone("rls_flood_of_users_with_a_store").await else {
        return;
    };
    let store = format!("redis://127.0.0.1:{}", redis.server.port);
    let config = format!(
        "[server]\nmax_keys = 400\n{ADDRESS_AND_USER}\n{}",
        edge_and_ops()
    );
    let servers = crate::harness::servers_on(&store, &config, true, 1).await;
    a_flood_of_users_leaves_room_for_a_new_address(&servers[0], "with a store").await;
}

/// RL19: at the key cap, a charge's new key has keys at rest forgotten
/// for it, the longest idle first; a key that is not at rest (its window
/// still counts) is never forgotten, and when every key is in use the new
/// one is answered as `[rls] no_room` says.
#[tokio::test]
async fn keys_at_rest_make_room_for_a_new_key_the_longest_idle_first() {
    let config = r#"
[server]
max_keys = 3
[[rls.domain]]
name = "edge"
[[rls.domain.descriptor]]
key = "hourly"
rate_limit = { unit = "hour", requests_per_unit = 100 }
[[rls.domain.descriptor]]
key = "secondly"
rate_limit = { unit = "second", requests_per_unit = 100 }
"#;
    let server = Server::manual(Some(config)).await;
    let mut rls = client(&server).await;
    let mut admin = server.admin().await;
    let hourly = |v: &str| descriptor(&[("hourly", v)], None);
    let secondly = |v: &str| descriptor(&[("secondly", v)], None);
    let key = |node: &str, v: &str| format!("rls/{{edge}}/{node}/={v}");
    let fits = |r: &RateLimitResponse| (codes(r), r.statuses[0].limit_remaining);
    let r = ask(&mut rls, "edge", vec![hourly("a")], 0).await.unwrap();
    assert_eq!(fits(&r), (vec![OK], 99));
    ask(&mut rls, "edge", vec![secondly("b")], 0).await.unwrap();
    advance(&server, 100).await;
    ask(&mut rls, "edge", vec![secondly("c")], 0).await.unwrap();
    // The cap is full; b and c are at rest once their second is over,
    // b the longest idle. a's hour still counts.
    advance(&server, 2_000).await;
    let r = ask(&mut rls, "edge", vec![secondly("d")], 0).await.unwrap();
    assert_eq!(fits(&r), (vec![OK], 99), "d made room: {r:?}");
    let listed = crate::admin::list_all(&mut admin, "rls/", &[], 10).await;
    assert_eq!(
        listed,
        [
            key("hourly", "a"),
            key("secondly", "c"),
            key("secondly", "d")
        ],
        "b, the longest idle at rest, was forgotten"
    );
    let r = ask(&mut rls, "edge", vec![secondly("e")], 0).await.unwrap();
    assert_eq!(fits(&r), (vec![OK], 99), "e made room: {r:?}");
    let listed = crate::admin::list_all(&mut admin, "rls/", &[], 10).await;
    assert_eq!(
        listed,
        [
            key("hourly", "a"),
            key("secondly", "d"),
            key("secondly", "e")
        ]
    );
    // Nothing at rest: a new key is answered as no_room says (RL18).
    let r = ask(&mut rls, "edge", vec![hourly("f")], 0).await.unwrap();
    assert_eq!(codes(&r), [OVER], "{r:?}");
    // a, never at rest, kept its count.
    let r = ask(&mut rls, "edge", vec![hourly("a")], 0).await.unwrap();
    assert_eq!(fits(&r), (vec![OK], 98));
    let (_, metrics) = crate::reload::http_get(&server, "/metrics").await;
    for line in [
        "fusebox_keys_evicted_total 2",
        "fusebox_rls_trouble_total{reason=\"no_room\"} 1",
    ] {
        assert!(metrics.contains(line), "{line}: {metrics}");
    }
}

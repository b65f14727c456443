//! Shadow policies (SPEC D1-D4) on every surface of a real server, embedded
//! and with `--store` on Redis: an Acquire that would be blocked answers
//! `GRANTED` with `shadow_decision` and `shadow_reason`, no `retry_after`,
//! the real phase; its ticket completes stale; `KeyStats` counts it as
//! blocked and as shadow, never as granted; the breaker's transitions are
//! told `shadow: ` on Watch; `/metrics` counts it as `decision="shadow"`.
//! The decisions themselves are the vectors' (`shadow-*.json`).

use fusebox::proto::v1 as pb;
use pb::watch_event::Event;

use crate::admin::{acquire, complete, get, request};
use crate::harness::{Options, Server};
use crate::watch::{next, snapshot, watch};

const CONFIG: &str = r#"
[[rule]]
match = "s/*"
breaker = { mode = "consecutive", failures = 1, break = "60s" }
enforce = false
"#;

fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (name, value) = l.rsplit_once(' ')?;
        (name == series).then(|| value.parse().ok())?
    })
}

async fn a_shadow_key_says_so(server: &Server) {
    let mut events = watch(server, "s/").await;
    snapshot(&mut events).await;
    let mut c = server.fusebox().await;
    let mut admin = server.admin().await;

    let first = acquire(&mut c, request("s/a")).await;
    assert_eq!(first.decision, pb::Decision::Granted as i32, "{first:?}");
    assert_eq!(first.shadow_decision, pb::Decision::Unspecified as i32);
    let done = complete(&mut c, &first.ticket, pb::Outcome::Failure).await;
    assert!(!done.stale);
    assert_eq!(done.phase, pb::Phase::Open as i32, "a shadow breaker trips");

    match next(&mut events, crate::admin::LIMIT).await {
        Event::Transition(t) => {
            assert_eq!(t.key, "s/a");
            assert_eq!(t.to, pb::Phase::Open as i32);
            assert_eq!(t.cause, "shadow: failures reached the trip condition");
        }
        other => panic!("expected the trip, got {other:?}"),
    }

    let shadow = acquire(&mut c, request("s/a")).await;
    assert_eq!(shadow.decision, pb::Decision::Granted as i32, "{shadow:?}");
    assert!(!shadow.ticket.is_empty(), "a shadow ticket");
    assert_eq!(shadow.shadow_decision, pb::Decision::Blocked as i32);
    assert_eq!(shadow.shadow_reason, pb::Reason::Open as i32);
    assert_eq!(shadow.reason, pb::Reason::Unspecified as i32);
    assert_eq!(shadow.retry_after, None, "no retry_after (D1)");
    assert_eq!(shadow.phase, pb::Phase::Open as i32, "the real phase");

    let state = get(&mut admin, "s/a").await;
    assert_eq!(state.live_tickets, 1, "a shadow ticket is live (D2)");
    let done = complete(&mut c, &shadow.ticket, pb::Outcome::Success).await;
    assert!(done.stale, "a shadow ticket's outcome is stale (D2)");
    assert_eq!(done.phase, pb::Phase::Open as i32, "and changes nothing");

    let state = get(&mut admin, "s/a").await;
    let stats = state.stats.expect("stats");
    assert_eq!(
        (stats.granted, stats.blocked, stats.shadow),
        (1, 1, 1),
        "{stats:?}"
    );
    assert_eq!(state.live_tickets, 0);

    // ISOLATED is enforced (D4).
    crate::harness::steer(&mut admin, true, None, "s/a", "a drill")
        .await
        .expect("Isolate answers");
    let refused = acquire(&mut c, request("s/a")).await;
    assert_eq!(refused.decision, pb::Decision::Refused as i32);
    assert_eq!(refused.shadow_decision, pb::Decision::Unspecified as i32);

    let addr = server.http_addr.clone().expect("an HTTP address");
    let reply = crate::http::get(&addr, "/metrics").await;
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(
        sample(&reply.body, "fusebox_decisions_total{decision=\"shadow\"}"),
        Some(1.0),
        "{}",
        reply.body
    );
    assert_eq!(
        sample(&reply.body, "fusebox_decisions_total{decision=\"blocked\"}"),
        Some(0.0),
        "a shadow grant is not a blocked answer"
    );

    // The dashboard says the key is on a shadow policy, and tells the trip
    // as a shadow's.
    let page = crate::http::get(&addr, "/api/keys?prefix=s%2F")
        .await
        .json();
    let row = &page["keys"][0];
    assert_eq!(row["key"], "s/a", "{page}");
    assert_eq!(row["shadow_policy"], true, "{row}");
    assert_eq!(row["shadow"], 1, "{row}");
    assert_eq!(row["turned_away"], 1, "only the refusal: {row}");
    let trip =
        crate::harness::eventually("the trip in /api/transitions", crate::admin::LIMIT, || {
            let addr = addr.clone();
            async move {
                let timeline = crate::http::get(&addr, "/api/transitions?prefix=s%2F")
                    .await
                    .json();
                timeline
                    .as_array()
                    .and_then(|t| t.iter().find(|e| e["to"] == "OPEN"))
                    .cloned()
            }
        })
        .await;
    assert_eq!(trip["cause"], "shadow: failures reached the trip condition");
}

#[tokio::test]
async fn a_shadow_key_says_so_on_every_surface() {
    let server = Server::start(Options {
        config: Some(CONFIG),
        ..Options::default()
    })
    .await;
    a_shadow_key_says_so(&server).await;
    server
        .until_logged("shadow: failures reached the trip condition")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_key_says_so_on_every_surface_with_a_store() {
    let Some(redis) =
        crate::harness::standalone("a_shadow_key_says_so_on_every_surface_with_a_store").await
    else {
        return;
    };
    let store = format!("redis://127.0.0.1:{}", redis.server.port);
    let mut servers = crate::harness::servers_on(&store, CONFIG, false, 1).await;
    let server = servers.pop().expect("a server");
    a_shadow_key_says_so(&server).await;
}

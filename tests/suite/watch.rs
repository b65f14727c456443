//! Admin.Watch against a real server (issue 4, acceptance 1): a snapshot
//! first (in parts, the last marked complete), then every transition of the
//! matching keys, in order per key, with who and why for isolate and close;
//! a watcher that never reads gets a Lagged marker and a fresh snapshot, and
//! decisions never wait for it. The stream is read with a deadline; nothing
//! sleeps.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fusebox::proto::v1 as pb;
use pb::watch_event::Event;
use tonic::Streaming;

use crate::admin::{acquire, advance, call, complete, get, request, ticket, LIMIT};
use crate::harness::{millis, steer, Server};

/// How long a test waits for the next message of a stream.
const NEXT: Duration = Duration::from_secs(5);

/// A Watch of the keys under `prefix`.
pub(crate) async fn watch(server: &Server, prefix: &str) -> Streaming<pb::WatchEvent> {
    server
        .admin()
        .await
        .watch(pb::WatchRequest {
            prefix: prefix.into(),
        })
        .await
        .expect("Watch answers")
        .into_inner()
}

/// The next event of a stream, within `limit`.
pub(crate) async fn next(stream: &mut Streaming<pb::WatchEvent>, limit: Duration) -> Event {
    tokio::time::timeout(limit, stream.message())
        .await
        .unwrap_or_else(|_| panic!("no Watch event within {limit:?}"))
        .expect("the stream is healthy")
        .expect("the stream is open")
        .event
        .expect("an event")
}

/// Reads a whole snapshot: its parts up to the one marked complete.
pub(crate) async fn snapshot(stream: &mut Streaming<pb::WatchEvent>) -> Vec<pb::Snapshot> {
    let mut parts = Vec::new();
    loop {
        match next(stream, NEXT).await {
            Event::Snapshot(part) => {
                let complete = part.complete;
                parts.push(part);
                if complete {
                    return parts;
                }
            }
            other => panic!("expected a snapshot part, got {other:?}"),
        }
    }
}

fn phase(p: i32) -> pb::Phase {
    pb::Phase::try_from(p).expect("a phase")
}

fn kind(k: i32) -> pb::TransitionKind {
    pb::TransitionKind::try_from(k).expect("a kind")
}

const CONFIG: &str = r#"
[[rule]]
match = "w/*"
breaker = { mode = "consecutive", failures = 1, break = "1s" }

[[rule]]
match = "x/*"
breaker = { mode = "consecutive", failures = 1, break = "1s" }
"#;

/// What one key's script should produce, as (kind, from, to, who, reason).
type Step = (pb::TransitionKind, pb::Phase, pb::Phase, String, String);

fn expected_steps(i: usize) -> Vec<Step> {
    use pb::Phase::{Closed, HalfOpen, Isolated, Open};
    use pb::TransitionKind::{Close, Isolate, PhaseChange};
    let who = format!("op-{i}");
    let none = || (String::new(), String::new());
    let s = |k, f, t, (w, r): (String, String)| (k, f, t, w, r);
    vec![
        s(PhaseChange, Closed, Open, none()),
        s(
            Isolate,
            Open,
            Isolated,
            (who.clone(), format!("isolate {i}")),
        ),
        s(Close, Isolated, Closed, (who.clone(), format!("close {i}"))),
        s(PhaseChange, Closed, Open, none()),
        s(PhaseChange, Open, HalfOpen, none()),
        s(PhaseChange, HalfOpen, Open, none()),
        s(PhaseChange, Open, HalfOpen, none()),
        s(PhaseChange, HalfOpen, Closed, none()),
        s(Close, Closed, Closed, (who, format!("reset {i}"))),
    ]
}

/// Every transition of several keys changed concurrently arrives, in order
/// per key, after a snapshot in parts; keys outside the prefix never show.
#[tokio::test]
async fn watch_sends_a_snapshot_then_every_transition_in_order_per_key() {
    const KEYS: usize = 8;
    let server = Arc::new(Server::manual(Some(CONFIG)).await);
    let mut c = server.fusebox().await;
    let mut admin = server.admin().await;
    // Before the watch: 250 keys (three snapshot parts), an OPEN key past
    // its deadline, and a key outside the prefix.
    let mut known = BTreeSet::new();
    for i in 0..250 {
        let key = format!("w/snap/{i:03}");
        call(&mut c, &key, pb::Outcome::Success).await;
        known.insert(key);
    }
    assert_eq!(
        call(&mut c, "w/open", pb::Outcome::Failure).await,
        pb::Phase::Open
    );
    known.insert("w/open".to_owned());
    call(&mut c, "x/other", pb::Outcome::Success).await;
    advance(&server, 5_000).await;

    let mut stream = watch(&server, "w/").await;
    let parts = snapshot(&mut stream).await;
    assert_eq!(
        parts
            .iter()
            .map(|p| (p.keys.len(), p.complete))
            .collect::<Vec<_>>(),
        [(100, false), (100, false), (51, true)],
        "snapshot parts of at most 100 keys, the last marked complete"
    );
    let listed: Vec<&pb::KeyState> = parts.iter().flat_map(|p| &p.keys).collect();
    let names: Vec<&str> = listed.iter().map(|k| k.key.as_str()).collect();
    assert_eq!(
        names,
        known.iter().map(String::as_str).collect::<Vec<_>>(),
        "key order"
    );
    let open = listed.iter().find(|k| k.key == "w/open").expect("w/open");
    assert_eq!(
        phase(open.phase),
        pb::Phase::Open,
        "B6: watching never admits"
    );
    assert_eq!(millis(open.open_remaining), Some(0));
    assert_eq!(*open, &get(&mut admin, "w/open").await);

    // Several keys, each changed by its own clients at the same time; the
    // manual clock moves between the phases of the script.
    let barrier = Arc::new(tokio::sync::Barrier::new(KEYS + 2));
    let mut tasks = Vec::new();
    for i in 0..KEYS {
        let server = server.clone();
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            let key = format!("w/k{i}");
            let who = format!("op-{i}");
            let mut c = server.fusebox().await;
            let mut admin = server.admin().await;
            assert_eq!(
                call(&mut c, &key, pb::Outcome::Failure).await,
                pb::Phase::Open
            );
            steer(&mut admin, true, Some(&who), &key, &format!("isolate {i}"))
                .await
                .expect("Isolate answers");
            steer(&mut admin, false, Some(&who), &key, &format!("close {i}"))
                .await
                .expect("Close answers");
            assert_eq!(
                call(&mut c, &key, pb::Outcome::Failure).await,
                pb::Phase::Open
            );
            barrier.wait().await; // the clock moves 1 s
            barrier.wait().await;
            assert_eq!(
                call(&mut c, &key, pb::Outcome::Failure).await,
                pb::Phase::Open
            );
            barrier.wait().await; // the clock moves 1 s
            barrier.wait().await;
            assert_eq!(
                call(&mut c, &key, pb::Outcome::Success).await,
                pb::Phase::Closed
            );
            steer(&mut admin, false, Some(&who), &key, &format!("reset {i}"))
                .await
                .expect("Close answers");
        }));
    }
    // Meanwhile, a key outside the prefix changes too.
    {
        let server = server.clone();
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            let mut c = server.fusebox().await;
            assert_eq!(
                call(&mut c, "x/other", pb::Outcome::Failure).await,
                pb::Phase::Open
            );
            barrier.wait().await;
            barrier.wait().await;
            assert_eq!(
                call(&mut c, "x/other", pb::Outcome::Success).await,
                pb::Phase::Closed
            );
            barrier.wait().await;
            barrier.wait().await;
        }));
    }
    // The stream is read while the keys change.
    let reader = tokio::spawn(async move {
        let wanted = KEYS * expected_steps(0).len();
        let mut got = Vec::new();
        let deadline = Instant::now() + LIMIT;
        while got.len() < wanted {
            let left = deadline.saturating_duration_since(Instant::now());
            match next(&mut stream, left).await {
                Event::Transition(t) => got.push(t),
                other => panic!("only transitions after the snapshot: {other:?}"),
            }
        }
        (stream, got)
    });
    for _ in 0..2 {
        barrier.wait().await;
        advance(&server, 1_000).await;
        barrier.wait().await;
    }
    for task in tasks {
        task.await.expect("a script");
    }
    let (mut stream, got) = reader.await.expect("the reader");

    let mut per_key: BTreeMap<String, Vec<pb::Transition>> = BTreeMap::new();
    let mut last_sequence = None;
    for t in got {
        assert!(t.key.starts_with("w/"), "outside the prefix: {t:?}");
        assert!(
            last_sequence.is_none_or(|s| t.sequence > s),
            "sequence numbers increase along the stream: {t:?} after {last_sequence:?}"
        );
        last_sequence = Some(t.sequence);
        per_key.entry(t.key.clone()).or_default().push(t);
    }
    assert_eq!(per_key.len(), KEYS);
    for (i, (key, events)) in per_key.iter().enumerate() {
        assert_eq!(key, &format!("w/k{i}"));
        let steps: Vec<Step> = events
            .iter()
            .map(|t| {
                (
                    kind(t.kind),
                    phase(t.from),
                    phase(t.to),
                    t.who.clone(),
                    t.reason.clone(),
                )
            })
            .collect();
        assert_eq!(
            steps,
            expected_steps(i),
            "{key}: every transition, in order"
        );
        for t in events {
            let state = t.state.as_ref().expect("the state after");
            assert_eq!(
                (state.key.as_str(), phase(state.phase)),
                (key.as_str(), phase(t.to)),
                "{t:?}"
            );
            assert!(t.at.is_some(), "{t:?}");
            assert!(!t.cause.is_empty(), "{t:?}");
        }
        let causes: Vec<&str> = events.iter().map(|t| t.cause.as_str()).collect();
        assert_eq!(causes[0], "failures reached the trip condition");
        assert_eq!(causes[4], "the break ended and a probe was admitted");
        assert_eq!(causes[5], "the probe failed");
        assert_eq!(causes[7], "the probe succeeded");
        let at: Vec<i64> = events.iter().map(|t| t.at.expect("at").seconds).collect();
        assert!(at.windows(2).all(|w| w[0] <= w[1]), "{key}: times in order");
        let open_left = events[3]
            .state
            .as_ref()
            .and_then(|s| millis(s.open_remaining));
        assert_eq!(open_left, Some(1_000), "the state right after the trip");
    }

    // Without the header, who is the caller's address.
    admin
        .isolate(pb::IsolateRequest {
            key: "w/k0".into(),
            reason: String::new(),
        })
        .await
        .expect("Isolate answers");
    match next(&mut stream, NEXT).await {
        Event::Transition(t) => {
            assert_eq!(kind(t.kind), pb::TransitionKind::Isolate, "{t:?}");
            assert!(t.who.starts_with("127.0.0.1:"), "the peer address: {t:?}");
            assert_eq!(t.reason, "no reason given");
        }
        other => panic!("expected the isolate: {other:?}"),
    }
}

/// A watcher that never reads gets a Lagged marker and then a fresh
/// snapshot when it reads again, and only events after that snapshot
/// follow; meanwhile decisions never waited for it.
#[tokio::test]
async fn a_watcher_that_never_reads_gets_lagged_then_a_fresh_snapshot() {
    const FLOODERS: usize = 16;
    const CALLS_EACH: usize = 800; // 12,800 events: far more than 4096 + buffers
    let server = Arc::new(Server::manual(None).await);
    // Opened, never read until the flood is over. Its connection takes no
    // more than 64 KiB unread (HTTP/2 windows), so the server's buffers
    // fill soon; with the client's default 2 MiB windows it takes ~15,000
    // more events before the server sees the watcher fall behind.
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.addr))
        .expect("an address")
        .initial_stream_window_size(Some(65_535))
        .initial_connection_window_size(Some(65_535))
        .connect()
        .await
        .expect("the server accepts connections");
    let mut stalled = pb::admin_client::AdminClient::new(channel)
        .watch(pb::WatchRequest {
            prefix: String::new(),
        })
        .await
        .expect("Watch answers")
        .into_inner();

    // Decisions on another connection, timed, for as long as the flood lasts.
    let flooding = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let decisions = {
        let server = server.clone();
        let flooding = flooding.clone();
        tokio::spawn(async move {
            let mut c = server.fusebox().await;
            let (mut count, mut during, mut slowest) = (0u32, 0u32, Duration::ZERO);
            while flooding.load(std::sync::atomic::Ordering::SeqCst) || count < 10 {
                let started = Instant::now();
                let t = ticket(&mut c, "dec/k").await;
                complete(&mut c, &t, pb::Outcome::Success).await;
                slowest = slowest.max(started.elapsed());
                count += 1;
                if flooding.load(std::sync::atomic::Ordering::SeqCst) {
                    during += 1;
                }
            }
            (count, during, slowest)
        })
    };

    // The flood: isolate and close in a loop over one connection.
    let admin = server.admin().await;
    let mut tasks = Vec::new();
    for f in 0..FLOODERS {
        let mut admin = admin.clone();
        tasks.push(tokio::spawn(async move {
            let key = format!("flood/{f:02}");
            for n in 0..CALLS_EACH {
                let reason = format!("flood {n}");
                if n % 2 == 0 {
                    admin
                        .close(pb::CloseRequest {
                            key: key.clone(),
                            reason,
                        })
                        .await
                } else {
                    admin
                        .isolate(pb::IsolateRequest {
                            key: key.clone(),
                            reason,
                        })
                        .await
                }
                .expect("the operator's calls are answered");
            }
        }));
    }
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .expect("the flood is not slowed by the stalled watcher")
            .expect("a flooder");
    }
    flooding.store(false, std::sync::atomic::Ordering::SeqCst);
    let (count, during, slowest) = decisions.await.expect("the decisions task");
    // Answered while the flood lasted, none held back by the stalled
    // watcher (a liveness bound, loose for a loaded test machine: a
    // decision that waited for the watcher would wait for ever).
    assert!(
        during >= 1 && count >= 10,
        "decisions kept being answered: {during} during the flood, {count} in all"
    );
    assert!(
        slowest < Duration::from_secs(10),
        "the slowest decision took {slowest:?}"
    );

    // Now read: what the transport buffered, then Lagged, then a snapshot.
    let mut before_lag = 0usize;
    let missed = loop {
        match next(&mut stalled, NEXT).await {
            Event::Lagged(l) => break l.missed,
            Event::Transition(_) | Event::Snapshot(_) => before_lag += 1,
        }
        assert!(
            before_lag <= FLOODERS * CALLS_EACH,
            "every event arrived: the watcher was never told it lagged"
        );
    };
    assert!(missed > 0, "missed {missed}");
    assert!(
        before_lag + missed as usize <= FLOODERS * CALLS_EACH + 1,
        "{before_lag} delivered + {missed} missed"
    );
    let parts = snapshot(&mut stalled).await;
    let keys: Vec<pb::KeyState> = parts.into_iter().flat_map(|p| p.keys).collect();
    let mut expected: Vec<String> = (0..FLOODERS).map(|f| format!("flood/{f:02}")).collect();
    expected.insert(0, "dec/k".into());
    assert_eq!(
        keys.iter().map(|k| k.key.clone()).collect::<Vec<_>>(),
        expected
    );
    for k in &keys[1..] {
        // Each flooder's last call was an isolate: the snapshot is fresh.
        assert_eq!(phase(k.phase), pb::Phase::Isolated, "{k:?}");
    }

    // After the fresh snapshot only new events follow: the next one is this.
    steer(
        &mut server.admin().await,
        false,
        Some("after"),
        "flood/00",
        "marker",
    )
    .await
    .expect("Close answers");
    match next(&mut stalled, NEXT).await {
        Event::Transition(t) => {
            assert_eq!(
                (t.key.as_str(), t.who.as_str(), t.reason.as_str()),
                ("flood/00", "after", "marker"),
                "no event from before the snapshot follows it"
            );
            assert_eq!(
                (phase(t.from), phase(t.to)),
                (pb::Phase::Isolated, pb::Phase::Closed)
            );
        }
        other => panic!("expected the marker transition: {other:?}"),
    }

    // A watcher opened now starts with the same fresh state.
    let mut fresh = watch(&server, "flood/").await;
    let parts = snapshot(&mut fresh).await;
    assert_eq!(parts.iter().map(|p| p.keys.len()).sum::<usize>(), FLOODERS);
    let mut c = server.fusebox().await;
    let reply = acquire(&mut c, request("flood/01")).await;
    assert_eq!(
        reply.decision,
        pb::Decision::Refused as i32,
        "still isolated"
    );
    let reply = acquire(&mut c, request("flood/00")).await;
    assert_eq!(reply.decision, pb::Decision::Granted as i32, "closed");
    complete(&mut c, &reply.ticket, pb::Outcome::Success).await;
}

/// At shutdown a Watch stream ends UNAVAILABLE (the watcher missed what
/// comes next and should watch again elsewhere), not OK.
#[tokio::test]
async fn a_watch_ends_unavailable_when_the_server_shuts_down() {
    let server = Server::manual(None).await;
    let mut stream = watch(&server, "").await;
    let parts = snapshot(&mut stream).await;
    assert!(parts.last().is_some_and(|p| p.complete));
    server.terminate();
    let end = tokio::time::timeout(LIMIT, stream.message())
        .await
        .expect("the stream ends within the limit");
    let status = end.expect_err("the stream ends with an error status, not OK");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(status.message().contains("shutting down"), "{status:?}");
}

//! The `fusebox` command's client side (SPEC section 9), run as a subprocess
//! against a real server on a manual clock: what each command prints, in
//! words and as `--json`, and how it fails.

use std::net::SocketAddr;
use std::process::Stdio;

use serde_json::{json, Value};

use crate::command::{client, client_json, fusebox, Run, PATIENCE};
use crate::harness::{self, Server, BIN};

/// Keys in `pool/*` share one concurrency permit with room for one waiter;
/// every key has the breaker of SPEC section 6 (failures 2, break 1 s).
const CONFIG: &str = r#"
[[rule]]
match = "pool/*"
breaker = { mode = "consecutive", failures = 2, break = "1s" }
limiter = { kind = "concurrency", permits = 1, queue_limit = 1 }

[default]
breaker = { mode = "consecutive", failures = 2, break = "1s" }
"#;

/// The ticket of a JSON acquire reply, checked to be 32 hex digits (L1).
fn ticket_of(reply: &Value) -> String {
    let ticket = reply["ticket"]
        .as_str()
        .unwrap_or_else(|| panic!("a ticket in {reply}"))
        .to_owned();
    assert!(
        hex::decode(&ticket).is_ok_and(|bytes| bytes.len() == 16),
        "a ticket is 32 hex digits: {ticket:?}"
    );
    ticket
}

/// A JSON acquire reply as the CLI prints it, every field named.
fn acquire_reply(
    decision: &str,
    ticket: Option<&str>,
    reason: Option<&str>,
    retry_after_ms: Option<u64>,
    lease_ms: Option<u64>,
    phase: &str,
) -> Value {
    json!({
        "decision": decision,
        "ticket": ticket,
        "reason": reason,
        "retry_after_ms": retry_after_ms,
        "lease_ms": lease_ms,
        "phase": phase,
        "shadow_decision": null,
        "shadow_reason": null,
    })
}

/// Acquires one permit on `key` and returns the ticket of the grant.
async fn granted(server: &Server, key: &str) -> String {
    let reply = client_json(server, &["acquire", key]).await;
    let ticket = ticket_of(&reply);
    assert_eq!(
        reply,
        acquire_reply("GRANTED", Some(&ticket), None, None, Some(30_000), "CLOSED")
    );
    ticket
}

/// A key state as `get`, `isolate` and `close` print it with `--json`.
#[allow(clippy::too_many_arguments)]
fn key_state(
    key: &str,
    phase: &str,
    consecutive_failures: u32,
    half_open_attempts: u32,
    open_remaining_ms: Option<u64>,
    free: u32,
    queued: u32,
    live_tickets: u32,
    waiters: u32,
) -> Value {
    json!({
        "key": key,
        "phase": phase,
        "consecutive_failures": consecutive_failures,
        "half_open_attempts": half_open_attempts,
        "probes_held": 0,
        "half_open_successes": 0,
        "live_slow": 0,
        "adaptive_limit": 0,
        "open_remaining_ms": open_remaining_ms,
        "free": free,
        "queued": queued,
        "live_tickets": live_tickets,
        "waiters": waiters,
        "shadow": 0,
    })
}

#[tokio::test]
async fn serve_prints_listening_on_its_real_address_first() {
    // The harness reads the first line and insists on `listening on `; what
    // follows must be the address actually bound, not the port 0 asked for.
    let server = Server::manual(Some(CONFIG)).await;
    let addr: SocketAddr = server.addr.parse().unwrap_or_else(|e| {
        panic!(
            "`listening on ADDR` names a socket address ({e}): {:?}",
            server.addr
        )
    });
    assert_eq!(addr.ip().to_string(), "127.0.0.1");
    assert_ne!(
        addr.port(),
        0,
        "the real port, not the 0 that was asked for"
    );
    assert_eq!(server.addr, addr.to_string(), "printed as IP:PORT");
    let state = client_json(&server, &["get", "k"]).await;
    assert_eq!(state["phase"], "CLOSED", "and it answers there");
}

#[tokio::test]
async fn acquire_complete_and_advance_replay_the_worked_example() {
    // SPEC section 6, driven by the CLI alone.
    let server = Server::manual(Some(CONFIG)).await;

    // t = 0: readable grant.
    let run = client(&server, &["acquire", "svc"]).await;
    let line = run.ok().trim_end();
    let rest = line
        .strip_prefix("GRANTED  ticket ")
        .unwrap_or_else(|| panic!("a readable grant names the ticket: {line:?}"));
    let (t1, rest) = rest.split_once("  ").expect("ticket, then lease and phase");
    assert!(
        hex::decode(t1).is_ok_and(|bytes| bytes.len() == 16),
        "a ticket of 32 hex digits: {t1:?}"
    );
    assert_eq!(rest, "lease 30000ms  phase CLOSED");
    let run = client(&server, &["complete", t1, "failure"]).await;
    assert_eq!(run.ok(), "recorded; phase CLOSED\n");

    // t = 10: the second failure opens the breaker.
    let now = client_json(&server, &["advance", "10ms"]).await;
    assert_eq!(now, json!({ "now_ms": 10 }));
    let t2 = granted(&server, "svc").await;
    let done = client_json(&server, &["complete", &t2, "failure"]).await;
    assert_eq!(done, json!({ "stale": false, "phase": "OPEN" }));

    // t = 500: blocked, with the time left as the retry hint.
    let run = client(&server, &["advance", "490ms"]).await;
    assert_eq!(run.ok(), "clock now 500ms\n");
    let blocked = client_json(&server, &["acquire", "svc"]).await;
    assert_eq!(
        blocked,
        acquire_reply("BLOCKED", None, Some("open"), Some(510), None, "OPEN")
    );
    let run = client(&server, &["acquire", "svc"]).await;
    assert_eq!(
        run.ok(),
        "BLOCKED  reason open  retry after 510ms  phase OPEN\n"
    );

    // t = 1009 and 1010: the last blocked request, then the one probe.
    assert_eq!(
        client_json(&server, &["advance", "509ms"]).await,
        json!({ "now_ms": 1009 })
    );
    assert_eq!(
        client_json(&server, &["acquire", "svc"]).await,
        acquire_reply("BLOCKED", None, Some("open"), Some(1), None, "OPEN")
    );
    client(&server, &["advance", "1ms"]).await.ok();
    let probe = client_json(&server, &["acquire", "svc"]).await;
    let t3 = ticket_of(&probe);
    assert_eq!(
        probe,
        acquire_reply("PROBE", Some(&t3), None, None, Some(30_000), "HALF_OPEN")
    );
    assert_eq!(
        client_json(&server, &["acquire", "svc"]).await,
        acquire_reply(
            "BLOCKED",
            None,
            Some("probe_in_flight"),
            Some(1000),
            None,
            "HALF_OPEN"
        )
    );
    let run = client(&server, &["complete", &t3, "failure"]).await;
    assert_eq!(run.ok(), "recorded; phase OPEN\n");
    assert_eq!(
        client_json(&server, &["get", "svc"]).await,
        key_state("svc", "OPEN", 3, 1, Some(1000), 0, 0, 0, 0)
    );

    // t = 2009 and 2010: a probe again, and its success closes the breaker.
    client(&server, &["advance", "999ms"]).await.ok();
    assert_eq!(
        client_json(&server, &["acquire", "svc"]).await,
        acquire_reply("BLOCKED", None, Some("open"), Some(1), None, "OPEN")
    );
    let run = client(&server, &["advance", "1ms"]).await;
    assert_eq!(run.ok(), "clock now 2010ms\n");
    let probe = client_json(&server, &["acquire", "svc"]).await;
    let t4 = ticket_of(&probe);
    assert_eq!(probe["decision"], "PROBE");
    let run = client(&server, &["complete", &t4, "success"]).await;
    assert_eq!(run.ok(), "recorded; phase CLOSED\n");
    assert_eq!(
        client_json(&server, &["get", "svc"]).await,
        key_state("svc", "CLOSED", 0, 0, None, 0, 0, 0, 0)
    );
}

#[tokio::test]
async fn a_status_check_answers_without_a_ticket() {
    // P2a: `--permits 0` changes nothing and gives no ticket.
    let server = Server::manual(Some(CONFIG)).await;
    assert_eq!(
        client_json(&server, &["acquire", "svc", "--permits", "0"]).await,
        acquire_reply("GRANTED", None, None, None, None, "CLOSED")
    );
    let run = client(&server, &["acquire", "svc", "--permits", "0"]).await;
    assert_eq!(run.ok(), "GRANTED  phase CLOSED\n");

    // A limited key with its one permit held: denied, and concurrency gives no hint.
    let holder = granted(&server, "pool/a").await;
    assert_eq!(
        client_json(&server, &["acquire", "pool/a", "--permits", "0"]).await,
        acquire_reply("DENIED", None, Some("no_permits"), None, None, "CLOSED")
    );
    assert_eq!(
        client_json(&server, &["get", "pool/a"]).await,
        key_state("pool/a", "CLOSED", 0, 0, None, 0, 0, 1, 0),
        "the status check took nothing"
    );

    // An open breaker answers for itself, with its retry hint.
    for _ in 0..2 {
        let t = granted(&server, "svc").await;
        client(&server, &["complete", &t, "failure"]).await.ok();
    }
    assert_eq!(
        client_json(&server, &["acquire", "svc", "--permits", "0"]).await,
        acquire_reply("BLOCKED", None, Some("open"), Some(1000), None, "OPEN")
    );
    // At the deadline the next request would be admitted, so the check says
    // GRANTED; but it gives no ticket and does not move the breaker (B6):
    // the key still reads OPEN, and no probe was counted.
    client(&server, &["advance", "1s"]).await.ok();
    assert_eq!(
        client_json(&server, &["acquire", "svc", "--permits", "0"]).await,
        acquire_reply("GRANTED", None, None, None, None, "OPEN")
    );
    assert_eq!(
        client_json(&server, &["get", "svc"]).await,
        key_state("svc", "OPEN", 2, 0, Some(0), 0, 0, 0, 0)
    );
    let probe = client_json(&server, &["acquire", "svc"]).await;
    assert_eq!(
        probe["decision"], "PROBE",
        "the real request gets the probe"
    );
    client(&server, &["complete", &holder, "success"])
        .await
        .ok();
}

#[tokio::test]
async fn a_waiting_acquire_is_served_when_the_holder_completes() {
    let server = Server::manual(Some(CONFIG)).await;
    let holder = granted(&server, "pool/w").await;

    // No wait asked: denied at once.
    assert_eq!(
        client_json(&server, &["acquire", "pool/w"]).await,
        acquire_reply("DENIED", None, Some("no_permits"), None, None, "CLOSED")
    );

    // The waiter, in the background: the manual clock never moves, so its
    // 10 s wait can only end by being served.
    let waiter = crate::process::spawn(
        tokio::process::Command::new(BIN)
            .args(["acquire", "pool/w", "--wait", "10s", "--json"])
            .args(["--server", server.addr.as_str()])
            .stderr(Stdio::piped()),
        "fusebox runs",
    );
    harness::eventually(
        "the CLI's request to wait in the queue",
        PATIENCE,
        || async { (server.get("pool/w").await.waiters == 1).then_some(()) },
    )
    .await;
    assert_eq!(
        client_json(&server, &["get", "pool/w"]).await,
        key_state("pool/w", "CLOSED", 0, 0, None, 0, 1, 1, 1)
    );
    let run = client(&server, &["get", "pool/w"]).await;
    assert!(
        run.ok().contains("queued permits        1 (1 waiters)\n"),
        "{}",
        run.stdout
    );

    // The queue (one permit) is full: another waiter is turned away.
    assert_eq!(
        client_json(&server, &["acquire", "pool/w", "--wait", "1s"]).await,
        acquire_reply("DENIED", None, Some("queue_full"), None, None, "CLOSED")
    );

    let done = client_json(&server, &["complete", &holder, "success"]).await;
    assert_eq!(done, json!({ "stale": false, "phase": "CLOSED" }));
    let output = tokio::time::timeout(PATIENCE, waiter.wait_with_output())
        .await
        .expect("the waiter is answered once the permit comes back")
        .expect("the waiter's output");
    let run = Run::from(output);
    let reply = run.json();
    let ticket = ticket_of(&reply);
    assert_eq!(
        reply,
        acquire_reply("GRANTED", Some(&ticket), None, None, Some(30_000), "CLOSED")
    );
    assert_eq!(
        client_json(&server, &["get", "pool/w"]).await,
        key_state("pool/w", "CLOSED", 0, 0, None, 0, 0, 1, 0),
        "the waiter now holds the permit"
    );
    client(&server, &["complete", &ticket, "ignored"])
        .await
        .ok();
    assert_eq!(server.get("pool/w").await.free, 1);
}

#[tokio::test]
async fn complete_reports_stale_outcomes_and_refuses_unknown_tickets() {
    let server = Server::manual(Some(CONFIG)).await;
    let mut tickets = Vec::new();
    for _ in 0..5 {
        tickets.push(granted(&server, "svc").await);
    }

    // IGNORED counts for nothing (B4).
    assert_eq!(
        client_json(&server, &["complete", &tickets[0], "ignored"]).await,
        json!({ "stale": false, "phase": "CLOSED" })
    );
    assert_eq!(
        client_json(&server, &["get", "svc"]).await,
        key_state("svc", "CLOSED", 0, 0, None, 0, 0, 4, 0)
    );
    let run = client(&server, &["complete", &tickets[1], "failure"]).await;
    assert_eq!(run.ok(), "recorded; phase CLOSED\n");
    let run = client(&server, &["complete", &tickets[2], "failure"]).await;
    assert_eq!(run.ok(), "recorded; phase OPEN\n");

    // Tickets of the closed period that ended are stale (B3).
    assert_eq!(
        client_json(&server, &["complete", &tickets[3], "success"]).await,
        json!({ "stale": true, "phase": "OPEN" })
    );
    let run = client(&server, &["complete", &tickets[4], "failure"]).await;
    let text = run.ok();
    assert!(
        text.starts_with("stale: the outcome was not counted") && text.ends_with("; phase OPEN\n"),
        "{text:?}"
    );
    assert_eq!(
        client_json(&server, &["get", "svc"]).await,
        key_state("svc", "OPEN", 2, 0, Some(1000), 0, 0, 0, 0),
        "the stale outcomes moved nothing"
    );

    // A completed ticket, and one never issued: NOT_FOUND (L4).
    let unknown = "0".repeat(32);
    for ticket in [tickets[3].as_str(), unknown.as_str(), "not-a-ticket"] {
        for json in [false, true] {
            let mut args = vec!["complete", ticket, "success"];
            if json {
                args.push("--json");
            }
            let run = client(&server, &args).await;
            let message = run.failed_saying(1, "error: NOT_FOUND: ticket: ");
            assert!(message.contains("already completed"), "{message:?}");
        }
    }

    // An outcome the CLI does not know is a usage error.
    let run = client(&server, &["complete", &unknown, "maybe"]).await;
    let message = run.failed(2);
    assert!(
        message.contains("success") && message.contains("failure") && message.contains("ignored"),
        "the usage error lists the outcomes: {message:?}"
    );
}

#[tokio::test]
async fn get_reads_a_key_in_words_and_in_json() {
    let server = Server::manual(Some(CONFIG)).await;
    // Never used: the state a fresh key would have (K2); a key without a
    // limiter reports no free permits, a limited one its limit.
    assert_eq!(
        client_json(&server, &["get", "fresh"]).await,
        key_state("fresh", "CLOSED", 0, 0, None, 0, 0, 0, 0)
    );
    assert_eq!(
        client_json(&server, &["get", "pool/fresh"]).await,
        key_state("pool/fresh", "CLOSED", 0, 0, None, 1, 0, 0, 0)
    );

    for _ in 0..2 {
        let t = granted(&server, "svc").await;
        client(&server, &["complete", &t, "failure"]).await.ok();
    }
    client(&server, &["advance", "250ms"]).await.ok();
    let run = client(&server, &["get", "svc"]).await;
    assert_eq!(
        run.ok(),
        "key                   svc\n\
         phase                 OPEN (750ms left in the break)\n\
         consecutive failures  2\n\
         half-open attempts    0\n\
         probe slots held      0\n\
         half-open successes   0\n\
         live slow calls       0\n\
         free permits          0\n\
         queued permits        0 (0 waiters)\n\
         live tickets          0\n"
    );
    // Reading never admits (B6): past the deadline it still reads OPEN.
    client(&server, &["advance", "750ms"]).await.ok();
    assert_eq!(
        client_json(&server, &["get", "svc"]).await,
        key_state("svc", "OPEN", 2, 0, Some(0), 0, 0, 0, 0)
    );
}

/// Keys in `probing/*` open at one failure for 1 s, then probe with three
/// slots at once and close at the second probe success (H1-H2).
const PROBING: &str = r#"
[[rule]]
match = "probing/*"
breaker = { mode = "consecutive", failures = 1, break = "1s", half_open = { probes = 3, successes = 2 } }
"#;

/// The ticket of a PROBE answer to `acquire KEY --json`.
async fn probe(server: &Server, key: &str) -> String {
    let reply = client_json(server, &["acquire", key]).await;
    let ticket = ticket_of(&reply);
    assert_eq!(
        reply,
        acquire_reply(
            "PROBE",
            Some(&ticket),
            None,
            None,
            Some(30_000),
            "HALF_OPEN"
        )
    );
    ticket
}

#[tokio::test]
async fn get_shows_the_probe_slots_held_and_the_successes_of_a_half_open_key() {
    let server = Server::manual(Some(PROBING)).await;
    let key = "probing/a";
    let first = granted(&server, key).await;
    client(&server, &["complete", &first, "failure"]).await.ok();
    client(&server, &["advance", "1s"]).await.ok();
    // Three slots: two probes at once; the first success frees its slot
    // and counts one of the two that close the breaker; a third probe
    // takes a slot again.
    let one = probe(&server, key).await;
    let _two = probe(&server, key).await;
    let run = client(&server, &["complete", &one, "success"]).await;
    assert_eq!(run.ok(), "recorded; phase HALF_OPEN\n");
    let _three = probe(&server, key).await;

    let mut want = key_state(key, "HALF_OPEN", 1, 3, None, 0, 0, 2, 0);
    want["probes_held"] = json!(2);
    want["half_open_successes"] = json!(1);
    assert_eq!(client_json(&server, &["get", key]).await, want);
    let run = client(&server, &["get", key]).await;
    assert_eq!(
        run.ok(),
        "key                   probing/a\n\
         phase                 HALF_OPEN\n\
         consecutive failures  1\n\
         half-open attempts    3\n\
         probe slots held      2\n\
         half-open successes   1\n\
         live slow calls       0\n\
         free permits          0\n\
         queued permits        0 (0 waiters)\n\
         live tickets          2\n"
    );
    // `keys --json` carries the same figures.
    let keys = client_json(&server, &["keys", "probing/"]).await;
    let row = &keys.as_array().expect("a list of keys")[0];
    assert_eq!(
        (&row["probes_held"], &row["half_open_successes"]),
        (&json!(2), &json!(1)),
        "{row}"
    );
}

#[tokio::test]
async fn isolate_and_close_take_a_reason_and_print_the_key() {
    let server = Server::manual(Some(CONFIG)).await;
    let before = granted(&server, "svc").await;
    let state = client_json(
        &server,
        &["isolate", "svc", "--reason", "maintenance window"],
    )
    .await;
    assert_eq!(state, key_state("svc", "ISOLATED", 0, 0, None, 0, 0, 1, 0));
    assert_eq!(
        client_json(&server, &["acquire", "svc"]).await,
        acquire_reply("REFUSED", None, None, None, None, "ISOLATED")
    );
    let run = client(&server, &["acquire", "svc"]).await;
    assert_eq!(run.ok(), "REFUSED  phase ISOLATED\n");
    // Repeating leaves the same phase.
    let run = client(&server, &["isolate", "svc", "--reason", "still down"]).await;
    assert!(
        run.ok()
            .starts_with("key                   svc\nphase                 ISOLATED\n"),
        "{:?}",
        run.stdout
    );

    let run = client(&server, &["close", "svc", "--reason", "dependency is back"]).await;
    assert!(
        run.ok()
            .starts_with("key                   svc\nphase                 CLOSED\n"),
        "{:?}",
        run.stdout
    );
    // The ticket from before isolation belongs to an earlier epoch (B5).
    assert_eq!(
        client_json(&server, &["complete", &before, "failure"]).await,
        json!({ "stale": true, "phase": "CLOSED" })
    );

    // Close is a reset: the failure run is cleared.
    let t = granted(&server, "svc").await;
    client(&server, &["complete", &t, "failure"]).await.ok();
    assert_eq!(
        client_json(&server, &["get", "svc"]).await["consecutive_failures"],
        1
    );
    assert_eq!(
        client_json(&server, &["close", "svc", "--reason", "reset"]).await,
        key_state("svc", "CLOSED", 0, 0, None, 0, 0, 0, 0)
    );

    // Both commands insist on a reason, for the record.
    for command in ["isolate", "close"] {
        let run = client(&server, &[command, "svc"]).await;
        assert!(run.failed(2).contains("--reason"), "{:?}", run.stderr);
    }
}

#[tokio::test]
async fn a_bad_key_fails_naming_the_field() {
    let server = Server::manual(Some(CONFIG)).await;
    let long = "k".repeat(257);
    let cases: [&[&str]; 5] = [
        &["acquire", ""],
        &["acquire", "a\tb", "--json"],
        &["get", &long],
        &["isolate", "a\u{7}b", "--reason", "x"],
        &["close", "", "--reason", "x"],
    ];
    for args in cases {
        let run = client(&server, args).await;
        let message = run.failed(1);
        assert!(
            message.starts_with("error: INVALID_ARGUMENT: key: "),
            "{args:?}: {message:?}"
        );
    }
}

#[tokio::test]
async fn acquire_sends_its_caller_and_attempt() {
    // Q1: fusebox refuses a caller of more than 128 bytes naming the field,
    // and takes one of 128: the refusal proves `--caller` is sent.
    let server = Server::manual(Some(CONFIG)).await;
    let long = "c".repeat(129);
    let run = client(&server, &["acquire", "svc", "--caller", &long]).await;
    run.failed_saying(1, "error: INVALID_ARGUMENT: caller: ");
    let fits = "c".repeat(128);
    let reply = client_json(
        &server,
        &["acquire", "svc", "--caller", &fits, "--attempt", "2"],
    )
    .await;
    ticket_of(&reply);
    // R2: an empty retry budget denies a retry and grants a first attempt.
    let server = Server::manual(Some(
        "[[rule]]\nmatch = \"budget/*\"\nretry_budget = { ratio = 0.1, min_per_second = 0, window = \"10s\" }\n",
    ))
    .await;
    assert_eq!(
        client_json(&server, &["acquire", "budget/a", "--attempt", "2"]).await,
        acquire_reply("DENIED", None, Some("retry_budget"), None, None, "CLOSED")
    );
    let reply = client_json(&server, &["acquire", "budget/a", "--attempt", "1"]).await;
    ticket_of(&reply);
    // R1: an attempt is a uint32; another is a usage error naming the flag,
    // caught before any call.
    let run = client(&server, &["acquire", "svc", "--attempt=-1"]).await;
    assert!(run.failed(2).contains("--attempt"), "{:?}", run.stderr);
}

#[tokio::test]
async fn advance_needs_a_manual_clock() {
    // X1: without --manual-clock the Clock service answers UNIMPLEMENTED,
    // and the CLI says how to get one.
    let server = Server::start(harness::Options {
        config: Some(CONFIG),
        ..harness::Options::default()
    })
    .await;
    let run = client(&server, &["advance", "1s"]).await;
    let message = run.failed_saying(1, "error: UNIMPLEMENTED: ");
    assert!(message.contains("--manual-clock"), "{message:?}");
    // A duration without a unit is a usage error, caught before any call.
    let run = client(&server, &["advance", "5"]).await;
    assert!(run.failed(2).contains("no unit"), "{:?}", run.stderr);
}

#[tokio::test]
async fn an_unreachable_server_fails_saying_what_to_do() {
    // A port that was free a moment ago: bound by the OS, then released.
    let addr = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        listener.local_addr().expect("its address").to_string()
    };
    let commands: [&[&str]; 6] = [
        &["acquire", "svc"],
        &["complete", "0123456789abcdef0123456789abcdef", "success"],
        &["get", "svc", "--json"],
        &["isolate", "svc", "--reason", "x"],
        &["close", "svc", "--reason", "x"],
        &["advance", "1s"],
    ];
    for args in commands {
        let mut all = args.to_vec();
        all.extend(["--server", addr.as_str()]);
        let run = fusebox(&all).await;
        let message = run.failed(1);
        assert!(
            message.starts_with(&format!("error: cannot reach fusebox at {addr}: "))
                && message.contains("start `fusebox serve` there")
                && message.contains("--server"),
            "{args:?}: {message:?}"
        );
    }
    // Something that is not an address at all.
    let run = fusebox(&["get", "svc", "--server", "no such host:x"]).await;
    run.failed_saying(1, "error: --server no such host:x: not an address");
}

#[tokio::test]
async fn bench_names_the_load_tool_that_took_its_place() {
    // The same arguments, written for the new binary (quoted where a
    // shell needs it), and a usage error's exit code.
    let run = fusebox(&[
        "bench",
        "attack",
        "--runs",
        "1",
        "--store",
        "redis://h:1/?a b",
    ])
    .await;
    let message = run.failed(2);
    assert!(
        message.contains("`fusebox-bench`")
            && message.contains("\n    fusebox-bench attack --runs 1 --store 'redis://h:1/?a b'\n")
            && message.contains("cargo build --release -p fusebox -p fusebox-bench"),
        "{message:?}"
    );
    // Its help flag is one of those arguments, not clap's.
    let run = fusebox(&["bench", "--help"]).await;
    assert!(
        run.failed(2).contains("\n    fusebox-bench --help\n"),
        "{:?}",
        run.stderr
    );
    // The product's own help does not offer it.
    let run = fusebox(&["--help"]).await;
    assert!(!run.ok().contains("bench"), "{}", run.stdout);
}

/// `fusebox complete --cost N` (U1): the difference from what the ticket
/// took is settled in the key's token bucket at once, up or down; a cost
/// that is not a u32 is refused by the command, naming the flag, and
/// changes nothing.
#[tokio::test]
async fn complete_with_a_cost_settles_the_difference_in_a_token_bucket() {
    const BUCKET: &str = r#"
[default]
limiter = { kind = "token_bucket", capacity = 4, refill = 1, period = "1s" }
"#;
    let server = Server::manual(Some(BUCKET)).await;
    let free = async |server: &Server| client_json(server, &["get", "tb"]).await["free"].clone();
    let t1 = granted(&server, "tb").await;
    assert_eq!(free(&server).await, 3);
    let run = client(&server, &["complete", &t1, "success", "--cost", "4"]).await;
    assert_eq!(run.ok(), "recorded; phase CLOSED\n");
    assert_eq!(free(&server).await, 0, "3 more spent: 4 - 1 - 3");

    client(&server, &["advance", "2s"]).await.ok();
    let t2 = granted(&server, "tb").await;
    assert_eq!(free(&server).await, 1);
    for bad in ["-1", "4294967296", "two"] {
        let flag = format!("--cost={bad}");
        let run = client(&server, &["complete", &t2, "success", &flag]).await;
        let message = run.failed(2);
        assert!(message.contains("--cost"), "{bad}: {message:?}");
    }
    assert_eq!(free(&server).await, 1, "a refused cost changes nothing");
    let done = client_json(&server, &["complete", &t2, "success", "--cost", "0"]).await;
    assert_eq!(done, json!({"stale": false, "phase": "CLOSED"}));
    assert_eq!(free(&server).await, 2, "cost 0 gives the permit back");
}

#[tokio::test]
async fn policies_lists_the_rules_then_the_default_with_their_half_open_bound() {
    let config = format!(
        "{PROBING}\nlimiter = {{ kind = \"concurrency\", permits = 4, queue_limit = 2 }}\n"
    );
    let server = Server::manual(Some(&config)).await;
    let run = client(&server, &["policies"]).await;
    assert_eq!(
        run.ok(),
        "probing/*  breaker: consecutive, 1 failure, break 1s, probe lease 1s\n\
         \x20          half-open: 3 probes at once, 2 successes to close\n\
         \x20          limiter: concurrency, 4 permits, queue 2\n\
         \x20          lease: default 30s, max 5m, expired IGNORED\n\
         default    breaker: consecutive, 5 failures, break 5s, probe lease 5s\n\
         \x20          half-open: 1 probe at once, 1 success to close\n\
         \x20          limiter: none\n\
         \x20          lease: default 30s, max 5m, expired IGNORED\n"
    );
    let all = client_json(&server, &["policies"]).await;
    assert_eq!(
        all[0],
        json!({
            "match": "probing/*",
            "default": false,
            "breaker": {
                "mode": "consecutive",
                "failures": 1,
                "break_ms": 1000,
                "multiplier": 1.0,
                "max_break_ms": null,
                "probe_lease_ms": 1000,
                "half_open": { "probes": 3, "successes": 2 },
                "quorum": null,
            },
            "limiter": { "kind": "concurrency", "permits": 4, "queue_limit": 2 },
            "lease": { "default_ms": 30000, "max_ms": 300000, "expired_outcome": "IGNORED" },
            "retry_budget": null,
            "enforce": true,
        })
    );
    assert_eq!(all[1]["default"], true, "{all}");
    assert_eq!(all[1]["match"], Value::Null, "{all}");
    assert_eq!(all[1]["retry_budget"], Value::Null, "{all}");
    assert_eq!(
        all[1]["breaker"]["half_open"],
        json!({ "probes": 1, "successes": 1 }),
        "absent: one probe, one success"
    );
    assert_eq!(all.as_array().map(Vec::len), Some(2));
    server.stop().await;

    // A quorum (Q2) is written out in words and in JSON.
    let server = Server::manual(Some(
        "[default]\nbreaker = { mode = \"consecutive\", failures = 10, break = \"10s\", quorum = 3 }\n",
    ))
    .await;
    let run = client(&server, &["policies"]).await;
    assert!(
        run.ok()
            .contains("\n         quorum: failures from 3 distinct callers to trip\n"),
        "{}",
        run.ok()
    );
    let all = client_json(&server, &["policies"]).await;
    assert_eq!(all[0]["breaker"]["quorum"], 3, "{all}");
}

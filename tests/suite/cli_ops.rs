//! The operator commands of the CLI (issue 4): `fusebox keys`, `fusebox
//! watch` and `fusebox top`, run as subprocesses against a real server on a
//! manual clock (so that nothing moves unless a test moves it). The state
//! is made over gRPC; what the commands print is checked in words and as
//! `--json`. `top` runs under a pseudo-terminal: a tmux server of its own.
//!
//! Nothing here sleeps to synchronise: every wait is for a line, a file or
//! a screen, with a deadline.

use std::process::Stdio;
use std::str::FromStr;
use std::time::Duration;

use fusebox::proto::v1 as pb;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::Child;
use tokio::sync::mpsc;

use crate::admin::advance;
use crate::command::{client, client_json, PATIENCE};
use crate::harness::{self, Server, BIN};

/// `pool/*` has a concurrency limiter of 2; `ratio/*` a ratio breaker;
/// every other key opens after 2 failures in a row, for 1 s.
const CONFIG: &str = r#"
[[rule]]
match = "pool/*"
breaker = { mode = "consecutive", failures = 2, break = "1s" }
limiter = { kind = "concurrency", permits = 2, queue_limit = 2 }

[[rule]]
match = "ratio/*"
breaker = { mode = "ratio", failure_ratio = 0.5, minimum_throughput = 4, sampling_window = "10s", break = "2s" }

[default]
breaker = { mode = "consecutive", failures = 2, break = "1s" }
"#;

// ---------------------------------------------------------------------------
// Making state over gRPC.
// ---------------------------------------------------------------------------

/// Acquires one permit on `key`; returns the decision and the ticket.
async fn acquire(server: &Server, key: &str) -> (pb::Decision, String) {
    let r = server
        .fusebox()
        .await
        .acquire(crate::admin::one_permit(key))
        .await
        .expect("Acquire answers")
        .into_inner();
    (
        pb::Decision::try_from(r.decision).expect("a decision"),
        r.ticket,
    )
}

async fn complete(server: &Server, ticket: &str, outcome: pb::Outcome) -> pb::Phase {
    let r = crate::admin::complete(&mut server.fusebox().await, ticket, outcome).await;
    pb::Phase::try_from(r.phase).expect("a phase")
}

/// One granted call on `key` that ends with `outcome`.
async fn call(server: &Server, key: &str, outcome: pb::Outcome) -> pb::Phase {
    let (decision, ticket) = acquire(server, key).await;
    assert_eq!(decision, pb::Decision::Granted, "{key}");
    complete(server, &ticket, outcome).await
}

/// Two failures in a row: the breaker opens (CONFIG).
async fn trip(server: &Server, key: &str) {
    call(server, key, pb::Outcome::Failure).await;
    assert_eq!(
        call(server, key, pb::Outcome::Failure).await,
        pb::Phase::Open,
        "{key} trips"
    );
}

async fn isolate(server: &Server, key: &str, who: &str, reason: &str) {
    let mut admin = server.admin().await;
    let isolated = harness::steer(&mut admin, true, Some(who), key, reason).await;
    isolated.expect("Isolate answers");
}

async fn close(server: &Server, key: &str, who: &str, reason: &str) {
    let mut admin = server.admin().await;
    let closed = harness::steer(&mut admin, false, Some(who), key, reason).await;
    closed.expect("Close answers");
}

// ---------------------------------------------------------------------------
// Expected output.
// ---------------------------------------------------------------------------

/// A key as `keys --json` prints it: every field at its fresh value, then
/// `fields` and `stats` over them.
fn key(name: &str, phase: &str, fields: Value, stats: Value) -> Value {
    let mut key = json!({
        "key": name,
        "phase": phase,
        "open_remaining_ms": null,
        "failure_ratio": null,
        "consecutive_failures": 0,
        "half_open_attempts": 0,
        "probes_held": 0,
        "half_open_successes": 0,
        "live_slow": 0,
        "adaptive_limit": 0,
        "free": 0,
        "limit": 0,
        "queued": 0,
        "waiters": 0,
        "live_tickets": 0,
        "requests": 0,
        "phase_changed_at": "checked apart",
        "stats": {
            "granted": 0,
            "probes": 0,
            "blocked": 0,
            "refused": 0,
            "denied": 0,
            "retry_denied": 0,
            "by_reason": {},
            "queued": 0,
            "evicted": 0,
            "timed_out": 0,
            "withdrawn": 0,
            "successes": 0,
            "failures": 0,
            "ignored": 0,
            "stale": 0,
            "expired": 0,
            "slow": 0,
            "shadow": 0,
        },
    });
    for (field, value) in fields.as_object().expect("an object") {
        assert!(key.get(field).is_some(), "no field {field}");
        key[field] = value.clone();
    }
    for (field, value) in stats.as_object().expect("an object") {
        assert!(key["stats"].get(field).is_some(), "no stat {field}");
        key["stats"][field] = value.clone();
    }
    key
}

/// Checks that `text` is an RFC 3339 time; returns it.
fn rfc3339(text: &str) -> prost_types::Timestamp {
    prost_types::Timestamp::from_str(text)
        .unwrap_or_else(|e| panic!("{text:?} is an RFC 3339 time: {e}"))
}

/// A key printed by the CLI, with its `phase_changed_at` checked to be a
/// time to the millisecond and put aside, so that the rest compares exactly.
fn settled(mut key: Value) -> Value {
    let at = key["phase_changed_at"]
        .as_str()
        .unwrap_or_else(|| panic!("phase_changed_at is a time: {key}"))
        .to_owned();
    let t = rfc3339(&at);
    assert_eq!(t.nanos % 1_000_000, 0, "to the millisecond: {at}");
    key["phase_changed_at"] = json!("checked apart");
    key
}

/// A transition as `watch --json` prints it: its sequence number and its
/// time (to be checked apart), and the event with both put aside and its
/// key's state settled, so that the rest compares exactly.
fn apart(mut event: Value) -> (u64, String, Value) {
    let sequence = event["sequence"].as_u64().expect("a sequence number");
    let at = event["at"].as_str().expect("a time").to_owned();
    event["sequence"] = json!("checked apart");
    event["at"] = json!("checked apart");
    event["state"] = settled(event["state"].clone());
    (sequence, at, event)
}

fn settled_all(keys: Value) -> Value {
    Value::Array(
        keys.as_array()
            .unwrap_or_else(|| panic!("a JSON array: {keys}"))
            .iter()
            .cloned()
            .map(settled)
            .collect(),
    )
}

/// The keys named in a `keys --json` answer.
fn names(keys: &Value) -> Vec<String> {
    keys.as_array()
        .unwrap_or_else(|| panic!("a JSON array: {keys}"))
        .iter()
        .map(|k| k["key"].as_str().expect("a key").to_owned())
        .collect()
}

/// Splits a watch line into its time (checked: RFC 3339, whole seconds)
/// and the rest.
fn timed(line: &str) -> &str {
    let (at, rest) = line
        .split_once(' ')
        .unwrap_or_else(|| panic!("a time, then words: {line:?}"));
    assert!(at.ends_with('Z'), "a UTC time: {line:?}");
    assert_eq!(rfc3339(at).nanos, 0, "to the second: {line:?}");
    rest
}

// ---------------------------------------------------------------------------
// keys
// ---------------------------------------------------------------------------

/// Five keys, one in each situation worth showing (on a manual clock).
async fn five_keys(server: &Server) {
    // OPEN, 750 ms left, one request blocked.
    trip(server, "pay/charge").await;
    advance(server, 250).await;
    assert_eq!(acquire(server, "pay/charge").await.0, pb::Decision::Blocked);
    // ISOLATED by an operator; the refused request counts.
    isolate(server, "pay/refund", "cli:alice", "INC-4711").await;
    assert_eq!(acquire(server, "pay/refund").await.0, pb::Decision::Refused);
    // One of two permits held.
    assert_eq!(acquire(server, "pool/db").await.0, pb::Decision::Granted);
    // Ratio mode: one failure in two (below the minimum throughput).
    call(server, "ratio/search", pb::Outcome::Failure).await;
    call(server, "ratio/search", pb::Outcome::Success).await;
    // A healthy key.
    call(server, "svc", pb::Outcome::Success).await;
}

#[tokio::test]
async fn keys_prints_a_table_and_json_of_every_key() {
    let server = Server::manual(Some(CONFIG)).await;
    let run = client(&server, &["keys"]).await;
    assert_eq!(run.ok(), "no keys\n");
    assert_eq!(client_json(&server, &["keys"]).await, json!([]));

    five_keys(&server).await;
    let run = client(&server, &["keys"]).await;
    assert_eq!(
        run.ok(),
        "\
KEY           PHASE     BREAK LEFT  FAIL RATIO  FREE/LIMIT  QUEUED  TICKETS  REQUESTS
pay/charge    OPEN           750ms           -           -       0        0         3
pay/refund    ISOLATED           -           -           -       0        0         1
pool/db       CLOSED             -           -         1/2       0        1         1
ratio/search  CLOSED             -       50.0%           -       0        0         2
svc           CLOSED             -           -           -       0        0         1
"
    );

    let all = client_json(&server, &["keys"]).await;
    assert_eq!(
        settled_all(all),
        json!([
            key(
                "pay/charge",
                "OPEN",
                json!({"open_remaining_ms": 750, "consecutive_failures": 2, "requests": 3}),
                json!({"granted": 2, "failures": 2, "blocked": 1, "by_reason": {"open": 1}}),
            ),
            key(
                "pay/refund",
                "ISOLATED",
                json!({"requests": 1}),
                json!({"refused": 1}),
            ),
            key(
                "pool/db",
                "CLOSED",
                json!({"free": 1, "limit": 2, "live_tickets": 1, "requests": 1}),
                json!({"granted": 1}),
            ),
            key(
                "ratio/search",
                "CLOSED",
                json!({"failure_ratio": 0.5, "requests": 2}),
                json!({"granted": 2, "failures": 1, "successes": 1}),
            ),
            key(
                "svc",
                "CLOSED",
                json!({"requests": 1}),
                json!({"granted": 1, "successes": 1}),
            ),
        ])
    );
    // The wire's time of the last phase change, as the CLI shows it.
    let state = server.get("pay/charge").await;
    let wire = state.phase_changed_at.expect("a time");
    let printed = client_json(&server, &["keys", "pay/charge"]).await[0]["phase_changed_at"]
        .as_str()
        .expect("a time")
        .to_owned();
    let printed = rfc3339(&printed);
    assert_eq!(
        (printed.seconds, printed.nanos / 1_000_000),
        (wire.seconds, wire.nanos / 1_000_000)
    );

    // The table follows the breaker: past the deadline it still reads OPEN
    // (B6), with no time left.
    advance(&server, 750).await;
    let run = client(&server, &["keys", "pay/c"]).await;
    assert_eq!(
        run.ok(),
        "\
KEY         PHASE  BREAK LEFT  FAIL RATIO  FREE/LIMIT  QUEUED  TICKETS  REQUESTS
pay/charge  OPEN          0ms           -           -       0        0         3
"
    );
}

#[tokio::test]
async fn keys_filters_by_prefix_and_phase() {
    let server = Server::manual(Some(CONFIG)).await;
    five_keys(&server).await;

    let run = client(&server, &["keys", "pay/"]).await;
    let lines: Vec<&str> = run.ok().lines().collect();
    assert_eq!(lines.len(), 3, "a header and two keys: {lines:?}");
    assert!(lines[1].starts_with("pay/charge  OPEN "), "{lines:?}");
    assert!(lines[2].starts_with("pay/refund  ISOLATED "), "{lines:?}");
    assert_eq!(
        names(&client_json(&server, &["keys", "p"]).await),
        ["pay/charge", "pay/refund", "pool/db"]
    );

    for (args, expected) in [
        (&["keys", "--phase", "open"][..], &["pay/charge"][..]),
        (&["keys", "--phase", "ISOLATED"], &["pay/refund"]),
        (
            &["keys", "--phase", "open,isolated"],
            &["pay/charge", "pay/refund"],
        ),
        (
            &["keys", "--phase", "isolated", "--phase", "open"],
            &["pay/charge", "pay/refund"],
        ),
        (
            &["keys", "--phase", "closed"],
            &["pool/db", "ratio/search", "svc"],
        ),
        (&["keys", "--phase", "half_open"], &[]),
        (&["keys", "--phase", "half-open"], &[]),
        (&["keys", "p", "--phase", "closed"], &["pool/db"]),
        (&["keys", "ratio/", "--phase", "open"], &[]),
    ] {
        assert_eq!(
            names(&client_json(&server, args).await),
            expected,
            "{args:?}"
        );
    }

    let run = client(&server, &["keys", "--phase", "half_open"]).await;
    assert_eq!(run.ok(), "no keys in phase HALF_OPEN\n");
    let run = client(&server, &["keys", "ratio/", "--phase", "open,isolated"]).await;
    assert_eq!(
        run.ok(),
        "no keys start with \"ratio/\" and are in phase OPEN or ISOLATED\n"
    );
    let run = client(&server, &["keys", "nothing/"]).await;
    assert_eq!(run.ok(), "no keys start with \"nothing/\"\n");

    // A phase the CLI does not know is a usage error naming the phases.
    let run = client(&server, &["keys", "--phase", "broken"]).await;
    let message = run.failed(2);
    for phase in ["closed", "open", "half_open", "isolated"] {
        assert!(message.contains(phase), "{message:?}");
    }
    // A prefix the server refuses names the field.
    let run = client(&server, &["keys", "a\u{7}b"]).await;
    run.failed_saying(1, "error: INVALID_ARGUMENT: prefix: ");
}

#[tokio::test]
async fn keys_fetches_every_page() {
    let server = Server::manual(Some(CONFIG)).await;
    let names_made: Vec<String> = (0..150).map(|i| format!("bulk/{i:03}")).collect();
    let mut made = tokio::task::JoinSet::new();
    let mut admitter = server.fusebox().await;
    for name in names_made.clone() {
        let mut c = admitter.clone();
        made.spawn(async move {
            c.acquire(pb::AcquireRequest {
                key: name,
                permits: Some(1),
                max_wait: None,
                lease: None,
                ..Default::default()
            })
            .await
            .expect("Acquire answers")
        });
    }
    while let Some(done) = made.join_next().await {
        done.expect("the acquire task ends");
    }
    admitter
        .acquire(crate::admin::one_permit("other"))
        .await
        .expect("Acquire answers");

    // The premise: one default page does not hold them all.
    let first = server
        .admin()
        .await
        .list_keys(pb::ListKeysRequest {
            prefix: "bulk/".into(),
            ..Default::default()
        })
        .await
        .expect("ListKeys answers")
        .into_inner();
    assert_eq!(first.keys.len(), 100);
    assert!(!first.next_page_token.is_empty(), "more than one page");

    let all = client_json(&server, &["keys", "bulk/"]).await;
    assert_eq!(names(&all), names_made, "every key, once, in key order");
    let everything = client_json(&server, &["keys"]).await;
    assert_eq!(everything.as_array().map(Vec::len), Some(151));
    assert_eq!(everything[150]["key"], "other");

    let run = client(&server, &["keys", "bulk/"]).await;
    let lines: Vec<&str> = run.ok().lines().collect();
    assert_eq!(lines.len(), 151, "a header and 150 keys");
    for (line, name) in lines[1..].iter().zip(&names_made) {
        assert!(
            line.starts_with(&format!("{name}  CLOSED ")),
            "{line:?} is {name}"
        );
    }
}

// ---------------------------------------------------------------------------
// watch
// ---------------------------------------------------------------------------

/// A `fusebox watch` running in the background, its output read line by line.
struct Watcher {
    child: Child,
    lines: mpsc::Receiver<String>,
    stderr: tokio::task::JoinHandle<String>,
}

impl Watcher {
    /// Starts `fusebox watch ARGS --server ADDR`. Its lines are read ahead
    /// up to `ahead` lines; with 1, a test that stops asking for lines soon
    /// stops the watcher (its output pipe fills up).
    fn start(server: &Server, args: &[&str], ahead: usize) -> Watcher {
        let mut child = crate::process::spawn(
            tokio::process::Command::new(BIN)
                .arg("watch")
                .args(args)
                .args(["--server", server.addr.as_str()])
                .stderr(Stdio::piped()),
            "fusebox watch starts",
        );
        let mut stderr = child.stderr.take().expect("stderr piped");
        let stderr = tokio::spawn(async move {
            let mut text = String::new();
            let _ = stderr.read_to_string(&mut text).await;
            text
        });
        let stdout = child.stdout.take().expect("stdout piped");
        let (tx, lines) = mpsc::channel(ahead);
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if tx.send(line).await.is_err() {
                    return;
                }
            }
        });
        Watcher {
            child,
            lines,
            stderr,
        }
    }

    /// The next line, which must come within the deadline.
    async fn line(&mut self, what: &str) -> String {
        match tokio::time::timeout(PATIENCE, self.lines.recv()).await {
            Ok(Some(line)) => line,
            Ok(None) => panic!("watch ended before {what}"),
            Err(_) => panic!("no line within {PATIENCE:?}: waiting for {what}"),
        }
    }

    /// The next line, as JSON.
    async fn json(&mut self, what: &str) -> Value {
        let line = self.line(what).await;
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}"))
    }

    /// Sends SIGINT, as Ctrl-C does.
    fn interrupt(&self) {
        let pid = self.child.id().expect("running");
        assert!(harness::signal(pid, "INT"), "kill -INT {pid}");
    }

    /// Waits for the end: the exit code, the lines not read yet, and
    /// standard error.
    async fn end(mut self) -> (Option<i32>, Vec<String>, String) {
        let status = tokio::time::timeout(PATIENCE, self.child.wait())
            .await
            .expect("watch ends within the deadline")
            .expect("its status");
        let mut rest = Vec::new();
        while let Some(line) = tokio::time::timeout(PATIENCE, self.lines.recv())
            .await
            .expect("standard output closes")
        {
            rest.push(line);
        }
        let stderr = tokio::time::timeout(PATIENCE, self.stderr)
            .await
            .expect("standard error closes")
            .expect("the reader ends");
        (status.code(), rest, stderr)
    }
}

#[tokio::test]
async fn watch_prints_the_snapshot_then_each_transition_in_words() {
    let server = Server::manual(Some(CONFIG)).await;
    trip(&server, "pay/old").await;
    call(&server, "other/x", pb::Outcome::Success).await;

    let mut watch = Watcher::start(&server, &["pay/"], 1000);
    assert_eq!(
        watch.line("the snapshot's header").await,
        "KEY      PHASE  BREAK LEFT  FAIL RATIO  FREE/LIMIT  QUEUED  TICKETS  REQUESTS"
    );
    assert_eq!(
        watch.line("the snapshot's key").await,
        "pay/old  OPEN         1.0s           -           -       0        0         2"
    );
    let line = watch.line("the end of the snapshot").await;
    assert_eq!(
        timed(&line),
        "snapshot: 1 key starting with \"pay/\"; watching for transitions"
    );

    // A key outside the prefix trips first: its line never shows.
    trip(&server, "other/x").await;
    trip(&server, "pay/charge").await;
    let line = watch.line("the trip").await;
    assert_eq!(
        timed(&line),
        "pay/charge CLOSED -> OPEN  failures reached the trip condition"
    );

    // Operators: who and why.
    isolate(&server, "pay/charge", "cli:alice", "INC-4711").await;
    let line = watch.line("the isolate").await;
    assert_eq!(
        timed(&line),
        "pay/charge OPEN -> ISOLATED  isolated by cli:alice: INC-4711"
    );
    close(&server, "pay/charge", "cli:bob", "INC-4711 resolved").await;
    let line = watch.line("the close").await;
    assert_eq!(
        timed(&line),
        "pay/charge ISOLATED -> CLOSED  closed by cli:bob: INC-4711 resolved"
    );

    // The breaker's own moves: the probe, and its failure.
    advance(&server, 1000).await;
    let (decision, probe) = acquire(&server, "pay/old").await;
    assert_eq!(decision, pb::Decision::Probe);
    let line = watch.line("the probe").await;
    assert_eq!(
        timed(&line),
        "pay/old OPEN -> HALF_OPEN  the break ended and a probe was admitted"
    );
    complete(&server, &probe, pb::Outcome::Failure).await;
    let line = watch.line("the failed probe").await;
    assert_eq!(timed(&line), "pay/old HALF_OPEN -> OPEN  the probe failed");

    // Ctrl-C ends it cleanly.
    watch.interrupt();
    let (code, rest, stderr) = watch.end().await;
    assert_eq!(code, Some(0), "Ctrl-C exits 0; stderr {stderr:?}");
    assert_eq!(rest, Vec::<String>::new(), "nothing more");
    assert_eq!(stderr, "");
}

#[tokio::test]
async fn watch_json_prints_one_object_per_event() {
    let server = Server::manual(Some(CONFIG)).await;

    // An empty snapshot first.
    let mut empty = Watcher::start(&server, &["nothing/", "--json"], 1000);
    assert_eq!(
        empty.json("the empty snapshot").await,
        json!({"event": "snapshot", "complete": true, "keys": []})
    );
    let mut words = Watcher::start(&server, &["nothing/"], 1000);
    let line = words.line("the empty snapshot").await;
    assert_eq!(
        timed(&line),
        "snapshot: 0 keys starting with \"nothing/\"; watching for transitions"
    );

    call(&server, "pool/a", pb::Outcome::Failure).await;
    let mut watch = Watcher::start(&server, &["pool/", "--json"], 1000);
    let snapshot = watch.json("the snapshot").await;
    assert_eq!(snapshot["event"], "snapshot");
    assert_eq!(snapshot["complete"], true);
    assert_eq!(
        settled_all(snapshot["keys"].clone()),
        json!([key(
            "pool/a",
            "CLOSED",
            json!({"free": 2, "limit": 2, "consecutive_failures": 1, "requests": 1}),
            json!({"granted": 1, "failures": 1}),
        )])
    );

    call(&server, "pool/a", pb::Outcome::Failure).await;
    let (first, at, trip) = apart(watch.json("the trip").await);
    assert_eq!(rfc3339(&at).nanos % 1_000_000, 0, "to the millisecond");
    assert_eq!(
        trip,
        json!({
            "event": "transition",
            "sequence": "checked apart",
            "at": "checked apart",
            "key": "pool/a",
            "kind": "phase_change",
            "from": "CLOSED",
            "to": "OPEN",
            "cause": "failures reached the trip condition",
            "who": null,
            "reason": null,
            "state": key(
                "pool/a",
                "OPEN",
                json!({
                    "free": 2, "limit": 2, "consecutive_failures": 2,
                    "open_remaining_ms": 1000, "requests": 2,
                }),
                json!({"granted": 2, "failures": 2}),
            ),
        })
    );

    isolate(&server, "pool/a", "cli:alice", "INC-4711: provider outage").await;
    let (sequence, at, isolated) = apart(watch.json("the isolate").await);
    assert_eq!(sequence, first + 1, "the next event");
    rfc3339(&at);
    assert_eq!(
        isolated,
        json!({
            "event": "transition",
            "sequence": "checked apart",
            "at": "checked apart",
            "key": "pool/a",
            "kind": "isolate",
            "from": "OPEN",
            "to": "ISOLATED",
            "cause": "isolated by an operator",
            "who": "cli:alice",
            "reason": "INC-4711: provider outage",
            "state": key(
                "pool/a",
                "ISOLATED",
                json!({"free": 2, "limit": 2, "consecutive_failures": 2, "requests": 2}),
                json!({"granted": 2, "failures": 2}),
            ),
        })
    );

    // The server shutting down ends the stream UNAVAILABLE: the watcher
    // says why and exits non-zero, since it did not see everything.
    server.terminate();
    for watcher in [watch, empty, words] {
        let (code, rest, stderr) = watcher.end().await;
        assert_eq!(rest, Vec::<String>::new());
        assert!(
            code.is_some_and(|c| c != 0),
            "exit {code:?}, stderr {stderr:?}"
        );
        assert!(
            stderr.contains("the watch stream broke") && stderr.contains("shutting down"),
            "stderr {stderr:?}"
        );
    }
}

#[tokio::test]
async fn a_watcher_that_falls_behind_says_so_and_shows_a_fresh_snapshot() {
    let server = Server::manual(Some(CONFIG)).await;
    // Long keys make big events, so that the buffers between the server and
    // the stalled reader (the pipe, HTTP/2 windows) fill sooner.
    let name = format!("lag/{}", "k".repeat(240));
    call(&server, &name, pb::Outcome::Success).await;

    // The watcher's output is read no further than the snapshot: once the
    // pipe is full the watcher cannot write, so it stops reading the stream
    // and falls behind.
    let mut watch = Watcher::start(&server, &["lag/", "--json"], 1);
    let snapshot = watch.json("the first snapshot").await;
    assert_eq!(snapshot["event"], "snapshot");
    assert_eq!(names(&snapshot["keys"]), [name.as_str()]);

    // Well past the engine's buffer of 4096 events plus what the pipe and
    // the HTTP/2 flow-control windows hold (events with long reasons fill
    // them sooner).
    const PAIRS: usize = 4_000;
    const TASKS: usize = 16;
    let reason = "drill ".repeat(160);
    let admin = server.admin().await;
    let mut tasks = tokio::task::JoinSet::new();
    for part in 0..TASKS {
        let mut admin = admin.clone();
        let key = format!("{name}{part:02}");
        let reason = reason.clone();
        tasks.spawn(async move {
            for _ in 0..PAIRS / TASKS {
                for isolate in [true, false] {
                    harness::steer(&mut admin, isolate, None, &key, &reason)
                        .await
                        .expect("Isolate and Close answer");
                }
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("the task ends");
    }
    isolate(&server, &name, "cli:alice", "after the flood").await;

    // What was buffered comes first, then the marker.
    let mut transitions = 0usize;
    let missed = loop {
        let event = watch.json("a lagged event").await;
        match event["event"].as_str() {
            Some("transition") => transitions += 1,
            Some("lagged") => break event["missed"].as_u64().expect("a count"),
            other => panic!("a transition or a lagged event, not {other:?}: {event}"),
        }
    };
    assert!(missed > 0, "it missed events");
    assert!(
        transitions as u64 + missed <= 2 * PAIRS as u64 + 1,
        "{transitions} printed and {missed} missed of {} events",
        2 * PAIRS + 1
    );
    // Then a fresh snapshot (one part: fewer than 100 keys) of every
    // matching key as it is now.
    let fresh = watch.json("the fresh snapshot").await;
    assert_eq!(fresh["event"], "snapshot", "{fresh}");
    assert_eq!(fresh["complete"], true);
    let keys = fresh["keys"].as_array().expect("keys");
    assert_eq!(keys.len(), TASKS + 1, "the key and its siblings");
    for (i, key) in keys.iter().enumerate() {
        let (expected_key, expected_phase) = match i {
            0 => (name.clone(), "ISOLATED"),
            i => (format!("{name}{:02}", i - 1), "CLOSED"),
        };
        assert_eq!(key["key"], json!(expected_key));
        assert_eq!(key["phase"], expected_phase, "{expected_key}");
    }

    // The watch goes on: a new event comes through.
    close(&server, &name, "cli:bob", "all clear").await;
    loop {
        let event = watch.json("the close after the flood").await;
        if event["event"] == "transition" && event["reason"] == "all clear" {
            assert_eq!(event["who"], "cli:bob");
            break;
        }
    }
    watch.interrupt();
    let (code, _, stderr) = watch.end().await;
    assert_eq!(code, Some(0), "stderr {stderr:?}");
}

// ---------------------------------------------------------------------------
// top
// ---------------------------------------------------------------------------

/// A tmux server of its own, on a socket in a temp dir of its own (so that
/// tests never share one, and nothing is left behind), running one session
/// with a 160 x 40 pane. Dropping it kills that server, whatever happened.
struct Tmux {
    dir: tempfile::TempDir,
}

impl Tmux {
    /// Starts `command` (a shell command line) in a new session; `dir`
    /// holds the socket and whatever the command writes.
    fn start(command: &str, dir: tempfile::TempDir) -> Tmux {
        let tmux = Tmux { dir };
        let output = tmux.run(&[
            "new-session",
            "-d",
            "-s",
            "top",
            "-x",
            "160",
            "-y",
            "40",
            command,
        ]);
        assert!(
            output.status.success(),
            "tmux starts: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        tmux
    }

    fn run(&self, args: &[&str]) -> std::process::Output {
        std::process::Command::new("tmux")
            .arg("-S")
            .arg(self.dir.path().join("tmux.sock"))
            .args(["-f", "/dev/null"])
            .args(args)
            .env_remove("TMUX")
            .stdin(Stdio::null())
            .output()
            .expect("tmux runs (apt-get install tmux)")
    }

    /// The pane's text as it is on screen now.
    fn screen(&self) -> String {
        let output = self.run(&["capture-pane", "-p", "-t", "top"]);
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// A tmux format, e.g. `#{alternate_on}`, for the pane.
    fn format(&self, format: &str) -> String {
        let output = self.run(&["display-message", "-p", "-t", "top", format]);
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }

    fn keys(&self, keys: &str) {
        let output = self.run(&["send-keys", "-t", "top", keys]);
        assert!(output.status.success(), "tmux send-keys {keys}");
    }

    /// Waits until the screen satisfies `check`; returns the screen.
    async fn until(&self, what: &str, check: impl Fn(&str) -> bool) -> String {
        let mut last = String::new();
        let found = tokio::time::timeout(PATIENCE, async {
            loop {
                let screen = self.screen();
                if check(&screen) {
                    return screen;
                }
                last = screen;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        found.unwrap_or_else(|_| panic!("the screen never showed {what}; it shows:\n{last}"))
    }

    /// A path in the session's temp dir.
    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.run(&["kill-server"]);
    }
}

/// Runs `fusebox top ARGS` in a tmux pane, in a shell that records the
/// terminal's mode before and after and the exit code, then waits for a
/// line (so that the pane stays up to be inspected).
fn top_in_tmux(server: &Server, args: &str) -> Tmux {
    let dir = tempfile::tempdir().expect("a temp dir");
    let at = |name: &str| dir.path().join(name).display().to_string();
    // The shell catches SIGINT with a trap (so it goes on after top exits
    // on Ctrl-C); top itself starts with the default handling.
    let command = format!(
        "trap 'true' INT; stty -g > {before}; {BIN} top {args} --server {addr}; \
         echo $? > {code}; stty -g > {after}; echo top exited; read line",
        before = at("before"),
        after = at("after"),
        code = at("code"),
        addr = server.addr,
    );
    Tmux::start(&command, dir)
}

/// The row of `key` on a `top` screen, and its line number.
fn row<'a>(screen: &'a str, key: &str) -> Option<(usize, &'a str)> {
    screen
        .lines()
        .enumerate()
        .find(|(_, line)| line.starts_with(&format!("{key} ")))
}

/// Waits for top to exit and checks that it left the terminal as it found
/// it: exit code 0, the same mode (stty), the normal screen, a cursor.
async fn check_clean_exit(tmux: &Tmux) {
    tmux.until("top's exit", |s| s.contains("top exited")).await;
    let code = std::fs::read_to_string(tmux.path("code")).expect("the exit code");
    assert_eq!(code.trim(), "0", "top exits 0");
    let before = std::fs::read_to_string(tmux.path("before")).expect("the mode before");
    let after = std::fs::read_to_string(tmux.path("after")).expect("the mode after");
    assert_eq!(before, after, "the terminal's mode is restored");
    assert_eq!(
        tmux.format("#{alternate_on} #{cursor_flag}"),
        "0 1",
        "back on the normal screen, cursor shown"
    );
    let screen = tmux.screen();
    assert!(
        !screen.contains("KEY "),
        "the table is gone with the alternate screen:\n{screen}"
    );
}

#[tokio::test]
async fn top_shows_a_tripped_key_live_and_quits_on_q() {
    if !crate::tools::tmux("top_shows_a_tripped_key_live_and_quits_on_q") {
        return;
    }
    let server = Server::manual(Some(CONFIG)).await;
    isolate(&server, "svc/iso", "cli:alice", "INC-4711").await;
    for _ in 0..3 {
        call(&server, "svc/busy", pb::Outcome::Success).await;
    }
    call(&server, "svc/idle", pb::Outcome::Success).await;

    // A long interval: the trip must show through the Watch stream, not a
    // poll.
    let tmux = top_in_tmux(&server, "--interval 1h");
    let screen = tmux
        .until("the three keys", |s| {
            row(s, "svc/iso").is_some() && row(s, "svc/idle").is_some()
        })
        .await;
    let first = screen.lines().next().unwrap_or_default();
    assert!(
        first.starts_with(&format!("fusebox top  {}  ", server.addr)),
        "the header names the server:\n{screen}"
    );
    assert!(
        screen.contains("3 keys: 1 isolated, 0 open, 0 half-open, 2 closed"),
        "{screen}"
    );
    assert_eq!(
        tmux.format("#{alternate_on} #{cursor_flag}"),
        "1 0",
        "on the alternate screen, cursor hidden"
    );

    trip(&server, "svc/bad").await;
    let screen = tmux
        .until("svc/bad as OPEN", |s| {
            row(s, "svc/bad").is_some_and(|(_, line)| line.contains(" OPEN "))
        })
        .await;
    assert!(
        screen.contains(
            "4 keys: 1 isolated, 1 open, 0 half-open, 2 closed   \
             refresh every 1h and at each transition   q quits"
        ),
        "{screen}"
    );
    // The most broken first, then the busiest.
    let order: Vec<usize> = ["svc/iso", "svc/bad", "svc/busy", "svc/idle"]
        .iter()
        .map(|k| {
            row(&screen, k)
                .unwrap_or_else(|| panic!("{k} shown:\n{screen}"))
                .0
        })
        .collect();
    assert!(
        order.windows(2).all(|w| w[0] < w[1]),
        "{order:?}:\n{screen}"
    );
    let (_, bad) = row(&screen, "svc/bad").expect("shown");
    let cells: Vec<&str> = bad.split_whitespace().collect();
    assert_eq!(
        cells,
        ["svc/bad", "OPEN", "1.0s", "-", "-", "0", "0", "2"],
        "{bad:?}"
    );
    assert!(
        screen.contains("svc/bad CLOSED -> OPEN  failures reached the trip condition"),
        "the transition is listed:\n{screen}"
    );

    tmux.keys("q");
    check_clean_exit(&tmux).await;
}

#[tokio::test]
async fn top_follows_a_prefix_by_polling_and_quits_on_ctrl_c() {
    if !crate::tools::tmux("top_follows_a_prefix_by_polling_and_quits_on_ctrl_c") {
        return;
    }
    let server = Server::manual(Some(CONFIG)).await;
    call(&server, "pay/a", pb::Outcome::Success).await;
    call(&server, "other/b", pb::Outcome::Success).await;

    let tmux = top_in_tmux(&server, "pay/ --interval 100ms");
    let screen = tmux.until("pay/a", |s| row(s, "pay/a").is_some()).await;
    assert!(row(&screen, "other/b").is_none(), "{screen}");
    assert!(screen.contains("keys starting with \"pay/\""), "{screen}");

    // A new key shows at the next poll (no transition announces it).
    call(&server, "pay/new", pb::Outcome::Success).await;
    tmux.until("pay/new", |s| row(s, "pay/new").is_some()).await;
    trip(&server, "pay/a").await;
    tmux.until("pay/a as OPEN", |s| {
        row(s, "pay/a").is_some_and(|(_, line)| line.contains(" OPEN "))
    })
    .await;

    tmux.keys("C-c");
    check_clean_exit(&tmux).await;
}

#[tokio::test]
async fn top_needs_a_terminal_and_a_sensible_interval() {
    let server = Server::manual(Some(CONFIG)).await;
    // Standard output is a pipe here.
    let run = client(&server, &["top"]).await;
    let message = run.failed(1);
    assert!(
        message.contains("needs a terminal") && message.contains("fusebox keys"),
        "{message:?}"
    );
    let run = client(&server, &["top", "--json"]).await;
    let message = run.failed(1);
    assert!(message.contains("keys --json"), "{message:?}");
    for bad in ["0s", "5"] {
        let run = client(&server, &["top", "--interval", bad]).await;
        let message = run.failed(2);
        assert!(message.contains("--interval"), "{message:?}");
    }
}

//! The Rust client tool (`examples/client_tool.rs`) speaks the protocol of
//! `clients/README.md`: a worker's events for guards that succeed, fail,
//! hang and are released, are refused (on the server's word, then locally,
//! then on the server's word again after `forget`), and for a command it
//! cannot read; one `bench` line.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use crate::harness::Server;

const LIMIT: Duration = Duration::from_secs(30);

/// One failure opens `svc/*` for 10 s; other keys have the default policy.
const CONFIG: &str =
    "[[rule]]\nmatch = \"svc/*\"\nbreaker = { mode = \"consecutive\", failures = 1, break = \"10s\" }\n";

struct Worker {
    child: Child,
    stdin: Option<ChildStdin>,
    events: Lines<BufReader<ChildStdout>>,
}

impl Worker {
    fn start(tool: &Path, server: &Server) -> Worker {
        let mut child = Command::new(tool)
            .args(["worker", "--target", &server.addr])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("the client tool starts");
        let stdin = child.stdin.take();
        let events = BufReader::new(child.stdout.take().expect("stdout piped")).lines();
        Worker {
            child,
            stdin,
            events,
        }
    }

    async fn send(&mut self, command: Value) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin
            .write_all(format!("{command}\n").as_bytes())
            .await
            .expect("the worker reads its input");
        stdin.flush().await.expect("flushed");
    }

    async fn next(&mut self) -> Value {
        let line = tokio::time::timeout(LIMIT, self.events.next_line())
            .await
            .expect("the worker writes an event in time")
            .expect("stdout readable")
            .expect("an event, not the end of the output");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON: {line:?}: {e}"))
    }

    /// Reads the next event and checks that it has every field of `want`.
    async fn expect(&mut self, want: Value) -> Value {
        let got = self.next().await;
        for (k, v) in want.as_object().expect("an object") {
            assert_eq!(got.get(k), Some(v), "{k} of {got} (wanted {want})");
        }
        got
    }

    /// A guard of `call` on `key`: its `running` event when it runs, and
    /// its `done` event, which is returned.
    async fn guard(&mut self, id: &str, key: &str, call: &str, runs: bool) -> Value {
        self.send(json!({"op": "guard", "id": id, "key": key, "call": call}))
            .await;
        if runs {
            self.expect(json!({"event": "running", "id": id})).await;
        }
        self.expect(json!({"event": "done", "id": id})).await
    }

    async fn exit_code(mut self) -> Option<i32> {
        drop(self.stdin.take());
        let status = tokio::time::timeout(LIMIT, self.child.wait())
            .await
            .expect("the worker exits in time")
            .expect("the worker's status");
        status.code()
    }
}

const DONE_FIELDS: [&str; 9] = [
    "event",
    "id",
    "ran",
    "refusal",
    "reason",
    "retry_after_ms",
    "local",
    "error",
    "unavailable",
];

fn check(done: &Value, want: Value) {
    let obj = done.as_object().expect("an object");
    let mut fields: Vec<&str> = obj.keys().map(String::as_str).collect();
    fields.sort();
    let mut all = DONE_FIELDS.to_vec();
    all.sort();
    assert_eq!(fields, all, "the fields of {done}");
    for (k, v) in want.as_object().expect("an object") {
        assert_eq!(obj.get(k), Some(v), "{k} of {done}");
    }
}

#[tokio::test]
async fn the_worker_speaks_the_client_tool_protocol() {
    let Some(tool) = crate::tools::client_tool("the_worker_speaks_the_client_tool_protocol") else {
        return;
    };
    let server = Server::manual(Some(CONFIG)).await;
    let mut w = Worker::start(&tool, &server);
    w.expect(json!({"event": "ready", "lang": "rust"})).await;

    let done = w.guard("g1", "other/a", "succeed", true).await;
    check(
        &done,
        json!({"ran": true, "refusal": null, "reason": null, "retry_after_ms": null,
               "local": false, "error": false, "unavailable": false}),
    );

    w.send(json!({"op": "guard", "id": "g2", "key": "other/a", "call": "hang"}))
        .await;
    w.expect(json!({"event": "running", "id": "g2"})).await;
    w.send(json!({"op": "release", "id": "g2"})).await;
    let done = w.expect(json!({"event": "done", "id": "g2"})).await;
    check(&done, json!({"ran": true, "refusal": null, "error": false}));

    let done = w.guard("g3", "svc/a", "fail", true).await;
    check(&done, json!({"ran": true, "refusal": null, "error": true}));
    // Its failure is reported in the background (clients/README.md,
    // "Outcomes off the caller's path"): the next guard must find it there.
    crate::harness::eventually("svc/a to open", LIMIT, || async {
        (server.get("svc/a").await.phase == fusebox::proto::v1::Phase::Open as i32).then_some(())
    })
    .await;

    let done = w.guard("g4", "svc/a", "succeed", false).await;
    check(
        &done,
        json!({"ran": false, "refusal": "blocked", "reason": "open",
               "retry_after_ms": 10000, "local": false, "error": false}),
    );
    let done = w.guard("g5", "svc/a", "succeed", false).await;
    check(
        &done,
        json!({"ran": false, "refusal": "blocked", "reason": "open", "local": true}),
    );

    w.send(json!({"op": "forget", "key": "svc/a"})).await;
    w.expect(json!({"event": "forgotten", "key": "svc/a"}))
        .await;
    let done = w.guard("g6", "svc/a", "succeed", false).await;
    check(
        &done,
        json!({"ran": false, "refusal": "blocked", "reason": "open",
               "retry_after_ms": 10000, "local": false}),
    );

    // A call still hanging at the end of the input returns a value.
    w.send(json!({"op": "guard", "id": "g7", "key": "other/b", "call": "hang"}))
        .await;
    w.expect(json!({"event": "running", "id": "g7"})).await;
    drop(w.stdin.take());
    let done = w.expect(json!({"event": "done", "id": "g7"})).await;
    check(&done, json!({"ran": true, "refusal": null, "error": false}));
    assert_eq!(w.exit_code().await, Some(0));

    // A command it cannot read: an error event, exit 1.
    let mut w = Worker::start(&tool, &server);
    w.expect(json!({"event": "ready"})).await;
    w.send(json!({"op": "guard", "id": "g1", "key": "other/a", "call": "explode"}))
        .await;
    let error = w.expect(json!({"event": "error"})).await;
    assert!(error["message"].is_string(), "{error}");
    assert_eq!(w.exit_code().await, Some(1));
}

#[tokio::test]
async fn the_bench_writes_one_line_of_timings() {
    let Some(tool) = crate::tools::client_tool("the_bench_writes_one_line_of_timings") else {
        return;
    };
    let server = Server::manual(None).await;
    let out = tokio::time::timeout(
        LIMIT * 2,
        Command::new(&tool)
            .args([
                "bench",
                "--target",
                &server.addr,
                "--key",
                "bench/tool",
                "--iterations",
                "50",
            ])
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the bench ends in time")
    .expect("the bench runs");
    let stdout = String::from_utf8(out.stdout).expect("UTF-8");
    assert!(
        out.status.success(),
        "bench failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {stdout:?}");
    let line: Value = serde_json::from_str(lines[0]).expect("a JSON line");
    assert_eq!(line["lang"], "rust");
    assert_eq!(line["iterations"], 50);
    for unit in ["raw_us", "guard_us"] {
        let median = line[unit]["median"].as_f64().expect("a median");
        let p99 = line[unit]["p99"].as_f64().expect("a p99");
        assert!(0.0 < median && median <= p99, "{unit} of {line}");
    }
    // Every round's Acquire was granted and completed: 2 units × 55 rounds.
    let state = server.get("bench/tool").await;
    let stats = state.stats.expect("stats");
    assert_eq!((stats.granted, stats.successes), (110, 110), "{stats:?}");
}

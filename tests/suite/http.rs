//! The HTTP side against a real server: `/metrics` read by the official
//! Prometheus parser (the Python client's, at `FUSEBOX_TEST_PYTHON`; the
//! tests that need it skip without it, see [`crate::tools`]) after a
//! scripted scenario over gRPC, with exact values; per-key series bounded
//! to the busiest keys and those named by exact rules; `/healthz` and
//! `/readyz` (503 while the server drains); the dashboard's JSON API (the
//! overview, pages of keys, actions), its event stream and the cap on
//! event streams.

use std::collections::{BTreeMap, BTreeSet};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use fusebox::proto::v1 as pb;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tonic::transport::Channel;

use crate::harness::{eventually, Options, Server};

/// Safety net for conditions reached asynchronously.
const LIMIT: Duration = Duration::from_secs(20);

// ---------- a minimal HTTP/1.1 client (no client crate in the build) ----------

/// An HTTP answer.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Reply {
    /// A header's value (names compared without case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }
}

fn decode_chunked(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let line_end = raw
            .windows(2)
            .position(|w| w == b"\r\n")
            .expect("a chunk size line");
        let size_text = std::str::from_utf8(&raw[..line_end]).expect("ASCII chunk size");
        let size = usize::from_str_radix(size_text.split(';').next().unwrap().trim(), 16)
            .expect("a hex chunk size");
        raw = &raw[line_end + 2..];
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&raw[..size]);
        raw = &raw[size + 2..];
    }
}

/// Sends one request on a new connection and reads the whole answer.
pub async fn request(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Reply {
    let mut stream = TcpStream::connect(addr)
        .await
        .unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    if !body.is_empty() || method == "POST" {
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    stream
        .write_all(head.as_bytes())
        .await
        .expect("request sent");
    stream.write_all(body).await.expect("body sent");
    let mut raw = Vec::new();
    tokio::time::timeout(LIMIT, stream.read_to_end(&mut raw))
        .await
        .unwrap_or_else(|_| panic!("{method} {path}: no complete answer within {LIMIT:?}"))
        .expect("answer read");
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no header end in {:?}", String::from_utf8_lossy(&raw)));
    let head = String::from_utf8(raw[..split].to_vec()).expect("ASCII head");
    let mut lines = head.split("\r\n");
    let status_line = lines.next().expect("a status line");
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    let chunked = headers.iter().any(|(n, v)| {
        n.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked")
    });
    if chunked {
        body = decode_chunked(&body);
    }
    Reply {
        status,
        headers,
        body: String::from_utf8(body).expect("a UTF-8 body"),
    }
}

/// `GET path`.
pub async fn get(addr: &str, path: &str) -> Reply {
    request(addr, "GET", path, &[], b"").await
}

/// `POST path` with a JSON body.
pub async fn post_json(addr: &str, path: &str, body: &str) -> Reply {
    request(
        addr,
        "POST",
        path,
        &[("Content-Type", "application/json")],
        body.as_bytes(),
    )
    .await
}

fn http_addr(server: &Server) -> String {
    server
        .http_addr
        .clone()
        .expect("the server prints `http on ADDR` second")
}

// ---------- /metrics through the official parser ----------

const PARSE: &str = r#"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
families = []
for family in text_string_to_metric_families(sys.stdin.read()):
    families.append({
        "name": family.name,
        "type": family.type,
        "help": family.documentation,
        "samples": [{"name": s.name, "labels": s.labels, "value": s.value} for s in family.samples],
    })
print(json.dumps(families))
"#;

/// One sample as the parser read it.
#[derive(Debug, Clone)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// An exposition as the official parser read it.
#[derive(Debug)]
struct Metrics {
    /// Family name (without `_total` for counters, as the parser names
    /// them) to its type.
    types: BTreeMap<String, String>,
    samples: Vec<Sample>,
}

impl Metrics {
    /// The value of the sample `name` with exactly `labels`.
    fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let want: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        self.samples
            .iter()
            .find(|s| s.name == name && s.labels == want)
            .map(|s| s.value)
    }

    /// Like [`Metrics::get`], but the sample must exist.
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.get(name, labels)
            .unwrap_or_else(|| panic!("no sample {name}{labels:?} in /metrics"))
    }

    /// The keys that have per-key series.
    fn per_key_keys(&self) -> BTreeSet<String> {
        self.samples
            .iter()
            .filter_map(|s| s.labels.get("key").cloned())
            .collect()
    }
}

/// The only family without the `fusebox_` prefix: the standard name that
/// load tools and dashboards look for.
const PROCESS_RSS: &str = "process_resident_memory_bytes";

/// Parses `text` with `prometheus_client.parser` (run by `python`) and
/// checks what a text parser lets pass: every family typed and named
/// `fusebox_*` (or [`PROCESS_RSS`]), each family in one block, no series
/// twice.
fn parse_metrics(python: &std::path::Path, text: &str) -> Metrics {
    let mut child = std::process::Command::new(python)
        .arg("-c")
        .arg(PARSE)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{} does not run: {e}", python.display()));
    child
        .stdin
        .take()
        .expect("stdin piped")
        .write_all_sync(text.as_bytes());
    let out = child.wait_with_output().expect("the parser runs");
    assert!(
        out.status.success(),
        "the Prometheus parser refused /metrics: {}\n--- the text:\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    let families: Vec<serde_json::Value> =
        serde_json::from_slice(&out.stdout).expect("the parser's JSON");
    let mut types = BTreeMap::new();
    let mut samples = Vec::new();
    let mut series = BTreeSet::new();
    for f in &families {
        let name = f["name"].as_str().expect("a family name").to_owned();
        let kind = f["type"].as_str().expect("a type").to_owned();
        assert!(
            name.starts_with("fusebox_") || name == PROCESS_RSS,
            "{name} lacks the fusebox_ prefix"
        );
        assert!(
            kind == "counter" || kind == "gauge",
            "{name} is typed {kind:?}: a TYPE line is missing or does not match its samples"
        );
        assert!(
            !f["help"].as_str().unwrap_or("").is_empty(),
            "{name} has no HELP"
        );
        assert!(
            types.insert(name.clone(), kind).is_none(),
            "{name} appears in more than one block"
        );
        for s in f["samples"].as_array().expect("samples") {
            let labels: BTreeMap<String, String> =
                serde_json::from_value(s["labels"].clone()).expect("labels");
            let sample = Sample {
                name: s["name"].as_str().expect("a sample name").to_owned(),
                labels,
                value: s["value"].as_f64().expect("a value"),
            };
            assert!(
                series.insert(format!("{}{:?}", sample.name, sample.labels)),
                "{} {:?} appears twice",
                sample.name,
                sample.labels
            );
            samples.push(sample);
        }
    }
    Metrics { types, samples }
}

trait WriteAllSync {
    fn write_all_sync(self, bytes: &[u8]);
}

impl WriteAllSync for std::process::ChildStdin {
    fn write_all_sync(mut self, bytes: &[u8]) {
        std::io::Write::write_all(&mut self, bytes).expect("the parser reads its input");
    }
}

/// `/metrics` as text.
pub(crate) async fn metrics_text(server: &Server) -> String {
    let reply = get(&http_addr(server), "/metrics").await;
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(
        reply.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    reply.body
}

/// `/metrics`, read by the official parser.
async fn scrape(server: &Server, python: &std::path::Path) -> (String, Metrics) {
    let text = metrics_text(server).await;
    let metrics = parse_metrics(python, &text);
    (text, metrics)
}

/// The value of an unlabelled sample, read without the official parser
/// (for tests about something else than the format).
fn plain_value(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no sample {name} in /metrics:\n{text}"))
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("{name}: not a number: {e}"))
}

/// The text without the samples that move by themselves (memory).
fn steady(text: &str) -> String {
    text.lines()
        .filter(|l| !l.starts_with(PROCESS_RSS))
        .collect::<Vec<_>>()
        .join("\n")
}

type Client = pb::fusebox_client::FuseboxClient<Channel>;

fn ask(key: &str, permits: u32) -> pb::AcquireRequest {
    pb::AcquireRequest {
        permits: Some(permits),
        ..crate::admin::request(key)
    }
}

async fn acquire(client: &mut Client, key: &str, permits: u32) -> pb::AcquireResponse {
    client
        .acquire(ask(key, permits))
        .await
        .unwrap_or_else(|s| panic!("Acquire {key:?}: {s:?}"))
        .into_inner()
}

async fn granted(client: &mut Client, key: &str) -> String {
    let r = acquire(client, key, 1).await;
    assert_eq!(r.decision, pb::Decision::Granted as i32, "{key}: {r:?}");
    r.ticket
}

fn decision(r: &pb::AcquireResponse) -> pb::Decision {
    pb::Decision::try_from(r.decision).expect("a decision")
}

const SCENARIO: &str = r#"
[server]
max_keys = 5000
max_tickets = 6000
max_waiters = 700
idle_after = "90s"

[[rule]]
match = "pay/charge"
breaker = { mode = "consecutive", failures = 3, break = "10s" }

[[rule]]
match = "lim/*"
breaker = { mode = "ratio", failure_ratio = 0.5, minimum_throughput = 10, sampling_window = "10s", break = "5s" }
limiter = { kind = "concurrency", permits = 1 }
"#;

/// A key that needs escaping in a label value.
const ODD_KEY: &str = r#"odd/"quoted"\back"#;

#[tokio::test]
async fn metrics_parse_and_count_a_scripted_scenario_exactly() {
    let Some(python) = crate::tools::python("metrics_parse_and_count_a_scripted_scenario_exactly")
    else {
        return;
    };
    let server = Server::manual(Some(SCENARIO)).await;
    let mut c = server.fusebox().await;

    // Before anything: the exact-rule key has series as a fresh key would.
    let (_, m) = scrape(&server, &python).await;
    assert_eq!(m.value("fusebox_keys", &[]), 0.0);
    assert_eq!(
        m.value(
            "fusebox_key_phase",
            &[("key", "pay/charge"), ("phase", "CLOSED")]
        ),
        1.0
    );
    assert_eq!(m.per_key_keys(), BTreeSet::from(["pay/charge".to_owned()]));

    // pay/charge: three failures trip it (3 granted), then two are blocked.
    for _ in 0..3 {
        let t = granted(&mut c, "pay/charge").await;
        crate::admin::complete(&mut c, &t, pb::Outcome::Failure).await;
    }
    for _ in 0..2 {
        let r = acquire(&mut c, "pay/charge", 1).await;
        assert_eq!(decision(&r), pb::Decision::Blocked, "{r:?}");
    }
    // lim/x: a success, a failure, one ticket held; then no permits, and
    // a request above the limit.
    let t = granted(&mut c, "lim/x").await;
    crate::admin::complete(&mut c, &t, pb::Outcome::Success).await;
    let t = granted(&mut c, "lim/x").await;
    crate::admin::complete(&mut c, &t, pb::Outcome::Failure).await;
    let _held = granted(&mut c, "lim/x").await;
    let r = acquire(&mut c, "lim/x", 1).await;
    assert_eq!(decision(&r), pb::Decision::Denied, "{r:?}");
    assert_eq!(r.reason, pb::Reason::NoPermits as i32);
    let r = acquire(&mut c, "lim/x", 5).await;
    assert_eq!(r.reason, pb::Reason::ExceedsLimit as i32, "{r:?}");
    // A status check answers but is not a decision that counts.
    acquire(&mut c, "lim/x", 0).await;
    // iso/y: isolated by an operator, then refused once.
    let isolate = crate::harness::by(
        "test-op",
        pb::IsolateRequest {
            key: "iso/y".into(),
            reason: "INC-1: vendor down".into(),
        },
    );
    server
        .admin()
        .await
        .isolate(isolate)
        .await
        .expect("Isolate answers");
    let r = acquire(&mut c, "iso/y", 1).await;
    assert_eq!(decision(&r), pb::Decision::Refused, "{r:?}");
    // A key whose label needs escaping, with its ticket held.
    let _odd = granted(&mut c, ODD_KEY).await;

    let (text, m) = scrape(&server, &python).await;
    // Engine-wide.
    let expect = [
        ("fusebox_keys", 4.0),
        ("fusebox_tickets", 2.0),
        ("fusebox_waiters", 0.0),
        ("fusebox_keys_forgotten_total", 0.0),
        ("fusebox_max_keys", 5000.0),
        ("fusebox_max_tickets", 6000.0),
        ("fusebox_max_waiters", 700.0),
        ("fusebox_idle_after_seconds", 90.0),
        ("fusebox_rules", 2.0),
        ("fusebox_shutting_down", 0.0),
        ("fusebox_transitions_total", 2.0),
        ("fusebox_config_reloads_total", 0.0),
        ("fusebox_config_reload_failures_total", 0.0),
        ("fusebox_config_last_reload_success", 1.0),
        ("fusebox_metrics_top_keys", 100.0),
        ("fusebox_other_keys_live_tickets", 0.0),
        ("fusebox_other_keys_waiters", 0.0),
        ("fusebox_event_streams", 0.0),
        ("fusebox_event_streams_refused_total", 0.0),
        ("fusebox_max_event_streams", 64.0),
    ];
    for (name, value) in expect {
        assert_eq!(m.value(name, &[]), value, "{name}\n{text}");
    }
    if cfg!(target_os = "linux") {
        // A debug server with four keys holds a few MB at least.
        let rss = m.value(PROCESS_RSS, &[]);
        assert!(rss > 1_000_000.0, "{PROCESS_RSS} {rss}");
        assert_eq!(m.types.get(PROCESS_RSS).map(String::as_str), Some("gauge"));
    }
    for (phase, n) in [
        ("CLOSED", 2.0),
        ("OPEN", 1.0),
        ("HALF_OPEN", 0.0),
        ("ISOLATED", 1.0),
    ] {
        assert_eq!(
            m.value("fusebox_keys_by_phase", &[("phase", phase)]),
            n,
            "{phase}"
        );
        assert_eq!(m.value("fusebox_other_keys", &[("phase", phase)]), 0.0);
    }
    for (d, n) in [
        ("granted", 7.0),
        ("probe", 0.0),
        ("blocked", 2.0),
        ("refused", 1.0),
        ("denied", 2.0),
    ] {
        assert_eq!(
            m.value("fusebox_decisions_total", &[("decision", d)]),
            n,
            "{d}"
        );
    }
    for (reason, n) in [
        ("open", 2.0),
        ("probe_in_flight", 0.0),
        ("no_permits", 1.0),
        ("queue_full", 0.0),
        ("exceeds_limit", 1.0),
        ("evicted", 0.0),
        ("timeout", 0.0),
    ] {
        assert_eq!(
            m.value("fusebox_denials_total", &[("reason", reason)]),
            n,
            "{reason}"
        );
    }
    // Types, as the parser names families (counters without `_total`).
    for (family, kind) in [
        ("fusebox_keys", "gauge"),
        ("fusebox_keys_forgotten", "counter"),
        ("fusebox_decisions", "counter"),
        ("fusebox_denials", "counter"),
        ("fusebox_transitions", "counter"),
        ("fusebox_config_reloads", "counter"),
        ("fusebox_config_reload_failures", "counter"),
        ("fusebox_config_last_reload_success", "gauge"),
        ("fusebox_keys_by_phase", "gauge"),
        ("fusebox_key_phase", "gauge"),
        ("fusebox_key_requests", "counter"),
        ("fusebox_key_free_permits", "gauge"),
        ("fusebox_other_keys", "gauge"),
    ] {
        assert_eq!(
            m.types.get(family).map(String::as_str),
            Some(kind),
            "{family}"
        );
    }

    // Per key: every key is among the busiest 100.
    assert_eq!(
        m.per_key_keys(),
        BTreeSet::from(["pay/charge", "lim/x", "iso/y", ODD_KEY].map(str::to_owned))
    );
    let pay = [("key", "pay/charge")];
    for (phase, n) in [
        ("CLOSED", 0.0),
        ("OPEN", 1.0),
        ("HALF_OPEN", 0.0),
        ("ISOLATED", 0.0),
    ] {
        assert_eq!(
            m.value(
                "fusebox_key_phase",
                &[("key", "pay/charge"), ("phase", phase)]
            ),
            n
        );
    }
    let requests = |key: &str, d: &str| {
        m.value(
            "fusebox_key_requests_total",
            &[("key", key), ("decision", d)],
        )
    };
    assert_eq!(requests("pay/charge", "granted"), 3.0);
    assert_eq!(requests("pay/charge", "blocked"), 2.0);
    assert_eq!(requests("lim/x", "granted"), 3.0);
    assert_eq!(requests("lim/x", "denied"), 2.0);
    assert_eq!(requests("iso/y", "refused"), 1.0);
    assert_eq!(requests(ODD_KEY, "granted"), 1.0);
    for (family, labels, n) in [
        (
            "fusebox_key_denials_total",
            [("key", "pay/charge"), ("reason", "open")],
            2.0,
        ),
        (
            "fusebox_key_denials_total",
            [("key", "lim/x"), ("reason", "no_permits")],
            1.0,
        ),
        (
            "fusebox_key_outcomes_total",
            [("key", "pay/charge"), ("outcome", "failure")],
            3.0,
        ),
        (
            "fusebox_key_phase",
            [("key", "iso/y"), ("phase", "ISOLATED")],
            1.0,
        ),
    ] {
        assert_eq!(m.value(family, &labels), n, "{family}{labels:?}");
    }
    assert_eq!(m.value("fusebox_key_consecutive_failures", &pay), 3.0);
    // The manual clock has not moved: the whole 10 s break is left.
    assert_eq!(m.value("fusebox_key_break_remaining_seconds", &pay), 10.0);
    assert_eq!(m.get("fusebox_key_free_permits", &pay), None, "no limiter");
    let lim = [("key", "lim/x")];
    assert_eq!(m.value("fusebox_key_failure_ratio", &lim), 0.5);
    assert_eq!(m.value("fusebox_key_free_permits", &lim), 0.0);
    assert_eq!(m.value("fusebox_key_permit_limit", &lim), 1.0);
    assert_eq!(m.value("fusebox_key_live_tickets", &lim), 1.0);
    assert_eq!(m.value("fusebox_key_queued_permits", &lim), 0.0);
    assert_eq!(
        m.value("fusebox_key_live_tickets", &[("key", ODD_KEY)]),
        1.0
    );
    assert!(
        text.contains(r#"key="odd/\"quoted\"\\back""#),
        "the label value is escaped in the text"
    );

    // Reading never admits (B6): a second scrape, on a clock that has not
    // moved, reads the same (but for the process's memory).
    let (again, _) = scrape(&server, &python).await;
    assert_eq!(steady(&again), steady(&text));
}

#[tokio::test]
async fn per_key_series_are_bounded_to_the_busiest_and_the_exact_rules() {
    let Some(python) =
        crate::tools::python("per_key_series_are_bounded_to_the_busiest_and_the_exact_rules")
    else {
        return;
    };
    let config = r#"
[[rule]]
match = "pinned/one"
breaker = { mode = "consecutive", failures = 2, break = "1m" }
"#;
    let server = Server::manual(Some(config)).await;
    let mut c = server.fusebox().await;
    // bulk/000..099 are asked twice, bulk/100..119 once: the busiest 100
    // are the first hundred.
    for i in 0..120 {
        let key = format!("bulk/{i:03}");
        let times = if i < 100 { 2 } else { 1 };
        for _ in 0..times {
            granted(&mut c, &key).await;
        }
    }
    let (_, m) = scrape(&server, &python).await;
    let mut expected: BTreeSet<String> = (0..100).map(|i| format!("bulk/{i:03}")).collect();
    // An exact rule's key has series even though nobody used it.
    expected.insert("pinned/one".to_owned());
    assert_eq!(m.per_key_keys(), expected);
    assert_eq!(m.value("fusebox_keys", &[]), 120.0);
    assert_eq!(m.value("fusebox_other_keys", &[("phase", "CLOSED")]), 20.0);
    assert_eq!(m.value("fusebox_other_keys", &[("phase", "OPEN")]), 0.0);
    assert_eq!(m.value("fusebox_other_keys_live_tickets", &[]), 20.0);
    assert_eq!(m.value("fusebox_tickets", &[]), 220.0);
    assert_eq!(
        m.value(
            "fusebox_key_phase",
            &[("key", "pinned/one"), ("phase", "CLOSED")]
        ),
        1.0
    );
    assert_eq!(
        m.value(
            "fusebox_key_requests_total",
            &[("key", "pinned/one"), ("decision", "granted")]
        ),
        0.0
    );
    // Using the quiet ones makes them the busiest: the set follows.
    for i in 100..120 {
        for _ in 0..3 {
            granted(&mut c, &format!("bulk/{i:03}")).await;
        }
    }
    let (_, m) = scrape(&server, &python).await;
    let keys = m.per_key_keys();
    assert_eq!(keys.len(), 101);
    assert!((100..120).all(|i| keys.contains(&format!("bulk/{i:03}"))));
    assert!(keys.contains("pinned/one"));
    assert!(
        !keys.contains("bulk/099"),
        "ties are broken by key order: the last ones go"
    );
    assert_eq!(m.value("fusebox_other_keys", &[("phase", "CLOSED")]), 20.0);
    // Twenty keys asked twice are left out, each holding its two tickets.
    assert_eq!(m.value("fusebox_other_keys_live_tickets", &[]), 40.0);
}

// ---------- health and readiness ----------

/// A request body that sends one message and then never ends: the call
/// stays in flight, so the server drains instead of exiting at once.
struct Unfinished {
    first: Option<pb::GetKeyRequest>,
    polled: Option<tokio::sync::oneshot::Sender<()>>,
}

impl tokio_stream::Stream for Unfinished {
    type Item = pb::GetKeyRequest;

    fn poll_next(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if let Some(polled) = self.polled.take() {
            let _ = polled.send(());
        }
        match self.first.take() {
            Some(first) => Poll::Ready(Some(first)),
            None => Poll::Pending,
        }
    }
}

#[tokio::test]
async fn healthz_and_readyz_answer_and_readyz_turns_503_while_draining() {
    let mut server = Server::start(Options::default()).await;
    let http = http_addr(&server);
    let health = get(&http, "/healthz").await;
    assert_eq!((health.status, health.body.as_str()), (200, "ok\n"));
    let ready = get(&http, "/readyz").await;
    assert_eq!((ready.status, ready.body.as_str()), (200, "ready\n"));
    assert_eq!(get(&http, "/nowhere").await.status, 404);

    // A live event stream, read up to its first snapshot.
    let mut events = TcpStream::connect(&http).await.expect("connects");
    events
        .write_all(
            format!("GET /api/events HTTP/1.1\r\nHost: {http}\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await
        .expect("sent");
    let mut seen = Vec::new();
    tokio::time::timeout(LIMIT, async {
        let mut buf = [0u8; 4096];
        while !String::from_utf8_lossy(&seen).contains("event: snapshot") {
            let n = events.read(&mut buf).await.expect("readable");
            assert!(n > 0, "the stream ended before its snapshot");
            seen.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .expect("a snapshot within the limit");
    assert!(String::from_utf8_lossy(&seen).contains("text/event-stream"));

    // Hold a gRPC call in flight, and make sure the server has it: an
    // answer on the same connection, asked after it, comes after it.
    let channel = server.channel().await;
    let (polled_tx, polled_rx) = tokio::sync::oneshot::channel();
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    let held = tokio::spawn(async move {
        grpc.ready().await.expect("ready");
        let body = Unfinished {
            first: Some(pb::GetKeyRequest { key: "held".into() }),
            polled: Some(polled_tx),
        };
        let _ = grpc
            .client_streaming::<_, pb::GetKeyRequest, pb::KeyState, _>(
                tonic::Request::new(body),
                tonic::codegen::http::uri::PathAndQuery::from_static("/fusebox.v1.Admin/GetKey"),
                tonic_prost::ProstCodec::default(),
            )
            .await;
    });
    polled_rx.await.expect("the held call starts");
    pb::admin_client::AdminClient::new(channel)
        .get_key(pb::GetKeyRequest { key: "k".into() })
        .await
        .expect("GetKey answers");
    // Each call is its own task on the server, run in no set order: the
    // held call counts as in flight once its task has run.
    eventually("the held call to be in flight", LIMIT, || async {
        let text = metrics_text(&server).await;
        (plain_value(&text, "fusebox_calls_in_flight") >= 1.0).then_some(())
    })
    .await;

    server.terminate();
    eventually("/readyz to answer 503", LIMIT, || {
        let http = http.clone();
        async move {
            let r = get(&http, "/readyz").await;
            (r.status == 503).then_some(r)
        }
    })
    .await;
    // Alive while it drains, and says so in the metrics.
    assert_eq!(get(&http, "/healthz").await.status, 200);
    let text = metrics_text(&server).await;
    assert_eq!(plain_value(&text, "fusebox_shutting_down"), 1.0);
    // The event stream ends with the shutdown.
    tokio::time::timeout(LIMIT, async {
        let mut rest = Vec::new();
        events.read_to_end(&mut rest).await.expect("readable");
    })
    .await
    .expect("the event stream ends when the server shuts down");

    held.abort();
    let status = tokio::time::timeout(LIMIT, server.child.wait())
        .await
        .expect("the server exits once the held call is gone")
        .expect("wait works");
    assert!(status.success(), "{status:?}");
}

// ---------- the dashboard's JSON API ----------

#[tokio::test]
async fn the_api_lists_keys_and_isolates_and_closes_with_who_and_why() {
    let server = Server::manual(None).await;
    let http = http_addr(&server);
    let mut c = server.fusebox().await;
    granted(&mut c, "api/a").await;
    granted(&mut c, "other/b").await;

    let listing = get(&http, "/api/keys?prefix=api%2F").await;
    assert_eq!(listing.status, 200, "{listing:?}");
    let json = listing.json();
    assert_eq!(json["keys"].as_array().map(Vec::len), Some(1), "{json}");
    assert_eq!(json["keys"][0]["key"], "api/a");
    assert_eq!(json["keys"][0]["phase"], "CLOSED");
    assert_eq!(json["keys"][0]["live_tickets"], 1);
    assert_eq!(json["next"], serde_json::Value::Null);
    assert_eq!(
        get(&http, "/api/keys").await.json()["keys"]
            .as_array()
            .map(Vec::len),
        Some(2)
    );
    assert_eq!(
        get(&http, "/api/keys?prefix=zzz").await.json()["keys"],
        serde_json::json!([])
    );

    // Bad requests name the field.
    let field_of = |r: &Reply| r.json()["error"]["field"].as_str().map(str::to_owned);
    let r = get(&http, "/api/keys?colour=red").await;
    assert_eq!((r.status, field_of(&r).as_deref()), (400, Some("query")));
    for (query, field) in [
        ("limit=0", "limit"),
        ("limit=101", "limit"),
        ("after=zz", "after"),
        ("prefix=api%2F&after=00", "after"),
    ] {
        let r = get(&http, &format!("/api/keys?{query}")).await;
        assert_eq!(
            (r.status, field_of(&r).as_deref()),
            (400, Some(field)),
            "{query}"
        );
    }
    // A cursor from one prefix is refused for another.
    let first = get(&http, "/api/keys?limit=1").await.json();
    let next = first["next"].as_str().expect("a next page").to_owned();
    let r = get(&http, &format!("/api/keys?prefix=api%2F&after={next}")).await;
    assert_eq!((r.status, field_of(&r).as_deref()), (400, Some("after")));
    let r = request(
        &http,
        "POST",
        "/api/keys/api%2Fa/isolate",
        &[("Content-Type", "text/plain")],
        br#"{"reason":"x"}"#,
    )
    .await;
    assert_eq!(
        (r.status, field_of(&r).as_deref()),
        (415, Some("Content-Type"))
    );
    for (body, field) in [
        ("{", "body"),
        ("[]", "body"),
        (r#"{"reason":"x","who":"me"}"#, "body"),
        ("{}", "reason"),
        (r#"{"reason":"   "}"#, "reason"),
        (r#"{"reason":7}"#, "reason"),
        (r#"{"reason":"a\u0007b"}"#, "reason"),
    ] {
        let r = post_json(&http, "/api/keys/api%2Fa/isolate", body).await;
        assert_eq!(
            (r.status, field_of(&r).as_deref()),
            (400, Some(field)),
            "{body}: {r:?}"
        );
    }
    let long = "k".repeat(257);
    let r = post_json(
        &http,
        &format!("/api/keys/{long}/close"),
        r#"{"reason":"x"}"#,
    )
    .await;
    assert_eq!((r.status, field_of(&r).as_deref()), (400, Some("key")));
    let r = get(&http, "/api/keys/api%2Fa/isolate").await;
    assert_eq!(r.status, 405, "actions are POST only");

    // Isolate, then close: the engine records the dashboard and the peer.
    let r = post_json(
        &http,
        "/api/keys/api%2Fa/isolate",
        r#"{"reason":"INC-9: drill"}"#,
    )
    .await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.json()["phase"], "ISOLATED");
    assert_eq!(server.get("api/a").await.phase, pb::Phase::Isolated as i32);
    let r = post_json(
        &http,
        "/api/keys/api%2Fa/close",
        r#"{"reason":"drill over"}"#,
    )
    .await;
    assert_eq!(r.json()["phase"], "CLOSED");
    assert_eq!(server.get("api/a").await.phase, pb::Phase::Closed as i32);
    let timeline = eventually("both transitions in the timeline", LIMIT, || {
        let http = http.clone();
        async move {
            let t = get(&http, "/api/transitions?prefix=api%2F").await.json();
            (t.as_array().map_or(0, Vec::len) == 2).then_some(t)
        }
    })
    .await;
    assert_eq!(timeline[0]["kind"], "isolate");
    assert_eq!(timeline[0]["from"], "CLOSED");
    assert_eq!(timeline[0]["to"], "ISOLATED");
    assert_eq!(timeline[0]["reason"], "INC-9: drill");
    let who = timeline[0]["who"].as_str().expect("who");
    assert!(who.starts_with("dashboard:127.0.0.1:"), "{who}");
    assert_eq!(timeline[1]["kind"], "close");
    assert_eq!(timeline[1]["reason"], "drill over");

    // The page and its assets are served from the binary.
    let page = get(&http, "/").await;
    assert_eq!(page.status, 200);
    assert!(page
        .header("content-type")
        .unwrap()
        .starts_with("text/html"));
    assert!(page.body.contains("app.js") && page.body.contains("style.css"));
    for (path, kind) in [("/app.js", "text/javascript"), ("/style.css", "text/css")] {
        let r = get(&http, path).await;
        assert_eq!(r.status, 200, "{path}");
        assert!(
            r.header("content-type").unwrap().starts_with(kind),
            "{path}"
        );
    }
}

/// A connection past `[server] max_connections` is closed before it can ask
/// anything; the open connections are a gauge and the refusals a counter;
/// a connection that closes frees its place.
#[tokio::test]
async fn connections_past_the_cap_are_refused_and_counted() {
    let server = Server::start(Options {
        config: Some("[server]\nmax_connections = 2\n"),
        ..Options::default()
    })
    .await;
    let read = |mut admin: pb::admin_client::AdminClient<Channel>| async move {
        admin
            .get_key(pb::GetKeyRequest { key: "k".into() })
            .await
            .map(|_| admin)
    };
    let first = read(server.admin().await)
        .await
        .expect("the first connection is served");
    let _second = read(server.admin().await)
        .await
        .expect("the second connection is served");
    // The third is accepted by the kernel, then closed by the server at once.
    let third = tonic::transport::Endpoint::from_shared(format!("http://{}", server.addr))
        .expect("an address")
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(5))
        .connect()
        .await;
    if let Ok(channel) = third {
        let status = read(pb::admin_client::AdminClient::new(channel))
            .await
            .expect_err("a connection past the cap is not served");
        // The connection is closed under the client: a transport error
        // (reported as UNAVAILABLE, UNKNOWN or CANCELLED by the client).
        assert!(
            matches!(
                status.code(),
                tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled
            ),
            "{status:?}"
        );
    }
    let text = metrics_text(&server).await;
    assert_eq!(plain_value(&text, "fusebox_max_connections"), 2.0);
    assert_eq!(plain_value(&text, "fusebox_connections"), 2.0);
    assert!(plain_value(&text, "fusebox_connections_refused_total") >= 1.0);

    drop(first);
    eventually("a closed connection frees its place", LIMIT, || async {
        read(server.admin().await).await.ok()
    })
    .await;
}

// ---------- the dashboard at scale: pages, the overview, the stream cap ----------

/// Pages of `/api/keys` follow key order through `next`, never hold more
/// than a page, and end with `next: null`; the overview lists the keys not
/// closed first, with engine-wide totals.
#[tokio::test]
async fn keys_come_in_pages_and_the_overview_puts_broken_keys_first() {
    let server = Server::manual(None).await;
    let http = http_addr(&server);
    let mut c = server.fusebox().await;
    for i in 0..250 {
        granted(&mut c, &format!("page/{i:03}")).await;
    }
    // Three requests: among the busiest hundred, which the overview filters.
    for _ in 0..3 {
        granted(&mut c, "zzz/other").await;
    }
    for _ in 0..5 {
        let t = granted(&mut c, "page/broken").await;
        crate::admin::complete(&mut c, &t, pb::Outcome::Failure).await;
    }
    let isolate = crate::harness::by(
        "test-op",
        pb::IsolateRequest {
            key: "page/iso".into(),
            reason: "drill".into(),
        },
    );
    server
        .admin()
        .await
        .isolate(isolate)
        .await
        .expect("isolated");

    // Every key under page/, once, in order, a page at a time.
    let mut seen = Vec::new();
    let mut after = String::new();
    let mut pages = 0;
    loop {
        let r = get(&http, &format!("/api/keys?prefix=page%2F&after={after}")).await;
        assert_eq!(r.status, 200, "{r:?}");
        let page = r.json();
        let keys = page["keys"].as_array().expect("keys");
        assert!(keys.len() <= 100, "a page holds at most 100 keys");
        seen.extend(keys.iter().map(|k| k["key"].as_str().unwrap().to_owned()));
        pages += 1;
        match page["next"].as_str() {
            Some(next) => after = next.to_owned(),
            None => break,
        }
    }
    assert_eq!(pages, 3);
    let mut want: Vec<String> = (0..250).map(|i| format!("page/{i:03}")).collect();
    want.extend(["page/broken".to_owned(), "page/iso".to_owned()]);
    want.sort();
    assert_eq!(seen, want);
    // A smaller page, and its cursor, work too.
    let two = get(&http, "/api/keys?prefix=page%2F&limit=2").await.json();
    assert_eq!(two["keys"][1]["key"], "page/001");
    let next = two["next"].as_str().expect("more");
    let then = get(
        &http,
        &format!("/api/keys?prefix=page%2F&limit=2&after={next}"),
    )
    .await;
    assert_eq!(then.json()["keys"][0]["key"], "page/002");

    // The overview: engine-wide totals, the keys not closed, the busiest.
    let overview = eventually("an overview with both broken keys", LIMIT, || {
        let http = http.clone();
        async move {
            let o = get(&http, "/api/overview").await.json();
            (o["totals"]["keys"] == 253 && o["attention"].as_array()?.len() == 2).then_some(o)
        }
    })
    .await;
    assert_eq!(overview["totals"]["by_phase"]["OPEN"], 1, "{overview}");
    assert_eq!(overview["totals"]["by_phase"]["ISOLATED"], 1);
    assert_eq!(overview["totals"]["by_phase"]["CLOSED"], 251);
    assert_eq!(overview["attention"][0]["key"], "page/broken");
    assert_eq!(overview["attention"][0]["phase"], "OPEN");
    assert_eq!(overview["attention"][1]["key"], "page/iso");
    assert_eq!(overview["attention_more"], false);
    let busiest = overview["busiest"].as_array().expect("busiest");
    assert!(!busiest.is_empty() && busiest.len() <= 10, "{overview}");
    assert_eq!(
        busiest[0]["key"], "page/broken",
        "five requests: the busiest"
    );
    // With a prefix, only its keys; the totals stay engine-wide.
    let other = get(&http, "/api/overview?prefix=zzz%2F").await.json();
    assert_eq!(other["attention"], serde_json::json!([]));
    assert_eq!(other["busiest"][0]["key"], "zzz/other");
    assert_eq!(other["totals"]["keys"], 253);
}

/// Opens `/api/events` and reads the answer's head: its status.
async fn open_stream(http: &str) -> (u16, TcpStream, String) {
    let mut stream = TcpStream::connect(http).await.expect("connects");
    stream
        .write_all(format!("GET /api/events HTTP/1.1\r\nHost: {http}\r\n\r\n").as_bytes())
        .await
        .expect("sent");
    let (status, text) = read_head(&mut stream).await;
    (status, stream, text)
}

/// Reads the head of an HTTP/1.1 answer from `stream`, each read within
/// 30 s: its status, and the text read (the head, and whatever came with
/// it).
pub(crate) async fn read_head(stream: &mut TcpStream) -> (u16, String) {
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(30), stream.read(&mut buf))
            .await
            .expect("an answer within 30 s")
            .expect("read");
        assert!(n > 0, "the connection closed before the head: {seen:?}");
        seen.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&seen).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status");
    (status, text)
}

/// At most 64 event streams are open at once: the next is answered 503
/// with a JSON error, counted; a stream that closes frees its place.
#[tokio::test]
async fn event_streams_past_the_cap_are_refused_with_503_and_counted() {
    let server = Server::manual(None).await;
    let http = http_addr(&server);
    let mut open = Vec::new();
    for _ in 0..64 {
        let (status, stream, head) = open_stream(&http).await;
        assert_eq!(status, 200, "{head}");
        open.push(stream);
    }
    let refused = get(&http, "/api/events").await;
    assert_eq!(refused.status, 503, "{refused:?}");
    let message = refused.json()["error"]["message"]
        .as_str()
        .expect("a message")
        .to_owned();
    assert!(
        message.contains("too many dashboard event streams"),
        "{message}"
    );
    let text = metrics_text(&server).await;
    assert_eq!(plain_value(&text, "fusebox_event_streams"), 64.0);
    assert_eq!(
        plain_value(&text, "fusebox_event_streams_refused_total"),
        1.0
    );
    assert_eq!(plain_value(&text, "fusebox_max_event_streams"), 64.0);

    drop(open.pop());
    let (_, _again, _) = eventually("a closed stream frees its place", LIMIT, || {
        let http = http.clone();
        async move {
            let (status, stream, head) = open_stream(&http).await;
            (status == 200).then_some((status, stream, head))
        }
    })
    .await;
}

// ---------- /metrics through a Rust parser ----------

/// Every family the server has is in `/metrics` with its type, as a parser
/// of the text format (the `openmetrics-parser` crate) reads it, and a key
/// with quotes and backslashes comes back as it was in its label. (A key
/// cannot hold a line feed: the unit tests of the exposition give a label
/// one.)
#[tokio::test]
async fn metrics_read_by_a_rust_parser_have_every_family_with_its_type() {
    use fusebox::http::metrics::{When, FAMILIES};
    use openmetrics_parser::PrometheusType;
    let dir = tempfile::tempdir().expect("a temp dir");
    let data = dir.path().join("data");
    let data = data.to_str().expect("a UTF-8 path");
    let server = Server::start(Options {
        args: vec!["--data-dir", data],
        ..Options::default()
    })
    .await;
    let mut c = server.fusebox().await;
    let ticket = granted(&mut c, ODD_KEY).await;
    let text = metrics_text(&server).await;
    let parsed = openmetrics_parser::prometheus::parse_prometheus(&text)
        .unwrap_or_else(|e| panic!("the text does not parse: {e:?}\n{text}"));
    for family in FAMILIES {
        let present = match family.when {
            When::Always | When::Embedded | When::DataDir => true,
            When::Linux => cfg!(target_os = "linux"),
            When::Store | When::Tls | When::TlsExpiry | When::Telemetry => false,
        };
        let found = parsed.families.get(family.name);
        assert_eq!(
            found.is_some(),
            present,
            "{} ({:?}) in /metrics:\n{text}",
            family.name,
            family.when
        );
        if let Some(found) = found {
            let kind = match family.kind {
                fusebox::http::metrics::Type::Counter => PrometheusType::Counter,
                fusebox::http::metrics::Type::Gauge => PrometheusType::Gauge,
            };
            assert_eq!(found.family_type, kind, "{}", family.name);
            assert_eq!(found.help, family.help, "{}", family.name);
            let mut labels: Vec<&str> = family.labels.to_vec();
            labels.sort_unstable();
            for sample in found.iter_samples() {
                let set = sample.get_labelset().expect("labels");
                let mut names: Vec<&str> = set.iter_names().map(String::as_str).collect();
                names.sort_unstable();
                assert_eq!(names, labels, "{}", family.name);
            }
        }
    }
    assert_eq!(
        parsed.families.len(),
        FAMILIES
            .iter()
            .filter(|f| parsed.families.contains_key(f.name))
            .count(),
        "every family in /metrics is in the table"
    );
    let live = &parsed.families["fusebox_key_live_tickets"];
    let odd = live
        .iter_samples()
        .find(|s| {
            s.get_labelset()
                .is_ok_and(|l| l.get_label_value("key") == Some(ODD_KEY))
        })
        .unwrap_or_else(|| panic!("{ODD_KEY} round-trips in its label:\n{text}"));
    match &odd.value {
        openmetrics_parser::PrometheusValue::Gauge(n) => assert_eq!(n.as_f64(), 1.0),
        other => panic!("a gauge, not {other:?}"),
    }
    crate::admin::complete(&mut c, &ticket, pb::Outcome::Success).await;
}

// ---------- bounded half-open (H1-H2) on every surface ----------

/// Keys in `probing/*` open at one failure for 1 s, then probe with three
/// slots at once and close at the second probe success.
const PROBING: &str = r#"
[[rule]]
match = "probing/*"
breaker = { mode = "consecutive", failures = 1, break = "1s", half_open = { probes = 3, successes = 2 } }
"#;

/// The value of one series (`name{labels}` exactly as written), read
/// without the official parser.
fn series(text: &str, series: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (name, value) = l.rsplit_once(' ')?;
        (name == series).then(|| value.parse().ok())?
    })
}

/// Trips `key` (a `probing/*` key on a manual clock), ends its break, and
/// leaves it half-open with two of its three probe slots held and one of
/// the two successes that close it counted: two probes, the first a
/// success (its slot freed), then a third probe.
async fn two_slots_held_one_success(server: &Server, key: &str) {
    let mut c = server.fusebox().await;
    let first = granted(&mut c, key).await;
    crate::admin::complete(&mut c, &first, pb::Outcome::Failure).await;
    crate::admin::advance_clock(&mut server.clock().await, 1000).await;
    let one = probe(&mut c, key).await;
    let _two = probe(&mut c, key).await;
    let done = crate::admin::complete(&mut c, &one, pb::Outcome::Success).await;
    assert_eq!(
        done.phase,
        pb::Phase::HalfOpen as i32,
        "one of two successes"
    );
    let _three = probe(&mut c, key).await;
}

/// The ticket of a PROBE answer on `key`.
async fn probe(c: &mut Client, key: &str) -> String {
    let r = acquire(c, key, 1).await;
    assert_eq!(decision(&r), pb::Decision::Probe, "{r:?}");
    r.ticket
}

/// The same figures of a half-open key on gRPC, the dashboard's JSON and
/// `/metrics`: probe slots held, the successes counted, and the policy's
/// `half_open`.
async fn check_probing_surfaces(server: &Server, key: &str) {
    let state = server.get(key).await;
    assert_eq!(state.phase, pb::Phase::HalfOpen as i32, "{state:?}");
    assert_eq!(
        (state.probes_held, state.half_open_successes),
        (2, 1),
        "{state:?}"
    );
    let http = http_addr(server);
    let page = get(&http, "/api/keys?prefix=probing%2F").await.json();
    let row = &page["keys"][0];
    assert_eq!(row["key"], key, "{page}");
    assert_eq!(row["phase"], "HALF_OPEN", "{row}");
    assert_eq!(row["probes_held"], 2, "{row}");
    assert_eq!(row["half_open_successes"], 1, "{row}");
    assert_eq!(
        row["half_open"],
        serde_json::json!({ "probes": 3, "successes": 2 }),
        "{row}"
    );
    let text = metrics_text(server).await;
    let of = |family: &str| series(&text, &format!("{family}{{key=\"{key}\"}}"));
    assert_eq!(of("fusebox_key_probes_held"), Some(2.0), "{text}");
    assert_eq!(of("fusebox_key_probe_slots"), Some(3.0));
    assert_eq!(of("fusebox_key_half_open_successes"), Some(1.0));
    // A key of the default policy: one slot, none held.
    assert_eq!(
        series(&text, "fusebox_key_probe_slots{key=\"plain\"}"),
        Some(1.0)
    );
    assert_eq!(
        series(&text, "fusebox_key_probes_held{key=\"plain\"}"),
        Some(0.0)
    );
}

#[tokio::test]
async fn a_half_open_key_shows_its_probe_slots_and_successes_on_grpc_json_and_metrics() {
    let server = Server::manual(Some(PROBING)).await;
    granted(&mut server.fusebox().await, "plain").await;
    two_slots_held_one_success(&server, "probing/a").await;
    check_probing_surfaces(&server, "probing/a").await;
}

/// With `--store`, the module keeps the slots: the same figures on every
/// surface as embedded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_open_key_shows_the_same_figures_with_a_store() {
    let Some(redis) =
        crate::harness::standalone("a_half_open_key_shows_the_same_figures_with_a_store").await
    else {
        return;
    };
    let store = format!("redis://127.0.0.1:{}", redis.server.port);
    let server = crate::harness::servers_on(&store, PROBING, true, 1)
        .await
        .pop()
        .expect("a server");
    granted(&mut server.fusebox().await, "plain").await;
    two_slots_held_one_success(&server, "probing/a").await;
    check_probing_surfaces(&server, "probing/a").await;
}

/// The README's bounded half-open example is a valid config whose rule has
/// the slots and successes it says.
#[test]
fn the_readme_half_open_example_is_a_valid_config() {
    let readme = include_str!("../../README.md");
    let example = readme
        .split("**Bounded half-open.**")
        .nth(1)
        .and_then(|s| s.split("```toml\n").nth(1))
        .and_then(|s| s.split("```").next())
        .expect("the README's half-open example");
    let config = fusebox::config::Config::parse(example, "README.md").expect("a valid config");
    let rule = config.rules.rules.first().expect("one rule");
    let half_open = rule.policy.breaker.expect("a breaker").half_open;
    assert_eq!((half_open.probes.get(), half_open.successes.get()), (5, 3));
}

// ---------- the retry budget (R1-R2) on the same surfaces ----------

#[tokio::test]
async fn a_retry_the_budget_denies_is_counted_as_a_denial_by_reason_on_json_and_metrics() {
    let config = r#"
[[rule]]
match = "budget/*"
retry_budget = { ratio = 0.1, min_per_second = 0, window = "10s" }
"#;
    let server = Server::manual(Some(config)).await;
    let mut c = server.fusebox().await;
    let key = "budget/a";
    let first = granted(&mut c, key).await;
    crate::admin::complete(&mut c, &first, pb::Outcome::Success).await;
    // One first attempt: floor(0.1 x 1) = 0 retries allowed.
    let retry = c
        .acquire(pb::AcquireRequest {
            attempt: Some(2),
            ..ask(key, 1)
        })
        .await
        .expect("Acquire answers")
        .into_inner();
    assert_eq!(decision(&retry), pb::Decision::Denied, "{retry:?}");
    assert_eq!(retry.reason, pb::Reason::RetryBudget as i32, "{retry:?}");

    let http = http_addr(&server);
    let row = &get(&http, "/api/keys?prefix=budget%2F").await.json()["keys"][0];
    assert_eq!(row["key"], key, "{row}");
    assert_eq!(
        (&row["requests"], &row["turned_away"]),
        (&2.into(), &1.into()),
        "{row}"
    );
    let text = metrics_text(&server).await;
    assert_eq!(
        series(
            &text,
            &format!("fusebox_key_requests_total{{key=\"{key}\",decision=\"denied\"}}")
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        series(
            &text,
            &format!("fusebox_key_denials_total{{key=\"{key}\",reason=\"retry_budget\"}}")
        ),
        Some(1.0),
        "{text}"
    );
}

// ---------- the adaptive limiter (CX20-CX27) on the same surfaces ----------

const ADAPTIVE: &str = r#"
[[rule]]
match = "adaptive/*"
limiter = { kind = "adaptive", min = 2, max = 30, initial = 4 }
"#;

/// A fresh key's limit is `initial` (4; a fifth call is denied, with no
/// hint), and its first ten calls, of 20 ms, make its baseline (CX24).
/// Then four calls of 20 ms in flight, three of them completed: the first
/// completion ends the round (100 ms after the baseline) with a mean age of
/// 20 ms and four calls in flight, so the limit goes from 4 to 4 * 0.5 +
/// (4 + 2) * 0.5 = 5 permits, in force with one permit held.
async fn an_adaptive_limit_of_five(server: &Server, key: &str) {
    let mut c = server.fusebox().await;
    let mut clock = server.clock().await;
    for (round, calls) in [4, 4, 2].into_iter().enumerate() {
        let mut tickets = Vec::new();
        for _ in 0..calls {
            tickets.push(granted(&mut c, key).await);
        }
        if round == 0 {
            let denied = acquire(&mut c, key, 1).await;
            assert_eq!(decision(&denied), pb::Decision::Denied, "{denied:?}");
            assert_eq!(denied.reason, pb::Reason::NoPermits as i32, "{denied:?}");
            assert_eq!(denied.retry_after, None, "no hint: {denied:?}");
        }
        crate::admin::advance_clock(&mut clock, 20).await;
        for ticket in &tickets {
            crate::admin::complete(&mut c, ticket, pb::Outcome::Success).await;
        }
    }
    assert_eq!(
        server.get(key).await.adaptive_limit,
        4,
        "a baseline, no round yet"
    );
    crate::admin::advance_clock(&mut clock, 80).await;
    let mut tickets = Vec::new();
    for _ in 0..4 {
        tickets.push(granted(&mut c, key).await);
    }
    let denied = acquire(&mut c, key, 1).await;
    assert_eq!(decision(&denied), pb::Decision::Denied, "{denied:?}");
    crate::admin::advance_clock(&mut clock, 20).await;
    for ticket in &tickets[..3] {
        crate::admin::complete(&mut c, ticket, pb::Outcome::Success).await;
    }
}

/// The same figures of an adaptive key on gRPC, the dashboard's JSON and
/// `/metrics`.
async fn check_adaptive_surfaces(server: &Server, key: &str) {
    let state = server.get(key).await;
    assert_eq!(
        (
            state.adaptive_limit,
            state.limit,
            state.free,
            state.live_tickets
        ),
        (5, 30, 4, 1),
        "{state:?}"
    );
    let http = http_addr(server);
    let page = get(&http, "/api/keys?prefix=adaptive%2F").await.json();
    let row = &page["keys"][0];
    assert_eq!(row["key"], key, "{page}");
    assert_eq!(row["adaptive_limit"], 5, "{row}");
    assert_eq!(row["free"], 4, "{row}");
    let text = metrics_text(server).await;
    assert_eq!(
        series(
            &text,
            &format!("fusebox_key_adaptive_limit{{key=\"{key}\"}}")
        ),
        Some(5.0),
        "{text}"
    );
    // A key without an adaptive limiter has no series.
    assert_eq!(
        series(&text, "fusebox_key_adaptive_limit{key=\"plain\"}"),
        None,
        "{text}"
    );
}

#[tokio::test]
async fn an_adaptive_key_shows_its_limit_on_grpc_json_and_metrics() {
    let server = Server::manual(Some(ADAPTIVE)).await;
    granted(&mut server.fusebox().await, "plain").await;
    an_adaptive_limit_of_five(&server, "adaptive/a").await;
    check_adaptive_surfaces(&server, "adaptive/a").await;
}

/// With `--store`, the module learns the same limit (CX26).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adaptive_key_shows_the_same_limit_with_a_store() {
    let Some(redis) =
        crate::harness::standalone("an_adaptive_key_shows_the_same_limit_with_a_store").await
    else {
        return;
    };
    let store = format!("redis://127.0.0.1:{}", redis.server.port);
    let server = crate::harness::servers_on(&store, ADAPTIVE, true, 1)
        .await
        .pop()
        .expect("a server");
    granted(&mut server.fusebox().await, "plain").await;
    an_adaptive_limit_of_five(&server, "adaptive/a").await;
    check_adaptive_surfaces(&server, "adaptive/a").await;
}

/// The README's adaptive example is a valid config whose rule has the
/// limits it says.
#[test]
fn the_readme_adaptive_example_is_a_valid_config() {
    let readme = include_str!("../../README.md");
    let example = readme
        .split("**Adaptive concurrency.**")
        .nth(1)
        .and_then(|s| s.split("```toml\n").nth(1))
        .and_then(|s| s.split("```").next())
        .expect("the README's adaptive example");
    let config = fusebox::config::Config::parse(example, "README.md").expect("a valid config");
    let rule = config.rules.rules.first().expect("one rule");
    let kind = rule.policy.limiter.expect("a limiter").kind;
    assert_eq!(kind.name(), "adaptive");
    assert_eq!(kind.limit(), 200, "P2's limit is max");
}

// ---------- slow calls (S1-S3, CX10-CX15) on the same surfaces ----------

const SLOW: &str = r#"
[[rule]]
match = "slow/*"
breaker = { mode = "ratio", failure_ratio = 0.5, minimum_throughput = 100, sampling_window = "10s", break = "1s", slow = { duration = "100ms", ratio = 0.9 } }
"#;

/// Three calls granted, then 150 ms: all three are live slow and counted
/// (CX12); one completes (still counted once), and a fourth, granted then,
/// is not slow yet. gRPC, the dashboard's JSON and `/metrics` agree: two
/// live slow calls, three slow calls in all.
async fn check_slow_surfaces(server: &Server, key: &str) {
    let mut c = server.fusebox().await;
    let mut tickets = Vec::new();
    for _ in 0..3 {
        tickets.push(granted(&mut c, key).await);
    }
    assert_eq!(server.get(key).await.live_slow, 0, "not slow yet");
    crate::admin::advance_clock(&mut server.clock().await, 150).await;
    assert_eq!(server.get(key).await.live_slow, 3);
    crate::admin::complete(&mut c, &tickets[0], pb::Outcome::Success).await;
    granted(&mut c, key).await;
    let state = server.get(key).await;
    assert_eq!((state.live_slow, state.live_tickets), (2, 3), "{state:?}");
    let http = http_addr(server);
    let page = get(&http, "/api/keys?prefix=slow%2F").await.json();
    let row = &page["keys"][0];
    assert_eq!(row["key"], key, "{page}");
    assert_eq!(
        (&row["live_slow"], &row["slow_calls"]),
        (&2.into(), &3.into()),
        "{row}"
    );
    let text = metrics_text(server).await;
    for (family, want) in [
        ("fusebox_key_live_slow", 2.0),
        ("fusebox_key_slow_calls_total", 3.0),
    ] {
        assert_eq!(
            series(&text, &format!("{family}{{key=\"{key}\"}}")),
            Some(want),
            "{family}: {text}"
        );
    }
    assert_eq!(
        series(&text, "fusebox_key_live_slow{key=\"plain\"}"),
        Some(0.0),
        "a key without slow calls reads 0: {text}"
    );
}

#[tokio::test]
async fn live_slow_calls_show_on_grpc_json_and_metrics() {
    let server = Server::manual(Some(SLOW)).await;
    granted(&mut server.fusebox().await, "plain").await;
    check_slow_surfaces(&server, "slow/a").await;
}

/// With `--store`, the module counts the same slow calls (CX15).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_slow_calls_show_the_same_with_a_store() {
    let Some(redis) =
        crate::harness::standalone("live_slow_calls_show_the_same_with_a_store").await
    else {
        return;
    };
    let store = format!("redis://127.0.0.1:{}", redis.server.port);
    let server = crate::harness::servers_on(&store, SLOW, true, 1)
        .await
        .pop()
        .expect("a server");
    granted(&mut server.fusebox().await, "plain").await;
    check_slow_surfaces(&server, "slow/a").await;
}

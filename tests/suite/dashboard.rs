//! The dashboard in Debian's headless Chromium, driven by playwright-core
//! (`tests/dashboard/check.mjs`): a breaker tripped over gRPC shows as open
//! without a reload; pressing close (and giving a reason) turns it closed;
//! the page is saved at `target/dashboard.png`.
//!
//! Needs node, `npm ci` in tests/dashboard, and Chromium at
//! `FUSEBOX_TEST_CHROMIUM` (or /usr/bin/chromium); `./scripts/test` sets
//! them up.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fusebox::proto::v1 as pb;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;
use tonic::transport::Channel;

use crate::harness::{eventually, Server};

/// Deadline for the browser to start and load the page, and to finish.
const LIMIT: Duration = Duration::from_secs(90);

const CONFIG: &str = r#"
[[rule]]
match = "payments/*"
breaker = { mode = "consecutive", failures = 5, break = "2m" }
limiter = { kind = "concurrency", permits = 8, queue_limit = 16 }

[[rule]]
match = "search/*"
breaker = { mode = "ratio", failure_ratio = 0.5, minimum_throughput = 20, sampling_window = "1m", break = "30s" }
limiter = { kind = "token_bucket", capacity = 100, refill = 10, period = "100ms" }
"#;

const KEY: &str = "payments/charge";

type Client = pb::fusebox_client::FuseboxClient<Channel>;

async fn ticket(c: &mut Client, key: &str) -> String {
    let r = c
        .acquire(pb::AcquireRequest {
            key: key.into(),
            permits: Some(1),
            max_wait: None,
            lease: None,
        })
        .await
        .unwrap_or_else(|s| panic!("Acquire {key}: {s:?}"))
        .into_inner();
    assert!(!r.ticket.is_empty(), "{key}: {r:?}");
    r.ticket
}

async fn complete(c: &mut Client, ticket: String, outcome: pb::Outcome) {
    c.complete(pb::CompleteRequest {
        ticket,
        outcome: outcome as i32,
    })
    .await
    .expect("Complete answers");
}

/// A few keys in different states, so that the page has something to show.
async fn scene(server: &Server) -> Vec<String> {
    let mut c = server.fusebox().await;
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(ticket(&mut c, "payments/refund").await);
    }
    for i in 0..12 {
        let t = ticket(&mut c, "search/query").await;
        let outcome = if i % 3 == 0 {
            pb::Outcome::Failure
        } else {
            pb::Outcome::Success
        };
        complete(&mut c, t, outcome).await;
    }
    held.push(ticket(&mut c, "auth/token").await);
    let isolate = crate::harness::by(
        "oncall:alice",
        pb::IsolateRequest {
            key: "inventory/lookup".into(),
            reason: "INC-4702: vendor maintenance window".into(),
        },
    );
    server
        .admin()
        .await
        .isolate(isolate)
        .await
        .expect("Isolate answers");
    held
}

/// Five failures in a row open `payments/*` keys.
async fn trip(server: &Server, key: &str) {
    let mut c = server.fusebox().await;
    for _ in 0..5 {
        let t = ticket(&mut c, key).await;
        complete(&mut c, t, pb::Outcome::Failure).await;
    }
    assert_eq!(server.get(key).await.phase, pb::Phase::Open as i32);
}

fn need(path: &Path, what: &str) {
    assert!(
        path.exists(),
        "{} is missing: {what} (./scripts/test installs it)",
        path.display()
    );
}

#[tokio::test]
async fn the_dashboard_shows_a_tripped_breaker_live_and_closes_it() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let driver = root.join("tests/dashboard");
    need(
        &driver.join("node_modules/playwright-core"),
        "run `npm ci` in tests/dashboard",
    );
    let chromium = std::env::var("FUSEBOX_TEST_CHROMIUM")
        .ok()
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| "/usr/bin/chromium".to_owned());
    need(
        Path::new(&chromium),
        "Debian's chromium (apt-get install chromium), or set FUSEBOX_TEST_CHROMIUM",
    );
    let screenshot = root.join("target/dashboard.png");
    std::fs::create_dir_all(root.join("target")).expect("target/ exists");
    let _ = std::fs::remove_file(&screenshot);

    let server = Server::start(crate::harness::Options {
        config: Some(CONFIG),
        ..Default::default()
    })
    .await;
    let _held = scene(&server).await;
    let url = format!("http://{}/", server.http_addr.as_deref().expect("http on"));

    let mut node = Command::new("node")
        .arg(driver.join("check.mjs"))
        .arg(&url)
        .arg(&screenshot)
        .current_dir(&driver)
        .env("FUSEBOX_TEST_CHROMIUM", &chromium)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("node runs (install nodejs)");
    let errors = Arc::new(Mutex::new(String::new()));
    let mut stderr = node.stderr.take().expect("stderr piped");
    let errors_in = errors.clone();
    tokio::spawn(async move {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text).await;
        errors_in.lock().expect("errors lock").push_str(&text);
    });
    let mut stdout = BufReader::new(node.stdout.take().expect("stdout piped")).lines();
    let mut stdin = node.stdin.take().expect("stdin piped");
    let said = |line: Option<String>, want: &str, errors: &Mutex<String>| {
        assert_eq!(
            line.as_deref(),
            Some(want),
            "check.mjs said {line:?}, not {want:?}; its errors:\n{}",
            errors.lock().expect("errors lock")
        );
    };

    let line = tokio::time::timeout(LIMIT, stdout.next_line())
        .await
        .expect("the page is live within the limit")
        .expect("stdout readable");
    // Let stderr finish, for the message, when the driver failed early.
    if line.is_none() {
        let _ = tokio::time::timeout(LIMIT, node.wait()).await;
    }
    said(line, "ready", &errors);

    trip(&server, KEY).await;
    stdin
        .write_all(format!("tripped {KEY}\n").as_bytes())
        .await
        .expect("the driver reads");
    stdin.flush().await.expect("flushed");

    let line = tokio::time::timeout(LIMIT, stdout.next_line())
        .await
        .expect("the driver finishes within the limit")
        .expect("stdout readable");
    let status = tokio::time::timeout(LIMIT, node.wait())
        .await
        .expect("the driver exits")
        .expect("wait works");
    said(line, "done", &errors);
    assert!(
        status.success(),
        "check.mjs: {status:?}\n{}",
        errors.lock().expect("errors lock")
    );

    // Closed for real, and recorded as the dashboard's doing.
    assert_eq!(server.get(KEY).await.phase, pb::Phase::Closed as i32);
    let http = server.http_addr.as_deref().expect("http on");
    let close = eventually("the close in /api/transitions", LIMIT, || async move {
        let timeline = super::http::get(http, "/api/transitions?prefix=payments%2Fcharge")
            .await
            .json();
        timeline
            .as_array()
            .and_then(|t| t.iter().find(|e| e["kind"] == "close"))
            .cloned()
    })
    .await;
    assert!(
        close["who"]
            .as_str()
            .is_some_and(|w| w.starts_with("dashboard:")),
        "{close}"
    );
    assert_eq!(close["reason"], "INC-4711 resolved: provider is back");

    let png = std::fs::read(&screenshot).expect("target/dashboard.png was saved");
    assert!(
        png.starts_with(b"\x89PNG\r\n\x1a\n"),
        "target/dashboard.png is not a PNG"
    );
}

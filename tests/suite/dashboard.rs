//! The dashboard in Debian's headless Chromium, driven by playwright-core
//! (`tests/dashboard/check.mjs`), over 100,000 keys: the totals match the
//! engine's, the keys that are not closed are listed first, the prefix
//! filter pages on the server (never more than 100 rows shipped), the rows
//! shown have request and failure sparklines, a breaker tripped meanwhile
//! shows as open without a reload, and pressing close (with a reason)
//! closes it. The page is saved at `target/dashboard.png`.
//!
//! Making 100,000 keys over gRPC in a debug build is slow, so the engine is
//! filled directly and served in-process (HTTP on port 0).
//!
//! Needs node, `npm ci` in tests/dashboard, and Chromium at
//! `FUSEBOX_TEST_CHROMIUM` (or /usr/bin/chromium); without them the test
//! says it is skipped (see [`crate::tools`]). `./scripts/test` sets them up.

use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fusebox::config::Config;
use fusebox::domain::{Decision, Outcome, Phase};
use fusebox::engine::Engine;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;

use crate::harness::{ask, call, eventually};

/// Deadline for the browser to start and load the page, and to finish.
const LIMIT: Duration = Duration::from_secs(180);

/// Live keys in the engine.
const KEYS: usize = 100_000;

/// Keys tripped open before the page loads.
const OPEN: [&str; 3] = ["alpha/open-1", "alpha/open-2", "zeta/open-3"];

/// Keys isolated before the page loads.
const ISOLATED: [&str; 2] = ["beta/iso-1", "beta/iso-2"];

/// The key tripped while the page is open, then closed from the page.
const KEY: &str = "payments/charge";

/// Keys asked continuously while the page is open (some calls fail), so
/// that their sparklines move.
const BUSY: [&str; 3] = [
    "tenant-00/key-000000",
    "tenant-01/key-000001",
    "tenant-02/key-000002",
];

/// Five failures in a row open a key (the default policy).
async fn trip(engine: &Engine, key: &str) {
    for _ in 0..5 {
        call(engine, key, Outcome::Failure).await;
    }
    assert_eq!(engine.get(key).expect("a key").view.phase, Phase::Open);
}

/// 100,000 live keys: `tenant-NN/key-IIIIII` (NN = I mod 100, so a tenant
/// has 1,000 keys: ten pages), a few open, a few isolated.
async fn fill(engine: &Engine) {
    let special = OPEN.len() + ISOLATED.len() + 1;
    for i in 0..(KEYS - special) {
        let key = format!("tenant-{:02}/key-{i:06}", i % 100);
        call(engine, &key, Outcome::Success).await;
    }
    for key in OPEN {
        trip(engine, key).await;
    }
    for key in ISOLATED {
        engine
            .isolate(key, "INC-4702: vendor maintenance window", "oncall:alice")
            .expect("isolated");
    }
    call(engine, KEY, Outcome::Success).await;
    let totals = engine.totals();
    assert_eq!(totals.keys, KEYS as u64);
    assert_eq!(totals.by_phase[Phase::Open.index()], OPEN.len() as u64);
    assert_eq!(
        totals.by_phase[Phase::Isolated.index()],
        ISOLATED.len() as u64
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_100k_keys_by_phase_pages_by_prefix_and_closes_a_tripped_key() {
    let Some((chromium, driver)) = crate::tools::browser(
        "the_dashboard_shows_100k_keys_by_phase_pages_by_prefix_and_closes_a_tripped_key",
    ) else {
        return;
    };
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let screenshot = root.join("target/dashboard.png");
    std::fs::create_dir_all(root.join("target")).expect("target/ exists");
    let _ = std::fs::remove_file(&screenshot);

    let engine = Arc::new(Engine::with_system_clock(Config::default()));
    fill(&engine).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let http = listener.local_addr().expect("an address").to_string();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let options = fusebox::http::Options {
        sample_every: Duration::from_secs(1),
        ..Default::default()
    };
    let server = tokio::spawn(fusebox::http::serve_with(
        listener,
        fusebox::node::Node::of(engine.clone()),
        options,
        async {
            let _ = stopped.await;
        },
    ));
    // Traffic on a few keys, for the sparklines.
    let busy = Arc::new(AtomicBool::new(true));
    let traffic = {
        let (engine, busy) = (engine.clone(), busy.clone());
        tokio::spawn(async move {
            let mut n = 0u64;
            while busy.load(Ordering::Relaxed) {
                for (k, key) in BUSY.iter().enumerate() {
                    // Every fourth call of the second key fails: never five in a row.
                    let fails = k == 1 && n.is_multiple_of(4);
                    let outcome = if fails {
                        Outcome::Failure
                    } else {
                        Outcome::Success
                    };
                    for _ in 0..=k {
                        call(&engine, key, outcome).await;
                    }
                }
                n += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };

    let expected = serde_json::json!({
        "keys": KEYS,
        "open": OPEN,
        "isolated": ISOLATED,
        "busy": BUSY,
        "prefix": "tenant-07/",
    });
    let url = format!("http://{http}/");
    let mut node = Command::new("node")
        .arg(driver.join("check.mjs"))
        .arg(&url)
        .arg(&screenshot)
        .arg(expected.to_string())
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
        .expect("the page is checked within the limit")
        .expect("stdout readable");
    // Let stderr finish, for the message, when the driver failed early.
    if line.is_none() {
        let _ = tokio::time::timeout(LIMIT, node.wait()).await;
    }
    said(line, "ready", &errors);

    trip(&engine, KEY).await;
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
    assert_eq!(engine.get(KEY).expect("a key").view.phase, Phase::Closed);
    let close = eventually("the close in /api/transitions", LIMIT, || {
        let http = http.clone();
        async move {
            let timeline = super::http::get(&http, "/api/transitions?prefix=payments%2Fcharge")
                .await
                .json();
            timeline
                .as_array()
                .and_then(|t| t.iter().find(|e| e["kind"] == "close"))
                .cloned()
        }
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

    busy.store(false, Ordering::Relaxed);
    let _ = traffic.await;
    engine.shutdown();
    let _ = stop.send(());
    server.abort();
}

/// Keys in `probing/*` open at one failure for 1 s, then probe with three
/// slots at once and close at the second probe success (H1-H2).
const PROBING: &str = r#"
[[rule]]
match = "probing/*"
breaker = { mode = "consecutive", failures = 1, break = "1s", half_open = { probes = 3, successes = 2 } }
"#;

/// One acquire on `key`: its decision and ticket.
async fn ask_once(engine: &Engine, key: &str) -> (Decision, Option<String>) {
    let reply = engine.acquire(ask(key)).await.expect("acquire answers");
    (reply.decision, reply.ticket)
}

/// A half-open key with three probe slots, two held and one success of the
/// two that close it counted, reads so on the dashboard (`probing.mjs`):
/// "probing: 2 of 3 slots held", "1 of 2 successes to close", and the
/// policy's half_open in the tooltips.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_the_probe_slots_held_and_the_successes_of_a_half_open_key() {
    let test = "the_dashboard_shows_the_probe_slots_held_and_the_successes_of_a_half_open_key";
    let Some((chromium, driver)) = crate::tools::browser(test) else {
        return;
    };
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let screenshot = root.join("target/dashboard-probing.png");
    std::fs::create_dir_all(root.join("target")).expect("target/ exists");
    let _ = std::fs::remove_file(&screenshot);

    let config = Config::parse(PROBING, "the test's config").expect("a valid config");
    let engine = Arc::new(Engine::with_manual_clock(config));
    let node = fusebox::node::Node::of(engine.clone());
    let key = "probing/a";
    call(&engine, key, Outcome::Failure).await;
    assert_eq!(engine.get(key).expect("a key").view.phase, Phase::Open);
    node.store().advance_clock(1000).await;
    let (first, one) = ask_once(&engine, key).await;
    let (second, _two) = ask_once(&engine, key).await;
    assert!(
        matches!(first, Decision::Probe(_)) && matches!(second, Decision::Probe(_)),
        "{first:?} {second:?}"
    );
    let done = engine
        .complete(&one.expect("a probe ticket"), Outcome::Success)
        .expect("complete answers");
    assert_eq!(done.phase, Phase::HalfOpen, "one success of two");
    let (third, _three) = ask_once(&engine, key).await;
    assert!(matches!(third, Decision::Probe(_)), "{third:?}");
    let view = engine.get(key).expect("a key").view;
    assert_eq!((view.probes_held, view.half_open_successes), (2, 1));

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let http = listener.local_addr().expect("an address").to_string();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let options = fusebox::http::Options {
        sample_every: Duration::from_secs(1),
        ..Default::default()
    };
    let server = tokio::spawn(fusebox::http::serve_with(listener, node, options, async {
        let _ = stopped.await;
    }));
    let expected = serde_json::json!({
        "key": key,
        "break": "probing: 2 of 3 slots held",
        "sub": "1 of 2 successes to close",
        "policy": "at most 3 probes at once, 2 successes to close",
    });
    let run = Command::new("node")
        .arg(driver.join("probing.mjs"))
        .arg(format!("http://{http}/"))
        .arg(&screenshot)
        .arg(expected.to_string())
        .current_dir(&driver)
        .env("FUSEBOX_TEST_CHROMIUM", &chromium)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(LIMIT, run)
        .await
        .expect("the page is checked within the limit")
        .expect("node runs (install nodejs)");
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "done",
        "probing.mjs: {:?}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let png = std::fs::read(&screenshot).expect("target/dashboard-probing.png was saved");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");

    engine.shutdown();
    let _ = stop.send(());
    server.abort();
}

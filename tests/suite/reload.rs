//! Config reload (issue 4, acceptance 4) against a real server started with
//! `--config FILE`: by SIGHUP and by editing the file, a valid edit changes
//! the policy as Y4 says; an invalid one changes nothing and is reported in
//! the log (naming the rule and the field) and in the metrics
//! `fusebox_config_reload_failures_total` and
//! `fusebox_config_last_reload_success` on `/metrics`. Every wait is a poll
//! with a deadline.

use std::path::{Path, PathBuf};
use std::time::Duration;

use fusebox::proto::v1 as pb;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::admin::{
    acquire, advance, call, complete, consecutive, get, policies, request, rule, set_policy,
    ticket, Admin,
};
use crate::harness::{eventually, millis, Options, Server};

/// Reloads are noticed within 250 ms; this is the safety net.
const RELOAD: Duration = Duration::from_secs(10);

const V1: &str = r#"
[[rule]]
match = "r/*"
breaker = { mode = "consecutive", failures = 3, break = "10s" }

[[rule]]
match = "lim/*"
limiter = { kind = "concurrency", permits = 3 }
"#;

const V2: &str = r#"
[[rule]]
match = "r/*"
breaker = { mode = "consecutive", failures = 5, break = "20s" }

[[rule]]
match = "lim/*"
limiter = { kind = "concurrency", permits = 1 }

[[rule]]
match = "new/*"
limiter = { kind = "concurrency", permits = 7 }
"#;

/// Writes `text` to `path` the way a careful operator (or a config
/// manager) does: a temporary file renamed over the old one, so that the
/// server never reads half a file.
pub(crate) fn write_config(path: &Path, text: &str) {
    let tmp = path.with_extension("toml.tmp");
    std::fs::write(&tmp, text).expect("config written");
    std::fs::rename(&tmp, path).expect("config renamed into place");
}

pub(crate) struct Reloading {
    pub(crate) server: Server,
    pub(crate) path: PathBuf,
    // Dropped after the server.
    _dir: tempfile::TempDir,
}

/// A server on the manual clock with `--config` pointing at a file of ours,
/// once its reloader is known to run (so that an edit or a SIGHUP made
/// right after start-up is never missed).
pub(crate) async fn start(text: &str) -> Reloading {
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = dir.path().join("fusebox.toml");
    write_config(&path, text);
    let path_text = path.to_str().expect("a UTF-8 path").to_owned();
    let server = Server::start(Options {
        config: None,
        manual_clock: true,
        args: vec!["--config", &path_text],
        ..Options::default()
    })
    .await;
    // The reloader starts just after the server prints its address: touch
    // the file until a reload shows in the log.
    let mut touch = 0;
    let started = tokio::time::Instant::now();
    while reloads(&server, "the file changed") == 0 {
        assert!(
            started.elapsed() < RELOAD,
            "the reloader never noticed an edit"
        );
        touch += 1;
        write_config(&path, &format!("{text}\n# touched {touch}\n"));
        let seen = tokio::time::Instant::now();
        while reloads(&server, "the file changed") == 0 && seen.elapsed() < Duration::from_secs(1) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    Reloading {
        server,
        path,
        _dir: dir,
    }
}

/// How many reloads with this trigger the server logged as applied.
fn reloads(server: &Server, why: &str) -> usize {
    server
        .logs()
        .matches(&format!("config reloaded ({why})"))
        .count()
}

/// The server's log lines that report a refused reload.
fn refusals(server: &Server) -> Vec<String> {
    server
        .logs()
        .lines()
        .filter(|l| l.contains("config not reloaded"))
        .map(str::to_owned)
        .collect()
}

pub(crate) async fn wait_reloads(server: &Server, why: &str, count: usize) {
    eventually(
        &format!("reload #{count} ({why}) in the log"),
        RELOAD,
        || async { (reloads(server, why) >= count).then_some(()) },
    )
    .await;
}

/// Waits for refusal number `count`; returns its log line.
async fn wait_refusal(server: &Server, count: usize) -> String {
    eventually(&format!("refusal #{count} in the log"), RELOAD, || async {
        refusals(server).get(count - 1).cloned()
    })
    .await
}

/// `GET path` on the server's HTTP port; returns (status line, body).
pub(crate) async fn http_get(server: &Server, path: &str) -> (String, String) {
    let addr = server.http_addr.as_deref().expect("the server serves HTTP");
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("the HTTP port accepts connections");
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .expect("request sent");
    let mut response = Vec::new();
    tokio::time::timeout(RELOAD, stream.read_to_end(&mut response))
        .await
        .expect("the HTTP server answers")
        .expect("response read");
    let response = String::from_utf8_lossy(&response).into_owned();
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    let status = head.lines().next().unwrap_or_default().to_owned();
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_owned()
    };
    (status, body)
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    out
}

/// The value of an unlabelled sample in the Prometheus text format.
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let mut parts = l.split_whitespace();
        (parts.next()? == name).then(|| parts.next()?.parse().ok())?
    })
}

/// (`fusebox_config_reload_failures_total`, `fusebox_config_last_reload_success`).
async fn reload_metrics(server: &Server) -> (f64, f64) {
    let (status, body) = http_get(server, "/metrics").await;
    assert!(status.contains(" 200"), "GET /metrics: {status}\n{body}");
    let failures = sample(&body, "fusebox_config_reload_failures_total")
        .unwrap_or_else(|| panic!("no fusebox_config_reload_failures_total in\n{body}"));
    let success = sample(&body, "fusebox_config_last_reload_success")
        .unwrap_or_else(|| panic!("no fusebox_config_last_reload_success in\n{body}"));
    (failures, success)
}

fn matches(p: &pb::ListPoliciesResponse) -> Vec<&str> {
    p.rules.iter().map(|r| r.r#match.as_str()).collect()
}

/// Two failures on `r/run`, `r/open` tripped (10 s), three permits of
/// `lim/k` held; the clock then moves 1 s. Returns the tickets held.
async fn prepare(server: &Server) -> Vec<String> {
    let mut c = server.fusebox().await;
    for _ in 0..2 {
        assert_eq!(
            call(&mut c, "r/run", pb::Outcome::Failure).await,
            pb::Phase::Closed
        );
    }
    for _ in 0..3 {
        call(&mut c, "r/open", pb::Outcome::Failure).await;
    }
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(ticket(&mut c, "lim/k").await);
    }
    advance(server, 1_000).await;
    held
}

/// After a valid reload to V2: the keys keep phase, deadline and run, and
/// the new thresholds apply to the next outcome (Y4); permits held stay held.
async fn check_v2_applies_as_y4_says(server: &Server, admin: &mut Admin, held: Vec<String>) {
    let mut c = server.fusebox().await;
    let run = get(admin, "r/run").await;
    assert_eq!(
        (run.phase, run.consecutive_failures),
        (pb::Phase::Closed as i32, 2),
        "the run stays"
    );
    let open = get(admin, "r/open").await;
    assert_eq!(open.phase, pb::Phase::Open as i32, "the phase stays");
    assert_eq!(
        millis(open.open_remaining),
        Some(9_000),
        "the deadline stays"
    );
    // Failures 3 and 4 no longer trip (the threshold is now 5); the 5th does,
    // for the new break.
    assert_eq!(
        call(&mut c, "r/run", pb::Outcome::Failure).await,
        pb::Phase::Closed
    );
    assert_eq!(
        call(&mut c, "r/run", pb::Outcome::Failure).await,
        pb::Phase::Closed
    );
    assert_eq!(
        call(&mut c, "r/run", pb::Outcome::Failure).await,
        pb::Phase::Open
    );
    assert_eq!(
        millis(get(admin, "r/run").await.open_remaining),
        Some(20_000)
    );
    // Permits held stay held under the lower limit; no ticket is lost.
    let denied = acquire(&mut c, request("lim/k")).await;
    assert_eq!(denied.decision, pb::Decision::Denied as i32, "{denied:?}");
    let state = get(admin, "lim/k").await;
    assert_eq!((state.limit, state.free, state.live_tickets), (1, 0, 3));
    for t in &held {
        let done = complete(&mut c, t, pb::Outcome::Success).await;
        assert!(!done.stale, "{done:?}");
    }
    assert_eq!(get(admin, "lim/k").await.free, 1);
    assert_eq!(
        get(admin, "new/k").await.limit,
        7,
        "the new rule is in force"
    );
}

/// SIGHUP reloads the file; a valid edit applies as Y4 says, and replaces
/// the rules set at run time by SetPolicy.
#[tokio::test]
async fn sighup_reloads_a_valid_edit_as_y4_says() {
    let r = start(V1).await;
    let server = &r.server;
    let mut admin = server.admin().await;
    let held = prepare(server).await;
    set_policy(
        &mut admin,
        rule("runtime/*", Some(consecutive(1, 1000)), None),
    )
    .await
    .expect("SetPolicy answers");
    assert_eq!(
        matches(&policies(&mut admin).await),
        ["r/*", "lim/*", "runtime/*"]
    );

    write_config(&r.path, V2);
    server.signal("HUP");
    wait_reloads(server, "SIGHUP", 1).await;
    let now = policies(&mut admin).await;
    assert_eq!(
        matches(&now),
        ["r/*", "lim/*", "new/*"],
        "the file's rules replace every rule, the run-time one too"
    );
    check_v2_applies_as_y4_says(server, &mut admin, held).await;
    assert!(refusals(server).is_empty(), "{:?}", refusals(server));
    assert_eq!(reload_metrics(server).await, (0.0, 1.0));

    // SIGHUP with an unchanged file reloads it again, harmlessly.
    server.signal("HUP");
    wait_reloads(server, "SIGHUP", 2).await;
    assert_eq!(policies(&mut admin).await, now);
}

/// Editing the file, with no signal, reloads it within a poll or two.
#[tokio::test]
async fn editing_the_file_reloads_it_as_y4_says() {
    let r = start(V1).await;
    let server = &r.server;
    let mut admin = server.admin().await;
    let held = prepare(server).await;
    let before = reloads(server, "the file changed");
    write_config(&r.path, V2);
    wait_reloads(server, "the file changed", before + 1).await;
    assert_eq!(
        matches(&policies(&mut admin).await),
        ["r/*", "lim/*", "new/*"]
    );
    check_v2_applies_as_y4_says(server, &mut admin, held).await;
    assert_eq!(reloads(server, "SIGHUP"), 0);
    assert_eq!(reload_metrics(server).await, (0.0, 1.0));
}

/// An invalid file, whether noticed by a poll or by SIGHUP, changes
/// nothing: the running rules and behaviour stay; the log names the rule
/// and the field; the failure counter grows and the success gauge is 0
/// until a valid file is loaded.
#[tokio::test]
async fn an_invalid_edit_changes_nothing_and_is_reported() {
    let r = start(V1).await;
    let server = &r.server;
    let mut admin = server.admin().await;
    let mut c = server.fusebox().await;
    for _ in 0..2 {
        call(&mut c, "r/run", pb::Outcome::Failure).await;
    }
    let rules = policies(&mut admin).await;
    assert_eq!(reload_metrics(server).await, (0.0, 1.0));

    let invalid = [
        (
            // A bad value in the second rule.
            format!(
                "{V2}\n[[rule]]\nmatch = \"r2/*\"\nbreaker = {{ mode = \"ratio\", failure_ratio = 1.5, minimum_throughput = 5, sampling_window = \"10s\", break = \"1s\" }}\n"
            ),
            ["rule 4 (\"r2/*\")", "breaker.failure_ratio"],
        ),
        (
            // An unknown field.
            "[[rule]]\nmatch = \"r/*\"\nbreakr = { mode = \"consecutive\", failures = 1, break = \"1s\" }\n"
                .to_owned(),
            ["rule 1 (\"r/*\")", "breakr"],
        ),
        (
            // max_break below break, in the default rule.
            "[default]\nbreaker = { mode = \"consecutive\", failures = 1, break = \"10s\", max_break = \"1s\" }\n"
                .to_owned(),
            ["[default]", "breaker.max_break"],
        ),
    ];
    let mut refused = 0;
    for (text, named) in &invalid {
        write_config(&r.path, text);
        refused += 1;
        let line = wait_refusal(server, refused).await;
        for part in named {
            assert!(line.contains(part), "the log names {part}: {line}");
        }
        assert!(line.contains("the file changed"), "{line}");
        assert_eq!(policies(&mut admin).await, rules, "the running rules stay");
        assert_eq!(reload_metrics(server).await, (refused as f64, 0.0));
    }
    // SIGHUP with the invalid file: refused again, reported again.
    server.signal("HUP");
    refused += 1;
    let line = wait_refusal(server, refused).await;
    assert!(
        line.contains("SIGHUP") && line.contains("breaker.max_break"),
        "{line}"
    );
    assert_eq!(reload_metrics(server).await, (refused as f64, 0.0));
    // Not even TOML.
    write_config(&r.path, "[[rule]\nmatch = ");
    refused += 1;
    let line = wait_refusal(server, refused).await;
    assert!(line.contains("not valid"), "{line}");
    assert_eq!(policies(&mut admin).await, rules);
    assert_eq!(reloads(server, "SIGHUP"), 0);

    // Behaviour unchanged: r/* still trips on the third failure.
    assert_eq!(
        call(&mut c, "r/run", pb::Outcome::Failure).await,
        pb::Phase::Open
    );
    assert_eq!(
        millis(get(&mut admin, "r/run").await.open_remaining),
        Some(10_000)
    );

    // A valid file again: applied, the gauge back to 1, the counter kept.
    let applied = reloads(server, "the file changed");
    write_config(&r.path, V2);
    wait_reloads(server, "the file changed", applied + 1).await;
    assert_eq!(
        matches(&policies(&mut admin).await),
        ["r/*", "lim/*", "new/*"]
    );
    assert_eq!(reload_metrics(server).await, (refused as f64, 1.0));
}

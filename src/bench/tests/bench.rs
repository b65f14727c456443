//! `fusebox-bench`, the load tool, run briefly as a subprocess: against a
//! server it starts itself (the arms), and against servers started here
//! (fill), whose keys are then counted through the Admin API. Both
//! binaries are the ones cargo built: `fusebox-bench` of this crate, and
//! the `fusebox` next to it that the tool starts by default.

mod harness;

use serde_json::Value;

use fusebox::proto::v1 as pb;
use harness::{bench, server_bin, Run, Server, BENCH};

/// Runs `fusebox-bench ARGS --json FILE`, which must succeed: what it
/// printed, and the JSON document it wrote.
async fn bench_json(args: &[&str]) -> (Run, Value) {
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = dir.path().join("bench.json");
    let mut all = args.to_vec();
    all.extend(["--json", path.to_str().expect("a UTF-8 path")]);
    let run = bench(&all).await;
    assert_eq!(
        run.code,
        Some(0),
        "fusebox-bench {} succeeds: {}",
        args.join(" "),
        run.stderr
    );
    let text = std::fs::read_to_string(&path).expect("bench wrote its JSON file");
    let doc = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    (run, doc)
}

fn number(v: &Value, field: &str) -> f64 {
    v[field]
        .as_f64()
        .unwrap_or_else(|| panic!("a number {field} in {v}"))
}

/// Checks one result row: some throughput, ordered percentiles. (Each
/// measurement lasts a second: on a loaded machine a call may take a good
/// part of a shorter window, and only calls wholly inside it count.)
fn check_row(row: &Value) {
    assert!(number(row, "rate") > 0.0, "throughput in {row}");
    let (p50, p99, p999) = (
        number(row, "p50_us"),
        number(row, "p99_us"),
        number(row, "p999_us"),
    );
    assert!(
        0.0 < p50 && p50 <= p99 && p99 <= p999,
        "percentiles in {row}"
    );
    let ratio = number(row, "ratio_to_health");
    assert!(ratio.is_finite() && ratio > 0.0, "a ratio in {row}");
    assert_eq!(row["errors"], 0, "no errors in {row}");
}

#[tokio::test]
async fn arms_against_a_server_of_its_own() {
    let (run, doc) = bench_json(&[
        "--duration",
        "1s",
        "--warmup",
        "100ms",
        "--runs",
        "1",
        "--arms",
        "pair",
        "--spreads",
        "hot,1k",
        "--connections",
        "2",
        "--in-flight",
        "2",
    ])
    .await;
    assert_eq!(doc["mode"], "arms");
    assert_eq!(doc["tool"], "fusebox-bench");
    assert_eq!(doc["command_line"][0], BENCH);
    assert_eq!(doc["settings"]["server_started_by_tool"], true);
    // The server under test is the fusebox built next to the tool.
    assert_eq!(
        doc["settings"]["server_bin"],
        server_bin().to_str().expect("a UTF-8 path")
    );
    let results = doc["figures"]["results"].as_array().expect("results");
    let cells: Vec<(String, String)> = results
        .iter()
        .map(|r| {
            (
                r["arm"].as_str().unwrap_or_default().to_owned(),
                r["spread"].as_str().unwrap_or("-").to_owned(),
            )
        })
        .collect();
    assert_eq!(
        cells,
        [("health", "-"), ("pair", "hot"), ("pair", "1k")]
            .map(|(a, s)| (a.to_owned(), s.to_owned()))
    );
    for row in results {
        check_row(row);
    }
    assert_eq!(number(&results[0], "ratio_to_health"), 1.0);
    // The server's memory, read from /proc (the tool started it) and its
    // live keys from /metrics: the hot key and some of the 1k keys.
    let memory = &doc["figures"]["memory"];
    assert!(number(memory, "rss_bytes") > 0.0, "{memory}");
    let keys = number(memory, "keys");
    assert!((2.0..=1001.0).contains(&keys), "{memory}");
    // The table names every row.
    for arm in ["health", "pair"] {
        assert!(run.stdout.contains(arm), "{}", run.stdout);
    }
}

#[tokio::test]
async fn fill_creates_the_keys_the_server_lists() {
    let server = Server::start().await;
    let http = server.http_addr.clone().expect("an HTTP address");
    let target = format!("http://{}", server.addr);
    let (_, doc) = bench_json(&[
        "fill",
        "--keys",
        "300",
        "--target",
        &target,
        "--http",
        &http,
        "--duration",
        "1s",
        "--warmup",
        "50ms",
        "--connections",
        "2",
        "--in-flight",
        "2",
    ])
    .await;
    assert_eq!(doc["mode"], "fill");
    let fill = &doc["figures"]["fill"];
    assert_eq!(fill["keys"], 300);
    assert_eq!(fill["created"], 300);
    assert_eq!(fill["errors"], 0);
    assert_eq!(fill["before"]["keys"], 0);
    assert_eq!(fill["after"]["keys"], 300);

    // The server agrees: 300 keys under fill/, each with one failure.
    let listed = fusebox_keys(&server, "fill/").await;
    assert_eq!(listed.len(), 300);
    for key in ["fill/0", "fill/150", "fill/299"] {
        let state = server.get(key).await;
        assert_eq!(state.consecutive_failures, 1, "{key}: {state:?}");
    }
    // The listing probes saw the same keys.
    let listing = &doc["figures"]["listing"];
    assert_eq!(listing["all"]["keys"], 300);
    let prefix = listing["prefix"].as_str().expect("a prefix");
    let expected = listed.iter().filter(|k| k.starts_with(prefix)).count();
    assert_eq!(listing["prefix_listing"]["keys"], expected);
    assert_eq!(listing["prefix_expected"], expected);
    check_pair(&listing["pair_without_listing"]);
    check_pair(&listing["pair_while_listing"]);
}

/// A pair measurement of the listing probe: throughput, ordered
/// percentiles.
fn check_pair(m: &Value) {
    assert!(number(m, "rate") > 0.0, "{m}");
    assert!(number(m, "p50_us") <= number(m, "p99_us"), "{m}");
    assert!(number(m, "p99_us") <= number(m, "p999_us"), "{m}");
}

/// Every key under `prefix`, through Admin.ListKeys page by page.
async fn fusebox_keys(server: &Server, prefix: &str) -> Vec<String> {
    let mut admin = server.admin().await;
    let mut keys = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = admin
            .list_keys(pb::ListKeysRequest {
                prefix: prefix.to_owned(),
                phases: Vec::new(),
                page_size: 1000,
                page_token,
            })
            .await
            .expect("ListKeys answers")
            .into_inner();
        keys.extend(page.keys.into_iter().map(|k| k.key));
        if page.next_page_token.is_empty() {
            return keys;
        }
        page_token = page.next_page_token;
    }
}

#[tokio::test]
async fn a_list_of_targets_shares_the_connections_and_sums_the_metrics() {
    let (a, b) = tokio::join!(Server::start(), Server::start());
    let http = |s: &Server| s.http_addr.clone().expect("an HTTP address");
    let targets = format!("http://{},http://{}", a.addr, b.addr);
    let https = format!("{},{}", http(&a), http(&b));
    let (_, doc) = bench_json(&[
        "fill",
        "--keys",
        "300",
        "--no-listing",
        "--target",
        &targets,
        "--http",
        &https,
        "--connections",
        "2",
        "--in-flight",
        "2",
    ])
    .await;
    let targets_json = &doc["settings"]["targets"];
    assert_eq!(targets_json.as_array().map(Vec::len), Some(2), "{doc}");
    let fill = &doc["figures"]["fill"];
    assert_eq!(fill["created"], 300);
    assert_eq!(fill["errors"], 0);
    // Memory and keys are summed over both servers.
    assert_eq!(fill["before"]["keys"], 0);
    assert_eq!(fill["after"]["keys"], 300);
    // One connection went to each server, and each created some keys.
    let (on_a, on_b) = (
        fusebox_keys(&a, "fill/").await.len(),
        fusebox_keys(&b, "fill/").await.len(),
    );
    assert_eq!(on_a + on_b, 300);
    assert!(
        on_a > 0 && on_b > 0,
        "{on_a} keys on one, {on_b} on the other"
    );
}

/// The arms of one table, by name.
fn row<'a>(results: &'a [Value], arm: &str) -> &'a Value {
    results
        .iter()
        .find(|r| r["arm"] == arm)
        .unwrap_or_else(|| panic!("a {arm} row in {results:?}"))
}

#[tokio::test]
async fn stream_and_batch_make_decisions_compared_with_pair() {
    let (run, doc) = bench_json(&[
        "--duration",
        "1s",
        "--warmup",
        "100ms",
        "--runs",
        "1",
        "--arms",
        "pair,stream,batch",
        "--spreads",
        "1k",
        "--connections",
        "2",
        "--in-flight",
        "2",
        "--frames",
        "20",
    ])
    .await;
    assert_eq!(doc["settings"]["frames"], 20);
    let results = doc["figures"]["results"].as_array().expect("results");
    assert_eq!(results.len(), 4, "{results:?}");
    for r in results {
        check_row(r);
    }
    assert_eq!(number(row(results, "pair"), "ratio_to_pair"), 1.0);
    for arm in ["stream", "batch"] {
        let r = row(results, arm);
        assert_eq!(r["unit"], "pairs/s", "{r}");
        assert!(number(r, "ratio_to_pair") > 0.0, "{r}");
        assert_eq!(r["not_granted"], 0, "{r}");
    }
    assert_eq!(row(results, "stream")["latency_of"], "decision");
    assert_eq!(row(results, "batch")["latency_of"], "batch");
    assert!(run.stdout.contains("VS PAIR"), "{}", run.stdout);
}

#[tokio::test]
async fn a_rate_paces_pair_and_stream() {
    // No warm-up: a paced caller that fell behind during one sends what
    // was due at once when it can (the schedule does not slip), so the
    // window would count decisions due before it. Without one, every
    // decision counted was due inside the window.
    let (_, doc) = bench_json(&[
        "--duration",
        "1s",
        "--warmup",
        "0s",
        "--runs",
        "1",
        "--arms",
        "pair,stream",
        "--spreads",
        "1k",
        "--connections",
        "2",
        "--in-flight",
        "2",
        "--rate",
        "400",
    ])
    .await;
    let results = doc["figures"]["results"].as_array().expect("results");
    // Decisions a paced arm keeps in flight at most: pair, one per caller
    // (2 connections x 2); stream, --frames (100) per stream, one stream
    // per connection.
    for (arm, in_flight) in [("pair", 4.0), ("stream", 200.0)] {
        let r = row(results, arm);
        check_row(r);
        assert_eq!(number(r, "rate_asked"), 400.0, "{r}");
        let rate = number(r, "rate");
        // Never more than asked: the schedule is the limit, not the server.
        assert!(rate <= 420.0, "paced at no more than 400/s: {r}");
        // As much as asked, unless the server could not take that many
        // with these decisions in flight: at least that many every p99 of
        // latency is a rate a closed loop would have beaten (a loaded
        // machine lowers the bar instead of failing the test).
        let most = 400f64.min(in_flight * 1e6 / number(r, "p99_us"));
        assert!(
            rate >= 0.75 * most,
            "paced near 400/s, or near what the server took ({most:.0}/s): {r}"
        );
        assert!(number(r, "from_due_p99_us") > 0.0, "{r}");
    }
    // health stays closed loop: far above the rate asked of the others.
    assert!(row(results, "health")["rate_asked"].is_null());
}

#[tokio::test]
async fn the_peer_arms_and_the_conformance_run_need_their_servers() {
    for (arm, flag) in [
        ("throttlecrab", "--throttlecrab"),
        ("ratelimit", "--ratelimit"),
    ] {
        let run = bench(&[
            "--duration",
            "100ms",
            "--warmup",
            "0s",
            "--runs",
            "1",
            "--arms",
            arm,
            "--spreads",
            "hot",
        ])
        .await;
        assert_ne!(run.code, Some(0), "{arm}: {}", run.stdout);
        assert!(run.stderr.contains(flag), "{arm}: {}", run.stderr);
    }
    let alone = harness::run(std::path::Path::new(BENCH), &["rls-conformance"]).await;
    assert_eq!(alone.code, Some(1), "{}", alone.stdout);
    assert_eq!(alone.stdout, "", "nothing measured");
    assert!(
        alone.stderr.contains("--target (fusebox) and --ratelimit"),
        "{}",
        alone.stderr
    );
}

#[tokio::test]
async fn without_a_fusebox_beside_it_the_tool_says_what_to_do() {
    // A copy of the tool alone in a directory: no fusebox next to it.
    let dir = tempfile::tempdir().expect("a temp dir");
    let alone = dir.path().join("fusebox-bench");
    std::fs::copy(BENCH, &alone).expect("the tool copied");
    let run = harness::run(&alone, &["--runs", "1", "--spreads", "hot"]).await;
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    assert_eq!(run.stdout, "", "nothing measured");
    for words in [
        "no fusebox binary at",
        "--server-bin PATH",
        "cargo build --release -p fusebox -p fusebox-bench",
        "--target",
    ] {
        assert!(run.stderr.contains(words), "{words:?} in {:?}", run.stderr);
    }
    // --server-bin names the server to start; a path that is not there
    // is refused before anything starts.
    let missing = dir.path().join("not-fusebox");
    let missing = missing.to_str().expect("a UTF-8 path");
    let run = harness::run(&alone, &["--server-bin", missing, "--runs", "1"]).await;
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    assert!(
        run.stderr
            .contains(&format!("--server-bin {missing}: no such file")),
        "{}",
        run.stderr
    );
}

#[tokio::test]
async fn server_bin_names_the_server_the_tool_starts() {
    let bin = server_bin();
    let (_, doc) = bench_json(&[
        "--server-bin",
        bin.to_str().expect("a UTF-8 path"),
        "--arms",
        "health",
        "--spreads",
        "hot",
        "--runs",
        "1",
        "--warmup",
        "0s",
        "--duration",
        "1s",
        "--connections",
        "1",
        "--in-flight",
        "1",
    ])
    .await;
    assert_eq!(doc["settings"]["server_bin"], bin.to_str().expect("UTF-8"));
    check_row(&doc["figures"]["results"][0]);
}

/// The retry storm (R1-R3): with 5 retries per first attempt on a key whose
/// budget is `ratio = 0.2`, no floor, a 1 s window, the tool sends about 5
/// retries per first attempt, the server denies most of them
/// `retry_budget`, and the retries granted stay near a fifth of the first
/// attempts (the window slides in 100 ms segments, so a second's share may
/// pass 0.2 a little; the whole measurement stays under 0.25).
#[tokio::test]
async fn a_retry_storm_is_held_to_the_budget() {
    let (run, doc) = bench_json(&[
        "retry-storm",
        "--retry-share",
        "0.833334",
        "--budget-ratio",
        "0.2",
        "--budget-min-per-second",
        "0",
        "--budget-window",
        "1s",
        "--warmup",
        "1s",
        "--duration",
        "2s",
        "--connections",
        "2",
        "--in-flight",
        "2",
    ])
    .await;
    assert_eq!(doc["mode"], "retry-storm");
    let figures = &doc["figures"];
    assert_eq!(figures["per_second"].as_array().map(Vec::len), Some(2));
    let total = &figures["total"];
    let firsts = number(total, "first_attempts");
    let sent = number(total, "retries_sent");
    let granted = number(total, "retries_granted");
    let denied = number(total, "retries_denied_retry_budget");
    assert!(firsts >= 10.0, "first attempts in {total}");
    assert!(
        (sent / firsts - 5.0).abs() < 0.5,
        "about 5 retries per first attempt: {total}"
    );
    assert_eq!(
        granted + denied,
        sent,
        "every retry granted or denied: {total}"
    );
    assert!(granted > 0.0 && denied > granted, "{total}");
    assert!(granted <= 0.25 * firsts, "held to the budget: {total}");
    assert_eq!(total["errors"], 0, "{total}");
    assert_eq!(total["other_answers"], 0, "{total}");
    assert!(
        run.stdout.contains("retries denied retry_budget"),
        "the table: {}",
        run.stdout
    );
}

/// The adaptive limiter in front of a dependency that doubles its latency
/// above 8 calls inside: the tool samples the key's `adaptive_limit` every
/// second, always within `[min, max]`, grown from `initial` while calls
/// are fast; every call's latency is the dependency's (20 or 40 ms, plus
/// the timer's slack); the CSV has a row a second and the SVG a line for
/// the limit, the knee and the latency.
#[tokio::test]
async fn the_adaptive_limit_is_sampled_every_second_and_plotted() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let csv = dir.path().join("adaptive.csv");
    let svg = dir.path().join("adaptive.svg");
    let (run, doc) = bench_json(&[
        "adaptive-limit",
        "--min",
        "1",
        "--max",
        "50",
        "--initial",
        "2",
        "--knee",
        "8",
        "--knee-later",
        "4",
        "--warmup",
        "1s",
        "--duration",
        "3s",
        "--connections",
        "2",
        "--in-flight",
        "8",
        "--csv",
        csv.to_str().expect("a UTF-8 path"),
        "--svg",
        svg.to_str().expect("a UTF-8 path"),
    ])
    .await;
    assert_eq!(doc["mode"], "adaptive-limit");
    let figures = &doc["figures"];
    let rows = figures["per_second"].as_array().expect("rows");
    assert_eq!(rows.len(), 3, "{figures}");
    for row in rows {
        let limit = number(row, "adaptive_limit");
        assert!((1.0..=50.0).contains(&limit), "within [min, max]: {row}");
        let latency = number(row, "mean_latency_ms");
        assert!(
            (20.0..=200.0).contains(&latency),
            "the dependency's latency: {row}"
        );
    }
    assert!(
        rows.iter().any(|r| number(r, "adaptive_limit") > 2.0),
        "the limit grew from initial: {figures}"
    );
    assert_eq!(figures["total"]["errors"], 0, "{figures}");
    assert!(number(&figures["total"], "granted") > 0.0, "{figures}");
    let csv = std::fs::read_to_string(&csv).expect("the CSV");
    assert_eq!(csv.lines().count(), 4, "{csv}");
    assert!(csv.starts_with("second,knee,adaptive_limit,"), "{csv}");
    let svg = std::fs::read_to_string(&svg).expect("the SVG");
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    assert_eq!(svg.matches("<polyline").count(), 3, "{svg}");
    assert!(run.stdout.contains("adaptive_limit"), "{}", run.stdout);
}

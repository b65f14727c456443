//! A soak run: a real `fusebox serve` on loopback under a steady, mixed load
//! for a while, then checks that it gave everything back.
//!
//! ```text
//! cargo run --release --example soak -- --bin target/release/fusebox --duration 600
//! ```
//!
//! (`scripts/soak [SECONDS]` builds both and runs this.) The load, from many
//! connections at once: acquires with random permits, waits, leases and gRPC
//! deadlines; completions with random outcomes, renewals, tickets left to
//! their lease, late completions of those, callers that give up while they
//! wait, isolates and closes, and config reloads (the file rewritten and
//! SIGHUP sent). Afterwards, once every lease has ended:
//!
//! - every permit is back: for every key, `free == limit`, with no live
//!   ticket and no waiter (ListKeys), and `/metrics` shows no ticket or
//!   waiter left;
//! - the resident memory at the end is within 10% of its level after
//!   warm-up (sampled once a fifth of the run has passed);
//! - no error other than the expected ones: DEADLINE_EXCEEDED and CANCELLED
//!   from the run's own deadlines and cancellations, NOT_FOUND for late
//!   completions, RESOURCE_EXHAUSTED at a cap;
//! - every reload was applied, and the server is still running.
//!
//! It prints a short report and exits non-zero when a check fails.

use std::collections::BTreeMap;
use std::io::Write;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fusebox::proto::v1 as pb;
use pb::admin_client::AdminClient;
use pb::fusebox_client::FuseboxClient;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tonic::transport::Channel;
use tonic::Code;

const USAGE: &str = "usage: soak --bin PATH [--duration SECONDS] [--connections N] [--seed N]";

/// The config under load: `permits` for the concurrency rule changes with
/// every reload.
fn config(permits: u32) -> String {
    format!(
        r#"
[server]
max_keys = 400
max_tickets = 2000
max_waiters = 300
idle_after = "2s"

[[rule]]
match = "c/*"
breaker = {{ mode = "consecutive", failures = 8, break = "200ms", multiplier = 2.0, max_break = "2s" }}
limiter = {{ kind = "concurrency", permits = {permits}, queue_limit = 12 }}
lease = {{ default = "300ms", max = "1s" }}

[[rule]]
match = "t/*"
breaker = {{ mode = "ratio", failure_ratio = 0.6, minimum_throughput = 10, sampling_window = "1s", break = "150ms" }}
limiter = {{ kind = "token_bucket", capacity = 6, refill = 2, period = "50ms", queue_limit = 6, order = "newest_first" }}
lease = {{ default = "250ms", max = "800ms", expired_outcome = "FAILURE" }}

[default]
breaker = {{ mode = "consecutive", failures = 3, break = "100ms" }}
lease = {{ default = "200ms", max = "600ms" }}
"#
    )
}

/// The longest lease any rule grants, in ms.
const MAX_LEASE_MS: u64 = 1_000;

/// A small, fast, seeded random source (xorshift64*).
#[derive(Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// Counts by name, shared by the workers.
#[derive(Default)]
struct Tally(Mutex<BTreeMap<String, u64>>);

impl Tally {
    fn add(&self, name: impl Into<String>) {
        *self
            .0
            .lock()
            .expect("tally")
            .entry(name.into())
            .or_default() += 1;
    }
    fn get(&self) -> BTreeMap<String, u64> {
        self.0.lock().expect("tally").clone()
    }
}

struct Shared {
    ops: Tally,
    /// Errors by gRPC code, with whether the run expected them.
    errors: Tally,
    unexpected: Tally,
    /// Tickets left to their lease: (token, when its lease surely ended).
    abandoned: Mutex<Vec<(String, Instant)>>,
    stop: AtomicBool,
    calls: AtomicU64,
}

fn key(rng: &mut Rng) -> String {
    match rng.below(10) {
        0..=3 => format!("c/{}", rng.below(12)),
        4..=6 => format!("t/{}", rng.below(8)),
        7..=8 => format!("b/{}", rng.below(8)),
        // Keys made and forgotten: idle keys go after `idle_after`.
        _ => format!("r/{}", rng.below(5_000)),
    }
}

fn ms(ms: u64) -> Option<prost_types::Duration> {
    Some(fusebox::proto::wire::duration_of(ms))
}

/// Records a failed call: `expected` lists the codes this call may fail with.
fn failed(shared: &Shared, what: &str, status: &tonic::Status, expected: &[Code]) {
    let code = format!("{:?}", status.code());
    shared.errors.add(format!("{what}: {code}"));
    if !expected.contains(&status.code()) {
        shared
            .unexpected
            .add(format!("{what}: {code}: {}", status.message()));
    }
}

async fn worker(channel: Channel, shared: Arc<Shared>, mut rng: Rng) {
    let mut client = FuseboxClient::new(channel.clone());
    let mut admin = AdminClient::new(channel);
    while !shared.stop.load(Ordering::Relaxed) {
        shared.calls.fetch_add(1, Ordering::Relaxed);
        let roll = rng.below(100);
        if roll < 2 {
            let k = format!("c/{}", rng.below(12));
            let isolate = rng.chance(40);
            let result = if isolate {
                shared.ops.add("isolate");
                admin
                    .isolate(pb::IsolateRequest {
                        key: k,
                        reason: "soak".into(),
                    })
                    .await
                    .map(|_| ())
            } else {
                shared.ops.add("close");
                admin
                    .close(pb::CloseRequest {
                        key: k,
                        reason: "soak".into(),
                    })
                    .await
                    .map(|_| ())
            };
            if let Err(s) = result {
                failed(&shared, "isolate/close", &s, &[Code::ResourceExhausted]);
            }
            continue;
        }
        if roll < 5 {
            // A late completion of a ticket whose lease ended.
            let late = {
                let mut list = shared.abandoned.lock().expect("abandoned");
                let now = Instant::now();
                list.iter()
                    .position(|(_, ended)| *ended <= now)
                    .map(|i| list.swap_remove(i).0)
            };
            if let Some(ticket) = late {
                shared.ops.add("late complete");
                match client
                    .complete(pb::CompleteRequest {
                        ticket,
                        outcome: pb::Outcome::Success as i32,
                        cost: None,
                    })
                    .await
                {
                    Ok(_) => shared
                        .unexpected
                        .add("a completion after the lease ended was accepted"),
                    Err(s) => failed(&shared, "late complete", &s, &[Code::NotFound]),
                }
                continue;
            }
        }
        let k = key(&mut rng);
        let permits = if rng.chance(10) { 2 } else { 1 } as u32;
        let max_wait = if rng.chance(50) {
            0
        } else {
            20 + rng.below(300)
        };
        let lease = if rng.chance(50) {
            None
        } else {
            Some(50 + rng.below(400))
        };
        let mut request = tonic::Request::new(pb::AcquireRequest {
            key: k.clone(),
            permits: Some(permits),
            max_wait: ms(max_wait),
            lease: lease.and_then(ms),
            ..Default::default()
        });
        let deadline = rng.chance(10) && max_wait > 0;
        if deadline {
            // A deadline shorter than the wait: the waiter is withdrawn (P6).
            request.set_timeout(Duration::from_millis(1 + rng.below(max_wait)));
        }
        let cancel = !deadline && max_wait > 0 && rng.chance(10);
        let sent = Instant::now();
        let answer = if cancel {
            shared.ops.add("acquire (given up)");
            match tokio::time::timeout(
                Duration::from_millis(1 + rng.below(max_wait)),
                client.acquire(request),
            )
            .await
            {
                Ok(answer) => answer,
                Err(_) => {
                    shared.ops.add("gave up waiting");
                    continue;
                }
            }
        } else {
            shared.ops.add(if deadline {
                "acquire (deadline)"
            } else {
                "acquire"
            });
            client.acquire(request).await
        };
        let reply = match answer {
            Ok(r) => r.into_inner(),
            Err(s) => {
                failed(
                    &shared,
                    "acquire",
                    &s,
                    &[
                        Code::DeadlineExceeded,
                        Code::Cancelled,
                        Code::ResourceExhausted,
                    ],
                );
                continue;
            }
        };
        let decision = pb::Decision::try_from(reply.decision).unwrap_or(pb::Decision::Unspecified);
        shared
            .ops
            .add(format!("decision {}", decision.as_str_name()));
        if reply.ticket.is_empty() {
            continue;
        }
        let ticket = reply.ticket;
        let millis = |d: Option<prost_types::Duration>| {
            d.map_or(0, |d| d.seconds as u64 * 1000 + d.nanos as u64 / 1_000_000)
        };
        // Before this the lease surely has not ended: it began after the
        // request was sent, with this much left.
        let lease_left = Duration::from_millis(millis(reply.lease));
        let mut lease_ends = sent + lease_left;
        if rng.chance(10) {
            // Left to its lease, which surely ends before this: it began
            // before the reply was read (plus a millisecond of rounding).
            shared.ops.add("abandon");
            let ended = Instant::now() + lease_left + Duration::from_millis(2);
            let mut list = shared.abandoned.lock().expect("abandoned");
            if list.len() < 1_000 {
                list.push((ticket, ended));
            }
            continue;
        }
        if rng.chance(15) {
            shared.ops.add("renew");
            let asked = Instant::now();
            match client
                .renew(pb::RenewRequest {
                    ticket: ticket.clone(),
                    lease: ms(100 + rng.below(300)),
                })
                .await
            {
                Ok(r) => lease_ends = asked + Duration::from_millis(millis(r.into_inner().lease)),
                Err(s) => {
                    lost(&shared, "renew", &s, lease_ends);
                    continue;
                }
            }
        }
        let hold = rng.below(20);
        if hold > 0 {
            tokio::time::sleep(Duration::from_millis(hold)).await;
        }
        let outcome = match rng.below(10) {
            0..=5 => pb::Outcome::Success,
            6..=8 => pb::Outcome::Failure,
            _ => pb::Outcome::Ignored,
        };
        shared.ops.add("complete");
        if let Err(s) = client
            .complete(pb::CompleteRequest {
                ticket,
                outcome: outcome as i32,
                cost: None,
            })
            .await
        {
            lost(&shared, "complete", &s, lease_ends);
        }
    }
}

/// A completion or renewal that failed: NOT_FOUND is expected only once
/// the ticket's lease may have ended (L3); before that the ticket is live.
fn lost(shared: &Shared, what: &str, status: &tonic::Status, lease_ends: Instant) {
    if status.code() == Code::NotFound && Instant::now() < lease_ends {
        shared.errors.add(format!("{what}: {:?}", status.code()));
        shared
            .unexpected
            .add(format!("{what}: NotFound before the ticket's lease ended"));
        return;
    }
    let what = format!("{what} (lease ended)");
    failed(shared, &what, status, &[Code::NotFound]);
}

/// `GET path` on the HTTP side; the body.
async fn http_get(addr: &str, path: &str) -> Result<String, String> {
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect {addr}: {e}"))?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut text = String::new();
    stream
        .read_to_string(&mut text)
        .await
        .map_err(|e| e.to_string())?;
    Ok(text)
}

/// The value of an unlabelled sample in `/metrics`.
fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

async fn metrics(addr: &str) -> Result<String, String> {
    http_get(addr, "/metrics").await
}

/// Every key the server holds, with ListKeys.
async fn all_keys(admin: &mut AdminClient<Channel>) -> Result<Vec<pb::KeyState>, tonic::Status> {
    let mut keys = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = admin
            .list_keys(pb::ListKeysRequest {
                prefix: String::new(),
                phases: vec![],
                page_size: 1000,
                page_token,
            })
            .await?
            .into_inner();
        keys.extend(page.keys);
        if page.next_page_token.is_empty() {
            return Ok(keys);
        }
        page_token = page.next_page_token;
    }
}

/// Keys that still hold something: a permit out, a ticket or a waiter.
fn holding(keys: &[pb::KeyState]) -> Vec<String> {
    keys.iter()
        .filter(|k| k.free != k.limit || k.live_tickets > 0 || k.waiters > 0)
        .map(|k| {
            format!(
                "{} (free {}/{}, tickets {}, waiters {})",
                k.key, k.free, k.limit, k.live_tickets, k.waiters
            )
        })
        .collect()
}

/// The address the server prints on its next line after `prefix`.
async fn address(
    lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    prefix: &str,
) -> Result<String, String> {
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .map_err(|_| "the server printed no address within 30 s".to_owned())?
        .map_err(|e| e.to_string())?
        .ok_or("the server exited at start")?;
    line.strip_prefix(prefix)
        .map(str::to_owned)
        .ok_or(format!("expected `{prefix}ADDR`, got {line:?}"))
}

struct Args {
    bin: String,
    duration: u64,
    connections: usize,
    seed: u64,
}

fn args() -> Result<Args, String> {
    let mut args = Args {
        bin: String::new(),
        duration: 600,
        connections: 32,
        seed: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
            | 1,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value\n{USAGE}"));
        let number = |v: String| {
            v.parse::<u64>()
                .map_err(|_| format!("{flag}: {v:?} is not a whole number\n{USAGE}"))
        };
        match flag.as_str() {
            "--bin" => args.bin = value()?,
            "--duration" => args.duration = number(value()?)?.max(10),
            "--connections" => args.connections = number(value()?)?.clamp(1, 1000) as usize,
            "--seed" => args.seed = number(value()?)? | 1,
            _ => return Err(format!("unknown argument {flag:?}\n{USAGE}")),
        }
    }
    if args.bin.is_empty() {
        return Err(format!("--bin is required\n{USAGE}"));
    }
    Ok(args)
}

#[tokio::main]
async fn main() {
    let args = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    match run(args).await {
        Ok(()) => println!("soak: PASS"),
        Err(failures) => {
            for f in failures {
                println!("FAIL: {f}");
            }
            println!("soak: FAIL");
            std::process::exit(1);
        }
    }
}

async fn run(args: Args) -> Result<(), Vec<String>> {
    let dir = std::env::temp_dir().join(format!("fusebox-soak-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| vec![format!("temp dir: {e}")])?;
    let config_path = dir.join("fusebox.toml");
    std::fs::write(&config_path, config(4)).map_err(|e| vec![format!("config: {e}")])?;

    let mut child = tokio::process::Command::new(&args.bin)
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--http",
            "127.0.0.1:0",
            "--config",
        ])
        .arg(&config_path)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| vec![format!("cannot start {}: {e}", args.bin)])?;
    let pid = child.id().unwrap_or(0);
    let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
    let grpc = address(&mut lines, "listening on ")
        .await
        .map_err(|e| vec![e])?;
    let http = address(&mut lines, "http on ").await.map_err(|e| vec![e])?;
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    // The server's log: kept (bounded) for the report, never blocking it.
    let log = Arc::new(Mutex::new(Vec::<String>::new()));
    let stderr = child.stderr.take().expect("piped");
    let log_in = log.clone();
    tokio::spawn(async move {
        let mut lines = BufReader::new(stderr).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let mut log = log_in.lock().expect("log");
            if log.len() < 200 {
                log.push(line);
            }
        }
    });
    println!(
        "soak: server pid {pid} on {grpc} (http {http}), {} connections, {} s, seed {}",
        args.connections, args.duration, args.seed
    );

    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{grpc}"))
        .map_err(|e| vec![e.to_string()])?;
    let shared = Arc::new(Shared {
        ops: Tally::default(),
        errors: Tally::default(),
        unexpected: Tally::default(),
        abandoned: Mutex::new(Vec::new()),
        stop: AtomicBool::new(false),
        calls: AtomicU64::new(0),
    });
    let mut rng = Rng(args.seed);
    let mut workers = Vec::new();
    for _ in 0..args.connections {
        let channel = endpoint
            .connect()
            .await
            .map_err(|e| vec![format!("connect: {e}")])?;
        // Two workers per connection: calls share connections as in a fleet.
        for _ in 0..2 {
            let seed = rng.next() | 1;
            workers.push(tokio::spawn(worker(
                channel.clone(),
                shared.clone(),
                Rng(seed),
            )));
        }
    }

    // Reloads, and memory samples once a second, until the end.
    let started = Instant::now();
    let run_for = Duration::from_secs(args.duration);
    let warm_at = run_for / 5;
    let mut rss_warm = None;
    let mut rss_max = 0f64;
    let mut rss_last = 0f64;
    let mut reloads = 0u64;
    let mut next_reload = started + Duration::from_secs(3);
    let mut failures = Vec::new();
    while started.elapsed() < run_for {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if Instant::now() >= next_reload {
            let permits = [4, 3, 5][(reloads % 3) as usize];
            let next = dir.join("fusebox.toml.next");
            let written = std::fs::File::create(&next)
                .and_then(|mut f| f.write_all(config(permits).as_bytes()))
                .and_then(|()| std::fs::rename(&next, &config_path));
            if let Err(e) = written {
                failures.push(format!("rewriting the config: {e}"));
            }
            let _ = std::process::Command::new("kill")
                .args(["-HUP", &pid.to_string()])
                .status();
            reloads += 1;
            shared.ops.add("reload");
            next_reload = Instant::now() + Duration::from_secs(5);
        }
        match metrics(&http).await {
            Ok(text) => {
                if let Some(rss) = metric(&text, "process_resident_memory_bytes") {
                    rss_last = rss;
                    rss_max = rss_max.max(rss);
                    if rss_warm.is_none() && started.elapsed() >= warm_at {
                        rss_warm = Some(rss);
                    }
                }
            }
            Err(e) => failures.push(format!("/metrics during the run: {e}")),
        }
    }
    shared.stop.store(true, Ordering::Relaxed);
    for w in workers {
        if let Err(e) = w.await {
            failures.push(format!("a load worker failed: {e}"));
        }
    }
    let load_time = started.elapsed();

    // Once every lease has ended, everything is back.
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| vec![format!("connect after the run: {e}")])?;
    let mut admin = AdminClient::new(channel);
    let settle_by = Instant::now() + Duration::from_millis(MAX_LEASE_MS) + Duration::from_secs(30);
    let mut left;
    loop {
        left = match all_keys(&mut admin).await {
            Ok(keys) => holding(&keys),
            Err(s) => vec![format!("ListKeys failed: {s}")],
        };
        if left.is_empty() || Instant::now() >= settle_by {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if !left.is_empty() {
        failures.push(format!(
            "keys still holding permits, tickets or waiters 30 s after the last lease: {}",
            left.iter().take(10).cloned().collect::<Vec<_>>().join(", ")
        ));
    }
    let text = metrics(&http).await.unwrap_or_default();
    let tickets = metric(&text, "fusebox_tickets");
    let waiters = metric(&text, "fusebox_waiters");
    if tickets != Some(0.0) || waiters != Some(0.0) {
        failures.push(format!(
            "/metrics after the run: fusebox_tickets {tickets:?}, fusebox_waiters {waiters:?} (0 expected)"
        ));
    }
    let applied = metric(&text, "fusebox_config_reloads_total").unwrap_or(0.0);
    let refused = metric(&text, "fusebox_config_reload_failures_total").unwrap_or(0.0);
    if applied < reloads as f64 || refused > 0.0 {
        failures.push(format!(
            "{reloads} reloads sent, {applied} applied, {refused} refused"
        ));
    }
    if let Ok(Some(status)) = child.try_wait() {
        failures.push(format!("the server exited: {status}"));
    }
    let warm = rss_warm.unwrap_or(rss_last);
    let ratio = if warm > 0.0 { rss_last / warm } else { 0.0 };
    if warm <= 0.0 {
        failures.push("no process_resident_memory_bytes in /metrics".into());
    } else if ratio > 1.10 {
        failures.push(format!(
            "resident memory grew {:.1}% after warm-up (at most 10%)",
            (ratio - 1.0) * 100.0
        ));
    }
    let unexpected = shared.unexpected.get();
    if !unexpected.is_empty() {
        failures.push(format!("unexpected errors: {unexpected:?}"));
    }

    let calls = shared.calls.load(Ordering::Relaxed);
    println!(
        "soak: {calls} operations in {:.0} s ({:.0}/s), {reloads} reloads",
        load_time.as_secs_f64(),
        calls as f64 / load_time.as_secs_f64()
    );
    println!("operations:");
    for (name, n) in shared.ops.get() {
        println!("  {name:<28} {n}");
    }
    println!("errors by call and code (all expected unless listed below):");
    for (code, n) in shared.errors.get() {
        println!("  {code:<28} {n}");
    }
    for (what, n) in &unexpected {
        println!("  UNEXPECTED {what} x{n}");
    }
    let mib = |b: f64| b / (1024.0 * 1024.0);
    println!(
        "rss: warm {:.1} MiB, end {:.1} MiB, ratio {ratio:.3}, max {:.1} MiB",
        mib(warm),
        mib(rss_last),
        mib(rss_max)
    );
    let _ = child.start_kill();
    let _ = std::fs::remove_dir_all(&dir);
    if failures.is_empty() {
        Ok(())
    } else {
        let log = log.lock().expect("log");
        if !log.is_empty() {
            println!("server log (first lines):");
            for line in log.iter().take(40) {
                println!("  {line}");
            }
        }
        Err(failures)
    }
}

//! Watch under load, measured in one run against a real gRPC server in this
//! process (issue 4, acceptance 1):
//!
//! 1. the delay from the `Complete` that trips a breaker to the Watch event
//!    arriving at a watcher, over many trips (median, p99, max);
//! 2. Acquire+Complete throughput over gRPC with concurrent clients, with no
//!    watcher and with a stalled watcher (opened, never read), in
//!    alternating runs so that machine noise falls on both alike; the
//!    medians and their ratio (target: stalled/none >= 0.95).
//!
//! The throughput workload makes transitions of its own (one granted call
//! in 4 fails, which trips the key; a 1 ms break later a probe closes it),
//! so that a stalled watcher really falls behind (past the 4096 events the
//! server keeps for it and its transport buffers); each stalled run checks
//! afterwards that its watcher was told it lagged.
//!
//! Run: `cargo bench --bench watch` (under a minute). Settings can be changed
//! with `FUSEBOX_BENCH_TRIPS`, `FUSEBOX_BENCH_CLIENTS`, `FUSEBOX_BENCH_RUNS`
//! and `FUSEBOX_BENCH_RUN_MS`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fusebox::config::Config;
use fusebox::engine::Engine;
use fusebox::proto::v1 as pb;
use pb::watch_event::Event;
use tonic::transport::{Channel, Endpoint};

type Fusebox = pb::fusebox_client::FuseboxClient<Channel>;

const CONFIG: &str = r#"
[[rule]]
match = "trip/*"
breaker = { mode = "consecutive", failures = 1, break = "1h" }

[[rule]]
match = "load/*"
breaker = { mode = "consecutive", failures = 1, break = "1ms" }
"#;

/// Connections the throughput clients share (several clients per
/// connection, as a service's client pool would).
const CONNECTIONS: usize = 4;

fn setting(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

async fn connect(addr: &str, small_window: bool) -> Channel {
    let mut endpoint = Endpoint::from_shared(format!("http://{addr}")).expect("an address");
    if small_window {
        // A watcher that never reads: its connection takes 64 KiB unread.
        endpoint = endpoint
            .initial_stream_window_size(Some(65_535))
            .initial_connection_window_size(Some(65_535));
    }
    endpoint.connect().await.expect("the server accepts")
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

fn us(d: Duration) -> String {
    format!("{:.0} µs", d.as_secs_f64() * 1e6)
}

/// Acquire on `key`, with the policy's defaults.
async fn acquire(c: &mut Fusebox, key: &str) -> pb::AcquireResponse {
    c.acquire(pb::AcquireRequest {
        key: key.to_owned(),
        ..Default::default()
    })
    .await
    .expect("Acquire answers")
    .into_inner()
}

/// Complete of `ticket` with `outcome`.
async fn complete(c: &mut Fusebox, ticket: String, outcome: pb::Outcome) -> pb::CompleteResponse {
    c.complete(pb::CompleteRequest {
        ticket,
        outcome: outcome as i32,
        cost: None,
    })
    .await
    .expect("Complete answers")
    .into_inner()
}

/// Part 1: the delay from a tripping Complete to its Watch event.
async fn trip_delay(addr: &str, trips: usize) {
    let mut watch = pb::admin_client::AdminClient::new(connect(addr, false).await)
        .watch(pb::WatchRequest {
            prefix: "trip/".into(),
        })
        .await
        .expect("Watch answers")
        .into_inner();
    // The arrivals, stamped as soon as they are read.
    let (tx, mut arrivals) = tokio::sync::mpsc::unbounded_channel::<(String, Instant)>();
    tokio::spawn(async move {
        while let Ok(Some(message)) = watch.message().await {
            if let Some(Event::Transition(t)) = message.event {
                if t.to == pb::Phase::Open as i32 && tx.send((t.key, Instant::now())).is_err() {
                    return;
                }
            }
        }
    });
    let mut c = Fusebox::new(connect(addr, false).await);
    let warm_up = trips / 10;
    let mut delays = Vec::with_capacity(trips);
    let mut replies = Vec::with_capacity(trips);
    for i in 0..warm_up + trips {
        let key = format!("trip/{i}");
        let ticket = acquire(&mut c, &key).await.ticket;
        let sent = Instant::now();
        let done = complete(&mut c, ticket, pb::Outcome::Failure).await;
        let replied = Instant::now();
        assert_eq!(done.phase, pb::Phase::Open as i32);
        let (got, arrived) = tokio::time::timeout(Duration::from_secs(5), arrivals.recv())
            .await
            .expect("the event arrives within 5 s")
            .expect("the watcher runs");
        assert_eq!(got, key, "events arrive in order");
        if i >= warm_up {
            delays.push(arrived.saturating_duration_since(sent));
            replies.push(replied.saturating_duration_since(sent));
        }
    }
    delays.sort();
    replies.sort();
    println!("Complete (tripping a breaker) -> Watch event, {trips} trips, one at a time:");
    println!(
        "  event delay:    median {}, p99 {}, max {}",
        us(percentile(&delays, 0.5)),
        us(percentile(&delays, 0.99)),
        us(*delays.last().expect("trips"))
    );
    println!(
        "  Complete reply: median {}, p99 {} (for comparison)",
        us(percentile(&replies, 0.5)),
        us(percentile(&replies, 0.99))
    );
}

/// One throughput run: `clients` loops of Acquire (+ Complete when given a
/// ticket) for `length`; returns the Acquire calls answered per second.
async fn run_load(channels: &[Channel], clients: usize, length: Duration, run: usize) -> f64 {
    let start = Instant::now();
    let deadline = start + length;
    let mut tasks = Vec::with_capacity(clients);
    for client in 0..clients {
        let mut c = Fusebox::new(channels[client % channels.len()].clone());
        tasks.push(tokio::spawn(async move {
            let key = format!("load/{run}/{client}");
            let mut calls = 0u64;
            while Instant::now() < deadline {
                let reply = acquire(&mut c, &key).await;
                if !reply.ticket.is_empty() {
                    let outcome = if calls % 4 == 3 {
                        pb::Outcome::Failure
                    } else {
                        pb::Outcome::Success
                    };
                    complete(&mut c, reply.ticket, outcome).await;
                }
                calls += 1;
            }
            calls
        }));
    }
    let mut calls = 0;
    for task in tasks {
        calls += task.await.expect("a client");
    }
    calls as f64 / start.elapsed().as_secs_f64()
}

/// Reads a stalled watcher until its Lagged marker; returns how many events
/// it missed, or `None` if it was never told it lagged.
async fn lagged(stream: &mut tonic::Streaming<pb::WatchEvent>) -> Option<u64> {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.message()).await {
            Ok(Ok(Some(pb::WatchEvent {
                event: Some(Event::Lagged(l)),
            }))) => return Some(l.missed),
            Ok(Ok(Some(_))) => {}
            _ => return None,
        }
    }
}

async fn throughput(addr: &str, engine: &Engine, clients: usize, runs: usize, length: Duration) {
    let mut channels = Vec::with_capacity(CONNECTIONS);
    for _ in 0..CONNECTIONS {
        channels.push(connect(addr, false).await);
    }
    println!(
        "Acquire+Complete throughput: {clients} clients over {CONNECTIONS} connections, \
         {runs} pairs of {} ms runs, interleaved:",
        length.as_millis()
    );
    // Warm-up, not counted.
    run_load(&channels, clients, length / 2, usize::MAX).await;
    let (mut none, mut stalled) = (Vec::new(), Vec::new());
    for pair in 0..runs {
        // A B B A ...: a drift in the machine's load falls on both modes.
        let order = if pair % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for with_watcher in order {
            let run = pair * 2 + usize::from(with_watcher);
            let mut watcher = None;
            if with_watcher {
                let stream = pb::admin_client::AdminClient::new(connect(addr, true).await)
                    .watch(pb::WatchRequest {
                        prefix: String::new(),
                    })
                    .await
                    .expect("Watch answers")
                    .into_inner();
                watcher = Some(stream);
            }
            let events_before = engine.totals().transitions;
            let rate = run_load(&channels, clients, length, run).await;
            let events = engine.totals().transitions - events_before;
            let events_rate = events as f64 / length.as_secs_f64();
            match watcher {
                None => {
                    println!(
                        "  pair {:>2} no watcher:      {rate:>9.0} calls/s ({events_rate:.0} events/s)",
                        pair + 1
                    );
                    none.push(rate);
                }
                Some(mut stream) => {
                    let lag = match lagged(&mut stream).await {
                        Some(n) => format!("watcher lagged, missed {n}"),
                        None => "watcher NOT lagged".to_owned(),
                    };
                    println!(
                        "  pair {:>2} stalled watcher: {rate:>9.0} calls/s ({events_rate:.0} events/s; {lag})",
                        pair + 1
                    );
                    stalled.push(rate);
                }
            }
        }
    }
    let mut pairs: Vec<f64> = stalled.iter().zip(&none).map(|(s, n)| s / n).collect();
    let (none, stalled) = (median(&mut none), median(&mut stalled));
    println!("  median, no watcher:      {none:.0} calls/s");
    println!("  median, stalled watcher: {stalled:.0} calls/s");
    println!(
        "  ratio stalled/none: {:.3} of the medians, {:.3} median of the pairs (target >= 0.95)",
        stalled / none,
        median(&mut pairs)
    );
}

fn main() {
    // `cargo bench` passes `--bench`; a filter or other flags are ignored.
    let trips = setting("FUSEBOX_BENCH_TRIPS", 500) as usize;
    let clients = setting("FUSEBOX_BENCH_CLIENTS", 16) as usize;
    let runs = setting("FUSEBOX_BENCH_RUNS", 7) as usize;
    let length = Duration::from_millis(setting("FUSEBOX_BENCH_RUN_MS", 1500));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let config = Config::parse(CONFIG, "the benchmark's config").expect("a valid config");
        let engine = Arc::new(Engine::with_system_clock(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port");
        let addr = listener.local_addr().expect("an address").to_string();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(fusebox::server::run(listener, fusebox::node::Node::of(engine.clone()), async {
            let _ = stopped.await;
        }));
        println!(
            "fusebox watch benchmark: in-process gRPC server on {addr}, system clock, {} worker threads",
            std::thread::available_parallelism().map_or(1, |n| n.get())
        );
        let started = Instant::now();
        trip_delay(&addr, trips).await;
        throughput(&addr, &engine, clients, runs, length).await;
        println!("total {:.1} s", started.elapsed().as_secs_f64());
        let _ = stop.send(());
        let _ = server.await;
    });
}

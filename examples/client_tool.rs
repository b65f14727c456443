//! The client tool of the Rust guard (`fusebox::guard`), as every client
//! library has one (see `clients/README.md`):
//!
//! ```text
//! client_tool worker --target HOST:PORT [--token T]
//! client_tool bench  --target HOST:PORT --key KEY --iterations N [--token T]
//! ```
//!
//! `worker` reads JSON-lines commands (`guard`, `release`, `forget`) on
//! standard input and writes JSON-lines events (`ready`, `running`, `done`,
//! `forgotten`, `error`) on standard output, for the fleet test; at the end
//! of its input it flushes the guard's outcomes before it exits. `bench`
//! times a raw stub `Acquire` (its `Complete` follows, untimed) against a
//! guarded no-op on the same channel (its outcome reported in the
//! background), checks that every outcome reached fusebox, and writes one
//! line of medians, p99s and the outcome count.
//!
//! Build: `cargo build --example client_tool`; the binary is
//! `target/<profile>/examples/client_tool`. Logs go to standard error
//! (`RUST_LOG`, default `info`).

use std::collections::HashMap;
use std::io::Write;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use fusebox::guard::{admitted, Admitted, CallOptions, Guard, GuardError, GuardOptions};
use fusebox::proto::v1 as pb;
use serde::Serialize;
use serde_json::{json, Map, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::oneshot;
use tonic::transport::{Channel, Endpoint};

/// The deadline of calls to fusebox, as the scenario runners use it: a slow
/// answer from a busy test server is not an outage.
const DEADLINE: Duration = Duration::from_millis(2000);

#[derive(Parser)]
#[command(about = "The client tool of the Rust guard: fleet worker and overhead bench")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Guards calls as told on standard input, one JSON command a line.
    Worker {
        /// fusebox's gRPC address, HOST:PORT.
        #[arg(long)]
        target: String,
        /// Sent as `authorization: Bearer TOKEN`.
        #[arg(long)]
        token: Option<String>,
    },
    /// Times a raw Acquire against a guarded no-op call.
    Bench {
        /// fusebox's gRPC address, HOST:PORT.
        #[arg(long)]
        target: String,
        /// The key (always granted).
        #[arg(long)]
        key: String,
        /// Timed rounds (after N/10 warm-up rounds).
        #[arg(long)]
        iterations: usize,
        /// Sent as `authorization: Bearer TOKEN`.
        #[arg(long)]
        token: Option<String>,
    },
}

fn main() {
    let cli = Cli::parse();
    // The guard's warnings (fusebox unavailable) on standard error, as the
    // other languages' tools log theirs; standard output is the protocol's.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let code = match cli.command {
        Command::Worker { target, token } => runtime.block_on(worker(&target, token)),
        Command::Bench {
            target,
            key,
            iterations,
            token,
        } => runtime.block_on(bench(&target, &key, iterations, token)),
    };
    std::process::exit(code);
}

/// Writes one event line and flushes it.
fn emit<T: Serialize>(event: T) {
    let line = serde_json::to_string(&event).expect("an event serializes");
    let mut out = std::io::stdout().lock();
    // A closed standard output leaves nobody to tell.
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn channel(target: &str) -> Result<Channel, String> {
    let url = if target.contains("://") {
        target.to_owned()
    } else {
        format!("http://{target}")
    };
    Ok(Endpoint::from_shared(url)
        .map_err(|e| format!("bad target {target:?}: {e}"))?
        .connect_timeout(Duration::from_secs(1))
        .tcp_nodelay(true)
        .connect_lazy())
}

fn make_guard(channel: Channel, token: Option<String>) -> Result<Guard, String> {
    let options = GuardOptions {
        deadline: DEADLINE,
        token,
        ..GuardOptions::default()
    };
    Guard::new(channel, options).map_err(|e| e.to_string())
}

/// `CamelCase` to `snake_case` (a gRPC code's name, lower case).
fn snake(name: &str) -> String {
    let mut out = String::new();
    for (i, c) in name.chars().enumerate() {
        if c.is_uppercase() && i > 0 {
            out.push('_');
        }
        out.extend(c.to_lowercase());
    }
    out
}

/// The `done` event of a guard, its fields in the order of the README.
#[derive(Serialize, Default)]
struct Done<'a> {
    event: &'static str,
    id: &'a str,
    ran: bool,
    refusal: Option<&'static str>,
    reason: Option<String>,
    retry_after_ms: Option<u64>,
    local: bool,
    error: bool,
    unavailable: bool,
}

impl Done<'_> {
    /// A refusal of `kind` (blocked or denied) for `reason`, to be asked
    /// again after `retry_after`.
    fn refused(&mut self, kind: &'static str, reason: String, retry_after: Option<Duration>) {
        self.refusal = Some(kind);
        self.reason = Some(reason);
        self.retry_after_ms = millis(retry_after);
    }
}

fn millis(d: Option<Duration>) -> Option<u64> {
    d.filter(|d| !d.is_zero()).map(|d| d.as_millis() as u64)
}

/// The `done` event of a guard that ended with `result`.
fn done(
    id: &str,
    result: Result<(), GuardError<String>>,
    ran: bool,
    unavailable: bool,
) -> Done<'_> {
    let mut done = Done {
        event: "done",
        id,
        ran,
        unavailable,
        ..Done::default()
    };
    match result {
        Ok(()) => {}
        Err(GuardError::Call(_)) => done.error = true,
        Err(GuardError::Blocked {
            reason,
            retry_after,
            local,
        }) => {
            done.refused("blocked", reason.name(), retry_after);
            done.local = local;
        }
        Err(GuardError::Refused) => done.refusal = Some("refused"),
        Err(GuardError::Denied {
            reason,
            retry_after,
        }) => done.refused("denied", reason.name(), retry_after),
        Err(GuardError::Unavailable(_)) => {
            done.refusal = Some("unavailable");
            done.unavailable = true;
        }
        // Not a refusal: fusebox rejected the request itself (a bad key, a
        // missing token); the reason is the gRPC code's name.
        Err(GuardError::Rejected(status)) => {
            done.refusal = Some("rejected");
            done.reason = Some(snake(&format!("{:?}", status.code())));
        }
    }
    done
}

/// A command line, checked: its `op` and its fields.
enum Op {
    Guard { id: String, key: String, call: Call },
    Release { id: String },
    Forget { key: String },
}

#[derive(Clone, Copy, PartialEq)]
enum Call {
    Succeed,
    Fail,
    Hang,
}

fn field(obj: &Map<String, Value>, name: &str) -> Result<String, String> {
    match obj.get(name) {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(other) => Err(format!("{name} must be a string, not {other}")),
        None => Err(format!("{name} is missing")),
    }
}

fn parse(line: &str) -> Result<Op, String> {
    let value: Value = serde_json::from_str(line).map_err(|e| format!("not JSON: {e}"))?;
    let Value::Object(obj) = value else {
        return Err("a command is a JSON object".into());
    };
    let op = field(&obj, "op")?;
    let known: &[&str] = match op.as_str() {
        "guard" => &["op", "id", "key", "call"],
        "release" => &["op", "id"],
        "forget" => &["op", "key"],
        other => return Err(format!("unknown op {other:?}")),
    };
    if let Some(k) = obj.keys().find(|k| !known.contains(&k.as_str())) {
        return Err(format!("{op}: unknown field {k:?}"));
    }
    Ok(match op.as_str() {
        "guard" => {
            let call = match field(&obj, "call")?.as_str() {
                "succeed" => Call::Succeed,
                "fail" => Call::Fail,
                "hang" => Call::Hang,
                other => return Err(format!("unknown call {other:?}")),
            };
            Op::Guard {
                id: field(&obj, "id")?,
                key: field(&obj, "key")?,
                call,
            }
        }
        "release" => Op::Release {
            id: field(&obj, "id")?,
        },
        _ => Op::Forget {
            key: field(&obj, "key")?,
        },
    })
}

/// Starts one guarded call in a task; the sender releases a hanging call.
fn start(
    guard: &Guard,
    id: String,
    key: String,
    call: Call,
) -> (oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    let (release, released) = oneshot::channel::<()>();
    let guard = guard.clone();
    let task = tokio::spawn(async move {
        let mut ran = false;
        let mut failed_open = false;
        let result = guard
            .run(&key, &CallOptions::default(), || {
                ran = true;
                failed_open = admitted() == Some(Admitted::FailedOpen);
                emit(json!({"event": "running", "id": id}));
                async move {
                    match call {
                        Call::Succeed => Ok(()),
                        Call::Fail => Err("the call failed".to_owned()),
                        Call::Hang => {
                            // Released, or the worker is ending: a value.
                            let _ = released.await;
                            Ok(())
                        }
                    }
                }
            })
            .await;
        emit(done(&id, result, ran, failed_open));
    });
    (release, task)
}

async fn worker(target: &str, token: Option<String>) -> i32 {
    let guard = match channel(target).and_then(|c| make_guard(c, token)) {
        Ok(guard) => guard,
        Err(message) => {
            emit(json!({"event": "error", "message": message}));
            return 1;
        }
    };
    emit(json!({"event": "ready", "lang": "rust"}));
    // Every id a guard command started: its release, until used.
    let mut releases: HashMap<String, Option<oneshot::Sender<()>>> = HashMap::new();
    let mut tasks = Vec::new();
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    loop {
        let line = match lines.next_line().await {
            Ok(Some(line)) => line,
            Ok(None) => break,
            Err(e) => {
                emit(json!({"event": "error", "message": format!("reading standard input: {e}")}));
                return 1;
            }
        };
        if line.trim().is_empty() {
            continue;
        }
        let op = match parse(&line) {
            Ok(op) => op,
            Err(message) => {
                emit(json!({"event": "error", "message": format!("{message}: {line}")}));
                return 1;
            }
        };
        match op {
            Op::Guard { id, key, call } => {
                if releases.contains_key(&id) {
                    emit(
                        json!({"event": "error", "message": format!("guard id {id:?} used twice")}),
                    );
                    return 1;
                }
                let (release, task) = start(&guard, id.clone(), key, call);
                releases.insert(id, Some(release));
                tasks.push(task);
            }
            Op::Release { id } => match releases.get_mut(&id) {
                // A call that already ended (or is not a hang) ignores it.
                Some(release) => {
                    if let Some(release) = release.take() {
                        let _ = release.send(());
                    }
                }
                None => {
                    emit(json!({"event": "error", "message": format!("release: no guard {id:?}")}));
                    return 1;
                }
            },
            Op::Forget { key } => {
                guard.forget(&key);
                emit(json!({"event": "forgotten", "key": key}));
            }
        }
    }
    // The end of the input: calls still hanging return a value.
    for release in releases.into_values().flatten() {
        let _ = release.send(());
    }
    for task in tasks {
        if task.await.is_err() {
            return 1;
        }
    }
    // What closing a client does in the other libraries: the outcomes
    // still queued are sent before the process ends.
    if let Err(e) = guard.flush().await {
        tracing::warn!("exiting with outcomes unsent: {e}");
    }
    0
}

/// The sample at quantile `q` (nearest rank) of sorted `samples`, in µs
/// rounded to 0.1.
fn quantile(sorted: &[Duration], q: f64) -> f64 {
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    let us = sorted[rank - 1].as_nanos() as f64 / 1000.0;
    (us * 10.0).round() / 10.0
}

#[derive(Serialize)]
struct Summary {
    median: f64,
    p99: f64,
}

fn summary(mut samples: Vec<Duration>) -> Summary {
    samples.sort();
    Summary {
        median: quantile(&samples, 0.5),
        p99: quantile(&samples, 0.99),
    }
}

/// Where every unit's outcome went.
#[derive(Serialize)]
struct Outcomes {
    /// Every raw and guard unit's outcome, warm-up included.
    expected: u64,
    /// How much the key's `successes` grew.
    reached: u64,
    /// Expected but not reached.
    lost: u64,
    /// The guard's count of outcomes dropped (queue full).
    dropped: u64,
    /// The guard's count of outcomes fusebox did not take.
    failed: u64,
}

/// The line `bench` writes, its fields in the order of the README.
#[derive(Serialize)]
struct BenchLine {
    lang: &'static str,
    iterations: usize,
    raw_us: Summary,
    guard_us: Summary,
    outcomes: Outcomes,
}

async fn bench(target: &str, key: &str, iterations: usize, token: Option<String>) -> i32 {
    match run_bench(target, key, iterations, token).await {
        Ok(line) => {
            let lost = line.outcomes.lost;
            emit(line);
            if lost > 0 {
                eprintln!(
                    "client_tool bench: {lost} outcomes did not reach fusebox (see dropped and failed)"
                );
                return 1;
            }
            0
        }
        Err(message) => {
            eprintln!("client_tool bench: {message}");
            1
        }
    }
}

type Authorization = tonic::metadata::MetadataValue<tonic::metadata::Ascii>;

/// A raw request, with the token when there is one.
fn request<T>(message: T, authorization: &Option<Authorization>) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(value) = authorization {
        request
            .metadata_mut()
            .insert("authorization", value.clone());
    }
    request
}

/// The key's count of successes (`Admin.GetKey`).
async fn successes(
    admin: &mut pb::admin_client::AdminClient<Channel>,
    key: &str,
    authorization: &Option<Authorization>,
) -> Result<u64, String> {
    let state = admin
        .get_key(request(
            pb::GetKeyRequest {
                key: key.to_owned(),
            },
            authorization,
        ))
        .await
        .map_err(|s| format!("GetKey: {s}"))?;
    Ok(state.into_inner().stats.unwrap_or_default().successes)
}

async fn run_bench(
    target: &str,
    key: &str,
    iterations: usize,
    token: Option<String>,
) -> Result<BenchLine, String> {
    if iterations == 0 {
        return Err("--iterations must be at least 1".into());
    }
    let channel = channel(target)?;
    let guard = make_guard(channel.clone(), token.clone())?;
    let mut raw = pb::fusebox_client::FuseboxClient::new(channel.clone());
    let mut admin = pb::admin_client::AdminClient::new(channel);
    let authorization: Option<Authorization> = match &token {
        Some(t) => Some(
            format!("Bearer {t}")
                .parse()
                .map_err(|_| "the token is not a valid header value".to_owned())?,
        ),
        None => None,
    };
    let before = successes(&mut admin, key, &authorization).await?;
    let options = CallOptions::default();
    let mut raw_us = Vec::with_capacity(iterations);
    let mut guard_us = Vec::with_capacity(iterations);
    let warmup = iterations / 10;
    for round in 0..warmup + iterations {
        let mut raw_took = Duration::ZERO;
        let mut guard_took = Duration::ZERO;
        for unit in 0..2 {
            if (unit == 0) == (round % 2 == 0) {
                let start = Instant::now();
                let reply = raw
                    .acquire(request(
                        pb::AcquireRequest {
                            key: key.to_owned(),
                            ..Default::default()
                        },
                        &authorization,
                    ))
                    .await
                    .map_err(|s| format!("Acquire: {s}"))?
                    .into_inner();
                raw_took = start.elapsed();
                if reply.decision != pb::Decision::Granted as i32 {
                    return Err(format!("{key} was not granted: {reply:?}"));
                }
                raw.complete(request(
                    pb::CompleteRequest {
                        ticket: reply.ticket,
                        outcome: pb::Outcome::Success as i32,
                        cost: None,
                    },
                    &authorization,
                ))
                .await
                .map_err(|s| format!("Complete: {s}"))?;
            } else {
                let start = Instant::now();
                guard
                    .run(key, &options, || async { Ok::<(), String>(()) })
                    .await
                    .map_err(|e| format!("the guard: {e}"))?;
                guard_took = start.elapsed();
            }
        }
        if round >= warmup {
            raw_us.push(raw_took);
            guard_us.push(guard_took);
        }
    }
    let stats = guard.stats();
    if stats.unavailable > 0 {
        return Err(format!(
            "fusebox was unavailable to the guard {} times: its timings would not be a guard's",
            stats.unavailable
        ));
    }
    if let Err(e) = guard.flush().await {
        eprintln!("client_tool bench: {e}");
    }
    let reached = successes(&mut admin, key, &authorization)
        .await?
        .saturating_sub(before);
    let expected = 2 * (warmup + iterations) as u64;
    let stats = guard.stats();
    Ok(BenchLine {
        lang: "rust",
        iterations,
        raw_us: summary(raw_us),
        guard_us: summary(guard_us),
        outcomes: Outcomes {
            expected,
            reached,
            lost: expected.saturating_sub(reached),
            dropped: stats.outcomes_dropped,
            failed: stats.complete_failures,
        },
    })
}

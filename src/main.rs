//! The `fusebox` command: the server, and client commands for operators.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use fusebox::engine::config::parse_duration_flag;
use fusebox::engine::{Config, Engine};
use fusebox::proto::v1 as pb;
use fusebox::server::{duration_of, millis_of};
use tokio::io::AsyncWriteExt;

/// The address `fusebox serve` listens on, and client commands call, by default.
const DEFAULT_ADDR: &str = "127.0.0.1:50051";

/// fusebox: shared circuit breakers and permits for a whole fleet.
#[derive(Parser, Debug)]
#[command(name = "fusebox", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Args, Debug)]
struct ClientOptions {
    /// The server to call.
    #[arg(long, global = true, default_value = DEFAULT_ADDR)]
    server: String,
    /// Print JSON instead of readable text.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the server.
    Serve {
        /// A TOML config file (rules, default policy, server limits).
        #[arg(long)]
        config: Option<PathBuf>,
        /// The address to listen on; port 0 picks a free port.
        #[arg(long, default_value = DEFAULT_ADDR)]
        listen: SocketAddr,
        /// Move time only when a client calls Clock.Advance (for tests).
        #[arg(long)]
        manual_clock: bool,
        /// Serve metrics, health and the dashboard over HTTP on this address
        /// (default 127.0.0.1:9090; port 0 picks a free port).
        #[arg(long)]
        http: Option<SocketAddr>,
    },
    /// Ask for permits on a key; prints the decision and the ticket.
    Acquire {
        /// The key.
        key: String,
        /// Permits to ask for (0 = status check).
        #[arg(long, default_value_t = 1)]
        permits: u32,
        /// How long to wait server-side for permits, e.g. 2s.
        #[arg(long, value_parser = parse_duration_flag)]
        wait: Option<u64>,
        /// The ticket's lease, e.g. 30s.
        #[arg(long, value_parser = parse_duration_flag)]
        lease: Option<u64>,
        #[command(flatten)]
        client: ClientOptions,
    },
    /// Report how the call a ticket covered went.
    Complete {
        /// The ticket that acquire printed.
        ticket: String,
        /// success, failure or ignored.
        #[arg(value_parser = ["success", "failure", "ignored"])]
        outcome: String,
        #[command(flatten)]
        client: ClientOptions,
    },
    /// Show a key's breaker and permits.
    Get {
        /// The key.
        key: String,
        #[command(flatten)]
        client: ClientOptions,
    },
    /// Refuse every request on a key until it is closed.
    Isolate {
        /// The key.
        key: String,
        /// Why, for the record.
        #[arg(long)]
        reason: String,
        #[command(flatten)]
        client: ClientOptions,
    },
    /// Close a key's breaker, clearing its counts.
    Close {
        /// The key.
        key: String,
        /// Why, for the record.
        #[arg(long)]
        reason: String,
        #[command(flatten)]
        client: ClientOptions,
    },
    /// List keys: phase, time left in the break, failure ratio, permits,
    /// tickets and requests.
    Keys {
        /// Only keys that start with this prefix.
        prefix: Option<String>,
        /// Only keys in this phase: closed, open, half_open or isolated
        /// (repeat the flag, or separate phases with commas).
        #[arg(long = "phase", value_enum, ignore_case = true, value_delimiter = ',')]
        phases: Vec<PhaseArg>,
        #[command(flatten)]
        client: ClientOptions,
    },
    /// Stream the keys' transitions: a snapshot, then every phase change,
    /// isolate and close, until Ctrl-C.
    Watch {
        /// Only keys that start with this prefix.
        prefix: Option<String>,
        #[command(flatten)]
        client: ClientOptions,
    },
    /// A live table of keys, refreshed in place, the most broken first;
    /// q or Ctrl-C quits.
    Top {
        /// Only keys that start with this prefix.
        prefix: Option<String>,
        /// How often to read every key, e.g. 500ms (transitions show at once).
        #[arg(long, default_value = "1s", value_parser = parse_interval)]
        interval: u64,
        #[command(flatten)]
        client: ClientOptions,
    },
    /// Move a --manual-clock server's clock forward, e.g. 5s.
    Advance {
        /// How far.
        #[arg(value_parser = parse_duration_flag)]
        by: u64,
        #[command(flatten)]
        client: ClientOptions,
    },
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve {
            config,
            listen,
            manual_clock,
            http,
        } => serve(config, listen, manual_clock, http).await,
        Command::Acquire {
            key,
            permits,
            wait,
            lease,
            client,
        } => {
            let mut c = pb::fusebox_client::FuseboxClient::new(connect(&client).await?);
            let r = c
                .acquire(pb::AcquireRequest {
                    key,
                    permits: Some(permits),
                    max_wait: wait.map(duration_of),
                    lease: lease.map(duration_of),
                })
                .await
                .map_err(call_error)?
                .into_inner();
            print_acquire(&r, client.json)
        }
        Command::Complete {
            ticket,
            outcome,
            client,
        } => {
            let outcome = match outcome.as_str() {
                "success" => pb::Outcome::Success,
                "failure" => pb::Outcome::Failure,
                _ => pb::Outcome::Ignored,
            };
            let mut c = pb::fusebox_client::FuseboxClient::new(connect(&client).await?);
            let r = c
                .complete(pb::CompleteRequest {
                    ticket,
                    outcome: outcome as i32,
                })
                .await
                .map_err(call_error)?
                .into_inner();
            if client.json {
                println!(
                    "{}",
                    serde_json::json!({"stale": r.stale, "phase": phase_name(r.phase)})
                );
            } else if r.stale {
                println!("stale: the outcome was not counted (the breaker moved on since the ticket was issued); phase {}", phase_name(r.phase));
            } else {
                println!("recorded; phase {}", phase_name(r.phase));
            }
            Ok(())
        }
        Command::Get { key, client } => {
            let s = admin(&client)
                .await?
                .get_key(pb::GetKeyRequest { key })
                .await
                .map_err(call_error)?
                .into_inner();
            print_key(&s, client.json)
        }
        Command::Isolate {
            key,
            reason,
            client,
        } => {
            let s = admin(&client)
                .await?
                .isolate(operator(pb::IsolateRequest { key, reason }))
                .await
                .map_err(call_error)?
                .into_inner();
            print_key(&s, client.json)
        }
        Command::Close {
            key,
            reason,
            client,
        } => {
            let s = admin(&client)
                .await?
                .close(operator(pb::CloseRequest { key, reason }))
                .await
                .map_err(call_error)?
                .into_inner();
            print_key(&s, client.json)
        }
        Command::Keys {
            prefix,
            phases,
            client,
        } => keys(client, prefix.unwrap_or_default(), phases).await,
        Command::Watch { prefix, client } => watch(client, prefix.unwrap_or_default()).await,
        Command::Top {
            prefix,
            interval,
            client,
        } => top(client, prefix.unwrap_or_default(), interval).await,
        Command::Advance { by, client } => {
            let mut c = pb::clock_client::ClockClient::new(connect(&client).await?);
            let r = c
                .advance(pb::AdvanceRequest {
                    by: Some(duration_of(by)),
                })
                .await
                .map_err(|status| match status.code() {
                    // A server without --manual-clock does not serve the
                    // Clock service at all (X1), so the answer has no message.
                    tonic::Code::Unimplemented => anyhow::anyhow!(
                        "UNIMPLEMENTED: the clock of the server at {} is not manual; \
                         start it with `fusebox serve --manual-clock` to move time by hand",
                        client.server
                    ),
                    _ => call_error(status),
                })?
                .into_inner();
            let now = millis_of("now", r.now).ok().flatten().unwrap_or(0);
            if client.json {
                println!("{}", serde_json::json!({ "now_ms": now }));
            } else {
                println!("clock now {now}ms");
            }
            Ok(())
        }
    }
}

async fn serve(
    config: Option<PathBuf>,
    listen: SocketAddr,
    manual_clock: bool,
    http: Option<SocketAddr>,
) -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("FUSEBOX_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let config_path = config;
    let config = match &config_path {
        Some(path) => Config::load(path).context("the server did not start")?,
        None => Config::default(),
    };
    let rules = config.rules.rules.len();
    let engine = Arc::new(if manual_clock {
        Engine::with_manual_clock(config)
    } else {
        Engine::with_system_clock(config)
    });
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}; is another server using it?"))?;
    let addr = listener.local_addr()?;
    let http_listener = match http {
        Some(addr) => Some(tokio::net::TcpListener::bind(addr).await.with_context(|| {
            format!("cannot serve HTTP on {addr}; is another server using it?")
        })?),
        None => match tokio::net::TcpListener::bind(fusebox::http::DEFAULT_HTTP_ADDR).await {
            Ok(listener) => Some(listener),
            Err(e) => {
                tracing::warn!(
                    "no HTTP (metrics, health, dashboard): cannot listen on {}: {e}; pass --http ADDR to choose another address",
                    fusebox::http::DEFAULT_HTTP_ADDR
                );
                None
            }
        },
    };
    if let Some(path) = config_path {
        // Before the address is printed: a SIGHUP or an edit from then on counts.
        tokio::spawn(fusebox::engine::reload::watch_config(engine.clone(), path));
    }
    let mut lines = format!("listening on {addr}\n");
    if let Some(listener) = &http_listener {
        lines.push_str(&format!("http on {}\n", listener.local_addr()?));
    }
    // A reader that stopped reading (`| head -1`) must not stop the server.
    let mut out = tokio::io::stdout();
    if let Err(e) = async {
        out.write_all(lines.as_bytes()).await?;
        out.flush().await
    }
    .await
    {
        tracing::warn!("could not write the addresses to standard output: {e}");
    }
    tracing::info!(
        %addr,
        rules,
        manual_clock,
        "fusebox is serving"
    );
    if let Some(listener) = http_listener {
        let stopped = engine.stopped();
        let engine = engine.clone();
        tokio::spawn(async move {
            if let Err(e) = fusebox::http::serve(listener, engine, stopped).await {
                tracing::error!("the HTTP server stopped: {e}");
            }
        });
    }
    fusebox::server::run(listener, engine, shutdown_signal()).await
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("can listen for SIGTERM");
        tokio::select! {
            _ = ctrl_c => tracing::info!("SIGINT received"),
            _ = term.recv() => tracing::info!("SIGTERM received"),
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

async fn connect(client: &ClientOptions) -> anyhow::Result<tonic::transport::Channel> {
    let url = if client.server.contains("://") {
        client.server.clone()
    } else {
        format!("http://{}", client.server)
    };
    tonic::transport::Endpoint::from_shared(url.clone())
        .with_context(|| format!("--server {}: not an address", client.server))?
        .connect_timeout(std::time::Duration::from_secs(5))
        .connect()
        .await
        .with_context(|| {
            format!(
                "cannot reach fusebox at {}: start `fusebox serve` there, or pass \
                 --server with the address a running server printed (`listening on ADDR`)",
                client.server
            )
        })
}

async fn admin(
    client: &ClientOptions,
) -> anyhow::Result<pb::admin_client::AdminClient<tonic::transport::Channel>> {
    Ok(pb::admin_client::AdminClient::new(connect(client).await?))
}

fn operator<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    let who = std::env::var("USER").unwrap_or_else(|_| "cli".to_owned());
    if let Ok(value) = format!("cli:{who}").parse() {
        request.metadata_mut().insert("x-fusebox-operator", value);
    }
    request
}

/// A failed call, named by its gRPC code as the SPEC and every gRPC client
/// write it (`NOT_FOUND`, `INVALID_ARGUMENT`), then the server's message.
fn call_error(status: tonic::Status) -> anyhow::Error {
    let code = code_name(status.code());
    match status.message() {
        "" => anyhow::anyhow!("{code}"),
        message => anyhow::anyhow!("{code}: {message}"),
    }
}

/// The canonical name of a gRPC code: `NotFound` becomes `NOT_FOUND`.
fn code_name(code: tonic::Code) -> String {
    let mut name = String::new();
    for (i, c) in format!("{code:?}").chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            name.push('_');
        }
        name.push(c.to_ascii_uppercase());
    }
    name
}

fn phase_name(value: i32) -> &'static str {
    match pb::Phase::try_from(value) {
        Ok(pb::Phase::Closed) => "CLOSED",
        Ok(pb::Phase::Open) => "OPEN",
        Ok(pb::Phase::HalfOpen) => "HALF_OPEN",
        Ok(pb::Phase::Isolated) => "ISOLATED",
        _ => "UNSPECIFIED",
    }
}

fn ms(d: Option<prost_types::Duration>) -> Option<u64> {
    millis_of("duration", d).ok().flatten()
}

fn print_acquire(r: &pb::AcquireResponse, json: bool) -> anyhow::Result<()> {
    let decision = pb::Decision::try_from(r.decision)
        .map(|d| d.as_str_name().trim_start_matches("DECISION_"))
        .unwrap_or("UNSPECIFIED");
    let reason = pb::Reason::try_from(r.reason)
        .ok()
        .filter(|r| *r != pb::Reason::Unspecified)
        .map(|r| r.as_str_name().trim_start_matches("REASON_").to_lowercase());
    if json {
        println!(
            "{}",
            serde_json::json!({
                "decision": decision,
                "ticket": (!r.ticket.is_empty()).then_some(&r.ticket),
                "reason": reason,
                "retry_after_ms": ms(r.retry_after),
                "lease_ms": ms(r.lease),
                "phase": phase_name(r.phase),
            })
        );
        return Ok(());
    }
    let mut line = decision.to_owned();
    if !r.ticket.is_empty() {
        line.push_str(&format!("  ticket {}", r.ticket));
    }
    if let Some(reason) = reason {
        line.push_str(&format!("  reason {reason}"));
    }
    if let Some(retry) = ms(r.retry_after) {
        line.push_str(&format!("  retry after {retry}ms"));
    }
    if let Some(lease) = ms(r.lease) {
        line.push_str(&format!("  lease {lease}ms"));
    }
    line.push_str(&format!("  phase {}", phase_name(r.phase)));
    println!("{line}");
    Ok(())
}

fn print_key(s: &pb::KeyState, json: bool) -> anyhow::Result<()> {
    if s.key.is_empty() {
        bail!("the server answered without a key");
    }
    let open_remaining = ms(s.open_remaining);
    if json {
        println!(
            "{}",
            serde_json::json!({
                "key": s.key,
                "phase": phase_name(s.phase),
                "consecutive_failures": s.consecutive_failures,
                "half_open_attempts": s.half_open_attempts,
                "open_remaining_ms": open_remaining,
                "free": s.free,
                "queued": s.queued,
                "live_tickets": s.live_tickets,
                "waiters": s.waiters,
            })
        );
        return Ok(());
    }
    println!("key                   {}", s.key);
    match open_remaining {
        Some(left) => println!(
            "phase                 {} ({left}ms left in the break)",
            phase_name(s.phase)
        ),
        None => println!("phase                 {}", phase_name(s.phase)),
    }
    println!("consecutive failures  {}", s.consecutive_failures);
    println!("half-open attempts    {}", s.half_open_attempts);
    println!("free permits          {}", s.free);
    println!("queued permits        {} ({} waiters)", s.queued, s.waiters);
    println!("live tickets          {}", s.live_tickets);
    Ok(())
}

// ---------------------------------------------------------------------------
// Operations: `keys`, `watch` and `top`.
// ---------------------------------------------------------------------------

/// A phase, as `--phase` takes it.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum PhaseArg {
    Closed,
    Open,
    #[value(name = "half_open", alias = "half-open")]
    HalfOpen,
    Isolated,
}

impl PhaseArg {
    fn wire(self) -> pb::Phase {
        match self {
            PhaseArg::Closed => pb::Phase::Closed,
            PhaseArg::Open => pb::Phase::Open,
            PhaseArg::HalfOpen => pb::Phase::HalfOpen,
            PhaseArg::Isolated => pb::Phase::Isolated,
        }
    }
}

/// `--interval`: a duration with a unit, more than zero.
fn parse_interval(text: &str) -> Result<u64, String> {
    match parse_duration_flag(text)? {
        0 => Err("must be more than 0, e.g. 500ms or 2s".to_owned()),
        ms => Ok(ms),
    }
}

/// Reads every matching key, page by page (AIP-132), in key order.
async fn list_all(
    admin: &mut pb::admin_client::AdminClient<tonic::transport::Channel>,
    prefix: &str,
    phases: &[i32],
) -> anyhow::Result<Vec<pb::KeyState>> {
    let mut keys = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = admin
            .list_keys(pb::ListKeysRequest {
                prefix: prefix.to_owned(),
                phases: phases.to_vec(),
                // The server's default page (100 keys).
                page_size: 0,
                page_token: page_token.clone(),
            })
            .await
            .map_err(call_error)?
            .into_inner();
        keys.extend(page.keys);
        if page.next_page_token.is_empty() {
            return Ok(keys);
        }
        if page.next_page_token == page_token {
            bail!("the server answered the same page token twice; the listing is incomplete");
        }
        page_token = page.next_page_token;
    }
}

async fn keys(client: ClientOptions, prefix: String, phases: Vec<PhaseArg>) -> anyhow::Result<()> {
    let mut admin = admin(&client).await?;
    let phases: Vec<i32> = phases.iter().map(|p| p.wire() as i32).collect();
    let keys = list_all(&mut admin, &prefix, &phases).await?;
    if client.json {
        let all: Vec<serde_json::Value> = keys.iter().map(key_json).collect();
        return emit(&serde_json::Value::Array(all).to_string());
    }
    if keys.is_empty() {
        let mut line = "no keys".to_owned();
        if !prefix.is_empty() {
            line.push_str(&format!(" start with {prefix:?}"));
        }
        if !phases.is_empty() {
            let names: Vec<&str> = phases.iter().map(|p| phase_name(*p)).collect();
            line.push_str(&format!(
                "{} in phase {}",
                if prefix.is_empty() { "" } else { " and are" },
                names.join(" or ")
            ));
        }
        return emit(&line);
    }
    emit(&key_table(&keys, None).0.join("\n"))
}

/// Prints `text` and a newline on standard output. A reader that went away
/// (`fusebox watch | head`) ends the command quietly.
fn emit(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{text}").and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        Err(e) => Err(e).context("cannot write to standard output"),
    }
}

/// Every request a key answered: admitted, blocked, refused, denied or
/// withdrawn while waiting.
fn requests(s: &pb::KeyState) -> u64 {
    s.stats.as_ref().map_or(0, |st| {
        st.granted + st.probes + st.blocked + st.refused + st.denied + st.withdrawn
    })
}

/// A key as `keys --json` and `watch --json` print it.
fn key_json(s: &pb::KeyState) -> serde_json::Value {
    let st = s.stats.clone().unwrap_or_default();
    let by_reason: serde_json::Map<String, serde_json::Value> = st
        .by_reason
        .iter()
        .map(|(reason, n)| (reason.clone(), (*n).into()))
        .collect();
    serde_json::json!({
        "key": s.key,
        "phase": phase_name(s.phase),
        "open_remaining_ms": ms(s.open_remaining),
        "failure_ratio": s.failure_ratio,
        "consecutive_failures": s.consecutive_failures,
        "half_open_attempts": s.half_open_attempts,
        "free": s.free,
        "limit": s.limit,
        "queued": s.queued,
        "waiters": s.waiters,
        "live_tickets": s.live_tickets,
        "requests": requests(s),
        "phase_changed_at": s.phase_changed_at.map(time_ms),
        "stats": {
            "granted": st.granted,
            "probes": st.probes,
            "blocked": st.blocked,
            "refused": st.refused,
            "denied": st.denied,
            "by_reason": by_reason,
            "queued": st.queued,
            "evicted": st.evicted,
            "timed_out": st.timed_out,
            "withdrawn": st.withdrawn,
            "successes": st.successes,
            "failures": st.failures,
            "ignored": st.ignored,
            "stale": st.stale,
            "expired": st.expired,
        },
    })
}

/// A wall-clock time in RFC 3339 to the second: `2026-11-29T23:59:01Z`.
fn time_s(t: prost_types::Timestamp) -> String {
    prost_types::Timestamp {
        seconds: t.seconds,
        nanos: 0,
    }
    .to_string()
}

/// A wall-clock time in RFC 3339 to the millisecond.
fn time_ms(t: prost_types::Timestamp) -> String {
    prost_types::Timestamp {
        seconds: t.seconds,
        nanos: t.nanos - t.nanos.rem_euclid(1_000_000),
    }
    .to_string()
}

/// This machine's time, to the second.
fn now_s() -> String {
    time_s(prost_types::Timestamp::from(std::time::SystemTime::now()))
}

/// A duration for people: `750ms`, `4.9s`, `2m05s`, `1h30m`.
fn human_ms(ms: u64) -> String {
    match ms {
        0..=999 => format!("{ms}ms"),
        1_000..=59_999 => format!("{}.{}s", ms / 1000, ms % 1000 / 100),
        60_000..=3_599_999 => format!("{}m{:02}s", ms / 60_000, ms % 60_000 / 1000),
        _ => format!("{}h{:02}m", ms / 3_600_000, ms % 3_600_000 / 60_000),
    }
}

/// An interval as given: `1s`, `500ms`, `2m`; otherwise as [`human_ms`].
fn interval_words(ms: u64) -> String {
    match ms {
        ms if ms % 3_600_000 == 0 => format!("{}h", ms / 3_600_000),
        ms if ms % 60_000 == 0 => format!("{}m", ms / 60_000),
        ms if ms % 1000 == 0 => format!("{}s", ms / 1000),
        ms if ms < 1000 => format!("{ms}ms"),
        ms => human_ms(ms),
    }
}

const KEY_HEADERS: [&str; 8] = [
    "KEY",
    "PHASE",
    "BREAK LEFT",
    "FAIL RATIO",
    "FREE/LIMIT",
    "QUEUED",
    "TICKETS",
    "REQUESTS",
];

/// The table cells of one key, in [`KEY_HEADERS`] order.
fn key_cells(s: &pb::KeyState) -> Vec<String> {
    vec![
        s.key.clone(),
        phase_name(s.phase).to_owned(),
        ms(s.open_remaining).map_or_else(|| "-".to_owned(), human_ms),
        s.failure_ratio
            .map_or_else(|| "-".to_owned(), |r| format!("{:.1}%", r * 100.0)),
        if s.limit == 0 {
            "-".to_owned()
        } else {
            format!("{}/{}", s.free, s.limit)
        },
        s.queued.to_string(),
        s.live_tickets.to_string(),
        requests(s).to_string(),
    ]
}

/// The key table: a header and one line per key. With `width`, keys are
/// shortened so that lines fit. Also returns the columns' widths.
fn key_table(keys: &[pb::KeyState], width: Option<usize>) -> (Vec<String>, Vec<usize>) {
    let mut rows: Vec<Vec<String>> = keys.iter().map(key_cells).collect();
    let (lines, widths) = render_table(&KEY_HEADERS, &rows);
    let total: usize = widths.iter().sum::<usize>() + 2 * (widths.len() - 1);
    match width {
        Some(width) if total > width => {
            let room = (width + widths[0]).saturating_sub(total).max(12);
            for row in &mut rows {
                row[0] = shorten(&row[0], room);
            }
            render_table(&KEY_HEADERS, &rows)
        }
        _ => (lines, widths),
    }
}

/// `text` cut to `max` characters, ending in `…` when cut.
fn shorten(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let mut short: String = text.chars().take(max.saturating_sub(1)).collect();
    short.push('…');
    short
}

/// Lines of a table: the first two columns aligned left, the rest (numbers)
/// right, two spaces apart.
fn render_table(headers: &[&str], rows: &[Vec<String>]) -> (Vec<String>, Vec<usize>) {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut out = String::new();
        for (i, (cell, w)) in cells.zip(&widths).enumerate() {
            if i > 0 {
                out.push_str("  ");
            }
            if i < 2 {
                out.push_str(&format!("{cell:<w$}"));
            } else {
                out.push_str(&format!("{cell:>w$}"));
            }
        }
        out.trim_end().to_owned()
    };
    let mut lines = vec![line(&mut headers.iter().copied())];
    for row in rows {
        lines.push(line(&mut row.iter().map(String::as_str)));
    }
    (lines, widths)
}

/// A transition in words: `2026-11-29T23:59:01Z payments/charge CLOSED ->
/// OPEN  failures reached the trip condition`.
fn transition_line(t: &pb::Transition) -> String {
    let at = t.at.map_or_else(now_s, time_s);
    format!(
        "{at} {} {} -> {}  {}",
        t.key,
        phase_name(t.from),
        phase_name(t.to),
        transition_words(t)
    )
}

/// Why a transition happened; for an operator's isolate or close, who
/// asked and why.
fn transition_words(t: &pb::Transition) -> String {
    let verb = match pb::TransitionKind::try_from(t.kind) {
        Ok(pb::TransitionKind::Isolate) => "isolated",
        Ok(pb::TransitionKind::Close) => "closed",
        _ => return t.cause.clone(),
    };
    let mut words = if t.who.is_empty() {
        format!("{verb} by an operator")
    } else {
        format!("{verb} by {}", t.who)
    };
    if !t.reason.is_empty() {
        words.push_str(": ");
        words.push_str(&t.reason);
    }
    words
}

fn transition_json(t: &pb::Transition) -> serde_json::Value {
    let kind = pb::TransitionKind::try_from(t.kind)
        .map(|k| {
            k.as_str_name()
                .trim_start_matches("TRANSITION_KIND_")
                .to_lowercase()
        })
        .unwrap_or_else(|_| "unspecified".to_owned());
    let text = |s: &str| (!s.is_empty()).then(|| s.to_owned());
    serde_json::json!({
        "event": "transition",
        "sequence": t.sequence,
        "at": t.at.map(time_ms),
        "key": t.key,
        "kind": kind,
        "from": phase_name(t.from),
        "to": phase_name(t.to),
        "cause": t.cause,
        "who": text(&t.who),
        "reason": text(&t.reason),
        "state": t.state.as_ref().map(key_json),
    })
}

/// Resolves when the user interrupts (Ctrl-C) or the process is told to
/// stop (SIGTERM, SIGHUP). The handlers are installed at once, so no
/// signal sent after this returns kills the process outright.
fn stop_signal() -> anyhow::Result<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>>
{
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut int = signal(SignalKind::interrupt())?;
        let mut term = signal(SignalKind::terminate())?;
        let mut hup = signal(SignalKind::hangup())?;
        Ok(Box::pin(async move {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
                _ = hup.recv() => {}
            }
        }))
    }
    #[cfg(not(unix))]
    {
        Ok(Box::pin(async {
            let _ = tokio::signal::ctrl_c().await;
        }))
    }
}

async fn watch(client: ClientOptions, prefix: String) -> anyhow::Result<()> {
    let mut stop = stop_signal()?;
    let mut admin = admin(&client).await?;
    let mut stream = admin
        .watch(pb::WatchRequest {
            prefix: prefix.clone(),
        })
        .await
        .map_err(call_error)?
        .into_inner();
    // The parts of the snapshot being received.
    let mut snapshot: Vec<pb::KeyState> = Vec::new();
    loop {
        let message = tokio::select! {
            message = stream.message() => message,
            () = &mut stop => return Ok(()),
        };
        let event = match message {
            Ok(Some(pb::WatchEvent { event: Some(event) })) => event,
            Ok(Some(pb::WatchEvent { event: None })) => continue,
            Ok(None) => {
                eprintln!("the server ended the watch stream");
                return Ok(());
            }
            Err(status) => return Err(call_error(status).context("the watch stream broke")),
        };
        match event {
            pb::watch_event::Event::Snapshot(part) if client.json => {
                let keys: Vec<serde_json::Value> = part.keys.iter().map(key_json).collect();
                emit(
                    &serde_json::json!({
                        "event": "snapshot",
                        "complete": part.complete,
                        "keys": keys,
                    })
                    .to_string(),
                )?;
            }
            pb::watch_event::Event::Snapshot(part) => {
                snapshot.extend(part.keys);
                if part.complete {
                    let keys = std::mem::take(&mut snapshot);
                    if !keys.is_empty() {
                        emit(&key_table(&keys, None).0.join("\n"))?;
                    }
                    let which = if prefix.is_empty() {
                        String::new()
                    } else {
                        format!(" starting with {prefix:?}")
                    };
                    let count = match keys.len() {
                        1 => "1 key".to_owned(),
                        n => format!("{n} keys"),
                    };
                    emit(&format!(
                        "{} snapshot: {count}{which}; watching for transitions",
                        now_s()
                    ))?;
                }
            }
            pb::watch_event::Event::Transition(t) if client.json => {
                emit(&transition_json(&t).to_string())?;
            }
            pb::watch_event::Event::Transition(t) => emit(&transition_line(&t))?,
            pb::watch_event::Event::Lagged(lag) if client.json => {
                emit(&serde_json::json!({ "event": "lagged", "missed": lag.missed }).to_string())?;
            }
            pb::watch_event::Event::Lagged(lag) => {
                // Parts of a snapshot cut short are superseded by the next.
                snapshot.clear();
                emit(&format!(
                    "{} lagged: this watcher fell behind and missed {} events; a fresh snapshot follows",
                    now_s(),
                    lag.missed
                ))?;
            }
        }
    }
}

// ---------------------------------------------------------------------------
// `top`: a live table in the terminal.
// ---------------------------------------------------------------------------

/// How many recent transitions `top` keeps below the table.
const TOP_RECENT: usize = 5;

/// The terminal while `top` runs: the alternate screen with the cursor
/// hidden and keys read one at a time without echo. Dropping it puts the
/// terminal back as it was, on every way out (quit, signal, error, panic).
struct Screen {
    saved_mode: Option<String>,
}

impl Screen {
    fn enter() -> Screen {
        let saved_mode = stty(&["-g"]).ok().filter(|mode| !mode.is_empty());
        if saved_mode.is_some() {
            // Signals (Ctrl-C) still work; only line editing and echo go.
            let _ = stty(&["-icanon", "-echo", "min", "1", "time", "0"]);
        }
        let _ = write_out("\x1b[?1049h\x1b[?25l\x1b[H\x1b[2J");
        Screen { saved_mode }
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        let _ = write_out("\x1b[?25h\x1b[?1049l");
        if let Some(mode) = &self.saved_mode {
            let _ = stty(&[mode]);
        }
    }
}

/// Runs `stty ARGS` on the controlling terminal and returns what it printed.
fn stty(args: &[&str]) -> std::io::Result<String> {
    let tty = std::fs::File::open("/dev/tty")?;
    let output = std::process::Command::new("stty")
        .args(args)
        .stdin(tty)
        .stderr(std::process::Stdio::null())
        .output()?;
    if !output.status.success() {
        return Err(std::io::Error::other("stty failed"));
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

/// The terminal's size: rows and columns.
fn terminal_size() -> (usize, usize) {
    let from_stty = stty(&["size"]).ok().and_then(|size| {
        let (rows, cols) = size.split_once(' ')?;
        Some((rows.parse().ok()?, cols.parse().ok()?))
    });
    let from_env = |name: &str, default: usize| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    match from_stty {
        Some((rows, cols)) if rows > 0 && cols > 0 => (rows, cols),
        _ => (from_env("LINES", 24), from_env("COLUMNS", 80)),
    }
}

fn write_out(text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()
}

/// Keys pressed on the terminal, read on a thread of their own (a read
/// blocked on the terminal must never hold up the program's exit).
fn key_presses() -> tokio::sync::mpsc::UnboundedReceiver<u8> {
    use std::io::Read;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    if let Ok(mut tty) = std::fs::File::open("/dev/tty") {
        std::thread::spawn(move || {
            let mut buf = [0u8; 64];
            while let Ok(n @ 1..) = tty.read(&mut buf) {
                for &b in &buf[..n] {
                    if tx.send(b).is_err() {
                        return;
                    }
                }
            }
        });
    }
    rx
}

/// What `top` learns from the server, in the order it arrives.
enum TopNews {
    /// A full read of the keys, or why it failed.
    Keys(Result<Vec<pb::KeyState>, String>),
    /// A transition from the Watch stream.
    Transition(Box<pb::Transition>),
    /// The Watch stream is (again) live or has broken.
    Watching(bool),
}

/// Severity for sorting: the most broken first.
fn severity(phase: i32) -> u8 {
    match pb::Phase::try_from(phase) {
        Ok(pb::Phase::Isolated) => 0,
        Ok(pb::Phase::Open) => 1,
        Ok(pb::Phase::HalfOpen) => 2,
        _ => 3,
    }
}

fn phase_colour(phase: &str) -> &'static str {
    match phase {
        "ISOLATED" => "\x1b[1;35m",
        "OPEN" => "\x1b[1;31m",
        "HALF_OPEN" => "\x1b[1;33m",
        _ => "\x1b[32m",
    }
}

/// What one frame of `top` shows.
struct TopView<'a> {
    server: &'a str,
    prefix: &'a str,
    interval_ms: u64,
    keys: &'a std::collections::BTreeMap<String, pb::KeyState>,
    recent: &'a std::collections::VecDeque<String>,
    error: Option<&'a str>,
    watching: bool,
    colour: bool,
    now: String,
}

/// The lines of one frame of `top`, fitted to `rows` x `cols`.
fn top_frame(view: &TopView<'_>, rows: usize, cols: usize) -> Vec<String> {
    let mut keys: Vec<&pb::KeyState> = view.keys.values().collect();
    keys.sort_by(|a, b| {
        severity(a.phase)
            .cmp(&severity(b.phase))
            .then(requests(b).cmp(&requests(a)))
            .then(a.key.cmp(&b.key))
    });
    let count = |p: pb::Phase| keys.iter().filter(|k| k.phase == p as i32).count();
    let mut title = format!("fusebox top  {}", view.server);
    if !view.prefix.is_empty() {
        title.push_str(&format!("  keys starting with {:?}", view.prefix));
    }
    title.push_str(&format!("  {}", view.now));
    let status = match view.error {
        Some(error) => format!(
            "error: {error} (trying again every {})",
            interval_words(view.interval_ms)
        ),
        None => format!(
            "{} keys: {} isolated, {} open, {} half-open, {} closed   refresh every {}{}   q quits",
            keys.len(),
            count(pb::Phase::Isolated),
            count(pb::Phase::Open),
            count(pb::Phase::HalfOpen),
            count(pb::Phase::Closed),
            interval_words(view.interval_ms),
            if view.watching {
                " and at each transition"
            } else {
                ""
            },
        ),
    };
    let mut plain = vec![title, status, String::new()];
    // (line index, offset and width of the phase cell) to colour.
    let mut coloured: Vec<(usize, usize, String)> = Vec::new();

    let recent_room = if view.recent.is_empty() || rows < 16 {
        0
    } else {
        view.recent.len().min(TOP_RECENT) + 2
    };
    let room = rows.saturating_sub(plain.len() + 1 + recent_room).max(1);
    let owned: Vec<pb::KeyState> = keys.iter().map(|k| (*k).clone()).collect();
    let shown = if owned.len() > room {
        room.saturating_sub(1)
    } else {
        owned.len()
    };
    let (table, widths) = key_table(&owned[..shown], Some(cols));
    let mut table = table.into_iter();
    if let Some(header) = table.next() {
        plain.push(header);
    }
    for (state, line) in owned.iter().zip(table) {
        coloured.push((
            plain.len(),
            widths[0] + 2,
            phase_name(state.phase).to_owned(),
        ));
        plain.push(line);
    }
    if owned.is_empty() {
        plain.push("no keys yet".to_owned());
    } else if shown < owned.len() {
        plain.push(format!("… and {} more keys", owned.len() - shown));
    }
    if recent_room > 0 {
        plain.push(String::new());
        plain.push("recent transitions".to_owned());
        plain.extend(view.recent.iter().take(TOP_RECENT).cloned());
    }
    plain.truncate(rows);
    let mut lines: Vec<String> = plain.iter().map(|l| shorten(l, cols)).collect();
    if view.colour {
        lines[0] = format!("\x1b[1m{}\x1b[0m", lines[0]);
        if view.error.is_some() {
            lines[1] = format!("\x1b[1;31m{}\x1b[0m", lines[1]);
        }
        if let Some(header) = lines.get_mut(3) {
            *header = format!("\x1b[7m{header:<cols$}\x1b[0m");
        }
        for (index, offset, phase) in coloured {
            let Some(line) = lines.get_mut(index) else {
                continue;
            };
            let chars: Vec<char> = line.chars().collect();
            let end = offset + phase.chars().count();
            if chars.len() < end {
                continue;
            }
            let before: String = chars[..offset].iter().collect();
            let after: String = chars[end..].iter().collect();
            *line = format!("{before}{}{phase}\x1b[0m{after}", phase_colour(&phase));
        }
    }
    lines
}

/// Reads every key now and then (or when poked), for `top`.
fn top_poller(
    mut admin: pb::admin_client::AdminClient<tonic::transport::Channel>,
    prefix: String,
    interval: std::time::Duration,
    news: tokio::sync::mpsc::Sender<TopNews>,
    poke: Arc<tokio::sync::Notify>,
) {
    tokio::spawn(async move {
        let patience = interval.max(std::time::Duration::from_secs(5));
        loop {
            let read =
                match tokio::time::timeout(patience, list_all(&mut admin, &prefix, &[])).await {
                    Ok(Ok(keys)) => Ok(keys),
                    Ok(Err(e)) => Err(format!("{e:#}")),
                    Err(_) => Err(format!(
                        "the server did not list its keys within {}",
                        human_ms(patience.as_millis() as u64)
                    )),
                };
            if news.send(TopNews::Keys(read)).await.is_err() {
                return;
            }
            tokio::select! {
                () = tokio::time::sleep(interval) => {}
                () = poke.notified() => {}
            }
        }
    });
}

/// Follows the Watch stream for `top`, again after every break.
fn top_watcher(
    mut admin: pb::admin_client::AdminClient<tonic::transport::Channel>,
    prefix: String,
    interval: std::time::Duration,
    news: tokio::sync::mpsc::Sender<TopNews>,
    poke: Arc<tokio::sync::Notify>,
) {
    tokio::spawn(async move {
        loop {
            if let Ok(response) = admin
                .watch(pb::WatchRequest {
                    prefix: prefix.clone(),
                })
                .await
            {
                let mut stream = response.into_inner();
                if news.send(TopNews::Watching(true)).await.is_err() {
                    return;
                }
                while let Ok(Some(event)) = stream.message().await {
                    let news_item = match event.event {
                        Some(pb::watch_event::Event::Transition(t)) => {
                            TopNews::Transition(Box::new(t))
                        }
                        // Events were missed: read everything again.
                        Some(pb::watch_event::Event::Lagged(_)) => {
                            poke.notify_one();
                            continue;
                        }
                        _ => continue,
                    };
                    if news.send(news_item).await.is_err() {
                        return;
                    }
                }
                if news.send(TopNews::Watching(false)).await.is_err() {
                    return;
                }
            }
            tokio::time::sleep(interval).await;
        }
    });
}

async fn top(client: ClientOptions, prefix: String, interval_ms: u64) -> anyhow::Result<()> {
    use std::io::IsTerminal;
    if client.json {
        bail!("top draws a live table and prints no JSON; use `fusebox keys --json` or `fusebox watch --json`");
    }
    if !std::io::stdout().is_terminal() {
        bail!("top draws a live table and needs a terminal; use `fusebox keys` or `fusebox watch` to print to a pipe or a file");
    }
    let mut stop = stop_signal()?;
    let channel = connect(&client).await?;
    let interval = std::time::Duration::from_millis(interval_ms);
    let (tx, mut news) = tokio::sync::mpsc::channel(256);
    let poke = Arc::new(tokio::sync::Notify::new());
    top_poller(
        pb::admin_client::AdminClient::new(channel.clone()),
        prefix.clone(),
        interval,
        tx.clone(),
        poke.clone(),
    );
    top_watcher(
        pb::admin_client::AdminClient::new(channel),
        prefix.clone(),
        interval,
        tx,
        poke.clone(),
    );
    #[cfg(unix)]
    let mut resized =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change())?;
    let mut presses = key_presses();
    let mut keyboard = true;
    let colour = std::env::var_os("NO_COLOR").is_none();

    let screen = Screen::enter();
    let mut size = terminal_size();
    let mut keys = std::collections::BTreeMap::new();
    let mut recent = std::collections::VecDeque::new();
    let mut error: Option<String> = None;
    let mut watching = false;
    // Draw at most every 50 ms, however fast transitions come.
    let mut dirty = true;
    let mut clock = tokio::time::interval(std::time::Duration::from_millis(50));
    clock.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_second = String::new();
    let mut last_draw: Option<tokio::time::Instant> = None;
    loop {
        #[cfg(unix)]
        let resize = resized.recv();
        #[cfg(not(unix))]
        let resize = std::future::pending::<Option<()>>();
        tokio::select! {
            () = &mut stop => break,
            key = presses.recv(), if keyboard => match key {
                Some(b'q' | b'Q') => break,
                Some(b'r' | b'R') => poke.notify_one(),
                Some(_) => {}
                None => keyboard = false,
            },
            Some(item) = news.recv() => {
                match item {
                    TopNews::Keys(Ok(read)) => {
                        keys = read.into_iter().map(|k| (k.key.clone(), k)).collect();
                        error = None;
                    }
                    TopNews::Keys(Err(e)) => error = Some(e),
                    TopNews::Transition(t) => {
                        recent.push_front(transition_line(&t));
                        recent.truncate(TOP_RECENT);
                        if let Some(state) = t.state {
                            keys.insert(state.key.clone(), state);
                        }
                    }
                    TopNews::Watching(live) => watching = live,
                }
                dirty = true;
            }
            _ = resize => {
                size = terminal_size();
                let _ = write_out("\x1b[2J");
                dirty = true;
            }
            _ = clock.tick() => {
                // The clock in the header moves every second.
                if now_s() != last_second {
                    dirty = true;
                }
            }
        }
        let due = last_draw.is_none_or(|at| at.elapsed() >= std::time::Duration::from_millis(50));
        if dirty && due {
            last_draw = Some(tokio::time::Instant::now());
            last_second = now_s();
            let view = TopView {
                server: &client.server,
                prefix: &prefix,
                interval_ms,
                keys: &keys,
                recent: &recent,
                error: error.as_deref(),
                watching,
                colour,
                now: last_second.clone(),
            };
            let frame = top_frame(&view, size.0, size.1).join("\x1b[K\r\n");
            write_out(&format!("\x1b[H{frame}\x1b[K\x1b[J"))
                .context("cannot draw on the terminal")?;
            dirty = false;
        }
    }
    drop(screen);
    Ok(())
}

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
            let mut c = pb::admin_client::AdminClient::new(connect(&client).await?);
            let s = c
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
            let mut c = pb::admin_client::AdminClient::new(connect(&client).await?);
            let s = c
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
            let mut c = pb::admin_client::AdminClient::new(connect(&client).await?);
            let s = c
                .close(operator(pb::CloseRequest { key, reason }))
                .await
                .map_err(call_error)?
                .into_inner();
            print_key(&s, client.json)
        }
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
    let mut out = tokio::io::stdout();
    out.write_all(format!("listening on {addr}\n").as_bytes())
        .await?;
    if let Some(listener) = &http_listener {
        out.write_all(format!("http on {}\n", listener.local_addr()?).as_bytes())
            .await?;
    }
    out.flush().await?;
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
    if let Some(path) = config_path {
        tokio::spawn(fusebox::engine::reload::watch_config(engine.clone(), path));
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

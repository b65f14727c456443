//! The `fusebox` command: parses the command line, then starts the server
//! or hands a client command to the `fusebox-cli` library.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use fusebox::config::parse_duration_flag;
use fusebox::proto::v1 as pb;
use fusebox_cli::calls::{self, Action};
use fusebox_cli::connect::DEFAULT_ADDR;
use fusebox_cli::{ClientOptions, PhaseArg};
use tokio::io::AsyncWriteExt;

/// Small allocations take their size class and no more (BENCHMARKS.md,
/// "Memory": bytes per key).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// fusebox: shared circuit breakers and permits for a whole fleet.
#[derive(Parser, Debug)]
#[command(name = "fusebox", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the server.
    Serve(ServeFlags),
    /// Make a new bearer token; prints it, and the [[auth.token]] entry
    /// (with its SHA-256 only) that the server's config takes.
    Token {
        /// Who will hold it (shown in logs and in isolate records).
        #[arg(long)]
        name: String,
        /// metrics, caller, operator or admin.
        #[arg(long, default_value = "caller", value_parser = ["metrics", "caller", "operator", "admin"])]
        role: String,
        /// A key pattern it may touch, e.g. "checkout/*" (repeat the flag);
        /// none means every key.
        #[arg(long = "prefix")]
        prefixes: Vec<String>,
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
        /// Who is calling (at most 128 bytes), for a breaker's quorum;
        /// without it the server takes the connection's address. Ignored
        /// with a token: the token's name is the caller.
        #[arg(long)]
        caller: Option<String>,
        /// Which attempt this is: 1 (the default) for a first attempt, 2
        /// or more for a retry, which a retry budget counts.
        #[arg(long)]
        attempt: Option<u32>,
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
        /// The permits the call really used, for a token-bucket or window
        /// limiter (0 to 4294967295); the difference from what the ticket
        /// took is settled at once. Without it: what the ticket took.
        #[arg(long)]
        cost: Option<u32>,
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
    Isolate(ActionFlags),
    /// Close a key's breaker, clearing its counts.
    Close(ActionFlags),
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
    /// The load tool, now the `fusebox-bench` binary: says so, and how
    /// to run it with the same arguments.
    #[command(hide = true, disable_help_flag = true)]
    Bench {
        /// Whatever followed `bench`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// List the rules in force, in order, then the default: each one's
    /// breaker (with its half-open probes and successes), limiter and lease.
    Policies {
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

/// `serve`'s flags.
#[derive(clap::Args, Debug)]
struct ServeFlags {
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
    /// Listen on a non-loopback address without [auth] in the config:
    /// anyone who reaches the ports may then isolate keys and rewrite
    /// policies.
    #[arg(long)]
    insecure_no_auth: bool,
    #[command(flatten)]
    tls: TlsFlags,
    /// Keep breakers, isolations and runtime policies in this directory
    /// across restarts (made if missing; wins over `[server] data_dir`).
    /// Without one, state is kept in memory only.
    #[arg(long, value_name = "DIR", conflicts_with = "store")]
    data_dir: Option<PathBuf>,
    /// Keep every key's state in Redis instead, through the fusebox
    /// module (see README, "Running a fleet of fusebox servers"):
    /// redis://HOST:PORT, or redis-cluster://HOST:PORT,HOST:PORT,...
    /// for a Redis Cluster; rediss:// and rediss-cluster:// for TLS.
    /// Any number of servers may share it.
    // Read as text and parsed in `serve`: a bad address must not be
    // echoed whole, as clap would, password and all.
    #[arg(long, value_name = "URL")]
    store: Option<String>,
    #[command(flatten)]
    store_flags: StoreFlags,
}

/// `serve`'s `--tls-*` flags.
#[derive(clap::Args, Debug)]
struct TlsFlags {
    /// Serve over TLS with this certificate chain (PEM); wins over [tls] cert.
    #[arg(long)]
    tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert; wins over [tls] key.
    #[arg(long)]
    tls_key: Option<PathBuf>,
    /// Mutual TLS: require client certificates signed by the CAs in this
    /// PEM file; wins over [tls] client_ca.
    #[arg(long)]
    tls_client_ca: Option<PathBuf>,
}

/// `serve`'s `--store-*` flags, which go with `--store`.
#[derive(clap::Args, Debug)]
#[group(requires = "store")]
struct StoreFlags {
    /// With a TLS store (rediss://): trust the CA certificates in this
    /// PEM file for the store's certificates, instead of the system's.
    #[arg(long, value_name = "FILE", env = "FUSEBOX_STORE_TLS_CA")]
    store_tls_ca: Option<PathBuf>,
    /// With a TLS store, for mutual TLS: this server's certificate
    /// chain (PEM), shown to Redis (tls-auth-clients).
    #[arg(long, value_name = "FILE", env = "FUSEBOX_STORE_TLS_CERT")]
    store_tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --store-tls-cert.
    #[arg(long, value_name = "FILE", env = "FUSEBOX_STORE_TLS_KEY")]
    store_tls_key: Option<PathBuf>,
    /// With --store: the Redis ACL user to log in as (README, "A store
    /// on a network", has the least-privilege ACL line for it).
    #[arg(long, value_name = "NAME", env = "FUSEBOX_STORE_USER")]
    store_user: Option<String>,
    /// With --store: read the Redis password from this file (the
    /// password alone; a line ending after it is ignored). Or set
    /// FUSEBOX_STORE_PASSWORD. Never on the command line, where process
    /// listings show it.
    #[arg(long, value_name = "FILE", env = "FUSEBOX_STORE_PASSWORD_FILE")]
    store_password_file: Option<PathBuf>,
    /// With --store: the fleet's secret, the file the module loads with
    /// `secret-file` (at least 16 bytes): every answer, transition and
    /// policy change heard from Redis is verified with it, and the
    /// policies this server writes are signed with it.
    #[arg(long, value_name = "FILE", env = "FUSEBOX_STORE_SECRET_FILE")]
    store_secret_file: Option<PathBuf>,
    /// With --store: how many replicas must have a probe before it is
    /// handed out, so that a failover cannot let a second probe out
    /// (auto: one with Redis Cluster when the key's primary has a
    /// replica that is not failing, none with one Redis server; 0: at
    /// once).
    #[arg(long, value_name = "auto|N", default_value = "auto", value_parser = fusebox::engine::redis::ProbeReplicas::parse)]
    store_probe_replicas: fusebox::engine::redis::ProbeReplicas,
    /// With --store: how long a probe waits for those replicas before
    /// it is given back and the caller told to ask again (10ms to 60s).
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = parse_probe_wait)]
    store_probe_wait: u64,
}

/// The key and the reason of `isolate` and `close`.
#[derive(clap::Args, Debug)]
struct ActionFlags {
    /// The key.
    key: String,
    /// Why, for the record.
    #[arg(long)]
    reason: String,
    #[command(flatten)]
    client: ClientOptions,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    if let Command::Bench { args } = &cli.command {
        // A usage error, as clap's own are.
        eprintln!("{}", bench_moved(args));
        return std::process::ExitCode::from(2);
    }
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
        Command::Serve(flags) => serve(flags).await,
        Command::Token {
            name,
            role,
            prefixes,
        } => {
            let token = fusebox::auth::new_token()
                .map_err(|e| anyhow::anyhow!("no random source for the token: {e}"))?;
            let mut entry = format!(
                "[[auth.token]]\nname = {}\nrole = {}\n",
                toml_string(&name),
                toml_string(&role)
            );
            if !prefixes.is_empty() {
                let list: Vec<String> = prefixes.iter().map(|p| toml_string(p)).collect();
                entry.push_str(&format!("prefixes = [{}]\n", list.join(", ")));
            }
            entry.push_str(&format!(
                "sha256 = \"{}\"\n",
                fusebox::auth::hash_hex(&token)
            ));
            println!("token: {token}");
            println!("# Give the token to its holder (FUSEBOX_TOKEN or --token); the server keeps only its hash.");
            println!("# Add this to the server's config (or, without the auth. prefix, to its token file):");
            print!("{entry}");
            Ok(())
        }
        Command::Acquire {
            key,
            permits,
            wait,
            lease,
            caller,
            attempt,
            client,
        } => calls::acquire(&client, key, permits, wait, lease, caller, attempt).await,
        Command::Complete {
            ticket,
            outcome,
            cost,
            client,
        } => {
            let outcome = match outcome.as_str() {
                "success" => pb::Outcome::Success,
                "failure" => pb::Outcome::Failure,
                _ => pb::Outcome::Ignored,
            };
            calls::complete(&client, ticket, outcome, cost).await
        }
        Command::Get { key, client } => calls::get(&client, key).await,
        Command::Isolate(flags) => {
            calls::act(&flags.client, Action::Isolate, flags.key, flags.reason).await
        }
        Command::Close(flags) => {
            calls::act(&flags.client, Action::Close, flags.key, flags.reason).await
        }
        Command::Keys {
            prefix,
            phases,
            client,
        } => fusebox_cli::keys(client, prefix.unwrap_or_default(), phases).await,
        Command::Watch { prefix, client } => {
            fusebox_cli::watch(client, prefix.unwrap_or_default()).await
        }
        Command::Top {
            prefix,
            interval,
            client,
        } => fusebox_cli::top(client, prefix.unwrap_or_default(), interval).await,
        Command::Bench { .. } => unreachable!("answered in main, before the runtime"),
        Command::Policies { client } => fusebox_cli::policies(&client).await,
        Command::Advance { by, client } => calls::advance(&client, by).await,
    }
}

/// The environment variable that may hold the store's password.
const STORE_PASSWORD_ENV: &str = "FUSEBOX_STORE_PASSWORD";

/// How to use the store at `url` (`--store`), from the other flags (files
/// read, the password found); and warnings for the log, once it is set up.
fn store_options(
    url: &str,
    flags: StoreFlags,
) -> anyhow::Result<(fusebox::engine::redis::StoreOptions, Vec<String>)> {
    use fusebox::engine::redis::{
        read_password, Named, NoticeKey, Secret, StoreOptions, StoreTls, StoreUrl,
    };
    let url = StoreUrl::parse(url).map_err(|e| anyhow::anyhow!("--store: {e}"))?;
    let mut warnings = Vec::new();
    fn named<'a>(what: &'a str, path: &'a Option<PathBuf>) -> Option<Named<'a>> {
        path.as_deref().map(|path| Named { what, path })
    }
    let tls_flags = [
        ("--store-tls-ca", &flags.store_tls_ca),
        ("--store-tls-cert", &flags.store_tls_cert),
        ("--store-tls-key", &flags.store_tls_key),
    ];
    if let (false, Some((flag, _))) = (url.tls, tls_flags.iter().find(|(_, p)| p.is_some())) {
        anyhow::bail!(
            "{flag} needs a store over TLS: write rediss://HOST:PORT (or rediss-cluster://...) in --store"
        );
    }
    let tls = StoreTls::read(
        named("--store-tls-ca", &flags.store_tls_ca),
        named("--store-tls-cert", &flags.store_tls_cert),
        named("--store-tls-key", &flags.store_tls_key),
    )
    .map_err(anyhow::Error::msg)?;
    let user = match (flags.store_user, &url.user) {
        (Some(flag), Some(inline)) if flag != *inline => anyhow::bail!(
            "the Redis user is given twice, as --store-user and in --store's URL: keep one"
        ),
        (Some(flag), _) => Some(flag),
        (None, inline) => inline.clone(),
    };
    let from_env = match std::env::var(STORE_PASSWORD_ENV) {
        Ok(text) if !text.is_empty() => Some(Secret::new(text)),
        Ok(_) | Err(std::env::VarError::NotPresent) => None,
        Err(std::env::VarError::NotUnicode(_)) => {
            anyhow::bail!("{STORE_PASSWORD_ENV} is not UTF-8 text; set it to the Redis password")
        }
    };
    let from_file = named("--store-password-file", &flags.store_password_file)
        .map(read_password)
        .transpose()
        .map_err(anyhow::Error::msg)?;
    let sources: Vec<&str> = [
        from_file.as_ref().map(|_| "--store-password-file"),
        from_env.as_ref().map(|_| STORE_PASSWORD_ENV),
        url.password.as_ref().map(|_| "--store's URL"),
    ]
    .into_iter()
    .flatten()
    .collect();
    if sources.len() > 1 {
        anyhow::bail!(
            "the Redis password is given {} ways ({}): keep one, preferably the file",
            sources.len(),
            sources.join(", ")
        );
    }
    if url.password.is_some() {
        warnings.push(format!(
            "the Redis password is written in --store ({url}): process listings (ps, /proc) show it to every local user; pass it with --store-password-file FILE or {STORE_PASSWORD_ENV} instead"
        ));
    }
    let password = from_file.or(from_env).or_else(|| url.password.clone());
    let notices = flags
        .store_secret_file
        .as_deref()
        .map(|path| NoticeKey::read("--store-secret-file", path))
        .transpose()
        .map_err(anyhow::Error::msg)?;
    let options = StoreOptions {
        url,
        probe_replicas: flags.store_probe_replicas,
        probe_wait: std::time::Duration::from_millis(flags.store_probe_wait),
        tls,
        user,
        password,
        notices,
    };
    Ok((options, warnings))
}

async fn serve(flags: ServeFlags) -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        // A log reader that went away (`| head`) must not bring the server
        // down: the subscriber's own report of a failed write would panic
        // on the closed standard error.
        .log_internal_errors(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("FUSEBOX_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let store = match flags.store {
        Some(url) => {
            let (options, warnings) =
                store_options(&url, flags.store_flags).context("the server did not start")?;
            for warning in warnings {
                tracing::warn!("{warning}");
            }
            Some(options)
        }
        None => None,
    };
    let bound = fusebox::serve::bind(fusebox::serve::Options {
        config: flags.config,
        listen: flags.listen,
        manual_clock: flags.manual_clock,
        http: flags.http,
        tls: fusebox::serve::TlsFiles {
            cert: flags.tls.tls_cert,
            key: flags.tls.tls_key,
            client_ca: flags.tls.tls_client_ca,
        },
        insecure_no_auth: flags.insecure_no_auth,
        data_dir: flags.data_dir,
        store,
    })
    .await?;
    let mut lines = format!("listening on {}\n", bound.grpc_addr());
    if let Some(addr) = bound.http_addr() {
        lines.push_str(&format!("http on {addr}\n"));
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
    bound.run(shutdown_signal()).await
}

/// `text` as a TOML basic string.
fn toml_string(text: &str) -> String {
    toml::Value::String(text.to_owned()).to_string()
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

/// What `fusebox bench ARGS` answers: the load tool left the product's
/// binary; the same measurement is `fusebox-bench ARGS`.
fn bench_moved(args: &[String]) -> String {
    let mut command = "fusebox-bench".to_owned();
    for arg in args {
        command.push(' ');
        let plain = !arg.is_empty()
            && arg
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.,:/=@%+".contains(c));
        if plain {
            command.push_str(arg);
        } else {
            command.push_str(&format!("'{}'", arg.replace('\'', r"'\''")));
        }
    }
    format!(
        "error: the load tool has left the fusebox binary for one of its own, `fusebox-bench`; run\n\n    \
         {command}\n\n\
         (`cargo build --release -p fusebox -p fusebox-bench` builds both into target/release/; \
         fusebox-bench starts the fusebox beside it as the server under test)"
    )
}

/// `--interval`: a duration with a unit, more than zero.
fn parse_interval(text: &str) -> Result<u64, String> {
    match parse_duration_flag(text)? {
        0 => Err("must be more than 0, e.g. 500ms or 2s".to_owned()),
        ms => Ok(ms),
    }
}

/// `--store-probe-wait`: a duration from 10 ms to 60 s.
fn parse_probe_wait(text: &str) -> Result<u64, String> {
    match parse_duration_flag(text)? {
        ms @ 10..=60_000 => Ok(ms),
        ms => Err(format!(
            "{ms} ms is out of range: give 10ms to 60s (how long a probe waits for the replicas that must have it)"
        )),
    }
}

//! `fusebox bench`: the project's own load tool. It drives a fusebox
//! server over gRPC (one it starts itself, or `--target`), so that anyone
//! can reproduce the project's figures: calls per second against the
//! no-op `grpc.health` baseline, latency percentiles, and the server's
//! memory per key.
//!
//! Modes:
//! - (none): the arms (`health`, `acquire`, `pair`, and the
//!   many-decisions-per-request `stream` and `batch`, and `throttlecrab`
//!   against a throttlecrab-server) over the key spreads (`hot`, `1k`,
//!   `1m`, `zipf`), interleaved run by run, medians across runs; optionally
//!   with stalled watchers, or paced at `--rate` decisions/s.
//! - `fill`: creates N live keys as fast as the server takes them, reports
//!   bytes per key, then times listings and a metrics scrape and the `pair`
//!   p99 while listings run.
//! - `growth`: `pair` latency on 1,000 keys, before and after filling the
//!   server up to N keys.
//! - `attack`: an authenticated caller's Acquire p99 and the server's
//!   memory, quiet and under attack (tokenless connections, HEADERS-only
//!   calls, Decide streams that never read), embedded or `--store`.
//! - `redis-cpu`: the fusebox Redis module against a Lua script doing the
//!   same work, straight on a Redis or Redis Cluster (no fusebox server):
//!   decisions/s, latency and Redis CPU per decision.

mod attack;
mod beside;
mod fill;
mod load;
mod redis_cpu;
mod spread;
mod target;
mod throttlecrab;

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use fusebox::domain::policy::parse_duration as parse_duration_flag;
use fusebox::proto::v1 as pb;
use serde_json::{json, Value};

use self::fill::{
    fill, list_all, list_until, numbers_with_prefix, probe_prefix, Filled, Listing, FILL_PREFIX,
    PAGE_SIZE,
};
use self::load::{percentile_us, Arm, Load, Measurement};
use self::spread::Spread;
use self::target::{parse_cpu_list, time_scrape, Memory, Target};
use super::render_table;

/// The client CPU share (of its threads) past which the load generator
/// may itself be the bottleneck.
const SATURATED: f64 = 0.90;

/// CPU (in cores) used by other processes during a measurement past which
/// its figures are called disturbed.
const DISTURBED: f64 = 0.25;

/// `fusebox bench`: measure a fusebox server under load.
#[derive(clap::Args, Debug)]
pub(crate) struct BenchArgs {
    #[command(subcommand)]
    mode: Option<Mode>,
    /// Boxed: the settings are most of the size of the tool's commands.
    #[command(flatten)]
    options: Box<Options>,
}

/// What to measure; without a mode, the arms over the spreads.
#[derive(clap::Subcommand, Debug, Clone)]
enum Mode {
    /// Create N live keys (`fill/<n>`, each by Acquire + Complete FAILURE)
    /// as fast as the server takes them; report RSS growth per key, then
    /// time listings, a /metrics scrape, and the pair p99 while listing.
    Fill {
        /// How many keys to create.
        #[arg(long, default_value_t = 100_000)]
        keys: u64,
        /// Skip the listing probes after the fill.
        #[arg(long)]
        no_listing: bool,
        /// Make the keys of the `1m` spread (`bench/1m/<n>`) instead of
        /// `fill/<n>`, so that a later `--spreads 1m` run finds every one
        /// live (with `--target`).
        #[arg(long)]
        as_1m_spread: bool,
        /// List the keys `fill/<DIGITS>...` in the prefix probe (default:
        /// the decimal prefix closest to 1/27 of the keys).
        #[arg(long, value_name = "DIGITS")]
        prefix_digits: Option<u64>,
    },
    /// A server on a store (`fusebox serve --store URL`) beside an embedded
    /// one, both started by the tool: every arm on every spread on each,
    /// interleaved, with the ratios taken within each run (store/embedded,
    /// stream/pair, each against its server's health check).
    Beside {
        /// The store: redis://HOST:PORT or redis-cluster://H1:P1,...
        #[arg(long, value_name = "URL")]
        store: String,
    },
    /// An authenticated caller's Acquire on 1,000 keys, quiet and under
    /// attack, interleaved run by run: connections that never show a
    /// credential, HEADERS-only calls without a token, and Decide streams
    /// (another tenant's token) that never read their answers. Reports the
    /// p99 ratio attack/quiet and the server's memory growth. Starts the
    /// server itself, with [auth] and the two tokens.
    Attack {
        /// Connections that send the HTTP/2 preface and nothing more.
        #[arg(long, default_value_t = 1_000)]
        tokenless: u32,
        /// HEADERS-only calls without a token, left open.
        #[arg(long, default_value_t = 3_000)]
        headers_only: u32,
        /// Connections of never-read Decide streams.
        #[arg(long, default_value_t = 100)]
        decide_connections: u32,
        /// Never-read Decide streams on each (at most 16).
        #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(0..=16))]
        decide_streams: u32,
        /// Start the server on this store (redis://HOST:PORT or
        /// redis-cluster://H1:P1,...) instead of embedded.
        #[arg(long, value_name = "URL")]
        store: Option<String>,
    },
    /// Pair latency on 1,000 keys, then fill the server up to N live keys
    /// and measure again; reports the ratio of the p999s.
    Growth {
        /// How many live keys to reach.
        #[arg(long, default_value_t = 1_000_000)]
        keys: u64,
    },
    /// The fusebox Redis module (FB.ACQUIRE + FB.COMPLETE) against Redis's
    /// own floor (SET + GET of a 64-byte string), the module API's own cost
    /// (two FB.KEYCHECK) and a Lua script doing the same breaker and
    /// limiter work (EVALSHA), straight on Redis: decisions/s, pair
    /// latency, Redis CPU per decision (INFO cpu of every primary, and of
    /// the replicas apart), time per call (INFO commandstats), interleaved,
    /// medians across runs and the ratios module/floor, module/noop,
    /// module/lua and module with live tickets / without.
    /// Starts no fusebox server.
    RedisCpu {
        /// redis://HOST:PORT, or redis-cluster://H1:P1,H2:P2,... (some
        /// nodes of a cluster; every primary is found with CLUSTER NODES).
        #[arg(long, value_name = "URL")]
        store: String,
        /// Permits of the concurrency limiter in the policy; more than the
        /// callers (connections x in flight), so that none is denied.
        #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..))]
        permits: u32,
        /// Each caller sends DEPTH decisions in one pipeline (each acquire
        /// followed by the completion of its ticket, for every arm): one
        /// sample per decision, the pipeline's latency.
        #[arg(long, default_value_t = 1, value_name = "DEPTH", value_parser = clap::value_parser!(u32).range(1..=10_000))]
        pipeline: u32,
        /// Measure the Lua script only, on a Redis without the module.
        #[arg(long)]
        lua_only: bool,
        /// The arms, comma separated: floor (SET + GET), noop (two
        /// FB.KEYCHECK: the module API's own cost), module, lua.
        #[arg(long, value_delimiter = ',', default_value = "floor,noop,module,lua")]
        redis_arms: Vec<redis_cpu::Arm>,
        /// Also measure the module with this many tickets held live (for a
        /// day) on every key of the spread, comma separated; 0 is the run
        /// without.
        #[arg(long, value_delimiter = ',', default_value = "0")]
        live_tickets: Vec<u32>,
    },
}

/// Settings every mode shares.
#[derive(clap::Args, Debug, Clone)]
struct Options {
    /// A running server's gRPC address (http://ADDR), or several, comma
    /// separated (http://A,http://B): the --connections are spread over
    /// them round-robin. By default the tool starts one server itself, on
    /// free ports, and stops it at the end.
    #[arg(long, global = true, value_name = "URL")]
    target: Option<String>,
    /// Call the --target server over TLS, trusting the CAs in this PEM
    /// file (its /metrics are read only over plain HTTP).
    #[arg(long, global = true, value_name = "FILE", requires = "target")]
    tls_ca: Option<PathBuf>,
    /// With mutual TLS: the load generator's certificate chain (PEM).
    #[arg(long, global = true, value_name = "FILE", requires = "tls_ca")]
    tls_cert: Option<PathBuf>,
    /// With mutual TLS: the load generator's private key (PEM).
    #[arg(long, global = true, value_name = "FILE", requires = "tls_ca")]
    tls_key: Option<PathBuf>,
    /// The name the server's certificate must have, when it is not the
    /// host of --target.
    #[arg(long, global = true, value_name = "NAME", requires = "tls_ca")]
    tls_server_name: Option<String>,
    /// The HTTP address of the --target server, to read its /metrics; with
    /// several servers, a comma-separated list: memory and live keys are
    /// summed over them, while the fill mode's /metrics scrape, listings
    /// and stalled watchers use the first server only.
    #[arg(long, global = true, value_name = "ADDR", requires = "target")]
    http: Option<String>,
    /// A config file for the server the tool starts (default: the
    /// built-in policy, with max_keys and max_tickets raised to 4,000,000).
    #[arg(long, global = true, value_name = "FILE", conflicts_with = "target")]
    config: Option<PathBuf>,
    /// Pin the server the tool starts to these CPUs (taskset -c LIST).
    #[arg(long, global = true, value_name = "LIST", conflicts_with = "target")]
    server_cpus: Option<String>,
    /// Pin the load generator to these CPUs (its threads round-robin).
    #[arg(long, global = true, value_name = "LIST")]
    client_cpus: Option<String>,
    /// The bearer token to call with, when the server has [auth] (the
    /// server the tool starts inherits FUSEBOX_TOKEN, for a config whose
    /// token has `env = "FUSEBOX_TOKEN"`).
    #[arg(long, global = true, env = "FUSEBOX_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Worker threads of the load generator's runtime.
    #[arg(long, global = true, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    client_threads: u16,
    /// HTTP/2 connections (separate channels) the load is spread over.
    #[arg(long, global = true, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..))]
    connections: u16,
    /// Concurrent callers per connection (closed loop: each calls again as
    /// soon as its answer arrives).
    #[arg(long, global = true, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..))]
    in_flight: u16,
    /// Load before each measurement that is not counted, e.g. 2s.
    #[arg(long, global = true, default_value = "2s", value_parser = parse_duration_flag)]
    warmup: u64,
    /// How long each measurement lasts, e.g. 5s.
    #[arg(long, global = true, default_value = "5s", value_parser = parse_positive_duration)]
    duration: u64,
    /// Runs; the figures reported are the medians across runs.
    #[arg(long, global = true, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..))]
    runs: u16,
    /// The arms to measure, comma separated (health is always measured:
    /// it is the baseline of the ratios).
    #[arg(
        long,
        global = true,
        value_enum,
        value_delimiter = ',',
        default_value = "health,acquire,pair"
    )]
    arms: Vec<Arm>,
    /// The key spreads, comma separated.
    #[arg(
        long,
        global = true,
        value_enum,
        value_delimiter = ',',
        default_value = "hot,1k,1m,zipf"
    )]
    spreads: Vec<Spread>,
    /// Also measure `acquire` with K Admin.Watch streams open and never
    /// read (each on its own connection), in every run.
    #[arg(long, global = true, default_value_t = 0, value_name = "K")]
    stalled_watchers: u32,
    /// The `stream` arm: frames per Decide message, and decisions in flight
    /// per stream (one stream per connection); the `batch` arm: items per
    /// batch.
    #[arg(long, global = true, default_value_t = 100, value_parser = clap::value_parser!(u16).range(1..=1000))]
    frames: u16,
    /// Pace the `pair` and `stream` arms at this many decisions per second
    /// in all (open loop: each caller on a fixed schedule that does not
    /// slip when it falls behind); the other arms stay closed loop.
    #[arg(long, global = true, value_name = "PER_S")]
    rate: Option<f64>,
    /// The gRPC address (http://ADDR) of a throttlecrab-server, for the
    /// `throttlecrab` arm.
    #[arg(long, global = true, value_name = "URL")]
    throttlecrab: Option<String>,
    /// Write every figure, the command line and the git commit to FILE.
    #[arg(long, global = true, value_name = "FILE")]
    json: Option<PathBuf>,
}

fn parse_positive_duration(text: &str) -> Result<u64, String> {
    match parse_duration_flag(text)? {
        0 => Err("must be more than 0, e.g. 300ms or 5s".to_owned()),
        ms => Ok(ms),
    }
}

/// Runs `fusebox bench` on a runtime of its own: `--client-threads`
/// workers, pinned to `--client-cpus`.
pub(crate) async fn bench(args: BenchArgs) -> anyhow::Result<()> {
    // The attack starts its own server, whose caller token is the load's.
    let attack_tokens = match args.mode {
        Some(Mode::Attack { .. }) => Some(attack::Tokens::new()?),
        _ => None,
    };
    let token = match &attack_tokens {
        Some(tokens) => Some(tokens.caller.as_str()),
        None => args.options.token.as_deref(),
    };
    load::set_credentials(crate::client::Credentials::of(token)?);
    let cpus = match &args.options.client_cpus {
        Some(list) => {
            Some(parse_cpu_list(list).map_err(|e| anyhow::anyhow!("--client-cpus: {e}"))?)
        }
        None => None,
    };
    if let Some(list) = &args.options.server_cpus {
        parse_cpu_list(list).map_err(|e| anyhow::anyhow!("--server-cpus: {e}"))?;
    }
    tokio::task::spawn_blocking(move || {
        let threads = usize::from(args.options.client_threads);
        // Threads inherit their creator's CPUs: pin this one first, then
        // each worker in turn.
        if let Some(cpus) = &cpus {
            pin(cpus[0])?;
        }
        let runtime = if threads == 1 {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?
        } else {
            let turn = Arc::new(AtomicUsize::new(0));
            let cpus = cpus.clone();
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(threads)
                .enable_all()
                .on_thread_start(move || {
                    if let Some(cpus) = &cpus {
                        let cpu = cpus[turn.fetch_add(1, Ordering::Relaxed) % cpus.len()];
                        let _ = pin(cpu);
                    }
                })
                .build()?
        };
        runtime.block_on(run(args, cpus, attack_tokens))
    })
    .await
    .context("the load generator's thread failed")?
}

/// Pins the calling thread to `cpu`.
fn pin(cpu: usize) -> anyhow::Result<()> {
    if core_affinity::set_for_current(core_affinity::CoreId { id: cpu }) {
        Ok(())
    } else {
        bail!("--client-cpus: cannot pin the load generator to CPU {cpu}")
    }
}

async fn run(
    args: BenchArgs,
    client_cpus: Option<Vec<usize>>,
    attack_tokens: Option<attack::Tokens>,
) -> anyhow::Result<()> {
    let o = &args.options;
    let mut warnings = Vec::new();
    if let (Some(client), Some(server)) = (&client_cpus, &o.server_cpus) {
        let server = parse_cpu_list(server).unwrap_or_default();
        if client.iter().any(|c| server.contains(c)) {
            warnings.push(
                "the client and server CPUs overlap: they compete for the same core".to_owned(),
            );
        }
    }
    if o.tls_ca.is_some() {
        let tls = crate::client::tls_config_of(
            o.tls_ca.as_deref(),
            o.tls_cert.as_deref(),
            o.tls_key.as_deref(),
            o.tls_server_name.as_deref(),
        )?;
        let _ = load::TLS.set(tls);
    }
    if let Some(Mode::RedisCpu {
        store,
        permits,
        pipeline,
        lua_only,
        redis_arms,
        live_tickets,
    }) = &args.mode
    {
        let arms = if *lua_only {
            vec![redis_cpu::Arm::Lua]
        } else {
            redis_arms.clone()
        };
        let setup = redis_cpu::Setup {
            store,
            permits: *permits,
            pipeline: *pipeline,
            arms: &arms,
            live: live_tickets,
        };
        let (mode, text, figures) = redis_cpu::redis_cpu_mode(o, &setup, &mut warnings).await?;
        return report(o, None, mode, &text, figures, &warnings);
    }
    if let Some(Mode::Attack {
        tokenless,
        headers_only,
        decide_connections,
        decide_streams,
        store,
    }) = args.mode.clone()
    {
        anyhow::ensure!(
            o.target.is_none() && o.config.is_none(),
            "bench attack starts its server itself, with [auth] and two tokens: leave out --target and --config"
        );
        let tokens = attack_tokens.expect("made for the attack");
        let size = attack::Size {
            tokenless,
            headers_only,
            decide_connections,
            decide_streams,
        };
        let ((mode, text, figures), mut target) =
            attack::attack_mode(o, &tokens, size, store.as_deref(), &mut warnings).await?;
        let stopped = target.stop().await;
        stopped?;
        return report(o, Some(&target), mode, &text, figures, &warnings);
    }
    if let Some(Mode::Beside { store }) = &args.mode {
        anyhow::ensure!(
            o.target.is_none(),
            "bench beside starts both servers itself: leave out --target"
        );
        let (mode, text, figures) = beside::beside_mode(o, store, &mut warnings).await?;
        return report(o, None, mode, &text, figures, &warnings);
    }
    let mut target = match &o.target {
        Some(url) => {
            let scheme = if o.tls_ca.is_some() { "https" } else { "http" };
            Target::existing(url, o.http.as_deref(), scheme)
        }
        None => Target::start(o.config.as_deref(), o.server_cpus.as_deref()).await?,
    };
    eprintln!(
        "bench: server {} (http {}){}",
        target.grpcs.join(", "),
        if target.https.is_empty() {
            "unknown".to_owned()
        } else {
            target.https.join(", ")
        },
        if target.pid.is_some() {
            " started by the tool"
        } else {
            ""
        }
    );
    let outcome = match args.mode {
        None => arms(o, &mut target, &mut warnings).await,
        Some(Mode::Fill {
            keys,
            no_listing,
            as_1m_spread,
            prefix_digits,
        }) => {
            let listing = (!no_listing).then_some(prefix_digits);
            let prefix = if as_1m_spread {
                "bench/1m/"
            } else {
                FILL_PREFIX
            };
            fill_mode(o, &mut target, keys, prefix, listing, &mut warnings).await
        }
        Some(Mode::Growth { keys }) => growth_mode(o, &mut target, keys, &mut warnings).await,
        Some(Mode::RedisCpu { .. } | Mode::Beside { .. } | Mode::Attack { .. }) => {
            unreachable!("measured above, with servers of their own")
        }
    };
    let stopped = target.stop().await;
    let (mode, text, figures) = outcome?;
    stopped?;
    report(o, Some(&target), mode, &text, figures, &warnings)
}

/// Prints a mode's report and warnings, and writes `--json`.
fn report(
    o: &Options,
    target: Option<&Target>,
    mode: &str,
    text: &str,
    figures: Value,
    warnings: &[String],
) -> anyhow::Result<()> {
    println!("{text}");
    for w in warnings {
        println!("warning: {w}");
    }
    if let Some(path) = &o.json {
        let doc = json!({
            "tool": "fusebox bench",
            "version": env!("CARGO_PKG_VERSION"),
            "mode": mode,
            "command_line": std::env::args().collect::<Vec<_>>(),
            "git_commit": git_commit(),
            "started_at": super::now_s(),
            "settings": settings_json(o, target),
            "warnings": warnings,
            "figures": figures,
        });
        std::fs::write(path, serde_json::to_string_pretty(&doc)? + "\n")
            .with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!("bench: figures written to {}", path.display());
    }
    Ok(())
}

/// A mode's name, its report for people, and its figures for `--json`.
type Report = (&'static str, String, Value);

fn settings_json(o: &Options, target: Option<&Target>) -> Value {
    json!({
        "target": target.map(|t| t.grpcs.join(",")),
        "targets": target.map(|t| &t.grpcs),
        "http": target.map(|t| t.https.join(",")).filter(|h| !h.is_empty()),
        "server_started_by_tool": target.is_some() && o.target.is_none(),
        "config": o.config,
        "server_cpus": o.server_cpus,
        "client_cpus": o.client_cpus,
        "client_threads": o.client_threads,
        "connections": o.connections,
        "in_flight": o.in_flight,
        "warmup_ms": o.warmup,
        "duration_ms": o.duration,
        "runs": o.runs,
        "arms": o.arms.iter().map(|a| a.name()).collect::<Vec<_>>(),
        "spreads": o.spreads.iter().map(|s| s.name()).collect::<Vec<_>>(),
        "stalled_watchers": o.stalled_watchers,
        "frames": o.frames,
        "rate": o.rate,
        "throttlecrab": o.throttlecrab,
    })
}

/// The commit of the working directory's git checkout, `-dirty` when
/// tracked files changed; none outside a checkout.
fn git_commit() -> Option<String> {
    let run = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .stderr(std::process::Stdio::null())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    let commit = run(&["rev-parse", "HEAD"])?;
    let dirty =
        run(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    Some(if dirty {
        format!("{commit}-dirty")
    } else {
        commit
    })
}

fn load_open(
    o: &Options,
    target: &Target,
) -> impl std::future::Future<Output = anyhow::Result<Load>> {
    let urls = target.grpcs.clone();
    let (connections, in_flight) = (usize::from(o.connections), usize::from(o.in_flight));
    async move { Load::open(&urls, connections, in_flight).await }
}

fn ms(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

// ---------------------------------------------------------------------------
// The arms over the spreads.
// ---------------------------------------------------------------------------

/// One cell of the table: an arm on a spread (`health` has none), with or
/// without stalled watchers.
/// Measures one cell in run `run` of `runs`, saying so on standard error.
async fn measure_cell(
    o: &Options,
    target: &mut Target,
    load: &Load,
    cell: Cell,
    run: usize,
    runs: usize,
) -> anyhow::Result<Measurement> {
    eprintln!(
        "bench: run {}/{runs}: {} {}",
        run + 1,
        cell.arm_name(o.stalled_watchers),
        cell.spread_name()
    );
    let m = load
        .measure(
            cell.arm,
            cell.spread.unwrap_or(Spread::Hot),
            ms(o.warmup),
            ms(o.duration),
            run as u64,
            target.pid,
        )
        .await;
    target.check_alive()?;
    Ok(m)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Cell {
    arm: Arm,
    spread: Option<Spread>,
    stalled: bool,
}

impl Cell {
    fn arm_name(&self, watchers: u32) -> String {
        if self.stalled {
            format!("{}+{watchers}stalled", self.arm.name())
        } else {
            self.arm.name().to_owned()
        }
    }

    fn spread_name(&self) -> &'static str {
        self.spread.map_or("-", Spread::name)
    }
}

async fn arms(
    o: &Options,
    target: &mut Target,
    warnings: &mut Vec<String>,
) -> anyhow::Result<Report> {
    let mut load = load_open(o, target).await?;
    load.frames = usize::from(o.frames);
    if let Some(rate) = o.rate {
        anyhow::ensure!(
            rate.is_finite() && rate > 0.0,
            "--rate: more than 0 decisions per second"
        );
        load.rate = Some(rate);
    }
    if o.arms.contains(&Arm::Throttlecrab) {
        let url = o.throttlecrab.as_deref().context(
            "--arms throttlecrab needs --throttlecrab http://ADDR of a throttlecrab-server",
        )?;
        for _ in 0..o.connections {
            load.throttlecrab.push(load::connect(url).await?);
        }
    }
    let load = load;
    let mut cells = vec![Cell {
        arm: Arm::Health,
        spread: None,
        stalled: false,
    }];
    for arm in Arm::ALL
        .into_iter()
        .filter(|a| *a != Arm::Health && o.arms.contains(a))
    {
        for spread in Spread::ALL.into_iter().filter(|s| o.spreads.contains(s)) {
            cells.push(Cell {
                arm,
                spread: Some(spread),
                stalled: false,
            });
        }
    }
    let stalled: Vec<Cell> = if o.stalled_watchers > 0 {
        Spread::ALL
            .into_iter()
            .filter(|s| o.spreads.contains(s))
            .map(|spread| Cell {
                arm: Arm::Acquire,
                spread: Some(spread),
                stalled: true,
            })
            .collect()
    } else {
        Vec::new()
    };
    if !stalled.is_empty() && !o.arms.contains(&Arm::Acquire) {
        // The stalled cells are compared with acquire in the same run.
        for c in &stalled {
            cells.push(Cell {
                stalled: false,
                ..*c
            });
        }
    }
    let runs = usize::from(o.runs);
    // measured[cell][run]
    let mut measured: Vec<Vec<Measurement>> = (0..cells.len() + stalled.len())
        .map(|_| Vec::new())
        .collect();
    let mut watcher_growth: Vec<f64> = Vec::new();
    for run in 0..runs {
        // Interleaved: every cell once per run, starting one further along
        // each run, so that drift and noise fall on all cells alike.
        for i in 0..cells.len() {
            let at = (i + run) % cells.len();
            let m = measure_cell(o, &mut *target, &load, cells[at], run, runs).await?;
            measured[at].push(m);
        }
        if !stalled.is_empty() {
            let before = target.memory().await;
            eprintln!(
                "bench: run {}/{runs}: opening {} stalled watchers",
                run + 1,
                o.stalled_watchers
            );
            let watchers = open_stalled_watchers(&target.grpc, o.stalled_watchers).await?;
            for (i, cell) in stalled.iter().enumerate() {
                let m = measure_cell(o, &mut *target, &load, *cell, run, runs).await?;
                measured[cells.len() + i].push(m);
            }
            let after = target.memory().await;
            if let (Some(a), Some(b)) = (before.rss_bytes, after.rss_bytes) {
                watcher_growth.push(b as f64 - a as f64);
            }
            drop(watchers);
        }
    }
    let memory = target.memory().await;
    let all_cells: Vec<Cell> = cells.iter().chain(&stalled).copied().collect();

    // Figures per cell, medians across runs; ratios against the health
    // arm of the same run.
    let health = &measured[0];
    let pair_of = |spread: Option<Spread>| {
        cells
            .iter()
            .position(|c| c.arm == Arm::Pair && c.spread == spread && !c.stalled)
            .map(|i| &measured[i])
    };
    let mut rows = Vec::new();
    let mut results = Vec::new();
    let threads = f64::from(o.client_threads);
    let mut saturated = Vec::new();
    let mut disturbed = Vec::new();
    let mut text_due: Vec<String> = Vec::new();
    for (cell, ms) in all_cells.iter().zip(&measured) {
        let rates: Vec<f64> = ms.iter().map(Measurement::rate).collect();
        let ratios: Vec<f64> = ms
            .iter()
            .zip(health)
            .filter(|(_, h)| h.rate() > 0.0)
            .map(|(m, h)| m.rate() / h.rate())
            .collect();
        let p = |q: f64| median(ms.iter().map(|m| m.percentile_us(q)).collect());
        let pc = |q: f64| {
            median(
                ms.iter()
                    .map(|m| percentile_us(&m.tally.complete, q))
                    .collect(),
            )
        };
        let client_cpu = median(ms.iter().filter_map(|m| m.client_cpu).collect());
        let server_cpu = median(ms.iter().filter_map(|m| m.server_cpu).collect());
        let errors: u64 = ms.iter().map(|m| m.tally.errors).sum();
        let not_granted: u64 = ms.iter().map(|m| m.tally.not_granted).sum();
        let first_error = ms.iter().find_map(|m| m.tally.first_error.clone());
        if ms
            .iter()
            .any(|m| m.other_cpu().is_some_and(|c| c >= DISTURBED))
        {
            disturbed.push(format!(
                "{} {}",
                cell.arm_name(o.stalled_watchers),
                cell.spread_name()
            ));
        }
        if ms
            .iter()
            .any(|m| m.client_cpu.is_some_and(|c| c / threads >= SATURATED))
        {
            saturated.push(format!(
                "{} {}",
                cell.arm_name(o.stalled_watchers),
                cell.spread_name()
            ));
        }
        let (rate, ratio) = (median(rates.clone()), median(ratios.clone()));
        // Against pair on the same spread, run by run.
        let to_pair = pair_of(cell.spread).map(|pairs| {
            median(
                ms.iter()
                    .zip(pairs)
                    .filter(|(_, p)| p.rate() > 0.0)
                    .map(|(m, p)| m.rate() / p.rate())
                    .collect(),
            )
        });
        let (p50, p99, p999) = (p(50.0), p(99.0), p(99.9));
        rows.push(vec![
            cell.arm_name(o.stalled_watchers),
            cell.spread_name().to_owned(),
            format!("{} {}", thousands(rate), cell.arm.unit()),
            format!("{ratio:.3}"),
            to_pair.map_or_else(|| "-".to_owned(), |r| format!("{r:.2}")),
            format!("{p50:.1}"),
            format!("{p99:.1}"),
            format!("{p999:.1}"),
            format!("{:.0}%", client_cpu * 100.0),
            if server_cpu > 0.0 {
                format!("{:.0}%", server_cpu * 100.0)
            } else {
                "-".to_owned()
            },
            errors.to_string(),
        ]);
        let mut result = json!({
            "arm": cell.arm.name(),
            "spread": cell.spread.map(Spread::name),
            "stalled_watchers": if cell.stalled { o.stalled_watchers } else { 0 },
            "unit": cell.arm.unit(),
            "rate": rate,
            "ratio_to_health": ratio,
            "ratio_to_pair": to_pair,
            "rate_asked": o.rate.filter(|_| cell.arm.paced()),
            "latency_of": match cell.arm {
                Arm::Batch => "batch",
                Arm::Health | Arm::Acquire | Arm::Throttlecrab => "call",
                Arm::Pair | Arm::Stream => "decision",
            },
            "p50_us": p50,
            "p99_us": p99,
            "p999_us": p999,
            "client_cpu": client_cpu,
            "server_cpu": ms.iter().any(|m| m.server_cpu.is_some()).then_some(server_cpu),
            "errors": errors,
            "not_granted": not_granted,
            "first_error": first_error,
            "runs": ms.iter().zip(health).map(|(m, h)| json!({
                "samples": m.tally.samples,
                "rate": m.rate(),
                "ratio_to_health": if h.rate() > 0.0 { Some(m.rate() / h.rate()) } else { None },
                "p50_us": m.percentile_us(50.0),
                "p99_us": m.percentile_us(99.0),
                "p999_us": m.percentile_us(99.9),
                "max_us": m.tally.latency.max() as f64 / 1000.0,
                "client_cpu": m.client_cpu,
                "server_cpu": m.server_cpu,
                "other_cpu": m.other_cpu(),
                "errors": m.tally.errors,
            })).collect::<Vec<_>>(),
        });
        if o.rate.is_some() && cell.arm.paced() {
            let pd = |q: f64| {
                median(
                    ms.iter()
                        .map(|m| percentile_us(&m.tally.from_due, q))
                        .collect(),
                )
            };
            result["from_due_p50_us"] = json!(pd(50.0));
            result["from_due_p99_us"] = json!(pd(99.0));
            result["from_due_p999_us"] = json!(pd(99.9));
            text_due.push(format!(
                "{} {}: from when each decision was due: p50 {:.1} µs, p99 {:.1} µs, p999 {:.1} µs",
                cell.arm.name(),
                cell.spread_name(),
                pd(50.0),
                pd(99.0),
                pd(99.9)
            ));
        }
        if cell.arm == Arm::Acquire {
            result["complete_p50_us"] = json!(pc(50.0));
            result["complete_p99_us"] = json!(pc(99.0));
            result["complete_p999_us"] = json!(pc(99.9));
        }
        results.push(result);
        if let Some(e) = ms.iter().find_map(|m| m.tally.first_error.as_ref()) {
            warnings.push(format!(
                "{} {}: {errors} calls failed, the first with {e}",
                cell.arm_name(o.stalled_watchers),
                cell.spread_name()
            ));
        }
    }
    if !disturbed.is_empty() {
        warnings.push(format!(
            "other processes of the machine used {DISTURBED} cores or more of CPU during {}: \
             those figures are disturbed (see other_cpu in the JSON); run again on a quiet machine",
            disturbed.join(", ")
        ));
    }
    if !saturated.is_empty() {
        warnings.push(format!(
            "the load generator used {:.0}% or more of its {} thread(s) during {}: it may be the \
             bottleneck there (give it more with --client-threads and --client-cpus)",
            SATURATED * 100.0,
            o.client_threads,
            saturated.join(", ")
        ));
    }

    let (lines, _) = render_table(
        &[
            "ARM",
            "SPREAD",
            "RATE",
            "VS HEALTH",
            "VS PAIR",
            "P50 µs",
            "P99 µs",
            "P999 µs",
            "CLIENT CPU",
            "SERVER CPU",
            "ERRORS",
        ],
        &rows,
    );
    let mut text = lines.join("\n");
    text.push_str(&format!(
        "\n\n{} run(s) of {} ms warm-up + {} ms measured per row, interleaved; medians across runs.\n\
         {} connections x {} in flight; ratios are each run's rate over its health (or pair) rate.\n",
        o.runs, o.warmup, o.duration, o.connections, o.in_flight
    ));
    if o.arms.iter().any(|a| matches!(a, Arm::Stream | Arm::Batch)) {
        text.push_str(&format!(
            "stream: one Decide stream per connection, {} decisions in flight each, latency per decision \
             (Acquire frame sent to Complete answered); batch: {} items per batch, one caller per \
             connection, latency per batch.\n",
            o.frames, o.frames
        ));
    }
    if let Some(rate) = o.rate {
        text.push_str(&format!(
            "pair and stream paced at {} decisions/s in all (open loop); RATE is what was made; the \
             percentiles run from the Acquire sent (a decision waits for a 1 ms timer tick before it is sent).\n",
            thousands(rate)
        ));
        for line in &text_due {
            text.push_str(line);
            text.push('\n');
        }
    }
    text.push_str(&memory_line(&memory));
    let mut figures = json!({
        "results": results,
        "memory": memory.json(),
    });
    if !stalled.is_empty() {
        let growth = median(watcher_growth.clone());
        let mut compare = Vec::new();
        for c in &stalled {
            let with = all_cells.iter().position(|x| x == c).map(|i| &measured[i]);
            let without = all_cells
                .iter()
                .position(|x| {
                    *x == Cell {
                        stalled: false,
                        ..*c
                    }
                })
                .map(|i| &measured[i]);
            if let (Some(with), Some(without)) = (with, without) {
                let p99 = |ms: &Vec<Measurement>| {
                    median(ms.iter().map(|m| m.percentile_us(99.0)).collect())
                };
                let ratio = median(
                    with.iter()
                        .zip(without)
                        .map(|(w, n)| w.percentile_us(99.0) / n.percentile_us(99.0).max(0.001))
                        .collect(),
                );
                text.push_str(&format!(
                    "\nacquire {} p99 with {} stalled watchers: {:.1} µs, without: {:.1} µs (x{ratio:.2})",
                    c.spread_name(),
                    o.stalled_watchers,
                    p99(with),
                    p99(without)
                ));
                compare.push(json!({
                    "spread": c.spread_name(),
                    "p99_us_with": p99(with),
                    "p99_us_without": p99(without),
                    "p99_ratio": ratio,
                }));
            }
        }
        if !watcher_growth.is_empty() {
            text.push_str(&format!(
                "\nserver RSS growth with {} stalled watchers open: {} ({} per watcher)",
                o.stalled_watchers,
                bytes(growth),
                bytes(growth / f64::from(o.stalled_watchers))
            ));
        }
        figures["stalled_watchers"] = json!({
            "watchers": o.stalled_watchers,
            "rss_growth_bytes": (!watcher_growth.is_empty()).then_some(growth),
            "rss_growth_per_run": watcher_growth,
            "acquire_p99": compare,
        });
    }
    Ok(("arms", text, figures))
}

/// Opens `k` Admin.Watch streams on every key, each on its own connection,
/// and keeps them without ever reading them.
async fn open_stalled_watchers(
    url: &str,
    k: u32,
) -> anyhow::Result<Vec<tonic::Streaming<pb::WatchEvent>>> {
    let mut watchers = Vec::with_capacity(k as usize);
    for _ in 0..k {
        let channel = load::connect(url).await?;
        let stream = pb::admin_client::AdminClient::new(channel)
            .watch(pb::WatchRequest {
                prefix: String::new(),
            })
            .await
            .context("Admin.Watch failed")?
            .into_inner();
        watchers.push(stream);
    }
    Ok(watchers)
}

fn memory_line(memory: &Memory) -> String {
    let rss = memory.rss_bytes.map_or_else(
        || "unknown (pass --http of a --target server)".to_owned(),
        |b| bytes(b as f64),
    );
    let source = match memory.rss_source {
        Some("metrics") => " (process_resident_memory_bytes)",
        Some("proc") => " (VmRSS of /proc/PID/status)",
        _ => "",
    };
    let keys = memory
        .keys
        .map_or_else(|| "unknown".to_owned(), |k| thousands(k as f64));
    let per_key = memory
        .bytes_per_key()
        .map_or_else(String::new, |b| format!(", {b:.0} bytes per key"));
    format!("server memory: RSS {rss}{source}, {keys} live keys{per_key}")
}

// ---------------------------------------------------------------------------
// Fill, and the probes that need many keys.
// ---------------------------------------------------------------------------

async fn fill_mode(
    o: &Options,
    target: &mut Target,
    keys: u64,
    prefix: &'static str,
    listing: Option<Option<u64>>,
    warnings: &mut Vec<String>,
) -> anyhow::Result<Report> {
    let load = load_open(o, target).await?;
    let before = target.memory().await;
    eprintln!("bench: filling {keys} keys");
    let filled = fill(&load, prefix, 0, keys).await;
    target.check_alive()?;
    let after = target.memory().await;
    let mut text = fill_text(&filled, &before, &after);
    if let Some(e) = &filled.first_error {
        warnings.push(format!(
            "fill: {} calls failed, the first with {e}",
            filled.errors
        ));
    }
    let mut figures = json!({ "fill": fill_json(&filled, &before, &after) });
    if let Some(prefix_digits) = listing {
        let (probe_text, probe) =
            listing_probes(o, target, &load, keys, prefix_digits, warnings).await?;
        text.push_str(&probe_text);
        figures["listing"] = probe;
    }
    Ok(("fill", text, figures))
}

fn fill_json(filled: &Filled, before: &Memory, after: &Memory) -> Value {
    let growth = match (before.rss_bytes, after.rss_bytes) {
        (Some(a), Some(b)) => Some(b as f64 - a as f64),
        _ => None,
    };
    json!({
        "keys": filled.asked,
        "created": filled.created,
        "errors": filled.errors,
        "first_error": filled.first_error,
        "seconds": filled.elapsed.as_secs_f64(),
        "pairs_per_s": filled.created as f64 / filled.elapsed.as_secs_f64().max(1e-9),
        "before": before.json(),
        "after": after.json(),
        "rss_growth_bytes": growth,
        "bytes_per_key": growth.map(|g| g / filled.asked.max(1) as f64),
    })
}

fn fill_text(filled: &Filled, before: &Memory, after: &Memory) -> String {
    let secs = filled.elapsed.as_secs_f64().max(1e-9);
    let mut text = format!(
        "fill: {} keys asked, {} created (Acquire + Complete FAILURE) in {secs:.2} s: {} pairs/s, {} errors\n",
        thousands(filled.asked as f64),
        thousands(filled.created as f64),
        thousands(filled.created as f64 / secs),
        filled.errors
    );
    let keys = |m: &Memory| {
        m.keys
            .map_or_else(|| "?".to_owned(), |k| thousands(k as f64))
    };
    match (before.rss_bytes, after.rss_bytes) {
        (Some(a), Some(b)) => {
            let growth = b as f64 - a as f64;
            text.push_str(&format!(
                "server RSS: {} before ({} live keys), {} after ({} live keys): grew {}, {:.0} bytes per key\n",
                bytes(a as f64),
                keys(before),
                bytes(b as f64),
                keys(after),
                bytes(growth),
                growth / filled.asked.max(1) as f64
            ));
        }
        _ => text.push_str(&format!(
            "server RSS unknown (pass --http of a --target server); live keys {} before, {} after\n",
            keys(before),
            keys(after)
        )),
    }
    text
}

async fn listing_probes(
    o: &Options,
    target: &Target,
    load: &Load,
    keys: u64,
    prefix_digits: Option<u64>,
    warnings: &mut Vec<String>,
) -> anyhow::Result<(String, Value)> {
    let channel = load::connect(&target.grpc).await?;
    eprintln!("bench: listing every key, {PAGE_SIZE} a page");
    let all = list_all(channel.clone(), "").await?;
    let (prefix, expected) = match prefix_digits {
        Some(digits) => (
            format!("{FILL_PREFIX}{digits}"),
            numbers_with_prefix(digits, keys),
        ),
        None => probe_prefix(keys),
    };
    eprintln!("bench: listing prefix {prefix}");
    let some = list_all(channel.clone(), &prefix).await?;
    let scrape = match &target.http {
        Some(http) => Some(time_scrape(http).await?),
        None => None,
    };
    let (warmup, duration) = (ms(o.warmup), ms(o.duration));
    eprintln!("bench: pair 1k without listing");
    let quiet = load
        .measure(Arm::Pair, Spread::Thousand, warmup, duration, 0, target.pid)
        .await;
    eprintln!("bench: pair 1k while listing every key over and over");
    let end = Instant::now() + warmup + duration;
    let lister = tokio::spawn(list_until(channel, end));
    let busy = load
        .measure(Arm::Pair, Spread::Thousand, warmup, duration, 1, target.pid)
        .await;
    let (listings, pages) = lister.await.context("the listing task failed")??;
    for m in [&quiet, &busy] {
        if m.client_cpu
            .is_some_and(|c| c / f64::from(o.client_threads) >= SATURATED)
        {
            warnings.push(
                "the load generator's CPU was saturated during the listing probe: its p99 \
                 includes the client's own work of decoding the listings"
                    .to_owned(),
            );
            break;
        }
    }
    let per_s = |l: &Listing| l.keys as f64 / l.elapsed.as_secs_f64().max(1e-9);
    let mut text = format!(
        "\nlist every key: {} keys in {} pages, {:.3} s ({} keys/s)\n\
         list prefix {prefix:?}: {} keys matched (1/{:.0} of the fill; {} expected) in {} pages, {:.3} s\n",
        thousands(all.keys as f64),
        all.pages,
        all.elapsed.as_secs_f64(),
        thousands(per_s(&all)),
        thousands(some.keys as f64),
        keys as f64 / some.keys.max(1) as f64,
        thousands(expected as f64),
        some.pages,
        some.elapsed.as_secs_f64()
    );
    if let Some((took, size)) = scrape {
        text.push_str(&format!(
            "GET /metrics: {:.1} ms, {}\n",
            took.as_secs_f64() * 1e3,
            bytes(size as f64)
        ));
    }
    text.push_str(&format!(
        "pair 1k p99: {:.1} µs without listing, {:.1} µs while listing ({} pages, {} full \
         listings; p999 {:.1} / {:.1} µs; {} / {} pairs/s)",
        quiet.percentile_us(99.0),
        busy.percentile_us(99.0),
        pages,
        listings.len(),
        quiet.percentile_us(99.9),
        busy.percentile_us(99.9),
        thousands(quiet.rate()),
        thousands(busy.rate()),
    ));
    let listing_json =
        |l: &Listing| json!({"keys": l.keys, "pages": l.pages, "seconds": l.elapsed.as_secs_f64()});
    let pair_json = |m: &Measurement| {
        json!({
            "rate": m.rate(),
            "p50_us": m.percentile_us(50.0),
            "p99_us": m.percentile_us(99.0),
            "p999_us": m.percentile_us(99.9),
            "client_cpu": m.client_cpu,
            "server_cpu": m.server_cpu,
            "other_cpu": m.other_cpu(),
            "errors": m.tally.errors,
        })
    };
    let figures = json!({
        "page_size": PAGE_SIZE,
        "all": listing_json(&all),
        "prefix": prefix,
        "prefix_expected": expected,
        "prefix_listing": listing_json(&some),
        "metrics_scrape": scrape.map(|(took, size)| json!({"seconds": took.as_secs_f64(), "bytes": size})),
        "pair_without_listing": pair_json(&quiet),
        "pair_while_listing": pair_json(&busy),
        "listings_during_load": listings.iter().map(listing_json).collect::<Vec<_>>(),
        "pages_during_load": pages,
    });
    Ok((text, figures))
}

// ---------------------------------------------------------------------------
// Key-count growth.
// ---------------------------------------------------------------------------

async fn growth_mode(
    o: &Options,
    target: &mut Target,
    keys: u64,
    warnings: &mut Vec<String>,
) -> anyhow::Result<Report> {
    let load = load_open(o, target).await?;
    let measure = |seed: u64| {
        load.measure(
            Arm::Pair,
            Spread::Thousand,
            ms(o.warmup),
            ms(o.duration),
            seed,
            target.pid,
        )
    };
    let mut before = Vec::new();
    for run in 0..o.runs {
        eprintln!(
            "bench: run {}/{}: pair 1k, before the fill",
            run + 1,
            o.runs
        );
        before.push(measure(u64::from(run)).await);
    }
    let memory_before = target.memory().await;
    let have = memory_before.keys.unwrap_or(0);
    let missing = keys.saturating_sub(have);
    eprintln!("bench: filling {missing} keys to reach {keys}");
    let filled = fill(&load, FILL_PREFIX, 0, missing).await;
    if let Some(e) = &filled.first_error {
        warnings.push(format!(
            "fill: {} calls failed, the first with {e}",
            filled.errors
        ));
    }
    let memory_after = target.memory().await;
    let mut after = Vec::new();
    for run in 0..o.runs {
        eprintln!("bench: run {}/{}: pair 1k, after the fill", run + 1, o.runs);
        after.push(measure(u64::from(run)).await);
    }
    target.check_alive()?;
    let (b, a) = (summary(&before), summary(&after));
    let f = |v: &Value, k: &str| v[k].as_f64().unwrap_or(0.0);
    let ratio = f(&a, "p999_us") / f(&b, "p999_us").max(0.001);
    let rows = vec![
        vec![
            "before".to_owned(),
            memory_before
                .keys
                .map_or("?".to_owned(), |k| thousands(k as f64)),
            thousands(f(&b, "rate")),
            format!("{:.1}", f(&b, "p50_us")),
            format!("{:.1}", f(&b, "p99_us")),
            format!("{:.1}", f(&b, "p999_us")),
        ],
        vec![
            "after".to_owned(),
            memory_after
                .keys
                .map_or("?".to_owned(), |k| thousands(k as f64)),
            thousands(f(&a, "rate")),
            format!("{:.1}", f(&a, "p50_us")),
            format!("{:.1}", f(&a, "p99_us")),
            format!("{:.1}", f(&a, "p999_us")),
        ],
    ];
    let (lines, _) = render_table(
        &[
            "WHEN",
            "LIVE KEYS",
            "PAIRS/S",
            "P50 µs",
            "P99 µs",
            "P999 µs",
        ],
        &rows,
    );
    let mut text = lines.join("\n");
    text.push_str(&format!(
        "\n\npair on 1k keys, p999 after / before the fill: x{ratio:.2}\n"
    ));
    text.push_str(&fill_text(&filled, &memory_before, &memory_after));
    text.push_str(&memory_line(&memory_after));
    let figures = json!({
        "before": b,
        "after": a,
        "p999_ratio": ratio,
        "fill": fill_json(&filled, &memory_before, &memory_after),
        "memory": memory_after.json(),
    });
    Ok(("growth", text, figures))
}

// ---------------------------------------------------------------------------
// Numbers.
// ---------------------------------------------------------------------------

/// The median; 0 for no values.
/// The medians across runs of a measurement's rate and percentiles, and
/// its errors in all.
fn summary(ms: &[Measurement]) -> Value {
    let p = |q: f64| median(ms.iter().map(|m| m.percentile_us(q)).collect());
    json!({
        "rate": median(ms.iter().map(Measurement::rate).collect()),
        "p50_us": p(50.0),
        "p99_us": p(99.0),
        "p999_us": p(99.9),
        "errors": ms.iter().map(|m| m.tally.errors).sum::<u64>(),
    })
}

fn median(mut values: Vec<f64>) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

/// A count with thousands separators: `61,234`.
fn thousands(value: f64) -> String {
    let digits = format!("{:.0}", value.max(0.0));
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A size for people: `812 B`, `3.4 KiB`, `123.4 MiB`.
fn bytes(value: f64) -> String {
    let sign = if value < 0.0 { "-" } else { "" };
    let v = value.abs();
    if v < 1024.0 {
        format!("{sign}{v:.0} B")
    } else if v < 1024.0 * 1024.0 {
        format!("{sign}{:.1} KiB", v / 1024.0)
    } else if v < 1024.0 * 1024.0 * 1024.0 {
        format!("{sign}{:.1} MiB", v / (1024.0 * 1024.0))
    } else {
        format!("{sign}{:.2} GiB", v / (1024.0 * 1024.0 * 1024.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_well() {
        assert_eq!(thousands(0.0), "0");
        assert_eq!(thousands(999.4), "999");
        assert_eq!(thousands(61_234.0), "61,234");
        assert_eq!(thousands(1_000_000.0), "1,000,000");
        assert_eq!(bytes(812.0), "812 B");
        assert_eq!(bytes(-2048.0), "-2.0 KiB");
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(Vec::new()), 0.0);
    }
}

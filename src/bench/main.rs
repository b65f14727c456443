//! `fusebox-bench`: the project's own load tool. It drives a fusebox
//! server over gRPC (one it starts itself from the `fusebox` binary next
//! to it, or `--target`), so that anyone can reproduce the project's
//! figures: calls per second against the no-op `grpc.health` baseline,
//! latency percentiles, and the server's memory per key.
//!
//! Modes:
//! - (none): the arms (`health`, `acquire`, `pair`, and the
//!   many-decisions-per-request `stream` and `batch`, `throttlecrab`
//!   against a throttlecrab-server, and Envoy's rate-limit check, `rls` on
//!   fusebox and `ratelimit` on envoyproxy/ratelimit) over the key spreads (`hot`, `1k`,
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
//! - `beside`: a server on a store beside an embedded one.
//! - `rls-conformance`: one sequence of Envoy rate-limit checks sent to
//!   fusebox and to envoyproxy/ratelimit, every answer side by side.
//! - `retry-storm`: Acquires on one key whose policy has a retry budget,
//!   a share of them retries (`attempt = 2`): first attempts, retries
//!   granted and retries denied `retry_budget`, second by second,
//!   embedded or `--store`.
//! - `hang`: a dependency that starts hanging, on a key whose policy has
//!   `breaker.slow`: the time from the hang's start to the breaker's
//!   opening through in-flight slow calls, against the instant S3 says,
//!   embedded or `--store`.
//! - `adaptive-limit`: callers on one key with an adaptive limiter in
//!   front of a simulated dependency whose latency doubles above a number
//!   of calls in flight: the limit and the latency second by second, as a
//!   table, a CSV and an SVG plot, embedded or `--store`.
//! - `redis-cpu`: the fusebox Redis module against a Lua script doing the
//!   same work, straight on a Redis or Redis Cluster (no fusebox server):
//!   decisions/s, latency and Redis CPU per decision.
//!
//! Layout, each module using only those listed before it: [`spread`],
//! [`throttlecrab`], [`envoy_rls`] and [`channel`] (connections, with the credentials
//! and TLS of `fusebox-cli`); [`target`] (the server under test); [`load`]
//! (the callers and their figures); [`numbers`]; [`options`] (the shared
//! flags); [`mod@report`]; then one module per mode. This file parses the
//! command line and runs the mode asked for.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod adaptive;
mod arms;
mod attack;
mod beside;
mod channel;
mod conformance;
mod envoy_rls;
mod fill;
mod growth;
mod hang;
mod load;
mod numbers;
mod options;
mod redis_cpu;
mod report;
mod spread;
mod storm;
mod target;
mod throttlecrab;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use anyhow::bail;
use clap::Parser;

use crate::fill::FILL_PREFIX;
use crate::numbers::listed;
use crate::options::Options;
use crate::report::report;
use crate::target::{parse_cpu_list, Target};

/// fusebox-bench: measure a fusebox server under load (README, "Measuring it").
#[derive(Parser, Debug)]
#[command(name = "fusebox-bench", version)]
struct Cli {
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
        /// Pad each key's name with `.` to this many bytes (at most 256,
        /// the longest a key may be): what long names cost.
        #[arg(long, value_name = "BYTES", value_parser = clap::value_parser!(u16).range(1..=256))]
        key_bytes: Option<u16>,
        /// After the fill, take one ticket on each key and leave it live
        /// with this lease (e.g. 10m): the memory per ticket.
        #[arg(long, value_name = "LEASE", value_parser = fusebox::domain::policy::parse_duration)]
        hold_tickets: Option<u64>,
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
    /// server itself, with `[auth]` and the two tokens.
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
    /// One fixed sequence of Envoy rate-limit checks (domain
    /// `conformance`) sent to the --target fusebox and to the --ratelimit
    /// envoyproxy/ratelimit server in turn, both configured alike
    /// (scripts/bench-rls): every answer side by side, and every one that
    /// differs named. Starts no server.
    RlsConformance,
    /// A retry storm on one key (`storm/dependency`) whose policy has a
    /// retry budget: the callers' Acquires, `--retry-share` of them retries
    /// (`attempt = 2`), closed loop, every ticket completed; reports first
    /// attempts, retries granted and retries denied `retry_budget`, second
    /// by second after the `--warmup` (give it the budget's window). Starts
    /// the server itself with the budget on `storm/*` (embedded, or on
    /// `--store`), unless `--target` (whose server must have it).
    RetryStorm {
        /// The share of Acquires sent as retries, in [0, 1): 0.833334 is 5
        /// retries per first attempt.
        #[arg(long, default_value_t = 0.833334, value_parser = parse_share)]
        retry_share: f64,
        /// The budget's ratio, in (0, 1].
        #[arg(long, default_value_t = 0.2)]
        budget_ratio: f64,
        /// The budget's min_per_second.
        #[arg(long, default_value_t = 3)]
        budget_min_per_second: u32,
        /// The budget's window, at least 1s and a multiple of 10ms.
        #[arg(long, default_value = "10s", value_parser = fusebox::domain::policy::parse_duration)]
        budget_window: u64,
        /// Start the server on this store (redis://HOST:PORT or
        /// redis-cluster://H1:P1,...) instead of embedded.
        #[arg(long, value_name = "URL")]
        store: Option<String>,
    },
    /// A dependency that starts hanging (S2, S3): callers run calls of
    /// `--call-time` on one key whose policy has `breaker.slow`, completing
    /// each SUCCESS; after `--warmup` every call hangs (never completes).
    /// Reports, per run, the time from the hang's start to the breaker's
    /// opening (the key's phase_changed_at, and GetKey polled) against the
    /// instant the `--minimum-throughput`-th hung call is `--slow-duration`
    /// old. Starts the server itself (embedded, or on `--store`).
    Hang {
        /// `breaker.slow.duration`.
        #[arg(long, default_value = "2s", value_parser = fusebox::domain::policy::parse_duration)]
        slow_duration: u64,
        /// `breaker.slow.ratio`, in (0, 1].
        #[arg(long, default_value_t = 0.5)]
        slow_ratio: f64,
        /// `breaker.sampling_window`: shorter than the slow duration, so
        /// that no outcome from before the hang counts when calls turn slow.
        #[arg(long, default_value = "1s", value_parser = fusebox::domain::policy::parse_duration)]
        sampling_window: u64,
        /// `breaker.minimum_throughput`: the hung calls that must be slow
        /// (at most the callers, `--connections` x `--in-flight`).
        #[arg(long, default_value_t = 16)]
        minimum_throughput: u32,
        /// How long each call takes while the dependency answers.
        #[arg(long, default_value = "20ms", value_parser = fusebox::domain::policy::parse_duration)]
        call_time: u64,
        /// Start the server on this store (redis://HOST:PORT or
        /// redis-cluster://H1:P1,...) instead of embedded.
        #[arg(long, value_name = "URL")]
        store: Option<String>,
    },
    /// An adaptive concurrency limiter on one key (`adaptive/dependency`)
    /// in front of a simulated dependency that answers in
    /// `--base-latency` with up to `--knee` calls inside and twice as slowly
    /// above (from `--shift` on, above `--knee-later`): every caller sends
    /// Acquires in a closed loop, runs each granted call against the
    /// dependency and completes it; each second the tool reads the key's
    /// `adaptive_limit` and the mean latency. Starts the server itself with
    /// the limiter on `adaptive/*` (embedded, or on `--store`), unless
    /// `--target` (whose server must have it).
    AdaptiveLimit {
        /// The limiter's min.
        #[arg(long, default_value_t = 1)]
        min: u32,
        /// The limiter's max.
        #[arg(long, default_value_t = 200)]
        max: u32,
        /// The limiter's initial.
        #[arg(long, default_value_t = 10)]
        initial: u32,
        /// The dependency's latency below its knee.
        #[arg(long, default_value = "20ms", value_parser = fusebox::domain::policy::parse_duration)]
        base_latency: u64,
        /// Calls inside the dependency above which every new call takes
        /// twice as long.
        #[arg(long, default_value_t = 40)]
        knee: usize,
        /// The knee from `--shift` on (the dependency loses capacity).
        #[arg(long, default_value_t = 20)]
        knee_later: usize,
        /// When the knee moves, from the start of the measurement
        /// (default: half the `--duration`).
        #[arg(long, value_parser = fusebox::domain::policy::parse_duration)]
        shift: Option<u64>,
        /// Write the samples as CSV here.
        #[arg(long, value_name = "PATH")]
        csv: Option<std::path::PathBuf>,
        /// Write the plot of the limit and the latency as SVG here.
        #[arg(long, value_name = "PATH")]
        svg: Option<std::path::PathBuf>,
        /// Start the server on this store (redis://HOST:PORT or
        /// redis-cluster://H1:P1,...) instead of embedded.
        #[arg(long, value_name = "URL")]
        store: Option<String>,
    },
}

/// A share in [0, 1).
fn parse_share(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(share) if (0.0..1.0).contains(&share) => Ok(share),
        _ => Err(format!(
            "must be a number from 0 up to (not including) 1, not {text:?}"
        )),
    }
}

fn main() -> std::process::ExitCode {
    match bench(Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Runs the tool on a runtime of its own: `--client-threads` workers,
/// pinned to `--client-cpus`.
fn bench(cli: Cli) -> anyhow::Result<()> {
    // The attack starts its own server, whose caller token is the load's.
    let attack_tokens = match cli.mode {
        Some(Mode::Attack { .. }) => Some(attack::Tokens::new()?),
        _ => None,
    };
    let token = match &attack_tokens {
        Some(tokens) => Some(tokens.caller.as_str()),
        None => cli.options.token.as_deref(),
    };
    channel::set_credentials(fusebox_cli::Credentials::of(token)?);
    let cpus = match &cli.options.client_cpus {
        Some(list) => {
            Some(parse_cpu_list(list).map_err(|e| anyhow::anyhow!("--client-cpus: {e}"))?)
        }
        None => None,
    };
    if let Some(list) = &cli.options.server_cpus {
        parse_cpu_list(list).map_err(|e| anyhow::anyhow!("--server-cpus: {e}"))?;
    }
    let threads = usize::from(cli.options.client_threads);
    // Threads inherit their creator's CPUs: pin this one first, then each
    // worker in turn.
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
    runtime.block_on(run(cli, cpus, attack_tokens))
}

/// Pins the calling thread to `cpu`.
fn pin(cpu: usize) -> anyhow::Result<()> {
    if core_affinity::set_for_current(core_affinity::CoreId { id: cpu }) {
        Ok(())
    } else {
        bail!("--client-cpus: cannot pin the load generator to CPU {cpu}")
    }
}

/// Runs the mode asked for and reports it.
async fn run(
    cli: Cli,
    client_cpus: Option<Vec<usize>>,
    attack_tokens: Option<attack::Tokens>,
) -> anyhow::Result<()> {
    let o = &cli.options;
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
        let tls = fusebox_cli::tls_config_of(
            o.tls_ca.as_deref(),
            o.tls_cert.as_deref(),
            o.tls_key.as_deref(),
            o.tls_server_name.as_deref(),
        )?;
        channel::set_tls(tls);
    }
    if let Some(Mode::RedisCpu {
        store,
        permits,
        pipeline,
        lua_only,
        redis_arms,
        live_tickets,
    }) = &cli.mode
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
    }) = cli.mode.clone()
    {
        anyhow::ensure!(
            o.target.is_none() && o.config.is_none(),
            "fusebox-bench attack starts its server itself, with [auth] and two tokens: leave out --target and --config"
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
    if let Some(Mode::RlsConformance) = &cli.mode {
        let (Some(fusebox), Some(ratelimit)) = (o.target.as_deref(), o.ratelimit.as_deref()) else {
            bail!("fusebox-bench rls-conformance needs --target (fusebox) and --ratelimit (envoyproxy/ratelimit)");
        };
        let (mode, text, figures) = conformance::conformance_mode(fusebox, ratelimit).await?;
        return report(o, None, mode, &text, figures, &warnings);
    }
    if let Some(Mode::RetryStorm {
        retry_share,
        budget_ratio,
        budget_min_per_second,
        budget_window,
        store,
    }) = cli.mode.clone()
    {
        let budget = storm::Budget {
            ratio: budget_ratio,
            min_per_second: budget_min_per_second,
            window_ms: budget_window,
        };
        let mut target = own_server(
            o,
            "retry-storm",
            "the budget on storm/*; set it with --budget-ratio, --budget-min-per-second and --budget-window",
            &storm::config(&budget),
            store.as_deref(),
        )
        .await?;
        let outcome = storm::storm_mode(o, &mut target, retry_share, &budget).await;
        let stopped = target.stop().await;
        let (mode, text, figures) = outcome?;
        stopped?;
        return report(o, Some(&target), mode, &text, figures, &warnings);
    }
    if let Some(Mode::Hang {
        slow_duration,
        slow_ratio,
        sampling_window,
        minimum_throughput,
        call_time,
        store,
    }) = cli.mode.clone()
    {
        anyhow::ensure!(
            o.target.is_none() && o.config.is_none(),
            "fusebox-bench hang starts its server itself with the policy on hang/*: leave out --target and --config"
        );
        let h = hang::Hang {
            slow_ms: slow_duration,
            slow_ratio,
            window_ms: sampling_window,
            minimum_throughput,
            call_ms: call_time,
        };
        let mut target = own_server(
            o,
            "hang",
            "the policy on hang/*",
            &hang::config(&h),
            store.as_deref(),
        )
        .await?;
        let outcome = hang::hang_mode(o, &mut target, &h).await;
        let stopped = target.stop().await;
        let (mode, text, figures) = outcome?;
        stopped?;
        return report(o, Some(&target), mode, &text, figures, &warnings);
    }
    if let Some(Mode::AdaptiveLimit {
        min,
        max,
        initial,
        base_latency,
        knee,
        knee_later,
        shift,
        csv,
        svg,
        store,
    }) = cli.mode.clone()
    {
        let limits = adaptive::Limits { min, max, initial };
        let dependency = adaptive::Dependency {
            base_ms: base_latency.max(1),
            knee,
            knee_later,
            shift_ms: shift.unwrap_or(o.duration / 2),
        };
        let mut target = own_server(
            o,
            "adaptive-limit",
            "the limiter on adaptive/*; set it with --min, --max and --initial",
            &adaptive::config(&limits),
            store.as_deref(),
        )
        .await?;
        let outputs = adaptive::Outputs { csv, svg };
        let outcome = adaptive::adaptive_mode(o, &mut target, &limits, &dependency, &outputs).await;
        let stopped = target.stop().await;
        let (mode, text, figures) = outcome?;
        stopped?;
        return report(o, Some(&target), mode, &text, figures, &warnings);
    }
    if let Some(Mode::Beside { store }) = &cli.mode {
        anyhow::ensure!(
            o.target.is_none(),
            "fusebox-bench beside starts both servers itself: leave out --target"
        );
        let (mode, text, figures) = beside::beside_mode(o, store, &mut warnings).await?;
        return report(o, None, mode, &text, figures, &warnings);
    }
    let mut target = match &o.target {
        Some(url) => {
            let scheme = if o.tls_ca.is_some() { "https" } else { "http" };
            Target::existing(url, o.http.as_deref(), scheme)
        }
        None => {
            Target::start(
                &o.server_bin()?,
                o.config.as_deref(),
                o.server_cpus.as_deref(),
            )
            .await?
        }
    };
    eprintln!(
        "bench: server {} (http {}){}",
        target.grpcs.join(", "),
        listed(&target.https, "unknown"),
        if target.pid.is_some() {
            " started by the tool"
        } else {
            ""
        }
    );
    let outcome = match cli.mode {
        None => arms::arms_mode(o, &mut target, &mut warnings).await,
        Some(Mode::Fill {
            keys,
            no_listing,
            as_1m_spread,
            prefix_digits,
            key_bytes,
            hold_tickets,
        }) => {
            let listing = (!no_listing).then_some(prefix_digits);
            let prefix = if as_1m_spread {
                "bench/1m/"
            } else {
                FILL_PREFIX
            };
            let shape = fill::Shape {
                key_bytes: key_bytes.map(usize::from),
                hold: hold_tickets,
                ..fill::Shape::of(prefix)
            };
            fill::fill_mode(o, &mut target, keys, shape, listing, &mut warnings).await
        }
        Some(Mode::Growth { keys }) => {
            growth::growth_mode(o, &mut target, keys, &mut warnings).await
        }
        Some(
            Mode::RedisCpu { .. }
            | Mode::Beside { .. }
            | Mode::Attack { .. }
            | Mode::RetryStorm { .. }
            | Mode::Hang { .. }
            | Mode::AdaptiveLimit { .. }
            | Mode::RlsConformance,
        ) => {
            unreachable!("measured above, with servers of their own")
        }
    };
    let stopped = target.stop().await;
    let (mode, text, figures) = outcome?;
    stopped?;
    report(o, Some(&target), mode, &text, figures, &warnings)
}

/// The server a mode with a config of its own runs against: `--target`
/// (which must have that config already), or one the tool starts with
/// `config` (embedded, or on `store`).
async fn own_server(
    o: &Options,
    mode: &str,
    what: &str,
    config: &str,
    store: Option<&str>,
) -> anyhow::Result<Target> {
    let target = match &o.target {
        Some(url) => {
            anyhow::ensure!(
                store.is_none(),
                "fusebox-bench {mode} --store starts its server itself: leave out --target"
            );
            let scheme = if o.tls_ca.is_some() { "https" } else { "http" };
            Target::existing(url, o.http.as_deref(), scheme)
        }
        None => {
            anyhow::ensure!(
                o.config.is_none(),
                "fusebox-bench {mode} writes its server's config itself ({what}): leave out --config"
            );
            let path =
                std::env::temp_dir().join(format!("fusebox-{mode}-{}.toml", std::process::id()));
            std::fs::write(&path, config)
                .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
            let more: Vec<String> = match store {
                Some(url) => vec!["--store".to_owned(), url.to_owned()],
                None => Vec::new(),
            };
            let started = Target::start_with(
                &o.server_bin()?,
                Some(&path),
                o.server_cpus.as_deref(),
                &more,
            )
            .await;
            let _ = std::fs::remove_file(&path);
            started?
        }
    };
    eprintln!(
        "bench: server {}{}",
        target.grpcs.join(", "),
        store.map_or(String::new(), |s| format!(", on {s}"))
    );
    Ok(target)
}

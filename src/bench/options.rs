//! The settings every mode shares (global flags: they go before or after
//! the mode), and what follows from them.

use std::path::PathBuf;

use fusebox::domain::policy::parse_duration as parse_duration_flag;

use crate::load::{Arm, Load};
use crate::spread::Spread;
use crate::target::{self, Target};

/// Settings every mode shares.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct Options {
    /// A running server's gRPC address (http://ADDR), or several, comma
    /// separated (http://A,http://B): the --connections are spread over
    /// them round-robin. By default the tool starts one server itself, on
    /// free ports, and stops it at the end.
    #[arg(long, global = true, value_name = "URL")]
    pub(crate) target: Option<String>,
    /// Call the --target server over TLS, trusting the CAs in this PEM
    /// file (its /metrics are read only over plain HTTP).
    #[arg(long, global = true, value_name = "FILE", requires = "target")]
    pub(crate) tls_ca: Option<PathBuf>,
    /// With mutual TLS: the load generator's certificate chain (PEM).
    #[arg(long, global = true, value_name = "FILE", requires = "tls_ca")]
    pub(crate) tls_cert: Option<PathBuf>,
    /// With mutual TLS: the load generator's private key (PEM).
    #[arg(long, global = true, value_name = "FILE", requires = "tls_ca")]
    pub(crate) tls_key: Option<PathBuf>,
    /// The name the server's certificate must have, when it is not the
    /// host of --target.
    #[arg(long, global = true, value_name = "NAME", requires = "tls_ca")]
    pub(crate) tls_server_name: Option<String>,
    /// The HTTP address of the --target server, to read its /metrics; with
    /// several servers, a comma-separated list: memory and live keys are
    /// summed over them, while the fill mode's /metrics scrape, listings
    /// and stalled watchers use the first server only.
    #[arg(long, global = true, value_name = "ADDR", requires = "target")]
    pub(crate) http: Option<String>,
    /// A config file for the server the tool starts (default: the
    /// built-in policy, with max_keys and max_tickets raised to 4,000,000).
    #[arg(long, global = true, value_name = "FILE", conflicts_with = "target")]
    pub(crate) config: Option<PathBuf>,
    /// The fusebox binary the tool starts as the server under test
    /// (default: the `fusebox` next to this tool, as cargo builds both
    /// into the same `target/<profile>/`).
    #[arg(long, global = true, value_name = "PATH", conflicts_with = "target")]
    pub(crate) server_bin: Option<PathBuf>,
    /// Pin the server the tool starts to these CPUs (taskset -c LIST).
    #[arg(long, global = true, value_name = "LIST", conflicts_with = "target")]
    pub(crate) server_cpus: Option<String>,
    /// Pin the load generator to these CPUs (its threads round-robin).
    #[arg(long, global = true, value_name = "LIST")]
    pub(crate) client_cpus: Option<String>,
    /// The bearer token to call with, when the server has `[auth]` (the
    /// server the tool starts inherits FUSEBOX_TOKEN, for a config whose
    /// token has `env = "FUSEBOX_TOKEN"`).
    #[arg(long, global = true, env = "FUSEBOX_TOKEN", hide_env_values = true)]
    pub(crate) token: Option<String>,
    /// Worker threads of the load generator's runtime.
    #[arg(long, global = true, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    pub(crate) client_threads: u16,
    /// HTTP/2 connections (separate channels) the load is spread over.
    #[arg(long, global = true, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..))]
    pub(crate) connections: u16,
    /// Concurrent callers per connection (closed loop: each calls again as
    /// soon as its answer arrives).
    #[arg(long, global = true, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..))]
    pub(crate) in_flight: u16,
    /// Load before each measurement that is not counted, e.g. 2s.
    #[arg(long, global = true, default_value = "2s", value_parser = parse_duration_flag)]
    pub(crate) warmup: u64,
    /// How long each measurement lasts, e.g. 5s.
    #[arg(long, global = true, default_value = "5s", value_parser = parse_positive_duration)]
    pub(crate) duration: u64,
    /// Runs; the figures reported are the medians across runs.
    #[arg(long, global = true, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..))]
    pub(crate) runs: u16,
    /// The arms to measure, comma separated (health is always measured:
    /// it is the baseline of the ratios).
    #[arg(
        long,
        global = true,
        value_enum,
        value_delimiter = ',',
        default_value = "health,acquire,pair"
    )]
    pub(crate) arms: Vec<Arm>,
    /// The key spreads, comma separated.
    #[arg(
        long,
        global = true,
        value_enum,
        value_delimiter = ',',
        default_value = "hot,1k,1m,zipf"
    )]
    pub(crate) spreads: Vec<Spread>,
    /// Also measure `acquire` with K Admin.Watch streams open and never
    /// read (each on its own connection), in every run.
    #[arg(long, global = true, default_value_t = 0, value_name = "K")]
    pub(crate) stalled_watchers: u32,
    /// The `stream` arm: frames per Decide message, and decisions in flight
    /// per stream (one stream per connection); the `batch` arm: items per
    /// batch.
    #[arg(long, global = true, default_value_t = 100, value_parser = clap::value_parser!(u16).range(1..=1000))]
    pub(crate) frames: u16,
    /// Pace the `pair` and `stream` arms at this many decisions per second
    /// in all (open loop: each caller on a fixed schedule that does not
    /// slip when it falls behind); the other arms stay closed loop.
    #[arg(long, global = true, value_name = "PER_S")]
    pub(crate) rate: Option<f64>,
    /// The gRPC address (http://ADDR) of a throttlecrab-server, for the
    /// `throttlecrab` arm.
    #[arg(long, global = true, value_name = "URL")]
    pub(crate) throttlecrab: Option<String>,
    /// The gRPC address (http://ADDR) of an envoyproxy/ratelimit server,
    /// for the `ratelimit` arm (configured like fusebox's `rls` arm: see
    /// scripts/bench-rls).
    #[arg(long, global = true, value_name = "URL")]
    pub(crate) ratelimit: Option<String>,
    /// The processes of the peer server (throttlecrab-server, or
    /// envoyproxy/ratelimit and its redis-server), comma separated: their
    /// CPU is the peer arms' server CPU.
    #[arg(long, global = true, value_name = "PIDS", value_delimiter = ',')]
    pub(crate) peer_pids: Vec<u32>,
    /// With --target: the processes whose CPU is the server's (the fusebox
    /// server, and with --store its redis-servers), comma separated.
    #[arg(
        long,
        global = true,
        value_name = "PIDS",
        value_delimiter = ',',
        requires = "target"
    )]
    pub(crate) target_pids: Vec<u32>,
    /// Write every figure, the command line and the git commit to FILE.
    #[arg(long, global = true, value_name = "FILE")]
    pub(crate) json: Option<PathBuf>,
}

/// A duration with a unit, more than zero.
fn parse_positive_duration(text: &str) -> Result<u64, String> {
    match parse_duration_flag(text)? {
        0 => Err("must be more than 0, e.g. 300ms or 5s".to_owned()),
        ms => Ok(ms),
    }
}

impl Options {
    /// The fusebox binary to start servers from: `--server-bin`, or the
    /// `fusebox` next to this tool; an error that says what to do when it
    /// is not there.
    pub(crate) fn server_bin(&self) -> anyhow::Result<PathBuf> {
        target::server_bin(self.server_bin.as_deref())
    }

    /// A load on `target`'s servers: `--connections` connections to them
    /// in turn, `--in-flight` callers on each.
    pub(crate) async fn load_on(&self, target: &Target) -> anyhow::Result<Load> {
        Load::open(
            &target.grpcs,
            usize::from(self.connections),
            usize::from(self.in_flight),
        )
        .await
    }
}

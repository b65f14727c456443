//! The closed-loop load: `connections` x `in_flight` callers, each calling
//! again as soon as its answer arrives, each with its own histogram, merged
//! at the end.
//!
//! A caller counts and times a call when it started after the warm-up and
//! ended before the end of the window; calls that straddle either edge are
//! not counted (at tens of microseconds a call, a negligible loss over
//! seconds).

use std::time::{Duration, Instant};

use anyhow::Context;
use fusebox::proto::v1 as pb;
use hdrhistogram::Histogram;
use tonic::transport::Endpoint;

pub(crate) use crate::client::Conn as Channel;
use crate::client::Credentials;

/// The credentials every connection of the tool sends (`--token`).
static CREDENTIALS: std::sync::OnceLock<Credentials> = std::sync::OnceLock::new();

/// Sets the credentials of the tool's connections, once, before any.
pub(crate) fn set_credentials(credentials: Credentials) {
    let _ = CREDENTIALS.set(credentials);
}
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

use super::spread::{KeyPicker, Spread};
use super::target::{cpu_time, machine_busy_time, own_cpu_time};

type Fusebox = pb::fusebox_client::FuseboxClient<Channel>;

/// A caller that fails this many times in a row gives up (the server is
/// gone or refuses everything; the errors are reported).
const GIVE_UP_AFTER: u32 = 1_000;

/// What each call of a load does.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Arm {
    /// `grpc.health.v1.Health/Check` on the same server: the cost of a
    /// gRPC call that does nothing, the baseline of every ratio.
    Health,
    /// `Acquire`, then `Complete(SUCCESS)` of its ticket: two calls, each
    /// counted; the latency figures are Acquire's (Complete's are in the
    /// JSON).
    Acquire,
    /// `Acquire` + `Complete(SUCCESS)` as one sample: pairs per second, and
    /// the latency of the pair.
    Pair,
}

impl Arm {
    /// Every arm, in the order tables list them.
    pub(crate) const ALL: [Arm; 3] = [Arm::Health, Arm::Acquire, Arm::Pair];

    /// The name flags and reports use.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Arm::Health => "health",
            Arm::Acquire => "acquire",
            Arm::Pair => "pair",
        }
    }

    /// What its rate counts.
    pub(crate) fn unit(self) -> &'static str {
        match self {
            Arm::Health | Arm::Acquire => "calls/s",
            Arm::Pair => "pairs/s",
        }
    }
}

/// A latency histogram in nanoseconds, from 100 ns to a minute, to 3
/// significant digits.
pub(crate) fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(100, 60_000_000_000, 3).expect("valid histogram bounds")
}

/// The connections of a load, and how many callers share each.
pub(crate) struct Load {
    /// One HTTP/2 connection each.
    pub(crate) channels: Vec<Channel>,
    /// Concurrent callers per connection.
    pub(crate) in_flight: usize,
}

/// The client side of TLS for `https://` targets (`--tls-ca` and the
/// other `--tls-*` flags), set once at start.
pub(crate) static TLS: std::sync::OnceLock<tonic::transport::ClientTlsConfig> =
    std::sync::OnceLock::new();

/// A new HTTP/2 connection to `url`.
pub(crate) async fn connect(url: &str) -> anyhow::Result<Channel> {
    let mut endpoint =
        Endpoint::from_shared(url.to_owned()).with_context(|| format!("{url}: not an address"))?;
    if let (Some(tls), true) = (TLS.get(), url.starts_with("https://")) {
        endpoint = endpoint
            .tls_config(tls.clone())
            .context("the TLS settings cannot be used")?;
    }
    endpoint
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .with_context(|| format!("cannot reach fusebox at {url}"))
        .map(|channel| {
            let credentials = CREDENTIALS.get().cloned().unwrap_or(Credentials::NONE);
            tonic::service::interceptor::InterceptedService::new(channel, credentials)
        })
}

impl Load {
    /// Opens `connections` connections, to the `urls` in turn
    /// (round-robin: with 3 servers and 6 connections, 2 to each).
    pub(crate) async fn open(
        urls: &[String],
        connections: usize,
        in_flight: usize,
    ) -> anyhow::Result<Load> {
        anyhow::ensure!(!urls.is_empty(), "no server address to connect to");
        let mut channels = Vec::with_capacity(connections);
        for i in 0..connections {
            channels.push(connect(&urls[i % urls.len()]).await?);
        }
        Ok(Load {
            channels,
            in_flight,
        })
    }

    /// Runs `arm` on `spread` (ignored by `health`) for `warmup`, then
    /// measures it for `duration`. `seed` varies the keys run by run.
    pub(crate) async fn measure(
        &self,
        arm: Arm,
        spread: Spread,
        warmup: Duration,
        duration: Duration,
        seed: u64,
        server_pid: Option<u32>,
    ) -> Measurement {
        let begin = Instant::now() + warmup;
        let end = begin + duration;
        let mut tasks = tokio::task::JoinSet::new();
        let mut n = 0u64;
        for channel in &self.channels {
            for _ in 0..self.in_flight {
                n += 1;
                let caller = Caller {
                    window: (begin, end),
                    picker: KeyPicker::new(spread, seed.wrapping_mul(0x9e37_79b9).wrapping_add(n)),
                    tally: Tally::new(),
                };
                let channel = channel.clone();
                tasks.spawn(async move {
                    match arm {
                        Arm::Health => caller.health(channel).await,
                        Arm::Acquire => caller.acquire(channel, false).await,
                        Arm::Pair => caller.acquire(channel, true).await,
                    }
                });
            }
        }
        // The client's CPU time over the measured window only.
        tokio::time::sleep_until(begin.into()).await;
        let server_stat = server_pid.map(|pid| format!("/proc/{pid}/stat"));
        let server_time = || server_stat.as_deref().and_then(cpu_time);
        let cpu_begin = (own_cpu_time(), server_time(), machine_busy_time());
        tokio::time::sleep_until(end.into()).await;
        let cpu_end = (own_cpu_time(), server_time(), machine_busy_time());
        let mut total = Tally::new();
        while let Some(done) = tasks.join_next().await {
            if let Ok(tally) = done {
                total.merge(&tally);
            }
        }
        let share = |a: Option<Duration>, b: Option<Duration>| {
            Some(b?.saturating_sub(a?).as_secs_f64() / duration.as_secs_f64())
        };
        Measurement {
            duration,
            tally: total,
            client_cpu: share(cpu_begin.0, cpu_end.0),
            server_cpu: share(cpu_begin.1, cpu_end.1),
            machine_cpu: share(cpu_begin.2, cpu_end.2),
        }
    }
}

/// What one caller, or a whole load, counted.
pub(crate) struct Tally {
    /// Samples in the window: calls, or pairs for `pair`.
    pub(crate) samples: u64,
    /// Latency of each sample (for `acquire`, of the Acquire).
    pub(crate) latency: Histogram<u64>,
    /// For `acquire`: latency of each Complete.
    pub(crate) complete: Histogram<u64>,
    /// Calls that failed with a gRPC status.
    pub(crate) errors: u64,
    /// Acquires answered with no ticket (blocked, refused, denied).
    pub(crate) not_granted: u64,
    /// The first error, in words.
    pub(crate) first_error: Option<String>,
}

impl Tally {
    fn new() -> Tally {
        Tally {
            samples: 0,
            latency: histogram(),
            complete: histogram(),
            errors: 0,
            not_granted: 0,
            first_error: None,
        }
    }

    fn merge(&mut self, other: &Tally) {
        self.samples += other.samples;
        // Same bounds on both sides: adding cannot fail.
        let _ = self.latency.add(&other.latency);
        let _ = self.complete.add(&other.complete);
        self.errors += other.errors;
        self.not_granted += other.not_granted;
        if self.first_error.is_none() {
            self.first_error.clone_from(&other.first_error);
        }
    }

    fn error(&mut self, status: &tonic::Status) {
        self.errors += 1;
        if self.first_error.is_none() {
            self.first_error = Some(format!("{:?}: {}", status.code(), status.message()));
        }
    }
}

/// One closed-loop caller.
struct Caller {
    /// Calls that start at or after `.0` and end before `.1` are counted;
    /// the caller stops at `.1`.
    window: (Instant, Instant),
    picker: KeyPicker,
    tally: Tally,
}

impl Caller {
    fn counts(&self, started: Instant, ended: Instant) -> bool {
        started >= self.window.0 && ended < self.window.1
    }

    async fn health(mut self, channel: Channel) -> Tally {
        let mut client = HealthClient::new(channel);
        let mut failures = 0;
        loop {
            let started = Instant::now();
            let result = client
                .check(HealthCheckRequest {
                    service: String::new(),
                })
                .await;
            let ended = Instant::now();
            if ended >= self.window.1 {
                return self.tally;
            }
            match result {
                Ok(_) => {
                    failures = 0;
                    if self.counts(started, ended) {
                        self.tally.samples += 1;
                        record(&mut self.tally.latency, started, ended);
                    }
                }
                Err(status) => {
                    self.tally.error(&status);
                    failures += 1;
                    if failures >= GIVE_UP_AFTER {
                        return self.tally;
                    }
                }
            }
        }
    }

    /// The `acquire` arm (`pair` false: two samples per loop, each call
    /// timed on its own) or the `pair` arm (one sample per loop).
    async fn acquire(mut self, channel: Channel, pair: bool) -> Tally {
        let mut client = Fusebox::new(channel);
        let mut failures = 0;
        loop {
            let key = self.picker.next_key().to_owned();
            let started = Instant::now();
            let acquired = client
                .acquire(pb::AcquireRequest {
                    key,
                    permits: None,
                    max_wait: None,
                    lease: None,
                })
                .await;
            let acquired_at = Instant::now();
            if acquired_at >= self.window.1 {
                return self.tally;
            }
            let ticket = match acquired {
                Ok(answer) => answer.into_inner().ticket,
                Err(status) => {
                    self.tally.error(&status);
                    failures += 1;
                    if failures >= GIVE_UP_AFTER {
                        return self.tally;
                    }
                    continue;
                }
            };
            if ticket.is_empty() {
                self.tally.not_granted += 1;
                if self.counts(started, acquired_at) {
                    self.tally.samples += 1;
                    record(&mut self.tally.latency, started, acquired_at);
                }
                continue;
            }
            if !pair && self.counts(started, acquired_at) {
                self.tally.samples += 1;
                record(&mut self.tally.latency, started, acquired_at);
            }
            let completed = client
                .complete(pb::CompleteRequest {
                    ticket,
                    outcome: pb::Outcome::Success as i32,
                })
                .await;
            let ended = Instant::now();
            if ended >= self.window.1 {
                return self.tally;
            }
            match completed {
                Ok(_) => {
                    failures = 0;
                    if pair {
                        if self.counts(started, ended) {
                            self.tally.samples += 1;
                            record(&mut self.tally.latency, started, ended);
                        }
                    } else if self.counts(acquired_at, ended) {
                        self.tally.samples += 1;
                        record(&mut self.tally.complete, acquired_at, ended);
                    }
                }
                Err(status) => {
                    self.tally.error(&status);
                    failures += 1;
                    if failures >= GIVE_UP_AFTER {
                        return self.tally;
                    }
                }
            }
        }
    }
}

fn record(histogram: &mut Histogram<u64>, started: Instant, ended: Instant) {
    let ns = u64::try_from((ended - started).as_nanos()).unwrap_or(u64::MAX);
    histogram.saturating_record(ns);
}

/// One arm on one spread, measured once.
pub(crate) struct Measurement {
    /// The measured window.
    pub(crate) duration: Duration,
    /// What the callers counted.
    pub(crate) tally: Tally,
    /// The client's CPU time over the window, per second of it (1.0 = one
    /// core busy).
    pub(crate) client_cpu: Option<f64>,
    /// The same for the server, when the tool started it.
    pub(crate) server_cpu: Option<f64>,
    /// The same for every process of the machine.
    pub(crate) machine_cpu: Option<f64>,
}

impl Measurement {
    /// CPU the other processes of the machine used over the window (in
    /// cores), when the tool started the server: work that competed with
    /// the measurement.
    pub(crate) fn other_cpu(&self) -> Option<f64> {
        Some((self.machine_cpu? - self.client_cpu? - self.server_cpu?).max(0.0))
    }
}

impl Measurement {
    /// Samples per second.
    pub(crate) fn rate(&self) -> f64 {
        self.tally.samples as f64 / self.duration.as_secs_f64()
    }

    /// A latency percentile (0..100) in microseconds.
    pub(crate) fn percentile_us(&self, p: f64) -> f64 {
        percentile_us(&self.tally.latency, p)
    }
}

/// A percentile (0..100) of `h` in microseconds; 0 when it is empty.
pub(crate) fn percentile_us(h: &Histogram<u64>, p: f64) -> f64 {
    if h.is_empty() {
        0.0
    } else {
        h.value_at_quantile(p / 100.0) as f64 / 1_000.0
    }
}

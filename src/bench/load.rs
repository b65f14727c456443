//! The closed-loop load: `connections` x `in_flight` callers, each calling
//! again as soon as its answer arrives, each with its own histogram, merged
//! at the end.
//!
//! A caller counts and times a call when it started after the warm-up and
//! ended before the end of the window; calls that straddle either edge are
//! not counted (at tens of microseconds a call, a negligible loss over
//! seconds).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use fusebox::proto::v1 as pb;
use hdrhistogram::Histogram;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

use crate::channel::{connect, Channel};
use crate::numbers::median;
use crate::spread::{KeyPicker, Spread};
use crate::target::{cpu_time, machine_busy_time, own_cpu_time};
use crate::{envoy_rls, throttlecrab};

type Fusebox = pb::fusebox_client::FuseboxClient<Channel>;

/// The client CPU share (of its threads) past which the load generator
/// may itself be the bottleneck.
pub(crate) const SATURATED: f64 = 0.90;

/// CPU (in cores) used by other processes during a measurement past which
/// its figures are called disturbed.
pub(crate) const DISTURBED: f64 = 0.25;

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
    /// The same decisions over one `Decide` stream per connection: each
    /// stream keeps `--frames` decisions in flight, sends the Complete of a
    /// ticket as soon as its Acquire is answered, and batches the frames
    /// that are ready together into one message. One sample per decision
    /// (Acquire + Complete); its latency runs from its Acquire frame sent to
    /// its Complete answered.
    Stream,
    /// `AcquireBatch` of `--frames` items, then `CompleteBatch` of their
    /// tickets, one caller per connection: one sample per decision, but
    /// the latency is that of the whole batch (both calls).
    Batch,
    /// `throttlecrab.RateLimiter/Throttle` on the `--throttlecrab` server
    /// (a GCRA rate-limit check, no ticket to complete): one sample per
    /// check.
    Throttlecrab,
    /// Envoy's `RateLimitService/ShouldRateLimit` on fusebox (domain
    /// `bench`, one descriptor `client=<key>`; a limit no run reaches):
    /// one sample per check.
    Rls,
    /// The same `ShouldRateLimit` check on the `--ratelimit` server
    /// (envoyproxy/ratelimit, with the same descriptor and limit).
    Ratelimit,
}

impl Arm {
    /// Every arm, in the order tables list them.
    pub(crate) const ALL: [Arm; 8] = [
        Arm::Health,
        Arm::Acquire,
        Arm::Pair,
        Arm::Stream,
        Arm::Batch,
        Arm::Throttlecrab,
        Arm::Rls,
        Arm::Ratelimit,
    ];

    /// The name flags and reports use.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Arm::Health => "health",
            Arm::Acquire => "acquire",
            Arm::Pair => "pair",
            Arm::Stream => "stream",
            Arm::Batch => "batch",
            Arm::Throttlecrab => "throttlecrab",
            Arm::Rls => "rls",
            Arm::Ratelimit => "ratelimit",
        }
    }

    /// What its rate counts.
    pub(crate) fn unit(self) -> &'static str {
        match self {
            Arm::Health | Arm::Acquire => "calls/s",
            Arm::Pair | Arm::Stream | Arm::Batch => "pairs/s",
            Arm::Throttlecrab | Arm::Rls | Arm::Ratelimit => "checks/s",
        }
    }

    /// Whether it measures a peer server, not fusebox (its server CPU is
    /// that of `--peer-pids`).
    pub(crate) fn is_peer(self) -> bool {
        matches!(self, Arm::Throttlecrab | Arm::Ratelimit)
    }

    /// Whether `--rate` paces it (the others run closed loop).
    pub(crate) fn paced(self) -> bool {
        matches!(self, Arm::Pair | Arm::Stream)
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
    /// Frames per `Decide` message and decisions in flight per stream
    /// (`stream`); items per batch (`batch`).
    pub(crate) frames: usize,
    /// Decisions per second asked of `pair` and `stream`, over all their
    /// callers (open loop); none: closed loop.
    pub(crate) rate: Option<f64>,
    /// Connections to a throttlecrab server, for the `throttlecrab` arm.
    pub(crate) throttlecrab: Vec<Channel>,
    /// Connections to an envoyproxy/ratelimit server, for the `ratelimit`
    /// arm.
    pub(crate) ratelimit: Vec<Channel>,
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
            frames: 100,
            rate: None,
            throttlecrab: Vec::new(),
            ratelimit: Vec::new(),
        })
    }

    /// Runs `arm` on `spread` (ignored by `health`) for `warmup`, then
    /// measures it for `duration`. `seed` varies the keys run by run; the
    /// server's CPU is that of the processes `server_pids` (none: not
    /// measured).
    pub(crate) async fn measure(
        &self,
        arm: Arm,
        spread: Spread,
        warmup: Duration,
        duration: Duration,
        seed: u64,
        server_pids: &[u32],
    ) -> Measurement {
        let begin = Instant::now() + warmup;
        let end = begin + duration;
        let mut tasks = tokio::task::JoinSet::new();
        let mut n = 0u64;
        let (channels, per_channel) = match arm {
            Arm::Stream | Arm::Batch => (&self.channels, 1),
            Arm::Throttlecrab => (&self.throttlecrab, self.in_flight),
            Arm::Ratelimit => (&self.ratelimit, self.in_flight),
            _ => (&self.channels, self.in_flight),
        };
        let callers = channels.len() * per_channel;
        let started = Instant::now();
        let frames = self.frames;
        for channel in channels {
            for _ in 0..per_channel {
                // Paced callers share the rate; their first calls are
                // spread over one interval.
                let pace = self.rate.filter(|_| arm.paced()).map(|rate| {
                    let every = Duration::from_secs_f64(callers as f64 / rate.max(1e-3));
                    Pace {
                        next: started + every.mul_f64(n as f64 / callers as f64),
                        every,
                    }
                });
                n += 1;
                let caller = Caller {
                    window: (begin, end),
                    picker: KeyPicker::new(spread, seed.wrapping_mul(0x9e37_79b9).wrapping_add(n)),
                    tally: Tally::new(),
                    pace,
                };
                let channel = channel.clone();
                tasks.spawn(async move {
                    match arm {
                        Arm::Health => caller.health(channel).await,
                        Arm::Acquire => caller.acquire(channel, false).await,
                        Arm::Pair => caller.acquire(channel, true).await,
                        Arm::Stream => caller.stream(channel, frames).await,
                        Arm::Batch => caller.batch(channel, frames).await,
                        Arm::Throttlecrab => {
                            caller.checks(throttlecrab::Client::new(channel)).await
                        }
                        Arm::Rls | Arm::Ratelimit => {
                            caller.checks(envoy_rls::Client::new(channel)).await
                        }
                    }
                });
            }
        }
        // The client's CPU time over the measured window only.
        tokio::time::sleep_until(begin.into()).await;
        let server_stats: Vec<String> = server_pids
            .iter()
            .map(|pid| format!("/proc/{pid}/stat"))
            .collect();
        // The sum over the server's processes; none when one is unreadable.
        let server_time = || -> Option<Duration> {
            if server_stats.is_empty() {
                return None;
            }
            server_stats.iter().map(|stat| cpu_time(stat)).sum()
        };
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
    /// Paced (`--rate`): latency of each sample from when it was due on
    /// the schedule, which adds any wait for the timer (1 ms ticks), for
    /// the caller's previous call or for room in the stream's window.
    pub(crate) from_due: Histogram<u64>,
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
            from_due: histogram(),
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
        let _ = self.from_due.add(&other.from_due);
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
    /// With `--rate`: when the next decision is due, and the interval.
    pace: Option<Pace>,
}

/// An open-loop schedule: one decision every `every`, from `next` on. A
/// caller that falls behind starts the late ones at once (the schedule
/// does not slip), so the rate asked is the rate offered.
struct Pace {
    next: Instant,
    every: Duration,
}

impl Caller {
    fn counts(&self, started: Instant, ended: Instant) -> bool {
        started >= self.window.0 && ended < self.window.1
    }

    /// Counts a sample that ran from `started` to `ended`, with its
    /// latency, when it falls in the window; says whether it did.
    fn sample(&mut self, started: Instant, ended: Instant) -> bool {
        let counted = self.counts(started, ended);
        if counted {
            self.tally.samples += 1;
            record(&mut self.tally.latency, started, ended);
        }
        counted
    }

    /// Counts a failed call; says whether the caller should give up, after
    /// [`GIVE_UP_AFTER`] failures in a row.
    fn give_up(&mut self, status: &tonic::Status, failures: &mut u32) -> bool {
        self.tally.error(status);
        *failures += 1;
        *failures >= GIVE_UP_AFTER
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
                    self.sample(started, ended);
                }
                Err(status) => {
                    if self.give_up(&status, &mut failures) {
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
            let mut due = None;
            if let Some(pace) = &mut self.pace {
                if pace.next >= self.window.1 {
                    tokio::time::sleep_until(self.window.1.into()).await;
                    return self.tally;
                }
                tokio::time::sleep_until(pace.next.into()).await;
                due = Some(pace.next);
                pace.next += pace.every;
            }
            let key = self.picker.next_key().to_owned();
            let started = Instant::now();
            let acquired = client.acquire(acquire_request(key)).await;
            let acquired_at = Instant::now();
            if acquired_at >= self.window.1 {
                return self.tally;
            }
            let ticket = match acquired {
                Ok(answer) => answer.into_inner().ticket,
                Err(status) => {
                    if self.give_up(&status, &mut failures) {
                        return self.tally;
                    }
                    continue;
                }
            };
            if ticket.is_empty() {
                self.tally.not_granted += 1;
                self.sample(started, acquired_at);
                continue;
            }
            if !pair {
                self.sample(started, acquired_at);
            }
            let completed = client
                .complete(pb::CompleteRequest {
                    ticket,
                    outcome: pb::Outcome::Success as i32,
                    cost: None,
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
                        if self.sample(started, ended) {
                            record(&mut self.tally.from_due, due.unwrap_or(started), ended);
                        }
                    } else if self.counts(acquired_at, ended) {
                        self.tally.samples += 1;
                        record(&mut self.tally.complete, acquired_at, ended);
                    }
                }
                Err(status) => {
                    if self.give_up(&status, &mut failures) {
                        return self.tally;
                    }
                }
            }
        }
    }
}

impl Caller {
    /// The `stream` arm: one `Decide` stream, `frames` decisions in flight
    /// (with `--rate`, fewer when none is due), the frames ready together
    /// sent as one message.
    async fn stream(mut self, channel: Channel, frames: usize) -> Tally {
        use tokio_stream::StreamExt;
        let frames = frames.clamp(1, 1_000);
        let mut client = Fusebox::new(channel);
        let (tx, rx) = tokio::sync::mpsc::channel::<pb::DecideRequest>(16);
        let mut answers = match client
            .decide(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
        {
            Ok(answers) => answers.into_inner(),
            Err(status) => {
                self.tally.error(&status);
                return self.tally;
            }
        };
        let mut next_id = 0u64;
        // Frame id -> when its decision's Acquire frame went out, and when
        // the decision was due (paced; else the same).
        let mut acquiring: HashMap<u64, (Instant, Instant)> = HashMap::new();
        let mut completing: HashMap<u64, (Instant, Instant)> = HashMap::new();
        let mut dues: Vec<Instant> = Vec::with_capacity(frames);
        // Complete frames waiting to go out with the next message.
        let mut out: Vec<pb::DecideFrame> = Vec::with_capacity(frames);
        let mut failures = 0u32;
        loop {
            let now = Instant::now();
            if now >= self.window.1 {
                return self.tally;
            }
            let in_flight = acquiring.len() + completing.len();
            let room = frames.saturating_sub(in_flight);
            dues.clear();
            match &mut self.pace {
                Some(pace) => {
                    while pace.next <= now && dues.len() < room {
                        dues.push(pace.next);
                        pace.next += pace.every;
                    }
                }
                None => dues.resize(room, now),
            }
            for due in &dues {
                next_id += 1;
                acquiring.insert(next_id, (now, *due));
                out.push(pb::DecideFrame {
                    id: next_id,
                    request: Some(pb::decide_frame::Request::Acquire(acquire_request(
                        self.picker.next_key().to_owned(),
                    ))),
                });
            }
            while !out.is_empty() {
                let rest = out.split_off(out.len().min(frames));
                let message = pb::DecideRequest {
                    frames: std::mem::replace(&mut out, rest),
                };
                if tx.send(message).await.is_err() {
                    self.tally.error(&tonic::Status::unavailable(
                        "the Decide stream closed its requests",
                    ));
                    return self.tally;
                }
            }
            // Wait for answers, or, paced, for the next decision due when
            // there is room for it.
            let wake = self
                .pace
                .as_ref()
                .filter(|_| acquiring.len() + completing.len() < frames)
                .map_or(self.window.1, |p| p.next.min(self.window.1));
            let message = tokio::select! {
                message = answers.next() => message,
                () = tokio::time::sleep_until(wake.into()) => continue,
            };
            let results = match message {
                Some(Ok(message)) => message.results,
                Some(Err(status)) => {
                    self.tally.error(&status);
                    return self.tally;
                }
                None => {
                    self.tally.error(&tonic::Status::unavailable(
                        "the server ended the Decide stream",
                    ));
                    return self.tally;
                }
            };
            let ended = Instant::now();
            for result in results {
                use pb::decide_result::Result as R;
                match result.result {
                    Some(R::Acquire(answer)) => {
                        let Some((started, due)) = acquiring.remove(&result.id) else {
                            continue;
                        };
                        if answer.ticket.is_empty() {
                            self.tally.not_granted += 1;
                            if self.sample(started, ended) {
                                record(&mut self.tally.from_due, due, ended);
                            }
                            continue;
                        }
                        next_id += 1;
                        completing.insert(next_id, (started, due));
                        out.push(pb::DecideFrame {
                            id: next_id,
                            request: Some(pb::decide_frame::Request::Complete(
                                pb::CompleteRequest {
                                    ticket: answer.ticket,
                                    outcome: pb::Outcome::Success as i32,
                                    cost: None,
                                },
                            )),
                        });
                    }
                    Some(R::Complete(_)) => {
                        failures = 0;
                        if let Some((started, due)) = completing.remove(&result.id) {
                            if self.sample(started, ended) {
                                record(&mut self.tally.from_due, due, ended);
                            }
                        }
                    }
                    Some(R::Error(e)) => {
                        acquiring.remove(&result.id);
                        completing.remove(&result.id);
                        let status = tonic::Status::new(e.code.into(), e.message);
                        if self.give_up(&status, &mut failures) {
                            return self.tally;
                        }
                    }
                    Some(R::Renew(_)) | None => {}
                }
            }
        }
    }

    /// The `batch` arm: `AcquireBatch` of `frames` items, then
    /// `CompleteBatch` of the tickets granted; one sample per item, one
    /// latency (the two calls) per batch.
    async fn batch(mut self, channel: Channel, frames: usize) -> Tally {
        let frames = frames.clamp(1, 1_000);
        let mut client = Fusebox::new(channel);
        let mut failures = 0;
        loop {
            let items: Vec<pb::AcquireRequest> = (0..frames)
                .map(|_| acquire_request(self.picker.next_key().to_owned()))
                .collect();
            let started = Instant::now();
            let acquired = client
                .acquire_batch(pb::AcquireBatchRequest { items })
                .await;
            if Instant::now() >= self.window.1 {
                return self.tally;
            }
            let results = match acquired {
                Ok(answer) => answer.into_inner().results,
                Err(status) => {
                    if self.give_up(&status, &mut failures) {
                        return self.tally;
                    }
                    continue;
                }
            };
            let mut tickets = Vec::with_capacity(results.len());
            let mut not_granted = 0u64;
            for r in results {
                match r.result {
                    Some(pb::acquire_result::Result::Response(a)) if !a.ticket.is_empty() => {
                        tickets.push(pb::CompleteRequest {
                            ticket: a.ticket,
                            outcome: pb::Outcome::Success as i32,
                            cost: None,
                        });
                    }
                    Some(pb::acquire_result::Result::Error(e)) => {
                        self.tally
                            .error(&tonic::Status::new(e.code.into(), e.message));
                    }
                    _ => not_granted += 1,
                }
            }
            let mut done = not_granted;
            if !tickets.is_empty() {
                match client
                    .complete_batch(pb::CompleteBatchRequest { items: tickets })
                    .await
                {
                    Ok(answer) => {
                        for r in answer.into_inner().results {
                            match r.result {
                                Some(pb::complete_result::Result::Error(e)) => self
                                    .tally
                                    .error(&tonic::Status::new(e.code.into(), e.message)),
                                _ => done += 1,
                            }
                        }
                    }
                    Err(status) => {
                        if self.give_up(&status, &mut failures) {
                            return self.tally;
                        }
                        continue;
                    }
                }
            }
            let ended = Instant::now();
            if ended >= self.window.1 {
                return self.tally;
            }
            failures = 0;
            self.tally.not_granted += not_granted;
            if self.counts(started, ended) {
                self.tally.samples += done;
                record(&mut self.tally.latency, started, ended);
            }
        }
    }

    /// A check arm (`throttlecrab`, `rls`, `ratelimit`): one check of the
    /// next key per call, counted as not granted when refused.
    async fn checks(mut self, mut client: impl Check) -> Tally {
        let mut failures = 0;
        loop {
            let key = self.picker.next_key().to_owned();
            let started = Instant::now();
            let result = client.check(key).await;
            let ended = Instant::now();
            if ended >= self.window.1 {
                return self.tally;
            }
            match result {
                Ok(allowed) => {
                    failures = 0;
                    if !allowed {
                        self.tally.not_granted += 1;
                    }
                    self.sample(started, ended);
                }
                Err(status) => {
                    if self.give_up(&status, &mut failures) {
                        return self.tally;
                    }
                }
            }
        }
    }
}

/// A peer's one-call check of a key: whether it was allowed.
trait Check {
    async fn check(&mut self, key: String) -> Result<bool, tonic::Status>;
}

/// throttlecrab's GCRA check of the key.
impl Check for throttlecrab::Client {
    async fn check(&mut self, key: String) -> Result<bool, tonic::Status> {
        Ok(self.throttle(key).await?.allowed)
    }
}

/// Envoy's rate-limit check of the descriptor `client=<key>`.
impl Check for envoy_rls::Client {
    async fn check(&mut self, key: String) -> Result<bool, tonic::Status> {
        let request = envoy_rls::one_entry(RLS_DOMAIN, RLS_DESCRIPTOR_KEY, key);
        Ok(self.should_rate_limit(request).await?.overall_code != envoy_rls::OVER_LIMIT)
    }
}

/// The domain and descriptor key of the `rls` and `ratelimit` arms: both
/// servers are configured with `client` (any value) at a limit no run
/// reaches (scripts/bench-rls writes both configs).
pub(crate) const RLS_DOMAIN: &str = "bench";
/// See [`RLS_DOMAIN`].
pub(crate) const RLS_DESCRIPTOR_KEY: &str = "client";

/// An Acquire of `key` with the defaults: its policy's permits, wait and
/// lease.
fn acquire_request(key: String) -> pb::AcquireRequest {
    pb::AcquireRequest {
        key,
        permits: None,
        max_wait: None,
        lease: None,
        ..Default::default()
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

/// The medians across runs of a measurement's rate and percentiles, and
/// its errors in all.
pub(crate) fn summary(ms: &[Measurement]) -> serde_json::Value {
    let p = |q: f64| median(ms.iter().map(|m| m.percentile_us(q)).collect());
    serde_json::json!({
        "rate": median(ms.iter().map(Measurement::rate).collect()),
        "p50_us": p(50.0),
        "p99_us": p(99.0),
        "p999_us": p(99.9),
        "errors": ms.iter().map(|m| m.tally.errors).sum::<u64>(),
    })
}

//! `fusebox bench redis-cpu`: the fusebox Redis module (`FB.ACQUIRE` then
//! `FB.COMPLETE`) against a Lua script doing the same breaker and limiter
//! work (`benches/redis/breaker.lua`, by `EVALSHA`), on the same Redis or
//! Redis Cluster, interleaved run by run.
//!
//! Each arm calls Redis directly (no fusebox server in between): one
//! decision is an acquire and the completion (success) of its ticket. The
//! figures per arm and run are decisions per second, the latency of a
//! pair, and the CPU Redis used per decision: `used_cpu_sys` +
//! `used_cpu_user` of `INFO cpu`, summed over every primary, read before
//! and after the measured window, divided by the decisions made in it.
//!
//! `now_ms` is the load generator's monotonic clock, read once when each
//! measurement starts and sent unchanged by every call of it: the module
//! refuses a time earlier than one a key has seen, and concurrent callers
//! reading a clock per call could not promise that order on the wire. Both
//! arms get the same times; the keys of each measurement start empty.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use hdrhistogram::Histogram;
use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use redis::Value;
use serde_json::{json, Value as Json};

use super::load::{histogram, percentile_us};
use super::spread::{KeyPicker, Rng, Spread};
use super::target::own_cpu_time;
use super::{median, ms, render_table, thousands, Options, Report, SATURATED};

/// The Lua peer of the module.
pub(crate) const BREAKER_LUA: &str = include_str!("../../../benches/redis/breaker.lua");

/// A caller that fails this many times in a row gives up.
const GIVE_UP_AFTER: u32 = 1_000;

/// The two arms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Arm {
    /// `FB.ACQUIRE` then `FB.COMPLETE ... success`.
    Module,
    /// `EVALSHA` of breaker.lua's acquire, then of its complete.
    Lua,
}

impl Arm {
    const ALL: [Arm; 2] = [Arm::Module, Arm::Lua];

    fn name(self) -> &'static str {
        match self {
            Arm::Module => "module",
            Arm::Lua => "lua",
        }
    }
}

/// Where Redis is: `redis://HOST:PORT` or
/// `redis-cluster://H1:P1,H2:P2,...`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Store {
    /// One Redis server.
    Single(String),
    /// A Redis Cluster, by some of its nodes (`HOST:PORT`).
    Cluster(Vec<String>),
}

impl Store {
    pub(crate) fn parse(text: &str) -> anyhow::Result<Store> {
        if let Some(rest) = text.strip_prefix("redis-cluster://") {
            let nodes: Vec<String> = rest
                .split(',')
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .map(str::to_owned)
                .collect();
            if nodes.is_empty() {
                bail!("--store {text}: name at least one node, redis-cluster://HOST:PORT,...");
            }
            Ok(Store::Cluster(nodes))
        } else if let Some(rest) = text.strip_prefix("redis://") {
            if rest.is_empty() || rest.contains(',') {
                bail!("--store {text}: one server, redis://HOST:PORT (a cluster is redis-cluster://H1:P1,H2:P2,...)");
            }
            Ok(Store::Single(rest.trim_end_matches('/').to_owned()))
        } else {
            bail!("--store {text}: must be redis://HOST:PORT or redis-cluster://H1:P1,H2:P2,...")
        }
    }
}

/// A connection that routes each command to the node holding its key.
#[derive(Clone)]
enum Conn {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl Conn {
    async fn query(&mut self, cmd: &redis::Cmd) -> redis::RedisResult<Value> {
        match self {
            Conn::Single(c) => cmd.query_async(c).await,
            Conn::Cluster(c) => cmd.query_async(c).await,
        }
    }

    async fn pipe(&mut self, pipe: &redis::Pipeline) -> redis::RedisResult<Vec<Value>> {
        match self {
            Conn::Single(c) => pipe.query_async(c).await,
            Conn::Cluster(c) => pipe.query_async(c).await,
        }
    }
}

async fn direct(addr: &str) -> anyhow::Result<MultiplexedConnection> {
    redis::Client::open(format!("redis://{addr}"))
        .with_context(|| format!("{addr}: not a Redis address"))?
        .get_multiplexed_async_connection()
        .await
        .with_context(|| format!("cannot reach Redis at {addr}"))
}

/// The primaries of the store (`HOST:PORT`): the server itself, or the
/// masters `CLUSTER NODES` lists.
async fn primaries(store: &Store) -> anyhow::Result<Vec<String>> {
    let nodes = match store {
        Store::Single(addr) => return Ok(vec![addr.clone()]),
        Store::Cluster(nodes) => nodes,
    };
    let mut last_error = None;
    for seed in nodes {
        let listing: redis::RedisResult<String> = match direct(seed).await {
            Ok(mut c) => redis::cmd("CLUSTER").arg("NODES").query_async(&mut c).await,
            Err(e) => {
                last_error = Some(e);
                continue;
            }
        };
        match listing {
            Ok(text) => {
                let found = masters_of(&text);
                if found.is_empty() {
                    bail!("CLUSTER NODES at {seed} lists no primary");
                }
                return Ok(found);
            }
            Err(e) => {
                last_error = Some(anyhow::Error::new(e).context(format!("CLUSTER NODES at {seed}")))
            }
        }
    }
    Err(last_error.unwrap_or_else(|| anyhow::anyhow!("no cluster node given")))
}

/// The `HOST:PORT` of every healthy master that serves slots in a
/// `CLUSTER NODES` reply (`id ip:port@cport[,hostname] flags master ping
/// pong epoch link slot...`): a node with no slots holds no key of the
/// benchmark (and may be a replica-to-be that still reads as a master).
fn masters_of(listing: &str) -> Vec<String> {
    let mut out: Vec<String> = listing
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let flags = fields.get(2)?;
            let is_master = flags.split(',').any(|f| f == "master");
            let failed = flags.split(',').any(|f| f == "fail" || f == "fail?");
            if !is_master || failed || fields.len() <= 8 {
                return None;
            }
            let addr = fields.get(1)?.split(['@', ',']).next()?;
            (!addr.is_empty() && !addr.starts_with(':')).then(|| addr.to_owned())
        })
        .collect();
    out.sort();
    out
}

/// `used_cpu_sys` + `used_cpu_user` in an `INFO cpu` reply, in seconds.
fn cpu_seconds(info: &str) -> Option<f64> {
    let field = |name: &str| {
        info.lines().find_map(|l| {
            l.trim()
                .strip_prefix(name)?
                .strip_prefix(':')?
                .parse::<f64>()
                .ok()
        })
    };
    Some(field("used_cpu_sys")? + field("used_cpu_user")?)
}

/// The CPU seconds every primary has used, summed.
async fn redis_cpu(nodes: &mut [MultiplexedConnection]) -> anyhow::Result<f64> {
    let mut total = 0.0;
    for c in nodes.iter_mut() {
        let info: String = redis::cmd("INFO").arg("cpu").query_async(c).await?;
        total += cpu_seconds(&info).context("INFO cpu has no used_cpu_sys/used_cpu_user")?;
    }
    Ok(total)
}

/// What one arm on one spread measured once.
struct Measured {
    duration: Duration,
    decisions: u64,
    latency: Histogram<u64>,
    not_granted: u64,
    errors: u64,
    first_error: Option<String>,
    /// Redis CPU seconds (all primaries) over the window.
    redis_cpu_s: f64,
    /// The load generator's CPU over the window, in cores.
    client_cpu: Option<f64>,
}

impl Measured {
    fn rate(&self) -> f64 {
        self.decisions as f64 / self.duration.as_secs_f64()
    }
    fn cpu_us_per_decision(&self) -> f64 {
        if self.decisions == 0 {
            0.0
        } else {
            self.redis_cpu_s * 1e6 / self.decisions as f64
        }
    }
    fn redis_cores(&self) -> f64 {
        self.redis_cpu_s / self.duration.as_secs_f64()
    }
}

/// One closed-loop caller's tally.
struct Tally {
    decisions: u64,
    latency: Histogram<u64>,
    not_granted: u64,
    errors: u64,
    first_error: Option<String>,
}

/// What every caller of a measurement shares.
#[derive(Clone)]
struct Plan {
    arm: Arm,
    policy: String,
    sha: String,
    now_ms: u64,
    window: (Instant, Instant),
    /// Decisions per pipeline; 1: one command at a time.
    pipeline: u32,
}

/// The acquire and complete commands of one decision of `plan`'s arm.
fn commands(plan: &Plan, key: &str, now: &str, ticket: &str) -> (redis::Cmd, redis::Cmd) {
    match plan.arm {
        Arm::Module => {
            let mut a = redis::cmd("FB.ACQUIRE");
            a.arg(key).arg(now).arg(ticket).arg(&plan.policy);
            let mut c = redis::cmd("FB.COMPLETE");
            c.arg(key).arg(now).arg(ticket).arg("success");
            (a, c)
        }
        Arm::Lua => {
            let mut a = redis::cmd("EVALSHA");
            a.arg(&plan.sha)
                .arg(1)
                .arg(key)
                .arg("acquire")
                .arg(now)
                .arg(ticket)
                .arg(&plan.policy);
            let mut c = redis::cmd("EVALSHA");
            c.arg(&plan.sha)
                .arg(1)
                .arg(key)
                .arg("complete")
                .arg(now)
                .arg(ticket)
                .arg("success");
            (a, c)
        }
    }
}

/// A caller that sends `plan.pipeline` acquires in one pipeline, then the
/// completes of those granted in another; each decision's latency is the
/// two pipelines'.
async fn pipelined_caller(plan: Plan, mut conn: Conn, mut picker: KeyPicker, seed: u64) -> Tally {
    let mut t = Tally {
        decisions: 0,
        latency: histogram(),
        not_granted: 0,
        errors: 0,
        first_error: None,
    };
    let mut rng = Rng::new(seed);
    let prefix = format!("bench:{}:", plan.arm.name());
    let now = plan.now_ms.to_string();
    let mut failures = 0u32;
    let error = |t: &mut Tally, e: String| {
        t.errors += 1;
        if t.first_error.is_none() {
            t.first_error = Some(e);
        }
    };
    loop {
        let mut acquires = redis::pipe();
        let mut completes = Vec::with_capacity(plan.pipeline as usize);
        for _ in 0..plan.pipeline {
            let key = format!("{prefix}{}", picker.next_key().trim_start_matches("bench/"));
            let ticket = format!("{:016x}{:016x}", rng.next_u64(), rng.next_u64());
            let (a, c) = commands(&plan, &key, &now, &ticket);
            acquires.add_command(a);
            completes.push(c);
        }
        let started = Instant::now();
        let acquired = conn.pipe(&acquires).await;
        if Instant::now() >= plan.window.1 {
            return t;
        }
        let replies = match acquired {
            Ok(replies) => replies,
            Err(e) => {
                error(&mut t, format!("acquire pipeline: {e}"));
                failures += 1;
                if failures >= GIVE_UP_AFTER {
                    return t;
                }
                continue;
            }
        };
        let mut second = redis::pipe();
        let mut granted_n = 0u64;
        let mut not_granted = 0u64;
        for (reply, complete) in replies.iter().zip(completes) {
            if granted(reply) {
                second.add_command(complete);
                granted_n += 1;
            } else if matches!(reply, Value::Array(_)) {
                not_granted += 1;
            } else {
                error(&mut t, format!("acquire: unexpected reply {reply:?}"));
            }
        }
        if granted_n > 0 {
            if let Err(e) = conn.pipe(&second).await {
                error(&mut t, format!("complete pipeline: {e}"));
                failures += 1;
                if failures >= GIVE_UP_AFTER {
                    return t;
                }
                continue;
            }
        }
        let ended = Instant::now();
        if ended >= plan.window.1 {
            return t;
        }
        failures = 0;
        t.not_granted += not_granted;
        if started >= plan.window.0 && granted_n > 0 {
            t.decisions += granted_n;
            let ns = u64::try_from((ended - started).as_nanos()).unwrap_or(u64::MAX);
            let _ = t.latency.record_n(ns.max(100), granted_n);
        }
    }
}

async fn caller(plan: Plan, mut conn: Conn, mut picker: KeyPicker, seed: u64) -> Tally {
    let mut t = Tally {
        decisions: 0,
        latency: histogram(),
        not_granted: 0,
        errors: 0,
        first_error: None,
    };
    let mut rng = Rng::new(seed);
    let prefix = format!("bench:{}:", plan.arm.name());
    let mut key = String::with_capacity(64);
    let mut failures = 0u32;
    let now = plan.now_ms.to_string();
    loop {
        key.clear();
        key.push_str(&prefix);
        // `bench/<spread>/<n>` -> `bench:<arm>:<spread>/<n>`
        key.push_str(picker.next_key().trim_start_matches("bench/"));
        let ticket = format!("{:016x}{:016x}", rng.next_u64(), rng.next_u64());
        let (acquire, complete) = commands(&plan, &key, &now, &ticket);
        let started = Instant::now();
        let acquired = conn.query(&acquire).await;
        let acquired_at = Instant::now();
        if acquired_at >= plan.window.1 {
            return t;
        }
        let counts = |s: Instant, e: Instant| s >= plan.window.0 && e < plan.window.1;
        let error = |t: &mut Tally, e: String| {
            t.errors += 1;
            if t.first_error.is_none() {
                t.first_error = Some(e);
            }
        };
        match acquired {
            Ok(reply) if granted(&reply) => {}
            Ok(Value::Array(_)) => {
                t.not_granted += 1;
                continue;
            }
            Ok(other) => {
                error(&mut t, format!("acquire: unexpected reply {other:?}"));
                failures += 1;
                if failures >= GIVE_UP_AFTER {
                    return t;
                }
                continue;
            }
            Err(e) => {
                error(&mut t, format!("acquire: {e}"));
                failures += 1;
                if failures >= GIVE_UP_AFTER {
                    return t;
                }
                continue;
            }
        }
        let completed = conn.query(&complete).await;
        let ended = Instant::now();
        if ended >= plan.window.1 {
            return t;
        }
        match completed {
            Ok(_) => {
                failures = 0;
                if counts(started, ended) {
                    t.decisions += 1;
                    let ns = u64::try_from((ended - started).as_nanos()).unwrap_or(u64::MAX);
                    t.latency.saturating_record(ns);
                }
            }
            Err(e) => {
                error(&mut t, format!("complete: {e}"));
                failures += 1;
                if failures >= GIVE_UP_AFTER {
                    return t;
                }
            }
        }
    }
}

/// Whether an acquire reply (`[decision, ...]`) grants a ticket.
fn granted(reply: &Value) -> bool {
    let Value::Array(parts) = reply else {
        return false;
    };
    matches!(
        parts.first(),
        Some(Value::BulkString(d)) if d == b"granted" || d == b"probe"
    ) || matches!(
        parts.first(),
        Some(Value::SimpleString(d)) if d == "granted" || d == "probe"
    )
}

/// Everything the measurements share.
struct Bench {
    conns: Vec<Conn>,
    nodes: Vec<MultiplexedConnection>,
    primaries: Vec<String>,
    policy: String,
    sha: String,
    origin: Instant,
}

impl Bench {
    async fn open(
        o: &Options,
        store: &Store,
        permits: u32,
        lua_only: bool,
    ) -> anyhow::Result<Bench> {
        let primaries = primaries(store).await?;
        let mut nodes = Vec::new();
        for p in &primaries {
            nodes.push(direct(p).await?);
        }
        let sha = redis::Script::new(BREAKER_LUA).get_hash().to_owned();
        for (addr, c) in primaries.iter().zip(nodes.iter_mut()) {
            let version: redis::RedisResult<Value> = redis::cmd("FB.VERSION").query_async(c).await;
            if let (Err(e), false) = (version, lua_only) {
                bail!("FB.VERSION at {addr} failed ({e}): load the fusebox module there (redis-server --loadmodule /abs/path/libfusebox_redis.so)");
            }
            let loaded: String = redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(BREAKER_LUA)
                .query_async(c)
                .await
                .with_context(|| format!("SCRIPT LOAD at {addr}"))?;
            if loaded != sha {
                bail!("SCRIPT LOAD at {addr} gave {loaded}, expected {sha}");
            }
        }
        let mut conns = Vec::new();
        match store {
            Store::Single(addr) => {
                for _ in 0..o.connections {
                    conns.push(Conn::Single(direct(addr).await?));
                }
            }
            Store::Cluster(seeds) => {
                let client = redis::cluster::ClusterClient::new(
                    seeds.iter().map(|s| format!("redis://{s}")),
                )
                .context("the cluster's addresses")?;
                for _ in 0..o.connections {
                    conns.push(Conn::Cluster(
                        client
                            .get_async_connection()
                            .await
                            .context("cannot connect to the Redis Cluster")?,
                    ));
                }
            }
        }
        let policy = json!({
            "breaker": {"mode": "consecutive", "failures": 5, "break": 30_000},
            "limiter": {"kind": "concurrency", "permits": permits},
        })
        .to_string();
        Ok(Bench {
            conns,
            nodes,
            primaries,
            policy,
            sha,
            origin: Instant::now(),
        })
    }

    /// Removes the keys of an arm from every primary, so that each
    /// measurement starts from empty keys.
    async fn clear(&mut self, arm: Arm) -> anyhow::Result<()> {
        let pattern = format!("bench:{}:*", arm.name());
        for c in &mut self.nodes {
            let mut cursor = 0u64;
            loop {
                let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(1000)
                    .query_async(c)
                    .await?;
                // One key per UNLINK: in a cluster the keys of a batch may
                // sit in different slots.
                for k in keys {
                    let _: i64 = redis::cmd("UNLINK").arg(k).query_async(c).await?;
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        Ok(())
    }

    async fn measure(
        &mut self,
        o: &Options,
        arm: Arm,
        spread: Spread,
        run: u64,
        pipeline: u32,
    ) -> anyhow::Result<Measured> {
        self.clear(arm).await?;
        let (warmup, duration) = (ms(o.warmup), ms(o.duration));
        let begin = Instant::now() + warmup;
        let end = begin + duration;
        let plan = Plan {
            arm,
            policy: self.policy.clone(),
            sha: self.sha.clone(),
            // +1: never 0, which reads as "no time yet" nowhere, but is
            // clearer in a key's state.
            now_ms: u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX) + 1,
            window: (begin, end),
            pipeline,
        };
        let mut tasks = tokio::task::JoinSet::new();
        let mut n = 0u64;
        for conn in &self.conns {
            for _ in 0..o.in_flight {
                n += 1;
                let seed = run.wrapping_mul(0x9e37_79b9).wrapping_add(n);
                let picker = KeyPicker::new(spread, seed);
                if pipeline > 1 {
                    tasks.spawn(pipelined_caller(
                        plan.clone(),
                        conn.clone(),
                        picker,
                        seed ^ 0x5eed,
                    ));
                } else {
                    tasks.spawn(caller(plan.clone(), conn.clone(), picker, seed ^ 0x5eed));
                }
            }
        }
        tokio::time::sleep_until(begin.into()).await;
        let cpu_begin = (redis_cpu(&mut self.nodes).await?, own_cpu_time());
        tokio::time::sleep_until(end.into()).await;
        let cpu_end = (redis_cpu(&mut self.nodes).await?, own_cpu_time());
        let mut m = Measured {
            duration,
            decisions: 0,
            latency: histogram(),
            not_granted: 0,
            errors: 0,
            first_error: None,
            redis_cpu_s: (cpu_end.0 - cpu_begin.0).max(0.0),
            client_cpu: match (cpu_begin.1, cpu_end.1) {
                (Some(a), Some(b)) => {
                    Some(b.saturating_sub(a).as_secs_f64() / duration.as_secs_f64())
                }
                _ => None,
            },
        };
        while let Some(done) = tasks.join_next().await {
            let t = done.context("a caller failed")?;
            m.decisions += t.decisions;
            let _ = m.latency.add(&t.latency);
            m.not_granted += t.not_granted;
            m.errors += t.errors;
            if m.first_error.is_none() {
                m.first_error = t.first_error;
            }
        }
        Ok(m)
    }
}

/// `fusebox bench redis-cpu`.
pub(crate) async fn redis_cpu_mode(
    o: &Options,
    store_url: &str,
    permits: u32,
    pipeline: u32,
    lua_only: bool,
    warnings: &mut Vec<String>,
) -> anyhow::Result<Report> {
    let store = Store::parse(store_url)?;
    let mut bench = Bench::open(o, &store, permits, lua_only).await?;
    let arms: &[Arm] = if lua_only { &[Arm::Lua] } else { &Arm::ALL };
    eprintln!(
        "bench: Redis primaries {} (INFO cpu read from each)",
        bench.primaries.join(", ")
    );
    let spreads: Vec<Spread> = Spread::ALL
        .into_iter()
        .filter(|s| o.spreads.contains(s))
        .collect();
    let cells: Vec<(Arm, Spread)> = spreads
        .iter()
        .flat_map(|s| arms.iter().map(|a| (*a, *s)))
        .collect();
    let runs = usize::from(o.runs);
    let mut measured: Vec<Vec<Measured>> = cells.iter().map(|_| Vec::new()).collect();
    for run in 0..runs {
        // Interleaved, starting one further along each run.
        for i in 0..cells.len() {
            let at = (i + run) % cells.len();
            let (arm, spread) = cells[at];
            eprintln!(
                "bench: run {}/{runs}: {} {}",
                run + 1,
                arm.name(),
                spread.name()
            );
            let m = bench.measure(o, arm, spread, run as u64, pipeline).await?;
            measured[at].push(m);
        }
    }

    let mut rows = Vec::new();
    let mut results = Vec::new();
    let mut summaries: Vec<Json> = Vec::new();
    for ((arm, spread), ms) in cells.iter().zip(&measured) {
        let med = |f: &dyn Fn(&Measured) -> f64| median(ms.iter().map(f).collect());
        let rate = med(&Measured::rate);
        let p50 = med(&|m| percentile_us(&m.latency, 50.0));
        let p99 = med(&|m| percentile_us(&m.latency, 99.0));
        let cpu = med(&Measured::cpu_us_per_decision);
        let cores = med(&Measured::redis_cores);
        let client = median(ms.iter().filter_map(|m| m.client_cpu).collect());
        let errors: u64 = ms.iter().map(|m| m.errors).sum();
        let not_granted: u64 = ms.iter().map(|m| m.not_granted).sum();
        if let Some(e) = ms.iter().find_map(|m| m.first_error.as_ref()) {
            warnings.push(format!(
                "{} {}: {errors} calls failed, the first with {e}",
                arm.name(),
                spread.name()
            ));
        }
        if not_granted > 0 {
            warnings.push(format!(
                "{} {}: {not_granted} acquires were not granted (not counted as decisions)",
                arm.name(),
                spread.name()
            ));
        }
        if ms.iter().any(|m| {
            m.client_cpu
                .is_some_and(|c| c / f64::from(o.client_threads) >= SATURATED)
        }) {
            warnings.push(format!(
                "the load generator used {:.0}% or more of its {} thread(s) during {} {}: it may be the bottleneck (give it more with --client-threads)",
                SATURATED * 100.0,
                o.client_threads,
                arm.name(),
                spread.name()
            ));
        }
        rows.push(vec![
            arm.name().to_owned(),
            spread.name().to_owned(),
            thousands(rate),
            format!("{p50:.1}"),
            format!("{p99:.1}"),
            format!("{cpu:.2}"),
            format!("{:.0}%", cores * 100.0),
            format!("{:.0}%", client * 100.0),
            errors.to_string(),
        ]);
        let summary = json!({
            "arm": arm.name(),
            "spread": spread.name(),
            "decisions_per_s": rate,
            "p50_us": p50,
            "p99_us": p99,
            "redis_cpu_us_per_decision": cpu,
            "redis_cpu_cores": cores,
            "client_cpu": client,
            "errors": errors,
            "not_granted": not_granted,
        });
        summaries.push(summary.clone());
        let mut result = summary;
        result["runs"] = ms
            .iter()
            .map(|m| {
                json!({
                    "decisions": m.decisions,
                    "decisions_per_s": m.rate(),
                    "p50_us": percentile_us(&m.latency, 50.0),
                    "p99_us": percentile_us(&m.latency, 99.0),
                    "max_us": m.latency.max() as f64 / 1000.0,
                    "redis_cpu_s": m.redis_cpu_s,
                    "redis_cpu_us_per_decision": m.cpu_us_per_decision(),
                    "client_cpu": m.client_cpu,
                    "errors": m.errors,
                    "not_granted": m.not_granted,
                    "first_error": m.first_error,
                })
            })
            .collect::<Json>();
        results.push(result);
    }

    // module / lua per spread: the ratio of the medians, and the median of
    // the per-run ratios (each run measures both arms back to back).
    const FIGURES: [&str; 4] = [
        "decisions_per_s",
        "p50_us",
        "p99_us",
        "redis_cpu_us_per_decision",
    ];
    let mut ratios = Vec::new();
    for spread in spreads.iter().filter(|_| !lua_only) {
        let find = |arm: Arm| {
            cells
                .iter()
                .position(|c| *c == (arm, *spread))
                .expect("every arm is measured on every spread")
        };
        let (mi, li) = (find(Arm::Module), find(Arm::Lua));
        let (ms_, ls) = (&measured[mi], &measured[li]);
        let per_run = |f: &dyn Fn(&Measured) -> f64| {
            median(
                ms_.iter()
                    .zip(ls)
                    .filter(|(_, l)| f(l) > 0.0)
                    .map(|(m, l)| f(m) / f(l))
                    .collect(),
            )
        };
        let fig = |i: usize, k: &str| summaries[i][k].as_f64().unwrap_or(0.0);
        let ratio_of_medians = |k: &str| {
            let l = fig(li, k);
            if l > 0.0 {
                fig(mi, k) / l
            } else {
                0.0
            }
        };
        let mut r = json!({ "spread": spread.name() });
        for k in FIGURES {
            r[k] = json!(ratio_of_medians(k));
        }
        r["per_run_median"] = json!({
            "decisions_per_s": per_run(&Measured::rate),
            "p50_us": per_run(&|m| percentile_us(&m.latency, 50.0)),
            "p99_us": per_run(&|m| percentile_us(&m.latency, 99.0)),
            "redis_cpu_us_per_decision": per_run(&Measured::cpu_us_per_decision),
        });
        rows.push(vec![
            "module/lua".to_owned(),
            spread.name().to_owned(),
            format!("x{:.3}", ratio_of_medians("decisions_per_s")),
            format!("x{:.3}", ratio_of_medians("p50_us")),
            format!("x{:.3}", ratio_of_medians("p99_us")),
            format!("x{:.3}", ratio_of_medians("redis_cpu_us_per_decision")),
            String::new(),
            String::new(),
            String::new(),
        ]);
        ratios.push(r);
    }

    let (lines, _) = render_table(
        &[
            "ARM",
            "SPREAD",
            "DECISIONS/S",
            "P50 µs",
            "P99 µs",
            "REDIS CPU µs/DECISION",
            "REDIS CPU",
            "CLIENT CPU",
            "ERRORS",
        ],
        &rows,
    );
    let mut text = lines.join("\n");
    text.push_str(&format!(
        "\n\n{} run(s) of {} ms warm-up + {} ms measured per row, interleaved; medians across runs.\n\
         {} connections x {} in flight to {} ({} primaries); a decision is an acquire and the \
         completion (success) of its ticket;\nRedis CPU is used_cpu_sys + used_cpu_user of INFO cpu, \
         summed over the primaries, over the measured window; module/lua rows are ratios of the medians.\n\
         pipeline depth {pipeline} (acquires, then the completes of their tickets, per pipeline; \
         latency per decision is its two pipelines').",
        o.runs,
        o.warmup,
        o.duration,
        o.connections,
        o.in_flight,
        store_url,
        bench.primaries.len(),
    ));
    let figures = json!({
        "store": store_url,
        "primaries": bench.primaries,
        "policy": bench.policy,
        "lua_sha1": bench.sha,
        "pipeline": pipeline,
        "lua_only": lua_only,
        "results": results,
        "module_over_lua": ratios,
    });
    Ok(("redis-cpu", text, figures))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stores_parse() {
        assert_eq!(
            Store::parse("redis://127.0.0.1:6379").unwrap(),
            Store::Single("127.0.0.1:6379".into())
        );
        assert_eq!(
            Store::parse("redis-cluster://a:1,b:2").unwrap(),
            Store::Cluster(vec!["a:1".into(), "b:2".into()])
        );
        assert!(Store::parse("http://x").is_err());
        assert!(Store::parse("redis://a:1,b:2").is_err());
        assert!(Store::parse("redis-cluster://").is_err());
    }

    #[test]
    fn masters_and_cpu_are_read() {
        let nodes = "\
a1 127.0.0.1:7001@17001 myself,master - 0 0 1 connected 0-5460
a2 127.0.0.1:7002@17002,host master - 0 0 2 connected 5461-10922
a3 127.0.0.1:7003@17003 slave a1 0 0 1 connected
a4 127.0.0.1:7004@17004 master,fail - 0 0 3 connected 10923-16383
a5 127.0.0.1:7005@17005 master - 0 0 4 connected
";
        assert_eq!(masters_of(nodes), vec!["127.0.0.1:7001", "127.0.0.1:7002"]);
        let info = "# CPU\r\nused_cpu_sys:1.500000\r\nused_cpu_user:2.250000\r\nused_cpu_sys_children:9\r\n";
        assert_eq!(cpu_seconds(info), Some(3.75));
    }
}

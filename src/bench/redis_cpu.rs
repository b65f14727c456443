//! `fusebox-bench redis-cpu`: the fusebox Redis module (`FB.ACQUIRE` then
//! `FB.COMPLETE`) beside Redis's own floor (`SET` then `GET` of a 64-byte
//! string) and a Lua script doing the same breaker and limiter work
//! (`benches/redis/breaker.lua`, by `EVALSHA`), on the same Redis or Redis
//! Cluster, interleaved run by run.
//!
//! Each arm calls Redis directly (no fusebox server in between): one
//! decision is an acquire and the completion (success) of its ticket (for
//! the floor, a SET and a GET of its key). The figures per arm and run are
//! decisions per second, the latency of a pair, the CPU Redis used per
//! decision (`used_cpu_sys` + `used_cpu_user` of `INFO cpu`, summed over
//! every primary, and apart over every replica, read before and after the
//! measured window, divided by the decisions made in it), and the time
//! Redis spent in the arm's commands per decision (`INFO commandstats`).
//! With `--pipeline N`, each caller sends N decisions in one pipeline, each
//! acquire followed by the completion of its ticket, so that the tickets a
//! caller holds at once stay few; `--live-tickets` measures the module
//! again with that many tickets held live on every key of the spread.
//!
//! `now_ms` is the load generator's monotonic clock, read once when each
//! measurement starts and sent unchanged by every call of it: the module
//! refuses a time earlier than one a key has seen, and concurrent callers
//! reading a clock per call could not promise that order on the wire. Every
//! arm gets the same times; the keys of each measurement start empty. The
//! module is sent the policy by id (`@` and its id), as the servers do.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use hdrhistogram::Histogram;
use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use redis::Value;
use serde_json::{json, Value as Json};

use fusebox_cli::render_table;

use crate::load::{histogram, percentile_us, SATURATED};
use crate::numbers::{interleaved, listed, median, ms, thousands};
use crate::options::Options;
use crate::report::Report;
use crate::spread::{KeyPicker, Rng, Spread};
use crate::target::own_cpu_time;

/// The Lua peer of the module.
pub(crate) const BREAKER_LUA: &str = include_str!("../../benches/redis/breaker.lua");

/// A caller that fails this many times in a row gives up.
const GIVE_UP_AFTER: u32 = 1_000;

/// The floor arm's value: 64 bytes.
const FLOOR_VALUE: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/// How long held tickets live: a day, longer than any run.
const HELD_LEASE_MS: u64 = 86_400_000;

/// The arms.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Arm {
    /// `SET key value` then `GET key`: Redis's own cost for two commands.
    Floor,
    /// `FB.KEYCHECK key` twice: two module commands that do no fusebox
    /// work (the module API's dispatch, a key opened, a short reply), the
    /// floor of any module command.
    Noop,
    /// `FB.ACQUIRE` then `FB.COMPLETE ... success`.
    Module,
    /// `EVALSHA` of breaker.lua's acquire, then of its complete.
    Lua,
}

impl Arm {
    fn name(self) -> &'static str {
        match self {
            Arm::Floor => "floor",
            Arm::Noop => "noop",
            Arm::Module => "module",
            Arm::Lua => "lua",
        }
    }

    /// The commands (as `INFO commandstats` names them) of a decision.
    fn commands(self) -> &'static [&'static str] {
        match self {
            Arm::Floor => &["set", "get"],
            Arm::Noop => &["fb.keycheck"],
            Arm::Module => &["fb.acquire", "fb.complete"],
            Arm::Lua => &["evalsha"],
        }
    }
}

/// What `fusebox-bench redis-cpu` measures.
pub(crate) struct Setup<'a> {
    /// `--store`.
    pub store: &'a str,
    /// Permits of the policy's concurrency limiter.
    pub permits: u32,
    /// Decisions per pipeline.
    pub pipeline: u32,
    /// The arms.
    pub arms: &'a [Arm],
    /// Live tickets to hold on each key for the module's extra rows.
    pub live: &'a [u32],
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
    async fn pipe(&mut self, pipe: &redis::Pipeline) -> redis::RedisResult<Vec<Value>> {
        match self {
            Conn::Single(c) => pipe.query_async(c).await,
            Conn::Cluster(c) => pipe.query_async(c).await,
        }
    }

    /// Sends `groups` (each a few commands on one key, kept in order) at
    /// once, the replies in the groups' order: one pipeline on one Redis;
    /// on a cluster, where one pipeline cannot cross slots, a pipeline per
    /// group, all in flight together.
    async fn groups(&mut self, groups: Vec<Vec<redis::Cmd>>) -> redis::RedisResult<Vec<Value>> {
        let pipe_of = |group: Vec<redis::Cmd>| {
            let mut pipe = redis::pipe();
            for cmd in group {
                pipe.add_command(cmd);
            }
            pipe
        };
        match self {
            Conn::Single(c) => {
                pipe_of(groups.into_iter().flatten().collect())
                    .query_async(c)
                    .await
            }
            Conn::Cluster(c) => {
                let sent = groups.into_iter().map(|group| {
                    let (pipe, mut c) = (pipe_of(group), c.clone());
                    async move { pipe.query_async::<Vec<Value>>(&mut c).await }
                });
                let replies = futures_util::future::join_all(sent).await;
                let mut all = Vec::with_capacity(replies.len() * 2);
                for group in replies {
                    all.extend(group?);
                }
                Ok(all)
            }
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

/// `INFO <section>` of every node of `nodes`.
async fn info(nodes: &mut [MultiplexedConnection], section: &str) -> anyhow::Result<Vec<String>> {
    let mut out = Vec::with_capacity(nodes.len());
    for c in nodes.iter_mut() {
        out.push(redis::cmd("INFO").arg(section).query_async(c).await?);
    }
    Ok(out)
}

/// The CPU seconds `nodes` have used, summed.
async fn redis_cpu(nodes: &mut [MultiplexedConnection]) -> anyhow::Result<f64> {
    let mut total = 0.0;
    for text in info(nodes, "cpu").await? {
        total += cpu_seconds(&text).context("INFO cpu has no used_cpu_sys/used_cpu_user")?;
    }
    Ok(total)
}

/// `calls` and `usec` of each command in `INFO commandstats` replies, summed.
fn commandstats(replies: &[String]) -> HashMap<String, (u64, u64)> {
    let mut out: HashMap<String, (u64, u64)> = HashMap::new();
    for reply in replies {
        for line in reply.lines() {
            let Some((name, rest)) = line
                .trim()
                .strip_prefix("cmdstat_")
                .and_then(|l| l.split_once(':'))
            else {
                continue;
            };
            let field = |f: &str| {
                rest.split(',')
                    .find_map(|kv| kv.strip_prefix(f)?.strip_prefix('=')?.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            let e = out.entry(name.to_owned()).or_default();
            e.0 += field("calls");
            e.1 += field("usec");
        }
    }
    out
}

/// The replicas of the store's primaries (`HOST:PORT`), from `INFO
/// replication` of each (`slaveN:ip=...,port=...`).
async fn replicas(nodes: &mut [MultiplexedConnection]) -> anyhow::Result<Vec<String>> {
    let mut out = Vec::new();
    for text in info(nodes, "replication").await? {
        for line in text.lines() {
            let Some((name, rest)) = line.trim().split_once(':') else {
                continue;
            };
            if !name.starts_with("slave") || !name[5..].bytes().all(|b| b.is_ascii_digit()) {
                continue;
            }
            let field = |f: &str| {
                rest.split(',')
                    .find_map(|kv| kv.strip_prefix(f)?.strip_prefix('='))
            };
            if let (Some(ip), Some(port)) = (field("ip"), field("port")) {
                out.push(format!("{ip}:{port}"));
            }
        }
    }
    out.sort();
    Ok(out)
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
    /// Redis CPU seconds (all replicas) over the window.
    replica_cpu_s: f64,
    /// Microseconds Redis spent in the arm's commands over the window.
    command_us: u64,
    /// Calls of the arm's commands over the window.
    command_calls: u64,
    /// The load generator's CPU over the window, in cores.
    client_cpu: Option<f64>,
}

impl Measured {
    fn rate(&self) -> f64 {
        self.decisions as f64 / self.duration.as_secs_f64()
    }
    fn per_decision(&self, seconds: f64) -> f64 {
        if self.decisions == 0 {
            0.0
        } else {
            seconds * 1e6 / self.decisions as f64
        }
    }
    fn cpu_us_per_decision(&self) -> f64 {
        self.per_decision(self.redis_cpu_s)
    }
    fn replica_us_per_decision(&self) -> f64 {
        self.per_decision(self.replica_cpu_s)
    }
    /// Time in the arm's commands per decision (commandstats).
    fn command_us_per_decision(&self) -> f64 {
        self.per_decision(self.command_us as f64 / 1e6)
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

impl Tally {
    fn new() -> Tally {
        Tally {
            decisions: 0,
            latency: histogram(),
            not_granted: 0,
            errors: 0,
            first_error: None,
        }
    }

    fn error(&mut self, e: String) {
        self.errors += 1;
        if self.first_error.is_none() {
            self.first_error = Some(e);
        }
    }
}

/// What every caller of a measurement shares.
#[derive(Clone)]
struct Plan {
    arm: Arm,
    /// The policy as the module is sent it (`@` and its id) and as Lua
    /// reads it (JSON).
    policy_ref: String,
    policy: String,
    sha: String,
    now_ms: u64,
    window: (Instant, Instant),
    /// Decisions per pipeline; 1: one command at a time.
    pipeline: u32,
}

/// The Redis key of a spread's key for `arm`: `bench:<arm>:<spread>/<n>`.
fn redis_key(arm: Arm, key: &str) -> String {
    format!("bench:{}:{}", arm.name(), key.trim_start_matches("bench/"))
}

/// The acquire and complete commands of one decision of `plan`'s arm.
fn commands(plan: &Plan, key: &str, now: &str, ticket: &str) -> (redis::Cmd, redis::Cmd) {
    match plan.arm {
        Arm::Floor => {
            let mut a = redis::cmd("SET");
            a.arg(key).arg(FLOOR_VALUE);
            let mut c = redis::cmd("GET");
            c.arg(key);
            (a, c)
        }
        Arm::Noop => {
            let mut a = redis::cmd("FB.KEYCHECK");
            a.arg(key);
            (a.clone(), a)
        }
        Arm::Module => {
            // As a fusebox server sends them: the policy by id, the reply
            // packed.
            let mut a = redis::cmd("FB.ACQUIRE");
            a.arg(key)
                .arg(now)
                .arg(ticket)
                .arg(&plan.policy_ref)
                .arg("REPLY")
                .arg("packed");
            let mut c = redis::cmd("FB.COMPLETE");
            c.arg(key)
                .arg(now)
                .arg(ticket)
                .arg("success")
                .arg("REPLY")
                .arg("packed");
            (a, c)
        }
        Arm::Lua => {
            // The script's arguments: its one key, the operation, the time
            // and the ticket, then the operation's own.
            let script = |operation: &str, last: &str| {
                let mut cmd = redis::cmd("EVALSHA");
                cmd.arg(&plan.sha)
                    .arg(1)
                    .arg(key)
                    .arg(operation)
                    .arg(now)
                    .arg(ticket)
                    .arg(last);
                cmd
            };
            (
                script("acquire", &plan.policy),
                script("complete", "success"),
            )
        }
    }
}

/// Whether an acquire reply grants (a ticket, or for the floor, an OK):
/// an array whose first field is the decision, or the packed string.
fn granted(reply: &Value) -> bool {
    let name = match reply {
        Value::Okay => return true,
        Value::Array(parts) => parts.first(),
        Value::BulkString(packed) => {
            return packed.starts_with(b"granted ") || packed.starts_with(b"probe ")
        }
        _ => None,
    };
    match name {
        Some(Value::BulkString(d)) => d == b"granted" || d == b"probe",
        Some(Value::SimpleString(d)) => d == "granted" || d == "probe",
        _ => false,
    }
}

/// A caller that sends `plan.pipeline` decisions in one pipeline, each
/// acquire followed by the completion of its ticket; each decision's
/// latency is its pipeline's.
async fn caller(plan: Plan, mut conn: Conn, mut picker: KeyPicker, seed: u64) -> Tally {
    let mut t = Tally::new();
    let mut rng = Rng::new(seed);
    let now = plan.now_ms.to_string();
    let mut failures = 0u32;
    loop {
        let mut groups = Vec::with_capacity(plan.pipeline as usize);
        for _ in 0..plan.pipeline {
            let key = redis_key(plan.arm, picker.next_key());
            let ticket = format!("{:016x}{:016x}", rng.next_u64(), rng.next_u64());
            let (a, c) = commands(&plan, &key, &now, &ticket);
            groups.push(vec![a, c]);
        }
        let started = Instant::now();
        let replies = conn.groups(groups).await;
        let ended = Instant::now();
        if ended >= plan.window.1 {
            return t;
        }
        let replies = match replies {
            Ok(replies) => replies,
            Err(e) => {
                t.error(format!("pipeline: {e}"));
                failures += 1;
                if failures >= GIVE_UP_AFTER {
                    return t;
                }
                continue;
            }
        };
        failures = 0;
        let mut done = 0u64;
        for pair in replies.chunks(2) {
            match pair {
                [a, Value::ServerError(e)] if granted(a) => t.error(format!("complete: {e:?}")),
                [a, _] if granted(a) => done += 1,
                [Value::Array(_), _] => t.not_granted += 1,
                [other, _] => t.error(format!("acquire: unexpected reply {other:?}")),
                _ => t.error("a pipeline answered an odd number of replies".to_owned()),
            }
        }
        if started >= plan.window.0 && done > 0 {
            t.decisions += done;
            let ns = u64::try_from((ended - started).as_nanos()).unwrap_or(u64::MAX);
            let _ = t.latency.record_n(ns.max(100), done);
        }
    }
}

/// One measured cell: an arm on a spread, with tickets held on each key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Cell {
    arm: Arm,
    spread: Spread,
    live: u32,
}

/// What the counters say at one moment.
struct Readings {
    /// CPU seconds of the primaries (INFO cpu, summed).
    redis_cpu_s: f64,
    /// The same of the replicas.
    replica_cpu_s: f64,
    /// Calls and microseconds per command of the primaries (INFO
    /// commandstats).
    commands: HashMap<String, (u64, u64)>,
    /// The load generator's own CPU time.
    client_cpu: Option<Duration>,
}

/// Everything the measurements share.
struct Bench {
    conns: Vec<Conn>,
    nodes: Vec<MultiplexedConnection>,
    replicas: Vec<MultiplexedConnection>,
    primaries: Vec<String>,
    replica_addrs: Vec<String>,
    policy: String,
    policy_ref: String,
    sha: String,
    origin: Instant,
}

impl Bench {
    async fn open(o: &Options, setup: &Setup<'_>) -> anyhow::Result<Bench> {
        let store = Store::parse(setup.store)?;
        let primaries = primaries(&store).await?;
        let mut nodes = Vec::new();
        for p in &primaries {
            nodes.push(direct(p).await?);
        }
        let replica_addrs = replicas(&mut nodes).await?;
        let mut replica_conns = Vec::new();
        for r in &replica_addrs {
            replica_conns.push(direct(r).await?);
        }
        let sha = redis::Script::new(BREAKER_LUA).get_hash().to_owned();
        let wants_module = setup.arms.contains(&Arm::Module);
        for (addr, c) in primaries.iter().zip(nodes.iter_mut()) {
            let version: redis::RedisResult<Value> = redis::cmd("FB.VERSION").query_async(c).await;
            if let (Err(e), true) = (version, wants_module) {
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
        match &store {
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
            "limiter": {"kind": "concurrency", "permits": setup.permits},
            "lease": {"default": 30_000, "max": HELD_LEASE_MS},
        })
        .to_string();
        let policy_ref = format!(
            "@{}",
            hex::encode(fusebox::domain::policy_id(policy.as_bytes()))
        );
        Ok(Bench {
            conns,
            nodes,
            replicas: replica_conns,
            primaries,
            replica_addrs,
            policy,
            policy_ref,
            sha,
            origin: Instant::now(),
        })
    }

    fn now_ms(&self) -> u64 {
        // +1: never 0, which reads as "no time yet" nowhere, but is clearer
        // in a key's state.
        u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX) + 1
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

    /// Teaches every node the policy (each key's first acquire sends its
    /// JSON, as a server does after `NOPOLICY`) and holds `live` tickets,
    /// for a day, on every key of `spread`.
    async fn prepare(&mut self, spread: Spread, live: u32, now_ms: u64) -> anyhow::Result<()> {
        let conn = &mut self.conns[0];
        let keys: Vec<String> = (0..spread.keys().min(1_000))
            .map(|n| redis_key(Arm::Module, &format!("bench/{}/{n}", spread.name())))
            .collect();
        let now = now_ms.to_string();
        for chunk in keys.chunks(500) {
            let groups = chunk
                .iter()
                .map(|key| {
                    let mut teach = redis::cmd("FB.ACQUIRE");
                    teach
                        .arg(key)
                        .arg(&now)
                        .arg("1")
                        .arg(&self.policy)
                        .arg("PERMITS")
                        .arg(0);
                    vec![teach]
                })
                .collect();
            conn.groups(groups).await.context("teaching the policy")?;
        }
        if live == 0 {
            return Ok(());
        }
        let mut rng = Rng::new(u64::from(live));
        for key in keys.iter().take(spread.keys() as usize) {
            for chunk in 0..live.div_ceil(500) {
                let mut pipe = redis::pipe();
                for _ in (chunk * 500)..(live.min((chunk + 1) * 500)) {
                    pipe.cmd("FB.ACQUIRE")
                        .arg(key)
                        .arg(&now)
                        .arg(format!("{:016x}{:016x}", rng.next_u64(), rng.next_u64()))
                        .arg(&self.policy_ref)
                        .arg("LEASE")
                        .arg(HELD_LEASE_MS);
                }
                let replies = conn.pipe(&pipe).await.context("holding tickets")?;
                if let Some(bad) = replies.iter().find(|r| !granted(r)) {
                    bail!(
                        "holding {live} tickets on {key}: {bad:?}; give the policy more --permits"
                    );
                }
            }
        }
        Ok(())
    }

    /// The counters read at each edge of the measured window.
    async fn readings(&mut self) -> anyhow::Result<Readings> {
        Ok(Readings {
            redis_cpu_s: redis_cpu(&mut self.nodes).await?,
            replica_cpu_s: redis_cpu(&mut self.replicas).await?,
            commands: commandstats(&info(&mut self.nodes, "commandstats").await?),
            client_cpu: own_cpu_time(),
        })
    }

    async fn measure(
        &mut self,
        o: &Options,
        cell: Cell,
        run: u64,
        pipeline: u32,
    ) -> anyhow::Result<Measured> {
        self.clear(cell.arm).await?;
        let now_ms = self.now_ms();
        if cell.arm == Arm::Module {
            self.prepare(cell.spread, cell.live, now_ms).await?;
        }
        let (warmup, duration) = (ms(o.warmup), ms(o.duration));
        let begin = Instant::now() + warmup;
        let end = begin + duration;
        let plan = Plan {
            arm: cell.arm,
            policy_ref: self.policy_ref.clone(),
            policy: self.policy.clone(),
            sha: self.sha.clone(),
            now_ms,
            window: (begin, end),
            pipeline,
        };
        let mut tasks = tokio::task::JoinSet::new();
        let mut n = 0u64;
        for conn in &self.conns {
            for _ in 0..o.in_flight {
                n += 1;
                let seed = run.wrapping_mul(0x9e37_79b9).wrapping_add(n);
                let picker = KeyPicker::new(cell.spread, seed);
                tasks.spawn(caller(plan.clone(), conn.clone(), picker, seed ^ 0x5eed));
            }
        }
        tokio::time::sleep_until(begin.into()).await;
        let before = self.readings().await?;
        tokio::time::sleep_until(end.into()).await;
        let after = self.readings().await?;
        let (mut command_us, mut command_calls) = (0, 0);
        for name in cell.arm.commands() {
            let (c0, u0) = before.commands.get(*name).copied().unwrap_or_default();
            let (c1, u1) = after.commands.get(*name).copied().unwrap_or_default();
            command_calls += c1.saturating_sub(c0);
            command_us += u1.saturating_sub(u0);
        }
        let mut m = Measured {
            duration,
            decisions: 0,
            latency: histogram(),
            not_granted: 0,
            errors: 0,
            first_error: None,
            redis_cpu_s: (after.redis_cpu_s - before.redis_cpu_s).max(0.0),
            replica_cpu_s: (after.replica_cpu_s - before.replica_cpu_s).max(0.0),
            command_us,
            command_calls,
            client_cpu: match (before.client_cpu, after.client_cpu) {
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
    setup: &Setup<'_>,
    warnings: &mut Vec<String>,
) -> anyhow::Result<Report> {
    let mut bench = Bench::open(o, setup).await?;
    eprintln!(
        "bench: Redis primaries {} (INFO cpu and commandstats read from each); replicas {}",
        bench.primaries.join(", "),
        listed(&bench.replica_addrs, "none")
    );
    let spreads: Vec<Spread> = Spread::ALL
        .into_iter()
        .filter(|s| o.spreads.contains(s))
        .collect();
    let mut cells = Vec::new();
    for spread in &spreads {
        for arm in setup.arms {
            cells.push(Cell {
                arm: *arm,
                spread: *spread,
                live: 0,
            });
            if *arm == Arm::Module {
                for live in setup.live.iter().filter(|&&l| l > 0) {
                    cells.push(Cell {
                        arm: Arm::Module,
                        spread: *spread,
                        live: *live,
                    });
                }
            }
        }
    }
    let runs = usize::from(o.runs);
    let mut measured: Vec<Vec<Measured>> = cells.iter().map(|_| Vec::new()).collect();
    for run in 0..runs {
        for at in interleaved(run, cells.len()) {
            let cell = cells[at];
            eprintln!(
                "bench: run {}/{runs}: {} {} live {}",
                run + 1,
                cell.arm.name(),
                cell.spread.name(),
                cell.live
            );
            let m = bench.measure(o, cell, run as u64, setup.pipeline).await?;
            measured[at].push(m);
        }
    }

    let mut rows = Vec::new();
    let mut results = Vec::new();
    for (cell, ms) in cells.iter().zip(&measured) {
        let med = |f: &dyn Fn(&Measured) -> f64| median(ms.iter().map(f).collect());
        let client = median(ms.iter().filter_map(|m| m.client_cpu).collect());
        let errors: u64 = ms.iter().map(|m| m.errors).sum();
        let not_granted: u64 = ms.iter().map(|m| m.not_granted).sum();
        let what = format!(
            "{} {} (live {})",
            cell.arm.name(),
            cell.spread.name(),
            cell.live
        );
        if let Some(e) = ms.iter().find_map(|m| m.first_error.as_ref()) {
            warnings.push(format!("{what}: {errors} calls failed, the first with {e}"));
        }
        if not_granted > 0 {
            warnings.push(format!(
                "{what}: {not_granted} acquires were not granted (not counted as decisions)"
            ));
        }
        if ms.iter().any(|m| {
            m.client_cpu
                .is_some_and(|c| c / f64::from(o.client_threads) >= SATURATED)
        }) {
            warnings.push(format!(
                "the load generator used {:.0}% or more of its {} thread(s) during {what}: it may be the bottleneck (give it more with --client-threads)",
                SATURATED * 100.0,
                o.client_threads,
            ));
        }
        let summary = json!({
            "arm": cell.arm.name(),
            "spread": cell.spread.name(),
            "live_tickets": cell.live,
            "decisions_per_s": med(&Measured::rate),
            "p50_us": med(&|m| percentile_us(&m.latency, 50.0)),
            "p99_us": med(&|m| percentile_us(&m.latency, 99.0)),
            "redis_cpu_us_per_decision": med(&Measured::cpu_us_per_decision),
            "replica_cpu_us_per_decision": med(&Measured::replica_us_per_decision),
            "command_us_per_decision": med(&Measured::command_us_per_decision),
            "redis_cpu_cores": med(&Measured::redis_cores),
            "client_cpu": client,
            "errors": errors,
            "not_granted": not_granted,
        });
        let f = |k: &str| summary[k].as_f64().unwrap_or(0.0);
        rows.push(vec![
            cell.arm.name().to_owned(),
            cell.spread.name().to_owned(),
            cell.live.to_string(),
            thousands(f("decisions_per_s")),
            format!("{:.1}", f("p50_us")),
            format!("{:.1}", f("p99_us")),
            format!("{:.2}", f("redis_cpu_us_per_decision")),
            format!("{:.2}", f("replica_cpu_us_per_decision")),
            format!("{:.2}", f("command_us_per_decision")),
            format!("{:.0}%", f("redis_cpu_cores") * 100.0),
            format!("{:.0}%", client * 100.0),
            errors.to_string(),
        ]);
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
                    "replica_cpu_s": m.replica_cpu_s,
                    "redis_cpu_us_per_decision": m.cpu_us_per_decision(),
                    "replica_cpu_us_per_decision": m.replica_us_per_decision(),
                    "command_us": m.command_us,
                    "command_calls": m.command_calls,
                    "command_us_per_decision": m.command_us_per_decision(),
                    "client_cpu": m.client_cpu,
                    "errors": m.errors,
                    "not_granted": m.not_granted,
                    "first_error": m.first_error,
                })
            })
            .collect::<Json>();
        results.push(result);
    }

    // Ratios within each run (the cells of a run are measured back to
    // back), their median across runs: module/floor and module/lua per
    // spread, and the module with live tickets over the module without.
    let find = |arm: Arm, spread: Spread, live: u32| {
        cells.iter().position(|c| *c == Cell { arm, spread, live })
    };
    let per_run = |a: usize, b: usize, f: &dyn Fn(&Measured) -> f64| {
        median(
            measured[a]
                .iter()
                .zip(&measured[b])
                .filter(|(_, y)| f(y) > 0.0)
                .map(|(x, y)| f(x) / f(y))
                .collect(),
        )
    };
    let mut ratios = Vec::new();
    for spread in &spreads {
        let Some(module) = find(Arm::Module, *spread, 0) else {
            continue;
        };
        let mut pairs: Vec<(String, usize)> = Vec::new();
        if let Some(floor) = find(Arm::Floor, *spread, 0) {
            pairs.push(("module/floor".to_owned(), floor));
        }
        if let Some(lua) = find(Arm::Lua, *spread, 0) {
            pairs.push(("module/lua".to_owned(), lua));
        }
        if let Some(noop) = find(Arm::Noop, *spread, 0) {
            pairs.push(("module/noop".to_owned(), noop));
        }
        let mut pairs: Vec<(String, usize, usize)> =
            pairs.into_iter().map(|(n, o)| (n, module, o)).collect();
        if let (Some(noop), Some(floor)) =
            (find(Arm::Noop, *spread, 0), find(Arm::Floor, *spread, 0))
        {
            pairs.push(("noop/floor".to_owned(), noop, floor));
        }
        for (name, module, other) in pairs {
            let r = json!({
                "ratio": name,
                "spread": spread.name(),
                "decisions_per_s": per_run(module, other, &Measured::rate),
                "redis_cpu_us_per_decision": per_run(module, other, &Measured::cpu_us_per_decision),
                "command_us_per_decision": per_run(module, other, &Measured::command_us_per_decision),
            });
            ratios.push(r);
        }
        for live in setup.live.iter().filter(|&&l| l > 0) {
            if let Some(held) = find(Arm::Module, *spread, *live) {
                ratios.push(json!({
                    "ratio": format!("module live {live}/0"),
                    "spread": spread.name(),
                    "decisions_per_s": per_run(held, module, &Measured::rate),
                    "redis_cpu_us_per_decision": per_run(held, module, &Measured::cpu_us_per_decision),
                    "command_us_per_decision": per_run(held, module, &Measured::command_us_per_decision),
                }));
            }
        }
    }
    for r in &ratios {
        let f = |k: &str| r[k].as_f64().unwrap_or(0.0);
        rows.push(vec![
            r["ratio"].as_str().unwrap_or_default().to_owned(),
            r["spread"].as_str().unwrap_or_default().to_owned(),
            String::new(),
            format!("x{:.3}", f("decisions_per_s")),
            String::new(),
            String::new(),
            format!("x{:.3}", f("redis_cpu_us_per_decision")),
            String::new(),
            format!("x{:.3}", f("command_us_per_decision")),
            String::new(),
            String::new(),
            String::new(),
        ]);
    }

    let (lines, _) = render_table(
        &[
            "ARM",
            "SPREAD",
            "LIVE",
            "DECISIONS/S",
            "P50 µs",
            "P99 µs",
            "CPU µs/DEC",
            "REPLICAS µs/DEC",
            "CMD µs/DEC",
            "REDIS CPU",
            "CLIENT CPU",
            "ERRORS",
        ],
        &rows,
    );
    let mut text = lines.join("\n");
    text.push_str(&format!(
        "\n\n{} run(s) of {} ms warm-up + {} ms measured per row, interleaved; medians across runs.\n\
         {} connections x {} in flight to {} ({} primaries, {} replicas); a decision is an acquire and the \
         completion (success) of its ticket (floor: a SET and a GET of a 64-byte string);\n\
         CPU is used_cpu_sys + used_cpu_user of INFO cpu over the measured window, summed over the primaries \
         (REPLICAS: over the replicas); CMD is the usec INFO commandstats gives the arm's commands;\n\
         LIVE: tickets held on every key of the spread; ratio rows are medians of the ratios within each run.\n\
         pipeline depth {} (decisions per pipeline, each acquire followed by the completion of its ticket).",
        o.runs,
        o.warmup,
        o.duration,
        o.connections,
        o.in_flight,
        setup.store,
        bench.primaries.len(),
        bench.replica_addrs.len(),
        setup.pipeline,
    ));
    let figures = json!({
        "store": setup.store,
        "primaries": bench.primaries,
        "replicas": bench.replica_addrs,
        "policy": bench.policy,
        "lua_sha1": bench.sha,
        "pipeline": setup.pipeline,
        "results": results,
        "ratios": ratios,
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
        let stats = "# Commandstats\r\ncmdstat_fb.acquire:calls=10,usec=35,usec_per_call=3.50,rejected_calls=0,failed_calls=0\r\ncmdstat_get:calls=2,usec=1,usec_per_call=0.50\r\n";
        let parsed = commandstats(&[stats.to_owned(), stats.to_owned()]);
        assert_eq!(parsed["fb.acquire"], (20, 70));
        assert_eq!(parsed["get"], (4, 2));
    }
}

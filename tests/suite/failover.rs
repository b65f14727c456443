//! The store survives its own failures: a primary of the Redis Cluster
//! killed under load fails over to its replica, and a whole cluster stopped
//! and started again from its AOF, with breakers and isolations kept.
//!
//! Without redis-server these tests are skipped, saying so, unless
//! `FUSEBOX_TEST_REQUIRE_TOOLS=1`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fusebox::proto::v1 as pb;
use tonic::transport::Channel;
use tonic::Code;

use crate::admin::request;
use crate::harness::{eventually, millis, servers_on, Server};
use crate::redis_harness::{info_field, wait_for, Cluster};
use crate::resp::{Conn, Reply};
use crate::store::{store_of, trip};
use fusebox::engine::redis::redis_key;

type Client = pb::fusebox_client::FuseboxClient<Channel>;

const CONFIG: &str = r#"
[default]
breaker = { mode = "consecutive", failures = 1, break = "10m" }
"#;

/// What every UNAVAILABLE from a store fault says.
const STORE_UNAVAILABLE: &str = "the state store is unavailable";

/// One line of `CLUSTER NODES`.
#[derive(Debug, Clone)]
struct Node {
    id: String,
    port: u16,
    flags: Vec<String>,
    /// The primary's id, for a replica.
    primary: Option<String>,
    /// Slot ranges served, inclusive.
    slots: Vec<(u16, u16)>,
}

impl Node {
    fn is_primary(&self) -> bool {
        self.flags.iter().any(|f| f == "master")
    }

    fn failed(&self) -> bool {
        self.flags.iter().any(|f| f == "fail" || f == "fail?")
    }

    fn serves(&self, slot: u16) -> bool {
        self.slots.iter().any(|&(a, b)| a <= slot && slot <= b)
    }
}

/// `CLUSTER NODES` as seen by the node on `port`.
fn cluster_nodes(port: u16) -> Vec<Node> {
    let reply = Conn::connect(port)
        .expect("connect to redis")
        .cmd(&["CLUSTER", "NODES"]);
    reply
        .text()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let addr = f[1].split('@').next().expect("ip:port@bus");
            let port = addr
                .rsplit(':')
                .next()
                .and_then(|p| p.parse().ok())
                .unwrap_or_else(|| panic!("a port in {line:?}"));
            let slots = f[8..]
                .iter()
                .filter(|s| !s.starts_with('['))
                .map(|s| match s.split_once('-') {
                    Some((a, b)) => (a.parse().expect("slot"), b.parse().expect("slot")),
                    None => {
                        let n = s.parse().expect("slot");
                        (n, n)
                    }
                })
                .collect();
            Node {
                id: f[0].to_owned(),
                port,
                flags: f[2].split(',').map(str::to_owned).collect(),
                primary: (f[3] != "-").then(|| f[3].to_owned()),
                slots,
            }
        })
        .collect()
}

/// One fusebox server on `store`, with `CONFIG`.
async fn start_on(store: &str) -> Server {
    let mut servers = servers_on(store, CONFIG, false, 1).await;
    servers.pop().expect("one server")
}

/// A cluster and one fusebox server on it (with its `--store` URL), or
/// `None` (skipped) without redis-server.
async fn on_a_cluster(test: &'static str) -> Option<(Cluster, String, Server)> {
    let cluster = tokio::task::spawn_blocking(move || Cluster::start(test))
        .await
        .expect("the cluster starts")?;
    let store = store_of(&cluster);
    let server = start_on(&store).await;
    Some((cluster, store, server))
}

fn keyslot(port: u16, key: &str) -> u16 {
    match Conn::connect(port).expect("connect to redis").cmd(&[
        "CLUSTER",
        "KEYSLOT",
        &redis_key(key),
    ]) {
        Reply::Int(n) => u16::try_from(n).expect("a slot"),
        other => panic!("CLUSTER KEYSLOT: {other:?}"),
    }
}

async fn acquire(c: &mut Client, key: &str) -> pb::AcquireResponse {
    c.acquire(request(key))
        .await
        .unwrap_or_else(|s| panic!("Acquire {key}: {s:?}"))
        .into_inner()
}

async fn isolate(admin: &mut pb::admin_client::AdminClient<Channel>, key: &str) {
    let state = crate::harness::steer(admin, true, None, key, "failover test")
        .await
        .unwrap_or_else(|s| panic!("Isolate {key}: {s:?}"));
    assert_eq!(state.phase, pb::Phase::Isolated as i32, "{key}: {state:?}");
}

/// Makes `count` keys `<prefix><n>`: a third tripped (OPEN), a third
/// isolated, a third CLOSED (every other one of them with a live ticket).
/// Returns each key's phase.
async fn populate(server: &Server, prefix: &str, count: usize) -> BTreeMap<String, pb::Phase> {
    let mut c = server.fusebox().await;
    let mut admin = server.admin().await;
    let mut phases = BTreeMap::new();
    for n in 0..count {
        let key = format!("{prefix}{n}");
        let phase = match n % 3 {
            0 => {
                trip(&mut c, &key).await;
                pb::Phase::Open
            }
            1 => {
                isolate(&mut admin, &key).await;
                pb::Phase::Isolated
            }
            _ => {
                if n % 2 == 0 {
                    let a = acquire(&mut c, &key).await;
                    assert_eq!(a.decision, pb::Decision::Granted as i32, "{key}: {a:?}");
                }
                pb::Phase::Closed
            }
        };
        phases.insert(key, phase);
    }
    for (key, &phase) in &phases {
        let state = server.get(key).await;
        assert_eq!(state.phase, phase as i32, "{key} before: {state:?}");
    }
    phases
}

/// Checks that every key reads back with its phase, an OPEN one with its
/// break still running, across `what` (the failover, the restart).
async fn check_phases(server: &Server, phases: &BTreeMap<String, pb::Phase>, what: &str) {
    let mut admin = server.admin().await;
    let mut problems = Vec::new();
    for (key, &phase) in phases {
        match admin.get_key(pb::GetKeyRequest { key: key.clone() }).await {
            Ok(state) => {
                let state = state.into_inner();
                if state.phase != phase as i32 {
                    problems.push(format!("{key}: expected {phase:?}, read {state:?}"));
                } else if phase == pb::Phase::Open
                    && millis(state.open_remaining).is_none_or(|ms| ms == 0)
                {
                    problems.push(format!("{key}: OPEN but its break is over: {state:?}"));
                }
            }
            Err(s) => problems.push(format!("{key}: GetKey failed: {s:?}")),
        }
    }
    assert!(
        problems.is_empty(),
        "{} keys lost their phase across {what}:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// What the load saw.
#[derive(Default)]
struct Load {
    /// Successful Acquire+Complete rounds, with when each ended, per task.
    successes: Vec<Vec<Instant>>,
    /// Every failed call: when, which task, the code and the message.
    errors: Vec<(Instant, usize, Code, String)>,
    /// Calls that did not answer within the call limit.
    hung: Vec<(Instant, usize, String)>,
}

/// Waits until every load task has had five successful rounds after
/// `since` (since the start, without it).
async fn until_every_task_succeeds(
    load: &Mutex<Load>,
    what: &str,
    limit: Duration,
    since: Option<Instant>,
) {
    eventually(what, limit, || {
        let ok = load
            .lock()
            .expect("load lock")
            .successes
            .iter()
            .all(|s| s.iter().filter(|&&at| since.is_none_or(|t| at > t)).count() >= 5);
        async move { ok.then_some(()) }
    })
    .await;
}

const CALL_LIMIT: Duration = Duration::from_secs(15);

/// One Acquire (and Complete SUCCESS when granted) on `key`.
async fn one_round(c: &mut Client, key: &str) -> Result<Result<(), tonic::Status>, String> {
    let acquired = tokio::time::timeout(CALL_LIMIT, c.acquire(request(key)))
        .await
        .map_err(|_| format!("Acquire {key} did not answer in {CALL_LIMIT:?}"))?;
    let a = match acquired {
        Ok(a) => a.into_inner(),
        Err(s) => return Ok(Err(s)),
    };
    if a.decision != pb::Decision::Granted as i32 {
        return Ok(Err(tonic::Status::unknown(format!(
            "Acquire {key} answered, but not GRANTED: {a:?}"
        ))));
    }
    let done = tokio::time::timeout(
        CALL_LIMIT,
        c.complete(pb::CompleteRequest {
            ticket: a.ticket,
            outcome: pb::Outcome::Success as i32,
            cost: None,
        }),
    )
    .await
    .map_err(|_| format!("Complete {key} did not answer in {CALL_LIMIT:?}"))?;
    Ok(done.map(|_| ()))
}

/// A primary killed under load: the store answers UNAVAILABLE (and nothing
/// else) while its replica takes over, the load goes on after, and no key
/// loses its phase.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_primary_killed_under_load_fails_over_and_keys_keep_their_phase() {
    const TEST: &str = "a_primary_killed_under_load_fails_over_and_keys_keep_their_phase";
    let Some((mut cluster, _, server)) = on_a_cluster(TEST).await else {
        return;
    };
    let phases = populate(&server, "failover/", 60).await;

    // The primary serving the most OPEN and ISOLATED keys.
    let any = cluster.nodes[0].port;
    let nodes = tokio::task::block_in_place(|| cluster_nodes(any));
    let slots: BTreeMap<String, u16> = tokio::task::block_in_place(|| {
        phases
            .keys()
            .map(|k| (k.clone(), keyslot(any, k)))
            .collect()
    });
    let served = |node: &Node, phase: pb::Phase| {
        phases
            .iter()
            .filter(|&(k, &p)| p == phase && node.serves(slots[k]))
            .count()
    };
    let victim = nodes
        .iter()
        .filter(|n| n.is_primary())
        .max_by_key(|n| served(n, pb::Phase::Open) + served(n, pb::Phase::Isolated))
        .expect("a primary")
        .clone();
    let (open_on_victim, isolated_on_victim) = (
        served(&victim, pb::Phase::Open),
        served(&victim, pb::Phase::Isolated),
    );
    assert!(
        open_on_victim > 0 && isolated_on_victim > 0,
        "the primary on port {} serves {open_on_victim} OPEN and {isolated_on_victim} ISOLATED keys",
        victim.port
    );
    // Its replica, once gossip has told the primary's view of the cluster.
    let replica = tokio::task::block_in_place(|| {
        wait_for(
            &format!("the replica of {victim:?}"),
            Duration::from_secs(10),
            || {
                cluster_nodes(victim.port)
                    .into_iter()
                    .find(|n| n.primary.as_deref() == Some(victim.id.as_str()))
            },
        )
    });
    // The trips were not waited for (only isolations are): before the kill,
    // wait until the replica holds what the primary holds for each key.
    tokio::task::block_in_place(|| {
        let mut on_primary = Conn::connect(victim.port).expect("connect to the primary");
        let mut on_replica = Conn::connect(replica.port).expect("connect to the replica");
        assert!(on_replica.cmd(&["READONLY"]).is_ok());
        for key in phases.keys().filter(|k| victim.serves(slots[*k])) {
            let rkey = redis_key(key);
            wait_for(
                &format!("the replica to hold {rkey} as the primary does"),
                Duration::from_secs(10),
                || {
                    let p = on_primary.cmd(&["GET", &rkey]);
                    // A CLOSED key never given a ticket was never stored.
                    assert!(
                        matches!(p, Reply::Bulk(Some(_))) || phases[key] == pb::Phase::Closed,
                        "{rkey}: {p:?}"
                    );
                    (on_replica.cmd(&["GET", &rkey]) == p).then_some(())
                },
            );
        }
    });

    // The load: tasks looping Acquire + Complete SUCCESS over `load/<n>`.
    const TASKS: usize = 4;
    const LOAD_KEYS: usize = 30;
    let load_keys: Vec<String> = (0..LOAD_KEYS).map(|n| format!("load/{n}")).collect();
    let load_on_victim = tokio::task::block_in_place(|| {
        load_keys
            .iter()
            .filter(|k| victim.serves(keyslot(any, k)))
            .count()
    });
    assert!(load_on_victim > 0, "no load key on the victim's slots");
    let load = Arc::new(Mutex::new(Load {
        successes: vec![Vec::new(); TASKS],
        ..Load::default()
    }));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let mut c = server.fusebox().await;
        let (load, stop, keys) = (load.clone(), stop.clone(), load_keys.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = t;
            while !stop.load(Ordering::Relaxed) {
                let key = &keys[i % keys.len()];
                i += TASKS;
                let result = one_round(&mut c, key).await;
                let now = Instant::now();
                let mut load = load.lock().expect("load lock");
                match result {
                    Ok(Ok(())) => load.successes[t].push(now),
                    Ok(Err(s)) => load.errors.push((now, t, s.code(), s.message().to_owned())),
                    Err(hung) => load.hung.push((now, t, hung)),
                }
            }
        }));
    }
    // The load runs before the kill.
    until_every_task_succeeds(
        &load,
        "every load task to succeed",
        Duration::from_secs(10),
        None,
    )
    .await;
    assert!(
        load.lock().expect("load lock").errors.is_empty(),
        "errors before the kill"
    );

    // Kill the primary; wait for its replica to take over.
    let killed_at = Instant::now();
    tokio::task::block_in_place(|| cluster.kill(victim.port));
    let live: Vec<u16> = cluster
        .nodes
        .iter()
        .map(|n| n.port)
        .filter(|&p| p != victim.port)
        .collect();
    let watcher = live
        .iter()
        .copied()
        .find(|&p| p != replica.port)
        .expect("another live node");
    tokio::task::block_in_place(|| {
        wait_for(
            "the replica to be promoted and cluster_state:ok",
            Duration::from_secs(30),
            || {
                let info = Conn::connect(watcher)
                    .ok()?
                    .call(&["CLUSTER", "INFO"])
                    .ok()?;
                if info_field(&info, "cluster_state").as_deref() != Some("ok") {
                    return None;
                }
                let seen = cluster_nodes(watcher);
                let promoted = seen.iter().find(|n| n.id == replica.id)?;
                let dead = seen.iter().find(|n| n.id == victim.id)?;
                (promoted.is_primary()
                    && !promoted.failed()
                    && dead.failed()
                    && victim.slots.iter().all(|&(a, _)| promoted.serves(a)))
                .then_some(())
            },
        )
    });
    let switched = killed_at.elapsed();
    tokio::task::block_in_place(|| cluster.wait_ok(&live, Duration::from_secs(30)));
    let cluster_ok = Instant::now();

    // The load succeeds again: every task, after the switch.
    until_every_task_succeeds(
        &load,
        "every load task to succeed after the switch",
        Duration::from_secs(15),
        Some(cluster_ok),
    )
    .await;
    let recovered = killed_at.elapsed();
    // And every load key, the victim's included, answers.
    let mut c = server.fusebox().await;
    for key in &load_keys {
        let result = one_round(&mut c, key).await;
        assert!(
            matches!(result, Ok(Ok(()))),
            "{key} after the switch: {result:?}"
        );
    }
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.expect("a load task");
    }

    let load = std::mem::take(&mut *load.lock().expect("load lock"));
    let unavailable = load
        .errors
        .iter()
        .filter(|(_, _, code, _)| *code == Code::Unavailable)
        .count();
    let last_error = load
        .errors
        .iter()
        .map(|(at, ..)| at.duration_since(killed_at))
        .max();
    let rounds: usize = load.successes.iter().map(Vec::len).sum();
    eprintln!(
        "failover: killed the primary on port {} ({open_on_victim} OPEN, {isolated_on_victim} ISOLATED, \
         {load_on_victim} load keys); replica on port {} promoted and cluster_state:ok after {switched:?}; \
         every load task succeeding again after {recovered:?}; {unavailable} UNAVAILABLE answers \
         (last {last_error:?} after the kill), {} other errors, {} calls hung, {rounds} successful rounds",
        victim.port,
        replica.port,
        load.errors.len() - unavailable,
        load.hung.len(),
    );
    let mut messages: Vec<&str> = load.errors.iter().map(|(.., m)| m.as_str()).collect();
    messages.sort_unstable();
    messages.dedup();
    for message in messages.iter().take(5) {
        eprintln!("failover: one of the errors: {message}");
    }
    assert!(
        load.hung.is_empty(),
        "calls that did not answer: {:?}",
        load.hung
    );
    let wrong: Vec<_> = load
        .errors
        .iter()
        .filter(|(_, _, code, message)| {
            *code != Code::Unavailable || !message.contains(STORE_UNAVAILABLE)
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "{} of {} errors were not UNAVAILABLE saying the store was unavailable: {:?}",
        wrong.len(),
        load.errors.len(),
        wrong.iter().take(10).collect::<Vec<_>>()
    );

    check_phases(&server, &phases, "the failover").await;
}

/// The whole cluster shut down and started again on the same ports and
/// directories: every node reloads its AOF, and a new fusebox server reads
/// every breaker and isolation as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_cluster_restarted_from_its_aof_keeps_breakers_and_isolations() {
    const TEST: &str = "a_whole_cluster_restarted_from_its_aof_keeps_breakers_and_isolations";
    let Some((mut cluster, store, server)) = on_a_cluster(TEST).await else {
        return;
    };
    let mut server = server;
    let phases = populate(&server, "restart/", 30).await;
    server.terminate();
    let status = tokio::time::timeout(Duration::from_secs(30), server.child.wait())
        .await
        .expect("fusebox exits on SIGTERM")
        .expect("wait for fusebox");
    assert!(status.success(), "fusebox exited with {status}");
    drop(server);

    let ports: Vec<u16> = cluster.nodes.iter().map(|n| n.port).collect();
    tokio::task::block_in_place(|| {
        // Every key is on a primary's AOF once SHUTDOWN returns: SHUTDOWN
        // (NOSAVE too) writes and fsyncs the AOF before exiting; NOSAVE
        // skips an RDB snapshot, which an AOF server does not load anyway.
        // Replicas first, so that no replica can start a failover while
        // its primary is already down.
        let replicas: Vec<u16> = cluster.replicas().iter().map(|n| n.port).collect();
        let primaries: Vec<u16> = cluster.primaries().iter().map(|n| n.port).collect();
        assert_eq!((replicas.len(), primaries.len()), (3, 3));
        for port in replicas.iter().chain(&primaries) {
            cluster
                .node_mut(*port)
                .shutdown(&["NOSAVE"], Duration::from_secs(20));
        }
        for node in &cluster.nodes {
            let aof = node.dir.join("appendonlydir");
            let parts = std::fs::read_dir(&aof)
                .unwrap_or_else(|e| panic!("{}: {e}", aof.display()))
                .count();
            assert!(parts >= 2, "{}: {parts} files", aof.display());
        }
        for port in &ports {
            cluster.node_mut(*port).restart(Duration::from_secs(30));
        }
        cluster.wait_ok(&ports, Duration::from_secs(30));
        // The same topology: the same three primaries.
        let again: Vec<u16> = cluster.primaries().iter().map(|n| n.port).collect();
        assert_eq!(again, primaries, "the primaries after the restart");
    });

    let server = start_on(&store).await;
    check_phases(&server, &phases, "the restart").await;
    // And the server works on the reloaded cluster: an OPEN key blocks,
    // an ISOLATED one refuses, a new key is granted.
    let mut c = server.fusebox().await;
    for (key, &phase) in phases.iter().take(3) {
        let a = acquire(&mut c, key).await;
        let expected = match phase {
            pb::Phase::Closed => pb::Decision::Granted,
            pb::Phase::Isolated => pb::Decision::Refused,
            _ => pb::Decision::Blocked,
        };
        assert_eq!(a.decision, expected as i32, "{key} ({phase:?}): {a:?}");
    }
}

// ---------------------------------------------------------------------------
// One probe per break across a failover that loses writes (B2).
//
// Redis replicates asynchronously: a primary cut off from its replica
// still answers, and what it writes then is lost when the replica takes
// over. The test puts a relay it controls on the replication link (and
// another between the fusebox server and the primary, which it points at
// the new primary after the failover), cuts the replication link, asks for
// the probe, kills the primary, promotes the replica (and gives it a new
// replica of its own, as an operator or Sentinel would), and keeps asking.
// ---------------------------------------------------------------------------

/// A TCP relay on a free loopback port to `127.0.0.1:<target>`: the target
/// can be changed (new connections go there) and the relay cut (every
/// byte in either direction is dropped from then on, the connections left
/// open, as a network partition does).
struct Relay {
    port: u16,
    target: Arc<std::sync::atomic::AtomicU16>,
    cut: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    async fn to(target: u16) -> Relay {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a relay port");
        let port = listener.local_addr().expect("its address").port();
        let target = Arc::new(std::sync::atomic::AtomicU16::new(target));
        let cut = Arc::new(AtomicBool::new(false));
        let (to, cutting) = (target.clone(), cut.clone());
        let task = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let port = to.load(Ordering::SeqCst);
                let cutting = cutting.clone();
                tokio::spawn(async move {
                    let Ok(outbound) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await
                    else {
                        return;
                    };
                    let (ri, wi) = inbound.into_split();
                    let (ro, wo) = outbound.into_split();
                    tokio::join!(
                        Relay::pump(ri, wo, cutting.clone()),
                        Relay::pump(ro, wi, cutting)
                    );
                });
            }
        });
        Relay {
            port,
            target,
            cut,
            task,
        }
    }

    async fn pump(
        mut from: tokio::net::tcp::OwnedReadHalf,
        mut to: tokio::net::tcp::OwnedWriteHalf,
        cut: Arc<AtomicBool>,
    ) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match from.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if cut.load(Ordering::SeqCst) {
                        continue;
                    }
                    if to.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            }
        }
        let _ = to.shutdown().await;
    }

    fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
    }

    fn point_at(&self, port: u16) {
        self.target.store(port, Ordering::SeqCst);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A primary with one replica linked through a relay the test may cut.
struct Chain {
    tools: crate::redis_harness::Tools,
    dir: tempfile::TempDir,
    primary: crate::redis_harness::Server,
    replica: crate::redis_harness::Server,
    link: Relay,
}

const REDIS_ARGS: [&str; 6] = [
    "--save",
    "",
    "--appendonly",
    "no",
    "--repl-diskless-sync-delay",
    "0",
];

/// A replica of the server on `port`, through a new relay; waits for its
/// link.
async fn replica_of(
    tools: &crate::redis_harness::Tools,
    dir: &std::path::Path,
    port: u16,
) -> (crate::redis_harness::Server, Relay) {
    let link = Relay::to(port).await;
    let relay = link.port.to_string();
    let mut args: Vec<&str> = REDIS_ARGS.to_vec();
    args.extend(["--replicaof", "127.0.0.1", &relay]);
    let (tools, dir) = (tools.clone(), dir.to_owned());
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let replica = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        crate::redis_harness::Server::start(&tools, &dir, &args, false)
    })
    .await
    .expect("the replica starts");
    let port = replica.port;
    eventually(
        "the replica's link",
        Duration::from_secs(30),
        || async move {
            let info = Conn::connect(port).ok()?.cmd(&["INFO", "replication"]);
            (info_field(&info, "master_link_status").as_deref() == Some("up")).then_some(())
        },
    )
    .await;
    (replica, link)
}

impl Chain {
    async fn start(test: &str) -> Option<Chain> {
        let tools = crate::redis_harness::Tools::find(test)?;
        let dir = tempfile::tempdir().expect("a temporary directory");
        let primary = {
            let (tools, path) = (tools.clone(), dir.path().to_owned());
            tokio::task::spawn_blocking(move || {
                crate::redis_harness::Server::start(&tools, &path, &REDIS_ARGS, false)
            })
            .await
            .expect("the primary starts")
        };
        let (replica, link) = replica_of(&tools, dir.path(), primary.port).await;
        Some(Chain {
            tools,
            dir,
            primary,
            replica,
            link,
        })
    }

    /// Kills the primary, promotes its replica, and gives the new primary
    /// a replica of its own (the old primary's place).
    async fn fail_over(&mut self) {
        self.primary.kill();
        let promoted = self.replica.conn().cmd(&["REPLICAOF", "NO", "ONE"]);
        assert!(promoted.is_ok(), "REPLICAOF NO ONE: {promoted:?}");
        let (replica, link) = replica_of(&self.tools, self.dir.path(), self.replica.port).await;
        self.primary = std::mem::replace(&mut self.replica, replica);
        self.link = link;
    }
}

const PROBE_CONFIG: &str = r#"
[default]
breaker = { mode = "consecutive", failures = 1, break = "200ms", probe_lease = "1m" }
lease = { default = "1m", max = "5m" }
"#;

/// What a burst of concurrent acquires of `key` was answered.
#[derive(Debug, Default)]
struct Burst {
    probes: usize,
    unavailable: usize,
    blocked: usize,
}

async fn burst(server: &Server, key: &str, callers: usize) -> Burst {
    let mut tasks = Vec::new();
    for _ in 0..callers {
        let mut c = server.fusebox().await;
        let key = key.to_owned();
        tasks.push(tokio::spawn(async move {
            c.acquire(pb::AcquireRequest {
                key,
                ..Default::default()
            })
            .await
        }));
    }
    let mut b = Burst::default();
    for t in tasks {
        match t.await.expect("a caller") {
            Ok(r) if r.get_ref().decision == pb::Decision::Probe as i32 => b.probes += 1,
            Ok(_) => b.blocked += 1,
            Err(s) if s.code() == Code::Unavailable => b.unavailable += 1,
            Err(s) => panic!("{key}: {s:?}"),
        }
    }
    b
}

/// One round: a break on `key`, the replication link cut, callers asking
/// for the probe, the primary killed and the replica promoted, callers
/// asking again until a probe is handed out (or 10 s pass). Returns the
/// PROBE answers before and after the failover; no probe is completed, so
/// every one of them holds its slot.
async fn round(chain: &mut Chain, front: &Relay, server: &Server, key: &str) -> (usize, usize) {
    let mut c = server.fusebox().await;
    trip(&mut c, key).await;
    // The trip is on the replica before the link is cut.
    let (replica, rk) = (chain.replica.port, redis_key(key));
    eventually(
        "the replica to hold the trip",
        Duration::from_secs(10),
        || {
            let rk = rk.clone();
            async move {
                match Conn::connect(replica).ok()?.cmd(&["FB.GET", &rk, "*"]) {
                    Reply::Bulk(Some(view)) => String::from_utf8_lossy(&view)
                        .contains("\"phase\":\"open\"")
                        .then_some(()),
                    _ => None,
                }
            }
        },
    )
    .await;
    chain.link.cut();
    let admin = server.admin().await;
    eventually("the break to end", Duration::from_secs(10), || {
        let mut admin = admin.clone();
        let key = key.to_owned();
        async move {
            let s = admin
                .get_key(pb::GetKeyRequest { key })
                .await
                .ok()?
                .into_inner();
            (millis(s.open_remaining) == Some(0)).then_some(())
        }
    })
    .await;
    let mut before = 0;
    for _ in 0..3 {
        before += burst(server, key, 8).await.probes;
    }
    chain.fail_over().await;
    front.point_at(chain.primary.port);
    let mut after = 0;
    let deadline = Instant::now() + Duration::from_secs(10);
    while after == 0 && Instant::now() < deadline {
        after += burst(server, key, 8).await.probes;
    }
    (before, after)
}

/// B2 across a failover that loses writes: with probes confirmed by a
/// replica (`--store-probe-replicas 1`), at most one caller is answered
/// PROBE for each break, in each of 20 rounds; with `0` (no confirmation),
/// the promoted replica, which never heard of the first probe, lets a
/// second one out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_probe_per_break_even_when_a_failover_loses_the_first() {
    let test = "one_probe_per_break_even_when_a_failover_loses_the_first";
    let Some(mut chain) = Chain::start(test).await else {
        return;
    };
    let front = Relay::to(chain.primary.port).await;
    let store = format!("redis://127.0.0.1:{}", front.port);
    let confirmed = Server::start(crate::harness::Options {
        config: Some(PROBE_CONFIG),
        args: vec![
            "--store",
            &store,
            "--store-probe-replicas",
            "1",
            "--store-probe-wait",
            "500ms",
        ],
        ..Default::default()
    })
    .await;
    for r in 0..20 {
        let (before, after) = round(&mut chain, &front, &confirmed, &format!("probe/{r}")).await;
        assert!(
            before + after <= 1,
            "round {r}: {before} probe(s) before the failover and {after} after: at most one per break"
        );
        assert_eq!(
            (before, after),
            (0, 1),
            "round {r}: the probe the replica could not confirm is not handed out; the promoted replica's is"
        );
    }
    drop(confirmed);
    let unconfirmed = Server::start(crate::harness::Options {
        config: Some(PROBE_CONFIG),
        args: vec!["--store", &store, "--store-probe-replicas", "0"],
        ..Default::default()
    })
    .await;
    for r in 0..3 {
        let (before, after) = round(&mut chain, &front, &unconfirmed, &format!("lost/{r}")).await;
        assert_eq!(
            (before, after),
            (1, 1),
            "round {r}: without confirmation, a second probe goes out while the first holds its slot"
        );
    }
}

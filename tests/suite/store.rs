//! State in Redis (`serve --store`): real `redis-server`s with the fusebox
//! module loaded (one server, or a Redis Cluster of three primaries and
//! three replicas), several fusebox servers on them, every call over gRPC.
//!
//! Without redis-server these tests are skipped, saying so, unless
//! `FUSEBOX_TEST_REQUIRE_TOOLS=1` (as `./scripts/test` sets).

use std::time::Duration;

use fusebox::proto::v1 as pb;

use crate::admin::complete;
use crate::harness::{eventually, servers_on, steer, Server};
use crate::redis_harness::Cluster;
use crate::vectors::{load_all, replay, GrpcTarget};

/// Empties every primary, so that a vector starts on no keys and no
/// policies.
pub fn flush(ports: &[u16]) {
    for &port in ports {
        let mut conn = crate::resp::Conn::connect(port).expect("connect to redis");
        let reply = conn.cmd(&["FLUSHALL", "SYNC"]);
        assert!(
            reply.is_ok() || reply.text().contains("READONLY"),
            "FLUSHALL: {reply:?}"
        );
    }
}

async fn every_vector_over_two_servers(store: &str, ports: &[u16]) {
    let vectors = load_all();
    assert!(!vectors.is_empty());
    let mut failures = Vec::new();
    for vector in &vectors {
        flush(ports);
        let mut target = GrpcTarget::shared(&vector.policy, store, 2).await;
        let problems = replay(vector, &mut target).await;
        if !problems.is_empty() {
            failures.push(format!("{}:\n  {}", vector.name, problems.join("\n  ")));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} vectors failed over two servers on {store}:\n{}",
        failures.len(),
        vectors.len(),
        failures.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_vector_passes_over_two_servers_on_one_redis() {
    let Some(redis) =
        crate::harness::standalone("every_vector_passes_over_two_servers_on_one_redis").await
    else {
        return;
    };
    let port = redis.server.port;
    every_vector_over_two_servers(&format!("redis://127.0.0.1:{port}"), &[port]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_vector_passes_over_two_servers_on_a_cluster() {
    let Some(cluster) = tokio::task::spawn_blocking(|| {
        Cluster::start("every_vector_passes_over_two_servers_on_a_cluster")
    })
    .await
    .expect("the cluster starts") else {
        return;
    };
    let primaries: Vec<u16> = cluster.primaries().iter().map(|s| s.port).collect();
    every_vector_over_two_servers(&store_of(&cluster), &primaries).await;
}

/// The `--store` URL of a cluster, naming every node.
pub fn store_of(cluster: &Cluster) -> String {
    let nodes: Vec<String> = cluster
        .nodes
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.port))
        .collect();
    format!("redis-cluster://{}", nodes.join(","))
}

const FLEET_KEY: &str = "fleet/payments";
const ROUNDS: u32 = 50;
const CONNECTIONS_PER_SERVER: usize = 6;

type Client = pb::fusebox_client::FuseboxClient<tonic::transport::Channel>;

/// B2 across servers: after each break, 400 acquires fired at once over
/// three fusebox servers on one cluster get exactly one PROBE; 50 rounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_probe_for_a_fleet_across_three_servers_on_a_cluster() {
    let Some(cluster) = tokio::task::spawn_blocking(|| {
        Cluster::start("one_probe_for_a_fleet_across_three_servers_on_a_cluster")
    })
    .await
    .expect("the cluster starts") else {
        return;
    };
    let store = store_of(&cluster);
    let config = r#"
[default]
breaker = { mode = "consecutive", failures = 1, break = "50ms", probe_lease = "30s" }
"#;
    let servers = servers_on(&store, config, false, 3).await;
    let mut clients: Vec<Client> = Vec::new();
    for _ in 0..CONNECTIONS_PER_SERVER {
        for server in &servers {
            clients.push(server.fusebox().await);
        }
    }
    trip(&mut servers[0].fusebox().await, FLEET_KEY).await;
    for round in 1..=ROUNDS {
        // The break ends on the store's clock: wait until a status check on
        // any server says so.
        let checker = &clients[round as usize % clients.len()];
        crate::fleet::until_the_break_ends(checker, round).await;
        let answers = crate::fleet::fire(&clients, crate::admin::request(FLEET_KEY)).await;
        let probe = crate::fleet::one_probe(round, &answers, |_| true);
        crate::fleet::check_half_open(&servers[round as usize % 3], round).await;
        // The probe fails, through another server: the breaker opens again.
        let mut finisher = servers[(round as usize + 1) % 3].fusebox().await;
        let done = complete(&mut finisher, &probe, pb::Outcome::Failure).await;
        crate::fleet::probe_failed(round, &done);
    }
}

/// A cluster and two servers on it, each with `config`.
async fn two_servers_on_a_cluster(
    test: &'static str,
    config: &str,
) -> Option<(Cluster, Server, Server)> {
    let cluster = tokio::task::spawn_blocking(move || Cluster::start(test))
        .await
        .expect("the cluster starts")?;
    let mut servers = servers_on(&store_of(&cluster), config, false, 2).await;
    let b = servers.pop().expect("two servers");
    let a = servers.pop().expect("two servers");
    Some((cluster, a, b))
}

const ONE_FAILURE_TRIPS: &str = r#"
[default]
breaker = { mode = "consecutive", failures = 1, break = "10m" }
"#;

/// One granted call at `key` that ends with `outcome`: the phase after it.
pub async fn pair(client: &mut Client, key: &str, outcome: pb::Outcome) -> i32 {
    let a = client
        .acquire(crate::admin::request(key))
        .await
        .expect("Acquire")
        .into_inner();
    assert_eq!(a.decision, pb::Decision::Granted as i32, "{key}: {a:?}");
    complete(client, &a.ticket, outcome).await.phase
}

/// Trips `key` (a breaker that one failure trips): one granted call that
/// fails opens it.
pub async fn trip(client: &mut Client, key: &str) {
    let phase = pair(client, key, pb::Outcome::Failure).await;
    assert_eq!(phase, pb::Phase::Open as i32, "{key}");
}

/// ListKeys walks every primary: keys made through one server (spread
/// over the cluster's slots) are listed, each once, page by page (each page
/// in key order, the pages in each primary's scan order), by the other,
/// with their phases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_keys_walks_every_primary_of_the_cluster() {
    let Some((_cluster, a, b)) = two_servers_on_a_cluster(
        "list_keys_walks_every_primary_of_the_cluster",
        ONE_FAILURE_TRIPS,
    )
    .await
    else {
        return;
    };
    let mut client = a.fusebox().await;
    let mut expected: Vec<String> = (0..30).map(|i| format!("listed/{i:02}")).collect();
    for key in &expected {
        trip(&mut client, key).await;
    }
    trip(&mut client, "other/x").await;
    let mut admin = b.admin().await;
    expected.sort();
    // Page sizes below a SCAN bucket's keys too: a page never holds more
    // than asked (list_all checks), and goes on inside the bucket.
    for page_size in [1, 2, 7] {
        let mut listed = crate::admin::list_all(&mut admin, "listed/", &[], page_size).await;
        listed.sort();
        listed.dedup();
        assert_eq!(listed, expected, "every key, pages of {page_size}");
    }
    let open = crate::admin::list_all(&mut admin, "", &[pb::Phase::Open], 100).await;
    assert_eq!(open.len(), 31, "{open:?}");
    let closed = crate::admin::list_all(&mut admin, "", &[pb::Phase::Closed], 100).await;
    assert!(closed.is_empty(), "{closed:?}");
}

/// A policy set through one server is the fleet's: the other server
/// decides under it (after hearing of it), and lists it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_set_on_one_server_is_used_by_the_others() {
    let Some((_cluster, a, b)) = two_servers_on_a_cluster(
        "a_policy_set_on_one_server_is_used_by_the_others",
        ONE_FAILURE_TRIPS,
    )
    .await
    else {
        return;
    };
    let mut admin_a = a.admin().await;
    crate::admin::set_policy(
        &mut admin_a,
        crate::admin::rule("single/*", None, Some(crate::admin::concurrency(1))),
    )
    .await
    .expect("SetPolicy answers");
    let admin_b = b.admin().await;
    eventually(
        "the other server to hear of the rule",
        Duration::from_secs(10),
        || {
            let mut admin = admin_b.clone();
            async move {
                let rules = crate::admin::policies(&mut admin).await.rules;
                rules.iter().any(|r| r.r#match == "single/*").then_some(())
            }
        },
    )
    .await;
    let mut client = b.fusebox().await;
    let request = || crate::admin::request("single/db");
    let first = client
        .acquire(request())
        .await
        .expect("Acquire")
        .into_inner();
    assert_eq!(first.decision, pb::Decision::Granted as i32, "{first:?}");
    let second = client
        .acquire(request())
        .await
        .expect("Acquire")
        .into_inner();
    // One permit under the shared rule.
    crate::admin::assert_denied(&second, pb::Reason::NoPermits);
}

/// A watcher on one server sees what happens on another: a trip, an
/// isolate with who and why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_on_one_server_sees_transitions_made_on_another() {
    let Some((_cluster, a, b)) = two_servers_on_a_cluster(
        "a_watcher_on_one_server_sees_transitions_made_on_another",
        ONE_FAILURE_TRIPS,
    )
    .await
    else {
        return;
    };
    let mut watch = a
        .admin()
        .await
        .watch(pb::WatchRequest {
            prefix: "watched/".into(),
        })
        .await
        .expect("Watch answers")
        .into_inner();
    // The snapshot first: the stream is live from here on.
    let first = tokio::time::timeout(Duration::from_secs(10), watch.message())
        .await
        .expect("a snapshot in time")
        .expect("the stream")
        .expect("an event");
    assert!(
        matches!(first.event, Some(pb::watch_event::Event::Snapshot(_))),
        "{first:?}"
    );
    trip(&mut b.fusebox().await, "watched/payments").await;
    let mut admin = b.admin().await;
    steer(
        &mut admin,
        true,
        None,
        "watched/payments",
        "provider incident",
    )
    .await
    .expect("Isolate answers");
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let event = tokio::time::timeout(Duration::from_secs(10), watch.message())
            .await
            .expect("a transition in time")
            .expect("the stream")
            .expect("an event");
        if let Some(pb::watch_event::Event::Transition(t)) = event.event {
            seen.push(t);
        }
    }
    assert_eq!(
        (seen[0].key.as_str(), seen[0].from, seen[0].to),
        (
            "watched/payments",
            pb::Phase::Closed as i32,
            pb::Phase::Open as i32
        ),
        "{seen:?}"
    );
    assert_eq!(
        (seen[1].from, seen[1].to, seen[1].reason.as_str()),
        (
            pb::Phase::Open as i32,
            pb::Phase::Isolated as i32,
            "provider incident"
        ),
        "{seen:?}"
    );
    assert!(!seen[1].who.is_empty(), "{seen:?}");
}

/// P6 across servers: a waiter whose caller goes away leaves the queue,
/// and the permit freed later goes to the next waiter on the other server,
/// in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_goes_away_leaves_the_queue_and_the_next_is_served() {
    let Some((_cluster, a, b)) = two_servers_on_a_cluster(
        "a_waiter_that_goes_away_leaves_the_queue_and_the_next_is_served",
        r#"
[default]
limiter = { kind = "concurrency", permits = 1, queue_limit = 10 }
"#,
    )
    .await
    else {
        return;
    };
    const KEY: &str = "queued/db";
    let wait = |max_wait: u64| pb::AcquireRequest {
        key: KEY.into(),
        permits: None,
        max_wait: Some(crate::harness::ms(max_wait)),
        lease: None,
        ..Default::default()
    };
    let mut holder = a.fusebox().await;
    let held = holder.acquire(wait(0)).await.expect("Acquire").into_inner();
    assert_eq!(held.decision, pb::Decision::Granted as i32, "{held:?}");
    // A waiter on server A that goes away, then one on server B that stays.
    let mut leaving = a.fusebox().await;
    let gone = tokio::spawn(async move { leaving.acquire(wait(60_000)).await });
    let waiters = |n: u32| {
        let b = &b;
        async move {
            eventually(&format!("{n} waiters"), Duration::from_secs(10), || async {
                (b.get(KEY).await.waiters == n).then_some(())
            })
            .await
        }
    };
    waiters(1).await;
    let mut staying = b.fusebox().await;
    let stays = tokio::spawn(async move { staying.acquire(wait(60_000)).await });
    waiters(2).await;
    gone.abort();
    waiters(1).await;
    complete(&mut holder, &held.ticket, pb::Outcome::Success).await;
    crate::admin::granted_within(stays, Duration::from_secs(10)).await;
    let state = a.get(KEY).await;
    assert_eq!((state.waiters, state.live_tickets), (0, 1), "{state:?}");
    assert_eq!(state.stats.expect("stats").withdrawn, 1);
}

/// The value of a sample in the Prometheus text format (`series` is the
/// name with its labels, as written).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (name, value) = l.rsplit_once(' ')?;
        (name == series).then(|| value.parse().ok())?
    })
}

async fn metrics(server: &Server) -> String {
    let addr = server.http_addr.clone().expect("an HTTP address");
    let reply = crate::http::get(&addr, "/metrics").await;
    assert_eq!(reply.status, 200, "{reply:?}");
    reply.body
}

/// With `--store`, `/metrics` moves as it does embedded: each server's
/// decisions (per server), the transitions it hears, and the fleet's keys
/// by phase, tickets and keys, read from the store, alike on every server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_with_a_store_move_as_they_do_embedded() {
    let Some(redis) =
        crate::harness::standalone("metrics_with_a_store_move_as_they_do_embedded").await
    else {
        return;
    };
    let store = format!("redis://127.0.0.1:{}", redis.server.port);
    let mut servers = servers_on(&store, ONE_FAILURE_TRIPS, false, 2).await;
    let (b, a) = (servers.pop().expect("b"), servers.pop().expect("a"));
    let before = metrics(&a).await;
    assert_eq!(
        sample(&before, "fusebox_decisions_total{decision=\"granted\"}"),
        Some(0.0)
    );
    assert_eq!(
        sample(&before, "fusebox_keys_by_phase{phase=\"OPEN\"}"),
        Some(0.0)
    );

    let mut client = a.fusebox().await;
    trip(&mut client, "m/open").await;
    let held = client
        .acquire(crate::admin::request("m/held"))
        .await
        .expect("Acquire")
        .into_inner();
    assert_eq!(held.decision, pb::Decision::Granted as i32);
    let blocked = client
        .acquire(crate::admin::request("m/open"))
        .await
        .expect("Acquire")
        .into_inner();
    assert_eq!(blocked.decision, pb::Decision::Blocked as i32);
    let mut admin = a.admin().await;
    steer(&mut admin, true, None, "m/iso", "test")
        .await
        .expect("Isolate");

    for server in [&a, &b] {
        let text = eventually("the fleet's figures", Duration::from_secs(10), || async {
            let text = metrics(server).await;
            let n = |s: &str| sample(&text, s).unwrap_or(-1.0);
            (n("fusebox_keys_by_phase{phase=\"OPEN\"}") == 1.0
                && n("fusebox_keys_by_phase{phase=\"ISOLATED\"}") == 1.0
                && n("fusebox_tickets") == 1.0
                && n("fusebox_transitions_total") >= 2.0)
                .then_some(text)
        })
        .await;
        assert!(
            text.contains("# HELP fusebox_keys Live keys (the whole store's"),
            "the figure says it is the store's"
        );
    }
    let a_text = metrics(&a).await;
    let b_text = metrics(&b).await;
    assert_eq!(
        sample(&a_text, "fusebox_decisions_total{decision=\"granted\"}"),
        Some(2.0),
        "a's own decisions"
    );
    assert_eq!(
        sample(&a_text, "fusebox_decisions_total{decision=\"blocked\"}"),
        Some(1.0)
    );
    assert_eq!(
        sample(&a_text, "fusebox_denials_total{reason=\"open\"}"),
        Some(1.0)
    );
    assert_eq!(
        sample(&b_text, "fusebox_decisions_total{decision=\"granted\"}"),
        Some(0.0),
        "b answered nothing"
    );
    // The keys are counted by each primary's pass over its keys.
    eventually("the keys counted", Duration::from_secs(30), || async {
        let text = metrics(&b).await;
        (sample(&text, "fusebox_keys") == Some(3.0)).then_some(())
    })
    .await;
    assert!(
        !a_text.contains("fusebox_keys_forgotten_total"),
        "Redis forgets keys uncounted"
    );
}

/// `FB.LIST` calls each primary answered since its stats were reset.
fn fb_list_calls(port: u16) -> u64 {
    let stats = crate::resp::Conn::connect(port)
        .expect("connect to redis")
        .cmd(&["INFO", "commandstats"])
        .text();
    stats
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_fb.list:calls="))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

/// A ListKeys page costs one bounded `FB.LIST` step on each primary it
/// reaches, over the server's own connections: listing 600 keys of a 3+3
/// cluster in pages of 250 takes a few steps in all, never a walk of every
/// primary per page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_keys_page_is_one_bounded_step_per_primary() {
    let Some((cluster, a, _b)) = two_servers_on_a_cluster(
        "a_list_keys_page_is_one_bounded_step_per_primary",
        ONE_FAILURE_TRIPS,
    )
    .await
    else {
        return;
    };
    let mut client = a.fusebox().await;
    for i in 0..600 {
        let key = format!("page/{i:03}");
        let got = client
            .acquire(crate::admin::request(&key))
            .await
            .expect("Acquire");
        assert_eq!(got.get_ref().decision, pb::Decision::Granted as i32);
    }
    let primaries: Vec<u16> = cluster.primaries().iter().map(|p| p.port).collect();
    for &port in &primaries {
        let reset = crate::resp::Conn::connect(port)
            .expect("connect to redis")
            .cmd(&["CONFIG", "RESETSTAT"]);
        assert!(reset.is_ok());
    }
    let mut admin = a.admin().await;
    let mut token = String::new();
    let (mut pages, mut listed) = (0, Vec::new());
    loop {
        let page = crate::admin::list(&mut admin, "page/", &[], 250, &token)
            .await
            .expect("ListKeys");
        assert!(page.keys.len() <= 250);
        pages += 1;
        listed.extend(page.keys.into_iter().map(|k| k.key));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    listed.sort();
    listed.dedup();
    assert_eq!(listed.len(), 600, "every key once");
    let steps: Vec<u64> = primaries.iter().map(|&p| fb_list_calls(p)).collect();
    let total: u64 = steps.iter().sum();
    assert!(
        total <= pages + primaries.len() as u64,
        "{pages} pages took {steps:?} FB.LIST steps on the primaries: at most one per primary a page reaches"
    );
}

/// A Redis at its `maxmemory` refuses writes with `OOM`: callers get
/// `RESOURCE_EXHAUSTED` with words that say the store is full and what to
/// do, never `INTERNAL`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_store_answers_resource_exhausted_in_words() {
    let Some(redis) = crate::harness::standalone("a_full_store_answers_resource_exhausted").await
    else {
        return;
    };
    let port = redis.server.port;
    let store = format!("redis://127.0.0.1:{port}");
    let mut servers = servers_on(&store, "", false, 1).await;
    let server = servers.remove(0);
    let mut client = server.fusebox().await;
    let mut conn = crate::resp::Conn::connect(port).expect("connect to redis");
    // Below what Redis already uses: every write is refused.
    assert!(conn.cmd(&["CONFIG", "SET", "maxmemory", "1"]).is_ok());
    let refused = client
        .acquire(pb::AcquireRequest {
            key: "full/one".into(),
            ..Default::default()
        })
        .await
        .expect_err("Redis is full");
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );
    assert!(
        refused.message().contains("maxmemory"),
        "the answer says the store is full and what to do: {refused:?}"
    );
    assert!(conn.cmd(&["CONFIG", "SET", "maxmemory", "0"]).is_ok());
    client
        .acquire(pb::AcquireRequest {
            key: "full/one".into(),
            ..Default::default()
        })
        .await
        .expect("room again");
}

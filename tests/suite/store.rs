//! State in Redis (`serve --store`): real `redis-server`s with the fusebox
//! module loaded (one server, or a Redis Cluster of three primaries and
//! three replicas), several fusebox servers on them, every call over gRPC.
//!
//! Without redis-server these tests are skipped, saying so, unless
//! `FUSEBOX_TEST_REQUIRE_TOOLS=1` (as `./scripts/test` sets).

use std::sync::Arc;
use std::time::Duration;

use fusebox::proto::v1 as pb;
use tokio::sync::Barrier;

use crate::harness::{eventually, millis, Options, Server};
use crate::redis_harness::{Cluster, Standalone};
use crate::vectors::{load_all, replay, GrpcTarget};

/// Empties every primary, so that a vector starts on no keys and no
/// policies.
fn flush(ports: &[u16]) {
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
    let Some(redis) = tokio::task::spawn_blocking(|| {
        Standalone::start("every_vector_passes_over_two_servers_on_one_redis")
    })
    .await
    .expect("redis starts") else {
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
const REQUESTS: usize = 400;
const ROUNDS: u32 = 50;
const CONNECTIONS_PER_SERVER: usize = 6;

type Client = pb::fusebox_client::FuseboxClient<tonic::transport::Channel>;

fn ask(permits: Option<u32>) -> pb::AcquireRequest {
    pb::AcquireRequest {
        key: FLEET_KEY.into(),
        permits,
        max_wait: None,
        lease: None,
    }
}

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
    let mut servers = Vec::new();
    for _ in 0..3 {
        servers.push(
            Server::start(Options {
                config: Some(config),
                args: vec!["--store", &store],
                ..Options::default()
            })
            .await,
        );
    }
    let mut clients: Vec<Client> = Vec::new();
    for _ in 0..CONNECTIONS_PER_SERVER {
        for server in &servers {
            clients.push(server.fusebox().await);
        }
    }
    let mut control = servers[0].fusebox().await;
    let first = control
        .acquire(ask(None))
        .await
        .expect("Acquire")
        .into_inner();
    assert_eq!(first.decision, pb::Decision::Granted as i32, "{first:?}");
    let done = control
        .complete(pb::CompleteRequest {
            ticket: first.ticket,
            outcome: pb::Outcome::Failure as i32,
        })
        .await
        .expect("Complete")
        .into_inner();
    assert_eq!(done.phase, pb::Phase::Open as i32);
    for round in 1..=ROUNDS {
        // The break ends on the store's clock: wait until a status check
        // (which never moves the breaker) on any server says so.
        let checker = clients[round as usize % clients.len()].clone();
        eventually("the break to end", Duration::from_secs(10), || {
            let mut checker = checker.clone();
            async move {
                let a = checker
                    .acquire(ask(Some(0)))
                    .await
                    .expect("a status check answers")
                    .into_inner();
                (a.decision == pb::Decision::Granted as i32).then_some(())
            }
        })
        .await;
        let barrier = Arc::new(Barrier::new(REQUESTS));
        let tasks: Vec<_> = (0..REQUESTS)
            .map(|i| {
                let mut client = clients[i % clients.len()].clone();
                let barrier = barrier.clone();
                tokio::spawn(async move {
                    barrier.wait().await;
                    client.acquire(ask(None)).await
                })
            })
            .collect();
        let mut probes = Vec::new();
        let mut blocked = 0;
        let mut other = Vec::new();
        for task in tasks {
            let a = task
                .await
                .expect("an acquire task")
                .expect("Acquire answers")
                .into_inner();
            match (
                pb::Decision::try_from(a.decision),
                pb::Reason::try_from(a.reason),
            ) {
                (Ok(pb::Decision::Probe), _) if !a.ticket.is_empty() => probes.push(a.ticket),
                (Ok(pb::Decision::Blocked), Ok(pb::Reason::ProbeInFlight))
                    if millis(a.retry_after).is_some() =>
                {
                    blocked += 1
                }
                _ => other.push(a),
            }
        }
        assert!(
            probes.len() == 1 && blocked == REQUESTS - 1,
            "round {round}: expected 1 PROBE and {} BLOCKED probe_in_flight, got {} probes, {blocked} blocked, others: {:?}",
            REQUESTS - 1,
            probes.len(),
            other.iter().take(5).collect::<Vec<_>>()
        );
        let state = servers[round as usize % 3].get(FLEET_KEY).await;
        assert_eq!(
            state.phase,
            pb::Phase::HalfOpen as i32,
            "round {round}: {state:?}"
        );
        assert_eq!(state.half_open_attempts, round, "round {round}: {state:?}");
        assert_eq!(state.live_tickets, 1, "round {round}: {state:?}");
        // The probe fails, through another server: the breaker opens again.
        let mut finisher = servers[(round as usize + 1) % 3].fusebox().await;
        let done = finisher
            .complete(pb::CompleteRequest {
                ticket: probes.pop().expect("one probe"),
                outcome: pb::Outcome::Failure as i32,
            })
            .await
            .expect("Complete answers")
            .into_inner();
        assert!(!done.stale, "round {round}: the probe is current");
        assert_eq!(done.phase, pb::Phase::Open as i32, "round {round}");
    }
}

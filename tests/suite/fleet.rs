//! B2 over the wire: after a trip and a break, a whole fleet asking at once
//! gets exactly one probe.
//!
//! Each round, 400 `Acquire`s for one key are fired at the same moment from
//! 16 separate connections (a barrier releases them together), and every
//! answer is counted: exactly one `PROBE` and 399 `BLOCKED` with
//! `REASON_PROBE_IN_FLIGHT`. The probe is then completed as `FAILURE`, which
//! opens the breaker again for the next round. 50 rounds on the manual clock,
//! 50 on the real clock.

use std::sync::Arc;
use std::time::Duration;

use fusebox::proto::v1 as pb;
use tokio::sync::Barrier;
use tonic::transport::Channel;

use crate::admin::complete;
use crate::harness::{eventually, millis, Server};

const KEY: &str = "fleet/payments";
const CONNECTIONS: usize = 16;
const REQUESTS: usize = 400;
const ROUNDS: u32 = 50;

/// Every key opens on one failure, for a break of one second: the fleets
/// on the manual clock.
pub(crate) const ONE_SECOND_BREAKS: &str = r#"
[default]
breaker = { mode = "consecutive", failures = 1, break = "1s" }
"#;

type Client = pb::fusebox_client::FuseboxClient<Channel>;
type ClockClient = pb::clock_client::ClockClient<Channel>;

/// `CONNECTIONS` clients, each on its own HTTP/2 connection.
async fn fleet(server: &Server) -> Vec<Client> {
    let mut clients = Vec::with_capacity(CONNECTIONS);
    for _ in 0..CONNECTIONS {
        clients.push(server.fusebox().await);
    }
    clients
}

fn acquire_one() -> pb::AcquireRequest {
    crate::admin::request(KEY)
}

async fn acquire(client: &mut Client) -> pb::AcquireResponse {
    client
        .acquire(acquire_one())
        .await
        .expect("Acquire answers")
        .into_inner()
}

/// Fires `REQUESTS` copies of `request` at once, spread over the clients,
/// and returns every answer.
pub(crate) async fn fire(
    clients: &[Client],
    request: pb::AcquireRequest,
) -> Vec<pb::AcquireResponse> {
    let barrier = Arc::new(Barrier::new(REQUESTS));
    let tasks: Vec<_> = (0..REQUESTS)
        .map(|i| {
            let mut client = clients[i % clients.len()].clone();
            let barrier = barrier.clone();
            let request = request.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                client
                    .acquire(request)
                    .await
                    .expect("Acquire answers")
                    .into_inner()
            })
        })
        .collect();
    let mut answers = Vec::with_capacity(REQUESTS);
    for task in tasks {
        answers.push(task.await.expect("an acquire task"));
    }
    answers
}

/// Checks that exactly one answer is the probe and every other one is
/// blocked by it; returns the probe's ticket. `retry_after` of the blocked
/// ones must satisfy `retry_ok`.
pub(crate) fn one_probe(
    round: u32,
    answers: &[pb::AcquireResponse],
    retry_ok: impl Fn(u64) -> bool,
) -> String {
    let mut probes = Vec::new();
    let mut blocked = 0;
    let mut other = Vec::new();
    for a in answers {
        let decision = pb::Decision::try_from(a.decision);
        let reason = pb::Reason::try_from(a.reason);
        match (decision, reason) {
            (Ok(pb::Decision::Probe), Ok(pb::Reason::Unspecified)) if !a.ticket.is_empty() => {
                probes.push(a.ticket.clone());
            }
            (Ok(pb::Decision::Blocked), Ok(pb::Reason::ProbeInFlight))
                if a.ticket.is_empty() && millis(a.retry_after).is_some_and(&retry_ok) =>
            {
                blocked += 1;
            }
            _ => other.push(a.clone()),
        }
        assert_eq!(
            a.phase,
            pb::Phase::HalfOpen as i32,
            "round {round}: every answer sees HALF_OPEN: {a:?}"
        );
    }
    assert!(
        probes.len() == 1 && blocked == REQUESTS - 1 && other.is_empty(),
        "round {round}: expected 1 PROBE and {} BLOCKED probe_in_flight, got {} probes, {blocked} blocked, and {} others: {:?}",
        REQUESTS - 1,
        probes.len(),
        other.len(),
        other.iter().take(5).collect::<Vec<_>>()
    );
    probes.pop().expect("one probe")
}

/// Checks the key after a round's burst: half-open, one probe ticket live,
/// `round` probes admitted since it last closed, and `round` failures in a row.
pub(crate) async fn check_half_open(server: &Server, round: u32) {
    let state = server.get(KEY).await;
    assert_eq!(
        state.phase,
        pb::Phase::HalfOpen as i32,
        "round {round}: {state:?}"
    );
    assert_eq!(state.half_open_attempts, round, "round {round}: {state:?}");
    assert_eq!(
        state.consecutive_failures, round,
        "round {round}: {state:?}"
    );
    assert_eq!(
        state.live_tickets, 1,
        "round {round}: only the probe is live: {state:?}"
    );
}

/// The start of a round on the manual clock: the key is open with its whole
/// break (1 s) ahead; then `clock` moves past it.
pub(crate) async fn end_the_break(server: &Server, clock: &mut ClockClient, round: u32) {
    let state = server.get(KEY).await;
    assert_eq!(
        state.phase,
        pb::Phase::Open as i32,
        "round {round}: {state:?}"
    );
    assert_eq!(
        millis(state.open_remaining),
        Some(1000),
        "round {round}: {state:?}"
    );
    crate::admin::advance_clock(clock, 1000).await;
}

/// Checks the answer to the failure of a round's probe: it was current, and
/// the breaker opened again.
pub(crate) fn probe_failed(round: u32, done: &pb::CompleteResponse) {
    assert!(!done.stale, "round {round}: the probe is current");
    assert_eq!(done.phase, pb::Phase::Open as i32, "round {round}");
}

/// Waits, on the real clock, until the break of a round has ended: a status
/// check through `checker` answers BLOCKED (open) until then, and GRANTED
/// after, and never moves the breaker (P2a, B6).
pub(crate) async fn until_the_break_ends(checker: &Client, round: u32) {
    eventually("the break to end", Duration::from_secs(10), || {
        let mut checker = checker.clone();
        async move {
            let a = checker
                .acquire(crate::admin::status_check(KEY))
                .await
                .expect("a status check answers")
                .into_inner();
            match (
                pb::Decision::try_from(a.decision),
                pb::Reason::try_from(a.reason),
            ) {
                (Ok(pb::Decision::Granted), _) => Some(()),
                (Ok(pb::Decision::Blocked), Ok(pb::Reason::Open)) => None,
                _ => panic!(
                    "round {round}: a status check answers BLOCKED open or GRANTED, not {a:?}"
                ),
            }
        }
    })
    .await;
}

/// Trips the breaker of a fresh key (consecutive, 1 failure).
async fn trip(client: &mut Client) {
    let first = acquire(client).await;
    assert_eq!(first.decision, pb::Decision::Granted as i32, "{first:?}");
    let done = complete(client, &first.ticket, pb::Outcome::Failure).await;
    assert!(!done.stale);
    assert_eq!(done.phase, pb::Phase::Open as i32);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_probe_for_a_fleet_on_the_manual_clock() {
    let server = Server::manual(Some(ONE_SECOND_BREAKS)).await;
    let clients = fleet(&server).await;
    let mut clock = server.clock().await;
    let mut control = server.fusebox().await;
    trip(&mut control).await;
    for round in 1..=ROUNDS {
        end_the_break(&server, &mut clock, round).await;
        // Time stands still: the probe slot is held for exactly probe_lease (= break).
        let probe = one_probe(round, &fire(&clients, acquire_one()).await, |retry| {
            retry == 1000
        });
        check_half_open(&server, round).await;
        probe_failed(
            round,
            &complete(&mut control, &probe, pb::Outcome::Failure).await,
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_probe_for_a_fleet_on_the_real_clock() {
    // The probe slot (30 s) cannot lapse during a round; the break is short.
    let server = Server::start(crate::harness::Options {
        config: Some(
            r#"
[default]
breaker = { mode = "consecutive", failures = 1, break = "50ms", probe_lease = "30s" }
"#,
        ),
        ..Default::default()
    })
    .await;
    let clients = fleet(&server).await;
    let mut control = server.fusebox().await;
    trip(&mut control).await;
    for round in 1..=ROUNDS {
        until_the_break_ends(&control, round).await;
        let state = server.get(KEY).await;
        assert_eq!(
            state.phase,
            pb::Phase::Open as i32,
            "round {round}: status checks do not move the breaker: {state:?}"
        );
        let probe = one_probe(round, &fire(&clients, acquire_one()).await, |retry| {
            retry > 0 && retry <= 30_000
        });
        check_half_open(&server, round).await;
        probe_failed(
            round,
            &complete(&mut control, &probe, pb::Outcome::Failure).await,
        );
    }
}

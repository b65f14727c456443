//! B2 over the wire: after a trip and a break, a whole fleet asking at once
//! gets exactly one probe.
//!
//! Each round, 400 `Acquire`s for one key are fired at the same moment from
//! 16 separate connections (a barrier releases them together), and every
//! answer is counted: exactly one `PROBE` and 399 `BLOCKED` with
//! `REASON_PROBE_IN_FLIGHT`. The probe is then completed as `FAILURE`, which
//! opens the breaker again for the next round. 50 rounds on the manual clock,
//! 50 on the real clock.
//!
//! The same with bounded half-open (H1-H4, `probes = 3, successes = 2`):
//! each burst of 400 gets exactly 3 `PROBE`s and 397 `BLOCKED`
//! `probe_in_flight`, and the probes are completed so that every way a
//! half-open period goes on or ends happens: a failure opens the breaker
//! again, two successes close it (and the round trips it again), an
//! `IGNORED` probe frees its slot for exactly one more probe, and (on the
//! manual clock) lapsed slots admit three new probes while the lapsed ones
//! turn stale. 50 rounds on the manual clock, 50 across three servers on
//! one Redis Cluster. After every step `GetKey` must read the phase, the
//! slots held (`probes_held`), the successes counted
//! (`half_open_successes`), live tickets, attempts and the failure run.

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
    let mut probes = probes(round, answers, 1, retry_ok);
    probes.pop().expect("one probe")
}

/// Checks that exactly `expected` answers are probes and every other one is
/// blocked by them; returns the probes' tickets. `retry_after` of the
/// blocked ones must satisfy `retry_ok`.
pub(crate) fn probes(
    round: u32,
    answers: &[pb::AcquireResponse],
    expected: usize,
    retry_ok: impl Fn(u64) -> bool,
) -> Vec<String> {
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
        probes.len() == expected && blocked == answers.len() - expected && other.is_empty(),
        "round {round}: expected {expected} PROBE and {} BLOCKED probe_in_flight, got {} probes, {blocked} blocked, and {} others: {:?}",
        answers.len() - expected,
        probes.len(),
        other.len(),
        other.iter().take(5).collect::<Vec<_>>()
    );
    probes
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

// ---------------------------------------------------------------------------
// Bounded half-open (H1-H4): three probes at once, two successes close.

/// Probe slots held at once in the bounded fleets.
const PROBES: usize = 3;

/// Every key opens on one failure, for a break of one second; a half-open
/// period admits three probes at once and closes at its second success.
const THREE_PROBES_ONE_SECOND_BREAKS: &str = r#"
[default]
breaker = { mode = "consecutive", failures = 1, break = "1s", half_open = { probes = 3, successes = 2 } }
"#;

/// The same on the real clock: a short break, and probe slots (30 s) that
/// cannot lapse during a round.
const THREE_PROBES_SHORT_BREAKS: &str = r#"
[default]
breaker = { mode = "consecutive", failures = 1, break = "50ms", probe_lease = "30s", half_open = { probes = 3, successes = 2 } }
"#;

/// A bounded fleet: the clients that fire the bursts, the servers they
/// talk to (one, or three on one store), and what the key must read.
struct Bounded<'a> {
    servers: &'a [Server],
    clients: Vec<Client>,
    /// `retry_after` of a burst's blocked answers, in ms, must satisfy this.
    retry_ok: fn(u64) -> bool,
    /// Probes admitted since the breaker last closed (B5, H1).
    attempts: u32,
    /// Failures in a row.
    run: u32,
    /// The manual clock, when the servers run on one: rounds where the
    /// probes' slots lapse need it.
    clock: Option<ClockClient>,
}

/// What the key reads at one point of a round.
struct Reads {
    phase: pb::Phase,
    probes_held: u32,
    successes: u32,
    live: u32,
}

impl Bounded<'_> {
    async fn new(servers: &[Server]) -> Bounded<'_> {
        let mut clients = Vec::with_capacity(CONNECTIONS);
        for i in 0..CONNECTIONS {
            clients.push(servers[i % servers.len()].fusebox().await);
        }
        Bounded {
            servers,
            clients,
            retry_ok: |retry| retry == 1000,
            attempts: 0,
            run: 0,
            clock: None,
        }
    }

    /// A connection to the `i`-th server (round robin), for completions and
    /// single calls, so that over a round every server takes part.
    fn control(&self, i: u32) -> Client {
        self.clients[i as usize % self.clients.len()].clone()
    }

    /// Fires a burst of `REQUESTS` and checks that exactly `expected` are
    /// probes (H1): their tickets.
    async fn burst(&mut self, round: u32, expected: usize) -> Vec<String> {
        let answers = fire(&self.clients, acquire_one()).await;
        let probes = probes(round, &answers, expected, self.retry_ok);
        self.attempts += u32::try_from(expected).expect("a few probes");
        probes
    }

    /// Reads the key through the `i`-th server and checks it.
    async fn check(&self, round: u32, i: u32, what: &str, expected: Reads) {
        let server = &self.servers[i as usize % self.servers.len()];
        let state = server.get(KEY).await;
        let seen = (
            pb::Phase::try_from(state.phase),
            state.probes_held,
            state.half_open_successes,
            state.live_tickets,
            state.half_open_attempts,
            state.consecutive_failures,
        );
        assert_eq!(
            seen,
            (
                Ok(expected.phase),
                expected.probes_held,
                expected.successes,
                expected.live,
                self.attempts,
                self.run,
            ),
            "round {round}, {what}: (phase, probes_held, half_open_successes, live_tickets, \
             half_open_attempts, consecutive_failures) of {state:?}"
        );
    }

    /// Completes `ticket` with `outcome` through the `i`-th connection;
    /// checks that it was `stale` or not and the phase after.
    async fn complete(
        &self,
        round: u32,
        i: u32,
        ticket: &str,
        outcome: pb::Outcome,
        stale: bool,
        phase: pb::Phase,
    ) {
        let done = complete(&mut self.control(i), ticket, outcome).await;
        assert_eq!(
            (done.stale, pb::Phase::try_from(done.phase)),
            (stale, Ok(phase)),
            "round {round}: {outcome:?} of a probe: (stale, phase)"
        );
    }

    /// Trips the closed breaker: one granted call that fails.
    async fn trip(&mut self, round: u32) {
        let first = acquire(&mut self.control(round)).await;
        assert_eq!(
            first.decision,
            pb::Decision::Granted as i32,
            "round {round}: {first:?}"
        );
        self.complete(
            round,
            round + 1,
            &first.ticket,
            pb::Outcome::Failure,
            false,
            pb::Phase::Open,
        )
        .await;
        self.run += 1;
    }

    /// One round, the break just ended: a burst gets three probes; then,
    /// by the round's number: two successes close the breaker (and it is
    /// tripped again); or an `IGNORED` probe frees one slot, the next burst
    /// gets exactly one probe, a success counts and a failure opens; or the
    /// first probe's failure opens; or (on the manual clock) the slots lapse
    /// and a burst gets three new probes, the lapsed ones stale. Every
    /// probe left when the period ends is stale.
    async fn round(&mut self, round: u32) {
        use pb::Outcome::{Failure, Ignored, Success};
        use pb::Phase::{Closed, HalfOpen, Open};
        let held = |probes_held, successes| Reads {
            phase: HalfOpen,
            probes_held,
            successes,
            live: probes_held,
        };
        let p = self.burst(round, PROBES).await;
        self.check(round, round, "after the burst", held(3, 0))
            .await;
        match round % 4 {
            0 => {
                // H2: the first success frees its slot and counts; the
                // second closes; the third probe is then stale.
                self.complete(round, round, &p[0], Success, false, HalfOpen)
                    .await;
                self.check(round, round + 1, "after one success", held(2, 1))
                    .await;
                self.complete(round, round + 1, &p[1], Success, false, Closed)
                    .await;
                self.attempts = 0;
                self.run = 0;
                let closed = Reads {
                    phase: Closed,
                    probes_held: 0,
                    successes: 0,
                    live: 1,
                };
                self.check(round, round + 2, "closed by two successes", closed)
                    .await;
                self.complete(round, round + 2, &p[2], Success, true, Closed)
                    .await;
                self.trip(round).await;
            }
            1 => {
                // H2: IGNORED frees a slot and counts nothing: the next
                // burst gets exactly one probe; a success counts; a failure
                // opens; the last probe is then stale.
                self.complete(round, round, &p[0], Ignored, false, HalfOpen)
                    .await;
                self.check(round, round + 1, "after IGNORED", held(2, 0))
                    .await;
                let more = self.burst(round, 1).await;
                self.check(round, round + 2, "after the second burst", held(3, 0))
                    .await;
                self.complete(round, round + 1, &p[1], Success, false, HalfOpen)
                    .await;
                self.check(round, round + 2, "after one success", held(2, 1))
                    .await;
                self.complete(round, round + 2, &more[0], Failure, false, Open)
                    .await;
                self.run += 1;
                self.complete(round, round, &p[2], Success, true, Open)
                    .await;
            }
            2 => {
                // H2: the first failure opens; the other two are stale.
                self.complete(round, round, &p[0], Failure, false, Open)
                    .await;
                self.run += 1;
                self.complete(round, round + 1, &p[1], Success, true, Open)
                    .await;
                self.complete(round, round + 2, &p[2], Failure, true, Open)
                    .await;
            }
            _ => match self.clock.clone() {
                Some(mut clock) => self.lapse(round, &mut clock, p).await,
                None => {
                    // The last probe's failure opens; the others are stale.
                    self.complete(round, round, &p[2], Failure, false, Open)
                        .await;
                    self.run += 1;
                    self.complete(round, round + 1, &p[0], Success, true, Open)
                        .await;
                    self.complete(round, round + 2, &p[1], Ignored, true, Open)
                        .await;
                }
            },
        }
        let open = Reads {
            phase: Open,
            probes_held: 0,
            successes: 0,
            live: 0,
        };
        self.check(round, round + 1, "open at the round's end", open)
            .await;
    }
}

impl Bounded<'_> {
    /// On the manual clock: the three slots lapse together (probe_lease =
    /// break = 1 s, H1, B1); the next burst gets three new probes; the
    /// lapsed ones are stale from then on (H3, N > 1: a probe is current
    /// only while it holds its slot), whatever their outcome.
    async fn lapse(&mut self, round: u32, clock: &mut ClockClient, p: Vec<String>) {
        use pb::Outcome::{Failure, Ignored, Success};
        use pb::Phase::{HalfOpen, Open};
        crate::admin::advance_clock(clock, 1000).await;
        let lapsed = Reads {
            phase: HalfOpen,
            probes_held: 0,
            successes: 0,
            live: 3,
        };
        self.check(round, round, "after the slots lapsed", lapsed)
            .await;
        self.complete(round, round, &p[0], Success, true, HalfOpen)
            .await;
        let q = self.burst(round, PROBES).await;
        let again = Reads {
            phase: HalfOpen,
            probes_held: 3,
            successes: 0,
            live: 5,
        };
        self.check(round, round + 1, "after a burst on lapsed slots", again)
            .await;
        self.complete(round, round + 1, &q[0], Success, false, HalfOpen)
            .await;
        self.complete(round, round + 2, &p[1], Failure, true, HalfOpen)
            .await;
        let counted = Reads {
            phase: HalfOpen,
            probes_held: 2,
            successes: 1,
            live: 3,
        };
        self.check(round, round + 2, "after one current success", counted)
            .await;
        self.complete(round, round, &q[1], Failure, false, Open)
            .await;
        self.run += 1;
        self.complete(round, round + 1, &q[2], Success, true, Open)
            .await;
        self.complete(round, round + 2, &p[2], Ignored, true, Open)
            .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_probes_for_a_fleet_on_the_manual_clock() {
    let servers = [Server::manual(Some(THREE_PROBES_ONE_SECOND_BREAKS)).await];
    let mut clock = servers[0].clock().await;
    let mut fleet = Bounded::new(&servers).await;
    fleet.clock = Some(servers[0].clock().await);
    fleet.trip(0).await;
    for round in 1..=ROUNDS {
        end_the_break(&servers[0], &mut clock, round).await;
        // Time stands still: every slot is held for exactly probe_lease (= break).
        fleet.round(round).await;
    }
}

/// H1 across servers: three fusebox servers on one Redis Cluster, the
/// bursts spread over all three, every completion and read through
/// another server than the last.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_probes_for_a_fleet_across_three_servers_on_a_cluster() {
    const TEST: &str = "three_probes_for_a_fleet_across_three_servers_on_a_cluster";
    let Some(cluster) = tokio::task::spawn_blocking(|| crate::redis_harness::Cluster::start(TEST))
        .await
        .expect("the cluster starts")
    else {
        return;
    };
    let store = crate::store::store_of(&cluster);
    let servers = crate::harness::servers_on(&store, THREE_PROBES_SHORT_BREAKS, false, 3).await;
    let mut fleet = Bounded::new(&servers).await;
    fleet.retry_ok = |retry| retry > 0 && retry <= 30_000;
    fleet.trip(0).await;
    for round in 1..=ROUNDS {
        // The break ends on the store's clock: wait until a status check
        // through one of the servers says so.
        until_the_break_ends(&fleet.control(round), round).await;
        fleet.round(round).await;
    }
}

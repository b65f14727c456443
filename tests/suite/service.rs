//! The server as a service: built-in defaults (Y3, section 9), config
//! refusal at start-up (Y2), tickets (L1), Renew (L2), caps (K3), idle
//! forgetting (K2), health, reflection and graceful shutdown. Every test
//! talks to a real `fusebox serve` process; timing goes through the manual
//! clock, and asynchronous conditions are polled with a deadline.

use std::collections::HashSet;
use std::process::Stdio;
use std::time::{Duration, Instant};

use fusebox::proto::v1 as pb;
use tokio::task::JoinHandle;
use tonic::transport::Channel;
use tonic::{Code, Status};
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::{health_check_response::ServingStatus, HealthCheckRequest};

use crate::admin::{acquire, advance, complete, request};
use crate::harness::{millis, ms, steer, Options, Server, BIN};

type Client = pb::fusebox_client::FuseboxClient<Channel>;

/// Safety net for conditions reached asynchronously.
const LIMIT: Duration = Duration::from_secs(20);

fn waiting(key: &str, max_wait: u64) -> pb::AcquireRequest {
    pb::AcquireRequest {
        max_wait: Some(ms(max_wait)),
        ..request(key)
    }
}

async fn granted(client: &mut Client, r: pb::AcquireRequest) -> String {
    let reply = acquire(client, r).await;
    assert_eq!(reply.decision, pb::Decision::Granted as i32, "{reply:?}");
    assert!(!reply.ticket.is_empty(), "{reply:?}");
    reply.ticket
}

fn assert_exhausted<T: std::fmt::Debug>(result: Result<T, Status>, cap: &str) {
    let status = result.expect_err("past the cap");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().contains(cap),
        "the message names {cap}: {status:?}"
    );
}

/// The fields of SPEC section 8 of a key's state (statistics and times
/// are checked elsewhere).
fn core(state: pb::KeyState) -> pb::KeyState {
    pb::KeyState {
        stats: None,
        failure_ratio: None,
        phase_changed_at: None,
        limit: 0,
        ..state
    }
}

/// A fresh key's state under a policy without a limiter.
fn fresh(key: &str) -> pb::KeyState {
    pb::KeyState {
        key: key.into(),
        phase: pb::Phase::Closed as i32,
        ..pb::KeyState::default()
    }
}

/// A waiting Acquire on its own connection, in its own task.
async fn spawn_acquire(
    server: &Server,
    r: pb::AcquireRequest,
) -> JoinHandle<Result<pb::AcquireResponse, Status>> {
    let mut client = server.fusebox().await;
    tokio::spawn(async move { client.acquire(r).await.map(|r| r.into_inner()) })
}

// ---------------------------------------------------------------------------
// (a) Built-in defaults.

/// Y3: with no --config, the built-in default rule is consecutive 5
/// failures, a 5 s break, no limiter, leases 30 s by default and 5 min at most.
#[tokio::test]
async fn without_a_config_the_built_in_default_rule_applies() {
    let server = Server::manual(None).await;
    let mut c = server.fusebox().await;
    let key = "any/dependency";
    assert_eq!(core(server.get(key).await), fresh(key));
    for run in 1..=4 {
        let reply = acquire(&mut c, request(key)).await;
        assert_eq!(reply.decision, pb::Decision::Granted as i32, "{reply:?}");
        assert_eq!(millis(reply.lease), Some(30_000), "lease.default is 30 s");
        let done = complete(&mut c, &reply.ticket, pb::Outcome::Failure).await;
        assert_eq!(
            done.phase,
            pb::Phase::Closed as i32,
            "{run} failures leave it closed"
        );
        assert_eq!(
            core(server.get(key).await),
            pb::KeyState {
                consecutive_failures: run,
                ..fresh(key)
            }
        );
    }
    let ticket = granted(&mut c, request(key)).await;
    let done = complete(&mut c, &ticket, pb::Outcome::Failure).await;
    assert_eq!(
        done.phase,
        pb::Phase::Open as i32,
        "the 5th failure opens it"
    );
    let state = server.get(key).await;
    assert_eq!(state.phase, pb::Phase::Open as i32);
    assert_eq!(state.consecutive_failures, 5);
    assert_eq!(millis(state.open_remaining), Some(5_000), "break is 5 s");
    assert_eq!((state.free, state.queued), (0, 0), "no limiter");
    let blocked = acquire(&mut c, request(key)).await;
    assert_eq!(blocked.decision, pb::Decision::Blocked as i32);
    assert_eq!(millis(blocked.retry_after), Some(5_000));
    advance(&server, 4_999).await;
    let blocked = acquire(&mut c, request(key)).await;
    assert_eq!(millis(blocked.retry_after), Some(1));
    advance(&server, 1).await;
    let probe = acquire(&mut c, request(key)).await;
    assert_eq!(probe.decision, pb::Decision::Probe as i32, "{probe:?}");
    // probe_lease = break (5 s): the slot is held until then.
    let second = acquire(&mut c, request(key)).await;
    assert_eq!(second.decision, pb::Decision::Blocked as i32);
    assert_eq!(second.reason, pb::Reason::ProbeInFlight as i32);
    assert_eq!(millis(second.retry_after), Some(5_000));
    let done = complete(&mut c, &probe.ticket, pb::Outcome::Success).await;
    assert_eq!(done.phase, pb::Phase::Closed as i32);

    // No limiter: any count is granted (P2b), free stays 0.
    let other = "other/dependency";
    let big = acquire(
        &mut c,
        pb::AcquireRequest {
            permits: Some(u32::MAX),
            ..request(other)
        },
    )
    .await;
    assert_eq!(big.decision, pb::Decision::Granted as i32, "{big:?}");
    let long = acquire(
        &mut c,
        pb::AcquireRequest {
            lease: Some(ms(3_600_000)),
            ..request(other)
        },
    )
    .await;
    assert_eq!(millis(long.lease), Some(300_000), "lease.max is 5 min");
    let state = server.get(other).await;
    assert_eq!((state.free, state.queued, state.live_tickets), (0, 0, 2));
}

/// Section 9: the default listen address is 127.0.0.1:50051 (checked in
/// the help text; the real port is never bound by a test).
#[tokio::test]
async fn serve_listens_on_127_0_0_1_50051_by_default() {
    let out = tokio::process::Command::new(BIN)
        .args(["serve", "--help"])
        .output()
        .await
        .expect("fusebox runs");
    assert!(out.status.success(), "{out:?}");
    let help = String::from_utf8_lossy(&out.stdout);
    let listen = help
        .lines()
        .skip_while(|l| !l.contains("--listen"))
        .take(3)
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        listen.contains("[default: 127.0.0.1:50051]"),
        "--listen defaults to 127.0.0.1:50051:\n{help}"
    );
}

// ---------------------------------------------------------------------------
// (b) Invalid configs.

/// Runs `fusebox serve --config` on `text`; returns (exit success, stdout, stderr).
async fn serve_with(text: &str) -> (bool, String, String) {
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = dir.path().join("fusebox.toml");
    std::fs::write(&path, text).expect("config written");
    let child = crate::process::spawn(
        tokio::process::Command::new(BIN)
            .args(["serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(&path)
            .stderr(Stdio::piped()),
        "fusebox starts",
    );
    let out = tokio::time::timeout(LIMIT, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("the server should refuse this config and exit:\n{text}"))
        .expect("output read");
    crate::process::said(&out)
}

/// Y2: an invalid config stops the server from starting, with a message
/// that names the rule and the field.
#[tokio::test]
async fn an_invalid_config_is_refused_naming_the_rule_and_the_field() {
    const OK_RULE: &str = r#"
[[rule]]
match = "ok/*"
breaker = { mode = "consecutive", failures = 5, break = "5s" }
"#;
    let cases: Vec<(&str, String, Vec<&str>)> = vec![
        (
            "unknown field in a rule's breaker",
            format!(
                "{OK_RULE}\n[[rule]]\nmatch = \"b/*\"\nbreaker = {{ mode = \"consecutive\", failures = 5, break = \"5s\", failurez = 3 }}\n"
            ),
            vec!["rule 2", "b/*", "failurez"],
        ),
        (
            "unknown field in a rule",
            format!("{OK_RULE}\n[[rule]]\nmatch = \"b/*\"\ncolour = \"red\"\n"),
            vec!["rule 2", "b/*", "colour"],
        ),
        (
            "zero failures",
            format!(
                "{OK_RULE}\n[[rule]]\nmatch = \"b/*\"\nbreaker = {{ mode = \"consecutive\", failures = 0, break = \"5s\" }}\n"
            ),
            vec!["rule 2", "b/*", "breaker.failures"],
        ),
        (
            "a duration with an unknown unit",
            format!(
                "{OK_RULE}\n[[rule]]\nmatch = \"b/*\"\nbreaker = {{ mode = \"consecutive\", failures = 5, break = \"5 parsecs\" }}\n"
            ),
            vec!["rule 2", "b/*", "break", "parsecs"],
        ),
        (
            "a zero break",
            format!(
                "{OK_RULE}\n[[rule]]\nmatch = \"b/*\"\nbreaker = {{ mode = \"consecutive\", failures = 5, break = \"0s\" }}\n"
            ),
            vec!["rule 2", "b/*", "breaker.break"],
        ),
        (
            "a '*' inside a match pattern",
            "[[rule]]\nmatch = \"a*b\"\nbreaker = { mode = \"consecutive\", failures = 5, break = \"5s\" }\n".into(),
            vec!["rule 1", "a*b", "match"],
        ),
        (
            "an empty match pattern",
            format!("{OK_RULE}\n[[rule]]\nmatch = \"\"\n"),
            vec!["rule 2", "match"],
        ),
        (
            "max_break below break",
            format!(
                "{OK_RULE}\n[[rule]]\nmatch = \"b/*\"\nbreaker = {{ mode = \"consecutive\", failures = 5, break = \"5s\", multiplier = 2.0, max_break = \"1s\" }}\n"
            ),
            vec!["rule 2", "b/*", "breaker.max_break"],
        ),
        (
            "lease.default above lease.max",
            format!(
                "{OK_RULE}\n[[rule]]\nmatch = \"b/*\"\nlease = {{ default = \"10m\", max = \"1m\" }}\n"
            ),
            vec!["rule 2", "b/*", "lease.default"],
        ),
        (
            "an invalid [default]",
            format!(
                "{OK_RULE}\n[default]\nbreaker = {{ mode = \"ratio\", failure_ratio = 1.5, minimum_throughput = 10, sampling_window = \"10s\", break = \"5s\" }}\n"
            ),
            vec!["[default]", "breaker.failure_ratio"],
        ),
        (
            "a zero cap",
            format!("[server]\nmax_keys = 0\n{OK_RULE}"),
            vec!["[server]", "max_keys"],
        ),
        (
            "an unknown [server] field",
            format!("[server]\nmax_kees = 10\n{OK_RULE}"),
            vec!["[server]", "max_kees"],
        ),
    ];
    let mut runs = tokio::task::JoinSet::new();
    for (name, text, expected) in cases {
        runs.spawn(async move {
            let (ok, stdout, stderr) = serve_with(&text).await;
            let mut problems = Vec::new();
            if ok {
                problems.push("exited 0".to_owned());
            }
            if stdout.contains("listening on") {
                problems.push(format!("it started listening: {stdout:?}"));
            }
            for word in &expected {
                if !stderr.contains(word) {
                    problems.push(format!("stderr does not name {word:?}"));
                }
            }
            (!problems.is_empty()).then(|| {
                format!(
                    "{name}: {}\n  stderr: {}",
                    problems.join("; "),
                    stderr.trim()
                )
            })
        });
    }
    let mut failures = Vec::new();
    while let Some(result) = runs.join_next().await {
        if let Some(failure) = result.expect("the task ran") {
            failures.push(failure);
        }
    }
    failures.sort();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

// ---------------------------------------------------------------------------
// (c) Tickets (L1).

/// Tickets issued over the wire by concurrent clients.
const WIRE_TICKETS: usize = 10_000;
/// Tickets issued by the engine in-process, for the bulk.
const ENGINE_TICKETS: usize = 100_000;

/// L1: tickets issued over the wire by concurrent clients, and 100k more
/// issued in-process by the same engine code, are all distinct, at least
/// 22 characters, and nowhere near sequential.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tickets_are_distinct_and_unguessable() {
    const CONNECTIONS: usize = 4;
    const TASKS_PER_CONNECTION: usize = 16;
    const TASKS: usize = CONNECTIONS * TASKS_PER_CONNECTION;
    let server = Server::manual(None).await;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for connection in 0..CONNECTIONS {
        let client = server.fusebox().await;
        for task in 0..TASKS_PER_CONNECTION {
            let mut client = client.clone();
            let index = connection * TASKS_PER_CONNECTION + task;
            let count = WIRE_TICKETS / TASKS + usize::from(index < WIRE_TICKETS % TASKS);
            tasks.push(tokio::spawn(async move {
                let key = format!("tickets/{}", index % 8);
                let mut tickets = Vec::with_capacity(count);
                for i in 0..count {
                    let ticket = granted(&mut client, request(&key)).await;
                    // Complete most, so that completed ids are in the pool too.
                    if i % 4 != 0 {
                        complete(&mut client, &ticket, pb::Outcome::Success).await;
                    }
                    tickets.push(ticket);
                }
                tickets
            }));
        }
    }
    // Tickets in the order each client got them.
    let mut per_client = Vec::new();
    for task in tasks {
        per_client.push(task.await.expect("the task ran"));
    }
    eprintln!(
        "{WIRE_TICKETS} tickets over gRPC in {:?}",
        started.elapsed()
    );
    assert_eq!(per_client.iter().map(Vec::len).sum::<usize>(), WIRE_TICKETS);

    let started = Instant::now();
    let engine = fusebox::engine::Engine::with_manual_clock(fusebox::engine::Settings::default());
    let mut in_process = Vec::with_capacity(ENGINE_TICKETS);
    for i in 0..ENGINE_TICKETS {
        let reply = engine
            .acquire(fusebox::engine::AcquireArgs {
                caller: Default::default(),
                key: format!("bulk/{}", i % 16),
                permits: 1,
                max_wait: 0,
                lease: None,
                attempt: 0,
            })
            .await
            .expect("the engine grants");
        let ticket = reply.ticket.expect("a ticket");
        if i % 2 == 0 {
            engine
                .complete(&ticket, fusebox::domain::Outcome::Success)
                .expect("completes");
        }
        in_process.push(ticket);
    }
    eprintln!(
        "{ENGINE_TICKETS} tickets in-process in {:?}",
        started.elapsed()
    );
    per_client.push(in_process);
    check_tickets(&per_client);
}

fn common_prefix(a: &str, b: &str) -> usize {
    a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count()
}

/// The checks of L1 on tickets grouped by the client that got them, in order.
fn check_tickets(per_client: &[Vec<String>]) {
    let all: Vec<&String> = per_client.iter().flatten().collect();
    let n = all.len();
    let distinct: HashSet<&String> = all.iter().copied().collect();
    assert_eq!(distinct.len(), n, "a ticket was issued twice");
    for t in &all {
        assert!(
            t.len() >= 22,
            "{t:?} is shorter than 22 characters (128 bits)"
        );
        assert!(t.bytes().all(|b| b.is_ascii_graphic()), "{t:?}");
    }
    // Not sequential, in any encoding: sorted neighbours share only a short
    // prefix (random 128-bit tokens: about log16(n^2) = 10 hex digits at
    // most; a counter would share all but the last one or two).
    let mut sorted = all.clone();
    sorted.sort();
    let longest = sorted
        .windows(2)
        .map(|w| common_prefix(w[0], w[1]))
        .max()
        .unwrap_or(0);
    let shortest = all.iter().map(|t| t.len()).min().unwrap_or(0);
    assert!(
        longest + 12 <= shortest,
        "sorted neighbours share a {longest}-character prefix of {shortest}"
    );
    // Consecutive tickets of one client share no long prefix either.
    for tickets in per_client {
        for w in tickets.windows(2) {
            assert!(
                common_prefix(&w[0], &w[1]) + 12 <= shortest,
                "consecutive tickets {:?} and {:?}",
                w[0],
                w[1]
            );
        }
    }
    // Spread: at every position, every character of the alphabet is about
    // equally likely.
    let alphabet: HashSet<u8> = all.iter().flat_map(|t| t.bytes()).collect();
    assert!(
        alphabet.len() >= 16,
        "only {} distinct characters",
        alphabet.len()
    );
    for position in 0..shortest {
        let mut counts = [0usize; 256];
        for t in &all {
            counts[usize::from(t.as_bytes()[position])] += 1;
        }
        let used: Vec<usize> = counts.iter().copied().filter(|&c| c > 0).collect();
        let expected = n / used.len();
        let max = used.iter().copied().max().unwrap_or(0);
        let min = used.iter().copied().min().unwrap_or(0);
        assert!(
            used.len() >= 16 && max <= expected * 6 / 5 && min >= expected * 4 / 5,
            "position {position}: {} characters, counts from {min} to {max} (expected about {expected})",
            used.len()
        );
    }
    // For hex tokens of 128 bits (the current encoding): as numbers, no two
    // are close, consecutive ones never differ by 1, and every bit is set
    // in about half of them.
    if all
        .iter()
        .all(|t| t.len() == 32 && t.bytes().all(|b| b.is_ascii_hexdigit()))
    {
        let mut numbers: Vec<u128> = all
            .iter()
            .map(|t| u128::from_str_radix(t, 16).expect("hex"))
            .collect();
        for tickets in per_client {
            for w in tickets.windows(2) {
                let a = u128::from_str_radix(&w[0], 16).expect("hex");
                let b = u128::from_str_radix(&w[1], 16).expect("hex");
                assert!(a.abs_diff(b) > 1, "{a:x} then {b:x}");
            }
        }
        for bit in 0..128 {
            let ones = numbers.iter().filter(|&&v| v >> bit & 1 == 1).count();
            assert!(
                ones.abs_diff(n / 2) < n / 50,
                "bit {bit} is set in {ones} of {n} tickets"
            );
        }
        numbers.sort_unstable();
        let closest = numbers
            .windows(2)
            .map(|w| w[1] - w[0])
            .min()
            .unwrap_or(u128::MAX);
        assert!(
            closest > 1 << 64,
            "two tickets differ by only {closest} as numbers"
        );
    }
}

// ---------------------------------------------------------------------------
// (d) Renew (L2).

const RENEW_CONFIG: &str = r#"
[[rule]]
match = "probe/*"
breaker = { mode = "consecutive", failures = 1, break = "1s" }
lease = { default = "5s", max = "10s" }

[default]
lease = { default = "1s", max = "10s" }
"#;

async fn renew(
    client: &mut Client,
    ticket: &str,
    lease: Option<prost_types::Duration>,
) -> Result<u64, Status> {
    client
        .renew(pb::RenewRequest {
            ticket: ticket.into(),
            lease,
        })
        .await
        .map(|r| millis(r.into_inner().lease).expect("Renew answers the time left"))
}

async fn live(server: &Server, key: &str) -> u32 {
    server.get(key).await.live_tickets
}

/// L2: Renew moves a live ticket's lease end to now + lease, capped by
/// lease.max, defaulting to lease.default; unknown tickets are NOT_FOUND.
#[tokio::test]
async fn renew_extends_a_lease_from_now_capped_by_the_policy() {
    let server = Server::manual(Some(RENEW_CONFIG)).await;
    let mut c = server.fusebox().await;
    let key = "renew/a";

    // Extended: the ticket outlives its old lease end (1_000).
    let reply = acquire(&mut c, request(key)).await;
    assert_eq!(millis(reply.lease), Some(1_000));
    let ticket = reply.ticket;
    assert_eq!(advance(&server, 900).await, 900);
    assert_eq!(
        renew(&mut c, &ticket, Some(ms(2_000))).await.ok(),
        Some(2_000)
    );
    assert_eq!(advance(&server, 100).await, 1_000);
    assert_eq!(live(&server, key).await, 1, "alive at its old lease end");
    assert_eq!(advance(&server, 1_899).await, 2_899);
    assert_eq!(live(&server, key).await, 1);
    assert_eq!(advance(&server, 1).await, 2_900);
    assert_eq!(live(&server, key).await, 0, "ended at 900 + 2000");
    let gone = renew(&mut c, &ticket, Some(ms(2_000)))
        .await
        .expect_err("expired");
    assert_eq!(gone.code(), Code::NotFound, "{gone:?}");
    crate::admin::complete_not_found(&mut c, &ticket).await;

    // Capped by lease.max (10 s), counted from now.
    let ticket = granted(&mut c, request(key)).await;
    assert_eq!(
        renew(&mut c, &ticket, Some(ms(3_600_000))).await.ok(),
        Some(10_000)
    );
    assert_eq!(advance(&server, 9_999).await, 12_899);
    assert_eq!(live(&server, key).await, 1);
    advance(&server, 1).await;
    assert_eq!(live(&server, key).await, 0, "ended at the cap");

    // Absent: lease.default (1 s) from now; a finer duration rounds up (T1).
    let ticket = granted(&mut c, request(key)).await;
    advance(&server, 500).await;
    assert_eq!(renew(&mut c, &ticket, None).await.ok(), Some(1_000));
    assert_eq!(
        renew(
            &mut c,
            &ticket,
            Some(prost_types::Duration {
                seconds: 1,
                nanos: 1
            })
        )
        .await
        .ok(),
        Some(1_001)
    );
    // Shorter than what was left: the lease now ends sooner.
    assert_eq!(renew(&mut c, &ticket, Some(ms(100))).await.ok(), Some(100));
    advance(&server, 99).await;
    assert_eq!(live(&server, key).await, 1);
    advance(&server, 1).await;
    assert_eq!(live(&server, key).await, 0);

    // A completed ticket, and one never issued.
    let ticket = granted(&mut c, request(key)).await;
    complete(&mut c, &ticket, pb::Outcome::Success).await;
    for unknown in [ticket.as_str(), "00000000000000000000000000000000", "nope"] {
        let status = renew(&mut c, unknown, None).await.expect_err("not live");
        assert_eq!(status.code(), Code::NotFound, "{status:?}");
        assert!(status.message().contains("ticket"), "{status:?}");
    }
}

/// B1: renewing a probe extends the ticket, not the probe slot.
#[tokio::test]
async fn renewing_a_probe_does_not_extend_the_probe_slot() {
    let server = Server::manual(Some(RENEW_CONFIG)).await;
    let mut c = server.fusebox().await;
    let key = "probe/a";
    let ticket = granted(&mut c, request(key)).await;
    complete(&mut c, &ticket, pb::Outcome::Failure).await;
    advance(&server, 1_000).await;
    let probe = acquire(&mut c, request(key)).await;
    assert_eq!(probe.decision, pb::Decision::Probe as i32, "{probe:?}");
    // The slot lasts probe_lease = break = 1 s; the ticket 5 s, renewed to 10 s.
    assert_eq!(
        renew(&mut c, &probe.ticket, Some(ms(10_000))).await.ok(),
        Some(10_000)
    );
    advance(&server, 999).await;
    let blocked = acquire(&mut c, request(key)).await;
    assert_eq!(
        blocked.reason,
        pb::Reason::ProbeInFlight as i32,
        "{blocked:?}"
    );
    assert_eq!(millis(blocked.retry_after), Some(1));
    advance(&server, 1).await;
    let next = acquire(&mut c, request(key)).await;
    assert_eq!(
        next.decision,
        pb::Decision::Probe as i32,
        "the slot ended: {next:?}"
    );
    assert_eq!(
        live(&server, key).await,
        2,
        "the renewed probe ticket lives on"
    );
    let stale = complete(&mut c, &probe.ticket, pb::Outcome::Success).await;
    assert!(stale.stale, "a superseded probe is stale");
    assert_eq!(stale.phase, pb::Phase::HalfOpen as i32);
}

// ---------------------------------------------------------------------------
// (e) Caps (K3).

const CAPS_CONFIG: &str = r#"
[server]
max_keys = 2
max_tickets = 2
max_waiters = 1

[[rule]]
match = "q"
limiter = { kind = "concurrency", permits = 1, queue_limit = 5 }
"#;

/// K3: past each cap, the request that would make more fails with
/// RESOURCE_EXHAUSTED naming the cap; existing keys keep working.
#[tokio::test]
async fn each_cap_refuses_what_would_pass_it_and_existing_keys_keep_working() {
    let server = Server::manual(Some(CAPS_CONFIG)).await;
    let mut c = server.fusebox().await;

    // Key 1, ticket 1, waiter 1.
    let t1 = granted(&mut c, request("q")).await;
    let waiter = spawn_acquire(&server, waiting("q", 3_600_000)).await;
    let q = server.until("a waiter on q", "q", |s| s.waiters == 1).await;
    assert_eq!((q.free, q.queued, q.live_tickets), (0, 1, 1));

    // Waiter cap.
    assert_exhausted(c.acquire(waiting("q", 3_600_000)).await, "max_waiters");
    // (q's statistics count the denial just above; its state is unchanged.)
    assert_eq!(
        core(server.get("q").await),
        core(q.clone()),
        "nothing changed"
    );
    // A request that does not wait is answered as usual.
    let denied = acquire(&mut c, request("q")).await;
    assert_eq!(denied.decision, pb::Decision::Denied as i32);

    // Key 2, ticket 2.
    let t2 = granted(&mut c, request("a")).await;
    let a = server.get("a").await;

    // Key cap: a third key is not made.
    assert_exhausted(c.acquire(request("b")).await, "max_keys");
    assert_eq!(core(server.get("b").await), fresh("b"));
    // Ticket cap, on an existing key.
    assert_exhausted(c.acquire(request("a")).await, "max_tickets");
    assert_eq!(server.get("a").await, a, "nothing changed");
    // (q's statistics count the denial just above; its state is unchanged.)
    assert_eq!(
        core(server.get("q").await),
        core(q.clone()),
        "nothing changed"
    );

    // Existing keys keep working.
    let done = complete(&mut c, &t2, pb::Outcome::Failure).await;
    assert!(!done.stale);
    assert_eq!(server.get("a").await.consecutive_failures, 1);
    let t3 = granted(&mut c, request("a")).await;
    // Completing t1 serves the waiter (the tickets stay at 2).
    complete(&mut c, &t1, pb::Outcome::Success).await;
    let served = tokio::time::timeout(LIMIT, waiter)
        .await
        .expect("the waiter is answered")
        .expect("the task ran")
        .expect("Acquire answers");
    assert_eq!(served.decision, pb::Decision::Granted as i32, "{served:?}");
    // The waiter cap has room again: a new waiter queues, and is refused
    // when the key is isolated (C4).
    let waiter = spawn_acquire(&server, waiting("q", 3_600_000)).await;
    server
        .until("a new waiter on q", "q", |s| s.waiters == 1)
        .await;
    steer(&mut server.admin().await, true, None, "q", "test")
        .await
        .expect("Isolate answers");
    let refused = tokio::time::timeout(LIMIT, waiter)
        .await
        .expect("the waiter is answered")
        .expect("the task ran")
        .expect("Acquire answers");
    assert_eq!(
        refused.decision,
        pb::Decision::Refused as i32,
        "{refused:?}"
    );
    complete(&mut c, &t3, pb::Outcome::Success).await;
    complete(&mut c, &served.ticket, pb::Outcome::Success).await;
    let t4 = granted(&mut c, request("a")).await;
    assert!(!t4.is_empty());

    // Each refusal above is counted, by cap.
    let http = server.http_addr.clone().expect("an HTTP address");
    let metrics = crate::http::get(&http, "/metrics").await.body;
    for (cap, refused) in [("max_keys", 1), ("max_tickets", 1), ("max_waiters", 1)] {
        let line = format!("fusebox_cap_refusals_total{{cap=\"{cap}\"}} {refused}");
        assert!(
            metrics.lines().any(|l| l == line),
            "no line {line:?} in /metrics:\n{metrics}"
        );
    }
}

/// K3 with E3: a request refused at the ticket cap makes no key either.
#[tokio::test]
async fn a_request_refused_at_the_ticket_cap_makes_no_key() {
    let server = Server::manual(Some("[server]\nmax_keys = 2\nmax_tickets = 1\n")).await;
    let mut c = server.fusebox().await;
    let t1 = granted(&mut c, request("a")).await;
    assert_exhausted(c.acquire(request("b")).await, "max_tickets");
    complete(&mut c, &t1, pb::Outcome::Success).await;
    // Had "b" been made, "a" and "b" would fill the key cap.
    let t = granted(&mut c, request("c")).await;
    complete(&mut c, &t, pb::Outcome::Success).await;
    assert_exhausted(c.acquire(request("d")).await, "max_keys");
}

// ---------------------------------------------------------------------------
// (f) Idle forgetting (K2).

const IDLE_CONFIG: &str = r#"
[server]
idle_after = "50ms"
max_keys = 3
"#;

/// K2: keys at rest are forgotten once idle; keys with a recorded failure
/// or an isolated breaker are not. The key cap shows the live count.
#[tokio::test]
async fn idle_keys_at_rest_are_forgotten_and_others_kept() {
    let server = Server::manual(Some(IDLE_CONFIG)).await;
    let mut c = server.fusebox().await;
    let mut admin = server.admin().await;
    let t = granted(&mut c, request("rest")).await;
    complete(&mut c, &t, pb::Outcome::Success).await;
    let t = granted(&mut c, request("failed")).await;
    complete(&mut c, &t, pb::Outcome::Failure).await;
    steer(&mut admin, true, None, "isolated", "test")
        .await
        .expect("Isolate answers");
    assert_exhausted(c.acquire(request("new")).await, "max_keys");

    // Not idle long enough yet.
    assert_eq!(advance(&server, 25).await, 25);
    assert_exhausted(c.acquire(request("new")).await, "max_keys");

    // Idle: "rest" is forgotten, which frees a key for "new".
    assert_eq!(advance(&server, 75).await, 100);
    assert_eq!(core(server.get("rest").await), fresh("rest"));
    let t = granted(&mut c, request("new")).await;
    complete(&mut c, &t, pb::Outcome::Success).await;
    // "failed" and "isolated" were kept: the cap is full again.
    assert_exhausted(c.acquire(request("newer")).await, "max_keys");
    assert_eq!(
        core(server.get("failed").await),
        pb::KeyState {
            consecutive_failures: 1,
            ..fresh("failed")
        }
    );
    assert_eq!(
        server.get("isolated").await.phase,
        pb::Phase::Isolated as i32
    );

    // A forgotten key made again behaves as fresh (once "new", at rest, is
    // forgotten in turn to make room).
    advance(&server, 100).await;
    let reply = acquire(&mut c, request("rest")).await;
    assert_eq!(reply.decision, pb::Decision::Granted as i32, "{reply:?}");
}

// ---------------------------------------------------------------------------
// (g) Health.

async fn health_status(client: &mut HealthClient<Channel>, service: &str) -> Result<i32, Status> {
    client
        .check(HealthCheckRequest {
            service: service.into(),
        })
        .await
        .map(|r| r.into_inner().status)
}

/// Waits for the exit of a server that was told to stop; returns its
/// exit status and standard error.
async fn exit_of(server: &mut Server) -> (std::process::ExitStatus, String) {
    let status = tokio::time::timeout(LIMIT, server.child.wait())
        .await
        .expect("the server exits after SIGTERM")
        .expect("wait works");
    (status, server.all_logs().await)
}

/// grpc.health.v1: SERVING for the server and its services; NOT_SERVING
/// once shutdown begins (seen on a Watch stream).
#[tokio::test]
async fn health_is_serving_then_not_serving_during_shutdown() {
    let mut server = Server::start(Options::default()).await;
    let mut health = HealthClient::new(server.channel().await);
    let serving = ServingStatus::Serving as i32;
    for service in ["", "fusebox.v1.Fusebox", "fusebox.v1.Admin"] {
        assert_eq!(
            health_status(&mut health, service).await.ok(),
            Some(serving),
            "{service:?}"
        );
    }
    for service in ["fusebox.v1.Clock", "no.such.Service"] {
        let status = health_status(&mut health, service)
            .await
            .expect_err("not served");
        assert_eq!(status.code(), Code::NotFound, "{service:?}: {status:?}");
    }

    let mut streams = Vec::new();
    for service in ["", "fusebox.v1.Fusebox"] {
        let mut stream = HealthClient::new(server.channel().await)
            .watch(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .expect("Watch answers")
            .into_inner();
        let first = tokio::time::timeout(LIMIT, stream.message())
            .await
            .expect("a first status")
            .expect("the stream works")
            .expect("a message");
        assert_eq!(first.status, serving, "{service:?}");
        streams.push((service, stream));
    }
    server.terminate();
    for (service, stream) in &mut streams {
        let next = tokio::time::timeout(LIMIT, stream.message())
            .await
            .expect("a status change")
            .expect("the stream works")
            .expect("a message");
        assert_eq!(next.status, ServingStatus::NotServing as i32, "{service:?}");
    }
    drop(streams);
    let (status, stderr) = exit_of(&mut server).await;
    assert!(status.success(), "{status:?}\n{stderr}");
}

// ---------------------------------------------------------------------------
// (h) Reflection.

async fn listed_services(server: &Server) -> Vec<String> {
    use tokio_stream::StreamExt;
    use tonic_reflection::pb::v1::{
        server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
        ServerReflectionRequest,
    };
    let mut client = ServerReflectionClient::new(server.channel().await);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut stream = client
        .server_reflection_info(tonic::Request::new(tokio_stream::once(request)))
        .await
        .expect("reflection answers")
        .into_inner();
    let reply = stream.next().await.expect("a reply").expect("not an error");
    match reply.message_response {
        Some(MessageResponse::ListServicesResponse(list)) => {
            let mut names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
            names.sort();
            names
        }
        other => panic!("not a service list: {other:?}"),
    }
}

/// Reflection v1 lists the services, and Clock only with --manual-clock.
#[tokio::test]
async fn reflection_lists_the_served_services() {
    let allowed = [
        "fusebox.v1.Fusebox",
        "fusebox.v1.Admin",
        "fusebox.v1.Clock",
        "envoy.service.ratelimit.v3.RateLimitService",
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
        "grpc.reflection.v1alpha.ServerReflection",
    ];
    for manual_clock in [false, true] {
        let server = Server::start(Options {
            manual_clock,
            ..Options::default()
        })
        .await;
        let names = listed_services(&server).await;
        for required in [
            "fusebox.v1.Fusebox",
            "fusebox.v1.Admin",
            "envoy.service.ratelimit.v3.RateLimitService",
            "grpc.health.v1.Health",
        ] {
            assert!(
                names.iter().any(|n| n == required),
                "{required} in {names:?}"
            );
        }
        assert_eq!(
            names.iter().any(|n| n == "fusebox.v1.Clock"),
            manual_clock,
            "Clock is listed only with --manual-clock: {names:?}"
        );
        for name in &names {
            assert!(
                allowed.contains(&name.as_str()),
                "unexpected {name} in {names:?}"
            );
        }
    }
}

// ---------------------------------------------------------------------------
// (i) Graceful shutdown.

const SHUTDOWN_CONFIG: &str = r#"
[[rule]]
match = "q"
limiter = { kind = "concurrency", permits = 1, queue_limit = 4 }
"#;

/// SIGTERM with calls in flight: a waiter is answered UNAVAILABLE, an
/// Acquire the server already decided gets its decision, concurrent ones
/// get a decision or UNAVAILABLE, and the process exits 0 without cutting
/// calls off at the grace period.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_answers_calls_in_flight_and_exits_zero() {
    let mut server = Server::manual(Some(SHUTDOWN_CONFIG)).await;
    let mut c = server.fusebox().await;
    let _held = granted(&mut c, request("q")).await;
    let waiter = spawn_acquire(&server, waiting("q", 3_600_000)).await;
    server.until("a waiter on q", "q", |s| s.waiters == 1).await;

    // Decided by the server before the signal; its reply may still be on
    // the way.
    let decided = spawn_acquire(&server, request("n")).await;
    server
        .until("the Acquire on n decided", "n", |s| s.live_tickets == 1)
        .await;
    // Sent just before the signal, on an open connection.
    let mut burst = Vec::new();
    let burst_client = server.fusebox().await;
    for i in 0..20 {
        let mut client = burst_client.clone();
        burst.push(tokio::spawn(async move {
            client
                .acquire(request(&format!("burst/{i}")))
                .await
                .map(|r| r.into_inner())
        }));
    }
    tokio::task::yield_now().await;
    server.terminate();

    let answer = tokio::time::timeout(LIMIT, waiter)
        .await
        .expect("the waiter is answered")
        .expect("the task ran");
    let status = answer.expect_err("the waiter is told the server is going away");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    let reply = tokio::time::timeout(LIMIT, decided)
        .await
        .expect("answered")
        .expect("the task ran")
        .expect("the decided Acquire gets its decision");
    assert_eq!(reply.decision, pb::Decision::Granted as i32, "{reply:?}");
    // Each of these ends promptly: with a decision, with UNAVAILABLE (the
    // engine was already shutting down), or with a transport error when the
    // call was still on the client's side as the connection went away
    // (GOAWAY, connection closed: the server never took it). The client
    // cannot tell the last kind from a call cut off by the server, so only
    // the calls the server is known to hold (above) are held to an answer.
    let mut answered = 0;
    let mut codes = Vec::new();
    for call in burst {
        match tokio::time::timeout(LIMIT, call)
            .await
            .expect("ended")
            .expect("the task ran")
        {
            Ok(reply) => {
                assert_eq!(reply.decision, pb::Decision::Granted as i32, "{reply:?}");
                answered += 1;
            }
            Err(status) => codes.push(status.code()),
        }
    }
    eprintln!("errors for the rest: {codes:?}");
    eprintln!("{answered} of 20 Acquires sent with the signal got a decision");

    let started = Instant::now();
    let (status, stderr) = exit_of(&mut server).await;
    assert!(status.success(), "exit {status:?}\n{stderr}");
    assert!(
        !stderr.contains("exiting anyway"),
        "calls were cut off at the grace period ({:?}):\n{stderr}",
        started.elapsed()
    );
    drop(c);
}

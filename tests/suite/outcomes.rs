//! The Rust guard reports outcomes off the caller's path
//! (`clients/README.md`, "Outcomes off the caller's path"), against a real
//! server on both transports: the guard returns while fusebox is stopped
//! (SIGSTOP), the queue's bound holds, `flush` waits for what was queued
//! before it, the last clone dropped still sends what is queued, and a send
//! fusebox cannot take is counted.

use std::sync::Arc;
use std::time::Duration;

use fusebox::guard::{CallOptions, Guard, GuardError, GuardOptions, Outcome, Transport};
use proptest::prelude::*;
use proptest::test_runner::{TestCaseError, TestRunner};
use tokio::sync::{oneshot, watch, Barrier};

use crate::harness::{self, signal, Server};

/// How long a step may take before the test fails.
const LIMIT: Duration = Duration::from_secs(10);

/// A deadline for fusebox calls (and so for each background send) longer
/// than any stop in these tests: an outcome sent while the server is
/// stopped is answered once it runs again, not failed.
const PATIENT: Duration = Duration::from_secs(30);

/// `svc/*` never trips, whatever fails.
const NEVER_TRIPS: &str =
    "[[rule]]\nmatch = \"svc/*\"\nbreaker = { mode = \"consecutive\", failures = 1000000, break = \"10s\" }\n";

const TRANSPORTS: [Transport; 2] = [Transport::Unary, Transport::Stream];

fn guard(server: &Server, options: GuardOptions) -> Guard {
    Guard::connect(&format!("http://{}", server.addr), None, options).expect("a guard")
}

fn patient(transport: Transport) -> GuardOptions {
    GuardOptions {
        deadline: PATIENT,
        transport,
        ..GuardOptions::default()
    }
}

/// The state letter of process `pid` (`T` while stopped by a signal).
fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `PID (COMM) STATE ...`; COMM may hold spaces and parentheses.
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// A server stopped with SIGSTOP: its connections stay open and nothing is
/// answered until it is resumed (SIGCONT), at the latest when this is
/// dropped.
struct Stopped {
    pid: u32,
    resumed: bool,
}

impl Stopped {
    /// Stops the process `pid` and waits until it is stopped.
    async fn stop(pid: u32) -> Stopped {
        assert!(signal(pid, "STOP"), "kill -STOP {pid}");
        let stopped = Stopped {
            pid,
            resumed: false,
        };
        harness::eventually("the server to stop", LIMIT, || async {
            (process_state(pid) == Some('T')).then_some(())
        })
        .await;
        stopped
    }

    fn still_stopped(&self) -> bool {
        process_state(self.pid) == Some('T')
    }

    fn resume(mut self) {
        self.resumed = true;
        assert!(signal(self.pid, "CONT"), "kill -CONT {}", self.pid);
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        if !self.resumed {
            signal(self.pid, "CONT");
        }
    }
}

fn pid(server: &Server) -> u32 {
    server.child.id().expect("the server runs")
}

/// The guard returns the call's value while fusebox is stopped: it did not
/// wait for Complete. Once fusebox runs again, `flush` returns and the
/// success is counted, the ticket gone.
async fn the_guard_returns_while_fusebox_is_stopped(transport: Transport) {
    let server = Server::manual(None).await;
    let guard = guard(&server, patient(transport));
    let key = "svc/off-path";
    let pid = pid(&server);
    let answer = tokio::time::timeout(
        LIMIT,
        guard.run(key, &CallOptions::default(), || async move {
            // Granted: now fusebox stops answering.
            Ok::<_, String>(Stopped::stop(pid).await)
        }),
    )
    .await
    .unwrap_or_else(|_| {
        panic!("{transport:?}: the guard waited on fusebox after the call (for its Complete)")
    });
    let stopped = answer.expect("granted, and the call's value");
    assert!(
        stopped.still_stopped(),
        "{transport:?}: the guard returned while fusebox was stopped"
    );
    stopped.resume();
    tokio::time::timeout(LIMIT, guard.flush())
        .await
        .expect("flush ends")
        .expect("the outcome is answered");
    let state = server.get(key).await;
    let stats = state.stats.clone().unwrap_or_default();
    assert_eq!(
        (stats.successes, state.live_tickets),
        (1, 0),
        "{transport:?}: {state:?}"
    );
    let counters = guard.stats();
    assert_eq!(
        (counters.complete_failures, counters.outcomes_dropped),
        (0, 0)
    );
}

#[tokio::test]
async fn the_guard_returns_while_fusebox_is_stopped_unary() {
    the_guard_returns_while_fusebox_is_stopped(Transport::Unary).await;
}

#[tokio::test]
async fn the_guard_returns_while_fusebox_is_stopped_stream() {
    the_guard_returns_while_fusebox_is_stopped(Transport::Stream).await;
}

/// `count` calls on `key` through `guard`, all running when fusebox is
/// stopped, then ending: returns once every guard has returned (granted,
/// with the call's value), fusebox still stopped.
async fn calls_that_end_while_stopped(
    guard: &Guard,
    server: &Server,
    key: &'static str,
    count: usize,
) -> Stopped {
    let running = Arc::new(Barrier::new(count + 1));
    let (open, latch) = watch::channel(false);
    let mut calls = Vec::new();
    for _ in 0..count {
        let (guard, running, mut latch) = (guard.clone(), running.clone(), latch.clone());
        calls.push(tokio::spawn(async move {
            guard
                .run(key, &CallOptions::default(), || async move {
                    running.wait().await;
                    let _ = latch.wait_for(|open| *open).await;
                    Ok::<_, String>(())
                })
                .await
        }));
    }
    running.wait().await;
    let stopped = Stopped::stop(pid(server)).await;
    open.send(true).expect("the calls wait on the latch");
    for call in calls {
        tokio::time::timeout(LIMIT, call)
            .await
            .expect("each guard returns while fusebox is stopped")
            .expect("no panic")
            .expect("granted, and the call's value");
    }
    stopped
}

/// With a queue of one, four calls that end while fusebox is stopped: one
/// send in flight and one outcome queued at most, the rest dropped. Every
/// outcome either reaches fusebox or is counted dropped, and each dropped
/// one's ticket lives on (until its lease would end).
#[tokio::test]
async fn the_outcome_queue_is_bounded_and_what_it_drops_is_counted() {
    for transport in TRANSPORTS {
        let server = Server::manual(None).await;
        let guard = guard(
            &server,
            GuardOptions {
                outcome_queue: 1,
                ..patient(transport)
            },
        );
        let key = "svc/bound";
        let stopped = calls_that_end_while_stopped(&guard, &server, key, 4).await;
        assert!(stopped.still_stopped());
        stopped.resume();
        tokio::time::timeout(LIMIT, guard.flush())
            .await
            .expect("flush ends")
            .expect("what was queued is answered");
        let dropped = guard.stats().outcomes_dropped;
        let state = server.get(key).await;
        let reached = state.stats.clone().unwrap_or_default().successes;
        assert_eq!(
            reached + dropped,
            4,
            "{transport:?}: every outcome arrived or was dropped: {state:?}"
        );
        assert!(
            dropped >= 2,
            "{transport:?}: one in flight and one queued at most, so at least two dropped, not {dropped}"
        );
        assert_eq!(
            u64::from(state.live_tickets),
            dropped,
            "{transport:?}: a dropped outcome's ticket lives on"
        );
        assert_eq!(guard.stats().complete_failures, 0);
    }
}

/// When every clone of the guard is gone, what is queued is still sent:
/// more outcomes than one send carries end while fusebox is stopped, so
/// some are still queued (behind the send in flight) when the last clone
/// goes.
#[tokio::test]
async fn the_last_clone_dropped_still_sends_what_is_queued() {
    const CALLS: usize = 1005;
    for transport in TRANSPORTS {
        let server = Server::manual(None).await;
        let guard = guard(&server, patient(transport));
        let key = "svc/dropped-guard";
        // The outcomes wait: one send in flight (1,000 at most), the
        // others queued.
        let stopped = calls_that_end_while_stopped(&guard, &server, key, CALLS).await;
        drop(guard);
        stopped.resume();
        harness::eventually("the queued outcomes to arrive", LIMIT, || async {
            let state = server.get(key).await;
            let successes = state.stats.unwrap_or_default().successes;
            (successes == CALLS as u64 && state.live_tickets == 0).then_some(())
        })
        .await;
    }
}

/// The server killed while a call runs: the call's value comes back, and
/// `flush` returns in time with the outcome counted as failed.
#[tokio::test]
async fn a_send_that_fails_is_counted_and_flush_still_returns() {
    for transport in TRANSPORTS {
        let mut server = Server::manual(None).await;
        let guard = guard(
            &server,
            GuardOptions {
                // Enough for a busy debug server's Acquire; the send fails
                // at once (the connection is refused).
                deadline: Duration::from_secs(2),
                transport,
                ..GuardOptions::default()
            },
        );
        let child = &mut server.child;
        let answer = guard
            .run("svc/killed", &CallOptions::default(), move || async move {
                child.kill().await.expect("the server is killed");
                Ok::<_, String>(1)
            })
            .await;
        assert_eq!(answer.expect("the call's value"), 1);
        tokio::time::timeout(LIMIT, guard.flush())
            .await
            .expect("flush returns within its deadline")
            .expect("the failed send settled the outcome");
        let counters = guard.stats();
        assert_eq!(
            (counters.complete_failures, counters.outcomes_dropped),
            (1, 0),
            "{transport:?}: {counters:?}"
        );
    }
}

/// What a guarded call does, for the property below.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Call {
    /// Returns a value: SUCCESS.
    Succeed,
    /// Returns an error the classifier counts: FAILURE.
    Fail,
    /// Returns an error the classifier ignores: IGNORED.
    Ignore,
    /// Its caller drops the guard once the call runs: IGNORED.
    Cancel,
}

fn call() -> impl Strategy<Value = Call> {
    prop_oneof![
        Just(Call::Succeed),
        Just(Call::Fail),
        Just(Call::Ignore),
        Just(Call::Cancel)
    ]
}

fn classify(e: &String) -> Outcome {
    if e == "ignore" {
        Outcome::Ignored
    } else {
        Outcome::Failure
    }
}

async fn one(guard: Guard, key: String, call: Call) {
    let options = CallOptions::default();
    if call == Call::Cancel {
        let (started, running) = oneshot::channel::<()>();
        let run = guard.run_classified(&key, &options, classify, || async move {
            let _ = started.send(());
            std::future::pending::<Result<(), String>>().await
        });
        tokio::select! {
            answer = run => panic!("the guard ended without running the call: {answer:?}"),
            _ = running => {}
        }
        return;
    }
    let answer: Result<(), GuardError<String>> = guard
        .run_classified(&key, &options, classify, || async move {
            match call {
                Call::Succeed => Ok(()),
                Call::Fail => Err("boom".to_owned()),
                _ => Err("ignore".to_owned()),
            }
        })
        .await;
    match (call, answer) {
        (Call::Succeed, Ok(())) | (Call::Fail | Call::Ignore, Err(GuardError::Call(_))) => {}
        (call, answer) => panic!("{call:?} gave {answer:?}"),
    }
}

/// For any mix of calls (values, counted and ignored errors, callers that
/// go away), one after another or all at once, on either transport: after
/// `flush`, one read of the key shows every outcome counted once, by kind,
/// and no ticket left.
#[test]
fn after_flush_fusebox_has_counted_every_outcome_once() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let server = rt.block_on(Server::manual(Some(NEVER_TRIPS)));
    let strategy = (
        prop::collection::vec(call(), 1..12),
        any::<bool>(),
        prop_oneof![Just(Transport::Unary), Just(Transport::Stream)],
    );
    let case = std::sync::atomic::AtomicU32::new(0);
    let mut runner = TestRunner::new(ProptestConfig {
        cases: 16,
        source_file: Some(file!()),
        ..ProptestConfig::default()
    });
    let outcome = runner.run(&strategy, |(calls, at_once, transport)| {
        let n = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let key = format!("svc/flush-{n}");
        rt.block_on(async {
            let guard = guard(&server, patient(transport));
            if at_once {
                let mut tasks = tokio::task::JoinSet::new();
                for &c in &calls {
                    tasks.spawn(one(guard.clone(), key.clone(), c));
                }
                while let Some(done) = tasks.join_next().await {
                    done.map_err(|e| TestCaseError::fail(format!("a call panicked: {e}")))?;
                }
            } else {
                for &c in &calls {
                    one(guard.clone(), key.clone(), c).await;
                }
            }
            tokio::time::timeout(LIMIT, guard.flush())
                .await
                .map_err(|_| TestCaseError::fail("flush did not end"))?
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            let state = server.get(&key).await;
            let stats = state.stats.clone().unwrap_or_default();
            let count = |kinds: &[Call]| calls.iter().filter(|c| kinds.contains(c)).count() as u64;
            prop_assert_eq!(stats.granted, calls.len() as u64, "{:?}", state);
            prop_assert_eq!(stats.successes, count(&[Call::Succeed]), "{:?}", state);
            prop_assert_eq!(stats.failures, count(&[Call::Fail]), "{:?}", state);
            prop_assert_eq!(
                stats.ignored,
                count(&[Call::Ignore, Call::Cancel]),
                "{:?}",
                state
            );
            prop_assert_eq!(state.live_tickets, 0, "{:?}", state);
            let counters = guard.stats();
            prop_assert_eq!(
                (
                    counters.unavailable,
                    counters.complete_failures,
                    counters.outcomes_dropped
                ),
                (0, 0, 0)
            );
            Ok(())
        })
    });
    if let Err(failure) = outcome {
        panic!("{failure}");
    }
}

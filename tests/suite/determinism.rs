//! T2: the same inputs always give the same answers. Several lease ends at
//! one instant are settled in the order their tickets were granted, so a
//! trace replayed twice reads the same at every step, although the engine
//! draws every ticket's id at random (the order of ids differs from run to
//! run, the order of grants does not).
//!
//! Random traces in the vectors' format (many tickets of a few callers
//! whose leases end together under a quorum breaker, completions, renewals,
//! readings) are replayed twice on the embedded engine and twice through a
//! server on Redis (the module), every answer and reading recorded and
//! compared.

use fusebox::domain::policy::{BreakerSpec, LeaseSpec};
use fusebox::domain::{DurationSpec, PolicySpec};
use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, TestRunner};

use crate::vectors::{
    replay, Answer, EngineTarget, Expect, GrpcTarget, Reading, Step, Target, Vector,
};

/// A target whose every answer and reading is written down in order.
struct Recorder<T> {
    inner: T,
    seen: Vec<String>,
}

impl<T: Target> Target for Recorder<T> {
    async fn advance_to(&mut self, now: u64) {
        self.inner.advance_to(now).await
    }
    async fn acquire(&mut self, step: &Step) -> Answer {
        let answer = self.inner.acquire(step).await;
        self.seen.push(format!("acquire {answer:?}"));
        answer
    }
    async fn complete(
        &mut self,
        label: &str,
        outcome: &str,
        cost: Option<u32>,
    ) -> Result<bool, String> {
        let r = self.inner.complete(label, outcome, cost).await;
        self.seen.push(format!("complete {label} {r:?}"));
        r
    }
    async fn settle(&mut self, label: &str) -> Answer {
        let answer = self.inner.settle(label).await;
        self.seen.push(format!("settle {label} {answer:?}"));
        answer
    }
    async fn inspect(&mut self, key: &str) -> Reading {
        let reading = self.inner.inspect(key).await;
        self.seen.push(format!("inspect {reading:?}"));
        reading
    }
    async fn isolate(&mut self, key: &str) {
        self.inner.isolate(key).await
    }
    async fn close(&mut self, key: &str) {
        self.inner.close(key).await
    }
    async fn set_policy(&mut self, policy: &PolicySpec) {
        self.inner.set_policy(policy).await
    }
    async fn renew(&mut self, label: &str, lease: Option<u64>) -> Result<u64, String> {
        let r = self.inner.renew(label, lease).await;
        self.seen.push(format!("renew {label} {r:?}"));
        r
    }
}

/// What a round of the trace does after its grants.
#[derive(Clone, Debug)]
enum Then {
    /// Complete the round's `n`-th ticket with this outcome.
    Complete(usize, &'static str),
    /// Renew the round's `n`-th ticket to end with the others.
    Renew(usize),
}

/// One round: tickets granted at one instant (each caller `a`, `b` or
/// `c`, each lease 50 or 100 ms), some completed or renewed, then the key
/// read before, at and after the instant their leases end.
#[derive(Clone, Debug)]
struct Round {
    callers: Vec<u8>,
    leases: Vec<bool>,
    then: Vec<Then>,
}

fn round() -> impl Strategy<Value = Round> {
    (2usize..=7).prop_flat_map(|n| {
        let then = prop_oneof![
            (
                0..n,
                prop_oneof![Just("SUCCESS"), Just("FAILURE"), Just("IGNORED")]
            )
                .prop_map(|(i, o)| Then::Complete(i, o)),
            (0..n).prop_map(Then::Renew),
        ];
        (
            proptest::collection::vec(0u8..3, n),
            proptest::collection::vec(any::<bool>(), n),
            proptest::collection::vec(then, 0..3),
        )
            .prop_map(|(callers, leases, then)| Round {
                callers,
                leases,
                then,
            })
    })
}

fn trace() -> impl Strategy<Value = (u32, u32, Vec<Round>)> {
    (1u32..=3, 2u32..=3, proptest::collection::vec(round(), 1..6))
}

fn step(at: u64, op: &str) -> Step {
    Step {
        at,
        op: op.into(),
        key: Some("dep".into()),
        permits: None,
        max_wait: None,
        lease: None,
        label: None,
        ticket: None,
        outcome: None,
        cost: None,
        waiter: None,
        attempt: None,
        caller: None,
        policy: None,
        expect: Expect::default(),
    }
}

/// The trace as a vector without expectations: each round's grants at its
/// start, its completions and renewals 10 ms later, readings at 49, 50,
/// 99 and 100 ms (lease ends), the next round 2 s on (past any break).
fn vector((failures, quorum, rounds): &(u32, u32, Vec<Round>)) -> Vector {
    let policy = PolicySpec {
        breaker: Some(BreakerSpec {
            mode: "consecutive".into(),
            failures: Some(*failures),
            break_: Some(DurationSpec(1000)),
            quorum: Some(*quorum),
            ..BreakerSpec::default()
        }),
        lease: Some(LeaseSpec {
            default: Some(DurationSpec(100)),
            expired_outcome: Some("FAILURE".into()),
            ..LeaseSpec::default()
        }),
        ..PolicySpec::default()
    };
    let mut steps = Vec::new();
    for (r, round) in rounds.iter().enumerate() {
        let start = r as u64 * 2_000;
        let label = |i: usize| format!("r{r}t{i}");
        for (i, (&caller, &short)) in round.callers.iter().zip(&round.leases).enumerate() {
            let mut s = step(start, "acquire");
            s.label = Some(label(i));
            s.caller = Some(["a", "b", "c"][usize::from(caller)].into());
            s.lease = short.then_some(50);
            steps.push(s);
        }
        for then in &round.then {
            let mut s = match *then {
                Then::Complete(i, outcome) => {
                    let mut s = step(start + 10, "complete");
                    s.ticket = Some(label(i));
                    s.outcome = Some(outcome.into());
                    s
                }
                Then::Renew(i) => {
                    let mut s = step(start + 10, "renew");
                    s.ticket = Some(label(i));
                    s.lease = Some(90);
                    s
                }
            };
            s.key = None;
            steps.push(s);
        }
        for dt in [49, 50, 99, 100, 101] {
            steps.push(step(start + dt, "inspect"));
        }
    }
    Vector {
        name: "determinism".into(),
        about: String::new(),
        policy,
        steps,
    }
}

/// Replays `vector` on a target `make` gives, and writes down what it saw.
async fn record<T: Target>(vector: &Vector, target: T) -> Vec<String> {
    let mut recorder = Recorder {
        inner: target,
        seen: Vec::new(),
    };
    // With no expectations, only errors (a completed ticket's NOT_FOUND)
    // are reported: they are part of what was seen.
    let errors = replay(vector, &mut recorder).await;
    recorder.seen.extend(errors);
    recorder.seen
}

/// Runs `cases` random traces through `check`, which panics on a
/// difference (proptest shrinks it).
fn each_trace(cases: u32, check: impl Fn(&Vector)) {
    let mut runner = TestRunner::new(ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    runner
        .run(&trace(), |t| {
            check(&vector(&t));
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn a_trace_replayed_twice_on_the_engine_answers_alike() {
    let rt = tokio::runtime::Runtime::new().expect("a runtime");
    each_trace(48, |v| {
        let first = rt.block_on(record(v, EngineTarget::new(&v.policy)));
        let second = rt.block_on(record(v, EngineTarget::new(&v.policy)));
        assert_eq!(first, second, "the same trace answered differently");
    });
}

#[test]
fn a_trace_replayed_twice_through_the_module_answers_alike() {
    let rt = tokio::runtime::Runtime::new().expect("a runtime");
    let Some(redis) = rt.block_on(crate::harness::standalone(
        "a_trace_replayed_twice_through_the_module_answers_alike",
    )) else {
        return;
    };
    let port = redis.server.port;
    let store = format!("redis://127.0.0.1:{port}");
    each_trace(8, |v| {
        let mut seen = Vec::new();
        for _ in 0..2 {
            crate::store::flush(&[port]);
            let target = rt.block_on(GrpcTarget::shared(&v.policy, &store, 1));
            seen.push(rt.block_on(record(v, target)));
        }
        assert_eq!(seen[0], seen[1], "the same trace answered differently");
    });
}

//! The shared vectors of `tests/vectors/` (copied byte for byte from the
//! contract) replayed step by step, every expectation checked.
//!
//! The runner is written once against [`Target`]; each way of reaching
//! fusebox (the pure core here, the engine and the gRPC server elsewhere)
//! implements it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use fusebox::domain::{Ask, Decision, Fuse, Notice, PolicySpec, Reason, TicketId};
use serde::Deserialize;

/// One vector file.
#[derive(Debug, Deserialize)]
pub struct Vector {
    pub name: String,
    #[allow(dead_code)]
    pub about: String,
    pub policy: PolicySpec,
    pub steps: Vec<Step>,
}

/// One step of a vector.
#[derive(Debug, Deserialize)]
pub struct Step {
    pub at: u64,
    pub op: String,
    pub key: Option<String>,
    pub permits: Option<u32>,
    pub max_wait: Option<u64>,
    pub lease: Option<u64>,
    #[serde(rename = "as")]
    pub label: Option<String>,
    pub ticket: Option<String>,
    pub outcome: Option<String>,
    pub waiter: Option<String>,
    pub expect: Expect,
}

/// What a step expects; absent fields are not checked.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expect {
    pub decision: Option<String>,
    pub reason: Option<String>,
    pub retry_after: Option<u64>,
    pub ticket: Option<bool>,
    pub stale: Option<bool>,
    pub error: Option<String>,
    pub phase: Option<String>,
    pub consecutive_failures: Option<u32>,
    pub half_open_attempts: Option<u32>,
    pub open_until: Option<u64>,
    pub free: Option<u32>,
    pub queued: Option<u64>,
}

/// A decision as the vectors write it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub decision: String,
    pub reason: Option<String>,
    pub retry_after: Option<u64>,
    pub ticket: bool,
}

/// A key's state as the vectors write it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reading {
    pub phase: String,
    pub consecutive_failures: u32,
    pub half_open_attempts: u32,
    pub open_until: Option<u64>,
    pub free: u32,
    pub queued: u64,
}

/// A way of reaching fusebox that the runner can drive.
#[allow(async_fn_in_trait)]
pub trait Target {
    /// Moves the clock forward to `now` (ms from the start).
    async fn advance_to(&mut self, now: u64);
    /// Sends an acquire; a request still waiting answers `QUEUED`. The ticket
    /// or waiter is remembered under `label`.
    async fn acquire(&mut self, step: &Step) -> Answer;
    /// Completes the ticket remembered as `label`: `Ok(stale)` or `Err(code)`.
    async fn complete(&mut self, label: &str, outcome: &str) -> Result<bool, String>;
    /// The answer of the waiter remembered as `label`, or `QUEUED`.
    async fn settle(&mut self, label: &str) -> Answer;
    /// Reads a key.
    async fn inspect(&mut self, key: &str) -> Reading;
    /// Isolates a key.
    async fn isolate(&mut self, key: &str);
    /// Closes a key.
    async fn close(&mut self, key: &str);
}

/// Every vector in `tests/vectors/`, by name.
pub fn load_all() -> Vec<Vector> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/vectors");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("tests/vectors exists")
        .map(|e| e.expect("readable entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    paths.sort();
    assert!(paths.len() >= 24, "expected the contract's vectors in {dir:?}");
    paths
        .iter()
        .map(|p| {
            let text = std::fs::read_to_string(p).expect("readable vector");
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{p:?}: {e}"))
        })
        .collect()
}

fn check<T: PartialEq + std::fmt::Debug>(
    failures: &mut Vec<String>,
    i: usize,
    field: &str,
    want: Option<T>,
    got: T,
) {
    if let Some(want) = want {
        if want != got {
            failures.push(format!("step {i}: {field}: expected {want:?}, got {got:?}"));
        }
    }
}

/// Replays one vector; returns every mismatch.
pub async fn replay<T: Target>(vector: &Vector, target: &mut T) -> Vec<String> {
    let mut failures = Vec::new();
    for (i, step) in vector.steps.iter().enumerate() {
        target.advance_to(step.at).await;
        let e = &step.expect;
        match step.op.as_str() {
            "acquire" | "settle" => {
                let got = if step.op == "acquire" {
                    target.acquire(step).await
                } else {
                    target.settle(step.waiter.as_deref().expect("settle names a waiter")).await
                };
                check(&mut failures, i, "decision", e.decision.clone(), got.decision);
                check(&mut failures, i, "reason", e.reason.clone().map(Some), got.reason);
                check(&mut failures, i, "retry_after", e.retry_after.map(Some), got.retry_after);
                check(&mut failures, i, "ticket", e.ticket, got.ticket);
            }
            "complete" => {
                let label = step.ticket.as_deref().expect("complete names a ticket");
                let outcome = step.outcome.as_deref().expect("complete names an outcome");
                match target.complete(label, outcome).await {
                    Ok(stale) => {
                        check(&mut failures, i, "error", e.error.clone(), "none".to_owned());
                        check(&mut failures, i, "stale", e.stale, stale);
                    }
                    Err(code) => check(&mut failures, i, "error", Some(e.error.clone().unwrap_or_default()), code),
                }
            }
            "inspect" => {
                let got = target.inspect(step.key.as_deref().expect("inspect names a key")).await;
                check(&mut failures, i, "phase", e.phase.clone(), got.phase);
                check(&mut failures, i, "consecutive_failures", e.consecutive_failures, got.consecutive_failures);
                check(&mut failures, i, "half_open_attempts", e.half_open_attempts, got.half_open_attempts);
                check(&mut failures, i, "open_until", e.open_until.map(Some), got.open_until);
                check(&mut failures, i, "free", e.free, got.free);
                check(&mut failures, i, "queued", e.queued, got.queued);
            }
            "isolate" => target.isolate(step.key.as_deref().expect("isolate names a key")).await,
            "close" => target.close(step.key.as_deref().expect("close names a key")).await,
            other => failures.push(format!("step {i}: unknown op {other:?}")),
        }
    }
    failures
}

/// Writes a domain decision as the vectors do.
pub fn answer_of(decision: &Decision) -> Answer {
    let (name, reason, retry_after) = match *decision {
        Decision::Granted(_) => ("GRANTED", None, None),
        Decision::Probe(_) => ("PROBE", None, None),
        Decision::Blocked {
            reason,
            retry_after,
        } => ("BLOCKED", Some(reason), Some(retry_after)),
        Decision::Refused => ("REFUSED", None, None),
        Decision::Denied {
            reason,
            retry_after,
        } => ("DENIED", Some(reason), retry_after),
        Decision::Queued => ("QUEUED", None, None),
    };
    Answer {
        decision: name.to_owned(),
        reason: reason.map(|r: Reason| r.as_str().to_owned()),
        retry_after,
        ticket: decision.grant().is_some(),
    }
}

/// The pure core, driven directly with a manual clock.
pub struct CoreTarget {
    fuse: Fuse,
    now: u64,
    next_id: u128,
    labels: HashMap<String, TicketId>,
    answers: HashMap<TicketId, Decision>,
}

impl CoreTarget {
    pub fn new(policy: &PolicySpec) -> Self {
        let policy = policy.validate().expect("the vector's policy is valid");
        CoreTarget {
            fuse: Fuse::new(policy, 0),
            now: 0,
            next_id: 1,
            labels: HashMap::new(),
            answers: HashMap::new(),
        }
    }

    fn collect(&mut self) {
        for notice in self.fuse.drain_notices().collect::<Vec<_>>() {
            if let Notice::Answered { waiter, decision } = notice {
                self.answers.insert(waiter, decision);
            }
        }
    }
}

impl Target for CoreTarget {
    async fn advance_to(&mut self, now: u64) {
        self.now = now;
        self.fuse.advance(now).expect("time moves forward");
        self.collect();
    }

    async fn acquire(&mut self, step: &Step) -> Answer {
        let id = TicketId(self.next_id);
        self.next_id += 1;
        let ask = Ask {
            permits: step.permits.unwrap_or(1),
            max_wait: step.max_wait.unwrap_or(0),
            lease: step.lease,
            ..Ask::default()
        };
        let decision = self.fuse.acquire(&ask, id, self.now).expect("acquire is valid");
        self.collect();
        if let Some(label) = &step.label {
            self.labels.insert(label.clone(), id);
        }
        answer_of(&decision)
    }

    async fn complete(&mut self, label: &str, outcome: &str) -> Result<bool, String> {
        let id = self.labels[label];
        let outcome = serde_json::from_value(serde_json::json!(outcome)).expect("an outcome");
        let r = self.fuse.complete(id, outcome, self.now);
        self.collect();
        r.map(|c| c.stale).map_err(|_| "NOT_FOUND".to_owned())
    }

    async fn settle(&mut self, label: &str) -> Answer {
        let id = self.labels[label];
        match self.answers.get(&id) {
            Some(decision) => answer_of(decision),
            None => answer_of(&Decision::Queued),
        }
    }

    async fn inspect(&mut self, _key: &str) -> Reading {
        let v = self.fuse.view(self.now);
        Reading {
            phase: v.phase.as_str().to_owned(),
            consecutive_failures: v.consecutive_failures,
            half_open_attempts: v.half_open_attempts,
            open_until: v.open_until,
            free: v.free,
            queued: v.queued,
        }
    }

    async fn isolate(&mut self, _key: &str) {
        self.fuse.isolate(self.now).expect("isolate");
        self.collect();
    }

    async fn close(&mut self, _key: &str) {
        self.fuse.close(self.now).expect("close");
        self.collect();
    }
}

/// Replays every vector with `make_target`, printing each by name, and
/// fails with every mismatch of every vector.
pub async fn replay_all<T: Target>(mut make_target: impl AsyncFnMut(&Vector) -> T) {
    let mut report = Vec::new();
    for vector in load_all() {
        let mut target = make_target(&vector).await;
        let failures = replay(&vector, &mut target).await;
        if failures.is_empty() {
            println!("vector {} ... ok", vector.name);
        } else {
            println!("vector {} ... FAILED", vector.name);
            report.push(format!("{}:\n  {}", vector.name, failures.join("\n  ")));
        }
    }
    assert!(report.is_empty(), "vectors failed:\n{}", report.join("\n"));
}

#[tokio::test]
async fn every_vector_passes_against_the_core() {
    replay_all(async |v: &Vector| CoreTarget::new(&v.policy)).await;
}

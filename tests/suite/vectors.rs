//! The shared vectors of `tests/vectors/` (copied byte for byte from the
//! contract), and this project's vectors of the contract's extensions in
//! `tests/vectors-extensions/` (same format, see its README), replayed step
//! by step, every expectation checked.
//!
//! The runner is written once against [`Target`]; each way of reaching
//! fusebox (the pure core here, the engine and the gRPC server elsewhere)
//! implements it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use fusebox::domain::{Ask, Decision, Fuse, Notice, PolicySpec, Reason, TicketId, View};
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
    /// A `complete`'s cost (U1); absent = what the ticket took.
    pub cost: Option<u32>,
    pub waiter: Option<String>,
    /// An `acquire`'s attempt (R1): absent, 0 or 1 a first attempt, 2 or
    /// more a retry (extensions only).
    pub attempt: Option<u32>,
    /// An `acquire`'s caller (Q1), sent as `AcquireRequest.caller`, in
    /// process `Ask.caller` (absent: the empty name; over gRPC the peer's
    /// address, the same for every step of a trace).
    pub caller: Option<String>,
    /// A `set_policy`'s new policy for the key (Y4; extensions only).
    pub policy: Option<PolicySpec>,
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
    /// Probe slots held now (H1; extensions only).
    pub probes_held: Option<u32>,
    /// Current probe successes counted in this half-open period (H2;
    /// extensions only).
    pub half_open_successes: Option<u32>,
    /// `KeyState.adaptive_limit`: the adaptive limiter's limit in force, 0
    /// without one (extensions only).
    pub adaptive_limit: Option<u32>,
    /// The key's statistics: retries denied by the retry budget (R2), also
    /// checked against `by_reason` `retry_budget` (extensions only).
    pub retry_denied: Option<u64>,
    /// The key's statistics: requests denied by the permit book, the retry
    /// budget's denials not among them (extensions only).
    pub denied: Option<u64>,
    /// The key's statistics: tickets granted to ordinary requests
    /// (extensions only).
    pub granted: Option<u64>,
    /// Live slow tickets (S2; extensions only).
    pub live_slow: Option<u32>,
    /// The key's statistics: tickets that became slow, live or at
    /// completion, each once (S1, S2; extensions only).
    pub slow: Option<u64>,
    /// On a shadow policy (D1): the decision the request would have had,
    /// `BLOCKED` or `DENIED` (extensions only).
    pub shadow_decision: Option<String>,
    /// On a shadow policy (D1): the reason it would have had.
    pub shadow_reason: Option<String>,
    /// The key's statistics: shadow grants (D2; extensions only).
    pub shadow: Option<u64>,
    /// The key's statistics: requests blocked by the breaker, shadow
    /// grants that would have been blocked among them (extensions only).
    pub blocked: Option<u64>,
    /// A `renew`'s answer: the time left on the ticket, in ms (L2;
    /// extensions only).
    pub lease: Option<u64>,
}

/// A decision as the vectors write it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub decision: String,
    pub reason: Option<String>,
    pub retry_after: Option<u64>,
    pub ticket: bool,
    /// `shadow_decision`, when set (D1).
    pub shadow_decision: Option<String>,
    /// `shadow_reason`, when set (D1).
    pub shadow_reason: Option<String>,
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
    pub probes_held: u32,
    pub half_open_successes: u32,
    /// `KeyState.adaptive_limit`.
    pub adaptive_limit: u32,
    /// `KeyStats.retry_denied`.
    pub retry_denied: u64,
    /// `KeyStats.by_reason` under `retry_budget`.
    pub by_reason_retry_budget: u64,
    /// `KeyStats.denied`.
    pub denied: u64,
    /// `KeyStats.granted`.
    pub granted: u64,
    /// `KeyState.live_slow`.
    pub live_slow: u32,
    /// `KeyStats.slow`.
    pub slow: u64,
    /// `KeyStats.shadow`.
    pub shadow: u64,
    /// `KeyStats.blocked`.
    pub blocked: u64,
}

/// A way of reaching fusebox that the runner can drive.
#[allow(async_fn_in_trait)]
pub trait Target {
    /// Moves the clock forward to `now` (ms from the start).
    async fn advance_to(&mut self, now: u64);
    /// Sends an acquire; a request still waiting answers `QUEUED`. The ticket
    /// or waiter is remembered under `label`.
    async fn acquire(&mut self, step: &Step) -> Answer;
    /// Completes the ticket remembered as `label` with a `cost` (U1):
    /// `Ok(stale)` or `Err(code)`.
    async fn complete(
        &mut self,
        label: &str,
        outcome: &str,
        cost: Option<u32>,
    ) -> Result<bool, String>;
    /// The answer of the waiter remembered as `label`, or `QUEUED`.
    async fn settle(&mut self, label: &str) -> Answer;
    /// Reads a key.
    async fn inspect(&mut self, key: &str) -> Reading;
    /// Isolates a key.
    async fn isolate(&mut self, key: &str);
    /// Closes a key.
    async fn close(&mut self, key: &str);
    /// Puts `policy` in force for the vector's key (its default rule), from
    /// the key's next operation on (Y4).
    async fn set_policy(&mut self, policy: &PolicySpec);
    /// Renews the ticket remembered as `label` (L2): `Ok(time left)` in ms
    /// or `Err(code)`.
    async fn renew(&mut self, label: &str, lease: Option<u64>) -> Result<u64, String>;
}

/// Every vector in `tests/vectors/`, then every one in
/// `tests/vectors-extensions/`, each directory by name.
pub fn load_all() -> Vec<Vector> {
    let mut all = load_dir("tests/vectors", 24);
    all.extend(load_dir("tests/vectors-extensions", 24));
    all
}

/// The vectors of `dir` (under the crate), at least `least` of them.
fn load_dir(dir: &str, least: usize) -> Vec<Vector> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("tests/vectors exists")
        .map(|e| e.expect("readable entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    paths.sort();
    assert!(
        paths.len() >= least,
        "expected at least {least} vectors in {dir:?}"
    );
    paths
        .iter()
        .map(|p| {
            let text = std::fs::read_to_string(p).expect("readable vector");
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{p:?}: {e}"))
        })
        .collect()
}

/// The mismatches found so far, and the step being checked.
struct Checks {
    failures: Vec<String>,
    step: usize,
}

impl Checks {
    /// Records a mismatch when `want` is given and is not `got`.
    fn check<T: PartialEq + std::fmt::Debug>(&mut self, field: &str, want: Option<T>, got: T) {
        if let Some(want) = want {
            if want != got {
                self.failures.push(format!(
                    "step {}: {field}: expected {want:?}, got {got:?}",
                    self.step
                ));
            }
        }
    }
}

/// Replays one vector; returns every mismatch.
pub async fn replay<T: Target>(vector: &Vector, target: &mut T) -> Vec<String> {
    let mut c = Checks {
        failures: Vec::new(),
        step: 0,
    };
    for (i, step) in vector.steps.iter().enumerate() {
        c.step = i;
        target.advance_to(step.at).await;
        let e = &step.expect;
        match step.op.as_str() {
            "acquire" | "settle" => {
                let got = if step.op == "acquire" {
                    target.acquire(step).await
                } else {
                    target
                        .settle(step.waiter.as_deref().expect("settle names a waiter"))
                        .await
                };
                c.check("decision", e.decision.clone(), got.decision);
                c.check("reason", e.reason.clone().map(Some), got.reason);
                c.check("retry_after", e.retry_after.map(Some), got.retry_after);
                c.check("ticket", e.ticket, got.ticket);
                c.check(
                    "shadow_decision",
                    e.shadow_decision.clone().map(Some),
                    got.shadow_decision,
                );
                c.check(
                    "shadow_reason",
                    e.shadow_reason.clone().map(Some),
                    got.shadow_reason,
                );
            }
            "complete" => {
                let label = step.ticket.as_deref().expect("complete names a ticket");
                let outcome = step.outcome.as_deref().expect("complete names an outcome");
                match target.complete(label, outcome, step.cost).await {
                    Ok(stale) => {
                        c.check("error", e.error.clone(), "none".to_owned());
                        c.check("stale", e.stale, stale);
                    }
                    Err(code) => c.check("error", Some(e.error.clone().unwrap_or_default()), code),
                }
            }
            "inspect" => {
                let got = target
                    .inspect(step.key.as_deref().expect("inspect names a key"))
                    .await;
                c.check("phase", e.phase.clone(), got.phase);
                c.check(
                    "consecutive_failures",
                    e.consecutive_failures,
                    got.consecutive_failures,
                );
                c.check(
                    "half_open_attempts",
                    e.half_open_attempts,
                    got.half_open_attempts,
                );
                c.check("open_until", e.open_until.map(Some), got.open_until);
                c.check("free", e.free, got.free);
                c.check("queued", e.queued, got.queued);
                c.check("probes_held", e.probes_held, got.probes_held);
                c.check(
                    "half_open_successes",
                    e.half_open_successes,
                    got.half_open_successes,
                );
                c.check("adaptive_limit", e.adaptive_limit, got.adaptive_limit);
                c.check("retry_denied", e.retry_denied, got.retry_denied);
                c.check(
                    "by_reason retry_budget",
                    e.retry_denied,
                    got.by_reason_retry_budget,
                );
                c.check("denied", e.denied, got.denied);
                c.check("granted", e.granted, got.granted);
                c.check("live_slow", e.live_slow, got.live_slow);
                c.check("slow", e.slow, got.slow);
                c.check("shadow", e.shadow, got.shadow);
                c.check("blocked", e.blocked, got.blocked);
            }
            "isolate" => {
                target
                    .isolate(step.key.as_deref().expect("isolate names a key"))
                    .await
            }
            "close" => {
                target
                    .close(step.key.as_deref().expect("close names a key"))
                    .await
            }
            "set_policy" => {
                target
                    .set_policy(step.policy.as_ref().expect("set_policy names a policy"))
                    .await
            }
            "renew" => {
                let label = step.ticket.as_deref().expect("renew names a ticket");
                match target.renew(label, step.lease).await {
                    Ok(left) => {
                        c.check("error", e.error.clone(), "none".to_owned());
                        c.check("lease", e.lease, left);
                    }
                    Err(code) => c.check("error", Some(e.error.clone().unwrap_or_default()), code),
                }
            }
            other => c.failures.push(format!("step {i}: unknown op {other:?}")),
        }
    }
    c.failures
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
        Decision::Shadow { .. } => ("GRANTED", None, None),
    };
    let shadow = decision.shadow();
    Answer {
        decision: name.to_owned(),
        reason: reason.map(|r: Reason| r.as_str().to_owned()),
        retry_after,
        ticket: decision.grant().is_some(),
        shadow_decision: shadow.map(|(kind, _)| kind.as_str().to_uppercase()),
        shadow_reason: shadow.map(|(_, r)| r.as_str().to_owned()),
    }
}

/// Writes a key's view as the vectors do.
pub fn reading_of(v: &View) -> Reading {
    Reading {
        phase: v.phase.as_str().to_owned(),
        consecutive_failures: v.consecutive_failures,
        half_open_attempts: v.half_open_attempts,
        open_until: v.open_until,
        free: v.free,
        queued: v.queued,
        probes_held: v.probes_held,
        half_open_successes: v.half_open_successes,
        adaptive_limit: v.adaptive_limit,
        retry_denied: v.stats.retry_denied,
        by_reason_retry_budget: v.stats.by_reason[Reason::RetryBudget as usize],
        denied: v.stats.denied,
        granted: v.stats.granted,
        live_slow: v.live_slow,
        slow: v.stats.slow,
        shadow: v.stats.shadow,
        blocked: v.stats.blocked,
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
            retry: step.attempt.unwrap_or(0) >= 2,
            caller: fusebox::domain::CallerId::of(step.caller.as_deref().unwrap_or("")),
            ..Ask::default()
        };
        let decision = self
            .fuse
            .acquire(&ask, id, self.now)
            .expect("acquire is valid");
        self.collect();
        if let Some(label) = &step.label {
            self.labels.insert(label.clone(), id);
        }
        answer_of(&decision)
    }

    async fn complete(
        &mut self,
        label: &str,
        outcome: &str,
        cost: Option<u32>,
    ) -> Result<bool, String> {
        let id = self.labels[label];
        let r = self
            .fuse
            .complete_with_cost(id, outcome_of(outcome), cost, self.now);
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
        reading_of(&self.fuse.view(self.now))
    }

    async fn set_policy(&mut self, policy: &PolicySpec) {
        let policy = policy.validate().expect("the step's policy is valid");
        self.fuse.set_policy(policy, self.now).expect("set_policy");
        self.collect();
    }

    async fn renew(&mut self, label: &str, lease: Option<u64>) -> Result<u64, String> {
        let r = self.fuse.renew(self.labels[label], lease, self.now);
        self.collect();
        r.map_err(|_| "NOT_FOUND".to_owned())
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

// ---------------------------------------------------------------------------
// The engine and the gRPC server as targets.
//
// A request that may wait (`max_wait > 0`) runs in its own task. Whether it
// is still waiting is decided without sleeping: every task still running must
// be a waiter the target counts (`waiters`), since the target cannot count a
// waiter that is not one of ours, and an answered waiter's task finishes on
// its own. So the runner polls until `running tasks == waiters`; then a task
// still running is `QUEUED`, and a finished one has its answer.
// ---------------------------------------------------------------------------

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use fusebox::config::Config;
use fusebox::domain::Outcome;
use fusebox::engine::{AcquireArgs, Engine, EngineError, Rules};
use fusebox::proto::v1 as pb;
use tokio::task::JoinHandle;
use tonic::transport::Channel;

use crate::harness::{millis, ms, Server};
use crate::process::get_key;

/// What a sent acquire came back with: the answer and the ticket's token.
pub type Sent = (Answer, Option<String>);

/// The longest the runner waits for a target to settle: a safety net only,
/// never a synchronisation.
const SETTLE_LIMIT: Duration = Duration::from_secs(20);

/// A token no ticket has: completing it answers `NOT_FOUND`.
pub const UNKNOWN_TICKET: &str = "0123456789abcdef0123456789abcdef";

/// The acquires a target sent, by label: the tickets of those that did not
/// wait, and those that may wait, each in its own task.
#[derive(Default)]
pub struct Waiting {
    running: Vec<(String, JoinHandle<Sent>)>,
    done: HashMap<String, Sent>,
    unlabelled: usize,
    /// The tickets of the requests that did not wait, by label.
    tickets: HashMap<String, Option<String>>,
    /// The key the requests that may wait were sent on.
    key: Option<String>,
}

impl Waiting {
    fn label(&mut self, step: &Step) -> String {
        step.label.clone().unwrap_or_else(|| {
            self.unlabelled += 1;
            format!("#unlabelled-{}", self.unlabelled)
        })
    }

    /// Keeps the ticket of a request that did not wait under its label, and
    /// returns its answer.
    pub fn answered(&mut self, step: &Step, (answer, ticket): Sent) -> Answer {
        if let Some(label) = &step.label {
            self.tickets.insert(label.clone(), ticket);
        }
        answer
    }

    /// Runs `request`, an acquire on `step`'s key that may wait, in its own
    /// task; returns its label.
    pub fn spawn(
        &mut self,
        step: &Step,
        request: impl Future<Output = Sent> + Send + 'static,
    ) -> String {
        self.key = step.key.clone();
        let label = self.label(step);
        self.done.remove(&label);
        self.running.push((label.clone(), tokio::spawn(request)));
        label
    }

    /// The key the requests that may wait were sent on, once one was.
    pub fn key(&self) -> Option<String> {
        self.key.clone()
    }

    /// Collects the answers of the tasks that have finished.
    async fn reap(&mut self) {
        let mut still = Vec::new();
        for (label, handle) in std::mem::take(&mut self.running) {
            if handle.is_finished() {
                let sent = handle
                    .await
                    .unwrap_or_else(|e| panic!("the acquire labelled {label} failed: {e}"));
                self.done.insert(label, sent);
            } else {
                still.push((label, handle));
            }
        }
        self.running = still;
    }

    /// Waits until every task still running is a waiter the target counts.
    pub async fn quiesce<F, Fut>(&mut self, mut waiters: F)
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = usize>,
    {
        let deadline = tokio::time::Instant::now() + SETTLE_LIMIT;
        loop {
            self.reap().await;
            let counted = waiters().await;
            if counted == self.running.len() {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the target did not settle within {SETTLE_LIMIT:?}: {} requests still running ({:?}), {counted} waiters counted",
                self.running.len(),
                self.running.iter().map(|(l, _)| l).collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// The answer of the request that may wait labelled `label`, after
    /// [`Waiting::quiesce`]: `QUEUED` while its task runs.
    pub fn answer(&self, label: &str) -> Answer {
        if self.running.iter().any(|(l, _)| l == label) {
            return answer_of(&Decision::Queued);
        }
        let (answer, _) = self
            .done
            .get(label)
            .unwrap_or_else(|| panic!("no waiting request is labelled {label}"));
        answer.clone()
    }

    /// The token of the ticket of the request labelled `label`, or
    /// [`UNKNOWN_TICKET`] while it waits or when it got none.
    pub fn token(&self, label: &str) -> String {
        let ticket = if self.running.iter().any(|(l, _)| l == label) {
            None
        } else if let Some((_, ticket)) = self.done.get(label) {
            ticket.clone()
        } else {
            self.tickets
                .get(label)
                .cloned()
                .unwrap_or_else(|| panic!("no request is labelled {label}"))
        };
        ticket
            .filter(|t| !t.is_empty())
            .unwrap_or_else(|| UNKNOWN_TICKET.to_owned())
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        for (_, handle) in &self.running {
            handle.abort();
        }
    }
}

pub fn outcome_of(outcome: &str) -> Outcome {
    serde_json::from_value(serde_json::json!(outcome)).expect("an outcome")
}

/// An error where an answer was expected, written so that it fails the check.
pub fn error_answer(what: String) -> Answer {
    Answer {
        decision: format!("error: {what}"),
        reason: None,
        retry_after: None,
        ticket: false,
        shadow_decision: None,
        shadow_reason: None,
    }
}

/// An outcome as the vectors write it, on the wire.
pub fn wire_outcome(outcome: &str) -> pb::Outcome {
    match outcome_of(outcome) {
        Outcome::Success => pb::Outcome::Success,
        Outcome::Failure => pb::Outcome::Failure,
        Outcome::Ignored => pb::Outcome::Ignored,
    }
}

/// The acquire of `step` on the wire.
pub fn wire_acquire(step: &Step) -> pb::AcquireRequest {
    pb::AcquireRequest {
        key: step.key.clone().expect("acquire names a key"),
        permits: step.permits,
        max_wait: step.max_wait.map(ms),
        lease: step.lease.map(ms),
        attempt: step.attempt,
        caller: step.caller.clone().unwrap_or_default(),
    }
}

/// How many requests wait on `key`, as the server behind `admin` counts
/// them.
pub async fn count_waiters(
    mut admin: pb::admin_client::AdminClient<Channel>,
    key: String,
) -> usize {
    get_key(&mut admin, &key).await.waiters as usize
}

/// The engine in process, on a manual clock, with the vector's policy as the
/// default rule.
pub struct EngineTarget {
    engine: Arc<Engine>,
    now: u64,
    waiting: Waiting,
}

impl EngineTarget {
    pub fn new(policy: &PolicySpec) -> Self {
        let policy = policy.validate().expect("the vector's policy is valid");
        let config = Config {
            rules: Rules {
                rules: vec![],
                default: policy,
            },
            ..Config::default()
        };
        EngineTarget {
            engine: Arc::new(Engine::with_manual_clock(config)),
            now: 0,
            waiting: Waiting::default(),
        }
    }

    async fn quiesce(&mut self) {
        let Some(key) = self.waiting.key() else {
            return;
        };
        let engine = self.engine.clone();
        self.waiting
            .quiesce(|| {
                let waiters = engine.get(&key).expect("the key reads").view.waiters;
                async move { waiters }
            })
            .await;
    }
}

fn engine_sent(result: Result<fusebox::engine::AcquireReply, EngineError>) -> Sent {
    match result {
        Ok(reply) => (answer_of(&reply.decision), reply.ticket),
        Err(e) => (error_answer(e.to_string()), None),
    }
}

impl Target for EngineTarget {
    async fn advance_to(&mut self, now: u64) {
        assert!(now >= self.now, "the clock only moves forward");
        if now > self.now {
            let reading = self.engine.advance_clock(now - self.now).await;
            assert_eq!(reading, Some(now), "the manual clock reads the step's time");
            self.now = now;
        }
    }

    async fn acquire(&mut self, step: &Step) -> Answer {
        let args = AcquireArgs {
            caller: step.caller.clone().unwrap_or_default(),
            key: step.key.clone().expect("acquire names a key"),
            permits: step.permits.unwrap_or(1),
            max_wait: step.max_wait.unwrap_or(0),
            lease: step.lease,
            attempt: step.attempt.unwrap_or(0),
        };
        if args.max_wait == 0 {
            let sent = engine_sent(self.engine.acquire(args).await);
            return self.waiting.answered(step, sent);
        }
        let engine = self.engine.clone();
        let label = self
            .waiting
            .spawn(step, async move { engine_sent(engine.acquire(args).await) });
        self.settle(&label).await
    }

    async fn complete(
        &mut self,
        label: &str,
        outcome: &str,
        cost: Option<u32>,
    ) -> Result<bool, String> {
        self.quiesce().await;
        match self
            .engine
            .complete_with_cost(&self.waiting.token(label), outcome_of(outcome), cost)
        {
            Ok(done) => Ok(done.stale),
            Err(EngineError::TicketNotFound) => Err("NOT_FOUND".to_owned()),
            Err(e) => Err(format!("{e:?}")),
        }
    }

    async fn renew(&mut self, label: &str, lease: Option<u64>) -> Result<u64, String> {
        self.quiesce().await;
        match self.engine.renew(&self.waiting.token(label), lease) {
            Ok(left) => Ok(left),
            Err(EngineError::TicketNotFound) => Err("NOT_FOUND".to_owned()),
            Err(e) => Err(format!("{e:?}")),
        }
    }

    async fn settle(&mut self, label: &str) -> Answer {
        self.quiesce().await;
        self.waiting.answer(label)
    }

    async fn inspect(&mut self, key: &str) -> Reading {
        let reading = self.engine.get(key).expect("the key reads");
        assert_eq!(
            reading.now, self.now,
            "the engine's clock reads the step's time"
        );
        reading_of(&reading.view)
    }

    async fn isolate(&mut self, key: &str) {
        self.engine
            .isolate(key, "vector step", "the vector runner")
            .expect("isolate");
    }

    async fn set_policy(&mut self, policy: &PolicySpec) {
        let policy = policy.validate().expect("the step's policy is valid");
        self.engine.set_default(policy).expect("set_default");
    }

    async fn close(&mut self, key: &str) {
        self.engine
            .close(key, "vector step", "the vector runner")
            .expect("close");
    }
}

/// The config file of a server whose default rule is `policy`, written with
/// the `toml` crate (durations as strings with units, such as `"1s"`).
pub fn config_with_default(policy: &PolicySpec) -> String {
    #[derive(serde::Serialize)]
    struct Out<'a> {
        default: &'a PolicySpec,
    }
    #[derive(Deserialize)]
    struct Back {
        default: PolicySpec,
    }
    let text = toml::to_string(&Out { default: policy }).expect("the policy serializes as TOML");
    let back: Back =
        toml::from_str(&text).unwrap_or_else(|e| panic!("the TOML reads back: {e}\n{text}"));
    assert_eq!(
        &back.default, policy,
        "the policy round-trips through TOML:\n{text}"
    );
    let config = Config::parse(&text, "the vector's config")
        .unwrap_or_else(|e| panic!("the config is valid: {e}\n{text}"));
    assert_eq!(
        config.rules.default,
        policy.validate().expect("the vector's policy is valid"),
        "the config's default rule is the vector's policy:\n{text}"
    );
    text
}

/// One server's clients, and the steps every gRPC target takes alike.
pub struct End {
    pub fusebox: pb::fusebox_client::FuseboxClient<Channel>,
    pub admin: pb::admin_client::AdminClient<Channel>,
    clock: pb::clock_client::ClockClient<Channel>,
}

impl End {
    pub async fn of(server: &Server) -> End {
        let channel = server.channel().await;
        End {
            fusebox: pb::fusebox_client::FuseboxClient::new(channel.clone()),
            admin: pb::admin_client::AdminClient::new(channel.clone()),
            clock: pb::clock_client::ClockClient::new(channel),
        }
    }

    /// Moves the server's manual clock from `from` to `to`.
    pub async fn advance(&mut self, from: u64, to: u64) {
        let reading = crate::admin::advance_clock(&mut self.clock, to - from).await;
        assert_eq!(reading, to, "the server's clock reads the step's time");
    }

    /// Reads `key` at `now` as the vectors write it.
    pub async fn reading(&mut self, key: &str, now: u64) -> Reading {
        let s = get_key(&mut self.admin, key).await;
        let stats = s.stats.clone().unwrap_or_default();
        Reading {
            phase: pb::Phase::try_from(s.phase).map_or_else(
                |_| format!("phase {}", s.phase),
                |p| wire_name(p.as_str_name(), "PHASE_"),
            ),
            consecutive_failures: s.consecutive_failures,
            half_open_attempts: s.half_open_attempts,
            open_until: millis(s.open_remaining).map(|left| now + left),
            free: s.free,
            queued: u64::from(s.queued),
            probes_held: s.probes_held,
            half_open_successes: s.half_open_successes,
            adaptive_limit: s.adaptive_limit,
            retry_denied: stats.retry_denied,
            by_reason_retry_budget: stats.by_reason.get("retry_budget").copied().unwrap_or(0),
            denied: stats.denied,
            granted: stats.granted,
            live_slow: s.live_slow,
            slow: stats.slow,
            shadow: stats.shadow,
            blocked: stats.blocked,
        }
    }

    /// Replaces the default rule with `policy` through `Admin.SetPolicy`.
    pub async fn set_default(&mut self, policy: &PolicySpec) {
        let policy = policy.validate().expect("the step's policy is valid");
        let mut wire = fusebox::server::policy::wire_policy(&policy);
        // Written out here, as a client sends it: the retry budget must
        // reach SetPolicy whatever the server's read-back shows.
        wire.retry_budget = policy.retry_budget.map(|r| pb::RetryBudget {
            ratio: r.ratio_millionths as f64 / 1_000_000.0,
            min_per_second: r.min_per_second,
            window: Some(ms(r.window.get())),
        });
        // And the quorum (Q2).
        if let (Some(b), Some(wb)) = (policy.breaker, wire.breaker.as_mut()) {
            wb.quorum = b.quorum.map(std::num::NonZeroU32::get);
        }
        let rule = pb::PolicyRule {
            r#match: String::new(),
            policy: Some(wire),
            default: true,
        };
        crate::admin::set_policy(&mut self.admin, rule)
            .await
            .expect("SetPolicy answers");
    }

    /// Isolates (`isolate`) or closes `key`.
    pub async fn steer(&mut self, key: &str, isolate: bool) {
        crate::harness::steer(&mut self.admin, isolate, None, key, "vector step")
            .await
            .expect("Isolate and Close answer");
    }
}

/// Real servers on manual clocks, driven over gRPC: one server, or several
/// sharing their state in Redis, the steps taking turns between them.
pub struct GrpcTarget {
    // Dropped last: the server processes are killed when the target goes.
    ends: Vec<End>,
    turn: usize,
    now: u64,
    waiting: Waiting,
    _servers: Vec<Server>,
}

impl GrpcTarget {
    pub async fn start(policy: &PolicySpec) -> Self {
        let config = config_with_default(policy);
        let server = Server::manual(Some(&config)).await;
        GrpcTarget::over(vec![server]).await
    }

    /// `count` servers on the store at `store` (a URL for `--store`), each
    /// with the vector's policy as its default rule.
    pub async fn shared(policy: &PolicySpec, store: &str, count: usize) -> Self {
        let config = config_with_default(policy);
        let servers = crate::harness::servers_on(store, &config, true, count).await;
        GrpcTarget::over(servers).await
    }

    async fn over(servers: Vec<Server>) -> Self {
        let mut ends = Vec::with_capacity(servers.len());
        for server in &servers {
            ends.push(End::of(server).await);
        }
        GrpcTarget {
            ends,
            turn: 0,
            now: 0,
            waiting: Waiting::default(),
            _servers: servers,
        }
    }

    /// The server whose turn it is; the next step goes to the next one.
    fn next(&mut self) -> &mut End {
        let at = self.turn % self.ends.len();
        self.turn += 1;
        &mut self.ends[at]
    }

    async fn quiesce(&mut self) {
        let Some(key) = self.waiting.key() else {
            return;
        };
        let admin = self.next().admin.clone();
        self.waiting
            .quiesce(|| count_waiters(admin.clone(), key.clone()))
            .await;
    }
}

/// The vectors' name of a wire enum value: its name without the prefix.
pub fn wire_name(name: &str, prefix: &str) -> String {
    name.strip_prefix(prefix).unwrap_or(name).to_owned()
}

/// Writes a wire reply as the vectors do.
pub fn answer_of_wire(r: &pb::AcquireResponse) -> Answer {
    let decision = pb::Decision::try_from(r.decision).map_or_else(
        |_| format!("decision {}", r.decision),
        |d| wire_name(d.as_str_name(), "DECISION_"),
    );
    let reason = match pb::Reason::try_from(r.reason) {
        Ok(pb::Reason::Unspecified) => None,
        Ok(reason) => Some(wire_name(reason.as_str_name(), "REASON_").to_lowercase()),
        Err(_) => Some(format!("reason {}", r.reason)),
    };
    let shadow_decision = match pb::Decision::try_from(r.shadow_decision) {
        Ok(pb::Decision::Unspecified) => None,
        Ok(d) => Some(wire_name(d.as_str_name(), "DECISION_")),
        Err(_) => Some(format!("decision {}", r.shadow_decision)),
    };
    let shadow_reason = match pb::Reason::try_from(r.shadow_reason) {
        Ok(pb::Reason::Unspecified) => None,
        Ok(reason) => Some(wire_name(reason.as_str_name(), "REASON_").to_lowercase()),
        Err(_) => Some(format!("reason {}", r.shadow_reason)),
    };
    Answer {
        decision,
        reason,
        retry_after: millis(r.retry_after),
        ticket: !r.ticket.is_empty(),
        shadow_decision,
        shadow_reason,
    }
}

fn grpc_sent(result: Result<tonic::Response<pb::AcquireResponse>, tonic::Status>) -> Sent {
    match result {
        Ok(response) => {
            let r = response.into_inner();
            (answer_of_wire(&r), Some(r.ticket))
        }
        Err(status) => (
            error_answer(format!("{:?} {}", status.code(), status.message())),
            None,
        ),
    }
}

/// The SCREAMING_SNAKE_CASE name of a gRPC code, as the vectors write it.
pub fn code_name(code: tonic::Code) -> String {
    let camel = format!("{code:?}");
    let mut out = String::new();
    for (i, c) in camel.chars().enumerate() {
        if c.is_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_uppercase());
    }
    out
}

impl Target for GrpcTarget {
    async fn advance_to(&mut self, now: u64) {
        assert!(now >= self.now, "the clock only moves forward");
        if now > self.now {
            // Every server's clock moves alike.
            for end in &mut self.ends {
                end.advance(self.now, now).await;
            }
            self.now = now;
        }
    }

    async fn acquire(&mut self, step: &Step) -> Answer {
        let request = wire_acquire(step);
        if step.max_wait.unwrap_or(0) == 0 {
            let sent = grpc_sent(self.next().fusebox.acquire(request).await);
            return self.waiting.answered(step, sent);
        }
        let mut client = self.next().fusebox.clone();
        let label = self.waiting.spawn(
            step,
            async move { grpc_sent(client.acquire(request).await) },
        );
        self.settle(&label).await
    }

    async fn complete(
        &mut self,
        label: &str,
        outcome: &str,
        cost: Option<u32>,
    ) -> Result<bool, String> {
        self.quiesce().await;
        let ticket = self.waiting.token(label);
        self.next()
            .fusebox
            .complete(pb::CompleteRequest {
                ticket,
                outcome: wire_outcome(outcome) as i32,
                cost,
            })
            .await
            .map(|r| r.into_inner().stale)
            .map_err(|status| code_name(status.code()))
    }

    async fn renew(&mut self, label: &str, lease: Option<u64>) -> Result<u64, String> {
        self.quiesce().await;
        let ticket = self.waiting.token(label);
        self.next()
            .fusebox
            .renew(pb::RenewRequest {
                ticket,
                lease: lease.map(ms),
            })
            .await
            .map(|r| millis(r.into_inner().lease).unwrap_or(0))
            .map_err(|status| code_name(status.code()))
    }

    async fn settle(&mut self, label: &str) -> Answer {
        self.quiesce().await;
        self.waiting.answer(label)
    }

    async fn inspect(&mut self, key: &str) -> Reading {
        let now = self.now;
        self.next().reading(key, now).await
    }

    async fn isolate(&mut self, key: &str) {
        self.next().steer(key, true).await;
    }

    async fn close(&mut self, key: &str) {
        self.next().steer(key, false).await;
    }

    /// On every server, so that none acts on the old rules meanwhile.
    async fn set_policy(&mut self, policy: &PolicySpec) {
        for end in &mut self.ends {
            end.set_default(policy).await;
        }
    }
}

#[tokio::test]
async fn every_vector_passes_against_the_engine() {
    replay_all(async |v: &Vector| EngineTarget::new(&v.policy)).await;
}

#[tokio::test]
async fn every_vector_passes_over_grpc() {
    replay_all(async |v: &Vector| GrpcTarget::start(&v.policy).await).await;
}

#[test]
fn code_names_are_written_as_the_vectors_write_them() {
    assert_eq!(code_name(tonic::Code::NotFound), "NOT_FOUND");
    assert_eq!(code_name(tonic::Code::InvalidArgument), "INVALID_ARGUMENT");
    assert_eq!(code_name(tonic::Code::Ok), "OK");
}

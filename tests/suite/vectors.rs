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
    assert!(
        paths.len() >= 24,
        "expected the contract's vectors in {dir:?}"
    );
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
                    target
                        .settle(step.waiter.as_deref().expect("settle names a waiter"))
                        .await
                };
                check(
                    &mut failures,
                    i,
                    "decision",
                    e.decision.clone(),
                    got.decision,
                );
                check(
                    &mut failures,
                    i,
                    "reason",
                    e.reason.clone().map(Some),
                    got.reason,
                );
                check(
                    &mut failures,
                    i,
                    "retry_after",
                    e.retry_after.map(Some),
                    got.retry_after,
                );
                check(&mut failures, i, "ticket", e.ticket, got.ticket);
            }
            "complete" => {
                let label = step.ticket.as_deref().expect("complete names a ticket");
                let outcome = step.outcome.as_deref().expect("complete names an outcome");
                match target.complete(label, outcome).await {
                    Ok(stale) => {
                        check(
                            &mut failures,
                            i,
                            "error",
                            e.error.clone(),
                            "none".to_owned(),
                        );
                        check(&mut failures, i, "stale", e.stale, stale);
                    }
                    Err(code) => check(
                        &mut failures,
                        i,
                        "error",
                        Some(e.error.clone().unwrap_or_default()),
                        code,
                    ),
                }
            }
            "inspect" => {
                let got = target
                    .inspect(step.key.as_deref().expect("inspect names a key"))
                    .await;
                check(&mut failures, i, "phase", e.phase.clone(), got.phase);
                check(
                    &mut failures,
                    i,
                    "consecutive_failures",
                    e.consecutive_failures,
                    got.consecutive_failures,
                );
                check(
                    &mut failures,
                    i,
                    "half_open_attempts",
                    e.half_open_attempts,
                    got.half_open_attempts,
                );
                check(
                    &mut failures,
                    i,
                    "open_until",
                    e.open_until.map(Some),
                    got.open_until,
                );
                check(&mut failures, i, "free", e.free, got.free);
                check(&mut failures, i, "queued", e.queued, got.queued);
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

/// What a sent acquire came back with: the answer and the ticket's token.
pub type Sent = (Answer, Option<String>);

/// The longest the runner waits for a target to settle: a safety net only,
/// never a synchronisation.
const SETTLE_LIMIT: Duration = Duration::from_secs(20);

/// A token no ticket has: completing it answers `NOT_FOUND`.
pub const UNKNOWN_TICKET: &str = "0123456789abcdef0123456789abcdef";

/// Acquires that may wait, each in its own task, by label.
#[derive(Default)]
pub struct Waiting {
    running: Vec<(String, JoinHandle<Sent>)>,
    done: HashMap<String, Sent>,
    unlabelled: usize,
}

impl Waiting {
    pub fn label(&mut self, step: &Step) -> String {
        step.label.clone().unwrap_or_else(|| {
            self.unlabelled += 1;
            format!("#unlabelled-{}", self.unlabelled)
        })
    }

    pub fn spawn(&mut self, label: String, request: impl Future<Output = Sent> + Send + 'static) {
        self.done.remove(&label);
        self.running.push((label, tokio::spawn(request)));
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

    /// The answer of `label` after [`Waiting::quiesce`]: `QUEUED` while its
    /// task runs. `None` when no waiting request has that label.
    pub fn answer(&self, label: &str) -> Option<Answer> {
        if self.running.iter().any(|(l, _)| l == label) {
            return Some(answer_of(&Decision::Queued));
        }
        self.done.get(label).map(|(answer, _)| answer.clone())
    }

    /// The ticket of a finished waiting request; `Some(None)` when it is still
    /// waiting or got no ticket; `None` when no waiting request has that label.
    pub fn ticket(&self, label: &str) -> Option<Option<String>> {
        if self.running.iter().any(|(l, _)| l == label) {
            return Some(None);
        }
        self.done.get(label).map(|(_, ticket)| ticket.clone())
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
    }
}

/// The engine in process, on a manual clock, with the vector's policy as the
/// default rule.
pub struct EngineTarget {
    engine: Arc<Engine>,
    now: u64,
    /// The tickets of requests that did not wait, by label.
    tickets: HashMap<String, Option<String>>,
    waiting: Waiting,
    key: Option<String>,
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
            tickets: HashMap::new(),
            waiting: Waiting::default(),
            key: None,
        }
    }

    async fn quiesce(&mut self) {
        let Some(key) = self.key.clone() else {
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

    fn ticket(&self, label: &str) -> Option<String> {
        self.waiting
            .ticket(label)
            .or_else(|| self.tickets.get(label).cloned())
            .unwrap_or_else(|| panic!("no request is labelled {label}"))
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
        let key = step.key.clone().expect("acquire names a key");
        let args = AcquireArgs {
            key: key.clone(),
            permits: step.permits.unwrap_or(1),
            max_wait: step.max_wait.unwrap_or(0),
            lease: step.lease,
        };
        if args.max_wait == 0 {
            let (answer, ticket) = engine_sent(self.engine.acquire(args).await);
            if let Some(label) = &step.label {
                self.tickets.insert(label.clone(), ticket);
            }
            return answer;
        }
        self.key = Some(key);
        let label = self.waiting.label(step);
        let engine = self.engine.clone();
        self.waiting.spawn(label.clone(), async move {
            engine_sent(engine.acquire(args).await)
        });
        self.quiesce().await;
        self.waiting.answer(&label).expect("the request is known")
    }

    async fn complete(&mut self, label: &str, outcome: &str) -> Result<bool, String> {
        self.quiesce().await;
        let token = self
            .ticket(label)
            .unwrap_or_else(|| UNKNOWN_TICKET.to_owned());
        match self.engine.complete(&token, outcome_of(outcome)) {
            Ok(done) => Ok(done.stale),
            Err(EngineError::TicketNotFound) => Err("NOT_FOUND".to_owned()),
            Err(e) => Err(format!("{e:?}")),
        }
    }

    async fn settle(&mut self, label: &str) -> Answer {
        self.quiesce().await;
        self.waiting
            .answer(label)
            .unwrap_or_else(|| panic!("no waiting request is labelled {label}"))
    }

    async fn inspect(&mut self, key: &str) -> Reading {
        let reading = self.engine.get(key).expect("the key reads");
        assert_eq!(
            reading.now, self.now,
            "the engine's clock reads the step's time"
        );
        let v = reading.view;
        Reading {
            phase: v.phase.as_str().to_owned(),
            consecutive_failures: v.consecutive_failures,
            half_open_attempts: v.half_open_attempts,
            open_until: v.open_until,
            free: v.free,
            queued: v.queued,
        }
    }

    async fn isolate(&mut self, key: &str) {
        self.engine
            .isolate(key, "vector step", "the vector runner")
            .expect("isolate");
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
        let reading = self
            .clock
            .advance(pb::AdvanceRequest {
                by: Some(ms(to - from)),
            })
            .await
            .expect("Clock.Advance answers")
            .into_inner();
        assert_eq!(
            millis(reading.now),
            Some(to),
            "the server's clock reads the step's time"
        );
    }

    /// Reads `key` at `now` as the vectors write it.
    pub async fn reading(&mut self, key: &str, now: u64) -> Reading {
        let s = self
            .admin
            .get_key(pb::GetKeyRequest { key: key.into() })
            .await
            .expect("GetKey answers")
            .into_inner();
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
        }
    }

    /// Isolates (`isolate`) or closes `key`.
    pub async fn steer(&mut self, key: &str, isolate: bool) {
        let reason = "vector step".to_owned();
        if isolate {
            let request = pb::IsolateRequest {
                key: key.into(),
                reason,
            };
            self.admin.isolate(request).await.expect("Isolate answers");
        } else {
            let request = pb::CloseRequest {
                key: key.into(),
                reason,
            };
            self.admin.close(request).await.expect("Close answers");
        }
    }
}

/// Real servers on manual clocks, driven over gRPC: one server, or several
/// sharing their state in Redis, the steps taking turns between them.
pub struct GrpcTarget {
    // Dropped last: the server processes are killed when the target goes.
    ends: Vec<End>,
    turn: usize,
    now: u64,
    tickets: HashMap<String, String>,
    waiting: Waiting,
    key: Option<String>,
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
            tickets: HashMap::new(),
            waiting: Waiting::default(),
            key: None,
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
        let Some(key) = self.key.clone() else {
            return;
        };
        let admin = self.next().admin.clone();
        self.waiting
            .quiesce(|| {
                let mut admin = admin.clone();
                let key = key.clone();
                async move {
                    admin
                        .get_key(pb::GetKeyRequest { key })
                        .await
                        .expect("GetKey answers")
                        .into_inner()
                        .waiters as usize
                }
            })
            .await;
    }

    fn ticket(&self, label: &str) -> Option<String> {
        self.waiting
            .ticket(label)
            .or_else(|| self.tickets.get(label).map(|t| Some(t.clone())))
            .unwrap_or_else(|| panic!("no request is labelled {label}"))
            .filter(|t| !t.is_empty())
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
    Answer {
        decision,
        reason,
        retry_after: millis(r.retry_after),
        ticket: !r.ticket.is_empty(),
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
        let key = step.key.clone().expect("acquire names a key");
        let request = pb::AcquireRequest {
            key: key.clone(),
            permits: step.permits,
            max_wait: step.max_wait.map(ms),
            lease: step.lease.map(ms),
        };
        if step.max_wait.unwrap_or(0) == 0 {
            let (answer, ticket) = grpc_sent(self.next().fusebox.acquire(request).await);
            if let Some(label) = &step.label {
                self.tickets
                    .insert(label.clone(), ticket.unwrap_or_default());
            }
            return answer;
        }
        self.key = Some(key);
        let label = self.waiting.label(step);
        let mut client = self.next().fusebox.clone();
        self.waiting.spawn(label.clone(), async move {
            grpc_sent(client.acquire(request).await)
        });
        self.quiesce().await;
        self.waiting.answer(&label).expect("the request is known")
    }

    async fn complete(&mut self, label: &str, outcome: &str) -> Result<bool, String> {
        self.quiesce().await;
        let ticket = self
            .ticket(label)
            .unwrap_or_else(|| UNKNOWN_TICKET.to_owned());
        let outcome = match outcome_of(outcome) {
            Outcome::Success => pb::Outcome::Success,
            Outcome::Failure => pb::Outcome::Failure,
            Outcome::Ignored => pb::Outcome::Ignored,
        };
        self.next()
            .fusebox
            .complete(pb::CompleteRequest {
                ticket,
                outcome: outcome as i32,
            })
            .await
            .map(|r| r.into_inner().stale)
            .map_err(|status| code_name(status.code()))
    }

    async fn settle(&mut self, label: &str) -> Answer {
        self.quiesce().await;
        self.waiting
            .answer(label)
            .unwrap_or_else(|| panic!("no waiting request is labelled {label}"))
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

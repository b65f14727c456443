//! Many decisions per request: the `Fusebox.Decide` stream and the batched
//! unary calls `AcquireBatch` / `CompleteBatch`, against real servers.
//!
//! Every frame must behave exactly as the unary call it carries: the vectors
//! are replayed with every acquire and complete sent as frames of one stream,
//! a fleet asks for the probe over 16 streams, and the limits, errors,
//! waiting, cancelling and per-key order of frames are checked one by one.
//!
//! Servers run on the manual clock, so no `max_wait` ends unless a test
//! advances it. Nothing sleeps to synchronise: conditions reached
//! asynchronously are polled (`GetKey`) with a deadline.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fusebox::proto::v1 as pb;
use pb::decide_frame::Request as Frame;
use pb::decide_result::Result as Res;
use tokio::sync::{mpsc, oneshot, Barrier};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::{Code, Status};

use crate::admin::complete;
use crate::harness::{eventually, ms, Server};
use crate::vectors::{
    answer_of_wire, code_name, config_with_default, count_waiters, error_answer, replay_all,
    wire_acquire, wire_outcome, Answer, Sent, Step, Target, Vector, Waiting, UNKNOWN_TICKET,
};

type Client = pb::fusebox_client::FuseboxClient<Channel>;
type Admin = pb::admin_client::AdminClient<Channel>;

/// Safety net for conditions reached asynchronously.
const LIMIT: Duration = Duration::from_secs(20);
/// Long enough never to end: the clock is manual and not advanced past it.
const FOREVER_MS: u64 = 3_600_000;

// ---------------------------------------------------------------------------
// A Decide stream as a test drives it.
// ---------------------------------------------------------------------------

/// Where the answers of a stream go.
struct Routes {
    /// The frames whose answer someone waits for, by id.
    pending: HashMap<u64, oneshot::Sender<pb::DecideResult>>,
    /// Answers no one registered for (frames sent raw, or a second answer
    /// to an id), in the order they came.
    stray: mpsc::UnboundedSender<pb::DecideResult>,
}

/// One open `Decide` stream: frames go out by message, answers come back
/// by frame id.
struct Decider {
    tx: Option<mpsc::Sender<pb::DecideRequest>>,
    routes: Arc<Mutex<Routes>>,
    stray: mpsc::UnboundedReceiver<pb::DecideResult>,
    /// Reads the answers; ends with the stream (`Err` when it failed).
    reader: tokio::task::JoinHandle<Result<(), Status>>,
}

impl Drop for Decider {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl Decider {
    /// Opens a stream on `client`'s connection; the error the call failed
    /// with, if it did.
    async fn open(client: &Client) -> Result<Decider, Status> {
        let (tx, rx) = mpsc::channel(64);
        let mut answers = client
            .clone()
            .decide(ReceiverStream::new(rx))
            .await?
            .into_inner();
        let (stray_tx, stray) = mpsc::unbounded_channel();
        let routes = Arc::new(Mutex::new(Routes {
            pending: HashMap::new(),
            stray: stray_tx,
        }));
        let to = routes.clone();
        let reader = tokio::spawn(async move {
            while let Some(message) = answers.message().await? {
                let mut routes = to.lock().expect("routes lock");
                for result in message.results {
                    match routes.pending.remove(&result.id) {
                        Some(waiting) => {
                            let _ = waiting.send(result);
                        }
                        None => {
                            let _ = routes.stray.send(result);
                        }
                    }
                }
            }
            Ok(())
        });
        Ok(Decider {
            tx: Some(tx),
            routes,
            stray,
            reader,
        })
    }

    /// Sends `frames` as one message, unregistered: their answers come as
    /// strays.
    async fn send_raw(&self, frames: Vec<pb::DecideFrame>) {
        self.tx
            .as_ref()
            .expect("the request side is open")
            .send(pb::DecideRequest { frames })
            .await
            .expect("the stream takes the message");
    }

    /// Sends `frames` (distinct ids) as one message; the receivers of their
    /// answers, in the frames' order. A Cancel frame gets no receiver of its
    /// own: its answer is the answer of the waiting Acquire it names.
    async fn send(&self, frames: Vec<pb::DecideFrame>) -> Vec<oneshot::Receiver<pb::DecideResult>> {
        let mut answers = Vec::with_capacity(frames.len());
        {
            let mut routes = self.routes.lock().expect("routes lock");
            for frame in &frames {
                if matches!(frame.request, Some(Frame::Cancel(_))) {
                    continue;
                }
                let (tx, rx) = oneshot::channel();
                assert!(
                    routes.pending.insert(frame.id, tx).is_none(),
                    "id {} is already waiting for an answer",
                    frame.id
                );
                answers.push(rx);
            }
        }
        self.send_raw(frames).await;
        answers
    }

    /// Sends one frame (not a Cancel): the receiver of its answer.
    async fn send_one(&self, frame: pb::DecideFrame) -> oneshot::Receiver<pb::DecideResult> {
        self.send(vec![frame]).await.pop().expect("one receiver")
    }

    /// Sends one frame and waits for its answer.
    async fn ask(&self, frame: pb::DecideFrame) -> pb::DecideResult {
        answered(self.send_one(frame).await).await
    }

    /// The next stray answer.
    async fn next_stray(&mut self) -> pb::DecideResult {
        tokio::time::timeout(LIMIT, self.stray.recv())
            .await
            .expect("a stray answer comes")
            .expect("the reader is alive")
    }

    /// Checks that no answer came that no one asked for.
    fn no_strays(&mut self) {
        if let Ok(extra) = self.stray.try_recv() {
            panic!("an answer no frame was waiting for: {extra:?}");
        }
    }

    /// Closes the request side (the caller sends no more frames).
    fn close_requests(&mut self) {
        self.tx = None;
    }
}

/// The answer behind `rx`, within [`LIMIT`].
async fn answered(rx: oneshot::Receiver<pb::DecideResult>) -> pb::DecideResult {
    tokio::time::timeout(LIMIT, rx)
        .await
        .expect("the frame is answered in time")
        .expect("the stream answers before it ends")
}

fn acquire_request(key: &str, max_wait_ms: u64) -> pb::AcquireRequest {
    pb::AcquireRequest {
        key: key.into(),
        permits: None,
        max_wait: (max_wait_ms > 0).then(|| ms(max_wait_ms)),
        lease: None,
        ..Default::default()
    }
}

fn acquire_frame(id: u64, request: pb::AcquireRequest) -> pb::DecideFrame {
    pb::DecideFrame {
        id,
        request: Some(Frame::Acquire(request)),
    }
}

fn complete_frame(id: u64, ticket: &str, outcome: pb::Outcome) -> pb::DecideFrame {
    pb::DecideFrame {
        id,
        request: Some(Frame::Complete(pb::CompleteRequest {
            ticket: ticket.into(),
            outcome: outcome as i32,
            cost: None,
        })),
    }
}

fn cancel_frame(id: u64) -> pb::DecideFrame {
    pb::DecideFrame {
        id,
        request: Some(Frame::Cancel(pb::CancelRequest {})),
    }
}

/// A SUCCESS for each of `tickets`, as batch items.
fn successes(tickets: &[String]) -> Vec<pb::CompleteRequest> {
    tickets
        .iter()
        .map(|t| pb::CompleteRequest {
            ticket: t.clone(),
            outcome: pb::Outcome::Success as i32,
            cost: None,
        })
        .collect()
}

/// The acquire answer of `result`, or a panic saying what came instead.
fn acquired(result: &pb::DecideResult) -> &pb::AcquireResponse {
    match &result.result {
        Some(Res::Acquire(a)) => a,
        other => panic!(
            "frame {}: expected an acquire answer, got {other:?}",
            result.id
        ),
    }
}

/// The complete answer of `result`.
fn completed(result: &pb::DecideResult) -> &pb::CompleteResponse {
    match &result.result {
        Some(Res::Complete(c)) => c,
        other => panic!(
            "frame {}: expected a complete answer, got {other:?}",
            result.id
        ),
    }
}

/// The error answer of `result`.
fn error_of(result: &pb::DecideResult) -> (Code, &str) {
    match &result.result {
        Some(Res::Error(e)) => (Code::from(e.code), e.message.as_str()),
        other => panic!(
            "frame {}: expected an error answer, got {other:?}",
            result.id
        ),
    }
}

fn is(decision: i32, want: pb::Decision) -> bool {
    decision == want as i32
}

async fn waiters(admin: &Admin, key: &str) -> pb::KeyState {
    crate::process::get_key(&mut admin.clone(), key).await
}

/// Polls `key` until it has `count` waiters.
async fn until_waiters(admin: &Admin, key: &str, count: u32) -> pb::KeyState {
    let what = format!("{key} to have {count} waiters");
    eventually(&what, LIMIT, || async {
        let state = waiters(admin, key).await;
        (state.waiters == count).then_some(state)
    })
    .await
}

// ---------------------------------------------------------------------------
// 1. Every vector through one stream.
// ---------------------------------------------------------------------------

/// A manual-clock server whose acquires and completes all go as frames of
/// one `Decide` stream; inspect, isolate, close and advance go as unary
/// Admin and Clock calls.
struct DecideTarget {
    // Dropped first: the stream ends before the server is killed.
    stream: Decider,
    next_id: u64,
    /// The unary side: reads, isolate, close, the clock.
    unary: crate::vectors::End,
    now: u64,
    waiting: Waiting,
    _server: Server,
}

/// What an acquire frame came back with, as the runner writes it.
fn sent_of(result: Result<pb::DecideResult, String>) -> Sent {
    match result.map(|r| r.result) {
        Ok(Some(Res::Acquire(r))) => (answer_of_wire(&r), Some(r.ticket)),
        Ok(Some(Res::Error(e))) => (
            error_answer(format!("{:?} {}", Code::from(e.code), e.message)),
            None,
        ),
        Ok(other) => (
            error_answer(format!("not an acquire answer: {other:?}")),
            None,
        ),
        Err(why) => (error_answer(why), None),
    }
}

impl DecideTarget {
    async fn start(policy: &crate::vectors::Vector) -> DecideTarget {
        let config = config_with_default(&policy.policy);
        let server = Server::manual(Some(&config)).await;
        DecideTarget::over(server).await
    }

    /// One manual-clock server on the store at `store` (`--store`).
    async fn on_store(policy: &crate::vectors::Vector, store: &str) -> DecideTarget {
        let config = config_with_default(&policy.policy);
        let mut servers = crate::harness::servers_on(store, &config, true, 1).await;
        DecideTarget::over(servers.remove(0)).await
    }

    async fn over(server: Server) -> DecideTarget {
        let unary = crate::vectors::End::of(&server).await;
        let stream = Decider::open(&unary.fusebox).await.expect("Decide opens");
        DecideTarget {
            stream,
            next_id: 1,
            unary,
            now: 0,
            waiting: Waiting::default(),
            _server: server,
        }
    }

    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    async fn quiesce(&mut self) {
        let Some(key) = self.waiting.key() else {
            return;
        };
        let admin = self.unary.admin.clone();
        self.waiting
            .quiesce(|| count_waiters(admin.clone(), key.clone()))
            .await;
    }
}

impl Target for DecideTarget {
    async fn advance_to(&mut self, now: u64) {
        assert!(now >= self.now, "the clock only moves forward");
        if now > self.now {
            self.unary.advance(self.now, now).await;
            self.now = now;
        }
    }

    async fn acquire(&mut self, step: &Step) -> Answer {
        let id = self.id();
        let rx = self
            .stream
            .send_one(acquire_frame(id, wire_acquire(step)))
            .await;
        if step.max_wait.unwrap_or(0) == 0 {
            return self.waiting.answered(step, sent_of(Ok(answered(rx).await)));
        }
        let label = self.waiting.spawn(step, async move {
            sent_of(
                rx.await
                    .map_err(|_| "the stream ended unanswered".to_owned()),
            )
        });
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
        let id = self.id();
        let mut frame = complete_frame(id, &ticket, wire_outcome(outcome));
        if let Some(Frame::Complete(c)) = frame.request.as_mut() {
            c.cost = cost;
        }
        match self.stream.ask(frame).await.result {
            Some(Res::Complete(c)) => Ok(c.stale),
            Some(Res::Error(e)) => Err(code_name(Code::from(e.code))),
            other => Err(format!("not a complete answer: {other:?}")),
        }
    }

    async fn settle(&mut self, label: &str) -> Answer {
        self.quiesce().await;
        self.waiting.answer(label)
    }

    async fn inspect(&mut self, key: &str) -> crate::vectors::Reading {
        self.unary.reading(key, self.now).await
    }

    async fn isolate(&mut self, key: &str) {
        self.unary.steer(key, true).await;
    }

    async fn close(&mut self, key: &str) {
        self.unary.steer(key, false).await;
    }

    async fn set_policy(&mut self, policy: &fusebox::domain::PolicySpec) {
        self.unary.set_default(policy).await;
    }

    async fn renew(&mut self, label: &str, lease: Option<u64>) -> Result<u64, String> {
        self.quiesce().await;
        let ticket = self.waiting.token(label);
        let id = self.id();
        let frame = pb::DecideFrame {
            id,
            request: Some(Frame::Renew(pb::RenewRequest {
                ticket,
                lease: lease.map(crate::harness::ms),
            })),
        };
        match self.stream.ask(frame).await.result {
            Some(Res::Renew(r)) => Ok(crate::harness::millis(r.lease).unwrap_or(0)),
            Some(Res::Error(e)) => Err(code_name(Code::from(e.code))),
            other => Err(format!("not a renew answer: {other:?}")),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_vector_passes_through_one_decide_stream() {
    replay_all(async |v: &Vector| DecideTarget::start(v).await).await;
}

/// With state in Redis: every frame of a message goes to Redis together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_vector_passes_through_one_decide_stream_with_a_store() {
    let Some(redis) =
        crate::harness::standalone("every_vector_passes_through_one_decide_stream_with_a_store")
            .await
    else {
        return;
    };
    let port = redis.server.port;
    let store = format!("redis://127.0.0.1:{port}");
    replay_all(async |v: &Vector| {
        crate::store::flush(&[port]);
        DecideTarget::on_store(v, &store).await
    })
    .await;
}

// ---------------------------------------------------------------------------
// 2. The fleet over 16 streams.
// ---------------------------------------------------------------------------

const FLEET_KEY: &str = "fleet/payments";
const FLEET_STREAMS: usize = 16;
const FLEET_FRAMES: usize = 25;
const FLEET_ROUNDS: u32 = 50;

/// Each stream sends its 25 Acquire frames as one message, all streams
/// released together; every answer of the round.
async fn fleet_burst(streams: &[Arc<Decider>], round: u32) -> Vec<pb::AcquireResponse> {
    let barrier = Arc::new(Barrier::new(streams.len()));
    let tasks: Vec<_> = streams
        .iter()
        .map(|stream| {
            let stream = stream.clone();
            let barrier = barrier.clone();
            tokio::spawn(async move {
                let frames = (0..FLEET_FRAMES as u64)
                    .map(|i| {
                        acquire_frame(u64::from(round) * 1000 + i, acquire_request(FLEET_KEY, 0))
                    })
                    .collect();
                barrier.wait().await;
                let mut answers = Vec::with_capacity(FLEET_FRAMES);
                for rx in stream.send(frames).await {
                    answers.push(acquired(&answered(rx).await).clone());
                }
                answers
            })
        })
        .collect();
    let mut answers = Vec::with_capacity(FLEET_STREAMS * FLEET_FRAMES);
    for task in tasks {
        answers.extend(task.await.expect("a stream's burst"));
    }
    answers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_probe_for_a_fleet_over_16_decide_streams() {
    let server = Server::manual(Some(crate::fleet::ONE_SECOND_BREAKS)).await;
    // Each stream on its own connection.
    let mut streams = Vec::with_capacity(FLEET_STREAMS);
    for _ in 0..FLEET_STREAMS {
        streams.push(Arc::new(
            Decider::open(&server.fusebox().await)
                .await
                .expect("Decide opens"),
        ));
    }
    let control = Decider::open(&server.fusebox().await)
        .await
        .expect("Decide opens");
    let mut clock = server.clock().await;

    // Trip the key: one failure opens it.
    let first = control
        .ask(acquire_frame(1, acquire_request(FLEET_KEY, 0)))
        .await;
    let first = acquired(&first).clone();
    assert!(is(first.decision, pb::Decision::Granted), "{first:?}");
    let done = control
        .ask(complete_frame(2, &first.ticket, pb::Outcome::Failure))
        .await;
    assert_eq!(completed(&done).phase, pb::Phase::Open as i32, "{done:?}");

    for round in 1..=FLEET_ROUNDS {
        crate::fleet::end_the_break(&server, &mut clock, round).await;
        let answers = fleet_burst(&streams, round).await;
        assert_eq!(answers.len(), FLEET_STREAMS * FLEET_FRAMES);
        // Time stands still: the slot is held for probe_lease (= break).
        let probe = crate::fleet::one_probe(round, &answers, |retry| retry == 1000);
        crate::fleet::check_half_open(&server, round).await;
        let done = control
            .ask(complete_frame(
                u64::from(round) * 1000 + 999,
                &probe,
                pb::Outcome::Failure,
            ))
            .await;
        crate::fleet::probe_failed(round, completed(&done));
    }
    for stream in &mut streams {
        Arc::get_mut(stream).expect("no burst holds it").no_strays();
    }
}

// ---------------------------------------------------------------------------
// 3. Limits and errors.
// ---------------------------------------------------------------------------

const LIMITS_CONFIG: &str = r#"
[[rule]]
match = "many/*"
limiter = { kind = "concurrency", permits = 5000 }

[[rule]]
match = "wait/*"
limiter = { kind = "concurrency", permits = 1, queue_limit = 10 }

[[rule]]
match = "order/*"
limiter = { kind = "concurrency", permits = 1 }

[[rule]]
match = "batch/*"
limiter = { kind = "concurrency", permits = 3 }
"#;

#[tokio::test]
async fn a_message_past_1000_frames_answers_the_rest_resource_exhausted() {
    let (_server, admin, stream) = limits_server().await;
    let key = "many/a";
    let frames: Vec<_> = (1..=1001)
        .map(|id| acquire_frame(id, acquire_request(key, 0)))
        .collect();
    let mut answers = Vec::new();
    for rx in stream.send(frames).await {
        answers.push(answered(rx).await);
    }
    for a in &answers[..1000] {
        let r = acquired(a);
        assert!(
            is(r.decision, pb::Decision::Granted) && !r.ticket.is_empty(),
            "{a:?}"
        );
    }
    let (code, message) = error_of(&answers[1000]);
    assert_eq!(code, Code::ResourceExhausted, "{message}");
    assert_eq!(answers[1000].id, 1001);
    // The frame past the limit changed nothing.
    let state = waiters(&admin, key).await;
    assert_eq!(state.live_tickets, 1000, "{state:?}");
    assert_eq!(state.free, 4000, "{state:?}");
    // The stream goes on: the next message is served.
    let next = stream
        .ask(acquire_frame(2000, acquire_request(key, 0)))
        .await;
    assert!(
        is(acquired(&next).decision, pb::Decision::Granted),
        "{next:?}"
    );
    assert_eq!(waiters(&admin, key).await.live_tickets, 1001);
}

#[tokio::test]
async fn frames_fail_as_the_unary_calls_do() {
    let server = Server::manual(Some(LIMITS_CONFIG)).await;
    let mut unary = server.fusebox().await;
    let admin = server.admin().await;
    let mut stream = Decider::open(&server.fusebox().await)
        .await
        .expect("Decide opens");

    // A frame with no request.
    let empty = stream
        .ask(pb::DecideFrame {
            id: 1,
            request: None,
        })
        .await;
    let (code, message) = error_of(&empty);
    assert_eq!(code, Code::InvalidArgument, "{message}");
    assert!(message.contains("request"), "names the field: {message}");

    // An unknown ticket: NOT_FOUND with the unary call's message.
    let unknown = stream
        .ask(complete_frame(2, UNKNOWN_TICKET, pb::Outcome::Success))
        .await;
    let (code, message) = error_of(&unknown);
    let status = crate::admin::complete_not_found(&mut unary, UNKNOWN_TICKET).await;
    assert_eq!(code, Code::NotFound, "{message}");
    assert_eq!(status.code(), Code::NotFound);
    assert_eq!(message, status.message(), "the unary call's message");

    // OUTCOME_UNSPECIFIED on a live ticket: INVALID_ARGUMENT, the ticket stays live.
    let granted = stream
        .ask(acquire_frame(3, acquire_request("many/b", 0)))
        .await;
    let ticket = acquired(&granted).ticket.clone();
    let unspecified = stream
        .ask(complete_frame(4, &ticket, pb::Outcome::Unspecified))
        .await;
    let (code, message) = error_of(&unspecified);
    assert_eq!(code, Code::InvalidArgument, "{message}");
    assert!(message.contains("outcome"), "names the field: {message}");
    assert_eq!(waiters(&admin, "many/b").await.live_tickets, 1);

    // Bad keys: INVALID_ARGUMENT naming `key`, as the unary call says it,
    // and nothing is made.
    let long = "k".repeat(257);
    for (i, key) in ["", "bad\u{7}key", long.as_str()].into_iter().enumerate() {
        let bad = stream
            .ask(acquire_frame(10 + i as u64, acquire_request(key, 0)))
            .await;
        let (code, message) = error_of(&bad);
        let status = unary
            .acquire(acquire_request(key, 0))
            .await
            .expect_err("a bad key fails");
        assert_eq!(code, Code::InvalidArgument, "{key:?}: {message}");
        assert!(
            message.contains("key"),
            "{key:?}: names the field: {message}"
        );
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(
            message,
            status.message(),
            "{key:?}: the unary call's message"
        );
    }
    stream.no_strays();
}

#[tokio::test]
async fn a_duplicate_id_of_a_waiting_acquire_is_refused() {
    let (_server, admin, mut stream) = limits_server().await;
    let key = "wait/dup";
    let holder = stream.ask(acquire_frame(1, acquire_request(key, 0))).await;
    let holder = acquired(&holder).ticket.clone();
    // Sent raw: both answers to id 7 come as strays, in the order they come.
    stream
        .send_raw(vec![acquire_frame(7, acquire_request(key, FOREVER_MS))])
        .await;
    until_waiters(&admin, key, 1).await;
    stream
        .send_raw(vec![acquire_frame(7, acquire_request(key, FOREVER_MS))])
        .await;
    let duplicate = stream.next_stray().await;
    assert_eq!(duplicate.id, 7);
    let (code, message) = error_of(&duplicate);
    assert_eq!(code, Code::InvalidArgument, "{message}");
    assert!(message.contains("id"), "names the field: {message}");
    // A duplicate Complete frame is refused too, and does not complete.
    stream
        .send_raw(vec![complete_frame(7, &holder, pb::Outcome::Success)])
        .await;
    let duplicate = stream.next_stray().await;
    assert_eq!(
        error_of(&duplicate).0,
        Code::InvalidArgument,
        "{duplicate:?}"
    );
    // Nothing changed: one waiter, the holder still live.
    let state = waiters(&admin, key).await;
    assert_eq!((state.waiters, state.live_tickets), (1, 1), "{state:?}");
    // The first waiter is still there and is served when the holder leaves.
    let done = stream
        .ask(complete_frame(2, &holder, pb::Outcome::Success))
        .await;
    assert!(!completed(&done).stale);
    let served = stream.next_stray().await;
    assert_eq!(served.id, 7);
    assert!(
        is(acquired(&served).decision, pb::Decision::Granted),
        "{served:?}"
    );
    stream.no_strays();
}

#[tokio::test]
async fn the_17th_stream_on_a_connection_is_refused() {
    let server = Server::manual(Some(LIMITS_CONFIG)).await;
    let client = server.fusebox().await; // One channel: one HTTP/2 connection.
    let mut open = Vec::new();
    for i in 0..16 {
        let stream = Decider::open(&client)
            .await
            .unwrap_or_else(|e| panic!("stream {} opens: {e:?}", i + 1));
        // Each one is live: it answers a frame.
        let a = stream
            .ask(acquire_frame(1, acquire_request("many/streams", 0)))
            .await;
        assert!(is(acquired(&a).decision, pb::Decision::Granted), "{a:?}");
        open.push(stream);
    }
    let refused = match Decider::open(&client).await {
        Err(status) => status,
        Ok(stream) => {
            // The call opened: its first answer must be the error.
            stream
                .send_raw(vec![acquire_frame(1, acquire_request("many/streams", 0))])
                .await;
            let mut stream = stream;
            match tokio::time::timeout(LIMIT, stream.stray.recv()).await {
                Ok(Some(answer)) => panic!("the 17th stream answered a frame: {answer:?}"),
                _ => match (&mut stream.reader).await {
                    Ok(Err(status)) => status,
                    other => panic!("the 17th stream did not fail: {other:?}"),
                },
            }
        }
    };
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    // Another connection is not limited by this one.
    let other = Decider::open(&server.fusebox().await)
        .await
        .expect("a stream on another connection opens");
    let a = other
        .ask(acquire_frame(1, acquire_request("many/streams", 0)))
        .await;
    assert!(is(acquired(&a).decision, pb::Decision::Granted), "{a:?}");
    // Once one of the 16 ends, the connection may open another.
    drop(open.pop());
    eventually("a stream to open after one ended", LIMIT, || async {
        Decider::open(&client).await.ok()
    })
    .await;
}

// ---------------------------------------------------------------------------
// 4. Waiting and cancel.
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_waiting_frame_holds_nothing_up_and_cancel_withdraws_it() {
    let (_server, admin, mut stream) = limits_server().await;
    let key = "wait/k";

    let holder = stream.ask(acquire_frame(1, acquire_request(key, 0))).await;
    let holder = acquired(&holder).clone();
    assert!(is(holder.decision, pb::Decision::Granted), "{holder:?}");

    // Frame 2 waits...
    let mut first_waiter = stream
        .send_one(acquire_frame(2, acquire_request(key, FOREVER_MS)))
        .await;
    until_waiters(&admin, key, 1).await;
    // ...while later frames of the same stream are answered, on this key
    // and on another.
    let later = stream
        .send(vec![
            acquire_frame(3, acquire_request("many/other", 0)),
            acquire_frame(
                4,
                pb::AcquireRequest {
                    permits: Some(0),
                    ..acquire_request(key, 0)
                },
            ),
        ])
        .await;
    let mut later_answers = Vec::new();
    for rx in later {
        later_answers.push(answered(rx).await);
    }
    assert!(is(
        acquired(&later_answers[0]).decision,
        pb::Decision::Granted
    ));
    let status = acquired(&later_answers[1]);
    assert!(
        is(status.decision, pb::Decision::Denied) && status.reason == pb::Reason::NoPermits as i32,
        "a status check on a full key: {status:?}"
    );
    assert!(
        matches!(
            first_waiter.try_recv(),
            Err(oneshot::error::TryRecvError::Empty)
        ),
        "frame 2 still waits"
    );

    // A second waiter; then frame 2 is cancelled.
    let second_waiter = stream
        .send_one(acquire_frame(5, acquire_request(key, FOREVER_MS)))
        .await;
    until_waiters(&admin, key, 2).await;
    // The Cancel frame carries the waiter's id: its answer is frame 2's.
    stream.send_raw(vec![cancel_frame(2)]).await;
    let cancelled = answered(first_waiter).await;
    assert_eq!(cancelled.id, 2);
    let (code, message) = error_of(&cancelled);
    assert_eq!(code, Code::Cancelled, "{message}");
    let state = until_waiters(&admin, key, 1).await;
    assert_eq!(state.queued, 1, "{state:?}");
    // Cancelling an id that is not waiting does nothing and is not answered.
    stream
        .send_raw(vec![cancel_frame(2), cancel_frame(99)])
        .await;

    // Completing the holder serves the next waiter (frame 5).
    let done = stream
        .ask(complete_frame(6, &holder.ticket, pb::Outcome::Success))
        .await;
    assert!(!completed(&done).stale, "{done:?}");
    let served = answered(second_waiter).await;
    let served = acquired(&served).clone();
    assert!(is(served.decision, pb::Decision::Granted) && !served.ticket.is_empty());
    let state = waiters(&admin, key).await;
    assert_eq!((state.waiters, state.live_tickets), (0, 1), "{state:?}");
    stream.no_strays();
}

/// A manual-clock server with the limits config, an Admin client, and a
/// Decide stream on it.
async fn limits_server() -> (Server, Admin, Decider) {
    let server = Server::manual(Some(LIMITS_CONFIG)).await;
    let admin = server.admin().await;
    let stream = Decider::open(&server.fusebox().await)
        .await
        .expect("Decide opens");
    (server, admin, stream)
}

/// Starts a stream with a ticket granted on it and an Acquire waiting on it.
async fn holder_and_waiter(server: &Server, key: &str) -> (Decider, String) {
    let admin = server.admin().await;
    let stream = Decider::open(&server.fusebox().await)
        .await
        .expect("Decide opens");
    let holder = stream.ask(acquire_frame(1, acquire_request(key, 0))).await;
    let holder = acquired(&holder).clone();
    assert!(is(holder.decision, pb::Decision::Granted), "{holder:?}");
    stream
        .send_raw(vec![acquire_frame(2, acquire_request(key, FOREVER_MS))])
        .await;
    until_waiters(&admin, key, 1).await;
    (stream, holder.ticket)
}

/// After the stream that held it is gone: the waiter left, the ticket lives
/// until it is completed (here by a unary call).
async fn ticket_outlives_its_stream(server: &Server, key: &str, ticket: String) {
    let admin = server.admin().await;
    let state = until_waiters(&admin, key, 0).await;
    assert_eq!((state.live_tickets, state.queued), (1, 0), "{state:?}");
    // The ticket is still live.
    let done = complete(&mut server.fusebox().await, &ticket, pb::Outcome::Success).await;
    assert!(!done.stale);
    assert_eq!(waiters(&admin, key).await.live_tickets, 0);
}

#[tokio::test]
async fn a_stream_that_goes_away_withdraws_its_waiters_and_keeps_its_tickets() {
    let server = Server::manual(Some(LIMITS_CONFIG)).await;
    let key = "wait/gone";
    let (stream, ticket) = holder_and_waiter(&server, key).await;
    drop(stream); // Both sides: the request sender and the answers.
    ticket_outlives_its_stream(&server, key, ticket).await;
}

#[tokio::test]
async fn closing_only_the_request_side_still_answers_the_waiters() {
    // The caller sends no more frames but still reads: its waiter stays in
    // the queue, is served when the permit comes back, and the stream ends
    // once that answer is out.
    let server = Server::manual(Some(LIMITS_CONFIG)).await;
    let admin = server.admin().await;
    let key = "wait/half-closed";
    let (mut stream, ticket) = holder_and_waiter(&server, key).await;
    stream.close_requests();
    // The holder completes.
    let done = complete(&mut server.fusebox().await, &ticket, pb::Outcome::Success).await;
    assert!(!done.stale);
    let state = until_waiters(&admin, key, 0).await;
    assert_eq!(state.live_tickets, 1, "the waiter was served: {state:?}");
    let stats = state.stats.expect("stats");
    assert_eq!((stats.granted, stats.withdrawn), (2, 0), "{stats:?}");
    let ended = tokio::time::timeout(LIMIT, &mut stream.reader)
        .await
        .expect("the stream ends");
    assert!(matches!(ended, Ok(Ok(()))), "{ended:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cancel_behind_the_complete_that_served_the_waiter_does_nothing() {
    // Frames are started in arrival order: in [Complete holder, Cancel
    // waiter] the Complete serves the waiter, so the Cancel names an id that
    // is no longer waiting: it does nothing and gets no answer, and the
    // waiter's one answer is its grant.
    let (_server, admin, mut stream) = limits_server().await;
    let key = "wait/race";
    let first = stream.ask(acquire_frame(1, acquire_request(key, 0))).await;
    let mut holder = acquired(&first).ticket.clone();
    for round in 1..=50u64 {
        let waiter = round * 10;
        let rx = stream
            .send_one(acquire_frame(waiter, acquire_request(key, FOREVER_MS)))
            .await;
        until_waiters(&admin, key, 1).await;
        let done = stream
            .send(vec![
                complete_frame(waiter + 1, &holder, pb::Outcome::Success),
                cancel_frame(waiter),
            ])
            .await
            .pop()
            .expect("the complete's receiver");
        assert!(!completed(&answered(done).await).stale, "round {round}");
        let served = answered(rx).await;
        match &served.result {
            Some(Res::Acquire(a)) if is(a.decision, pb::Decision::Granted) => {
                holder = a.ticket.clone();
            }
            other => {
                let state = waiters(&admin, key).await;
                panic!(
                    "round {round}: the waiter was served by the Complete before the Cancel came; expected its grant, got {other:?}; the key now: {state:?}"
                )
            }
        }
        let state = waiters(&admin, key).await;
        assert_eq!(
            (state.waiters, state.live_tickets),
            (0, 1),
            "round {round}: {state:?}"
        );
    }
    // The stream ends once nothing waits; every answer came before its end.
    stream.close_requests();
    let ended = tokio::time::timeout(LIMIT, &mut stream.reader)
        .await
        .expect("the stream ends");
    assert!(matches!(ended, Ok(Ok(()))), "{ended:?}");
    stream.no_strays();
}

// ---------------------------------------------------------------------------
// 5. Batches.
// ---------------------------------------------------------------------------

fn acquire_item(result: &pb::AcquireResult) -> &pb::AcquireResponse {
    match &result.result {
        Some(pb::acquire_result::Result::Response(r)) => r,
        other => panic!("expected a response, got {other:?}"),
    }
}

fn acquire_error(result: &pb::AcquireResult) -> (Code, &str) {
    match &result.result {
        Some(pb::acquire_result::Result::Error(e)) => (Code::from(e.code), e.message.as_str()),
        other => panic!("expected an error, got {other:?}"),
    }
}

#[tokio::test]
async fn batches_answer_each_item_as_the_unary_call_in_order() {
    let server = Server::manual(Some(LIMITS_CONFIG)).await;
    let mut client = server.fusebox().await;
    let admin = server.admin().await;
    let items = vec![
        acquire_request("batch/a", 0),
        acquire_request("", 0),
        acquire_request("batch/b", 0),
        acquire_request("batch/a", 1000),
        acquire_request("batch/a", 0),
        acquire_request("batch/a", 0),
        acquire_request("batch/a", 0),
    ];
    let results = client
        .acquire_batch(pb::AcquireBatchRequest { items })
        .await
        .expect("AcquireBatch answers")
        .into_inner()
        .results;
    assert_eq!(results.len(), 7, "{results:?}");
    let granted = |i: usize| {
        let r = acquire_item(&results[i]);
        assert!(
            is(r.decision, pb::Decision::Granted) && !r.ticket.is_empty(),
            "item {i}: {r:?}"
        );
        r.ticket.clone()
    };
    let tickets = [granted(0), granted(2), granted(4), granted(5)];
    let (code, message) = acquire_error(&results[1]);
    assert_eq!(code, Code::InvalidArgument, "{message}");
    assert!(message.contains("key"), "names the field: {message}");
    let (code, message) = acquire_error(&results[3]);
    assert_eq!(code, Code::InvalidArgument, "{message}");
    assert!(message.contains("max_wait"), "names the field: {message}");
    // In order: batch/a has 3 permits, items 0, 4 and 5 took them.
    let last = acquire_item(&results[6]);
    assert!(
        is(last.decision, pb::Decision::Denied) && last.reason == pb::Reason::NoPermits as i32,
        "{last:?}"
    );
    // The refused item changed nothing.
    let a = waiters(&admin, "batch/a").await;
    assert_eq!((a.live_tickets, a.waiters, a.free), (3, 0, 0), "{a:?}");
    assert_eq!(waiters(&admin, "batch/b").await.live_tickets, 1);

    let mut items = successes(&tickets);
    items.push(pb::CompleteRequest {
        ticket: UNKNOWN_TICKET.into(),
        outcome: pb::Outcome::Success as i32,
        cost: None,
    });
    // The first ticket again: completed once only.
    items.push(items[0].clone());
    let results = client
        .complete_batch(pb::CompleteBatchRequest { items })
        .await
        .expect("CompleteBatch answers")
        .into_inner()
        .results;
    assert_eq!(results.len(), 6, "{results:?}");
    for (i, r) in results[..4].iter().enumerate() {
        match &r.result {
            Some(pb::complete_result::Result::Response(c)) => {
                assert!(!c.stale, "item {i}: {c:?}");
                assert_eq!(c.phase, pb::Phase::Closed as i32, "item {i}: {c:?}");
            }
            other => panic!("item {i}: expected a response, got {other:?}"),
        }
    }
    let status = crate::admin::complete_not_found(&mut client, UNKNOWN_TICKET).await;
    for (i, r) in results[4..].iter().enumerate() {
        match &r.result {
            Some(pb::complete_result::Result::Error(e)) => {
                assert_eq!(Code::from(e.code), Code::NotFound, "item {}: {e:?}", i + 4);
                assert_eq!(e.message, status.message(), "item {}", i + 4);
            }
            other => panic!("item {}: expected NOT_FOUND, got {other:?}", i + 4),
        }
    }
    let a = waiters(&admin, "batch/a").await;
    assert_eq!((a.live_tickets, a.free), (0, 3), "{a:?}");
    assert_eq!(waiters(&admin, "batch/b").await.live_tickets, 0);
}

#[tokio::test]
async fn batches_hold_1_to_1000_items() {
    let server = Server::manual(Some(LIMITS_CONFIG)).await;
    let mut client = server.fusebox().await;
    let admin = server.admin().await;
    let empty = client
        .acquire_batch(pb::AcquireBatchRequest { items: vec![] })
        .await
        .expect_err("an empty batch fails");
    assert_eq!(empty.code(), Code::InvalidArgument, "{empty:?}");
    let empty = client
        .complete_batch(pb::CompleteBatchRequest { items: vec![] })
        .await
        .expect_err("an empty batch fails");
    assert_eq!(empty.code(), Code::InvalidArgument, "{empty:?}");

    let key = "many/batch";
    let over = client
        .acquire_batch(pb::AcquireBatchRequest {
            items: vec![acquire_request(key, 0); 1001],
        })
        .await
        .expect_err("1,001 items fail");
    assert_eq!(over.code(), Code::ResourceExhausted, "{over:?}");
    assert_eq!(
        waiters(&admin, key).await.live_tickets,
        0,
        "the refused batch changed nothing"
    );
    let full = client
        .acquire_batch(pb::AcquireBatchRequest {
            items: vec![acquire_request(key, 0); 1000],
        })
        .await
        .expect("1,000 items are served")
        .into_inner()
        .results;
    let tickets: Vec<_> = full
        .iter()
        .map(|r| acquire_item(r).ticket.clone())
        .collect();
    assert!(tickets.iter().all(|t| !t.is_empty()));
    assert_eq!(waiters(&admin, key).await.live_tickets, 1000);

    let mut items = successes(&tickets);
    items.push(items[0].clone());
    let over = client
        .complete_batch(pb::CompleteBatchRequest {
            items: items.clone(),
        })
        .await
        .expect_err("1,001 items fail");
    assert_eq!(over.code(), Code::ResourceExhausted, "{over:?}");
    assert_eq!(
        waiters(&admin, key).await.live_tickets,
        1000,
        "the refused batch completed nothing"
    );
    items.pop();
    let done = client
        .complete_batch(pb::CompleteBatchRequest { items })
        .await
        .expect("1,000 items are served")
        .into_inner()
        .results;
    assert!(done
        .iter()
        .all(|r| matches!(r.result, Some(pb::complete_result::Result::Response(_)))));
    assert_eq!(waiters(&admin, key).await.live_tickets, 0);
}

// ---------------------------------------------------------------------------
// 6. Frames of one key are decided in arrival order.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn frames_of_one_key_are_decided_in_arrival_order() {
    let (server, _admin, _stream) = limits_server().await;
    frames_in_arrival_order(&server).await;
}

/// The same with a store, one Redis and a cluster, while other callers
/// keep the server's link to Redis busy, so that the frames of one message
/// may go out in several batches: they are still decided in the order they
/// came.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn frames_of_one_key_are_decided_in_arrival_order_with_a_store() {
    let test = "frames_of_one_key_are_decided_in_arrival_order_with_a_store";
    let Some(redis) = crate::harness::standalone(test).await else {
        return;
    };
    frames_in_order_while_busy(&format!("redis://127.0.0.1:{}", redis.server.port)).await;
    let Some(cluster) =
        tokio::task::spawn_blocking(move || crate::redis_harness::Cluster::start(test))
            .await
            .expect("the cluster starts")
    else {
        return;
    };
    frames_in_order_while_busy(&crate::store::store_of(&cluster)).await;
}

async fn frames_in_order_while_busy(store: &str) {
    let server = Server::start(crate::harness::Options {
        config: Some(LIMITS_CONFIG),
        manual_clock: true,
        args: vec!["--store", store],
        ..crate::harness::Options::default()
    })
    .await;
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut busy = Vec::new();
    for caller in 0..8 {
        let (mut client, done) = (server.fusebox().await, done.clone());
        busy.push(tokio::spawn(async move {
            let mut pairs = 0u32;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let key = format!("busy/{caller}/{}", pairs % 16);
                let got = client
                    .acquire(acquire_request(&key, 0))
                    .await
                    .expect("Acquire")
                    .into_inner();
                if !got.ticket.is_empty() {
                    complete(&mut client, &got.ticket, pb::Outcome::Success).await;
                }
                pairs += 1;
            }
            pairs
        }));
    }
    frames_in_arrival_order(&server).await;
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    for caller in busy {
        assert!(
            caller.await.expect("the busy caller") > 0,
            "the link was kept busy"
        );
    }
}

/// 100 rounds of one message on one key of one permit: the last round's
/// ticket completed, then two acquires; the first is granted and the
/// second denied, every round.
async fn frames_in_arrival_order(server: &Server) {
    let admin = server.admin().await;
    let mut stream = Decider::open(&server.fusebox().await)
        .await
        .expect("Decide opens");
    let key = "order/k";
    let mut held: Option<String> = None;
    for round in 0..100u64 {
        let base = round * 10;
        let mut frames = Vec::new();
        // The previous round's ticket is completed first, in the same message.
        if let Some(ticket) = &held {
            frames.push(complete_frame(base, ticket, pb::Outcome::Success));
        }
        frames.push(acquire_frame(base + 1, acquire_request(key, 0)));
        frames.push(acquire_frame(base + 2, acquire_request(key, 0)));
        let mut answers = Vec::new();
        for rx in stream.send(frames).await {
            answers.push(answered(rx).await);
        }
        if held.is_some() {
            let done = answers.remove(0);
            let done = completed(&done);
            assert!(!done.stale, "round {round}: {done:?}");
        }
        let first = acquired(&answers[0]);
        let second = acquired(&answers[1]);
        assert!(
            is(first.decision, pb::Decision::Granted) && !first.ticket.is_empty(),
            "round {round}: the first frame is granted: {first:?}"
        );
        assert!(
            is(second.decision, pb::Decision::Denied)
                && second.reason == pb::Reason::NoPermits as i32
                && second.ticket.is_empty(),
            "round {round}: the second frame is denied no_permits: {second:?}"
        );
        held = Some(first.ticket.clone());
    }
    let state = waiters(&admin, key).await;
    assert_eq!((state.live_tickets, state.free), (1, 0), "{state:?}");
    stream.no_strays();
}

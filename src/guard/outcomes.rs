//! Outcomes off the caller's path (`clients/README.md`, "Outcomes off the
//! caller's path"): a guarded call's outcome goes into the guard's bounded
//! outcome queue and the guard returns at once; one sender task per guard
//! reports what is queued. With nothing in flight it sends at once; the
//! outcomes that end while a send is in flight go together in the next
//! one, at most 1,000 (the server's limit per message): one
//! `CompleteBatch`, or `complete` frames of the guard's `Decide` stream in
//! one message. One send is in flight at a time.
//!
//! The caller's side takes a lock, pushes and wakes the sender: it never
//! waits on the network and starts no task of its own (the sender is
//! started once, by the first outcome, and again only if its runtime went
//! away). A full queue drops the outcome (counted and logged): the
//! ticket's lease then ends on the server, which counts it as expired.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{watch, Notify};
use tonic::transport::Channel;
use tonic::Status;

use fusebox_proto::v1 as pb;

use crate::clock::Clock;
use crate::stream::{self, Mux};

/// Outcomes in one send at most: the server's limit per message (items of
/// a `CompleteBatch`, frames of a `Decide` message).
const PER_SEND: usize = 1_000;

/// The shortest deadline of a send: nobody waits on it, and a busy fusebox
/// should not turn outcomes into expired leases.
const MIN_SEND_DEADLINE: Duration = Duration::from_secs(1);

type Authorization = tonic::metadata::MetadataValue<tonic::metadata::Ascii>;

/// What fusebox is told about a call that ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The call worked.
    Success,
    /// The call failed in a way that counts against the dependency.
    Failure,
    /// The call says nothing about the dependency.
    Ignored,
}

impl Outcome {
    fn wire(self) -> i32 {
        match self {
            Outcome::Success => pb::Outcome::Success as i32,
            Outcome::Failure => pb::Outcome::Failure as i32,
            Outcome::Ignored => pb::Outcome::Ignored as i32,
        }
    }
}

/// [`Guard::flush`](crate::Guard::flush) gave up: outcomes queued before it were still
/// unanswered at its deadline.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{unanswered} outcomes were still unanswered by fusebox after {waited:?}: fusebox is slow or unreachable; their tickets' leases will end on fusebox if they never arrive"
)]
pub struct FlushError {
    /// Outcomes queued before the flush and not answered yet.
    pub unanswered: u64,
    /// How long the flush waited.
    pub waited: Duration,
}

/// How the sender reaches fusebox: the guard's unary client, or its
/// `Decide` stream when it has one.
pub(crate) struct Route {
    pub(crate) client: pb::fusebox_client::FuseboxClient<Channel>,
    pub(crate) mux: Option<Arc<Mux>>,
    pub(crate) authorization: Option<Authorization>,
}

/// A guard's outcome queue and what its sender shares with the guard.
pub(crate) struct Outcomes {
    route: Route,
    /// Outcomes waiting (not in flight) at most.
    capacity: usize,
    /// The deadline of one send: the guard's deadline, at least 1 s.
    send_deadline: Duration,
    clock: Clock,
    log_interval: Duration,
    queue: Mutex<Queue>,
    /// Wakes the sender when an outcome is queued or the guard is gone.
    wake: Notify,
    /// Outcomes settled so far (answered, or counted as failed), in queue
    /// order; `flush` waits on it.
    settled: watch::Sender<u64>,
    dropped: AtomicU64,
    failed: AtomicU64,
    dropped_logged: Mutex<Option<Instant>>,
    failed_logged: Mutex<Option<Instant>>,
}

/// Under the lock: `settled + in_flight + waiting.len() == queued`.
struct Queue {
    waiting: VecDeque<pb::CompleteRequest>,
    /// Outcomes queued so far (dropped ones are not).
    queued: u64,
    /// Outcomes of the send in flight.
    in_flight: usize,
    /// The sender task, once started.
    sender: Option<tokio::task::JoinHandle<()>>,
    /// Every clone of the guard is gone: the sender sends what is left,
    /// then ends.
    closed: bool,
}

/// Did `last` happen at least `interval` before `now`? Records `now` when
/// it did.
fn due(last: &Mutex<Option<Instant>>, now: Instant, interval: Duration) -> bool {
    let mut last = last.lock().expect("log lock");
    let due = last.is_none_or(|t| now.saturating_duration_since(t) >= interval);
    if due {
        *last = Some(now);
    }
    due
}

impl Outcomes {
    /// A queue of `capacity` outcomes waiting at most, sent on `route`
    /// with the guard's `deadline` (at least 1 s); trouble is logged at
    /// most once per `log_interval` on `clock`.
    pub(crate) fn new(
        route: Route,
        capacity: usize,
        deadline: Duration,
        clock: Clock,
        log_interval: Duration,
    ) -> Arc<Outcomes> {
        Arc::new(Outcomes {
            route,
            capacity,
            send_deadline: deadline.max(MIN_SEND_DEADLINE),
            clock,
            log_interval,
            queue: Mutex::new(Queue {
                waiting: VecDeque::new(),
                queued: 0,
                in_flight: 0,
                sender: None,
                closed: false,
            }),
            wake: Notify::new(),
            settled: watch::Sender::new(0),
            dropped: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            dropped_logged: Mutex::new(None),
            failed_logged: Mutex::new(None),
        })
    }

    /// Outcomes dropped because the queue was full.
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Outcomes fusebox did not take (a failed send, an error answer).
    pub(crate) fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }

    /// Queues the outcome of `ticket`, with the permits the call really
    /// used when it says (U1), or drops it when the queue is full. Never
    /// waits.
    pub(crate) fn push(self: &Arc<Self>, ticket: String, outcome: Outcome, cost: Option<u32>) {
        let mut queue = self.queue.lock().expect("outcome queue lock");
        if queue.waiting.len() >= self.capacity {
            drop(queue);
            let dropped = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            if due(&self.dropped_logged, self.clock.now(), self.log_interval) {
                tracing::warn!(
                    queue = self.capacity,
                    dropped_so_far = dropped,
                    "the guard's outcome queue is full, so a finished call's outcome was \
                     dropped: its ticket's lease will end on fusebox, which counts it as \
                     expired; fusebox is slow or unreachable (check it), or the queue is too \
                     small for this load (raise GuardOptions::outcome_queue)"
                );
            }
            return;
        }
        queue.waiting.push_back(pb::CompleteRequest {
            ticket,
            outcome: outcome.wire(),
            cost,
        });
        queue.queued += 1;
        self.start_sender(&mut queue);
        drop(queue);
        self.wake.notify_one();
    }

    /// Starts the sender unless it runs. Outside a runtime nothing starts:
    /// the next outcome or `flush` inside one does.
    fn start_sender(self: &Arc<Self>, queue: &mut Queue) {
        if queue.sender.as_ref().is_some_and(|s| !s.is_finished()) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if queue.in_flight > 0 {
            // The sender's runtime went away during a send: those outcomes
            // are lost, as a failed send's are.
            let lost = std::mem::take(&mut queue.in_flight) as u64;
            self.failed.fetch_add(lost, Ordering::Relaxed);
            self.settled.send_modify(|s| *s += lost);
        }
        queue.sender = Some(runtime.spawn(self.clone().send_all()));
    }

    /// The guard is gone: the sender sends what is queued, then ends.
    pub(crate) fn close(&self) {
        self.queue.lock().expect("outcome queue lock").closed = true;
        self.wake.notify_one();
    }

    /// Waits until every outcome queued before this call is settled:
    /// answered by fusebox, or counted as failed. Each send has its own
    /// deadline, so this ends in time while the sender runs; it gives up
    /// after one send deadline more than the sends ahead of it can take.
    pub(crate) async fn flush(self: &Arc<Self>) -> Result<(), FlushError> {
        let (target, sends) = {
            let mut queue = self.queue.lock().expect("outcome queue lock");
            self.start_sender(&mut queue);
            let sends = usize::from(queue.in_flight > 0) + queue.waiting.len().div_ceil(PER_SEND);
            (queue.queued, sends)
        };
        let limit = self
            .send_deadline
            .saturating_mul(u32::try_from(sends + 1).unwrap_or(u32::MAX));
        let mut settled = self.settled.subscribe();
        let done = tokio::time::timeout(limit, settled.wait_for(|s| *s >= target))
            .await
            .is_ok_and(|answer| answer.is_ok());
        if done {
            return Ok(());
        }
        let reached = *settled.borrow();
        Err(FlushError {
            unanswered: target.saturating_sub(reached),
            waited: limit,
        })
    }

    /// The sender: one send in flight at a time, what was queued meanwhile
    /// in the next, until the guard is gone and the queue empty.
    async fn send_all(self: Arc<Self>) {
        loop {
            let batch: Option<Vec<pb::CompleteRequest>> = {
                let mut queue = self.queue.lock().expect("outcome queue lock");
                if queue.waiting.is_empty() {
                    if queue.closed {
                        return;
                    }
                    None
                } else {
                    let count = queue.waiting.len().min(PER_SEND);
                    queue.in_flight = count;
                    Some(queue.waiting.drain(..count).collect())
                }
            };
            let Some(batch) = batch else {
                // A push between the check and here left a permit: no
                // wake-up is lost.
                self.wake.notified().await;
                continue;
            };
            let count = batch.len() as u64;
            let (failed, trouble) = self.send(batch).await;
            if failed > 0 {
                // Counted before the outcomes are settled, so that a flush
                // that returns sees it.
                let so_far = self.failed.fetch_add(failed, Ordering::Relaxed) + failed;
                if due(&self.failed_logged, self.clock.now(), self.log_interval) {
                    let trouble = trouble.unwrap_or_else(|| Status::unknown("no answer"));
                    tracing::warn!(
                        outcomes = failed,
                        failed_so_far = so_far,
                        code = ?trouble.code(),
                        message = trouble.message(),
                        "fusebox did not take the outcomes of finished calls: their tickets' \
                         leases will end on fusebox, which counts them as expired; check that \
                         fusebox is up and reachable"
                    );
                }
            }
            let mut queue = self.queue.lock().expect("outcome queue lock");
            queue.in_flight = 0;
            self.settled.send_modify(|s| *s += count);
        }
    }

    /// One send; how many of its outcomes fusebox did not take, and why
    /// (the first trouble).
    async fn send(&self, batch: Vec<pb::CompleteRequest>) -> (u64, Option<Status>) {
        match &self.route.mux {
            None => self.send_batch(batch).await,
            Some(mux) => self.send_frames(mux, batch).await,
        }
    }

    /// One `CompleteBatch`.
    async fn send_batch(&self, items: Vec<pb::CompleteRequest>) -> (u64, Option<Status>) {
        let count = items.len();
        let mut request = tonic::Request::new(pb::CompleteBatchRequest { items });
        request.set_timeout(self.send_deadline);
        if let Some(value) = &self.route.authorization {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        let mut client = self.route.client.clone();
        let answer = tokio::time::timeout(self.send_deadline, client.complete_batch(request)).await;
        let results = match answer {
            Ok(Ok(reply)) => reply.into_inner().results,
            Ok(Err(status)) => return (count as u64, Some(status)),
            Err(_) => {
                return (
                    count as u64,
                    Some(Status::deadline_exceeded("fusebox did not answer in time")),
                )
            }
        };
        let mut failed = count.saturating_sub(results.len()) as u64;
        let mut trouble = (failed > 0)
            .then(|| Status::internal("fusebox answered fewer outcomes than were sent"));
        for result in results.into_iter().take(count) {
            use pb::complete_result::Result as Answer;
            let status = match result.result {
                Some(Answer::Response(_)) => continue,
                Some(Answer::Error(error)) => stream::status_of(error),
                None => Status::internal("fusebox answered an outcome with nothing"),
            };
            failed += 1;
            trouble.get_or_insert(status);
        }
        (failed, trouble)
    }

    /// `complete` frames of the guard's stream, in one message.
    async fn send_frames(
        &self,
        mux: &Mux,
        items: Vec<pb::CompleteRequest>,
    ) -> (u64, Option<Status>) {
        use pb::decide_result::Result as Answer;
        let requests = items
            .into_iter()
            .map(pb::decide_frame::Request::Complete)
            .collect();
        let mut failed = 0;
        let mut trouble = None;
        for answer in mux.call_group(requests, self.send_deadline).await {
            let status = match answer {
                Ok(Answer::Complete(_)) => continue,
                Ok(Answer::Error(error)) => stream::status_of(error),
                Ok(other) => stream::unexpected(other),
                Err(status) => status,
            };
            failed += 1;
            trouble.get_or_insert(status);
        }
        (failed, trouble)
    }
}

//! Many decisions per request: the `Decide` stream and the batched unary
//! calls. Every frame is the unary call it carries (the same checks, the
//! same answers, `Api::acquire_as` and its kin); what this module adds is
//! the framing, the limits, and waiting without holding up the stream.
//!
//! Order: a stream's frames are started one after another in the order they
//! arrive, and an Acquire makes its decision (or takes its place in the
//! key's queue) when it is first polled, before the next frame is started,
//! so frames of one key are decided in arrival order. An Acquire that waits
//! is then moved to a task of its own, and its answer goes out when it
//! comes.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, LazyLock, Mutex};

use tokio::sync::mpsc;
use tokio::sync::oneshot;
use tokio::task::JoinSet;
use tonic::{Request, Status, Streaming};

use super::{status_of_refusal, Api};
use crate::auth::{Grant, Role};
use crate::connections::FIGURES;
use crate::proto::v1 as pb;

/// The most frames (or batch items) in one message.
pub const MAX_FRAMES_PER_MESSAGE: usize = 1_000;

/// The most frames of one stream unanswered at a time.
pub const MAX_UNANSWERED: usize = 10_000;

/// The most `Decide` streams open on one connection.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 16;

/// Response messages queued for a slow reader before the stream stops
/// reading new frames.
const OUTBOX: usize = 64;

/// The answers of a stream, as tonic sends them.
pub type Answers = tokio_stream::wrappers::ReceiverStream<Result<pb::DecideResponse, Status>>;

/// Open `Decide` streams by connection (the peer's address).
static STREAMS: LazyLock<Mutex<HashMap<SocketAddr, u32>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// One open stream counted against its connection's cap, until dropped.
struct Counted(Option<SocketAddr>);

impl Counted {
    fn open(peer: Option<SocketAddr>) -> Result<Counted, Status> {
        if let Some(peer) = peer {
            let mut streams = STREAMS.lock().expect("streams lock");
            let open = streams.entry(peer).or_insert(0);
            if *open >= MAX_STREAMS_PER_CONNECTION {
                FIGURES
                    .decide_streams_refused
                    .fetch_add(1, Ordering::Relaxed);
                return Err(Status::resource_exhausted(format!(
                    "this connection has {MAX_STREAMS_PER_CONNECTION} Decide streams open, the most it may; \
                     send more frames on the open ones, or open another connection"
                )));
            }
            *open += 1;
        }
        FIGURES.decide_streams.fetch_add(1, Ordering::Relaxed);
        Ok(Counted(peer))
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        FIGURES.decide_streams.fetch_sub(1, Ordering::Relaxed);
        if let Some(peer) = self.0 {
            let mut streams = STREAMS.lock().expect("streams lock");
            if let Some(open) = streams.get_mut(&peer) {
                *open -= 1;
                if *open == 0 {
                    streams.remove(&peer);
                }
            }
        }
    }
}

/// An error answer: the status the unary call would have failed with.
fn error_of(status: &Status) -> pb::ItemError {
    pb::ItemError {
        code: status.code() as i32,
        message: status.message().to_owned(),
    }
}

fn answer(id: u64, result: pb::decide_result::Result) -> pb::DecideResult {
    pb::DecideResult {
        id,
        result: Some(result),
    }
}

fn failed(id: u64, status: &Status) -> pb::DecideResult {
    answer(id, pb::decide_result::Result::Error(error_of(status)))
}

/// Opens a `Decide` stream: checks who calls and the connection's cap,
/// then serves the frames on a task of its own.
pub fn open(api: &Api, request: Request<Streaming<pb::DecideRequest>>) -> Result<Answers, Status> {
    let grant = api.grant(&request)?;
    if let Some(grant) = &grant {
        grant
            .needs(Role::Caller, "Decide")
            .map_err(status_of_refusal)?;
    }
    let counted = Counted::open(super::tls::remote_addr(&request))?;
    let frames = request.into_inner();
    let (tx, rx) = mpsc::channel(OUTBOX);
    let stream = Stream {
        api: api.clone(),
        grant,
        tx,
        waiting: JoinSet::new(),
        cancels: HashMap::new(),
        _counted: counted,
    };
    tokio::spawn(stream.serve(frames));
    Ok(tokio_stream::wrappers::ReceiverStream::new(rx))
}

/// A waiting Acquire's answer, with its frame id.
type Waited = (u64, Result<pb::AcquireResponse, Status>);

struct Stream {
    api: Api,
    grant: Option<Arc<Grant>>,
    tx: mpsc::Sender<Result<pb::DecideResponse, Status>>,
    /// Acquires that wait, each on a task.
    waiting: JoinSet<Waited>,
    /// How to cancel each waiting Acquire, by frame id (taken once used).
    cancels: HashMap<u64, Option<oneshot::Sender<()>>>,
    _counted: Counted,
}

impl Stream {
    /// Serves frames until the caller ends the stream (or goes away), then
    /// withdraws the Acquires still waiting.
    async fn serve(mut self, mut frames: Streaming<pb::DecideRequest>) {
        loop {
            tokio::select! {
                message = frames.message() => match message {
                    Ok(Some(message)) => {
                        let results = self.frames(message.frames).await;
                        if !self.send(results).await {
                            break;
                        }
                    }
                    // The caller closed its sending side: it still reads, so
                    // what waits is answered, unless it goes away too.
                    Ok(None) => {
                        self.drain().await;
                        break;
                    }
                    Err(_) => break,
                },
                Some(done) = self.waiting.join_next(), if !self.waiting.is_empty() => {
                    let mut results: Vec<_> = self.waited(done).into_iter().collect();
                    while let Some(more) = self.waiting.try_join_next() {
                        results.extend(self.waited(more));
                    }
                    if !self.send(results).await {
                        break;
                    }
                }
            }
        }
        // Dropping the tasks withdraws their waiters (P6); tickets already
        // granted live on until completed or their leases end.
        self.waiting.abort_all();
    }

    /// Answers the Acquires still waiting as they are served, until none
    /// is left or the caller stops reading (then they are withdrawn).
    async fn drain(&mut self) {
        loop {
            tokio::select! {
                () = self.tx.closed() => return,
                done = self.waiting.join_next() => {
                    let Some(done) = done else { return };
                    let results = self.waited(done).into_iter().collect();
                    if !self.send(results).await {
                        return;
                    }
                }
            }
        }
    }

    async fn send(&self, results: Vec<pb::DecideResult>) -> bool {
        if results.is_empty() {
            return true;
        }
        FIGURES
            .decide_answers
            .fetch_add(results.len() as u64, Ordering::Relaxed);
        self.tx
            .send(Ok(pb::DecideResponse { results }))
            .await
            .is_ok()
    }

    /// The answer of a waiting Acquire that finished; `None` for one that
    /// was cancelled (its CANCELLED answer went when the Cancel came).
    fn waited(&mut self, done: Result<Waited, tokio::task::JoinError>) -> Option<pb::DecideResult> {
        let (id, result) = done.ok()?;
        self.cancels.remove(&id);
        Some(match result {
            Ok(response) => answer(id, pb::decide_result::Result::Acquire(response)),
            Err(status) => failed(id, &status),
        })
    }

    /// Starts the frames of one message, in order; returns the answers
    /// ready now.
    async fn frames(&mut self, frames: Vec<pb::DecideFrame>) -> Vec<pb::DecideResult> {
        FIGURES
            .decide_frames
            .fetch_add(frames.len() as u64, Ordering::Relaxed);
        let mut results = Vec::with_capacity(frames.len());
        for (at, frame) in frames.into_iter().enumerate() {
            let id = frame.id;
            if at >= MAX_FRAMES_PER_MESSAGE {
                FIGURES
                    .decide_frames_refused
                    .fetch_add(1, Ordering::Relaxed);
                results.push(failed(
                    id,
                    &Status::resource_exhausted(format!(
                        "frames: a message may carry {MAX_FRAMES_PER_MESSAGE} frames; this one is past them and was not started: send it in the next message"
                    )),
                ));
                continue;
            }
            if let Some(result) = self.frame(id, frame.request).await {
                results.push(result);
            }
        }
        results
    }

    /// Starts one frame; its answer if ready (none for a Cancel, or for an
    /// Acquire that waits).
    async fn frame(
        &mut self,
        id: u64,
        request: Option<pb::decide_frame::Request>,
    ) -> Option<pb::DecideResult> {
        use pb::decide_frame::Request as Frame;
        use pb::decide_result::Result as Answer;
        let frame = match request {
            Some(Frame::Cancel(_)) => {
                // The Acquire answers CANCELLED itself, unless its answer is
                // already there (then the answer goes, and this does nothing).
                if let Some(cancel) = self.cancels.get_mut(&id).and_then(Option::take) {
                    let _ = cancel.send(());
                }
                return None;
            }
            Some(frame) => frame,
            None => {
                return Some(failed(
                    id,
                    &Status::invalid_argument(
                        "request: a frame must carry acquire, complete, renew or cancel",
                    ),
                ))
            }
        };
        if self.cancels.contains_key(&id) {
            return Some(failed(
                id,
                &Status::invalid_argument(format!(
                    "id: {id} is the id of an Acquire still waiting on this stream; give each unanswered frame its own id"
                )),
            ));
        }
        if self.waiting.len() >= MAX_UNANSWERED {
            FIGURES
                .decide_frames_refused
                .fetch_add(1, Ordering::Relaxed);
            return Some(failed(
                id,
                &Status::resource_exhausted(format!(
                    "frames: this stream has {MAX_UNANSWERED} frames unanswered, the most it may; this one was not started: wait for answers, or use another stream"
                )),
            ));
        }
        let grant = self.grant.as_deref();
        Some(match frame {
            // One that may not wait decides at once: no task, no box.
            Frame::Acquire(req) if req.max_wait.is_none_or(|d| d.seconds == 0 && d.nanos == 0) => {
                match self.api.acquire_as(grant, req).await {
                    Ok(response) => answer(id, Answer::Acquire(response)),
                    Err(status) => failed(id, &status),
                }
            }
            Frame::Acquire(req) => {
                let api = self.api.clone();
                let grant = self.grant.clone();
                let mut acquire: Pin<Box<dyn Future<Output = _> + Send>> =
                    Box::pin(async move { api.acquire_as(grant.as_deref(), req).await });
                // Polled here first, so that it decides (or queues) before
                // the next frame starts; only a waiter goes to a task.
                tokio::select! {
                    biased;
                    result = &mut acquire => match result {
                        Ok(response) => answer(id, Answer::Acquire(response)),
                        Err(status) => failed(id, &status),
                    },
                    () = std::future::ready(()) => {
                        let (cancel, cancelled) = oneshot::channel::<()>();
                        self.waiting.spawn(async move {
                            tokio::select! {
                                // An answer already made wins over a Cancel.
                                biased;
                                result = &mut acquire => (id, result),
                                _ = cancelled => (id, Err(Status::cancelled(
                                    "the caller cancelled this Acquire; it left the queue",
                                ))),
                            }
                        });
                        self.cancels.insert(id, Some(cancel));
                        return None;
                    }
                }
            }
            Frame::Complete(req) => match self.api.complete_as(grant, req).await {
                Ok(response) => answer(id, Answer::Complete(response)),
                Err(status) => failed(id, &status),
            },
            Frame::Renew(req) => match self.api.renew_as(grant, req).await {
                Ok(response) => answer(id, Answer::Renew(response)),
                Err(status) => failed(id, &status),
            },
            Frame::Cancel(_) => unreachable!("handled above"),
        })
    }
}

/// Checks a batch's size: 1 to [`MAX_FRAMES_PER_MESSAGE`] items.
fn check_items(count: usize) -> Result<(), Status> {
    match count {
        0 => Err(Status::invalid_argument(
            "items: a batch needs at least one item",
        )),
        n if n > MAX_FRAMES_PER_MESSAGE => Err(Status::resource_exhausted(format!(
            "items: a batch may carry {MAX_FRAMES_PER_MESSAGE} items, not {n}; split it"
        ))),
        _ => Ok(()),
    }
}

/// `AcquireBatch`: each item as the unary Acquire, in order; none waits.
pub async fn acquire_batch(
    api: &Api,
    request: Request<pb::AcquireBatchRequest>,
) -> Result<pb::AcquireBatchResponse, Status> {
    let grant = api.grant(&request)?;
    let items = request.into_inner().items;
    check_items(items.len())?;
    FIGURES
        .batch_items
        .fetch_add(items.len() as u64, Ordering::Relaxed);
    let mut results = Vec::with_capacity(items.len());
    for item in items {
        let waits = item
            .max_wait
            .is_some_and(|d| d.seconds != 0 || d.nanos != 0);
        let result = if waits {
            Err(Status::invalid_argument(
                "max_wait: a batch item does not wait; leave it out, or use Acquire or Decide to wait",
            ))
        } else {
            api.acquire_as(grant.as_deref(), item).await
        };
        use pb::acquire_result::Result as R;
        results.push(pb::AcquireResult {
            result: Some(match result {
                Ok(response) => R::Response(response),
                Err(status) => R::Error(error_of(&status)),
            }),
        });
    }
    Ok(pb::AcquireBatchResponse { results })
}

/// `CompleteBatch`: each item as the unary Complete, in order.
pub async fn complete_batch(
    api: &Api,
    request: Request<pb::CompleteBatchRequest>,
) -> Result<pb::CompleteBatchResponse, Status> {
    let grant = api.grant(&request)?;
    let items = request.into_inner().items;
    check_items(items.len())?;
    FIGURES
        .batch_items
        .fetch_add(items.len() as u64, Ordering::Relaxed);
    let mut results = Vec::with_capacity(items.len());
    for item in items {
        use pb::complete_result::Result as R;
        results.push(pb::CompleteResult {
            result: Some(match api.complete_as(grant.as_deref(), item).await {
                Ok(response) => R::Response(response),
                Err(status) => R::Error(error_of(&status)),
            }),
        });
    }
    Ok(pb::CompleteBatchResponse { results })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    #[test]
    fn errors_carry_the_unary_code_and_message() {
        let e = error_of(&Status::not_found("ticket: not found"));
        assert_eq!(e.code, Code::NotFound as i32);
        assert_eq!(e.message, "ticket: not found");
    }

    #[test]
    fn batches_hold_one_to_the_most_items() {
        assert_eq!(check_items(0).unwrap_err().code(), Code::InvalidArgument);
        assert!(check_items(1).is_ok());
        assert!(check_items(MAX_FRAMES_PER_MESSAGE).is_ok());
        assert_eq!(
            check_items(MAX_FRAMES_PER_MESSAGE + 1).unwrap_err().code(),
            Code::ResourceExhausted
        );
    }
}

//! Many decisions per request: the `Decide` stream and the batched unary
//! calls. Every frame is the unary call it carries (the same checks, the
//! same answers, `Api::acquire_as` and its kin); what this module adds is
//! the framing, the limits, and waiting without holding up the stream.
//!
//! Order: a stream's frames are started one after another in the order they
//! arrive, each polled once before the next is started. A frame decided at
//! once (the embedded engine) answers then; one that waits on the store
//! (Redis) has sent its command by then, so the frames of a message go to
//! Redis together, one round trip per node, in arrival order per key (one
//! connection per node keeps them in order), and their answers are awaited
//! together. An Acquire that waits in a key's queue is moved to a task of
//! its own, and its answer goes out when it comes.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::sync::oneshot;
use tokio::task::JoinSet;
use tonic::{Request, Status, Streaming};

use super::api::Api;
use super::bounds::{Calling, PeerStream, STORE_PART};
use super::status::status_of_refusal;
use crate::auth::{Grant, Role};
use crate::engine::shares::{Hold, Kind, Share};
use crate::node::Node;
use crate::proto::v1 as pb;
use crate::telemetry::{Telemetry, Trace, FUSEBOX_SERVICE};

pub use super::bounds::{MAX_STORE_FRAMES_IN_FLIGHT, MAX_STREAMS_PER_CONNECTION};

/// The most frames (or batch items) in one message.
pub const MAX_FRAMES_PER_MESSAGE: usize = 1_000;

/// The most frames of one stream unanswered at a time.
pub const MAX_UNANSWERED: usize = 10_000;

/// With a store, after each part a credential's next part waits this many
/// times as long as the part took, while another credential's calls are
/// in flight (decisions 103).
const PACE: u32 = 2;

/// With a store, a stream lets other tasks run after starting this many
/// frames.
const YIELD_EVERY: usize = 32;

/// Counts a single call of `share`'s credential while it is in flight, with
/// a store (embedded, nothing waits on the store and nothing is counted).
pub fn calling(api: &Api, share: Option<&Arc<Share>>) -> Option<Calling> {
    if !matches!(api.store, crate::engine::Store::Redis(_)) {
        return None;
    }
    Some(api.bounds.calling(share?))
}

/// Response messages queued for a slow reader before the stream stops
/// reading new frames.
const OUTBOX: usize = 64;

/// The answers of a stream, as tonic sends them.
pub type Answers = crate::outbox::Unread<Result<pb::DecideResponse, Status>>;

/// What an answer message holds in memory until it is sent, for the
/// unread bounds: its results as structs (about ten times their encoded
/// size), and their strings.
fn size_of(message: &Result<pb::DecideResponse, Status>) -> usize {
    use prost::Message;
    message.as_ref().map_or(256, |m| {
        m.encoded_len() + m.results.capacity() * std::mem::size_of::<pb::DecideResult>()
    })
}

/// One open stream counted against its connection's cap, the server's
/// (`max_decide_streams`) and its credential's share, until dropped.
struct Counted {
    node: Arc<Node>,
    _peer: Option<PeerStream>,
    share: Option<Hold>,
}

impl Counted {
    fn open(
        api: &Api,
        peer: Option<SocketAddr>,
        cap: u64,
        share: Option<Arc<Share>>,
    ) -> Result<Counted, Status> {
        let counters = api.node.counters();
        let refused = |message: String| {
            counters
                .decide_streams_refused
                .fetch_add(1, Ordering::Relaxed);
            Status::resource_exhausted(message)
        };
        let held = share
            .map(|s| s.take(Kind::DecideStreams))
            .transpose()
            .map_err(|e| refused(e.to_string()))?;
        if counters.decide_streams.fetch_add(1, Ordering::Relaxed) >= cap {
            counters.decide_streams.fetch_sub(1, Ordering::Relaxed);
            return Err(refused(format!(
                "too many Decide streams: the server's max_decide_streams cap ({cap}) is reached; \
                 send more frames on the open ones, or raise [server].max_decide_streams"
            )));
        }
        let mut counted = Counted {
            node: api.node.clone(),
            _peer: None,
            share: held,
        };
        if let Some(peer) = peer {
            match api.bounds.peer_stream(peer) {
                Some(place) => counted._peer = Some(place),
                None => {
                    drop(counted);
                    return Err(refused(format!(
                        "this connection has {MAX_STREAMS_PER_CONNECTION} Decide streams open, the most it may; \
                         send more frames on the open ones, or open another connection"
                    )));
                }
            }
        }
        Ok(counted)
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.node
            .counters()
            .decide_streams
            .fetch_sub(1, Ordering::Relaxed);
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
    let limits = api.node.limits();
    let remote = super::tls::remote_addr(&request);
    let counted = Counted::open(
        api,
        remote,
        limits.max_decide_streams,
        api.node.share_of(grant.as_deref()),
    )?;
    let credential = crate::auth::Credential::of(api.node.watch_access());
    let traced = api
        .node
        .telemetry()
        .map(|t| (t.clone(), t.parent_of(request.metadata())));
    let frames = request.into_inner();
    let (tx, rx) = crate::outbox::outbox(
        api.node.unread(),
        grant.as_deref().map(|g| g.tenant.as_str()),
        crate::outbox::Kind::Decide,
        OUTBOX,
        size_of,
        |m| Err(Status::resource_exhausted(m)),
    );
    let stream = Stream {
        api: api.clone(),
        grant,
        peer: remote.map(|a| a.ip()),
        credential,
        tx,
        waiting: JoinSet::new(),
        cancels: HashMap::new(),
        counted,
        traced,
    };
    tokio::spawn(stream.serve(frames));
    Ok(rx)
}

/// A waiting Acquire's answer, with its frame id.
type Waited = (u64, Result<pb::AcquireResponse, Status>);

/// A future on the heap, of any output.
type Boxed<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A frame's answer still to come, once started.
type Pending<'a> = Boxed<'a, pb::DecideResult>;

/// Polls `fut` once, in the calling task: its output if that is ready,
/// else the future (started: whatever it sends before its first wait has
/// gone), to be awaited later.
async fn start<T>(mut fut: Boxed<'_, T>) -> Result<T, Boxed<'_, T>> {
    match std::future::poll_fn(|cx| std::task::Poll::Ready(fut.as_mut().poll(cx))).await {
        std::task::Poll::Ready(out) => Ok(out),
        std::task::Poll::Pending => Err(fut),
    }
}

/// Awaits every future of `pending` together; their outputs, each with its
/// place, in the order they finished (the caller orders them with the
/// answers it has already).
async fn all<T>(pending: Vec<(usize, Boxed<'_, T>)>) -> Vec<(usize, T)> {
    let mut left: Vec<Option<(usize, Boxed<'_, T>)>> = pending.into_iter().map(Some).collect();
    let mut done: Vec<(usize, T)> = Vec::with_capacity(left.len());
    std::future::poll_fn(|cx| {
        for slot in left.iter_mut() {
            if let Some((at, fut)) = slot {
                if let std::task::Poll::Ready(out) = fut.as_mut().poll(cx) {
                    done.push((*at, out));
                    *slot = None;
                }
            }
        }
        if left.iter().all(Option::is_none) {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
    done
}

struct Stream {
    api: Api,
    grant: Option<Arc<Grant>>,
    /// The peer's address, a caller's name without another (Q1).
    peer: Option<std::net::IpAddr>,
    /// The credential the stream was opened with, watched (a stream whose
    /// token is removed ends).
    credential: crate::auth::Credential,
    tx: crate::outbox::Outbox<Result<pb::DecideResponse, Status>>,
    /// Acquires that wait, each on a task.
    waiting: JoinSet<Waited>,
    /// How to cancel each waiting Acquire, by frame id (taken once used).
    cancels: HashMap<u64, Option<oneshot::Sender<()>>>,
    counted: Counted,
    /// With `[telemetry]`: the caller's trace context from the stream's
    /// headers, the parent of every frame's span.
    traced: Option<(Arc<Telemetry>, opentelemetry::Context)>,
}

impl Stream {
    /// The span of frame `id` (`fusebox.frame` is `what`): [`Trace::OFF`]
    /// without `[telemetry]`.
    fn trace(&self, what: &'static str, id: u64) -> Trace {
        let Some((telemetry, parent)) = &self.traced else {
            return Trace::OFF;
        };
        let mut trace = telemetry.span(parent, FUSEBOX_SERVICE, "Decide");
        trace.attribute(|| opentelemetry::KeyValue::new("fusebox.frame", what));
        trace.attribute(|| opentelemetry::KeyValue::new("fusebox.frame_id", id as i64));
        trace
    }

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
                        // A message may be 1,000 decisions made without a
                        // wait: let the worker's other calls go next.
                        tokio::task::yield_now().await;
                    }
                    // The caller closed its sending side: it still reads, so
                    // what waits is answered, unless it goes away too.
                    Ok(None) => {
                        self.drain().await;
                        break;
                    }
                    Err(_) => break,
                },
                refusal = self.credential.lost(&mut self.grant, |g| g.needs(Role::Caller, "Decide")) => {
                    self.tx.end(Err(status_of_refusal(refusal)));
                    break;
                }
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
                refusal = self.credential.lost(&mut self.grant, |g| g.needs(Role::Caller, "Decide")) => {
                    self.tx.end(Err(status_of_refusal(refusal)));
                    return;
                }
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
        self.api
            .node
            .counters()
            .decide_answers
            .fetch_add(results.len() as u64, Ordering::Relaxed);
        self.tx.send(Ok(pb::DecideResponse { results })).await
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

    /// Starts the frames of one message, in order, each polled once before
    /// the next; returns their answers once every frame that does not wait
    /// in a queue has answered (those that do answer when they are served).
    async fn frames(&mut self, frames: Vec<pb::DecideFrame>) -> Vec<pb::DecideResult> {
        let api = self.api.clone();
        let counters = api.node.counters();
        counters
            .decide_frames
            .fetch_add(frames.len() as u64, Ordering::Relaxed);
        let grant = self.grant.clone();
        let share = self.counted.share.as_ref().map(|h| h.share().clone());
        // With a store, each frame is a command in flight to Redis: the
        // server's are bounded, so that no stream fills the link (and the
        // memory) with its frames and every other call waits behind them
        // (decisions 102). A message goes in parts of STORE_PART frames,
        // each taking its places together; streams take turns.
        let store = matches!(api.store, crate::engine::Store::Redis(_));
        let part = if store { STORE_PART } else { usize::MAX };
        let mut results = Vec::with_capacity(frames.len());
        let mut frames = frames.into_iter().enumerate().peekable();
        while frames.peek().is_some() {
            let this: Vec<_> = frames.by_ref().take(part).collect();
            // A credential's own places first (at most one part of its
            // in flight), then the server's: another credential's part
            // always finds room.
            let (own, server) = match store {
                true => {
                    let n = this.len() as u32;
                    let own = match &share {
                        Some(share) => Some(
                            share
                                .store_frames()
                                .acquire_many(n)
                                .await
                                .expect("never closed"),
                        ),
                        None => None,
                    };
                    (
                        own,
                        Some(
                            api.bounds
                                .store_frames()
                                .acquire_many(n)
                                .await
                                .expect("never closed"),
                        ),
                    )
                }
                false => (None, None),
            };
            let started = std::time::Instant::now();
            let mut pending: Vec<(usize, Pending<'_>)> = Vec::new();
            for (at, frame) in this {
                // Starting a frame on the store costs about as much as a
                // single call: others' calls get their turn between.
                if store && at % YIELD_EVERY == YIELD_EVERY - 1 {
                    tokio::task::yield_now().await;
                }
                let id = frame.id;
                if at >= MAX_FRAMES_PER_MESSAGE {
                    counters
                        .decide_frames_refused
                        .fetch_add(1, Ordering::Relaxed);
                    results.push((at, failed(
                        id,
                        &Status::resource_exhausted(format!(
                            "frames: a message may carry {MAX_FRAMES_PER_MESSAGE} frames; this one is past them and was not started: send it in the next message"
                        )),
                    )));
                    continue;
                }
                match self.frame(&api, &grant, &share, id, frame.request).await {
                    Started::Answered(result) => results.push((at, result)),
                    Started::Later(fut) => pending.push((at, fut)),
                    Started::Waiting | Started::Nothing => {}
                }
            }
            results.extend(all(pending).await);
            drop(server);
            // While another credential's calls are in flight, its parts
            // take at most a third of the time (decisions 103).
            if let (Some(share), Some(_)) = (&share, &own) {
                if api.bounds.others_calling(share) {
                    tokio::time::sleep(started.elapsed() * PACE).await;
                }
            }
            drop(own);
        }
        results.sort_unstable_by_key(|(at, _)| *at);
        results.into_iter().map(|(_, r)| r).collect()
    }

    /// Starts one frame: its answer if ready, or its answer to come (none
    /// for a Cancel, or for an Acquire that waits in a queue: its task
    /// answers).
    async fn frame<'a>(
        &mut self,
        api: &'a Api,
        grant: &'a Option<Arc<Grant>>,
        share: &'a Option<Arc<Share>>,
        id: u64,
        request: Option<pb::decide_frame::Request>,
    ) -> Started<'a> {
        use pb::decide_frame::Request as Frame;
        use pb::decide_result::Result as Answer;
        let frame = match request {
            Some(Frame::Cancel(_)) => {
                // The Acquire answers CANCELLED itself, unless its answer is
                // already there (then the answer goes, and this does nothing).
                if let Some(cancel) = self.cancels.get_mut(&id).and_then(Option::take) {
                    let _ = cancel.send(());
                }
                return Started::Nothing;
            }
            Some(frame) => frame,
            None => {
                return Started::Answered(failed(
                    id,
                    &Status::invalid_argument(
                        "request: a frame must carry acquire, complete, renew or cancel",
                    ),
                ))
            }
        };
        if self.cancels.contains_key(&id) {
            return Started::Answered(failed(
                id,
                &Status::invalid_argument(format!(
                    "id: {id} is the id of an Acquire still waiting on this stream; give each unanswered frame its own id"
                )),
            ));
        }
        if self.waiting.len() >= MAX_UNANSWERED {
            api.node
                .counters()
                .decide_frames_refused
                .fetch_add(1, Ordering::Relaxed);
            return Started::Answered(failed(
                id,
                &Status::resource_exhausted(format!(
                    "frames: this stream has {MAX_UNANSWERED} frames unanswered, the most it may; this one was not started: wait for answers, or use another stream"
                )),
            ));
        }
        let (grant, share, peer) = (grant.as_deref(), share.as_ref(), self.peer);
        let answered: Pending<'a> = match frame {
            // One that may not wait: decided at once, or its command sent.
            Frame::Acquire(req) if req.max_wait.is_none_or(|d| d.seconds == 0 && d.nanos == 0) => {
                let mut trace = self.trace("acquire", id);
                trace.key(&req.key);
                Box::pin(async move {
                    let result = api.acquire_as(grant, share, peer, req).await;
                    trace.acquired(&result);
                    match result {
                        Ok(response) => answer(id, Answer::Acquire(response)),
                        Err(status) => failed(id, &status),
                    }
                })
            }
            Frame::Acquire(req) => {
                let api = api.clone();
                let grant = self.grant.clone();
                let share = share.cloned();
                let mut trace = self.trace("acquire", id);
                trace.key(&req.key);
                let acquire: Pin<Box<dyn Future<Output = _> + Send>> = Box::pin(async move {
                    let result = api
                        .acquire_as(grant.as_deref(), share.as_ref(), peer, req)
                        .await;
                    trace.acquired(&result);
                    result
                });
                // Polled here first, so that it decides (or queues) before
                // the next frame starts; only a waiter goes to a task.
                return match start(acquire).await {
                    Ok(Ok(response)) => Started::Answered(answer(id, Answer::Acquire(response))),
                    Ok(Err(status)) => Started::Answered(failed(id, &status)),
                    Err(mut acquire) => {
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
                        Started::Waiting
                    }
                };
            }
            Frame::Complete(req) => {
                let mut trace = self.trace("complete", id);
                api.ticket_key(&mut trace, &req.ticket);
                Box::pin(async move {
                    let result = api.complete_as(grant, share, req).await;
                    trace.completed(&result);
                    match result {
                        Ok(response) => answer(id, Answer::Complete(response)),
                        Err(status) => failed(id, &status),
                    }
                })
            }
            Frame::Renew(req) => {
                let mut trace = self.trace("renew", id);
                api.ticket_key(&mut trace, &req.ticket);
                Box::pin(async move {
                    let result = api.renew_as(grant, share, req).await;
                    trace.ended(&result);
                    match result {
                        Ok(response) => answer(id, Answer::Renew(response)),
                        Err(status) => failed(id, &status),
                    }
                })
            }
            Frame::Cancel(_) => unreachable!("handled above"),
        };
        match start(answered).await {
            Ok(result) => Started::Answered(result),
            Err(later) => Started::Later(later),
        }
    }
}

/// What starting a frame gave.
enum Started<'a> {
    /// Its answer, now.
    Answered(pb::DecideResult),
    /// Its answer, to be awaited with the message's others.
    Later(Pending<'a>),
    /// An Acquire waiting in a queue, on a task of its own.
    Waiting,
    /// Nothing to answer (a Cancel).
    Nothing,
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

/// A batch: `request`'s items (`items_of`), each answered by `one` for
/// the batch's caller (its grant and share, counted as one call in
/// flight). The batch's size is checked and its items counted; each item
/// is started in order (its command sent), then the rest are awaited
/// together: one round trip per node, per-key order kept. The results are
/// in the items' order.
async fn each_in_order<B, I, T, F>(
    api: &Api,
    request: Request<B>,
    items_of: impl FnOnce(B) -> Vec<I>,
    mut one: F,
) -> Result<Vec<T>, Status>
where
    F: for<'b> FnMut(
        &'b Api,
        Option<&'b Grant>,
        Option<&'b Arc<Share>>,
        Option<std::net::IpAddr>,
        I,
    ) -> Boxed<'b, T>,
{
    let grant = api.grant(&request)?;
    let peer = super::tls::remote_addr(&request).map(|a| a.ip());
    let share = api.node.share_of(grant.as_deref());
    let _calling = calling(api, share.as_ref());
    let items = items_of(request.into_inner());
    check_items(items.len())?;
    api.node
        .counters()
        .batch_items
        .fetch_add(items.len() as u64, Ordering::Relaxed);
    let mut results = Vec::with_capacity(items.len());
    let mut pending = Vec::new();
    for (at, item) in items.into_iter().enumerate() {
        match start(one(api, grant.as_deref(), share.as_ref(), peer, item)).await {
            Ok(result) => results.push((at, result)),
            Err(later) => pending.push((at, later)),
        }
    }
    results.extend(all(pending).await);
    results.sort_unstable_by_key(|(at, _)| *at);
    Ok(results.into_iter().map(|(_, r)| r).collect())
}

/// `AcquireBatch`: each item as the unary Acquire, in order; none waits.
pub async fn acquire_batch(
    api: &Api,
    request: Request<pb::AcquireBatchRequest>,
) -> Result<pb::AcquireBatchResponse, Status> {
    use pb::acquire_result::Result as R;
    let results = each_in_order(api, request, |r| r.items, |api, grant, share, peer, item| {
        let waits = item
            .max_wait
            .is_some_and(|d| d.seconds != 0 || d.nanos != 0);
        Box::pin(async move {
            let result = if waits {
                Err(Status::invalid_argument(
                    "max_wait: a batch item does not wait; leave it out, or use Acquire or Decide to wait",
                ))
            } else {
                api.acquire_as(grant, share, peer, item).await
            };
            pb::AcquireResult {
                result: Some(match result {
                    Ok(response) => R::Response(response),
                    Err(status) => R::Error(error_of(&status)),
                }),
            }
        })
    })
    .await?;
    Ok(pb::AcquireBatchResponse { results })
}

/// `CompleteBatch`: each item as the unary Complete, in order.
pub async fn complete_batch(
    api: &Api,
    request: Request<pb::CompleteBatchRequest>,
) -> Result<pb::CompleteBatchResponse, Status> {
    use pb::complete_result::Result as R;
    let results = each_in_order(
        api,
        request,
        |r| r.items,
        |api, grant, share, _peer, item| {
            Box::pin(async move {
                pb::CompleteResult {
                    result: Some(match api.complete_as(grant, share, item).await {
                        Ok(response) => R::Response(response),
                        Err(status) => R::Error(error_of(&status)),
                    }),
                }
            })
        },
    )
    .await?;
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

//! What a long-lived stream (Decide, Watch, the dashboard's event stream)
//! has answered and its client has not read yet (issue 18, decisions 101).
//!
//! Bounded per stream, in messages and in bytes, and per server in bytes
//! (`[server] max_unread_bytes`, `max_unread_bytes_per_stream`): a stream
//! whose answers reach a bound waits before it makes more, which stops it
//! reading its client's requests (back-pressure). One that waits past
//! `[server] stuck_stream_timeout` is ended: what it had not delivered is
//! dropped, the stream's last message is the error it ends with, and it
//! is counted in `fusebox_streams_stuck_total{stream}`.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

/// The streams an outbox serves, for the figures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `Fusebox.Decide`.
    Decide = 0,
    /// `Admin.Watch`.
    Watch = 1,
    /// The dashboard's `GET /api/events`.
    Events = 2,
}

impl Kind {
    /// Every kind, in index order.
    pub const ALL: [Kind; 3] = [Kind::Decide, Kind::Watch, Kind::Events];

    /// Its label in `/metrics`.
    pub fn label(self) -> &'static str {
        match self {
            Kind::Decide => "decide",
            Kind::Watch => "watch",
            Kind::Events => "events",
        }
    }
}

/// One server's budget of unread bytes and its figures, shared by all its
/// streams ([`crate::node::Node`] holds it).
#[derive(Debug)]
pub struct Budget {
    bytes: Arc<Semaphore>,
    /// `[server] max_unread_bytes`.
    pub limit: u64,
    /// `[server] max_unread_bytes_per_stream`.
    pub per_stream: u64,
    stuck_after: Duration,
    unread: AtomicU64,
    stuck: [AtomicU64; 3],
}

/// The bounds on answers not yet read (`[server]`), validated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Unread stream answers, in bytes, server-wide.
    pub max_unread_bytes: u64,
    /// The same, per stream.
    pub max_unread_bytes_per_stream: u64,
    /// How long a stream may wait for its client to read, in ms.
    pub stuck_stream_timeout: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_unread_bytes: 32 << 20,
            max_unread_bytes_per_stream: 1 << 20,
            stuck_stream_timeout: 30_000,
        }
    }
}

impl Budget {
    /// The budget of a server with the bounds `limits`.
    pub fn new(limits: &Limits) -> Budget {
        Budget {
            bytes: Arc::new(Semaphore::new(limits.max_unread_bytes as usize)),
            limit: limits.max_unread_bytes,
            per_stream: limits.max_unread_bytes_per_stream,
            stuck_after: Duration::from_millis(limits.stuck_stream_timeout),
            unread: AtomicU64::new(0),
            stuck: Default::default(),
        }
    }

    /// Bytes answered and not yet read, server-wide.
    pub fn unread(&self) -> u64 {
        self.unread.load(Ordering::Relaxed)
    }

    /// Streams of `kind` ended because their client did not read.
    pub fn stuck(&self, kind: Kind) -> u64 {
        self.stuck[kind as usize].load(Ordering::Relaxed)
    }
}

/// A message's share of the budgets, given back when it is read.
struct Held {
    _message: OwnedSemaphorePermit,
    _stream: OwnedSemaphorePermit,
    _server: OwnedSemaphorePermit,
    bytes: u64,
    budget: Arc<Budget>,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.budget.unread.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

struct State<T> {
    queue: VecDeque<(T, Held)>,
    /// The last message, once the stream is ended.
    last: Option<T>,
    ended: bool,
    sender_gone: bool,
    reader: Option<Waker>,
}

struct Shared<T> {
    state: Mutex<State<T>>,
    /// Told when the reader goes away.
    reader_gone: Notify,
    reader_dropped: std::sync::atomic::AtomicBool,
}

/// The sending side: one per stream, held by the task that answers it.
pub struct Outbox<T> {
    shared: Arc<Shared<T>>,
    messages: Arc<Semaphore>,
    bytes: Arc<Semaphore>,
    budget: Arc<Budget>,
    kind: Kind,
    size: fn(&T) -> usize,
    stuck: fn(String) -> T,
}

/// The reading side, a `Stream` of the messages in order, then the last.
pub struct Unread<T> {
    shared: Arc<Shared<T>>,
}

/// A stream's outbox of at most `messages` unread messages, under its
/// server's `budget`; `size` measures a message, `stuck` makes the message
/// a stuck stream ends with.
pub fn outbox<T>(
    budget: &Arc<Budget>,
    kind: Kind,
    messages: usize,
    size: fn(&T) -> usize,
    stuck: fn(String) -> T,
) -> (Outbox<T>, Unread<T>) {
    let budget = budget.clone();
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            queue: VecDeque::new(),
            last: None,
            ended: false,
            sender_gone: false,
            reader: None,
        }),
        reader_gone: Notify::new(),
        reader_dropped: std::sync::atomic::AtomicBool::new(false),
    });
    (
        Outbox {
            shared: shared.clone(),
            messages: Arc::new(Semaphore::new(messages.max(1))),
            bytes: Arc::new(Semaphore::new(budget.per_stream as usize)),
            budget,
            kind,
            size,
            stuck,
        },
        Unread { shared },
    )
}

impl<T> Outbox<T> {
    /// Queues `message` once it fits the bounds; false when the stream is
    /// over (its reader went away, or it was stuck and is now ended).
    pub async fn send(&self, message: T) -> bool {
        let bytes = (self.size)(&message);
        self.send_sized(message, bytes).await
    }

    /// [`Outbox::send`] of a message of `bytes` bytes, measured by the caller.
    pub async fn send_sized(&self, message: T, bytes: usize) -> bool {
        let bytes = (bytes as u64).clamp(1, self.budget.per_stream) as u32;
        let take = async {
            let one = self.messages.clone().acquire_owned().await.ok()?;
            let mine = self.bytes.clone().acquire_many_owned(bytes).await.ok()?;
            let server = self
                .budget
                .bytes
                .clone()
                .acquire_many_owned(bytes)
                .await
                .ok()?;
            Some((one, mine, server))
        };
        let taken = tokio::select! {
            taken = tokio::time::timeout(self.budget.stuck_after, take) => taken,
            () = self.closed() => return false,
        };
        match taken {
            Ok(Some((one, mine, server))) => {
                let held = Held {
                    _message: one,
                    _stream: mine,
                    _server: server,
                    bytes: u64::from(bytes),
                    budget: self.budget.clone(),
                };
                self.budget
                    .unread
                    .fetch_add(u64::from(bytes), Ordering::Relaxed);
                let mut state = self.shared.state.lock().expect("outbox");
                if state.ended {
                    return false;
                }
                state.queue.push_back((message, held));
                if let Some(reader) = state.reader.take() {
                    reader.wake();
                }
                true
            }
            Ok(None) => false,
            Err(_) => {
                self.budget.stuck[self.kind as usize].fetch_add(1, Ordering::Relaxed);
                let waited = self.budget.stuck_after;
                tracing::warn!(
                    stream = self.kind.label(),
                    "a stream's client read nothing for {waited:?} with answers waiting: the stream is ended (RESOURCE_EXHAUSTED) and its unread answers dropped"
                );
                self.end_now((self.stuck)(format!(
                    "this stream's answers were not read for {} ms, with {} bytes unread: it is ended; read a stream's answers as they come, or raise [server] stuck_stream_timeout",
                    waited.as_millis(),
                    self.unread_here(),
                )));
                false
            }
        }
    }

    /// Bytes of this stream's answers not yet read.
    fn unread_here(&self) -> u64 {
        self.budget.per_stream - self.bytes.available_permits() as u64
    }

    /// Ends the stream after what it has queued: `last` is its last message.
    pub fn end(&self, last: T) {
        let _kept = self.finish(last, false);
    }

    /// Ends the stream at once: what it had not delivered is dropped, and
    /// `last` is its last message.
    fn end_now(&self, last: T) {
        drop(self.finish(last, true));
    }

    /// Marks the stream ended with `last`; returns what it had queued when
    /// `drop_queued` (to be dropped outside the lock).
    fn finish(&self, last: T, drop_queued: bool) -> VecDeque<(T, Held)> {
        let mut state = self.shared.state.lock().expect("outbox");
        if state.ended {
            return VecDeque::new();
        }
        state.ended = true;
        state.last = Some(last);
        if let Some(reader) = state.reader.take() {
            reader.wake();
        }
        match drop_queued {
            true => std::mem::take(&mut state.queue),
            false => VecDeque::new(),
        }
    }

    /// Resolves once the reader went away.
    pub async fn closed(&self) {
        loop {
            let notified = self.shared.reader_gone.notified();
            if self.shared.reader_dropped.load(Ordering::Acquire) {
                return;
            }
            notified.await;
        }
    }
}

impl<T> Drop for Outbox<T> {
    fn drop(&mut self) {
        let mut state = self.shared.state.lock().expect("outbox");
        state.sender_gone = true;
        if let Some(reader) = state.reader.take() {
            reader.wake();
        }
    }
}

impl<T> Drop for Unread<T> {
    fn drop(&mut self) {
        self.shared.reader_dropped.store(true, Ordering::Release);
        self.shared.reader_gone.notify_waiters();
        let dropped = std::mem::take(&mut self.shared.state.lock().expect("outbox").queue);
        drop(dropped);
    }
}

impl<T> futures_util::Stream for Unread<T> {
    type Item = T;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let mut state = self.shared.state.lock().expect("outbox");
        if let Some((message, held)) = state.queue.pop_front() {
            drop(state);
            drop(held);
            return Poll::Ready(Some(message));
        }
        if let Some(last) = state.last.take() {
            return Poll::Ready(Some(last));
        }
        if state.ended || state.sender_gone {
            return Poll::Ready(None);
        }
        // `last` goes after the queue: taken only once the queue is empty.
        state.reader = Some(cx.waker().clone());
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;

    fn limits(per_stream: u64, stuck_ms: u64) -> Limits {
        Limits {
            max_unread_bytes: 1 << 30,
            max_unread_bytes_per_stream: per_stream,
            stuck_stream_timeout: stuck_ms,
        }
    }

    #[tokio::test]
    async fn messages_come_in_order_and_the_sender_waits_at_the_bound() {
        let budget = Arc::new(Budget::new(&limits(1 << 20, 30_000)));
        let (tx, mut rx) = outbox::<String>(&budget, Kind::Watch, 2, String::len, |m| m);
        assert!(tx.send("one".into()).await);
        assert!(tx.send("two".into()).await);
        // A third waits for the reader.
        let third = tokio::spawn(async move {
            let sent = tx.send("three".into()).await;
            (sent, tx)
        });
        tokio::task::yield_now().await;
        assert!(!third.is_finished());
        assert_eq!(rx.next().await.as_deref(), Some("one"));
        let (sent, tx) = third.await.unwrap();
        assert!(sent);
        drop(tx);
        let rest: Vec<String> = rx.collect().await;
        assert_eq!(rest, ["two", "three"]);
    }
}

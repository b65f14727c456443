//! What a long-lived stream (Decide, Watch, the dashboard's event stream)
//! has answered and its client has not read yet (issue 18, decisions 101).
//!
//! Bounded per stream, in messages and in bytes, per credential and per
//! server in bytes (`[server] max_unread_bytes`,
//! `max_unread_bytes_per_stream`; a credential's [`Part`], decisions 149):
//! a stream whose answers reach a bound waits before it makes more, which
//! stops it reading its client's requests (back-pressure). A credential
//! holds at most its part of the server's bytes, so that another
//! credential's streams always find room. A stream whose client reads
//! none of the answers it already has for `[server] stuck_stream_timeout`
//! is ended: what it had not delivered is dropped, the stream's last
//! message is the error it ends with, and it is counted in
//! `fusebox_streams_stuck_total{stream}`. Time spent waiting for room that
//! other streams hold, with nothing of its own unread, is not its stall.

use std::collections::{HashMap, HashSet, VecDeque};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::engine::shares::Tenants;
use crate::log_gate::LogGate;

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
/// streams ([`crate::node::Node`] holds it), with each credential's part.
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
    /// Each credential's part (the name its share goes by), set by
    /// [`Budget::adopt`].
    parts: RwLock<HashMap<Arc<str>, Arc<Part>>>,
    /// The part of streams without a credential: the whole budget without
    /// `[auth]` (one anonymous caller), else a default part.
    anonymous: Arc<Part>,
}

/// One credential's part of the server's unread bytes: what its streams'
/// answers may hold at once, so that it never takes the others' room.
#[derive(Debug)]
pub struct Part {
    name: Arc<str>,
    limit: AtomicU64,
    /// Whether its entry's `limits.max_unread_bytes` set the limit.
    explicit: AtomicBool,
    held: Mutex<u64>,
    /// Told when bytes are given back.
    freed: Notify,
    waits: AtomicU64,
    logged: LogGate,
}

impl Part {
    fn new(name: &str, limit: u64) -> Part {
        Part {
            name: Arc::from(name),
            limit: AtomicU64::new(limit),
            explicit: AtomicBool::new(false),
            held: Mutex::new(0),
            freed: Notify::new(),
            waits: AtomicU64::new(0),
            logged: LogGate::default(),
        }
    }

    /// The credential's name (empty for streams without one).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The most bytes its streams' answers may hold unread.
    pub fn limit(&self) -> u64 {
        self.limit.load(Ordering::Relaxed)
    }

    /// Bytes of its streams' answers not yet read.
    pub fn held(&self) -> u64 {
        *self.held.lock().expect("unread part")
    }

    /// Answers of its streams that waited because it held all its part.
    pub fn waits(&self) -> u64 {
        self.waits.load(Ordering::Relaxed)
    }

    /// `bytes` more, if they fit: under the limit, or alone (a limit
    /// lowered by a reload under one message never stops a stream).
    fn try_take(&self, bytes: u64) -> bool {
        let mut held = self.held.lock().expect("unread part");
        let fits = *held == 0 || held.saturating_add(bytes) <= self.limit();
        if fits {
            *held += bytes;
        }
        fits
    }

    /// `bytes` of the part, once they fit; counted and logged (at most
    /// once a second) when they have to wait.
    async fn take(self: &Arc<Self>, bytes: u64) -> PartHeld {
        let mut counted = false;
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if self.try_take(bytes) {
                return PartHeld {
                    part: self.clone(),
                    bytes,
                };
            }
            if !counted {
                counted = true;
                self.waits.fetch_add(1, Ordering::Relaxed);
                if let Some(held_back) = self.logged.pass() {
                    let limit = self.limit();
                    let set_by = match self.explicit.load(Ordering::Relaxed) {
                        true => "its entry's limits.max_unread_bytes",
                        false => "its part of [server] max_unread_bytes",
                    };
                    tracing::warn!(
                        credential = %self.name,
                        limit,
                        similar_held_back = held_back,
                        "the clients of credential {:?} leave {} bytes of stream answers unread, all {set_by} ({limit}): its streams wait for their clients to read before they answer more; other credentials' streams are not held up",
                        &*self.name,
                        self.held(),
                    );
                }
            }
            freed.await;
        }
    }

    fn give(&self, bytes: u64) {
        {
            let mut held = self.held.lock().expect("unread part");
            *held = held.saturating_sub(bytes);
        }
        self.freed.notify_waiters();
    }
}

/// Bytes of a credential's part, given back when dropped.
struct PartHeld {
    part: Arc<Part>,
    bytes: u64,
}

impl Drop for PartHeld {
    fn drop(&mut self) {
        self.part.give(self.bytes);
    }
}

/// `fraction` of `cap`, rounded down (the parts of the tenants then add up
/// to no more than the cap), at least 1.
fn part_of(cap: u64, fraction: f64) -> u64 {
    ((cap as f64 * fraction).floor() as u64).clamp(1, cap.max(1))
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
    /// Until [`Budget::adopt`] says otherwise, every stream is of one
    /// anonymous caller, who may hold all of it.
    pub fn new(limits: &Limits) -> Budget {
        Budget {
            bytes: Arc::new(Semaphore::new(limits.max_unread_bytes as usize)),
            limit: limits.max_unread_bytes,
            per_stream: limits.max_unread_bytes_per_stream,
            stuck_after: Duration::from_millis(limits.stuck_stream_timeout),
            unread: AtomicU64::new(0),
            stuck: Default::default(),
            parts: RwLock::new(HashMap::new()),
            anonymous: Arc::new(Part::new("", limits.max_unread_bytes)),
        }
    }

    /// Sets each credential's part from `tenants` (`None`: no `[auth]`,
    /// one anonymous caller with all of it): its entry's
    /// `limits.max_unread_bytes`, else `[auth] share` of the budget,
    /// rounded down. Entries of one tenant share the first one's part; a
    /// part keeps what it holds, and one that left is dropped once it
    /// holds nothing.
    pub fn adopt(&self, tenants: Option<&Tenants>) {
        let mut parts = self.parts.write().expect("unread parts");
        let Some(tenants) = tenants else {
            parts.retain(|_, p| p.held() > 0);
            self.anonymous.limit.store(self.limit, Ordering::Relaxed);
            return;
        };
        let default = part_of(self.limit, tenants.fraction);
        self.anonymous.limit.store(default, Ordering::Relaxed);
        let mut named = HashSet::new();
        for (name, allowance) in &tenants.entries {
            if !named.insert(name.as_str()) {
                continue;
            }
            let part = parts
                .entry(Arc::from(name.as_str()))
                .or_insert_with(|| Arc::new(Part::new(name, default)));
            let (limit, explicit) = match allowance.max_unread_bytes {
                Some(limit) => (limit, true),
                None => (default, false),
            };
            part.limit.store(limit, Ordering::Relaxed);
            part.explicit.store(explicit, Ordering::Relaxed);
            // A part freed may now fit more: its waiters look again.
            part.freed.notify_waiters();
        }
        parts.retain(|name, p| named.contains(&**name) || p.held() > 0);
        let total = named
            .iter()
            .filter_map(|name| parts.get(*name))
            .map(|p| p.limit())
            .fold(0u64, u64::saturating_add);
        if total > self.limit {
            tracing::warn!(
                cap = "max_unread_bytes",
                limit = self.limit,
                shares = total,
                tenants = named.len(),
                "the tenants' parts of [server].max_unread_bytes add up to {total} bytes, more than the cap of {}: the streams of some tenants can take the room of others; lower their limits.max_unread_bytes or [auth] share, or raise the cap",
                self.limit
            );
        }
    }

    /// The part of the credential named `name` (its share's name), or the
    /// anonymous one (no credential, or one a reload removed).
    pub fn part(&self, name: Option<&str>) -> Arc<Part> {
        name.and_then(|n| self.parts.read().expect("unread parts").get(n).cloned())
            .unwrap_or_else(|| self.anonymous.clone())
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
    _part: PartHeld,
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
    /// Since when the reader has read none of the answers queued (the
    /// last read, or the first answer queued after the queue was empty);
    /// `None` while nothing waits for it.
    unread_since: Option<Instant>,
}

struct Shared<T> {
    state: Mutex<State<T>>,
    /// Told when the reader goes away.
    reader_gone: Notify,
    reader_dropped: AtomicBool,
    /// Told when an answer is queued behind none.
    queued: Notify,
}

/// The sending side: one per stream, held by the task that answers it.
pub struct Outbox<T> {
    shared: Arc<Shared<T>>,
    messages: Arc<Semaphore>,
    bytes: Arc<Semaphore>,
    budget: Arc<Budget>,
    part: Arc<Part>,
    kind: Kind,
    size: fn(&T) -> usize,
    stuck: fn(String) -> T,
}

/// The reading side, a `Stream` of the messages in order, then the last.
pub struct Unread<T> {
    shared: Arc<Shared<T>>,
}

/// A stream's outbox of at most `messages` unread messages, under its
/// server's `budget` and the part of the credential `credential` (the
/// name its share goes by; `None` without one); `size` measures a
/// message, `stuck` makes the message a stuck stream ends with.
pub fn outbox<T>(
    budget: &Arc<Budget>,
    credential: Option<&str>,
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
            unread_since: None,
        }),
        reader_gone: Notify::new(),
        reader_dropped: AtomicBool::new(false),
        queued: Notify::new(),
    });
    let part = budget.part(credential);
    (
        Outbox {
            shared: shared.clone(),
            messages: Arc::new(Semaphore::new(messages.max(1))),
            bytes: Arc::new(Semaphore::new(budget.per_stream as usize)),
            budget,
            part,
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
    ///
    /// It waits for room in its stream, then in its credential's part,
    /// then in the server's budget. The stream is ended as stuck only when
    /// its client reads none of the answers already queued for
    /// `stuck_stream_timeout`, whichever bound it waits at: waiting for
    /// room that other streams hold is not its client's stall.
    pub async fn send_sized(&self, message: T, bytes: usize) -> bool {
        let most = self.budget.per_stream.min(self.part.limit()).max(1);
        let bytes = (bytes as u64).clamp(1, most) as u32;
        let take = async {
            let one = self.messages.clone().acquire_owned().await.ok()?;
            let mine = self.bytes.clone().acquire_many_owned(bytes).await.ok()?;
            let part = self.part.take(u64::from(bytes)).await;
            let server = self
                .budget
                .bytes
                .clone()
                .acquire_many_owned(bytes)
                .await
                .ok()?;
            Some((one, mine, part, server))
        };
        let taken = tokio::select! {
            taken = take => taken,
            () = self.closed() => return false,
            () = self.stalled() => {
                self.end_stuck();
                return false;
            }
        };
        let Some((one, mine, part, server)) = taken else {
            return false;
        };
        let held = Held {
            _message: one,
            _stream: mine,
            _part: part,
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
        if state.queue.is_empty() {
            state.unread_since = Some(Instant::now());
            self.shared.queued.notify_waiters();
        }
        state.queue.push_back((message, held));
        if let Some(reader) = state.reader.take() {
            reader.wake();
        }
        true
    }

    /// Resolves once the reader has read none of the answers queued for
    /// `stuck_stream_timeout`; never while nothing of this stream waits
    /// for it.
    async fn stalled(&self) {
        loop {
            let queued = self.shared.queued.notified();
            tokio::pin!(queued);
            queued.as_mut().enable();
            let since = self.shared.state.lock().expect("outbox").unread_since;
            match since {
                None => queued.await,
                Some(since) => {
                    tokio::time::sleep_until(since + self.budget.stuck_after).await;
                    let now = self.shared.state.lock().expect("outbox").unread_since;
                    if now == Some(since) {
                        return;
                    }
                }
            }
        }
    }

    /// Ends the stream whose client stopped reading: counted, logged, its
    /// unread answers dropped.
    fn end_stuck(&self) {
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
            true => {
                state.unread_since = None;
                std::mem::take(&mut state.queue)
            }
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
        let dropped = {
            let mut state = self.shared.state.lock().expect("outbox");
            state.unread_since = None;
            std::mem::take(&mut state.queue)
        };
        drop(dropped);
    }
}

impl<T> futures_util::Stream for Unread<T> {
    type Item = T;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let mut state = self.shared.state.lock().expect("outbox");
        if let Some((message, held)) = state.queue.pop_front() {
            // A read: the client is not stalled, whatever still waits.
            state.unread_since = (!state.queue.is_empty()).then(Instant::now);
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
        let (tx, mut rx) = outbox::<String>(&budget, None, Kind::Watch, 2, String::len, |m| m);
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

    fn small(stuck_ms: u64) -> Arc<Budget> {
        Arc::new(Budget::new(&Limits {
            max_unread_bytes: 1000,
            max_unread_bytes_per_stream: 1000,
            stuck_stream_timeout: stuck_ms,
        }))
    }

    fn two_tenants(budget: &Budget) {
        budget.adopt(Some(&Tenants {
            entries: vec![
                ("a".into(), Default::default()),
                ("b".into(), Default::default()),
            ],
            fraction: 0.5,
        }));
    }

    fn text(n: usize) -> String {
        "x".repeat(n)
    }

    #[tokio::test]
    async fn waiting_for_room_that_other_streams_hold_is_not_a_stall() {
        let budget = small(100);
        // One stream whose client reads nothing holds the whole budget.
        let (full, mut full_rx) =
            outbox::<String>(&budget, None, Kind::Decide, 64, String::len, |m| m);
        assert!(full.send(text(1000)).await);
        // Another, read at once, waits for room past the stuck timeout
        // and is not ended.
        let (reading, reading_rx) =
            outbox::<String>(&budget, None, Kind::Decide, 64, String::len, |m| m);
        let read = tokio::spawn(reading_rx.collect::<Vec<String>>());
        let mut send = Box::pin(reading.send(text(10)));
        assert!(
            tokio::time::timeout(Duration::from_millis(400), &mut send)
                .await
                .is_err(),
            "still waiting for room, not ended"
        );
        assert_eq!(budget.stuck(Kind::Decide), 0);
        // Room comes when the other client reads.
        assert_eq!(full_rx.next().await.map(|m| m.len()), Some(1000));
        assert!(send.await);
        drop(reading);
        assert_eq!(read.await.unwrap(), [text(10)]);
    }

    #[tokio::test]
    async fn a_credential_holds_its_part_and_another_finds_room() {
        let budget = small(30_000);
        two_tenants(&budget);
        assert_eq!(budget.part(Some("a")).limit(), 500);
        let (a, _a_rx) = outbox::<String>(&budget, Some("a"), Kind::Decide, 64, String::len, |m| m);
        assert!(a.send(text(500)).await);
        let mut more = Box::pin(a.send(text(10)));
        assert!(
            tokio::time::timeout(Duration::from_millis(50), &mut more)
                .await
                .is_err(),
            "a waits at its part"
        );
        assert_eq!(budget.part(Some("a")).waits(), 1);
        let (b, mut b_rx) =
            outbox::<String>(&budget, Some("b"), Kind::Decide, 64, String::len, |m| m);
        assert!(b.send(text(500)).await, "b finds room at once");
        assert_eq!(budget.part(Some("b")).held(), 500);
        assert_eq!(budget.unread(), 1000);
        b_rx.next().await;
        assert_eq!(budget.part(Some("b")).held(), 0);
        // Without [auth] the one anonymous caller may hold all of it.
        budget.adopt(None);
        assert_eq!(budget.part(None).limit(), 1000);
    }

    #[tokio::test]
    async fn a_stream_over_its_part_with_its_own_answers_unread_is_ended() {
        let budget = small(100);
        two_tenants(&budget);
        let (a, mut a_rx) =
            outbox::<String>(&budget, Some("a"), Kind::Decide, 64, String::len, |m| m);
        assert!(a.send(text(400)).await);
        // Its client reads none of the 400 bytes: waiting at its part,
        // the stream is ended as stuck.
        assert!(!a.send(text(200)).await);
        assert_eq!(budget.stuck(Kind::Decide), 1);
        assert_eq!(budget.part(Some("a")).held(), 0);
        assert_eq!(
            a_rx.next().await.as_deref().map(|m| m.contains("not read")),
            Some(true)
        );
    }
}

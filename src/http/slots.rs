//! The HTTP port's connection slots (`[server] max_http_connections`).
//!
//! A browser keeps its connections open between requests (keep-alive), and
//! so can anyone who wants to use the slots up. When every slot is taken,
//! a new connection closes the oldest connection that is idle (open, but
//! serving no request and streaming no answer) and takes its slot; only
//! when none is idle is the new one refused. So idle sockets cannot keep
//! an operator's dashboard out, and a dashboard's event stream, which is
//! never idle, is never closed for room.
//!
//! The slots and their figures are one server's ([`Slots`], in its HTTP
//! side's state): two servers in one process count apart.

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, ReadBuf};

/// One open HTTP connection, as the slots see it.
#[derive(Debug, Default)]
struct Open {
    /// Requests being served, answers still being sent.
    busy: AtomicU64,
    /// Asked to close, to make room.
    evicted: AtomicBool,
    /// Woken when asked to close while it waits to read.
    waker: futures_util::task::AtomicWaker,
}

/// One server's HTTP connection slots: the open connections, oldest
/// first, and their figures.
#[derive(Debug, Default)]
pub struct Slots {
    open: Mutex<VecDeque<Weak<Open>>>,
    /// Open HTTP connections.
    connections: AtomicU64,
    /// HTTP connections closed at once because the cap was reached and
    /// none was idle.
    refused: AtomicU64,
    /// Idle HTTP connections closed to make room for a new one.
    idle_closed: AtomicU64,
}

/// The figures of the slots, for the metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlotFigures {
    /// Open HTTP connections.
    pub connections: u64,
    /// HTTP connections closed at once because the cap was reached and
    /// none was idle.
    pub refused: u64,
    /// Idle HTTP connections closed to make room for a new one.
    pub idle_closed: u64,
}

impl Slots {
    /// The figures now.
    pub fn figures(&self) -> SlotFigures {
        SlotFigures {
            connections: self.connections.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
            idle_closed: self.idle_closed.load(Ordering::Relaxed),
        }
    }
}

/// One of the `max_http_connections` slots, given back when dropped.
pub struct HttpSlot {
    open: Arc<Open>,
    slots: Arc<Slots>,
}

impl HttpSlot {
    /// A slot of `slots`, or `None` (counted, and logged now and then)
    /// when all `cap` slots are taken by connections that are not idle.
    pub fn take(slots: &Arc<Slots>, cap: u64) -> Option<HttpSlot> {
        let figures = &**slots;
        let taken = figures
            .connections
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < cap).then_some(n + 1)
            });
        let mut open = slots.open.lock().unwrap_or_else(|e| e.into_inner());
        open.retain(|o| o.strong_count() > 0);
        if taken.is_err() {
            // Every slot is taken: close the oldest idle connection, and
            // take its slot (it gives it back as it closes).
            let idle = open.iter().position(|o| {
                o.upgrade().is_some_and(|o| {
                    o.busy.load(Ordering::Acquire) == 0 && !o.evicted.load(Ordering::Acquire)
                })
            });
            let Some(at) = idle else {
                drop(open);
                refused(slots, cap);
                return None;
            };
            if let Some(oldest) = open.remove(at).and_then(|o| o.upgrade()) {
                oldest.evicted.store(true, Ordering::Release);
                oldest.waker.wake();
            }
            figures.connections.fetch_add(1, Ordering::Relaxed);
            figures.idle_closed.fetch_add(1, Ordering::Relaxed);
        }
        let slot = Arc::new(Open::default());
        open.push_back(Arc::downgrade(&slot));
        Some(HttpSlot {
            open: slot,
            slots: slots.clone(),
        })
    }

    /// Marks the connection busy until the guard is dropped: from a
    /// request's arrival to the end of its answer's body.
    pub fn busy(&self) -> Busy {
        self.open.busy.fetch_add(1, Ordering::AcqRel);
        Busy(self.open.clone())
    }

    /// `stream`, reading as ended once this connection is asked to close.
    pub fn wrap<S>(&self, stream: S) -> Evictable<S> {
        Evictable {
            stream,
            open: self.open.clone(),
        }
    }
}

fn refused(slots: &Slots, cap: u64) {
    if let Some(n) = crate::connections::seldom(&slots.refused, 1) {
        tracing::warn!(
            cap,
            refused = n,
            "refusing an HTTP connection: [server] max_http_connections ({cap}) are open and none is idle; raise it (and the open-file limit) if they are real viewers"
        );
    }
}

impl Drop for HttpSlot {
    fn drop(&mut self) {
        self.slots.connections.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A connection busy with a request ([`HttpSlot::busy`]).
pub struct Busy(Arc<Open>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A connection's stream that reads as ended once the connection is
/// asked to close to make room ([`HttpSlot::take`]).
pub struct Evictable<S> {
    stream: S,
    open: Arc<Open>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Evictable<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.open.waker.register(cx.waker());
        if self.open.evicted.load(Ordering::Acquire) {
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

crate::connections::write_through!(Evictable, stream);

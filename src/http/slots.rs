//! The HTTP port's connection slots (`[server] max_http_connections`).
//!
//! A browser keeps its connections open between requests (keep-alive), and
//! so can anyone who wants to use the slots up. When every slot is taken,
//! a new connection closes the oldest connection that is idle (open, but
//! serving no request and streaming no answer) and takes its slot; only
//! when none is idle is the new one refused. So idle sockets cannot keep
//! an operator's dashboard out, and a dashboard's event stream, which is
//! never idle, is never closed for room.

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, ReadBuf};

use crate::connections::FIGURES;

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

/// The open connections, oldest first.
static OPEN: Mutex<VecDeque<Weak<Open>>> = Mutex::new(VecDeque::new());

/// One of the `max_http_connections` slots, given back when dropped.
pub struct HttpSlot(Arc<Open>);

impl HttpSlot {
    /// A slot, or `None` (counted, and logged now and then) when every slot
    /// is taken by a connection that is not idle.
    pub fn take(cap: u64) -> Option<HttpSlot> {
        let figures = &FIGURES;
        let taken =
            figures
                .http_connections
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                    (n < cap).then_some(n + 1)
                });
        let mut open = OPEN.lock().unwrap_or_else(|e| e.into_inner());
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
                refused(cap);
                return None;
            };
            if let Some(oldest) = open.remove(at).and_then(|o| o.upgrade()) {
                oldest.evicted.store(true, Ordering::Release);
                oldest.waker.wake();
            }
            figures.http_connections.fetch_add(1, Ordering::Relaxed);
            figures.http_idle_closed.fetch_add(1, Ordering::Relaxed);
        }
        let slot = Arc::new(Open::default());
        open.push_back(Arc::downgrade(&slot));
        Some(HttpSlot(slot))
    }

    /// Marks the connection busy until the guard is dropped: from a
    /// request's arrival to the end of its answer's body.
    pub fn busy(&self) -> Busy {
        self.0.busy.fetch_add(1, Ordering::AcqRel);
        Busy(self.0.clone())
    }

    /// `stream`, reading as ended once this connection is asked to close.
    pub fn wrap<S>(&self, stream: S) -> Evictable<S> {
        Evictable {
            stream,
            open: self.0.clone(),
        }
    }
}

fn refused(cap: u64) {
    let n = FIGURES
        .http_connections_refused
        .fetch_add(1, Ordering::Relaxed)
        + 1;
    if n.is_power_of_two() {
        tracing::warn!(
            cap,
            refused = n,
            "refusing an HTTP connection: [server] max_http_connections ({cap}) are open and none is idle; raise it (and the open-file limit) if they are real viewers"
        );
    }
}

impl Drop for HttpSlot {
    fn drop(&mut self) {
        FIGURES.http_connections.fetch_sub(1, Ordering::Relaxed);
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

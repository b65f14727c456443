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
//! A connection is busy from a request's arrival until its answer is
//! written to the socket (flushed), not merely taken by hyper: a client
//! that asks and never reads keeps its connection busy, so it is never
//! closed for room, and cannot open more than the cap either. Instead an
//! answer that waits `[server] http_write_timeout` for its peer to read
//! any of it closes the connection. A connection closed for room, or
//! for a stalled answer, closes both ways at once: reads end, writes fail,
//! and its socket is freed even with an answer still unwritten.
//!
//! The slots and their figures are one server's ([`Slots`], in its HTTP
//! side's state): two servers in one process count apart.

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// One open HTTP connection, as the slots see it.
#[derive(Debug, Default)]
struct Open {
    /// Requests being served, answers not yet written to the socket.
    busy: AtomicU64,
    /// Answers taken whole by hyper, not yet flushed: each still counts
    /// in `busy` until the next flush.
    unflushed: AtomicU64,
    /// Asked to close, to make room.
    evicted: AtomicBool,
    /// Woken when asked to close while it waits to read or write.
    waker: futures_util::task::AtomicWaker,
    /// Told when asked to close before its stream is wrapped (during
    /// its TLS handshake).
    closing: tokio::sync::Notify,
    /// Ends once the connection is gone, for the one it makes room for.
    gone: Mutex<Option<tokio::sync::oneshot::Receiver<()>>>,
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
    /// HTTP connections closed because their peer read nothing of an
    /// answer for `http_write_timeout`.
    write_timed_out: AtomicU64,
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
    /// HTTP connections closed because their peer read nothing of an
    /// answer for `http_write_timeout`.
    pub write_timed_out: u64,
}

impl Slots {
    /// The figures now.
    pub fn figures(&self) -> SlotFigures {
        SlotFigures {
            connections: self.connections.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
            idle_closed: self.idle_closed.load(Ordering::Relaxed),
            write_timed_out: self.write_timed_out.load(Ordering::Relaxed),
        }
    }
}

/// One of the `max_http_connections` slots, given back when dropped.
pub struct HttpSlot {
    open: Arc<Open>,
    slots: Arc<Slots>,
    /// Dropped with the slot: the connection is gone.
    _gone: tokio::sync::oneshot::Sender<()>,
    /// The connection closed to make room for this one, until it is gone.
    making_room: Option<tokio::sync::oneshot::Receiver<()>>,
}

impl HttpSlot {
    /// A slot of `slots`, or `None` (counted, and logged now and then)
    /// when all `cap` slots are taken by connections that are not idle.
    /// Past the cap, the oldest idle connection is asked to close and
    /// this one takes its slot: [`HttpSlot::room`] waits until it is gone.
    pub fn take(slots: &Arc<Slots>, cap: u64) -> Option<HttpSlot> {
        let figures = &**slots;
        let taken = figures
            .connections
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < cap).then_some(n + 1)
            });
        let mut open = slots.open.lock().unwrap_or_else(|e| e.into_inner());
        open.retain(|o| o.strong_count() > 0);
        let mut making_room = None;
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
                making_room = oldest.gone.lock().unwrap_or_else(|e| e.into_inner()).take();
                oldest.evicted.store(true, Ordering::Release);
                oldest.waker.wake();
                oldest.closing.notify_one();
            }
            figures.connections.fetch_add(1, Ordering::Relaxed);
            figures.idle_closed.fetch_add(1, Ordering::Relaxed);
        }
        let (gone, on_gone) = tokio::sync::oneshot::channel();
        let slot = Arc::new(Open {
            gone: Mutex::new(Some(on_gone)),
            ..Open::default()
        });
        open.push_back(Arc::downgrade(&slot));
        Some(HttpSlot {
            open: slot,
            slots: slots.clone(),
            _gone: gone,
            making_room,
        })
    }

    /// Resolves once the connection closed to make room for this one (if
    /// any) is gone, its socket closed: so the sockets held stay within
    /// the cap, but for the one being accepted.
    pub async fn room(&mut self) {
        if let Some(gone) = self.making_room.take() {
            let _ = gone.await;
        }
    }

    /// Resolves once this connection is asked to close to make room.
    pub async fn closing(&self) {
        self.open.closing.notified().await;
    }

    /// Marks the connection busy from a request's arrival until its
    /// answer is flushed: the guard is dropped as the answer's body ends,
    /// and the connection stays busy until the next flush of its stream
    /// ([`HttpSlot::wrap`]) has written it out.
    pub fn busy(&self) -> Busy {
        self.open.busy.fetch_add(1, Ordering::AcqRel);
        Busy(self.open.clone())
    }

    /// `stream`, closing both ways (reads end, writes fail) once this
    /// connection is asked to close for room, or once a write has waited
    /// `write_timeout` for its peer to read.
    pub fn wrap<S>(&self, stream: S, write_timeout: Duration) -> Evictable<S> {
        Evictable {
            stream,
            open: self.open.clone(),
            slots: self.slots.clone(),
            write_timeout,
            stalled: None,
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
        // The answer is hyper's now, but maybe not yet the socket's: the
        // next flush settles it ([`Evictable`]).
        self.0.unflushed.fetch_add(1, Ordering::AcqRel);
    }
}

/// A connection's stream that closes both ways once the connection is
/// asked to close to make room ([`HttpSlot::take`]) or once a write has
/// waited too long for its peer to read; its flushes settle the answers
/// written ([`HttpSlot::busy`]).
pub struct Evictable<S> {
    stream: S,
    open: Arc<Open>,
    slots: Arc<Slots>,
    write_timeout: Duration,
    /// Since when a write has waited for the peer to read.
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S> Evictable<S> {
    /// An error for a write of a connection asked to close for room.
    fn evicted(&self, cx: &mut Context<'_>) -> Option<io::Error> {
        self.open.waker.register(cx.waker());
        self.open.evicted.load(Ordering::Acquire).then(|| {
            io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "closed to make room for a new connection",
            )
        })
    }

    /// What a write that `polled` gives: progress ends a stall; a stall
    /// longer than the write timeout ends the connection.
    fn progress<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if polled.is_ready() {
            self.stalled = None;
            return polled;
        }
        let timeout = self.write_timeout;
        let stalled = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        if stalled.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        if let Some(n) = crate::connections::seldom(&self.slots.write_timed_out, 1) {
            tracing::info!(
                timed_out = n,
                "closing an HTTP connection whose peer read nothing of its answer for {} ms ([server] http_write_timeout)",
                timeout.as_millis()
            );
        }
        Poll::Ready(Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "the peer read nothing for [server] http_write_timeout",
        )))
    }
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

impl<S: AsyncWrite + Unpin> AsyncWrite for Evictable<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if let Some(e) = self.evicted(cx) {
            return Poll::Ready(Err(e));
        }
        let polled = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.progress(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if let Some(e) = self.evicted(cx) {
            return Poll::Ready(Err(e));
        }
        let polled = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.progress(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Some(e) = self.evicted(cx) {
            return Poll::Ready(Err(e));
        }
        let polled = Pin::new(&mut self.stream).poll_flush(cx);
        if let Poll::Ready(Ok(())) = polled {
            // hyper flushes its stream only once its own buffer is
            // written: every answer taken before now is the socket's.
            let written = self.open.unflushed.swap(0, Ordering::AcqRel);
            self.open.busy.fetch_sub(written, Ordering::AcqRel);
        }
        self.progress(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.stream).poll_shutdown(cx);
        if polled.is_pending() && self.evicted(cx).is_some() {
            // No waiting to say goodbye (a TLS close_notify) for room.
            return Poll::Ready(Ok(()));
        }
        self.progress(cx, polled)
    }
}

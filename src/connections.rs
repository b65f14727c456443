//! How connections come in, on both ports.
//!
//! A new gRPC connection first finishes its handshake: an upgrade step
//! ([`Upgrade`]; today the plain TCP stream, TLS slots in here) and then the
//! 24-byte HTTP/2 client preface, all within `[server] handshake_timeout`.
//! Only then does it take one of the `[server] max_connections` slots and
//! reach the gRPC server, so that connections that never speak cannot hold
//! the slots of real clients. Connections still in their handshake are
//! themselves capped (`[server] max_handshakes`) and counted.
//!
//! With `[auth]` on, a connection past its handshake is a stranger until a
//! call on it presents a credential the server knows ([`Trust`]).
//! Strangers are capped as a whole (`[server] max_strangers`, which keeps
//! the rest of `max_connections` for connections that have shown a
//! credential) and per peer address (`max_strangers_per_peer`): past
//! either, or when every slot is taken, the oldest stranger is closed to
//! make room, so that connections which never authenticate cannot keep a
//! real client out.
//!
//! Every cap here must fit the process's open-file limit with a reserve for
//! the store, config reloads and logs ([`Ports::new`]); and when descriptors run
//! out all the same, accepting backs off briefly ([`accept`]) instead of
//! spinning and logging per attempt.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::{Connected, TcpConnectInfo};

use crate::auth::Access;
use crate::tls::{identity_of, Acceptor, ClientIdentity};

/// Writes through to a wrapped stream: `$ty`'s `AsyncWrite` is its
/// `$field`'s (the wrappers here change how a stream reads, never how it
/// writes).
macro_rules! write_through {
    ($ty:ident, $field:ident) => {
        impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for $ty<S> {
            fn poll_write(
                mut self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                buf: &[u8],
            ) -> std::task::Poll<std::io::Result<usize>> {
                std::pin::Pin::new(&mut self.$field).poll_write(cx, buf)
            }

            fn poll_flush(
                mut self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                std::pin::Pin::new(&mut self.$field).poll_flush(cx)
            }

            fn poll_shutdown(
                mut self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                std::pin::Pin::new(&mut self.$field).poll_shutdown(cx)
            }

            fn poll_write_vectored(
                mut self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                bufs: &[std::io::IoSlice<'_>],
            ) -> std::task::Poll<std::io::Result<usize>> {
                std::pin::Pin::new(&mut self.$field).poll_write_vectored(cx, bufs)
            }

            fn is_write_vectored(&self) -> bool {
                self.$field.is_write_vectored()
            }
        }
    };
}

/// A response body that holds `G` (a call in flight, a busy connection)
/// until the body is sent or dropped.
pub struct Holding<B, G> {
    body: B,
    _held: G,
}

impl<B, G> Holding<B, G> {
    /// `body`, holding `held` until it ends.
    pub fn new(body: B, held: G) -> Holding<B, G> {
        Holding { body, _held: held }
    }
}

impl<B: http_body::Body + Unpin, G: Unpin> http_body::Body for Holding<B, G> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// The client preface every HTTP/2 connection starts with (RFC 9113 3.4).
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Descriptors kept back from the connection caps: the store's files,
/// config reloads, logs, the listeners and the runtime's own.
pub const FD_RESERVE: u64 = 64;

/// How long accepting pauses when the process is out of descriptors.
pub const FD_BACKOFF: Duration = Duration::from_millis(100);

/// The caps of both ports' connections (`[server]`), validated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Cap on open gRPC connections.
    pub max_connections: u64,
    /// Cap on connections still in their handshake.
    pub max_handshakes: u64,
    /// How long a new connection has to finish its handshake, in ms.
    pub handshake_timeout: u64,
    /// Cap on open HTTP connections.
    pub max_http_connections: u64,
    /// How long an HTTP connection's answer may wait for its peer to read
    /// any of it before the connection is closed, in ms.
    pub http_write_timeout: u64,
    /// Cap on the HTTP/2 streams of one connection (both ports).
    pub max_streams_per_connection: u64,
    /// Cap on gRPC connections that have shown no credential yet (with
    /// `[auth]`); the rest of `max_connections` is kept for the others.
    pub max_strangers: u64,
    /// The same, per peer address.
    pub max_strangers_per_peer: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 10_000,
            max_handshakes: 1_024,
            handshake_timeout: 5_000,
            max_http_connections: 256,
            http_write_timeout: 10_000,
            max_streams_per_connection: 256,
            max_strangers: 5_000,
            max_strangers_per_peer: 256,
        }
    }
}

/// Figures of the gRPC port, and of accepting on both ports, for the
/// metrics. One server's ([`Ports`]); the HTTP side counts its own
/// connections.
#[derive(Debug, Default)]
pub struct Figures {
    /// Open gRPC connections.
    pub connections: AtomicU64,
    /// Connections closed at once because `max_connections` was reached.
    pub connections_refused: AtomicU64,
    /// gRPC connections in their handshake now.
    pub handshakes: AtomicU64,
    /// Connections closed because `max_handshakes` were in progress.
    pub handshakes_refused: AtomicU64,
    /// Connections closed because their handshake took too long.
    pub handshakes_timed_out: AtomicU64,
    /// Connections closed because their handshake was not HTTP/2 (or the
    /// upgrade failed).
    pub handshakes_failed: AtomicU64,
    /// Times accepting paused because descriptors ran out (either port).
    pub accept_backoffs: AtomicU64,
    /// gRPC connections closed because they had shown no credential while
    /// others needed room (`max_strangers`, `max_strangers_per_peer`).
    pub strangers_closed: AtomicU64,
}

/// One server's ports as this module sees them: the caps in force, the
/// gRPC port's figures and its strangers. [`crate::node::Node`] holds one,
/// made once per server, so that two servers in one process count apart.
#[derive(Debug)]
pub struct Ports {
    caps: Caps,
    figures: Figures,
    strangers: std::sync::Mutex<Strangers>,
}

impl Ports {
    /// The ports of a server with the caps `limits`: raises the soft
    /// open-file limit to the hard one where allowed, then [`fit`]s the
    /// caps to it (logged when they are lowered).
    pub fn new(limits: &Limits) -> Ports {
        Ports {
            caps: caps(limits),
            figures: Figures::default(),
            strangers: std::sync::Mutex::new(Strangers::default()),
        }
    }

    /// The caps in force for the HTTP port and the handshakes.
    pub fn caps(&self) -> Caps {
        self.caps
    }

    /// The gRPC port's figures.
    pub fn figures(&self) -> &Figures {
        &self.figures
    }

    /// gRPC connections open now that have shown no credential yet.
    pub fn strangers(&self) -> u64 {
        let strangers = self.strangers.lock().unwrap_or_else(|e| e.into_inner());
        strangers
            .open
            .iter()
            .filter(|(_, t)| t.is_stranger())
            .count() as u64
    }
}

/// The caps in force for the HTTP port and the handshakes: those of the
/// config, lowered if need be to fit the open-file limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caps {
    /// Open HTTP connections.
    pub max_http_connections: u64,
    /// Connections in their handshake.
    pub max_handshakes: u64,
    /// The open-file limit read at start (after raising it), if known.
    pub open_files: Option<u64>,
}

/// The caps in force: raises the soft open-file limit to the hard one
/// where allowed (the process's, shared by every server in it), then
/// [`fit`]s the caps.
fn caps(limits: &Limits) -> Caps {
    {
        let open_files = match rlimit::increase_nofile_limit(u64::MAX) {
            Ok(n) => Some(n),
            Err(e) => {
                tracing::warn!(
                    "cannot read the open-file limit ({e}); connection caps are as configured"
                );
                None
            }
        };
        let caps = fit(limits, open_files);
        if let Some(n) = open_files {
            let lowered = caps.max_http_connections < limits.max_http_connections
                || caps.max_handshakes < limits.max_handshakes;
            let grpc_fits = limits.max_connections + FD_RESERVE <= n;
            if lowered || !grpc_fits {
                let grpc = if grpc_fits {
                    String::new()
                } else {
                    format!(
                        "; max_connections ({}) does not fit either: past about {} gRPC connections, new ones wait until descriptors free up",
                        limits.max_connections,
                        n.saturating_sub(
                            FD_RESERVE + caps.max_http_connections + caps.max_handshakes
                        ),
                    )
                };
                tracing::warn!(
                    "the open-file limit is {n}: lowered [server] max_http_connections from {} to {} and max_handshakes from {} to {} to keep {FD_RESERVE} descriptors in reserve{grpc}; raise the limit (ulimit -n, or LimitNOFILE= in a systemd unit) or lower max_connections",
                    limits.max_http_connections,
                    caps.max_http_connections,
                    limits.max_handshakes,
                    caps.max_handshakes,
                );
            }
        }
        caps
    }
}

/// The caps of `limits` within `open_files` descriptors: gRPC connections,
/// HTTP connections, handshakes and [`FD_RESERVE`] must fit. When they do
/// not, the HTTP and handshake caps are lowered (never below 1) to share
/// what gRPC leaves, or half the budget when gRPC alone would take it all.
pub fn fit(limits: &Limits, open_files: Option<u64>) -> Caps {
    let wanted = Caps {
        max_http_connections: limits.max_http_connections,
        max_handshakes: limits.max_handshakes,
        open_files,
    };
    let Some(n) = open_files else {
        return wanted;
    };
    let budget = n.saturating_sub(FD_RESERVE);
    let others = limits.max_http_connections + limits.max_handshakes;
    if limits.max_connections.saturating_add(others) <= budget {
        return wanted;
    }
    let left = if limits.max_connections < budget / 2 {
        budget - limits.max_connections
    } else {
        budget / 2
    };
    let http = limits.max_http_connections.min((left / 2).max(1));
    let handshakes = limits.max_handshakes.min(left.saturating_sub(http).max(1));
    Caps {
        max_http_connections: http,
        max_handshakes: handshakes,
        open_files,
    }
}

/// True for the accept errors that mean "out of descriptors" (or of
/// kernel memory for sockets): retrying at once would spin.
fn out_of_descriptors(e: &io::Error) -> bool {
    // ENFILE (system), EMFILE (process), ENOMEM and ENOBUFS on Linux.
    matches!(e.raw_os_error(), Some(23 | 24 | 12 | 105))
}

/// The next connection on `listener`. When descriptors run out it pauses
/// [`FD_BACKOFF`] and tries again (the connection waits in the backlog),
/// counted in `backoffs`, logging the first time and then at powers of two.
pub async fn accept(
    listener: &TcpListener,
    port: &'static str,
    backoffs: &AtomicU64,
) -> (TcpStream, SocketAddr) {
    loop {
        match listener.accept().await {
            Ok(accepted) => return accepted,
            Err(e) if out_of_descriptors(&e) => {
                if let Some(n) = seldom(backoffs, 1) {
                    tracing::warn!(
                        port,
                        times = n,
                        "out of file descriptors ({e}): new {port} connections wait {} ms; raise the open-file limit (ulimit -n) or lower the connection caps",
                        FD_BACKOFF.as_millis()
                    );
                }
                tokio::time::sleep(FD_BACKOFF).await;
            }
            // The peer gave up before it was accepted, or a passing error:
            // the next one may be fine.
            Err(e) => {
                tracing::debug!(port, "accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    }
}

/// Turns an accepted TCP stream into the stream a port serves: the place
/// for TLS. The plain upgrade ([`Plain`]) is the TCP stream itself.
pub trait Upgrade: Clone + Send + Sync + 'static {
    /// The stream served.
    type Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    /// Upgrades `tcp` (a TLS handshake, say).
    fn upgrade(&self, tcp: TcpStream) -> impl Future<Output = io::Result<Self::Stream>> + Send;
    /// The client certificate's names on an upgraded stream (mutual TLS).
    fn identity(_stream: &Self::Stream) -> Option<ClientIdentity> {
        None
    }
}

/// No upgrade: plain TCP.
#[derive(Clone, Copy, Debug, Default)]
pub struct Plain;

impl Upgrade for Plain {
    type Stream = TcpStream;

    async fn upgrade(&self, tcp: TcpStream) -> io::Result<TcpStream> {
        Ok(tcp)
    }
}

/// A gauge held while a connection is in its handshake, if the cap allows.
struct Handshaking(Arc<Ports>);

impl Handshaking {
    fn start(ports: &Arc<Ports>) -> Option<Handshaking> {
        let cap = ports.caps.max_handshakes;
        ports
            .figures
            .handshakes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < cap).then_some(n + 1)
            })
            .ok()
            .map(|_| Handshaking(ports.clone()))
    }
}

impl Drop for Handshaking {
    fn drop(&mut self) {
        self.0.figures.handshakes.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Adds `by` to `counter`; the new count when it is a power of two, so
/// that what is counted is logged the first time, then ever more seldom.
pub(crate) fn seldom(counter: &AtomicU64, by: u64) -> Option<u64> {
    let n = counter.fetch_add(by, Ordering::Relaxed) + by;
    n.is_power_of_two().then_some(n)
}

/// The gRPC connections of `listener` that finished their handshake,
/// each upgraded by `upgrade`, within `limits` and counted in `ports`;
/// with `[auth]` in `access` (read as each connection comes), a
/// connection is a stranger until it shows a credential. Accepting stops
/// when the stream is dropped.
pub fn incoming<U: Upgrade>(
    listener: TcpListener,
    ports: Arc<Ports>,
    limits: Limits,
    access: tokio::sync::watch::Receiver<Option<Arc<Access>>>,
    upgrade: U,
) -> ReceiverStream<io::Result<Counted<Prefixed<U::Stream>>>> {
    let caps = ports.caps;
    let timeout = Duration::from_millis(limits.handshake_timeout);
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let (tcp, remote) = tokio::select! {
                accepted = accept(&listener, "gRPC", &ports.figures.accept_backoffs) => accepted,
                () = tx.closed() => return,
            };
            let Some(handshaking) = Handshaking::start(&ports) else {
                if let Some(n) = seldom(&ports.figures.handshakes_refused, 1) {
                    tracing::warn!(
                        cap = caps.max_handshakes,
                        refused = n,
                        "refusing a gRPC connection: {} connections are still in their handshake ([server] max_handshakes); if they are clients, raise it",
                        caps.max_handshakes
                    );
                }
                continue;
            };
            let _ = tcp.set_nodelay(true);
            let tcp_info = TcpConnectInfo {
                local_addr: tcp.local_addr().ok(),
                remote_addr: Some(remote),
            };
            let upgrade = upgrade.clone();
            let access = access.clone();
            let tx = tx.clone();
            let ports = ports.clone();
            tokio::spawn(async move {
                let shaken = tokio::time::timeout(timeout, handshake(tcp, &upgrade)).await;
                drop(handshaking);
                let stream = match shaken {
                    Ok(Ok(stream)) => stream,
                    Ok(Err(e)) => {
                        if let Some(n) = seldom(&ports.figures.handshakes_failed, 1) {
                            tracing::info!(%remote, failed = n, "closing a gRPC connection whose handshake failed: {e}");
                        }
                        return;
                    }
                    Err(_) => {
                        if let Some(n) = seldom(&ports.figures.handshakes_timed_out, 1) {
                            tracing::info!(
                                %remote,
                                timed_out = n,
                                "closing a gRPC connection that did not finish its handshake within {} ms ([server] handshake_timeout)",
                                timeout.as_millis()
                            );
                        }
                        return;
                    }
                };
                // Without [auth] there are no credentials to show.
                let trust = if access.borrow().is_some() {
                    Trust::default()
                } else {
                    Trust::trusted()
                };
                let info = PeerInfo {
                    tcp: tcp_info,
                    identity: U::identity(&stream.inner),
                    trust: Arc::new(trust),
                };
                if let Some(counted) = Counted::take(stream, info, &limits, ports) {
                    let _ = tx.send(Ok(counted)).await;
                }
            });
        }
    });
    ReceiverStream::new(rx)
}

/// Upgrades `tcp`, then reads the HTTP/2 preface, kept for replay.
async fn handshake<U: Upgrade>(tcp: TcpStream, upgrade: &U) -> io::Result<Prefixed<U::Stream>> {
    let mut stream = upgrade.upgrade(tcp).await?;
    let mut preface = [0u8; PREFACE.len()];
    stream.read_exact(&mut preface).await?;
    if &preface != PREFACE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "it did not start with the HTTP/2 preface (is it a gRPC client?)",
        ));
    }
    Ok(Prefixed {
        prefix: preface,
        read: 0,
        inner: stream,
    })
}

/// A stream whose first bytes, already read, are given again.
#[derive(Debug)]
pub struct Prefixed<S> {
    prefix: [u8; PREFACE.len()],
    read: usize,
    inner: S,
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.read < self.prefix.len() {
            let n = (self.prefix.len() - self.read).min(buf.remaining());
            let from = self.read;
            buf.put_slice(&self.prefix[from..from + n]);
            self.read += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

write_through!(Prefixed, inner);

/// A connection past its handshake, holding one of the
/// `max_connections` slots while it is open.
pub struct Counted<S> {
    stream: S,
    info: PeerInfo,
    ports: Arc<Ports>,
}

impl<S> Counted<S> {
    /// Takes a slot of `ports` for `stream`, or closes it (counted) when
    /// none is free.
    fn take(stream: S, info: PeerInfo, limits: &Limits, ports: Arc<Ports>) -> Option<Counted<S>> {
        let cap = limits.max_connections;
        let counters = &ports.figures;
        if !info.trust.is_trusted() {
            let peer = info
                .tcp
                .remote_addr
                .map_or(std::net::IpAddr::from([0, 0, 0, 0]), |a| a.ip());
            let full = counters.connections.load(Ordering::Relaxed) >= cap;
            let mut strangers = ports.strangers.lock().unwrap_or_else(|e| e.into_inner());
            let closed = strangers.make_room(peer, limits, full);
            strangers.open.push_back((peer, info.trust.clone()));
            drop(strangers);
            if closed > 0 {
                if let Some(n) = seldom(&counters.strangers_closed, closed) {
                    tracing::warn!(
                        closed = n,
                        "closing gRPC connections that have shown no credential, to make room for new ones ([server] max_strangers {}, max_strangers_per_peer {}); if they are clients, they should send their token on their first call",
                        limits.max_strangers,
                        limits.max_strangers_per_peer
                    );
                }
                // The closed strangers' slots free up as they close; this
                // one may run over the cap until then.
                counters.connections.fetch_add(1, Ordering::Relaxed);
                return Some(Counted {
                    stream,
                    info,
                    ports,
                });
            }
        }
        if counters.connections.fetch_add(1, Ordering::Relaxed) >= cap {
            counters.connections.fetch_sub(1, Ordering::Relaxed);
            // Not a stranger of the port any more: it is gone.
            info.trust.closed.store(true, Ordering::Release);
            let refused = counters.connections_refused.fetch_add(1, Ordering::Relaxed);
            if refused.is_power_of_two() || refused == 0 {
                tracing::warn!(
                    cap,
                    refused = refused + 1,
                    "refusing a connection: [server] max_connections is reached; raise it or spread clients over more servers"
                );
            }
            return None;
        }
        Some(Counted {
            stream,
            info,
            ports,
        })
    }
}

impl<S> Drop for Counted<S> {
    fn drop(&mut self) {
        self.info
            .trust
            .closed
            .store(true, std::sync::atomic::Ordering::Release);
        self.ports
            .figures
            .connections
            .fetch_sub(1, Ordering::Relaxed);
    }
}

impl<S> Connected for Counted<S> {
    type ConnectInfo = PeerInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.info.clone()
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let trust = &self.info.trust;
        if !trust.is_trusted() {
            // A stranger may be closed to make room: it reads as the end.
            trust.waker.register(cx.waker());
            if trust.evicted.load(Ordering::Acquire) {
                return Poll::Ready(Ok(()));
            }
        }
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

write_through!(Counted, stream);

/// What every gRPC request knows of its connection (in its extensions, as
/// tonic's `ConnectInfo`).
#[derive(Clone, Debug)]
pub struct PeerInfo {
    /// The TCP addresses.
    pub tcp: TcpConnectInfo,
    /// With mutual TLS, the client certificate's names.
    pub identity: Option<ClientIdentity>,
    /// Whether the connection has shown a credential.
    pub trust: Arc<Trust>,
}

/// A connection's standing: a stranger until a call on it shows a known
/// credential; a stranger may be closed to make room (the strangers).
#[derive(Debug, Default)]
pub struct Trust {
    trusted: std::sync::atomic::AtomicBool,
    evicted: std::sync::atomic::AtomicBool,
    closed: std::sync::atomic::AtomicBool,
    /// Woken to close an evicted connection that waits to read.
    waker: futures_util::task::AtomicWaker,
}

impl Trust {
    fn trusted() -> Trust {
        let trust = Trust::default();
        trust.trusted.store(true, Ordering::Release);
        trust
    }

    /// A call on the connection showed a known credential.
    pub fn vouch(&self) {
        self.trusted.store(true, Ordering::Release);
    }

    fn is_trusted(&self) -> bool {
        self.trusted.load(Ordering::Acquire)
    }

    fn is_stranger(&self) -> bool {
        !self.is_trusted() && !self.closed.load(Ordering::Acquire)
    }

    fn evict(&self) {
        self.evicted.store(true, Ordering::Release);
        self.waker.wake();
    }
}

/// The strangers of the gRPC port, oldest first.
#[derive(Debug, Default)]
struct Strangers {
    open: std::collections::VecDeque<(std::net::IpAddr, Arc<Trust>)>,
}

impl Strangers {
    /// Makes room for a new stranger from `peer` under `limits`, closing
    /// the oldest strangers as needed (its peer's first when the peer is
    /// at its cap); `full` says every `max_connections` slot is taken.
    /// Returns how many were closed.
    fn make_room(&mut self, peer: std::net::IpAddr, limits: &Limits, full: bool) -> u64 {
        self.open.retain(|(_, t)| t.is_stranger());
        let mut closed = 0;
        let of_peer = self.open.iter().filter(|(p, _)| *p == peer).count() as u64;
        if of_peer >= limits.max_strangers_per_peer {
            if let Some(at) = self.open.iter().position(|(p, _)| *p == peer) {
                if let Some((_, t)) = self.open.remove(at) {
                    t.evict();
                    closed += 1;
                }
            }
        }
        while self.open.len() as u64 >= limits.max_strangers || (full && closed == 0) {
            let Some((_, t)) = self.open.pop_front() else {
                break;
            };
            t.evict();
            closed += 1;
        }
        closed
    }
}

/// An accepted gRPC connection, plain or TLS.
#[derive(Debug)]
pub enum Conn {
    /// Without TLS.
    Plain(TcpStream),
    /// After a TLS handshake.
    Tls(Box<TlsStream<TcpStream>>),
}

macro_rules! both {
    ($self:ident, $s:ident => $e:expr) => {
        match $self.get_mut() {
            Conn::Plain($s) => {
                let $s = Pin::new($s);
                $e
            }
            Conn::Tls($s) => {
                let $s = Pin::new($s.as_mut());
                $e
            }
        }
    };
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        both!(self, s => s.poll_read(cx, buf))
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        both!(self, s => s.poll_write(cx, buf))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        both!(self, s => s.poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        both!(self, s => s.poll_shutdown(cx))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        both!(self, s => s.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Conn::Plain(s) => s.is_write_vectored(),
            Conn::Tls(s) => s.is_write_vectored(),
        }
    }
}

/// The upgrade of a port that may serve TLS: the handshake of its
/// acceptor, or plain TCP without one.
#[derive(Clone)]
pub struct MaybeTls(pub Option<Acceptor>);

impl Upgrade for MaybeTls {
    type Stream = Conn;

    async fn upgrade(&self, tcp: TcpStream) -> io::Result<Conn> {
        match &self.0 {
            Some(acceptor) => acceptor.accept(tcp).await.map(|s| Conn::Tls(Box::new(s))),
            None => Ok(Conn::Plain(tcp)),
        }
    }

    fn identity(stream: &Conn) -> Option<ClientIdentity> {
        match stream {
            Conn::Plain(_) => None,
            Conn::Tls(s) => identity_of(s.get_ref().1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Strangers make room oldest first: their peer's oldest past the
    /// per-peer cap, the oldest of all past the total or when every slot
    /// is taken; connections that showed a credential, or closed, are not
    /// strangers and never closed for room.
    #[test]
    fn strangers_make_room_oldest_first() {
        let limits = Limits {
            max_strangers: 3,
            max_strangers_per_peer: 2,
            ..Limits::default()
        };
        let a = std::net::IpAddr::from([10, 0, 0, 1]);
        let b = std::net::IpAddr::from([10, 0, 0, 2]);
        let mut strangers = Strangers::default();
        let admit = |strangers: &mut Strangers, peer, full| {
            let closed = strangers.make_room(peer, &limits, full);
            let trust = Arc::new(Trust::default());
            strangers.open.push_back((peer, trust.clone()));
            (closed, trust)
        };
        let (c, a1) = admit(&mut strangers, a, false);
        assert_eq!(c, 0);
        let (c, a2) = admit(&mut strangers, a, false);
        assert_eq!(c, 0);
        let (c, a3) = admit(&mut strangers, a, false);
        assert_eq!(c, 1, "a's third closes a's oldest");
        assert!(a1.evicted.load(Ordering::Acquire));
        assert!(!a2.evicted.load(Ordering::Acquire));
        a2.vouch();
        let (c, b1) = admit(&mut strangers, b, false);
        assert_eq!(c, 0, "a2 showed a credential: two strangers, room for b");
        let (c, b2) = admit(&mut strangers, b, false);
        assert_eq!(c, 0, "a3, b1, b2: three strangers, the most");
        let (c, _a4) = admit(&mut strangers, a, false);
        assert_eq!(c, 1, "a fourth: the oldest of all (a3) goes");
        assert!(a3.evicted.load(Ordering::Acquire));
        assert!(!a2.evicted.load(Ordering::Acquire), "never a trusted one");
        b1.closed.store(true, Ordering::Release);
        let (c, _) = admit(&mut strangers, a, true);
        assert_eq!(
            c, 1,
            "every slot taken: a stranger goes even under the caps"
        );
        assert!(
            b2.evicted.load(Ordering::Acquire),
            "the oldest open one, b1 being closed"
        );
    }

    #[test]
    fn caps_that_fit_the_open_file_limit_are_kept() {
        let limits = Limits::default();
        let caps = fit(&limits, Some(1 << 20));
        assert_eq!(caps.max_http_connections, limits.max_http_connections);
        assert_eq!(caps.max_handshakes, limits.max_handshakes);
        assert_eq!(fit(&limits, None).max_handshakes, limits.max_handshakes);
    }

    #[test]
    fn caps_past_the_open_file_limit_are_lowered_to_fit() {
        let limits = Limits {
            max_connections: 100,
            ..Limits::default()
        };
        let caps = fit(&limits, Some(600));
        assert!(
            100 + caps.max_http_connections + caps.max_handshakes + FD_RESERVE <= 600,
            "{caps:?}"
        );
        assert!(caps.max_http_connections >= 100, "{caps:?}");
        // gRPC alone past the limit: the others share half of it.
        let caps = fit(&Limits::default(), Some(600));
        assert!(caps.max_http_connections + caps.max_handshakes <= 600 - FD_RESERVE);
        assert!(caps.max_http_connections >= 1 && caps.max_handshakes >= 1);
    }
}

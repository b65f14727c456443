//! A cap on open gRPC connections (`[server] max_connections`), with a
//! gauge of open connections and a counter of refused ones. A connection
//! past the cap is closed at once, before any request is read from it, so
//! that a flood of idle connections cannot exhaust the server.

use std::io;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_stream::{Stream, StreamExt};
use tonic::transport::server::{Connected, TcpIncoming};

use super::tls::{Acceptor, Conn, PeerInfo};
use crate::engine::Engine;

/// A place among the open connections, given back when dropped.
struct Slot(Arc<Engine>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0
            .counters()
            .connections
            .fetch_sub(1, Ordering::Relaxed);
    }
}

/// An accepted connection, counted while it is open.
pub struct Counted {
    stream: Conn,
    _slot: Slot,
}

/// Accepted TLS handshakes waiting for the server to take them.
const HANDSHAKED_BACKLOG: usize = 64;

/// The accepted connections of `listener`, within the engine's cap; with
/// `tls`, after the TLS handshake (each in a task of its own, so that a
/// slow client holds up no other).
pub fn incoming(
    listener: TcpListener,
    engine: Arc<Engine>,
    tls: Option<Acceptor>,
) -> Pin<Box<dyn Stream<Item = io::Result<Counted>> + Send>> {
    let counted = counted(listener, engine);
    let Some(acceptor) = tls else {
        return Box::pin(counted.map(|r| {
            r.map(|(stream, slot)| Counted {
                stream: Conn::Plain(stream),
                _slot: slot,
            })
        }));
    };
    let (tx, rx) = tokio::sync::mpsc::channel(HANDSHAKED_BACKLOG);
    tokio::spawn(async move {
        tokio::pin!(counted);
        loop {
            let next = tokio::select! {
                next = counted.next() => next,
                () = tx.closed() => break,
            };
            match next {
                None => break,
                Some(Err(e)) => {
                    if tx.send(Err(e)).await.is_err() {
                        break;
                    }
                }
                Some(Ok((stream, slot))) => {
                    let (tx, acceptor) = (tx.clone(), acceptor.clone());
                    tokio::spawn(async move {
                        // A failed handshake is logged by the acceptor; it
                        // closes this connection only.
                        if let Ok(stream) = Conn::accept(&acceptor, stream).await {
                            let _ = tx
                                .send(Ok(Counted {
                                    stream,
                                    _slot: slot,
                                }))
                                .await;
                        }
                    });
                }
            }
        }
    });
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}

/// The accepted TCP connections of `listener` with their slots, within the engine's cap.
fn counted(
    listener: TcpListener,
    engine: Arc<Engine>,
) -> impl Stream<Item = io::Result<(TcpStream, Slot)>> + Send {
    let cap = engine.limits().max_connections;
    TcpIncoming::from(listener)
        .with_nodelay(Some(true))
        .filter_map(move |accepted| {
            let stream = match accepted {
                Ok(stream) => stream,
                Err(e) => return Some(Err(e)),
            };
            let counters = engine.counters();
            if counters.connections.fetch_add(1, Ordering::Relaxed) >= cap {
                counters.connections.fetch_sub(1, Ordering::Relaxed);
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
            Some(Ok((stream, Slot(engine.clone()))))
        })
}

impl Connected for Counted {
    type ConnectInfo = PeerInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.connect_info()
    }
}

impl AsyncRead for Counted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Counted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

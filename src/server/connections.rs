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
use tonic::transport::server::{Connected, TcpConnectInfo, TcpIncoming};

use crate::engine::Engine;

/// An accepted connection, counted while it is open.
pub struct Counted {
    stream: TcpStream,
    engine: Arc<Engine>,
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.engine
            .counters()
            .connections
            .fetch_sub(1, Ordering::Relaxed);
    }
}

/// The accepted connections of `listener`, within the engine's cap.
pub fn incoming(
    listener: TcpListener,
    engine: Arc<Engine>,
) -> impl Stream<Item = io::Result<Counted>> {
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
            Some(Ok(Counted {
                stream,
                engine: engine.clone(),
            }))
        })
}

impl Connected for Counted {
    type ConnectInfo = TcpConnectInfo;

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

//! HTTP/2 for the gRPC port, served with hyper directly so that every
//! buffer a connection may hold is set here (decisions 101): the streams
//! it may open, what its client may send ahead of the server's reading,
//! and what the server queues for a stream whose client does not read
//! (`max_send_buf_size`, which tonic's own server leaves at 400 KiB).

use std::convert::Infallible;
use std::time::Duration;

use futures_util::StreamExt;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tonic::body::Body;
use tonic::transport::server::Connected;

/// What the server queues for one stream beyond what its client's window
/// lets it send.
pub const SEND_BUFFER_PER_STREAM: usize = 16 * 1024;

/// The HTTP/2 settings of a gRPC connection.
pub struct Settings {
    /// Streams open at once on one connection.
    pub max_streams: u32,
    /// What one stream's client may send ahead of the server's reading.
    pub stream_window: u32,
    /// The same for the whole connection.
    pub connection_window: u32,
    /// How often an idle connection is pinged.
    pub keep_alive: Duration,
}

/// Serves the connections of `incoming` with `service` until `stop`
/// resolves; then stops accepting, tells each connection to finish
/// (GOAWAY) and returns once all have closed.
pub async fn serve<I, C, S>(
    incoming: I,
    service: S,
    settings: Settings,
    stop: impl std::future::Future<Output = ()>,
) where
    I: futures_util::Stream<Item = std::io::Result<C>>,
    C: Connected + tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    C::ConnectInfo: Clone + Send + Sync + 'static,
    S: tower::Service<
            http::Request<hyper::body::Incoming>,
            Response = http::Response<Body>,
            Error = Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(settings.keep_alive))
        .max_concurrent_streams(settings.max_streams)
        .initial_stream_window_size(settings.stream_window)
        .initial_connection_window_size(settings.connection_window)
        .max_send_buf_size(SEND_BUFFER_PER_STREAM);
    let graceful = GracefulShutdown::new();
    // Boxed, not pinned in place: dropped at shutdown, it stops accepting.
    let mut incoming = Box::pin(incoming);
    tokio::pin!(stop);
    loop {
        let conn = tokio::select! {
            conn = incoming.next() => conn,
            () = &mut stop => break,
        };
        let Some(conn) = conn else { break };
        let Ok(conn) = conn else { continue };
        let info = conn.connect_info();
        let inner = service.clone();
        // The connection's info in every request, as tonic's server puts it.
        let service = tower::util::MapRequest::new(
            inner,
            move |mut request: http::Request<hyper::body::Incoming>| {
                request.extensions_mut().insert(info.clone());
                request
            },
        );
        let connection = builder.serve_connection(
            TokioIo::new(conn),
            hyper_util::service::TowerToHyperService::new(service),
        );
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!("a gRPC connection ended: {e}");
            }
        });
    }
    drop(incoming);
    graceful.shutdown().await;
}

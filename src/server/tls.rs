//! TLS on the gRPC port: the accepted stream, plain or TLS, and what a
//! request knows of its connection ([`PeerInfo`]: the address and, with
//! mutual TLS, the client's [`ClientIdentity`]).

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;
use tonic::transport::server::{Connected, TcpConnectInfo};

pub use crate::tls::{identity_of, names_of, Acceptor, ClientIdentity, Tls, ALPN_GRPC};

/// What every gRPC request knows of its connection (in its extensions, as
/// tonic's `ConnectInfo`).
#[derive(Clone, Debug)]
pub struct PeerInfo {
    /// The TCP addresses.
    pub tcp: TcpConnectInfo,
    /// With mutual TLS, the client certificate's names.
    pub identity: Option<ClientIdentity>,
}

/// The client's address, from a request's [`PeerInfo`] (or tonic's own
/// connect info, for a server started some other way).
pub fn remote_addr<T>(request: &tonic::Request<T>) -> Option<SocketAddr> {
    request
        .extensions()
        .get::<PeerInfo>()
        .and_then(|p| p.tcp.remote_addr())
        .or_else(|| request.remote_addr())
}

/// The client certificate's names, with mutual TLS.
pub fn identity<T>(request: &tonic::Request<T>) -> Option<&ClientIdentity> {
    request
        .extensions()
        .get::<PeerInfo>()
        .and_then(|p| p.identity.as_ref())
}

/// An accepted gRPC connection, plain or TLS.
#[derive(Debug)]
pub enum Conn {
    /// Without TLS.
    Plain(TcpStream),
    /// After a TLS handshake.
    Tls(Box<TlsStream<TcpStream>>),
}

impl Conn {
    /// The TLS handshake of `acceptor` on `stream`.
    pub async fn accept(acceptor: &Acceptor, stream: TcpStream) -> io::Result<Conn> {
        acceptor
            .accept(stream)
            .await
            .map(|s| Conn::Tls(Box::new(s)))
    }
}

impl Connected for Conn {
    type ConnectInfo = PeerInfo;

    fn connect_info(&self) -> PeerInfo {
        match self {
            Conn::Plain(s) => PeerInfo {
                tcp: s.connect_info(),
                identity: None,
            },
            Conn::Tls(s) => {
                let (tcp, session) = s.get_ref();
                PeerInfo {
                    tcp: tcp.connect_info(),
                    identity: identity_of(session),
                }
            }
        }
    }
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

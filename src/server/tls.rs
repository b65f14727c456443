//! TLS on the gRPC port, as a request sees it: its connection's
//! [`PeerInfo`] (the address and, with mutual TLS, the client's
//! [`ClientIdentity`]).

use std::net::SocketAddr;

pub use crate::connections::{Conn, PeerInfo};
pub use crate::tls::{identity_of, names_of, Acceptor, ClientIdentity, Tls, ALPN_GRPC};

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

//! The gate in front of every fusebox gRPC call: with `[auth]` on, the
//! caller's credential (its bearer token, else its client certificate's
//! names) is checked on the request's headers, before any byte of its body
//! is read and before the call counts as in flight. A call without a
//! credential the server knows is answered UNAUTHENTICATED at once, as a
//! gRPC response with no body; one that passes carries its grant to the
//! handler, which does not look it up again, and its connection is no
//! longer a stranger ([`crate::connections`]).
//!
//! Health and reflection stay open, as before.

use std::future::Ready;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::future::Either;
use http::{Request, Response};
use tonic::body::Body;

use super::status::status_of_refusal;
use crate::auth::Grant;
use crate::connections::PeerInfo;
use crate::node::Node;

/// The grant the gate found for a call, in its request's extensions.
#[derive(Clone, Debug)]
pub struct Authenticated(pub Arc<Grant>);

/// The layer: [`Gate`] around a service.
#[derive(Clone)]
pub struct GateLayer(pub Arc<Node>);

impl<S> tower::Layer<S> for GateLayer {
    type Service = Gate<S>;

    fn layer(&self, inner: S) -> Gate<S> {
        Gate {
            inner,
            node: self.0.clone(),
        }
    }
}

/// A service whose calls are let through only with a known credential.
#[derive(Clone)]
pub struct Gate<S> {
    inner: S,
    node: Arc<Node>,
}

/// Whether `path` is one of fusebox's own services (not health or
/// reflection, which stay open).
fn guarded(path: &str) -> bool {
    path.starts_with("/fusebox.v1.") || path.starts_with("/envoy.service.ratelimit.v3.")
}

impl<S, B> tower::Service<Request<B>> for Gate<S>
where
    S: tower::Service<Request<B>, Response = Response<Body>>,
{
    type Response = Response<Body>;
    type Error = S::Error;
    /// The inner call as it is (no allocation on the way through), or the
    /// refusal, ready.
    type Future = Either<Ready<Result<Response<Body>, S::Error>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        if guarded(request.uri().path()) {
            if let Some(access) = self.node.access() {
                let peer = request.extensions().get::<PeerInfo>();
                let identity = peer.and_then(|p| p.identity.as_ref());
                let authorization = request
                    .headers()
                    .get(http::header::AUTHORIZATION)
                    .map(http::HeaderValue::as_bytes);
                match access.authenticate(authorization, identity) {
                    Ok(grant) => {
                        // The connection is no stranger now.
                        if let Some(peer) = peer {
                            peer.trust.vouch();
                        }
                        request.extensions_mut().insert(Authenticated(grant));
                    }
                    Err(refusal) => {
                        self.node
                            .counters()
                            .calls_unauthenticated
                            .fetch_add(1, Ordering::Relaxed);
                        let status = status_of_refusal(refusal);
                        return Either::Left(std::future::ready(Ok(status.into_http())));
                    }
                }
            }
        }
        Either::Right(self.inner.call(request))
    }
}

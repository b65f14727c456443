//! A layer around every gRPC call: counts the calls in flight (so that
//! shutdown can stop as soon as none is left), answers an oversized
//! request RESOURCE_EXHAUSTED with the limit, where tonic says OUT_OF_RANGE,
//! and runs each call within its deadline (`grpc-timeout`, counted from
//! when its headers were read): a call still undecided then is not decided
//! (F1, [`crate::engine::deadline`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http::{Request, Response};
use tokio::sync::Notify;
use tonic::body::Body;
use tonic::{Code, Status};

use crate::node::Node;

/// The calls in flight on one server (its counter, which the metrics
/// show), with a way to wait until there are none.
#[derive(Debug)]
pub struct InFlight {
    node: Arc<Node>,
    idle: Notify,
}

impl InFlight {
    /// The calls in flight on `node`.
    pub fn of(node: Arc<Node>) -> InFlight {
        InFlight {
            node,
            idle: Notify::new(),
        }
    }

    fn count_of(&self) -> &AtomicU64 {
        &self.node.counters().calls_in_flight
    }

    /// Calls in flight now.
    pub fn count(&self) -> u64 {
        self.count_of().load(Ordering::Acquire)
    }

    /// Resolves once no call is in flight.
    pub async fn idle(&self) {
        loop {
            let notified = self.idle.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.count() == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// One call in flight, until its response body is dropped.
struct Call(Arc<InFlight>);

impl Call {
    fn start(calls: &Arc<InFlight>) -> Call {
        calls.count_of().fetch_add(1, Ordering::AcqRel);
        Call(calls.clone())
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        if self.0.count_of().fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// The layer: [`Calls`] around a service.
#[derive(Clone, Debug)]
pub struct CallsLayer(pub Arc<InFlight>);

impl<S> tower::Layer<S> for CallsLayer {
    type Service = Calls<S>;

    fn layer(&self, inner: S) -> Calls<S> {
        Calls {
            inner,
            calls: self.0.clone(),
        }
    }
}

/// A service whose calls are counted and whose size refusals say the limit.
#[derive(Clone, Debug)]
pub struct Calls<S> {
    inner: S,
    calls: Arc<InFlight>,
}

impl<S, B> tower::Service<Request<B>> for Calls<S>
where
    S: tower::Service<Request<B>, Response = Response<Body>>,
    S::Future: Send + 'static,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let call = Call::start(&self.calls);
        let deadline = request
            .headers()
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
            .and_then(timeout_of)
            .and_then(|timeout| Instant::now().checked_add(timeout));
        let future = self.inner.call(request);
        Box::pin(async move {
            let mut response = crate::engine::deadline::within(deadline, future).await?;
            oversize_as_exhausted(response.headers_mut());
            Ok(response.map(|body| Body::new(crate::connections::Holding::new(body, call))))
        })
    }
}

/// A `grpc-timeout` header's duration (gRPC over HTTP/2: at most 8 digits
/// and a unit, `H`, `M`, `S`, `m`, `u` or `n`); `None` when it is not one.
pub fn timeout_of(text: &str) -> Option<Duration> {
    if text.len() < 2 || text.len() > 9 {
        return None;
    }
    let (digits, unit) = text.split_at(text.len() - 1);
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// Rewrites tonic's OUT_OF_RANGE for a request past the decoding limit
/// (answered at once, in the headers) as RESOURCE_EXHAUSTED that says the
/// size and the limit.
fn oversize_as_exhausted(headers: &mut http::HeaderMap) {
    let Some(status) = Status::from_header_map(headers) else {
        return;
    };
    if status.code() != Code::OutOfRange {
        return;
    }
    let Some(message) = oversize_message(status.message()) else {
        return;
    };
    headers.remove(Status::GRPC_STATUS);
    headers.remove(Status::GRPC_MESSAGE);
    let _ = Status::resource_exhausted(message).add_header(headers);
}

/// The words for tonic's "decoded message length too large: found N
/// bytes, the limit is: M bytes", or `None` for another message.
pub fn oversize_message(tonic: &str) -> Option<String> {
    let rest = tonic.split("length too large: found ").nth(1)?;
    let (found, rest) = rest.split_once(" bytes, the limit is: ")?;
    let limit = rest.strip_suffix(" bytes")?;
    let found: u64 = found.trim().parse().ok()?;
    let limit: u64 = limit.trim().parse().ok()?;
    let kib = if limit.is_multiple_of(1024) {
        format!(" ({} KiB)", limit / 1024)
    } else {
        String::new()
    };
    Some(format!(
        "the request is {found} bytes; the limit is {limit} bytes{kib}: send a smaller request"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_are_read_in_every_unit_and_nothing_else_is() {
        assert_eq!(timeout_of("100m"), Some(Duration::from_millis(100)));
        assert_eq!(timeout_of("2S"), Some(Duration::from_secs(2)));
        assert_eq!(timeout_of("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(timeout_of("3M"), Some(Duration::from_secs(180)));
        assert_eq!(timeout_of("5u"), Some(Duration::from_micros(5)));
        assert_eq!(timeout_of("7n"), Some(Duration::from_nanos(7)));
        for bad in ["", "m", "10", "10x", "-1m", "123456789m", "1.5S"] {
            assert_eq!(timeout_of(bad), None, "{bad}");
        }
    }

    #[test]
    fn tonics_size_refusal_becomes_one_that_says_the_limit() {
        assert_eq!(
            oversize_message(
                "Error, decoded message length too large: found 70000 bytes, the limit is: 65536 bytes"
            )
            .as_deref(),
            Some("the request is 70000 bytes; the limit is 65536 bytes (64 KiB): send a smaller request")
        );
        assert_eq!(oversize_message("something else"), None);
    }
}

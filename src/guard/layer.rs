//! The guard as tower middleware: [`GuardLayer`] wraps a service so that
//! every request it serves is guarded on the key its request names.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use crate::{count_errors_not_cancellations, CallOptions, Guard, GuardError};

/// A tower `Layer` that guards each request of the service it wraps with
/// [`Guard::run`], on the key `key_of` names for the request (SUCCESS when
/// the service answers `Ok`, FAILURE for an error, IGNORED when the
/// response future is dropped).
#[derive(Clone)]
pub struct GuardLayer<K> {
    guard: Guard,
    key_of: K,
    options: CallOptions,
}

impl<K> GuardLayer<K> {
    /// Guards requests on `key_of(&request)` with `guard`.
    pub fn new(guard: Guard, key_of: K) -> GuardLayer<K> {
        GuardLayer {
            guard,
            key_of,
            options: CallOptions::default(),
        }
    }

    /// Each request's call options (permits, wait, lease, policy when
    /// fusebox is unavailable).
    pub fn with_options(mut self, options: CallOptions) -> GuardLayer<K> {
        self.options = options;
        self
    }
}

impl<S, K: Clone> tower_layer::Layer<S> for GuardLayer<K> {
    type Service = GuardService<S, K>;

    fn layer(&self, inner: S) -> GuardService<S, K> {
        GuardService {
            inner,
            guard: self.guard.clone(),
            key_of: self.key_of.clone(),
            options: self.options.clone(),
        }
    }
}

/// A service whose requests are guarded ([`GuardLayer`]). Its errors are
/// [`GuardError`]: a refusal, fusebox unavailable (failing closed), or
/// the service's own error ([`GuardError::Call`]).
#[derive(Clone)]
pub struct GuardService<S, K> {
    inner: S,
    guard: Guard,
    key_of: K,
    options: CallOptions,
}

impl<S, K, R> tower_service::Service<R> for GuardService<S, K>
where
    S: tower_service::Service<R> + Clone + Send + 'static,
    S::Future: Send,
    S::Response: Send,
    S::Error: Send + 'static,
    R: Send + 'static,
    K: Fn(&R) -> String,
{
    type Response = S::Response;
    type Error = GuardError<S::Error>;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(GuardError::Call)
    }

    fn call(&mut self, request: R) -> Self::Future {
        let key = (self.key_of)(&request);
        // The service made ready is the one that serves this request; a
        // clone stays for the next (tower's usual hand-over).
        let clone = self.inner.clone();
        let mut ready = std::mem::replace(&mut self.inner, clone);
        let guard = self.guard.clone();
        let options = self.options.clone();
        Box::pin(async move {
            guard
                .run_classified(&key, &options, count_errors_not_cancellations, move || {
                    ready.call(request)
                })
                .await
        })
    }
}

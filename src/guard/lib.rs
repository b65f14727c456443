//! A client-side guard around calls to a dependency, for any Rust service.
//!
//! [`Guard::run`] asks fusebox (`Acquire`) before the call, runs it, and
//! reports how it went (`Complete`): SUCCESS when it returns `Ok`, FAILURE
//! when it returns an error that the classifier counts, IGNORED when the
//! caller drops the future (cancellation). Refusals come back typed
//! ([`GuardError::Blocked`], [`GuardError::Refused`],
//! [`GuardError::Denied`]), distinct from the call's own error
//! ([`GuardError::Call`]).
//!
//! A guarded call pays one round trip to fusebox, its Acquire: the outcome
//! goes into the guard's **outcome queue** (bounded,
//! [`GuardOptions::outcome_queue`]) and the guard returns the call's result
//! at once. A sender reports what is queued in the background, one send in
//! flight at a time, the outcomes that ended meanwhile together in the
//! next (one `CompleteBatch`, or `complete` frames of the guard's `Decide`
//! stream in one message). An outcome may therefore reach fusebox after the
//! caller's next Acquire: where the next call must see the last one's
//! outcome, call [`Guard::flush`] between them. With the queue full, an
//! outcome is dropped and counted ([`GuardStats::outcomes_dropped`]); a
//! send fusebox did not take is counted too
//! ([`GuardStats::complete_failures`]); either way the ticket's lease ends
//! on the server. A guard has no close: a service calls [`Guard::flush`]
//! before it exits (when the last clone is dropped, the sender still sends
//! what is queued while the runtime runs).
//!
//! Also:
//! - leases are renewed every half of the granted lease while the call
//!   runs, and renewal stops the moment the call ends, before its outcome
//!   is queued;
//! - a key answered BLOCKED/open with a retry-after is remembered (a bounded
//!   cache) and answered [`GuardError::Blocked`] locally, with `local: true`,
//!   until then; the call after that goes to fusebox, so one probe per fleet
//!   still holds;
//! - every fusebox call has a deadline ([`GuardOptions::deadline`], 50 ms by
//!   default); when fusebox is slow or down the guard fails open (runs the
//!   call without a ticket, the default) or closed
//!   ([`GuardError::Unavailable`]), logs it at most once per
//!   [`GuardOptions::log_interval`], counts it ([`Guard::stats`]), and backs
//!   off before asking again;
//! - a bearer token and TLS ([`Guard::connect`]);
//! - tower middleware: [`GuardLayer`] guards every request of a service on
//!   the key it names;
//! - a clock seam ([`GuardOptions::clock`]) for the cache, the backoff and
//!   the log interval, so that tests on a manual clock move both sides.
//!
//! Make one [`Guard`] per process and clone it: clones share the channel,
//! the cache, the outcome queue and the counters.
//!
//! This module talks to fusebox only through the wire types of
//! [`fusebox_proto`].

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

use fusebox_proto::v1 as pb;

mod clock;
mod layer;
mod outcomes;
mod stream;

pub use clock::Clock;
pub use layer::{GuardLayer, GuardService};
pub use outcomes::{FlushError, Outcome};

/// What to do when fusebox cannot answer within the deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FailPolicy {
    /// Run the call without a ticket (the default).
    #[default]
    Open,
    /// Do not run it: [`GuardError::Unavailable`].
    Closed,
}

/// Why a call was blocked or denied, as the contract names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// The breaker is open.
    Open,
    /// The breaker's one probe is out.
    ProbeInFlight,
    /// No permits free and no waiting asked for.
    NoPermits,
    /// The queue is full.
    QueueFull,
    /// More permits than the limiter's limit.
    ExceedsLimit,
    /// Evicted from a newest-first queue.
    Evicted,
    /// The wait ended.
    Timeout,
    /// A retry ([`CallOptions::attempt`] 2 or more) beyond the key's retry
    /// budget.
    RetryBudget,
    /// A reason this client does not know.
    Other(i32),
}

impl Reason {
    fn of(value: i32) -> Reason {
        match pb::Reason::try_from(value) {
            Ok(pb::Reason::Open) => Reason::Open,
            Ok(pb::Reason::ProbeInFlight) => Reason::ProbeInFlight,
            Ok(pb::Reason::NoPermits) => Reason::NoPermits,
            Ok(pb::Reason::QueueFull) => Reason::QueueFull,
            Ok(pb::Reason::ExceedsLimit) => Reason::ExceedsLimit,
            Ok(pb::Reason::Evicted) => Reason::Evicted,
            Ok(pb::Reason::Timeout) => Reason::Timeout,
            Ok(pb::Reason::RetryBudget) => Reason::RetryBudget,
            _ => Reason::Other(value),
        }
    }

    /// The lower-case name used in the contract (`open`, `no_permits`, ...).
    pub fn name(&self) -> String {
        match self {
            Reason::Open => "open".into(),
            Reason::ProbeInFlight => "probe_in_flight".into(),
            Reason::NoPermits => "no_permits".into(),
            Reason::QueueFull => "queue_full".into(),
            Reason::ExceedsLimit => "exceeds_limit".into(),
            Reason::Evicted => "evicted".into(),
            Reason::Timeout => "timeout".into(),
            Reason::RetryBudget => "retry_budget".into(),
            Reason::Other(n) => format!("reason_{n}"),
        }
    }
}

/// A guarded call that did not give a value.
#[derive(Debug, thiserror::Error)]
pub enum GuardError<E> {
    /// The breaker is open (or its probe is out): the call did not run.
    #[error("blocked ({reason:?}, retry after {retry_after:?}, local: {local})")]
    Blocked {
        /// Why.
        reason: Reason,
        /// When to try again, if fusebox said.
        retry_after: Option<Duration>,
        /// Answered from the local cache, without asking fusebox.
        local: bool,
    },
    /// The key is isolated by an operator: the call did not run.
    #[error("refused: the key is isolated")]
    Refused,
    /// The permit book said no: the call did not run.
    #[error("denied ({reason:?}, retry after {retry_after:?})")]
    Denied {
        /// Why.
        reason: Reason,
        /// When to try again, if fusebox said.
        retry_after: Option<Duration>,
    },
    /// fusebox could not be asked in time and the policy is fail closed.
    #[error("fusebox unavailable: {0}")]
    Unavailable(tonic::Status),
    /// fusebox rejected the request itself (a bad key, a bad lease, no
    /// right to the key): the call did not run.
    #[error("fusebox rejected the request: {0}")]
    Rejected(tonic::Status),
    /// The call's own error.
    #[error("{0}")]
    Call(E),
}

impl<E> GuardError<E> {
    /// The call's own error, if that is what this is.
    pub fn into_call(self) -> Option<E> {
        match self {
            GuardError::Call(e) => Some(e),
            _ => None,
        }
    }
}

/// Options of one guarded call.
#[derive(Debug, Clone, Default)]
pub struct CallOptions {
    /// Permits asked for; `None` means 1.
    pub permits: Option<u32>,
    /// How long the request may wait in the key's queue.
    pub max_wait: Option<Duration>,
    /// The lease asked for; `None` means the policy's default.
    pub lease: Option<Duration>,
    /// This call's policy when fusebox cannot answer; `None` means the
    /// guard's.
    pub on_unavailable: Option<FailPolicy>,
    /// Who makes this call, sent as the Acquire's `caller`; `None` means
    /// the guard's ([`GuardOptions::caller`]). fusebox ignores it when the
    /// guard sends a token (the token's name is the caller).
    pub caller: Option<String>,
    /// Which attempt of the caller's own call this is, sent as the
    /// Acquire's `attempt`: `None` or 1 for a first attempt, 2 and up for
    /// the caller's retries (a retry budget on the key counts them). The
    /// guard itself never runs a call again, so it marks no retry of its
    /// own: a caller that retries says so here.
    pub attempt: Option<u32>,
}

/// Options of a guard.
#[derive(Debug, Clone)]
pub struct GuardOptions {
    /// The deadline of each call to fusebox (Acquire adds its `max_wait`;
    /// a background send of outcomes has at least 1 s).
    pub deadline: Duration,
    /// What to do when fusebox cannot answer in time.
    pub on_unavailable: FailPolicy,
    /// Sent as `authorization: Bearer TOKEN`.
    pub token: Option<String>,
    /// Who this guard calls for (a service's name), sent as every
    /// Acquire's `caller` unless a call says otherwise
    /// ([`CallOptions::caller`]); `None` leaves it out and fusebox takes
    /// the peer's address. A breaker with a quorum counts failures by
    /// caller. At most 128 bytes of printable UTF-8: fusebox refuses
    /// another with `INVALID_ARGUMENT` naming `caller`
    /// ([`GuardError::Rejected`]). With a token, fusebox takes the token's
    /// name instead.
    pub caller: Option<String>,
    /// Keys remembered as open at most.
    pub cache_capacity: usize,
    /// At most one warning per interval when fusebox is unavailable.
    pub log_interval: Duration,
    /// The first wait before asking fusebox again after it was
    /// unavailable; it doubles up to [`GuardOptions::max_backoff`].
    pub backoff: Duration,
    /// The longest wait between tries while fusebox is unavailable.
    pub max_backoff: Duration,
    /// How calls reach fusebox: one unary call each (the default), or
    /// frames of one `Decide` stream per guard.
    pub transport: Transport,
    /// Where the guard reads the time ([`Clock::system`] by default).
    pub clock: Clock,
    /// Outcomes waiting to be sent at most (10,000 by default; at least
    /// 1): past it an outcome is dropped and counted
    /// ([`GuardStats::outcomes_dropped`]). The send in flight (up to 1,000
    /// outcomes) is not counted against it.
    pub outcome_queue: usize,
}

/// How a guard's calls reach fusebox.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Transport {
    /// One unary call per Acquire, Complete and Renew.
    #[default]
    Unary,
    /// Every call a frame of one `Decide` stream per guard, the frames ready
    /// together sent in one message: fewer messages for a busy process.
    /// The stream is opened on the first call and again after it ends.
    Stream,
}

impl Default for GuardOptions {
    fn default() -> Self {
        GuardOptions {
            deadline: Duration::from_millis(50),
            on_unavailable: FailPolicy::Open,
            token: None,
            caller: None,
            cache_capacity: 1024,
            log_interval: Duration::from_secs(10),
            backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            transport: Transport::Unary,
            clock: Clock::system(),
            outcome_queue: 10_000,
        }
    }
}

/// Counters of a guard (shared by its clones).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GuardStats {
    /// Calls answered Blocked from the local cache.
    pub local_blocked: u64,
    /// Times fusebox could not be asked (down, slow, or backing off).
    pub unavailable: u64,
    /// Calls run without a ticket because fusebox was unavailable.
    pub failed_open: u64,
    /// Calls not run because fusebox was unavailable.
    pub failed_closed: u64,
    /// Leases renewed.
    pub renewals: u64,
    /// Renewals that failed.
    pub renew_failures: u64,
    /// Outcomes fusebox did not take: their send failed, or it answered
    /// the item with an error (an unknown or already completed ticket).
    pub complete_failures: u64,
    /// Outcomes dropped because the outcome queue was full.
    pub outcomes_dropped: u64,
}

#[derive(Default)]
struct Counters {
    local_blocked: AtomicU64,
    unavailable: AtomicU64,
    failed_open: AtomicU64,
    failed_closed: AtomicU64,
    renewals: AtomicU64,
    renew_failures: AtomicU64,
}

/// Keys known open, until a real-time instant; bounded.
struct OpenCache {
    capacity: usize,
    until: HashMap<String, Instant>,
}

impl OpenCache {
    fn get(&mut self, key: &str, now: Instant) -> Option<Duration> {
        match self.until.get(key) {
            Some(&t) if t > now => Some(t - now),
            Some(_) => {
                self.until.remove(key);
                None
            }
            None => None,
        }
    }

    fn put(&mut self, key: &str, until: Instant, now: Instant) {
        if self.capacity == 0 {
            return;
        }
        if self.until.len() >= self.capacity && !self.until.contains_key(key) {
            self.until.retain(|_, t| *t > now);
            if self.until.len() >= self.capacity {
                // Evict the entry that ends first.
                if let Some(first) = self
                    .until
                    .iter()
                    .min_by_key(|(_, t)| **t)
                    .map(|(k, _)| k.clone())
                {
                    self.until.remove(&first);
                }
            }
        }
        self.until.insert(key.to_owned(), until);
    }
}

struct Backoff {
    /// No call to fusebox before this.
    until: Option<Instant>,
    next: Duration,
    last_logged: Option<Instant>,
}

struct Inner {
    /// When a failed Renew was last logged.
    renew_log: Mutex<Option<Instant>>,
    client: pb::fusebox_client::FuseboxClient<Channel>,
    /// The `Decide` stream, with [`Transport::Stream`] (shared with the
    /// outcome sender).
    mux: Option<Arc<stream::Mux>>,
    /// The outcome queue and its sender.
    outcomes: Arc<outcomes::Outcomes>,
    options: GuardOptions,
    authorization: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
    cache: Mutex<OpenCache>,
    backoff: Mutex<Backoff>,
    counters: Counters,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // The last clone is gone: the sender sends what is queued, then
        // ends.
        self.outcomes.close();
    }
}

/// A guard: cheap to clone, one per process. It has no close: call
/// [`Guard::flush`] before the process exits.
#[derive(Clone)]
pub struct Guard {
    inner: Arc<Inner>,
}

/// An error making a guard.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The address or TLS settings are not usable.
    #[error("{0}")]
    Transport(#[from] tonic::transport::Error),
    /// The token is not a valid header value.
    #[error("the token is not a valid header value")]
    Token,
    /// [`GuardOptions::outcome_queue`] is 0.
    #[error(
        "GuardOptions::outcome_queue is 0: it must be at least 1 (10,000 by default), or every outcome would be dropped"
    )]
    OutcomeQueue,
}

fn sanitize_duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: d.as_secs().min(i64::MAX as u64) as i64,
        nanos: d.subsec_nanos() as i32,
    }
}

fn duration_from(d: Option<prost_types::Duration>) -> Option<Duration> {
    let d = d?;
    if d.seconds < 0 || d.nanos < 0 {
        return Some(Duration::ZERO);
    }
    Some(Duration::new(d.seconds as u64, d.nanos as u32))
}

fn is_unavailable(status: &tonic::Status) -> bool {
    matches!(
        status.code(),
        tonic::Code::Unavailable
            | tonic::Code::DeadlineExceeded
            | tonic::Code::Unknown
            | tonic::Code::Internal
            | tonic::Code::ResourceExhausted
            | tonic::Code::Cancelled
            | tonic::Code::Aborted
    )
}

/// A classifier for which every error counts as a failure.
pub fn count_every_error<E>(_: &E) -> Outcome {
    Outcome::Failure
}

/// The default classifier: an error counts as a failure unless it is a
/// cancellation (a gRPC status CANCELLED, as a dependency called over gRPC
/// answers when the call was cancelled), which is IGNORED, as in every
/// fusebox client library.
pub fn count_errors_not_cancellations<E: 'static>(e: &E) -> Outcome {
    let any: &dyn std::any::Any = e;
    match any.downcast_ref::<tonic::Status>() {
        Some(status) if status.code() == tonic::Code::Cancelled => Outcome::Ignored,
        _ => Outcome::Failure,
    }
}

enum Admission<'a> {
    Ticket(Ticket<'a>, Admitted),
    WithoutTicket(Admitted),
}

/// How a running guarded call was let through, as [`admitted`] tells it
/// from inside the call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admitted {
    /// fusebox granted a ticket.
    Granted,
    /// The call is the breaker's probe: its outcome decides recovery.
    Probe,
    /// fusebox granted without a ticket (a status check with no permits).
    Unticketed,
    /// fusebox could not be asked in time and the policy is fail open: the
    /// call runs without a ticket and nothing will be reported.
    FailedOpen,
    /// The key's policy is a shadow (a dry run, SPEC D1): fusebox granted
    /// a call it would have blocked (`blocked`) or denied, for `reason`.
    /// The call runs; its outcome is reported and changes nothing.
    Shadow {
        /// True when it would have been `BLOCKED`, false `DENIED`.
        blocked: bool,
        /// Why it would have been.
        reason: Reason,
    },
}

tokio::task_local! {
    static ADMITTED: Admitted;
}

/// Inside a guarded call, how it was let through (for example to log or
/// count the calls that ran while fusebox was unavailable); `None` outside.
pub fn admitted() -> Option<Admitted> {
    ADMITTED.try_with(|a| *a).ok()
}

/// A ticket held for a running call. Its outcome goes into the guard's
/// outcome queue when the call ends; dropped without that (the caller
/// dropped the future, or the call panics), it queues IGNORED (FAILURE
/// while panicking).
struct Ticket<'a> {
    outcomes: &'a Arc<outcomes::Outcomes>,
    /// `None` once its outcome is queued.
    id: Option<String>,
    /// The lease fusebox granted, when there is one to renew.
    lease: Option<Duration>,
}

impl Ticket<'_> {
    /// Queues the call's outcome and cost; never waits.
    fn finish(mut self, outcome: Outcome, cost: Option<u32>) {
        if let Some(id) = self.id.take() {
            self.outcomes.push(id, outcome, cost);
        }
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            // Dropped by a caller that went away: IGNORED. Dropped while the
            // call panics: the call failed.
            let outcome = if std::thread::panicking() {
                Outcome::Failure
            } else {
                Outcome::Ignored
            };
            self.outcomes.push(id, outcome, None);
        }
    }
}

impl Guard {
    /// A guard on a new lazily connected channel to `url`
    /// (`http://HOST:PORT`, or `https://` with `tls`). The channel
    /// reconnects by itself; it is the one to share in the process.
    pub fn connect(
        url: &str,
        tls: Option<ClientTlsConfig>,
        options: GuardOptions,
    ) -> Result<Guard, ConnectError> {
        let mut endpoint = Endpoint::from_shared(url.to_owned())?
            .connect_timeout(Duration::from_secs(1))
            .tcp_nodelay(true);
        if let Some(tls) = tls {
            endpoint = endpoint.tls_config(tls)?;
        }
        Guard::new(endpoint.connect_lazy(), options)
    }

    /// A guard on an existing channel.
    pub fn new(channel: Channel, options: GuardOptions) -> Result<Guard, ConnectError> {
        let authorization = match &options.token {
            Some(token) => Some(
                format!("Bearer {token}")
                    .parse()
                    .map_err(|_| ConnectError::Token)?,
            ),
            None => None,
        };
        let cache = OpenCache {
            capacity: options.cache_capacity,
            until: HashMap::new(),
        };
        let backoff = Backoff {
            until: None,
            next: options.backoff,
            last_logged: None,
        };
        if options.outcome_queue == 0 {
            return Err(ConnectError::OutcomeQueue);
        }
        let client = pb::fusebox_client::FuseboxClient::new(channel);
        let mux = (options.transport == Transport::Stream)
            .then(|| Arc::new(stream::Mux::new(client.clone(), authorization.clone())));
        let route = outcomes::Route {
            client: client.clone(),
            mux: mux.clone(),
            authorization: authorization.clone(),
        };
        let outcomes = outcomes::Outcomes::new(
            route,
            options.outcome_queue,
            options.deadline,
            options.clock.clone(),
            options.log_interval,
        );
        Ok(Guard {
            inner: Arc::new(Inner {
                client,
                mux,
                outcomes,
                options,
                authorization,
                cache: Mutex::new(cache),
                backoff: Mutex::new(backoff),
                counters: Counters::default(),
                renew_log: Mutex::new(None),
            }),
        })
    }

    /// The guard's counters.
    pub fn stats(&self) -> GuardStats {
        let c = &self.inner.counters;
        GuardStats {
            local_blocked: c.local_blocked.load(Ordering::Relaxed),
            unavailable: c.unavailable.load(Ordering::Relaxed),
            failed_open: c.failed_open.load(Ordering::Relaxed),
            failed_closed: c.failed_closed.load(Ordering::Relaxed),
            renewals: c.renewals.load(Ordering::Relaxed),
            renew_failures: c.renew_failures.load(Ordering::Relaxed),
            complete_failures: self.inner.outcomes.failed(),
            outcomes_dropped: self.inner.outcomes.dropped(),
        }
    }

    /// Waits until every outcome queued before this call has been answered
    /// by fusebox, or its send failed (counted in
    /// [`GuardStats::complete_failures`]). Call it before the process exits
    /// (a guard has no close), and between two calls where the second must
    /// see the first's outcome (a concurrency limit of one, used by one
    /// process).
    ///
    /// Each send has a deadline of its own, the guard's
    /// [`deadline`](GuardOptions::deadline) but at least 1 s, so a flush
    /// ends while fusebox is down too. It gives up with [`FlushError`]
    /// after one such deadline more than the sends ahead of it can take
    /// (the send in flight, and one per 1,000 outcomes queued before it).
    pub async fn flush(&self) -> Result<(), FlushError> {
        self.inner.outcomes.flush().await
    }

    /// Forgets that `key` is known open: its next call asks fusebox.
    pub fn forget(&self, key: &str) {
        self.inner
            .cache
            .lock()
            .expect("cache lock")
            .until
            .remove(key);
    }

    /// Guards `call` on `key`; an error counts as a failure unless it is a
    /// cancellation ([`count_errors_not_cancellations`]).
    pub async fn run<T, E: 'static, F, Fut>(
        &self,
        key: &str,
        options: &CallOptions,
        call: F,
    ) -> Result<T, GuardError<E>>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        self.run_classified(key, options, count_errors_not_cancellations, call)
            .await
    }

    /// Guards `call` on `key`; `classify` says what an error means.
    pub async fn run_classified<T, E, F, Fut, C>(
        &self,
        key: &str,
        options: &CallOptions,
        classify: C,
        call: F,
    ) -> Result<T, GuardError<E>>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        C: FnOnce(&E) -> Outcome,
    {
        self.run_classified_with_cost(key, options, classify, |_| None, call)
            .await
    }

    /// Guards `call` on `key` and reports, with its outcome, the permits it
    /// really used: `cost_of` reads them from the call's result (`None` =
    /// what the ticket took). For a token-bucket or window limiter the
    /// difference is settled on fusebox at Complete (U1): a call that
    /// turned out bigger (tokens of a model's answer, rows of a query)
    /// spends more, one that turned out smaller gives the rest back. An
    /// error counts as a failure unless it is a cancellation.
    pub async fn run_with_cost<T, E: 'static, F, Fut, K>(
        &self,
        key: &str,
        options: &CallOptions,
        cost_of: K,
        call: F,
    ) -> Result<T, GuardError<E>>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        K: FnOnce(&Result<T, E>) -> Option<u32>,
    {
        self.run_classified_with_cost(key, options, count_errors_not_cancellations, cost_of, call)
            .await
    }

    /// [`Guard::run_with_cost`] where `classify` says what an error means.
    pub async fn run_classified_with_cost<T, E, F, Fut, C, K>(
        &self,
        key: &str,
        options: &CallOptions,
        classify: C,
        cost_of: K,
        call: F,
    ) -> Result<T, GuardError<E>>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        C: FnOnce(&E) -> Outcome,
        K: FnOnce(&Result<T, E>) -> Option<u32>,
    {
        let admission = self.admit(key, options).await?;
        let how = match &admission {
            Admission::Ticket(_, how) | Admission::WithoutTicket(how) => *how,
        };
        // Both the closure and the future it returns see `admitted()`.
        let future = ADMITTED.sync_scope(how, call);
        let future = ADMITTED.scope(how, future);
        let Admission::Ticket(ticket, _) = admission else {
            return future.await.map_err(GuardError::Call);
        };
        let result = match (ticket.id.as_deref(), ticket.lease) {
            (Some(id), Some(lease)) => {
                // Renewal runs beside the call, in the caller's task, and
                // ends when the call does: before the outcome is queued.
                let renewal = self.renew_while_running(id, lease, options.lease);
                tokio::pin!(future);
                tokio::pin!(renewal);
                tokio::select! {
                    biased;
                    result = &mut future => result,
                    () = &mut renewal => future.await,
                }
            }
            _ => future.await,
        };
        let outcome = match &result {
            Ok(_) => Outcome::Success,
            Err(e) => classify(e),
        };
        ticket.finish(outcome, cost_of(&result));
        result.map_err(GuardError::Call)
    }

    fn request<T>(&self, message: T, timeout: Duration) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        request.set_timeout(timeout);
        if let Some(value) = &self.inner.authorization {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        request
    }

    /// Acquire, unary or as a stream frame, within `deadline`.
    async fn call_acquire(
        &self,
        message: pb::AcquireRequest,
        deadline: Duration,
    ) -> Result<pb::AcquireResponse, tonic::Status> {
        use pb::decide_result::Result as Answer;
        let Some(mux) = &self.inner.mux else {
            let mut client = self.inner.client.clone();
            let call = client.acquire(self.request(message, deadline));
            return answer_of(tokio::time::timeout(deadline, call).await).map(|r| r.into_inner());
        };
        match mux
            .call(pb::decide_frame::Request::Acquire(message), deadline)
            .await?
        {
            Answer::Acquire(reply) => Ok(reply),
            Answer::Error(error) => Err(stream::status_of(error)),
            other => Err(stream::unexpected(other)),
        }
    }

    /// Renew, unary or as a stream frame, within `deadline`.
    async fn call_renew(
        &self,
        message: pb::RenewRequest,
        deadline: Duration,
    ) -> Result<pb::RenewResponse, tonic::Status> {
        use pb::decide_result::Result as Answer;
        let Some(mux) = &self.inner.mux else {
            let mut client = self.inner.client.clone();
            let call = client.renew(self.request(message, deadline));
            return answer_of(tokio::time::timeout(deadline, call).await).map(|r| r.into_inner());
        };
        match mux
            .call(pb::decide_frame::Request::Renew(message), deadline)
            .await?
        {
            Answer::Renew(reply) => Ok(reply),
            Answer::Error(error) => Err(stream::status_of(error)),
            other => Err(stream::unexpected(other)),
        }
    }

    async fn admit<E>(
        &self,
        key: &str,
        options: &CallOptions,
    ) -> Result<Admission<'_>, GuardError<E>> {
        let now = self.inner.options.clock.now();
        if let Some(left) = self.inner.cache.lock().expect("cache lock").get(key, now) {
            self.inner
                .counters
                .local_blocked
                .fetch_add(1, Ordering::Relaxed);
            return Err(GuardError::Blocked {
                reason: Reason::Open,
                retry_after: Some(left),
                local: true,
            });
        }
        let policy = options
            .on_unavailable
            .unwrap_or(self.inner.options.on_unavailable);
        if let Some(status) = self.backing_off(now) {
            return self.unavailable(policy, status);
        }
        let deadline = self.inner.options.deadline + options.max_wait.unwrap_or_default();
        let message = self.acquire_request(key, options);
        let reply = match self.call_acquire(message, deadline).await {
            Ok(reply) => {
                self.reachable();
                reply
            }
            Err(status) if is_unavailable(&status) => {
                self.unreachable(&status);
                return self.unavailable(policy, status);
            }
            Err(status) => {
                // fusebox answered (and said no): it is reachable.
                self.reachable();
                return Err(GuardError::Rejected(status));
            }
        };
        let retry_after = duration_from(reply.retry_after);
        match pb::Decision::try_from(reply.decision) {
            Ok(decision @ (pb::Decision::Granted | pb::Decision::Probe)) => {
                let shadow = match pb::Decision::try_from(reply.shadow_decision) {
                    Ok(pb::Decision::Blocked) => Some(true),
                    Ok(pb::Decision::Denied) => Some(false),
                    _ => None,
                }
                .map(|blocked| Admitted::Shadow {
                    blocked,
                    reason: Reason::of(reply.shadow_reason),
                });
                if reply.ticket.is_empty() {
                    return Ok(Admission::WithoutTicket(
                        shadow.unwrap_or(Admitted::Unticketed),
                    ));
                }
                let how = if decision == pb::Decision::Probe {
                    Admitted::Probe
                } else {
                    shadow.unwrap_or(Admitted::Granted)
                };
                Ok(Admission::Ticket(
                    Ticket {
                        outcomes: &self.inner.outcomes,
                        id: Some(reply.ticket),
                        lease: duration_from(reply.lease).filter(|l| !l.is_zero()),
                    },
                    how,
                ))
            }
            Ok(pb::Decision::Blocked) => {
                let reason = Reason::of(reply.reason);
                if reason == Reason::Open {
                    if let Some(left) = retry_after.filter(|d| !d.is_zero()) {
                        self.inner
                            .cache
                            .lock()
                            .expect("cache lock")
                            .put(key, now + left, now);
                    }
                }
                Err(GuardError::Blocked {
                    reason,
                    retry_after,
                    local: false,
                })
            }
            Ok(pb::Decision::Refused) => Err(GuardError::Refused),
            Ok(pb::Decision::Denied) => Err(GuardError::Denied {
                reason: Reason::of(reply.reason),
                retry_after,
            }),
            _ => Err(GuardError::Rejected(tonic::Status::internal(format!(
                "unknown decision {}",
                reply.decision
            )))),
        }
    }

    /// The Acquire for one call: its options, the caller a call names or
    /// else the guard's (none: empty, which fusebox reads as absent).
    fn acquire_request(&self, key: &str, options: &CallOptions) -> pb::AcquireRequest {
        pb::AcquireRequest {
            key: key.to_owned(),
            permits: options.permits,
            max_wait: options.max_wait.map(sanitize_duration),
            lease: options.lease.map(sanitize_duration),
            attempt: options.attempt,
            caller: options
                .caller
                .as_ref()
                .or(self.inner.options.caller.as_ref())
                .cloned()
                .unwrap_or_default(),
        }
    }

    fn unavailable<E>(
        &self,
        policy: FailPolicy,
        status: tonic::Status,
    ) -> Result<Admission<'static>, GuardError<E>> {
        let c = &self.inner.counters;
        c.unavailable.fetch_add(1, Ordering::Relaxed);
        match policy {
            FailPolicy::Open => {
                c.failed_open.fetch_add(1, Ordering::Relaxed);
                Ok(Admission::WithoutTicket(Admitted::FailedOpen))
            }
            FailPolicy::Closed => {
                c.failed_closed.fetch_add(1, Ordering::Relaxed);
                Err(GuardError::Unavailable(status))
            }
        }
    }

    /// While backing off, the status to answer with instead of asking.
    fn backing_off(&self, now: Instant) -> Option<tonic::Status> {
        let b = self.inner.backoff.lock().expect("backoff lock");
        match b.until {
            Some(until) if until > now => Some(tonic::Status::unavailable(
                "fusebox was unavailable; backing off before asking again",
            )),
            _ => None,
        }
    }

    fn reachable(&self) {
        let mut b = self.inner.backoff.lock().expect("backoff lock");
        if b.until.is_some() {
            tracing::info!("fusebox answers again");
        }
        b.until = None;
        b.next = self.inner.options.backoff;
    }

    fn unreachable(&self, status: &tonic::Status) {
        let now = self.inner.options.clock.now();
        let mut b = self.inner.backoff.lock().expect("backoff lock");
        // Calls in flight when fusebox went away fail together: they open
        // one backoff window, not one doubling each.
        if b.until.is_none_or(|until| until <= now) {
            b.until = Some(now + b.next);
            b.next = (b.next * 2).min(self.inner.options.max_backoff);
        }
        let due = b
            .last_logged
            .is_none_or(|t| now.duration_since(t) >= self.inner.options.log_interval);
        if due {
            b.last_logged = Some(now);
            tracing::warn!(
                code = ?status.code(),
                message = status.message(),
                policy = ?self.inner.options.on_unavailable,
                unavailable_so_far = self.inner.counters.unavailable.load(Ordering::Relaxed) + 1,
                "fusebox unavailable; applying the guard's policy"
            );
        }
    }

    /// Renews `ticket` every half of its lease, for as long as it is
    /// polled (the call runs); ends when fusebox no longer knows the ticket
    /// or renewals keep failing.
    async fn renew_while_running(&self, ticket: &str, granted: Duration, asked: Option<Duration>) {
        let mut lease = granted;
        loop {
            tokio::time::sleep(lease / 2).await;
            let deadline = self.inner.options.deadline;
            let message = pb::RenewRequest {
                ticket: ticket.to_owned(),
                lease: asked.map(sanitize_duration),
            };
            match self.call_renew(message, deadline).await {
                Ok(reply) => {
                    self.inner.counters.renewals.fetch_add(1, Ordering::Relaxed);
                    if let Some(l) = duration_from(reply.lease).filter(|l| !l.is_zero()) {
                        lease = l;
                    }
                }
                Err(status) if status.code() == tonic::Code::NotFound => {
                    // The ticket is gone (expired or completed): stop.
                    self.inner
                        .counters
                        .renew_failures
                        .fetch_add(1, Ordering::Relaxed);
                    self.warn_once(
                        &self.inner.renew_log,
                        "fusebox no longer knows a running call's ticket; renewal stops",
                        &status,
                    );
                    return;
                }
                Err(trouble) => {
                    self.inner
                        .counters
                        .renew_failures
                        .fetch_add(1, Ordering::Relaxed);
                    self.warn_once(
                        &self.inner.renew_log,
                        "fusebox did not renew a running call's lease; trying again sooner",
                        &trouble,
                    );
                    // Try again sooner: what is left of the lease halves.
                    lease /= 2;
                    if lease < Duration::from_millis(2) {
                        return;
                    }
                }
            }
        }
    }

    /// Warns at most once per `log_interval` for one kind of trouble.
    fn warn_once(&self, last: &Mutex<Option<Instant>>, what: &str, trouble: &tonic::Status) {
        let now = self.inner.options.clock.now();
        let mut last = last.lock().expect("log lock");
        if last.is_none_or(|t| now.duration_since(t) >= self.inner.options.log_interval) {
            *last = Some(now);
            tracing::warn!(code = ?trouble.code(), message = trouble.message(), "{what}");
        }
    }
}

/// A call to fusebox under the guard's own deadline, as one status.
fn answer_of<T>(
    answer: Result<Result<T, tonic::Status>, tokio::time::error::Elapsed>,
) -> Result<T, tonic::Status> {
    answer.unwrap_or_else(|_| {
        Err(tonic::Status::deadline_exceeded(
            "fusebox did not answer in time",
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn failures_in_one_blip_open_one_backoff_window() {
        let guard = Guard::connect("http://127.0.0.1:1", None, GuardOptions::default())
            .expect("a lazy channel");
        let down = tonic::Status::unavailable("down");
        for _ in 0..8 {
            guard.unreachable(&down);
        }
        let b = guard.inner.backoff.lock().expect("backoff lock");
        let defaults = GuardOptions::default();
        assert_eq!(b.next, defaults.backoff * 2, "one doubling, not eight");
        assert!(b.until.expect("backing off") <= Instant::now() + defaults.backoff);
    }

    #[tokio::test]
    async fn an_outcome_queue_of_zero_is_refused_naming_the_option() {
        let options = GuardOptions {
            outcome_queue: 0,
            ..GuardOptions::default()
        };
        let refused = Guard::connect("http://127.0.0.1:1", None, options)
            .err()
            .expect("refused");
        assert!(matches!(refused, ConnectError::OutcomeQueue));
        assert!(refused.to_string().contains("GuardOptions::outcome_queue"));
    }

    /// Outside a runtime no sender starts, so nothing leaves the queue: it
    /// holds `outcome_queue` outcomes, and drops and counts the rest.
    #[test]
    fn a_full_outcome_queue_drops_and_counts() {
        let options = GuardOptions {
            outcome_queue: 3,
            ..GuardOptions::default()
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        // The channel needs a runtime; the pushes below are made outside it.
        let guard = {
            let _inside = runtime.enter();
            Guard::connect("http://127.0.0.1:1", None, options).expect("a lazy channel")
        };
        for n in 0..5 {
            guard
                .inner
                .outcomes
                .push(format!("ticket-{n}"), Outcome::Success, None);
        }
        let stats = guard.stats();
        assert_eq!((stats.outcomes_dropped, stats.complete_failures), (2, 0));
    }

    #[tokio::test]
    async fn an_acquire_carries_the_calls_caller_else_the_guards_and_its_attempt() {
        let connect = |caller: Option<&str>| {
            let options = GuardOptions {
                caller: caller.map(str::to_owned),
                ..GuardOptions::default()
            };
            Guard::connect("http://127.0.0.1:1", None, options).expect("a lazy channel")
        };
        let retry = CallOptions {
            caller: Some("retrier".into()),
            attempt: Some(2),
            ..CallOptions::default()
        };
        let guard = connect(Some("checkout"));
        let first = guard.acquire_request("k", &CallOptions::default());
        assert_eq!((first.caller.as_str(), first.attempt), ("checkout", None));
        let again = guard.acquire_request("k", &retry);
        assert_eq!((again.caller.as_str(), again.attempt), ("retrier", Some(2)));
        let anonymous = connect(None).acquire_request("k", &CallOptions::default());
        assert_eq!((anonymous.caller.as_str(), anonymous.attempt), ("", None));
    }

    #[test]
    fn the_open_cache_is_bounded_and_forgets_what_ended() {
        let now = Instant::now();
        let mut cache = OpenCache {
            capacity: 2,
            until: HashMap::new(),
        };
        cache.put("a", now + Duration::from_secs(1), now);
        cache.put("b", now + Duration::from_secs(3), now);
        cache.put("c", now + Duration::from_secs(2), now);
        assert_eq!(cache.until.len(), 2);
        assert!(cache.get("a", now).is_none(), "the first to end is evicted");
        assert!(cache.get("b", now).is_some());
        assert!(cache.get("c", now + Duration::from_secs(2)).is_none());
        assert!(!cache.until.contains_key("c"));
    }
}

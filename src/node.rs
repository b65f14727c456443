//! One fusebox server's own part, beside the store it serves: who may call
//! it (watched, since a reload replaces it), every cap of its `[server]`
//! section, the host names its HTTP side answers to, its counters, its
//! ports' caps and figures, its budget of unread answers and the TLS it
//! serves with. [`crate::serve::bind`] makes one from the config; the gRPC
//! services, the HTTP side and the config watcher share it. The store
//! (embedded or Redis) knows nothing of it.
//!
//! Nothing of a server is kept in a process-wide static: two servers in
//! one process (tests, an embedding program) count, cap and bound apart.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::auth::{Access, Grant};
use crate::config::Limits;
use crate::connections::Ports;
use crate::engine::shares::Share;
use crate::engine::Store;
pub use crate::log_gate::LogGate;
use crate::outbox::Budget;
use crate::telemetry::Telemetry;
use crate::tls::Tls;

/// Counters of a server around its store, for metrics (the store's own
/// figures are [`Store::figures`]).
#[derive(Debug)]
pub struct Counters {
    /// Config reloads that were applied.
    pub reloads: AtomicU64,
    /// Config reloads refused because the file was invalid.
    pub reload_failures: AtomicU64,
    /// 1 when the last reload attempt succeeded (or none was made), else 0.
    pub last_reload_ok: AtomicU64,
    /// Open Watch streams.
    pub watch_streams: AtomicU64,
    /// Watch streams refused because the cap was reached.
    pub watch_streams_refused: AtomicU64,
    /// gRPC calls in flight.
    pub calls_in_flight: AtomicU64,
    /// gRPC calls answered UNAUTHENTICATED on their headers, before their
    /// body was read.
    pub calls_unauthenticated: AtomicU64,
    /// `Decide` streams open.
    pub decide_streams: AtomicU64,
    /// `Decide` streams refused: their connection, the server or their
    /// credential had the most open.
    pub decide_streams_refused: AtomicU64,
    /// Frames received on `Decide` streams.
    pub decide_frames: AtomicU64,
    /// Frames answered RESOURCE_EXHAUSTED at a stream's limits (per message,
    /// unanswered).
    pub decide_frames_refused: AtomicU64,
    /// Answers sent on `Decide` streams.
    pub decide_answers: AtomicU64,
    /// Items of AcquireBatch and CompleteBatch calls.
    pub batch_items: AtomicU64,
    /// ShouldRateLimit calls answered.
    pub rls_requests: AtomicU64,
    /// ShouldRateLimit calls answered OVER_LIMIT.
    pub rls_over_limit: AtomicU64,
    /// Descriptors in shadow mode that were over their limit (answered OK).
    pub rls_shadow_over_limit: AtomicU64,
    /// Descriptors that matched no configured limit (answered OK, uncharged).
    pub rls_unmatched: AtomicU64,
    /// ShouldRateLimit checks refused whole, and descriptors answered
    /// otherwise than counted, by [`RlsTrouble`].
    pub rls_trouble: [AtomicU64; RlsTrouble::ALL.len()],
    /// When each kind of trouble was last logged, and how many since.
    pub rls_logged: [LogGate; RlsTrouble::ALL.len()],
    /// The same for shadow descriptors over their limit.
    pub rls_shadow_logged: LogGate,
}

/// What went otherwise than a plain answer for a ShouldRateLimit check
/// (RL18): counted on `/metrics` by reason and logged at most once a
/// second each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RlsTrouble {
    /// The check was refused whole: bad input (RL2).
    InvalidArgument,
    /// The check was refused whole: no credential, or a wrong one (RL11).
    Unauthenticated,
    /// The check was refused whole: the credential may not charge a key.
    PermissionDenied,
    /// The check could not be decided: the store, shutting down (RL12).
    Unavailable,
    /// A descriptor's key could not be made (a cap, a share): answered as
    /// `[rls] no_room` says (RL18).
    NoRoom,
    /// A descriptor's values were digested into a bounded key (RL17).
    Digested,
    /// A descriptor's new key was past its node's budget of keys:
    /// answered as `[rls] no_room` says (RL20).
    OverBudget,
}

impl RlsTrouble {
    /// Every kind, in their order in the counters.
    pub const ALL: [RlsTrouble; 7] = [
        RlsTrouble::InvalidArgument,
        RlsTrouble::Unauthenticated,
        RlsTrouble::PermissionDenied,
        RlsTrouble::Unavailable,
        RlsTrouble::NoRoom,
        RlsTrouble::Digested,
        RlsTrouble::OverBudget,
    ];

    /// Its label on `/metrics`.
    pub fn as_str(self) -> &'static str {
        match self {
            RlsTrouble::InvalidArgument => "invalid_argument",
            RlsTrouble::Unauthenticated => "unauthenticated",
            RlsTrouble::PermissionDenied => "permission_denied",
            RlsTrouble::Unavailable => "unavailable",
            RlsTrouble::NoRoom => "no_room",
            RlsTrouble::Digested => "digested",
            RlsTrouble::OverBudget => "over_budget",
        }
    }
}

impl Counters {
    /// Counts `trouble` and logs `what` (at most once a second per kind).
    pub fn rls_trouble(&self, trouble: RlsTrouble, what: impl FnOnce() -> String) {
        let i = trouble as usize;
        self.rls_trouble[i].fetch_add(1, Ordering::Relaxed);
        if let Some(held) = self.rls_logged[i].pass() {
            tracing::warn!(
                reason = trouble.as_str(),
                similar_held_back = held,
                "rate-limit check: {}",
                what()
            );
        }
    }
}

impl Default for Counters {
    fn default() -> Self {
        Counters {
            reloads: AtomicU64::new(0),
            reload_failures: AtomicU64::new(0),
            last_reload_ok: AtomicU64::new(1),
            watch_streams: AtomicU64::new(0),
            watch_streams_refused: AtomicU64::new(0),
            calls_in_flight: AtomicU64::new(0),
            calls_unauthenticated: AtomicU64::new(0),
            decide_streams: AtomicU64::new(0),
            decide_streams_refused: AtomicU64::new(0),
            decide_frames: AtomicU64::new(0),
            decide_frames_refused: AtomicU64::new(0),
            decide_answers: AtomicU64::new(0),
            batch_items: AtomicU64::new(0),
            rls_requests: AtomicU64::new(0),
            rls_over_limit: AtomicU64::new(0),
            rls_shadow_over_limit: AtomicU64::new(0),
            rls_unmatched: AtomicU64::new(0),
            rls_trouble: Default::default(),
            rls_logged: Default::default(),
            rls_shadow_logged: LogGate::default(),
        }
    }
}

/// One server: its store and what belongs to it alone.
#[derive(Debug)]
pub struct Node {
    store: Store,
    access: tokio::sync::watch::Sender<Option<Arc<Access>>>,
    limits: Limits,
    http_hosts: Vec<String>,
    counters: Counters,
    ports: Arc<Ports>,
    unread: Arc<Budget>,
    tls: Option<Arc<Tls>>,
    rls: std::sync::RwLock<Arc<crate::rls::Rls>>,
    telemetry: Option<Arc<Telemetry>>,
}

impl Node {
    /// A server of `store` under `access` (`None`: no `[auth]`), with the
    /// caps `limits` and the extra HTTP host names `http_hosts`, without
    /// TLS. Each credential gets its share of the store's caps; the ports'
    /// caps are fitted to the open-file limit.
    pub fn new(
        store: Store,
        access: Option<Access>,
        limits: Limits,
        http_hosts: Vec<String>,
    ) -> Node {
        let node = Node {
            store,
            access: tokio::sync::watch::channel(None).0,
            limits,
            http_hosts,
            counters: Counters::default(),
            ports: Arc::new(Ports::new(&limits.connections())),
            unread: Arc::new(Budget::new(&limits.unread())),
            tls: None,
            rls: std::sync::RwLock::new(Arc::default()),
            telemetry: None,
        };
        node.set_access(access.map(Arc::new));
        node
    }

    /// The same server, sending traces with `telemetry` (`None`: no trace
    /// is made).
    pub fn with_telemetry(mut self, telemetry: Option<Arc<Telemetry>>) -> Node {
        self.telemetry = telemetry;
        self
    }

    /// Its traces' pipeline, when `[telemetry]` is set.
    pub fn telemetry(&self) -> Option<&Arc<Telemetry>> {
        self.telemetry.as_ref()
    }

    /// The same server, serving with `tls` (its figures are shown in the
    /// metrics).
    pub fn with_tls(mut self, tls: Option<Arc<Tls>>) -> Node {
        self.tls = tls;
        self
    }

    /// The same server, answering Envoy's rate-limit service under `rls`.
    pub fn with_rls(self, rls: crate::rls::Rls) -> Node {
        self.set_rls(rls);
        self
    }

    /// The rate-limit service's mapping in force.
    pub fn rls(&self) -> Arc<crate::rls::Rls> {
        self.rls.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Puts a reloaded rate-limit service's mapping in force.
    pub fn set_rls(&self, rls: crate::rls::Rls) {
        *self.rls.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(rls);
    }

    /// The store it serves.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Who may do what (`[auth]`), or `None` when anyone may.
    pub fn access(&self) -> Option<Arc<Access>> {
        self.access.borrow().clone()
    }

    /// Who may do what, watched: it changes when a reload replaces it.
    pub fn watch_access(&self) -> tokio::sync::watch::Receiver<Option<Arc<Access>>> {
        self.access.subscribe()
    }

    /// Replaces who may do what; each credential's share, and its part of
    /// the unread stream answers, follow.
    pub fn set_access(&self, access: Option<Arc<Access>>) {
        let tenants = access.as_deref().map(Access::tenants);
        let core = self.store.core();
        core.shares().adopt(tenants.as_ref(), &core.limits());
        self.unread.adopt(tenants.as_ref());
        self.access.send_replace(access);
    }

    /// The share of `grant`'s credential (`None` without `[auth]`).
    pub fn share_of(&self, grant: Option<&Grant>) -> Option<Arc<Share>> {
        grant.and_then(|g| self.store.core().shares().of(&g.tenant))
    }

    /// Every cap of `[server]`.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Host names the HTTP side answers to besides loopback names and its
    /// listen address (`[server] http_hosts`).
    pub fn http_hosts(&self) -> &[String] {
        &self.http_hosts
    }

    /// The server's counters.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Its ports' caps in force, the gRPC port's figures and strangers.
    pub fn ports(&self) -> &Arc<Ports> {
        &self.ports
    }

    /// Its budget of stream answers not yet read, and their figures.
    pub fn unread(&self) -> &Arc<Budget> {
        &self.unread
    }

    /// The TLS it serves with, if any.
    pub fn tls(&self) -> Option<&Arc<Tls>> {
        self.tls.as_ref()
    }

    /// Whether it is shutting down.
    pub fn is_shutting_down(&self) -> bool {
        self.store.core().is_shutting_down()
    }

    /// Counts a reload attempt.
    pub fn count_reload(&self, applied: bool) {
        let c = &self.counters;
        if applied {
            c.reloads.fetch_add(1, Ordering::Relaxed);
        } else {
            c.reload_failures.fetch_add(1, Ordering::Relaxed);
        }
        c.last_reload_ok
            .store(u64::from(applied), Ordering::Relaxed);
    }
}

impl Node {
    /// A server of `store` as [`From`] makes it, shared.
    pub fn of(store: impl Into<Store>) -> Arc<Node> {
        Arc::new(Node::from(store.into()))
    }
}

impl From<Store> for Node {
    /// A server of `store` with the default caps and no `[auth]`: the
    /// store's own caps stay as they are.
    fn from(store: Store) -> Node {
        let mut limits = Limits::default();
        limits.set_engine(store.core().limits());
        Node::new(store, None, limits, Vec::new())
    }
}

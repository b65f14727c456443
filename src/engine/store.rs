//! The one store interface: where the keys live, chosen once at start-up.
//! The gRPC services, the HTTP side, the timer and the tools hold a
//! [`Store`] and call it; each method has one implementation per store,
//! the embedded [`Engine`] (keys in this process) and a [`SharedStore`]
//! (keys that many servers share: Redis or Redis Cluster, through the
//! fusebox module, `super::redis`), and nothing outside this file asks
//! which one it has. This file names no store's own types: a shared store
//! implements [`SharedStore`] and is handed over as one.
//!
//! A figure one store cannot give is an `Option` here, not a branch in the
//! caller. Figures are this server's (decisions, transitions, busiest keys)
//! or the whole store's (keys, keys by phase, tickets, waiters): with the
//! embedded engine the two are the same; with Redis the second kind is the
//! fleet's, read from every primary (see [`Figures::fleet_wide`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;

use super::budgets::NodeUse;
use super::rules::{Pattern, Rule, Rules};
use super::shares::{self, Kind, Share};
use super::tickets::ticket_of;
use super::{
    AcquireArgs, AcquireReply, CompleteReply, Core, Engine, EngineError, KeyReading,
    StorageFigures, Totals,
};
use crate::domain::wire::Channel;
use crate::domain::{Millis, OperatorAction, Outcome, Phase, Policy, TicketId};

/// Where a listing goes on from: the start, after a key (the embedded
/// engine lists in key order), or a scan cursor of one primary (Redis).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cursor {
    /// The first page.
    Start,
    /// The page after this key, in key order.
    After(String),
    /// The next `SCAN` step of the `node`-th primary (in the order of the
    /// slots they serve), from `cursor`.
    Scan {
        /// The primary.
        node: usize,
        /// A hash of the primary's address when the cursor was given: a
        /// cursor means nothing to another process (Redis seeds its hash
        /// tables per process), so a listing whose primary changed
        /// restarts that primary's scan.
        at: u32,
        /// Its `SCAN` cursor.
        cursor: u64,
        /// Inside the bucket at `cursor`: the last key listed (the bucket
        /// held more keys than a page).
        after: Option<String>,
    },
}

/// Keys an embedded listing reads between two yields to other requests.
const LIST_SLICE: usize = 100;

/// What a cursor's text starts with when it is a scan (a key cannot: K1
/// keeps control characters out of keys).
const SCAN_MARK: char = '\u{1}';

impl Cursor {
    /// The cursor as text, for a page token.
    pub fn text(&self) -> String {
        match self {
            Cursor::Start => String::new(),
            Cursor::After(key) => key.clone(),
            Cursor::Scan {
                node,
                at,
                cursor,
                after,
            } => match after {
                None => format!("{SCAN_MARK}{node}:{at:x}:{cursor}"),
                Some(key) => format!("{SCAN_MARK}{node}:{at:x}:{cursor}:{key}"),
            },
        }
    }

    /// The cursor a page token's text names.
    pub fn of_text(text: &str) -> Option<Cursor> {
        if text.is_empty() {
            return Some(Cursor::Start);
        }
        match text.strip_prefix(SCAN_MARK) {
            Some(scan) => {
                let mut parts = scan.splitn(4, ':');
                let node = parts.next()?.parse().ok()?;
                let at = u32::from_str_radix(parts.next()?, 16).ok()?;
                let cursor = parts.next()?.parse().ok()?;
                let after = parts.next().map(str::to_owned);
                Some(Cursor::Scan {
                    node,
                    at,
                    cursor,
                    after,
                })
            }
            None => Some(Cursor::After(text.to_owned())),
        }
    }
}

/// A page of keys.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Listed {
    /// The keys read.
    pub readings: Vec<KeyReading>,
    /// Where the next page starts; `None` after the last.
    pub next: Option<Cursor>,
}

/// What `/metrics` and the dashboard show of a store.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Figures {
    /// Keys, keys by phase, tickets and waiters ([`Totals`] has them with
    /// the counters of this server: decisions, reasons, transitions, cap
    /// refusals).
    pub totals: Totals,
    /// Keys forgotten at rest (K2), when the store counts them.
    pub forgotten: Option<u64>,
    /// True when keys, phases, tickets and waiters are the whole store's,
    /// across servers (Redis), rather than this server's (which, embedded,
    /// is the same thing).
    pub fleet_wide: bool,
}

/// A change to the rules in force; refused changes change nothing.
pub type RulesChange<'a> = Box<dyn FnOnce(&mut Rules) -> Result<(), EngineError> + 'a>;

/// A store that many servers share (Redis, through the fusebox module):
/// the keys live outside this process, and each operation is a round trip
/// to it. Its methods are those of [`Store`] (see there); futures are
/// boxed, since the store is held as a trait object, picked at start-up.
pub trait SharedStore: Send + Sync + std::fmt::Debug {
    /// Charges every item or none, without tickets (Envoy's rate-limit
    /// service; see [`Engine::charge_all`]).
    fn charge_all<'a>(
        &'a self,
        items: &'a [super::ChargeItem],
    ) -> BoxFuture<'a, Result<super::ChargeReply, EngineError>>;

    /// What the store shares with the server around it.
    fn core(&self) -> &Arc<Core>;
    /// Answers an acquire, waiting while queued.
    fn acquire(&self, args: AcquireArgs) -> BoxFuture<'_, Result<AcquireReply, EngineError>>;
    /// Records a ticket's outcome and the permits the call really used (U1).
    fn complete<'a>(
        &'a self,
        token: &'a str,
        outcome: Outcome,
        cost: Option<u32>,
    ) -> BoxFuture<'a, Result<CompleteReply, EngineError>>;
    /// Extends a live ticket's lease; returns the time left.
    fn renew<'a>(
        &'a self,
        token: &'a str,
        lease: Option<Millis>,
    ) -> BoxFuture<'a, Result<Millis, EngineError>>;
    /// The id in a ticket's token.
    fn ticket_id(&self, token: &str) -> Option<TicketId>;
    /// The key a ticket's token names.
    fn ticket_key(&self, token: &str) -> Result<Arc<str>, EngineError>;
    /// Reads a key, and whether the store holds it.
    fn read<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(KeyReading, bool), EngineError>>;
    /// Takes an operator's `action` on a key, recording who and why.
    fn operate<'a>(
        &'a self,
        key: &'a str,
        reason: &'a str,
        who: &'a str,
        action: OperatorAction,
    ) -> BoxFuture<'a, Result<KeyReading, EngineError>>;
    /// A page of keys.
    fn list_page<'a>(
        &'a self,
        prefix: &'a str,
        phases: &'a [Phase],
        from: &'a Cursor,
        limit: usize,
    ) -> BoxFuture<'a, Result<Listed, EngineError>>;
    /// Up to `limit` keys not CLOSED, and whether more are.
    fn not_closed<'a>(
        &'a self,
        prefix: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<(Vec<KeyReading>, bool), EngineError>>;
    /// The `n` keys with the most requests lately, on this server.
    fn busiest(&self, n: usize) -> BoxFuture<'_, Vec<KeyReading>>;
    /// The figures of `/metrics` and the dashboard.
    fn figures(&self) -> BoxFuture<'_, Figures>;
    /// What the connection to the store did.
    fn connection_figures(&self) -> &StoreFigures;
    /// Applies `change` to the rules, puts them in force and shares them.
    fn change_rules(&self, change: RulesChange<'_>) -> Result<(), EngineError>;
    /// Runs what the store does on time until the server shuts down.
    fn run_timer(&self) -> BoxFuture<'_, ()>;
    /// Moves the manual clock forward; `None` without one.
    fn advance_clock(&self, by: Millis) -> BoxFuture<'_, Option<Millis>>;
    /// Stops taking requests and answers every waiter with UNAVAILABLE.
    fn shutdown(&self);
}

/// What the connection to a shared store did, for /metrics.
#[derive(Debug, Default)]
pub struct StoreFigures {
    /// Commands sent.
    pub commands: AtomicU64,
    /// Commands that failed because the store could not be reached (or
    /// timed out, or its cluster was down): each answered UNAVAILABLE.
    pub unavailable: AtomicU64,
    /// Commands that met a slot on the move (MOVED, ASK, TRYAGAIN) and
    /// failed after the cluster client's retries.
    pub moved: AtomicU64,
    /// Times the answers/events subscription was (re)connected.
    pub subscriptions: AtomicU64,
    /// Operator actions whose replica confirmation (`WAIT`) timed out.
    pub unconfirmed: AtomicU64,
    /// Probes no replica confirmed in time, given back (the caller was
    /// told to ask again).
    pub unconfirmed_probes: AtomicU64,
    /// Messages dropped because they could not be verified (or, on the
    /// answers channel, named another key or ticket than their waiter's),
    /// by channel, in the order of [`NOTICE_CHANNELS`].
    pub notices_dropped: [AtomicU64; 3],
    /// 1 while the breaker on the link to the store is open (the store
    /// unreachable: calls answer UNAVAILABLE at once), else 0 (F7).
    pub link_down: AtomicU64,
    /// Times the breaker on the link opened.
    pub link_breaks: AtomicU64,
    /// Calls answered UNAVAILABLE at once because the breaker was open.
    pub fast_failed: AtomicU64,
    /// Reads of the shared policies (the `fusebox:policies` key) whose
    /// content could not be verified; the running rules stayed.
    pub policies_unverified: AtomicU64,
    /// Signed messages refused as old, by channel ([`NOTICE_CHANNELS`]):
    /// an event not newer than the last one of its key, or too old, and a
    /// policy change naming a version older than the one in force.
    pub notices_replayed: [AtomicU64; 3],
    /// Reads of the shared policies that verified but held a version older
    /// than one this server has seen; the running rules stayed.
    pub policies_rolled_back: AtomicU64,
    /// Keys whose last event is remembered, to refuse older ones.
    pub event_orders: AtomicU64,
    /// Keys forgotten from that memory, past its cap, while their events
    /// were young enough to be taken again.
    pub event_orders_evicted: AtomicU64,
    /// When a dropped notice was last logged, and how many were dropped
    /// since.
    drops_logged: std::sync::Mutex<(Option<Instant>, u64)>,
    /// The same for messages refused as old.
    replays_logged: std::sync::Mutex<(Option<Instant>, u64)>,
}

/// The channels whose messages are verified, as `notices_dropped` counts
/// them ([`Channel::ALL`]).
pub const NOTICE_CHANNELS: [&str; 3] = [
    Channel::ALL[0].as_str(),
    Channel::ALL[1].as_str(),
    Channel::ALL[2].as_str(),
];

/// How often dropped notices are logged at most.
const DROPS_LOGGED_EVERY: Duration = Duration::from_secs(5);

impl StoreFigures {
    /// Counts a message dropped on `channel` (or the policies key when
    /// `channel` is `None`) and logs it, at most once every few seconds,
    /// with `why`.
    pub(crate) fn dropped(&self, channel: Option<Channel>, why: &str) {
        let counter = match channel {
            Some(channel) => &self.notices_dropped[channel.index()],
            None => &self.policies_unverified,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        if let Some((count, place)) = due(&self.drops_logged, channel) {
            tracing::warn!(
                dropped = count,
                "dropped {count} message(s) from the store that could not be trusted (the last on {place}: {why}); someone who can reach Redis may be forging them, or a node or server has another secret; see fusebox_store_notices_dropped_total"
            );
        }
    }

    /// Counts a signed message refused as old on `channel` (or a read of
    /// the policies key when `channel` is `None`) and logs it, at most
    /// once every few seconds, with `why`.
    pub(crate) fn replayed(&self, channel: Option<Channel>, why: &str) {
        let counter = match channel {
            Some(channel) => &self.notices_replayed[channel.index()],
            None => &self.policies_rolled_back,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        if let Some((count, place)) = due(&self.replays_logged, channel) {
            tracing::warn!(
                refused = count,
                "refused {count} signed message(s) from the store as old (the last on {place}: {why}); someone who can reach Redis may be publishing captured messages again; see fusebox_store_notices_replayed_total"
            );
        }
    }
}

/// Counts one more message for `logged`; `Some((messages since the last
/// line, where the last came from))` when a line is due (at most one every
/// [`DROPS_LOGGED_EVERY`]).
fn due(
    logged: &std::sync::Mutex<(Option<Instant>, u64)>,
    channel: Option<Channel>,
) -> Option<(u64, String)> {
    let mut logged = logged.lock().expect("messages logged");
    logged.1 += 1;
    if logged.0.is_some_and(|at| at.elapsed() < DROPS_LOGGED_EVERY) {
        return None;
    }
    let count = std::mem::take(&mut logged.1);
    logged.0 = Some(Instant::now());
    let place = channel.map_or_else(
        || "the policies key fusebox:policies".to_owned(),
        |c| format!("channel {}", c.as_str()),
    );
    Some((count, place))
}

/// Where the keys live.
#[derive(Clone, Debug)]
pub enum Store {
    /// In this process.
    Embedded(Arc<Engine>),
    /// In a store the servers share: Redis, through the fusebox module.
    Redis(Arc<dyn SharedStore>),
}

impl From<Arc<Engine>> for Store {
    fn from(engine: Arc<Engine>) -> Store {
        Store::Embedded(engine)
    }
}

/// A credential's share of rules and which rules it holds (the patterns
/// inside its prefixes), for [`Store::set_rule_within`].
pub type RuleShare<'a> = (&'a Share, &'a dyn Fn(&Pattern) -> bool);
impl Store {
    /// What the store shares with the server around it.
    pub fn core(&self) -> &Arc<Core> {
        match self {
            Store::Embedded(e) => e.core(),
            Store::Redis(r) => r.core(),
        }
    }

    /// Charges every item or none, without tickets (Envoy's rate-limit
    /// service): under the keys' shard locks embedded, in one `FB.CHARGE`
    /// on a shared store (the keys must share a hash slot).
    /// Keys it makes count against `share` (decisions 99), as Acquire's do.
    pub async fn charge_all(
        &self,
        items: &[super::ChargeItem],
        share: Option<&Arc<Share>>,
    ) -> Result<super::ChargeReply, EngineError> {
        // F1: a call whose deadline passed while it waited is not decided.
        super::deadline::check()?;
        if let (Store::Redis(_), Some(share)) = (self, share) {
            let now = self.core().now();
            for item in items {
                self.use_key(share, &item.key, now).await?;
            }
        }
        match self {
            Store::Embedded(e) => e.charge_all(items, share),
            Store::Redis(r) => r.charge_all(items).await,
        }
    }

    /// Counts a key charged through a rate-limit node that takes any
    /// value in that node's budget for `share`'s credential (RL20): its
    /// `max_keys`, else its part of the credential's key share (of
    /// `[server] max_keys` without a credential), rounded up. Embedded, a
    /// key counts until it would be back at rest (then it may be
    /// forgotten to make room); with a store, for as long as the share
    /// counts it too (decisions 104), so that a node never holds more of
    /// the share than its budget. Err: the budget, when the key is new
    /// and the node counts that many keys.
    pub fn use_node_key(&self, share: Option<&Arc<Share>>, node: NodeUse<'_>) -> Result<(), u64> {
        let limits = self.core().limits();
        let base = share.map_or(limits.max_keys, |s| s.limit(Kind::Keys));
        let limit = node
            .max_keys
            .unwrap_or_else(|| shares::default_limit(base, node.part));
        let now = self.core().now();
        let held_for = match self {
            Store::Embedded(_) => node.rests_within,
            Store::Redis(_) => node
                .rests_within
                .saturating_add(shares::key_idle_after(&limits)),
        };
        let tenant = share.map_or("", |s| s.name());
        let taken = self.core().budgets().use_key(
            node.node,
            tenant,
            node.key,
            now,
            now.saturating_add(held_for),
            limit,
        );
        if taken {
            Ok(())
        } else {
            Err(limit)
        }
    }

    /// Answers an acquire (B1, P1–P6, C1–C4), waiting while queued.
    pub async fn acquire(&self, args: AcquireArgs) -> Result<AcquireReply, EngineError> {
        // F1: a call whose deadline passed while it waited is not decided.
        super::deadline::check()?;
        match self {
            Store::Embedded(e) => e.acquire(args).await,
            Store::Redis(r) => r.acquire(args).await,
        }
    }

    /// [`Store::acquire`] for a credential with a share (decisions 99):
    /// the request holds a waiter's unit while it may wait, a granted
    /// ticket holds a ticket's until it is completed or its lease ends,
    /// and a key it makes (embedded) holds a key's while the key lives
    /// (with a store: while it asks for the key, decisions 104).
    pub async fn acquire_as(
        &self,
        args: AcquireArgs,
        share: Option<&Arc<Share>>,
    ) -> Result<AcquireReply, EngineError> {
        let Some(share) = share.filter(|_| args.permits > 0) else {
            return self.acquire(args).await;
        };
        super::deadline::check()?;
        let _waiting = match args.max_wait {
            0 => None,
            _ => Some(share.take(Kind::Waiters)?),
        };
        let now = self.core().now();
        let ticket = share.take_ticket(now)?;
        if let Store::Redis(_) = self {
            self.use_key(share, &args.key, now).await?;
        }
        let reply = match self {
            Store::Embedded(e) => e.acquire_for(args, Some(share)).await,
            Store::Redis(r) => r.acquire(args).await,
        }?;
        if let (Some(token), Some(left)) = (&reply.ticket, reply.lease_left) {
            if let Some(id) = self.ticket_id(token) {
                ticket.keep(id, self.core().now().saturating_add(left));
            }
        }
        Ok(reply)
    }

    /// With a store, counts `key` among `share`'s keys (decisions 104,
    /// 148). A key new here that the share refuses for what the other
    /// servers hold, or while the store is nearly full, goes on when the
    /// store already holds it: a key that exists makes nothing grow.
    async fn use_key(&self, share: &Share, key: &str, now: Millis) -> Result<(), EngineError> {
        let idle_after = shares::key_idle_after(&self.core().limits());
        let refused = match share.use_key(key, now, idle_after) {
            Err(e @ EngineError::StoreFull(_)) => e,
            Err(e @ EngineError::ShareExhausted { .. }) if share.elsewhere(Kind::Keys) > 0 => e,
            other => return other,
        };
        match self.read(key).await {
            Ok((_, true)) => {
                share.keep_key(key, now);
                Ok(())
            }
            _ => Err(refused),
        }
    }

    /// The id in a ticket's token (a Redis store's token also names its key).
    fn ticket_id(&self, token: &str) -> Option<TicketId> {
        match self {
            Store::Embedded(_) => ticket_of(token).ok(),
            Store::Redis(r) => r.ticket_id(token),
        }
    }

    /// Records a ticket's outcome (B3, C5, L4) and the permits the call
    /// really used (U1; `None` = what the ticket took).
    pub async fn complete(
        &self,
        token: &str,
        outcome: Outcome,
        cost: Option<u32>,
    ) -> Result<CompleteReply, EngineError> {
        match self {
            Store::Embedded(e) => e.complete_with_cost(token, outcome, cost),
            Store::Redis(r) => r.complete(token, outcome, cost).await,
        }
    }

    /// [`Store::complete`] by a credential: the ticket leaves its share
    /// once the store settled it (or no longer knows it).
    pub async fn complete_as(
        &self,
        token: &str,
        outcome: Outcome,
        cost: Option<u32>,
        share: Option<&Arc<Share>>,
    ) -> Result<CompleteReply, EngineError> {
        let result = self.complete(token, outcome, cost).await;
        if let (Some(share), Ok(_) | Err(EngineError::TicketNotFound)) = (share, &result) {
            if let Some(id) = self.ticket_id(token) {
                share.let_go(id);
            }
        }
        result
    }

    /// Extends a live ticket's lease; returns the time left (L2).
    pub async fn renew(&self, token: &str, lease: Option<Millis>) -> Result<Millis, EngineError> {
        match self {
            Store::Embedded(e) => e.renew(token, lease),
            Store::Redis(r) => r.renew(token, lease).await,
        }
    }

    /// [`Store::renew`] by a credential: its share counts the ticket to
    /// its new lease end.
    pub async fn renew_as(
        &self,
        token: &str,
        lease: Option<Millis>,
        share: Option<&Arc<Share>>,
    ) -> Result<Millis, EngineError> {
        let left = self.renew(token, lease).await?;
        if let (Some(share), Some(id)) = (share, self.ticket_id(token)) {
            share.renewed(id, self.core().now().saturating_add(left));
        }
        Ok(left)
    }

    /// The key a live ticket belongs to (for the permission check); a
    /// token of no live ticket is NOT_FOUND (L4).
    pub fn ticket_key(&self, token: &str) -> Result<Arc<str>, EngineError> {
        match self {
            Store::Embedded(e) => e.ticket_key(token),
            Store::Redis(r) => r.ticket_key(token),
        }
    }

    /// Reads a key (B6); a key never used reads as a fresh one would (K2).
    pub async fn get(&self, key: &str) -> Result<KeyReading, EngineError> {
        match self {
            Store::Embedded(e) => e.get(key),
            Store::Redis(r) => r.read(key).await.map(|(reading, _)| reading),
        }
    }

    /// [`Store::get`], and whether the key is live (false: it reads as a
    /// fresh key would).
    pub async fn read(&self, key: &str) -> Result<(KeyReading, bool), EngineError> {
        match self {
            Store::Embedded(e) => e.get_live(key),
            Store::Redis(r) => r.read(key).await,
        }
    }

    /// Takes an operator's `action` on a key (B5): isolates or closes it,
    /// recording who asked and why.
    pub async fn operate(
        &self,
        key: &str,
        reason: &str,
        who: &str,
        action: OperatorAction,
    ) -> Result<KeyReading, EngineError> {
        match self {
            Store::Embedded(e) => e.operate(key, reason, who, action),
            Store::Redis(r) => r.operate(key, reason, who, action).await,
        }
    }

    /// A page of at most `limit` keys that start with `prefix` and are in
    /// one of `phases` (any, when empty), from `from`. The embedded engine
    /// lists in key order; Redis lists each primary's keys in its scan
    /// order, one bounded step per primary per page, each page in key
    /// order (a page may then be short with more to come).
    pub async fn list_page(
        &self,
        prefix: &str,
        phases: &[Phase],
        from: &Cursor,
        limit: usize,
    ) -> Result<Listed, EngineError> {
        match self {
            Store::Embedded(e) => {
                let after = match from {
                    Cursor::Start => None,
                    Cursor::After(key) => Some(key.as_str()),
                    Cursor::Scan { .. } => {
                        return Err(super::error::invalid(
                            "page_token",
                            "is a token of a server with --store; send it to one",
                        ))
                    }
                };
                // Read a slice at a time, yielding in between, so that a
                // listing of every key never holds a worker for more than
                // a slice: decisions on the same worker keep their latency.
                let mut readings = Vec::with_capacity(limit.min(LIST_SLICE * 10));
                let mut after = after.map(str::to_owned);
                loop {
                    let slice = (limit - readings.len()).min(LIST_SLICE);
                    let page = e.list_page(prefix, phases, after.as_deref(), slice);
                    after = page.readings.last().map(|r| r.key.clone()).or(after);
                    readings.extend(page.readings);
                    if !page.more {
                        return Ok(Listed {
                            readings,
                            next: None,
                        });
                    }
                    if readings.len() >= limit {
                        let next = after.map(Cursor::After);
                        return Ok(Listed { readings, next });
                    }
                    tokio::task::yield_now().await;
                }
            }
            Store::Redis(r) => r.list_page(prefix, phases, from, limit).await,
        }
    }

    /// Up to `limit` keys that are not CLOSED and start with `prefix`, in
    /// key order, and whether more are.
    pub async fn not_closed(
        &self,
        prefix: &str,
        limit: usize,
    ) -> Result<(Vec<KeyReading>, bool), EngineError> {
        const NOT_CLOSED: [Phase; 3] = [Phase::Open, Phase::HalfOpen, Phase::Isolated];
        match self {
            Store::Embedded(e) => Ok(e.list(prefix, &NOT_CLOSED, None, limit)),
            Store::Redis(r) => r.not_closed(prefix, limit).await,
        }
    }

    /// The `n` keys with the most requests lately (on this server, with
    /// Redis), busiest first.
    pub async fn busiest(&self, n: usize) -> Vec<KeyReading> {
        match self {
            Store::Embedded(e) => e.busiest(n),
            Store::Redis(r) => r.busiest(n).await,
        }
    }

    /// The figures of `/metrics` and the dashboard.
    pub async fn figures(&self) -> Figures {
        match self {
            Store::Embedded(e) => {
                let totals = e.totals();
                Figures {
                    forgotten: Some(totals.forgotten),
                    totals,
                    fleet_wide: false,
                }
            }
            Store::Redis(r) => r.figures().await,
        }
    }

    /// Keys at rest forgotten to make room for a new key, since start
    /// (the embedded engine's; Redis forgets keys itself).
    pub fn keys_evicted(&self) -> Option<u64> {
        match self {
            Store::Embedded(e) => Some(e.keys_evicted()),
            Store::Redis(_) => None,
        }
    }

    /// Idle sweep batches run since start, and the largest batch (the
    /// embedded engine's; Redis forgets keys itself).
    pub fn sweep_figures(&self) -> Option<(u64, u64)> {
        match self {
            Store::Embedded(e) => Some(e.sweep_figures()),
            Store::Redis(_) => None,
        }
    }

    /// The data dir's figures, when there is one.
    pub fn storage_figures(&self) -> Option<StorageFigures> {
        match self {
            Store::Embedded(e) => e.storage_figures(),
            Store::Redis(_) => None,
        }
    }

    /// What the connection to Redis did, with Redis.
    pub fn store_figures(&self) -> Option<&StoreFigures> {
        match self {
            Store::Embedded(_) => None,
            Store::Redis(r) => Some(r.connection_figures()),
        }
    }

    /// The rules in force.
    pub fn rules(&self) -> Arc<Rules> {
        self.core().rules()
    }

    /// Adds or replaces a rule (Y4); returns its position.
    pub fn set_rule(&self, rule: Rule) -> Result<usize, EngineError> {
        // A new match past the cap is refused; replacing a rule is not.
        let limit = self.core().limits().max_rules;
        let rules = self.rules();
        if rules.rules.len() as u64 >= limit
            && !rules.rules.iter().any(|r| r.pattern == rule.pattern)
        {
            self.core().count_rules_refused();
            return Err(EngineError::Exhausted {
                what: "rules",
                cap: "max_rules",
                limit,
            });
        }
        match self {
            Store::Embedded(e) => e.set_rule(rule),
            Store::Redis(r) => {
                let mut at = 0;
                r.change_rules(Box::new(|rules| {
                    at = super::rules::put_rule(rules, rule);
                    Ok(())
                }))?;
                Ok(at)
            }
        }
    }

    /// [`Store::set_rule`] within a credential's `share` of rules: it
    /// holds the rules in force whose patterns `covers` (its prefixes), and
    /// may add one more only below its limit (decisions 99). `None`: no
    /// share to keep to (no `[auth]`, or a credential held by `max_rules`
    /// alone).
    pub fn set_rule_within(
        &self,
        rule: Rule,
        share: Option<RuleShare<'_>>,
    ) -> Result<usize, EngineError> {
        if let Some((share, covers)) = share {
            let rules = self.rules();
            let replacing = rules.rules.iter().any(|r| r.pattern == rule.pattern);
            let held = super::shares::rules_held(&rules, covers);
            if !replacing && held >= share.limit(Kind::Rules) {
                share.count_refusal(Kind::Rules);
                return Err(share.refusal(Kind::Rules));
            }
        }
        self.set_rule(rule)
    }

    /// Replaces the default rule.
    pub fn set_default(&self, policy: Policy) -> Result<(), EngineError> {
        match self {
            Store::Embedded(e) => e.set_default(policy),
            Store::Redis(r) => r.change_rules(Box::new(|rules| {
                rules.default = policy;
                Ok(())
            })),
        }
    }

    /// Removes the rule whose match is written `pattern`.
    pub fn delete_rule(&self, pattern: &str) -> Result<(), EngineError> {
        match self {
            Store::Embedded(e) => e.delete_rule(pattern),
            Store::Redis(r) => {
                r.change_rules(Box::new(|rules| super::rules::drop_rule(rules, pattern)))
            }
        }
    }

    /// Puts reloaded rules in force (every rule, those set at run time too).
    pub fn reload_rules(&self, rules: Rules) {
        match self {
            Store::Embedded(e) => e.reload_rules(rules),
            Store::Redis(r) => {
                let put = r.change_rules(Box::new(|current| {
                    *current = rules;
                    Ok(())
                }));
                if let Err(e) = put {
                    tracing::error!("reloaded rules could not be put in force: {e}");
                }
            }
        }
    }

    /// Runs what the store does on time until the server shuts down: the
    /// embedded engine's timer (Redis's module settles on its own clock).
    pub async fn run_timer(&self) {
        match self {
            Store::Embedded(e) => e.clone().run_timer().await,
            Store::Redis(r) => r.run_timer().await,
        }
    }

    /// Moves the manual clock forward and returns once what is due by the
    /// new time is settled (X1); `None` without a manual clock.
    pub async fn advance_clock(&self, by: Millis) -> Option<Millis> {
        match self {
            Store::Embedded(e) => e.advance_clock(by).await,
            Store::Redis(r) => r.advance_clock(by).await,
        }
    }

    /// Stops taking requests and answers every waiter with UNAVAILABLE.
    pub fn shutdown(&self) {
        match self {
            Store::Embedded(e) => e.shutdown(),
            Store::Redis(r) => r.shutdown(),
        }
    }

    /// Writes what is pending to the data dir (a no-op without one).
    pub fn save(&self) -> Result<(), EngineError> {
        match self {
            Store::Embedded(e) => e.save(),
            Store::Redis(_) => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Cursor;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn a_cursor_reads_back_from_its_text(
            key in "[ -~]{1,40}",
            node in 0usize..1000,
            at: u32,
            cursor: u64,
        ) {
            let scans = [None, Some(key.clone())].map(|after| Cursor::Scan { node, at, cursor, after });
            for c in [Cursor::Start, Cursor::After(key.clone())].into_iter().chain(scans) {
                prop_assert_eq!(Cursor::of_text(&c.text()), Some(c));
            }
        }

        #[test]
        fn a_scan_cursor_text_reads_as_one_cursor_or_none(text in "\u{1}[0-9a-f:]{0,12}") {
            // Whatever a client sends, the cursor read (if any) is the one
            // its own text names: no two texts mean different places.
            if let Some(c) = Cursor::of_text(&text) {
                prop_assert_eq!(Cursor::of_text(&c.text()), Some(c));
            }
        }
    }
}

//! The engine: every key's [`Fuse`] in a sharded map, tickets and waiters,
//! one timer that settles leases and waits on time, idle forgetting and caps.
//!
//! Each operation runs one pure domain step under the key's shard lock
//! (C6), reading the clock inside the lock so that a key never sees time go
//! backwards. What the step reports ([`Notice`]s) is handled before the lock
//! is released: tickets handed to waiters are indexed, expired ones are
//! dropped, waiters get their answers, phase changes are logged.

pub mod clock;
pub mod config;
mod observe;
pub mod reload;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use dashmap::DashMap;
use tokio::sync::{oneshot, Notify};

use crate::domain::{
    validate_key, Ask, Decision, Fuse, FuseError, Grant, Millis, Notice, Outcome, Phase, Policy,
    TicketId, View,
};
pub use clock::{Clock, ManualClock, SystemClock};
pub use config::{Config, ConfigError, Limits, Rules};

/// Longest operator reason accepted by `Isolate` and `Close`, in bytes.
pub const MAX_REASON_BYTES: usize = 1024;

/// Why the engine refused a request. Each maps to one gRPC code in the server.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// A field is malformed (E2): `INVALID_ARGUMENT`.
    #[error("{field}: {problem}")]
    Invalid {
        /// The field's name.
        field: &'static str,
        /// What is wrong with it.
        problem: String,
    },
    /// The ticket is unknown, completed or expired (L4): `NOT_FOUND`.
    #[error("ticket: not found; it is unknown, already completed, or its lease ended")]
    TicketNotFound,
    /// A cap is reached (K3): `RESOURCE_EXHAUSTED`.
    #[error("too many {what}: the server's {cap} cap ({limit}) is reached; existing keys keep working, retry later or raise [server].{cap}")]
    Exhausted {
        /// What ran out: keys, tickets or waiters.
        what: &'static str,
        /// The config field of the cap.
        cap: &'static str,
        /// Its value.
        limit: u64,
    },
    /// No rule has this match: `NOT_FOUND`.
    #[error("match: no rule matches {pattern:?} exactly; ListPolicies shows the rules")]
    RuleNotFound {
        /// The match asked for.
        pattern: String,
    },
    /// The server is shutting down: `UNAVAILABLE`.
    #[error("fusebox is shutting down; retry against another instance")]
    ShuttingDown,
    /// Something that cannot happen did: `INTERNAL`.
    #[error("internal error: {0}")]
    Internal(String),
}

fn invalid(field: &'static str, problem: impl Into<String>) -> EngineError {
    EngineError::Invalid {
        field,
        problem: problem.into(),
    }
}

/// A request for permits, as the server hands it over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AcquireArgs {
    /// The key.
    pub key: String,
    /// Permits (0 = status check).
    pub permits: u32,
    /// How long the request may wait server-side.
    pub max_wait: Millis,
    /// The lease asked for.
    pub lease: Option<Millis>,
}

/// The engine's answer to an acquire.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AcquireReply {
    /// The decision (never `Queued`: the engine waits).
    pub decision: Decision,
    /// The ticket's token, when one was given.
    pub ticket: Option<String>,
    /// Time left on the ticket's lease.
    pub lease_left: Option<Millis>,
    /// The phase after the call.
    pub phase: Phase,
}

/// The engine's answer to a completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CompleteReply {
    /// The outcome was stale (B3).
    pub stale: bool,
    /// The phase after the call.
    pub phase: Phase,
}

/// A key as read, with the time it was read at.
#[derive(Clone, Debug, PartialEq)]
pub struct KeyReading {
    /// The key.
    pub key: String,
    /// What it shows.
    pub view: View,
    /// The engine's time of the reading.
    pub now: Millis,
}

/// Counts of the things that grow, for caps and metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Live keys.
    pub keys: u64,
    /// Live tickets.
    pub tickets: u64,
    /// Waiting requests.
    pub waiters: u64,
    /// Keys forgotten since start (K2).
    pub forgotten: u64,
}

type WaiterAnswer = Result<(Decision, Phase, Millis), EngineError>;

/// How an operation reaches a key.
#[derive(Clone, Copy, Debug)]
struct Access<'a> {
    /// Make the key if it does not exist (within the key cap).
    create: bool,
    /// Count the operation as use, for idle forgetting (reads do not).
    touch: bool,
    /// Who asked and why, for isolate and close.
    actor: Option<(&'a str, &'a str)>,
}

impl Access<'static> {
    /// A request that makes the key.
    const MAKE: Access<'static> = Access {
        create: true,
        touch: true,
        actor: None,
    };
    /// A request on an existing key.
    const USE: Access<'static> = Access {
        create: false,
        touch: true,
        actor: None,
    };
    /// A read, or the timer: neither makes the key nor counts as use.
    const READ: Access<'static> = Access {
        create: false,
        touch: false,
        actor: None,
    };
}

/// Engine-wide figures, kept as they change (see [`Engine::totals`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    /// Live keys.
    pub keys: u64,
    /// Live keys by phase, indexed by [`Phase::index`].
    pub by_phase: [u64; 4],
    /// Live tickets.
    pub tickets: u64,
    /// Waiting requests.
    pub waiters: u64,
    /// Keys forgotten since start (K2).
    pub forgotten: u64,
    /// Final decisions by kind (see [`DECISION_NAMES`]).
    pub decisions: [u64; 5],
    /// Blocked and denied decisions by reason, in [`crate::domain::Reason::ALL`] order.
    pub reasons: [u64; 7],
    /// Phase changes.
    pub transitions: u64,
}

/// What a watcher is told: a phase change, isolate or close of one key.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    /// The key.
    pub key: Arc<str>,
    /// What happened.
    pub kind: EventKind,
    /// The phase before.
    pub from: Phase,
    /// The phase after.
    pub to: Phase,
    /// Why, in words.
    pub cause: &'static str,
    /// Who asked (isolate and close).
    pub who: String,
    /// The operator's reason (isolate and close).
    pub reason: String,
    /// When, on the engine's clock.
    pub at: Millis,
    /// The event's number; consecutive numbers for consecutive events.
    pub sequence: u64,
    /// The key's state right after the operation.
    pub view: View,
}

/// The kinds of [`Event`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// The breaker changed phase by itself.
    PhaseChange,
    /// An operator isolated the key.
    Isolate,
    /// An operator closed the key.
    Close,
    /// A changed policy moved the breaker.
    Policy,
}

/// How many events a watcher may fall behind before it is told it lagged.
pub const EVENT_BUFFER: usize = 4096;

/// Decisions by kind, in [`Counters::decisions`] order.
pub const DECISION_NAMES: [&str; 5] = ["granted", "probe", "blocked", "refused", "denied"];

/// Engine-wide counters, for metrics.
#[derive(Debug, Default)]
pub struct Counters {
    /// Final decisions by kind (see [`DECISION_NAMES`]).
    pub decisions: [AtomicU64; 5],
    /// Blocked and denied decisions by reason, in [`crate::domain::Reason::ALL`] order.
    pub reasons: [AtomicU64; 7],
    /// Phase changes.
    pub transitions: AtomicU64,
    /// Config reloads that were applied.
    pub reloads: AtomicU64,
    /// Config reloads refused because the file was invalid.
    pub reload_failures: AtomicU64,
    /// 1 when the last reload attempt succeeded (or none was made), else 0.
    pub last_reload_ok: AtomicU64,
    /// Open gRPC connections.
    pub connections: AtomicU64,
    /// Connections closed at once because `max_connections` was reached.
    pub connections_refused: AtomicU64,
}

impl Counters {
    fn count(&self, decision: &Decision) {
        let (index, reason) = match *decision {
            Decision::Granted(None) | Decision::Queued => return,
            Decision::Granted(Some(_)) => (0, None),
            Decision::Probe(_) => (1, None),
            Decision::Blocked { reason, .. } => (2, Some(reason)),
            Decision::Refused => (3, None),
            Decision::Denied { reason, .. } => (4, Some(reason)),
        };
        self.decisions[index].fetch_add(1, Ordering::Relaxed);
        if let Some(reason) = reason {
            self.reasons[reason as usize].fetch_add(1, Ordering::Relaxed);
        }
    }
}

struct Entry {
    fuse: Fuse,
    /// The rules generation the fuse's policy came from (Y4).
    generation: u64,
    /// The earliest deadline registered with the timer for this key.
    scheduled: Option<Millis>,
    /// The last time an operation touched the key.
    last_used: Millis,
}

/// Keyed breakers and permit books, shared by every connection.
pub struct Engine {
    clock: Arc<dyn Clock>,
    manual: Option<Arc<ManualClock>>,
    rules: RwLock<Arc<Rules>>,
    generation: AtomicU64,
    limits: Limits,
    keys: DashMap<Arc<str>, Entry>,
    tickets: DashMap<TicketId, Arc<str>>,
    waiters: DashMap<TicketId, oneshot::Sender<WaiterAnswer>>,
    live_keys: AtomicU64,
    live_tickets: AtomicU64,
    live_waiters: AtomicU64,
    forgotten: AtomicU64,
    schedule: Mutex<BTreeSet<(Millis, Arc<str>)>>,
    wake: Notify,
    advancing: tokio::sync::Mutex<()>,
    shutting_down: AtomicBool,
    events: tokio::sync::broadcast::Sender<Event>,
    /// The next event's sequence number; held while the event is sent, so
    /// that events leave in the order of their numbers, across keys too.
    sequence: Mutex<u64>,
    counters: Counters,
    stopping: tokio::sync::watch::Sender<bool>,
    /// The wall-clock time at the engine clock's origin.
    origin: std::time::SystemTime,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("limits", &self.limits)
            .field("counts", &self.counts())
            .finish_non_exhaustive()
    }
}

/// A fresh ticket id: 128 bits from the operating system's random source (L1).
fn random_ticket() -> Result<TicketId, EngineError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes)
        .map_err(|e| EngineError::Internal(format!("no random source: {e}")))?;
    Ok(TicketId(u128::from_le_bytes(bytes)))
}

/// The opaque token of a ticket: 32 lower-case hex digits.
pub fn token_of(id: TicketId) -> String {
    format!("{:032x}", id.0)
}

fn ticket_of(token: &str) -> Result<TicketId, EngineError> {
    if token.is_empty() {
        return Err(invalid(
            "ticket",
            "is required: pass the ticket that Acquire returned",
        ));
    }
    if token.len() != 32
        || !token
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    {
        return Err(EngineError::TicketNotFound);
    }
    u128::from_str_radix(token, 16)
        .map(TicketId)
        .map_err(|_| EngineError::TicketNotFound)
}

fn zero_lease() -> EngineError {
    invalid(
        "lease",
        "must be longer than 0 ms; leave it out for the policy's default",
    )
}

fn check_key(key: &str) -> Result<(), EngineError> {
    validate_key(key).map_err(|e| {
        let text = e.to_string();
        invalid(
            "key",
            text.strip_prefix("key: ").unwrap_or(&text).to_owned(),
        )
    })
}

impl Engine {
    /// An engine on `clock` (and, for `--manual-clock`, the same clock as a
    /// [`ManualClock`] so that it can be advanced) under `config`.
    pub fn new(config: Config, clock: Arc<dyn Clock>, manual: Option<Arc<ManualClock>>) -> Self {
        Engine {
            clock,
            manual,
            rules: RwLock::new(Arc::new(config.rules)),
            generation: AtomicU64::new(0),
            limits: config.limits,
            keys: DashMap::new(),
            tickets: DashMap::new(),
            waiters: DashMap::new(),
            live_keys: AtomicU64::new(0),
            live_tickets: AtomicU64::new(0),
            live_waiters: AtomicU64::new(0),
            forgotten: AtomicU64::new(0),
            schedule: Mutex::new(BTreeSet::new()),
            wake: Notify::new(),
            advancing: tokio::sync::Mutex::new(()),
            shutting_down: AtomicBool::new(false),
            events: tokio::sync::broadcast::channel(EVENT_BUFFER).0,
            sequence: Mutex::new(0),
            counters: Counters {
                last_reload_ok: AtomicU64::new(1),
                ..Counters::default()
            },
            stopping: tokio::sync::watch::channel(false).0,
            origin: std::time::SystemTime::now(),
        }
    }

    /// True once the engine began to shut down.
    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }

    /// Resolves once the engine begins to shut down.
    pub fn stopped(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut stopping = self.stopping.subscribe();
        async move {
            let _ = stopping.wait_for(|s| *s).await;
        }
    }

    /// Engine-wide counters.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// The wall-clock time of a reading of the engine's clock.
    pub fn wall_time(&self, at: Millis) -> std::time::SystemTime {
        self.origin + std::time::Duration::from_millis(at)
    }

    /// A receiver of every event published from now on (bounded: a receiver
    /// that falls [`EVENT_BUFFER`] events behind is told it lagged).
    pub fn subscribe(&self) -> tokio::sync::broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    /// An engine on the system clock.
    pub fn with_system_clock(config: Config) -> Self {
        Engine::new(config, Arc::new(SystemClock::new()), None)
    }

    /// An engine on a manual clock that starts at 0.
    pub fn with_manual_clock(config: Config) -> Self {
        let clock = Arc::new(ManualClock::default());
        Engine::new(config, clock.clone(), Some(clock))
    }

    /// The engine's time now.
    pub fn now(&self) -> Millis {
        self.clock.now()
    }

    /// True when the clock is manual (X1).
    pub fn has_manual_clock(&self) -> bool {
        self.manual.is_some()
    }

    /// The limits in force.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The rules in force.
    pub fn rules(&self) -> Arc<Rules> {
        self.rules.read().expect("rules lock").clone()
    }

    /// Replaces the rules; existing keys adopt their new policy at their
    /// next operation (Y4).
    pub fn set_rules(&self, rules: Rules) {
        *self.rules.write().expect("rules lock") = Arc::new(rules);
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    /// Counts of live keys, tickets and waiters.
    pub fn counts(&self) -> Counts {
        Counts {
            keys: self.live_keys.load(Ordering::Relaxed),
            tickets: self.live_tickets.load(Ordering::Relaxed),
            waiters: self.live_waiters.load(Ordering::Relaxed),
            forgotten: self.forgotten.load(Ordering::Relaxed),
        }
    }

    fn policy_for(&self, key: &str) -> (Policy, u64) {
        let generation = self.generation.load(Ordering::SeqCst);
        let rules = self.rules.read().expect("rules lock");
        (*rules.policy_for(key), generation)
    }

    /// Runs `op` on the key's fuse (given the time and the key's shared
    /// name) under its shard lock, making the key
    /// first when `access.create` is set (within the key cap). Returns
    /// `None` when the key does not exist and is not to be made.
    fn with_fuse<R>(
        &self,
        key: &str,
        access: Access<'_>,
        op: impl FnOnce(&mut Fuse, Millis, &Arc<str>) -> R,
    ) -> Result<Option<R>, EngineError> {
        let mut entry = match self.keys.get_mut(key) {
            Some(entry) => entry,
            None if !access.create => return Ok(None),
            None => {
                let (policy, generation) = self.policy_for(key);
                match self.keys.entry(Arc::from(key)) {
                    dashmap::Entry::Occupied(o) => o.into_ref(),
                    dashmap::Entry::Vacant(v) => {
                        if self.live_keys.load(Ordering::SeqCst) >= self.limits.max_keys {
                            return Err(EngineError::Exhausted {
                                what: "keys",
                                cap: "max_keys",
                                limit: self.limits.max_keys,
                            });
                        }
                        self.live_keys.fetch_add(1, Ordering::SeqCst);
                        let now = self.clock.now();
                        v.insert(Entry {
                            fuse: Fuse::new(policy, now),
                            generation,
                            scheduled: None,
                            last_used: now,
                        })
                    }
                }
            }
        };
        let now = self.clock.now();
        let key_name = entry.key().clone();
        let e = entry.value_mut();
        let generation = self.generation.load(Ordering::SeqCst);
        if e.generation != generation {
            let (policy, generation) = self.policy_for(&key_name);
            e.fuse
                .set_policy(policy, now)
                .map_err(|err| EngineError::Internal(err.to_string()))?;
            e.generation = generation;
        }
        let tickets_before = e.fuse.live_tickets();
        let waiters_before = e.fuse.waiters();
        let result = op(&mut e.fuse, now, &key_name);
        let changes = self.handle_notices(&key_name, &mut e.fuse, now);
        adjust(&self.live_tickets, tickets_before, e.fuse.live_tickets());
        adjust(&self.live_waiters, waiters_before, e.fuse.waiters());
        if access.touch {
            e.last_used = now;
        }
        if !changes.is_empty() {
            self.publish(&key_name, &changes, e.fuse.view(now), access.actor);
        }
        if let Some(next) = e.fuse.next_deadline() {
            if e.scheduled.is_none_or(|s| next < s) {
                e.scheduled = Some(next);
                let mut schedule = self.schedule.lock().expect("schedule lock");
                let first = schedule.first().map(|&(t, _)| t);
                schedule.insert((next, key_name.clone()));
                if first.is_none_or(|f| next < f) {
                    self.wake.notify_one();
                }
            }
        }
        drop(entry);
        for change in changes {
            log_change(&key_name, change);
        }
        Ok(Some(result))
    }

    /// Publishes a key's phase changes to watchers, under the key's lock so
    /// that events of one key keep their order.
    fn publish(&self, key: &Arc<str>, changes: &[Notice], view: View, actor: Option<(&str, &str)>) {
        for change in changes {
            let Notice::Phase {
                from,
                to,
                cause,
                at,
            } = *change
            else {
                continue;
            };
            self.counters.transitions.fetch_add(1, Ordering::Relaxed);
            let kind = match cause {
                crate::domain::Cause::Isolated => EventKind::Isolate,
                crate::domain::Cause::Closed => EventKind::Close,
                crate::domain::Cause::PolicyChanged => EventKind::Policy,
                _ => EventKind::PhaseChange,
            };
            let (who, reason) = match (kind, actor) {
                (EventKind::Isolate | EventKind::Close, Some((who, why))) => {
                    (who.to_owned(), why.to_owned())
                }
                _ => (String::new(), String::new()),
            };
            let mut event = Event {
                key: key.clone(),
                kind,
                from,
                to,
                cause: cause.as_str(),
                who,
                reason,
                at,
                sequence: 0,
                view: view.clone(),
            };
            let mut next = self.sequence.lock().expect("sequence lock");
            event.sequence = *next;
            *next += 1;
            let _no_watchers = self.events.send(event);
        }
    }

    /// Passes on what a domain step reported, still under the key's lock;
    /// returns the phase changes, to be logged once the lock is released.
    fn handle_notices(&self, key: &Arc<str>, fuse: &mut Fuse, now: Millis) -> Vec<Notice> {
        let mut changes = Vec::new();
        let mut notices: Vec<Notice> = fuse.drain_notices().collect();
        while !notices.is_empty() {
            for notice in notices.drain(..) {
                match notice {
                    Notice::Answered { waiter, decision } => {
                        self.counters.count(&decision);
                        if let Some(grant) = decision.grant() {
                            self.tickets.insert(grant.ticket, key.clone());
                        }
                        let phase = fuse.breaker().phase();
                        let delivered = self
                            .waiters
                            .remove(&waiter)
                            .is_some_and(|(_, tx)| tx.send(Ok((decision, phase, now))).is_ok());
                        if !delivered {
                            if let Some(grant) = decision.grant() {
                                // The caller went away as it was served: give the permits back.
                                self.tickets.remove(&grant.ticket);
                                let _ = fuse.complete(grant.ticket, Outcome::Ignored, now);
                            }
                        }
                    }
                    Notice::Expired { ticket } => {
                        self.tickets.remove(&ticket);
                        tracing::debug!(key = %key, "a ticket's lease ended before it was completed");
                    }
                    change @ Notice::Phase { .. } => changes.push(change),
                }
            }
            notices.extend(fuse.drain_notices());
        }
        changes
    }

    /// Answers an acquire (B1, P1–P6, C1–C4), waiting server-side while queued.
    pub async fn acquire(&self, args: AcquireArgs) -> Result<AcquireReply, EngineError> {
        check_key(&args.key)?;
        if args.lease == Some(0) {
            return Err(zero_lease());
        }
        if self.shutting_down.load(Ordering::SeqCst) {
            return Err(EngineError::ShuttingDown);
        }
        if args.permits == 0 {
            return self.status_check(&args);
        }
        let id = random_ticket()?;
        let ask = Ask {
            permits: args.permits,
            max_wait: args.max_wait,
            lease: args.lease,
            room_for_ticket: self.live_tickets.load(Ordering::SeqCst) < self.limits.max_tickets,
            room_for_waiter: self.live_waiters.load(Ordering::SeqCst) < self.limits.max_waiters,
        };
        let mut receiver = None;
        let existed = self.keys.contains_key(args.key.as_str());
        let result = self
            .with_fuse(&args.key, Access::MAKE, |fuse, now, key| {
                let decision = fuse.acquire(&ask, id, now)?;
                self.counters.count(&decision);
                if decision == Decision::Queued {
                    let (tx, rx) = oneshot::channel();
                    self.waiters.insert(id, tx);
                    receiver = Some(rx);
                }
                if let Some(grant) = decision.grant() {
                    self.tickets.insert(grant.ticket, key.clone());
                }
                Ok::<_, FuseError>((decision, fuse.breaker().phase(), now))
            })?
            .expect("acquire makes the key");
        let (decision, phase, now) = result.map_err(|e| {
            if !existed {
                // E3: a request that fails (a cap) makes no key.
                self.drop_if_at_rest(&args.key);
            }
            self.exhausted_or(e)
        })?;
        match receiver {
            None => Ok(reply(decision, phase, now)),
            Some(rx) => {
                let mut guard = WaiterGuard {
                    engine: self,
                    key: &args.key,
                    id,
                    rx: Some(rx),
                };
                let answer = guard.wait().await;
                if answer.is_err() {
                    // Shutting down: the waiter leaves the queue with its answer.
                    self.withdraw(&args.key, id);
                }
                let (decision, phase, now) = answer?;
                Ok(reply(decision, phase, now))
            }
        }
    }

    fn status_check(&self, args: &AcquireArgs) -> Result<AcquireReply, EngineError> {
        let ask = Ask {
            permits: 0,
            ..Ask::default()
        };
        let probe_id = TicketId(0);
        let answer = self.with_fuse(&args.key, Access::READ, |fuse, now, _| {
            fuse.acquire(&ask, probe_id, now)
                .map(|d| (d, fuse.breaker().phase(), now))
        })?;
        let (decision, phase, now) = match answer {
            Some(result) => result.map_err(fuse_error)?,
            None => {
                // K2: a status check does not make the key.
                let now = self.clock.now();
                let mut fresh = Fuse::new(self.policy_for(&args.key).0, now);
                let d = fresh.acquire(&ask, probe_id, now).map_err(fuse_error)?;
                (d, Phase::Closed, now)
            }
        };
        Ok(reply(decision, phase, now))
    }

    /// Removes `key` if it is at rest, as forgetting would (K2): for a key
    /// made by a request that then failed.
    fn drop_if_at_rest(&self, key: &str) {
        let now = self.clock.now();
        let removed = self
            .keys
            .remove_if(key, |_, e| e.fuse.is_at_rest(now.max(e.fuse.last_now())));
        if removed.is_some() {
            self.live_keys.fetch_sub(1, Ordering::SeqCst);
        }
    }

    fn exhausted_or(&self, e: FuseError) -> EngineError {
        match e {
            FuseError::NoRoomForTicket => EngineError::Exhausted {
                what: "tickets",
                cap: "max_tickets",
                limit: self.limits.max_tickets,
            },
            FuseError::NoRoomForWaiter => EngineError::Exhausted {
                what: "waiters",
                cap: "max_waiters",
                limit: self.limits.max_waiters,
            },
            other => fuse_error(other),
        }
    }

    /// Withdraws a waiter whose caller went away (P6).
    fn withdraw(&self, key: &str, id: TicketId) {
        self.waiters.remove(&id);
        let _ = self.with_fuse(key, Access::USE, |fuse, now, _| fuse.withdraw(id, now));
    }

    /// A ticket's id and the key it belongs to.
    fn ticket_and_key(&self, token: &str) -> Result<(TicketId, Arc<str>), EngineError> {
        let id = ticket_of(token)?;
        let key = self
            .tickets
            .get(&id)
            .map(|k| k.value().clone())
            .ok_or(EngineError::TicketNotFound)?;
        Ok((id, key))
    }

    /// Records a ticket's outcome (B3, C5, L4).
    pub fn complete(&self, token: &str, outcome: Outcome) -> Result<CompleteReply, EngineError> {
        let (id, key) = self.ticket_and_key(token)?;
        let result = self
            .with_fuse(&key, Access::USE, |fuse, now, _| {
                fuse.complete(id, outcome, now)
            })?
            .ok_or(EngineError::TicketNotFound)?;
        match result {
            Ok(done) => {
                self.tickets.remove(&id);
                Ok(CompleteReply {
                    stale: done.stale,
                    phase: done.phase,
                })
            }
            Err(e) => Err(fuse_error(e)),
        }
    }

    /// Extends a live ticket's lease; returns the time left (L2).
    pub fn renew(&self, token: &str, lease: Option<Millis>) -> Result<Millis, EngineError> {
        if lease == Some(0) {
            return Err(zero_lease());
        }
        let (id, key) = self.ticket_and_key(token)?;
        self.with_fuse(&key, Access::USE, |fuse, now, _| fuse.renew(id, lease, now))?
            .ok_or(EngineError::TicketNotFound)?
            .map_err(fuse_error)
    }

    /// Reads a key without making or moving it (B6); lease ends are settled first.
    pub fn get(&self, key: &str) -> Result<KeyReading, EngineError> {
        check_key(key)?;
        Ok(self.read_live(key).unwrap_or_else(|| {
            // K2: a key never used (or forgotten) reads as a fresh one would.
            let now = self.clock.now();
            KeyReading {
                key: key.to_owned(),
                view: Fuse::new(self.policy_for(key).0, now).view(now),
                now,
            }
        }))
    }

    /// Isolates a key (B5), recording who asked and why.
    pub fn isolate(&self, key: &str, reason: &str, who: &str) -> Result<KeyReading, EngineError> {
        self.manual(key, reason, who, true)
    }

    /// Closes a key (B5), recording who asked and why.
    pub fn close(&self, key: &str, reason: &str, who: &str) -> Result<KeyReading, EngineError> {
        self.manual(key, reason, who, false)
    }

    fn manual(
        &self,
        key: &str,
        reason: &str,
        who: &str,
        isolate: bool,
    ) -> Result<KeyReading, EngineError> {
        check_key(key)?;
        if reason.len() > MAX_REASON_BYTES {
            return Err(invalid(
                "reason",
                format!(
                    "must be at most {MAX_REASON_BYTES} bytes, not {}",
                    reason.len()
                ),
            ));
        }
        if reason.chars().any(char::is_control) {
            return Err(invalid("reason", "must not contain control characters"));
        }
        let why = if reason.is_empty() {
            "no reason given"
        } else {
            reason
        };
        let action = if isolate { "isolated" } else { "closed" };
        tracing::info!(key, who, why, "{action} by an operator");
        // Closing a key that does not exist would make a fresh key: nothing to do.
        let access = Access {
            create: isolate,
            touch: true,
            actor: Some((who, why)),
        };
        let read = self.with_fuse(key, access, |fuse, now, _| {
            let done = if isolate {
                fuse.isolate(now)
            } else {
                fuse.close(now)
            };
            done.map(|()| (fuse.view(now), now))
        })?;
        match read {
            Some(r) => {
                let (view, now) = r.map_err(fuse_error)?;
                Ok(KeyReading {
                    key: key.to_owned(),
                    view,
                    now,
                })
            }
            None => self.get(key),
        }
    }

    /// Reads a live key like [`Engine::get`]; `None` when it does not exist
    /// (it may have been forgotten since its name was seen).
    fn read_live(&self, key: &str) -> Option<KeyReading> {
        let read = self.with_fuse(key, Access::READ, |fuse, now, _| {
            fuse.advance(now).map(|()| (fuse.view(now), now))
        });
        let Ok(Some(Ok((view, now)))) = read else {
            return None;
        };
        Some(KeyReading {
            key: key.to_owned(),
            view,
            now,
        })
    }

    /// The live keys that start with `prefix`, come after `after` and are in
    /// one of `phases` (any phase when empty), in key order, read like
    /// [`Engine::get`]; at most `limit` of them, and whether more remain.
    pub fn list(
        &self,
        prefix: &str,
        phases: &[Phase],
        after: Option<&str>,
        limit: usize,
    ) -> (Vec<KeyReading>, bool) {
        let mut names: Vec<Arc<str>> = self
            .keys
            .iter()
            .map(|e| e.key().clone())
            .filter(|k| k.starts_with(prefix) && after.is_none_or(|a| k.as_ref() > a))
            .collect();
        names.sort_unstable();
        let mut found = Vec::new();
        for reading in names.iter().filter_map(|name| self.read_live(name)) {
            if !phases.is_empty() && !phases.contains(&reading.view.phase) {
                continue;
            }
            if found.len() == limit {
                return (found, true);
            }
            found.push(reading);
        }
        (found, false)
    }

    /// Adds a rule at the end (before the default), or replaces the rule
    /// with the same match where it stands (Y4: keys adopt it at their next
    /// operation). Returns the rule's position.
    pub fn set_rule(&self, rule: config::Rule) -> usize {
        let mut rules = (*self.rules()).clone();
        let position = match rules.rules.iter().position(|r| r.pattern == rule.pattern) {
            Some(i) => {
                rules.rules[i] = rule;
                i
            }
            None => {
                rules.rules.push(rule);
                rules.rules.len() - 1
            }
        };
        self.set_rules(rules);
        position
    }

    /// Replaces the default rule.
    pub fn set_default(&self, policy: Policy) {
        let mut rules = (*self.rules()).clone();
        rules.default = policy;
        self.set_rules(rules);
    }

    /// Removes the rule whose match is written `pattern`.
    pub fn delete_rule(&self, pattern: &str) -> Result<(), EngineError> {
        let mut rules = (*self.rules()).clone();
        let before = rules.rules.len();
        rules.rules.retain(|r| r.pattern.text() != pattern);
        if rules.rules.len() == before {
            return Err(EngineError::RuleNotFound {
                pattern: pattern.to_owned(),
            });
        }
        self.set_rules(rules);
        Ok(())
    }

    /// Settles every key whose deadline is due at `now`; returns how many.
    pub fn settle_due(&self, now: Millis) -> usize {
        let due: Vec<Arc<str>> = {
            let mut schedule = self.schedule.lock().expect("schedule lock");
            let mut due = Vec::new();
            while let Some(first) = schedule.first() {
                if first.0 > now {
                    break;
                }
                let (_, key) = schedule.pop_first().expect("first exists");
                due.push(key);
            }
            due
        };
        for key in &due {
            if let Some(mut entry) = self.keys.get_mut(key.as_ref()) {
                entry.scheduled = None;
            }
            let _ = self.with_fuse(key, Access::READ, |fuse, now, _| fuse.advance(now));
        }
        due.len()
    }

    /// Forgets keys at rest that nobody used for `idle_after` (K2); returns how many.
    pub fn forget_idle(&self, now: Millis) -> usize {
        let idle_after = self.limits.idle_after;
        let mut forgotten = 0;
        self.keys.retain(|_, entry| {
            let keep = now.saturating_sub(entry.last_used) < idle_after
                || !entry.fuse.is_at_rest(now.max(entry.fuse.last_now()));
            if !keep {
                forgotten += 1;
            }
            keep
        });
        self.live_keys.fetch_sub(forgotten as u64, Ordering::SeqCst);
        self.forgotten.fetch_add(forgotten as u64, Ordering::SeqCst);
        forgotten
    }

    /// Moves the manual clock forward and returns only once everything due
    /// by the new time is settled (X1). `None` without a manual clock.
    pub async fn advance_clock(&self, by: Millis) -> Option<Millis> {
        let manual = self.manual.as_ref()?;
        let _one_at_a_time = self.advancing.lock().await;
        let now = manual.advance(by);
        self.settle_due(now);
        self.forget_idle(now);
        Some(now)
    }

    /// The timer: sleeps until the earliest deadline, settles what is due,
    /// and forgets idle keys now and then. Runs until the engine shuts down.
    pub async fn run_timer(self: Arc<Self>) {
        let sweep_every = (self.limits.idle_after / 4).clamp(10, 30_000);
        let mut next_sweep = self.clock.now() + sweep_every;
        loop {
            if self.shutting_down.load(Ordering::SeqCst) {
                return;
            }
            let now = self.clock.now();
            self.settle_due(now);
            if now >= next_sweep {
                let forgotten = self.forget_idle(now);
                if forgotten > 0 {
                    tracing::debug!(forgotten, "forgot idle keys");
                }
                next_sweep = now + sweep_every;
            }
            let first = self
                .schedule
                .lock()
                .expect("schedule lock")
                .first()
                .map(|&(t, _)| t);
            let wake_at = first.map_or(next_sweep, |t| t.min(next_sweep));
            match self.clock.instant_of(wake_at) {
                Some(at) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(at.into()) => {}
                        _ = self.wake.notified() => {}
                    }
                }
                None => self.wake.notified().await,
            }
        }
    }

    /// Stops taking requests and answers every waiter with `UNAVAILABLE`.
    pub fn shutdown(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
        self.stopping.send_replace(true);
        let ids: Vec<TicketId> = self.waiters.iter().map(|w| *w.key()).collect();
        for id in ids {
            if let Some((_, tx)) = self.waiters.remove(&id) {
                let _ = tx.send(Err(EngineError::ShuttingDown));
            }
        }
        self.wake.notify_one();
    }
}

fn log_change(key: &str, change: Notice) {
    if let Notice::Phase {
        from,
        to,
        cause,
        at,
    } = change
    {
        tracing::info!(key, from = %from, to = %to, at_ms = at, "breaker {from} -> {to}: {}", cause.as_str());
    }
}

fn adjust(counter: &AtomicU64, before: usize, after: usize) {
    if after > before {
        counter.fetch_add((after - before) as u64, Ordering::SeqCst);
    } else if before > after {
        counter.fetch_sub((before - after) as u64, Ordering::SeqCst);
    }
}

fn fuse_error(e: FuseError) -> EngineError {
    match e {
        FuseError::UnknownTicket => EngineError::TicketNotFound,
        FuseError::ZeroLease => zero_lease(),
        FuseError::ClockWentBack { .. }
        | FuseError::TicketInUse
        | FuseError::NoRoomForTicket
        | FuseError::NoRoomForWaiter => EngineError::Internal(e.to_string()),
    }
}

fn reply(decision: Decision, phase: Phase, now: Millis) -> AcquireReply {
    let grant: Option<Grant> = decision.grant();
    AcquireReply {
        decision,
        ticket: grant.map(|g| token_of(g.ticket)),
        lease_left: grant.map(|g| g.lease_end.saturating_sub(now)),
        phase,
    }
}

/// Withdraws its waiter if the acquire is dropped before the answer comes
/// (the client went away or its deadline passed, P6).
struct WaiterGuard<'a> {
    engine: &'a Engine,
    key: &'a str,
    id: TicketId,
    rx: Option<oneshot::Receiver<WaiterAnswer>>,
}

impl WaiterGuard<'_> {
    async fn wait(&mut self) -> WaiterAnswer {
        let rx = self.rx.as_mut().expect("waits once");
        let answer = rx
            .await
            .unwrap_or_else(|_| Err(EngineError::Internal("waiter dropped".into())));
        self.rx = None;
        answer
    }
}

impl Drop for WaiterGuard<'_> {
    fn drop(&mut self) {
        let Some(mut rx) = self.rx.take() else {
            return;
        };
        self.engine.withdraw(self.key, self.id);
        if let Ok(Ok((decision, _, _))) = rx.try_recv() {
            if let Some(grant) = decision.grant() {
                let _ = self
                    .engine
                    .complete(&token_of(grant.ticket), Outcome::Ignored);
            }
        }
    }
}

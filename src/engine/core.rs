//! What a server keeps whichever store holds its keys ([`super::Store`]):
//! the clock, the rules in force, the caps, the events watchers hear, what
//! each credential's share holds, the rate-limit service's budgets of
//! keys, and whether it is shutting down. The
//! embedded engine and the Redis store each hold one, shared with the
//! services around them.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use super::budgets::Budgets;
use super::clock::{Clock, ManualClock};
use super::events::{Event, Publisher};
use super::limits::Limits;
use super::rules::{Compiled, Rules};
use super::shares::Shares;
use crate::domain::{Millis, Policy};

/// The server-wide part of every store.
pub struct Core {
    clock: Arc<dyn Clock>,
    manual: Option<Arc<ManualClock>>,
    rules: RwLock<Arc<Compiled>>,
    limits: Limits,
    publisher: Publisher,
    stopping: tokio::sync::watch::Sender<bool>,
    shutting_down: AtomicBool,
    /// The wall-clock time at the clock's origin.
    origin: SystemTime,
    /// Times are Unix milliseconds (the Redis store's clock), not the
    /// engine clock's.
    unix_times: AtomicBool,
    /// What each credential may hold and holds (decisions 99).
    shares: Shares,
    /// The rate-limit service's budgets of keys per node (RL20).
    budgets: Budgets,
    /// Rules refused at `max_rules`.
    rules_refused: AtomicU64,
}

impl std::fmt::Debug for Core {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Core")
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl Core {
    /// The core of a server with the caps `limits`, on `clock` (and, for
    /// `--manual-clock`, the same clock as a [`ManualClock`]). It has no
    /// rules until the store puts its own in force.
    pub fn new(limits: Limits, clock: Arc<dyn Clock>, manual: Option<Arc<ManualClock>>) -> Core {
        // The wall-clock time at which the clock read 0.
        let origin = SystemTime::now() - std::time::Duration::from_millis(clock.now());
        Core {
            clock,
            manual,
            rules: RwLock::new(Arc::new(Compiled::new(Rules::default(), 0))),
            limits,
            publisher: Publisher::new(),
            stopping: tokio::sync::watch::channel(false).0,
            shutting_down: AtomicBool::new(false),
            origin,
            unix_times: AtomicBool::new(false),
            shares: Shares::default(),
            budgets: Budgets::default(),
            rules_refused: AtomicU64::new(0),
        }
    }

    /// Counts a rule refused because `max_rules` rules are in force.
    pub(super) fn count_rules_refused(&self) {
        self.rules_refused.fetch_add(1, Ordering::Relaxed);
    }

    /// Rules refused because `max_rules` rules were in force.
    pub fn rules_refused(&self) -> u64 {
        self.rules_refused.load(Ordering::Relaxed)
    }

    /// What each credential may hold and holds.
    pub fn shares(&self) -> &Shares {
        &self.shares
    }

    /// The rate-limit service's budgets of keys per node (RL20).
    pub fn budgets(&self) -> &Budgets {
        &self.budgets
    }

    /// The caps in force.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The clock's time now.
    pub fn now(&self) -> Millis {
        self.clock.now()
    }

    /// The clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// The manual clock (`--manual-clock`, X1).
    pub fn manual(&self) -> Option<&Arc<ManualClock>> {
        self.manual.as_ref()
    }

    /// True when the clock is manual (X1).
    pub fn has_manual_clock(&self) -> bool {
        self.manual.is_some()
    }

    /// From now on, times are Unix milliseconds (the Redis store's clock,
    /// unless the clock is manual).
    pub(super) fn use_unix_times(&self) {
        if self.manual.is_none() {
            self.unix_times.store(true, Ordering::Relaxed);
        }
    }

    /// The wall-clock time of a time a key was read or changed at.
    pub fn wall_time(&self, at: Millis) -> SystemTime {
        let at = std::time::Duration::from_millis(at);
        if self.unix_times.load(Ordering::Relaxed) {
            std::time::UNIX_EPOCH + at
        } else {
            self.origin + at
        }
    }

    /// A receiver of every event published from now on (bounded: a
    /// receiver that falls [`super::EVENT_BUFFER`] events behind is told it
    /// lagged).
    pub fn subscribe(&self) -> tokio::sync::broadcast::Receiver<Event> {
        self.publisher.subscribe()
    }

    /// Sends events to the watchers.
    pub(super) fn publish(&self, take: impl FnOnce() -> Vec<Event>) {
        self.publisher.send_batch(take);
    }

    /// True once the server began to shut down.
    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Relaxed)
    }

    /// Resolves once the server begins to shut down.
    pub fn stopped(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut stopping = self.stopping.subscribe();
        async move {
            let _ = stopping.wait_for(|s| *s).await;
        }
    }

    /// Marks the server as shutting down.
    pub(super) fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
        self.stopping.send_replace(true);
    }

    /// The rules in force.
    pub fn rules(&self) -> Arc<Rules> {
        self.rules.read().expect("rules lock").rules.clone()
    }

    /// Puts `rules` in force as a new generation; returns it compiled.
    pub(super) fn replace_rules(&self, rules: Rules) -> Arc<Compiled> {
        let mut current = self.rules.write().expect("rules lock");
        let compiled = Arc::new(Compiled::new(rules, current.generation.wrapping_add(1)));
        *current = compiled.clone();
        compiled
    }

    /// The policy a fresh `key` would get now.
    pub fn policy_for(&self, key: &str) -> Arc<Policy> {
        self.rules
            .read()
            .expect("rules lock")
            .policy_for(key)
            .clone()
    }
}

//! Fair shares (decisions 99): what one credential (a token's or a client
//! certificate's name) may hold at once, so that no tenant of a shared
//! server takes another's room under the server-wide caps.
//!
//! Each credential has a [`Share`]: a limit per [`Kind`] (its entry's
//! `limits`, else `[auth] share` of the server's cap) and what it holds.
//! The server-wide caps still hold on top. With `--store`, a share holds
//! fleet-wide (decisions 148): each server counts what the credential
//! holds through it and learns, a few times a second through Redis, what
//! it holds through the others ([`Share::elsewhere`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use serde::Deserialize;

use super::error::EngineError;
use super::limits::Limits;
use super::rules::{Pattern, Rules};
use crate::domain::{Millis, TicketId};

/// What a share limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Live keys it made (embedded); with `--store`, the keys it asked for
    /// within the time Redis keeps a key at rest (decisions 104).
    Keys = 0,
    /// Live tickets it was granted.
    Tickets = 1,
    /// Its requests waiting in a queue (an Acquire with `max_wait`).
    Waiters = 2,
    /// Its open Decide streams.
    DecideStreams = 3,
    /// Its open Watch streams and dashboard event streams.
    WatchStreams = 4,
    /// Rules in force inside its prefixes.
    Rules = 5,
}

/// How many kinds there are.
pub const KINDS: usize = 6;

impl Kind {
    /// Every kind, in index order.
    pub const ALL: [Kind; KINDS] = [
        Kind::Keys,
        Kind::Tickets,
        Kind::Waiters,
        Kind::DecideStreams,
        Kind::WatchStreams,
        Kind::Rules,
    ];

    /// What is held, in words.
    pub fn what(self) -> &'static str {
        match self {
            Kind::Keys => "keys",
            Kind::Tickets => "tickets",
            Kind::Waiters => "waiting requests",
            Kind::DecideStreams => "Decide streams",
            Kind::WatchStreams => "Watch and event streams",
            Kind::Rules => "rules",
        }
    }

    /// The field that sets it, in an entry's `limits` and in `[server]`.
    pub fn field(self) -> &'static str {
        match self {
            Kind::Keys => "max_keys",
            Kind::Tickets => "max_tickets",
            Kind::Waiters => "max_waiters",
            Kind::DecideStreams => "max_decide_streams",
            Kind::WatchStreams => "max_watch_streams",
            Kind::Rules => "max_rules",
        }
    }

    /// The server-wide cap a default share is a part of.
    fn cap(self, limits: &Limits) -> u64 {
        match self {
            Kind::Keys => limits.max_keys,
            Kind::Tickets => limits.max_tickets,
            Kind::Waiters => limits.max_waiters,
            Kind::DecideStreams => limits.max_decide_streams,
            Kind::WatchStreams => limits.max_watch_streams,
            Kind::Rules => limits.max_rules,
        }
    }
}

/// An entry's `limits = { ... }` as written: each field overrides the
/// default share for that kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Allowance {
    /// Live keys.
    pub max_keys: Option<u64>,
    /// Live tickets.
    pub max_tickets: Option<u64>,
    /// Waiting requests.
    pub max_waiters: Option<u64>,
    /// Open Decide streams.
    pub max_decide_streams: Option<u64>,
    /// Open Watch and event streams.
    pub max_watch_streams: Option<u64>,
    /// Rules in force inside its prefixes.
    pub max_rules: Option<u64>,
    /// Bytes of its stream answers made and not yet read by its clients
    /// (a part of `[server] max_unread_bytes`, kept by the server's
    /// outbox budget, not by the engine).
    pub max_unread_bytes: Option<u64>,
}

impl Allowance {
    /// The limit set for `kind`, if any.
    pub fn of(&self, kind: Kind) -> Option<u64> {
        match kind {
            Kind::Keys => self.max_keys,
            Kind::Tickets => self.max_tickets,
            Kind::Waiters => self.max_waiters,
            Kind::DecideStreams => self.max_decide_streams,
            Kind::WatchStreams => self.max_watch_streams,
            Kind::Rules => self.max_rules,
        }
    }
}

/// How long after its last use a key a credential asked for counts in its
/// key share with a store (decisions 104): as long as Redis keeps a key at
/// rest (the module's 10 minutes), or the server's `idle_after` if longer.
pub fn key_idle_after(limits: &Limits) -> Millis {
    limits.idle_after.max(crate::domain::IDLE_AFTER)
}

/// The default share: half of each cap.
pub const DEFAULT_SHARE: f64 = 0.5;

/// One credential's limits and holdings.
#[derive(Debug)]
pub struct Share {
    name: Arc<str>,
    limits: [AtomicU64; KINDS],
    /// Where the entry's `limits` set the limit, not the default share
    /// (for the refusal's words).
    explicit: [AtomicBool; KINDS],
    held: [AtomicU64; KINDS],
    refused: [AtomicU64; KINDS],
    /// Its live tickets' lease ends: a ticket counts until it is
    /// completed through this server or its lease ends.
    tickets: Mutex<HashMap<TicketId, Millis>>,
    /// Its Decide frames in flight to the store (decisions 102): at most
    /// half of the server's, so that another credential's frames and
    /// calls always find room on the link.
    store_frames: tokio::sync::Semaphore,
    /// With a store, the keys it asked for lately (decisions 104).
    keys: Mutex<Asked>,
    /// With a store, what it holds through the fleet's other servers, as
    /// last read from Redis (decisions 148); zeros embedded.
    elsewhere: [AtomicU64; KINDS],
    /// With a store nearly full (decisions 148): why this credential's new
    /// keys are refused, while it holds more than its part of the store.
    no_new_keys: Mutex<Option<Arc<str>>>,
    /// Its single calls in flight with a store, which other credentials'
    /// Decide parts yield to.
    calls_in_flight: AtomicU64,
    /// Until when (engine time) a search for its keys at rest to forget
    /// is not tried again, after one found none (embedded).
    barren_until: AtomicU64,
}

/// The keys a credential asked for lately through this server.
#[derive(Debug, Default)]
struct Asked {
    /// Each key with when it was last asked for.
    last: HashMap<Arc<str>, Millis>,
    /// When they were last swept.
    swept: Millis,
    /// Keys not yet counted fleet-wide in the current period
    /// ([`KEYS_PERIOD`]); at most the share's limit of them.
    unpublished: Vec<Arc<str>>,
}

/// With a store, a key counts fleet-wide once per period of this length
/// in which it is asked for (decisions 148).
pub const KEYS_PERIOD: Millis = 60_000;

/// The most Decide frames of one credential in flight to the store.
pub const STORE_FRAMES_PER_CREDENTIAL: usize = 256;

/// One unit of a share, given back when dropped.
#[derive(Debug)]
pub struct Hold {
    share: Arc<Share>,
    kind: Kind,
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.share.give(self.kind);
    }
}

impl Hold {
    /// The share it is a unit of.
    pub fn share(&self) -> &Arc<Share> {
        &self.share
    }
}

/// A ticket's unit of a share, taken before the acquire is sent: kept by
/// [`TicketHold::keep`] when the acquire is granted, else given back.
#[derive(Debug)]
pub struct TicketHold {
    share: Arc<Share>,
    kept: bool,
}

impl TicketHold {
    /// Keeps the unit for `ticket`, whose lease ends at `lease_end`.
    pub fn keep(mut self, ticket: TicketId, lease_end: Millis) {
        let mut tickets = self.share.tickets.lock().expect("share tickets");
        if tickets.insert(ticket, lease_end).is_some() {
            // The same ticket twice (cannot happen: ids are random).
            self.share.give(Kind::Tickets);
        }
        self.kept = true;
    }
}

impl Drop for TicketHold {
    fn drop(&mut self) {
        if !self.kept {
            self.share.give(Kind::Tickets);
        }
    }
}

impl Share {
    fn new(name: Arc<str>) -> Share {
        Share {
            name,
            limits: Default::default(),
            explicit: Default::default(),
            held: Default::default(),
            refused: Default::default(),
            tickets: Mutex::new(HashMap::new()),
            store_frames: tokio::sync::Semaphore::new(STORE_FRAMES_PER_CREDENTIAL),
            keys: Mutex::new(Asked::default()),
            elsewhere: Default::default(),
            no_new_keys: Mutex::new(None),
            calls_in_flight: AtomicU64::new(0),
            barren_until: AtomicU64::new(0),
        }
    }

    /// Until when a search for its keys at rest is not tried again.
    pub(super) fn barren_until(&self) -> &AtomicU64 {
        &self.barren_until
    }

    /// True when it holds all its limit of `kind`.
    pub fn is_full(&self, kind: Kind) -> bool {
        self.held(kind) >= self.limit(kind)
    }

    /// With a store (decisions 104): counts `key` as one of its keys while
    /// it asked for it within `idle_after` (a key Redis forgets that long
    /// after its last use); refused when that makes more than its limit.
    /// Counting what the other servers hold (decisions 148), a key new
    /// here fits only under its limit less the keys asked for through the
    /// others alone. While the store is nearly full and this credential
    /// holds more than its part of it, a key new here is refused with
    /// [`EngineError::StoreFull`]: the caller goes on when the store
    /// already holds the key ([`Share::keep_key`]).
    pub fn use_key(&self, key: &str, now: Millis, idle_after: Millis) -> Result<(), EngineError> {
        let mut asked = self.keys.lock().expect("share keys");
        let limit = self.limit(Kind::Keys);
        if let Some(last) = asked.last.get_mut(key) {
            let new_period = *last / KEYS_PERIOD != now / KEYS_PERIOD;
            *last = now;
            if new_period {
                // Once a period: the name kept, not a new copy of it.
                if let Some((name, _)) = asked.last.get_key_value(key) {
                    let name = name.clone();
                    asked.unpublish(name, limit);
                }
            }
            return Ok(());
        }
        if let Some(why) = self.no_new_keys.lock().expect("no new keys").clone() {
            self.count_refusal(Kind::Keys);
            return Err(EngineError::StoreFull(why.to_string()));
        }
        let limit_here = limit.saturating_sub(self.elsewhere(Kind::Keys));
        // A full share lets go of the keys it has not used within
        // `idle_after`, looking at most once a second.
        if asked.last.len() as u64 >= limit_here && now >= asked.swept.saturating_add(1_000) {
            asked.sweep(now, idle_after);
        }
        let fits = (asked.last.len() as u64) < limit_here;
        if fits {
            asked.keep(key, now, limit);
        }
        self.held[Kind::Keys as usize].store(asked.last.len() as u64, Ordering::Relaxed);
        if fits {
            Ok(())
        } else {
            self.count_refusal(Kind::Keys);
            Err(self.refusal(Kind::Keys))
        }
    }

    /// Counts `key`, which the store already holds, as one of its keys
    /// even past [`Share::use_key`]'s refusal while the store is nearly
    /// full: a key that exists is still decided.
    pub fn keep_key(&self, key: &str, now: Millis) {
        let mut asked = self.keys.lock().expect("share keys");
        asked.keep(key, now, self.limit(Kind::Keys));
        self.held[Kind::Keys as usize].store(asked.last.len() as u64, Ordering::Relaxed);
    }

    /// Lets go of the keys (with a store) it has not used within `idle_after`.
    pub fn sweep_keys(&self, now: Millis, idle_after: Millis) {
        let mut asked = self.keys.lock().expect("share keys");
        if asked.last.is_empty() {
            return;
        }
        asked.sweep(now, idle_after);
        self.held[Kind::Keys as usize].store(asked.last.len() as u64, Ordering::Relaxed);
    }

    /// The keys asked for here not yet counted fleet-wide this period.
    pub fn take_unpublished(&self) -> Vec<Arc<str>> {
        std::mem::take(&mut self.keys.lock().expect("share keys").unpublished)
    }

    /// What it holds of `kind` through the fleet's other servers, as last
    /// read (decisions 148); 0 embedded.
    pub fn elsewhere(&self, kind: Kind) -> u64 {
        self.elsewhere[kind as usize].load(Ordering::Relaxed)
    }

    /// Sets what it holds of `kind` through the other servers.
    pub fn set_elsewhere(&self, kind: Kind, n: u64) {
        self.elsewhere[kind as usize].store(n, Ordering::Relaxed);
    }

    /// Refuses its new keys while the store is nearly full, saying `why`;
    /// `None` lets them be made again.
    pub fn refuse_new_keys(&self, why: Option<Arc<str>>) {
        *self.no_new_keys.lock().expect("no new keys") = why;
    }

    /// Its single calls in flight with a store.
    pub fn calls_in_flight(&self) -> &AtomicU64 {
        &self.calls_in_flight
    }

    /// Its places for Decide frames in flight to the store.
    pub fn store_frames(&self) -> &tokio::sync::Semaphore {
        &self.store_frames
    }

    /// The credential's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its limit for `kind`.
    pub fn limit(&self, kind: Kind) -> u64 {
        self.limits[kind as usize].load(Ordering::Relaxed)
    }

    /// What it holds of `kind` (tickets: whose lease has not been seen to
    /// end; rules are counted from the rules, [`rules_held`]).
    pub fn held(&self, kind: Kind) -> u64 {
        self.held[kind as usize].load(Ordering::Relaxed)
    }

    /// Refusals at its limit for `kind`, since start.
    pub fn refused(&self, kind: Kind) -> u64 {
        self.refused[kind as usize].load(Ordering::Relaxed)
    }

    /// One more of `kind` if it fits under the limit; counts the refusal
    /// when it does not.
    pub fn try_take(&self, kind: Kind) -> bool {
        let taken = self.take_quietly(kind);
        if !taken {
            self.count_refusal(kind);
        }
        taken
    }

    /// One more of `kind` if it fits under the limit, counting no refusal
    /// (the caller counts it once it is final: a key may find room after
    /// keys at rest are forgotten). With a store, what the other servers
    /// hold counts (decisions 148).
    pub fn take_quietly(&self, kind: Kind) -> bool {
        let limit = self.limit(kind).saturating_sub(self.elsewhere(kind));
        self.held[kind as usize]
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .is_ok()
    }

    /// Gives back one of `kind`.
    pub fn give(&self, kind: Kind) {
        let _ = self.held[kind as usize].fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            Some(n.saturating_sub(1))
        });
    }

    /// One of `kind`, held until the [`Hold`] is dropped; the refusal
    /// when the share is full.
    pub fn take(self: &Arc<Self>, kind: Kind) -> Result<Hold, EngineError> {
        if self.try_take(kind) {
            Ok(Hold {
                share: self.clone(),
                kind,
            })
        } else {
            Err(self.refusal(kind))
        }
    }

    /// A ticket's unit, taken before an acquire; tickets whose lease
    /// ended by `now` are let go first when the share is full.
    pub fn take_ticket(self: &Arc<Self>, now: Millis) -> Result<TicketHold, EngineError> {
        if self.held(Kind::Tickets) >= self.limit(Kind::Tickets) {
            self.sweep(now);
        }
        if self.try_take(Kind::Tickets) {
            Ok(TicketHold {
                share: self.clone(),
                kept: false,
            })
        } else {
            Err(self.refusal(Kind::Tickets))
        }
    }

    /// Lets go of `ticket` (completed); false when this share did not hold it.
    pub fn let_go(&self, ticket: TicketId) -> bool {
        let mut tickets = self.tickets.lock().expect("share tickets");
        let held = tickets.remove(&ticket).is_some();
        if held {
            self.give(Kind::Tickets);
        }
        held
    }

    /// Moves the lease end of a ticket it holds (renewed).
    pub fn renewed(&self, ticket: TicketId, lease_end: Millis) {
        if let Some(end) = self.tickets.lock().expect("share tickets").get_mut(&ticket) {
            *end = lease_end;
        }
    }

    /// Lets go of the tickets whose lease ended by `now` (for a reading).
    pub fn sweep(&self, now: Millis) {
        let mut tickets = self.tickets.lock().expect("share tickets");
        let before = tickets.len();
        tickets.retain(|_, end| *end > now);
        let ended = (before - tickets.len()) as u64;
        let _ = self.held[Kind::Tickets as usize].fetch_update(
            Ordering::AcqRel,
            Ordering::Acquire,
            |n| Some(n.saturating_sub(ended)),
        );
    }

    /// The refusal at its limit for `kind`: which limit, whose, what to do.
    pub fn refusal(&self, kind: Kind) -> EngineError {
        EngineError::ShareExhausted {
            credential: self.name.to_string(),
            what: kind.what(),
            field: kind.field(),
            limit: self.limit(kind),
            explicit: self.explicit[kind as usize].load(Ordering::Relaxed),
        }
    }

    /// Counts a refusal at its limit for `kind` made outside [`Share::try_take`].
    pub fn count_refusal(&self, kind: Kind) {
        self.refused[kind as usize].fetch_add(1, Ordering::Relaxed);
    }
}

impl Asked {
    /// Counts `key` as asked for at `now`; new here, it is counted
    /// fleet-wide at the next exchange.
    fn keep(&mut self, key: &str, now: Millis, limit: u64) {
        let key: Arc<str> = Arc::from(key);
        if self.last.insert(key.clone(), now).is_none() {
            self.unpublish(key, limit);
        }
    }

    /// Counts `key` fleet-wide at the next exchange; bounded: keys past
    /// the limit wait for the next period.
    fn unpublish(&mut self, key: Arc<str>, limit: u64) {
        if (self.unpublished.len() as u64) < limit {
            self.unpublished.push(key);
        }
    }

    fn sweep(&mut self, now: Millis, idle_after: Millis) {
        self.last
            .retain(|_, last| last.saturating_add(idle_after) > now);
        self.swept = now;
    }
}

/// The credentials a server knows, as their shares see them: each name
/// with its entry's `limits`, in the order of the entries, and the part of
/// each cap a credential may hold where its entry does not say
/// (`[auth] share`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Tenants {
    /// Each entry's name and `limits`; entries with one name share the
    /// first one's share.
    pub entries: Vec<(String, Allowance)>,
    /// `[auth] share`: the part of each cap, in (0, 1].
    pub fraction: f64,
}

/// Every credential's share, by name.
#[derive(Debug, Default)]
pub struct Shares {
    by_name: RwLock<HashMap<Arc<str>, Arc<Share>>>,
}

impl Shares {
    /// Sets the limits of every credential of `tenants`, under the
    /// server's `limits`; a credential that stays keeps what it holds, one
    /// that left is dropped once it holds nothing. `None`: no credentials
    /// (no `[auth]`).
    pub fn adopt(&self, tenants: Option<&Tenants>, limits: &Limits) {
        let mut by_name = self.by_name.write().expect("shares lock");
        let Some(tenants) = tenants else {
            by_name.retain(|_, s| Kind::ALL.iter().any(|k| s.held(*k) > 0));
            return;
        };
        let mut named = std::collections::HashSet::new();
        for (name, allowance) in &tenants.entries {
            // Entries of one tenant share one share; the first sets it.
            if !named.insert(name.as_str()) {
                continue;
            }
            let share = by_name
                .entry(Arc::from(name.as_str()))
                .or_insert_with_key(|name| Arc::new(Share::new(name.clone())));
            for kind in Kind::ALL {
                let (limit, explicit) = match allowance.of(kind) {
                    Some(limit) => (limit, true),
                    None => (default_limit(kind.cap(limits), tenants.fraction), false),
                };
                share.limits[kind as usize].store(limit, Ordering::Relaxed);
                share.explicit[kind as usize].store(explicit, Ordering::Relaxed);
            }
        }
        by_name
            .retain(|name, s| named.contains(&**name) || Kind::ALL.iter().any(|k| s.held(*k) > 0));
        // Shares that add up past a cap let some tenants take others' room.
        for kind in Kind::ALL {
            let cap = kind.cap(limits);
            let total: u64 = named
                .iter()
                .filter_map(|name| by_name.get(*name))
                .map(|s| s.limits[kind as usize].load(Ordering::Relaxed))
                .fold(0u64, u64::saturating_add);
            if cap > 0 && total > cap {
                tracing::warn!(
                    cap = kind.field(),
                    limit = cap,
                    shares = total,
                    tenants = named.len(),
                    "the tenants' shares of [server].{} add up to {total}, more than the cap of {cap}: some tenants can take the room of others; lower their limits or raise the cap",
                    kind.field()
                );
            }
        }
    }

    /// The share of the credential named `name`.
    pub fn of(&self, name: &str) -> Option<Arc<Share>> {
        self.by_name.read().expect("shares lock").get(name).cloned()
    }

    /// Every share, by name.
    pub fn all(&self) -> Vec<Arc<Share>> {
        let mut all: Vec<_> = self
            .by_name
            .read()
            .expect("shares lock")
            .values()
            .cloned()
            .collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }
}

/// The rules in force whose patterns `covers` (a credential's prefixes):
/// what it holds of [`Kind::Rules`], counted from the rules rather than
/// kept.
pub fn rules_held(rules: &Rules, covers: impl Fn(&Pattern) -> bool) -> u64 {
    rules.rules.iter().filter(|r| covers(&r.pattern)).count() as u64
}

/// `fraction` of `cap`, rounded up, at least 1.
pub fn default_limit(cap: u64, fraction: f64) -> u64 {
    ((cap as f64 * fraction).ceil() as u64).clamp(1, cap.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn share(limit: u64) -> Arc<Share> {
        let share = Arc::new(Share::new(Arc::from("a")));
        for kind in Kind::ALL {
            share.limits[kind as usize].store(limit, Ordering::Relaxed);
        }
        share
    }

    #[test]
    fn a_hold_is_given_back_when_dropped() {
        let share = share(2);
        let one = share.take(Kind::Waiters).unwrap();
        let two = share.take(Kind::Waiters).unwrap();
        let err = share.take(Kind::Waiters).unwrap_err();
        assert!(err.to_string().contains("\"a\""), "{err}");
        assert_eq!(share.refused(Kind::Waiters), 1);
        drop(one);
        assert_eq!(share.held(Kind::Waiters), 1);
        drop(two);
        assert_eq!(share.held(Kind::Waiters), 0);
    }

    #[test]
    fn tickets_count_until_completed_or_their_lease_ends() {
        let share = share(2);
        share.take_ticket(0).unwrap().keep(TicketId(1), 100);
        share.take_ticket(0).unwrap().keep(TicketId(2), 200);
        assert!(share.take_ticket(99).is_err());
        // An unkept hold gives its unit back.
        drop(share.take_ticket(100).unwrap());
        assert_eq!(share.held(Kind::Tickets), 1);
        share.renewed(TicketId(2), 300);
        share.take_ticket(100).unwrap().keep(TicketId(3), 400);
        assert!(share.take_ticket(299).is_err());
        assert!(share.let_go(TicketId(3)));
        assert!(!share.let_go(TicketId(3)));
        share.sweep(300);
        assert_eq!(share.held(Kind::Tickets), 0);
    }

    #[test]
    fn with_a_store_keys_count_while_asked_for_within_the_idle_time() {
        let share = share(2);
        share.use_key("a/1", 0, 100).unwrap();
        share.use_key("a/2", 10, 100).unwrap();
        // The same key again is not one more.
        share.use_key("a/1", 50, 100).unwrap();
        assert_eq!(share.held(Kind::Keys), 2);
        let err = share.use_key("a/3", 60, 100).unwrap_err();
        assert!(err.to_string().contains("max_keys"), "{err}");
        assert_eq!(share.refused(Kind::Keys), 1);
        // Past the idle time both are let go; a full share looks for
        // such keys at most once a second.
        share.use_key("a/3", 1_005, 100).unwrap();
        share.use_key("a/4", 1_050, 100).unwrap();
        assert_eq!(share.held(Kind::Keys), 2);
        share.use_key("a/5", 1_200, 100).unwrap_err();
        assert_eq!(share.refused(Kind::Keys), 2);
        share.use_key("a/5", 2_010, 100).unwrap();
        assert_eq!(share.held(Kind::Keys), 1);
        share.sweep_keys(2_200, 100);
        assert_eq!(share.held(Kind::Keys), 0);
    }

    #[test]
    fn the_default_share_is_a_part_of_the_cap_rounded_up() {
        assert_eq!(default_limit(40, 0.5), 20);
        assert_eq!(default_limit(3, 0.5), 2);
        assert_eq!(default_limit(1, 0.1), 1);
        assert_eq!(default_limit(10, 1.0), 10);
    }
}

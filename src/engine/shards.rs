//! The keyed store: every live key's [`Fuse`] in shards, each behind its
//! own lock, with what the engine needs to keep per shard so that no
//! request touches anything shared:
//!
//! - a hash table of slots (one boxed [`Slot`] per key, for lookups),
//! - the key names in order (for listing by cursor and for sweeps in
//!   batches) and, apart, the keys that are not CLOSED (for the keys an
//!   operator looks at first),
//! - the shard's timer schedule, its figures ([`Totals`]), its busiest keys ([`Hitters`]) and its outbox of
//!   events waiting to be sent.
//!
//! A request on one key takes one shard's lock once; reads take it shared.

use std::collections::BTreeSet;
use std::hash::BuildHasher;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use hashbrown::HashTable;

use super::events::Event;
use super::rules::Compiled;
use super::Totals;
use crate::domain::{Decision, Fuse, Millis, Phase, Reason};

/// How many shards the store has.
pub const SHARDS: usize = 64;

/// The most keys a sweep or a settlement handles under one lock.
pub const BATCH: usize = 1024;

/// Entries in each shard's table of busiest keys.
const HITTERS: usize = 64;

/// "No deadline registered with the timer."
pub(super) const UNSCHEDULED: Millis = Millis::MAX;

/// One live key.
#[derive(Debug)]
pub(super) struct Slot {
    /// The key's name, shared with its tickets, its events and the indexes.
    pub name: Arc<str>,
    /// Its breaker, permit book and tickets; its tag holds the rest (see
    /// [`Slot::generation`] and [`Slot::by_charge`]), so that a slot takes
    /// 128 bytes.
    pub fuse: Fuse,
    /// The credential whose share the key counts against (decisions 99).
    pub owner: Option<Arc<super::shares::Share>>,
}

/// The tag's bit that says [`Slot::by_charge`]; the others hold the
/// generation.
const BY_CHARGE: u32 = 1 << 31;

impl Slot {
    /// A new key's slot.
    pub fn new(
        name: Arc<str>,
        fuse: Fuse,
        generation: u32,
        owner: Option<Arc<super::shares::Share>>,
    ) -> Slot {
        let mut slot = Slot { name, fuse, owner };
        slot.set_generation(generation);
        slot
    }

    /// The rules generation the fuse's policy came from (Y4), in 31 bits:
    /// compared for equality only, so its wrapping is harmless.
    pub fn generation(&self) -> u32 {
        self.fuse.tag() & !BY_CHARGE
    }

    /// True when the fuse's policy came from `generation`.
    pub fn is_current(&self, generation: u32) -> bool {
        self.generation() == generation & !BY_CHARGE
    }

    /// Records that the fuse's policy came from `generation`.
    pub fn set_generation(&mut self, generation: u32) {
        let tag = self.fuse.tag();
        self.fuse
            .set_tag((tag & BY_CHARGE) | (generation & !BY_CHARGE));
    }

    /// Made by a charge of the rate-limit service: forgotten at rest when
    /// another charge's new key needs room (RL19).
    pub fn by_charge(&self) -> bool {
        self.fuse.tag() & BY_CHARGE != 0
    }

    /// Marks the key as made by a charge.
    pub fn mark_by_charge(&mut self) {
        let tag = self.fuse.tag();
        self.fuse.set_tag(tag | BY_CHARGE);
    }
}

/// Where [`Totals::decisions`] counts grants and denials.
const GRANTED: usize = 0;
const DENIED: usize = 4;
const SHADOW: usize = 5;

/// A shard's figures are [`Totals`] too, kept as they change under the
/// shard's lock and summed on read.
impl Totals {
    /// Counts a final decision (a queued request is counted when answered).
    pub fn count(&mut self, decision: &Decision) {
        let (index, reason) = match *decision {
            Decision::Granted(None) | Decision::Queued => return,
            Decision::Granted(Some(_)) => (GRANTED, None),
            Decision::Probe(_) => (1, None),
            Decision::Blocked { reason, .. } => (2, Some(reason)),
            Decision::Refused => (3, None),
            Decision::Denied { reason, .. } => (DENIED, Some(reason)),
            // Answered granted by a shadow policy (D1): neither a grant
            // nor a denial, so no reason is counted.
            Decision::Shadow { grant: None, .. } => return,
            Decision::Shadow { .. } => (SHADOW, None),
        };
        self.tally(index, reason);
    }

    /// Counts a key's part of a charge without a ticket (Envoy's rate-limit
    /// service): granted when the request was charged, else denied for
    /// want of permits.
    pub fn count_charge(&mut self, charged: bool) {
        if charged {
            self.tally(GRANTED, None);
        } else {
            self.tally(DENIED, Some(Reason::NoPermits));
        }
    }

    fn tally(&mut self, index: usize, reason: Option<Reason>) {
        self.decisions[index] += 1;
        if let Some(reason) = reason {
            self.reasons[reason as usize] += 1;
        }
    }

    /// Adds another shard's figures.
    pub fn add(&mut self, other: &Totals) {
        self.keys += other.keys;
        self.tickets += other.tickets;
        self.waiters += other.waiters;
        self.forgotten += other.forgotten;
        self.transitions += other.transitions;
        for (a, b) in self.by_phase.iter_mut().zip(other.by_phase) {
            *a += b;
        }
        for (a, b) in self.decisions.iter_mut().zip(other.decisions) {
            *a += b;
        }
        for (a, b) in self.reasons.iter_mut().zip(other.reasons) {
            *a += b;
        }
        for (a, b) in self.cap_refusals.iter_mut().zip(other.cap_refusals) {
            *a += b;
        }
    }
}

/// A shard's busiest keys lately: a small table of counts, in buckets of
/// [`WAYS`] entries chosen by the key's hash. A request for a key in its
/// bucket counts it up; a key not there takes an empty entry, else the
/// entry with the lowest count, starting from that count plus one (the
/// space-saving rule, so a key busier than what it displaces is never
/// lost). Counts are halved now and then, so that "busiest" means busiest
/// lately.
#[derive(Debug)]
pub(crate) struct Hitters {
    entries: Vec<(Option<Arc<str>>, u32)>,
}

/// Entries per bucket of [`Hitters`].
const WAYS: usize = 4;

impl Default for Hitters {
    fn default() -> Self {
        Hitters {
            entries: vec![(None, 0); HITTERS],
        }
    }
}

impl Hitters {
    fn bucket(&mut self, hash: u64) -> &mut [(Option<Arc<str>>, u32)] {
        let start = (hash >> 40) as usize % (HITTERS / WAYS) * WAYS;
        &mut self.entries[start..start + WAYS]
    }

    /// Counts a request for `name`.
    pub fn bump(&mut self, hash: u64, name: &Arc<str>) {
        self.count(hash, |held| Arc::ptr_eq(held, name), || name.clone());
    }

    /// Counts a request for the key named `name`, matched by its name (for
    /// callers that hold no shared name for it).
    pub fn bump_named(&mut self, hash: u64, name: &str) {
        self.count(hash, |held| **held == *name, || Arc::from(name));
    }

    /// Counts a request for the key in `hash`'s bucket that `is` it; a key
    /// not held takes the entry of the least count (an empty one first),
    /// named by `name`.
    fn count(
        &mut self,
        hash: u64,
        is: impl Fn(&Arc<str>) -> bool,
        name: impl FnOnce() -> Arc<str>,
    ) {
        let bucket = self.bucket(hash);
        if let Some((_, count)) = bucket
            .iter_mut()
            .find(|(held, _)| held.as_ref().is_some_and(&is))
        {
            *count = count.saturating_add(1);
            return;
        }
        let (held, count) = bucket
            .iter_mut()
            .min_by_key(|(held, count)| (held.is_some(), *count))
            .expect("a bucket has entries");
        *held = Some(name());
        *count = count.saturating_add(1);
    }

    /// Lets go of a forgotten key.
    pub fn forget(&mut self, hash: u64, name: &str) {
        for entry in self.bucket(hash) {
            if entry.0.as_deref() == Some(name) {
                *entry = (None, 0);
            }
        }
    }

    /// Halves every count.
    pub fn decay(&mut self) {
        for (held, count) in &mut self.entries {
            *count /= 2;
            if *count == 0 {
                *held = None;
            }
        }
    }

    /// The keys held, with their counts.
    pub fn held(&self) -> impl Iterator<Item = (&Arc<str>, u32)> {
        self.entries
            .iter()
            .filter_map(|(held, count)| held.as_ref().map(|h| (h, *count)))
    }
}

/// Everything of a shard but its table, so that a slot borrowed from the
/// table and the rest can be changed together.
#[derive(Debug)]
pub(super) struct Rest {
    /// Every key's name, in order.
    pub order: BTreeSet<Arc<str>>,
    /// The keys that are not CLOSED, in order.
    pub broken: BTreeSet<Arc<str>>,
    /// `(deadline, key)` of every key with a deadline: its next one only.
    pub schedule: BTreeSet<(Millis, Arc<str>)>,
    /// The shard's figures.
    pub tally: Totals,
    /// The shard's busiest keys.
    pub hitters: Hitters,
    /// Events made under the lock, waiting to be sent after it.
    pub outbox: Vec<Event>,
    /// The rules in force.
    pub rules: Arc<Compiled>,
    /// Keys whose durable state changed since the data dir was last
    /// written, with the operator who acted on them, if one did (only
    /// filled when the server has a data dir).
    pub dirty: std::collections::HashMap<Arc<str>, Option<Box<super::storage::Actor>>>,
}

impl Rest {
    /// Keeps the figures and the index of broken keys right after a key
    /// moved from phase `from` to `to`.
    pub fn moved(&mut self, name: &Arc<str>, from: Phase, to: Phase) {
        if from == to {
            return;
        }
        self.tally.by_phase[from.index()] -= 1;
        self.tally.by_phase[to.index()] += 1;
        if from == Phase::Closed {
            self.broken.insert(name.clone());
        } else if to == Phase::Closed {
            self.broken.remove(name);
        }
    }
}

/// One shard's state, behind its lock.
#[derive(Debug)]
pub(super) struct ShardState {
    /// Slots by the hash of their key.
    pub table: HashTable<Box<Slot>>,
    /// The rest.
    pub rest: Rest,
}

/// The shards and the hasher that places keys in them.
#[derive(Debug)]
pub(super) struct Shards {
    shards: Box<[RwLock<ShardState>]>,
    hasher: hashbrown::DefaultHashBuilder,
}

impl Shards {
    pub fn new(rules: Arc<Compiled>) -> Self {
        let shards = (0..SHARDS)
            .map(|_| {
                RwLock::new(ShardState {
                    table: HashTable::new(),
                    rest: Rest {
                        order: BTreeSet::new(),
                        broken: BTreeSet::new(),
                        schedule: BTreeSet::new(),
                        tally: Totals::default(),
                        hitters: Hitters::default(),
                        outbox: Vec::new(),
                        rules: rules.clone(),
                        dirty: std::collections::HashMap::new(),
                    },
                })
            })
            .collect();
        Shards {
            shards,
            hasher: hashbrown::DefaultHashBuilder::default(),
        }
    }

    /// The hash of a key's name.
    pub fn hash(&self, key: &str) -> u64 {
        self.hasher.hash_one(key)
    }

    /// The shard of a hash: bits that neither the table's index nor its
    /// tags use.
    pub fn shard_of(hash: u64) -> usize {
        (hash >> 32) as usize % SHARDS
    }

    /// A shard, for writing.
    pub fn write(&self, shard: usize) -> RwLockWriteGuard<'_, ShardState> {
        self.shards[shard].write().expect("shard lock")
    }

    /// A shard, for reading.
    pub fn read(&self, shard: usize) -> RwLockReadGuard<'_, ShardState> {
        self.shards[shard].read().expect("shard lock")
    }

    /// Hashes a slot again when the table grows.
    pub fn rehash(&self) -> impl Fn(&Box<Slot>) -> u64 + '_ {
        move |slot| self.hasher.hash_one(&*slot.name)
    }
}

impl ShardState {
    /// The slot of `key`, if it is live.
    pub fn find(&self, hash: u64, key: &str) -> Option<&Slot> {
        self.table.find(hash, |s| &*s.name == key).map(|s| &**s)
    }
}

impl Rest {
    /// Notes that `name`'s durable state changed, by `actor` if an operator
    /// acted: the data dir's writer picks it up.
    pub fn mark_dirty(&mut self, name: &Arc<str>, actor: Option<Box<super::storage::Actor>>) {
        match actor {
            Some(actor) => {
                self.dirty.insert(name.clone(), Some(actor));
            }
            None => {
                if !self.dirty.contains_key(name) {
                    self.dirty.insert(name.clone(), None);
                }
            }
        }
    }

    /// Drops the indexes' hold on a key at rest that was just removed from
    /// the table; `forgotten` counts it as forgotten by idleness (K2).
    pub fn forget(&mut self, hash: u64, key: &str, forgotten: bool) {
        self.order.remove(key);
        self.hitters.forget(hash, key);
        self.tally.keys -= 1;
        self.tally.by_phase[Phase::Closed.index()] -= 1;
        if forgotten {
            self.tally.forgotten += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_takes_128_bytes_and_its_tag_keeps_both_parts() {
        // The allocator's size class of 128 bytes, not 160: a short key's
        // bytes in BENCHMARKS.md ("Memory") count on it.
        assert_eq!(std::mem::size_of::<Slot>(), 128);
        let policy = Arc::new(crate::domain::Policy::default());
        let mut slot = Slot::new("k".into(), Fuse::new(policy, 0), u32::MAX, None);
        assert!(!slot.by_charge());
        assert!(slot.is_current(u32::MAX));
        slot.mark_by_charge();
        assert!(slot.by_charge() && slot.is_current(u32::MAX));
        slot.set_generation(7);
        assert!(slot.by_charge() && slot.is_current(7) && !slot.is_current(8));
        assert_eq!(slot.generation(), 7);
    }
}

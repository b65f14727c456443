//! What each node keeps in memory about its keys, rebuilt from the values
//! when it is lost (a restart, a full resync): the keys that are not at
//! rest, each with its phase, live tickets, waiters and next deadline, and
//! the census those add up to; and the queue of deadlines the settler
//! works through.
//!
//! Every write of a key (a command on a primary, a patch on a replica, a
//! settlement) notes the key's [`Summary`] here, so a replica's registry is
//! ready when it is promoted. A key at rest (closed, no ticket, no waiter,
//! nothing due) is not kept. A background pass ([`crate::settler`]) reads
//! every value's header and notes it again, which finds keys loaded from
//! RDB or AOF or migrated in, and counts every fusebox key of the node.
//!
//! The deadline queue is lazy: a key's deadline is queued when it comes
//! earlier than the one already queued, and a queued entry that turns out
//! to be early is looked at and queued again at the key's real deadline.
//! So a hot key whose deadline moves on every write costs a map lookup,
//! not a reordering, and the queue holds at most one live entry per key.

use std::collections::hash_map::Entry;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Mutex, MutexGuard};

use fusebox_domain::policy::MAX_DURATION;
use fusebox_domain::{Millis, Phase};

use crate::state::Summary;

/// One key that is not at rest, or was not lately.
#[derive(Clone, Copy, Debug)]
struct Kept {
    summary: Summary,
    /// The deadline this key has in the queue, if any.
    queued: Option<Millis>,
    /// The last pass that found the key, or that was running when it was
    /// written.
    pass: u64,
}

impl Kept {
    fn active(&self) -> bool {
        active(&self.summary)
    }
}

/// A key is kept while it is not at rest.
fn active(s: &Summary) -> bool {
    s.phase != Phase::Closed || s.tickets > 0 || s.waiters > 0 || s.next_deadline.is_some()
}

/// The figures of a node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Census {
    /// Fusebox keys the last complete pass counted (0 before the first).
    pub keys: u64,
    /// True once a pass has completed since the registry was last lost.
    pub complete: bool,
    /// When the last complete pass ended (wall clock, ms).
    pub counted_at: Millis,
    /// Keys by phase, of those not at rest (indexed by [`Phase::index`]).
    pub by_phase: [u64; 4],
    /// Live tickets.
    pub tickets: u64,
    /// Waiting requests.
    pub waiters: u64,
}

#[derive(Default)]
struct Registry {
    kept: HashMap<Box<[u8]>, Kept>,
    due: BTreeSet<(Millis, Box<[u8]>)>,
    census: Census,
    /// Keys the running pass has counted.
    counting: u64,
    /// The number of the running (or last) pass.
    pass: u64,
    /// Keys no longer at rest that may still have the expiry a write at
    /// rest gave them, each once however often it came back from rest.
    expiring: HashSet<Box<[u8]>>,
}

static REGISTRY: Mutex<Option<Registry>> = Mutex::new(None);

fn with<R>(f: impl FnOnce(&mut Registry) -> R) -> R {
    let mut guard: MutexGuard<'_, Option<Registry>> =
        REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
    f(guard.get_or_insert_with(Registry::default))
}

impl Registry {
    fn add(&mut self, s: &Summary, sign: i64) {
        let phase = &mut self.census.by_phase[s.phase.index()];
        *phase = phase.wrapping_add_signed(sign);
        self.census.tickets = self
            .census
            .tickets
            .wrapping_add_signed(sign * i64::from(s.tickets));
        self.census.waiters = self
            .census
            .waiters
            .wrapping_add_signed(sign * i64::from(s.waiters));
    }

    fn note(&mut self, key: &[u8], summary: Option<Summary>, wall: Millis) {
        let due = summary.and_then(|s| settle_at(&s, wall));
        let pass = self.pass;
        match (self.kept.get_mut(key), summary) {
            (Some(kept), summary) => {
                kept.pass = pass;
                let old = kept.summary;
                let was = kept.active();
                kept.summary = summary.unwrap_or(Summary {
                    next_deadline: None,
                    phase: Phase::Closed,
                    tickets: 0,
                    waiters: 0,
                    last_now: old.last_now,
                });
                let now_active = kept.active();
                let queued = kept.queued;
                let requeue = due.filter(|&d| queued.is_none_or(|q| d < q));
                if requeue.is_some() {
                    kept.queued = requeue;
                }
                let new = kept.summary;
                let idle = !now_active && kept.queued.is_none();
                if was {
                    self.add(&old, -1);
                }
                if now_active {
                    self.add(&new, 1);
                }
                if let Some(d) = requeue {
                    self.due.insert((d, Box::from(key)));
                }
                if idle {
                    self.kept.remove(key);
                }
            }
            (None, Some(s)) if active(&s) => {
                self.add(&s, 1);
                if let Some(d) = due {
                    self.due.insert((d, Box::from(key)));
                }
                self.kept.insert(
                    Box::from(key),
                    Kept {
                        summary: s,
                        queued: due,
                        pass,
                    },
                );
            }
            (None, _) => {}
        }
    }

    fn pass_ended(&mut self, wall: Millis) {
        let pass = self.pass;
        let gone: Vec<Box<[u8]>> = self
            .kept
            .iter()
            .filter(|(_, k)| k.pass < pass)
            .map(|(key, _)| key.clone())
            .collect();
        for key in gone {
            if let Some(kept) = self.kept.remove(&key) {
                if kept.active() {
                    self.add(&kept.summary, -1);
                }
            }
        }
        self.census.keys = self.counting;
        self.census.complete = true;
        self.census.counted_at = wall;
    }

    fn pop_due(&mut self, now: Millis, max: usize) -> Vec<Vec<u8>> {
        let mut keys = Vec::new();
        while keys.len() < max {
            let Some((at, key)) = self.due.first().cloned() else {
                break;
            };
            if at > now {
                break;
            }
            self.due.remove(&(at, key.clone()));
            let Entry::Occupied(mut kept) = self.kept.entry(key) else {
                continue;
            };
            if kept.get().queued != Some(at) {
                continue;
            }
            kept.get_mut().queued = None;
            if !kept.get().active() {
                kept.remove();
                continue;
            }
            keys.push(kept.key().to_vec());
        }
        keys
    }
}

/// The deadline the settler keeps for a key: its next deadline, when its
/// last time seen is within 365 days of the wall clock (a key driven by a
/// caller's own clock, such as a test's manual clock at 1000, is settled
/// only when a command touches it).
pub fn settle_at(s: &Summary, wall: Millis) -> Option<Millis> {
    s.next_deadline
        .filter(|_| wall.abs_diff(s.last_now) <= MAX_DURATION)
}

/// Notes what a write left at `key` (`None`: the key is gone, or no
/// longer holds fusebox state).
pub fn note(key: &[u8], summary: Option<Summary>, wall: Millis) {
    with(|r| r.note(key, summary, wall));
}

/// [`note`], for a write that made a key at rest active again: its idle
/// expiry is for the settler to clear ([`take_expiring`]).
pub fn note_expiry(key: &[u8], summary: Option<Summary>, had_expiry: bool, wall: Millis) {
    with(|r| r.note_expiry(key, summary, had_expiry, wall));
}

/// Up to `max` keys whose idle expiry is to be cleared: those that are
/// still not at rest. The others are dropped: a key back at rest keeps
/// its expiry, and is noted again if it leaves rest once more.
pub fn take_expiring(max: usize) -> Vec<Box<[u8]>> {
    with(|r| r.take_expiring(max))
}

impl Registry {
    fn note_expiry(
        &mut self,
        key: &[u8],
        summary: Option<Summary>,
        had_expiry: bool,
        wall: Millis,
    ) {
        self.note(key, summary, wall);
        // An active summary is kept: no need to look the key up again.
        if had_expiry && summary.as_ref().is_some_and(active) && !self.expiring.contains(key) {
            self.expiring.insert(Box::from(key));
        }
    }

    fn take_expiring(&mut self, max: usize) -> Vec<Box<[u8]>> {
        let mut taken = Vec::new();
        let mut looked = 0;
        let kept = &self.kept;
        self.expiring.retain(|key| {
            if looked >= max {
                return true;
            }
            looked += 1;
            if kept.get(key).is_some_and(Kept::active) {
                taken.push(key.clone());
            }
            false
        });
        taken
    }
}

/// Takes up to `max` keys whose queued deadline is due by `now`.
pub fn pop_due(now: Millis, max: usize) -> Vec<Vec<u8>> {
    with(|r| r.pop_due(now, max))
}

/// The earliest queued deadline.
pub fn next_due() -> Option<Millis> {
    with(|r| r.due.first().map(|(at, _)| *at))
}

/// The node's figures now.
pub fn census() -> Census {
    with(|r| r.census)
}

/// Keys not at rest whose phase is not CLOSED, in no order, at most `max`,
/// those whose name `keep` accepts.
pub fn not_closed(max: usize, mut keep: impl FnMut(&[u8]) -> bool) -> Vec<Vec<u8>> {
    with(|r| {
        r.kept
            .iter()
            .filter(|(_, k)| k.summary.phase != Phase::Closed)
            .filter(|(key, _)| keep(key))
            .take(max)
            .map(|(key, _)| key.to_vec())
            .collect()
    })
}

/// A pass over the node's keys begins.
pub fn pass_started() {
    with(|r| {
        r.pass += 1;
        r.counting = 0;
    });
}

/// The running pass found `key` holding fusebox state as `summary` says.
pub fn seen(key: &[u8], summary: Summary, wall: Millis) {
    with(|r| {
        r.counting += 1;
        r.note(key, Some(summary), wall);
    });
}

/// The running pass ended at `wall`: its count is the node's, and a key
/// it did not find that was not written meanwhile is gone (deleted or
/// replaced without a notice the module heard: a flush, a full resync).
pub fn pass_ended(wall: Millis) {
    with(|r| r.pass_ended(wall));
}

/// Forgets everything (the dataset is being replaced: a flush, a load):
/// the next complete pass finds the keys again.
pub fn clear() {
    with(|r| *r = Registry::default());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(phase: Phase, tickets: u32, next: Option<Millis>) -> Summary {
        Summary {
            next_deadline: next,
            phase,
            tickets,
            waiters: 0,
            last_now: 1_000,
        }
    }

    #[test]
    fn a_key_that_leaves_rest_again_and_again_has_its_expiry_cleared_once() {
        let mut r = Registry::default();
        let wall = 1_000;
        for _ in 0..1_000 {
            r.note_expiry(b"hot", Some(summary(Phase::Closed, 1, None)), true, wall);
            r.note(b"hot", Some(summary(Phase::Closed, 0, None)), wall);
        }
        r.note_expiry(b"hot", Some(summary(Phase::Closed, 1, None)), true, wall);
        r.note_expiry(b"cold", Some(summary(Phase::Closed, 1, None)), true, wall);
        r.note(b"cold", Some(summary(Phase::Closed, 0, None)), wall);
        r.note_expiry(b"kept", Some(summary(Phase::Open, 0, None)), false, wall);
        assert_eq!(r.expiring.len(), 2, "each key once: {:?}", r.expiring);
        let taken = r.take_expiring(10);
        assert_eq!(
            taken,
            vec![Box::from(&b"hot"[..])],
            "only what is still active"
        );
        assert!(r.expiring.is_empty());
        assert!(r.take_expiring(10).is_empty());
    }

    #[test]
    fn the_registry_keeps_what_is_not_at_rest_and_queues_deadlines_lazily() {
        let mut r = Registry::default();
        let wall = 1_000;
        r.note(b"a", Some(summary(Phase::Closed, 1, Some(5_000))), wall);
        r.note(b"a", Some(summary(Phase::Closed, 2, Some(6_000))), wall);
        assert_eq!(r.due.len(), 1, "a later deadline does not queue again");
        r.note(b"b", Some(summary(Phase::Open, 0, None)), wall);
        assert_eq!(r.census.by_phase, [1, 1, 0, 0]);
        assert_eq!(r.census.tickets, 2);
        r.note(b"a", Some(summary(Phase::Closed, 0, None)), wall);
        assert_eq!(r.census.by_phase, [0, 1, 0, 0]);
        assert_eq!(r.census.tickets, 0);
        assert!(
            r.kept.contains_key(&b"a"[..]),
            "kept while its deadline is queued"
        );
        r.note(b"a", Some(summary(Phase::Closed, 1, Some(7_000))), wall);
        assert_eq!(r.due.len(), 1, "the queued 5000 comes first");
        r.note(b"b", None, wall);
        assert_eq!(r.census.by_phase, [1, 0, 0, 0]);
        assert!(!r.kept.contains_key(&b"b"[..]));
        assert_eq!(r.pop_due(4_999, 10), Vec::<Vec<u8>>::new());
        assert_eq!(r.pop_due(5_000, 10), vec![b"a".to_vec()]);
        assert_eq!(
            r.pop_due(10_000, 10),
            Vec::<Vec<u8>>::new(),
            "the settler queues it again"
        );
        r.note(b"a", Some(summary(Phase::Closed, 0, None)), wall);
        assert!(
            r.kept.is_empty() && r.census == Census::default(),
            "an idle key is not kept"
        );
    }

    #[test]
    fn a_pass_sweeps_what_it_did_not_find_and_counts_what_it_did() {
        let mut r = Registry::default();
        let wall = 1_000;
        r.note(b"gone", Some(summary(Phase::Open, 0, None)), wall);
        r.note(b"kept", Some(summary(Phase::Isolated, 0, None)), wall);
        r.pass += 1;
        r.counting = 0;
        r.counting += 1;
        r.note(b"kept", Some(summary(Phase::Isolated, 0, None)), wall);
        r.note(b"written", Some(summary(Phase::Open, 0, None)), wall);
        r.counting += 3;
        r.pass_ended(2_000);
        assert!(!r.kept.contains_key(&b"gone"[..]));
        assert_eq!(r.census.by_phase, [0, 1, 0, 1]);
        assert_eq!(
            (r.census.keys, r.census.complete, r.census.counted_at),
            (4, true, 2_000)
        );
    }
}

//! Room for a new key of the rate-limit service (RL19): when the key cap
//! (K3) or a credential's key share (decisions 99) would refuse a key that
//! a charge makes, keys at rest that charges made are forgotten first, the
//! longest idle first, and the charge is tried once more.
//!
//! A key at rest is as a fresh key would be (K2), so forgetting it before
//! its idle time changes no decision; only its statistics restart, as
//! when the idle sweep forgets it. A key that is not at rest is never
//! forgotten here: that would reset a counter, a limit bypassed. Keys
//! that Acquire and the operators make are left alone, and an Acquire
//! past a cap fails as K3 says.

use std::collections::BinaryHeap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::embedded::Engine;
use super::quota::Capped;
use super::shards::SHARDS;
use super::shares::{Kind, Share};
use crate::domain::Millis;

/// How long a search that found no key at rest keeps the next one away.
const BARREN_FOR: Millis = 1_000;

/// The part of the full limit forgotten by one search (at least one key),
/// so that a flood of new keys walks the keys once per this many.
const PART: u64 = 64;

impl Engine {
    /// Forgets keys at rest that charges made, the longest idle first, so
    /// that a charge's new key fits: `owner`'s own when its key share is
    /// full, else anyone's (the key cap). Forgets at most a part of the limit ([`PART`], at least
    /// one key), one search at a time; after a search that found none, no
    /// other for the same limit runs for [`BARREN_FOR`]. Returns how many
    /// were forgotten.
    pub(super) fn make_room(&self, owner: Option<&Arc<Share>>) -> usize {
        let mut cap_barren_until = self.room.barren_until.lock().expect("room search");
        let now = self.core.now();
        // Whose keys: the share's when it is the one that is full.
        let mine = owner.filter(|o| o.is_full(Kind::Keys));
        let (limit, barren_until) = match mine {
            Some(share) => (
                share.limit(Kind::Keys),
                share.barren_until().load(Ordering::Relaxed),
            ),
            None => (self.core.limits().max_keys, *cap_barren_until),
        };
        if now < barren_until {
            return 0;
        }
        let wanted = usize::try_from((limit / PART).max(1)).unwrap_or(usize::MAX);
        // The `wanted` longest idle keys at rest: a heap whose top is the
        // most recently used of them.
        let mut oldest: BinaryHeap<(Millis, usize, Arc<str>)> = BinaryHeap::new();
        for shard in 0..SHARDS {
            let state = self.shards.read(shard);
            for slot in state.table.iter() {
                if !slot.by_charge() {
                    continue;
                }
                if mine.is_some_and(|m| !slot.owner.as_ref().is_some_and(|o| Arc::ptr_eq(o, m))) {
                    continue;
                }
                let fuse = &slot.fuse;
                let last = fuse.last_now();
                if oldest.len() == wanted && oldest.peek().is_some_and(|top| top.0 <= last) {
                    continue;
                }
                if fuse.is_at_rest(now.max(last)) {
                    oldest.push((last, shard, slot.name.clone()));
                    if oldest.len() > wanted {
                        oldest.pop();
                    }
                }
            }
        }
        let mut forgotten = 0;
        for (_, shard, name) in oldest.into_sorted_vec() {
            let mut guard = self.shards.write(shard);
            let state = &mut *guard;
            let hash = self.shards.hash(&name);
            let Ok(entry) = state.table.find_entry(hash, |s| s.name == name) else {
                continue;
            };
            // Looked at again under the write lock: used since, it stays.
            let fuse = &entry.get().fuse;
            if !fuse.is_at_rest(self.core.now().max(fuse.last_now())) {
                continue;
            }
            if let Some(owner) = &entry.remove().0.owner {
                owner.give(Kind::Keys);
            }
            state.rest.forget(hash, &name, true);
            self.pools.settle(Capped::Keys, shard, -1, 0);
            forgotten += 1;
        }
        if forgotten == 0 {
            match mine {
                Some(share) => share
                    .barren_until()
                    .store(now.saturating_add(BARREN_FOR), Ordering::Relaxed),
                None => *cap_barren_until = now.saturating_add(BARREN_FOR),
            }
        } else {
            self.room
                .evicted
                .fetch_add(forgotten as u64, Ordering::Relaxed);
            tracing::debug!(
                forgotten,
                "forgot keys at rest, the longest idle first, to make room for a new key"
            );
        }
        forgotten
    }
}

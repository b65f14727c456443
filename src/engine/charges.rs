//! Charges over several keys at once, all or nothing: what Envoy's
//! rate-limit service asks (one request, several descriptors, each a key).
//!
//! The keys' shards are locked in ascending order (so two requests over
//! the same shards cannot wait for each other), every key is quoted, and
//! only when every quote fits is every key charged; then the locks are
//! released. Another request over any of these keys sees all the charges
//! or none. The keys are made on first use, within the key cap, under the
//! policy their rules give, like any acquire's.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::embedded::{count_no_room, is_no_room_for_key, Effects, Reach};
use super::error::{check_key, fuse_error};
use super::shards::Shards;
use super::shares::Share;
use super::{Engine, EngineError};
use crate::domain::{Fuse, Millis, Policy, Quote};

/// One key of a charge.
#[derive(Clone, Debug, PartialEq)]
pub struct ChargeItem {
    /// The key.
    pub key: String,
    /// Permits to take; 0 is a status check (it fits when a permit is free).
    pub permits: u32,
    /// The policy to charge under instead of the one the rules give (a
    /// descriptor's own limit); the key takes it at every charge.
    pub policy: Option<Arc<Policy>>,
}

/// The answer to a charge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChargeReply {
    /// One quote per item, in order: whether it fits and the figures after
    /// the charge (when `charged`) or as they stand.
    pub quotes: Vec<Quote>,
    /// True when every item fitted and all were charged; false when none was.
    pub charged: bool,
    /// The engine's time of the charge.
    pub now: Millis,
}

impl Engine {
    /// Charges every item, or none when any does not fit (see the module).
    /// Items that name the same key are charged together: their permits
    /// add up.
    /// Keys a charge makes count against `owner`'s share (decisions 99).
    pub fn charge_all(
        &self,
        items: &[ChargeItem],
        owner: Option<&Arc<Share>>,
    ) -> Result<ChargeReply, EngineError> {
        for item in items {
            check_key(&item.key)?;
        }
        if self.is_shutting_down() {
            return Err(EngineError::ShuttingDown);
        }
        // Permits per distinct key, and each key's hash and shard.
        let mut keys: BTreeMap<&str, Planned<'_>> = BTreeMap::new();
        for item in items {
            let hash = self.shards.hash(&item.key);
            let entry = keys.entry(item.key.as_str()).or_insert((
                hash,
                Shards::shard_of(hash),
                0,
                item.policy.as_ref(),
            ));
            entry.2 = entry.2.saturating_add(item.permits);
        }
        let mut shards: Vec<usize> = keys.values().map(|&(_, s, _, _)| s).collect();
        shards.sort_unstable();
        shards.dedup();
        let mut effects: Vec<Effects> = Vec::new();
        // A new key that finds no room first has keys at rest that
        // charges made forgotten for it (K2, RL19), then the charge is
        // tried once more.
        let mut searched = false;
        let result = loop {
            let attempt = self.charge_once(&keys, &shards, items, owner, searched, &mut effects);
            match attempt {
                Err(e) if !searched && is_no_room_for_key(&e) => {
                    searched = true;
                    self.make_room(owner);
                }
                other => break other,
            }
        };
        for e in effects {
            self.after(e);
        }
        result
    }

    /// One try of [`Engine::charge_all`] under the keys' shard locks;
    /// `last_try` counts a key's refusal for room.
    fn charge_once(
        &self,
        keys: &BTreeMap<&str, Planned<'_>>,
        shards: &[usize],
        items: &[ChargeItem],
        owner: Option<&Arc<Share>>,
        last_try: bool,
        effects: &mut Vec<Effects>,
    ) -> Result<ChargeReply, EngineError> {
        {
            // Ascending shard order: the one order every multi-key charge takes.
            let mut guards: Vec<_> = shards.iter().map(|&s| (s, self.shards.write(s))).collect();
            let now = self.core.now();
            let guard_of = |shard: usize| {
                shards
                    .binary_search(&shard)
                    .expect("every key's shard is locked")
            };
            let mut quotes: BTreeMap<&str, Quote> = BTreeMap::new();
            let mut outcome = Ok(());
            for (&key, &(hash, shard, permits, policy)) in keys {
                let state = &mut *guards[guard_of(shard)].1;
                let at = At {
                    policy,
                    owner,
                    key,
                    hash,
                    shard,
                    now,
                    request: true,
                    last_try,
                };
                let quoted = self.on_slot(state, at, effects, |fuse| fuse.quote(permits, now));
                match quoted {
                    Ok(q) => {
                        quotes.insert(key, q);
                    }
                    Err(e) => {
                        outcome = Err(e);
                        break;
                    }
                }
            }
            outcome.and_then(|()| {
                let charged = quotes.values().all(|q| q.fits);
                if charged {
                    for (&key, &(hash, shard, permits, policy)) in keys {
                        let state = &mut *guards[guard_of(shard)].1;
                        // Counted once, as a request, when it was quoted.
                        let at = At {
                            policy,
                            owner,
                            key,
                            hash,
                            shard,
                            now,
                            request: false,
                            last_try,
                        };
                        // Quoted under the same locks, so it fits: a
                        // failure here is a bug, reported as such.
                        let q =
                            self.on_slot(state, at, effects, |fuse| fuse.charge(permits, now))?;
                        quotes.insert(key, q);
                    }
                }
                for &(_, shard, _, _) in keys.values() {
                    guards[guard_of(shard)].1.rest.tally.count_charge(charged);
                }
                Ok(ChargeReply {
                    quotes: items.iter().map(|i| quotes[i.key.as_str()]).collect(),
                    charged,
                    now,
                })
            })
        }
    }

    /// Runs `op` on `key`'s fuse in the locked shard `state`, making the
    /// key first (within the key cap) as an acquire does.
    fn on_slot(
        &self,
        state: &mut super::shards::ShardState,
        at: At<'_>,
        effects: &mut Vec<Effects>,
        op: impl FnOnce(&mut Fuse) -> Result<Quote, crate::domain::FuseError>,
    ) -> Result<Quote, EngineError> {
        let At {
            key,
            hash,
            shard,
            now,
            request,
            policy: given,
            owner,
            last_try,
        } = at;
        let rest = &mut state.rest;
        let (slot, created) =
            match state
                .table
                .entry(hash, |s| &*s.name == key, self.shards.rehash())
            {
                hashbrown::hash_table::Entry::Occupied(o) => (o.into_mut(), false),
                hashbrown::hash_table::Entry::Vacant(v) => {
                    let mut slot = match self.new_slot(rest, key, shard, now, owner, given) {
                        Ok(slot) => slot,
                        Err(e) if last_try => return Err(count_no_room(e, rest, owner)),
                        Err(e) => return Err(e),
                    };
                    slot.mark_by_charge();
                    (v.insert(slot).into_mut(), true)
                }
            };
        if request {
            rest.hitters.bump(hash, &slot.name);
        }
        // A key with a policy of its own (RL15) never takes the rules'
        // when they change: it is up to date with them whatever they say.
        if given.is_some() {
            slot.set_generation(rest.rules.generation);
        }
        let mut effect = Effects {
            shard,
            ..Effects::default()
        };
        let quoted = self.apply(
            slot,
            rest,
            now,
            Reach {
                owner,
                ..Reach::MAKE
            },
            created,
            |fuse, _| {
                // A policy of the request's own wins over the rules'.
                if let Some(p) = given.filter(|p| fuse.policy() != &***p) {
                    fuse.set_policy(p.clone(), now)?;
                }
                op(fuse)
            },
            &mut effect,
        );
        effects.push(effect);
        quoted?.map_err(fuse_error)
    }
}

/// A key of a charge as planned: its hash, its shard, the permits of every
/// item that names it, and the policy of its own, if any.
type Planned<'a> = (u64, usize, u32, Option<&'a Arc<Policy>>);

/// Where a step of a charge runs: the key, its hash and shard, the time,
/// and whether it counts as a request (for the busiest keys).
#[derive(Clone, Copy)]
struct At<'a> {
    key: &'a str,
    policy: Option<&'a Arc<Policy>>,
    /// Whose share a key made here counts against.
    owner: Option<&'a Arc<Share>>,
    hash: u64,
    shard: usize,
    now: Millis,
    request: bool,
    /// A key's refusal for room is final (counted).
    last_try: bool,
}

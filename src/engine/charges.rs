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

use super::embedded::{Effects, Reach};
use super::error::{check_key, fuse_error};
use super::quota::Capped;
use super::shards::{Shards, Slot};
use super::{Engine, EngineError};
use crate::domain::{Decision, Fuse, Millis, Phase, Policy, Quote, Reason};

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
    pub fn charge_all(&self, items: &[ChargeItem]) -> Result<ChargeReply, EngineError> {
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
        let result = {
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
            for (&key, &(hash, shard, permits, policy)) in &keys {
                let state = &mut *guards[guard_of(shard)].1;
                let at = At {
                    policy,
                    key,
                    hash,
                    shard,
                    now,
                    request: true,
                };
                let quoted = self.on_slot(state, at, &mut effects, |fuse| fuse.quote(permits, now));
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
            outcome.map(|()| {
                let charged = quotes.values().all(|q| q.fits);
                let mut counted = Vec::new();
                if charged {
                    for (&key, &(hash, shard, permits, policy)) in &keys {
                        let state = &mut *guards[guard_of(shard)].1;
                        // Counted once, as a request, when it was quoted.
                        let at = At {
                            policy,
                            key,
                            hash,
                            shard,
                            now,
                            request: false,
                        };
                        if let Ok(q) =
                            self.on_slot(state, at, &mut effects, |fuse| fuse.charge(permits, now))
                        {
                            quotes.insert(key, q);
                        }
                        counted.push((shard, Decision::Granted(Some(dummy_grant()))));
                    }
                } else {
                    for &(_, shard, _, _) in keys.values() {
                        counted.push((
                            shard,
                            Decision::Denied {
                                reason: Reason::NoPermits,
                                retry_after: None,
                            },
                        ));
                    }
                }
                for (shard, decision) in counted {
                    guards[guard_of(shard)].1.rest.tally.count(&decision);
                }
                ChargeReply {
                    quotes: items.iter().map(|i| quotes[i.key.as_str()]).collect(),
                    charged,
                    now,
                }
            })
        };
        for e in effects {
            self.after(e);
        }
        result
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
        } = at;
        let rest = &mut state.rest;
        let (slot, created) =
            match state
                .table
                .entry(hash, |s| &*s.name == key, self.shards.rehash())
            {
                hashbrown::hash_table::Entry::Occupied(o) => (o.into_mut(), false),
                hashbrown::hash_table::Entry::Vacant(v) => {
                    if !self.pools.reserve(Capped::Keys, shard) {
                        rest.tally.cap_refusals[Capped::Keys as usize] += 1;
                        return Err(EngineError::Exhausted {
                            what: "keys",
                            cap: "max_keys",
                            limit: self.core.limits().max_keys,
                        });
                    }
                    self.pools.settle(Capped::Keys, shard, 1, 1);
                    let name: Arc<str> = Arc::from(key);
                    rest.order.insert(name.clone());
                    rest.tally.keys += 1;
                    rest.tally.by_phase[Phase::Closed.index()] += 1;
                    let policy = match given {
                        Some(p) => p.clone(),
                        None => rest.rules.policy_for(key).clone(),
                    };
                    let slot = Slot {
                        name,
                        fuse: Fuse::new(policy, now),
                        generation: rest.rules.generation,
                        owner: None,
                    };
                    (v.insert(Box::new(slot)).into_mut(), true)
                }
            };
        if request {
            rest.hitters.bump(hash, &slot.name);
        }
        // A key with a policy of its own (RL15) never takes the rules'
        // when they change: it is up to date with them whatever they say.
        if given.is_some() {
            slot.generation = rest.rules.generation;
        }
        let mut effect = Effects {
            shard,
            ..Effects::default()
        };
        let quoted = self.apply(
            slot,
            rest,
            now,
            Reach::MAKE,
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
    hash: u64,
    shard: usize,
    now: Millis,
    request: bool,
}

/// A grant to count a charge as a granted decision by, in the figures
/// (`fusebox_decisions_total`); no ticket is made.
fn dummy_grant() -> crate::domain::Grant {
    crate::domain::Grant {
        ticket: crate::domain::TicketId(0),
        lease_end: 0,
    }
}

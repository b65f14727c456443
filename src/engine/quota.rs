//! Caps on live keys, tickets and waiters (K3) without a shared counter on
//! every request.
//!
//! Each cap is a pool of room. A shard takes room from the pool in small
//! chunks and keeps it as its own share, so that an ordinary request
//! touches only its shard's share; the pool is touched about once every
//! [`CHUNK`] creations. A request that may create something first
//! *reserves* one unit (from its shard's share, else the pool, else the
//! other shards' shares), so the cap is exact: room always adds up, pool +
//! every share + every reservation + what is live = the cap, and a request
//! is refused only when there is no room anywhere. Shares shrink as the
//! pool empties and spare room flows back to it.

use std::sync::atomic::{AtomicI64, Ordering};

/// The most room a shard keeps from a pool at once.
pub const CHUNK: i64 = 32;

/// The things that are capped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Capped {
    /// Live keys.
    Keys = 0,
    /// Live tickets.
    Tickets = 1,
    /// Waiting requests.
    Waiters = 2,
}

/// The room of the three caps: in the pools, and in each shard's share.
#[derive(Debug)]
pub(super) struct Pools {
    room: [AtomicI64; 3],
    shares: Box<[[AtomicI64; 3]]>,
}

impl Pools {
    pub(super) fn new(caps: [u64; 3], shards: usize) -> Self {
        Pools {
            room: caps.map(|c| AtomicI64::new(i64::try_from(c).unwrap_or(i64::MAX))),
            shares: (0..shards).map(|_| Default::default()).collect(),
        }
    }

    /// How much room a shard may keep of `what` now.
    fn chunk(&self, what: Capped) -> i64 {
        let pool = self.room[what as usize].load(Ordering::Relaxed);
        (pool / (2 * self.shares.len() as i64)).clamp(0, CHUNK)
    }

    /// Reserves room for one more `what` created in `shard`, from its
    /// share, else from the pool, else from other shards' shares. False
    /// when the cap is reached. A reservation is accounted for by
    /// [`Pools::settle`].
    pub(super) fn reserve(&self, what: Capped, shard: usize) -> bool {
        let share = &self.shares[shard][what as usize];
        if take_one(share) {
            return true;
        }
        let pool = &self.room[what as usize];
        let want = 1 + self.chunk(what);
        let mut have = pool.load(Ordering::Relaxed);
        while have >= 1 {
            let take = want.min(have);
            match pool.compare_exchange_weak(
                have,
                have - take,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    share.fetch_add(take - 1, Ordering::Relaxed);
                    return true;
                }
                Err(now) => have = now,
            }
        }
        // At the cap but for room kept by other shards: take theirs.
        for (other, shares) in self.shares.iter().enumerate() {
            if other == shard {
                continue;
            }
            let taken = shares[what as usize].swap(0, Ordering::Relaxed);
            if taken >= 1 {
                share.fetch_add(taken - 1, Ordering::Relaxed);
                return true;
            }
        }
        false
    }

    /// Accounts for `delta` more (or fewer) live `what` in `shard`, of
    /// which `reserved` were reserved. More than was reserved is taken from
    /// the shard's share and then the pool, even past the cap (a waiter
    /// served with a ticket); spare room goes back to the pool.
    pub(super) fn settle(&self, what: Capped, shard: usize, delta: i64, reserved: i64) {
        let share = &self.shares[shard][what as usize];
        let pool = &self.room[what as usize];
        let net = delta - reserved;
        if net > 0 {
            let left = share.fetch_sub(net, Ordering::Relaxed) - net;
            if left < 0 {
                pool.fetch_sub(-left, Ordering::Relaxed);
                share.fetch_add(-left, Ordering::Relaxed);
            }
        } else if net < 0 {
            share.fetch_add(-net, Ordering::Relaxed);
        }
        let keep = self.chunk(what);
        let mine = share.load(Ordering::Relaxed);
        if mine > 2 * keep
            && share
                .compare_exchange(mine, keep, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            pool.fetch_add(mine - keep, Ordering::Relaxed);
        }
    }
}

/// Takes one unit from a share if it has one.
fn take_one(share: &AtomicI64) -> bool {
    let mut have = share.load(Ordering::Relaxed);
    while have >= 1 {
        match share.compare_exchange_weak(have, have - 1, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return true,
            Err(now) => have = now,
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn room(pools: &Pools, what: Capped) -> i64 {
        pools.room[what as usize].load(Ordering::Relaxed)
            + pools
                .shares
                .iter()
                .map(|s| s[what as usize].load(Ordering::Relaxed))
                .sum::<i64>()
    }

    #[test]
    fn a_small_cap_is_exact_across_shards() {
        let pools = Pools::new([3, 0, 0], 64);
        let mut made = 0;
        for round in 0..10 {
            if pools.reserve(Capped::Keys, round % 4) {
                pools.settle(Capped::Keys, round % 4, 1, 1);
                made += 1;
            }
        }
        assert_eq!(made, 3);
        pools.settle(Capped::Keys, 1, -1, 0);
        assert!(pools.reserve(Capped::Keys, 2));
        // Reserved, then not used: the room is free again.
        pools.settle(Capped::Keys, 2, 0, 1);
        assert!(pools.reserve(Capped::Keys, 3));
        pools.settle(Capped::Keys, 3, 1, 1);
        assert!(!pools.reserve(Capped::Keys, 0));
    }

    #[test]
    fn a_large_cap_is_reached_exactly_and_room_always_adds_up() {
        let cap = 100_000;
        let pools = Pools::new([cap, 0, 0], 8);
        let mut live = 0i64;
        let mut step = 7usize;
        for i in 0..300_000 {
            step = step
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let shard = (step >> 33) % 8;
            // Mostly creations, so the cap is reached and held.
            if (step >> 40).is_multiple_of(5) && live > 0 {
                pools.settle(Capped::Keys, shard, -1, 0);
                live -= 1;
            } else if pools.reserve(Capped::Keys, shard) {
                pools.settle(Capped::Keys, shard, 1, 1);
                live += 1;
            } else {
                assert_eq!(live, cap as i64, "refused below the cap, at step {i}");
            }
            assert_eq!(room(&pools, Capped::Keys) + live, cap as i64);
        }
        assert_eq!(live, cap as i64);
    }
}

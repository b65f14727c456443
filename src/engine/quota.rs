//! Caps on live keys, tickets and waiters (K3) without a shared counter on
//! every request.
//!
//! Each cap is a pool of room. A shard takes room from the pool in small
//! chunks and keeps it as its own allowance, under its own lock, so that an
//! ordinary request touches only its shard; the pool is touched about once
//! every [`CHUNK`] creations. Room always adds up: pool + every shard's
//! allowance + what is live = the cap. Chunks shrink as the pool empties,
//! and a cap below `2 * CHUNK * shards` is always counted one by one, so
//! small caps are exact; above that, a request may be refused while up to
//! `CHUNK * shards` of room sits in other shards' allowances (0.2% of the
//! default caps).

use std::sync::atomic::{AtomicI64, Ordering};

/// The most room a shard takes from a pool at once.
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

/// The room of the three caps that is in no shard's allowance.
#[derive(Debug)]
pub(super) struct Pools {
    room: [AtomicI64; 3],
    shards: i64,
}

/// One shard's allowance of each cap, kept under the shard's lock.
#[derive(Debug, Default)]
pub(super) struct Allowance {
    room: [i64; 3],
}

impl Pools {
    pub(super) fn new(caps: [u64; 3], shards: usize) -> Self {
        let room = caps.map(|c| AtomicI64::new(i64::try_from(c).unwrap_or(i64::MAX)));
        Pools {
            room,
            shards: shards as i64,
        }
    }

    /// How much room a shard may keep of `what` now.
    fn chunk(&self, what: Capped) -> i64 {
        let pool = self.room[what as usize].load(Ordering::Relaxed);
        (pool / (2 * self.shards)).clamp(0, CHUNK)
    }

    /// Makes sure the shard has room for one more of `what`, taking it
    /// from the pool when its allowance is empty. False at the cap.
    pub(super) fn has_room(&self, what: Capped, allowance: &mut Allowance) -> bool {
        let mine = &mut allowance.room[what as usize];
        if *mine >= 1 {
            return true;
        }
        let want = 1 - *mine + self.chunk(what);
        let pool = &self.room[what as usize];
        let mut have = pool.load(Ordering::Relaxed);
        loop {
            let take = want.min(have);
            if take < 1 - *mine {
                return false;
            }
            match pool.compare_exchange_weak(
                have,
                have - take,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    *mine += take;
                    return true;
                }
                Err(now) => have = now,
            }
        }
    }

    /// Accounts for `delta` more (or fewer) live `what` in a shard. More
    /// than its allowance is taken from the pool even past the cap (a
    /// waiter served with a ticket); spare room goes back to the pool, also
    /// when [`Pools::has_room`] made room that the request did not use.
    pub(super) fn settle(&self, what: Capped, allowance: &mut Allowance, delta: i64) {
        let mine = &mut allowance.room[what as usize];
        *mine -= delta;
        let pool = &self.room[what as usize];
        if *mine < 0 {
            pool.fetch_sub(-*mine, Ordering::Relaxed);
            *mine = 0;
        } else {
            let keep = self.chunk(what);
            if *mine > 2 * keep {
                pool.fetch_add(*mine - keep, Ordering::Relaxed);
                *mine = keep;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_cap_is_exact_across_shards() {
        let pools = Pools::new([3, 0, 0], 64);
        let mut shards: Vec<Allowance> = (0..4).map(|_| Allowance::default()).collect();
        let mut made = 0;
        for round in 0..10 {
            let shard = &mut shards[round % 4];
            if pools.has_room(Capped::Keys, shard) {
                pools.settle(Capped::Keys, shard, 1);
                made += 1;
            }
        }
        assert_eq!(made, 3);
        // Room made for a request that then took none goes back at once.
        pools.settle(Capped::Keys, &mut shards[1], -1);
        assert!(pools.has_room(Capped::Keys, &mut shards[2]));
        pools.settle(Capped::Keys, &mut shards[2], 0);
        assert!(pools.has_room(Capped::Keys, &mut shards[3]));
        pools.settle(Capped::Keys, &mut shards[3], 1);
        pools.settle(Capped::Keys, &mut shards[0], -1);
        assert!(pools.has_room(Capped::Keys, &mut shards[3]));
    }

    #[test]
    fn room_always_adds_up_to_the_cap() {
        let cap = 100_000;
        let pools = Pools::new([cap, 0, 0], 8);
        let mut shards: Vec<Allowance> = (0..8).map(|_| Allowance::default()).collect();
        let mut live = 0i64;
        let mut step = 7usize;
        for _ in 0..50_000 {
            step = step
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let shard = &mut shards[(step >> 33) % 8];
            if (step >> 40).is_multiple_of(3) && live > 0 {
                pools.settle(Capped::Keys, shard, -1);
                live -= 1;
            } else if pools.has_room(Capped::Keys, shard) {
                pools.settle(Capped::Keys, shard, 1);
                live += 1;
            }
            let parked: i64 = shards.iter().map(|s| s.room[0]).sum();
            let pool = pools.room[0].load(Ordering::Relaxed);
            assert_eq!(pool + parked + live, cap as i64);
            assert!(parked <= 8 * 3 * CHUNK);
        }
    }
}

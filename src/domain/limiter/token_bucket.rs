//! `token_bucket { capacity, refill, period }`: starts full and adds `refill`
//! tokens at every whole multiple of `period` on the engine's clock (K4).

use crate::domain::Millis;

/// Tokens, as of the last refill tick counted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenBucket {
    tokens: u32,
    /// The index of the last tick counted: ticks happen at `tick * period`.
    tick: u64,
}

impl TokenBucket {
    /// A full bucket at `now`.
    pub fn new(capacity: u32, period: Millis, now: Millis) -> Self {
        TokenBucket {
            tokens: capacity,
            tick: now / period,
        }
    }

    fn tokens_at(&self, capacity: u32, refill: u32, period: Millis, now: Millis) -> u32 {
        let ticks = (now / period).saturating_sub(self.tick);
        let added = ticks.saturating_mul(u64::from(refill));
        u64::from(self.tokens)
            .saturating_add(added)
            .min(u64::from(capacity)) as u32
    }

    /// Tokens at `now`.
    pub fn available(&self, capacity: u32, refill: u32, period: Millis, now: Millis) -> u32 {
        self.tokens_at(capacity, refill, period, now)
    }

    /// Spends `n` tokens at `now`.
    pub fn take(&mut self, capacity: u32, refill: u32, period: Millis, n: u32, now: Millis) {
        self.tokens = self
            .tokens_at(capacity, refill, period, now)
            .saturating_sub(n);
        self.tick = self.tick.max(now / period);
    }

    /// Moves to a new period at `now`, keeping the tokens there are.
    pub fn rebase(
        &mut self,
        capacity: u32,
        refill: u32,
        period: Millis,
        next: Millis,
        now: Millis,
    ) {
        self.tokens = self.tokens_at(capacity, refill, period, now);
        self.tick = now / next;
    }

    /// The tick at which `n` tokens (at most `capacity`) will be there.
    pub fn ready_at(
        &self,
        capacity: u32,
        refill: u32,
        period: Millis,
        n: u32,
        now: Millis,
    ) -> Millis {
        let have = self.tokens_at(capacity, refill, period, now);
        let need = u64::from(n.saturating_sub(have));
        let ticks = need.div_ceil(u64::from(refill));
        (now / period + ticks).saturating_mul(period)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refills_on_aligned_ticks_up_to_capacity() {
        let mut t = TokenBucket::new(4, 100, 50);
        t.take(4, 2, 100, 4, 50);
        assert_eq!(t.available(4, 2, 100, 99), 0);
        assert_eq!(t.available(4, 2, 100, 100), 2);
        assert_eq!(t.available(4, 2, 100, 250), 4);
        assert_eq!(t.ready_at(4, 2, 100, 3, 60), 200);
    }
}

//! `token_bucket { capacity, refill, period }`: starts full and adds `refill`
//! tokens at every whole multiple of `period` on the engine's clock (K4).

use std::num::{NonZeroU32, NonZeroU64};

use super::Algorithm;
use crate::policy::LimiterKind;
use crate::Millis;

/// The settings of `token_bucket`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenBucketSettings {
    /// The most tokens the bucket holds (the limit).
    pub capacity: NonZeroU32,
    /// Tokens added per period, at most `capacity`.
    pub refill: NonZeroU32,
    /// The refill period in ms.
    pub period: NonZeroU64,
}

/// Tokens, as of the last refill tick counted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenBucket {
    pub(crate) tokens: u32,
    /// The index of the last tick counted: ticks happen at `tick * period`.
    pub(crate) tick: u64,
}

impl TokenBucket {
    fn tokens_at(&self, s: &TokenBucketSettings, now: Millis) -> u32 {
        let ticks = (now / s.period.get()).saturating_sub(self.tick);
        let added = ticks.saturating_mul(u64::from(s.refill.get()));
        u64::from(self.tokens)
            .saturating_add(added)
            .min(u64::from(s.capacity.get())) as u32
    }
}

impl Algorithm for TokenBucket {
    type Settings = TokenBucketSettings;

    fn settings(kind: &LimiterKind) -> Option<TokenBucketSettings> {
        let LimiterKind::TokenBucket {
            capacity,
            refill,
            period,
        } = *kind
        else {
            return None;
        };
        Some(TokenBucketSettings {
            capacity,
            refill,
            period,
        })
    }

    /// A full bucket at `now`.
    fn full(s: &TokenBucketSettings, now: Millis) -> Self {
        TokenBucket {
            tokens: s.capacity.get(),
            tick: now / s.period.get(),
        }
    }

    fn limit(s: &TokenBucketSettings) -> u32 {
        s.capacity.get()
    }

    fn available(&self, s: &TokenBucketSettings, now: Millis) -> u32 {
        self.tokens_at(s, now)
    }

    /// Spends `n` tokens at `now`.
    fn take(&mut self, s: &TokenBucketSettings, n: u32, now: Millis) {
        self.tokens = self.tokens_at(s, now).saturating_sub(n);
        self.tick = self.tick.max(now / s.period.get());
    }

    /// The tick at which `n` tokens (at most `capacity`) will be there.
    fn ready_at(&self, s: &TokenBucketSettings, n: u32, now: Millis) -> Option<Millis> {
        let have = self.tokens_at(s, now);
        let need = u64::from(n.saturating_sub(have));
        let ticks = need.div_ceil(u64::from(s.refill.get()));
        Some((now / s.period.get() + ticks).saturating_mul(s.period.get()))
    }

    /// Keeps the tokens there are at `now`; a new period's ticks count from
    /// `now`. With the same period nothing changes: a lower capacity caps
    /// the tokens as they are read.
    fn rebase(&mut self, old: &TokenBucketSettings, new: &TokenBucketSettings, now: Millis) {
        if old.period != new.period {
            self.tokens = self.tokens_at(old, now);
            self.tick = now / new.period.get();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refills_on_aligned_ticks_up_to_capacity() {
        let s = TokenBucketSettings {
            capacity: NonZeroU32::new(4).expect("non-zero"),
            refill: NonZeroU32::new(2).expect("non-zero"),
            period: NonZeroU64::new(100).expect("non-zero"),
        };
        let mut t = TokenBucket::full(&s, 50);
        t.take(&s, 4, 50);
        assert_eq!(t.available(&s, 99), 0);
        assert_eq!(t.available(&s, 100), 2);
        assert_eq!(t.available(&s, 250), 4);
        assert_eq!(t.ready_at(&s, 3, 60), Some(200));
    }
}

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

/// Tokens, as of the last refill tick counted: between `-capacity` and
/// `capacity`, below 0 only when calls cost more than they took (U1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenBucket {
    pub(crate) tokens: i64,
    /// The index of the last tick counted: ticks happen at `tick * period`.
    pub(crate) tick: u64,
}

impl TokenBucket {
    /// Tokens at `now`, refilled, within `[-capacity, capacity]`.
    fn tokens_at(&self, s: &TokenBucketSettings, now: Millis) -> i64 {
        let ticks = (now / s.period.get()).saturating_sub(self.tick);
        let added = ticks.saturating_mul(u64::from(s.refill.get()));
        let capacity = i64::from(s.capacity.get());
        self.tokens
            .saturating_add(i64::try_from(added).unwrap_or(i64::MAX))
            .clamp(-capacity, capacity)
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
            tokens: i64::from(s.capacity.get()),
            tick: now / s.period.get(),
        }
    }

    fn limit(s: &TokenBucketSettings) -> u32 {
        s.capacity.get()
    }

    /// `max(0, tokens)` (U1).
    fn available(&self, s: &TokenBucketSettings, now: Millis) -> u32 {
        self.tokens_at(s, now).max(0) as u32
    }

    /// Spends `n` tokens at `now`.
    fn take(&mut self, s: &TokenBucketSettings, n: u32, now: Millis) {
        self.tokens = (self.tokens_at(s, now) - i64::from(n)).max(0);
        self.tick = self.tick.max(now / s.period.get());
    }

    /// The tick at which `n` tokens (at most `capacity`) will be there.
    fn ready_at(&self, s: &TokenBucketSettings, n: u32, now: Millis) -> Option<Millis> {
        let have = self.tokens_at(s, now);
        let need = (i64::from(n) - have).max(0) as u64;
        let ticks = need.div_ceil(u64::from(s.refill.get()));
        Some((now / s.period.get() + ticks).saturating_mul(s.period.get()))
    }

    /// Spends `diff` more tokens (gives back `-diff`) at `now`, the tokens
    /// kept within `[-capacity, capacity]` (U1).
    fn settle(&mut self, s: &TokenBucketSettings, _: Millis, diff: i64, now: Millis) {
        let capacity = i64::from(s.capacity.get());
        self.tokens = self
            .tokens_at(s, now)
            .saturating_sub(diff)
            .clamp(-capacity, capacity);
        self.tick = self.tick.max(now / s.period.get());
    }

    fn same_shape(a: &TokenBucketSettings, b: &TokenBucketSettings) -> bool {
        a.period == b.period
    }

    /// Keeps the tokens there are at `now` under the old settings: the
    /// refills earned before the change count under the old capacity and
    /// refill (P1, Y4), and the new ones count from `now`'s tick. A lower
    /// capacity caps the tokens as they are read.
    fn rebase(&mut self, old: &TokenBucketSettings, new: &TokenBucketSettings, now: Millis) {
        self.tokens = self.tokens_at(old, now);
        self.tick = now / new.period.get();
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

    /// Y4: the refills earned before a change count under the old
    /// capacity and refill; the new ones from the change on.
    #[test]
    fn refills_before_a_change_count_under_the_old_settings() {
        let bucket = |capacity, refill| TokenBucketSettings {
            capacity: NonZeroU32::new(capacity).expect("non-zero"),
            refill: NonZeroU32::new(refill).expect("non-zero"),
            period: NonZeroU64::new(100).expect("non-zero"),
        };
        let (old, raised) = (bucket(2, 2), bucket(4, 2));
        let mut t = TokenBucket::full(&old, 0);
        t.take(&old, 2, 0);
        t.rebase(&old, &raised, 1000);
        assert_eq!(t.available(&raised, 1000), 2, "full under the old capacity");
        assert_eq!(t.ready_at(&raised, 3, 1000), Some(1100));
        assert_eq!(t.available(&raised, 1100), 4);
        let mut t = TokenBucket::full(&old, 0);
        t.take(&old, 2, 0);
        t.rebase(&old, &bucket(2, 1), 50);
        assert_eq!(
            t.available(&bucket(2, 1), 100),
            1,
            "the new refill from the change"
        );
    }

    #[test]
    fn a_cost_above_the_tokens_goes_below_zero_down_to_minus_capacity() {
        let s = TokenBucketSettings {
            capacity: NonZeroU32::new(4).expect("non-zero"),
            refill: NonZeroU32::new(2).expect("non-zero"),
            period: NonZeroU64::new(100).expect("non-zero"),
        };
        let mut t = TokenBucket::full(&s, 0);
        t.take(&s, 1, 0);
        t.settle(&s, 0, 2, 10);
        assert_eq!((t.tokens, t.available(&s, 10)), (1, 1));
        t.settle(&s, 0, 100, 20);
        assert_eq!(t.tokens, -4, "clipped at -capacity");
        assert_eq!(t.available(&s, 20), 0);
        assert_eq!(t.ready_at(&s, 1, 20), Some(300));
        assert_eq!(t.available(&s, 300), 2);
        t.settle(&s, 0, -100, 300);
        assert_eq!(t.tokens, 4, "clipped at capacity");
    }
}

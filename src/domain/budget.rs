//! The retry budget of SPEC section 10 (R1-R3): retries may be at most a
//! share of first attempts over a window, and never fewer than a floor a
//! second.
//!
//! First attempts (`F`) and retries (`R`) are counted in ten segments of
//! `window / 10`, aligned to whole multiples of that length on the engine's
//! clock (K4); a segment's counts leave once ten later segments have begun.
//! A retry passes when `R + 1 <= max(floor(ratio * F),
//! floor(min_per_second * window / 1 s))`, the ratio taken to 6 decimals
//! and the product in integers (section 10, "Ratios").

use serde::{Deserialize, Serialize};

use crate::policy::RetryBudget;
use crate::Millis;

/// How many segments a budget's window is cut into.
pub const SEGMENTS: u64 = 10;

/// One segment's counts.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct BudgetSegment {
    /// The segment's index: it starts at `index * window / 10`.
    pub index: u64,
    /// First attempts counted in it.
    pub first: u64,
    /// Retries counted in it.
    pub retries: u64,
}

/// A key's retry-budget counts: its live segments, oldest first, at most
/// ten (a segment is made by the first count in it).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Budget {
    pub(crate) segments: Vec<BudgetSegment>,
}

impl RetryBudget {
    /// A segment's length in ms: a tenth of the window (a whole number,
    /// since the window is a multiple of 10 ms).
    pub fn segment_ms(&self) -> Millis {
        self.window.get() / SEGMENTS
    }

    /// The segment `now` falls in.
    fn segment_at(&self, now: Millis) -> u64 {
        now / self.segment_ms()
    }

    /// The retries allowed with `first` first attempts in the window:
    /// `max(floor(ratio * first), floor(min_per_second * window / 1 s))`.
    pub fn allowance(&self, first: u64) -> u64 {
        let by_ratio = u128::from(self.ratio_millionths) * u128::from(first) / 1_000_000;
        let floor = u128::from(self.min_per_second) * u128::from(self.window.get()) / 1_000;
        u64::try_from(by_ratio.max(floor)).unwrap_or(u64::MAX)
    }
}

impl Budget {
    /// The live segments at `now`: those that have not seen ten later
    /// segments begin.
    fn live<'s>(
        &'s self,
        policy: &RetryBudget,
        now: Millis,
    ) -> impl Iterator<Item = &'s BudgetSegment> + 's {
        let current = policy.segment_at(now);
        self.segments
            .iter()
            .filter(move |s| s.index + SEGMENTS > current)
    }

    /// First attempts and retries counted in the window at `now`.
    pub fn totals(&self, policy: &RetryBudget, now: Millis) -> (u64, u64) {
        self.live(policy, now).fold((0, 0), |(f, r), s| {
            (f.saturating_add(s.first), r.saturating_add(s.retries))
        })
    }

    /// True when one more retry would pass at `now` (R2).
    pub fn admits_retry(&self, policy: &RetryBudget, now: Millis) -> bool {
        let (first, retries) = self.totals(policy, now);
        retries.saturating_add(1) <= policy.allowance(first)
    }

    /// Counts a first attempt or a passed retry in the segment of `now`,
    /// dropping the segments that left the window.
    pub fn count(&mut self, policy: &RetryBudget, now: Millis, retry: bool) {
        self.prune(policy, now);
        let index = policy.segment_at(now);
        if self.segments.last().is_none_or(|s| s.index != index) {
            self.segments.push(BudgetSegment {
                index,
                ..BudgetSegment::default()
            });
        }
        let segment = self.segments.last_mut().expect("just made");
        if retry {
            segment.retries = segment.retries.saturating_add(1);
        } else {
            segment.first = segment.first.saturating_add(1);
        }
    }

    /// Drops the segments that left the window at `now`.
    pub fn prune(&mut self, policy: &RetryBudget, now: Millis) {
        let current = policy.segment_at(now);
        self.segments.retain(|s| s.index + SEGMENTS > current);
    }

    /// True when nothing is counted in the window at `now` (K2).
    pub fn is_empty_at(&self, policy: Option<&RetryBudget>, now: Millis) -> bool {
        policy.is_none_or(|p| self.live(p, now).next().is_none())
    }

    /// Forgets every count: the budget was added, removed, or its window
    /// changed (section 10, "Policy changes").
    pub fn clear(&mut self) {
        self.segments = Vec::new();
    }

    /// True when no segment is kept.
    pub fn is_empty(&self) -> bool {
        self.segments.is_empty()
    }

    /// The segments kept, oldest first.
    pub fn segments(&self) -> &[BudgetSegment] {
        &self.segments
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::num::NonZeroU64;

    fn budget(ratio_millionths: u64, min_per_second: u32, window: Millis) -> RetryBudget {
        RetryBudget {
            ratio_millionths,
            min_per_second,
            window: NonZeroU64::new(window).unwrap(),
        }
    }

    #[test]
    fn the_allowance_is_the_larger_of_the_ratio_and_the_floor_rounded_down() {
        let p = budget(200_000, 3, 10_000);
        assert_eq!(p.allowance(0), 30, "3 a second over 10 s");
        assert_eq!(p.allowance(149), 30);
        assert_eq!(p.allowance(159), 31, "floor(0.2 * 159) = 31");
        let no_floor = budget(100_000, 0, 1_000);
        assert_eq!(no_floor.allowance(9), 0);
        assert_eq!(no_floor.allowance(10), 1);
    }

    #[test]
    fn counts_leave_once_ten_later_segments_have_begun() {
        let p = budget(1_000_000, 0, 1_000);
        let mut b = Budget::default();
        b.count(&p, 50, false);
        assert_eq!(b.totals(&p, 999), (1, 0));
        assert!(b.admits_retry(&p, 999));
        // Segment 0 leaves when segment 10 begins, at 1000.
        assert_eq!(b.totals(&p, 1_000), (0, 0));
        assert!(!b.admits_retry(&p, 1_000));
        assert!(b.is_empty_at(Some(&p), 1_000));
        b.count(&p, 1_000, true);
        assert_eq!(b.segments().len(), 1, "the old segment was dropped");
    }
}

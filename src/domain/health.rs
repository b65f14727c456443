//! The sampling window of ratio mode: outcomes in buckets, each counted for
//! at least 9/10 and at most 10/10 of the window after it was recorded.
//!
//! Buckets are `window / 10` ms wide (rounded down, at least 1 ms) and
//! aligned to the clock's origin. An outcome recorded in the bucket that
//! starts at `s` counts while `now < s + window`, so it counts for between
//! `window - width + 1` and `window` ms: within the contract's bounds.
//! Buckets are kept by their start time, not their index, so that a changed
//! window (Y4) ages old outcomes by their own time.

use std::collections::VecDeque;

use super::Millis;

/// Success and failure counts over a sliding sampling window.
///
/// Empty, it costs one pointer and no allocation: most keys are not in
/// ratio mode, and a ratio-mode key at rest has nothing in its window.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HealthWindow {
    /// `(bucket start, successes, failures)`, oldest first; at most 21
    /// entries for one window length. `None` when empty, never `Some` of an
    /// empty queue.
    #[allow(
        clippy::box_collection,
        reason = "one word inline instead of four for every key; the second \
                  allocation is paid only by ratio-mode keys with outcomes in the window"
    )]
    pub(crate) buckets: Option<Box<VecDeque<(Millis, u32, u32)>>>,
    /// `(bucket start, slow outcomes)` of the buckets that hold a slow
    /// outcome (S1), oldest first; `None` when there is none. Kept apart
    /// from `buckets` so that a window without slow calls pays nothing.
    #[allow(
        clippy::box_collection,
        reason = "one word inline; only keys with slow outcomes in the window pay more"
    )]
    pub(crate) slow: Option<Box<VecDeque<(Millis, u32)>>>,
}

fn width(window: Millis) -> Millis {
    (window / 10).max(1)
}

impl HealthWindow {
    /// The start of the bucket `now` falls in.
    pub fn bucket_of(now: Millis, window: Millis) -> Millis {
        let w = width(window);
        now / w * w
    }

    /// Records one outcome at `now`.
    pub fn record(&mut self, now: Millis, window: Millis, failed: bool) {
        self.prune(now, window);
        let start = Self::bucket_of(now, window);
        let buckets = self.buckets.get_or_insert_with(Default::default);
        match buckets.back_mut() {
            Some((i, s, f)) if *i == start => {
                if failed {
                    *f = f.saturating_add(1);
                } else {
                    *s = s.saturating_add(1);
                }
            }
            _ => buckets.push_back((start, u32::from(!failed), u32::from(failed))),
        }
    }

    /// Marks the outcome just recorded at `now` as slow too (S1).
    pub fn record_slow(&mut self, now: Millis, window: Millis) {
        let w = width(window);
        let start = now / w * w;
        let slow = self.slow.get_or_insert_with(Default::default);
        match slow.back_mut() {
            Some((i, n)) if *i == start => *n = n.saturating_add(1),
            _ => slow.push_back((start, 1)),
        }
    }

    /// Slow outcomes that count at `now`.
    pub fn slow_total(&self, now: Millis, window: Millis) -> u64 {
        self.slow
            .iter()
            .flat_map(|b| b.iter())
            .filter(|(start, _)| start + window > now)
            .map(|&(_, n)| u64::from(n))
            .sum()
    }

    /// Drops buckets that no longer count at `now`.
    pub fn prune(&mut self, now: Millis, window: Millis) {
        if let Some(slow) = self.slow.as_mut() {
            while slow
                .front()
                .is_some_and(|&(start, _)| start + window <= now)
            {
                slow.pop_front();
            }
            if slow.is_empty() {
                self.slow = None;
            }
        }
        let Some(buckets) = self.buckets.as_mut() else {
            return;
        };
        while let Some(&(start, _, _)) = buckets.front() {
            if start + window <= now {
                buckets.pop_front();
            } else {
                break;
            }
        }
        if buckets.is_empty() {
            self.buckets = None;
        }
    }

    /// `(outcomes, failures)` that count at `now`.
    pub fn totals(&self, now: Millis, window: Millis) -> (u64, u64) {
        self.buckets
            .iter()
            .flat_map(|b| b.iter())
            .filter(|(start, _, _)| start + window > now)
            .fold((0, 0), |(n, f), &(_, s, fl)| {
                (n + u64::from(s) + u64::from(fl), f + u64::from(fl))
            })
    }

    /// Forgets every outcome.
    pub fn clear(&mut self) {
        self.buckets = None;
        self.slow = None;
    }

    /// True when the window holds an allocation (it has buckets).
    pub fn is_allocated(&self) -> bool {
        self.buckets.is_some() || self.slow.is_some()
    }

    /// True when no outcome counts at `now`.
    pub fn is_empty_at(&self, now: Millis, window: Millis) -> bool {
        self.totals(now, window).0 == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outcome_counts_for_nine_to_ten_tenths_of_the_window() {
        for window in [10, 15, 19, 100, 1000, 1234] {
            for at in 0..(3 * window) {
                let mut h = HealthWindow::default();
                h.record(at, window, true);
                let mut last_counted = at;
                while h.totals(last_counted + 1, window).0 == 1 {
                    last_counted += 1;
                }
                let counted_for = last_counted + 1 - at;
                assert!(
                    counted_for * 10 >= window * 9 && counted_for <= window,
                    "window {window} at {at}: counted for {counted_for}"
                );
            }
        }
    }

    #[test]
    fn totals_add_successes_and_failures_and_prune_forgets_old_buckets() {
        let mut h = HealthWindow::default();
        h.record(0, 1000, false);
        h.record(0, 1000, true);
        h.record(150, 1000, true);
        assert_eq!(h.totals(150, 1000), (3, 2));
        assert_eq!(h.totals(1000, 1000), (1, 1));
        h.prune(1100, 1000);
        assert!(h.is_empty_at(1100, 1000));
        assert!(!h.is_allocated(), "an empty window frees its buckets");
    }

    #[test]
    fn slow_outcomes_age_out_with_their_bucket() {
        let mut h = HealthWindow::default();
        h.record(0, 1000, false);
        h.record_slow(0, 1000);
        h.record(150, 1000, true);
        h.record_slow(150, 1000);
        h.record_slow(150, 1000);
        assert_eq!(h.slow_total(150, 1000), 3);
        assert_eq!(h.slow_total(1000, 1000), 2);
        h.prune(1100, 1000);
        assert_eq!(h.slow_total(1100, 1000), 0);
        assert!(!h.is_allocated());
    }
}

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
    /// The buckets, oldest first; at most 21 for one window length. `None`
    /// when empty, never `Some` of an empty queue.
    #[allow(
        clippy::box_collection,
        reason = "one word inline instead of four for every key; the second \
                  allocation is paid only by ratio-mode keys with outcomes in the window"
    )]
    buckets: Option<Box<VecDeque<Bucket>>>,
}

/// One bucket of the window: what was recorded from its start on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bucket {
    /// When the bucket starts.
    pub start: Millis,
    /// Successes recorded in it.
    pub successes: u32,
    /// Failures recorded in it.
    pub failures: u32,
    /// Of those outcomes, the slow ones (S1).
    pub slow: u32,
}

fn width(window: Millis) -> Millis {
    (window / 10).max(1)
}

impl HealthWindow {
    /// A window holding `buckets`, oldest first (each with an outcome).
    pub fn of(buckets: impl IntoIterator<Item = Bucket>) -> Self {
        let buckets: VecDeque<Bucket> = buckets.into_iter().collect();
        HealthWindow {
            buckets: (!buckets.is_empty()).then(|| Box::new(buckets)),
        }
    }

    /// The buckets, oldest first.
    pub fn buckets(&self) -> impl Iterator<Item = &Bucket> {
        self.buckets.iter().flat_map(|b| b.iter())
    }

    /// The start of the bucket `now` falls in.
    pub fn bucket_of(now: Millis, window: Millis) -> Millis {
        let w = width(window);
        now / w * w
    }

    /// Records one outcome at `now`, slow (S1) or not.
    pub fn record(&mut self, now: Millis, window: Millis, failed: bool, slow: bool) {
        self.prune(now, window);
        let start = Self::bucket_of(now, window);
        let buckets = self.buckets.get_or_insert_with(Default::default);
        let bucket = match buckets.back_mut() {
            Some(b) if b.start == start => b,
            _ => {
                buckets.push_back(Bucket {
                    start,
                    successes: 0,
                    failures: 0,
                    slow: 0,
                });
                buckets.back_mut().expect("just pushed")
            }
        };
        if failed {
            bucket.failures = bucket.failures.saturating_add(1);
        } else {
            bucket.successes = bucket.successes.saturating_add(1);
        }
        if slow {
            bucket.slow = bucket.slow.saturating_add(1);
        }
    }

    /// The buckets that count at `now`.
    fn counting(&self, now: Millis, window: Millis) -> impl Iterator<Item = &Bucket> {
        self.buckets().filter(move |b| b.start + window > now)
    }

    /// Slow outcomes that count at `now`.
    pub fn slow_total(&self, now: Millis, window: Millis) -> u64 {
        self.counting(now, window).map(|b| u64::from(b.slow)).sum()
    }

    /// Drops buckets that no longer count at `now`.
    pub fn prune(&mut self, now: Millis, window: Millis) {
        let Some(buckets) = self.buckets.as_mut() else {
            return;
        };
        while buckets.front().is_some_and(|b| b.start + window <= now) {
            buckets.pop_front();
        }
        if buckets.is_empty() {
            self.buckets = None;
        }
    }

    /// `(outcomes, failures)` that count at `now`.
    pub fn totals(&self, now: Millis, window: Millis) -> (u64, u64) {
        self.counting(now, window).fold((0, 0), |(n, f), b| {
            (
                n + u64::from(b.successes) + u64::from(b.failures),
                f + u64::from(b.failures),
            )
        })
    }

    /// Forgets every outcome.
    pub fn clear(&mut self) {
        self.buckets = None;
    }

    /// True when the window holds an allocation (it has buckets).
    pub fn is_allocated(&self) -> bool {
        self.buckets.is_some()
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
                h.record(at, window, true, false);
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
        h.record(0, 1000, false, false);
        h.record(0, 1000, true, false);
        h.record(150, 1000, true, false);
        assert_eq!(h.totals(150, 1000), (3, 2));
        assert_eq!(h.totals(1000, 1000), (1, 1));
        h.prune(1100, 1000);
        assert!(h.is_empty_at(1100, 1000));
        assert!(!h.is_allocated(), "an empty window frees its buckets");
    }

    #[test]
    fn slow_outcomes_age_out_with_their_bucket() {
        let mut h = HealthWindow::default();
        h.record(0, 1000, false, true);
        h.record(150, 1000, true, true);
        h.record(150, 1000, false, true);
        assert_eq!(h.slow_total(150, 1000), 3);
        assert_eq!(h.totals(150, 1000), (3, 1));
        assert_eq!(h.slow_total(1000, 1000), 2);
        h.prune(1100, 1000);
        assert_eq!(h.slow_total(1100, 1000), 0);
        assert!(!h.is_allocated());
    }
}

//! `sliding_window { permits, window, segments }`: the window is cut into
//! `segments` aligned segments; permits taken in a segment count until
//! `segments` later segments have begun.

use std::collections::VecDeque;
use std::num::{NonZeroU32, NonZeroU64};

use super::Algorithm;
use crate::policy::LimiterKind;
use crate::Millis;

/// The settings of `sliding_window`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlidingWindowSettings {
    /// The limit per window.
    pub permits: NonZeroU32,
    /// How many segments the window is cut into.
    pub segments: NonZeroU32,
    /// The window length in ms, a multiple of `segments`.
    pub window: NonZeroU64,
}

impl SlidingWindowSettings {
    fn segment_length(&self) -> Millis {
        (self.window.get() / u64::from(self.segments.get())).max(1)
    }
}

/// Permits taken per segment, oldest first; at most `segments` entries
/// count. A segment's count is between 0 and `2 * permits`, above `permits`
/// only when calls cost more than they took (U1).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SlidingWindow {
    pub(crate) taken: VecDeque<(u64, u64)>,
}

impl SlidingWindow {
    /// Drops the segments that left the window at segment `current`.
    fn forget_before(&mut self, s: &SlidingWindowSettings, current: u64) {
        let segments = u64::from(s.segments.get());
        while let Some(&(index, _)) = self.taken.front() {
            if index + segments <= current {
                self.taken.pop_front();
            } else {
                break;
            }
        }
    }

    /// Segments still in the window at `now`, oldest first.
    fn counting(
        &self,
        s: &SlidingWindowSettings,
        now: Millis,
    ) -> impl Iterator<Item = &(u64, u64)> {
        let current = now / s.segment_length();
        let segments = u64::from(s.segments.get());
        self.taken
            .iter()
            .filter(move |(index, _)| index + segments > current)
    }
}

impl Algorithm for SlidingWindow {
    type Settings = SlidingWindowSettings;

    fn settings(kind: &LimiterKind) -> Option<SlidingWindowSettings> {
        let LimiterKind::SlidingWindow {
            permits,
            window,
            segments,
        } = *kind
        else {
            return None;
        };
        Some(SlidingWindowSettings {
            permits,
            segments,
            window,
        })
    }

    fn full(_: &SlidingWindowSettings, _: Millis) -> Self {
        SlidingWindow::default()
    }

    fn limit(s: &SlidingWindowSettings) -> u32 {
        s.permits.get()
    }

    /// `max(0, permits - count)` (U1).
    fn available(&self, s: &SlidingWindowSettings, now: Millis) -> u32 {
        let used: u64 = self.counting(s, now).map(|&(_, n)| n).sum();
        u64::from(s.permits.get()).saturating_sub(used) as u32
    }

    /// Takes `n` permits in the segment of `now`.
    fn take(&mut self, s: &SlidingWindowSettings, n: u32, now: Millis) {
        let current = now / s.segment_length();
        self.forget_before(s, current);
        match self.taken.back_mut() {
            Some((index, count)) if *index == current => {
                *count = count.saturating_add(u64::from(n))
            }
            _ => self.taken.push_back((current, u64::from(n))),
        }
    }

    /// Into the segment the permits were taken in while it is inside the
    /// window, else (only when positive) into the current one; a segment's
    /// count kept within `[0, 2 * permits]` (U1).
    fn settle(&mut self, s: &SlidingWindowSettings, taken_at: Millis, diff: i64, now: Millis) {
        let length = s.segment_length();
        let current = now / length;
        let mut target = taken_at / length;
        if target + u64::from(s.segments.get()) <= current {
            if diff < 0 {
                return;
            }
            target = current;
        }
        self.forget_before(s, current);
        let bound = 2 * i64::from(s.permits.get());
        let at = self.taken.partition_point(|&(index, _)| index < target);
        let count = match self.taken.get(at) {
            Some(&(index, count)) if index == target => count,
            _ => {
                self.taken.insert(at, (target, 0));
                0
            }
        };
        let settled = i64::try_from(count)
            .unwrap_or(bound)
            .saturating_add(diff)
            .clamp(0, bound) as u64;
        if settled == 0 {
            self.taken.remove(at);
        } else {
            self.taken[at].1 = settled;
        }
    }

    fn same_shape(a: &SlidingWindowSettings, b: &SlidingWindowSettings) -> bool {
        (a.window, a.segments) == (b.window, b.segments)
    }

    /// When the oldest segments leave the window and free enough for `n`.
    fn ready_at(&self, s: &SlidingWindowSettings, n: u32, now: Millis) -> Option<Millis> {
        let length = s.segment_length();
        let segments = u64::from(s.segments.get());
        let used: u64 = self.counting(s, now).map(|&(_, n)| n).sum();
        // Below 0 while the segments count more than the limit (U1).
        let mut free = i128::from(s.permits.get()) - i128::from(used);
        for &(index, count) in self.counting(s, now) {
            free += i128::from(count);
            if free >= i128::from(n) {
                return Some((index + segments).saturating_mul(length));
            }
        }
        None
    }

    /// Counts kept in segments of another length cannot be mapped: a changed
    /// window or segment count starts afresh, full.
    fn rebase(&mut self, old: &SlidingWindowSettings, new: &SlidingWindowSettings, now: Millis) {
        if (old.window, old.segments) != (new.window, new.segments) {
            *self = SlidingWindow::full(new, now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permits_come_back_when_their_segment_leaves_the_window() {
        let s = SlidingWindowSettings {
            permits: NonZeroU32::new(4).expect("non-zero"),
            segments: NonZeroU32::new(4).expect("non-zero"),
            window: NonZeroU64::new(1000).expect("non-zero"),
        };
        let mut w = SlidingWindow::default();
        w.take(&s, 3, 0);
        w.take(&s, 1, 300);
        assert_eq!(w.available(&s, 999), 0);
        assert_eq!(w.ready_at(&s, 1, 400), Some(1000));
        assert_eq!(w.ready_at(&s, 4, 400), Some(1250));
        assert_eq!(w.available(&s, 1000), 3);
        assert_eq!(w.available(&s, 1250), 4);
    }

    #[test]
    fn a_cost_goes_to_its_segment_while_it_counts_else_when_positive_to_the_current_one() {
        let s = SlidingWindowSettings {
            permits: NonZeroU32::new(4).expect("non-zero"),
            segments: NonZeroU32::new(4).expect("non-zero"),
            window: NonZeroU64::new(1000).expect("non-zero"),
        };
        let mut w = SlidingWindow::default();
        w.take(&s, 1, 0);
        w.take(&s, 1, 300);
        w.settle(&s, 0, 20, 400);
        assert_eq!(
            Vec::from(w.taken.clone()),
            vec![(0, 8), (1, 1)],
            "clipped at 2 * permits"
        );
        assert_eq!(w.available(&s, 400), 0);
        assert_eq!(
            w.ready_at(&s, 4, 400),
            Some(1250),
            "one segment is not enough"
        );
        w.settle(&s, 300, -1, 500);
        assert_eq!(
            Vec::from(w.taken.clone()),
            vec![(0, 8)],
            "an emptied segment goes"
        );
        w.settle(&s, 0, -1, 1000);
        assert_eq!(
            w.available(&s, 1000),
            4,
            "a refund for a segment gone is dropped"
        );
        w.settle(&s, 0, 3, 1000);
        assert_eq!(
            Vec::from(w.taken.clone()),
            vec![(4, 3)],
            "a charge for it lands now"
        );
    }
}

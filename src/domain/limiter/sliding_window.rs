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

/// Permits taken per segment, oldest first; at most `segments` entries count.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SlidingWindow {
    pub(crate) taken: VecDeque<(u64, u32)>,
}

impl SlidingWindow {
    /// Segments still in the window at `now`, oldest first.
    fn counting(
        &self,
        s: &SlidingWindowSettings,
        now: Millis,
    ) -> impl Iterator<Item = &(u64, u32)> {
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

    fn available(&self, s: &SlidingWindowSettings, now: Millis) -> u32 {
        let used: u64 = self.counting(s, now).map(|&(_, n)| u64::from(n)).sum();
        u64::from(s.permits.get()).saturating_sub(used) as u32
    }

    /// Takes `n` permits in the segment of `now`.
    fn take(&mut self, s: &SlidingWindowSettings, n: u32, now: Millis) {
        let current = now / s.segment_length();
        let segments = u64::from(s.segments.get());
        while let Some(&(index, _)) = self.taken.front() {
            if index + segments <= current {
                self.taken.pop_front();
            } else {
                break;
            }
        }
        match self.taken.back_mut() {
            Some((index, count)) if *index == current => *count = count.saturating_add(n),
            _ => self.taken.push_back((current, n)),
        }
    }

    /// When the oldest segments leave the window and free enough for `n`.
    fn ready_at(&self, s: &SlidingWindowSettings, n: u32, now: Millis) -> Option<Millis> {
        let length = s.segment_length();
        let segments = u64::from(s.segments.get());
        let mut free = u64::from(self.available(s, now));
        for &(index, count) in self.counting(s, now) {
            free += u64::from(count);
            if free >= u64::from(n) {
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
}

//! `sliding_window { permits, window, segments }`: the window is cut into
//! `segments` aligned segments; permits taken in a segment count until
//! `segments` later segments have begun.

use std::collections::VecDeque;

use crate::domain::Millis;

/// Permits taken per segment, oldest first; at most `segments` entries count.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SlidingWindow {
    taken: VecDeque<(u64, u32)>,
}

fn segment_length(window: Millis, segments: u32) -> Millis {
    (window / u64::from(segments)).max(1)
}

impl SlidingWindow {
    /// Segments still in the window at `now`, oldest first.
    fn counting(
        &self,
        window: Millis,
        segments: u32,
        now: Millis,
    ) -> impl Iterator<Item = &(u64, u32)> {
        let current = now / segment_length(window, segments);
        self.taken
            .iter()
            .filter(move |(index, _)| index + u64::from(segments) > current)
    }

    /// Permits free at `now`.
    pub fn available(&self, permits: u32, window: Millis, segments: u32, now: Millis) -> u32 {
        let used: u64 = self
            .counting(window, segments, now)
            .map(|&(_, n)| u64::from(n))
            .sum();
        u64::from(permits).saturating_sub(used) as u32
    }

    /// Takes `n` permits in the segment of `now`.
    pub fn take(&mut self, window: Millis, segments: u32, n: u32, now: Millis) {
        let current = now / segment_length(window, segments);
        while let Some(&(index, _)) = self.taken.front() {
            if index + u64::from(segments) <= current {
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
    pub fn ready_at(
        &self,
        permits: u32,
        window: Millis,
        segments: u32,
        n: u32,
        now: Millis,
    ) -> Option<Millis> {
        let length = segment_length(window, segments);
        let mut free = u64::from(self.available(permits, window, segments, now));
        for &(index, count) in self.counting(window, segments, now) {
            free += u64::from(count);
            if free >= u64::from(n) {
                return Some((index + u64::from(segments)).saturating_mul(length));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permits_come_back_when_their_segment_leaves_the_window() {
        let mut s = SlidingWindow::default();
        s.take(1000, 4, 3, 0);
        s.take(1000, 4, 1, 300);
        assert_eq!(s.available(4, 1000, 4, 999), 0);
        assert_eq!(s.ready_at(4, 1000, 4, 1, 400), Some(1000));
        assert_eq!(s.ready_at(4, 1000, 4, 4, 400), Some(1250));
        assert_eq!(s.available(4, 1000, 4, 1000), 3);
        assert_eq!(s.available(4, 1000, 4, 1250), 4);
    }
}

//! `fixed_window { permits, window }`: at most `permits` per window, windows
//! aligned to whole multiples of `window` (K4).

use std::num::{NonZeroU32, NonZeroU64};

use super::Algorithm;
use crate::policy::LimiterKind;
use crate::Millis;

/// The settings of `fixed_window`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FixedWindowSettings {
    /// The limit per window.
    pub permits: NonZeroU32,
    /// The window length in ms.
    pub window: NonZeroU64,
}

/// Permits used in one window: between 0 and `2 * permits`, above
/// `permits` only when calls cost more than they took (U1).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FixedWindow {
    pub(crate) index: u64,
    pub(crate) used: u64,
}

impl FixedWindow {
    fn used_at(&self, window: Millis, now: Millis) -> u64 {
        if now / window == self.index {
            self.used
        } else {
            0
        }
    }
}

impl Algorithm for FixedWindow {
    type Settings = FixedWindowSettings;

    fn settings(kind: &LimiterKind) -> Option<FixedWindowSettings> {
        let LimiterKind::FixedWindow { permits, window } = *kind else {
            return None;
        };
        Some(FixedWindowSettings { permits, window })
    }

    fn full(_: &FixedWindowSettings, _: Millis) -> Self {
        FixedWindow::default()
    }

    fn limit(s: &FixedWindowSettings) -> u32 {
        s.permits.get()
    }

    /// `max(0, permits - used)` (U1).
    fn available(&self, s: &FixedWindowSettings, now: Millis) -> u32 {
        u64::from(s.permits.get()).saturating_sub(self.used_at(s.window.get(), now)) as u32
    }

    fn take(&mut self, s: &FixedWindowSettings, n: u32, now: Millis) {
        self.used = self
            .used_at(s.window.get(), now)
            .saturating_add(u64::from(n));
        self.index = now / s.window.get();
    }

    /// Into the window the permits were taken in while it lasts, else
    /// (only when positive) into the current one; the count kept within
    /// `[0, 2 * permits]` (U1).
    fn settle(&mut self, s: &FixedWindowSettings, taken_at: Millis, diff: i64, now: Millis) {
        let window = s.window.get();
        if taken_at / window != now / window && diff < 0 {
            return;
        }
        let bound = 2 * i64::from(s.permits.get());
        let used = i64::try_from(self.used_at(window, now)).unwrap_or(bound);
        self.used = used.saturating_add(diff).clamp(0, bound) as u64;
        self.index = now / window;
    }

    fn same_shape(a: &FixedWindowSettings, b: &FixedWindowSettings) -> bool {
        a.window == b.window
    }

    /// The start of the next window: every permit is free then.
    fn ready_at(&self, s: &FixedWindowSettings, _: u32, now: Millis) -> Option<Millis> {
        let window = s.window.get();
        Some((now / window + 1).saturating_mul(window))
    }

    /// Counts kept in windows of another length cannot be mapped: a changed
    /// window starts afresh, full.
    fn rebase(&mut self, old: &FixedWindowSettings, new: &FixedWindowSettings, now: Millis) {
        if old.window != new.window {
            *self = FixedWindow::full(new, now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_window_frees_every_permit() {
        let s = FixedWindowSettings {
            permits: NonZeroU32::new(3).expect("non-zero"),
            window: NonZeroU64::new(1000).expect("non-zero"),
        };
        let mut f = FixedWindow::default();
        f.take(&s, 3, 999);
        assert_eq!(f.available(&s, 999), 0);
        assert_eq!(f.ready_at(&s, 1, 999), Some(1000));
        assert_eq!(f.available(&s, 1000), 3);
    }

    #[test]
    fn a_cost_goes_to_its_window_or_when_positive_to_the_current_one() {
        let s = FixedWindowSettings {
            permits: NonZeroU32::new(3).expect("non-zero"),
            window: NonZeroU64::new(1000).expect("non-zero"),
        };
        let mut f = FixedWindow::default();
        f.take(&s, 1, 10);
        f.settle(&s, 10, 10, 20);
        assert_eq!(
            (f.used, f.available(&s, 20)),
            (6, 0),
            "clipped at 2 * permits"
        );
        f.settle(&s, 10, -2, 30);
        assert_eq!(f.used, 4);
        f.settle(&s, 10, -1, 1000);
        assert_eq!(
            f.available(&s, 1000),
            3,
            "a refund for a past window is dropped"
        );
        f.settle(&s, 10, 2, 1500);
        assert_eq!(
            (f.index, f.used),
            (1, 2),
            "a charge for a past window lands now"
        );
    }
}

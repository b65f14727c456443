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

/// Permits used in one window.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FixedWindow {
    pub(crate) index: u64,
    pub(crate) used: u32,
}

impl FixedWindow {
    fn used_at(&self, window: Millis, now: Millis) -> u32 {
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

    fn available(&self, s: &FixedWindowSettings, now: Millis) -> u32 {
        s.permits
            .get()
            .saturating_sub(self.used_at(s.window.get(), now))
    }

    fn take(&mut self, s: &FixedWindowSettings, n: u32, now: Millis) {
        self.used = self.used_at(s.window.get(), now).saturating_add(n);
        self.index = now / s.window.get();
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
}

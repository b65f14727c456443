//! `fixed_window { permits, window }`: at most `permits` per window, windows
//! aligned to whole multiples of `window` (K4).

use crate::domain::Millis;

/// Permits used in one window.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FixedWindow {
    index: u64,
    used: u32,
}

impl FixedWindow {
    fn used_at(&self, window: Millis, now: Millis) -> u32 {
        if now / window == self.index {
            self.used
        } else {
            0
        }
    }

    /// Permits free at `now`.
    pub fn available(&self, permits: u32, window: Millis, now: Millis) -> u32 {
        permits.saturating_sub(self.used_at(window, now))
    }

    /// Uses `n` permits at `now`.
    pub fn take(&mut self, window: Millis, n: u32, now: Millis) {
        self.used = self.used_at(window, now).saturating_add(n);
        self.index = now / window;
    }

    /// The start of the next window: every permit is free then.
    pub fn ready_at(&self, _permits: u32, window: Millis, now: Millis) -> Millis {
        (now / window + 1).saturating_mul(window)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_window_frees_every_permit() {
        let mut f = FixedWindow::default();
        f.take(1000, 3, 999);
        assert_eq!(f.available(3, 1000, 999), 0);
        assert_eq!(f.ready_at(3, 1000, 999), 1000);
        assert_eq!(f.available(3, 1000, 1000), 3);
    }
}

//! `concurrency { permits }`: at most `permits` held by live tickets.

use std::num::NonZeroU32;

use super::Algorithm;
use crate::policy::LimiterKind;
use crate::Millis;

/// The settings of `concurrency`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConcurrencySettings {
    /// The limit.
    pub permits: NonZeroU32,
}

/// Permits held by live tickets. Counting what is held, not what is free,
/// lets a lowered limit apply at once without losing a held permit (Y4).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Concurrency {
    pub(crate) held: u64,
}

impl Concurrency {
    /// Permits held now.
    pub fn held(&self) -> u64 {
        self.held
    }
}

impl Algorithm for Concurrency {
    type Settings = ConcurrencySettings;

    fn settings(kind: &LimiterKind) -> Option<ConcurrencySettings> {
        let LimiterKind::Concurrency { permits } = *kind else {
            return None;
        };
        Some(ConcurrencySettings { permits })
    }

    fn full(_: &ConcurrencySettings, _: Millis) -> Self {
        Concurrency::default()
    }

    fn limit(s: &ConcurrencySettings) -> u32 {
        s.permits.get()
    }

    fn available(&self, s: &ConcurrencySettings, _: Millis) -> u32 {
        u64::from(s.permits.get()).saturating_sub(self.held) as u32
    }

    fn take(&mut self, _: &ConcurrencySettings, n: u32, _: Millis) {
        self.held += u64::from(n);
    }

    /// Permits come back with tickets, at no time the algorithm can tell.
    fn ready_at(&self, _: &ConcurrencySettings, _: u32, _: Millis) -> Option<Millis> {
        None
    }

    /// One shape only: nothing but the limit to change.
    fn same_shape(_: &ConcurrencySettings, _: &ConcurrencySettings) -> bool {
        true
    }

    /// Held permits stay held; a lower limit leaves fewer free (Y4).
    fn rebase(&mut self, _: &ConcurrencySettings, _: &ConcurrencySettings, _: Millis) {}

    const RETURNS_PERMITS: bool = true;

    /// Returns `n` permits; never more than are held (P7).
    fn release(&mut self, n: u32) {
        debug_assert!(self.held >= u64::from(n), "permits returned twice");
        self.held = self.held.saturating_sub(u64::from(n));
    }

    fn is_full(&self, _: &ConcurrencySettings, _: Millis) -> bool {
        self.held == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn permits(n: u32) -> ConcurrencySettings {
        ConcurrencySettings {
            permits: NonZeroU32::new(n).expect("non-zero"),
        }
    }

    #[test]
    fn a_lowered_limit_leaves_fewer_free_until_permits_return() {
        let mut c = Concurrency::default();
        c.take(&permits(4), 3, 0);
        assert_eq!(c.available(&permits(4), 0), 1);
        assert_eq!(c.available(&permits(2), 0), 0);
        c.release(2);
        assert_eq!(c.available(&permits(2), 0), 1);
    }
}

//! `concurrency { permits }`: at most `permits` held by live tickets.

/// Permits held by live tickets. Counting what is held, not what is free,
/// lets a lowered limit apply at once without losing a held permit (Y4).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Concurrency {
    held: u64,
}

impl Concurrency {
    /// Permits held now.
    pub fn held(&self) -> u64 {
        self.held
    }

    /// Permits free under `limit`.
    pub fn available(&self, limit: u32) -> u32 {
        u64::from(limit).saturating_sub(self.held) as u32
    }

    /// Holds `n` more permits.
    pub fn take(&mut self, n: u32) {
        self.held += u64::from(n);
    }

    /// Returns `n` permits; never more than are held (P7).
    pub fn release(&mut self, n: u32) {
        debug_assert!(self.held >= u64::from(n), "permits returned twice");
        self.held = self.held.saturating_sub(u64::from(n));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lowered_limit_leaves_fewer_free_until_permits_return() {
        let mut c = Concurrency::default();
        c.take(3);
        assert_eq!(c.available(4), 1);
        assert_eq!(c.available(2), 0);
        c.release(2);
        assert_eq!(c.available(2), 1);
    }
}

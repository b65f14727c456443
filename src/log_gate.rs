//! A log line let through at most once a second, so that a trouble that
//! repeats on every call (a rate-limit check refused, a credential's
//! stream answers over its part) is seen without flooding the logs.

use std::sync::atomic::{AtomicU64, Ordering};

/// Lets a log line through at most once a second, counting the ones held
/// back meanwhile.
#[derive(Debug, Default)]
pub struct LogGate {
    /// Milliseconds since the Unix epoch of the last line let through.
    last: AtomicU64,
    /// Lines held back since.
    held: AtomicU64,
}

impl LogGate {
    /// `Some(lines held back before this one)` when a line may be logged
    /// now, else `None` (and this one is counted as held back).
    pub fn pass(&self) -> Option<u64> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let last = self.last.load(Ordering::Relaxed);
        if now.saturating_sub(last) >= 1000
            && self
                .last
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            return Some(self.held.swap(0, Ordering::Relaxed));
        }
        self.held.fetch_add(1, Ordering::Relaxed);
        None
    }
}

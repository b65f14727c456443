//! The engine's clock: whole milliseconds since the engine started (T0).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::domain::Millis;

/// Where the engine reads time. The domain never does.
pub trait Clock: Send + Sync + 'static {
    /// Milliseconds since the clock's origin; never goes backwards.
    fn now(&self) -> Millis;
    /// The `Instant` at which the clock reads `at`, for timers; `None` for a
    /// manual clock, which moves only when asked.
    fn instant_of(&self, at: Millis) -> Option<Instant>;
}

/// The operating system's monotonic clock.
#[derive(Debug)]
pub struct SystemClock {
    origin: Instant,
}

impl SystemClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        SystemClock {
            origin: Instant::now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Millis {
        self.origin.elapsed().as_millis() as Millis
    }

    fn instant_of(&self, at: Millis) -> Option<Instant> {
        Some(self.origin + Duration::from_millis(at))
    }
}

/// A clock that moves only when told (`--manual-clock`, X1); it starts at 0.
#[derive(Debug, Default)]
pub struct ManualClock {
    now: AtomicU64,
}

impl ManualClock {
    /// Moves the clock forward by `by` ms and returns the new reading.
    pub fn advance(&self, by: Millis) -> Millis {
        let before = self.now.fetch_add(by, Ordering::SeqCst);
        before.saturating_add(by)
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Millis {
        self.now.load(Ordering::SeqCst)
    }

    fn instant_of(&self, _at: Millis) -> Option<Instant> {
        None
    }
}

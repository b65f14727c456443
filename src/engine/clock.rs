//! The engine's clock: whole milliseconds from its origin (T0).

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

/// One day in ms: every window, segment and refill period that is a
/// whole number of seconds, minutes or hours divides it.
const DAY: Millis = 86_400_000;

/// The operating system's monotonic clock, its origin the last midnight
/// (UTC) of the wall clock: windows, segments and refill ticks aligned to
/// multiples of their length on it (K4) begin on the wall clock's whole
/// seconds, minutes, hours and days, as those of the Redis module do (it
/// counts in Unix milliseconds), and a restart does not move them.
#[derive(Debug)]
pub struct SystemClock {
    /// The instant the clock was made at.
    started: Instant,
    /// Its reading then: milliseconds since the last midnight, UTC.
    offset: Millis,
}

impl SystemClock {
    /// A clock whose origin is the last midnight (UTC).
    pub fn new() -> Self {
        let unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as Millis);
        SystemClock {
            started: Instant::now(),
            offset: unix % DAY,
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
        self.offset + self.started.elapsed().as_millis() as Millis
    }

    fn instant_of(&self, at: Millis) -> Option<Instant> {
        Some(self.started + Duration::from_millis(at.saturating_sub(self.offset)))
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

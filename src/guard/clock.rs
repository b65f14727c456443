//! Where a guard reads the time: the system's monotonic clock, or one a
//! test moves.

use std::sync::Arc;
use std::time::Instant;

/// Where a guard reads the time, for its cache of open keys, its backoff
/// and its log interval: the system's monotonic clock by default; a test
/// against a server on a manual clock moves its own.
#[derive(Clone)]
pub struct Clock(Arc<dyn Fn() -> Instant + Send + Sync>);

impl Clock {
    /// The system's monotonic clock ([`Instant::now`]).
    pub fn system() -> Clock {
        Clock(Arc::new(Instant::now))
    }

    /// A clock that reads `now`.
    pub fn from_fn(now: impl Fn() -> Instant + Send + Sync + 'static) -> Clock {
        Clock(Arc::new(now))
    }

    /// The time now.
    pub fn now(&self) -> Instant {
        (self.0)()
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::system()
    }
}

impl std::fmt::Debug for Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Clock")
    }
}

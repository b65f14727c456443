//! Time as the commands take it: the caller's clock in milliseconds, or
//! `*` for the server's wall clock (Unix milliseconds), raised to the
//! key's last time seen so that a key never sees time go backwards.

use fusebox_domain::policy::MAX_DURATION;
use fusebox_domain::Millis;

/// The largest `now_ms` a command takes: 2^53 (the largest time a stored
/// state may hold, decisions item 63) less 365 days (the longest lease,
/// wait, break or probe slot), so that every deadline a command sets still
/// reads back.
pub const MAX_NOW: Millis = (1 << 53) - MAX_DURATION;

/// `now_ms` as sent: a number, or `*` for the server's clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Now {
    /// The caller's clock, in milliseconds.
    At(Millis),
    /// `*`: the Redis server's wall clock in unix milliseconds, raised to
    /// the key's last time seen.
    Server,
}

impl Now {
    /// The time a command uses at a key whose last time seen is `last`
    /// (`None`: an empty key).
    pub fn resolve(self, last: Option<Millis>) -> Millis {
        match self {
            Now::At(at) => at,
            Now::Server => wall_ms().min(MAX_NOW).max(last.unwrap_or(0)),
        }
    }
}

/// The server's wall clock in unix milliseconds.
pub fn wall_ms() -> Millis {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

//! The four limiter kinds of SPEC section 2, one file each, behind one enum.
//!
//! Every method takes the kind's validated settings, so that a changed
//! policy (Y4) applies from the next operation: a lower limit simply leaves
//! fewer permits free. Windows and refill ticks are aligned to whole
//! multiples of their length on the engine's clock (K4).

mod concurrency;
mod fixed_window;
mod sliding_window;
mod token_bucket;

pub use concurrency::Concurrency;
pub use fixed_window::FixedWindow;
pub use sliding_window::SlidingWindow;
pub use token_bucket::TokenBucket;

use super::policy::LimiterKind;
use super::Millis;

/// The state of one key's limiter, of the kind its policy names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Limiter {
    /// See [`Concurrency`].
    Concurrency(Concurrency),
    /// See [`TokenBucket`].
    TokenBucket(TokenBucket),
    /// See [`FixedWindow`].
    FixedWindow(FixedWindow),
    /// See [`SlidingWindow`].
    SlidingWindow(SlidingWindow),
}

impl Limiter {
    /// A fresh, full limiter of `kind` at `now`.
    pub fn new(kind: &LimiterKind, now: Millis) -> Self {
        match *kind {
            LimiterKind::Concurrency { .. } => Limiter::Concurrency(Concurrency::default()),
            LimiterKind::TokenBucket {
                capacity, period, ..
            } => Limiter::TokenBucket(TokenBucket::new(capacity.get(), period.get(), now)),
            LimiterKind::FixedWindow { .. } => Limiter::FixedWindow(FixedWindow::default()),
            LimiterKind::SlidingWindow { .. } => Limiter::SlidingWindow(SlidingWindow::default()),
        }
    }

    /// True when this state is of `kind`'s algorithm.
    pub fn is_of(&self, kind: &LimiterKind) -> bool {
        matches!(
            (self, kind),
            (Limiter::Concurrency(_), LimiterKind::Concurrency { .. })
                | (Limiter::TokenBucket(_), LimiterKind::TokenBucket { .. })
                | (Limiter::FixedWindow(_), LimiterKind::FixedWindow { .. })
                | (Limiter::SlidingWindow(_), LimiterKind::SlidingWindow { .. })
        )
    }

    /// Carries the state over from `old` to `new` time lengths at `now`
    /// (Y4): a token bucket keeps its tokens and counts ticks of the new
    /// period from `now`; a window's counts were kept in units of the old
    /// length and cannot be mapped, so the window starts afresh, full.
    pub fn rebase(&mut self, old: &LimiterKind, new: &LimiterKind, now: Millis) {
        match (self, *old, *new) {
            (
                Limiter::TokenBucket(t),
                LimiterKind::TokenBucket {
                    capacity,
                    refill,
                    period,
                },
                LimiterKind::TokenBucket { period: next, .. },
            ) => t.rebase(capacity.get(), refill.get(), period.get(), next.get(), now),
            (this, _, _) => *this = Limiter::new(new, now),
        }
    }

    /// Permits free at `now`, between 0 and the limit. Changes nothing.
    pub fn available(&self, kind: &LimiterKind, now: Millis) -> u32 {
        match (self, *kind) {
            (Limiter::Concurrency(c), LimiterKind::Concurrency { permits }) => {
                c.available(permits.get())
            }
            (
                Limiter::TokenBucket(t),
                LimiterKind::TokenBucket {
                    capacity,
                    refill,
                    period,
                },
            ) => t.available(capacity.get(), refill.get(), period.get(), now),
            (Limiter::FixedWindow(f), LimiterKind::FixedWindow { permits, window }) => {
                f.available(permits.get(), window.get(), now)
            }
            (
                Limiter::SlidingWindow(s),
                LimiterKind::SlidingWindow {
                    permits,
                    window,
                    segments,
                },
            ) => s.available(permits.get(), window.get(), segments.get(), now),
            _ => 0,
        }
    }

    /// Takes `n` permits at `now`; the caller has checked they are free (P1).
    pub fn take(&mut self, kind: &LimiterKind, n: u32, now: Millis) {
        debug_assert!(self.available(kind, now) >= n);
        match (self, *kind) {
            (Limiter::Concurrency(c), LimiterKind::Concurrency { .. }) => c.take(n),
            (
                Limiter::TokenBucket(t),
                LimiterKind::TokenBucket {
                    capacity,
                    refill,
                    period,
                },
            ) => t.take(capacity.get(), refill.get(), period.get(), n, now),
            (Limiter::FixedWindow(f), LimiterKind::FixedWindow { window, .. }) => {
                f.take(window.get(), n, now)
            }
            (
                Limiter::SlidingWindow(s),
                LimiterKind::SlidingWindow {
                    window, segments, ..
                },
            ) => s.take(window.get(), segments.get(), n, now),
            _ => {}
        }
    }

    /// Gives back `n` concurrency permits; rate permits are spent, not
    /// returned (P7), so this does nothing for the other kinds.
    pub fn release(&mut self, n: u32) {
        if let Limiter::Concurrency(c) = self {
            c.release(n);
        }
    }

    /// True when this kind's permits come back with their ticket (P7).
    pub fn returns_permits(&self) -> bool {
        matches!(self, Limiter::Concurrency(_))
    }

    /// The earliest time at or after `now` when `n` permits will be free if
    /// nothing else happens; `None` when the algorithm cannot tell
    /// (concurrency) or `n` is above the limit.
    pub fn ready_at(&self, kind: &LimiterKind, n: u32, now: Millis) -> Option<Millis> {
        if n > kind.limit() {
            return None;
        }
        if self.available(kind, now) >= n {
            return Some(now);
        }
        match (self, *kind) {
            (
                Limiter::TokenBucket(t),
                LimiterKind::TokenBucket {
                    capacity,
                    refill,
                    period,
                },
            ) => Some(t.ready_at(capacity.get(), refill.get(), period.get(), n, now)),
            (Limiter::FixedWindow(f), LimiterKind::FixedWindow { permits, window }) => {
                Some(f.ready_at(permits.get(), window.get(), now))
            }
            (
                Limiter::SlidingWindow(s),
                LimiterKind::SlidingWindow {
                    permits,
                    window,
                    segments,
                },
            ) => s.ready_at(permits.get(), window.get(), segments.get(), n, now),
            _ => None,
        }
    }

    /// True when the limiter is as a fresh one would be at `now`: every
    /// permit free and no concurrency permit held (K2).
    pub fn is_full(&self, kind: &LimiterKind, now: Millis) -> bool {
        match self {
            Limiter::Concurrency(c) => c.held() == 0,
            _ => self.available(kind, now) == kind.limit(),
        }
    }
}

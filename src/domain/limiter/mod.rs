//! The four limiter kinds of SPEC section 2, one file each, behind one enum.
//!
//! Each variant of [`Limiter`] carries an algorithm's settings and its state
//! together ([`Tuned`]), so a state can never be read under another kind's
//! settings. A changed policy (Y4) reaches the limiter through
//! [`Limiter::adopt`]: the same kind keeps its state (each algorithm decides
//! what survives new settings, see [`Algorithm::rebase`]), another kind is
//! remade full. Windows and refill ticks are aligned to whole multiples of
//! their length on the engine's clock (K4).
//!
//! Adding a kind means one file implementing [`Algorithm`], one variant
//! here (and its arm in `each!` and [`Limiter::new`]), and its settings in
//! [`LimiterKind`].

mod adaptive;
mod concurrency;
mod fixed_window;
mod sliding_window;
mod token_bucket;

use std::fmt::Debug;

pub use adaptive::{
    Adaptive, AdaptiveSettings, MEASURING as ADAPTIVE_MEASURING, UNIT as ADAPTIVE_UNIT,
};
pub use concurrency::{Concurrency, ConcurrencySettings};
pub use fixed_window::{FixedWindow, FixedWindowSettings};
pub use sliding_window::{SlidingWindow, SlidingWindowSettings};
pub use token_bucket::{TokenBucket, TokenBucketSettings};

use super::policy::LimiterKind;
use super::{Millis, Outcome};

/// One limiter algorithm: its state, and the settings it runs under.
pub trait Algorithm: Clone + Debug + PartialEq + Eq + Sized {
    /// The algorithm's validated settings.
    type Settings: Copy + Debug + PartialEq + Eq;

    /// This algorithm's settings, when `kind` names this algorithm.
    fn settings(kind: &LimiterKind) -> Option<Self::Settings>;

    /// A fresh, full state at `now`.
    fn full(settings: &Self::Settings, now: Millis) -> Self;

    /// The most permits a single request can ever get.
    fn limit(settings: &Self::Settings) -> u32;

    /// Permits free at `now`, between 0 and the limit. Changes nothing.
    fn available(&self, settings: &Self::Settings, now: Millis) -> u32;

    /// Takes `n` permits at `now`; the caller has checked they are free.
    fn take(&mut self, settings: &Self::Settings, n: u32, now: Millis);

    /// When `n` permits (more than are free, at most the limit) will be
    /// free if nothing else happens; `None` when the algorithm cannot tell.
    fn ready_at(&self, settings: &Self::Settings, n: u32, now: Millis) -> Option<Millis>;

    /// Carries the state from `old` to `new` settings at `now` (Y4).
    fn rebase(&mut self, old: &Self::Settings, new: &Self::Settings, now: Millis);

    /// True when the permits come back with their ticket (P7).
    const RETURNS_PERMITS: bool = false;

    /// Gives back `n` permits; only called when [`Self::RETURNS_PERMITS`].
    fn release(&mut self, _n: u32) {}

    /// Settles `diff` more permits (fewer, when negative) than a ticket
    /// took at `taken_at`, at `now` (U1): into the window or segment they
    /// were taken in while it is still inside the window, else (only when
    /// positive) into the current one, within the algorithm's bounds. Kinds
    /// whose permits come back with their ticket ignore it.
    fn settle(&mut self, _settings: &Self::Settings, _taken_at: Millis, _diff: i64, _now: Millis) {}

    /// True when `other` keeps time as these settings do (the refill period,
    /// the window and its segments), so that permits taken under one can be
    /// settled under the other (U1).
    fn same_shape(a: &Self::Settings, b: &Self::Settings) -> bool;

    /// True when the state is as a fresh one would be at `now` (K2).
    fn is_full(&self, settings: &Self::Settings, now: Millis) -> bool {
        self.available(settings, now) == Self::limit(settings)
    }
}

/// An algorithm's state with the settings it runs under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tuned<A: Algorithm> {
    /// The settings in force.
    pub settings: A::Settings,
    /// The state under those settings.
    pub state: A,
}

impl<A: Algorithm> Tuned<A> {
    /// A full state of `kind` at `now`, when `kind` names this algorithm.
    fn made(kind: &LimiterKind, now: Millis) -> Option<Self> {
        let settings = A::settings(kind)?;
        Some(Tuned {
            state: A::full(&settings, now),
            settings,
        })
    }

    /// Takes the settings of `kind` if it names this algorithm, and says
    /// whether they keep time as the old ones did; `None` otherwise.
    fn adopt(&mut self, kind: &LimiterKind, now: Millis) -> Option<bool> {
        let next = A::settings(kind)?;
        let same = A::same_shape(&self.settings, &next);
        self.state.rebase(&self.settings, &next, now);
        self.settings = next;
        Some(same)
    }

    fn returns_permits(&self) -> bool {
        A::RETURNS_PERMITS
    }

    fn limit(&self) -> u32 {
        A::limit(&self.settings)
    }

    fn ready_at(&self, n: u32, now: Millis) -> Option<Millis> {
        if n > self.limit() {
            return None;
        }
        if self.state.available(&self.settings, now) >= n {
            return Some(now);
        }
        self.state.ready_at(&self.settings, n, now)
    }
}

/// The state of one key's limiter, with its settings, of the kind its policy names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Limiter {
    /// See [`Concurrency`].
    Concurrency(Tuned<Concurrency>),
    /// See [`TokenBucket`].
    TokenBucket(Tuned<TokenBucket>),
    /// See [`FixedWindow`].
    FixedWindow(Tuned<FixedWindow>),
    /// See [`SlidingWindow`].
    SlidingWindow(Tuned<SlidingWindow>),
    /// See [`Adaptive`].
    Adaptive(Tuned<Adaptive>),
}

/// Runs `$body` on the variant's [`Tuned`], whatever the kind.
macro_rules! each {
    ($limiter:expr, $tuned:ident => $body:expr) => {
        match $limiter {
            Limiter::Concurrency($tuned) => $body,
            Limiter::TokenBucket($tuned) => $body,
            Limiter::FixedWindow($tuned) => $body,
            Limiter::SlidingWindow($tuned) => $body,
            Limiter::Adaptive($tuned) => $body,
        }
    };
}

impl Limiter {
    /// A fresh, full limiter of `kind` at `now`.
    pub fn new(kind: &LimiterKind, now: Millis) -> Self {
        match kind {
            LimiterKind::Concurrency { .. } => Tuned::made(kind, now).map(Limiter::Concurrency),
            LimiterKind::TokenBucket { .. } => Tuned::made(kind, now).map(Limiter::TokenBucket),
            LimiterKind::FixedWindow { .. } => Tuned::made(kind, now).map(Limiter::FixedWindow),
            LimiterKind::SlidingWindow { .. } => Tuned::made(kind, now).map(Limiter::SlidingWindow),
            LimiterKind::Adaptive { .. } => Tuned::made(kind, now).map(Limiter::Adaptive),
        }
        .expect("each algorithm reads the settings of its own kind")
    }

    /// Takes a changed policy's limiter settings at `now` (Y4). The same
    /// kind keeps its state, carried over to the new settings (a token
    /// bucket keeps its tokens; a window whose length changed starts afresh,
    /// full); another kind is remade full. Returns true when the state was
    /// remade or keeps time otherwise (another period, window or segment
    /// count), so permits taken under the old state must neither come back
    /// to it (P7) nor be settled in it (U1).
    pub fn adopt(&mut self, kind: &LimiterKind, now: Millis) -> bool {
        match each!(self, t => t.adopt(kind, now)) {
            Some(same) => !same,
            None => {
                *self = Limiter::new(kind, now);
                true
            }
        }
    }

    /// The most permits a single request can ever get (`permits` or `capacity`).
    pub fn limit(&self) -> u32 {
        each!(self, t => t.limit())
    }

    /// Permits free at `now`, between 0 and the limit. Changes nothing.
    pub fn available(&self, now: Millis) -> u32 {
        each!(self, t => t.state.available(&t.settings, now))
    }

    /// Takes `n` permits at `now`; the caller has checked they are free (P1).
    pub fn take(&mut self, n: u32, now: Millis) {
        debug_assert!(self.available(now) >= n);
        each!(self, t => t.state.take(&t.settings, n, now))
    }

    /// Gives back `n` permits held by a ticket; rate permits are spent, not
    /// returned (P7), so this does nothing for kinds that do not return them.
    pub fn release(&mut self, n: u32) {
        if self.returns_permits() {
            each!(self, t => t.state.release(n))
        }
    }

    /// Settles a ticket's reported `cost` against the `taken` permits it
    /// took at `taken_at`, at `now` (U1); nothing for kinds whose permits
    /// come back with their ticket.
    pub fn settle(&mut self, taken: u32, cost: u32, taken_at: Millis, now: Millis) {
        let diff = i64::from(cost) - i64::from(taken);
        if diff != 0 && !self.returns_permits() {
            each!(self, t => t.state.settle(&t.settings, taken_at, diff, now))
        }
    }

    /// True when this kind's permits come back with their ticket (P7).
    pub fn returns_permits(&self) -> bool {
        each!(self, t => t.returns_permits())
    }

    /// The earliest time at or after `now` when `n` permits will be free if
    /// nothing else happens; `None` when the algorithm cannot tell
    /// (concurrency) or `n` is above the limit.
    pub fn ready_at(&self, n: u32, now: Millis) -> Option<Millis> {
        each!(self, t => t.ready_at(n, now))
    }

    /// An adaptive limiter's limit in force; `None` for the other kinds.
    pub fn adaptive_limit(&self) -> Option<u32> {
        match self {
            Limiter::Adaptive(t) => Some(t.state.current(&t.settings)),
            _ => None,
        }
    }

    /// Learns from a non-shadow ticket's completion at `now` (adaptive only; the
    /// other kinds ignore it): its `age`, `outcome`, and the key's `live`
    /// tickets counting the one completing. Called after the outcome
    /// reached the breaker and before the permits come back (C5).
    pub fn observe(&mut self, age: Millis, outcome: Outcome, live: u64, now: Millis) {
        if let Limiter::Adaptive(t) = self {
            t.state.observe(&t.settings, age, outcome, live, now);
        }
    }

    /// True when the limiter is as a fresh one would be at `now`: every
    /// permit free and no concurrency permit held (K2).
    pub fn is_full(&self, now: Millis) -> bool {
        each!(self, t => t.state.is_full(&t.settings, now))
    }
}

#[cfg(test)]
mod tests {
    use std::num::{NonZeroU32, NonZeroU64};

    use super::*;

    fn nz32(n: u32) -> NonZeroU32 {
        NonZeroU32::new(n).expect("non-zero")
    }

    fn nz64(n: u64) -> NonZeroU64 {
        NonZeroU64::new(n).expect("non-zero")
    }

    fn bucket(capacity: u32, refill: u32, period: u64) -> LimiterKind {
        LimiterKind::TokenBucket {
            capacity: nz32(capacity),
            refill: nz32(refill),
            period: nz64(period),
        }
    }

    #[test]
    fn every_kind_is_made_full_with_its_own_settings() {
        let kinds = [
            LimiterKind::Concurrency { permits: nz32(3) },
            bucket(3, 1, 100),
            LimiterKind::FixedWindow {
                permits: nz32(3),
                window: nz64(100),
            },
            LimiterKind::SlidingWindow {
                permits: nz32(3),
                window: nz64(100),
                segments: nz32(4),
            },
        ];
        for kind in kinds {
            let l = Limiter::new(&kind, 50);
            assert_eq!(l.limit(), 3, "{kind:?}");
            assert_eq!(l.available(50), 3, "{kind:?}");
            assert!(l.is_full(50), "{kind:?}");
            assert_eq!(
                l.returns_permits(),
                matches!(kind, LimiterKind::Concurrency { .. })
            );
        }
    }

    #[test]
    fn a_token_bucket_keeps_its_tokens_across_a_new_period() {
        let mut l = Limiter::new(&bucket(4, 1, 100), 0);
        l.take(3, 50);
        assert!(!l.adopt(&bucket(5, 1, 100), 60), "same period");
        assert!(l.adopt(&bucket(4, 1, 1000), 150), "another period");
        // One tick of the old period came at 100; ticks of the new one count from 150.
        assert_eq!(l.available(150), 2);
        assert_eq!(l.available(999), 2);
        assert_eq!(l.available(1000), 3);
    }

    #[test]
    fn a_window_whose_length_changed_starts_full_and_another_kind_is_remade() {
        let fixed = |window| LimiterKind::FixedWindow {
            permits: nz32(2),
            window: nz64(window),
        };
        let mut l = Limiter::new(&fixed(100), 0);
        l.take(2, 10);
        assert!(!l.adopt(&fixed(100), 20));
        assert_eq!(l.available(20), 0, "same clock: counts kept");
        assert!(l.adopt(&fixed(200), 30), "another window");
        assert_eq!(l.available(30), 2, "new clock: the window starts afresh");
        l.take(1, 30);
        assert!(l.adopt(&LimiterKind::Concurrency { permits: nz32(5) }, 40));
        assert_eq!(l.available(40), 5);
    }
}

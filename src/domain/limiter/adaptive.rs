//! `adaptive { min, max, initial }`: a concurrency limit learned from the
//! ages of completed tickets (SPEC section 10, rules CX20-CX27 of
//! `docs/contract-extensions.md`).
//!
//! Everything is integer arithmetic, so the engine and the Redis module
//! (which compile this file) agree bit for bit. The limit is kept in
//! millionths of a permit; what a request can use is its whole part.

use std::num::NonZeroU32;

use super::Algorithm;
use crate::policy::LimiterKind;
use crate::{Millis, Outcome};

/// One permit in the limit's fixed point.
pub const UNIT: u64 = 1_000_000;
/// One millisecond in the averages' fixed point.
pub const AGE_UNIT: u64 = 1_000;
/// The short average moves by 1/`SHORT_WEIGHT` of a sample's difference.
pub const SHORT_WEIGHT: u64 = 10;
/// The baseline is the lowest short average of the current and the
/// previous window of `BASELINE_WINDOW` ms, aligned to its multiples (K4).
pub const BASELINE_WINDOW: Millis = 10_000;
/// The gradient's bounds and tolerance, in millionths.
pub const GRADIENT_MIN: u64 = 500_000;
/// The gradient's upper bound: the limit never shrinks when ages are flat.
pub const GRADIENT_MAX: u64 = 1_000_000;
/// Ages up to 1.5 times the baseline count as no worse than usual.
pub const TOLERANCE: u64 = 1_500_000;
/// The new limit weighs `SMOOTHING` millionths, the old one the rest.
pub const SMOOTHING: u64 = 200_000;
/// A failure multiplies the limit by `BACKOFF` millionths.
pub const BACKOFF: u64 = 900_000;

/// The settings of `adaptive`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdaptiveSettings {
    /// The lowest limit.
    pub min: NonZeroU32,
    /// The highest limit (P2's limit).
    pub max: NonZeroU32,
    /// The limit a fresh key starts at.
    pub initial: NonZeroU32,
}

/// Permits held by live tickets, the learned limit, the short average and
/// the baseline's windows.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Adaptive {
    pub(crate) held: u64,
    /// The limit in millionths of a permit.
    pub(crate) limit: u64,
    /// The short average of ages, in thousandths of a ms; 0 = no sample yet.
    pub(crate) short: u64,
    /// The lowest short average in the current window; 0 = none.
    pub(crate) low: u64,
    /// The lowest short average in the window before; 0 = none.
    pub(crate) before: u64,
    /// The current window's index: it starts at `window * BASELINE_WINDOW`.
    pub(crate) window: u64,
}

impl Adaptive {
    /// Permits held now.
    pub fn held(&self) -> u64 {
        self.held
    }

    /// The limit in force: the whole part of the learned limit.
    pub fn current(&self) -> u32 {
        u32::try_from(self.limit / UNIT).unwrap_or(u32::MAX)
    }

    /// The learned limit (millionths), the short average, the lowest
    /// short averages of the current and the previous window (thousandths
    /// of a ms) and the current window's index.
    pub fn parts(&self) -> [u64; 5] {
        [self.limit, self.short, self.low, self.before, self.window]
    }

    /// The state with these parts, as [`Adaptive::parts`] gives them.
    pub fn from_parts(held: u64, [limit, short, low, before, window]: [u64; 5]) -> Adaptive {
        Adaptive {
            held,
            limit,
            short,
            low,
            before,
            window,
        }
    }

    fn clamp(&mut self, s: &AdaptiveSettings) {
        let low = u64::from(s.min.get()) * UNIT;
        let high = u64::from(s.max.get()) * UNIT;
        self.limit = self.limit.clamp(low, high);
    }

    /// Learns from one completion of a non-shadow ticket at `now`
    /// (CX21-CX24): its `age`, its `outcome`, and the key's `live` tickets
    /// counting the one completing.
    pub fn observe(
        &mut self,
        s: &AdaptiveSettings,
        age: Millis,
        outcome: Outcome,
        live: u64,
        now: Millis,
    ) {
        match outcome {
            Outcome::Ignored => {}
            Outcome::Failure => {
                self.limit = mul_div(self.limit, BACKOFF, UNIT);
                self.clamp(s);
            }
            Outcome::Success => {
                let window = now / BASELINE_WINDOW;
                if window != self.window {
                    self.before = if window == self.window + 1 {
                        self.low
                    } else {
                        0
                    };
                    self.low = 0;
                    self.window = window;
                }
                let sample = age.max(1).saturating_mul(AGE_UNIT);
                self.short = if self.short == 0 {
                    sample
                } else {
                    ewma(self.short, sample, SHORT_WEIGHT)
                };
                self.low = if self.low == 0 {
                    self.short
                } else {
                    self.low.min(self.short)
                };
                let baseline = match self.before {
                    0 => self.low,
                    before => before.min(self.low),
                };
                let whole = self.limit / UNIT;
                let gradient = mul_div(baseline, TOLERANCE, self.short.max(1))
                    .clamp(GRADIENT_MIN, GRADIENT_MAX);
                let target = mul_div(self.limit, gradient, UNIT)
                    .saturating_add(isqrt(whole).max(1).saturating_mul(UNIT));
                let next = mul_div(self.limit, UNIT - SMOOTHING, UNIT)
                    .saturating_add(mul_div(target, SMOOTHING, UNIT));
                // Too few calls in flight to show the limit is too low: it
                // may shrink, never grow.
                if next < self.limit || live.saturating_mul(2) >= whole {
                    self.limit = next;
                }
                self.clamp(s);
            }
        }
    }
}

/// `floor(a * b / c)`, in 128 bits, saturated to `u64`.
fn mul_div(a: u64, b: u64, c: u64) -> u64 {
    let v = u128::from(a) * u128::from(b) / u128::from(c.max(1));
    u64::try_from(v).unwrap_or(u64::MAX)
}

/// `floor((avg * (w - 1) + sample) / w)`.
fn ewma(avg: u64, sample: u64, w: u64) -> u64 {
    let v = (u128::from(avg) * u128::from(w - 1) + u128::from(sample)) / u128::from(w);
    u64::try_from(v).unwrap_or(u64::MAX)
}

/// The whole square root, `floor(sqrt(n))`.
pub fn isqrt(n: u64) -> u64 {
    if n < 2 {
        return n;
    }
    // Newton's method from above, in integers: stops at the floor.
    let mut x = n;
    let mut y = x.div_ceil(2);
    while y < x {
        x = y;
        y = (x + n / x) / 2;
    }
    x
}

impl Algorithm for Adaptive {
    type Settings = AdaptiveSettings;

    fn settings(kind: &LimiterKind) -> Option<AdaptiveSettings> {
        let LimiterKind::Adaptive { min, max, initial } = *kind else {
            return None;
        };
        Some(AdaptiveSettings { min, max, initial })
    }

    fn full(s: &AdaptiveSettings, _: Millis) -> Self {
        Adaptive {
            limit: u64::from(s.initial.get()) * UNIT,
            ..Adaptive::default()
        }
    }

    /// P2's limit is `max`: a request above it could never succeed.
    fn limit(s: &AdaptiveSettings) -> u32 {
        s.max.get()
    }

    fn available(&self, _: &AdaptiveSettings, _: Millis) -> u32 {
        u64::from(self.current()).saturating_sub(self.held) as u32
    }

    fn take(&mut self, _: &AdaptiveSettings, n: u32, _: Millis) {
        self.held += u64::from(n);
    }

    /// Permits come back with tickets, at no time the algorithm can tell.
    fn ready_at(&self, _: &AdaptiveSettings, _: u32, _: Millis) -> Option<Millis> {
        None
    }

    fn same_shape(_: &AdaptiveSettings, _: &AdaptiveSettings) -> bool {
        true
    }

    /// Held permits stay held; the limit is clamped into the new bounds (Y4).
    fn rebase(&mut self, _: &AdaptiveSettings, new: &AdaptiveSettings, _: Millis) {
        self.clamp(new);
    }

    const RETURNS_PERMITS: bool = true;

    fn release(&mut self, n: u32) {
        debug_assert!(self.held >= u64::from(n), "permits returned twice");
        self.held = self.held.saturating_sub(u64::from(n));
    }

    /// At rest only as a fresh one: nothing held, the limit at `initial`,
    /// no age learned (K2; CX25).
    fn is_full(&self, s: &AdaptiveSettings, now: Millis) -> bool {
        self.held == 0 && *self == Self::full(s, now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(min: u32, max: u32, initial: u32) -> AdaptiveSettings {
        let nz = |n| NonZeroU32::new(n).expect("non-zero");
        AdaptiveSettings {
            min: nz(min),
            max: nz(max),
            initial: nz(initial),
        }
    }

    #[test]
    fn integer_square_roots_are_floors() {
        for n in 0..10_000u64 {
            let r = isqrt(n);
            assert!(r * r <= n && (r + 1) * (r + 1) > n, "{n}");
        }
        assert_eq!(isqrt(u64::MAX), u64::from(u32::MAX));
    }

    #[test]
    fn flat_ages_under_load_grow_the_limit_by_a_fifth_of_its_root() {
        let s = settings(1, 100, 10);
        let mut a = Adaptive::full(&s, 0);
        a.observe(&s, 20, Outcome::Success, 10, 0);
        // gradient 1: target = 10 + 3; limit = 10 * 0.8 + 13 * 0.2 = 10.6
        assert_eq!(a.limit, 10_600_000);
        assert_eq!((a.short, a.low, a.before), (20_000, 20_000, 0));
    }

    #[test]
    fn doubled_ages_shrink_the_limit_and_failures_back_off() {
        let s = settings(2, 100, 20);
        let mut a = Adaptive::full(&s, 0);
        a.observe(&s, 20, Outcome::Success, 20, 0);
        let before = a.limit;
        for _ in 0..20 {
            a.observe(&s, 80, Outcome::Success, 20, 0);
        }
        assert!(a.limit < before, "{} < {before}", a.limit);
        let l = a.limit;
        a.observe(&s, 1, Outcome::Failure, 1, 0);
        assert_eq!(a.limit, (l * 9 / 10).max(2 * UNIT));
        a.observe(&s, 1, Outcome::Ignored, 1, 0);
        assert_eq!(a.limit, (l * 9 / 10).max(2 * UNIT));
    }

    #[test]
    fn the_baseline_is_the_lowest_short_average_of_two_windows() {
        let s = settings(1, 100, 10);
        let mut a = Adaptive::full(&s, 0);
        a.observe(&s, 20, Outcome::Success, 10, 9_000);
        a.observe(&s, 40, Outcome::Success, 10, 10_000);
        assert_eq!(
            (a.short, a.low, a.before, a.window),
            (22_000, 22_000, 20_000, 1)
        );
        a.observe(&s, 40, Outcome::Success, 10, 30_000);
        // Two windows on: neither lowest is kept.
        assert_eq!((a.short, a.low, a.before, a.window), (23_800, 23_800, 0, 3));
    }

    #[test]
    fn a_lowered_limit_keeps_held_permits_held() {
        let s = settings(1, 10, 8);
        let mut a = Adaptive::full(&s, 0);
        a.take(&s, 6, 0);
        a.rebase(&s, &settings(1, 4, 1), 0);
        assert_eq!(a.current(), 4);
        assert_eq!(a.available(&s, 0), 0);
        a.release(3);
        assert_eq!(a.available(&s, 0), 1);
    }
}

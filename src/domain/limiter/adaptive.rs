//! `adaptive { min, max, initial }`: a concurrency limit learned from the
//! ages of completed tickets (SPEC section 10, rules CX20-CX27 of
//! `docs/contract-extensions.md`).
//!
//! A gradient controller in the manner of Envoy's: a **baseline** (the
//! dependency's latency when it is not loaded) learned from a fresh key's
//! first calls and measured again now and then with the limit held at
//! `min`, and **rounds** of at least [`ROUND`] ms whose
//! mean age, against the baseline, moves the limit. Everything is integer
//! arithmetic, so the engine and the Redis module (which compile this file)
//! agree bit for bit. The limit is kept in millionths of a permit; what a
//! request can use is its whole part.

use std::num::NonZeroU32;

use super::Algorithm;
use crate::policy::LimiterKind;
use crate::{Millis, Outcome};

/// One permit in the limit's fixed point.
pub const UNIT: u64 = 1_000_000;
/// One millisecond in the baseline's fixed point.
pub const AGE_UNIT: u64 = 1_000;
/// A round lasts at least this long (ms): the limit moves at most once
/// per round, after the calls it let in had time to show their ages.
pub const ROUND: Millis = 100;
/// The baseline is measured again in every window of `MEASURE_EVERY` ms,
/// aligned to its multiples (K4).
pub const MEASURE_EVERY: Millis = 10_000;
/// A baseline is the mean of this many samples ...
pub const MEASURE_SAMPLES: u64 = 10;
/// ... or, in a measurement with at least one, of those it has this long
/// (ms) after it began.
pub const MEASURE_LONGEST: Millis = 1_000;
/// `base` while a measurement holds the limit at `min`.
pub const MEASURING: u64 = u64::MAX;
/// The gradient's lower bound, in millionths: a round at most halves the
/// limit's target.
pub const GRADIENT_MIN: u64 = 500_000;
/// The gradient's upper bound: the limit never shrinks when ages are flat.
pub const GRADIENT_MAX: u64 = 1_000_000;
/// Ages up to 1.25 times the baseline count as no worse than unloaded.
pub const TOLERANCE: u64 = 1_250_000;
/// The new limit weighs `SMOOTHING` millionths, the old one the rest.
pub const SMOOTHING: u64 = 500_000;
/// A failure multiplies the limit by `BACKOFF` millionths.
pub const BACKOFF: u64 = 900_000;

/// The settings of `adaptive`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdaptiveSettings {
    /// The lowest limit, and the limit in force while the baseline is
    /// measured again.
    pub min: NonZeroU32,
    /// The highest limit (P2's limit).
    pub max: NonZeroU32,
    /// The limit a fresh key starts at.
    pub initial: NonZeroU32,
}

/// Permits held by live tickets, the learned limit, the baseline, and the
/// samples of the current round or measurement.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Adaptive {
    pub(crate) held: u64,
    /// The limit in millionths of a permit.
    pub(crate) limit: u64,
    /// The baseline age, in thousandths of a ms; 0 = none yet (a fresh
    /// key's first calls make it), [`MEASURING`] = being measured again.
    pub(crate) base: u64,
    /// The ages (ms) of the current round's or measurement's samples.
    pub(crate) sum: u64,
    /// How many samples those are.
    pub(crate) count: u64,
    /// When the current round or measurement began (ms).
    pub(crate) since: Millis,
}

impl Adaptive {
    /// Permits held now.
    pub fn held(&self) -> u64 {
        self.held
    }

    /// True while the baseline is being measured again (the limit in force
    /// is then `min`).
    pub fn measuring(&self) -> bool {
        self.base == MEASURING
    }

    /// The limit in force: `min` while the baseline is measured again,
    /// else the whole part of the learned limit.
    pub fn current(&self, s: &AdaptiveSettings) -> u32 {
        if self.measuring() {
            s.min.get()
        } else {
            u32::try_from(self.limit / UNIT).unwrap_or(u32::MAX)
        }
    }

    /// The learned limit (millionths), the baseline (thousandths of a ms),
    /// the current samples' sum (ms) and count, and when they began.
    pub fn parts(&self) -> [u64; 5] {
        [self.limit, self.base, self.sum, self.count, self.since]
    }

    /// The state with these parts, as [`Adaptive::parts`] gives them.
    pub fn from_parts(held: u64, [limit, base, sum, count, since]: [u64; 5]) -> Adaptive {
        Adaptive {
            held,
            limit,
            base,
            sum,
            count,
            since,
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
            Outcome::Success if self.base == 0 => {
                // A fresh key's first calls make its baseline (CX24).
                self.sum = self.sum.saturating_add(age.max(1));
                self.count += 1;
                if self.count >= MEASURE_SAMPLES {
                    self.base = mul_div(self.sum, AGE_UNIT, self.count).max(1);
                    self.begin_round(now);
                }
            }
            Outcome::Success if self.measuring() => {
                // Only calls granted since the measurement began ran at
                // `min` or below (CX24).
                if now.saturating_sub(age) >= self.since {
                    self.sum = self.sum.saturating_add(age.max(1));
                    self.count += 1;
                }
                let over = now >= self.since.saturating_add(MEASURE_LONGEST);
                if self.count >= MEASURE_SAMPLES || (self.count > 0 && over) {
                    self.base = mul_div(self.sum, AGE_UNIT, self.count).max(1);
                    self.begin_round(now);
                }
            }
            Outcome::Success => {
                self.sum = self.sum.saturating_add(age.max(1));
                self.count += 1;
                if now < self.since.saturating_add(ROUND) {
                    return;
                }
                let mean = mul_div(self.sum, AGE_UNIT, self.count).max(1);
                let whole = self.limit / UNIT;
                let gradient =
                    mul_div(self.base, TOLERANCE, mean).clamp(GRADIENT_MIN, GRADIENT_MAX);
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
                let window = self.since / MEASURE_EVERY;
                self.begin_round(now);
                if now / MEASURE_EVERY != window {
                    // A new window: measure the baseline again (CX24).
                    self.base = MEASURING;
                }
            }
        }
    }

    fn begin_round(&mut self, now: Millis) {
        self.sum = 0;
        self.count = 0;
        self.since = now;
    }
}

/// `floor(a * b / c)`, in 128 bits, saturated to `u64`.
fn mul_div(a: u64, b: u64, c: u64) -> u64 {
    let v = u128::from(a) * u128::from(b) / u128::from(c.max(1));
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

    fn available(&self, s: &AdaptiveSettings, _: Millis) -> u32 {
        u64::from(self.current(s)).saturating_sub(self.held) as u32
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
    /// no baseline and no sample (K2; CX25).
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

    /// A limiter whose baseline is `base_ms` and whose round began at `since`.
    fn learned(s: &AdaptiveSettings, limit: u64, base_ms: u64, since: Millis) -> Adaptive {
        let mut a = Adaptive::full(s, 0);
        a.limit = limit * UNIT;
        a.base = base_ms * AGE_UNIT;
        a.since = since;
        a
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
    fn a_fresh_limiter_starts_at_initial_and_its_first_ten_calls_make_the_baseline() {
        let s = settings(2, 100, 10);
        let mut a = Adaptive::full(&s, 0);
        assert!(!a.measuring());
        assert_eq!((a.current(&s), a.available(&s, 0)), (10, 10));
        for i in 0..MEASURE_SAMPLES - 1 {
            // However late: a fresh key waits for ten calls.
            a.observe(&s, 20 + i % 2, Outcome::Success, 2, 5_000 + i);
            assert_eq!(
                (a.base, a.count, a.current(&s)),
                (0, i + 1, 10),
                "sample {i}"
            );
        }
        a.observe(&s, 21, Outcome::Success, 2, 6_000);
        // Ten samples: five of 20 ms, five of 21 ms.
        assert_eq!(a.parts(), [10 * UNIT, 20_500, 0, 0, 6_000]);
        assert_eq!(a.current(&s), 10);
    }

    #[test]
    fn a_measurement_counts_only_calls_granted_since_it_began() {
        let s = settings(1, 100, 10);
        let mut a = learned(&s, 10, 20, 5_000);
        a.base = MEASURING;
        assert_eq!(a.current(&s), 1, "min while measuring");
        a.observe(&s, 300, Outcome::Success, 5, 5_100);
        assert_eq!((a.sum, a.count), (0, 0), "granted before the measurement");
        a.observe(&s, 30, Outcome::Success, 1, 5_100);
        assert_eq!((a.sum, a.count), (30, 1));
        // With one sample, it ends MEASURE_LONGEST after it began.
        a.observe(&s, 100, Outcome::Success, 1, 5_000 + MEASURE_LONGEST);
        assert_eq!(a.parts(), [10 * UNIT, 65_000, 0, 0, 6_000]);
    }

    #[test]
    fn flat_ages_under_load_grow_the_limit_by_half_its_root_a_round() {
        let s = settings(1, 100, 10);
        let mut a = learned(&s, 10, 20, 0);
        a.observe(&s, 20, Outcome::Success, 10, 50);
        assert_eq!(
            a.parts(),
            [10 * UNIT, 20_000, 20, 1, 0],
            "the round goes on"
        );
        a.observe(&s, 20, Outcome::Success, 10, ROUND);
        // gradient 1: target = 10 + 3; limit = 10 * 0.5 + 13 * 0.5 = 11.5
        assert_eq!(a.parts(), [11_500_000, 20_000, 0, 0, ROUND]);
        assert_eq!(a.current(&s), 11);
    }

    #[test]
    fn too_few_calls_in_flight_never_grow_the_limit() {
        let s = settings(1, 100, 10);
        let mut a = learned(&s, 10, 20, 0);
        a.observe(&s, 20, Outcome::Success, 4, ROUND);
        assert_eq!(a.limit, 10 * UNIT);
    }

    #[test]
    fn doubled_ages_shrink_the_limit_and_failures_back_off() {
        let s = settings(2, 100, 20);
        let mut a = learned(&s, 10, 20, 0);
        a.observe(&s, 40, Outcome::Success, 10, ROUND);
        // gradient 20 * 1.25 / 40 = 0.625: target = 6.25 + 3; limit 9.625
        assert_eq!(a.limit, 9_625_000);
        a.observe(&s, 1, Outcome::Failure, 1, ROUND);
        assert_eq!(a.limit, 8_662_500);
        a.observe(&s, 1, Outcome::Ignored, 1, ROUND);
        assert_eq!(a.limit, 8_662_500);
        for _ in 0..100 {
            a.observe(&s, 1, Outcome::Failure, 1, ROUND);
        }
        assert_eq!(a.current(&s), 2, "never below min");
    }

    #[test]
    fn the_first_round_to_end_in_a_new_window_measures_the_baseline_again() {
        let s = settings(3, 100, 10);
        let mut a = learned(&s, 10, 20, MEASURE_EVERY - 50);
        a.observe(&s, 20, Outcome::Success, 10, MEASURE_EVERY + 50);
        assert_eq!(a.parts(), [11_500_000, MEASURING, 0, 0, MEASURE_EVERY + 50]);
        assert_eq!(a.current(&s), 3, "min while measuring");
    }

    #[test]
    fn a_lowered_limit_keeps_held_permits_held() {
        let s = settings(1, 10, 8);
        let mut a = learned(&s, 8, 20, 0);
        a.take(&s, 6, 0);
        a.rebase(&s, &settings(1, 4, 1), 0);
        assert_eq!(a.current(&s), 4);
        assert_eq!(a.available(&s, 0), 0);
        a.release(3);
        assert_eq!(a.available(&s, 0), 1);
    }
}

//! Key spreads: which key each call of a load names. Every caller draws
//! from its own generator into a reused buffer, so picking a key costs no
//! allocation and no shared state.

use std::fmt::Write;

/// How the keys of a load are spread over the key space.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Spread {
    /// One key: every call meets on the same lock.
    Hot,
    /// 1,000 keys, uniformly.
    #[value(name = "1k")]
    Thousand,
    /// 1,000,000 keys, uniformly (most calls create or revive a key).
    #[value(name = "1m")]
    Million,
    /// Zipf (s = 1.0) over 1,000,000 keys: a few hot keys and a long tail.
    Zipf,
}

impl Spread {
    /// Every spread, in the order tables list them.
    pub(crate) const ALL: [Spread; 4] =
        [Spread::Hot, Spread::Thousand, Spread::Million, Spread::Zipf];

    /// The name flags, keys and reports use.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Spread::Hot => "hot",
            Spread::Thousand => "1k",
            Spread::Million => "1m",
            Spread::Zipf => "zipf",
        }
    }

    /// How many distinct keys the spread names.
    pub(crate) fn keys(self) -> u64 {
        match self {
            Spread::Hot => 1,
            Spread::Thousand => 1_000,
            Spread::Million | Spread::Zipf => 1_000_000,
        }
    }
}

/// A small, fast generator (SplitMix64): good enough to spread keys, and
/// one per caller, so nothing is shared on the hot path.
#[derive(Clone, Debug)]
pub(crate) struct Rng(u64);

impl Rng {
    /// A generator whose sequence is fixed by `seed`.
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (n > 0), by multiply-shift (bias below 2^-32
    /// for the spreads used here).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// A number in [0, 1).
    pub(crate) fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// Zipf's law over ranks `1..=n` with exponent `s`: rank k is drawn with
/// probability proportional to 1/k^s. Sampled by rejection-inversion
/// (Hörmann and Derflinger, 1996): constant time and memory per draw, no
/// table of n weights.
#[derive(Clone, Debug)]
pub(crate) struct Zipf {
    n: f64,
    s: f64,
    h_integral_x1: f64,
    h_integral_n: f64,
    threshold: f64,
}

impl Zipf {
    /// The distribution over `1..=n` (n >= 1) with exponent `s` (> 0).
    pub(crate) fn new(n: u64, s: f64) -> Zipf {
        let mut z = Zipf {
            n: n as f64,
            s,
            h_integral_x1: 0.0,
            h_integral_n: 0.0,
            threshold: 0.0,
        };
        z.h_integral_x1 = z.h_integral(1.5) - 1.0;
        z.h_integral_n = z.h_integral(z.n + 0.5);
        z.threshold = 2.0 - z.h_integral_inverse(z.h_integral(2.5) - z.h(2.0));
        z
    }

    /// A rank in `1..=n`.
    pub(crate) fn sample(&self, rng: &mut Rng) -> u64 {
        loop {
            let u = self.h_integral_n + rng.unit() * (self.h_integral_x1 - self.h_integral_n);
            let x = self.h_integral_inverse(u);
            let k = (x + 0.5).floor().clamp(1.0, self.n);
            if k - x <= self.threshold || u >= self.h_integral(k + 0.5) - self.h(k) {
                return k as u64;
            }
        }
    }

    /// The density, up to a constant: 1/x^s.
    fn h(&self, x: f64) -> f64 {
        (-self.s * x.ln()).exp()
    }

    /// An antiderivative of `h`, written so that s = 1 (log) needs no case.
    fn h_integral(&self, x: f64) -> f64 {
        let log_x = x.ln();
        helper2((1.0 - self.s) * log_x) * log_x
    }

    /// The inverse of `h_integral`.
    fn h_integral_inverse(&self, x: f64) -> f64 {
        let t = (x * (1.0 - self.s)).max(-1.0);
        (helper1(t) * x).exp()
    }
}

/// ln(1 + x) / x, accurate near 0.
fn helper1(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.ln_1p() / x
    } else {
        1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x))
    }
}

/// (e^x - 1) / x, accurate near 0.
fn helper2(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.exp_m1() / x
    } else {
        1.0 + x * 0.5 * (1.0 + x / 3.0 * (1.0 + 0.25 * x))
    }
}

/// One caller's key picker: writes `bench/<spread>/<n>` into a buffer it
/// keeps, so the only allocation per call is the request's own copy.
#[derive(Clone, Debug)]
pub(crate) struct KeyPicker {
    spread: Spread,
    rng: Rng,
    zipf: Option<Zipf>,
    prefix: usize,
    buf: String,
}

impl KeyPicker {
    /// A picker for `spread`, seeded with `seed`.
    pub(crate) fn new(spread: Spread, seed: u64) -> KeyPicker {
        let mut buf = String::with_capacity(32);
        let _ = write!(buf, "bench/{}/", spread.name());
        KeyPicker {
            spread,
            rng: Rng::new(seed),
            zipf: (spread == Spread::Zipf).then(|| Zipf::new(spread.keys(), 1.0)),
            prefix: buf.len(),
            buf,
        }
    }

    /// The index of the next key, in `0..spread.keys()`.
    pub(crate) fn next_index(&mut self) -> u64 {
        match &self.zipf {
            Some(zipf) => zipf.sample(&mut self.rng) - 1,
            None if self.spread == Spread::Hot => 0,
            None => self.rng.below(self.spread.keys()),
        }
    }

    /// The next key.
    pub(crate) fn next_key(&mut self) -> &str {
        let n = self.next_index();
        self.buf.truncate(self.prefix);
        let _ = write!(self.buf, "{n}");
        &self.buf
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_named_by_spread_and_stay_in_range() {
        let mut hot = KeyPicker::new(Spread::Hot, 1);
        assert_eq!(hot.next_key(), "bench/hot/0");
        assert_eq!(hot.next_key(), "bench/hot/0");
        for spread in [Spread::Thousand, Spread::Million, Spread::Zipf] {
            let mut p = KeyPicker::new(spread, 7);
            for _ in 0..10_000 {
                assert!(p.next_index() < spread.keys());
            }
            let key = p.next_key().to_owned();
            assert!(key.starts_with(&format!("bench/{}/", spread.name())));
        }
    }

    #[test]
    fn uniform_spread_covers_its_keys() {
        let mut p = KeyPicker::new(Spread::Thousand, 3);
        let mut seen = vec![0u32; 1000];
        for _ in 0..100_000 {
            seen[p.next_index() as usize] += 1;
        }
        // 100 expected per key; a fair generator stays well inside 40..200.
        assert!(seen.iter().all(|&c| (40..200).contains(&c)), "{seen:?}");
    }

    #[test]
    fn zipf_matches_its_law() {
        // P(rank k) = 1 / (k * H_n); H_n for n = 10^6 is about 14.3927.
        let n = 1_000_000u64;
        let h_n: f64 = (1..=n).map(|k| 1.0 / k as f64).sum();
        let zipf = Zipf::new(n, 1.0);
        let mut rng = Rng::new(42);
        let draws = 1_000_000;
        let mut counts = [0u64; 4];
        let mut tail = 0u64;
        for _ in 0..draws {
            let k = zipf.sample(&mut rng);
            assert!((1..=n).contains(&k));
            if k <= 4 {
                counts[k as usize - 1] += 1;
            }
            if k > 1000 {
                tail += 1;
            }
        }
        for (i, &c) in counts.iter().enumerate() {
            let expected = draws as f64 / ((i + 1) as f64 * h_n);
            let got = c as f64;
            assert!(
                (got - expected).abs() < 0.03 * expected,
                "rank {}: {got} draws, expected {expected:.0}",
                i + 1
            );
        }
        // Ranks above 1000 carry 1 - H_1000 / H_n of the mass (about 0.48).
        let h_1000: f64 = (1..=1000).map(|k| 1.0 / k as f64).sum();
        let expected = draws as f64 * (1.0 - h_1000 / h_n);
        assert!((tail as f64 - expected).abs() < 0.02 * expected);
    }
}

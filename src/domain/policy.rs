//! Policies: plain specs as written in a config file or a vector, validated
//! once into types that cannot hold an invalid value (SPEC Y1–Y3).
//!
//! A [`PolicySpec`] is what serde reads; [`PolicySpec::validate`] turns it into
//! a [`Policy`] or a [`PolicyError`] that names the field. The rule name is
//! added by whoever knows it (the config loader).

use std::num::{NonZeroU32, NonZeroU64};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::quorum::MAX_QUORUM;
use super::{Millis, Outcome};

/// The id of a policy's JSON, as the Redis module keeps it and a command
/// names it (`@` and [`hex`](super::hex::encode) of it): the first 16 bytes of
/// the JSON's SHA-256.
pub fn policy_id(json: &[u8]) -> [u8; 16] {
    let digest = Sha256::digest(json);
    let mut id = [0u8; 16];
    id.copy_from_slice(&digest[..16]);
    id
}

/// The longest duration fusebox accepts anywhere in a policy: 365 days.
pub const MAX_DURATION: Millis = 365 * 24 * 3600 * 1000;

/// A validated policy: what one rule says about the keys it matches.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Policy {
    /// The breaker, if the policy has one; without one every request is admitted.
    pub breaker: Option<BreakerPolicy>,
    /// The limiter, if the policy has one; without one nothing is limited.
    pub limiter: Option<LimiterPolicy>,
    /// Ticket lease settings.
    pub lease: LeasePolicy,
    /// The retry budget (R1-R3), if the policy has one.
    pub retry_budget: Option<RetryBudget>,
    /// False on a shadow policy (D1-D4): its decisions are made and
    /// counted, but what it would block or deny is granted.
    pub enforce: bool,
}

/// A validated retry budget (SPEC R1-R3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryBudget {
    /// Retries allowed per first attempt, in millionths (the ratio taken
    /// to 6 decimals).
    pub ratio_millionths: u64,
    /// Retries always allowed per second of the window.
    pub min_per_second: u32,
    /// The window in ms: at least 1 s, a multiple of 10 ms.
    pub window: NonZeroU64,
}

/// A ratio in (0, 1] taken to 6 decimals: `round(r * 10^6)` (section 10,
/// "Ratios").
pub fn millionths(ratio: f64) -> u64 {
    (ratio * 1_000_000.0).round() as u64
}

impl Default for Policy {
    /// The built-in default rule of Y3: consecutive, 5 failures, 5 s break, no limiter.
    fn default() -> Self {
        let break_ms = NonZeroU64::new(5_000).expect("non-zero");
        Policy {
            breaker: Some(BreakerPolicy {
                trip: Trip::Consecutive {
                    failures: NonZeroU32::new(5).expect("non-zero"),
                },
                break_ms,
                multiplier: 1.0,
                max_break: None,
                probe_lease: break_ms,
                half_open: HalfOpen::default(),
                quorum: None,
                slow: None,
            }),
            limiter: None,
            lease: LeasePolicy::default(),
            retry_budget: None,
            enforce: true,
        }
    }
}

/// When a breaker opens (SPEC section 1, trip modes).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Trip {
    /// Opens after `failures` failures in a row while closed.
    Consecutive {
        /// Failures in a row that open the breaker.
        failures: NonZeroU32,
    },
    /// Opens when the share of failures in the sampling window is high enough.
    Ratio {
        /// The share of failures, in (0, 1], that opens the breaker.
        failure_ratio: f64,
        /// The fewest outcomes in the window before the ratio is judged.
        minimum_throughput: NonZeroU32,
        /// The window's length in ms, at least 10.
        sampling_window: Millis,
    },
}

/// A validated breaker.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BreakerPolicy {
    /// The trip mode.
    pub trip: Trip,
    /// The base break length (`break`).
    pub break_ms: NonZeroU64,
    /// Growth of consecutive breaks, at least 1 (1 = no backoff).
    pub multiplier: f64,
    /// The longest break, when backoff is used.
    pub max_break: Option<NonZeroU64>,
    /// How long a probe may hold the probe slot.
    pub probe_lease: NonZeroU64,
    /// Probes at once and successes to close (H1-H4); 1 and 1 by default.
    pub half_open: HalfOpen,
    /// Distinct callers whose failures a trip needs (Q2), 2 to
    /// [`MAX_QUORUM`]; `None`: no quorum.
    pub quorum: Option<NonZeroU32>,
    /// Slow calls (S1-S3), ratio mode only.
    pub slow: Option<Slow>,
}

/// Validated slow calls (SPEC S1-S3): a current call at least `duration`
/// old is slow, and a slow share of at least `ratio` trips the breaker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slow {
    /// The age in ms from which a call is slow: above 0, at most `lease.max`.
    pub duration: NonZeroU64,
    /// The slow share that trips, in millionths (the ratio taken to 6
    /// decimals, section 10 "Ratios"), from 1 to 1,000,000.
    pub ratio_millionths: u64,
}

impl Slow {
    /// `slow / n >= ratio`, exactly in integers; an empty share never is.
    pub fn reached(&self, slow: u64, n: u64) -> bool {
        n > 0 && u128::from(slow) * 1_000_000 >= u128::from(self.ratio_millionths) * u128::from(n)
    }
}

/// Bounded half-open (SPEC H1-H4): at most `probes` probe slots held at
/// once, and `successes` probe successes in one half-open period close the
/// breaker. `1` and `1` are sections 1's single probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HalfOpen {
    /// Probe slots held at once.
    pub probes: NonZeroU32,
    /// Probe successes that close the breaker.
    pub successes: NonZeroU32,
}

impl Default for HalfOpen {
    fn default() -> Self {
        let one = NonZeroU32::new(1).expect("non-zero");
        HalfOpen {
            probes: one,
            successes: one,
        }
    }
}

/// The most probes at once, and successes to close, that a half-open
/// period may ask for: enough for any fleet, small enough that the slots
/// of one key stay a short list.
pub const MAX_HALF_OPEN: u32 = 1_000;

impl BreakerPolicy {
    /// The length of the k-th consecutive opening (k >= 1):
    /// `min(break * multiplier^(k-1), max_break)`, rounded down (SPEC T1).
    pub fn break_length(&self, k: u32) -> Millis {
        let base = self.break_ms.get();
        let cap = self.max_break.map_or(MAX_DURATION, |m| m.get());
        if k <= 1 || self.multiplier <= 1.0 {
            return base;
        }
        let exponent = i32::try_from(k - 1).unwrap_or(i32::MAX);
        let grown = base as f64 * self.multiplier.powi(exponent);
        if !grown.is_finite() || grown >= cap as f64 {
            cap
        } else {
            grown.floor() as Millis
        }
    }
}

/// The order in which waiters are served (SPEC P3–P5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Order {
    /// The oldest waiter first; a new request waits behind every waiter.
    #[default]
    OldestFirst,
    /// The newest waiter first; a full queue evicts its oldest waiters.
    NewestFirst,
}

impl Order {
    /// The name used in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            Order::OldestFirst => "oldest_first",
            Order::NewestFirst => "newest_first",
        }
    }
}

/// A validated limiter kind with its settings (SPEC section 2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LimiterKind {
    /// At most `permits` held at once; permits come back with their ticket.
    Concurrency {
        /// The limit.
        permits: NonZeroU32,
    },
    /// Starts full; adds `refill` tokens at every whole multiple of `period`.
    TokenBucket {
        /// The most tokens the bucket holds (the limit).
        capacity: NonZeroU32,
        /// Tokens added per period, at most `capacity`.
        refill: NonZeroU32,
        /// The refill period in ms.
        period: NonZeroU64,
    },
    /// At most `permits` per aligned window.
    FixedWindow {
        /// The limit per window.
        permits: NonZeroU32,
        /// The window length in ms.
        window: NonZeroU64,
    },
    /// At most `permits` in the last `segments` aligned segments.
    SlidingWindow {
        /// The limit per window.
        permits: NonZeroU32,
        /// The window length in ms, a multiple of `segments`.
        window: NonZeroU64,
        /// How many segments the window is cut into.
        segments: NonZeroU32,
    },
    /// A concurrency limit learned between `min` and `max` (SPEC section 10).
    Adaptive {
        /// The lowest limit.
        min: NonZeroU32,
        /// The highest limit: P2's limit.
        max: NonZeroU32,
        /// The limit a fresh key starts at, from `min` to `max`.
        initial: NonZeroU32,
    },
}

impl LimiterKind {
    /// The most permits a single request can ever get (`permits` or `capacity`).
    pub fn limit(&self) -> u32 {
        match *self {
            LimiterKind::Concurrency { permits }
            | LimiterKind::FixedWindow { permits, .. }
            | LimiterKind::SlidingWindow { permits, .. } => permits.get(),
            LimiterKind::TokenBucket { capacity, .. } => capacity.get(),
            LimiterKind::Adaptive { max, .. } => max.get(),
        }
    }

    /// The kind's name, as written in the config.
    pub fn name(&self) -> &'static str {
        match self {
            LimiterKind::Concurrency { .. } => "concurrency",
            LimiterKind::TokenBucket { .. } => "token_bucket",
            LimiterKind::FixedWindow { .. } => "fixed_window",
            LimiterKind::SlidingWindow { .. } => "sliding_window",
            LimiterKind::Adaptive { .. } => "adaptive",
        }
    }

    /// True for the kinds whose permits are spent, not returned (P7), and
    /// so settled against a reported cost (U1): token bucket and windows.
    pub fn is_rate(&self) -> bool {
        !self.returns_permits()
    }

    /// True for the kinds whose permits come back with their ticket (P7):
    /// concurrency and adaptive.
    pub fn returns_permits(&self) -> bool {
        matches!(
            self,
            LimiterKind::Concurrency { .. } | LimiterKind::Adaptive { .. }
        )
    }
}

/// A validated limiter with its queue settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimiterPolicy {
    /// The algorithm.
    pub kind: LimiterKind,
    /// The most permits that waiters may ask for in total; 0 = no queue.
    pub queue_limit: u32,
    /// Which waiter is served first.
    pub order: Order,
}

/// Ticket lease settings (SPEC L2, L3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeasePolicy {
    /// The lease of a request that names none.
    pub default: NonZeroU64,
    /// The longest lease a request or renewal may get.
    pub max: NonZeroU64,
    /// How a ticket whose lease ends is settled: `Ignored` or `Failure`.
    pub expired_outcome: Outcome,
}

impl Default for LeasePolicy {
    fn default() -> Self {
        LeasePolicy {
            default: NonZeroU64::new(30_000).expect("non-zero"),
            max: NonZeroU64::new(300_000).expect("non-zero"),
            expired_outcome: Outcome::Ignored,
        }
    }
}

impl LeasePolicy {
    /// The lease a request or renewal gets: its own, capped by `max`, or the default.
    pub fn grant(&self, asked: Option<Millis>) -> Millis {
        asked.map_or(self.default.get(), |l| l.min(self.max.get()))
    }
}

/// A duration as written by people: whole milliseconds, or a string with a
/// unit (`"250ms"`, `"30s"`, `"5m"`, `"1h"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "DurationText", into = "DurationText")]
pub struct DurationSpec(pub Millis);

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(untagged)]
enum DurationText {
    Millis(u64),
    Text(String),
}

impl TryFrom<DurationText> for DurationSpec {
    type Error = String;
    fn try_from(value: DurationText) -> Result<Self, String> {
        match value {
            DurationText::Millis(ms) => Ok(DurationSpec(ms)),
            DurationText::Text(text) => parse_duration(&text).map(DurationSpec),
        }
    }
}

impl From<DurationSpec> for DurationText {
    fn from(value: DurationSpec) -> Self {
        DurationText::Text(format_duration(value.0))
    }
}

/// Parses `"250ms"`, `"30s"`, `"1.5s"`, `"5m"`, `"1h"`, `"2d"` into whole
/// milliseconds, exactly, rounding a fraction of a millisecond up (SPEC T1).
pub fn parse_duration(text: &str) -> Result<Millis, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let unit_ms: u128 = match unit.trim() {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        "" => {
            return Err(format!(
                "duration {text:?} has no unit: write it like \"250ms\", \"30s\" or \"5m\""
            ))
        }
        other => {
            return Err(format!(
                "duration {text:?} has an unknown unit {other:?}: use ms, s, m, h or d"
            ))
        }
    };
    let not_a_number = || format!("duration {text:?} is not a number followed by a unit");
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() || fraction.contains('.') || fraction.len() > 18 {
        return Err(not_a_number());
    }
    let whole: u128 = if whole.is_empty() {
        0
    } else {
        whole.parse().map_err(|_| not_a_number())?
    };
    let (numerator, denominator) = if fraction.is_empty() {
        (0u128, 1u128)
    } else {
        let digits: u128 = fraction.parse().map_err(|_| not_a_number())?;
        (digits, 10u128.pow(fraction.len() as u32))
    };
    let ms = whole
        .checked_mul(unit_ms)
        .and_then(|w| w.checked_add((numerator * unit_ms).div_ceil(denominator)))
        .filter(|&ms| ms <= u128::from(MAX_DURATION))
        .ok_or_else(|| format!("duration {text:?} is longer than 365 days"))?;
    Ok(ms as Millis)
}

/// Writes a duration in the largest unit that divides it.
pub fn format_duration(ms: Millis) -> String {
    const UNITS: [(Millis, &str); 4] = [
        (86_400_000, "d"),
        (3_600_000, "h"),
        (60_000, "m"),
        (1_000, "s"),
    ];
    for (size, unit) in UNITS {
        if ms >= size && ms.is_multiple_of(size) {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}

/// A policy as written in a config file or a vector, before validation.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicySpec {
    /// The breaker, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub breaker: Option<BreakerSpec>,
    /// The limiter, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limiter: Option<LimiterSpec>,
    /// Lease settings; absent means the defaults of Y3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<LeaseSpec>,
    /// False makes the policy a shadow (D1-D4); absent means true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enforce: Option<bool>,
    /// The retry budget (R1-R3), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_budget: Option<RetryBudgetSpec>,
}

/// A retry budget as written, before validation (SPEC R1-R3).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryBudgetSpec {
    /// Retries allowed per first attempt, in (0, 1].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ratio: Option<f64>,
    /// Retries always allowed per second of the window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_per_second: Option<u32>,
    /// The window: at least 1 s, a multiple of 10 ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<DurationSpec>,
}

/// Slow calls as written, before validation (SPEC S1-S3).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlowSpec {
    /// A call at least this old is slow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<DurationSpec>,
    /// The share of slow calls that trips the breaker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ratio: Option<f64>,
}

/// Bounded half-open as written, before validation (SPEC H1-H4).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HalfOpenSpec {
    /// Probe slots held at once (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probes: Option<u32>,
    /// Probe successes that close the breaker (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub successes: Option<u32>,
}

/// A breaker as written, before validation.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BreakerSpec {
    /// `consecutive` or `ratio`.
    pub mode: String,
    /// Consecutive mode: failures in a row that open the breaker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failures: Option<u32>,
    /// Ratio mode: the share of failures that opens the breaker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_ratio: Option<f64>,
    /// Ratio mode: the fewest outcomes in the window before judging.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minimum_throughput: Option<u32>,
    /// Ratio mode: the window's length.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampling_window: Option<DurationSpec>,
    /// The base break length.
    #[serde(rename = "break", default, skip_serializing_if = "Option::is_none")]
    pub break_: Option<DurationSpec>,
    /// Growth of consecutive breaks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multiplier: Option<f64>,
    /// The longest break.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_break: Option<DurationSpec>,
    /// How long a probe may hold the probe slot (default: `break`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_lease: Option<DurationSpec>,
    /// Slow calls (ratio mode only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slow: Option<SlowSpec>,
    /// Bounded half-open: probes at once and successes to close.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub half_open: Option<HalfOpenSpec>,
    /// Distinct callers whose failures a trip needs (at least 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quorum: Option<u32>,
}

/// A limiter as written, before validation.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimiterSpec {
    /// `concurrency`, `token_bucket`, `fixed_window` or `sliding_window`.
    pub kind: String,
    /// Concurrency and windows: the limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permits: Option<u32>,
    /// Token bucket: the most tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<u32>,
    /// Token bucket: tokens added per period.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refill: Option<u32>,
    /// Token bucket: the refill period.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period: Option<DurationSpec>,
    /// Windows: the window length.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<DurationSpec>,
    /// Sliding window: how many segments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub segments: Option<u32>,
    /// Adaptive: the lowest limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<u32>,
    /// Adaptive: the highest limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<u32>,
    /// Adaptive: the limit to start at (default `min`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial: Option<u32>,
    /// The most permits waiters may ask for in total (default 0: no queue).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_limit: Option<u32>,
    /// `oldest_first` (default) or `newest_first`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<String>,
}

/// Lease settings as written, before validation.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseSpec {
    /// The lease of a request that names none (default 30 s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<DurationSpec>,
    /// The longest lease (default 5 min).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<DurationSpec>,
    /// `IGNORED` (default) or `FAILURE`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expired_outcome: Option<String>,
}

/// An invalid policy, naming the field (SPEC Y2).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct PolicyError {
    /// The field's path, such as `breaker.failures`.
    pub field: String,
    /// What is wrong with it, in words.
    pub problem: String,
}

fn invalid(field: &str, problem: impl Into<String>) -> PolicyError {
    PolicyError {
        field: field.to_owned(),
        problem: problem.into(),
    }
}

fn required<T>(value: Option<T>, field: &str, context: &str) -> Result<T, PolicyError> {
    value.ok_or_else(|| invalid(field, format!("is required {context}")))
}

fn count(value: Option<u32>, field: &str, context: &str) -> Result<NonZeroU32, PolicyError> {
    NonZeroU32::new(required(value, field, context)?)
        .ok_or_else(|| invalid(field, "must be at least 1"))
}

fn duration(
    value: Option<DurationSpec>,
    field: &str,
    context: &str,
) -> Result<NonZeroU64, PolicyError> {
    positive(required(value, field, context)?, field)
}

fn positive(value: DurationSpec, field: &str) -> Result<NonZeroU64, PolicyError> {
    if value.0 > MAX_DURATION {
        return Err(invalid(field, "must be at most 365 days"));
    }
    NonZeroU64::new(value.0).ok_or_else(|| invalid(field, "must be longer than 0 ms"))
}

fn absent<T>(value: &Option<T>, field: &str, context: &str) -> Result<(), PolicyError> {
    match value {
        Some(_) => Err(invalid(field, format!("is not a setting {context}"))),
        None => Ok(()),
    }
}

impl PolicySpec {
    /// Checks every field and builds the policy, or names the first bad field.
    pub fn validate(&self) -> Result<Policy, PolicyError> {
        let breaker = self
            .breaker
            .as_ref()
            .map(BreakerSpec::validate)
            .transpose()?;
        let limiter = self
            .limiter
            .as_ref()
            .map(LimiterSpec::validate)
            .transpose()?;
        let lease = self
            .lease
            .as_ref()
            .map_or(Ok(LeasePolicy::default()), LeaseSpec::validate)?;
        if let Some(slow) = breaker.and_then(|b| b.slow) {
            // A call can be no older than its lease: a longer duration
            // would never see a slow call.
            if slow.duration > lease.max {
                return Err(invalid(
                    "breaker.slow.duration",
                    format!(
                        "({}) must not be above lease.max ({}): no call lives longer",
                        format_duration(slow.duration.get()),
                        format_duration(lease.max.get())
                    ),
                ));
            }
        }
        Ok(Policy {
            breaker,
            limiter,
            lease,
            retry_budget: self
                .retry_budget
                .as_ref()
                .map(RetryBudgetSpec::validate)
                .transpose()?,
            enforce: self.enforce.unwrap_or(true),
        })
    }
}

impl Policy {
    /// The spec this policy validates from: `policy.spec().validate()`
    /// gives the policy back. For keeping a policy set at run time.
    pub fn spec(&self) -> PolicySpec {
        let breaker = self.breaker.map(|b| {
            let mut spec = BreakerSpec {
                break_: Some(DurationSpec(b.break_ms.get())),
                multiplier: Some(b.multiplier),
                max_break: b.max_break.map(|m| DurationSpec(m.get())),
                probe_lease: Some(DurationSpec(b.probe_lease.get())),
                half_open: (b.half_open != HalfOpen::default()).then(|| HalfOpenSpec {
                    probes: Some(b.half_open.probes.get()),
                    successes: Some(b.half_open.successes.get()),
                }),
                quorum: b.quorum.map(NonZeroU32::get),
                slow: b.slow.map(|s| SlowSpec {
                    duration: Some(DurationSpec(s.duration.get())),
                    ratio: Some(s.ratio_millionths as f64 / 1_000_000.0),
                }),
                ..BreakerSpec::default()
            };
            match b.trip {
                Trip::Consecutive { failures } => {
                    spec.mode = "consecutive".into();
                    spec.failures = Some(failures.get());
                }
                Trip::Ratio {
                    failure_ratio,
                    minimum_throughput,
                    sampling_window,
                } => {
                    spec.mode = "ratio".into();
                    spec.failure_ratio = Some(failure_ratio);
                    spec.minimum_throughput = Some(minimum_throughput.get());
                    spec.sampling_window = Some(DurationSpec(sampling_window));
                }
            }
            spec
        });
        let limiter = self.limiter.map(|l| {
            let mut spec = LimiterSpec {
                kind: l.kind.name().into(),
                queue_limit: Some(l.queue_limit),
                order: Some(l.order.as_str().into()),
                ..LimiterSpec::default()
            };
            match l.kind {
                LimiterKind::Concurrency { permits } => spec.permits = Some(permits.get()),
                LimiterKind::TokenBucket {
                    capacity,
                    refill,
                    period,
                } => {
                    spec.capacity = Some(capacity.get());
                    spec.refill = Some(refill.get());
                    spec.period = Some(DurationSpec(period.get()));
                }
                LimiterKind::FixedWindow { permits, window } => {
                    spec.permits = Some(permits.get());
                    spec.window = Some(DurationSpec(window.get()));
                }
                LimiterKind::SlidingWindow {
                    permits,
                    window,
                    segments,
                } => {
                    spec.permits = Some(permits.get());
                    spec.window = Some(DurationSpec(window.get()));
                    spec.segments = Some(segments.get());
                }
                LimiterKind::Adaptive { min, max, initial } => {
                    spec.min = Some(min.get());
                    spec.max = Some(max.get());
                    spec.initial = Some(initial.get());
                }
            }
            spec
        });
        let lease = LeaseSpec {
            default: Some(DurationSpec(self.lease.default.get())),
            max: Some(DurationSpec(self.lease.max.get())),
            expired_outcome: Some(self.lease.expired_outcome.as_str().into()),
        };
        PolicySpec {
            breaker,
            limiter,
            lease: Some(lease),
            retry_budget: self.retry_budget.map(|r| RetryBudgetSpec {
                ratio: Some(r.ratio_millionths as f64 / 1_000_000.0),
                min_per_second: Some(r.min_per_second),
                window: Some(DurationSpec(r.window.get())),
            }),
            // Written only when false, so an enforcing policy's JSON (and
            // its id) is what it was before shadow policies existed.
            enforce: (!self.enforce).then_some(false),
        }
    }
}

impl BreakerSpec {
    /// Checks every field of the breaker.
    pub fn validate(&self) -> Result<BreakerPolicy, PolicyError> {
        let trip = match self.mode.as_str() {
            "consecutive" => {
                let ctx = "in consecutive mode";
                absent(&self.failure_ratio, "breaker.failure_ratio", ctx)?;
                absent(&self.minimum_throughput, "breaker.minimum_throughput", ctx)?;
                absent(&self.sampling_window, "breaker.sampling_window", ctx)?;
                Trip::Consecutive {
                    failures: count(self.failures, "breaker.failures", ctx)?,
                }
            }
            "ratio" => {
                let ctx = "in ratio mode";
                absent(&self.failures, "breaker.failures", ctx)?;
                let failure_ratio = required(self.failure_ratio, "breaker.failure_ratio", ctx)?;
                if !(failure_ratio > 0.0 && failure_ratio <= 1.0) {
                    return Err(invalid(
                        "breaker.failure_ratio",
                        format!("must be above 0 and at most 1, not {failure_ratio}"),
                    ));
                }
                let minimum_throughput =
                    count(self.minimum_throughput, "breaker.minimum_throughput", ctx)?;
                let sampling_window =
                    duration(self.sampling_window, "breaker.sampling_window", ctx)?.get();
                if sampling_window < 10 {
                    return Err(invalid(
                        "breaker.sampling_window",
                        format!("must be at least 10ms, not {sampling_window}ms"),
                    ));
                }
                Trip::Ratio {
                    failure_ratio,
                    minimum_throughput,
                    sampling_window,
                }
            }
            other => {
                return Err(invalid(
                    "breaker.mode",
                    format!("must be \"consecutive\" or \"ratio\", not {other:?}"),
                ))
            }
        };
        let break_ms = duration(self.break_, "breaker.break", "for a breaker")?;
        let multiplier = self.multiplier.unwrap_or(1.0);
        if !(multiplier.is_finite() && multiplier >= 1.0) {
            return Err(invalid(
                "breaker.multiplier",
                format!("must be at least 1, not {multiplier}"),
            ));
        }
        let max_break = self
            .max_break
            .map(|m| positive(m, "breaker.max_break"))
            .transpose()?;
        if let Some(max) = max_break {
            if max < break_ms {
                return Err(invalid(
                    "breaker.max_break",
                    format!(
                        "({}) must not be shorter than breaker.break ({})",
                        format_duration(max.get()),
                        format_duration(break_ms.get())
                    ),
                ));
            }
        }
        let probe_lease = self
            .probe_lease
            .map(|p| positive(p, "breaker.probe_lease"))
            .transpose()?
            .unwrap_or(break_ms);
        let slow = match (&self.slow, trip) {
            (None, _) => None,
            (Some(_), Trip::Consecutive { .. }) => {
                return Err(invalid(
                    "breaker.slow",
                    "is not a setting in consecutive mode: slow calls need mode = \"ratio\"",
                ))
            }
            (Some(spec), Trip::Ratio { .. }) => Some(spec.validate()?),
        };
        let quorum = self
            .quorum
            .map(|k| {
                if (2..=MAX_QUORUM).contains(&k) {
                    Ok(NonZeroU32::new(k).expect("at least 2"))
                } else {
                    Err(invalid(
                        "breaker.quorum",
                        format!(
                            "must be from 2 to {MAX_QUORUM} distinct callers, not {k}; leave it out for no quorum"
                        ),
                    ))
                }
            })
            .transpose()?;
        let half_open = self
            .half_open
            .as_ref()
            .map_or(Ok(HalfOpen::default()), HalfOpenSpec::validate)?;
        Ok(BreakerPolicy {
            trip,
            break_ms,
            multiplier,
            max_break,
            probe_lease,
            half_open,
            quorum,
            slow,
        })
    }
}

impl SlowSpec {
    /// Checks both fields: `duration` above 0 (at most `lease.max`, which
    /// the policy checks), `ratio` in (0, 1]; both required.
    pub fn validate(&self) -> Result<Slow, PolicyError> {
        let ctx = "for slow calls";
        let duration = duration(self.duration, "breaker.slow.duration", ctx)?;
        let ratio = required(self.ratio, "breaker.slow.ratio", ctx)?;
        if !(ratio > 0.0 && ratio <= 1.0) {
            return Err(invalid(
                "breaker.slow.ratio",
                format!("must be above 0 and at most 1, not {ratio}"),
            ));
        }
        // Taken to 6 decimals, a ratio under 0.0000005 would be 0: every
        // outcome would trip. Refused, so that a policy reads back as set.
        let ratio_millionths = millionths(ratio);
        if ratio_millionths == 0 {
            return Err(invalid(
                "breaker.slow.ratio",
                format!("is taken to 6 decimals and must be at least 0.000001, not {ratio}"),
            ));
        }
        Ok(Slow {
            duration,
            ratio_millionths,
        })
    }
}

impl RetryBudgetSpec {
    /// Checks the budget: `ratio` in (0, 1], `min_per_second` (absent =
    /// 0, as on the wire), `window` at least 1 s and a multiple of 10 ms.
    pub fn validate(&self) -> Result<RetryBudget, PolicyError> {
        let ctx = "for a retry budget";
        let ratio = required(self.ratio, "retry_budget.ratio", ctx)?;
        if !(ratio > 0.0 && ratio <= 1.0) {
            return Err(invalid(
                "retry_budget.ratio",
                format!("must be above 0 and at most 1, not {ratio}"),
            ));
        }
        let min_per_second = self.min_per_second.unwrap_or(0);
        let window = duration(self.window, "retry_budget.window", ctx)?;
        if window.get() < 1_000 || !window.get().is_multiple_of(10) {
            return Err(invalid(
                "retry_budget.window",
                format!(
                    "must be at least 1s and a multiple of 10ms, not {}",
                    format_duration(window.get())
                ),
            ));
        }
        Ok(RetryBudget {
            ratio_millionths: millionths(ratio),
            min_per_second,
            window,
        })
    }
}

impl HalfOpenSpec {
    /// Checks both counts: each from 1 to [`MAX_HALF_OPEN`], absent = 1.
    pub fn validate(&self) -> Result<HalfOpen, PolicyError> {
        let bounded = |value: Option<u32>, field: &str| match value {
            None => Ok(NonZeroU32::new(1).expect("non-zero")),
            Some(n) if n > MAX_HALF_OPEN => Err(invalid(
                field,
                format!("must be at most {MAX_HALF_OPEN}, not {n}"),
            )),
            Some(n) => NonZeroU32::new(n).ok_or_else(|| invalid(field, "must be at least 1")),
        };
        Ok(HalfOpen {
            probes: bounded(self.probes, "breaker.half_open.probes")?,
            successes: bounded(self.successes, "breaker.half_open.successes")?,
        })
    }
}

impl LimiterSpec {
    /// Checks every field of the limiter.
    pub fn validate(&self) -> Result<LimiterPolicy, PolicyError> {
        let kind = match self.kind.as_str() {
            "concurrency" => {
                let ctx = "for a concurrency limiter";
                absent(&self.min, "limiter.min", ctx)?;
                absent(&self.max, "limiter.max", ctx)?;
                absent(&self.initial, "limiter.initial", ctx)?;
                absent(&self.capacity, "limiter.capacity", ctx)?;
                absent(&self.refill, "limiter.refill", ctx)?;
                absent(&self.period, "limiter.period", ctx)?;
                absent(&self.window, "limiter.window", ctx)?;
                absent(&self.segments, "limiter.segments", ctx)?;
                LimiterKind::Concurrency {
                    permits: count(self.permits, "limiter.permits", ctx)?,
                }
            }
            "token_bucket" => {
                let ctx = "for a token bucket";
                absent(&self.min, "limiter.min", ctx)?;
                absent(&self.max, "limiter.max", ctx)?;
                absent(&self.initial, "limiter.initial", ctx)?;
                absent(&self.permits, "limiter.permits", ctx)?;
                absent(&self.window, "limiter.window", ctx)?;
                absent(&self.segments, "limiter.segments", ctx)?;
                let capacity = count(self.capacity, "limiter.capacity", ctx)?;
                let refill = count(self.refill, "limiter.refill", ctx)?;
                let period = duration(self.period, "limiter.period", ctx)?;
                if refill > capacity {
                    return Err(invalid(
                        "limiter.refill",
                        format!("({refill}) must not be above limiter.capacity ({capacity})"),
                    ));
                }
                LimiterKind::TokenBucket {
                    capacity,
                    refill,
                    period,
                }
            }
            "fixed_window" => {
                let ctx = "for a fixed window";
                absent(&self.min, "limiter.min", ctx)?;
                absent(&self.max, "limiter.max", ctx)?;
                absent(&self.initial, "limiter.initial", ctx)?;
                absent(&self.capacity, "limiter.capacity", ctx)?;
                absent(&self.refill, "limiter.refill", ctx)?;
                absent(&self.period, "limiter.period", ctx)?;
                absent(&self.segments, "limiter.segments", ctx)?;
                LimiterKind::FixedWindow {
                    permits: count(self.permits, "limiter.permits", ctx)?,
                    window: duration(self.window, "limiter.window", ctx)?,
                }
            }
            "sliding_window" => {
                let ctx = "for a sliding window";
                absent(&self.min, "limiter.min", ctx)?;
                absent(&self.max, "limiter.max", ctx)?;
                absent(&self.initial, "limiter.initial", ctx)?;
                absent(&self.capacity, "limiter.capacity", ctx)?;
                absent(&self.refill, "limiter.refill", ctx)?;
                absent(&self.period, "limiter.period", ctx)?;
                let permits = count(self.permits, "limiter.permits", ctx)?;
                let window = duration(self.window, "limiter.window", ctx)?;
                let segments = count(self.segments, "limiter.segments", ctx)?;
                if !window.get().is_multiple_of(u64::from(segments.get())) {
                    return Err(invalid(
                        "limiter.segments",
                        format!(
                            "({segments}) must divide limiter.window ({}) into whole milliseconds",
                            format_duration(window.get())
                        ),
                    ));
                }
                LimiterKind::SlidingWindow {
                    permits,
                    window,
                    segments,
                }
            }
            "adaptive" => {
                let ctx = "for an adaptive limiter";
                absent(&self.permits, "limiter.permits", ctx)?;
                absent(&self.capacity, "limiter.capacity", ctx)?;
                absent(&self.refill, "limiter.refill", ctx)?;
                absent(&self.period, "limiter.period", ctx)?;
                absent(&self.window, "limiter.window", ctx)?;
                absent(&self.segments, "limiter.segments", ctx)?;
                let min = count(self.min, "limiter.min", ctx)?;
                let max = count(self.max, "limiter.max", ctx)?;
                if max < min {
                    return Err(invalid(
                        "limiter.max",
                        format!("({max}) must not be below limiter.min ({min})"),
                    ));
                }
                let initial = match self.initial {
                    None => min,
                    Some(n) if n < min.get() || n > max.get() => {
                        return Err(invalid(
                            "limiter.initial",
                            format!("({n}) must be from limiter.min ({min}) to limiter.max ({max})"),
                        ))
                    }
                    Some(n) => NonZeroU32::new(n).expect("at least min, which is at least 1"),
                };
                LimiterKind::Adaptive { min, max, initial }
            }
            other => {
                return Err(invalid(
                    "limiter.kind",
                    format!(
                        "must be \"concurrency\", \"token_bucket\", \"fixed_window\", \"sliding_window\" or \"adaptive\", not {other:?}"
                    ),
                ))
            }
        };
        let order = match self.order.as_deref() {
            None | Some("oldest_first") => Order::OldestFirst,
            Some("newest_first") => Order::NewestFirst,
            Some(other) => {
                return Err(invalid(
                    "limiter.order",
                    format!("must be \"oldest_first\" or \"newest_first\", not {other:?}"),
                ))
            }
        };
        Ok(LimiterPolicy {
            kind,
            queue_limit: self.queue_limit.unwrap_or(0),
            order,
        })
    }
}

impl LeaseSpec {
    /// Checks every lease setting.
    pub fn validate(&self) -> Result<LeasePolicy, PolicyError> {
        let defaults = LeasePolicy::default();
        let default = self
            .default
            .map(|d| positive(d, "lease.default"))
            .transpose()?
            .unwrap_or(defaults.default);
        let max = self
            .max
            .map(|m| positive(m, "lease.max"))
            .transpose()?
            .unwrap_or(defaults.max);
        if default > max {
            return Err(invalid(
                "lease.default",
                format!(
                    "({}) must not be above lease.max ({})",
                    format_duration(default.get()),
                    format_duration(max.get())
                ),
            ));
        }
        // Written exactly as the config writes outcomes (upper case), and
        // never SUCCESS: a lost caller is no evidence of health.
        let allowed = [Outcome::Ignored, Outcome::Failure];
        let expired_outcome = match self.expired_outcome.as_deref() {
            None => Outcome::Ignored,
            Some(text) => allowed
                .into_iter()
                .find(|o| o.as_str() == text)
                .ok_or_else(|| {
                    invalid(
                        "lease.expired_outcome",
                        format!(
                            "must be {:?} or {:?}, not {text:?}",
                            Outcome::Ignored.as_str(),
                            Outcome::Failure.as_str()
                        ),
                    )
                })?,
        };
        Ok(LeasePolicy {
            default,
            max,
            expired_outcome,
        })
    }
}

#[cfg(test)]
mod tests;

//! The JSON forms the dashboard reads: a key, a transition, the totals.

use serde::Serialize;

use crate::domain::{HalfOpen, Millis, Phase};
use crate::engine::{Core, Event, EventKind, KeyReading, Totals};

/// A key as the dashboard shows it.
#[derive(Clone, Debug, Serialize)]
pub struct KeyJson {
    /// The key.
    pub key: String,
    /// `CLOSED`, `OPEN`, `HALF_OPEN` or `ISOLATED`.
    pub phase: &'static str,
    /// Time left in the break when open (0 once it is over).
    pub open_remaining_ms: Option<Millis>,
    /// When the phase last changed, in ms since the Unix epoch.
    pub phase_changed_at_ms: u64,
    /// Failures in a row.
    pub consecutive_failures: u32,
    /// Probes admitted since the breaker last closed.
    pub half_open_attempts: u32,
    /// Probe slots held now (H1); 0 unless half-open.
    pub probes_held: u32,
    /// Probe successes counted in this half-open period (H2); 0 unless
    /// half-open.
    pub half_open_successes: u32,
    /// The adaptive limiter's limit in force now; 0 without one.
    pub adaptive_limit: u32,
    /// The key's policy's `breaker.half_open` in force now: the slots a
    /// half-open period may hold at once and the successes that close it
    /// (`null` without a breaker).
    pub half_open: Option<HalfOpenJson>,
    /// Share of failures in the sampling window (ratio mode only).
    pub failure_ratio: Option<f64>,
    /// Live slow calls (S2): current closed-period tickets at least
    /// `breaker.slow.duration` old.
    pub live_slow: u32,
    /// Tickets that became slow, live or at completion, each once.
    pub slow_calls: u64,
    /// Slow outcomes in the window and live slow calls, as a share of the
    /// outcomes in the window and live slow calls (S3 (b)); `null` without
    /// `breaker.slow` or with nothing to share.
    pub slow_ratio: Option<f64>,
    /// The key's policy's `breaker.slow` in force now: `duration_ms` and
    /// `ratio` (`null` without one).
    pub slow: Option<SlowJson>,
    /// Permits free now (0 without a limiter).
    pub free: u32,
    /// The limiter's limit (0 without a limiter).
    pub limit: u32,
    /// Permits asked for by waiters.
    pub queued: u64,
    /// Waiting requests.
    pub waiters: usize,
    /// Live tickets.
    pub live_tickets: usize,
    /// Answers to acquires since the key was made.
    pub requests: u64,
    /// Of which blocked, refused or denied (the retry budget's denials
    /// included); a shadow policy's shadow grants are not turned away.
    pub turned_away: u64,
    /// True when the key's policy in force is a shadow (`enforce = false`,
    /// D1): it counts what it would block or deny and grants it.
    pub shadow_policy: bool,
    /// Requests granted by a shadow policy that would have blocked or
    /// denied them (D2), counted in `requests` under what they would have
    /// had.
    pub shadow: u64,
    /// Outcomes recorded as failures.
    pub failures: u64,
    /// Outcomes recorded as successes.
    pub successes: u64,
}

/// A policy's `breaker.half_open`, as the dashboard shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct HalfOpenJson {
    /// Probe slots a half-open period may hold at once (1 to 1000).
    pub probes: u32,
    /// Probe successes in one half-open period that close the breaker (1
    /// to 1000).
    pub successes: u32,
}

impl HalfOpenJson {
    /// The JSON form of a validated `half_open`.
    pub fn of(h: HalfOpen) -> HalfOpenJson {
        HalfOpenJson {
            probes: h.probes.get(),
            successes: h.successes.get(),
        }
    }
}

/// Milliseconds since the Unix epoch of an engine time.
pub fn unix_ms(core: &Core, at: Millis) -> u64 {
    core.wall_time(at)
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl KeyJson {
    /// The JSON form of a reading.
    pub fn of(core: &Core, r: &KeyReading) -> KeyJson {
        let v = &r.view;
        let s = &v.stats;
        let policy = core.policy_for(&r.key);
        KeyJson {
            key: r.key.clone(),
            phase: v.phase.as_str(),
            open_remaining_ms: v.open_until.map(|until| until.saturating_sub(r.now)),
            phase_changed_at_ms: unix_ms(core, v.changed_at),
            consecutive_failures: v.consecutive_failures,
            half_open_attempts: v.half_open_attempts,
            probes_held: v.probes_held,
            half_open_successes: v.half_open_successes,
            adaptive_limit: v.adaptive_limit,
            half_open: policy.breaker.map(|b| HalfOpenJson::of(b.half_open)),
            failure_ratio: v.failure_ratio.filter(|f| f.is_finite()),
            live_slow: v.live_slow,
            slow_calls: s.slow,
            slow_ratio: v.slow_ratio.filter(|f| f.is_finite()),
            slow: core
                .policy_for(&r.key)
                .breaker
                .and_then(|b| b.slow)
                .map(|s| SlowJson {
                    duration_ms: s.duration.get(),
                    ratio: s.ratio_millionths as f64 / 1_000_000.0,
                }),
            free: v.free,
            limit: v.limit,
            queued: v.queued,
            waiters: v.waiters,
            live_tickets: v.live_tickets,
            requests: s.granted + s.probes + s.blocked + s.refused + s.denied + s.retry_denied,
            turned_away: (s.blocked + s.refused + s.denied + s.retry_denied)
                .saturating_sub(s.shadow),
            shadow_policy: !policy.enforce,
            shadow: s.shadow,
            failures: s.failures,
            successes: s.successes,
        }
    }
}

/// A key's `breaker.slow`, for the dashboard.
#[derive(Clone, Debug, Serialize)]
pub struct SlowJson {
    /// The age from which a call is slow, in ms.
    pub duration_ms: Millis,
    /// The slow share that trips the breaker.
    pub ratio: f64,
}

/// A phase change, isolate or close, for the timeline.
#[derive(Clone, Debug, Serialize)]
pub struct TransitionJson {
    /// The event's number (unique; later events of a key have larger ones).
    pub sequence: u64,
    /// The key.
    pub key: String,
    /// `phase_change`, `isolate`, `close` or `policy`.
    pub kind: &'static str,
    /// The phase before.
    pub from: &'static str,
    /// The phase after.
    pub to: &'static str,
    /// Why, in words.
    pub cause: &'static str,
    /// Who asked (isolate and close).
    pub who: String,
    /// The operator's reason (isolate and close).
    pub reason: String,
    /// When, in ms since the Unix epoch.
    pub at_ms: u64,
}

impl TransitionJson {
    /// The JSON form of an event.
    pub fn of(core: &Core, e: &Event) -> TransitionJson {
        TransitionJson {
            sequence: e.sequence,
            key: e.key.to_string(),
            kind: match e.kind {
                EventKind::PhaseChange => "phase_change",
                EventKind::Isolate => "isolate",
                EventKind::Close => "close",
                EventKind::Policy => "policy",
            },
            from: e.from.as_str(),
            to: e.to.as_str(),
            cause: e.cause,
            who: e.who.clone(),
            reason: e.reason.clone(),
            at_ms: unix_ms(core, e.at),
        }
    }
}

/// Keys by phase, named as phases are written.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct PhaseCounts {
    /// Closed keys.
    #[serde(rename = "CLOSED")]
    pub closed: u64,
    /// Open keys.
    #[serde(rename = "OPEN")]
    pub open: u64,
    /// Half-open keys.
    #[serde(rename = "HALF_OPEN")]
    pub half_open: u64,
    /// Isolated keys.
    #[serde(rename = "ISOLATED")]
    pub isolated: u64,
}

/// Engine-wide figures, as the dashboard shows them.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct TotalsJson {
    /// Live keys.
    pub keys: u64,
    /// Live keys by phase.
    pub by_phase: PhaseCounts,
    /// Live tickets.
    pub tickets: u64,
    /// Waiting requests.
    pub waiters: u64,
    /// The cap on live keys.
    pub max_keys: u64,
}

impl TotalsJson {
    /// The JSON form of the engine's totals.
    pub fn of(totals: &Totals, max_keys: u64) -> TotalsJson {
        let n = |p: Phase| totals.by_phase[p.index()];
        TotalsJson {
            keys: totals.keys,
            by_phase: PhaseCounts {
                closed: n(Phase::Closed),
                open: n(Phase::Open),
                half_open: n(Phase::HalfOpen),
                isolated: n(Phase::Isolated),
            },
            tickets: totals.tickets,
            waiters: totals.waiters,
            max_keys,
        }
    }
}

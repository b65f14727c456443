//! Engine values in their wire forms, and wire values read back with
//! errors that name the field: reasons, outcomes, phases, prefixes and a
//! key's state.

use std::net::IpAddr;

use tonic::Status;

use crate::auth::Grant;
use crate::domain::{DecisionKind, Outcome, Phase, Reason};
use crate::engine::{Core, KeyReading};
use crate::proto::v1 as pb;
use crate::proto::wire::{duration_of, phase_of, timestamp_of};

use super::status::invalid;

/// The wire form of a reason.
pub fn reason_of(r: Reason) -> pb::Reason {
    match r {
        Reason::Open => pb::Reason::Open,
        Reason::ProbeInFlight => pb::Reason::ProbeInFlight,
        Reason::NoPermits => pb::Reason::NoPermits,
        Reason::QueueFull => pb::Reason::QueueFull,
        Reason::ExceedsLimit => pb::Reason::ExceedsLimit,
        Reason::Evicted => pb::Reason::Evicted,
        Reason::Timeout => pb::Reason::Timeout,
        Reason::RetryBudget => pb::Reason::RetryBudget,
    }
}

/// The wire form of a decision's kind (a shadow grant's would-be
/// decision, D1: `BLOCKED` or `DENIED`).
pub fn decision_of_kind(kind: DecisionKind) -> pb::Decision {
    match kind {
        // A would-be QUEUED never arises (D3); the wire has no queued.
        DecisionKind::Granted | DecisionKind::Shadow | DecisionKind::Queued => {
            pb::Decision::Granted
        }
        DecisionKind::Probe => pb::Decision::Probe,
        DecisionKind::Blocked => pb::Decision::Blocked,
        DecisionKind::Refused => pb::Decision::Refused,
        DecisionKind::Denied => pb::Decision::Denied,
    }
}

/// Reads an outcome, refusing `OUTCOME_UNSPECIFIED` and unknown values.
pub fn outcome_of(value: i32) -> Result<Outcome, Status> {
    match pb::Outcome::try_from(value) {
        Ok(pb::Outcome::Success) => Ok(Outcome::Success),
        Ok(pb::Outcome::Failure) => Ok(Outcome::Failure),
        Ok(pb::Outcome::Ignored) => Ok(Outcome::Ignored),
        Ok(pb::Outcome::Unspecified) => Err(invalid(
            "outcome",
            "is OUTCOME_UNSPECIFIED; send OUTCOME_SUCCESS, OUTCOME_FAILURE or OUTCOME_IGNORED",
        )),
        Err(_) => Err(invalid(
            "outcome",
            format!("{value} is not an Outcome; send OUTCOME_SUCCESS, OUTCOME_FAILURE or OUTCOME_IGNORED"),
        )),
    }
}

/// The wire form of a key's state; `core` gives wall-clock times.
pub fn key_state_of(core: &Core, r: &KeyReading) -> pb::KeyState {
    let v = &r.view;
    let st = &v.stats;
    pb::KeyState {
        key: r.key.clone(),
        phase: phase_of(v.phase) as i32,
        consecutive_failures: v.consecutive_failures,
        half_open_attempts: v.half_open_attempts,
        open_remaining: v
            .open_until
            .map(|until| duration_of(until.saturating_sub(r.now))),
        free: v.free,
        queued: u32::try_from(v.queued).unwrap_or(u32::MAX),
        live_tickets: u32::try_from(v.live_tickets).unwrap_or(u32::MAX),
        waiters: u32::try_from(v.waiters).unwrap_or(u32::MAX),
        stats: Some(pb::KeyStats {
            granted: st.granted,
            probes: st.probes,
            blocked: st.blocked,
            refused: st.refused,
            denied: st.denied,
            by_reason: Reason::ALL
                .iter()
                .map(|r| (r.as_str().to_owned(), st.by_reason[*r as usize]))
                .filter(|(_, n)| *n > 0)
                .collect(),
            queued: st.queued,
            evicted: st.evicted,
            timed_out: st.timed_out,
            withdrawn: st.withdrawn,
            successes: st.successes,
            failures: st.failures,
            ignored: st.ignored,
            stale: st.stale,
            expired: st.expired,
            retry_denied: st.retry_denied,
            slow: st.slow,
            shadow: st.shadow,
        }),
        failure_ratio: v.failure_ratio,
        phase_changed_at: Some(timestamp_of(core.wall_time(v.changed_at))),
        limit: v.limit,
        probes_held: v.probes_held,
        half_open_successes: v.half_open_successes,
        live_slow: v.live_slow,
        adaptive_limit: v.adaptive_limit,
    }
}

pub use crate::domain::quorum::MAX_CALLER_BYTES;

/// Checks an Acquire's `caller` (Q1): empty (absent), or a name that
/// follows the key rules (K1) in at most 128 bytes.
pub fn check_caller(caller: &str) -> Result<(), Status> {
    if caller.len() > MAX_CALLER_BYTES {
        return Err(invalid(
            "caller",
            format!(
                "must be at most {MAX_CALLER_BYTES} bytes, not {}; send a short name for the calling service or pod",
                caller.len()
            ),
        ));
    }
    if caller.chars().any(crate::domain::key::is_control) {
        return Err(invalid("caller", "must not contain control characters"));
    }
    Ok(())
}

/// Who calls (Q1): with authentication, the credential's name (the
/// Acquire's `caller` is then ignored); without, the Acquire's `caller`;
/// without either, the peer's IP address without its port, an
/// IPv4-mapped IPv6 address written as IPv4. A credential's name longer
/// than a caller may be is cut to [`MAX_CALLER_BYTES`].
pub fn caller_of(grant: Option<&Grant>, caller: String, peer: Option<IpAddr>) -> String {
    match (grant, peer) {
        (Some(grant), _) => {
            let name = &grant.name;
            let mut end = name.len().min(MAX_CALLER_BYTES);
            while !name.is_char_boundary(end) {
                end -= 1;
            }
            name[..end].to_owned()
        }
        (None, _) if !caller.is_empty() => caller,
        (None, Some(ip)) => ip.to_canonical().to_string(),
        (None, None) => String::new(),
    }
}

/// Checks a key prefix: at most 256 bytes, no control characters.
pub fn check_prefix(prefix: &str) -> Result<(), Status> {
    if prefix.len() > crate::domain::key::MAX_KEY_BYTES {
        return Err(invalid("prefix", "must be at most 256 bytes"));
    }
    if prefix.chars().any(crate::domain::key::is_control) {
        return Err(invalid("prefix", "must not contain control characters"));
    }
    Ok(())
}

/// Reads a list of phases.
pub fn phases_of(values: &[i32]) -> Result<Vec<Phase>, Status> {
    values
        .iter()
        .map(|&v| match pb::Phase::try_from(v) {
            Ok(pb::Phase::Closed) => Ok(Phase::Closed),
            Ok(pb::Phase::Open) => Ok(Phase::Open),
            Ok(pb::Phase::HalfOpen) => Ok(Phase::HalfOpen),
            Ok(pb::Phase::Isolated) => Ok(Phase::Isolated),
            _ => Err(invalid("phases", format!("{v} is not a phase"))),
        })
        .collect()
}

//! What the commands print: keys, decisions and transitions in words and
//! in JSON, and times and durations for people.

use anyhow::{bail, Context};
use fusebox_proto::v1 as pb;
use fusebox_proto::wire::millis_of;

/// A phase as the contract writes it: `CLOSED`, `HALF_OPEN`, ...
pub(crate) fn phase_name(value: i32) -> &'static str {
    match pb::Phase::try_from(value) {
        Ok(pb::Phase::Closed) => "CLOSED",
        Ok(pb::Phase::Open) => "OPEN",
        Ok(pb::Phase::HalfOpen) => "HALF_OPEN",
        Ok(pb::Phase::Isolated) => "ISOLATED",
        _ => "UNSPECIFIED",
    }
}

/// A wire duration in milliseconds; none when absent or not one.
pub(crate) fn ms(d: Option<prost_types::Duration>) -> Option<u64> {
    millis_of("duration", d).ok().flatten()
}

/// Prints an Acquire's answer: the decision, the ticket, why, when to
/// retry, the lease and the phase.
pub(crate) fn print_acquire(r: &pb::AcquireResponse, json: bool) -> anyhow::Result<()> {
    let decision = pb::Decision::try_from(r.decision)
        .map(|d| d.as_str_name().trim_start_matches("DECISION_"))
        .unwrap_or("UNSPECIFIED");
    let reason = reason_name(r.reason);
    // On a shadow policy (D1): what the request would have had.
    let shadow = pb::Decision::try_from(r.shadow_decision)
        .ok()
        .filter(|d| *d != pb::Decision::Unspecified)
        .map(|d| d.as_str_name().trim_start_matches("DECISION_"));
    let shadow_reason = reason_name(r.shadow_reason);
    if json {
        println!(
            "{}",
            serde_json::json!({
                "decision": decision,
                "ticket": (!r.ticket.is_empty()).then_some(&r.ticket),
                "reason": reason,
                "retry_after_ms": ms(r.retry_after),
                "lease_ms": ms(r.lease),
                "phase": phase_name(r.phase),
                "shadow_decision": shadow,
                "shadow_reason": shadow_reason,
            })
        );
        return Ok(());
    }
    let mut line = decision.to_owned();
    if let Some(would) = shadow {
        line.push_str(&format!(" (shadow policy: would be {would}"));
        if let Some(why) = &shadow_reason {
            line.push_str(&format!(" {why}"));
        }
        line.push(')');
    }
    if !r.ticket.is_empty() {
        line.push_str(&format!("  ticket {}", r.ticket));
    }
    if let Some(reason) = reason {
        line.push_str(&format!("  reason {reason}"));
    }
    if let Some(retry) = ms(r.retry_after) {
        line.push_str(&format!("  retry after {retry}ms"));
    }
    if let Some(lease) = ms(r.lease) {
        line.push_str(&format!("  lease {lease}ms"));
    }
    line.push_str(&format!("  phase {}", phase_name(r.phase)));
    println!("{line}");
    Ok(())
}

/// A reason as the vectors write it (`no_permits`); none when unspecified.
fn reason_name(value: i32) -> Option<String> {
    pb::Reason::try_from(value)
        .ok()
        .filter(|r| *r != pb::Reason::Unspecified)
        .map(|r| r.as_str_name().trim_start_matches("REASON_").to_lowercase())
}

/// Prints a key's breaker and permits.
pub(crate) fn print_key(s: &pb::KeyState, json: bool) -> anyhow::Result<()> {
    if s.key.is_empty() {
        bail!("the server answered without a key");
    }
    let open_remaining = ms(s.open_remaining);
    if json {
        println!(
            "{}",
            serde_json::json!({
                "key": s.key,
                "phase": phase_name(s.phase),
                "consecutive_failures": s.consecutive_failures,
                "half_open_attempts": s.half_open_attempts,
                "probes_held": s.probes_held,
                "half_open_successes": s.half_open_successes,
                "live_slow": s.live_slow,
                "adaptive_limit": s.adaptive_limit,
                "open_remaining_ms": open_remaining,
                "free": s.free,
                "queued": s.queued,
                "live_tickets": s.live_tickets,
                "waiters": s.waiters,
                "shadow": s.stats.as_ref().map_or(0, |st| st.shadow),
            })
        );
        return Ok(());
    }
    println!("key                   {}", s.key);
    match open_remaining {
        Some(left) => println!(
            "phase                 {} ({left}ms left in the break)",
            phase_name(s.phase)
        ),
        None => println!("phase                 {}", phase_name(s.phase)),
    }
    println!("consecutive failures  {}", s.consecutive_failures);
    println!("half-open attempts    {}", s.half_open_attempts);
    println!("probe slots held      {}", s.probes_held);
    println!("half-open successes   {}", s.half_open_successes);
    println!("live slow calls       {}", s.live_slow);
    if s.adaptive_limit > 0 {
        println!("adaptive limit        {}", s.adaptive_limit);
    }
    println!("free permits          {}", s.free);
    println!("queued permits        {} ({} waiters)", s.queued, s.waiters);
    println!("live tickets          {}", s.live_tickets);
    let shadow = s.stats.as_ref().map_or(0, |st| st.shadow);
    if shadow > 0 {
        println!("shadow grants         {shadow} (a shadow policy granted what it would have blocked or denied)");
    }
    Ok(())
}

/// Prints `text` on standard output with no newline, like [`emit`].
pub(crate) fn print_part(text: &str) -> anyhow::Result<()> {
    write_out(text, "")
}

/// Prints `text` and a newline on standard output. A reader that went away
/// (`fusebox watch | head`) ends the command quietly.
pub(crate) fn emit(text: &str) -> anyhow::Result<()> {
    write_out(text, "\n")
}

/// Writes `text` then `end` on standard output, flushed; ends the command
/// quietly when the reader went away.
fn write_out(text: &str, end: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match write!(out, "{text}{end}").and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        Err(e) => Err(e).context("cannot write to standard output"),
    }
}

/// Every request a key answered: admitted, blocked, refused, denied (by
/// the permit book or the retry budget) or withdrawn while waiting.
pub(crate) fn requests(s: &pb::KeyState) -> u64 {
    s.stats.as_ref().map_or(0, |st| {
        st.granted
            + st.probes
            + st.blocked
            + st.refused
            + st.denied
            + st.retry_denied
            + st.withdrawn
    })
}

/// A key as `keys --json` and `watch --json` print it.
pub(crate) fn key_json(s: &pb::KeyState) -> serde_json::Value {
    let st = s.stats.clone().unwrap_or_default();
    let by_reason: serde_json::Map<String, serde_json::Value> = st
        .by_reason
        .iter()
        .map(|(reason, n)| (reason.clone(), (*n).into()))
        .collect();
    serde_json::json!({
        "key": s.key,
        "phase": phase_name(s.phase),
        "open_remaining_ms": ms(s.open_remaining),
        "failure_ratio": s.failure_ratio,
        "consecutive_failures": s.consecutive_failures,
        "half_open_attempts": s.half_open_attempts,
        "probes_held": s.probes_held,
        "half_open_successes": s.half_open_successes,
        "live_slow": s.live_slow,
        "adaptive_limit": s.adaptive_limit,
        "free": s.free,
        "limit": s.limit,
        "queued": s.queued,
        "waiters": s.waiters,
        "live_tickets": s.live_tickets,
        "requests": requests(s),
        "phase_changed_at": s.phase_changed_at.map(time_ms),
        "stats": {
            "granted": st.granted,
            "probes": st.probes,
            "blocked": st.blocked,
            "refused": st.refused,
            "denied": st.denied,
            "retry_denied": st.retry_denied,
            "by_reason": by_reason,
            "queued": st.queued,
            "evicted": st.evicted,
            "timed_out": st.timed_out,
            "withdrawn": st.withdrawn,
            "successes": st.successes,
            "failures": st.failures,
            "ignored": st.ignored,
            "stale": st.stale,
            "slow": st.slow,
            "expired": st.expired,
            "shadow": st.shadow,
        },
    })
}

/// A wall-clock time in RFC 3339 to the second: `2026-11-29T23:59:01Z`.
pub(crate) fn time_s(t: prost_types::Timestamp) -> String {
    prost_types::Timestamp {
        seconds: t.seconds,
        nanos: 0,
    }
    .to_string()
}

/// A wall-clock time in RFC 3339 to the millisecond.
pub(crate) fn time_ms(t: prost_types::Timestamp) -> String {
    prost_types::Timestamp {
        seconds: t.seconds,
        nanos: t.nanos - t.nanos.rem_euclid(1_000_000),
    }
    .to_string()
}

/// This machine's time, to the second.
pub fn now_s() -> String {
    time_s(prost_types::Timestamp::from(std::time::SystemTime::now()))
}

/// A duration for people: `750ms`, `4.9s`, `2m05s`, `1h30m`.
pub(crate) fn human_ms(ms: u64) -> String {
    match ms {
        0..=999 => format!("{ms}ms"),
        1_000..=59_999 => format!("{}.{}s", ms / 1000, ms % 1000 / 100),
        60_000..=3_599_999 => format!("{}m{:02}s", ms / 60_000, ms % 60_000 / 1000),
        _ => format!("{}h{:02}m", ms / 3_600_000, ms % 3_600_000 / 60_000),
    }
}

/// An interval as given: `1s`, `500ms`, `2m`; otherwise as [`human_ms`].
pub(crate) fn interval_words(ms: u64) -> String {
    match ms {
        ms if ms % 3_600_000 == 0 => format!("{}h", ms / 3_600_000),
        ms if ms % 60_000 == 0 => format!("{}m", ms / 60_000),
        ms if ms % 1000 == 0 => format!("{}s", ms / 1000),
        ms if ms < 1000 => format!("{ms}ms"),
        ms => human_ms(ms),
    }
}

/// A transition in words: `2026-11-29T23:59:01Z payments/charge CLOSED ->
/// OPEN  failures reached the trip condition`.
pub(crate) fn transition_line(t: &pb::Transition) -> String {
    let at = t.at.map_or_else(now_s, time_s);
    format!(
        "{at} {} {} -> {}  {}",
        t.key,
        phase_name(t.from),
        phase_name(t.to),
        transition_words(t)
    )
}

/// Why a transition happened; for an operator's isolate or close, who
/// asked and why.
pub(crate) fn transition_words(t: &pb::Transition) -> String {
    let verb = match pb::TransitionKind::try_from(t.kind) {
        Ok(pb::TransitionKind::Isolate) => "isolated",
        Ok(pb::TransitionKind::Close) => "closed",
        _ => return t.cause.clone(),
    };
    let mut words = if t.who.is_empty() {
        format!("{verb} by an operator")
    } else {
        format!("{verb} by {}", t.who)
    };
    if !t.reason.is_empty() {
        words.push_str(": ");
        words.push_str(&t.reason);
    }
    words
}

/// A transition as `watch --json` prints it.
pub(crate) fn transition_json(t: &pb::Transition) -> serde_json::Value {
    let kind = pb::TransitionKind::try_from(t.kind)
        .map(|k| {
            k.as_str_name()
                .trim_start_matches("TRANSITION_KIND_")
                .to_lowercase()
        })
        .unwrap_or_else(|_| "unspecified".to_owned());
    let text = |s: &str| (!s.is_empty()).then(|| s.to_owned());
    serde_json::json!({
        "event": "transition",
        "sequence": t.sequence,
        "at": t.at.map(time_ms),
        "key": t.key,
        "kind": kind,
        "from": phase_name(t.from),
        "to": phase_name(t.to),
        "cause": t.cause,
        "who": text(&t.who),
        "reason": text(&t.reason),
        "state": t.state.as_ref().map(key_json),
    })
}

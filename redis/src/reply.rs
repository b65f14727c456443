//! What the commands answer, and what their notices carry: decisions as
//! arrays of names and numbers, a key's view as JSON.

use fusebox_domain::{Decision, Fuse, Grant, Millis, Phase, Reason, TicketId, TicketTable};
use redis_module::RedisValue;

/// A phase as the module writes it: lower case (`closed`, `open`,
/// `half_open`, `isolated`).
pub fn phase_name(phase: Phase) -> &'static str {
    match phase {
        Phase::Closed => "closed",
        Phase::Open => "open",
        Phase::HalfOpen => "half_open",
        Phase::Isolated => "isolated",
    }
}

/// A decision's parts: name, reason, ticket, lease left and retry after.
pub struct Parts {
    /// `granted`, `probe`, `blocked`, `refused`, `denied` or `queued`.
    pub decision: &'static str,
    /// The reason's name, for `blocked` and `denied`.
    pub reason: Option<&'static str>,
    /// The ticket's id, for a grant.
    pub ticket: Option<TicketId>,
    /// Time left on the ticket's lease.
    pub lease_ms: Option<Millis>,
    /// When to ask again.
    pub retry_after_ms: Option<Millis>,
}

/// The parts of `decision` made at `now`.
pub fn parts(decision: &Decision, now: Millis) -> Parts {
    let mut p = Parts {
        decision: "",
        reason: None,
        ticket: None,
        lease_ms: None,
        retry_after_ms: None,
    };
    let grant = |g: &Grant| (Some(g.ticket), Some(g.lease_end.saturating_sub(now)));
    match decision {
        Decision::Granted(g) => {
            p.decision = "granted";
            if let Some(g) = g {
                (p.ticket, p.lease_ms) = grant(g);
            }
        }
        Decision::Probe(g) => {
            p.decision = "probe";
            (p.ticket, p.lease_ms) = grant(g);
        }
        Decision::Blocked {
            reason,
            retry_after,
        } => {
            p.decision = "blocked";
            p.reason = Some(reason.as_str());
            p.retry_after_ms = Some(*retry_after);
        }
        Decision::Refused => p.decision = "refused",
        Decision::Denied {
            reason,
            retry_after,
        } => {
            p.decision = "denied";
            p.reason = Some(reason.as_str());
            p.retry_after_ms = *retry_after;
        }
        Decision::Queued => p.decision = "queued",
    }
    p
}

/// A number as an integer reply.
pub fn millis(ms: Millis) -> RedisValue {
    RedisValue::Integer(i64::try_from(ms).unwrap_or(i64::MAX))
}

fn name(text: &str) -> RedisValue {
    RedisValue::BulkString(text.to_owned())
}

/// A decision as `[decision, reason|nil, ticket|nil, lease_ms|nil,
/// retry_after_ms|nil, phase, now_ms]`, names in lower case; `lease_ms` is
/// the time left on the ticket, `phase` the breaker's after the step and
/// `now_ms` the time the command used.
pub fn decision_reply(decision: &Decision, phase: Phase, now: Millis) -> RedisValue {
    let p = parts(decision, now);
    let opt_name = |s: Option<&str>| s.map_or(RedisValue::Null, name);
    let opt_ms = |m: Option<Millis>| m.map_or(RedisValue::Null, millis);
    RedisValue::Array(vec![
        name(p.decision),
        opt_name(p.reason),
        opt_name(p.ticket.map(|t| t.to_string()).as_deref()),
        opt_ms(p.lease_ms),
        opt_ms(p.retry_after_ms),
        name(phase_name(phase)),
        millis(now),
    ])
}

/// [`decision_reply`] packed in one string, the fields in the same order
/// separated by one space, `-` for nil: `granted - 0f…2a 30000 - closed
/// 1700000000000`. Names and numbers hold no space, so a reader splits on
/// spaces; a fusebox server asks for it (`REPLY packed`), because one
/// string costs Redis and the server's parser a seventh of seven.
pub fn decision_packed(decision: &Decision, phase: Phase, now: Millis) -> RedisValue {
    // Written by hand, not by `format!`: this is every acquire's reply.
    let p = parts(decision, now);
    let mut out = Vec::with_capacity(96);
    let field = |out: &mut Vec<u8>, text: &str| {
        out.push(b' ');
        out.extend_from_slice(text.as_bytes());
    };
    let ms = |out: &mut Vec<u8>, m: Option<Millis>| {
        out.push(b' ');
        match m {
            Some(m) => push_number(out, m),
            None => out.push(b'-'),
        }
    };
    out.extend_from_slice(p.decision.as_bytes());
    field(&mut out, p.reason.unwrap_or("-"));
    out.push(b' ');
    match p.ticket {
        Some(ticket) => out.extend_from_slice(&ticket.to_hex()),
        None => out.push(b'-'),
    }
    ms(&mut out, p.lease_ms);
    ms(&mut out, p.retry_after_ms);
    field(&mut out, phase_name(phase));
    ms(&mut out, Some(now));
    RedisValue::StringBuffer(out)
}

/// `n` in decimal digits.
fn push_number(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

/// [`completed_reply`]'s values packed in one string: `0 closed`, `1 open`.
pub fn completed_packed(stale: bool, phase: Phase) -> RedisValue {
    RedisValue::BulkString(format!("{} {}", u8::from(stale), phase_name(phase)))
}

/// A completion as `[stale, 0|1, phase, <phase>]`.
pub fn completed_reply(stale: bool, phase: Phase) -> RedisValue {
    RedisValue::Array(vec![
        name("stale"),
        RedisValue::Integer(i64::from(stale)),
        name("phase"),
        name(phase_name(phase)),
    ])
}

/// The view of `fuse` at `now` as a JSON object: the fields of the
/// domain's `View` (the phase in lower case), the time it is read at
/// (`now_ms`), the statistics, and the policy in force as its spec.
pub fn view_json<T: TicketTable>(fuse: &Fuse<T>, now: Millis) -> serde_json::Value {
    let v = fuse.view(now);
    let s = &v.stats;
    let by_reason: serde_json::Map<String, serde_json::Value> = Reason::ALL
        .iter()
        .map(|r| (r.as_str().to_owned(), s.by_reason[*r as usize].into()))
        .collect();
    serde_json::json!({
        "phase": phase_name(v.phase),
        "consecutive_failures": v.consecutive_failures,
        "half_open_attempts": v.half_open_attempts,
        "open_until": v.open_until,
        "free": v.free,
        "limit": v.limit,
        "queued": v.queued,
        "live_tickets": v.live_tickets,
        "waiters": v.waiters,
        "epoch": v.epoch,
        "failure_ratio": v.failure_ratio,
        "changed_at": v.changed_at,
        "last_now": fuse.last_now(),
        "now_ms": now,
        "next_deadline": fuse.next_deadline(),
        "stats": {
            "granted": s.granted,
            "probes": s.probes,
            "blocked": s.blocked,
            "refused": s.refused,
            "denied": s.denied,
            "by_reason": by_reason,
            "queued": s.queued,
            "evicted": s.evicted,
            "timed_out": s.timed_out,
            "withdrawn": s.withdrawn,
            "failed": s.failed,
            "successes": s.successes,
            "failures": s.failures,
            "ignored": s.ignored,
            "stale": s.stale,
            "expired": s.expired,
        },
        "policy": fuse.policy().spec(),
    })
}

/// The view as a bulk string reply.
pub fn view_reply<T: TicketTable>(fuse: &Fuse<T>, now: Millis) -> RedisValue {
    RedisValue::BulkString(view_json(fuse, now).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The array's fields as the packed form writes them.
    fn joined(value: RedisValue) -> String {
        let RedisValue::Array(fields) = value else {
            panic!("not an array: {value:?}")
        };
        let text: Vec<String> = fields
            .into_iter()
            .map(|f| match f {
                RedisValue::BulkString(s) => s,
                RedisValue::Integer(n) => n.to_string(),
                RedisValue::Null => "-".into(),
                other => panic!("unexpected field {other:?}"),
            })
            .collect();
        text.join(" ")
    }

    fn decision() -> impl Strategy<Value = Decision> {
        // Times are below 2^53 (SPEC T0), where the array's integers are exact.
        let grant = (any::<u128>(), 0u64..1 << 53).prop_map(|(id, lease_end)| Grant {
            ticket: TicketId(id),
            lease_end,
        });
        let reason = proptest::sample::select(Reason::ALL.to_vec());
        prop_oneof![
            proptest::option::of(grant.clone()).prop_map(Decision::Granted),
            grant.prop_map(Decision::Probe),
            (reason.clone(), 0u64..1 << 53).prop_map(|(reason, retry_after)| Decision::Blocked {
                reason,
                retry_after
            }),
            Just(Decision::Refused),
            (reason, proptest::option::of(0u64..1 << 53)).prop_map(|(reason, retry_after)| {
                Decision::Denied {
                    reason,
                    retry_after,
                }
            }),
            Just(Decision::Queued),
        ]
    }

    proptest! {
        /// The packed reply is the array's fields, in order, `-` for nil.
        #[test]
        fn the_packed_decision_is_the_arrays_fields(
            d in decision(),
            phase in proptest::sample::select(vec![Phase::Closed, Phase::Open, Phase::HalfOpen, Phase::Isolated]),
            now in 0u64..1 << 53,
        ) {
            let RedisValue::StringBuffer(packed) = decision_packed(&d, phase, now) else {
                panic!("not a string buffer")
            };
            prop_assert_eq!(String::from_utf8(packed).unwrap(), joined(decision_reply(&d, phase, now)));
        }
    }
}

//! The module's replies and published messages, read back into the
//! domain's values. A reply of an unexpected shape is an internal error
//! that quotes it (a module of another version, most likely).

use redis::Value;

use super::super::{CompleteReply, EngineError, KeyReading};
use crate::domain::{Decision, Grant, Millis, Phase, Reason, Stats, TicketId, View};

/// A decision as the module answered it, with the phase after it and the
/// store's time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Answer {
    pub decision: Decision,
    pub phase: Phase,
    pub now: Millis,
}

fn odd(what: &str, value: &impl std::fmt::Debug) -> EngineError {
    EngineError::Internal(format!(
        "the store's {what} reply is not what this server reads: {value:?}; \
         do the fusebox servers and the Redis module have the same version?"
    ))
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Okay => Some("OK".to_owned()),
        _ => None,
    }
}

fn number(value: &Value) -> Option<u64> {
    match value {
        Value::Int(n) => u64::try_from(*n).ok(),
        other => text(other)?.parse().ok(),
    }
}

fn phase_named(name: &str) -> Option<Phase> {
    [Phase::Closed, Phase::Open, Phase::HalfOpen, Phase::Isolated]
        .into_iter()
        .find(|p| p.as_str().eq_ignore_ascii_case(name))
}

fn reason_named(name: &str) -> Option<Reason> {
    Reason::ALL.into_iter().find(|r| r.as_str() == name)
}

fn ticket_named(hex: &str) -> Option<TicketId> {
    (hex.len() <= 32)
        .then(|| u128::from_str_radix(hex, 16).ok())
        .flatten()
        .map(TicketId)
}

/// The parts of a decision, however they came (a reply or a message).
struct Parts<'a> {
    decision: &'a str,
    reason: Option<String>,
    ticket: Option<String>,
    lease: Option<u64>,
    retry: Option<u64>,
    phase: &'a str,
    now: u64,
}

fn decision_of_parts(p: Parts<'_>) -> Option<Answer> {
    let grant = || {
        Some(Grant {
            ticket: ticket_named(p.ticket.as_deref()?)?,
            lease_end: p.now + p.lease?,
        })
    };
    let reason = || reason_named(p.reason.as_deref()?);
    let decision = match p.decision {
        "granted" => Decision::Granted(match p.ticket {
            Some(_) => Some(grant()?),
            None => None,
        }),
        "probe" => Decision::Probe(grant()?),
        "blocked" => Decision::Blocked {
            reason: reason()?,
            retry_after: p.retry?,
        },
        "refused" => Decision::Refused,
        "denied" => Decision::Denied {
            reason: reason()?,
            retry_after: p.retry,
        },
        "queued" => Decision::Queued,
        _ => return None,
    };
    Some(Answer {
        decision,
        phase: phase_named(p.phase)?,
        now: p.now,
    })
}

/// `FB.ACQUIRE`'s reply: `[decision, reason, ticket, lease_ms,
/// retry_after_ms, phase, now_ms]`.
pub fn decision_of(value: &Value) -> Result<Answer, EngineError> {
    let parse = || match value {
        Value::BulkString(packed) => decision_packed(packed),
        Value::Array(items) => {
            let [decision, reason, ticket, lease, retry, phase, now] = items.as_slice() else {
                return None;
            };
            let decision = text(decision)?;
            let phase = text(phase)?;
            decision_of_parts(Parts {
                decision: &decision,
                reason: text(reason),
                ticket: text(ticket),
                lease: number(lease),
                retry: number(retry),
                phase: &phase,
                now: number(now)?,
            })
        }
        _ => None,
    };
    parse().ok_or_else(|| odd("FB.ACQUIRE", value))
}

/// A decision packed in one string (`REPLY packed`): the array's seven
/// fields in order, separated by one space, `-` for nil.
fn decision_packed(packed: &[u8]) -> Option<Answer> {
    let text = std::str::from_utf8(packed).ok()?;
    let mut fields = text.split(' ');
    let mut next = || fields.next().filter(|f| !f.is_empty());
    let given = |f: &str| (f != "-").then(|| f.to_owned());
    let number = |f: &str| {
        if f == "-" {
            Some(None)
        } else {
            f.parse().ok().map(Some)
        }
    };
    let (decision, reason, ticket) = (next()?, next()?, next()?);
    let (lease, retry, phase, now) = (next()?, next()?, next()?, next()?);
    if next().is_some() {
        return None;
    }
    decision_of_parts(Parts {
        decision,
        reason: given(reason),
        ticket: given(ticket),
        lease: number(lease)?,
        retry: number(retry)?,
        phase,
        now: now.parse().ok()?,
    })
}

/// `FB.SETTLE … WAITER id`'s reply: `[next_deadline|nil, decision|nil]`;
/// `None` when the store does not know the waiter.
pub fn settled_waiter(value: &Value) -> Result<Option<Answer>, EngineError> {
    match value {
        Value::Array(items) if items.len() == 2 => match &items[1] {
            Value::Nil => Ok(None),
            answer => decision_of(answer).map(Some),
        },
        other => Err(odd("FB.SETTLE", other)),
    }
}

/// A message of the answers channel: the Redis key it is for, the waiter
/// and its answer.
pub fn published_answer(message: &[u8]) -> Option<(String, TicketId, Answer)> {
    let m: serde_json::Value = serde_json::from_slice(message).ok()?;
    let s = |f: &str| m.get(f).and_then(|v| v.as_str()).map(str::to_owned);
    let n = |f: &str| m.get(f).and_then(serde_json::Value::as_u64);
    let key = s("key")?;
    let waiter = ticket_named(&s("waiter")?)?;
    let decision = s("decision")?;
    let phase = s("phase")?;
    let answer = decision_of_parts(Parts {
        decision: &decision,
        reason: s("reason"),
        ticket: s("ticket"),
        lease: n("lease_ms"),
        retry: n("retry_after_ms"),
        phase: &phase,
        now: n("now_ms")?,
    })?;
    Some((key, waiter, answer))
}

/// The value after `name` in `FB.VERSION`'s reply (`module V encoding N
/// signing F|off`).
fn version_field<'v>(value: &'v Value, name: &str) -> Option<&'v Value> {
    let Value::Array(items) = value else {
        return None;
    };
    let at = items
        .iter()
        .position(|v| text(v).as_deref() == Some(name))?;
    items.get(at + 1)
}

/// The state encoding a node's module writes, from `FB.VERSION`'s reply;
/// `None` when the reply does not say.
pub fn encoding_of(value: &Value) -> Option<u64> {
    number(version_field(value, "encoding")?)
}

/// The fingerprint of the secret a node signs its notices with, from
/// `FB.VERSION`'s reply; `None` when it does not sign (`off`, or a module
/// too old to say).
pub fn signing_of(value: &Value) -> Option<String> {
    text(version_field(value, "signing")?).filter(|f| f != "off")
}

/// `FB.COMPLETE`'s reply: `stale 0|1 phase P`, or packed (`REPLY
/// packed`): `0|1 P`.
pub fn completed(value: &Value) -> Result<CompleteReply, EngineError> {
    let parse = || {
        let (stale, phase) = match value {
            Value::BulkString(packed) => {
                let (stale, phase) = std::str::from_utf8(packed).ok()?.split_once(' ')?;
                (stale.parse::<u8>().ok()?, phase_named(phase)?)
            }
            Value::Array(items) => {
                let [_, stale, _, phase] = items.as_slice() else {
                    return None;
                };
                (
                    u8::try_from(number(stale)?).ok()?,
                    phase_named(&text(phase)?)?,
                )
            }
            _ => return None,
        };
        (stale <= 1).then_some(CompleteReply {
            stale: stale == 1,
            phase,
        })
    };
    parse().ok_or_else(|| odd("FB.COMPLETE", value))
}

/// A reply that is a number of milliseconds.
pub fn millis(value: &Value, what: &str) -> Result<Millis, EngineError> {
    number(value).ok_or_else(|| odd(what, value))
}

/// A key's view as the module writes it (JSON), or `None` for nil.
pub fn reading_of(key: &str, value: &Value) -> Result<Option<KeyReading>, EngineError> {
    if *value == Value::Nil {
        return Ok(None);
    }
    let json = text(value)
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .ok_or_else(|| odd("view", value))?;
    view_of(&json)
        .map(|(view, now)| {
            Some(KeyReading {
                key: key.to_owned(),
                view,
                now,
            })
        })
        .ok_or_else(|| odd("view", value))
}

/// The domain's view, and the time it was read at, from the module's JSON.
pub fn view_of(j: &serde_json::Value) -> Option<(View, Millis)> {
    let n = |f: &str| j.get(f).and_then(serde_json::Value::as_u64);
    let st = j.get("stats")?;
    let s = |f: &str| st.get(f).and_then(serde_json::Value::as_u64).unwrap_or(0);
    let mut by_reason = [0; 7];
    for r in Reason::ALL {
        by_reason[r as usize] = st
            .get("by_reason")
            .and_then(|b| b.get(r.as_str()))
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(0);
    }
    let stats = Stats {
        granted: s("granted"),
        probes: s("probes"),
        blocked: s("blocked"),
        refused: s("refused"),
        denied: s("denied"),
        by_reason,
        queued: s("queued"),
        evicted: s("evicted"),
        timed_out: s("timed_out"),
        withdrawn: s("withdrawn"),
        failed: s("failed"),
        successes: s("successes"),
        failures: s("failures"),
        ignored: s("ignored"),
        stale: s("stale"),
        expired: s("expired"),
    };
    let view = View {
        phase: phase_named(j.get("phase")?.as_str()?)?,
        consecutive_failures: u32::try_from(n("consecutive_failures")?).ok()?,
        half_open_attempts: u32::try_from(n("half_open_attempts")?).ok()?,
        open_until: n("open_until"),
        free: u32::try_from(n("free")?).ok()?,
        limit: u32::try_from(n("limit")?).ok()?,
        queued: n("queued")?,
        live_tickets: usize::try_from(n("live_tickets")?).ok()?,
        waiters: usize::try_from(n("waiters")?).ok()?,
        epoch: n("epoch")?,
        failure_ratio: j.get("failure_ratio").and_then(serde_json::Value::as_f64),
        changed_at: n("changed_at")?,
        stats,
    };
    let now = n("now_ms").or_else(|| n("last_now"))?;
    Some((view, now))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn acquire_replies_read_back_as_decisions() {
        let granted = Value::Array(vec![
            bulk("granted"),
            Value::Nil,
            bulk("00000000000000000000000000000abc"),
            Value::Int(500),
            Value::Nil,
            bulk("closed"),
            Value::Int(1000),
        ]);
        let a = decision_of(&granted).unwrap();
        assert_eq!(
            a.decision,
            Decision::Granted(Some(Grant {
                ticket: TicketId(0xabc),
                lease_end: 1500
            }))
        );
        assert_eq!((a.phase, a.now), (Phase::Closed, 1000));
        let blocked = Value::Array(vec![
            bulk("blocked"),
            bulk("open"),
            Value::Nil,
            Value::Nil,
            Value::Int(30),
            bulk("OPEN"),
            Value::Int(7),
        ]);
        assert_eq!(
            decision_of(&blocked).unwrap().decision,
            Decision::Blocked {
                reason: Reason::Open,
                retry_after: 30
            }
        );
        // The packed forms read as the arrays do.
        assert_eq!(
            decision_of(&bulk(
                "granted - 00000000000000000000000000000abc 500 - closed 1000"
            ))
            .unwrap(),
            a
        );
        assert_eq!(
            decision_of(&bulk("blocked open - - 30 OPEN 7")).unwrap(),
            decision_of(&blocked).unwrap()
        );
        assert_eq!(
            completed(&bulk("1 half_open")).unwrap(),
            completed(&Value::Array(vec![
                bulk("stale"),
                Value::Int(1),
                bulk("phase"),
                bulk("half_open")
            ]))
            .unwrap()
        );
        for bad in [
            "granted - abc 500 - closed",
            "granted - abc 500 - closed 1000 more",
            "granted  abc 500 - closed 1000",
            "blocked open - - x OPEN 7",
        ] {
            assert!(
                matches!(decision_of(&bulk(bad)), Err(EngineError::Internal(_))),
                "{bad}"
            );
        }
        for bad in ["2 closed", "0", "0 ajar"] {
            assert!(
                matches!(completed(&bulk(bad)), Err(EngineError::Internal(_))),
                "{bad}"
            );
        }
        for bad in [
            Value::Nil,
            Value::Array(vec![bulk("granted")]),
            Value::Array(vec![
                bulk("maybe"),
                Value::Nil,
                Value::Nil,
                Value::Nil,
                Value::Nil,
                bulk("closed"),
                Value::Int(1),
            ]),
        ] {
            assert!(matches!(decision_of(&bad), Err(EngineError::Internal(_))));
        }
    }

    #[test]
    fn published_answers_name_their_waiter() {
        let m = br#"{"key":"fusebox:k:a","waiter":"ff","decision":"denied","reason":"timeout","ticket":null,"lease_ms":null,"retry_after_ms":null,"phase":"closed","now_ms":9}"#;
        let (key, waiter, answer) = published_answer(m).unwrap();
        assert_eq!(key, "fusebox:k:a");
        assert_eq!(waiter, TicketId(0xff));
        assert_eq!(
            answer.decision,
            Decision::Denied {
                reason: Reason::Timeout,
                retry_after: None
            }
        );
        assert!(published_answer(b"{}").is_none());
        let version = |signing: &str| {
            Value::Array(vec![
                Value::SimpleString("module".into()),
                Value::SimpleString("0.1.0".into()),
                Value::SimpleString("encoding".into()),
                Value::Int(2),
                Value::SimpleString("signing".into()),
                Value::SimpleString(signing.into()),
            ])
        };
        assert_eq!(
            signing_of(&version("08c2720d49dc191e")).as_deref(),
            Some("08c2720d49dc191e")
        );
        assert_eq!(signing_of(&version("off")), None);
        assert_eq!(signing_of(&Value::Array(vec![bulk("module")])), None);
        assert_eq!(encoding_of(&version("off")), Some(2));
        assert_eq!(encoding_of(&Value::Array(vec![bulk("module")])), None);
        assert!(published_answer(b"not json").is_none());
    }
}

/// What `FB.CENSUS` answered, summed over primaries.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Census {
    /// Fusebox keys, as each primary's last pass counted them.
    pub keys: u64,
    /// Keys by phase: exact for the phases that are not CLOSED; CLOSED is
    /// the keys counted less those.
    pub by_phase: [u64; 4],
    /// Live tickets.
    pub tickets: u64,
    /// Waiting requests.
    pub waiters: u64,
    /// Keys not closed, read (when asked for).
    pub not_closed: Vec<KeyReading>,
}

impl Census {
    /// Adds another primary's census.
    pub fn add(&mut self, other: Census) {
        self.keys += other.keys;
        for (a, b) in self.by_phase.iter_mut().zip(other.by_phase) {
            *a += b;
        }
        self.tickets += other.tickets;
        self.waiters += other.waiters;
        self.not_closed.extend(other.not_closed);
    }
}

/// One primary's `FB.CENSUS` reply; with `keys`, its keys not closed too.
pub fn census_of(value: &Value, keys: bool) -> Result<Census, EngineError> {
    let parse = || {
        let Value::Array(items) = value else {
            return None;
        };
        let field = |name: &str| {
            items
                .chunks(2)
                .find(|pair| text(&pair[0]).as_deref() == Some(name))
                .and_then(|pair| pair.get(1))
        };
        let n = |name: &str| field(name).and_then(number);
        let not_closed = [n("open")?, n("half_open")?, n("isolated")?];
        let counted = n("keys")?;
        let mut c = Census {
            by_phase: [
                counted
                    .saturating_sub(not_closed.iter().sum())
                    .max(n("closed")?),
                not_closed[0],
                not_closed[1],
                not_closed[2],
            ],
            tickets: n("tickets")?,
            waiters: n("waiters")?,
            ..Census::default()
        };
        c.keys = c.by_phase.iter().sum();
        if keys {
            let Value::Array(views) = field("not_closed")? else {
                return None;
            };
            let mut views = views.iter();
            while let (Some(name), Some(view)) = (views.next(), views.next()) {
                let name = text(name)?;
                let key = name.strip_prefix(super::KEY_PREFIX)?;
                c.not_closed.push(reading_of(key, view).ok()??);
            }
        }
        Some(c)
    };
    parse().ok_or_else(|| odd("FB.CENSUS", value))
}

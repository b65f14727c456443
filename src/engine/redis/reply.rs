//! The module's replies, read back into the wire's types
//! ([`crate::domain::wire`], the ones the module writes them from). A
//! reply of an unexpected shape is an internal error that quotes it (a
//! module of another version, most likely).

use redis::Value;

use super::super::{CompleteReply, EngineError, KeyReading};
use super::keys::KEY_PREFIX;
use crate::domain::wire::{
    stale_of, Answer, AnswerFields, CensusFigures, Completion, Item, KeyView, ModuleVersion,
    WireError,
};
use crate::domain::{Millis, TicketId};

fn odd(what: &str, value: &impl std::fmt::Debug) -> EngineError {
    EngineError::Internal(format!(
        "the store's {what} reply is not what this server reads: {value:?}; \
         do the fusebox servers and the Redis module have the same version?"
    ))
}

fn odd_because(what: &str, value: &impl std::fmt::Debug, why: &WireError) -> EngineError {
    EngineError::Internal(format!(
        "the store's {what} reply is not what this server reads ({why}): {value:?}; \
         do the fusebox servers and the Redis module have the same version?"
    ))
}

/// The bytes of a string reply.
fn bytes(value: &Value) -> Option<&[u8]> {
    match value {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        Value::VerbatimString { text, .. } => Some(text.as_bytes()),
        Value::Okay => Some(b"OK"),
        _ => None,
    }
}

/// The text of a string reply, if it is UTF-8.
pub(super) fn text(value: &Value) -> Option<&str> {
    std::str::from_utf8(bytes(value)?).ok()
}

fn number(value: &Value) -> Option<u64> {
    match value {
        Value::Int(n) => u64::try_from(*n).ok(),
        other => text(other)?.parse().ok(),
    }
}

/// A field that is nil or read by `read`.
fn nil_or<T>(value: &Value, read: impl FnOnce(&Value) -> Option<T>) -> Option<Option<T>> {
    match value {
        Value::Nil => Some(None),
        other => read(other).map(Some),
    }
}

/// The array form's seven fields ([`AnswerFields`]).
fn fields_of(items: &[Value]) -> Option<AnswerFields> {
    let [decision, reason, ticket, lease, retry, phase, now] = items else {
        return None;
    };
    Some(AnswerFields {
        decision: text(decision)?.parse().ok()?,
        reason: nil_or(reason, |r| text(r)?.parse().ok())?,
        ticket: nil_or(ticket, |t| TicketId::from_hex(bytes(t)?))?,
        lease_ms: nil_or(lease, number)?,
        retry_after_ms: nil_or(retry, number)?,
        phase: text(phase)?.parse().ok()?,
        now_ms: number(now)?,
    })
}

/// `FB.ACQUIRE`'s reply, packed (`REPLY packed`) or as the array
/// `[decision, reason, ticket, lease_ms, retry_after_ms, phase, now_ms]`.
pub fn decision_of(value: &Value) -> Result<Answer, EngineError> {
    let read = match value {
        Value::BulkString(packed) => Answer::read_packed(packed),
        Value::Array(items) => fields_of(items)
            .ok_or_else(|| WireError {
                what: "decision",
                problem: "is not the array of seven fields".into(),
            })
            .and_then(Answer::try_from),
        _ => return Err(odd("FB.ACQUIRE", value)),
    };
    read.map_err(|why| odd_because("FB.ACQUIRE", value, &why))
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

/// `FB.VERSION`'s reply (`module V encoding N signing F|off`).
pub fn module_version(value: &Value) -> Result<ModuleVersion, EngineError> {
    let Value::Array(items) = value else {
        return Err(odd("FB.VERSION", value));
    };
    let items = items.chunks(2).filter_map(|pair| {
        let label = text(pair.first()?)?;
        let item = match pair.get(1)? {
            Value::Int(n) => Item::Number(u64::try_from(*n).ok()?),
            other => Item::Text(text(other)?),
        };
        Some((label, item))
    });
    ModuleVersion::read(items).map_err(|why| odd_because("FB.VERSION", value, &why))
}

/// `FB.COMPLETE`'s reply: `stale 0|1 phase P`, or packed (`REPLY
/// packed`): `0|1 P`.
pub fn completed(value: &Value) -> Result<CompleteReply, EngineError> {
    let read = || match value {
        Value::BulkString(packed) => Completion::read_packed(packed).ok(),
        Value::Array(items) => {
            let [_, stale, _, phase] = items.as_slice() else {
                return None;
            };
            Some(Completion {
                stale: stale_of(number(stale)?).ok()?,
                phase: text(phase)?.parse().ok()?,
            })
        }
        _ => None,
    };
    let c = read().ok_or_else(|| odd("FB.COMPLETE", value))?;
    Ok(CompleteReply {
        stale: c.stale,
        phase: c.phase,
    })
}

/// A reply that is a number of milliseconds.
pub fn millis(value: &Value, what: &str) -> Result<Millis, EngineError> {
    number(value).ok_or_else(|| odd(what, value))
}

/// A key's view as the module writes it ([`KeyView`], JSON), or `None`
/// for nil.
pub fn reading_of(key: &str, value: &Value) -> Result<Option<KeyReading>, EngineError> {
    if *value == Value::Nil {
        return Ok(None);
    }
    let json = bytes(value).ok_or_else(|| odd("view", value))?;
    let view: KeyView = serde_json::from_slice(json).map_err(|e| {
        EngineError::Internal(format!(
            "the store's view of {key} is not what this server reads ({e}); \
             do the fusebox servers and the Redis module have the same version?"
        ))
    })?;
    Ok(Some(KeyReading {
        key: key.to_owned(),
        view: view.view(),
        now: view.now_ms,
    }))
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
    let Value::Array(items) = value else {
        return Err(odd("FB.CENSUS", value));
    };
    let figures = items
        .chunks(2)
        .filter_map(|pair| Some((text(pair.first()?)?, number(pair.get(1)?)?)));
    let f = CensusFigures::read(figures).map_err(|why| odd_because("FB.CENSUS", value, &why))?;
    let [closed, open, half_open, isolated] = f.by_phase;
    let not_closed = open + half_open + isolated;
    let mut c = Census {
        // A closed key at rest is counted only by the pass.
        by_phase: [
            f.keys.saturating_sub(not_closed).max(closed),
            open,
            half_open,
            isolated,
        ],
        tickets: f.tickets,
        waiters: f.waiters,
        ..Census::default()
    };
    c.keys = c.by_phase.iter().sum();
    if keys {
        let views = items
            .chunks(2)
            .find(|pair| text(&pair[0]) == Some(CensusFigures::NOT_CLOSED))
            .and_then(|pair| pair.get(1));
        let Some(Value::Array(views)) = views else {
            return Err(odd("FB.CENSUS", value));
        };
        let mut views = views.iter();
        while let (Some(name), Some(view)) = (views.next(), views.next()) {
            let key = text(name)
                .and_then(|name| name.strip_prefix(KEY_PREFIX))
                .ok_or_else(|| odd("FB.CENSUS", value))?;
            if let Some(reading) = reading_of(key, view)? {
                c.not_closed.push(reading);
            }
        }
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{Decision, Grant, Phase, Reason};

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
    fn version_and_census_replies_read() {
        let version = |signing: &str| {
            Value::Array(vec![
                Value::SimpleString("module".into()),
                Value::SimpleString("0.1.0".into()),
                Value::SimpleString("encoding".into()),
                Value::Int(3),
                Value::SimpleString("signing".into()),
                Value::SimpleString(signing.into()),
            ])
        };
        let v = module_version(&version("08c2720d49dc191e")).unwrap();
        assert_eq!(
            (v.encoding, v.signing.as_deref()),
            (3, Some("08c2720d49dc191e"))
        );
        assert_eq!(module_version(&version("off")).unwrap().signing, None);
        assert!(module_version(&Value::Array(vec![bulk("module")])).is_err());

        let census = |not_closed: Vec<Value>| {
            let mut items = Vec::new();
            for (label, n) in [
                ("keys", 10),
                ("complete", 1),
                ("counted_at_ms", 5),
                ("closed", 1),
                ("open", 2),
                ("half_open", 0),
                ("isolated", 1),
                ("tickets", 4),
                ("waiters", 3),
            ] {
                items.push(Value::SimpleString(label.into()));
                items.push(Value::Int(n));
            }
            items.push(Value::SimpleString("not_closed".into()));
            items.push(Value::Array(not_closed));
            Value::Array(items)
        };
        let c = census_of(&census(Vec::new()), true).unwrap();
        assert_eq!(c.by_phase, [7, 2, 0, 1]);
        assert_eq!((c.keys, c.tickets, c.waiters), (10, 4, 3));
        let view = r#"{"phase":"open","consecutive_failures":3,"half_open_attempts":0,"open_until":900,"free":0,"limit":0,"queued":0,"live_tickets":0,"waiters":0,"epoch":1,"failure_ratio":null,"changed_at":5,"last_now":5,"now_ms":6,"next_deadline":900,"stats":{}}"#;
        let c = census_of(
            &census(vec![bulk(&format!("{KEY_PREFIX}a")), bulk(view)]),
            true,
        )
        .unwrap();
        assert_eq!(c.not_closed.len(), 1);
        assert_eq!(
            (c.not_closed[0].key.as_str(), c.not_closed[0].view.phase),
            ("a", Phase::Open)
        );
        assert!(census_of(&Value::Array(vec![bulk("keys"), Value::Int(1)]), false).is_err());
    }
}

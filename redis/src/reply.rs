//! What the commands answer, as Redis replies: the wire's types
//! ([`fusebox_domain::wire`], shared with the fusebox servers that read
//! them) as arrays, packed strings and JSON.

use fusebox_domain::wire::{phase_label, Answer, AnswerFields, Completion, KeyView, ReplyForm};
use fusebox_domain::{Fuse, Millis, TicketTable};
use redis_module::{RedisError, RedisValue};

use crate::refusal::err;

/// A number as an integer reply.
pub fn millis(ms: Millis) -> RedisValue {
    RedisValue::Integer(i64::try_from(ms).unwrap_or(i64::MAX))
}

fn name(text: &str) -> RedisValue {
    RedisValue::BulkString(text.to_owned())
}

/// A decision as `[decision, reason|nil, ticket|nil, lease_ms|nil,
/// retry_after_ms|nil, phase, now_ms]` ([`AnswerFields`]), names in lower
/// case; `lease_ms` is the time left on the ticket, `phase` the breaker's
/// after the step and `now_ms` the time the command used.
pub fn answer_array(answer: &Answer) -> RedisValue {
    let f = AnswerFields::from(answer);
    let opt_ms = |m: Option<Millis>| m.map_or(RedisValue::Null, millis);
    RedisValue::Array(vec![
        name(f.decision.as_str()),
        f.reason.map_or(RedisValue::Null, |r| name(r.as_str())),
        f.ticket.map_or(RedisValue::Null, |t| {
            RedisValue::StringBuffer(t.to_hex().to_vec())
        }),
        opt_ms(f.lease_ms),
        opt_ms(f.retry_after_ms),
        name(&phase_label(f.phase)),
        millis(f.now_ms),
    ])
}

/// A decision in the form asked for: the array, or packed in one string
/// ([`Answer::write_packed`]: the same fields, one space between them,
/// `-` for nil), which a fusebox server asks for (`REPLY packed`) because
/// one string costs Redis and the server's parser a seventh of seven.
pub fn answer_reply(answer: &Answer, form: ReplyForm) -> RedisValue {
    match form {
        ReplyForm::Array => answer_array(answer),
        ReplyForm::Packed => RedisValue::StringBuffer(answer.packed()),
    }
}

/// A completion as `[stale, 0|1, phase, <phase>]`, or packed (`0
/// closed`).
pub fn completion_reply(c: &Completion, form: ReplyForm) -> RedisValue {
    match form {
        ReplyForm::Array => {
            let [stale, phase] = Completion::LABELS;
            RedisValue::Array(vec![
                name(stale),
                RedisValue::Integer(i64::from(c.stale)),
                name(phase),
                name(&phase_label(c.phase)),
            ])
        }
        ReplyForm::Packed => RedisValue::StringBuffer(c.packed()),
    }
}

/// The view of `fuse` at `now` as JSON ([`KeyView`]).
pub fn view_json<T: TicketTable>(fuse: &Fuse<T>, now: Millis) -> Result<String, RedisError> {
    serde_json::to_string(&KeyView::of(fuse, now)).map_err(|e| err(&format!("view: {e}")))
}

/// The view as a bulk string reply.
pub fn view_reply<T: TicketTable>(fuse: &Fuse<T>, now: Millis) -> Result<RedisValue, RedisError> {
    view_json(fuse, now).map(RedisValue::BulkString)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fusebox_domain::{Decision, Grant, Phase, Reason, TicketId};
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
                RedisValue::StringBuffer(b) => String::from_utf8(b).unwrap(),
                RedisValue::Integer(n) => n.to_string(),
                RedisValue::Null => "-".into(),
                other => panic!("unexpected field {other:?}"),
            })
            .collect();
        text.join(" ")
    }

    fn answer() -> impl Strategy<Value = Answer> {
        // Times are below 2^53 (SPEC T0), where the array's integers are exact.
        let grant = (any::<u128>(), 0u64..1 << 53).prop_map(|(id, lease_end)| Grant {
            ticket: TicketId(id),
            lease_end,
        });
        let reason = proptest::sample::select(Reason::ALL.to_vec());
        let decision = prop_oneof![
            proptest::option::of(grant.clone()).prop_map(Decision::Granted),
            grant.clone().prop_map(Decision::Probe),
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
            (
                proptest::option::of(grant.clone()),
                proptest::sample::select(Reason::ALL.to_vec())
            )
                .prop_map(|(grant, reason)| Decision::Shadow { grant, reason }),
        ];
        let phase = proptest::sample::select(Phase::ALL.to_vec());
        (decision, phase, 0u64..1 << 53).prop_map(|(decision, phase, now)| Answer {
            decision,
            phase,
            now,
        })
    }

    proptest! {
        /// The packed reply is the array's fields, in order, `-` for nil.
        #[test]
        fn the_packed_decision_is_the_arrays_fields(a in answer()) {
            let RedisValue::StringBuffer(packed) = answer_reply(&a, ReplyForm::Packed) else {
                panic!("not a string buffer")
            };
            prop_assert_eq!(String::from_utf8(packed).unwrap(), joined(answer_array(&a)));
        }
    }

    #[test]
    fn a_completion_is_the_same_in_both_forms() {
        for phase in Phase::ALL {
            for stale in [false, true] {
                let c = Completion { stale, phase };
                let RedisValue::StringBuffer(packed) = completion_reply(&c, ReplyForm::Packed)
                else {
                    panic!("not a string buffer")
                };
                let array = joined(completion_reply(&c, ReplyForm::Array));
                let values: Vec<&str> = array.split(' ').skip(1).step_by(2).collect();
                assert_eq!(String::from_utf8(packed).unwrap(), values.join(" "));
            }
        }
    }
}

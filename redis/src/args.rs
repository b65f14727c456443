//! The commands' arguments, parsed and checked before any key is touched:
//! errors are `ERR <field>: <what to do>`, like the contract's messages.

use fusebox_domain::policy::MAX_DURATION;
use fusebox_domain::quorum::MAX_CALLER_BYTES;
use fusebox_domain::wire::ReplyForm;
use fusebox_domain::{CallerId, Millis, Named, Outcome, TicketId};
use redis_module::{RedisError, RedisString};

use crate::clock::{Now, MAX_NOW};

fn text<'a>(arg: &'a RedisString, field: &str, what: &str) -> Result<&'a str, RedisError> {
    std::str::from_utf8(arg.as_slice())
        .map_err(|_| RedisError::String(format!("ERR {field}: must be {what}")))
}

/// A whole number of ASCII digits, at most `max`.
pub fn number(arg: &RedisString, field: &str, max: u64, what: &str) -> Result<u64, RedisError> {
    digits(arg.as_slice())
        .filter(|&n| n <= max)
        .ok_or_else(|| RedisError::String(format!("ERR {field}: must be {what}")))
}

/// 1 to 20 ASCII digits as a number; `None` for anything else, or past
/// `u64::MAX`.
fn digits(text: &[u8]) -> Option<u64> {
    if text.is_empty() || text.len() > 20 {
        return None;
    }
    text.iter().try_fold(0u64, |n, &b| {
        let digit = b.wrapping_sub(b'0');
        if digit > 9 {
            return None;
        }
        n.checked_mul(10)?.checked_add(u64::from(digit))
    })
}

/// `now_ms`: the caller's monotonic clock in milliseconds (SPEC T0), or `*`
/// for the server's clock.
pub fn now(arg: &RedisString) -> Result<Now, RedisError> {
    if arg.as_slice() == b"*" {
        return Ok(Now::Server);
    }
    number(
        arg,
        "now_ms",
        MAX_NOW,
        "a whole number of milliseconds from 0 to 9007167718740992 (2^53 less 365 days), \
         or * for the server's clock; send the caller's monotonic clock or *",
    )
    .map(Now::At)
}

/// The `REPLY` option: `array` (the default) or `packed` ([`ReplyForm`],
/// what a fusebox server asks for: [`crate::reply`]).
pub fn form(arg: Option<&RedisString>) -> Result<ReplyForm, RedisError> {
    let Some(arg) = arg else {
        return Ok(ReplyForm::Array);
    };
    ReplyForm::from_name(arg.as_slice()).ok_or(RedisError::Str(
        "ERR reply: must be array or packed; leave REPLY out for the array",
    ))
}

/// A duration option (`LEASE`, `MAXWAIT`): 0 to 365 days in milliseconds.
pub fn duration(arg: &RedisString, field: &str) -> Result<Millis, RedisError> {
    number(
        arg,
        field,
        MAX_DURATION,
        "a whole number of milliseconds from 0 to 31536000000 (365 days)",
    )
}

/// `CALLER name`: who acquires (Q1), at most [`MAX_CALLER_BYTES`] of
/// UTF-8 with no control character, as the server checks it.
pub fn caller(arg: &RedisString) -> Result<CallerId, RedisError> {
    let bad = |why: &str| RedisError::String(format!("ERR caller: {why}"));
    let text = std::str::from_utf8(arg.as_slice()).map_err(|_| bad("must be UTF-8"))?;
    if text.len() > MAX_CALLER_BYTES {
        return Err(bad(&format!(
            "must be at most {MAX_CALLER_BYTES} bytes, not {}",
            text.len()
        )));
    }
    if text.chars().any(fusebox_domain::key::is_control) {
        return Err(bad("must not contain control characters"));
    }
    Ok(CallerId::of(text))
}

/// `ticket_hex`: a ticket id as 1 to 32 hex digits.
pub fn ticket(arg: &RedisString) -> Result<TicketId, RedisError> {
    id(arg, "ticket", "send the id the ticket was acquired with")
}

/// A waiter's id, as 1 to 32 hex digits.
pub fn waiter(arg: &RedisString) -> Result<TicketId, RedisError> {
    id(arg, "waiter", "send the id the request was queued with")
}

fn id(arg: &RedisString, field: &str, todo: &str) -> Result<TicketId, RedisError> {
    TicketId::from_hex(arg.as_slice()).ok_or_else(|| {
        RedisError::String(format!("ERR {field}: must be 1 to 32 hex digits; {todo}"))
    })
}

/// `outcome`: `success`, `failure` or `ignored`, in any case.
pub fn outcome(arg: &RedisString) -> Result<Outcome, RedisError> {
    const WHAT: &str = "success, failure or ignored";
    if let Some(outcome) = Outcome::from_name(arg.as_slice()) {
        return Ok(outcome);
    }
    let text = text(arg, "outcome", WHAT)?;
    Err(RedisError::String(format!(
        "ERR outcome: must be {WHAT}, not {text:?}"
    )))
}

/// `BY who` / `WHY text`: at most 256 bytes of UTF-8.
pub fn note(arg: &RedisString, field: &str) -> Result<String, RedisError> {
    let text = text(arg, field, "UTF-8 text of at most 256 bytes")?;
    if text.len() > 256 {
        return Err(RedisError::String(format!(
            "ERR {field}: must be at most 256 bytes of UTF-8, not {}; shorten it",
            text.len()
        )));
    }
    Ok(text.to_owned())
}

/// The options after the fixed arguments: `NAME value` pairs, each at most
/// once, names in any case. Returns the values in the order of `names`.
pub fn options<'a>(
    args: &'a [RedisString],
    names: &[&str],
) -> Result<Vec<Option<&'a RedisString>>, RedisError> {
    let mut values = vec![None; names.len()];
    let mut rest = args.iter();
    while let Some(name) = rest.next() {
        let given = name.as_slice();
        let Some(at) = names
            .iter()
            .position(|n| n.as_bytes().eq_ignore_ascii_case(given))
        else {
            return Err(RedisError::String(format!(
                "ERR option: {:?} is not an option here; use {}",
                String::from_utf8_lossy(given),
                names.join(", ")
            )));
        };
        let Some(value) = rest.next() else {
            return Err(RedisError::String(format!(
                "ERR {}: {} needs a value after it",
                names[at].to_ascii_lowercase(),
                names[at]
            )));
        };
        if values[at].replace(value).is_some() {
            return Err(RedisError::String(format!(
                "ERR {}: {} is given twice; give it once",
                names[at].to_ascii_lowercase(),
                names[at]
            )));
        }
    }
    Ok(values)
}

#[cfg(test)]
mod tests {
    use super::digits;
    use proptest::prelude::*;

    proptest! {
        /// The digits read as Rust's own parser reads them, and nothing
        /// that is not 1 to 20 ASCII digits is a number.
        #[test]
        fn digits_read_as_the_standard_parser_does(text in "[0-9]{0,22}|[0-9+ a-]{1,6}") {
            let ours = digits(text.as_bytes());
            let plain = text.bytes().all(|b| b.is_ascii_digit()) && !text.is_empty() && text.len() <= 20;
            let std = if plain { text.parse::<u64>().ok() } else { None };
            prop_assert_eq!(ours, std);
        }
    }

    #[test]
    fn the_largest_number_is_read_and_one_more_is_not() {
        assert_eq!(digits(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(digits(b"18446744073709551616"), None);
        assert_eq!(digits(b"00000000000000000001"), Some(1));
    }
}

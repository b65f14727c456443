//! Names in Redis: the Redis key of a fusebox key, a ticket's token (which
//! carries its key, so that `Complete` and `Renew` find the key's hash
//! slot from the ticket alone), and a policy's id.

use super::super::error::{check_key, invalid};
use super::super::EngineError;
use crate::domain::TicketId;

/// The prefix of every key's Redis key: `fusebox:k:<key>`.
pub const KEY_PREFIX: &str = "fusebox:k:";

/// The Redis key of a fusebox key.
pub fn redis_key(key: &str) -> String {
    format!("{KEY_PREFIX}{key}")
}

/// The id the module knows a policy's JSON by: the first 16 bytes of its
/// SHA-256, in hex (a command names a known policy as `@` and the id).
pub fn policy_id(json: &str) -> String {
    crate::domain::hex::encode(crate::domain::policy_id(json.as_bytes()))
}

/// A ticket's id as the module's commands take it: 32 lower-case hex
/// digits.
pub fn hex_id(id: TicketId) -> String {
    id.to_string()
}

/// A ticket's token with its key in it, so that `Complete` and `Renew`
/// find the key (and its hash slot) from the ticket alone: the id's 32 hex
/// digits, a dot, and the key's bytes in hex.
pub fn token_with_key(id: TicketId, key: &str) -> String {
    let mut token = String::with_capacity(33 + 2 * key.len());
    token.push_str(&hex_id(id));
    token.push('.');
    token.push_str(&crate::domain::hex::encode(key));
    token
}

/// True for lower-case hex digits only: every token this server writes is
/// lower case, so another spelling names no ticket.
fn lower_hex(text: &str) -> bool {
    text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The id a token names, without reading its key.
pub fn ticket_id(token: &str) -> Option<TicketId> {
    let (id, _) = token.split_once('.')?;
    if id.len() != 32 || !lower_hex(id) {
        return None;
    }
    TicketId::from_hex(id.as_bytes())
}

/// The id and key a token names; a token of another shape is not found
/// (L4), an empty one is malformed.
pub fn ticket_and_key(token: &str) -> Result<(TicketId, String), EngineError> {
    if token.is_empty() {
        return Err(invalid(
            "ticket",
            "is required: pass the ticket that Acquire returned",
        ));
    }
    let id = ticket_id(token).ok_or(EngineError::TicketNotFound)?;
    let (_, key) = token.split_once('.').ok_or(EngineError::TicketNotFound)?;
    if !lower_hex(key) {
        return Err(EngineError::TicketNotFound);
    }
    let bytes = crate::domain::hex::decode(key).map_err(|_| EngineError::TicketNotFound)?;
    let key = String::from_utf8(bytes).map_err(|_| EngineError::TicketNotFound)?;
    check_key(&key).map_err(|_| EngineError::TicketNotFound)?;
    Ok((id, key))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_token_carries_its_key() {
        let id = TicketId(0x0123_4567_89ab_cdef_0011_2233_4455_6677);
        for key in ["payments", "a.b/c:{d}", "ключ", "k"] {
            let token = token_with_key(id, key);
            assert_eq!(ticket_and_key(&token).unwrap(), (id, key.to_owned()));
        }
        for bad in [
            "x",
            "0123.6b",
            "0123456789abcdef0011223344556677.6",
            "0123456789abcdef0011223344556677.ZZ",
            "0123456789ABCDEF0011223344556677.6b",
            "0123456789abcdef0011223344556677.6B",
            "0123456789abcdef0011223344556677.",
            "0123456789abcdef0011223344556677.ff",
        ] {
            assert_eq!(
                ticket_and_key(bad),
                Err(EngineError::TicketNotFound),
                "{bad}"
            );
        }
        assert!(matches!(
            ticket_and_key(""),
            Err(EngineError::Invalid { .. })
        ));
    }

    proptest! {
        /// Any key a token is made for reads back from it, and only the
        /// token's own spelling does.
        #[test]
        fn a_token_reads_back_and_only_as_written(id: u128, key in "[a-z0-9/:._-]{1,40}") {
            let id = TicketId(id);
            let token = token_with_key(id, &key);
            prop_assert_eq!(ticket_and_key(&token), Ok((id, key)));
            prop_assert_eq!(ticket_id(&token), Some(id));
            let upper = token.to_uppercase();
            if upper != token {
                prop_assert_eq!(ticket_and_key(&upper), Err(EngineError::TicketNotFound));
            }
        }
    }

    #[test]
    fn a_policy_id_is_the_modules() {
        // The module's own test checks the same id for the same bytes.
        assert_eq!(policy_id("{}"), "44136fa355b3678a1146ad16f7e8649e");
    }
}

//! Ticket ids and their tokens (L1): 128 bits from a cryptographic random
//! generator seeded by the operating system, written as 32 lower-case hex
//! digits.

use super::error::{invalid, EngineError};
use crate::domain::TicketId;

/// A fresh ticket id: 128 random bits (L1).
pub(super) fn random_ticket() -> Result<TicketId, EngineError> {
    // The thread's ChaCha generator, seeded (and reseeded) from the
    // operating system: unguessable as the system's own, without a system
    // call per ticket.
    Ok(TicketId(rand::random::<u128>()))
}

/// The opaque token of a ticket: 32 lower-case hex digits.
pub fn token_of(id: TicketId) -> String {
    String::from_utf8_lossy(&id.to_hex()).into_owned()
}

/// The ticket a token names; an empty token is malformed, any other
/// unknown shape is simply not found (L4).
pub(super) fn ticket_of(token: &str) -> Result<TicketId, EngineError> {
    if token.is_empty() {
        return Err(invalid(
            "ticket",
            "is required: pass the ticket that Acquire returned",
        ));
    }
    if token.len() != 32
        || !token
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    {
        return Err(EngineError::TicketNotFound);
    }
    u128::from_str_radix(token, 16)
        .map(TicketId)
        .map_err(|_| EngineError::TicketNotFound)
}

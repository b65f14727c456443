//! Ticket ids and their tokens (L1): 128 bits from the operating system's
//! random source, written as 32 lower-case hex digits.

use super::error::{invalid, EngineError};
use crate::domain::TicketId;

/// A fresh ticket id: 128 bits from the operating system's random source (L1).
pub(super) fn random_ticket() -> Result<TicketId, EngineError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes)
        .map_err(|e| EngineError::Internal(format!("no random source: {e}")))?;
    Ok(TicketId(u128::from_le_bytes(bytes)))
}

/// The opaque token of a ticket: 32 lower-case hex digits.
pub fn token_of(id: TicketId) -> String {
    format!("{:032x}", id.0)
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

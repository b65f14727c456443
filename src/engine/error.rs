//! Why the engine refuses a request, and the checks on its arguments.

use crate::domain::{validate_key, FuseError};

/// Longest operator reason accepted by `Isolate` and `Close`, in bytes.
pub const MAX_REASON_BYTES: usize = 1024;

/// Why the engine refused a request. Each maps to one gRPC code in the server.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// A field is malformed (E2): `INVALID_ARGUMENT`.
    #[error("{field}: {problem}")]
    Invalid {
        /// The field's name.
        field: &'static str,
        /// What is wrong with it.
        problem: String,
    },
    /// The ticket is unknown, completed or expired (L4): `NOT_FOUND`.
    #[error("ticket: not found; it is unknown, already completed, or its lease ended")]
    TicketNotFound,
    /// A cap is reached (K3): `RESOURCE_EXHAUSTED`.
    #[error("too many {what}: the server's {cap} cap ({limit}) is reached; existing keys keep working, retry later or raise [server].{cap}")]
    Exhausted {
        /// What ran out: keys, tickets or waiters.
        what: &'static str,
        /// The config field of the cap.
        cap: &'static str,
        /// Its value.
        limit: u64,
    },
    /// A credential holds all its share of something (decisions 99):
    /// `RESOURCE_EXHAUSTED`.
    #[error("{credential:?} holds {limit} {what}, all that its share allows ({}); let some go (complete tickets, end streams, delete rules) or give it more with limits = {{ {field} = N }} in its [auth] entry", share_source(*.explicit, field))]
    ShareExhausted {
        /// The credential's name.
        credential: String,
        /// What it holds, in words.
        what: &'static str,
        /// The field that sets the limit.
        field: &'static str,
        /// The limit.
        limit: u64,
        /// The entry's `limits` set it (else it is `[auth] share`).
        explicit: bool,
    },
    /// No rule has this match: `NOT_FOUND`.
    #[error("match: no rule matches {pattern:?} exactly; ListPolicies shows the rules")]
    RuleNotFound {
        /// The match asked for.
        pattern: String,
    },
    /// The Redis store cannot be reached, or its slot is moving:
    /// `UNAVAILABLE`.
    #[error("the state store is unavailable: {0}; the call changed nothing that was reported, retry with backoff")]
    StoreUnavailable(String),
    /// The Redis store is full (`maxmemory`, `OOM`): `RESOURCE_EXHAUSTED`.
    #[error("the state store is full: {0}; nothing was changed; raise its maxmemory, give it more memory, or let keys go")]
    StoreFull(String),
    /// The call's deadline passed before it was decided (it waited in
    /// this server, or for the store): `DEADLINE_EXCEEDED`, nothing
    /// charged (F1).
    #[error("the call's deadline passed {late_ms} ms before it could be decided (it waited in fusebox or for the store); it was not decided and nothing was charged: retry with a longer deadline if the caller still wants the answer")]
    DeadlineExceeded {
        /// How long ago the deadline passed.
        late_ms: u64,
    },
    /// The server is shutting down: `UNAVAILABLE`.
    #[error("fusebox is shutting down; retry against another instance")]
    ShuttingDown,
    /// Something that cannot happen did: `INTERNAL`.
    #[error("internal error: {0}")]
    Internal(String),
}

/// Where a share's limit comes from, in words.
fn share_source(explicit: bool, field: &str) -> String {
    if explicit {
        format!("limits.{field} in its entry")
    } else {
        format!("[auth] share of [server] {field}")
    }
}

/// A malformed field (E2).
pub(super) fn invalid(field: &'static str, problem: impl Into<String>) -> EngineError {
    EngineError::Invalid {
        field,
        problem: problem.into(),
    }
}

/// A lease of zero (L2).
pub(super) fn zero_lease() -> EngineError {
    invalid(
        "lease",
        "must be longer than 0 ms; leave it out for the policy's default",
    )
}

/// Checks a key's syntax (K1).
pub(super) fn check_key(key: &str) -> Result<(), EngineError> {
    validate_key(key).map_err(|e| {
        let text = e.to_string();
        invalid(
            "key",
            text.strip_prefix("key: ").unwrap_or(&text).to_owned(),
        )
    })
}

/// Checks an operator's reason for `Isolate` or `Close`.
pub(super) fn check_reason(reason: &str) -> Result<(), EngineError> {
    if reason.len() > MAX_REASON_BYTES {
        return Err(invalid(
            "reason",
            format!(
                "must be at most {MAX_REASON_BYTES} bytes, not {}",
                reason.len()
            ),
        ));
    }
    if reason.chars().any(char::is_control) {
        return Err(invalid("reason", "must not contain control characters"));
    }
    Ok(())
}

/// A domain refusal as the engine reports it.
pub(super) fn fuse_error(e: FuseError) -> EngineError {
    match e {
        FuseError::UnknownTicket => EngineError::TicketNotFound,
        FuseError::ZeroLease => zero_lease(),
        FuseError::ClockWentBack { .. }
        | FuseError::TicketInUse
        | FuseError::NoRoomForTicket
        | FuseError::NoRoomForWaiter => EngineError::Internal(e.to_string()),
    }
}

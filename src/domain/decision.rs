//! The answer to a request, as a value (STYLE: decisions are values, not
//! booleans or error strings), and its kind, the name it is written by.

use serde::{Deserialize, Serialize};

use crate::ticket::TicketId;
use crate::{Millis, Reason};

/// A ticket handed out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Grant {
    /// The ticket.
    pub ticket: TicketId,
    /// When its lease ends.
    pub lease_end: Millis,
}

/// The answer to a request (SPEC B1, P2–P6, E1). Decisions are values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// Admitted; `None` for a status check, which gets no ticket.
    Granted(Option<Grant>),
    /// Admitted as the key's one probe.
    Probe(Grant),
    /// Not now, by the breaker.
    Blocked {
        /// `Open` or `ProbeInFlight`.
        reason: Reason,
        /// When to ask again, in ms from now.
        retry_after: Millis,
    },
    /// Isolated by an operator.
    Refused,
    /// Not granted by the permit book.
    Denied {
        /// Why.
        reason: Reason,
        /// When `n` permits may be there, in ms from now, where the algorithm can tell.
        retry_after: Option<Millis>,
    },
    /// Waiting; the final answer comes as a [`Notice::Answered`](crate::Notice::Answered).
    Queued,
}

impl Decision {
    /// The ticket this decision hands out, if any.
    pub fn grant(&self) -> Option<Grant> {
        match *self {
            Decision::Granted(grant) => grant,
            Decision::Probe(grant) => Some(grant),
            _ => None,
        }
    }

    /// What kind of decision this is.
    pub fn kind(&self) -> DecisionKind {
        match self {
            Decision::Granted(_) => DecisionKind::Granted,
            Decision::Probe(_) => DecisionKind::Probe,
            Decision::Blocked { .. } => DecisionKind::Blocked,
            Decision::Refused => DecisionKind::Refused,
            Decision::Denied { .. } => DecisionKind::Denied,
            Decision::Queued => DecisionKind::Queued,
        }
    }
}

/// A [`Decision`]'s kind, without its details: what the Redis module's
/// replies and notices name it by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DecisionKind {
    /// [`Decision::Granted`].
    Granted,
    /// [`Decision::Probe`].
    Probe,
    /// [`Decision::Blocked`].
    Blocked,
    /// [`Decision::Refused`].
    Refused,
    /// [`Decision::Denied`].
    Denied,
    /// [`Decision::Queued`].
    Queued,
}

impl DecisionKind {
    /// Every kind.
    pub const ALL: [DecisionKind; 6] = [
        DecisionKind::Granted,
        DecisionKind::Probe,
        DecisionKind::Blocked,
        DecisionKind::Refused,
        DecisionKind::Denied,
        DecisionKind::Queued,
    ];

    /// The kind's name: lower case, as the module writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            DecisionKind::Granted => "granted",
            DecisionKind::Probe => "probe",
            DecisionKind::Blocked => "blocked",
            DecisionKind::Refused => "refused",
            DecisionKind::Denied => "denied",
            DecisionKind::Queued => "queued",
        }
    }
}

crate::names::named!(DecisionKind, "decision");

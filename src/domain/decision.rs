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
    /// Granted by a shadow policy (SPEC D1) that would have blocked or
    /// denied the request: on the wire `GRANTED` with `shadow_decision` and
    /// `shadow_reason`. The reason says both (see [`Decision::shadow_of`]):
    /// `open` and `probe_in_flight` are the breaker's (`BLOCKED`), any other
    /// the permit book's or the retry budget's (`DENIED`). A would-be
    /// `QUEUED` never arises, since nobody waits on a shadow policy (D3).
    Shadow {
        /// The shadow ticket; `None` for a status check.
        grant: Option<Grant>,
        /// Why the request would have been blocked or denied.
        reason: Reason,
    },
}

impl Decision {
    /// The ticket this decision hands out, if any.
    pub fn grant(&self) -> Option<Grant> {
        match *self {
            Decision::Granted(grant) => grant,
            Decision::Probe(grant) => Some(grant),
            Decision::Shadow { grant, .. } => grant,
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
            Decision::Shadow { .. } => DecisionKind::Shadow,
        }
    }

    /// What a shadow policy's request answered `reason` would have had:
    /// `BLOCKED` for the breaker's reasons, else `DENIED` (D1).
    pub fn shadow_of(reason: Reason) -> DecisionKind {
        match reason {
            Reason::Open | Reason::ProbeInFlight => DecisionKind::Blocked,
            _ => DecisionKind::Denied,
        }
    }

    /// For a shadow grant: the decision it would have had and why (D1).
    pub fn shadow(&self) -> Option<(DecisionKind, Reason)> {
        match *self {
            Decision::Shadow { reason, .. } => Some((Decision::shadow_of(reason), reason)),
            _ => None,
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
    /// [`Decision::Shadow`].
    Shadow,
}

impl DecisionKind {
    /// Every kind.
    pub const ALL: [DecisionKind; 7] = [
        DecisionKind::Granted,
        DecisionKind::Probe,
        DecisionKind::Blocked,
        DecisionKind::Refused,
        DecisionKind::Denied,
        DecisionKind::Queued,
        DecisionKind::Shadow,
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
            DecisionKind::Shadow => "shadow",
        }
    }
}

crate::names::named!(DecisionKind, "decision");

//! Live slow calls (SPEC S2): which current closed-period tickets are
//! slow now, and when the next ones become slow.
//!
//! Tickets of one key under one `slow.duration` become slow in grant
//! order, so the tickets not yet slow wait in a queue ordered by the
//! instant they become slow (`max(since, granted_at + duration)`, where
//! `since` is when the duration came in force, Y4): a grant appends, an
//! instant pops from the front, a completion finds its entry by binary
//! search on its instant. Live slow tickets are only counted: a current
//! closed-period ticket whose instant has passed and which is not in the
//! queue is live slow. Any epoch change empties both, since no ticket of
//! an earlier epoch is current.

use std::collections::VecDeque;

use crate::quorum::CallerId;
use crate::ticket::TicketId;
use crate::Millis;

/// A current closed-period ticket that is not slow yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pending {
    /// When it becomes live slow.
    pub at: Millis,
    /// The ticket.
    pub ticket: TicketId,
    /// It was counted in the statistics' `slow` already (it was live slow
    /// before a policy change lengthened the duration).
    pub counted: bool,
    /// Who acquired it (Q1).
    pub caller: CallerId,
}

/// A key's live slow calls.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SlowCalls {
    /// When the policy's `slow.duration` came in force (Y4); 0 when it was
    /// there from the start.
    pub since: Millis,
    /// Tickets not slow yet, by the instant they become slow, then grant order.
    pub pending: VecDeque<Pending>,
    /// Live slow tickets.
    pub live: u32,
    /// The callers of the live slow tickets, each with how many it holds
    /// (Q2 for S3 (b)).
    pub callers: Vec<(CallerId, u32)>,
}

impl SlowCalls {
    /// True when no ticket is tracked.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty() && self.live == 0
    }

    /// Forgets every ticket (an epoch change, or `slow` removed).
    pub fn clear(&mut self) {
        self.pending.clear();
        self.live = 0;
        self.callers.clear();
        self.since = 0;
    }

    /// A ticket of `caller` became live slow.
    pub fn join(&mut self, caller: CallerId) {
        match self.callers.iter_mut().find(|c| c.0 == caller) {
            Some(c) => c.1 = c.1.saturating_add(1),
            None => self.callers.push((caller, 1)),
        }
    }

    /// A live slow ticket of `caller` left (its completion or lease end).
    pub fn leave(&mut self, caller: CallerId) {
        if let Some(i) = self.callers.iter().position(|c| c.0 == caller) {
            self.callers[i].1 = self.callers[i].1.saturating_sub(1);
            if self.callers[i].1 == 0 {
                self.callers.swap_remove(i);
            }
        }
    }

    /// The instant `granted_at`'s ticket becomes slow under `duration`.
    pub fn instant(&self, granted_at: Millis, duration: Millis) -> Millis {
        self.since.max(granted_at.saturating_add(duration))
    }

    /// The next instant a ticket becomes live slow.
    pub fn next(&self) -> Option<Millis> {
        self.pending.front().map(|p| p.at)
    }

    /// Takes `ticket`, due at `at`, out of the queue; `Some(counted)` when
    /// it was there.
    pub fn take(&mut self, ticket: TicketId, at: Millis) -> Option<bool> {
        let first = self.pending.partition_point(|p| p.at < at);
        let offset = self
            .pending
            .iter()
            .skip(first)
            .take_while(|p| p.at == at)
            .position(|p| p.ticket == ticket)?;
        self.pending.remove(first + offset).map(|p| p.counted)
    }
}

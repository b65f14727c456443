//! A key's live tickets: what any table of them must do
//! ([`TicketTable`]), and the in-memory table the embedded engine keeps
//! ([`Tickets`]), small for the common case.
//!
//! Most keys hold one ticket or a few: up to [`FEW`] sit in one vector and
//! are found by scanning it. More move to a map by id with an ordered set by
//! lease end, and back once few are left. Either way lease ends are settled
//! in `(lease end, grant number)` order, that is at one instant in the order
//! the tickets were granted (T2, L3), and at most one ticket is flagged as
//! the probe (B2).

use std::collections::{BTreeSet, HashMap};

use super::Ticket;
use crate::ticket::{PackedId, TicketId};
use crate::Millis;

/// The most tickets kept in a plain vector; beyond this they are indexed.
pub const FEW: usize = 8;

/// Where a key's live tickets are kept. A [`super::Fuse`] works on any
/// table that behaves as a map by id with an order by lease end: the
/// embedded engine's [`Tickets`], or a store's own layout (the Redis module
/// keeps them in place in the key's value, so that a step on a key with a
/// thousand tickets touches only the few it changes).
///
/// The rules every table keeps: ids are unique; at most one ticket is
/// flagged as the probe, and inserting a probe takes the flag from the
/// ticket that had it (B2); [`TicketTable::first_lease`] is the smallest
/// `(lease end, grant number, id)` of the live tickets (T2, L3); grant
/// numbers ([`Ticket::seq`]) only grow while a ticket is live, and start
/// again at 0 once none is.
pub trait TicketTable: Default {
    /// How many tickets are live.
    fn len(&self) -> usize;

    /// True when no ticket is live.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A live ticket.
    fn get(&self, id: TicketId) -> Option<Ticket>;

    /// True when `id` names a live ticket.
    fn contains(&self, id: TicketId) -> bool {
        self.get(id).is_some()
    }

    /// Adds a ticket whose id is not live. A probe takes the probe flag
    /// from the ticket that had it: that one stays live, superseded (B2).
    /// The next grant number is then above the ticket's.
    fn insert(&mut self, id: TicketId, ticket: Ticket);

    /// The grant number the next ticket granted takes: above every live
    /// ticket's (T2).
    fn next_seq(&self) -> u64;

    /// Removes a live ticket.
    fn remove(&mut self, id: TicketId) -> Option<Ticket>;

    /// The ticket whose lease ends first (of equals, the first granted),
    /// and when.
    fn first_lease(&self) -> Option<(Millis, TicketId)>;

    /// Moves a live ticket's lease end.
    fn set_lease_end(&mut self, id: TicketId, lease_end: Millis);

    /// Notes that a live ticket was counted as slow ([`Ticket::slow_counted`]).
    fn mark_slow_counted(&mut self, id: TicketId);

    /// Marks every ticket's permits as neither to be returned nor settled
    /// (the limiter they came from was remade or dropped, or keeps time
    /// otherwise): clears `holds` and `settles`.
    fn forget_holds(&mut self);

    /// Calls `visit` with every live ticket, in no particular order.
    fn for_each(&self, visit: &mut dyn FnMut(TicketId, Ticket));
}

/// A ticket with its id, as kept in the vector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Slot {
    id: PackedId,
    ticket: Ticket,
}

/// Many tickets, indexed.
#[derive(Clone, Debug, Default)]
pub(super) struct Indexed {
    by_id: HashMap<PackedId, Ticket>,
    /// `(lease end, grant number, ticket)` for every live ticket.
    leases: BTreeSet<(Millis, u64, PackedId)>,
    /// The ticket flagged as the probe, if any.
    probe: Option<PackedId>,
}

/// Live tickets by id, in lease-end order when settled: the embedded
/// engine's [`TicketTable`].
#[derive(Clone, Debug)]
pub struct Tickets {
    inner: Inner,
    /// The next grant number ([`TicketTable::next_seq`]).
    next: u64,
}

#[derive(Clone, Debug)]
enum Inner {
    /// Up to [`FEW`] tickets, scanned.
    Few(Vec<Slot>),
    /// More, indexed.
    Many(Box<Indexed>),
}

impl Default for Tickets {
    fn default() -> Self {
        Tickets {
            inner: Inner::Few(Vec::new()),
            next: 0,
        }
    }
}

impl TicketTable for Tickets {
    fn len(&self) -> usize {
        match &self.inner {
            Inner::Few(v) => v.len(),
            Inner::Many(m) => m.by_id.len(),
        }
    }

    fn get(&self, id: TicketId) -> Option<Ticket> {
        let id = PackedId::from(id);
        match &self.inner {
            Inner::Few(v) => v.iter().find(|s| s.id == id).map(|s| s.ticket),
            Inner::Many(m) => m.by_id.get(&id).copied(),
        }
    }

    fn insert(&mut self, id: TicketId, ticket: Ticket) {
        let id = PackedId::from(id);
        debug_assert!(!self.contains(id.into()), "ticket ids are never reused");
        if ticket.probe {
            self.clear_probe();
        }
        self.next = self.next.max(ticket.seq.saturating_add(1));
        match &mut self.inner {
            Inner::Few(v) if v.len() < FEW => v.push(Slot { id, ticket }),
            Inner::Few(v) => {
                let mut m = Indexed::default();
                for s in v.drain(..).chain([Slot { id, ticket }]) {
                    m.insert(s);
                }
                self.inner = Inner::Many(Box::new(m));
            }
            Inner::Many(m) => m.insert(Slot { id, ticket }),
        }
    }

    fn remove(&mut self, id: TicketId) -> Option<Ticket> {
        let id = PackedId::from(id);
        let removed = match &mut self.inner {
            Inner::Few(v) => {
                let at = v.iter().position(|s| s.id == id)?;
                Some(v.swap_remove(at).ticket)
            }
            Inner::Many(m) => {
                let ticket = m.by_id.remove(&id)?;
                m.leases.remove(&(ticket.lease_end, ticket.seq, id));
                if m.probe == Some(id) {
                    m.probe = None;
                }
                Some(ticket)
            }
        };
        if self.len() == 0 {
            // Numbers only order live tickets: an empty table starts again
            // at 0, as a key made afresh does (K2).
            self.next = 0;
        }
        if let Inner::Many(m) = &mut self.inner {
            if m.by_id.len() <= FEW / 2 {
                let slots = m.by_id.drain().map(|(id, ticket)| Slot { id, ticket });
                self.inner = Inner::Few(slots.collect());
            }
        }
        removed
    }

    fn next_seq(&self) -> u64 {
        self.next
    }

    fn first_lease(&self) -> Option<(Millis, TicketId)> {
        let (end, _, id) = match &self.inner {
            Inner::Few(v) => v
                .iter()
                .map(|s| (s.ticket.lease_end, s.ticket.seq, s.id))
                .min()?,
            Inner::Many(m) => *m.leases.first()?,
        };
        Some((end, id.into()))
    }

    fn set_lease_end(&mut self, id: TicketId, lease_end: Millis) {
        let id = PackedId::from(id);
        match &mut self.inner {
            Inner::Few(v) => {
                if let Some(s) = v.iter_mut().find(|s| s.id == id) {
                    s.ticket.lease_end = lease_end;
                }
            }
            Inner::Many(m) => {
                if let Some(t) = m.by_id.get_mut(&id) {
                    m.leases.remove(&(t.lease_end, t.seq, id));
                    m.leases.insert((lease_end, t.seq, id));
                    t.lease_end = lease_end;
                }
            }
        }
    }

    fn mark_slow_counted(&mut self, id: TicketId) {
        let id = PackedId::from(id);
        let ticket = match &mut self.inner {
            Inner::Few(v) => v.iter_mut().find(|s| s.id == id).map(|s| &mut s.ticket),
            Inner::Many(m) => m.by_id.get_mut(&id),
        };
        if let Some(t) = ticket {
            t.slow_counted = true;
        }
    }

    fn forget_holds(&mut self) {
        match &mut self.inner {
            Inner::Few(v) => v.iter_mut().for_each(|s| s.ticket.forget()),
            Inner::Many(m) => m.by_id.values_mut().for_each(Ticket::forget),
        }
    }

    fn for_each(&self, visit: &mut dyn FnMut(TicketId, Ticket)) {
        match &self.inner {
            Inner::Few(v) => v.iter().for_each(|s| visit(s.id.into(), s.ticket)),
            Inner::Many(m) => m.by_id.iter().for_each(|(&id, &t)| visit(id.into(), t)),
        }
    }
}

impl Tickets {
    fn clear_probe(&mut self) {
        match &mut self.inner {
            Inner::Few(v) => v
                .iter_mut()
                .filter(|s| s.ticket.probe)
                .for_each(|s| s.ticket.probe = false),
            Inner::Many(m) => {
                if let Some(t) = m.probe.take().and_then(|p| m.by_id.get_mut(&p)) {
                    t.probe = false;
                }
            }
        }
    }

    /// Raises the next grant number to `next` (a restored state's).
    pub(super) fn raise_next_seq(&mut self, next: u64) {
        self.next = self.next.max(next);
    }

    /// True when the tickets are kept indexed.
    #[cfg(test)]
    pub fn is_indexed(&self) -> bool {
        matches!(self.inner, Inner::Many(_))
    }
}

impl Indexed {
    fn insert(&mut self, s: Slot) {
        if s.ticket.probe {
            self.probe = Some(s.id);
        }
        self.leases.insert((s.ticket.lease_end, s.ticket.seq, s.id));
        self.by_id.insert(s.id, s.ticket);
    }
}

impl PartialEq for Tickets {
    /// The same tickets, however they are kept.
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && sorted(self) == sorted(other)
    }
}

/// Every ticket of `table` with its id, in id order.
pub fn sorted(table: &impl TicketTable) -> Vec<(TicketId, Ticket)> {
    let mut all = Vec::with_capacity(table.len());
    table.for_each(&mut |id, t| all.push((id, t)));
    all.sort_by_key(|&(id, _)| id);
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ticket(lease_end: Millis, probe: bool, seq: u64) -> Ticket {
        Ticket {
            seq,
            slow_counted: false,
            caller: Default::default(),
            epoch: 0,
            permits: 1,
            probe,
            lease_end,
            holds: false,
            granted_at: 0,
            settles: false,
            shadow: false,
        }
    }

    #[test]
    fn few_and_many_tickets_settle_in_lease_order_and_keep_one_probe() {
        for count in [5u128, 40] {
            let mut t = Tickets::default();
            for i in 0..count {
                // Lease ends out of grant order, ids against it: ties are
                // settled in grant order (T2), not by id.
                let seq = t.next_seq();
                assert_eq!(seq, i as u64);
                t.insert(
                    TicketId(i * 7 % 41),
                    ticket(100 + (i as u64 % 3), i == 2, seq),
                );
            }
            assert_eq!(t.is_indexed(), count as usize > FEW);
            assert_eq!(t.first_lease(), Some((100, TicketId(0))));
            t.insert(TicketId(1000), ticket(500, true, t.next_seq()));
            assert!(!t.get(TicketId(14)).expect("live").probe, "superseded");
            assert!(t.get(TicketId(1000)).expect("live").probe);
            t.set_lease_end(TicketId(1000), 50);
            assert_eq!(t.first_lease(), Some((50, TicketId(1000))));
            assert!(t.remove(TicketId(1000)).is_some_and(|t| t.probe));
            assert_eq!(t.remove(TicketId(1000)), None);
            let mut ends = Vec::new();
            while let Some((end, id)) = t.first_lease() {
                ends.push((end, t.get(id).expect("live").seq));
                t.remove(id);
            }
            assert_eq!(ends.len(), count as usize);
            assert!(
                ends.windows(2).all(|w| w[0] < w[1]),
                "lease, then grant order"
            );
            assert!(!t.is_indexed(), "few again");
        }
    }
}

#[cfg(test)]
mod model {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    #[derive(Clone, Debug)]
    enum Op {
        Insert(u8, Millis, bool),
        Remove(u8),
        Renew(u8, Millis),
        SettleFirst,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (any::<u8>(), 0u64..20, proptest::bool::weighted(0.2))
                .prop_map(|(id, end, probe)| Op::Insert(id, end, probe)),
            2 => any::<u8>().prop_map(Op::Remove),
            1 => (any::<u8>(), 0u64..20).prop_map(|(id, end)| Op::Renew(id, end)),
            2 => Just(Op::SettleFirst),
        ]
    }

    /// Ids spread over both halves of the `u128`, so packing is exercised.
    fn ticket_id(n: u8) -> TicketId {
        TicketId((u128::from(n % 7) << 64) | u128::from(n))
    }

    proptest! {
        /// Against a plain ordered map, through the switches between few and many.
        #[test]
        fn tickets_behave_as_an_ordered_map(ops in proptest::collection::vec(op(), 1..200)) {
            let mut t = Tickets::default();
            let mut model: BTreeMap<TicketId, Ticket> = BTreeMap::new();
            for op in ops {
                match op {
                    Op::Insert(n, end, probe) => {
                        let id = ticket_id(n);
                        if model.contains_key(&id) {
                            continue;
                        }
                        let seq = t.next_seq();
                        let ticket = Ticket { caller: Default::default(), epoch: u64::from(n), permits: 1, probe, lease_end: end, holds: false, granted_at: 0, settles: false, shadow: false, seq, slow_counted: false };
                        if probe {
                            model.values_mut().for_each(|t| t.probe = false);
                        }
                        model.insert(id, ticket);
                        t.insert(id, ticket);
                    }
                    Op::Remove(n) => {
                        prop_assert_eq!(t.remove(ticket_id(n)), model.remove(&ticket_id(n)));
                    }
                    Op::Renew(n, end) => {
                        if let Some(m) = model.get_mut(&ticket_id(n)) {
                            m.lease_end = end;
                        }
                        t.set_lease_end(ticket_id(n), end);
                    }
                    Op::SettleFirst => {
                        let first = model.iter().map(|(&id, t)| (t.lease_end, t.seq, id)).min().map(|(end, _, id)| (end, id));
                        prop_assert_eq!(t.first_lease(), first);
                        if let Some((_, id)) = first {
                            prop_assert_eq!(t.remove(id), model.remove(&id));
                        }
                    }
                }
                prop_assert_eq!(t.len(), model.len());
                prop_assert!(t.is_indexed() || t.len() <= FEW);
                for (&id, m) in &model {
                    prop_assert_eq!(t.get(id), Some(*m));
                }
                let first = model.iter().map(|(&id, t)| (t.lease_end, t.seq, id)).min().map(|(end, _, id)| (end, id));
                prop_assert_eq!(t.first_lease(), first);
            }
        }
    }
}

//! The permit book: a key's limiter and its wait queue, counted in permits
//! (SPEC P3–P8). The book keeps order and room; the decisions that use it
//! live in [`Fuse`](crate::Fuse), where the breaker is known too.
//!
//! Most queues are short: up to [`FEW`] waiters sit in one vector in arrival
//! order and are found by scanning it. A longer queue moves to indexed maps
//! (by arrival, by ticket, by timeout) and back once it is short again.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::limiter::Limiter;
use crate::policy::{LimiterPolicy, Order};
use crate::quorum::CallerId;
use crate::ticket::{PackedId, TicketId};
use crate::Millis;

/// The most waiters kept in a plain vector; beyond this the queue is indexed.
pub const FEW: usize = 8;

/// A request waiting for permits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Waiter {
    /// The ticket it gets when served; also its name while it waits.
    pub id: TicketId,
    /// Permits it asks for.
    pub permits: u32,
    /// When its `max_wait` ends.
    pub until: Millis,
    /// The lease it asked for, if any.
    pub lease: Option<Millis>,
    /// Who asked (Q1): its ticket's caller.
    pub caller: CallerId,
}

/// A waiter as kept: no `u128` alignment, and the lease in one word (a
/// lease of zero is refused before anyone waits, so 0 means the default).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Queued {
    id: PackedId,
    until: Millis,
    lease: Millis,
    permits: u32,
    caller: CallerId,
}

impl From<Waiter> for Queued {
    fn from(w: Waiter) -> Self {
        debug_assert_ne!(w.lease, Some(0), "a zero lease never waits");
        Queued {
            id: w.id.into(),
            until: w.until,
            lease: w.lease.unwrap_or(0),
            permits: w.permits,
            caller: w.caller,
        }
    }
}

impl From<Queued> for Waiter {
    fn from(q: Queued) -> Self {
        Waiter {
            id: q.id.into(),
            permits: q.permits,
            until: q.until,
            lease: (q.lease != 0).then_some(q.lease),
            caller: q.caller,
        }
    }
}

/// A long queue, indexed.
#[derive(Clone, Debug, Default)]
struct Indexed {
    /// Waiters by arrival number: the first entry is the oldest.
    queue: BTreeMap<u64, Queued>,
    /// Arrival number of each waiter, for withdrawal by ticket.
    arrival: HashMap<PackedId, u64>,
    /// `(until, arrival)` of each waiter, for timeouts in time order.
    timeouts: BTreeSet<(Millis, u64)>,
    next_arrival: u64,
}

impl Indexed {
    fn push(&mut self, q: Queued) {
        let n = self.next_arrival;
        self.next_arrival += 1;
        self.queue.insert(n, q);
        self.arrival.insert(q.id, n);
        self.timeouts.insert((q.until, n));
    }

    fn remove_arrival(&mut self, n: u64) -> Option<Queued> {
        let q = self.queue.remove(&n)?;
        self.arrival.remove(&q.id);
        self.timeouts.remove(&(q.until, n));
        Some(q)
    }
}

/// Waiters, oldest first.
#[derive(Clone, Debug)]
enum Queue {
    /// Up to [`FEW`] waiters in arrival order.
    Few(Vec<Queued>),
    /// More, indexed.
    Many(Box<Indexed>),
}

impl Default for Queue {
    fn default() -> Self {
        Queue::Few(Vec::new())
    }
}

impl Queue {
    fn len(&self) -> usize {
        match self {
            Queue::Few(v) => v.len(),
            Queue::Many(m) => m.queue.len(),
        }
    }

    /// Oldest first.
    fn iter(&self) -> impl DoubleEndedIterator<Item = &Queued> + '_ {
        let (few, many) = match self {
            Queue::Few(v) => (Some(v.iter()), None),
            Queue::Many(m) => (None, Some(m.queue.values())),
        };
        few.into_iter().flatten().chain(many.into_iter().flatten())
    }

    fn push(&mut self, q: Queued) {
        match self {
            Queue::Few(v) if v.len() < FEW => v.push(q),
            Queue::Few(v) => {
                let mut m = Indexed::default();
                for old in v.drain(..) {
                    m.push(old);
                }
                m.push(q);
                *self = Queue::Many(Box::new(m));
            }
            Queue::Many(m) => m.push(q),
        }
    }

    fn remove(&mut self, id: PackedId) -> Option<Queued> {
        let removed = match self {
            Queue::Few(v) => {
                let at = v.iter().position(|q| q.id == id)?;
                Some(v.remove(at))
            }
            Queue::Many(m) => {
                let n = *m.arrival.get(&id)?;
                m.remove_arrival(n)
            }
        };
        self.shrink();
        removed
    }

    /// The waiter whose wait ends first (the oldest of equals), if it ends by `now`.
    fn pop_timed_out(&mut self, now: Millis) -> Option<Queued> {
        let removed = match self {
            Queue::Few(v) => {
                let (at, first) = v.iter().enumerate().min_by_key(|(_, q)| q.until)?;
                if first.until > now {
                    return None;
                }
                Some(v.remove(at))
            }
            Queue::Many(m) => {
                let &(until, n) = m.timeouts.first()?;
                if until > now {
                    return None;
                }
                m.remove_arrival(n)
            }
        };
        self.shrink();
        removed
    }

    fn first_timeout(&self) -> Option<Millis> {
        match self {
            Queue::Few(v) => v.iter().map(|q| q.until).min(),
            Queue::Many(m) => m.timeouts.first().map(|&(until, _)| until),
        }
    }

    /// Back to a plain vector once the queue is short again.
    fn shrink(&mut self) {
        if let Queue::Many(m) = self {
            if m.queue.len() <= FEW / 2 {
                *self = Queue::Few(std::mem::take(&mut m.queue).into_values().collect());
            }
        }
    }
}

impl PartialEq for Queue {
    /// The same waiters in the same order, however they are kept.
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

/// A limiter and its waiters, oldest first.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Book {
    pub(crate) limiter: Option<Limiter>,
    queue: Queue,
    /// Permits asked for by all waiters.
    queued: u64,
}

impl Book {
    /// The limiter, made or remade for `policy` at `now` (Y4): the same kind
    /// keeps its state under the new settings (see [`Limiter::adopt`]),
    /// another kind is remade full, and no limiter drops it.
    /// Returns true when the state was remade or dropped, so permits held
    /// under an older state must not come back to it.
    pub fn adopt(&mut self, policy: Option<&LimiterPolicy>, now: Millis) -> bool {
        match (policy, &mut self.limiter) {
            (None, None) => false,
            (Some(p), Some(l)) => l.adopt(&p.kind, now),
            (None, Some(_)) => {
                self.limiter = None;
                true
            }
            (Some(p), None) => {
                self.limiter = Some(Limiter::new(&p.kind, now));
                true
            }
        }
    }

    /// True when the book has neither a limiter nor a waiter.
    pub fn is_empty(&self) -> bool {
        self.limiter.is_none() && self.queue.len() == 0
    }

    /// The limiter's state, if the policy has a limiter.
    pub fn limiter(&self) -> Option<&Limiter> {
        self.limiter.as_ref()
    }

    /// The limiter's state, for taking and returning permits.
    pub fn limiter_mut(&mut self) -> Option<&mut Limiter> {
        self.limiter.as_mut()
    }

    /// Permits asked for by waiters.
    pub fn queued(&self) -> u64 {
        self.queued
    }

    /// How many requests wait.
    pub fn waiters(&self) -> usize {
        self.queue.len()
    }

    /// True when `id` names a waiter.
    pub fn contains(&self, id: TicketId) -> bool {
        let id = PackedId::from(id);
        match &self.queue {
            Queue::Few(v) => v.iter().any(|q| q.id == id),
            Queue::Many(m) => m.arrival.contains_key(&id),
        }
    }

    /// Every waiter, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = Waiter> + '_ {
        self.queue.iter().map(|&q| q.into())
    }

    /// Adds a waiter at the back.
    pub fn enqueue(&mut self, waiter: Waiter) {
        self.queued += u64::from(waiter.permits);
        self.queue.push(waiter.into());
    }

    /// The waiter served next under `order`.
    pub fn head(&self, order: Order) -> Option<Waiter> {
        let mut all = self.queue.iter();
        match order {
            Order::OldestFirst => all.next(),
            Order::NewestFirst => all.next_back(),
        }
        .map(|&q| q.into())
    }

    /// The oldest waiter, which a full `newest_first` queue evicts first.
    pub fn oldest(&self) -> Option<Waiter> {
        self.head(Order::OldestFirst)
    }

    /// The waiter whose wait ends first, and when.
    pub fn first_timeout(&self) -> Option<Millis> {
        self.queue.first_timeout()
    }

    /// Removes and returns the waiter whose wait ends first, if it ends by `now`.
    pub fn pop_timed_out(&mut self, now: Millis) -> Option<Waiter> {
        let q = self.queue.pop_timed_out(now)?;
        self.queued -= u64::from(q.permits);
        Some(q.into())
    }

    /// Removes a waiter by its ticket.
    pub fn remove(&mut self, id: TicketId) -> Option<Waiter> {
        let q = self.queue.remove(id.into())?;
        self.queued -= u64::from(q.permits);
        Some(q.into())
    }

    /// Removes the waiters that ask for more than `limit` permits, oldest first.
    pub fn remove_above(&mut self, limit: u32) -> Vec<Waiter> {
        let above: Vec<PackedId> = self
            .queue
            .iter()
            .filter(|q| q.permits > limit)
            .map(|q| q.id)
            .collect();
        above
            .into_iter()
            .filter_map(|id| self.remove(id.into()))
            .collect()
    }

    /// Removes every waiter, oldest first.
    pub fn drain(&mut self) -> Vec<Waiter> {
        let all = self.queue.iter().map(|&q| q.into()).collect();
        self.queue = Queue::default();
        self.queued = 0;
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiter(id: u128, permits: u32, until: Millis) -> Waiter {
        Waiter {
            caller: Default::default(),
            id: TicketId(id),
            permits,
            until,
            lease: id.is_multiple_of(2).then_some(100 + id as u64),
        }
    }

    #[test]
    fn a_waiter_is_kept_in_forty_bytes() {
        assert_eq!(std::mem::size_of::<Queued>(), 40);
    }

    /// The same operations on a short and on a long queue give the same answers.
    #[test]
    fn a_long_queue_keeps_order_timeouts_and_withdrawals_and_shrinks_back() {
        for count in [4u128, 20] {
            let mut b = Book::default();
            for i in 0..count {
                // Timeouts out of arrival order, with ties.
                b.enqueue(waiter(i, 1, 1_000 - (i as u64 % 4) * 10));
            }
            assert_eq!(b.waiters(), count as usize);
            assert_eq!(b.queued(), count as u64);
            assert!(matches!(b.queue, Queue::Many(_)) == (count as usize > FEW));
            assert_eq!(b.head(Order::OldestFirst), Some(waiter(0, 1, 1_000)));
            assert_eq!(b.head(Order::NewestFirst).map(|w| w.id.0), Some(count - 1));
            assert!(b.contains(TicketId(1)));
            assert_eq!(b.remove(TicketId(1)).map(|w| w.id.0), Some(1));
            assert!(!b.contains(TicketId(1)));
            assert_eq!(b.remove(TicketId(1)), None);
            // The earliest timeout, the oldest of equals: 1 is gone, so 3.
            assert_eq!(b.first_timeout(), Some(970));
            assert_eq!(b.pop_timed_out(969), None);
            assert_eq!(b.pop_timed_out(970).map(|w| w.id.0), Some(3));
            let rest = b.drain();
            assert_eq!(rest.len(), count as usize - 2);
            assert!(rest.windows(2).all(|w| w[0].id < w[1].id), "oldest first");
            assert_eq!(rest[0].lease, Some(100));
            assert_eq!(b.queued(), 0);
            assert!(b.is_empty());
        }
        let mut b = Book::default();
        for i in 0..20 {
            b.enqueue(waiter(i, 1, 1_000));
        }
        for i in 0..16 {
            b.remove(TicketId(i));
        }
        assert!(matches!(b.queue, Queue::Few(_)), "a short queue again");
        assert_eq!(b.head(Order::OldestFirst).map(|w| w.id.0), Some(16));
    }
}

#[cfg(test)]
mod model {
    use proptest::prelude::*;

    use super::*;

    #[derive(Clone, Debug)]
    enum Op {
        Enqueue(u8, u32, Millis),
        Remove(u8),
        TimeOut(Millis),
        RemoveAbove(u32),
        Drain,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            8 => (any::<u8>(), 1u32..4, 0u64..30).prop_map(|(id, n, until)| Op::Enqueue(id, n, until)),
            3 => any::<u8>().prop_map(Op::Remove),
            2 => (0u64..30).prop_map(Op::TimeOut),
            1 => (1u32..4).prop_map(Op::RemoveAbove),
            1 => Just(Op::Drain),
        ]
    }

    proptest! {
        /// Against a plain vector in arrival order, through the switches
        /// between a short and a long queue.
        #[test]
        fn the_queue_behaves_as_a_vector_in_arrival_order(ops in proptest::collection::vec(op(), 1..200)) {
            let mut b = Book::default();
            let mut model: Vec<Waiter> = Vec::new();
            for op in ops {
                match op {
                    Op::Enqueue(n, permits, until) => {
                        let id = TicketId((u128::from(n) << 70) | u128::from(n));
                        if model.iter().any(|w| w.id == id) {
                            continue;
                        }
                        let lease = (n % 3 != 0).then_some(u64::from(n) + 1);
                        let w = Waiter { caller: Default::default(), id, permits, until, lease };
                        model.push(w);
                        b.enqueue(w);
                    }
                    Op::Remove(n) => {
                        let id = TicketId((u128::from(n) << 70) | u128::from(n));
                        let at = model.iter().position(|w| w.id == id);
                        prop_assert_eq!(b.remove(id), at.map(|at| model.remove(at)));
                    }
                    Op::TimeOut(now) => {
                        let first = model.iter().enumerate().min_by_key(|(_, w)| w.until);
                        let expected = match first {
                            Some((at, w)) if w.until <= now => Some(model.remove(at)),
                            _ => None,
                        };
                        prop_assert_eq!(b.pop_timed_out(now), expected);
                    }
                    Op::RemoveAbove(limit) => {
                        let above: Vec<Waiter> = model.iter().filter(|w| w.permits > limit).copied().collect();
                        model.retain(|w| w.permits <= limit);
                        prop_assert_eq!(b.remove_above(limit), above);
                    }
                    Op::Drain => {
                        prop_assert_eq!(b.drain(), std::mem::take(&mut model));
                    }
                }
                prop_assert_eq!(b.waiters(), model.len());
                prop_assert_eq!(b.queued(), model.iter().map(|w| u64::from(w.permits)).sum::<u64>());
                prop_assert_eq!(b.head(Order::OldestFirst), model.first().copied());
                prop_assert_eq!(b.head(Order::NewestFirst), model.last().copied());
                prop_assert_eq!(b.first_timeout(), model.iter().map(|w| w.until).min());
                prop_assert!(matches!(b.queue, Queue::Many(_)) || b.waiters() <= FEW);
                for w in &model {
                    prop_assert!(b.contains(w.id));
                }
            }
        }
    }
}

//! The permit book: a key's limiter and its wait queue, counted in permits
//! (SPEC P3–P8). The book keeps order and room; the decisions that use it
//! live in [`super::Fuse`], where the breaker is known too.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::fuse::TicketId;
use super::limiter::Limiter;
use super::policy::{LimiterPolicy, Order};
use super::Millis;

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
}

/// A limiter and its waiters, oldest first.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Book {
    limiter: Option<Limiter>,
    /// Waiters by arrival number: the first entry is the oldest.
    queue: BTreeMap<u64, Waiter>,
    /// Arrival number of each waiter, for withdrawal by ticket.
    arrival: HashMap<TicketId, u64>,
    /// `(until, arrival)` of each waiter, for timeouts in time order.
    timeouts: BTreeSet<(Millis, u64)>,
    /// Permits asked for by all waiters.
    queued: u64,
    next_arrival: u64,
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
        self.arrival.contains_key(&id)
    }

    /// Adds a waiter at the back.
    pub fn enqueue(&mut self, waiter: Waiter) {
        let n = self.next_arrival;
        self.next_arrival += 1;
        self.queue.insert(n, waiter);
        self.arrival.insert(waiter.id, n);
        self.timeouts.insert((waiter.until, n));
        self.queued += u64::from(waiter.permits);
    }

    /// The waiter served next under `order`.
    pub fn head(&self, order: Order) -> Option<&Waiter> {
        match order {
            Order::OldestFirst => self.queue.values().next(),
            Order::NewestFirst => self.queue.values().next_back(),
        }
    }

    /// The oldest waiter, which a full `newest_first` queue evicts first.
    pub fn oldest(&self) -> Option<&Waiter> {
        self.queue.values().next()
    }

    /// The waiter whose wait ends first, and when.
    pub fn first_timeout(&self) -> Option<Millis> {
        self.timeouts.first().map(|&(until, _)| until)
    }

    /// Removes and returns the waiter whose wait ends first, if it ends by `now`.
    pub fn pop_timed_out(&mut self, now: Millis) -> Option<Waiter> {
        let &(until, n) = self.timeouts.first()?;
        if until > now {
            return None;
        }
        self.remove_arrival(n)
    }

    /// Removes a waiter by its ticket.
    pub fn remove(&mut self, id: TicketId) -> Option<Waiter> {
        let n = *self.arrival.get(&id)?;
        self.remove_arrival(n)
    }

    fn remove_arrival(&mut self, n: u64) -> Option<Waiter> {
        let waiter = self.queue.remove(&n)?;
        self.arrival.remove(&waiter.id);
        self.timeouts.remove(&(waiter.until, n));
        self.queued -= u64::from(waiter.permits);
        Some(waiter)
    }

    /// Removes the waiters that ask for more than `limit` permits, oldest first.
    pub fn remove_above(&mut self, limit: u32) -> Vec<Waiter> {
        let above: Vec<TicketId> = self
            .queue
            .values()
            .filter(|w| w.permits > limit)
            .map(|w| w.id)
            .collect();
        above.into_iter().filter_map(|id| self.remove(id)).collect()
    }

    /// Removes every waiter, oldest first.
    pub fn drain(&mut self) -> Vec<Waiter> {
        let all = std::mem::take(&mut self.queue).into_values().collect();
        self.arrival.clear();
        self.timeouts.clear();
        self.queued = 0;
        all
    }
}

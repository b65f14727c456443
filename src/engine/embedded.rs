//! The embedded store: every key's [`Fuse`] in this process's sharded
//! map, tickets and waiters. Each operation runs one pure domain step under
//! its key's shard lock (C6), reading the clock inside the lock so that a
//! key never sees time go backwards. What the step reports ([`Notice`]s)
//! is recorded under the lock (tickets indexed, figures kept, events queued
//! in the shard's outbox); waiters are woken, events sent and changes
//! logged after the lock is released.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use dashmap::DashMap;
use tokio::sync::oneshot;

use super::api::{AcquireArgs, AcquireReply, CompleteReply, KeyReading, Totals};
use super::clock::{Clock, ManualClock, SystemClock};
use super::core::Core;
use super::error::{check_key, check_reason, fuse_error, zero_lease, EngineError};
use super::events::{self, Event};
use super::limits::Limits;
use super::quota::{Capped, Pools};
use super::rules::Rules;
use super::settings::Settings;
use super::shards::{Rest, Shards, Slot, SHARDS, UNSCHEDULED};
use super::shares::{self, Share};
use super::signal::TimerSignal;
use super::storage::{Actor, Storage};
use super::sweep::{RoomSearch, SweepCounters};
use super::tickets::{random_ticket, ticket_of, token_of};
use crate::domain::{
    Ask, Decision, Fuse, FuseError, Grant, Millis, Notice, OperatorAction, Outcome, Phase, Policy,
    TicketId,
};

pub(super) type WaiterAnswer = Result<(Decision, Phase, Millis), EngineError>;

/// How an operation reaches a key.
#[derive(Clone, Copy, Debug)]
pub(super) struct Reach<'a> {
    /// Make the key if it does not exist (within the key cap).
    pub(super) create: bool,
    /// Count the operation as a request, for the busiest keys.
    pub(super) request: bool,
    /// Who asked and why, for isolate and close.
    pub(super) actor: Option<(&'a str, &'a str)>,
    /// The timer took the key's deadline off the schedule to settle it.
    pub(super) settling: bool,
    /// Whose share a key made here counts against (decisions 99).
    pub(super) owner: Option<&'a Arc<Share>>,
}

impl Reach<'static> {
    /// A request that makes the key.
    pub(super) const MAKE: Reach<'static> = Reach {
        create: true,
        request: true,
        actor: None,
        settling: false,
        owner: None,
    };
    /// A request or a read on an existing key: makes nothing.
    pub(super) const EXISTING: Reach<'static> = Reach {
        create: false,
        request: false,
        actor: None,
        settling: false,
        owner: None,
    };
    /// The timer, settling a deadline it took off the schedule.
    pub(super) const SETTLE: Reach<'static> = Reach {
        create: false,
        request: false,
        actor: None,
        settling: true,
        owner: None,
    };
}

/// What an operation may use besides its fuse, under the shard's lock.
pub(super) struct Ctx<'a> {
    pub(super) now: Millis,
    pub(super) name: &'a Arc<str>,
    pub(super) tally: &'a mut Totals,
    pub(super) shard: usize,
    pub(super) pools: &'a Pools,
    /// Units reserved under the caps, by [`Capped`].
    pub(super) reserved: [i64; 3],
    /// The key was made by this operation.
    pub(super) created: bool,
}

impl Ctx<'_> {
    /// Whether one more of `what` fits under its cap (K3).
    pub(super) fn has_room(&mut self, what: Capped) -> bool {
        let room = self.pools.reserve(what, self.shard);
        self.reserved[what as usize] += i64::from(room);
        room
    }
}

/// What an operation leaves to do once its shard's lock is released.
#[derive(Default)]
pub(super) struct Effects {
    pub(super) key: Option<Arc<str>>,
    pub(super) shard: usize,
    /// Waiters answered: `(waiter, decision, phase, now)`.
    pub(super) answers: Vec<(TicketId, Decision, Phase, Millis)>,
    /// Phase changes, to log.
    pub(super) changes: Vec<Notice>,
    /// The timer must look at an earlier deadline.
    pub(super) wake_timer: bool,
    /// The key's policy is a shadow: its changes are told `shadow: ` (D1).
    pub(super) shadow: bool,
}

/// Keyed breakers and permit books, in this process: the embedded store.
pub struct Engine {
    pub(super) core: Arc<Core>,
    pub(super) shards: Shards,
    pub(super) pools: Pools,
    pub(super) tickets: DashMap<TicketId, Arc<str>>,
    pub(super) waiters: DashMap<TicketId, oneshot::Sender<WaiterAnswer>>,
    /// The earliest deadline any shard registered since the timer last looked.
    pub(super) next_due: AtomicU64,
    pub(super) timer: TimerSignal,
    pub(super) advancing: tokio::sync::Mutex<()>,
    pub(super) sweeps: SweepCounters,
    /// The search for keys at rest to forget when a new key finds no room.
    pub(super) room: RoomSearch,
    /// The data dir, when state is kept across restarts.
    pub(super) storage: std::sync::OnceLock<Storage>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("limits", &self.core.limits())
            .field("totals", &self.totals())
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// An engine on `clock` (and, for `--manual-clock`, the same clock as a
    /// [`ManualClock`] so that it can be advanced) under `settings` (a
    /// validated config turns into them).
    pub fn new(
        settings: impl Into<Settings>,
        clock: Arc<dyn Clock>,
        manual: Option<Arc<ManualClock>>,
    ) -> Self {
        let Settings { rules, limits } = settings.into();
        Engine::on(Arc::new(Core::new(limits, clock, manual)), rules)
    }

    /// An engine around `core`, under `rules`.
    pub fn on(core: Arc<Core>, rules: Rules) -> Self {
        let compiled = core.replace_rules(rules);
        let limits = core.limits();
        Engine {
            shards: Shards::new(compiled),
            pools: Pools::new(
                [limits.max_keys, limits.max_tickets, limits.max_waiters],
                SHARDS,
            ),
            tickets: DashMap::new(),
            waiters: DashMap::new(),
            next_due: AtomicU64::new(UNSCHEDULED),
            timer: TimerSignal::default(),
            advancing: tokio::sync::Mutex::new(()),
            sweeps: SweepCounters::default(),
            room: RoomSearch::default(),
            storage: std::sync::OnceLock::new(),
            core,
        }
    }

    /// What the engine shares with the server around it.
    pub fn core(&self) -> &Arc<Core> {
        &self.core
    }

    /// The key a live ticket belongs to; NOT_FOUND when there is none (L4).
    pub fn ticket_key(&self, token: &str) -> Result<Arc<str>, EngineError> {
        self.ticket_and_key(token).map(|(_, key)| key)
    }

    /// An engine on the system clock.
    pub fn with_system_clock(settings: impl Into<Settings>) -> Self {
        Engine::new(settings, Arc::new(SystemClock::new()), None)
    }

    /// An engine on a manual clock that starts at 0.
    pub fn with_manual_clock(settings: impl Into<Settings>) -> Self {
        let clock = Arc::new(ManualClock::default());
        Engine::new(settings, clock.clone(), Some(clock))
    }

    /// True once the engine began to shut down.
    pub fn is_shutting_down(&self) -> bool {
        self.core.is_shutting_down()
    }

    /// Resolves once the engine begins to shut down.
    pub fn stopped(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        self.core.stopped()
    }

    /// The wall-clock time of a reading of the engine's clock.
    pub fn wall_time(&self, at: Millis) -> std::time::SystemTime {
        self.core.wall_time(at)
    }

    /// A receiver of every event published from now on (bounded: a receiver
    /// that falls [`EVENT_BUFFER`](super::EVENT_BUFFER) events behind is told it lagged).
    pub fn subscribe(&self) -> tokio::sync::broadcast::Receiver<Event> {
        self.core.subscribe()
    }

    /// The engine's time now.
    pub fn now(&self) -> Millis {
        self.core.now()
    }

    /// True when the clock is manual (X1).
    pub fn has_manual_clock(&self) -> bool {
        self.core.has_manual_clock()
    }

    /// The limits in force.
    pub fn limits(&self) -> Limits {
        self.core.limits()
    }

    /// Runs `op` on the key's fuse under its shard's lock, making the key
    /// first when `access.create` is set (within the key cap). Returns
    /// `None` when the key does not exist and is not to be made.
    pub(super) fn with_fuse<R>(
        &self,
        key: &str,
        access: Reach<'_>,
        op: impl FnOnce(&mut Fuse, &mut Ctx<'_>) -> R,
    ) -> Result<Option<R>, EngineError> {
        let hash = self.shards.hash(key);
        let shard = Shards::shard_of(hash);
        let mut effects = Effects {
            shard,
            ..Effects::default()
        };
        let result = {
            let mut guard = self.shards.write(shard);
            let state = &mut *guard;
            let now = self.core.now();
            let rest = &mut state.rest;
            let (slot, created) =
                match state
                    .table
                    .entry(hash, |s| &*s.name == key, self.shards.rehash())
                {
                    hashbrown::hash_table::Entry::Occupied(o) => (o.into_mut(), false),
                    hashbrown::hash_table::Entry::Vacant(_) if !access.create => return Ok(None),
                    hashbrown::hash_table::Entry::Vacant(v) => {
                        match self.new_slot(rest, key, shard, now, access.owner, None) {
                            Ok(slot) => (v.insert(slot).into_mut(), true),
                            // K3: past the cap an acquire fails; only the
                            // rate-limit service's charges make room (RL19).
                            Err(e) => return Err(count_no_room(e, rest, access.owner)),
                        }
                    }
                };
            if access.request {
                rest.hitters.bump(hash, &slot.name);
            }
            self.apply(slot, rest, now, access, created, op, &mut effects)?
        };
        self.after(effects);
        Ok(Some(result))
    }

    /// Makes the slot of a new key in the locked shard's `rest`, within the
    /// key cap and `owner`'s share (decisions 99), under `policy` or the
    /// one the rules give. A refusal is not counted here: the caller
    /// counts it with [`count_no_room`] once it is final (keys at rest
    /// may be forgotten to make room, and the key tried again).
    pub(super) fn new_slot(
        &self,
        rest: &mut Rest,
        key: &str,
        shard: usize,
        now: Millis,
        owner: Option<&Arc<Share>>,
        policy: Option<&Arc<Policy>>,
    ) -> Result<Box<Slot>, EngineError> {
        if let Some(owner) = owner {
            if !owner.take_quietly(shares::Kind::Keys) {
                return Err(owner.refusal(shares::Kind::Keys));
            }
        }
        if !self.pools.reserve(Capped::Keys, shard) {
            if let Some(owner) = owner {
                owner.give(shares::Kind::Keys);
            }
            return Err(EngineError::Exhausted {
                what: "keys",
                cap: "max_keys",
                limit: self.core.limits().max_keys,
            });
        }
        self.pools.settle(Capped::Keys, shard, 1, 1);
        let name: Arc<str> = Arc::from(key);
        rest.order.insert(name.clone());
        rest.tally.keys += 1;
        rest.tally.by_phase[Phase::Closed.index()] += 1;
        let policy = policy.unwrap_or_else(|| rest.rules.policy_for(key)).clone();
        Ok(Box::new(Slot::new(
            name,
            Fuse::new(policy, now),
            rest.rules.generation,
            owner.cloned(),
        )))
    }

    /// Runs `op` on a live slot under its shard's lock and records what it
    /// did: policy adoption, figures, notices, the timer's schedule.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn apply<R>(
        &self,
        slot: &mut Slot,
        rest: &mut Rest,
        now: Millis,
        access: Reach<'_>,
        created: bool,
        op: impl FnOnce(&mut Fuse, &mut Ctx<'_>) -> R,
        effects: &mut Effects,
    ) -> Result<R, EngineError> {
        let phase_before = slot.fuse.breaker().phase();
        // What the schedule holds for this key: its next deadline as of its
        // last operation (a fuse changes only under this lock).
        let scheduled = match access.settling {
            true => UNSCHEDULED,
            false => slot.fuse.next_deadline().unwrap_or(UNSCHEDULED),
        };
        // Counted before a new policy is adopted: adopting one may answer
        // waiters (a grant, or a denial above the new limit), and those
        // changes count like the operation's own.
        let tickets_before = slot.fuse.live_tickets();
        let waiters_before = slot.fuse.waiters();
        let kept_before = self.storage.get().map(|_| slot.fuse.durable());
        if !slot.is_current(rest.rules.generation) {
            let policy = rest.rules.policy_for(&slot.name).clone();
            slot.fuse
                .set_policy(policy, now)
                .map_err(|err| EngineError::Internal(err.to_string()))?;
            slot.set_generation(rest.rules.generation);
        }
        let (result, reserved) = {
            let mut ctx = Ctx {
                now,
                name: &slot.name,
                tally: &mut rest.tally,
                shard: effects.shard,
                pools: &self.pools,
                reserved: [0; 3],
                created,
            };
            let result = op(&mut slot.fuse, &mut ctx);
            (result, ctx.reserved)
        };
        self.handle_notices(slot, rest, now, access.actor, effects);
        if let (Some(before), Some(storage)) = (kept_before, self.storage.get()) {
            if access.actor.is_some() || before != slot.fuse.durable() {
                let actor = access.actor.map(|(who, why)| {
                    Box::new(Actor {
                        who: who.to_owned(),
                        why: why.to_owned(),
                        at_ms: super::storage::unix_ms(self.wall_time(now)),
                    })
                });
                rest.mark_dirty(&slot.name, actor);
                storage.note_pending();
            }
        }
        let tickets_delta = slot.fuse.live_tickets() as i64 - tickets_before as i64;
        let waiters_delta = slot.fuse.waiters() as i64 - waiters_before as i64;
        rest.tally.tickets = rest.tally.tickets.wrapping_add_signed(tickets_delta);
        rest.tally.waiters = rest.tally.waiters.wrapping_add_signed(waiters_delta);
        let shard = effects.shard;
        self.pools.settle(
            Capped::Tickets,
            shard,
            tickets_delta,
            reserved[Capped::Tickets as usize],
        );
        self.pools.settle(
            Capped::Waiters,
            shard,
            waiters_delta,
            reserved[Capped::Waiters as usize],
        );
        rest.moved(&slot.name, phase_before, slot.fuse.breaker().phase());
        // The schedule holds each key's next deadline and nothing else: a
        // deadline that went away (a ticket completed early) leaves it now.
        let next = slot.fuse.next_deadline().unwrap_or(UNSCHEDULED);
        if next != scheduled {
            if scheduled != UNSCHEDULED {
                rest.schedule.remove(&(scheduled, slot.name.clone()));
            }
            if next != UNSCHEDULED {
                rest.schedule.insert((next, slot.name.clone()));
                if next < self.next_due.load(Ordering::Relaxed) {
                    self.next_due.fetch_min(next, Ordering::Relaxed);
                    effects.wake_timer = true;
                }
            }
        }
        Ok(result)
    }

    /// Records what a domain step reported, still under the shard's lock:
    /// tickets indexed and dropped, figures, events queued in the outbox.
    /// Waiters are answered and changes logged by [`Engine::after`].
    pub(super) fn handle_notices(
        &self,
        slot: &mut Slot,
        rest: &mut Rest,
        now: Millis,
        actor: Option<(&str, &str)>,
        effects: &mut Effects,
    ) {
        let mut changes = Vec::new();
        let mut notices: Vec<Notice> = slot.fuse.drain_notices().collect();
        while !notices.is_empty() {
            for notice in notices.drain(..) {
                match notice {
                    Notice::Answered { waiter, decision } => {
                        rest.tally.count(&decision);
                        if let Some(grant) = decision.grant() {
                            self.tickets.insert(grant.ticket, slot.name.clone());
                        }
                        let phase = slot.fuse.breaker().phase();
                        effects.answers.push((waiter, decision, phase, now));
                    }
                    Notice::Expired { ticket } => {
                        self.tickets.remove(&ticket);
                        tracing::debug!(key = %slot.name, "a ticket's lease ended before it was completed");
                    }
                    change @ Notice::Phase { .. } => {
                        rest.tally.transitions += 1;
                        changes.push(change);
                    }
                }
            }
            notices.extend(slot.fuse.drain_notices());
        }
        if !changes.is_empty() {
            let view = slot.fuse.view(now);
            let shadow = !slot.fuse.policy().enforce;
            rest.outbox.extend(
                changes
                    .iter()
                    .filter_map(|c| events::event_of(&slot.name, c, &view, actor, shadow)),
            );
            effects.changes = changes;
            effects.shadow = shadow;
        }
        if !effects.changes.is_empty() || !effects.answers.is_empty() {
            effects.key = Some(slot.name.clone());
        }
    }

    /// Does what an operation left for after its lock: sends events, wakes
    /// waiters, logs phase changes, wakes the timer.
    pub(super) fn after(&self, effects: Effects) {
        if !effects.changes.is_empty() {
            self.core
                .publish(|| std::mem::take(&mut self.shards.write(effects.shard).rest.outbox));
        }
        for (waiter, decision, phase, now) in effects.answers {
            let delivered = self
                .waiters
                .remove(&waiter)
                .is_some_and(|(_, tx)| tx.send(Ok((decision, phase, now))).is_ok());
            if !delivered {
                if let Some(grant) = decision.grant() {
                    // The caller went away as it was served: give the permits back.
                    let _ = self.complete(&token_of(grant.ticket), Outcome::Ignored);
                }
            }
        }
        if let Some(key) = &effects.key {
            for change in &effects.changes {
                events::log_change(key, change, effects.shadow);
            }
        }
        if effects.wake_timer {
            self.timer.wake();
        }
    }

    /// Answers an acquire (B1, P1–P6, C1–C4), waiting server-side while queued.
    pub async fn acquire(&self, args: AcquireArgs) -> Result<AcquireReply, EngineError> {
        self.acquire_for(args, None).await
    }

    /// [`Engine::acquire`] for a credential: a key it makes counts against
    /// its share (decisions 99).
    pub async fn acquire_for(
        &self,
        args: AcquireArgs,
        owner: Option<&Arc<Share>>,
    ) -> Result<AcquireReply, EngineError> {
        check_key(&args.key)?;
        if args.lease == Some(0) {
            return Err(zero_lease());
        }
        if self.is_shutting_down() {
            return Err(EngineError::ShuttingDown);
        }
        if args.permits == 0 {
            return self.status_check(&args);
        }
        let id = random_ticket()?;
        let mut receiver = None;
        let mut created = false;
        let make = Reach {
            owner,
            ..Reach::MAKE
        };
        let result = self
            .with_fuse(&args.key, make, |fuse, ctx| {
                created = ctx.created;
                let ask = Ask {
                    permits: args.permits,
                    max_wait: args.max_wait,
                    lease: args.lease,
                    room_for_ticket: ctx.has_room(Capped::Tickets),
                    room_for_waiter: args.max_wait == 0 || ctx.has_room(Capped::Waiters),
                    retry: args.is_retry(),
                    caller: args.caller_id(),
                };
                let decision = match fuse.acquire(&ask, id, ctx.now) {
                    Ok(decision) => decision,
                    Err(e) => {
                        let cap = match e {
                            FuseError::NoRoomForTicket => Some(Capped::Tickets),
                            FuseError::NoRoomForWaiter => Some(Capped::Waiters),
                            _ => None,
                        };
                        if let Some(cap) = cap {
                            ctx.tally.cap_refusals[cap as usize] += 1;
                        }
                        return Err(e);
                    }
                };
                ctx.tally.count(&decision);
                if decision == Decision::Queued {
                    let (tx, rx) = oneshot::channel();
                    self.waiters.insert(id, tx);
                    receiver = Some(rx);
                }
                if let Some(grant) = decision.grant() {
                    self.tickets.insert(grant.ticket, ctx.name.clone());
                }
                Ok::<_, FuseError>((decision, fuse.breaker().phase(), ctx.now))
            })?
            .expect("acquire makes the key");
        let (decision, phase, now) = result.map_err(|e| {
            if created {
                // E3: a request that fails (a cap) makes no key.
                self.drop_if_at_rest(&args.key);
            }
            self.exhausted_or(e)
        })?;
        match receiver {
            None => Ok(reply(decision, phase, now)),
            Some(rx) => {
                let mut guard = WaiterGuard::new(self, &args.key, id, rx);
                let answer = guard.wait().await;
                if answer.is_err() {
                    // Shutting down: the waiter leaves the queue with its answer.
                    self.withdraw(&args.key, id);
                }
                let (decision, phase, now) = answer?;
                Ok(reply(decision, phase, now))
            }
        }
    }

    pub(super) fn status_check(&self, args: &AcquireArgs) -> Result<AcquireReply, EngineError> {
        let ask = Ask {
            permits: 0,
            retry: args.is_retry(),
            ..Ask::default()
        };
        let probe_id = TicketId(0);
        let answer = self.with_fuse(&args.key, Reach::EXISTING, |fuse, ctx| {
            fuse.acquire(&ask, probe_id, ctx.now)
                .map(|d| (d, fuse.breaker().phase(), ctx.now))
        })?;
        let (decision, phase, now) = match answer {
            Some(result) => result.map_err(fuse_error)?,
            None => {
                // K2: a status check does not make the key.
                let now = self.core.now();
                let mut fresh = Fuse::new(self.policy_for(&args.key), now);
                let d = fresh.acquire(&ask, probe_id, now).map_err(fuse_error)?;
                (d, Phase::Closed, now)
            }
        };
        Ok(reply(decision, phase, now))
    }

    /// Removes `key` if it is at rest, as forgetting would (K2): for a key
    /// made by a request that then failed.
    pub(super) fn drop_if_at_rest(&self, key: &str) {
        let hash = self.shards.hash(key);
        let mut guard = self.shards.write(Shards::shard_of(hash));
        let now = self.core.now();
        let state = &mut *guard;
        if let Ok(entry) = state.table.find_entry(hash, |s| &*s.name == key) {
            if entry
                .get()
                .fuse
                .is_at_rest(now.max(entry.get().fuse.last_now()))
            {
                if let Some(owner) = &entry.remove().0.owner {
                    owner.give(shares::Kind::Keys);
                }
                state.rest.forget(hash, key, false);
                self.pools
                    .settle(Capped::Keys, Shards::shard_of(hash), -1, 0);
            }
        }
    }

    pub(super) fn exhausted_or(&self, e: FuseError) -> EngineError {
        match e {
            FuseError::NoRoomForTicket => EngineError::Exhausted {
                what: "tickets",
                cap: "max_tickets",
                limit: self.core.limits().max_tickets,
            },
            FuseError::NoRoomForWaiter => EngineError::Exhausted {
                what: "waiters",
                cap: "max_waiters",
                limit: self.core.limits().max_waiters,
            },
            other => fuse_error(other),
        }
    }

    /// Withdraws a waiter whose caller went away (P6).
    pub(super) fn withdraw(&self, key: &str, id: TicketId) {
        self.waiters.remove(&id);
        let _ = self.with_fuse(key, Reach::EXISTING, |fuse, ctx| fuse.withdraw(id, ctx.now));
    }

    /// A ticket's id and the key it belongs to.
    pub(super) fn ticket_and_key(&self, token: &str) -> Result<(TicketId, Arc<str>), EngineError> {
        let id = ticket_of(token)?;
        let key = self
            .tickets
            .get(&id)
            .map(|k| k.value().clone())
            .ok_or(EngineError::TicketNotFound)?;
        Ok((id, key))
    }

    /// Records a ticket's outcome (B3, C5, L4).
    pub fn complete(&self, token: &str, outcome: Outcome) -> Result<CompleteReply, EngineError> {
        self.complete_with_cost(token, outcome, None)
    }

    /// Records a ticket's outcome (B3, C5, L4) and the permits the call
    /// really used (U1; `None` = what the ticket took).
    pub fn complete_with_cost(
        &self,
        token: &str,
        outcome: Outcome,
        cost: Option<u32>,
    ) -> Result<CompleteReply, EngineError> {
        let (id, key) = self.ticket_and_key(token)?;
        let result = self
            .with_fuse(&key, Reach::EXISTING, |fuse, ctx| {
                fuse.complete_with_cost(id, outcome, cost, ctx.now)
            })?
            .ok_or(EngineError::TicketNotFound);
        match result {
            Ok(Ok(done)) => {
                self.tickets.remove(&id);
                Ok(CompleteReply {
                    stale: done.stale,
                    phase: done.phase,
                })
            }
            Ok(Err(FuseError::UnknownTicket)) | Err(EngineError::TicketNotFound) => {
                // An index entry the key no longer knows: drop it too.
                self.tickets.remove(&id);
                Err(EngineError::TicketNotFound)
            }
            Ok(Err(e)) => Err(fuse_error(e)),
            Err(e) => Err(e),
        }
    }

    /// Extends a live ticket's lease; returns the time left (L2).
    pub fn renew(&self, token: &str, lease: Option<Millis>) -> Result<Millis, EngineError> {
        if lease == Some(0) {
            return Err(zero_lease());
        }
        let (id, key) = self.ticket_and_key(token)?;
        self.with_fuse(&key, Reach::EXISTING, |fuse, ctx| {
            fuse.renew(id, lease, ctx.now)
        })?
        .ok_or(EngineError::TicketNotFound)?
        .map_err(fuse_error)
    }

    /// Isolates a key (B5), recording who asked and why.
    pub fn isolate(&self, key: &str, reason: &str, who: &str) -> Result<KeyReading, EngineError> {
        self.operate(key, reason, who, OperatorAction::Isolate)
    }

    /// Closes a key (B5), recording who asked and why.
    pub fn close(&self, key: &str, reason: &str, who: &str) -> Result<KeyReading, EngineError> {
        self.operate(key, reason, who, OperatorAction::Close)
    }

    /// Takes an operator's `action` on a key (B5), recording who asked
    /// and why.
    pub(super) fn operate(
        &self,
        key: &str,
        reason: &str,
        who: &str,
        action: OperatorAction,
    ) -> Result<KeyReading, EngineError> {
        let why = operator_action(key, reason, who, action)?;
        // Closing a key that does not exist would make a fresh key: nothing to do.
        let access = Reach {
            create: action == OperatorAction::Isolate,
            request: false,
            actor: Some((who, why)),
            settling: false,
            owner: None,
        };
        let read = self.with_fuse(key, access, |fuse, ctx| {
            let now = ctx.now;
            let done = match action {
                OperatorAction::Isolate => fuse.isolate(now),
                OperatorAction::Close => fuse.close(now),
            };
            done.map(|()| (fuse.view(now), now))
        })?;
        // Durable before the reply (a no-op without a data dir).
        self.save()?;
        match read {
            Some(r) => {
                let (view, now) = r.map_err(fuse_error)?;
                Ok(KeyReading {
                    key: key.to_owned(),
                    view,
                    now,
                })
            }
            None => self.get(key),
        }
    }
}

/// True when `e` says a new key found no room: the key cap (K3) or the
/// credential's key share (decisions 99).
pub(super) fn is_no_room_for_key(e: &EngineError) -> bool {
    match e {
        EngineError::Exhausted { cap, .. } => *cap == "max_keys",
        EngineError::ShareExhausted { field, .. } => *field == shares::Kind::Keys.field(),
        _ => false,
    }
}

/// Counts a new key's final refusal for room (in the share's refusals or
/// the shard's cap refusals) and gives it back.
pub(super) fn count_no_room(
    e: EngineError,
    rest: &mut Rest,
    owner: Option<&Arc<Share>>,
) -> EngineError {
    match &e {
        EngineError::ShareExhausted { .. } => {
            if let Some(owner) = owner {
                owner.count_refusal(shares::Kind::Keys);
            }
        }
        EngineError::Exhausted { .. } => rest.tally.cap_refusals[Capped::Keys as usize] += 1,
        _ => {}
    }
    e
}

/// Checks an operator's `action` on `key` and logs it; returns the reason
/// to record (B5).
pub(super) fn operator_action<'a>(
    key: &str,
    reason: &'a str,
    who: &str,
    action: OperatorAction,
) -> Result<&'a str, EngineError> {
    check_key(key)?;
    check_reason(reason)?;
    let why = if reason.is_empty() {
        "no reason given"
    } else {
        reason
    };
    tracing::info!(key, who, why, "{}", action.cause().as_str());
    Ok(why)
}

fn reply(decision: Decision, phase: Phase, now: Millis) -> AcquireReply {
    let grant: Option<Grant> = decision.grant();
    AcquireReply {
        decision,
        ticket: grant.map(|g| token_of(g.ticket)),
        lease_left: grant.map(|g| g.lease_end.saturating_sub(now)),
        phase,
    }
}

/// Withdraws its waiter if the acquire is dropped before the answer comes
/// (the client went away or its deadline passed, P6).
pub(super) struct WaiterGuard<'a> {
    engine: &'a Engine,
    key: &'a str,
    id: TicketId,
    rx: Option<oneshot::Receiver<WaiterAnswer>>,
}

impl<'a> WaiterGuard<'a> {
    pub(super) fn new(
        engine: &'a Engine,
        key: &'a str,
        id: TicketId,
        rx: oneshot::Receiver<WaiterAnswer>,
    ) -> Self {
        WaiterGuard {
            engine,
            key,
            id,
            rx: Some(rx),
        }
    }

    /// Waits for the answer.
    pub(super) async fn wait(&mut self) -> WaiterAnswer {
        let rx = self.rx.as_mut().expect("waits once");
        let answer = rx
            .await
            .unwrap_or_else(|_| Err(EngineError::Internal("waiter dropped".into())));
        self.rx = None;
        answer
    }
}

impl Drop for WaiterGuard<'_> {
    fn drop(&mut self) {
        let Some(mut rx) = self.rx.take() else {
            return;
        };
        self.engine.withdraw(self.key, self.id);
        if let Ok(Ok((decision, _, _))) = rx.try_recv() {
            if let Some(grant) = decision.grant() {
                let _ = self
                    .engine
                    .complete(&token_of(grant.ticket), Outcome::Ignored);
            }
        }
    }
}

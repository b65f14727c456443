//! Time-driven work, off the request path: one timer thread settles what
//! falls due (lease ends, waits that end, refills that serve waiters),
//! forgets idle keys and ages the busiest-keys tables. Each of these walks
//! one shard at a time in batches of at most [`BATCH`] keys, taking the
//! shard's lock once per batch, so that requests on the same shard wait at
//! most one batch.

use std::ops::Bound;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::embedded::{Effects, Engine, Reach};
use super::error::EngineError;
use super::quota::Capped;
use super::shards::{BATCH, SHARDS, UNSCHEDULED};
use super::sweep::SweepReport;
use crate::domain::Millis;

/// How often the busiest-keys tables are aged, in ms.
const DECAY_EVERY: Millis = 10_000;

impl Engine {
    /// Settles every key whose deadline is due at `now`; returns how many.
    pub fn settle_due(&self, now: Millis) -> usize {
        self.settle_due_in_batches(now).0
    }

    /// Settles what is due at `now`, shard by shard in batches; returns how
    /// many keys were settled and the earliest deadline still registered.
    fn settle_due_in_batches(&self, now: Millis) -> (usize, Millis) {
        // Cleared before the walk: a deadline registered during it lowers
        // this again and wakes the timer, so none is missed.
        self.next_due.store(UNSCHEDULED, Ordering::Relaxed);
        let mut settled = 0;
        let mut earliest = UNSCHEDULED;
        for shard in 0..SHARDS {
            loop {
                let mut effects = Vec::new();
                let (count, first) = {
                    let mut guard = self.shards.write(shard);
                    let state = &mut *guard;
                    let at = self.core.now().max(now);
                    let mut count = 0;
                    while count < BATCH {
                        match state.rest.schedule.first() {
                            Some(&(due, _)) if due <= now => {}
                            _ => break,
                        }
                        let (_, name) = state.rest.schedule.pop_first().expect("checked");
                        count += 1;
                        let hash = self.shards.hash(&name);
                        let Some(slot) = state.table.find_mut(hash, |s| *s.name == *name) else {
                            continue;
                        };
                        let mut done = Effects {
                            shard,
                            ..Effects::default()
                        };
                        let _ = self.apply(
                            slot,
                            &mut state.rest,
                            at,
                            Reach::SETTLE,
                            false,
                            |fuse, ctx| fuse.advance(ctx.now),
                            &mut done,
                        );
                        effects.push(done);
                    }
                    (count, state.rest.schedule.first().map(|&(t, _)| t))
                };
                for done in effects {
                    self.after(done);
                }
                settled += count;
                if count < BATCH {
                    earliest = earliest.min(first.unwrap_or(UNSCHEDULED));
                    break;
                }
            }
        }
        (settled, earliest)
    }

    /// Forgets keys at rest that nobody used for `idle_after` (K2); returns how many.
    pub fn forget_idle(&self, now: Millis) -> usize {
        self.forget_idle_with(now, |_| {})
    }

    /// Forgets idle keys like [`Engine::forget_idle`], one batch of at most
    /// [`BATCH`] keys of one shard under its lock at a time, and calls
    /// `between` after each batch, with no lock held.
    pub fn forget_idle_with(&self, now: Millis, mut between: impl FnMut(&SweepReport)) -> usize {
        let idle_after = self.core.limits().idle_after;
        let mut total = 0;
        for shard in 0..SHARDS {
            let mut cursor: Option<Arc<str>> = None;
            loop {
                let report = {
                    let mut guard = self.shards.write(shard);
                    let state = &mut *guard;
                    let start = match &cursor {
                        Some(c) => Bound::Excluded(&**c),
                        None => Bound::Unbounded,
                    };
                    let names: Vec<Arc<str>> = state
                        .rest
                        .order
                        .range::<str, _>((start, Bound::Unbounded))
                        .take(BATCH)
                        .cloned()
                        .collect();
                    let mut forgotten = 0;
                    for name in &names {
                        let hash = self.shards.hash(name);
                        let Ok(entry) = state.table.find_entry(hash, |s| *s.name == **name) else {
                            continue;
                        };
                        let fuse = &entry.get().fuse;
                        let idle = now.saturating_sub(fuse.last_now()) >= idle_after;
                        if idle && fuse.is_at_rest(now.max(fuse.last_now())) {
                            if let Some(owner) = &entry.remove().0.owner {
                                owner.give(super::shares::Kind::Keys);
                            }
                            state.rest.forget(hash, name, true);
                            self.pools.settle(Capped::Keys, shard, -1, 0);
                            forgotten += 1;
                        }
                    }
                    cursor = names.last().cloned();
                    SweepReport {
                        shard,
                        examined: names.len(),
                        forgotten,
                    }
                };
                self.sweeps.record(&report);
                total += report.forgotten;
                between(&report);
                if report.examined < BATCH {
                    break;
                }
            }
        }
        total
    }

    /// Ages every shard's busiest-keys table.
    fn age_busiest(&self) {
        for shard in 0..SHARDS {
            self.shards.write(shard).rest.hitters.decay();
        }
    }

    /// Moves the manual clock forward and returns only once everything due
    /// by the new time is settled (X1). `None` without a manual clock.
    pub async fn advance_clock(&self, by: Millis) -> Option<Millis> {
        let manual = self.core.manual()?;
        let _one_at_a_time = self.advancing.lock().await;
        let now = manual.advance(by);
        self.settle_due(now);
        self.forget_idle(now);
        Some(now)
    }

    /// The timer: on a thread of its own (not a request worker), sleeps
    /// until the earliest deadline, settles what is due, forgets idle keys
    /// now and then. Returns when the engine shuts down.
    pub async fn run_timer(self: Arc<Self>) {
        let engine = self.clone();
        let _ = tokio::task::spawn_blocking(move || engine.timer_loop()).await;
    }

    fn timer_loop(&self) {
        let sweep_every = (self.core.limits().idle_after / 4).clamp(10, 30_000);
        let start = self.core.now();
        let mut next_sweep = start + sweep_every;
        let mut next_decay = start + DECAY_EVERY;
        while !self.is_shutting_down() {
            let now = self.core.now();
            let (_, first) = self.settle_due_in_batches(now);
            // Deadlines registered from now on wake the timer only when
            // they come before the one it will sleep until.
            self.next_due.fetch_min(first, Ordering::Relaxed);
            if !self.core.has_manual_clock() && now >= next_sweep {
                let forgotten = self.forget_idle(now);
                if forgotten > 0 {
                    tracing::debug!(forgotten, "forgot idle keys");
                }
                next_sweep = now + sweep_every;
            }
            if now >= next_decay {
                self.age_busiest();
                next_decay = now + DECAY_EVERY;
            }
            let wake_at = first
                .min(next_sweep)
                .min(next_decay)
                .min(self.next_due.load(Ordering::Relaxed));
            self.timer
                .sleep_until(self.core.clock().instant_of(wake_at));
        }
    }

    /// Stops taking requests and answers every waiter with `UNAVAILABLE`.
    pub fn shutdown(&self) {
        self.core.begin_shutdown();
        let ids: Vec<_> = self.waiters.iter().map(|w| *w.key()).collect();
        for id in ids {
            if let Some((_, tx)) = self.waiters.remove(&id) {
                let _ = tx.send(Err(EngineError::ShuttingDown));
            }
        }
        self.timer.wake();
    }
}

//! The engine: every key's [`Fuse`](crate::domain::Fuse) in a sharded store, tickets and
//! waiters, one timer that settles leases and waits on time, idle
//! forgetting in batches, and the caps.
//!
//! Each operation runs one pure domain step under its key's shard lock
//! (C6), reading the clock inside the lock so that a key never sees time go
//! backwards. What the step reports ([`Notice`](crate::domain::Notice)s) is recorded under the
//! lock (tickets indexed, figures kept, events queued in the shard's
//! outbox); waiters are woken, events sent and changes logged after the
//! lock is released.
//!
//! Layout, each file leaning only on those listed before it: `clock`,
//! [`error`] (refusals and argument checks), `tickets` (ids and tokens),
//! `limits`, `rules` (patterns and the rules in force), `settings`, `api`
//! (what the engine is asked and answers), `events` (what watchers are
//! told), [`shares`] (what each credential may hold), [`budgets`] (keys
//! per rate-limit descriptor node), `quota` (caps without
//! a shared counter), `sweep`, `signal`, `storage` (the data dir's file),
//! `shards` (the sharded map), [`core`] (what every store shares),
//! `embedded` (the [`Engine`] and its operations), then the engine's other
//! parts: `observe` (reads, listing, totals, busiest keys), `timer`
//! (settlement, forgetting, the manual clock), `room` (keys at rest
//! forgotten for a new key), `durable` (the data dir),
//! `policies` (rule changes); [`store`] picks the embedded engine or
//! [`redis`] (the Redis store). This file only names them.

mod api;
pub mod budgets;
mod charges;
pub mod clock;
pub mod core;
pub mod deadline;
mod durable;
mod embedded;
pub mod error;
mod events;
mod limits;
mod observe;
mod policies;
mod quota;
pub mod redis;
mod room;
mod rules;
mod settings;
mod shards;
pub mod shares;
mod signal;
mod storage;
pub mod store;
mod sweep;
mod tickets;
mod timer;

pub use api::{
    AcquireArgs, AcquireReply, CompleteReply, KeyReading, Totals, CAP_NAMES, DECISION_NAMES,
};
pub use charges::{ChargeItem, ChargeReply};
pub use clock::{Clock, ManualClock, SystemClock};
pub use core::Core;
pub use embedded::Engine;
pub use error::{EngineError, MAX_REASON_BYTES};
pub use events::{Event, EventKind, EVENT_BUFFER};
pub use limits::Limits;
pub use redis::RedisStore;
pub use rules::{Pattern, Rule, Rules};
pub use settings::Settings;
pub use shards::{BATCH, SHARDS};
pub use storage::{Restored, StorageError, StorageFigures, FILE as DATA_FILE};
pub use store::{Cursor, Figures, Listed, Store};
pub use sweep::{Page, SweepReport};
pub use tickets::token_of;

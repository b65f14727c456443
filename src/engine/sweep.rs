//! What a walk over keys gives: a page of keys, and what a sweep of idle
//! keys did, with the counters metrics read.

use std::sync::atomic::{AtomicU64, Ordering};

use super::api::KeyReading;

/// A page of keys, in key order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Page {
    /// The keys read, at most the page's size.
    pub readings: Vec<KeyReading>,
    /// More keys match after the last one.
    pub more: bool,
    /// Index entries the page looked at: bounded by the page size and the
    /// shard count, whatever the position or the keys outside the prefix.
    pub visited: usize,
}

/// What one batch of a sweep did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// The shard swept.
    pub shard: usize,
    /// Keys looked at.
    pub examined: usize,
    /// Keys forgotten.
    pub forgotten: usize,
}

/// Figures of the idle sweeps, for metrics.
#[derive(Debug, Default)]
pub(super) struct SweepCounters {
    pub(super) batches: AtomicU64,
    pub(super) largest: AtomicU64,
}

impl SweepCounters {
    pub(super) fn record(&self, report: &SweepReport) {
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.largest
            .fetch_max(report.examined as u64, Ordering::Relaxed);
    }
}

/// The search for keys at rest to forget when a new key finds no room
/// (see `Engine::make_room`): one search at a time, and, after a search
/// of the whole server found none, no other before `barren_until` (engine
/// time), so that a flood of new keys at a full cap does not walk every
/// key for each of them.
#[derive(Debug, Default)]
pub(super) struct RoomSearch {
    /// Held while a search runs; the time before which a search of every
    /// key (for the key cap) is not tried again.
    pub(super) barren_until: std::sync::Mutex<crate::domain::Millis>,
    /// Keys forgotten at rest to make room, since start.
    pub(super) evicted: AtomicU64,
}

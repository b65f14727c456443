//! Reads for observers (metrics, the dashboard) that walk every live key
//! without gathering them all first: a scrape of a million keys holds one
//! reading at a time, and each key's lock only for its own read.

use std::sync::Arc;

use super::{Engine, KeyReading, Totals};
use crate::domain::Phase;

impl Engine {
    /// Reads every live key that starts with `prefix`, like [`Engine::get`]
    /// (lease ends settled, nothing made or moved, B6), and hands each
    /// reading to `visit`, in no particular order; returns how many were
    /// read. `visit` runs with no lock held, so a slow observer never delays
    /// a decision; a key forgotten during the walk is skipped.
    pub fn visit_keys(&self, prefix: &str, mut visit: impl FnMut(KeyReading)) -> usize {
        // Names first: reading a key under a shard's iteration lock would
        // deadlock with the write lock that a read takes.
        let names: Vec<Arc<str>> = self
            .keys
            .iter()
            .filter(|e| e.key().starts_with(prefix))
            .map(|e| e.key().clone())
            .collect();
        let mut read = 0;
        for reading in names.iter().filter_map(|name| self.read_live(name)) {
            read += 1;
            visit(reading);
        }
        read
    }
}

impl Engine {
    /// Engine-wide figures: keys by phase, tickets, waiters, decisions.
    /// (Interim: counted by a walk; to be kept as they change.)
    pub fn totals(&self) -> Totals {
        let counts = self.counts();
        let mut totals = Totals {
            keys: counts.keys,
            tickets: counts.tickets,
            waiters: counts.waiters,
            forgotten: counts.forgotten,
            transitions: self
                .counters
                .transitions
                .load(std::sync::atomic::Ordering::Relaxed),
            ..Totals::default()
        };
        for (i, d) in self.counters.decisions.iter().enumerate() {
            totals.decisions[i] = d.load(std::sync::atomic::Ordering::Relaxed);
        }
        for (i, r) in self.counters.reasons.iter().enumerate() {
            totals.reasons[i] = r.load(std::sync::atomic::Ordering::Relaxed);
        }
        self.visit_keys("", |r| totals.by_phase[r.view.phase.index()] += 1);
        totals
    }

    /// The `n` keys with the most requests lately, busiest first.
    /// (Interim: by lifetime requests, found by a walk.)
    pub fn busiest(&self, n: usize) -> Vec<KeyReading> {
        let mut all = Vec::new();
        self.visit_keys("", |r| all.push(r));
        all.sort_by_key(|r| {
            std::cmp::Reverse(
                r.view.stats.granted
                    + r.view.stats.probes
                    + r.view.stats.blocked
                    + r.view.stats.refused
                    + r.view.stats.denied,
            )
        });
        all.truncate(n);
        let _ = Phase::Closed;
        all
    }
}

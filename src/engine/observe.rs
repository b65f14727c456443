//! Reads for observers (metrics, the dashboard) that walk every live key
//! without gathering them all first: a scrape of a million keys holds one
//! reading at a time, and each key's lock only for its own read.

use std::sync::Arc;

use super::{Engine, KeyReading};

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

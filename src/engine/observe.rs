//! Reads for operators and observers: one key, a page of keys in key
//! order, engine-wide totals and the busiest keys. None of them walks the
//! whole map: a page merges the shards' ordered indexes from a cursor, the
//! totals are kept as they change, and the busiest keys come from small
//! per-shard tables. A read takes its shard's lock shared, and takes it
//! for writing only to settle what is due first (B6).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::ops::Bound;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::api::{KeyReading, Totals};
use super::embedded::{Engine, Reach};
use super::error::{check_key, EngineError};
use super::shards::{Shards, SHARDS};
use super::sweep::Page;
use crate::domain::{Fuse, Phase};

/// Where a page starts and what it takes from each shard's index.
struct Walk<'a> {
    prefix: &'a str,
    /// The first name, or the cursor.
    start: Arc<str>,
    /// `start` is a cursor: the page begins after it.
    skip_start: bool,
    /// Only the index of keys that are not CLOSED.
    broken_only: bool,
    /// Names fetched from a shard at a time.
    count: usize,
}

/// One shard's next names in a page, fetched a few at a time.
struct Source {
    shard: usize,
    names: VecDeque<Arc<str>>,
    last: Option<Arc<str>>,
    exhausted: bool,
}

impl Engine {
    /// Reads a key without making or moving it (B6); lease ends are settled first.
    pub fn get(&self, key: &str) -> Result<KeyReading, EngineError> {
        self.get_live(key).map(|(reading, _)| reading)
    }

    /// [`Engine::get`], and whether the key is live (false: it reads as a
    /// fresh key would, K2).
    pub fn get_live(&self, key: &str) -> Result<(KeyReading, bool), EngineError> {
        check_key(key)?;
        Ok(match self.read_live(key) {
            Some(reading) => (reading, true),
            None => {
                // K2: a key never used (or forgotten) reads as a fresh one would.
                let now = self.core.now();
                let reading = KeyReading {
                    key: key.to_owned(),
                    view: Fuse::new(self.policy_for(key), now).view(now),
                    now,
                };
                (reading, false)
            }
        })
    }

    /// Reads a live key like [`Engine::get`]; `None` when it does not exist.
    /// The shard's lock is taken shared unless something is due on the key
    /// or its policy changed, which are settled first under the write lock.
    pub(super) fn read_live(&self, key: &str) -> Option<KeyReading> {
        let hash = self.shards.hash(key);
        {
            let state = self.shards.read(Shards::shard_of(hash));
            let now = self.core.now();
            let slot = state.find(hash, key)?;
            let current = slot.is_current(state.rest.rules.generation);
            if current && slot.fuse.next_deadline().is_none_or(|d| d > now) {
                return Some(KeyReading {
                    key: key.to_owned(),
                    view: slot.fuse.view(now),
                    now,
                });
            }
        }
        let read = self.with_fuse(key, Reach::EXISTING, |fuse, ctx| {
            fuse.advance(ctx.now)
                .map(|()| (fuse.view(ctx.now), ctx.now))
        });
        let Ok(Some(Ok((view, now)))) = read else {
            return None;
        };
        Some(KeyReading {
            key: key.to_owned(),
            view,
            now,
        })
    }

    /// The live keys that start with `prefix`, come after `after` and are in
    /// one of `phases` (any phase when empty), in key order, read like
    /// [`Engine::get`]; at most `limit` of them, and whether more remain.
    pub fn list(
        &self,
        prefix: &str,
        phases: &[Phase],
        after: Option<&str>,
        limit: usize,
    ) -> (Vec<KeyReading>, bool) {
        let page = self.list_page(prefix, phases, after, limit);
        (page.readings, page.more)
    }

    /// A page of [`Engine::list`], with the work it took. The shards'
    /// ordered indexes are merged from the cursor, a few names of each at
    /// a time; only keys that are not CLOSED are looked at when `phases`
    /// leaves CLOSED out.
    pub fn list_page(
        &self,
        prefix: &str,
        phases: &[Phase],
        after: Option<&str>,
        limit: usize,
    ) -> Page {
        let broken_only = !phases.is_empty() && !phases.contains(&Phase::Closed);
        let per_shard = (2 * limit / SHARDS).clamp(8, 256);
        let start: Arc<str> = match after {
            Some(a) if a >= prefix => Arc::from(a),
            _ => Arc::from(prefix),
        };
        let skip_start = after.is_some_and(|a| a >= prefix);
        let mut page = Page::default();
        let mut sources: Vec<Source> = (0..SHARDS)
            .map(|shard| Source {
                shard,
                names: VecDeque::new(),
                last: None,
                exhausted: false,
            })
            .collect();
        let walk = Walk {
            prefix,
            start,
            skip_start,
            broken_only,
            count: per_shard,
        };
        let mut heap = BinaryHeap::new();
        for source in &mut sources {
            self.fill(source, &walk, &mut page.visited);
            if let Some(name) = source.names.pop_front() {
                heap.push(Reverse((name, source.shard)));
            }
        }
        while let Some(Reverse((name, shard))) = heap.pop() {
            let source = &mut sources[shard];
            if source.names.is_empty() && !source.exhausted {
                self.fill(source, &walk, &mut page.visited);
            }
            if let Some(next) = source.names.pop_front() {
                heap.push(Reverse((next, shard)));
            }
            let Some(reading) = self.read_live(&name) else {
                continue;
            };
            if !phases.is_empty() && !phases.contains(&reading.view.phase) {
                continue;
            }
            if page.readings.len() == limit {
                page.more = true;
                break;
            }
            page.readings.push(reading);
        }
        page
    }

    /// Fetches a shard's next few names for a page.
    fn fill(&self, source: &mut Source, walk: &Walk<'_>, visited: &mut usize) {
        let state = self.shards.read(source.shard);
        let index = if walk.broken_only {
            &state.rest.broken
        } else {
            &state.rest.order
        };
        let from = match &source.last {
            Some(last) => Bound::Excluded(&**last),
            None if walk.skip_start => Bound::Excluded(&*walk.start),
            None => Bound::Included(&*walk.start),
        };
        let before = source.names.len();
        source.names.extend(
            index
                .range::<str, _>((from, Bound::Unbounded))
                .take(walk.count)
                .take_while(|name| name.starts_with(walk.prefix))
                .cloned(),
        );
        let fetched = source.names.len() - before;
        *visited += fetched;
        source.exhausted = fetched < walk.count;
        source.last = source.names.back().cloned();
    }

    /// Engine-wide figures, summed over the shards' own.
    pub fn totals(&self) -> Totals {
        let mut sum = Totals::default();
        for shard in 0..SHARDS {
            sum.add(&self.shards.read(shard).rest.tally);
        }
        sum
    }

    /// The `n` keys with the most requests lately, busiest first, from the
    /// shards' busiest-keys tables (a bounded set, whatever the key count).
    pub fn busiest(&self, n: usize) -> Vec<KeyReading> {
        let mut held: Vec<(u32, Arc<str>)> = Vec::new();
        for shard in 0..SHARDS {
            let state = self.shards.read(shard);
            held.extend(state.rest.hitters.held().map(|(name, c)| (c, name.clone())));
        }
        held.sort_unstable_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
        held.into_iter()
            .filter_map(|(_, name)| self.read_live(&name))
            .take(n)
            .collect()
    }

    /// The shard a key lives in (0 to [`SHARDS`]` - 1`), for tools and
    /// tests that look at work per shard.
    pub fn shard_of(&self, key: &str) -> usize {
        Shards::shard_of(self.shards.hash(key))
    }

    /// Keys at rest forgotten to make room for a new key, since start.
    pub fn keys_evicted(&self) -> u64 {
        self.room.evicted.load(Ordering::Relaxed)
    }

    /// Idle sweep batches run since start, and the largest batch.
    pub fn sweep_figures(&self) -> (u64, u64) {
        (
            self.sweeps.batches.load(Ordering::Relaxed),
            self.sweeps.largest.load(Ordering::Relaxed),
        )
    }

    /// Reads every live key that starts with `prefix` and hands each
    /// reading to `visit`, in key order, a page at a time; returns how many
    /// were read. For tools that really want every key: observers use
    /// [`Engine::totals`], [`Engine::busiest`] and pages instead.
    pub fn visit_keys(&self, prefix: &str, mut visit: impl FnMut(KeyReading)) -> usize {
        let mut read = 0;
        let mut after: Option<String> = None;
        loop {
            let page = self.list_page(prefix, &[], after.as_deref(), 1000);
            read += page.readings.len();
            after = page.readings.last().map(|r| r.key.clone());
            page.readings.into_iter().for_each(&mut visit);
            if !page.more {
                return read;
            }
        }
    }
}

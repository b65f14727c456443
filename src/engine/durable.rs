//! State kept across restarts in a data dir (`--data-dir`): runtime
//! policy changes, isolations with who and why, and every breaker that is
//! not at rest (open with the end of its break, half-open, isolated, or
//! closed with a failure run), in one embedded, crash-safe file (redb).
//!
//! Operator actions and policy changes are written, with an fsync, before
//! their reply. Breaker changes are not waited for: a key whose durable
//! state changed is noted in its shard's dirty set under the lock the
//! request already holds, and a writer thread commits every noted key in
//! one transaction per commit window (`[server] commit_window`). A commit
//! reads each key's state as it is at commit time, inside the write
//! transaction, so commits (which redb runs one at a time) never write an
//! older state over a newer one.
//!
//! The file and its records are `storage`.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use redb::{Database, Durability, ReadableTable, ReadableTableMetadata};

use super::embedded::{Engine, Reach};
use super::error::EngineError;
use super::rules::Rule;
use super::shards::SHARDS;
use super::storage::{
    engine_time_of, humantime_of, open_error, phase_named, unix_ms, unix_ms_of, PolicyChange,
    Record, Restored, Storage, StorageError, StorageFigures, CACHE_BYTES, FILE, KEYS, META,
    NAMED_AT_START, POLICIES,
};
use crate::domain::{Durable, Fuse, Millis, Phase, PolicySpec};

impl Engine {
    /// A pairing of the engine's clock with the wall clock, now: engine
    /// times are stored as wall-clock times counted from it, so that a
    /// time keeps its distance from "now" across a restart (on the system
    /// clock and on a manual clock alike).
    fn clocks_now(&self) -> (Millis, u64) {
        (self.core.now(), unix_ms(std::time::SystemTime::now()))
    }

    /// Opens (or makes) the data dir `dir`, brings back what it holds
    /// (runtime policies first, then keys), and from then on keeps state
    /// there, committing breaker changes every `[server] commit_window`.
    /// Call once, before serving.
    pub fn open_data_dir(self: &Arc<Self>, dir: &Path) -> Result<Restored, StorageError> {
        std::fs::create_dir_all(dir).map_err(|e| {
            open_error(
                dir,
                e,
                "create it or pick another --data-dir where the server may write",
            )
        })?;
        let db = Database::builder()
            .set_cache_size(CACHE_BYTES)
            .create(dir.join(FILE))
            .map_err(|e| {
            let hint = match e {
                redb::DatabaseError::DatabaseAlreadyOpen => {
                    "another fusebox is using it: stop that server or pick another --data-dir"
                }
                redb::DatabaseError::Storage(redb::StorageError::Io(ref io))
                    if io.kind() != std::io::ErrorKind::InvalidData =>
                {
                    "check that the server may read and write the directory and its file"
                }
                _ => "the file is damaged or not a fusebox data file: move it aside to start with empty state (what it held is lost), or pick another --data-dir",
            };
            open_error(dir, format!("{}: {e}", dir.join(FILE).display()), hint)
        })?;
        let damaged = |e: &dyn std::fmt::Display| {
            open_error(
                dir,
                e,
                "the file is damaged: move it aside to start with empty state (what it held is lost)",
            )
        };
        let mut restored = Restored::default();
        let mut isolated = Vec::new();
        let (policies, records) = {
            let read = db.begin_read().map_err(|e| damaged(&e))?;
            let policies: Vec<PolicyChange> = match read.open_table(META) {
                Ok(meta) => match meta.get(POLICIES).map_err(|e| damaged(&e))? {
                    Some(bytes) => {
                        serde_json::from_slice(bytes.value()).map_err(|e| damaged(&e))?
                    }
                    None => Vec::new(),
                },
                Err(redb::TableError::TableDoesNotExist(_)) => Vec::new(),
                Err(e) => return Err(damaged(&e)),
            };
            let mut records = Vec::new();
            match read.open_table(KEYS) {
                Ok(keys) => {
                    for entry in keys.iter().map_err(|e| damaged(&e))? {
                        let (key, value) = entry.map_err(|e| damaged(&e))?;
                        match serde_json::from_slice::<Record>(value.value()) {
                            Ok(record) => records.push((key.value().to_owned(), record)),
                            Err(e) => {
                                restored.skipped += 1;
                                tracing::warn!(
                                    key = key.value(),
                                    "a stored key could not be read and starts fresh: {e}"
                                );
                            }
                        }
                    }
                }
                Err(redb::TableError::TableDoesNotExist(_)) => {}
                Err(e) => return Err(damaged(&e)),
            }
            (policies, records)
        };
        for change in &policies {
            if let Err(e) = self.apply_policy_change(change) {
                tracing::warn!("a stored policy change no longer applies and is skipped: {e}");
            }
        }
        restored.policy_changes = policies.len();
        let clocks = self.clocks_now();
        for (key, record) in records {
            let Some(phase) = phase_named(&record.phase) else {
                restored.skipped += 1;
                continue;
            };
            let kept = Durable {
                phase,
                epoch: record.epoch,
                run: record.run,
                attempts: record.attempts,
                openings: record.openings,
                open_until: record
                    .open_until_ms
                    .map_or(0, |t| engine_time_of(clocks, t)),
                changed_at: engine_time_of(clocks, record.changed_at_ms),
            };
            let policy = self.policy_for(&key);
            let access = Reach {
                create: true,
                request: false,
                actor: None,
                settling: false,
                owner: None,
            };
            match self.with_fuse(&key, access, |fuse, ctx| {
                // The tag is the engine's, not the kept state's.
                let tag = fuse.tag();
                *fuse = Fuse::restore(policy, &kept, ctx.now);
                fuse.set_tag(tag);
                fuse.breaker().phase()
            }) {
                Ok(Some(phase)) => {
                    restored.by_phase[phase.index()] += 1;
                    if let (Phase::Isolated, Some(actor)) = (phase, record.isolated_by) {
                        isolated.push((key, actor));
                    }
                }
                Ok(None) | Err(_) => {
                    restored.skipped += 1;
                    tracing::warn!(key, "a stored key could not be restored (the key cap is reached); it starts fresh");
                }
            }
        }
        for (key, actor) in isolated.iter().take(NAMED_AT_START) {
            let since = humantime_of(actor.at_ms);
            tracing::info!(key, who = %actor.who, why = %actor.why, since = %since, "key stays isolated, as {} asked at {since}: {}", actor.who, actor.why);
        }
        if isolated.len() > NAMED_AT_START {
            tracing::info!("and {} more isolated keys", isolated.len() - NAMED_AT_START);
        }
        let stored = {
            let read = db.begin_read().map_err(|e| damaged(&e))?;
            match read.open_table(KEYS) {
                Ok(keys) => keys.len().map_err(|e| damaged(&e))?,
                Err(_) => 0,
            }
        };
        let storage = Storage {
            db,
            dir: dir.to_owned(),
            window: Duration::from_millis(self.core.limits().commit_window),
            policies: Mutex::new(policies),
            pending: AtomicBool::new(false),
            commits: AtomicU64::new(0),
            write_failures: AtomicU64::new(0),
            stored_keys: AtomicU64::new(stored),
            keys_written: AtomicU64::new(0),
        };
        if self.storage.set(storage).is_err() {
            return Err(open_error(
                dir,
                "the engine already keeps state in a data dir",
                "open a data dir once, before serving",
            ));
        }
        let weak = Arc::downgrade(self);
        std::thread::Builder::new()
            .name("fusebox-storage".into())
            .spawn(move || writer_loop(weak))
            .map_err(|e| open_error(dir, e, "the server could not start its writer thread"))?;
        Ok(restored)
    }

    /// True when state is kept in a data dir.
    pub fn has_data_dir(&self) -> bool {
        self.storage.get().is_some()
    }

    /// Figures of the data dir, when there is one.
    pub fn storage_figures(&self) -> Option<StorageFigures> {
        let s = self.storage.get()?;
        Some(StorageFigures {
            commits: s.commits.load(Ordering::Relaxed),
            write_failures: s.write_failures.load(Ordering::Relaxed),
            stored_keys: s.stored_keys.load(Ordering::Relaxed),
            keys_written: s.keys_written.load(Ordering::Relaxed),
        })
    }

    /// Writes every key noted since the last commit, in one transaction,
    /// synced to disk before this returns. A failure is logged and
    /// counted, and the keys stay noted for the next commit. Does nothing
    /// without a data dir.
    pub fn save(&self) -> Result<(), EngineError> {
        let Some(storage) = self.storage.get() else {
            return Ok(());
        };
        self.commit(storage).map_err(|e| {
            storage.write_failures.fetch_add(1, Ordering::Relaxed);
            tracing::error!(dir = %storage.dir.display(), "could not write to the data dir; decisions go on, but changes since the last write are lost if the server stops now: {e}");
            EngineError::Internal(format!(
                "the change is in force but could not be written to the data dir {}: {e}; it will be lost at restart, check the disk",
                storage.dir.display()
            ))
        })
    }

    // redb's error is large, but it is made only when a write fails.
    #[allow(clippy::result_large_err)]
    fn commit(&self, storage: &Storage) -> Result<(), redb::Error> {
        let mut txn = storage.db.begin_write()?;
        txn.set_durability(Durability::Immediate);
        // Cleared before the dirty sets are taken: a key noted from now on
        // sets it again and is written by the next commit.
        storage.pending.store(false, Ordering::Relaxed);
        let mut taken = Vec::new();
        for shard in 0..SHARDS {
            let mut guard = self.shards.write(shard);
            if guard.rest.dirty.is_empty() {
                continue;
            }
            let state = &mut *guard;
            let dirty = std::mem::take(&mut state.rest.dirty);
            for (name, actor) in dirty {
                let hash = self.shards.hash(&name);
                let kept = state
                    .find(hash, &name)
                    .map(|slot| slot.fuse.durable())
                    .filter(|kept| !kept.is_at_rest());
                taken.push((shard, name, kept, actor));
            }
        }
        if taken.is_empty() {
            // Nothing to write (the keys were taken by an operator's commit).
            return Ok(());
        }
        let clocks = self.clocks_now();
        let written = (|| {
            let stored = {
                let mut table = txn.open_table(KEYS)?;
                for (_, name, kept, actor) in &taken {
                    match kept {
                        None => {
                            table.remove(&**name)?;
                        }
                        Some(kept) => {
                            let isolated_by = match (kept.phase, actor) {
                                (Phase::Isolated, Some(actor)) => Some((**actor).clone()),
                                (Phase::Isolated, None) => table
                                    .get(&**name)?
                                    .and_then(|old| {
                                        serde_json::from_slice::<Record>(old.value()).ok()
                                    })
                                    .and_then(|old| old.isolated_by),
                                _ => None,
                            };
                            let record = Record {
                                phase: kept.phase.as_str().to_owned(),
                                epoch: kept.epoch,
                                run: kept.run,
                                attempts: kept.attempts,
                                openings: kept.openings,
                                open_until_ms: (kept.phase == Phase::Open)
                                    .then(|| unix_ms_of(clocks, kept.open_until)),
                                changed_at_ms: unix_ms_of(clocks, kept.changed_at),
                                isolated_by,
                            };
                            let bytes = serde_json::to_vec(&record).expect("a record serializes");
                            table.insert(&**name, bytes.as_slice())?;
                        }
                    }
                }
                table.len()?
            };
            txn.commit()?;
            Ok::<_, redb::Error>(stored)
        })();
        match written {
            Ok(stored) => {
                storage.commits.fetch_add(1, Ordering::Relaxed);
                storage.stored_keys.store(stored, Ordering::Relaxed);
                storage
                    .keys_written
                    .fetch_add(taken.len() as u64, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => {
                // Noted again, so that the next commit writes them.
                for (shard, name, _, actor) in taken {
                    self.shards.write(shard).rest.mark_dirty(&name, actor);
                }
                storage.note_pending();
                Err(e)
            }
        }
    }

    /// Runs a policy change and, with a data dir, keeps it there before
    /// returning; changes are made and kept one at a time, in order.
    pub(super) fn change_policies<R>(
        &self,
        change: impl FnOnce() -> PolicyChange,
        apply: impl FnOnce() -> Result<R, EngineError>,
    ) -> Result<R, EngineError> {
        self.keep_policy_change(change, apply)
    }

    #[allow(clippy::result_large_err)]
    fn keep_policy_change<R>(
        &self,
        change: impl FnOnce() -> PolicyChange,
        apply: impl FnOnce() -> Result<R, EngineError>,
    ) -> Result<R, EngineError> {
        let Some(storage) = self.storage.get() else {
            return apply();
        };
        let mut kept = storage.policies.lock().expect("policies lock");
        let result = apply()?;
        let mut next = kept.clone();
        change().fold_into(&mut next);
        let written = (|| {
            let mut txn = storage.db.begin_write()?;
            txn.set_durability(Durability::Immediate);
            {
                let mut meta = txn.open_table(META)?;
                let bytes = serde_json::to_vec(&next).expect("policy changes serialize");
                meta.insert(POLICIES, bytes.as_slice())?;
            }
            txn.commit()?;
            Ok::<_, redb::Error>(())
        })();
        match written {
            Ok(()) => {
                storage.commits.fetch_add(1, Ordering::Relaxed);
                *kept = next;
            }
            Err(e) => {
                storage.write_failures.fetch_add(1, Ordering::Relaxed);
                tracing::error!(dir = %storage.dir.display(), "a policy change is in force but could not be written to the data dir; it will be lost at restart, check the disk: {e}");
                return Err(EngineError::Internal(format!(
                    "the policy change is in force but could not be written to the data dir {}: {e}; it will be lost at restart, check the disk",
                    storage.dir.display()
                )));
            }
        }
        Ok(result)
    }

    /// Applies a kept policy change at start-up (not kept again).
    fn apply_policy_change(&self, change: &PolicyChange) -> Result<(), String> {
        let policy_of = |spec: &PolicySpec| spec.validate().map_err(|e| e.to_string());
        match change {
            PolicyChange::Set { pattern, policy } => {
                let rule = Rule {
                    pattern: super::rules::Pattern::parse(pattern)?,
                    policy: policy_of(policy)?,
                };
                self.set_rule_now(rule);
            }
            PolicyChange::Delete { pattern } => {
                self.delete_rule_now(pattern).map_err(|e| e.to_string())?
            }
            PolicyChange::Default { policy } => self.set_default_now(policy_of(policy)?),
            PolicyChange::Reload => {}
        }
        Ok(())
    }
}

/// The writer: once per commit window, commits the keys noted dirty.
/// Ends, after a last commit, when the engine shuts down or is dropped.
fn writer_loop(engine: Weak<Engine>) {
    loop {
        let Some(engine) = engine.upgrade() else {
            return;
        };
        let Some(storage) = engine.storage.get() else {
            return;
        };
        let window = storage.window;
        let stopping = engine.is_shutting_down();
        if storage.pending.load(Ordering::Relaxed) || stopping {
            // A failure is logged and counted by save; the keys stay noted.
            let _ = engine.save();
        }
        if stopping {
            return;
        }
        drop(engine);
        std::thread::sleep(window);
    }
}

//! The data dir's file (`--data-dir`, redb): its tables, what a key's
//! record and a policy change hold, and the figures of its commits. The
//! engine's part, what it writes and when, is `durable`.
//!
//! Times are stored as wall-clock milliseconds since the Unix epoch, since
//! the engine's clock starts again at each start. Keys at rest are not
//! stored: a key that returns to rest, or is forgotten, is deleted.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, UNIX_EPOCH};

use redb::{Database, TableDefinition};
use serde::{Deserialize, Serialize};

use super::rules::Rule;
use crate::domain::{Millis, Phase, PolicySpec};

/// The file in the data dir.
pub const FILE: &str = "fusebox.redb";

/// Every key not at rest, by name.
pub(super) const KEYS: TableDefinition<&str, &[u8]> = TableDefinition::new("keys");
/// Everything else: the runtime policy changes under [`POLICIES`].
pub(super) const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
pub(super) const POLICIES: &str = "policies";

/// The most memory redb may use to cache the file's pages.
pub(super) const CACHE_BYTES: usize = 64 << 20;

/// Isolated keys named one by one in the start-up log; past this, a count.
pub(super) const NAMED_AT_START: usize = 20;

/// Who isolated or closed a key, why, and when (Unix ms).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Actor {
    /// The operator.
    pub who: String,
    /// Their reason.
    pub why: String,
    /// When, in ms since the Unix epoch.
    pub at_ms: u64,
}

/// A key as stored.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct Record {
    pub(super) phase: String,
    pub(super) epoch: u64,
    pub(super) run: u32,
    pub(super) attempts: u32,
    pub(super) openings: u32,
    /// The end of the break (Unix ms), when open.
    pub(super) open_until_ms: Option<u64>,
    /// When the phase last changed (Unix ms).
    pub(super) changed_at_ms: u64,
    /// Who isolated the key, when it is isolated.
    pub(super) isolated_by: Option<Actor>,
}

/// A policy change made at run time, as kept; replayed in order on top of
/// the config file's rules at start-up.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub(super) enum PolicyChange {
    /// `SetPolicy` of a rule.
    Set {
        /// The rule's match, as written.
        pattern: String,
        /// Its policy.
        policy: PolicySpec,
    },
    /// `DeletePolicy`.
    Delete {
        /// The rule's match, as written.
        pattern: String,
    },
    /// `SetPolicy` of the default rule.
    Default {
        /// The policy.
        policy: PolicySpec,
    },
    /// A config reload: every rule comes from the file again.
    Reload,
}

impl PolicyChange {
    pub(super) fn set(rule: &Rule) -> PolicyChange {
        PolicyChange::Set {
            pattern: rule.pattern.text(),
            policy: rule.policy.spec(),
        }
    }

    /// Adds this change to the kept list, keeping it short: the list says
    /// the same as every change made, in order, but holds at most a delete
    /// and a set per match and one default.
    pub(super) fn fold_into(self, kept: &mut Vec<PolicyChange>) {
        match self {
            PolicyChange::Reload => kept.clear(),
            PolicyChange::Default { .. } => {
                kept.retain(|c| !matches!(c, PolicyChange::Default { .. }));
                kept.push(self);
            }
            PolicyChange::Delete { ref pattern } => {
                // Whatever came before for this match ends deleted.
                kept.retain(|c| c.pattern() != Some(pattern));
                kept.push(self);
            }
            PolicyChange::Set {
                ref pattern,
                ref policy,
            } => {
                // A set of a match whose last change was a set replaces it
                // where it stands, as SetPolicy does with the rule.
                let last = kept.iter_mut().rfind(|c| c.pattern() == Some(pattern));
                match last {
                    Some(PolicyChange::Set { policy: held, .. }) => *held = policy.clone(),
                    _ => kept.push(self),
                }
            }
        }
    }

    fn pattern(&self) -> Option<&String> {
        match self {
            PolicyChange::Set { pattern, .. } | PolicyChange::Delete { pattern } => Some(pattern),
            PolicyChange::Default { .. } | PolicyChange::Reload => None,
        }
    }
}

/// Why the data dir could not be used at start-up.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// The directory or its file could not be opened or read.
    #[error("cannot use the data dir {dir}: {problem}; {hint}")]
    Open {
        /// The data dir.
        dir: String,
        /// What went wrong.
        problem: String,
        /// What to do.
        hint: &'static str,
    },
}

/// What was brought back from the data dir at start-up.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Restored {
    /// Keys restored, by phase ([`Phase::index`]).
    pub by_phase: [u64; 4],
    /// Policy changes re-applied on top of the config file's rules.
    pub policy_changes: usize,
    /// Stored keys that could not be restored (key cap, unreadable record).
    pub skipped: u64,
}

impl Restored {
    /// Keys restored.
    pub fn keys(&self) -> u64 {
        self.by_phase.iter().sum()
    }
}

/// Figures of the data dir, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StorageFigures {
    /// Transactions committed.
    pub commits: u64,
    /// Commits that failed (the disk, the file).
    pub write_failures: u64,
    /// Keys stored now.
    pub stored_keys: u64,
    /// Keys written (stored or deleted) since start.
    pub keys_written: u64,
}

/// The open data dir.
pub(super) struct Storage {
    pub(super) db: Database,
    pub(super) dir: PathBuf,
    pub(super) window: Duration,
    /// The runtime policy changes as kept; held while a change is made and
    /// written, so that changes reach the file in the order they were made.
    pub(super) policies: Mutex<Vec<PolicyChange>>,
    /// Some key was noted dirty since the last commit began.
    pub(super) pending: AtomicBool,
    pub(super) commits: AtomicU64,
    pub(super) write_failures: AtomicU64,
    pub(super) stored_keys: AtomicU64,
    pub(super) keys_written: AtomicU64,
}

impl std::fmt::Debug for Storage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Storage")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl Storage {
    pub(super) fn note_pending(&self) {
        if !self.pending.load(Ordering::Relaxed) {
            self.pending.store(true, Ordering::Relaxed);
        }
    }
}

pub(super) fn open_error(
    dir: &Path,
    problem: impl std::fmt::Display,
    hint: &'static str,
) -> StorageError {
    StorageError::Open {
        dir: dir.display().to_string(),
        problem: problem.to_string(),
        hint,
    }
}

pub(super) fn unix_ms(t: std::time::SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The wall-clock time (Unix ms) of engine time `at`, given `(engine now,
/// wall now)`.
pub(super) fn unix_ms_of((now, wall): (Millis, u64), at: Millis) -> u64 {
    if at >= now {
        wall.saturating_add(at - now)
    } else {
        wall.saturating_sub(now - at)
    }
}

/// The engine time of wall-clock time `unix` (Unix ms), given `(engine
/// now, wall now)`; a time before the engine's origin reads as 0.
pub(super) fn engine_time_of((now, wall): (Millis, u64), unix: u64) -> Millis {
    if unix >= wall {
        now.saturating_add(unix - wall)
    } else {
        now.saturating_sub(wall - unix)
    }
}

pub(super) fn phase_named(name: &str) -> Option<Phase> {
    Phase::ALL.into_iter().find(|p| p.as_str() == name)
}

/// A Unix time in ms as `YYYY-MM-DDTHH:MM:SSZ` (RFC 3339, whole seconds),
/// for the log.
pub(super) fn humantime_of(unix_ms: u64) -> String {
    prost_types::Timestamp {
        seconds: i64::try_from(unix_ms / 1000).unwrap_or(i64::MAX),
        nanos: 0,
    }
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(pattern: &str, failures: u32) -> PolicyChange {
        PolicyChange::Set {
            pattern: pattern.into(),
            policy: PolicySpec {
                breaker: Some(crate::domain::policy::BreakerSpec {
                    mode: "consecutive".into(),
                    failures: Some(failures),
                    break_: Some(crate::domain::DurationSpec(1000)),
                    ..Default::default()
                }),
                ..Default::default()
            },
        }
    }

    fn delete(pattern: &str) -> PolicyChange {
        PolicyChange::Delete {
            pattern: pattern.into(),
        }
    }

    #[test]
    fn kept_policy_changes_stay_short_and_say_the_same() {
        let mut kept = Vec::new();
        for change in [set("a", 1), set("b", 1), set("a", 2)] {
            change.fold_into(&mut kept);
        }
        // "a" replaced where it stood, ahead of "b", as SetPolicy does.
        assert_eq!(kept, vec![set("a", 2), set("b", 1)]);
        for change in [delete("a"), set("a", 3), delete("a"), set("a", 4)] {
            change.fold_into(&mut kept);
        }
        assert_eq!(kept, vec![set("b", 1), delete("a"), set("a", 4)]);
        PolicyChange::Reload.fold_into(&mut kept);
        assert!(kept.is_empty());
    }

    #[test]
    fn wall_times_are_written_as_utc() {
        assert_eq!(humantime_of(0), "1970-01-01T00:00:00Z");
        assert_eq!(humantime_of(1_709_251_199_000), "2024-02-29T23:59:59Z");
    }
}

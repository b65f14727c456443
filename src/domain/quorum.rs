//! Quorum trips (SPEC section 10, Q1-Q2): who called, and how many distinct
//! callers the failures that would trip a breaker came from.
//!
//! A caller is known by its [`CallerId`]: a 32-bit fingerprint of its name
//! (FNV-1a), the same in the engine and the Redis module, so a ticket keeps
//! four bytes for it whatever the name's length. Two names with the same
//! fingerprint count as one caller: among a hundred failing callers that
//! happens about once in a million trips, and it only ever makes a trip
//! later, never earlier.
//!
//! A breaker under a quorum keeps [`Callers`]: the distinct callers of the
//! failures in its current run (consecutive mode), and, for each distinct
//! caller of a failure in the sampling window, the start of the window
//! bucket of its latest failure (ratio mode), so that a caller leaves the
//! window with its last failure (they age out with them). Each list keeps
//! at most [`MAX_QUORUM`] callers: once that many are known, any quorum the
//! policy may set is met, and a newer caller takes the place of the one
//! whose last failure is oldest.

use serde::{Deserialize, Serialize};

use crate::Millis;

/// The largest quorum a policy may ask for, and the most callers a list
/// keeps.
pub const MAX_QUORUM: u32 = 100;

/// The longest caller name, in bytes of UTF-8 (Q1).
pub const MAX_CALLER_BYTES: usize = 128;

/// A caller's fingerprint (Q1).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct CallerId(pub u32);

impl CallerId {
    /// The fingerprint of `name` (FNV-1a, 32 bits). An absent caller is
    /// the empty name.
    pub fn of(name: &str) -> CallerId {
        let mut hash: u32 = 0x811c_9dc5;
        for byte in name.bytes() {
            hash ^= u32::from(byte);
            hash = hash.wrapping_mul(0x0100_0193);
        }
        CallerId(hash)
    }
}

/// The callers a breaker under a quorum has recorded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Callers {
    /// The distinct callers of the failures in the current run.
    pub run: Vec<CallerId>,
    /// Each distinct caller of a failure in the sampling window, with the
    /// start of the bucket of its latest failure; oldest first.
    pub window: Vec<(CallerId, Millis)>,
    /// The same for slow outcomes (S1), for S3 (b).
    pub slow: Vec<(CallerId, Millis)>,
}

impl Callers {
    /// True when nothing is recorded.
    pub fn is_empty(&self) -> bool {
        self.run.is_empty() && self.window.is_empty() && self.slow.is_empty()
    }

    /// Adds `caller` to the run's callers.
    pub fn fail_in_run(&mut self, caller: CallerId) {
        if self.run.contains(&caller) {
            return;
        }
        if self.run.len() >= MAX_QUORUM as usize {
            self.run.remove(0);
        }
        self.run.push(caller);
    }

    /// Records a failure of `caller` in the window bucket starting at
    /// `bucket`.
    pub fn fail_in_window(&mut self, caller: CallerId, bucket: Millis) {
        note(&mut self.window, caller, bucket);
    }

    /// Records a slow outcome of `caller` in the window bucket starting at
    /// `bucket` (S1).
    pub fn slow_in_window(&mut self, caller: CallerId, bucket: Millis) {
        note(&mut self.slow, caller, bucket);
    }

    /// Forgets the window's callers whose last failure no longer counts at
    /// `now` (its bucket started `window` or more ago).
    pub fn prune(&mut self, now: Millis, window: Millis) {
        self.window.retain(|&(_, start)| start + window > now);
        self.slow.retain(|&(_, start)| start + window > now);
    }

    /// Distinct callers of the window's failures that count at `now`.
    pub fn in_window(&self, now: Millis, window: Millis) -> u32 {
        self.window
            .iter()
            .filter(|&&(_, start)| start + window > now)
            .count() as u32
    }
}

/// Notes `caller`'s latest outcome in the bucket starting at `bucket`,
/// keeping at most [`MAX_QUORUM`] callers, oldest first.
fn note(list: &mut Vec<(CallerId, Millis)>, caller: CallerId, bucket: Millis) {
    if let Some(i) = list.iter().position(|c| c.0 == caller) {
        list.remove(i);
    } else if list.len() >= MAX_QUORUM as usize {
        list.remove(0);
    }
    list.push((caller, bucket));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_are_fnv1a() {
        // The published FNV-1a test values.
        assert_eq!(CallerId::of(""), CallerId(0x811c_9dc5));
        assert_eq!(CallerId::of("a"), CallerId(0xe40c_292c));
        assert_eq!(CallerId::of("foobar"), CallerId(0xbf9c_f968));
    }

    #[test]
    fn a_caller_leaves_the_window_with_its_last_failure() {
        let (a, b) = (CallerId::of("a"), CallerId::of("b"));
        let mut c = Callers::default();
        c.fail_in_window(a, 0);
        c.fail_in_window(b, 100);
        c.fail_in_window(a, 200);
        assert_eq!(c.in_window(999, 1000), 2);
        assert_eq!(c.in_window(1100, 1000), 1, "b's only failure left");
        assert_eq!(c.in_window(1200, 1000), 0);
        c.prune(1100, 1000);
        assert_eq!(c.window, vec![(a, 200)]);
    }

    #[test]
    fn lists_keep_at_most_max_quorum_distinct_callers() {
        let mut c = Callers::default();
        for i in 0..(MAX_QUORUM + 20) {
            c.fail_in_run(CallerId(i));
            c.fail_in_run(CallerId(i));
            c.fail_in_window(CallerId(i), u64::from(i));
        }
        assert_eq!(c.run.len(), MAX_QUORUM as usize);
        assert_eq!(c.window.len(), MAX_QUORUM as usize);
        assert_eq!(c.window[0], (CallerId(20), 20), "the oldest went first");
    }
}

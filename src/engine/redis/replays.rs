//! Refusing a signed event published again. A signature says who wrote a
//! message, not when: anyone who can PUBLISH on Redis can send a captured
//! event again, and without more it would reach every watcher as news.
//! The module puts each event's place in its key's sequence in the signed
//! payload ([`NoticeOrder`]: the step's time, then the breaker's epoch);
//! [`LastSeen`] remembers the last one taken for each key and refuses an
//! event that is not newer, or that is older than [`MAX_AGE`] by this
//! server's clock (which covers the keys it does not remember: after its
//! start, or once they were evicted).
//!
//! The memory is bounded: at [`CAP`] keys, the ones whose last event is
//! older than [`MAX_AGE`] are forgotten first (the age alone refuses
//! theirs), then the oldest eighth; those are counted
//! ([`StoreFigures::event_orders_evicted`]), as their events could be
//! taken again until they are [`MAX_AGE`] old.
//!
//! [`StoreFigures::event_orders_evicted`]: super::super::store::StoreFigures::event_orders_evicted

use std::collections::HashMap;

use crate::domain::wire::NoticeOrder;
use crate::domain::Millis;

/// How old an event may be, by this server's clock, and still be taken:
/// room for the clocks of Redis and the servers to differ and for a
/// message to travel, far less than the ten minutes a key at rest is kept
/// (K2), and short enough that a captured event is useless soon.
pub const MAX_AGE: Millis = 60_000;

/// The most keys whose last event is remembered.
pub const CAP: usize = 100_000;

/// Why an event was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Not newer than the last event taken for its key.
    NotNewer {
        /// The refused event's order.
        order: NoticeOrder,
        /// The last one taken.
        last: NoticeOrder,
    },
    /// Older than [`MAX_AGE`] by this server's clock.
    TooOld {
        /// How old, in ms.
        age: Millis,
    },
    /// It carries no order: a module older than this server's, or a
    /// message captured from one.
    Unordered,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::NotNewer { order, last } => write!(
                f,
                "an event of its key at {} ms (epoch {}) came after the last one taken, at {} ms (epoch {})",
                order.now_ms, order.seq, last.now_ms, last.seq
            ),
            Refusal::TooOld { age } => write!(
                f,
                "an event {} s old, and events older than {} s are not taken (if the store's clock is behind this server's, set both right)",
                age / 1000,
                MAX_AGE / 1000
            ),
            Refusal::Unordered => f.write_str(
                "an event without its order in its key's sequence, from a module older than this server (upgrade the module on every node first)",
            ),
        }
    }
}

/// The last event taken for each key, within a cap.
#[derive(Debug)]
pub struct LastSeen {
    last: HashMap<String, NoticeOrder>,
    cap: usize,
}

impl Default for LastSeen {
    fn default() -> LastSeen {
        LastSeen::with_cap(CAP)
    }
}

/// What [`LastSeen::take`] did to the memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Kept {
    /// Keys remembered now.
    pub keys: usize,
    /// Keys forgotten while their last event was younger than [`MAX_AGE`].
    pub evicted: usize,
}

impl LastSeen {
    /// A memory of at most `cap` keys (at least 8).
    pub fn with_cap(cap: usize) -> LastSeen {
        LastSeen {
            last: HashMap::new(),
            cap: cap.max(8),
        }
    }

    /// Takes the event of `key` at `order`, heard at `now` on this
    /// server's clock, or says why not; a refused event changes nothing.
    pub fn take(&mut self, key: &str, order: NoticeOrder, now: Millis) -> Result<Kept, Refusal> {
        let age = now.saturating_sub(order.now_ms);
        if age > MAX_AGE {
            return Err(Refusal::TooOld { age });
        }
        if let Some(last) = self.last.get_mut(key) {
            if order <= *last {
                return Err(Refusal::NotNewer { order, last: *last });
            }
            *last = order;
            return Ok(self.kept(0));
        }
        let evicted = if self.last.len() >= self.cap {
            self.evict(now)
        } else {
            0
        };
        self.last.insert(key.to_owned(), order);
        Ok(self.kept(evicted))
    }

    fn kept(&self, evicted: usize) -> Kept {
        Kept {
            keys: self.last.len(),
            evicted,
        }
    }

    /// Makes room: forgets the keys whose last event the age refuses
    /// anyway, then, when that is not an eighth of the cap, the oldest
    /// eighth. Returns how many of the second kind were forgotten.
    fn evict(&mut self, now: Millis) -> usize {
        let young = |o: &NoticeOrder| now.saturating_sub(o.now_ms) <= MAX_AGE;
        self.last.retain(|_, o| young(o));
        let room = self.cap / 8;
        if self.cap - self.last.len() >= room {
            return 0;
        }
        let mut times: Vec<Millis> = self.last.values().map(|o| o.now_ms).collect();
        let (_, &mut cut, _) = times.select_nth_unstable(room - 1);
        let before = self.last.len();
        self.last.retain(|_, o| o.now_ms > cut);
        // Many keys at the cut's instant: at least one goes.
        if self.last.len() == before {
            if let Some(k) = self.last.keys().next().cloned() {
                self.last.remove(&k);
            }
        }
        before - self.last.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(now_ms: Millis, seq: u64) -> NoticeOrder {
        NoticeOrder { now_ms, seq }
    }

    #[test]
    fn an_event_not_newer_than_its_keys_last_is_refused() {
        let mut seen = LastSeen::default();
        let now = 1_000_000;
        assert!(seen.take("a", at(now, 4), now).is_ok());
        // The same event again, and an older one of the same key.
        assert!(matches!(
            seen.take("a", at(now, 4), now),
            Err(Refusal::NotNewer { .. })
        ));
        assert!(seen.take("a", at(now - 1, 9), now).is_err());
        // Newer by its epoch at one instant, or by its time.
        assert!(seen.take("a", at(now, 5), now).is_ok());
        assert!(seen.take("a", at(now + 1, 1), now).is_ok());
        // Other keys are their own.
        assert!(seen.take("b", at(now, 1), now).is_ok());
        // Too old, even for a key never seen; the future is taken.
        let old = seen.take("c", at(now - MAX_AGE - 1, 1), now).unwrap_err();
        assert_eq!(old, Refusal::TooOld { age: MAX_AGE + 1 });
        assert!(old.to_string().contains("60 s"), "{old}");
        assert!(seen.take("c", at(now - MAX_AGE, 1), now).is_ok());
        assert!(seen.take("d", at(now + 5_000, 1), now).is_ok());
    }

    #[test]
    fn the_memory_is_bounded_and_forgets_the_old_first() {
        let mut seen = LastSeen::with_cap(16);
        let now = 10_000_000;
        // Half the keys have events past the age, half young.
        for i in 0..8 {
            seen.take(&format!("old{i}"), at(now - 100, i), now - 100)
                .unwrap();
        }
        for i in 0..8 {
            seen.take(&format!("young{i}"), at(now + i, 1), now)
                .unwrap();
        }
        // Past the cap, later: the old ones go first, not counted.
        let kept = seen.take("new", at(now + 100, 1), now + MAX_AGE).unwrap();
        assert_eq!(
            kept,
            Kept {
                keys: 9,
                evicted: 0
            }
        );
        // Fill it with young ones: then the oldest eighth goes, counted.
        for i in 0..7 {
            seen.take(&format!("more{i}"), at(now + 200 + i, 1), now + MAX_AGE)
                .unwrap();
        }
        let kept = seen.take("last", at(now + 300, 1), now + MAX_AGE).unwrap();
        assert_eq!(
            kept,
            Kept {
                keys: 15,
                evicted: 2
            }
        );
        assert!(!seen.last.contains_key("young0"));
        assert!(seen.last.contains_key("young2"));
        // A young key forgotten is refused by its age only.
        assert!(seen.take("young0", at(now, 1), now + MAX_AGE).is_ok());
    }
}

//! Charges without tickets, for callers that never complete: Envoy's
//! rate-limit service asks "may this request pass?" and never says how the
//! call went. A charge takes rate permits at once and leaves no ticket.
//!
//! A request may name several keys and must be charged at all of them or
//! at none (all-or-nothing). So a charge comes in two steps: [`Fuse::quote`]
//! says what the charge would answer and changes nothing but the passing of
//! time; [`Fuse::charge`] applies it. The engine quotes every key of a
//! request under their locks, then charges them all only if every quote
//! fits.

use super::{Common, Fuse, TicketTable};
use crate::breaker::Admission;
use crate::policy::LimiterKind;
use crate::{FuseError, Millis};

/// What charging permits at a key answers, or would answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quote {
    /// True when the charge fits: the breaker admits, the key's limiter is a
    /// rate limiter and its free permits cover the charge. A status check
    /// (a charge of 0) fits when at least one permit is free.
    pub fits: bool,
    /// The limiter's limit (`permits` or `capacity`); `None` when the
    /// key's policy has no limiter (then every charge fits).
    pub limit: Option<u32>,
    /// Permits free after the charge when it fits, else free now.
    pub remaining: u32,
    /// How long until the limiter's count starts afresh: the end of the
    /// current window for a fixed window, else the time until every permit
    /// is free again (0 when they all are); `None` without a limiter.
    pub reset_in: Option<Millis>,
}

impl<T: TicketTable> Fuse<T> {
    /// What charging `permits` at `now` would answer. Changes nothing but
    /// what time changes anyway (leases and waits that fell due are
    /// settled first, as every operation does).
    pub fn quote(&mut self, permits: u32, now: Millis) -> Result<Quote, FuseError> {
        self.check_time(now)?;
        self.settle(now);
        let quote = self.quoted(permits, now);
        self.tidy();
        Ok(quote)
    }

    /// Charges `permits` at `now` when they fit, and answers as
    /// [`Fuse::quote`] would, with `remaining` and `reset_in` counted after
    /// the charge.
    /// A charge that does not fit, or a status check, changes nothing but
    /// the key's statistics.
    pub fn charge(&mut self, permits: u32, now: Millis) -> Result<Quote, FuseError> {
        self.check_time(now)?;
        self.settle(now);
        let mut quote = self.quoted(permits, now);
        if quote.fits && permits > 0 {
            if let Some(limiter) = self.live_mut().book.limiter_mut() {
                limiter.take(permits, now);
            }
            // What is left, and when it starts afresh, after the charge.
            let after = self.quoted(0, now);
            quote.remaining = after.remaining;
            quote.reset_in = after.reset_in;
            self.counters.bump(Common::Granted);
        } else if !quote.fits {
            self.counters.more().by_reason[crate::Reason::NoPermits as usize] += 1;
        }
        self.tidy();
        Ok(quote)
    }

    fn quoted(&self, permits: u32, now: Millis) -> Quote {
        let admits = self.admission(now) == Admission::Normal;
        let Some(limiter) = self.limiter() else {
            return Quote {
                fits: admits,
                limit: None,
                remaining: 0,
                reset_in: None,
            };
        };
        let free = limiter.available(now);
        let limit = limiter.limit();
        // Concurrency permits come back only with a ticket: a charge has
        // none, so it would hold them for ever.
        let fits = admits
            && !limiter.returns_permits()
            && if permits == 0 {
                free > 0
            } else {
                free >= permits
            };
        let reset_in = match self.policy.limiter.map(|lp| lp.kind) {
            Some(LimiterKind::FixedWindow { window, .. }) => window.get() - now % window.get(),
            _ => limiter
                .ready_at(limit, now)
                .map_or(0, |at| at.saturating_sub(now)),
        };
        Quote {
            fits,
            limit: Some(limit),
            remaining: free,
            reset_in: Some(reset_in),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::num::{NonZeroU32, NonZeroU64};

    use super::*;
    use crate::policy::{LimiterPolicy, Order};
    use crate::{Fuse, Policy};

    fn window(permits: u32, ms: u64) -> Policy {
        Policy {
            breaker: None,
            limiter: Some(LimiterPolicy {
                kind: LimiterKind::FixedWindow {
                    permits: NonZeroU32::new(permits).expect("non-zero"),
                    window: NonZeroU64::new(ms).expect("non-zero"),
                },
                queue_limit: 0,
                order: Order::OldestFirst,
            }),
            lease: Default::default(),
            retry_budget: None,
            enforce: true,
        }
    }

    #[test]
    fn a_quote_changes_nothing_and_a_charge_takes_what_fits() {
        let mut fuse: Fuse = Fuse::new(window(3, 1000), 0);
        let q = fuse.quote(2, 100).expect("quote");
        assert_eq!(
            q,
            Quote {
                fits: true,
                limit: Some(3),
                remaining: 3,
                reset_in: Some(900)
            }
        );
        assert_eq!(fuse.quote(2, 100).expect("quote").remaining, 3);
        let c = fuse.charge(2, 100).expect("charge");
        assert!(c.fits);
        assert_eq!(c.remaining, 1);
        let over = fuse.charge(2, 200).expect("charge");
        assert!(!over.fits);
        assert_eq!(
            over.remaining, 1,
            "a charge that does not fit takes nothing"
        );
        assert!(
            fuse.charge(0, 200).expect("check").fits,
            "one permit is free"
        );
        assert!(fuse.charge(1, 200).expect("charge").fits);
        assert!(!fuse.charge(0, 300).expect("check").fits, "none is free");
        assert!(fuse.charge(3, 1000).expect("charge").fits, "a new window");
        assert_eq!(fuse.stats().granted, 3);
    }

    /// The reset a charge answers is the one after it: a token bucket or a
    /// sliding window that was full resets only once the charge is paid
    /// back.
    #[test]
    fn a_charge_answers_the_reset_after_it() {
        let bucket = Policy {
            limiter: Some(LimiterPolicy {
                kind: LimiterKind::TokenBucket {
                    capacity: NonZeroU32::new(4).expect("non-zero"),
                    refill: NonZeroU32::new(1).expect("non-zero"),
                    period: NonZeroU64::new(250).expect("non-zero"),
                },
                queue_limit: 0,
                order: Order::OldestFirst,
            }),
            ..window(1, 1)
        };
        let mut fuse: Fuse = Fuse::new(bucket, 0);
        let first = fuse.charge(1, 100).expect("charge");
        assert_eq!((first.remaining, first.reset_in), (3, Some(150)));
        let more = fuse.charge(2, 100).expect("charge");
        assert_eq!((more.remaining, more.reset_in), (1, Some(650)));
        let sliding = Policy {
            limiter: Some(LimiterPolicy {
                kind: LimiterKind::SlidingWindow {
                    permits: NonZeroU32::new(2).expect("non-zero"),
                    window: NonZeroU64::new(1000).expect("non-zero"),
                    segments: NonZeroU32::new(4).expect("non-zero"),
                },
                queue_limit: 0,
                order: Order::OldestFirst,
            }),
            ..window(1, 1)
        };
        let mut fuse: Fuse = Fuse::new(sliding, 0);
        let c = fuse.charge(1, 100).expect("charge");
        assert_eq!((c.remaining, c.reset_in), (1, Some(900)));
    }

    #[test]
    fn without_a_limiter_every_charge_fits_and_a_concurrency_limiter_none() {
        let mut free: Fuse = Fuse::new(
            Policy {
                breaker: None,
                limiter: None,
                lease: Default::default(),
                retry_budget: None,
                enforce: true,
            },
            0,
        );
        assert!(free.charge(1_000_000, 1).expect("charge").fits);
        let mut held: Fuse = Fuse::new(
            Policy {
                breaker: None,
                limiter: Some(LimiterPolicy {
                    kind: LimiterKind::Concurrency {
                        permits: NonZeroU32::new(5).expect("non-zero"),
                    },
                    queue_limit: 0,
                    order: Order::OldestFirst,
                }),
                lease: Default::default(),
                retry_budget: None,
                enforce: true,
            },
            0,
        );
        assert!(!held.charge(1, 1).expect("charge").fits);
    }
}

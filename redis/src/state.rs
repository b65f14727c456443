//! How one key's state is kept in Redis: a string value holding a
//! versioned binary layout, read and written in place.
//!
//! A string, not a module data type, because a data type's callbacks (RDB
//! save and load, AOF rewrite, free) are `unsafe extern "C"` functions, and
//! the module has no `unsafe` of its own. A string gets RDB, AOF,
//! replication, `DUMP`/`RESTORE` and slot migration from Redis as they are.
//!
//! Layout, version 8 (little-endian; every value starts `FBX` and a
//! version byte, so a reader refuses a string that is not fusebox state,
//! and one written by a newer module):
//!
//! ```text
//! 0    "FBX", version 8                 4    header length (u32) = HEADER
//! 8    next deadline (u64; MAX = none)  16   phase (u8)   17 flags (u8)
//! 20   live tickets (u32)               24   waiters (u32)
//! 28   policy length (u32)              32   policy id (16 bytes)
//! 48   last time seen                   56   epoch
//! 64   breaker deadline                 72   phase changed at
//! 80   failure run (u32)                84   half-open attempts (u32)
//! 88   openings (u32)                   92   limiter kind (u8)
//! 96   limiter a (u64)                  104  limiter b (u64)
//! 112  17 counters (u64 each)           248  ticket table slots (u32)
//! 252  tail length (u32)                256  the probe's ticket id (16)
//! 272  the policy as JSON (policy length bytes)
//!      the ticket table ([`crate::table`]), table slots x 88 bytes + 16
//!      the tail: window buckets, sliding-window segments (index u64,
//!      count u64), waiters, then a half-open period's probing (u8 0 =
//!      none; 1, then successes u32, shared u8, slots u16, each slot's
//!      ticket id and end), the retry budget's denials (u64) and its
//!      segments (u16, then index, first attempts, retries, u64 each),
//!      each waiter's caller (u32), a quorum's callers (u8 0 = none; 1,
//!      then the run's (u16, then u32 each), the window's failures' and
//!      slow outcomes' (u16 each, then caller u32 and bucket start u64
//!      each)), then slow calls: the slow count (u64), the window's slow
//!      outcomes (u16, then bucket start u64 and count u32 each), the live
//!      slow calls (u8 0 = none; 1, then since u64, live u32, pending u32,
//!      each pending ticket's instant u64, id (16), counted u8 and caller
//!      u32, then the live slow tickets' callers (u16, then caller u32 and
//!      count u32 each)), then the shadow grants (u64, D1), then
//!      an adaptive limiter's baseline, its samples' sum and count, and
//!      when they began (u64 each, 0 for the other kinds; CX26)
//! ```
//!
//! A shadow ticket (D2) is flagged in its slot ([`crate::table`]).
//!
//! For a token bucket, limiter a is the tick and limiter b the tokens as an
//! i64 (below 0 once calls cost more than they took, U1); for a fixed
//! window, a is the window's index and b its count; for an adaptive
//! limiter (kind 5), a is the permits held and b the learned limit in
//! millionths of a permit.
//!
//! The fixed header holds what the settler and the census read without
//! decoding anything (the next deadline, the phase, the live tickets and
//! waiters); the ticket table is changed in place, a few slots a step; the
//! tail is small and written whole. The value may be longer than what the
//! header says is used (zeros at the end), so that a tail that shrinks by
//! a few bytes does not copy the value.
//!
//! Versions 1 (`FBX\x01` and the domain's `FuseState` as JSON), 2 (this
//! layout, but for the ticket table's heap: [`crate::table`]) and 3 (this
//! layout, but segment counts as u32, and tickets that never settle a
//! cost), 4 (this layout without the probing) and 5 (without callers, slow
//! calls, shadow grants and the adaptive averages: its waiters and tickets
//! read as called by the caller whose fingerprint is 0, and none is a
//! shadow ticket) and 6 (this layout, but an adaptive limiter's four
//! words meant what an earlier algorithm learned: read as zeros, a limiter
//! that measures its baseline again) and 7 (this layout, but a ticket table
//! without grant numbers, T2: [`crate::table`]) are still read; the next
//! write of such a key writes version 8.

use std::fmt;

use fusebox_domain::{
    BreakerState, BudgetSegment, CallerId, CallersState, CounterState, Fuse, FuseHead, FuseState,
    LimiterState, Millis, Phase, ProbingState, Reason, ReasonCounts, SlotState, SlowPendingState,
    SlowState, TicketId, WaiterState, WindowBucket,
};

use crate::table::{self, u32_at, u64_at};

/// The first bytes of every value the module writes.
pub const MAGIC: &[u8; 3] = b"FBX";

/// The encoding this module writes and the newest it reads.
pub const ENCODING_VERSION: u8 = 8;

/// Bytes of the fixed header of versions 2 and 3.
pub const HEADER: usize = 272;

/// Where the next deadline is, in every value of version 2 or 3.
pub const NEXT_DEADLINE_AT: usize = 8;

/// Header flag: the key is at rest, and so has an expiry (K2).
pub const AT_REST: u8 = 1;
/// Header flag: a live ticket is flagged as the probe (its id at 256).
pub const HAS_PROBE: u8 = 2;

/// The longest policy JSON a value holds.
pub const MAX_POLICY: usize = 64 * 1024;

/// Why a string value is not readable as fusebox state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StateError {
    /// The value does not start with the fusebox header.
    NotFusebox,
    /// The value was written by a newer module, with this encoding version.
    NewerEncoding(u8),
    /// The header is fusebox's but the rest is not a state the domain
    /// accepts (damaged bytes, or a state it could not have produced).
    Damaged(String),
}

impl fmt::Display for StateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StateError::NotFusebox => write!(
                f,
                "state: the key holds a string that is not fusebox state; \
                 use another key for fusebox, or delete this one"
            ),
            StateError::NewerEncoding(v) => write!(
                f,
                "state: the key holds fusebox state of encoding {v}, newer than this \
                 module's {ENCODING_VERSION}; load the same module version on every node"
            ),
            StateError::Damaged(why) => write!(
                f,
                "state: the key holds damaged fusebox state ({why}); \
                 delete the key to start it afresh"
            ),
        }
    }
}

impl std::error::Error for StateError {}

fn damaged(what: impl Into<String>) -> StateError {
    StateError::Damaged(what.into())
}

/// The encoding version of a stored value.
pub fn version(value: &[u8]) -> Result<u8, StateError> {
    let rest = value.strip_prefix(MAGIC).ok_or(StateError::NotFusebox)?;
    match rest.first() {
        None | Some(0) => Err(StateError::NotFusebox),
        Some(&v) if v > ENCODING_VERSION => Err(StateError::NewerEncoding(v)),
        Some(&v) => Ok(v),
    }
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    b.get(at..at + 2)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u16::from_le_bytes)
}

fn id_at(b: &[u8], at: usize) -> TicketId {
    TicketId((u128::from(u64_at(b, at)) << 64) | u128::from(u64_at(b, at + 8)))
}

fn put_id(out: &mut [u8], at: usize, id: TicketId) {
    out[at..at + 8].copy_from_slice(&((id.0 >> 64) as u64).to_le_bytes());
    out[at + 8..at + 16].copy_from_slice(&(id.0 as u64).to_le_bytes());
}

fn phase_code(phase: Phase) -> u8 {
    phase.index() as u8
}

fn phase_of(code: u8) -> Result<Phase, StateError> {
    Phase::ALL
        .get(usize::from(code))
        .copied()
        .ok_or_else(|| damaged(format!("phase: {code} is not a phase")))
}

/// What the header alone tells, without decoding the rest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Summary {
    /// When something must next happen at the key (a lease end, a wait's
    /// end, a refill that serves a waiter).
    pub next_deadline: Option<Millis>,
    /// The breaker's phase.
    pub phase: Phase,
    /// Live tickets.
    pub tickets: u32,
    /// Waiting requests.
    pub waiters: u32,
    /// The last time the key saw.
    pub last_now: Millis,
}

impl Summary {
    /// The summary of a fuse as it is now.
    pub fn of<T: fusebox_domain::TicketTable>(fuse: &Fuse<T>) -> Summary {
        Summary {
            next_deadline: fuse.next_deadline(),
            phase: fuse.phase(),
            tickets: u32::try_from(fuse.live_tickets()).unwrap_or(u32::MAX),
            waiters: u32::try_from(fuse.waiters()).unwrap_or(u32::MAX),
            last_now: fuse.last_now(),
        }
    }
}

/// The summary a stored value's header holds; a version-1 value is
/// decoded for it.
pub fn summary(value: &[u8]) -> Result<Summary, StateError> {
    match version(value)? {
        1 => Ok(Summary::of(&decode_v1(value)?)),
        _ => {
            let header = Header::read(value)?;
            Ok(Summary {
                next_deadline: (header.next_deadline != u64::MAX).then_some(header.next_deadline),
                phase: header.phase,
                tickets: header.tickets,
                waiters: header.waiters,
                last_now: header.head.last_now,
            })
        }
    }
}

/// The fixed header of a value of version 2 or 3, read.
#[derive(Clone, Debug, PartialEq)]
pub struct Header {
    /// The encoding: 2 or 3 (they differ in the ticket table's heap only).
    pub version: u8,
    /// The next deadline (`u64::MAX`: none).
    pub next_deadline: u64,
    /// The breaker's phase.
    pub phase: Phase,
    /// [`AT_REST`], [`HAS_PROBE`].
    pub flags: u8,
    /// Live tickets.
    pub tickets: u32,
    /// Waiters.
    pub waiters: u32,
    /// Bytes of the policy's JSON.
    pub policy_len: usize,
    /// The policy's id ([`crate::policy::id_of`] its JSON).
    pub policy_id: [u8; 16],
    /// Slots of the ticket table (0: none).
    pub table_cap: usize,
    /// Bytes of the tail.
    pub tail_len: usize,
    /// The probe's ticket, when [`HAS_PROBE`] is set.
    pub probe: Option<TicketId>,
    /// The head of the fuse, but for what the tail holds (the window,
    /// the sliding segments and the waiters are read from it).
    pub head: FuseHead,
    /// The limiter's kind code (0 none, 1 concurrency, 2 token bucket,
    /// 3 fixed window, 4 sliding window, 5 adaptive) and its two words.
    limiter: (u8, u64, u64),
}

impl Header {
    /// Where the ticket table starts.
    pub fn table_at(&self) -> usize {
        HEADER + self.policy_len
    }

    /// Where the tail starts.
    pub fn tail_at(&self) -> usize {
        let section = match self.version {
            2 => table::section_len_v2(self.table_cap),
            3..=7 => table::section_len_v7(self.table_cap),
            _ => table::section_len(self.table_cap),
        };
        self.table_at() + section
    }

    /// Bytes of the value in use.
    pub fn used(&self) -> usize {
        self.tail_at() + self.tail_len
    }

    /// The header of `value`, checked against its length.
    pub fn read(value: &[u8]) -> Result<Header, StateError> {
        let version = version(value)?;
        if version < 2 {
            return Err(damaged("not a value of version 2 or 3"));
        }
        if value.len() < HEADER || u32_at(value, 4) as usize != HEADER {
            return Err(damaged(format!(
                "the header is {} bytes, not {HEADER}",
                u32_at(value, 4)
            )));
        }
        let flags = value[17];
        let policy_len = u32_at(value, 28) as usize;
        let table_cap = u32_at(value, 248) as usize;
        let tail_len = u32_at(value, 252) as usize;
        if policy_len == 0 || policy_len > MAX_POLICY {
            return Err(damaged(format!("policy: {policy_len} bytes")));
        }
        if table_cap != 0
            && (!table_cap.is_power_of_two()
                || !(table::MIN_CAP..=table::MAX_CAP).contains(&table_cap))
        {
            return Err(damaged(format!("tickets: a table of {table_cap} slots")));
        }
        let mut policy_id = [0u8; 16];
        policy_id.copy_from_slice(&value[32..48]);
        let counter = |i: usize| u64_at(value, 112 + 8 * i);
        let header = Header {
            version,
            next_deadline: u64_at(value, 8),
            phase: phase_of(value[16])?,
            flags,
            tickets: u32_at(value, 20),
            waiters: u32_at(value, 24),
            policy_len,
            policy_id,
            table_cap,
            tail_len,
            probe: (flags & HAS_PROBE != 0).then(|| id_at(value, 256)),
            head: FuseHead {
                last_now: u64_at(value, 48),
                breaker: BreakerState {
                    phase: phase_of(value[16])?,
                    epoch: u64_at(value, 56),
                    deadline: u64_at(value, 64),
                    changed_at: u64_at(value, 72),
                    run: u32_at(value, 80),
                    attempts: u32_at(value, 84),
                    openings: u32_at(value, 88),
                    window: Vec::new(),
                    probing: None,
                    callers: None,
                },
                limiter: None,
                waiters: Vec::new(),
                counters: CounterState {
                    granted: counter(0),
                    probes: counter(1),
                    refused: counter(2),
                    by_reason: ReasonCounts::from([
                        counter(3),
                        counter(4),
                        counter(5),
                        counter(6),
                        counter(7),
                        counter(8),
                        counter(9),
                        // The retry budget's denials are kept in the tail.
                        0,
                    ]),
                    queued: counter(10),
                    withdrawn: counter(11),
                    successes: counter(12),
                    failures: counter(13),
                    ignored: counter(14),
                    stale: counter(15),
                    expired: counter(16),
                    // Slow calls are counted in the tail.
                    slow: 0,
                    // The shadow grants are kept in the tail.
                    shadow: 0,
                },
                budget: Vec::new(),
                slow: None,
            },
            limiter: (value[92], u64_at(value, 96), u64_at(value, 104)),
        };
        if header.used() > value.len() {
            return Err(damaged(format!(
                "the header says {} bytes are used, the value has {}",
                header.used(),
                value.len()
            )));
        }
        if header.tickets as usize * 2 > header.table_cap {
            return Err(damaged(format!(
                "tickets: {} in a table of {} slots",
                header.tickets, header.table_cap
            )));
        }
        Ok(header)
    }

    /// The policy's JSON in `value`.
    pub fn policy_json<'v>(&self, value: &'v [u8]) -> &'v [u8] {
        &value[HEADER..HEADER + self.policy_len]
    }

    /// The whole head, its tail read from `value`.
    pub fn full_head(&self, value: &[u8]) -> Result<FuseHead, StateError> {
        let tail = value
            .get(self.tail_at()..self.used())
            .ok_or_else(|| damaged("the tail is past the value's end"))?;
        let mut head = self.head.clone();
        let mut r = Reader { b: tail, at: 0 };
        let buckets = r.u16()?;
        for _ in 0..buckets {
            head.breaker.window.push(WindowBucket {
                start: r.u64()?,
                successes: r.u32()?,
                failures: r.u32()?,
                slow: 0,
            });
        }
        let segments = r.u16()?;
        let mut taken = Vec::with_capacity(usize::from(segments));
        for _ in 0..segments {
            let index = r.u64()?;
            // Counts are u64 since version 4 (up to 2 * permits, U1).
            let count = if self.version < 4 {
                u64::from(r.u32()?)
            } else {
                r.u64()?
            };
            taken.push((index, count));
        }
        let waiters = r.u32()?;
        if waiters != self.waiters {
            return Err(damaged(format!(
                "waiters: the header counts {}, the tail holds {waiters}",
                self.waiters
            )));
        }
        for _ in 0..waiters {
            let id = TicketId((u128::from(r.u64()?) << 64) | u128::from(r.u64()?));
            let permits = r.u32()?;
            let until = r.u64()?;
            let lease = r.u64()?;
            head.waiters.push(WaiterState {
                id,
                permits,
                until,
                lease: (lease != 0).then_some(lease),
                caller: CallerId(0),
            });
        }
        // A half-open period's successes and slots (H1-H4), since version 5.
        if self.version >= 5 && r.u8()? == 1 {
            let successes = r.u32()?;
            let shared = r.u8()? == 1;
            let slots = r.u16()?;
            let mut probing = ProbingState {
                successes,
                shared,
                slots: Vec::with_capacity(usize::from(slots)),
            };
            for _ in 0..slots {
                let ticket = TicketId((u128::from(r.u64()?) << 64) | u128::from(r.u64()?));
                probing.slots.push(SlotState {
                    ticket,
                    until: r.u64()?,
                });
            }
            head.breaker.probing = Some(probing);
        }
        // The retry budget's denials and segments, since version 5.
        if self.version >= 5 {
            head.counters.by_reason.retry_budget = r.u64()?;
            let segments = r.u16()?;
            for _ in 0..segments {
                head.budget.push(BudgetSegment {
                    index: r.u64()?,
                    first: r.u64()?,
                    retries: r.u64()?,
                });
            }
        }
        // The waiters' callers and a quorum's callers, since version 6.
        if self.version >= 6 {
            for w in &mut head.waiters {
                w.caller = CallerId(r.u32()?);
            }
            if r.u8()? == 1 {
                let mut callers = CallersState::default();
                for _ in 0..r.u16()? {
                    callers.run.push(CallerId(r.u32()?));
                }
                for _ in 0..r.u16()? {
                    callers.window.push((CallerId(r.u32()?), r.u64()?));
                }
                for _ in 0..r.u16()? {
                    callers.slow.push((CallerId(r.u32()?), r.u64()?));
                }
                head.breaker.callers = Some(callers);
            }
            // Slow calls (S1-S3): the count, the window's slow outcomes by
            // bucket start, the live slow calls.
            head.counters.slow = r.u64()?;
            let marked = r.u16()?;
            for _ in 0..marked {
                let start = r.u64()?;
                let slow = r.u32()?;
                let bucket = head
                    .breaker
                    .window
                    .iter_mut()
                    .find(|b| b.start == start)
                    .ok_or_else(|| {
                        damaged(format!("window: slow outcomes in no bucket ({start})"))
                    })?;
                bucket.slow = slow;
            }
            if r.u8()? == 1 {
                let since = r.u64()?;
                let live = r.u32()?;
                let pending = r.u32()?;
                let mut state = SlowState {
                    since,
                    live,
                    pending: Vec::with_capacity((pending as usize).min(4096)),
                    callers: Vec::new(),
                };
                for _ in 0..pending {
                    let at = r.u64()?;
                    let ticket = TicketId((u128::from(r.u64()?) << 64) | u128::from(r.u64()?));
                    let counted = r.u8()? == 1;
                    state.pending.push(SlowPendingState {
                        at,
                        ticket,
                        counted,
                        caller: CallerId(r.u32()?),
                    });
                }
                for _ in 0..r.u16()? {
                    state.callers.push((CallerId(r.u32()?), r.u32()?));
                }
                head.slow = Some(state);
            }
            // The shadow grants (D1).
            head.counters.shadow = r.u64()?;
        }
        // An adaptive limiter's baseline and samples since version 7;
        // version 6's words are skipped: such a limiter measures again.
        let mut averages = [0u64; 4];
        if self.version >= 6 {
            for a in &mut averages {
                *a = r.u64()?;
            }
            if self.version == 6 {
                averages = [0; 4];
            }
        }
        let [base, sum, count, since] = averages;
        let (kind, a, b) = self.limiter;
        head.limiter = match kind {
            0 => None,
            1 => Some(LimiterState::Concurrency { held: a }),
            // Tokens are an i64 in two's complement (below 0 since version
            // 4, U1); older versions wrote a u32 there.
            2 => Some(LimiterState::TokenBucket {
                tick: a,
                tokens: b as i64,
            }),
            3 => Some(LimiterState::FixedWindow { index: a, used: b }),
            4 => Some(LimiterState::SlidingWindow { taken }),
            5 => Some(LimiterState::Adaptive {
                held: a,
                limit: b,
                base,
                sum,
                count,
                since,
            }),
            k => return Err(damaged(format!("limiter: kind {k}"))),
        };
        Ok(head)
    }
}

struct Reader<'b> {
    b: &'b [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], StateError> {
        let s = self
            .b
            .get(self.at..self.at + n)
            .ok_or_else(|| damaged("the tail ends early"))?;
        self.at += n;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, StateError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, StateError> {
        Ok(u16_at(self.take(2)?, 0))
    }
    fn u32(&mut self) -> Result<u32, StateError> {
        Ok(u32_at(self.take(4)?, 0))
    }
    fn u64(&mut self) -> Result<u64, StateError> {
        Ok(u64_at(self.take(8)?, 0))
    }
}

/// The tail of `head`: its window, sliding segments and waiters.
pub fn encode_tail(head: &FuseHead) -> Vec<u8> {
    let window = &head.breaker.window;
    let taken: &[(u64, u64)] = match &head.limiter {
        Some(LimiterState::SlidingWindow { taken }) => taken,
        _ => &[],
    };
    let mut out =
        Vec::with_capacity(8 + window.len() * 16 + taken.len() * 16 + head.waiters.len() * 36);
    let count16 = |n: usize| u16::try_from(n).unwrap_or(u16::MAX).to_le_bytes();
    out.extend_from_slice(&count16(window.len()));
    for b in window.iter().take(usize::from(u16::MAX)) {
        out.extend_from_slice(&b.start.to_le_bytes());
        out.extend_from_slice(&b.successes.to_le_bytes());
        out.extend_from_slice(&b.failures.to_le_bytes());
    }
    out.extend_from_slice(&count16(taken.len()));
    for (index, n) in taken.iter().take(usize::from(u16::MAX)) {
        out.extend_from_slice(&index.to_le_bytes());
        out.extend_from_slice(&n.to_le_bytes());
    }
    out.extend_from_slice(&(head.waiters.len() as u32).to_le_bytes());
    for w in &head.waiters {
        out.extend_from_slice(&((w.id.0 >> 64) as u64).to_le_bytes());
        out.extend_from_slice(&(w.id.0 as u64).to_le_bytes());
        out.extend_from_slice(&w.permits.to_le_bytes());
        out.extend_from_slice(&w.until.to_le_bytes());
        out.extend_from_slice(&w.lease.unwrap_or(0).to_le_bytes());
    }
    match &head.breaker.probing {
        None => out.push(0),
        Some(p) => {
            out.push(1);
            out.extend_from_slice(&p.successes.to_le_bytes());
            out.push(u8::from(p.shared));
            out.extend_from_slice(&count16(p.slots.len()));
            for slot in p.slots.iter().take(usize::from(u16::MAX)) {
                out.extend_from_slice(&((slot.ticket.0 >> 64) as u64).to_le_bytes());
                out.extend_from_slice(&(slot.ticket.0 as u64).to_le_bytes());
                out.extend_from_slice(&slot.until.to_le_bytes());
            }
        }
    }
    out.extend_from_slice(&head.counters.by_reason.retry_budget.to_le_bytes());
    out.extend_from_slice(&count16(head.budget.len()));
    for s in head.budget.iter().take(usize::from(u16::MAX)) {
        out.extend_from_slice(&s.index.to_le_bytes());
        out.extend_from_slice(&s.first.to_le_bytes());
        out.extend_from_slice(&s.retries.to_le_bytes());
    }
    // Since version 6: the waiters' callers, then a quorum's callers.
    for w in &head.waiters {
        out.extend_from_slice(&w.caller.0.to_le_bytes());
    }
    match &head.breaker.callers {
        None => out.push(0),
        Some(c) => {
            out.push(1);
            out.extend_from_slice(&count16(c.run.len()));
            for caller in c.run.iter().take(usize::from(u16::MAX)) {
                out.extend_from_slice(&caller.0.to_le_bytes());
            }
            for list in [&c.window, &c.slow] {
                out.extend_from_slice(&count16(list.len()));
                for (caller, start) in list.iter().take(usize::from(u16::MAX)) {
                    out.extend_from_slice(&caller.0.to_le_bytes());
                    out.extend_from_slice(&start.to_le_bytes());
                }
            }
        }
    }
    out.extend_from_slice(&head.counters.slow.to_le_bytes());
    let marked: Vec<_> = window.iter().filter(|b| b.slow > 0).collect();
    out.extend_from_slice(&count16(marked.len()));
    for b in marked.iter().take(usize::from(u16::MAX)) {
        out.extend_from_slice(&b.start.to_le_bytes());
        out.extend_from_slice(&b.slow.to_le_bytes());
    }
    match &head.slow {
        None => out.push(0),
        Some(slow) => {
            out.push(1);
            out.extend_from_slice(&slow.since.to_le_bytes());
            out.extend_from_slice(&slow.live.to_le_bytes());
            out.extend_from_slice(&(slow.pending.len() as u32).to_le_bytes());
            for p in &slow.pending {
                out.extend_from_slice(&p.at.to_le_bytes());
                out.extend_from_slice(&((p.ticket.0 >> 64) as u64).to_le_bytes());
                out.extend_from_slice(&(p.ticket.0 as u64).to_le_bytes());
                out.push(u8::from(p.counted));
                out.extend_from_slice(&p.caller.0.to_le_bytes());
            }
            out.extend_from_slice(&count16(slow.callers.len()));
            for (caller, n) in slow.callers.iter().take(usize::from(u16::MAX)) {
                out.extend_from_slice(&caller.0.to_le_bytes());
                out.extend_from_slice(&n.to_le_bytes());
            }
        }
    }
    out.extend_from_slice(&head.counters.shadow.to_le_bytes());
    let averages = match &head.limiter {
        Some(LimiterState::Adaptive {
            base,
            sum,
            count,
            since,
            ..
        }) => [*base, *sum, *count, *since],
        _ => [0; 4],
    };
    for a in averages {
        out.extend_from_slice(&a.to_le_bytes());
    }
    out
}

/// What goes in a header besides the head.
#[derive(Clone, Copy, Debug)]
pub struct Frame {
    /// What the header alone tells.
    pub summary: Summary,
    /// [`AT_REST`], [`HAS_PROBE`] (set from `probe`).
    pub at_rest: bool,
    /// Bytes of the policy's JSON.
    pub policy_len: usize,
    /// The policy's id.
    pub policy_id: [u8; 16],
    /// Slots of the ticket table.
    pub table_cap: usize,
    /// Bytes of the tail.
    pub tail_len: usize,
    /// The probe's ticket.
    pub probe: Option<TicketId>,
}

/// The fixed header for `head` and `frame`.
pub fn encode_header(head: &FuseHead, frame: &Frame) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[0..3].copy_from_slice(MAGIC);
    h[3] = ENCODING_VERSION;
    h[4..8].copy_from_slice(&(HEADER as u32).to_le_bytes());
    let s = &frame.summary;
    h[8..16].copy_from_slice(&s.next_deadline.unwrap_or(u64::MAX).to_le_bytes());
    h[16] = phase_code(head.breaker.phase);
    h[17] =
        if frame.at_rest { AT_REST } else { 0 } | if frame.probe.is_some() { HAS_PROBE } else { 0 };
    h[20..24].copy_from_slice(&s.tickets.to_le_bytes());
    h[24..28].copy_from_slice(&s.waiters.to_le_bytes());
    h[28..32].copy_from_slice(&(frame.policy_len as u32).to_le_bytes());
    h[32..48].copy_from_slice(&frame.policy_id);
    let b = &head.breaker;
    h[48..56].copy_from_slice(&head.last_now.to_le_bytes());
    h[56..64].copy_from_slice(&b.epoch.to_le_bytes());
    h[64..72].copy_from_slice(&b.deadline.to_le_bytes());
    h[72..80].copy_from_slice(&b.changed_at.to_le_bytes());
    h[80..84].copy_from_slice(&b.run.to_le_bytes());
    h[84..88].copy_from_slice(&b.attempts.to_le_bytes());
    h[88..92].copy_from_slice(&b.openings.to_le_bytes());
    let (kind, a, bword) = match &head.limiter {
        None => (0, 0, 0),
        Some(LimiterState::Concurrency { held }) => (1, *held, 0),
        Some(LimiterState::TokenBucket { tokens, tick }) => (2, *tick, *tokens as u64),
        Some(LimiterState::FixedWindow { index, used }) => (3, *index, *used),
        Some(LimiterState::SlidingWindow { .. }) => (4, 0, 0),
        Some(LimiterState::Adaptive { held, limit, .. }) => (5, *held, *limit),
    };
    h[92] = kind;
    h[96..104].copy_from_slice(&a.to_le_bytes());
    h[104..112].copy_from_slice(&bword.to_le_bytes());
    let c = &head.counters;
    let r: [u64; Reason::COUNT] = c.by_reason.into();
    let counters = [
        c.granted,
        c.probes,
        c.refused,
        r[0],
        r[1],
        r[2],
        r[3],
        r[4],
        r[5],
        r[6],
        c.queued,
        c.withdrawn,
        c.successes,
        c.failures,
        c.ignored,
        c.stale,
        c.expired,
    ];
    for (i, n) in counters.iter().enumerate() {
        h[112 + 8 * i..120 + 8 * i].copy_from_slice(&n.to_le_bytes());
    }
    h[248..252].copy_from_slice(&(frame.table_cap as u32).to_le_bytes());
    h[252..256].copy_from_slice(&(frame.tail_len as u32).to_le_bytes());
    if let Some(probe) = frame.probe {
        put_id(&mut h, 256, probe);
    }
    h
}

/// The next deadline of a value of version 2 or 3, read at its fixed
/// offset; `None` for a value without one (or of version 1).
pub fn next_deadline(value: &[u8]) -> Option<Millis> {
    version(value)
        .is_ok_and(|v| v >= 2)
        .then(|| u64_at(value, NEXT_DEADLINE_AT))
        .filter(|&d| d != u64::MAX)
}

/// The fuse a version-1 value holds, checked by [`Fuse::from_state`].
pub fn decode_v1(value: &[u8]) -> Result<Fuse, StateError> {
    let payload = value.get(4..).ok_or(StateError::NotFusebox)?;
    let state: FuseState = serde_json::from_slice(payload).map_err(|e| damaged(e.to_string()))?;
    Fuse::from_state(state).map_err(|e| damaged(e.to_string()))
}

/// A version-1 value for `fuse` (what modules before version 2 wrote):
/// for tests of the migration.
pub fn encode_v1(fuse: &Fuse) -> Vec<u8> {
    let mut out = b"FBX\x01".to_vec();
    out.extend(serde_json::to_vec(&fuse.state()).expect("a FuseState serializes"));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn foreign_and_newer_values_are_refused_with_a_reason() {
        assert_eq!(version(b""), Err(StateError::NotFusebox));
        assert_eq!(version(b"FBX"), Err(StateError::NotFusebox));
        assert_eq!(version(b"FBX\x00"), Err(StateError::NotFusebox));
        assert_eq!(version(b"hello"), Err(StateError::NotFusebox));
        assert_eq!(version(b"FBX\x09x"), Err(StateError::NewerEncoding(9)));
        assert_eq!(version(b"FBX\x08x"), Ok(8));
        assert_eq!(version(b"FBX\x07x"), Ok(7));
        assert_eq!(version(b"FBX\x06x"), Ok(6));
        assert_eq!(version(b"FBX\x05x"), Ok(5));
        assert_eq!(version(b"FBX\x04x"), Ok(4));
        assert_eq!(version(b"FBX\x03x"), Ok(3));
        assert_eq!(version(b"FBX\x02x"), Ok(2));
        assert_eq!(version(b"FBX\x01{}"), Ok(1));
        assert!(StateError::NewerEncoding(8)
            .to_string()
            .starts_with("state: "));
    }

    #[test]
    fn a_damaged_header_is_refused_naming_what_is_wrong() {
        let mut value = vec![0u8; HEADER];
        value[..4].copy_from_slice(b"FBX\x02");
        assert!(matches!(Header::read(&value), Err(StateError::Damaged(_))));
        value[4..8].copy_from_slice(&(HEADER as u32).to_le_bytes());
        let e = Header::read(&value).unwrap_err().to_string();
        assert!(e.contains("policy") && e.contains("delete the key"), "{e}");
        assert!(matches!(
            decode_v1(b"FBX\x01not json"),
            Err(StateError::Damaged(_))
        ));
    }
}

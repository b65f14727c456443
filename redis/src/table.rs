//! A key's live tickets kept in place in its value: an open-addressing
//! hash table of fixed-size slots by ticket id, and a 4-ary min-heap of
//! `(lease end, grant number, id)` entries (lease ends at one instant are
//! settled in grant order, T2). A step on a key with a thousand live tickets
//! reads and writes the few slots and heap entries it touches (a lookup, an
//! insert or a removal is O(1) in the slots, a lease pushed O(log n) in the
//! heap), not the whole table, and records which bytes it wrote so that
//! only those are replicated.
//!
//! The heap holds its entries by value, so a sift compares entries next to
//! each other in the heap and reads no slot; and its removals are lazy: a
//! ticket removed, or whose lease moved, leaves its old entry behind, and
//! an entry is dropped when it reaches the top and no live ticket matches
//! it (the top always names a live ticket after a step). When the heap is
//! full of such entries it is laid out again from the slots.
//!
//! Layout of a table of `cap` slots (a power of two, at least
//! [`MIN_CAP`]) at offset `base` of the value, little-endian:
//!
//! ```text
//! base                 cap slots of SLOT bytes:
//!                        0  id, high 64 bits      8  id, low 64 bits
//!                       16  lease end (ms)       24  epoch
//!                       32  permits (u32)        36  its caller (u32, Q1)
//!                       40  flags (u8: 1 in use, 2 the probe, 4 holds permits,
//!                           8 settles a reported cost, 16 a shadow ticket,
//!                           32 counted as slow, S2)
//!                       41  when its permits were taken (ms, 7 bytes: u56)
//!                       48  its grant number (u64, T2)
//! base + cap * SLOT     the heap's length (u32), 4 bytes of zeros,
//!                       the next grant number (u64)
//!        + 16           cap heap entries of HEAP_ENTRY bytes:
//!                        0  lease end (ms)        8  grant number
//!                       16  id, high 64 bits     24  id, low 64 bits
//!                       the first `length` in heap order, the rest unused
//! ```
//!
//! Encodings 3 to 7 had slots of 48 bytes (no grant number), a heap of
//! `(lease end, id)` entries of 24 bytes after an 8-byte length:
//! [`tickets_v7`] reads their tickets (all granted together, grant number
//! 0, so that ties settle by id as they did), and the next step writes the
//! key in the layout above.
//!
//! Encodings 3 to 5 wrote zeros at byte 36: their tickets read as acquired
//! by the caller whose fingerprint is 0.
//!
//! Encoding 3 wrote zeros at byte 41 and never flag 8: its tickets read as
//! taken at 0 and settle no cost (U1).
//!
//! Encoding 2 had the same slots (bytes 36..40 the slot's place in the
//! heap) and a heap of 4-byte slot numbers; [`tickets_v2`] reads its
//! tickets, and the next step writes the key in the layout above.
//!
//! The table never panics on damaged bytes: every read is bounds-checked
//! and a damaged slot reads as empty (the value's header was checked when
//! it was loaded; this only keeps a bad value from taking Redis down).

use fusebox_domain::{CallerId, Millis, Ticket, TicketId, TicketTable};

/// Bytes of one slot.
pub const SLOT: usize = 56;

/// Bytes of one heap entry.
pub const HEAP_ENTRY: usize = 32;

/// Bytes before the heap's entries: its length and the next grant number.
const HEAP_HEAD: usize = 16;

/// Bytes of one slot in encodings 2 to 7.
const SLOT_V7: usize = 48;

/// Children of a heap entry.
const ARITY: usize = 4;

/// Bytes a table of `cap` slots takes.
pub const fn section_len(cap: usize) -> usize {
    if cap == 0 {
        0
    } else {
        cap * (SLOT + HEAP_ENTRY) + HEAP_HEAD
    }
}

/// Bytes a table of `cap` slots took in encoding 2.
pub const fn section_len_v2(cap: usize) -> usize {
    cap * (SLOT_V7 + 4)
}

/// Bytes a table of `cap` slots took in encodings 3 to 7.
pub const fn section_len_v7(cap: usize) -> usize {
    if cap == 0 {
        0
    } else {
        cap * (SLOT_V7 + 24) + 8
    }
}

/// The fewest slots a table has (a key with one ticket).
pub const MIN_CAP: usize = 4;

/// The most slots a table may have: 2^24 (16 million live tickets on one
/// key is far past any cap the servers set).
pub const MAX_CAP: usize = 1 << 24;

const IN_USE: u8 = 1;
const PROBE: u8 = 2;
const HOLDS: u8 = 4;
const SETTLES: u8 = 8;
/// A shadow ticket (D2); never set before encoding 6.
const SHADOW: u8 = 16;
/// Counted in the statistics' `slow` (S2); never set before encoding 8.
const SLOW_COUNTED: u8 = 32;

/// The most a slot's 7 bytes of `granted_at` hold (2^56 - 1 ms, two
/// million years).
const GRANTED_AT_MAX: u64 = (1 << 56) - 1;

/// The slots a table of `len` tickets is given when it is made or rebuilt:
/// a load of at most one half.
pub fn cap_for(len: usize) -> usize {
    (len * 2).next_power_of_two().clamp(MIN_CAP, MAX_CAP)
}

/// The bytes a table lives in: the value of a Redis key (written through
/// DMA) or, in tests, a vector.
pub trait Bytes {
    /// The value's bytes.
    fn bytes(&self) -> &[u8];
    /// The value's bytes, to write.
    fn bytes_mut(&mut self) -> &mut [u8];
    /// Makes the value at least `len` bytes long, the new bytes zero.
    fn grow_to(&mut self, len: usize);
}

impl Bytes for Vec<u8> {
    fn bytes(&self) -> &[u8] {
        self
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        self
    }
    fn grow_to(&mut self, len: usize) {
        if self.len() < len {
            self.resize(len, 0);
        }
    }
}

/// Byte ranges of the value a step wrote, `(start, end)`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Dirty(Vec<(usize, usize)>);

impl Dirty {
    /// Notes that `len` bytes at `at` were written.
    pub fn mark(&mut self, at: usize, len: usize) {
        if len == 0 {
            return;
        }
        if let Some(last) = self.0.last_mut() {
            // The common case: the same slot, or the next bytes.
            if at >= last.0 && at <= last.1 {
                last.1 = last.1.max(at + len);
                return;
            }
        }
        self.0.push((at, at + len));
    }

    /// The ranges, sorted and merged where they touch.
    pub fn ranges(mut self) -> Vec<(usize, usize)> {
        self.0.sort_unstable();
        let mut merged: Vec<(usize, usize)> = Vec::with_capacity(self.0.len());
        for (start, end) in self.0 {
            match merged.last_mut() {
                Some(last) if start <= last.1 => last.1 = last.1.max(end),
                _ => merged.push((start, end)),
            }
        }
        merged
    }

    /// Every range of `other` too.
    pub fn extend(&mut self, other: Dirty) {
        self.0.extend(other.0);
    }
}

/// The little-endian `u64` at `at` of `b`; 0 past its end.
#[inline]
pub(crate) fn u64_at(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

/// The little-endian `u32` at `at` of `b`; 0 past its end.
#[inline]
pub(crate) fn u32_at(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u32::from_le_bytes)
}

fn write(b: &mut [u8], at: usize, bytes: &[u8]) {
    if let Some(s) = b.get_mut(at..at + bytes.len()) {
        s.copy_from_slice(bytes);
    }
}

/// One slot, read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Slot {
    id: u128,
    ticket: Ticket,
}

/// The slot at `at` of `b`; `None` when it is not in use.
fn slot_at(b: &[u8], at: usize) -> Option<Slot> {
    let flags = b.get(at + 40).copied().unwrap_or(0);
    (flags & IN_USE != 0).then(|| Slot {
        id: (u128::from(u64_at(b, at)) << 64) | u128::from(u64_at(b, at + 8)),
        ticket: Ticket {
            lease_end: u64_at(b, at + 16),
            epoch: u64_at(b, at + 24),
            permits: u32_at(b, at + 32),
            caller: CallerId(u32_at(b, at + 36)),
            probe: flags & PROBE != 0,
            holds: flags & HOLDS != 0,
            granted_at: u64_at(b, at + 40) >> 8,
            settles: flags & SETTLES != 0,
            shadow: flags & SHADOW != 0,
            slow_counted: flags & SLOW_COUNTED != 0,
            // Read as 0 from a slot of encodings 2 to 7 (48 bytes): never
            // past its end, since the caller reads those with `SLOT_V7`.
            seq: 0,
        },
    })
}

/// The slot at `at` of `b` in this layout, its grant number read too.
fn slot_with_seq(b: &[u8], at: usize) -> Option<Slot> {
    slot_at(b, at).map(|mut s| {
        s.ticket.seq = u64_at(b, at + 48);
        s
    })
}

/// The tickets of a table of `cap` slots at `base` of `bytes` as
/// encodings 3 to 7 laid it out (slots of 48 bytes; the heap is not
/// read): all with grant number 0.
pub fn tickets_v7(bytes: &[u8], base: usize, cap: usize) -> Vec<(TicketId, Ticket)> {
    (0..cap)
        .filter_map(|i| slot_at(bytes, base + i * SLOT_V7))
        .map(|s| (TicketId(s.id), s.ticket))
        .collect()
}

/// The tickets of a table of `cap` slots at `base` of `bytes` as encoding
/// 2 laid it out (its slots are encoding 7's, its heap is not read).
pub fn tickets_v2(bytes: &[u8], base: usize, cap: usize) -> Vec<(TicketId, Ticket)> {
    (0..cap)
        .filter_map(|i| slot_at(bytes, base + i * SLOT_V7))
        // Bytes 36..40 held the slot's place in the heap, not a caller.
        .map(|s| {
            let mut ticket = s.ticket;
            ticket.caller = CallerId(0);
            (TicketId(s.id), ticket)
        })
        .collect()
}

/// A heap entry: `(lease end, grant number, id)`, ordered as the engine
/// orders leases (T2).
type Entry = (Millis, u64, u128);

/// A table of live tickets in place in `B` (see the module documentation).
#[derive(Debug)]
pub struct Table<B> {
    bytes: B,
    base: usize,
    cap: usize,
    len: usize,
    heap_len: usize,
    probe: Option<TicketId>,
    dirty: Dirty,
}

impl<B: Bytes> Table<B> {
    /// The table of `cap` slots holding `len` tickets at `base` of `bytes`,
    /// `probe` the ticket flagged as the probe. `None` when the layout
    /// cannot be a table (a damaged value): `cap` not a power of two in
    /// range, `len` above half of it, or the section past the value's end.
    pub fn open(
        bytes: B,
        base: usize,
        cap: usize,
        len: usize,
        probe: Option<TicketId>,
    ) -> Option<Table<B>> {
        let fits = base
            .checked_add(section_len(cap))
            .is_some_and(|end| end <= bytes.bytes().len());
        let shaped = cap.is_power_of_two() && (MIN_CAP..=MAX_CAP).contains(&cap) && len * 2 <= cap;
        if !(fits && shaped) {
            return None;
        }
        let heap_len = u32_at(bytes.bytes(), base + cap * SLOT) as usize;
        let mut table = Table {
            bytes,
            base,
            cap,
            len,
            heap_len,
            probe,
            dirty: Dirty::default(),
        };
        // A heap too long for its room, or shorter than the tickets, is
        // damaged: it is laid out again from the slots.
        if heap_len > cap || heap_len < len {
            table.rebuild_heap();
        }
        Some(table)
    }

    /// A new table of `cap` slots at `base` of `bytes` (grown as needed),
    /// holding `tickets`.
    pub fn build(bytes: B, base: usize, cap: usize, tickets: &[(TicketId, Ticket)]) -> Table<B> {
        let mut table = Table {
            bytes,
            base,
            cap: 0,
            len: 0,
            heap_len: 0,
            probe: None,
            dirty: Dirty::default(),
        };
        table.lay_out(cap, tickets);
        table
    }

    /// The slots.
    pub fn cap(&self) -> usize {
        self.cap
    }

    /// The ticket flagged as the probe.
    pub fn probe(&self) -> Option<TicketId> {
        self.probe
    }

    /// The bytes, the ranges written since the table was opened.
    pub fn finish(self) -> (B, Dirty) {
        (self.bytes, self.dirty)
    }

    /// Every ticket, read from the slots.
    pub fn tickets(&self) -> Vec<(TicketId, Ticket)> {
        let mut all = Vec::with_capacity(self.len);
        self.for_each(&mut |id, t| all.push((id, t)));
        all
    }

    /// Lays the table out afresh with `cap` slots holding `tickets`: the
    /// value grows to hold it (what followed the old table is the caller's
    /// to write again), and the whole section is written.
    pub fn lay_out(&mut self, cap: usize, tickets: &[(TicketId, Ticket)]) {
        // Grant numbers keep growing through a new layout (T2).
        let next = self.next();
        let cap = cap.max(cap_for(tickets.len()));
        let end = self.base + section_len(cap);
        self.bytes.grow_to(end);
        if let Some(section) = self.bytes.bytes_mut().get_mut(self.base..end) {
            section.fill(0);
        }
        self.dirty.mark(self.base, section_len(cap));
        self.cap = cap;
        self.len = 0;
        self.heap_len = 0;
        self.probe = None;
        for &(id, ticket) in tickets {
            self.insert(id, ticket);
        }
        self.raise_next_seq(next);
    }

    fn slot_at(&self, i: usize) -> usize {
        self.base + i * SLOT
    }

    fn heap_head(&self) -> usize {
        self.base + self.cap * SLOT
    }

    fn heap_at(&self, pos: usize) -> usize {
        self.heap_head() + HEAP_HEAD + pos * HEAP_ENTRY
    }

    fn in_use(&self, i: usize) -> bool {
        self.bytes
            .bytes()
            .get(self.slot_at(i) + 40)
            .is_some_and(|f| f & IN_USE != 0)
    }

    fn read(&self, i: usize) -> Option<Slot> {
        slot_with_seq(self.bytes.bytes(), self.slot_at(i))
    }

    fn put(&mut self, i: usize, s: &Slot) {
        let at = self.slot_at(i);
        let mut raw = [0u8; SLOT];
        raw[0..8].copy_from_slice(&((s.id >> 64) as u64).to_le_bytes());
        raw[8..16].copy_from_slice(&(s.id as u64).to_le_bytes());
        raw[16..24].copy_from_slice(&s.ticket.lease_end.to_le_bytes());
        raw[24..32].copy_from_slice(&s.ticket.epoch.to_le_bytes());
        raw[32..36].copy_from_slice(&s.ticket.permits.to_le_bytes());
        raw[36..40].copy_from_slice(&s.ticket.caller.0.to_le_bytes());
        let granted_at = s.ticket.granted_at.min(GRANTED_AT_MAX);
        raw[40..48].copy_from_slice(&(granted_at << 8).to_le_bytes());
        raw[40] = IN_USE
            | if s.ticket.probe { PROBE } else { 0 }
            | if s.ticket.holds { HOLDS } else { 0 }
            | if s.ticket.settles { SETTLES } else { 0 }
            | if s.ticket.shadow { SHADOW } else { 0 }
            | if s.ticket.slow_counted {
                SLOW_COUNTED
            } else {
                0
            };
        raw[48..56].copy_from_slice(&s.ticket.seq.to_le_bytes());
        write(self.bytes.bytes_mut(), at, &raw);
        self.dirty.mark(at, SLOT);
    }

    fn clear(&mut self, i: usize) {
        let at = self.slot_at(i);
        write(self.bytes.bytes_mut(), at, &[0u8; SLOT]);
        self.dirty.mark(at, SLOT);
    }

    fn home(&self, id: u128) -> usize {
        let mixed = ((id as u64) ^ ((id >> 64) as u64)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        (mixed >> (64 - self.cap.trailing_zeros())) as usize
    }

    fn find(&self, id: TicketId) -> Option<usize> {
        if self.cap == 0 {
            return None;
        }
        let mut i = self.home(id.0);
        for _ in 0..self.cap {
            match self.read(i) {
                None => return None,
                Some(s) if s.id == id.0 => return Some(i),
                Some(_) => i = (i + 1) & (self.cap - 1),
            }
        }
        None
    }

    /// The heap entry at `pos`.
    fn entry(&self, pos: usize) -> Entry {
        let (b, at) = (self.bytes.bytes(), self.heap_at(pos));
        let id = (u128::from(u64_at(b, at + 16)) << 64) | u128::from(u64_at(b, at + 24));
        (u64_at(b, at), u64_at(b, at + 8), id)
    }

    fn set_entry(&mut self, pos: usize, (lease_end, seq, id): Entry) {
        let at = self.heap_at(pos);
        let mut raw = [0u8; HEAP_ENTRY];
        raw[0..8].copy_from_slice(&lease_end.to_le_bytes());
        raw[8..16].copy_from_slice(&seq.to_le_bytes());
        raw[16..24].copy_from_slice(&((id >> 64) as u64).to_le_bytes());
        raw[24..32].copy_from_slice(&(id as u64).to_le_bytes());
        write(self.bytes.bytes_mut(), at, &raw);
        self.dirty.mark(at, HEAP_ENTRY);
    }

    fn set_heap_len(&mut self, len: usize) {
        self.heap_len = len;
        let at = self.heap_head();
        write(self.bytes.bytes_mut(), at, &(len as u32).to_le_bytes());
        self.dirty.mark(at, 4);
    }

    /// The next grant number, kept after the heap's length.
    fn next(&self) -> u64 {
        if self.cap == 0 {
            return 0;
        }
        u64_at(self.bytes.bytes(), self.heap_head() + 8)
    }

    fn set_next(&mut self, next: u64) {
        let at = self.heap_head() + 8;
        write(self.bytes.bytes_mut(), at, &next.to_le_bytes());
        self.dirty.mark(at, 8);
    }

    /// True when `entry` is a live ticket's lease.
    fn live(&self, (lease_end, seq, id): Entry) -> bool {
        // The grant number too: a ticket removed and an id given again
        // with the same lease end is another grant, in another place.
        self.find(TicketId(id))
            .and_then(|i| self.read(i))
            .is_some_and(|s| (s.ticket.lease_end, s.ticket.seq) == (lease_end, seq))
    }

    /// Adds `entry` to the heap: sifted up from the end, each parent it
    /// passes moved down once. A full heap is laid out again from the
    /// slots instead (which hold the entry's ticket already).
    fn push(&mut self, entry: Entry) {
        if self.heap_len >= self.cap {
            self.rebuild_heap();
            return;
        }
        let mut pos = self.heap_len;
        self.set_heap_len(pos + 1);
        while pos > 0 {
            let parent = (pos - 1) / ARITY;
            let above = self.entry(parent);
            if above <= entry {
                break;
            }
            self.set_entry(pos, above);
            pos = parent;
        }
        self.set_entry(pos, entry);
    }

    /// Drops the top entry: the last one takes its place and sifts down.
    fn pop(&mut self) {
        let Some(last) = self.heap_len.checked_sub(1) else {
            return;
        };
        let entry = self.entry(last);
        self.set_heap_len(last);
        if last == 0 {
            return;
        }
        let mut pos = 0;
        loop {
            let first = ARITY * pos + 1;
            if first >= last {
                break;
            }
            let (child, least) = (first..(first + ARITY).min(last))
                .map(|c| (c, self.entry(c)))
                .min_by_key(|&(_, e)| e)
                .expect("a child");
            if least >= entry {
                break;
            }
            self.set_entry(pos, least);
            pos = child;
        }
        self.set_entry(pos, entry);
    }

    /// Drops `entry` if it is the top, then the entries at the top that
    /// no live ticket matches, so that the top is the first live lease.
    /// Only a heap longer than the tickets can hold such entries: one
    /// without them is not searched.
    fn settle_top(&mut self, entry: Entry) {
        if self.heap_len > 0 && self.entry(0) == entry {
            self.pop();
        }
        while self.heap_len > self.len && !self.live(self.entry(0)) {
            self.pop();
        }
    }

    /// Lays the heap out again from the slots: their leases in order (a
    /// sorted array is a heap).
    fn rebuild_heap(&mut self) {
        let mut entries: Vec<Entry> = Vec::with_capacity(self.len);
        self.for_each(&mut |id, t| entries.push((t.lease_end, t.seq, id.0)));
        entries.sort_unstable();
        entries.truncate(self.cap);
        for (pos, &entry) in entries.iter().enumerate() {
            self.set_entry(pos, entry);
        }
        self.set_heap_len(entries.len());
    }

    /// Empties slot `i`, moving the slots after it back where their
    /// probing allows (backward-shift deletion keeps every lookup's run
    /// unbroken without tombstones).
    fn vacate(&mut self, mut i: usize) {
        let mask = self.cap - 1;
        let mut j = (i + 1) & mask;
        for _ in 0..self.cap {
            let Some(s) = self.read(j) else {
                break;
            };
            let home = self.home(s.id);
            // Slot j may move back to i when its home is not in (i, j].
            let between = if i <= j {
                i < home && home <= j
            } else {
                i < home || home <= j
            };
            if !between {
                self.put(i, &s);
                i = j;
            }
            j = (j + 1) & mask;
        }
        self.clear(i);
    }

    fn grow(&mut self) {
        let tickets = self.tickets();
        self.lay_out(self.cap * 2, &tickets);
    }
}

impl<B: Bytes + Default> Default for Table<B> {
    fn default() -> Self {
        Table {
            bytes: B::default(),
            base: 0,
            cap: 0,
            len: 0,
            heap_len: 0,
            probe: None,
            dirty: Dirty::default(),
        }
    }
}

/// The [`TicketTable`] operations, for tables in any bytes.
impl<B: Bytes> Table<B> {
    /// How many tickets are live.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no ticket is live.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A live ticket.
    pub fn get(&self, id: TicketId) -> Option<Ticket> {
        self.find(id).and_then(|i| self.read(i)).map(|s| s.ticket)
    }

    /// Adds a ticket whose id is not live; a probe takes the flag (B2).
    pub fn insert(&mut self, id: TicketId, ticket: Ticket) {
        if ticket.probe {
            if let Some(i) = self.probe.take().and_then(|p| self.find(p)) {
                if let Some(mut s) = self.read(i) {
                    s.ticket.probe = false;
                    self.put(i, &s);
                }
            }
        }
        if (self.len + 1) * 2 > self.cap {
            if self.cap == 0 {
                self.lay_out(MIN_CAP, &[]);
            } else if self.cap < MAX_CAP {
                self.grow();
            } else {
                return;
            }
        }
        let mut i = self.home(id.0);
        let mut tries = 0;
        while self.in_use(i) {
            i = (i + 1) & (self.cap - 1);
            tries += 1;
            if tries == self.cap {
                // Only damaged bytes flag more slots than the header counts.
                return;
            }
        }
        self.put(i, &Slot { id: id.0, ticket });
        self.len += 1;
        if ticket.seq >= self.next() {
            self.set_next(ticket.seq.saturating_add(1));
        }
        self.push((ticket.lease_end, ticket.seq, id.0));
        if ticket.probe {
            self.probe = Some(id);
        }
    }

    /// Removes a live ticket.
    pub fn remove(&mut self, id: TicketId) -> Option<Ticket> {
        let Some((i, s)) = self.find(id).and_then(|i| Some((i, self.read(i)?))) else {
            // Only a damaged heap names a ticket that is not live: its top
            // is dropped, so that expiring the first lease goes on.
            if self.heap_len > 0 && self.entry(0).2 == id.0 {
                self.pop();
            }
            return None;
        };
        self.vacate(i);
        self.len = self.len.saturating_sub(1);
        if self.len == 0 {
            // As the engine's table: numbers start again once none is live.
            self.set_next(0);
        }
        self.settle_top((s.ticket.lease_end, s.ticket.seq, id.0));
        if self.probe == Some(id) {
            self.probe = None;
        }
        Some(s.ticket)
    }

    /// The smallest `(lease end, grant number, id)`.
    pub fn first_lease(&self) -> Option<(Millis, TicketId)> {
        if self.len == 0 || self.heap_len == 0 {
            return None;
        }
        let (end, _, id) = self.entry(0);
        Some((end, TicketId(id)))
    }

    /// The grant number the next ticket takes (T2).
    pub fn next_seq(&self) -> u64 {
        self.next()
    }

    /// Raises the next grant number to `next` (a table laid out anew from
    /// another's tickets keeps that one's numbering).
    pub fn raise_next_seq(&mut self, next: u64) {
        if self.cap > 0 && next > self.next() {
            self.set_next(next);
        }
    }

    /// Moves a live ticket's lease end.
    pub fn set_lease_end(&mut self, id: TicketId, lease_end: Millis) {
        let Some((i, mut s)) = self.find(id).and_then(|i| Some((i, self.read(i)?))) else {
            return;
        };
        let old = s.ticket.lease_end;
        if old == lease_end {
            return;
        }
        s.ticket.lease_end = lease_end;
        self.put(i, &s);
        self.push((lease_end, s.ticket.seq, id.0));
        self.settle_top((old, s.ticket.seq, id.0));
    }

    /// Notes that a live ticket was counted as slow.
    pub fn mark_slow_counted(&mut self, id: TicketId) {
        if let Some((i, mut s)) = self.find(id).and_then(|i| Some((i, self.read(i)?))) {
            if !s.ticket.slow_counted {
                s.ticket.slow_counted = true;
                self.put(i, &s);
            }
        }
    }

    /// Marks every ticket's permits as neither to be returned nor settled.
    pub fn forget_holds(&mut self) {
        for i in 0..self.cap {
            if let Some(mut s) = self.read(i).filter(|s| s.ticket.holds || s.ticket.settles) {
                s.ticket.forget();
                self.put(i, &s);
            }
        }
    }

    /// Calls `visit` with every live ticket.
    pub fn for_each(&self, visit: &mut dyn FnMut(TicketId, Ticket)) {
        for s in (0..self.cap).filter_map(|i| self.read(i)) {
            visit(TicketId(s.id), s.ticket);
        }
    }
}

impl<B: Bytes + Default> TicketTable for Table<B> {
    fn len(&self) -> usize {
        Table::len(self)
    }
    fn get(&self, id: TicketId) -> Option<Ticket> {
        Table::get(self, id)
    }
    fn insert(&mut self, id: TicketId, ticket: Ticket) {
        Table::insert(self, id, ticket);
    }
    fn next_seq(&self) -> u64 {
        Table::next_seq(self)
    }
    fn remove(&mut self, id: TicketId) -> Option<Ticket> {
        Table::remove(self, id)
    }
    fn first_lease(&self) -> Option<(Millis, TicketId)> {
        Table::first_lease(self)
    }
    fn set_lease_end(&mut self, id: TicketId, lease_end: Millis) {
        Table::set_lease_end(self, id, lease_end);
    }
    fn mark_slow_counted(&mut self, id: TicketId) {
        Table::mark_slow_counted(self, id);
    }
    fn forget_holds(&mut self) {
        Table::forget_holds(self);
    }
    fn for_each(&self, visit: &mut dyn FnMut(TicketId, Ticket)) {
        Table::for_each(self, visit);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use fusebox_domain::Tickets;
    use proptest::prelude::*;

    use super::*;

    #[derive(Clone, Debug)]
    enum Op {
        Insert(u16, Millis, bool),
        Remove(u16),
        Renew(u16, Millis),
        SettleFirst,
        Reopen,
    }

    fn op() -> impl Strategy<Value = Op> {
        // Ids from a few dozen, so that removals, renewals and ids used
        // again (their old heap entries still there) are common.
        prop_oneof![
            6 => (0u16..80, 0u64..40, proptest::bool::weighted(0.1))
                .prop_map(|(id, end, probe)| Op::Insert(id, end, probe)),
            3 => (0u16..80).prop_map(Op::Remove),
            2 => (0u16..80, 0u64..40).prop_map(|(id, end)| Op::Renew(id, end)),
            2 => Just(Op::SettleFirst),
            1 => Just(Op::Reopen),
        ]
    }

    /// Ids that share low bits, so that probing runs wrap and collide.
    fn ticket_id(n: u16) -> TicketId {
        TicketId((u128::from(n % 5) << 64) | u128::from(n % 97) << 3 | u128::from(n))
    }

    fn ticket(n: u16, lease_end: Millis, probe: bool) -> Ticket {
        Ticket {
            // Grant numbers against id order; the model tests give their own.
            seq: u64::from(1000 - n),
            slow_counted: n.is_multiple_of(7),
            caller: Default::default(),
            epoch: u64::from(n) * 3,
            permits: u32::from(n % 7),
            probe,
            lease_end,
            holds: n.is_multiple_of(2),
            // Times up to the 7 bytes' limit, so the flag byte is kept apart.
            granted_at: (u64::from(n) * 0x0123_4567_89ab) & ((1 << 56) - 1),
            settles: n.is_multiple_of(3) && !n.is_multiple_of(2),
            shadow: n.is_multiple_of(5) && !n.is_multiple_of(6) && !probe,
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// The table in bytes behaves as the engine's table, through
        /// growth, removals that shift slots back, and reopening from the
        /// bytes alone; the heap always names the smallest lease.
        #[test]
        fn the_table_in_place_behaves_as_the_engines_table(
            prefix in 0usize..50,
            ops in proptest::collection::vec(op(), 1..300),
        ) {
            let mut table = Table::build(vec![7u8; prefix], prefix, MIN_CAP, &[]);
            let mut model = Tickets::default();
            let mut ids = BTreeMap::new();
            for op in ops {
                match op {
                    Op::Insert(n, end, probe) => {
                        let id = ticket_id(n);
                        if model.contains(id) {
                            continue;
                        }
                        ids.insert(id, n);
                        prop_assert_eq!(table.next_seq(), model.next_seq());
                        let ticket = Ticket { seq: model.next_seq(), ..ticket(n, end, probe) };
                        model.insert(id, ticket);
                        table.insert(id, ticket);
                    }
                    Op::Remove(n) => {
                        prop_assert_eq!(table.remove(ticket_id(n)), model.remove(ticket_id(n)));
                    }
                    Op::Renew(n, end) => {
                        model.set_lease_end(ticket_id(n), end);
                        table.set_lease_end(ticket_id(n), end);
                    }
                    Op::SettleFirst => {
                        let first = model.first_lease();
                        prop_assert_eq!(table.first_lease(), first);
                        if let Some((_, id)) = first {
                            prop_assert_eq!(table.remove(id), model.remove(id));
                        }
                    }
                    Op::Reopen => {
                        let (cap, len, probe) = (table.cap, table.len, table.probe);
                        let (bytes, _) = table.finish();
                        prop_assert!(bytes[..prefix].iter().all(|&b| b == 7), "bytes before the table kept");
                        table = Table::open(bytes, prefix, cap, len, probe).expect("reopens");
                    }
                }
                prop_assert_eq!(table.len(), model.len());
                prop_assert_eq!(table.first_lease(), model.first_lease());
                prop_assert_eq!(fusebox_domain::sorted_tickets(&table), fusebox_domain::sorted_tickets(&model));
                let probes = table.tickets().iter().filter(|(_, t)| t.probe).count();
                prop_assert!(probes <= 1);
                prop_assert_eq!(table.probe().is_some(), probes == 1);
            }
        }
    }

    /// Leases moved again and again leave old entries behind; the heap is
    /// laid out again before it outgrows its room, and its top stays the
    /// first live lease.
    #[test]
    fn a_heap_of_old_entries_is_laid_out_again_within_its_room() {
        let mut table = Table::build(Vec::new(), 0, MIN_CAP, &[]);
        table.insert(TicketId(1), ticket(1, 1_000, false));
        table.insert(TicketId(2), ticket(2, 2_000, false));
        let mut rebuilt = 0;
        for n in 0..100u64 {
            let before = table.heap_len;
            table.set_lease_end(TicketId(2), 3_000 + n);
            assert!(
                table.heap_len <= table.cap,
                "{} entries in {} slots",
                table.heap_len,
                table.cap
            );
            if table.heap_len < before {
                rebuilt += 1;
            }
            assert_eq!(table.first_lease(), Some((1_000, TicketId(1))));
        }
        assert!(rebuilt > 10, "laid out again {rebuilt} times");
        table.remove(TicketId(1));
        assert_eq!(table.first_lease(), Some((3_099, TicketId(2))));
        assert_eq!(
            table.heap_len, 1,
            "the old entries of ticket 2 are dropped at the top"
        );
    }

    #[test]
    fn the_dirty_ranges_are_what_changed() {
        let mut table = Table::build(vec![0u8; 16], 16, MIN_CAP, &[]);
        for n in 0..2 {
            table.insert(TicketId(n), ticket(n as u16, 100 + n as u64, false));
        }
        let (before, _) = table.finish();
        let mut table = Table::open(before.clone(), 16, MIN_CAP, 2, None).unwrap();
        table.insert(TicketId(9), ticket(9, 50, false));
        let (after, dirty) = table.finish();
        let ranges = dirty.ranges();
        let mut patched = before.clone();
        patched.resize(after.len(), 0);
        for (start, end) in &ranges {
            patched[*start..*end].copy_from_slice(&after[*start..*end]);
        }
        assert_eq!(
            patched, after,
            "applying the dirty ranges gives the new bytes"
        );
        let written: usize = ranges.iter().map(|(s, e)| e - s).sum();
        assert!(
            written < after.len(),
            "only part of the table is written: {written} of {}",
            after.len()
        );
    }

    #[test]
    fn a_damaged_layout_is_not_opened_and_damaged_slots_do_not_panic() {
        assert!(Table::open(vec![0u8; 10], 0, MIN_CAP, 0, None).is_none());
        assert!(Table::open(vec![0u8; 1000], 0, 6, 0, None).is_none());
        assert!(Table::open(vec![0u8; 1000], 0, MIN_CAP, 3, None).is_none());
        let mut bytes = vec![0xffu8; section_len(8)];
        bytes[40] = IN_USE;
        let mut table = Table::open(bytes, 0, 8, 4, None).unwrap();
        let _ = table.first_lease();
        let _ = table.remove(TicketId(u128::MAX));
        table.insert(TicketId(1), ticket(1, 5, true));
        table.set_lease_end(TicketId(1), 1);
        let _ = table.tickets();
    }
}

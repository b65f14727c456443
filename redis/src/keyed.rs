//! One step at one key: the value opened in place, the fuse built from its
//! header and tail around its ticket table, and the value written back:
//! the header and the tail whole, the table's changed slots in place. The
//! bytes written are replicated as one `FB.PATCH`, so a replica (and an
//! AOF replay) writes the same bytes without running the step again.
//!
//! A value of version 1 (JSON) is read whole, and one of versions 2 to 7
//! has its ticket table read whole; either is written back in the current
//! encoding.

use fusebox_domain::{
    Fuse, FuseError, FuseHead, Millis, Notice, Ticket, TicketId, TicketTable, Tickets,
};
use redis_module::key::{RedisKeyWritable, StringDMA};
use redis_module::{Context, KeyType, RedisError, RedisString};

use crate::clock::Now;
use crate::notices::{self, Note};
use crate::policy::{self, Known};
use crate::refusal::{err, fuse_err};
use crate::registry;
use crate::state::{self, Frame, Header, StateError, Summary, AT_REST, HEADER};
use crate::table::{self, Bytes, Dirty, Table};

/// How long a key at rest is kept before Redis forgets it (SPEC K2): the
/// embedded engine's default `idle_after`.
pub use fusebox_domain::IDLE_AFTER;

/// Spare bytes past the used end of a value before it is compacted.
const SLACK: usize = 256;

/// A Redis string, written in place.
pub struct RedisBytes<'k>(StringDMA<'k>);

impl Bytes for RedisBytes<'_> {
    fn bytes(&self) -> &[u8] {
        &self.0
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.0
    }
    fn grow_to(&mut self, len: usize) {
        let more = len.saturating_sub(self.0.len());
        if more > 0 {
            // A string key opened for writing always takes more bytes.
            let _ = self.0.append(&vec![0u8; more]);
        }
    }
}

/// A key's tickets during a step: the table in its value, or a table in
/// memory for a key whose value has none (or that the step emptied and
/// filled again).
#[derive(Debug)]
pub enum StepTickets<B> {
    /// In memory.
    Fresh(Tickets),
    /// In the value.
    Stored(Table<B>),
}

impl<B> Default for StepTickets<B> {
    fn default() -> Self {
        StepTickets::Fresh(Tickets::default())
    }
}

impl<B: Bytes> TicketTable for StepTickets<B> {
    fn len(&self) -> usize {
        match self {
            StepTickets::Fresh(t) => t.len(),
            StepTickets::Stored(t) => t.len(),
        }
    }
    fn get(&self, id: TicketId) -> Option<Ticket> {
        match self {
            StepTickets::Fresh(t) => t.get(id),
            StepTickets::Stored(t) => t.get(id),
        }
    }
    fn insert(&mut self, id: TicketId, ticket: Ticket) {
        match self {
            StepTickets::Fresh(t) => t.insert(id, ticket),
            StepTickets::Stored(t) => t.insert(id, ticket),
        }
    }
    fn remove(&mut self, id: TicketId) -> Option<Ticket> {
        match self {
            StepTickets::Fresh(t) => t.remove(id),
            StepTickets::Stored(t) => t.remove(id),
        }
    }
    fn next_seq(&self) -> u64 {
        match self {
            StepTickets::Fresh(t) => t.next_seq(),
            StepTickets::Stored(t) => t.next_seq(),
        }
    }
    fn first_lease(&self) -> Option<(Millis, TicketId)> {
        match self {
            StepTickets::Fresh(t) => t.first_lease(),
            StepTickets::Stored(t) => t.first_lease(),
        }
    }
    fn set_lease_end(&mut self, id: TicketId, lease_end: Millis) {
        match self {
            StepTickets::Fresh(t) => t.set_lease_end(id, lease_end),
            StepTickets::Stored(t) => t.set_lease_end(id, lease_end),
        }
    }
    fn mark_slow_counted(&mut self, id: TicketId) {
        match self {
            StepTickets::Fresh(t) => t.mark_slow_counted(id),
            StepTickets::Stored(t) => t.mark_slow_counted(id),
        }
    }
    fn forget_holds(&mut self) {
        match self {
            StepTickets::Fresh(t) => t.forget_holds(),
            StepTickets::Stored(t) => t.forget_holds(),
        }
    }
    fn for_each(&self, visit: &mut dyn FnMut(TicketId, Ticket)) {
        match self {
            StepTickets::Fresh(t) => t.for_each(visit),
            StepTickets::Stored(t) => t.for_each(visit),
        }
    }
}

/// The fuse of a step, its tickets in the value being written.
pub type StepFuse<'k> = Fuse<StepTickets<RedisBytes<'k>>>;

/// A fuse read from a copy of a value, for reads that change nothing.
pub type CopyFuse = Fuse<StepTickets<Vec<u8>>>;

/// A key opened for a step.
pub struct Opened<'k> {
    /// The fuse; the step runs on it.
    pub fuse: StepFuse<'k>,
    /// The policy the value was written under.
    pub policy: Known,
    /// The header of the value as it was (version 2 or 3), or `None` for a
    /// value of version 1.
    prior: Option<Header>,
    /// The value's bytes while the table does not hold them.
    spare: Option<RedisBytes<'k>>,
}

impl<'k> Opened<'k> {
    /// Runs the step under another policy from `now` on (Y4), when `to`
    /// is not the one the value holds.
    pub fn adopt(&mut self, to: Known, now: Millis) -> Result<(), RedisError> {
        if to.id == self.policy.id {
            return Ok(());
        }
        if to.policy.spec() != self.policy.policy.spec() {
            self.fuse
                .set_policy(to.policy.clone(), now)
                .map_err(|e| err(&e))?;
        }
        self.policy = to;
        Ok(())
    }
}

fn state_err(e: StateError) -> RedisError {
    err(&e)
}

/// A fuse of `head` (read from the value's header and tail), its tickets
/// the table at the header's place in `bytes`.
fn build<B: Bytes>(
    header: &Header,
    head: FuseHead,
    policy: &Known,
    bytes: B,
) -> Result<(Fuse<StepTickets<B>>, Option<B>), StateError> {
    let (tickets, spare) = if header.version < state::ENCODING_VERSION && header.table_cap > 0 {
        // An older encoding's table is read whole; the step writes the key
        // anew.
        let read = if header.version == 2 {
            table::tickets_v2
        } else {
            table::tickets_v7
        };
        let mut tickets = Tickets::default();
        for (id, ticket) in read(bytes.bytes(), header.table_at(), header.table_cap) {
            tickets.insert(id, ticket);
        }
        (StepTickets::Fresh(tickets), Some(bytes))
    } else if header.table_cap > 0 {
        let table = Table::open(
            bytes,
            header.table_at(),
            header.table_cap,
            header.tickets as usize,
            header.probe,
        )
        .ok_or_else(|| StateError::Damaged("tickets: the table does not fit".into()))?;
        (StepTickets::Stored(table), None)
    } else {
        (StepTickets::Fresh(Tickets::default()), Some(bytes))
    };
    let fuse = Fuse::from_head(policy.policy.clone(), head, tickets)
        .map_err(|e| StateError::Damaged(e.to_string()))?;
    Ok((fuse, spare))
}

fn known_of(header: &Header, value: &[u8]) -> Result<Known, StateError> {
    policy::of_value(&header.policy_id, header.policy_json(value)).map_err(StateError::Damaged)
}

/// A version-1 fuse as a step's fuse, its tickets in memory.
fn from_v1<B>(fuse: Fuse) -> Result<(Fuse<StepTickets<B>>, Known), StateError>
where
    B: Bytes,
{
    let json = serde_json::to_vec(&fuse.policy().spec())
        .map_err(|e| StateError::Damaged(e.to_string()))?;
    let known = policy::of_json(&json).map_err(StateError::Damaged)?;
    let head = fuse.head();
    let tickets = fuse.into_tickets().unwrap_or_default();
    let fuse = Fuse::from_head(known.policy.clone(), head, StepTickets::Fresh(tickets))
        .map_err(|e| StateError::Damaged(e.to_string()))?;
    Ok((fuse, known))
}

/// Checks that `name` is a valid fusebox key (SPEC K1).
pub fn check_key_name(name: &[u8]) -> Result<&str, RedisError> {
    let name = std::str::from_utf8(name)
        .map_err(|_| RedisError::Str("ERR key: must be UTF-8; send the key's UTF-8 bytes"))?;
    fusebox_domain::validate_key(name).map_err(|e| err(&e))?;
    Ok(name)
}

/// Opens `key` (named `name`) for a step: `None` when it is empty.
/// `expected`, the policy the step will run under, saves a look-up when
/// the value was written under it too.
///
/// The name is checked (SPEC K1) when the key is empty, that is before a
/// step makes it: a key that holds fusebox state was made by a step, so
/// its name passed then (decisions 90).
pub fn open<'k>(
    key: &'k RedisKeyWritable,
    name: &RedisString,
    expected: Option<&Known>,
) -> Result<Option<Opened<'k>>, RedisError> {
    match key.key_type() {
        KeyType::Empty => {
            check_key_name(name.as_slice())?;
            return Ok(None);
        }
        KeyType::String => {}
        _ => return Err(RedisError::WrongType),
    }
    let dma = key.as_string_dma()?;
    match state::version(&dma).map_err(state_err)? {
        1 => {
            let fuse = state::decode_v1(&dma).map_err(state_err)?;
            let (fuse, policy) = from_v1(fuse).map_err(state_err)?;
            Ok(Some(Opened {
                fuse,
                policy,
                prior: None,
                spare: Some(RedisBytes(dma)),
            }))
        }
        _ => {
            let header = Header::read(&dma).map_err(state_err)?;
            let policy = match expected.filter(|k| k.id == header.policy_id) {
                Some(known) => known.clone(),
                None => known_of(&header, &dma).map_err(state_err)?,
            };
            // The head is read before the table takes the bytes.
            let head = header.full_head(&dma).map_err(state_err)?;
            let (fuse, spare) =
                build(&header, head, &policy, RedisBytes(dma)).map_err(state_err)?;
            Ok(Some(Opened {
                fuse,
                policy,
                prior: Some(header),
                spare,
            }))
        }
    }
}

/// A fresh key under `policy`, made at `now`.
pub fn fresh<'k>(policy: Known, now: Millis) -> Opened<'k> {
    Opened {
        fuse: Fuse::new_in(policy.policy.clone(), now),
        policy,
        prior: None,
        spare: None,
    }
}

/// The time a step at `opened` runs at, refused when it is earlier than
/// the key's last (the clock is monotonic, SPEC T0).
pub fn time_at(when: Now, opened: Option<&Opened<'_>>) -> Result<Millis, RedisError> {
    let last = opened.map(|o| o.fuse.last_now());
    let now = when.resolve(last);
    if let Some(last) = last.filter(|&last| now < last) {
        return Err(fuse_err(FuseError::ClockWentBack { now, last }));
    }
    Ok(now)
}

/// The fuse a value holds, read on a copy (nothing is written): for
/// reads and listings.
pub fn read_copy(value: &[u8]) -> Result<CopyFuse, StateError> {
    match state::version(value)? {
        1 => Ok(from_v1(state::decode_v1(value)?)?.0),
        _ => {
            let header = Header::read(value)?;
            let policy = known_of(&header, value)?;
            let head = header.full_head(value)?;
            Ok(build(&header, head, &policy, value.to_vec())?.0)
        }
    }
}

/// The summary of the value `key` holds, without decoding it (a value of
/// version 1 is decoded); `None` for an empty key or one that holds no
/// fusebox state.
pub fn summary_of(ctx: &Context, name: &RedisString) -> Option<Summary> {
    let key = ctx.open_key(name);
    let value = key.read().ok()??;
    state::summary(value).ok()
}

/// Moves the notices out of `fuse`, until none are left.
pub fn drain<T: TicketTable>(fuse: &mut Fuse<T>) -> Vec<Notice> {
    let mut drained = Vec::new();
    loop {
        let before = drained.len();
        drained.extend(fuse.drain_notices());
        if drained.len() == before {
            return drained;
        }
    }
}

/// Stores the step at `key` (named `name`): drains the fuse's notices,
/// writes the value in place, sets or clears its expiry (K2), replicates
/// the bytes written as `FB.PATCH`, notes the key in the registry and
/// publishes the notices. Returns the notices.
pub fn store(
    ctx: &Context,
    key: &RedisKeyWritable,
    name: &RedisString,
    mut opened: Opened<'_>,
    now: Millis,
    note: &Note,
) -> Result<Vec<Notice>, RedisError> {
    let drained = drain(&mut opened.fuse);
    store_drained(ctx, key, name, opened, now, note, drained)
}

/// [`store`], for a step whose notices were drained already ([`drain`]).
pub fn store_drained(
    ctx: &Context,
    key: &RedisKeyWritable,
    name: &RedisString,
    mut opened: Opened<'_>,
    now: Millis,
    note: &Note,
    mut drained: Vec<Notice>,
) -> Result<Vec<Notice>, RedisError> {
    drained.extend(drain(&mut opened.fuse));
    let messages = notices::messages(ctx, name.as_slice(), &opened.fuse, now, &drained, note);
    let summary = Summary::of(&opened.fuse);
    let at_rest = opened.fuse.is_at_rest(now);
    let head = opened.fuse.head();
    let Opened {
        fuse,
        policy,
        prior,
        spare,
    } = opened;
    let tickets = fuse.into_tickets();
    let same_policy = prior.as_ref().is_some_and(|h| h.policy_id == policy.id);
    // A value of an older encoding is written whole in this one.
    let rewrite = prior
        .as_ref()
        .is_some_and(|h| h.version != state::ENCODING_VERSION);

    // The table as it ends up, and the bytes back from it.
    let mut dirty = Dirty::default();
    let mut whole = !same_policy || rewrite;
    let (mut bytes, table_cap, probe) = match tickets {
        Some(StepTickets::Stored(table)) if same_policy && !shrinks(&table) => {
            let (cap, probe) = (table.cap(), table.probe());
            let (bytes, written) = table.finish();
            dirty.extend(written);
            (bytes, cap, probe)
        }
        other => {
            let next_seq = other.as_ref().map_or(0, TicketTable::next_seq);
            let (list, bytes) = match other {
                Some(StepTickets::Stored(table)) => {
                    let list = table.tickets();
                    let (bytes, written) = table.finish();
                    // What the step wrote stays marked: past the new
                    // table and tail, those bytes are still in the value.
                    dirty.extend(written);
                    (list, bytes)
                }
                Some(StepTickets::Fresh(t)) => {
                    (fusebox_domain::sorted_tickets(&t), bytes_of(key, spare)?)
                }
                None => (Vec::new(), bytes_of(key, spare)?),
            };
            let mut bytes = bytes;
            if !same_policy {
                bytes.grow_to(HEADER + policy.json.len());
                let at = HEADER;
                bytes.bytes_mut()[at..at + policy.json.len()].copy_from_slice(&policy.json);
                dirty.mark(at, policy.json.len());
            }
            if list.is_empty() {
                // No table: the tail moves up, so the value is written whole.
                whole |= prior.as_ref().is_some_and(|h| h.table_cap > 0);
                (bytes, 0, None)
            } else {
                let table_at = HEADER + policy.json.len();
                let mut table = Table::build(bytes, table_at, table::cap_for(list.len()), &list);
                table.raise_next_seq(next_seq);
                let (cap, probe) = (table.cap(), table.probe());
                let (bytes, written) = table.finish();
                dirty.extend(written);
                (bytes, cap, probe)
            }
        }
    };

    let tail = state::encode_tail(&head);
    let tail_at = HEADER + policy.json.len() + table::section_len(table_cap);
    let used = tail_at + tail.len();
    bytes.grow_to(used);
    bytes.bytes_mut()[tail_at..used].copy_from_slice(&tail);
    dirty.mark(tail_at, tail.len());
    let frame = Frame {
        summary,
        at_rest,
        policy_len: policy.json.len(),
        policy_id: policy.id,
        table_cap,
        tail_len: tail.len(),
        probe,
    };
    bytes.bytes_mut()[..HEADER].copy_from_slice(&state::encode_header(&head, &frame));
    dirty.mark(0, HEADER);
    if bytes.bytes().len() > used + SLACK.max(used / 4) {
        let kept = bytes.bytes()[..used].to_vec();
        bytes.0.write(&kept)?;
        whole = true;
    }
    let len = bytes.bytes().len();
    let ranges = if whole {
        vec![(0, len)]
    } else {
        dirty.ranges()
    };
    let written: usize = ranges.iter().map(|(s, e)| e - s).sum();
    let ranges = if written * 2 > len {
        vec![(0, len)]
    } else {
        ranges
    };
    let blob = patch_of(bytes.bytes(), at_rest, &ranges);

    if at_rest {
        set_idle(key)?;
    }
    // The patch is binary: a string made from its bytes, not a C string.
    let blob = RedisString::create_from_slice(std::ptr::null_mut(), &blob);
    ctx.replicate("fb.patch", &[name, &blob][..]);
    // A key at rest until now may have an expiry: the settler clears it
    // soon after (it is minutes away), not on the request's path.
    let had_expiry = prior.as_ref().is_none_or(|h| h.flags & AT_REST != 0) && !at_rest;
    registry::note_expiry(
        name.as_slice(),
        Some(summary),
        had_expiry,
        crate::clock::wall_ms(),
    );
    notices::publish(ctx, messages);
    Ok(drained)
}

/// A table so empty for its size that it is laid out again, smaller. The
/// smallest table is kept when it empties, so that a key whose tickets
/// come and go one at a time does not lay one out at every step (a key at
/// rest that holds it is forgotten after [`IDLE_AFTER`] all the same).
fn shrinks<B: Bytes>(table: &Table<B>) -> bool {
    table.len() * 8 <= table.cap() && table.cap() > table::MIN_CAP
}

fn bytes_of<'k>(
    key: &'k RedisKeyWritable,
    spare: Option<RedisBytes<'k>>,
) -> Result<RedisBytes<'k>, RedisError> {
    match spare {
        Some(bytes) => Ok(bytes),
        None => Ok(RedisBytes(key.as_string_dma()?)),
    }
}

/// A key at rest is forgotten once it stays so for [`IDLE_AFTER`]
/// (Redis's own expiry, on the primary's clock, set again at every write
/// at rest). One that is not at rest keeps no expiry: the settler clears
/// it ([`crate::settler`]), and replicates that.
fn set_idle(key: &RedisKeyWritable) -> Result<(), RedisError> {
    key.set_expire(std::time::Duration::from_millis(IDLE_AFTER))?;
    Ok(())
}

/// The bytes of `FB.PATCH`'s patch: the value's length (u32), 1 when the
/// key is at rest, the number of ranges (u32), then each range's offset
/// and length (u32 each) and bytes. Little-endian.
fn patch_of(value: &[u8], at_rest: bool, ranges: &[(usize, usize)]) -> Vec<u8> {
    let written: usize = ranges.iter().map(|(s, e)| e - s).sum();
    let mut blob = Vec::with_capacity(9 + 8 * ranges.len() + written);
    blob.extend_from_slice(&(value.len() as u32).to_le_bytes());
    blob.push(u8::from(at_rest));
    blob.extend_from_slice(&(ranges.len() as u32).to_le_bytes());
    for &(start, end) in ranges {
        let end = end.min(value.len());
        let start = start.min(end);
        blob.extend_from_slice(&(start as u32).to_le_bytes());
        blob.extend_from_slice(&((end - start) as u32).to_le_bytes());
        blob.extend_from_slice(&value[start..end]);
    }
    blob
}

/// `FB.PATCH key patch`: what a primary's step wrote (`patch_of`),
/// applied by a replica (or an AOF replay): the value becomes the patch's
/// length (new bytes zero), each range is written, a key at rest gets its
/// idle expiry, and the registry notes the key. Only for replication: a
/// client's `FB.PATCH` is refused.
pub fn patch(ctx: &Context, args: Vec<RedisString>) -> redis_module::RedisResult {
    use redis_module::ContextFlags;
    let flags = ctx.get_flags();
    if !flags.intersects(ContextFlags::REPLICATED | ContextFlags::LOADING) {
        return Err(RedisError::Str(
            "ERR FB.PATCH is how a primary replicates fusebox state; it is not a command for clients",
        ));
    }
    if args.len() != 3 {
        return Err(RedisError::WrongArity);
    }
    let blob = args[2].as_slice();
    let bad =
        || RedisError::Str("ERR patch: damaged; the primary and this node run different modules?");
    let word = |at: usize| -> Result<usize, RedisError> {
        blob.get(at..at + 4)
            .and_then(|b| b.try_into().ok())
            .map(|b| u32::from_le_bytes(b) as usize)
            .ok_or_else(bad)
    };
    let len = word(0)?;
    let at_rest = *blob.get(4).ok_or_else(bad)? == 1;
    let ranges = word(5)?;
    let key = ctx.open_key_writable(&args[1]);
    {
        let mut dma = key.as_string_dma()?;
        if dma.len() < len {
            let more = len - dma.len();
            dma.append(&vec![0u8; more])?;
        } else if dma.len() > len {
            let kept = dma[..len].to_vec();
            dma.write(&kept)?;
        }
        let mut at = 9;
        for _ in 0..ranges {
            let (offset, n) = (word(at)?, word(at + 4)?);
            let bytes = blob.get(at + 8..at + 8 + n).ok_or_else(bad)?;
            let target = dma.get_mut(offset..offset + n).ok_or_else(bad)?;
            target.copy_from_slice(bytes);
            at += 8 + n;
        }
    }
    if at_rest {
        set_idle(&key)?;
    }
    let summary = key
        .as_string_dma()
        .ok()
        .and_then(|dma| state::summary(&dma).ok());
    registry::note(args[1].as_slice(), summary, crate::clock::wall_ms());
    Ok(redis_module::RedisValue::SimpleStringStatic("OK"))
}

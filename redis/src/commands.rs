//! The module's commands: each parses its arguments, opens the key, runs
//! one domain step and stores it ([`crate::keyed`]). Every command is
//! deterministic given what gets replicated: what it wrote goes to the
//! replicas and the AOF as bytes (`FB.PATCH`), so they reach the same
//! state without running the step.
//!
//! A step that fails is refused before anything is written (SPEC E3): the
//! arguments and the conditions the domain would refuse (a time before the
//! key's last, a ticket id in use, an unknown ticket) are checked first.
//!
//! Errors are `ERR <field>: <what to do>`, like the contract's messages.

use fusebox_domain::{Ask, Decision, FuseError, Grant, Millis, Notice, Phase, TicketId};
use redis_module::{Context, KeyType, RedisError, RedisResult, RedisString, RedisValue};

use crate::args::Form;
use crate::keyed::{self, check_key_name, Note, Opened, StepFuse};
use crate::reply::{
    completed_packed, completed_reply, decision_packed, decision_reply, millis, view_reply,
};
use crate::{args, clock, policy, registry, sign, state};

/// `FB.VERSION`: `module <semver> encoding <n> signing <fingerprint|off>`.
/// Keyless.
pub fn version(_ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if args.len() != 1 {
        return Err(RedisError::WrongArity);
    }
    Ok(RedisValue::Array(vec![
        RedisValue::SimpleStringStatic("module"),
        RedisValue::SimpleStringStatic(env!("CARGO_PKG_VERSION")),
        RedisValue::SimpleStringStatic("encoding"),
        RedisValue::Integer(i64::from(state::ENCODING_VERSION)),
        RedisValue::SimpleStringStatic("signing"),
        RedisValue::SimpleString(sign::fingerprint()),
    ]))
}

/// `FB.KEYCHECK key`: `OK` when `key` is a valid fusebox key (SPEC K1) and
/// holds nothing or fusebox state; otherwise an error naming the field.
pub fn keycheck(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if args.len() != 2 {
        return Err(RedisError::WrongArity);
    }
    check_key_name(args[1].as_slice())?;
    let key = ctx.open_key(&args[1]);
    match key.key_type() {
        KeyType::Empty => {}
        KeyType::String => {
            let value = key.read()?.unwrap_or_default();
            state::version(value).map_err(|e| err(&e))?;
        }
        _ => return Err(RedisError::WrongType),
    }
    Ok(RedisValue::SimpleStringStatic("OK"))
}

fn err(e: &dyn std::fmt::Display) -> RedisError {
    RedisError::String(format!("ERR {e}"))
}

/// A refused domain step, as an error naming the field.
fn fuse_err(e: FuseError) -> RedisError {
    match e {
        FuseError::TicketInUse => RedisError::Str(
            "ERR ticket: the id is already in use at this key; send a new random id",
        ),
        e => err(&e),
    }
}

/// The time a step at `opened` runs at, refused when it is earlier than
/// the key's last (the clock is monotonic, SPEC T0).
fn time_at(when: clock::Now, opened: Option<&Opened<'_>>) -> Result<Millis, RedisError> {
    let last = opened.map(|o| o.fuse.last_now());
    let now = when.resolve(last);
    if let Some(last) = last.filter(|&last| now < last) {
        return Err(fuse_err(FuseError::ClockWentBack { now, last }));
    }
    Ok(now)
}

/// `FB.ACQUIRE key now_ms ticket_hex policy [PERMITS n] [LEASE ms]
/// [MAXWAIT ms] [REPLY array|packed]`: a request for permits under `policy` (SPEC C1–C3,
/// P1–P4), the policy's JSON or `@` and its id ([`crate::policy`]). An
/// empty key starts as a fresh fuse under the policy at `now_ms`; a key
/// whose policy differs takes the new one first (Y4). A status check
/// (`PERMITS 0`) on an empty key stores nothing.
pub fn acquire(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if args.len() < 5 {
        return Err(RedisError::WrongArity);
    }
    let when = args::now(&args[2])?;
    let id = args::ticket(&args[3])?;
    let known = policy::of_arg(args[4].as_slice())?;
    let options = args::options(&args[5..], &["PERMITS", "LEASE", "MAXWAIT", "REPLY"])?;
    let permits = options[0]
        .map(|a| {
            args::number(
                a,
                "permits",
                u64::from(u32::MAX),
                "a whole number from 0 to 4294967295; 0 is a status check",
            )
        })
        .transpose()?
        .map_or(1, |n| n as u32);
    let lease = options[1].map(|a| args::duration(a, "lease")).transpose()?;
    if lease == Some(0) {
        return Err(fuse_err(FuseError::ZeroLease));
    }
    let max_wait = options[2]
        .map(|a| args::duration(a, "maxwait"))
        .transpose()?
        .unwrap_or(0);
    let form = args::form(options[3])?;
    let ask = Ask {
        permits,
        max_wait,
        lease,
        ..Ask::default()
    };
    let key = ctx.open_key_writable(&args[1]);
    let opened = keyed::open(&key, &args[1], Some(&known))?;
    let existed = opened.is_some();
    let now = time_at(when, opened.as_ref())?;
    let mut opened = match opened {
        Some(mut opened) => {
            if permits > 0 && opened.fuse.knows(id) {
                return Err(fuse_err(FuseError::TicketInUse));
            }
            opened.adopt(known, now)?;
            opened
        }
        None => keyed::fresh(known, now),
    };
    let decision = opened.fuse.acquire(&ask, id, now).map_err(fuse_err)?;
    let phase = opened.fuse.phase();
    if existed || permits > 0 {
        keyed::store(ctx, &key, &args[1], opened, now, &Note::default())?;
    }
    Ok(match form {
        Form::Array => decision_reply(&decision, phase, now),
        Form::Packed => decision_packed(&decision, phase, now),
    })
}

/// Opens a key that must hold state for a step on one of its tickets.
fn open_for_ticket<'k>(
    key: &'k redis_module::key::RedisKeyWritable,
    name: &RedisString,
) -> Result<Opened<'k>, RedisError> {
    keyed::open(key, name, None)?.ok_or_else(|| fuse_err(FuseError::UnknownTicket))
}

/// `FB.COMPLETE key now_ms ticket_hex outcome [REPLY array|packed]`:
/// records a ticket's outcome (SPEC B3, C5, L4); replies `stale 0|1 phase
/// <phase>`.
pub fn complete(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if args.len() != 5 && args.len() != 7 {
        return Err(RedisError::WrongArity);
    }
    let when = args::now(&args[2])?;
    let id = args::ticket(&args[3])?;
    let outcome = args::outcome(&args[4])?;
    let form = args::form(args::options(&args[5..], &["REPLY"])?[0])?;
    let key = ctx.open_key_writable(&args[1]);
    let mut opened = open_for_ticket(&key, &args[1])?;
    let now = time_at(when, Some(&opened))?;
    let done = opened.fuse.complete(id, outcome, now).map_err(fuse_err)?;
    keyed::store(ctx, &key, &args[1], opened, now, &Note::default())?;
    Ok(match form {
        Form::Array => completed_reply(done.stale, done.phase),
        Form::Packed => completed_packed(done.stale, done.phase),
    })
}

/// `FB.RENEW key now_ms ticket_hex [LEASE ms]`: extends a live ticket's
/// lease from `now_ms` (SPEC L2); replies the lease granted in ms.
pub fn renew(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if args.len() < 4 {
        return Err(RedisError::WrongArity);
    }
    let when = args::now(&args[2])?;
    let id = args::ticket(&args[3])?;
    let options = args::options(&args[4..], &["LEASE"])?;
    let lease = options[0].map(|a| args::duration(a, "lease")).transpose()?;
    if lease == Some(0) {
        return Err(fuse_err(FuseError::ZeroLease));
    }
    let key = ctx.open_key_writable(&args[1]);
    let mut opened = open_for_ticket(&key, &args[1])?;
    let now = time_at(when, Some(&opened))?;
    let granted = opened.fuse.renew(id, lease, now).map_err(fuse_err)?;
    keyed::store(ctx, &key, &args[1], opened, now, &Note::default())?;
    Ok(millis(granted))
}

/// The `BY` and `WHY` options of an operator's step.
fn by_why(values: &[Option<&RedisString>]) -> Result<Note, RedisError> {
    Ok(Note {
        who: values[0].map(|a| args::note(a, "by")).transpose()?,
        why: values[1].map(|a| args::note(a, "why")).transpose()?,
    })
}

/// `FB.ISOLATE key now_ms [POLICY policy] [BY who] [WHY text]`: an
/// operator isolates the key's breaker (SPEC B5); waiters are refused. An
/// empty key needs `POLICY`, under which it is made first; a key whose
/// policy differs takes it first. Replies the key's view as JSON.
pub fn isolate(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if args.len() < 3 {
        return Err(RedisError::WrongArity);
    }
    let when = args::now(&args[2])?;
    let options = args::options(&args[3..], &["POLICY", "BY", "WHY"])?;
    let known = options[0]
        .map(|a| policy::of_arg(a.as_slice()))
        .transpose()?;
    let note = by_why(&options[1..])?;
    let key = ctx.open_key_writable(&args[1]);
    let opened = keyed::open(&key, &args[1], known.as_ref())?;
    let now = time_at(when, opened.as_ref())?;
    let mut opened = match (opened, known) {
        (Some(mut opened), Some(known)) => {
            opened.adopt(known, now)?;
            opened
        }
        (Some(opened), None) => opened,
        (None, Some(known)) => keyed::fresh(known, now),
        (None, None) => {
            return Err(RedisError::Str(
                "ERR key: holds no fusebox state, so no policy to isolate under; \
                 send POLICY with the key's policy, or FB.ACQUIRE on it first",
            ))
        }
    };
    opened.fuse.isolate(now).map_err(fuse_err)?;
    let view = view_reply(&opened.fuse, now);
    keyed::store(ctx, &key, &args[1], opened, now, &note)?;
    Ok(view)
}

/// `FB.CLOSE key now_ms [BY who] [WHY text]`: an operator closes the key's
/// breaker with everything cleared (SPEC B5). Replies the key's view as
/// JSON; an empty key is closed already: nil, nothing written.
pub fn close(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if args.len() < 3 {
        return Err(RedisError::WrongArity);
    }
    let when = args::now(&args[2])?;
    let options = args::options(&args[3..], &["BY", "WHY"])?;
    let note = by_why(&options)?;
    let key = ctx.open_key_writable(&args[1]);
    let Some(mut opened) = keyed::open(&key, &args[1], None)? else {
        return Ok(RedisValue::Null);
    };
    let now = time_at(when, Some(&opened))?;
    opened.fuse.close(now).map_err(fuse_err)?;
    let view = view_reply(&opened.fuse, now);
    keyed::store(ctx, &key, &args[1], opened, now, &note)?;
    Ok(view)
}

/// What became of waiter `id` at `now`: its answer if `notices` hold one,
/// `queued` while it waits, the ticket it was served with while that is
/// live, else nil (unknown).
fn waiter_reply(fuse: &StepFuse<'_>, id: TicketId, now: Millis, notices: &[Notice]) -> RedisValue {
    let answered = notices.iter().rev().find_map(|n| match n {
        Notice::Answered { waiter, decision } if *waiter == id => Some(*decision),
        _ => None,
    });
    if let Some(decision) = answered {
        return decision_reply(&decision, fuse.phase(), now);
    }
    if fuse.is_waiting(id) {
        return decision_reply(&Decision::Queued, fuse.phase(), now);
    }
    match fuse.ticket(id).filter(|t| t.lease_end > now) {
        Some(t) => {
            let grant = Grant {
                ticket: id,
                lease_end: t.lease_end,
            };
            let decision = if t.probe {
                Decision::Probe(grant)
            } else {
                Decision::Granted(Some(grant))
            };
            decision_reply(&decision, fuse.phase(), now)
        }
        None => RedisValue::Null,
    }
}

/// `FB.SETTLE key now_ms [WAITER id]`: advances the key to `now_ms`
/// (leases that ended, waits that timed out, a break that is over), stores
/// it when the key holds state, and replies `[next_deadline_ms|nil,
/// waiter|nil]`, the waiter's part being what [`waiter_reply`] says.
pub fn settle(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if args.len() < 3 {
        return Err(RedisError::WrongArity);
    }
    let when = args::now(&args[2])?;
    let options = args::options(&args[3..], &["WAITER"])?;
    let waiter = options[0].map(args::waiter).transpose()?;
    let key = ctx.open_key_writable(&args[1]);
    let Some(mut opened) = keyed::open(&key, &args[1], None)? else {
        // Nothing to settle, and no waiter is known at an empty key.
        return Ok(RedisValue::Array(vec![RedisValue::Null, RedisValue::Null]));
    };
    let now = time_at(when, Some(&opened))?;
    opened.fuse.advance(now).map_err(fuse_err)?;
    let notices = keyed::drain(&mut opened.fuse);
    let next = opened.fuse.next_deadline().map_or(RedisValue::Null, millis);
    let waiter = waiter.map_or(RedisValue::Null, |id| {
        waiter_reply(&opened.fuse, id, now, &notices)
    });
    keyed::store_drained(ctx, &key, &args[1], opened, now, &Note::default(), notices)?;
    Ok(RedisValue::Array(vec![next, waiter]))
}

/// `FB.WITHDRAW key now_ms id`: the caller of a waiting request went away
/// (SPEC P6). Replies `withdrawn` (it waited and is gone), `released` (it
/// had been served: its ticket is completed as ignored) or `unknown`.
pub fn withdraw(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if args.len() != 4 {
        return Err(RedisError::WrongArity);
    }
    let when = args::now(&args[2])?;
    let id = args::waiter(&args[3])?;
    let key = ctx.open_key_writable(&args[1]);
    let Some(mut opened) = keyed::open(&key, &args[1], None)? else {
        return Ok(RedisValue::BulkString("unknown".to_owned()));
    };
    let now = time_at(when, Some(&opened))?;
    let fuse = &mut opened.fuse;
    let reply = if fuse.withdraw(id, now).map_err(fuse_err)? {
        "withdrawn"
    } else if fuse.ticket(id).is_some_and(|t| t.lease_end > now) {
        fuse.complete(id, fusebox_domain::Outcome::Ignored, now)
            .map_err(fuse_err)?;
        "released"
    } else {
        "unknown"
    };
    keyed::store(ctx, &key, &args[1], opened, now, &Note::default())?;
    Ok(RedisValue::BulkString(reply.to_owned()))
}

/// `FB.POLICY key now_ms policy`: the key takes `policy` from `now_ms` on
/// (SPEC Y4: the breaker keeps its phase, deadline, run and epoch; held
/// permits stay held; waiters that ask for more than a new limit are
/// denied), and is stored, replicated and its notices published like
/// every write. A key already under that very policy is settled to
/// `now_ms` and stored, as `FB.SETTLE` would. Replies the key's view as
/// JSON; an empty key is not written and replies nil (a key never used
/// starts under the policy its first `FB.ACQUIRE` sends).
pub fn set_policy(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if args.len() != 4 {
        return Err(RedisError::WrongArity);
    }
    let when = args::now(&args[2])?;
    let known = policy::of_arg(args[3].as_slice())?;
    let key = ctx.open_key_writable(&args[1]);
    let Some(mut opened) = keyed::open(&key, &args[1], Some(&known))? else {
        return Ok(RedisValue::Null);
    };
    let now = time_at(when, Some(&opened))?;
    opened.adopt(known, now)?;
    opened.fuse.advance(now).map_err(fuse_err)?;
    let view = view_reply(&opened.fuse, now);
    keyed::store(ctx, &key, &args[1], opened, now, &Note::default())?;
    Ok(view)
}

/// `FB.FENCE key`: writes nothing, but is replicated, so that a `WAIT`
/// sent after it on the same connection waits for every write this node
/// made to the key before it (Redis's `WAIT` counts the writes of the
/// connection that sends it). A server confirms a probe with it.
pub fn fence(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    use redis_module::ContextFlags;
    if args.len() != 2 {
        return Err(RedisError::WrongArity);
    }
    check_key_name(args[1].as_slice())?;
    if !ctx
        .get_flags()
        .intersects(ContextFlags::REPLICATED | ContextFlags::LOADING)
    {
        ctx.replicate("fb.fence", &[args[1].as_slice()]);
    }
    Ok(RedisValue::SimpleStringStatic("OK"))
}

/// `FB.GET key now_ms`: what a read of the key shows at `now_ms` (SPEC
/// section 8), as JSON, or nil for an empty key. Lease ends and waits due
/// by `now_ms` are settled on a copy; nothing is written.
pub fn get(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if args.len() != 3 {
        return Err(RedisError::WrongArity);
    }
    let when = args::now(&args[2])?;
    check_key_name(args[1].as_slice())?;
    let key = ctx.open_key(&args[1]);
    match key.key_type() {
        KeyType::Empty => return Ok(RedisValue::Null),
        KeyType::String => {}
        _ => return Err(RedisError::WrongType),
    }
    let value = key.read()?.unwrap_or_default();
    let mut fuse = keyed::read_copy(value).map_err(|e| err(&e))?;
    let now = when.resolve(Some(fuse.last_now()));
    fuse.advance(now).map_err(fuse_err)?;
    Ok(view_reply(&fuse, now))
}

/// The most keys `FB.LIST` and `FB.CENSUS` answer in one call.
pub const LIST_MAX_COUNT: u64 = 10_000;

/// How many keys `FB.LIST` may look at per key it may answer: a pattern
/// that few keys match ends a call early rather than scanning on.
const LIST_WORK_PER_KEY: u64 = 10;

/// `name`'s view at `now` (settled on a copy), when it holds fusebox
/// state in one of `phases` (any, when empty).
fn listed(ctx: &Context, name: &[u8], when: clock::Now, phases: &[Phase]) -> Option<RedisValue> {
    let key_name = ctx.create_string(name);
    let redis_key = ctx.open_key(&key_name);
    let value = redis_key.read().ok()??;
    let mut fuse = keyed::read_copy(value).ok()?;
    let now = when.resolve(Some(fuse.last_now())).max(fuse.last_now());
    fuse.advance(now).ok()?;
    (phases.is_empty() || phases.contains(&fuse.phase())).then(|| view_reply(&fuse, now))
}

fn phases_of(arg: Option<&RedisString>) -> Result<Vec<Phase>, RedisError> {
    let Some(arg) = arg else {
        return Ok(Vec::new());
    };
    String::from_utf8_lossy(arg.as_slice())
        .split(',')
        .filter(|p| !p.is_empty())
        .map(|p| {
            Phase::ALL
                .into_iter()
                .find(|phase| phase.as_str().eq_ignore_ascii_case(p))
                .ok_or_else(|| {
                    RedisError::String(format!(
                        "ERR phases: {p:?} is not a phase; send closed, open, half_open or isolated, comma separated"
                    ))
                })
        })
        .collect()
}

fn count_of(arg: Option<&RedisString>, default: u64) -> Result<u64, RedisError> {
    let count = arg
        .map(|a| args::number(a, "count", LIST_MAX_COUNT, "a whole number from 1 to 10000"))
        .transpose()?
        .unwrap_or(default);
    if count == 0 {
        return Err(RedisError::Str(
            "ERR count: must be a whole number from 1 to 10000",
        ));
    }
    Ok(count)
}

/// `FB.LIST cursor now_ms [MATCH pattern] [COUNT n] [PHASES p,...] [AFTER
/// key]`: up to `n` keys of this node that hold fusebox state (matching
/// `pattern`, in one of `phases`), each read at `now_ms` on a copy as
/// `FB.GET` reads it; nothing is written. It runs `SCAN` steps from
/// `cursor` and stops before a step would take it past `n` keys (trying
/// that step again a bucket at a time), once it has looked at 10 buckets
/// for each key it may answer, or when the pass is over, so one call's
/// work is bounded whatever the pattern; a page may be short (or empty)
/// with more to come. A key whose last time seen is later than `now_ms` is
/// read at that time.
///
/// Replies `[next_cursor, [key, view_json, ...]]`; `next_cursor` is `0`
/// when the pass is over. Never more than `n` keys: when a single `SCAN`
/// bucket holds more, the first `n` of them in byte order are answered
/// with the cursor of that bucket and a third element, the last key
/// answered; the next call sends it as `AFTER key`, which makes the call's
/// first step that bucket alone, skipping its keys up to `key`. Keyless:
/// in Redis Cluster a caller sends it to each primary.
pub fn list(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if args.len() < 3 {
        return Err(RedisError::WrongArity);
    }
    let mut cursor = args::number(
        &args[1],
        "cursor",
        u64::MAX,
        "a whole number: 0 to start, then the cursor the last FB.LIST replied",
    )?;
    let when = args::now(&args[2])?;
    let options = args::options(&args[3..], &["MATCH", "COUNT", "PHASES", "AFTER"])?;
    let count = count_of(options[1], 100)?;
    let phases = phases_of(options[2])?;
    let mut after = options[3].map(|a| a.as_slice().to_vec());
    let mut items = Vec::new();
    let mut found = 0u64;
    let mut looked = 0u64;
    let budget = count * LIST_WORK_PER_KEY;
    let mut step = if after.is_some() {
        1
    } else {
        count.clamp(1, 100)
    };
    loop {
        let (from, step_text) = (cursor.to_string(), step.to_string());
        let mut scan: Vec<&[u8]> = vec![from.as_bytes()];
        if let Some(pattern) = options[0] {
            scan.extend([&b"MATCH"[..], pattern.as_slice()]);
        }
        scan.extend([&b"COUNT"[..], step_text.as_bytes(), b"TYPE", b"string"]);
        let (next, mut keys) = scan_step(ctx, &scan)?;
        looked += step;
        if let Some(after) = after.take() {
            keys.retain(|k| *k > after);
        }
        let mut batch = Vec::new();
        for name in keys {
            if let Some(view) = listed(ctx, &name, when, &phases) {
                batch.push((name, view));
            }
        }
        let taken = batch.len() as u64;
        if found + taken > count {
            if step > 1 {
                // Too many for the call: the same cursor again, a bucket
                // at a time, until a step fits.
                step = 1;
                continue;
            }
            if found == 0 {
                // One bucket holds more keys than a call may answer: its
                // first `count` in byte order, and the last of them so that
                // the next call goes on inside the bucket.
                batch.sort_by(|a, b| a.0.cmp(&b.0));
                batch.truncate(count as usize);
                let last = batch.last().map(|(name, _)| name.clone());
                return Ok(RedisValue::Array(vec![
                    RedisValue::StringBuffer(cursor.to_string().into_bytes()),
                    RedisValue::Array(flatten(batch)),
                    RedisValue::StringBuffer(last.unwrap_or_default()),
                ]));
            }
            // This step's keys are left for the next call, from `cursor`.
            break;
        }
        items.extend(batch);
        found += taken;
        cursor = next;
        if cursor == 0 || found >= count || looked >= budget {
            break;
        }
        step = (count - found).clamp(1, 100);
    }
    Ok(RedisValue::Array(vec![
        RedisValue::StringBuffer(cursor.to_string().into_bytes()),
        RedisValue::Array(flatten(items)),
    ]))
}

/// Keys and their views as one flat reply array.
fn flatten(items: Vec<(Vec<u8>, RedisValue)>) -> Vec<RedisValue> {
    items
        .into_iter()
        .flat_map(|(name, view)| [RedisValue::StringBuffer(name), view])
        .collect()
}

/// One `SCAN` step from inside the module: the next cursor and the keys.
pub fn scan_step(ctx: &Context, scan: &[&[u8]]) -> Result<(u64, Vec<Vec<u8>>), RedisError> {
    let reply = ctx.call("SCAN", scan)?;
    let RedisValue::Array(parts) = reply else {
        return Err(RedisError::Str(
            "ERR list: SCAN gave no array (a module bug)",
        ));
    };
    let mut parts = parts.into_iter();
    let next = parts
        .next()
        .map(bytes)
        .and_then(|b| std::str::from_utf8(&b).ok()?.parse().ok())
        .unwrap_or(0);
    let keys = match parts.next() {
        Some(RedisValue::Array(keys)) => keys.into_iter().map(bytes).collect(),
        _ => Vec::new(),
    };
    Ok((next, keys))
}

/// The bytes of a string in a `ctx.call` reply (empty for anything else).
pub fn bytes(v: RedisValue) -> Vec<u8> {
    match v {
        RedisValue::SimpleString(s) | RedisValue::BulkString(s) => s.into_bytes(),
        RedisValue::StringBuffer(b) => b,
        RedisValue::BulkRedisString(s) => s.as_slice().to_vec(),
        _ => Vec::new(),
    }
}

/// `FB.CENSUS now_ms [MATCH prefix] [COUNT n]`: this node's figures and its
/// keys that are not CLOSED, from its registry ([`crate::registry`]), with
/// no scan: `[keys, n, complete, 0|1, counted_at_ms, n, closed, n, open,
/// n, half_open, n, isolated, n, tickets, n, waiters, n, not_closed, [key,
/// view_json, ...]]`. `keys` is what the node's last complete pass over its
/// keys counted (`complete` 0: none has completed since the node started
/// or reloaded its data); the phases, tickets and waiters are exact now,
/// `closed` counting the closed keys not at rest. At most `n` (default
/// 100) keys not closed whose name starts with `prefix` are read on a
/// copy. Keyless: in Redis Cluster a caller sends it to each primary.
pub fn census(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if args.len() < 2 {
        return Err(RedisError::WrongArity);
    }
    let when = args::now(&args[1])?;
    let options = args::options(&args[2..], &["MATCH", "COUNT"])?;
    let count = count_of(options[1], 100)?;
    let prefix = options[0]
        .map(|a| a.as_slice().to_vec())
        .unwrap_or_default();
    let c = registry::census();
    let names = registry::not_closed(count as usize, |name| name.starts_with(&prefix));
    let mut items = Vec::new();
    for name in names {
        if let Some(view) = listed(ctx, &name, when, &[]) {
            items.push(RedisValue::StringBuffer(name));
            items.push(view);
        }
    }
    let n = |v: u64| RedisValue::Integer(i64::try_from(v).unwrap_or(i64::MAX));
    let field = |name: &'static str| RedisValue::SimpleStringStatic(name);
    Ok(RedisValue::Array(vec![
        field("keys"),
        n(c.keys),
        field("complete"),
        n(u64::from(c.complete)),
        field("counted_at_ms"),
        n(c.counted_at),
        field("closed"),
        n(c.by_phase[Phase::Closed.index()]),
        field("open"),
        n(c.by_phase[Phase::Open.index()]),
        field("half_open"),
        n(c.by_phase[Phase::HalfOpen.index()]),
        field("isolated"),
        n(c.by_phase[Phase::Isolated.index()]),
        field("tickets"),
        n(c.tickets),
        field("waiters"),
        n(c.waiters),
        field("not_closed"),
        RedisValue::Array(items),
    ]))
}

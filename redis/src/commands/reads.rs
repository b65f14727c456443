//! Reads that write nothing: `FB.GET` (one key), `FB.LIST` (a bounded
//! step of a scan) and `FB.CENSUS` (the node's figures and its keys not
//! closed, from its registry).

use fusebox_domain::wire::CensusFigures;
use fusebox_domain::Phase;
use redis_module::{Context, KeyType, RedisError, RedisResult, RedisString, RedisValue};

use crate::keyed::{self, check_key_name};
use crate::refusal::{err, fuse_err};
use crate::reply::view_reply;
use crate::scan::scan_step;
use crate::{args, clock, registry};

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
    view_reply(&fuse, now)
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
    (phases.is_empty() || phases.contains(&fuse.phase()))
        .then(|| view_reply(&fuse, now).ok())
        .flatten()
}

fn phases_of(arg: Option<&RedisString>) -> Result<Vec<Phase>, RedisError> {
    let Some(arg) = arg else {
        return Ok(Vec::new());
    };
    String::from_utf8_lossy(arg.as_slice())
        .split(',')
        .filter(|p| !p.is_empty())
        .map(|p| {
            p.parse().map_err(|_| {
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
    let figures = CensusFigures {
        keys: c.keys,
        complete: c.complete,
        counted_at_ms: c.counted_at,
        by_phase: c.by_phase,
        tickets: c.tickets,
        waiters: c.waiters,
    };
    let mut reply = Vec::with_capacity(20);
    for (label, n) in figures.items() {
        reply.push(RedisValue::SimpleString(label.into_owned()));
        reply.push(RedisValue::Integer(i64::try_from(n).unwrap_or(i64::MAX)));
    }
    reply.push(RedisValue::SimpleStringStatic(CensusFigures::NOT_CLOSED));
    reply.push(RedisValue::Array(items));
    Ok(RedisValue::Array(reply))
}

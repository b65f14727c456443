//! The settler: a module timer that settles keys whose next deadline (a
//! lease end, a wait's end, a refill that can serve a waiter) has passed
//! on the server's wall clock, so that waiters are answered and permits
//! come back without waiting for the next command at the key.
//!
//! Each node keeps, in memory, an index of every key's next deadline. Every
//! command that stores a key updates it, on replicas too (they run the
//! same commands), so a replica's index is ready when it is promoted. A
//! background `SCAN` adds keys holding fusebox state that are not indexed
//! yet: keys loaded from RDB or AOF, or migrated in from another node.
//!
//! Every [`TICK`], on a primary that is not loading, the timer settles up
//! to [`MAX_PER_TICK`] due keys: it advances each to the later of the wall
//! clock and the key's last time seen, stores it, replicates the step as
//! `FB.SETTLE <key> <that time>`, and publishes the notices.
//!
//! Only keys driven by the wall clock are settled: a key whose last time
//! seen is more than 365 days from the wall clock (a caller's own
//! monotonic clock, such as a test's manual clock at 1000) is not indexed
//! and is settled only when a command touches it. The timer works in
//! database 0 (the only database of Redis Cluster).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::Duration;

use fusebox_domain::policy::MAX_DURATION;
use fusebox_domain::{Fuse, Millis};
use redis_module::{Context, ContextFlags, RedisString, RedisValue};

use crate::commands::{self, wall_ms, Note};
use crate::state;

/// How often the timer runs.
pub const TICK: Duration = Duration::from_millis(20);

/// The most keys the timer settles in one tick.
pub const MAX_PER_TICK: usize = 1000;

/// How many keys one `SCAN` step asks for.
const SCAN_COUNT: &str = "100";

/// How long after a complete pass over the keyspace the next one starts.
const SCAN_PAUSE_MS: Millis = 10_000;

struct Index {
    /// Keys by next deadline.
    due: BTreeSet<(Millis, Vec<u8>)>,
    /// Each indexed key's deadline.
    at: BTreeMap<Vec<u8>, Millis>,
    /// The `SCAN` cursor while a pass runs.
    cursor: Option<String>,
    /// When the next pass may start (wall clock).
    next_pass: Millis,
}

static INDEX: Mutex<Index> = Mutex::new(Index {
    due: BTreeSet::new(),
    at: BTreeMap::new(),
    cursor: None,
    next_pass: 0,
});

fn index() -> std::sync::MutexGuard<'static, Index> {
    INDEX.lock().unwrap_or_else(|e| e.into_inner())
}

impl Index {
    fn set(&mut self, key: &[u8], deadline: Option<Millis>) {
        if let Some(old) = self.at.remove(key) {
            self.due.remove(&(old, key.to_vec()));
        }
        if let Some(at) = deadline {
            self.at.insert(key.to_vec(), at);
            self.due.insert((at, key.to_vec()));
        }
    }

    /// Removes and returns up to `max` keys due by `now`.
    fn pop_due(&mut self, now: Millis, max: usize) -> Vec<Vec<u8>> {
        let mut keys = Vec::new();
        while keys.len() < max {
            let Some((at, key)) = self.due.first().cloned() else {
                break;
            };
            if at > now {
                break;
            }
            self.due.remove(&(at, key.clone()));
            self.at.remove(&key);
            keys.push(key);
        }
        keys
    }
}

/// The deadline the settler keeps for `fuse`: its next deadline, when its
/// last time seen is within 365 days of the wall clock.
pub fn deadline_of(fuse: &Fuse, wall: Millis) -> Option<Millis> {
    fuse.next_deadline()
        .filter(|_| wall.abs_diff(fuse.last_now()) <= MAX_DURATION)
}

/// Records `key`'s state after a command stored it.
pub fn note(key: &[u8], fuse: &Fuse) {
    let deadline = deadline_of(fuse, wall_ms());
    index().set(key, deadline);
}

/// Starts the timer; called once when the module loads.
pub fn start(ctx: &Context) {
    ctx.create_timer(TICK, tick, ());
}

fn tick(ctx: &Context, (): ()) {
    let flags = ctx.get_flags();
    if !flags.contains(ContextFlags::LOADING) {
        if flags.contains(ContextFlags::MASTER) {
            settle_due(ctx);
        }
        scan_step(ctx);
    }
    ctx.create_timer(TICK, tick, ());
}

fn settle_due(ctx: &Context) {
    let wall = wall_ms();
    let keys = index().pop_due(wall, MAX_PER_TICK);
    for key in keys {
        let key_name = ctx.create_string(key.as_slice());
        if let Err(e) = settle_key(ctx, &key_name, wall) {
            ctx.log_warning(&format!(
                "fusebox: settling {:?} failed: {e}",
                String::from_utf8_lossy(&key)
            ));
        }
    }
}

/// Settles one due key at the later of `wall` and its last time seen. A
/// key that is gone, not fusebox state, or whose slot this node does not
/// serve (the read through `ctx.call` fails) stays out of the index.
fn settle_key(ctx: &Context, key_name: &RedisString, wall: Millis) -> Result<(), String> {
    match ctx.call("EXISTS", &[key_name]) {
        Ok(RedisValue::Integer(1)) => {}
        _ => return Ok(()),
    }
    let Some(mut fuse) = commands::load(ctx, key_name).map_err(|e| e.to_string())? else {
        return Ok(());
    };
    let now = wall.min(commands::MAX_NOW).max(fuse.last_now());
    match deadline_of(&fuse, wall) {
        None => return Ok(()),
        // Not due after all (the key was written another way): wait for it.
        Some(at) if at > now => {
            index().set(key_name.as_slice(), Some(at));
            return Ok(());
        }
        Some(_) => {}
    }
    fuse.advance(now).map_err(|e| e.to_string())?;
    let key = key_name.as_slice().to_vec();
    commands::persist(
        ctx,
        key_name,
        &mut fuse,
        now,
        |ctx| {
            let now = now.to_string();
            ctx.replicate("fb.settle", &[key.as_slice(), now.as_bytes()]);
        },
        &Note::default(),
    )
    .map(drop)
    .map_err(|e| e.to_string())
}

/// One step of the background pass: `SCAN cursor COUNT 100`, indexing
/// the keys with fusebox state that are not indexed yet.
fn scan_step(ctx: &Context) {
    let wall = wall_ms();
    let cursor = {
        let mut ix = index();
        match &ix.cursor {
            Some(c) => c.clone(),
            None if wall >= ix.next_pass => {
                ix.cursor = Some("0".to_owned());
                "0".to_owned()
            }
            None => return,
        }
    };
    let reply = ctx.call("SCAN", &[cursor.as_str(), "COUNT", SCAN_COUNT]);
    let Ok(RedisValue::Array(parts)) = reply else {
        index().cursor = None;
        return;
    };
    let mut parts = parts.into_iter();
    let next = parts.next().map(bytes).unwrap_or_default();
    let keys = match parts.next() {
        Some(RedisValue::Array(keys)) => keys,
        _ => Vec::new(),
    };
    for key in keys.into_iter().map(bytes) {
        if index().at.contains_key(&key) {
            continue;
        }
        let key_name = ctx.create_string(key.as_slice());
        let redis_key = ctx.open_key(&key_name);
        let Ok(Some(value)) = redis_key.read() else {
            continue;
        };
        if !value.starts_with(state::MAGIC) {
            continue;
        }
        if let Ok(fuse) = state::decode_fuse(value) {
            let deadline = deadline_of(&fuse, wall);
            if deadline.is_some() {
                index().set(&key, deadline);
            }
        }
    }
    let mut ix = index();
    if next.is_empty() || next == b"0" {
        ix.cursor = None;
        ix.next_pass = wall.saturating_add(SCAN_PAUSE_MS);
    } else {
        ix.cursor = Some(String::from_utf8_lossy(&next).into_owned());
    }
}

/// The bytes of a string in a `ctx.call` reply (empty for anything else).
pub(crate) fn bytes(v: RedisValue) -> Vec<u8> {
    match v {
        RedisValue::SimpleString(s) | RedisValue::BulkString(s) => s.into_bytes(),
        RedisValue::StringBuffer(b) => b,
        RedisValue::BulkRedisString(s) => s.as_slice().to_vec(),
        _ => Vec::new(),
    }
}

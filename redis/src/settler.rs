//! The settler: a module timer that settles keys whose next deadline (a
//! lease end, a wait's end, a refill that can serve a waiter) has passed
//! on the server's wall clock, so that waiters are answered and permits
//! come back without waiting for the next command at the key; and the
//! background pass that reads every value's header into the registry.
//!
//! Every [`TICK`], on a primary that is not loading, the timer settles
//! the keys the registry has due, for at most [`SETTLE_BUDGET`] of work: it
//! reads each key's deadline at its fixed offset, and a key that is due is
//! advanced to the later of the wall clock and its last time seen, stored,
//! its bytes replicated and its notices published. Then, on every node,
//! the pass reads the headers of the next keys of a `SCAN` (for at most
//! [`PASS_BUDGET`]), decoding nothing; a pass that ends sweeps the
//! registry of keys it did not find and counts the node's keys.
//!
//! Only keys driven by the wall clock are settled (see
//! [`registry::settle_at`]). The timer works in database 0 (the only
//! database of Redis Cluster).

use std::time::{Duration, Instant};

use fusebox_domain::Millis;
use redis_module::{Context, ContextFlags, RedisString};

use crate::clock::{wall_ms, MAX_NOW};
use crate::keyed;
use crate::notices::Note;
use crate::scan::scan_step;
use crate::{registry, state};

/// How often the timer runs.
pub const TICK: Duration = Duration::from_millis(20);

/// The most time one tick spends settling due keys (more wait for the
/// next tick; Redis serves nothing else meanwhile).
pub const SETTLE_BUDGET: Duration = Duration::from_millis(2);

/// The most time one tick spends on the background pass.
pub const PASS_BUDGET: Duration = Duration::from_millis(1);

/// How long after a complete pass over the keyspace the next one starts.
pub const PASS_PAUSE_MS: Millis = 5_000;

/// Keys taken from the registry at a time.
const BATCH: usize = 64;

/// The pass's cursor while a pass runs, and when the next may start.
struct Pass {
    cursor: Option<u64>,
    next_at: Millis,
}

static PASS: std::sync::Mutex<Pass> = std::sync::Mutex::new(Pass {
    cursor: None,
    next_at: 0,
});

/// Starts the timer; called once when the module loads.
pub fn start(ctx: &Context) {
    ctx.create_timer(TICK, tick, ());
}

fn tick(ctx: &Context, (): ()) {
    let flags = ctx.get_flags();
    if !flags.contains(ContextFlags::LOADING) {
        if flags.contains(ContextFlags::MASTER) {
            settle_due(ctx);
            clear_expiries(ctx);
        }
        pass_step(ctx);
    }
    ctx.create_timer(TICK, tick, ());
}

/// Clears the idle expiry of keys that are no longer at rest (a write at
/// rest set it, minutes ahead; the write that made the key active left it
/// for this), and replicates that as `PERSIST`.
fn clear_expiries(ctx: &Context) {
    for key in registry::take_expiring(10_000) {
        let name = ctx.create_string(&key[..]);
        let redis_key = ctx.open_key_writable(&name);
        if redis_key.remove_expire().is_ok() {
            ctx.replicate("persist", &[&key[..]]);
        }
    }
}

fn settle_due(ctx: &Context) {
    let started = Instant::now();
    let wall = wall_ms();
    while started.elapsed() < SETTLE_BUDGET {
        let keys = registry::pop_due(wall, BATCH);
        if keys.is_empty() {
            return;
        }
        for key in keys {
            let name = ctx.create_string(key.as_slice());
            if let Err(e) = settle_key(ctx, &name, wall) {
                ctx.log_warning(&format!(
                    "fusebox: settling {:?} failed: {e}",
                    String::from_utf8_lossy(&key)
                ));
            }
        }
    }
}

/// Settles one due key at the later of `wall` and its last time seen. A
/// key that is gone, not fusebox state, or whose slot this node does not
/// serve is noted as gone; one that is not due after all is queued at its
/// real deadline.
fn settle_key(ctx: &Context, name: &RedisString, wall: Millis) -> Result<(), String> {
    let Some(summary) = keyed::summary_of(ctx, name) else {
        registry::note(name.as_slice(), None, wall);
        return Ok(());
    };
    let due = registry::settle_at(&summary, wall);
    let now = wall.min(MAX_NOW).max(summary.last_now);
    if due.is_none_or(|at| at > now) {
        registry::note(name.as_slice(), Some(summary), wall);
        return Ok(());
    }
    let key = ctx.open_key_writable(name);
    let Some(mut opened) = keyed::open(&key, name, None).map_err(|e| e.to_string())? else {
        registry::note(name.as_slice(), None, wall);
        return Ok(());
    };
    opened.fuse.advance(now).map_err(|e| e.to_string())?;
    keyed::store(ctx, &key, name, opened, now, &Note::default())
        .map(drop)
        .map_err(|e| e.to_string())
}

/// Runs the background pass for at most [`PASS_BUDGET`]: `SCAN` steps,
/// each key's header read into the registry.
fn pass_step(ctx: &Context) {
    let started = Instant::now();
    let wall = wall_ms();
    let mut cursor = {
        let mut pass = PASS.lock().unwrap_or_else(|e| e.into_inner());
        match pass.cursor {
            Some(c) => c,
            None if wall >= pass.next_at => {
                registry::pass_started();
                pass.cursor = Some(0);
                0
            }
            None => return,
        }
    };
    loop {
        let from = cursor.to_string();
        let Ok((next, keys)) = scan_step(
            ctx,
            &[from.as_bytes(), b"COUNT", b"100", b"TYPE", b"string"],
        ) else {
            PASS.lock().unwrap_or_else(|e| e.into_inner()).cursor = None;
            return;
        };
        for key in keys {
            let name = ctx.create_string(key.as_slice());
            let redis_key = ctx.open_key(&name);
            let Ok(Some(value)) = redis_key.read() else {
                continue;
            };
            if !value.starts_with(state::MAGIC) {
                continue;
            }
            if let Ok(summary) = state::summary(value) {
                registry::seen(&key, summary, wall);
            }
        }
        cursor = next;
        if cursor == 0 {
            registry::pass_ended(wall);
            let mut pass = PASS.lock().unwrap_or_else(|e| e.into_inner());
            pass.cursor = None;
            pass.next_at = wall.saturating_add(PASS_PAUSE_MS);
            return;
        }
        if started.elapsed() >= PASS_BUDGET {
            PASS.lock().unwrap_or_else(|e| e.into_inner()).cursor = Some(cursor);
            return;
        }
    }
}

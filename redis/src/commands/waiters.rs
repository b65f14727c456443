//! Queued requests: `FB.SETTLE` (a key brought up to a time, and where a
//! waiter stands) and `FB.WITHDRAW` (a waiter whose caller went away, P6).

use fusebox_domain::wire::Answer;
use fusebox_domain::{Decision, Grant, Millis, Notice, Outcome, TicketId};
use redis_module::{Context, RedisError, RedisResult, RedisString, RedisValue};

use crate::args;
use crate::keyed::{self, StepFuse};
use crate::notices::Note;
use crate::refusal::fuse_err;
use crate::reply::{answer_array, millis};

/// What became of waiter `id` at `now`: its answer if `notices` hold one,
/// `queued` while it waits, the ticket it was served with while that is
/// live, else nil (unknown).
fn waiter_reply(fuse: &StepFuse<'_>, id: TicketId, now: Millis, notices: &[Notice]) -> RedisValue {
    let answered = notices.iter().rev().find_map(|n| match n {
        Notice::Answered { waiter, decision } if *waiter == id => Some(*decision),
        _ => None,
    });
    let reply = |decision| {
        answer_array(&Answer {
            decision,
            phase: fuse.phase(),
            now,
        })
    };
    if let Some(decision) = answered {
        return reply(decision);
    }
    if fuse.is_waiting(id) {
        return reply(Decision::Queued);
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
            reply(decision)
        }
        None => RedisValue::Null,
    }
}

/// `FB.SETTLE key now_ms [WAITER id]`: advances the key to `now_ms`
/// (leases that ended, waits that timed out, a break that is over), stores
/// it when the key holds state, and replies `[next_deadline_ms|nil,
/// waiter|nil]`, the waiter's part being what `waiter_reply` says.
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
    let now = keyed::time_at(when, Some(&opened))?;
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
    let now = keyed::time_at(when, Some(&opened))?;
    let fuse = &mut opened.fuse;
    let reply = if fuse.withdraw(id, now).map_err(fuse_err)? {
        "withdrawn"
    } else if fuse.ticket(id).is_some_and(|t| t.lease_end > now) {
        fuse.complete(id, Outcome::Ignored, now).map_err(fuse_err)?;
        "released"
    } else {
        "unknown"
    };
    keyed::store(ctx, &key, &args[1], opened, now, &Note::default())?;
    Ok(RedisValue::BulkString(reply.to_owned()))
}

//! A caller's decisions, the hot path of a fusebox server on Redis:
//! `FB.ACQUIRE`, `FB.COMPLETE`, `FB.RENEW`.

use fusebox_domain::wire::{Answer, Completion};
use fusebox_domain::{Ask, CallerId, FuseError};
use redis_module::{Context, RedisError, RedisResult, RedisString};

use crate::keyed::{self, Opened};
use crate::notices::Note;
use crate::refusal::fuse_err;
use crate::reply::{answer_reply, completion_reply, millis};
use crate::{args, policy};

/// `FB.ACQUIRE key now_ms ticket_hex policy [PERMITS n] [LEASE ms]
/// [MAXWAIT ms] [REPLY array|packed] [ATTEMPT n] [CALLER name]`: a request for permits under `policy` (SPEC C1–C3,
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
    let options = args::options(
        &args[5..],
        &["PERMITS", "LEASE", "MAXWAIT", "REPLY", "ATTEMPT", "CALLER"],
    )?;
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
    let attempt = options[4]
        .map(|a| {
            args::number(
                a,
                "attempt",
                u64::from(u32::MAX),
                "a whole number: 0 or 1 a first attempt, 2 or more a retry",
            )
        })
        .transpose()?
        .unwrap_or(0);
    let ask = Ask {
        permits,
        max_wait,
        lease,
        retry: attempt >= 2,
        caller: options[5]
            .map(args::caller)
            .transpose()?
            .unwrap_or_else(|| CallerId::of("")),
        ..Ask::default()
    };
    let key = ctx.open_key_writable(&args[1]);
    let opened = keyed::open(&key, &args[1], Some(&known))?;
    let existed = opened.is_some();
    let now = keyed::time_at(when, opened.as_ref())?;
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
    let answer = Answer {
        decision,
        phase,
        now,
    };
    Ok(answer_reply(&answer, form))
}

/// Opens a key that must hold state for a step on one of its tickets.
fn open_for_ticket<'k>(
    key: &'k redis_module::key::RedisKeyWritable,
    name: &RedisString,
) -> Result<Opened<'k>, RedisError> {
    keyed::open(key, name, None)?.ok_or_else(|| fuse_err(FuseError::UnknownTicket))
}

/// `FB.COMPLETE key now_ms ticket_hex outcome [COST n] [REPLY
/// array|packed]`: records a ticket's outcome (SPEC B3, C5, L4) and, with
/// `COST`, the permits the call really used (U1: settled in a token-bucket
/// or window limiter); replies `stale 0|1 phase <phase>`.
pub fn complete(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if args.len() < 5 {
        return Err(RedisError::WrongArity);
    }
    let when = args::now(&args[2])?;
    let id = args::ticket(&args[3])?;
    let outcome = args::outcome(&args[4])?;
    let options = args::options(&args[5..], &["COST", "REPLY"])?;
    let cost = options[0]
        .map(|a| {
            args::number(
                a,
                "cost",
                u64::from(u32::MAX),
                "a whole number from 0 to 4294967295: the permits the call really used",
            )
        })
        .transpose()?
        .map(|n| n as u32);
    let form = args::form(options[1])?;
    let key = ctx.open_key_writable(&args[1]);
    let mut opened = open_for_ticket(&key, &args[1])?;
    let now = keyed::time_at(when, Some(&opened))?;
    let done = opened
        .fuse
        .complete_with_cost(id, outcome, cost, now)
        .map_err(fuse_err)?;
    keyed::store(ctx, &key, &args[1], opened, now, &Note::default())?;
    let completion = Completion {
        stale: done.stale,
        phase: done.phase,
    };
    Ok(completion_reply(&completion, form))
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
    let now = keyed::time_at(when, Some(&opened))?;
    let granted = opened.fuse.renew(id, lease, now).map_err(fuse_err)?;
    keyed::store(ctx, &key, &args[1], opened, now, &Note::default())?;
    Ok(millis(granted))
}

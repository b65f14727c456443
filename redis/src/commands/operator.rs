//! Changes to a key by an operator, or by a server for its rules:
//! `FB.ISOLATE`, `FB.CLOSE` (SPEC B5) and `FB.POLICY` (Y4).

use redis_module::{Context, RedisError, RedisResult, RedisString, RedisValue};

use crate::keyed;
use crate::notices::Note;
use crate::refusal::fuse_err;
use crate::reply::view_reply;
use crate::{args, policy};

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
    let now = keyed::time_at(when, opened.as_ref())?;
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
    let view = view_reply(&opened.fuse, now)?;
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
    let now = keyed::time_at(when, Some(&opened))?;
    opened.fuse.close(now).map_err(fuse_err)?;
    let view = view_reply(&opened.fuse, now)?;
    keyed::store(ctx, &key, &args[1], opened, now, &note)?;
    Ok(view)
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
    let now = keyed::time_at(when, Some(&opened))?;
    opened.adopt(known, now)?;
    opened.fuse.advance(now).map_err(fuse_err)?;
    let view = view_reply(&opened.fuse, now)?;
    keyed::store(ctx, &key, &args[1], opened, now, &Note::default())?;
    Ok(view)
}

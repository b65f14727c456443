//! `FB.CHARGE`: charges without tickets over several keys of one hash
//! slot, all or nothing (Envoy's rate-limit service). A command runs alone
//! on its node, so quoting every key and then charging them all is atomic.

use fusebox_domain::Quote;
use redis_module::{Context, RedisError, RedisResult, RedisString, RedisValue};

use crate::keyed::{self, Opened};
use crate::notices::Note;
use crate::refusal::fuse_err;
use crate::{args, policy};

/// The most keys one `FB.CHARGE` names.
pub const MAX_CHARGE_KEYS: usize = 64;

/// `FB.CHARGE key policy permits [key policy permits ...] now_ms`: quotes
/// `permits` at every key under its policy (the policy's JSON, or `@` and
/// its id), then charges every key when every quote fits, else none.
/// Keys that do not exist start fresh under their policy; a fresh key that
/// is not charged is not stored. Replies `[charged, fits, limit,
/// remaining, reset_in, ...]`, four numbers per key in order (`limit` and
/// `reset_in` are -1 without a limiter). A key named twice is refused.
pub fn charge(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if args.len() < 5 || !(args.len() - 2).is_multiple_of(3) {
        return Err(RedisError::WrongArity);
    }
    let when = args::now(&args[args.len() - 1])?;
    let items: Vec<&[RedisString]> = args[1..args.len() - 1].chunks(3).collect();
    if items.len() > MAX_CHARGE_KEYS {
        return Err(RedisError::String(format!(
            "ERR keys: at most {MAX_CHARGE_KEYS} in one FB.CHARGE"
        )));
    }
    let mut parsed = Vec::with_capacity(items.len());
    for item in &items {
        let known = policy::of_arg(item[1].as_slice())?;
        let permits = args::number(
            &item[2],
            "permits",
            u64::from(u32::MAX),
            "a whole number from 0 to 4294967295; 0 is a status check",
        )? as u32;
        parsed.push((known, permits));
    }
    for (i, a) in items.iter().enumerate() {
        if items[..i]
            .iter()
            .any(|b| b[0].as_slice() == a[0].as_slice())
        {
            return Err(RedisError::Str(
                "ERR keys: a key is named twice; add its permits up instead",
            ));
        }
    }
    let keys: Vec<_> = items
        .iter()
        .map(|item| ctx.open_key_writable(&item[0]))
        .collect();
    let mut opened: Vec<(Opened<'_>, bool, u64)> = Vec::with_capacity(items.len());
    for ((key, item), (known, _)) in keys.iter().zip(&items).zip(&parsed) {
        let found = keyed::open(key, &item[0], Some(known))?;
        let existed = found.is_some();
        let now = keyed::time_at(when, found.as_ref())?;
        let o = match found {
            Some(mut o) => {
                o.adopt(known.clone(), now)?;
                o
            }
            None => keyed::fresh(known.clone(), now),
        };
        opened.push((o, existed, now));
    }
    let mut quotes: Vec<Quote> = Vec::with_capacity(items.len());
    for ((o, _, now), (_, permits)) in opened.iter_mut().zip(&parsed) {
        quotes.push(o.fuse.quote(*permits, *now).map_err(fuse_err)?);
    }
    let charged = quotes.iter().all(|q| q.fits);
    let mut reply = vec![RedisValue::Integer(i64::from(charged))];
    for (i, ((mut o, existed, now), (_, permits))) in opened.into_iter().zip(&parsed).enumerate() {
        if charged {
            quotes[i] = o.fuse.charge(*permits, now).map_err(fuse_err)?;
        }
        if existed || (charged && *permits > 0) {
            keyed::store(ctx, &keys[i], &items[i][0], o, now, &Note::default())?;
        }
        let q = quotes[i];
        reply.push(RedisValue::Integer(i64::from(q.fits)));
        reply.push(RedisValue::Integer(q.limit.map_or(-1, i64::from)));
        reply.push(RedisValue::Integer(i64::from(q.remaining)));
        reply.push(RedisValue::Integer(
            q.reset_in
                .map_or(-1, |r| i64::try_from(r).unwrap_or(i64::MAX)),
        ));
    }
    Ok(RedisValue::Array(reply))
}

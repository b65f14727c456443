//! What a node says of itself and of a key's name, and the fence a server
//! confirms its writes with: `FB.VERSION`, `FB.KEYCHECK`, `FB.FENCE`.

use fusebox_domain::wire::{Item, ModuleVersion};
use redis_module::{
    Context, ContextFlags, KeyType, RedisError, RedisResult, RedisString, RedisValue,
};

use crate::keyed::check_key_name;
use crate::refusal::err;
use crate::{sign, state};

/// `FB.VERSION`: `module <semver> encoding <n> signing <fingerprint|off>`.
/// Keyless.
pub fn version(_ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if args.len() != 1 {
        return Err(RedisError::WrongArity);
    }
    let version = ModuleVersion {
        module: env!("CARGO_PKG_VERSION").to_owned(),
        encoding: u64::from(state::ENCODING_VERSION),
        signing: sign::fingerprint(),
    };
    let mut reply = Vec::with_capacity(6);
    for (label, item) in version.items() {
        reply.push(RedisValue::SimpleStringStatic(label));
        reply.push(match item {
            Item::Text(text) => RedisValue::SimpleString(text.to_owned()),
            Item::Number(n) => RedisValue::Integer(i64::try_from(n).unwrap_or(i64::MAX)),
        });
    }
    Ok(RedisValue::Array(reply))
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

/// `FB.FENCE key`: writes nothing, but is replicated, so that a `WAIT`
/// sent after it on the same connection waits for every write this node
/// made to the key before it (Redis's `WAIT` counts the writes of the
/// connection that sends it). A server confirms a probe with it.
pub fn fence(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
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

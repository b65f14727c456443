//! The module's commands. Every command is deterministic given its
//! arguments (the caller supplies the time), so a replica or an AOF replay
//! that runs it again reaches the same state.
//!
//! Errors are `ERR <field>: <what to do>`, like the contract's messages.

use redis_module::{Context, KeyType, RedisError, RedisResult, RedisString, RedisValue};

use crate::state;

/// `FB.VERSION`: the module's version and the state encoding it writes, as
/// `module <semver> encoding <n>`. Keyless.
pub fn version(_ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if args.len() != 1 {
        return Err(RedisError::WrongArity);
    }
    Ok(RedisValue::Array(vec![
        RedisValue::SimpleStringStatic("module"),
        RedisValue::SimpleStringStatic(env!("CARGO_PKG_VERSION")),
        RedisValue::SimpleStringStatic("encoding"),
        RedisValue::Integer(i64::from(state::ENCODING_VERSION)),
    ]))
}

/// `FB.KEYCHECK key`: `OK` when `key` is a valid fusebox key (SPEC K1) and
/// holds nothing or fusebox state; otherwise an error naming the field.
pub fn keycheck(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if args.len() != 2 {
        return Err(RedisError::WrongArity);
    }
    let key_name = args.into_iter().nth(1).ok_or(RedisError::WrongArity)?;
    check_key_name(key_name.as_slice())?;
    let key = ctx.open_key(&key_name);
    match key.key_type() {
        KeyType::Empty => {}
        KeyType::String => {
            let value = key.read()?.unwrap_or_default();
            state::decode(value).map_err(|e| err(&e))?;
        }
        _ => return Err(RedisError::WrongType),
    }
    Ok(RedisValue::SimpleStringStatic("OK"))
}

/// Checks a key name against SPEC K1, as the contract's `key` field.
pub fn check_key_name(name: &[u8]) -> Result<&str, RedisError> {
    let name = std::str::from_utf8(name)
        .map_err(|_| RedisError::Str("ERR key: must be UTF-8; send the key's UTF-8 bytes"))?;
    fusebox_domain::validate_key(name).map_err(|e| err(&e))?;
    Ok(name)
}

/// An error reply `ERR <message>`.
fn err(e: &dyn std::fmt::Display) -> RedisError {
    RedisError::String(format!("ERR {e}"))
}

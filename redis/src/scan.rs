//! `SCAN` from inside the module, for `FB.LIST` and the settler's
//! background pass.

use redis_module::{Context, RedisError, RedisValue};

/// One `SCAN` step: the next cursor and the keys.
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

//! How the module refuses: `ERR <field>: <what to do>`, like the
//! contract's messages, so that a fusebox server maps each refusal to the
//! contract's error by the field it names.

use fusebox_domain::FuseError;
use redis_module::RedisError;

/// `e` as an `ERR` reply.
pub fn err(e: &dyn std::fmt::Display) -> RedisError {
    RedisError::String(format!("ERR {e}"))
}

/// A refused domain step, as an error naming the field.
pub fn fuse_err(e: FuseError) -> RedisError {
    match e {
        FuseError::TicketInUse => RedisError::Str(
            "ERR ticket: the id is already in use at this key; send a new random id",
        ),
        e => err(&e),
    }
}

//! How one key's state is kept in Redis: a string value holding a versioned
//! encoding of the domain state.
//!
//! A string, not a module data type, because a data type's callbacks (RDB
//! save and load, AOF rewrite, free) are `unsafe extern "C"` functions, and
//! the module has no `unsafe` of its own. A string gets RDB, AOF,
//! replication, `DUMP`/`RESTORE` and slot migration from Redis as they are.
//!
//! Layout, version 1: the three bytes `FBX`, one byte of encoding version,
//! then the payload (the domain state's own encoding). A reader refuses a
//! string without the header (the key belongs to something else) and a
//! newer version (a node runs an older module than the one that wrote it).
//!
//! The payload of version 1 is the domain's [`FuseState`] as JSON
//! (serde_json): the state embeds a policy spec whose durations read as
//! numbers or strings, so it needs a self-describing format. The JSON is
//! deterministic (tickets by id, waiters in order, no maps), so a replica
//! or an AOF replay that runs the same command writes the same bytes.

use std::fmt;

use fusebox_domain::{Fuse, FuseState};

/// The first bytes of every value the module writes.
pub const MAGIC: &[u8; 3] = b"FBX";

/// The encoding this module writes and the newest it reads.
pub const ENCODING_VERSION: u8 = 1;

/// Why a string value is not readable as fusebox state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StateError {
    /// The value does not start with the fusebox header.
    NotFusebox,
    /// The value was written by a newer module, with this encoding version.
    NewerEncoding(u8),
    /// The header is fusebox's but the payload is not a state the domain
    /// accepts (damaged JSON, or a state it could not have produced).
    Damaged(String),
}

impl fmt::Display for StateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StateError::NotFusebox => write!(
                f,
                "state: the key holds a string that is not fusebox state; \
                 use another key for fusebox, or delete this one"
            ),
            StateError::NewerEncoding(v) => write!(
                f,
                "state: the key holds fusebox state of encoding {v}, newer than this \
                 module's {ENCODING_VERSION}; load the same module version on every node"
            ),
            StateError::Damaged(why) => write!(
                f,
                "state: the key holds damaged fusebox state ({why}); \
                 delete the key to start it afresh"
            ),
        }
    }
}

impl std::error::Error for StateError {}

/// The value to store: the header, then `payload`.
pub fn encode(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(MAGIC.len() + 1 + payload.len());
    out.extend_from_slice(MAGIC);
    out.push(ENCODING_VERSION);
    out.extend_from_slice(payload);
    out
}

/// The payload of a stored value, with the encoding version it was written in.
pub fn decode(value: &[u8]) -> Result<(u8, &[u8]), StateError> {
    let rest = value.strip_prefix(MAGIC).ok_or(StateError::NotFusebox)?;
    let (&version, payload) = rest.split_first().ok_or(StateError::NotFusebox)?;
    match version {
        0 => Err(StateError::NotFusebox),
        v if v > ENCODING_VERSION => Err(StateError::NewerEncoding(v)),
        v => Ok((v, payload)),
    }
}

/// The value to store for `fuse`: the header, then its [`FuseState`] as JSON.
/// Notices still in the fuse are kept; the commands drain them first.
pub fn encode_fuse(fuse: &Fuse) -> Vec<u8> {
    let json = serde_json::to_vec(&fuse.state())
        .expect("a FuseState always serializes: plain data, string keys only");
    encode(&json)
}

/// The fuse a stored value holds, checked by [`Fuse::from_state`].
pub fn decode_fuse(value: &[u8]) -> Result<Fuse, StateError> {
    let (_version, payload) = decode(value)?;
    let state: FuseState =
        serde_json::from_slice(payload).map_err(|e| StateError::Damaged(e.to_string()))?;
    Fuse::from_state(state).map_err(|e| StateError::Damaged(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_decodes_to_what_was_encoded() {
        assert_eq!(decode(&encode(b"")), Ok((ENCODING_VERSION, &b""[..])));
        assert_eq!(
            decode(&encode(b"\x00state\xff")),
            Ok((ENCODING_VERSION, &b"\x00state\xff"[..]))
        );
    }

    #[test]
    fn foreign_and_newer_values_are_refused_with_a_reason() {
        assert_eq!(decode(b""), Err(StateError::NotFusebox));
        assert_eq!(decode(b"FBX"), Err(StateError::NotFusebox));
        assert_eq!(decode(b"FBX\x00"), Err(StateError::NotFusebox));
        assert_eq!(decode(b"hello"), Err(StateError::NotFusebox));
        assert_eq!(decode(b"FBX\x02x"), Err(StateError::NewerEncoding(2)));
        assert!(StateError::NewerEncoding(2)
            .to_string()
            .starts_with("state: "));
    }

    #[test]
    fn a_fuse_round_trips_through_its_stored_value() {
        use fusebox_domain::{Ask, PolicySpec, TicketId};
        let spec: PolicySpec = serde_json::from_str(
            r#"{"breaker":{"mode":"ratio","failure_ratio":0.1,"minimum_throughput":3,
                "sampling_window":"10s","break":"1s","multiplier":1.7},
                "limiter":{"kind":"concurrency","permits":2,"queue_limit":2}}"#,
        )
        .unwrap();
        let mut fuse = Fuse::new(spec.validate().unwrap(), 5);
        fuse.acquire(&Ask::default(), TicketId(7), 10).unwrap();
        let value = encode_fuse(&fuse);
        assert!(value.starts_with(b"FBX\x01{"));
        let back = decode_fuse(&value).unwrap();
        assert_eq!(back, fuse);
        assert_eq!(encode_fuse(&back), value);
    }

    #[test]
    fn a_damaged_payload_is_refused_naming_the_state() {
        for value in [&b"FBX\x01"[..], b"FBX\x01{}", b"FBX\x01not json"] {
            let Err(StateError::Damaged(_)) = decode_fuse(value) else {
                panic!("{value:?} must be refused as damaged");
            };
        }
        let e = decode_fuse(b"FBX\x01{}").unwrap_err().to_string();
        assert!(
            e.starts_with("state: ") && e.contains("delete the key"),
            "{e}"
        );
    }
}

//! Policies as the module knows them: parsed and validated once, kept by
//! id, so that no JSON is parsed on the hot path.
//!
//! A policy's id is the first 16 bytes of the SHA-256 of its JSON (as the
//! servers write it). A command names the policy either by its JSON (which
//! the module hashes, and parses only the first time it sees that id) or
//! as `@` and the id in 32 hex digits; an id the node does not know is
//! refused with `NOPOLICY`, and the server sends the JSON instead. Every
//! value also holds its policy's JSON, so a key whose policy this node has
//! never seen (after a restart, a failover, a slot migration) is read all
//! the same.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use fusebox_domain::{Policy, PolicySpec};
use redis_module::RedisError;

/// The most policies a node keeps parsed; past it the cache starts afresh
/// (a fleet runs a handful of rules; this bounds what a stream of made-up
/// policies can hold).
pub const CACHE: usize = 4096;

/// A policy's id.
pub type PolicyId = [u8; 16];

/// A policy as the module knows it.
#[derive(Clone, Debug)]
pub struct Known {
    /// Its id.
    pub id: PolicyId,
    /// The policy, validated.
    pub policy: Arc<Policy>,
    /// Its JSON, as values hold it.
    pub json: Arc<[u8]>,
}

thread_local! {
    /// Redis runs every command and timer of the module on its main
    /// thread, so the cache needs no lock.
    static KNOWN: RefCell<HashMap<PolicyId, Known>> = RefCell::new(HashMap::new());
}

/// The id of a policy's JSON.
pub fn id_of(json: &[u8]) -> PolicyId {
    fusebox_domain::policy_id(json)
}

/// An id as the 32 hex digits commands send.
pub fn hex_of(id: &PolicyId) -> String {
    fusebox_domain::hex::encode(id)
}

fn cached(id: &PolicyId) -> Option<Known> {
    KNOWN.with(|k| k.borrow().get(id).cloned())
}

fn remember(known_policy: Known) -> Known {
    KNOWN.with(|k| {
        let mut map = k.borrow_mut();
        if map.len() >= CACHE {
            map.clear();
        }
        map.insert(known_policy.id, known_policy.clone());
    });
    known_policy
}

/// Parses and validates a policy's JSON; errors name the field, as the
/// contract's messages do.
pub fn parse(json: &[u8]) -> Result<Policy, String> {
    let spec: PolicySpec = serde_json::from_slice(json).map_err(|e| {
        format!(
            "policy: not a policy as JSON ({e}); send the key's policy as an object \
             with breaker, limiter and lease, as the config writes it"
        )
    })?;
    spec.validate().map_err(|e| format!("policy.{e}"))
}

/// The policy whose JSON is `json` (parsed the first time its id is seen).
pub fn of_json(json: &[u8]) -> Result<Known, String> {
    let id = id_of(json);
    if let Some(k) = cached(&id) {
        return Ok(k);
    }
    let policy = parse(json)?;
    Ok(remember(Known {
        id,
        policy: Arc::new(policy),
        json: Arc::from(json),
    }))
}

/// The policy a value holds: by its id when known, else from its JSON.
pub fn of_value(id: &PolicyId, json: &[u8]) -> Result<Known, String> {
    if let Some(k) = cached(id) {
        return Ok(k);
    }
    let policy = parse(json)?;
    Ok(remember(Known {
        id: *id,
        policy: Arc::new(policy),
        json: Arc::from(json),
    }))
}

/// The `policy` argument of a command: the policy's JSON, or `@` and its
/// id in 32 hex digits (refused with `NOPOLICY` when this node does not
/// know that id).
pub fn of_arg(arg: &[u8]) -> Result<Known, RedisError> {
    if let Some(hex) = arg.strip_prefix(b"@") {
        let id = parse_id(hex).ok_or(RedisError::Str(
            "ERR policy: @ must be followed by a policy id of 32 hex digits",
        ))?;
        return cached(&id).ok_or_else(|| {
            RedisError::String(format!(
                "NOPOLICY policy: {} is not known on this node; send the policy's JSON",
                hex_of(&id)
            ))
        });
    }
    of_json(arg).map_err(|e| RedisError::String(format!("ERR {e}")))
}

/// An id from its 32 hex digits, in either case.
fn parse_id(hex: &[u8]) -> Option<PolicyId> {
    let mut id = [0u8; 16];
    fusebox_domain::hex::decode_to_slice(hex, &mut id).ok()?;
    Some(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_is_known_by_the_id_of_its_json() {
        let json = br#"{"breaker":{"mode":"consecutive","failures":3,"break":"1s"}}"#;
        let k = of_json(json).unwrap();
        assert_eq!(k.id, id_of(json));
        let by_id = of_arg(format!("@{}", hex_of(&k.id)).as_bytes()).unwrap();
        assert!(Arc::ptr_eq(&by_id.policy, &k.policy), "parsed once");
        let unknown = of_arg(format!("@{}", "0".repeat(32)).as_bytes()).unwrap_err();
        assert!(format!("{unknown:?}").contains("NOPOLICY"));
        assert!(of_arg(format!("@{}", "g".repeat(32)).as_bytes()).is_err());
        let upper = of_arg(format!("@{}", hex_of(&k.id).to_uppercase()).as_bytes()).unwrap();
        assert_eq!(upper.id, k.id, "either case");
        let bad = of_json(br#"{"breaker":{"mode":"consecutive","failures":0,"break":"1s"}}"#);
        assert!(bad.unwrap_err().starts_with("policy.breaker"));
    }
}

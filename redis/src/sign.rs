//! Notices the servers can trust: every message the module publishes is
//! signed with HMAC-SHA256 under the fleet's secret, so that a peer that
//! can reach Redis (and PUBLISH) cannot forge a transition in a watcher's
//! stream or an answer to a waiting caller.
//!
//! The secret is read once, when the module loads, from the file named by
//! its `secret-file` argument (`--loadmodule libfusebox_redis.so
//! secret-file /etc/fusebox/notices.key`); the fusebox servers read the
//! same file (`--store-secret-file`). Without one, messages go unsigned and
//! `FB.VERSION` says so, so that a server configured with a secret refuses
//! to start against this node.
//!
//! A signed message is the MAC in 64 lower-case hex digits, a space, and
//! the payload; the MAC covers the channel's name, a newline, and the
//! payload, so a message signed for one channel is refused on another
//! (the envelope is the wire's: [`wire::seal`], [`wire::signed_parts`]).

use std::sync::OnceLock;

use fusebox_domain::wire;
use hmac::{Hmac, Mac};
use sha2::Sha256;

static SECRET: OnceLock<Option<Vec<u8>>> = OnceLock::new();

/// The fewest bytes a secret may have.
pub const MIN_SECRET: usize = 16;

/// Sets the secret from the module's load arguments, once: `secret-file
/// PATH`. Returns a message for the log.
pub fn configure(args: &[Vec<u8>]) -> Result<String, String> {
    let mut file = None;
    let mut rest = args.iter();
    while let Some(name) = rest.next() {
        match name.as_slice() {
            b"secret-file" => {
                let path = rest.next().ok_or("secret-file needs a path after it")?;
                file = Some(String::from_utf8_lossy(path).into_owned());
            }
            other => {
                return Err(format!(
                    "{:?} is not an argument of the fusebox module; it takes secret-file PATH",
                    String::from_utf8_lossy(other)
                ))
            }
        }
    }
    let secret = match &file {
        Some(path) => Some(read_secret(path)?),
        None => None,
    };
    let said = match &secret {
        Some(_) => format!(
            "notices are signed with the secret in {}",
            file.as_deref().unwrap_or_default()
        ),
        None => "notices are not signed (no secret-file): any client of this Redis can forge them"
            .to_owned(),
    };
    let _ = SECRET.set(secret);
    Ok(said)
}

/// Reads a secret: the file's bytes without surrounding whitespace, at
/// least [`MIN_SECRET`] of them.
pub fn read_secret(path: &str) -> Result<Vec<u8>, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("secret-file {path}: {e}"))?;
    let trimmed = bytes.trim_ascii();
    if trimmed.len() < MIN_SECRET {
        return Err(format!(
            "secret-file {path}: holds {} bytes; a secret needs at least {MIN_SECRET} (for example 32 random bytes in hex)",
            trimmed.len()
        ));
    }
    Ok(trimmed.to_vec())
}

fn secret() -> Option<&'static [u8]> {
    SECRET.get().and_then(|s| s.as_deref())
}

/// The MAC of `payload` on `channel` under `secret` (over
/// [`wire::signed_parts`]).
pub fn mac(secret: &[u8], channel: &str, payload: &[u8]) -> [u8; wire::MAC_BYTES] {
    let mut m = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes any key length");
    for part in wire::signed_parts(channel, payload) {
        m.update(part);
    }
    m.finalize().into_bytes().into()
}

/// What to publish for `payload` on `channel`: signed when a secret is set
/// ([`wire::seal`]).
pub fn seal(channel: &str, payload: &str) -> String {
    match secret() {
        Some(secret) => wire::seal(&mac(secret, channel, payload.as_bytes()), payload),
        None => payload.to_owned(),
    }
}

/// A fingerprint of `secret`, which a server compares with its own
/// (it says nothing of the secret itself).
pub fn fingerprint_of(secret: &[u8]) -> String {
    let (channel, payload) = wire::FINGERPRINT_OF;
    wire::fingerprint(&mac(secret, channel, payload))
}

/// This node's fingerprint, or `None` without a secret.
pub fn fingerprint() -> Option<String> {
    secret().map(fingerprint_of)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mac_binds_the_channel_and_the_payload() {
        let k = b"0123456789abcdef";
        let a = mac(k, "fusebox:answers", b"{}");
        assert_ne!(a, mac(k, "fusebox:events", b"{}"));
        assert_ne!(a, mac(k, "fusebox:answers", b"{ }"));
        assert_ne!(a, mac(b"0123456789abcdeF", "fusebox:answers", b"{}"));
        // The same MAC and fingerprint as the servers compute
        // (src/engine/redis/sign.rs checks these very values).
        assert_eq!(
            wire::seal(&a, "{}"),
            "639d0a93b48492f1788f46c61d1878770ae0ddc0306b53713202efb96e02d9ec {}"
        );
        assert_eq!(fingerprint_of(k), "08c2720d49dc191e");
    }
}

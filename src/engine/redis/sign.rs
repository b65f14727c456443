//! The fleet's secret for what travels through Redis: the module signs
//! the notices it publishes (`redis/src/sign.rs`), and every server
//! verifies them, and signs and verifies the shared policies it writes.
//! The envelope is the wire's ([`wire::seal`]): the HMAC-SHA256 of the
//! channel's name (or the Redis key's), a newline and the payload, in 64
//! lower-case hex digits, a space, then the payload.

use std::sync::Arc;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::domain::wire;

/// The fewest bytes a secret may have (as the module requires).
pub const MIN_SECRET: usize = 16;

/// The fleet's secret for signed notices. It never prints; its
/// fingerprint says nothing of it.
#[derive(Clone, PartialEq, Eq)]
pub struct NoticeKey(Arc<[u8]>);

impl std::fmt::Debug for NoticeKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NoticeKey({})", self.fingerprint())
    }
}

impl NoticeKey {
    /// A key of these bytes, at least `MIN_SECRET` of them.
    pub fn new(secret: &[u8]) -> Result<NoticeKey, String> {
        if secret.len() < MIN_SECRET {
            return Err(format!(
                "holds {} bytes; a secret needs at least {MIN_SECRET} (for example 32 random bytes in hex: openssl rand -hex 32)",
                secret.len()
            ));
        }
        Ok(NoticeKey(secret.into()))
    }

    /// Reads a secret as the module does: the file's bytes without the
    /// whitespace around them. `what` names the flag in messages.
    pub fn read(what: &str, path: &std::path::Path) -> Result<NoticeKey, String> {
        let bytes = std::fs::read(path).map_err(|e| {
            format!(
                "{what} {}: cannot be read ({e}); give the file the module loads with secret-file",
                path.display()
            )
        })?;
        NoticeKey::new(bytes.trim_ascii()).map_err(|e| format!("{what} {}: {e}", path.display()))
    }

    fn mac(&self, channel: &str, payload: &[u8]) -> Hmac<Sha256> {
        let mut m = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes any key length");
        for part in wire::signed_parts(channel, payload) {
            m.update(part);
        }
        m
    }

    /// `payload` signed for `channel` (or for the key of that name).
    pub fn seal(&self, channel: &str, payload: &str) -> String {
        let tag = self
            .mac(channel, payload.as_bytes())
            .finalize()
            .into_bytes();
        wire::seal(&tag.into(), payload)
    }

    /// The payload of `message` on `channel` when its MAC is this key's;
    /// otherwise why not.
    pub fn open<'a>(&self, channel: &str, message: &'a [u8]) -> Result<&'a [u8], &'static str> {
        let (tag, payload) = wire::unseal(message)?;
        self.mac(channel, payload)
            .verify_slice(&tag)
            .map_err(|_| "signed with another secret, or altered")?;
        Ok(payload)
    }

    /// The fingerprint `FB.VERSION` reports for this secret
    /// ([`wire::fingerprint`]).
    pub fn fingerprint(&self) -> String {
        let (channel, payload) = wire::FINGERPRINT_OF;
        wire::fingerprint(&self.mac(channel, payload).finalize().into_bytes().into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::wire::Channel;

    #[test]
    fn notices_are_signed_and_opened_as_the_module_signs_them() {
        let key = NoticeKey::new(b"0123456789abcdef").unwrap();
        let (answers, events) = (Channel::Answers.as_str(), Channel::Events.as_str());
        // HMAC-SHA256 over "fusebox:answers\n{}", as redis/src/sign.rs
        // makes it (its test checks the same values).
        let sealed = key.seal(answers, "{}");
        assert_eq!(
            sealed,
            "639d0a93b48492f1788f46c61d1878770ae0ddc0306b53713202efb96e02d9ec {}"
        );
        assert_eq!(key.fingerprint(), "08c2720d49dc191e");
        assert_eq!(key.open(answers, sealed.as_bytes()), Ok(&b"{}"[..]));
        assert!(
            key.open(events, sealed.as_bytes()).is_err(),
            "another channel"
        );
        assert!(key.open(answers, b"{}").is_err(), "unsigned");
        let mut altered = sealed.clone().into_bytes();
        altered.push(b' ');
        assert!(key.open(answers, &altered).is_err(), "altered");
        let other = NoticeKey::new(b"0123456789abcdeF").unwrap();
        assert!(
            other.open(answers, sealed.as_bytes()).is_err(),
            "another key"
        );
        let upper = sealed.to_uppercase();
        assert!(
            key.open(answers, upper.as_bytes()).is_err(),
            "hex is lower case"
        );
        assert!(NoticeKey::new(b"short").is_err());
        assert!(!format!("{key:?}").contains("0123"), "{key:?}");
    }
}

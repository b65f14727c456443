//! What the module publishes, heard by every server: answers for waiting
//! callers (`fusebox:answers`), phase changes for watchers
//! (`fusebox:events`) and policy changes (`fusebox:policies`). PUBLISH in
//! Redis Cluster reaches every node, so one subscription on any node hears
//! all of it; when that node goes away the server subscribes on the next
//! one, with backoff.
//!
//! With a secret (`--store-secret-file`, the file the module loads with
//! `secret-file`), every message is verified before it is acted on, as the
//! module signs it (`redis/src/sign.rs`, the reference): the HMAC-SHA256
//! of the channel's name, a newline and the payload, in 64 lower-case hex
//! digits, a space, then the payload. One that does not verify is dropped,
//! counted and logged ([`super::conn::StoreFigures::dropped`]).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::Sha256;
use tokio_stream::StreamExt;

use super::super::events::{Event, EventKind};
use super::reply::{published_answer, view_of};
use super::{RedisStore, KEY_PREFIX};
use crate::domain::hex::{hex, unhex};
use crate::domain::{Cause, Phase};

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
    /// A key of these bytes, at least [`MIN_SECRET`] of them.
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
        m.update(channel.as_bytes());
        m.update(b"\n");
        m.update(payload);
        m
    }

    /// `payload` signed for `channel` (or for the key of that name).
    pub fn seal(&self, channel: &str, payload: &str) -> String {
        let tag = self
            .mac(channel, payload.as_bytes())
            .finalize()
            .into_bytes();
        format!("{} {payload}", hex(&tag))
    }

    /// The payload of `message` on `channel` when its MAC is this key's;
    /// otherwise why not.
    pub fn open<'a>(&self, channel: &str, message: &'a [u8]) -> Result<&'a [u8], &'static str> {
        if message.len() < 65 || message[64] != b' ' {
            return Err("not signed");
        }
        let (tag, payload) = (&message[..64], &message[65..]);
        let tag = unhex(tag).ok_or("not signed")?;
        self.mac(channel, payload)
            .verify_slice(&tag)
            .map_err(|_| "signed with another secret, or altered")?;
        Ok(payload)
    }

    /// The fingerprint `FB.VERSION` reports for this secret: the first 16
    /// hex digits of the MAC of `fingerprint` on `fusebox`.
    pub fn fingerprint(&self) -> String {
        let tag = self.mac("fusebox", b"fingerprint").finalize().into_bytes();
        hex(&tag)[..16].to_owned()
    }
}

/// What to act on in `message` heard on `channel`: its payload, verified
/// when the store has a key; `None` (counted and logged) when it does not
/// verify.
pub(super) fn trusted<'a>(
    store: &RedisStore,
    channel: &str,
    message: &'a [u8],
) -> Option<&'a [u8]> {
    match &store.notices {
        None => Some(message),
        Some(key) => match key.open(channel, message) {
            Ok(payload) => Some(payload),
            Err(why) => {
                store.conn.figures().dropped(Some(channel), why);
                None
            }
        },
    }
}

/// The channel of waiters' answers.
pub const ANSWERS: &str = "fusebox:answers";
/// The channel of phase changes.
pub const EVENTS: &str = "fusebox:events";
/// The channel that says the shared policies changed.
pub const POLICIES: &str = "fusebox:policies";

const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const LAST_BACKOFF: Duration = Duration::from_secs(5);

/// Listens until the server stops, resubscribing whenever the connection
/// is lost. `ready` is told once the first subscription holds.
pub async fn listen(store: Arc<RedisStore>, ready: tokio::sync::oneshot::Sender<()>) {
    let mut ready = Some(ready);
    let mut backoff = FIRST_BACKOFF;
    let stopping = store.core().stopped();
    tokio::pin!(stopping);
    let nodes = store.url().nodes.clone();
    let mut at = 0;
    loop {
        let node = &nodes[at % nodes.len()];
        at += 1;
        let heard = tokio::select! {
            () = &mut stopping => return,
            heard = subscribe(&store, node, &mut ready) => heard,
        };
        match heard {
            Ok(()) => {
                tracing::warn!(
                    node,
                    "lost the subscription to the store's answers and events; subscribing again"
                );
                backoff = FIRST_BACKOFF;
            }
            Err(e) => {
                let e = store.conn.reach().scrub(&e);
                tracing::warn!(node, "cannot subscribe to the store's answers and events: {e}; trying again in {backoff:?}");
                tokio::select! {
                    () = &mut stopping => return,
                    () = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(LAST_BACKOFF);
            }
        }
    }
}

/// One subscription, until its connection ends.
async fn subscribe(
    store: &Arc<RedisStore>,
    node: &str,
    ready: &mut Option<tokio::sync::oneshot::Sender<()>>,
) -> redis::RedisResult<()> {
    let client = store.conn.reach().client(node)?;
    let mut pubsub = tokio::time::timeout(Duration::from_secs(2), client.get_async_pubsub())
        .await
        .map_err(|_| redis::RedisError::from((redis::ErrorKind::Io, "timed out connecting")))??;
    pubsub.subscribe(&[ANSWERS, EVENTS, POLICIES]).await?;
    store
        .figures_of_connection()
        .subscriptions
        .fetch_add(1, Ordering::Relaxed);
    if let Some(ready) = ready.take() {
        let _ = ready.send(());
    } else {
        // Messages may have been missed while away: the policies are read
        // again; waiters ask the store when their wait ends.
        super::policies::load(store).await;
    }
    let mut messages = pubsub.into_on_message();
    while let Some(message) = messages.next().await {
        let channel = message.get_channel_name();
        let Some(payload) = trusted(store, channel, message.get_payload_bytes()) else {
            continue;
        };
        match channel {
            ANSWERS => {
                if let Some((key, waiter, answer)) = published_answer(payload) {
                    store.deliver(&key, waiter, answer);
                }
            }
            EVENTS => {
                if let Some(event) = event_of(payload) {
                    tracing::info!(key = %event.key, from = %event.from, to = %event.to, at_ms = event.at, "breaker {} -> {}: {}", event.from, event.to, event.cause);
                    store.heard_transition();
                    store.core().publish(|| vec![event]);
                }
            }
            POLICIES => super::policies::load(store).await,
            _ => {}
        }
    }
    Ok(())
}

/// A published phase change as a watcher's event.
fn event_of(message: &[u8]) -> Option<Event> {
    let m: serde_json::Value = serde_json::from_slice(message).ok()?;
    let s = |f: &str| m.get(f).and_then(|v| v.as_str());
    let phase = |f: &str| {
        let name = s(f)?;
        [Phase::Closed, Phase::Open, Phase::HalfOpen, Phase::Isolated]
            .into_iter()
            .find(|p| p.as_str().eq_ignore_ascii_case(name))
    };
    let key = s("key")?.strip_prefix(KEY_PREFIX)?;
    let words = s("cause")?;
    let cause = [
        Cause::Tripped,
        Cause::ProbeAdmitted,
        Cause::ProbeSucceeded,
        Cause::ProbeFailed,
        Cause::Isolated,
        Cause::Closed,
        Cause::PolicyChanged,
    ]
    .into_iter()
    .find(|c| {
        c.as_str() == words
            || serde_json::to_value(c)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                == Some(words.to_owned())
    })?;
    let kind = match cause {
        Cause::Isolated => EventKind::Isolate,
        Cause::Closed => EventKind::Close,
        Cause::PolicyChanged => EventKind::Policy,
        _ => EventKind::PhaseChange,
    };
    let operator = matches!(kind, EventKind::Isolate | EventKind::Close);
    let (view, _) = view_of(m.get("view")?)?;
    Some(Event {
        key: Arc::from(key),
        kind,
        from: phase("from")?,
        to: phase("to")?,
        cause: cause.as_str(),
        who: if operator {
            s("who").unwrap_or_default().to_owned()
        } else {
            String::new()
        },
        reason: if operator {
            s("why").unwrap_or_default().to_owned()
        } else {
            String::new()
        },
        at: m.get("at_ms")?.as_u64()?,
        sequence: 0,
        view,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notices_are_signed_and_opened_as_the_module_signs_them() {
        let key = NoticeKey::new(b"0123456789abcdef").unwrap();
        // HMAC-SHA256 over "fusebox:answers\n{}", as redis/src/sign.rs
        // makes it (the same construction, computed elsewhere).
        let sealed = key.seal(ANSWERS, "{}");
        assert_eq!(
            sealed,
            "639d0a93b48492f1788f46c61d1878770ae0ddc0306b53713202efb96e02d9ec {}"
        );
        assert_eq!(key.fingerprint(), "08c2720d49dc191e");
        assert_eq!(key.open(ANSWERS, sealed.as_bytes()), Ok(&b"{}"[..]));
        assert!(
            key.open(EVENTS, sealed.as_bytes()).is_err(),
            "another channel"
        );
        assert!(key.open(ANSWERS, b"{}").is_err(), "unsigned");
        let mut altered = sealed.clone().into_bytes();
        altered.push(b' ');
        assert!(key.open(ANSWERS, &altered).is_err(), "altered");
        let other = NoticeKey::new(b"0123456789abcdeF").unwrap();
        assert!(
            other.open(ANSWERS, sealed.as_bytes()).is_err(),
            "another key"
        );
        let upper = sealed.to_uppercase();
        assert!(
            key.open(ANSWERS, upper.as_bytes()).is_err(),
            "hex is lower case"
        );
        assert!(NoticeKey::new(b"short").is_err());
        assert!(!format!("{key:?}").contains("0123"), "{key:?}");
    }
}

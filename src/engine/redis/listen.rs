//! What the module publishes, heard by every server: answers for waiting
//! callers ([`Channel::Answers`]), phase changes for watchers
//! ([`Channel::Events`]) and policy changes ([`Channel::Policies`]).
//! PUBLISH in Redis Cluster reaches every node, so one subscription on any
//! node hears all of it; when that node goes away the server subscribes on
//! the next one, with backoff.
//!
//! With a secret (`--store-secret-file`, the file the module loads with
//! `secret-file`), every message is verified before it is acted on, as the
//! module signs it ([`super::sign`]). One that does not verify is dropped,
//! counted and logged ([`StoreFigures::dropped`]). What verifies is read
//! as the wire's types ([`crate::domain::wire`]) and handed to the store
//! as [`Heard`]: this file knows nothing of what the store does with it.
//!
//! An event that verifies is also refused when it is not newer than the
//! last one of its key, or too old ([`super::replays`]); a policy change
//! names the version it wrote, which the shared rules compare with theirs
//! ([`super::policies`]). Those are counted and logged as replays
//! ([`StoreFigures::replayed`]).
//!
//! [`StoreFigures::dropped`]: super::super::store::StoreFigures::dropped
//! [`StoreFigures::replayed`]: super::super::store::StoreFigures::replayed

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio_stream::StreamExt;

use super::super::events::{event_of, Event};
use super::conn::Conn;
use super::keys::KEY_PREFIX;
use super::replays::{LastSeen, Refusal};
use super::sign::NoticeKey;
use crate::domain::wire::{Answer, AnswerNotice, Channel, NoticeOrder, PhaseNotice};
use crate::domain::{Millis, Notice, TicketId};

const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const LAST_BACKOFF: Duration = Duration::from_secs(5);

/// What a subscription hears, verified and read.
#[derive(Debug)]
pub(super) enum Heard {
    /// A waiter's final answer.
    Answer {
        /// The Redis key it waited at.
        key: String,
        /// The waiter.
        waiter: TicketId,
        /// The answer.
        answer: Answer,
    },
    /// A breaker's phase change, as a watcher's event.
    Event(Box<Ordered>),
    /// The shared policies changed, or may have: a message about them,
    /// with the version it names (none from a server older than this
    /// one), or a subscription made again after a loss (messages may
    /// have been missed meanwhile).
    Policies(Option<u64>),
}

/// A watcher's event with what tells whether it is news: the Redis key it
/// happened at and its place in that key's sequence.
#[derive(Debug)]
pub(super) struct Ordered {
    /// The event.
    pub event: Event,
    /// The Redis key.
    pub store_key: String,
    /// Its order, signed with it (none from an older module).
    pub order: Option<NoticeOrder>,
}

/// Where and how to subscribe.
pub(super) struct Subscriber {
    /// The store's connection: how links are made, and its figures.
    pub conn: Conn,
    /// The nodes to subscribe on, in turn.
    pub nodes: Vec<String>,
    /// The fleet's secret, if it has one.
    pub notices: Option<NoticeKey>,
    /// This server's clock (ms), to tell how old an event is.
    pub clock: Arc<dyn Fn() -> Millis + Send + Sync>,
}

/// Listens until `stopping` ends, resubscribing whenever the connection
/// is lost. `ready` is told once the first subscription holds; `heard` is
/// given every message that verifies and reads, in order.
pub(super) async fn listen<F, Fut>(
    sub: Subscriber,
    stopping: impl Future<Output = ()>,
    ready: oneshot::Sender<()>,
    mut heard: F,
) where
    F: FnMut(Heard) -> Fut,
    Fut: Future<Output = ()>,
{
    let mut ready = Some(ready);
    let mut seen = LastSeen::default();
    let mut backoff = FIRST_BACKOFF;
    tokio::pin!(stopping);
    let mut at = 0;
    loop {
        let node = &sub.nodes[at % sub.nodes.len()];
        at += 1;
        let result = tokio::select! {
            () = &mut stopping => return,
            result = subscribe(&sub, node, &mut ready, &mut seen, &mut heard) => result,
        };
        match result {
            Ok(()) => {
                tracing::warn!(
                    node,
                    "lost the subscription to the store's answers and events; subscribing again"
                );
                backoff = FIRST_BACKOFF;
            }
            Err(e) => {
                let e = sub.conn.reach().scrub(&e);
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
async fn subscribe<F, Fut>(
    sub: &Subscriber,
    node: &str,
    ready: &mut Option<oneshot::Sender<()>>,
    seen: &mut LastSeen,
    heard: &mut F,
) -> redis::RedisResult<()>
where
    F: FnMut(Heard) -> Fut,
    Fut: Future<Output = ()>,
{
    let client = sub.conn.reach().client(node)?;
    let mut pubsub = tokio::time::timeout(Duration::from_secs(2), client.get_async_pubsub())
        .await
        .map_err(|_| redis::RedisError::from((redis::ErrorKind::Io, "timed out connecting")))??;
    let channels = Channel::ALL.map(Channel::as_str);
    pubsub.subscribe(&channels).await?;
    sub.conn
        .figures()
        .subscriptions
        .fetch_add(1, Ordering::Relaxed);
    if let Some(ready) = ready.take() {
        let _ = ready.send(());
    } else {
        // Messages may have been missed while away: the policies are read
        // again; waiters ask the store when their wait ends.
        heard(Heard::Policies(None)).await;
    }
    let mut messages = pubsub.into_on_message();
    while let Some(message) = messages.next().await {
        let Ok(channel) = message.get_channel_name().parse::<Channel>() else {
            continue;
        };
        let Some(payload) = trusted(sub, channel, message.get_payload_bytes()) else {
            continue;
        };
        if let Some(h) = read(channel, payload) {
            if let Heard::Event(e) = &h {
                if !fresh(sub, seen, e) {
                    continue;
                }
            }
            heard(h).await;
        }
    }
    Ok(())
}

/// What to act on in `message` heard on `channel`: its payload, verified
/// when the store has a key; `None` (counted and logged) when it does not
/// verify.
fn trusted<'a>(sub: &Subscriber, channel: Channel, message: &'a [u8]) -> Option<&'a [u8]> {
    match &sub.notices {
        None => Some(message),
        Some(key) => match key.open(channel.as_str(), message) {
            Ok(payload) => Some(payload),
            Err(why) => {
                sub.conn.figures().dropped(Some(channel), why);
                None
            }
        },
    }
}

/// True when the event `e` is newer than the last one of its key and
/// young enough ([`LastSeen::take`]); otherwise it is counted and logged.
/// Without a secret an event without its order is taken: anyone could
/// forge one anyway.
fn fresh(sub: &Subscriber, seen: &mut LastSeen, e: &Ordered) -> bool {
    let figures = sub.conn.figures();
    let taken = match (e.order, &sub.notices) {
        (Some(order), _) => seen.take(&e.store_key, order, (sub.clock)()),
        (None, Some(_)) => Err(Refusal::Unordered),
        (None, None) => return true,
    };
    match taken {
        Ok(kept) => {
            figures
                .event_orders
                .store(kept.keys as u64, Ordering::Relaxed);
            figures
                .event_orders_evicted
                .fetch_add(kept.evicted as u64, Ordering::Relaxed);
            true
        }
        Err(refusal) => {
            figures.replayed(
                Some(Channel::Events),
                &format!("{} at {}", refusal, e.event.key),
            );
            false
        }
    }
}

/// A verified message, read; `None` for one this server does not read.
fn read(channel: Channel, payload: &[u8]) -> Option<Heard> {
    match channel {
        Channel::Answers => {
            let notice: AnswerNotice = serde_json::from_slice(payload).ok()?;
            Some(Heard::Answer {
                key: notice.key,
                waiter: notice.waiter,
                answer: Answer::try_from(notice.answer).ok()?,
            })
        }
        Channel::Events => event(payload).map(|e| Heard::Event(Box::new(e))),
        Channel::Policies => Some(Heard::Policies(changed(payload))),
    }
}

/// The version a policy change names: `changed <version>`; none in a
/// server's message older than this one (`changed`).
fn changed(payload: &[u8]) -> Option<u64> {
    std::str::from_utf8(payload)
        .ok()?
        .strip_prefix("changed ")?
        .parse()
        .ok()
}

/// A published phase change as a watcher's event: who and why only for
/// an operator's isolate and close, as the embedded engine tells them.
fn event(payload: &[u8]) -> Option<Ordered> {
    let notice: PhaseNotice = serde_json::from_slice(payload).ok()?;
    let key: Arc<str> = Arc::from(notice.key.strip_prefix(KEY_PREFIX)?);
    let change = Notice::Phase {
        from: notice.from,
        to: notice.to,
        cause: notice.cause,
        at: notice.at_ms,
    };
    let who = notice.who.as_deref().unwrap_or_default();
    let why = notice.why.as_deref().unwrap_or_default();
    let event = event_of(
        &key,
        &change,
        &notice.view.view(),
        Some((who, why)),
        notice.shadow,
    )?;
    Some(Ordered {
        event,
        order: notice.order,
        store_key: notice.key,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{Cause, Phase};
    use crate::engine::EventKind;

    const VIEW: &str = r#"{"phase":"isolated","consecutive_failures":0,"half_open_attempts":0,"open_until":null,"free":0,"limit":0,"queued":0,"live_tickets":0,"waiters":0,"epoch":2,"failure_ratio":null,"changed_at":7,"last_now":7,"now_ms":7,"next_deadline":null,"stats":{}}"#;

    #[test]
    fn events_read_as_the_embedded_engine_tells_them() {
        let message = |cause: Cause, who: &str| {
            format!(
                r#"{{"key":"fusebox:k:w","from":"closed","to":"isolated","cause":"{}","at_ms":7,"who":"{who}","why":"maintenance","view":{VIEW}}}"#,
                cause.as_str()
            )
        };
        let Some(Heard::Event(e)) =
            read(Channel::Events, message(Cause::Isolated, "ops").as_bytes())
        else {
            panic!("not an event")
        };
        assert_eq!((e.store_key.as_str(), e.order), ("fusebox:k:w", None));
        let e = e.event;
        assert_eq!(&*e.key, "w");
        assert_eq!(
            (e.kind, e.from, e.to, e.at),
            (EventKind::Isolate, Phase::Closed, Phase::Isolated, 7)
        );
        assert_eq!((e.who.as_str(), e.reason.as_str()), ("ops", "maintenance"));
        assert_eq!(e.cause, Cause::Isolated.as_str());
        assert_eq!(e.view.epoch, 2);
        // Who and why belong to an operator's step only.
        let Some(Heard::Event(e)) =
            read(Channel::Events, message(Cause::Tripped, "ops").as_bytes())
        else {
            panic!("not an event")
        };
        let e = e.event;
        assert_eq!(
            (e.kind, e.who.as_str(), e.reason.as_str()),
            (EventKind::PhaseChange, "", "")
        );
        // A key outside fusebox's prefix, or a message that does not read.
        let other = message(Cause::Tripped, "x").replace("fusebox:k:w", "elsewhere");
        assert!(read(Channel::Events, other.as_bytes()).is_none());
        assert!(read(Channel::Events, b"not json").is_none());
        assert!(read(Channel::Answers, b"{}").is_none());
        assert!(matches!(
            read(Channel::Policies, b"changed"),
            Some(Heard::Policies(None))
        ));
        assert!(matches!(
            read(Channel::Policies, b"changed 12"),
            Some(Heard::Policies(Some(12)))
        ));
    }

    #[test]
    fn answers_name_their_waiter() {
        let m = br#"{"key":"fusebox:k:a","waiter":"ff","decision":"denied","reason":"timeout","ticket":null,"lease_ms":null,"retry_after_ms":null,"phase":"closed","now_ms":9}"#;
        let Some(Heard::Answer {
            key,
            waiter,
            answer,
        }) = read(Channel::Answers, m)
        else {
            panic!("not an answer")
        };
        assert_eq!((key.as_str(), waiter), ("fusebox:k:a", TicketId(0xff)));
        assert_eq!(
            answer.decision,
            crate::domain::Decision::Denied {
                reason: crate::domain::Reason::Timeout,
                retry_after: None
            }
        );
    }
}

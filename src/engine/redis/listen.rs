//! What the module publishes, heard by every server: answers for waiting
//! callers (`fusebox:answers`), phase changes for watchers
//! (`fusebox:events`) and policy changes (`fusebox:policies`). PUBLISH in
//! Redis Cluster reaches every node, so one subscription on any node hears
//! all of it; when that node goes away the server subscribes on the next
//! one, with backoff.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio_stream::StreamExt;

use super::super::events::{Event, EventKind};
use super::reply::{published_answer, view_of};
use super::{RedisStore, KEY_PREFIX};
use crate::domain::{Cause, Phase};

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
    let client = redis::Client::open(format!("redis://{node}"))?;
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
        let payload = message.get_payload_bytes();
        match message.get_channel_name() {
            ANSWERS => {
                if let Some((waiter, answer)) = published_answer(payload) {
                    store.deliver(waiter, answer);
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

//! What a step tells the fusebox servers: the domain's notices, published
//! on Redis pub/sub after the key is stored, signed ([`crate::sign`]).
//!
//! - `Notice::Answered` (a waiter's final answer) goes to
//!   [`ANSWERS`] as `{"key", "waiter", "decision", "reason", "ticket",
//!   "lease_ms", "retry_after_ms", "phase", "now_ms"}`;
//! - `Notice::Phase` (the breaker changed phase) goes to [`EVENTS`] as
//!   `{"key", "from", "to", "cause", "at_ms", "who", "why", "view"}`;
//! - `Notice::Expired` is not published (the key's stats count it).
//!
//! Only a primary that is not replaying publishes: a replica, and a
//! primary loading its AOF, apply the same bytes again and would publish
//! every message twice. Plain `PUBLISH`, which Redis Cluster broadcasts to
//! every node, so a server subscribed to any node hears every key.

use fusebox_domain::{Fuse, Millis, Notice, TicketTable};
use redis_module::{Context, ContextFlags};

use crate::keyed::Note;
use crate::reply::{parts, phase_name, view_json};
use crate::sign;

/// The channel of waiters' answers.
pub const ANSWERS: &str = "fusebox:answers";

/// The channel of breaker events (phase changes).
pub const EVENTS: &str = "fusebox:events";

/// True when this node is to publish: a primary, not running a command
/// from its primary or from its AOF.
pub fn may_publish(ctx: &Context) -> bool {
    let flags = ctx.get_flags();
    flags.contains(ContextFlags::MASTER)
        && !flags.contains(ContextFlags::REPLICATED)
        && !flags.contains(ContextFlags::LOADING)
}

/// The messages for `notices` at `key` (as `fuse` is at `now`), as
/// `(channel, signed message)` pairs in the order the notices came; none
/// when this node is not to publish.
pub fn messages<T: TicketTable>(
    ctx: &Context,
    key: &[u8],
    fuse: &Fuse<T>,
    now: Millis,
    notices: &[Notice],
    note: &Note,
) -> Vec<(&'static str, String)> {
    if notices.is_empty() || !may_publish(ctx) {
        return Vec::new();
    }
    payloads(&String::from_utf8_lossy(key), fuse, now, notices, note)
        .into_iter()
        .map(|(channel, payload)| (channel, sign::seal(channel, &payload)))
        .collect()
}

/// The payloads, unsigned.
pub fn payloads<T: TicketTable>(
    key: &str,
    fuse: &Fuse<T>,
    now: Millis,
    notices: &[Notice],
    note: &Note,
) -> Vec<(&'static str, String)> {
    let phase = phase_name(fuse.phase());
    let mut view = None;
    notices
        .iter()
        .filter_map(|notice| match notice {
            Notice::Answered { waiter, decision } => {
                let p = parts(decision, now);
                let json = serde_json::json!({
                    "key": key,
                    "waiter": waiter.to_string(),
                    "decision": p.decision,
                    "reason": p.reason,
                    "ticket": p.ticket.map(|t| t.to_string()),
                    "lease_ms": p.lease_ms,
                    "retry_after_ms": p.retry_after_ms,
                    "phase": phase,
                    "now_ms": now,
                });
                Some((ANSWERS, json.to_string()))
            }
            Notice::Phase {
                from,
                to,
                cause,
                at,
            } => {
                let view = view.get_or_insert_with(|| view_json(fuse, now)).clone();
                let json = serde_json::json!({
                    "key": key,
                    "from": phase_name(*from),
                    "to": phase_name(*to),
                    "cause": cause.as_str(),
                    "at_ms": at,
                    "who": note.who,
                    "why": note.why,
                    "view": view,
                });
                Some((EVENTS, json.to_string()))
            }
            Notice::Expired { .. } => None,
        })
        .collect()
}

/// Publishes `messages` (made by [`messages`]).
pub fn publish(ctx: &Context, messages: Vec<(&'static str, String)>) {
    for (channel, message) in messages {
        if let Err(e) = ctx.call("PUBLISH", &[channel, message.as_str()]) {
            ctx.log_warning(&format!("fusebox: PUBLISH to {channel} failed: {e}"));
        }
    }
}

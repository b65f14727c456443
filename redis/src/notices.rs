//! What a step tells the fusebox servers: the domain's notices, published
//! on Redis pub/sub after the key is stored, signed ([`crate::sign`]), as
//! the wire's types ([`fusebox_domain::wire`]) that the servers read.
//!
//! - `Notice::Answered` (a waiter's final answer) goes to
//!   [`Channel::Answers`] as an [`AnswerNotice`]: `{"key", "waiter",
//!   "decision", "reason", "ticket", "lease_ms", "retry_after_ms",
//!   "phase", "now_ms"}`;
//! - `Notice::Phase` (the breaker changed phase) goes to
//!   [`Channel::Events`] as a [`PhaseNotice`]: `{"key", "from", "to",
//!   "cause", "at_ms", "who", "why", "view", "order"}`, `order` being
//!   `{"now_ms", "seq"}` ([`NoticeOrder`]): the step's time and the
//!   breaker's epoch, so that a watcher can refuse a notice published
//!   again (nothing is kept for it: both are in the key's state already);
//! - `Notice::Expired` is not published (the key's stats count it).
//!
//! Only a primary that is not replaying publishes: a replica, and a
//! primary loading its AOF, apply the same bytes again and would publish
//! every message twice. Plain `PUBLISH`, which Redis Cluster broadcasts to
//! every node, so a server subscribed to any node hears every key.

use fusebox_domain::wire::{
    Answer, AnswerFields, AnswerNotice, Channel, KeyView, NoticeOrder, PhaseNotice,
};
use fusebox_domain::{Fuse, Millis, Notice, TicketTable};
use redis_module::{Context, ContextFlags};

use crate::sign;

/// Who asked for an operator's step, and why, for the events it causes.
#[derive(Clone, Debug, Default)]
pub struct Note {
    /// Who.
    pub who: Option<String>,
    /// Why.
    pub why: Option<String>,
}

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
) -> Vec<(Channel, String)> {
    if notices.is_empty() || !may_publish(ctx) {
        return Vec::new();
    }
    payloads(&String::from_utf8_lossy(key), fuse, now, notices, note)
        .into_iter()
        .map(|(channel, payload)| (channel, sign::seal(channel.as_str(), &payload)))
        .collect()
}

/// The payloads, unsigned.
pub fn payloads<T: TicketTable>(
    key: &str,
    fuse: &Fuse<T>,
    now: Millis,
    notices: &[Notice],
    note: &Note,
) -> Vec<(Channel, String)> {
    let phase = fuse.phase();
    let mut view = None;
    let told = notices
        .iter()
        .filter(|n| matches!(n, Notice::Phase { .. }))
        .count();
    let mut order = NoticeOrder::of_step(now, fuse.breaker().epoch(), told);
    notices
        .iter()
        .filter_map(|notice| {
            let (channel, json) = match *notice {
                Notice::Answered { waiter, decision } => {
                    let answer = Answer {
                        decision,
                        phase,
                        now,
                    };
                    let message = AnswerNotice {
                        key: key.to_owned(),
                        waiter,
                        answer: AnswerFields::from(&answer),
                    };
                    (Channel::Answers, serde_json::to_string(&message))
                }
                Notice::Phase {
                    from,
                    to,
                    cause,
                    at,
                } => {
                    let view = view.get_or_insert_with(|| KeyView::of(fuse, now)).clone();
                    let message = PhaseNotice {
                        key: key.to_owned(),
                        from,
                        to,
                        cause,
                        at_ms: at,
                        who: note.who.clone(),
                        why: note.why.clone(),
                        view,
                        shadow: !fuse.policy().enforce,
                        order: order.next(),
                    };
                    (Channel::Events, serde_json::to_string(&message))
                }
                Notice::Expired { .. } => return None,
            };
            // Plain data always serializes; a message that did not would
            // be one the servers could not read either.
            json.ok().map(|json| (channel, json))
        })
        .collect()
}

/// Publishes `messages` (made by [`messages`]).
pub fn publish(ctx: &Context, messages: Vec<(Channel, String)>) {
    for (channel, message) in messages {
        let channel = channel.as_str();
        if let Err(e) = ctx.call("PUBLISH", &[channel, message.as_str()]) {
            ctx.log_warning(&format!("fusebox: PUBLISH to {channel} failed: {e}"));
        }
    }
}

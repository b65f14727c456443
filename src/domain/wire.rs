//! What crosses between the Redis module (`fusebox-redis`) and the fusebox
//! servers that use it as their store: one type per reply, view and
//! notice, written by the module and read by the servers, so that a field
//! added is added for both sides.
//!
//! - [`Answer`]: a decision as `FB.ACQUIRE` (and `FB.SETTLE … WAITER`)
//!   answers it. Its seven fields ([`AnswerFields`]) are the array reply;
//!   [`Answer::write_packed`] and [`Answer::read_packed`] are the packed
//!   form (`REPLY packed`: one string, the fields separated by one space,
//!   `-` for nil), the one every acquire of a server costs, written without
//!   formatting machinery.
//! - [`Completion`]: `FB.COMPLETE`'s reply, packed likewise.
//! - [`KeyView`]: a key's view as JSON (`FB.GET`, `FB.ISOLATE`,
//!   `FB.CLOSE`, `FB.POLICY`, `FB.LIST`, `FB.CENSUS`, and inside events).
//! - [`AnswerNotice`] and [`PhaseNotice`]: what the module publishes on
//!   [`Channel::Answers`] and [`Channel::Events`], sealed in the signature
//!   envelope ([`seal`], [`unseal`]) when the fleet has a secret.
//! - [`CensusFigures`] and [`ModuleVersion`]: the labelled figures of
//!   `FB.CENSUS` and `FB.VERSION`.
//!
//! Names: every enum is written by its one `as_str` ([`crate::names`]),
//! and the module writes every name in lower case (its replies have
//! always done so: `granted`, `no_permits`, `half_open`); readers take any
//! case. Nothing here does I/O: the module turns these into Redis replies
//! and the servers read Redis replies into them.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use crate::decision::{Decision, DecisionKind, Grant};
use crate::fuse::{Cause, Fuse, Stats, TicketTable, View};
use crate::names::{self, Named, UnknownName};
use crate::policy::PolicySpec;
use crate::ticket::TicketId;
use crate::{Millis, Phase, Reason};

/// A reply, view or notice that is not what this side reads.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{what}: {problem}")]
pub struct WireError {
    /// The field, or the reply, at fault.
    pub what: &'static str,
    /// What is wrong with it.
    pub problem: String,
}

impl WireError {
    fn new(what: &'static str, problem: impl Into<String>) -> WireError {
        WireError {
            what,
            problem: problem.into(),
        }
    }

    fn missing(what: &'static str, kind: DecisionKind) -> WireError {
        WireError::new(
            what,
            format!("is missing, and a {} needs it", kind.as_str()),
        )
    }
}

impl From<UnknownName> for WireError {
    fn from(e: UnknownName) -> WireError {
        WireError::new(
            e.what,
            format!("{:?} is not one of {}", e.given, e.expected),
        )
    }
}

/// The pub/sub channels of a fleet on Redis.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Channel {
    /// Waiters' final answers ([`AnswerNotice`]), from the module.
    Answers,
    /// Breaker phase changes ([`PhaseNotice`]), from the module.
    Events,
    /// "The shared policies changed", from the servers to each other.
    Policies,
}

impl Channel {
    /// Every channel, in the order figures count them.
    pub const ALL: [Channel; 3] = [Channel::Answers, Channel::Events, Channel::Policies];

    /// The channel's name in Redis.
    pub const fn as_str(self) -> &'static str {
        match self {
            Channel::Answers => "fusebox:answers",
            Channel::Events => "fusebox:events",
            Channel::Policies => "fusebox:policies",
        }
    }

    /// The channel's place in [`Channel::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

names::named!(Channel, "channel");

/// How a command answers a decision (its `REPLY` option).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ReplyForm {
    /// An array of names and numbers (the default).
    #[default]
    Array,
    /// One string of the same fields, separated by spaces: what the
    /// servers ask for.
    Packed,
}

impl ReplyForm {
    /// Every form.
    pub const ALL: [ReplyForm; 2] = [ReplyForm::Array, ReplyForm::Packed];

    /// The form's name, as the `REPLY` option takes it.
    pub fn as_str(self) -> &'static str {
        match self {
            ReplyForm::Array => "array",
            ReplyForm::Packed => "packed",
        }
    }
}

names::named!(ReplyForm, "reply");

/// The longest name written in lower case without allocating.
const SHORT_NAME: usize = 64;

/// Calls `with` on `name` in lower case.
fn lowered<R>(name: &str, with: impl FnOnce(&str) -> R) -> R {
    if name.len() <= SHORT_NAME {
        let mut buf = [0u8; SHORT_NAME];
        let buf = &mut buf[..name.len()];
        buf.copy_from_slice(name.as_bytes());
        buf.make_ascii_lowercase();
        // Lower-casing ASCII letters keeps UTF-8 valid.
        with(std::str::from_utf8(buf).unwrap_or(name))
    } else {
        with(&name.to_ascii_lowercase())
    }
}

/// A phase's name as the module writes it (lower case).
pub fn phase_label(phase: Phase) -> String {
    phase.as_str().to_ascii_lowercase()
}

/// Serde for a [`Named`] field: its name in lower case, read in any case.
mod lower {
    use super::{lowered, Named};
    use serde::{de, Deserializer, Serializer};

    pub fn serialize<T: Named, S: Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
        lowered(v.name(), |name| s.serialize_str(name))
    }

    pub fn deserialize<'de, T: Named, D: Deserializer<'de>>(d: D) -> Result<T, D::Error> {
        struct Name<T>(std::marker::PhantomData<T>);
        impl<T: Named> de::Visitor<'_> for Name<T> {
            type Value = T;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a name")
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<T, E> {
                T::parse_name(text).map_err(E::custom)
            }
        }
        d.deserialize_str(Name(std::marker::PhantomData))
    }

    /// The same for an `Option`, `null` for `None`.
    pub mod option {
        use super::super::Named;
        use serde::{Deserialize, Deserializer, Serialize, Serializer};

        #[derive(Serialize, Deserialize)]
        #[serde(transparent)]
        struct Wrap<T: Named>(#[serde(with = "super")] T);

        pub fn serialize<T: Named, S: Serializer>(v: &Option<T>, s: S) -> Result<S::Ok, S::Error> {
            v.map(Wrap).serialize(s)
        }

        pub fn deserialize<'de, T: Named, D: Deserializer<'de>>(
            d: D,
        ) -> Result<Option<T>, D::Error> {
            Ok(Option::<Wrap<T>>::deserialize(d)?.map(|w| w.0))
        }
    }
}

/// A decision as the module answers it: the decision, the breaker's phase
/// after the step, and the time the step ran at (the store's clock).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Answer {
    /// The decision.
    pub decision: Decision,
    /// The phase after it.
    pub phase: Phase,
    /// The time the command used.
    pub now: Millis,
}

/// An [`Answer`]'s seven fields, in the order of the array reply; the
/// answers channel carries them as JSON (inside [`AnswerNotice`]). A
/// grant's lease is the time left on it (`lease_ms`), so that the reader's
/// clock does not matter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnswerFields {
    /// The decision's kind.
    #[serde(with = "lower")]
    pub decision: DecisionKind,
    /// Why, for `blocked`, `denied` and `shadow` (what it would have been).
    #[serde(with = "lower::option", default)]
    pub reason: Option<Reason>,
    /// The ticket, for a grant.
    #[serde(default)]
    pub ticket: Option<TicketId>,
    /// Time left on the ticket's lease, for a grant.
    #[serde(default)]
    pub lease_ms: Option<Millis>,
    /// When to ask again, for `blocked` (and `denied`, when known).
    #[serde(default)]
    pub retry_after_ms: Option<Millis>,
    /// The phase after the step.
    #[serde(with = "lower")]
    pub phase: Phase,
    /// The time the command used.
    pub now_ms: Millis,
}

impl From<&Answer> for AnswerFields {
    fn from(a: &Answer) -> AnswerFields {
        let mut f = AnswerFields {
            decision: a.decision.kind(),
            reason: None,
            ticket: None,
            lease_ms: None,
            retry_after_ms: None,
            phase: a.phase,
            now_ms: a.now,
        };
        match a.decision {
            Decision::Granted(Some(g)) | Decision::Probe(g) => {
                f.ticket = Some(g.ticket);
                f.lease_ms = Some(g.lease_end.saturating_sub(a.now));
            }
            Decision::Blocked {
                reason,
                retry_after,
            } => {
                f.reason = Some(reason);
                f.retry_after_ms = Some(retry_after);
            }
            Decision::Denied {
                reason,
                retry_after,
            } => {
                f.reason = Some(reason);
                f.retry_after_ms = retry_after;
            }
            Decision::Shadow { grant, reason } => {
                f.reason = Some(reason);
                if let Some(g) = grant {
                    f.ticket = Some(g.ticket);
                    f.lease_ms = Some(g.lease_end.saturating_sub(a.now));
                }
            }
            Decision::Granted(None) | Decision::Refused | Decision::Queued => {}
        }
        f
    }
}

impl TryFrom<AnswerFields> for Answer {
    type Error = WireError;

    /// The answer the fields name; a field the decision needs and lacks
    /// is an error, one it does not use is not read.
    fn try_from(f: AnswerFields) -> Result<Answer, WireError> {
        let kind = f.decision;
        let grant = || -> Result<Grant, WireError> {
            let ticket = f.ticket.ok_or(WireError::missing("ticket", kind))?;
            let lease = f.lease_ms.ok_or(WireError::missing("lease_ms", kind))?;
            let lease_end = f
                .now_ms
                .checked_add(lease)
                .ok_or_else(|| WireError::new("lease_ms", "ends past the end of time"))?;
            Ok(Grant { ticket, lease_end })
        };
        let reason = || f.reason.ok_or(WireError::missing("reason", kind));
        let decision = match kind {
            DecisionKind::Granted => Decision::Granted(match f.ticket {
                Some(_) => Some(grant()?),
                None => None,
            }),
            DecisionKind::Probe => Decision::Probe(grant()?),
            DecisionKind::Blocked => Decision::Blocked {
                reason: reason()?,
                retry_after: f
                    .retry_after_ms
                    .ok_or(WireError::missing("retry_after_ms", kind))?,
            },
            DecisionKind::Refused => Decision::Refused,
            DecisionKind::Denied => Decision::Denied {
                reason: reason()?,
                retry_after: f.retry_after_ms,
            },
            DecisionKind::Queued => Decision::Queued,
            DecisionKind::Shadow => Decision::Shadow {
                grant: match f.ticket {
                    Some(_) => Some(grant()?),
                    None => None,
                },
                reason: reason()?,
            },
        };
        Ok(Answer {
            decision,
            phase: f.phase,
            now: f.now_ms,
        })
    }
}

/// Appends `name` in lower case.
fn push_lower(out: &mut Vec<u8>, name: &str) {
    out.extend(name.bytes().map(|b| b.to_ascii_lowercase()));
}

/// Appends `n` in decimal digits.
fn push_number(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

/// What a packed field holds when it holds nothing.
const NIL: &[u8] = b"-";

fn push_ms(out: &mut Vec<u8>, ms: Option<Millis>) {
    out.push(b' ');
    match ms {
        Some(ms) => push_number(out, ms),
        None => out.extend_from_slice(NIL),
    }
}

/// A packed field's text; `what` names it in errors.
fn text_of<'a>(what: &'static str, field: &'a [u8]) -> Result<&'a str, WireError> {
    std::str::from_utf8(field).map_err(|_| WireError::new(what, "is not UTF-8"))
}

/// A packed field that is `-` or a number.
fn ms_of(what: &'static str, field: &[u8]) -> Result<Option<Millis>, WireError> {
    if field == NIL {
        return Ok(None);
    }
    number_of(what, field).map(Some)
}

/// A whole number of 1 to 20 ASCII digits.
fn number_of(what: &'static str, field: &[u8]) -> Result<u64, WireError> {
    let bad = || {
        WireError::new(
            what,
            format!("{:?} is not a whole number", String::from_utf8_lossy(field)),
        )
    };
    if field.is_empty() || field.len() > 20 {
        return Err(bad());
    }
    field.iter().try_fold(0u64, |n, &b| {
        let digit = b.wrapping_sub(b'0');
        if digit > 9 {
            return Err(bad());
        }
        n.checked_mul(10)
            .and_then(|n| n.checked_add(u64::from(digit)))
            .ok_or_else(bad)
    })
}

/// A packed field that is `-` or a name.
fn name_of<T: Named>(what: &'static str, field: &[u8]) -> Result<Option<T>, WireError> {
    if field == NIL {
        return Ok(None);
    }
    Ok(Some(T::parse_name(text_of(what, field)?)?))
}

/// The fields of a packed reply: exactly `N`, separated by one space,
/// none empty.
fn split<'a, const N: usize>(
    what: &'static str,
    packed: &'a [u8],
) -> Result<[&'a [u8]; N], WireError> {
    let mut fields = [&packed[..0]; N];
    let mut parts = packed.split(|&b| b == b' ');
    for field in &mut fields {
        *field = parts.next().filter(|f| !f.is_empty()).ok_or_else(|| {
            WireError::new(what, format!("has fewer than {N} fields, or an empty one"))
        })?;
    }
    if parts.next().is_some() {
        return Err(WireError::new(what, format!("has more than {N} fields")));
    }
    Ok(fields)
}

impl Answer {
    /// Appends the packed form: the seven fields of [`AnswerFields`] in
    /// order, one space between them, `-` for nil, names in lower case
    /// (`granted - 0f…2a 30000 - closed 1700000000000`). Names and
    /// numbers hold no space, so a reader splits on spaces.
    pub fn write_packed(&self, out: &mut Vec<u8>) {
        let f = AnswerFields::from(self);
        out.extend_from_slice(f.decision.as_str().as_bytes());
        out.push(b' ');
        match f.reason {
            Some(reason) => out.extend_from_slice(reason.as_str().as_bytes()),
            None => out.extend_from_slice(NIL),
        }
        out.push(b' ');
        match f.ticket {
            Some(ticket) => out.extend_from_slice(&ticket.to_hex()),
            None => out.extend_from_slice(NIL),
        }
        push_ms(out, f.lease_ms);
        push_ms(out, f.retry_after_ms);
        out.push(b' ');
        push_lower(out, f.phase.as_str());
        push_ms(out, Some(f.now_ms));
    }

    /// The packed form in a buffer of its own.
    pub fn packed(&self) -> Vec<u8> {
        // A granted ticket's form is about 70 bytes.
        let mut out = Vec::with_capacity(96);
        self.write_packed(&mut out);
        out
    }

    /// Reads the packed form ([`Answer::write_packed`]).
    pub fn read_packed(packed: &[u8]) -> Result<Answer, WireError> {
        let [decision, reason, ticket, lease, retry, phase, now] = split::<7>("decision", packed)?;
        let ticket = if ticket == NIL {
            None
        } else {
            Some(
                TicketId::from_hex(ticket)
                    .ok_or_else(|| WireError::new("ticket", "is not 1 to 32 hex digits"))?,
            )
        };
        Answer::try_from(AnswerFields {
            decision: text_of("decision", decision)?.parse()?,
            reason: name_of("reason", reason)?,
            ticket,
            lease_ms: ms_of("lease_ms", lease)?,
            retry_after_ms: ms_of("retry_after_ms", retry)?,
            phase: text_of("phase", phase)?.parse()?,
            now_ms: number_of("now_ms", now)?,
        })
    }
}

/// `FB.COMPLETE`'s reply: whether the outcome was stale (B3) and the
/// phase after it. The array form is `[stale, 0|1, phase, <phase>]`; the
/// packed form `0|1 <phase>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The outcome came from an earlier epoch and moved nothing.
    pub stale: bool,
    /// The phase after the completion.
    pub phase: Phase,
}

impl Completion {
    /// The array form's labels.
    pub const LABELS: [&'static str; 2] = ["stale", "phase"];

    /// The packed form: `0 closed`, `1 open`.
    pub fn packed(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(12);
        out.push(if self.stale { b'1' } else { b'0' });
        out.push(b' ');
        push_lower(&mut out, self.phase.as_str());
        out
    }

    /// Reads the packed form ([`Completion::packed`]).
    pub fn read_packed(packed: &[u8]) -> Result<Completion, WireError> {
        let [stale, phase] = split::<2>("completion", packed)?;
        Ok(Completion {
            stale: stale_of(number_of("stale", stale)?)?,
            phase: text_of("phase", phase)?.parse()?,
        })
    }
}

/// `stale`'s 0 or 1.
pub fn stale_of(n: u64) -> Result<bool, WireError> {
    match n {
        0 => Ok(false),
        1 => Ok(true),
        n => Err(WireError::new("stale", format!("is {n}, not 0 or 1"))),
    }
}

/// Blocked and denied requests by reason, written as an object of the
/// reasons' names; a name this side does not know is skipped.
pub(crate) mod by_reason {
    use serde::de::{IgnoredAny, MapAccess, Visitor};
    use serde::ser::SerializeMap;
    use serde::{Deserializer, Serializer};

    use crate::Reason;

    pub fn serialize<S: Serializer>(
        counts: &[u64; Reason::COUNT],
        s: S,
    ) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(Reason::ALL.len()))?;
        for r in Reason::ALL {
            map.serialize_entry(r.as_str(), &counts[r as usize])?;
        }
        map.end()
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<[u64; Reason::COUNT], D::Error> {
        struct Counts;
        impl<'de> Visitor<'de> for Counts {
            type Value = [u64; Reason::COUNT];
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("counts by reason")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<[u64; Reason::COUNT], A::Error> {
                let mut counts = [0; Reason::COUNT];
                while let Some(name) = map.next_key::<String>()? {
                    match name.parse::<Reason>() {
                        Ok(r) => counts[r as usize] = map.next_value()?,
                        Err(_) => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(counts)
            }
        }
        d.deserialize_map(Counts)
    }
}

/// A key's view as the module writes it: the domain's [`View`], the key's
/// last time seen, the time it is read at, its next deadline, and the
/// policy in force as its spec.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KeyView {
    /// The breaker's phase.
    #[serde(with = "lower")]
    pub phase: Phase,
    /// Failures in a row.
    pub consecutive_failures: u32,
    /// Probes admitted since the breaker last closed.
    pub half_open_attempts: u32,
    /// Probe slots held (H1).
    #[serde(default)]
    pub probes_held: u32,
    /// Current probe successes in this half-open period (H2).
    #[serde(default)]
    pub half_open_successes: u32,
    /// The end of the break, when open.
    #[serde(default)]
    pub open_until: Option<Millis>,
    /// Permits free now (0 without a limiter).
    pub free: u32,
    /// The limiter's limit (0 without a limiter).
    pub limit: u32,
    /// Permits asked for by waiters.
    pub queued: u64,
    /// Live tickets.
    pub live_tickets: usize,
    /// Waiting requests.
    pub waiters: usize,
    /// The breaker's epoch.
    pub epoch: u64,
    /// The share of failures in the sampling window, in ratio mode.
    #[serde(default)]
    pub failure_ratio: Option<f64>,
    /// When the phase last changed.
    pub changed_at: Millis,
    /// The last time the key saw.
    pub last_now: Millis,
    /// The time the view is read at.
    pub now_ms: Millis,
    /// When something is next due at the key.
    #[serde(default)]
    pub next_deadline: Option<Millis>,
    /// Statistics.
    #[serde(default)]
    pub stats: Stats,
    /// The adaptive limiter's limit in force (0 without one).
    #[serde(default)]
    pub adaptive_limit: u32,
    /// The policy in force, for people reading `FB.GET`. Not read back: a
    /// server runs the policies of its own rules, and a policy of a later
    /// release must not keep it from reading a view.
    #[serde(default, skip_deserializing)]
    pub policy: Option<PolicySpec>,
    /// Live slow tickets (S2).
    #[serde(default)]
    pub live_slow: u32,
    /// The slow share of S3 (b), when the policy has slow calls.
    #[serde(default)]
    pub slow_ratio: Option<f64>,
}

impl KeyView {
    /// The view of `fuse` at `now`.
    pub fn of<T: TicketTable>(fuse: &Fuse<T>, now: Millis) -> KeyView {
        let view = fuse.view(now);
        KeyView::with(
            &view,
            fuse.last_now(),
            now,
            fuse.next_deadline(),
            Some(fuse.policy().spec()),
        )
    }

    /// The view `view` read at `now`, of a key last seen at `last_now`.
    pub fn with(
        view: &View,
        last_now: Millis,
        now: Millis,
        next_deadline: Option<Millis>,
        policy: Option<PolicySpec>,
    ) -> KeyView {
        // Every field named: a field added to `View` must be added here.
        let View {
            phase,
            consecutive_failures,
            half_open_attempts,
            probes_held,
            half_open_successes,
            open_until,
            free,
            limit,
            queued,
            live_tickets,
            waiters,
            epoch,
            failure_ratio,
            changed_at,
            ref stats,
            live_slow,
            slow_ratio,
            adaptive_limit,
        } = *view;
        KeyView {
            phase,
            consecutive_failures,
            half_open_attempts,
            probes_held,
            half_open_successes,
            open_until,
            free,
            limit,
            queued,
            live_tickets,
            waiters,
            epoch,
            failure_ratio,
            changed_at,
            last_now,
            now_ms: now,
            next_deadline,
            stats: stats.clone(),
            adaptive_limit,
            policy,
            live_slow,
            slow_ratio,
        }
    }

    /// The domain's view.
    pub fn view(&self) -> View {
        View {
            phase: self.phase,
            consecutive_failures: self.consecutive_failures,
            half_open_attempts: self.half_open_attempts,
            probes_held: self.probes_held,
            half_open_successes: self.half_open_successes,
            open_until: self.open_until,
            free: self.free,
            limit: self.limit,
            queued: self.queued,
            live_tickets: self.live_tickets,
            waiters: self.waiters,
            epoch: self.epoch,
            failure_ratio: self.failure_ratio,
            changed_at: self.changed_at,
            stats: self.stats.clone(),
            live_slow: self.live_slow,
            slow_ratio: self.slow_ratio,
            adaptive_limit: self.adaptive_limit,
        }
    }
}

/// A waiter's final answer, published on [`Channel::Answers`]: the Redis
/// key it waited at, the waiter, and the answer's fields.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnswerNotice {
    /// The Redis key.
    pub key: String,
    /// The waiter (and, when granted, its ticket).
    pub waiter: TicketId,
    /// The answer.
    #[serde(flatten)]
    pub answer: AnswerFields,
}

/// A breaker's phase change, published on [`Channel::Events`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PhaseNotice {
    /// The Redis key.
    pub key: String,
    /// The phase before.
    #[serde(with = "lower")]
    pub from: Phase,
    /// The phase after.
    #[serde(with = "lower")]
    pub to: Phase,
    /// Why, in words.
    #[serde(with = "lower")]
    pub cause: Cause,
    /// When.
    pub at_ms: Millis,
    /// Who asked, for an operator's step (`BY`).
    #[serde(default)]
    pub who: Option<String>,
    /// Why they asked, for an operator's step (`WHY`).
    #[serde(default)]
    pub why: Option<String>,
    /// The key's view after the step.
    pub view: KeyView,
    /// True when the key's policy is a shadow (D1): the cause is told
    /// prefixed `shadow: `. Absent (older modules) = false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shadow: bool,
    /// Where the notice stands among its key's notices ([`NoticeOrder`]),
    /// signed with the rest, so that a watcher refuses one it has seen
    /// (or an older one) published again. Absent from older modules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<NoticeOrder>,
}

/// A phase notice's place in its key's sequence: the time of the step that
/// published it (the store's clock, `now_ms`), then `seq`, the breaker's
/// epoch after that step less the transitions the same step told after
/// this one. A key never sees time go back, and every transition starts an
/// epoch, so a key's notices are strictly ordered by `(now_ms, seq)`; a
/// key forgotten at rest and made again starts its epochs afresh, but at a
/// later time, so its notices still come after the old ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct NoticeOrder {
    /// The time of the step that published the notice (ms, the store's
    /// clock): also how old the notice is.
    pub now_ms: Millis,
    /// The notice's place among the key's notices of that instant.
    pub seq: u64,
}

impl NoticeOrder {
    /// The order of each of `count` phase notices told by one step at
    /// `now` that left the breaker at `epoch`, in the order they were
    /// told.
    pub fn of_step(now: Millis, epoch: u64, count: usize) -> impl Iterator<Item = NoticeOrder> {
        let count = count as u64;
        (0..count).map(move |i| NoticeOrder {
            now_ms: now,
            seq: epoch.saturating_sub(count - 1 - i),
        })
    }
}

/// The bytes of a MAC: HMAC-SHA256.
pub const MAC_BYTES: usize = 32;

/// What a signed message's MAC covers, in order: the channel's name (or
/// the Redis key's, for content kept at a key), a newline, the payload;
/// so a message signed for one channel is refused on another.
pub fn signed_parts<'a>(channel: &'a str, payload: &'a [u8]) -> [&'a [u8]; 3] {
    [channel.as_bytes(), b"\n", payload]
}

/// A signed message: the MAC in 64 lower-case hex digits, a space, and
/// the payload.
pub fn seal(mac: &[u8; MAC_BYTES], payload: &str) -> String {
    let mut out = String::with_capacity(2 * MAC_BYTES + 1 + payload.len());
    out.push_str(&hex::encode(mac));
    out.push(' ');
    out.push_str(payload);
    out
}

/// The MAC and the payload of a signed message ([`seal`]); an error, in
/// words, when it is not one.
pub fn unseal(message: &[u8]) -> Result<([u8; MAC_BYTES], &[u8]), &'static str> {
    const DIGITS: usize = 2 * MAC_BYTES;
    if message.len() <= DIGITS || message[DIGITS] != b' ' {
        return Err("not signed");
    }
    let (digits, payload) = (&message[..DIGITS], &message[DIGITS + 1..]);
    // Every MAC is written in lower case; another spelling is not ours.
    if !digits
        .iter()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
    {
        return Err("not signed");
    }
    let mut mac = [0u8; MAC_BYTES];
    hex::decode_to_slice(digits, &mut mac).map_err(|_| "not signed")?;
    Ok((mac, payload))
}

/// What a secret's fingerprint is the MAC of: this payload on this
/// channel.
pub const FINGERPRINT_OF: (&str, &[u8]) = ("fusebox", b"fingerprint");

/// A secret's fingerprint from the MAC of [`FINGERPRINT_OF`] under it:
/// its first 16 hex digits (they say nothing of the secret).
pub fn fingerprint(mac: &[u8; MAC_BYTES]) -> String {
    hex::encode(&mac[..8])
}

/// One value of a labelled reply (`FB.VERSION`, `FB.CENSUS`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Item<'a> {
    /// Text.
    Text(&'a str),
    /// A whole number.
    Number(u64),
}

/// `FB.VERSION`'s reply: `module <semver> encoding <n> signing
/// <fingerprint|off>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModuleVersion {
    /// The module's version.
    pub module: String,
    /// The state encoding it writes.
    pub encoding: u64,
    /// The fingerprint of the secret it signs notices with; `None`: it
    /// does not sign (`off`).
    pub signing: Option<String>,
}

impl ModuleVersion {
    /// The labelled values, in order.
    pub fn items(&self) -> [(&'static str, Item<'_>); 3] {
        [
            ("module", Item::Text(&self.module)),
            ("encoding", Item::Number(self.encoding)),
            (
                "signing",
                Item::Text(self.signing.as_deref().unwrap_or("off")),
            ),
        ]
    }

    /// Reads the labelled values ([`ModuleVersion::items`]); an unknown
    /// label is skipped, a missing `encoding` is an error (a module too
    /// old to say), a missing `signing` means it does not sign.
    pub fn read<'a>(
        items: impl IntoIterator<Item = (&'a str, Item<'a>)>,
    ) -> Result<ModuleVersion, WireError> {
        let (mut module, mut encoding, mut signing) = (String::new(), None, None);
        for (label, item) in items {
            match (label, item) {
                ("module", Item::Text(t)) => module = t.to_owned(),
                ("encoding", Item::Number(n)) => encoding = Some(n),
                ("encoding", Item::Text(t)) => {
                    encoding = Some(number_of("encoding", t.as_bytes())?)
                }
                ("signing", Item::Text(t)) => signing = (t != "off").then(|| t.to_owned()),
                _ => {}
            }
        }
        Ok(ModuleVersion {
            module,
            encoding: encoding.ok_or_else(|| WireError::new("encoding", "is not in the reply"))?,
            signing,
        })
    }
}

/// `FB.CENSUS`'s figures of one node (its keys not closed follow them in
/// the reply, under [`CensusFigures::NOT_CLOSED`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CensusFigures {
    /// Fusebox keys, as the node's last complete pass counted them.
    pub keys: u64,
    /// True once a pass has completed since the node started.
    pub complete: bool,
    /// When the last complete pass ended.
    pub counted_at_ms: Millis,
    /// Keys not at rest by phase, indexed by [`Phase::index`].
    pub by_phase: [u64; 4],
    /// Live tickets.
    pub tickets: u64,
    /// Waiting requests.
    pub waiters: u64,
}

impl CensusFigures {
    /// The label of the keys not closed, last in the reply.
    pub const NOT_CLOSED: &'static str = "not_closed";

    /// The labelled figures, in order (the phases by their names in lower
    /// case).
    pub fn items(&self) -> Vec<(Cow<'static, str>, u64)> {
        let mut items = vec![
            (Cow::Borrowed("keys"), self.keys),
            (Cow::Borrowed("complete"), u64::from(self.complete)),
            (Cow::Borrowed("counted_at_ms"), self.counted_at_ms),
        ];
        for phase in Phase::ALL {
            items.push((Cow::Owned(phase_label(phase)), self.by_phase[phase.index()]));
        }
        items.push((Cow::Borrowed("tickets"), self.tickets));
        items.push((Cow::Borrowed("waiters"), self.waiters));
        items
    }

    /// Reads the labelled figures ([`CensusFigures::items`]); an unknown
    /// label is skipped; `keys`, each phase, `tickets` and `waiters` must
    /// be there.
    pub fn read<'a>(
        items: impl IntoIterator<Item = (&'a str, u64)>,
    ) -> Result<CensusFigures, WireError> {
        let mut c = CensusFigures::default();
        let mut seen = [false; 7];
        for (label, n) in items {
            match label {
                "keys" => (c.keys, seen[0]) = (n, true),
                "complete" => {
                    c.complete = match n {
                        0 => false,
                        1 => true,
                        n => return Err(WireError::new("complete", format!("is {n}, not 0 or 1"))),
                    }
                }
                "counted_at_ms" => c.counted_at_ms = n,
                "tickets" => (c.tickets, seen[1]) = (n, true),
                "waiters" => (c.waiters, seen[2]) = (n, true),
                other => {
                    if let Ok(phase) = other.parse::<Phase>() {
                        c.by_phase[phase.index()] = n;
                        seen[3 + phase.index()] = true;
                    }
                }
            }
        }
        if seen.contains(&false) {
            return Err(WireError::new(
                "census",
                "lacks keys, tickets, waiters or a phase's count",
            ));
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests;

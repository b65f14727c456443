//! The module's commands. Every command is deterministic given what gets
//! replicated: the caller supplies the time, or sends `*` for the server's
//! clock and the command is replicated with the number it used, so a
//! replica or an AOF replay that runs it again reaches the same state.
//!
//! Errors are `ERR <field>: <what to do>`, like the contract's messages.

use fusebox_domain::policy::MAX_DURATION;
use fusebox_domain::{
    Ask, Decision, Fuse, FuseError, Grant, Millis, Notice, Outcome, Phase, Policy, PolicySpec,
    Reason, TicketId,
};
use redis_module::{Context, KeyType, RedisError, RedisResult, RedisString, RedisValue};

use crate::{notices, settler, state};

/// `FB.VERSION`: the module's version and the state encoding it writes, as
/// `module <semver> encoding <n>`. Keyless.
pub fn version(_ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if args.len() != 1 {
        return Err(RedisError::WrongArity);
    }
    Ok(RedisValue::Array(vec![
        RedisValue::SimpleStringStatic("module"),
        RedisValue::SimpleStringStatic(env!("CARGO_PKG_VERSION")),
        RedisValue::SimpleStringStatic("encoding"),
        RedisValue::Integer(i64::from(state::ENCODING_VERSION)),
    ]))
}

/// `FB.KEYCHECK key`: `OK` when `key` is a valid fusebox key (SPEC K1) and
/// holds nothing or fusebox state; otherwise an error naming the field.
pub fn keycheck(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if args.len() != 2 {
        return Err(RedisError::WrongArity);
    }
    let key_name = args.into_iter().nth(1).ok_or(RedisError::WrongArity)?;
    check_key_name(key_name.as_slice())?;
    let key = ctx.open_key(&key_name);
    match key.key_type() {
        KeyType::Empty => {}
        KeyType::String => {
            let value = key.read()?.unwrap_or_default();
            state::decode(value).map_err(|e| err(&e))?;
        }
        _ => return Err(RedisError::WrongType),
    }
    Ok(RedisValue::SimpleStringStatic("OK"))
}

/// Checks a key name against SPEC K1, as the contract's `key` field.
pub fn check_key_name(name: &[u8]) -> Result<&str, RedisError> {
    let name = std::str::from_utf8(name)
        .map_err(|_| RedisError::Str("ERR key: must be UTF-8; send the key's UTF-8 bytes"))?;
    fusebox_domain::validate_key(name).map_err(|e| err(&e))?;
    Ok(name)
}

/// An error reply `ERR <message>`.
fn err(e: &dyn std::fmt::Display) -> RedisError {
    RedisError::String(format!("ERR {e}"))
}

// ---------------------------------------------------------------------------
// The domain commands: load the key's state, run one domain step, store it.
// Arguments are all checked before the key is touched, and a refused step
// stores nothing, so a command that fails changes nothing (SPEC E3).
// ---------------------------------------------------------------------------

/// The largest `now_ms` a command takes: 2^53 (the largest time a stored
/// state may hold, decisions item 63) less 365 days (the longest lease,
/// wait, break or probe slot), so that every deadline a command sets still
/// reads back.
pub const MAX_NOW: Millis = (1 << 53) - MAX_DURATION;

fn arg_text<'a>(arg: &'a RedisString, field: &str, what: &str) -> Result<&'a str, RedisError> {
    std::str::from_utf8(arg.as_slice())
        .map_err(|_| RedisError::String(format!("ERR {field}: must be {what}")))
}

/// A whole number of ASCII digits, at most `max`.
fn parse_number(arg: &RedisString, field: &str, max: u64, what: &str) -> Result<u64, RedisError> {
    let bad = || RedisError::String(format!("ERR {field}: must be {what}"));
    let text = arg_text(arg, field, what)?;
    if text.is_empty() || text.len() > 20 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    text.parse::<u64>()
        .ok()
        .filter(|&n| n <= max)
        .ok_or_else(bad)
}

/// `now_ms` as sent: a number, or `*` for the server's clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Now {
    /// The caller's clock, in milliseconds.
    At(Millis),
    /// `*`: the Redis server's wall clock in unix milliseconds, raised to
    /// the key's last time seen.
    Server,
}

impl Now {
    /// The time a command uses at a key whose last time seen is `last`
    /// (`None`: an empty key).
    pub fn resolve(self, last: Option<Millis>) -> Millis {
        match self {
            Now::At(at) => at,
            Now::Server => wall_ms().min(MAX_NOW).max(last.unwrap_or(0)),
        }
    }
}

/// The server's wall clock in unix milliseconds.
pub fn wall_ms() -> Millis {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// `now_ms`: the caller's monotonic clock in milliseconds (SPEC T0), or `*`
/// for the server's clock.
pub fn parse_now(arg: &RedisString) -> Result<Now, RedisError> {
    if arg.as_slice() == b"*" {
        return Ok(Now::Server);
    }
    parse_number(
        arg,
        "now_ms",
        MAX_NOW,
        "a whole number of milliseconds from 0 to 9007167718740992 (2^53 less 365 days), \
         or * for the server's clock; send the caller's monotonic clock or *",
    )
    .map(Now::At)
}

/// A duration option (`LEASE`, `MAXWAIT`): 0 to 365 days in milliseconds.
fn parse_duration(arg: &RedisString, field: &str) -> Result<Millis, RedisError> {
    parse_number(
        arg,
        field,
        MAX_DURATION,
        "a whole number of milliseconds from 0 to 31536000000 (365 days)",
    )
}

/// `ticket_hex`: a ticket id as 1 to 32 hex digits.
pub fn parse_ticket(arg: &RedisString) -> Result<TicketId, RedisError> {
    parse_id(arg, "ticket", "send the id the ticket was acquired with")
}

fn parse_id(arg: &RedisString, field: &str, todo: &str) -> Result<TicketId, RedisError> {
    let what = format!("1 to 32 hex digits; {todo}");
    let text = arg_text(arg, field, &what)?;
    let hex = !text.is_empty() && text.len() <= 32 && text.bytes().all(|b| b.is_ascii_hexdigit());
    hex.then(|| u128::from_str_radix(text, 16).ok())
        .flatten()
        .map(TicketId)
        .ok_or_else(|| RedisError::String(format!("ERR {field}: must be {what}")))
}

/// `policy_json`: a policy as the config writes it, as JSON, validated.
pub fn parse_policy(arg: &RedisString) -> Result<Policy, RedisError> {
    let spec: PolicySpec = serde_json::from_slice(arg.as_slice()).map_err(|e| {
        RedisError::String(format!(
            "ERR policy: not a policy as JSON ({e}); send the key's policy as an object \
             with breaker, limiter and lease, as the config writes it"
        ))
    })?;
    spec.validate()
        .map_err(|e| RedisError::String(format!("ERR policy.{e}")))
}

/// `outcome`: `success`, `failure` or `ignored`, in any case.
pub fn parse_outcome(arg: &RedisString) -> Result<Outcome, RedisError> {
    const WHAT: &str = "success, failure or ignored";
    let text = arg_text(arg, "outcome", WHAT)?;
    [Outcome::Success, Outcome::Failure, Outcome::Ignored]
        .into_iter()
        .find(|o| o.as_str().eq_ignore_ascii_case(text))
        .ok_or_else(|| RedisError::String(format!("ERR outcome: must be {WHAT}, not {text:?}")))
}

/// `BY who` / `WHY text`: at most 256 bytes of UTF-8.
fn parse_note(arg: &RedisString, field: &str) -> Result<String, RedisError> {
    let text = arg_text(arg, field, "UTF-8 text of at most 256 bytes")?;
    if text.len() > 256 {
        return Err(RedisError::String(format!(
            "ERR {field}: must be at most 256 bytes of UTF-8, not {}; shorten it",
            text.len()
        )));
    }
    Ok(text.to_owned())
}

/// The options after the fixed arguments: `NAME value` pairs, each at most
/// once, names in any case. Returns the values in the order of `names`.
fn parse_options<'a>(
    args: &'a [RedisString],
    names: &[&str],
) -> Result<Vec<Option<&'a RedisString>>, RedisError> {
    let mut values = vec![None; names.len()];
    let mut rest = args.iter();
    while let Some(name) = rest.next() {
        let text = String::from_utf8_lossy(name.as_slice());
        let Some(at) = names.iter().position(|n| n.eq_ignore_ascii_case(&text)) else {
            return Err(RedisError::String(format!(
                "ERR option: {text:?} is not an option here; use {}",
                names.join(", ")
            )));
        };
        let Some(value) = rest.next() else {
            return Err(RedisError::String(format!(
                "ERR {}: {} needs a value after it",
                names[at].to_ascii_lowercase(),
                names[at]
            )));
        };
        if values[at].replace(value).is_some() {
            return Err(RedisError::String(format!(
                "ERR {}: {} is given twice; give it once",
                names[at].to_ascii_lowercase(),
                names[at]
            )));
        }
    }
    Ok(values)
}

/// The fuse a key holds, or `None` when the key is empty.
pub(crate) fn load(ctx: &Context, key_name: &RedisString) -> Result<Option<Fuse>, RedisError> {
    check_key_name(key_name.as_slice())?;
    let key = ctx.open_key(key_name);
    match key.key_type() {
        KeyType::Empty => Ok(None),
        KeyType::String => {
            let value = key.read()?.unwrap_or_default();
            state::decode_fuse(value).map(Some).map_err(|e| err(&e))
        }
        _ => Err(RedisError::WrongType),
    }
}

/// Who asked for an operator's step, and why, for the events it causes.
#[derive(Clone, Debug, Default)]
pub(crate) struct Note {
    pub(crate) who: Option<String>,
    pub(crate) why: Option<String>,
}

/// Drains `fuse`'s notices (until none are left), stores it at the key,
/// replicates the step with `replicate`, re-indexes the key for the
/// settler, then publishes the notices. Returns the notices.
pub(crate) fn persist(
    ctx: &Context,
    key_name: &RedisString,
    fuse: &mut Fuse,
    now: Millis,
    replicate: impl FnOnce(&Context),
    note: &Note,
) -> Result<Vec<Notice>, RedisError> {
    let mut drained = Vec::new();
    loop {
        let before = drained.len();
        drained.extend(fuse.drain_notices());
        if drained.len() == before {
            break;
        }
    }
    let value = String::from_utf8(state::encode_fuse(fuse))
        .map_err(|_| RedisError::Str("ERR state: the encoding is not UTF-8 (a module bug)"))?;
    let key = ctx.open_key_writable(key_name);
    key.write(&value)?;
    if fuse.is_at_rest(now) {
        // K2: a key at rest is forgotten once it stays so for IDLE_AFTER
        // (Redis's own expiry, on the primary's clock; writing the value
        // again above clears it).
        key.set_expire(std::time::Duration::from_millis(IDLE_AFTER))?;
    }
    replicate(ctx);
    settler::note(key_name.as_slice(), fuse);
    notices::publish(ctx, key_name.as_slice(), fuse, now, &drained, note);
    Ok(drained)
}

/// How long a key at rest (closed, no failures counted, no ticket, no
/// waiter) is kept before Redis forgets it (SPEC K2): the embedded
/// engine's default `idle_after`.
pub const IDLE_AFTER: Millis = 600_000;

/// Stores `fuse` as a command's step: replicated as the command came, with
/// `now_ms` (argument 2) written as the number used.
fn store(
    ctx: &Context,
    args: &[RedisString],
    fuse: &mut Fuse,
    now: Millis,
    note: &Note,
) -> Result<Vec<Notice>, RedisError> {
    persist(
        ctx,
        &args[1],
        fuse,
        now,
        |ctx| {
            let name = String::from_utf8_lossy(args[0].as_slice()).to_ascii_lowercase();
            let now = now.to_string();
            let rest: Vec<&[u8]> = args[1..]
                .iter()
                .enumerate()
                .map(|(i, a)| if i == 1 { now.as_bytes() } else { a.as_slice() })
                .collect();
            ctx.replicate(&name, rest.as_slice());
        },
        note,
    )
}

/// A refused domain step, as an error naming the field.
fn fuse_err(e: FuseError) -> RedisError {
    match e {
        FuseError::TicketInUse => RedisError::Str(
            "ERR ticket: the id is already in use at this key; send a new random id",
        ),
        e => err(&e),
    }
}

fn millis(ms: Millis) -> RedisValue {
    RedisValue::Integer(i64::try_from(ms).unwrap_or(i64::MAX))
}

fn name(text: &str) -> RedisValue {
    RedisValue::BulkString(text.to_owned())
}

/// A phase as the module writes it: lower case (`closed`, `open`,
/// `half_open`, `isolated`).
pub fn phase_name(phase: Phase) -> String {
    phase.as_str().to_ascii_lowercase()
}

/// A decision's parts: name, reason, ticket, lease left and retry after.
pub(crate) struct Parts {
    pub(crate) decision: &'static str,
    pub(crate) reason: Option<&'static str>,
    pub(crate) ticket: Option<String>,
    pub(crate) lease_ms: Option<Millis>,
    pub(crate) retry_after_ms: Option<Millis>,
}

pub(crate) fn parts(decision: &Decision, now: Millis) -> Parts {
    let mut p = Parts {
        decision: "",
        reason: None,
        ticket: None,
        lease_ms: None,
        retry_after_ms: None,
    };
    let grant = |g: &Grant| {
        (
            Some(g.ticket.to_string()),
            Some(g.lease_end.saturating_sub(now)),
        )
    };
    match decision {
        Decision::Granted(g) => {
            p.decision = "granted";
            if let Some(g) = g {
                (p.ticket, p.lease_ms) = grant(g);
            }
        }
        Decision::Probe(g) => {
            p.decision = "probe";
            (p.ticket, p.lease_ms) = grant(g);
        }
        Decision::Blocked {
            reason,
            retry_after,
        } => {
            p.decision = "blocked";
            p.reason = Some(reason.as_str());
            p.retry_after_ms = Some(*retry_after);
        }
        Decision::Refused => p.decision = "refused",
        Decision::Denied {
            reason,
            retry_after,
        } => {
            p.decision = "denied";
            p.reason = Some(reason.as_str());
            p.retry_after_ms = *retry_after;
        }
        Decision::Queued => p.decision = "queued",
    }
    p
}

/// A decision as `[decision, reason|nil, ticket|nil, lease_ms|nil,
/// retry_after_ms|nil, phase, now_ms]`, names in lower case; `lease_ms` is
/// the time left on the ticket, `phase` the breaker's after the step and
/// `now_ms` the time the command used.
pub fn decision_reply(decision: &Decision, phase: Phase, now: Millis) -> RedisValue {
    let p = parts(decision, now);
    let opt_name = |s: Option<&str>| s.map_or(RedisValue::Null, name);
    let opt_ms = |m: Option<Millis>| m.map_or(RedisValue::Null, millis);
    RedisValue::Array(vec![
        name(p.decision),
        opt_name(p.reason),
        opt_name(p.ticket.as_deref()),
        opt_ms(p.lease_ms),
        opt_ms(p.retry_after_ms),
        name(&phase_name(phase)),
        millis(now),
    ])
}

/// `FB.ACQUIRE key now_ms ticket_hex policy_json [PERMITS n] [LEASE ms]
/// [MAXWAIT ms]`: a request for permits under `policy_json` (SPEC C1–C3,
/// P1–P4). An empty key starts as a fresh fuse under the policy at
/// `now_ms`; a key whose policy differs takes the new one first (Y4). A
/// status check (`PERMITS 0`) on an empty key stores nothing.
pub fn acquire(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if args.len() < 5 {
        return Err(RedisError::WrongArity);
    }
    let when = parse_now(&args[2])?;
    let id = parse_ticket(&args[3])?;
    let policy = parse_policy(&args[4])?;
    let options = parse_options(&args[5..], &["PERMITS", "LEASE", "MAXWAIT"])?;
    let permits = options[0]
        .map(|a| {
            parse_number(
                a,
                "permits",
                u64::from(u32::MAX),
                "a whole number from 0 to 4294967295; 0 is a status check",
            )
        })
        .transpose()?
        .map_or(1, |n| n as u32);
    let lease = options[1].map(|a| parse_duration(a, "lease")).transpose()?;
    let max_wait = options[2]
        .map(|a| parse_duration(a, "maxwait"))
        .transpose()?
        .unwrap_or(0);
    let ask = Ask {
        permits,
        max_wait,
        lease,
        ..Ask::default()
    };
    let loaded = load(ctx, &args[1])?;
    let existed = loaded.is_some();
    let now = when.resolve(loaded.as_ref().map(Fuse::last_now));
    let mut fuse = match loaded {
        Some(mut fuse) => {
            if fuse.policy().spec() != policy.spec() {
                fuse.set_policy(policy, now).map_err(fuse_err)?;
            }
            fuse
        }
        None => Fuse::new(policy, now),
    };
    let decision = fuse.acquire(&ask, id, now).map_err(fuse_err)?;
    if existed || permits > 0 {
        store(ctx, &args, &mut fuse, now, &Note::default())?;
    }
    Ok(decision_reply(&decision, fuse.phase(), now))
}

/// `FB.COMPLETE key now_ms ticket_hex outcome`: records a ticket's outcome
/// (SPEC B3, C5, L4); replies `stale 0|1 phase <phase>`.
pub fn complete(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if args.len() != 5 {
        return Err(RedisError::WrongArity);
    }
    let when = parse_now(&args[2])?;
    let id = parse_ticket(&args[3])?;
    let outcome = parse_outcome(&args[4])?;
    let Some(mut fuse) = load(ctx, &args[1])? else {
        return Err(fuse_err(FuseError::UnknownTicket));
    };
    let now = when.resolve(Some(fuse.last_now()));
    let done = fuse.complete(id, outcome, now).map_err(fuse_err)?;
    store(ctx, &args, &mut fuse, now, &Note::default())?;
    Ok(RedisValue::Array(vec![
        name("stale"),
        RedisValue::Integer(i64::from(done.stale)),
        name("phase"),
        name(&phase_name(done.phase)),
    ]))
}

/// `FB.RENEW key now_ms ticket_hex [LEASE ms]`: extends a live ticket's
/// lease from `now_ms` (SPEC L2); replies the lease granted in ms.
pub fn renew(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if args.len() < 4 {
        return Err(RedisError::WrongArity);
    }
    let when = parse_now(&args[2])?;
    let id = parse_ticket(&args[3])?;
    let options = parse_options(&args[4..], &["LEASE"])?;
    let lease = options[0].map(|a| parse_duration(a, "lease")).transpose()?;
    let Some(mut fuse) = load(ctx, &args[1])? else {
        return Err(fuse_err(FuseError::UnknownTicket));
    };
    let now = when.resolve(Some(fuse.last_now()));
    let granted = fuse.renew(id, lease, now).map_err(fuse_err)?;
    store(ctx, &args, &mut fuse, now, &Note::default())?;
    Ok(millis(granted))
}

/// The `BY` and `WHY` options of an operator's step.
fn parse_by_why(values: &[Option<&RedisString>]) -> Result<Note, RedisError> {
    Ok(Note {
        who: values[0].map(|a| parse_note(a, "by")).transpose()?,
        why: values[1].map(|a| parse_note(a, "why")).transpose()?,
    })
}

fn view_reply(fuse: &Fuse, now: Millis) -> RedisValue {
    RedisValue::BulkString(view_json(fuse, now).to_string())
}

/// `FB.ISOLATE key now_ms [POLICY json] [BY who] [WHY text]`: an operator
/// isolates the key's breaker (SPEC B5); waiters are refused. An empty key
/// needs `POLICY`, under which it is made first; a key whose policy
/// differs takes it first. Replies the key's view as JSON.
pub fn isolate(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if args.len() < 3 {
        return Err(RedisError::WrongArity);
    }
    let when = parse_now(&args[2])?;
    let options = parse_options(&args[3..], &["POLICY", "BY", "WHY"])?;
    let policy = options[0].map(parse_policy).transpose()?;
    let note = parse_by_why(&options[1..])?;
    let loaded = load(ctx, &args[1])?;
    let now = when.resolve(loaded.as_ref().map(Fuse::last_now));
    let mut fuse = match (loaded, policy) {
        (Some(mut fuse), Some(policy)) => {
            if fuse.policy().spec() != policy.spec() {
                fuse.set_policy(policy, now).map_err(fuse_err)?;
            }
            fuse
        }
        (Some(fuse), None) => fuse,
        (None, Some(policy)) => Fuse::new(policy, now),
        (None, None) => {
            return Err(RedisError::Str(
                "ERR key: holds no fusebox state, so no policy to isolate under; \
                 send POLICY with the key's policy, or FB.ACQUIRE on it first",
            ))
        }
    };
    fuse.isolate(now).map_err(fuse_err)?;
    store(ctx, &args, &mut fuse, now, &note)?;
    Ok(view_reply(&fuse, now))
}

/// `FB.CLOSE key now_ms [BY who] [WHY text]`: an operator closes the key's
/// breaker with everything cleared (SPEC B5). Replies the key's view as
/// JSON; an empty key is closed already: nil, nothing written.
pub fn close(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if args.len() < 3 {
        return Err(RedisError::WrongArity);
    }
    let when = parse_now(&args[2])?;
    let options = parse_options(&args[3..], &["BY", "WHY"])?;
    let note = parse_by_why(&options)?;
    let Some(mut fuse) = load(ctx, &args[1])? else {
        return Ok(RedisValue::Null);
    };
    let now = when.resolve(Some(fuse.last_now()));
    fuse.close(now).map_err(fuse_err)?;
    store(ctx, &args, &mut fuse, now, &note)?;
    Ok(view_reply(&fuse, now))
}

/// What became of waiter `id` at `now`: its answer if `notices` hold one,
/// `queued` while it waits, the ticket it was served with while that is
/// live, else nil (unknown).
fn waiter_reply(fuse: &Fuse, id: TicketId, now: Millis, notices: &[Notice]) -> RedisValue {
    let answered = notices.iter().rev().find_map(|n| match n {
        Notice::Answered { waiter, decision } if *waiter == id => Some(*decision),
        _ => None,
    });
    if let Some(decision) = answered {
        return decision_reply(&decision, fuse.phase(), now);
    }
    if fuse.state().waiters.iter().any(|w| w.id == id) {
        return decision_reply(&Decision::Queued, fuse.phase(), now);
    }
    match fuse.ticket(id).filter(|t| t.lease_end > now) {
        Some(t) => {
            let grant = Grant {
                ticket: id,
                lease_end: t.lease_end,
            };
            let decision = if t.probe {
                Decision::Probe(grant)
            } else {
                Decision::Granted(Some(grant))
            };
            decision_reply(&decision, fuse.phase(), now)
        }
        None => RedisValue::Null,
    }
}

/// `FB.SETTLE key now_ms [WAITER id]`: advances the key to `now_ms`
/// (leases that ended, waits that timed out, a break that is over), stores
/// it when the key holds state, and replies `[next_deadline_ms|nil,
/// waiter|nil]`, the waiter's part being what [`waiter_reply`] says.
pub fn settle(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if args.len() < 3 {
        return Err(RedisError::WrongArity);
    }
    let when = parse_now(&args[2])?;
    let options = parse_options(&args[3..], &["WAITER"])?;
    let waiter = options[0]
        .map(|a| parse_id(a, "waiter", "send the id the request was queued with"))
        .transpose()?;
    let Some(mut fuse) = load(ctx, &args[1])? else {
        // Nothing to settle, and no waiter is known at an empty key.
        return Ok(RedisValue::Array(vec![RedisValue::Null, RedisValue::Null]));
    };
    let now = when.resolve(Some(fuse.last_now()));
    fuse.advance(now).map_err(fuse_err)?;
    let notices = store(ctx, &args, &mut fuse, now, &Note::default())?;
    let next = fuse.next_deadline().map_or(RedisValue::Null, millis);
    let waiter = waiter.map_or(RedisValue::Null, |id| {
        waiter_reply(&fuse, id, now, &notices)
    });
    Ok(RedisValue::Array(vec![next, waiter]))
}

/// `FB.WITHDRAW key now_ms id`: the caller of a waiting request went away
/// (SPEC P6). Replies `withdrawn` (it waited and is gone), `released` (it
/// had been served: its ticket is completed as ignored) or `unknown`.
pub fn withdraw(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if args.len() != 4 {
        return Err(RedisError::WrongArity);
    }
    let when = parse_now(&args[2])?;
    let id = parse_id(
        &args[3],
        "waiter",
        "send the id the request was queued with",
    )?;
    let Some(mut fuse) = load(ctx, &args[1])? else {
        return Ok(name("unknown"));
    };
    let now = when.resolve(Some(fuse.last_now()));
    let reply = if fuse.withdraw(id, now).map_err(fuse_err)? {
        "withdrawn"
    } else if fuse.ticket(id).is_some_and(|t| t.lease_end > now) {
        fuse.complete(id, Outcome::Ignored, now).map_err(fuse_err)?;
        "released"
    } else {
        "unknown"
    };
    store(ctx, &args, &mut fuse, now, &Note::default())?;
    Ok(name(reply))
}

/// `FB.POLICY key now_ms policy_json`: the key takes `policy_json` from
/// `now_ms` on (SPEC Y4: the breaker keeps its phase, deadline, run and
/// epoch; held permits stay held; waiters that ask for more than a new
/// limit are denied), and is stored, replicated and its notices published
/// like every write. A key already under that very policy is settled to
/// `now_ms` and stored, as `FB.SETTLE` would. Replies the key's view as
/// JSON; an empty key is not written and replies nil (a key never used
/// starts under the policy its first `FB.ACQUIRE` sends).
pub fn policy(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if args.len() != 4 {
        return Err(RedisError::WrongArity);
    }
    let when = parse_now(&args[2])?;
    let policy = parse_policy(&args[3])?;
    let Some(mut fuse) = load(ctx, &args[1])? else {
        return Ok(RedisValue::Null);
    };
    let now = when.resolve(Some(fuse.last_now()));
    if fuse.policy().spec() != policy.spec() {
        fuse.set_policy(policy, now).map_err(fuse_err)?;
    } else {
        fuse.advance(now).map_err(fuse_err)?;
    }
    store(ctx, &args, &mut fuse, now, &Note::default())?;
    Ok(view_reply(&fuse, now))
}

/// The most keys `FB.LIST` asks one `SCAN` step for.
pub const LIST_MAX_COUNT: u64 = 10_000;

/// `FB.LIST cursor now_ms [MATCH pattern] [COUNT n]`: one step of `SCAN
/// cursor MATCH pattern COUNT n TYPE string` on this node, keeping the
/// keys that hold fusebox state (other strings, and fusebox strings this
/// module cannot read, are skipped), each read at `now_ms` on a copy as
/// `FB.GET` reads it; nothing is written. A key whose last time seen is
/// later than `now_ms` is read at that time (its view's `now_ms` says so),
/// so one key touched by a clock ahead of the caller's does not fail the
/// listing. Replies `[next_cursor, [key, view_json, key, view_json, ...]]`;
/// `next_cursor` is `0` when the pass is over. Keyless: in Redis Cluster a
/// caller sends it to each primary.
pub fn list(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if args.len() < 3 {
        return Err(RedisError::WrongArity);
    }
    let cursor = parse_number(
        &args[1],
        "cursor",
        u64::MAX,
        "a whole number: 0 to start, then the cursor the last FB.LIST replied",
    )?;
    let when = parse_now(&args[2])?;
    let options = parse_options(&args[3..], &["MATCH", "COUNT"])?;
    let count = options[1]
        .map(|a| parse_number(a, "count", LIST_MAX_COUNT, "a whole number from 1 to 10000"))
        .transpose()?
        .unwrap_or(100);
    if count == 0 {
        return Err(RedisError::Str(
            "ERR count: must be a whole number from 1 to 10000",
        ));
    }
    let cursor = cursor.to_string();
    let count = count.to_string();
    let mut scan: Vec<&[u8]> = vec![cursor.as_bytes()];
    if let Some(pattern) = options[0] {
        scan.extend([&b"MATCH"[..], pattern.as_slice()]);
    }
    scan.extend([&b"COUNT"[..], count.as_bytes(), b"TYPE", b"string"]);
    let reply = ctx.call("SCAN", scan.as_slice())?;
    let RedisValue::Array(parts) = reply else {
        return Err(RedisError::Str(
            "ERR list: SCAN gave no array (a module bug)",
        ));
    };
    let mut parts = parts.into_iter();
    let next = parts.next().map(settler::bytes).unwrap_or_default();
    let keys = match parts.next() {
        Some(RedisValue::Array(keys)) => keys,
        _ => Vec::new(),
    };
    let mut items = Vec::new();
    for key in keys.into_iter().map(settler::bytes) {
        let key_name = ctx.create_string(key.as_slice());
        let redis_key = ctx.open_key(&key_name);
        let Ok(Some(value)) = redis_key.read() else {
            continue;
        };
        let Ok(mut fuse) = state::decode_fuse(value) else {
            continue;
        };
        let now = when.resolve(Some(fuse.last_now())).max(fuse.last_now());
        if fuse.advance(now).is_err() {
            continue;
        }
        items.push(RedisValue::StringBuffer(key));
        items.push(view_reply(&fuse, now));
    }
    Ok(RedisValue::Array(vec![
        RedisValue::StringBuffer(if next.is_empty() { b"0".to_vec() } else { next }),
        RedisValue::Array(items),
    ]))
}

/// `FB.GET key now_ms`: what a read of the key shows at `now_ms` (SPEC
/// section 8), as JSON, or nil for an empty key. Lease ends and waits due
/// by `now_ms` are settled on a copy; nothing is written.
pub fn get(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if args.len() != 3 {
        return Err(RedisError::WrongArity);
    }
    let when = parse_now(&args[2])?;
    let Some(mut fuse) = load(ctx, &args[1])? else {
        return Ok(RedisValue::Null);
    };
    let now = when.resolve(Some(fuse.last_now()));
    fuse.advance(now).map_err(fuse_err)?;
    Ok(view_reply(&fuse, now))
}

/// The view of `fuse` at `now` as a JSON object: the fields of the
/// domain's `View` (the phase in lower case), the time it is read at
/// (`now_ms`), the statistics, and the policy in force as its spec.
pub fn view_json(fuse: &Fuse, now: Millis) -> serde_json::Value {
    let v = fuse.view(now);
    let s = &v.stats;
    let by_reason: serde_json::Map<String, serde_json::Value> = Reason::ALL
        .iter()
        .map(|r| (r.as_str().to_owned(), s.by_reason[*r as usize].into()))
        .collect();
    serde_json::json!({
        "phase": phase_name(v.phase),
        "consecutive_failures": v.consecutive_failures,
        "half_open_attempts": v.half_open_attempts,
        "open_until": v.open_until,
        "free": v.free,
        "limit": v.limit,
        "queued": v.queued,
        "live_tickets": v.live_tickets,
        "waiters": v.waiters,
        "epoch": v.epoch,
        "failure_ratio": v.failure_ratio,
        "changed_at": v.changed_at,
        "last_now": fuse.last_now(),
        "now_ms": now,
        "next_deadline": fuse.next_deadline(),
        "stats": {
            "granted": s.granted,
            "probes": s.probes,
            "blocked": s.blocked,
            "refused": s.refused,
            "denied": s.denied,
            "by_reason": by_reason,
            "queued": s.queued,
            "evicted": s.evicted,
            "timed_out": s.timed_out,
            "withdrawn": s.withdrawn,
            "failed": s.failed,
            "successes": s.successes,
            "failures": s.failures,
            "ignored": s.ignored,
            "stale": s.stale,
            "expired": s.expired,
        },
        "policy": fuse.policy().spec(),
    })
}

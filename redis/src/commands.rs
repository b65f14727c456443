//! The module's commands. Every command is deterministic given its
//! arguments (the caller supplies the time), so a replica or an AOF replay
//! that runs it again reaches the same state.
//!
//! Errors are `ERR <field>: <what to do>`, like the contract's messages.

use fusebox_domain::policy::MAX_DURATION;
use fusebox_domain::{
    Ask, Decision, Fuse, FuseError, Grant, Millis, Outcome, Policy, PolicySpec, Reason, TicketId,
};
use redis_module::{Context, KeyType, RedisError, RedisResult, RedisString, RedisValue};

use crate::state;

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

/// `now_ms`: the caller's monotonic clock in milliseconds (SPEC T0).
pub fn parse_now(arg: &RedisString) -> Result<Millis, RedisError> {
    parse_number(
        arg,
        "now_ms",
        MAX_NOW,
        "a whole number of milliseconds from 0 to 9007167718740992 (2^53 less 365 days); \
         send the caller's monotonic clock",
    )
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
    const WHAT: &str = "1 to 32 hex digits; send the id the ticket was acquired with";
    let text = arg_text(arg, "ticket", WHAT)?;
    let hex = !text.is_empty() && text.len() <= 32 && text.bytes().all(|b| b.is_ascii_hexdigit());
    hex.then(|| u128::from_str_radix(text, 16).ok())
        .flatten()
        .map(TicketId)
        .ok_or_else(|| RedisError::String(format!("ERR ticket: must be {WHAT}")))
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
fn load(ctx: &Context, key_name: &RedisString) -> Result<Option<Fuse>, RedisError> {
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

/// Stores `fuse` at the key and replicates the command as it came.
///
/// Notices are drained first and not kept: the waiters and lease ends they
/// tell of are for the fusebox servers to follow (see README.md), and a
/// key's value must not grow with them.
fn store(ctx: &Context, key_name: &RedisString, fuse: &mut Fuse) -> Result<(), RedisError> {
    fuse.drain_notices().for_each(drop);
    let value = String::from_utf8(state::encode_fuse(fuse))
        .map_err(|_| RedisError::Str("ERR state: the encoding is not UTF-8 (a module bug)"))?;
    ctx.open_key_writable(key_name).write(&value)?;
    ctx.replicate_verbatim();
    Ok(())
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

/// A decision as `[decision, reason|nil, ticket|nil, lease_ms|nil,
/// retry_after_ms|nil]`, names in lower case; `lease_ms` is the time left
/// on the ticket.
pub fn decision_reply(decision: &Decision, now: Millis) -> RedisValue {
    let null = || RedisValue::Null;
    let ticket = |g: &Grant| name(&g.ticket.to_string());
    let lease = |g: &Grant| millis(g.lease_end.saturating_sub(now));
    let retry = |r: Option<Millis>| r.map_or(RedisValue::Null, millis);
    RedisValue::Array(match decision {
        Decision::Granted(None) => vec![name("granted"), null(), null(), null(), null()],
        Decision::Granted(Some(g)) => vec![name("granted"), null(), ticket(g), lease(g), null()],
        Decision::Probe(g) => vec![name("probe"), null(), ticket(g), lease(g), null()],
        Decision::Blocked {
            reason,
            retry_after,
        } => vec![
            name("blocked"),
            name(reason.as_str()),
            null(),
            null(),
            retry(Some(*retry_after)),
        ],
        Decision::Refused => vec![name("refused"), null(), null(), null(), null()],
        Decision::Denied {
            reason,
            retry_after,
        } => vec![
            name("denied"),
            name(reason.as_str()),
            null(),
            null(),
            retry(*retry_after),
        ],
        Decision::Queued => vec![name("queued"), null(), null(), null(), null()],
    })
}

/// `FB.ACQUIRE key now_ms ticket_hex policy_json [PERMITS n] [LEASE ms]
/// [MAXWAIT ms]`: a request for permits under `policy_json` (SPEC C1–C3,
/// P1–P4). An empty key starts as a fresh fuse under the policy at
/// `now_ms`; a key whose policy differs takes the new one first (Y4).
pub fn acquire(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if args.len() < 5 {
        return Err(RedisError::WrongArity);
    }
    let now = parse_now(&args[2])?;
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
    let key_name = &args[1];
    let mut fuse = match load(ctx, key_name)? {
        Some(mut fuse) => {
            if fuse.policy().spec() != policy.spec() {
                fuse.set_policy(policy, now).map_err(fuse_err)?;
            }
            fuse
        }
        None => Fuse::new(policy, now),
    };
    let decision = fuse.acquire(&ask, id, now).map_err(fuse_err)?;
    store(ctx, key_name, &mut fuse)?;
    Ok(decision_reply(&decision, now))
}

/// `FB.COMPLETE key now_ms ticket_hex outcome`: records a ticket's outcome
/// (SPEC B3, C5, L4); replies `stale 0|1 phase <PHASE>`.
pub fn complete(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if args.len() != 5 {
        return Err(RedisError::WrongArity);
    }
    let now = parse_now(&args[2])?;
    let id = parse_ticket(&args[3])?;
    let outcome = parse_outcome(&args[4])?;
    let key_name = &args[1];
    let Some(mut fuse) = load(ctx, key_name)? else {
        return Err(fuse_err(FuseError::UnknownTicket));
    };
    let done = fuse.complete(id, outcome, now).map_err(fuse_err)?;
    store(ctx, key_name, &mut fuse)?;
    Ok(RedisValue::Array(vec![
        name("stale"),
        RedisValue::Integer(i64::from(done.stale)),
        name("phase"),
        name(done.phase.as_str()),
    ]))
}

/// `FB.RENEW key now_ms ticket_hex [LEASE ms]`: extends a live ticket's
/// lease from `now_ms` (SPEC L2); replies the lease granted in ms.
pub fn renew(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if args.len() < 4 {
        return Err(RedisError::WrongArity);
    }
    let now = parse_now(&args[2])?;
    let id = parse_ticket(&args[3])?;
    let options = parse_options(&args[4..], &["LEASE"])?;
    let lease = options[0].map(|a| parse_duration(a, "lease")).transpose()?;
    let key_name = &args[1];
    let Some(mut fuse) = load(ctx, key_name)? else {
        return Err(fuse_err(FuseError::UnknownTicket));
    };
    let granted = fuse.renew(id, lease, now).map_err(fuse_err)?;
    store(ctx, key_name, &mut fuse)?;
    Ok(millis(granted))
}

/// `FB.ISOLATE key now_ms`: an operator isolates the key's breaker (SPEC
/// B5); waiters are refused. The key must hold state (its policy).
pub fn isolate(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if args.len() != 3 {
        return Err(RedisError::WrongArity);
    }
    let now = parse_now(&args[2])?;
    let key_name = &args[1];
    let Some(mut fuse) = load(ctx, key_name)? else {
        return Err(RedisError::Str(
            "ERR key: holds no fusebox state, so no policy to isolate under; \
             FB.ACQUIRE on it first (PERMITS 0 is a status check that takes nothing)",
        ));
    };
    fuse.isolate(now).map_err(fuse_err)?;
    store(ctx, key_name, &mut fuse)?;
    Ok(RedisValue::SimpleStringStatic("OK"))
}

/// `FB.CLOSE key now_ms`: an operator closes the key's breaker with
/// everything cleared (SPEC B5). An empty key is closed already: `OK`,
/// nothing written.
pub fn close(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if args.len() != 3 {
        return Err(RedisError::WrongArity);
    }
    let now = parse_now(&args[2])?;
    let key_name = &args[1];
    if let Some(mut fuse) = load(ctx, key_name)? {
        fuse.close(now).map_err(fuse_err)?;
        store(ctx, key_name, &mut fuse)?;
    }
    Ok(RedisValue::SimpleStringStatic("OK"))
}

/// `FB.GET key now_ms`: what a read of the key shows at `now_ms` (SPEC
/// section 8), as JSON, or nil for an empty key. Lease ends and waits due
/// by `now_ms` are settled on a copy; nothing is written.
pub fn get(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if args.len() != 3 {
        return Err(RedisError::WrongArity);
    }
    let now = parse_now(&args[2])?;
    let Some(mut fuse) = load(ctx, &args[1])? else {
        return Ok(RedisValue::Null);
    };
    fuse.advance(now).map_err(fuse_err)?;
    Ok(RedisValue::BulkString(view_json(&fuse, now).to_string()))
}

/// The view of `fuse` at `now` as a JSON object: the fields of the
/// domain's `View`, the statistics, and the policy in force as its spec.
pub fn view_json(fuse: &Fuse, now: Millis) -> serde_json::Value {
    let v = fuse.view(now);
    let s = &v.stats;
    let by_reason: serde_json::Map<String, serde_json::Value> = Reason::ALL
        .iter()
        .map(|r| (r.as_str().to_owned(), s.by_reason[*r as usize].into()))
        .collect();
    serde_json::json!({
        "phase": v.phase,
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

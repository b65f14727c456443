//! Conversions between the engine's values and the wire's: durations and
//! milliseconds (T1), phases, timestamps, and ListKeys page tokens (A6).
//! Shared by the gRPC services, the client commands and the HTTP side, so
//! that none of them reaches into another for them.

use tonic::Status;

use crate::v1 as pb;
use fusebox_domain::policy::MAX_DURATION;
use fusebox_domain::{Millis, Phase};

/// `INVALID_ARGUMENT` naming `field`, worded as the engine's errors are
/// (`field: problem`).
fn invalid(field: &'static str, problem: impl Into<String>) -> Status {
    Status::invalid_argument(format!("{field}: {}", problem.into()))
}

/// Reads an optional wire duration as whole milliseconds, rounding a finer
/// duration up (T1); negative or out-of-range values name the field (E2).
pub fn millis_of(
    field: &'static str,
    d: Option<prost_types::Duration>,
) -> Result<Option<Millis>, Status> {
    let Some(d) = d else {
        return Ok(None);
    };
    if !(-999_999_999..=999_999_999).contains(&d.nanos)
        || (d.seconds > 0 && d.nanos < 0)
        || (d.seconds < 0 && d.nanos > 0)
    {
        return Err(invalid(
            field,
            "is not a valid duration: nanos out of range",
        ));
    }
    if d.seconds < 0 || d.nanos < 0 {
        return Err(invalid(field, "must not be negative"));
    }
    let max_seconds = (MAX_DURATION / 1000) as i64;
    if d.seconds > max_seconds {
        return Err(invalid(field, "must be at most 365 days"));
    }
    let ms = d.seconds as u64 * 1000 + (d.nanos as u64).div_ceil(1_000_000);
    if ms > MAX_DURATION {
        // 365 days and a fraction of a second rounds up past the limit (T1).
        return Err(invalid(field, "must be at most 365 days"));
    }
    Ok(Some(ms))
}

/// A whole number of milliseconds as a wire duration.
pub fn duration_of(ms: Millis) -> prost_types::Duration {
    prost_types::Duration {
        seconds: (ms / 1000) as i64,
        nanos: ((ms % 1000) * 1_000_000) as i32,
    }
}

/// The wire form of a phase.
pub fn phase_of(p: Phase) -> pb::Phase {
    match p {
        Phase::Closed => pb::Phase::Closed,
        Phase::Open => pb::Phase::Open,
        Phase::HalfOpen => pb::Phase::HalfOpen,
        Phase::Isolated => pb::Phase::Isolated,
    }
}

/// A wall-clock time as a wire timestamp.
pub fn timestamp_of(t: std::time::SystemTime) -> prost_types::Timestamp {
    let since = t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    prost_types::Timestamp {
        seconds: since.as_secs() as i64,
        nanos: since.subsec_nanos() as i32,
    }
}

/// What a page token is bound to: the request's prefix and phases (as a
/// set: their order and repeats do not matter).
pub fn filter_of(prefix: &str, phases: &[i32]) -> String {
    let phases: std::collections::BTreeSet<i32> = phases.iter().copied().collect();
    let phases: Vec<String> = phases.iter().map(i32::to_string).collect();
    format!("{prefix}\u{0}{}", phases.join(","))
}

/// An opaque page token: the filter it is bound to and the last key of
/// its page, in hexadecimal (tokens hold no server state, A6).
pub fn page_token(filter: &str, last: &str) -> String {
    fusebox_domain::hex::encode(format!("{filter}\u{0}{last}"))
}

/// The last key of the page `token` ends, if `token` was made for
/// `filter`; otherwise `INVALID_ARGUMENT` naming `page_token` (A6).
pub fn page_after(token: &str, filter: &str) -> Result<String, Status> {
    let bad = || invalid("page_token", "is not a token from a previous ListKeys page");
    let bytes = fusebox_domain::hex::decode(token).map_err(|_| bad())?;
    let text = String::from_utf8(bytes).map_err(|_| bad())?;
    let (token_filter, last) = text.rsplit_once('\u{0}').ok_or_else(bad)?;
    if token_filter != filter {
        return Err(invalid(
            "page_token",
            "was made for another prefix or phases; send the same filters as the first page",
        ));
    }
    Ok(last.to_owned())
}

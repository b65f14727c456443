//! Memory fits the box: the server learns how much memory it may use (the
//! config's `[server] memory_limit`, else its container's limit, cgroup
//! `memory.max`) and makes its caps fit in it, so that no tenant filling
//! its share can get the process killed for memory (and, embedded, every
//! tenant's state lost with it).
//!
//! The caps that memory bounds are the live keys, the live tickets, the
//! waiting requests and the unread bytes of streams; each costs at most
//! what [`KEY_BYTES`], [`TICKET_BYTES`] and [`WAITER_BYTES`] say (measured
//! with 256-byte key names, the longest a key may have; BENCHMARKS.md,
//! "Memory per key and per ticket"). When the worst case of the caps does
//! not fit in three quarters of the budget (the rest is the allocator's
//! and the kernel's), caps left at their defaults are lowered, all by one
//! factor, with one log line; caps the config sets are never lowered: a
//! server whose own caps do not fit does not start, and says which.

use crate::config::Limits;

/// Most a live key costs: its state, its name of up to 256 bytes held in
/// the map and in its share's key set, and the map's slack.
pub const KEY_BYTES: u64 = 768;

/// Most a live ticket costs besides its key: its slot, its token, its
/// index entry, and its share's count.
pub const TICKET_BYTES: u64 = 768;

/// Most a waiting request costs: its entry in the queue and the task that
/// waits for its answer.
pub const WAITER_BYTES: u64 = 2048;

/// What the server needs before any key: the runtime, the dashboard,
/// connections' buffers.
pub const BASE_BYTES: u64 = 64 << 20;

/// The part of the budget the caps' worst case may take, in percent.
const USABLE_PERCENT: u64 = 75;

/// The worst case of `limits`' caps, in bytes, with the server itself.
pub fn worst_case(limits: &Limits) -> u64 {
    [
        limits.max_keys.saturating_mul(KEY_BYTES),
        limits.max_tickets.saturating_mul(TICKET_BYTES),
        limits.max_waiters.saturating_mul(WAITER_BYTES),
        limits.max_unread_bytes,
        BASE_BYTES,
    ]
    .into_iter()
    .fold(0u64, u64::saturating_add)
}

/// `limits` made to fit in `budget` bytes (see the module documentation):
/// `Ok(None)` when they fit as they are, `Ok(Some(lowered))` when default
/// caps were lowered, `Err` (what to do, in words) when the config's own
/// caps do not fit. `source` names where the budget came from.
pub fn fit(limits: &Limits, budget: u64, source: &str) -> Result<Option<Limits>, String> {
    let usable = budget / 100 * USABLE_PERCENT;
    let worst = worst_case(limits);
    if worst <= usable {
        return Ok(None);
    }
    let mib = |b: u64| b >> 20;
    if limits.memory_caps_set {
        return Err(format!(
            "the caps need up to {} MiB (max_keys {} x {KEY_BYTES} B, max_tickets {} x {TICKET_BYTES} B, max_waiters {} x {WAITER_BYTES} B, max_unread_bytes {}, and {} MiB for the server), more than {USABLE_PERCENT}% of the memory limit of {} MiB ({source}): lower [server] max_keys, max_tickets, max_waiters or max_unread_bytes, or give the server more memory",
            mib(worst),
            limits.max_keys,
            limits.max_tickets,
            limits.max_waiters,
            limits.max_unread_bytes,
            mib(BASE_BYTES),
            mib(budget),
        ));
    }
    let room = usable.saturating_sub(BASE_BYTES);
    let wanted = worst.saturating_sub(BASE_BYTES).max(1);
    let scale = |cap: u64| -> u64 {
        let scaled = (u128::from(cap) * u128::from(room) / u128::from(wanted)) as u64;
        scaled.max(1)
    };
    let mut lowered = *limits;
    lowered.max_keys = scale(limits.max_keys);
    lowered.max_tickets = scale(limits.max_tickets);
    lowered.max_waiters = scale(limits.max_waiters);
    lowered.max_unread_bytes = scale(limits.max_unread_bytes);
    lowered.max_unread_bytes_per_stream = limits
        .max_unread_bytes_per_stream
        .min(lowered.max_unread_bytes);
    Ok(Some(lowered))
}

/// The memory the server may use and where that was learned: the config's
/// `memory_limit`, else the cgroup's (v2 `memory.max`, v1
/// `memory.limit_in_bytes`), else none.
pub fn budget(configured: Option<u64>) -> Option<(u64, String)> {
    if let Some(bytes) = configured {
        return Some((bytes, "[server] memory_limit".to_owned()));
    }
    for path in [
        "/sys/fs/cgroup/memory.max",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    ] {
        let Ok(text) = std::fs::read_to_string(path) else {
            continue;
        };
        // "max" (v2) or a number near u64::MAX (v1): no limit.
        match text.trim().parse::<u64>() {
            Ok(bytes) if bytes < 1 << 60 => {
                return Some((bytes, format!("the container's limit, {path}")))
            }
            _ => return None,
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_kubernetes_writes_them() {
        use crate::config::parse_size;
        assert_eq!(parse_size("512Mi"), Some(512 << 20));
        assert_eq!(parse_size("2Gi"), Some(2 << 30));
        assert_eq!(parse_size("500M"), Some(500_000_000));
        assert_eq!(parse_size("1048576"), Some(1 << 20));
        for bad in ["", "Mi", "12 Mi", "1.5Gi", "-1", "0", "7Qi"] {
            assert_eq!(parse_size(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn default_caps_are_lowered_to_fit_and_set_ones_refuse() {
        let defaults = Limits::default();
        let budget = 512 << 20;
        let lowered = fit(&defaults, budget, "test")
            .expect("defaults are lowered")
            .expect("lowered");
        assert!(
            worst_case(&lowered) <= budget / 100 * USABLE_PERCENT,
            "{lowered:?}"
        );
        assert!(
            lowered.max_keys < defaults.max_keys && lowered.max_keys > 100_000,
            "{lowered:?}"
        );
        assert_eq!(
            lowered.max_keys * 1_000 / defaults.max_keys,
            lowered.max_tickets * 1_000 / defaults.max_tickets,
            "one factor for all"
        );
        assert_eq!(
            fit(&defaults, 8 << 30, "test"),
            Ok(None),
            "8 GiB fits the defaults"
        );
        let set = Limits {
            memory_caps_set: true,
            ..defaults
        };
        let refused = fit(&set, budget, "test").expect_err("set caps are not lowered");
        assert!(
            refused.contains("max_keys") && refused.contains("512 MiB"),
            "{refused}"
        );
    }
}

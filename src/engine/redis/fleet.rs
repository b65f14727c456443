//! Fair shares fleet-wide (decisions 148): what each credential holds
//! through every server on the store, and the store's room.
//!
//! A few times a second each server writes, for each credential it
//! serves, what the credential holds through it (tickets, waiting
//! requests) and how many distinct keys it asked for fleet-wide, as one
//! field per server and credential of the hash [`SHARES_KEY`], and reads
//! every field back: the other servers' sums are what the credential holds
//! elsewhere. Keys are counted as distinct keys: each server adds the keys
//! it saw asked for to a HyperLogLog of the current period,
//! `fusebox:share:{NAME}:keys:N`, and counts them over the periods of the
//! idle time; the credential's keys elsewhere are that count less this
//! server's own. One share then holds across the fleet, give or take what
//! the servers take between two exchanges.
//!
//! Once a second it reads each primary's `INFO memory`: past
//! [`NEARLY_FULL`] of `maxmemory`, a credential that holds at least its
//! part of the store's counted keys has its new keys refused, so that a
//! greedy credential stops before Redis refuses everyone.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::Value;

use super::conn::Conn;
use super::reply::text;
use crate::domain::Millis;
use crate::engine::shares::{self, Kind, Share, KEYS_PERIOD};
use crate::engine::{Core, EngineError};

/// The hash of every server's holdings of every share: field
/// `SERVER\nCREDENTIAL`, value `TICKETS WAITERS KEYS AT_MS`.
pub const SHARES_KEY: &str = "fusebox:shares";

/// How often each server exchanges its shares' holdings.
pub(super) const EXCHANGE_EVERY: Duration = Duration::from_millis(250);

/// A server not heard from for this long holds nothing of any share.
const GONE_AFTER: Millis = 3_000;

/// A field not written for this long is deleted by the next reader.
const KEPT_FOR: Millis = 60_000;

/// How often the primaries' memory is read.
const MEMORY_EVERY: Duration = Duration::from_secs(1);

/// The part of `maxmemory` past which greedy credentials' new keys are
/// refused.
pub const NEARLY_FULL: f64 = 0.9;

/// This server's part in the exchange.
#[derive(Debug)]
pub(super) struct Fleet {
    /// This server's name in the shares' hash: random per start.
    me: String,
    /// When the primaries' memory was last read, and why the store is
    /// nearly full (`None`: it is not).
    room: tokio::sync::Mutex<(Option<Instant>, Option<Arc<str>>)>,
    /// The credentials whose holdings here were last written non-zero.
    written: Mutex<HashSet<String>>,
    /// Whether the last exchange failed.
    failing: AtomicBool,
}

impl Fleet {
    pub(super) fn new() -> Fleet {
        Fleet {
            me: format!("{:016x}", rand::random::<u64>()),
            room: tokio::sync::Mutex::new((None, None)),
            written: Mutex::new(HashSet::new()),
            failing: AtomicBool::new(false),
        }
    }

    /// Whether this server writes `share`'s holdings: it holds something
    /// here, or they were last written non-zero (and are written once
    /// more, as zeros).
    fn writes(&self, share: &Share) -> bool {
        let here = Kind::ALL.iter().any(|&k| share.held(k) > 0);
        let mut written = self.written.lock().expect("written shares");
        if here {
            written.insert(share.name().to_owned());
            true
        } else {
            written.remove(share.name())
        }
    }
}

/// The wall clock's Unix milliseconds: the servers' common time for the
/// exchange, whatever clock their decisions run on.
fn wall() -> Millis {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as Millis)
}

/// What the other servers hold of one share, as read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Heard {
    tickets: u64,
    waiters: u64,
    /// The most distinct keys any of them counted fleet-wide.
    keys: u64,
}

impl Fleet {
    /// One exchange: this server's holdings out, the others' in, and the
    /// store's room. Errors are logged: the shares keep their last figures.
    pub(super) async fn exchange_shares(&self, conn: &Conn, core: &Core) {
        let shares = core.shares().all();
        if shares.is_empty() {
            return;
        }
        let result = self.exchange(conn, core, &shares).await;
        // Said once when it starts failing and once when it works again.
        let failing = result.is_err();
        if self.failing.swap(failing, Ordering::Relaxed) != failing {
            match result {
                Err(e) => tracing::warn!("the fleet's shares cannot be exchanged through the store, so each server counts only what it serves until they can: {e} (with a least-privilege Redis user, grant the commands the README lists)"),
                Ok(()) => tracing::info!("the fleet's shares are exchanged through the store again"),
            }
        }
    }

    async fn exchange(
        &self,
        conn: &Conn,
        core: &Core,
        shares: &[Arc<Share>],
    ) -> Result<(), EngineError> {
        let full = self.nearly_full(conn).await;
        let idle_after = shares::key_idle_after(&core.limits());
        let now = wall();
        let mut set = redis::cmd("HSET");
        set.arg(SHARES_KEY);
        let mut counted_here = HashMap::new();
        for share in shares.iter().filter(|s| self.writes(s)) {
            let keys = count_keys(conn, share, now, idle_after).await?;
            counted_here.insert(share.name().to_owned(), keys);
            set.arg(format!("{}\n{}", self.me, share.name()))
                .arg(format!(
                    "{} {} {keys} {now}",
                    share.held(Kind::Tickets),
                    share.held(Kind::Waiters)
                ));
        }
        if !counted_here.is_empty() {
            conn.query(&set).await?;
            let mut keep = redis::cmd("PEXPIRE");
            keep.arg(SHARES_KEY).arg(KEPT_FOR);
            conn.query(&keep).await?;
        }
        let mut get = redis::cmd("HGETALL");
        get.arg(SHARES_KEY);
        let (heard, stale) = heard(&conn.query(&get).await?, &self.me, now);
        if !stale.is_empty() {
            let mut forget = redis::cmd("HDEL");
            forget.arg(SHARES_KEY).arg(stale);
            conn.query(&forget).await?;
        }
        let mut counted = Vec::with_capacity(shares.len());
        for share in shares {
            let theirs = heard.get(share.name()).copied().unwrap_or_default();
            let keys = theirs
                .keys
                .max(counted_here.get(share.name()).copied().unwrap_or(0));
            share.set_elsewhere(Kind::Tickets, theirs.tickets);
            share.set_elsewhere(Kind::Waiters, theirs.waiters);
            share.set_elsewhere(Kind::Keys, keys.saturating_sub(share.held(Kind::Keys)));
            counted.push(keys);
        }
        // A credential's part of the store: the counted keys shared evenly.
        let total: u64 = counted.iter().sum();
        let part = total.div_ceil(shares.len() as u64);
        for (share, keys) in shares.iter().zip(counted) {
            let refused = full.as_ref().filter(|_| keys >= part).map(|why| {
                Arc::from(format!(
                    "{why}: credential {:?} holds {keys} of the {total} keys counted there, at least its part ({part}), so its new keys are refused (keys that exist are still decided)",
                    share.name()
                ))
            });
            share.refuse_new_keys(refused);
        }
        Ok(())
    }

    /// Why the store is nearly full, read from the primaries at most once
    /// a second; `None` while every primary has room (or has no
    /// `maxmemory`).
    async fn nearly_full(&self, conn: &Conn) -> Option<Arc<str>> {
        let mut room = self.room.lock().await;
        if room.0.is_some_and(|at| at.elapsed() < MEMORY_EVERY) {
            return room.1.clone();
        }
        let mut why = None;
        let mut read = false;
        if let Ok(primaries) = conn.primaries().await {
            for node in primaries {
                let mut info = redis::cmd("INFO");
                info.arg("memory");
                let Ok(value) = conn.on_node(&node, &info).await else {
                    continue;
                };
                let Some(text) = text(&value) else {
                    continue;
                };
                read = true;
                let (used, max) = (field(text, "used_memory"), field(text, "maxmemory"));
                if let (Some(used), Some(max)) = (used, max) {
                    if max > 0 && used as f64 >= NEARLY_FULL * max as f64 {
                        why = Some(Arc::from(format!(
                            "Redis on {node} is nearly full, using {used} bytes of its maxmemory {max} ({:.0}%)",
                            100.0 * used as f64 / max as f64
                        )));
                        break;
                    }
                }
            }
        }
        if !read {
            // Unreadable: keep what was known.
            room.0 = Some(Instant::now());
            return room.1.clone();
        }
        match (&room.1, &why) {
            (None, Some(w)) => tracing::warn!("{w}: credentials holding at least their part of its keys have their new keys refused"),
            (Some(_), None) => tracing::info!("the store has room again: every credential may make new keys"),
            _ => {}
        }
        *room = (Some(Instant::now()), why.clone());
        why
    }
}

/// Adds the keys `share` was asked for here to the current period's
/// count and returns the distinct keys it asked for fleet-wide within
/// `idle_after`.
async fn count_keys(
    conn: &Conn,
    share: &Share,
    now: Millis,
    idle_after: Millis,
) -> Result<u64, EngineError> {
    let prefix = format!("fusebox:share:{{{}}}:keys:", share.name());
    let period = now / KEYS_PERIOD;
    let asked = share.take_unpublished();
    for chunk in asked.chunks(1_000) {
        let mut add = redis::cmd("PFADD");
        add.arg(format!("{prefix}{period}"));
        for key in chunk {
            add.arg(key.as_bytes());
        }
        conn.query(&add).await?;
    }
    if !asked.is_empty() {
        let mut keep = redis::cmd("PEXPIRE");
        keep.arg(format!("{prefix}{period}"))
            .arg(idle_after.saturating_add(2 * KEYS_PERIOD));
        conn.query(&keep).await?;
    }
    let first = now.saturating_sub(idle_after) / KEYS_PERIOD;
    let mut count = redis::cmd("PFCOUNT");
    for p in first..=period {
        count.arg(format!("{prefix}{p}"));
    }
    match conn.query(&count).await? {
        Value::Int(n) => Ok(n.max(0) as u64),
        other => Err(EngineError::Internal(format!("PFCOUNT answered {other:?}"))),
    }
}

/// What the other servers hold of each credential, from the shares'
/// hash, and the fields no server wrote for [`KEPT_FOR`]; servers not
/// heard from within [`GONE_AFTER`] hold nothing.
fn heard(value: &Value, me: &str, now: Millis) -> (HashMap<String, Heard>, Vec<String>) {
    let pairs: Vec<(String, String)> = match value {
        Value::Map(pairs) => pairs
            .iter()
            .filter_map(|(k, v)| Some((text(k)?.to_owned(), text(v)?.to_owned())))
            .collect(),
        Value::Array(items) => items
            .chunks(2)
            .filter_map(|kv| Some((text(kv.first()?)?.to_owned(), text(kv.get(1)?)?.to_owned())))
            .collect(),
        _ => Vec::new(),
    };
    let mut sums: HashMap<String, Heard> = HashMap::new();
    let mut stale = Vec::new();
    for (field, held) in pairs {
        let Some((server, credential)) = field.split_once('\n') else {
            stale.push(field);
            continue;
        };
        let numbers: Vec<u64> = held.split(' ').filter_map(|w| w.parse().ok()).collect();
        let [tickets, waiters, keys, at] = numbers[..] else {
            stale.push(field);
            continue;
        };
        if at.saturating_add(KEPT_FOR) < now {
            stale.push(field);
            continue;
        }
        if server == me || at.saturating_add(GONE_AFTER) < now {
            continue;
        }
        let sum = sums.entry(credential.to_owned()).or_default();
        sum.tickets = sum.tickets.saturating_add(tickets);
        sum.waiters = sum.waiters.saturating_add(waiters);
        sum.keys = sum.keys.max(keys);
    }
    (sums, stale)
}

/// A `name:value` line's number in an `INFO` text.
fn field(info: &str, name: &str) -> Option<u64> {
    info.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn the_others_holdings_are_summed_and_the_gone_left_out() {
        let hash = Value::Array(vec![
            bulk("me\nt"),
            bulk("9 9 9 100000"),
            bulk("a\nt"),
            bulk("3 1 7 100000"),
            bulk("b\nt"),
            bulk("2 0 5 99000"),
            bulk("b\nu"),
            bulk("1 1 1 99000"),
            bulk("quiet\nt"),
            bulk("50 50 50 90000"),
            bulk("dead\nt"),
            bulk("50 50 50 10"),
            bulk("garbled"),
            bulk("x"),
        ]);
        let (sums, mut stale) = heard(&hash, "me", 100_000);
        let t = Heard {
            tickets: 5,
            waiters: 1,
            keys: 7,
        };
        assert_eq!(sums.get("t"), Some(&t));
        assert_eq!(sums.get("u").map(|h| h.tickets), Some(1));
        stale.sort();
        assert_eq!(stale, ["dead\nt", "garbled"]);
    }

    #[test]
    fn info_fields_are_read_whole() {
        let info = "# Memory\r\nused_memory:1024\r\nused_memory_human:1K\r\nmaxmemory:2048\r\n";
        assert_eq!(field(info, "used_memory"), Some(1024));
        assert_eq!(field(info, "maxmemory"), Some(2048));
        assert_eq!(field(info, "maxmemory_policy"), None);
    }
}

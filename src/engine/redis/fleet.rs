//! Fair shares fleet-wide (decisions 147): what each credential holds
//! through every server on the store, and the store's room.
//!
//! A few times a second each server writes, per credential, what it holds
//! through it (tickets, waiting requests) into the hash
//! `fusebox:share:{NAME}` under its own id, and reads the others' back:
//! their sum is what the credential holds elsewhere. Keys are counted as
//! distinct keys: each server adds the keys it saw asked for to a
//! HyperLogLog of the current period, `fusebox:share:{NAME}:keys:N`, and
//! the count over the periods of the idle time, less this server's own,
//! is what the others asked for. One share then holds across the fleet,
//! give or take what the servers take between two exchanges.
//!
//! Once a second it reads each primary's `INFO memory`: past
//! [`NEARLY_FULL`] of `maxmemory`, a credential that holds more than its
//! part of the store's counted keys has its new keys refused, so that a
//! greedy credential stops before Redis refuses everyone.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::Value;

use super::RedisStore;
use crate::domain::Millis;
use crate::engine::shares::{self, Kind, Share, KEYS_PERIOD};
use crate::engine::EngineError;

/// How often each server exchanges its shares' holdings.
pub(super) const EXCHANGE_EVERY: Duration = Duration::from_millis(250);

/// A server not heard from for this long holds nothing of any share.
const GONE_AFTER: Millis = 3_000;

/// How long a server's holdings outlive its last exchange in Redis.
const KEPT_FOR: Millis = 60_000;

/// How often the primaries' memory is read.
const MEMORY_EVERY: Duration = Duration::from_secs(1);

/// The part of `maxmemory` past which greedy credentials' new keys are
/// refused.
pub const NEARLY_FULL: f64 = 0.9;

/// This server's part in the exchange.
#[derive(Debug)]
pub(super) struct Fleet {
    /// This server's name in the shares' hashes: random per start.
    me: String,
    /// When the primaries' memory was last read, and why the store is
    /// nearly full (`None`: it is not).
    room: tokio::sync::Mutex<(Option<Instant>, Option<Arc<str>>)>,
}

impl Fleet {
    pub(super) fn new() -> Fleet {
        Fleet {
            me: format!("{:016x}", rand::random::<u64>()),
            room: tokio::sync::Mutex::new((None, None)),
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

/// The hash of a credential's holdings, and the prefix of its keys' counts:
/// one hash slot per credential.
fn names(credential: &str) -> (String, String) {
    let base = format!("fusebox:share:{{{credential}}}");
    let keys = format!("{base}:keys:");
    (base, keys)
}

impl RedisStore {
    /// One exchange: every share's holdings out, the others' in, and the
    /// store's room. Errors are logged: the shares keep their last figures.
    pub(super) async fn exchange_shares(&self) {
        let shares = self.core.shares().all();
        if shares.is_empty() {
            return;
        }
        let full = self.nearly_full().await;
        let idle_after = shares::key_idle_after(&self.core.limits());
        let mut counted = Vec::with_capacity(shares.len());
        for share in &shares {
            match self.exchange_one(share, idle_after).await {
                Ok(keys) => counted.push(keys),
                Err(e) => {
                    tracing::debug!(
                        credential = share.name(),
                        "the fleet's shares could not be exchanged through the store: {e}"
                    );
                    return;
                }
            }
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
    }

    /// Writes `share`'s holdings here, reads the others', and returns the
    /// distinct keys it asked for fleet-wide within `idle_after`.
    async fn exchange_one(&self, share: &Share, idle_after: Millis) -> Result<u64, EngineError> {
        let now = wall();
        let (hash, keys) = names(share.name());
        let mine = format!(
            "{} {} {now}",
            share.held(Kind::Tickets),
            share.held(Kind::Waiters)
        );
        let mut set = redis::cmd("HSET");
        set.arg(&hash).arg(&self.fleet.me).arg(mine);
        self.conn.query(&set).await?;
        let mut keep = redis::cmd("PEXPIRE");
        keep.arg(&hash).arg(KEPT_FOR);
        self.conn.query(&keep).await?;
        let mut get = redis::cmd("HGETALL");
        get.arg(&hash);
        let (tickets, waiters) = others(&self.conn.query(&get).await?, &self.fleet.me, now);
        share.set_elsewhere(Kind::Tickets, tickets);
        share.set_elsewhere(Kind::Waiters, waiters);

        let period = now / KEYS_PERIOD;
        let asked = share.take_unpublished();
        for chunk in asked.chunks(1_000) {
            let mut add = redis::cmd("PFADD");
            add.arg(format!("{keys}{period}"));
            for key in chunk {
                add.arg(key.as_bytes());
            }
            self.conn.query(&add).await?;
        }
        if !asked.is_empty() {
            let mut keep = redis::cmd("PEXPIRE");
            keep.arg(format!("{keys}{period}"))
                .arg(idle_after.saturating_add(2 * KEYS_PERIOD));
            self.conn.query(&keep).await?;
        }
        let first = now.saturating_sub(idle_after) / KEYS_PERIOD;
        let mut count = redis::cmd("PFCOUNT");
        for p in first..=period {
            count.arg(format!("{keys}{p}"));
        }
        let fleet = match self.conn.query(&count).await? {
            Value::Int(n) => n.max(0) as u64,
            other => return Err(EngineError::Internal(format!("PFCOUNT answered {other:?}"))),
        };
        share.set_elsewhere(Kind::Keys, fleet.saturating_sub(share.held(Kind::Keys)));
        Ok(fleet)
    }

    /// Why the store is nearly full, read from the primaries at most once
    /// a second; `None` while every primary has room (or has no
    /// `maxmemory`).
    async fn nearly_full(&self) -> Option<Arc<str>> {
        let mut room = self.fleet.room.lock().await;
        if room.0.is_some_and(|at| at.elapsed() < MEMORY_EVERY) {
            return room.1.clone();
        }
        let mut why = None;
        let mut read = false;
        if let Ok(primaries) = self.conn.primaries().await {
            for node in primaries {
                let mut info = redis::cmd("INFO");
                info.arg("memory");
                let Ok(value) = self.conn.on_node(&node, &info).await else {
                    continue;
                };
                let Some(text) = text(&value) else {
                    continue;
                };
                read = true;
                let (used, max) = (field(&text, "used_memory"), field(&text, "maxmemory"));
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

/// What the other servers hold (tickets, waiting requests), from a
/// share's hash; servers not heard from within [`GONE_AFTER`] hold nothing.
fn others(value: &Value, me: &str, now: Millis) -> (u64, u64) {
    let pairs: Vec<(String, String)> = match value {
        Value::Map(pairs) => pairs
            .iter()
            .filter_map(|(k, v)| Some((text(k)?, text(v)?)))
            .collect(),
        Value::Array(items) => items
            .chunks(2)
            .filter_map(|kv| Some((text(kv.first()?)?, text(kv.get(1)?)?)))
            .collect(),
        _ => Vec::new(),
    };
    let mut sum = (0u64, 0u64);
    for (server, held) in pairs {
        if server == me {
            continue;
        }
        let mut words = held.split(' ').map(|w| w.parse::<u64>().ok());
        let (Some(Some(tickets)), Some(Some(waiters)), Some(Some(at))) =
            (words.next(), words.next(), words.next())
        else {
            continue;
        };
        if at.saturating_add(GONE_AFTER) >= now {
            sum.0 = sum.0.saturating_add(tickets);
            sum.1 = sum.1.saturating_add(waiters);
        }
    }
    sum
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        _ => None,
    }
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
            bulk("me"),
            bulk("9 9 1000"),
            bulk("a"),
            bulk("3 1 1000"),
            bulk("b"),
            bulk("2 0 1500"),
            bulk("gone"),
            bulk("50 50 10"),
            bulk("garbled"),
            bulk("x"),
        ]);
        assert_eq!(others(&hash, "me", 4_000), (5, 1));
    }

    #[test]
    fn info_fields_are_read_whole() {
        let info = "# Memory\r\nused_memory:1024\r\nused_memory_human:1K\r\nmaxmemory:2048\r\n";
        assert_eq!(field(info, "used_memory"), Some(1024));
        assert_eq!(field(info, "maxmemory"), Some(2048));
        assert_eq!(field(info, "maxmemory_policy"), None);
    }
}

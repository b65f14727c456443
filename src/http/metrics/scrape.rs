//! What one scrape reads before it writes: the store's figures (its
//! totals, kept as keys change) and the keys that get per-key series, with
//! the aggregates of the others. Everything else (the server's counters,
//! its ports, shares, storage, store links, TLS) is read while the text
//! is written ([`super::collector`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::engine::shares::Share;
use crate::engine::{Figures, KeyReading, Pattern, Rules, Store};
use crate::http::state::HttpFigures;
use crate::node::Node;

/// How many of the busiest keys get per-key series, besides the keys named
/// by exact rules.
pub const TOP_KEYS: usize = 100;

/// Whose keys get per-key series.
#[derive(Clone, Debug)]
pub enum Shown {
    /// Every key (no `[auth]`).
    Every,
    /// The keys a credential may read (an operator's).
    Of(Arc<crate::auth::Grant>),
    /// None: `/metrics` asked without a credential under `[auth]`; key
    /// names are the tenants' own.
    None,
}

impl Shown {
    fn shows(&self, key: &str) -> bool {
        match self {
            Shown::Every => true,
            Shown::Of(grant) => grant
                .on_key(crate::auth::Role::Metrics, "GET /metrics", key)
                .is_ok(),
            Shown::None => false,
        }
    }

    /// Whether the share of the credential `name` is shown: to a
    /// credential over every key, all; to one limited to some prefixes, its
    /// own; without one, none.
    fn shows_share(&self, name: &str) -> bool {
        match self {
            Shown::Every => true,
            Shown::Of(grant) => grant.scope.is_all() || grant.tenant == name,
            Shown::None => false,
        }
    }
}

/// One scrape of one server.
#[derive(Debug)]
pub struct Scrape {
    /// The server scraped.
    pub(super) node: Arc<Node>,
    /// Its HTTP side's own figures.
    pub(super) http: HttpFigures,
    /// The store's figures.
    pub(super) figures: Figures,
    /// The rules in force.
    pub(super) rules: Arc<Rules>,
    /// The keys with per-key series, in key order.
    pub(super) keys: Vec<KeyReading>,
    /// Live keys by phase without per-key series.
    pub(super) other_by_phase: [u64; 4],
    /// Their live tickets.
    pub(super) other_tickets: u64,
    /// Their waiters.
    pub(super) other_waiters: u64,
    /// The credentials' shares shown, with the rules each holds.
    pub(super) shares: Vec<(Arc<Share>, u64)>,
    /// The process's resident memory, where it can be read.
    pub(super) resident_memory: Option<u64>,
}

impl Scrape {
    /// Reads what `node`'s scrape needs first, for `shown`.
    pub async fn read(node: Arc<Node>, http: HttpFigures, shown: &Shown) -> Scrape {
        let store = node.store();
        let rules = store.rules();
        let exact: Vec<String> = rules
            .rules
            .iter()
            .filter_map(|r| match &r.pattern {
                Pattern::Exact(key) => Some(key.clone()),
                Pattern::Prefix(_) => None,
            })
            .collect();
        let figures = store.figures().await;
        let (keys, live) = shown_keys(store, &exact, shown).await;
        // The aggregates are the totals less the live keys shown. The
        // readings and the totals are taken at nearly the same instant, not
        // at once: a difference never goes below zero.
        let totals = &figures.totals;
        let mut other_by_phase = totals.by_phase;
        let mut other_tickets = totals.tickets;
        let mut other_waiters = totals.waiters;
        for r in keys.iter().zip(&live).filter(|(_, l)| **l).map(|(r, _)| r) {
            let n = &mut other_by_phase[r.view.phase.index()];
            *n = n.saturating_sub(1);
            other_tickets = other_tickets.saturating_sub(r.view.live_tickets as u64);
            other_waiters = other_waiters.saturating_sub(r.view.waiters as u64);
        }
        let shares = shares_of(&node, shown);
        Scrape {
            http,
            figures,
            rules,
            keys,
            other_by_phase,
            other_tickets,
            other_waiters,
            shares,
            resident_memory: resident_memory_bytes(),
            node,
        }
    }
}

/// The keys with per-key series: those named by exact rules, live or not
/// (a key not live reads as a fresh key would, K2, B6), then the busiest.
/// Also says which of them are live, for the aggregates.
async fn shown_keys(
    store: &Store,
    exact: &[String],
    whose: &Shown,
) -> (Vec<KeyReading>, Vec<bool>) {
    let mut shown: BTreeMap<String, (KeyReading, bool)> = BTreeMap::new();
    if matches!(whose, Shown::None) {
        return (Vec::new(), Vec::new());
    }
    for key in exact.iter().filter(|k| whose.shows(k)) {
        let Ok((reading, live)) = store.read(key).await else {
            continue;
        };
        shown.insert(key.clone(), (reading, live));
    }
    for reading in store.busiest(TOP_KEYS).await {
        if !whose.shows(&reading.key) {
            continue;
        }
        shown
            .entry(reading.key.clone())
            .or_insert_with(|| (reading, true));
    }
    shown.into_values().unzip()
}

/// The shares shown (decisions 99), swept first, each with the rules in
/// force that its credential holds: counted from the rules by the
/// credential's prefixes (the first entry of a name sets its share).
fn shares_of(node: &Node, whose: &Shown) -> Vec<(Arc<Share>, u64)> {
    let core = node.store().core();
    let shares: Vec<_> = core
        .shares()
        .all()
        .into_iter()
        .filter(|s| whose.shows_share(s.name()))
        .collect();
    let now = core.now();
    let key_idle = crate::engine::shares::key_idle_after(&core.limits());
    let rules = core.rules();
    let access = node.access();
    shares
        .into_iter()
        .map(|share| {
            share.sweep(now);
            share.sweep_keys(now, key_idle);
            let held = access
                .as_deref()
                .and_then(|a| a.grants().find(|g| g.tenant == share.name()))
                .map_or(0, |g| {
                    crate::engine::shares::rules_held(&rules, |p| g.scope.covers_pattern(p))
                });
            (share, held)
        })
        .collect()
}

/// The process's resident memory in bytes (`VmRSS` in `/proc/self/status`);
/// `None` where there is no such file (not Linux).
pub fn resident_memory_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    vm_rss_bytes(&status)
}

/// The `VmRSS:` line of a `/proc/PID/status` text, in bytes.
fn vm_rss_bytes(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let mut words = line["VmRSS:".len()..].split_whitespace();
    let n: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") | None => Some(n * 1024),
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resident_memory_is_read_from_vm_rss() {
        let status = "Name:\tfusebox\nVmPeak:\t  9000 kB\nVmRSS:\t   1234 kB\nThreads:\t4\n";
        assert_eq!(vm_rss_bytes(status), Some(1234 * 1024));
        assert_eq!(vm_rss_bytes("Name:\tx\n"), None);
        if cfg!(target_os = "linux") {
            assert!(resident_memory_bytes().is_some_and(|b| b > 0));
        }
    }
}

//! `/metrics`: the engine in the Prometheus text format (version 0.0.4),
//! written by hand. Every name starts with `fusebox_`.
//!
//! A scrape costs the same with a million keys as with ten: engine-wide
//! figures come from [`Engine::totals`], kept as they change, never from a
//! walk over the keys. Per-key series (label `key`) exist only for a
//! bounded set: the keys that exact rules name (each read with
//! [`Engine::get`]) and the [`TOP_KEYS`] busiest keys
//! ([`Engine::busiest`]); every other live key is counted in the
//! `fusebox_other_keys*` aggregates, which are the totals less the keys
//! shown.
//!
//! `process_resident_memory_bytes` (the standard name, so that load tools
//! and dashboards find it; the only name without the `fusebox_` prefix) is
//! the process's resident memory, from `/proc/self/status` (Linux only).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::Ordering;

use crate::domain::{Phase, Reason};
use crate::engine::Pattern;
use crate::engine::{KeyReading, Store, CAP_NAMES, DECISION_NAMES};
use crate::node::Node;

/// How many of the busiest keys get per-key series, besides the keys named
/// by exact rules.
pub const TOP_KEYS: usize = 100;

/// The content type of the text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

const PHASES: [Phase; 4] = [Phase::Closed, Phase::Open, Phase::HalfOpen, Phase::Isolated];

/// Escapes a label value: backslash, double quote and line feed.
fn escape_label(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// Escapes HELP text: backslash and line feed.
fn escape_help(text: &str) -> String {
    text.replace('\\', "\\\\").replace('\n', "\\n")
}

/// A float as the text format writes it.
fn float(v: f64) -> String {
    if v.is_nan() {
        "NaN".to_owned()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.to_owned()
    } else {
        format!("{v}")
    }
}

/// The text being written; families are written whole, one after another.
#[derive(Default)]
struct Exposition {
    out: String,
}

impl Exposition {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {}", escape_help(help));
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl std::fmt::Display) {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (label, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{label}=\"{}\"", escape_label(v));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {value}");
    }

    /// A family of one unlabelled sample.
    fn single(&mut self, name: &str, kind: &str, help: &str, value: impl std::fmt::Display) {
        self.family(name, kind, help);
        self.sample(name, &[], value);
    }

    /// A per-key family: one sample per key that `value` has a value for.
    fn per_key(
        &mut self,
        keys: &[KeyReading],
        name: &str,
        kind: &str,
        help: &str,
        value: impl Fn(&KeyReading) -> Option<String>,
    ) {
        self.family(name, kind, help);
        for r in keys {
            if let Some(v) = value(r) {
                self.sample(name, &[("key", &r.key)], v);
            }
        }
    }
}

/// The HTTP side's own figures, for the exposition.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HttpFigures {
    /// Dashboard event streams open now.
    pub event_streams: u64,
    /// Event streams refused because [`HttpFigures::max_event_streams`] were open.
    pub event_streams_refused: u64,
    /// The cap on open event streams.
    pub max_event_streams: u64,
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

/// Whose keys get per-key series.
#[derive(Clone, Debug)]
pub enum Shown {
    /// Every key (no `[auth]`).
    Every,
    /// The keys a credential may read (an operator's).
    Of(std::sync::Arc<crate::auth::Grant>),
    /// None: `/metrics` asked without a credential under `[auth]`; key
    /// names are the tenants' own.
    None,
}

impl Shown {
    fn shows(&self, key: &str) -> bool {
        match self {
            Shown::Every => true,
            Shown::Of(grant) => grant
                .on_key(crate::auth::Role::Operator, "GET /metrics", key)
                .is_ok(),
            Shown::None => false,
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

/// What each credential holds, may hold and was refused (decisions 99):
/// a series per credential name, which the config bounds. A credential
/// limited to some prefixes sees its own; without one, none are shown.
fn share_families(x: &mut Exposition, node: &Node, whose: &Shown) {
    let core = node.store().core();
    use crate::engine::shares::Kind;
    let shares: Vec<_> = core
        .shares()
        .all()
        .into_iter()
        .filter(|s| match whose {
            Shown::Every => true,
            Shown::Of(grant) => grant.scope.is_all() || grant.name == s.name(),
            Shown::None => false,
        })
        .collect();
    let now = core.now();
    let key_idle = crate::engine::shares::key_idle_after(&core.limits());
    for share in &shares {
        share.sweep(now);
        share.sweep_keys(now, key_idle);
    }
    // Rules held are counted from the rules in force, by each
    // credential's prefixes (the first entry of a name sets its share).
    let rules = core.rules();
    let access = node.access();
    let rules_held = |name: &str| {
        access
            .as_deref()
            .and_then(|a| a.grants().find(|g| g.name == name))
            .map_or(0, |g| {
                crate::engine::shares::rules_held(&rules, |p| g.scope.covers_pattern(p))
            })
    };
    let kind_of = |k: Kind| k.field().trim_start_matches("max_");
    type Value = fn(&crate::engine::shares::Share, Kind) -> u64;
    let families: [(&str, &str, &str, &str, Value); 3] = [
        (
            "fusebox_share_held",
            "gauge",
            "What each credential holds now, by kind (its share: fusebox_share_limit).",
            "kind",
            |s, k| s.held(k),
        ),
        (
            "fusebox_share_limit",
            "gauge",
            "What each credential may hold at once, by kind (its entry's limits, else [auth] share of the [server] cap).",
            "kind",
            |s, k| s.limit(k),
        ),
        (
            "fusebox_share_refusals_total",
            "counter",
            "Requests refused (RESOURCE_EXHAUSTED) because a credential held all its share, by credential and limit.",
            "limit",
            |s, k| s.refused(k),
        ),
    ];
    for (name, type_, help, label, value) in families {
        x.family(name, type_, help);
        for share in &shares {
            for kind in Kind::ALL {
                let shown = if label == "kind" {
                    kind_of(kind)
                } else {
                    kind.field()
                };
                let labels = [("credential", share.name()), (label, shown)];
                let v = match (name, kind) {
                    ("fusebox_share_held", Kind::Rules) => rules_held(share.name()),
                    _ => value(share, kind),
                };
                x.sample(name, &labels, v);
            }
        }
    }
}

/// The whole exposition of `store`, with the HTTP side's own figures.
pub async fn render(node: &Node, http: &HttpFigures, whose: &Shown) -> String {
    let store = node.store();
    let core = store.core();
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
    let totals = figures.totals;
    let (keys, live) = shown_keys(store, &exact, whose).await;
    let shown_to = whose;
    // The aggregates are the totals less the live keys shown. The readings
    // and the totals are taken at nearly the same instant, not at once:
    // a difference never goes below zero.
    let mut other_by_phase = totals.by_phase;
    let mut other_tickets = totals.tickets;
    let mut other_waiters = totals.waiters;
    for r in keys
        .iter()
        .zip(&live)
        .filter(|(_, live)| **live)
        .map(|(r, _)| r)
    {
        let n = &mut other_by_phase[r.view.phase.index()];
        *n = n.saturating_sub(1);
        other_tickets = other_tickets.saturating_sub(r.view.live_tickets as u64);
        other_waiters = other_waiters.saturating_sub(r.view.waiters as u64);
    }

    let mut x = Exposition::default();
    let limits = node.limits();
    let counters = node.counters();
    let transport = &crate::connections::FIGURES;
    let whose = if figures.fleet_wide {
        " (the whole store's, every server alike)"
    } else {
        ""
    };
    x.single(
        "fusebox_keys",
        "gauge",
        &format!("Live keys{whose}."),
        totals.keys,
    );
    x.single(
        "fusebox_tickets",
        "gauge",
        &format!("Live tickets{whose}."),
        totals.tickets,
    );
    x.single(
        "fusebox_waiters",
        "gauge",
        &format!("Requests waiting in a queue{whose}."),
        totals.waiters,
    );
    // Only embedded: Redis forgets keys at rest itself, uncounted.
    if let Some(forgotten) = figures.forgotten {
        x.single(
            "fusebox_keys_forgotten_total",
            "counter",
            "Idle keys at rest forgotten since start (K2).",
            forgotten,
        );
    }
    x.single(
        "fusebox_max_keys",
        "gauge",
        "Cap on live keys ([server] max_keys).",
        limits.max_keys,
    );
    x.single(
        "fusebox_max_tickets",
        "gauge",
        "Cap on live tickets ([server] max_tickets).",
        limits.max_tickets,
    );
    x.single(
        "fusebox_max_waiters",
        "gauge",
        "Cap on waiting requests ([server] max_waiters).",
        limits.max_waiters,
    );
    x.single(
        "fusebox_max_connections",
        "gauge",
        "Cap on open gRPC connections ([server] max_connections).",
        limits.max_connections,
    );
    x.single(
        "fusebox_connections",
        "gauge",
        "Open gRPC connections.",
        transport.connections.load(Ordering::Relaxed),
    );
    x.single(
        "fusebox_connections_refused_total",
        "counter",
        "gRPC connections closed at once because max_connections was reached.",
        transport.connections_refused.load(Ordering::Relaxed),
    );
    let caps = crate::connections::caps(&limits.connections());
    for (name, kind, help, value) in [
        (
            "fusebox_handshakes",
            "gauge",
            "gRPC connections still in their handshake (they hold no max_connections slot).",
            &transport.handshakes,
        ),
        (
            "fusebox_handshakes_refused_total",
            "counter",
            "gRPC connections closed at once because max_handshakes were in their handshake.",
            &transport.handshakes_refused,
        ),
        (
            "fusebox_handshakes_timed_out_total",
            "counter",
            "gRPC connections closed because their handshake took longer than handshake_timeout.",
            &transport.handshakes_timed_out,
        ),
        (
            "fusebox_handshakes_failed_total",
            "counter",
            "gRPC connections closed because their handshake failed (not HTTP/2, or a failed upgrade).",
            &transport.handshakes_failed,
        ),
        (
            "fusebox_http_connections",
            "gauge",
            "Open HTTP connections.",
            &transport.http_connections,
        ),
        (
            "fusebox_http_connections_refused_total",
            "counter",
            "HTTP connections closed at once because max_http_connections were open and none was idle.",
            &transport.http_connections_refused,
        ),
        (
            "fusebox_http_idle_closed_total",
            "counter",
            "Idle keep-alive HTTP connections closed to make room for a new one (max_http_connections).",
            &transport.http_idle_closed,
        ),
        (
            "fusebox_accept_backoffs_total",
            "counter",
            "Times accepting paused because the process was out of file descriptors.",
            &transport.accept_backoffs,
        ),
        (
            "fusebox_calls_in_flight",
            "gauge",
            "gRPC calls in flight.",
            &transport.calls_in_flight,
        ),
        (
            "fusebox_strangers_closed_total",
            "counter",
            "gRPC connections closed because they had shown no credential while new ones needed room ([server] max_strangers, max_strangers_per_peer).",
            &transport.strangers_closed,
        ),
        (
            "fusebox_calls_unauthenticated_total",
            "counter",
            "gRPC calls answered UNAUTHENTICATED on their headers, before their body was read.",
            &transport.calls_unauthenticated,
        ),
        (
            "fusebox_decide_streams",
            "gauge",
            "Decide streams open.",
            &transport.decide_streams,
        ),
        (
            "fusebox_decide_streams_refused_total",
            "counter",
            "Decide streams refused RESOURCE_EXHAUSTED: their connection had 16 open, the server max_decide_streams, or their credential its share.",
            &transport.decide_streams_refused,
        ),
        (
            "fusebox_decide_frames_total",
            "counter",
            "Frames received on Decide streams.",
            &transport.decide_frames,
        ),
        (
            "fusebox_decide_frames_refused_total",
            "counter",
            "Decide frames answered RESOURCE_EXHAUSTED at a stream's limits (1,000 frames per message, 10,000 unanswered).",
            &transport.decide_frames_refused,
        ),
        (
            "fusebox_decide_answers_total",
            "counter",
            "Answers sent on Decide streams.",
            &transport.decide_answers,
        ),
        (
            "fusebox_batch_items_total",
            "counter",
            "Items of AcquireBatch and CompleteBatch calls.",
            &transport.batch_items,
        ),
    ] {
        x.single(name, kind, help, value.load(Ordering::Relaxed));
    }
    x.single(
        "fusebox_strangers",
        "gauge",
        "gRPC connections open that have shown no credential yet (with [auth]; capped by [server] max_strangers).",
        crate::connections::strangers(),
    );
    x.single(
        "fusebox_max_strangers",
        "gauge",
        "Cap on gRPC connections that have shown no credential ([server] max_strangers).",
        limits.max_strangers,
    );
    let unread = crate::outbox::figures();
    x.single(
        "fusebox_unread_bytes",
        "gauge",
        "Bytes of stream answers (Decide, Watch, event streams) made and not yet read by their clients.",
        unread.map_or(0, |u| u.unread()),
    );
    x.single(
        "fusebox_max_unread_bytes",
        "gauge",
        "Cap on unread stream answers, server-wide ([server] max_unread_bytes).",
        limits.max_unread_bytes,
    );
    x.single(
        "fusebox_max_unread_bytes_per_stream",
        "gauge",
        "Cap on one stream's unread answers ([server] max_unread_bytes_per_stream).",
        limits.max_unread_bytes_per_stream,
    );
    x.family(
        "fusebox_streams_stuck_total",
        "counter",
        "Streams ended RESOURCE_EXHAUSTED because their client read nothing for [server] stuck_stream_timeout with answers waiting, by stream.",
    );
    for kind in crate::outbox::Kind::ALL {
        x.sample(
            "fusebox_streams_stuck_total",
            &[("stream", kind.label())],
            unread.map_or(0, |u| u.stuck(kind)),
        );
    }
    x.single(
        "fusebox_max_decide_streams",
        "gauge",
        "Cap on open Decide streams, server-wide ([server] max_decide_streams).",
        limits.max_decide_streams,
    );
    x.single(
        "fusebox_max_handshakes",
        "gauge",
        "Cap on gRPC connections in their handshake ([server] max_handshakes, lowered to fit the open-file limit).",
        caps.max_handshakes,
    );
    x.single(
        "fusebox_max_http_connections",
        "gauge",
        "Cap on open HTTP connections ([server] max_http_connections, lowered to fit the open-file limit).",
        caps.max_http_connections,
    );
    if let Some(tls) = crate::tls::served() {
        let (reloads, reload_failures, handshake_failures) = tls.figures();
        x.single(
            "fusebox_tls_reloads_total",
            "counter",
            "Certificate (or client CA) reloads taken since start.",
            reloads,
        );
        x.single(
            "fusebox_tls_reload_failures_total",
            "counter",
            "Changed certificate files that could not be used (the running certificate stayed).",
            reload_failures,
        );
        x.single(
            "fusebox_tls_handshake_failures_total",
            "counter",
            "TLS handshakes that failed (untrusted or missing client certificates, plain-text clients).",
            handshake_failures,
        );
        if let Some(at) = tls.expires_at() {
            x.single(
                "fusebox_tls_certificate_expiry_seconds",
                "gauge",
                "When the served certificate expires, in seconds since the Unix epoch.",
                at,
            );
        }
    }
    x.single(
        "fusebox_idle_after_seconds",
        "gauge",
        "How long a key at rest stays unused before it is forgotten ([server] idle_after).",
        float(limits.idle_after as f64 / 1000.0),
    );
    x.single(
        "fusebox_rules",
        "gauge",
        "Rules in force, not counting the default.",
        rules.rules.len(),
    );
    x.single(
        "fusebox_shutting_down",
        "gauge",
        "1 once the server began to shut down, else 0.",
        u8::from(core.is_shutting_down()),
    );

    x.family(
        "fusebox_keys_by_phase",
        "gauge",
        &format!("Live keys by breaker phase{whose}."),
    );
    for phase in PHASES {
        x.sample(
            "fusebox_keys_by_phase",
            &[("phase", phase.as_str())],
            totals.by_phase[phase.index()],
        );
    }

    let this_server = if figures.fleet_wide {
        " given by this server"
    } else {
        ""
    };
    x.family(
        "fusebox_decisions_total",
        "counter",
        &format!("Final answers to acquires{this_server}, by decision (a queued request counts once, when answered)."),
    );
    for (name, n) in DECISION_NAMES.iter().zip(totals.decisions) {
        x.sample("fusebox_decisions_total", &[("decision", name)], n);
    }
    x.family(
        "fusebox_denials_total",
        "counter",
        &format!("Blocked and denied acquires{this_server}, by reason."),
    );
    for (reason, n) in Reason::ALL.iter().zip(totals.reasons) {
        x.sample("fusebox_denials_total", &[("reason", reason.as_str())], n);
    }
    x.family(
        "fusebox_cap_refusals_total",
        "counter",
        "Requests refused (RESOURCE_EXHAUSTED) because a [server] cap was reached, by cap.",
    );
    for (cap, n) in CAP_NAMES.iter().zip(totals.cap_refusals) {
        x.sample("fusebox_cap_refusals_total", &[("cap", cap)], n);
    }
    x.sample(
        "fusebox_cap_refusals_total",
        &[("cap", "max_rules")],
        core.rules_refused(),
    );
    share_families(&mut x, node, shown_to);
    x.single(
        "fusebox_transitions_total",
        "counter",
        if figures.fleet_wide {
            "Breaker phase changes of every key, as this server heard them from the store (every server's, and the store's own)."
        } else {
            "Breaker phase changes, of every key."
        },
        totals.transitions,
    );
    x.single(
        "fusebox_config_reloads_total",
        "counter",
        "Config reloads applied (SIGHUP or a changed file).",
        counters.reloads.load(Ordering::Relaxed),
    );
    x.single(
        "fusebox_config_reload_failures_total",
        "counter",
        "Config reloads refused because the file was invalid; the running config stayed.",
        counters.reload_failures.load(Ordering::Relaxed),
    );
    x.single(
        "fusebox_config_last_reload_success",
        "gauge",
        "1 when the last reload attempt succeeded (or none was made), else 0.",
        counters.last_reload_ok.load(Ordering::Relaxed),
    );

    x.single(
        "fusebox_metrics_top_keys",
        "gauge",
        "How many of the busiest keys get per-key series, besides keys named by exact rules.",
        TOP_KEYS,
    );
    x.family(
        "fusebox_key_phase",
        "gauge",
        "1 for the key's breaker phase, 0 for the others.",
    );
    for r in &keys {
        for phase in PHASES {
            x.sample(
                "fusebox_key_phase",
                &[("key", &r.key), ("phase", phase.as_str())],
                u8::from(r.view.phase == phase),
            );
        }
    }
    x.family(
        "fusebox_key_requests_total",
        "counter",
        "Answers to acquires on the key, by decision; restarts when the key is forgotten.",
    );
    for r in &keys {
        let s = &r.view.stats;
        let by_decision = [s.granted, s.probes, s.blocked, s.refused, s.denied];
        for (name, n) in DECISION_NAMES.iter().zip(by_decision) {
            x.sample(
                "fusebox_key_requests_total",
                &[("key", &r.key), ("decision", name)],
                n,
            );
        }
    }
    x.family(
        "fusebox_key_denials_total",
        "counter",
        "Blocked and denied acquires on the key, by reason (reasons seen so far).",
    );
    for r in &keys {
        for reason in Reason::ALL {
            let n = r.view.stats.by_reason[reason as usize];
            if n > 0 {
                x.sample(
                    "fusebox_key_denials_total",
                    &[("key", &r.key), ("reason", reason.as_str())],
                    n,
                );
            }
        }
    }
    x.family(
        "fusebox_key_outcomes_total",
        "counter",
        "Outcomes reported on the key's tickets, and tickets whose lease ended.",
    );
    for r in &keys {
        let s = &r.view.stats;
        let outcomes = [
            ("success", s.successes),
            ("failure", s.failures),
            ("ignored", s.ignored),
            ("stale", s.stale),
            ("expired", s.expired),
        ];
        for (name, n) in outcomes {
            x.sample(
                "fusebox_key_outcomes_total",
                &[("key", &r.key), ("outcome", name)],
                n,
            );
        }
    }
    x.per_key(
        &keys,
        "fusebox_key_consecutive_failures",
        "gauge",
        "Failures in a row.",
        |r| Some(r.view.consecutive_failures.to_string()),
    );
    x.per_key(
        &keys,
        "fusebox_key_failure_ratio",
        "gauge",
        "Share of failures in the sampling window (keys in ratio mode).",
        |r| r.view.failure_ratio.map(float),
    );
    x.per_key(
        &keys,
        "fusebox_key_break_remaining_seconds",
        "gauge",
        "Time left in the break (open keys); 0 once the break is over and the next request probes.",
        |r| {
            r.view
                .open_until
                .map(|until| float(until.saturating_sub(r.now) as f64 / 1000.0))
        },
    );
    x.per_key(
        &keys,
        "fusebox_key_phase_changed_timestamp_seconds",
        "gauge",
        "When the key's phase last changed, in Unix time.",
        |r| {
            let at = core
                .wall_time(r.view.changed_at)
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            Some(float(at.as_millis() as f64 / 1000.0))
        },
    );
    x.per_key(
        &keys,
        "fusebox_key_permit_limit",
        "gauge",
        "The limiter's limit (keys with a limiter).",
        |r| (r.view.limit > 0).then(|| r.view.limit.to_string()),
    );
    x.per_key(
        &keys,
        "fusebox_key_free_permits",
        "gauge",
        "Permits free now (keys with a limiter).",
        |r| (r.view.limit > 0).then(|| r.view.free.to_string()),
    );
    x.per_key(
        &keys,
        "fusebox_key_queued_permits",
        "gauge",
        "Permits asked for by waiters.",
        |r| Some(r.view.queued.to_string()),
    );
    x.per_key(
        &keys,
        "fusebox_key_waiters",
        "gauge",
        "Requests waiting in the key's queue.",
        |r| Some(r.view.waiters.to_string()),
    );
    x.per_key(
        &keys,
        "fusebox_key_live_tickets",
        "gauge",
        "Live tickets of the key.",
        |r| Some(r.view.live_tickets.to_string()),
    );

    x.family(
        "fusebox_other_keys",
        "gauge",
        "Live keys without per-key series (neither named by an exact rule nor among the busiest), by phase.",
    );
    for phase in PHASES {
        x.sample(
            "fusebox_other_keys",
            &[("phase", phase.as_str())],
            other_by_phase[phase.index()],
        );
    }
    x.single(
        "fusebox_other_keys_live_tickets",
        "gauge",
        "Live tickets of the keys without per-key series.",
        other_tickets,
    );
    x.single(
        "fusebox_other_keys_waiters",
        "gauge",
        "Waiters of the keys without per-key series.",
        other_waiters,
    );

    x.single(
        "fusebox_event_streams",
        "gauge",
        "Dashboard event streams (/api/events) open now.",
        http.event_streams,
    );
    x.single(
        "fusebox_event_streams_refused_total",
        "counter",
        "Dashboard event streams refused (503) because the cap was reached.",
        http.event_streams_refused,
    );
    x.single(
        "fusebox_max_event_streams",
        "gauge",
        "Cap on open dashboard event streams.",
        http.max_event_streams,
    );
    // Only embedded: with --store, Redis forgets idle keys itself.
    if let Some((sweep_batches, largest_batch)) = store.sweep_figures() {
        x.single(
            "fusebox_idle_sweep_batches_total",
            "counter",
            "Batches of idle forgetting run (each under one shard lock).",
            sweep_batches,
        );
        x.single(
            "fusebox_idle_sweep_largest_batch",
            "gauge",
            "The most keys one batch of idle forgetting has looked at.",
            largest_batch,
        );
    }
    // Only with a data dir (--data-dir): state kept across restarts.
    if let Some(storage) = store.storage_figures() {
        x.single(
            "fusebox_storage_commits_total",
            "counter",
            "Transactions committed to the data dir (each synced to disk).",
            storage.commits,
        );
        x.single(
            "fusebox_storage_write_failures_total",
            "counter",
            "Writes to the data dir that failed; decisions go on, but unwritten changes are lost at a restart.",
            storage.write_failures,
        );
        x.single(
            "fusebox_storage_keys",
            "gauge",
            "Keys stored in the data dir now (keys not at rest).",
            storage.stored_keys,
        );
        x.single(
            "fusebox_storage_keys_written_total",
            "counter",
            "Keys written to or deleted from the data dir.",
            storage.keys_written,
        );
    }
    // Only with state in Redis (--store).
    if let Some(f) = store.store_figures() {
        let n = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
        x.single(
            "fusebox_store_commands_total",
            "counter",
            "Commands sent to the Redis store.",
            n(&f.commands),
        );
        x.single(
            "fusebox_store_unavailable_total",
            "counter",
            "Store commands that failed because Redis could not be reached, timed out, or was failing over; each call answered UNAVAILABLE.",
            n(&f.unavailable),
        );
        x.single(
            "fusebox_store_moved_total",
            "counter",
            "Store commands that met a hash slot on the move (MOVED, ASK, TRYAGAIN) and still failed after the cluster client followed it.",
            n(&f.moved),
        );
        x.single(
            "fusebox_store_subscriptions_total",
            "counter",
            "Times this server subscribed to the store's answers, events and policy changes (more than 1: the subscription was lost and made again).",
            n(&f.subscriptions),
        );
        x.single(
            "fusebox_store_unconfirmed_actions_total",
            "counter",
            "Operator actions (isolate, close) that no replica confirmed within 1 s (WAIT); they took effect, but a failover right after may lose them.",
            n(&f.unconfirmed),
        );
        x.single(
            "fusebox_store_unconfirmed_probes_total",
            "counter",
            "Probes no replica confirmed in time (WAIT): given back, and the caller told to ask again, so that a failover cannot let a second probe out.",
            n(&f.unconfirmed_probes),
        );
        x.family(
            "fusebox_store_notices_dropped_total",
            "counter",
            "Messages from the store dropped unread: not signed with the fleet's secret (--store-secret-file), or an answer naming another key or ticket than its waiter's. Someone who can reach Redis may be forging them.",
        );
        for (channel, dropped) in crate::engine::redis::NOTICE_CHANNELS
            .iter()
            .zip(&f.notices_dropped)
        {
            x.sample(
                "fusebox_store_notices_dropped_total",
                &[("channel", channel)],
                n(dropped),
            );
        }
        x.single(
            "fusebox_store_policies_unverified_total",
            "counter",
            "Reads of the shared policies (the fusebox:policies key) whose content was not signed with the fleet's secret; the running policies stayed.",
            n(&f.policies_unverified),
        );
    }
    x.single(
        "fusebox_watch_streams",
        "gauge",
        "Admin.Watch streams open now.",
        counters.watch_streams.load(Ordering::Relaxed),
    );
    x.single(
        "fusebox_watch_streams_refused_total",
        "counter",
        "Admin.Watch streams refused (RESOURCE_EXHAUSTED) because the cap was reached.",
        counters.watch_streams_refused.load(Ordering::Relaxed),
    );
    x.single(
        "fusebox_max_watch_streams",
        "gauge",
        "Cap on open Admin.Watch streams ([server] max_watch_streams).",
        limits.max_watch_streams,
    );
    if let Some(bytes) = resident_memory_bytes() {
        x.single(
            "process_resident_memory_bytes",
            "gauge",
            "Resident memory size in bytes.",
            bytes,
        );
    }
    x.out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_escape_backslash_quote_and_newline() {
        assert_eq!(escape_label(r#"a\b"c"#), r#"a\\b\"c"#);
        assert_eq!(escape_label("a\nb"), "a\\nb");
        assert_eq!(escape_help("a\\b\nc \"q\""), "a\\\\b\\nc \"q\"");
    }

    #[test]
    fn floats_use_the_text_format_spelling() {
        assert_eq!(float(0.25), "0.25");
        assert_eq!(float(1.0), "1");
        assert_eq!(float(f64::INFINITY), "+Inf");
        assert_eq!(float(f64::NEG_INFINITY), "-Inf");
        assert_eq!(float(f64::NAN), "NaN");
    }

    #[test]
    fn the_busiest_keys_are_shown_and_the_rest_aggregated() {
        let engine = std::sync::Arc::new(crate::engine::Engine::with_manual_clock(
            crate::engine::Settings::default(),
        ));
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime");
        rt.block_on(async {
            for i in 0..(TOP_KEYS + 5) {
                // Key i gets i + 1 requests: the five quietest are aggregated.
                for _ in 0..=i {
                    engine
                        .acquire(crate::engine::AcquireArgs {
                            key: format!("k/{i:03}"),
                            permits: 1,
                            max_wait: 0,
                            lease: None,
                        })
                        .await
                        .expect("granted");
                }
            }
        });
        let node = Node::of(engine);
        let text = rt.block_on(render(&node, &HttpFigures::default(), &Shown::Every));
        assert!(!text.contains("key=\"k/004\""));
        assert!(text.contains("fusebox_key_live_tickets{key=\"k/005\"} 6\n"));
        assert!(text.contains("fusebox_other_keys{phase=\"CLOSED\"} 5\n"));
        assert!(text.contains("fusebox_other_keys_live_tickets 15\n"));
        assert!(text.contains("fusebox_keys_by_phase{phase=\"CLOSED\"} 105\n"));
    }

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

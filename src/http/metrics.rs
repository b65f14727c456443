//! `/metrics`: the engine in the Prometheus text format (version 0.0.4),
//! written by hand. Every name starts with `fusebox_`.
//!
//! Cardinality stays bounded whatever the number of keys: per-key series
//! (label `key`) exist only for the keys that exact rules name and for the
//! [`TOP_KEYS`] busiest others (by requests answered since the key was
//! made); every other key is counted in the `fusebox_other_keys*`
//! aggregates. A scrape reads one key at a time
//! ([`Engine::visit_keys`]), each under its own lock only for the read.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashSet};
use std::fmt::Write;
use std::sync::atomic::Ordering;

use crate::domain::{Phase, Reason};
use crate::engine::config::Pattern;
use crate::engine::{Engine, KeyReading, DECISION_NAMES};

/// How many of the busiest keys get per-key series, besides the keys named
/// by exact rules.
pub const TOP_KEYS: usize = 100;

/// The content type of the text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

const PHASES: [Phase; 4] = [Phase::Closed, Phase::Open, Phase::HalfOpen, Phase::Isolated];

fn phase_index(phase: Phase) -> usize {
    match phase {
        Phase::Closed => 0,
        Phase::Open => 1,
        Phase::HalfOpen => 2,
        Phase::Isolated => 3,
    }
}

/// Requests answered on a key since it was made: the rank of "busiest".
fn requests(r: &KeyReading) -> u64 {
    let s = &r.view.stats;
    s.granted + s.probes + s.blocked + s.refused + s.denied
}

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

/// What one walk over the keys found.
#[derive(Default)]
struct Survey {
    by_phase: [u64; 4],
    /// Keys with per-key series, by name.
    shown: BTreeMap<String, KeyReading>,
    /// The keys not pinned by an exact rule, ranked for eviction: the top
    /// of the heap is the least busy (ties: the last by name).
    ranked: BinaryHeap<(Reverse<u64>, String)>,
    other_by_phase: [u64; 4],
    other_tickets: u64,
    other_queued: u64,
    other_waiters: u64,
}

impl Survey {
    fn aggregate(&mut self, r: &KeyReading) {
        self.other_by_phase[phase_index(r.view.phase)] += 1;
        self.other_tickets += r.view.live_tickets as u64;
        self.other_queued += r.view.queued;
        self.other_waiters += r.view.waiters as u64;
    }

    fn take(&mut self, r: KeyReading, pinned: &HashSet<String>) {
        self.by_phase[phase_index(r.view.phase)] += 1;
        if pinned.contains(&r.key) {
            self.shown.insert(r.key.clone(), r);
            return;
        }
        self.ranked.push((Reverse(requests(&r)), r.key.clone()));
        self.shown.insert(r.key.clone(), r);
        if self.ranked.len() > TOP_KEYS {
            let (_, quietest) = self.ranked.pop().expect("more than TOP_KEYS");
            if let Some(r) = self.shown.remove(&quietest) {
                self.aggregate(&r);
            }
        }
    }
}

/// The whole exposition of `engine`.
pub fn render(engine: &Engine) -> String {
    let rules = engine.rules();
    let pinned: HashSet<String> = rules
        .rules
        .iter()
        .filter_map(|r| match &r.pattern {
            Pattern::Exact(key) => Some(key.clone()),
            Pattern::Prefix(_) => None,
        })
        .collect();
    let mut survey = Survey::default();
    engine.visit_keys("", |r| survey.take(r, &pinned));
    // Keys named by exact rules are shown even when not live (never used,
    // or forgotten): as a fresh key would read, made by nothing (K2, B6).
    for key in &pinned {
        if !survey.shown.contains_key(key) {
            if let Ok(r) = engine.get(key) {
                survey.shown.insert(key.clone(), r);
            }
        }
    }
    let keys: Vec<KeyReading> = std::mem::take(&mut survey.shown).into_values().collect();

    let mut x = Exposition::default();
    let counts = engine.counts();
    let limits = engine.limits();
    let counters = engine.counters();
    let totals = engine.totals();
    x.single("fusebox_keys", "gauge", "Live keys.", counts.keys);
    x.single("fusebox_tickets", "gauge", "Live tickets.", counts.tickets);
    x.single(
        "fusebox_waiters",
        "gauge",
        "Requests waiting in a queue.",
        counts.waiters,
    );
    x.single(
        "fusebox_keys_forgotten_total",
        "counter",
        "Idle keys at rest forgotten since start (K2).",
        counts.forgotten,
    );
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
        engine.counters().connections.load(Ordering::Relaxed),
    );
    x.single(
        "fusebox_connections_refused_total",
        "counter",
        "gRPC connections closed at once because max_connections was reached.",
        engine
            .counters()
            .connections_refused
            .load(Ordering::Relaxed),
    );
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
        u8::from(engine.is_shutting_down()),
    );

    x.family(
        "fusebox_keys_by_phase",
        "gauge",
        "Live keys by breaker phase.",
    );
    for phase in PHASES {
        x.sample(
            "fusebox_keys_by_phase",
            &[("phase", phase.as_str())],
            survey.by_phase[phase_index(phase)],
        );
    }

    x.family(
        "fusebox_decisions_total",
        "counter",
        "Final answers to acquires, by decision (a queued request counts once, when answered).",
    );
    for (name, n) in DECISION_NAMES.iter().zip(totals.decisions) {
        x.sample("fusebox_decisions_total", &[("decision", name)], n);
    }
    x.family(
        "fusebox_denials_total",
        "counter",
        "Blocked and denied acquires, by reason.",
    );
    for (reason, n) in Reason::ALL.iter().zip(totals.reasons) {
        x.sample("fusebox_denials_total", &[("reason", reason.as_str())], n);
    }
    x.single(
        "fusebox_transitions_total",
        "counter",
        "Breaker phase changes, of every key.",
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
            let at = engine
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
            survey.other_by_phase[phase_index(phase)],
        );
    }
    x.single(
        "fusebox_other_keys_live_tickets",
        "gauge",
        "Live tickets of the keys without per-key series.",
        survey.other_tickets,
    );
    x.single(
        "fusebox_other_keys_queued_permits",
        "gauge",
        "Permits asked for by waiters of the keys without per-key series.",
        survey.other_queued,
    );
    x.single(
        "fusebox_other_keys_waiters",
        "gauge",
        "Waiters of the keys without per-key series.",
        survey.other_waiters,
    );
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
        let engine = Engine::with_manual_clock(crate::engine::Config::default());
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
        let text = render(&engine);
        assert!(!text.contains("key=\"k/004\""));
        assert!(text.contains("fusebox_key_live_tickets{key=\"k/005\"} 6\n"));
        assert!(text.contains("fusebox_other_keys{phase=\"CLOSED\"} 5\n"));
        assert!(text.contains("fusebox_other_keys_live_tickets 15\n"));
        assert!(text.contains("fusebox_keys_by_phase{phase=\"CLOSED\"} 105\n"));
    }
}

//! Every family of `/metrics`, in one table ([`FAMILIES`]): its name, type,
//! help, labels, when it is there, and how its samples are read from a
//! [`Scrape`]. The collector writes the families in this order; the
//! reference (`reference.md`, checked against this table by a test) and
//! the tests read it too.

use std::fmt;

use prometheus_client::encoding::{MetricEncoder, NoLabelSet};

use super::scrape::{Scrape, TOP_KEYS};
use crate::domain::{Phase, Reason};
use crate::engine::shares::{Kind as ShareKind, Share};
use crate::engine::{KeyReading, Store, CAP_NAMES, DECISION_NAMES};

/// A family's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Type {
    /// Only goes up (from the start of the server); named `..._total`.
    Counter,
    /// Goes up and down.
    Gauge,
}

impl Type {
    /// As the text format writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Type::Counter => "counter",
            Type::Gauge => "gauge",
        }
    }
}

/// When a family is in the exposition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum When {
    /// Always.
    Always,
    /// With the state in this process (not `--store`).
    Embedded,
    /// With a data dir (`--data-dir`).
    DataDir,
    /// With the state in Redis (`--store`).
    Store,
    /// With TLS.
    Tls,
    /// With `[telemetry]`.
    Telemetry,
    /// With TLS, once the served certificate's expiry can be read.
    TlsExpiry,
    /// Where the process's memory can be read (Linux).
    Linux,
}

impl When {
    /// In words, for the reference.
    pub fn words(self) -> &'static str {
        match self {
            When::Always => "always",
            When::Embedded => "embedded (not with `--store`)",
            When::DataDir => "with `--data-dir`",
            When::Store => "with `--store`",
            When::Tls => "with TLS",
            When::Telemetry => "with `[telemetry]`",
            When::TlsExpiry => "with TLS",
            When::Linux => "on Linux",
        }
    }
}

/// How a family's samples are read.
type Read = fn(&Scrape, &mut Sink<'_>) -> fmt::Result;

/// One family of `/metrics`.
#[derive(Clone, Copy)]
pub struct Family {
    /// Its name, as exposed (a counter's ends in `_total`).
    pub name: &'static str,
    /// Counter or gauge.
    pub kind: Type,
    /// What it counts (its HELP).
    pub help: &'static str,
    /// Its HELP with `--store`, where the figure means something else
    /// there (the whole store's, or this server's share of it).
    pub store_help: Option<&'static str>,
    /// The labels of its samples.
    pub labels: &'static [&'static str],
    /// When it is in the exposition.
    pub when: When,
    read: Read,
}

impl fmt::Debug for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Family")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .field("labels", &self.labels)
            .field("when", &self.when)
            .finish_non_exhaustive()
    }
}

impl Family {
    /// Its name without the `_total` that the encoder adds to a counter's.
    pub fn base_name(&self) -> &'static str {
        match self.kind {
            Type::Counter => self.name.strip_suffix("_total").unwrap_or(self.name),
            Type::Gauge => self.name,
        }
    }

    /// Writes its samples of `scrape`.
    pub(super) fn read(&self, scrape: &Scrape, sink: &mut Sink<'_>) -> fmt::Result {
        (self.read)(scrape, sink)
    }
}

/// A sample's value.
#[derive(Clone, Copy, Debug)]
pub enum Value {
    /// A whole number.
    Int(u64),
    /// A signed whole number.
    Signed(i64),
    /// A real number (written whole when it is whole).
    Float(f64),
}

macro_rules! value_from {
    ($($t:ty => $v:ident),*) => {$(
        impl From<$t> for Value {
            fn from(v: $t) -> Value {
                Value::$v(v as _)
            }
        }
    )*};
}
value_from!(u64 => Int, u32 => Int, u8 => Int, usize => Int, i64 => Signed, f64 => Float);

/// Where a family's samples go.
pub struct Sink<'a> {
    encoder: MetricEncoder<'a>,
    kind: Type,
}

impl<'a> Sink<'a> {
    /// A sink of a family of `kind` into `encoder`.
    pub(super) fn new(encoder: MetricEncoder<'a>, kind: Type) -> Sink<'a> {
        Sink { encoder, kind }
    }

    /// The family's one sample, without labels.
    pub fn one(&mut self, value: impl Into<Value>) -> fmt::Result {
        write(&mut self.encoder, self.kind, value.into())
    }

    /// A sample with `labels`.
    pub fn put(&mut self, labels: &[(&str, &str)], value: impl Into<Value>) -> fmt::Result {
        let mut encoder = self.encoder.encode_family(&labels)?;
        write(&mut encoder, self.kind, value.into())
    }
}

fn write(encoder: &mut MetricEncoder<'_>, kind: Type, value: Value) -> fmt::Result {
    // A whole float is written as an integer (`90`, not `90.0`), as before.
    let value = match value {
        Value::Float(f) if f.is_finite() && f.fract() == 0.0 && f.abs() < 9.0e15 => {
            Value::Signed(f as i64)
        }
        other => other,
    };
    match (kind, value) {
        (Type::Counter, Value::Int(n)) => encoder.encode_counter::<NoLabelSet, _, u64>(&n, None),
        (Type::Counter, Value::Signed(n)) => {
            encoder.encode_counter::<NoLabelSet, _, u64>(&u64::try_from(n).unwrap_or(0), None)
        }
        (Type::Counter, Value::Float(f)) => encoder.encode_counter::<NoLabelSet, _, u64>(&f, None),
        (Type::Gauge, Value::Int(n)) => encoder.encode_gauge(&n),
        (Type::Gauge, Value::Signed(n)) => encoder.encode_gauge(&n),
        (Type::Gauge, Value::Float(f)) => encoder.encode_gauge(&f),
    }
}

const PHASES: [Phase; 4] = [Phase::Closed, Phase::Open, Phase::HalfOpen, Phase::Isolated];

/// One sample per key shown that `value` has a value for.
fn per_key<V: Into<Value>>(
    s: &Scrape,
    x: &mut Sink<'_>,
    value: impl Fn(&KeyReading) -> Option<V>,
) -> fmt::Result {
    for r in &s.keys {
        if let Some(v) = value(r) {
            x.put(&[("key", &r.key)], v)?;
        }
    }
    Ok(())
}

/// One sample per share shown and kind of limit: `label` names the kind
/// (`kind` without `max_`, `limit` with it).
fn per_share(
    s: &Scrape,
    x: &mut Sink<'_>,
    label: &str,
    value: impl Fn(&Share, u64, ShareKind) -> u64,
) -> fmt::Result {
    for (share, rules_held) in &s.shares {
        for kind in ShareKind::ALL {
            let shown = match label {
                "kind" => kind.field().trim_start_matches("max_"),
                _ => kind.field(),
            };
            x.put(
                &[("credential", share.name()), (label, shown)],
                value(share, *rules_held, kind),
            )?;
        }
    }
    Ok(())
}

/// One sample per share shown: `value` of its credential's part of the
/// unread stream answers.
fn per_unread_part(
    s: &Scrape,
    x: &mut Sink<'_>,
    value: impl Fn(&crate::outbox::Part) -> u64,
) -> fmt::Result {
    for (share, _) in &s.shares {
        let part = s.node.unread().part(Some(share.name()));
        x.put(&[("credential", share.name())], value(&part))?;
    }
    Ok(())
}

/// Seconds of a duration in ms.
fn seconds(ms: u64) -> f64 {
    ms as f64 / 1000.0
}

/// Every family, in the order written.
pub const FAMILIES: &[Family] = &[
    Family {
        name: "fusebox_keys",
        kind: Type::Gauge,
        help: "Live keys.",
        store_help: Some("Live keys (the whole store's, every server alike)."),
        labels: &[],
        when: When::Always,
        read: |s, x| x.one(s.figures.totals.keys),
    },
    Family {
        name: "fusebox_tickets",
        kind: Type::Gauge,
        help: "Live tickets.",
        store_help: Some("Live tickets (the whole store's, every server alike)."),
        labels: &[],
        when: When::Always,
        read: |s, x| x.one(s.figures.totals.tickets),
    },
    Family {
        name: "fusebox_waiters",
        kind: Type::Gauge,
        help: "Requests waiting in a queue.",
        store_help: Some("Requests waiting in a queue (the whole store's, every server alike)."),
        labels: &[],
        when: When::Always,
        read: |s, x| x.one(s.figures.totals.waiters),
    },
    Family {
        name: "fusebox_keys_forgotten_total",
        kind: Type::Counter,
        help: "Idle keys at rest forgotten since start (K2).",
        store_help: None,
        labels: &[],
        when: When::Embedded,
        read: |s, x| x.one(s.figures.forgotten.unwrap_or(0)),
    },
    Family {
        name: "fusebox_keys_evicted_total",
        kind: Type::Counter,
        help: "Keys at rest that the rate-limit service made, forgotten before their idle time, the longest idle first, to make room for a charge's new key at the key cap or a credential's key share (RL19; also counted in fusebox_keys_forgotten_total).",
        store_help: None,
        labels: &[],
        when: When::Embedded,
        read: |s, x| x.one(s.node.store().keys_evicted().unwrap_or(0)),
    },
    Family {
        name: "fusebox_max_keys",
        kind: Type::Gauge,
        help: "Cap on live keys ([server] max_keys).",
        store_help: None,
        labels: &[],
        when: When::Always,
        read: |s, x| x.one(s.node.limits().max_keys),
    },
    Family {
        name: "fusebox_max_tickets",
        kind: Type::Gauge,
        help: "Cap on live tickets ([server] max_tickets).",
        store_help: None,
        labels: &[],
        when: When::Always,
        read: |s, x| x.one(s.node.limits().max_tickets),
    },
    Family {
        name: "fusebox_max_waiters",
        kind: Type::Gauge,
        help: "Cap on waiting requests ([server] max_waiters).",
        store_help: None,
        labels: &[],
        when: When::Always,
        read: |s, x| x.one(s.node.limits().max_waiters),
    },
    Family {
        name: "fusebox_max_connections",
        kind: Type::Gauge,
        help: "Cap on open gRPC connections ([server] max_connections).",
        store_help: None,
        labels: &[],
        when: When::Always,
        read: |s, x| x.one(s.node.limits().max_connections),
    },
    Family {
        name: "fusebox_connections",
        kind: Type::Gauge,
        help: "Open gRPC connections.",
        store_help: None,
        labels: &[],
        when: When::Always,
        read: |s, x| x.one(load(&s.node.ports().figures().connections)),
    },
    Family {
        name: "fusebox_connections_refused_total",
        kind: Type::Counter,
        help: "gRPC connections closed at once because max_connections was reached.",
        store_help: None,
        labels: &[],
        when: When::Always,
        read: |s, x| x.one(load(&s.node.ports().figures().connections_refused)),
    },
    Family {
        name: "fusebox_handshakes",
        kind: Type::Gauge,
        help: "gRPC connections still in their handshake (they hold no max_connections slot).",
        store_help: None,
        labels: &[],
        when: When::Always,
        read: |s, x| x.one(load(&s.node.ports().figures().handshakes)),
    },
    Family {
        name: "fusebox_handshakes_refused_total",
        kind: Type::Counter,
        help: "gRPC connections closed at once because max_handshakes were in their handshake.",
        store_help: None,
        labels: &[],
        when: When::Always,
        read: |s, x| x.one(load(&s.node.ports().figures().handshakes_refused)),
    },
    Family {
        name: "fusebox_handshakes_timed_out_total",
        kind: Type::Counter,
        help: "gRPC connections closed because their handshake took longer than handshake_timeout.",
        store_help: None,
        labels: &[],
        when: When::Always,
        read: |s, x| x.one(load(&s.node.ports().figures().handshakes_timed_out)),
    },
    Family {
        name: "fusebox_handshakes_failed_total",
        kind: Type::Counter,
        help: "gRPC connections closed because their handshake failed (not HTTP/2, or a failed upgrade).",
        store_help: None,
        labels: &[],
        when: When::Always,
        read: |s, x| x.one(load(&s.node.ports().figures().handshakes_failed)),
    },
    Family {
        name: "fusebox_http_connections",
        kind: Type::Gauge,
        help: "Open HTTP connections.",
        store_help: None,
        labels: &[],
        when: When::Always,
        read: |s, x| x.one(s.http.connections),
    },
    Family {
        name: "fusebox_http_connections_refused_total",
        kind: Type::Counter,
        help: "HTTP connections closed at once because max_http_connections were open and none was idle.",
        store_help: None,
        labels: &[],
        when: When::Always,
        read: |s, x| x.one(s.http.connections_refused),
    },
    Family {
        name: "fusebox_http_idle_closed_total",
        kind: Type::Counter,
        help: "Idle keep-alive HTTP connections closed to make room for a new one (max_http_connections).",
        store_help: None,
        labels: &[],
        when: When::Always,
        read: |s, x| x.one(s.http.idle_closed),
    },
    Family {
        name: "fusebox_http_write_timed_out_total",
        kind: Type::Counter,
        help: "HTTP connections closed because their peer read nothing of an answer for http_write_timeout.",
        store_help: None,
        labels: &[],
        when: When::Always,
        read: |s, x| x.one(s.http.write_timed_out),
    },
    Family {
        name: "fusebox_accept_backoffs_total",
        kind: Type::Counter,
        help: "Times accepting paused because the process was out of file descriptors.",
        store_help: None,
        labels: &[],
        when: When::Always,
        read: |s, x| x.one(load(&s.node.ports().figures().accept_backoffs)),
    },
    Family {
        name: "fusebox_calls_in_flight",
        kind: Type::Gauge,
        help: "gRPC calls in flight.",
        store_help: None,
        labels: &[],
        when: When::Always,
        read: |s, x| x.one(load(&s.node.counters().calls_in_flight)),
    },
    Family {
        name: "fusebox_strangers_closed_total",
        kind: Type::Counter,
        help: "gRPC connections closed because they had shown no credential while new ones needed room ([server] max_strangers, max_strangers_per_peer).",
        store_help: None,
        labels: &[],
        when: When::Always,
        read: |s, x| x.one(load(&s.node.ports().figures().strangers_closed)),
    },
    Family {
        name: "fusebox_calls_unauthenticated_total",
        kind: Type::Counter,
        help: "gRPC calls answered UNAUTHENTICATED on their headers, before their body was read.",
        store_help: None,
        labels: &[],
        when: When::Always,
        read: |s, x| x.one(load(&s.node.counters().calls_unauthenticated)),
    },
    Family {
        name: "fusebox_decide_streams",
        kind: Type::Gauge,
        help: "Decide streams open.",
        store_help: None,
        labels: &[],
        when: When::Always,
        read: |s, x| x.one(load(&s.node.counters().decide_streams)),
    },
    Family {
        name: "fusebox_decide_streams_refused_total",
        kind: Type::Counter,
        help: "Decide streams refused RESOURCE_EXHAUSTED: their connection had 16 open, the server max_decide_streams, or their credential its share.",
        store_help: None,
        labels: &[],
        when: When::Always,
        read: |s, x| x.one(load(&s.node.counters().decide_streams_refused)),
    },
    Family {
        name: "fusebox_decide_frames_total",
        kind: Type::Counter,
        help: "Frames received on Decide streams.",
        store_help: None,
        labels: &[],
        when: When::Always,
        read: |s, x| x.one(load(&s.node.counters().decide_frames)),
    },
    Family {
        name: "fusebox_decide_frames_refused_total",
        kind: Type::Counter,
        help: "Decide frames answered RESOURCE_EXHAUSTED at a stream's limits (1,000 frames per message, 10,000 unanswered).",
        store_help: None,
        labels: &[],
        when: When::Always,
        read: |s, x| x.one(load(&s.node.counters().decide_frames_refused)),
    },
    Family {
        name: "fusebox_decide_answers_total",
        kind: Type::Counter,
        help: "Answers sent on Decide streams.",
        store_help: None,
        labels: &[],
        when: When::Always,
        read: |s, x| x.one(load(&s.node.counters().decide_answers)),
    },
    Family {
        name: "fusebox_batch_items_total",
        kind: Type::Counter,
        help: "Items of AcquireBatch and CompleteBatch calls.",
        store_help: None,
        labels: &[],
        when: When::Always,
        read: |s, x| x.one(load(&s.node.counters().batch_items)),
    },
    Family {
        name: "fusebox_rls_requests_total",
        kind: Type::Counter,
        help: "ShouldRateLimit calls (Envoy's rate-limit service) answered.",
        store_help: None,
        labels: &[],
        when: When::Always,
        read: |s, x| x.one(load(&s.node.counters().rls_requests)),
    },
    Family {
        name: "fusebox_rls_over_limit_total",
        kind: Type::Counter,
        help: "ShouldRateLimit calls answered OVER_LIMIT (nothing was charged).",
        store_help: None,
        labels: &[],
        when: When::Always,
        read: |s, x| x.one(load(&s.node.counters().rls_over_limit)),
    },
    Family {
        name: "fusebox_rls_shadow_over_limit_total",
        kind: Type::Counter,
        help: "Descriptors in shadow_mode that were over their limit and answered OK.",
        store_help: None,
        labels: &[],
        when: When::Always,
        read: |s, x| x.one(load(&s.node.counters().rls_shadow_over_limit)),
    },
    Family {
        name: "fusebox_rls_unmatched_total",
        kind: Type::Counter,
        help: "Descriptors that matched no configured limit (answered OK, nothing charged).",
        store_help: None,
        labels: &[],
        when: When::Always,
        read: |s, x| x.one(load(&s.node.counters().rls_unmatched)),
    },
    Family {
        name: "fusebox_rls_trouble_total",
        kind: Type::Counter,
        help: "ShouldRateLimit checks refused whole (invalid_argument, unauthenticated, permission_denied, unavailable) and descriptors answered as [rls] no_room says (no_room) or keyed by a digest of their values (digested), by reason.",
        store_help: None,
        labels: &["reason"],
        when: When::Always,
        read: |s, x| {
            let counters = s.node.counters();
            for trouble in crate::node::RlsTrouble::ALL {
                x.put(
                    &[("reason", trouble.as_str())],
                    load(&counters.rls_trouble[trouble as usize]),
                )?;
            }
            Ok(())
        },
    },
    Family {
        name: "fusebox_strangers",
        kind: Type::Gauge,
        help: "gRPC connections open that have shown no credential yet (with [auth]; capped by [server] max_strangers).",
        store_help: None,
        labels: &[],
        when: When::Always,
        read: |s, x| x.one(s.node.ports().strangers()),
    },
    Family {
        name: "fusebox_max_strangers",
        kind: Type::Gauge,
        help: "Cap on gRPC connections that have shown no credential ([server] max_strangers).",
        store_help: None,
        labels: &[],
        when: When::Always,
        read: |s, x| x.one(s.node.limits().max_strangers),
    },
    Family {
        name: "fusebox_unread_bytes",
        kind: Type::Gauge,
        help: "Bytes of stream answers (Decide, Watch, event streams) made and not yet read by their clients.",
        store_help: None,
        labels: &[],
        when: When::Always,
        read: |s, x| x.one(s.node.unread().unread()),
    },
    Family {
        name: "fusebox_max_unread_bytes",
        kind: Type::Gauge,
        help: "Cap on unread stream answers, server-wide ([server] max_unread_bytes).",
        store_help: None,
        labels: &[],
        when: When::Always,
        read: |s, x| x.one(s.node.limits().max_unread_bytes),
    },
    Family {
        name: "fusebox_max_unread_bytes_per_stream",
        kind: Type::Gauge,
        help: "Cap on one stream's unread answers ([server] max_unread_bytes_per_stream).",
        store_help: None,
        labels: &[],
        when: When::Always,
        read: |s, x| x.one(s.node.limits().max_unread_bytes_per_stream),
    },
    Family {
        name: "fusebox_streams_stuck_total",
        kind: Type::Counter,
        help: "Streams ended RESOURCE_EXHAUSTED because their client read nothing for [server] stuck_stream_timeout with answers waiting, by stream.",
        store_help: None,
        labels: &["stream"],
        when: When::Always,
        read: |s, x| {
            for kind in crate::outbox::Kind::ALL {
                x.put(&[("stream", kind.label())], s.node.unread().stuck(kind))?;
            }
            Ok(())
        },
    },
    Family {
        name: "fusebox_share_unread_bytes",
        kind: Type::Gauge,
        help: "Bytes of each credential's stream answers made and not yet read by its clients (its part: fusebox_share_max_unread_bytes).",
        store_help: None,
        labels: &["credential"],
        when: When::Always,
        read: |s, x| per_unread_part(s, x, |part| part.held()),
    },
    Family {
        name: "fusebox_share_max_unread_bytes",
        kind: Type::Gauge,
        help: "The most bytes of each credential's stream answers its clients may leave unread (its entry's limits.max_unread_bytes, else [auth] share of [server] max_unread_bytes).",
        store_help: None,
        labels: &["credential"],
        when: When::Always,
        read: |s, x| per_unread_part(s, x, |part| part.limit()),
    },
    Family {
        name: "fusebox_share_unread_waits_total",
        kind: Type::Counter,
        help: "Stream answers that waited before they were made because their credential's clients left all its part of the unread bytes unread, by credential.",
        store_help: None,
        labels: &["credential"],
        when: When::Always,
        read: |s, x| per_unread_part(s, x, |part| part.waits()),
    },
    Family {
        name: "fusebox_max_decide_streams",
        kind: Type::Gauge,
        help: "Cap on open Decide streams, server-wide ([server] max_decide_streams).",
        store_help: None,
        labels: &[],
        when: When::Always,
        read: |s, x| x.one(s.node.limits().max_decide_streams),
    },
    Family {
        name: "fusebox_max_handshakes",
        kind: Type::Gauge,
        help: "Cap on gRPC connections in their handshake ([server] max_handshakes, lowered to fit the open-file limit).",
        store_help: None,
        labels: &[],
        when: When::Always,
        read: |s, x| x.one(s.node.ports().caps().max_handshakes),
    },
    Family {
        name: "fusebox_max_http_connections",
        kind: Type::Gauge,
        help: "Cap on open HTTP connections ([server] max_http_connections, lowered to fit the open-file limit).",
        store_help: None,
        labels: &[],
        when: When::Always,
        read: |s, x| x.one(s.node.ports().caps().max_http_connections),
    },
    Family {
        name: "fusebox_trace_spans_exported_total",
        kind: Type::Counter,
        help: "Spans the trace receiver ([telemetry] otlp_endpoint) took.",
        store_help: None,
        labels: &[],
        when: When::Telemetry,
        read: |s, x| x.one(s.node.telemetry().map_or(0, |t| load(&t.figures().exported))),
    },
    Family {
        name: "fusebox_trace_spans_failed_total",
        kind: Type::Counter,
        help: "Spans dropped because the trace receiver did not take them (calls are served as before).",
        store_help: None,
        labels: &[],
        when: When::Telemetry,
        read: |s, x| x.one(s.node.telemetry().map_or(0, |t| load(&t.figures().failed))),
    },
    Family {
        name: "fusebox_trace_spans_dropped_total",
        kind: Type::Counter,
        help: "Spans dropped because [telemetry] max_queued_spans were waiting for export (the receiver slow or down).",
        store_help: None,
        labels: &[],
        when: When::Telemetry,
        read: |s, x| x.one(s.node.telemetry().map_or(0, |t| load(&t.figures().dropped))),
    },
    Family {
        name: "fusebox_tls_reloads_total",
        kind: Type::Counter,
        help: "Certificate (or client CA) reloads taken since start.",
        store_help: None,
        labels: &[],
        when: When::Tls,
        read: |s, x| x.one(s.node.tls().map_or(0, |t| t.figures().0)),
    },
    Family {
        name: "fusebox_tls_reload_failures_total",
        kind: Type::Counter,
        help: "Changed certificate files that could not be used (the running certificate stayed).",
        store_help: None,
        labels: &[],
        when: When::Tls,
        read: |s, x| x.one(s.node.tls().map_or(0, |t| t.figures().1)),
    },
    Family {
        name: "fusebox_tls_handshake_failures_total",
        kind: Type::Counter,
        help: "TLS handshakes that failed (untrusted or missing client certificates, plain-text clients).",
        store_help: None,
        labels: &[],
        when: When::Tls,
        read: |s, x| x.one(s.node.tls().map_or(0, |t| t.figures().2)),
    },
    Family {
        name: "fusebox_tls_certificate_expiry_seconds",
        kind: Type::Gauge,
        help: "When the served certificate expires, in seconds since the Unix epoch.",
        store_help: None,
        labels: &[],
        when: When::TlsExpiry,
        read: |s, x| x.one(s.node.tls().and_then(|t| t.expires_at()).unwrap_or(0)),
    },
    Family {
        name: "fusebox_idle_after_seconds",
        kind: Type::Gauge,
        help: "How long a key at rest stays unused before it is forgotten ([server] idle_after).",
        store_help: None,
        labels: &[],
        when: When::Always,
        read: |s, x| x.one(seconds(s.node.limits().idle_after)),
    },
    Family {
        name: "fusebox_rules",
        kind: Type::Gauge,
        help: "Rules in force, not counting the default.",
        store_help: None,
        labels: &[],
        when: When::Always,
        read: |s, x| x.one(s.rules.rules.len()),
    },
    Family {
        name: "fusebox_shutting_down",
        kind: Type::Gauge,
        help: "1 once the server began to shut down, else 0.",
        store_help: None,
        labels: &[],
        when: When::Always,
        read: |s, x| x.one(u8::from(s.node.store().core().is_shutting_down())),
    },
    Family {
        name: "fusebox_keys_by_phase",
        kind: Type::Gauge,
        help: "Live keys by breaker phase.",
        store_help: Some("Live keys by breaker phase (the whole store's, every server alike)."),
        labels: &["phase"],
        when: When::Always,
        read: |s, x| {
            for phase in PHASES {
                x.put(
                    &[("phase", phase.as_str())],
                    s.figures.totals.by_phase[phase.index()],
                )?;
            }
            Ok(())
        },
    },
    Family {
        name: "fusebox_decisions_total",
        kind: Type::Counter,
        help: "Final answers to acquires, by decision (a queued request counts once, when answered; shadow: granted by a shadow policy that would have blocked or denied).",
        store_help: Some("Final answers to acquires given by this server, by decision (a queued request counts once, when answered; shadow: granted by a shadow policy that would have blocked or denied)."),
        labels: &["decision"],
        when: When::Always,
        read: |s, x| {
            for (name, n) in DECISION_NAMES.iter().zip(s.figures.totals.decisions) {
                x.put(&[("decision", name)], n)?;
            }
            Ok(())
        },
    },
    Family {
        name: "fusebox_denials_total",
        kind: Type::Counter,
        help: "Blocked and denied acquires, by reason.",
        store_help: Some("Blocked and denied acquires given by this server, by reason."),
        labels: &["reason"],
        when: When::Always,
        read: |s, x| {
            for (reason, n) in Reason::ALL.iter().zip(s.figures.totals.reasons) {
                x.put(&[("reason", reason.as_str())], n)?;
            }
            Ok(())
        },
    },
    Family {
        name: "fusebox_cap_refusals_total",
        kind: Type::Counter,
        help: "Requests refused (RESOURCE_EXHAUSTED) because a [server] cap was reached, by cap.",
        store_help: None,
        labels: &["cap"],
        when: When::Always,
        read: |s, x| {
            for (cap, n) in CAP_NAMES.iter().zip(s.figures.totals.cap_refusals) {
                x.put(&[("cap", cap)], n)?;
            }
            x.put(
                &[("cap", "max_rules")],
                s.node.store().core().rules_refused(),
            )
        },
    },
    Family {
        name: "fusebox_share_held",
        kind: Type::Gauge,
        help: "What each credential holds now, by kind (its share: fusebox_share_limit).",
        store_help: None,
        labels: &["credential", "kind"],
        when: When::Always,
        read: |s, x| {
            per_share(s, x, "kind", |share, rules_held, kind| match kind {
                ShareKind::Rules => rules_held,
                _ => share.held(kind),
            })
        },
    },
    Family {
        name: "fusebox_share_held_elsewhere",
        kind: Type::Gauge,
        help: "What each credential holds through the fleet's other servers on the store, by kind, as last read from Redis (keys: the distinct keys it asked for fleet-wide less this server's); counted in its share. 0 without a store.",
        store_help: None,
        labels: &["credential", "kind"],
        when: When::Always,
        read: |s, x| per_share(s, x, "kind", |share, _, kind| share.elsewhere(kind)),
    },
    Family {
        name: "fusebox_share_limit",
        kind: Type::Gauge,
        help: "What each credential may hold at once, by kind (its entry's limits, else [auth] share of the [server] cap).",
        store_help: None,
        labels: &["credential", "kind"],
        when: When::Always,
        read: |s, x| per_share(s, x, "kind", |share, _, kind| share.limit(kind)),
    },
    Family {
        name: "fusebox_share_refusals_total",
        kind: Type::Counter,
        help: "Requests refused (RESOURCE_EXHAUSTED) because a credential held all its share, by credential and limit.",
        store_help: None,
        labels: &["credential", "limit"],
        when: When::Always,
        read: |s, x| per_share(s, x, "limit", |share, _, kind| share.refused(kind)),
    },
    Family {
        name: "fusebox_transitions_total",
        kind: Type::Counter,
        help: "Breaker phase changes, of every key.",
        store_help: Some("Breaker phase changes of every key, as this server heard them from the store (every server's, and the store's own)."),
        labels: &[],
        when: When::Always,
        read: |s, x| x.one(s.figures.totals.transitions),
    },
    Family {
        name: "fusebox_config_reloads_total",
        kind: Type::Counter,
        help: "Config reloads applied (SIGHUP or a changed file).",
        store_help: None,
        labels: &[],
        when: When::Always,
        read: |s, x| x.one(load(&s.node.counters().reloads)),
    },
    Family {
        name: "fusebox_config_reload_failures_total",
        kind: Type::Counter,
        help: "Config reloads refused because the file was invalid; the running config stayed.",
        store_help: None,
        labels: &[],
        when: When::Always,
        read: |s, x| x.one(load(&s.node.counters().reload_failures)),
    },
    Family {
        name: "fusebox_config_last_reload_success",
        kind: Type::Gauge,
        help: "1 when the last reload attempt succeeded (or none was made), else 0.",
        store_help: None,
        labels: &[],
        when: When::Always,
        read: |s, x| x.one(load(&s.node.counters().last_reload_ok)),
    },
    Family {
        name: "fusebox_metrics_top_keys",
        kind: Type::Gauge,
        help: "How many of the busiest keys get per-key series, besides keys named by exact rules.",
        store_help: None,
        labels: &[],
        when: When::Always,
        read: |_, x| x.one(TOP_KEYS),
    },
    Family {
        name: "fusebox_key_phase",
        kind: Type::Gauge,
        help: "1 for the key's breaker phase, 0 for the others.",
        store_help: None,
        labels: &["key", "phase"],
        when: When::Always,
        read: |s, x| {
            for r in &s.keys {
                for phase in PHASES {
                    x.put(
                        &[("key", &r.key), ("phase", phase.as_str())],
                        u8::from(r.view.phase == phase),
                    )?;
                }
            }
            Ok(())
        },
    },
    Family {
        name: "fusebox_key_requests_total",
        kind: Type::Counter,
        help: "Answers to acquires on the key, by decision (denied includes the retry budget's denials; on a shadow policy blocked and denied count what would have been, and shadow those granted instead); restarts when the key is forgotten.",
        store_help: None,
        labels: &["key", "decision"],
        when: When::Always,
        read: |s, x| {
            for r in &s.keys {
                let st = &r.view.stats;
                let denied = st.denied + st.retry_denied;
                let by_decision = [
                    st.granted,
                    st.probes,
                    st.blocked,
                    st.refused,
                    denied,
                    st.shadow,
                ];
                for (name, n) in DECISION_NAMES.iter().zip(by_decision) {
                    x.put(&[("key", &r.key), ("decision", name)], n)?;
                }
            }
            Ok(())
        },
    },
    Family {
        name: "fusebox_key_denials_total",
        kind: Type::Counter,
        help: "Blocked and denied acquires on the key, by reason (reasons seen so far).",
        store_help: None,
        labels: &["key", "reason"],
        when: When::Always,
        read: |s, x| {
            for r in &s.keys {
                for reason in Reason::ALL {
                    let n = r.view.stats.by_reason[reason as usize];
                    if n > 0 {
                        x.put(&[("key", &r.key), ("reason", reason.as_str())], n)?;
                    }
                }
            }
            Ok(())
        },
    },
    Family {
        name: "fusebox_key_outcomes_total",
        kind: Type::Counter,
        help: "Outcomes reported on the key's tickets, and tickets whose lease ended.",
        store_help: None,
        labels: &["key", "outcome"],
        when: When::Always,
        read: |s, x| {
            for r in &s.keys {
                let st = &r.view.stats;
                let outcomes = [
                    ("success", st.successes),
                    ("failure", st.failures),
                    ("ignored", st.ignored),
                    ("stale", st.stale),
                    ("expired", st.expired),
                ];
                for (name, n) in outcomes {
                    x.put(&[("key", &r.key), ("outcome", name)], n)?;
                }
            }
            Ok(())
        },
    },
    Family {
        name: "fusebox_key_consecutive_failures",
        kind: Type::Gauge,
        help: "Failures in a row.",
        store_help: None,
        labels: &["key"],
        when: When::Always,
        read: |s, x| per_key(s, x, |r| Some(r.view.consecutive_failures)),
    },
    Family {
        name: "fusebox_key_failure_ratio",
        kind: Type::Gauge,
        help: "Share of failures in the sampling window (keys in ratio mode).",
        store_help: None,
        labels: &["key"],
        when: When::Always,
        read: |s, x| per_key(s, x, |r| r.view.failure_ratio),
    },
    Family {
        name: "fusebox_key_break_remaining_seconds",
        kind: Type::Gauge,
        help: "Time left in the break (open keys); 0 once the break is over and the next request probes.",
        store_help: None,
        labels: &["key"],
        when: When::Always,
        read: |s, x| {
            per_key(s, x, |r| {
                r.view
                    .open_until
                    .map(|until| seconds(until.saturating_sub(r.now)))
            })
        },
    },
    Family {
        name: "fusebox_key_phase_changed_timestamp_seconds",
        kind: Type::Gauge,
        help: "When the key's phase last changed, in Unix time.",
        store_help: None,
        labels: &["key"],
        when: When::Always,
        read: |s, x| {
            let core = s.node.store().core();
            per_key(s, x, |r| {
                let at = core
                    .wall_time(r.view.changed_at)
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default();
                Some(at.as_millis() as f64 / 1000.0)
            })
        },
    },
    Family {
        name: "fusebox_key_probes_held",
        kind: Type::Gauge,
        help: "Probe slots held now (half-open keys; at most fusebox_key_probe_slots), else 0.",
        store_help: None,
        labels: &["key"],
        when: When::Always,
        read: |s, x| per_key(s, x, |r| Some(r.view.probes_held)),
    },
    Family {
        name: "fusebox_key_live_slow",
        kind: Type::Gauge,
        help: "Live slow calls: the key's current closed-period tickets older than its breaker.slow.duration (S2), else 0.",
        store_help: None,
        labels: &["key"],
        when: When::Always,
        read: |s, x| per_key(s, x, |r| Some(r.view.live_slow)),
    },
    Family {
        name: "fusebox_key_slow_calls_total",
        kind: Type::Counter,
        help: "Tickets of the key that became slow (breaker.slow.duration old), live or at completion, each once.",
        store_help: None,
        labels: &["key"],
        when: When::Always,
        read: |s, x| per_key(s, x, |r| Some(r.view.stats.slow)),
    },
    Family {
        name: "fusebox_key_adaptive_limit",
        kind: Type::Gauge,
        help: "The adaptive limiter's limit in force now, between the policy's limiter.min and limiter.max (keys with an adaptive limiter).",
        store_help: None,
        labels: &["key"],
        when: When::Always,
        read: |s, x| {
            per_key(s, x, |r| {
                (r.view.adaptive_limit > 0).then_some(r.view.adaptive_limit)
            })
        },
    },
    Family {
        name: "fusebox_key_probe_slots",
        kind: Type::Gauge,
        help: "Probe slots a half-open period may hold at once: the policy's breaker.half_open.probes (keys with a breaker).",
        store_help: None,
        labels: &["key"],
        when: When::Always,
        read: |s, x| {
            per_key(s, x, |r| {
                let breaker = s.rules.policy_for(&r.key).breaker?;
                Some(breaker.half_open.probes.get())
            })
        },
    },
    Family {
        name: "fusebox_key_half_open_successes",
        kind: Type::Gauge,
        help: "Probe successes counted in the current half-open period (the policy's breaker.half_open.successes of them close the breaker), else 0.",
        store_help: None,
        labels: &["key"],
        when: When::Always,
        read: |s, x| per_key(s, x, |r| Some(r.view.half_open_successes)),
    },
    Family {
        name: "fusebox_key_permit_limit",
        kind: Type::Gauge,
        help: "The limiter's limit (keys with a limiter).",
        store_help: None,
        labels: &["key"],
        when: When::Always,
        read: |s, x| per_key(s, x, |r| (r.view.limit > 0).then_some(r.view.limit)),
    },
    Family {
        name: "fusebox_key_free_permits",
        kind: Type::Gauge,
        help: "Permits free now (keys with a limiter).",
        store_help: None,
        labels: &["key"],
        when: When::Always,
        read: |s, x| per_key(s, x, |r| (r.view.limit > 0).then_some(r.view.free)),
    },
    Family {
        name: "fusebox_key_queued_permits",
        kind: Type::Gauge,
        help: "Permits asked for by waiters.",
        store_help: None,
        labels: &["key"],
        when: When::Always,
        read: |s, x| per_key(s, x, |r| Some(r.view.queued)),
    },
    Family {
        name: "fusebox_key_waiters",
        kind: Type::Gauge,
        help: "Requests waiting in the key's queue.",
        store_help: None,
        labels: &["key"],
        when: When::Always,
        read: |s, x| per_key(s, x, |r| Some(r.view.waiters)),
    },
    Family {
        name: "fusebox_key_live_tickets",
        kind: Type::Gauge,
        help: "Live tickets of the key.",
        store_help: None,
        labels: &["key"],
        when: When::Always,
        read: |s, x| per_key(s, x, |r| Some(r.view.live_tickets)),
    },
    Family {
        name: "fusebox_other_keys",
        kind: Type::Gauge,
        help: "Live keys without per-key series (neither named by an exact rule nor among the busiest), by phase.",
        store_help: None,
        labels: &["phase"],
        when: When::Always,
        read: |s, x| {
            for phase in PHASES {
                x.put(&[("phase", phase.as_str())], s.other_by_phase[phase.index()])?;
            }
            Ok(())
        },
    },
    Family {
        name: "fusebox_other_keys_live_tickets",
        kind: Type::Gauge,
        help: "Live tickets of the keys without per-key series.",
        store_help: None,
        labels: &[],
        when: When::Always,
        read: |s, x| x.one(s.other_tickets),
    },
    Family {
        name: "fusebox_other_keys_waiters",
        kind: Type::Gauge,
        help: "Waiters of the keys without per-key series.",
        store_help: None,
        labels: &[],
        when: When::Always,
        read: |s, x| x.one(s.other_waiters),
    },
    Family {
        name: "fusebox_event_streams",
        kind: Type::Gauge,
        help: "Dashboard event streams (/api/events) open now.",
        store_help: None,
        labels: &[],
        when: When::Always,
        read: |s, x| x.one(s.http.event_streams),
    },
    Family {
        name: "fusebox_event_streams_refused_total",
        kind: Type::Counter,
        help: "Dashboard event streams refused (503) because the cap was reached.",
        store_help: None,
        labels: &[],
        when: When::Always,
        read: |s, x| x.one(s.http.event_streams_refused),
    },
    Family {
        name: "fusebox_max_event_streams",
        kind: Type::Gauge,
        help: "Cap on open dashboard event streams.",
        store_help: None,
        labels: &[],
        when: When::Always,
        read: |s, x| x.one(s.http.max_event_streams),
    },
    Family {
        name: "fusebox_idle_sweep_batches_total",
        kind: Type::Counter,
        help: "Batches of idle forgetting run (each under one shard lock).",
        store_help: None,
        labels: &[],
        when: When::Embedded,
        read: |s, x| x.one(s.node.store().sweep_figures().map_or(0, |f| f.0)),
    },
    Family {
        name: "fusebox_idle_sweep_largest_batch",
        kind: Type::Gauge,
        help: "The most keys one batch of idle forgetting has looked at.",
        store_help: None,
        labels: &[],
        when: When::Embedded,
        read: |s, x| x.one(s.node.store().sweep_figures().map_or(0, |f| f.1)),
    },
    Family {
        name: "fusebox_storage_commits_total",
        kind: Type::Counter,
        help: "Transactions committed to the data dir (each synced to disk).",
        store_help: None,
        labels: &[],
        when: When::DataDir,
        read: |s, x| x.one(s.node.store().storage_figures().map_or(0, |f| f.commits)),
    },
    Family {
        name: "fusebox_storage_write_failures_total",
        kind: Type::Counter,
        help: "Writes to the data dir that failed; decisions go on, but unwritten changes are lost at a restart.",
        store_help: None,
        labels: &[],
        when: When::DataDir,
        read: |s, x| x.one(s.node.store().storage_figures().map_or(0, |f| f.write_failures)),
    },
    Family {
        name: "fusebox_storage_keys",
        kind: Type::Gauge,
        help: "Keys stored in the data dir now (keys not at rest).",
        store_help: None,
        labels: &[],
        when: When::DataDir,
        read: |s, x| x.one(s.node.store().storage_figures().map_or(0, |f| f.stored_keys)),
    },
    Family {
        name: "fusebox_storage_keys_written_total",
        kind: Type::Counter,
        help: "Keys written to or deleted from the data dir.",
        store_help: None,
        labels: &[],
        when: When::DataDir,
        read: |s, x| x.one(s.node.store().storage_figures().map_or(0, |f| f.keys_written)),
    },
    Family {
        name: "fusebox_store_commands_total",
        kind: Type::Counter,
        help: "Commands sent to the Redis store.",
        store_help: None,
        labels: &[],
        when: When::Store,
        read: |s, x| x.one(store_figure(s.node.store(), |f| &f.commands)),
    },
    Family {
        name: "fusebox_store_unavailable_total",
        kind: Type::Counter,
        help: "Store commands that failed because Redis could not be reached, timed out, or was failing over; each call answered UNAVAILABLE.",
        store_help: None,
        labels: &[],
        when: When::Store,
        read: |s, x| x.one(store_figure(s.node.store(), |f| &f.unavailable)),
    },
    Family {
        name: "fusebox_store_link_up",
        kind: Type::Gauge,
        help: "1 while the link to the Redis store answers, 0 while its breaker is open (the store unreachable: calls answer UNAVAILABLE at once while a probe retries in the background).",
        store_help: None,
        labels: &[],
        when: When::Store,
        read: |s, x| x.one(1 - store_figure(s.node.store(), |f| &f.link_down).min(1)),
    },
    Family {
        name: "fusebox_store_link_breaks_total",
        kind: Type::Counter,
        help: "Times the breaker on the link to the Redis store opened (the store refused, reset or timed out a command; with a cluster, no seed node answered).",
        store_help: None,
        labels: &[],
        when: When::Store,
        read: |s, x| x.one(store_figure(s.node.store(), |f| &f.link_breaks)),
    },
    Family {
        name: "fusebox_store_fast_failed_total",
        kind: Type::Counter,
        help: "Calls answered UNAVAILABLE at once, without a command to Redis, because the breaker on the link to the store was open.",
        store_help: None,
        labels: &[],
        when: When::Store,
        read: |s, x| x.one(store_figure(s.node.store(), |f| &f.fast_failed)),
    },
    Family {
        name: "fusebox_store_moved_total",
        kind: Type::Counter,
        help: "Store commands that met a hash slot on the move (MOVED, ASK, TRYAGAIN) and still failed after the cluster client followed it.",
        store_help: None,
        labels: &[],
        when: When::Store,
        read: |s, x| x.one(store_figure(s.node.store(), |f| &f.moved)),
    },
    Family {
        name: "fusebox_store_subscriptions_total",
        kind: Type::Counter,
        help: "Times this server subscribed to the store's answers, events and policy changes (more than 1: the subscription was lost and made again).",
        store_help: None,
        labels: &[],
        when: When::Store,
        read: |s, x| x.one(store_figure(s.node.store(), |f| &f.subscriptions)),
    },
    Family {
        name: "fusebox_store_unconfirmed_actions_total",
        kind: Type::Counter,
        help: "Operator actions (isolate, close) that no replica confirmed within 1 s (WAIT); they took effect, but a failover right after may lose them.",
        store_help: None,
        labels: &[],
        when: When::Store,
        read: |s, x| x.one(store_figure(s.node.store(), |f| &f.unconfirmed)),
    },
    Family {
        name: "fusebox_store_unconfirmed_probes_total",
        kind: Type::Counter,
        help: "Probes no replica confirmed in time (WAIT): given back, and the caller told to ask again, so that a failover cannot let a second probe out.",
        store_help: None,
        labels: &[],
        when: When::Store,
        read: |s, x| x.one(store_figure(s.node.store(), |f| &f.unconfirmed_probes)),
    },
    Family {
        name: "fusebox_store_notices_dropped_total",
        kind: Type::Counter,
        help: "Messages from the store dropped unread: not signed with the fleet's secret (--store-secret-file), or an answer naming another key or ticket than its waiter's. Someone who can reach Redis may be forging them.",
        store_help: None,
        labels: &["channel"],
        when: When::Store,
        read: |s, x| {
            if let Some(f) = s.node.store().store_figures() {
                for (channel, dropped) in crate::engine::redis::NOTICE_CHANNELS
                    .iter()
                    .zip(&f.notices_dropped)
                {
                    x.put(&[("channel", channel)], load(dropped))?;
                }
            }
            Ok(())
        },
    },
    Family {
        name: "fusebox_store_policies_unverified_total",
        kind: Type::Counter,
        help: "Reads of the shared policies (the fusebox:policies key) whose content was not signed with the fleet's secret; the running policies stayed.",
        store_help: None,
        labels: &[],
        when: When::Store,
        read: |s, x| x.one(store_figure(s.node.store(), |f| &f.policies_unverified)),
    },
    Family {
        name: "fusebox_store_notices_replayed_total",
        kind: Type::Counter,
        help: "Signed messages from the store refused as old: an event not newer than the last one of its key or older than 60 s, or a policy change naming a version older than the one in force. Someone who can reach Redis may be publishing captured messages again.",
        store_help: None,
        labels: &["channel"],
        when: When::Store,
        read: |s, x| {
            if let Some(f) = s.node.store().store_figures() {
                for (channel, replayed) in crate::engine::redis::NOTICE_CHANNELS
                    .iter()
                    .zip(&f.notices_replayed)
                {
                    x.put(&[("channel", channel)], load(replayed))?;
                }
            }
            Ok(())
        },
    },
    Family {
        name: "fusebox_store_policies_rolled_back_total",
        kind: Type::Counter,
        help: "Reads of the shared policies (the fusebox:policies key) that were signed but older than the version in force on this server (an old copy set back); the running policies stayed.",
        store_help: None,
        labels: &[],
        when: When::Store,
        read: |s, x| x.one(store_figure(s.node.store(), |f| &f.policies_rolled_back)),
    },
    Family {
        name: "fusebox_store_event_orders",
        kind: Type::Gauge,
        help: "Keys whose last event this server remembers, to refuse an older one published again (at most 100,000).",
        store_help: None,
        labels: &[],
        when: When::Store,
        read: |s, x| x.one(store_figure(s.node.store(), |f| &f.event_orders)),
    },
    Family {
        name: "fusebox_store_event_orders_evicted_total",
        kind: Type::Counter,
        help: "Keys forgotten from that memory, past its cap, while their last event was under 60 s old: until it is, an older event of theirs published again is not refused.",
        store_help: None,
        labels: &[],
        when: When::Store,
        read: |s, x| x.one(store_figure(s.node.store(), |f| &f.event_orders_evicted)),
    },
    Family {
        name: "fusebox_watch_streams",
        kind: Type::Gauge,
        help: "Admin.Watch streams open now.",
        store_help: None,
        labels: &[],
        when: When::Always,
        read: |s, x| x.one(load(&s.node.counters().watch_streams)),
    },
    Family {
        name: "fusebox_watch_streams_refused_total",
        kind: Type::Counter,
        help: "Admin.Watch streams refused (RESOURCE_EXHAUSTED) because the cap was reached.",
        store_help: None,
        labels: &[],
        when: When::Always,
        read: |s, x| x.one(load(&s.node.counters().watch_streams_refused)),
    },
    Family {
        name: "fusebox_max_watch_streams",
        kind: Type::Gauge,
        help: "Cap on open Admin.Watch streams ([server] max_watch_streams).",
        store_help: None,
        labels: &[],
        when: When::Always,
        read: |s, x| x.one(s.node.limits().max_watch_streams),
    },
    Family {
        name: "process_resident_memory_bytes",
        kind: Type::Gauge,
        help: "Resident memory size in bytes.",
        store_help: None,
        labels: &[],
        when: When::Linux,
        read: |s, x| x.one(s.resident_memory.unwrap_or(0)),
    },
];

/// An atomic counter's value now.
fn load(n: &std::sync::atomic::AtomicU64) -> u64 {
    n.load(std::sync::atomic::Ordering::Relaxed)
}

/// A figure of the links to Redis (0 without `--store`).
fn store_figure(
    store: &Store,
    figure: impl Fn(&crate::engine::redis::StoreFigures) -> &std::sync::atomic::AtomicU64,
) -> u64 {
    store.store_figures().map_or(0, |f| load(figure(f)))
}

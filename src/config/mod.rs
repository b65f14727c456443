//! The config file of SPEC section 9, and where each part goes. The file
//! is parsed into plain structs, then validated once into what each part of
//! the server takes: the engine's rules and caps ([`crate::engine::Settings`]),
//! who may do what ([`crate::auth::Access`], from `[auth]`, see [`auth`]), the
//! TLS settings ([`crate::tls::TlsConfig`], from `[tls]`, see [`tls`]), the
//! server's other caps and the HTTP side's host names. Every error names the
//! rule and the field (Y2). Nothing else reads the file: the doors open
//! from here to the parts, never back.

use std::num::NonZeroU64;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::Deserialize;

use crate::auth::Access;
use crate::domain::policy::{
    parse_duration, BreakerSpec, LeaseSpec, LimiterSpec, RetryBudgetSpec, MAX_DURATION,
};
use crate::domain::{DurationSpec, Millis, Policy, PolicySpec};
use crate::engine::{Pattern, Rule, Rules, Settings};
use crate::tls::TlsConfig;

pub mod auth;
mod error;
pub mod telemetry;
pub mod tls;

pub use error::ConfigError;

/// `[server] max_event_streams` by default: dashboard event streams open at
/// once.
pub const MAX_EVENT_STREAMS: u64 = 64;

/// The config file as written.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    /// Server limits.
    #[serde(default)]
    pub server: ServerSpec,
    /// Ordered rules; the first match wins.
    #[serde(default)]
    pub rule: Vec<RuleSpec>,
    /// The rule used when no other matches.
    pub default: Option<PolicySpec>,
    /// Who may do what; without it, anyone who reaches the ports may.
    pub auth: Option<auth::AuthSpec>,
    /// TLS for the gRPC and HTTP ports.
    pub tls: Option<tls::TlsSpec>,
    /// Envoy's rate-limit service: domains and descriptors.
    pub rls: Option<crate::rls::RlsSpec>,
    /// Where traces go; without it none is made.
    pub telemetry: Option<telemetry::TelemetrySpec>,
}

/// `[server]` as written.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSpec {
    /// Cap on live keys (K3).
    pub max_keys: Option<u64>,
    /// Cap on live tickets (K3).
    pub max_tickets: Option<u64>,
    /// Cap on waiting requests (K3).
    pub max_waiters: Option<u64>,
    /// Cap on open client connections.
    pub max_connections: Option<u64>,
    /// Cap on open Watch streams.
    pub max_watch_streams: Option<u64>,
    /// Cap on open dashboard event streams.
    pub max_event_streams: Option<u64>,
    /// Cap on open Decide streams, server-wide.
    pub max_decide_streams: Option<u64>,
    /// Bytes of stream answers made but not yet read by their clients,
    /// server-wide (Decide, Watch, event streams).
    pub max_unread_bytes: Option<u64>,
    /// The same, per stream.
    pub max_unread_bytes_per_stream: Option<u64>,
    /// How long a stream may wait for its client to read before it is ended.
    pub stuck_stream_timeout: Option<DurationSpec>,
    /// How long a key at rest is kept (K2).
    pub idle_after: Option<DurationSpec>,
    /// Host names the HTTP side answers to, besides loopback names and its
    /// listen address (checked against `Host` and `Origin`).
    pub http_hosts: Option<Vec<String>>,
    /// How long a new connection has to finish its handshake (the HTTP/2
    /// preface on the gRPC port, the request headers on the HTTP port).
    pub handshake_timeout: Option<DurationSpec>,
    /// Cap on connections still in their handshake.
    pub max_handshakes: Option<u64>,
    /// Cap on open HTTP connections.
    pub max_http_connections: Option<u64>,
    /// How long an HTTP answer may wait for its peer to read any of it
    /// before the connection is closed.
    pub http_write_timeout: Option<DurationSpec>,
    /// Cap on the HTTP/2 streams one connection may have open at once,
    /// announced in its SETTINGS (SETTINGS_MAX_CONCURRENT_STREAMS).
    pub max_streams_per_connection: Option<u64>,
    /// Cap on the rules in force (the config's and SetPolicy's together).
    pub max_rules: Option<u64>,
    /// Cap on gRPC connections that have shown no credential yet.
    pub max_strangers: Option<u64>,
    /// The same, per peer address.
    pub max_strangers_per_peer: Option<u64>,
    /// Where state is kept across restarts (`--data-dir` wins).
    pub data_dir: Option<std::path::PathBuf>,
    /// How long breaker changes may wait to be written together.
    pub commit_window: Option<DurationSpec>,
    /// The memory the server may use, in bytes or with a unit (`512Mi`,
    /// `2Gi`, `500M`); absent: the container's limit (cgroup
    /// `memory.max`), if any. The caps must fit in it ([`crate::memory`]).
    pub memory_limit: Option<toml::Value>,
}

/// One `[[rule]]` as written.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleSpec {
    /// An exact key, or a prefix ending in `*`.
    #[serde(rename = "match")]
    pub pattern: String,
    /// The breaker, if any.
    pub breaker: Option<BreakerSpec>,
    /// The limiter, if any.
    pub limiter: Option<LimiterSpec>,
    /// Lease settings.
    pub lease: Option<LeaseSpec>,
    /// False makes the rule a shadow (SPEC D1-D4).
    pub enforce: Option<bool>,
    /// The retry budget (SPEC R1-R3).
    pub retry_budget: Option<RetryBudgetSpec>,
}

/// Every cap of `[server]`, validated (K2, K3): the engine takes its own
/// ([`Limits::engine`]), the ports and the streams theirs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Cap on live keys.
    pub max_keys: u64,
    /// Cap on live tickets.
    pub max_tickets: u64,
    /// Cap on waiting requests.
    pub max_waiters: u64,
    /// Cap on open gRPC connections.
    pub max_connections: u64,
    /// Cap on open Watch streams.
    pub max_watch_streams: u64,
    /// Cap on open dashboard event streams.
    pub max_event_streams: u64,
    /// Cap on open Decide streams, server-wide.
    pub max_decide_streams: u64,
    /// Unread stream answers, in bytes, server-wide.
    pub max_unread_bytes: u64,
    /// The same, per stream.
    pub max_unread_bytes_per_stream: u64,
    /// How long a stream may wait for its client to read.
    pub stuck_stream_timeout: Millis,
    /// How long a key at rest is kept.
    pub idle_after: Millis,
    /// How long a new connection has to finish its handshake.
    pub handshake_timeout: Millis,
    /// Cap on connections still in their handshake.
    pub max_handshakes: u64,
    /// Cap on open HTTP connections.
    pub max_http_connections: u64,
    /// How long an HTTP answer may wait for its peer to read any of it.
    pub http_write_timeout: Millis,
    /// Cap on the HTTP/2 streams of one connection (both ports).
    pub max_streams_per_connection: u64,
    /// Cap on the rules in force.
    pub max_rules: u64,
    /// Cap on gRPC connections that have shown no credential yet (with
    /// `[auth]`); the rest of `max_connections` is kept for the others.
    pub max_strangers: u64,
    /// The same, per peer address.
    pub max_strangers_per_peer: u64,
    /// How long breaker changes may wait before they are written to the
    /// data dir, together (operator actions and policies never wait).
    pub commit_window: Millis,
    /// `[server] memory_limit` in bytes, when set.
    pub memory_limit: Option<u64>,
    /// True when the config sets a cap that memory bounds (`max_keys`,
    /// `max_tickets`, `max_waiters`, `max_unread_bytes`) to another value
    /// than its default: such caps are never lowered, and a server whose
    /// caps do not fit does not start.
    pub memory_caps_set: bool,
}

/// The longest `[server] stuck_stream_timeout`.
pub const MAX_STUCK_STREAM_TIMEOUT: Millis = 600_000;

/// The longest `[server] handshake_timeout`.
pub const MAX_HANDSHAKE_TIMEOUT: Millis = 60_000;

/// The longest `[server] http_write_timeout`.
pub const MAX_HTTP_WRITE_TIMEOUT: Millis = 600_000;

/// The longest `[server] commit_window`: changes older than this are on
/// disk, so a crash loses at most this much of breaker history.
pub const MAX_COMMIT_WINDOW: Millis = 1_000;

impl Default for Limits {
    fn default() -> Self {
        let engine = crate::engine::Limits::default();
        let connections = crate::connections::Limits::default();
        let unread = crate::outbox::Limits::default();
        Limits {
            max_keys: engine.max_keys,
            max_tickets: engine.max_tickets,
            max_waiters: engine.max_waiters,
            max_watch_streams: engine.max_watch_streams,
            max_decide_streams: engine.max_decide_streams,
            max_rules: engine.max_rules,
            idle_after: engine.idle_after,
            commit_window: engine.commit_window,
            max_connections: connections.max_connections,
            max_handshakes: connections.max_handshakes,
            handshake_timeout: connections.handshake_timeout,
            max_http_connections: connections.max_http_connections,
            http_write_timeout: connections.http_write_timeout,
            max_streams_per_connection: connections.max_streams_per_connection,
            max_strangers: connections.max_strangers,
            max_strangers_per_peer: connections.max_strangers_per_peer,
            max_unread_bytes: unread.max_unread_bytes,
            max_unread_bytes_per_stream: unread.max_unread_bytes_per_stream,
            stuck_stream_timeout: unread.stuck_stream_timeout,
            max_event_streams: MAX_EVENT_STREAMS,
            memory_limit: None,
            memory_caps_set: false,
        }
    }
}

impl Limits {
    /// The caps the engine holds.
    pub fn engine(&self) -> crate::engine::Limits {
        crate::engine::Limits {
            max_keys: self.max_keys,
            max_tickets: self.max_tickets,
            max_waiters: self.max_waiters,
            max_watch_streams: self.max_watch_streams,
            max_decide_streams: self.max_decide_streams,
            max_rules: self.max_rules,
            idle_after: self.idle_after,
            commit_window: self.commit_window,
        }
    }

    /// Puts the engine's caps of `engine` in place of these.
    pub fn set_engine(&mut self, engine: crate::engine::Limits) {
        self.max_keys = engine.max_keys;
        self.max_tickets = engine.max_tickets;
        self.max_waiters = engine.max_waiters;
        self.max_watch_streams = engine.max_watch_streams;
        self.max_decide_streams = engine.max_decide_streams;
        self.max_rules = engine.max_rules;
        self.idle_after = engine.idle_after;
        self.commit_window = engine.commit_window;
    }

    /// The caps of the ports' connections.
    pub fn connections(&self) -> crate::connections::Limits {
        crate::connections::Limits {
            max_connections: self.max_connections,
            max_handshakes: self.max_handshakes,
            handshake_timeout: self.handshake_timeout,
            max_http_connections: self.max_http_connections,
            http_write_timeout: self.http_write_timeout,
            max_streams_per_connection: self.max_streams_per_connection,
            max_strangers: self.max_strangers,
            max_strangers_per_peer: self.max_strangers_per_peer,
        }
    }

    /// The bounds on stream answers not yet read.
    pub fn unread(&self) -> crate::outbox::Limits {
        crate::outbox::Limits {
            max_unread_bytes: self.max_unread_bytes,
            max_unread_bytes_per_stream: self.max_unread_bytes_per_stream,
            stuck_stream_timeout: self.stuck_stream_timeout,
        }
    }
}

/// A validated config.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Config {
    /// The rules.
    pub rules: Rules,
    /// The limits.
    pub limits: Limits,
    /// Who may do what (`[auth]`); `None` when the section is absent.
    pub access: Option<Access>,
    /// Extra host names for the HTTP side (`[server] http_hosts`).
    pub http_hosts: Vec<String>,
    /// `[tls]`, with its paths resolved; the `--tls-*` flags go over it
    /// ([`tls::resolve`]).
    pub tls: Option<TlsConfig>,
    /// `[server] data_dir`, resolved against the file's directory
    /// (`--data-dir` wins).
    pub data_dir: Option<PathBuf>,
    /// `[rls]`: Envoy's rate-limit service's domains (their limits are
    /// rules, placed first in `rules`).
    pub rls: crate::rls::Rls,
    /// `[telemetry]`; `None` (no trace made) when the section is absent.
    pub telemetry: Option<telemetry::TelemetryConfig>,
}

impl From<Config> for Settings {
    /// The engine's part of a config: its rules and caps.
    fn from(config: Config) -> Settings {
        Settings {
            limits: config.limits.engine(),
            rules: config.rules,
        }
    }
}

impl Config {
    /// Reads and validates a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Config::parse_in(&text, &path.display().to_string(), path.parent())
    }

    /// Parses and validates config text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Config, ConfigError> {
        Config::parse_in(text, origin, None)
    }

    /// Like [`Config::parse`], with the directory that relative paths in
    /// the config (the token file) resolve against.
    pub fn parse_in(text: &str, origin: &str, dir: Option<&Path>) -> Result<Config, ConfigError> {
        let parsed = toml::Deserializer::parse(text).map_err(|e| ConfigError::Parse {
            path: origin.to_owned(),
            message: e.to_string().trim().replace('\n', " "),
        })?;
        let file: ConfigFile =
            serde_path_to_error::deserialize(parsed).map_err(|e| misfit(text, &e))?;
        file.validate_in(dir)
    }
}

/// A file that is TOML but does not fit the config's shape (an unknown
/// field, a value of the wrong type, a bad duration), in words that name
/// the rule and the field (Y2) and say where in the file it is. The path
/// comes from the deserializer (`rule[1].breaker.failures`), the place from
/// the TOML value's span.
fn misfit(text: &str, e: &serde_path_to_error::Error<toml::de::Error>) -> ConfigError {
    use serde_path_to_error::Segment;
    let inner = e.inner();
    let message = inner.message().trim();
    let mut segments = e.path().iter().peekable();
    let section = match segments.next() {
        Some(Segment::Map { key }) => key.clone(),
        // Only an unknown top-level table stops before naming one.
        _ => message
            .strip_prefix("unknown field `")
            .and_then(|m| m.split('`').next())
            .unwrap_or("")
            .to_owned(),
    };
    let entry = |list: &str, i: usize, name_field: &str| {
        let name = toml::Table::from_str(text)
            .ok()
            .and_then(|t| match list.split_once('.') {
                Some((a, b)) => t.get(a)?.get(b)?.get(i)?.get(name_field).cloned(),
                None => t.get(list)?.get(i)?.get(name_field).cloned(),
            })
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        format!("{list} {} ({name:?})", i + 1)
    };
    let rule = match section.as_str() {
        "rule" => match index_of(&mut segments) {
            Some(i) => entry("rule", i, "match"),
            None => "[[rule]]".to_owned(),
        },
        "auth" => match segments.peek() {
            Some(Segment::Map { key }) if key == "token" || key == "client" => {
                let list = format!("auth.{key}");
                segments.next();
                match index_of(&mut segments) {
                    Some(i) => entry(&list, i, "name"),
                    None => "[auth]".to_owned(),
                }
            }
            _ => "[auth]".to_owned(),
        },
        "server" | "default" | "tls" | "telemetry" => format!("[{section}]"),
        "rls" => match segments.peek() {
            Some(Segment::Map { key }) if key == "domain" => {
                segments.next();
                match index_of(&mut segments) {
                    Some(i) => entry("rls.domain", i, "name"),
                    None => "[rls]".to_owned(),
                }
            }
            _ => "[rls]".to_owned(),
        },
        other => return ConfigError::Invalid {
            rule: format!("[{other}]"),
            field: other.to_owned(),
            problem:
                "is not a part of the config: use [server], [[rule]], [default], [auth], [tls], [rls] or [telemetry]"
                    .into(),
        },
    };
    let mut field: Vec<String> = segments
        .map(|s| match s {
            Segment::Seq { index } => format!("[{index}]"),
            Segment::Map { key } => key.clone(),
            Segment::Enum { variant } => variant.clone(),
            Segment::Unknown => "?".to_owned(),
        })
        .collect();
    let named = ["unknown field `", "missing field `"]
        .iter()
        .find_map(|p| message.strip_prefix(p)?.split('`').next());
    if let Some(name) = named.filter(|n| field.last().map(String::as_str) != Some(n)) {
        field.push(name.to_owned());
    }
    let field = if field.is_empty() {
        "(the rule itself)".to_owned()
    } else {
        field.join(".").replace(".[", "[")
    };
    let at = inner.span().map(|span| {
        let before = &text[..span.start.min(text.len())];
        let line = before.matches('\n').count() + 1;
        let column = before.len() - before.rfind('\n').map_or(0, |n| n + 1) + 1;
        format!(" (line {line}, column {column})")
    });
    ConfigError::Invalid {
        rule,
        field,
        problem: format!("{message}{}", at.unwrap_or_default()),
    }
}

/// Takes the next segment of `segments` if it is an index into a list.
fn index_of<'a>(
    segments: &mut std::iter::Peekable<impl Iterator<Item = &'a serde_path_to_error::Segment>>,
) -> Option<usize> {
    match segments.peek() {
        Some(serde_path_to_error::Segment::Seq { index }) => {
            let i = *index;
            segments.next();
            Some(i)
        }
        _ => None,
    }
}

impl ConfigFile {
    /// Validates every rule, the default and the limits.
    pub fn validate(&self) -> Result<Config, ConfigError> {
        self.validate_in(None)
    }

    /// Like [`ConfigFile::validate`]; a relative token file resolves
    /// against `dir`.
    pub fn validate_in(&self, dir: Option<&Path>) -> Result<Config, ConfigError> {
        let mut rules = Vec::with_capacity(self.rule.len());
        for (i, r) in self.rule.iter().enumerate() {
            let name = format!("rule {} ({:?})", i + 1, r.pattern);
            let pattern = Pattern::parse(&r.pattern).map_err(|problem| ConfigError::Invalid {
                rule: name.clone(),
                field: "match".into(),
                problem,
            })?;
            let spec = PolicySpec {
                breaker: r.breaker.clone(),
                limiter: r.limiter.clone(),
                lease: r.lease.clone(),
                enforce: r.enforce,
                retry_budget: r.retry_budget.clone(),
            };
            let policy = spec.validate().map_err(|e| ConfigError::Invalid {
                rule: name,
                field: e.field,
                problem: e.problem,
            })?;
            rules.push(Rule { pattern, policy });
        }
        let (rls, rls_rules) = match &self.rls {
            Some(spec) => spec.validate()?,
            None => (crate::rls::Rls::default(), Vec::new()),
        };
        // The rate-limit service's keys take their policies from its own
        // rules, before any of the file's.
        rules.splice(0..0, rls_rules);
        let default = match &self.default {
            Some(spec) => spec.validate().map_err(|e| ConfigError::Invalid {
                rule: "[default]".into(),
                field: e.field,
                problem: e.problem,
            })?,
            None => Policy::default(),
        };
        let tls = self.tls.as_ref().map(|t| t.validate(dir)).transpose()?;
        let telemetry = self
            .telemetry
            .as_ref()
            .map(telemetry::TelemetrySpec::validate)
            .transpose()?;
        let defaults = Limits::default();
        let cap = |value: Option<u64>, field: &str, default: u64| match value {
            Some(0) => Err(ConfigError::server(field, "must be at least 1")),
            Some(v) => Ok(v),
            None => Ok(default),
        };
        let idle_after = match self.server.idle_after {
            // As for every other duration; a bare number of ms is not
            // checked when it is read, as a string with a unit is.
            Some(d) if d.0 > MAX_DURATION => {
                return Err(ConfigError::server(
                    "idle_after",
                    "must be at most 365 days",
                ))
            }
            Some(d) => NonZeroU64::new(d.0)
                .ok_or_else(|| ConfigError::server("idle_after", "must be longer than 0 ms"))?
                .get(),
            None => defaults.idle_after,
        };
        let access = match &self.auth {
            Some(spec) => Some(spec.validate(dir).map_err(|e| ConfigError::Invalid {
                rule: e.entry,
                field: e.field,
                problem: e.problem,
            })?),
            None => None,
        };
        let http_hosts = self.server.http_hosts.clone().unwrap_or_default();
        if let Some(bad) = http_hosts.iter().find(|h| {
            h.is_empty() || h.contains(['/', ' ', '@']) || h.chars().any(char::is_control)
        }) {
            return Err(ConfigError::server(
                "http_hosts",
                format!("{bad:?} is not a host name (write names such as \"fusebox.internal\", without scheme or port)"),
            ));
        }
        let handshake_timeout = match self.server.handshake_timeout {
            Some(d) if d.0 == 0 || d.0 > MAX_HANDSHAKE_TIMEOUT => {
                return Err(ConfigError::server(
                    "handshake_timeout",
                    format!(
                        "must be longer than 0 ms and at most {} s, e.g. \"5s\"",
                        MAX_HANDSHAKE_TIMEOUT / 1000
                    ),
                ))
            }
            Some(d) => d.0,
            None => defaults.handshake_timeout,
        };
        let http_write_timeout = match self.server.http_write_timeout {
            Some(DurationSpec(ms)) if !(100..=MAX_HTTP_WRITE_TIMEOUT).contains(&ms) => {
                return Err(ConfigError::server(
                    "http_write_timeout",
                    format!(
                        "must be from 100ms to {} s, not {ms}ms: it is how long an HTTP answer may wait for its peer to read any of it",
                        MAX_HTTP_WRITE_TIMEOUT / 1000
                    ),
                ))
            }
            Some(DurationSpec(ms)) => ms,
            None => defaults.http_write_timeout,
        };
        let commit_window = match self.server.commit_window {
            Some(DurationSpec(ms)) if !(1..=MAX_COMMIT_WINDOW).contains(&ms) => {
                return Err(ConfigError::server(
                    "commit_window",
                    format!(
                        "must be from 1ms to {MAX_COMMIT_WINDOW}ms, not {ms}ms: it is how much breaker history a crash may lose"
                    ),
                ))
            }
            Some(DurationSpec(ms)) => ms,
            None => defaults.commit_window,
        };
        if self
            .server
            .data_dir
            .as_ref()
            .is_some_and(|d| d.as_os_str().is_empty())
        {
            return Err(ConfigError::server(
                "data_dir",
                "must not be empty: name a directory, or leave the field out to keep state in memory only",
            ));
        }
        let max_rules = cap(self.server.max_rules, "max_rules", defaults.max_rules)?;
        let max_unread_bytes = cap(
            self.server.max_unread_bytes,
            "max_unread_bytes",
            defaults.max_unread_bytes,
        )?
        .min(u64::from(u32::MAX));
        let max_unread_bytes_per_stream = cap(
            self.server.max_unread_bytes_per_stream,
            "max_unread_bytes_per_stream",
            defaults.max_unread_bytes_per_stream,
        )?;
        if max_unread_bytes_per_stream > max_unread_bytes {
            return Err(ConfigError::server(
                "max_unread_bytes_per_stream",
                format!(
                    "is {max_unread_bytes_per_stream}, more than max_unread_bytes ({max_unread_bytes}): one stream's part cannot be more than the whole"
                ),
            ));
        }
        let stuck_stream_timeout = match self.server.stuck_stream_timeout {
            Some(DurationSpec(ms)) if !(100..=MAX_STUCK_STREAM_TIMEOUT).contains(&ms) => {
                return Err(ConfigError::server(
                    "stuck_stream_timeout",
                    format!(
                        "must be from 100ms to 10m, not {ms}ms: it is how long a stream may wait for its client to read"
                    ),
                ))
            }
            Some(DurationSpec(ms)) => ms,
            None => defaults.stuck_stream_timeout,
        };
        let max_connections = cap(
            self.server.max_connections,
            "max_connections",
            defaults.max_connections,
        )?;
        // By default half the connections may be strangers, at most 5,000.
        let max_strangers = cap(
            self.server.max_strangers,
            "max_strangers",
            (max_connections / 2).clamp(1, defaults.max_strangers),
        )?;
        if max_strangers > max_connections {
            return Err(ConfigError::server(
                "max_strangers",
                format!(
                    "is {max_strangers}, more than max_connections ({max_connections}): strangers are a part of the connections"
                ),
            ));
        }
        if rules.len() as u64 > max_rules {
            return Err(ConfigError::server(
                "max_rules",
                format!(
                    "is {max_rules}, and the file has {} rules: raise max_rules or merge rules",
                    rules.len()
                ),
            ));
        }
        // Like every path in the file, a relative one is taken from the
        // file's directory, not the working directory.
        let data_dir = self.server.data_dir.clone().map(|d| match dir {
            Some(base) if d.is_relative() => base.join(d),
            _ => d,
        });
        Ok(Config {
            access,
            http_hosts,
            tls,
            data_dir,
            rls,
            telemetry,
            rules: Rules { rules, default },
            limits: Limits {
                max_keys: cap(self.server.max_keys, "max_keys", defaults.max_keys)?,
                max_tickets: cap(self.server.max_tickets, "max_tickets", defaults.max_tickets)?,
                max_waiters: cap(self.server.max_waiters, "max_waiters", defaults.max_waiters)?,
                max_connections: cap(
                    self.server.max_connections,
                    "max_connections",
                    defaults.max_connections,
                )?,
                max_watch_streams: cap(
                    self.server.max_watch_streams,
                    "max_watch_streams",
                    defaults.max_watch_streams,
                )?,
                max_event_streams: cap(
                    self.server.max_event_streams,
                    "max_event_streams",
                    defaults.max_event_streams,
                )?,
                max_decide_streams: cap(
                    self.server.max_decide_streams,
                    "max_decide_streams",
                    defaults.max_decide_streams,
                )?,
                max_unread_bytes,
                max_unread_bytes_per_stream,
                stuck_stream_timeout,
                idle_after,
                handshake_timeout,
                max_handshakes: cap(
                    self.server.max_handshakes,
                    "max_handshakes",
                    defaults.max_handshakes,
                )?,
                max_http_connections: cap(
                    self.server.max_http_connections,
                    "max_http_connections",
                    defaults.max_http_connections,
                )?,
                http_write_timeout,
                max_streams_per_connection: cap(
                    self.server.max_streams_per_connection,
                    "max_streams_per_connection",
                    defaults.max_streams_per_connection,
                )?
                .min(u64::from(u32::MAX)),
                max_rules,
                max_strangers,
                max_strangers_per_peer: cap(
                    self.server.max_strangers_per_peer,
                    "max_strangers_per_peer",
                    defaults.max_strangers_per_peer,
                )?,
                commit_window,
                memory_limit: memory_limit(self.server.memory_limit.as_ref())?,
                // A cap written at its default value is the default.
                memory_caps_set: self.server.max_keys.is_some_and(|n| n != defaults.max_keys)
                    || self
                        .server
                        .max_tickets
                        .is_some_and(|n| n != defaults.max_tickets)
                    || self
                        .server
                        .max_waiters
                        .is_some_and(|n| n != defaults.max_waiters)
                    || self
                        .server
                        .max_unread_bytes
                        .is_some_and(|n| n != defaults.max_unread_bytes),
            },
        })
    }
}

/// Parses a duration flag such as `--wait 2s`.
pub fn parse_duration_flag(text: &str) -> Result<Millis, String> {
    parse_duration(text)
}

/// `[server] memory_limit`: a whole number of bytes, or a string with a
/// unit as Kubernetes writes them (`512Mi`, `2Gi`, `500M`, `1G`, `64Ki`).
fn memory_limit(value: Option<&toml::Value>) -> Result<Option<u64>, ConfigError> {
    let bad = |what: String| {
        ConfigError::server(
            "memory_limit",
            format!("{what}: write bytes (536870912) or a size such as \"512Mi\" or \"2Gi\""),
        )
    };
    let Some(value) = value else {
        return Ok(None);
    };
    let bytes = match value {
        toml::Value::Integer(n) if *n > 0 => *n as u64,
        toml::Value::String(text) => {
            parse_size(text).ok_or_else(|| bad(format!("{text:?} is not a size")))?
        }
        other => return Err(bad(format!("{other} is not a size"))),
    };
    Ok(Some(bytes))
}

/// A size as Kubernetes writes it (`[server] memory_limit`): a whole number with an optional unit,
/// `Ki`/`Mi`/`Gi`/`Ti` (powers of 1024) or `k`/`K`/`M`/`G`/`T` (of 1000).
pub fn parse_size(text: &str) -> Option<u64> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let n: u64 = digits.parse().ok()?;
    let factor: u64 = match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "k" | "K" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        _ => return None,
    };
    n.checked_mul(factor).filter(|&b| b > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The error of `text`, which must not be a valid config.
    fn error(text: &str) -> ConfigError {
        Config::parse(text, "test.toml").expect_err("an invalid config")
    }

    #[test]
    fn a_misfit_names_its_rule_its_field_and_its_place() {
        for (text, rule, field, problem) in [
            (
                "[[rule]]\nmatch = \"a/*\"\n\n[[rule]]\nmatch = \"b/*\"\nbreakr = {}\n",
                "rule 2 (\"b/*\")",
                "breakr",
                "unknown field `breakr`",
            ),
            (
                "[[rule]]\nmatch = \"a/*\"\nbreaker = { mode = \"consecutive\", failures = \"x\", break = \"1s\" }\n",
                "rule 1 (\"a/*\")",
                "breaker.failures",
                "(line 3, column ",
            ),
            (
                "[server]\nmax_keys = \"many\"\n",
                "[server]",
                "max_keys",
                "(line 2, column 12)",
            ),
            (
                "[default]\nlease = { default = \"soon\" }\n",
                "[default]",
                "lease.default",
                "",
            ),
            (
                "[auth]\n[[auth.token]]\nname = \"ci\"\nrole = \"king\"\nsha256 = \"00\"\n",
                "auth.token 1 (\"ci\")",
                "role",
                "unknown variant `king`",
            ),
            (
                "[tls]\ncert = \"c\"\nkey = \"k\"\nverify = true\n",
                "[tls]",
                "verify",
                "unknown field `verify`",
            ),
            (
                "[limits]\nmax_keys = 1\n",
                "[limits]",
                "limits",
                "is not a part of the config",
            ),
            (
                "[[rule]]\nbreaker = { mode = \"consecutive\", failures = 1, break = \"1s\" }\n",
                "rule 1 (\"\")",
                "match",
                "missing field `match`",
            ),
        ] {
            let ConfigError::Invalid {
                rule: r,
                field: f,
                problem: p,
            } = error(text)
            else {
                panic!("{text:?}: not an Invalid error");
            };
            assert_eq!((r.as_str(), f.as_str()), (rule, field), "{text:?}: {p}");
            assert!(p.contains(problem), "{text:?}: {p}");
        }
    }

    #[test]
    fn text_that_is_not_toml_is_a_parse_error_with_its_place() {
        let e = error("[[rule]\nmatch = ");
        assert!(matches!(e, ConfigError::Parse { .. }), "{e}");
        assert!(e.to_string().contains("test.toml"), "{e}");
    }

    #[test]
    fn paths_in_the_file_are_taken_from_its_directory() {
        let dir = Path::new("/etc/fusebox");
        let text = "[server]\ndata_dir = \"state\"\n[tls]\ncert = \"c.pem\"\nkey = \"/k.pem\"\n";
        let config = Config::parse_in(text, "test.toml", Some(dir)).expect("valid");
        assert_eq!(config.data_dir, Some(dir.join("state")));
        let tls = config.tls.expect("TLS");
        assert_eq!(tls.cert, dir.join("c.pem"));
        assert_eq!(tls.key, PathBuf::from("/k.pem"));
    }

    #[test]
    fn a_config_yields_the_engine_its_rules_and_caps() {
        let config = Config::parse(
            "[server]\nmax_keys = 7\nmax_connections = 9\n[[rule]]\nmatch = \"a/*\"\n",
            "test.toml",
        )
        .expect("valid");
        assert_eq!(config.limits.connections().max_connections, 9);
        let settings = Settings::from(config);
        assert_eq!(settings.limits.max_keys, 7);
        assert_eq!(settings.rules.rules.len(), 1);
    }
}

//! The TOML config of SPEC section 9: ordered rules, a default rule and
//! server limits. Parsed into plain structs, then validated once into
//! [`Rules`] and [`Limits`]; every error names the rule and the field (Y2).

use std::num::NonZeroU64;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::domain::policy::{parse_duration, BreakerSpec, LeaseSpec, LimiterSpec, MAX_DURATION};
use crate::domain::{DurationSpec, Millis, Policy, PolicySpec};

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
    pub auth: Option<crate::auth::AuthSpec>,
    /// TLS for the gRPC and HTTP ports.
    pub tls: Option<TlsSpec>,
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
}

/// `[tls]` as written.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSpec {
    /// The server's certificate chain (PEM), leaf first.
    pub cert: Option<String>,
    /// The server's private key (PEM).
    pub key: Option<String>,
    /// The CAs that sign client certificates (PEM); set for mutual TLS.
    pub client_ca: Option<String>,
    /// `"required"` (the default with `client_ca`) or `"optional"`.
    pub client_auth: Option<ClientAuth>,
    /// Serve the HTTP port over TLS too (default true).
    pub http: Option<bool>,
}

/// Whether a client must show a certificate (with `[tls] client_ca`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClientAuth {
    /// Connections without a client certificate signed by `client_ca` are refused.
    #[default]
    Required,
    /// A client may connect without a certificate; one it shows must be
    /// signed by `client_ca`.
    Optional,
}

/// Validated `[tls]`, with the paths resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsConfig {
    /// The certificate chain file.
    pub cert: PathBuf,
    /// The private key file.
    pub key: PathBuf,
    /// The client CA bundle; `Some` means mutual TLS.
    pub client_ca: Option<PathBuf>,
    /// Whether clients must show a certificate (meaningful with `client_ca`).
    pub client_auth: ClientAuth,
    /// Serve the HTTP port over TLS too.
    pub http: bool,
}

impl TlsSpec {
    /// Validates `[tls]`; relative paths resolve against `base` (the config
    /// file's directory). The files themselves are read when the server starts.
    pub fn validate(&self, base: Option<&Path>) -> Result<TlsConfig, ConfigError> {
        let invalid = |field: &str, problem: &str| ConfigError::Invalid {
            rule: "[tls]".into(),
            field: field.into(),
            problem: problem.into(),
        };
        let path = |field: &str, value: &Option<String>| -> Result<Option<PathBuf>, ConfigError> {
            match value.as_deref() {
                None => Ok(None),
                Some("") => Err(invalid(
                    field,
                    "must not be empty: give the path of a PEM file",
                )),
                Some(p) => Ok(Some(match base {
                    Some(dir) if Path::new(p).is_relative() => dir.join(p),
                    _ => PathBuf::from(p),
                })),
            }
        };
        let cert = path("cert", &self.cert)?.ok_or_else(|| {
            invalid(
                "cert",
                "is missing: give the PEM file of the server's certificate chain",
            )
        })?;
        let key = path("key", &self.key)?.ok_or_else(|| {
            invalid(
                "key",
                "is missing: give the PEM file of the server's private key",
            )
        })?;
        let client_ca = path("client_ca", &self.client_ca)?;
        if self.client_auth.is_some() && client_ca.is_none() {
            return Err(invalid(
                "client_auth",
                "needs client_ca (the PEM bundle of the CAs that sign client certificates); set client_ca or remove client_auth",
            ));
        }
        Ok(TlsConfig {
            cert,
            key,
            client_ca,
            client_auth: self.client_auth.unwrap_or_default(),
            http: self.http.unwrap_or(true),
        })
    }
}

impl TlsConfig {
    /// `[tls]` of the config file at `path` (which [`Config::load`] has
    /// accepted), then the `--tls-*` flags over it: a flag wins over its
    /// field; `--tls-cert` and `--tls-key` without `[tls]` turn TLS on.
    pub fn resolve(
        path: Option<&Path>,
        cert: Option<PathBuf>,
        key: Option<PathBuf>,
        client_ca: Option<PathBuf>,
    ) -> Result<Option<TlsConfig>, ConfigError> {
        let from_file = match path {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                    path: path.display().to_string(),
                    source,
                })?;
                let file: ConfigFile = toml::from_str(&text).map_err(|e| ConfigError::Parse {
                    path: path.display().to_string(),
                    message: e.to_string().trim().replace('\n', " "),
                })?;
                file.tls.map(|t| t.validate(path.parent())).transpose()?
            }
            None => None,
        };
        let flag = |name: &str, problem: &str| ConfigError::Invalid {
            rule: "the command line".into(),
            field: name.into(),
            problem: problem.into(),
        };
        match (from_file, cert, key) {
            (None, None, None) if client_ca.is_some() => Err(flag(
                "--tls-client-ca",
                "needs TLS: pass --tls-cert and --tls-key too, or set [tls] in the config",
            )),
            (None, None, None) => Ok(None),
            (None, Some(cert), Some(key)) => Ok(Some(TlsConfig {
                cert,
                key,
                client_ca,
                client_auth: ClientAuth::Required,
                http: true,
            })),
            (None, Some(_), None) => Err(flag(
                "--tls-cert",
                "needs --tls-key (the server's private key)",
            )),
            (None, None, Some(_)) => Err(flag(
                "--tls-key",
                "needs --tls-cert (the server's certificate chain)",
            )),
            (Some(mut tls), cert, key) => {
                if let Some(cert) = cert {
                    tls.cert = cert;
                }
                if let Some(key) = key {
                    tls.key = key;
                }
                if client_ca.is_some() {
                    tls.client_ca = client_ca;
                }
                Ok(Some(tls))
            }
        }
    }
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
}

/// A config that cannot be used, in words that name the rule and the field.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The path.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid TOML or has an unknown field.
    #[error("config file {path} is not valid: {message}")]
    Parse {
        /// The path.
        path: String,
        /// The parser's message, with line and column.
        message: String,
    },
    /// A rule is invalid.
    #[error("{rule}: {field}: {problem}")]
    Invalid {
        /// Which rule: `rule 2 ("payments/*")`, `[default]` or `[server]`.
        rule: String,
        /// The field's path.
        field: String,
        /// What is wrong.
        problem: String,
    },
}

/// How a rule matches keys (Y1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pattern {
    /// Exactly this key.
    Exact(String),
    /// Every key that starts with this prefix (written `prefix*`).
    Prefix(String),
}

impl Pattern {
    /// Parses `"a/b"` or `"a/*"`; `*` may only end a pattern.
    pub fn parse(text: &str) -> Result<Pattern, String> {
        if text.is_empty() {
            return Err("must not be empty".into());
        }
        if let Some(c) = text.chars().find(|&c| crate::domain::key::is_control(c)) {
            return Err(format!(
                "{text:?}: must not contain control or bidirectional formatting characters (found U+{:04X}), like keys (K1)",
                u32::from(c)
            ));
        }
        match text.find('*') {
            None => Ok(Pattern::Exact(text.to_owned())),
            Some(i) if i == text.len() - 1 => Ok(Pattern::Prefix(text[..i].to_owned())),
            Some(_) => Err(format!(
                "{text:?}: '*' may appear only once, at the end of a prefix pattern"
            )),
        }
    }

    /// True when the pattern matches `key`.
    pub fn matches(&self, key: &str) -> bool {
        match self {
            Pattern::Exact(k) => k == key,
            Pattern::Prefix(p) => key.starts_with(p.as_str()),
        }
    }

    /// The pattern as written.
    pub fn text(&self) -> String {
        match self {
            Pattern::Exact(k) => k.clone(),
            Pattern::Prefix(p) => format!("{p}*"),
        }
    }
}

/// A validated rule.
#[derive(Clone, Debug, PartialEq)]
pub struct Rule {
    /// Which keys.
    pub pattern: Pattern,
    /// Their policy.
    pub policy: Policy,
}

/// Validated, ordered rules and the default (Y1).
#[derive(Clone, Debug, PartialEq)]
pub struct Rules {
    /// Ordered rules.
    pub rules: Vec<Rule>,
    /// The default policy.
    pub default: Policy,
}

impl Default for Rules {
    /// No rules and the built-in default of Y3.
    fn default() -> Self {
        Rules {
            rules: Vec::new(),
            default: Policy::default(),
        }
    }
}

impl Rules {
    /// The policy of the first rule that matches `key`, else the default.
    pub fn policy_for(&self, key: &str) -> &Policy {
        self.rules
            .iter()
            .find(|r| r.pattern.matches(key))
            .map_or(&self.default, |r| &r.policy)
    }
}

/// Validated server limits (K2, K3).
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
}

/// The longest `[server] stuck_stream_timeout`.
pub const MAX_STUCK_STREAM_TIMEOUT: Millis = 600_000;

/// The longest `[server] handshake_timeout`.
pub const MAX_HANDSHAKE_TIMEOUT: Millis = 60_000;

/// The longest `[server] commit_window`: changes older than this are on
/// disk, so a crash loses at most this much of breaker history.
pub const MAX_COMMIT_WINDOW: Millis = 1_000;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_keys: 1_000_000,
            max_tickets: 1_000_000,
            max_waiters: 100_000,
            max_connections: 10_000,
            max_watch_streams: 256,
            max_event_streams: 64,
            max_decide_streams: 1_024,
            max_unread_bytes: 32 << 20,
            max_unread_bytes_per_stream: 1 << 20,
            stuck_stream_timeout: 30_000,
            idle_after: crate::domain::IDLE_AFTER,
            handshake_timeout: 5_000,
            max_handshakes: 1_024,
            max_http_connections: 256,
            max_streams_per_connection: 256,
            max_rules: 1_000,
            max_strangers: 5_000,
            max_strangers_per_peer: 256,
            commit_window: 50,
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
    pub access: Option<crate::auth::Access>,
    /// Extra host names for the HTTP side (`[server] http_hosts`).
    pub http_hosts: Vec<String>,
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
        let file: ConfigFile = toml::from_str(text).map_err(|e| {
            locate(text).unwrap_or_else(|| ConfigError::Parse {
                path: origin.to_owned(),
                message: e.to_string().trim().replace('\n', " "),
            })
        })?;
        file.validate_in(dir)
    }
}

/// For a file that is valid TOML but does not fit the config's shape (an
/// unknown field, a value of the wrong type, a bad duration), finds the part
/// that does not fit so that the error names the rule and the field (Y2).
/// `None` when the text is not TOML at all, or no single part is to blame.
fn locate(text: &str) -> Option<ConfigError> {
    let table: toml::Table = text.parse().ok()?;
    let invalid = |rule: String, e: toml::de::Error| {
        let (field, problem) = field_of(&e);
        Some(ConfigError::Invalid {
            rule,
            field,
            problem,
        })
    };
    for (section, value) in &table {
        match section.as_str() {
            "server" => {
                if let Err(e) = ServerSpec::deserialize(value.clone()) {
                    return invalid("[server]".into(), e);
                }
            }
            "default" => {
                if let Err(e) = PolicySpec::deserialize(value.clone()) {
                    return invalid("[default]".into(), e);
                }
            }
            "auth" => {
                if let Err(e) = crate::auth::AuthSpec::deserialize(value.clone()) {
                    return invalid("[auth]".into(), e);
                }
            }
            "tls" => {
                if let Err(e) = TlsSpec::deserialize(value.clone()) {
                    return invalid("[tls]".into(), e);
                }
            }
            "rule" => {
                for (i, rule) in value.as_array()?.iter().enumerate() {
                    if let Err(e) = RuleSpec::deserialize(rule.clone()) {
                        let pattern = rule
                            .get("match")
                            .and_then(toml::Value::as_str)
                            .unwrap_or("");
                        return invalid(format!("rule {} ({pattern:?})", i + 1), e);
                    }
                }
            }
            other => {
                return Some(ConfigError::Invalid {
                    rule: format!("[{other}]"),
                    field: other.to_owned(),
                    problem:
                        "is not a part of the config: use [server], [[rule]], [default], [auth] or [tls]"
                            .into(),
                })
            }
        }
    }
    None
}

/// The field path and the problem of an error from deserializing one part:
/// toml shows the path as "in `a.b`"; an unknown or missing field adds its name.
fn field_of(e: &toml::de::Error) -> (String, String) {
    let problem = e.message().trim().to_owned();
    let shown = e.to_string();
    let path = shown
        .lines()
        .rev()
        .find_map(|l| l.trim().strip_prefix("in `")?.strip_suffix('`'))
        .unwrap_or("");
    let named = ["unknown field `", "missing field `"]
        .iter()
        .find_map(|p| problem.strip_prefix(p)?.split('`').next());
    let field = match (path, named) {
        ("", Some(name)) => name.to_owned(),
        ("", None) => "(the rule itself)".to_owned(),
        (path, Some(name)) => format!("{path}.{name}"),
        (path, None) => path.to_owned(),
    };
    (field, problem)
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
            };
            let policy = spec.validate().map_err(|e| ConfigError::Invalid {
                rule: name,
                field: e.field,
                problem: e.problem,
            })?;
            rules.push(Rule { pattern, policy });
        }
        let default = match &self.default {
            Some(spec) => spec.validate().map_err(|e| ConfigError::Invalid {
                rule: "[default]".into(),
                field: e.field,
                problem: e.problem,
            })?,
            None => Policy::default(),
        };
        if let Some(tls) = &self.tls {
            tls.validate(None)?;
        }
        let defaults = Limits::default();
        let cap = |value: Option<u64>, field: &str, default: u64| match value {
            Some(0) => Err(ConfigError::Invalid {
                rule: "[server]".into(),
                field: field.into(),
                problem: "must be at least 1".into(),
            }),
            Some(v) => Ok(v),
            None => Ok(default),
        };
        let idle_after = match self.server.idle_after {
            // As for every other duration; a bare number of ms is not
            // checked when it is read, as a string with a unit is.
            Some(d) if d.0 > MAX_DURATION => {
                return Err(ConfigError::Invalid {
                    rule: "[server]".into(),
                    field: "idle_after".into(),
                    problem: "must be at most 365 days".into(),
                })
            }
            Some(d) => NonZeroU64::new(d.0)
                .ok_or_else(|| ConfigError::Invalid {
                    rule: "[server]".into(),
                    field: "idle_after".into(),
                    problem: "must be longer than 0 ms".into(),
                })?
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
            return Err(ConfigError::Invalid {
                rule: "[server]".into(),
                field: "http_hosts".into(),
                problem: format!("{bad:?} is not a host name (write names such as \"fusebox.internal\", without scheme or port)"),
            });
        }
        let handshake_timeout = match self.server.handshake_timeout {
            Some(d) if d.0 == 0 || d.0 > MAX_HANDSHAKE_TIMEOUT => {
                return Err(ConfigError::Invalid {
                    rule: "[server]".into(),
                    field: "handshake_timeout".into(),
                    problem: format!(
                        "must be longer than 0 ms and at most {} s, e.g. \"5s\"",
                        MAX_HANDSHAKE_TIMEOUT / 1000
                    ),
                })
            }
            Some(d) => d.0,
            None => defaults.handshake_timeout,
        };
        let commit_window = match self.server.commit_window {
            Some(DurationSpec(ms)) if !(1..=MAX_COMMIT_WINDOW).contains(&ms) => {
                return Err(ConfigError::Invalid {
                    rule: "[server]".into(),
                    field: "commit_window".into(),
                    problem: format!(
                        "must be from 1ms to {MAX_COMMIT_WINDOW}ms, not {ms}ms: it is how much breaker history a crash may lose"
                    ),
                })
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
            return Err(ConfigError::Invalid {
                rule: "[server]".into(),
                field: "data_dir".into(),
                problem: "must not be empty: name a directory, or leave the field out to keep state in memory only".into(),
            });
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
            return Err(ConfigError::Invalid {
                rule: "[server]".into(),
                field: "max_unread_bytes_per_stream".into(),
                problem: format!(
                    "is {max_unread_bytes_per_stream}, more than max_unread_bytes ({max_unread_bytes}): one stream's part cannot be more than the whole"
                ),
            });
        }
        let stuck_stream_timeout = match self.server.stuck_stream_timeout {
            Some(DurationSpec(ms)) if !(100..=MAX_STUCK_STREAM_TIMEOUT).contains(&ms) => {
                return Err(ConfigError::Invalid {
                    rule: "[server]".into(),
                    field: "stuck_stream_timeout".into(),
                    problem: format!(
                        "must be from 100ms to 10m, not {ms}ms: it is how long a stream may wait for its client to read"
                    ),
                })
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
            return Err(ConfigError::Invalid {
                rule: "[server]".into(),
                field: "max_strangers".into(),
                problem: format!(
                    "is {max_strangers}, more than max_connections ({max_connections}): strangers are a part of the connections"
                ),
            });
        }
        if rules.len() as u64 > max_rules {
            return Err(ConfigError::Invalid {
                rule: "[server]".into(),
                field: "max_rules".into(),
                problem: format!(
                    "is {max_rules}, and the file has {} rules: raise max_rules or merge rules",
                    rules.len()
                ),
            });
        }
        Ok(Config {
            access,
            http_hosts,
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
            },
        })
    }
}

/// The `[server] data_dir` of the config file at `path` (validated like
/// the rest of the file), for the server's start-up: `--data-dir` wins.
/// Like every path in the file, a relative one is taken from the file's
/// directory, not the working directory.
pub fn data_dir_of(path: &Path) -> Result<Option<std::path::PathBuf>, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.display().to_string(),
        source,
    })?;
    Config::parse_in(&text, &path.display().to_string(), path.parent())?;
    let file: ConfigFile = toml::from_str(&text).map_err(|e| ConfigError::Parse {
        path: path.display().to_string(),
        message: e.to_string(),
    })?;
    Ok(file.server.data_dir.map(|dir| match path.parent() {
        Some(base) if dir.is_relative() => base.join(dir),
        _ => dir,
    }))
}

/// Parses a duration flag such as `--wait 2s`.
pub fn parse_duration_flag(text: &str) -> Result<Millis, String> {
    parse_duration(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_refuse_what_keys_refuse() {
        assert_eq!(Pattern::parse("a/*"), Ok(Pattern::Prefix("a/".into())));
        assert_eq!(Pattern::parse("a/b"), Ok(Pattern::Exact("a/b".into())));
        for bad in ["", "a*b", "pay\u{202E}ments/*", "a\u{0}b", "x\u{2066}*"] {
            assert!(Pattern::parse(bad).is_err(), "{bad:?}");
        }
        let e = Config::parse("[[rule]]\nmatch = \"a\u{202E}b/*\"\n", "test").unwrap_err();
        assert!(e.to_string().contains("U+202E"), "{e}");
    }
}

//! The TOML config of SPEC section 9: ordered rules, a default rule and
//! server limits. Parsed into plain structs, then validated once into
//! [`Rules`] and [`Limits`]; every error names the rule and the field (Y2).

use std::num::NonZeroU64;
use std::path::Path;

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
    /// How long a key at rest is kept (K2).
    pub idle_after: Option<DurationSpec>,
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
    /// How long a key at rest is kept.
    pub idle_after: Millis,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_keys: 1_000_000,
            max_tickets: 1_000_000,
            max_waiters: 100_000,
            max_connections: 10_000,
            max_watch_streams: 256,
            max_event_streams: 64,
            idle_after: 600_000,
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
}

impl Config {
    /// Reads and validates a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Config::parse(&text, &path.display().to_string())
    }

    /// Parses and validates config text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Config, ConfigError> {
        let file: ConfigFile = toml::from_str(text).map_err(|e| {
            locate(text).unwrap_or_else(|| ConfigError::Parse {
                path: origin.to_owned(),
                message: e.to_string().trim().replace('\n', " "),
            })
        })?;
        file.validate()
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
                    problem: "is not a part of the config: use [server], [[rule]] or [default]"
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
        Ok(Config {
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
                idle_after,
            },
        })
    }
}

/// Parses a duration flag such as `--wait 2s`.
pub fn parse_duration_flag(text: &str) -> Result<Millis, String> {
    parse_duration(text)
}

//! Envoy's rate-limit service (RLS v3) mapped onto fusebox keys: the
//! `[rls]` part of the config as written ([`RlsSpec`]), validated once into
//! [`Rls`], which turns a request's descriptors into keys and the rules
//! that give those keys their policies (see docs/contract-extensions.md,
//! rules RL1–RL15).
//!
//! A domain holds a tree of descriptors in the style of envoyproxy/
//! ratelimit: each node matches one entry by its key and, optionally, its
//! value (absent: any value, each distinct value its own counter). A node
//! with a `rate_limit` becomes one rule: its key pattern is exact when
//! every node on its path names a value, else a prefix that the values of
//! the any-value nodes complete.

use std::collections::BTreeMap;
use std::num::NonZeroU32;

use serde::Deserialize;

use crate::config::ConfigError;
use crate::domain::policy::LimiterSpec;
use crate::domain::{DurationSpec, Millis, PolicySpec};
use crate::engine::{Pattern, Rule};

/// `[rls] max_descriptors` by default: descriptors in one request.
pub const MAX_DESCRIPTORS: u32 = 16;
/// The most `[rls] max_descriptors` may be: the Redis module charges at
/// most 64 keys in one `FB.CHARGE` (`MAX_CHARGE_KEYS` in
/// redis/src/commands/charges.rs), and every mode keeps the same bound.
pub const MOST_DESCRIPTORS: u32 = 64;
/// `[rls] max_entries` by default: entries in one descriptor, and the
/// deepest a config's descriptor tree may go.
pub const MAX_ENTRIES: u32 = 8;
/// `[rls] max_value_bytes` by default: the longest entry key or value.
pub const MAX_VALUE_BYTES: u32 = 128;
/// `[rls] max_nodes` by default: descriptor nodes in the whole config.
pub const MAX_NODES: u32 = 10_000;

/// `[rls]` as written.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RlsSpec {
    /// Cap on descriptors per request.
    pub max_descriptors: Option<u32>,
    /// Cap on entries per descriptor (and on the config's depth).
    pub max_entries: Option<u32>,
    /// Cap on an entry's key or value, in bytes.
    pub max_value_bytes: Option<u32>,
    /// Cap on descriptor nodes in the config.
    pub max_nodes: Option<u32>,
    /// What a descriptor whose key cannot be made (a cap, a share) answers:
    /// `over_limit` (default) or `ok` (uncharged); RL18.
    pub no_room: Option<String>,
    /// The domains.
    #[serde(default)]
    pub domain: Vec<DomainSpec>,
}

/// One `[[rls.domain]]` as written.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DomainSpec {
    /// The domain's name, as Envoy sends it.
    pub name: String,
    /// Its descriptors.
    #[serde(default)]
    pub descriptor: Vec<DescriptorSpec>,
}

/// One descriptor node as written.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DescriptorSpec {
    /// The entry's key.
    pub key: String,
    /// The entry's value; absent: any value.
    pub value: Option<String>,
    /// The limit of a descriptor that ends here.
    pub rate_limit: Option<RateLimitSpec>,
    /// Answers OK without charging.
    #[serde(default)]
    pub unlimited: bool,
    /// Reports the would-be status, but never makes the request over limit.
    #[serde(default)]
    pub shadow_mode: bool,
    /// Refused with the reason (the protocol has no Complete).
    pub breaker: Option<toml::Value>,
    /// The most keys a limited node that takes any value on its path may
    /// count for one credential (RL20); absent: a part of its key share.
    pub max_keys: Option<u64>,
    /// Deeper nodes.
    #[serde(default)]
    pub descriptor: Vec<DescriptorSpec>,
}

/// A `rate_limit` as written.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitSpec {
    /// `second`, `minute`, `hour` or `day`.
    pub unit: String,
    /// Requests per unit.
    pub requests_per_unit: u32,
    /// `fixed_window` (default), `sliding_window` or `token_bucket`.
    pub algorithm: Option<String>,
    /// Token bucket: the most tokens (default `requests_per_unit`).
    pub burst: Option<u32>,
}

/// The protocol's units this config accepts, with their length in ms and
/// their number in `RateLimitResponse.RateLimit.Unit`.
const UNITS: [(&str, Millis, i32); 4] = [
    ("second", 1_000, 1),
    ("minute", 60_000, 2),
    ("hour", 3_600_000, 3),
    ("day", 86_400_000, 4),
];

/// A validated limit of a descriptor node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limit {
    /// Requests per unit.
    pub requests_per_unit: u32,
    /// The unit's number in the protocol's `RateLimit.Unit`.
    pub unit: i32,
    /// The unit's name.
    pub unit_name: &'static str,
    /// The algorithm, as written (`fixed_window` when left out).
    pub algorithm: String,
    /// Token bucket: the most tokens, when set.
    pub burst: Option<u32>,
}

impl Limit {
    /// How long after a charge its key is back at rest at most (its
    /// limiter full again, K2): a fixed window's unit, a sliding window's
    /// two, a token bucket's units to refill its burst, and one more.
    pub fn rests_within(&self) -> Millis {
        let unit = OVERRIDE_UNITS
            .iter()
            .find(|u| u.2 == self.unit)
            .map_or(1_000, |u| u.1);
        match self.algorithm.as_str() {
            "fixed_window" => unit,
            "sliding_window" => unit.saturating_mul(2),
            _ => {
                let n = self.requests_per_unit.max(1);
                let burst = self.burst.unwrap_or(n).max(n);
                unit.saturating_mul(Millis::from(burst.div_ceil(n)) + 1)
            }
        }
    }
}

/// The units a descriptor's `limit` override may name: Envoy's
/// `envoy.type.v3.RateLimitUnit` numbers, with their length in ms (a
/// month is 30 days, a year 365), the `RateLimit.Unit` number reported
/// back, and a name for the key.
const OVERRIDE_UNITS: [(i32, Millis, i32, &str); 6] = [
    (1, 1_000, 1, "second"),
    (2, 60_000, 2, "minute"),
    (3, 3_600_000, 3, "hour"),
    (4, 86_400_000, 4, "day"),
    (5, 30 * 86_400_000, 5, "month"),
    (6, 365 * 86_400_000, 6, "year"),
];

/// The length of the protocol's `RateLimit.Unit` number `unit`, in whole
/// seconds (at least 1).
pub fn unit_seconds(unit: i32) -> i64 {
    OVERRIDE_UNITS
        .iter()
        .find(|u| u.2 == unit)
        .map_or(1, |u| (u.1 / 1000) as i64)
}

/// A descriptor's `limit` override made into the key and policy it is
/// charged under (RL15): the matched key with `/~N/unit` after it (its own
/// counter), and the node's algorithm with the override's figures. Err is
/// the problem with the override, for INVALID_ARGUMENT.
pub fn overridden(
    matched_key: &str,
    limit: &Limit,
    requests_per_unit: u32,
    unit: i32,
) -> Result<(String, Limit, crate::domain::Policy), String> {
    let Some(&(_, ms, reported, name)) = OVERRIDE_UNITS.iter().find(|u| u.0 == unit) else {
        return Err(format!(
            "unit: {unit} is not a unit fusebox can count in (SECOND, MINUTE, HOUR, DAY, MONTH or YEAR)"
        ));
    };
    let n = NonZeroU32::new(requests_per_unit)
        .ok_or_else(|| "requests_per_unit: must be at least 1".to_owned())?;
    let burst = limit.burst.map(|b| b.max(n.get()));
    let policy =
        policy_of(&limit.algorithm, n, ms, burst).map_err(|e| format!("requests_per_unit: {e}"))?;
    Ok((
        format!("{matched_key}/~{n}/{name}"),
        Limit {
            requests_per_unit: n.get(),
            unit: reported,
            unit_name: name,
            algorithm: limit.algorithm.clone(),
            burst,
        },
        policy,
    ))
}

/// The policy of `algorithm` for `n` per `ms`.
fn policy_of(
    algorithm: &str,
    n: NonZeroU32,
    ms: Millis,
    burst: Option<u32>,
) -> Result<crate::domain::Policy, String> {
    let window = Some(DurationSpec(ms));
    let limiter = match algorithm {
        "fixed_window" => LimiterSpec {
            kind: "fixed_window".into(),
            permits: Some(n.get()),
            window,
            ..empty_limiter()
        },
        "sliding_window" => LimiterSpec {
            kind: "sliding_window".into(),
            permits: Some(n.get()),
            window,
            segments: Some(10),
            ..empty_limiter()
        },
        "token_bucket" => LimiterSpec {
            kind: "token_bucket".into(),
            capacity: Some(burst.unwrap_or(n.get())),
            refill: Some(n.get()),
            period: window,
            ..empty_limiter()
        },
        other => return Err(format!("{other:?} is not an algorithm")),
    };
    PolicySpec {
        breaker: None,
        limiter: Some(limiter),
        ..PolicySpec::default()
    }
    .validate()
    .map_err(|e| format!("{}: {}", e.field, e.problem))
}

/// The budget of keys of a limited node that takes any value on its
/// path, so makes a key per value (RL20).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Budget {
    /// The node, named by its keys' pattern (`rls/{DOMAIN}/.../=*`), the
    /// same across reloads while the node stays.
    pub node: std::sync::Arc<str>,
    /// Its `max_keys`; absent: [`Rls::budget_part`] of the key share.
    pub max_keys: Option<u64>,
}

/// What a matched node does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Charge the key under this limit (its rule gives the policy).
    Limit {
        /// The limit, for `current_limit`.
        limit: Limit,
        /// Report, but never refuse.
        shadow: bool,
        /// Its budget of keys, when it makes a key per value (RL20).
        budget: Option<Budget>,
    },
    /// OK, nothing charged.
    Unlimited,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Node {
    any_value: BTreeMap<String, Node>,
    by_value: BTreeMap<(String, String), Node>,
    action: Option<Action>,
}

impl Node {
    fn empty() -> Node {
        Node {
            any_value: BTreeMap::new(),
            by_value: BTreeMap::new(),
            action: None,
        }
    }
}

/// The validated `[rls]`: domains and caps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rls {
    domains: BTreeMap<String, Node>,
    /// Cap on descriptors per request.
    pub max_descriptors: u32,
    /// Cap on entries per descriptor.
    pub max_entries: u32,
    /// Cap on an entry's key or value, in bytes.
    pub max_value_bytes: u32,
    /// What a descriptor whose key cannot be made answers (RL18).
    pub no_room: NoRoom,
    /// Limited nodes that take any value on their path (RL20).
    pub any_value_nodes: u32,
}

/// What a descriptor whose key cannot be made (the key cap, the
/// credential's share) answers (RL18).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NoRoom {
    /// `OVER_LIMIT`: the limit stays a limit; nothing of the request is
    /// charged (RL6).
    #[default]
    OverLimit,
    /// `OK`, uncharged: the request's other descriptors still decide.
    Ok,
}

impl Default for Rls {
    fn default() -> Self {
        Rls {
            domains: BTreeMap::new(),
            max_descriptors: MAX_DESCRIPTORS,
            max_entries: MAX_ENTRIES,
            max_value_bytes: MAX_VALUE_BYTES,
            no_room: NoRoom::OverLimit,
            any_value_nodes: 0,
        }
    }
}

/// One descriptor's match: the key to charge and what to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Matched {
    /// The fusebox key.
    pub key: String,
    /// What the node says.
    pub action: Action,
    /// True when the key holds the values' digest (RL17).
    pub digested: bool,
}

/// Escapes what would make a key ambiguous: the separators `/` and `=`,
/// `%` itself, `*` (a prefix pattern's end), the hash tag's braces, `~`
/// (a digested value's mark, RL17), and anything that is not printable
/// ASCII.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_graphic() && !b"/=%*{},~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The longest key a descriptor maps to before a limit override's
/// `/~N/UNIT` (RL15, at most 19 bytes) is added: a fusebox key is at most
/// 256 bytes (K1).
pub const MAX_RLS_KEY: usize = 232;

/// Bytes of a digested values part's readable prefix, at most (RL17).
const DIGEST_PREFIX: usize = 32;

/// Bytes of a digested values part besides its prefix: `~` and 32 hex
/// digits (128 bits of SHA-256).
const DIGEST_LEN: usize = 33;

/// The path part of a descriptor's key: `rls/{domain}/` and one segment
/// per entry, `key=value` where the config names the value and `key`
/// where it takes any; then, when some level takes any value, `/=`. The
/// domain is the Redis hash tag, so that one request's keys live on one
/// primary.
fn path_of(domain: &str, path: &[(&str, Option<&str>)]) -> String {
    let mut key = format!("rls/{{{}}}", escape(domain));
    for (k, v) in path {
        key.push('/');
        key.push_str(&escape(k));
        if let Some(v) = v {
            key.push('=');
            key.push_str(&escape(v));
        }
    }
    if path.iter().any(|(_, v)| v.is_none()) {
        key.push_str("/=");
    }
    key
}

/// The key of a descriptor (RL1, RL17): its path ([`path_of`]) and the
/// values its any-value nodes took, escaped and comma-separated. When a
/// value is longer than `max_value` bytes, or the key would be longer than
/// [`MAX_RLS_KEY`], the values are written as a readable prefix of their
/// escaped text, `~`, and 32 hex digits of SHA-256 over them (each value's
/// length, then its bytes): a bounded key that no other values share and
/// no end user can make too long. The second value says whether it was
/// digested.
fn key_of(
    domain: &str,
    path: &[(&str, Option<&str>)],
    values: &[&str],
    max_value: usize,
) -> (String, bool) {
    let mut key = path_of(domain, path);
    if values.is_empty() {
        return (key, false);
    }
    let escaped: Vec<String> = values.iter().map(|v| escape(v)).collect();
    let joined = escaped.join(",");
    let long = values.iter().any(|v| v.len() > max_value);
    if !long && key.len() + joined.len() <= MAX_RLS_KEY {
        key.push_str(&joined);
        return (key, false);
    }
    use sha2::{Digest, Sha256};
    let mut hash = Sha256::new();
    for v in values {
        hash.update((v.len() as u64).to_be_bytes());
        hash.update(v.as_bytes());
    }
    let digest = hash.finalize();
    // As much of the text as fits, never half an escape (`%XX`).
    let room = MAX_RLS_KEY
        .saturating_sub(key.len() + DIGEST_LEN)
        .min(DIGEST_PREFIX);
    let mut cut = room.min(joined.len());
    while cut > 0 && joined.as_bytes()[cut.saturating_sub(2)..cut].contains(&b'%') {
        cut -= 1;
    }
    key.push_str(&joined[..cut]);
    key.push('~');
    for byte in &digest[..16] {
        key.push_str(&format!("{byte:02x}"));
    }
    (key, true)
}

impl Rls {
    /// True when no domain is configured.
    pub fn is_empty(&self) -> bool {
        self.domains.is_empty()
    }

    /// The part of a credential's key share (of `max_keys` without
    /// credentials) that a node without `max_keys` may count (RL20):
    /// one over the limited nodes that take any value, at most a half, as
    /// the tenants' default share (decisions 140).
    pub fn budget_part(&self) -> f64 {
        (1.0 / f64::from(self.any_value_nodes.max(1))).min(0.5)
    }

    /// The node that `entries` lead to in `domain`, with the key to charge:
    /// `None` for an unknown domain, a path the config does not have, or a
    /// node with neither a limit nor `unlimited` (RL4).
    pub fn lookup(&self, domain: &str, entries: &[(&str, &str)]) -> Option<Matched> {
        let mut node = self.domains.get(domain)?;
        let mut path = Vec::with_capacity(entries.len());
        let mut values = Vec::new();
        for &(k, v) in entries {
            if let Some(next) = node.by_value.get(&(k.to_owned(), v.to_owned())) {
                path.push((k, Some(v)));
                node = next;
            } else if let Some(next) = node.any_value.get(k) {
                path.push((k, None));
                values.push(v);
                node = next;
            } else {
                return None;
            }
        }
        let action = node.action.clone()?;
        let (key, digested) = key_of(domain, &path, &values, self.max_value_bytes as usize);
        Some(Matched {
            key,
            action,
            digested,
        })
    }
}

impl RlsSpec {
    /// Validates `[rls]` into the mapping and the rules its limits need
    /// (placed before the config's own rules).
    pub fn validate(&self) -> Result<(Rls, Vec<Rule>), ConfigError> {
        let cap = |v: Option<u32>, field: &str, default: u32| match v {
            Some(0) => Err(invalid("[rls]", field, "must be at least 1")),
            Some(v) => Ok(v),
            None => Ok(default),
        };
        let mut rls = Rls {
            domains: BTreeMap::new(),
            max_descriptors: match cap(self.max_descriptors, "max_descriptors", MAX_DESCRIPTORS)? {
                n if n > MOST_DESCRIPTORS => {
                    return Err(invalid(
                        "[rls]",
                        "max_descriptors",
                        format!(
                            "is {n}, more than {MOST_DESCRIPTORS}: one request's descriptors are \
                             charged in one Redis command of at most {MOST_DESCRIPTORS} keys; \
                             write {MOST_DESCRIPTORS} or less"
                        ),
                    ))
                }
                n => n,
            },
            max_entries: cap(self.max_entries, "max_entries", MAX_ENTRIES)?,
            max_value_bytes: cap(self.max_value_bytes, "max_value_bytes", MAX_VALUE_BYTES)?,
            no_room: match self.no_room.as_deref() {
                None | Some("over_limit") => NoRoom::OverLimit,
                Some("ok") => NoRoom::Ok,
                Some(other) => {
                    return Err(invalid(
                        "[rls]",
                        "no_room",
                        format!("{other:?} is not an answer: use \"over_limit\" or \"ok\""),
                    ))
                }
            },
            any_value_nodes: 0,
        };
        let max_nodes = cap(self.max_nodes, "max_nodes", MAX_NODES)?;
        let mut any_value_nodes = 0u32;
        let mut rules = Vec::new();
        let mut nodes = 0u32;
        for (i, d) in self.domain.iter().enumerate() {
            let name = format!("rls.domain {} ({:?})", i + 1, d.name);
            if d.name.is_empty() || d.name.len() > rls.max_value_bytes as usize {
                return Err(invalid(
                    &name,
                    "name",
                    format!(
                        "must be 1 to {} bytes (max_value_bytes)",
                        rls.max_value_bytes
                    ),
                ));
            }
            if rls.domains.contains_key(&d.name) {
                return Err(invalid(
                    &name,
                    "name",
                    "names a domain already configured above: merge the two",
                ));
            }
            let mut root = Node::empty();
            let mut walk = Walk {
                domain: &d.name,
                rule: &name,
                rls: &rls,
                rules: &mut rules,
                nodes: &mut nodes,
                max_nodes,
                any_value_nodes: &mut any_value_nodes,
            };
            for (j, spec) in d.descriptor.iter().enumerate() {
                walk.add(
                    &mut root,
                    spec,
                    &format!("descriptor[{j}]"),
                    &mut Vec::new(),
                )?;
            }
            rls.domains.insert(d.name.clone(), root);
        }
        // The most specific first: exact keys, then longer prefixes.
        rules.sort_by_key(|r: &Rule| {
            let text = r.pattern.text();
            (text.ends_with('*'), std::cmp::Reverse(text.len()))
        });
        rls.any_value_nodes = any_value_nodes;
        Ok((rls, rules))
    }
}

struct Walk<'a> {
    domain: &'a str,
    rule: &'a str,
    rls: &'a Rls,
    rules: &'a mut Vec<Rule>,
    nodes: &'a mut u32,
    max_nodes: u32,
    any_value_nodes: &'a mut u32,
}

impl Walk<'_> {
    fn add(
        &mut self,
        parent: &mut Node,
        spec: &DescriptorSpec,
        at: &str,
        path: &mut Vec<(String, Option<String>)>,
    ) -> Result<(), ConfigError> {
        let bad =
            |field: &str, problem: String| invalid(self.rule, &format!("{at}.{field}"), problem);
        *self.nodes += 1;
        if *self.nodes > self.max_nodes {
            return Err(invalid(
                "[rls]",
                "max_nodes",
                format!(
                    "is {}, and the config has more descriptor nodes: raise it or merge descriptors",
                    self.max_nodes
                ),
            ));
        }
        if path.len() + 1 > self.rls.max_entries as usize {
            return Err(bad(
                "descriptor",
                format!(
                    "goes deeper than max_entries ({}): a request's descriptor could never reach it",
                    self.rls.max_entries
                ),
            ));
        }
        let max = self.rls.max_value_bytes as usize;
        if spec.key.is_empty() || spec.key.len() > max {
            return Err(bad(
                "key",
                format!("must be 1 to {max} bytes (max_value_bytes)"),
            ));
        }
        if spec.value.as_ref().is_some_and(|v| v.len() > max) {
            return Err(bad(
                "value",
                format!("must be at most {max} bytes (max_value_bytes)"),
            ));
        }
        if spec.breaker.is_some() {
            return Err(bad(
                "breaker",
                "cannot be used here: the rate-limit protocol has no Complete, so a breaker would never hear how a call went; use a rate_limit".into(),
            ));
        }
        if spec.unlimited && spec.rate_limit.is_some() {
            return Err(bad(
                "unlimited",
                "cannot be set with rate_limit: choose one".into(),
            ));
        }
        path.push((spec.key.clone(), spec.value.clone()));
        let takes_any = path.iter().any(|(_, v)| v.is_none());
        if let Some(n) = spec.max_keys {
            if n == 0 {
                return Err(bad(
                    "max_keys",
                    "must be at least 1 (for no key at all, leave the descriptor out)".into(),
                ));
            }
            if spec.rate_limit.is_none() || !takes_any {
                return Err(bad(
                    "max_keys",
                    "is for a node with a rate_limit that takes any value on its path (a node without value, or below one): only such a node makes a key per value".into(),
                ));
            }
        }
        let action = match (&spec.rate_limit, spec.unlimited) {
            (_, true) => Some(Action::Unlimited),
            (Some(rl), false) => {
                let (limit, policy) = self.limit(rl, at)?;
                let parts: Vec<(&str, Option<&str>)> = path
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_deref()))
                    .collect();
                let exact = parts.iter().all(|(_, v)| v.is_some());
                let mut text = path_of(self.domain, &parts);
                if !exact {
                    // Room for at least a digest of the values (RL17).
                    if text.len() + DIGEST_LEN > MAX_RLS_KEY {
                        return Err(bad(
                            "key",
                            format!(
                                "makes keys that begin with {text:?} ({} bytes), which leaves no room for a value ({DIGEST_LEN} bytes within {MAX_RLS_KEY}): shorten the keys and values on this path",
                                text.len()
                            ),
                        ));
                    }
                    text.push('*');
                }
                let pattern = Pattern::parse(&text).map_err(|problem| {
                    bad(
                        "key",
                        format!("makes the key pattern {text:?}, which fusebox refuses: {problem}"),
                    )
                })?;
                self.rules.push(Rule { pattern, policy });
                if takes_any {
                    *self.any_value_nodes += 1;
                }
                Some(Action::Limit {
                    limit,
                    shadow: spec.shadow_mode,
                    budget: takes_any.then(|| Budget {
                        node: std::sync::Arc::from(text.as_str()),
                        max_keys: spec.max_keys,
                    }),
                })
            }
            (None, false) => None,
        };
        let mut node = Node::empty();
        node.action = action;
        for (j, child) in spec.descriptor.iter().enumerate() {
            self.add(&mut node, child, &format!("{at}.descriptor[{j}]"), path)?;
        }
        path.pop();
        let taken = match &spec.value {
            Some(v) => parent
                .by_value
                .insert((spec.key.clone(), v.clone()), node)
                .is_some(),
            None => parent.any_value.insert(spec.key.clone(), node).is_some(),
        };
        if taken {
            return Err(bad(
                "key",
                "repeats a descriptor of the same level with the same key and value: merge the two"
                    .into(),
            ));
        }
        Ok(())
    }

    fn limit(
        &self,
        rl: &RateLimitSpec,
        at: &str,
    ) -> Result<(Limit, crate::domain::Policy), ConfigError> {
        let field = |f: &str| format!("{at}.rate_limit.{f}");
        let Some(&(unit_name, ms, unit)) = UNITS.iter().find(|(n, _, _)| *n == rl.unit) else {
            return Err(invalid(
                self.rule,
                &field("unit"),
                format!(
                    "{:?} is not a unit: use second, minute, hour or day",
                    rl.unit
                ),
            ));
        };
        let n = NonZeroU32::new(rl.requests_per_unit).ok_or_else(|| {
            invalid(
                self.rule,
                &field("requests_per_unit"),
                "must be at least 1 (for none at all, use a limit of 1 and a long unit, or leave the descriptor out)",
            )
        })?;
        let algorithm = rl.algorithm.as_deref().unwrap_or("fixed_window");
        if rl.burst.is_some() && algorithm != "token_bucket" {
            return Err(invalid(
                self.rule,
                &field("burst"),
                "is only for algorithm = \"token_bucket\"",
            ));
        }
        match algorithm {
            "fixed_window" | "sliding_window" | "token_bucket" => {}
            "concurrency" => {
                return Err(invalid(
                    self.rule,
                    &field("algorithm"),
                    "cannot be concurrency: the rate-limit protocol has no Complete, so its permits would never come back; use fixed_window, sliding_window or token_bucket",
                ))
            }
            other => {
                return Err(invalid(
                    self.rule,
                    &field("algorithm"),
                    format!("{other:?} is not an algorithm: use fixed_window, sliding_window or token_bucket"),
                ))
            }
        }
        let policy = policy_of(algorithm, n, ms, rl.burst)
            .map_err(|problem| invalid(self.rule, &format!("{at}.rate_limit"), problem))?;
        Ok((
            Limit {
                requests_per_unit: n.get(),
                unit,
                unit_name,
                algorithm: algorithm.to_owned(),
                burst: rl.burst,
            },
            policy,
        ))
    }
}

fn empty_limiter() -> LimiterSpec {
    LimiterSpec {
        kind: String::new(),
        permits: None,
        capacity: None,
        refill: None,
        period: None,
        window: None,
        segments: None,
        min: None,
        max: None,
        initial: None,
        queue_limit: None,
        order: None,
    }
}

fn invalid(rule: &str, field: &str, problem: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        rule: rule.to_owned(),
        field: field.to_owned(),
        problem: problem.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rls(text: &str) -> (Rls, Vec<Rule>) {
        let spec: RlsSpec = toml::from_str(text).expect("toml");
        spec.validate().expect("valid")
    }

    #[test]
    fn descriptors_map_to_keys_whose_rules_give_their_policies() {
        let (rls, rules) = rls(r#"
            [[domain]]
            name = "edge"
            [[domain.descriptor]]
            key = "remote_address"
            rate_limit = { unit = "second", requests_per_unit = 10 }
            [[domain.descriptor]]
            key = "path"
            value = "/api"
            rate_limit = { unit = "minute", requests_per_unit = 5, algorithm = "token_bucket", burst = 7 }
              [[domain.descriptor.descriptor]]
              key = "user"
              rate_limit = { unit = "hour", requests_per_unit = 3, algorithm = "sliding_window" }
            [[domain.descriptor]]
            key = "health"
            unlimited = true
        "#);
        let m = rls
            .lookup("edge", &[("remote_address", "10.0.0.1")])
            .expect("match");
        assert_eq!(m.key, "rls/{edge}/remote_address/=10.0.0.1");
        let m = rls.lookup("edge", &[("path", "/api")]).expect("match");
        assert_eq!(m.key, "rls/{edge}/path=%2Fapi");
        let m = rls
            .lookup("edge", &[("path", "/api"), ("user", "a/b=c")])
            .expect("match");
        assert_eq!(m.key, "rls/{edge}/path=%2Fapi/user/=a%2Fb%3Dc");
        assert_eq!(
            rls.lookup("edge", &[("health", "x")]).map(|m| m.action),
            Some(Action::Unlimited)
        );
        assert!(rls.lookup("edge", &[("path", "/other")]).is_none());
        assert!(rls.lookup("other", &[("path", "/api")]).is_none());
        let texts: Vec<String> = rules.iter().map(|r| r.pattern.text()).collect();
        assert_eq!(
            texts,
            [
                "rls/{edge}/path=%2Fapi",
                "rls/{edge}/path=%2Fapi/user/=*",
                "rls/{edge}/remote_address/=*"
            ]
        );
    }

    /// RL17: no value an end user sends makes a key that cannot be made:
    /// over-long or escape-heavy values map to a bounded key of their own.
    #[test]
    fn any_value_maps_to_a_bounded_key_of_its_own() {
        let (rls, _) = rls(r#"
            [[domain]]
            name = "edge"
            [[domain.descriptor]]
            key = "user"
            rate_limit = { unit = "second", requests_per_unit = 10 }
        "#);
        let key = |v: &str| rls.lookup("edge", &[("user", v)]).expect("match");
        let short = key("alice");
        assert_eq!(
            (short.key.as_str(), short.digested),
            ("rls/{edge}/user/=alice", false)
        );
        let tilde = key("a~b");
        assert_eq!(tilde.key, "rls/{edge}/user/=a%7Eb", "~ is escaped");
        let mut seen = std::collections::HashSet::new();
        for v in [
            "x".repeat(129),
            "x".repeat(130),
            "/".repeat(80),
            "é".repeat(40),
            "%".repeat(300),
            format!("{}y", "x".repeat(5000)),
        ] {
            let m = key(&v);
            assert!(m.digested, "{v:?}");
            assert!(m.key.len() <= MAX_RLS_KEY, "{} bytes", m.key.len());
            assert!(m.key.starts_with("rls/{edge}/user/="), "{}", m.key);
            crate::domain::validate_key(&m.key).expect("a valid key");
            assert_eq!(key(&v).key, m.key, "the same value, the same key");
            assert!(seen.insert(m.key), "no two values share a key");
        }
        let cut = key(&"/".repeat(80)).key;
        assert!(
            cut.contains("=%2F%2F") && cut.split('~').next().unwrap().ends_with("%2F"),
            "{cut}"
        );
    }

    /// RL20: each limited node that takes any value on its path has a
    /// budget: its `max_keys`, else a part of the key share.
    #[test]
    fn nodes_that_take_any_value_have_a_budget_of_keys() {
        let (rls, _) = rls(r#"
            [[domain]]
            name = "edge"
            [[domain.descriptor]]
            key = "remote_address"
            rate_limit = { unit = "minute", requests_per_unit = 3 }
            [[domain.descriptor]]
            key = "path"
            value = "/api"
            rate_limit = { unit = "hour", requests_per_unit = 5 }
              [[domain.descriptor.descriptor]]
              key = "user"
              max_keys = 50
              rate_limit = { unit = "second", requests_per_unit = 3, algorithm = "token_bucket", burst = 7 }
        "#);
        assert_eq!(rls.any_value_nodes, 2);
        assert_eq!(rls.budget_part(), 0.5);
        let budget = |entries: &[(&str, &str)]| match rls.lookup("edge", entries) {
            Some(Matched {
                action: Action::Limit { budget, .. },
                ..
            }) => budget,
            other => panic!("{other:?}"),
        };
        let address = budget(&[("remote_address", "a")]).expect("a budget");
        assert_eq!(
            (&*address.node, address.max_keys),
            ("rls/{edge}/remote_address/=*", None)
        );
        assert_eq!(budget(&[("path", "/api")]), None, "one key, no budget");
        let user = budget(&[("path", "/api"), ("user", "u")]).expect("a budget");
        assert_eq!(user.max_keys, Some(50));
        let rests = |entries: &[(&str, &str)]| match rls.lookup("edge", entries) {
            Some(Matched {
                action: Action::Limit { limit, .. },
                ..
            }) => limit.rests_within(),
            other => panic!("{other:?}"),
        };
        assert_eq!(rests(&[("remote_address", "a")]), 60_000);
        // A burst of 7 at 3 a second refills in 3 seconds, and one more.
        assert_eq!(rests(&[("path", "/api"), ("user", "u")]), 4_000);
        let (many, _) = super::tests::rls("[[domain]]\nname = \"e\"\n[[domain.descriptor]]\nkey = \"a\"\nrate_limit = { unit = \"second\", requests_per_unit = 1 }\n[[domain.descriptor]]\nkey = \"b\"\nrate_limit = { unit = \"second\", requests_per_unit = 1 }\n[[domain.descriptor]]\nkey = \"c\"\nrate_limit = { unit = \"second\", requests_per_unit = 1 }\n");
        assert_eq!(many.budget_part(), 1.0 / 3.0);
    }

    #[test]
    fn a_descriptor_that_needs_a_complete_is_refused_with_the_reason() {
        for (text, field, words) in [
            (
                "[[domain]]\nname = \"e\"\n[[domain.descriptor]]\nkey = \"k\"\nrate_limit = { unit = \"second\", requests_per_unit = 1, algorithm = \"concurrency\" }\n",
                "descriptor[0].rate_limit.algorithm",
                "no Complete",
            ),
            (
                "[[domain]]\nname = \"e\"\n[[domain.descriptor]]\nkey = \"k\"\nbreaker = { mode = \"consecutive\" }\n",
                "descriptor[0].breaker",
                "no Complete",
            ),
            (
                "[[domain]]\nname = \"e\"\n[[domain.descriptor]]\nkey = \"k\"\nrate_limit = { unit = \"week\", requests_per_unit = 1 }\n",
                "descriptor[0].rate_limit.unit",
                "not a unit",
            ),
            (
                "[[domain]]\nname = \"e\"\n[[domain.descriptor]]\nkey = \"k\"\nvalue = \"v\"\nmax_keys = 5\nrate_limit = { unit = \"second\", requests_per_unit = 1 }\n",
                "descriptor[0].max_keys",
                "any value",
            ),
            (
                "[[domain]]\nname = \"e\"\n[[domain.descriptor]]\nkey = \"k\"\nmax_keys = 0\nrate_limit = { unit = \"second\", requests_per_unit = 1 }\n",
                "descriptor[0].max_keys",
                "at least 1",
            ),
            (
                "max_descriptors = 65\n",
                "max_descriptors",
                "write 64 or less",
            ),
        ] {
            let spec: RlsSpec = toml::from_str(text).expect("toml");
            let Err(ConfigError::Invalid { field: f, problem, .. }) = spec.validate() else {
                panic!("{text}: not refused");
            };
            assert_eq!(f, field, "{problem}");
            assert!(problem.contains(words), "{problem}");
        }
    }
}

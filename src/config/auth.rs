//! `[auth]`: tokens (by their SHA-256, or an environment variable that
//! holds one), a token file, and client-certificate names, each with a role,
//! the keys it may touch and what it may hold. Validated into
//! [`Access`]; the token file and the environment are read here, once per
//! load.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;

use crate::auth::{hash, Access, Grant, Role, Scope};
use crate::engine::shares::{Allowance, DEFAULT_SHARE};
use crate::engine::Pattern;

/// One `[[auth.token]]` (or `[[token]]` of the token file) as written.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenSpec {
    /// Who holds the token, for logs and for the record of an isolate.
    pub name: String,
    /// What it may do.
    pub role: Role,
    /// The keys it may touch; omitted means every key.
    pub prefixes: Option<Vec<String>>,
    /// Whose share it holds: entries of one tenant share one (decisions
    /// 140); omitted, the entries with the same `prefixes` are one tenant,
    /// and an entry over every key is its own.
    pub tenant: Option<String>,
    /// The token's SHA-256, as 64 hex digits (`fusebox token` prints it).
    pub sha256: Option<String>,
    /// Or: the environment variable that holds the token itself, read once
    /// when the config is loaded (for containers).
    pub env: Option<String>,
    /// What it may hold at once, past the default share (decisions 99).
    #[serde(default)]
    pub limits: Allowance,
}

/// One `[[auth.client]]`: a client certificate's name (its subject CN or a
/// DNS or URI subject-alternative name) standing for a role (mTLS).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientSpec {
    /// The certificate name.
    pub name: String,
    /// What it may do.
    pub role: Role,
    /// The keys it may touch; omitted means every key.
    pub prefixes: Option<Vec<String>>,
    /// Whose share it holds (as a token's `tenant`).
    pub tenant: Option<String>,
    /// What it may hold at once, past the default share (decisions 99).
    #[serde(default)]
    pub limits: Allowance,
}

/// The tenant whose share an entry holds, before [`name_tenants`]: its
/// `tenant`, else its `prefixes` (sorted, marked so that no name is the
/// same), else its name.
fn tenant_of(name: &str, tenant: &Option<String>, prefixes: &Option<Vec<String>>) -> String {
    match (tenant, prefixes) {
        (Some(tenant), _) => tenant.clone(),
        (None, Some(prefixes)) => {
            let mut sorted = prefixes.clone();
            sorted.sort();
            sorted.dedup();
            format!("\0{}", sorted.join("\0"))
        }
        (None, None) => name.to_owned(),
    }
}

/// Names the tenants of entries that share their `prefixes` without a
/// `tenant` (decisions 140) after the first such entry, in the config's
/// order: its share reads as that credential's.
fn name_tenants(grants: &mut [&mut Arc<Grant>]) {
    let mut first: std::collections::HashMap<String, String> = std::collections::HashMap::new();
    for grant in grants.iter_mut() {
        if grant.tenant.starts_with('\0') {
            let name = first
                .entry(grant.tenant.clone())
                .or_insert_with(|| grant.name.clone())
                .clone();
            Arc::make_mut(grant).tenant = name;
        }
    }
}

/// `[auth]` as written.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthSpec {
    /// Tokens.
    #[serde(default)]
    pub token: Vec<TokenSpec>,
    /// Client-certificate names (with `[tls] client_ca`).
    #[serde(default)]
    pub client: Vec<ClientSpec>,
    /// A TOML file of more `[[token]]` entries, reloaded with the config;
    /// relative to the config file's directory.
    pub token_file: Option<String>,
    /// Whether `/metrics` needs a token: `"open"` (the default) or `"token"`.
    pub metrics: Option<String>,
    /// Whether a client certificate's subject common name counts as one of
    /// its names (after its DNS and URI names). Off by default: names come
    /// from the subject alternative names, which CAs check.
    pub client_common_name: Option<bool>,
    /// When a certificate's names match different `[[auth.client]]`
    /// entries: `"refuse"` (the default) or `"first"` (the entry of the
    /// first matching name, in the certificate's order).
    pub client_ambiguous: Option<String>,
    /// The part of each `[server]` cap one credential may hold unless its
    /// entry's `limits` say otherwise, in (0, 1]; 0.5 by default.
    pub share: Option<f64>,
}

/// The token file as written.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenFile {
    #[serde(default)]
    token: Vec<TokenSpec>,
}

/// An invalid `[auth]`: which entry, which field, what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthError {
    /// `[auth]`, `auth.token 2 ("checkout")`, `token file tokens.toml: token 1 (...)`.
    pub entry: String,
    /// The field.
    pub field: String,
    /// What is wrong and what to do.
    pub problem: String,
}

fn scope_of(prefixes: &Option<Vec<String>>, entry: &str) -> Result<Scope, AuthError> {
    let Some(prefixes) = prefixes else {
        return Ok(Scope::all());
    };
    if prefixes.is_empty() {
        return Err(AuthError {
            entry: entry.to_owned(),
            field: "prefixes".into(),
            problem: "is empty, so the credential could touch no key; omit it for every key, or list patterns such as \"checkout/*\"".into(),
        });
    }
    prefixes
        .iter()
        .map(|p| {
            Pattern::parse(p).map_err(|problem| AuthError {
                entry: entry.to_owned(),
                field: "prefixes".into(),
                problem,
            })
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Scope)
}

fn checked_name(name: &str, entry: &str) -> Result<(), AuthError> {
    if name.is_empty() || name.len() > 128 || name.chars().any(char::is_control) {
        return Err(AuthError {
            entry: entry.to_owned(),
            field: "name".into(),
            problem: "must be 1 to 128 characters without control characters".into(),
        });
    }
    Ok(())
}

/// An entry's `limits` that no stream could live with: a credential whose
/// part of the unread stream answers is 0 could answer nothing.
fn checked_limits(limits: &Allowance, entry: &str) -> Result<(), AuthError> {
    if limits.max_unread_bytes == Some(0) {
        return Err(AuthError {
            entry: entry.to_owned(),
            field: "limits.max_unread_bytes".into(),
            problem: "is 0, so the credential's streams could answer nothing: it is the most bytes of its stream answers its clients may leave unread, at least 1 (leave it out for its part of [server] max_unread_bytes)".into(),
        });
    }
    Ok(())
}

/// A setting of `[auth]` that is one of two words (`words`, the default
/// first): whether it is the second.
fn either(value: Option<&str>, field: &str, words: (&str, &str)) -> Result<bool, AuthError> {
    match value {
        None => Ok(false),
        Some(v) if v == words.0 => Ok(false),
        Some(v) if v == words.1 => Ok(true),
        Some(other) => Err(AuthError {
            entry: "[auth]".into(),
            field: field.into(),
            problem: format!("{other:?} is not {:?} or {:?}", words.0, words.1),
        }),
    }
}

impl AuthSpec {
    /// Validates `[auth]`; `dir` is the config file's directory, against
    /// which a relative `token_file` resolves. Reads the token file and the
    /// environment variables that `env` names.
    pub fn validate(&self, dir: Option<&Path>) -> Result<Access, AuthError> {
        let metrics_open = !either(self.metrics.as_deref(), "metrics", ("open", "token"))?;
        let mut tokens = Vec::new();
        for (i, spec) in self.token.iter().enumerate() {
            let entry = format!("auth.token {} ({:?})", i + 1, spec.name);
            tokens.push(token_of(spec, &entry)?);
        }
        let token_file = self.token_file.as_ref().map(|f| match dir {
            Some(dir) => dir.join(f),
            None => PathBuf::from(f),
        });
        if let Some(path) = &token_file {
            let shown = path.display().to_string();
            let text = std::fs::read_to_string(path).map_err(|e| AuthError {
                entry: "[auth]".into(),
                field: "token_file".into(),
                problem: format!("cannot read {shown}: {e}"),
            })?;
            let file: TokenFile = toml::from_str(&text).map_err(|e| AuthError {
                entry: format!("token file {shown}"),
                field: "(the file)".into(),
                problem: e.to_string().trim().replace('\n', " "),
            })?;
            for (i, spec) in file.token.iter().enumerate() {
                let entry = format!("token file {shown}: token {} ({:?})", i + 1, spec.name);
                tokens.push(token_of(spec, &entry)?);
            }
        }
        let mut clients = Vec::new();
        for (i, spec) in self.client.iter().enumerate() {
            let entry = format!("auth.client {} ({:?})", i + 1, spec.name);
            checked_name(&spec.name, &entry)?;
            checked_limits(&spec.limits, &entry)?;
            clients.push((
                spec.name.clone(),
                Arc::new(Grant {
                    name: spec.name.clone(),
                    tenant: tenant_of(&spec.name, &spec.tenant, &spec.prefixes),
                    role: spec.role,
                    scope: scope_of(&spec.prefixes, &entry)?,
                    allowance: spec.limits,
                }),
            ));
        }
        if tokens.is_empty() && clients.is_empty() {
            return Err(AuthError {
                entry: "[auth]".into(),
                field: "token".into(),
                problem: "no credentials: add a [[auth.token]] (`fusebox token` makes one), a token_file, or an [[auth.client]]".into(),
            });
        }
        for (i, (hash, _)) in tokens.iter().enumerate() {
            if tokens[..i].iter().any(|(h, _)| h == hash) {
                return Err(AuthError {
                    entry: format!("token {:?}", tokens[i].1.name),
                    field: "sha256".into(),
                    problem:
                        "is the same token as an earlier entry; each token must stand for one grant"
                            .into(),
                });
            }
        }
        let client_first = either(
            self.client_ambiguous.as_deref(),
            "client_ambiguous",
            ("refuse", "first"),
        )?;
        {
            let mut all: Vec<&mut Arc<Grant>> = tokens
                .iter_mut()
                .map(|(_, g)| g)
                .chain(clients.iter_mut().map(|(_, g)| g))
                .collect();
            name_tenants(&mut all);
        }
        // By default each tenant may hold an equal part of each cap, and
        // never more than half: every other tenant keeps its room.
        let tenants: std::collections::HashSet<&str> = tokens
            .iter()
            .map(|(_, g)| g.tenant.as_str())
            .chain(clients.iter().map(|(_, g)| g.tenant.as_str()))
            .collect();
        let share = match self.share {
            None => DEFAULT_SHARE.min(1.0 / tenants.len().max(1) as f64),
            Some(share) if share > 0.0 && share <= 1.0 => share,
            Some(other) => {
                return Err(AuthError {
                    entry: "[auth]".into(),
                    field: "share".into(),
                    problem: format!(
                        "is {other}: it is the part of each [server] cap one credential may hold, more than 0 and at most 1 (0.5 by default)"
                    ),
                })
            }
        };
        Ok(Access {
            tokens,
            clients,
            share,
            metrics_open,
            client_common_name: self.client_common_name.unwrap_or(false),
            client_first,
            token_file,
        })
    }
}

fn token_of(spec: &TokenSpec, entry: &str) -> Result<([u8; 32], Arc<Grant>), AuthError> {
    checked_name(&spec.name, entry)?;
    checked_limits(&spec.limits, entry)?;
    let err = |field: &str, problem: String| AuthError {
        entry: entry.to_owned(),
        field: field.into(),
        problem,
    };
    let hash = match (&spec.sha256, &spec.env) {
        (Some(hex), None) => sha256_of(hex).ok_or_else(|| {
            err(
                "sha256",
                "must be 64 hex digits: the SHA-256 of the token, as `fusebox token` prints it".into(),
            )
        })?,
        (None, Some(var)) => match std::env::var(var) {
            Ok(token) if token.len() >= 16 => hash(&token),
            Ok(_) => {
                return Err(err(
                    "env",
                    format!("the token in ${var} is shorter than 16 characters; use `fusebox token` to make one"),
                ))
            }
            Err(_) => {
                return Err(err(
                    "env",
                    format!("${var} is not set (or not UTF-8); set it to the token, or give sha256 instead"),
                ))
            }
        },
        (Some(_), Some(_)) => {
            return Err(err(
                "sha256",
                "give either sha256 or env, not both".into(),
            ))
        }
        (None, None) => {
            return Err(err(
                "sha256",
                "is required (or env): the SHA-256 of the token, as `fusebox token` prints it".into(),
            ))
        }
    };
    Ok((
        hash,
        Arc::new(Grant {
            name: spec.name.clone(),
            tenant: tenant_of(&spec.name, &spec.tenant, &spec.prefixes),
            role: spec.role,
            scope: scope_of(&spec.prefixes, entry)?,
            allowance: spec.limits,
        }),
    ))
}

/// The 32 bytes of a token's SHA-256 written as 64 hex digits (either case).
fn sha256_of(hex: &str) -> Option<[u8; 32]> {
    let mut sha = [0u8; 32];
    crate::domain::hex::decode_to_slice(hex, &mut sha).ok()?;
    Some(sha)
}

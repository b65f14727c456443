//! Who may do what (`[auth]` in the config): bearer tokens, kept only as
//! SHA-256 hashes and compared in constant time, and client-certificate
//! names (mTLS), each mapped to a role and the keys it may touch.
//!
//! Roles are ordered: a `caller` may use the Fusebox service (Acquire,
//! Complete, Renew); an `operator` may also read keys, watch them, and
//! isolate or close them; an `admin` may also change policies and use
//! everything else. Every grant is limited to its key patterns (`prefixes`),
//! written like rule patterns: `"checkout/*"`, an exact key, or `"*"`.
//!
//! This module decides; the gRPC and HTTP sides turn its answers into
//! `UNAUTHENTICATED` / `PERMISSION_DENIED` (401 / 403).

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::engine::config::Pattern;
use crate::engine::shares::{Allowance, DEFAULT_SHARE};

/// What a grant may do; each role includes the ones before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The Fusebox service: Acquire, Complete, Renew.
    Caller,
    /// Also Admin reads (GetKey, ListKeys, ListPolicies), Watch, Isolate,
    /// Close, and the dashboard's actions.
    Operator,
    /// Also SetPolicy, DeletePolicy and the manual clock.
    Admin,
}

impl Role {
    /// The role's name as written in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Caller => "caller",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

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
    /// What it may hold at once, past the default share (decisions 99).
    #[serde(default)]
    pub limits: Allowance,
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

/// The keys a grant covers.
#[derive(Clone, Debug, PartialEq)]
pub struct Scope(Vec<Pattern>);

impl Scope {
    /// Every key.
    pub fn all() -> Scope {
        Scope(vec![Pattern::Prefix(String::new())])
    }

    /// True when `key` is covered.
    pub fn covers_key(&self, key: &str) -> bool {
        self.0.iter().any(|p| p.matches(key))
    }

    /// True when every key that starts with `prefix` is covered.
    pub fn covers_prefix(&self, prefix: &str) -> bool {
        self.0
            .iter()
            .any(|p| matches!(p, Pattern::Prefix(mine) if prefix.starts_with(mine.as_str())))
    }

    /// True when every key `pattern` matches is covered.
    pub fn covers_pattern(&self, pattern: &Pattern) -> bool {
        match pattern {
            Pattern::Exact(key) => self.covers_key(key),
            Pattern::Prefix(prefix) => self.covers_prefix(prefix),
        }
    }

    /// True when the scope is every key.
    pub fn is_all(&self) -> bool {
        self.covers_prefix("")
    }

    /// The scope as written, for messages: `checkout/*, payments/*`.
    pub fn text(&self) -> String {
        self.0
            .iter()
            .map(Pattern::text)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// What one credential may do.
#[derive(Clone, Debug, PartialEq)]
pub struct Grant {
    /// Who: the token's or the certificate's name.
    pub name: String,
    /// The role.
    pub role: Role,
    /// The keys.
    pub scope: Scope,
    /// What it may hold at once, where its entry says.
    pub allowance: Allowance,
}

/// Why a request is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No credential, or one this server does not know (UNAUTHENTICATED, 401).
    Unauthenticated(String),
    /// A known credential without the right (PERMISSION_DENIED, 403).
    Denied(String),
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Unauthenticated(m) | Refusal::Denied(m) => f.write_str(m),
        }
    }
}

impl Grant {
    /// Ok when the grant has at least `role`; `what` names the call.
    pub fn needs(&self, role: Role, what: &str) -> Result<(), Refusal> {
        if self.role >= role {
            Ok(())
        } else {
            Err(Refusal::Denied(format!(
                "{} has role {}; {what} needs role {role} or higher",
                self.who(),
                self.role
            )))
        }
    }

    /// Ok when the grant has `role` and covers `key`.
    pub fn on_key(&self, role: Role, what: &str, key: &str) -> Result<(), Refusal> {
        self.needs(role, what)?;
        if self.scope.covers_key(key) {
            Ok(())
        } else {
            Err(Refusal::Denied(format!(
                "{} may not use key {key:?}: it is limited to {}",
                self.who(),
                self.scope.text()
            )))
        }
    }

    /// Ok when the grant has `role` and covers every key under `prefix`.
    pub fn on_prefix(&self, role: Role, what: &str, prefix: &str) -> Result<(), Refusal> {
        self.needs(role, what)?;
        if self.scope.covers_prefix(prefix) {
            Ok(())
        } else {
            Err(Refusal::Denied(format!(
                "{} may not read every key under {prefix:?}: it is limited to {}; pass a prefix inside them",
                self.who(),
                self.scope.text()
            )))
        }
    }

    /// Ok when the grant has `role` and covers every key of `pattern`.
    pub fn on_pattern(&self, role: Role, what: &str, pattern: &Pattern) -> Result<(), Refusal> {
        self.needs(role, what)?;
        if self.scope.covers_pattern(pattern) {
            Ok(())
        } else {
            Err(Refusal::Denied(format!(
                "{} may not set policies for {:?}: it is limited to {}",
                self.who(),
                pattern.text(),
                self.scope.text()
            )))
        }
    }

    /// Ok when the grant has `role` over every key (the default rule).
    pub fn on_everything(&self, role: Role, what: &str) -> Result<(), Refusal> {
        self.needs(role, what)?;
        if self.scope.is_all() {
            Ok(())
        } else {
            Err(Refusal::Denied(format!(
                "{} may not use {what}: it changes every key, and the credential is limited to {}",
                self.who(),
                self.scope.text()
            )))
        }
    }

    fn who(&self) -> String {
        format!("credential {:?}", self.name)
    }
}

/// Validated `[auth]`: who may do what.
#[derive(Clone, PartialEq)]
pub struct Access {
    tokens: Vec<([u8; 32], Arc<Grant>)>,
    clients: Vec<(String, Arc<Grant>)>,
    /// `[auth] share`.
    share: f64,
    /// Whether `/metrics` answers without a token.
    pub metrics_open: bool,
    /// Whether a certificate's common name is one of its names.
    client_common_name: bool,
    /// Whether a certificate whose names match different entries takes
    /// the first (else it is refused).
    client_first: bool,
    /// The token file, if any (watched for changes with the config).
    pub token_file: Option<PathBuf>,
}

impl fmt::Debug for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the hashes.
        f.debug_struct("Access")
            .field("tokens", &self.tokens.len())
            .field("clients", &self.clients.len())
            .field("metrics_open", &self.metrics_open)
            .finish()
    }
}

/// The SHA-256 of a token.
pub fn hash(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// The SHA-256 of a token as 64 lower-case hex digits, as the config takes it.
pub fn hash_hex(token: &str) -> String {
    crate::domain::hex::hex(&hash(token))
}

/// A new random token: 32 bytes from the operating system, in hex.
pub fn new_token() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)?;
    Ok(crate::domain::hex::hex(&bytes))
}

fn parse_hex(text: &str) -> Option<[u8; 32]> {
    if text.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
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

impl AuthSpec {
    /// Validates `[auth]`; `dir` is the config file's directory, against
    /// which a relative `token_file` resolves. Reads the token file and the
    /// environment variables that `env` names.
    pub fn validate(&self, dir: Option<&Path>) -> Result<Access, AuthError> {
        let metrics_open = match self.metrics.as_deref() {
            None | Some("open") => true,
            Some("token") => false,
            Some(other) => {
                return Err(AuthError {
                    entry: "[auth]".into(),
                    field: "metrics".into(),
                    problem: format!("{other:?} is not \"open\" or \"token\""),
                })
            }
        };
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
            clients.push((
                spec.name.clone(),
                Arc::new(Grant {
                    name: spec.name.clone(),
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
        let client_first = match self.client_ambiguous.as_deref() {
            None | Some("refuse") => false,
            Some("first") => true,
            Some(other) => {
                return Err(AuthError {
                    entry: "[auth]".into(),
                    field: "client_ambiguous".into(),
                    problem: format!("{other:?} is not \"refuse\" or \"first\""),
                })
            }
        };
        let share = match self.share {
            None => DEFAULT_SHARE,
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
    let err = |field: &str, problem: String| AuthError {
        entry: entry.to_owned(),
        field: field.into(),
        problem,
    };
    let hash = match (&spec.sha256, &spec.env) {
        (Some(hex), None) => parse_hex(&hex.to_ascii_lowercase()).ok_or_else(|| {
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
            role: spec.role,
            scope: scope_of(&spec.prefixes, entry)?,
            allowance: spec.limits,
        }),
    ))
}

/// The refusal for a request with no credential at all.
pub fn missing() -> Refusal {
    Refusal::Unauthenticated(
        "no credentials: send the header `authorization: Bearer TOKEN` (the CLI takes --token or FUSEBOX_TOKEN)".into(),
    )
}

impl Access {
    /// Who a request is: its bearer token (the value of an `authorization`
    /// header), else its client-certificate names.
    pub fn authenticate(
        &self,
        authorization: Option<&[u8]>,
        identity: Option<&crate::tls::ClientIdentity>,
    ) -> Result<Arc<Grant>, Refusal> {
        if let Some(value) = authorization {
            let token = std::str::from_utf8(value)
                .ok()
                .and_then(|v| {
                    let (scheme, rest) = v.trim().split_once(' ')?;
                    scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
                })
                .ok_or_else(|| {
                    Refusal::Unauthenticated(
                        "the authorization header is not `Bearer TOKEN`".into(),
                    )
                })?;
            return self.by_token(token).ok_or_else(|| {
                Refusal::Unauthenticated(
                    "the bearer token is not one this server knows: check it, or ask an admin to add its sha256 to [auth]".into(),
                )
            });
        }
        let Some(identity) = identity else {
            return Err(missing());
        };
        let names = || {
            identity.names.iter().chain(
                identity
                    .common_names
                    .iter()
                    .filter(|_| self.client_common_name),
            )
        };
        let entry = |name| self.client_entry(name);
        let mut matched = names().filter_map(entry);
        let Some((_, first)) = matched.next() else {
            return Err(Refusal::Unauthenticated(
                match (names().next(), identity.common_names.first()) {
                    (Some(first), _) => format!(
                        "the client certificate ({first}) has no [[auth.client]] entry, and no bearer token was sent"
                    ),
                    (None, Some(cn)) => format!(
                        "the client certificate has no DNS or URI name, and its common name ({cn}) is not taken as one; give it a subject alternative name, or set [auth] client_common_name = true"
                    ),
                    (None, None) => "the client certificate has no DNS or URI name, and no bearer token was sent".to_owned(),
                },
            ));
        };
        // Names of one entry are one identity; names of two are ambiguous.
        if self.client_first || !matched.any(|(_, g)| !Arc::ptr_eq(g, first)) {
            return Ok(first.clone());
        }
        let mut entries: Vec<String> = Vec::new();
        for (name, grant) in names().filter_map(entry) {
            let shown = format!("{name} as {}", grant.name);
            if !entries.contains(&shown) {
                entries.push(shown);
            }
        }
        Err(Refusal::Unauthenticated(format!(
            "the client certificate's names match different [[auth.client]] entries ({}); give the certificate one name, or set [auth] client_ambiguous = \"first\"",
            entries.join(", ")
        )))
    }

    /// `name` and its `[[auth.client]]` entry's grant, if it has one.
    fn client_entry<'a>(&'a self, name: &'a String) -> Option<(&'a String, &'a Arc<Grant>)> {
        self.clients
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, g)| (name, g))
    }

    /// What the credential behind `grant` (a grant of `before`, an
    /// earlier [`Access`]) may do under this one: `None` when the token or
    /// client name is no longer here, so that a stream opened with it
    /// ends.
    pub fn renewed(&self, before: &Access, grant: &Arc<Grant>) -> Option<Arc<Grant>> {
        if let Some((hash, _)) = before.tokens.iter().find(|(_, g)| Arc::ptr_eq(g, grant)) {
            return self
                .tokens
                .iter()
                .find(|(h, _)| bool::from(h.ct_eq(hash)))
                .map(|(_, g)| g.clone());
        }
        if let Some((name, _)) = before.clients.iter().find(|(_, g)| Arc::ptr_eq(g, grant)) {
            return self
                .clients
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, g)| g.clone());
        }
        // Not one of `before`'s (a reload came between the stream's check
        // and its watch): the same rights under this access, if any.
        self.tokens
            .iter()
            .map(|(_, g)| g)
            .chain(self.clients.iter().map(|(_, g)| g))
            .find(|g| ***g == **grant)
            .cloned()
    }

    /// The grant of `token`: every entry is compared, in constant time.
    fn by_token(&self, token: &str) -> Option<Arc<Grant>> {
        let presented = hash(token);
        let mut found = None;
        for (hash, grant) in &self.tokens {
            if bool::from(hash.ct_eq(&presented)) {
                found = Some(grant.clone());
            }
        }
        found
    }

    /// `[auth] share`: the part of each cap a credential may hold by default.
    pub fn share(&self) -> f64 {
        self.share
    }

    /// Every grant: the tokens', then the client names'.
    pub fn grants(&self) -> impl Iterator<Item = &Arc<Grant>> {
        self.tokens
            .iter()
            .map(|(_, g)| g)
            .chain(self.clients.iter().map(|(_, g)| g))
    }

    /// The number of tokens and of client names.
    pub fn sizes(&self) -> (usize, usize) {
        (self.tokens.len(), self.clients.len())
    }
}

/// The credential a long-lived stream (Decide, Watch, the dashboard's
/// event stream) was opened with, watched: when a reload removes its token
/// or client name, the stream is told at once and ends UNAUTHENTICATED;
/// when the credential stays (its rights perhaps changed), the stream goes
/// on under its rights as they are now.
pub struct Credential {
    watched: tokio::sync::watch::Receiver<Option<Arc<Access>>>,
    /// The access the stream's grant is one of.
    held: Option<Arc<Access>>,
}

impl Credential {
    /// The credential of a stream opened now.
    pub fn of(core: &crate::engine::Core) -> Credential {
        let mut watched = core.watch_access();
        let held = watched.borrow_and_update().clone();
        Credential { watched, held }
    }

    /// Resolves, with the refusal to end the stream with, once `grant`'s
    /// credential is no longer known, or no longer has the rights `still`
    /// checks (or a credential is now needed and the stream has none);
    /// until then, keeps `grant` up to date with each reload.
    pub async fn lost(
        &mut self,
        grant: &mut Option<Arc<Grant>>,
        still: impl Fn(&Grant) -> Result<(), Refusal>,
    ) -> Refusal {
        loop {
            if self.watched.changed().await.is_err() {
                // The server is going away; its shutdown ends the stream.
                return std::future::pending().await;
            }
            let now = self.watched.borrow_and_update().clone();
            let renewed = match (&now, &self.held, grant.as_ref()) {
                // Authentication is off now: anyone may.
                (None, _, _) => None,
                (Some(now), Some(before), Some(g)) => match now.renewed(before, g) {
                    Some(renewed) => {
                        if let Err(refusal) = still(&renewed) {
                            return refusal;
                        }
                        Some(renewed)
                    }
                    None => {
                        return Refusal::Unauthenticated(format!(
                            "the credential this stream was opened with ({}) was removed from the server's config; open the stream again with a credential the server knows",
                            g.name
                        ))
                    }
                },
                (Some(_), _, _) => {
                    return Refusal::Unauthenticated(
                        "the server now needs a credential, and this stream was opened without one; open it again with `authorization: Bearer TOKEN`".into(),
                    )
                }
            };
            *grant = renewed;
            self.held = now;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn access(text: &str) -> Result<Access, AuthError> {
        toml::from_str::<AuthSpec>(text)
            .expect("valid TOML")
            .validate(None)
    }

    #[test]
    fn tokens_are_found_by_hash_and_grant_their_scope() {
        let text = format!(
            "[[token]]\nname = \"checkout\"\nrole = \"caller\"\nprefixes = [\"checkout/*\"]\nsha256 = \"{}\"\n",
            hash_hex("secret-checkout-token")
        );
        let access = access(&text).expect("valid");
        let grant = access
            .authenticate(Some(b"Bearer secret-checkout-token"), None)
            .expect("known");
        assert_eq!(grant.role, Role::Caller);
        assert!(grant.on_key(Role::Caller, "Acquire", "checkout/a").is_ok());
        assert!(matches!(
            grant.on_key(Role::Caller, "Acquire", "payments/a"),
            Err(Refusal::Denied(_))
        ));
        assert!(matches!(
            grant.on_key(Role::Operator, "Isolate", "checkout/a"),
            Err(Refusal::Denied(_))
        ));
        assert!(matches!(
            access.authenticate(Some(b"Bearer other"), None),
            Err(Refusal::Unauthenticated(_))
        ));
        assert!(matches!(
            access.authenticate(None, None),
            Err(Refusal::Unauthenticated(_))
        ));
        assert!(matches!(
            access.authenticate(Some(b"Basic abc"), None),
            Err(Refusal::Unauthenticated(_))
        ));
    }

    #[test]
    fn listing_needs_a_prefix_inside_the_scope() {
        let scope = Scope(vec![
            Pattern::Prefix("a/".into()),
            Pattern::Exact("b".into()),
        ]);
        assert!(scope.covers_prefix("a/"));
        assert!(scope.covers_prefix("a/x"));
        assert!(!scope.covers_prefix("a"));
        assert!(!scope.covers_prefix(""));
        assert!(!scope.covers_prefix("b"));
        assert!(scope.covers_pattern(&Pattern::Exact("b".into())));
        assert!(!scope.covers_pattern(&Pattern::Prefix("b".into())));
        assert!(Scope::all().is_all());
    }

    #[test]
    fn bad_entries_name_the_field() {
        let e =
            access("[[token]]\nname = \"x\"\nrole = \"admin\"\nsha256 = \"abc\"\n").unwrap_err();
        assert_eq!(e.field, "sha256");
        let e = access("[[token]]\nname = \"x\"\nrole = \"admin\"\n").unwrap_err();
        assert_eq!(e.field, "sha256");
        let e = access(&format!(
            "[[token]]\nname = \"x\"\nrole = \"admin\"\nprefixes = []\nsha256 = \"{}\"\n",
            hash_hex("t")
        ))
        .unwrap_err();
        assert_eq!(e.field, "prefixes");
        let e = access("metrics = \"maybe\"\n").unwrap_err();
        assert_eq!(e.field, "metrics");
        let e = access("").unwrap_err();
        assert_eq!(e.field, "token");
        let e = access(&format!(
            "[[token]]\nname = \"x\"\nrole = \"admin\"\nsha256 = \"{h}\"\n[[token]]\nname = \"y\"\nrole = \"caller\"\nsha256 = \"{h}\"\n",
            h = hash_hex("t")
        ))
        .unwrap_err();
        assert_eq!(e.field, "sha256");
    }

    fn identity(names: &[&str], common: &[&str]) -> crate::tls::ClientIdentity {
        crate::tls::ClientIdentity {
            names: names.iter().map(|n| (*n).to_owned()).collect(),
            common_names: common.iter().map(|n| (*n).to_owned()).collect(),
        }
    }

    #[test]
    fn client_names_stand_for_roles_when_no_token_is_sent() {
        let access =
            access("[[client]]\nname = \"ops.internal\"\nrole = \"operator\"\n").expect("valid");
        let grant = access
            .authenticate(None, Some(&identity(&["other", "ops.internal"], &[])))
            .expect("known name");
        assert_eq!(grant.role, Role::Operator);
        assert!(matches!(
            access.authenticate(None, Some(&identity(&["stranger"], &[]))),
            Err(Refusal::Unauthenticated(_))
        ));
    }

    /// Issue 18, mTLS names: a bare common name is not an identity unless
    /// the config says so, and names that match different entries are
    /// refused as ambiguous unless the config says to take the first.
    #[test]
    fn common_names_count_only_when_configured_and_ambiguity_is_refused() {
        let entries = "[[client]]\nname = \"ops.internal\"\nrole = \"operator\"\n\
                       [[client]]\nname = \"billing.internal\"\nrole = \"caller\"\n";
        let strict = access(entries).expect("valid");
        let cn_only = identity(&[], &["ops.internal"]);
        let refused = strict.authenticate(None, Some(&cn_only)).unwrap_err();
        assert!(
            matches!(&refused, Refusal::Unauthenticated(m) if m.contains("client_common_name")),
            "{refused:?}"
        );
        let with_cn = access(&format!("client_common_name = true\n{entries}")).expect("valid");
        assert_eq!(
            with_cn
                .authenticate(None, Some(&cn_only))
                .expect("taken")
                .name,
            "ops.internal"
        );
        let both = identity(&["billing.internal", "ops.internal"], &[]);
        let ambiguous = strict.authenticate(None, Some(&both)).unwrap_err();
        assert!(
            matches!(&ambiguous, Refusal::Unauthenticated(m) if m.contains("ambiguous") || m.contains("different")),
            "{ambiguous:?}"
        );
        let first = access(&format!("client_ambiguous = \"first\"\n{entries}")).expect("valid");
        assert_eq!(
            first
                .authenticate(None, Some(&both))
                .expect("the first")
                .name,
            "billing.internal"
        );
        let same_entry_twice = identity(&["ops.internal"], &["ops.internal"]);
        assert!(with_cn.authenticate(None, Some(&same_entry_twice)).is_ok());
        let e = access(&format!("client_ambiguous = \"maybe\"\n{entries}")).unwrap_err();
        assert_eq!(e.field, "client_ambiguous");
    }
}

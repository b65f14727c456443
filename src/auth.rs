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
use std::path::PathBuf;
use std::sync::Arc;

use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::engine::shares::{Allowance, Tenants};
use crate::engine::Pattern;

/// What a grant may do; each role includes the ones before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// `GET /metrics` only (with `[auth] metrics = "token"`), for a
    /// scraper: no call, no API, no dashboard action.
    Metrics,
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
            Role::Metrics => "metrics",
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

/// The keys a grant covers.
#[derive(Clone, Debug, PartialEq)]
pub struct Scope(pub(crate) Vec<Pattern>);

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
    /// Whose share it holds (decisions 140): the entry's `tenant`, else
    /// the keys its `prefixes` name (credentials of one namespace share
    /// one share), else its name.
    pub tenant: String,
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
        self.covers(self.scope.covers_key(key), |who, scope| {
            format!("{who} may not use key {key:?}: it is limited to {scope}")
        })
    }

    /// Ok when the grant has `role` and covers every key under `prefix`.
    pub fn on_prefix(&self, role: Role, what: &str, prefix: &str) -> Result<(), Refusal> {
        self.needs(role, what)?;
        self.covers(self.scope.covers_prefix(prefix), |who, scope| {
            format!("{who} may not read every key under {prefix:?}: it is limited to {scope}; pass a prefix inside them")
        })
    }

    /// Ok when the grant has `role` and covers every key of `pattern`.
    pub fn on_pattern(&self, role: Role, what: &str, pattern: &Pattern) -> Result<(), Refusal> {
        self.needs(role, what)?;
        self.covers(self.scope.covers_pattern(pattern), |who, scope| {
            format!(
                "{who} may not set policies for {:?}: it is limited to {scope}",
                pattern.text()
            )
        })
    }

    /// Ok when the grant has `role` over every key (the default rule).
    pub fn on_everything(&self, role: Role, what: &str) -> Result<(), Refusal> {
        self.needs(role, what)?;
        self.covers(self.scope.is_all(), |who, scope| {
            format!("{who} may not use {what}: it changes every key, and the credential is limited to {scope}")
        })
    }

    /// Ok when the grant's scope covers what was asked (`covered`); else
    /// the refusal `denial` writes from who the grant is and its scope.
    fn covers(
        &self,
        covered: bool,
        denial: impl FnOnce(String, String) -> String,
    ) -> Result<(), Refusal> {
        if covered {
            Ok(())
        } else {
            Err(Refusal::Denied(denial(self.who(), self.scope.text())))
        }
    }

    fn who(&self) -> String {
        format!("credential {:?}", self.name)
    }
}

/// Validated `[auth]`: who may do what.
#[derive(Clone, PartialEq)]
pub struct Access {
    pub(crate) tokens: Vec<([u8; 32], Arc<Grant>)>,
    pub(crate) clients: Vec<(String, Arc<Grant>)>,
    /// `[auth] share`.
    pub(crate) share: f64,
    /// Whether `/metrics` answers without a token.
    pub metrics_open: bool,
    /// Whether a certificate's common name is one of its names.
    pub(crate) client_common_name: bool,
    /// Whether a certificate whose names match different entries takes
    /// the first (else it is refused).
    pub(crate) client_first: bool,
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
    crate::domain::hex::encode(hash(token))
}

/// A new random token: 32 bytes from the operating system, in hex.
pub fn new_token() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)?;
    Ok(crate::domain::hex::encode(bytes))
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

    /// The credentials as their shares see them: each name with its
    /// entry's `limits`, and `[auth] share` (decisions 99).
    pub fn tenants(&self) -> Tenants {
        Tenants {
            entries: self
                .grants()
                .map(|g| (g.tenant.clone(), g.allowance))
                .collect(),
            fraction: self.share,
        }
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
    /// The credential of a stream opened now, under the access `watched`
    /// (which changes when a reload replaces it).
    pub fn of(mut watched: tokio::sync::watch::Receiver<Option<Arc<Access>>>) -> Credential {
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
    use crate::config::auth::{AuthError, AuthSpec};

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
    fn an_unread_part_of_zero_is_refused_naming_the_field() {
        let entry = |limit: u64| {
            format!(
                "[[token]]\nname = \"a\"\nrole = \"caller\"\nsha256 = \"{}\"\nlimits = {{ max_unread_bytes = {limit} }}\n",
                hash_hex("secret-a-token-0123")
            )
        };
        let e = access(&entry(0)).expect_err("refused");
        assert_eq!(e.field, "limits.max_unread_bytes", "{e:?}");
        let access = access(&entry(4096)).expect("valid");
        assert_eq!(access.tenants().entries[0].1.max_unread_bytes, Some(4096));
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

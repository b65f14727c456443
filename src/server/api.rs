//! The value every gRPC service of one server shares ([`Api`]): the store,
//! the server's [`Node`] and what its services bound together
//! ([`Bounds`]), with who called and what they may do.

use std::sync::Arc;

use tonic::{Request, Status};

use crate::auth::{Grant, Role};
use crate::engine::Store;
use crate::node::Node;
use crate::telemetry::Trace;

use super::bounds::Bounds;
use super::gate::Authenticated;
use super::status::status_of_refusal;
use super::tls;

/// Who asked, for the record of an isolate or close: the credential's
/// name when authentication is on (with the `x-fusebox-operator` header, if
/// set, as the person behind it), else the header, else the peer's address;
/// with mutual TLS, followed by the client certificate's label (its common
/// name, else its first DNS or URI name) unless that is the credential
/// (`cli:ana (certificate ops-laptop)`).
pub(crate) fn who<T>(request: &Request<T>, grant: Option<&Grant>) -> String {
    let header = request
        .metadata()
        .get("x-fusebox-operator")
        .and_then(|v| v.to_str().ok())
        .map(|s| s.chars().take(128).collect::<String>());
    let who = match (grant, header) {
        (Some(g), Some(h)) if h != g.name => format!("{h} via {}", g.name),
        (Some(g), _) => g.name.clone(),
        (None, Some(h)) => h,
        (None, None) => {
            tls::remote_addr(request).map_or_else(|| "unknown".to_owned(), |a| a.to_string())
        }
    };
    match tls::identity(request).and_then(|id| id.label()) {
        Some(name) if grant.is_none_or(|g| &g.name != name) => format!(
            "{who} (certificate {})",
            name.chars().take(128).collect::<String>()
        ),
        _ => who,
    }
}

/// What a call touches, for the permission check.
pub(crate) enum On<'a> {
    /// One key.
    Key(&'a str),
    /// Every key under a prefix.
    Prefix(&'a str),
    /// The keys of a rule pattern.
    Pattern(&'a crate::engine::Pattern),
    /// Every key (the default rule, the clock).
    Everything,
    /// Nothing keyed (ListPolicies).
    Nothing,
}

/// The three fusebox services over one store: cloned into each service,
/// one value per server ([`Api::new`] makes its `Bounds`).
#[derive(Clone, Debug)]
pub struct Api {
    pub(crate) store: Store,
    pub(crate) node: Arc<Node>,
    pub(crate) bounds: Arc<Bounds>,
}

impl Api {
    /// The services of `node`, with bounds of their own.
    pub fn new(node: Arc<Node>) -> Self {
        Api {
            store: node.store().clone(),
            node,
            bounds: Arc::new(Bounds::default()),
        }
    }

    /// The span of a call of `method` of `service` on `request`, continuing
    /// the caller's W3C trace context from its headers; [`Trace::OFF`] when
    /// `[telemetry]` is not set (then nothing is read or made). A handler
    /// opens it in one line, adds what it knows (`trace.key(..)`,
    /// `trace.attribute(|| ..)`) and ends it with its result
    /// (`trace.ended(&result)`); the span ends when dropped.
    pub(crate) fn trace<T>(
        &self,
        request: &Request<T>,
        service: &'static str,
        method: &'static str,
    ) -> Trace {
        match self.node.telemetry() {
            Some(t) => t.span(&t.parent_of(request.metadata()), service, method),
            None => Trace::OFF,
        }
    }

    /// Puts the key of `ticket` on `trace` (`fusebox.key`), when a span is
    /// recorded and the ticket names one.
    pub(crate) fn ticket_key(&self, trace: &mut Trace, ticket: &str) {
        if trace.is_on() {
            if let Ok(key) = self.store.ticket_key(ticket) {
                trace.key(&key);
            }
        }
    }

    /// Who sent `request`: its grant, or `None` when authentication is off.
    pub(crate) fn grant<T>(&self, request: &Request<T>) -> Result<Option<Arc<Grant>>, Status> {
        // The gate found it on the headers ([`gate`]); looking it up again
        // is for calls that did not pass the gate.
        if let Some(Authenticated(grant)) = request.extensions().get() {
            return Ok(Some(grant.clone()));
        }
        let Some(access) = self.node.access() else {
            return Ok(None);
        };
        access
            .authenticate(
                request
                    .metadata()
                    .get("authorization")
                    .map(|v| v.as_bytes()),
                tls::identity(request),
            )
            .map(Some)
            .map_err(status_of_refusal)
    }

    /// Checks that the caller of `request` may do `what` (which needs
    /// `role`) on `on`. Returns the caller's grant, or `None` when
    /// authentication is off.
    pub(crate) fn allow<T>(
        &self,
        request: &Request<T>,
        role: Role,
        what: &str,
        on: On<'_>,
    ) -> Result<Option<Arc<Grant>>, Status> {
        let Some(grant) = self.grant(request)? else {
            return Ok(None);
        };
        match on {
            On::Key(key) => grant.on_key(role, what, key),
            On::Prefix(prefix) => grant.on_prefix(role, what, prefix),
            On::Pattern(pattern) => grant.on_pattern(role, what, pattern),
            On::Everything => grant.on_everything(role, what),
            On::Nothing => grant.needs(role, what),
        }
        .map_err(status_of_refusal)?;
        Ok(Some(grant))
    }
}

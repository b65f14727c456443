//! Who may use the HTTP side. Every request's `Host` and `Origin` must name
//! this server: loopback names, an IP address, or a name in `[server]
//! http_hosts` (so that a page on a foreign name, rebound to this address
//! in an operator's browser, is refused). With `[auth]`, the API and its
//! event stream need an operator credential, mutations one allowed on the
//! key, and `/metrics` one too when `[auth] metrics = "token"`. The page
//! itself, its assets, `/healthz` and `/readyz` stay open.

use std::net::IpAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::state::AppState;
use crate::auth::{Grant, Role};

/// The credential a request came with (`None` when `[auth]` is off), for
/// the handlers that check a key.
#[derive(Clone, Debug)]
pub struct Caller(pub Option<Arc<Grant>>);

impl Caller {
    /// Ok when the caller may steer `key` (an operator on it).
    pub fn may_steer(&self, key: &str, what: &str) -> Result<(), ApiError> {
        match &self.0 {
            Some(grant) => grant
                .on_key(Role::Operator, what, key)
                .map_err(ApiError::refused),
            None => Ok(()),
        }
    }

    /// Who, for the record of an isolate or close.
    pub fn name(&self) -> Option<&str> {
        self.0.as_deref().map(|g| g.name.as_str())
    }
}

/// The host part of a `Host` value or an origin's authority: without the
/// port, and without the brackets of an IPv6 literal.
fn host_part(authority: &str) -> &str {
    if let Some(rest) = authority.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match authority.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => authority,
    }
}

/// True when `host` names this server: an IP address (a rebinding attack
/// needs a name), `localhost`, or a configured name.
fn known_host(host: &str, configured: &[String]) -> bool {
    host.parse::<IpAddr>().is_ok()
        || host.eq_ignore_ascii_case("localhost")
        || configured.iter().any(|c| c.eq_ignore_ascii_case(host))
}

/// Refuses a request whose `Host` or `Origin` names another server. The
/// `Host` must be an address, `localhost` or a configured name; a page's
/// `Origin` must be this very server as the request reached it (its
/// authority is the request's `Host`: same address, same port), or a
/// configured name (a proxy in front may use its own port). So neither a
/// page on another address nor one served by another port of the same
/// machine may call the API.
fn check_names(headers: &HeaderMap, configured: &[String]) -> Result<(), ApiError> {
    let host = headers.get(header::HOST).map(|h| h.to_str().unwrap_or(""));
    if let Some(text) = host {
        if !known_host(host_part(text), configured) {
            return Err(ApiError::forbidden(
                "Host",
                format!("{text:?} is not a name of this server; add it to [server] http_hosts, or use its address"),
            ));
        }
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let text = origin.to_str().unwrap_or("");
        let authority = text
            .strip_prefix("http://")
            .or_else(|| text.strip_prefix("https://"))
            .filter(|rest| !rest.contains(['/', '@']));
        let same = |a: &str| host.is_some_and(|h| !h.is_empty() && a.eq_ignore_ascii_case(h));
        let named = |a: &str| {
            let h = host_part(a);
            configured.iter().any(|c| c.eq_ignore_ascii_case(h))
        };
        if !authority.is_some_and(|a| same(a) || named(a)) {
            return Err(ApiError::forbidden(
                "Origin",
                format!("pages from {text:?} may not call this server: only its own pages (the address and port the request came to) may; add a proxy's name to [server] http_hosts"),
            ));
        }
    }
    Ok(())
}

/// The role a path needs, or `None` when it is open.
fn role_for(path: &str, metrics_open: bool) -> Option<Role> {
    match path {
        "/metrics" if !metrics_open => Some(Role::Metrics),
        p if p.starts_with("/api/") => Some(Role::Operator),
        _ => None,
    }
}

/// The client certificate's identity of `request`'s connection (mTLS).
fn client_identity(request: &Request) -> Option<&crate::tls::ClientIdentity> {
    request.extensions().get::<crate::tls::ClientIdentity>()
}

/// The middleware: names first, then the credential.
pub async fn guard(State(state): State<AppState>, mut request: Request, next: Next) -> Response {
    if let Err(refused) = check_names(request.headers(), state.node.http_hosts()) {
        return refused.into_response();
    }
    let mut caller = Caller(None);
    if let Some(access) = state.node.access() {
        if request.uri().path() == "/metrics" && access.metrics_open {
            // Open to anyone, but only a known credential's own keys get
            // per-key series ([`super::metrics`]).
            let identity = client_identity(&request);
            let presented = request
                .headers()
                .get(header::AUTHORIZATION)
                .map(|v| v.as_bytes());
            if presented.is_some() || identity.is_some() {
                caller = Caller(access.authenticate(presented, identity).ok());
            }
        } else if let Some(role) = role_for(request.uri().path(), access.metrics_open) {
            let identity = client_identity(&request);
            let grant = access.authenticate(
                request
                    .headers()
                    .get(header::AUTHORIZATION)
                    .map(|v| v.as_bytes()),
                identity,
            );
            let what = format!("{} {}", request.method(), request.uri().path());
            let checked = grant.and_then(|g| {
                // Reads show every key (the board, the timeline); a
                // mutation is checked against its key by its handler.
                if request.method() == Method::POST {
                    g.needs(role, &what)?;
                } else {
                    g.on_everything(role, &what)?;
                }
                Ok(g)
            });
            match checked {
                Ok(grant) => caller = Caller(Some(grant)),
                Err(refusal) => return ApiError::refused(refusal).into_response(),
            }
        }
    }
    request.extensions_mut().insert(caller);
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_addresses_localhost_or_configured_names() {
        let configured = vec!["fusebox.internal".to_owned()];
        for ok in [
            "127.0.0.1:9090",
            "[::1]:9090",
            "localhost",
            "LOCALHOST:80",
            "10.0.0.7",
            "fusebox.internal:9090",
        ] {
            assert!(known_host(host_part(ok), &configured), "{ok}");
        }
        for bad in [
            "evil.example:9090",
            "fusebox.internal.evil.example",
            "",
            "localhost.evil",
        ] {
            assert!(!known_host(host_part(bad), &configured), "{bad}");
        }
    }

    #[test]
    fn a_foreign_origin_is_refused_and_a_missing_one_is_not() {
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, "127.0.0.1:9090".parse().unwrap());
        assert!(check_names(&headers, &[]).is_ok());
        headers.insert(header::ORIGIN, "http://127.0.0.1:9090".parse().unwrap());
        assert!(check_names(&headers, &[]).is_ok());
        for bad in [
            "http://evil.example",
            "null",
            "file://",
            "http://evil.example@127.0.0.1",
            // Issue 18: an IP literal, and another port of this machine.
            "http://203.0.113.7",
            "http://127.0.0.1:8000",
            "http://localhost:9090",
            "http://127.0.0.1:9090/",
        ] {
            headers.insert(header::ORIGIN, bad.parse().unwrap());
            assert!(check_names(&headers, &[]).is_err(), "{bad}");
        }
        let configured = ["fusebox.internal".to_owned()];
        headers.insert(header::ORIGIN, "https://fusebox.internal".parse().unwrap());
        assert!(
            check_names(&headers, &configured).is_ok(),
            "a configured name"
        );
        headers.insert(header::HOST, "localhost:9090".parse().unwrap());
        headers.insert(header::ORIGIN, "http://localhost:9090".parse().unwrap());
        assert!(check_names(&headers, &[]).is_ok(), "the page's own origin");
    }
}

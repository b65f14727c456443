//! The gRPC face of fusebox (SPEC section 8): services that convert wire
//! messages to engine calls and back, and nothing more. Errors become
//! `tonic::Status` in exactly one place ([`status_of`]).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tonic::{Request, Response, Status};

use crate::auth::{Grant, Refusal, Role};
use crate::domain::{Decision, Outcome, Phase, Reason};
use crate::engine::shares::Share;
use crate::engine::{AcquireArgs, Core, Cursor, EngineError, KeyReading, Store};
use crate::node::Node;
use crate::proto::v1 as pb;
use crate::proto::wire::{
    duration_of, filter_of, millis_of, page_after, page_token, phase_of, timestamp_of,
};
use pb::admin_server::{Admin, AdminServer};
use pb::clock_server::{Clock, ClockServer};
use pb::fusebox_server::{Fusebox, FuseboxServer};

mod calls;
pub mod decide;
mod gate;
pub mod policy;
pub mod tls;
mod transport;
mod watch;

/// Largest gRPC message fusebox accepts, in bytes.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024;

/// Largest message the Admin service sends, in bytes: a ListKeys page of
/// 1000 keys or a Watch snapshot part of 100 keys can pass 64 KiB (a
/// `KeyState` with a 256-byte key and every statistic set is under 1 KiB).
/// 4 MiB is what gRPC clients accept by default.
pub const MAX_ADMIN_REPLY_BYTES: usize = 4 * 1024 * 1024;

/// What one stream's client may send ahead of the server's reading: one
/// of the largest messages.
pub const RECEIVE_WINDOW_PER_STREAM: u32 = MAX_MESSAGE_BYTES as u32;

/// The same for a whole connection.
pub const RECEIVE_WINDOW_PER_CONNECTION: u32 = 256 * 1024;

/// How long shutdown waits for in-flight calls before it exits anyway.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Once no call is in flight at shutdown, how long the server still has to
/// flush the last answers and close its connections before it exits.
pub const SHUTDOWN_FLUSH: Duration = Duration::from_millis(200);

/// Turns an engine error into the gRPC status of SPEC section 5.
pub fn status_of(e: EngineError) -> Status {
    let message = e.to_string();
    match e {
        EngineError::Invalid { .. } => Status::invalid_argument(message),
        EngineError::TicketNotFound | EngineError::RuleNotFound { .. } => {
            Status::not_found(message)
        }
        EngineError::Exhausted { .. } | EngineError::ShareExhausted { .. } => {
            Status::resource_exhausted(message)
        }
        EngineError::ShuttingDown | EngineError::StoreUnavailable(_) => {
            Status::unavailable(message)
        }
        EngineError::Internal(_) => Status::internal(message),
    }
}

/// Turns an authentication or permission refusal into its gRPC status.
pub fn status_of_refusal(r: Refusal) -> Status {
    match r {
        Refusal::Unauthenticated(m) => Status::unauthenticated(m),
        Refusal::Denied(m) => Status::permission_denied(m),
    }
}

fn invalid(field: &'static str, problem: impl Into<String>) -> Status {
    status_of(EngineError::Invalid {
        field,
        problem: problem.into(),
    })
}

fn reason_of(r: Reason) -> pb::Reason {
    match r {
        Reason::Open => pb::Reason::Open,
        Reason::ProbeInFlight => pb::Reason::ProbeInFlight,
        Reason::NoPermits => pb::Reason::NoPermits,
        Reason::QueueFull => pb::Reason::QueueFull,
        Reason::ExceedsLimit => pb::Reason::ExceedsLimit,
        Reason::Evicted => pb::Reason::Evicted,
        Reason::Timeout => pb::Reason::Timeout,
    }
}

fn outcome_of(value: i32) -> Result<Outcome, Status> {
    match pb::Outcome::try_from(value) {
        Ok(pb::Outcome::Success) => Ok(Outcome::Success),
        Ok(pb::Outcome::Failure) => Ok(Outcome::Failure),
        Ok(pb::Outcome::Ignored) => Ok(Outcome::Ignored),
        Ok(pb::Outcome::Unspecified) => Err(invalid(
            "outcome",
            "is OUTCOME_UNSPECIFIED; send OUTCOME_SUCCESS, OUTCOME_FAILURE or OUTCOME_IGNORED",
        )),
        Err(_) => Err(invalid(
            "outcome",
            format!("{value} is not an Outcome; send OUTCOME_SUCCESS, OUTCOME_FAILURE or OUTCOME_IGNORED"),
        )),
    }
}

/// The wire form of a key's state; `core` gives wall-clock times.
pub fn key_state_of(core: &Core, r: &KeyReading) -> pb::KeyState {
    let v = &r.view;
    let st = &v.stats;
    pb::KeyState {
        key: r.key.clone(),
        phase: phase_of(v.phase) as i32,
        consecutive_failures: v.consecutive_failures,
        half_open_attempts: v.half_open_attempts,
        open_remaining: v
            .open_until
            .map(|until| duration_of(until.saturating_sub(r.now))),
        free: v.free,
        queued: u32::try_from(v.queued).unwrap_or(u32::MAX),
        live_tickets: u32::try_from(v.live_tickets).unwrap_or(u32::MAX),
        waiters: u32::try_from(v.waiters).unwrap_or(u32::MAX),
        stats: Some(pb::KeyStats {
            granted: st.granted,
            probes: st.probes,
            blocked: st.blocked,
            refused: st.refused,
            denied: st.denied,
            by_reason: Reason::ALL
                .iter()
                .map(|r| (r.as_str().to_owned(), st.by_reason[*r as usize]))
                .filter(|(_, n)| *n > 0)
                .collect(),
            queued: st.queued,
            evicted: st.evicted,
            timed_out: st.timed_out,
            withdrawn: st.withdrawn,
            successes: st.successes,
            failures: st.failures,
            ignored: st.ignored,
            stale: st.stale,
            expired: st.expired,
        }),
        failure_ratio: v.failure_ratio,
        phase_changed_at: Some(timestamp_of(core.wall_time(v.changed_at))),
        limit: v.limit,
    }
}

/// Who asked, for the record of an isolate or close: the credential's
/// name when authentication is on (with the `x-fusebox-operator` header, if
/// set, as the person behind it), else the header, else the peer's address;
/// with mutual TLS, followed by the client certificate's label (its common
/// name, else its first DNS or URI name) unless that is the credential
/// (`cli:ana (certificate ops-laptop)`).
fn who<T>(request: &Request<T>, grant: Option<&Grant>) -> String {
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
enum On<'a> {
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

/// The three fusebox services over one store.
#[derive(Clone, Debug)]
pub struct Api {
    store: Store,
    node: Arc<Node>,
}

impl Api {
    /// The services of `node`.
    pub fn new(node: Arc<Node>) -> Self {
        Api {
            store: node.store().clone(),
            node,
        }
    }

    /// Who sent `request`: its grant, or `None` when authentication is off.
    fn grant<T>(&self, request: &Request<T>) -> Result<Option<Arc<Grant>>, Status> {
        // The gate found it on the headers ([`gate`]); looking it up again
        // is for calls that did not pass the gate.
        if let Some(gate::Authenticated(grant)) = request.extensions().get() {
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
    fn allow<T>(
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

#[tonic::async_trait]
impl Fusebox for Api {
    async fn acquire(
        &self,
        request: Request<pb::AcquireRequest>,
    ) -> Result<Response<pb::AcquireResponse>, Status> {
        let grant = self.grant(&request)?;
        let share = self.node.share_of(grant.as_deref());
        let _calling = decide::calling(self, share.as_ref());
        self.acquire_as(grant.as_deref(), share.as_ref(), request.into_inner())
            .await
            .map(Response::new)
    }

    async fn complete(
        &self,
        request: Request<pb::CompleteRequest>,
    ) -> Result<Response<pb::CompleteResponse>, Status> {
        let grant = self.grant(&request)?;
        let share = self.node.share_of(grant.as_deref());
        let _calling = decide::calling(self, share.as_ref());
        self.complete_as(grant.as_deref(), share.as_ref(), request.into_inner())
            .await
            .map(Response::new)
    }

    async fn renew(
        &self,
        request: Request<pb::RenewRequest>,
    ) -> Result<Response<pb::RenewResponse>, Status> {
        let grant = self.grant(&request)?;
        let share = self.node.share_of(grant.as_deref());
        let _calling = decide::calling(self, share.as_ref());
        self.renew_as(grant.as_deref(), share.as_ref(), request.into_inner())
            .await
            .map(Response::new)
    }

    type DecideStream = decide::Answers;

    async fn decide(
        &self,
        request: Request<tonic::Streaming<pb::DecideRequest>>,
    ) -> Result<Response<Self::DecideStream>, Status> {
        decide::open(self, request).map(Response::new)
    }

    async fn acquire_batch(
        &self,
        request: Request<pb::AcquireBatchRequest>,
    ) -> Result<Response<pb::AcquireBatchResponse>, Status> {
        decide::acquire_batch(self, request)
            .await
            .map(Response::new)
    }

    async fn complete_batch(
        &self,
        request: Request<pb::CompleteBatchRequest>,
    ) -> Result<Response<pb::CompleteBatchResponse>, Status> {
        decide::complete_batch(self, request)
            .await
            .map(Response::new)
    }
}

impl Api {
    /// Acquire, by `grant` (`None`: authentication is off): the unary
    /// call's and every stream or batch frame's.
    pub(crate) async fn acquire_as(
        &self,
        grant: Option<&Grant>,
        share: Option<&Arc<Share>>,
        req: pb::AcquireRequest,
    ) -> Result<pb::AcquireResponse, Status> {
        if let Some(grant) = grant {
            grant
                .on_key(Role::Caller, "Acquire", &req.key)
                .map_err(status_of_refusal)?;
        }
        let args = AcquireArgs {
            key: req.key,
            permits: req.permits.unwrap_or(1),
            max_wait: millis_of("max_wait", req.max_wait)?.unwrap_or(0),
            lease: millis_of("lease", req.lease)?,
        };
        let reply = self
            .store
            .acquire_as(args, share)
            .await
            .map_err(status_of)?;
        let (decision, reason, retry_after) = match reply.decision {
            Decision::Granted(_) => (pb::Decision::Granted, None, None),
            Decision::Probe(_) => (pb::Decision::Probe, None, None),
            Decision::Blocked {
                reason,
                retry_after,
            } => (pb::Decision::Blocked, Some(reason), Some(retry_after)),
            Decision::Refused => (pb::Decision::Refused, None, None),
            Decision::Denied {
                reason,
                retry_after,
            } => (pb::Decision::Denied, Some(reason), retry_after),
            Decision::Queued => return Err(Status::internal("a queued request was not answered")),
        };
        Ok(pb::AcquireResponse {
            decision: decision as i32,
            ticket: reply.ticket.unwrap_or_default(),
            reason: reason.map_or(pb::Reason::Unspecified, reason_of) as i32,
            retry_after: retry_after.map(duration_of),
            lease: reply.lease_left.map(duration_of),
            phase: phase_of(reply.phase) as i32,
        })
    }

    /// Checks that `grant` may settle `ticket`: a ticket is completed or
    /// renewed only by a credential allowed on its key.
    fn allow_ticket(&self, grant: Option<&Grant>, what: &str, ticket: &str) -> Result<(), Status> {
        let Some(grant) = grant else {
            return Ok(());
        };
        grant.needs(Role::Caller, what).map_err(status_of_refusal)?;
        let key = self.store.ticket_key(ticket).map_err(status_of)?;
        grant
            .on_key(Role::Caller, what, &key)
            .map_err(status_of_refusal)
    }

    /// Complete, by `grant`.
    pub(crate) async fn complete_as(
        &self,
        grant: Option<&Grant>,
        share: Option<&Arc<Share>>,
        req: pb::CompleteRequest,
    ) -> Result<pb::CompleteResponse, Status> {
        self.allow_ticket(grant, "Complete", &req.ticket)?;
        let outcome = outcome_of(req.outcome)?;
        let done = self
            .store
            .complete_as(&req.ticket, outcome, share)
            .await
            .map_err(status_of)?;
        Ok(pb::CompleteResponse {
            stale: done.stale,
            phase: phase_of(done.phase) as i32,
        })
    }

    /// Renew, by `grant`.
    pub(crate) async fn renew_as(
        &self,
        grant: Option<&Grant>,
        share: Option<&Arc<Share>>,
        req: pb::RenewRequest,
    ) -> Result<pb::RenewResponse, Status> {
        self.allow_ticket(grant, "Renew", &req.ticket)?;
        let lease = millis_of("lease", req.lease)?;
        let left = self
            .store
            .renew_as(&req.ticket, lease, share)
            .await
            .map_err(status_of)?;
        Ok(pb::RenewResponse {
            lease: Some(duration_of(left)),
        })
    }
}

#[tonic::async_trait]
impl Admin for Api {
    async fn get_key(
        &self,
        request: Request<pb::GetKeyRequest>,
    ) -> Result<Response<pb::KeyState>, Status> {
        self.allow(
            &request,
            Role::Operator,
            "GetKey",
            On::Key(&request.get_ref().key),
        )?;
        let reading = self
            .store
            .get(&request.into_inner().key)
            .await
            .map_err(status_of)?;
        Ok(Response::new(key_state_of(self.store.core(), &reading)))
    }

    async fn isolate(
        &self,
        request: Request<pb::IsolateRequest>,
    ) -> Result<Response<pb::KeyState>, Status> {
        let grant = self.allow(
            &request,
            Role::Operator,
            "Isolate",
            On::Key(&request.get_ref().key),
        )?;
        let who = who(&request, grant.as_deref());
        let req = request.into_inner();
        let reading = self
            .store
            .isolate(&req.key, &req.reason, &who)
            .await
            .map_err(status_of)?;
        Ok(Response::new(key_state_of(self.store.core(), &reading)))
    }

    async fn close(
        &self,
        request: Request<pb::CloseRequest>,
    ) -> Result<Response<pb::KeyState>, Status> {
        let grant = self.allow(
            &request,
            Role::Operator,
            "Close",
            On::Key(&request.get_ref().key),
        )?;
        let who = who(&request, grant.as_deref());
        let req = request.into_inner();
        let reading = self
            .store
            .close(&req.key, &req.reason, &who)
            .await
            .map_err(status_of)?;
        Ok(Response::new(key_state_of(self.store.core(), &reading)))
    }

    async fn list_keys(
        &self,
        request: Request<pb::ListKeysRequest>,
    ) -> Result<Response<pb::ListKeysResponse>, Status> {
        self.allow(
            &request,
            Role::Operator,
            "ListKeys",
            On::Prefix(&request.get_ref().prefix),
        )?;
        let req = request.into_inner();
        check_prefix(&req.prefix)?;
        let phases = phases_of(&req.phases)?;
        let page_size = match req.page_size {
            n if n < 0 => return Err(invalid("page_size", "must not be negative")),
            0 => DEFAULT_PAGE_SIZE,
            n => (n as usize).min(MAX_PAGE_SIZE),
        };
        let filter = filter_of(&req.prefix, &req.phases);
        let mut cursor = if req.page_token.is_empty() {
            Some(Cursor::Start)
        } else {
            let text = page_after(&req.page_token, &filter)?;
            Some(Cursor::of_text(&text).ok_or_else(|| {
                invalid("page_token", "is not a token from a previous ListKeys page")
            })?)
        };
        let from = cursor.take().unwrap_or(Cursor::Start);
        let page = self
            .store
            .list_page(&req.prefix, &phases, &from, page_size)
            .await
            .map_err(status_of)?;
        let keys = page
            .readings
            .iter()
            .map(|r| key_state_of(self.store.core(), r))
            .collect();
        let next_page_token = match page.next {
            Some(next) => page_token(&filter, &next.text()),
            None => String::new(),
        };
        Ok(Response::new(pb::ListKeysResponse {
            keys,
            next_page_token,
        }))
    }

    type WatchStream = watch::Events;

    async fn watch(
        &self,
        request: Request<pb::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let grant = self.allow(
            &request,
            Role::Operator,
            "Watch",
            On::Prefix(&request.get_ref().prefix),
        )?;
        let prefix = request.into_inner().prefix;
        check_prefix(&prefix)?;
        Ok(Response::new(watch::stream(
            self.node.clone(),
            prefix,
            grant,
        )?))
    }

    async fn set_policy(
        &self,
        request: Request<pb::SetPolicyRequest>,
    ) -> Result<Response<pb::PolicyRule>, Status> {
        let target = request
            .get_ref()
            .rule
            .as_ref()
            .map(|r| (r.default, crate::engine::Pattern::parse(&r.r#match)));
        let on = match &target {
            Some((true, _)) => On::Everything,
            Some((false, Ok(pattern))) => On::Pattern(pattern),
            // Invalid input is named below, once the caller is known.
            _ => On::Nothing,
        };
        let grant = self.allow(&request, Role::Admin, "SetPolicy", on)?;
        let rule = request
            .into_inner()
            .rule
            .ok_or_else(|| invalid("rule", "is required"))?;
        let policy = policy::policy_of(rule.policy.unwrap_or_default())?;
        if rule.default {
            if !rule.r#match.is_empty() {
                return Err(invalid("rule.match", "must be empty for the default rule"));
            }
            self.store.set_default(policy).map_err(status_of)?;
            tracing::info!("default policy set at run time");
        } else {
            let pattern = crate::engine::Pattern::parse(&rule.r#match)
                .map_err(|problem| invalid("rule.match", problem))?;
            check_prefix(&rule.r#match).map_err(|_| {
                invalid(
                    "rule.match",
                    "must be at most 256 bytes without control characters",
                )
            })?;
            // A credential limited to some prefixes holds the rules in
            // force inside them, up to its share; one with every key is
            // held by `max_rules` alone unless its entry sets
            // `limits.max_rules` (decisions 99).
            let grant = grant.filter(|g| !g.scope.is_all() || g.allowance.max_rules.is_some());
            let share = grant.as_deref().and_then(|g| self.node.share_of(Some(g)));
            let covers = |p: &crate::engine::Pattern| {
                grant.as_ref().is_some_and(|g| g.scope.covers_pattern(p))
            };
            let position = self
                .store
                .set_rule_within(
                    crate::engine::Rule { pattern, policy },
                    share
                        .as_deref()
                        .map(|s| (s, &covers as &dyn Fn(&_) -> bool)),
                )
                .map_err(status_of)?;
            tracing::info!(r#match = %rule.r#match, position = position + 1, "policy set at run time");
        }
        Ok(Response::new(pb::PolicyRule {
            r#match: rule.r#match,
            policy: Some(policy::wire_policy(&policy)),
            default: rule.default,
        }))
    }

    async fn delete_policy(
        &self,
        request: Request<pb::DeletePolicyRequest>,
    ) -> Result<Response<()>, Status> {
        match crate::engine::Pattern::parse(&request.get_ref().r#match) {
            Ok(pattern) => self.allow(&request, Role::Admin, "DeletePolicy", On::Pattern(&pattern)),
            Err(_) => self.allow(&request, Role::Admin, "DeletePolicy", On::Nothing),
        }?;
        let pattern = request.into_inner().r#match;
        if pattern.is_empty() {
            return Err(invalid(
                "match",
                "is required; the default rule cannot be deleted, only replaced",
            ));
        }
        self.store.delete_rule(&pattern).map_err(status_of)?;
        tracing::info!(r#match = %pattern, "policy deleted at run time");
        Ok(Response::new(()))
    }

    async fn list_policies(
        &self,
        request: Request<pb::ListPoliciesRequest>,
    ) -> Result<Response<pb::ListPoliciesResponse>, Status> {
        let grant = self.allow(&request, Role::Operator, "ListPolicies", On::Nothing)?;
        let rules = self.store.rules();
        Ok(Response::new(pb::ListPoliciesResponse {
            // A credential sees the rules inside its keys only: another
            // namespace's rules name its keys.
            rules: rules
                .rules
                .iter()
                .filter(|r| {
                    grant.as_ref().is_none_or(|g| {
                        g.on_pattern(Role::Operator, "ListPolicies", &r.pattern)
                            .is_ok()
                    })
                })
                .map(|r| pb::PolicyRule {
                    r#match: r.pattern.text(),
                    policy: Some(policy::wire_policy(&r.policy)),
                    default: false,
                })
                .collect(),
            default: Some(pb::PolicyRule {
                r#match: String::new(),
                policy: Some(policy::wire_policy(&rules.default)),
                default: true,
            }),
        }))
    }
}

/// Page size of ListKeys when the request names none.
pub const DEFAULT_PAGE_SIZE: usize = 100;
/// The largest page of ListKeys.
pub const MAX_PAGE_SIZE: usize = 1000;

fn check_prefix(prefix: &str) -> Result<(), Status> {
    if prefix.len() > crate::domain::key::MAX_KEY_BYTES {
        return Err(invalid("prefix", "must be at most 256 bytes"));
    }
    if prefix.chars().any(crate::domain::key::is_control) {
        return Err(invalid("prefix", "must not contain control characters"));
    }
    Ok(())
}

fn phases_of(values: &[i32]) -> Result<Vec<Phase>, Status> {
    values
        .iter()
        .map(|&v| match pb::Phase::try_from(v) {
            Ok(pb::Phase::Closed) => Ok(Phase::Closed),
            Ok(pb::Phase::Open) => Ok(Phase::Open),
            Ok(pb::Phase::HalfOpen) => Ok(Phase::HalfOpen),
            Ok(pb::Phase::Isolated) => Ok(Phase::Isolated),
            _ => Err(invalid("phases", format!("{v} is not a phase"))),
        })
        .collect()
}

#[tonic::async_trait]
impl Clock for Api {
    async fn advance(
        &self,
        request: Request<pb::AdvanceRequest>,
    ) -> Result<Response<pb::ClockReading>, Status> {
        self.allow(&request, Role::Admin, "Clock.Advance", On::Everything)?;
        if !self.store.core().has_manual_clock() {
            return Err(Status::unimplemented(
                "the clock is not manual: start the server with --manual-clock to move time by hand",
            ));
        }
        let by = millis_of("by", request.into_inner().by)?.unwrap_or(0);
        let now = self
            .store
            .advance_clock(by)
            .await
            .ok_or_else(|| Status::internal("the manual clock is missing"))?;
        Ok(Response::new(pb::ClockReading {
            now: Some(duration_of(now)),
        }))
    }
}

const SERVICES: [&str; 3] = ["fusebox.v1.Fusebox", "fusebox.v1.Admin", "fusebox.v1.Clock"];

/// Serves fusebox on `listener` until `shutdown` resolves, then reports
/// NOT_SERVING, answers waiters, stops accepting, lets in-flight calls
/// finish (up to [`SHUTDOWN_GRACE`]) and returns: at once when no call is
/// in flight, whatever idle connections are open.
pub async fn run(
    listener: tokio::net::TcpListener,
    node: Arc<Node>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    run_with_tls(listener, node, None, shutdown).await
}

/// Like [`run`]; with `tls`, every connection is a TLS one (see [`tls`]).
pub async fn run_with_tls(
    listener: tokio::net::TcpListener,
    node: Arc<Node>,
    tls: Option<tls::Acceptor>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let store = node.store().clone();
    let core = store.core().clone();
    let manual = core.has_manual_clock();
    let served: Vec<&str> = SERVICES
        .iter()
        .copied()
        .filter(|s| manual || *s != "fusebox.v1.Clock")
        .collect();
    let (health, health_service) = tonic_health::server::health_reporter();
    for name in &served {
        health
            .set_service_status(*name, tonic_health::ServingStatus::Serving)
            .await;
    }
    let mut reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(crate::proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .with_service_name("grpc.health.v1.Health")
        .with_service_name("grpc.reflection.v1.ServerReflection");
    for name in &served {
        reflection = reflection.with_service_name(*name);
    }
    let reflection = reflection.build_v1()?;

    let api = Api::new(node.clone());
    let timer = {
        let store = store.clone();
        tokio::spawn(async move { store.run_timer().await })
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let limits = node.limits().connections();
    let incoming = crate::connections::incoming(
        listener,
        limits,
        node.watch_access(),
        crate::connections::MaybeTls(tls),
    );
    let in_flight = Arc::new(calls::InFlight::default());
    let streams = u32::try_from(limits.max_streams_per_connection).unwrap_or(u32::MAX);
    let routes = tonic::service::Routes::new(
        FuseboxServer::new(api.clone())
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES),
    )
    .add_service(
        AdminServer::new(api.clone())
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_ADMIN_REPLY_BYTES),
    )
    // Always routed, so that callers without --manual-clock get
    // UNIMPLEMENTED with a message that says what to do (X1).
    .add_service(ClockServer::new(api.clone()).max_decoding_message_size(MAX_MESSAGE_BYTES))
    .add_service(health_service)
    .add_service(reflection)
    .prepare();
    let service = tower::ServiceBuilder::new()
        // The gate first: a call without a credential is not in flight.
        .layer(gate::GateLayer(node.clone()))
        .layer(calls::CallsLayer(in_flight.clone()))
        .service(routes);
    let settings = transport::Settings {
        max_streams: streams,
        // What a client may send ahead of the server's reading (decisions
        // 101): a stream that stops reading holds at most this much.
        stream_window: RECEIVE_WINDOW_PER_STREAM,
        connection_window: RECEIVE_WINDOW_PER_CONNECTION,
        keep_alive: Duration::from_secs(30),
    };
    let server = transport::serve(incoming, service, settings, async {
        let _ = stop_rx.await;
    });
    tokio::pin!(server);
    tokio::pin!(shutdown);
    tokio::select! {
        () = &mut server => {
            timer.abort();
            return Ok(());
        }
        () = &mut shutdown => {}
    }
    tracing::info!(
        "shutting down: reporting NOT_SERVING, answering waiters, finishing in-flight calls"
    );
    health
        .set_service_status("", tonic_health::ServingStatus::NotServing)
        .await;
    for name in &served {
        health
            .set_service_status(*name, tonic_health::ServingStatus::NotServing)
            .await;
    }
    store.shutdown();
    let _ = stop_tx.send(());
    // Done when the server has closed every connection, or as soon as no
    // call is in flight (idle connections are not waited for), or at the
    // end of the grace.
    let grace = tokio::time::sleep(SHUTDOWN_GRACE);
    tokio::pin!(grace);
    tokio::select! {
        () = &mut server => {}
        () = in_flight.idle() => {
            let _ = tokio::time::timeout(SHUTDOWN_FLUSH, &mut server).await;
        }
        () = &mut grace => tracing::warn!(
            calls = in_flight.count(),
            "{} calls were still open {} s after shutdown began; exiting anyway",
            in_flight.count(),
            SHUTDOWN_GRACE.as_secs()
        ),
    }
    timer.abort();
    tracing::info!("stopped");
    Ok(())
}

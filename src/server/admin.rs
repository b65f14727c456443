//! The `Admin` service (keys, isolate and close, Watch, policies) and the
//! `Clock` service (`--manual-clock`).

use tonic::{Request, Response, Status};

use crate::auth::Role;
use crate::domain::OperatorAction;
use crate::engine::Cursor;
use crate::proto::v1 as pb;
use crate::proto::wire::{duration_of, filter_of, millis_of, page_after, page_token};
use pb::admin_server::Admin;
use pb::clock_server::Clock;

use super::api::{who, Api, On};
use super::policy;
use super::status::{invalid, status_of};
use super::watch;
use super::wire::{check_prefix, key_state_of, phases_of};

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
        let pb::IsolateRequest { key, reason } = request.get_ref();
        self.operate(&request, key, reason, OperatorAction::Isolate)
            .await
    }

    async fn close(
        &self,
        request: Request<pb::CloseRequest>,
    ) -> Result<Response<pb::KeyState>, Status> {
        let pb::CloseRequest { key, reason } = request.get_ref();
        self.operate(&request, key, reason, OperatorAction::Close)
            .await
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
            self.bounds.clone(),
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

impl Api {
    /// `Isolate` or `Close` (`action`) of `key`, for `reason`: checked
    /// against the caller's grant, recorded with who asked, answered with
    /// the key's state.
    async fn operate<T>(
        &self,
        request: &Request<T>,
        key: &str,
        reason: &str,
        action: OperatorAction,
    ) -> Result<Response<pb::KeyState>, Status> {
        let grant = self.allow(request, Role::Operator, action.as_str(), On::Key(key))?;
        let who = who(request, grant.as_deref());
        let reading = self
            .store
            .operate(key, reason, &who, action)
            .await
            .map_err(status_of)?;
        Ok(Response::new(key_state_of(self.store.core(), &reading)))
    }
}

/// Page size of ListKeys when the request names none.
pub const DEFAULT_PAGE_SIZE: usize = 100;
/// The largest page of ListKeys.
pub const MAX_PAGE_SIZE: usize = 1000;

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

//! Envoy's rate-limit service (`envoy.service.ratelimit.v3.RateLimitService`)
//! on the gRPC port: checks the request, maps its descriptors to keys
//! through the config's `[rls]` ([`crate::rls::Rls`]), authorizes them as
//! Acquire is, hands the charges to the store and turns the quotes into
//! the protocol's statuses (docs/contract-extensions.md, RL1–RL15).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::api::Api;
use super::status::{status_of, status_of_refusal};
use crate::auth::Role;
use crate::domain::{Policy, Quote};
use crate::engine::budgets::NodeUse;
use crate::engine::shares::Share;
use crate::engine::{ChargeItem, EngineError};
use crate::node::RlsTrouble;
use crate::proto::envoy::service::ratelimit::v3 as rls;
use crate::rls::{Action, Budget, Limit, NoRoom};
use crate::telemetry::KeyValue;
use rls::rate_limit_response::{Code, DescriptorStatus, RateLimit};

/// What one descriptor of a request does.
enum Plan {
    /// No configured limit: OK, nothing charged.
    Free,
    /// Charged at `key` with `permits`; `shadow` never refuses.
    Charge {
        key: String,
        permits: u32,
        limit: Limit,
        shadow: bool,
        policy: Option<Arc<Policy>>,
        budget: Option<Budget>,
    },
    /// A new key past its node's budget (RL20): answered as `[rls]
    /// no_room` says, nothing made.
    OverBudget { limit: Limit, shadow: bool },
}

#[tonic::async_trait]
impl rls::rate_limit_service_server::RateLimitService for Api {
    async fn should_rate_limit(
        &self,
        request: Request<rls::RateLimitRequest>,
    ) -> Result<Response<rls::RateLimitResponse>, Status> {
        let mut trace = self.trace(
            &request,
            "envoy.service.ratelimit.v3.RateLimitService",
            "ShouldRateLimit",
        );
        // The domain as sent, at most 128 bytes (it is checked later).
        let domain = &request.get_ref().domain;
        trace.attribute(|| {
            let end = (0..=domain.len().min(128))
                .rev()
                .find(|i| domain.is_char_boundary(*i))
                .unwrap_or(0);
            KeyValue::new("fusebox.rls.domain", domain[..end].to_owned())
        });
        let answer = self.should_rate_limit_traced(request).await;
        if let Ok(response) = &answer {
            let code = Code::try_from(response.get_ref().overall_code).unwrap_or(Code::Unknown);
            trace.attribute(|| KeyValue::new("fusebox.decision", code.as_str_name()));
        }
        trace.ended(&answer);
        answer
    }
}

impl Api {
    /// ShouldRateLimit, inside its span: a check refused whole is counted
    /// by its code and logged (RL18).
    async fn should_rate_limit_traced(
        &self,
        request: Request<rls::RateLimitRequest>,
    ) -> Result<Response<rls::RateLimitResponse>, Status> {
        let answer = self.decide_rate_limit(request).await;
        if let Err(status) = &answer {
            let trouble = match status.code() {
                tonic::Code::InvalidArgument => RlsTrouble::InvalidArgument,
                tonic::Code::Unauthenticated => RlsTrouble::Unauthenticated,
                tonic::Code::PermissionDenied => RlsTrouble::PermissionDenied,
                _ => RlsTrouble::Unavailable,
            };
            self.node.counters().rls_trouble(trouble, || {
                format!(
                    "refused whole with {:?}: {}; Envoy applies failure_mode_deny",
                    status.code(),
                    status.message()
                )
            });
        }
        answer
    }

    /// ShouldRateLimit: maps the descriptors, charges the enforced ones
    /// all or nothing, each shadow one alone.
    async fn decide_rate_limit(
        &self,
        request: Request<rls::RateLimitRequest>,
    ) -> Result<Response<rls::RateLimitResponse>, Status> {
        let grant = self.grant(&request)?;
        let share = self.node.share_of(grant.as_deref());
        let _calling = super::decide::calling(self, share.as_ref());
        let req = request.into_inner();
        let config = self.node.rls();
        check(&req, &config)?;
        let default_hits = if req.hits_addend == 0 {
            1
        } else {
            req.hits_addend
        };
        let mut plans = Vec::with_capacity(req.descriptors.len());
        for (i, d) in req.descriptors.iter().enumerate() {
            let entries: Vec<(&str, &str)> = d
                .entries
                .iter()
                .map(|e| (e.key.as_str(), e.value.as_str()))
                .collect();
            let Some(matched) = config.lookup(&req.domain, &entries) else {
                self.node
                    .counters()
                    .rls_unmatched
                    .fetch_add(1, Ordering::Relaxed);
                plans.push(Plan::Free);
                continue;
            };
            if matched.digested {
                self.node
                    .counters()
                    .rls_trouble(RlsTrouble::Digested, || {
                        format!(
                            "descriptors[{i}] of domain {:?}: its values are longer than [rls] max_value_bytes ({}) or make too long a key; counted at a key of their digest, {}",
                            req.domain, config.max_value_bytes, matched.key
                        )
                    });
            }
            let (limit, shadow, budget) = match matched.action {
                Action::Unlimited => {
                    plans.push(Plan::Free);
                    continue;
                }
                Action::Limit {
                    limit,
                    shadow,
                    budget,
                } => (limit, shadow, budget),
            };
            let hits = d.hits_addend.unwrap_or(u64::from(default_hits));
            let permits = u32::try_from(hits).map_err(|_| {
                Status::invalid_argument(format!(
                    "descriptors[{i}].hits_addend: {hits} is more than fusebox counts in one request ({})",
                    u32::MAX
                ))
            })?;
            // A descriptor's own limit: its own key and policy (RL15).
            let (key, limit, policy) = match &d.limit {
                Some(o) => {
                    let (key, limit, policy) =
                        crate::rls::overridden(&matched.key, &limit, o.requests_per_unit, o.unit)
                            .map_err(|problem| {
                            Status::invalid_argument(format!("descriptors[{i}].limit.{problem}"))
                        })?;
                    (key, limit, Some(Arc::new(policy)))
                }
                None => (matched.key, limit, None),
            };
            // Every key is checked before anything is charged (RL2), so
            // that no descriptor is refused after another was charged.
            crate::domain::validate_key(&key).map_err(|e| {
                let text = e.to_string();
                Status::invalid_argument(format!(
                    "descriptors[{i}]: the key it maps to {}; shorten its values",
                    text.strip_prefix("key: ").unwrap_or(&text)
                ))
            })?;
            if let Some(grant) = &grant {
                grant
                    .on_key(Role::Caller, "ShouldRateLimit", &key)
                    .map_err(status_of_refusal)?;
            }
            plans.push(Plan::Charge {
                key,
                permits,
                limit,
                shadow,
                policy,
                budget,
            });
        }
        // Every descriptor is checked (RL2) before a node's budget counts
        // a key (RL20).
        self.count_in_budgets(&mut plans, share.as_ref(), &req.domain, &config);
        // A descriptor past its budget makes the request over limit under
        // `no_room = "over_limit"`: the others are read, not charged (RL18).
        let refused = config.no_room == NoRoom::OverLimit
            && plans
                .iter()
                .any(|p| matches!(p, Plan::OverBudget { shadow: false, .. }));
        // The enforced descriptors are charged together, all or nothing;
        // each shadow one alone, so that it never holds the others back.
        let enforced: Vec<ChargeItem> = plans
            .iter()
            .filter_map(|p| match p {
                Plan::Charge {
                    key,
                    permits,
                    shadow: false,
                    policy,
                    ..
                } => Some(ChargeItem {
                    key: key.clone(),
                    permits: if refused { 0 } else { *permits },
                    policy: policy.clone(),
                }),
                _ => None,
            })
            .collect();
        let mut enforced_quotes = if enforced.is_empty() {
            Vec::new()
        } else {
            self.charge_enforced(&enforced, share.as_ref(), config.no_room)
                .await?
        }
        .into_iter();
        let mut statuses = Vec::with_capacity(plans.len());
        let mut over = false;
        for plan in plans {
            let (key, permits, limit, shadow, policy) = match plan {
                Plan::Charge {
                    key,
                    permits,
                    limit,
                    shadow,
                    policy,
                    ..
                } => (key, permits, limit, shadow, policy),
                // Past its node's budget (RL20): as RL18 says, and a
                // shadow one as if it were not there (RL7).
                Plan::OverBudget {
                    limit,
                    shadow: false,
                } => {
                    let (status, refused) = status_of_no_room(&limit, config.no_room);
                    over |= refused;
                    statuses.push(status);
                    continue;
                }
                Plan::Free | Plan::OverBudget { .. } => {
                    statuses.push(DescriptorStatus {
                        code: Code::Ok as i32,
                        ..DescriptorStatus::default()
                    });
                    continue;
                }
            };
            let quote = if shadow {
                // A shadow descriptor never changes the answer: when its
                // own charge cannot be made (the enforced ones are already
                // charged), it is OK without figures, and the log says why.
                let reply = match self
                    .store
                    .charge_all(
                        &[ChargeItem {
                            key: key.clone(),
                            permits,
                            policy,
                        }],
                        share.as_ref(),
                    )
                    .await
                {
                    Ok(reply) => reply,
                    Err(e) => {
                        if let Some(held) = self.node.counters().rls_shadow_logged.pass() {
                            tracing::warn!(key = %key, error = %e, similar_held_back = held, "a shadow_mode descriptor could not be counted; answered OK without figures");
                        }
                        statuses.push(DescriptorStatus {
                            code: Code::Ok as i32,
                            ..DescriptorStatus::default()
                        });
                        continue;
                    }
                };
                // What Envoy acts on never changes (RL7): the status is OK
                // without figures, as if the descriptor were not there; the
                // would-be answer is counted, logged and on the key's Watch.
                if !reply.quotes[0].fits {
                    let counters = self.node.counters();
                    counters
                        .rls_shadow_over_limit
                        .fetch_add(1, Ordering::Relaxed);
                    if let Some(held) = counters.rls_shadow_logged.pass() {
                        tracing::info!(key = %key, similar_held_back = held, "a shadow_mode descriptor is over its limit; answered OK (shadow_mode never refuses)");
                    }
                }
                statuses.push(DescriptorStatus {
                    code: Code::Ok as i32,
                    ..DescriptorStatus::default()
                });
                continue;
            } else {
                let quote = enforced_quotes
                    .next()
                    .ok_or_else(|| Status::internal("a charge answered fewer quotes than asked"))?;
                match quote {
                    Some(quote) => {
                        over |= !quote.fits;
                        quote
                    }
                    // Its key could not be made (RL18).
                    None => {
                        let (status, refused) = status_of_no_room(&limit, config.no_room);
                        over |= refused;
                        statuses.push(status);
                        continue;
                    }
                }
            };
            statuses.push(status_of_quote(&quote, &limit));
        }
        let counters = self.node.counters();
        counters.rls_requests.fetch_add(1, Ordering::Relaxed);
        if over {
            counters.rls_over_limit.fetch_add(1, Ordering::Relaxed);
        }
        Ok(Response::new(rls::RateLimitResponse {
            overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
            statuses,
            ..rls::RateLimitResponse::default()
        }))
    }
}

impl Api {
    /// Counts each planned key of a node that takes any value in that
    /// node's budget (RL20); a new key past it becomes
    /// [`Plan::OverBudget`], counted and logged.
    fn count_in_budgets(
        &self,
        plans: &mut [Plan],
        share: Option<&Arc<Share>>,
        domain: &str,
        config: &crate::rls::Rls,
    ) {
        for (i, plan) in plans.iter_mut().enumerate() {
            let Plan::Charge {
                key,
                limit,
                shadow,
                budget: Some(budget),
                ..
            } = plan
            else {
                continue;
            };
            let used = NodeUse {
                node: &budget.node,
                key,
                max_keys: budget.max_keys,
                part: config.budget_part(),
                rests_within: limit.rests_within(),
            };
            let Err(most) = self.store.use_node_key(share, used) else {
                continue;
            };
            self.node.counters().rls_trouble(RlsTrouble::OverBudget, || {
                format!(
                    "descriptors[{i}] of domain {domain:?}: a new key, {key}, is past the budget of its node {} ({most} keys{}{}); answered {} as [rls] no_room says",
                    budget.node,
                    if budget.max_keys.is_some() { ", its max_keys" } else { ", its part of the key share" },
                    share.map(|s| format!(" for {:?}", s.name())).unwrap_or_default(),
                    match (*shadow, config.no_room) {
                        (true, _) => "OK without figures (shadow_mode)",
                        (false, NoRoom::OverLimit) => "OVER_LIMIT",
                        (false, NoRoom::Ok) => "OK, uncharged",
                    }
                )
            });
            *plan = Plan::OverBudget {
                limit: limit.clone(),
                shadow: *shadow,
            };
        }
    }

    /// Charges the enforced descriptors all or nothing (RL6). A key that
    /// cannot be made (the key cap, the credential's share) does not fail
    /// the check (RL18): its descriptor's quote is `None`, the keys that
    /// exist are still decided, and under `no_room = "over_limit"` nothing
    /// is charged (their figures as they stand).
    async fn charge_enforced(
        &self,
        items: &[ChargeItem],
        share: Option<&Arc<Share>>,
        no_room: NoRoom,
    ) -> Result<Vec<Option<Quote>>, Status> {
        let refusal = match self.store.charge_all(items, share).await {
            Ok(reply) => return Ok(reply.quotes.into_iter().map(Some).collect()),
            Err(e) if is_no_room(&e) => e,
            Err(e) => return Err(unavailable_or(e)),
        };
        let mut live = Vec::with_capacity(items.len());
        for item in items {
            let (_, is_live) = self.store.read(&item.key).await.map_err(unavailable_or)?;
            live.push(is_live);
        }
        let counters = self.node.counters();
        for (item, _) in items.iter().zip(&live).filter(|(_, l)| !**l) {
            counters.rls_trouble(RlsTrouble::NoRoom, || {
                format!(
                    "no room for the key {}: {refusal}; answered {} as [rls] no_room says",
                    item.key,
                    match no_room {
                        NoRoom::OverLimit => "OVER_LIMIT",
                        NoRoom::Ok => "OK, uncharged",
                    }
                )
            });
        }
        let refused = no_room == NoRoom::OverLimit && live.contains(&false);
        let kept: Vec<ChargeItem> = items
            .iter()
            .zip(&live)
            .filter(|(_, l)| **l)
            .map(|(item, _)| ChargeItem {
                // Over limit already: the others are read, not charged.
                permits: if refused { 0 } else { item.permits },
                ..item.clone()
            })
            .collect();
        let quotes = if kept.is_empty() {
            Vec::new()
        } else {
            match self.store.charge_all(&kept, share).await {
                Ok(reply) => reply.quotes,
                // Room went meanwhile: every key is answered as no room.
                Err(e) if is_no_room(&e) => return Ok(vec![None; items.len()]),
                Err(e) => return Err(unavailable_or(e)),
            }
        };
        let mut quotes = quotes.into_iter();
        Ok(live
            .iter()
            .map(|&l| if l { quotes.next() } else { None })
            .collect())
    }
}

/// True when a charge was refused because a key could not be made.
fn is_no_room(e: &EngineError) -> bool {
    matches!(
        e,
        EngineError::Exhausted { .. }
            | EngineError::ShareExhausted { .. }
            | EngineError::StoreFull(_)
    )
}

/// The status of a descriptor whose key could not be made, and whether
/// it makes the request over limit (RL18): `OVER_LIMIT` with its limit,
/// nothing remaining and a reset one unit away; or `OK` without figures.
fn status_of_no_room(limit: &Limit, no_room: NoRoom) -> (DescriptorStatus, bool) {
    match no_room {
        NoRoom::Ok => (
            DescriptorStatus {
                code: Code::Ok as i32,
                ..DescriptorStatus::default()
            },
            false,
        ),
        NoRoom::OverLimit => (
            DescriptorStatus {
                code: Code::OverLimit as i32,
                current_limit: Some(RateLimit {
                    name: String::new(),
                    requests_per_unit: limit.requests_per_unit,
                    unit: limit.unit,
                }),
                limit_remaining: 0,
                duration_until_reset: Some(prost_types::Duration {
                    seconds: crate::rls::unit_seconds(limit.unit),
                    nanos: 0,
                }),
                quota: None,
            },
            true,
        ),
    }
}

/// A descriptor's status from its quote: `current_limit`,
/// `limit_remaining` and `duration_until_reset` are what Envoy turns into
/// its `x-ratelimit-limit`, `-remaining` and `-reset` headers (RL16): the
/// reset in whole seconds, rounded up and at least 1 (Envoy reads only
/// the seconds), and the remaining never above the limit it is shown with
/// (a token bucket's burst may hold more).
fn status_of_quote(quote: &Quote, limit: &Limit) -> DescriptorStatus {
    let reset = quote.reset_in.unwrap_or(0).div_ceil(1000).max(1);
    DescriptorStatus {
        code: if quote.fits {
            Code::Ok
        } else {
            Code::OverLimit
        } as i32,
        current_limit: Some(RateLimit {
            name: String::new(),
            requests_per_unit: limit.requests_per_unit,
            unit: limit.unit,
        }),
        limit_remaining: quote.remaining.min(limit.requests_per_unit),
        duration_until_reset: Some(prost_types::Duration {
            seconds: i64::try_from(reset).unwrap_or(i64::MAX),
            nanos: 0,
        }),
        quota: None,
    }
}

/// Every engine error is Envoy's "cannot decide": a cap, a store that is
/// down. Only bad input and a deadline that passed before the decision
/// (F1: nothing was charged) keep their own codes; nothing is UNKNOWN.
fn unavailable_or(e: crate::engine::EngineError) -> Status {
    let status = status_of(e);
    match status.code() {
        tonic::Code::InvalidArgument | tonic::Code::DeadlineExceeded => status,
        _ => Status::unavailable(status.message().to_owned()),
    }
}

/// Bad input is refused whole, naming the field (RL2).
fn check(req: &rls::RateLimitRequest, config: &crate::rls::Rls) -> Result<(), Status> {
    let bad =
        |field: String, problem: String| Status::invalid_argument(format!("{field}: {problem}"));
    let max = config.max_value_bytes as usize;
    if req.domain.is_empty() {
        return Err(bad("domain".into(), "must not be empty".into()));
    }
    if req.domain.len() > max {
        return Err(bad(
            "domain".into(),
            format!(
                "is {} bytes, more than [rls] max_value_bytes ({max})",
                req.domain.len()
            ),
        ));
    }
    if req.descriptors.is_empty() {
        return Err(bad(
            "descriptors".into(),
            "must name at least one descriptor".into(),
        ));
    }
    if req.descriptors.len() > config.max_descriptors as usize {
        return Err(bad(
            "descriptors".into(),
            format!(
                "has {}, more than [rls] max_descriptors ({})",
                req.descriptors.len(),
                config.max_descriptors
            ),
        ));
    }
    for (i, d) in req.descriptors.iter().enumerate() {
        if d.entries.is_empty() {
            return Err(bad(
                format!("descriptors[{i}].entries"),
                "must not be empty".into(),
            ));
        }
        if d.entries.len() > config.max_entries as usize {
            return Err(bad(
                format!("descriptors[{i}].entries"),
                format!(
                    "has {}, more than [rls] max_entries ({})",
                    d.entries.len(),
                    config.max_entries
                ),
            ));
        }
        if let Some(hits) = d.hits_addend.filter(|h| *h > u64::from(u32::MAX)) {
            return Err(bad(
                format!("descriptors[{i}].hits_addend"),
                format!(
                    "{hits} is more than fusebox counts in one request ({})",
                    u32::MAX
                ),
            ));
        }
        for (j, e) in d.entries.iter().enumerate() {
            if e.key.is_empty() || e.key.len() > max {
                return Err(bad(
                    format!("descriptors[{i}].entries[{j}].key"),
                    format!("must be 1 to {max} bytes ([rls] max_value_bytes)"),
                ));
            }
        }
    }
    Ok(())
}

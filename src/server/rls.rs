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
use crate::engine::ChargeItem;
use crate::proto::envoy::service::ratelimit::v3 as rls;
use crate::rls::{Action, Limit};
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
    },
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
    /// ShouldRateLimit, inside its span.
    async fn should_rate_limit_traced(
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
            let (limit, shadow) = match matched.action {
                Action::Unlimited => {
                    plans.push(Plan::Free);
                    continue;
                }
                Action::Limit { limit, shadow } => (limit, shadow),
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
            });
        }
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
                    permits: *permits,
                    policy: policy.clone(),
                }),
                _ => None,
            })
            .collect();
        let mut enforced_quotes = if enforced.is_empty() {
            Vec::new()
        } else {
            self.store
                .charge_all(&enforced, share.as_ref())
                .await
                .map_err(unavailable_or)?
                .quotes
        }
        .into_iter();
        let mut statuses = Vec::with_capacity(plans.len());
        let mut over = false;
        for plan in plans {
            let Plan::Charge {
                key,
                permits,
                limit,
                shadow,
                policy,
            } = plan
            else {
                statuses.push(DescriptorStatus {
                    code: Code::Ok as i32,
                    ..DescriptorStatus::default()
                });
                continue;
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
                        tracing::warn!(key = %key, error = %e, "a shadow_mode descriptor could not be counted; answered OK without figures");
                        statuses.push(DescriptorStatus {
                            code: Code::Ok as i32,
                            ..DescriptorStatus::default()
                        });
                        continue;
                    }
                };
                let quote = reply.quotes[0];
                if !quote.fits {
                    self.node
                        .counters()
                        .rls_shadow_over_limit
                        .fetch_add(1, Ordering::Relaxed);
                }
                quote
            } else {
                let quote = enforced_quotes
                    .next()
                    .ok_or_else(|| Status::internal("a charge answered fewer quotes than asked"))?;
                over |= !quote.fits;
                quote
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

/// A descriptor's status from its quote: `current_limit`,
/// `limit_remaining` and `duration_until_reset` are what Envoy turns into
/// its `x-ratelimit-limit`, `-remaining` and `-reset` headers.
fn status_of_quote(quote: &Quote, limit: &Limit) -> DescriptorStatus {
    let reset = quote.reset_in.unwrap_or(0);
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
        limit_remaining: quote.remaining,
        duration_until_reset: Some(prost_types::Duration {
            seconds: i64::try_from(reset / 1000).unwrap_or(i64::MAX),
            nanos: i32::try_from((reset % 1000) * 1_000_000).unwrap_or(0),
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
            if e.value.len() > max {
                return Err(bad(
                    format!("descriptors[{i}].entries[{j}].value"),
                    format!(
                        "is {} bytes, more than [rls] max_value_bytes ({max})",
                        e.value.len()
                    ),
                ));
            }
        }
    }
    Ok(())
}

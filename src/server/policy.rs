//! Policies on the wire: structured messages converted to and from the
//! config's specs, so that `SetPolicy` is validated exactly like the config
//! file (Y2), with errors that name the wire field.

use tonic::Status;

use crate::domain::policy::{
    BreakerSpec, HalfOpenSpec, LeaseSpec, LimiterSpec, RetryBudgetSpec, SlowSpec,
};
use crate::domain::{
    DurationSpec, HalfOpen, LimiterKind, Order, Outcome, Policy, PolicySpec, Trip,
};
use crate::proto::v1 as pb;

use super::status::status_of;
use crate::engine::EngineError;
use crate::proto::wire::{duration_of, millis_of};

fn duration(
    field: &'static str,
    d: Option<prost_types::Duration>,
) -> Result<Option<DurationSpec>, Status> {
    Ok(millis_of(field, d)?.map(DurationSpec))
}

/// The wire path of a field that the config names `config_field`: the wire
/// spells `break` as `break_duration` and the lease's `default`/`max` as
/// `default_lease`/`max_lease`, and keeps the mode's and the kind's own
/// settings inside their oneof message (`breaker.consecutive.failures`,
/// `limiter.token_bucket.refill`). `limiter_kind` is the limiter's kind,
/// which is also the name of its oneof field.
fn wire_field(config_field: &str, limiter_kind: Option<&str>) -> String {
    let wire = match config_field {
        "breaker.break" => "breaker.break_duration".to_owned(),
        "breaker.failures" => "breaker.consecutive.failures".to_owned(),
        "breaker.failure_ratio" | "breaker.minimum_throughput" | "breaker.sampling_window" => {
            config_field.replacen("breaker.", "breaker.ratio.", 1)
        }
        "limiter.permits" | "limiter.capacity" | "limiter.refill" | "limiter.period"
        | "limiter.window" | "limiter.segments" | "limiter.min" | "limiter.max"
        | "limiter.initial" => match limiter_kind {
            Some(kind) => config_field.replacen("limiter.", &format!("limiter.{kind}."), 1),
            None => config_field.to_owned(),
        },
        "lease.default" => "lease.default_lease".to_owned(),
        "lease.max" => "lease.max_lease".to_owned(),
        other => other.to_owned(),
    };
    format!("policy.{wire}")
}

/// Reads and validates a wire policy.
pub fn policy_of(p: pb::Policy) -> Result<Policy, Status> {
    let breaker = match p.breaker {
        None => None,
        Some(b) => {
            let mut spec = BreakerSpec {
                break_: duration("policy.breaker.break_duration", b.break_duration)?,
                multiplier: b.multiplier,
                max_break: duration("policy.breaker.max_break", b.max_break)?,
                probe_lease: duration("policy.breaker.probe_lease", b.probe_lease)?,
                slow: match b.slow {
                    None => None,
                    Some(s) => Some(SlowSpec {
                        duration: duration("policy.breaker.slow.duration", s.duration)?,
                        ratio: Some(s.ratio),
                    }),
                },
                half_open: b.half_open.map(|h| HalfOpenSpec {
                    probes: h.probes,
                    successes: h.successes,
                }),
                quorum: b.quorum,
                ..BreakerSpec::default()
            };
            match b.mode {
                Some(pb::breaker::Mode::Consecutive(c)) => {
                    spec.mode = "consecutive".into();
                    spec.failures = Some(c.failures);
                }
                Some(pb::breaker::Mode::Ratio(r)) => {
                    spec.mode = "ratio".into();
                    spec.failure_ratio = Some(r.failure_ratio);
                    spec.minimum_throughput = Some(r.minimum_throughput);
                    spec.sampling_window =
                        duration("policy.breaker.ratio.sampling_window", r.sampling_window)?;
                }
                None => {
                    return Err(status_of(EngineError::Invalid {
                        field: "policy.breaker.mode",
                        problem: "is required: set consecutive or ratio".into(),
                    }))
                }
            }
            Some(spec)
        }
    };
    let limiter = match p.limiter {
        None => None,
        Some(l) => {
            let mut spec = LimiterSpec {
                queue_limit: Some(l.queue_limit),
                order: Some(
                    match pb::Order::try_from(l.order) {
                        Ok(pb::Order::NewestFirst) => "newest_first",
                        Ok(_) => "oldest_first",
                        Err(_) => {
                            return Err(status_of(EngineError::Invalid {
                                field: "policy.limiter.order",
                                problem: format!("{} is not an Order", l.order),
                            }))
                        }
                    }
                    .into(),
                ),
                ..LimiterSpec::default()
            };
            use pb::limiter::Kind;
            match l.kind {
                Some(Kind::Concurrency(c)) => {
                    spec.kind = "concurrency".into();
                    spec.permits = Some(c.permits);
                }
                Some(Kind::TokenBucket(t)) => {
                    spec.kind = "token_bucket".into();
                    spec.capacity = Some(t.capacity);
                    spec.refill = Some(t.refill);
                    spec.period = duration("policy.limiter.token_bucket.period", t.period)?;
                }
                Some(Kind::FixedWindow(f)) => {
                    spec.kind = "fixed_window".into();
                    spec.permits = Some(f.permits);
                    spec.window = duration("policy.limiter.fixed_window.window", f.window)?;
                }
                Some(Kind::SlidingWindow(w)) => {
                    spec.kind = "sliding_window".into();
                    spec.permits = Some(w.permits);
                    spec.window = duration("policy.limiter.sliding_window.window", w.window)?;
                    spec.segments = Some(w.segments);
                }
                Some(Kind::Adaptive(a)) => {
                    spec.kind = "adaptive".into();
                    spec.min = Some(a.min);
                    spec.max = Some(a.max);
                    spec.initial = a.initial;
                }
                None => return Err(status_of(EngineError::Invalid {
                    field: "policy.limiter.kind",
                    problem:
                        "is required: set concurrency, token_bucket, fixed_window, sliding_window or adaptive"
                            .into(),
                })),
            }
            Some(spec)
        }
    };
    let lease = match p.lease {
        None => None,
        Some(l) => Some(LeaseSpec {
            default: duration("policy.lease.default_lease", l.default_lease)?,
            max: duration("policy.lease.max_lease", l.max_lease)?,
            expired_outcome: match pb::Outcome::try_from(l.expired_outcome) {
                Ok(pb::Outcome::Unspecified) => None,
                Ok(pb::Outcome::Ignored) => Some("IGNORED".into()),
                Ok(pb::Outcome::Failure) => Some("FAILURE".into()),
                Ok(pb::Outcome::Success) => Some("SUCCESS".into()),
                Err(_) => Some(l.expired_outcome.to_string()),
            },
        }),
    };
    let limiter_kind = limiter.as_ref().map(|l| l.kind.clone());
    let retry_budget = match p.retry_budget {
        None => None,
        Some(r) => Some(RetryBudgetSpec {
            ratio: Some(r.ratio),
            min_per_second: Some(r.min_per_second),
            window: duration("policy.retry_budget.window", r.window)?,
        }),
    };
    PolicySpec {
        breaker,
        limiter,
        lease,
        enforce: p.enforce,
        retry_budget,
    }
    .validate()
    .map_err(|e| {
        let field = wire_field(&e.field, limiter_kind.as_deref());
        Status::invalid_argument(format!("{field}: {}", e.problem))
    })
}

/// The wire form of a validated policy.
pub fn wire_policy(p: &Policy) -> pb::Policy {
    pb::Policy {
        breaker: p.breaker.map(|b| pb::Breaker {
            mode: Some(match b.trip {
                Trip::Consecutive { failures } => pb::breaker::Mode::Consecutive(pb::Consecutive {
                    failures: failures.get(),
                }),
                Trip::Ratio {
                    failure_ratio,
                    minimum_throughput,
                    sampling_window,
                } => pb::breaker::Mode::Ratio(pb::Ratio {
                    failure_ratio,
                    minimum_throughput: minimum_throughput.get(),
                    sampling_window: Some(duration_of(sampling_window)),
                }),
            }),
            break_duration: Some(duration_of(b.break_ms.get())),
            multiplier: Some(b.multiplier),
            max_break: b.max_break.map(|m| duration_of(m.get())),
            probe_lease: Some(duration_of(b.probe_lease.get())),
            half_open: (b.half_open != HalfOpen::default()).then(|| pb::HalfOpen {
                probes: Some(b.half_open.probes.get()),
                successes: Some(b.half_open.successes.get()),
            }),
            quorum: b.quorum.map(std::num::NonZeroU32::get),
            slow: b.slow.map(|s| pb::Slow {
                duration: Some(duration_of(s.duration.get())),
                ratio: s.ratio_millionths as f64 / 1_000_000.0,
            }),
        }),
        limiter: p.limiter.map(|l| {
            use pb::limiter::Kind;
            pb::Limiter {
                kind: Some(match l.kind {
                    LimiterKind::Concurrency { permits } => Kind::Concurrency(pb::Concurrency {
                        permits: permits.get(),
                    }),
                    LimiterKind::TokenBucket {
                        capacity,
                        refill,
                        period,
                    } => Kind::TokenBucket(pb::TokenBucket {
                        capacity: capacity.get(),
                        refill: refill.get(),
                        period: Some(duration_of(period.get())),
                    }),
                    LimiterKind::FixedWindow { permits, window } => {
                        Kind::FixedWindow(pb::FixedWindow {
                            permits: permits.get(),
                            window: Some(duration_of(window.get())),
                        })
                    }
                    LimiterKind::SlidingWindow {
                        permits,
                        window,
                        segments,
                    } => Kind::SlidingWindow(pb::SlidingWindow {
                        permits: permits.get(),
                        window: Some(duration_of(window.get())),
                        segments: segments.get(),
                    }),
                    LimiterKind::Adaptive { min, max, initial } => Kind::Adaptive(pb::Adaptive {
                        min: min.get(),
                        max: max.get(),
                        initial: Some(initial.get()),
                    }),
                }),
                queue_limit: l.queue_limit,
                order: match l.order {
                    Order::OldestFirst => pb::Order::OldestFirst,
                    Order::NewestFirst => pb::Order::NewestFirst,
                } as i32,
            }
        }),
        lease: Some(pb::Lease {
            default_lease: Some(duration_of(p.lease.default.get())),
            max_lease: Some(duration_of(p.lease.max.get())),
            expired_outcome: match p.lease.expired_outcome {
                Outcome::Success => pb::Outcome::Success,
                Outcome::Failure => pb::Outcome::Failure,
                Outcome::Ignored => pb::Outcome::Ignored,
            } as i32,
        }),
        retry_budget: p.retry_budget.map(|r| pb::RetryBudget {
            ratio: r.ratio_millionths as f64 / 1_000_000.0,
            min_per_second: r.min_per_second,
            window: Some(duration_of(r.window.get())),
        }),
        // Sent only on a shadow policy: absent means true.
        enforce: (!p.enforce).then_some(false),
    }
}

//! `fusebox policies`: the rules in force, in order, then the default, each
//! with its breaker (and its half-open bound), its limiter, its lease and
//! its retry budget, in words or (`--json`) as objects.

use fusebox_proto::v1 as pb;
use serde_json::{json, Value};

use crate::connect::{admin, call_error, ClientOptions};
use crate::print::{emit, interval_words, ms};

/// `fusebox policies`: one `Admin.ListPolicies` call, printed.
pub async fn policies(client: &ClientOptions) -> anyhow::Result<()> {
    let r = admin(client)
        .await?
        .list_policies(pb::ListPoliciesRequest {})
        .await
        .map_err(call_error)?
        .into_inner();
    let rules: Vec<&pb::PolicyRule> = r.rules.iter().chain(r.default.as_ref()).collect();
    if client.json {
        let all: Vec<Value> = rules.iter().map(|rule| rule_json(rule)).collect();
        return emit(&Value::Array(all).to_string());
    }
    let width = rules
        .iter()
        .map(|rule| match_words(rule).chars().count())
        .max()
        .unwrap_or(0);
    for rule in rules {
        let policy = rule.policy.unwrap_or_default();
        emit(&format!(
            "{:<width$}  breaker: {}",
            match_words(rule),
            breaker_words(policy.breaker.as_ref())
        ))?;
        let pad = " ".repeat(width);
        if let Some(b) = &policy.breaker {
            emit(&format!("{pad}  half-open: {}", half_open_words(b)))?;
            if let Some(k) = b.quorum {
                emit(&format!(
                    "{pad}  quorum: failures from {k} distinct callers to trip"
                ))?;
            }
            if let Some(slow) = &b.slow {
                emit(&format!(
                    "{pad}  slow calls: older than {}, trip at {}% slow",
                    span(slow.duration),
                    slow.ratio * 100.0
                ))?;
            }
        }
        emit(&format!(
            "{pad}  limiter: {}",
            limiter_words(policy.limiter.as_ref())
        ))?;
        emit(&format!(
            "{pad}  lease: {}",
            lease_words(policy.lease.as_ref())
        ))?;
        if let Some(r) = &policy.retry_budget {
            emit(&format!("{pad}  retry budget: {}", retry_budget_words(r)))?;
        }
        if policy.enforce == Some(false) {
            emit(&format!(
                "{pad}  enforce: false (a shadow: decisions are made and counted, not enforced; isolation is)"
            ))?;
        }
    }
    Ok(())
}

/// The rule's pattern, or `default` for the default.
fn match_words(rule: &pb::PolicyRule) -> String {
    if rule.default {
        "default".to_owned()
    } else {
        rule.r#match.clone()
    }
}

/// A duration field in words; `-` when absent.
fn span(d: Option<prost_types::Duration>) -> String {
    ms(d).map_or_else(|| "-".to_owned(), interval_words)
}

/// The slots and successes of a breaker's half-open period (1 and 1 when
/// the policy leaves `half_open` out).
fn half_open_of(b: &pb::Breaker) -> (u32, u32) {
    let h = b.half_open.unwrap_or_default();
    (h.probes.unwrap_or(1), h.successes.unwrap_or(1))
}

fn plural(n: u32, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

fn half_open_words(b: &pb::Breaker) -> String {
    let (probes, successes) = half_open_of(b);
    format!(
        "{} at once, {} to close",
        plural(probes, "probe", "probes"),
        plural(successes, "success", "successes")
    )
}

fn breaker_words(b: Option<&pb::Breaker>) -> String {
    let Some(b) = b else {
        return "none (always admits)".to_owned();
    };
    let mut words = match &b.mode {
        Some(pb::breaker::Mode::Consecutive(c)) => {
            format!("consecutive, {}", plural(c.failures, "failure", "failures"))
        }
        Some(pb::breaker::Mode::Ratio(r)) => format!(
            "ratio, {}% of at least {} in {}",
            r.failure_ratio * 100.0,
            r.minimum_throughput,
            span(r.sampling_window)
        ),
        None => "no mode".to_owned(),
    };
    words.push_str(&format!(", break {}", span(b.break_duration)));
    if let Some(m) = b.multiplier.filter(|m| *m != 1.0) {
        words.push_str(&format!(" x{m}"));
        if b.max_break.is_some() {
            words.push_str(&format!(" up to {}", span(b.max_break)));
        }
    }
    if b.probe_lease.is_some() {
        words.push_str(&format!(", probe lease {}", span(b.probe_lease)));
    }
    words
}

fn limiter_words(l: Option<&pb::Limiter>) -> String {
    use pb::limiter::Kind;
    let Some(l) = l else {
        return "none".to_owned();
    };
    let mut words = match &l.kind {
        Some(Kind::Concurrency(c)) => format!("concurrency, {} permits", c.permits),
        Some(Kind::TokenBucket(t)) => format!(
            "token bucket, capacity {}, {} every {}",
            t.capacity,
            t.refill,
            span(t.period)
        ),
        Some(Kind::FixedWindow(w)) => {
            format!("fixed window, {} per {}", w.permits, span(w.window))
        }
        Some(Kind::SlidingWindow(w)) => format!(
            "sliding window, {} per {} in {} segments",
            w.permits,
            span(w.window),
            w.segments
        ),
        Some(Kind::Adaptive(a)) => format!("adaptive, {} to {}", a.min, a.max),
        None => "no kind".to_owned(),
    };
    if l.queue_limit > 0 {
        words.push_str(&format!(", queue {}", l.queue_limit));
    }
    words
}

fn lease_words(l: Option<&pb::Lease>) -> String {
    let Some(l) = l else {
        return "the defaults".to_owned();
    };
    format!(
        "default {}, max {}, expired {}",
        span(l.default_lease),
        span(l.max_lease),
        expired_outcome(l)
    )
}

fn retry_budget_words(r: &pb::RetryBudget) -> String {
    format!(
        "retries at most {}% of first attempts, at least {} a second, over {}",
        r.ratio * 100.0,
        r.min_per_second,
        span(r.window)
    )
}

/// How a ticket whose lease ends is settled: `IGNORED` or `FAILURE`.
fn expired_outcome(l: &pb::Lease) -> &'static str {
    pb::Outcome::try_from(l.expired_outcome)
        .ok()
        .filter(|o| *o != pb::Outcome::Unspecified)
        .map_or("IGNORED", |o| {
            o.as_str_name().trim_start_matches("OUTCOME_")
        })
}

/// A rule as `policies --json` prints it: durations in ms, the half-open
/// bound always written out.
fn rule_json(rule: &pb::PolicyRule) -> Value {
    let policy = rule.policy.unwrap_or_default();
    let breaker = policy.breaker.as_ref().map(|b| {
        let (probes, successes) = half_open_of(b);
        let mut breaker = json!({
            "break_ms": ms(b.break_duration),
            "multiplier": b.multiplier.unwrap_or(1.0),
            "max_break_ms": ms(b.max_break),
            "probe_lease_ms": ms(b.probe_lease),
            "half_open": { "probes": probes, "successes": successes },
            "quorum": b.quorum,
        });
        match &b.mode {
            Some(pb::breaker::Mode::Consecutive(c)) => {
                breaker["mode"] = json!("consecutive");
                breaker["failures"] = json!(c.failures);
            }
            Some(pb::breaker::Mode::Ratio(r)) => {
                breaker["mode"] = json!("ratio");
                breaker["failure_ratio"] = json!(r.failure_ratio);
                breaker["minimum_throughput"] = json!(r.minimum_throughput);
                breaker["sampling_window_ms"] = json!(ms(r.sampling_window));
            }
            None => {}
        }
        if let Some(slow) = &b.slow {
            breaker["slow"] = json!({ "duration_ms": ms(slow.duration), "ratio": slow.ratio });
        }
        breaker
    });
    json!({
        "match": (!rule.default).then(|| rule.r#match.clone()),
        "default": rule.default,
        "breaker": breaker,
        "limiter": policy.limiter.as_ref().map(limiter_json),
        "lease": policy.lease.as_ref().map(|l| json!({
            "default_ms": ms(l.default_lease),
            "max_ms": ms(l.max_lease),
            "expired_outcome": expired_outcome(l),
        })),
        "retry_budget": policy.retry_budget.as_ref().map(|r| json!({
            "ratio": r.ratio,
            "min_per_second": r.min_per_second,
            "window_ms": ms(r.window),
        })),
        "enforce": policy.enforce.unwrap_or(true),
    })
}

/// A limiter as `policies --json` prints it: its kind and fields as the
/// config names them, durations in ms.
fn limiter_json(l: &pb::Limiter) -> Value {
    use pb::limiter::Kind;
    let mut limiter = match &l.kind {
        Some(Kind::Concurrency(c)) => json!({ "kind": "concurrency", "permits": c.permits }),
        Some(Kind::TokenBucket(t)) => json!({
            "kind": "token_bucket",
            "capacity": t.capacity,
            "refill": t.refill,
            "period_ms": ms(t.period),
        }),
        Some(Kind::FixedWindow(w)) => json!({
            "kind": "fixed_window",
            "permits": w.permits,
            "window_ms": ms(w.window),
        }),
        Some(Kind::SlidingWindow(w)) => json!({
            "kind": "sliding_window",
            "permits": w.permits,
            "window_ms": ms(w.window),
            "segments": w.segments,
        }),
        Some(Kind::Adaptive(a)) => json!({ "kind": "adaptive", "min": a.min, "max": a.max }),
        None => json!({ "kind": null }),
    };
    limiter["queue_limit"] = json!(l.queue_limit);
    limiter
}

//! `rls-conformance`: one fixed sequence of Envoy rate-limit checks sent to
//! fusebox and to envoyproxy/ratelimit in turn, both configured with the
//! same descriptors and limits (scripts/bench-rls writes both configs):
//! every answer side by side, and every one that differs named. Hour
//! windows keep the sequence inside one window on both (a run that crosses
//! the top of an hour says so).

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::json;

use crate::channel;
use crate::envoy_rls::{
    code_name, unit_name, Client, Entry, RateLimitDescriptor, RateLimitOverride, RateLimitRequest,
    RateLimitResponse, UInt64Value,
};
use crate::report::Report;

/// The domain both servers are configured with for this sequence.
pub(crate) const DOMAIN: &str = "conformance";

/// One step: what it checks, and the request.
struct Step {
    what: &'static str,
    request: RateLimitRequest,
}

/// A descriptor of `key=value` pairs.
fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(key, value)| Entry {
                key: (*key).to_owned(),
                value: (*value).to_owned(),
            })
            .collect(),
        limit: None,
        hits_addend: None,
    }
}

fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>, hits: u32) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors,
        hits_addend: hits,
    }
}

/// The sequence, in order. The configs (scripts/bench-rls): `user` (any
/// value) 3 an hour; `path=/login` 2 an hour; `tier=free` then `user` (any)
/// 1 an hour; `unlimited` (any) unlimited; `shadow` (any) 1 an hour in
/// shadow mode.
fn steps() -> Vec<Step> {
    let one = |what, entries: &[(&str, &str)]| Step {
        what,
        request: request(DOMAIN, vec![descriptor(entries)], 0),
    };
    let mut steps = Vec::new();
    for n in 1..=4 {
        steps.push(one(
            ["user 1 of 3", "user 2 of 3", "user 3 of 3", "user 4 of 3"][n - 1],
            &[("user", "alice")],
        ));
    }
    steps.push(one("value-specific rule 1 of 2", &[("path", "/login")]));
    steps.push(one("value-specific rule 2 of 2", &[("path", "/login")]));
    steps.push(Step {
        what: "two descriptors, the second over",
        request: request(
            DOMAIN,
            vec![
                descriptor(&[("user", "bob")]),
                descriptor(&[("path", "/login")]),
            ],
            0,
        ),
    });
    steps.push(one(
        "the first descriptor of that request, alone",
        &[("user", "bob")],
    ));
    steps.push(Step {
        what: "request-level hits_addend 2",
        request: request(DOMAIN, vec![descriptor(&[("user", "carol")])], 2),
    });
    let mut check_only = descriptor(&[("user", "carol")]);
    check_only.hits_addend = Some(UInt64Value { value: 0 });
    steps.push(Step {
        what: "descriptor-level hits_addend 0 (check only)",
        request: request(DOMAIN, vec![check_only], 0),
    });
    steps.push(one("after the check-only request", &[("user", "carol")]));
    steps.push(Step {
        what: "unknown domain",
        request: request("no-such-domain", vec![descriptor(&[("user", "alice")])], 0),
    });
    steps.push(one("descriptor matching no rule", &[("color", "red")]));
    steps.push(one(
        "nested rule 1 of 1",
        &[("tier", "free"), ("user", "dave")],
    ));
    steps.push(one(
        "nested rule 2 of 1",
        &[("tier", "free"), ("user", "dave")],
    ));
    steps.push(one("unlimited rule", &[("unlimited", "yes")]));
    steps.push(one("shadow rule 1 of 1", &[("shadow", "s")]));
    steps.push(one("shadow rule 2 of 1", &[("shadow", "s")]));
    let mut overridden = descriptor(&[("user", "erin")]);
    overridden.limit = Some(RateLimitOverride {
        requests_per_unit: 5,
        unit: 3,
    });
    steps.push(Step {
        what: "descriptor's own limit 5 an hour",
        request: request(DOMAIN, vec![overridden], 0),
    });
    steps.push(Step {
        what: "hits_addend 10 over a limit of 3",
        request: request(DOMAIN, vec![descriptor(&[("user", "frank")])], 10),
    });
    steps.push(one("after the refused 10", &[("user", "frank")]));
    steps
}

/// An answer in one line: the overall code, then each status.
fn line(answer: &Result<RateLimitResponse, tonic::Status>) -> String {
    match answer {
        Err(status) => format!("error {:?}: {}", status.code(), status.message()),
        Ok(r) => {
            let statuses: Vec<String> = r
                .statuses
                .iter()
                .map(|s| {
                    let limit = s.current_limit.as_ref().map_or_else(
                        || "no limit".to_owned(),
                        |l| format!("{}/{}", l.requests_per_unit, unit_name(l.unit)),
                    );
                    let reset = s
                        .duration_until_reset
                        .as_ref()
                        .map_or_else(|| "-".to_owned(), |d| format!("{}s", d.seconds));
                    format!(
                        "{} {limit} left {} reset {reset}",
                        code_name(s.code),
                        s.limit_remaining
                    )
                })
                .collect();
            format!("{} [{}]", code_name(r.overall_code), statuses.join("; "))
        }
    }
}

/// Whether two answers agree: the same codes, limits and remaining counts,
/// and a reset on both or on neither. The resets' values are shown, not
/// compared: fusebox's windows are aligned on its engine's clock (K4: from
/// its origin), envoyproxy/ratelimit's on the wall clock's hours.
fn same(
    a: &Result<RateLimitResponse, tonic::Status>,
    b: &Result<RateLimitResponse, tonic::Status>,
) -> bool {
    match (a, b) {
        (Ok(a), Ok(b)) => {
            a.overall_code == b.overall_code
                && a.statuses.len() == b.statuses.len()
                && a.statuses.iter().zip(&b.statuses).all(|(x, y)| {
                    x.code == y.code
                        && x.current_limit == y.current_limit
                        && x.limit_remaining == y.limit_remaining
                        && x.duration_until_reset.is_some() == y.duration_until_reset.is_some()
                })
        }
        (Err(a), Err(b)) => a.code() == b.code(),
        _ => false,
    }
}

fn hour_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() / 3600)
}

/// Sends the sequence to both servers, step by step, and reports.
pub(crate) async fn conformance_mode(fusebox: &str, ratelimit: &str) -> anyhow::Result<Report> {
    let mut ours = Client::new(channel::connect(fusebox).await?);
    let mut peer = Client::new(channel::connect(ratelimit).await?);
    let hour = hour_now();
    let mut text = String::new();
    let mut results = Vec::new();
    let mut differing = 0;
    for (n, step) in steps().into_iter().enumerate() {
        let a = ours.should_rate_limit(step.request.clone()).await;
        let b = peer.should_rate_limit(step.request).await;
        let agree = same(&a, &b);
        if !agree {
            differing += 1;
        }
        text.push_str(&format!(
            "{:>2}. {}{}\n    fusebox:   {}\n    ratelimit: {}\n",
            n + 1,
            step.what,
            if agree { "" } else { "  <- DIFFERS" },
            line(&a),
            line(&b)
        ));
        results.push(json!({
            "step": n + 1,
            "what": step.what,
            "fusebox": line(&a),
            "ratelimit": line(&b),
            "same": agree,
        }));
    }
    let crossed = hour_now() != hour;
    text.push_str(&format!(
        "\n{differing} of {} answers differ (each explained in docs/decisions.md); resets are \
         compared by presence only (a second boundary between two answers moves them).\n",
        results.len()
    ));
    if crossed {
        text.push_str(
            "warning: the run crossed the top of an hour: windows reset mid-sequence; run again\n",
        );
    }
    Ok((
        "rls-conformance",
        text,
        json!({ "steps": results, "differing": differing, "crossed_an_hour": crossed }),
    ))
}

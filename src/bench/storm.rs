//! `fusebox-bench retry-storm`: a retry storm against one key whose policy
//! has a retry budget (SPEC R1-R3), to show the budget holding it: every
//! caller sends Acquires in a closed loop, the `--retry-share` of them
//! marked `attempt = 2` (a retry) and the rest first attempts, completes
//! every ticket it gets, and the tool counts, second by second, the first
//! attempts sent, the retries granted and the retries denied
//! `retry_budget`. The budget allows at most `max(floor(ratio x first
//! attempts), floor(min_per_second x window))` retries over any window, so
//! once the window is full, retries granted per second read about `ratio`
//! times first attempts per second.

use std::time::{Duration, Instant};

use anyhow::Context;
use fusebox::proto::v1 as pb;
use serde_json::json;

use crate::channel::Channel;
use crate::numbers::ms;
use crate::options::Options;
use crate::report::Report;
use crate::target::Target;

type Fusebox = pb::fusebox_client::FuseboxClient<Channel>;

/// The key the storm hits; its rule is `storm/*`.
pub(crate) const STORM_KEY: &str = "storm/dependency";

/// The config the tool starts its server with: the budget on `storm/*`.
pub(crate) fn config(budget: &Budget) -> String {
    format!(
        "[[rule]]\nmatch = \"storm/*\"\nretry_budget = {{ ratio = {}, min_per_second = {}, window = \"{}ms\" }}\n",
        budget.ratio, budget.min_per_second, budget.window_ms
    )
}

/// The retry budget of the storm's key, as the tool writes it in the
/// server's config (with `--target`, the server must have it on `storm/*`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Budget {
    /// Retries per first attempt, in (0, 1].
    pub(crate) ratio: f64,
    /// Retries always allowed per second of the window.
    pub(crate) min_per_second: u32,
    /// The window, in ms.
    pub(crate) window_ms: u64,
}

impl Budget {
    /// The most retries a window of `firsts` first attempts lets through
    /// (R2, with the ratio taken to 6 decimals).
    fn allows(&self, firsts: u64) -> u64 {
        let ratio = (self.ratio * 1e6).round() as u64;
        let by_ratio = ratio * firsts / 1_000_000;
        let floor = u64::from(self.min_per_second) * self.window_ms / 1_000;
        by_ratio.max(floor)
    }
}

/// One second's counts.
#[derive(Clone, Copy, Debug, Default)]
struct Second {
    firsts: u64,
    firsts_granted: u64,
    retries: u64,
    retries_granted: u64,
    retries_denied: u64,
    other: u64,
    errors: u64,
}

impl Second {
    fn add(&mut self, other: &Second) {
        self.firsts += other.firsts;
        self.firsts_granted += other.firsts_granted;
        self.retries += other.retries;
        self.retries_granted += other.retries_granted;
        self.retries_denied += other.retries_denied;
        self.other += other.other;
        self.errors += other.errors;
    }
}

/// One caller: a closed loop of Acquires (and Completes of what they get)
/// until `end`, counting each answer in the second it arrived in, from
/// `start` (answers before `start`, the warm-up, are not counted).
async fn caller(
    channel: Channel,
    share: f64,
    phase: f64,
    start: Instant,
    end: Instant,
) -> Vec<Second> {
    let mut client = Fusebox::new(channel);
    let seconds = end.duration_since(start).as_secs().max(1) as usize;
    let mut counts = vec![Second::default(); seconds];
    // The share of retries is exact over every run of calls: a retry
    // whenever the running share falls behind.
    let mut owed = phase;
    loop {
        owed += share;
        let retry = owed >= 1.0;
        if retry {
            owed -= 1.0;
        }
        let request = pb::AcquireRequest {
            key: STORM_KEY.to_owned(),
            permits: Some(1),
            attempt: Some(if retry { 2 } else { 1 }),
            ..Default::default()
        };
        let answer = client.acquire(request).await;
        let now = Instant::now();
        if now >= end {
            return counts;
        }
        let slot = now
            .checked_duration_since(start)
            .map(|d| (d.as_secs() as usize).min(seconds - 1));
        let mut seen = Second::default();
        let mut ticket = String::new();
        match answer {
            Err(_) => seen.errors += 1,
            Ok(answer) => {
                let answer = answer.into_inner();
                let granted = answer.decision == pb::Decision::Granted as i32;
                let budget = answer.decision == pb::Decision::Denied as i32
                    && answer.reason == pb::Reason::RetryBudget as i32;
                match (retry, granted, budget) {
                    (false, true, _) => seen.firsts_granted += 1,
                    (true, true, _) => seen.retries_granted += 1,
                    (true, false, true) => seen.retries_denied += 1,
                    _ => seen.other += 1,
                }
                ticket = answer.ticket;
            }
        }
        if retry {
            seen.retries += 1;
        } else {
            seen.firsts += 1;
        }
        if let Some(slot) = slot {
            counts[slot].add(&seen);
        }
        if !ticket.is_empty() {
            let _ = client
                .complete(pb::CompleteRequest {
                    ticket,
                    outcome: pb::Outcome::Success as i32,
                    cost: None,
                })
                .await;
        }
    }
}

/// `fusebox-bench retry-storm`: `--warmup` of storm (which should fill the
/// budget's window), then `--duration` measured, second by second.
pub(crate) async fn storm_mode(
    o: &Options,
    target: &mut Target,
    share: f64,
    budget: &Budget,
) -> anyhow::Result<Report> {
    let load = o.load_on(target).await?;
    let begin = Instant::now() + Duration::from_millis(100);
    let start = begin + ms(o.warmup);
    let end = start + ms(o.duration);
    let callers = load.channels.len() * load.in_flight;
    let mut tasks = Vec::with_capacity(callers);
    for (i, channel) in load.channels.iter().enumerate() {
        for j in 0..load.in_flight {
            let channel = channel.clone();
            // Callers start at different points of the pattern.
            let phase = ((i * load.in_flight + j) as f64 / callers as f64) % 1.0;
            tasks.push(tokio::spawn(async move {
                tokio::time::sleep_until(begin.into()).await;
                caller(channel, share, phase, start, end).await
            }));
        }
    }
    let mut seconds: Vec<Second> = Vec::new();
    for task in tasks {
        let counts = task.await.context("a storm caller failed")?;
        if seconds.is_empty() {
            seconds = vec![Second::default(); counts.len()];
        }
        for (sum, one) in seconds.iter_mut().zip(&counts) {
            sum.add(one);
        }
    }
    target.check_alive()?;
    let mut total = Second::default();
    for s in &seconds {
        total.add(s);
    }
    let measured_s = seconds.len() as f64;
    let mut text = format!(
        "retry storm on {STORM_KEY}: retry_budget = {{ ratio = {}, min_per_second = {}, window = {} ms }}, {:.1}% of Acquires are retries (attempt = 2), {} callers, {} s of warm-up, then {} s measured\n\n",
        budget.ratio,
        budget.min_per_second,
        budget.window_ms,
        share * 100.0,
        callers,
        o.warmup / 1000,
        o.duration / 1000
    );
    text.push_str("second  first attempts/s  retries sent/s  retries granted/s  retries denied retry_budget/s  granted retries per first attempt\n");
    for (i, s) in seconds.iter().enumerate() {
        text.push_str(&format!(
            "{:>6}  {:>16}  {:>14}  {:>17}  {:>30}  {:>33}\n",
            i + 1,
            s.firsts,
            s.retries,
            s.retries_granted,
            s.retries_denied,
            per(s.retries_granted, s.firsts)
        ));
    }
    let window_s = budget.window_ms as f64 / 1000.0;
    let floor_per_s = budget.allows(0) as f64 / window_s;
    text.push_str(&format!(
        "\ntotal: {} first attempts ({:.0}/s), {} retries sent ({:.0}/s), {} retries granted ({:.1}/s), {} retries denied retry_budget ({:.0}/s); granted retries per first attempt {}; the budget allows at most max({} x first attempts, {:.0}/s) over a window; other answers {}, errors {}",
        total.firsts,
        total.firsts as f64 / measured_s,
        total.retries,
        total.retries as f64 / measured_s,
        total.retries_granted,
        total.retries_granted as f64 / measured_s,
        total.retries_denied,
        total.retries_denied as f64 / measured_s,
        per(total.retries_granted, total.firsts),
        budget.ratio,
        floor_per_s,
        total.other,
        total.errors,
    ));
    let rows: Vec<_> = seconds
        .iter()
        .map(|s| {
            json!({
                "first_attempts": s.firsts,
                "first_attempts_granted": s.firsts_granted,
                "retries_sent": s.retries,
                "retries_granted": s.retries_granted,
                "retries_denied_retry_budget": s.retries_denied,
                "other_answers": s.other,
                "errors": s.errors,
            })
        })
        .collect();
    let figures = json!({
        "key": STORM_KEY,
        "retry_share": share,
        "budget": {
            "ratio": budget.ratio,
            "min_per_second": budget.min_per_second,
            "window_ms": budget.window_ms,
        },
        "callers": callers,
        "per_second": rows,
        "total": {
            "first_attempts": total.firsts,
            "retries_sent": total.retries,
            "retries_granted": total.retries_granted,
            "retries_denied_retry_budget": total.retries_denied,
            "other_answers": total.other,
            "errors": total.errors,
        },
    });
    Ok(("retry-storm", text, figures))
}

/// `a / b` to 3 decimals, or `-` when `b` is 0.
fn per(a: u64, b: u64) -> String {
    if b == 0 {
        "-".to_owned()
    } else {
        format!("{:.3}", a as f64 / b as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_allows_the_larger_of_ratio_and_floor() {
        let b = Budget {
            ratio: 0.2,
            min_per_second: 3,
            window_ms: 10_000,
        };
        assert_eq!(b.allows(0), 30);
        assert_eq!(b.allows(150), 30);
        assert_eq!(b.allows(1_000), 200);
    }
}

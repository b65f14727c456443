//! `fusebox-bench hang`: a dependency that starts hanging trips the
//! breaker through in-flight slow calls (SPEC S2, S3), and how long that
//! takes. Callers run a closed loop of Acquire, a call of `--call-time`,
//! Complete `SUCCESS` on one key whose policy has `breaker.slow`; at the
//! hang's start (after `--warmup`) the dependency stops answering: every
//! call in flight then, and every call after, never returns (its caller
//! keeps the ticket and completes nothing). The breaker must open when
//! enough tickets are live slow, before any call returns: the first
//! instant at which `minimum_throughput` hung tickets are at least
//! `slow.duration` old (the policy's window is shorter than the duration,
//! so no outcome from before the hang still counts then, and the slow
//! share is 1). The tool reads the trip's instant from the key's
//! `phase_changed_at` (the server's own record of the transition), polls
//! `GetKey` to see it from outside too, and compares both with that
//! expected instant. Each run uses a fresh key.

use std::time::{Duration, Instant, SystemTime};

use anyhow::Context;
use fusebox::proto::v1 as pb;
use serde_json::json;

use crate::channel::Channel;
use crate::numbers::ms;
use crate::options::Options;
use crate::report::Report;
use crate::target::Target;

type Fusebox = pb::fusebox_client::FuseboxClient<Channel>;
type Admin = pb::admin_client::AdminClient<Channel>;

/// The keys the runs use: `hang/dependency-<run>`, under the rule `hang/*`.
const HANG_PREFIX: &str = "hang/dependency-";

/// The policy of `hang/*`, as the tool writes it in the server's config.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Hang {
    /// `breaker.slow.duration`, in ms.
    pub(crate) slow_ms: u64,
    /// `breaker.slow.ratio`.
    pub(crate) slow_ratio: f64,
    /// `breaker.sampling_window`, in ms (shorter than `slow_ms`).
    pub(crate) window_ms: u64,
    /// `breaker.minimum_throughput`.
    pub(crate) minimum_throughput: u32,
    /// How long each call takes while the dependency answers, in ms.
    pub(crate) call_ms: u64,
}

/// The config the tool starts its server with: the breaker on `hang/*`.
pub(crate) fn config(h: &Hang) -> String {
    format!(
        "[[rule]]\nmatch = \"hang/*\"\nbreaker = {{ mode = \"ratio\", failure_ratio = 0.5, minimum_throughput = {}, sampling_window = \"{}ms\", break = \"60s\", slow = {{ duration = \"{}ms\", ratio = {} }} }}\nlease = {{ default = \"5m\", max = \"5m\" }}\n",
        h.minimum_throughput, h.window_ms, h.slow_ms, h.slow_ratio
    )
}

/// What one caller saw: calls completed before the hang, and when its
/// hung call was granted (`None`: it got no ticket).
struct Caller {
    completed: u64,
    hung_grant: Option<Instant>,
}

/// One caller: calls until `hang`, then holds the call in flight at the
/// hang (or its next one) until `end`.
async fn caller(
    channel: Channel,
    key: String,
    call: Duration,
    hang: Instant,
    end: Instant,
) -> Caller {
    let mut client = Fusebox::new(channel);
    let mut completed = 0;
    loop {
        let answer = client
            .acquire(pb::AcquireRequest {
                key: key.clone(),
                permits: Some(1),
                ..Default::default()
            })
            .await;
        let granted_at = Instant::now();
        let ticket = match answer {
            Ok(a) if !a.get_ref().ticket.is_empty() => a.into_inner().ticket,
            _ => {
                if granted_at >= hang {
                    tokio::time::sleep_until(end.into()).await;
                    return Caller {
                        completed,
                        hung_grant: None,
                    };
                }
                continue;
            }
        };
        tokio::time::sleep(call).await;
        if Instant::now() >= hang {
            // The dependency hangs: this call never returns.
            tokio::time::sleep_until(end.into()).await;
            return Caller {
                completed,
                hung_grant: Some(granted_at),
            };
        }
        let _ = client
            .complete(pb::CompleteRequest {
                ticket,
                outcome: pb::Outcome::Success as i32,
                cost: None,
            })
            .await;
        completed += 1;
    }
}

/// One run's figures, in ms from the hang's start.
struct Run {
    completed: u64,
    hung: usize,
    expected_ms: Option<f64>,
    tripped_ms: Option<f64>,
    seen_ms: Option<f64>,
    live_slow_seen: u32,
    slow_count: u64,
}

async fn run(o: &Options, target: &mut Target, h: &Hang, index: u16) -> anyhow::Result<Run> {
    let load = o.load_on(target).await?;
    let key = format!("{HANG_PREFIX}{index}");
    let begin = Instant::now() + Duration::from_millis(100);
    let hang = begin + ms(o.warmup);
    let hang_wall = SystemTime::now() + hang.duration_since(Instant::now());
    // Long enough for the trip and its reads: the duration and 5 s more.
    let end = hang + ms(h.slow_ms) + Duration::from_secs(5);
    let mut tasks = Vec::new();
    for channel in &load.channels {
        for _ in 0..load.in_flight {
            let (channel, key) = (channel.clone(), key.clone());
            let call = ms(h.call_ms);
            tasks.push(tokio::spawn(async move {
                tokio::time::sleep_until(begin.into()).await;
                caller(channel, key, call, hang, end).await
            }));
        }
    }
    // Watches the key from outside: GetKey every millisecond or so from the
    // hang's start until it reads OPEN.
    let channel = load.channels.first().context("no connection")?.clone();
    let watch_key = key.clone();
    let watcher = tokio::spawn(async move {
        let mut admin = Admin::new(channel);
        tokio::time::sleep_until(hang.into()).await;
        let mut live_slow = 0;
        while Instant::now() < end {
            let state = admin
                .get_key(pb::GetKeyRequest {
                    key: watch_key.clone(),
                })
                .await
                .map(|r| r.into_inner());
            if let Ok(state) = state {
                live_slow = live_slow.max(state.live_slow);
                if state.phase == pb::Phase::Open as i32 {
                    return (Some(Instant::now()), live_slow, state);
                }
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        (None, live_slow, pb::KeyState::default())
    });
    let mut callers = Vec::new();
    for task in tasks {
        callers.push(task.await.context("a caller failed")?);
    }
    let (seen, live_slow_seen, state) = watcher.await.context("the watcher failed")?;
    target.check_alive()?;
    let since = |at: Instant| signed_ms(at, hang);
    let mut grants: Vec<Instant> = callers.iter().filter_map(|c| c.hung_grant).collect();
    grants.sort();
    let m = h.minimum_throughput as usize;
    let expected_ms = grants
        .get(m.saturating_sub(1))
        .map(|g| since(*g) + h.slow_ms as f64);
    let tripped_ms = (state.phase == pb::Phase::Open as i32)
        .then_some(state.phase_changed_at)
        .flatten()
        .map(|t| {
            let at = SystemTime::UNIX_EPOCH
                + Duration::new(t.seconds.max(0) as u64, t.nanos.max(0) as u32);
            match at.duration_since(hang_wall) {
                Ok(d) => d.as_secs_f64() * 1000.0,
                Err(e) => -(e.duration().as_secs_f64() * 1000.0),
            }
        });
    Ok(Run {
        completed: callers.iter().map(|c| c.completed).sum(),
        hung: grants.len(),
        expected_ms,
        tripped_ms,
        seen_ms: seen.map(since),
        live_slow_seen,
        slow_count: state.stats.map_or(0, |s| s.slow),
    })
}

/// `at - from` in ms, below 0 when `at` is earlier.
fn signed_ms(at: Instant, from: Instant) -> f64 {
    match at.checked_duration_since(from) {
        Some(d) => d.as_secs_f64() * 1000.0,
        None => -(from.duration_since(at).as_secs_f64() * 1000.0),
    }
}

fn cell(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.1}"))
}

/// `fusebox-bench hang`: `--runs` runs, each `--warmup` of normal calls
/// then the hang, on a fresh key.
pub(crate) async fn hang_mode(
    o: &Options,
    target: &mut Target,
    h: &Hang,
) -> anyhow::Result<Report> {
    let callers = usize::from(o.connections) * usize::from(o.in_flight);
    anyhow::ensure!(
        h.minimum_throughput as usize <= callers,
        "--minimum-throughput ({}) must not be above the callers ({callers}): only that many calls can hang",
        h.minimum_throughput
    );
    let mut runs = Vec::new();
    for i in 0..o.runs {
        runs.push(run(o, target, h, i).await?);
    }
    let mut text = format!(
        "a dependency that hangs: {callers} callers on hang/*, calls of {} ms completed SUCCESS, then after {} ms every call hangs; breaker ratio, minimum_throughput {}, sampling_window {} ms, slow = {{ duration = {} ms, ratio = {} }}\n\
         times in ms from the hang's start; expected = the instant the {}-th hung call is slow.duration old (its grant + {} ms); tripped = the key's phase_changed_at; seen = GetKey polled every ~1 ms read OPEN\n\n",
        h.call_ms, o.warmup, h.minimum_throughput, h.window_ms, h.slow_ms, h.slow_ratio,
        h.minimum_throughput, h.slow_ms,
    );
    text.push_str("run  calls before  hung calls  expected  tripped  tripped - expected  seen  live_slow seen  KeyStats.slow\n");
    for (i, r) in runs.iter().enumerate() {
        let diff = match (r.tripped_ms, r.expected_ms) {
            (Some(t), Some(e)) => Some(t - e),
            _ => None,
        };
        text.push_str(&format!(
            "{:>3}  {:>12}  {:>10}  {:>8}  {:>7}  {:>18}  {:>4}  {:>14}  {:>13}\n",
            i + 1,
            r.completed,
            r.hung,
            cell(r.expected_ms),
            cell(r.tripped_ms),
            cell(diff),
            cell(r.seen_ms),
            r.live_slow_seen,
            r.slow_count,
        ));
    }
    let figures = json!({
        "callers": callers,
        "call_ms": h.call_ms,
        "hang_after_ms": o.warmup,
        "policy": {
            "minimum_throughput": h.minimum_throughput,
            "sampling_window_ms": h.window_ms,
            "slow_duration_ms": h.slow_ms,
            "slow_ratio": h.slow_ratio,
        },
        "runs": runs.iter().map(|r| json!({
            "calls_before": r.completed,
            "hung_calls": r.hung,
            "expected_trip_ms": r.expected_ms,
            "tripped_ms": r.tripped_ms,
            "seen_open_ms": r.seen_ms,
            "live_slow_seen": r.live_slow_seen,
            "slow": r.slow_count,
        })).collect::<Vec<_>>(),
    });
    Ok(("hang", text, figures))
}

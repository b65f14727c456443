//! `fusebox-bench adaptive-limit`: an adaptive concurrency limiter (SPEC
//! section 10, CX20-CX27) in front of a simulated dependency whose latency
//! doubles under load, to show the limit following it. Every caller sends
//! Acquires on one key in a closed loop; a granted call "runs" against the
//! dependency, which answers in `--base-latency` while at most `--knee`
//! calls are inside it and in twice that above (at `--shift` the knee moves
//! to `--knee-later`: the dependency loses capacity), then the ticket is
//! completed `SUCCESS`. A denied caller waits a quarter of the base latency
//! before it asks again. Each second the tool reads the key's
//! `adaptive_limit` (`GetKey`) and the mean latency of the calls that
//! ended in that second, and writes them as a table, a CSV and an SVG plot.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
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
type Admin = pb::admin_client::AdminClient<Channel>;

/// The key the callers share; its rule is `adaptive/*`.
pub(crate) const ADAPTIVE_KEY: &str = "adaptive/dependency";

/// The adaptive limiter of the key, as the tool writes it in the server's
/// config (with `--target`, the server must have it on `adaptive/*`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    /// The lowest limit.
    pub(crate) min: u32,
    /// The highest limit.
    pub(crate) max: u32,
    /// The limit a fresh key starts at.
    pub(crate) initial: u32,
}

/// The config the tool starts its server with: the limiter on `adaptive/*`.
pub(crate) fn config(l: &Limits) -> String {
    format!(
        "[[rule]]\nmatch = \"adaptive/*\"\nlimiter = {{ kind = \"adaptive\", min = {}, max = {}, initial = {} }}\n",
        l.min, l.max, l.initial
    )
}

/// The simulated dependency.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dependency {
    /// Its latency while it is not overloaded, in ms.
    pub(crate) base_ms: u64,
    /// Calls inside it above which every new call takes twice as long.
    pub(crate) knee: usize,
    /// The knee from `shift_ms` on.
    pub(crate) knee_later: usize,
    /// When (from the start of the measurement) the knee moves.
    pub(crate) shift_ms: u64,
}

impl Dependency {
    /// The latency of a call that enters when `inside` calls (itself
    /// included) are in, `elapsed_ms` after the start.
    fn latency_ms(&self, inside: usize, elapsed_ms: u64) -> u64 {
        let knee = if elapsed_ms < self.shift_ms {
            self.knee
        } else {
            self.knee_later
        };
        if inside > knee {
            2 * self.base_ms
        } else {
            self.base_ms
        }
    }

    fn knee_at(&self, elapsed_ms: u64) -> usize {
        if elapsed_ms < self.shift_ms {
            self.knee
        } else {
            self.knee_later
        }
    }
}

/// Where the tool writes its samples.
#[derive(Clone, Debug, Default)]
pub(crate) struct Outputs {
    /// The CSV, one row a second.
    pub(crate) csv: Option<PathBuf>,
    /// The SVG plot of the limit and the latency over time.
    pub(crate) svg: Option<PathBuf>,
}

/// One second's counts, from the callers.
#[derive(Clone, Copy, Debug, Default)]
struct Second {
    granted: u64,
    denied: u64,
    errors: u64,
    latency_ms_sum: u64,
    ended: u64,
}

impl Second {
    fn add(&mut self, o: &Second) {
        self.granted += o.granted;
        self.denied += o.denied;
        self.errors += o.errors;
        self.latency_ms_sum += o.latency_ms_sum;
        self.ended += o.ended;
    }

    fn mean_latency_ms(&self) -> f64 {
        if self.ended == 0 {
            0.0
        } else {
            self.latency_ms_sum as f64 / self.ended as f64
        }
    }
}

/// One caller's closed loop until `end`; counts go to the second (from
/// `start`) in which each answer or call ended.
async fn caller(
    channel: Channel,
    dependency: Dependency,
    inside: Arc<AtomicUsize>,
    start: Instant,
    end: Instant,
) -> Vec<Second> {
    let mut client = Fusebox::new(channel);
    let seconds = end.duration_since(start).as_secs().max(1) as usize;
    let mut counts = vec![Second::default(); seconds];
    let slot_of = |at: Instant| {
        at.checked_duration_since(start)
            .map(|d| (d.as_secs() as usize).min(seconds - 1))
    };
    loop {
        let answer = client
            .acquire(pb::AcquireRequest {
                key: ADAPTIVE_KEY.to_owned(),
                permits: Some(1),
                ..Default::default()
            })
            .await;
        let now = Instant::now();
        if now >= end {
            return counts;
        }
        let mut seen = Second::default();
        let ticket = match answer {
            Err(_) => {
                seen.errors += 1;
                None
            }
            Ok(a) => {
                let a = a.into_inner();
                if a.decision == pb::Decision::Granted as i32 && !a.ticket.is_empty() {
                    seen.granted += 1;
                    Some(a.ticket)
                } else {
                    seen.denied += 1;
                    None
                }
            }
        };
        if let Some(slot) = slot_of(now) {
            counts[slot].add(&seen);
        }
        let Some(ticket) = ticket else {
            tokio::time::sleep(Duration::from_millis((dependency.base_ms / 4).max(1))).await;
            continue;
        };
        // The call to the simulated dependency.
        let entered = Instant::now();
        let count = inside.fetch_add(1, Ordering::SeqCst) + 1;
        let elapsed = entered
            .checked_duration_since(start)
            .map_or(0, |d| d.as_millis() as u64);
        tokio::time::sleep(Duration::from_millis(dependency.latency_ms(count, elapsed))).await;
        inside.fetch_sub(1, Ordering::SeqCst);
        let left = Instant::now();
        let _ = client
            .complete(pb::CompleteRequest {
                ticket,
                outcome: pb::Outcome::Success as i32,
                cost: None,
            })
            .await;
        if let Some(slot) = slot_of(left) {
            counts[slot].ended += 1;
            counts[slot].latency_ms_sum += left.duration_since(entered).as_millis() as u64;
        }
        if left >= end {
            return counts;
        }
    }
}

/// One sample of the key, read at the end of each second.
#[derive(Clone, Copy, Debug, Default)]
struct Reading {
    adaptive_limit: u32,
    live_tickets: u32,
}

/// Reads the key at the end of every second from `start` to `end`.
async fn sampler(channel: Channel, start: Instant, end: Instant) -> Vec<Reading> {
    let mut admin = Admin::new(channel);
    let seconds = end.duration_since(start).as_secs().max(1);
    let mut out = Vec::new();
    for i in 1..=seconds {
        tokio::time::sleep_until((start + Duration::from_secs(i)).into()).await;
        let reading = admin
            .get_key(pb::GetKeyRequest {
                key: ADAPTIVE_KEY.to_owned(),
            })
            .await
            .map(|s| {
                let s = s.into_inner();
                Reading {
                    adaptive_limit: s.adaptive_limit,
                    live_tickets: s.live_tickets,
                }
            })
            .unwrap_or_default();
        out.push(reading);
    }
    out
}

/// `fusebox-bench adaptive-limit`: `--warmup`, then `--duration` measured.
pub(crate) async fn adaptive_mode(
    o: &Options,
    target: &mut Target,
    limits: &Limits,
    dependency: &Dependency,
    outputs: &Outputs,
) -> anyhow::Result<Report> {
    let load = o.load_on(target).await?;
    let begin = Instant::now() + Duration::from_millis(100);
    let start = begin + ms(o.warmup);
    let end = start + ms(o.duration);
    let callers = load.channels.len() * load.in_flight;
    let inside = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::with_capacity(callers);
    for channel in &load.channels {
        for _ in 0..load.in_flight {
            let (channel, inside, dependency) = (channel.clone(), inside.clone(), *dependency);
            tasks.push(tokio::spawn(async move {
                tokio::time::sleep_until(begin.into()).await;
                caller(channel, dependency, inside, start, end).await
            }));
        }
    }
    let readings = tokio::spawn(sampler(load.channels[0].clone(), start, end));
    let mut seconds: Vec<Second> = Vec::new();
    for task in tasks {
        let counts = task.await.context("an adaptive-limit caller failed")?;
        if seconds.is_empty() {
            seconds = vec![Second::default(); counts.len()];
        }
        for (sum, one) in seconds.iter_mut().zip(&counts) {
            sum.add(one);
        }
    }
    let readings = readings.await.context("the sampler failed")?;
    target.check_alive()?;
    let rows: Vec<Row> = seconds
        .iter()
        .zip(
            readings
                .iter()
                .chain(std::iter::repeat(&Reading::default())),
        )
        .enumerate()
        .map(|(i, (s, r))| Row {
            second: i as u64 + 1,
            knee: dependency.knee_at(i as u64 * 1000),
            adaptive_limit: r.adaptive_limit,
            live_tickets: r.live_tickets,
            latency_ms: s.mean_latency_ms(),
            granted: s.granted,
            denied: s.denied,
            errors: s.errors,
        })
        .collect();
    let mut text = format!(
        "adaptive limit on {ADAPTIVE_KEY}: limiter = {{ kind = \"adaptive\", min = {}, max = {}, initial = {} }}; the dependency answers in {} ms with up to {} calls inside, twice that above (from {} s on: up to {}); {} callers, {} s of warm-up, then {} s measured\n\n",
        limits.min,
        limits.max,
        limits.initial,
        dependency.base_ms,
        dependency.knee,
        dependency.shift_ms / 1000,
        dependency.knee_later,
        callers,
        o.warmup / 1000,
        o.duration / 1000
    );
    text.push_str(&table(&rows));
    let csv = csv(&rows);
    if let Some(path) = &outputs.csv {
        std::fs::write(path, &csv).with_context(|| format!("cannot write {}", path.display()))?;
        let _ = writeln!(text, "\nCSV: {}", path.display());
    }
    if let Some(path) = &outputs.svg {
        let title = format!(
            "fusebox adaptive limit (min {}, max {}) against a dependency whose latency doubles above {} calls in flight ({} from {} s)",
            limits.min, limits.max, dependency.knee, dependency.knee_later, dependency.shift_ms / 1000
        );
        std::fs::write(path, svg(&rows, &title))
            .with_context(|| format!("cannot write {}", path.display()))?;
        let _ = writeln!(text, "SVG: {}", path.display());
    }
    let total = seconds.iter().fold(Second::default(), |mut t, s| {
        t.add(s);
        t
    });
    let figures = json!({
        "key": ADAPTIVE_KEY,
        "limits": { "min": limits.min, "max": limits.max, "initial": limits.initial },
        "dependency": {
            "base_latency_ms": dependency.base_ms,
            "knee": dependency.knee,
            "knee_later": dependency.knee_later,
            "shift_ms": dependency.shift_ms,
        },
        "callers": callers,
        "per_second": rows.iter().map(Row::json).collect::<Vec<_>>(),
        "total": {
            "granted": total.granted,
            "denied": total.denied,
            "errors": total.errors,
            "calls_ended": total.ended,
        },
    });
    Ok(("adaptive-limit", text, figures))
}

/// One second of the run, as the table, the CSV and the plot show it.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Row {
    second: u64,
    knee: usize,
    adaptive_limit: u32,
    live_tickets: u32,
    latency_ms: f64,
    granted: u64,
    denied: u64,
    errors: u64,
}

impl Row {
    fn json(&self) -> serde_json::Value {
        json!({
            "second": self.second,
            "knee": self.knee,
            "adaptive_limit": self.adaptive_limit,
            "live_tickets": self.live_tickets,
            "mean_latency_ms": (self.latency_ms * 10.0).round() / 10.0,
            "granted": self.granted,
            "denied": self.denied,
            "errors": self.errors,
        })
    }
}

fn table(rows: &[Row]) -> String {
    let mut out = String::from(
        "second  knee  adaptive_limit  live_tickets  mean latency ms  granted/s  denied/s\n",
    );
    for r in rows {
        let _ = writeln!(
            out,
            "{:>6}  {:>4}  {:>14}  {:>12}  {:>15.1}  {:>9}  {:>8}",
            r.second, r.knee, r.adaptive_limit, r.live_tickets, r.latency_ms, r.granted, r.denied
        );
    }
    out
}

fn csv(rows: &[Row]) -> String {
    let mut out =
        String::from("second,knee,adaptive_limit,live_tickets,mean_latency_ms,granted,denied\n");
    for r in rows {
        let _ = writeln!(
            out,
            "{},{},{},{},{:.1},{},{}",
            r.second, r.knee, r.adaptive_limit, r.live_tickets, r.latency_ms, r.granted, r.denied
        );
    }
    out
}

/// A plot of the limit (and the knee) against the left axis and the mean
/// latency against the right one, second by second.
fn svg(rows: &[Row], title: &str) -> String {
    let (w, h, left, right, top, bottom) = (900.0, 420.0, 60.0, 60.0, 50.0, 50.0);
    let plot_w = w - left - right;
    let plot_h = h - top - bottom;
    let n = rows.len().max(2) as f64;
    let x = |i: usize| left + plot_w * i as f64 / (n - 1.0);
    let top_limit = rows
        .iter()
        .map(|r| f64::from(r.adaptive_limit).max(r.knee as f64))
        .fold(1.0, f64::max)
        * 1.1;
    let top_latency = rows.iter().map(|r| r.latency_ms).fold(1.0, f64::max) * 1.1;
    let y_limit = |v: f64| top + plot_h * (1.0 - v / top_limit);
    let y_latency = |v: f64| top + plot_h * (1.0 - v / top_latency);
    let line = |points: Vec<(f64, f64)>| {
        points
            .iter()
            .map(|(a, b)| format!("{a:.1},{b:.1}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let limit = line(
        rows.iter()
            .enumerate()
            .map(|(i, r)| (x(i), y_limit(f64::from(r.adaptive_limit))))
            .collect(),
    );
    let knee = line(
        rows.iter()
            .enumerate()
            .map(|(i, r)| (x(i), y_limit(r.knee as f64)))
            .collect(),
    );
    let latency = line(
        rows.iter()
            .enumerate()
            .map(|(i, r)| (x(i), y_latency(r.latency_ms)))
            .collect(),
    );
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"{w}\" height=\"{h}\" fill=\"white\"/>\n\
         <text x=\"{left}\" y=\"20\" font-size=\"13\">{}</text>\n\
         <rect x=\"{left}\" y=\"{top}\" width=\"{plot_w}\" height=\"{plot_h}\" fill=\"none\" stroke=\"#999\"/>\n",
        escape(title)
    );
    for k in 0..=4 {
        let f = f64::from(k) / 4.0;
        let yy = top + plot_h * (1.0 - f);
        let _ = writeln!(
            out,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"#1f77b4\">{:.0}</text>\n<text x=\"{:.1}\" y=\"{:.1}\" fill=\"#d62728\">{:.0}</text>",
            left - 6.0,
            yy + 4.0,
            top_limit * f,
            w - right + 6.0,
            yy + 4.0,
            top_latency * f
        );
    }
    let step = (rows.len() / 10).max(1);
    for (i, r) in rows.iter().enumerate().step_by(step) {
        let _ = writeln!(
            out,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
            x(i),
            h - bottom + 16.0,
            r.second
        );
    }
    let _ = write!(
        out,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">second</text>\n\
         <text x=\"14\" y=\"{:.1}\" fill=\"#1f77b4\" transform=\"rotate(-90 14 {:.1})\" text-anchor=\"middle\">permits</text>\n\
         <text x=\"{:.1}\" y=\"{:.1}\" fill=\"#d62728\" transform=\"rotate(90 {:.1} {:.1})\" text-anchor=\"middle\">mean latency (ms)</text>\n\
         <polyline fill=\"none\" stroke=\"#999\" stroke-dasharray=\"4 4\" points=\"{knee}\"/>\n\
         <polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"2\" points=\"{limit}\"/>\n\
         <polyline fill=\"none\" stroke=\"#d62728\" stroke-width=\"2\" points=\"{latency}\"/>\n\
         <text x=\"{:.1}\" y=\"{:.1}\" fill=\"#1f77b4\">adaptive_limit</text>\n\
         <text x=\"{:.1}\" y=\"{:.1}\" fill=\"#999\">knee (calls in flight above which latency doubles)</text>\n\
         <text x=\"{:.1}\" y=\"{:.1}\" fill=\"#d62728\">mean latency</text>\n\
         </svg>\n",
        left + plot_w / 2.0,
        h - 10.0,
        top + plot_h / 2.0,
        top + plot_h / 2.0,
        w - 14.0,
        top + plot_h / 2.0,
        w - 14.0,
        top + plot_h / 2.0,
        left + 10.0,
        top + 16.0,
        left + 130.0,
        top + 16.0,
        left + 470.0,
        top + 16.0,
    );
    out
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dependency_doubles_above_its_knee_and_the_knee_moves_at_the_shift() {
        let d = Dependency {
            base_ms: 20,
            knee: 40,
            knee_later: 20,
            shift_ms: 10_000,
        };
        assert_eq!(d.latency_ms(40, 0), 20);
        assert_eq!(d.latency_ms(41, 0), 40);
        assert_eq!(d.latency_ms(21, 9_999), 20);
        assert_eq!(d.latency_ms(21, 10_000), 40);
    }

    #[test]
    fn the_plot_has_a_line_per_series_and_the_csv_a_row_per_second() {
        let rows: Vec<Row> = (1..=3)
            .map(|i| Row {
                second: i,
                knee: 40,
                adaptive_limit: 30 + i as u32,
                live_tickets: 30,
                latency_ms: 20.0,
                granted: 100,
                denied: 5,
                errors: 0,
            })
            .collect();
        let svg = svg(&rows, "a <title>");
        assert_eq!(svg.matches("<polyline").count(), 3, "{svg}");
        assert!(svg.contains("a &lt;title&gt;"), "{svg}");
        let csv = csv(&rows);
        assert_eq!(csv.lines().count(), 4, "{csv}");
        assert!(csv.lines().nth(1) == Some("1,40,31,30,20.0,100,5"), "{csv}");
    }
}

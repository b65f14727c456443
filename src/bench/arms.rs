//! The arms over the spreads (the tool without a mode): every arm on every
//! spread, interleaved run by run, the ratios taken within each run; and
//! optionally the same with stalled watchers open.

use anyhow::Context;
use fusebox::proto::v1 as pb;
use fusebox_cli::render_table;
use serde_json::json;

use crate::channel;
use crate::load::{percentile_us, Arm, Load, Measurement, DISTURBED, SATURATED};
use crate::numbers::{bytes, interleaved, median, ms, thousands};
use crate::options::Options;
use crate::report::Report;
use crate::spread::Spread;
use crate::target::Target;

/// Measures one cell in run `run` of `runs`, saying so on standard error.
async fn measure_cell(
    o: &Options,
    target: &mut Target,
    load: &Load,
    cell: Cell,
    run: usize,
    runs: usize,
) -> anyhow::Result<Measurement> {
    eprintln!(
        "bench: run {}/{runs}: {} {}",
        run + 1,
        cell.arm_name(o.stalled_watchers),
        cell.spread_name()
    );
    // The peers' CPU is their own processes'; fusebox's the server the
    // tool started, or the --target's processes.
    let pids = if cell.arm.is_peer() {
        o.peer_pids.as_slice()
    } else if o.target_pids.is_empty() {
        target.pid.as_slice()
    } else {
        o.target_pids.as_slice()
    };
    let m = load
        .measure(
            cell.arm,
            cell.spread.unwrap_or(Spread::Hot),
            ms(o.warmup),
            ms(o.duration),
            run as u64,
            pids,
        )
        .await;
    target.check_alive()?;
    Ok(m)
}

/// One cell of the table: an arm on a spread (`health` has none), with or
/// without stalled watchers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Cell {
    arm: Arm,
    spread: Option<Spread>,
    stalled: bool,
}

impl Cell {
    fn arm_name(&self, watchers: u32) -> String {
        if self.stalled {
            format!("{}+{watchers}stalled", self.arm.name())
        } else {
            self.arm.name().to_owned()
        }
    }

    fn spread_name(&self) -> &'static str {
        self.spread.map_or("-", Spread::name)
    }
}

/// The arms over the spreads, every one in every run, interleaved.
pub(crate) async fn arms_mode(
    o: &Options,
    target: &mut Target,
    warnings: &mut Vec<String>,
) -> anyhow::Result<Report> {
    let mut load = o.load_on(target).await?;
    load.frames = usize::from(o.frames);
    if let Some(rate) = o.rate {
        anyhow::ensure!(
            rate.is_finite() && rate > 0.0,
            "--rate: more than 0 decisions per second"
        );
        load.rate = Some(rate);
    }
    if o.arms.contains(&Arm::Throttlecrab) {
        let url = o.throttlecrab.as_deref().context(
            "--arms throttlecrab needs --throttlecrab http://ADDR of a throttlecrab-server",
        )?;
        for _ in 0..o.connections {
            load.throttlecrab.push(channel::connect(url).await?);
        }
    }
    if o.arms.contains(&Arm::Ratelimit) {
        let url = o.ratelimit.as_deref().context(
            "--arms ratelimit needs --ratelimit http://ADDR of an envoyproxy/ratelimit server",
        )?;
        for _ in 0..o.connections {
            load.ratelimit.push(channel::connect(url).await?);
        }
    }
    let load = load;
    let mut cells = vec![Cell {
        arm: Arm::Health,
        spread: None,
        stalled: false,
    }];
    for arm in Arm::ALL
        .into_iter()
        .filter(|a| *a != Arm::Health && o.arms.contains(a))
    {
        for spread in Spread::ALL.into_iter().filter(|s| o.spreads.contains(s)) {
            cells.push(Cell {
                arm,
                spread: Some(spread),
                stalled: false,
            });
        }
    }
    let stalled: Vec<Cell> = if o.stalled_watchers > 0 {
        Spread::ALL
            .into_iter()
            .filter(|s| o.spreads.contains(s))
            .map(|spread| Cell {
                arm: Arm::Acquire,
                spread: Some(spread),
                stalled: true,
            })
            .collect()
    } else {
        Vec::new()
    };
    if !stalled.is_empty() && !o.arms.contains(&Arm::Acquire) {
        // The stalled cells are compared with acquire in the same run.
        for c in &stalled {
            cells.push(Cell {
                stalled: false,
                ..*c
            });
        }
    }
    let runs = usize::from(o.runs);
    // measured[cell][run]
    let mut measured: Vec<Vec<Measurement>> = (0..cells.len() + stalled.len())
        .map(|_| Vec::new())
        .collect();
    let mut watcher_growth: Vec<f64> = Vec::new();
    for run in 0..runs {
        for at in interleaved(run, cells.len()) {
            let m = measure_cell(o, &mut *target, &load, cells[at], run, runs).await?;
            measured[at].push(m);
        }
        if !stalled.is_empty() {
            let before = target.memory().await;
            eprintln!(
                "bench: run {}/{runs}: opening {} stalled watchers",
                run + 1,
                o.stalled_watchers
            );
            let watchers = open_stalled_watchers(&target.grpc, o.stalled_watchers).await?;
            for (i, cell) in stalled.iter().enumerate() {
                let m = measure_cell(o, &mut *target, &load, *cell, run, runs).await?;
                measured[cells.len() + i].push(m);
            }
            let after = target.memory().await;
            if let (Some(a), Some(b)) = (before.rss_bytes, after.rss_bytes) {
                watcher_growth.push(b as f64 - a as f64);
            }
            drop(watchers);
        }
    }
    let memory = target.memory().await;
    let all_cells: Vec<Cell> = cells.iter().chain(&stalled).copied().collect();

    // Figures per cell, medians across runs; ratios against the health
    // arm of the same run.
    let health = &measured[0];
    let pair_of = |spread: Option<Spread>| {
        cells
            .iter()
            .position(|c| c.arm == Arm::Pair && c.spread == spread && !c.stalled)
            .map(|i| &measured[i])
    };
    let mut rows = Vec::new();
    let mut results = Vec::new();
    let threads = f64::from(o.client_threads);
    let mut saturated = Vec::new();
    let mut disturbed = Vec::new();
    let mut text_due: Vec<String> = Vec::new();
    for (cell, ms) in all_cells.iter().zip(&measured) {
        let rates: Vec<f64> = ms.iter().map(Measurement::rate).collect();
        let ratios: Vec<f64> = ms
            .iter()
            .zip(health)
            .filter(|(_, h)| h.rate() > 0.0)
            .map(|(m, h)| m.rate() / h.rate())
            .collect();
        let p = |q: f64| median(ms.iter().map(|m| m.percentile_us(q)).collect());
        let pc = |q: f64| {
            median(
                ms.iter()
                    .map(|m| percentile_us(&m.tally.complete, q))
                    .collect(),
            )
        };
        let client_cpu = median(ms.iter().filter_map(|m| m.client_cpu).collect());
        let server_cpu = median(ms.iter().filter_map(|m| m.server_cpu).collect());
        // Samples per second of one server core, run by run.
        let per_core = median(
            ms.iter()
                .filter_map(|m| m.server_cpu.filter(|c| *c > 0.0).map(|c| m.rate() / c))
                .collect(),
        );
        let errors: u64 = ms.iter().map(|m| m.tally.errors).sum();
        let not_granted: u64 = ms.iter().map(|m| m.tally.not_granted).sum();
        let first_error = ms.iter().find_map(|m| m.tally.first_error.clone());
        if ms
            .iter()
            .any(|m| m.other_cpu().is_some_and(|c| c >= DISTURBED))
        {
            disturbed.push(format!(
                "{} {}",
                cell.arm_name(o.stalled_watchers),
                cell.spread_name()
            ));
        }
        if ms
            .iter()
            .any(|m| m.client_cpu.is_some_and(|c| c / threads >= SATURATED))
        {
            saturated.push(format!(
                "{} {}",
                cell.arm_name(o.stalled_watchers),
                cell.spread_name()
            ));
        }
        let (rate, ratio) = (median(rates.clone()), median(ratios.clone()));
        // Against pair on the same spread, run by run.
        let to_pair = pair_of(cell.spread).map(|pairs| {
            median(
                ms.iter()
                    .zip(pairs)
                    .filter(|(_, p)| p.rate() > 0.0)
                    .map(|(m, p)| m.rate() / p.rate())
                    .collect(),
            )
        });
        let (p50, p99, p999) = (p(50.0), p(99.0), p(99.9));
        rows.push(vec![
            cell.arm_name(o.stalled_watchers),
            cell.spread_name().to_owned(),
            format!("{} {}", thousands(rate), cell.arm.unit()),
            format!("{ratio:.3}"),
            to_pair.map_or_else(|| "-".to_owned(), |r| format!("{r:.2}")),
            format!("{p50:.1}"),
            format!("{p99:.1}"),
            format!("{p999:.1}"),
            format!("{:.0}%", client_cpu * 100.0),
            if server_cpu > 0.0 {
                format!("{:.0}%", server_cpu * 100.0)
            } else {
                "-".to_owned()
            },
            if per_core > 0.0 {
                thousands(per_core)
            } else {
                "-".to_owned()
            },
            errors.to_string(),
        ]);
        let mut result = json!({
            "arm": cell.arm.name(),
            "spread": cell.spread.map(Spread::name),
            "stalled_watchers": if cell.stalled { o.stalled_watchers } else { 0 },
            "unit": cell.arm.unit(),
            "rate": rate,
            "ratio_to_health": ratio,
            "ratio_to_pair": to_pair,
            "rate_asked": o.rate.filter(|_| cell.arm.paced()),
            "latency_of": match cell.arm {
                Arm::Batch => "batch",
                Arm::Health | Arm::Acquire | Arm::Throttlecrab | Arm::Rls | Arm::Ratelimit => "call",
                Arm::Pair | Arm::Stream => "decision",
            },
            "p50_us": p50,
            "p99_us": p99,
            "p999_us": p999,
            "client_cpu": client_cpu,
            "server_cpu": ms.iter().any(|m| m.server_cpu.is_some()).then_some(server_cpu),
            "rate_per_server_core": (per_core > 0.0).then_some(per_core),
            "errors": errors,
            "not_granted": not_granted,
            "first_error": first_error,
            "runs": ms.iter().zip(health).map(|(m, h)| json!({
                "samples": m.tally.samples,
                "rate": m.rate(),
                "ratio_to_health": if h.rate() > 0.0 { Some(m.rate() / h.rate()) } else { None },
                "p50_us": m.percentile_us(50.0),
                "p99_us": m.percentile_us(99.0),
                "p999_us": m.percentile_us(99.9),
                "max_us": m.tally.latency.max() as f64 / 1000.0,
                "client_cpu": m.client_cpu,
                "server_cpu": m.server_cpu,
                "other_cpu": m.other_cpu(),
                "errors": m.tally.errors,
            })).collect::<Vec<_>>(),
        });
        if o.rate.is_some() && cell.arm.paced() {
            let pd = |q: f64| {
                median(
                    ms.iter()
                        .map(|m| percentile_us(&m.tally.from_due, q))
                        .collect(),
                )
            };
            result["from_due_p50_us"] = json!(pd(50.0));
            result["from_due_p99_us"] = json!(pd(99.0));
            result["from_due_p999_us"] = json!(pd(99.9));
            text_due.push(format!(
                "{} {}: from when each decision was due: p50 {:.1} µs, p99 {:.1} µs, p999 {:.1} µs",
                cell.arm.name(),
                cell.spread_name(),
                pd(50.0),
                pd(99.0),
                pd(99.9)
            ));
        }
        if cell.arm == Arm::Acquire {
            result["complete_p50_us"] = json!(pc(50.0));
            result["complete_p99_us"] = json!(pc(99.0));
            result["complete_p999_us"] = json!(pc(99.9));
        }
        results.push(result);
        if let Some(e) = ms.iter().find_map(|m| m.tally.first_error.as_ref()) {
            warnings.push(format!(
                "{} {}: {errors} calls failed, the first with {e}",
                cell.arm_name(o.stalled_watchers),
                cell.spread_name()
            ));
        }
    }
    if !disturbed.is_empty() {
        warnings.push(format!(
            "other processes of the machine used {DISTURBED} cores or more of CPU during {}: \
             those figures are disturbed (see other_cpu in the JSON); run again on a quiet machine",
            disturbed.join(", ")
        ));
    }
    if !saturated.is_empty() {
        warnings.push(format!(
            "the load generator used {:.0}% or more of its {} thread(s) during {}: it may be the \
             bottleneck there (give it more with --client-threads and --client-cpus)",
            SATURATED * 100.0,
            o.client_threads,
            saturated.join(", ")
        ));
    }

    let (lines, _) = render_table(
        &[
            "ARM",
            "SPREAD",
            "RATE",
            "VS HEALTH",
            "VS PAIR",
            "P50 µs",
            "P99 µs",
            "P999 µs",
            "CLIENT CPU",
            "SERVER CPU",
            "PER CORE",
            "ERRORS",
        ],
        &rows,
    );
    let mut text = lines.join("\n");
    text.push_str(&format!(
        "\n\n{} run(s) of {} ms warm-up + {} ms measured per row, interleaved; medians across runs.\n\
         {} connections x {} in flight; ratios are each run's rate over its health (or pair) rate.\n",
        o.runs, o.warmup, o.duration, o.connections, o.in_flight
    ));
    if o.arms.iter().any(|a| matches!(a, Arm::Stream | Arm::Batch)) {
        text.push_str(&format!(
            "stream: one Decide stream per connection, {} decisions in flight each, latency per decision \
             (Acquire frame sent to Complete answered); batch: {} items per batch, one caller per \
             connection, latency per batch.\n",
            o.frames, o.frames
        ));
    }
    if let Some(rate) = o.rate {
        text.push_str(&format!(
            "pair and stream paced at {} decisions/s in all (open loop); RATE is what was made; the \
             percentiles run from the Acquire sent (a decision waits for a 1 ms timer tick before it is sent).\n",
            thousands(rate)
        ));
        for line in &text_due {
            text.push_str(line);
            text.push('\n');
        }
    }
    text.push_str(&memory.line());
    let mut figures = json!({
        "results": results,
        "memory": memory.json(),
    });
    if !stalled.is_empty() {
        let growth = median(watcher_growth.clone());
        let mut compare = Vec::new();
        for c in &stalled {
            let with = all_cells.iter().position(|x| x == c).map(|i| &measured[i]);
            let without = all_cells
                .iter()
                .position(|x| {
                    *x == Cell {
                        stalled: false,
                        ..*c
                    }
                })
                .map(|i| &measured[i]);
            if let (Some(with), Some(without)) = (with, without) {
                let p99 = |ms: &Vec<Measurement>| {
                    median(ms.iter().map(|m| m.percentile_us(99.0)).collect())
                };
                let ratio = median(
                    with.iter()
                        .zip(without)
                        .map(|(w, n)| w.percentile_us(99.0) / n.percentile_us(99.0).max(0.001))
                        .collect(),
                );
                text.push_str(&format!(
                    "\nacquire {} p99 with {} stalled watchers: {:.1} µs, without: {:.1} µs (x{ratio:.2})",
                    c.spread_name(),
                    o.stalled_watchers,
                    p99(with),
                    p99(without)
                ));
                compare.push(json!({
                    "spread": c.spread_name(),
                    "p99_us_with": p99(with),
                    "p99_us_without": p99(without),
                    "p99_ratio": ratio,
                }));
            }
        }
        if !watcher_growth.is_empty() {
            text.push_str(&format!(
                "\nserver RSS growth with {} stalled watchers open: {} ({} per watcher)",
                o.stalled_watchers,
                bytes(growth),
                bytes(growth / f64::from(o.stalled_watchers))
            ));
        }
        figures["stalled_watchers"] = json!({
            "watchers": o.stalled_watchers,
            "rss_growth_bytes": (!watcher_growth.is_empty()).then_some(growth),
            "rss_growth_per_run": watcher_growth,
            "acquire_p99": compare,
        });
    }
    Ok(("arms", text, figures))
}

/// Opens `k` Admin.Watch streams on every key, each on its own connection,
/// and keeps them without ever reading them.
async fn open_stalled_watchers(
    url: &str,
    k: u32,
) -> anyhow::Result<Vec<tonic::Streaming<pb::WatchEvent>>> {
    let mut watchers = Vec::with_capacity(k as usize);
    for _ in 0..k {
        let channel = channel::connect(url).await?;
        let stream = pb::admin_client::AdminClient::new(channel)
            .watch(pb::WatchRequest {
                prefix: String::new(),
            })
            .await
            .context("Admin.Watch failed")?
            .into_inner();
        watchers.push(stream);
    }
    Ok(watchers)
}

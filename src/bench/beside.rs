//! `fusebox-bench beside --store URL`: a server on that store beside an
//! embedded one, both started by the tool (pinned to `--server-cpus`),
//! every arm on every spread on each, interleaved run by run, so that
//! every ratio is taken within one run: the store-backed server against
//! the embedded one (per arm), and on each server the stream and batch
//! arms against unary pairs and every arm against the no-op health check.

use anyhow::Context;
use serde_json::{json, Value};

use fusebox_cli::render_table;

use crate::load::{Arm, Load, Measurement};
use crate::numbers::{interleaved, median, ms, thousands};
use crate::options::Options;
use crate::report::Report;
use crate::spread::Spread;
use crate::target::Target;

/// The two servers measured.
const SERVERS: [&str; 2] = ["embedded", "store"];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Cell {
    server: usize,
    arm: Arm,
    spread: Spread,
}

/// The embedded server and the one on `store`, measured side by side.
pub(crate) async fn beside_mode(
    o: &Options,
    store: &str,
    warnings: &mut Vec<String>,
) -> anyhow::Result<Report> {
    let bin = o.server_bin()?;
    let cpus = o.server_cpus.as_deref();
    let config = o.config.as_deref();
    let mut targets = vec![
        Target::start(&bin, config, cpus)
            .await
            .context("the embedded server")?,
        Target::start_with(
            &bin,
            config,
            cpus,
            &["--store".to_owned(), store.to_owned()],
        )
        .await
        .context("the server on the store")?,
    ];
    eprintln!(
        "bench: embedded server {}, server on {store} {}",
        targets[0].grpc, targets[1].grpc
    );
    let outcome = measure_all(o, &mut targets, store, warnings).await;
    for t in &mut targets {
        t.stop().await?;
    }
    outcome
}

async fn measure_all(
    o: &Options,
    targets: &mut [Target],
    store: &str,
    warnings: &mut Vec<String>,
) -> anyhow::Result<Report> {
    let mut loads = Vec::new();
    for t in targets.iter() {
        let mut load = Load::open(
            &t.grpcs,
            usize::from(o.connections),
            usize::from(o.in_flight),
        )
        .await?;
        load.frames = usize::from(o.frames);
        loads.push(load);
    }
    let arms: Vec<Arm> = Arm::ALL
        .into_iter()
        .filter(|a| *a == Arm::Health || o.arms.contains(a))
        .filter(|a| !a.is_peer())
        .collect();
    let spreads: Vec<Spread> = Spread::ALL
        .into_iter()
        .filter(|s| o.spreads.contains(s))
        .collect();
    let mut cells = Vec::new();
    for server in 0..SERVERS.len() {
        for arm in &arms {
            for spread in &spreads {
                cells.push(Cell {
                    server,
                    arm: *arm,
                    spread: *spread,
                });
                if *arm == Arm::Health {
                    break;
                }
            }
        }
    }
    let runs = usize::from(o.runs);
    let mut measured: Vec<Vec<Measurement>> = cells.iter().map(|_| Vec::new()).collect();
    for run in 0..runs {
        for at in interleaved(run, cells.len()) {
            let c = cells[at];
            eprintln!(
                "bench: run {}/{runs}: {} {} {}",
                run + 1,
                SERVERS[c.server],
                c.arm.name(),
                c.spread.name()
            );
            let m = loads[c.server]
                .measure(
                    c.arm,
                    c.spread,
                    ms(o.warmup),
                    ms(o.duration),
                    run as u64,
                    targets[c.server].pid.as_slice(),
                )
                .await;
            targets[c.server].check_alive()?;
            measured[at].push(m);
        }
    }
    let find = |server: usize, arm: Arm, spread: Spread| {
        cells.iter().position(|c| {
            c.server == server && c.arm == arm && (c.spread == spread || arm == Arm::Health)
        })
    };
    // The median over runs of a's rate / b's rate, each run's pair taken
    // back to back.
    let per_run = |a: usize, b: usize| {
        median(
            measured[a]
                .iter()
                .zip(&measured[b])
                .filter(|(_, y)| y.rate() > 0.0)
                .map(|(x, y)| x.rate() / y.rate())
                .collect(),
        )
    };
    let mut rows = Vec::new();
    let mut results = Vec::new();
    for (at, (c, ms)) in cells.iter().zip(&measured).enumerate() {
        let health = find(c.server, Arm::Health, c.spread).expect("health is measured");
        let pair = find(c.server, Arm::Pair, c.spread);
        let embedded = find(0, c.arm, c.spread);
        let rate = median(ms.iter().map(Measurement::rate).collect());
        let p50 = median(ms.iter().map(|m| m.percentile_us(50.0)).collect());
        let p99 = median(ms.iter().map(|m| m.percentile_us(99.0)).collect());
        let server_cpu = median(ms.iter().filter_map(|m| m.server_cpu).collect());
        let errors: u64 = ms.iter().map(|m| m.tally.errors).sum();
        if let Some(e) = ms.iter().find_map(|m| m.tally.first_error.clone()) {
            warnings.push(format!(
                "{} {} {}: {errors} calls failed, the first with {e}",
                SERVERS[c.server],
                c.arm.name(),
                c.spread.name()
            ));
        }
        let to_health = per_run(at, health);
        let to_pair = pair.filter(|&p| p != at).map(|p| per_run(at, p));
        let to_embedded = embedded.filter(|&e| e != at).map(|e| per_run(at, e));
        let spread = if c.arm == Arm::Health {
            "-"
        } else {
            c.spread.name()
        };
        rows.push(vec![
            SERVERS[c.server].to_owned(),
            c.arm.name().to_owned(),
            spread.to_owned(),
            format!("{} {}", thousands(rate), c.arm.unit()),
            format!("{to_health:.3}"),
            to_pair.map_or_else(|| "-".to_owned(), |r| format!("x{r:.2}")),
            to_embedded.map_or_else(|| "-".to_owned(), |r| format!("x{r:.3}")),
            format!("{p50:.1}"),
            format!("{p99:.1}"),
            format!("{:.0}%", server_cpu * 100.0),
            errors.to_string(),
        ]);
        results.push(json!({
            "server": SERVERS[c.server],
            "arm": c.arm.name(),
            "spread": (c.arm != Arm::Health).then(|| c.spread.name()),
            "unit": c.arm.unit(),
            "rate": rate,
            "ratio_to_health": to_health,
            "ratio_to_pair": to_pair,
            "ratio_to_embedded": to_embedded,
            "p50_us": p50,
            "p99_us": p99,
            "server_cpu": server_cpu,
            "errors": errors,
            "runs": ms.iter().map(|m| json!({
                "rate": m.rate(),
                "p50_us": m.percentile_us(50.0),
                "p99_us": m.percentile_us(99.0),
                "server_cpu": m.server_cpu,
                "other_cpu": m.other_cpu(),
                "errors": m.tally.errors,
            })).collect::<Vec<Value>>(),
        }));
    }
    let (lines, _) = render_table(
        &[
            "SERVER",
            "ARM",
            "SPREAD",
            "RATE",
            "/HEALTH",
            "/PAIR",
            "/EMBEDDED",
            "P50 µs",
            "P99 µs",
            "SERVER CPU",
            "ERRORS",
        ],
        &rows,
    );
    let mut text = lines.join("\n");
    text.push_str(&format!(
        "\n\n{} run(s) of {} ms warm-up + {} ms measured per row, interleaved over both servers; medians across runs.\n\
         embedded: a server on its own; store: a server on {store}; each with {} connections x {} in flight.\n\
         /HEALTH, /PAIR and /EMBEDDED are medians of the ratios within each run: against the same server's health \
         check, the same server's unary pairs on the same spread, and the embedded server's same arm on the same spread.\n\
         SERVER CPU is the fusebox process's (Redis runs in its own process).",
        o.runs, o.warmup, o.duration, o.connections, o.in_flight,
    ));
    Ok((
        "beside",
        text,
        json!({ "store": store, "results": results }),
    ))
}

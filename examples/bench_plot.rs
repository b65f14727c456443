//! Draws the figures of a `fusebox-bench --json FILE` run (the arms over
//! the spreads) as a PNG: throughput per arm and spread as bars, with the
//! ratio to the health baseline, and the latency percentiles (p50, p99,
//! p999) on a log scale.
//!
//! ```sh
//! fusebox-bench --json bench.json
//! cargo run --example bench_plot -- bench.json docs/bench.png
//! ```

mod chart;

use std::error::Error;

use plotters::prelude::*;
use serde_json::Value;

use chart::{axes, bar, bar_chart, bar_name, canvas, legend, note, number, HEIGHT, WIDTH};

/// The colours of the p50, p99 and p999 bars.
const PERCENTILES: [(&str, &str, RGBColor); 3] = [
    ("p50_us", "p50", RGBColor(76, 114, 176)),
    ("p99_us", "p99", RGBColor(221, 132, 82)),
    ("p999_us", "p999", RGBColor(196, 78, 82)),
];

/// One bar group: an arm on a spread.
struct Cell {
    label: String,
    arm: String,
    unit: String,
    rate: f64,
    ratio: f64,
    percentiles: [f64; 3],
}

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [json, png] = args.as_slice() else {
        return Err("usage: bench_plot BENCH.json OUT.png".into());
    };
    let doc = chart::read_json(json)?;
    if doc["mode"] != "arms" {
        return Err(format!(
            "{json}: bench_plot draws the arms of `fusebox-bench` (no mode); this file is from mode {}",
            doc["mode"]
        )
        .into());
    }
    let cells = cells(&doc)?;
    chart::register_fonts()?;
    draw(&doc, &cells, png)?;
    println!("wrote {png}");
    Ok(())
}

fn cells(doc: &Value) -> Result<Vec<Cell>, Box<dyn Error>> {
    let results = doc["figures"]["results"]
        .as_array()
        .ok_or("no figures.results in the JSON")?;
    Ok(results
        .iter()
        .map(|r| {
            let arm = r["arm"].as_str().unwrap_or("?").to_owned();
            let stalled = r["stalled_watchers"].as_u64().unwrap_or(0);
            let mut label = arm.clone();
            if stalled > 0 {
                label.push_str(&format!("+{stalled}w"));
            }
            if let Some(spread) = r["spread"].as_str() {
                label.push(' ');
                label.push_str(spread);
            }
            Cell {
                label,
                arm,
                unit: r["unit"].as_str().unwrap_or("").to_owned(),
                rate: number(r, "rate"),
                ratio: number(r, "ratio_to_health"),
                percentiles: PERCENTILES.map(|(key, _, _)| number(r, key)),
            }
        })
        .collect())
}

fn arm_colour(arm: &str) -> RGBColor {
    match arm {
        "health" => RGBColor(140, 140, 140),
        "acquire" => RGBColor(85, 168, 104),
        _ => RGBColor(129, 114, 179),
    }
}

fn draw(doc: &Value, cells: &[Cell], png: &str) -> Result<(), Box<dyn Error>> {
    let settings = &doc["settings"];
    let title = format!(
        "fusebox-bench — {} runs x {} ms, {} connections x {} in flight{}",
        settings["runs"],
        settings["duration_ms"],
        settings["connections"],
        settings["in_flight"],
        doc["git_commit"]
            .as_str()
            .map(|c| format!(", commit {}", &c[..c.len().min(12)]))
            .unwrap_or_default()
    );
    let root = canvas(png, &title, 24)?;
    let (top, bottom) = root.split_vertically(HEIGHT / 2 - 20);
    let n = cells.len();
    let names: Vec<String> = cells.iter().map(|c| c.label.clone()).collect();
    let label = |x: &SegmentValue<usize>| bar_name(&names, x);

    // Throughput.
    let max_rate = cells.iter().map(|c| c.rate).fold(1.0, f64::max);
    let mut chart = bar_chart(
        &top,
        "throughput (calls/s; pairs/s for pair) and ratio to health",
        18,
        (40, 80),
        n,
        0.0..max_rate * 1.15,
    )?;
    axes(&mut chart, n, &label)
        .y_desc("per second")
        .y_label_formatter(&|v| format!("{v:.0}"))
        .label_style(("sans-serif", 13))
        .draw()?;
    chart.draw_series(
        cells
            .iter()
            .enumerate()
            .map(|(i, c)| bar(i, (0.0, c.rate), arm_colour(&c.arm), (12, 12))),
    )?;
    chart.draw_series(cells.iter().enumerate().map(|(i, c)| {
        note(
            format!("{:.0} {} ({:.2}x)", c.rate, c.unit, c.ratio),
            i,
            c.rate + max_rate * 0.01,
            12,
            &top,
        )
    }))?;

    // Latency percentiles, log scale.
    let all: Vec<f64> = cells
        .iter()
        .flat_map(|c| c.percentiles)
        .filter(|v| *v > 0.0)
        .collect();
    let low = all.iter().copied().fold(f64::INFINITY, f64::min).max(0.1) * 0.5;
    let high = all.iter().copied().fold(1.0, f64::max) * 2.0;
    let mut chart = bar_chart(
        &bottom,
        "latency percentiles (µs; acquire: the Acquire call, pair: Acquire + Complete)",
        18,
        (40, 80),
        n,
        (low..high).log_scale(),
    )?;
    axes(&mut chart, n, &label)
        .y_desc("µs")
        .y_labels(12)
        .y_label_formatter(&|v| format!("{v:.0}"))
        .label_style(("sans-serif", 13))
        .draw()?;
    for (p, (_, name, colour)) in PERCENTILES.iter().enumerate() {
        chart
            .draw_series(cells.iter().enumerate().map(|(i, c)| {
                // Three bars side by side in each segment.
                let segment = (WIDTH - 120) / n.max(1) as u32;
                let slot = segment.saturating_sub(24) / 3;
                let left = 12 + slot * p as u32;
                let right = segment.saturating_sub(left + slot);
                bar(i, (low, c.percentiles[p].max(low)), *colour, (left, right))
            }))?
            .label(*name)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], colour.filled()));
    }
    let short = |us: f64| {
        if us >= 1000.0 {
            format!("{:.1}k", us / 1000.0)
        } else {
            format!("{us:.0}")
        }
    };
    chart.draw_series(cells.iter().enumerate().map(|(i, c)| {
        let [p50, p99, p999] = c.percentiles;
        note(
            format!("{} / {} / {}", short(p50), short(p99), short(p999)),
            i,
            p999.max(low) * 1.08,
            12,
            &bottom,
        )
    }))?;
    legend(&mut chart)?;
    root.present()?;
    Ok(())
}

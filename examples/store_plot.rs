//! Draws what keeping state in Redis costs, from two runs of
//! `scripts/bench-redis` on one Redis server, as a PNG: Redis's CPU per
//! decision for each arm of `fusebox-bench redis-cpu` (the floor, the
//! module API's no-op, the module with 0, 32 and 1,000 live tickets, the
//! Lua script), and the throughput of `fusebox-bench beside` (a server on
//! the store beside an embedded one), each with its ratio taken within
//! the run.
//!
//! ```sh
//! scripts/bench-redis
//! cargo run --release --example store_plot -- target/bench/redis-cpu-single.json \
//!     target/bench/redis-beside-single.json docs/store.png
//! ```

mod chart;

use std::error::Error;

use plotters::prelude::*;
use serde_json::Value;

use chart::{axes, bar, bar_chart, bar_name, canvas, note, number, Area, HEIGHT};

/// One bar.
struct Bar {
    label: String,
    value: f64,
    note: String,
    colour: RGBColor,
}

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [cpu, beside, png] = args.as_slice() else {
        return Err("usage: store_plot REDIS-CPU.json BESIDE.json OUT.png".into());
    };
    let (cpu, beside) = (chart::read_json(cpu)?, chart::read_json(beside)?);
    let cpu_bars = cpu_bars(&cpu)?;
    let rate_bars = rate_bars(&beside)?;
    chart::register_fonts()?;
    let root = canvas(
        png,
        "fusebox on Redis: the cost of a decision, beside its floors (medians, ratios within each run)",
        22,
    )?;
    let (top, bottom) = root.split_vertically(HEIGHT / 2 - 20);
    panel(
        &top,
        &cpu_bars,
        "Redis CPU per decision (µs; acquire + complete, pipelined): ratio to the floor (SET + GET) of the same spread",
        "µs",
    )?;
    panel(
        &bottom,
        &rate_bars,
        "calls/s (health) and pairs/s through a server: the store's against the embedded engine's, and stream against pair",
        "per second",
    )?;
    root.present()?;
    println!("wrote {png}");
    Ok(())
}

fn cpu_bars(doc: &Value) -> Result<Vec<Bar>, Box<dyn Error>> {
    let results = doc["figures"]["results"]
        .as_array()
        .ok_or("REDIS-CPU.json: no figures.results (is it from `fusebox-bench redis-cpu`?)")?;
    let floor_of = |spread: &str| {
        results
            .iter()
            .find(|r| r["arm"] == "floor" && r["spread"] == spread)
            .map(|r| number(r, "redis_cpu_us_per_decision"))
    };
    Ok(results
        .iter()
        .map(|r| {
            let arm = r["arm"].as_str().unwrap_or("?");
            let spread = r["spread"].as_str().unwrap_or("?");
            let live = r["live_tickets"].as_u64().unwrap_or(0);
            let value = number(r, "redis_cpu_us_per_decision");
            let mut label = format!("{arm} {spread}");
            if live > 0 {
                label.push_str(&format!(" +{live}t"));
            }
            let note = match floor_of(spread) {
                Some(floor) if floor > 0.0 => format!("{value:.1} (x{:.1})", value / floor),
                _ => format!("{value:.1}"),
            };
            let colour = match arm {
                "floor" => RGBColor(140, 140, 140),
                "noop" => RGBColor(190, 190, 190),
                "module" if live > 0 => RGBColor(100, 181, 205),
                "module" => RGBColor(76, 114, 176),
                _ => RGBColor(221, 132, 82),
            };
            Bar {
                label,
                value,
                note,
                colour,
            }
        })
        .collect())
}

fn rate_bars(doc: &Value) -> Result<Vec<Bar>, Box<dyn Error>> {
    let results = doc["figures"]["results"]
        .as_array()
        .ok_or("BESIDE.json: no figures.results (is it from `fusebox-bench beside`?)")?;
    Ok(results
        .iter()
        .map(|r| {
            let server = r["server"].as_str().unwrap_or("?");
            let arm = r["arm"].as_str().unwrap_or("?");
            let label = match r["spread"].as_str() {
                Some(spread) => format!("{server} {arm} {spread}"),
                None => format!("{server} {arm}"),
            };
            let value = number(r, "rate");
            let mut note = format!("{value:.0}");
            if let Some(x) = r["ratio_to_embedded"].as_f64() {
                note.push_str(&format!(" /emb x{x:.2}"));
            }
            if let (Some(x), true) = (r["ratio_to_pair"].as_f64(), arm == "stream") {
                note.push_str(&format!(" /pair x{x:.1}"));
            }
            let colour = match (server, arm) {
                (_, "health") => RGBColor(140, 140, 140),
                ("embedded", _) => RGBColor(85, 168, 104),
                _ => RGBColor(76, 114, 176),
            };
            Bar {
                label,
                value,
                note,
                colour,
            }
        })
        .collect())
}

fn panel(area: &Area<'_>, bars: &[Bar], caption: &str, unit: &str) -> Result<(), Box<dyn Error>> {
    let n = bars.len();
    let max = bars.iter().map(|b| b.value).fold(1.0, f64::max);
    let names: Vec<String> = bars.iter().map(|b| b.label.clone()).collect();
    let label = |x: &SegmentValue<usize>| bar_name(&names, x);
    let mut chart = bar_chart(
        area,
        caption,
        16,
        (60, 80),
        n,
        (max / 200.0..max * 2.0).log_scale(),
    )?;
    axes(&mut chart, n, &label)
        .x_label_style(
            ("sans-serif", 11)
                .into_font()
                .transform(FontTransform::Rotate90),
        )
        .y_desc(unit)
        .y_label_formatter(&|v| format!("{v:.1}"))
        .label_style(("sans-serif", 12))
        .draw()?;
    let floor = max / 200.0;
    chart.draw_series(
        bars.iter()
            .enumerate()
            .map(|(i, b)| bar(i, (floor, b.value.max(floor)), b.colour, (6, 6))),
    )?;
    chart.draw_series(
        bars.iter()
            .enumerate()
            .map(|(i, b)| note(b.note.clone(), i, b.value.max(floor) * 1.05, 11, area)),
    )?;
    Ok(())
}

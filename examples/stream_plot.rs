//! Draws the summary of `scripts/bench-stream` (target/bench/
//! stream-summary.json) as a PNG: decisions per second of every system
//! measured (fusebox unary, stream and batch, throttlecrab, Redis + Lua at
//! each pipeline depth) as bars, and the p50/p99 of pair and stream, each
//! paced at half of its own maximum rate.
//!
//! ```sh
//! scripts/bench-stream
//! cargo run --release --example stream_plot -- target/bench/stream-summary.json docs/stream.png
//! ```

mod chart;

use std::error::Error;

use plotters::prelude::*;
use serde_json::Value;

use chart::{axes, bar, bar_chart, bar_name, canvas, legend, note, number, HEIGHT, WIDTH};

fn colour(arm: &str) -> RGBColor {
    match arm {
        "health" => RGBColor(140, 140, 140),
        "pair" => RGBColor(129, 114, 179),
        "stream" => RGBColor(221, 132, 82),
        "batch" => RGBColor(196, 78, 82),
        "throttlecrab" => RGBColor(85, 168, 104),
        _ => RGBColor(76, 114, 176),
    }
}

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [json, png] = args.as_slice() else {
        return Err("usage: stream_plot stream-summary.json OUT.png".into());
    };
    let doc = chart::read_json(json)?;
    chart::register_fonts()?;
    let systems = doc["systems"].as_array().ok_or("no systems in the JSON")?;

    let root = canvas(
        png,
        "decisions per request: server on core 0, load on core 1",
        24,
    )?;
    let (top, bottom) = root.split_vertically(HEIGHT * 3 / 5);

    // Decisions per second.
    let n = systems.len();
    let names: Vec<String> = systems
        .iter()
        .map(|s| s["name"].as_str().unwrap_or("?").replace("fusebox ", ""))
        .collect();
    let label = |x: &SegmentValue<usize>| bar_name(&names, x);
    let max_rate = systems
        .iter()
        .map(|s| number(s, "rate"))
        .fold(1.0, f64::max);
    let mut chart = bar_chart(
        &top,
        "decisions/s (a decision: acquire + complete; health and throttlecrab: one call)",
        18,
        (50, 90),
        n,
        0.0..max_rate * 1.15,
    )?;
    axes(&mut chart, n, &label)
        .y_desc("per second")
        .y_label_formatter(&|v| format!("{v:.0}"))
        .label_style(("sans-serif", 11))
        .draw()?;
    chart.draw_series(systems.iter().enumerate().map(|(i, s)| {
        let colour = colour(s["arm"].as_str().unwrap_or(""));
        bar(i, (0.0, number(s, "rate")), colour, (10, 10))
    }))?;
    chart.draw_series(systems.iter().enumerate().map(|(i, s)| {
        let rate = number(s, "rate");
        note(
            format!("{:.0}k", rate / 1000.0),
            i,
            rate + max_rate * 0.01,
            13,
            &top,
        )
    }))?;

    // Half-rate latency.
    let half = &doc["half_rate"];
    let rows: Vec<(&str, &Value)> = ["pair", "stream"]
        .into_iter()
        .filter(|a| half[*a].is_object())
        .map(|a| (a, &half[a]))
        .collect();
    let high = rows
        .iter()
        .map(|(_, h)| number(h, "p99_us"))
        .fold(1.0, f64::max)
        * 1.25;
    let m = rows.len();
    let mut chart = bar_chart(
        &bottom,
        "latency of a decision at half of each one's maximum rate (open loop), µs",
        18,
        (40, 90),
        m,
        0.0..high,
    )?;
    let names: Vec<String> = rows
        .iter()
        .map(|(arm, h)| format!("{arm} at {:.0}k/s", number(h, "rate") / 1000.0))
        .collect();
    let label = |x: &SegmentValue<usize>| bar_name(&names, x);
    axes(&mut chart, m, &label)
        .y_desc("µs")
        .y_label_formatter(&|v| format!("{v:.0}"))
        .label_style(("sans-serif", 13))
        .draw()?;
    for (p, (key, name, c)) in [
        ("p50_us", "p50", RGBColor(76, 114, 176)),
        ("p99_us", "p99", RGBColor(221, 132, 82)),
    ]
    .into_iter()
    .enumerate()
    {
        chart
            .draw_series(rows.iter().enumerate().map(|(i, (_, h))| {
                let segment = (WIDTH - 130) / m.max(1) as u32;
                let slot = segment.saturating_sub(200) / 2;
                let left = 100 + slot * p as u32;
                let right = segment.saturating_sub(left + slot);
                bar(i, (0.0, number(h, key)), c, (left, right))
            }))?
            .label(name)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], c.filled()));
    }
    chart.draw_series(rows.iter().enumerate().map(|(i, (_, h))| {
        note(
            format!(
                "p50 {:.0} / p99 {:.0} µs",
                number(h, "p50_us"),
                number(h, "p99_us")
            ),
            i,
            number(h, "p99_us") + high * 0.02,
            13,
            &bottom,
        )
    }))?;
    legend(&mut chart)?;
    root.present()?;
    println!("wrote {png}");
    Ok(())
}

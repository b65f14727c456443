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

use std::error::Error;

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::FontStyle;
use serde_json::Value;

const WIDTH: u32 = 1400;
const HEIGHT: u32 = 1000;

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
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(json)?)?;
    plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular())
        .map_err(|_| "the embedded font is not readable")?;
    plotters::style::register_font("sans-serif", FontStyle::Bold, dejavu::sans::bold())
        .map_err(|_| "the embedded font is not readable")?;
    let systems = doc["systems"].as_array().ok_or("no systems in the JSON")?;
    let number = |v: &Value, k: &str| v[k].as_f64().unwrap_or(0.0);

    let root = BitMapBackend::new(png, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(
        "decisions per request: server on core 0, load on core 1",
        ("sans-serif", 24).into_font().style(FontStyle::Bold),
    )?;
    let (top, bottom) = root.split_vertically(HEIGHT * 3 / 5);

    // Decisions per second.
    let n = systems.len();
    let label = |x: &SegmentValue<usize>| match x {
        SegmentValue::CenterOf(i) if *i < n => systems[*i]["name"]
            .as_str()
            .unwrap_or("?")
            .replace("fusebox ", ""),
        _ => String::new(),
    };
    let max_rate = systems
        .iter()
        .map(|s| number(s, "rate"))
        .fold(1.0, f64::max);
    let mut chart = ChartBuilder::on(&top)
        .caption(
            "decisions/s (a decision: acquire + complete; health and throttlecrab: one call)",
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(50)
        .y_label_area_size(90)
        .build_cartesian_2d(
            (0..n.saturating_sub(1)).into_segmented(),
            0.0..max_rate * 1.15,
        )?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n)
        .x_label_formatter(&label)
        .y_desc("per second")
        .y_label_formatter(&|v| format!("{v:.0}"))
        .label_style(("sans-serif", 11))
        .draw()?;
    chart.draw_series(systems.iter().enumerate().map(|(i, s)| {
        let mut bar = Rectangle::new(
            [
                (SegmentValue::Exact(i), 0.0),
                (SegmentValue::Exact(i + 1), number(s, "rate")),
            ],
            colour(s["arm"].as_str().unwrap_or("")).filled(),
        );
        bar.set_margin(0, 0, 10, 10);
        bar
    }))?;
    chart.draw_series(systems.iter().enumerate().map(|(i, s)| {
        let rate = number(s, "rate");
        Text::new(
            format!("{:.0}k", rate / 1000.0),
            (SegmentValue::CenterOf(i), rate + max_rate * 0.01),
            ("sans-serif", 13)
                .into_text_style(&top)
                .pos(Pos::new(HPos::Center, VPos::Bottom)),
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
    let mut chart = ChartBuilder::on(&bottom)
        .caption(
            "latency of a decision at half of each one's maximum rate (open loop), µs",
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(90)
        .build_cartesian_2d((0..m.saturating_sub(1)).into_segmented(), 0.0..high)?;
    let label = |x: &SegmentValue<usize>| match x {
        SegmentValue::CenterOf(i) if *i < m => format!(
            "{} at {:.0}k/s",
            rows[*i].0,
            number(rows[*i].1, "rate") / 1000.0
        ),
        _ => String::new(),
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(m)
        .x_label_formatter(&label)
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
                let mut bar = Rectangle::new(
                    [
                        (SegmentValue::Exact(i), 0.0),
                        (SegmentValue::Exact(i + 1), number(h, key)),
                    ],
                    c.filled(),
                );
                let segment = (WIDTH - 130) / m.max(1) as u32;
                let slot = segment.saturating_sub(200) / 2;
                let left = 100 + slot * p as u32;
                bar.set_margin(0, 0, left, segment.saturating_sub(left + slot));
                bar
            }))?
            .label(name)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], c.filled()));
    }
    chart.draw_series(rows.iter().enumerate().map(|(i, (_, h))| {
        Text::new(
            format!(
                "p50 {:.0} / p99 {:.0} µs",
                number(h, "p50_us"),
                number(h, "p99_us")
            ),
            (SegmentValue::CenterOf(i), number(h, "p99_us") + high * 0.02),
            ("sans-serif", 13)
                .into_text_style(&bottom)
                .pos(Pos::new(HPos::Center, VPos::Bottom)),
        )
    }))?;
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 13))
        .draw()?;
    root.present()?;
    println!("wrote {png}");
    Ok(())
}

//! What the plotting examples (`bench_plot`, `store_plot`, `stream_plot`)
//! share: the embedded font, their JSON input, the canvas, and charts of
//! bars, one segment of the x axis per bar.
//!
//! Text is drawn with DejaVu Sans embedded in the program (the `dejavu`
//! crate), so no system font is needed.

use std::error::Error;

use plotters::chart::MeshStyle;
use plotters::coord::ranged1d::{AsRangedCoord, SegmentedCoord, ValueFormatter};
use plotters::coord::types::RangedCoordusize;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::FontStyle;
use serde_json::Value;

/// The width of every figure, in pixels.
pub const WIDTH: u32 = 1400;
/// The height of every figure, in pixels.
pub const HEIGHT: u32 = 1000;

/// A part of a figure.
pub type Area<'a> = DrawingArea<BitMapBackend<'a>, Shift>;

/// A chart of bars over `Y`: the x axis has one segment per bar.
pub type BarChart<'a, 'b, Y> =
    ChartContext<'a, BitMapBackend<'b>, Cartesian2d<SegmentedCoord<RangedCoordusize>, Y>>;

/// Makes DejaVu Sans, regular and bold, the "sans-serif" of every text.
pub fn register_fonts() -> Result<(), Box<dyn Error>> {
    plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular())
        .map_err(|_| "the embedded font is not readable")?;
    plotters::style::register_font("sans-serif", FontStyle::Bold, dejavu::sans::bold())
        .map_err(|_| "the embedded font is not readable")?;
    Ok(())
}

/// The JSON document in the file at `path`.
pub fn read_json(path: &str) -> Result<Value, Box<dyn Error>> {
    Ok(serde_json::from_str(&std::fs::read_to_string(path)?)?)
}

/// `v[k]` as a number; 0 when it is missing or not a number.
pub fn number(v: &Value, k: &str) -> f64 {
    v[k].as_f64().unwrap_or(0.0)
}

/// A white figure of [`WIDTH`] x [`HEIGHT`], written to `png` when it is
/// presented, under `title` in bold of `size` pixels.
pub fn canvas<'a>(png: &'a str, title: &str, size: u32) -> Result<Area<'a>, Box<dyn Error>> {
    let root = BitMapBackend::new(png, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE)?;
    Ok(root.titled(
        title,
        ("sans-serif", size).into_font().style(FontStyle::Bold),
    )?)
}

/// A chart of `bars` bars on `area` under `caption` (`caption_size`
/// pixels), `label_areas` (below, left) pixels kept for the labels of the
/// axes, the values on `y`.
pub fn bar_chart<'a, 'b, Y: AsRangedCoord>(
    area: &Area<'b>,
    caption: &str,
    caption_size: u32,
    label_areas: (u32, u32),
    bars: usize,
    y: Y,
) -> Result<BarChart<'a, 'b, Y::CoordDescType>, Box<dyn Error>> {
    Ok(ChartBuilder::on(area)
        .caption(caption, ("sans-serif", caption_size))
        .margin(12)
        .x_label_area_size(label_areas.0)
        .y_label_area_size(label_areas.1)
        .build_cartesian_2d((0..bars.saturating_sub(1)).into_segmented(), y)?)
}

/// The axes of a chart of `bars` bars, each named by `label` under it, with
/// no vertical lines; the caller says the rest of the y axis and draws it.
pub fn axes<'a, 'b, 'c, Y: Ranged + ValueFormatter<Y::ValueType>>(
    chart: &'c mut BarChart<'a, 'b, Y>,
    bars: usize,
    label: &'c dyn Fn(&SegmentValue<usize>) -> String,
) -> MeshStyle<'a, 'c, SegmentedCoord<RangedCoordusize>, Y, BitMapBackend<'b>> {
    let mut mesh = chart.configure_mesh();
    mesh.disable_x_mesh()
        .x_labels(bars)
        .x_label_formatter(label);
    mesh
}

/// The name under bar `at` of `names`; nothing between the bars.
pub fn bar_name(names: &[String], at: &SegmentValue<usize>) -> String {
    match at {
        SegmentValue::CenterOf(i) => names.get(*i).cloned().unwrap_or_default(),
        _ => String::new(),
    }
}

/// Bar `i`, from `from` up to `to` in `colour`, `left` and `right` pixels
/// in from the edges of its segment.
pub fn bar<Y>(
    i: usize,
    (from, to): (Y, Y),
    colour: RGBColor,
    (left, right): (u32, u32),
) -> Rectangle<(SegmentValue<usize>, Y)> {
    let mut bar = Rectangle::new(
        [
            (SegmentValue::Exact(i), from),
            (SegmentValue::Exact(i + 1), to),
        ],
        colour.filled(),
    );
    bar.set_margin(0, 0, left, right);
    bar
}

/// `text` (`size` pixels) centred over bar `i`, its foot at `y`.
pub fn note<'a, Y>(
    text: String,
    i: usize,
    y: Y,
    size: u32,
    area: &Area<'_>,
) -> Text<'a, (SegmentValue<usize>, Y), String> {
    Text::new(
        text,
        (SegmentValue::CenterOf(i), y),
        ("sans-serif", size)
            .into_text_style(area)
            .pos(Pos::new(HPos::Center, VPos::Bottom)),
    )
}

/// The key of the series' colours, in the upper left corner of `chart`.
#[allow(dead_code, reason = "store_plot's series are named under the bars")]
pub fn legend<'a, 'b: 'a, Y: Ranged>(
    chart: &mut BarChart<'a, 'b, Y>,
) -> Result<(), Box<dyn Error>> {
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 13))
        .draw()?;
    Ok(())
}

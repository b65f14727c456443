//! `fusebox-bench growth`: pair latency on 1,000 keys, before and after
//! filling the server up to N live keys.

use fusebox_cli::render_table;
use serde_json::{json, Value};

use crate::fill::{fill, fill_json, fill_text, FILL_PREFIX};
use crate::load::{summary, Arm};
use crate::numbers::{ms, thousands};
use crate::options::Options;
use crate::report::Report;
use crate::spread::Spread;
use crate::target::{Memory, Target};

/// Pair on 1,000 keys `--runs` times, a fill up to `keys` live keys, and
/// pair again.
pub(crate) async fn growth_mode(
    o: &Options,
    target: &mut Target,
    keys: u64,
    warnings: &mut Vec<String>,
) -> anyhow::Result<Report> {
    let load = o.load_on(target).await?;
    let measure = |seed: u64| {
        load.measure(
            Arm::Pair,
            Spread::Thousand,
            ms(o.warmup),
            ms(o.duration),
            seed,
            target.pid.as_slice(),
        )
    };
    let mut before = Vec::new();
    for run in 0..o.runs {
        eprintln!(
            "bench: run {}/{}: pair 1k, before the fill",
            run + 1,
            o.runs
        );
        before.push(measure(u64::from(run)).await);
    }
    let memory_before = target.memory().await;
    let have = memory_before.keys.unwrap_or(0);
    let missing = keys.saturating_sub(have);
    eprintln!("bench: filling {missing} keys to reach {keys}");
    let filled = fill(&load, FILL_PREFIX, 0, missing).await;
    if let Some(e) = &filled.first_error {
        warnings.push(format!(
            "fill: {} calls failed, the first with {e}",
            filled.errors
        ));
    }
    let memory_after = target.memory().await;
    let mut after = Vec::new();
    for run in 0..o.runs {
        eprintln!("bench: run {}/{}: pair 1k, after the fill", run + 1, o.runs);
        after.push(measure(u64::from(run)).await);
    }
    target.check_alive()?;
    let (b, a) = (summary(&before), summary(&after));
    let f = |v: &Value, k: &str| v[k].as_f64().unwrap_or(0.0);
    let ratio = f(&a, "p999_us") / f(&b, "p999_us").max(0.001);
    let row = |when: &str, memory: &Memory, s: &Value| {
        vec![
            when.to_owned(),
            memory.keys.map_or("?".to_owned(), |k| thousands(k as f64)),
            thousands(f(s, "rate")),
            format!("{:.1}", f(s, "p50_us")),
            format!("{:.1}", f(s, "p99_us")),
            format!("{:.1}", f(s, "p999_us")),
        ]
    };
    let rows = vec![
        row("before", &memory_before, &b),
        row("after", &memory_after, &a),
    ];
    let (lines, _) = render_table(
        &[
            "WHEN",
            "LIVE KEYS",
            "PAIRS/S",
            "P50 µs",
            "P99 µs",
            "P999 µs",
        ],
        &rows,
    );
    let mut text = lines.join("\n");
    text.push_str(&format!(
        "\n\npair on 1k keys, p999 after / before the fill: x{ratio:.2}\n"
    ));
    text.push_str(&fill_text(&filled, &memory_before, &memory_after));
    text.push_str(&memory_after.line());
    let figures = json!({
        "before": b,
        "after": a,
        "p999_ratio": ratio,
        "fill": fill_json(&filled, &memory_before, &memory_after),
        "memory": memory_after.json(),
    });
    Ok(("growth", text, figures))
}

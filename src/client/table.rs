//! Tables: columns aligned, the first two (names) to the left and the
//! rest (numbers) to the right, two spaces apart; and the table of keys
//! that `keys`, `watch` and `top` share.

use fusebox_proto::v1 as pb;

use crate::print::{human_ms, ms, phase_name, requests};

/// The columns of the key table.
pub(crate) const KEY_HEADERS: [&str; 8] = [
    "KEY",
    "PHASE",
    "BREAK LEFT",
    "FAIL RATIO",
    "FREE/LIMIT",
    "QUEUED",
    "TICKETS",
    "REQUESTS",
];

/// The table cells of one key, in [`KEY_HEADERS`] order.
pub(crate) fn key_cells(s: &pb::KeyState) -> Vec<String> {
    vec![
        s.key.clone(),
        phase_name(s.phase).to_owned(),
        ms(s.open_remaining).map_or_else(|| "-".to_owned(), human_ms),
        s.failure_ratio
            .map_or_else(|| "-".to_owned(), |r| format!("{:.1}%", r * 100.0)),
        if s.limit == 0 {
            "-".to_owned()
        } else {
            format!("{}/{}", s.free, s.limit)
        },
        s.queued.to_string(),
        s.live_tickets.to_string(),
        requests(s).to_string(),
    ]
}

/// The key table: a header and one line per key. With `width`, keys are
/// shortened so that lines fit. Also returns the columns' widths.
pub(crate) fn key_table(keys: &[pb::KeyState], width: Option<usize>) -> (Vec<String>, Vec<usize>) {
    let mut rows: Vec<Vec<String>> = keys.iter().map(key_cells).collect();
    let (lines, widths) = render_table(&KEY_HEADERS, &rows);
    let total: usize = widths.iter().sum::<usize>() + 2 * (widths.len() - 1);
    match width {
        Some(width) if total > width => {
            let room = (width + widths[0]).saturating_sub(total).max(12);
            for row in &mut rows {
                row[0] = shorten(&row[0], room);
            }
            render_table(&KEY_HEADERS, &rows)
        }
        _ => (lines, widths),
    }
}

/// `text` cut to `max` characters, ending in `…` when cut.
pub(crate) fn shorten(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let mut short: String = text.chars().take(max.saturating_sub(1)).collect();
    short.push('…');
    short
}

/// Lines of a table: the first two columns aligned left, the rest (numbers)
/// right, two spaces apart.
pub fn render_table(headers: &[&str], rows: &[Vec<String>]) -> (Vec<String>, Vec<usize>) {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    let lines = render_with(headers, rows, &mut widths);
    (lines, widths)
}

/// Lines of a table like [`render_table`], header first, whose columns are
/// at least `widths` wide; `widths` grows to fit the rows, so that pages
/// printed one after another line up as well as they can.
pub(crate) fn render_with(
    headers: &[&str],
    rows: &[Vec<String>],
    widths: &mut [usize],
) -> Vec<String> {
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut out = String::new();
        for (i, (cell, w)) in cells.zip(widths.iter()).enumerate() {
            if i > 0 {
                out.push_str("  ");
            }
            if i < 2 {
                out.push_str(&format!("{cell:<w$}"));
            } else {
                out.push_str(&format!("{cell:>w$}"));
            }
        }
        out.trim_end().to_owned()
    };
    let mut lines = vec![line(&mut headers.iter().copied())];
    for row in rows {
        lines.push(line(&mut row.iter().map(String::as_str)));
    }
    lines
}

//! The figures' arithmetic and their words: the order of the cells run by
//! run, medians across runs, counts with thousands separators, sizes in
//! bytes for people, lists of addresses.

use std::time::Duration;

/// `ms` milliseconds as a duration.
pub(crate) fn ms(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

/// The order in which run `run` measures `cells` cells: every one once,
/// starting one further along each run, so that drift and noise fall on
/// all cells alike.
pub(crate) fn interleaved(run: usize, cells: usize) -> impl Iterator<Item = usize> {
    (0..cells).map(move |i| (i + run) % cells)
}

/// The median; 0 for no values.
pub(crate) fn median(mut values: Vec<f64>) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

/// A count with thousands separators: `61,234`.
pub(crate) fn thousands(value: f64) -> String {
    let digits = format!("{:.0}", value.max(0.0));
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A size for people: `812 B`, `3.4 KiB`, `123.4 MiB`.
pub(crate) fn bytes(value: f64) -> String {
    let sign = if value < 0.0 { "-" } else { "" };
    let v = value.abs();
    if v < 1024.0 {
        format!("{sign}{v:.0} B")
    } else if v < 1024.0 * 1024.0 {
        format!("{sign}{:.1} KiB", v / 1024.0)
    } else if v < 1024.0 * 1024.0 * 1024.0 {
        format!("{sign}{:.1} MiB", v / (1024.0 * 1024.0))
    } else {
        format!("{sign}{:.2} GiB", v / (1024.0 * 1024.0 * 1024.0))
    }
}

/// `items` separated by commas, or `none` when there are none.
pub(crate) fn listed(items: &[String], none: &str) -> String {
    if items.is_empty() {
        none.to_owned()
    } else {
        items.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_well() {
        assert_eq!(thousands(0.0), "0");
        assert_eq!(thousands(999.4), "999");
        assert_eq!(thousands(61_234.0), "61,234");
        assert_eq!(thousands(1_000_000.0), "1,000,000");
        assert_eq!(bytes(812.0), "812 B");
        assert_eq!(bytes(-2048.0), "-2.0 KiB");
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(Vec::new()), 0.0);
        assert_eq!(listed(&[], "none"), "none");
        assert_eq!(listed(&["a".to_owned(), "b".to_owned()], "none"), "a, b");
    }

    #[test]
    fn each_run_measures_every_cell_once_starting_one_further_along() {
        assert_eq!(interleaved(0, 3).collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(interleaved(1, 3).collect::<Vec<_>>(), [1, 2, 0]);
        assert_eq!(interleaved(4, 3).collect::<Vec<_>>(), [1, 2, 0]);
        assert_eq!(interleaved(2, 0).count(), 0);
    }
}

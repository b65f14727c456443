use std::collections::BTreeSet;
use std::sync::Arc;

use super::*;
use crate::http::state::HttpFigures;
use crate::node::Node;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

async fn acquire(engine: &crate::engine::Engine, key: &str) {
    engine
        .acquire(crate::engine::AcquireArgs {
            caller: Default::default(),
            key: key.to_owned(),
            permits: 1,
            max_wait: 0,
            lease: None,
            attempt: 0,
        })
        .await
        .expect("granted");
}

/// The reference of the families, as `reference.md` holds it.
fn reference() -> String {
    let mut out = String::from(
        "## Every family\n\n\
         Written in this order. A counter's name ends in `_total`. With `--store`, a\n\
         family whose figure means something else there says so in its help.\n\n\
         | family | type | labels | present | help |\n\
         |---|---|---|---|---|\n",
    );
    for f in FAMILIES {
        let labels = f
            .labels
            .iter()
            .map(|l| format!("`{l}`"))
            .collect::<Vec<_>>()
            .join(", ");
        let help = match f.store_help {
            Some(store) => format!("{} With `--store`: {}", f.help, store),
            None => f.help.to_owned(),
        };
        out.push_str(&format!(
            "| `{}` | {} | {} | {} | {} |\n",
            f.name,
            f.kind.as_str(),
            labels,
            f.when.words(),
            // Markdown (rustdoc reads the file): `[server]` is no link.
            help.replace('|', "\\|")
                .replace('[', "\\[")
                .replace(']', "\\]")
        ));
    }
    out
}

#[test]
fn the_reference_is_the_table() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/src/http/metrics/reference.md");
    let want = reference();
    if std::env::var_os("FUSEBOX_WRITE_REFERENCE").is_some() {
        std::fs::write(path, &want).expect("reference.md written");
    }
    let have = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        have == want,
        "src/http/metrics/reference.md differs from FAMILIES; run the test with \
         FUSEBOX_WRITE_REFERENCE=1 to write it again. It should read:\n{want}"
    );
}

#[test]
fn the_table_names_each_family_once_as_prometheus_expects() {
    let mut names = BTreeSet::new();
    for f in FAMILIES {
        assert!(names.insert(f.name), "{} is in the table twice", f.name);
        assert!(
            f.name.starts_with("fusebox_") || f.name == "process_resident_memory_bytes",
            "{} lacks the fusebox_ prefix",
            f.name
        );
        assert_eq!(
            f.kind == Type::Counter,
            f.name.ends_with("_total"),
            "{}: counters, and only they, end in _total",
            f.name
        );
        let valid = |s: &str| {
            s.chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        };
        assert!(valid(f.name), "{}", f.name);
        assert!(f.labels.iter().all(|l| valid(l) && !l.starts_with("__")));
        assert!(!f.help.is_empty() && !f.help.contains('\n'), "{}", f.name);
    }
}

#[test]
fn an_embedded_server_shows_every_family_it_has_with_its_type() {
    let engine = Arc::new(crate::engine::Engine::with_manual_clock(
        crate::engine::Settings::default(),
    ));
    let rt = runtime();
    rt.block_on(acquire(&engine, "k"));
    let node = Node::of(engine);
    let text = rt.block_on(render(&node, &HttpFigures::default(), &Shown::Every));
    for f in FAMILIES {
        let line = format!("# TYPE {} {}\n", f.name, f.kind.as_str());
        let expected = match f.when {
            When::Always | When::Embedded => true,
            When::Linux => cfg!(target_os = "linux"),
            When::DataDir | When::Store | When::Tls | When::TlsExpiry | When::Telemetry => false,
        };
        assert_eq!(text.contains(&line), expected, "{line:?} in:\n{text}");
    }
    assert!(text.contains("# HELP fusebox_keys Live keys.\n"), "{text}");
    assert!(text.contains("\nfusebox_keys 1\n"), "{text}");
    assert!(
        text.contains("\nfusebox_idle_after_seconds 600\n"),
        "{text}"
    );
}

#[test]
fn label_values_are_escaped() {
    let engine = Arc::new(crate::engine::Engine::with_manual_clock(
        crate::engine::Settings::default(),
    ));
    let rt = runtime();
    rt.block_on(acquire(&engine, "odd/\"quoted\"\\back"));
    let node = Node::of(engine);
    let text = rt.block_on(render(&node, &HttpFigures::default(), &Shown::Every));
    assert!(
        text.contains("fusebox_key_live_tickets{key=\"odd/\\\"quoted\\\"\\\\back\"} 1\n"),
        "{text}"
    );
}

#[test]
fn the_busiest_keys_are_shown_and_the_rest_aggregated() {
    let engine = Arc::new(crate::engine::Engine::with_manual_clock(
        crate::engine::Settings::default(),
    ));
    let rt = runtime();
    rt.block_on(async {
        for i in 0..(TOP_KEYS + 5) {
            // Key i gets i + 1 requests: the five quietest are aggregated.
            for _ in 0..=i {
                acquire(&engine, &format!("k/{i:03}")).await;
            }
        }
    });
    let node = Node::of(engine);
    let text = rt.block_on(render(&node, &HttpFigures::default(), &Shown::Every));
    assert!(!text.contains("key=\"k/004\""));
    assert!(text.contains("fusebox_key_live_tickets{key=\"k/005\"} 6\n"));
    assert!(text.contains("fusebox_other_keys{phase=\"CLOSED\"} 5\n"));
    assert!(text.contains("fusebox_other_keys_live_tickets 15\n"));
    assert!(text.contains("fusebox_keys_by_phase{phase=\"CLOSED\"} 105\n"));
}

/// A label value with a quote, a backslash and a line feed is read back as
/// it was by a parser of the text format. No key can hold a line feed (a
/// control character), so the reading is given one here.
#[test]
fn label_values_round_trip_through_a_parser() {
    let engine = Arc::new(crate::engine::Engine::with_manual_clock(
        crate::engine::Settings::default(),
    ));
    let rt = runtime();
    rt.block_on(acquire(&engine, "plain"));
    let node = Node::of(engine);
    let mut scrape = rt.block_on(Scrape::read(node, HttpFigures::default(), &Shown::Every));
    let odd = "a \"quoted\" \\ back\nslash";
    scrape.keys[0].key = odd.to_owned();
    let text = super::collector::text_of(scrape);
    let parsed = openmetrics_parser::prometheus::parse_prometheus(&text)
        .unwrap_or_else(|e| panic!("the text does not parse: {e:?}\n{text}"));
    let family = &parsed.families["fusebox_key_live_tickets"];
    let keys: Vec<String> = family
        .iter_samples()
        .map(|s| {
            let labels = s.get_labelset().expect("labels");
            labels.get_label_value("key").expect("a key").to_owned()
        })
        .collect();
    assert_eq!(keys, [odd], "{text}");
}

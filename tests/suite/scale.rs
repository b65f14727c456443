//! Costs that do not grow with the key count, checked by counting work,
//! never by timing it: a page of keys looks at a bounded number of index
//! entries wherever it starts and whatever lies outside its prefix; idle
//! forgetting goes in batches that leave the shard free in between; the
//! engine-wide figures kept as keys change agree with a walk of every key.

use std::collections::BTreeMap;
use std::sync::Arc;

use fusebox::config::Config;
use fusebox::domain::{Decision, Outcome, Phase};
use fusebox::engine::{Engine, ManualClock, BATCH, SHARDS};

use crate::harness::{ask, call};
use proptest::prelude::*;

fn key_of(i: usize) -> String {
    format!("k/{i:06}")
}

/// The most index entries a page of `limit` keys may look at: the page
/// itself plus a few names fetched ahead from each shard.
fn page_bound(limit: usize) -> usize {
    limit + 2 * SHARDS * (2 * limit / SHARDS).clamp(8, 256) + 1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_looks_at_a_bounded_number_of_entries_wherever_it_starts() {
    let engine = Engine::with_manual_clock(Config::default());
    let total = 100_000;
    for i in 0..total {
        call(&engine, &key_of(i), Outcome::Failure).await;
    }
    for i in (0..total).step_by(10_007) {
        engine.isolate(&key_of(i), "", "test").expect("isolate");
    }

    // Every key, page by page, in key order.
    let mut after: Option<String> = None;
    let mut seen = 0;
    let mut pages = 0;
    let mut most_visited = 0;
    loop {
        let page = engine.list_page("", &[], after.as_deref(), 1000);
        most_visited = most_visited.max(page.visited);
        for reading in &page.readings {
            assert!(
                after.as_deref().is_none_or(|a| a < reading.key.as_str()),
                "keys come in order: {} after {after:?}",
                reading.key
            );
            assert_eq!(reading.key, key_of(seen), "no key skipped or repeated");
            seen += 1;
            after = Some(reading.key.clone());
        }
        pages += 1;
        if !page.more {
            break;
        }
    }
    assert_eq!(seen, total);
    assert_eq!(pages, total / 1000);
    assert!(
        most_visited <= page_bound(1000),
        "a page of 1000 looked at {most_visited} entries"
    );

    // A page deep in the key space costs what the first one does.
    let deep = engine.list_page("", &[], Some(&key_of(98_000)), 1000);
    assert_eq!(deep.readings.len(), 1000);
    assert!(
        deep.visited <= page_bound(1000),
        "deep page: {}",
        deep.visited
    );

    // A prefix matching 100 keys of 100,000 looks at about those.
    let narrow = engine.list_page("k/0123", &[], None, 1000);
    assert_eq!(narrow.readings.len(), 100);
    assert!(!narrow.more);
    assert!(narrow.visited <= 100, "prefix page: {}", narrow.visited);

    // The keys that are not CLOSED are found without looking at the rest.
    let broken = engine.list_page("", &[Phase::Isolated, Phase::Open], None, 100);
    let isolated: Vec<String> = (0..total).step_by(10_007).map(key_of).collect();
    let found: Vec<String> = broken.readings.iter().map(|r| r.key.clone()).collect();
    assert_eq!(found, isolated);
    assert!(
        broken.visited <= isolated.len(),
        "broken page: {}",
        broken.visited
    );
    let totals = engine.totals();
    assert_eq!(totals.keys, total as u64);
    assert_eq!(
        totals.by_phase[Phase::Isolated.index()],
        isolated.len() as u64
    );
}

#[test]
fn idle_forgetting_goes_in_batches_while_acquire_keeps_answering() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let clock = Arc::new(ManualClock::default());
    let config = Config::parse("[server]\nidle_after = \"1s\"\n", "test").expect("config");
    let engine = Engine::new(config, clock.clone(), None);
    let total = 100_000;
    runtime.block_on(async {
        for i in 0..total {
            call(&engine, &key_of(i), Outcome::Success).await;
        }
    });
    assert_eq!(engine.totals().keys, total as u64);
    // One key per shard to ask for while that very shard is being swept.
    let mut probes: BTreeMap<usize, String> = BTreeMap::new();
    for i in 0.. {
        let name = format!("probe/{i}");
        probes.entry(engine.shard_of(&name)).or_insert(name);
        if probes.len() == SHARDS {
            break;
        }
    }

    let now = clock.advance(1_000);
    let mut batches = 0;
    let mut answered = 0;
    let forgotten = engine.forget_idle_with(now, |report| {
        batches += 1;
        assert!(report.examined <= BATCH, "a batch of {}", report.examined);
        // The shard just swept is free again: a request on it is answered
        // now, between two batches of the same sweep.
        let key = &probes[&report.shard];
        let reply = runtime
            .block_on(engine.acquire(ask(key)))
            .expect("acquire between batches");
        assert!(matches!(reply.decision, Decision::Granted(Some(_))));
        engine
            .complete(&reply.ticket.expect("ticket"), Outcome::Success)
            .expect("complete");
        answered += 1;
    });
    assert_eq!(forgotten, total);
    assert!(
        batches >= total / BATCH,
        "{total} keys in {batches} batches of at most {BATCH}"
    );
    assert_eq!(answered, batches);
    // What is left is the probe keys, used just now.
    assert_eq!(engine.totals().keys, probes.len() as u64);
    assert_eq!(engine.totals().forgotten, total as u64);
}

#[tokio::test]
async fn the_busiest_key_comes_first() {
    let engine = Engine::with_manual_clock(Config::default());
    for i in 0..2_000 {
        call(&engine, &key_of(i), Outcome::Success).await;
    }
    for _ in 0..500 {
        call(&engine, "hot", Outcome::Success).await;
    }
    for i in 0..2_000 {
        call(&engine, &key_of(i), Outcome::Success).await;
    }
    let busiest = engine.busiest(5);
    assert_eq!(busiest.first().map(|r| r.key.as_str()), Some("hot"));
    assert!(busiest.len() <= 5);
}

/// One step of a random workload on a few keys.
#[derive(Clone, Debug)]
enum Step {
    Acquire(usize),
    Complete(usize, Outcome),
    Isolate(usize),
    Close(usize),
    Advance(u64),
}

fn step() -> impl Strategy<Value = Step> {
    let outcome = prop_oneof![
        Just(Outcome::Success),
        Just(Outcome::Failure),
        Just(Outcome::Ignored)
    ];
    prop_oneof![
        4 => (0..6usize).prop_map(Step::Acquire),
        4 => (0..64usize, outcome).prop_map(|(t, o)| Step::Complete(t, o)),
        1 => (0..6usize).prop_map(Step::Isolate),
        1 => (0..6usize).prop_map(Step::Close),
        2 => (1..3_000u64).prop_map(Step::Advance),
    ]
}

const POLICY: &str = r#"
[server]
idle_after = "2s"

[[rule]]
match = "c/*"
breaker = { mode = "consecutive", failures = 2, break = "1s" }
limiter = { kind = "concurrency", permits = 2, queue_limit = 0 }
lease = { default = "1500ms", max = "5s" }

[default]
breaker = { mode = "consecutive", failures = 1, break = "500ms" }
lease = { default = "700ms", max = "5s", expired_outcome = "FAILURE" }
"#;

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn figures_kept_as_keys_change_agree_with_a_walk(steps in prop::collection::vec(step(), 1..120)) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let engine = Engine::with_manual_clock(Config::parse(POLICY, "test").expect("config"));
        let keys = ["c/a", "c/b", "d/a", "d/b", "e", "f"];
        runtime.block_on(async {
            let mut tickets: Vec<String> = Vec::new();
            for step in steps {
                match step {
                    Step::Acquire(k) => {
                        if let Ok(reply) = engine.acquire(ask(keys[k])).await {
                            tickets.extend(reply.ticket);
                        }
                    }
                    Step::Complete(t, outcome) => {
                        if !tickets.is_empty() {
                            let ticket = tickets.swap_remove(t % tickets.len());
                            let _ = engine.complete(&ticket, outcome);
                        }
                    }
                    Step::Isolate(k) => { engine.isolate(keys[k], "", "test").expect("isolate"); }
                    Step::Close(k) => { engine.close(keys[k], "", "test").expect("close"); }
                    Step::Advance(ms) => { engine.advance_clock(ms).await; }
                }
            }
        });
        let mut by_phase = [0u64; 4];
        let mut live_tickets = 0u64;
        let walked = engine.visit_keys("", |r| {
            by_phase[r.view.phase.index()] += 1;
            live_tickets += r.view.live_tickets as u64;
        });
        let totals = engine.totals();
        prop_assert_eq!(totals.keys, walked as u64);
        prop_assert_eq!(totals.by_phase, by_phase);
        prop_assert_eq!(totals.tickets, live_tickets);
        prop_assert_eq!(totals.waiters, 0);
        let broken = engine.list("", &[Phase::Open, Phase::HalfOpen, Phase::Isolated], None, 100).0;
        prop_assert_eq!(broken.len() as u64, by_phase[1] + by_phase[2] + by_phase[3]);
    }
}

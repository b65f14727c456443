//! The dashboard's board and its sparklines: one sampler task for the whole
//! server (not one per viewer) that, every [`Options::sample_every`]
//! (3 s by default), reads the engine's totals, the busiest keys and the
//! keys that are not closed, and samples the request and failure counters
//! of a bounded set of keys, as Hystrix's dashboard drew its rates.
//!
//! Bounds, whatever the number of keys: the candidates of a round are the
//! [`BUSIEST`] busiest keys, the first [`ATTENTION`] keys not closed, and
//! the keys viewers were shown in the last [`SHOWN_FOR`] (at most
//! [`TRACKED_KEYS`] of them, the longest unseen dropped first); at most
//! [`TRACKED_KEYS`] series are kept (those sampled longest ago dropped
//! first), each of at most [`SAMPLES`] samples (the oldest dropped first).
//! So a round reads at most `BUSIEST + ATTENTION + TRACKED_KEYS` keys, and
//! the history holds at most `TRACKED_KEYS * SAMPLES` samples.
//!
//! [`Options::sample_every`]: super::Options::sample_every

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::watch;

use crate::domain::Phase;
use crate::engine::{KeyReading, Store, Totals};

/// How many of the busiest keys the board holds (and the sampler samples).
pub const BUSIEST: usize = 100;

/// How many keys that are not closed the board holds (and a listing of
/// them shows at most).
pub const ATTENTION: usize = 100;

/// Keys followed at once: the most series kept, and the most keys sampled
/// because viewers were shown them.
pub const TRACKED_KEYS: usize = 1024;

/// Samples kept per key: 100 samples 3 s apart draw the last five minutes.
pub const SAMPLES: usize = 100;

/// A key shown to a viewer is sampled for this long after.
pub const SHOWN_FOR: Duration = Duration::from_secs(120);

/// The phases that need attention, listed before the closed keys.
pub const NOT_CLOSED: [Phase; 3] = [Phase::Open, Phase::HalfOpen, Phase::Isolated];

/// What every viewer of the dashboard sees, made once per round.
#[derive(Clone, Debug, Default)]
pub struct Board {
    /// The round's number; 0 before the first round.
    pub round: u64,
    /// The store's figures ([`Store::figures`]).
    pub totals: Totals,
    /// The busiest keys, busiest first.
    pub busiest: Vec<KeyReading>,
    /// The first keys that are not closed, in key order.
    pub attention: Vec<KeyReading>,
    /// True when more keys are not closed than [`Board::attention`] holds.
    pub attention_more: bool,
}

/// A key's recent rates, per second, oldest first: one value per interval
/// between two samples.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Trend {
    /// Requests answered per second (granted, probes, blocked, refused, denied).
    pub requests: Vec<f64>,
    /// Failures recorded per second.
    pub failures: Vec<f64>,
}

#[derive(Clone, Copy, Debug)]
struct Sample {
    at: Instant,
    requests: u64,
    failures: u64,
}

#[derive(Debug, Default)]
struct History {
    series: HashMap<String, VecDeque<Sample>>,
    /// Keys shown to viewers, and when last.
    shown: HashMap<String, Instant>,
}

/// The sampler's state, shared by every handler.
#[derive(Debug)]
pub struct Trends {
    history: Mutex<History>,
    board: watch::Sender<Arc<Board>>,
    every: Duration,
}

/// Requests answered on a key since it was made.
pub fn requests_of(r: &KeyReading) -> u64 {
    let s = &r.view.stats;
    s.granted + s.probes + s.blocked + s.refused + s.denied
}

/// The count added between two readings of a counter; a counter that went
/// back restarted from zero (the key was forgotten and made again, K2).
fn added(before: u64, after: u64) -> u64 {
    if after >= before {
        after - before
    } else {
        after
    }
}

impl Trends {
    /// Starts the sampler over `store`, a round every `every`, until the
    /// server stops. Must be called inside a Tokio runtime.
    pub fn start(store: Store, every: Duration) -> Arc<Trends> {
        let (board, _) = watch::channel(Arc::new(Board::default()));
        let trends = Arc::new(Trends {
            history: Mutex::new(History::default()),
            board,
            every,
        });
        let sampler = trends.clone();
        let stopped = store.core().stopped();
        tokio::spawn(async move {
            let run = async {
                let mut ticks = tokio::time::interval(every);
                ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                for round in 1.. {
                    ticks.tick().await;
                    sampler.round(&store, round).await;
                }
            };
            tokio::select! {
                () = run => {}
                () = stopped => {}
            }
        });
        trends
    }

    /// How far apart samples are.
    pub fn every(&self) -> Duration {
        self.every
    }

    /// The latest board, to be read or waited on.
    pub fn subscribe(&self) -> watch::Receiver<Arc<Board>> {
        self.board.subscribe()
    }

    /// One round: reads the board and samples the candidates.
    async fn round(&self, store: &Store, round: u64) {
        let busiest = store.busiest(BUSIEST).await;
        let (attention, attention_more) = store.not_closed("", ATTENTION).await.unwrap_or_default();
        // Last, so that the counts are at least as fresh as the rows.
        let totals = store.figures().await.totals;
        let now = Instant::now();
        let shown: Vec<String> = {
            let mut history = self.history.lock().expect("trends lock");
            history
                .shown
                .retain(|_, at| now.duration_since(*at) < SHOWN_FOR);
            history.shown.keys().cloned().collect()
        };
        let mut readings: HashMap<&str, (u64, u64)> = HashMap::new();
        for r in busiest.iter().chain(&attention) {
            readings.insert(&r.key, (requests_of(r), r.view.stats.failures));
        }
        let mut extra: Vec<KeyReading> = Vec::new();
        for key in shown
            .iter()
            .filter(|key| !readings.contains_key(key.as_str()))
        {
            if let Ok(r) = store.get(key).await {
                extra.push(r);
            }
        }
        for r in &extra {
            readings.insert(&r.key, (requests_of(r), r.view.stats.failures));
        }
        self.record(now, readings);
        self.board.send_replace(Arc::new(Board {
            round,
            totals,
            busiest,
            attention,
            attention_more,
        }));
    }

    /// Adds a sample per key read, then drops what is over the bounds.
    fn record(&self, at: Instant, readings: HashMap<&str, (u64, u64)>) {
        let mut history = self.history.lock().expect("trends lock");
        for (key, (requests, failures)) in readings {
            if !history.series.contains_key(key) {
                history.series.insert(key.to_owned(), VecDeque::new());
            }
            let series = history.series.get_mut(key).expect("just inserted");
            if series.len() == SAMPLES {
                series.pop_front();
            }
            series.push_back(Sample {
                at,
                requests,
                failures,
            });
        }
        let over = history.series.len().saturating_sub(TRACKED_KEYS);
        if over > 0 {
            // The keys sampled longest ago go first.
            let mut by_age: Vec<(Instant, String)> = history
                .series
                .iter()
                .map(|(k, s)| (s.back().map_or(at, |x| x.at), k.clone()))
                .collect();
            by_age.sort_unstable();
            for (_, key) in by_age.into_iter().take(over) {
                history.series.remove(&key);
            }
        }
    }

    /// Notes that viewers were shown `keys`, so that they are sampled for a
    /// while ([`SHOWN_FOR`]).
    pub fn show<'a>(&self, keys: impl IntoIterator<Item = &'a str>) {
        let now = Instant::now();
        let mut history = self.history.lock().expect("trends lock");
        for key in keys {
            match history.shown.get_mut(key) {
                Some(at) => *at = now,
                None => {
                    history.shown.insert(key.to_owned(), now);
                }
            }
        }
        let over = history.shown.len().saturating_sub(TRACKED_KEYS);
        if over > 0 {
            // The keys shown longest ago go first.
            let mut by_age: Vec<(Instant, String)> = history
                .shown
                .iter()
                .map(|(k, at)| (*at, k.clone()))
                .collect();
            by_age.sort_unstable();
            for (_, key) in by_age.into_iter().take(over) {
                history.shown.remove(&key);
            }
        }
    }

    /// The trends of `keys` that have at least two samples.
    pub fn of<'a>(&self, keys: impl IntoIterator<Item = &'a str>) -> HashMap<String, Trend> {
        let history = self.history.lock().expect("trends lock");
        let mut out = HashMap::new();
        let mut seen = HashSet::new();
        for key in keys {
            if !seen.insert(key) {
                continue;
            }
            let Some(series) = history.series.get(key) else {
                continue;
            };
            let mut trend = Trend::default();
            for (a, b) in series.iter().zip(series.iter().skip(1)) {
                let seconds = b.at.duration_since(a.at).as_secs_f64().max(0.001);
                let rate = |n: u64| (n as f64 / seconds * 100.0).round() / 100.0;
                trend.requests.push(rate(added(a.requests, b.requests)));
                trend.failures.push(rate(added(a.failures, b.failures)));
            }
            if !trend.requests.is_empty() {
                out.insert(key.to_owned(), trend);
            }
        }
        out
    }

    /// How many series and shown keys are kept (for tests of the bounds).
    pub fn tracked(&self) -> (usize, usize) {
        let history = self.history.lock().expect("trends lock");
        (history.series.len(), history.shown.len())
    }
}

/// The latest board once the sampler made one; `None` when it stopped.
pub async fn current_board(boards: &mut watch::Receiver<Arc<Board>>) -> Option<Arc<Board>> {
    loop {
        let board = boards.borrow_and_update().clone();
        if board.round > 0 {
            return Some(board);
        }
        boards.changed().await.ok()?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trends() -> Trends {
        let (board, _) = watch::channel(Arc::new(Board::default()));
        Trends {
            history: Mutex::new(History::default()),
            board,
            every: Duration::from_secs(1),
        }
    }

    #[test]
    fn rates_are_per_second_between_samples_and_survive_a_restart() {
        let t = trends();
        let start = Instant::now();
        for (i, (requests, failures)) in [(10, 0), (30, 5), (4, 1)].into_iter().enumerate() {
            let at = start + Duration::from_secs(2 * i as u64);
            t.record(at, HashMap::from([("k", (requests, failures))]));
        }
        let trend = &t.of(["k", "k", "none"])["k"];
        // 20 requests in 2 s, then the key was made again: 4 since.
        assert_eq!(trend.requests, vec![10.0, 2.0]);
        assert_eq!(trend.failures, vec![2.5, 0.5]);
        assert_eq!(t.of(["none"]).len(), 0);
    }

    #[test]
    fn samples_keys_and_shown_keys_are_bounded() {
        let t = trends();
        let start = Instant::now();
        for i in 0..(SAMPLES + 10) {
            t.record(
                start + Duration::from_secs(i as u64),
                HashMap::from([("k", (i as u64, 0))]),
            );
        }
        assert_eq!(t.of(["k"])["k"].requests.len(), SAMPLES - 1);
        let names: Vec<String> = (0..TRACKED_KEYS + 50).map(|i| format!("k/{i}")).collect();
        for (i, name) in names.iter().enumerate() {
            let at = start + Duration::from_secs(1000 + i as u64);
            t.record(at, HashMap::from([(name.as_str(), (1, 0))]));
        }
        t.show(names.iter().map(String::as_str));
        assert_eq!(t.tracked(), (TRACKED_KEYS, TRACKED_KEYS));
        // The ones sampled longest ago went first.
        let history = t.history.lock().unwrap();
        assert!(!history.series.contains_key("k"));
        assert!(!history.series.contains_key("k/0"));
        assert!(history
            .series
            .contains_key(&format!("k/{}", TRACKED_KEYS + 49)));
    }
}

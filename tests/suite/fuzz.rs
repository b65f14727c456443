//! Fuzzing on stable Rust: structured random input (proptest) at every door
//! fusebox opens to the outside, checked for what the contract promises
//! whatever comes in: no panic, no crash, errors that name the field (Y2,
//! E2), nothing changed by a refused request (E3), and the engine's
//! invariants after every step of a random operation sequence.
//!
//! - the config parser, on random text and on valid configs and mutations
//!   of them; a valid config round-trips to the same rules;
//! - ticket tokens, random and mutated, given to Complete and Renew;
//! - `SetPolicy` messages through `policy_of`, and over gRPC;
//! - raw bytes as the request body of every RPC of a real server;
//! - random operation sequences on an engine with a manual clock (tickets,
//!   waiters that give up, leases that end, isolate, close, policy changes).
//!
//! Case counts are small so that the module stays fast in CI (about 15 s in
//! a debug build). A long run gives every property a time budget instead:
//!
//! ```text
//! FUSEBOX_FUZZ_SECONDS=160 cargo test --release --test suite fuzz -- --test-threads 2
//! ```
//!
//! runs each of the eight properties for 160 s (new random cases round after
//! round), two at a time: about 11 minutes. A failure is shrunk and saved
//! under `tests/proptest-regressions/fuzz.txt`, which is committed: saved
//! cases are replayed first on every run.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use fusebox::config::{Config, ConfigError};
use fusebox::domain::{Decision, Outcome, Phase, Policy, PolicySpec};
use fusebox::engine::Pattern;
use fusebox::engine::{AcquireArgs, AcquireReply, Engine, EngineError};
use fusebox::proto::v1 as pb;
use fusebox::server::policy::{policy_of, wire_policy};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{TestCaseError, TestRunner};
use prost::bytes::{Buf, BufMut};
use prost::Message;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::{Code, Status};

use crate::harness::{Options, Server};

// ---------------------------------------------------------------------------
// Running properties: a few cases by default, a time budget for long runs.

/// Seconds each property runs for, from `FUSEBOX_FUZZ_SECONDS`; unset means
/// the default case counts.
fn budget() -> Option<Duration> {
    let text = std::env::var("FUSEBOX_FUZZ_SECONDS").ok()?;
    let seconds: u64 = text
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("FUSEBOX_FUZZ_SECONDS must be whole seconds, not {text:?}"));
    Some(Duration::from_secs(seconds))
}

/// Runs `test` on `cases` random values of `strategy`; with a budget, runs
/// rounds of `cases` until the budget is spent. Panics with the shrunk
/// failing value (saved for replay) on the first failure.
///
/// The cases run on a thread with a large stack: proptest's nested
/// strategies go deep in a debug build.
pub(crate) fn fuzz<S>(
    name: &str,
    cases: u32,
    strategy: S,
    test: impl Fn(S::Value) -> Result<(), TestCaseError> + Sync,
) where
    S: Strategy + Sync,
    S::Value: Debug,
{
    std::thread::scope(|scope| {
        let run = std::thread::Builder::new()
            .name(format!("fuzz {name}"))
            .stack_size(64 << 20)
            .spawn_scoped(scope, || fuzz_here(name, cases, &strategy, &test))
            .expect("a fuzz thread");
        if let Err(panic) = run.join() {
            std::panic::resume_unwind(panic);
        }
    });
}

fn fuzz_here<S>(
    name: &str,
    cases: u32,
    strategy: &S,
    test: &(impl Fn(S::Value) -> Result<(), TestCaseError> + Sync),
) where
    S: Strategy,
    S::Value: Debug,
{
    let deadline = budget().map(|b| Instant::now() + b);
    let started = Instant::now();
    let mut rounds = 0u64;
    loop {
        let config = ProptestConfig {
            cases,
            source_file: Some(file!()),
            max_shrink_iters: 4_000,
            ..ProptestConfig::default()
        };
        let mut runner = TestRunner::new(config);
        if let Err(failure) = runner.run(strategy, test) {
            panic!("{name}: {failure}");
        }
        rounds += 1;
        match deadline {
            Some(d) if Instant::now() < d => continue,
            _ => break,
        }
    }
    eprintln!(
        "fuzz {name}: {} cases in {:.1?}",
        rounds * u64::from(cases),
        started.elapsed()
    );
}

// ---------------------------------------------------------------------------
// The config parser

/// A random valid config: server limits, rules and perhaps a default.
#[derive(Clone, Debug)]
struct ConfigCase {
    server: BTreeMap<&'static str, u64>,
    idle_after: Option<u64>,
    rules: Vec<(String, PolicySpec)>,
    default: Option<PolicySpec>,
}

fn pattern() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z]{1,6}(/[a-z0-9]{1,4}){0,2}",
        "[a-z]{1,6}/\\*",
        Just("*".to_owned()),
        "[a-zé ü.:-]{1,8}\\*?",
    ]
}

fn config_case() -> impl Strategy<Value = ConfigCase> {
    let caps = [
        "max_keys",
        "max_tickets",
        "max_waiters",
        "max_connections",
        "max_watch_streams",
        "max_event_streams",
    ];
    (
        prop::collection::btree_map(prop::sample::select(caps.to_vec()), 1u64..=1_000_000, 0..=4),
        prop::option::of(1u64..=86_400_000),
        prop::collection::vec((pattern(), crate::properties::policy_spec()), 0..=5),
        prop::option::of(crate::properties::policy_spec()),
    )
        .prop_map(|(server, idle_after, rules, default)| ConfigCase {
            server,
            idle_after,
            rules,
            default,
        })
}

/// A spec as a TOML table, through its own `Serialize`.
fn spec_table(spec: &PolicySpec) -> toml::Table {
    toml::Table::try_from(spec).expect("a spec serializes")
}

/// The config file text of `case`.
fn render(case: &ConfigCase) -> String {
    let mut top = toml::Table::new();
    let mut server = toml::Table::new();
    for (name, value) in &case.server {
        server.insert((*name).into(), toml::Value::Integer(*value as i64));
    }
    if let Some(ms) = case.idle_after {
        server.insert(
            "idle_after".into(),
            toml::Value::String(fusebox::domain::policy::format_duration(ms)),
        );
    }
    if !server.is_empty() {
        top.insert("server".into(), toml::Value::Table(server));
    }
    let rules: Vec<toml::Value> = case
        .rules
        .iter()
        .map(|(pattern, spec)| {
            let mut t = spec_table(spec);
            t.insert("match".into(), toml::Value::String(pattern.clone()));
            toml::Value::Table(t)
        })
        .collect();
    if !rules.is_empty() {
        top.insert("rule".into(), toml::Value::Array(rules));
    }
    if let Some(spec) = &case.default {
        top.insert("default".into(), toml::Value::Table(spec_table(spec)));
    }
    toml::to_string(&top).expect("a table renders")
}

/// The config that writes `config` out in full.
fn case_of(config: &Config) -> ConfigCase {
    let l = config.limits;
    ConfigCase {
        server: BTreeMap::from([
            ("max_keys", l.max_keys),
            ("max_tickets", l.max_tickets),
            ("max_waiters", l.max_waiters),
            ("max_connections", l.max_connections),
            ("max_watch_streams", l.max_watch_streams),
            ("max_event_streams", l.max_event_streams),
        ]),
        idle_after: Some(l.idle_after),
        rules: config
            .rules
            .rules
            .iter()
            .map(|r| (r.pattern.text(), Policy::spec(&r.policy)))
            .collect(),
        default: Some(Policy::spec(&config.rules.default)),
    }
}

/// A refused config says where: the file for text that is not TOML, the
/// rule (or section) and the field for anything else (Y2).
fn error_names_its_place(text: &str, e: &ConfigError) -> Result<(), TestCaseError> {
    let shown = e.to_string();
    prop_assert!(!shown.trim().is_empty(), "an empty error for {text:?}");
    match e {
        ConfigError::Read { .. } => prop_assert!(false, "parse never reads: {shown}"),
        ConfigError::Parse { path, message } => {
            prop_assert_eq!(path.as_str(), "fuzz.toml");
            prop_assert!(!message.trim().is_empty(), "no parser message: {shown}");
            prop_assert!(!message.contains('\n'), "a message on one line: {shown}");
        }
        ConfigError::Invalid {
            rule,
            field,
            problem,
        } => {
            let named = rule.starts_with("rule ") || rule.starts_with('[');
            prop_assert!(named, "the rule is not named: {shown}");
            prop_assert!(!field.trim().is_empty(), "no field: {shown}");
            prop_assert!(!problem.trim().is_empty(), "no problem: {shown}");
        }
    }
    Ok(())
}

/// A change of one line of a config file.
#[derive(Clone, Debug)]
enum Mutation {
    DeleteLine(Index),
    DuplicateLine(Index),
    /// Replaces what follows `=` on a line.
    Value(Index, String),
    /// Inserts a line before another.
    Insert(Index, String),
    /// Cuts the text at a byte (or the nearest char boundary before it).
    Truncate(Index),
    /// Replaces one char.
    Char(Index, char),
}

fn toml_value() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "0",
            "-1",
            "1",
            "4294967296",
            "18446744073709551616",
            "1e400",
            "nan",
            "inf",
            "-0.0",
            "0.5",
            "2.0",
            "true",
            "[]",
            "{}",
            "\"\"",
            "\"0ms\"",
            "\"1ms\"",
            "\"366d\"",
            "\"365d\"",
            "\"1.5s\"",
            "\"10x\"",
            "\"-5s\"",
            "\"99999999999999999999h\"",
            "\"consecutive\"",
            "\"ratio\"",
            "\"concurrency\"",
            "\"token_bucket\"",
            "\"fixed_window\"",
            "\"sliding_window\"",
            "\"newest_first\"",
            "\"FAILURE\"",
            "\"SUCCESS\"",
            "\"a*b\"",
            "\"*\"",
            "1979-05-27",
            "[1, \"a\"]",
        ])
        .prop_map(str::to_owned),
        any::<i64>().prop_map(|v| v.to_string()),
        any::<f64>().prop_map(|v| format!("{v:?}")),
        "\"[ -~]{0,12}\"",
    ]
}

fn toml_line() -> impl Strategy<Value = String> {
    let key = prop::sample::select(vec![
        "mode",
        "failures",
        "failure_ratio",
        "minimum_throughput",
        "sampling_window",
        "break",
        "multiplier",
        "max_break",
        "probe_lease",
        "kind",
        "permits",
        "capacity",
        "refill",
        "period",
        "window",
        "segments",
        "queue_limit",
        "order",
        "default",
        "max",
        "expired_outcome",
        "match",
        "max_keys",
        "idle_after",
        "bogus",
    ]);
    prop_oneof![
        (key, toml_value()).prop_map(|(k, v)| format!("{k} = {v}")),
        prop::sample::select(vec![
            "[server]",
            "[default]",
            "[[rule]]",
            "[rule]",
            "[default.breaker]",
            "[default.limiter]",
            "[default.lease]",
            "[rule.breaker]",
            "[[rule.limiter]]",
            "[other]",
            "[",
            "]]",
            "= 1",
            "\"",
            "'''",
            "#",
            "",
        ])
        .prop_map(str::to_owned),
        "[ -~]{0,30}",
    ]
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        any::<Index>().prop_map(Mutation::DeleteLine),
        any::<Index>().prop_map(Mutation::DuplicateLine),
        (any::<Index>(), toml_value()).prop_map(|(i, v)| Mutation::Value(i, v)),
        (any::<Index>(), toml_line()).prop_map(|(i, l)| Mutation::Insert(i, l)),
        any::<Index>().prop_map(Mutation::Truncate),
        (any::<Index>(), any::<char>()).prop_map(|(i, c)| Mutation::Char(i, c)),
    ]
}

fn mutate(text: &str, m: &Mutation) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    if lines.is_empty() {
        lines.push(String::new());
    }
    match m {
        Mutation::DeleteLine(i) => {
            lines.remove(i.index(lines.len()));
        }
        Mutation::DuplicateLine(i) => {
            let at = i.index(lines.len());
            lines.insert(at, lines[at].clone());
        }
        Mutation::Value(i, value) => {
            let at = i.index(lines.len());
            if let Some((key, _)) = lines[at].split_once('=') {
                lines[at] = format!("{key}= {value}");
            }
        }
        Mutation::Insert(i, line) => {
            let at = i.index(lines.len() + 1);
            lines.insert(at, line.clone());
        }
        Mutation::Truncate(i) => {
            let mut cut = i.index(text.len() + 1);
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            return text[..cut].to_owned();
        }
        Mutation::Char(i, c) => {
            let mut chars: Vec<char> = text.chars().collect();
            if chars.is_empty() {
                return c.to_string();
            }
            let at = i.index(chars.len());
            chars[at] = *c;
            return chars.into_iter().collect();
        }
    }
    lines.join("\n")
}

#[test]
fn fuzz_a_valid_config_parses_to_its_rules_and_round_trips() {
    fuzz("valid config", 256, config_case(), |case| {
        let text = render(&case);
        let parsed = Config::parse(&text, "fuzz.toml");
        // A pattern may be invalid ('*' inside): then it is refused, by name.
        let bad_pattern = case
            .rules
            .iter()
            .position(|(p, _)| Pattern::parse(p).is_err());
        let config = match (parsed, bad_pattern) {
            (Err(e), Some(i)) => {
                let ConfigError::Invalid { rule, field, .. } = &e else {
                    return Err(TestCaseError::fail(format!("{e}")));
                };
                prop_assert!(rule.starts_with(&format!("rule {} (", i + 1)), "{}", e);
                prop_assert_eq!(field.as_str(), "match");
                return Ok(());
            }
            (Ok(c), None) => c,
            (other, _) => {
                return Err(TestCaseError::fail(format!(
                    "{other:?} for a config whose bad pattern is {bad_pattern:?}:\n{text}"
                )))
            }
        };
        prop_assert_eq!(config.rules.rules.len(), case.rules.len());
        for (rule, (pattern, spec)) in config.rules.rules.iter().zip(&case.rules) {
            prop_assert_eq!(rule.pattern.text(), pattern.clone());
            prop_assert_eq!(Ok(rule.policy), spec.validate());
        }
        match &case.default {
            Some(spec) => prop_assert_eq!(Ok(config.rules.default), spec.validate()),
            None => prop_assert_eq!(config.rules.default, Policy::default()),
        }
        for (name, value) in &case.server {
            let l = config.limits;
            let got = match *name {
                "max_keys" => l.max_keys,
                "max_tickets" => l.max_tickets,
                "max_waiters" => l.max_waiters,
                "max_connections" => l.max_connections,
                "max_watch_streams" => l.max_watch_streams,
                _ => l.max_event_streams,
            };
            prop_assert_eq!(got, *value, "[server].{}", name);
        }
        if let Some(ms) = case.idle_after {
            prop_assert_eq!(config.limits.idle_after, ms);
        }
        // Written out in full, the validated config reads back the same.
        let again = render(&case_of(&config));
        let reread = Config::parse(&again, "fuzz.toml");
        prop_assert_eq!(
            reread.as_ref().ok(),
            Some(&config),
            "round trip of\n{}",
            again
        );
        Ok(())
    });
}

#[test]
fn fuzz_a_mutated_config_is_used_or_refused_by_name() {
    let strategy = (config_case(), prop::collection::vec(mutation(), 1..=4));
    fuzz("mutated config", 512, strategy, |(case, mutations)| {
        let mut text = render(&case);
        for m in &mutations {
            text = mutate(&text, m);
        }
        match Config::parse(&text, "fuzz.toml") {
            Ok(config) => {
                // Accepted: it is a config that writes out and reads back the same.
                let again = render(&case_of(&config));
                let reread = Config::parse(&again, "fuzz.toml");
                prop_assert_eq!(reread.ok(), Some(config));
            }
            Err(e) => error_names_its_place(&text, &e)?,
        }
        Ok(())
    });
}

#[test]
fn fuzz_random_text_never_panics_the_config_parser() {
    let text = prop_oneof![
        ".{0,200}",
        prop::collection::vec(toml_line(), 0..12).prop_map(|l| l.join("\n")),
        prop::collection::vec(any::<u8>(), 0..200)
            .prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
    ];
    fuzz("random config text", 1024, text, |text| {
        if let Err(e) = Config::parse(&text, "fuzz.toml") {
            error_names_its_place(&text, &e)?;
        }
        Ok(())
    });
}

// ---------------------------------------------------------------------------
// Ticket tokens

const TICKET_CONFIG: &str = r#"
[[rule]]
match = "c/*"
limiter = { kind = "concurrency", permits = 3 }
breaker = { mode = "consecutive", failures = 1, break = "1s" }
"#;

fn token_text(live: Vec<String>) -> impl Strategy<Value = String> {
    let mutated =
        (prop::sample::select(live), any::<Index>(), any::<char>()).prop_map(|(token, i, c)| {
            let mut chars: Vec<char> = token.chars().collect();
            let at = i.index(chars.len());
            chars[at] = c;
            chars.into_iter().collect::<String>()
        });
    prop_oneof![
        Just(String::new()),
        ".{0,40}",
        "[0-9a-fA-F]{30,34}",
        "[0-9a-f]{32}",
        " ?[0-9a-f]{31} ?",
        "[+-]?[0-9a-f]{31}",
        mutated.clone(),
        mutated.prop_map(|t| t.to_uppercase()),
        prop::collection::vec(any::<u8>(), 0..48)
            .prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
    ]
}

#[test]
fn fuzz_random_tickets_are_not_found_and_change_nothing() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let config = Config::parse(TICKET_CONFIG, "tickets.toml").expect("a valid config");
    let engine = Engine::with_manual_clock(config);
    let mut live = Vec::new();
    for key in ["c/a", "c/a", "c/b", "plain"] {
        let reply = rt
            .block_on(engine.acquire(crate::harness::ask(key)))
            .expect("granted");
        live.push(reply.ticket.expect("a ticket"));
    }
    let keys = ["c/a", "c/b", "plain"];
    let views = |engine: &Engine| {
        keys.iter()
            .map(|k| engine.get(k).expect("readable").view)
            .collect::<Vec<_>>()
    };
    let before = (engine.totals(), views(&engine));
    let strategy = (
        token_text(live.clone()),
        prop::option::of(prop_oneof![Just(0u64), 1u64..=1_000_000]),
        prop::sample::select(vec![Outcome::Success, Outcome::Failure, Outcome::Ignored]),
    );
    fuzz("tickets", 1024, strategy, |(token, lease, outcome)| {
        if live.contains(&token) {
            return Ok(());
        }
        let renewed = engine.renew(&token, lease);
        let completed = engine.complete(&token, outcome);
        for result in [renewed.map(|_| ()), completed.map(|_| ())] {
            match result {
                Ok(()) => prop_assert!(false, "{token:?} was accepted"),
                Err(EngineError::TicketNotFound) => {}
                Err(EngineError::Invalid { field, .. }) => {
                    prop_assert!(
                        (field == "ticket" && token.is_empty())
                            || (field == "lease" && lease == Some(0)),
                        "{field} refused for {token:?} with lease {lease:?}"
                    );
                }
                Err(other) => prop_assert!(false, "{token:?}: {other:?}"),
            }
        }
        // E3: nothing changed.
        prop_assert_eq!(&(engine.totals(), views(&engine)), &before);
        Ok(())
    });
    // The live tickets are untouched: each completes once.
    for token in &live {
        engine
            .complete(token, Outcome::Success)
            .expect("a live ticket completes");
    }
}

// ---------------------------------------------------------------------------
// SetPolicy messages

fn wire_duration() -> impl Strategy<Value = Option<prost_types::Duration>> {
    let seconds = prop_oneof![
        4 => 0i64..=3,
        1 => Just(-1i64),
        1 => Just(i64::MAX),
        1 => Just(i64::MIN),
        1 => Just(31_536_000i64),
        1 => Just(31_536_001i64),
        1 => any::<i64>(),
    ];
    let nanos = prop_oneof![
        4 => Just(0i32),
        2 => 1i32..=999_999_999,
        1 => Just(999_999_999i32),
        1 => Just(1_000_000_000i32),
        1 => Just(-1i32),
        1 => any::<i32>(),
    ];
    prop::option::weighted(
        0.8,
        (seconds, nanos).prop_map(|(seconds, nanos)| prost_types::Duration { seconds, nanos }),
    )
}

fn count() -> impl Strategy<Value = u32> {
    prop_oneof![4 => 0u32..=6, 1 => any::<u32>()]
}

fn ratio() -> impl Strategy<Value = f64> {
    prop_oneof![
        4 => (0u32..=12).prop_map(|t| f64::from(t) / 10.0),
        1 => Just(f64::NAN),
        1 => Just(f64::INFINITY),
        1 => Just(-0.0),
        1 => any::<f64>(),
    ]
}

fn wire_enum() -> impl Strategy<Value = i32> {
    prop_oneof![6 => 0i32..=3, 1 => any::<i32>()]
}

fn wire_policy_message() -> impl Strategy<Value = pb::Policy> {
    use pb::limiter::Kind;
    let mode = prop_oneof![
        1 => Just(None),
        3 => count().prop_map(|failures| Some(pb::breaker::Mode::Consecutive(pb::Consecutive { failures }))),
        3 => (ratio(), count(), wire_duration()).prop_map(|(failure_ratio, minimum_throughput, sampling_window)| {
            Some(pb::breaker::Mode::Ratio(pb::Ratio { failure_ratio, minimum_throughput, sampling_window }))
        }),
    ];
    let breaker = (
        mode,
        wire_duration(),
        prop::option::of(ratio().prop_map(|r| r * 3.0)),
        wire_duration(),
        wire_duration(),
    )
        .prop_map(
            |(mode, break_duration, multiplier, max_break, probe_lease)| pb::Breaker {
                mode,
                break_duration,
                multiplier,
                max_break,
                probe_lease,
                ..Default::default()
            },
        );
    let kind = prop_oneof![
        1 => Just(None),
        2 => count().prop_map(|permits| Some(Kind::Concurrency(pb::Concurrency { permits }))),
        2 => (count(), count(), wire_duration()).prop_map(|(capacity, refill, period)| {
            Some(Kind::TokenBucket(pb::TokenBucket { capacity, refill, period }))
        }),
        2 => (count(), wire_duration()).prop_map(|(permits, window)| {
            Some(Kind::FixedWindow(pb::FixedWindow { permits, window }))
        }),
        2 => (count(), wire_duration(), count()).prop_map(|(permits, window, segments)| {
            Some(Kind::SlidingWindow(pb::SlidingWindow { permits, window, segments }))
        }),
    ];
    let limiter = (kind, count(), wire_enum()).prop_map(|(kind, queue_limit, order)| pb::Limiter {
        kind,
        queue_limit,
        order,
    });
    let lease = (wire_duration(), wire_duration(), wire_enum()).prop_map(
        |(default_lease, max_lease, expired_outcome)| pb::Lease {
            default_lease,
            max_lease,
            expired_outcome,
        },
    );
    (
        prop::option::of(breaker),
        prop::option::of(limiter),
        prop::option::of(lease),
    )
        .prop_map(|(breaker, limiter, lease)| pb::Policy {
            breaker,
            limiter,
            lease,
            ..Default::default()
        })
}

/// A refused policy is INVALID_ARGUMENT and names the wire field.
fn names_a_policy_field(status: &Status) -> Result<(), TestCaseError> {
    prop_assert_eq!(status.code(), Code::InvalidArgument, "{}", status.message());
    let message = status.message();
    let field = message.split(':').next().unwrap_or("");
    prop_assert!(
        field.starts_with("policy.") && !field.contains(' '),
        "the message names no field: {message:?}"
    );
    Ok(())
}

#[test]
fn fuzz_policy_messages_are_validated_and_round_trip() {
    fuzz("policy_of", 2048, wire_policy_message(), |message| {
        match policy_of(message) {
            Ok(policy) => {
                let wire = wire_policy(&policy);
                prop_assert_eq!(policy_of(wire).ok(), Some(policy), "{:?}", wire);
                // The wire form is the config's: the same spec validates alike.
                prop_assert_eq!(Policy::spec(&policy).validate(), Ok(policy));
            }
            Err(status) => names_a_policy_field(&status)?,
        }
        Ok(())
    });
}

#[test]
fn fuzz_set_policy_over_grpc_answers_the_rule_or_names_the_field() {
    let rt = runtime();
    let server = rt.block_on(Server::start(Options::default()));
    let strategy = (
        wire_policy_message(),
        prop_oneof![pattern(), ".{0,10}", Just(String::new())],
        prop::bool::weighted(0.2),
    );
    fuzz("SetPolicy", 96, strategy, |(policy, pattern, default)| {
        rt.block_on(async {
            let mut admin = server.admin().await;
            let rule = pb::PolicyRule {
                r#match: pattern.clone(),
                policy: Some(policy),
                default,
            };
            let expected = policy_of(policy);
            match admin
                .set_policy(pb::SetPolicyRequest { rule: Some(rule) })
                .await
            {
                Ok(answer) => {
                    let answer = answer.into_inner();
                    prop_assert_eq!(answer.r#match, pattern);
                    prop_assert_eq!(answer.default, default);
                    let Ok(expected) = expected else {
                        return Err(TestCaseError::fail("an invalid policy was set"));
                    };
                    prop_assert_eq!(answer.policy, Some(wire_policy(&expected)));
                }
                Err(status) if expected.is_err() => names_a_policy_field(&status)?,
                Err(status) => {
                    // A valid policy under a bad match (or a match for the default).
                    prop_assert_eq!(status.code(), Code::InvalidArgument);
                    prop_assert!(
                        status.message().starts_with("rule.match:"),
                        "{}",
                        status.message()
                    );
                }
            }
            let policies = admin
                .list_policies(pb::ListPoliciesRequest {})
                .await
                .map_err(|s| TestCaseError::fail(format!("ListPolicies: {s}")))?;
            prop_assert!(policies.into_inner().default.is_some());
            Ok(())
        })
    });
}

// ---------------------------------------------------------------------------
// Raw bytes at every RPC

/// Sends bytes as they are and reads the answer's bytes: a gRPC codec that
/// does not encode or decode.
#[derive(Clone, Copy, Default)]
struct RawCodec;

struct RawEncoder;
struct RawDecoder;

impl Encoder for RawEncoder {
    type Item = Vec<u8>;
    type Error = Status;
    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawDecoder {
    type Item = Vec<u8>;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
        let mut out = vec![0; src.remaining()];
        src.copy_to_slice(&mut out);
        Ok(Some(out))
    }
}

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawEncoder;
    type Decoder = RawDecoder;
    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }
    fn decoder(&mut self) -> RawDecoder {
        RawDecoder
    }
}

/// Every method of the three services, and a valid request for each.
fn methods() -> Vec<(&'static str, Vec<u8>)> {
    let d = |ms: u64| Some(fusebox::proto::wire::duration_of(ms));
    vec![
        (
            "/fusebox.v1.Fusebox/Acquire",
            pb::AcquireRequest {
                key: "fz/a".into(),
                permits: Some(1),
                max_wait: d(5),
                lease: d(50),
                ..Default::default()
            }
            .encode_to_vec(),
        ),
        (
            "/fusebox.v1.Fusebox/Complete",
            pb::CompleteRequest {
                ticket: "0123456789abcdef0123456789abcdef".into(),
                outcome: pb::Outcome::Failure as i32,
                cost: None,
            }
            .encode_to_vec(),
        ),
        (
            "/fusebox.v1.Fusebox/Renew",
            pb::RenewRequest {
                ticket: "0123456789abcdef0123456789abcdef".into(),
                lease: d(100),
            }
            .encode_to_vec(),
        ),
        (
            "/fusebox.v1.Admin/GetKey",
            pb::GetKeyRequest { key: "fz/a".into() }.encode_to_vec(),
        ),
        (
            "/fusebox.v1.Admin/Isolate",
            pb::IsolateRequest {
                key: "fz/b".into(),
                reason: "fuzz".into(),
            }
            .encode_to_vec(),
        ),
        (
            "/fusebox.v1.Admin/Close",
            pb::CloseRequest {
                key: "fz/b".into(),
                reason: "fuzz".into(),
            }
            .encode_to_vec(),
        ),
        (
            "/fusebox.v1.Admin/ListKeys",
            pb::ListKeysRequest {
                prefix: "fz/".into(),
                phases: vec![pb::Phase::Closed as i32],
                page_size: 10,
                page_token: String::new(),
            }
            .encode_to_vec(),
        ),
        (
            "/fusebox.v1.Admin/Watch",
            pb::WatchRequest {
                prefix: "fz/".into(),
            }
            .encode_to_vec(),
        ),
        (
            "/fusebox.v1.Admin/SetPolicy",
            pb::SetPolicyRequest {
                rule: Some(pb::PolicyRule {
                    r#match: "fz/p*".into(),
                    policy: Some(wire_policy(&Policy::default())),
                    default: false,
                }),
            }
            .encode_to_vec(),
        ),
        (
            "/fusebox.v1.Admin/DeletePolicy",
            pb::DeletePolicyRequest {
                r#match: "fz/p*".into(),
            }
            .encode_to_vec(),
        ),
        (
            "/fusebox.v1.Admin/ListPolicies",
            pb::ListPoliciesRequest {}.encode_to_vec(),
        ),
        (
            "/fusebox.v1.Clock/Advance",
            pb::AdvanceRequest { by: d(7) }.encode_to_vec(),
        ),
    ]
}

/// How a request body is made.
#[derive(Clone, Debug)]
enum Body {
    /// Random bytes.
    Random(Vec<u8>),
    /// The method's valid request with bytes changed.
    Mutated(Vec<(Index, u8)>),
    /// The valid request with random bytes appended.
    Appended(Vec<u8>),
    /// The valid request cut short.
    Truncated(Index),
    /// A string field (tag 1) holding these bytes, often not UTF-8.
    StringField(Vec<u8>),
    /// More than the server's message size limit.
    Oversize(usize),
}

fn body() -> impl Strategy<Value = Body> {
    prop_oneof![
        4 => prop::collection::vec(any::<u8>(), 0..120).prop_map(Body::Random),
        4 => prop::collection::vec((any::<Index>(), any::<u8>()), 1..4).prop_map(Body::Mutated),
        2 => prop::collection::vec(any::<u8>(), 1..40).prop_map(Body::Appended),
        2 => any::<Index>().prop_map(Body::Truncated),
        2 => prop::collection::vec(any::<u8>(), 0..40).prop_map(Body::StringField),
        1 => (fusebox::server::MAX_MESSAGE_BYTES + 1..fusebox::server::MAX_MESSAGE_BYTES + 2048)
            .prop_map(Body::Oversize),
    ]
}

fn body_bytes(valid: &[u8], body: &Body) -> Vec<u8> {
    match body {
        Body::Random(bytes) => bytes.clone(),
        Body::Mutated(changes) => {
            let mut bytes = valid.to_vec();
            if bytes.is_empty() {
                return changes.iter().map(|(_, b)| *b).collect();
            }
            for (i, b) in changes {
                let at = i.index(bytes.len());
                bytes[at] = *b;
            }
            bytes
        }
        Body::Appended(extra) => [valid, extra].concat(),
        Body::Truncated(i) => valid[..i.index(valid.len() + 1)].to_vec(),
        Body::StringField(bytes) => {
            let mut out = vec![0x0a];
            prost::encoding::encode_varint(bytes.len() as u64, &mut out);
            out.extend_from_slice(bytes);
            out
        }
        Body::Oversize(n) => {
            let mut out = vec![0x0a];
            prost::encoding::encode_varint(*n as u64, &mut out);
            out.resize(out.len() + n, b'a');
            out
        }
    }
}

/// Codes a request may be refused with; never INTERNAL or UNKNOWN.
fn acceptable(status: &Status) -> bool {
    matches!(
        status.code(),
        Code::InvalidArgument
            | Code::NotFound
            | Code::ResourceExhausted
            | Code::FailedPrecondition
            | Code::DeadlineExceeded
            | Code::Cancelled
    )
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
}

const RAW_CONFIG: &str = r#"
[[rule]]
match = "fz/"
limiter = { kind = "concurrency", permits = 1, queue_limit = 2 }
lease = { default = "100ms", max = "1s" }
[default]
breaker = { mode = "consecutive", failures = 2, break = "50ms" }
"#;

#[test]
fn fuzz_raw_bytes_at_every_rpc_never_fail_the_server() {
    let rt = runtime();
    let mut server = rt.block_on(Server::start(Options {
        config: Some(RAW_CONFIG),
        manual_clock: true,
        ..Options::default()
    }));
    let methods = methods();
    let call = (0..methods.len(), body());
    let answers = std::sync::Mutex::new(BTreeMap::<(String, String), u64>::new());
    fuzz(
        "raw bytes",
        256,
        prop::collection::vec(call, 1..=8),
        |batch| {
            rt.block_on(async {
                let channel = server.channel().await;
                for (method, body) in &batch {
                    let (path, valid) = &methods[*method];
                    let bytes = body_bytes(valid, body);
                    let mut grpc = tonic::client::Grpc::new(channel.clone());
                    grpc.ready()
                        .await
                        .map_err(|e| TestCaseError::fail(format!("channel not ready: {e}")))?;
                    let path = tonic::codegen::http::uri::PathAndQuery::from_static(path);
                    let mut request = tonic::Request::new(bytes);
                    request.set_timeout(Duration::from_millis(500));
                    let result = if path.path().ends_with("/Watch") {
                        match grpc.server_streaming(request, path.clone(), RawCodec).await {
                            Ok(stream) => {
                                let mut stream = stream.into_inner();
                                match tokio::time::timeout(Duration::from_secs(5), stream.message())
                                    .await
                                {
                                    Ok(Ok(_)) => Ok(()),
                                    Ok(Err(status)) => Err(status),
                                    Err(_) => Err(Status::deadline_exceeded("no snapshot")),
                                }
                            }
                            Err(status) => Err(status),
                        }
                    } else {
                        grpc.unary(request, path.clone(), RawCodec)
                            .await
                            .map(|_| ())
                    };
                    let code = match &result {
                        Ok(()) => "OK".to_owned(),
                        Err(status) => format!("{:?}", status.code()),
                    };
                    let method = path.path().rsplit('/').next().unwrap_or("").to_owned();
                    *answers
                        .lock()
                        .expect("answers")
                        .entry((method, code))
                        .or_default() += 1;
                    if let Err(status) = result {
                        if matches!(body, Body::Oversize(_)) {
                            prop_assert_eq!(
                                status.code(),
                                Code::ResourceExhausted,
                                "an oversized body says the limit: {}",
                                status.message()
                            );
                        }
                        prop_assert!(
                            acceptable(&status),
                            "{} with {:?} answered {:?}: {}",
                            path,
                            body,
                            status.code(),
                            status.message()
                        );
                    }
                }
                // Still serving: a valid request on a new connection.
                let mut admin = server.admin().await;
                let read = admin
                    .get_key(pb::GetKeyRequest { key: "fz/a".into() })
                    .await;
                prop_assert!(read.is_ok(), "GetKey after the batch: {read:?}");
                let mut fusebox = server.fusebox().await;
                let asked = fusebox
                    .acquire(crate::admin::status_check("fz/alive"))
                    .await;
                prop_assert!(asked.is_ok(), "Acquire after the batch: {asked:?}");
                Ok(())
            })
        },
    );
    let exited = server.child.try_wait().expect("the process can be polled");
    assert!(exited.is_none(), "the server exited: {exited:?}");
    for ((method, code), n) in answers.lock().expect("answers").iter() {
        eprintln!("raw bytes: {method:<14} {code:<18} {n}");
    }
    let logs = server.logs();
    assert!(!logs.contains("panicked"), "the server panicked:\n{logs}");
}

// ---------------------------------------------------------------------------
// Random engine operation sequences

const ENGINE_CONFIG: &str = r#"
[server]
max_tickets = 16
max_waiters = 5
idle_after = "150ms"

[[rule]]
match = "c/*"
breaker = { mode = "consecutive", failures = 2, break = "40ms", probe_lease = "30ms" }
limiter = { kind = "concurrency", permits = 3, queue_limit = 4 }
lease = { default = "60ms", max = "200ms" }

[[rule]]
match = "t/*"
breaker = { mode = "ratio", failure_ratio = 0.5, minimum_throughput = 2, sampling_window = "100ms", break = "30ms" }
limiter = { kind = "token_bucket", capacity = 2, refill = 1, period = "20ms", queue_limit = 2, order = "newest_first" }
lease = { default = "50ms", max = "120ms", expired_outcome = "FAILURE" }

[default]
breaker = { mode = "consecutive", failures = 1, break = "25ms" }
lease = { default = "40ms", max = "100ms" }
"#;

const KEYS: [&str; 5] = ["c/a", "c/b", "t/a", "t/b", "d/a"];

/// Policies the `c/*` rule is switched between: all concurrency limiters, so
/// that the permits of its keys can be counted whatever the rule in force.
fn c_policy(which: u8) -> Policy {
    let text = match which % 4 {
        0 => {
            r#"limiter = { kind = "concurrency", permits = 3, queue_limit = 4 }
                breaker = { mode = "consecutive", failures = 2, break = "40ms" }
                lease = { default = "60ms", max = "200ms" }"#
        }
        1 => {
            r#"limiter = { kind = "concurrency", permits = 1, queue_limit = 1, order = "newest_first" }
                lease = { default = "30ms", max = "90ms", expired_outcome = "FAILURE" }"#
        }
        2 => {
            r#"limiter = { kind = "concurrency", permits = 4 }
                breaker = { mode = "ratio", failure_ratio = 0.5, minimum_throughput = 2, sampling_window = "80ms", break = "20ms", multiplier = 2.0, max_break = "100ms" }"#
        }
        _ => {
            r#"limiter = { kind = "concurrency", permits = 2, queue_limit = 2 }
                breaker = { mode = "consecutive", failures = 1, break = "10ms", probe_lease = "5ms" }
                lease = { default = "20ms", max = "40ms" }"#
        }
    };
    let spec: PolicySpec = toml::from_str(text).expect("a policy spec");
    spec.validate().expect("a valid policy")
}

#[derive(Clone, Debug)]
enum EngineOp {
    Acquire {
        key: usize,
        permits: u32,
        max_wait: u64,
        lease: Option<u64>,
    },
    /// Completes a ticket, then perhaps drops a waiter before it is polled
    /// (a client that goes away as it is served).
    Complete {
        pick: Index,
        known: bool,
        outcome: Outcome,
        then_cancel: Option<Index>,
    },
    Renew {
        pick: Index,
        known: bool,
        lease: Option<u64>,
    },
    /// Drops a waiting acquire (its caller went away).
    Cancel(Index),
    Advance(u64),
    Isolate(usize),
    Close(usize),
    /// Sets the `c/*` rule to one of [`c_policy`].
    SetPolicy(u8),
    /// Removes the `t/*` rule, or puts it back.
    ToggleTokenRule,
}

fn engine_op() -> impl Strategy<Value = EngineOp> {
    let outcome = prop::sample::select(vec![
        Outcome::Success,
        Outcome::Failure,
        Outcome::Failure,
        Outcome::Ignored,
    ]);
    let lease = prop_oneof![3 => Just(None), 1 => Just(Some(0)), 6 => (1u64..=150).prop_map(Some)];
    prop_oneof![
        20 => (0..KEYS.len(), prop_oneof![1 => Just(0u32), 8 => 1u32..=3, 1 => 4u32..=5],
               prop_oneof![Just(0u64), 1u64..=80], lease.clone())
            .prop_map(|(key, permits, max_wait, lease)| EngineOp::Acquire { key, permits, max_wait, lease }),
        12 => (any::<Index>(), prop::bool::weighted(0.9), outcome, prop::option::weighted(0.2, any::<Index>()))
            .prop_map(|(pick, known, outcome, then_cancel)| EngineOp::Complete { pick, known, outcome, then_cancel }),
        4 => (any::<Index>(), prop::bool::weighted(0.8), lease)
            .prop_map(|(pick, known, lease)| EngineOp::Renew { pick, known, lease }),
        3 => any::<Index>().prop_map(EngineOp::Cancel),
        8 => prop_oneof![3 => 1u64..=10, 1 => 11u64..=120].prop_map(EngineOp::Advance),
        1 => (0..KEYS.len()).prop_map(EngineOp::Isolate),
        2 => (0..KEYS.len()).prop_map(EngineOp::Close),
        1 => any::<u8>().prop_map(EngineOp::SetPolicy),
        1 => Just(EngineOp::ToggleTokenRule),
    ]
}

type Pending<'a> = Pin<Box<dyn Future<Output = Result<AcquireReply, EngineError>> + 'a>>;

/// A ticket the model holds live.
#[derive(Clone, Copy, Debug)]
struct LiveTicket {
    key: usize,
    permits: u32,
    lease_end: u64,
    /// The epoch it was admitted as a probe in, if it is a probe.
    probe_epoch: Option<u64>,
    /// The rules' version it was granted under.
    rules_version: u64,
}

struct Waiting<'a> {
    key: usize,
    permits: u32,
    future: Pending<'a>,
}

struct Model<'a> {
    engine: &'a Engine,
    now: u64,
    live: BTreeMap<String, LiveTicket>,
    /// Tickets completed or ended: never accepted again.
    gone: Vec<String>,
    waiting: Vec<Waiting<'a>>,
    rules_version: u64,
    token_rule: bool,
}

fn poll_once<T>(future: &mut Pin<Box<dyn Future<Output = T> + '_>>) -> Poll<T> {
    let mut cx = Context::from_waker(std::task::Waker::noop());
    future.as_mut().poll(&mut cx)
}

impl<'a> Model<'a> {
    fn new(engine: &'a Engine) -> Self {
        Model {
            engine,
            now: 0,
            live: BTreeMap::new(),
            gone: Vec::new(),
            waiting: Vec::new(),
            rules_version: 0,
            token_rule: true,
        }
    }

    fn is_concurrency(key: usize) -> bool {
        KEYS[key].starts_with("c/")
    }

    /// Records the answer to an acquire of `permits` on `key`.
    fn answered(
        &mut self,
        key: usize,
        permits: u32,
        result: Result<AcquireReply, EngineError>,
        waited: bool,
    ) -> Result<(), TestCaseError> {
        let reply = match result {
            Ok(reply) => reply,
            Err(EngineError::Exhausted { .. }) if !waited => return Ok(()),
            Err(e) => {
                return Err(TestCaseError::fail(format!(
                    "acquire on {}: {e:?}",
                    KEYS[key]
                )))
            }
        };
        if waited {
            prop_assert!(
                reply.decision != Decision::Queued,
                "a waiter answered Queued"
            );
        }
        let Some(ticket) = reply.ticket else {
            prop_assert!(
                !matches!(reply.decision, Decision::Probe(_)) && reply.decision.grant().is_none(),
                "a grant without a ticket: {:?}",
                reply.decision
            );
            return Ok(());
        };
        prop_assert!(permits > 0, "a status check got a ticket");
        let lease_left = reply.lease_left.expect("a ticket has a lease");
        prop_assert!(lease_left > 0, "a ticket with no lease left");
        let probe_epoch = match reply.decision {
            Decision::Probe(_) => Some(self.engine.get(KEYS[key]).expect("readable").view.epoch),
            _ => None,
        };
        prop_assert!(
            !self.live.contains_key(&ticket) && !self.gone.contains(&ticket),
            "L1: a ticket token handed out twice"
        );
        self.live.insert(
            ticket,
            LiveTicket {
                key,
                permits,
                lease_end: self.now + lease_left,
                probe_epoch,
                rules_version: self.rules_version,
            },
        );
        Ok(())
    }

    /// Polls every waiting acquire once; answered ones leave the queue.
    fn poll_waiters(&mut self) -> Result<(), TestCaseError> {
        let mut still = Vec::new();
        let waiting = std::mem::take(&mut self.waiting);
        let mut answers = Vec::new();
        for mut w in waiting {
            match poll_once(&mut w.future) {
                Poll::Ready(result) => answers.push((w.key, w.permits, result)),
                Poll::Pending => still.push(w),
            }
        }
        self.waiting = still;
        for (key, permits, result) in answers {
            self.answered(key, permits, result, true)?;
        }
        Ok(())
    }

    /// Tickets whose lease ended by now are gone (L3).
    fn expire(&mut self) {
        let now = self.now;
        let ended: Vec<String> = self
            .live
            .iter()
            .filter(|(_, t)| t.lease_end <= now)
            .map(|(k, _)| k.clone())
            .collect();
        for token in ended {
            self.live.remove(&token);
            self.gone.push(token);
        }
    }

    fn pick_token(&self, pick: &Index, known: bool) -> Option<String> {
        if known {
            let n = self.live.len();
            (n > 0).then(|| self.live.keys().nth(pick.index(n)).cloned())?
        } else if !self.gone.is_empty() {
            Some(self.gone[pick.index(self.gone.len())].clone())
        } else {
            Some("00000000000000000000000000000000".into())
        }
    }

    fn step(&mut self, op: &EngineOp) -> Result<(), TestCaseError> {
        let engine = self.engine;
        match op {
            &EngineOp::Acquire {
                key,
                permits,
                max_wait,
                lease,
            } => {
                let mut future: Pending<'a> = Box::pin(engine.acquire(AcquireArgs {
                    caller: Default::default(),
                    key: KEYS[key].into(),
                    permits,
                    max_wait,
                    lease,
                    attempt: 0,
                }));
                match poll_once(&mut future) {
                    Poll::Ready(Err(EngineError::Invalid { field, .. })) => {
                        prop_assert_eq!(field, "lease");
                        prop_assert_eq!(lease, Some(0));
                    }
                    Poll::Ready(result) => {
                        prop_assert!(lease != Some(0), "a zero lease was accepted");
                        self.answered(key, permits, result, false)?;
                    }
                    Poll::Pending => {
                        prop_assert!(max_wait > 0, "P4: waiting with max_wait 0");
                        self.waiting.push(Waiting {
                            key,
                            permits,
                            future,
                        });
                    }
                }
            }
            EngineOp::Complete {
                pick,
                known,
                outcome,
                then_cancel,
            } => {
                let Some(token) = self.pick_token(pick, *known) else {
                    return Ok(());
                };
                let result = engine.complete(&token, *outcome);
                if self.live.remove(&token).is_some() {
                    prop_assert!(result.is_ok(), "L4: completing a live ticket: {result:?}");
                    self.gone.push(token);
                } else {
                    prop_assert_eq!(result.err(), Some(EngineError::TicketNotFound));
                }
                if let Some(i) = then_cancel {
                    if !self.waiting.is_empty() {
                        // Dropped unpolled: a grant it got is given back by the engine.
                        let w = self.waiting.remove(i.index(self.waiting.len()));
                        drop(w);
                    }
                }
            }
            EngineOp::Renew { pick, known, lease } => {
                let Some(token) = self.pick_token(pick, *known) else {
                    return Ok(());
                };
                let result = engine.renew(&token, *lease);
                if *lease == Some(0) {
                    prop_assert!(
                        matches!(result, Err(EngineError::Invalid { field: "lease", .. })),
                        "renew with a zero lease: {result:?}"
                    );
                } else if let Some(t) = self.live.get_mut(&token) {
                    let left = result
                        .map_err(|e| TestCaseError::fail(format!("L2: renewing live: {e:?}")))?;
                    prop_assert!(left > 0);
                    t.lease_end = self.now + left;
                } else {
                    prop_assert_eq!(result.err(), Some(EngineError::TicketNotFound));
                }
            }
            EngineOp::Cancel(i) => {
                if !self.waiting.is_empty() {
                    let w = self.waiting.remove(i.index(self.waiting.len()));
                    drop(w);
                }
            }
            EngineOp::Advance(by) => {
                // One millisecond at a time, so that every answer and every
                // lease end is seen at the time it happens.
                for _ in 0..*by {
                    let now = poll_ready(engine.advance_clock(1))
                        .ok_or_else(|| TestCaseError::fail("advance waited"))?
                        .ok_or_else(|| TestCaseError::fail("no manual clock"))?;
                    self.now += 1;
                    prop_assert_eq!(now, self.now);
                    self.expire();
                    self.poll_waiters()?;
                    self.check()?;
                }
            }
            EngineOp::Isolate(key) => {
                engine
                    .isolate(KEYS[*key], "fuzz", "fuzz")
                    .map_err(|e| TestCaseError::fail(format!("isolate: {e:?}")))?;
            }
            EngineOp::Close(key) => {
                engine
                    .close(KEYS[*key], "", "fuzz")
                    .map_err(|e| TestCaseError::fail(format!("close: {e:?}")))?;
            }
            EngineOp::SetPolicy(which) => {
                engine
                    .set_rule(fusebox::engine::Rule {
                        pattern: Pattern::Prefix("c/".into()),
                        policy: c_policy(*which),
                    })
                    .expect("no data dir: a rule is always set");
                self.rules_version += 1;
            }
            EngineOp::ToggleTokenRule => {
                if self.token_rule {
                    engine
                        .delete_rule("t/*")
                        .map_err(|e| TestCaseError::fail(format!("delete t/*: {e:?}")))?;
                } else {
                    let config =
                        Config::parse(ENGINE_CONFIG, "engine.toml").expect("a valid config");
                    let rule = config.rules.rules[1].clone();
                    engine
                        .set_rule(rule)
                        .expect("no data dir: a rule is always set");
                }
                self.token_rule = !self.token_rule;
                self.rules_version += 1;
            }
        }
        self.poll_waiters()?;
        self.check()
    }

    /// The invariants that hold after every step.
    fn check(&mut self) -> Result<(), TestCaseError> {
        // A read settles what is due on a key and adopts a changed rule
        // first (which may answer waiters): read, then collect answers.
        for name in KEYS {
            self.engine.get(name).expect("readable");
        }
        self.poll_waiters()?;
        let totals = self.engine.totals();
        prop_assert_eq!(
            totals.tickets,
            self.live.len() as u64,
            "live tickets: every grant is completed, ended by its lease, or live"
        );
        prop_assert_eq!(totals.waiters, self.waiting.len() as u64, "waiters");
        for (k, name) in KEYS.iter().enumerate() {
            let view = self.engine.get(name).expect("readable").view;
            let mine: Vec<&LiveTicket> = self.live.values().filter(|t| t.key == k).collect();
            let waiting = self.waiting.iter().filter(|w| w.key == k).count();
            prop_assert_eq!(view.live_tickets, mine.len(), "{} live tickets", name);
            prop_assert_eq!(view.waiters, waiting, "{} waiters", name);
            prop_assert!(view.free <= view.limit, "P8: {} free > limit", name);
            // B2: at most one live probe of the current epoch.
            let probes = mine
                .iter()
                .filter(|t| t.probe_epoch == Some(view.epoch))
                .count();
            prop_assert!(probes <= 1, "B2: {probes} live probes on {name}");
            // C4: waiters only while the breaker is closed.
            if waiting > 0 {
                prop_assert_eq!(view.phase, Phase::Closed, "C4: {} waiters", name);
            }
            // P7: permits held are those of the live tickets. Tickets from
            // before a rule change may or may not hold permits under the
            // new limiter.
            if Self::is_concurrency(k) {
                let sum = |old: bool| -> u32 {
                    mine.iter()
                        .filter(|t| (t.rules_version < self.rules_version) == old)
                        .map(|t| t.permits)
                        .sum()
                };
                let (new, old) = (sum(false), sum(true));
                prop_assert!(
                    view.free + new <= view.limit && view.limit <= view.free + new + old,
                    "P7 on {}: free {} limit {} held by tickets {} (+{} from before a rule change)",
                    name,
                    view.free,
                    view.limit,
                    new,
                    old
                );
            }
        }
        Ok(())
    }

    /// Completes every ticket and lets every wait and lease end: nothing is
    /// left behind, and every permit is back.
    fn finish(&mut self, outcome: Outcome) -> Result<(), TestCaseError> {
        for _ in 0..100 {
            let tokens: Vec<String> = self.live.keys().cloned().collect();
            for token in tokens {
                let result = self.engine.complete(&token, outcome);
                prop_assert!(result.is_ok(), "completing live {token}: {result:?}");
                self.live.remove(&token);
                self.gone.push(token);
                self.poll_waiters()?;
                self.check()?;
            }
            if self.waiting.is_empty() {
                break;
            }
            // Waiters left: only for permits that come with time.
            self.step(&EngineOp::Advance(25))?;
        }
        prop_assert!(self.waiting.is_empty(), "P6: waiters outlived every wait");
        let now = poll_ready(self.engine.advance_clock(1_000_000))
            .flatten()
            .ok_or_else(|| TestCaseError::fail("advance"))?;
        self.now = now;
        self.expire();
        self.check()?;
        let totals = self.engine.totals();
        prop_assert_eq!((totals.tickets, totals.waiters), (0, 0));
        for name in KEYS {
            let view = self.engine.get(name).expect("readable").view;
            prop_assert_eq!(view.free, view.limit, "P7: {} is full again at rest", name);
        }
        Ok(())
    }
}

/// The value of a future that is ready at its first poll.
fn poll_ready<T>(future: impl Future<Output = T>) -> Option<T> {
    let mut future: Pin<Box<dyn Future<Output = T> + '_>> = Box::pin(future);
    match poll_once(&mut future) {
        Poll::Ready(v) => Some(v),
        Poll::Pending => None,
    }
}

#[test]
fn fuzz_random_engine_operations_keep_tickets_permits_and_waiters() {
    let strategy = (
        prop::collection::vec(engine_op(), 1..=60),
        prop::sample::select(vec![Outcome::Success, Outcome::Failure, Outcome::Ignored]),
    );
    fuzz("engine operations", 256, strategy, |(ops, ending)| {
        let config = Config::parse(ENGINE_CONFIG, "engine.toml").expect("a valid config");
        let engine = Engine::with_manual_clock(config);
        let mut model = Model::new(&engine);
        model.check()?;
        for op in &ops {
            model.step(op)?;
        }
        model.finish(ending)?;
        drop(model);
        Ok(())
    });
}

/// Found by the engine fuzzer: a waiter answered when its key adopts a
/// changed rule (here granted, as the new rule has no limiter) was missing
/// from the live-ticket and waiter totals (`fusebox_tickets`,
/// `fusebox_waiters`) and from the ticket and waiter caps' counts.
#[test]
fn a_rule_change_that_answers_a_waiter_keeps_the_totals() {
    let config = Config::parse(ENGINE_CONFIG, "engine.toml").expect("a valid config");
    let engine = Engine::with_manual_clock(config);
    let mut first: Pending<'_> = Box::pin(engine.acquire(AcquireArgs {
        caller: Default::default(),
        key: "t/b".into(),
        permits: 1,
        max_wait: 0,
        lease: None,
        attempt: 0,
    }));
    let Poll::Ready(Ok(first)) = poll_once(&mut first) else {
        panic!("the first request is answered at once");
    };
    assert!(first.ticket.is_some(), "{first:?}");
    // Capacity 2, one token left: two permits wait.
    let mut waiter: Pending<'_> = Box::pin(engine.acquire(AcquireArgs {
        caller: Default::default(),
        key: "t/b".into(),
        permits: 2,
        max_wait: 50,
        lease: None,
        attempt: 0,
    }));
    assert!(poll_once(&mut waiter).is_pending(), "the request waits");
    assert_eq!((engine.totals().tickets, engine.totals().waiters), (1, 1));
    // Without the t/* rule the key has no limiter: the waiter is served at
    // the key's next operation (here a read).
    engine.delete_rule("t/*").expect("the rule exists");
    let view = engine.get("t/b").expect("readable").view;
    assert_eq!((view.live_tickets, view.waiters), (2, 0));
    let Poll::Ready(Ok(second)) = poll_once(&mut waiter) else {
        panic!("the waiter is answered");
    };
    assert!(second.ticket.is_some(), "{second:?}");
    let totals = engine.totals();
    assert_eq!((totals.tickets, totals.waiters), (2, 0), "totals");
    for t in [first.ticket, second.ticket].into_iter().flatten() {
        engine.complete(&t, Outcome::Success).expect("live");
    }
    let totals = engine.totals();
    assert_eq!((totals.tickets, totals.waiters), (0, 0), "totals at rest");
}

/// Found by the config fuzzer: `[server] idle_after` written as a bare
/// number of milliseconds was taken beyond 365 days, the limit of every
/// duration (and of the same value written with a unit), so that the
/// config did not read back the same once written out.
#[test]
fn server_idle_after_is_at_most_365_days_like_every_duration() {
    let year = fusebox::domain::policy::MAX_DURATION;
    for text in [format!("{}", year + 1), "\"366d\"".to_owned()] {
        let e = Config::parse(&format!("[server]\nidle_after = {text}\n"), "fuzz.toml")
            .expect_err("more than 365 days is refused");
        assert!(
            matches!(&e, ConfigError::Invalid { rule, field, .. } if rule == "[server]" && field == "idle_after"),
            "{text}: {e}"
        );
        assert!(e.to_string().contains("365 days"), "{e}");
    }
    for text in [format!("{year}"), "\"365d\"".to_owned()] {
        let config = Config::parse(&format!("[server]\nidle_after = {text}\n"), "fuzz.toml")
            .expect("365 days is accepted");
        assert_eq!(config.limits.idle_after, year);
    }
}

//! Unit tests of policy validation (SPEC Y2), defaults (Y3), durations (T1)
//! and the backoff rule's rounding.

use super::*;

/// Reads a policy spec written as TOML, as a config file would hold it.
fn spec(text: &str) -> PolicySpec {
    toml::from_str(text).unwrap_or_else(|e| panic!("{text:?} does not parse: {e}"))
}

/// Validates `text` and returns the error it must give.
fn refused(text: &str) -> PolicyError {
    match spec(text).validate() {
        Ok(policy) => panic!("{text:?} was accepted as {policy:?}"),
        Err(e) => e,
    }
}

fn nz32(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).expect("non-zero")
}

fn nz64(n: u64) -> NonZeroU64 {
    NonZeroU64::new(n).expect("non-zero")
}

const CONSECUTIVE: &str = r#"mode = "consecutive", failures = 5, break = "5s""#;

/// Every invalid value of Y2, each with the field it must name and the words
/// that say what is wrong.
#[test]
fn each_invalid_value_names_its_field_and_says_what_is_wrong() {
    let cases: &[(&str, &str, &str)] = &[
        // Breaker, consecutive mode.
        (
            r#"breaker = { mode = "consecutive", failures = 0, break = "5s" }"#,
            "breaker.failures",
            "must be at least 1",
        ),
        (
            r#"breaker = { mode = "consecutive", break = "5s" }"#,
            "breaker.failures",
            "is required in consecutive mode",
        ),
        (
            r#"breaker = { mode = "consecutive", failures = 5, break = "0ms" }"#,
            "breaker.break",
            "must be longer than 0 ms",
        ),
        (
            r#"breaker = { mode = "consecutive", failures = 5, break = 0 }"#,
            "breaker.break",
            "must be longer than 0 ms",
        ),
        (
            r#"breaker = { mode = "consecutive", failures = 5 }"#,
            "breaker.break",
            "is required for a breaker",
        ),
        (
            r#"breaker = { mode = "consecutive", failures = 5, break = 31536000001 }"#,
            "breaker.break",
            "must be at most 365 days",
        ),
        // Breaker, ratio mode.
        (
            r#"breaker = { mode = "ratio", failure_ratio = 0.0, minimum_throughput = 10, sampling_window = "10s", break = "5s" }"#,
            "breaker.failure_ratio",
            "must be above 0 and at most 1, not 0",
        ),
        (
            r#"breaker = { mode = "ratio", failure_ratio = -0.5, minimum_throughput = 10, sampling_window = "10s", break = "5s" }"#,
            "breaker.failure_ratio",
            "must be above 0 and at most 1, not -0.5",
        ),
        (
            r#"breaker = { mode = "ratio", failure_ratio = 1.01, minimum_throughput = 10, sampling_window = "10s", break = "5s" }"#,
            "breaker.failure_ratio",
            "must be above 0 and at most 1, not 1.01",
        ),
        (
            r#"breaker = { mode = "ratio", failure_ratio = nan, minimum_throughput = 10, sampling_window = "10s", break = "5s" }"#,
            "breaker.failure_ratio",
            "must be above 0 and at most 1, not NaN",
        ),
        (
            r#"breaker = { mode = "ratio", minimum_throughput = 10, sampling_window = "10s", break = "5s" }"#,
            "breaker.failure_ratio",
            "is required in ratio mode",
        ),
        (
            r#"breaker = { mode = "ratio", failure_ratio = 0.5, minimum_throughput = 0, sampling_window = "10s", break = "5s" }"#,
            "breaker.minimum_throughput",
            "must be at least 1",
        ),
        (
            r#"breaker = { mode = "ratio", failure_ratio = 0.5, minimum_throughput = 10, sampling_window = "9ms", break = "5s" }"#,
            "breaker.sampling_window",
            "must be at least 10ms, not 9ms",
        ),
        (
            r#"breaker = { mode = "ratio", failure_ratio = 0.5, minimum_throughput = 10, sampling_window = 1, break = "5s" }"#,
            "breaker.sampling_window",
            "must be at least 10ms, not 1ms",
        ),
        (
            r#"breaker = { mode = "ratio", failure_ratio = 0.5, minimum_throughput = 10, sampling_window = "0s", break = "5s" }"#,
            "breaker.sampling_window",
            "must be longer than 0 ms",
        ),
        (
            r#"breaker = { mode = "ratio", failure_ratio = 0.5, minimum_throughput = 10, break = "5s" }"#,
            "breaker.sampling_window",
            "is required in ratio mode",
        ),
        // Backoff and probe lease.
        (
            r#"breaker = { mode = "consecutive", failures = 5, break = "5s", multiplier = 0.5 }"#,
            "breaker.multiplier",
            "must be at least 1, not 0.5",
        ),
        (
            r#"breaker = { mode = "consecutive", failures = 5, break = "5s", multiplier = 0.999 }"#,
            "breaker.multiplier",
            "must be at least 1, not 0.999",
        ),
        (
            r#"breaker = { mode = "consecutive", failures = 5, break = "5s", multiplier = inf }"#,
            "breaker.multiplier",
            "must be at least 1, not inf",
        ),
        (
            r#"breaker = { mode = "consecutive", failures = 5, break = "5s", multiplier = 2.0, max_break = "4999ms" }"#,
            "breaker.max_break",
            "(4999ms) must not be shorter than breaker.break (5s)",
        ),
        (
            r#"breaker = { mode = "consecutive", failures = 5, break = "5s", max_break = "0s" }"#,
            "breaker.max_break",
            "must be longer than 0 ms",
        ),
        (
            r#"breaker = { mode = "consecutive", failures = 5, break = "5s", probe_lease = "0ms" }"#,
            "breaker.probe_lease",
            "must be longer than 0 ms",
        ),
        (
            r#"breaker = { mode = "exponential", failures = 5, break = "5s" }"#,
            "breaker.mode",
            r#"must be "consecutive" or "ratio", not "exponential""#,
        ),
        (
            r#"breaker = { mode = "Consecutive", failures = 5, break = "5s" }"#,
            "breaker.mode",
            r#"not "Consecutive""#,
        ),
        // A field of the other mode.
        (
            r#"breaker = { mode = "consecutive", failures = 5, break = "5s", failure_ratio = 0.5 }"#,
            "breaker.failure_ratio",
            "is not a setting in consecutive mode",
        ),
        (
            r#"breaker = { mode = "consecutive", failures = 5, break = "5s", minimum_throughput = 10 }"#,
            "breaker.minimum_throughput",
            "is not a setting in consecutive mode",
        ),
        (
            r#"breaker = { mode = "consecutive", failures = 5, break = "5s", sampling_window = "10s" }"#,
            "breaker.sampling_window",
            "is not a setting in consecutive mode",
        ),
        (
            r#"breaker = { mode = "ratio", failures = 5, failure_ratio = 0.5, minimum_throughput = 10, sampling_window = "10s", break = "5s" }"#,
            "breaker.failures",
            "is not a setting in ratio mode",
        ),
        // Concurrency.
        (
            r#"limiter = { kind = "concurrency", permits = 0 }"#,
            "limiter.permits",
            "must be at least 1",
        ),
        (
            r#"limiter = { kind = "concurrency" }"#,
            "limiter.permits",
            "is required for a concurrency limiter",
        ),
        (
            r#"limiter = { kind = "concurrency", permits = 4, capacity = 4 }"#,
            "limiter.capacity",
            "is not a setting for a concurrency limiter",
        ),
        (
            r#"limiter = { kind = "concurrency", permits = 4, refill = 1 }"#,
            "limiter.refill",
            "is not a setting for a concurrency limiter",
        ),
        (
            r#"limiter = { kind = "concurrency", permits = 4, period = "1s" }"#,
            "limiter.period",
            "is not a setting for a concurrency limiter",
        ),
        (
            r#"limiter = { kind = "concurrency", permits = 4, window = "1s" }"#,
            "limiter.window",
            "is not a setting for a concurrency limiter",
        ),
        (
            r#"limiter = { kind = "concurrency", permits = 4, segments = 4 }"#,
            "limiter.segments",
            "is not a setting for a concurrency limiter",
        ),
        // Token bucket.
        (
            r#"limiter = { kind = "token_bucket", capacity = 0, refill = 1, period = "1s" }"#,
            "limiter.capacity",
            "must be at least 1",
        ),
        (
            r#"limiter = { kind = "token_bucket", capacity = 10, refill = 0, period = "1s" }"#,
            "limiter.refill",
            "must be at least 1",
        ),
        (
            r#"limiter = { kind = "token_bucket", capacity = 10, refill = 1, period = "0s" }"#,
            "limiter.period",
            "must be longer than 0 ms",
        ),
        (
            r#"limiter = { kind = "token_bucket", capacity = 10, refill = 1 }"#,
            "limiter.period",
            "is required for a token bucket",
        ),
        (
            r#"limiter = { kind = "token_bucket", capacity = 10, refill = 11, period = "1s" }"#,
            "limiter.refill",
            "(11) must not be above limiter.capacity (10)",
        ),
        (
            r#"limiter = { kind = "token_bucket", permits = 10, capacity = 10, refill = 1, period = "1s" }"#,
            "limiter.permits",
            "is not a setting for a token bucket",
        ),
        (
            r#"limiter = { kind = "token_bucket", capacity = 10, refill = 1, period = "1s", window = "1s" }"#,
            "limiter.window",
            "is not a setting for a token bucket",
        ),
        (
            r#"limiter = { kind = "token_bucket", capacity = 10, refill = 1, period = "1s", segments = 2 }"#,
            "limiter.segments",
            "is not a setting for a token bucket",
        ),
        // Fixed window.
        (
            r#"limiter = { kind = "fixed_window", permits = 0, window = "1s" }"#,
            "limiter.permits",
            "must be at least 1",
        ),
        (
            r#"limiter = { kind = "fixed_window", permits = 10, window = "0ms" }"#,
            "limiter.window",
            "must be longer than 0 ms",
        ),
        (
            r#"limiter = { kind = "fixed_window", permits = 10 }"#,
            "limiter.window",
            "is required for a fixed window",
        ),
        (
            r#"limiter = { kind = "fixed_window", permits = 10, window = "1s", segments = 10 }"#,
            "limiter.segments",
            "is not a setting for a fixed window",
        ),
        (
            r#"limiter = { kind = "fixed_window", permits = 10, window = "1s", capacity = 10 }"#,
            "limiter.capacity",
            "is not a setting for a fixed window",
        ),
        // Sliding window.
        (
            r#"limiter = { kind = "sliding_window", permits = 0, window = "1s", segments = 10 }"#,
            "limiter.permits",
            "must be at least 1",
        ),
        (
            r#"limiter = { kind = "sliding_window", permits = 10, window = "0s", segments = 10 }"#,
            "limiter.window",
            "must be longer than 0 ms",
        ),
        (
            r#"limiter = { kind = "sliding_window", permits = 10, window = "1s", segments = 0 }"#,
            "limiter.segments",
            "must be at least 1",
        ),
        (
            r#"limiter = { kind = "sliding_window", permits = 10, window = "1s" }"#,
            "limiter.segments",
            "is required for a sliding window",
        ),
        (
            r#"limiter = { kind = "sliding_window", permits = 10, window = "1s", segments = 3 }"#,
            "limiter.segments",
            "(3) must divide limiter.window (1s) into whole milliseconds",
        ),
        (
            r#"limiter = { kind = "sliding_window", permits = 10, window = "5ms", segments = 10 }"#,
            "limiter.segments",
            "(10) must divide limiter.window (5ms)",
        ),
        (
            r#"limiter = { kind = "sliding_window", permits = 10, window = "1s", segments = 10, period = "1s" }"#,
            "limiter.period",
            "is not a setting for a sliding window",
        ),
        (
            r#"limiter = { kind = "sliding_window", permits = 10, window = "1s", segments = 10, refill = 1 }"#,
            "limiter.refill",
            "is not a setting for a sliding window",
        ),
        // Kind and order.
        (
            r#"limiter = { kind = "leaky_bucket", permits = 10 }"#,
            "limiter.kind",
            r#"must be "concurrency", "token_bucket", "fixed_window", "sliding_window" or "adaptive", not "leaky_bucket""#,
        ),
        (
            r#"limiter = { kind = "adaptive", max = 10 }"#,
            "limiter.min",
            "is required for an adaptive limiter",
        ),
        (
            r#"limiter = { kind = "adaptive", min = 0, max = 10 }"#,
            "limiter.min",
            "must be at least 1",
        ),
        (
            r#"limiter = { kind = "adaptive", min = 2 }"#,
            "limiter.max",
            "is required for an adaptive limiter",
        ),
        (
            r#"limiter = { kind = "adaptive", min = 5, max = 4 }"#,
            "limiter.max",
            "(4) must not be below limiter.min (5)",
        ),
        (
            r#"limiter = { kind = "adaptive", min = 2, max = 4, initial = 5 }"#,
            "limiter.initial",
            "(5) must be from limiter.min (2) to limiter.max (4)",
        ),
        (
            r#"limiter = { kind = "adaptive", min = 2, max = 4, initial = 1 }"#,
            "limiter.initial",
            "(1) must be from limiter.min (2) to limiter.max (4)",
        ),
        (
            r#"limiter = { kind = "adaptive", min = 1, max = 4, permits = 3 }"#,
            "limiter.permits",
            "is not a setting for an adaptive limiter",
        ),
        (
            r#"limiter = { kind = "concurrency", permits = 3, max = 4 }"#,
            "limiter.max",
            "is not a setting for a concurrency limiter",
        ),
        (
            r#"limiter = { kind = "concurrency", permits = 4, order = "fifo" }"#,
            "limiter.order",
            r#"must be "oldest_first" or "newest_first", not "fifo""#,
        ),
        (
            r#"limiter = { kind = "concurrency", permits = 4, order = "OLDEST_FIRST" }"#,
            "limiter.order",
            r#"not "OLDEST_FIRST""#,
        ),
        // Leases.
        (
            r#"lease = { default = "10m" }"#,
            "lease.default",
            "(10m) must not be above lease.max (5m)",
        ),
        (
            r#"lease = { default = "2m", max = "1m" }"#,
            "lease.default",
            "(2m) must not be above lease.max (1m)",
        ),
        (
            r#"lease = { max = "10s" }"#,
            "lease.default",
            "(30s) must not be above lease.max (10s)",
        ),
        (
            r#"lease = { default = "0s" }"#,
            "lease.default",
            "must be longer than 0 ms",
        ),
        (
            r#"lease = { max = "0ms" }"#,
            "lease.max",
            "must be longer than 0 ms",
        ),
        (
            r#"lease = { expired_outcome = "SUCCESS" }"#,
            "lease.expired_outcome",
            r#"must be "IGNORED" or "FAILURE", not "SUCCESS""#,
        ),
        (
            r#"lease = { expired_outcome = "EXPLODED" }"#,
            "lease.expired_outcome",
            r#"must be "IGNORED" or "FAILURE", not "EXPLODED""#,
        ),
        (
            r#"lease = { expired_outcome = "failure" }"#,
            "lease.expired_outcome",
            r#"not "failure""#,
        ),
    ];
    for &(text, field, words) in cases {
        let e = refused(text);
        assert_eq!(e.field, field, "wrong field for {text}: {e}");
        assert!(
            e.problem.contains(words),
            "the problem for {text} is {:?}, which lacks {words:?}",
            e.problem
        );
        assert_eq!(e.to_string(), format!("{field}: {}", e.problem));
    }
}

#[test]
fn values_at_the_edge_of_each_range_are_accepted() {
    let accepted = [
        r#"breaker = { mode = "ratio", failure_ratio = 1.0, minimum_throughput = 1, sampling_window = "10ms", break = "1ms" }"#,
        r#"breaker = { mode = "ratio", failure_ratio = 0.0001, minimum_throughput = 1, sampling_window = 10, break = 1 }"#,
        r#"breaker = { mode = "consecutive", failures = 1, break = "5s", multiplier = 1.0, max_break = "5s" }"#,
        r#"breaker = { mode = "consecutive", failures = 1, break = "365d" }"#,
        r#"limiter = { kind = "token_bucket", capacity = 3, refill = 3, period = "1ms" }"#,
        r#"limiter = { kind = "sliding_window", permits = 1, window = "10ms", segments = 10 }"#,
        r#"limiter = { kind = "sliding_window", permits = 1, window = "1s", segments = 1 }"#,
        r#"lease = { default = "5m", max = "5m", expired_outcome = "FAILURE" }"#,
        r#"lease = { default = "1ms", max = "1ms" }"#,
        r#"lease = { max = "30s" }"#,
    ];
    for text in accepted {
        if let Err(e) = spec(text).validate() {
            panic!("{text} was refused: {e}");
        }
    }
}

#[test]
fn the_first_bad_field_is_named_and_the_breaker_is_checked_before_the_limiter() {
    let e = refused(
        r#"
        breaker = { mode = "consecutive", failures = 0, break = "0s" }
        limiter = { kind = "concurrency", permits = 0 }
        "#,
    );
    assert_eq!(e.field, "breaker.failures");
    let e = refused(
        r#"
        breaker = { mode = "consecutive", failures = 1, break = "1s" }
        limiter = { kind = "concurrency", permits = 0 }
        lease = { default = "0s" }
        "#,
    );
    assert_eq!(e.field, "limiter.permits");
}

#[test]
fn slow_calls_are_checked_and_named() {
    let ratio = r#"mode = "ratio", failure_ratio = 0.5, minimum_throughput = 4, sampling_window = "10s", break = "5s""#;
    let cases = [
        (r#"breaker = { mode = "consecutive", failures = 1, break = "1s", slow = { duration = "1s", ratio = 0.5 } }"#.to_owned(), "breaker.slow"),
        (format!("breaker = {{ {ratio}, slow = {{ ratio = 0.5 }} }}"), "breaker.slow.duration"),
        (format!("breaker = {{ {ratio}, slow = {{ duration = \"1s\" }} }}"), "breaker.slow.ratio"),
        (format!("breaker = {{ {ratio}, slow = {{ duration = \"0ms\", ratio = 0.5 }} }}"), "breaker.slow.duration"),
        (format!("breaker = {{ {ratio}, slow = {{ duration = \"1s\", ratio = 0 }} }}"), "breaker.slow.ratio"),
        (format!("breaker = {{ {ratio}, slow = {{ duration = \"1s\", ratio = 1.5 }} }}"), "breaker.slow.ratio"),
        (format!("breaker = {{ {ratio}, slow = {{ duration = \"1s\", ratio = 0.0000001 }} }}"), "breaker.slow.ratio"),
        (format!("breaker = {{ {ratio}, slow = {{ duration = \"6m\", ratio = 0.5 }} }}"), "breaker.slow.duration"),
        (format!("breaker = {{ {ratio}, slow = {{ duration = \"2s\", ratio = 0.5 }} }}\nlease = {{ default = \"1s\", max = \"1s\" }}"), "breaker.slow.duration"),
    ];
    for (text, field) in cases {
        match spec(&text).validate() {
            Ok(_) => panic!("{text} was accepted"),
            Err(e) => assert!(
                e.field.contains(field) || e.problem.contains(field),
                "{text}: {e}"
            ),
        }
    }
    let p = spec(&format!(
        "breaker = {{ {ratio}, slow = {{ duration = \"5m\", ratio = 0.3333334 }} }}"
    ))
    .validate()
    .expect("valid");
    let slow = p.breaker.and_then(|b| b.slow).expect("slow");
    assert_eq!(
        (slow.duration.get(), slow.ratio_millionths),
        (300_000, 333_333)
    );
    assert_eq!(p.spec().validate(), Ok(p), "reads back as set");
    assert!(slow.reached(1, 3) && !slow.reached(333_332, 1_000_000) && !slow.reached(0, 0));
}

/// Unknown fields are refused by serde at every level, with the field's name.
#[test]
fn an_unknown_field_is_refused_when_read() {
    let cases = [
        (
            r#"limits = { kind = "concurrency", permits = 1 }"#,
            "limits",
        ),
        (
            r#"breaker = { mode = "consecutive", failures = 5, break = "5s", half_open_max = 2 }"#,
            "half_open_max",
        ),
        (
            r#"limiter = { kind = "concurrency", permits = 4, burst = 2 }"#,
            "burst",
        ),
        (r#"lease = { default = "30s", minimum = "1s" }"#, "minimum"),
        // `break_` is the Rust name; only `break` is a field.
        (
            r#"breaker = { mode = "consecutive", failures = 5, break_ = "5s" }"#,
            "break_",
        ),
        // A breaker setting at the top level.
        (r#"failures = 5"#, "failures"),
    ];
    for (text, name) in cases {
        let e = toml::from_str::<PolicySpec>(text).expect_err(text);
        let message = e.to_string();
        assert!(
            message.contains(&format!("unknown field `{name}`")),
            "{text}: {message}"
        );
    }
    let json =
        r#"{"breaker": {"mode": "consecutive", "failures": 5, "break": 5000, "jitter": 0.1}}"#;
    let e = serde_json::from_str::<PolicySpec>(json).expect_err(json);
    assert!(e.to_string().contains("unknown field `jitter`"), "{e}");
    let json = r#"{"lease": {"default": 1000}, "extra": true}"#;
    let e = serde_json::from_str::<PolicySpec>(json).expect_err(json);
    assert!(e.to_string().contains("unknown field `extra`"), "{e}");
}

#[test]
fn a_missing_mode_or_kind_and_a_badly_written_duration_are_refused_when_read() {
    let e = toml::from_str::<PolicySpec>(r#"breaker = { failures = 5, break = "5s" }"#)
        .expect_err("no mode");
    assert!(e.to_string().contains("missing field `mode`"), "{e}");
    let e = toml::from_str::<PolicySpec>(r#"limiter = { permits = 5 }"#).expect_err("no kind");
    assert!(e.to_string().contains("missing field `kind`"), "{e}");
    let e =
        toml::from_str::<PolicySpec>(&format!("breaker = {{ {CONSECUTIVE}, max_break = \"5\" }}"))
            .expect_err("no unit");
    assert!(e.to_string().contains("has no unit"), "{e}");
    let e = toml::from_str::<PolicySpec>(
        r#"breaker = { mode = "consecutive", failures = -1, break = "5s" }"#,
    )
    .expect_err("negative count");
    assert!(e.to_string().contains("failures"), "{e}");
}

#[test]
fn left_out_fields_take_the_defaults_of_y3() {
    let policy = spec(
        r#"
        breaker = { mode = "consecutive", failures = 3, break = "2s" }
        limiter = { kind = "concurrency", permits = 8 }
        "#,
    )
    .validate()
    .unwrap();
    assert_eq!(
        policy,
        Policy {
            breaker: Some(BreakerPolicy {
                quorum: None,
                trip: Trip::Consecutive { failures: nz32(3) },
                break_ms: nz64(2_000),
                multiplier: 1.0,
                max_break: None,
                probe_lease: nz64(2_000),
                half_open: HalfOpen::default(),
                slow: None,
            }),
            limiter: Some(LimiterPolicy {
                kind: LimiterKind::Concurrency { permits: nz32(8) },
                queue_limit: 0,
                order: Order::OldestFirst,
            }),
            lease: LeasePolicy {
                default: nz64(30_000),
                max: nz64(300_000),
                expired_outcome: Outcome::Ignored,
            },
            retry_budget: None,
            enforce: true,
        }
    );
    // `probe_lease` defaults to the base break, not the backed-off one.
    let backoff = spec(
        r#"breaker = { mode = "consecutive", failures = 1, break = "1s", multiplier = 3.0, max_break = "1m" }"#,
    )
    .validate()
    .unwrap()
    .breaker
    .unwrap();
    assert_eq!(backoff.probe_lease, nz64(1_000));
    assert_eq!(backoff.break_length(3), 9_000);
    // An explicit probe lease is kept.
    let explicit = spec(&format!(
        "breaker = {{ {CONSECUTIVE}, probe_lease = \"250ms\" }}"
    ))
    .validate()
    .unwrap()
    .breaker
    .unwrap();
    assert_eq!(explicit.probe_lease, nz64(250));
    // A lease table with only some settings fills in the rest.
    let lease = spec(r#"lease = { default = "1s" }"#)
        .validate()
        .unwrap()
        .lease;
    assert_eq!(
        lease,
        LeasePolicy {
            default: nz64(1_000),
            max: nz64(300_000),
            expired_outcome: Outcome::Ignored,
        }
    );
    assert_eq!(
        spec(r#"lease = { expired_outcome = "FAILURE" }"#)
            .validate()
            .unwrap()
            .lease
            .expired_outcome,
        Outcome::Failure
    );
    // Explicit order and queue are kept.
    let limiter = spec(
        r#"limiter = { kind = "fixed_window", permits = 2, window = "1s", queue_limit = 7, order = "newest_first" }"#,
    )
    .validate()
    .unwrap()
    .limiter
    .unwrap();
    assert_eq!(limiter.queue_limit, 7);
    assert_eq!(limiter.order, Order::NewestFirst);
}

#[test]
fn an_empty_spec_has_no_breaker_no_limiter_and_default_leases() {
    let policy = spec("").validate().unwrap();
    assert_eq!(
        policy,
        Policy {
            breaker: None,
            limiter: None,
            lease: LeasePolicy::default(),
            retry_budget: None,
            enforce: true,
        }
    );
    assert_eq!(PolicySpec::default().validate().unwrap(), policy);
}

#[test]
fn the_built_in_default_rule_is_five_failures_in_a_row_a_five_second_break_and_no_limiter() {
    assert_eq!(
        Policy::default(),
        Policy {
            breaker: Some(BreakerPolicy {
                quorum: None,
                trip: Trip::Consecutive { failures: nz32(5) },
                break_ms: nz64(5_000),
                multiplier: 1.0,
                max_break: None,
                probe_lease: nz64(5_000),
                half_open: HalfOpen::default(),
                slow: None,
            }),
            limiter: None,
            lease: LeasePolicy {
                default: nz64(30_000),
                max: nz64(300_000),
                expired_outcome: Outcome::Ignored,
            },
            retry_budget: None,
            enforce: true,
        }
    );
    // Written out, it validates to the same policy.
    assert_eq!(
        spec(r#"breaker = { mode = "consecutive", failures = 5, break = "5s" }"#)
            .validate()
            .unwrap(),
        Policy::default()
    );
}

#[test]
fn every_kind_and_mode_is_read_into_its_validated_form() {
    let policy = spec(
        r#"
        breaker = { mode = "ratio", failure_ratio = 0.5, minimum_throughput = 20, sampling_window = "10s", break = "5s", multiplier = 2.0, max_break = "1m", probe_lease = "1s" }
        limiter = { kind = "sliding_window", permits = 100, window = "1s", segments = 10, queue_limit = 5 }
        lease = { default = "10s", max = "1m", expired_outcome = "FAILURE" }
        "#,
    )
    .validate()
    .unwrap();
    assert_eq!(
        policy.breaker,
        Some(BreakerPolicy {
            quorum: None,
            trip: Trip::Ratio {
                failure_ratio: 0.5,
                minimum_throughput: nz32(20),
                sampling_window: 10_000,
            },
            break_ms: nz64(5_000),
            multiplier: 2.0,
            max_break: Some(nz64(60_000)),
            probe_lease: nz64(1_000),
            half_open: HalfOpen::default(),
            slow: None,
        })
    );
    assert_eq!(
        policy.limiter,
        Some(LimiterPolicy {
            kind: LimiterKind::SlidingWindow {
                permits: nz32(100),
                window: nz64(1_000),
                segments: nz32(10),
            },
            queue_limit: 5,
            order: Order::OldestFirst,
        })
    );
    assert_eq!(
        policy.lease,
        LeasePolicy {
            default: nz64(10_000),
            max: nz64(60_000),
            expired_outcome: Outcome::Failure,
        }
    );
    let bucket =
        spec(r#"limiter = { kind = "token_bucket", capacity = 10, refill = 2, period = "100ms" }"#)
            .validate()
            .unwrap()
            .limiter
            .unwrap();
    assert_eq!(
        bucket.kind,
        LimiterKind::TokenBucket {
            capacity: nz32(10),
            refill: nz32(2),
            period: nz64(100),
        }
    );
    assert_eq!(bucket.kind.limit(), 10);
    assert_eq!(bucket.kind.name(), "token_bucket");
    let fixed = spec(r#"limiter = { kind = "fixed_window", permits = 3, window = "1m" }"#)
        .validate()
        .unwrap()
        .limiter
        .unwrap();
    assert_eq!(
        fixed.kind,
        LimiterKind::FixedWindow {
            permits: nz32(3),
            window: nz64(60_000),
        }
    );
    assert_eq!(fixed.kind.limit(), 3);
}

#[test]
fn the_config_example_of_the_spec_reads_and_validates() {
    let rule = spec(
        r#"
        breaker = { mode = "consecutive", failures = 5, break = "30s" }
        limiter = { kind = "concurrency", permits = 64, queue_limit = 128, order = "oldest_first" }
        lease = { default = "30s", max = "5m", expired_outcome = "IGNORED" }
        "#,
    )
    .validate()
    .unwrap();
    assert_eq!(
        rule.limiter,
        Some(LimiterPolicy {
            kind: LimiterKind::Concurrency { permits: nz32(64) },
            queue_limit: 128,
            order: Order::OldestFirst,
        })
    );
    assert_eq!(rule.breaker.unwrap().break_ms, nz64(30_000));
    assert_eq!(rule.lease, LeasePolicy::default());
}

#[test]
fn durations_are_read_with_a_unit() {
    let cases: &[(&str, Millis)] = &[
        ("250ms", 250),
        ("30s", 30_000),
        ("5m", 300_000),
        ("1.5s", 1_500),
        ("1h", 3_600_000),
        ("2d", 172_800_000),
        ("0ms", 0),
        ("0.5m", 30_000),
        (" 30s ", 30_000),
        ("10 ms", 10),
        ("365d", MAX_DURATION),
    ];
    for &(text, ms) in cases {
        assert_eq!(parse_duration(text), Ok(ms), "{text:?}");
    }
}

#[test]
fn a_duration_finer_than_a_millisecond_is_rounded_up() {
    assert_eq!(parse_duration("0.5ms"), Ok(1));
    assert_eq!(parse_duration("1.2ms"), Ok(2));
    assert_eq!(parse_duration("0.0001s"), Ok(1));
    assert_eq!(parse_duration("1.0001s"), Ok(1_001));
}

/// T1 rounds up only what is finer than a millisecond: a decimal number of
/// seconds with three decimals is a whole number of milliseconds.
#[test]
fn a_whole_number_of_milliseconds_written_in_seconds_is_exact() {
    assert_eq!(parse_duration("2.007s"), Ok(2_007));
    assert_eq!(parse_duration("2.011s"), Ok(2_011));
    for ms in 0..10_000u64 {
        let text = format!("{}.{:03}s", ms / 1000, ms % 1000);
        assert_eq!(parse_duration(&text), Ok(ms), "{text}");
    }
}

#[test]
fn a_duration_without_a_unit_or_with_an_unknown_one_is_refused() {
    let e = parse_duration("250").unwrap_err();
    assert!(e.contains("has no unit"), "{e}");
    let e = parse_duration("").unwrap_err();
    assert!(e.contains("has no unit"), "{e}");
    let e = parse_duration("5x").unwrap_err();
    assert!(e.contains("unknown unit \"x\""), "{e}");
    let e = parse_duration("5 sec").unwrap_err();
    assert!(e.contains("unknown unit \"sec\""), "{e}");
    let e = parse_duration("5S").unwrap_err();
    assert!(e.contains("unknown unit \"S\""), "{e}");
    let e = parse_duration("1.2.3s").unwrap_err();
    assert!(e.contains("is not a number followed by a unit"), "{e}");
    let e = parse_duration("ms").unwrap_err();
    assert!(e.contains("is not a number followed by a unit"), "{e}");
    let e = parse_duration("366d").unwrap_err();
    assert!(e.contains("longer than 365 days"), "{e}");
    assert!(parse_duration("-5s").is_err());
}

#[test]
fn a_duration_in_a_spec_is_whole_milliseconds_or_a_string_with_a_unit() {
    assert_eq!(
        serde_json::from_str::<DurationSpec>("250").unwrap(),
        DurationSpec(250)
    );
    assert_eq!(
        serde_json::from_str::<DurationSpec>("\"1.5s\"").unwrap(),
        DurationSpec(1_500)
    );
    assert!(serde_json::from_str::<DurationSpec>("-1").is_err());
    assert!(serde_json::from_str::<DurationSpec>("1.5").is_err());
    let e = serde_json::from_str::<DurationSpec>("\"1.5\"").unwrap_err();
    assert!(e.to_string().contains("has no unit"), "{e}");
    // Written back, it carries the largest unit that divides it.
    assert_eq!(
        serde_json::to_string(&DurationSpec(90_000)).unwrap(),
        "\"90s\""
    );
}

#[test]
fn format_duration_uses_the_largest_unit_that_divides() {
    let cases: &[(Millis, &str)] = &[
        (0, "0ms"),
        (1, "1ms"),
        (250, "250ms"),
        (999, "999ms"),
        (1_000, "1s"),
        (1_500, "1500ms"),
        (30_000, "30s"),
        (90_000, "90s"),
        (60_000, "1m"),
        (300_000, "5m"),
        (3_600_000, "1h"),
        (5_400_000, "90m"),
        (86_400_000, "1d"),
        (90_000_000, "25h"),
        (MAX_DURATION, "365d"),
    ];
    for &(ms, text) in cases {
        assert_eq!(format_duration(ms), text, "{ms}");
        assert_eq!(parse_duration(text), Ok(ms), "{text} reads back");
    }
}

fn backoff(break_ms: u64, multiplier: f64, max_break: Option<u64>) -> BreakerPolicy {
    BreakerPolicy {
        quorum: None,
        trip: Trip::Consecutive { failures: nz32(1) },
        break_ms: nz64(break_ms),
        multiplier,
        max_break: max_break.map(nz64),
        probe_lease: nz64(break_ms),
        half_open: HalfOpen::default(),
        slow: None,
    }
}

#[test]
fn break_length_grows_by_the_multiplier_rounds_down_and_stops_at_max_break() {
    let p = backoff(3, 1.5, None);
    // 3, 4.5, 6.75, 10.125, 15.1875: each rounded down.
    assert_eq!(
        (1..=5).map(|k| p.break_length(k)).collect::<Vec<_>>(),
        vec![3, 4, 6, 10, 15]
    );
    let p = backoff(1_000, 2.0, Some(5_000));
    assert_eq!(
        (1..=5).map(|k| p.break_length(k)).collect::<Vec<_>>(),
        vec![1_000, 2_000, 4_000, 5_000, 5_000]
    );
    // 100 * 1.1^2 = 121.00000000000003, rounded down to 121.
    let p = backoff(100, 1.1, None);
    assert_eq!(p.break_length(2), 110);
    assert_eq!(p.break_length(3), 121);
    // Without backoff every break is the base one.
    let p = backoff(700, 1.0, Some(10_000));
    assert_eq!(p.break_length(1), 700);
    assert_eq!(p.break_length(50), 700);
    // The first opening (and a k of 0) is the base break.
    let p = backoff(700, 3.0, None);
    assert_eq!(p.break_length(0), 700);
    assert_eq!(p.break_length(1), 700);
    // Without max_break, growth stops at the longest duration accepted.
    assert_eq!(p.break_length(u32::MAX), MAX_DURATION);
    assert_eq!(backoff(1, 2.0, Some(10)).break_length(u32::MAX), 10);
}

#[test]
fn a_policy_kept_as_its_spec_validates_back_to_itself_through_json() {
    let texts = [
        r#"
        breaker = { mode = "ratio", failure_ratio = 0.25, minimum_throughput = 20, sampling_window = "10s", break = "5s", multiplier = 1.5, max_break = "1m", probe_lease = "1s" }
        limiter = { kind = "sliding_window", permits = 100, window = "1s", segments = 10, queue_limit = 5, order = "newest_first" }
        lease = { default = "10s", max = "1m", expired_outcome = "FAILURE" }
        "#,
        r#"breaker = { mode = "consecutive", failures = 3, break = "1500ms" }"#,
        r#"limiter = { kind = "token_bucket", capacity = 10, refill = 2, period = "100ms" }"#,
        r#"limiter = { kind = "fixed_window", permits = 3, window = "1m" }"#,
        r#"limiter = { kind = "concurrency", permits = 7 }"#,
        r#"limiter = { kind = "adaptive", min = 2, max = 50, initial = 10, queue_limit = 4 }"#,
        r#"limiter = { kind = "adaptive", min = 3, max = 3 }"#,
        "",
    ];
    for text in texts {
        let policy = spec(text).validate().unwrap();
        let json = serde_json::to_string(&policy.spec()).unwrap();
        let back: PolicySpec = serde_json::from_str(&json).unwrap();
        assert_eq!(back.validate().unwrap(), policy, "{text}");
    }
    assert_eq!(
        Policy::default().spec().validate().unwrap(),
        Policy::default()
    );
}

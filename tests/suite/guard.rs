//! `fusebox::guard` beyond the shared scenarios: the bearer token, and a
//! classifier that does not count an error. Outcomes are reported in the
//! background: a test that reads what fusebox counted flushes the guard
//! first (`tests/suite/outcomes.rs` tests the queue itself).

use fusebox::guard::{CallOptions, Guard, GuardError, GuardOptions, Outcome, Reason, Transport};
use fusebox::proto::v1 as pb;
use tonic::Code;

use crate::harness::Server;

const CALLER: &str = "guard-caller-token-0123456789";
const ADMIN: &str = "guard-admin-token-0123456789";

fn config() -> String {
    format!(
        "[[auth.token]]\nname = \"caller\"\nrole = \"caller\"\nprefixes = [\"a/*\"]\nsha256 = \"{}\"\n\
         [[auth.token]]\nname = \"admin\"\nrole = \"admin\"\nsha256 = \"{}\"\n",
        fusebox::auth::hash_hex(CALLER),
        fusebox::auth::hash_hex(ADMIN),
    )
}

/// The default options but the deadline: a debug server on a busy machine
/// may take more than the default 50 ms, and a slow answer must not fail
/// open in these tests.
fn patient() -> GuardOptions {
    GuardOptions {
        deadline: std::time::Duration::from_secs(2),
        ..GuardOptions::default()
    }
}

fn guard(server: &Server, token: Option<&str>) -> Guard {
    Guard::connect(
        &format!("http://{}", server.addr),
        None,
        GuardOptions {
            token: token.map(str::to_owned),
            ..patient()
        },
    )
    .expect("a guard")
}

async fn stats(server: &Server, key: &str) -> pb::KeyStats {
    let mut request = tonic::Request::new(pb::GetKeyRequest { key: key.into() });
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {ADMIN}").parse().expect("ASCII"),
    );
    server
        .admin()
        .await
        .get_key(request)
        .await
        .expect("GetKey answers the admin")
        .into_inner()
        .stats
        .unwrap_or_default()
}

#[tokio::test]
async fn the_guard_sends_its_token_and_a_refused_credential_is_not_taken_for_an_outage() {
    let config = config();
    let server = Server::manual(Some(&config)).await;

    let with_token = guard(&server, Some(CALLER));
    let answer: Result<u32, GuardError<String>> = with_token
        .run("a/x", &CallOptions::default(), || async { Ok(7) })
        .await;
    assert_eq!(answer.expect("granted"), 7);
    with_token.flush().await.expect("the outcome is answered");
    assert_eq!(stats(&server, "a/x").await.successes, 1);

    // Another namespace: PERMISSION_DENIED, and the call does not run even
    // though the guard fails open (fusebox answered; it is not down).
    let mut ran = false;
    let answer: Result<(), GuardError<String>> = with_token
        .run("b/x", &CallOptions::default(), || {
            ran = true;
            async { Ok(()) }
        })
        .await;
    assert!(
        matches!(&answer, Err(GuardError::Rejected(s)) if s.code() == Code::PermissionDenied),
        "{answer:?}"
    );
    assert!(!ran);

    let without = guard(&server, None);
    let answer: Result<(), GuardError<String>> = without
        .run("a/x", &CallOptions::default(), || async { Ok(()) })
        .await;
    assert!(
        matches!(&answer, Err(GuardError::Rejected(s)) if s.code() == Code::Unauthenticated),
        "{answer:?}"
    );
    assert_eq!(without.stats().unavailable, 0);
    assert_eq!(with_token.stats().failed_open, 0);
}

#[tokio::test]
async fn a_classifier_decides_what_an_error_counts_as() {
    let server = Server::manual(Some(
        "[[rule]]\nmatch = \"svc/*\"\nbreaker = { mode = \"consecutive\", failures = 1, break = \"10s\" }\n",
    ))
    .await;
    let guard =
        Guard::connect(&format!("http://{}", server.addr), None, patient()).expect("a guard");
    let not_found = |e: &String| {
        if e == "not found" {
            Outcome::Ignored
        } else {
            Outcome::Failure
        }
    };
    let answer: Result<(), GuardError<String>> = guard
        .run_classified("svc/a", &CallOptions::default(), not_found, || async {
            Err("not found".to_owned())
        })
        .await;
    assert_eq!(
        answer.expect_err("the call's error").into_call().as_deref(),
        Some("not found")
    );
    guard.flush().await.expect("the outcome is answered");
    let state = server.get("svc/a").await;
    let stats = state.stats.unwrap_or_default();
    assert_eq!((stats.ignored, stats.failures), (1, 0));
    assert_eq!(
        state.phase,
        pb::Phase::Closed as i32,
        "an ignored error does not trip"
    );

    let answer: Result<(), GuardError<String>> = guard
        .run_classified("svc/a", &CallOptions::default(), not_found, || async {
            Err("timeout".to_owned())
        })
        .await;
    assert!(matches!(answer, Err(GuardError::Call(_))));
    guard.flush().await.expect("the outcome is answered");
    assert_eq!(server.get("svc/a").await.phase, pb::Phase::Open as i32);
}

/// A listener that accepts connections and never answers: a fusebox that
/// hangs.
async fn black_hole() -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let addr = listener.local_addr().expect("an address").to_string();
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    (addr, task)
}

#[tokio::test]
async fn a_fusebox_that_does_not_answer_costs_one_deadline_then_the_policy_applies() {
    let (addr, task) = black_hole().await;
    let guard =
        Guard::connect(&format!("http://{addr}"), None, GuardOptions::default()).expect("a guard");
    let started = std::time::Instant::now();
    let answer: Result<u8, GuardError<String>> = guard
        .run("svc/a", &CallOptions::default(), || async { Ok(1) })
        .await;
    assert_eq!(answer.expect("fail open runs the call"), 1);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(2),
        "the deadline bounds the wait: {:?}",
        started.elapsed()
    );
    let stats = guard.stats();
    assert_eq!((stats.unavailable, stats.failed_open), (1, 1));

    // Backing off: the next call does not wait for fusebox again, and a
    // fail-closed call is refused with Unavailable.
    let closed = CallOptions {
        on_unavailable: Some(fusebox::guard::FailPolicy::Closed),
        ..CallOptions::default()
    };
    let answer: Result<u8, GuardError<String>> =
        guard.run("svc/a", &closed, || async { Ok(1) }).await;
    assert!(
        matches!(answer, Err(GuardError::Unavailable(_))),
        "{answer:?}"
    );
    let stats = guard.stats();
    assert_eq!(
        (stats.unavailable, stats.failed_open, stats.failed_closed),
        (2, 1, 1)
    );
    task.abort();
}

/// A call that panics failed; a call that ends with a gRPC CANCELLED (its
/// dependency cancelled it) is IGNORED by the default classifier, like a
/// caller that goes away; any other error is a failure.
#[tokio::test]
async fn a_panicking_call_is_a_failure_and_a_cancelled_one_is_ignored() {
    let config = config();
    let server = Server::manual(Some(&config)).await;
    let g = guard(&server, Some(CALLER));

    let task = tokio::spawn({
        let g = g.clone();
        async move {
            let _: Result<(), GuardError<String>> = g
                .run("a/panics", &CallOptions::default(), || async {
                    panic!("the call's own panic")
                })
                .await;
        }
    });
    assert!(task.await.expect_err("the panic goes on").is_panic());

    let cancelled: Result<(), GuardError<tonic::Status>> = g
        .run("a/panics", &CallOptions::default(), || async {
            Err(tonic::Status::cancelled(
                "the dependency cancelled the call",
            ))
        })
        .await;
    assert!(matches!(cancelled, Err(GuardError::Call(_))));
    let failed: Result<(), GuardError<tonic::Status>> = g
        .run("a/panics", &CallOptions::default(), || async {
            Err(tonic::Status::unavailable("the dependency is down"))
        })
        .await;
    assert!(matches!(failed, Err(GuardError::Call(_))));

    // The panicking call's ticket was dropped while the panic unwound: its
    // outcome went into the same queue as the others.
    g.flush().await.expect("the outcomes are answered");
    let st = stats(&server, "a/panics").await;
    assert_eq!(
        (st.failures, st.ignored),
        (2, 1),
        "{st:?}, guard: {:?}",
        g.stats()
    );
}

const TRIPS_ON_ONE: &str =
    "[[rule]]\nmatch = \"svc/*\"\nbreaker = { mode = \"consecutive\", failures = 1, break = \"10s\" }\n";

/// The guard as tower middleware: each request is guarded on the key its
/// request names, its error counts as a failure, and once the breaker is
/// open the wrapped service is not called at all.
#[tokio::test]
async fn the_tower_layer_guards_each_request_on_its_key() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use tower::{Layer, ServiceExt};

    let server = Server::manual(Some(TRIPS_ON_ONE)).await;
    let guard =
        Guard::connect(&format!("http://{}", server.addr), None, patient()).expect("a guard");
    let served = Arc::new(AtomicUsize::new(0));
    let counted = served.clone();
    let service = tower::service_fn(move |(_, fail): (&'static str, bool)| {
        counted.fetch_add(1, Ordering::SeqCst);
        async move {
            if fail {
                Err("boom")
            } else {
                Ok("done")
            }
        }
    });
    let layer =
        fusebox::guard::GuardLayer::new(guard.clone(), |(key, _): &(&'static str, bool)| {
            format!("svc/{key}")
        });
    let service = layer.layer(service);

    let ok = service.clone().oneshot(("t", false)).await;
    assert_eq!(ok.expect("the first request is served"), "done");
    // The layer reports through the guard's outcome queue.
    guard.flush().await.expect("the outcome is answered");
    assert_eq!(
        stats(&server, "svc/t").await.successes,
        1,
        "its success is reported on svc/t"
    );
    let failed = service.clone().oneshot(("t", true)).await;
    assert_eq!(
        failed.expect_err("the service's error").into_call(),
        Some("boom")
    );
    guard.flush().await.expect("the outcome is answered");
    assert_eq!(
        server.get("svc/t").await.phase,
        pb::Phase::Open as i32,
        "a failure trips it"
    );
    let blocked = service.clone().oneshot(("t", false)).await;
    assert!(
        matches!(blocked, Err(GuardError::Blocked { .. })),
        "an open breaker answers for the service: {blocked:?}"
    );
    assert_eq!(
        served.load(Ordering::SeqCst),
        2,
        "the blocked request never reached the service"
    );
    let other = service.oneshot(("u", false)).await;
    assert_eq!(other.expect("another key is its own breaker"), "done");
}

/// The guard reads its injected clock for its cache of open keys: the key
/// stays blocked locally, however long the test really takes, until that
/// clock passes the retry-after; then fusebox is asked again.
#[tokio::test]
async fn the_guard_reads_its_clock_for_its_cache_of_open_keys() {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    let server = Server::manual(Some(TRIPS_ON_ONE)).await;
    let start = Instant::now();
    let elapsed_ms = Arc::new(AtomicU64::new(0));
    let reading = elapsed_ms.clone();
    let clock = fusebox::guard::Clock::from_fn(move || {
        start + Duration::from_millis(reading.load(Ordering::SeqCst))
    });
    let guard = Guard::connect(
        &format!("http://{}", server.addr),
        None,
        GuardOptions { clock, ..patient() },
    )
    .expect("a guard");
    let run = || async {
        guard
            .run("svc/c", &CallOptions::default(), || async {
                Err::<(), _>("boom")
            })
            .await
    };
    assert!(
        matches!(run().await, Err(GuardError::Call("boom"))),
        "the call runs and fails"
    );
    // Its failure reaches fusebox before the next call asks.
    guard.flush().await.expect("the outcome is answered");
    let asked = run().await;
    assert!(
        matches!(asked, Err(GuardError::Blocked { local: false, .. })),
        "fusebox answers that the breaker is open: {asked:?}"
    );
    let local = run().await;
    assert!(
        matches!(local, Err(GuardError::Blocked { local: true, .. })),
        "then the guard answers from its cache: {local:?}"
    );
    elapsed_ms.store(10_000, Ordering::SeqCst);
    let again = run().await;
    assert!(
        matches!(again, Err(GuardError::Blocked { local: false, .. })),
        "past the retry-after on the guard's clock, fusebox is asked again: {again:?}"
    );
    assert_eq!(guard.stats().local_blocked, 1);
}

/// `run_with_cost` (U1): the cost read from the call's result goes with
/// its outcome, and the key's token bucket settles the difference; a cost
/// of `None` is what the ticket took.
#[tokio::test]
async fn run_with_cost_reports_what_the_call_really_used() {
    let bucket = "[default]\nlimiter = { kind = \"token_bucket\", capacity = 10, refill = 1, period = \"1h\" }\n";
    let server = Server::manual(Some(bucket)).await;
    let guard = guard(&server, None);
    let state = async || {
        server
            .admin()
            .await
            .get_key(pb::GetKeyRequest { key: "llm".into() })
            .await
            .expect("GetKey answers")
            .into_inner()
    };
    let free = async || state().await.free;
    // A call that asked for 1 and used 6 (say, tokens of an answer).
    let used: Result<u32, GuardError<String>> = guard
        .run_with_cost(
            "llm",
            &CallOptions::default(),
            |r| r.as_ref().ok().copied(),
            || async { Ok(6) },
        )
        .await;
    assert_eq!(used.expect("granted"), 6);
    guard.flush().await.expect("the outcome is answered");
    assert_eq!(free().await, 4, "10 - 1 taken - 5 more");

    // One that asked for 3, failed and used nothing: all 3 come back.
    let three = CallOptions {
        permits: Some(3),
        ..CallOptions::default()
    };
    let failed: Result<u32, GuardError<String>> = guard
        .run_with_cost(
            "llm",
            &three,
            |r| r.as_ref().map_or(Some(0), |&n| Some(n)),
            || async { Err("the model timed out".to_owned()) },
        )
        .await;
    assert!(matches!(failed, Err(GuardError::Call(_))), "{failed:?}");
    guard.flush().await.expect("the outcome is answered");
    assert_eq!(free().await, 4);

    // No cost: what the ticket took, as `run` does.
    let plain: Result<u32, GuardError<String>> = guard
        .run_with_cost("llm", &CallOptions::default(), |_| None, || async { Ok(1) })
        .await;
    assert_eq!(plain.expect("granted"), 1);
    guard.flush().await.expect("the outcome is answered");
    assert_eq!(free().await, 3);
    assert_eq!(state().await.stats.unwrap_or_default().failures, 1);
}

/// Q1: fusebox refuses a caller of more than 128 bytes with
/// INVALID_ARGUMENT naming `caller` and takes one of 128, so a refusal
/// proves what the guard sent: its own caller, or a call's in its place,
/// on either transport. The call never runs when refused.
#[tokio::test]
async fn the_guard_sends_its_caller_and_a_call_may_replace_it() {
    let server = Server::manual(None).await;
    let long = "c".repeat(129);
    let fits = "c".repeat(128);
    let refused_for_caller = |what: &str, answer: Result<(), GuardError<String>>| match answer {
        Err(GuardError::Rejected(s))
            if s.code() == Code::InvalidArgument && s.message().starts_with("caller:") => {}
        other => panic!("{what}: want INVALID_ARGUMENT naming caller, got {other:?}"),
    };
    for transport in [Transport::Unary, Transport::Stream] {
        let with = |caller: &str| {
            Guard::connect(
                &format!("http://{}", server.addr),
                None,
                GuardOptions {
                    caller: Some(caller.to_owned()),
                    transport,
                    ..patient()
                },
            )
            .expect("a guard")
        };
        let mut ran = Vec::new();
        let guard = with(&long);
        let answer = guard
            .run("svc", &CallOptions::default(), || {
                ran.push("the guard's caller");
                async { Ok(()) }
            })
            .await;
        refused_for_caller("the guard's caller", answer);
        let checkout = CallOptions {
            caller: Some("checkout".into()),
            attempt: Some(2),
            ..CallOptions::default()
        };
        let answer: Result<(), GuardError<String>> = guard
            .run("svc", &checkout, || {
                ran.push("a call's caller replaces the guard's");
                async { Ok(()) }
            })
            .await;
        answer.expect("granted");

        let guard = with(&fits);
        let answer: Result<(), GuardError<String>> = guard
            .run("svc", &CallOptions::default(), || {
                ran.push("128 bytes");
                async { Ok(()) }
            })
            .await;
        answer.expect("granted");
        let too_long = CallOptions {
            caller: Some(long.clone()),
            ..CallOptions::default()
        };
        let answer = guard
            .run("svc", &too_long, || {
                ran.push("a call's caller");
                async { Ok(()) }
            })
            .await;
        refused_for_caller("a call's caller", answer);
        assert_eq!(
            ran,
            ["a call's caller replaces the guard's", "128 bytes"],
            "{transport:?}"
        );
        guard.flush().await.expect("the outcomes are answered");
    }
}

/// R2: a key whose retry budget has seen no first attempt denies a retry
/// (`DENIED retry_budget`, no hint) and grants a first attempt, so the
/// attempt a call names reaches the server's budget, on either transport.
#[tokio::test]
async fn a_calls_attempt_is_counted_by_the_retry_budget() {
    let server = Server::manual(Some(
        "[[rule]]\nmatch = \"budget/*\"\nretry_budget = { ratio = 0.1, min_per_second = 0, window = \"10s\" }\n",
    ))
    .await;
    for transport in [Transport::Unary, Transport::Stream] {
        let guard = Guard::connect(
            &format!("http://{}", server.addr),
            None,
            GuardOptions {
                transport,
                ..patient()
            },
        )
        .expect("a guard");
        let key = format!("budget/{transport:?}");
        let attempt = |n| CallOptions {
            attempt: Some(n),
            ..CallOptions::default()
        };
        let mut ran = 0;
        let answer: Result<(), GuardError<String>> = guard
            .run(&key, &attempt(2), || {
                ran += 1;
                async { Ok(()) }
            })
            .await;
        assert!(
            matches!(
                answer,
                Err(GuardError::Denied {
                    reason: Reason::RetryBudget,
                    retry_after: None
                })
            ),
            "{transport:?}: {answer:?}"
        );
        let answer: Result<(), GuardError<String>> = guard
            .run(&key, &attempt(1), || {
                ran += 1;
                async { Ok(()) }
            })
            .await;
        answer.expect("a first attempt is granted");
        assert_eq!(ran, 1, "{transport:?}");
        guard.flush().await.expect("the outcome is answered");
    }
}

/// D1, D2: on a shadow policy the guard runs a call fusebox would have
/// blocked, tells it from inside the call as `Admitted::Shadow` with the
/// would-be reason, and its outcome (reported stale) trips nothing.
#[tokio::test]
async fn a_shadow_policy_runs_the_call_and_the_guard_says_what_it_would_have_been() {
    use fusebox::guard::{admitted, Admitted};

    let server = Server::manual(Some(
        "[[rule]]\nmatch = \"dry/*\"\nbreaker = { mode = \"consecutive\", failures = 1, break = \"10s\" }\nenforce = false\n",
    ))
    .await;
    let guard =
        Guard::connect(&format!("http://{}", server.addr), None, patient()).expect("a guard");
    let first: Result<Option<Admitted>, GuardError<()>> = guard
        .run("dry/a", &CallOptions::default(), || async { Err(()) })
        .await
        .map(|_: ()| None);
    assert!(matches!(first, Err(GuardError::Call(()))));
    guard.flush().await.expect("the outcome is answered");
    assert_eq!(server.get("dry/a").await.phase, pb::Phase::Open as i32);

    let how: Result<Option<Admitted>, GuardError<()>> = guard
        .run("dry/a", &CallOptions::default(), || async {
            Ok(admitted())
        })
        .await;
    assert_eq!(
        how.expect("a shadow policy runs the call"),
        Some(Admitted::Shadow {
            blocked: true,
            reason: Reason::Open
        })
    );
    guard.flush().await.expect("the outcome is answered");
    let state = server.get("dry/a").await;
    let stats = state.stats.unwrap_or_default();
    assert_eq!((stats.shadow, stats.blocked, stats.stale), (1, 1, 1));
    assert_eq!(state.phase, pb::Phase::Open as i32);
}

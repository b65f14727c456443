//! `fusebox::guard` beyond the shared scenarios: the bearer token, and a
//! classifier that does not count an error.

use fusebox::guard::{CallOptions, Guard, GuardError, GuardOptions, Outcome};
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

fn guard(server: &Server, token: Option<&str>) -> Guard {
    Guard::connect(
        &format!("http://{}", server.addr),
        None,
        GuardOptions {
            token: token.map(str::to_owned),
            ..GuardOptions::default()
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
    let guard = Guard::connect(
        &format!("http://{}", server.addr),
        None,
        GuardOptions::default(),
    )
    .expect("a guard");
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

    // Outcomes of dropped tickets are sent in the background: wait for them.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let st = stats(&server, "a/panics").await;
        if st.failures + st.ignored == 3 {
            assert_eq!((st.failures, st.ignored), (2, 1), "{st:?}");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "outcomes never arrived: {st:?}"
        );
        tokio::task::yield_now().await;
    }
}

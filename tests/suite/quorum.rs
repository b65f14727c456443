//! Quorum trips over gRPC (SPEC Q1-Q2), embedded and with `--store`: who a
//! caller is comes from the server, not only from the request. With
//! authentication it is the credential's name (the request's `caller` is
//! ignored); without, the request's `caller`; without either, the peer's
//! address, so two Acquires from one host without a caller are one caller.

use tonic::Request;

use fusebox::proto::v1 as pb;

use crate::harness::{Options, Server};

/// A consecutive breaker of 2 failures that needs 2 distinct callers.
const POLICY: &str =
    "[default]\nbreaker = { mode = \"consecutive\", failures = 2, break = \"30s\", quorum = 2 }\n";

const TOKENS: [(&str, &str); 2] = [
    ("pod-1", "pod-1-token-0123456789abcdef"),
    ("pod-2", "pod-2-token-0123456789abcdef"),
];

fn auth_config() -> String {
    let mut text = String::from("[auth]\n");
    for (name, token) in TOKENS {
        text.push_str(&format!(
            "[[auth.token]]\nname = \"{name}\"\nrole = \"admin\"\nsha256 = \"{}\"\n",
            fusebox::auth::hash_hex(token)
        ));
    }
    text + POLICY
}

fn with<T>(token: Option<&str>, message: T) -> Request<T> {
    let mut r = Request::new(message);
    if let Some(t) = token {
        r.metadata_mut().insert(
            "authorization",
            format!("Bearer {t}").parse().expect("ASCII"),
        );
    }
    r
}

/// One call on `key` that fails: Acquire with `caller`, Complete FAILURE.
async fn fail(server: &Server, token: Option<&str>, key: &str, caller: &str) {
    let mut client = server.fusebox().await;
    let acquired = client
        .acquire(with(
            token,
            pb::AcquireRequest {
                key: key.into(),
                caller: caller.into(),
                ..Default::default()
            },
        ))
        .await
        .expect("Acquire answers")
        .into_inner();
    assert_eq!(
        acquired.decision(),
        pb::Decision::Granted,
        "{key}: {acquired:?}"
    );
    client
        .complete(with(
            token,
            pb::CompleteRequest {
                ticket: acquired.ticket,
                outcome: pb::Outcome::Failure as i32,
                ..Default::default()
            },
        ))
        .await
        .expect("Complete answers");
}

async fn state(server: &Server, token: Option<&str>, key: &str) -> (pb::Phase, u32) {
    let s = server
        .admin()
        .await
        .get_key(with(token, pb::GetKeyRequest { key: key.into() }))
        .await
        .expect("GetKey answers")
        .into_inner();
    (s.phase(), s.consecutive_failures)
}

async fn callers_are_told_apart(store: Option<&str>) {
    let mut args = vec![];
    if let Some(store) = store {
        args.extend(["--store", store]);
    }
    // Without authentication: the request's caller, else the peer.
    let config = POLICY.to_owned();
    let server = Server::start(Options {
        config: Some(&config),
        args: args.clone(),
        ..Options::default()
    })
    .await;
    fail(&server, None, "peer", "").await;
    fail(&server, None, "peer", "").await;
    assert_eq!(
        state(&server, None, "peer").await,
        (pb::Phase::Closed, 2),
        "two failures from one host without a caller are one caller's"
    );
    fail(&server, None, "peer", "pod-9").await;
    assert_eq!(state(&server, None, "peer").await, (pb::Phase::Open, 3));

    fail(&server, None, "named", "a").await;
    fail(&server, None, "named", "a").await;
    assert_eq!(state(&server, None, "named").await, (pb::Phase::Closed, 2));
    fail(&server, None, "named", "b").await;
    assert_eq!(state(&server, None, "named").await, (pb::Phase::Open, 3));
    server.stop().await;

    // With authentication: the credential's name, whatever the caller says.
    let config = auth_config();
    let server = Server::start(Options {
        config: Some(&config),
        args,
        ..Options::default()
    })
    .await;
    let (one, two) = (Some(TOKENS[0].1), Some(TOKENS[1].1));
    fail(&server, one, "auth", "a").await;
    fail(&server, one, "auth", "b").await;
    assert_eq!(
        state(&server, one, "auth").await,
        (pb::Phase::Closed, 2),
        "one credential is one caller whatever callers it names"
    );
    fail(&server, two, "auth", "a").await;
    assert_eq!(state(&server, one, "auth").await, (pb::Phase::Open, 3));
    server.stop().await;
}

#[tokio::test]
async fn callers_are_the_credential_else_the_named_caller_else_the_peer() {
    callers_are_told_apart(None).await;
}

#[tokio::test]
async fn callers_are_told_apart_the_same_with_a_store() {
    let test = "callers_are_told_apart_the_same_with_a_store";
    let Some(redis) = crate::harness::standalone(test).await else {
        return;
    };
    callers_are_told_apart(Some(&format!("redis://127.0.0.1:{}", redis.server.port))).await;
}

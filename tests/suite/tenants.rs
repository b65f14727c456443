//! Many teams on one fusebox, some of their clients broken or hostile
//! (issue 18): what a stranger can hold, and what a credential's holder
//! can take from the others. Each test probes as an attacker would,
//! against a real server over its real ports.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::harness::{Options, Server};
use crate::http::get;

const TOKEN: &str = "tenant-a-token-0123456789";

/// A server with one caller token (`a/*`) and `extra` config lines.
async fn server_with(extra: &str) -> Server {
    server_in(extra, &[]).await
}

/// [`server_with`], with more arguments (`--store URL`).
async fn server_in(extra: &str, args: &[&str]) -> Server {
    let config = format!(
        "{extra}\n[auth]\n\n[[auth.token]]\nname = \"a\"\nrole = \"caller\"\nprefixes = [\"a/*\"]\nsha256 = \"{}\"\n",
        fusebox::auth::hash_hex(TOKEN)
    );
    Server::start(Options {
        config: Some(&config),
        args: args.to_vec(),
        ..Options::default()
    })
    .await
}

/// Runs `test` against a server on a real Redis (`--store URL`); skipped
/// where Redis or the module is missing, as every store test is.
async fn with_a_store<F, Fut>(name: &'static str, test: F)
where
    F: FnOnce(String) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let Some(redis) = crate::harness::standalone(name).await else {
        return;
    };
    test(format!("redis://127.0.0.1:{}", redis.server.port)).await;
    drop(redis);
}

/// The value of an unlabelled series in a `/metrics` text.
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /metrics:\n{text}"))
}

async fn metrics(server: &Server) -> String {
    let http = server.http_addr.as_deref().expect("an HTTP port");
    let reply = get(http, "/metrics").await;
    assert_eq!(reply.status, 200, "{reply:?}");
    reply.body
}

/// A raw HTTP/2 connection to the gRPC port, driven in the background
/// once the server's SETTINGS are in; returns the sender and the
/// server's SETTINGS_MAX_CONCURRENT_STREAMS.
async fn raw_h2(addr: &str) -> (h2::client::SendRequest<bytes::Bytes>, usize) {
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let (client, mut connection) = h2::client::handshake(tcp)
        .await
        .expect("an HTTP/2 handshake");
    // The server sends its SETTINGS before it answers a PING: once the
    // PONG is back, the settings are applied.
    let mut ping_pong = connection.ping_pong().expect("ping pong");
    tokio::select! {
        done = &mut connection => panic!("the connection ended before a PING was answered: {done:?}"),
        pong = ping_pong.ping(h2::Ping::opaque()) => {
            pong.expect("a PONG");
        }
    }
    let streams = connection.max_concurrent_send_streams();
    tokio::spawn(async move {
        let _ = connection.await;
    });
    (client, streams)
}

/// A gRPC request's headers for `path`, with `token` if any.
fn headers_only(path: &str, token: Option<&str>) -> http::Request<()> {
    let mut request = http::Request::post(format!("http://fusebox{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    request.body(()).expect("a request")
}

/// The probe: 3,000 HEADERS-only calls without a token on one connection
/// were all accepted and held (`fusebox_calls_in_flight` +3,000), because
/// the credential was checked only once the body arrived. Now the
/// connection's streams are capped in its SETTINGS, and each call is
/// answered UNAUTHENTICATED on its headers while its body is still open,
/// never counting as in flight.
#[tokio::test]
async fn calls_without_a_credential_are_refused_on_their_headers() {
    let server = server_with("[server]\nmax_streams_per_connection = 64").await;
    let (mut client, streams) = raw_h2(&server.addr).await;
    assert_eq!(
        streams, 64,
        "SETTINGS_MAX_CONCURRENT_STREAMS is the configured cap"
    );
    let before = metrics(&server).await;
    let mut held = Vec::new();
    for i in 0..3_000 {
        client = client.ready().await.expect("the connection takes a stream");
        let (response, body) = client
            .send_request(headers_only("/fusebox.v1.Fusebox/Acquire", None), false)
            .expect("a stream");
        // The request's body stays open: it is never sent.
        held.push(body);
        let response = tokio::time::timeout(Duration::from_secs(10), response)
            .await
            .unwrap_or_else(|_| panic!("call {i}: no answer on the headers alone"))
            .expect("a response");
        let status = response
            .headers()
            .get("grpc-status")
            .map(|v| v.to_str().unwrap_or_default().to_owned());
        assert_eq!(
            status.as_deref(),
            Some("16"),
            "call {i}: UNAUTHENTICATED, in the headers: {response:?}"
        );
    }
    let after = metrics(&server).await;
    assert_eq!(
        metric(&after, "fusebox_calls_in_flight"),
        0.0,
        "none is in flight"
    );
    assert_eq!(
        metric(&after, "fusebox_calls_unauthenticated_total")
            - metric(&before, "fusebox_calls_unauthenticated_total"),
        3_000.0
    );
    // A caller with the token on the same server is served.
    let (mut client, _) = raw_h2(&server.addr).await;
    client = client.ready().await.expect("ready");
    let (response, _body) = client
        .send_request(
            headers_only("/fusebox.v1.Fusebox/Acquire", Some(TOKEN)),
            false,
        )
        .expect("a stream");
    held.push(_body);
    // Authenticated, its call now waits for the body it was promised: it
    // is in flight, and not refused on its headers.
    crate::harness::eventually(
        "the authenticated call to be in flight",
        Duration::from_secs(10),
        || async {
            (metric(&metrics(&server).await, "fusebox_calls_in_flight") == 1.0).then_some(())
        },
    )
    .await;
    drop(response);
}

/// A status check (`permits: 0`) of `key` as `token`: `Ok`, or the code it
/// was refused with.
pub(crate) async fn check_as(server: &Server, token: &str, key: &str) -> Result<(), tonic::Code> {
    server
        .fusebox()
        .await
        .acquire(bearer(token, crate::admin::status_check(key)))
        .await
        .map(|_| ())
        .map_err(|s| s.code())
}

pub(crate) fn bearer<T>(token: &str, message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().expect("a header value"),
    );
    request
}

fn token_entry(name: &str, role: &str, token: &str) -> String {
    format!(
        "[[token]]\nname = \"{name}\"\nrole = \"{role}\"\nsha256 = \"{}\"\n",
        fusebox::auth::hash_hex(token)
    )
}

/// Reads `stream` into `seen` until it holds `wanted`; false if it did
/// not within `within` (or the stream ended first).
async fn read_until(
    stream: &mut TcpStream,
    seen: &mut String,
    wanted: &str,
    within: Duration,
) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    let mut buf = [0u8; 4096];
    while !seen.contains(wanted) {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => seen.push_str(&String::from_utf8_lossy(&buf[..n])),
            _ => return false,
        }
    }
    true
}

/// The next message of a stream, or the status it ended with; `None` if
/// nothing came within `within`.
async fn next_of<T>(
    stream: &mut tonic::Streaming<T>,
    within: Duration,
) -> Option<Result<Option<T>, tonic::Status>> {
    tokio::time::timeout(within, stream.message()).await.ok()
}

/// The probe: a Decide stream opened before its token was removed from
/// the token file kept deciding after unary calls with that token were
/// answered UNAUTHENTICATED (Watch too). Now every stream a removed
/// credential opened ends UNAUTHENTICATED as soon as the server has read
/// the new file, and a credential that stays keeps its streams.
#[tokio::test]
async fn streams_end_when_their_token_is_removed() {
    streams_end_when_their_token_is_removed_in(&[]).await;
}

#[tokio::test]
async fn streams_end_when_their_token_is_removed_with_a_store() {
    with_a_store(
        "streams_end_when_their_token_is_removed_with_a_store",
        |url| async move {
            streams_end_when_their_token_is_removed_in(&["--store", &url]).await;
        },
    )
    .await;
}

async fn streams_end_when_their_token_is_removed_in(args: &[&str]) {
    use fusebox::proto::v1 as pb;
    use tokio_stream::wrappers::ReceiverStream;
    const GONE: &str = "removed-caller-token-0123456789";
    const OPS: &str = "removed-operator-token-0123456789";
    const KEPT: &str = "kept-caller-token-0123456789";
    let dir = tempfile::tempdir().expect("a dir");
    let file = dir.path().join("tokens.toml");
    std::fs::write(
        &file,
        token_entry("gone", "caller", GONE)
            + &token_entry("ops", "operator", OPS)
            + &token_entry("kept", "caller", KEPT),
    )
    .unwrap();
    let config = format!("[auth]\ntoken_file = \"{}\"\n", file.display());
    let server = Server::start(Options {
        config: Some(&config),
        args: args.to_vec(),
        ..Options::default()
    })
    .await;
    let frame = |id: u64| pb::DecideRequest {
        frames: vec![pb::DecideFrame {
            id,
            request: Some(pb::decide_frame::Request::Acquire(
                crate::admin::status_check("a/k"),
            )),
        }],
    };
    let mut open = Vec::new();
    for token in [GONE, KEPT] {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tx.send(frame(1)).await.unwrap();
        let mut answers = server
            .fusebox()
            .await
            .decide(bearer(token, ReceiverStream::new(rx)))
            .await
            .expect("the stream opens")
            .into_inner();
        let first = next_of(&mut answers, Duration::from_secs(10)).await;
        assert!(
            matches!(&first, Some(Ok(Some(m))) if m.results.len() == 1),
            "{token}: the first frame is answered: {first:?}"
        );
        open.push((tx, answers));
    }
    let mut watch = server
        .admin()
        .await
        .watch(bearer(
            OPS,
            pb::WatchRequest {
                prefix: "a/".into(),
            },
        ))
        .await
        .expect("the watch opens")
        .into_inner();

    // The dashboard's event stream, as a browser opens it.
    let http = server.http_addr.clone().expect("an HTTP port");
    let mut events = TcpStream::connect(&http).await.expect("connect");
    events
        .write_all(
            format!(
                "GET /api/events?prefix=a/ HTTP/1.1\r\nHost: {http}\r\nAuthorization: Bearer {OPS}\r\nAccept: text/event-stream\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let mut seen = String::new();
    read_until(&mut events, &mut seen, "\r\n\r\n", Duration::from_secs(10)).await;
    assert!(
        seen.starts_with("HTTP/1.1 200"),
        "the event stream opens: {seen}"
    );

    std::fs::write(&file, token_entry("kept", "caller", KEPT)).unwrap();
    let unary = |token: &'static str| check_as(&server, token, "a/k");
    crate::harness::eventually(
        "the new token file to be read",
        Duration::from_secs(10),
        || async { (unary(GONE).await == Err(tonic::Code::Unauthenticated)).then_some(()) },
    )
    .await;
    // Within a second of that, the removed token's streams have ended.
    let (_, gone) = &mut open[0];
    let ended = next_of(gone, Duration::from_secs(1)).await;
    assert!(
        matches!(&ended, Some(Err(s)) if s.code() == tonic::Code::Unauthenticated && s.message().contains("gone")),
        "the Decide stream of the removed token ended UNAUTHENTICATED: {ended:?}"
    );
    let ended = loop {
        match next_of(&mut watch, Duration::from_secs(1)).await {
            // The snapshot of the keys, sent when the watch opened.
            Some(Ok(Some(_))) => continue,
            other => break other,
        }
    };
    assert!(
        matches!(&ended, Some(Err(s)) if s.code() == tonic::Code::Unauthenticated),
        "the Watch of the removed operator ended UNAUTHENTICATED: {ended:?}"
    );
    assert!(
        read_until(
            &mut events,
            &mut seen,
            "event: refused",
            Duration::from_secs(1)
        )
        .await,
        "the dashboard's event stream of the removed operator says so and ends: {seen}"
    );
    // The kept token's stream still decides.
    let (tx, kept) = &mut open[1];
    tx.send(frame(2)).await.unwrap();
    let answer = next_of(kept, Duration::from_secs(10)).await;
    assert!(
        matches!(&answer, Some(Ok(Some(m))) if m.results.len() == 1 && m.results[0].id == 2),
        "the kept token's stream goes on: {answer:?}"
    );
}

/// The probe: `GET /metrics` without a token (the default `metrics =
/// "open"`) named every namespace's busiest and exact-rule keys, and
/// ListPolicies showed an `a/*` operator the rules for `b/*`. Now
/// `/metrics` without a credential has no key names at all (its
/// aggregates still count every key), a credential gets per-key series
/// for its own keys only, and ListPolicies shows it only the rules inside
/// its keys.
#[tokio::test]
async fn key_names_are_shown_only_to_their_namespace() {
    key_names_are_shown_only_to_their_namespace_in(&[]).await;
}

#[tokio::test]
async fn key_names_are_shown_only_to_their_namespace_with_a_store() {
    with_a_store(
        "key_names_are_shown_only_to_their_namespace_with_a_store",
        |url| async move {
            key_names_are_shown_only_to_their_namespace_in(&["--store", &url]).await;
        },
    )
    .await;
}

async fn key_names_are_shown_only_to_their_namespace_in(args: &[&str]) {
    use fusebox::proto::v1 as pb;
    const A_OPS: &str = "namespace-a-operator-0123456789";
    const B: &str = "namespace-b-caller-0123456789";
    let config = format!(
        "[[rule]]\nmatch = \"b/secret\"\nbreaker = {{ mode = \"consecutive\", failures = 3, break = \"1s\" }}\n\n\
         [[rule]]\nmatch = \"b/*\"\nbreaker = {{ mode = \"consecutive\", failures = 3, break = \"1s\" }}\n\n\
         [[rule]]\nmatch = \"a/*\"\nbreaker = {{ mode = \"consecutive\", failures = 3, break = \"1s\" }}\n\n\
         [auth]\n\n{}{}",
        token_entry("a-ops", "operator", A_OPS).replace("[[token]]", "[[auth.token]]").replace(
            "role = \"operator\"\n",
            "role = \"operator\"\nprefixes = [\"a/*\"]\n"
        ),
        token_entry("b", "caller", B).replace("[[token]]", "[[auth.token]]"),
    );
    let server = Server::start(Options {
        config: Some(&config),
        args: args.to_vec(),
        ..Options::default()
    })
    .await;
    // b's keys are busy: b/secret and b/hot hold tickets.
    let mut b = server.fusebox().await;
    for key in ["b/secret", "b/hot"] {
        b.acquire(bearer(B, crate::admin::one_permit(key)))
            .await
            .expect("b acquires its own key");
    }
    b.acquire(bearer(A_OPS, crate::admin::one_permit("a/mine")))
        .await
        .expect("a's operator acquires its own key");
    let http = server.http_addr.clone().expect("an HTTP port");
    // With a store, the figures are the store's, read every so often.
    let anonymous = crate::harness::eventually(
        "/metrics counting b's and a's tickets",
        Duration::from_secs(10),
        || async {
            let reply = get(&http, "/metrics").await;
            (reply.status == 200 && reply.body.contains("fusebox_other_keys_live_tickets 3"))
                .then_some(reply)
        },
    )
    .await;
    assert!(
        !anonymous.body.contains("key=\""),
        "no key name without a credential:\n{}",
        anonymous.body
    );
    assert!(
        anonymous.body.contains("fusebox_other_keys_live_tickets 3"),
        "the aggregates still count every key:\n{}",
        anonymous.body
    );
    let as_a = crate::http::request(
        &http,
        "GET",
        "/metrics",
        &[("authorization", &format!("Bearer {A_OPS}"))],
        b"",
    )
    .await;
    assert_eq!(as_a.status, 200, "{as_a:?}");
    assert!(
        !as_a.body.contains("key=\"b/"),
        "a's operator sees none of b's keys:\n{}",
        as_a.body
    );
    assert!(
        as_a.body
            .contains("fusebox_key_live_tickets{key=\"a/mine\"} 1"),
        "and its own:\n{}",
        as_a.body
    );

    let listed = server
        .admin()
        .await
        .list_policies(bearer(A_OPS, pb::ListPoliciesRequest {}))
        .await
        .expect("an operator lists the rules")
        .into_inner();
    let matches: Vec<String> = listed.rules.into_iter().map(|r| r.r#match).collect();
    assert_eq!(
        matches,
        vec!["a/*".to_owned()],
        "only the rules inside a's keys"
    );
}

/// The probe: an admin limited to `a/*` added 2,000 rules, and `/metrics`
/// grew from 16 KiB to 2.2 MiB. Now rules are capped (`[server]
/// max_rules`, the config's and SetPolicy's together): a new rule past
/// the cap is refused RESOURCE_EXHAUSTED naming the cap, replacing one is
/// not, and a namespace admin may set rules only inside its patterns.
#[tokio::test]
async fn rules_are_capped_and_a_namespace_admin_stays_in_its_patterns() {
    rules_are_capped_and_a_namespace_admin_stays_in_its_patterns_in(&[]).await;
}

#[tokio::test]
async fn rules_are_capped_and_a_namespace_admin_stays_in_its_patterns_with_a_store() {
    with_a_store(
        "rules_are_capped_and_a_namespace_admin_stays_in_its_patterns_with_a_store",
        |url| async move {
            rules_are_capped_and_a_namespace_admin_stays_in_its_patterns_in(&["--store", &url])
                .await;
        },
    )
    .await;
}

async fn rules_are_capped_and_a_namespace_admin_stays_in_its_patterns_in(args: &[&str]) {
    use fusebox::proto::v1 as pb;
    const A_ADMIN: &str = "namespace-a-admin-0123456789";
    let config = format!(
        "[server]\nmax_rules = 4\n\n[[rule]]\nmatch = \"a/config\"\nbreaker = {{ mode = \"consecutive\", failures = 3, break = \"1s\" }}\n\n[auth]\n\n{}",
        token_entry("a-admin", "admin", A_ADMIN)
            .replace("[[token]]", "[[auth.token]]")
            .replace("role = \"admin\"\n", "role = \"admin\"\nprefixes = [\"a/*\"]\n")
            // A share above the cap: the server's cap is what stops it.
            + "limits = { max_rules = 10 }\n",
    );
    let server = Server::start(Options {
        config: Some(&config),
        args: args.to_vec(),
        ..Options::default()
    })
    .await;
    let mut admin = server.admin().await;
    let rule = |m: &str| pb::SetPolicyRequest {
        rule: Some(pb::PolicyRule {
            r#match: m.into(),
            policy: Some(pb::Policy {
                breaker: Some(crate::admin::consecutive(3, 1000)),
                limiter: None,
                lease: None,
                ..Default::default()
            }),
            default: false,
        }),
    };
    let outside = admin.set_policy(bearer(A_ADMIN, rule("b/*"))).await;
    assert_eq!(
        outside.map(|_| ()).map_err(|s| s.code()),
        Err(tonic::Code::PermissionDenied),
        "b/* is outside a's patterns"
    );
    for m in ["a/1", "a/2", "a/3"] {
        admin
            .set_policy(bearer(A_ADMIN, rule(m)))
            .await
            .unwrap_or_else(|s| panic!("{m}: within the cap: {s:?}"));
    }
    let past = admin
        .set_policy(bearer(A_ADMIN, rule("a/4")))
        .await
        .expect_err("a fifth rule is past the cap of 4");
    assert_eq!(past.code(), tonic::Code::ResourceExhausted);
    assert!(past.message().contains("max_rules"), "{past:?}");
    admin
        .set_policy(bearer(A_ADMIN, rule("a/2")))
        .await
        .expect("replacing a rule is not a new one");
    let text = metrics(&server).await;
    assert!(
        text.contains("fusebox_cap_refusals_total{cap=\"max_rules\"} 1"),
        "the refusal is counted:\n{text}"
    );
}

/// The probe: 20 sockets that sent only the HTTP/2 preface
/// (`max_connections = 20`) left a caller with a valid token UNAVAILABLE.
/// Now connections that have shown no credential are strangers, capped
/// (`max_strangers`, by default half the connections) and closed oldest
/// first to make room, so the caller gets in; once its call shows its
/// token, its connection is no stranger and is never closed for room.
#[tokio::test]
async fn connections_that_never_authenticate_cannot_keep_a_caller_out() {
    let server = server_with("[server]\nmax_connections = 20").await;
    let mut strangers = strangers_to(&server.addr, 20).await;
    // Every preface is in: each stranger took a slot, or made room.
    crate::harness::eventually(
        "the strangers to be counted",
        Duration::from_secs(10),
        || async {
            let text = metrics(&server).await;
            (metric(&text, "fusebox_connections") + metric(&text, "fusebox_strangers_closed_total")
                >= 20.0)
                .then_some(())
        },
    )
    .await;
    // A stranger closed for room leaves the gauge once its connection's
    // task has ended, a moment after it is counted as closed.
    let text = crate::harness::eventually(
        "at most max_strangers (10) strangers, and this scrape's own",
        Duration::from_secs(10),
        || async {
            let text = metrics(&server).await;
            (metric(&text, "fusebox_connections") <= 11.0).then_some(text)
        },
    )
    .await;
    let open = metric(&text, "fusebox_strangers");
    assert!(
        (1.0..=10.0).contains(&open) && metric(&text, "fusebox_max_strangers") == 10.0,
        "the strangers held now are shown, within their cap: {text}"
    );
    // The caller, on a raw HTTP/2 connection so that a reconnection
    // cannot hide a closed one.
    let (mut caller, _) = raw_h2(&server.addr).await;
    caller = acquire_raw(caller, TOKEN).await;
    // More strangers do not close the caller's connection: it showed its
    // token.
    strangers.extend(strangers_to(&server.addr, 20).await);
    crate::harness::eventually(
        "the new strangers to be counted",
        Duration::from_secs(10),
        || async {
            (metric(&metrics(&server).await, "fusebox_strangers_closed_total") >= 30.0)
                .then_some(())
        },
    )
    .await;
    acquire_raw(caller, TOKEN).await;
}

/// `n` connections to `addr` that send the HTTP/2 preface and nothing
/// more: strangers.
async fn strangers_to(addr: &str, n: usize) -> Vec<TcpStream> {
    let mut open = Vec::with_capacity(n);
    for _ in 0..n {
        let mut tcp = TcpStream::connect(addr).await.expect("connect");
        tcp.write_all(fusebox::connections::PREFACE)
            .await
            .expect("the preface");
        open.push(tcp);
    }
    open
}

/// A status check on `a/k` with `token`, as one gRPC call on `client`'s
/// connection; panics unless it is answered OK.
async fn acquire_raw(
    client: h2::client::SendRequest<bytes::Bytes>,
    token: &str,
) -> h2::client::SendRequest<bytes::Bytes> {
    use prost::Message;
    let mut client = client.ready().await.expect("the connection is open");
    let message = crate::admin::status_check("a/k").encode_to_vec();
    let mut framed = vec![0u8];
    framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
    framed.extend_from_slice(&message);
    let (response, mut body) = client
        .send_request(
            headers_only("/fusebox.v1.Fusebox/Acquire", Some(token)),
            false,
        )
        .expect("a stream on the open connection");
    body.send_data(bytes::Bytes::from(framed), true)
        .expect("the request's body");
    let response = tokio::time::timeout(Duration::from_secs(10), response)
        .await
        .expect("an answer")
        .expect("a response on the same connection");
    let mut answer = response.into_body();
    while let Some(chunk) = answer.data().await {
        chunk.expect("the answer's body");
    }
    let trailers = answer
        .trailers()
        .await
        .expect("trailers")
        .unwrap_or_default();
    assert_eq!(
        trailers
            .get("grpc-status")
            .map(|v| v.to_str().unwrap_or_default()),
        Some("0"),
        "the call is answered OK: {trailers:?}"
    );
    client
}

/// The probe: 32 idle keep-alive HTTP sockets left an operator's browser
/// disconnected. Now, with every slot taken, a new connection closes the
/// oldest idle one and takes its slot (counted); only connections busy
/// with a request or an answer keep theirs.
#[tokio::test]
async fn idle_http_sockets_make_room_for_a_new_viewer() {
    let server = server_with("[server]\nmax_http_connections = 8").await;
    let http = server.http_addr.clone().expect("an HTTP port");
    let mut idle = Vec::new();
    for _ in 0..8 {
        let mut tcp = TcpStream::connect(&http).await.expect("connect");
        tcp.write_all(format!("GET /healthz HTTP/1.1\r\nHost: {http}\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut seen = String::new();
        assert!(
            read_until(&mut tcp, &mut seen, "\r\n\r\n", Duration::from_secs(10)).await,
            "each socket is answered, and kept alive: {seen}"
        );
        idle.push(tcp);
    }
    // Eight idle keep-alive sockets hold every slot; a viewer still gets in.
    let reply = get(&http, "/healthz").await;
    assert_eq!(reply.status, 200, "{reply:?}");
    let text = metrics(&server).await;
    assert!(
        metric(&text, "fusebox_http_idle_closed_total") >= 1.0,
        "the room was made by closing idle sockets:\n{text}"
    );
    assert_eq!(
        metric(&text, "fusebox_http_connections_refused_total"),
        0.0,
        "and nobody was refused"
    );
    // The oldest idle socket is the one that was closed: it reads the end.
    let mut buf = [0u8; 64];
    let end = tokio::time::timeout(Duration::from_secs(10), idle[0].read(&mut buf))
        .await
        .expect("the closed socket reads at once");
    assert!(matches!(end, Ok(0) | Err(_)), "closed: {end:?}");
}

/// The probe: 2 connections x 16 Decide streams sending status checks and
/// reading nothing grew the server by 192 MiB, with no server-wide bound.
/// Now what a stream answered and its client has not read is bounded per
/// stream and per server: the stream stops reading frames at the bound,
/// and once stuck past `stuck_stream_timeout` it ends RESOURCE_EXHAUSTED,
/// counted, its unread answers let go. A caller that reads is served
/// throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decide_answers_never_read_are_bounded_and_the_stream_ends() {
    decide_answers_never_read_are_bounded_and_the_stream_ends_in(&[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decide_answers_never_read_are_bounded_and_the_stream_ends_with_a_store() {
    with_a_store(
        "decide_answers_never_read_are_bounded_and_the_stream_ends_with_a_store",
        |url| async move {
            decide_answers_never_read_are_bounded_and_the_stream_ends_in(&["--store", &url]).await;
        },
    )
    .await;
}

async fn decide_answers_never_read_are_bounded_and_the_stream_ends_in(args: &[&str]) {
    use fusebox::proto::v1 as pb;
    use tokio_stream::wrappers::ReceiverStream;
    const PER_STREAM: f64 = 65_536.0;
    const SERVER: f64 = 1_048_576.0;
    let server = server_in(
        "[server]\nmax_unread_bytes_per_stream = 65536\nmax_unread_bytes = 1048576\nstuck_stream_timeout = \"2s\"",
        args,
    )
    .await;
    let checks = pb::DecideRequest {
        frames: (0..1_000)
            .map(|id| pb::DecideFrame {
                id,
                request: Some(pb::decide_frame::Request::Acquire(
                    crate::admin::status_check(&format!("a/k{}", id % 7)),
                )),
            })
            .collect(),
    };
    let rss = |text: &str| metric(text, "process_resident_memory_bytes");
    let before = rss(&metrics(&server).await);
    let mut streams = Vec::new();
    let mut feeders = Vec::new();
    for _ in 0..2 {
        let client = server.fusebox().await;
        for _ in 0..16 {
            let (tx, rx) = tokio::sync::mpsc::channel(2);
            let answers = client
                .clone()
                .decide(bearer(TOKEN, ReceiverStream::new(rx)))
                .await
                .expect("the stream opens")
                .into_inner();
            let message = checks.clone();
            // Frames are sent for as long as the server reads them.
            feeders.push(tokio::spawn(async move {
                for _ in 0..200 {
                    if tx.send(message.clone()).await.is_err() {
                        return;
                    }
                }
                // Kept open: the stream is not ended by its caller.
                std::future::pending::<()>().await;
            }));
            streams.push(answers);
        }
    }
    // Answers pile up to the bounds, and no further. Before a stream's
    // answers wait on the server, its client's HTTP/2 windows fill: with a
    // store that is hundreds of thousands of frames through Redis, which a
    // debug build on a busy machine takes minutes over. The limit is only a
    // safety net: the test waits for the streams to be ended.
    let highest = std::sync::Mutex::new(0.0f64);
    let stuck = crate::harness::eventually(
        "every stream that never reads to be ended",
        Duration::from_secs(240),
        || async {
            let text = metrics(&server).await;
            let unread = metric(&text, "fusebox_unread_bytes");
            let mut most = highest.lock().unwrap();
            *most = most.max(unread);
            drop(most);
            assert!(
                unread <= SERVER,
                "unread answers stay within the server's bound: {unread}"
            );
            let stuck = text
                .lines()
                .find_map(|l| l.strip_prefix("fusebox_streams_stuck_total{stream=\"decide\"} "))
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0);
            (stuck >= 32.0).then_some((stuck, text))
        },
    )
    .await;
    let highest = *highest.lock().unwrap();
    assert!(highest > 0.0, "answers were waiting for their readers");
    assert!(
        highest <= (32.0 * PER_STREAM).min(SERVER),
        "each stream stays within its own bound: {highest}"
    );
    let grown = rss(&stuck.1) - before;
    assert!(
        grown < 100.0 * 1024.0 * 1024.0,
        "the server grew by {} MiB",
        grown / 1024.0 / 1024.0
    );
    // A stream that never read ends RESOURCE_EXHAUSTED, once read.
    let mut first = streams.remove(0);
    let ended = loop {
        match next_of(&mut first, Duration::from_secs(10)).await {
            Some(Ok(Some(_))) => continue,
            other => break other,
        }
    };
    match ended {
        Some(Err(status)) => {
            assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
            assert!(
                status.message().contains("stuck_stream_timeout"),
                "the message says what to do: {status:?}"
            );
        }
        other => panic!("the stuck stream ends RESOURCE_EXHAUSTED, not {other:?}"),
    }
    // Unread answers were let go, and a caller that reads is served.
    crate::harness::eventually(
        "the unread answers to be let go",
        Duration::from_secs(10),
        || async { (metric(&metrics(&server).await, "fusebox_unread_bytes") == 0.0).then_some(()) },
    )
    .await;
    server
        .fusebox()
        .await
        .acquire(bearer(TOKEN, crate::admin::one_permit("a/after")))
        .await
        .expect("a caller that reads is served");
    for feeder in feeders {
        feeder.abort();
    }
}

/// The probe: one credential's 36 Decide streams that never read took the
/// whole `max_unread_bytes`, and another tenant's stream, reading well,
/// then got none of its answers (0 of 56 in 12 s): it waited for room the
/// server no longer had. Now a credential holds at most its part of the
/// unread bytes (half with two tenants), so another tenant's stream always
/// finds room and is answered throughout; and two tokens of one tenant
/// hold one part between them (decisions 140, 149).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tenants_unread_streams_leave_room_for_another_tenant() {
    unread_streams_leave_room_in(&["a"], &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tokens_of_one_tenant_hold_one_part_of_the_unread_bytes() {
    unread_streams_leave_room_in(&["a1", "a2"], &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tenants_unread_streams_leave_room_for_another_tenant_with_a_store() {
    with_a_store(
        "one_tenants_unread_streams_leave_room_for_another_tenant_with_a_store",
        |url| async move {
            unread_streams_leave_room_in(&["a"], &["--store", &url]).await;
        },
    )
    .await;
}

/// The value of `name{credential="..."}` in a `/metrics` text, if there.
fn series(text: &str, name: &str, credential: &str) -> Option<f64> {
    let prefix = format!("{name}{{credential=\"{credential}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str())?.parse().ok())
}

/// `/metrics` as `token` sees it: with its own credential's figures.
async fn metrics_as(server: &Server, token: &str) -> String {
    let http = server.http_addr.as_deref().expect("an HTTP port");
    let reply = crate::http::request(
        http,
        "GET",
        "/metrics",
        &[("authorization", &format!("Bearer {token}"))],
        b"",
    )
    .await;
    assert_eq!(reply.status, 200, "{reply:?}");
    reply.body
}

/// A token of its own for each name.
fn token_of(name: &str) -> String {
    format!("{name}-token-0123456789abcdef")
}

/// Tenant A (the tokens `greedy`, all over `a/*`: one tenant) opens 36
/// Decide streams, sends status checks on each and reads nothing; tenant
/// B (`b/*`) then sends 56 messages on one stream, reading each answer.
async fn unread_streams_leave_room_in(greedy: &[&str], args: &[&str]) {
    use fusebox::proto::v1 as pb;
    use tokio_stream::wrappers::ReceiverStream;
    const SERVER: f64 = 4_194_304.0;
    const STREAMS: usize = 36;
    const CONNECTIONS: usize = 3;
    const ROUNDS: usize = 56;
    let mut entries = String::new();
    for name in greedy.iter().chain(&["b"]) {
        let prefix = if *name == "b" { "b/*" } else { "a/*" };
        entries.push_str(&format!(
            "\n[[auth.token]]\nname = \"{name}\"\nrole = \"caller\"\nprefixes = [\"{prefix}\"]\nsha256 = \"{}\"\n",
            fusebox::auth::hash_hex(&token_of(name))
        ));
    }
    // The greedy streams are never ended while the test runs: B is
    // answered because room is left for it, not because A's streams went.
    let config = format!(
        "[server]\nmax_unread_bytes = 4194304\nmax_unread_bytes_per_stream = 262144\nstuck_stream_timeout = \"10m\"\n[auth]\n{entries}"
    );
    let server = Server::start(Options {
        config: Some(&config),
        args: args.to_vec(),
        ..Options::default()
    })
    .await;
    let checks = |key: &str| pb::DecideRequest {
        frames: (0..100)
            .map(|id| pb::DecideFrame {
                id,
                request: Some(pb::decide_frame::Request::Acquire(
                    crate::admin::status_check(&format!("{key}{}", id % 7)),
                )),
            })
            .collect(),
    };
    let mut never_read = Vec::new();
    let mut feeders = Vec::new();
    for c in 0..CONNECTIONS {
        // Small windows: the client takes little before answers wait on
        // the server.
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.addr))
            .expect("an address")
            .initial_stream_window_size(65_535)
            .initial_connection_window_size(65_535)
            .connect()
            .await
            .expect("connects");
        let client = pb::fusebox_client::FuseboxClient::new(channel);
        for s in 0..STREAMS / CONNECTIONS {
            let token = token_of(greedy[(c * STREAMS / CONNECTIONS + s) % greedy.len()]);
            let (tx, rx) = tokio::sync::mpsc::channel(2);
            let answers = client
                .clone()
                .decide(bearer(&token, ReceiverStream::new(rx)))
                .await
                .expect("the stream opens")
                .into_inner();
            let message = checks("a/k");
            feeders.push(tokio::spawn(async move {
                // Frames are sent for as long as the server reads them.
                while tx.send(message.clone()).await.is_ok() {}
            }));
            never_read.push(answers);
        }
    }
    // A holds all it may: its part, or where the server gives it none,
    // the whole budget (a message of about 17 KiB short of either).
    let a = greedy[0];
    crate::harness::eventually(
        "the greedy tenant's unread answers to fill all it may hold",
        Duration::from_secs(240),
        || async {
            let text = metrics_as(&server, &token_of(a)).await;
            let unread = metric(&text, "fusebox_unread_bytes");
            let part = series(&text, "fusebox_share_max_unread_bytes", a);
            let held = series(&text, "fusebox_share_unread_bytes", a);
            let full = match (part, held) {
                (Some(part), Some(held)) => held >= part - 65_536.0,
                _ => unread >= SERVER - 65_536.0,
            };
            full.then_some(())
        },
    )
    .await;
    // B reads every answer, each as it comes.
    let client = server.fusebox().await;
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let mut answers = client
        .clone()
        .decide(bearer(&token_of("b"), ReceiverStream::new(rx)))
        .await
        .expect("B's stream opens")
        .into_inner();
    let started = std::time::Instant::now();
    for round in 0..ROUNDS {
        tx.send(checks("b/k")).await.expect("B sends");
        match next_of(&mut answers, Duration::from_secs(10)).await {
            Some(Ok(Some(answer))) => assert_eq!(answer.results.len(), 100),
            other => panic!(
                "tenant B got {round} of {ROUNDS} answers in {:?}; then {other:?}",
                started.elapsed()
            ),
        }
    }
    // B's stream is not ended: once B closes its side, it ends OK.
    drop(tx);
    match next_of(&mut answers, Duration::from_secs(10)).await {
        Some(Ok(None)) => {}
        other => panic!("B's stream ends OK when B closes it, not {other:?}"),
    }
    // A's own figures are shown to A.
    let text = metrics_as(&server, &token_of(a)).await;
    let series = |name: &str, credential: &str| {
        series(&text, name, credential).unwrap_or_else(|| panic!("no {name} in /metrics:\n{text}"))
    };
    // The tenant's part is half the server's, held by its tokens together
    // (named after its first entry), and it was full.
    assert_eq!(series("fusebox_share_max_unread_bytes", a), SERVER / 2.0);
    assert!(
        series("fusebox_share_unread_bytes", a) <= SERVER / 2.0,
        "{text}"
    );
    assert!(
        series("fusebox_share_unread_waits_total", a) >= 1.0,
        "{text}"
    );
    assert!(metric(&text, "fusebox_unread_bytes") <= SERVER, "{text}");
    assert!(
        text.contains("fusebox_streams_stuck_total{stream=\"decide\"} 0"),
        "no stream was ended: {text}"
    );
    for feeder in feeders {
        feeder.abort();
    }
    drop(never_read);
}

//! Many teams on one fusebox, some of their clients broken or hostile
//! (issue 18): what a stranger can hold, and what a credential's holder
//! can take from the others. Each test probes as an attacker would,
//! against a real server over its real ports.

use std::time::Duration;

use tokio::net::TcpStream;

use crate::harness::{Options, Server};
use crate::http::get;

const TOKEN: &str = "tenant-a-token-0123456789";

/// A server with one caller token (`a/*`) and `extra` config lines.
async fn server_with(extra: &str) -> Server {
    let config = format!(
        "{extra}\n[auth]\n\n[[auth.token]]\nname = \"a\"\nrole = \"caller\"\nprefixes = [\"a/*\"]\nsha256 = \"{}\"\n",
        fusebox::auth::hash_hex(TOKEN)
    );
    Server::start(Options {
        config: Some(&config),
        ..Options::default()
    })
    .await
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

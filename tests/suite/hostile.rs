//! Hostile and broken clients: connections that never speak, floods of
//! idle sockets under a low open-file limit, bytes that are not UTF-8,
//! oversized messages, idle connections at shutdown, malformed HTTP, and
//! keys that would display as other keys. Each test runs a real server.

use std::process::Stdio;
use std::time::{Duration, Instant};

use fusebox::proto::v1 as pb;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tonic::transport::Channel;
use tonic::Code;

use crate::harness::{eventually, ms, Options, Server, BIN};
use crate::http::{get, post_json, request};

/// Safety net for conditions reached asynchronously.
const LIMIT: Duration = Duration::from_secs(20);

/// The value of an unlabelled series in a `/metrics` text.
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /metrics:\n{text}"))
}

async fn metrics(http: &str) -> String {
    let reply = get(http, "/metrics").await;
    assert_eq!(reply.status, 200, "{reply:?}");
    reply.body
}

/// `n` TCP connections to `addr` that never send a byte.
async fn silent(addr: &str, n: usize) -> Vec<TcpStream> {
    let mut sockets = Vec::with_capacity(n);
    for _ in 0..n {
        sockets.push(TcpStream::connect(addr).await.expect("connects"));
    }
    sockets
}

/// A GetKey on a new connection, with a deadline of its own.
async fn get_key(addr: &str, within: Duration) -> Result<pb::KeyState, tonic::Status> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("an address")
        .connect_timeout(within)
        .timeout(within)
        .connect()
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    pb::admin_client::AdminClient::new(channel)
        .get_key(pb::GetKeyRequest { key: "k".into() })
        .await
        .map(tonic::Response::into_inner)
}

// ---------------------------------------------------------------------------
// 1. A connection takes a slot only once its handshake is done.

/// 50 connections that never send the HTTP/2 preface hold none of the 50
/// slots of `max_connections = 50`: a real client is served at once.
#[tokio::test]
async fn connections_that_never_speak_hold_no_slot() {
    let server = Server::start(Options {
        config: Some("[server]\nmax_connections = 50\n"),
        ..Options::default()
    })
    .await;
    let _silent = silent(&server.addr, 50).await;
    let http = server.http_addr.clone().expect("an HTTP address");
    // Accepted after the 50 (the kernel queues connections in order).
    let state = get_key(&server.addr, Duration::from_secs(3))
        .await
        .expect("a real client is served while 50 silent connections are open");
    assert_eq!(state.key, "k");
    eventually(
        "the silent connections are in their handshake",
        LIMIT,
        || async { (metric(&metrics(&http).await, "fusebox_handshakes") == 50.0).then_some(()) },
    )
    .await;
    let text = metrics(&http).await;
    assert_eq!(metric(&text, "fusebox_connections_refused_total"), 0.0);
}

/// Connections in their handshake are closed after `handshake_timeout`
/// (counted), are themselves capped (`max_handshakes`, counted), and one
/// that does not speak HTTP/2 is closed at once (counted).
#[tokio::test]
async fn handshakes_time_out_and_are_capped() {
    let server = Server::start(Options {
        config: Some(
            "[server]\nmax_connections = 50\nmax_handshakes = 20\nhandshake_timeout = \"300ms\"\n",
        ),
        ..Options::default()
    })
    .await;
    let http = server.http_addr.clone().expect("an HTTP address");
    let mut sockets = silent(&server.addr, 30).await;
    let text = eventually("30 silent connections are seen", LIMIT, || async {
        let text = metrics(&http).await;
        let seen = metric(&text, "fusebox_handshakes")
            + metric(&text, "fusebox_handshakes_refused_total")
            + metric(&text, "fusebox_handshakes_timed_out_total");
        (seen >= 30.0).then_some(text)
    })
    .await;
    assert_eq!(metric(&text, "fusebox_max_handshakes"), 20.0);
    assert!(metric(&text, "fusebox_handshakes") <= 20.0, "{text}");
    assert!(
        metric(&text, "fusebox_handshakes_refused_total") >= 10.0,
        "{text}"
    );
    // Every silent connection is closed by the server: at once past the
    // cap, after the timeout otherwise.
    for socket in &mut sockets {
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(LIMIT, socket.read(&mut byte))
            .await
            .expect("the server closes a silent connection");
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    }
    let text = eventually("no handshake in progress", LIMIT, || async {
        let text = metrics(&http).await;
        (metric(&text, "fusebox_handshakes") == 0.0).then_some(text)
    })
    .await;
    assert!(
        metric(&text, "fusebox_handshakes_timed_out_total") >= 1.0,
        "{text}"
    );
    // Not HTTP/2: closed without waiting for the timeout.
    let mut http1 = TcpStream::connect(&server.addr).await.expect("connects");
    http1
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("sent");
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(LIMIT, http1.read_to_end(&mut rest))
        .await
        .expect("closed");
    eventually("the failed handshake is counted", LIMIT, || async {
        (metric(&metrics(&http).await, "fusebox_handshakes_failed_total") == 1.0).then_some(())
    })
    .await;
    // And real clients are served throughout.
    get_key(&server.addr, Duration::from_secs(3))
        .await
        .expect("served");
}

#[test]
fn handshake_settings_are_validated() {
    use fusebox::config::Config;
    for (text, field) in [
        (
            "[server]\nhandshake_timeout = \"0s\"\n",
            "handshake_timeout",
        ),
        (
            "[server]\nhandshake_timeout = \"2m\"\n",
            "handshake_timeout",
        ),
        ("[server]\nmax_handshakes = 0\n", "max_handshakes"),
        (
            "[server]\nmax_http_connections = 0\n",
            "max_http_connections",
        ),
        (
            "[server]\nhttp_write_timeout = \"50ms\"\n",
            "http_write_timeout",
        ),
        (
            "[server]\nhttp_write_timeout = \"11m\"\n",
            "http_write_timeout",
        ),
    ] {
        let e = Config::parse(text, "test").expect_err(text).to_string();
        assert!(e.contains(field), "{text}: {e}");
    }
    let limits = Config::parse("[server]\nhandshake_timeout = \"2s\"\n", "test")
        .expect("valid")
        .limits;
    // (Read through Debug, so that this file builds against any Limits.)
    assert!(
        format!("{limits:?}").contains("handshake_timeout: 2000"),
        "{limits:?}"
    );
    let limits = Config::parse("[server]\nhttp_write_timeout = \"3s\"\n", "test")
        .expect("valid")
        .limits;
    assert_eq!(limits.http_write_timeout, 3000);
    assert_eq!(
        Config::parse("", "test")
            .expect("valid")
            .limits
            .http_write_timeout,
        10_000,
        "the default"
    );
}

// ---------------------------------------------------------------------------
// 2. The HTTP port is capped and cannot starve the gRPC port.

/// A server run as `sh -c 'ulimit -n 600; exec fusebox serve ...'`: its
/// gRPC and HTTP addresses, and the process.
async fn start_limited(open_files: u32) -> (tokio::process::Child, String, String) {
    let mut child = crate::process::spawn(
        tokio::process::Command::new("sh")
            .arg("-c")
            .arg(format!("ulimit -n {open_files} && exec \"$0\" \"$@\""))
            .arg(BIN)
            .args(["serve", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0"])
            .stderr(Stdio::null()),
        "sh starts",
    );
    let (grpc, http) = crate::process::addresses(&mut child, LIMIT).await;
    (child, grpc, http.expect("HTTP"))
}

/// Under `ulimit -n 600`, 620 idle sockets on the HTTP port leave the
/// gRPC port working; the refusals show in /metrics.
#[tokio::test]
async fn idle_http_sockets_cannot_starve_grpc() {
    // This process holds 620 sockets too.
    rlimit::increase_nofile_limit(u64::MAX).expect("the open-file limit");
    let (_child, grpc, http) = start_limited(600).await;
    let mut sockets = Vec::new();
    for _ in 0..620 {
        match tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(&http)).await {
            Ok(Ok(s)) => sockets.push(s),
            // The backlog is full: the flood is as big as it gets.
            _ => break,
        }
    }
    assert!(sockets.len() >= 600, "{} sockets", sockets.len());
    let started = Instant::now();
    let mut client = pb::fusebox_client::FuseboxClient::new(
        tonic::transport::Endpoint::from_shared(format!("http://{grpc}"))
            .expect("an address")
            .timeout(Duration::from_secs(3))
            .connect()
            .await
            .expect("the gRPC port accepts"),
    );
    let reply = client
        .acquire(pb::AcquireRequest {
            key: "k".into(),
            ..Default::default()
        })
        .await
        .expect("Acquire answers while the HTTP port is flooded");
    assert_eq!(reply.get_ref().decision, pb::Decision::Granted as i32);
    assert!(started.elapsed() < Duration::from_secs(3));
    drop(sockets);
    let text = eventually("/metrics answers again", LIMIT, || async {
        let mut stream = TcpStream::connect(&http).await.ok()?;
        let head = format!("GET /metrics HTTP/1.1\r\nHost: {http}\r\nConnection: close\r\n\r\n");
        stream.write_all(head.as_bytes()).await.ok()?;
        let mut raw = Vec::new();
        tokio::time::timeout(LIMIT, stream.read_to_end(&mut raw))
            .await
            .ok()?
            .ok()?;
        let text = String::from_utf8(raw).ok()?;
        text.starts_with("HTTP/1.1 200").then_some(text)
    })
    .await;
    // Past the cap, each new socket closed the oldest idle one (none of
    // the flood ever sent a request) or, with none idle, was refused.
    assert!(
        metric(&text, "fusebox_http_connections_refused_total")
            + metric(&text, "fusebox_http_idle_closed_total")
            >= 1.0,
        "{text}"
    );
    let cap = metric(&text, "fusebox_max_http_connections");
    assert!((1.0..600.0).contains(&cap), "lowered to fit: {cap}");
}

/// The sockets the process `pid` holds open (Linux: its `/proc/<pid>/fd`).
#[cfg(target_os = "linux")]
fn sockets_of(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("the server's descriptors")
        .filter_map(Result::ok)
        .filter(|e| {
            std::fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy().starts_with("socket:"))
        })
        .count()
}

/// Connections waiting to be accepted on the listener of `port` (Linux:
/// the receive queue of a LISTEN socket in `/proc/net/tcp` is its accept
/// queue).
#[cfg(target_os = "linux")]
fn accept_queue(port: u16) -> u64 {
    let tcp = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp");
    let local = format!(":{port:04X}");
    tcp.lines()
        .skip(1)
        .filter_map(|l| {
            let fields: Vec<&str> = l.split_whitespace().collect();
            let listening = fields.get(1)?.ends_with(&local) && *fields.get(3)? == "0A";
            let queue = fields.get(4)?.split(':').nth(1)?;
            listening.then(|| u64::from_str_radix(queue, 16).ok())?
        })
        .sum()
}

/// `GET path` on a new connection, as a well-behaved client: `None`
/// unless a whole 200 answer comes within a second.
async fn served(http: &str, path: &str) -> Option<String> {
    let mut stream = TcpStream::connect(http).await.ok()?;
    let head = format!("GET {path} HTTP/1.1\r\nHost: {http}\r\nConnection: close\r\n\r\n");
    stream.write_all(head.as_bytes()).await.ok()?;
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(1), stream.read_to_end(&mut raw))
        .await
        .ok()?
        .ok()?;
    let text = String::from_utf8(raw).ok()?;
    text.starts_with("HTTP/1.1 200").then_some(text)
}

/// 80 tokenless connections that pipeline `GET /app.js` and never read
/// their answers hold no more than `max_http_connections = 32` sockets of
/// the server (counted in its `/proc/<pid>/fd`): a connection whose answer
/// is not written out is busy, so the ones past the cap are refused at
/// once, and the stalled ones are closed after `http_write_timeout`; then a
/// well-behaved client is served.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn http_clients_that_never_read_hold_no_more_than_the_cap() {
    const CAP: usize = 32;
    const FLOOD: usize = 80;
    // Answers enough to fill both sockets' buffers many times over.
    const PIPELINED: usize = 400;
    let server = Server::start(Options {
        config: Some("[server]\nmax_http_connections = 32\nhttp_write_timeout = \"2s\"\n"),
        ..Options::default()
    })
    .await;
    let http = server.http_addr.clone().expect("HTTP");
    let port: u16 = http
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("a port");
    let pid = server.child.id().expect("the server runs");
    let before = sockets_of(pid);
    let requests = format!("GET /app.js HTTP/1.1\r\nHost: {http}\r\n\r\n").repeat(PIPELINED);
    let most = std::sync::atomic::AtomicUsize::new(0);
    let seen = || {
        let now = sockets_of(pid).saturating_sub(before);
        most.fetch_max(now, std::sync::atomic::Ordering::Relaxed);
    };
    let mut flood = Vec::with_capacity(FLOOD);
    for _ in 0..FLOOD {
        // A small receive buffer: what the server sends stays unread in
        // its own buffers rather than in this process's.
        let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
        socket.set_recv_buffer_size(4096).expect("SO_RCVBUF");
        let mut socket = socket
            .connect(http.parse().expect("an address"))
            .await
            .expect("connects");
        // A refused connection is closed already: its write may fail.
        let _ = socket.write_all(requests.as_bytes()).await;
        flood.push(socket);
        seen();
    }
    // Once every connection of the flood is accepted, a well-behaved
    // client is served (when the stalled ones have been closed).
    let text = eventually("a well-behaved client is served", LIMIT, || async {
        seen();
        if accept_queue(port) > 0 {
            return None;
        }
        let text = served(&http, "/metrics").await;
        seen();
        text
    })
    .await;
    let most = most.load(std::sync::atomic::Ordering::Relaxed);
    // The scrape's own connection, and one refused as it is closed.
    assert!(
        most <= CAP + 2,
        "the server held {most} sockets of {FLOOD} that never read (cap {CAP})"
    );
    assert!(
        metric(&text, "fusebox_http_connections") <= (CAP + 1) as f64,
        "{text}"
    );
    // Each one past the cap was refused, or closed an idle one (between
    // two answers) for its room.
    assert!(
        metric(&text, "fusebox_http_connections_refused_total")
            + metric(&text, "fusebox_http_idle_closed_total")
            >= (FLOOD - CAP) as f64,
        "{text}"
    );
    // The stalled ones are closed, their sockets freed.
    let text = eventually("the stalled connections are closed", LIMIT, || async {
        let text = served(&http, "/metrics").await?;
        let stalled = metric(&text, "fusebox_http_connections") > 1.0
            || sockets_of(pid).saturating_sub(before) > 1;
        (!stalled).then_some(text)
    })
    .await;
    assert!(
        metric(&text, "fusebox_http_write_timed_out_total") >= 1.0,
        "{text}"
    );
    // Served again and again, not once by luck.
    for _ in 0..3 {
        assert!(served(&http, "/app.js").await.is_some());
    }
    drop(flood);
}

// ---------------------------------------------------------------------------
// 3. Bytes that are not UTF-8 are the sender's fault.

/// `AcquireRequest` with `key` as raw bytes (the same field number).
#[derive(Clone, PartialEq, prost::Message)]
struct RawKeyRequest {
    #[prost(bytes = "vec", tag = "1")]
    key: Vec<u8>,
}

/// A unary call with a raw request to `path`.
async fn raw_call(
    channel: Channel,
    path: &'static str,
    message: RawKeyRequest,
) -> Result<pb::AcquireResponse, tonic::Status> {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready()
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let codec = tonic_prost::ProstCodec::<RawKeyRequest, pb::AcquireResponse>::default();
    grpc.unary(
        tonic::Request::new(message),
        http::uri::PathAndQuery::from_static(path),
        codec,
    )
    .await
    .map(tonic::Response::into_inner)
}

#[tokio::test]
async fn invalid_utf8_in_a_key_is_invalid_argument_naming_the_field() {
    let server = Server::start(Options::default()).await;
    let channel = server.channel().await;
    for bytes in [
        &[0xff][..],
        &[b'a', 0xc3],
        &[0xed, 0xa0, 0x80],
        &[b'k', 0xfe, b'x'],
    ] {
        for path in ["/fusebox.v1.Fusebox/Acquire", "/fusebox.v1.Admin/GetKey"] {
            let status = raw_call(
                channel.clone(),
                path,
                RawKeyRequest {
                    key: bytes.to_vec(),
                },
            )
            .await
            .expect_err("refused");
            assert_eq!(status.code(), Code::InvalidArgument, "{path}: {status:?}");
            assert!(
                status.message().starts_with("key: is not valid UTF-8"),
                "{path}: {status:?}"
            );
        }
    }
    // Valid UTF-8 through the same raw path is served.
    let reply = raw_call(
        channel,
        "/fusebox.v1.Fusebox/Acquire",
        RawKeyRequest {
            key: "ünï".as_bytes().to_vec(),
        },
    )
    .await
    .expect("served");
    assert_eq!(reply.decision, pb::Decision::Granted as i32);
}

// ---------------------------------------------------------------------------
// 4. Oversized messages: RESOURCE_EXHAUSTED with the limit.

#[tokio::test]
async fn oversized_requests_are_resource_exhausted_and_say_the_limit() {
    let server = Server::start(Options::default()).await;
    let mut client = server.fusebox().await;
    for size in [70_000, 16 * 1024 * 1024] {
        let started = Instant::now();
        let request = pb::AcquireRequest {
            key: "x".repeat(size),
            ..Default::default()
        };
        let encoded = prost::Message::encoded_len(&request);
        let status = client.acquire(request).await.expect_err("refused");
        assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
        assert!(
            status
                .message()
                .contains("the limit is 65536 bytes (64 KiB)"),
            "{status:?}"
        );
        assert!(
            status
                .message()
                .contains(&format!("the request is {encoded} bytes")),
            "{status:?}"
        );
        assert!(started.elapsed() < LIMIT);
    }
    // The connection still serves.
    client
        .acquire(pb::AcquireRequest {
            key: "x".into(),
            ..Default::default()
        })
        .await
        .expect("served");
}

// ---------------------------------------------------------------------------
// 5. Shutdown does not wait for idle connections.

#[tokio::test]
async fn sigterm_with_idle_connections_exits_at_once() {
    let mut server = Server::start(Options::default()).await;
    let mut idle = Vec::new();
    for _ in 0..5 {
        let mut admin = server.admin().await;
        admin
            .get_key(pb::GetKeyRequest { key: "k".into() })
            .await
            .expect("served");
        idle.push(admin);
    }
    // And connections that never finished their handshake: silent ones,
    // and one that sent the HTTP/2 preface and nothing more.
    let _silent = silent(&server.addr, 3).await;
    let mut preface = TcpStream::connect(&server.addr).await.expect("connects");
    preface
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .expect("sent");
    let started = Instant::now();
    server.terminate();
    exits_at_once(&mut server, started).await;
    drop(idle);
}

/// Waits for `server`, sent SIGTERM at `started`, to exit: with success,
/// within 2 s, and without warning of calls still open.
async fn exits_at_once(server: &mut Server, started: Instant) {
    let status = tokio::time::timeout(LIMIT, server.child.wait())
        .await
        .expect("exits")
        .expect("wait works");
    let took = started.elapsed();
    let logs = server.all_logs().await;
    assert!(status.success(), "{status:?}\n{logs}");
    assert!(took < Duration::from_secs(2), "took {took:?}\n{logs}");
    assert!(!logs.contains("still open"), "{logs}");
}

#[tokio::test]
async fn sigterm_answers_a_waiter_unavailable_and_exits_at_once() {
    let mut server = Server::start(Options {
        config: Some(
            "[[rule]]\nmatch = \"q\"\nlimiter = { kind = \"concurrency\", permits = 1, queue_limit = 5 }\n",
        ),
        ..Options::default()
    })
    .await;
    let mut c = server.fusebox().await;
    let held = c
        .acquire(pb::AcquireRequest {
            key: "q".into(),
            ..Default::default()
        })
        .await
        .expect("granted")
        .into_inner();
    assert_eq!(held.decision, pb::Decision::Granted as i32);
    let mut waiting = server.fusebox().await;
    let waiter = tokio::spawn(async move {
        waiting
            .acquire(pb::AcquireRequest {
                key: "q".into(),
                max_wait: Some(ms(60_000)),
                ..Default::default()
            })
            .await
    });
    eventually("a waiter on q", LIMIT, || async {
        (server.get("q").await.waiters == 1).then_some(())
    })
    .await;
    let started = Instant::now();
    server.terminate();
    let answer = tokio::time::timeout(LIMIT, waiter)
        .await
        .expect("the waiter is answered")
        .expect("the task ran")
        .expect_err("UNAVAILABLE");
    assert_eq!(answer.code(), Code::Unavailable, "{answer:?}");
    exits_at_once(&mut server, started).await;
}

// ---------------------------------------------------------------------------
// 6. HTTP errors are JSON.

/// An HTTP/1.1 answer with a `Content-Length`, read without waiting for
/// the connection to close.
async fn answer_of(stream: &mut (impl AsyncReadExt + Unpin)) -> String {
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = stream.read(&mut buf).await.expect("read");
        raw.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&raw).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|l| {
                    let (name, value) = l.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse::<usize>().ok())?
                })
                .unwrap_or(0);
            if body.len() >= length {
                return text;
            }
        }
        assert!(n > 0, "closed early: {text}");
    }
}

#[tokio::test]
async fn http_errors_for_bad_paths_and_large_bodies_are_json() {
    let server = Server::start(Options::default()).await;
    let http = server.http_addr.clone().expect("an HTTP address");
    let reply = post_json(&http, "/api/keys/%FF%FE/isolate", r#"{"reason":"x"}"#).await;
    assert_eq!(reply.status, 400, "{reply:?}");
    assert_eq!(reply.json()["error"]["field"], "key", "{reply:?}");
    // A body larger than the limit, announced: refused before it is read.
    let stream = TcpStream::connect(&http).await.expect("connects");
    let (mut reader, mut writer) = stream.into_split();
    let head = format!(
        "POST /api/keys/k/isolate HTTP/1.1\r\nHost: {http}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: 3000000\r\n\r\n"
    );
    // The body is sent alongside; the server may answer and close before
    // it has all been written.
    let sender = tokio::spawn(async move {
        let _ = writer.write_all(head.as_bytes()).await;
        let _ = writer.write_all(&vec![b' '; 3_000_000]).await;
        writer
    });
    let raw = tokio::time::timeout(LIMIT, answer_of(&mut reader))
        .await
        .expect("answered");
    sender.abort();
    assert!(raw.starts_with("HTTP/1.1 413"), "{raw}");
    let (_, body) = raw.split_once("\r\n\r\n").expect("a body");
    let json: serde_json::Value = serde_json::from_str(body).expect("JSON");
    assert_eq!(json["error"]["field"], "body", "{raw}");
    assert!(
        json["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("65536")),
        "{raw}"
    );
    // A body of the right size is still read.
    let reply = request(
        &http,
        "POST",
        "/api/keys/k/isolate",
        &[("Content-Type", "application/json")],
        br#"{"reason":"maintenance"}"#,
    )
    .await;
    assert_eq!(reply.status, 200, "{reply:?}");
}

// ---------------------------------------------------------------------------
// 7. Bidirectional formatting characters are control characters (K1).

const BIDI: [char; 12] = [
    '\u{061C}', '\u{200E}', '\u{200F}', '\u{202A}', '\u{202B}', '\u{202C}', '\u{202D}', '\u{202E}',
    '\u{2066}', '\u{2067}', '\u{2068}', '\u{2069}',
];

fn percent(text: &str) -> String {
    text.bytes().map(|b| format!("%{b:02X}")).collect()
}

#[tokio::test]
async fn bidi_overrides_in_keys_and_prefixes_are_refused() {
    let server = Server::start(Options::default()).await;
    let http = server.http_addr.clone().expect("an HTTP address");
    let mut c = server.fusebox().await;
    let mut admin = server.admin().await;
    for (i, bidi) in BIDI.iter().enumerate() {
        let key = format!("pay{bidi}ments{i}");
        let code = format!("U+{:04X}", u32::from(*bidi));
        let acquired = c
            .acquire(pb::AcquireRequest {
                key: key.clone(),
                ..Default::default()
            })
            .await;
        let status = crate::admin::assert_invalid(acquired, "key");
        assert!(status.message().contains(&code), "{status:?}");
        let listed = admin
            .list_keys(pb::ListKeysRequest {
                prefix: key.clone(),
                ..Default::default()
            })
            .await;
        crate::admin::assert_invalid(listed, "prefix");

        let reply = get(&http, &format!("/api/keys?prefix={}", percent(&key))).await;
        assert_eq!(reply.status, 400, "{reply:?}");
        assert_eq!(reply.json()["error"]["field"], "prefix", "{reply:?}");
        let reply = post_json(
            &http,
            &format!("/api/keys/{}/isolate", percent(&key)),
            r#"{"reason":"x"}"#,
        )
        .await;
        assert_eq!(reply.status, 400, "{reply:?}");
        assert_eq!(reply.json()["error"]["field"], "key", "{reply:?}");
    }
    // No such key was made.
    let listed = admin
        .list_keys(pb::ListKeysRequest::default())
        .await
        .expect("listed")
        .into_inner();
    assert!(listed.keys.is_empty(), "{listed:?}");
}

/// A log reader that goes away (`fusebox serve 2>&1 | head`) neither brings
/// the server down nor keeps it from stopping on SIGTERM.
#[tokio::test]
async fn a_closed_log_pipe_neither_stops_the_server_nor_keeps_it_running() {
    let mut child = crate::process::spawn(
        tokio::process::Command::new(BIN)
            .args(["serve", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0"])
            .stderr(Stdio::piped()),
        "fusebox starts",
    );
    let mut out = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let first = tokio::time::timeout(Duration::from_secs(30), out.next_line())
        .await
        .expect("the address within 30 s")
        .expect("stdout readable")
        .expect("a first line");
    let addr = first
        .strip_prefix("listening on ")
        .expect("the address")
        .to_owned();
    // The readers go away: every later log line and output write fails.
    drop(out);
    drop(child.stderr.take());
    let mut client = pb::fusebox_client::FuseboxClient::connect(format!("http://{addr}"))
        .await
        .expect("connects");
    for _ in 0..3 {
        client
            .acquire(crate::admin::status_check("pipe/k"))
            .await
            .expect("still serving with nobody reading its logs");
    }
    let pid = child.id().expect("running");
    assert!(crate::harness::signal(pid, "TERM"), "kill -TERM {pid}");
    let exited = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("it stops within 10 s of SIGTERM")
        .expect("an exit status");
    assert_eq!(exited.code(), Some(0), "{exited:?}");
}

/// The resident memory of a process, in bytes (Linux: `VmRSS`).
fn rss_of(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .expect("VmRSS")
}

/// A small pod (decisions 141): with `memory_limit = "96Mi"` the default
/// caps are lowered to fit, and a caller filling all it may hold with
/// keys of 256-byte names, each with a live ticket, is refused
/// (RESOURCE_EXHAUSTED) before the server's resident memory passes the
/// limit. With the defaults (a million keys and tickets) the same caller
/// would have taken the process past it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_filling_the_caps_with_long_keys_stays_under_the_memory_limit() {
    let limit: u64 = 96 << 20;
    let server = Server::start(Options {
        config: Some("[server]\nmemory_limit = \"96Mi\"\n"),
        ..Options::default()
    })
    .await;
    let mut client = server.fusebox().await;
    let pid = server.child.id().expect("the server's pid");
    let name = |n: u64| format!("{n:08}/{}", "k".repeat(247));
    let (mut granted, mut refused) = (0u64, None);
    // Batches of 200 (a request is at most 64 KiB).
    'fill: for batch in 0..500u64 {
        let items = (0..200)
            .map(|i| pb::AcquireRequest {
                key: name(batch * 200 + i),
                lease: Some(ms(600_000)),
                ..Default::default()
            })
            .collect();
        let results = client
            .acquire_batch(pb::AcquireBatchRequest { items })
            .await
            .expect("AcquireBatch answers")
            .into_inner()
            .results;
        for r in results {
            match r.result {
                Some(pb::acquire_result::Result::Response(_)) => granted += 1,
                Some(pb::acquire_result::Result::Error(e)) => {
                    refused = Some(e);
                    break 'fill;
                }
                None => panic!("an empty result"),
            }
        }
    }
    let refused = refused.expect("the caps stop the caller");
    assert_eq!(
        tonic::Code::from(refused.code),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );
    let rss = rss_of(pid);
    eprintln!(
        "granted {granted}, resident {} MiB, then {refused:?}",
        rss >> 20
    );
    assert!(
        rss < limit,
        "{granted} keys and tickets of 256-byte names took the server to {} MiB, past its limit of {} MiB",
        rss >> 20,
        limit >> 20
    );
    assert!(
        granted >= 1000,
        "the lowered caps still hold keys: {granted}"
    );
}

//! The store gone and a server stalled (contract extensions F1-F7):
//! with Redis refusing connections, calls answer UNAVAILABLE at once (the
//! breaker on the link) and go through again once Redis is back; a call
//! whose deadline passed while it waited for the store is not decided and
//! charges nothing. Real redis-servers with the module, real fusebox
//! servers, every call over gRPC.

use std::time::{Duration, Instant};

use fusebox::proto::envoy::extensions::common::ratelimit::v3::{
    rate_limit_descriptor::Entry, RateLimitDescriptor,
};
use fusebox::proto::envoy::service::ratelimit::v3::{
    rate_limit_service_client::RateLimitServiceClient, RateLimitRequest, RateLimitResponse,
};
use fusebox::proto::v1 as pb;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

use crate::harness::{eventually, servers_on, Server};

/// A concurrency limit (a ticket shows as a live one) and an RLS domain
/// (a charge shows in limit_remaining).
const CONFIG: &str = r#"
[default]
limiter = { kind = "concurrency", permits = 10 }

[[rls.domain]]
name = "edge"

[[rls.domain.descriptor]]
key = "path"
rate_limit = { unit = "hour", requests_per_unit = 100 }
"#;

/// How many calls the acceptance measures.
const CALLS: usize = 20;

fn acquire(key: &str) -> pb::AcquireRequest {
    pb::AcquireRequest {
        key: key.into(),
        ..Default::default()
    }
}

fn rls_request(path: &str) -> RateLimitRequest {
    RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "path".into(),
                value: path.into(),
            }],
            limit: None,
            hits_addend: None,
        }],
        hits_addend: 0,
    }
}

/// An Acquire of `key` as one raw gRPC call carrying `grpc-timeout:
/// {timeout}` that the client does not enforce (tonic's client gives up at
/// the deadline itself): what the server answers, as `(grpc-status,
/// grpc-message)`.
async fn acquire_leaving_the_deadline_to_the_server(
    addr: &str,
    key: &str,
    timeout: &str,
) -> (String, String) {
    use prost::Message;
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (client, connection) = h2::client::handshake(tcp)
        .await
        .expect("an HTTP/2 handshake");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let mut client = client.ready().await.expect("the connection is open");
    let message = acquire(key).encode_to_vec();
    let mut framed = vec![0u8];
    framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
    framed.extend_from_slice(&message);
    let request = http::Request::post("http://fusebox/fusebox.v1.Fusebox/Acquire")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("grpc-timeout", timeout)
        .body(())
        .expect("a request");
    let (response, mut body) = client
        .send_request(request, false)
        .expect("a stream on the open connection");
    body.send_data(bytes::Bytes::from(framed), true)
        .expect("the request's body");
    let response = tokio::time::timeout(Duration::from_secs(10), response)
        .await
        .expect("an answer")
        .expect("a response");
    let mut headers = response.headers().clone();
    let mut answer = response.into_body();
    while let Some(chunk) = answer.data().await {
        chunk.expect("the answer's body");
    }
    if let Some(trailers) = answer.trailers().await.expect("trailers") {
        headers.extend(trailers);
    }
    let field = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    (field("grpc-status"), field("grpc-message"))
}

/// The value of the unlabelled sample `name` on the server's `/metrics`.
async fn metric(server: &Server, name: &str) -> f64 {
    let text = crate::http::metrics_text(server).await;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .map(|v| v.trim().parse().expect("a number"))
        .unwrap_or_else(|| panic!("{name} is not on /metrics"))
}

/// The median of `times`.
fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

/// Times `n` calls of `call`; each must fail with UNAVAILABLE.
async fn unavailable_times<F, Fut>(what: &str, n: usize, mut call: F) -> (Vec<Duration>, String)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), tonic::Status>>,
{
    let mut times = Vec::with_capacity(n);
    let mut last = String::new();
    for i in 0..n {
        let started = Instant::now();
        let answer = call().await;
        times.push(started.elapsed());
        match answer {
            Err(status) if status.code() == Code::Unavailable => {
                last = status.message().to_owned();
            }
            other => panic!("{what} {i} with Redis down answered {other:?}, not UNAVAILABLE"),
        }
    }
    (times, last)
}

/// F4-F7, the acceptance: with Redis killed (connections refused), 20
/// Acquires answer UNAVAILABLE with a median under 50 ms, saying what is
/// wrong; a Decide frame and an RLS check too; `/metrics` shows the link
/// down and the calls failed fast; the break is logged once. Once a
/// redis-server is started again on the same port, Acquires succeed again
/// within a bounded poll, and the recovery is logged once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_refusing_connections_calls_fail_fast_and_recover() {
    let Some(mut redis) =
        crate::harness::standalone("with_redis_refusing_connections_calls_fail_fast_and_recover")
            .await
    else {
        return;
    };
    let store = format!("redis://127.0.0.1:{}", redis.server.port);
    let server = servers_on(&store, CONFIG, false, 1).await.remove(0);
    let mut fusebox = server.fusebox().await;
    let mut rls = RateLimitServiceClient::new(server.channel().await);
    let up = fusebox
        .acquire(acquire("down/a"))
        .await
        .expect("Acquire with Redis up");
    assert_eq!(up.get_ref().decision, pb::Decision::Granted as i32);
    assert_eq!(metric(&server, "fusebox_store_link_up").await, 1.0);

    tokio::task::block_in_place(|| redis.server.kill());
    let (times, said) = unavailable_times("Acquire", CALLS, || {
        let mut fusebox = fusebox.clone();
        async move { fusebox.acquire(acquire("down/a")).await.map(drop) }
    })
    .await;
    let middle = median(times.clone());
    eprintln!("{CALLS} Acquires with Redis down: median {middle:?}, each {times:?}");
    assert!(
        middle < Duration::from_millis(50),
        "the median Acquire with Redis down took {middle:?} (each: {times:?})"
    );
    for words in [
        store.as_str(),
        "unreachable since",
        "retrying in the background",
    ] {
        assert!(said.contains(words), "{said:?} does not say {words:?}");
    }

    // A Decide frame and an RLS check fail as fast.
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let mut answers = fusebox
        .clone()
        .decide(ReceiverStream::new(rx))
        .await
        .expect("a Decide stream opens")
        .into_inner();
    let mut frame_times = Vec::new();
    for id in 1..=5 {
        let frame = pb::DecideFrame {
            id,
            request: Some(pb::decide_frame::Request::Acquire(acquire("down/a"))),
        };
        let started = Instant::now();
        tx.send(pb::DecideRequest {
            frames: vec![frame],
        })
        .await
        .expect("the stream takes frames");
        let result = answers
            .message()
            .await
            .expect("the stream answers")
            .expect("an answer")
            .results
            .remove(0);
        frame_times.push(started.elapsed());
        match result.result {
            Some(pb::decide_result::Result::Error(e)) if e.code == Code::Unavailable as i32 => {}
            other => panic!("a Decide frame with Redis down answered {other:?}"),
        }
    }
    let (rls_times, _) = unavailable_times("ShouldRateLimit", 5, || {
        let mut rls = rls.clone();
        async move { rls.should_rate_limit(rls_request("/down")).await.map(drop) }
    })
    .await;
    eprintln!("Decide frames {frame_times:?}, RLS checks {rls_times:?}");
    for (what, times) in [("Decide frame", frame_times), ("RLS check", rls_times)] {
        let middle = median(times.clone());
        assert!(
            middle < Duration::from_millis(50),
            "the median {what} with Redis down took {middle:?} (each: {times:?})"
        );
    }
    assert_eq!(metric(&server, "fusebox_store_link_up").await, 0.0);
    let fast = metric(&server, "fusebox_store_fast_failed_total").await;
    assert!(fast >= 20.0, "{fast} calls failed fast");

    // Redis back on the same port: calls go through again.
    tokio::task::block_in_place(|| redis.server.restart(Duration::from_secs(10)));
    let back = Instant::now();
    eventually(
        "an Acquire granted again once Redis is back",
        Duration::from_secs(10),
        || {
            let mut fusebox = fusebox.clone();
            async move {
                let reply = fusebox.acquire(acquire("down/b")).await.ok()?;
                (reply.get_ref().decision == pb::Decision::Granted as i32).then_some(())
            }
        },
    )
    .await;
    eprintln!(
        "granted again {:?} after Redis answered PING",
        back.elapsed()
    );
    let answer: RateLimitResponse = rls
        .should_rate_limit(rls_request("/back"))
        .await
        .expect("an RLS check once Redis is back")
        .into_inner();
    assert_eq!(answer.statuses[0].limit_remaining, 99);
    assert_eq!(metric(&server, "fusebox_store_link_up").await, 1.0);
    assert_eq!(
        metric(&server, "fusebox_store_link_breaks_total").await,
        1.0
    );

    let logs = server.logs();
    assert_eq!(
        logs.matches("is unreachable (").count(),
        1,
        "the break is logged once:\n{logs}"
    );
    assert_eq!(
        logs.matches("answers again after").count(),
        1,
        "the recovery is logged once:\n{logs}"
    );
}

/// F1, F2: with Redis holding writes (`CLIENT PAUSE ... WRITE`), an Acquire
/// and an RLS check whose deadlines (`grpc-timeout`, 100 ms) pass while
/// they wait behind a command already out charge nothing once Redis takes
/// writes again: no ticket, no hit. The Acquire's client leaves the
/// deadline to the server (the header alone), which answers
/// DEADLINE_EXCEEDED; the check's client gives up itself at its deadline
/// (tonic's `set_timeout`, as Envoy does), and its call is withdrawn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_whose_deadline_passed_waiting_for_the_store_charges_nothing() {
    let Some(redis) = crate::harness::standalone(
        "a_call_whose_deadline_passed_waiting_for_the_store_charges_nothing",
    )
    .await
    else {
        return;
    };
    let store = format!("redis://127.0.0.1:{}", redis.server.port);
    let server = servers_on(&store, CONFIG, false, 1).await.remove(0);
    let fusebox = server.fusebox().await;
    let rls = RateLimitServiceClient::new(server.channel().await);
    // Both keys exist (and the policy is known to Redis) before the stall.
    fusebox
        .clone()
        .acquire(acquire("late/first"))
        .await
        .expect("Acquire");
    assert_eq!(
        rls.clone()
            .should_rate_limit(rls_request("/late"))
            .await
            .expect("an RLS check")
            .into_inner()
            .statuses[0]
            .limit_remaining,
        99
    );

    let mut control = redis.server.conn();
    assert!(control.cmd(&["CLIENT", "PAUSE", "5000", "WRITE"]).is_ok());
    // A first Acquire goes out to Redis, which holds it; what comes next
    // waits in fusebox for its answer.
    let first = tokio::spawn({
        let mut fusebox = fusebox.clone();
        async move { fusebox.acquire(acquire("late/first")).await }
    });
    eventually(
        "Redis holding the first Acquire",
        Duration::from_secs(5),
        || {
            let held = control
                .cmd(&["CLIENT", "LIST"])
                .text()
                .lines()
                .any(|l| l.contains(" flags=b ") && l.contains(" cmd=fb.acquire "));
            async move { held.then_some(()) }
        },
    )
    .await;
    let mut late_check = tonic::Request::new(rls_request("/late"));
    late_check.set_timeout(Duration::from_millis(100));
    let asked = Instant::now();
    let second = tokio::spawn({
        let addr = server.addr.clone();
        async move { acquire_leaving_the_deadline_to_the_server(&addr, "late/second", "100m").await }
    });
    let third = tokio::spawn({
        let mut rls = rls.clone();
        async move { rls.should_rate_limit(late_check).await }
    });
    // The premise: the deadlines pass while Redis holds writes.
    tokio::time::sleep_until((asked + Duration::from_millis(200)).into()).await;
    assert!(control.cmd(&["CLIENT", "UNPAUSE"]).is_ok());

    let first = first.await.expect("the first call's task");
    let second = second.await.expect("the late Acquire's task");
    let third = third.await.expect("the late check's task");
    eprintln!("first {first:?}\nlate Acquire {second:?}\nlate check {third:?}");
    assert!(first.is_ok(), "the first Acquire: {first:?}");
    assert_eq!(
        second.0,
        (Code::DeadlineExceeded as i32).to_string(),
        "the late Acquire was answered {second:?}"
    );
    assert!(
        second.1.contains("nothing%20was%20charged"),
        "{second:?} does not say that nothing was charged"
    );
    assert!(
        matches!(
            third.as_ref().map_err(tonic::Status::code).err(),
            Some(Code::DeadlineExceeded | Code::Cancelled)
        ),
        "the late check: {third:?}"
    );
    // Nothing charged: no ticket on the late key, no hit on the path.
    let state = server.get("late/second").await;
    assert_eq!(
        state.live_tickets, 0,
        "the late Acquire took a permit: {state:?}"
    );
    let check = rls
        .clone()
        .should_rate_limit(rls_request("/late"))
        .await
        .expect("an RLS check after")
        .into_inner();
    assert_eq!(
        check.statuses[0].limit_remaining, 98,
        "the late check was charged: {check:?}"
    );
}

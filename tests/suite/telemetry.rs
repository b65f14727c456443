//! `[telemetry]`: spans reach a real OTLP/gRPC receiver (the official
//! proto's service, started here on port 0) with the caller's trace id and
//! parent span, for Acquire, Complete, Decide frames and Envoy's
//! ShouldRateLimit, embedded and with
//! `--store`; none without the section; a bad endpoint stops the start.

use std::collections::HashMap;
use std::time::Duration;

use fusebox::proto::envoy::extensions::common::ratelimit::v3::{
    rate_limit_descriptor::Entry, RateLimitDescriptor,
};
use fusebox::proto::envoy::service::ratelimit::v3 as rls;
use fusebox::proto::v1 as pb;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use tokio::sync::mpsc;
use tonic::{Request, Response, Status};

use crate::harness::{Options, Server};

/// The caller's trace, as its `traceparent` carries it.
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_ID: &str = "00f067aa0ba902b7";

/// A span as received, with its resource's `service.name`.
#[derive(Debug)]
struct Received {
    service: String,
    span: Span,
}

/// An OTLP/gRPC trace receiver: every span it is sent goes to a channel.
struct Receiver(mpsc::UnboundedSender<Received>);

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: Request<ExportTraceServiceRequest>,
    ) -> Result<Response<ExportTraceServiceResponse>, Status> {
        for resource in request.into_inner().resource_spans {
            let service = resource
                .resource
                .as_ref()
                .and_then(|r| text_of(&r.attributes, "service.name"))
                .unwrap_or_default();
            for scope in resource.scope_spans {
                for span in scope.spans {
                    let _ = self.0.send(Received {
                        service: service.clone(),
                        span,
                    });
                }
            }
        }
        Ok(Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

/// Starts a receiver on port 0: its endpoint and what it receives.
async fn receiver() -> (String, mpsc::UnboundedReceiver<Received>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let addr = listener.local_addr().expect("an address");
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(Receiver(tx)))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    (format!("http://{addr}"), rx)
}

fn value_of<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a Value> {
    attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref()?.value.as_ref())
}

fn text_of(attributes: &[KeyValue], key: &str) -> Option<String> {
    match value_of(attributes, key) {
        Some(Value::StringValue(s)) => Some(s.clone()),
        _ => None,
    }
}

/// A request carrying the caller's trace context.
fn traced<T>(message: T) -> Request<T> {
    let mut request = Request::new(message);
    request.metadata_mut().insert(
        "traceparent",
        format!("00-{TRACE_ID}-{PARENT_ID}-01")
            .parse()
            .expect("ASCII"),
    );
    request
        .metadata_mut()
        .insert("tracestate", "vendor=value".parse().expect("ASCII"));
    request
}

/// A config with `[telemetry]` sending to `endpoint`: one permit on `pay/*`.
fn config(endpoint: &str) -> String {
    format!(
        r#"
[telemetry]
otlp_endpoint = "{endpoint}"
service_name = "fusebox-under-test"

[[rule]]
match = "pay/*"
breaker = {{ mode = "consecutive", failures = 5, break = "30s" }}
limiter = {{ kind = "concurrency", permits = 1 }}

[[rls.domain]]
name = "edge"
[[rls.domain.descriptor]]
key = "user"
rate_limit = {{ unit = "hour", requests_per_unit = 1000, algorithm = "fixed_window" }}
"#
    )
}

/// Acquire (granted), a Decide frame's Acquire (denied: no permit left),
/// Complete and an Envoy rate-limit check (OK), each with the caller's
/// trace context, on `server`.
async fn calls(server: &Server) {
    let mut client = server.fusebox().await;
    let granted = client
        .acquire(traced(pb::AcquireRequest {
            key: "pay/a".into(),
            ..Default::default()
        }))
        .await
        .expect("Acquire answers")
        .into_inner();
    assert_eq!(granted.decision(), pb::Decision::Granted);
    let (tx, rx) = mpsc::channel(1);
    tx.send(pb::DecideRequest {
        frames: vec![pb::DecideFrame {
            id: 7,
            request: Some(pb::decide_frame::Request::Acquire(pb::AcquireRequest {
                key: "pay/a".into(),
                ..Default::default()
            })),
        }],
    })
    .await
    .expect("frame queued");
    let mut answers = client
        .decide(traced(tokio_stream::wrappers::ReceiverStream::new(rx)))
        .await
        .expect("Decide opens")
        .into_inner();
    let answer = tokio::time::timeout(Duration::from_secs(20), answers.message())
        .await
        .expect("an answer in time")
        .expect("a message")
        .expect("not the end");
    match &answer.results[0].result {
        Some(pb::decide_result::Result::Acquire(a)) => {
            assert_eq!(a.decision(), pb::Decision::Denied, "{a:?}")
        }
        other => panic!("{other:?}"),
    }
    drop(tx);
    let done = client
        .complete(traced(pb::CompleteRequest {
            ticket: granted.ticket,
            outcome: pb::Outcome::Success as i32,
            cost: None,
        }))
        .await
        .expect("Complete answers")
        .into_inner();
    assert!(!done.stale);
    let checked =
        rls::rate_limit_service_client::RateLimitServiceClient::new(server.channel().await)
            .should_rate_limit(traced(rls::RateLimitRequest {
                domain: "edge".into(),
                descriptors: vec![RateLimitDescriptor {
                    entries: vec![Entry {
                        key: "user".into(),
                        value: "ann".into(),
                    }],
                    ..Default::default()
                }],
                hits_addend: 0,
            }))
            .await
            .expect("ShouldRateLimit answers")
            .into_inner();
    assert_eq!(
        checked.overall_code(),
        rls::rate_limit_response::Code::Ok,
        "{checked:?}"
    );
}

/// The next `count` spans received, 30 s at most.
async fn spans(rx: &mut mpsc::UnboundedReceiver<Received>, count: usize) -> Vec<Received> {
    let mut spans = Vec::new();
    while spans.len() < count {
        let next = tokio::time::timeout(Duration::from_secs(30), rx.recv())
            .await
            .unwrap_or_else(|_| panic!("{} spans of {count} received: {spans:#?}", spans.len()))
            .expect("the receiver runs");
        spans.push(next);
    }
    spans
}

/// The spans of [`calls`] carry the caller's trace, the names and the
/// attributes.
fn check(all: &[Received]) {
    let trace_id = hex::decode(TRACE_ID).expect("hex");
    let parent_id = hex::decode(PARENT_ID).expect("hex");
    // Envoy's check: its own service, the caller's trace, the domain and
    // the overall code.
    let rls_name = "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
    let (rls_spans, spans): (Vec<&Received>, Vec<&Received>) =
        all.iter().partition(|r| r.span.name == rls_name);
    let [rls_span] = rls_spans[..] else {
        panic!("one {rls_name} span: {all:#?}");
    };
    let span = &rls_span.span;
    assert_eq!(span.trace_id, trace_id, "the caller's trace: {span:?}");
    assert_eq!(span.parent_span_id, parent_id, "{span:?}");
    assert_eq!(
        text_of(&span.attributes, "rpc.service").as_deref(),
        Some("envoy.service.ratelimit.v3.RateLimitService")
    );
    assert_eq!(
        text_of(&span.attributes, "rpc.method").as_deref(),
        Some("ShouldRateLimit")
    );
    assert_eq!(
        text_of(&span.attributes, "fusebox.rls.domain").as_deref(),
        Some("edge")
    );
    assert_eq!(
        text_of(&span.attributes, "fusebox.decision").as_deref(),
        Some("OK"),
        "{span:?}"
    );
    let by_name: HashMap<&str, &Received> =
        spans.iter().map(|r| (r.span.name.as_str(), *r)).collect();
    for received in &spans {
        let span = &received.span;
        assert_eq!(received.service, "fusebox-under-test", "{span:?}");
        assert_eq!(span.trace_id, trace_id, "the caller's trace: {span:?}");
        assert_eq!(
            span.parent_span_id, parent_id,
            "the caller's span: {span:?}"
        );
        assert_eq!(span.kind, 2, "a server span: {span:?}");
        assert_eq!(span.trace_state, "vendor=value", "{span:?}");
        assert_eq!(
            text_of(&span.attributes, "rpc.system").as_deref(),
            Some("grpc")
        );
        assert_eq!(
            text_of(&span.attributes, "rpc.service").as_deref(),
            Some("fusebox.v1.Fusebox")
        );
        assert_eq!(
            text_of(&span.attributes, "fusebox.key").as_deref(),
            Some("pay/a"),
            "{span:?}"
        );
        assert!(
            matches!(
                value_of(&span.attributes, "rpc.grpc.status_code"),
                Some(Value::IntValue(0))
            ),
            "{span:?}"
        );
    }
    let attr = |name: &str, key: &str| {
        let span = &by_name
            .get(name)
            .unwrap_or_else(|| panic!("no span {name}: {spans:#?}"))
            .span;
        text_of(&span.attributes, key)
    };
    let acquire = "fusebox.v1.Fusebox/Acquire";
    assert_eq!(attr(acquire, "rpc.method").as_deref(), Some("Acquire"));
    assert_eq!(
        attr(acquire, "fusebox.decision").as_deref(),
        Some("GRANTED")
    );
    assert_eq!(attr(acquire, "fusebox.reason"), None);
    assert_eq!(attr(acquire, "fusebox.phase").as_deref(), Some("CLOSED"));
    let frame = "fusebox.v1.Fusebox/Decide";
    assert_eq!(attr(frame, "rpc.method").as_deref(), Some("Decide"));
    assert_eq!(attr(frame, "fusebox.frame").as_deref(), Some("acquire"));
    assert_eq!(attr(frame, "fusebox.decision").as_deref(), Some("DENIED"));
    assert_eq!(attr(frame, "fusebox.reason").as_deref(), Some("NO_PERMITS"));
    assert_eq!(attr(frame, "fusebox.phase").as_deref(), Some("CLOSED"));
    assert!(matches!(
        value_of(&by_name[frame].span.attributes, "fusebox.frame_id"),
        Some(Value::IntValue(7))
    ));
    let complete = "fusebox.v1.Fusebox/Complete";
    assert_eq!(attr(complete, "rpc.method").as_deref(), Some("Complete"));
    assert_eq!(attr(complete, "fusebox.phase").as_deref(), Some("CLOSED"));
    assert!(matches!(
        value_of(&by_name[complete].span.attributes, "fusebox.stale"),
        Some(Value::BoolValue(false))
    ));
}

/// Runs [`calls`] on a server started with `args` and [`config`], stops it
/// (shutdown sends the spans not yet sent) and checks what arrived.
async fn traced_calls_arrive(args: Vec<&str>) {
    let (endpoint, mut rx) = receiver().await;
    let config = config(&endpoint);
    let mut server = Server::start(Options {
        config: Some(&config),
        args,
        ..Options::default()
    })
    .await;
    calls(&server).await;
    let metrics = crate::http::metrics_text(&server).await;
    assert!(
        metrics.contains("\nfusebox_trace_spans_failed_total 0\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("\nfusebox_trace_spans_exported_total "),
        "{metrics}"
    );
    server.terminate();
    let received = spans(&mut rx, 4).await;
    check(&received);
    let logs = server.all_logs().await;
    assert!(logs.contains("traces are sent over OTLP/gRPC"), "{logs}");
    assert!(!logs.contains("could not send"), "{logs}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_reach_an_otlp_receiver_with_the_callers_trace() {
    traced_calls_arrive(vec![]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_reach_an_otlp_receiver_with_a_store() {
    let Some(redis) = crate::harness::standalone("spans_reach_an_otlp_receiver_with_a_store").await
    else {
        return;
    };
    let store = format!("redis://127.0.0.1:{}", redis.server.port);
    traced_calls_arrive(vec!["--store", &store]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_section_no_span_is_sent() {
    let (endpoint, mut rx) = receiver().await;
    // The SDK's own variables are not a way in: only [telemetry] is.
    let mut server = Server::start(Options {
        config: Some(
            "[[rule]]\nmatch = \"pay/*\"\nlimiter = { kind = \"concurrency\", permits = 1 }\n",
        ),
        env: vec![
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.clone()),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", endpoint),
        ],
        ..Options::default()
    })
    .await;
    calls(&server).await;
    let metrics = crate::http::metrics_text(&server).await;
    assert!(!metrics.contains("fusebox_trace_spans"), "{metrics}");
    server.terminate();
    // Once it has exited, whatever it would have sent is sent.
    let logs = server.all_logs().await;
    assert!(!logs.contains("OTLP"), "{logs}");
    assert!(rx.try_recv().is_err(), "a span without [telemetry]");
}

#[tokio::test]
async fn a_bad_endpoint_stops_the_start_and_names_the_field() {
    let dir = tempfile::tempdir().expect("a temp dir");
    for (endpoint, says) in [
        ("collector:4317", "is not an http:// address"),
        (
            "http://collector:4317/v1/traces",
            "a host and a port and nothing else",
        ),
        (
            "https://collector:4317",
            "TLS to the receiver is not supported",
        ),
    ] {
        let path = dir.path().join("fusebox.toml");
        std::fs::write(
            &path,
            format!("[telemetry]\notlp_endpoint = \"{endpoint}\"\n"),
        )
        .expect("written");
        let err =
            crate::harness::refused_start(&["--config", path.to_str().expect("UTF-8")], None).await;
        assert!(
            err.contains("[telemetry]: otlp_endpoint:"),
            "{endpoint}: {err}"
        );
        assert!(err.contains(says), "{endpoint}: {err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_that_is_down_fails_no_call_and_is_logged_once() {
    // A port that was free a moment ago: nothing listens there.
    let dead = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
        listener.local_addr().expect("an address")
    };
    let config = config(&format!("http://{dead}"));
    let mut server = Server::start(Options {
        config: Some(&config),
        ..Options::default()
    })
    .await;
    for _ in 0..3 {
        calls(&server).await;
    }
    server.terminate();
    let logs = server.all_logs().await;
    let failed = logs.matches("could not send").count();
    assert!(failed <= 1, "said more than once: {logs}");
    assert!(
        failed == 1 || logs.contains("may not have reached the receiver"),
        "the lost spans are not mentioned: {logs}"
    );
}

/// `request` with the caller's trace context and `token`.
fn traced_as<T>(message: T, token: &str) -> Request<T> {
    let mut request = traced(message);
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().expect("ASCII"),
    );
    request
}

/// With `[auth]`, a call refused for its credential has a span with its
/// method and code and nothing its caller chose: no `fusebox.key`, no
/// refusal message (which names the key); an allowed call's span has them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_calls_span_carries_nothing_the_caller_chose() {
    let (endpoint, mut rx) = receiver().await;
    let config = format!(
        "[telemetry]\notlp_endpoint = \"{endpoint}\"\n\n[auth]\n\n[[auth.token]]\nname = \"a\"\nrole = \"caller\"\nprefixes = [\"a/*\"]\nsha256 = \"{}\"\n",
        fusebox::auth::hash_hex("caller-a-token-0123456789")
    );
    let server = Server::start(Options {
        config: Some(&config),
        ..Options::default()
    })
    .await;
    let mut client = server.fusebox().await;
    let evil = "b/attacker-chosen-value";
    let refused = client
        .acquire(traced_as(
            crate::admin::one_permit(evil),
            "caller-a-token-0123456789",
        ))
        .await
        .expect_err("b/ is not a's");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    client
        .acquire(traced_as(
            crate::admin::one_permit("a/k"),
            "caller-a-token-0123456789",
        ))
        .await
        .expect("a/ is a's");
    server.terminate();
    let received = spans(&mut rx, 2).await;
    let keys: Vec<Option<String>> = received
        .iter()
        .map(|r| text_of(&r.span.attributes, "fusebox.key"))
        .collect();
    assert!(keys.contains(&Some("a/k".to_owned())), "{received:#?}");
    let denied = received
        .iter()
        .find(|r| {
            matches!(
                value_of(&r.span.attributes, "rpc.grpc.status_code"),
                Some(Value::IntValue(7))
            )
        })
        .unwrap_or_else(|| panic!("the refused call's span: {received:#?}"));
    assert!(
        !format!("{:?}", denied.span).contains("attacker-chosen"),
        "{denied:#?}"
    );
    assert_eq!(
        text_of(&denied.span.attributes, "rpc.method").as_deref(),
        Some("Acquire")
    );
}

/// With `follow_caller_sampling = false` and `sample_ratio = 0`, a
/// caller's sampled flag keeps no trace: nothing reaches the receiver.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_callers_sampled_flag_can_be_ignored() {
    let (endpoint, mut rx) = receiver().await;
    let config = format!(
        "[telemetry]\notlp_endpoint = \"{endpoint}\"\nsample_ratio = 0.0\nfollow_caller_sampling = false\n"
    );
    let mut server = Server::start(Options {
        config: Some(&config),
        ..Options::default()
    })
    .await;
    let mut client = server.fusebox().await;
    for i in 0..20 {
        client
            .acquire(traced(crate::admin::one_permit(&format!("k{i}"))))
            .await
            .expect("granted");
    }
    server.terminate();
    // Once it has exited, whatever it would have sent is sent.
    let logs = server.all_logs().await;
    assert!(logs.contains("traces are sent over OTLP/gRPC"), "{logs}");
    assert!(
        rx.try_recv().is_err(),
        "a span kept on the caller's word alone"
    );
}

/// A receiver that never answers (a socket that accepts and stays
/// silent): with `max_queued_spans = 4`, the spans that do not fit are
/// dropped and counted on `/metrics`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_past_a_full_queue_are_counted_as_dropped() {
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let endpoint = format!("http://{}", silent.local_addr().expect("an address"));
    let held = tokio::spawn(async move {
        let mut sockets = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            sockets.push(socket);
        }
    });
    let config = format!("[telemetry]\notlp_endpoint = \"{endpoint}\"\nmax_queued_spans = 4\n");
    let server = Server::start(Options {
        config: Some(&config),
        ..Options::default()
    })
    .await;
    let mut client = server.fusebox().await;
    const CALLS: usize = 50;
    for i in 0..CALLS {
        client
            .acquire(traced(crate::admin::one_permit(&format!("k{i}"))))
            .await
            .expect("a call is served whatever the receiver does");
    }
    let metrics = crate::http::metrics_text(&server).await;
    let value = |name: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {name}:\n{metrics}"))
    };
    // At most 4 wait, and 4 more are in the one export that hangs.
    let dropped = value("fusebox_trace_spans_dropped_total");
    assert!(
        dropped >= (CALLS - 8) as f64 && dropped <= CALLS as f64,
        "{dropped} of {CALLS} dropped:\n{metrics}"
    );
    held.abort();
}

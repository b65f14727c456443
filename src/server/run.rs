//! Serving the gRPC port: the services, health and reflection behind the
//! gate and the calls layer, over HTTP/2 with every buffer bounded, until
//! shutdown.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::node::Node;
use crate::proto::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use crate::proto::v1 as pb;
use pb::admin_server::AdminServer;
use pb::clock_server::ClockServer;
use pb::fusebox_server::FuseboxServer;

use super::api::Api;
use super::{calls, gate, tls, transport};

/// Largest gRPC message fusebox accepts, in bytes.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024;

/// Largest message the Admin service sends, in bytes: a ListKeys page of
/// 1000 keys or a Watch snapshot part of 100 keys can pass 64 KiB (a
/// `KeyState` with a 256-byte key and every statistic set is under 1 KiB).
/// 4 MiB is what gRPC clients accept by default.
pub const MAX_ADMIN_REPLY_BYTES: usize = 4 * 1024 * 1024;

/// What one stream's client may send ahead of the server's reading: one
/// of the largest messages.
pub const RECEIVE_WINDOW_PER_STREAM: u32 = MAX_MESSAGE_BYTES as u32;

/// The same for a whole connection.
pub const RECEIVE_WINDOW_PER_CONNECTION: u32 = 256 * 1024;

/// How long shutdown waits for in-flight calls before it exits anyway.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Once no call is in flight at shutdown, how long the server still has to
/// flush the last answers and close its connections before it exits.
pub const SHUTDOWN_FLUSH: Duration = Duration::from_millis(200);

const SERVICES: [&str; 4] = [
    "fusebox.v1.Fusebox",
    "fusebox.v1.Admin",
    "fusebox.v1.Clock",
    "envoy.service.ratelimit.v3.RateLimitService",
];

/// Serves fusebox on `listener` until `shutdown` resolves, then reports
/// NOT_SERVING, answers waiters, stops accepting, lets in-flight calls
/// finish (up to [`SHUTDOWN_GRACE`]) and returns: at once when no call is
/// in flight, whatever idle connections are open.
pub async fn run(
    listener: tokio::net::TcpListener,
    node: Arc<Node>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    run_with_tls(listener, node, None, shutdown).await
}

/// Like [`run`]; with `tls`, every connection is a TLS one (see [`tls`]).
pub async fn run_with_tls(
    listener: tokio::net::TcpListener,
    node: Arc<Node>,
    tls: Option<tls::Acceptor>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let store = node.store().clone();
    let core = store.core().clone();
    let manual = core.has_manual_clock();
    let served: Vec<&str> = SERVICES
        .iter()
        .copied()
        .filter(|s| manual || *s != "fusebox.v1.Clock")
        .collect();
    let (health, health_service) = tonic_health::server::health_reporter();
    for name in &served {
        health
            .set_service_status(*name, tonic_health::ServingStatus::Serving)
            .await;
    }
    let mut reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(crate::proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .with_service_name("grpc.health.v1.Health")
        .with_service_name("grpc.reflection.v1.ServerReflection");
    for name in &served {
        reflection = reflection.with_service_name(*name);
    }
    let reflection = reflection.build_v1()?;

    let api = Api::new(node.clone());
    let timer = {
        let store = store.clone();
        tokio::spawn(async move { store.run_timer().await })
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let limits = node.limits().connections();
    let incoming = crate::connections::incoming(
        listener,
        node.ports().clone(),
        limits,
        node.watch_access(),
        crate::connections::MaybeTls(tls),
    );
    let in_flight = Arc::new(calls::InFlight::of(node.clone()));
    let streams = u32::try_from(limits.max_streams_per_connection).unwrap_or(u32::MAX);
    let routes = tonic::service::Routes::new(
        FuseboxServer::new(api.clone())
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES),
    )
    .add_service(
        AdminServer::new(api.clone())
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_ADMIN_REPLY_BYTES),
    )
    // Always routed, so that callers without --manual-clock get
    // UNIMPLEMENTED with a message that says what to do (X1).
    .add_service(ClockServer::new(api.clone()).max_decoding_message_size(MAX_MESSAGE_BYTES))
    // Envoy's rate-limit service (RLS v3), mapped by the config's [rls].
    .add_service(
        RateLimitServiceServer::new(api.clone())
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES),
    )
    .add_service(health_service)
    .add_service(reflection)
    .prepare();
    let service = tower::ServiceBuilder::new()
        // The gate first: a call without a credential is not in flight.
        .layer(gate::GateLayer(node.clone()))
        .layer(calls::CallsLayer(in_flight.clone()))
        .service(routes);
    let settings = transport::Settings {
        max_streams: streams,
        // What a client may send ahead of the server's reading (decisions
        // 101): a stream that stops reading holds at most this much.
        stream_window: RECEIVE_WINDOW_PER_STREAM,
        connection_window: RECEIVE_WINDOW_PER_CONNECTION,
        keep_alive: Duration::from_secs(30),
    };
    let server = transport::serve(incoming, service, settings, async {
        let _ = stop_rx.await;
    });
    tokio::pin!(server);
    tokio::pin!(shutdown);
    tokio::select! {
        () = &mut server => {
            timer.abort();
            return Ok(());
        }
        () = &mut shutdown => {}
    }
    tracing::info!(
        "shutting down: reporting NOT_SERVING, answering waiters, finishing in-flight calls"
    );
    health
        .set_service_status("", tonic_health::ServingStatus::NotServing)
        .await;
    for name in &served {
        health
            .set_service_status(*name, tonic_health::ServingStatus::NotServing)
            .await;
    }
    store.shutdown();
    let _ = stop_tx.send(());
    // Done when the server has closed every connection, or as soon as no
    // call is in flight (idle connections are not waited for), or at the
    // end of the grace.
    let grace = tokio::time::sleep(SHUTDOWN_GRACE);
    tokio::pin!(grace);
    tokio::select! {
        () = &mut server => {}
        () = in_flight.idle() => {
            let _ = tokio::time::timeout(SHUTDOWN_FLUSH, &mut server).await;
        }
        () = &mut grace => tracing::warn!(
            calls = in_flight.count(),
            "{} calls were still open {} s after shutdown began; exiting anyway",
            in_flight.count(),
            SHUTDOWN_GRACE.as_secs()
        ),
    }
    timer.abort();
    tracing::info!("stopped");
    Ok(())
}

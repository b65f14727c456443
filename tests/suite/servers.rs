//! Two whole servers in one process, each started through
//! `fusebox::serve::bind` (what `fusebox serve` calls): each counts, caps
//! and bounds its own connections and streams, and its `/metrics` shows
//! its own figures only.

use std::time::Duration;

use fusebox::proto::v1 as pb;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

use crate::harness::eventually;

const TOKEN: &str = "servers-apart-token";

/// Safety net for conditions reached asynchronously.
const LIMIT: Duration = Duration::from_secs(30);

/// A server started in this process, serving until `stop` is sent.
struct InProcess {
    grpc: String,
    http: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    serving: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    _dir: tempfile::TempDir,
}

impl InProcess {
    /// A server with `[auth]` (one admin token), on port 0 for both ports.
    async fn start() -> InProcess {
        let dir = tempfile::tempdir().expect("a temp dir");
        let config = dir.path().join("fusebox.toml");
        std::fs::write(
            &config,
            format!(
                "[auth]\n\n[[auth.token]]\nname = \"ops\"\nrole = \"admin\"\nsha256 = \"{}\"\n",
                fusebox::auth::hash_hex(TOKEN)
            ),
        )
        .expect("the config written");
        let mut options = fusebox::serve::Options::on("127.0.0.1:0".parse().unwrap());
        options.http = Some("127.0.0.1:0".parse().unwrap());
        options.config = Some(config);
        let bound = fusebox::serve::bind(options)
            .await
            .expect("the server binds");
        let grpc = bound.grpc_addr().to_string();
        let http = bound.http_addr().expect("an HTTP port").to_string();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let serving = tokio::spawn(bound.run(async {
            let _ = stopped.await;
        }));
        InProcess {
            grpc,
            http,
            stop: Some(stop),
            serving: Some(serving),
            _dir: dir,
        }
    }

    async fn metrics(&self) -> String {
        let reply = crate::http::get(&self.http, "/metrics").await;
        assert_eq!(reply.status, 200, "{reply:?}");
        reply.body
    }

    async fn stop(mut self) {
        let _ = self.stop.take().expect("running").send(());
        let serving = self.serving.take().expect("running");
        tokio::time::timeout(LIMIT, serving)
            .await
            .expect("the server stops after shutdown")
            .expect("the task ends")
            .expect("serve returns Ok");
    }
}

/// The value of an unlabelled sample.
fn value(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /metrics:\n{text}"))
}

/// One Decide frame: a status check of `key` (no permit taken).
fn frame(id: u64, key: &str) -> pb::DecideFrame {
    pb::DecideFrame {
        id,
        request: Some(pb::decide_frame::Request::Acquire(
            crate::admin::status_check(key),
        )),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_in_one_process_count_their_own_connections_and_streams() {
    let one = InProcess::start().await;
    let two = InProcess::start().await;

    // On the first: a client with its token, a Decide stream whose answers
    // it never reads, and connections that never show a credential.
    let channel = Channel::from_shared(format!("http://{}", one.grpc))
        .expect("an address")
        .connect()
        .await
        .expect("a gRPC connection");
    let mut client =
        pb::fusebox_client::FuseboxClient::with_interceptor(channel, |mut r: tonic::Request<()>| {
            r.metadata_mut().insert(
                "authorization",
                format!("Bearer {TOKEN}").parse().expect("a header value"),
            );
            Ok(r)
        });
    let (frames, sent) = tokio::sync::mpsc::channel::<pb::DecideRequest>(4);
    let answers = client
        .decide(ReceiverStream::new(sent))
        .await
        .expect("a Decide stream")
        .into_inner();
    let mut strangers = Vec::new();
    for _ in 0..3 {
        let mut tcp = TcpStream::connect(&one.grpc).await.expect("connect");
        tcp.write_all(fusebox::connections::PREFACE)
            .await
            .expect("the preface");
        strangers.push(tcp);
    }
    // Messages of 1,000 frames until the first server holds answers that
    // its client has not read (the client reads none).
    let mut id = 0;
    let first_server = &one;
    let first = eventually("the first server to hold unread answers", LIMIT, || {
        let message = pb::DecideRequest {
            frames: (0..1000)
                .map(|_| {
                    id += 1;
                    frame(id, "apart/k")
                })
                .collect(),
        };
        // Full: the server stopped reading the stream, which is the point.
        let _ = frames.try_send(message);
        async move {
            let text = first_server.metrics().await;
            (value(&text, "fusebox_unread_bytes") > 0.0 && value(&text, "fusebox_strangers") >= 3.0)
                .then_some(text)
        }
    })
    .await;
    assert_eq!(value(&first, "fusebox_decide_streams"), 1.0, "{first}");
    assert!(value(&first, "fusebox_connections") >= 4.0, "{first}");
    assert!(
        value(&first, "fusebox_decide_frames_total") >= 1000.0,
        "{first}"
    );

    let second = two.metrics().await;
    for name in [
        "fusebox_connections",
        "fusebox_strangers",
        "fusebox_decide_streams",
        "fusebox_decide_frames_total",
        "fusebox_decide_answers_total",
        "fusebox_unread_bytes",
        "fusebox_calls_in_flight",
    ] {
        assert_eq!(
            value(&second, name),
            0.0,
            "the second server counts none of the first's: {name}\n{second}"
        );
    }

    drop(answers);
    drop(frames);
    drop(strangers);
    // Once the stream is gone, the first's figures come back down.
    eventually(
        "the first server to let go of the stream",
        LIMIT,
        || async {
            let text = first_server.metrics().await;
            (value(&text, "fusebox_decide_streams") == 0.0
                && value(&text, "fusebox_unread_bytes") == 0.0)
                .then_some(())
        },
    )
    .await;
    one.stop().await;
    two.stop().await;
}

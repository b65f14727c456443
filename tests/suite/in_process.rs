//! A whole server started in this process through `fusebox::serve`, the
//! function `fusebox serve` calls: both ports, the state, and shutdown.

use std::time::Duration;

use fusebox::proto::v1 as pb;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_server_runs_in_process_through_serve() {
    let mut options = fusebox::serve::Options::on("127.0.0.1:0".parse().unwrap());
    options.http = Some("127.0.0.1:0".parse().unwrap());
    let bound = fusebox::serve::bind(options)
        .await
        .expect("the server binds");
    let grpc = bound.grpc_addr();
    let http = bound.http_addr().expect("an HTTP port").to_string();
    assert_ne!(grpc.port(), 0, "port 0 picks a free port");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(bound.run(async {
        let _ = stopped.await;
    }));

    let mut client = pb::fusebox_client::FuseboxClient::connect(format!("http://{grpc}"))
        .await
        .expect("a gRPC connection");
    let granted = client
        .acquire(crate::admin::one_permit("in-process/k"))
        .await
        .expect("an Acquire")
        .into_inner();
    assert_eq!(
        granted.decision,
        pb::Decision::Granted as i32,
        "{granted:?}"
    );
    crate::admin::complete(&mut client, &granted.ticket, pb::Outcome::Success).await;
    let metrics = crate::http::get(&http, "/metrics").await;
    assert_eq!(metrics.status, 200, "{metrics:?}");
    assert!(
        metrics.body.lines().any(|l| l == "fusebox_keys 1"),
        "the HTTP port serves the same state: {}",
        metrics.body
    );

    stop.send(()).expect("the server is running");
    let served = tokio::time::timeout(Duration::from_secs(10), serving)
        .await
        .expect("the server stops after shutdown")
        .expect("the task ends");
    served.expect("serve returns Ok");
    assert!(
        tokio::net::TcpStream::connect(grpc).await.is_err(),
        "the gRPC port is closed once serve returned"
    );
}

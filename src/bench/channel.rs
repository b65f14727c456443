//! The tool's connections: HTTP/2 to a fusebox server (or a peer), with
//! the credentials of `--token` and the TLS of `--tls-ca` and the other
//! `--tls-*` flags, both set once at start and built by `fusebox-cli`, as
//! the `fusebox` command's own are.

use std::sync::OnceLock;
use std::time::Duration;

use anyhow::Context;
use fusebox_cli::Credentials;
use tonic::transport::{ClientTlsConfig, Endpoint};

/// A connection that sends the tool's credentials with every call.
pub(crate) type Channel = fusebox_cli::Conn;

/// The credentials every connection of the tool sends (`--token`).
static CREDENTIALS: OnceLock<Credentials> = OnceLock::new();

/// The client side of TLS for `https://` targets.
static TLS: OnceLock<ClientTlsConfig> = OnceLock::new();

/// Sets the credentials of the tool's connections, once, before any.
pub(crate) fn set_credentials(credentials: Credentials) {
    let _ = CREDENTIALS.set(credentials);
}

/// Sets the TLS of the tool's `https://` connections, once, before any.
pub(crate) fn set_tls(tls: ClientTlsConfig) {
    let _ = TLS.set(tls);
}

/// A new HTTP/2 connection to `url`.
pub(crate) async fn connect(url: &str) -> anyhow::Result<Channel> {
    let mut endpoint =
        Endpoint::from_shared(url.to_owned()).with_context(|| format!("{url}: not an address"))?;
    if let (Some(tls), true) = (TLS.get(), url.starts_with("https://")) {
        endpoint = endpoint
            .tls_config(tls.clone())
            .context("the TLS settings cannot be used")?;
    }
    endpoint
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .with_context(|| format!("cannot reach fusebox at {url}"))
        .map(|channel| {
            let credentials = CREDENTIALS.get().cloned().unwrap_or(Credentials::NONE);
            tonic::service::interceptor::InterceptedService::new(channel, credentials)
        })
}

/// One unary call of `path` on `grpc`, its messages encoded by prost: the
/// clients of the peers' protocols, written out by hand, share it. `peer`
/// names the server in the error when the connection is not ready.
pub(crate) async fn unary<Req, Resp>(
    grpc: &mut tonic::client::Grpc<Channel>,
    path: &'static str,
    request: Req,
    peer: &str,
) -> Result<Resp, tonic::Status>
where
    Req: prost::Message + Send + 'static,
    Resp: prost::Message + Default + Send + 'static,
{
    grpc.ready()
        .await
        .map_err(|e| tonic::Status::unavailable(format!("{peer}: {e}")))?;
    let codec = tonic_prost::ProstCodec::<Req, Resp>::default();
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(path);
    grpc.unary(tonic::Request::new(request), path, codec)
        .await
        .map(tonic::Response::into_inner)
}

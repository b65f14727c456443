//! Reaching a server: its address, the bearer token and TLS that a
//! command's flags give, the connection that carries them, and failed
//! calls in words that say what to check.

use std::path::PathBuf;

use anyhow::{bail, Context};
use fusebox_proto::v1 as pb;

/// The address `fusebox serve` listens on, and client commands call, by
/// default.
pub const DEFAULT_ADDR: &str = "127.0.0.1:50051";

/// The flags of every client command: which server, how to prove who is
/// calling, and whether to print JSON.
#[derive(clap::Args, Debug, Clone)]
pub struct ClientOptions {
    /// The server to call.
    #[arg(long, global = true, default_value = DEFAULT_ADDR)]
    pub server: String,
    /// Print JSON instead of readable text.
    #[arg(long, global = true)]
    pub json: bool,
    /// The bearer token to call with, when the server has `[auth]`.
    #[arg(long, global = true, env = "FUSEBOX_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Call the server over TLS, trusting the CA certificates in this PEM file.
    #[arg(long, global = true, env = "FUSEBOX_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// With mutual TLS: this client's certificate chain (PEM).
    #[arg(long, global = true, env = "FUSEBOX_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// With mutual TLS: this client's private key (PEM).
    #[arg(long, global = true, env = "FUSEBOX_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// The name the server's certificate must have, when it is not the
    /// host of --server.
    #[arg(long, global = true, env = "FUSEBOX_TLS_SERVER_NAME")]
    pub tls_server_name: Option<String>,
}

/// A connection to a server that sends the caller's credentials with
/// every call.
pub type Conn =
    tonic::service::interceptor::InterceptedService<tonic::transport::Channel, Credentials>;

/// The `authorization: Bearer TOKEN` header of `--token` / `FUSEBOX_TOKEN`.
#[derive(Clone)]
pub struct Credentials(Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>);

impl Credentials {
    /// No credentials.
    pub const NONE: Credentials = Credentials(None);

    /// The header for `token`, if any.
    pub fn of(token: Option<&str>) -> anyhow::Result<Credentials> {
        token
            .map(|t| {
                let mut value: tonic::metadata::MetadataValue<_> =
                    format!("Bearer {}", t.trim()).parse().map_err(|_| {
                        anyhow::anyhow!("--token: a token is printable ASCII without line breaks")
                    })?;
                value.set_sensitive(true);
                Ok(value)
            })
            .transpose()
            .map(Credentials)
    }
}

impl tonic::service::Interceptor for Credentials {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}

/// A connection to the server `client` names, with its credentials.
pub async fn connect(client: &ClientOptions) -> anyhow::Result<Conn> {
    let credentials = Credentials::of(client.token.as_deref())?;
    let channel = channel(client).await?;
    Ok(tonic::service::interceptor::InterceptedService::new(
        channel,
        credentials,
    ))
}

/// How this command calls the server, for the hints of [`call_error`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Spoke {
    /// Without TLS.
    Plain = 0,
    /// TLS without a client certificate.
    Tls = 1,
    /// TLS with a client certificate.
    MutualTls = 2,
}

static SPOKE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

fn spoke() -> Spoke {
    match SPOKE.load(std::sync::atomic::Ordering::Relaxed) {
        0 => Spoke::Plain,
        1 => Spoke::Tls,
        _ => Spoke::MutualTls,
    }
}

async fn channel(client: &ClientOptions) -> anyhow::Result<tonic::transport::Channel> {
    let tls = client.tls_ca.is_some()
        || client.tls_cert.is_some()
        || client.tls_key.is_some()
        || client.tls_server_name.is_some()
        || client.server.starts_with("https://");
    let mode = match (tls, client.tls_cert.is_some()) {
        (false, _) => Spoke::Plain,
        (true, false) => Spoke::Tls,
        (true, true) => Spoke::MutualTls,
    };
    SPOKE.store(mode as u8, std::sync::atomic::Ordering::Relaxed);
    let url = if client.server.contains("://") {
        client.server.clone()
    } else if tls {
        format!("https://{}", client.server)
    } else {
        format!("http://{}", client.server)
    };
    let mut endpoint = tonic::transport::Endpoint::from_shared(url.clone())
        .with_context(|| format!("--server {}: not an address", client.server))?
        .connect_timeout(std::time::Duration::from_secs(5));
    if tls {
        endpoint = endpoint
            .tls_config(tls_config(client)?)
            .context("the TLS settings cannot be used")?;
    }
    endpoint.connect().await.map_err(|e| {
        let hint = tls_hint(&e, mode).unwrap_or_else(|| {
            "start `fusebox serve` there, or pass --server with the address a running \
             server printed (`listening on ADDR`); if it serves TLS, pass --tls-ca FILE"
                .to_owned()
        });
        anyhow::Error::new(e).context(format!("cannot reach fusebox at {}: {hint}", client.server))
    })
}

/// The client side of TLS, from `--tls-ca`, `--tls-cert`, `--tls-key` and `--tls-server-name`.
fn tls_config(client: &ClientOptions) -> anyhow::Result<tonic::transport::ClientTlsConfig> {
    tls_config_of(
        client.tls_ca.as_deref(),
        client.tls_cert.as_deref(),
        client.tls_key.as_deref(),
        client.tls_server_name.as_deref(),
    )
}

/// The client side of TLS from the files and the server name of the `--tls-*` flags.
pub fn tls_config_of(
    ca: Option<&std::path::Path>,
    cert: Option<&std::path::Path>,
    key: Option<&std::path::Path>,
    server_name: Option<&str>,
) -> anyhow::Result<tonic::transport::ClientTlsConfig> {
    let read = |flag: &str, path: &std::path::Path| {
        std::fs::read(path).with_context(|| format!("{flag}: cannot read {}", path.display()))
    };
    let Some(ca) = ca else {
        bail!(
            "--tls-ca is missing: pass the PEM file of the CA that signed the server's certificate"
        );
    };
    let mut config = tonic::transport::ClientTlsConfig::new().ca_certificate(
        tonic::transport::Certificate::from_pem(read("--tls-ca", ca)?),
    );
    match (cert, key) {
        (Some(cert), Some(key)) => {
            config = config.identity(tonic::transport::Identity::from_pem(
                read("--tls-cert", cert)?,
                read("--tls-key", key)?,
            ));
        }
        (Some(_), None) => bail!("--tls-cert needs --tls-key (this client's private key)"),
        (None, Some(_)) => bail!("--tls-key needs --tls-cert (this client's certificate)"),
        (None, None) => {}
    }
    if let Some(name) = server_name {
        config = config.domain_name(name.to_owned());
    }
    Ok(config)
}

/// What to check when a connection or call failed for a TLS reason, from
/// the chain of `error`'s causes and how the client spoke.
pub(crate) fn tls_hint(error: &(dyn std::error::Error + 'static), spoke: Spoke) -> Option<String> {
    let mut causes = String::new();
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = next {
        causes.push_str(&format!("{e} {e:?} "));
        next = e.source();
    }
    let has = |needle: &str| causes.contains(needle);
    let closed = has("connection closed")
        || has("onnection reset")
        || has("broken pipe")
        || has("Broken pipe")
        || has("unexpected EOF");
    // A TLS 1.3 server refuses a client's certificate (or its lack) after
    // the client's side of the handshake is done: the first call then
    // fails as the connection goes, named reset, closed or canceled by
    // whichever the client's side noticed first.
    let gone = closed || has("operation was canceled");
    let hint = if has("UnknownIssuer") || has("BadSignature") {
        "the server's certificate is not signed by --tls-ca FILE: pass the CA that signed it"
    } else if has("NotValidForName") {
        "the server's certificate does not name the host of --server: pass --tls-server-name with a name it has"
    } else if has("Expired") {
        "the server's certificate has expired (or this machine's clock is wrong)"
    } else if has("CertificateRequired") {
        "the server wants a client certificate: pass --tls-cert and --tls-key"
    } else if spoke != Spoke::Plain
        && (has("InvalidContentType") || has("CorruptMessage") || has("InvalidMessage"))
    {
        "the server does not speak TLS there: drop --tls-ca, --tls-cert and --tls-key"
    } else if spoke == Spoke::MutualTls
        && (has("UnknownCA") || has("BadCertificate") || has("DecryptError") || gone)
    {
        "the server refused this client's certificate: --tls-cert must be signed by a CA in the server's [tls] client_ca"
    } else if spoke == Spoke::Tls && gone {
        "the server closed the connection after the TLS handshake; it likely wants a client certificate: pass --tls-cert and --tls-key"
    } else if spoke == Spoke::Plain && (closed || has("frame") || has("protocol error")) {
        "the server closed the connection; if it serves TLS, pass --tls-ca FILE (and --tls-cert and --tls-key for mutual TLS)"
    } else {
        return None;
    };
    Some(hint.to_owned())
}

/// The Admin service of the server `client` names.
pub(crate) async fn admin(
    client: &ClientOptions,
) -> anyhow::Result<pb::admin_client::AdminClient<Conn>> {
    Ok(pb::admin_client::AdminClient::new(connect(client).await?))
}

/// A request that names the operator who made it (`cli:$USER`), for the
/// isolate and close records.
pub(crate) fn operator<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    let who = std::env::var("USER").unwrap_or_else(|_| "cli".to_owned());
    if let Ok(value) = format!("cli:{who}").parse() {
        request.metadata_mut().insert("x-fusebox-operator", value);
    }
    request
}

/// A failed call, named by its gRPC code as the SPEC and every gRPC client
/// write it (`NOT_FOUND`, `INVALID_ARGUMENT`), then the server's message.
pub fn call_error(status: tonic::Status) -> anyhow::Error {
    let code = code_name(status.code());
    // A call cut off as its connection went has no cause to read, only
    // tonic's CANCELLED: its words are read instead.
    let hint = match std::error::Error::source(&status) {
        Some(cause) => tls_hint(cause, spoke()),
        None if status.code() == tonic::Code::Cancelled => tls_hint(&status, spoke()),
        None => None,
    };
    if let Some(hint) = hint {
        return anyhow::anyhow!("{code}: {}: {hint}", status.message());
    }
    match status.message() {
        "" => anyhow::anyhow!("{code}"),
        message => anyhow::anyhow!("{code}: {message}"),
    }
}

/// The canonical name of a gRPC code: `NotFound` becomes `NOT_FOUND`.
pub(crate) fn code_name(code: tonic::Code) -> String {
    let mut name = String::new();
    for (i, c) in format!("{code:?}").chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            name.push('_');
        }
        name.push(c.to_ascii_uppercase());
    }
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A call cut off as a TLS 1.3 server refuses the client's certificate
    /// (or its lack) may end as tonic's bare CANCELLED: it still says what
    /// to pass, and a plain connection is not told about TLS for it.
    #[test]
    fn a_call_canceled_as_the_connection_went_still_says_what_to_pass() {
        let canceled = tonic::Status::cancelled("operation was canceled");
        let hint = |spoke| tls_hint(&canceled, spoke).unwrap_or_default();
        assert!(hint(Spoke::Tls).contains("pass --tls-cert and --tls-key"));
        assert!(hint(Spoke::MutualTls).contains("refused this client's certificate"));
        assert_eq!(tls_hint(&canceled, Spoke::Plain), None);
    }
}

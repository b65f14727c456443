//! TLS and mutual TLS on the gRPC and HTTP ports, against a real server
//! with certificates made at test time: who may connect, which certificate
//! is served while the files are replaced, and the CLI's `--tls-*` flags.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use fusebox::proto::v1 as pb;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::harness::{by, eventually, refused_start, Options, Server, BIN};

/// How long a change may take to show.
const PATIENCE: Duration = Duration::from_secs(20);

/// A certificate authority made for one test (the store's TLS tests use
/// it too).
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A certificate and its key, in PEM.
pub struct Pair {
    pub cert: String,
    pub key: String,
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().expect("a CA key");
        Ca {
            issuer: CertifiedIssuer::self_signed(params, key).expect("a CA certificate"),
        }
    }

    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A certificate for `cn` with subject alternative names `sans`
    /// (addresses become IP names, the rest DNS or URI names).
    pub fn issue(&self, cn: &str, sans: &[&str]) -> Pair {
        let mut params =
            CertificateParams::new(sans.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())
                .expect("leaf params");
        params.distinguished_name.push(DnType::CommonName, cn);
        let key = KeyPair::generate().expect("a key");
        let cert = params.signed_by(&key, &self.issuer).expect("a certificate");
        Pair {
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }

    /// A server certificate for 127.0.0.1 and localhost, told apart by `tag`.
    fn server(&self, tag: &str) -> Pair {
        self.issue(tag, &["localhost", "127.0.0.1", tag])
    }
}

pub fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("file written");
    path
}

/// Replaces `name` in one step (write aside, then rename), as deployment
/// tools do.
fn replace(dir: &Path, name: &str, text: &str) {
    let aside = dir.join(format!(".{name}.new"));
    std::fs::write(&aside, text).expect("file written");
    std::fs::rename(&aside, dir.join(name)).expect("file renamed");
}

/// Starts a server with `--tls-cert`, `--tls-key` and `more` arguments.
async fn start(dir: &Path, more: &[&str]) -> Server {
    let cert = dir.join("server.pem").display().to_string();
    let key = dir.join("server.key").display().to_string();
    let mut args = vec!["--tls-cert", cert.as_str(), "--tls-key", key.as_str()];
    args.extend_from_slice(more);
    Server::start(Options {
        args,
        ..Options::default()
    })
    .await
}

/// A gRPC channel over TLS trusting `ca`, with `identity` if given.
async fn channel(
    server: &Server,
    ca: &str,
    identity: Option<&Pair>,
) -> Result<Channel, tonic::transport::Error> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .domain_name("localhost");
    if let Some(pair) = identity {
        tls = tls.identity(Identity::from_pem(&pair.cert, &pair.key));
    }
    Endpoint::from_shared(format!("https://{}", server.addr))
        .expect("an address")
        .tls_config(tls)
        .expect("a TLS config")
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
}

/// A GetKey over a new TLS connection: Ok when the server answers.
async fn get_over_tls(server: &Server, ca: &str, identity: Option<&Pair>) -> Result<(), String> {
    let channel = channel(server, ca, identity)
        .await
        .map_err(|e| format!("connect: {e:?}"))?;
    get_on(channel).await
}

async fn get_on(channel: Channel) -> Result<(), String> {
    pb::admin_client::AdminClient::new(channel)
        .get_key(pb::GetKeyRequest {
            key: "tls/k".into(),
        })
        .await
        .map(|_| ())
        .map_err(|s| format!("call: {s:?}"))
}

/// A rustls client trusting `ca`, offering `alpn`.
fn connector(ca: &str, identity: Option<&Pair>, alpn: &[u8]) -> tokio_rustls::TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca.as_bytes()) {
        roots.add(cert.expect("a CA certificate")).expect("a root");
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("TLS versions")
    .with_root_certificates(roots);
    let mut config = match identity {
        Some(pair) => builder
            .with_client_auth_cert(
                CertificateDer::pem_slice_iter(pair.cert.as_bytes())
                    .collect::<Result<Vec<_>, _>>()
                    .expect("a chain"),
                PrivateKeyDer::from_pem_slice(pair.key.as_bytes()).expect("a key"),
            )
            .expect("a client identity"),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![alpn.to_vec()];
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

/// The names of the certificate `addr` serves to a new connection.
async fn served_names(addr: &str, ca: &str) -> Result<Vec<String>, String> {
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let tls = connector(ca, None, b"h2")
        .connect(ServerName::try_from("localhost").expect("a name"), tcp)
        .await
        .map_err(|e| e.to_string())?;
    let leaf = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .ok_or("no certificate")?;
    Ok(fusebox::tls::names_of(leaf))
}

/// `GET path` over HTTPS on a new connection: the status line and the body.
async fn https_get(addr: &str, ca: &str, path: &str) -> Result<String, String> {
    https_get_as(addr, ca, None, path).await
}

/// [`https_get`] with a client certificate.
async fn https_get_as(
    addr: &str,
    ca: &str,
    identity: Option<&Pair>,
    path: &str,
) -> Result<String, String> {
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let mut tls = connector(ca, identity, b"http/1.1")
        .connect(ServerName::try_from("localhost").expect("a name"), tcp)
        .await
        .map_err(|e| e.to_string())?;
    assert_eq!(
        tls.get_ref().1.alpn_protocol(),
        Some(&b"http/1.1"[..]),
        "the HTTP port speaks HTTP/1.1"
    );
    tls.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .map_err(|e| e.to_string())?;
    let mut reply = String::new();
    tls.read_to_string(&mut reply)
        .await
        .map_err(|e| e.to_string())?;
    Ok(reply)
}

/// Reads one HTTP/1.1 response with a Content-Length from `stream`: the
/// head and the body.
async fn response<S: tokio::io::AsyncRead + Unpin>(
    stream: &mut S,
) -> Result<(String, String), String> {
    let mut bytes = Vec::new();
    let mut byte = [0u8; 1];
    while !bytes.ends_with(b"\r\n\r\n") {
        let n = stream.read(&mut byte).await.map_err(|e| e.to_string())?;
        if n == 0 {
            return Err(format!(
                "closed after {:?}",
                String::from_utf8_lossy(&bytes)
            ));
        }
        bytes.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&bytes).into_owned();
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().ok())?
        })
        .ok_or_else(|| format!("no content-length in {head}"))?;
    let mut body = vec![0u8; length];
    stream
        .read_exact(&mut body)
        .await
        .map_err(|e| e.to_string())?;
    Ok((head, String::from_utf8_lossy(&body).into_owned()))
}

/// `GET path` over plain HTTP.
async fn http_get(addr: &str, path: &str) -> Result<String, String> {
    let mut tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    tcp.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .map_err(|e| e.to_string())?;
    let mut reply = Vec::new();
    tcp.read_to_end(&mut reply)
        .await
        .map_err(|e| e.to_string())?;
    Ok(String::from_utf8_lossy(&reply).into_owned())
}

/// Writes `pair` as NAME.pem and NAME.key in `dir`: their paths.
fn write_pair(dir: &Path, name: &str, pair: &Pair) -> (String, String) {
    let cert = write(dir, &format!("{name}.pem"), &pair.cert);
    let key = write(dir, &format!("{name}.key"), &pair.key);
    (cert.display().to_string(), key.display().to_string())
}

/// Writes a server pair signed by `ca` as server.pem and server.key.
fn install(dir: &Path, pair: &Pair) {
    write_pair(dir, "server", pair);
}

/// A temporary directory holding a server pair for `tag` (as
/// [`Ca::server`] makes it), signed by a new test CA: the directory and
/// the CA.
fn certified(tag: &str) -> (tempfile::TempDir, Ca) {
    let dir = tempfile::tempdir().expect("a temp dir");
    let ca = Ca::new("fusebox test CA");
    install(dir.path(), &ca.server(tag));
    (dir, ca)
}

/// Replaces the server pair in `dir` with `pair`, the key first.
fn replace_pair(dir: &Path, pair: &Pair) {
    replace(dir, "server.key", &pair.key);
    replace(dir, "server.pem", &pair.cert);
}

/// Waits until new connections to `server` are served the certificate
/// named `name`.
async fn until_served(server: &Server, ca: &str, name: &str) {
    let what = format!("new connections to see the certificate of {name}");
    eventually(&what, PATIENCE, || async {
        let names = served_names(&server.addr, ca).await.ok()?;
        names.contains(&name.to_owned()).then_some(())
    })
    .await;
}

#[tokio::test]
async fn grpc_over_tls_answers_only_clients_that_trust_its_ca() {
    let (dir, ca) = certified("server.fusebox.test");
    let other = Ca::new("another CA");
    let server = start(dir.path(), &[]).await;

    get_over_tls(&server, &ca.pem(), None)
        .await
        .expect("a client trusting the CA is answered");

    let plain = async {
        let channel = Endpoint::from_shared(format!("http://{}", server.addr))
            .expect("an address")
            .connect()
            .await
            .map_err(|e| e.to_string())?;
        get_on(channel).await
    };
    assert!(plain.await.is_err(), "a client without TLS is not answered");

    let wrong = get_over_tls(&server, &other.pem(), None).await;
    let Err(why) = wrong else {
        panic!("a client trusting another CA must not be answered");
    };
    assert!(
        why.contains("UnknownIssuer"),
        "the client fails on the certificate: {why}"
    );
    // The log is read from the server's standard error as it comes.
    let logs = server.until_logged("TLS handshake failed").await;
    assert!(logs.contains("tls=on; HTTP over TLS too"), "{logs}");
}

#[tokio::test]
async fn mutual_tls_requires_a_client_certificate_from_the_client_ca() {
    let (dir, ca) = certified("server.fusebox.test");
    let clients = Ca::new("client CA");
    let strangers = Ca::new("stranger CA");
    let client_ca = write(dir.path(), "clients.pem", &clients.pem());
    let client_ca = client_ca.display().to_string();
    let server = start(dir.path(), &["--tls-client-ca", &client_ca]).await;
    let known = clients.issue(
        "billing",
        &["billing.internal", "spiffe://fusebox.test/billing"],
    );
    let stranger = strangers.issue("billing", &["billing.internal"]);

    get_over_tls(&server, &ca.pem(), Some(&known))
        .await
        .expect("a client certificate signed by the client CA is accepted");
    let none = get_over_tls(&server, &ca.pem(), None).await;
    assert!(none.is_err(), "no client certificate: refused");
    let unknown = get_over_tls(&server, &ca.pem(), Some(&stranger)).await;
    assert!(unknown.is_err(), "a certificate of another CA: refused");
    let logs = server.logs();
    assert!(
        logs.contains("tls=on, mutual (client certificates required)"),
        "{logs}"
    );
    assert!(logs.contains("TLS handshake failed"), "{logs}");

    // The certificate's name reaches the services: an isolate records it,
    // and the transitions read over HTTPS (mutual TLS there too) show it.
    let channel = channel(&server, &ca.pem(), Some(&known))
        .await
        .expect("a connection");
    pb::admin_client::AdminClient::new(channel)
        .isolate(by(
            "cli:ana",
            pb::IsolateRequest {
                key: "tls/isolated".into(),
                reason: "drill".into(),
            },
        ))
        .await
        .expect("isolated");
    let http = server.http_addr.clone().expect("an HTTP address");
    assert!(
        https_get(&http, &ca.pem(), "/healthz").await.is_err(),
        "the HTTP port wants a client certificate too"
    );
    let reply = https_get_as(&http, &ca.pem(), Some(&known), "/api/transitions")
        .await
        .expect("HTTPS with a client certificate");
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(
        reply.contains("cli:ana (certificate billing)"),
        "the record names the certificate: {reply}"
    );
}

#[tokio::test]
async fn optional_client_auth_from_a_config_file_with_relative_paths() {
    let (dir, ca) = certified("server.fusebox.test");
    let clients = Ca::new("client CA");
    let strangers = Ca::new("stranger CA");
    write(dir.path(), "clients.pem", &clients.pem());
    let config = write(
        dir.path(),
        "fusebox.toml",
        "[tls]\ncert = \"server.pem\"\nkey = \"server.key\"\nclient_ca = \"clients.pem\"\nclient_auth = \"optional\"\nhttp = false\n",
    );
    let config = config.display().to_string();
    let server = Server::start(Options {
        args: vec!["--config", &config],
        ..Options::default()
    })
    .await;
    get_over_tls(&server, &ca.pem(), None)
        .await
        .expect("optional: a client without a certificate is answered");
    get_over_tls(&server, &ca.pem(), Some(&clients.issue("ops", &[])))
        .await
        .expect("optional: a client certificate of the client CA is accepted");
    assert!(
        get_over_tls(&server, &ca.pem(), Some(&strangers.issue("ops", &[])))
            .await
            .is_err(),
        "optional: a certificate of another CA is still refused"
    );
    // http = false: the HTTP port stays plain.
    let http = server.http_addr.clone().expect("an HTTP address");
    let reply = http_get(&http, "/healthz").await.expect("plain HTTP");
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
}

#[tokio::test]
async fn a_bad_tls_setting_stops_the_start_naming_the_field_and_the_file() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let missing = dir.path().join("nowhere.pem").display().to_string();
    let err = refused_start(&["--tls-cert", &missing, "--tls-key", &missing], None).await;
    assert!(
        err.contains(&format!("[tls] cert: cannot read {missing}")),
        "{err}"
    );

    let ca = Ca::new("fusebox test CA");
    let a = ca.server("a.fusebox.test");
    let b = ca.server("b.fusebox.test");
    let cert = write(dir.path(), "a.pem", &a.cert).display().to_string();
    let key = write(dir.path(), "b.key", &b.key).display().to_string();
    let err = refused_start(&["--tls-cert", &cert, "--tls-key", &key], None).await;
    assert!(
        err.contains("[tls] key:") && err.contains("is not the key of the certificate"),
        "{err}"
    );

    let config = write(
        dir.path(),
        "fusebox.toml",
        "[tls]\ncert = \"a.pem\"\nkey = \"b.key\"\nclient_auth = \"required\"\n",
    )
    .display()
    .to_string();
    let err = refused_start(&["--config", &config], None).await;
    assert!(err.contains("[tls]: client_auth: needs client_ca"), "{err}");
}

#[tokio::test]
async fn a_replaced_certificate_serves_new_connections_and_a_broken_one_is_refused() {
    let (dir, ca) = certified("a.fusebox.test");
    let server = start(dir.path(), &[]).await;
    let names = served_names(&server.addr, &ca.pem())
        .await
        .expect("a handshake");
    assert!(names.contains(&"a.fusebox.test".to_owned()), "{names:?}");
    let before = channel(&server, &ca.pem(), None)
        .await
        .expect("a connection before the change");
    get_on(before.clone()).await.expect("answered");

    let b = ca.server("b.fusebox.test");
    replace_pair(dir.path(), &b);
    until_served(&server, &ca.pem(), "b.fusebox.test").await;
    get_on(before.clone())
        .await
        .expect("the connection opened before the change still works");
    let logs = server.logs();
    assert!(
        logs.contains("TLS certificate reloaded: subject CN=b.fusebox.test"),
        "{logs}"
    );

    // A broken pair (a certificate that is not PEM) is refused; B stays.
    replace(dir.path(), "server.pem", "not a certificate\n");
    server
        .until_logged("TLS certificate not reloaded, the running one stays: [tls] cert:")
        .await;
    let names = served_names(&server.addr, &ca.pem())
        .await
        .expect("a handshake after the broken change");
    assert!(names.contains(&"b.fusebox.test".to_owned()), "{names:?}");
    get_over_tls(&server, &ca.pem(), None)
        .await
        .expect("new connections are still answered");

    // A key that does not match: refused too; then a good pair is taken again.
    let c = ca.server("c.fusebox.test");
    replace(dir.path(), "server.pem", &c.cert);
    server
        .until_logged("is not the key of the certificate")
        .await;
    let names = served_names(&server.addr, &ca.pem())
        .await
        .expect("a handshake");
    assert!(names.contains(&"b.fusebox.test".to_owned()), "{names:?}");
    replace(dir.path(), "server.key", &c.key);
    until_served(&server, &ca.pem(), "c.fusebox.test").await;

    // The metrics count both reloads taken and the refused changes, and
    // show when the served certificate expires.
    let http = server.http_addr.clone().expect("an HTTP address");
    let metrics = https_get(&http, &ca.pem(), "/metrics")
        .await
        .expect("metrics over HTTPS");
    let value = |name: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("{name} in /metrics: {metrics}"))
    };
    assert_eq!(value("fusebox_tls_reloads_total"), 2.0);
    assert!(value("fusebox_tls_reload_failures_total") >= 1.0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(value("fusebox_tls_certificate_expiry_seconds") > now);
}

#[tokio::test]
async fn a_replaced_client_ca_bundle_decides_new_handshakes() {
    let (dir, ca) = certified("server.fusebox.test");
    let old = Ca::new("old client CA");
    let new = Ca::new("new client CA");
    let bundle = write(dir.path(), "clients.pem", &old.pem())
        .display()
        .to_string();
    let server = start(dir.path(), &["--tls-client-ca", &bundle]).await;
    let old_client = old.issue("old", &[]);
    let new_client = new.issue("new", &[]);
    get_over_tls(&server, &ca.pem(), Some(&old_client))
        .await
        .expect("the old CA's client is accepted");
    assert!(get_over_tls(&server, &ca.pem(), Some(&new_client))
        .await
        .is_err());
    replace(dir.path(), "clients.pem", &new.pem());
    eventually("the new CA's client is accepted", PATIENCE, || async {
        get_over_tls(&server, &ca.pem(), Some(&new_client))
            .await
            .ok()
    })
    .await;
    assert!(
        get_over_tls(&server, &ca.pem(), Some(&old_client))
            .await
            .is_err(),
        "the old CA's client is refused once the bundle is replaced"
    );
}

#[tokio::test]
async fn http_is_served_over_tls_with_the_same_certificate() {
    let (dir, ca) = certified("server.fusebox.test");
    let server = start(dir.path(), &[]).await;
    let http = server.http_addr.clone().expect("an HTTP address");
    let reply = https_get(&http, &ca.pem(), "/healthz")
        .await
        .expect("HTTPS");
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(reply.ends_with("ok\n"), "{reply}");
    let reply = https_get(&http, &ca.pem(), "/metrics")
        .await
        .expect("HTTPS");
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(reply.contains("fusebox_"), "{reply}");
    let plain = http_get(&http, "/healthz").await;
    assert!(
        !plain.as_deref().unwrap_or("").starts_with("HTTP/1.1 200"),
        "plain HTTP is not answered on a TLS port: {plain:?}"
    );

    // A connection kept open across a certificate change goes on with the
    // certificate it began with; new connections get the new one.
    let tcp = tokio::net::TcpStream::connect(&http)
        .await
        .expect("connects");
    let mut kept = connector(&ca.pem(), None, b"http/1.1")
        .connect(ServerName::try_from("localhost").expect("a name"), tcp)
        .await
        .expect("a handshake");
    let get = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n";
    kept.write_all(get).await.expect("sent");
    let (head, body) = response(&mut kept).await.expect("a response");
    assert!(
        head.starts_with("HTTP/1.1 200") && body == "ok\n",
        "{head}{body}"
    );
    let b = ca.server("b.fusebox.test");
    replace_pair(dir.path(), &b);
    until_served(&server, &ca.pem(), "b.fusebox.test").await;
    kept.write_all(get).await.expect("sent again");
    let (head, body) = response(&mut kept).await.expect("a second response");
    assert!(
        head.starts_with("HTTP/1.1 200") && body == "ok\n",
        "{head}{body}"
    );
    let names = fusebox::tls::names_of(&kept.get_ref().1.peer_certificates().expect("certs")[0]);
    assert!(
        names.contains(&"server.fusebox.test".to_owned()),
        "{names:?}"
    );
}

#[cfg(unix)]
#[tokio::test]
async fn sighup_does_not_stop_a_tls_server_without_a_config_file() {
    let (dir, ca) = certified("a.fusebox.test");
    let server = start(dir.path(), &[]).await;
    let b = ca.server("b.fusebox.test");
    replace_pair(dir.path(), &b);
    server.signal("HUP");
    until_served(&server, &ca.pem(), "b.fusebox.test").await;
    get_over_tls(&server, &ca.pem(), None)
        .await
        .expect("the server still answers after SIGHUP");
}

/// Runs `fusebox get tls/k --server ADDR` with the TLS flags `tls` (none
/// from the environment): success, standard output, standard error.
async fn cli(addr: &str, tls: &[&str]) -> (bool, String, String) {
    let out = tokio::process::Command::new(BIN)
        .args(["get", "tls/k", "--server", addr])
        .args(tls)
        .env_remove("FUSEBOX_TLS_CA")
        .env_remove("FUSEBOX_TLS_CERT")
        .env_remove("FUSEBOX_TLS_KEY")
        .env_remove("FUSEBOX_TLS_SERVER_NAME")
        .output()
        .await
        .expect("fusebox runs");
    crate::process::said(&out)
}

#[tokio::test]
async fn the_cli_calls_a_tls_server_with_its_tls_flags() {
    let (dir, ca) = certified("server.fusebox.test");
    let other = Ca::new("another CA");
    let clients = Ca::new("client CA");
    let ca_file = write(dir.path(), "ca.pem", &ca.pem()).display().to_string();
    let other_file = write(dir.path(), "other.pem", &other.pem())
        .display()
        .to_string();
    let server = start(dir.path(), &[]).await;
    let addr = server.addr.as_str();

    let (ok, out, err) = cli(addr, &["--tls-ca", &ca_file]).await;
    assert!(ok, "{err}");
    assert!(out.contains("tls/k"), "{out}");

    let (ok, _, err) = cli(addr, &[]).await;
    assert!(!ok);
    assert!(
        err.contains("if it serves TLS, pass --tls-ca FILE"),
        "{err}"
    );

    let (ok, _, err) = cli(addr, &["--tls-ca", &other_file]).await;
    assert!(!ok);
    assert!(
        err.contains("the server's certificate is not signed by --tls-ca FILE"),
        "{err}"
    );

    // Mutual TLS: without a client certificate the CLI says what to pass.
    let dir2 = tempfile::tempdir().expect("a temp dir");
    install(dir2.path(), &ca.server("server.fusebox.test"));
    let bundle = write(dir2.path(), "clients.pem", &clients.pem())
        .display()
        .to_string();
    let mutual = start(dir2.path(), &["--tls-client-ca", &bundle]).await;
    let (ok, _, err) = cli(&mutual.addr, &["--tls-ca", &ca_file]).await;
    assert!(!ok);
    assert!(
        err.contains("client certificate: pass --tls-cert and --tls-key"),
        "{err}"
    );
    let (cert, key) = write_pair(dir2.path(), "me", &clients.issue("operator", &[]));
    let (ok, out, err) = cli(
        &mutual.addr,
        &["--tls-ca", &ca_file, "--tls-cert", &cert, "--tls-key", &key],
    )
    .await;
    assert!(ok, "{err}");
    assert!(out.contains("tls/k"), "{out}");

    let (cert, key) = write_pair(dir2.path(), "stranger", &other.issue("operator", &[]));
    let (ok, _, err) = cli(
        &mutual.addr,
        &["--tls-ca", &ca_file, "--tls-cert", &cert, "--tls-key", &key],
    )
    .await;
    assert!(!ok);
    assert!(
        err.contains("the server refused this client's certificate"),
        "{err}"
    );
}

#[tokio::test]
async fn a_client_certificate_name_stands_for_its_auth_grant() {
    let (dir, ca) = certified("server.fusebox.test");
    let clients = Ca::new("client CA");
    let client_ca = write(dir.path(), "clients.pem", &clients.pem());
    let config = format!(
        "[tls]\ncert = \"server.pem\"\nkey = \"server.key\"\nclient_ca = \"{}\"\nclient_auth = \"optional\"\n\
         [auth]\n[[auth.client]]\nname = \"billing.internal\"\nrole = \"caller\"\nprefixes = [\"billing/*\"]\n\
         [[auth.client]]\nname = \"ops.internal\"\nrole = \"operator\"\n\
         [[auth.token]]\nname = \"oncall\"\nrole = \"operator\"\nsha256 = \"{}\"\n",
        client_ca.display(),
        fusebox::auth::hash_hex("oncall-token-0123456789")
    );
    let path = write(dir.path(), "fusebox.toml", &config);
    let path = path.display().to_string();
    let server = Server::start(Options {
        args: vec!["--config", &path],
        ..Options::default()
    })
    .await;
    let billing = clients.issue("billing-7", &["billing.internal"]);
    let stranger = clients.issue("someone", &["someone.internal"]);
    let acquire = |key: &str| crate::admin::one_permit(key);
    let mut as_billing = pb::fusebox_client::FuseboxClient::new(
        channel(&server, &ca.pem(), Some(&billing))
            .await
            .expect("connects"),
    );
    as_billing
        .acquire(acquire("billing/charge"))
        .await
        .expect("the certificate's name is a caller on billing/*");
    let other = as_billing
        .acquire(acquire("payments/charge"))
        .await
        .unwrap_err();
    assert_eq!(other.code(), tonic::Code::PermissionDenied, "{other:?}");
    let isolate = pb::admin_client::AdminClient::new(
        channel(&server, &ca.pem(), Some(&billing))
            .await
            .expect("connects"),
    )
    .isolate(pb::IsolateRequest {
        key: "billing/charge".into(),
        reason: "no".into(),
    })
    .await
    .unwrap_err();
    assert_eq!(
        isolate.code(),
        tonic::Code::PermissionDenied,
        "a caller may not isolate"
    );
    // A signed certificate without an entry is no credential at all.
    let unknown = pb::fusebox_client::FuseboxClient::new(
        channel(&server, &ca.pem(), Some(&stranger))
            .await
            .expect("connects"),
    )
    .acquire(acquire("billing/charge"))
    .await
    .unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::Unauthenticated, "{unknown:?}");
    assert!(unknown.message().contains("someone"), "{unknown:?}");
    // Issue 18, mTLS names: a bare common name is no identity (SANs are
    // what the CA checks), and names that match different entries are
    // refused as ambiguous, whatever their order in the certificate.
    for (pair, says) in [
        (clients.issue("ops.internal", &[]), "client_common_name"),
        (
            clients.issue("x", &["billing.internal", "ops.internal"]),
            "different [[auth.client]] entries",
        ),
        (
            clients.issue("x", &["ops.internal", "billing.internal"]),
            "different [[auth.client]] entries",
        ),
    ] {
        let refused = pb::fusebox_client::FuseboxClient::new(
            channel(&server, &ca.pem(), Some(&pair))
                .await
                .expect("connects"),
        )
        .acquire(acquire("billing/charge"))
        .await
        .unwrap_err();
        assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");
        assert!(refused.message().contains(says), "{refused:?}");
    }
    // A bearer token wins over the certificate.
    let mut request = tonic::Request::new(pb::IsolateRequest {
        key: "billing/charge".into(),
        reason: "drill".into(),
    });
    request.metadata_mut().insert(
        "authorization",
        "Bearer oncall-token-0123456789".parse().unwrap(),
    );
    let state = pb::admin_client::AdminClient::new(
        channel(&server, &ca.pem(), Some(&billing))
            .await
            .expect("connects"),
    )
    .isolate(request)
    .await
    .expect("the operator token isolates")
    .into_inner();
    assert_eq!(state.phase, pb::Phase::Isolated as i32);
}

#[tokio::test]
async fn the_rust_guard_calls_over_tls_and_an_untrusted_server_counts_as_unavailable() {
    use fusebox::guard::{CallOptions, FailPolicy, Guard, GuardError, GuardOptions};

    let (dir, ca) = certified("server.fusebox.test");
    let other = Ca::new("another CA");
    let server = start(dir.path(), &[]).await;
    let options = GuardOptions {
        // The first call makes the TLS handshake; a debug build on a busy
        // machine may need more than the default 50 ms.
        deadline: Duration::from_secs(5),
        on_unavailable: FailPolicy::Closed,
        ..GuardOptions::default()
    };
    let tls = |ca: &str| {
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(ca))
            .domain_name("localhost")
    };
    let url = format!("https://{}", server.addr);

    let guard = Guard::connect(&url, Some(tls(&ca.pem())), options.clone()).expect("a guard");
    let answer: Result<&str, GuardError<String>> = guard
        .run("tls/k", &CallOptions::default(), || async { Ok("done") })
        .await;
    assert_eq!(answer.expect("granted over TLS"), "done");
    assert_eq!(guard.stats().unavailable, 0);
    guard.flush().await.expect("the outcome is answered");
    let channel = channel(&server, &ca.pem(), None).await.expect("a channel");
    let state =
        crate::process::get_key(&mut pb::admin_client::AdminClient::new(channel), "tls/k").await;
    assert_eq!(state.stats.unwrap_or_default().successes, 1);

    let untrusting = Guard::connect(&url, Some(tls(&other.pem())), options).expect("a guard");
    let answer: Result<(), GuardError<String>> = untrusting
        .run("tls/k", &CallOptions::default(), || async { Ok(()) })
        .await;
    assert!(
        matches!(answer, Err(GuardError::Unavailable(_))),
        "{answer:?}"
    );
    assert_eq!(untrusting.stats().failed_closed, 1);
}

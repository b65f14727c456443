//! TLS for the gRPC and HTTP ports (`[tls]`, `--tls-cert`, `--tls-key`,
//! `--tls-client-ca`), with rustls.
//!
//! [`Tls`] holds the server's certificate and key, and with `client_ca` the
//! verifier of client certificates (mutual TLS). [`Tls::watch`] re-reads the
//! files every [`POLL_EVERY`] and on SIGHUP: a good new pair serves every new
//! connection from then on (open connections keep theirs); a broken one is
//! logged and the running pair stays. An [`Acceptor`] is one port's
//! handshake (its ALPN protocols) over a shared [`Tls`]; after the handshake,
//! [`identity_of`] gives the client certificate's names ([`ClientIdentity`]).
//!
//! Shared by [`crate::server`] and [`crate::http`], so it imports neither.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, ServerConnection, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{
    DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig, SignatureScheme,
};
use serde::Deserialize;
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

/// Whether a client must show a certificate (with `[tls] client_ca`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClientAuth {
    /// Connections without a client certificate signed by `client_ca` are refused.
    #[default]
    Required,
    /// A client may connect without a certificate; one it shows must be
    /// signed by `client_ca`.
    Optional,
}

/// Validated `[tls]`, with the paths resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsConfig {
    /// The certificate chain file.
    pub cert: PathBuf,
    /// The private key file.
    pub key: PathBuf,
    /// The client CA bundle; `Some` means mutual TLS.
    pub client_ca: Option<PathBuf>,
    /// Whether clients must show a certificate (meaningful with `client_ca`).
    pub client_auth: ClientAuth,
    /// Serve the HTTP port over TLS too.
    pub http: bool,
}

/// How often the certificate, key and client CA files are checked for changes.
pub const POLL_EVERY: Duration = Duration::from_secs(1);

/// How long changed files must stay the same before they are loaded, so
/// that a file caught while being written, or a certificate replaced a
/// moment before its key, is not taken for the new pair.
pub const SETTLE: Duration = Duration::from_millis(200);

/// A certificate closer than this to its expiry is warned about.
pub const EXPIRY_WARNING: Duration = Duration::from_secs(14 * 24 * 3600);

/// Longest a client may take over its TLS handshake before the connection is closed.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// ALPN for the gRPC port: HTTP/2 only.
pub const ALPN_GRPC: &[&[u8]] = &[b"h2"];

/// ALPN for the HTTP port: HTTP/1.1.
pub const ALPN_HTTP: &[&[u8]] = &[b"http/1.1"];

/// TLS that cannot be set up, in words that name the field and the file.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct TlsError(String);

/// Who a client is by its certificate (mutual TLS): its DNS and URI
/// subject alternative names, and apart, its subject's common names (a
/// name only where `[auth] client_common_name` says so).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct ClientIdentity {
    /// The DNS and URI names, in the certificate's order, each once.
    pub names: Vec<String>,
    /// The subject's common names.
    pub common_names: Vec<String>,
}

impl ClientIdentity {
    /// How a person knows the certificate, for records: its common name,
    /// else its first DNS or URI name.
    pub fn label(&self) -> Option<&String> {
        self.common_names.first().or(self.names.first())
    }
}

/// The names of the certificate `cert_der` (DER): its DNS and URI subject
/// alternative names, each once, then its subject common names not among
/// them. Empty when the certificate cannot be parsed.
pub fn names_of(cert_der: &[u8]) -> Vec<String> {
    let id = identity_of_der(cert_der);
    let mut names = id.names;
    names.extend(id.common_names);
    names
}

/// The identity in the certificate `cert_der` (DER).
pub fn identity_of_der(cert_der: &[u8]) -> ClientIdentity {
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(cert_der) else {
        return ClientIdentity::default();
    };
    let mut names: Vec<String> = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            match name {
                x509_parser::extensions::GeneralName::DNSName(n)
                | x509_parser::extensions::GeneralName::URI(n)
                    if !n.is_empty() && !names.iter().any(|m| m == n) =>
                {
                    names.push((*n).to_owned());
                }
                _ => {}
            }
        }
    }
    let mut common_names: Vec<String> = Vec::new();
    for cn in cert.subject().iter_common_name() {
        if let Ok(text) = cn.as_str() {
            if !text.is_empty() && !names.iter().chain(&common_names).any(|n| n == text) {
                common_names.push(text.to_owned());
            }
        }
    }
    ClientIdentity {
        names,
        common_names,
    }
}

/// The identity of the client of an accepted connection, if it showed a certificate.
pub fn identity_of(connection: &ServerConnection) -> Option<ClientIdentity> {
    let leaf = connection.peer_certificates()?.first()?;
    Some(identity_of_der(leaf))
}

/// A certificate's subject and expiry, for the log.
fn describe(cert_der: &[u8]) -> String {
    match x509_parser::parse_x509_certificate(cert_der) {
        Ok((_, cert)) => {
            let names = names_of(cert_der);
            format!(
                "subject {}, expires {}, names [{}]",
                cert.subject(),
                cert.validity().not_after,
                names.join(", ")
            )
        }
        Err(_) => "a certificate that cannot be parsed".to_owned(),
    }
}

/// A warning for a certificate that has expired, is not valid yet, or
/// expires within [`EXPIRY_WARNING`].
pub fn expiry_warning(cert_der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(cert_der).ok()?;
    let validity = cert.validity();
    let subject = cert.subject();
    if !validity.is_valid() {
        return Some(format!(
            "the TLS certificate {subject} is not valid now (valid from {} to {}): clients will refuse it; replace the files",
            validity.not_before, validity.not_after
        ));
    }
    let left = validity.time_to_expiration()?;
    (left.whole_seconds() < EXPIRY_WARNING.as_secs() as i64).then(|| {
        format!(
            "the TLS certificate {subject} expires in {} hours ({}): replace the files before then",
            left.whole_hours(),
            validity.not_after
        )
    })
}

/// The bytes of the files, as last read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Files {
    cert: Vec<u8>,
    key: Vec<u8>,
    client_ca: Option<Vec<u8>>,
}

/// The certificate, key and client verifier in force, reloaded when their files change.
pub struct Tls {
    config: TlsConfig,
    provider: Arc<CryptoProvider>,
    key: RwLock<Arc<CertifiedKey>>,
    verifier: Option<RwLock<Arc<dyn ClientCertVerifier>>>,
    /// The files as last tried, good or bad: a broken pair is reported once.
    tried: Mutex<Files>,
    reloads: AtomicU64,
    reload_failures: AtomicU64,
    handshake_failures: AtomicU64,
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// What a look at the files found.
#[derive(Debug, PartialEq, Eq)]
pub enum Reload {
    /// The files are as last tried.
    Unchanged,
    /// A new pair (or client CA bundle) is in force; the words describe it.
    Reloaded(String),
    /// The new files cannot be used; the running ones stay.
    Failed(String),
}

fn read(field: &str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|e| {
        TlsError(format!(
            "[tls] {field}: cannot read {}: {e}",
            path.display()
        ))
    })
}

impl Tls {
    /// Reads and checks the files of `config`.
    pub fn load(config: &TlsConfig) -> Result<Arc<Tls>, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let files = Tls::read_files(config)?;
        let key = Tls::certified_key(config, &provider, &files)?;
        let verifier = match &files.client_ca {
            Some(pem) => Some(RwLock::new(Tls::client_verifier(config, &provider, pem)?)),
            None => None,
        };
        Ok(Arc::new(Tls {
            config: config.clone(),
            provider,
            key: RwLock::new(key),
            verifier,
            tried: Mutex::new(files),
            reloads: AtomicU64::new(0),
            reload_failures: AtomicU64::new(0),
            handshake_failures: AtomicU64::new(0),
        }))
    }

    /// The settings.
    pub fn config(&self) -> &TlsConfig {
        &self.config
    }

    /// True with mutual TLS (`client_ca` set).
    pub fn is_mutual(&self) -> bool {
        self.verifier.is_some()
    }

    /// The certificate in force, described for the log.
    pub fn describe(&self) -> String {
        let key = self.key.read().unwrap_or_else(|e| e.into_inner()).clone();
        key.cert.first().map_or_else(String::new, |c| describe(c))
    }

    /// A warning when the certificate in force has expired or expires soon.
    pub fn expiry_warning(&self) -> Option<String> {
        let key = self.key.read().unwrap_or_else(|e| e.into_inner()).clone();
        expiry_warning(key.cert.first()?)
    }

    /// When the certificate in force expires, in seconds since the Unix
    /// epoch (for a `fusebox_tls_certificate_expiry_seconds` gauge).
    pub fn expires_at(&self) -> Option<i64> {
        let key = self.key.read().unwrap_or_else(|e| e.into_inner()).clone();
        let (_, cert) = x509_parser::parse_x509_certificate(key.cert.first()?).ok()?;
        Some(cert.validity().not_after.timestamp())
    }

    /// Reloads so far, failed reloads, and failed handshakes.
    pub fn figures(&self) -> (u64, u64, u64) {
        (
            self.reloads.load(Ordering::Relaxed),
            self.reload_failures.load(Ordering::Relaxed),
            self.handshake_failures.load(Ordering::Relaxed),
        )
    }

    fn read_files(config: &TlsConfig) -> Result<Files, TlsError> {
        Ok(Files {
            cert: read("cert", &config.cert)?,
            key: read("key", &config.key)?,
            client_ca: match &config.client_ca {
                Some(path) => Some(read("client_ca", path)?),
                None => None,
            },
        })
    }

    fn certified_key(
        config: &TlsConfig,
        provider: &CryptoProvider,
        files: &Files,
    ) -> Result<Arc<CertifiedKey>, TlsError> {
        let cert_path = config.cert.display();
        let key_path = config.key.display();
        let chain = CertificateDer::pem_slice_iter(&files.cert)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| {
                TlsError(format!(
                    "[tls] cert: {cert_path} is not a valid PEM certificate chain: {e}"
                ))
            })?;
        if chain.is_empty() {
            return Err(TlsError(format!(
                "[tls] cert: {cert_path} holds no certificate: expected PEM blocks `-----BEGIN CERTIFICATE-----`, the server's certificate first"
            )));
        }
        if let Err(e) = x509_parser::parse_x509_certificate(&chain[0]) {
            return Err(TlsError(format!(
                "[tls] cert: the first certificate in {cert_path} cannot be parsed: {e}"
            )));
        }
        let key = PrivateKeyDer::from_pem_slice(&files.key).map_err(|e| {
            TlsError(format!(
                "[tls] key: {key_path} holds no usable private key ({e}): expected a PEM block `-----BEGIN PRIVATE KEY-----` (or RSA / EC PRIVATE KEY)"
            ))
        })?;
        CertifiedKey::from_der(chain, key, provider)
            .map(Arc::new)
            .map_err(|e| match e {
                rustls::Error::InconsistentKeys(_) => TlsError(format!(
                    "[tls] key: {key_path} is not the key of the certificate in {cert_path}: replace both files together"
                )),
                e => TlsError(format!("[tls] key: {key_path} cannot be used: {e}")),
            })
    }

    fn client_verifier(
        config: &TlsConfig,
        provider: &Arc<CryptoProvider>,
        pem: &[u8],
    ) -> Result<Arc<dyn ClientCertVerifier>, TlsError> {
        let path = config
            .client_ca
            .as_deref()
            .map_or_else(String::new, |p| p.display().to_string());
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(pem) {
            let cert = cert.map_err(|e| {
                TlsError(format!(
                    "[tls] client_ca: {path} is not a valid PEM bundle: {e}"
                ))
            })?;
            roots.add(cert).map_err(|e| {
                TlsError(format!(
                    "[tls] client_ca: a certificate in {path} cannot be used as a CA: {e}"
                ))
            })?;
        }
        if roots.is_empty() {
            return Err(TlsError(format!(
                "[tls] client_ca: {path} holds no certificate: expected PEM blocks `-----BEGIN CERTIFICATE-----`"
            )));
        }
        let builder =
            WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone());
        let builder = match config.client_auth {
            ClientAuth::Required => builder,
            ClientAuth::Optional => builder.allow_unauthenticated(),
        };
        builder
            .build()
            .map_err(|e| TlsError(format!("[tls] client_ca: {path}: {e}")))
    }

    /// Reads the files again; when they changed since last tried, puts the
    /// new pair (and client CA bundle) in force if they are good.
    pub fn reload(&self) -> Reload {
        let files = match Tls::read_files(&self.config) {
            Ok(files) => files,
            Err(e) => {
                // A file that is missing for a moment (replaced by a rename)
                // is reported once, like any broken pair.
                let mut tried = self.tried.lock().unwrap_or_else(|e| e.into_inner());
                let marker = Files {
                    cert: e.0.clone().into_bytes(),
                    key: Vec::new(),
                    client_ca: None,
                };
                if *tried == marker {
                    return Reload::Unchanged;
                }
                *tried = marker;
                self.reload_failures.fetch_add(1, Ordering::Relaxed);
                return Reload::Failed(e.0);
            }
        };
        if *self.tried.lock().unwrap_or_else(|e| e.into_inner()) == files {
            return Reload::Unchanged;
        }
        // Changed: load only what stays the same for a moment (this runs on
        // a blocking thread).
        std::thread::sleep(SETTLE);
        if Tls::read_files(&self.config).ok().as_ref() != Some(&files) {
            return Reload::Unchanged;
        }
        let mut tried = self.tried.lock().unwrap_or_else(|e| e.into_inner());
        let result = (|| {
            let key = Tls::certified_key(&self.config, &self.provider, &files)?;
            let verifier = match (&files.client_ca, &self.verifier) {
                (Some(pem), Some(_)) => {
                    Some(Tls::client_verifier(&self.config, &self.provider, pem)?)
                }
                _ => None,
            };
            Ok::<_, TlsError>((key, verifier))
        })();
        *tried = files;
        match result {
            Ok((key, verifier)) => {
                let described = key.cert.first().map_or_else(String::new, |c| describe(c));
                *self.key.write().unwrap_or_else(|e| e.into_inner()) = key;
                if let (Some(new), Some(slot)) = (verifier, &self.verifier) {
                    *slot.write().unwrap_or_else(|e| e.into_inner()) = new;
                }
                self.reloads.fetch_add(1, Ordering::Relaxed);
                Reload::Reloaded(described)
            }
            Err(e) => {
                self.reload_failures.fetch_add(1, Ordering::Relaxed);
                Reload::Failed(e.0)
            }
        }
    }

    /// Reloads on SIGHUP and whenever the files change (checked every
    /// [`POLL_EVERY`]); runs until the task is dropped. Call it within a
    /// runtime: the SIGHUP handler is installed before this returns.
    pub fn watch(self: Arc<Self>) -> impl std::future::Future<Output = ()> {
        let mut hangup = Hangup::install();
        async move {
            let mut tick = tokio::time::interval(POLL_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    () = hangup.next() => {}
                }
                let this = self.clone();
                let outcome = match tokio::task::spawn_blocking(move || this.reload()).await {
                    Ok(outcome) => outcome,
                    Err(_) => continue,
                };
                match outcome {
                    Reload::Unchanged => {}
                    Reload::Reloaded(what) => {
                        tracing::info!("TLS certificate reloaded: {what}; new connections use it");
                        if let Some(warning) = self.expiry_warning() {
                            tracing::warn!("{warning}");
                        }
                    }
                    Reload::Failed(why) => tracing::error!(
                        "TLS certificate not reloaded, the running one stays: {why}"
                    ),
                }
            }
        }
    }

    /// A handshake for one port, offering `alpn` (e.g. [`ALPN_GRPC`]).
    pub fn acceptor(self: &Arc<Self>, alpn: &[&[u8]]) -> Acceptor {
        let builder = ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()
            .expect("the ring provider supports the default TLS versions");
        let builder = match &self.verifier {
            Some(_) => builder.with_client_cert_verifier(Arc::new(Verifier(self.clone()))),
            None => builder.with_no_client_auth(),
        };
        let mut config = builder.with_cert_resolver(Arc::new(Resolver(self.clone())));
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Acceptor {
            inner: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
            tls: self.clone(),
        }
    }
}

/// SIGHUP, on which the certificates and the config are reloaded. It
/// never comes off Unix, nor when its handler could not be installed.
#[derive(Debug)]
pub(crate) struct Hangup {
    #[cfg(unix)]
    signal: Option<tokio::signal::unix::Signal>,
}

impl Hangup {
    /// Installs the handler (which also keeps SIGHUP's default action
    /// from ending the process). Call it within a runtime.
    pub(crate) fn install() -> Hangup {
        Hangup {
            #[cfg(unix)]
            signal: tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok(),
        }
    }

    /// Returns when the next SIGHUP comes.
    pub(crate) async fn next(&mut self) {
        #[cfg(unix)]
        if let Some(signal) = self.signal.as_mut() {
            signal.recv().await;
            return;
        }
        std::future::pending::<()>().await
    }
}

/// Serves the certificate in force.
#[derive(Debug)]
struct Resolver(Arc<Tls>);

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.key.read().unwrap_or_else(|e| e.into_inner()).clone())
    }
}

/// Checks client certificates against the client CA bundle in force.
#[derive(Debug)]
struct Verifier(Arc<Tls>);

impl Verifier {
    fn current(&self) -> Arc<dyn ClientCertVerifier> {
        match &self.0.verifier {
            Some(v) => v.read().unwrap_or_else(|e| e.into_inner()).clone(),
            None => unreachable!("a Verifier is only made with a client CA bundle"),
        }
    }
}

impl ClientCertVerifier for Verifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        self.0.config.client_auth == ClientAuth::Required
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        // The bundle can change under a borrowed list: no hints, so a
        // client offers whichever certificate it has.
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.current()
            .verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.current().verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.current().verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.current().supported_verify_schemes()
    }
}

/// The TLS handshake of one port.
#[derive(Clone)]
pub struct Acceptor {
    inner: tokio_rustls::TlsAcceptor,
    tls: Arc<Tls>,
}

impl fmt::Debug for Acceptor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Acceptor").field("tls", &self.tls).finish()
    }
}

impl Acceptor {
    /// Loads `config`'s files and makes a handshake offering `alpn`. For
    /// both ports, load a [`Tls`] once and call [`Tls::acceptor`] twice, so
    /// that one [`Tls::watch`] reloads both.
    pub fn from_config(config: &TlsConfig, alpn: &[&[u8]]) -> Result<Acceptor, TlsError> {
        Ok(Tls::load(config)?.acceptor(alpn))
    }

    /// The certificates this handshake uses.
    pub fn tls(&self) -> &Arc<Tls> {
        &self.tls
    }

    /// The TLS handshake on `stream`, within [`HANDSHAKE_TIMEOUT`]. A
    /// failure is counted, and logged now and then (a client without TLS, a
    /// client that does not trust the certificate, a missing or unknown
    /// client certificate).
    pub async fn accept(&self, stream: TcpStream) -> io::Result<TlsStream<TcpStream>> {
        let peer = stream.peer_addr().ok();
        let result = match tokio::time::timeout(HANDSHAKE_TIMEOUT, self.inner.accept(stream)).await
        {
            Ok(result) => result,
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "the client did not finish the TLS handshake within {} s",
                    HANDSHAKE_TIMEOUT.as_secs()
                ),
            )),
        };
        match result {
            Ok(stream) => {
                if let Some(identity) = identity_of(stream.get_ref().1) {
                    tracing::debug!(peer = ?peer, names = ?identity.names, "client identity");
                }
                Ok(stream)
            }
            Err(e) => {
                let failed = self.tls.handshake_failures.fetch_add(1, Ordering::Relaxed);
                if failed == 0 || (failed + 1).is_power_of_two() {
                    tracing::warn!(
                        peer = ?peer,
                        failures = failed + 1,
                        "TLS handshake failed: {e} (a client without TLS, one that does not trust this certificate, or one without an accepted client certificate)"
                    );
                } else {
                    tracing::debug!(peer = ?peer, "TLS handshake failed: {e}");
                }
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn certificate(cn: Option<&str>, sans: &[String]) -> Vec<u8> {
        let mut params = rcgen::CertificateParams::default();
        for san in sans {
            let ia5 = san.clone().try_into().expect("an IA5 string");
            params.subject_alt_names.push(if san.contains("://") {
                rcgen::SanType::URI(ia5)
            } else if let Ok(ip) = san.parse() {
                rcgen::SanType::IpAddress(ip)
            } else {
                rcgen::SanType::DnsName(ia5)
            });
        }
        params.subject_alt_names.push(rcgen::SanType::Rfc822Name(
            "ops@fusebox.test".try_into().expect("an IA5 string"),
        ));
        params.distinguished_name = rcgen::DistinguishedName::new();
        if let Some(cn) = cn {
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, cn);
        }
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "not a name");
        let key = rcgen::KeyPair::generate().expect("a key");
        params
            .self_signed(&key)
            .expect("a certificate")
            .der()
            .to_vec()
    }

    #[test]
    fn expired_and_soon_expiring_certificates_are_warned_about() {
        let key = rcgen::KeyPair::generate().expect("a key");
        let mut params =
            rcgen::CertificateParams::new(vec!["svc.test".to_owned()]).expect("params");
        let lasting = params.self_signed(&key).expect("a certificate");
        assert_eq!(expiry_warning(lasting.der()), None);

        params.not_before = rcgen::date_time_ymd(2000, 1, 1);
        params.not_after = rcgen::date_time_ymd(2001, 1, 1);
        let expired = params.self_signed(&key).expect("a certificate");
        let warning = expiry_warning(expired.der()).expect("a warning");
        assert!(warning.contains("is not valid now"), "{warning}");

        params.not_before = std::time::SystemTime::now().into();
        params.not_after = params.not_before + Duration::from_secs(2 * 24 * 3600);
        let soon = params.self_signed(&key).expect("a certificate");
        let warning = expiry_warning(soon.der()).expect("a warning");
        assert!(warning.contains("expires in 4"), "{warning}");
    }

    #[test]
    fn reload_takes_a_good_pair_keeps_the_old_one_on_a_broken_pair_and_counts() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let pair = |name: &str| {
            let key = rcgen::KeyPair::generate().expect("a key");
            let params = rcgen::CertificateParams::new(vec![name.to_owned()]).expect("params");
            let cert = params.self_signed(&key).expect("a certificate");
            (cert.pem(), key.serialize_pem())
        };
        let config = TlsConfig {
            cert: dir.path().join("c.pem"),
            key: dir.path().join("k.pem"),
            client_ca: None,
            client_auth: ClientAuth::Required,
            http: true,
        };
        let (cert, key) = pair("a.test");
        std::fs::write(&config.cert, &cert).expect("written");
        std::fs::write(&config.key, &key).expect("written");
        let tls = Tls::load(&config).expect("loads");
        assert!(tls.describe().contains("a.test"), "{}", tls.describe());
        assert_eq!(tls.reload(), Reload::Unchanged);

        let (cert, key) = pair("b.test");
        std::fs::write(&config.cert, &cert).expect("written");
        std::fs::write(&config.key, &key).expect("written");
        assert!(matches!(tls.reload(), Reload::Reloaded(what) if what.contains("b.test")));

        std::fs::write(
            &config.key,
            "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
        )
        .expect("written");
        assert!(matches!(tls.reload(), Reload::Failed(why) if why.starts_with("[tls] key:")));
        assert_eq!(
            tls.reload(),
            Reload::Unchanged,
            "a broken pair is reported once"
        );
        assert!(tls.describe().contains("b.test"), "the running pair stays");

        std::fs::remove_file(&config.cert).expect("removed");
        assert!(
            matches!(tls.reload(), Reload::Failed(why) if why.contains("[tls] cert: cannot read"))
        );
        assert!(tls.describe().contains("b.test"));
        assert_eq!(tls.figures(), (1, 2, 0));
        assert!(tls.expires_at().is_some());
    }

    #[test]
    fn names_of_garbage_is_empty() {
        assert!(names_of(b"not a certificate").is_empty());
        assert!(names_of(&[]).is_empty());
    }

    #[test]
    fn ip_and_email_names_are_not_identities() {
        let der = certificate(None, &["10.0.0.1".to_owned(), "svc.test".to_owned()]);
        assert_eq!(names_of(&der), vec!["svc.test".to_owned()]);
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

        /// The DNS and URI names come first, in the certificate's order,
        /// each once, then the common name when it is not one of them;
        /// other subject parts are not names. The common name is kept
        /// apart in the identity (a name only where the config says so).
        #[test]
        fn names_are_the_dns_and_uri_names_then_the_common_name(
            cn in proptest::option::of("[a-z][a-z0-9-]{0,15}"),
            sans in proptest::collection::vec(
                prop_oneof![
                    "[a-z]{1,8}(\\.[a-z]{1,8}){0,2}\\.test",
                    "spiffe://fusebox\\.test/[a-z]{1,8}",
                ],
                0..5,
            ),
        ) {
            let der = certificate(cn.as_deref(), &sans);
            let mut expected: Vec<String> = Vec::new();
            for name in sans.iter() {
                if !expected.contains(name) {
                    expected.push(name.clone());
                }
            }
            let identity = identity_of_der(&der);
            prop_assert_eq!(&identity.names, &expected);
            let common: Vec<String> = cn.iter().filter(|c| !expected.contains(c)).cloned().collect();
            prop_assert_eq!(&identity.common_names, &common);
            expected.extend(common);
            prop_assert_eq!(names_of(&der), expected);
        }
    }
}

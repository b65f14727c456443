//! The connection to the store: one Redis server (a connection manager
//! that reconnects with backoff) or a Redis Cluster (the cluster client,
//! which follows MOVED and ASK). Every failure to reach the store becomes
//! [`EngineError::StoreUnavailable`] with words that say what happened;
//! refusals of the module map to the contract's errors.
//!
//! Every link to the store (the shared one, the confirmation links, the
//! cluster's links to each node, the subscription) is made from one
//! [`Reach`]: the same TLS settings and the same credentials. A password
//! is a [`Secret`]: it prints as `***` and is scrubbed from every message
//! built from a Redis error.

use std::fmt;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionManagerConfig;
use redis::{Cmd, ErrorKind, IntoConnectionInfo, RedisError, ServerErrorKind, Value};

use super::super::error::invalid;
use super::super::store::StoreFigures;
use super::super::EngineError;
use super::batch::{Batcher, Unsent};
use super::link::{Health, Link, Next};

/// How long one command may take before the call answers UNAVAILABLE.
const RESPONSE_TIMEOUT: Duration = Duration::from_millis(1000);

/// How long connecting to a node may take.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(1000);

/// While the link is down, the first wait between two probes; each wait
/// doubles up to [`PROBE_EVERY_MOST`].
const PROBE_EVERY_FIRST: Duration = Duration::from_millis(50);

/// While the link is down, the longest wait between two probes: a store
/// back is used again within about this long.
const PROBE_EVERY_MOST: Duration = Duration::from_secs(1);

/// How long one probe (a `PING`) may take.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// How long an operator action waits for a replica to confirm it.
const WAIT_FOR_REPLICA: Duration = Duration::from_millis(1000);

/// How long a probe waits for its replicas to confirm it before it is
/// given back (the caller is told to ask again).
pub const PROBE_WAIT: Duration = Duration::from_secs(2);

/// Links kept for confirmations (`FB.FENCE` + `WAIT`); more are made while
/// these are busy, and dropped after.
const CONFIRM_LINKS: usize = 4;

/// How long the cluster's layout (primaries, their slots and replicas)
/// serves before it is read again.
const TOPOLOGY_FOR: Duration = Duration::from_secs(2);

/// Text that is never shown: a password. Its `Debug` prints `***`, and it
/// has no `Display`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Arc<str>);

impl Secret {
    /// `text` as a secret.
    pub fn new(text: impl Into<Arc<str>>) -> Secret {
        Secret(text.into())
    }

    /// The text itself, to hand to Redis.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// Where the state is: `redis://HOST:PORT`, `rediss://HOST:PORT` (TLS),
/// `redis-cluster://HOST:PORT,HOST:PORT,...` or
/// `rediss-cluster://HOST:PORT,...` (TLS); `USER:PASSWORD@` may come
/// before the first node (it works, but process listings show it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreUrl {
    /// A Redis Cluster, reached through any of `nodes`.
    pub cluster: bool,
    /// Over TLS (`rediss://`, `rediss-cluster://`).
    pub tls: bool,
    /// `HOST:PORT` of the server, or of the cluster's seed nodes.
    pub nodes: Vec<String>,
    /// The user named in the URL, if any.
    pub user: Option<String>,
    /// The password written in the URL, if any (shown as `***`).
    pub password: Option<Secret>,
}

const STORE_FORMS: &str = "use redis://HOST:PORT (or rediss://HOST:PORT for TLS) for one Redis server, or redis-cluster://HOST:PORT,HOST:PORT (or rediss-cluster://...) for a Redis Cluster";

impl StoreUrl {
    /// Reads `--store`. Its errors never repeat a password written in it.
    pub fn parse(text: &str) -> Result<StoreUrl, String> {
        const WHAT: &str = STORE_FORMS;
        let schemes = [
            ("rediss-cluster://", true, true),
            ("redis-cluster://", true, false),
            ("rediss://", false, true),
            ("redis://", false, false),
        ];
        let Some((rest, cluster, tls)) = schemes
            .iter()
            .find_map(|(scheme, c, t)| text.strip_prefix(scheme).map(|rest| (rest, *c, *t)))
        else {
            return Err(format!(
                "{:?} is not a store address; {WHAT}",
                redacted(text)
            ));
        };
        let (user, password, rest) = match rest.rsplit_once('@') {
            Some((userinfo, hosts)) => {
                let (user, password) = match userinfo.split_once(':') {
                    Some((user, password)) => (user, Some(password)),
                    None => (userinfo, None),
                };
                let user = percent_decoded(user)
                    .ok_or("the user in the store's URL is not valid percent-encoded UTF-8")?;
                let password = password
                    .map(|p| {
                        percent_decoded(p).ok_or(
                            "the password in the store's URL is not valid percent-encoded UTF-8",
                        )
                    })
                    .transpose()?;
                (
                    (!user.is_empty()).then_some(user),
                    password.filter(|p| !p.is_empty()).map(Secret::new),
                    hosts,
                )
            }
            None => (None, None, rest),
        };
        let rest = rest.trim_end_matches('/');
        let nodes: Vec<String> = rest.split(',').map(str::trim).map(str::to_owned).collect();
        for node in &nodes {
            let ok = node.rsplit_once(':').is_some_and(|(host, port)| {
                !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0)
            });
            if !ok {
                return Err(format!("{node:?} is not HOST:PORT; {WHAT}"));
            }
        }
        if !cluster && nodes.len() != 1 {
            return Err(format!(
                "{} takes one HOST:PORT; {WHAT}",
                if tls { "rediss://" } else { "redis://" }
            ));
        }
        Ok(StoreUrl {
            cluster,
            tls,
            nodes,
            user,
            password,
        })
    }
}

/// `%XX` escapes decoded; `None` when they do not make UTF-8.
fn percent_decoded(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let mut byte = [0u8; 1];
            crate::domain::hex::decode_to_slice(bytes.get(i + 1..i + 3)?, &mut byte).ok()?;
            out.push(byte[0]);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// A store address as typed, with any password in it replaced by `***`,
/// for messages about an address that did not parse.
pub fn redacted(text: &str) -> String {
    let (scheme, rest) = match text.split_once("://") {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, text),
    };
    let rest = match rest.rsplit_once('@') {
        Some((userinfo, hosts)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{user}:***@{hosts}"),
            None => format!("{userinfo}@{hosts}"),
        },
        None => rest.to_owned(),
    };
    match scheme {
        Some(scheme) => format!("{scheme}://{rest}"),
        None => rest,
    }
}

impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = match (self.cluster, self.tls) {
            (true, true) => "rediss-cluster",
            (true, false) => "redis-cluster",
            (false, true) => "rediss",
            (false, false) => "redis",
        };
        write!(f, "{scheme}://")?;
        match (&self.user, &self.password) {
            (Some(user), Some(_)) => write!(f, "{user}:***@")?,
            (None, Some(_)) => write!(f, ":***@")?,
            (Some(user), None) => write!(f, "{user}@")?,
            (None, None) => {}
        }
        write!(f, "{}", self.nodes.join(","))
    }
}

/// TLS to the store, as PEM read from files at start-up: the CAs to trust
/// (the system's when `None`) and, for mutual TLS, this server's
/// certificate chain and key. The key never prints.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct StoreTls {
    /// CA certificates (PEM) that must have signed the store's certificate.
    pub ca: Option<Vec<u8>>,
    /// This server's certificate chain (PEM), for mutual TLS.
    pub cert: Option<Vec<u8>>,
    /// The private key (PEM) of `cert`.
    pub key: Option<Secret>,
}

impl fmt::Debug for StoreTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreTls")
            .field("ca", &self.ca.as_ref().map(|_| "set"))
            .field("cert", &self.cert.as_ref().map(|_| "set"))
            .field("key", &self.key)
            .finish()
    }
}

/// A file named by a flag or a setting, for messages that name both.
#[derive(Clone, Copy, Debug)]
pub struct Named<'a> {
    /// The flag or setting (`--store-tls-ca`).
    pub what: &'a str,
    /// The file.
    pub path: &'a Path,
}

impl Named<'_> {
    fn read(&self) -> Result<Vec<u8>, String> {
        std::fs::read(self.path).map_err(|e| {
            format!(
                "{} {}: cannot be read ({e}); check the path and that this user may read it",
                self.what,
                self.path.display()
            )
        })
    }
}

impl StoreTls {
    /// Reads the files; each must hold what it is for (PEM certificates, a
    /// PEM private key), and the certificate and the key come together.
    pub fn read(
        ca: Option<Named<'_>>,
        cert: Option<Named<'_>>,
        key: Option<Named<'_>>,
    ) -> Result<StoreTls, String> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let certificates = |named: Named<'_>| -> Result<Vec<u8>, String> {
            let pem = named.read()?;
            let found = CertificateDer::pem_slice_iter(&pem).collect::<Result<Vec<_>, _>>();
            match found {
                Ok(certs) if !certs.is_empty() => Ok(pem),
                Ok(_) => Err(format!(
                    "{} {}: holds no certificate; give a PEM file (-----BEGIN CERTIFICATE-----)",
                    named.what,
                    named.path.display()
                )),
                Err(e) => Err(format!(
                    "{} {}: is not PEM certificates ({e})",
                    named.what,
                    named.path.display()
                )),
            }
        };
        let ca = ca.map(certificates).transpose()?;
        let (cert, key) = match (cert, key) {
            (None, None) => (None, None),
            (Some(cert), None) => {
                return Err(format!(
                    "{} needs its private key too: pass --store-tls-key FILE",
                    cert.what
                ))
            }
            (None, Some(key)) => {
                return Err(format!(
                    "{} needs the certificate it belongs to: pass --store-tls-cert FILE",
                    key.what
                ))
            }
            (Some(cert), Some(key)) => {
                let chain = certificates(cert)?;
                let pem = key.read()?;
                PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
                    format!(
                        "{} {}: holds no PEM private key ({e})",
                        key.what,
                        key.path.display()
                    )
                })?;
                let pem = String::from_utf8(pem)
                    .map_err(|_| format!("{} {}: is not PEM text", key.what, key.path.display()))?;
                (Some(chain), Some(Secret::new(pem)))
            }
        };
        Ok(StoreTls { ca, cert, key })
    }

    /// Whether anything is set (and so TLS is wanted).
    pub fn is_set(&self) -> bool {
        self.ca.is_some() || self.cert.is_some()
    }

    fn certificates(&self) -> redis::TlsCertificates {
        redis::TlsCertificates {
            client_tls: match (&self.cert, &self.key) {
                (Some(cert), Some(key)) => Some(redis::ClientTlsConfig {
                    client_cert: cert.clone(),
                    client_key: key.expose().as_bytes().to_vec(),
                }),
                _ => None,
            },
            root_cert: self.ca.clone(),
        }
    }
}

/// Reads a password file: its text without the line ending after it; it
/// must hold one.
pub fn read_password(file: Named<'_>) -> Result<Secret, String> {
    let bytes = file.read()?;
    let text = String::from_utf8(bytes).map_err(|_| {
        format!(
            "{} {}: is not UTF-8 text; write the password alone in it",
            file.what,
            file.path.display()
        )
    })?;
    let password = text.trim_end_matches(['\n', '\r']);
    if password.is_empty() {
        return Err(format!(
            "{} {}: is empty; write the Redis password in it",
            file.what,
            file.path.display()
        ));
    }
    Ok(Secret::new(password))
}

/// How every link to the store is made: where, with which TLS settings,
/// as which user.
#[derive(Clone)]
pub(super) struct Reach {
    url: StoreUrl,
    tls: Option<redis::TlsCertificates>,
    user: Option<String>,
    password: Option<Secret>,
}

impl Reach {
    /// The store at `url` over `tls` (when the URL says TLS), logging in
    /// as `user` with `password` (when given).
    pub(super) fn new(
        url: &StoreUrl,
        tls: &StoreTls,
        user: Option<String>,
        password: Option<Secret>,
    ) -> Reach {
        Reach {
            url: url.clone(),
            tls: url.tls.then(|| tls.certificates()),
            user,
            password,
        }
    }

    /// The store's address, as given (passwords shown as `***`).
    pub(super) fn url(&self) -> &StoreUrl {
        &self.url
    }

    fn info(&self, node: &str) -> Result<redis::ConnectionInfo, RedisError> {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        // No CLIENT SETINFO: one command fewer for the ACL user to be
        // allowed (and Redis before 7.2 does not know it).
        let mut settings = redis::RedisConnectionInfo::default().set_skip_set_lib_name();
        if let Some(user) = &self.user {
            settings = settings.set_username(user);
        }
        if let Some(password) = &self.password {
            settings = settings.set_password(password.expose());
        }
        Ok(format!("{scheme}://{node}")
            .into_connection_info()?
            .set_redis_settings(settings))
    }

    /// A client of the one server (or the cluster node) at `node`.
    pub(super) fn client(&self, node: &str) -> Result<redis::Client, RedisError> {
        let info = self.info(node)?;
        match &self.tls {
            Some(certificates) => redis::Client::build_with_tls(info, certificates.clone()),
            None => redis::Client::open(info),
        }
    }

    fn cluster(&self) -> Result<redis::cluster::ClusterClient, RedisError> {
        let nodes = self
            .url
            .nodes
            .iter()
            .map(|n| self.info(n))
            .collect::<Result<Vec<_>, _>>()?;
        let mut builder = redis::cluster::ClusterClientBuilder::new(nodes)
            .connection_timeout(CONNECT_TIMEOUT)
            .response_timeout(RESPONSE_TIMEOUT)
            .retries(3);
        if let Some(certificates) = &self.tls {
            builder = builder.certs(certificates.clone());
        }
        builder.build()
    }

    /// `text` with the password, should it be in it, replaced by `***`.
    /// (Redis's errors do not quote it; this makes sure no message built
    /// from one ever does. A password of fewer than 4 characters is not
    /// looked for: it would blot out ordinary words.)
    pub(super) fn scrub(&self, text: impl fmt::Display) -> String {
        let text = text.to_string();
        match &self.password {
            Some(p) if p.expose().len() >= 4 && text.contains(p.expose()) => {
                text.replace(p.expose(), "***")
            }
            _ => text,
        }
    }
}

/// How many replicas must have a probe before it is handed out (B2 across
/// a failover).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ProbeReplicas {
    /// With Redis Cluster, one when the key's primary has a replica that is
    /// not failing; with one Redis server, none (it has no failover).
    #[default]
    Auto,
    /// This many (0: a probe is handed out at once).
    Exactly(usize),
}

impl ProbeReplicas {
    /// Reads `--store-probe-replicas`: `auto` or a number.
    pub fn parse(text: &str) -> Result<ProbeReplicas, String> {
        if text == "auto" {
            return Ok(ProbeReplicas::Auto);
        }
        text.parse::<usize>()
            .map(ProbeReplicas::Exactly)
            .map_err(|_| format!("{text:?} is not auto or a number of replicas"))
    }
}

/// A primary of the cluster: its address, the slots it serves, and its
/// replicas that are not failing.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Primary {
    addr: String,
    slots: Vec<(u16, u16)>,
    replicas: usize,
}

/// The cluster's primaries (in the order of their first slot).
fn primaries_of(listing: &str) -> Vec<Primary> {
    let lines: Vec<Vec<&str>> = listing
        .lines()
        .map(|l| l.split(' ').collect::<Vec<_>>())
        .filter(|f| f.len() >= 8)
        .collect();
    let failing = |flags: &str| {
        flags
            .split(',')
            .any(|f| matches!(f, "fail" | "fail?" | "noaddr" | "handshake"))
    };
    let mut primaries: Vec<(u16, Primary)> = lines
        .iter()
        .filter(|f| f[2].split(',').any(|x| x == "master") && !failing(f[2]))
        .filter_map(|f| {
            let slots: Vec<(u16, u16)> = f[8..]
                .iter()
                .filter(|r| !r.starts_with('['))
                .filter_map(|r| {
                    let (a, b) = r.split_once('-').unwrap_or((r, r));
                    Some((a.parse().ok()?, b.parse().ok()?))
                })
                .collect();
            let first = slots.iter().map(|(a, _)| *a).min()?;
            let replicas = lines
                .iter()
                .filter(|r| r[3] == f[0] && !failing(r[2]))
                .count();
            let addr = f[1].split(['@', ',']).next()?.to_owned();
            Some((
                first,
                Primary {
                    addr,
                    slots,
                    replicas,
                },
            ))
        })
        .collect();
    primaries.sort_by_key(|(first, _)| *first);
    primaries.into_iter().map(|(_, p)| p).collect()
}

/// How to make more links to the store.
#[derive(Clone)]
enum Client {
    Single(Box<redis::Client>),
    Cluster(Box<redis::cluster::ClusterClient>),
}

/// The cluster's layout as last read, and when.
type Topology = Option<(std::time::Instant, Vec<Primary>)>;

impl Client {
    async fn link(&self) -> Result<Link, RedisError> {
        Ok(match self {
            Client::Single(c) => Link::Single(
                c.get_connection_manager_with_config(manager_config())
                    .await?,
            ),
            Client::Cluster(c) => Link::Cluster(c.get_async_connection().await?),
        })
    }
}

fn manager_config() -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(CONNECT_TIMEOUT))
        .set_response_timeout(Some(RESPONSE_TIMEOUT))
        .set_number_of_retries(2)
        .set_max_delay(Duration::from_secs(5))
}

/// The connection and the figures it keeps.
#[derive(Clone)]
pub(super) struct Conn {
    conn: Link,
    client: Client,
    /// Idle links for confirmations: a `WAIT` holds its link until the
    /// replicas answer, so it never goes on the one every call shares.
    confirmers: Arc<std::sync::Mutex<Vec<Link>>>,
    topology: Arc<tokio::sync::Mutex<Topology>>,
    figures: Arc<StoreFigures>,
    reach: Arc<Reach>,
    /// The shared link's commands, in batches.
    batcher: Batcher,
    /// The breaker on the link (F4-F6).
    health: Arc<Health>,
}

impl Conn {
    pub(super) async fn connect(
        reach: Reach,
        figures: Arc<StoreFigures>,
    ) -> Result<Conn, EngineError> {
        if reach.url.tls {
            // The redis client builds its TLS settings on the process's
            // default provider: the same (ring) as the rest of the server.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let url = reach.url();
        let unreachable = |e: RedisError| {
            let advice = if matches!(e.kind(), ErrorKind::AuthenticationFailed)
                || e.code()
                    .is_some_and(|c| matches!(c, "WRONGPASS" | "NOAUTH" | "NOPERM"))
            {
                "check --store-user and the password (--store-password-file or FUSEBOX_STORE_PASSWORD), and that the user's ACL allows fusebox's commands (README, \"A store on a network\")"
            } else if url.tls {
                "check that Redis runs there with TLS (--tls-port) and the fusebox module loaded, that --store-tls-ca has the CA that signed its certificate and that the certificate names the host in --store; with tls-auth-clients, pass --store-tls-cert and --store-tls-key"
            } else {
                "check that Redis runs there with the fusebox module loaded"
            };
            EngineError::StoreUnavailable(format!(
                "cannot reach {url}: {}; {advice}",
                reach.scrub(&e)
            ))
        };
        let client = if url.cluster {
            Client::Cluster(Box::new(reach.cluster().map_err(unreachable)?))
        } else {
            Client::Single(Box::new(reach.client(&url.nodes[0]).map_err(unreachable)?))
        };
        let conn = client.link().await.map_err(unreachable)?;
        let batcher = Batcher::new(conn.clone());
        let health = Arc::new(Health::new(url.to_string(), figures.clone()));
        Ok(Conn {
            conn,
            client,
            batcher,
            health,
            confirmers: Arc::new(std::sync::Mutex::new(Vec::new())),
            topology: Arc::new(tokio::sync::Mutex::new(None)),
            figures,
            reach: Arc::new(reach),
        })
    }

    /// How links to the store are made (the subscription makes its own).
    pub(super) fn reach(&self) -> &Reach {
        &self.reach
    }

    async fn raw(&self, cmd: &Cmd) -> Result<Value, Unsent> {
        self.batcher.query(cmd.clone()).await
    }

    /// A command failed with `why` (refused, reset, timed out): the store
    /// is checked by a probe (if none runs), which opens the breaker only
    /// when the store does not answer it.
    fn link_failed(&self, why: &str) {
        if let Next::Probe = self.health.failed() {
            tracing::debug!(store = %self.reach.url(), "a store command failed ({why}); checking the link");
            tokio::spawn(probe(
                self.conn.clone(),
                self.reach.clone(),
                self.health.clone(),
            ));
        }
    }

    /// What the connection did.
    pub(super) fn figures(&self) -> &StoreFigures {
        &self.figures
    }

    /// Runs a module command; the module's refusals become the contract's
    /// errors, failures to reach the store UNAVAILABLE.
    pub(super) async fn query(&self, cmd: &Cmd) -> Result<Value, EngineError> {
        self.query_or_unknown_policy(cmd).await?.ok_or_else(|| {
            EngineError::Internal("the store does not know a policy it was sent as JSON".into())
        })
    }

    /// [`Conn::query`]; `None` when the module does not know the policy
    /// the command names by id (`NOPOLICY`: send its JSON instead).
    pub(super) async fn query_or_unknown_policy(
        &self,
        cmd: &Cmd,
    ) -> Result<Option<Value>, EngineError> {
        self.health.refuse()?;
        self.sent(cmd).await
    }

    /// [`Conn::query`] even while the breaker on the link is open: for
    /// what repairs (an unconfirmed probe given back), which must not
    /// wait for the probe to close the breaker.
    pub(super) async fn query_past_the_breaker(&self, cmd: &Cmd) -> Result<Value, EngineError> {
        self.sent(cmd).await?.ok_or_else(|| {
            EngineError::Internal("the store does not know a policy it was sent as JSON".into())
        })
    }

    async fn sent(&self, cmd: &Cmd) -> Result<Option<Value>, EngineError> {
        self.figures.commands.fetch_add(1, Ordering::Relaxed);
        let result = match self.raw(cmd).await {
            Ok(Value::ServerError(e)) => Err(RedisError::from(e)),
            Ok(value) => Ok(value),
            Err(Unsent::Failed(e)) => Err(e),
            Err(Unsent::Expired(e)) => return Err(e),
        };
        match result {
            Ok(value) => Ok(Some(value)),
            Err(e) if e.code() == Some("NOPOLICY") => Ok(None),
            Err(e) => Err(self.error_of(&e)),
        }
    }

    /// Runs `cmd` on the node at `node` (`HOST:PORT`, a primary), over the
    /// server's connections.
    pub(super) async fn on_node(&self, node: &str, cmd: &Cmd) -> Result<Value, EngineError> {
        self.health.refuse()?;
        self.figures.commands.fetch_add(1, Ordering::Relaxed);
        let result = match &self.conn {
            Link::Single(c) => cmd.query_async(&mut c.clone()).await,
            Link::Cluster(c) => {
                let (host, port) = node
                    .rsplit_once(':')
                    .and_then(|(h, p)| Some((h.to_owned(), p.parse::<u16>().ok()?)))
                    .ok_or_else(|| EngineError::Internal(format!("{node:?} is not HOST:PORT")))?;
                let route = redis::cluster_routing::RoutingInfo::SingleNode(
                    redis::cluster_routing::SingleNodeRoutingInfo::ByAddress { host, port },
                );
                c.clone().route_command(cmd.clone(), route).await
            }
        };
        let result = match result {
            Ok(Value::ServerError(e)) => Err(RedisError::from(e)),
            other => other,
        };
        result.map_err(|e| self.error_of(&e))
    }

    /// One `FB.LIST` step on `node`: the next cursor, and the keys found
    /// with their views.
    pub(super) async fn list_step(&self, node: &str, cmd: &Cmd) -> Result<ListStep, EngineError> {
        let value = self.on_node(node, cmd).await?;
        let odd = || EngineError::Internal(format!("FB.LIST answered {value:?}"));
        let Value::Array(parts) = &value else {
            return Err(odd());
        };
        let (cursor, items, inside) = match parts.as_slice() {
            [cursor, Value::Array(items)] => (cursor, items, None),
            [cursor, Value::Array(items), Value::BulkString(last)] => (
                cursor,
                items,
                Some(String::from_utf8_lossy(last).into_owned()),
            ),
            _ => return Err(odd()),
        };
        let cursor = match cursor {
            Value::BulkString(b) => std::str::from_utf8(b).ok().and_then(|t| t.parse().ok()),
            Value::SimpleString(t) => t.parse().ok(),
            Value::Int(n) => u64::try_from(*n).ok(),
            _ => None,
        }
        .ok_or_else(odd)?;
        let mut found = Vec::with_capacity(items.len() / 2);
        let mut items = items.iter();
        while let (Some(name), Some(view)) = (items.next(), items.next()) {
            if let Value::BulkString(name) = name {
                found.push((String::from_utf8_lossy(name).into_owned(), view.clone()));
            }
        }
        Ok(ListStep {
            cursor,
            found,
            inside,
        })
    }

    fn error_of(&self, e: &RedisError) -> EngineError {
        let url = self.reach.url();
        // Whatever the error quotes, never the password.
        let said = self.reach.scrub(e);
        let unavailable = |what: String| {
            self.figures.unavailable.fetch_add(1, Ordering::Relaxed);
            EngineError::StoreUnavailable(what)
        };
        match e.kind() {
            ErrorKind::Server(
                ServerErrorKind::Moved | ServerErrorKind::Ask | ServerErrorKind::TryAgain,
            ) => {
                self.figures.moved.fetch_add(1, Ordering::Relaxed);
                unavailable(format!(
                    "the key's slot is moving between nodes of {url} ({said})"
                ))
            }
            ErrorKind::Server(ServerErrorKind::ClusterDown | ServerErrorKind::MasterDown) => {
                unavailable(format!(
                    "the Redis Cluster at {url} is failing over or down ({said})"
                ))
            }
            ErrorKind::Server(ServerErrorKind::BusyLoading) => {
                unavailable(format!("Redis at {url} is still loading its data ({said})"))
            }
            ErrorKind::Server(ServerErrorKind::ReadOnly) => unavailable(format!(
                "a node of {url} that is now a replica answered ({said}); the cluster is failing over"
            )),
            ErrorKind::Server(_) | ErrorKind::Extension if e.code() == Some("OOM") => {
                EngineError::StoreFull(format!(
                    "Redis at {url} is at its maxmemory and refuses writes ({said})"
                ))
            }
            ErrorKind::Server(_) | ErrorKind::Extension => self.refusal_of(e),
            _ if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() => {
                self.link_failed(&said);
                unavailable(format!("cannot reach Redis at {url}: {said}"))
            }
            _ => unavailable(format!("Redis at {url} failed: {said}")),
        }
    }

    /// A refusal by the module (`ERR <field>: ...`) as the contract's error.
    fn refusal_of(&self, e: &RedisError) -> EngineError {
        let detail = self.reach.scrub(e.detail().unwrap_or_default());
        let text = match e.code() {
            Some("ERR") | None => detail,
            Some(code) => format!("{code} {detail}"),
        };
        if text.contains("unknown command") {
            self.figures.unavailable.fetch_add(1, Ordering::Relaxed);
            return EngineError::StoreUnavailable(format!(
                "Redis at {} does not know the fusebox commands ({text}); load the module with --loadmodule",
                self.reach.url()
            ));
        }
        let (field, problem) = text.split_once(": ").unwrap_or(("", &text));
        match field {
            "ticket" if problem.starts_with("not found") => EngineError::TicketNotFound,
            "ticket" => invalid("ticket", problem),
            "lease" => invalid("lease", problem),
            "key" => invalid("key", problem),
            "permits" => invalid("permits", problem),
            "maxwait" => invalid("max_wait", problem),
            _ => EngineError::Internal(format!("the store refused a command: {text}")),
        }
    }

    /// Waits until a replica has what the last write to `key` wrote, so an
    /// operator's action survives a failover that follows it. A timeout is
    /// logged and counted, not refused: the action took effect.
    pub(super) async fn wait_for_replica(&self, key: &str) {
        match self.confirm(key, 1, WAIT_FOR_REPLICA).await {
            Ok(n) if n >= 1 => {}
            Ok(_) => {
                // No replica, or none in time.
                self.figures.unconfirmed.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(
                    key,
                    "no replica confirmed an operator action within {WAIT_FOR_REPLICA:?}"
                );
            }
            Err(e) => {
                self.figures.unconfirmed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    key,
                    "could not wait for a replica to confirm an operator action: {e}"
                );
            }
        }
    }

    /// How many replicas have every write this server's connection made to
    /// `key` (the Redis key) so far, waiting up to `timeout` for `wanted` of
    /// them: `FB.FENCE key` (a write of nothing that is replicated) then
    /// `WAIT wanted timeout`, on a link of their own, since Redis's `WAIT`
    /// counts the writes of the connection that sends it and holds that
    /// connection while it waits. The replication stream is in order, so a
    /// replica that has the fence has every write before it.
    pub(super) async fn confirm(
        &self,
        key: &str,
        wanted: usize,
        timeout: Duration,
    ) -> Result<usize, EngineError> {
        self.health.refuse()?;
        let taken = self.confirmers.lock().expect("confirmers").pop();
        let mut link = match taken {
            Some(link) => link,
            None => self.client.link().await.map_err(|e| self.error_of(&e))?,
        };
        let mut fence = redis::cmd("FB.FENCE");
        fence.arg(key);
        let mut wait = redis::cmd("WAIT");
        wait.arg(wanted).arg(timeout.as_millis() as u64);
        self.figures.commands.fetch_add(2, Ordering::Relaxed);
        let result: Result<Value, RedisError> = async {
            match &mut link {
                Link::Single(c) => redis::pipe()
                    .add_command(fence)
                    .add_command(wait)
                    .query_async::<Vec<Value>>(c)
                    .await
                    .map(|mut v| v.pop().unwrap_or(Value::Nil)),
                Link::Cluster(c) => {
                    fence.query_async::<Value>(c).await?;
                    let route = redis::cluster_routing::RoutingInfo::SingleNode(
                        redis::cluster_routing::SingleNodeRoutingInfo::SpecificNode(
                            redis::cluster_routing::Route::with_slot(
                                redis::cluster_routing::Slot::for_key(key),
                                redis::cluster_routing::SlotAddr::Master,
                            ),
                        ),
                    );
                    c.route_command(wait, route).await
                }
            }
        }
        .await;
        let result = match result {
            Ok(Value::Int(n)) => Ok(usize::try_from(n).unwrap_or(0)),
            Ok(Value::ServerError(e)) => Err(self.error_of(&RedisError::from(e))),
            Ok(other) => Err(EngineError::Internal(format!("WAIT answered {other:?}"))),
            Err(e) => Err(self.error_of(&e)),
        };
        if result.is_ok() {
            let mut idle = self.confirmers.lock().expect("confirmers");
            if idle.len() < CONFIRM_LINKS {
                idle.push(link);
            }
        }
        result
    }

    /// How many replicas a probe at `key` (the Redis key) must reach under
    /// `rule`.
    pub(super) async fn probe_replicas(
        &self,
        key: &str,
        rule: ProbeReplicas,
    ) -> Result<usize, EngineError> {
        match (rule, &self.conn) {
            (ProbeReplicas::Exactly(n), _) => Ok(n),
            (ProbeReplicas::Auto, Link::Single(_)) => Ok(0),
            (ProbeReplicas::Auto, Link::Cluster(_)) => {
                let slot = slot_of(key.as_bytes());
                let primaries = self.topology().await?;
                Ok(primaries
                    .iter()
                    .find(|p| p.slots.iter().any(|(a, b)| (*a..=*b).contains(&slot)))
                    .map_or(0, |p| p.replicas.min(1)))
            }
        }
    }

    /// The cluster's primaries, read at most every [`TOPOLOGY_FOR`].
    async fn topology(&self) -> Result<Vec<Primary>, EngineError> {
        let mut cached = self.topology.lock().await;
        if let Some((at, primaries)) = cached.as_ref() {
            if at.elapsed() < TOPOLOGY_FOR {
                return Ok(primaries.clone());
            }
        }
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("NODES");
        let text: String = match self.query(&cmd).await? {
            Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
            Value::VerbatimString { text, .. } => text,
            other => {
                return Err(EngineError::Internal(format!(
                    "CLUSTER NODES answered {other:?}"
                )))
            }
        };
        let primaries = primaries_of(&text);
        *cached = Some((std::time::Instant::now(), primaries.clone()));
        Ok(primaries)
    }

    /// `HOST:PORT` of every primary that serves slots and is not failing,
    /// in the order of the first slot each serves (one Redis server: just
    /// that one).
    pub(super) async fn primaries(&self) -> Result<Vec<String>, EngineError> {
        if let Link::Single(_) = &self.conn {
            return Ok(self.reach.url().nodes.clone());
        }
        Ok(self.topology().await?.into_iter().map(|p| p.addr).collect())
    }
}

/// Asks the store until it answers, waiting longer each time (up to
/// [`PROBE_EVERY_MOST`]), then closes the breaker; a probe that finds no
/// answer opens it. Ends, too, once nothing but the probe holds the
/// breaker (the server let go of its store).
async fn probe(link: Link, reach: Arc<Reach>, health: Arc<Health>) {
    let mut wait = PROBE_EVERY_FIRST;
    loop {
        match answers(&link, &reach).await {
            Ok(()) => return health.answered(),
            Err(why) => health.unanswered(&why),
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(PROBE_EVERY_MOST);
        if Arc::strong_count(&health) == 1 {
            return health.given_up();
        }
    }
}

/// Whether the store answers a `PING`: the one server over the shared
/// link (whose connection manager reconnects), or any seed node of a
/// cluster over a link of its own (the cluster is reachable while one
/// answers; a node down fails its own slots, as before).
async fn answers(link: &Link, reach: &Reach) -> Result<(), String> {
    let ping = redis::cmd("PING");
    match link {
        Link::Single(c) => {
            // On the link the calls share, so a busy store is given time:
            // a refused or reset connection fails at once.
            let wait = PROBE_TIMEOUT * 4;
            match tokio::time::timeout(wait, ping.query_async::<Value>(&mut c.clone())).await {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(e)) => Err(reach.scrub(e)),
                Err(_) => Err(format!("PING unanswered after {wait:?}")),
            }
        }
        Link::Cluster(_) => {
            let config = redis::AsyncConnectionConfig::new()
                .set_connection_timeout(Some(PROBE_TIMEOUT))
                .set_response_timeout(Some(PROBE_TIMEOUT));
            let mut last = String::new();
            for node in &reach.url().nodes {
                let answer = async {
                    let client = reach.client(node)?;
                    let mut c = client
                        .get_multiplexed_async_connection_with_config(&config)
                        .await?;
                    ping.query_async::<Value>(&mut c).await
                };
                match tokio::time::timeout(PROBE_TIMEOUT * 2, answer).await {
                    Ok(Ok(_)) => return Ok(()),
                    Ok(Err(e)) => last = format!("{node}: {}", reach.scrub(e)),
                    Err(_) => last = format!("{node}: PING unanswered"),
                }
            }
            Err(format!("no node answers (the last, {last})"))
        }
    }
}

/// What one `FB.LIST` call answered.
pub(super) struct ListStep {
    /// The cursor to go on from (`0`: the node's pass is over).
    pub cursor: u64,
    /// The keys (Redis names) and their views.
    pub found: Vec<(String, Value)>,
    /// When the call stopped inside a `SCAN` bucket of more keys than it
    /// could answer: the last key answered, for the next call's `AFTER`.
    pub inside: Option<String>,
}

/// The hash slot of a Redis key (CRC16/XMODEM of its hash tag, or of the
/// whole key, modulo 16384), as Redis Cluster computes it.
fn slot_of(key: &[u8]) -> u16 {
    let tag = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    let mut crc: u16 = 0;
    for &byte in tag {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

/// `text` with the glob characters of SCAN MATCH escaped.
pub(super) fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_addresses_are_read_or_refused_with_the_forms_to_use() {
        assert_eq!(
            StoreUrl::parse("redis://127.0.0.1:6379").unwrap(),
            StoreUrl {
                cluster: false,
                tls: false,
                nodes: vec!["127.0.0.1:6379".into()],
                user: None,
                password: None,
            }
        );
        let c = StoreUrl::parse("redis-cluster://a:1,b:2,c:3").unwrap();
        assert!(c.cluster && !c.tls);
        assert_eq!(c.nodes, ["a:1", "b:2", "c:3"]);
        assert_eq!(c.to_string(), "redis-cluster://a:1,b:2,c:3");
        let t = StoreUrl::parse("rediss://redis.internal:6380").unwrap();
        assert!(t.tls && !t.cluster);
        assert_eq!(t.to_string(), "rediss://redis.internal:6380");
        let tc = StoreUrl::parse("rediss-cluster://a:1,b:2").unwrap();
        assert!(tc.tls && tc.cluster);
        assert_eq!(tc.to_string(), "rediss-cluster://a:1,b:2");
        for bad in [
            "",
            "redis://",
            "redis://a",
            "redis://a:0",
            "redis://a:1,b:2",
            "rediss://a:1,b:2",
            "http://a:1",
            "redis-cluster://a:1,:2",
        ] {
            let e = StoreUrl::parse(bad).unwrap_err();
            assert!(e.contains("redis://HOST:PORT"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_password_in_the_address_works_but_never_prints() {
        let u = StoreUrl::parse("redis://fusebox:s3cr%40t@10.0.0.5:6379").unwrap();
        assert_eq!(u.user.as_deref(), Some("fusebox"));
        assert_eq!(u.password.as_ref().map(Secret::expose), Some("s3cr@t"));
        assert_eq!(u.to_string(), "redis://fusebox:***@10.0.0.5:6379");
        assert!(!format!("{u:?}").contains("s3cr"), "{u:?}");
        let c = StoreUrl::parse("rediss-cluster://:pa@ss@a:1,b:2").unwrap();
        assert_eq!(c.user, None);
        assert_eq!(c.password.as_ref().map(Secret::expose), Some("pa@ss"));
        assert_eq!(c.nodes, ["a:1", "b:2"]);
        assert_eq!(c.to_string(), "rediss-cluster://:***@a:1,b:2");
        let user_only = StoreUrl::parse("redis://fusebox@a:1").unwrap();
        assert_eq!(user_only.to_string(), "redis://fusebox@a:1");
        for bad in [
            "http://u:hunter22@a:1",
            "redis://u:hunter22@a",
            "redis://u:hunter22@",
        ] {
            let e = StoreUrl::parse(bad).unwrap_err();
            assert!(!e.contains("hunter22"), "{bad}: {e}");
        }
        assert_eq!(redacted("redis://u:p@h:1"), "redis://u:***@h:1");
    }

    #[test]
    fn messages_never_carry_the_password() {
        let url = StoreUrl::parse("redis://a:1").unwrap();
        let reach = Reach::new(
            &url,
            &StoreTls::default(),
            Some("fusebox".into()),
            Some(Secret::new("correct-horse")),
        );
        assert_eq!(
            reach.scrub("AUTH fusebox correct-horse failed"),
            "AUTH fusebox *** failed"
        );
        let short = Reach::new(&url, &StoreTls::default(), None, Some(Secret::new("e")));
        assert_eq!(short.scrub("the error"), "the error");
        let tls = StoreTls {
            ca: None,
            cert: Some(b"cert".to_vec()),
            key: Some(Secret::new("-----BEGIN PRIVATE KEY----- abc")),
        };
        assert!(!format!("{tls:?}").contains("abc"), "{tls:?}");
    }

    #[test]
    fn the_clusters_primaries_are_read_with_their_slots_and_live_replicas() {
        let nodes = "\
a1 127.0.0.1:7001@17001 myself,master - 0 0 1 connected 0-5460
a2 127.0.0.1:7002@17002,host master - 0 0 2 connected 5461-10922 [5000->-a1]
a3 127.0.0.1:7003@17003 slave a1 0 0 1 connected
a6 127.0.0.1:7006@17006 slave,fail a2 0 0 1 connected
a4 127.0.0.1:7004@17004 master,fail - 0 0 3 connected 10923-16383
a5 127.0.0.1:7005@17005 master - 0 0 4 connected 10923-16383
";
        let p = primaries_of(nodes);
        let addrs: Vec<&str> = p.iter().map(|p| p.addr.as_str()).collect();
        assert_eq!(
            addrs,
            ["127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7005"]
        );
        assert_eq!(p[0].replicas, 1);
        assert_eq!(p[1].replicas, 0, "a failing replica does not count");
        assert_eq!(p[1].slots, [(5461, 10922)]);
        assert_eq!(ProbeReplicas::parse("auto"), Ok(ProbeReplicas::Auto));
        assert_eq!(ProbeReplicas::parse("2"), Ok(ProbeReplicas::Exactly(2)));
        assert!(ProbeReplicas::parse("x").is_err());
    }

    #[test]
    fn hash_slots_are_redis_clusters() {
        // As CLUSTER KEYSLOT answers them.
        assert_eq!(slot_of(b"foo"), 12182);
        assert_eq!(slot_of(b"somekey"), 11058);
        assert_eq!(slot_of(b"{user1000}.following"), slot_of(b"user1000"));
        assert_eq!(slot_of(b"foo{}{bar}"), slot_of(b"foo{}{bar}"));
        assert_ne!(
            slot_of(b"foo{}{bar}"),
            slot_of(b"bar"),
            "an empty tag hashes the whole key"
        );
    }

    #[test]
    fn scan_patterns_match_the_prefix_literally() {
        assert_eq!(glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }
}

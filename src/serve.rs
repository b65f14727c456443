//! Start-up as a library function: [`serve`] (or [`bind`], then
//! [`Bound::run`]) loads the config, chooses where the state lives, binds
//! both ports, starts the reload watchers and serves until `shutdown`.
//! `fusebox serve` parses its flags into [`Options`] and calls it; a test
//! or an embedding program can call it the same way.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;

use crate::config::Config;
use crate::engine::redis::StoreOptions;
use crate::engine::{Core, Engine, ManualClock, RedisStore, Store, SystemClock};
use crate::node::Node;
use crate::tls::{ClientAuth, Tls};

/// What a server is started with (`fusebox serve`'s flags).
#[derive(Debug)]
pub struct Options {
    /// The config file (`--config`); none: the embedded defaults.
    pub config: Option<PathBuf>,
    /// The gRPC address (`--listen`); port 0 picks a free one.
    pub listen: SocketAddr,
    /// The manual clock (`--manual-clock`), for tests.
    pub manual_clock: bool,
    /// The HTTP address (`--http`); none: the default address if it is
    /// free, else no HTTP side.
    pub http: Option<SocketAddr>,
    /// The certificate, key and client CA files (`--tls-*`).
    pub tls: TlsFiles,
    /// Serve a non-loopback address without `[auth]`.
    pub insecure_no_auth: bool,
    /// Keep the embedded state in this directory (`--data-dir`).
    pub data_dir: Option<PathBuf>,
    /// Keep the state in Redis (`--store`).
    pub store: Option<StoreOptions>,
}

impl Options {
    /// A server on `listen` with the embedded defaults and nothing else.
    pub fn on(listen: SocketAddr) -> Options {
        Options {
            config: None,
            listen,
            manual_clock: false,
            http: None,
            tls: TlsFiles::default(),
            insecure_no_auth: false,
            data_dir: None,
            store: None,
        }
    }
}

/// `--tls-cert`, `--tls-key` and `--tls-client-ca`.
#[derive(Debug, Default)]
pub struct TlsFiles {
    /// The server's certificate chain (PEM).
    pub cert: Option<PathBuf>,
    /// Its private key (PEM).
    pub key: Option<PathBuf>,
    /// The CA that client certificates must chain to (mutual TLS).
    pub client_ca: Option<PathBuf>,
}

/// A server whose ports are bound and whose state is ready, not serving
/// yet: its addresses are known ([`Bound::grpc_addr`], [`Bound::http_addr`]).
pub struct Bound {
    node: Arc<Node>,
    listener: tokio::net::TcpListener,
    http_listener: Option<tokio::net::TcpListener>,
    tls: Option<Arc<Tls>>,
    addr: SocketAddr,
    http_addr: Option<SocketAddr>,
}

/// Loads, binds and serves until `shutdown` resolves; then saves the last
/// breaker changes (with `--data-dir`).
pub async fn serve(options: Options, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    bind(options).await?.run(shutdown).await
}

/// Loads the config, opens the state and binds both ports. Errors say
/// what to do; nothing is served yet.
pub async fn bind(options: Options) -> anyhow::Result<Bound> {
    let Options {
        config: config_path,
        listen,
        manual_clock,
        http,
        tls: tls_files,
        insecure_no_auth,
        data_dir,
        store,
    } = options;
    let config = match &config_path {
        Some(path) => Config::load(path).context("the server did not start")?,
        None => Config::default(),
    };
    let Config {
        rules,
        limits,
        access,
        http_hosts,
        tls,
        data_dir: configured_data_dir,
        rls,
        telemetry,
    } = config;
    // The caps fit in the memory the server may use (crate::memory).
    let limits = match crate::memory::budget(limits.memory_limit) {
        Some((budget, source)) => match crate::memory::fit(&limits, budget, &source) {
            Ok(None) => limits,
            Ok(Some(lowered)) => {
                tracing::warn!(
                    memory_limit_mib = budget >> 20,
                    source = %source,
                    max_keys = lowered.max_keys,
                    max_tickets = lowered.max_tickets,
                    max_waiters = lowered.max_waiters,
                    max_unread_bytes = lowered.max_unread_bytes,
                    "the default caps would need more memory than the server may use: lowered to fit (set [server] caps, or give it more memory)"
                );
                lowered
            }
            Err(why) => anyhow::bail!("the server did not start: {why}"),
        },
        None => limits,
    };
    let tls = crate::config::tls::resolve(tls, tls_files.cert, tls_files.key, tls_files.client_ca)
        .context("the server did not start")?;
    let tls = match &tls {
        Some(settings) => Some(Tls::load(settings).context("the server did not start")?),
        None => None,
    };
    if let Some(tls) = &tls {
        // Before the address is printed: a SIGHUP from then on reloads.
        tokio::spawn(tls.clone().watch());
    }
    let rule_count = rules.rules.len();
    let exposed = [Some(listen), http]
        .into_iter()
        .flatten()
        .find(|a| !a.ip().is_loopback());
    match (&access, exposed) {
        (None, Some(addr)) if !insecure_no_auth => anyhow::bail!(
            "refusing to listen on {addr} without [auth]: anyone who reaches it could isolate keys and rewrite policies; add tokens to the config (`fusebox token --name NAME --role admin` makes one), or pass --insecure-no-auth to accept that"
        ),
        (None, Some(addr)) => tracing::warn!(
            "listening on {addr} without [auth] (--insecure-no-auth): anyone who reaches it may isolate keys and rewrite policies"
        ),
        (None, None) => tracing::info!(
            "no [auth] in the config: any local process may call every method (fine on loopback; add [auth] before exposing the ports)"
        ),
        (Some(access), _) => {
            let (tokens, client_names) = access.sizes();
            tracing::info!(tokens, client_names, "[auth] is on: every call needs a credential");
        }
    }
    let data_dir = match data_dir {
        Some(dir) => Some(dir),
        None if store.is_some() => None,
        None => configured_data_dir,
    };
    let core = if manual_clock {
        let clock = Arc::new(ManualClock::default());
        Core::new(limits.engine(), clock.clone(), Some(clock))
    } else {
        Core::new(limits.engine(), Arc::new(SystemClock::new()), None)
    };
    let core = Arc::new(core);
    // The store is chosen once, here: every part of the server goes
    // through it.
    let engine: Store = match (&data_dir, &store) {
        (_, Some(options)) => {
            let url = &options.url;
            let store = RedisStore::connect(core, rules, options)
                .await
                .context("the server did not start")?;
            tracing::info!(
                store = %url,
                tls = url.tls,
                user = options.user.as_deref().unwrap_or("default"),
                signed_notices = options.notices.is_some(),
                "state is kept in Redis at {url}: every fusebox server on it shares the same breakers, permits and policies"
            );
            Store::Redis(store)
        }
        (Some(dir), None) => {
            let engine = Arc::new(Engine::on(core, rules));
            let restored = engine
                .open_data_dir(dir)
                .context("the server did not start")?;
            let [closed, open, half_open, isolated] = restored.by_phase;
            tracing::info!(
                data_dir = %dir.display(),
                keys = restored.keys(),
                open,
                half_open,
                isolated,
                closed_with_failures = closed,
                policy_changes = restored.policy_changes,
                skipped = restored.skipped,
                commit_window_ms = engine.limits().commit_window,
                "state is kept in {}: restored {} keys ({open} open, {half_open} half-open, {isolated} isolated, {closed} closed with failures) and {} runtime policy changes",
                dir.display(),
                restored.keys(),
                restored.policy_changes
            );
            Store::Embedded(engine)
        }
        (None, None) => {
            tracing::info!(
                "state is kept in memory only: pass --data-dir DIR to keep breakers, isolations and policies across restarts"
            );
            Store::Embedded(Arc::new(Engine::on(core, rules)))
        }
    };
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}; is another server using it?"))?;
    let addr = listener.local_addr()?;
    let http_listener = match http {
        Some(addr) => Some(tokio::net::TcpListener::bind(addr).await.with_context(|| {
            format!("cannot serve HTTP on {addr}; is another server using it?")
        })?),
        None => match tokio::net::TcpListener::bind(crate::http::DEFAULT_HTTP_ADDR).await {
            Ok(listener) => Some(listener),
            Err(e) => {
                tracing::warn!(
                    "no HTTP (metrics, health, dashboard): cannot listen on {}: {e}; pass --http ADDR to choose another address",
                    crate::http::DEFAULT_HTTP_ADDR
                );
                None
            }
        },
    };
    let http_addr = match &http_listener {
        Some(listener) => Some(listener.local_addr()?),
        None => None,
    };
    // The server's own part: its counters, its ports' caps and figures, its
    // budget of unread answers and its TLS, made here once for this server.
    let telemetry = telemetry
        .as_ref()
        .map(crate::telemetry::Telemetry::start)
        .transpose()
        .context("the server did not start")?
        .map(Arc::new);
    let node = Arc::new(
        Node::new(engine, access, limits, http_hosts)
            .with_tls(tls.clone())
            .with_rls(rls)
            .with_telemetry(telemetry),
    );
    if let Some(path) = config_path {
        // Before the address is printed: a SIGHUP or an edit from then on counts.
        tokio::spawn(crate::reload::watch_config(node.clone(), path));
    }
    let security = match &tls {
        None => "off".to_owned(),
        Some(tls) => format!(
            "{}{}; {}",
            if tls.is_mutual() {
                "on, mutual (client certificates "
            } else {
                "on"
            },
            if !tls.is_mutual() {
                ""
            } else if tls.config().client_auth == ClientAuth::Required {
                "required)"
            } else {
                "optional)"
            },
            if tls.config().http {
                "HTTP over TLS too"
            } else {
                "HTTP without TLS"
            }
        ),
    };
    let state = match (&data_dir, &store) {
        (_, Some(options)) => options.url.to_string(),
        (Some(dir), None) => dir.display().to_string(),
        (None, None) => "in memory only".to_owned(),
    };
    let auth = if node.access().is_some() { "on" } else { "off" };
    tracing::info!(
        %addr,
        rules = rule_count,
        manual_clock,
        tls = %security,
        auth = %auth,
        %state,
        "fusebox is serving"
    );
    if let Some(tls) = &tls {
        tracing::info!("TLS certificate: {}", tls.describe());
        if let Some(warning) = tls.expiry_warning() {
            tracing::warn!("{warning}");
        }
    }
    Ok(Bound {
        node,
        listener,
        http_listener,
        tls,
        addr,
        http_addr,
    })
}

impl Bound {
    /// The gRPC port's address.
    pub fn grpc_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The HTTP port's address, if it has one.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http_addr
    }

    /// The state the server serves.
    pub fn store(&self) -> &Store {
        self.node.store()
    }

    /// The server: its store, who may call it, its caps and counters.
    pub fn node(&self) -> &Arc<Node> {
        &self.node
    }

    /// Serves both ports until `shutdown` resolves and the calls in flight
    /// are answered; then saves the last breaker changes (logged on
    /// failure).
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
        let Bound {
            node,
            listener,
            http_listener,
            tls,
            ..
        } = self;
        if let Some(listener) = http_listener {
            let stopped = node.store().core().stopped();
            let node = node.clone();
            let acceptor = tls
                .as_ref()
                .filter(|t| t.config().http)
                .map(|t| t.acceptor(crate::tls::ALPN_HTTP));
            tokio::spawn(async move {
                let options = crate::http::Options::of(&node);
                let upgrade = crate::connections::MaybeTls(acceptor);
                let served =
                    crate::http::serve_upgraded(listener, node, options, upgrade, stopped).await;
                if let Err(e) = served {
                    tracing::error!("the HTTP server stopped: {e}");
                }
            });
        }
        let acceptor = tls.map(|t| t.acceptor(crate::tls::ALPN_GRPC));
        let served = crate::server::run_with_tls(listener, node.clone(), acceptor, shutdown).await;
        let _ = node.store().save();
        if let Some(telemetry) = node.telemetry().cloned() {
            // The last spans are sent before the process ends.
            let _ = tokio::task::spawn_blocking(move || telemetry.shutdown()).await;
        }
        served
    }
}

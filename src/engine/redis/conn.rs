//! The connection to the store: one Redis server (a connection manager
//! that reconnects with backoff) or a Redis Cluster (the cluster client,
//! which follows MOVED and ASK). Every failure to reach the store becomes
//! [`EngineError::StoreUnavailable`] with words that say what happened;
//! refusals of the module map to the contract's errors.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ErrorKind, RedisError, ServerErrorKind, Value};

use super::super::error::invalid;
use super::super::EngineError;

/// How long one command may take before the call answers UNAVAILABLE.
const RESPONSE_TIMEOUT: Duration = Duration::from_millis(1000);

/// How long connecting to a node may take.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(1000);

/// How long an operator action waits for a replica to confirm it.
const WAIT_FOR_REPLICA: Duration = Duration::from_millis(1000);

/// Where the state is: `redis://HOST:PORT` or
/// `redis-cluster://HOST:PORT,HOST:PORT,...`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreUrl {
    /// A Redis Cluster, reached through any of `nodes`.
    pub cluster: bool,
    /// `HOST:PORT` of the server, or of the cluster's seed nodes.
    pub nodes: Vec<String>,
}

impl StoreUrl {
    /// Reads `--store`.
    pub fn parse(text: &str) -> Result<StoreUrl, String> {
        const WHAT: &str =
            "use redis://HOST:PORT for one Redis server or redis-cluster://HOST:PORT,HOST:PORT for a Redis Cluster";
        let (cluster, rest) = if let Some(rest) = text.strip_prefix("redis-cluster://") {
            (true, rest)
        } else if let Some(rest) = text.strip_prefix("redis://") {
            (false, rest)
        } else {
            return Err(format!("{text:?} is not a store address; {WHAT}"));
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
            return Err(format!("redis:// takes one HOST:PORT; {WHAT}"));
        }
        Ok(StoreUrl { cluster, nodes })
    }
}

impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = if self.cluster {
            "redis-cluster"
        } else {
            "redis"
        };
        write!(f, "{scheme}://{}", self.nodes.join(","))
    }
}

/// What the store did, for /metrics.
#[derive(Debug, Default)]
pub struct StoreFigures {
    /// Commands sent.
    pub commands: AtomicU64,
    /// Commands that failed because the store could not be reached (or
    /// timed out, or its cluster was down): each answered UNAVAILABLE.
    pub unavailable: AtomicU64,
    /// Commands that met a slot on the move (MOVED, ASK, TRYAGAIN) and
    /// failed after the cluster client's retries.
    pub moved: AtomicU64,
    /// Times the answers/events subscription was (re)connected.
    pub subscriptions: AtomicU64,
    /// Operator actions whose replica confirmation (`WAIT`) timed out.
    pub unconfirmed: AtomicU64,
}

/// A connection to the store.
#[derive(Clone)]
pub(super) enum Link {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// The connection and the figures it keeps.
#[derive(Clone)]
pub(super) struct Conn {
    conn: Link,
    figures: Arc<StoreFigures>,
    url: Arc<StoreUrl>,
}

impl Conn {
    pub(super) async fn connect(
        url: &StoreUrl,
        figures: Arc<StoreFigures>,
    ) -> Result<Conn, EngineError> {
        let unreachable = |e: RedisError| {
            EngineError::StoreUnavailable(format!(
                "cannot reach {url}: {e}; check that Redis runs there with the fusebox module loaded"
            ))
        };
        let conn = if url.cluster {
            let nodes: Vec<String> = url.nodes.iter().map(|n| format!("redis://{n}")).collect();
            let client = redis::cluster::ClusterClientBuilder::new(nodes)
                .connection_timeout(CONNECT_TIMEOUT)
                .response_timeout(RESPONSE_TIMEOUT)
                .retries(3)
                .build()
                .map_err(unreachable)?;
            Link::Cluster(client.get_async_connection().await.map_err(unreachable)?)
        } else {
            let client =
                redis::Client::open(format!("redis://{}", url.nodes[0])).map_err(unreachable)?;
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(CONNECT_TIMEOUT))
                .set_response_timeout(Some(RESPONSE_TIMEOUT))
                .set_number_of_retries(2)
                .set_max_delay(Duration::from_secs(5));
            Link::Single(
                client
                    .get_connection_manager_with_config(config)
                    .await
                    .map_err(unreachable)?,
            )
        };
        Ok(Conn {
            conn,
            figures,
            url: Arc::new(url.clone()),
        })
    }

    async fn raw(&self, cmd: &Cmd) -> Result<Value, RedisError> {
        match &self.conn {
            Link::Single(c) => cmd.query_async(&mut c.clone()).await,
            Link::Cluster(c) => cmd.query_async(&mut c.clone()).await,
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
        self.figures.commands.fetch_add(1, Ordering::Relaxed);
        let result = match self.raw(cmd).await {
            Ok(Value::ServerError(e)) => Err(RedisError::from(e)),
            other => other,
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
    pub(super) async fn list_step(
        &self,
        node: &str,
        cmd: &Cmd,
    ) -> Result<(u64, Vec<(String, Value)>), EngineError> {
        let value = self.on_node(node, cmd).await?;
        let odd = || EngineError::Internal(format!("FB.LIST answered {value:?}"));
        let Value::Array(parts) = &value else {
            return Err(odd());
        };
        let [cursor, Value::Array(items)] = parts.as_slice() else {
            return Err(odd());
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
        Ok((cursor, found))
    }

    fn error_of(&self, e: &RedisError) -> EngineError {
        let url = &self.url;
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
                    "the key's slot is moving between nodes of {url} ({e})"
                ))
            }
            ErrorKind::Server(ServerErrorKind::ClusterDown | ServerErrorKind::MasterDown) => {
                unavailable(format!(
                    "the Redis Cluster at {url} is failing over or down ({e})"
                ))
            }
            ErrorKind::Server(ServerErrorKind::BusyLoading) => {
                unavailable(format!("Redis at {url} is still loading its data ({e})"))
            }
            ErrorKind::Server(ServerErrorKind::ReadOnly) => unavailable(format!(
                "a node of {url} that is now a replica answered ({e}); the cluster is failing over"
            )),
            ErrorKind::Server(_) | ErrorKind::Extension => self.refusal_of(e),
            _ if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() => {
                unavailable(format!("cannot reach Redis at {url}: {e}"))
            }
            _ => unavailable(format!("Redis at {url} failed: {e}")),
        }
    }

    /// A refusal by the module (`ERR <field>: ...`) as the contract's error.
    fn refusal_of(&self, e: &RedisError) -> EngineError {
        let detail = e.detail().unwrap_or_default();
        let text = match e.code() {
            Some("ERR") | None => detail.to_owned(),
            Some(code) => format!("{code} {detail}"),
        };
        if text.contains("unknown command") {
            self.figures.unavailable.fetch_add(1, Ordering::Relaxed);
            return EngineError::StoreUnavailable(format!(
                "Redis at {} does not know the fusebox commands ({text}); load the module with --loadmodule",
                self.url
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
        let mut cmd = redis::cmd("WAIT");
        cmd.arg(1).arg(WAIT_FOR_REPLICA.as_millis() as u64);
        let result = match &self.conn {
            // WAIT has no key: the cluster client must send it to the node
            // that holds `key`, so route it by the key.
            Link::Cluster(c) => {
                let route = redis::cluster_routing::RoutingInfo::SingleNode(
                    redis::cluster_routing::SingleNodeRoutingInfo::SpecificNode(
                        redis::cluster_routing::Route::with_slot(
                            redis::cluster_routing::Slot::for_key(key),
                            redis::cluster_routing::SlotAddr::Master,
                        ),
                    ),
                );
                c.clone().route_command(cmd, route).await
            }
            Link::Single(c) => cmd.query_async(&mut c.clone()).await,
        };
        match result {
            Ok(Value::Int(n)) if n >= 1 => {}
            Ok(Value::Int(0)) => {
                // No replica, or none in time.
                self.figures.unconfirmed.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(
                    key,
                    "no replica confirmed an operator action within {WAIT_FOR_REPLICA:?}"
                );
            }
            other => {
                self.figures.unconfirmed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    key,
                    "could not wait for a replica to confirm an operator action: {other:?}"
                );
            }
        }
    }

    /// `HOST:PORT` of every primary that serves slots and is not failing,
    /// in the order of the first slot each serves (one Redis server: just
    /// that one).
    pub(super) async fn primaries(&self) -> Result<Vec<String>, EngineError> {
        if let Link::Single(_) = &self.conn {
            return Ok(self.url.nodes.clone());
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
        let mut primaries: Vec<(u16, String)> = text
            .lines()
            .filter_map(|line| {
                let fields: Vec<&str> = line.split(' ').collect();
                let flags = fields.get(2)?;
                let primary = flags.split(',').any(|f| f == "master")
                    && !flags.split(',').any(|f| f == "fail" || f == "noaddr");
                let addr = fields.get(1)?.split(['@', ',']).next()?;
                let first_slot = fields
                    .get(8..)?
                    .iter()
                    .filter_map(|r| r.split('-').next()?.parse::<u16>().ok())
                    .min()?;
                primary.then(|| (first_slot, addr.to_owned()))
            })
            .collect();
        primaries.sort();
        Ok(primaries.into_iter().map(|(_, addr)| addr).collect())
    }
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
                nodes: vec!["127.0.0.1:6379".into()]
            }
        );
        let c = StoreUrl::parse("redis-cluster://a:1,b:2,c:3").unwrap();
        assert!(c.cluster);
        assert_eq!(c.nodes, ["a:1", "b:2", "c:3"]);
        assert_eq!(c.to_string(), "redis-cluster://a:1,b:2,c:3");
        for bad in [
            "",
            "redis://",
            "redis://a",
            "redis://a:0",
            "redis://a:1,b:2",
            "http://a:1",
            "redis-cluster://a:1,:2",
        ] {
            let e = StoreUrl::parse(bad).unwrap_err();
            assert!(e.contains("redis://HOST:PORT"), "{bad}: {e}");
        }
    }

    #[test]
    fn scan_patterns_match_the_prefix_literally() {
        assert_eq!(glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }
}

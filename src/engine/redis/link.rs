//! A link to the store: one Redis server's connection manager (which
//! reconnects with backoff), or the Redis Cluster client (which follows
//! MOVED and ASK). The connection ([`super::conn`]) makes them; the
//! batches ([`super::batch`]) send on them.

use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;

/// A connection to the store.
#[derive(Clone)]
pub(super) enum Link {
    /// To one Redis server.
    Single(ConnectionManager),
    /// To a Redis Cluster.
    Cluster(ClusterConnection),
}

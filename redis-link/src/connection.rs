//! The shared connection: one server's connection manager, or a cluster connection.

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};

use crate::tls_setup::RedisTls;

/// A shared, cloneable, reconnecting connection to the configured Redis.
///
/// Against a cluster, keyed commands and pipelines whose keys share one slot go to that slot's master, and
/// `MOVED`, `ASK` and failovers are followed by redis-rs. A pipeline whose keys span slots is refused
/// (`CrossSlot`) before anything is sent, and keyless commands (`INFO`, `TIME`) reach one node of redis-rs's
/// choice: ask a specific node through `NodePool` instead. A command redis-rs retries after a lost
/// connection may have run twice, so only idempotent or compare-and-set writes go through it.
#[derive(Clone)]
pub enum Connection {
    /// One Redis server.
    Single(ConnectionManager),
    /// A Redis Cluster.
    Cluster(ClusterConnection),
    /// One cluster node, directly (`NodePool::connection`): no redirect is followed and a lost
    /// connection is not reopened (ask the pool for a new one).
    Node(MultiplexedConnection),
}

impl Connection {
    /// Connects to a cluster through `seeds` (see `RedisTarget`), with these timeouts per node
    /// connection and per answer; `rediss://` seeds with `tls` (the system's roots when `None`), and so every
    /// node discovered or named by a redirect.
    ///
    /// # Errors
    /// Malformed seeds; no seed reachable; a cluster whose slots are not all served.
    pub async fn cluster(
        seeds: &[String],
        tls: Option<&RedisTls>,
        connection_timeout: Duration,
        response_timeout: Duration,
    ) -> RedisResult<Self> {
        let client = cluster_client(seeds, tls, connection_timeout, response_timeout)?;
        Ok(Connection::Cluster(client.get_async_connection().await?))
    }

    /// Like [`Connection::cluster`], but connects in the background: a cluster unreachable now is an outage
    /// the first commands see (and ride out), not an error here.
    ///
    /// # Errors
    /// Malformed seeds.
    pub fn cluster_lazy(
        seeds: &[String],
        tls: Option<&RedisTls>,
        connection_timeout: Duration,
        response_timeout: Duration,
    ) -> RedisResult<Self> {
        let client = cluster_client(seeds, tls, connection_timeout, response_timeout)?;
        // The per-call config replaces the builder's response timeout (with none when unset): set both here.
        let config = redis::cluster::ClusterConfig::new()
            .set_connection_timeout(connection_timeout)
            .set_response_timeout(response_timeout);
        Ok(Connection::Cluster(
            client.get_pending_async_connection_with_config(config),
        ))
    }

    /// Whether this is a cluster connection.
    pub fn is_cluster(&self) -> bool {
        matches!(self, Connection::Cluster(_))
    }
}

/// The cluster client of `seeds`: redis-rs takes TLS (on when the seeds are `rediss://`) for the discovered
/// nodes from the first seed, and the roots and client identity from `certs`.
fn cluster_client(
    seeds: &[String],
    tls: Option<&RedisTls>,
    connection_timeout: Duration,
    response_timeout: Duration,
) -> RedisResult<redis::cluster::ClusterClient> {
    crate::tls_setup::cluster_builder(seeds, tls)?
        .connection_timeout(connection_timeout)
        .response_timeout(response_timeout)
        .build()
}

impl From<ConnectionManager> for Connection {
    fn from(conn: ConnectionManager) -> Self {
        Connection::Single(conn)
    }
}

impl From<ClusterConnection> for Connection {
    fn from(conn: ClusterConnection) -> Self {
        Connection::Cluster(conn)
    }
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Single(c) => c.req_packed_command(cmd),
            Connection::Cluster(c) => c.req_packed_command(cmd),
            Connection::Node(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Connection::Single(c) => c.req_packed_commands(cmd, offset, count),
            Connection::Cluster(c) => c.req_packed_commands(cmd, offset, count),
            Connection::Node(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Single(c) => c.get_db(),
            Connection::Cluster(c) => c.get_db(),
            Connection::Node(c) => c.get_db(),
        }
    }
}

//! Where the consumer's Redis commands go: one server, or the nodes of a Redis Cluster.
//!
//! Every non-blocking command (`XACK`, `XAUTOCLAIM`, `XCLAIM`, `XPENDING`, `XGROUP CREATE`, the dead-letter
//! `MULTI`) goes over one shared [`Connection`]: redis-rs's connection manager, or its cluster connection, which
//! sends each command to the master of its key's slot and follows `MOVED`, `ASK` and failovers. Those commands
//! are harmless to repeat, which is what the cluster connection may do after a lost connection (a repeated
//! dead-letter `MULTI` writes the dead letter twice: dead letters are at-least-once, like delivery).
//!
//! A shard reader's blocking `XREADGROUP` owns its connection ([`ReadRoute`]): to the server, or to the master of
//! the shard key's slot by the cluster's slot map. A `MOVED` answer re-reads the map and moves the reader to the
//! named master; an `ASK` (the slot is migrating and the stream is already on the target) moves it to the named
//! node with `ASKING` before each read until that node serves the slot itself; a lost connection re-reads the map
//! (a failover promoted another master) before the reader reconnects. `CLIENT UNBLOCK` goes to the node that
//! holds the blocked read.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{AsyncConnectionConfig, RedisError, Value};
use redis_link::{Connection, NodeAddr, NodePool, Redirect, RedirectKind, RedisTarget};
use tracing::debug;

/// Connect timeout of every consumer connection.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// The consumer's Redis: the shared connection and where the blocking reads go.
#[derive(Clone)]
pub(crate) enum RedisNodes {
    /// One server: blocking reads open their own connection with this client.
    Single(redis::Client),
    /// A cluster: blocking reads go to the master of their slot.
    Cluster(Arc<NodePool>),
}

/// Where one reader's blocking connection goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ReadRoute {
    /// The one server.
    Single,
    /// A cluster node; `asking` while the shard's slot migrates to it (`ASKING` before every read).
    Node { node: NodeAddr, asking: bool },
}

impl ReadRoute {
    /// Whether reads on this route must be preceded by `ASKING`.
    pub(crate) fn asking(&self) -> bool {
        matches!(self, ReadRoute::Node { asking: true, .. })
    }
}

/// A Redis URL (or cluster target) that cannot be opened.
pub(crate) fn target_error(e: redis_link::TargetError) -> RedisError {
    RedisError::from((
        redis::ErrorKind::InvalidClientConfig,
        "invalid Redis target",
        e.to_string(),
    ))
}

impl RedisNodes {
    /// Opens the shared connection (lazily: Redis down now is an outage to ride out) and the read routing for
    /// `url` (one server's URL, or `cluster:` and seed URLs).
    pub(crate) fn open(url: &str, response_timeout: Duration) -> Result<(Connection, RedisNodes), RedisError> {
        match RedisTarget::parse(url).map_err(target_error)? {
            RedisTarget::Single(url) => {
                let client = redis::Client::open(url)?;
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(CONNECT_TIMEOUT))
                    .set_response_timeout(Some(response_timeout))
                    .set_max_delay(Duration::from_secs(2));
                let conn = ConnectionManager::new_lazy_with_config(client.clone(), config)?;
                Ok((Connection::Single(conn), RedisNodes::Single(client)))
            }
            RedisTarget::Cluster(seeds) => {
                let conn = Connection::cluster_lazy(&seeds, CONNECT_TIMEOUT, response_timeout)?;
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(CONNECT_TIMEOUT))
                    .set_response_timeout(Some(response_timeout));
                let pool = NodePool::new(&seeds, config)?;
                Ok((conn, RedisNodes::Cluster(Arc::new(pool))))
            }
        }
    }

    /// The route of a reader of `key`: the server, or its slot's master (after re-reading the slot map when
    /// `refresh`, i.e. after the last connection failed).
    pub(crate) async fn route_for(&self, key: &str, refresh: bool) -> Result<ReadRoute, RedisError> {
        match self {
            RedisNodes::Single(_) => Ok(ReadRoute::Single),
            RedisNodes::Cluster(pool) => {
                let map = if refresh {
                    pool.refresh().await
                } else {
                    pool.slot_map().await
                };
                let map = map.map_err(topology_error)?;
                Ok(ReadRoute::Node {
                    node: map.master_of_key(key.as_bytes()).clone(),
                    asking: false,
                })
            }
        }
    }

    /// The route after `redirect`; a `MOVED` also re-reads the slot map (the next lookups then agree).
    pub(crate) async fn after_redirect(&self, redirect: &Redirect) -> ReadRoute {
        match self {
            RedisNodes::Single(_) => ReadRoute::Single,
            RedisNodes::Cluster(pool) => {
                if redirect.kind == RedirectKind::Moved {
                    if let Err(e) = pool.refresh().await {
                        debug!(error = %e, "slot map refresh after MOVED failed");
                    }
                }
                ReadRoute::Node {
                    node: redirect.to.clone(),
                    asking: redirect.kind == RedirectKind::Ask,
                }
            }
        }
    }

    /// A client for a dedicated connection on `route`.
    pub(crate) fn client(&self, route: &ReadRoute) -> Result<redis::Client, RedisError> {
        match (self, route) {
            (RedisNodes::Single(client), _) => Ok(client.clone()),
            (RedisNodes::Cluster(pool), ReadRoute::Node { node, .. }) => pool.client(node),
            (RedisNodes::Cluster(_), ReadRoute::Single) => Err(RedisError::from((
                redis::ErrorKind::Client,
                "a cluster read needs a node",
            ))),
        }
    }

    /// Sends `CLIENT UNBLOCK id` to the node holding the blocked read of `route`.
    pub(crate) async fn unblock(&self, shared: &Connection, route: &ReadRoute, id: i64) -> Result<(), RedisError> {
        let mut conn = match (self, route) {
            (RedisNodes::Cluster(pool), ReadRoute::Node { node, .. }) => Connection::Node(pool.connection(node).await?),
            _ => shared.clone(),
        };
        redis::cmd("CLIENT")
            .arg("UNBLOCK")
            .arg(id)
            .query_async::<Value>(&mut conn)
            .await
            .map(drop)
    }

    /// Clients for every server the start-up check must ask: the one server, or every master, each with a
    /// label for errors.
    pub(crate) async fn check_targets(&self) -> Result<Vec<(Option<NodeAddr>, redis::Client)>, RedisError> {
        match self {
            RedisNodes::Single(client) => Ok(vec![(None, client.clone())]),
            RedisNodes::Cluster(pool) => {
                let map = pool.refresh().await.map_err(topology_error)?;
                map.masters()
                    .into_iter()
                    .map(|node| Ok((Some(node.clone()), pool.client(&node)?)))
                    .collect()
            }
        }
    }
}

/// A slot map that could not be read, as the Redis error the callers already handle (an outage).
fn topology_error(e: redis_link::TopologyError) -> RedisError {
    match e {
        redis_link::TopologyError::Unreachable(e) => e,
        other => RedisError::from((redis::ErrorKind::Client, "cluster slot map", other.to_string())),
    }
}

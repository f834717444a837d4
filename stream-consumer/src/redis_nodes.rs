//! Where the consumer's Redis commands go: one server, or the nodes of a Redis Cluster.
//!
//! Every non-blocking command (`XACK`, `XAUTOCLAIM`, `XCLAIM`, `XPENDING`, `XGROUP CREATE`, the dead-letter
//! `MULTI`) goes over one shared [`Connection`]: redis-rs's connection manager, or its cluster connection, which
//! sends each command to the master of its key's slot and follows `MOVED`, `ASK` and failovers. Those commands
//! are harmless to repeat, which is what the cluster connection may do after a lost connection (a repeated
//! dead-letter `MULTI` writes the dead letter twice: dead letters are at-least-once, like delivery).
//!
//! A shard reader's blocking `XREADGROUP` owns its connection, routed by [`redis_link::Nodes`] and
//! [`redis_link::KeyRoute`]: to the server, or to the master of the shard key's slot, moved after `MOVED`, `ASK`
//! or a lost connection.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{AsyncConnectionConfig, RedisError};
use redis_link::{ClusterRouter, Connection, Nodes, RedisTarget};

/// Connect timeout of every consumer connection.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// A Redis URL (or cluster target) that cannot be opened.
pub(crate) fn target_error(e: redis_link::TargetError) -> RedisError {
    RedisError::from((
        redis::ErrorKind::InvalidClientConfig,
        "invalid Redis target",
        e.to_string(),
    ))
}

/// Opens the shared connection (lazily: Redis down now is an outage to ride out) and the nodes of the blocking
/// reads for `url` (one server's URL, or `cluster:` and seed URLs), `rediss://` ones with `tls`.
pub(crate) fn open(
    url: &str,
    tls: Option<&redis_link::TlsOptions>,
    response_timeout: Duration,
) -> Result<(Connection, Nodes), RedisError> {
    let tls = tls
        .map(redis_link::RedisTls::load)
        .transpose()
        .map_err(|e| RedisError::from((redis::ErrorKind::InvalidClientConfig, "Redis TLS", e.to_string())))?;
    match RedisTarget::parse(url).map_err(target_error)? {
        RedisTarget::Single(url) => {
            let client = redis_link::tls_client(&url, tls.as_ref())?;
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(CONNECT_TIMEOUT))
                .set_response_timeout(Some(response_timeout))
                .set_max_delay(Duration::from_secs(2));
            let conn = ConnectionManager::new_lazy_with_config(client.clone(), config)?;
            Ok((Connection::Single(conn), Nodes::Single(client, tls)))
        }
        RedisTarget::Cluster(seeds) => {
            let conn = Connection::cluster_lazy(&seeds, tls.as_ref(), CONNECT_TIMEOUT, response_timeout)?;
            let config = AsyncConnectionConfig::new()
                .set_connection_timeout(Some(CONNECT_TIMEOUT))
                .set_response_timeout(Some(response_timeout));
            let router = ClusterRouter::new(&seeds, config, tls.as_ref())?;
            Ok((conn, Nodes::Cluster(std::sync::Arc::new(router))))
        }
    }
}

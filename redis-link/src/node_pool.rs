//! Direct connections to cluster nodes, by slot.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ConnectionAddr, ConnectionInfo, RedisResult};

use crate::tls_setup::{self, RedisTls};
use crate::topology::{NodeAddr, SlotMap, TopologyError};

/// Connections to the nodes of one cluster, each straight to one node (no redirect is followed for the caller),
/// and the cluster's slot map to pick the node.
///
/// One multiplexed connection per node is cached and shared ([`NodePool::connection`]); a caller that blocks
/// on its connection opens its own ([`NodePool::client`]). Every node connection uses the credentials and
/// settings of the first seed URL with the node's host and port, TLS included: a node found in the slot map or
/// named by a redirect is reached with the seeds' scheme and certificates (`tls-cluster yes`).
pub struct NodePool {
    base: ConnectionInfo,
    /// For connections opened by hand on a node (the pipelined ones); redis-rs's carry it in `base`.
    tls: Option<RedisTls>,
    seeds: Vec<NodeAddr>,
    config: AsyncConnectionConfig,
    map: RwLock<Option<Arc<SlotMap>>>,
    conns: Mutex<HashMap<NodeAddr, MultiplexedConnection>>,
    refreshing: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for NodePool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodePool")
            .field("seeds", &self.seeds)
            .finish_non_exhaustive()
    }
}

impl NodePool {
    /// A pool for the cluster these seed URLs reach; connects to nothing yet.
    ///
    /// # Errors
    /// No seed, a seed URL that is not a TCP `redis://` / `rediss://` URL, `tls` for `redis://` seeds.
    pub fn new(seeds: &[String], config: AsyncConnectionConfig, tls: Option<&RedisTls>) -> RedisResult<Self> {
        let mut infos = Vec::with_capacity(seeds.len());
        for seed in seeds {
            let info = tls_setup::connection_info(seed, tls)?;
            let addr = match info.addr() {
                ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
                    NodeAddr::new(host.clone(), *port)
                }
                _ => {
                    return Err(redis::RedisError::from((
                        redis::ErrorKind::InvalidClientConfig,
                        "cluster seeds must be TCP addresses",
                    )))
                }
            };
            infos.push((info, addr));
        }
        let Some((base, _)) = infos.first().cloned() else {
            return Err(redis::RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "no cluster seed",
            )));
        };
        Ok(NodePool {
            base,
            tls: tls.cloned(),
            seeds: infos.into_iter().map(|(_, a)| a).collect(),
            config,
            map: RwLock::new(None),
            conns: Mutex::new(HashMap::new()),
            refreshing: tokio::sync::Mutex::new(()),
        })
    }

    /// The connection settings of `node`: the first seed's, with `node`'s host and port.
    pub fn connection_info(&self, node: &NodeAddr) -> ConnectionInfo {
        let addr = match self.base.addr() {
            ConnectionAddr::TcpTls {
                insecure, tls_params, ..
            } => ConnectionAddr::TcpTls {
                host: node.host.clone(),
                port: node.port,
                insecure: *insecure,
                tls_params: tls_params.clone(),
            },
            _ => ConnectionAddr::Tcp(node.host.clone(), node.port),
        };
        self.base.clone().set_addr(addr)
    }

    /// The TLS settings of the seeds, for connections opened by hand.
    pub fn tls(&self) -> Option<&RedisTls> {
        self.tls.as_ref()
    }

    /// A client for `node`, to open connections of one's own (a blocking read must not share one).
    ///
    /// # Errors
    /// Never for addresses of a valid pool; kept for redis-rs's signature.
    pub fn client(&self, node: &NodeAddr) -> RedisResult<redis::Client> {
        redis::Client::open(self.connection_info(node))
    }

    /// The shared connection to `node` (opened on first use).
    ///
    /// # Errors
    /// The node unreachable.
    pub async fn connection(&self, node: &NodeAddr) -> RedisResult<MultiplexedConnection> {
        if let Some(conn) = self.conns.lock().expect("node connections lock").get(node) {
            return Ok(conn.clone());
        }
        let conn = self
            .client(node)?
            .get_multiplexed_async_connection_with_config(&self.config)
            .await?;
        let mut conns = self.conns.lock().expect("node connections lock");
        Ok(conns.entry(node.clone()).or_insert(conn).clone())
    }

    /// Drops the shared connection to `node` (after an I/O error: the next use reconnects).
    pub fn forget(&self, node: &NodeAddr) {
        self.conns.lock().expect("node connections lock").remove(node);
    }

    /// The slot map, read from the cluster on first use.
    ///
    /// # Errors
    /// No node answered with a full slot map.
    pub async fn slot_map(&self) -> Result<Arc<SlotMap>, TopologyError> {
        if let Some(map) = self.map.read().expect("slot map lock").clone() {
            return Ok(map);
        }
        self.refresh().await
    }

    /// Reads the slot map again (after `MOVED`, a failover or a lost node): from the known masters first, then
    /// the seeds. Concurrent callers share one read.
    ///
    /// # Errors
    /// No node answered with a full slot map.
    pub async fn refresh(&self) -> Result<Arc<SlotMap>, TopologyError> {
        let before = self.map.read().expect("slot map lock").clone();
        let _one_at_a_time = self.refreshing.lock().await;
        let now = self.map.read().expect("slot map lock").clone();
        if let (Some(before), Some(now)) = (&before, &now) {
            if !Arc::ptr_eq(before, now) {
                return Ok(now.clone());
            }
        }
        let mut candidates: Vec<NodeAddr> = now.map(|m| m.masters()).unwrap_or_default();
        candidates.extend(self.seeds.iter().cloned());
        let mut last = None;
        for node in candidates {
            let mut conn = match self.connection(&node).await {
                Ok(conn) => conn,
                Err(e) => {
                    last = Some(TopologyError::Unreachable(e));
                    continue;
                }
            };
            match SlotMap::fetch(&mut conn, Some(&node)).await {
                Ok(map) => {
                    let map = Arc::new(map);
                    *self.map.write().expect("slot map lock") = Some(map.clone());
                    return Ok(map);
                }
                Err(e) => {
                    if matches!(e, TopologyError::Unreachable(_)) {
                        self.forget(&node);
                    }
                    last = Some(e);
                }
            }
        }
        Err(last.unwrap_or(TopologyError::Malformed("no seed")))
    }

    /// The master of `slot` by the current map, and the shared connection to it.
    ///
    /// # Errors
    /// No slot map; the master unreachable.
    pub async fn master_connection(&self, slot: u16) -> Result<(NodeAddr, MultiplexedConnection), TopologyError> {
        let map = self.slot_map().await?;
        let node = map.master_of(slot).clone();
        let conn = self.connection(&node).await.map_err(TopologyError::Unreachable)?;
        Ok((node, conn))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_connections_keep_the_seed_credentials() {
        let pool = NodePool::new(
            &["redis://user:pw@10.0.0.1:7000".to_owned()],
            AsyncConnectionConfig::new(),
            None,
        )
        .unwrap();
        let info = pool.connection_info(&NodeAddr::new("10.0.0.2", 7001));
        assert_eq!(info.addr(), &ConnectionAddr::Tcp("10.0.0.2".into(), 7001));
        assert_eq!(info.redis_settings().username(), Some("user"));
        assert_eq!(info.redis_settings().password(), Some("pw"));
    }

    #[test]
    fn seeds_must_be_tcp() {
        assert!(NodePool::new(&[], AsyncConnectionConfig::new(), None).is_err());
        assert!(NodePool::new(
            &["redis+unix:///redis.sock".to_owned()],
            AsyncConnectionConfig::new(),
            None
        )
        .is_err());
    }
}

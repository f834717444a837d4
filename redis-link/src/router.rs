//! [`ClusterRouter`]: the cluster's topology for every component, and the state each keeps per node.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use redis::{AsyncConnectionConfig, RedisResult};

use crate::node_pool::NodePool;
use crate::topology::{NodeAddr, SlotMap, TopologyError};

/// Routes commands over a Redis Cluster: the slot map (read on first use, refreshed after `MOVED`, a failover
/// or a lost node, one read at a time), the master of a key or slot, every master, one shared connection per
/// node, and a value of the caller's per node (`N`, such as its own pipelining connections to it).
///
/// What it answers with:
/// - [`ClusterRouter::run_pipeline`]: a pipeline of one slot sent to its master, each command's `MOVED`,
///   `ASK`, `TRYAGAIN` and `CLUSTERDOWN` followed on its own (writes: a command is sent again only when it did
///   not run);
/// - [`ClusterRouter::on_each_master`] / [`ClusterRouter::each_master`]: node-local questions (`INFO`,
///   `TIME`, `SCAN`);
/// - [`ClusterRouter::read_many`]: read-only commands over many slots, one pipeline per master;
/// - `Nodes` and `KeyRoute` (in `nodes.rs`): a dedicated connection for a blocking read of one key.
pub struct ClusterRouter<N = ()> {
    pool: NodePool,
    /// The caller's value of every node used so far (bounded by the cluster's nodes). A std mutex: held only
    /// to look up or insert.
    states: Mutex<HashMap<NodeAddr, Arc<N>>>,
}

impl<N> std::fmt::Debug for ClusterRouter<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterRouter")
            .field("pool", &self.pool)
            .finish_non_exhaustive()
    }
}

impl<N> ClusterRouter<N> {
    /// A router for the cluster these seed URLs reach (see `RedisTarget`), every node connection with
    /// `config` and, for `rediss://` seeds, `tls`; connects to nothing yet.
    ///
    /// # Errors
    /// No seed, a seed URL that is not a TCP `redis://` / `rediss://` URL, `tls` for `redis://` seeds.
    pub fn new(seeds: &[String], config: AsyncConnectionConfig, tls: Option<&crate::RedisTls>) -> RedisResult<Self> {
        Ok(ClusterRouter {
            pool: NodePool::new(seeds, config, tls)?,
            states: Mutex::default(),
        })
    }

    /// The node connections and slot map underneath.
    pub fn pool(&self) -> &NodePool {
        &self.pool
    }

    /// The slot map, read from the cluster on first use.
    ///
    /// # Errors
    /// No node answered with a full slot map.
    pub fn slot_map(&self) -> impl Future<Output = Result<Arc<SlotMap>, TopologyError>> + Send + '_ {
        // The pool's future itself, not one wrapped in another: callers' futures nest deep enough already.
        self.pool.slot_map()
    }

    /// Reads the slot map again (concurrent callers share one read).
    ///
    /// # Errors
    /// No node answered with a full slot map.
    pub fn refresh(&self) -> impl Future<Output = Result<Arc<SlotMap>, TopologyError>> + Send + '_ {
        self.pool.refresh()
    }

    /// The master of `slot` by the current map.
    ///
    /// # Errors
    /// No slot map could be read.
    pub async fn master_of_slot(&self, slot: u16) -> Result<NodeAddr, TopologyError> {
        Ok(self.slot_map().await?.master_of(slot).clone())
    }

    /// The master of `key`'s slot by the current map (re-read first when `refresh`).
    ///
    /// # Errors
    /// No slot map could be read.
    pub async fn master_of_key(&self, key: &[u8], refresh: bool) -> Result<NodeAddr, TopologyError> {
        let map = if refresh {
            self.refresh().await?
        } else {
            self.slot_map().await?
        };
        Ok(map.master_of_key(key).clone())
    }

    /// Every master, by a slot map read now (so a failover since the last call is seen).
    ///
    /// # Errors
    /// No slot map could be read.
    pub async fn masters(&self) -> Result<Vec<NodeAddr>, TopologyError> {
        Ok(self.refresh().await?.masters())
    }

    /// The caller's value for `node`, made by `open` (with a client for the node) on first use.
    ///
    /// # Errors
    /// `open`'s.
    pub fn node_state<E>(
        &self,
        node: &NodeAddr,
        open: impl FnOnce(redis::Client) -> Result<N, E>,
        client_error: impl FnOnce(redis::RedisError) -> E,
    ) -> Result<Arc<N>, E> {
        let mut states = self
            .states
            .lock()
            .expect("the node states lock is never held across a panic");
        if let Some(state) = states.get(node) {
            return Ok(state.clone());
        }
        let client = self.pool.client(node).map_err(client_error)?;
        let state = Arc::new(open(client)?);
        states.insert(node.clone(), state.clone());
        Ok(state)
    }
}

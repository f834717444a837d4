//! Questions for every master, and reads whose keys span slots.
//!
//! redis-rs's cluster connection routes a keyed command to its slot's master, refuses a pipeline whose keys span
//! slots, and sends keyless node-local commands (`INFO`, `TIME`, `SCAN`, `COMMAND INFO`) to a node of its choice
//! (or to all, merging answers nobody can attribute). So:
//! - node-local questions go to every master over a direct connection ([`ClusterRouter::on_each_master`]), each
//!   answer with its node;
//! - multi-slot reads ([`ClusterRouter::read_many`]) are grouped per master, one pipeline each, sent
//!   concurrently; a reply that is a `MOVED` / `ASK` / `TRYAGAIN` (a slot moving, a failover), or a node that
//!   fails, is asked again, that command alone, through the cluster connection, which follows redirects. Only
//!   reads go this way: asking again is harmless.

use std::collections::{BTreeMap, HashMap};

use redis::{Cmd, RedisError, RedisResult, Value};

use crate::connection::Connection;
use crate::router::ClusterRouter;
use crate::topology::{NodeAddr, TopologyError};

/// Why the masters could not all be reached.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MastersError {
    /// No slot map could be read.
    #[error(transparent)]
    Topology(#[from] TopologyError),
    /// A master could not be connected to.
    #[error("cluster node {node}: {source}")]
    Node {
        /// The master.
        node: NodeAddr,
        /// What failed.
        #[source]
        source: RedisError,
    },
}

/// Whether a per-command reply means "ask again elsewhere or later": a redirect, a slot in migration, a cluster
/// that is reconfiguring, or a connection problem.
fn ask_again(e: &RedisError) -> bool {
    use redis::{ErrorKind, ServerErrorKind};
    crate::redirect::Redirect::from_error(e).is_some()
        || matches!(
            e.kind(),
            ErrorKind::Server(ServerErrorKind::TryAgain | ServerErrorKind::ClusterDown | ServerErrorKind::CrossSlot)
        )
        || e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
}

impl<N> ClusterRouter<N> {
    /// Every master (see [`ClusterRouter::masters`]), each with its shared direct connection
    /// ([`Connection::Node`]).
    ///
    /// # Errors
    /// No slot map; a master unreachable (named; its connection is dropped, the next call reconnects).
    pub async fn each_master(&self) -> Result<Vec<(NodeAddr, Connection)>, MastersError> {
        let mut nodes = Vec::new();
        for node in self.pool().refresh().await?.masters() {
            match self.pool().connection(&node).await {
                Ok(conn) => nodes.push((node, Connection::Node(conn))),
                Err(source) => {
                    self.pool().forget(&node);
                    return Err(MastersError::Node { node, source });
                }
            }
        }
        Ok(nodes)
    }

    /// Runs `cmd` on every master, concurrently; one answer per master, in the masters' order. A master whose
    /// connection failed is reconnected on the next call.
    ///
    /// # Errors
    /// As [`ClusterRouter::each_master`].
    pub async fn on_each_master<T: redis::FromRedisValue + Send>(
        &self,
        cmd: &Cmd,
    ) -> Result<Vec<(NodeAddr, RedisResult<T>)>, MastersError> {
        let nodes = self.each_master().await?;
        Ok(
            futures::future::join_all(nodes.into_iter().map(|(node, mut conn)| async move {
                let answer: RedisResult<T> = cmd.query_async(&mut conn).await;
                if let Err(e) = &answer {
                    if !matches!(e.kind(), redis::ErrorKind::Server(_)) {
                        self.pool().forget(&node);
                    }
                }
                (node, answer)
            }))
            .await,
        )
    }

    /// Runs read-only commands whose keys may lie in different slots; answers in order, one result per command
    /// (a command's own error, such as `XINFO` on a missing key, is its result). `reads` pairs each command with
    /// the key that routes it. One pipeline per master, then each command that met a redirect or a failing node
    /// once more alone through `cluster` (redis-rs's cluster connection, which follows redirects); without a
    /// slot map, every command goes that way.
    pub async fn read_many(&self, reads: &[(String, Cmd)], cluster: &Connection) -> Vec<RedisResult<Value>> {
        let mut by_node: BTreeMap<NodeAddr, Vec<usize>> = BTreeMap::new();
        match self.slot_map().await {
            Ok(map) => {
                for (i, (key, _)) in reads.iter().enumerate() {
                    by_node
                        .entry(map.master_of_key(key.as_bytes()).clone())
                        .or_default()
                        .push(i);
                }
            }
            Err(e) => tracing::debug!(error = %e, "no slot map; reads go one by one"),
        }
        let batches = futures::future::join_all(by_node.into_iter().map(|(node, indices)| async move {
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            for &i in &indices {
                pipe.add_command(reads[i].1.clone());
            }
            let replies: RedisResult<Vec<RedisResult<Value>>> = match self.pool().connection(&node).await {
                Ok(mut conn) => pipe.query_async(&mut conn).await,
                Err(e) => Err(e),
            };
            if let Err(e) = &replies {
                if !matches!(e.kind(), redis::ErrorKind::Server(_)) {
                    self.pool().forget(&node);
                }
            }
            (indices, replies)
        }))
        .await;
        let mut results: HashMap<usize, RedisResult<Value>> = HashMap::with_capacity(reads.len());
        let mut moved = false;
        for (indices, replies) in batches {
            let Ok(replies) = replies else { continue };
            for (i, reply) in indices.into_iter().zip(replies) {
                match reply {
                    Err(e) if ask_again(&e) => moved = true,
                    other => {
                        results.insert(i, other);
                    }
                }
            }
        }
        if moved {
            // The next reads should go straight to the new owners.
            let _ = self.refresh().await;
        }
        let again = futures::future::join_all((0..reads.len()).filter(|i| !results.contains_key(i)).map(|i| {
            let mut conn = cluster.clone();
            async move { (i, reads[i].1.query_async::<Value>(&mut conn).await) }
        }))
        .await;
        results.extend(again);
        (0..reads.len())
            .map(|i| results.remove(&i).unwrap_or(Ok(Value::Nil)))
            .collect()
    }
}

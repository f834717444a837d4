//! What the store asks of every master of a Redis Cluster, and reads that span slots.
//!
//! redis-rs's cluster connection routes a keyed command to its slot's master, refuses a pipeline whose keys span
//! slots, and sends keyless node-local commands (`INFO`, `TIME`, `SCAN`, `COMMAND INFO`) to a node of its choice
//! (or to all, merging answers this code cannot attribute). So on a cluster:
//! - node-local questions go to every master over a direct connection ([`Store::each_master`]), and a failure
//!   names the node ([`StoreError::Node`]);
//! - multi-slot reads ([`Store::read_many`]) are grouped per master, one pipeline each, sent concurrently; a reply
//!   that is a `MOVED` / `ASK` / `TRYAGAIN` (a slot moving, a failover) or a node that fails is asked again, that
//!   command alone, through the cluster connection, which follows redirects. Only reads go this way: re-sending a
//!   read is harmless.
//!
//! On one server both are what they were: the shared connection, one pipeline.

use std::collections::{BTreeMap, HashMap};

use redis::{Cmd, RedisResult, Value};
use redis_link::{Connection, NodeAddr};

use super::Store;
use crate::error::StoreError;

/// One node the store asks directly: its address (`None` on a single server) and a connection to it.
pub struct Node {
    /// The cluster node's address; `None` for the single server.
    pub addr: Option<NodeAddr>,
    /// A connection to it: the shared one on a single server, a direct one ([`Connection::Node`]) on a cluster.
    pub conn: Connection,
}

impl Node {
    /// `e` as a failure of this node (unchanged on a single server, where there is one node).
    pub fn failed(&self, e: StoreError) -> StoreError {
        match &self.addr {
            Some(addr) => e.on_node(addr),
            None => e,
        }
    }
}

/// Whether a per-command reply means "ask again elsewhere or later": a redirect, a slot in migration, a cluster
/// that is reconfiguring, or a connection problem.
fn must_retry(e: &redis::RedisError) -> bool {
    use redis::{ErrorKind, ServerErrorKind};
    redis_link::Redirect::from_error(e).is_some()
        || matches!(
            e.kind(),
            ErrorKind::Server(ServerErrorKind::TryAgain | ServerErrorKind::ClusterDown | ServerErrorKind::CrossSlot)
        )
        || e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
}

impl Store {
    /// Every master of the cluster (by a slot map read now, so a failover since the last call is seen), each
    /// with a direct connection; on a single server, the server.
    ///
    /// # Errors
    /// No slot map could be read; a master unreachable (named).
    pub async fn each_master(&self) -> Result<Vec<Node>, StoreError> {
        let Some(pool) = &self.nodes else {
            return Ok(vec![Node {
                addr: None,
                conn: self.conn.clone(),
            }]);
        };
        let map = pool.refresh().await.map_err(topology)?;
        let mut nodes = Vec::new();
        for addr in map.masters() {
            let conn = match pool.connection(&addr).await {
                Ok(conn) => conn,
                Err(e) => {
                    pool.forget(&addr);
                    return Err(StoreError::Redis(e).on_node(&addr));
                }
            };
            nodes.push(Node {
                addr: Some(addr),
                conn: Connection::Node(conn),
            });
        }
        Ok(nodes)
    }

    /// Runs `cmd` on every master (see [`Store::each_master`]); answers in the masters' order.
    ///
    /// # Errors
    /// Any master's failure, naming it.
    pub async fn on_each_master<T: redis::FromRedisValue + Send>(
        &self,
        cmd: &Cmd,
    ) -> Result<Vec<(Option<NodeAddr>, T)>, StoreError> {
        let nodes = self.each_master().await?;
        let answers = futures::future::join_all(nodes.into_iter().map(|mut node| async move {
            let r: RedisResult<T> = cmd.query_async(&mut node.conn).await;
            match r {
                Ok(v) => Ok((node.addr, v)),
                Err(e) => {
                    if let (Some(pool), Some(addr)) = (&self.nodes, &node.addr) {
                        if !matches!(e.kind(), redis::ErrorKind::Server(_)) {
                            pool.forget(addr);
                        }
                    }
                    Err(node.failed(StoreError::Redis(e)))
                }
            }
        }))
        .await;
        answers.into_iter().collect()
    }

    /// The run id of every master (`INFO server`), by address; on a single server, one entry without one.
    ///
    /// # Errors
    /// Any master's failure, naming it; an answer without `run_id`.
    pub async fn master_run_ids(&self) -> Result<Vec<(Option<NodeAddr>, String)>, StoreError> {
        let infos: Vec<(Option<NodeAddr>, String)> = self.on_each_master(redis::cmd("INFO").arg("server")).await?;
        infos
            .into_iter()
            .map(|(addr, info)| {
                let id = info
                    .lines()
                    .find_map(|l| l.strip_prefix("run_id:"))
                    .map(|s| s.trim().to_owned())
                    .ok_or_else(|| StoreError::Protocol("INFO server has no run_id".into()));
                match (id, &addr) {
                    (Ok(id), _) => Ok((addr, id)),
                    (Err(e), Some(a)) => Err(e.on_node(a)),
                    (Err(e), None) => Err(e),
                }
            })
            .collect()
    }

    /// Runs read-only commands whose keys may lie in different slots; answers in order, one result per command
    /// (a command's own error, such as `XINFO` on a missing key, is its result). `reads` pairs each command with
    /// the key that routes it. On a single server: one pipeline. On a cluster: one pipeline per master, then each
    /// command that met a redirect or a failing node once more alone through the cluster connection.
    ///
    /// # Errors
    /// A failure of the single server's pipeline; on a cluster, only the retry's connection errors are reported
    /// per command.
    pub async fn read_many(&self, reads: &[(String, Cmd)]) -> Result<Vec<RedisResult<Value>>, StoreError> {
        if reads.is_empty() {
            return Ok(Vec::new());
        }
        let Some(pool) = &self.nodes else {
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            for (_, cmd) in reads {
                pipe.add_command(cmd.clone());
            }
            let mut conn = self.conn.clone();
            return Ok(pipe.query_async(&mut conn).await?);
        };
        let mut by_node: BTreeMap<NodeAddr, Vec<usize>> = BTreeMap::new();
        match pool.slot_map().await {
            Ok(map) => {
                for (i, (key, _)) in reads.iter().enumerate() {
                    by_node
                        .entry(map.master_of_key(key.as_bytes()).clone())
                        .or_default()
                        .push(i);
                }
            }
            // Without a map every read goes through the cluster connection below.
            Err(e) => tracing::debug!(error = %e, "no slot map; reads go one by one"),
        }
        let mut results: HashMap<usize, RedisResult<Value>> = HashMap::with_capacity(reads.len());
        let batches = futures::future::join_all(by_node.into_iter().map(|(addr, indices)| async move {
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            for &i in &indices {
                pipe.add_command(reads[i].1.clone());
            }
            let replies: RedisResult<Vec<RedisResult<Value>>> = match pool.connection(&addr).await {
                Ok(mut conn) => pipe.query_async(&mut conn).await,
                Err(e) => Err(e),
            };
            if let Err(e) = &replies {
                if !matches!(e.kind(), redis::ErrorKind::Server(_)) {
                    pool.forget(&addr);
                }
            }
            (indices, replies)
        }))
        .await;
        let mut moved = false;
        for (indices, replies) in batches {
            let Ok(replies) = replies else { continue };
            for (i, reply) in indices.into_iter().zip(replies) {
                match reply {
                    Err(e) if must_retry(&e) => moved = true,
                    other => {
                        results.insert(i, other);
                    }
                }
            }
        }
        if moved {
            // The next reads should go straight to the new owners.
            let _ = pool.refresh().await;
        }
        let retries = futures::future::join_all((0..reads.len()).filter(|i| !results.contains_key(i)).map(|i| {
            let mut conn = self.conn.clone();
            async move { (i, reads[i].1.query_async::<Value>(&mut conn).await) }
        }))
        .await;
        results.extend(retries);
        Ok((0..reads.len())
            .map(|i| results.remove(&i).unwrap_or(Ok(Value::Nil)))
            .collect())
    }

    /// The largest Redis `TIME` of the masters, in ms (the server's on a single server): a deadline computed from
    /// it has not passed yet on any master whose clock is behind.
    ///
    /// # Errors
    /// Any master's failure, naming it.
    pub async fn max_time_ms(&self) -> Result<u64, StoreError> {
        let times: Vec<(Option<NodeAddr>, (u64, u64))> = self.on_each_master(&redis::cmd("TIME")).await?;
        Ok(times
            .into_iter()
            .map(|(_, (secs, micros))| super::time_ms(secs, micros))
            .max()
            .unwrap_or(0))
    }
}

fn topology(e: redis_link::TopologyError) -> StoreError {
    StoreError::Redis(redis::RedisError::from((
        redis::ErrorKind::Io,
        "cannot read the cluster's slot map",
        e.to_string(),
    )))
}

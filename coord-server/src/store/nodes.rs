//! What the store asks of every master of a Redis Cluster, and reads that span slots: routed by
//! [`redis_link::ClusterRouter`] (`on_each_master`, `read_many`); what stays here is the store's error mapping
//! (a failure names its node, [`StoreError::Node`]) and the single-server path.
//!
//! On one server both are what they were: the shared connection, one pipeline.

use redis::{Cmd, RedisResult, Value};
use redis_link::{Connection, MastersError, NodeAddr};

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

/// The router's failure as the store's: a node's names it.
fn masters_error(e: MastersError) -> StoreError {
    match e {
        MastersError::Node { node, source } => StoreError::Redis(source).on_node(&node),
        other => StoreError::Redis(redis::RedisError::from((
            redis::ErrorKind::Io,
            "cannot read the cluster's slot map",
            other.to_string(),
        ))),
    }
}

impl Store {
    /// Every master of the cluster (by a slot map read now, so a failover since the last call is seen), each
    /// with a direct connection; on a single server, the server.
    ///
    /// # Errors
    /// No slot map could be read; a master unreachable (named).
    pub async fn each_master(&self) -> Result<Vec<Node>, StoreError> {
        let Some(router) = &self.nodes else {
            return Ok(vec![Node {
                addr: None,
                conn: self.conn.clone(),
            }]);
        };
        let nodes = router.each_master().await.map_err(masters_error)?;
        Ok(nodes
            .into_iter()
            .map(|(addr, conn)| Node { addr: Some(addr), conn })
            .collect())
    }

    /// Runs `cmd` on every master (see [`Store::each_master`]); answers in the masters' order.
    ///
    /// # Errors
    /// Any master's failure, naming it.
    pub async fn on_each_master<T: redis::FromRedisValue + Send>(
        &self,
        cmd: &Cmd,
    ) -> Result<Vec<(Option<NodeAddr>, T)>, StoreError> {
        let Some(router) = &self.nodes else {
            let mut conn = self.conn.clone();
            return Ok(vec![(
                None,
                cmd.query_async(&mut conn).await.map_err(StoreError::Redis)?,
            )]);
        };
        let answers = router.on_each_master::<T>(cmd).await.map_err(masters_error)?;
        answers
            .into_iter()
            .map(|(addr, answer)| match answer {
                Ok(v) => Ok((Some(addr), v)),
                Err(e) => Err(StoreError::Redis(e).on_node(&addr)),
            })
            .collect()
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
    /// the key that routes it. On a single server: one pipeline. On a cluster:
    /// [`redis_link::ClusterRouter::read_many`] (one pipeline per master, then each command that met a redirect
    /// or a failing node once more alone through the cluster connection).
    ///
    /// # Errors
    /// A failure of the single server's pipeline; on a cluster, only the retry's connection errors are reported
    /// per command.
    pub async fn read_many(&self, reads: &[(String, Cmd)]) -> Result<Vec<RedisResult<Value>>, StoreError> {
        if reads.is_empty() {
            return Ok(Vec::new());
        }
        let Some(router) = &self.nodes else {
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            for (_, cmd) in reads {
                pipe.add_command(cmd.clone());
            }
            let mut conn = self.conn.clone();
            return Ok(pipe.query_async(&mut conn).await?);
        };
        Ok(router.read_many(reads, &self.conn).await)
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

//! A primary and its replica, for failover tests.

use redis::aio::MultiplexedConnection;

use crate::server::{RedisServer, RedisServerBuilder};

/// Milliseconds [`ReplicaPair::wait_replicated`] lets `WAIT` block.
const WAIT_TIMEOUT_MS: u64 = 5000;
/// Channel [`ReplicaPair::wait_replicated`] publishes to.
const OFFSET_CHANNEL: &str = "__test_support__:wait_replicated";

/// A primary and one replica that has completed its initial synchronisation.
///
/// Typical failover test: write version N-1 on the primary,
/// [`wait_replicated`](Self::wait_replicated),
/// [`promote_replica`](Self::promote_replica) (the replication cut), write
/// version N on the old primary only, then kill the primary: the promoted
/// replica has lost write N.
#[derive(Debug)]
pub struct ReplicaPair {
    /// The primary.
    pub primary: RedisServer,
    /// The replica of [`primary`](Self::primary) (a primary itself once
    /// promoted).
    pub replica: RedisServer,
}

impl ReplicaPair {
    /// Starts a primary and a replica with default options.
    ///
    /// # Panics
    ///
    /// As [`RedisServerBuilder::start`].
    pub async fn start() -> ReplicaPair {
        Self::start_with(RedisServer::builder()).await
    }

    /// Starts a primary and a replica, both with `options` (any
    /// [`replica_of`](RedisServerBuilder::replica_of) in `options` is
    /// replaced). Returns once the replica's link to the primary is up.
    ///
    /// # Panics
    ///
    /// As [`RedisServerBuilder::start`].
    pub async fn start_with(options: RedisServerBuilder) -> ReplicaPair {
        let mut primary_options = options.clone();
        primary_options.clear_replica_of();
        let primary = primary_options.start().await;
        let replica = options.replica_of(&primary).start().await;
        ReplicaPair { primary, replica }
    }

    /// Waits until the replica has applied every write made so far on the
    /// primary, by any connection: `PUBLISH` (which is replicated but touches
    /// no key) followed by `WAIT 1 5000` on the same connection.
    ///
    /// # Panics
    ///
    /// Panics (with both logs) if `WAIT` fails or reports no acknowledging
    /// replica within 5 seconds.
    pub async fn wait_replicated(&self) {
        if let Err(e) = replicated(&self.primary).await {
            panic!(
                "{e}\nprimary:\n{}\nreplica:\n{}",
                self.primary.log_report(),
                self.replica.log_report()
            );
        }
    }

    /// Promotes the replica to a primary (`REPLICAOF NO ONE`) and waits until
    /// it reports `role:master`. From then on, writes to the old primary no
    /// longer reach it.
    ///
    /// # Panics
    ///
    /// As [`RedisServer::promote`].
    pub async fn promote_replica(&self) {
        self.replica.promote().await;
    }
}

/// Waits until every replica of `primary` (at least one) has applied every write made so far on it, by any
/// connection: what [`ReplicaPair::wait_replicated`] does, for a test that holds the two servers apart.
///
/// # Panics
///
/// Panics (with the primary's log) if `WAIT` fails or no replica acknowledges within 5 s.
pub async fn wait_replicated(primary: &RedisServer) {
    if let Err(e) = replicated(primary).await {
        panic!("{e}\nprimary:\n{}", primary.log_report());
    }
}

/// `PUBLISH` then `WAIT 1` on one connection of `primary`.
async fn replicated(primary: &RedisServer) -> Result<(), String> {
    let mut con: MultiplexedConnection = primary.connection().await;
    // WAIT only covers the writes of the connection that sends it, and a fresh connection has none, so WAIT would
    // return at once. A PUBLISH is propagated to replicas without touching the keyspace; it moves this
    // connection's replication offset past every earlier write of any client.
    let published: Result<i64, _> = redis::cmd("PUBLISH")
        .arg(OFFSET_CHANNEL)
        .arg("wait")
        .query_async(&mut con)
        .await;
    if let Err(e) = published {
        return Err(format!("PUBLISH on the primary failed: {e}"));
    }
    let acked: Result<i64, _> = redis::cmd("WAIT")
        .arg(1)
        .arg(WAIT_TIMEOUT_MS)
        .query_async(&mut con)
        .await;
    match acked {
        Ok(n) if n >= 1 => Ok(()),
        other => Err(format!(
            "WAIT 1 {WAIT_TIMEOUT_MS} on the primary returned {other:?}: the replica did not acknowledge the writes"
        )),
    }
}

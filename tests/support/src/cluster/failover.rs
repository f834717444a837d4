//! Failures a test makes happen: a node killed (`kill -9`), the others noticing it, and a replica taking over.

use tokio::time::{sleep, Instant};

use super::{NodeEntry, RedisCluster, CLUSTER_TIMEOUT, EPOCH_BUMP_AFTER};
use crate::server::info_field;
use crate::wait::POLL_INTERVAL;

impl RedisCluster {
    /// Kills node `index` with SIGKILL (`kill -9`): nothing flushed, no goodbye to the other nodes, which flag it
    /// failed after the node timeout. Does nothing if it is not running.
    pub fn kill(&self, index: usize) {
        self.node(index).server.kill();
    }

    /// Waits until every running node flags node `index` as failing (`fail?` or `fail`), i.e. the node timeout
    /// has passed since it stopped answering.
    ///
    /// # Panics
    ///
    /// Panics (with every node's log) if that does not happen within [`CLUSTER_TIMEOUT`].
    pub async fn wait_failing(&self, index: usize) {
        let id = self.node(index).id.clone();
        self.wait_views(
            &format!("every running node to flag node {index} failing"),
            |i, entries| i == index || entries.iter().any(|e| e.id == id && e.failing),
        )
        .await;
    }

    /// Promotes replica `index` with `CLUSTER FAILOVER TAKEOVER` (no agreement of the other masters, no sync with
    /// its master: what the old master wrote after the replica's last replication is lost) and waits until every
    /// running node sees it as the master of its old master's slots.
    ///
    /// # Panics
    ///
    /// Panics (with every node's log) if the node is not a replica, the command fails, or the running nodes do not
    /// agree on the new roles within [`CLUSTER_TIMEOUT`].
    pub async fn takeover(&self, index: usize) {
        let node = self.node(index);
        let view = self.view_of(index).await;
        let me = view.iter().find(|e| e.id == node.id).cloned();
        let Some(old_master) = me.and_then(|e| e.replica_of) else {
            self.fail(format_args!("node {index} is not a replica; cannot take over"))
        };
        let slots = view
            .iter()
            .find(|e| e.id == old_master)
            .map(|e| e.slots.clone())
            .unwrap_or_default();
        let mut con = node.server.connection().await;
        self.query::<()>(
            index,
            &mut con,
            redis::cmd("CLUSTER").arg("FAILOVER").arg("TAKEOVER"),
            "CLUSTER FAILOVER TAKEOVER",
        )
        .await;
        let id = node.id.clone();
        let agreed = |views: &[(usize, Vec<NodeEntry>)]| {
            views.iter().all(|(_, entries)| {
                entries
                    .iter()
                    .any(|e| e.id == id && e.master && !e.failing && e.slots == slots)
            })
        };
        // TAKEOVER bumps the replica's config epoch only when it is not already the greatest; when it shares
        // the greatest with its dead master, the others keep the dead master's claim forever (it sends no pings
        // that would resolve the collision). Seen once in CI. So, when the claim is not accepted soon: bump the
        // epoch of another live master, then the new master's (now not the greatest: it bumps above all).
        let deadline = Instant::now() + CLUSTER_TIMEOUT;
        let mut bump_at = Instant::now() + EPOCH_BUMP_AFTER;
        loop {
            let views = self.views().await;
            if agreed(&views) {
                break;
            }
            if Instant::now() >= deadline {
                self.fail(format_args!(
                    "timed out after {CLUSTER_TIMEOUT:?} waiting for node {index} to be the master of {slots:?} on \
                     every running node: {views:?}"
                ));
            }
            if Instant::now() >= bump_at {
                bump_at = Instant::now() + EPOCH_BUMP_AFTER;
                // A takeover the live old master won back (its claim carried the greater epoch) leaves the node a
                // replica again, and bumping epochs alone never makes it master: take over once more. Seen once
                // in CI: every node, the old master included, still listed the node as its replica after 30 s.
                let still_replica = views
                    .iter()
                    .find(|(i, _)| *i == index)
                    .is_some_and(|(_, v)| v.iter().any(|e| e.id == id && !e.master));
                if still_replica {
                    let _: Result<String, _> = redis::cmd("CLUSTER")
                        .arg("FAILOVER")
                        .arg("TAKEOVER")
                        .query_async(&mut con)
                        .await;
                }
                let other = views.iter().map(|(i, _)| *i).find(|&i| {
                    i != index
                        && views
                            .iter()
                            .any(|(_, v)| v.iter().any(|e| e.id == self.node(i).id && e.master))
                });
                if let Some(other) = other {
                    let mut c = self.node(other).server.connection().await;
                    let _: Result<String, _> = redis::cmd("CLUSTER").arg("BUMPEPOCH").query_async(&mut c).await;
                }
                let _: Result<String, _> = redis::cmd("CLUSTER").arg("BUMPEPOCH").query_async(&mut con).await;
            }
            sleep(POLL_INTERVAL).await;
        }
        loop {
            let info = node.server.info("replication").await;
            if info_field(&info, "role") == Some("master") {
                return;
            }
            if Instant::now() >= deadline {
                self.fail(format_args!(
                    "node {index} does not report role:master after TAKEOVER:\n{info}"
                ));
            }
            sleep(POLL_INTERVAL).await;
        }
    }
}

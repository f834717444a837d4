//! A private local Redis Cluster for the demo's and the benchmarks' `--cluster` mode: three `redis-server
//! --cluster-enabled yes` masters on free loopback ports ([`RedisLauncher`]), each with its own cluster bus port,
//! formed without `redis-cli`: every master takes an even third of the 16384 slots (`CLUSTER ADDSLOTSRANGE`) and
//! meets the others (`CLUSTER MEET`); ready once every node says `cluster_state:ok` and agrees on the slot map.
//! Killed when dropped, like the single server.
//!
//! [`ClusterLauncher::owner_of_slot`] tells which master serves a slot (the demo prints the spread of its shards),
//! and [`ClusterLauncher::migrate_slot`] moves one slot with its keys live to another master (`IMPORTING` /
//! `MIGRATING`, `MIGRATE ... KEYS`, `SETSLOT NODE`), as an operator rebalancing a cluster does.

use std::time::{Duration, Instant};

use crate::redis_launcher::{free_port, LaunchError, RedisLauncher};

/// Masters of the local cluster.
pub const MASTERS: usize = 3;

/// How long forming the cluster, or agreeing on a migrated slot's new master, may take.
pub const FORM_TIMEOUT: Duration = Duration::from_secs(30);

/// Keys moved by one `MIGRATE` of [`ClusterLauncher::migrate_slot`].
const MIGRATE_BATCH: usize = 100;

/// `MIGRATE`'s timeout, in milliseconds.
const MIGRATE_TIMEOUT_MS: u64 = 5_000;

/// How long the nodes may disagree on a migrated slot before its new master claims it again with a fresh epoch.
const RECLAIM_AFTER: Duration = Duration::from_secs(5);

/// A slot moved by [`ClusterLauncher::migrate_slot`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotMove {
    /// The slot.
    pub slot: u16,
    /// Index (into [`ClusterLauncher::nodes`]) of the master that served it.
    pub from: usize,
    /// Index of the master that serves it now.
    pub to: usize,
    /// How many keys moved with it.
    pub keys: usize,
    /// How long the move took, from `IMPORTING` until every node agreed on the new master.
    pub took: Duration,
}

/// One line of `CLUSTER NODES`: the node's id, client port, whether it is a master, and its slot ranges.
#[derive(Debug, Clone, PartialEq, Eq)]
struct NodeLine {
    id: String,
    port: u16,
    master: bool,
    slots: Vec<(u16, u16)>,
}

/// Parses `CLUSTER NODES` (migration markers `[slot->-id]` are left out of the slots).
fn parse_nodes(text: &str) -> Vec<NodeLine> {
    text.lines()
        .filter_map(|line| {
            let parts: Vec<&str> = line.split_whitespace().collect();
            if parts.len() < 8 {
                return None;
            }
            let port = parts[1].split('@').next()?.rsplit(':').next()?.parse().ok()?;
            let slots = parts[8..]
                .iter()
                .filter(|s| !s.starts_with('['))
                .filter_map(|s| match s.split_once('-') {
                    Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                    None => s.parse().ok().map(|a| (a, a)),
                })
                .collect();
            Some(NodeLine {
                id: parts[0].to_owned(),
                port,
                master: parts[2].split(',').any(|f| f == "master"),
                slots,
            })
        })
        .collect()
}

/// A field of `CLUSTER INFO`.
fn info_field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|l| l.trim().strip_prefix(name).and_then(|rest| rest.strip_prefix(':')))
}

/// A running private cluster.
#[derive(Debug)]
pub struct ClusterLauncher {
    nodes: Vec<RedisLauncher>,
    /// Each node's cluster bus port (`CLUSTER MEET` must name it: it is not the client port + 10000 here).
    buses: Vec<u16>,
}

impl ClusterLauncher {
    /// Starts [`MASTERS`] nodes and forms the cluster.
    ///
    /// # Errors
    /// As [`RedisLauncher::start`]; [`LaunchError::Failed`] when the cluster does not form within
    /// [`FORM_TIMEOUT`].
    pub async fn start() -> Result<ClusterLauncher, LaunchError> {
        let mut nodes = Vec::with_capacity(MASTERS);
        let mut buses = Vec::with_capacity(MASTERS);
        for _ in 0..MASTERS {
            let bus = free_port().map_err(|e| LaunchError::Failed {
                reason: format!("cannot find a free port: {e}"),
                log_tail: String::new(),
            })?;
            nodes.push(
                RedisLauncher::start_with(|_| {
                    [
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--cluster-node-timeout",
                        "5000",
                        "--cluster-port",
                        &bus.to_string(),
                    ]
                    .iter()
                    .map(|s| (*s).to_owned())
                    .collect()
                })
                .await?,
            );
            buses.push(bus);
        }
        let cluster = ClusterLauncher { nodes, buses };
        cluster.form().await.map_err(|reason| LaunchError::Failed {
            reason: format!("the local cluster did not form: {reason}"),
            log_tail: String::new(),
        })?;
        Ok(cluster)
    }

    async fn form(&self) -> Result<(), String> {
        let mut conns = Vec::with_capacity(self.nodes.len());
        for node in &self.nodes {
            let client = redis::Client::open(node.url()).map_err(|e| e.to_string())?;
            conns.push(
                client
                    .get_multiplexed_async_connection()
                    .await
                    .map_err(|e| e.to_string())?,
            );
        }
        let n = conns.len() as u32;
        for (i, conn) in conns.iter_mut().enumerate() {
            let i = i as u32;
            let first = i * 16384 / n;
            let last = (i + 1) * 16384 / n - 1;
            redis::cmd("CLUSTER")
                .arg("ADDSLOTSRANGE")
                .arg(first)
                .arg(last)
                .query_async::<()>(conn)
                .await
                .map_err(|e| format!("ADDSLOTSRANGE on node {i}: {e}"))?;
        }
        let (first_port, first_bus) = (self.nodes[0].port(), self.buses[0]);
        for (i, conn) in conns.iter_mut().enumerate().skip(1) {
            redis::cmd("CLUSTER")
                .arg("MEET")
                .arg("127.0.0.1")
                .arg(first_port)
                .arg(first_bus)
                .query_async::<()>(conn)
                .await
                .map_err(|e| format!("MEET from node {i}: {e}"))?;
        }
        let deadline = Instant::now() + FORM_TIMEOUT;
        loop {
            if self.formed(&mut conns).await {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "not every node says cluster_state:ok within {} s",
                    FORM_TIMEOUT.as_secs()
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Every node is in state ok and knows every node.
    async fn formed(&self, conns: &mut [redis::aio::MultiplexedConnection]) -> bool {
        for conn in conns.iter_mut() {
            let info: String = match redis::cmd("CLUSTER").arg("INFO").query_async(conn).await {
                Ok(info) => info,
                Err(_) => return false,
            };
            let ok = info.lines().any(|l| l.trim() == "cluster_state:ok");
            let known = info
                .lines()
                .find_map(|l| l.trim().strip_prefix("cluster_known_nodes:"))
                .and_then(|v| v.parse::<usize>().ok());
            if !ok || known != Some(self.nodes.len()) {
                return false;
            }
        }
        true
    }

    /// The target the components take: `cluster:` and every node's URL.
    pub fn target(&self) -> String {
        let urls: Vec<String> = self.nodes.iter().map(RedisLauncher::url).collect();
        format!("cluster:{}", urls.join(","))
    }

    /// The nodes.
    pub fn nodes(&self) -> &[RedisLauncher] {
        &self.nodes
    }

    async fn connection(&self, index: usize) -> Result<redis::aio::MultiplexedConnection, String> {
        let client = redis::Client::open(self.nodes[index].url()).map_err(|e| e.to_string())?;
        client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| format!("node {index}: {e}"))
    }

    async fn query<T: redis::FromRedisValue>(&self, index: usize, cmd: &redis::Cmd) -> Result<T, String> {
        let mut con = self.connection(index).await?;
        cmd.query_async(&mut con)
            .await
            .map_err(|e| format!("node {index} (port {}): {e}", self.nodes[index].port()))
    }

    /// `CLUSTER NODES` of node `index`, parsed.
    async fn view_of(&self, index: usize) -> Result<Vec<NodeLine>, String> {
        let text: String = self.query(index, redis::cmd("CLUSTER").arg("NODES")).await?;
        Ok(parse_nodes(&text))
    }

    /// The index of the node with client port `port`.
    fn index_of_port(&self, port: u16) -> Option<usize> {
        self.nodes.iter().position(|n| n.port() == port)
    }

    /// The index of the master serving `slot`, once every node agrees on it.
    ///
    /// # Errors
    /// A node that does not answer, or no agreement within [`FORM_TIMEOUT`].
    pub async fn owner_of_slot(&self, slot: u16) -> Result<usize, String> {
        let deadline = Instant::now() + FORM_TIMEOUT;
        loop {
            let mut owners = Vec::with_capacity(self.nodes.len());
            for index in 0..self.nodes.len() {
                let view = self.view_of(index).await?;
                owners.push(
                    view.iter()
                        .find(|n| n.master && n.slots.iter().any(|&(a, b)| a <= slot && slot <= b))
                        .and_then(|n| self.index_of_port(n.port)),
                );
            }
            if let Some(Some(first)) = owners.first() {
                if owners.iter().all(|o| *o == Some(*first)) {
                    return Ok(*first);
                }
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "the nodes do not agree on the master of slot {slot}: {owners:?}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn epoch(&self, index: usize) -> Result<u64, String> {
        let info: String = self.query(index, redis::cmd("CLUSTER").arg("INFO")).await?;
        info_field(&info, "cluster_my_epoch")
            .and_then(|e| e.parse().ok())
            .ok_or_else(|| format!("node {index}: no cluster_my_epoch in CLUSTER INFO"))
    }

    /// Raises `winner`'s config epoch above `loser`'s. A master claims a slot with its config epoch; when that
    /// epoch does not order it above the slot's previous master, the previous master's claim still in gossip can
    /// win, and a master that loses a slot it holds keys of deletes them. `CLUSTER BUMPEPOCH` raises only a node
    /// that is not already at the greatest epoch it knows, so a tie at the top is broken by raising a third node.
    async fn outrank(&self, winner: usize, loser: usize) -> Result<(), String> {
        let deadline = Instant::now() + FORM_TIMEOUT;
        while self.epoch(winner).await? <= self.epoch(loser).await? {
            if Instant::now() >= deadline {
                return Err(format!("node {winner}'s config epoch stays at or below node {loser}'s"));
            }
            let reply: String = self.query(winner, redis::cmd("CLUSTER").arg("BUMPEPOCH")).await?;
            if reply.starts_with("STILL") {
                let third = (0..self.nodes.len())
                    .find(|&i| i != winner && i != loser)
                    .unwrap_or(loser);
                let _: String = self.query(third, redis::cmd("CLUSTER").arg("BUMPEPOCH")).await?;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    /// Moves `slot` with all its keys, live, from the master serving it to master `to`: `CLUSTER SETSLOT
    /// IMPORTING` on `to` and `MIGRATING` on the source (clients get `ASK` for keys already moved), `MIGRATE ...
    /// KEYS` in batches until the slot is empty on the source, then `to` outranks the source's config epoch and
    /// `CLUSTER SETSLOT NODE` goes to `to`, the source and the other masters (clients then get `MOVED`); returns
    /// once every node agrees that `to` serves the slot.
    ///
    /// # Errors
    /// A command that fails, or no agreement within [`FORM_TIMEOUT`].
    pub async fn migrate_slot(&self, slot: u16, to: usize) -> Result<SlotMove, String> {
        let started = Instant::now();
        let from = self.owner_of_slot(slot).await?;
        if from == to {
            return Err(format!("node {to} already serves slot {slot}"));
        }
        let id = |index: usize| async move { self.query::<String>(index, redis::cmd("CLUSTER").arg("MYID")).await };
        let (from_id, to_id) = (id(from).await?, id(to).await?);
        let setslot = |state: &'static str, node: &str| {
            let mut cmd = redis::cmd("CLUSTER");
            cmd.arg("SETSLOT").arg(slot).arg(state).arg(node);
            cmd
        };
        self.query::<()>(to, &setslot("IMPORTING", &from_id)).await?;
        self.query::<()>(from, &setslot("MIGRATING", &to_id)).await?;
        let mut keys = 0;
        loop {
            let batch: Vec<Vec<u8>> = self
                .query(
                    from,
                    redis::cmd("CLUSTER").arg("GETKEYSINSLOT").arg(slot).arg(MIGRATE_BATCH),
                )
                .await?;
            if batch.is_empty() {
                break;
            }
            let mut migrate = redis::cmd("MIGRATE");
            migrate
                .arg("127.0.0.1")
                .arg(self.nodes[to].port())
                .arg("")
                .arg(0)
                .arg(MIGRATE_TIMEOUT_MS)
                .arg("KEYS")
                .arg(&batch);
            self.query::<()>(from, &migrate).await?;
            keys += batch.len();
        }
        self.outrank(to, from).await?;
        let mut order = vec![to, from];
        order.extend((0..self.nodes.len()).filter(|&i| i != to && i != from));
        for index in order {
            self.query::<()>(index, &setslot("NODE", &to_id)).await?;
        }
        let deadline = Instant::now() + FORM_TIMEOUT;
        let mut reclaim_at = Instant::now() + RECLAIM_AFTER;
        loop {
            let mut agreed = true;
            for index in 0..self.nodes.len() {
                let serves = self
                    .view_of(index)
                    .await?
                    .iter()
                    .any(|n| n.id == to_id && n.master && n.slots.iter().any(|&(a, b)| a <= slot && slot <= b));
                agreed &= serves;
            }
            if agreed {
                break;
            }
            if Instant::now() >= deadline {
                return Err(format!("the nodes do not agree that node {to} serves slot {slot}"));
            }
            if Instant::now() >= reclaim_at {
                // A claim lost in gossip: claim again with a fresh epoch.
                let _: String = self.query(to, redis::cmd("CLUSTER").arg("BUMPEPOCH")).await?;
                self.query::<()>(to, &setslot("NODE", &to_id)).await?;
                reclaim_at = Instant::now() + RECLAIM_AFTER;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(SlotMove {
            slot,
            from,
            to,
            keys,
            took: started.elapsed(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_nodes_lines_give_ports_roles_and_slots_without_migration_markers() {
        let text = "a1 127.0.0.1:7001@17001 myself,master - 0 0 1 connected 0-5460 [5461->-b2]\n\
                    b2 127.0.0.1:7002@17002 master - 0 1 2 connected 5461-10922 12000\n\
                    c3 127.0.0.1:7003@17003 slave b2 0 1 2 connected\n";
        let nodes = parse_nodes(text);
        assert_eq!(nodes.len(), 3);
        assert_eq!(nodes[0].port, 7001);
        assert!(nodes[0].master);
        assert_eq!(nodes[0].slots, vec![(0, 5460)]);
        assert_eq!(nodes[1].slots, vec![(5461, 10922), (12000, 12000)]);
        assert!(!nodes[2].master);
        assert!(nodes[2].slots.is_empty());
    }

    #[test]
    fn cluster_info_fields_are_found_by_name() {
        let info = "cluster_state:ok\r\ncluster_my_epoch:7\r\ncluster_current_epoch:9\r\n";
        assert_eq!(info_field(info, "cluster_my_epoch"), Some("7"));
        assert_eq!(info_field(info, "cluster_state"), Some("ok"));
        assert_eq!(info_field(info, "cluster_size"), None);
    }
}

//! A local Redis Cluster of real `redis-server --cluster-enabled yes` processes, for tests.
//!
//! [`RedisCluster::start`] starts 3 masters; [`RedisCluster::builder`] with
//! [`replicas`](ClusterBuilder::replicas) adds one replica per master. The cluster is formed without
//! `redis-cli --cluster`: `CLUSTER ADDSLOTSRANGE` gives each master its even share of the 16384 slots (for 3
//! masters: 0-5460, 5461-10922, 10923-16383, the split `redis-cli --cluster create` makes), `CLUSTER MEET` joins the
//! nodes, `CLUSTER REPLICATE` attaches the replicas. Start-up returns once `CLUSTER INFO` says `cluster_state:ok`
//! on every node and every node's `CLUSTER NODES` agrees on the roles and the slot map; nothing waits on a fixed
//! sleep. Every node is killed when the cluster is dropped.
//!
//! Helpers for the scenarios: [`RedisCluster::owner_of_slot`] / [`owner_of_key`](RedisCluster::owner_of_key),
//! [`kill`](RedisCluster::kill) (`kill -9` of one node), [`takeover`](RedisCluster::takeover) (a replica promoted
//! with `CLUSTER FAILOVER TAKEOVER`), and [`migrate_slot`](RedisCluster::migrate_slot) (one slot moved live,
//! `CLUSTER SETSLOT ... IMPORTING/MIGRATING`, `MIGRATE ... KEYS` in batches, `SETSLOT ... NODE` on every master), also
//! in steps with [`begin_migration`](RedisCluster::begin_migration) so a test can write during the move.
//!
//! Automatic failover is off by default (`cluster-replica-no-failover yes`): a killed master stays down until the
//! test promotes its replica, so a failover happens exactly when the test says.
//!
//! # Layout
//! - `nodes`: `CLUSTER NODES` parsed ([`NodeEntry`]) and what every node must agree on.
//! - `form`: the cluster formed from fresh nodes.
//! - `failover`: `kill -9` of a node and a replica's takeover.
//! - `migration`: live slot migration ([`SlotMigration`]).

mod failover;
mod form;
mod migration;
mod nodes;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::FromRedisValue;
use tokio::time::{sleep, Instant};

use crate::server::{info_field, LaunchError, RedisServer};
use crate::wait::POLL_INTERVAL;
use nodes::{agreed_view, Agreed};

pub use migration::SlotMigration;
pub use nodes::{parse_cluster_nodes, NodeEntry};

pub use protocol::slot::{crc16, hash_tag, key_slot, SLOTS};

/// How long forming the cluster, a takeover or the end of a migration may take before the harness gives up.
pub const CLUSTER_TIMEOUT: Duration = Duration::from_secs(30);

/// Keys moved per `MIGRATE` by [`SlotMigration::move_keys`] callers that do not choose.
pub const MIGRATE_BATCH: usize = 100;

/// How long a takeover's claim may stay unaccepted before the harness bumps config epochs (see `takeover`).
const EPOCH_BUMP_AFTER: Duration = Duration::from_secs(5);

/// The even split of the 16384 slots over `masters` masters, as inclusive ranges: master `i` starts at
/// `round(i * 16384 / masters)`. For 3 masters: 0-5460, 5461-10922, 10923-16383. Empty for 0 masters.
pub fn even_slot_ranges(masters: usize) -> Vec<(u16, u16)> {
    let n = masters as u64;
    let start = |i: u64| ((2 * i * u64::from(SLOTS) + n) / (2 * n)) as u16;
    (0..n)
        .map(|i| {
            let end = if i + 1 == n { SLOTS - 1 } else { start(i + 1) - 1 };
            (start(i), end)
        })
        .collect()
}

/// Options of a [`RedisCluster`]; created by [`RedisCluster::builder`].
#[derive(Debug, Clone)]
pub struct ClusterBuilder {
    masters: usize,
    replicas: bool,
    node_timeout_ms: u64,
    automatic_failover: bool,
    /// The binary every node runs; `None`: the [`RedisServerBuilder`](crate::RedisServerBuilder) default.
    bin: Option<PathBuf>,
    aclfile: Option<PathBuf>,
    /// Every node TLS only, the cluster bus too (`tls-cluster yes`).
    tls: Option<crate::server::ServerTls>,
}

impl Default for ClusterBuilder {
    fn default() -> Self {
        ClusterBuilder {
            masters: 3,
            replicas: false,
            node_timeout_ms: 2000,
            automatic_failover: false,
            bin: None,
            aclfile: None,
            tls: None,
        }
    }
}

impl ClusterBuilder {
    /// Number of masters (default 3; at least 1).
    pub fn masters(mut self, masters: usize) -> Self {
        self.masters = masters.max(1);
        self
    }

    /// Every node serves TLS only, its cluster bus and replication too (`tls-cluster yes`,
    /// `tls-replication yes`; see [`RedisServerBuilder::tls`](crate::RedisServerBuilder::tls)): the URLs are
    /// `rediss://` and the nodes announce their TLS ports.
    pub fn tls(mut self, tls: crate::server::ServerTls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Whether every master gets one replica (default: no). Node `masters + i` replicates master `i`.
    pub fn replicas(mut self, replicas: bool) -> Self {
        self.replicas = replicas;
        self
    }

    /// `cluster-node-timeout` in ms (default 2000): how long a node may be unreachable before it is flagged
    /// failed (and, with [`automatic_failover`](Self::automatic_failover), replaced by its replica).
    pub fn node_timeout_ms(mut self, ms: u64) -> Self {
        self.node_timeout_ms = ms.max(1);
        self
    }

    /// Whether replicas fail over on their own when their master fails (default: no,
    /// `cluster-replica-no-failover yes`; [`RedisCluster::takeover`] works either way).
    pub fn automatic_failover(mut self, enabled: bool) -> Self {
        self.automatic_failover = enabled;
        self
    }

    /// Every node loads its users from the ACL file at `path`: `default` must stay an unrestricted user without
    /// a password (see [`RedisServerBuilder::aclfile`](crate::RedisServerBuilder::aclfile)).
    pub fn aclfile(mut self, path: impl AsRef<std::path::Path>) -> Self {
        self.aclfile = Some(path.as_ref().to_path_buf());
        self
    }

    /// Starts the nodes, forms the cluster and waits until it is healthy and every node agrees on the slot map.
    ///
    /// # Panics
    ///
    /// Panics (with the logs of every node) if a node does not start, a command fails, or the cluster is not
    /// healthy within [`CLUSTER_TIMEOUT`].
    pub async fn start(self) -> RedisCluster {
        let mut nodes = Vec::with_capacity(self.total());
        for _ in 0..self.total() {
            nodes.push(ClusterNode {
                server: self.node_options().start().await,
                id: String::new(),
            });
        }
        let mut cluster = RedisCluster { nodes };
        cluster.form(self.masters).await;
        cluster
    }

    /// As [`start`](Self::start), for a program rather than a test: the binary is
    /// [`locate`](crate::server::binary::locate)d first, and a node that cannot start is an error that says why
    /// (see [`RedisServerBuilder::try_start`](crate::RedisServerBuilder::try_start)). Forming the cluster still
    /// panics with every node's log if it fails.
    ///
    /// # Errors
    /// [`LaunchError`] from the first node that does not start.
    pub async fn try_start(mut self) -> Result<RedisCluster, LaunchError> {
        if self.bin.is_none() {
            self.bin = Some(crate::server::binary::locate()?);
        }
        let mut nodes = Vec::with_capacity(self.total());
        for _ in 0..self.total() {
            nodes.push(ClusterNode {
                server: self.node_options().try_start().await?,
                id: String::new(),
            });
        }
        let mut cluster = RedisCluster { nodes };
        cluster.form(self.masters).await;
        Ok(cluster)
    }

    fn total(&self) -> usize {
        self.masters * if self.replicas { 2 } else { 1 }
    }

    /// The options of every node.
    fn node_options(&self) -> crate::RedisServerBuilder {
        let mut options = RedisServer::builder()
            .cluster_node(self.node_timeout_ms)
            .extra_arg("--cluster-allow-replica-migration")
            .extra_arg("no");
        if !self.automatic_failover {
            options = options.extra_arg("--cluster-replica-no-failover").extra_arg("yes");
        }
        if let Some(bin) = &self.bin {
            options = options.bin(bin.clone());
        }
        if let Some(path) = &self.aclfile {
            options = options.aclfile(path.clone());
        }
        if let Some(tls) = &self.tls {
            options = options.tls(tls.clone());
        }
        options
    }
}

/// One node of a [`RedisCluster`]: a [`RedisServer`] and its cluster node id.
#[derive(Debug)]
pub struct ClusterNode {
    server: RedisServer,
    id: String,
}

impl ClusterNode {
    /// The node's server (port, log, plain connections to this node only).
    pub fn server(&self) -> &RedisServer {
        &self.server
    }

    /// The node id (40 hex digits, `CLUSTER MYID`); kept across restarts.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The node's client port.
    pub fn port(&self) -> u16 {
        self.server.port()
    }

    /// `redis://127.0.0.1:PORT` of this node (`rediss://` with [`ClusterBuilder::tls`]).
    pub fn url(&self) -> String {
        self.server.url()
    }
}

/// A local Redis Cluster; every node is killed when it is dropped.
///
/// Nodes are numbered in start order: masters `0..masters`, then (with replicas) node `masters + i` is the replica
/// of master `i` — as started; after a [`takeover`](Self::takeover) the roles are what Redis says
/// ([`masters`](Self::masters), [`owner_of_slot`](Self::owner_of_slot)).
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<ClusterNode>,
}

impl RedisCluster {
    /// Options for a cluster other than 3 masters without replicas.
    pub fn builder() -> ClusterBuilder {
        ClusterBuilder::default()
    }

    /// Starts 3 masters with the even slot split. See [`ClusterBuilder::start`].
    pub async fn start() -> RedisCluster {
        Self::builder().start().await
    }

    /// Starts 3 masters, each with one replica. See [`ClusterBuilder::start`].
    pub async fn start_with_replicas() -> RedisCluster {
        Self::builder().replicas(true).start().await
    }

    /// Every node, in start order.
    pub fn nodes(&self) -> &[ClusterNode] {
        &self.nodes
    }

    /// Node `index` (start order).
    ///
    /// # Panics
    ///
    /// Panics if there is no such node.
    pub fn node(&self, index: usize) -> &ClusterNode {
        self.nodes
            .get(index)
            .unwrap_or_else(|| panic!("the cluster has {} nodes, not {}", self.nodes.len(), index + 1))
    }

    /// Index of the node with id `id`, if it is one of this cluster's.
    pub fn index_of(&self, id: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.id == id)
    }

    /// The URLs of every node: the seed list of a cluster client.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(ClusterNode::url).collect()
    }

    /// The Redis target the SDKs and the coordinator take: `cluster:` followed by every node's URL.
    pub fn target(&self) -> String {
        format!("cluster:{}", self.urls().join(","))
    }

    /// A redis-rs cluster client seeded with every node, with the harness's response timeout.
    ///
    /// # Panics
    ///
    /// Panics if the client cannot be built (it cannot for these URLs).
    pub fn client(&self) -> ClusterClient {
        let mut builder = ClusterClient::builder(self.urls())
            .connection_timeout(Duration::from_secs(1))
            .response_timeout(crate::RESPONSE_TIMEOUT);
        if let Some(tls) = self.nodes.first().and_then(|n| n.server.tls()) {
            builder = builder.certs(tls.certificates());
        }
        builder
            .build()
            .unwrap_or_else(|e| panic!("cannot build a cluster client for {:?}: {e}", self.urls()))
    }

    /// An async cluster connection (follows `MOVED`/`ASK` and refreshes its slot map by itself).
    ///
    /// # Panics
    ///
    /// Panics (with every node's log) if no connection is made within [`CLUSTER_TIMEOUT`].
    pub async fn connection(&self) -> ClusterConnection {
        let client = self.client();
        let deadline = Instant::now() + CLUSTER_TIMEOUT;
        loop {
            match client.get_async_connection().await {
                Ok(con) => return con,
                Err(e) if Instant::now() >= deadline => {
                    self.fail(format_args!("no cluster connection within {CLUSTER_TIMEOUT:?}: {e}"))
                }
                Err(_) => sleep(POLL_INTERVAL).await,
            }
        }
    }

    /// The indices of the masters that are up, in start order: flagged master by the agreed view of the running
    /// nodes, not flagged failing, and running (a killed master keeps its `master` flag in the others' views).
    ///
    /// # Panics
    ///
    /// As [`view`](Self::view).
    pub async fn masters(&self) -> Vec<usize> {
        let view = self.view().await;
        let mut masters: Vec<usize> = view
            .iter()
            .filter(|e| e.master && !e.failing)
            .filter_map(|e| self.index_of(&e.id))
            .filter(|&i| self.nodes[i].server.is_running())
            .collect();
        masters.sort_unstable();
        masters
    }

    /// The index of the master serving `slot`, once every running node agrees on it.
    ///
    /// # Panics
    ///
    /// Panics (with every node's log) if the running nodes do not agree on one owner within [`CLUSTER_TIMEOUT`].
    pub async fn owner_of_slot(&self, slot: u16) -> usize {
        let deadline = Instant::now() + CLUSTER_TIMEOUT;
        loop {
            let views = self.views().await;
            let owners: Vec<Option<String>> = views
                .iter()
                .map(|(_, entries)| {
                    entries
                        .iter()
                        .find(|e| e.master && e.slots.iter().any(|&(a, b)| a <= slot && slot <= b))
                        .map(|e| e.id.clone())
                })
                .collect();
            if let Some(Some(first)) = owners.first() {
                if owners.iter().all(|o| o.as_deref() == Some(first)) {
                    if let Some(index) = self.index_of(first) {
                        return index;
                    }
                }
            }
            if Instant::now() >= deadline {
                self.fail(format_args!(
                    "the running nodes did not agree on the owner of slot {slot} within {CLUSTER_TIMEOUT:?}: {owners:?}"
                ));
            }
            sleep(POLL_INTERVAL).await;
        }
    }

    /// The index of the master serving `key`'s slot ([`key_slot`]), as [`owner_of_slot`](Self::owner_of_slot).
    pub async fn owner_of_key(&self, key: &str) -> usize {
        self.owner_of_slot(key_slot(key.as_bytes())).await
    }

    /// `CLUSTER KEYSLOT key` asked of node `index`.
    ///
    /// # Panics
    ///
    /// Panics (with the node's log) if the command fails.
    pub async fn redis_key_slot(&self, index: usize, key: &[u8]) -> u16 {
        let node = self.node(index);
        let mut con = node.server.connection().await;
        self.query(
            index,
            &mut con,
            redis::cmd("CLUSTER").arg("KEYSLOT").arg(key),
            "CLUSTER KEYSLOT",
        )
        .await
    }

    /// Waits until every running node reports `cluster_state:ok` and the running nodes agree on roles and slots.
    ///
    /// # Panics
    ///
    /// Panics (with every node's log) if that does not happen within [`CLUSTER_TIMEOUT`].
    pub async fn wait_healthy(&self) {
        let deadline = Instant::now() + CLUSTER_TIMEOUT;
        loop {
            let problem = self.health_problem().await;
            let Some(problem) = problem else { return };
            if Instant::now() >= deadline {
                self.fail(format_args!(
                    "cluster not healthy within {CLUSTER_TIMEOUT:?}: {problem}"
                ));
            }
            sleep(POLL_INTERVAL).await;
        }
    }

    /// The view every running node agrees on (`CLUSTER NODES`), waiting until they agree.
    ///
    /// # Panics
    ///
    /// Panics (with every node's log) if the running nodes do not agree within [`CLUSTER_TIMEOUT`].
    pub async fn view(&self) -> Vec<NodeEntry> {
        let deadline = Instant::now() + CLUSTER_TIMEOUT;
        loop {
            let views = self.views().await;
            if let Some((_, first)) = views.first() {
                let agreed = agreed_view(first);
                if views.iter().all(|(_, v)| agreed_view(v) == agreed) {
                    return first.clone();
                }
            }
            if Instant::now() >= deadline {
                self.fail(format_args!(
                    "the running nodes did not agree on the cluster within {CLUSTER_TIMEOUT:?}: {views:?}"
                ));
            }
            sleep(POLL_INTERVAL).await;
        }
    }

    /// `CLUSTER NODES` of node `index`, parsed.
    ///
    /// # Panics
    ///
    /// Panics (with the node's log) if the command fails.
    pub async fn view_of(&self, index: usize) -> Vec<NodeEntry> {
        let mut con = self.node(index).server.connection().await;
        let text: String = self
            .query(index, &mut con, redis::cmd("CLUSTER").arg("NODES"), "CLUSTER NODES")
            .await;
        parse_cluster_nodes(&text)
    }

    /// `CLUSTER NODES` of every running node, with its index.
    async fn views(&self) -> Vec<(usize, Vec<NodeEntry>)> {
        let mut views = Vec::new();
        for (i, node) in self.nodes.iter().enumerate() {
            if node.server.is_running() {
                views.push((i, self.view_of(i).await));
            }
        }
        views
    }

    /// Waits until `ok` holds for the view of every running node.
    async fn wait_views(&self, what: &str, ok: impl Fn(usize, &[NodeEntry]) -> bool) {
        let deadline = Instant::now() + CLUSTER_TIMEOUT;
        loop {
            let views = self.views().await;
            if views.iter().all(|(i, v)| ok(*i, v)) {
                return;
            }
            if Instant::now() >= deadline {
                self.fail(format_args!(
                    "timed out after {CLUSTER_TIMEOUT:?} waiting for {what}: {views:?}"
                ));
            }
            sleep(POLL_INTERVAL).await;
        }
    }

    /// Why the cluster is not healthy yet, or `None`.
    async fn health_problem(&self) -> Option<String> {
        let mut first: Option<Agreed> = None;
        for (i, node) in self.nodes.iter().enumerate() {
            if !node.server.is_running() {
                continue;
            }
            let mut con = node.server.connection().await;
            let info: String = self
                .query(i, &mut con, redis::cmd("CLUSTER").arg("INFO"), "CLUSTER INFO")
                .await;
            if info_field(&info, "cluster_state") != Some("ok") {
                return Some(format!("node {i}: {:?}", info_field(&info, "cluster_state")));
            }
            let view = agreed_view(&self.view_of(i).await);
            match &first {
                None => first = Some(view),
                Some(f) if *f != view => return Some(format!("node {i} disagrees: {view:?} vs {f:?}")),
                Some(_) => {}
            }
        }
        None
    }

    /// Runs `cmd` on node `index`, panicking with every node's log on error.
    async fn query<T: FromRedisValue>(
        &self,
        index: usize,
        con: &mut MultiplexedConnection,
        cmd: &redis::Cmd,
        what: &str,
    ) -> T {
        match cmd.query_async(con).await {
            Ok(v) => v,
            Err(e) => self.fail(format_args!("{what} on node {index} failed: {e}")),
        }
    }

    /// Panics with `msg` followed by the log of every node.
    #[track_caller]
    fn fail(&self, msg: impl std::fmt::Display) -> ! {
        let mut report = String::new();
        for (i, node) in self.nodes.iter().enumerate() {
            let _ = writeln!(report, "node {i} ({}):\n{}", node.id, node.server.log_report());
        }
        panic!("{msg}\n{report}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn even_split_is_the_redis_cli_split() {
        assert_eq!(even_slot_ranges(3), vec![(0, 5460), (5461, 10922), (10923, 16383)]);
        assert_eq!(even_slot_ranges(1), vec![(0, 16383)]);
        assert_eq!(even_slot_ranges(2), vec![(0, 8191), (8192, 16383)]);
        assert!(even_slot_ranges(0).is_empty());
    }

    #[test]
    fn parses_cluster_nodes_lines() {
        let text = "07c37dfeb235213a872192d90877d0cd55635b91 127.0.0.1:30004@31004,host replica \
                    e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 0 1426238317239 4 connected\n\
                    e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 127.0.0.1:30001@31001 myself,master - 0 0 1 connected \
                    0-5460 7000 [5461->-07c37dfeb235213a872192d90877d0cd55635b91]\n\
                    garbage\n";
        let nodes = parse_cluster_nodes(text);
        assert_eq!(nodes.len(), 2);
        assert_eq!(nodes[0].port, 30004);
        assert!(!nodes[0].master);
        assert_eq!(
            nodes[0].replica_of.as_deref(),
            Some("e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca")
        );
        assert!(nodes[1].master);
        assert_eq!(nodes[1].slots, vec![(0, 5460), (7000, 7000)]);
        assert!(!nodes[1].failing);
    }
}

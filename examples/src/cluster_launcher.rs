//! A private local Redis Cluster for the demo's and the benchmarks' `--cluster` mode: three `redis-server
//! --cluster-enabled yes` masters on free loopback ports ([`RedisLauncher`]), each with its own cluster bus port,
//! formed without `redis-cli`: every master takes an even third of the 16384 slots (`CLUSTER ADDSLOTSRANGE`) and
//! meets the others (`CLUSTER MEET`); ready once every node says `cluster_state:ok` and agrees on the slot map.
//! Killed when dropped, like the single server.

use std::time::{Duration, Instant};

use crate::redis_launcher::{free_port, LaunchError, RedisLauncher};

/// Masters of the local cluster.
pub const MASTERS: usize = 3;

/// How long forming the cluster may take.
pub const FORM_TIMEOUT: Duration = Duration::from_secs(30);

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
}

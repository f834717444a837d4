//! The private Redis of a run (one server or a local cluster), and what a run costs on it: client and Redis
//! CPU, `XREADGROUP` and `XACK` calls.

use std::time::Duration;

use anyhow::Result;
use redis::aio::MultiplexedConnection;
use redis_link::Connection;
use test_support::cluster::RedisCluster;
use test_support::RedisServer;

/// The private Redis of the run: one server or a local cluster.
pub(crate) enum Backend {
    Single(RedisServer),
    Cluster(RedisCluster),
}

impl Backend {
    pub(crate) async fn start(cluster: bool) -> Result<Backend> {
        let launched = if cluster {
            RedisCluster::builder()
                .node_timeout_ms(5_000)
                .try_start()
                .await
                .map(Backend::Cluster)
        } else {
            RedisServer::builder().try_start().await.map(Backend::Single)
        };
        launched.map_err(|e| anyhow::anyhow!("{e}"))
    }

    /// What the coordinator and the SDK are given.
    pub(crate) fn target(&self) -> String {
        match self {
            Backend::Single(r) => r.url(),
            Backend::Cluster(c) => c.target(),
        }
    }

    /// Every server (every master of a cluster), for the CPU and command counts.
    pub(crate) fn node_urls(&self) -> Vec<String> {
        match self {
            Backend::Single(r) => vec![r.url()],
            Backend::Cluster(c) => c.urls(),
        }
    }

    /// A connection for commands of one shard each (a cluster connection on a cluster).
    pub(crate) async fn connection(&self) -> Result<Connection> {
        Ok(match self {
            Backend::Single(r) => Connection::Single(redis::Client::open(r.url())?.get_connection_manager().await?),
            Backend::Cluster(c) => {
                let seeds = c.urls();
                Connection::cluster(&seeds, None, Duration::from_secs(2), Duration::from_secs(10)).await?
            }
        })
    }
}

/// A connection to every server, for [`Cost::now`].
pub(crate) struct Nodes(pub(crate) Vec<MultiplexedConnection>);

impl Nodes {
    pub(crate) async fn open(backend: &Backend) -> Result<Nodes> {
        let mut cons = Vec::new();
        for url in backend.node_urls() {
            cons.push(redis::Client::open(url)?.get_multiplexed_async_connection().await?);
        }
        Ok(Nodes(cons))
    }
}

/// CPU and Redis work spent so far: this process's CPU time, `redis-server`'s CPU time, and the calls of the
/// commands a reader sends (`INFO cpu`, `INFO commandstats`).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Cost {
    pub(crate) client_cpu_s: f64,
    pub(crate) redis_cpu_s: f64,
    pub(crate) xreadgroup_calls: u64,
    pub(crate) xack_calls: u64,
}

impl Cost {
    /// The cost so far, Redis's summed over every server.
    pub(crate) async fn now(nodes: &mut Nodes) -> Result<Cost> {
        let mut total = Cost {
            client_cpu_s: benches::cpu::process_cpu_seconds(),
            ..Cost::default()
        };
        for con in &mut nodes.0 {
            let one = Self::of_server(con).await?;
            total.redis_cpu_s += one.redis_cpu_s;
            total.xreadgroup_calls += one.xreadgroup_calls;
            total.xack_calls += one.xack_calls;
        }
        Ok(total)
    }

    pub(crate) async fn of_server(con: &mut MultiplexedConnection) -> Result<Cost> {
        let info: String = redis::cmd("INFO")
            .arg("cpu")
            .arg("commandstats")
            .query_async(con)
            .await?;
        let field = |name: &str| -> f64 {
            info.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':')?.trim().parse().ok())
                .unwrap_or(0.0)
        };
        let calls = |cmd: &str| -> u64 {
            info.lines()
                .find_map(|l| {
                    let rest = l.strip_prefix("cmdstat_")?.strip_prefix(cmd)?.strip_prefix(":calls=")?;
                    rest.split(',').next()?.parse().ok()
                })
                .unwrap_or(0)
        };
        Ok(Cost {
            client_cpu_s: benches::cpu::process_cpu_seconds(),
            redis_cpu_s: field("used_cpu_sys") + field("used_cpu_user"),
            xreadgroup_calls: calls("xreadgroup"),
            xack_calls: calls("xack"),
        })
    }

    pub(crate) fn since(self, before: Cost) -> Cost {
        Cost {
            client_cpu_s: self.client_cpu_s - before.client_cpu_s,
            redis_cpu_s: self.redis_cpu_s - before.redis_cpu_s,
            xreadgroup_calls: self.xreadgroup_calls - before.xreadgroup_calls,
            xack_calls: self.xack_calls - before.xack_calls,
        }
    }

    /// `client µs, redis µs, XREADGROUP, XACK` per record.
    pub(crate) fn per_record(&self, n: u64) -> String {
        let n = n.max(1) as f64;
        format!(
            "cpu/record: client {:.2} us, redis {:.2} us; per 1000 records: {:.1} XREADGROUP, {:.1} XACK",
            self.client_cpu_s * 1e6 / n,
            self.redis_cpu_s * 1e6 / n,
            self.xreadgroup_calls as f64 * 1000.0 / n,
            self.xack_calls as f64 * 1000.0 / n
        )
    }
}

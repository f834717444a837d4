//! The private `redis-server` of a single-server run (and its replica with `--replica`), started from
//! `--redis-server` with persistence off, killed on drop.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// A private redis-server, killed on drop.
pub(crate) struct PrivateRedis {
    pub(crate) child: Child,
    pub(crate) port: u16,
}

impl PrivateRedis {
    pub(crate) fn start(bin: &str) -> Result<PrivateRedis> {
        Self::start_with(bin, &[])
    }

    /// A replica of `primary` (ready once [`wait_replicating`] says so).
    pub(crate) fn start_replica(bin: &str, primary: &PrivateRedis) -> Result<PrivateRedis> {
        Self::start_with(bin, &["--replicaof", "127.0.0.1", &primary.port.to_string()])
    }

    pub(crate) fn start_with(bin: &str, extra: &[&str]) -> Result<PrivateRedis> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let child = Command::new(bin)
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("cannot start {bin}"))?;
        Ok(PrivateRedis { child, port })
    }

    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) async fn wait_ready(url: &str) -> Result<redis::aio::MultiplexedConnection> {
    let client = redis::Client::open(url)?;
    let start = Instant::now();
    loop {
        if let Ok(mut con) = client.get_multiplexed_async_connection().await {
            if redis::cmd("PING").query_async::<String>(&mut con).await.is_ok() {
                return Ok(con);
            }
        }
        if start.elapsed() > Duration::from_secs(10) {
            bail!("redis-server at {url} not ready within 10 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until the replica at `url` reports its link to the primary up.
pub(crate) async fn wait_replicating(url: &str) -> Result<()> {
    let mut con = wait_ready(url).await?;
    let start = Instant::now();
    loop {
        let info: String = redis::cmd("INFO").arg("replication").query_async(&mut con).await?;
        if info.lines().any(|l| l.trim() == "master_link_status:up") {
            return Ok(());
        }
        if start.elapsed() > Duration::from_secs(10) {
            bail!("the replica at {url} has no link to its primary within 10 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

//! Real `redis-server` processes for tests.
//!
//! Modelled on redis-rs's `redis-test` `RedisServer` and its test-suite
//! `TestContext`: each server gets a free loopback port, its own temporary
//! data directory, its own log file and a generated `redis.conf`, and is killed
//! when dropped.
//!
//! # Layout
//! - `builder`: [`RedisServerBuilder`], the options and the start.
//! - `launch`: the process from its generated `redis.conf`, and the readiness check.
//! - `keys`: the rollback helpers (dump, restore, snapshots).
//! - [`binary`]: which `redis-server` runs, found or provided by `scripts/ensure-redis.sh` (for the examples).

pub mod binary;
mod builder;
mod keys;
mod launch;
mod tls;

use std::fmt::Display;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::{AsyncConnectionConfig, Client, FromRedisValue, RedisError, Value};
use tempfile::TempDir;
use tokio::time::{sleep, Instant};

use crate::wait::POLL_INTERVAL;
use launch::LaunchFailure;

pub use binary::{LaunchError, INSTALL_HINT};
pub use builder::RedisServerBuilder;
pub use tls::{CertPair, ServerTls};

/// Environment variable naming the `redis-server` binary to run. When unset,
/// `redis-server` is looked up on `PATH`.
pub const SERVER_BIN_ENV: &str = "REDIS_SERVER_BIN";

/// How long the harness waits for a server to become ready (answer `PING`,
/// finish loading, and for a replica reach `master_link_status:up`), for a
/// connection to be accepted, and for a stopped server to exit.
pub const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// Response timeout of the connections returned by
/// [`RedisServer::connection`] and [`RedisServer::connection_manager`].
///
/// Generous so that blocking commands (`XREADGROUP BLOCK`, `WAIT`) work, but
/// bounded so that a lost reply fails the test instead of hanging it.
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(30);

/// How many fresh ports [`RedisServerBuilder::start`] tries when another
/// process takes the chosen port before `redis-server` binds it.
const START_ATTEMPTS: usize = 5;
/// Pause before retrying a restart whose port is still taken.
const RESTART_RETRY_DELAY: Duration = Duration::from_millis(50);

const LOG_FILE: &str = "redis.log";
const STDIO_FILE: &str = "redis.stdio.log";

/// Mutable part of a server, behind a mutex so that `kill` and `is_running`
/// work through a shared reference.
#[derive(Debug)]
pub(crate) struct State {
    child: Option<Child>,
    /// Port of the current primary; cleared by [`RedisServer::promote`].
    replica_of: Option<u16>,
}

/// A real `redis-server` process on `127.0.0.1`, killed when dropped.
///
/// Each server has its own free port, temporary directory (`dir`), log file
/// (`logfile`) and generated `redis.conf`, and is started with
/// `bind 127.0.0.1` and `protected-mode no`.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    /// The cluster bus port of a [`RedisServerBuilder::cluster_node`].
    bus_port: Option<u16>,
    dir: TempDir,
    options: RedisServerBuilder,
    state: Mutex<State>,
}

impl RedisServer {
    /// Returns a builder for a server with non-default options.
    pub fn builder() -> RedisServerBuilder {
        RedisServerBuilder::default()
    }

    /// Starts a server with default options (no persistence) and waits until
    /// it is ready. See [`RedisServerBuilder::start`].
    pub async fn start() -> RedisServer {
        Self::builder().start().await
    }

    /// The TCP port the server listens on; stays the same across restarts.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The cluster bus port (`cluster-port`) of a [`cluster_node`](RedisServerBuilder::cluster_node); `None` for a
    /// server that is not a cluster node. Stays the same across restarts.
    pub fn bus_port(&self) -> Option<u16> {
        self.bus_port
    }

    /// The connection URL, `redis://127.0.0.1:PORT` (`rediss://` for a [`RedisServerBuilder::tls`] server).
    pub fn url(&self) -> String {
        match self.options.tls {
            Some(_) => format!("rediss://127.0.0.1:{}", self.port),
            None => format!("redis://127.0.0.1:{}", self.port),
        }
    }

    /// The TLS settings the server was started with ([`RedisServerBuilder::tls`]).
    pub fn tls(&self) -> Option<&ServerTls> {
        self.options.tls.as_deref()
    }

    /// The server's data directory (its `dir`), which also holds the
    /// generated `redis.conf` and the log files.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The `redis-server` binary this server runs: the one given to [`RedisServerBuilder::bin`], else
    /// `REDIS_SERVER_BIN`, else `redis-server` (looked up on `PATH`).
    pub fn bin(&self) -> PathBuf {
        match &self.options.bin {
            Some(bin) => bin.clone(),
            None => std::env::var_os(SERVER_BIN_ENV)
                .unwrap_or_else(|| "redis-server".into())
                .into(),
        }
    }

    /// The process id, or `None` when the server is not running.
    pub fn pid(&self) -> Option<u32> {
        let mut state = self.state();
        Self::reap(&mut state);
        state.child.as_ref().map(Child::id)
    }

    /// Whether the process is still running (it may have exited on its own,
    /// been killed, or been stopped).
    pub fn is_running(&self) -> bool {
        let mut state = self.state();
        Self::reap(&mut state);
        state.child.is_some()
    }

    /// The contents of the server's log file, across all restarts. Anything
    /// the process wrote to stdout or stderr (e.g. configuration errors,
    /// which are reported before the log file is opened) is appended.
    pub fn log(&self) -> String {
        let mut log = fs::read(self.log_path())
            .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
            .unwrap_or_default();
        if let Ok(stdio) = fs::read(self.dir().join(STDIO_FILE)) {
            if !stdio.is_empty() {
                log.push_str("\n----- stdout/stderr -----\n");
                log.push_str(&String::from_utf8_lossy(&stdio));
            }
        }
        log
    }

    /// A `redis::Client` for [`url`](Self::url), for tests that need their own
    /// connection settings.
    pub fn client(&self) -> Client {
        let client = match &self.options.tls {
            None => Client::open(self.url()),
            Some(tls) => {
                let url = if tls.harness_insecure {
                    format!("{}/#insecure", self.url())
                } else {
                    self.url()
                };
                Client::build_with_tls(url, tls.certificates())
            }
        };
        client.unwrap_or_else(|e| self.fail(format_args!("invalid URL {}: {e}", self.url())))
    }

    /// Opens a multiplexed connection, retrying until the server accepts it.
    ///
    /// The connection has a [`RESPONSE_TIMEOUT`] response timeout.
    ///
    /// # Panics
    ///
    /// Panics (with the server log) right away if the server is not running,
    /// or if no connection is accepted within [`READY_TIMEOUT`].
    pub async fn connection(&self) -> MultiplexedConnection {
        let client = self.client();
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(1)))
            .set_response_timeout(Some(RESPONSE_TIMEOUT));
        self.retry_connect("a multiplexed connection", || {
            client.get_multiplexed_async_connection_with_config(&config)
        })
        .await
    }

    /// Opens a [`ConnectionManager`] (which reconnects on its own after
    /// connection errors), retrying until the server accepts the first
    /// connection.
    ///
    /// The manager has a [`RESPONSE_TIMEOUT`] response timeout.
    ///
    /// # Panics
    ///
    /// As [`connection`](Self::connection).
    pub async fn connection_manager(&self) -> ConnectionManager {
        let client = self.client();
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(1)))
            .set_response_timeout(Some(RESPONSE_TIMEOUT));
        self.retry_connect("a connection manager", || {
            client.get_connection_manager_with_config(config.clone())
        })
        .await
    }

    /// Kills the process with SIGKILL and waits for it to exit. Nothing is
    /// flushed; without persistence all data is lost. Does nothing if the
    /// server is not running.
    pub fn kill(&self) {
        let mut state = self.state();
        if let Some(mut child) = state.child.take() {
            // Fails only if the process already exited, which is fine.
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the server gracefully with `SHUTDOWN NOSAVE NOW` (or SIGTERM if
    /// the server refuses it, e.g. because `SHUTDOWN` was renamed) and waits
    /// for the process to exit. Does nothing if the server is not running.
    ///
    /// # Panics
    ///
    /// Panics (with the server log) if the process has not exited within
    /// [`READY_TIMEOUT`]; it is killed first.
    pub async fn stop(&mut self) {
        if !self.is_running() {
            return;
        }
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(1)))
            .set_response_timeout(Some(Duration::from_secs(5)));
        let refused = match self
            .client()
            .get_multiplexed_async_connection_with_config(&config)
            .await
        {
            Ok(mut con) => {
                let reply: Result<Value, RedisError> = redis::cmd("SHUTDOWN")
                    .arg("NOSAVE")
                    .arg("NOW")
                    .query_async(&mut con)
                    .await;
                // Success closes the connection, so an I/O error is expected; a
                // server error reply means SHUTDOWN was refused.
                matches!(&reply, Err(e) if e.code().is_some())
            }
            Err(_) => true,
        };
        if refused {
            self.terminate();
        }
        let deadline = Instant::now() + READY_TIMEOUT;
        while self.is_running() {
            if Instant::now() >= deadline {
                self.kill();
                self.fail(format_args!(
                    "redis-server on port {} did not exit within {READY_TIMEOUT:?} after a graceful stop",
                    self.port
                ));
            }
            sleep(POLL_INTERVAL).await;
        }
    }

    /// Starts the server again on the same port, with the same directory and
    /// configuration, and waits until it is ready. A server that is still
    /// running is killed first (SIGKILL).
    ///
    /// With [`persistence`](RedisServerBuilder::persistence) on, the data
    /// written before the kill or stop is loaded again; without it the server
    /// comes back empty. A replica reconnects to its primary (and must reach
    /// `master_link_status:up`), unless it was [`promote`](Self::promote)d.
    ///
    /// # Panics
    ///
    /// Panics (with the server log) if the port stays taken or the server is
    /// not ready within [`READY_TIMEOUT`].
    pub async fn restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            match self.launch().await {
                Ok(()) => return,
                Err(LaunchFailure::BindRace) if Instant::now() < deadline => sleep(RESTART_RETRY_DELAY).await,
                Err(LaunchFailure::Failed(reason)) => self.fail(reason),
                Err(LaunchFailure::BindRace) => self.fail(format_args!(
                    "cannot restart redis-server: port {} stayed in use for {READY_TIMEOUT:?}",
                    self.port
                )),
            }
        }
    }

    /// Turns a replica into a primary: `REPLICAOF NO ONE`, then waits until
    /// `INFO replication` reports `role:master`. A later
    /// [`restart`](Self::restart) keeps it a primary.
    ///
    /// # Panics
    ///
    /// Panics (with the server log) if the command fails or the role does not
    /// change within [`READY_TIMEOUT`].
    pub async fn promote(&self) {
        let mut con = self.connection().await;
        self.query::<()>(
            &mut con,
            redis::cmd("REPLICAOF").arg("NO").arg("ONE"),
            "REPLICAOF NO ONE",
        )
        .await;
        self.state().replica_of = None;
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let info: String = self
                .query(&mut con, redis::cmd("INFO").arg("replication"), "INFO replication")
                .await;
            if info_field(&info, "role") == Some("master") {
                return;
            }
            if Instant::now() >= deadline {
                self.fail(format_args!(
                    "replica on port {} did not become a primary within {READY_TIMEOUT:?}; INFO replication:\n{info}",
                    self.port
                ));
            }
            sleep(POLL_INTERVAL).await;
        }
    }

    /// Returns the text of `INFO section` (e.g. `"replication"`).
    ///
    /// # Panics
    ///
    /// Panics (with the server log) if the command fails.
    pub async fn info(&self, section: &str) -> String {
        let mut con = self.connection().await;
        self.query(&mut con, redis::cmd("INFO").arg(section), "INFO").await
    }

    async fn retry_connect<C, F, Fut>(&self, what: &str, mut connect: F) -> C
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<C, RedisError>>,
    {
        if !self.is_running() {
            self.fail(format_args!(
                "cannot open {what}: redis-server on port {} is not running",
                self.port
            ));
        }
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            match connect().await {
                Ok(con) => return con,
                Err(e) if Instant::now() >= deadline => self.fail(format_args!(
                    "cannot open {what} to {} within {READY_TIMEOUT:?}: {e}",
                    self.url()
                )),
                Err(_) => sleep(POLL_INTERVAL).await,
            }
        }
    }

    /// Runs `cmd`, panicking with the server log on error.
    async fn query<T: FromRedisValue>(&self, con: &mut MultiplexedConnection, cmd: &redis::Cmd, what: &str) -> T {
        cmd.query_async(con)
            .await
            .unwrap_or_else(|e| self.fail(format_args!("{what} on port {} failed: {e}", self.port)))
    }

    /// Asks the process to exit with SIGTERM, falling back to SIGKILL.
    fn terminate(&self) {
        let Some(pid) = self.pid() else { return };
        let sent = Command::new("kill")
            .arg("-TERM")
            .arg(pid.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success());
        if !sent {
            self.kill();
        }
    }

    fn log_path(&self) -> PathBuf {
        self.dir().join(LOG_FILE)
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Forgets the child if it has exited.
    fn reap(state: &mut State) {
        if let Some(child) = state.child.as_mut() {
            if !matches!(child.try_wait(), Ok(None)) {
                state.child = None;
            }
        }
    }

    /// Panics with `msg` followed by the server log.
    #[track_caller]
    pub(crate) fn fail(&self, msg: impl Display) -> ! {
        panic!("{msg}\n{}", self.log_report())
    }

    /// The server log framed for inclusion in a panic message.
    pub(crate) fn log_report(&self) -> String {
        format!(
            "----- redis-server 127.0.0.1:{} log ({}) -----\n{}\n----- end of log -----",
            self.port,
            self.log_path().display(),
            self.log().trim_end()
        )
    }

    /// The last `lines` lines of the server's log (for an error rather than a panic).
    pub(crate) fn log_tail(&self, lines: usize) -> String {
        let log = self.log();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The value of `field` in `INFO` output (`field:value` lines).
pub(crate) fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .map(str::trim)
}

#[cfg(test)]
mod tests {
    use super::info_field;

    #[test]
    fn info_field_finds_exact_field() {
        let info = "# Replication\r\nrole:slave\r\nmaster_link_status:up\r\nmaster_link_status_x:down\r\n";
        assert_eq!(info_field(info, "role"), Some("slave"));
        assert_eq!(info_field(info, "master_link_status"), Some("up"));
        assert_eq!(info_field(info, "missing"), None);
    }
}

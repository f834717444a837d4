//! Real `redis-server` processes for tests.
//!
//! Modelled on redis-rs's `redis-test` `RedisServer` and its test-suite
//! `TestContext`: each server gets a free loopback port, its own temporary
//! data directory, its own log file and a generated `redis.conf`, and is killed
//! when dropped.

use std::fmt::Display;
use std::fs::{self, File, OpenOptions};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::{AsyncConnectionConfig, Client, FromRedisValue, RedisError, Value};
use tempfile::TempDir;
use tokio::time::{sleep, Instant};

use crate::port::free_port;
use crate::snapshot::{Snapshot, SnapshotEntry};
use crate::wait::POLL_INTERVAL;

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

const CONF_FILE: &str = "redis.conf";
const LOG_FILE: &str = "redis.log";
const STDIO_FILE: &str = "redis.stdio.log";
const BIND_RACE_MARKER: &str = "Address already in use";

/// Options for a [`RedisServer`]; created by [`RedisServer::builder`].
///
/// Every option ends up in the server's generated `redis.conf` (or, for
/// [`extra_arg`](Self::extra_arg), on its command line), so a
/// [`RedisServer::restart`] reuses them.
#[derive(Debug, Clone, Default)]
pub struct RedisServerBuilder {
    persistence: bool,
    renamed_commands: Vec<(String, String)>,
    replica_of: Option<u16>,
    extra_args: Vec<String>,
    cluster_node_timeout_ms: Option<u64>,
}

impl RedisServerBuilder {
    /// Turns durability on or off (default: off).
    ///
    /// Off: `save ""` and `appendonly no` (and any RDB file left by a
    /// replication full sync is deleted before a restart), so a killed or
    /// restarted server comes back empty. On: `appendonly yes` with `appendfsync always` in the
    /// server's own directory, so every acknowledged write survives
    /// [`RedisServer::kill`] followed by [`RedisServer::restart`].
    pub fn persistence(mut self, enabled: bool) -> Self {
        self.persistence = enabled;
        self
    }

    /// Renames command `name` to `new_name`; an empty `new_name` disables the
    /// command (it then fails with "unknown command").
    ///
    /// Redis 7 only accepts `rename-command` in a configuration file, which is
    /// why every server is started from a generated `redis.conf`.
    pub fn rename_command(mut self, name: impl Into<String>, new_name: impl Into<String>) -> Self {
        self.renamed_commands.push((name.into(), new_name.into()));
        self
    }

    /// Makes the server a replica of `primary` (`replicaof 127.0.0.1 PORT`).
    ///
    /// [`start`](Self::start) then also waits until the replica reports
    /// `master_link_status:up`, i.e. the initial synchronisation is done.
    pub fn replica_of(mut self, primary: &RedisServer) -> Self {
        self.replica_of = Some(primary.port());
        self
    }

    /// Drops a [`replica_of`](Self::replica_of) setting.
    pub(crate) fn clear_replica_of(&mut self) {
        self.replica_of = None;
    }

    /// Appends one raw argument to the `redis-server` command line, after the
    /// configuration file. Options take two calls, e.g.
    /// `.extra_arg("--maxmemory").extra_arg("10mb")`.
    pub fn extra_arg(mut self, arg: impl Into<String>) -> Self {
        self.extra_args.push(arg.into());
        self
    }

    /// Makes the server a Redis Cluster node: `cluster-enabled yes`, `cluster-node-timeout` of `node_timeout_ms`,
    /// its `nodes.conf` in its own directory, and a cluster bus on a second free port (`cluster-port`, see
    /// [`RedisServer::bus_port`]) rather than the port + 10000 default, which may be out of range or taken.
    ///
    /// The node starts alone, with no slots; [`RedisCluster`](crate::cluster::RedisCluster) joins nodes into a
    /// cluster. Incompatible with [`replica_of`](Self::replica_of) (a cluster replica is made with
    /// `CLUSTER REPLICATE`).
    pub fn cluster_node(mut self, node_timeout_ms: u64) -> Self {
        self.cluster_node_timeout_ms = Some(node_timeout_ms);
        self
    }

    /// Starts the server on a free loopback port and waits until it is ready.
    ///
    /// If another process takes the port between picking and binding it, a
    /// new port is tried (a few times).
    ///
    /// # Panics
    ///
    /// Panics (with the server log) if `redis-server` cannot be spawned, exits
    /// during start-up, or is not ready within [`READY_TIMEOUT`].
    pub async fn start(self) -> RedisServer {
        let dir = tempfile::Builder::new()
            .prefix("redis-test-")
            .tempdir()
            .unwrap_or_else(|e| panic!("cannot create a temporary directory for redis-server: {e}"));
        let replica_of = self.replica_of;
        let cluster = self.cluster_node_timeout_ms.is_some();
        let mut server = RedisServer {
            port: free_port(),
            bus_port: cluster.then(free_port),
            dir,
            options: self,
            state: Mutex::new(State {
                child: None,
                replica_of,
            }),
        };
        for attempt in 1..=START_ATTEMPTS {
            match server.launch().await {
                Ok(()) => return server,
                Err(BindRace) if attempt < START_ATTEMPTS => {
                    tracing::debug!(port = server.port, "port taken before redis-server bound it; retrying");
                    server.port = free_port();
                    if cluster {
                        server.bus_port = Some(free_port());
                    }
                }
                Err(BindRace) => {}
            }
        }
        server.fail(format_args!(
            "redis-server could not bind a free port in {START_ATTEMPTS} attempts"
        ))
    }
}

/// `redis-server` exited because its port was taken.
#[derive(Debug)]
struct BindRace;

/// Mutable part of a server, behind a mutex so that `kill` and `is_running`
/// work through a shared reference.
#[derive(Debug)]
struct State {
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

    /// The connection URL, `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The server's data directory (its `dir`), which also holds the
    /// generated `redis.conf` and the log files.
    pub fn dir(&self) -> &Path {
        self.dir.path()
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
        Client::open(self.url()).unwrap_or_else(|e| self.fail(format_args!("invalid URL {}: {e}", self.url())))
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
                Err(BindRace) if Instant::now() < deadline => sleep(RESTART_RETRY_DELAY).await,
                Err(BindRace) => self.fail(format_args!(
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

    /// Serialises `key` with `DUMP`; `None` if the key does not exist.
    ///
    /// The dump does not include the key's time to live (see
    /// [`snapshot_keys`](Self::snapshot_keys) for that).
    ///
    /// # Panics
    ///
    /// Panics (with the server log) if the command fails.
    pub async fn dump_key(&self, key: &str) -> Option<Vec<u8>> {
        let mut con = self.connection().await;
        self.query(&mut con, redis::cmd("DUMP").arg(key), "DUMP").await
    }

    /// Writes `dump` (from [`dump_key`](Self::dump_key)) back to `key` with
    /// `RESTORE key 0 dump REPLACE`: the key gets exactly the dumped value and
    /// no expiry.
    ///
    /// # Panics
    ///
    /// Panics (with the server log) if the command fails, e.g. because the
    /// dump is corrupt or from an incompatible Redis version.
    pub async fn restore_key(&self, key: &str, dump: &[u8]) {
        let mut con = self.connection().await;
        self.query::<()>(
            &mut con,
            redis::cmd("RESTORE").arg(key).arg(0).arg(dump).arg("REPLACE"),
            "RESTORE",
        )
        .await;
    }

    /// Deletes `key` (`DEL`); the rollback for a key that did not exist when
    /// it was dumped.
    ///
    /// # Panics
    ///
    /// Panics (with the server log) if the command fails.
    pub async fn delete_key(&self, key: &str) {
        let mut con = self.connection().await;
        self.query::<()>(&mut con, redis::cmd("DEL").arg(key), "DEL").await;
    }

    /// Puts `key` back to the state captured by [`dump_key`](Self::dump_key):
    /// restores `Some(dump)` and deletes the key for `None`.
    ///
    /// # Panics
    ///
    /// As [`restore_key`](Self::restore_key).
    pub async fn restore_dump(&self, key: &str, dump: Option<&[u8]>) {
        match dump {
            Some(dump) => self.restore_key(key, dump).await,
            None => self.delete_key(key).await,
        }
    }

    /// Captures every key matching the glob `pattern` (found with `SCAN`),
    /// with its value (`DUMP`) and remaining time to live (`PTTL`).
    ///
    /// The keys are read in one `MULTI`/`EXEC`, so related keys (e.g. a
    /// group's metadata hash and its liveness hash) are captured at the same
    /// instant. Keys created between the `SCAN` and the `EXEC` are not
    /// captured; keys deleted in that window are treated as absent.
    ///
    /// # Panics
    ///
    /// Panics (with the server log) if a command fails.
    pub async fn snapshot_keys(&self, pattern: &str) -> Snapshot {
        let mut con = self.connection().await;
        let keys = self.scan(&mut con, pattern).await;
        let mut entries = Vec::with_capacity(keys.len());
        if !keys.is_empty() {
            let mut pipe = redis::pipe();
            pipe.atomic();
            for key in &keys {
                pipe.cmd("DUMP").arg(key).cmd("PTTL").arg(key);
            }
            let replies: Vec<Value> = pipe
                .query_async(&mut con)
                .await
                .unwrap_or_else(|e| self.fail(format_args!("snapshot of {pattern:?} failed: {e}")));
            if replies.len() != keys.len() * 2 {
                self.fail(format_args!(
                    "snapshot of {pattern:?}: expected {} replies, got {}",
                    keys.len() * 2,
                    replies.len()
                ));
            }
            for (key, pair) in keys.into_iter().zip(replies.chunks_exact(2)) {
                let dump: Option<Vec<u8>> = redis::from_redis_value_ref(&pair[0])
                    .unwrap_or_else(|e| self.fail(format_args!("unexpected DUMP reply for {key:?}: {e}")));
                let pttl: i64 = redis::from_redis_value_ref(&pair[1])
                    .unwrap_or_else(|e| self.fail(format_args!("unexpected PTTL reply for {key:?}: {e}")));
                if let Some(dump) = dump {
                    let ttl_ms = u64::try_from(pttl).ok().filter(|ttl| *ttl > 0);
                    entries.push(SnapshotEntry { key, dump, ttl_ms });
                }
            }
        }
        Snapshot {
            pattern: pattern.to_owned(),
            entries,
        }
    }

    /// Rolls every key matching the snapshot's pattern back to the snapshot:
    /// captured keys are restored (`RESTORE ... REPLACE`, with the time to
    /// live they had left when captured) and matching keys that did not exist
    /// in the snapshot are deleted. Keys outside the pattern are untouched.
    ///
    /// All changes are applied in one `MULTI`/`EXEC`. The snapshot may come
    /// from another server (e.g. restore a primary's state on a replica).
    ///
    /// # Panics
    ///
    /// Panics (with the server log) if a command fails.
    pub async fn restore_snapshot(&self, snapshot: &Snapshot) {
        let mut con = self.connection().await;
        let current = self.scan(&mut con, &snapshot.pattern).await;
        let mut pipe = redis::pipe();
        pipe.atomic();
        for key in current.iter().filter(|key| !snapshot.contains(key)) {
            pipe.cmd("DEL").arg(key).ignore();
        }
        for entry in &snapshot.entries {
            pipe.cmd("RESTORE")
                .arg(&entry.key)
                .arg(entry.ttl_ms.unwrap_or(0))
                .arg(&entry.dump)
                .arg("REPLACE")
                .ignore();
        }
        let _: () = pipe.query_async(&mut con).await.unwrap_or_else(|e| {
            self.fail(format_args!(
                "restoring the snapshot of {:?} failed: {e}",
                snapshot.pattern
            ))
        });
    }

    /// Spawns `redis-server` with the current configuration and waits until
    /// it is ready.
    async fn launch(&mut self) -> Result<(), BindRace> {
        let replica_of = self.state().replica_of;
        let conf_path = self.dir().join(CONF_FILE);
        fs::write(&conf_path, self.config_text(replica_of))
            .unwrap_or_else(|e| self.fail(format_args!("cannot write {}: {e}", conf_path.display())));
        if !self.options.persistence {
            self.remove_rdb_files();
        }
        let log_offset = fs::metadata(self.log_path()).map(|m| m.len()).unwrap_or(0);

        let stdio = self.open_stdio_file();
        let stderr = stdio
            .try_clone()
            .unwrap_or_else(|e| self.fail(format_args!("cannot clone a file handle: {e}")));
        let bin = std::env::var_os(SERVER_BIN_ENV).unwrap_or_else(|| "redis-server".into());
        let child = Command::new(&bin)
            .arg(&conf_path)
            .args(&self.options.extra_args)
            .current_dir(self.dir())
            .stdin(Stdio::null())
            .stdout(stdio)
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| {
                self.fail(format_args!(
                    "cannot spawn {:?} (set {SERVER_BIN_ENV} to the redis-server binary): {e}",
                    bin
                ))
            });
        tracing::debug!(port = self.port, pid = child.id(), "started redis-server");
        self.state().child = Some(child);
        self.wait_ready(log_offset, replica_of).await
    }

    /// Waits until the freshly spawned process answers `PING`, has finished
    /// loading, and (for a replica) has its link to the primary up.
    async fn wait_ready(&self, log_offset: u64, replica_of: Option<u16>) -> Result<(), BindRace> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let exit = {
                let mut state = self.state();
                match state.child.as_mut().map(Child::try_wait) {
                    Some(Ok(Some(status))) => {
                        state.child = None;
                        Some(status.to_string())
                    }
                    Some(Ok(None)) => None,
                    Some(Err(e)) => Some(format!("unknown status ({e})")),
                    None => Some("not running".to_owned()),
                }
            };
            if let Some(status) = exit {
                if self.log_since(log_offset).contains(BIND_RACE_MARKER) {
                    return Err(BindRace);
                }
                self.fail(format_args!(
                    "redis-server on port {} exited during start-up ({status})",
                    self.port
                ));
            }
            let problem = match self.probe(replica_of).await {
                Ok(None) => return Ok(()),
                Ok(Some(problem)) => problem,
                Err(e) => e.to_string(),
            };
            if Instant::now() >= deadline {
                self.kill();
                self.fail(format_args!(
                    "redis-server on port {} was not ready within {READY_TIMEOUT:?}: {problem}",
                    self.port
                ));
            }
            sleep(POLL_INTERVAL).await;
        }
    }

    /// One readiness check: `Ok(None)` when ready, `Ok(Some(reason))` when
    /// not ready yet.
    async fn probe(&self, replica_of: Option<u16>) -> Result<Option<String>, RedisError> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_millis(500)))
            .set_response_timeout(Some(Duration::from_secs(1)));
        let mut con = self
            .client()
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        let pong: String = redis::cmd("PING").query_async(&mut con).await?;
        if pong != "PONG" {
            return Ok(Some(format!("PING answered {pong:?}")));
        }
        // Another process may have taken the port before this one bound it.
        let server: String = redis::cmd("INFO").arg("server").query_async(&mut con).await?;
        let pid = self.pid().map(|pid| pid.to_string());
        if info_field(&server, "process_id") != pid.as_deref() {
            return Ok(Some(format!(
                "port {} is served by process {:?}, not by {pid:?}",
                self.port,
                info_field(&server, "process_id")
            )));
        }
        let persistence: String = redis::cmd("INFO").arg("persistence").query_async(&mut con).await?;
        if info_field(&persistence, "loading") != Some("0") {
            return Ok(Some("still loading the data set".to_owned()));
        }
        if replica_of.is_some() {
            let replication: String = redis::cmd("INFO").arg("replication").query_async(&mut con).await?;
            let link = info_field(&replication, "master_link_status");
            if link != Some("up") {
                return Ok(Some(format!("master_link_status is {link:?}")));
            }
        }
        Ok(None)
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

    /// All keys matching `pattern`, without duplicates, sorted.
    async fn scan(&self, con: &mut MultiplexedConnection, pattern: &str) -> Vec<String> {
        let mut keys = std::collections::BTreeSet::new();
        let mut cursor: u64 = 0;
        loop {
            let (next, batch): (u64, Vec<String>) = self
                .query(
                    con,
                    redis::cmd("SCAN")
                        .arg(cursor)
                        .arg("MATCH")
                        .arg(pattern)
                        .arg("COUNT")
                        .arg(1000),
                    "SCAN",
                )
                .await;
            keys.extend(batch);
            if next == 0 {
                return keys.into_iter().collect();
            }
            cursor = next;
        }
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

    fn config_text(&self, replica_of: Option<u16>) -> String {
        let mut lines = vec![
            "# generated by test-support; rewritten on every (re)start".to_owned(),
            format!("port {}", self.port),
            "bind 127.0.0.1".to_owned(),
            "protected-mode no".to_owned(),
            "daemonize no".to_owned(),
            format!("dir {}", quote(&self.dir().to_string_lossy())),
            format!("logfile {}", quote(&self.log_path().to_string_lossy())),
            // Disk-based full synchronisation: the primary puts the replica
            // online as soon as the RDB is sent. With diskless sync it waits
            // for the replica's first periodic ACK, up to a second later, and
            // WAIT stalls until then.
            "repl-diskless-sync no".to_owned(),
            "save \"\"".to_owned(),
        ];
        if self.options.persistence {
            lines.push("appendonly yes".to_owned());
            lines.push("appendfsync always".to_owned());
        } else {
            lines.push("appendonly no".to_owned());
            // Delete the RDB files written for replication, so a restart
            // really comes back empty.
            lines.push("rdb-del-sync-files yes".to_owned());
        }
        for (name, new_name) in &self.options.renamed_commands {
            lines.push(format!("rename-command {} {}", quote(name), quote(new_name)));
        }
        if let Some(primary) = replica_of {
            lines.push(format!("replicaof 127.0.0.1 {primary}"));
        }
        if let (Some(timeout), Some(bus_port)) = (self.options.cluster_node_timeout_ms, self.bus_port) {
            lines.push("cluster-enabled yes".to_owned());
            lines.push(format!("cluster-port {bus_port}"));
            // Relative to `dir`: kept across restarts, so a restarted node keeps its id and its view.
            lines.push("cluster-config-file nodes.conf".to_owned());
            lines.push(format!("cluster-node-timeout {timeout}"));
        }
        let mut conf = lines.join("\n");
        conf.push('\n');
        conf
    }

    /// Deletes the RDB files a full synchronisation may have left in the
    /// directory, so a server without persistence starts empty.
    fn remove_rdb_files(&self) {
        let Ok(entries) = fs::read_dir(self.dir()) else { return };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|ext| ext == "rdb") {
                fs::remove_file(&path)
                    .unwrap_or_else(|e| self.fail(format_args!("cannot delete {}: {e}", path.display())));
            }
        }
    }

    fn open_stdio_file(&self) -> File {
        let path = self.dir().join(STDIO_FILE);
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .unwrap_or_else(|e| self.fail(format_args!("cannot open {}: {e}", path.display())))
    }

    fn log_path(&self) -> PathBuf {
        self.dir().join(LOG_FILE)
    }

    /// The part of the log file written after byte `offset`.
    fn log_since(&self, offset: u64) -> String {
        let bytes = fs::read(self.log_path()).unwrap_or_default();
        let start = usize::try_from(offset).unwrap_or(usize::MAX).min(bytes.len());
        String::from_utf8_lossy(&bytes[start..]).into_owned()
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

/// Quotes a value for `redis.conf`.
fn quote(value: &str) -> String {
    let mut quoted = String::with_capacity(value.len() + 2);
    quoted.push('"');
    for c in value.chars() {
        if c == '"' || c == '\\' {
            quoted.push('\\');
        }
        quoted.push(c);
    }
    quoted.push('"');
    quoted
}

#[cfg(test)]
mod tests {
    use super::{info_field, quote};

    #[test]
    fn info_field_finds_exact_field() {
        let info = "# Replication\r\nrole:slave\r\nmaster_link_status:up\r\nmaster_link_status_x:down\r\n";
        assert_eq!(info_field(info, "role"), Some("slave"));
        assert_eq!(info_field(info, "master_link_status"), Some("up"));
        assert_eq!(info_field(info, "missing"), None);
    }

    #[test]
    fn quote_escapes() {
        assert_eq!(quote(""), "\"\"");
        assert_eq!(quote(r#"a"b\c"#), r#""a\"b\\c""#);
    }
}

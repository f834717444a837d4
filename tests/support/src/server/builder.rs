//! [`RedisServerBuilder`]: the options of a server, and its start (panicking, for tests; or fallible, for the
//! examples that must explain a missing `redis-server`).

use std::path::PathBuf;

use super::binary::{self, LaunchError};
use super::launch::LaunchFailure;
use super::tls::ServerTls;
use super::{RedisServer, State, START_ATTEMPTS};
use crate::port::free_port;
use std::sync::Mutex;

/// Options for a [`RedisServer`]; created by [`RedisServer::builder`].
///
/// Every option ends up in the server's generated `redis.conf` (or, for
/// [`extra_arg`](Self::extra_arg), on its command line), so a
/// [`RedisServer::restart`] reuses them.
#[derive(Debug, Clone, Default)]
pub struct RedisServerBuilder {
    pub(super) persistence: bool,
    pub(super) renamed_commands: Vec<(String, String)>,
    pub(super) replica_of: Option<u16>,
    pub(super) extra_args: Vec<String>,
    pub(super) cluster_node_timeout_ms: Option<u64>,
    /// The binary to run; `None`: `REDIS_SERVER_BIN`, else `redis-server` on `PATH`.
    pub(super) bin: Option<PathBuf>,
    /// TLS only, when set ([`RedisServerBuilder::tls`]).
    /// Boxed: most servers have none, and a `RedisServer` is held by value in enums (the demo's).
    pub(super) tls: Option<Box<ServerTls>>,
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

    /// Loads users from the ACL file at `path` (`--aclfile`). Test helpers connect as the `default` user without a
    /// password (readiness checks, [`RedisServer::connection`], forming a cluster), so the file must keep
    /// `default` on with `nopass` and every permission; the users under test are the file's others.
    pub fn aclfile(self, path: impl AsRef<std::path::Path>) -> Self {
        let path = path.as_ref().to_string_lossy().into_owned();
        self.extra_arg("--aclfile").extra_arg(path)
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

    /// Serves TLS only (`port 0`, `tls-port` on the server's port, `tls-replication yes`, and for a
    /// [`cluster_node`](Self::cluster_node) `tls-cluster yes`): [`RedisServer::url`] is then `rediss://`, and
    /// the harness's own connections verify the server with `tls.ca` and present `tls.client`.
    pub fn tls(mut self, tls: ServerTls) -> Self {
        self.tls = Some(Box::new(tls));
        self
    }

    /// Runs `bin` instead of `REDIS_SERVER_BIN` or `redis-server` on `PATH` (the binary
    /// [`locate`](super::binary::locate) found or provided).
    pub fn bin(mut self, bin: impl Into<PathBuf>) -> Self {
        self.bin = Some(bin.into());
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
    /// during start-up, or is not ready within [`READY_TIMEOUT`](super::READY_TIMEOUT).
    pub async fn start(self) -> RedisServer {
        self.spawn()
            .await
            .unwrap_or_else(|(server, reason)| server.fail(reason))
    }

    /// As [`start`](Self::start), for a program rather than a test: without a [`bin`](Self::bin), the binary is
    /// [`locate`](super::binary::locate)d first (found, or provided by `scripts/ensure-redis.sh`), and a failure
    /// is an error that says what is missing or ends with the server's log, not a panic.
    ///
    /// # Errors
    /// [`LaunchError::NotInstalled`] without a binary; [`LaunchError::Failed`] when the server exits or is not
    /// ready in time.
    pub async fn try_start(mut self) -> Result<RedisServer, LaunchError> {
        if self.bin.is_none() {
            self.bin = Some(binary::locate()?);
        }
        self.spawn().await.map_err(|(server, reason)| LaunchError::Failed {
            reason,
            log_tail: server.log_tail(20),
        })
    }

    /// Spawns the server on fresh ports until one binds; on failure, the server (for its log) and why.
    async fn spawn(self) -> Result<RedisServer, (RedisServer, String)> {
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
                Ok(()) => return Ok(server),
                Err(LaunchFailure::BindRace) if attempt < START_ATTEMPTS => {
                    tracing::debug!(port = server.port, "port taken before redis-server bound it; retrying");
                    server.port = free_port();
                    if cluster {
                        server.bus_port = Some(free_port());
                    }
                }
                Err(LaunchFailure::BindRace) => {}
                Err(LaunchFailure::Failed(reason)) => return Err((server, reason)),
            }
        }
        Err((
            server,
            format!("redis-server could not bind a free port in {START_ATTEMPTS} attempts"),
        ))
    }
}

//! A private `redis-server` for the demo: named by `REDIS_SERVER_BIN`, else found on `PATH`, else provided by
//! `scripts/ensure-redis.sh` (the Debian package as root, otherwise a binary in the project-local cache under
//! `target/tools/`; the script says on stderr what it did). It is started on a free loopback port with persistence
//! off (`--save "" --appendonly no`) in a temporary directory, ready once it answers `PING`, and killed when
//! dropped.
//!
//! It never touches a Redis you already run. When no `redis-server` can be provided,
//! [`LaunchError::NotInstalled`] says what is missing and how to install one ([`INSTALL_HINT`]).

use std::ffi::OsString;
use std::fmt;
use std::fs;
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// Environment variable naming the `redis-server` binary; `PATH` is searched when it is unset.
pub const SERVER_BIN_ENV: &str = "REDIS_SERVER_BIN";

/// How long a started server may take to answer `PING`.
pub const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// Printed when no `redis-server` is available.
pub const INSTALL_HINT: &str = "\
The demo needs redis-server (6.2 or newer). Install it:
    Debian/Ubuntu:  sudo apt-get install redis-server
    macOS:          brew install redis
or point REDIS_SERVER_BIN at the binary, or use a Redis you already run with --redis-url redis://HOST:PORT.";

/// The provisioning script of this repository (found relative to the crate the binary was built from).
pub const ENSURE_SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/ensure-redis.sh");

/// Ports tried when another process takes the chosen port before `redis-server` binds it.
const START_ATTEMPTS: usize = 5;

/// Why a private `redis-server` could not be started.
#[derive(Debug)]
pub enum LaunchError {
    /// No binary: `REDIS_SERVER_BIN` names a missing file, or `redis-server` is not on `PATH`.
    NotInstalled {
        /// What was not found, as a sentence.
        reason: String,
    },
    /// The binary exists but the server did not come up.
    Failed {
        /// What went wrong.
        reason: String,
        /// The end of the server's log, if any.
        log_tail: String,
    },
}

impl fmt::Display for LaunchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LaunchError::NotInstalled { reason } => write!(f, "{reason}.\n{INSTALL_HINT}"),
            LaunchError::Failed { reason, log_tail } if log_tail.is_empty() => {
                write!(f, "redis-server did not start: {reason}")
            }
            LaunchError::Failed { reason, log_tail } => {
                write!(
                    f,
                    "redis-server did not start: {reason}\n--- redis-server log ---\n{log_tail}"
                )
            }
        }
    }
}

impl std::error::Error for LaunchError {}

/// A running private `redis-server`, killed (and its directory removed) on drop.
#[derive(Debug)]
pub struct RedisLauncher {
    child: Child,
    port: u16,
    bin: PathBuf,
    dir: TempDir,
}

impl RedisLauncher {
    /// Finds the binary, starts it on a free loopback port and waits until it answers `PING`.
    ///
    /// # Errors
    /// [`LaunchError::NotInstalled`] without a binary; [`LaunchError::Failed`] when it exits or does not answer
    /// within [`READY_TIMEOUT`].
    pub async fn start() -> Result<RedisLauncher, LaunchError> {
        Self::start_with(|_| Vec::new()).await
    }

    /// As [`RedisLauncher::start`], with more `redis-server` arguments, made from the chosen port (the cluster
    /// launcher's `--cluster-enabled yes` and bus port).
    ///
    /// # Errors
    /// As [`RedisLauncher::start`].
    pub async fn start_with(extra: impl Fn(u16) -> Vec<String>) -> Result<RedisLauncher, LaunchError> {
        let bin = match find_redis_server() {
            Err(LaunchError::NotInstalled { reason }) if std::env::var_os(SERVER_BIN_ENV).is_none() => {
                provision(&reason)?
            }
            other => other?,
        };
        let mut last = None;
        for _ in 0..START_ATTEMPTS {
            match Self::start_once(&bin, &extra).await {
                Ok(server) => return Ok(server),
                Err(Attempt::PortTaken(e)) => last = Some(e),
                Err(Attempt::Fatal(e)) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| LaunchError::Failed {
            reason: "no free port".into(),
            log_tail: String::new(),
        }))
    }

    async fn start_once(bin: &Path, extra: &impl Fn(u16) -> Vec<String>) -> Result<RedisLauncher, Attempt> {
        let fatal = |reason: String| {
            Attempt::Fatal(LaunchError::Failed {
                reason,
                log_tail: String::new(),
            })
        };
        let dir = tempfile::Builder::new()
            .prefix("redis-stream-demo-")
            .tempdir()
            .map_err(|e| fatal(format!("cannot create a temporary directory: {e}")))?;
        let port = free_port().map_err(|e| fatal(format!("cannot find a free port: {e}")))?;
        let log = dir.path().join("redis.log");
        let child = Command::new(bin)
            .arg("--port")
            .arg(port.to_string())
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir.path())
            .arg("--logfile")
            .arg(&log)
            .args(extra(port))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| fatal(format!("cannot run {}: {e}", bin.display())))?;
        let mut server = RedisLauncher {
            child,
            port,
            bin: bin.to_path_buf(),
            dir,
        };
        match server.wait_ready().await {
            Ok(()) => Ok(server),
            Err(reason) => {
                let log_tail = tail(&log, 20);
                let e = LaunchError::Failed { reason, log_tail };
                if matches!(&e, LaunchError::Failed { log_tail, .. } if log_tail.contains("Address already in use")) {
                    Err(Attempt::PortTaken(e))
                } else {
                    Err(Attempt::Fatal(e))
                }
            }
        }
    }

    async fn wait_ready(&mut self) -> Result<(), String> {
        let client = redis::Client::open(self.url()).map_err(|e| e.to_string())?;
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("it exited with {status}"));
            }
            if let Ok(mut con) = client.get_multiplexed_async_connection().await {
                if redis::cmd("PING").query_async::<String>(&mut con).await.is_ok() {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                return Err(format!("no answer to PING within {} s", READY_TIMEOUT.as_secs()));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The port on `127.0.0.1`.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The binary that runs.
    pub fn bin(&self) -> &Path {
        &self.bin
    }

    /// The server's temporary directory (its `dir` and log file).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for RedisLauncher {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

enum Attempt {
    PortTaken(LaunchError),
    Fatal(LaunchError),
}

/// The `redis-server` binary: `REDIS_SERVER_BIN` when set, else the first `redis-server` on `PATH`.
///
/// # Errors
/// [`LaunchError::NotInstalled`] when neither names an existing file.
pub fn find_redis_server() -> Result<PathBuf, LaunchError> {
    if let Some(bin) = std::env::var_os(SERVER_BIN_ENV).filter(|v| !v.is_empty()) {
        let path = PathBuf::from(&bin);
        if path.is_file() {
            return Ok(path);
        }
        if let Some(found) = search_path(&bin) {
            return Ok(found);
        }
        return Err(LaunchError::NotInstalled {
            reason: format!("{SERVER_BIN_ENV}={} names no file", path.display()),
        });
    }
    search_path(&OsString::from("redis-server")).ok_or_else(|| LaunchError::NotInstalled {
        reason: "redis-server is not on PATH".into(),
    })
}

/// Runs [`ENSURE_SCRIPT`] (its messages go to stderr as they come) and returns the path it prints last.
///
/// # Errors
/// [`LaunchError::NotInstalled`] naming what is missing: `bash` or the script, or what the script could not do.
pub fn provision(missing: &str) -> Result<PathBuf, LaunchError> {
    let script = Path::new(ENSURE_SCRIPT);
    let not_installed = |why: String| LaunchError::NotInstalled {
        reason: format!("{missing}, and {why}"),
    };
    if !script.is_file() {
        return Err(not_installed(format!(
            "the provisioning script {} is not there (the demo binary was moved from its repository)",
            script.display()
        )));
    }
    eprintln!("{missing}: running {} to provide one", script.display());
    let out = Command::new("bash")
        .arg(script)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| not_installed(format!("bash could not run {}: {e}", script.display())))?;
    let printed = String::from_utf8_lossy(&out.stdout);
    let path = printed.lines().last().map(str::trim).unwrap_or_default();
    if !out.status.success() || path.is_empty() {
        return Err(not_installed(format!(
            "{} could not provide one ({}; its reasons are above)",
            script.display(),
            out.status
        )));
    }
    let path = PathBuf::from(path);
    if !is_executable(&path) {
        return Err(not_installed(format!(
            "{} printed {}, which is not an executable",
            script.display(),
            path.display()
        )));
    }
    Ok(path)
}

/// `name` in a directory of `PATH` (only bare names are looked up).
fn search_path(name: &OsString) -> Option<PathBuf> {
    if Path::new(name).components().count() != 1 {
        return None;
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

#[cfg(unix)]
fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(not(unix))]
fn is_executable(path: &Path) -> bool {
    path.is_file()
}

pub(crate) fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?.local_addr()?.port())
}

fn tail(path: &Path, lines: usize) -> String {
    let Ok(text) = fs::read_to_string(path) else {
        return String::new();
    };
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

//! Which `redis-server` a program runs: `REDIS_SERVER_BIN`, else `redis-server` on `PATH`, else one provided by
//! `scripts/ensure-redis.sh` (the Debian package as root, otherwise a binary in the project-local cache under
//! `target/tools/`; the script says on stderr what it did). The examples (the demo on a fresh machine, the
//! benchmarks) start their servers through [`RedisServerBuilder::try_start`](super::RedisServerBuilder::try_start),
//! which uses [`locate`]; when nothing can be provided, [`LaunchError::NotInstalled`] says what is missing and how
//! to install it ([`INSTALL_HINT`]). Tests keep the plain lookup (a missing binary fails the test at once).

use std::ffi::OsString;
use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::SERVER_BIN_ENV;

/// Printed when no `redis-server` is available.
pub const INSTALL_HINT: &str = "\
The demo needs redis-server (6.2 or newer). Install it:
    Debian/Ubuntu:  sudo apt-get install redis-server
    macOS:          brew install redis
or point REDIS_SERVER_BIN at the binary, or use a Redis you already run with --redis-url redis://HOST:PORT.";

/// The provisioning script of this repository (found relative to the crate the binary was built from).
pub const ENSURE_SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/ensure-redis.sh");

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

/// The binary to run: [`find_redis_server`]'s, else (when `REDIS_SERVER_BIN` is unset) the one [`provision`]
/// provides.
///
/// # Errors
/// [`LaunchError::NotInstalled`] saying what is missing.
pub fn locate() -> Result<PathBuf, LaunchError> {
    match find_redis_server() {
        Err(LaunchError::NotInstalled { reason }) if std::env::var_os(SERVER_BIN_ENV).is_none() => provision(&reason),
        other => other,
    }
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

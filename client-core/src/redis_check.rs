//! The start-up check of a Redis server: reachable, recent enough, and with every command a client needs.
//!
//! A client that skips it can join a group with a wrong URL, or against a Redis whose commands were renamed, and
//! hold shards it can never read. The check lists what is missing by name, like the coordinator's own start-up
//! check (`coord-server/src/startup.rs`), and names the server by its URL without the password.

use redis::aio::ConnectionLike;
use redis::{RedisError, Value};
use thiserror::Error;

/// Oldest supported Redis version: `XAUTOCLAIM` arrived in 6.2.
pub const MIN_REDIS_VERSION: (u32, u32) = (6, 2);

/// The commands the consumer SDK sends, with why.
pub const CONSUMER_COMMANDS: &[(&str, &str)] = &[
    ("PING", "start-up check"),
    ("INFO", "start-up check (version)"),
    ("XGROUP", "consumer group creation"),
    ("XREADGROUP", "reading"),
    ("XACK", "acknowledging"),
    ("XAUTOCLAIM", "re-delivering a previous owner's pending entries"),
    ("XCLAIM", "counting a retry as a delivery"),
    ("XPENDING", "delivery counts"),
    ("XADD", "dead-lettering"),
    ("MULTI", "dead-lettering atomically"),
    ("EXEC", "dead-lettering atomically"),
];

/// Why a Redis server failed the check.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum RedisCheckError {
    /// No answer (refused, unreachable, timed out, authentication failed).
    #[error("cannot reach Redis: {0}")]
    Unreachable(#[source] RedisError),
    /// The server is older than [`MIN_REDIS_VERSION`], or did not say its version.
    #[error("unsupported Redis version: {0}")]
    Version(String),
    /// Commands are missing or renamed.
    #[error("Redis lacks required commands (missing or renamed): {}", .0.join(", "))]
    MissingCommands(Vec<String>),
}

/// Checks the server behind `conn`: `INFO server` (version), then `COMMAND INFO` for every command of `required`.
///
/// # Errors
/// [`RedisCheckError`] saying what failed. The caller bounds the time (the connection's response timeout).
pub async fn check_server<C: ConnectionLike + Send>(
    conn: &mut C,
    required: &[(&str, &str)],
) -> Result<(), RedisCheckError> {
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(conn)
        .await
        .map_err(RedisCheckError::Unreachable)?;
    let version = info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .map(str::trim)
        .ok_or_else(|| RedisCheckError::Version("INFO server reports no redis_version".into()))?;
    let parsed = parse_version(version).ok_or_else(|| RedisCheckError::Version(format!("cannot parse {version:?}")))?;
    if parsed < MIN_REDIS_VERSION {
        return Err(RedisCheckError::Version(format!(
            "{version} is too old: {}.{} or newer is required (XAUTOCLAIM)",
            MIN_REDIS_VERSION.0, MIN_REDIS_VERSION.1
        )));
    }
    let mut cmd = redis::cmd("COMMAND");
    cmd.arg("INFO");
    for (name, _) in required {
        cmd.arg(*name);
    }
    let infos: Vec<Value> = cmd.query_async(conn).await.map_err(RedisCheckError::Unreachable)?;
    let missing: Vec<String> = required
        .iter()
        .zip(infos.iter().chain(std::iter::repeat(&Value::Nil)))
        .filter(|(_, v)| matches!(v, Value::Nil))
        .map(|((name, why), _)| format!("{name} ({why})"))
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(RedisCheckError::MissingCommands(missing))
    }
}

/// `major.minor` of a `redis_version`.
pub fn parse_version(v: &str) -> Option<(u32, u32)> {
    let mut parts = v.split('.');
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_versions() {
        assert_eq!(parse_version("7.0.15"), Some((7, 0)));
        assert_eq!(parse_version("6.2"), Some((6, 2)));
        assert_eq!(parse_version("x"), None);
        assert!(parse_version("6.0.9").unwrap() < MIN_REDIS_VERSION);
    }
}

//! Checks a Redis server before a client depends on it: its version (`INFO server`) and the commands the client
//! sends (`COMMAND INFO`), so a Redis that is too old, or where an operator disabled or renamed a command with
//! `rename-command`, fails with a typed error naming the command and the server, not with an "unknown command"
//! in the middle of a publish or a read.
//!
//! Only top-level commands are checked (`rename-command` cannot rename a subcommand, and Redis 6.2 does not
//! know the `CLIENT|UNBLOCK` form). The URL in every error has its password removed.

use thiserror::Error;

/// Oldest Redis the SDKs support: `XAUTOCLAIM` and `XADD ... MINID` arrived in 6.2.
pub const MIN_REDIS_VERSION: (u32, u32) = (6, 2);

/// What a client needs from its Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RedisRequirements {
    /// Oldest acceptable `(major, minor)`.
    pub min_version: (u32, u32),
    /// Every command the client sends, with why (shown when it is missing), e.g. `("XADD", "publishing")`.
    pub commands: &'static [(&'static str, &'static str)],
}

/// What the check found on a server that passed it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisCapabilities {
    /// `redis_version` from `INFO server`.
    pub version: String,
}

/// The check failed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum RedisCheckError {
    /// The server is older than the client supports.
    #[error("Redis at {url} is version {found}: {}.{} or newer is required", required.0, required.1)]
    TooOld {
        /// The server's URL, without password.
        url: String,
        /// `redis_version` as reported.
        found: String,
        /// The oldest supported `(major, minor)`.
        required: (u32, u32),
    },
    /// Commands the client sends are unknown to the server (missing, disabled or renamed).
    #[error("Redis at {url} lacks required commands (missing or renamed): {}", commands.join(", "))]
    MissingCommands {
        /// The server's URL, without password.
        url: String,
        /// `NAME (why)` of each missing command.
        commands: Vec<String>,
    },
    /// The server's answer to `INFO` or `COMMAND INFO` cannot be read (no version, an unexpected shape).
    #[error("cannot check Redis at {url}: {detail}")]
    Unreadable {
        /// The server's URL, without password.
        url: String,
        /// What was wrong.
        detail: String,
    },
    /// `INFO` or `COMMAND INFO` failed.
    #[error("cannot check Redis at {url}: {source}")]
    Query {
        /// The server's URL, without password.
        url: String,
        /// The Redis error.
        #[source]
        source: redis::RedisError,
    },
}

impl RedisCheckError {
    /// Whether the server cannot serve the client as configured (retrying cannot help), as opposed to a
    /// transport failure during the check (the server may be fine: check again on the next connection).
    pub fn is_unsupported(&self) -> bool {
        match self {
            RedisCheckError::TooOld { .. }
            | RedisCheckError::MissingCommands { .. }
            | RedisCheckError::Unreadable { .. } => true,
            // An error *reply* (COMMAND renamed away, NOPERM) is the server's configuration; a dropped connection
            // or a timeout is not.
            RedisCheckError::Query { source, .. } => {
                !(source.is_io_error() || source.is_timeout() || source.is_connection_dropped())
            }
        }
    }
}

pub use protocol::redact::redact_url;

/// Checks the server behind `conn` (a connection to `url`) against `requirements`: `INFO server` for the
/// version, then one `COMMAND INFO` with every required command.
///
/// # Errors
/// [`RedisCheckError`], naming the server by its redacted URL; [`RedisCheckError::is_unsupported`] tells a
/// server that cannot serve the client from a failed check.
pub async fn check_redis<C>(
    conn: &mut C,
    url: &str,
    requirements: &RedisRequirements,
) -> Result<RedisCapabilities, RedisCheckError>
where
    C: redis::aio::ConnectionLike + Send,
{
    let url = redact_url(url);
    let query = |source| RedisCheckError::Query {
        url: url.clone(),
        source,
    };
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(conn)
        .await
        .map_err(query)?;
    let version = info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .map(str::trim)
        .ok_or_else(|| RedisCheckError::Unreadable {
            url: url.clone(),
            detail: "INFO server reports no redis_version".into(),
        })?
        .to_owned();
    let parsed = parse_version(&version).ok_or_else(|| RedisCheckError::Unreadable {
        url: url.clone(),
        detail: format!("cannot parse redis_version {version:?}"),
    })?;
    if parsed < requirements.min_version {
        return Err(RedisCheckError::TooOld {
            url,
            found: version,
            required: requirements.min_version,
        });
    }
    if !requirements.commands.is_empty() {
        let mut cmd = redis::cmd("COMMAND");
        cmd.arg("INFO");
        for (name, _) in requirements.commands {
            cmd.arg(*name);
        }
        let infos: Vec<redis::Value> = cmd.query_async(conn).await.map_err(query)?;
        if infos.len() != requirements.commands.len() {
            return Err(RedisCheckError::Unreadable {
                url,
                detail: format!(
                    "COMMAND INFO answered {} entries for {} commands",
                    infos.len(),
                    requirements.commands.len()
                ),
            });
        }
        let missing: Vec<String> = requirements
            .commands
            .iter()
            .zip(&infos)
            .filter(|(_, v)| matches!(v, redis::Value::Nil))
            .map(|((name, why), _)| format!("{name} ({why})"))
            .collect();
        if !missing.is_empty() {
            return Err(RedisCheckError::MissingCommands { url, commands: missing });
        }
    }
    Ok(RedisCapabilities { version })
}

fn parse_version(v: &str) -> Option<(u32, u32)> {
    let mut parts = v.split('.');
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_and_compare() {
        assert_eq!(parse_version("7.2.4"), Some((7, 2)));
        assert_eq!(parse_version("6.2"), Some((6, 2)));
        assert_eq!(parse_version("x.1"), None);
        assert!(parse_version("6.0.20").unwrap() < MIN_REDIS_VERSION);
        assert!(parse_version("10.0.0").unwrap() > MIN_REDIS_VERSION);
    }
}

//! Checks a Redis server before a client depends on it: its version (`HELLO`, which every ACL user may send;
//! `INFO server` only on a server that does not answer `HELLO` without arguments), the commands the client sends
//! (`COMMAND INFO`), and, with [`check_permissions`], that the ACL user the client connects as may send them, so
//! a Redis that is too old, where an operator disabled or renamed a command with `rename-command`, or whose ACL
//! refuses the user a command or key, fails with a typed error naming the command (and key) and the server, not
//! with an "unknown command" or `NOPERM` in the middle of a publish or a read.
//!
//! Only top-level commands are checked for presence (`rename-command` cannot rename a subcommand). The URL in
//! every error has its password removed.

mod permissions;

pub use permissions::{check_permissions, PermissionProbe};

use thiserror::Error;

use crate::foreign_error::RedisFailure;

/// Oldest Redis the SDKs support: `XAUTOCLAIM` and `XADD ... MINID` arrived in 6.2.
pub const MIN_REDIS_VERSION: (u32, u32) = (6, 2);

/// What a client needs from its Redis.
///
/// ```
/// use client_core::RedisRequirements;
///
/// // What an application that also sends WAIT on the same Redis needs.
/// const MINE: RedisRequirements = RedisRequirements {
///     min_version: (7, 0),
///     commands: &[("XADD", "publishing"), ("WAIT", "durable writes")],
/// };
/// assert!(MINE.commands.iter().any(|(command, _)| *command == "WAIT"));
/// ```
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
///
/// ```
/// use client_core::RedisCheckError;
///
/// fn report(e: &RedisCheckError) {
///     if e.is_unsupported() {
///         eprintln!("this Redis cannot serve the client until it is upgraded or reconfigured: {e}");
///     } else {
///         eprintln!("Redis did not answer the check; it runs again on the next connection: {e}");
///     }
/// }
/// # let _ = report;
/// ```
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
    /// The ACL user the client connects as may not send commands (or touch keys) the client needs: each entry
    /// names the command, its key if any, and Redis's `NOPERM` answer. Grant them ([`deploy/redis/README.md`]
    /// lists what each SDK mode needs) or connect as another user.
    ///
    /// [`deploy/redis/README.md`]: https://github.com/redis-stream-coord/redis-stream-coord/blob/main/deploy/redis/README.md
    #[error("Redis at {url} refuses this ACL user what the client needs: {}", refused.join("; "))]
    NotPermitted {
        /// The server's URL, without password.
        url: String,
        /// `COMMAND [key] (NOPERM answer)` of each refusal.
        refused: Vec<String>,
    },
    /// `INFO` or `COMMAND INFO` failed.
    #[error("cannot check Redis at {url}: {source}")]
    Query {
        /// The server's URL, without password.
        url: String,
        /// The Redis error.
        #[source]
        source: RedisFailure,
    },
}

impl RedisCheckError {
    /// Whether the server cannot serve the client as configured (retrying cannot help), as opposed to a
    /// transport failure during the check (the server may be fine: check again on the next connection).
    pub fn is_unsupported(&self) -> bool {
        match self {
            RedisCheckError::TooOld { .. }
            | RedisCheckError::MissingCommands { .. }
            | RedisCheckError::NotPermitted { .. }
            | RedisCheckError::Unreadable { .. } => true,
            // An error *reply* (COMMAND renamed away, NOPERM) is the server's configuration; a dropped connection
            // or a timeout is not.
            RedisCheckError::Query { source, .. } => !(source.is_timeout() || source.is_connection_dropped()),
        }
    }
}

pub use protocol::redact::redact_url;

/// Why a server cannot serve a client, read from its answers alone: the one version and command rule, shared by
/// [`check_redis`] (which names the server by URL) and the coordinator's start-up check (which asks every master
/// of a cluster through its own store and names the node).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum Incompatibility {
    /// The server is older than required.
    #[error("Redis {found} is too old: {}.{} or newer is required", required.0, required.1)]
    TooOld {
        /// `redis_version` as reported.
        found: String,
        /// The oldest supported `(major, minor)`.
        required: (u32, u32),
    },
    /// Commands the client sends are unknown to the server (missing, disabled or renamed).
    #[error("Redis lacks required commands (missing or renamed): {}", commands.join(", "))]
    MissingCommands {
        /// `NAME (why)` of each missing command.
        commands: Vec<String>,
    },
    /// `INFO server` has no readable version.
    #[error("{0}")]
    Unreadable(String),
}

impl Incompatibility {
    /// The same finding on the server at (redacted) `url`.
    fn at(self, url: String) -> RedisCheckError {
        match self {
            Incompatibility::TooOld { found, required } => RedisCheckError::TooOld { url, found, required },
            Incompatibility::MissingCommands { commands } => RedisCheckError::MissingCommands { url, commands },
            Incompatibility::Unreadable(detail) => RedisCheckError::Unreadable { url, detail },
        }
    }
}

/// The `redis_version` of an `INFO server` answer, if it is `min_version` or newer.
///
/// # Errors
/// [`Incompatibility::TooOld`], or [`Incompatibility::Unreadable`] when the answer has no parsable version.
pub fn check_version(info: &str, min_version: (u32, u32)) -> Result<String, Incompatibility> {
    let version = info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .map(str::trim)
        .ok_or_else(|| Incompatibility::Unreadable("INFO server reports no redis_version".into()))?
        .to_owned();
    let parsed = parse_version(&version)
        .ok_or_else(|| Incompatibility::Unreadable(format!("cannot parse redis_version {version:?}")))?;
    if parsed < min_version {
        return Err(Incompatibility::TooOld {
            found: version,
            required: min_version,
        });
    }
    Ok(version)
}

/// Checks which of `commands` the server offers (`present`, in the same order, e.g. from `COMMAND INFO`).
///
/// # Errors
/// [`Incompatibility::MissingCommands`] naming each absent command with why it is needed.
pub fn check_commands(
    commands: &[(&'static str, &'static str)],
    present: impl IntoIterator<Item = bool>,
) -> Result<(), Incompatibility> {
    let missing: Vec<String> = commands
        .iter()
        .zip(present)
        .filter(|(_, present)| !present)
        .map(|((name, why), _)| format!("{name} ({why})"))
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(Incompatibility::MissingCommands { commands: missing })
    }
}

/// Checks the server behind `conn` (a connection to `url`) against `requirements`: `HELLO` for the version (the
/// one command no ACL refuses; `INFO server` on a server that wants `HELLO`'s protocol argument), then one
/// `COMMAND INFO` with every required command.
///
/// # Errors
/// [`RedisCheckError`], naming the server by its redacted URL ([`RedisCheckError::NotPermitted`] when the ACL
/// refuses the check's own `INFO` or `COMMAND INFO`); [`RedisCheckError::is_unsupported`] tells a server that
/// cannot serve the client from a failed check.
pub async fn check_redis<C>(
    conn: &mut C,
    url: &str,
    requirements: &RedisRequirements,
) -> Result<RedisCapabilities, RedisCheckError>
where
    C: redis::aio::ConnectionLike + Send,
{
    let url = redact_url(url);
    let query = |what: &str, source: redis::RedisError| match source.code() {
        Some("NOPERM") => RedisCheckError::NotPermitted {
            url: url.clone(),
            refused: vec![format!("{what} ({})", permissions::noperm_text(&source))],
        },
        _ => RedisCheckError::Query {
            url: url.clone(),
            source: RedisFailure::from_redis(source),
        },
    };
    let hello = redis::cmd("HELLO").query_async::<redis::Value>(conn).await;
    let from_hello = match hello {
        Ok(reply) => hello_version(&reply),
        Err(e) if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() => return Err(query("HELLO", e)),
        // Redis 6.0 wants HELLO's protocol argument; a proxy may not know HELLO: INFO then.
        Err(_) => None,
    };
    let info = match from_hello {
        Some(version) => format!("redis_version:{version}"),
        None => redis::cmd("INFO")
            .arg("server")
            .query_async(conn)
            .await
            .map_err(|e| query("INFO", e))?,
    };
    let version = check_version(&info, requirements.min_version).map_err(|e| e.at(url.clone()))?;
    if !requirements.commands.is_empty() {
        let mut cmd = redis::cmd("COMMAND");
        cmd.arg("INFO");
        for (name, _) in requirements.commands {
            cmd.arg(*name);
        }
        let infos: Vec<redis::Value> = cmd.query_async(conn).await.map_err(|e| query("COMMAND INFO", e))?;
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
        let present = infos.iter().map(|v| !matches!(v, redis::Value::Nil));
        check_commands(requirements.commands, present).map_err(|e| e.at(url))?;
    }
    Ok(RedisCapabilities { version })
}

/// The `version` of a `HELLO` answer (a flat array of names and values in RESP2, a map in RESP3).
fn hello_version(reply: &redis::Value) -> Option<String> {
    use redis::Value;
    let text = |v: &Value| match v {
        Value::BulkString(b) => std::str::from_utf8(b).ok().map(str::to_owned),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    match reply {
        Value::Array(items) => items
            .chunks_exact(2)
            .find(|pair| text(&pair[0]).as_deref() == Some("version"))
            .and_then(|pair| text(&pair[1])),
        Value::Map(pairs) => pairs
            .iter()
            .find(|(k, _)| text(k).as_deref() == Some("version"))
            .and_then(|(_, v)| text(v)),
        _ => None,
    }
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
        assert_eq!(parse_version("7.0.15"), Some((7, 0)));
        assert_eq!(parse_version("x"), None);
    }

    #[test]
    fn answers_are_judged_without_a_server() {
        let info = "# Server\r\nredis_version:6.0.9\r\n";
        let err = check_version(info, MIN_REDIS_VERSION).expect_err("6.0 is too old");
        assert_eq!(err.to_string(), "Redis 6.0.9 is too old: 6.2 or newer is required");
        assert_eq!(
            check_version("redis_version:7.2.4\r\n", MIN_REDIS_VERSION),
            Ok("7.2.4".into())
        );
        assert!(matches!(
            check_version("# Server\r\n", MIN_REDIS_VERSION),
            Err(Incompatibility::Unreadable(_))
        ));
        let commands = [("XADD", "publishing"), ("XCLAIM", "retries")];
        assert_eq!(check_commands(&commands, [true, true]), Ok(()));
        let err = check_commands(&commands, [true, false]).expect_err("XCLAIM is absent");
        assert_eq!(
            err.to_string(),
            "Redis lacks required commands (missing or renamed): XCLAIM (retries)"
        );
    }

    #[test]
    fn hello_answers_give_the_version_in_either_protocol() {
        use redis::Value;
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let resp2 = Value::Array(vec![bulk("server"), bulk("redis"), bulk("version"), bulk("7.0.15")]);
        assert_eq!(hello_version(&resp2).as_deref(), Some("7.0.15"));
        let resp3 = Value::Map(vec![(bulk("proto"), Value::Int(3)), (bulk("version"), bulk("7.2.4"))]);
        assert_eq!(hello_version(&resp3).as_deref(), Some("7.2.4"));
        assert_eq!(hello_version(&Value::Array(vec![bulk("server"), bulk("redis")])), None);
        assert_eq!(hello_version(&Value::Okay), None);
    }
}

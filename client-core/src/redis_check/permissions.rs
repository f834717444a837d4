//! Whether the ACL user a client connects as may send what the client needs: harmless probe commands whose only
//! possible refusal is `NOPERM`, checked before the first real command, so a missing grant fails start-up with
//! an error naming the command and key instead of failing every publish or read later.

use redis::{RedisError, Value};

use super::{redact_url, RedisCheckError};
use crate::foreign_error::RedisFailure;

/// A command that changes nothing whatever it answers (`EXEC` without `MULTI`, `WATCH` of a key, `XADD` with the
/// invalid id `0-0`, ...): Redis checks the user's ACL before it looks at the arguments, so a `NOPERM` answer
/// means the user lacks the command or the key, and any other answer (including an error such as
/// `EXEC without MULTI` or a Cluster redirect) means the ACL let it through.
#[derive(Debug, Clone)]
pub struct PermissionProbe {
    /// What a refusal is reported as: the command, and the key if it names one (`WATCH redis-stream:...`).
    pub permission: String,
    /// The command sent.
    pub command: redis::Cmd,
}

impl PermissionProbe {
    /// A probe of `command`, reported as `permission`.
    pub fn new(permission: impl Into<String>, command: redis::Cmd) -> Self {
        PermissionProbe {
            permission: permission.into(),
            command,
        }
    }
}

/// Sends every probe on `conn` (a connection to `url`, authenticated as the user to check), one after the other.
///
/// # Errors
/// [`RedisCheckError::NotPermitted`] naming every refused probe with Redis's answer;
/// [`RedisCheckError::Query`] when the connection fails meanwhile.
pub async fn check_permissions<C>(conn: &mut C, url: &str, probes: &[PermissionProbe]) -> Result<(), RedisCheckError>
where
    C: redis::aio::ConnectionLike + Send,
{
    let mut refused = Vec::new();
    for probe in probes {
        let answer = probe.command.query_async::<Value>(conn).await;
        let error = match answer {
            Ok(Value::ServerError(e)) => RedisError::from(e),
            Ok(_) => continue,
            Err(e) => e,
        };
        if error.code() == Some("NOPERM") {
            refused.push(format!("{} ({})", probe.permission, noperm_text(&error)));
        } else if error.is_io_error() || error.is_timeout() || error.is_connection_dropped() {
            return Err(RedisCheckError::Query {
                url: redact_url(url),
                source: RedisFailure::from_redis(error),
            });
        }
    }
    if refused.is_empty() {
        Ok(())
    } else {
        Err(RedisCheckError::NotPermitted {
            url: redact_url(url),
            refused,
        })
    }
}

/// A `NOPERM` answer as Redis wrote it (`NOPERM this user has no permissions to run the 'watch' command`).
pub(super) fn noperm_text(error: &RedisError) -> String {
    match error.detail() {
        Some(detail) => format!("NOPERM {detail}"),
        None => error.to_string(),
    }
}

//! Start-up checks: the Redis version and every command the coordinator and the SDKs need.
//!
//! A missing or renamed command fails start-up with a message naming it, before any client depends on it.
//! On a Redis Cluster every master is checked (each may run another version or configuration), and a failure
//! names the node. There is no fallback: each command below is needed for correctness (XAUTOCLAIM, for instance, is how a new
//! owner takes over the entries a previous owner left pending).

use crate::error::StoreError;
use crate::store::Store;

/// Oldest supported Redis version: XAUTOCLAIM arrived in 6.2.
pub const MIN_REDIS_VERSION: (u32, u32) = (6, 2);

/// Commands used by the coordinator (C), the consumer (K) and the producer (P).
pub const REQUIRED_COMMANDS: &[(&str, &str)] = &[
    ("EVALSHA", "C: critical-section scripts"),
    ("EVAL", "C: loading critical-section scripts"),
    ("SCRIPT", "C: loading critical-section scripts"),
    ("TIME", "C: lease clock"),
    ("INFO", "C: run id (Redis restart detection)"),
    ("PING", "C: readiness"),
    ("HSET", "C: metadata writes"),
    ("HGET", "C: metadata reads"),
    ("HMGET", "C: metadata reads"),
    ("HGETALL", "C: liveness reads"),
    ("HDEL", "C: forgetting members' liveness"),
    ("HINCRBY", "C: liveness revision"),
    ("HSTRLEN", "ops: aggregate size"),
    ("EXISTS", "C: group existence"),
    ("SET", "C: mutex"),
    ("GET", "C: mutex release"),
    ("DEL", "C: mutex release"),
    ("SCAN", "C: index rebuild"),
    ("SADD", "C: index"),
    ("SMEMBERS", "C: index"),
    ("XADD", "P: publishing"),
    ("XGROUP", "K: consumer group creation"),
    ("XREADGROUP", "K: reading"),
    ("XACK", "K: acknowledging"),
    ("XAUTOCLAIM", "K: re-delivering a previous owner's pending entries"),
    ("XCLAIM", "K: counting a handler retry as a delivery"),
    ("XINFO", "C: lag and pending metrics (XINFO GROUPS)"),
    ("XLEN", "C: shard length metric"),
    ("XPENDING", "K: delivery counts"),
    (
        "CLIENT",
        "K: SETNAME/ID/UNBLOCK to end a blocking read at once on revoke",
    ),
    ("MULTI", "K: dead letter and acknowledgement in one transaction"),
    ("EXEC", "K: dead letter and acknowledgement in one transaction"),
];

/// Checks the server version and commands (of every master on a cluster).
///
/// # Errors
/// [`StoreError::Unsupported`] naming the version or command (inside [`StoreError::Node`] naming the node on a
/// cluster); Redis errors.
pub async fn check_redis(store: &Store) -> Result<(), StoreError> {
    let names: Vec<&str> = REQUIRED_COMMANDS.iter().map(|(name, _)| *name).collect();
    let infos = store.info("server").await?;
    let commands = store.commands_present(&names).await?;
    for ((node, info), (_, present)) in infos.iter().zip(commands) {
        check_node(info, present).map_err(|e| match node {
            Some(node) => e.on_node(node),
            None => e,
        })?;
    }
    Ok(())
}

/// Checks one server's `INFO server` text and which of [`REQUIRED_COMMANDS`] it offers.
fn check_node(info: &str, present: Vec<bool>) -> Result<(), StoreError> {
    let version = info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .map(str::trim)
        .ok_or_else(|| StoreError::Unsupported("INFO server reports no redis_version".into()))?;
    let parsed = parse_version(version)
        .ok_or_else(|| StoreError::Unsupported(format!("cannot parse redis_version {version:?}")))?;
    if parsed < MIN_REDIS_VERSION {
        return Err(StoreError::Unsupported(format!(
            "Redis {version} is too old: {}.{} or newer is required (XAUTOCLAIM)",
            MIN_REDIS_VERSION.0, MIN_REDIS_VERSION.1
        )));
    }
    let missing: Vec<String> = REQUIRED_COMMANDS
        .iter()
        .zip(present)
        .filter(|(_, present)| !present)
        .map(|((name, why), _)| format!("{name} ({why})"))
        .collect();
    if !missing.is_empty() {
        return Err(StoreError::Unsupported(format!(
            "Redis lacks required commands (missing or renamed): {}",
            missing.join(", ")
        )));
    }
    Ok(())
}

fn parse_version(v: &str) -> Option<(u32, u32)> {
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
